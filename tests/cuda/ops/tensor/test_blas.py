"""cuBLAS GPU ops: lifting (CPU); products vs numpy, folded transposes (GPU)."""

from __future__ import annotations

import functools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytensor.tensor.blas as host_blas
import pytest
from helpers import close as gpu_close
from helpers import rng
from pytensor.compile.aliasing import add_supervisor_to_fgraph
from pytensor.compile.io import SymbolicInput
from pytensor.gradient import verify_grad
from pytensor.graph.basic import Constant
from pytensor.graph.fg import FunctionGraph

import cc2ops.cuda as cuda
from cc2ops.cuda.ops.tensor import basic
from cc2ops.cuda.ops.tensor.basic import GpuDimShuffle
from cc2ops.cuda.ops.tensor.blas import (
    GpuBatchedDot,
    GpuDot,
    GpuDot22,
    GpuDot22Scalar,
    GpuGemm,
    GpuGemv,
    GpuGer,
)
from cc2ops.cuda.type import CudaArrayType

HOST_BLAS = tuple(
    getattr(host_blas, n)
    for n in ("Dot22", "Dot22Scalar", "Gemm", "Gemv", "Ger", "BatchedDot")
    if hasattr(host_blas, n)
)

close = functools.partial(gpu_close, check_dtype=False)


def gvar(shape=(None, None), dtype="float32", device=0, name="x"):
    return CudaArrayType(dtype, shape, device)(name)


def lifted(outputs, inplace=False):
    fg = FunctionGraph(outputs=list(outputs), clone=False)
    add_supervisor_to_fgraph(
        fg, [SymbolicInput(v) for v in fg.inputs if not isinstance(v, Constant)]
    )
    mode = cuda.mode() if inplace else cuda.mode().excluding("inplace")
    mode.optimizer.rewrite(fg)
    return fg


def op_types(fg):
    return {type(n.op) for n in fg.apply_nodes}


# --------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------


def test_dense_layer_and_its_gradients_lift_to_gemm_ops():
    x, w = gvar((8, 5), name="x"), gvar((5, 3), name="w")
    hx, hw = cuda.host_from_gpu(x), cuda.host_from_gpu(w)
    y = pt.dot(hx, hw)
    gx, gw = pytensor.grad((y**2).sum(), [x, w])
    fg = lifted([cuda.gpu_from_host(y, 0), gx, gw])
    types = op_types(fg)
    assert GpuDot22 in types, types
    assert not types & set(HOST_BLAS), types
    # the weight gradient's transpose is a view feeding the product directly
    for node in fg.apply_nodes:
        if isinstance(node.op, GpuDot22):
            for v in node.inputs:
                if v.owner is not None and isinstance(v.owner.op, GpuDimShuffle):
                    assert v.owner.op.is_transpose


def test_each_host_blas_op_lifts():
    z, x, y = gvar((4, 3), name="z"), gvar((4, 5), name="x"), gvar((5, 3), name="y")
    v, u = gvar((5,), name="v"), gvar((4,), name="u")
    b3 = gvar((2, 4, 5), name="b3")
    h = cuda.host_from_gpu
    a = pt.constant(np.float32(0.5))
    cases = [
        (host_blas.Dot22()(h(x), h(y)), GpuDot22),
        (host_blas.Dot22Scalar()(h(x), h(y), a), GpuDot22Scalar),
        (host_blas.Gemm(inplace=False)(h(z), a, h(x), h(y), a), GpuGemm),
        (host_blas.Gemv(inplace=False)(h(u), a, h(x), h(v), a), GpuGemv),
        (host_blas.BatchedDot()(h(b3), h(gvar((2, 5, 3), name="c3"))), GpuBatchedDot),
    ]
    if hasattr(host_blas, "Ger"):
        cases.append((host_blas.Ger(destructive=False)(h(x), a, h(u), h(v)), GpuGer))
    for out, gpu_op in cases:
        fg = lifted([cuda.gpu_from_host(out, 0)])
        types = op_types(fg)
        assert gpu_op in types and not types & set(HOST_BLAS), (gpu_op, types)


def test_gemm_becomes_inplace_on_an_intermediate_only():
    z, x, y = gvar((4, 3), name="z"), gvar((4, 5), name="x"), gvar((5, 3), name="y")
    h = cuda.host_from_gpu
    a = pt.constant(np.float32(0.5))
    out = host_blas.Gemm(inplace=False)(h(z) * 2, a, h(x), h(y), a)
    fg = lifted([cuda.gpu_from_host(out, 0)], inplace=True)
    (op,) = [n.op for n in fg.apply_nodes if isinstance(n.op, GpuGemm)]
    assert op.inplace and op.destroy_map == {0: [0]}
    out = host_blas.Gemm(inplace=False)(h(z), a, h(x), h(y), a)
    fg = lifted([cuda.gpu_from_host(out, 0)], inplace=True)
    (op,) = [n.op for n in fg.apply_nodes if isinstance(n.op, GpuGemm)]
    assert not op.inplace  # z is a function input


