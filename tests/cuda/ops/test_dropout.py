"""GpuDropout and GpuDropoutAdvance: lifting and graph checks, host and GPU states
(CPU); masks bit-identical to the CPU wherever the state lives (GPU)."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.rebuild import construct_function_ins_and_outs
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.utils import rewrite_graph

import cc2ops
import cc2ops.cuda as cuda
from cc2ops.cuda.op import GpuOp
from cc2ops.cuda.ops import load_gpu_op_modules
from cc2ops.cuda.ops.dropout import (
    GpuDropout,
    GpuDropoutAdvance,
    dropout_advance_consts,
    dropout_consts,
)
from cc2ops.cuda.runtime.compile import all_variants, render
from cc2ops.cuda.type import CudaArrayType, CudaSharedVariable
from cc2ops.dropout import (
    Dropout,
    DropoutAdvance,
    advance_state,
    dropout,
    dropout_mask_reference,
    dropout_state,
)

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


def test_gpu_dropout_pushforward_is_gpu_dropout_of_the_tangent():
    """The host op's skeleton gives GpuDropout its pushforward (R_op): the same
    mask, that is the same state variable, applied to the tangent on x's
    device."""
    x, t = gvar(), gvar(name="t")
    s = dropout_state(2)
    op = GpuDropout(0.3)
    y = op(x, s)
    (r,) = op.pushforward([x, s], [y], [t, pytensor.gradient.disconnected_type()])
    assert r.type == x.type and r.owner.op == op
    assert r.owner.inputs[0] is t and r.owner.inputs[1] is s
    # a host tangent is moved to x's device first
    (r,) = op.pushforward([x, s], [y], [h(t), pytensor.gradient.disconnected_type()])
    assert r.owner.op == op and r.owner.inputs[0] is t


def test_variants_render():
    names = {c["name"] for f, c in all_variants() if f == "dropout"}
    assert names == {
        "dropout_philox_f32", "dropout_philox_f64", "dropout_philox_dstate_f32",
        "dropout_philox_dstate_f64", "dropout_advance",
    }  # fmt: skip
    src = render("dropout", **dropout_consts("float32"))
    assert "0xD2511F53u" in src and "__umulhi" in src
    assert "u32 k0, u32 k1, u64 counter" in src
    dev = render("dropout", **dropout_consts("float64", "device"))
    assert "dropout_philox_dstate_f64" in dev and "const u32* __restrict__ state" in dev
    adv = render("dropout", **dropout_advance_consts())
    assert "dropout_advance" in adv and "__umulhi" not in adv
    with pytest.raises(ValueError, match="float32 or float64"):
        dropout_consts("float16")
    with pytest.raises(ValueError, match="state must be 'host' or 'device'"):
        dropout_consts("float32", "shared")


def test_gpu_state_is_a_lazy_gpu_shared_variable():
    s = dropout_state(2**33 + 7, name="s", device=0)
    assert isinstance(s, CudaSharedVariable) and not s.is_uploaded
    assert s.type == CudaArrayType("uint32", (4,), 0) and s.name == "s"
    value = s.get_value()
    assert isinstance(value, np.ndarray) and value.tolist() == [7, 2, 0, 0]
    s.set_value(np.array([1, 2, 3, 4], np.uint32))
    assert s.get_value().tolist() == [1, 2, 3, 4] and not s.is_uploaded
    assert dropout_state(1, device=3).type.device == 3
    with pytest.raises(TypeError, match="dropout_state: device must be None or an int"):
        dropout_state(1, device="cuda")
    with pytest.raises(TypeError, match="dropout_state: device must be None or an int"):
        dropout_state(1, device=True)
    with pytest.raises(ValueError, match="dropout_state: device must be >= 0, got -1"):
        dropout_state(1, device=-1)


def rewritten(inputs, outputs):
    """The FunctionGraph the GPU mode makes for a function, not linked (no CUDA)."""
    mode = cuda.mode()
    ins, outs = construct_function_ins_and_outs(inputs, outputs, updates=None)
    return mode.function_maker(ins, outs, mode, on_unused_input="ignore").fgraph


def test_gpu_state_step_has_no_host_node():
    x, gy = gvar(name="x"), gvar(name="gy")
    state = dropout_state(4, name="s", device=0)
    y = dropout(h(x) * 2, 0.5, state)
    assert isinstance(state.default_update.owner.op, GpuDropoutAdvance)
    gpu_y = cuda.gpu_from_host(y)
    (g,) = pytensor.grad(None, [x], known_grads={gpu_y: gy})
    fg = rewritten([x, gy], [gpu_y, g])
    nodes = fg.toposort()
    host = [n for n in nodes if not isinstance(n.op, GpuOp)]
    assert not host, [str(n.op) for n in host]
    drops = [n for n in nodes if isinstance(n.op, GpuDropout)]
    (adv,) = [n for n in nodes if isinstance(n.op, GpuDropoutAdvance)]
    assert not [n for n in nodes if isinstance(n.op, (Dropout, DropoutAdvance))]
    s = fg.inputs[-1]
    assert isinstance(s, CudaSharedVariable) and s.name == "s"
    # forward and pullback read the same (pre-update) state; the update is the
    # advance of that state by the size of the dropped tensor
    assert len(drops) == 2 and all(n.inputs[1] is s for n in drops)
    assert adv.inputs[0] is s
    assert {adv.inputs[1]} & {n.inputs[0] for n in drops}
    ((out_idx, in_idx),) = fg.update_mapping.items()
    assert fg.inputs[in_idx] is s and fg.outputs[out_idx] is adv.outputs[0]


def test_gpu_state_with_a_host_input_uploads_only_the_input():
    xh = pt.matrix("xh", dtype=F32)
    state = dropout_state(4, device=0)
    y = dropout(xh, 0.5, state)
    fg = rewritten([xh], [cuda.gpu_from_host(y)])
    ops = [type(n.op) for n in fg.toposort()]
    assert ops.count(cuda.GpuFromHost) == 1 and cuda.HostFromGpu not in ops
    assert GpuDropout in ops and GpuDropoutAdvance in ops


def test_lift_passes_a_gpu_state_through():
    load_gpu_op_modules()
    x = gvar()
    gs = cuda.shared(np.zeros(4, np.uint32), shape=(4,), name="gs")
    y = Dropout(0.5)(h(x), h(gs))
    fg = FunctionGraph(outputs=[y], clone=False)
    rewrite_graph(fg, include=("fast_run", "cc2ops_gpu"), exclude=("inplace",))
    (node,) = [n for n in fg.apply_nodes if isinstance(n.op, GpuDropout)]
    assert node.inputs[0] is x and node.inputs[1] is gs
    assert not [n for n in fg.apply_nodes if isinstance(n.op, cuda.HostFromGpu)
                and n.inputs[0] is gs]  # fmt: skip


def test_gpu_state_validation():
    x = gvar()
    s0 = dropout_state(1, device=0)
    s1 = dropout_state(1, device=1)
    with pytest.raises(ValueError, match="GpuDropout: the state lives on device 1, x"):
        GpuDropout(0.5)(x, s1)
    with pytest.raises(TypeError, match="GpuDropout: state must be the uint32 vector"):
        GpuDropout(0.5)(x, gvar((None,), dtype="int64"))
    adv = GpuDropoutAdvance()(s0, x)
    assert adv.type == CudaArrayType("uint32", (4,), 0)
    with pytest.raises(TypeError, match="GpuDropoutAdvance: state must be a GPU"):
        GpuDropoutAdvance()(dropout_state(1), x)
    with pytest.raises(TypeError, match="GpuDropoutAdvance: x must be a GPU"):
        GpuDropoutAdvance()(s0, pt.matrix(dtype=F32))
    with pytest.raises(ValueError, match="GpuDropoutAdvance: the state lives on devic"):
        GpuDropoutAdvance()(s1, x)
    with pytest.raises(TypeError, match="GpuDropoutAdvance: state must be the uint32"):
        GpuDropoutAdvance()(gvar((None,), dtype="uint64"), x)
    # the builder checks x itself (before its p == 0 shortcut), for either state
    with pytest.raises(TypeError, match="dropout: x must be float32 or float64"):
        dropout(h(gvar(dtype="int32")), 0.5, dropout_state(2, device=0))
    assert dropout(h(x), 0.0, s0).owner.inputs[0] is x and s0.default_update is None
    dropout(h(x), 0.5, s0)
    with pytest.raises(ValueError, match="already drives a dropout call"):
        dropout(h(x), 0.5, s0)
    # the advance is not differentiable and the state gets no gradient
    gs = dropout_state(3, device=0)
    y = dropout(h(x), 0.5, gs)
    (g,) = pytensor.grad(y.sum(), [x])
    assert g.type == x.type


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


def gpu_state_step(shape, p, seed, dtype=F32):
    x = gvar((None,) * len(shape), dtype=dtype)
    state = dropout_state(seed, device=0)
    y = dropout(h(x), p, state)
    fn = pytensor.function([x], y, mode=cuda.mode())
    ops = {type(n.op) for n in fn.maker.fgraph.apply_nodes}
    assert {GpuDropout, GpuDropoutAdvance} <= ops and DropoutAdvance not in ops
    return fn, state


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 5, 129)])
def test_gpu_state_masks_match_the_host_state(shape, dtype, monkeypatch):
    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    from cc2ops.cuda.runtime.array import is_gpuarray

    v = np.random.default_rng(0).uniform(1, 2, shape).astype(dtype)
    fn, state = gpu_state_step(shape, 0.3, 42, dtype)
    hfn, hstate = gpu_step(shape, 0.3, 42, dtype)
    xc = pt.tensor(dtype=dtype, shape=(None,) * len(shape))
    cstate = dropout_state(42)
    cfn = pytensor.function([xc], dropout(xc, 0.3, cstate), mode=cc2ops.mode)
    for step in range(3):
        before = state.get_value()
        np.testing.assert_array_equal(before, cstate.get_value())
        got, host_got, want = np.asarray(fn(v)), np.asarray(hfn(v)), cfn(v)
        assert np.isfinite(got).all()
        assert got.tobytes() == want.tobytes() == host_got.tobytes(), f"step {step}"
        mask = dropout_mask_reference(before, v.size, 0.3).reshape(shape)
        np.testing.assert_array_equal(got != 0, mask)
        # the state stays on the device and its counter advanced there
        assert state.is_uploaded and is_gpuarray(state.container.storage[0])
        np.testing.assert_array_equal(state.get_value(), advance_state(before, v.size))
    np.testing.assert_array_equal(state.get_value(), hstate.get_value())


@gpu
def test_gpu_state_counter_carries_and_restores(monkeypatch):
    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    v = np.ones(10, F32)
    fn, state = gpu_state_step(v.shape, 0.5, 0)
    start = np.array([1, 2, 0xFFFFFFFE, 7], np.uint32)
    state.set_value(start)
    outs = [np.asarray(fn(v)) for _ in range(2)]
    # 2 steps of ceil(10 / 4) = 3 blocks from 2**32 - 2 cross into counter_hi
    assert state.get_value().tolist() == [1, 2, 4, 8]
    for k, o in enumerate(outs):
        mask = dropout_mask_reference(advance_state(start, 12 * k), 10, 0.5)
        np.testing.assert_array_equal(o, np.where(mask, np.float32(2), 0), f"step {k}")
    # a checkpoint restore after the upload: the next step repeats step 1
    state.set_value(advance_state(start, 12))
    assert state.is_uploaded
    np.testing.assert_array_equal(np.asarray(fn(v)), outs[1])
    wrap = np.array([5, 6, 0xFFFFFFFF, 0xFFFFFFFF], np.uint32)
    state.set_value(wrap)
    fn(v)
    assert state.get_value().tolist() == [5, 6, 2, 0]


@gpu
def test_gpu_state_gradient_uses_the_same_mask():
    x = gvar()
    state = dropout_state(7, device=0)
    y = dropout(h(x), 0.5, state)
    g = pytensor.grad((y * 2).sum(), x)
    fn = pytensor.function([x], [y, h(g)], mode=cuda.mode())
    v = np.random.default_rng(1).uniform(1, 2, (16, 33)).astype(F32)
    for step in range(2):
        before = state.get_value()
        yv, gv = (np.asarray(a) for a in fn(v))
        mask = dropout_mask_reference(before, v.size, 0.5).reshape(v.shape)
        np.testing.assert_array_equal(yv != 0, mask, f"step {step}")
        np.testing.assert_array_equal(gv, np.where(mask, np.float32(4.0), 0))
        # one advance per call, not per use
        np.testing.assert_array_equal(state.get_value(), advance_state(before, v.size))


@gpu
def test_verify_grad_through_gpu_dropout_with_a_gpu_state():
    from pytensor.gradient import verify_grad

    # a GPU state without a default update stays fixed across verify_grad's calls
    st = cuda.shared(np.array([3, 1, 4, 1], np.uint32), shape=(4,), name="st")
    v = np.random.default_rng(2).standard_normal((5, 6)).astype(F32)
    verify_grad(lambda x: h(GpuDropout(0.4)(cuda.gpu_from_host(x), st)) ** 2, [v],
                rng=np.random.default_rng(0), mode=cuda.mode(),
                abs_tol=5e-2, rel_tol=5e-2, eps=1e-2)  # fmt: skip
    assert st.get_value().tolist() == [3, 1, 4, 1]


@gpu
def test_dropout_gpu_state_sanitize(monkeypatch):
    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    v = np.random.default_rng(3).uniform(1, 2, (5, 37)).astype(F32)
    fn, state = gpu_state_step(v.shape, 0.5, 11)
    for _ in range(2):
        before = state.get_value()
        got = np.asarray(fn(v))
        mask = dropout_mask_reference(before, v.size, 0.5).reshape(v.shape)
        np.testing.assert_array_equal(got, np.where(mask, v * np.float32(2), 0))
        np.testing.assert_array_equal(state.get_value(), advance_state(before, v.size))
