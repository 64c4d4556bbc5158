"""Structural GPU ops: lifting and types (CPU); views and kernels vs numpy (GPU).

CPU tests rewrite host graphs around GPU variables with the GPU mode's
optimizer and check which ops they become (no CUDA is touched), the no-copy
reshape rule against numpy, and the kernel geometry planners. GPU tests
(``gpu`` marker) compile in ``cc2ops.cuda.mode()``, poison new arrays with
NaN (``CC2OPS_DEBUG=1``) and compare to numpy, including non-contiguous
inputs, views (no copy) and the tiled transpose kernel.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import rng
from pytensor.compile.aliasing import add_supervisor_to_fgraph
from pytensor.compile.io import SymbolicInput
from pytensor.gradient import verify_grad
from pytensor.graph.basic import Constant
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.type import HasShape
from pytensor.raise_op import Assert
from pytensor.tensor.basic import Alloc, AllocEmpty, Join, Split
from pytensor.tensor.elemwise import DimShuffle
from pytensor.tensor.shape import Reshape, Shape, Shape_i, SpecifyShape
from pytensor.tensor.subtensor import IncSubtensor, Subtensor
from pytensor.tensor.type import integer_dtypes

import cc2ops.cuda as cuda
from cc2ops.cuda.ops.tensor import basic
from cc2ops.cuda.ops.tensor.basic import (
    GpuAlloc,
    GpuAllocEmpty,
    GpuCheckAndRaise,
    GpuDimShuffle,
    GpuIncSubtensor,
    GpuJoin,
    GpuReshape,
    GpuShape,
    GpuShape_i,
    GpuSpecifyShape,
    GpuSplit,
    GpuSubtensor,
    reshape_strides,
)
from cc2ops.cuda.transfer import GpuFromHost, HostFromGpu
from cc2ops.cuda.type import CudaArrayConstant, CudaArrayType

HOST_STRUCTURAL = (
    DimShuffle, Reshape, SpecifyShape, Subtensor, IncSubtensor, Alloc, AllocEmpty,
    Join, Split, Shape, Shape_i,
)  # fmt: skip


def gvar(shape=(None, None), dtype="float32", device=0, name="x"):
    return CudaArrayType(dtype, shape, device)(name)


def lifted(outputs, inplace=False):
    """Rewrite ``outputs`` with the GPU mode's optimizer (no GPU needed)."""
    outs = outputs if isinstance(outputs, list) else [outputs]
    fg = FunctionGraph(outputs=outs, clone=False)
    add_supervisor_to_fgraph(
        fg, [SymbolicInput(v) for v in fg.inputs if not isinstance(v, Constant)]
    )
    mode = cuda.mode() if inplace else cuda.mode().excluding("inplace")
    mode.optimizer.rewrite(fg)
    return fg


def op_types(fg):
    return {type(n.op) for n in fg.apply_nodes}


def host_structural(fg):
    return [n for n in fg.apply_nodes if isinstance(n.op, HOST_STRUCTURAL)]


# --------------------------------------------------------------------------
# CPU: lifting
# --------------------------------------------------------------------------


def test_dimshuffle_transpose_and_expand_dims_lift():
    x = gvar((3, 4))
    h = cuda.host_from_gpu(x)
    out = cuda.gpu_from_host(h.T.dimshuffle(0, "x", 1), 0)
    fg = lifted([out])
    assert op_types(fg) == {GpuDimShuffle}, [str(n.op) for n in fg.toposort()]
    (y,) = fg.outputs
    assert y.type == CudaArrayType("float32", (4, 1, 3), 0)


def test_reshape_flatten_and_specify_shape_lift():
    x = gvar((None, 3, 4, 5))
    h = cuda.host_from_gpu(x)
    y = pt.specify_shape(h.flatten(2), (None, 60)).reshape((-1, 3, 20))
    fg = lifted([cuda.gpu_from_host(y, 0)])
    types = op_types(fg)
    assert GpuReshape in types and not host_structural(fg), types
    assert fg.outputs[0].type.shape == (None, 3, 20)