def test_batched_gemm_shape_and_layout_rules():
    """The shape and output checks the real and complex strided-batched GEMMs share
    (cuBLAS's ldc and batch stride, in elements), on array-likes: no GPU."""
    from types import SimpleNamespace

    from cc2ops.cuda.libs import cublas as blas

    def arr(shape, strides):
        return SimpleNamespace(shape=shape, strides=strides, gpudata=4096)

    def layout(c):
        return blas._batched_output_layout("w", c, 3, 5, 8)

    # (2, 3, 5) complex64, C-contiguous; then rows padded to 8 and batches apart
    assert layout(arr((2, 3, 5), (120, 40, 8))) == (5, 15)
    assert layout(arr((2, 3, 5), (256, 64, 8))) == (8, 32)
    assert layout(arr((1, 3, 5), (0, 40, 8))) == (5, 0)  # one batch: any stride
    bad = [
        arr((2, 3, 5), (120, 8, 24)),  # transposed inner matrices
        arr((2, 3, 5), (0, 40, 8)),  # broadcast batch
        arr((2, 3, 5), (124, 40, 8)),  # batch stride not a whole element
        arr((2, 3, 5), (120, 40, 16)),  # column stride of two elements
    ]
    for c in bad:
        with pytest.raises(ValueError, match="w: c must have row-major inner"):
            layout(c)
    # the operands' dims: batch broadcast from 1, transposes, an empty batch
    a, b = SimpleNamespace(shape=(1, 3, 4)), SimpleNamespace(shape=(6, 4, 5))
    assert blas._batched_dims("w", a, b, False, False) == (6, 3, 4, 5)
    at = SimpleNamespace(shape=(6, 4, 3))
    assert blas._batched_dims("w", at, b, True, False) == (6, 3, 4, 5)
    empty = SimpleNamespace(shape=(0, 3, 4))
    one = SimpleNamespace(shape=(1, 4, 5))
    assert blas._batched_dims("w", empty, one, False, False) == (0, 3, 4, 5)
    with pytest.raises(ValueError, match="w: batch sizes 2 and 6 differ"):
        blas._batched_dims("w", SimpleNamespace(shape=(2, 3, 4)), b, False, False)
    with pytest.raises(ValueError, match="w: op\\(a\\) is 3x4 and op\\(b\\) is 5x4"):
        blas._batched_dims("w", a, b, False, True)


def test_make_node_errors():
    x = gvar((4, 5))
    with pytest.raises(ValueError, match="GpuDot22: inner dimensions differ: 5 and 4"):
        GpuDot22()(x, gvar((4, 3)))
    with pytest.raises(TypeError, match="GpuDot22: y must have 2 dims"):
        GpuDot22()(x, gvar((5,)))
    with pytest.raises(TypeError, match="GpuDot22: x must be float32 or float64"):
        GpuDot22()(gvar((4, 5), dtype="int32"), x)
    with pytest.raises(TypeError, match="inputs must share one float dtype"):
        GpuDot22()(x, gvar((5, 2), dtype="float64"))
    with pytest.raises(TypeError, match="GpuGemm: a must be a 0-d tensor"):
        GpuGemm()(gvar((4, 3)), pt.vector(), x, gvar((5, 3)), 1.0)


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------


def gpu_function(build, *arrays):
    """Compile ``build(*host views of GPU inputs)`` in the GPU mode.

    The inputs are GPU-typed and fed GPUArrays: a host input wrapped in
    ``host_from_gpu(gpu_from_host(v))`` would be cancelled back to the host
    value (``local_cancel_host_gpu_host``) and the graph would stay on the
    host. Returns the function and the GPU arrays to call it with.
    """
    from cc2ops.cuda.runtime import array

    syms = [gvar((None,) * a.ndim, dtype=str(a.dtype), name=f"in{k}")
            for k, a in enumerate(arrays)]  # fmt: skip
    outs = build(*[cuda.host_from_gpu(s) for s in syms])
    fn = pytensor.function(syms, outs, mode=cuda.mode())
    assert not op_types(fn.maker.fgraph) & set(HOST_BLAS), op_types(fn.maker.fgraph)
    return fn, [array.to_gpu(a, 0) for a in arrays]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_products_match_numpy_with_transposed_inputs(dtype, debug, monkeypatch):
    calls = []
    real_t, real_c = basic._launch_transpose, basic.array._copy_into_contiguous
    monkeypatch.setattr(
        basic, "_launch_transpose", lambda *a: (calls.append("t"), real_t(*a))[1]
    )
    monkeypatch.setattr(
        basic.array,
        "_copy_into_contiguous",
        lambda src, *a: (
            None if basic.array.is_c_contiguous(src) else calls.append("copy"),
            real_c(src, *a),
        )[1],
    )
    r = rng(1)
    a = r.standard_normal((7, 9)).astype(dtype)
    b = r.standard_normal((9, 5)).astype(dtype)
    c = r.standard_normal((7, 5)).astype(dtype)

    def build(ha, hb, hc):
        return [
            pt.dot(ha, hb),
            pt.dot(ha.T.T, hb[:, 1:4]),  # a row-strided view
            pt.dot(hc.T, ha),  # transposed operand: cuBLAS flag, no copy
            pt.dot(ha, hb.T.T) * 0.5 + hc,
        ]

    fn, args = gpu_function(build, a, b, c)
    del calls[:]
    got = fn(*args)
    # no transpose kernel and no strided copy (memcpy of a whole buffer is
    # fine): cuBLAS took the transposed and row-strided views as they are
    assert not calls, f"copies ran before the products: {calls}"
    wants = [a @ b, a @ b[:, 1:4], c.T @ a, 0.5 * (a @ b) + c]
    for k, (g, w) in enumerate(zip(got, wants, strict=True)):
        close(g, w, dtype, f"output {k}")


