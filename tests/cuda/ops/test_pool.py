"""GPU pooling ops: lifting, validation and shapes (CPU); values and gradients (GPU).

CPU tests build and rewrite graphs only. GPU tests (``gpu`` marker) compare
the kernels with :mod:`cc2ops.pool`'s numpy references over a sweep of
geometries (overlapping windows, stride > size, start > 0 and < 0, clipped
borders, batch 1/3/129, channels 1/3/5/64), with every new GPU array poisoned
with NaN (``CC2OPS_DEBUG=1``), and run ``verify_grad`` through the GPU ops in
``cc2ops.cuda.mode()``.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import close, rng, to_gpu
from pytensor.compile.aliasing import add_supervisor_to_fgraph
from pytensor.compile.io import SymbolicInput
from pytensor.gradient import verify_grad
from pytensor.graph.basic import Constant
from pytensor.graph.fg import FunctionGraph

import cc2ops.cuda as cuda
from cc2ops.cuda.ops import pool as gpool
from cc2ops.cuda.ops.pool import (
    GpuAvgPool,
    GpuAvgPoolGrad,
    GpuMaxPool,
    GpuMaxPoolGrad,
    GpuMaxPoolGradGrad,
    pool_kernel_name,
)
from cc2ops.cuda.type import CudaArrayType
from cc2ops.pool import (
    AvgPool,
    AvgPoolGrad,
    MaxPool,
    MaxPoolGrad,
    MaxPoolGradGrad,
    avg_pool2d,
    avg_pool_grad_reference,
    avg_pool_reference,
    max_pool2d,
    max_pool_grad_grad_reference,
    max_pool_grad_reference,
    max_pool_reference,
)
from cc2ops.shapes import pool_output_shape

HOST_OPS = (MaxPool, MaxPoolGrad, MaxPoolGradGrad, AvgPool, AvgPoolGrad)
GPU_OPS = (GpuMaxPool, GpuMaxPoolGrad, GpuMaxPoolGradGrad, GpuAvgPool, GpuAvgPoolGrad)


def gvar(shape=(None,) * 4, dtype="float32", device=0, name="x"):
    return CudaArrayType(dtype, shape, device)(name)


def lifted(outputs):
    """Rewrite ``outputs`` with the GPU mode's optimizer (no GPU needed)."""
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
# CPU: lifting
# --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["bc01", "c01b"])
def test_max_pool_and_its_gradients_lift(layout):
    x = gvar()
    h = cuda.host_from_gpu(x)
    if layout == "c01b":
        h = h.dimshuffle(1, 2, 3, 0)
    y = max_pool2d(h, 3, 2, layout=layout)
    cost = (y**2).sum()
    gx = pytensor.grad(cost, x)
    fg = lifted([cuda.gpu_from_host(y, 0), gx])
    types = op_types(fg)
    assert {GpuMaxPool, GpuMaxPoolGrad} <= types, types
    assert not types & set(HOST_OPS), types
    node = next(n for n in fg.apply_nodes if isinstance(n.op, GpuMaxPool))
    assert node.op.size == (3, 3) and node.op.stride == (2, 2)
    assert node.op.start == (0, 0)


def test_max_pool_second_derivative_lifts_grad_grad():
    x = gvar()
    y = max_pool2d(cuda.host_from_gpu(x), 2, 1)
    g = pytensor.grad((y**2).sum(), x)
    gg = pytensor.grad((g**2).sum(), x)
    types = op_types(lifted([gg]))
    assert {GpuMaxPool, GpuMaxPoolGrad, GpuMaxPoolGradGrad} <= types, types
    assert not types & set(HOST_OPS), types