def test_specify_shape_keeps_the_static_shape():
    x = gvar((None, None))
    y = pt.specify_shape(cuda.host_from_gpu(x), (2, None))
    fg = lifted([cuda.gpu_from_host(y, 0)])
    (node,) = [n for n in fg.apply_nodes if isinstance(n.op, GpuSpecifyShape)]
    assert node.outputs[0].type.shape == (2, None)


def test_subtensor_and_inc_subtensor_lift():
    x = gvar((6, 5))
    y = gvar((None,), name="y")
    i = pt.lscalar("i")
    h = cuda.host_from_gpu(x)
    v = h[1:5:2, i]
    w = pt.set_subtensor(h[2, 1:], cuda.host_from_gpu(y))
    u = pt.inc_subtensor(h[:, 0], 1.0)
    fg = lifted([cuda.gpu_from_host(t, 0) for t in (v, w, u)])
    types = op_types(fg)
    assert {GpuSubtensor, GpuIncSubtensor} <= types, types
    assert not host_structural(fg), [str(n.op) for n in host_structural(fg)]
    sets = [n.op for n in fg.apply_nodes if isinstance(n.op, GpuIncSubtensor)]
    assert {op.set_instead_of_inc for op in sets} == {True, False}
    assert not any(op.inplace for op in sets)


def test_inc_subtensor_becomes_inplace_on_an_intermediate():
    x = gvar((6, 5))
    h = cuda.host_from_gpu(x) * 2  # an intermediate: may be overwritten
    out = pt.inc_subtensor(h[:, 0], 1.0)
    fg = lifted([cuda.gpu_from_host(out, 0)], inplace=True)
    (op,) = [n.op for n in fg.apply_nodes if isinstance(n.op, GpuIncSubtensor)]
    assert op.inplace and op.destroy_map == {0: [0]}


def test_inc_subtensor_never_destroys_a_function_input():
    x = gvar((6, 5))
    out = pt.set_subtensor(cuda.host_from_gpu(x)[:, 0], 1.0)
    fg = lifted([cuda.gpu_from_host(out, 0)], inplace=True)
    (op,) = [n.op for n in fg.apply_nodes if isinstance(n.op, GpuIncSubtensor)]
    assert not op.inplace


def test_alloc_zeros_and_alloc_empty_lift():
    x = gvar((None, 4))
    h = cuda.host_from_gpu(x)
    n = h.shape[0]
    z = pt.zeros((n, 4), dtype="float32") + h
    a = pt.alloc(pt.as_tensor_variable(np.float32(3)), n, 4)
    e = AllocEmpty("float32")(n, 4)
    fg = lifted([cuda.gpu_from_host(t, 0) for t in (z, a, e)])
    types = op_types(fg)
    assert {GpuAlloc, GpuAllocEmpty} <= types, types
    assert not host_structural(fg), [str(n.op) for n in host_structural(fg)]
    assert Shape_i not in types and Shape not in types
    # the fill value stays a constant (uploaded once), not a per-call transfer
    allocs = [n for n in fg.apply_nodes if isinstance(n.op, GpuAlloc)]
    assert all(isinstance(n.inputs[0], CudaArrayConstant) for n in allocs)


def test_join_and_split_lift():
    a, b = gvar((2, None), name="a"), gvar((3, None), name="b")
    j = pt.concatenate([cuda.host_from_gpu(a), cuda.host_from_gpu(b)], axis=0)
    parts = pt.split(j, [1, 4], n_splits=2, axis=0)
    fg = lifted(
        [cuda.gpu_from_host(j * 2, 0), *[cuda.gpu_from_host(p, 0) for p in parts]]
    )
    types = op_types(fg)
    assert GpuJoin in types, types
    assert not host_structural(fg), [str(n.op) for n in host_structural(fg)]
    (jn,) = [n for n in fg.apply_nodes if isinstance(n.op, GpuJoin)]
    assert jn.op.axis == 0 and jn.outputs[0].type.shape[0] == 5


def test_split_lifts_to_views():
    x = gvar((5, 3))
    parts = pt.split(cuda.host_from_gpu(x), [2, 3], n_splits=2, axis=0)
    fg = lifted([cuda.gpu_from_host(p, 0) for p in parts])
    (node,) = [n for n in fg.apply_nodes if isinstance(n.op, GpuSplit)]
    assert node.op.view_map == {0: [0], 1: [0]}
    assert node.op.axis == 0


