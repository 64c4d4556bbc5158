"""GpuCAReduce and GpuArgmax: geometry, lifting (CPU) and kernels against numpy (GPU).

CPU tests rewrite graphs only (the GPU mode's pipeline up to linking, no
CUDA). GPU tests reduce over every axis combination of 1- to 4-d arrays
(odd extents, strided views) for sum, prod, max, min, any and all, and
compare argmax, the fused sum of squares and the split full reduction.
"""

from __future__ import annotations

import importlib
import itertools
import sys

import numpy as np
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
import pytest
from pytensor.tensor.elemwise import CAReduce
from pytensor.tensor.math import Argmax, Max, Min, Sum

import cc2ops.cuda as cuda
from cc2ops.cuda.ops.tensor import reduction as red
from cc2ops.cuda.ops.tensor.reduction import (
    GpuArgmax,
    GpuCAReduce,
    argmax_consts,
    reduce_code,
    reduction_consts,
    split_geometry,
)
from cc2ops.cuda.runtime.compile import all_variants, render
from cc2ops.cuda.type import CudaArrayType

F32 = "float32"
cuda_mode = importlib.import_module("cc2ops.cuda.mode")


def gvar(shape=(None, None), dtype=F32, name="x"):
    return CudaArrayType(dtype, shape, 0)(name)


def h(x):
    return cuda.host_from_gpu(x)


class _Linked(Exception):
    pass


def linked_fgraph(monkeypatch, inputs, outputs):
    """The graph the GPU mode would link (the CUDA check records it and stops)."""
    seen = {}

    def stop():
        seen["fg"] = sys._getframe(1).f_locals["self"].fgraph
        raise _Linked

    monkeypatch.setattr(cuda_mode, "require", stop)
    with pytest.raises(_Linked):
        pytensor.function(inputs, outputs, mode=cuda.mode())
    return seen["fg"]


def names(fg):
    return [type(n.op).__name__ for n in fg.toposort()]


# --------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------


def test_split_geometry():
    # (2, 3, 4) contiguous, reduce axis 1: kept (2, 4) strides (12, 1)
    assert split_geometry((2, 3, 4), (12, 4, 1), (1,)) == ([2, 4], [12, 1], [3], [4])
    # reduce the two inner axes: they merge
    assert split_geometry((2, 3, 4), (12, 4, 1), (1, 2)) == ([2], [12], [12], [1])
    # extent-1 dims vanish; everything reduced
    assert split_geometry((1, 5, 1), (5, 1, 1), (0, 1, 2)) == ([], [], [5], [1])
    # bias-gradient layout (B, C, H, W) summed over (0, 2, 3)
    ke, ks, re_, rs = split_geometry((8, 3, 5, 5), (75, 25, 5, 1), (0, 2, 3))
    assert (ke, ks, re_, rs) == ([3], [25], [8, 25], [75, 1])


def test_mode_choice():
    assert red._choose([4], [1], [100], [4], 100) == ("col", 256)
    assert red._choose([4], [100], [100], [1], 100) == ("row", 32)
    assert red._choose([4], [5000], [5000], [1], 5000) == ("row", 256)
    assert red._choose([], [], [10], [3], 10) == ("row", 32)


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda x: x.sum(axis=0), "sum"),
        (lambda x: x.prod(axis=1), "prod"),
        (lambda x: x.max(axis=1), "max"),
        (lambda x: Min(axis=None)(x), "min"),
        (lambda x: (x > 0).any(axis=0), "any"),
        (lambda x: (x > 0).all(axis=1), "all"),
    ],
)
def test_reduce_code_of_each_op(build, name):
    x = pt.matrix(dtype=F32)
    out = build(x)
    node = next(n for n in pytensor.graph.traversal.applys_between([x], [out])
                if isinstance(n.op, CAReduce))  # fmt: skip
    code = reduce_code(node.op, node.inputs[0].type.dtype, node.outputs[0].type.dtype)
    assert code is not None and code.name == name
    consts = reduction_consts(code, mode="row", tpo=32, nk=1, nr=1)
    assert consts["name"].startswith(f"reduce_{name}_")
    src = render("reduction", **consts)
    assert f'extern "C" __global__ void {consts["name"]}(' in src