def test_each_host_pool_op_lifts():
    x, y = gvar(name="x"), gvar(name="y")
    hx, hy = cuda.host_from_gpu(x), cuda.host_from_gpu(y)
    kw = dict(size=(2, 3), stride=(1, 2), start=(1, -1))
    hw = pt.lvector("hw")
    cases = [
        (MaxPool(**kw)(hx), GpuMaxPool),
        (MaxPoolGrad(**kw)(hx, hy, hy), GpuMaxPoolGrad),
        (MaxPoolGradGrad(**kw)(hx, hy, hx), GpuMaxPoolGradGrad),
        (AvgPool(**kw)(hx), GpuAvgPool),
        (AvgPoolGrad(**kw)(hy, hw), GpuAvgPoolGrad),
    ]
    for out, gpu_op in cases:
        fg = lifted([cuda.gpu_from_host(out, 0)])
        (node,) = [n for n in fg.apply_nodes if isinstance(n.op, gpu_op)]
        assert node.op._props() == out.owner.op._props(), gpu_op
        assert not op_types(fg) & set(HOST_OPS), gpu_op
        # the GPU result feeds the output directly: no round trip
        assert fg.outputs[0].owner is node


def test_avg_pool_gradient_lifts_and_keeps_image_hw_on_host():
    x = gvar(shape=(2, 3, 9, 8))
    y = avg_pool2d(cuda.host_from_gpu(x), 3, 2)
    g = pytensor.grad((y**2).sum(), x)
    fg = lifted([g])
    (node,) = [n for n in fg.apply_nodes if isinstance(n.op, GpuAvgPoolGrad)]
    assert not isinstance(node.inputs[1].type, CudaArrayType)
    assert node.outputs[0].type.shape == (2, 3, 9, 8)


def test_host_graph_without_gpu_neighbours_stays():
    h = pt.tensor4("h")
    fg = lifted([max_pool2d(h, 3, 2)])
    assert MaxPool in op_types(fg) and GpuMaxPool not in op_types(fg)


# --------------------------------------------------------------------------
# CPU: validation and shapes
# --------------------------------------------------------------------------


def test_make_node_errors():
    with pytest.raises(TypeError, match="GpuMaxPool: images must be a GPU variable"):
        GpuMaxPool(size=2)(pt.tensor4())
    with pytest.raises(TypeError, match=r"GpuMaxPool: images must have 4 dims"):
        GpuMaxPool(size=2)(gvar(shape=(None,) * 3))
    with pytest.raises(TypeError, match="GpuAvgPool: images must be float32 or"):
        GpuAvgPool(size=2)(gvar(dtype="int32"))
    with pytest.raises(ValueError, match=r"GpuMaxPool: stride must be >= 1"):
        GpuMaxPool(size=2, stride=0)
    with pytest.raises(ValueError, match=r"GpuAvgPool: start \(-2\) must be > -size"):
        GpuAvgPool(size=2, start=-2)
    with pytest.raises(ValueError, match=r"GpuMaxPool: window rows \(5\) larger"):
        GpuMaxPool(size=5)(gvar(shape=(1, 1, 4, 9)))
    x, y = gvar((2, 3, 9, 9)), gvar((2, 3, 5, 5), name="y")
    with pytest.raises(
        ValueError, match=r"GpuMaxPoolGrad: pooled output shape \(2, 3, 5, 5\)"
    ):
        GpuMaxPoolGrad(size=3, stride=2)(x, y, y)
    with pytest.raises(TypeError, match="GpuMaxPoolGrad: inputs must share one"):
        GpuMaxPoolGrad(size=3, stride=2)(gvar(), gvar(dtype="float64"), gvar())
    with pytest.raises(ValueError, match="inputs live on devices 0 and 1"):
        GpuMaxPoolGrad(size=3)(gvar(), gvar(device=1), gvar())
    with pytest.raises(ValueError, match="GpuMaxPoolGradGrad: input gradient shape"):
        GpuMaxPoolGradGrad(size=3, stride=2)(x, gvar(), gvar((2, 3, 9, 8)))
    with pytest.raises(ValueError, match="GpuAvgPoolGrad: image_hw must have 2"):
        GpuAvgPoolGrad(size=2)(gvar(), pt.as_tensor_variable(np.array([1, 2, 3])))
    with pytest.raises(TypeError, match="GpuAvgPoolGrad: image_hw must have an int"):
        GpuAvgPoolGrad(size=2)(gvar(), pt.dvector())


