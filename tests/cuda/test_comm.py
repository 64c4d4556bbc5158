"""GPU collectives (cc2ops.cuda.ops.comm) over the NCCL adapter (cc2ops.cuda.libs.nccl).

CPU-only here: graph building, shapes and pullback structure. GPU tests
(marker ``gpu``) run K = 2 virtual labels on one GPU (labels 0 and 1 mapped to
physical 0) against the host collectives, and a one-GPU NCCL communicator
through comm.py's calling convention. The adapter's own tests (loading, the
missing-library error, dtypes) are tests/cuda/libs/test_nccl.py.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from cc2ops.cuda.libs import nccl
from cc2ops.cuda.ops.comm import (
    GpuAllGather,
    GpuAllReduce,
    GpuBroadcast,
    GpuReduce,
    GpuReduceScatter,
    GpuShard,
    resolve_impl,
)
from cc2ops.cuda.type import CudaArrayType
from cc2ops.distributed.collectives import AllGather, AllReduce, ReduceScatter

LABELS = (0, 1)


def _gpu_vars(ndim=2, labels=LABELS):
    return [CudaArrayType("float32", (None,) * ndim, d)() for d in labels]


# ---------------------------------------------------------------- CPU-only


def test_ops_put_output_k_on_label_k():
    xs = _gpu_vars()
    for op in (
        GpuAllGather(LABELS, 1),
        GpuReduceScatter(LABELS, 0),
        GpuAllReduce(LABELS),
    ):
        outs = op(*xs)
        assert [o.type.device for o in outs] == list(LABELS), op
    outs = GpuBroadcast(LABELS, root=1)(xs[1])
    assert [o.type.device for o in outs] == [0, 1]
    assert GpuReduce(LABELS, root=1)(*xs).type.device == 1


def test_inputs_on_the_wrong_label_are_rejected():
    xs = _gpu_vars()
    with pytest.raises(ValueError, match="GpuAllReduce: input 1 lives on device 0"):
        GpuAllReduce(LABELS)(xs[0], xs[0])
    with pytest.raises(TypeError, match="must be a GPU variable"):
        GpuAllReduce(LABELS)(pt.matrix(), xs[1])
    with pytest.raises(ValueError, match="repeated device labels"):
        GpuAllReduce((0, 0))
    with pytest.raises(ValueError, match="impl must be one of"):
        GpuAllReduce(LABELS, impl="mpi")


def test_pullbacks_are_the_paired_gpu_collectives():
    xs = _gpu_vars()
    pairs = [
        (GpuAllGather(LABELS, 1), xs, GpuReduceScatter),
        (GpuReduceScatter(LABELS, 1), xs, GpuAllGather),
        (GpuAllReduce(LABELS), xs, GpuAllReduce),
        (GpuBroadcast(LABELS), xs[:1], GpuReduce),
    ]
    for op, ins, expected in pairs:
        outs = op(*ins)
        cost = sum((pt.as_tensor_variable(o) ** 2).sum() for o in outs)
        g = pytensor.grad(cost, ins[0])
        ops = {type(n.op) for n in pytensor.graph.traversal.applys_between(ins, [g])}
        assert expected in ops, f"pullback of {op}: {ops}"


def test_shapes_are_inferred():
    xs = [CudaArrayType("float32", (3, 4), 0)(), CudaArrayType("float32", (2, 4), 1)()]
    out = GpuAllGather(LABELS, 0)(*xs)
    assert out[1].type.shape == (5, 4)
    assert GpuShard(2, 1, 0)(xs[0]).type.device == 0


def test_impl_resolution_for_virtual_labels(monkeypatch):
    from cc2ops.cuda.runtime import device

    monkeypatch.setattr(device, "_explicit_map", {0: 0, 1: 0})
    assert resolve_impl((0, 1)) == "virtual"
    with pytest.raises(ValueError, match="needs distinct physical devices"):
        resolve_impl((0, 1), "nccl")


def test_communicators_refuse_repeated_devices():
    with pytest.raises(ValueError, match="distinct physical devices"):
        nccl.Communicators([0, 0])


# ---------------------------------------------------------------- GPU


@pytest.fixture
def virtual_two(monkeypatch):
    """Labels 0 and 1 on physical GPU 0 (kept for the process: labels in use)."""
    from cc2ops.cuda import set_device_map

    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    try:
        set_device_map({0: 0, 1: 0})
    except ValueError:
        pytest.skip("label 1 already in use on another physical device")
    return LABELS


def _gpu_fn(host_ins, build):
    """Compile build(gpu inputs) -> outputs in the GPU mode, returning host values."""
    import cc2ops.cuda
    from cc2ops.cuda.transfer import gpu_from_host, host_from_gpu

    gins = [gpu_from_host(x, d) for x, d in zip(host_ins, LABELS * 4, strict=False)]
    outs = build(gins)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    return pytensor.function(
        host_ins, [host_from_gpu(o) for o in outs], mode=cc2ops.cuda.mode(0)
    )


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [0, 1])
def test_gpu_collectives_match_the_host_ones_sanitize(virtual_two, axis):
    r = np.random.default_rng(0)
    a, b = pt.matrix("a", dtype="float32"), pt.matrix("b", dtype="float32")
    uneven = [
        r.normal(size=(3, 5)).astype("float32"),
        r.normal(size=(3, 5)).astype("float32"),
    ]
    if axis == 0:
        uneven[1] = r.normal(size=(2, 5)).astype("float32")
    cases = [
        (
            lambda g: GpuAllGather(LABELS, axis, "virtual")(*g),
            AllGather(2, axis),
            uneven,
        ),
        (
            lambda g: GpuReduceScatter(LABELS, axis, "virtual")(*g),
            ReduceScatter(2, axis),
            [r.normal(size=(5, 3)).astype("float32") for _ in range(2)],
        ),
        (
            lambda g: GpuAllReduce(LABELS, "virtual")(*g),
            AllReduce(2),
            [r.normal(size=(4, 3)).astype("float32") for _ in range(2)],
        ),
    ]
    for build, host_op, vals in cases:
        got = _gpu_fn([a, b], build)(*vals)
        want = pytensor.function([a, b], host_op(a, b), mode="FAST_COMPILE")(*vals)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            assert np.isfinite(g).all()
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=str(host_op))


@pytest.mark.gpu
def test_gpu_broadcast_reduce_and_shard(virtual_two):
    r = np.random.default_rng(1)
    a, b = pt.matrix("a", dtype="float32"), pt.matrix("b", dtype="float32")
    va, vb = (r.normal(size=(5, 3)).astype("float32") for _ in range(2))
    got = _gpu_fn([a], lambda g: GpuBroadcast(LABELS, 0, "virtual")(g[0]))(va)
    for g in got:
        np.testing.assert_array_equal(g, va)
    (red,) = _gpu_fn([a, b], lambda g: [GpuReduce(LABELS, 1, "virtual")(*g)])(va, vb)
    np.testing.assert_allclose(red, va + vb, rtol=1e-6)
    (piece,) = _gpu_fn([a], lambda g: [GpuShard(2, 1, 1)(g[0])])(va)
    np.testing.assert_array_equal(piece, np.array_split(va, 2, axis=1)[1])


@pytest.mark.gpu
def test_gpu_collective_gradients_match_the_host_ones(virtual_two):
    r = np.random.default_rng(2)
    a, b = pt.matrix("a", dtype="float32"), pt.matrix("b", dtype="float32")
    va, vb = (r.normal(size=(4, 3)).astype("float32") for _ in range(2))

    def cost(outs):
        return sum(
            ((pt.as_tensor_variable(o) ** 2).sum() * (k + 1))
            for k, o in enumerate(outs)
        )

    import cc2ops.cuda
    from cc2ops.cuda.transfer import gpu_from_host

    gouts = GpuAllGather(LABELS, 1, "virtual")(gpu_from_host(a, 0), gpu_from_host(b, 1))
    g_gpu = pytensor.grad(cost(gouts), [a, b])
    f = pytensor.function([a, b], g_gpu, mode=cc2ops.cuda.mode(0))
    g_host = pytensor.grad(cost(AllGather(2, 1)(a, b)), [a, b])
    want = pytensor.function([a, b], g_host, mode="FAST_COMPILE")(va, vb)
    for g, w in zip(f(va, vb), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_nccl_loads_and_a_one_gpu_communicator_works():
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.device import get_device

    major, minor, _ = nccl.version()
    assert (major, minor) >= (2, 0)
    comms = nccl.Communicators([get_device(0).index])
    try:
        x = array.to_gpu(np.arange(6, dtype="float32"), 0)
        out = array.empty((6,), "float32", 0)
        import ctypes

        stream = ctypes.c_void_p(int(get_device(0).stream.handle))
        nccl.call(
            "ncclAllReduce", ctypes.c_void_p(array.ptr(x)),
            ctypes.c_void_p(array.ptr(out)),
            ctypes.c_size_t(6), nccl.DTYPES[np.dtype("float32")], nccl.SUM,
            comms.comms[0], stream,
        )  # fmt: skip
        np.testing.assert_array_equal(
            array.to_host(out, 0), np.arange(6, dtype="float32")
        )
    finally:
        comms.destroy()
