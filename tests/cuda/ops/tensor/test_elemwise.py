"""GpuElemwise: code generation, lifting, the in-place rewrite (CPU) and kernels (GPU).

CPU tests build and rewrite graphs only (no CUDA): the scalar C code of each
op a training step needs, the lift of Elemwise/Composite/Cast nodes, the
declining rule, geometry collapsing and the in-place rewrite on the graph the
GPU mode would link. GPU tests (``gpu`` marker) compare every scalar op with
numpy, with broadcasting, non-contiguous inputs, several outputs and in-place
updates, on NaN-poisoned outputs.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
import pytest
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.tensor.elemwise import Elemwise

import cc2ops.cuda as cuda
from cc2ops.cuda.ops import load_gpu_op_modules
from cc2ops.cuda.ops.tensor import elemwise as ew
from cc2ops.cuda.ops.tensor.elemwise import (
    GpuElemwise,
    collapse_dims,
    elemwise_consts,
    scalar_code,
    scalar_code_reason,
)
from cc2ops.cuda.runtime.compile import all_variants, render
from cc2ops.cuda.type import CudaArrayConstant, CudaArrayType

F32 = "float32"
# cc2ops.cuda.mode is also the name of a function in cc2ops.cuda
cuda_mode = importlib.import_module("cc2ops.cuda.mode")


def gvar(shape=(None, None), dtype=F32, name="x", device=0):
    return CudaArrayType(dtype, shape, device)(name)


def h(x):
    return cuda.host_from_gpu(x)


def lifted(out, include=("fast_run", "cc2ops_gpu")):
    load_gpu_op_modules()
    outs = out if isinstance(out, list) else [out]
    fg = FunctionGraph(outputs=outs, clone=False)
    rewrite_graph(fg, include=include, exclude=("inplace",))
    return fg


def op_names(fg):
    return [type(n.op).__name__ for n in fg.toposort()]


class _Linked(Exception):
    pass


def linked_fgraph(monkeypatch, inputs, outputs, updates=None):
    """The graph ``pytensor.function`` in the GPU mode would link (no CUDA used).

    The linker's CUDA check is replaced by one that records the fully
    rewritten graph (in-place rewrites included) and stops.
    """
    seen = {}

    def stop():
        seen["fg"] = sys._getframe(1).f_locals["self"].fgraph
        raise _Linked

    monkeypatch.setattr(cuda_mode, "require", stop)
    with pytest.raises(_Linked):
        pytensor.function(inputs, outputs, updates=updates, mode=cuda.mode())
    return seen["fg"]


# --------------------------------------------------------------------------
# code generation (CPU)
# --------------------------------------------------------------------------

STEP_OPS = [
    ("relu", ps.maximum, (F32, F32)),
    ("add", ps.add, (F32, F32)),
    ("mul", ps.mul, (F32, F32)),
    ("sub", ps.sub, (F32, F32)),
    ("true_div", ps.true_div, (F32, F32)),
    ("exp", ps.exp, (F32,)),
    ("log", ps.log, (F32,)),
    ("sqr", ps.sqr, (F32,)),
    ("sqrt", ps.sqrt, (F32,)),
    ("switch", ps.switch, ("bool", F32, F32)),
    ("gt", ps.gt, (F32, F32)),
    ("ge", ps.ge, (F32, F32)),
    ("eq", ps.eq, ("int64", "int64")),
    ("neg", ps.neg, (F32,)),
    ("cast_f32", ps.Cast(ps.float32), ("int64",)),
    ("cast_i64", ps.Cast(ps.int64), (F32,)),
]


@pytest.mark.parametrize("label, op, dtypes", STEP_OPS, ids=[s[0] for s in STEP_OPS])
def test_scalar_code_of_the_step_ops(label, op, dtypes):
    code = scalar_code(op, dtypes)
    assert code is not None, scalar_code_reason(op, dtypes)
    assert "cc2_out0" in code.body and "cc2_in0" in code.body, code.body
    assert "Py" not in code.body and "%(" not in code.body
    consts = elemwise_consts(code, 2)
    assert consts["name"].startswith(f"elemwise_{code.scalar_name}_")
    assert consts["name"].endswith(
        "_nd2_"
        + {"bool": "b"}.get(
            code.out_dtypes[0],
            code.out_dtypes[0].replace("float", "f").replace("int", "i"),
        )
    )
    src = render("elemwise", **consts)
    assert f'extern "C" __global__ void {consts["name"]}(' in src
    assert code.body.strip() in src


def test_int_div_keeps_only_the_device_branch():
    code = scalar_code(ps.int_div, ("int64", "int64"))
    assert code is not None
    assert "PyErr" not in code.body and "#else" not in code.body
    assert "PYTENSOR_MACRO_MOD" in code.support


class NoCode(ps.UnaryScalarOp):
    """A scalar op with a Python implementation only."""

    def impl(self, x):
        return x


no_code = NoCode(ps.same_out, name="no_code")


def test_ops_without_c_code_are_declined():
    assert scalar_code(no_code, (F32,)) is None
    assert "no usable C code" in scalar_code_reason(no_code, (F32,))
    assert scalar_code(ps.add, ("complex64", "complex64")) is None
    assert "complex64 is not supported" in scalar_code_reason(
        ps.add, ("complex64", "complex64")
    )
    # host-only support code (Faddeeva) is declined
    from pytensor.scalar.math import erfcx

    assert scalar_code(erfcx, (F32,)) is None


def test_kernel_names_carry_hash_ndim_and_dtype():
    code = scalar_code(ps.add, (F32, F32))
    flat = elemwise_consts(code, 0, "scc")
    nd3 = elemwise_consts(code, 3)
    wide = elemwise_consts(code, 3, wide=True)
    assert flat["name"].endswith("_c_f32") and nd3["name"].endswith("_nd3_f32")
    assert len({flat["name"], nd3["name"], wide["name"]}) == 3
    tag = flat["name"].split("_")[2]
    assert len(tag) == 8 and int(tag, 16) >= 0
    with pytest.raises(ValueError, match="one of 'c'/'s' per operand"):
        elemwise_consts(code, 0, "cc")
    with pytest.raises(ValueError, match="outputs are never broadcast"):
        elemwise_consts(code, 0, "ccs")


def test_registered_variants_cover_the_step():
    variants = [c for f, c in all_variants() if f == "elemwise"]
    names = {c["name"].split("_")[1] for c in variants}
    for op in ("maximum", "add", "mul", "sub", "truediv", "exp", "log", "sqr"):
        assert op in names, (op, names)
    for op in ("sqrt", "switch", "gt", "ge", "eq", "neg", "cast", "composite"):
        assert op in names, (op, names)
    assert {c["ndim"] for c in variants} >= {0, 1, 2, 3, 4}
    # the momentum update composite of a fused fast_run step is among them
    composites = [c for c in variants if c["name"].split("_")[1] == "composite"]
    assert any(c["out_dtypes"].count(",") >= 1 for c in composites)


def test_collapse_dims():
    # C-contiguous (2, 3, 4) and a broadcast row: inner two dims merge
    ext, st = collapse_dims((2, 3, 4), [[12, 4, 1], [0, 0, 1], [12, 4, 1]])
    assert ext == [6, 4] and st == [[4, 1], [0, 1], [4, 1]]
    ext, st = collapse_dims((2, 3, 4), [[12, 4, 1], [12, 4, 1]])
    assert ext == [24] and st == [[1], [1]]
    # extent-1 dims vanish; a transposed operand prevents merging
    ext, st = collapse_dims((1, 3, 5), [[0, 5, 1], [0, 1, 3]])
    assert ext == [3, 5] and st == [[5, 1], [1, 3]]
    ext, st = collapse_dims((1, 1), [[0, 0]])
    assert ext == [] and st == [[]]
    # broadcast dims chain with each other
    ext, st = collapse_dims((4, 5, 6), [[0, 0, 1], [30, 6, 1]])
    assert ext == [20, 6] and st == [[0, 1], [6, 1]]


# --------------------------------------------------------------------------
# graphs (CPU)
# --------------------------------------------------------------------------


def test_make_node_types_and_errors():
    x = gvar((None, 1), name="x")
    y = gvar((3, None), name="y")
    out = GpuElemwise(ps.add)(x, y)
    assert out.type == CudaArrayType(F32, (3, None), 0)
    (b,) = GpuElemwise(ps.gt)(x, y, return_list=True)
    assert b.type.dtype == "bool"
    with pytest.raises(TypeError, match="GpuElemwise: input 0 must be a GPU variable"):
        GpuElemwise(ps.add)(pt.matrix(dtype=F32), y)
    with pytest.raises(TypeError, match="same number of dims"):
        GpuElemwise(ps.add)(gvar((None,)), y)
    with pytest.raises(ValueError, match="inputs live on devices 0 and 1"):
        GpuElemwise(ps.add)(x, gvar(device=1))
    with pytest.raises(TypeError, match="cannot overwrite input 0"):
        GpuElemwise(ps.add, {0: 0})(x, y)  # x broadcasts, the output does not
    with pytest.raises(ValueError, match="two outputs cannot overwrite one input"):
        GpuElemwise(ps.add, {0: 0, 1: 0})
    with pytest.raises(TypeError, match="scalar_op must be a pytensor ScalarOp"):
        GpuElemwise(pt.add)
    node = GpuElemwise(ps.add, {0: 1})(x, y).owner
    assert node.op.destroy_map == {0: [1]}
    assert GpuElemwise(ps.add, {0: 1}) == node.op
    assert hash(GpuElemwise(ps.add, {0: 1})) == hash(node.op)
    assert GpuElemwise(ps.add) != node.op
    with pytest.raises(TypeError):
        node.op.inplace_pattern[0] = 0


def test_infer_shape_broadcasts():
    x = gvar((None, 1, None), name="x")
    y = gvar((1, 4, None), name="y")
    node = GpuElemwise(ps.mul)(x, y).owner
    (shape,) = node.op._infer_shape(node, [("a", 1, "c"), (1, 4, "c2")])
    assert shape == ("a", 4, "c")


def test_elemwise_is_lifted_next_to_gpu_data():
    x = gvar(name="x")
    out = pt.exp(h(x))
    fg = lifted(out)
    assert op_names(fg) == ["GpuElemwise", "HostFromGpu"]
    assert fg.toposort()[0].op.scalar_op == ps.exp


def test_fused_composite_is_lifted_whole():
    x = gvar(name="x")
    y = gvar(name="y")
    out = cuda.gpu_from_host(pt.maximum(h(x) * h(y) + 1, 0) / pt.sqrt(h(y)), 0)
    fg = lifted(out)
    names = op_names(fg)
    assert names == ["GpuElemwise"], names
    (node,) = fg.toposort()
    assert isinstance(node.op.scalar_op, ps.Composite)
    assert scalar_code(node.op.scalar_op, (F32, F32)) is not None


def test_cast_and_comparison_are_lifted():
    x = gvar(name="x")
    labels = gvar((None,), dtype="int64", name="labels")
    out = pt.switch(h(x) > 0, h(x), 0.0) + pt.cast(h(labels), F32)[:, None]
    fg = lifted(cuda.gpu_from_host(out.astype(F32), 0))
    gpu = [n for n in fg.toposort() if isinstance(n.op, GpuElemwise)]
    assert gpu and not [n for n in fg.apply_nodes if isinstance(n.op, Elemwise)]


def test_a_scalar_op_without_c_code_stays_on_the_host():
    x = gvar(name="x")
    out = Elemwise(no_code)(h(x))
    fg = lifted(out)
    assert op_names(fg) == ["HostFromGpu", "Elemwise"]


def test_constants_become_gpu_constants():
    x = gvar((None,), name="x")
    node = Elemwise(ps.add)(h(x), pt.constant(np.ones(5, F32))).owner
    (out,) = ew.lift_elemwise(None, node, 0)
    const = out.owner.inputs[1]
    assert isinstance(const, CudaArrayConstant)
    np.testing.assert_array_equal(const.data, np.ones(5, F32))


def test_host_scalar_arithmetic_is_not_lifted():
    n = pt.lscalar("n")
    y = cuda.gpu_from_host(pt.cast(n * 2, F32), 0)
    fg = lifted(y)
    assert "GpuElemwise" not in op_names(fg)


def test_gradient_of_a_gpu_elemwise_stays_on_the_gpu():
    x = gvar((None,), name="x")
    y = GpuElemwise(ps.exp)(x)
    (g,) = pytensor.grad(h(y).sum(), [x])
    assert g.type == x.type
    fg = lifted(g)
    assert "GpuElemwise" in op_names(fg)


def test_inplace_rewrite_updates_parameters_in_place(monkeypatch):
    p = cuda.shared(np.zeros((4, 3), F32), name="p")
    v = cuda.shared(np.zeros((4, 3), F32), name="v")
    g = gvar(name="g")
    v_new = np.float32(0.9) * v - np.float32(0.01) * h(g)
    p_new = p + v_new
    fg = linked_fgraph(monkeypatch, [g], [], updates=[(v, v_new), (p, p_new)])
    gpu = [n for n in fg.apply_nodes if isinstance(n.op, GpuElemwise)]
    assert gpu, op_names(fg)
    assert not [n for n in fg.apply_nodes if isinstance(n.op, Elemwise)]
    destroyed = set()
    for n in gpu:
        for (i,) in n.op.destroy_map.values():
            destroyed.add(n.inputs[i])
    assert p in destroyed and v in destroyed, [str(n.op) for n in gpu]
    # the gradient input is a protected function input: never overwritten
    assert g not in destroyed


def test_inplace_rewrite_respects_other_readers(monkeypatch):
    x = gvar(name="x")
    a = GpuElemwise(ps.exp)(x)
    b = GpuElemwise(ps.add)(a, a)  # a read twice by one node
    c = GpuElemwise(ps.mul)(a, b)  # and again later
    fg = linked_fgraph(monkeypatch, [x], [h(c)])
    nodes = {
        str(n.op.scalar_op): n for n in fg.apply_nodes if isinstance(n.op, GpuElemwise)
    }
    assert not nodes["add"].op.destroy_map  # a is still needed by mul
    assert not nodes["exp"].op.destroy_map  # x is a protected input
    assert nodes["mul"].op.destroy_map in ({0: [0]}, {0: [1]})


def test_inplace_rewrite_is_registered():
    from cc2ops.rewriting.db import gpu_inplace_db

    assert ew.gpu_inplace_elemwise in gpu_inplace_db.__db__["cc2ops_gpu"]


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------

gpu = pytest.mark.gpu


def run_gpu(build, arrays, *, shapes=None):
    """Compile ``build(*host views of GPU inputs)`` in the GPU mode and run it."""
    from cc2ops.cuda.runtime import array as garray

    syms = []
    for k, a in enumerate(arrays):
        shape = (shapes[k] if shapes else None) or (None,) * a.ndim
        syms.append(gvar(shape, dtype=str(a.dtype), name=f"in{k}"))
    outs = build(*[h(s) for s in syms])
    outs = outs if isinstance(outs, list) else [outs]
    fn = pytensor.function(syms, outs, mode=cuda.mode())
    ops = {type(n.op).__name__ for n in fn.maker.fgraph.apply_nodes}
    assert "Elemwise" not in ops and "GpuElemwise" in ops, ops
    values = [a if hasattr(a, "gpudata") else garray.to_gpu(a, 0) for a in arrays]
    return [np.asarray(r) for r in fn(*values)]


def rand(shape, dtype=F32, seed=0, low=-2.0, high=2.0):
    r = np.random.default_rng(seed)
    return r.uniform(low, high, shape).astype(dtype)


UNARY = [
    ("exp", pt.exp, np.exp, {}),
    ("log", pt.log, np.log, {"low": 0.1}),
    ("sqr", pt.sqr, np.square, {}),
    ("sqrt", pt.sqrt, np.sqrt, {"low": 0.0}),
    ("neg", pt.neg, np.negative, {}),
    ("relu", lambda x: pt.maximum(x, 0), lambda x: np.maximum(x, 0), {}),
]
BINARY = [
    ("add", pt.add, np.add),
    ("mul", pt.mul, np.multiply),
    ("sub", pt.sub, np.subtract),
    ("true_div", pt.true_div, np.divide),
    ("maximum", pt.maximum, np.maximum),
    ("gt", pt.gt, np.greater),
    ("ge", pt.ge, np.greater_equal),
    ("eq", pt.eq, np.equal),
]


@gpu
@pytest.mark.parametrize("label, f, ref, kw", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ops_match_numpy(label, f, ref, kw, debug):
    a = rand((37, 129), **kw)
    (got,) = run_gpu(f, [a])
    want = ref(a)
    assert got.shape == want.shape and got.dtype == want.dtype, label
    assert np.isfinite(got).all(), label
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=label)


@gpu
@pytest.mark.parametrize("label, f, ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary_ops_match_numpy_with_broadcasting(label, f, ref, debug):
    a = rand((5, 1, 33), seed=1)
    b = rand((1, 7, 33), seed=2, low=0.5)
    b[0, 0, :5] = a[0, 0, :5]  # equal elements for eq/ge
    (got,) = run_gpu(f, [a, b], shapes=[(None, 1, None), (1, None, None)])
    want = ref(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype, label
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=label)


@gpu
def test_switch_and_casts(debug):
    a = rand((17, 9))
    lab = np.random.default_rng(3).integers(-5, 5, (17, 9)).astype("int64")
    got_s, got_f, got_i = run_gpu(
        lambda x, y: [
            pt.switch(x > 0, x, -x),
            pt.cast(y, F32),
            pt.cast(x * 3, "int64"),
        ],
        [a, lab],
    )
    np.testing.assert_array_equal(got_s, np.abs(a))
    np.testing.assert_array_equal(got_f, lab.astype(F32))
    np.testing.assert_array_equal(got_i, (a * np.float32(3)).astype("int64"))


@gpu
def test_non_contiguous_inputs(debug):
    from cc2ops.cuda.runtime import array as garray

    a = rand((8, 12), seed=4)
    b = rand((8, 6), seed=5)
    ga = garray.to_gpu(a, 0)[:, ::2]  # strided view
    assert not garray.is_c_contiguous(ga)
    (got,) = run_gpu(lambda x, y: x * y + 1, [ga, garray.to_gpu(b, 0)])
    np.testing.assert_allclose(got, a[:, ::2] * b + 1, rtol=1e-6)


@gpu
def test_several_outputs_in_one_kernel(debug):
    xs, ys = ps.float32("xs"), ps.float32("ys")
    comp = ps.Composite([xs, ys], [xs * ys, xs + ys, ps.exp(xs)])
    x, y = gvar(name="x"), gvar((1, None), name="y")
    outs = GpuElemwise(comp)(x, y, return_list=True)
    fn = pytensor.function([x, y], [h(o) for o in outs], mode=cuda.mode())
    a, b = rand((6, 10), seed=6), rand((1, 10), seed=7)
    got = fn(a, b)
    for g_, w in zip(got, [a * b, a + b, np.exp(a)], strict=True):
        assert np.isfinite(g_).all()
        np.testing.assert_allclose(g_, w, rtol=2e-6)


@gpu
def test_inplace_momentum_update_keeps_the_buffers(debug):
    r = np.random.default_rng(8)
    p0 = r.standard_normal((64, 32)).astype(F32)
    p = cuda.shared(p0, name="p")
    v = cuda.shared(np.zeros_like(p0), name="v")
    g = gvar(name="g")
    v_new = np.float32(0.9) * v - np.float32(0.01) * h(g)
    fn = pytensor.function(
        [g], [], updates=[(v, v_new), (p, p + v_new)], mode=cuda.mode()
    )
    assert any(
        isinstance(n.op, GpuElemwise) and n.op.destroy_map
        for n in fn.maker.fgraph.apply_nodes
    )
    grads = [r.standard_normal(p0.shape).astype(F32) for _ in range(3)]
    fn(grads[0])
    before = int(p.get_value(borrow=True, return_internal_type=True).gpudata)
    for gr in grads[1:]:
        fn(gr)
    after = int(p.get_value(borrow=True, return_internal_type=True).gpudata)
    assert before == after, "the parameter update copied its buffer"
    vw, pw = np.zeros_like(p0), p0.copy()
    for gr in grads:
        vw = np.float32(0.9) * vw - np.float32(0.01) * gr
        pw = pw + vw
    np.testing.assert_allclose(p.get_value(), pw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v.get_value(), vw, rtol=1e-5, atol=1e-6)


@gpu
def test_runtime_broadcasting_is_refused():
    x, y = gvar(name="x"), gvar(name="y")
    fn = pytensor.function([x, y], h(GpuElemwise(ps.add)(x, y)), mode=cuda.mode())
    with pytest.raises(ValueError, match="runtime broadcasting is not allowed"):
        fn(rand((3, 4)), rand((1, 4)))


@gpu
def test_verify_grad_through_gpu_elemwise():
    from pytensor.gradient import verify_grad

    one = cuda.shared(np.ones((1, 1), F32), shape=(1, 1), name="one")

    def f(x):
        y = x * h(one)
        return pt.exp(pt.maximum(y, 0.1)) / (1 + pt.sqr(y))

    verify_grad(
        f, [rand((4, 5), low=0.2)], rng=np.random.default_rng(0), mode=cuda.mode(),
        abs_tol=5e-2, rel_tol=5e-2, eps=1e-2,
    )  # fmt: skip


@gpu
def test_elemwise_sanitize(debug):
    from cc2ops.cuda.runtime import array as garray

    a, b = rand((9, 33), seed=9), rand((1, 33), seed=10)
    (got,) = run_gpu(
        lambda x, y: pt.maximum(x * y, 0) + pt.exp(-x), [a, b],
        shapes=[None, (1, None)],
    )  # fmt: skip
    np.testing.assert_allclose(got, np.maximum(a * b, 0) + np.exp(-a), rtol=2e-6)
    view = garray.to_gpu(rand((9, 66), seed=11), 0)[:, ::2]
    (got,) = run_gpu(lambda x: pt.sqr(x) - 1, [view])
    # nvcc contracts x*x - 1 into one FMA: near x = 1 the result differs from
    # numpy's two roundings by an absolute ulp-sized amount
    want = garray.to_host(view) ** 2 - 1
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
