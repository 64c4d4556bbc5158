"""Softmax family on the GPU: lifting (CPU); values and gradients (GPU)."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.aliasing import add_supervisor_to_fgraph
from pytensor.compile.io import SymbolicInput
from pytensor.gradient import verify_grad
from pytensor.graph.basic import Constant
from pytensor.graph.fg import FunctionGraph
from pytensor.tensor.special import LogSoftmax, Softmax, log_softmax, softmax

import cc2ops.cuda as cuda
from cc2ops.cuda.ops.tensor import softmax as gsoftmax
from cc2ops.cuda.ops.tensor.softmax import GpuLogSoftmax, GpuSoftmax, GpuSoftmaxGrad
from cc2ops.cuda.transfer import HostFromGpu
from cc2ops.cuda.type import CudaArrayType


def gvar(shape=(None, None), dtype="float32", name="x"):
    return CudaArrayType(dtype, shape, 0)(name)


def lifted(outputs):
    fg = FunctionGraph(outputs=list(outputs), clone=False)
    add_supervisor_to_fgraph(
        fg, [SymbolicInput(v) for v in fg.inputs if not isinstance(v, Constant)]
    )
    cuda.mode().excluding("inplace").optimizer.rewrite(fg)
    return fg


@pytest.mark.parametrize(
    "fn,gpu_op", [(softmax, GpuSoftmax), (log_softmax, GpuLogSoftmax)]
)
def test_softmax_and_its_gradient_stay_on_the_gpu(fn, gpu_op):
    x = gvar()
    y = fn(cuda.host_from_gpu(x), axis=-1)
    g = pytensor.grad((y * pt.arange(5)).sum(), x)
    fg = lifted([cuda.gpu_from_host(y, 0), g])
    types = {type(n.op) for n in fg.apply_nodes}
    assert not types & {Softmax, LogSoftmax, HostFromGpu}, types
    if pytensor.__version__ < "3.1":  # 3.1+ inlines softmax before lifting
        assert gpu_op in types, types


def test_make_node_errors():
    with pytest.raises(TypeError, match="GpuSoftmax: x must be float32 or float64"):
        GpuSoftmax(1)(gvar(dtype="int32"))
    with pytest.raises(ValueError, match="GpuSoftmax: axis 2 is out of range"):
        GpuSoftmax(2)(gvar())
    with pytest.raises(TypeError, match="GpuSoftmaxGrad: dy and y must match"):
        GpuSoftmaxGrad(1)(gvar(), gvar(dtype="float64"))


def test_kernel_variants_are_named_by_op_and_dtype():
    names = {c["name"] for c in gsoftmax._variants()}
    assert "row_softmax_f32_b256" in names and "row_softmax_grad_f64_b256" in names


def ref_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def ref_log_softmax(x, axis):
    # not log(softmax): that is -inf (or log of a clamp) where softmax underflows
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def run(op, *arrays):
    from cc2ops.cuda.runtime import array

    syms = [CudaArrayType(a.dtype, (None,) * a.ndim, 0)() for a in arrays]
    fn = pytensor.function(syms, cuda.host_from_gpu(op(*syms)), mode=cuda.mode())
    return fn(*[array.to_gpu(a, 0) for a in arrays])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "shape,axis",
    [((7, 1000), 1), ((129, 3), 1), ((1, 1), 1), ((4, 5, 6), 1), ((3, 2049), 0)],
)
def test_values_match_numpy(shape, axis, dtype, debug):
    r = np.random.default_rng(1)
    x = (r.standard_normal(shape) * 30).astype(dtype)
    x.flat[0] = 1e4  # stable for huge logits
    # float64: absolute slack for results near 0 (log_softmax of a dominant
    # logit, the gradient where dy ~ sum(dy * y)), where rounding of the
    # sums is not small relative to the result
    tol = (
        dict(rtol=1e-5, atol=1e-6)
        if dtype == "float32"
        else dict(rtol=1e-10, atol=1e-12)
    )
    x64 = x.astype("float64")
    sm = ref_softmax(x64, axis)
    got = run(GpuSoftmax(axis), x)
    assert got.shape == x.shape and got.dtype == x.dtype
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, sm, **tol, err_msg="softmax")
    got = run(GpuLogSoftmax(axis), x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref_log_softmax(x64, axis), **tol, err_msg="log")
    dy = r.standard_normal(shape).astype(dtype)
    y = sm.astype(dtype)
    dy64, y64 = dy.astype("float64"), y.astype("float64")
    want = (dy64 - (dy64 * y64).sum(axis=axis, keepdims=True)) * y64
    got = run(GpuSoftmaxGrad(axis), dy, y)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, **tol, err_msg="softmax_grad")


@pytest.mark.gpu
def test_verify_grad_through_gpu_softmax_ops():
    x = np.random.default_rng(2).standard_normal((4, 7))
    for op in (GpuSoftmax(1), GpuLogSoftmax(1), GpuSoftmax(0)):

        def f(v, op=op):
            return cuda.host_from_gpu(op(cuda.gpu_from_host(v, 0)))

        verify_grad(
            f, [x], rng=np.random.default_rng(0), mode=cuda.mode(),
            abs_tol=1e-5, rel_tol=1e-5, eps=1e-7,  # one-sided differences
        )  # fmt: skip


@pytest.mark.gpu
def test_softmax_sanitize(debug):
    x = np.random.default_rng(3).standard_normal((5, 300)).astype("float32")
    np.testing.assert_allclose(run(GpuSoftmax(1), x), ref_softmax(x, 1), rtol=1e-5)
    np.testing.assert_allclose(
        run(GpuLogSoftmax(0), x), np.log(ref_softmax(x, 0)), rtol=1e-5, atol=1e-6
    )