def test_shape_of_a_gpu_value_does_not_pull_it_to_the_host():
    x = gvar((None, 3))
    h = cuda.host_from_gpu(x)
    s = h.shape
    fg = lifted([s, h.shape[0] * 2])
    types = op_types(fg)
    assert HostFromGpu not in types, [str(n.op) for n in fg.toposort()]
    assert types & {GpuShape, GpuShape_i}, types


def test_assert_on_gpu_values_lifts():
    x = gvar((None,))
    h = cuda.host_from_gpu(x)
    y = Assert("positive size")(h, h.shape[0] > 0)
    fg = lifted([cuda.gpu_from_host(y * 2, 0)])
    types = op_types(fg)
    assert GpuCheckAndRaise in types and HostFromGpu not in types, types
    (node,) = [n for n in fg.apply_nodes if isinstance(n.op, GpuCheckAndRaise)]
    assert node.op.msg == "positive size" and node.op.view_map == {0: [0]}


def test_gpu_from_host_of_a_constant_becomes_a_gpu_constant():
    c = pt.constant(np.arange(4, dtype="float32"))
    fg = lifted([cuda.gpu_from_host(c, 0)])
    assert GpuFromHost not in op_types(fg)
    assert isinstance(fg.outputs[0], CudaArrayConstant)


def test_gradients_of_structural_ops_stay_on_the_gpu():
    x = gvar((4, 6))
    h = cuda.host_from_gpu(x)
    y = pt.concatenate([h.T[1:3], h.reshape((6, 4))[:2]], axis=0)
    cost = (y**2).sum()
    g = pytensor.grad(cost, x)
    fg = lifted([g])
    assert not host_structural(fg), [str(n.op) for n in host_structural(fg)]
    assert g.type == x.type


def test_make_node_errors():
    x = gvar((3, 4))
    with pytest.raises(TypeError, match="GpuDimShuffle: x must have input_ndim=3"):
        GpuDimShuffle(input_ndim=3, new_order=(0, 1, 2))(x)
    with pytest.raises(TypeError, match="GpuReshape: x must be a GPU variable"):
        GpuReshape(2)(pt.matrix(), [2, 2])
    with pytest.raises(TypeError, match="GpuReshape: shape must be an integer vector"):
        GpuReshape(2)(x, pt.dvector())
    with pytest.raises(TypeError, match="GpuIncSubtensor: x and y must share a dtype"):
        GpuIncSubtensor((0,))(x, gvar((4,), dtype="float64"), pt.lscalar())
    with pytest.raises(ValueError, match="GpuJoin: axis 2 is out of range for 2 dims"):
        GpuJoin(2)(x, x)
    with pytest.raises(TypeError, match="GpuJoin: inputs must share one dtype"):
        GpuJoin(0)(x, gvar((3, 4), dtype="float64"))
    with pytest.raises(ValueError, match="GpuJoin: inputs live on devices 0 and 1"):
        GpuJoin(0)(x, gvar((3, 4), device=1))
    with pytest.raises(ValueError, match="GpuShape_i: axis 2 is out of range"):
        GpuShape_i(2)(x)


def test_infer_shape_of_gpu_structural_ops():
    x = gvar((None, None))
    # PyTensor >= 3.1's ShapeFeature only infers shapes of HasShape types
    assert isinstance(x.type, HasShape)
    fg = lifted(
        [
            GpuJoin(1)(x, x).shape,
            GpuReshape(1)(x, pt.as_tensor([-1])).shape,
            GpuDimShuffle(input_ndim=2, new_order=(1, "x", 0))(x).shape,
        ]
    )
    types = op_types(fg)
    assert not types & {GpuJoin, GpuReshape, GpuDimShuffle}, types


# --------------------------------------------------------------------------
# CPU: run-time geometry (no GPU needed)
# --------------------------------------------------------------------------