def test_static_shapes_and_props_match_the_host_ops():
    for kw, hw in [
        (dict(size=3, stride=2), (54, 54)),
        (dict(size=2, stride=3), (8, 11)),
        (dict(size=(3, 2), stride=(2, 1), start=(1, -1)), (10, 9)),
    ]:
        x = gvar((4, 5, *hw))
        want = (4, 5, *pool_output_shape(hw, *_norm(kw)))
        for gop, hop in [(GpuMaxPool, MaxPool), (GpuAvgPool, AvgPool)]:
            out = gop(**kw)(x)
            assert out.type.shape == want and out.type.device == 0
            assert gop(**kw)._props() == hop(**kw)._props()
            assert gop.__props__ == hop.__props__
        y = gvar(want, name="y")
        assert GpuMaxPoolGrad(**kw)(x, y, y).type.shape == x.type.shape
        assert GpuMaxPoolGradGrad(**kw)(x, y, x).type.shape == want
        g = GpuAvgPoolGrad(**kw)(y, pt.as_tensor_variable(np.array(hw)))
        assert g.type.shape == x.type.shape


def _norm(kw):
    size = (kw["size"],) * 2 if isinstance(kw["size"], int) else kw["size"]
    stride = kw.get("stride", size)
    stride = (stride,) * 2 if isinstance(stride, int) else stride
    start = kw.get("start", 0)
    start = (start,) * 2 if isinstance(start, int) else start
    return size, stride, start


def test_infer_shape_is_symbolic():
    b, c, h, w = (pt.lscalar(n) for n in "bchw")
    x = gvar()
    kw = dict(size=(3, 2), stride=(2, 3), start=(1, 0))
    for op in (GpuMaxPool(**kw), GpuAvgPool(**kw)):
        node = op(x).owner
        (shape,) = op._infer_shape(node, [(b, c, h, w)])
        fn = pytensor.function([b, c, h, w], list(shape))
        for hw in [(7, 9), (10, 4), (5, 5)]:
            got = tuple(int(v) for v in fn(2, 3, *hw))
            assert got == (2, 3, *pool_output_shape(hw, (3, 2), (2, 3), (1, 0)))
    y = gvar(name="y")
    node = GpuMaxPoolGradGrad(**kw)(x, y, x).owner
    (shape,) = node.op._infer_shape(node, [(b, c, h, w)] * 3)
    fn = pytensor.function([b, c, h, w], list(shape))
    assert tuple(int(v) for v in fn(1, 1, 7, 9)) == (
        1, 1, *pool_output_shape((7, 9), (3, 2), (2, 3), (1, 0))
    )  # fmt: skip
    hw = pt.lvector("hw")
    node = GpuAvgPoolGrad(**kw)(y, hw).owner
    (shape,) = node.op._infer_shape(node, [(b, c, h, w), (2,)])
    fn = pytensor.function([b, c, hw], list(shape))
    assert tuple(int(v) for v in fn(2, 3, np.array([7, 9]))) == (2, 3, 7, 9)


def test_kernel_names_carry_the_specialisation():
    assert pool_kernel_name("max_fwd", 3, 3, 2, 2, 0, 0, "float32", False) == (
        "max_pool_fwd_s3_st2_f32"
    )
    assert pool_kernel_name("avg_grad", 2, 3, 1, 2, 1, -1, "float64", True) == (
        "avg_pool_grad_s2x3_st1x2_o1xm1_f64_i64"
    )


def test_import_touches_no_cuda():
    # the module imported above without pycuda; building graphs needs none
    assert gpool.GpuMaxPool(size=2)(gvar()).owner is not None


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------

# (B, C, H, W, size, stride, start)
SWEEP = [
    (1, 1, 7, 7, 3, 2, 0),  # overlapping, ceil border
    (3, 3, 9, 8, 3, 2, 0),
    (3, 5, 8, 11, 2, 3, 0),  # stride > size
    (1, 3, 10, 9, 3, 2, 1),  # start > 0
    (3, 5, 9, 10, (2, 3), (2, 1), (-1, 1)),  # start < 0, rectangular
    (129, 3, 6, 7, 3, 2, 0),  # batch 129
    (3, 64, 13, 13, 3, 2, 0),  # channels 64
    (2, 5, 5, 5, 5, 1, 0),  # window = image
    (1, 1, 1, 1, 1, 1, 0),
    (2, 3, 12, 12, 4, 4, 0),  # non-overlapping
]


def to_host(g):
    from cc2ops.cuda.runtime import array

    return array.to_host(g)