def test_float32_sum_accumulates_in_acc_dtype():
    x = pt.matrix(dtype=F32)
    code = reduce_code(x.sum(axis=1).owner.op, F32, F32)
    assert code.acc_dtype == "float64" and code.out_dtype == F32
    code32 = reduce_code(x.sum(axis=1, acc_dtype=F32).owner.op, F32, F32)
    assert code32.acc_dtype == F32
    assert code.identity == "0.0"
    mx = reduce_code(x.max(axis=1).owner.op, F32, F32)
    assert mx.identity == "(-INFINITY)"
    ix = reduce_code(Max(axis=(0,)).make_node(pt.lmatrix()).op, "int64", "int64")
    assert ix.identity == "(-9223372036854775807LL - 1LL)"


def test_fused_composite_reduction_has_code():
    op = red.fused_sum_of_squares()
    code = reduce_code(op, F32, F32)
    assert code is not None and code.name == "sum"
    assert "cc2_in1 * cc2_in1" in code.fold.body or "*" in code.fold.body
    assert code.combine.body.strip() == "cc2_out0 = cc2_in0 + cc2_in1;"


def test_unknown_scalar_op_is_declined():
    op = CAReduce(ps.xor, axis=(0,))
    node = op.make_node(pt.matrix(dtype="bool"))
    assert reduce_code(node.op, "bool", "bool") is None
    x = gvar(dtype="bool")
    fg = pytensor.graph.fg.FunctionGraph(outputs=[node.op(h(x))], clone=False)
    assert red.lift_careduce(fg, fg.outputs[0].owner, 0) is None


def test_consts_validation():
    code = reduce_code(Sum(axis=(0,)).make_node(pt.matrix(dtype=F32)).op, F32, F32)
    with pytest.raises(ValueError, match="mode must be 'row' or 'col'"):
        reduction_consts(code, mode="diag", tpo=32, nk=1, nr=1)
    with pytest.raises(ValueError, match="tpo must be 32 or 256"):
        reduction_consts(code, mode="row", tpo=64, nk=1, nr=1)
    with pytest.raises(ValueError, match="split needs mode 'row' with tpo 256"):
        reduction_consts(code, mode="col", tpo=256, nk=1, nr=1, split=True)
    split = reduction_consts(code, mode="row", tpo=256, nk=0, nr=1, split=True)
    assert split["name"].endswith("_f64")  # chunk accumulators in acc_dtype
    with pytest.raises(ValueError, match="not supported on the GPU"):
        argmax_consts("complex64", mode="row", tpo=32, nk=1, nr=1)


def test_registered_variants_cover_ops_and_modes():
    variants = [c for f, c in all_variants() if f == "reduction"]
    kinds = {c["name"].split("_")[1] for c in variants if c["kind"] == "reduce"}
    assert {"sum", "prod", "max", "min", "any", "all"} <= kinds
    assert {c["mode"] for c in variants} == {"row", "col"}
    assert any(c["split"] for c in variants)
    assert any(c["kind"] == "argmax" for c in variants)
    assert len({c["name"] for c in variants}) == len(variants)


def test_make_node_and_infer_shape():
    x = gvar((None, 3, None))
    y = GpuCAReduce(Sum(axis=(0, 2)).make_node(pt.tensor3(dtype=F32)).op)(x)
    assert y.type == CudaArrayType(F32, (3,), 0)
    node = y.owner
    assert node.op._infer_shape(node, [("a", 3, "c")]) == [(3,)]
    a = GpuArgmax((1,))(x)
    assert a.type == CudaArrayType("int64", (None, None), 0)
    with pytest.raises(TypeError, match="GpuCAReduce: host_op must be a CAReduce"):
        GpuCAReduce(pt.add)
    with pytest.raises(TypeError, match="GpuArgmax: x must be a GPU variable"):
        GpuArgmax((0,))(pt.matrix())
    with pytest.raises(ValueError, match="axis 5 is out of range"):
        GpuArgmax((5,))(x)