RESHAPES = [
    ((4, 6), lambda a: a, (24,)),
    ((4, 6), lambda a: a, (2, 2, 3, 2)),
    ((4, 6), lambda a: a.T, (24,)),
    ((4, 6), lambda a: a.T, (3, 2, 4)),
    ((5, 6, 7), lambda a: a[:, 1:4], (5, 21)),
    ((5, 6, 7), lambda a: a[:, 1:4], (15, 7)),
    ((5, 6, 7), lambda a: a[::2], (3, 42)),
    ((5, 6, 7), lambda a: a[:, :, ::2], (30, 4)),
    ((1, 6, 1, 4), lambda a: a, (6, 4, 1)),
    ((3, 1, 4), lambda a: a.transpose(2, 1, 0), (4, 3)),
    ((0, 3), lambda a: a, (3, 0)),
]


@pytest.mark.parametrize("case", range(len(RESHAPES)))
def test_reshape_strides_agree_with_numpy(case):
    shape, view, new = RESHAPES[case]
    base = np.arange(int(np.prod(shape)), dtype="float32").reshape(shape)
    a = view(base)
    want = a.reshape(new)
    strides = reshape_strides(a.shape, a.strides, new, a.itemsize)
    if np.shares_memory(want, base) and want.size:
        assert strides is not None, (a.shape, a.strides, new)
        got = np.lib.stride_tricks.as_strided(a, shape=new, strides=strides)
        np.testing.assert_array_equal(got, want)
    elif want.size:
        assert strides is None, (a.shape, a.strides, new, strides)


class FakeArray:
    """Shape, strides, dtype and a device address: what the planners read."""

    def __init__(self, a: np.ndarray, base: int = 1 << 20):
        self.shape, self.strides, self.dtype = a.shape, a.strides, a.dtype
        self.gpudata = base


def test_transpose_plan_picks_the_unit_stride_axis():
    a = np.zeros((7, 33, 65), "float32").transpose(0, 2, 1)  # (7, 65, 33)
    plan = basic._transpose_plan(FakeArray(a))
    assert plan is not None
    assert plan["nl"] == 33 and plan["in_sl"] == 65 and plan["nj"] == 65
    assert plan["out_sj"] == 33 and plan["batch"] == [(7, 33 * 65, 65 * 33)]
    # rows already contiguous (a column slice): the plain copy kernel is used
    assert basic._transpose_plan(FakeArray(np.zeros((4, 9))[:, 2:5])) is None
    # no unit-stride axis at all
    assert basic._transpose_plan(FakeArray(np.zeros((6, 6))[::2, ::2].T)) is None


def test_kernel_names_carry_the_specialisation():
    names = {c["name"] for c in basic._assign_variants()}
    assert "strided_set_f32_d8" in names and "strided_inc_f64_d8" in names
    assert {c["name"] for c in basic._transpose_variants()} == {
        f"transpose_tiled_u{u}_b6" for u in (1, 2, 4, 8)
    }


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------


def gpu_inputs(*arrays):
    """GPU-typed input variables like ``arrays`` (unknown extents)."""
    return [
        gvar((None,) * a.ndim, dtype=str(a.dtype), name=f"in{k}")
        for k, a in enumerate(arrays)
    ]


def gpu_fn(build, *arrays):
    """Compile ``build(*host views of GPU inputs)`` in the GPU mode; run it.

    The inputs are GPU-typed and fed GPUArrays: host inputs wrapped in
    ``host_from_gpu(gpu_from_host(v))`` are cancelled back to ``v``
    (``local_cancel_host_gpu_host``) and would leave the graph on the host.
    """
    from cc2ops.cuda.runtime import array

    syms = gpu_inputs(*arrays)
    outs = build(*[cuda.host_from_gpu(s) for s in syms])
    outs = outs if isinstance(outs, list) else [outs]
    fn = pytensor.function(syms, outs, mode=cuda.mode())
    return fn, fn(*[array.to_gpu(a, 0) for a in arrays])


_SHAPE_OPS = (Shape, Shape_i, GpuShape, GpuShape_i)