def run_family(b, c, h, w, size, stride, start, dtype, seed=0, ties=False):
    r = rng(seed)
    if ties:
        x = r.integers(0, 3, (b, c, h, w)).astype(dtype)
    else:
        x = r.standard_normal((b, c, h, w)).astype(dtype)
    label = f"b{b} c{c} {h}x{w} s{size} st{stride} o{start} {dtype}"
    args = (size, stride, start)
    y = max_pool_reference(x, *args)
    got_y = to_host(gpool.max_pool_forward(to_gpu(x), *args))
    np.testing.assert_array_equal(got_y, y, err_msg=f"{label}: max forward")
    gy = r.standard_normal(y.shape).astype(dtype)
    gx = to_host(gpool.max_pool_grad(to_gpu(x), to_gpu(y), to_gpu(gy), *args))
    close(gx, max_pool_grad_reference(x, y, gy, *args), dtype, f"{label}: max grad")
    ggx = r.standard_normal(x.shape).astype(dtype)
    ggy = to_host(gpool.max_pool_grad_grad(to_gpu(x), to_gpu(y), to_gpu(ggx), *args))
    want = max_pool_grad_grad_reference(x, y, ggx, *args)
    np.testing.assert_array_equal(ggy, want, err_msg=f"{label}: max grad grad")
    a = to_host(gpool.avg_pool_forward(to_gpu(x), *args))
    close(a, avg_pool_reference(x, *args), dtype, f"{label}: avg forward")
    ga = to_host(gpool.avg_pool_grad(to_gpu(gy), (h, w), *args))
    close(ga, avg_pool_grad_reference(gy, (h, w), *args), dtype, f"{label}: avg grad")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", SWEEP, ids=[str(c) for c in SWEEP])