def test_reductions_are_lifted(monkeypatch):
    x = gvar(name="x")
    outs = [
        h(x).sum(axis=0), h(x).mean(axis=1), h(x).max(axis=1), h(x).min(),
        (h(x) > 0).any(axis=1), h(x).prod(axis=0), pt.argmax(h(x), axis=1),
    ]  # fmt: skip
    fg = linked_fgraph(monkeypatch, [x], outs)
    got = names(fg)
    host = [n for n in fg.apply_nodes if isinstance(n.op, (CAReduce, Argmax))]
    assert not host, [str(n.op) for n in host]
    assert "GpuArgmax" in got and got.count("GpuCAReduce") >= 6, got
    # fast_run fuses sum(sqr(x)) into one CAReduce(Composite) with the C linker
    fg = linked_fgraph(monkeypatch, [x], [pt.sqr(h(x)).sum(axis=1)])
    fused = [n for n in fg.apply_nodes if isinstance(n.op, GpuCAReduce)
             and isinstance(n.op.host_op.scalar_op, ps.Composite)]  # fmt: skip
    assert fused, "the fused sum of squares was not lifted whole"


def test_reduction_gradient_stays_on_the_gpu():
    x = gvar((None, None), name="x")
    y = GpuCAReduce(Sum(axis=(1,)).make_node(pt.matrix(dtype=F32)).op)(x)
    (g,) = pytensor.grad(h(y).sum(), [x])
    assert g.type.dtype == F32 and g.type.ndim == 2


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------

gpu = pytest.mark.gpu


SHAPES = {1: (37,), 2: (5, 129), 3: (3, 7, 65), 4: (2, 3, 5, 33)}
REDUCERS = {
    "sum": (lambda x, a: x.sum(axis=a), lambda v, a: v.astype(np.float64).sum(a)),
    "prod": (lambda x, a: x.prod(axis=a), lambda v, a: np.prod(v, a)),
    "max": (lambda x, a: x.max(axis=a), lambda v, a: v.max(a)),
    "min": (lambda x, a: x.min(axis=a), lambda v, a: v.min(a)),
    "any": (lambda x, a: (x > 0.5).any(axis=a), lambda v, a: (v > 0.5).any(a)),
    "all": (lambda x, a: (x > -0.9).all(axis=a), lambda v, a: (v > -0.9).all(a)),
}


def all_axes(ndim):
    for k in range(1, ndim + 1):
        yield from itertools.combinations(range(ndim), k)


def compile_gpu(build, ndim, dtype=F32):
    x = gvar((None,) * ndim, dtype=dtype)
    fn = pytensor.function([x], build(h(x)), mode=cuda.mode())
    ops = {type(n.op).__name__ for n in fn.maker.fgraph.apply_nodes}
    assert not ops & {"Sum", "Prod", "Max", "Min", "Any", "All", "CAReduce", "Argmax"}
    return fn


@gpu
@pytest.mark.parametrize("op", sorted(REDUCERS))
@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_every_axis_combination(op, ndim, debug):
    build, ref = REDUCERS[op]
    r = np.random.default_rng(ndim)
    low, high = (0.9, 1.1) if op == "prod" else (-1.0, 1.0)
    v = r.uniform(low, high, SHAPES[ndim]).astype(F32)
    for axes in all_axes(ndim):
        fn = compile_gpu(lambda x, axes=axes: build(x, axes), ndim)
        got = np.asarray(fn(v))
        want = np.asarray(ref(v, axes))
        assert got.shape == want.shape, (op, axes)
        if op in ("any", "all"):
            np.testing.assert_array_equal(got, want, err_msg=f"{op} {axes}")
        else:
            assert np.isfinite(got).all(), (op, axes)
            np.testing.assert_allclose(got, want.astype(got.dtype), rtol=1e-5,
                                       atol=1e-6, err_msg=f"{op} {axes}")  # fmt: skip