def _is_shape_value(v, memo):
    """Whether ``v`` is a host integer (vector) computed from shapes only.

    Constants, and outputs of shape ops, are; any other value is if it is an
    integer scalar or vector whose every input is. Graph inputs and values
    derived from array data (a ``host_from_gpu``, a float tensor) are not.
    """
    key = id(v)
    if key in memo:
        return memo[key]
    t = v.type
    ints = getattr(t, "dtype", "") in integer_dtypes and getattr(t, "ndim", 9) <= 1
    if isinstance(v, Constant):
        ok = ints or getattr(t, "ndim", 0) == 0
    elif not ints or v.owner is None:
        ok = False
    elif isinstance(v.owner.op, _SHAPE_OPS):
        ok = True
    else:
        memo[key] = False  # cycles cannot occur; this only guards recursion
        ok = all(_is_shape_value(i, memo) for i in v.owner.inputs)
    memo[key] = ok
    return ok


def host_data_nodes(fgraph, allowed=()):
    """Host structural nodes of ``fgraph`` that move array data.

    Integer shape arithmetic on the host (``Join`` / ``Subtensor`` /
    ``ExpandDims`` of shape vectors, as ``reshape`` and ``flatten`` build)
    is allowed; a host ``Shape_i`` of a ``host_from_gpu`` output is not, since
    it needs the array on the host.
    """
    memo = {}
    return [
        n
        for n in fgraph.apply_nodes
        if isinstance(n.op, HOST_STRUCTURAL)
        and not isinstance(n.op, allowed)
        and not (
            not isinstance(n.op, (Shape, Shape_i))
            and all(_is_shape_value(o, memo) for o in n.outputs)
        )
    ]


def assert_gpu_only(fgraph, allowed=()):
    host = host_data_nodes(fgraph, allowed)
    assert not host, [f"{n.op}({', '.join(map(str, n.inputs))})" for n in host]


def structural_graph(hx, hy):
    """A graph of every structural op, for ``x`` (4, 6, 5) and ``y`` (6, 5)."""
    t = hx.dimshuffle(2, 0, 1)  # (5, 4, 6), a view
    r = t.reshape((5, 24))  # needs a copy (transpose kernel)
    s = hx[1:3, ::2].flatten(2)  # views then a copy
    j = pt.concatenate([hy[None], hx[:2]], axis=0)
    inc = pt.inc_subtensor(hx[:, 1:4], hy[1:4] * 2)
    st = pt.set_subtensor(hx[0, :, 2], 7.0)
    a = pt.zeros((hx.shape[0], 3), dtype="float32") + hx[:, 0, :3]
    return [r, s, j, inc, st, a, hx.shape]


def split_join_assert_graph(hx):
    """Split (sizes from the shape), join the parts back swapped, assert."""
    a, b = pt.split(hx, [3, hx.shape[0] - 3], n_splits=2, axis=0)
    checked = Assert("too short")(hx, hx.shape[0] > 6)
    return [b * 1, pt.concatenate([b, a], axis=0), checked * 1]


def test_structural_graphs_lift_completely():
    """The GPU tests' graphs (GPU inputs) keep no host op that moves data."""
    x, y = gvar((None,) * 3, name="x"), gvar((None,) * 2, name="y")
    fg = lifted(structural_graph(cuda.host_from_gpu(x), cuda.host_from_gpu(y)), True)
    assert_gpu_only(fg)
    assert {GpuDimShuffle, GpuReshape, GpuJoin, GpuIncSubtensor} <= op_types(fg)
    fg = lifted(split_join_assert_graph(cuda.host_from_gpu(y)), True)
    assert_gpu_only(fg)
    assert {GpuSplit, GpuJoin, GpuCheckAndRaise} <= op_types(fg)


