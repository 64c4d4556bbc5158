"""Transfer ops and the GPU mode on the CPU: types, shapes, gradients, folding.

Nothing here runs a transfer (that needs a GPU: see test_runtime.py); graphs
are built, rewritten, and where the rewrites leave no GPU op, compiled and run.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import Mode
from pytensor.gradient import DisconnectedType, disconnected_type, pushforward
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.type import TensorType

import cc2ops.cuda as cuda
from cc2ops.cuda import GpuFromHost, GpuToGpu, HostFromGpu
from cc2ops.cuda.mode import GpuMode, GpuVMLinker
from cc2ops.cuda.transfer import as_gpu, as_host
from cc2ops.cuda.type import CudaArrayType

TRANSFERS = (GpuFromHost, HostFromGpu, GpuToGpu)
#: fast_run on the Python linker: enough to see shape inference and folding.
FAST_PY = Mode(linker="py", optimizer="fast_run")


def gpu_var(shape=(None, 3), device=0, dtype="float32", name="x"):
    return CudaArrayType(dtype, shape, device)(name)


def ops_in(outputs):
    fg = FunctionGraph(
        outputs=outputs if isinstance(outputs, list) else [outputs], clone=False
    )
    return [type(n.op) for n in fg.toposort()]


def test_op_props_and_str():
    assert GpuFromHost(1) == GpuFromHost(1) and GpuFromHost(1) != GpuFromHost(0)
    assert hash(GpuFromHost(1)) == hash(GpuFromHost(device=1))
    assert GpuToGpu(0, 1) == GpuToGpu(src=0, dst=1) != GpuToGpu(1, 0)
    assert HostFromGpu() == HostFromGpu()
    assert GpuFromHost.__props__ == ("device",)
    assert GpuToGpu.__props__ == ("src", "dst")
    assert str(GpuFromHost(2)) == "GpuFromHost{device=2}"
    assert str(GpuToGpu(0, 1)) == "GpuToGpu{0->1}"
    with pytest.raises(ValueError, match="GpuFromHost: device must be >= 0, got -1"):
        GpuFromHost(-1)
    with pytest.raises(
        TypeError, match="GpuToGpu: dst must be an int device label, got str"
    ):
        GpuToGpu(0, "1")


def test_output_types():
    h = pt.tensor("h", dtype="float64", shape=(None, 4, 1))
    g = GpuFromHost(1)(h)
    assert g.type == CudaArrayType("float64", (None, 4, 1), 1)
    back = HostFromGpu()(g)
    assert back.type == h.type
    moved = GpuToGpu(1, 3)(g)
    assert moved.type == CudaArrayType("float64", (None, 4, 1), 3)
    # builders
    assert cuda.gpu_from_host(h, 2).type.device == 2
    assert cuda.gpu_from_host(g, 1) is g
    assert isinstance(cuda.gpu_from_host(g, 0).owner.op, GpuToGpu)
    assert cuda.host_from_gpu(g).type == h.type
    assert cuda.gpu_to_gpu(g, 0).type.device == 0
    for dtype in ("bool", "int8", "uint16", "int64", "float16", "complex128"):
        assert cuda.gpu_from_host(pt.vector(dtype=dtype)).type.dtype == dtype


def test_make_node_rejects():
    g = gpu_var()
    with pytest.raises(
        TypeError, match="already lives on GPU device 0; use gpu_to_gpu"
    ):
        GpuFromHost(1)(g)
    with pytest.raises(TypeError, match="HostFromGpu: input must be a GPU variable"):
        HostFromGpu()(pt.matrix())
    with pytest.raises(TypeError, match="GpuToGpu: input must be a GPU variable"):
        GpuToGpu(0, 1)(pt.matrix())
    with pytest.raises(
        ValueError, match=r"GpuToGpu\(1->0\): the input lives on device 0"
    ):
        GpuToGpu(1, 0)(g)
    with pytest.raises(TypeError, match="gpu_to_gpu: input must be a GPU variable"):
        cuda.gpu_to_gpu(pt.matrix(), 1)
    with pytest.raises(TypeError, match="GpuFromHost: input must be a tensor"):
        GpuFromHost(0)(object())


@pytest.mark.parametrize(
    "build",
    [
        lambda h: cuda.gpu_from_host(h, 0),
        lambda h: cuda.gpu_from_host(h, 1),
        lambda h: cuda.gpu_to_gpu(cuda.gpu_from_host(h, 0), 1),
        lambda h: cuda.host_from_gpu(cuda.gpu_to_gpu(cuda.gpu_from_host(h, 0), 1)),
    ],
)
def test_infer_shape_removes_the_transfers(build):
    h = pt.tensor3("h")
    out = build(h)
    fn = pytensor.function([h], out.shape, mode=FAST_PY)
    present = {type(n.op) for n in fn.maker.fgraph.apply_nodes}
    assert not present & set(TRANSFERS), present
    value = np.zeros((2, 5, 3), dtype=h.dtype)
    assert tuple(fn(value)) == (2, 5, 3)


def test_infer_shape_directly():
    g = gpu_var()
    for node in (
        GpuFromHost(0)(pt.matrix()).owner,
        HostFromGpu()(g).owner,
        GpuToGpu(0, 1)(g).owner,
    ):
        shapes = [("a", "b")]
        assert node.op._infer_shape(node, shapes) == shapes
        # both PyTensor signatures reach it
        assert node.op.infer_shape(None, node, shapes) == shapes
        assert node.op.infer_shape(node, shapes) == shapes


def test_never_constant_folded():
    const = pt.constant(np.ones((2, 3), "float32"))
    for out in (
        cuda.gpu_from_host(const),
        cuda.gpu_to_gpu(cuda.gpu_from_host(const), 1),
    ):
        for node in (out.owner,):
            assert node.op.do_constant_folding(None, node) is False
        rewritten = rewrite_graph(out, include=("fast_run",), exclude=("inplace",))
        assert GpuFromHost in ops_in(rewritten)
    # HostFromGpu of a GPU constant is not folded either
    k = CudaArrayType("float32", (None,), 0).filter_variable(np.ones(2, "float32"))
    back = rewrite_graph(
        cuda.host_from_gpu(k), include=("fast_run",), exclude=("inplace",)
    )
    assert HostFromGpu in ops_in(back)


# --------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------


def test_pullbacks_are_the_reverse_transfers():
    h = pt.matrix("h", dtype="float32")
    g = gpu_var(shape=(None, None))
    node = GpuFromHost(0)(h).owner
    (back,) = node.op.pullback(node.inputs, node.outputs, [g])
    assert isinstance(back.owner.op, HostFromGpu) and back.owner.inputs[0] is g
    # a host-typed cotangent (PyTensor adds terms with host ops) passes
    (same,) = node.op.pullback(node.inputs, node.outputs, [h])
    assert same is h

    x = gpu_var(shape=(None, None), device=2)
    node = HostFromGpu()(x).owner
    (up,) = node.op.pullback(node.inputs, node.outputs, [h])
    assert isinstance(up.owner.op, GpuFromHost) and up.owner.op.device == 2

    node = GpuToGpu(2, 5)(x).owner
    (rev,) = node.op.pullback(node.inputs, node.outputs, [node.outputs[0].type()])
    assert rev.owner.op == GpuToGpu(5, 2)

    d = disconnected_type()
    for n in (GpuFromHost(0)(h).owner, HostFromGpu()(x).owner, GpuToGpu(2, 1)(x).owner):
        (out,) = n.op.pullback(n.inputs, n.outputs, [d])
        assert isinstance(out.type, DisconnectedType)


def test_grad_through_transfers_needs_no_gpu():
    h = pt.matrix("h")
    roundtrip = cuda.host_from_gpu(cuda.gpu_to_gpu(cuda.gpu_from_host(h, 0), 1))
    cost = (roundtrip**2).sum()
    grad = pytensor.grad(cost, h)
    assert grad.type == h.type
    # the reverse transfers cancel with the forward ones under fast_run
    fn = pytensor.function([h], grad, mode=FAST_PY)
    present = {type(n.op) for n in fn.maker.fgraph.apply_nodes}
    assert not present & set(TRANSFERS), present
    value = np.arange(6, dtype=h.dtype).reshape(2, 3)
    np.testing.assert_allclose(fn(value), 2 * value)


def test_grad_wrt_a_gpu_variable_is_gpu_typed():
    x = gpu_var(shape=(None, 3))
    cost = (cuda.host_from_gpu(x) * 3).sum()
    (gx,) = pytensor.grad(cost, [x])
    assert gx.type == x.type
    assert isinstance(gx.owner.op, GpuFromHost)


def test_grad_of_a_gpu_variable_used_twice():
    x = gpu_var(shape=(None,))
    y = cuda.gpu_to_gpu(x, 1)
    cost = cuda.host_from_gpu(x).sum() + (cuda.host_from_gpu(y) ** 2).sum()
    (gx,) = pytensor.grad(cost, [x])
    # the two terms are added on the host (PyTensor's sum of terms), which the
    # HostFromGpu pullback returns to device 0
    assert gx.type.ndim == 1 and gx.type.dtype == "float32"


def test_pushforward_methods():
    h = pt.vector("h", dtype="float32")
    x = gpu_var(shape=(None,), device=1)
    node = GpuFromHost(1)(h).owner
    (t,) = node.op.pushforward(node.inputs, node.outputs, [h])
    assert isinstance(t.owner.op, GpuFromHost) and t.type.device == 1
    node = HostFromGpu()(x).owner
    (t,) = node.op.pushforward(node.inputs, node.outputs, [x])
    assert isinstance(t.owner.op, HostFromGpu)
    node = GpuToGpu(1, 0)(x).owner
    (t,) = node.op.pushforward(node.inputs, node.outputs, [x])
    assert t.owner.op == GpuToGpu(1, 0)
    (t,) = node.op.pushforward(node.inputs, node.outputs, [disconnected_type()])
    assert isinstance(t.type, DisconnectedType)


def test_pushforward_through_transfers_runs_on_cpu():
    h = pt.vector("h")
    v = pt.vector("v")
    y = cuda.host_from_gpu(cuda.gpu_from_host(h * 2, 0))
    jvp = pushforward(y, h, v, use_op_pushforward=True)
    fn = pytensor.function([h, v], jvp, mode=FAST_PY)
    assert not {type(n.op) for n in fn.maker.fgraph.apply_nodes} & set(TRANSFERS)
    np.testing.assert_allclose(
        fn(np.ones(3, h.dtype), np.arange(3, dtype=v.dtype)), [0.0, 2.0, 4.0]
    )


def test_as_gpu_and_as_host_use_the_fewest_transfers():
    x = gpu_var(device=0)
    assert as_gpu(x, 0) is x
    assert as_gpu(x, 1).owner.op == GpuToGpu(0, 1)
    assert as_gpu(cuda.host_from_gpu(x), 0) is x
    assert as_gpu(cuda.host_from_gpu(x), 2).owner.op == GpuToGpu(0, 2)
    h = pt.matrix(dtype="float32")
    assert as_gpu(h, 3).owner.op == GpuFromHost(3)
    assert as_host(h) is h
    assert as_host(cuda.gpu_from_host(h)) is h
    assert isinstance(as_host(x).owner.op, HostFromGpu)


# --------------------------------------------------------------------------
# the GPU mode, without a GPU
# --------------------------------------------------------------------------


def test_mode_construction():
    m = cuda.mode()
    assert isinstance(m, GpuMode) and isinstance(m.linker, GpuVMLinker)
    assert m.linker.use_cloop
    assert (m.cc2ops_device, m.cc2ops_devices) == (0, (0,))
    m2 = cuda.mode(1, devices=[0, 1, 2])
    assert (m2.cc2ops_device, m2.cc2ops_devices) == (1, (1, 0, 2))
    # clones (including/excluding) keep the devices and the linker class
    m3 = m2.excluding("cc2ops_gpu_inplace")
    assert isinstance(m3, GpuMode) and m3.cc2ops_devices == (1, 0, 2)
    assert not cuda.mode(linker="py").linker.use_cloop
    registered = pytensor.compile.mode.get_mode("CC2OPS_GPU")
    assert isinstance(registered, GpuMode) and registered.cc2ops_device == 0
    with pytest.raises(ValueError, match="device 3 is not one of devices"):
        cuda.mode(3, devices=[0, 1])
    with pytest.raises(ValueError, match="repeated labels"):
        cuda.mode(0, devices=[0, 0])
    with pytest.raises(ValueError, match="devices must not be empty"):
        cuda.mode(0, devices=[])
    with pytest.raises(ValueError, match="linker must be one of"):
        cuda.mode(linker="numba")
    with pytest.raises(TypeError, match="device label must be an int"):
        cuda.mode("0")


@pytest.mark.parametrize("linker", ["cvm", "py"])
def test_host_only_graphs_compile_and_run_in_the_gpu_mode(linker):
    h = pt.vector("h")
    fn = pytensor.function([h], (h * 2).sum(), mode=cuda.mode(linker=linker))
    assert fn(np.arange(3, dtype=h.dtype)) == 6
    # a graph whose transfers all cancel needs no GPU either (a round trip with
    # no consumer: nothing to lift, the pair cancels)
    y = cuda.host_from_gpu(cuda.gpu_from_host(h))
    fn = pytensor.function([h], y, mode=cuda.mode(linker=linker))
    np.testing.assert_allclose(fn(np.ones(2, dtype=h.dtype)), [1.0, 1.0])


@pytest.mark.parametrize("linker", ["cvm", "py"])
def test_compiling_a_gpu_graph_without_cuda_says_why(monkeypatch, linker):
    monkeypatch.setenv("CC2OPS_DISABLE_CUDA", "1")
    h = pt.vector("h", dtype="float32")
    x = gpu_var(shape=(None,))
    with pytest.raises(
        cuda.CudaUnavailableError, match="not available: CUDA is disabled"
    ):
        pytensor.function([x], cuda.host_from_gpu(x), mode=cuda.mode(linker=linker))
    W = cuda.shared(np.zeros(3, "float32"))
    with pytest.raises(cuda.CudaUnavailableError):
        pytensor.function([h], [], updates=[(W, h)], mode=cuda.mode(linker=linker))
    assert not W.is_uploaded


def test_unavailable_reason_names_what_is_missing(monkeypatch):
    monkeypatch.setenv("CC2OPS_DISABLE_CUDA", "1")
    assert not cuda.is_available()
    assert "CC2OPS_DISABLE_CUDA" in cuda.unavailable_reason()
    with pytest.raises(cuda.CudaUnavailableError, match="CC2OPS_DISABLE_CUDA=1"):
        cuda.require()
    monkeypatch.delenv("CC2OPS_DISABLE_CUDA")
    reason = cuda.unavailable_reason()
    if reason is not None:
        # which of pycuda / driver / device is missing, with the install hint
        assert any(k in reason for k in ("pycuda", "cuInit", "no CUDA device"))
        if "pycuda" in reason:
            assert 'pip install -e ".[cuda]"' in reason and "nvcc" in reason


def test_gpu_graphs_rewrite_in_the_gpu_mode_without_cuda(monkeypatch):
    monkeypatch.setenv("CC2OPS_DISABLE_CUDA", "1")
    x = gpu_var(shape=(None, 3))
    y = cuda.gpu_from_host(cuda.host_from_gpu(x) * 2)
    z = cuda.host_from_gpu(cuda.gpu_from_host(cuda.host_from_gpu(y)))
    fg = FunctionGraph([x], [z], clone=True)
    cuda.mode().excluding("inplace").optimizer.rewrite(fg)
    # z's round trip and y's upload cancel: one download is left, and the Mul
    # runs next to it (on the host, or lifted by the GPU elemwise rule)
    kinds = [type(n.op) for n in fg.toposort()]
    assert kinds.count(HostFromGpu) == 1 and GpuFromHost not in kinds, kinds
    assert len(kinds) == 2, kinds
    mul = next(n for n in fg.apply_nodes if not isinstance(n.op, HostFromGpu))
    assert isinstance(mul.op, Elemwise) or type(mul.op).__name__ == "GpuElemwise"
    assert isinstance(fg.outputs[0].type, TensorType)


def test_the_gpu_linker_swaps_deep_copies_of_gpu_values():
    from pytensor.compile.ops import deep_copy_op

    x = gpu_var(shape=(None,))
    h = pt.vector("h")
    fg = FunctionGraph([x, h], [deep_copy_op(x), deep_copy_op(h)], clone=False)
    copied_gpu, copied_host = fg.outputs
    linker = cuda.mode().linker
    accepted = linker.accept(fg, no_recycling=[copied_gpu, copied_host])
    kinds = sorted(type(n.op).__name__ for n in fg.apply_nodes)
    assert kinds == ["DeepCopyOp", "GpuDeepCopy"]
    new_gpu = fg.outputs[0]
    assert (
        isinstance(new_gpu.owner.op, cuda.transfer.GpuDeepCopy)
        and new_gpu.type == x.type
    )
    assert accepted.no_recycling == [new_gpu, copied_host]