@gpu
@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_argmax_every_axis_combination(ndim, debug):
    r = np.random.default_rng(10 + ndim)
    v = r.integers(-3, 4, SHAPES[ndim]).astype(F32)  # many ties: first index wins
    for axes in all_axes(ndim):
        fn = compile_gpu(lambda x, axes=axes: pt.argmax(x, axis=axes), ndim)
        got = np.asarray(fn(v))
        out = [[None]]
        Argmax(axes).perform(None, [v], out)  # PyTensor's own multi-axis rule
        expected = out[0][0]
        np.testing.assert_array_equal(got, expected, err_msg=f"argmax {axes}")


@gpu
def test_argmax_nan_and_ints():
    v = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, 5.0, -1.0]], F32)
    fn = compile_gpu(lambda x: pt.argmax(x, axis=1), 2)
    np.testing.assert_array_equal(fn(v), np.argmax(v, axis=1))
    iv = np.random.default_rng(3).integers(-100, 100, (7, 300)).astype("int64")
    fn = compile_gpu(lambda x: pt.argmax(x, axis=0), 2, dtype="int64")
    np.testing.assert_array_equal(fn(iv), np.argmax(iv, axis=0))


@gpu
def test_large_full_sum_is_split(debug):
    v = np.random.default_rng(4).standard_normal(3_000_001).astype(F32)
    fn = compile_gpu(lambda x: x.sum(), 1)
    got = float(fn(v))
    assert abs(got - v.astype(np.float64).sum()) < 1e-3
    fn = compile_gpu(lambda x: pt.sqr(x).sum(), 1)
    np.testing.assert_allclose(float(fn(v)), (v.astype(np.float64) ** 2).sum(),
                               rtol=1e-6)  # fmt: skip


@gpu
def test_column_sum_and_strided_views(debug):
    from cc2ops.cuda.runtime import array as garray

    v = np.random.default_rng(5).standard_normal((300, 70)).astype(F32)
    fn = compile_gpu(lambda x: x.sum(axis=0), 2)
    np.testing.assert_allclose(fn(v), v.astype(np.float64).sum(0), rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    view = garray.to_gpu(v, 0)[::3, 1::2]
    fn = compile_gpu(lambda x: x.max(axis=1), 2)
    np.testing.assert_array_equal(fn(view), v[::3, 1::2].max(1))


@gpu
def test_max_of_empty_is_an_error():
    fn = compile_gpu(lambda x: x.max(axis=0), 2)
    with pytest.raises(ValueError, match="empty reduction"):
        fn(np.zeros((0, 3), F32))


@gpu
def test_verify_grad_through_gpu_reductions():
    from pytensor.gradient import verify_grad

    one = cuda.shared(np.ones((1, 1), F32), shape=(1, 1), name="one")

    def f(x):
        y = x * h(one)
        return y.sum(axis=0) + y.max(axis=1).sum() + pt.sqr(y).mean()

    v = np.random.default_rng(6).standard_normal((4, 5)).astype(F32)
    verify_grad(f, [v], rng=np.random.default_rng(0), mode=cuda.mode(),
                abs_tol=5e-2, rel_tol=5e-2, eps=1e-2)  # fmt: skip


@gpu
def test_reduction_sanitize(debug):
    v = np.random.default_rng(7).standard_normal((6, 40, 9)).astype(F32)
    for build, ref in [
        (lambda x: x.sum(axis=(0, 2)), lambda a: a.astype(np.float64).sum((0, 2))),
        (lambda x: x.max(axis=1), lambda a: a.max(1)),
        (lambda x: pt.argmax(x, axis=2), lambda a: np.argmax(a, 2)),
        (lambda x: x.sum(axis=0), lambda a: a.astype(np.float64).sum(0)),
    ]:
        fn = compile_gpu(build, 3)
        np.testing.assert_allclose(fn(v), ref(v), rtol=1e-5, atol=1e-5)
