"""The NCCL adapter over nccl4py (cc2ops.cuda.libs.nccl).

CPU tests: a missing nccl4py or libnccl is an NcclUnavailableError naming it;
DTYPES answers membership without nccl4py and maps to nccl4py's enums with
nccl.h's values; the collectives pass the C API's arguments, in its order, to
nccl4py's typed layer (checked against its signatures where it is installed);
0.1's ``call`` convention (C names, ctypes values) still works; NCCL's
errors become NcclError with NCCL's text and the communicator's last error;
Communicators create, hand out and destroy one communicator per device; the
old path ``cc2ops.cuda.nccl`` warns and aliases. GPU tests (one device):
every collective on cc2ops's stream, inside group calls and at byte offsets,
the rank route, and a failing call's error.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cc2ops.cuda.libs import nccl
from cc2ops.cuda.runtime import libraries

ROOT = Path(__file__).resolve().parents[3]

# nccl.h
NCCL_TYPES = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "uint32": 3,
    "int64": 4,
    "uint64": 5,
    "float16": 6,
    "float32": 7,
    "float64": 8,
}
NCCL_SUM = 0

# the C API's argument order, as cc2ops passes it
_BUFS = ["sendbuff", "recvbuff"]
ARGUMENTS = {
    "all_reduce": [*_BUFS, "count", "datatype", "op", "comm", "stream"],
    "broadcast": [*_BUFS, "count", "datatype", "root", "comm", "stream"],
    "reduce": [*_BUFS, "count", "datatype", "op", "root", "comm", "stream"],
    "all_gather": [*_BUFS, "sendcount", "datatype", "comm", "stream"],
    "reduce_scatter": [*_BUFS, "recvcount", "datatype", "op", "comm", "stream"],
}


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(libraries, "_modules", {})
    monkeypatch.setattr(libraries, "_paths", {})
    monkeypatch.setattr(nccl, "_loaded", None)


# --------------------------------------------------------------------------
# loading and enums (CPU)
# --------------------------------------------------------------------------


def test_missing_nccl4py_names_the_package(monkeypatch, fresh):
    monkeypatch.setitem(sys.modules, "nccl.core", None)
    with pytest.raises(nccl.NcclUnavailableError, match="`pip install nccl4py`"):
        nccl.load()
    with pytest.raises(nccl.NcclUnavailableError, match="nccl4py"):
        nccl.Communicators([0])


def test_missing_libnccl_is_named(monkeypatch, fresh):
    class NotFound(RuntimeError):
        pass

    def load_nvidia_dynamic_lib(name):
        raise NotFound(f'Failure finding "lib{name}.so.2"')

    monkeypatch.setitem(sys.modules, "nccl.core", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "nccl.bindings.nccl", SimpleNamespace())
    monkeypatch.setitem(
        sys.modules,
        "cuda.pathfinder",
        SimpleNamespace(load_nvidia_dynamic_lib=load_nvidia_dynamic_lib),
    )
    with pytest.raises(
        nccl.NcclUnavailableError,
        match=r"the NVIDIA library 'nccl' could not be loaded \(Failure finding",
    ):
        nccl.load()


def test_dtypes_membership_needs_no_nccl4py(monkeypatch, fresh):
    monkeypatch.setitem(sys.modules, "nccl.core", None)
    assert np.dtype("float32") in nccl.DTYPES and "int64" in nccl.DTYPES
    assert np.dtype("complex64") not in nccl.DTYPES and "bool" not in nccl.DTYPES
    assert object() not in nccl.DTYPES
    assert sorted(str(d) for d in nccl.DTYPES) == sorted(NCCL_TYPES)
    with pytest.raises(nccl.NcclUnavailableError):
        nccl.DTYPES[np.dtype("float32")]
    with pytest.raises(AttributeError, match="no attribute 'PROD'"):
        nccl.PROD  # noqa: B018


def test_dtypes_and_sum_are_nccl4pys_enums_with_nccl_h_values(fresh):
    core = pytest.importorskip("nccl.core")
    for name, value in NCCL_TYPES.items():
        member = nccl.DTYPES[np.dtype(name)]
        assert isinstance(member, core.NcclDataType) and int(member) == value, name
    assert nccl.SUM is core.NcclRedOp.SUM and int(nccl.SUM) == NCCL_SUM
    with pytest.raises(KeyError):
        nccl.DTYPES[np.dtype("complex64")]


def test_collectives_follow_nccl4pys_argument_lists():
    raw = pytest.importorskip("nccl.bindings.nccl")
    for name, want in ARGUMENTS.items():
        head = getattr(raw, name).__doc__.strip().splitlines()[0]
        got = [p.split()[-1] for p in head.split("(", 1)[1].split(")")[0].split(",")]
        assert got == want, (name, head)


def test_old_path_warns_and_aliases():
    code = (
        "import importlib, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import cc2ops.cuda\n"
        "try:\n"
        "    importlib.import_module('cc2ops.cuda.nccl')\n"
        "except DeprecationWarning as e:\n"
        "    print('warned:', e)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from cc2ops.cuda import nccl as old\n"
        "import cc2ops.cuda.libs.nccl as new\n"
        "assert old is new\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warned: cc2ops.cuda.nccl moved to cc2ops.cuda.libs.nccl" in proc.stdout


# --------------------------------------------------------------------------
# the calls, against a fake nccl4py (CPU)
# --------------------------------------------------------------------------


class FakeNCCLError(Exception):
    def __init__(self, status):
        self.status = status
        super().__init__(f"NCCL error {status}")


class FakeComm:
    def __init__(self, handle):
        self.handle = handle


@pytest.fixture
def fake(monkeypatch):
    calls = []

    def record(name, fail=None):
        def fn(*args):
            calls.append((name, args))
            if fail:
                raise FakeNCCLError(fail.pop())

        return fn

    failing = []
    raw = SimpleNamespace(
        NCCLError=FakeNCCLError,
        Comm=FakeComm,
        get_last_error=lambda comm: f"last error of {comm.handle:#x}",
        **{name: record(name, failing) for name in ARGUMENTS},
    )

    class Communicator:
        def __init__(self, ptr):
            self.ptr = ptr
            self.destroyed = 0

        @classmethod
        def init_all(cls, devices):
            calls.append(("init_all", (devices,)))
            return [cls(0xC0 + d) for d in devices]

        def destroy(self):
            self.destroyed += 1

    core = SimpleNamespace(
        Communicator=Communicator,
        group_start=record("group_start"),
        group_end=record("group_end"),
        get_error_string=lambda status: {4: "invalid argument"}[status],
    )
    monkeypatch.setattr(nccl, "_loaded", (core, raw))
    return SimpleNamespace(calls=calls, failing=failing, core=core)


def test_communicators_one_per_device(fake):
    comms = nccl.Communicators([2, 0])
    assert fake.calls == [("init_all", ([2, 0],))]
    assert comms.n == 2 and comms.physical == (2, 0)
    assert [c.handle for c in comms.comms] == [0xC2, 0xC0]
    comms.destroy()
    comms.destroy()  # idempotent
    assert [c.destroyed for c in comms.communicators] == [1, 1]


def test_collectives_pass_ints_in_the_c_order(fake):
    comm = FakeComm(0xC0)
    with nccl.group():
        nccl.all_reduce(0x10, 0x20, 6, NCCL_TYPES["float32"], 0, comm, 0x5E)
        nccl.broadcast(0x10, 0x20, 6, 7, 1, comm, 0x5E)
        nccl.reduce(0x10, 0, 6, 7, 0, 1, comm, 0x5E)
        nccl.all_gather(0x10, 0x20, 3, 7, comm, 0x5E)
        nccl.reduce_scatter(0x10, 0x20, 3, 7, 0, comm, 0x5E)
    assert fake.calls == [
        ("group_start", ()),
        ("all_reduce", (0x10, 0x20, 6, 7, 0, comm, 0x5E)),
        ("broadcast", (0x10, 0x20, 6, 7, 1, comm, 0x5E)),
        ("reduce", (0x10, 0, 6, 7, 0, 1, comm, 0x5E)),
        ("all_gather", (0x10, 0x20, 3, 7, comm, 0x5E)),
        ("reduce_scatter", (0x10, 0x20, 3, 7, 0, comm, 0x5E)),
        ("group_end", ()),
    ]
    assert all(type(a) is int for _, args in fake.calls for a in args if a is not comm)


def test_the_0_1_call_convention(fake):
    """comm.py's calls: C names, ctypes pointers and counts, a NULL receive
    buffer off the root, the communicator's handle."""
    comm = FakeComm(0xC0)
    v, n = ctypes.c_void_p, ctypes.c_size_t
    nccl.call("ncclGroupStart")
    nccl.call("ncclReduce", v(0x10), v(0), n(6), 7, 0, 1, comm, v(0x5E), comm=comm)
    nccl.call("ncclAllGather", v(0x10), v(0x20), n(3), 7, comm, v(0x5E))
    nccl.call("ncclGroupEnd")
    assert fake.calls == [
        ("group_start", ()),
        ("reduce", (0x10, 0, 6, 7, 0, 1, comm, 0x5E)),
        ("all_gather", (0x10, 0x20, 3, 7, comm, 0x5E)),
        ("group_end", ()),
    ]
    with pytest.raises(ValueError, match="unknown NCCL function 'ncclSend'"):
        nccl.call("ncclSend")