def test_assert_gpu_only_tells_shape_arithmetic_from_data():
    x = pt.matrix("x")
    fg = FunctionGraph([x], [x.reshape((x.shape[0] * x.shape[1],))], clone=False)
    # the reshape and the shape read of the host matrix need the array; the
    # arithmetic on its shape does not
    assert {type(n.op) for n in host_data_nodes(fg)} == {Reshape, Shape}
    iv = pt.lvector("iv")  # an integer vector that is array data
    fg = FunctionGraph([iv], [pt.concatenate([iv, pt.as_tensor([1])])], clone=False)
    assert [type(n.op) for n in host_data_nodes(fg)] == [Join]
    g = gvar((None, None))
    h = cuda.host_from_gpu(g)
    new_shape = pt.concatenate([h.shape[:1], pt.as_tensor([-1])])
    fg = lifted([cuda.gpu_from_host(h.reshape(new_shape, ndim=2), 0)])
    assert GpuReshape in op_types(fg)
    assert_gpu_only(fg)


def test_verify_grad_graph_lifts_in_float64():
    """``set_subtensor(y[:, 0], 0.0)`` on float64: the float32 constant is cast."""
    one = cuda.shared(np.ones((1, 1)), shape=(1, 1), name="one")
    v = pt.dmatrix("v")
    out = _grad_graph(v * cuda.host_from_gpu(one))
    g = pytensor.grad((out * np.ones((4, 4))).sum(), v)
    fg = lifted([out, g], inplace=True)
    host = [n for n in host_data_nodes(fg) if not isinstance(n.op, (Shape, Shape_i))]
    assert not host, [str(n.op) for n in host]
    assert GpuIncSubtensor in op_types(fg)


def _grad_graph(h):
    y = pt.concatenate([h.T[1:3], h.reshape((6, 4))[:2]], axis=0)
    return pt.set_subtensor(y[:, 0], 0.0) ** 2


@pytest.mark.gpu
def test_views_share_memory_and_match_numpy(debug):
    from cc2ops.cuda.runtime import array

    x = rng(1).standard_normal((5, 6, 7)).astype("float32")
    g = array.to_gpu(x, 0)
    cases = [
        (basic.dimshuffle_view(g, (2, "x", 0, 1)), x.transpose(2, 0, 1)[:, None]),
        (basic.subtensor_view(g, (slice(1, 4), 2)), x[1:4, 2]),
        (basic.subtensor_view(g, (slice(None, None, -2),)), x[::-2]),
        (
            basic.subtensor_view(g, (-1, slice(5, 0, -3), slice(2, 9))),
            x[-1, 5:0:-3, 2:9],
        ),
        (
            basic.broadcast_view(basic.subtensor_view(g, (0, 0)), (3, 7)),
            np.broadcast_to(x[0, 0], (3, 7)),
        ),
    ]
    for k, (view, want) in enumerate(cases):
        assert view.shape == want.shape, k
        assert cuda.CudaArrayType.may_share_memory(view, g), k
        np.testing.assert_array_equal(array.to_host(view), want, err_msg=f"case {k}")
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 0"):
        basic.subtensor_view(g, (5,))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape,perm,dtype",
    [
        ((33, 65), (1, 0), "float32"),
        ((1, 1), (1, 0), "float32"),
        ((4, 31, 70), (0, 2, 1), "float64"),
        ((3, 5, 40, 2), (2, 0, 3, 1), "float32"),
        ((130, 3), (1, 0), "int8"),
        ((2, 3, 4, 5, 6), (4, 3, 2, 1, 0), "int16"),
    ],
)
def test_contiguous_uses_the_tiled_transpose(shape, perm, dtype, debug, monkeypatch):
    from cc2ops.cuda.runtime import array

    calls = []
    real = basic._launch_transpose
    monkeypatch.setattr(
        basic, "_launch_transpose", lambda *a: (calls.append(1), real(*a))[1]
    )
    x = (rng(2).standard_normal(shape) * 50).astype(dtype)
    view = basic.dimshuffle_view(array.to_gpu(x, 0), perm)
    out = basic.contiguous(view, 0)
    assert array.is_c_contiguous(out)
    np.testing.assert_array_equal(array.to_host(out), x.transpose(perm))
    if sum(n > 1 for n in shape) >= 2:
        assert calls, "the tiled transpose kernel did not run"


