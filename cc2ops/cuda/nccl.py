"""A small ctypes binding of NCCL: one process driving K GPUs (and the MPI route).

Loaded lazily (importing this module touches neither CUDA nor NCCL). The
library is looked up, in order, at ``$CC2OPS_NCCL_LIBRARY``, ``libnccl.so.2``
on the loader path, and the ``nvidia-nccl-cu13`` / ``-cu12`` wheels
(``site-packages/nvidia/nccl/lib``). A missing library raises
:class:`NcclUnavailableError` naming every place tried; a failing call raises
:class:`NcclError` with NCCL's own error string.

Functions bound: ``ncclGetVersion``, ``ncclGetErrorString``,
``ncclGetLastError``, ``ncclGetUniqueId``, ``ncclCommInitAll``,
``ncclCommInitRank``, ``ncclCommDestroy``, ``ncclGroupStart``/``End``,
``ncclAllReduce``, ``ncclBroadcast``, ``ncclReduce``, ``ncclAllGather``,
``ncclReduceScatter``.

:class:`Communicators` is the one-process model: ``ncclCommInitAll`` over the
physical devices, one communicator per device, and collectives issued as
group calls on each device's cc2ops stream. :func:`unique_id` and
:func:`init_rank` are the one-process-per-GPU route (ranks started by MPI
exchange the id out of band).
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "NcclError",
    "NcclUnavailableError",
    "load",
    "library_path",
    "version",
    "error_string",
    "unique_id",
    "init_rank",
    "Communicators",
    "communicators",
    "DTYPES",
    "SUM",
]

LIBRARY_ENV = "CC2OPS_NCCL_LIBRARY"

#: numpy dtype -> ncclDataType_t
DTYPES = {
    np.dtype("int8"): 0,
    np.dtype("uint8"): 1,
    np.dtype("int32"): 2,
    np.dtype("uint32"): 3,
    np.dtype("int64"): 4,
    np.dtype("uint64"): 5,
    np.dtype("float16"): 6,
    np.dtype("float32"): 7,
    np.dtype("float64"): 8,
}
#: ncclRedOp_t ncclSum
SUM = 0
_UNIQUE_ID_BYTES = 128

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_path: str | None = None


class NcclUnavailableError(RuntimeError):
    """libnccl could not be loaded."""


class NcclError(RuntimeError):
    """An NCCL call failed; ``status`` is the ``ncclResult_t``."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class UniqueId(ctypes.Structure):
    """``ncclUniqueId``: 128 opaque bytes."""

    _fields_ = [("internal", ctypes.c_char * _UNIQUE_ID_BYTES)]


def _candidates() -> list[str]:
    out = []
    env = os.environ.get(LIBRARY_ENV, "").strip()
    if env:
        out.append(env)
    out.append("libnccl.so.2")
    try:
        import nvidia  # the namespace package of NVIDIA's wheels

        for base in list(getattr(nvidia, "__path__", [])):
            out += sorted(glob.glob(os.path.join(base, "nccl", "lib", "libnccl.so*")))
    except ImportError:
        pass
    return out


def _declare(lib: ctypes.CDLL) -> None:
    c_int, c_void, c_size = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
    sig = {
        "ncclGetVersion": [ctypes.POINTER(c_int)],
        "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
        "ncclCommInitAll": [ctypes.POINTER(c_void), c_int, ctypes.POINTER(c_int)],
        "ncclCommInitRank": [ctypes.POINTER(c_void), c_int, UniqueId, c_int],
        "ncclCommDestroy": [c_void],
        "ncclGroupStart": [],
        "ncclGroupEnd": [],
        "ncclAllReduce": [c_void, c_void, c_size, c_int, c_int, c_void, c_void],
        "ncclBroadcast": [c_void, c_void, c_size, c_int, c_int, c_void, c_void],
        "ncclReduce": [c_void, c_void, c_size, c_int, c_int, c_int, c_void, c_void],
        "ncclAllGather": [c_void, c_void, c_size, c_int, c_void, c_void],
        "ncclReduceScatter": [c_void, c_void, c_size, c_int, c_int, c_void, c_void],
    }
    for name, args in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = c_int
    lib.ncclGetErrorString.argtypes = [c_int]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    if hasattr(lib, "ncclGetLastError"):
        lib.ncclGetLastError.argtypes = [c_void]
        lib.ncclGetLastError.restype = ctypes.c_char_p


