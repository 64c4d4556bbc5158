"""GpuDropout: lifting and graph checks (CPU); masks bit-identical to the CPU (GPU)."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.utils import rewrite_graph

import cc2ops
import cc2ops.cuda as cuda
from cc2ops.cuda.compile import all_variants, render
from cc2ops.cuda.dropout import GpuDropout, dropout_consts
from cc2ops.cuda.mode import load_gpu_op_modules
from cc2ops.cuda.type import CudaArrayType
from cc2ops.dropout import Dropout, dropout, dropout_mask_reference, dropout_state

F32 = "float32"


def gvar(shape=(None, None), dtype=F32, name="x"):
    return CudaArrayType(dtype, shape, 0)(name)


def h(x):
    return cuda.host_from_gpu(x)


def test_dropout_is_lifted_and_the_state_stays_on_the_host():
    load_gpu_op_modules()
    x = gvar()
    state = dropout_state(1)
    y = dropout(h(x), 0.5, state)
    fg = FunctionGraph(outputs=[y], clone=False)
    rewrite_graph(fg, include=("fast_run", "cc2ops_gpu"), exclude=("inplace",))
    (node,) = [n for n in fg.apply_nodes if isinstance(n.op, GpuDropout)]
    assert node.inputs[0] is x and node.inputs[1] is state
    assert not [n for n in fg.apply_nodes if isinstance(n.op, Dropout)]
    assert not [n for n in fg.apply_nodes if isinstance(n.op, cuda.GpuFromHost)]


def test_gpu_dropout_graph():
    x = gvar()
    s = dropout_state(2)
    y = GpuDropout(0.3)(x, s)
    assert y.type == x.type
    (g,) = pytensor.grad(h(y).sum(), [x])
    assert g.type == x.type
    assert any(isinstance(n.op, GpuDropout) for n in
               pytensor.graph.traversal.applys_between([x], [g]))  # fmt: skip
    with pytest.raises(TypeError, match="GpuDropout: x must be a GPU variable"):
        GpuDropout(0.3)(pt.matrix(dtype=F32), s)
    with pytest.raises(TypeError, match="GpuDropout: x must be float32 or float64"):
        GpuDropout(0.3)(gvar(dtype="int64"), s)
    with pytest.raises(ValueError, match="dropout: p must satisfy"):
        GpuDropout(1.0)


def test_variants_render():
    names = {c["name"] for f, c in all_variants() if f == "dropout"}
    assert names == {"dropout_philox_f32", "dropout_philox_f64"}
    src = render("dropout", **dropout_consts("float32"))
    assert "0xD2511F53u" in src and "__umulhi" in src
    with pytest.raises(ValueError, match="float32 or float64"):
        dropout_consts("float16")


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------

gpu = pytest.mark.gpu


def gpu_step(shape, p, seed, dtype=F32):
    x = gvar((None,) * len(shape), dtype=dtype)
    state = dropout_state(seed)
    y = dropout(h(x), p, state)
    fn = pytensor.function([x], y, mode=cuda.mode())
    assert any(isinstance(n.op, GpuDropout) for n in fn.maker.fgraph.apply_nodes)
    return fn, state


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 5, 129)])
def test_gpu_masks_are_bit_identical_to_the_cpu(shape, dtype, monkeypatch):
    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    v = np.random.default_rng(0).uniform(1, 2, shape).astype(dtype)
    fn, state = gpu_step(shape, 0.3, 42, dtype)
    xc = pt.tensor(dtype=dtype, shape=(None,) * len(shape))
    cstate = dropout_state(42)
    cfn = pytensor.function([xc], dropout(xc, 0.3, cstate), mode=cc2ops.mode)
    for step in range(3):
        before = state.get_value()
        got, want = np.asarray(fn(v)), cfn(v)
        assert np.isfinite(got).all()
        assert got.tobytes() == want.tobytes(), f"step {step}"
        mask = dropout_mask_reference(before, v.size, 0.3).reshape(shape)
        np.testing.assert_array_equal(got != 0, mask)
    np.testing.assert_array_equal(state.get_value(), cstate.get_value())


@gpu
def test_gpu_dropout_gradient_uses_the_same_mask():
    x = gvar()
    state = dropout_state(7)
    y = dropout(h(x), 0.5, state)
    g = pytensor.grad((y * 2).sum(), x)
    fn = pytensor.function([x], [y, h(g)], mode=cuda.mode())
    v = np.random.default_rng(1).uniform(1, 2, (16, 33)).astype(F32)
    yv, gv = (np.asarray(a) for a in fn(v))
    np.testing.assert_array_equal(gv, np.where(yv != 0, np.float32(4.0), 0))


@gpu
def test_verify_grad_through_gpu_dropout():
    from pytensor.gradient import verify_grad

    one = cuda.shared(np.ones((1, 1), F32), shape=(1, 1), name="one")
    st = pt.constant(np.array([3, 1, 4, 1], np.uint32))
    v = np.random.default_rng(2).standard_normal((5, 6)).astype(F32)
    verify_grad(lambda x: Dropout(0.4)(x * h(one), st) ** 2, [v],
                rng=np.random.default_rng(0), mode=cuda.mode(),
                abs_tol=5e-2, rel_tol=5e-2, eps=1e-2)  # fmt: skip


@gpu
def test_gpu_mask_rate():
    fn, _ = gpu_step((1000, 1000), 0.25, 9)
    got = np.asarray(fn(np.ones((1000, 1000), F32)))
    assert abs((got != 0).mean() - 0.75) < 5 * np.sqrt(0.25 * 0.75 / 1e6)


@gpu
def test_dropout_sanitize(monkeypatch):
    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    v = np.random.default_rng(3).uniform(1, 2, (5, 37)).astype(F32)
    fn, state = gpu_step(v.shape, 0.5, 11)
    before = state.get_value()
    got = np.asarray(fn(v))
    mask = dropout_mask_reference(before, v.size, 0.5).reshape(v.shape)
    np.testing.assert_array_equal(got, np.where(mask, v * np.float32(2), 0))