@pytest.mark.gpu
def test_strided_assign_set_inc_and_broadcast(debug):
    from cc2ops.cuda.runtime import array

    x = rng(3).standard_normal((6, 7, 8)).astype("float64")
    y = rng(4).standard_normal((7, 1)).astype("float64")
    g = array.to_gpu(x, 0)
    view = basic.subtensor_view(g, (slice(1, 6, 2), slice(None), slice(None, None, 3)))
    basic.strided_assign(view, array.to_gpu(y, 0), 0, inc=True)
    want = x.copy()
    want[1:6:2, :, ::3] += y
    np.testing.assert_array_equal(array.to_host(g), want)
    basic.strided_assign(basic.dimshuffle_view(g, (2, 1, 0)), array.to_gpu(x.T, 0), 0)
    np.testing.assert_array_equal(array.to_host(g), x)


@pytest.mark.gpu
def test_compiled_structural_graph_matches_numpy(debug):
    x = rng(5).standard_normal((4, 6, 5)).astype("float32")
    y = rng(6).standard_normal((6, 5)).astype("float32")
    fn, got = gpu_fn(structural_graph, x, y)
    assert_gpu_only(fn.maker.fgraph)
    inc = x.copy()
    inc[:, 1:4] += y[1:4] * 2
    st = x.copy()
    st[0, :, 2] = 7
    wants = [
        x.transpose(2, 0, 1).reshape(5, 24),
        x[1:3, ::2].reshape(2, -1),
        np.concatenate([y[None], x[:2]], axis=0),
        inc,
        st,
        x[:, 0, :3],
        np.array(x.shape),
    ]
    for k, (g, w) in enumerate(zip(got, wants, strict=True)):
        g = np.asarray(g)
        assert g.shape == w.shape, k
        assert np.isfinite(g).all(), k
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"output {k}")


@pytest.mark.gpu
def test_split_join_and_assert_at_run_time(debug):
    from cc2ops.cuda.runtime import array

    x = rng(7).standard_normal((7, 3)).astype("float32")
    fn, (b, j, c) = gpu_fn(split_join_assert_graph, x)
    assert_gpu_only(fn.maker.fgraph)
    np.testing.assert_array_equal(b, x[3:])
    np.testing.assert_array_equal(j, np.concatenate([x[3:], x[:3]]))
    np.testing.assert_array_equal(c, x)
    # 5 rows split as [3, 2] (valid), then the assertion fails
    with pytest.raises(AssertionError, match="too short"):
        fn(array.to_gpu(x[:5], 0))


@pytest.mark.gpu
def test_verify_grad_through_structural_gpu_ops():
    x = rng(8).standard_normal((4, 6))
    # multiplying by a GPU one puts the graph on the GPU (a bare
    # host_from_gpu(gpu_from_host(v)) is cancelled back to v);
    # test_verify_grad_graph_lifts_in_float64 checks the lifted graph
    one = cuda.shared(np.ones((1, 1)), shape=(1, 1), name="one")

    def f(v):
        return _grad_graph(v * cuda.host_from_gpu(one))

    verify_grad(
        f, [x], rng=rng(0), mode=cuda.mode(), abs_tol=1e-6, rel_tol=1e-6, eps=1e-7
    )


@pytest.mark.gpu
def test_basic_sanitize(debug):
    """Small launches of the transpose and strided set/inc kernels."""
    from cc2ops.cuda.runtime import array

    x = rng(9).standard_normal((3, 37, 41)).astype("float32")
    g = array.to_gpu(x, 0)
    out = basic.contiguous(basic.dimshuffle_view(g, (0, 2, 1)), 0)
    np.testing.assert_array_equal(array.to_host(out), x.transpose(0, 2, 1))
    view = basic.subtensor_view(g, (slice(None), slice(1, 30, 2)))
    basic.strided_assign(view, array.to_gpu(np.float32([1.5]), 0), 0, inc=True)
    want = x.copy()
    want[:, 1:30:2] += 1.5
    np.testing.assert_array_equal(array.to_host(g), want)
    fn, got = gpu_fn(
        lambda h: [pt.concatenate([h, h[:, ::-1]], axis=1), h.T.reshape((-1,))],
        x[0],
    )
    np.testing.assert_array_equal(got[0], np.concatenate([x[0], x[0][:, ::-1]], 1))
    np.testing.assert_array_equal(got[1], x[0].T.reshape(-1))
