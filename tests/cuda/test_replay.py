"""Automatic CUDA-graph replay: ``cc2ops.cuda.mode(graphs=True)``.

CPU tests: :func:`capture_plan` on rewritten graphs (capturable steps; host
work on values, host dropout state and multi-device graphs refused, each with
its reason) and the mode's argument checks. GPU tests: a training step with
host minibatches and GPU parameters gives the eager function's losses and
parameters call after call while replaying; new shapes capture new graphs
within ``max_graphs``; returned host and GPU values are never overwritten by a
later call; the softmax label check still raises after capture; a function
that cannot be captured warns once and runs eagerly with the right values; an
updated host shared variable computed on the GPU follows the eager one.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.fg import FunctionGraph

import cc2ops
import cc2ops.cuda as cuda
from cc2ops.cuda.replay import ReplayVM, ReplayWarning, capture_plan
from cc2ops.cuda.runtime import array

gpu = pytest.mark.gpu


def _plan(ins, outs, mode=None):
    mode = mode or cuda.mode(graphs=True)
    fg = FunctionGraph(ins, outs, clone=True)
    mode.optimizer.rewrite(fg)
    return capture_plan(fg)


def _net(seed=0, classes=7):
    """conv -> ReLU -> max pool -> FC -> softmax loss, GPU shared parameters."""
    r = np.random.default_rng(seed)
    x = pt.tensor4("x", dtype="float32")  # (B, 3, 8, 8)
    y = pt.ivector("y")  # (B,)
    w1 = (0.2 * r.standard_normal((4, 3, 3, 3))).astype(np.float32)
    w2 = (0.2 * r.standard_normal((4 * 4 * 4, classes))).astype(np.float32)
    return x, y, w1, w2


def _step(mode, w1_0, w2_0, x, y, lr=0.05):
    w1 = cuda.shared(w1_0.copy(), name="w1")
    w2 = cuda.shared(w2_0.copy(), name="w2")
    h = pt.maximum(cc2ops.conv2d(x, w1, padding=1), 0)
    h = cc2ops.max_pool2d(h, 2)
    logits = h.flatten(2) @ w2
    loss = cc2ops.softmax_cross_entropy(logits, y).mean()
    g1, g2 = pytensor.grad(loss, [w1, w2])
    lr = np.float32(lr)
    fn = pytensor.function(
        [x, y], loss, updates=[(w1, w1 - lr * g1), (w2, w2 - lr * g2)], mode=mode
    )
    return fn, (w1, w2)


def _batch(r, b, classes=7):
    return (
        r.standard_normal((b, 3, 8, 8)).astype(np.float32),
        r.integers(0, classes, b).astype(np.int32),
    )


# --------------------------------------------------------------------------
# CPU: what can be captured, and why not
# --------------------------------------------------------------------------


def test_plan_training_step_is_capturable():
    x, y, w1_0, w2_0 = _net()
    w1 = cuda.shared(w1_0, name="w1")
    loss = cc2ops.softmax_cross_entropy(
        cc2ops.conv2d(x, w1, padding=1).mean(axis=(2, 3))[:, :4], y
    ).mean()
    g = pytensor.grad(loss, w1)
    plan = _plan([x, y, w1], [loss, w1 - np.float32(0.1) * g])
    assert plan.capturable, plan.reason
    assert plan.device == 0
    assert plan.reason == ""


def test_plan_refuses_host_work_on_downloaded_values():
    x = pt.matrix("x", dtype="float32")
    w = cuda.shared(np.ones((5, 3), np.float32), name="w")
    plan = _plan([x, w], [pt.sort(x @ w, axis=1)])
    assert not plan.capturable
    assert "host op SortOp" in plan.reason
    assert "host work on values is not recorded" in plan.reason


def test_plan_refuses_gpu_op_reading_a_host_value():
    x = pt.matrix("x", dtype="float32")
    w = cuda.shared(np.ones((5, 3), np.float32), name="w")
    state = cc2ops.dropout_state(0)  # a host state: GpuDropout reads it on the host
    plan = _plan([x, w, state], [cc2ops.dropout(x @ w, 0.5, state)])
    assert not plan.capturable
    assert plan.reason.startswith("GpuDropout")
    assert "reads the host value" in plan.reason


def test_plan_refuses_host_only_graphs():
    x = pt.vector("x")
    plan = _plan([x], [2 * x])
    assert not plan.capturable
    assert plan.reason == "the function has no GPU variables"


def test_plan_shapes_of_host_inputs_are_allowed():
    x = pt.matrix("x", dtype="float32")
    w = cuda.shared(np.ones((5, 3), np.float32), name="w")
    out = (x @ w) * pt.cast(x.shape[0], "float32")
    plan = _plan([x, w], [out])
    assert plan.capturable, plan.reason


@pytest.mark.parametrize(
    "kwargs, exc, text",
    [
        ({"graphs": 1}, TypeError, "graphs must be True or False, got 1"),
        (
            {"graphs": True, "max_graphs": 0},
            ValueError,
            "max_graphs must be >= 1, got 0",
        ),
        ({"graphs": True, "max_graphs": 2.5}, TypeError, "max_graphs must be an int"),
        ({"graphs": True, "max_graphs": True}, TypeError, "max_graphs must be an int"),
        (
            {"graphs": True, "devices": [0, 1]},
            ValueError,
            r"graphs=True replays one device's stream; got devices \(0, 1\)",
        ),
    ],
)
def test_mode_checks_replay_arguments(kwargs, exc, text):
    with pytest.raises(exc, match=text):
        cuda.mode(**kwargs)


def test_mode_carries_replay_settings_to_the_linker():
    m = cuda.mode(graphs=True, max_graphs=3)
    assert m.linker.cc2ops_graphs is True
    assert m.linker.cc2ops_max_graphs == 3
    assert cuda.mode().linker.cc2ops_graphs is False


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------


@gpu
def test_auto_replay_step_matches_eager():
    x, y, w1_0, w2_0 = _net()
    eager, (e1, e2) = _step(cuda.mode(), w1_0, w2_0, x, y)
    auto, (a1, a2) = _step(cuda.mode(graphs=True), w1_0, w2_0, x, y)
    assert isinstance(auto.vm, ReplayVM)
    r = np.random.default_rng(1)
    for i in range(6):
        xb, yb = _batch(r, 5)
        le, la = eager(xb, yb), auto(xb, yb)
        assert isinstance(la, np.ndarray) and la.dtype == np.float32
        assert la.shape == le.shape == ()
        np.testing.assert_allclose(la, le, rtol=1e-5, err_msg=f"loss of call {i}")
    for e, a in ((e1, a1), (e2, a2)):
        np.testing.assert_allclose(
            array.to_host(a.get_value()), array.to_host(e.get_value()), rtol=1e-5
        )
    assert auto.vm.stats == {"eager": 1, "captures": 1, "replays": 5}


@gpu
def test_auto_replay_new_shapes_and_eviction():
    x, y, w1_0, w2_0 = _net()
    eager, _ = _step(cuda.mode(), w1_0, w2_0, x, y)
    auto, _ = _step(cuda.mode(graphs=True, max_graphs=1), w1_0, w2_0, x, y)
    r = np.random.default_rng(2)
    for i, b in enumerate([4, 4, 4, 6, 6, 4, 4, 6]):
        xb, yb = _batch(r, b)
        np.testing.assert_allclose(
            auto(xb, yb), eager(xb, yb), rtol=1e-5, err_msg=f"call {i}, batch {b}"
        )
    assert len(auto.vm._entries) == 1
    assert auto.vm.stats["captures"] >= 3


@gpu
def test_auto_replay_results_are_not_overwritten():
    x = pt.matrix("x", dtype="float32")
    w = cuda.shared(np.eye(3, dtype=np.float32), name="w")
    h = x @ w
    fn = pytensor.function([x], [h.sum(), h], mode=cuda.mode(graphs=True))
    r = np.random.default_rng(3)
    xs = [r.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]
    kept = [fn(v) for v in xs]
    for v, (s, hv) in zip(xs, kept, strict=True):
        np.testing.assert_allclose(s, v.sum(), rtol=1e-5)
        np.testing.assert_allclose(hv, v, rtol=1e-6)
    assert fn.vm.stats["replays"] >= 2


@gpu
def test_auto_replay_gpu_outputs_are_fresh_arrays():
    x = pt.matrix("x", dtype="float32")
    w = cuda.shared(np.eye(3, dtype=np.float32), name="w")
    out = cuda.gpu_from_host(x @ w)  # a GPU output
    fn = pytensor.function([x], out, mode=cuda.mode(graphs=True))
    r = np.random.default_rng(4)
    xs = [r.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]
    kept = [fn(v) for v in xs]
    for v, g in zip(xs, kept, strict=True):
        assert array.is_gpuarray(g)
        np.testing.assert_allclose(array.to_host(g), v, rtol=1e-6)


@gpu
def test_auto_replay_label_check_still_raises():
    x, y, w1_0, w2_0 = _net()
    auto, _ = _step(cuda.mode(graphs=True), w1_0, w2_0, x, y)
    r = np.random.default_rng(5)
    for _ in range(3):
        auto(*_batch(r, 4))
    assert auto.vm.stats["replays"] >= 1
    xb, yb = _batch(r, 4)
    yb[2] = 7  # classes = 7: out of range
    with pytest.raises(ValueError, match="label"):
        auto(xb, yb)


@gpu
def test_auto_replay_uncapturable_function_warns_once_and_runs_eagerly():
    x = pt.matrix("x", dtype="float32")
    w = cuda.shared(np.ones((3, 3), np.float32), name="w")
    fn = pytensor.function([x], pt.sort(x @ w, axis=1), mode=cuda.mode(graphs=True))
    r = np.random.default_rng(6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            v = r.standard_normal((4, 3)).astype(np.float32)
            np.testing.assert_allclose(
                fn(v), np.sort(v @ np.ones((3, 3)), axis=1), rtol=1e-5
            )
    replay = [w for w in caught if issubclass(w.category, ReplayWarning)]
    assert len(replay) == 1
    assert "runs eagerly: host op SortOp" in str(replay[0].message)
    assert fn.vm.stats == {"eager": 3, "captures": 0, "replays": 0}


@gpu
def test_auto_replay_host_shared_update_computed_on_gpu():
    x = pt.matrix("x", dtype="float32")
    w = cuda.shared(np.ones((3, 2), np.float32), name="w")
    acc_e = pytensor.shared(np.zeros(2, np.float32), name="acc")
    acc_a = pytensor.shared(np.zeros(2, np.float32), name="acc")
    fe = pytensor.function([x], [], updates=[(acc_e, acc_e + (x @ w).sum(0))],
                           mode=cuda.mode())  # fmt: skip
    fa = pytensor.function([x], [], updates=[(acc_a, acc_a + (x @ w).sum(0))],
                           mode=cuda.mode(graphs=True))  # fmt: skip
    r = np.random.default_rng(7)
    trace = [str(n.op) for n in fa.maker.fgraph.toposort()]
    for i in range(5):
        v = r.standard_normal((4, 3)).astype(np.float32)
        fe(v)
        fa(v)
        trace.append(f"call {i}: {acc_a.get_value()} vs {acc_e.get_value()}")
    assert fa.vm.stats["replays"] >= 3, fa.vm.stats
    np.testing.assert_allclose(
        acc_a.get_value(), acc_e.get_value(), rtol=1e-5,
        err_msg=f"{fa.vm.stats} {trace}",
    )  # fmt: skip
