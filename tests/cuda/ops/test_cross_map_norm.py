"""GPU cross-map normalisation: lifting, validation, shapes (CPU); values (GPU).

GPU tests (``gpu`` marker) compare the kernels with
:mod:`cc2ops.cross_map_norm`'s references for sizes 1, 2, 3, 5, 7, blocked and
not, channel counts 1..64 (odd ones included), with NaN-poisoned outputs
(``CC2OPS_DEBUG=1``), and run ``verify_grad`` through the GPU ops in
``cc2ops.cuda.mode()``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import close as gpu_close
from helpers import rng, to_gpu
from pytensor.compile.aliasing import add_supervisor_to_fgraph
from pytensor.compile.io import SymbolicInput
from pytensor.gradient import verify_grad
from pytensor.graph.basic import Constant
from pytensor.graph.fg import FunctionGraph

import cc2ops.cuda as cuda
from cc2ops.cross_map_norm import (
    CrossMapNorm,
    CrossMapNormGrad,
    cross_map_norm,
    cross_map_norm_grad_reference,
    cross_map_norm_reference,
)
from cc2ops.cuda.ops import cross_map_norm as grn
from cc2ops.cuda.ops.cross_map_norm import (
    MAX_SIZE,
    GpuCrossMapNorm,
    GpuCrossMapNormGrad,
    cross_map_norm_kernel_name,
)
from cc2ops.cuda.type import CudaArrayType

close = functools.partial(gpu_close, tol32=2e-6)

PARAMS = dict(size=5, alpha=1e-4, beta=0.75, k=2.0, blocked=False)


def gvar(shape=(None,) * 4, dtype="float32", device=0, name="x"):
    return CudaArrayType(dtype, shape, device)(name)


def lifted(outputs):
    outs = outputs if isinstance(outputs, list) else [outputs]
    fg = FunctionGraph(outputs=outs, clone=False)
    add_supervisor_to_fgraph(
        fg, [SymbolicInput(v) for v in fg.inputs if not isinstance(v, Constant)]
    )
    cuda.mode().optimizer.rewrite(fg)
    return fg


def op_types(fg):
    return {type(n.op) for n in fg.apply_nodes}


# --------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["bc01", "c01b"])
@pytest.mark.parametrize("blocked", [False, True])
def test_cross_map_norm_and_gradient_lift(layout, blocked):
    x = gvar()
    h = cuda.host_from_gpu(x)
    if layout == "c01b":
        h = h.dimshuffle(1, 2, 3, 0)
    y = cross_map_norm(h, size=3, alpha=0.5, beta=0.6, k=1.5, blocked=blocked,
                       layout=layout)  # fmt: skip
    gx = pytensor.grad((y**2).sum(), x)
    fg = lifted([cuda.gpu_from_host(y, 0), gx])
    types = op_types(fg)
    assert {GpuCrossMapNorm, GpuCrossMapNormGrad} <= types, types
    assert not types & {CrossMapNorm, CrossMapNormGrad}, types
    node = next(n for n in fg.apply_nodes if isinstance(n.op, GpuCrossMapNorm))
    assert node.op._props() == (3, 0.5, 0.6, 1.5, blocked)


def test_each_host_op_lifts_with_its_props():
    x, g = gvar(name="x"), gvar(name="g")
    hx, hg = cuda.host_from_gpu(x), cuda.host_from_gpu(g)
    for out, gpu_op in [
        (CrossMapNorm(**PARAMS)(hx), GpuCrossMapNorm),
        (CrossMapNormGrad(**PARAMS)(hx, hg), GpuCrossMapNormGrad),
    ]:
        fg = lifted([cuda.gpu_from_host(out, 0)])
        assert fg.outputs[0].owner.op == gpu_op(**PARAMS)
        assert gpu_op.__props__ == type(out.owner.op).__props__


def test_second_derivative_builds():
    x = gvar(dtype="float64")
    y = GpuCrossMapNorm(**PARAMS)(x)
    g = pytensor.grad((cuda.host_from_gpu(y) ** 2).sum(), x)
    assert g.type == x.type
    # PyTensor adds the two paths' terms with a host op: a host-typed sum
    gg = pytensor.grad((cuda.host_from_gpu(g) ** 2).sum(), x)
    assert (gg.type.dtype, gg.type.ndim) == ("float64", 4)
    types = op_types(lifted([cuda.gpu_from_host(gg, 0)]))
    assert GpuCrossMapNormGrad in types and CrossMapNormGrad not in types


def test_windows_too_large_for_registers_stay_on_the_host():
    x = gvar()
    y = CrossMapNorm(size=MAX_SIZE + 1)(cuda.host_from_gpu(x))
    assert CrossMapNorm in op_types(lifted([cuda.gpu_from_host(y, 0)]))
    with pytest.raises(
        ValueError, match=f"GpuCrossMapNorm: size must be <= {MAX_SIZE}"
    ):
        GpuCrossMapNorm(size=MAX_SIZE + 1)


def test_make_node_errors_and_shapes():
    with pytest.raises(TypeError, match="GpuCrossMapNorm: x must be a GPU variable"):
        GpuCrossMapNorm()(pt.tensor4())
    with pytest.raises(TypeError, match=r"GpuCrossMapNorm: x must have 4 dims"):
        GpuCrossMapNorm()(gvar(shape=(None, None)))
    with pytest.raises(TypeError, match="GpuCrossMapNorm: x must be float32 or"):
        GpuCrossMapNorm()(gvar(dtype="int64"))
    with pytest.raises(ValueError, match="GpuCrossMapNorm: k must be > 0"):
        GpuCrossMapNorm(k=0.0)
    with pytest.raises(ValueError, match="GpuCrossMapNormGrad: alpha must be >= 0"):
        GpuCrossMapNormGrad(alpha=-1.0)
    with pytest.raises(TypeError, match="GpuCrossMapNormGrad: blocked must be a bool"):
        GpuCrossMapNormGrad(blocked=1)
    with pytest.raises(TypeError, match="GpuCrossMapNormGrad: inputs must share one"):
        GpuCrossMapNormGrad()(gvar(), gvar(dtype="float64"))
    with pytest.raises(ValueError, match="GpuCrossMapNormGrad: gy shape must equal"):
        GpuCrossMapNormGrad()(gvar((2, 3, 4, 5)), gvar((2, 4, 4, 5)))
    with pytest.raises(ValueError, match="inputs live on devices 0 and 1"):
        GpuCrossMapNormGrad()(gvar(), gvar(device=1))
    out = GpuCrossMapNormGrad()(gvar((2, None, 4, 5)), gvar((None, 3, 4, None)))
    assert out.type.shape == (2, 3, 4, 5) and out.type.device == 0
    x = gvar((None, 3, None, 5), device=1)
    y = GpuCrossMapNorm()(x)
    assert y.type == x.type
    node = y.owner
    b = pt.lscalar()
    assert node.op._infer_shape(node, [(b, 3, 4, 5)]) == [(b, 3, 4, 5)]


def test_launchers_take_the_builders_keywords_and_check_them_first():
    """The launchers' parameters are cc2ops.cross_map_norm's, keyword-only,
    checked before any array is looked at (no device needed here)."""
    with pytest.raises(
        TypeError, match=r"GpuCrossMapNorm: unknown parameter\(s\) \['siz'\]"
    ):
        grn.cross_map_norm_forward(None, siz=3)
    with pytest.raises(TypeError, match="takes 1 positional argument"):
        grn.cross_map_norm_forward(None, 3)
    with pytest.raises(ValueError, match="GpuCrossMapNormGrad: .*alpha must be >= 0"):
        grn.cross_map_norm_grad(None, None, alpha=-1.0)
    assert grn._launch_params("Op", {"size": 3}) == (3, 1e-4, 0.75, 2.0, False)


def test_kernel_names():
    assert cross_map_norm_kernel_name("fwd", 5, 64, False, "float32", False) == (
        "cross_map_norm_fwd_n5_c64_f32"
    )
    assert cross_map_norm_kernel_name("grad", 3, 7, True, "float64", True) == (
        "cross_map_norm_grad_n3_blk_c7_f64_i64"
    )


def _chunked_column(x, gy, size, alpha, beta, k, chunk):
    """One column's forward and gradient in the order of the chunked kernels
    (``kernels/cross_map_norm.cu``, overlapping windows): the forward's halo
    indexing, the gradient's register rings, slot arithmetic and halo steps,
    in float64."""
    c_total = len(x)
    a, f = size // 2, (size - 1) // 2
    aos, coef = alpha / size, 2 * alpha * beta / size
    y, gx = np.full(c_total, np.nan), np.full(c_total, np.nan)
    for c0 in range(0, c_total, chunk):
        # forward: the chunk and its halo in registers, v[e] = x[c0 - a + e]
        v = [x[c0 - a + e] if 0 <= c0 - a + e < c_total else 0.0
             for e in range(chunk + size - 1)]  # fmt: skip
        for j in range(chunk):
            c = c0 + j
            if c < c_total:
                p = (k + aos * sum(t * t for t in v[j : j + size])) ** -beta
                y[c] = v[j + a] * p
        xr, gr, pr, qr = ([0.0] * size for _ in range(4))
        for e in range(size - 1):
            cc = c0 - f - a + e
            xr[e] = x[cc] if 0 <= cc < c_total else 0.0
        for s in range(chunk + size - 1):
            c = c0 - f + s
            r = c + f
            xr[(s + size - 1) % size] = x[r] if 0 <= r < c_total else 0.0
            if 0 <= c < c_total:
                d = k + aos * sum(v * v for v in xr)
                p = d**-beta
                gr[s % size], pr[s % size] = gy[c], p
                qr[s % size] = gy[c] * xr[(s + a) % size] * (p / d)
            else:
                qr[s % size] = 0.0
            jo = c - a
            if s >= size - 1 and jo < c_total:
                so = (s + size - a % size) % size
                gx[jo] = gr[so] * pr[so] - coef * xr[s % size] * sum(qr)
    return y, gx


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("channels,chunk", [(64, 16), (33, 16), (7, 3), (5, 16)])
def test_chunked_kernel_schedule_matches_the_references(size, channels, chunk):
    r = rng(size)
    x = 3 * r.standard_normal((1, channels, 1, 1))
    gy = r.standard_normal(x.shape)
    params = dict(size=size, alpha=0.3, beta=0.75, k=2.0)
    y, gx = _chunked_column(x.ravel(), gy.ravel(), **params, chunk=chunk)
    want_y = cross_map_norm_reference(x, **params).ravel()
    want_g = cross_map_norm_grad_reference(x, gy, **params).ravel()
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gx, want_g, rtol=1e-12, atol=1e-14)


def test_channel_chunks():
    assert grn.channel_chunk(64, False) == grn.CHUNK == 16
    assert grn.channel_chunk(24, False) == 24  # few channels: one thread each
    assert grn.channel_chunk(192, True) == 192  # blocked: whole columns
    name = grn.cross_map_norm_kernel_name("fwd", 5, 192, False, "float32", False, 16)
    assert name == "cross_map_norm_fwd_n5_c192_f32_ch16"


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------


def to_host(g):
    from cc2ops.cuda.runtime import array

    return array.to_host(g)


def run_case(b, c, h, w, params, dtype, seed=0):
    r = rng(seed)
    # alpha large enough that the window sums matter
    x = (3 * r.standard_normal((b, c, h, w))).astype(dtype)
    gy = r.standard_normal(x.shape).astype(dtype)
    label = f"b{b} c{c} {h}x{w} {params} {dtype}"
    y = to_host(grn.cross_map_norm_forward(to_gpu(x), **params))
    close(y, cross_map_norm_reference(x, **params), dtype, f"{label}: forward")
    gx = to_host(grn.cross_map_norm_grad(to_gpu(x), to_gpu(gy), **params))
    want = cross_map_norm_grad_reference(x, gy, **params)
    close(gx, want, dtype, f"{label}: gradient")


CHANNELS = [1, 2, 3, 5, 7, 16, 33, 64]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("size", [1, 2, 3, 5, 7])
def test_kernels_match_the_references(size, blocked, dtype, debug):
    params = dict(size=size, alpha=0.3, beta=0.75, k=2.0, blocked=blocked)
    for i, c in enumerate(CHANNELS):
        b, h, w = [(1, 5, 7), (3, 4, 3), (2, 1, 33)][i % 3]
        run_case(b, c, h, w, params, dtype, seed=i)


@pytest.mark.gpu
def test_batch_129_and_alexnet_parameters(debug):
    run_case(129, 5, 3, 4, PARAMS, "float32")
    run_case(2, 64, 11, 13, dict(PARAMS, beta=0.5, k=1.0, alpha=1e-3), "float32")
    run_case(3, 192, 9, 7, dict(PARAMS, alpha=0.3), "float32")  # 12 chunks


@pytest.mark.gpu
def test_strided_inputs(debug):
    x = rng(2).standard_normal((4, 9, 5, 6)).astype("float32")
    gy = rng(3).standard_normal((4, 9, 5, 6)).astype("float32")
    view = to_gpu(x)[:, 2:7]
    y = to_host(grn.cross_map_norm_forward(view, size=3, alpha=0.5))
    close(y, cross_map_norm_reference(x[:, 2:7], size=3, alpha=0.5), "float32", "fwd")
    g = to_host(grn.cross_map_norm_grad(view, to_gpu(gy)[:, 1:6], size=3, alpha=0.5))
    want = cross_map_norm_grad_reference(x[:, 2:7], gy[:, 1:6], size=3, alpha=0.5)
    close(g, want, "float32", "grad")


def compiled_types(fn):
    return {type(n.op) for n in fn.maker.fgraph.apply_nodes}


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bc01", "c01b"])
def test_compiled_graph_runs_on_the_gpu(layout, debug):
    x = (2 * rng(4).standard_normal((3, 7, 5, 4))).astype("float32")
    xin = x if layout == "bc01" else np.ascontiguousarray(x.transpose(1, 2, 3, 0))
    params = dict(size=3, alpha=0.5, beta=0.75, k=2.0, blocked=False)
    v = pt.tensor4("x", dtype="float32")
    hv = cuda.host_from_gpu(cuda.gpu_from_host(v, 0))
    y = cross_map_norm(hv, **params, layout=layout)
    g = pytensor.grad((y**2).sum(), v)
    fn = pytensor.function([v], [y, g], mode=cuda.mode())
    assert {GpuCrossMapNorm, GpuCrossMapNormGrad} <= compiled_types(fn)
    got_y, got_g = fn(xin)
    want = cross_map_norm_reference(x, **params)
    want_g = cross_map_norm_grad_reference(x, 2 * want, **params)
    if layout == "c01b":
        want, want_g = want.transpose(1, 2, 3, 0), want_g.transpose(1, 2, 3, 0)
    close(np.asarray(got_y), want, "float32", "graph forward")
    close(np.asarray(got_g), want_g, "float32", "graph gradient")


VG = dict(abs_tol=1e-6, rel_tol=1e-6, eps=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("size", [2, 5])
def test_verify_grad_through_gpu_ops(size, blocked):
    params = dict(size=size, alpha=0.7, beta=0.75, k=1.5, blocked=blocked)
    x = rng(5).standard_normal((2, 7, 3, 4))

    def build(v):
        return cuda.host_from_gpu(GpuCrossMapNorm(**params)(cuda.gpu_from_host(v, 0)))

    verify_grad(build, [x], rng=rng(0), mode=cuda.mode(), **VG)
    v = pt.dtensor4()
    fn = pytensor.function([v], pytensor.grad(build(v).sum(), v), mode=cuda.mode())
    assert GpuCrossMapNormGrad in compiled_types(fn)


@pytest.mark.gpu
def test_cross_map_norm_sanitize():
    """Small launches of each kernel kind (compute-sanitizer)."""
    for blocked in (False, True):
        run_case(2, 7, 3, 5, dict(PARAMS, alpha=0.5, blocked=blocked), "float32")
    run_case(1, 5, 2, 3, dict(PARAMS, size=2, alpha=0.5), "float64")