def load() -> ctypes.CDLL:
    """The loaded libnccl (memoised), else :class:`NcclUnavailableError`."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            _declare(lib)
            _lib, _path = lib, path
            return lib
        raise NcclUnavailableError(
            "cc2ops.cuda.nccl: libnccl could not be loaded; tried "
            + "; ".join(tried)
            + f". Install the nvidia-nccl-cu13 wheel or set {LIBRARY_ENV}"
        )


def library_path() -> str:
    """The path libnccl was loaded from."""
    load()
    return str(_path)


def error_string(status: int) -> str:
    """NCCL's text for an ``ncclResult_t``."""
    text = load().ncclGetErrorString(int(status))
    return text.decode() if text else f"ncclResult {status}"


def _check(name: str, status: int, comm: Any = None) -> None:
    if status == 0:
        return
    msg = f"cc2ops.cuda.nccl: {name} failed: {error_string(status)} (status {status})"
    lib = load()
    if comm is not None and hasattr(lib, "ncclGetLastError"):
        last = lib.ncclGetLastError(comm)
        if last:
            msg += f": {last.decode()}"
    raise NcclError(msg, status)


def call(name: str, *args: Any, comm: Any = None) -> None:
    """Call NCCL function ``name`` and raise :class:`NcclError` on failure."""
    _check(name, getattr(load(), name)(*args), comm)


def version() -> tuple[int, int, int]:
    """NCCL's (major, minor, patch), e.g. (2, 28, 3)."""
    v = ctypes.c_int()
    call("ncclGetVersion", ctypes.byref(v))
    code = v.value
    if code >= 10000:  # NCCL >= 2.9: major*10000 + minor*100 + patch
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


def unique_id() -> UniqueId:
    """A new ``ncclUniqueId`` (rank 0 makes it and sends it to the others)."""
    uid = UniqueId()
    call("ncclGetUniqueId", ctypes.byref(uid))
    return uid


def init_rank(nranks: int, uid: UniqueId, rank: int) -> ctypes.c_void_p:
    """``ncclCommInitRank``: this process's communicator (current CUDA device)."""
    comm = ctypes.c_void_p()
    call("ncclCommInitRank", ctypes.byref(comm), int(nranks), uid, int(rank))
    return comm


class Communicators:
    """One NCCL communicator per physical device, from ``ncclCommInitAll``.

    Parameters
    ----------
    physical : sequence of int
        Distinct physical device indices, in rank order.
    """

    def __init__(self, physical: Sequence[int]) -> None:
        physical = [int(p) for p in physical]
        if len(set(physical)) != len(physical):
            raise ValueError(
                "cc2ops.cuda.nccl: a communicator needs distinct physical devices, got "
                f"{physical} (labels sharing a GPU use the virtual backend)"
            )
        n = len(physical)
        comms = (ctypes.c_void_p * n)()
        devs = (ctypes.c_int * n)(*physical)
        call("ncclCommInitAll", comms, n, devs)
        self.physical = tuple(physical)
        self.comms = [ctypes.c_void_p(c) for c in comms]
        self._alive = True

    @property
    def n(self) -> int:
        return len(self.comms)

    def destroy(self) -> None:
        """``ncclCommDestroy`` every communicator (idempotent)."""
        if not self._alive:
            return
        self._alive = False
        for c in self.comms:
            call("ncclCommDestroy", c)

    def __repr__(self) -> str:
        return f"Communicators(physical={self.physical})"


_comms: dict[tuple[int, ...], Communicators] = {}
_hook_registered = False


def _destroy_all() -> None:
    for c in list(_comms.values()):
        try:
            c.destroy()
        except NcclError:
            pass
    _comms.clear()


def communicators(physical: Sequence[int]) -> Communicators:
    """The memoised :class:`Communicators` of ``physical`` (destroyed at shutdown)."""
    global _hook_registered
    key = tuple(int(p) for p in physical)
    with _lock:
        comm = _comms.get(key)
    if comm is None:
        comm = Communicators(key)
        with _lock:
            _comms[key] = comm
            if not _hook_registered:
                from cc2ops.cuda.runtime.device import register_shutdown_hook

                register_shutdown_hook(_destroy_all)
                _hook_registered = True
    return comm