@pytest.mark.gpu
def test_gemv_ger_batched_and_scalar_ops(debug):
    from cc2ops.cuda.runtime import array

    r = rng(2)
    A = r.standard_normal((6, 4)).astype("float64")  # noqa: N806
    x, y = r.standard_normal(4), r.standard_normal(6)
    b3, c3 = r.standard_normal((3, 6, 4)), r.standard_normal((3, 4, 2))
    g = lambda v: array.to_gpu(v, 0)  # noqa: E731
    gA, gx, gy = g(A), g(x), g(y)  # noqa: N806
    cases = [
        (GpuGemv(), [gy, 0.5, gA, gx, 2.0], 2.0 * y + 0.5 * A @ x),
        (GpuGemv(), [g(np.zeros(4)), 1.0, basic.dimshuffle_view(gA, (1, 0)), gy, 0.0],
         A.T @ y),
        (GpuGer(), [gA, 3.0, gy, gx], A + 3.0 * np.outer(y, x)),
        (GpuDot22Scalar(), [gA, basic.dimshuffle_view(gA, (1, 0)), 2.0], 2 * A @ A.T),
        (GpuBatchedDot(), [g(b3), g(c3)], b3 @ c3),
        (GpuGemm(), [g(A @ A.T), 1.0, gA, basic.dimshuffle_view(gA, (1, 0)), -1.0],
         np.zeros((6, 6))),
    ]  # fmt: skip
    for k, (op, args, want) in enumerate(cases):
        sym = [
            CudaArrayType(v.dtype, (None,) * v.ndim, 0)()
            if hasattr(v, "gpudata")
            else pt.constant(np.float64(v))
            for v in args
        ]
        node = op.make_node(*sym)
        fn = pytensor.function(
            [s for s in sym if not isinstance(s, Constant)],
            cuda.host_from_gpu(node.outputs[0]),
            mode=cuda.mode(),
        )
        got = fn(*[v for v in args if hasattr(v, "gpudata")])
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=str(k))
    # inputs were not overwritten by the non-inplace ops
    np.testing.assert_array_equal(array.to_host(gA), A)


@pytest.mark.gpu
def test_tf32_switch_is_read_when_the_product_runs():
    r = rng(3)
    a = r.standard_normal((256, 512)).astype("float32")
    b = r.standard_normal((512, 256)).astype("float32")
    fn, args = gpu_function(lambda ha, hb: pt.dot(ha, hb), a, b)
    assert GpuDot22 in op_types(fn.maker.fgraph) or GpuDot in op_types(
        fn.maker.fgraph
    ), op_types(fn.maker.fgraph)
    # float32 inputs with full 24-bit mantissas, K = 512: entries ~ 22, the
    # fp32 error ~ 1e-5 and TF32's (10-bit inputs) ~ 1e-2
    want = a.astype("float64") @ b.astype("float64")
    with cuda.allow_tf32(False):
        e32 = np.abs(np.asarray(fn(*args)) - want).max()
    with cuda.allow_tf32(True):
        etf = np.abs(np.asarray(fn(*args)) - want).max()
    assert 0 < e32 < 1e-3 and etf > 10 * e32, (e32, etf)


@pytest.mark.gpu
def test_verify_grad_through_gpu_dot():
    r = rng(4)
    x, w = r.standard_normal((5, 4)), r.standard_normal((4, 3))

    def f(a, b):
        ga, gb = (cuda.gpu_from_host(v, 0) for v in (a, b))
        return cuda.host_from_gpu(GpuDot22()(ga, gb))

    verify_grad(
        f, [x, w], rng=rng(0), mode=cuda.mode(), abs_tol=1e-7, rel_tol=1e-7, eps=1e-7
    )


@pytest.mark.gpu
def test_blas_ops_sanitize(debug):
    r = rng(5)
    a = r.standard_normal((33, 17)).astype("float32")
    fn, args = gpu_function(lambda h: [pt.dot(h.T, h), pt.dot(h, h[:3].T)], a)
    g1, g2 = fn(*args)
    close(g1, a.T @ a, "float32", "a.T @ a")
    close(g2, a @ a[:3].T, "float32", "a @ a[:3].T")