def test_kernels_match_the_references(case, dtype, debug):
    run_family(*case, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("case", SWEEP[:5], ids=[str(c) for c in SWEEP[:5]])
def test_ties_go_to_the_first_maximum(case, debug):
    run_family(*case, "float32", seed=1, ties=True)


@pytest.fixture
def per_pixel(monkeypatch):
    """No plane fits in shared memory: the per-element kernels run."""
    monkeypatch.setattr(gpool, "_PLANE_SMEM", 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", SWEEP, ids=[str(c) for c in SWEEP])
def test_per_element_kernels_match_the_references(case, dtype, debug, per_pixel):
    run_family(*case, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [(2, 64, 54, 54, 3, 2, 0), (3, 24, 27, 27, 3, 2, 0), (5, 21, 13, 13, 3, 2, 0),
     (2, 3, 9, 10, (2, 3), (2, 1), (-1, 1))],
    ids=["54^2", "27^2", "13^2 x21 planes", "rect start<0"],
)  # fmt: skip
def test_plane_and_per_element_kernels_agree_bit_for_bit(case, debug, monkeypatch):
    b, c, h, w, size, stride, start = case
    assert gpool.plane_plan("max_grad", (b, c, h, w), (b, c, 1, 1), 4) is not None
    r = rng(4)
    x = r.integers(0, 4, (b, c, h, w)).astype("float32")  # ties
    x[0, 0, 0, 0] = np.nan
    args = (size, stride, start)

    def passes():
        y = gpool.max_pool_forward(to_gpu(x), *args)
        gy = to_gpu(rng(5).standard_normal(tuple(y.shape)).astype("float32"))
        gx = gpool.max_pool_grad(to_gpu(x), y, gy, *args)
        a = gpool.avg_pool_forward(to_gpu(x), *args)
        return [to_host(v) for v in (y, gx, a)]

    plane = passes()
    monkeypatch.setattr(gpool, "_PLANE_SMEM", 0)
    element = passes()
    for got, want, what in zip(plane, element, ("max", "max grad", "avg"), strict=True):
        np.testing.assert_array_equal(got, want, err_msg=f"{case} {what}")


@pytest.mark.gpu
@pytest.mark.parametrize("grid", [1, 3, None], ids=["grid1", "grid3", "full grid"])
@pytest.mark.parametrize(
    "case",
    [(3, 7, 54, 54, 3, 2, 0, "float32"),  # two planes per group, 11 groups
     (5, 9, 27, 27, 3, 2, 0, "float32"),  # 8 planes per group, a partial last one
     (2, 5, 45, 45, 3, 2, 0, "float32"),  # 3 planes of 2025: element-sized copies
     (3, 50, 7, 9, (2, 3), (3, 1), (1, -1), "float64"),  # 48 planes per group
     (1, 3, 54, 54, 3, 2, 0, "float64")],  # one plane fills half of 48 KB
    ids=["54^2", "27^2 partial", "45^2 unaligned", "7x9 f64", "54^2 f64"],
)  # fmt: skip
def test_persistent_plane_forward_loops_over_groups(case, grid, debug, monkeypatch):
    """The forward plane kernels' blocks take groups g, g + grid, ...: each
    block double-buffers across many groups when the grid is small."""
    b, c, h, w, size, stride, start, dtype = case
    monkeypatch.setattr(gpool, "_PLANE_GRID", grid)
    args = (size, stride, start)
    pooled = (b, c, *max_pool_reference(np.zeros((1, 1, h, w)), *args).shape[2:])
    plan = gpool.plane_plan("max_fwd", (b, c, h, w), pooled, np.dtype(dtype).itemsize)
    assert plan is not None, case
    x = rng(7).standard_normal((b, c, h, w)).astype(dtype)
    got = to_host(gpool.max_pool_forward(to_gpu(x), *args))
    np.testing.assert_array_equal(got, max_pool_reference(x, *args), err_msg=str(case))
    got = to_host(gpool.avg_pool_forward(to_gpu(x), *args))
    close(got, avg_pool_reference(x, *args), dtype, f"{case} avg")


@pytest.mark.gpu
def test_special_values(debug):
    x = np.full((1, 2, 5, 5), -np.inf, dtype="float32")
    x[0, 1, 2, 2] = np.nan
    y = to_host(gpool.max_pool_forward(to_gpu(x), 3, 2))
    np.testing.assert_array_equal(y, max_pool_reference(x, 3, 2))
    gy = np.ones_like(y)
    gx = to_host(gpool.max_pool_grad(to_gpu(x), to_gpu(y), to_gpu(gy), 3, 2))
    np.testing.assert_array_equal(gx, max_pool_grad_reference(x, y, gy, 3, 2))


@pytest.mark.gpu
def test_strided_input_views(debug):
    x = rng(3).standard_normal((5, 4, 9, 9)).astype("float32")
    gx = to_gpu(x)[:, 1:3]
    y = to_host(gpool.max_pool_forward(gx, 3, 2))
    np.testing.assert_array_equal(y, max_pool_reference(x[:, 1:3], 3, 2))


@pytest.mark.gpu
def test_runtime_shape_errors():
    x = to_gpu(np.zeros((1, 1, 9, 9), "float32"))
    y = to_gpu(np.zeros((1, 1, 3, 3), "float32"))
    with pytest.raises(ValueError, match="GpuMaxPoolGrad: pooled output shape"):
        gpool.max_pool_grad(x, y, y, 3, 2)


def compiled_gpu_ops(fn):
    return {type(n.op) for n in fn.maker.fgraph.apply_nodes}


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bc01", "c01b"])
def test_compiled_graph_runs_on_the_gpu(layout, debug):
    x = rng(4).standard_normal((3, 5, 9, 8)).astype("float32")
    xin = x if layout == "bc01" else np.ascontiguousarray(x.transpose(1, 2, 3, 0))
    # lifting starts from GPU data: here a GPU shared variable (a host input
    # next to nothing on the GPU stays on the host, by the lifting rule)
    v = cuda.shared(xin, device=0, name="x")
    y = max_pool2d(v, 3, 2, layout=layout) + avg_pool2d(v, 3, 2, layout=layout)
    g = pytensor.grad((y**2).sum(), v)
    fn = pytensor.function([], [y, g], mode=cuda.mode())
    types = compiled_gpu_ops(fn)
    assert {GpuMaxPool, GpuMaxPoolGrad, GpuAvgPool, GpuAvgPoolGrad} <= types
    assert not types & set(HOST_OPS)
    got_y, got_g = fn()
    ym = max_pool_reference(x, 3, 2)
    want = ym + avg_pool_reference(x, 3, 2)
    gy = 2 * want
    want_g = max_pool_grad_reference(x, ym, gy, 3, 2) + avg_pool_grad_reference(
        gy, (9, 8), 3, 2
    )
    if layout == "c01b":
        want, want_g = want.transpose(1, 2, 3, 0), want_g.transpose(1, 2, 3, 0)
    close(np.asarray(got_y), want, "float32", "graph forward")
    close(np.asarray(got_g), want_g, "float32", "graph gradient")


def gpu_graph(op):
    return lambda v: cuda.host_from_gpu(op(cuda.gpu_from_host(v, 0)))


VG = dict(abs_tol=1e-6, rel_tol=1e-6, eps=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kw", [dict(size=3, stride=2), dict(size=(2, 3), stride=(3, 1), start=(1, -1))]
)
def test_verify_grad_through_gpu_ops(kw):
    x = rng(5).standard_normal((2, 3, 7, 8))
    mode = cuda.mode()
    verify_grad(gpu_graph(GpuMaxPool(**kw)), [x], rng=rng(0), mode=mode, **VG)
    verify_grad(gpu_graph(GpuAvgPool(**kw)), [x], rng=rng(0), mode=mode, **VG)
    # second order: the pullback of GpuMaxPoolGrad wrt gy is GpuMaxPoolGradGrad
    y = max_pool_reference(x, **kw)
    cx = cuda.gpu_from_host(pt.constant(x), 0)
    cy = cuda.gpu_from_host(pt.constant(y), 0)

    def grad_of_gy(gy):
        return cuda.host_from_gpu(
            GpuMaxPoolGrad(**kw)(cx, cy, cuda.gpu_from_host(gy, 0))
        )

    gy = rng(6).standard_normal(y.shape)
    verify_grad(grad_of_gy, [gy], rng=rng(0), mode=mode, **VG)
    v = pt.dtensor4()
    g = pytensor.grad((gpu_graph(GpuMaxPool(**kw))(v) ** 2).sum(), v)
    fn = pytensor.function([v], pytensor.grad((g**2).sum(), v), mode=mode)
    assert GpuMaxPoolGradGrad in compiled_gpu_ops(fn)


@pytest.mark.gpu
def test_pool_sanitize():
    """Small, representative launches of every kernel (compute-sanitizer)."""
    run_family(3, 5, 9, 10, (2, 3), (2, 1), (-1, 1), "float32")
    run_family(2, 3, 7, 7, 3, 2, 0, "float64", ties=True)
    run_family(2, 64, 54, 54, 3, 2, 0, "float32")  # one plane per block


@pytest.mark.parametrize(
    "image, pooled, itemsize, want",
    [((128, 64, 54, 54), (128, 64, 26, 26), 4, (2, 2 * 23328)),
     ((128, 192, 27, 27), (128, 192, 13, 13), 4, (8, 2 * 23328)),  # a multiple of 4
     ((2, 5, 45, 45), (2, 5, 22, 22), 4, (3, 2 * 24304)),  # 3 < 4: unaligned groups
     ((1, 3, 54, 54), (1, 3, 26, 26), 8, (1, 2 * 23328)),  # 2 planes exceed 48 KB
     ((1, 1, 80, 80), (1, 1, 39, 39), 4, None)],  # two buffers exceed 48 KB
)  # fmt: skip
def test_forward_plane_plan_double_buffers(image, pooled, itemsize, want):
    """(planes per block, shared bytes) of the forward plane kernels: two
    16-byte-padded buffers of whole planes, within the 48 KB cap."""
    for kind in ("max_fwd", "avg_fwd"):
        assert gpool.plane_plan(kind, image, pooled, itemsize) == want


def test_forward_plane_kernel_names_carry_the_geometry():
    c = gpool._consts("max_fwd_plane", (3, 3), (2, 2), (0, 0), "float32", False,
                      (54, 54, 26, 26, 1, 16))  # fmt: skip
    assert c["name"] == "max_pool_fwd_plane_s3_st2_f32_54x54_p1_v16"
    assert (c["H"], c["W"], c["Ho"], c["Wo"], c["ppb"], c["vec"]) == (
        54,
        54,
        26,
        26,
        1,
        16,
    )