def test_nccl_errors_carry_nccls_text_and_the_last_error(fake):
    fake.failing.append(4)
    with pytest.raises(
        nccl.NcclError,
        match=r"nccl: ncclAllReduce failed: invalid argument \(status 4\): "
        r"last error of 0xc0",
    ) as info:
        nccl.all_reduce(0x10, 0x20, 6, 7, 0, FakeComm(0xC0), 0x5E)
    assert info.value.status == 4
    assert isinstance(info.value.__cause__, FakeNCCLError)


def test_communicators_refuse_repeated_devices_before_loading(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "nccl.core", None)
    with pytest.raises(ValueError, match="distinct physical devices"):
        nccl.Communicators([1, 1])


# --------------------------------------------------------------------------
# GPU: one device
# --------------------------------------------------------------------------


@pytest.mark.gpu
def test_every_collective_on_one_device_in_groups_and_at_offsets():
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.device import get_device

    major, minor, _ = nccl.version()
    assert (major, minor) >= (2, 18)
    assert "libnccl" in nccl.library_path()
    dev = get_device(0)
    comms = nccl.communicators([dev.index])
    assert nccl.communicators([dev.index]) is comms
    comm, stream = comms.comms[0], int(dev.stream.handle)
    f32 = nccl.DTYPES[np.dtype("float32")]
    values = np.arange(12, dtype=np.float32)
    x = array.to_gpu(values, 0)
    px = array.ptr(x)
    outs = {name: array.empty((12,), np.float32, 0) for name in ARGUMENTS}
    for out in outs.values():
        array.fill(out, -1.0, device=0)
    p = {name: array.ptr(out) for name, out in outs.items()}
    off = 4 * 4  # four floats: pieces at byte offsets, as comm.py sends them
    with nccl.group():
        nccl.all_reduce(px, p["all_reduce"], 12, f32, nccl.SUM, comm, stream)
        nccl.broadcast(px, p["broadcast"], 12, f32, 0, comm, stream)
        nccl.reduce(px, p["reduce"], 12, f32, nccl.SUM, 0, comm, stream)
        nccl.all_gather(px + off, p["all_gather"] + off, 8, f32, comm, stream)
        nccl.reduce_scatter(px + off, p["reduce_scatter"], 8, f32, nccl.SUM, comm,
                            stream)  # fmt: skip
    host = {name: array.to_host(out, 0) for name, out in outs.items()}
    for name in ("all_reduce", "broadcast", "reduce"):
        np.testing.assert_array_equal(host[name], values, err_msg=name)
    np.testing.assert_array_equal(host["all_gather"][:4], -1.0)
    np.testing.assert_array_equal(host["all_gather"][4:], values[4:])
    np.testing.assert_array_equal(host["reduce_scatter"][:8], values[4:])
    np.testing.assert_array_equal(host["reduce_scatter"][8:], -1.0)
    # a failing call: NCCL's text, its status, the communicator's last error
    with pytest.raises(nccl.NcclError, match="ncclAllReduce failed") as info:
        nccl.all_reduce(px, p["all_reduce"], 12, 99, nccl.SUM, comm, stream)
    assert info.value.status is not None and info.value.status != 0


@pytest.mark.gpu
def test_the_rank_route_on_one_device():
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(0)
    uid = nccl.unique_id()
    core = importlib.import_module("nccl.core")
    assert core.UniqueId.from_bytes(bytes(uid)).as_bytes == bytes(uid)
    with dev.using():
        comm = nccl.init_rank(1, uid, 0)
    try:
        assert comm.nranks == 1 and comm.rank == 0
        handle = importlib.import_module("nccl.bindings.nccl").Comm(comm.ptr)
        x = array.to_gpu(np.arange(5, dtype=np.float64), 0)
        out = array.empty((5,), np.float64, 0)
        nccl.all_reduce(array.ptr(x), array.ptr(out), 5,
                        nccl.DTYPES[np.dtype("float64")], nccl.SUM, handle,
                        int(dev.stream.handle))  # fmt: skip
        np.testing.assert_array_equal(array.to_host(out, 0), np.arange(5.0))
    finally:
        comm.destroy()
