"""Automatic CUDA-graph replay: ``cc2ops.cuda.mode(graphs=True)``.

CPU tests: :func:`capture_plan` on rewritten graphs (capturable steps; host
work on values, host dropout state and multi-device graphs refused, each with
its reason) and the mode's argument checks. CPU tests of the chunked staging
of host inputs (:func:`stage_upload`, against a fake driver that records each
queued upload): the chunks cover the input in order, each is fully staged when
its upload is queued, and a failed chunk stops the uploads at it. GPU tests: a
training step with host minibatches and GPU parameters gives the eager
function's losses and parameters call after call while replaying; inputs large
enough to be staged in chunks give the right results; new shapes capture new
graphs within ``max_graphs``; returned host and GPU values are never
overwritten by a later call; the softmax label check still raises after
capture; a function that cannot be captured warns once and runs eagerly with
the right values; an updated host shared variable computed on the GPU follows
the eager one.
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


def test_replay_vm_sets_foreign_attributes_on_the_vm_it_wraps():
    x = pt.vector("x")
    fgraph = FunctionGraph([x], [2 * x], clone=False)

    class FakeVM:
        def __init__(self):
            self.storage_map = {v: [None] for v in fgraph.variables}
            self.thunks = ["t0"]

    vm = FakeVM()
    rvm = ReplayVM(vm, fgraph)
    assert rvm.thunks == ["t0"]
    rvm.thunks = ["wrapped"]  # what a profiler does
    assert vm.thunks == ["wrapped"] and "thunks" not in rvm.__dict__
    rvm.allow_gc = False
    assert vm.allow_gc is False
    rvm.stats = {"eager": 1}  # the wrapper's own
    assert rvm.__dict__["stats"] == {"eager": 1} and not hasattr(vm, "stats")
    assert not rvm.plan.capturable  # a host-only graph


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
# CPU: staging host inputs in chunks, each uploaded once it is copied
# --------------------------------------------------------------------------


class _FakeLanding:
    """What stage_upload reads of a GPUArray: its device address."""

    def __init__(self, address, shape):
        self.gpudata, self.shape = address, shape


class _FakeDriver:
    """Records each queued upload: (device address, the bytes it would copy
    at the time it was queued, stream)."""

    def __init__(self):
        self.uploads = []

    def memcpy_htod_async(self, dest, src, stream):
        self.uploads.append((int(dest), np.array(src).tobytes(), stream))


@pytest.fixture
def fake_driver(monkeypatch):
    from cc2ops.cuda.runtime import availability

    drv = _FakeDriver()
    monkeypatch.setattr(availability, "driver", lambda: drv)
    return drv


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_stage_upload_chunks_cover_the_input_in_order(monkeypatch, fake_driver, rows):
    from cc2ops.cuda import replay

    monkeypatch.setattr(replay, "PARALLEL_COPY_BYTES", 1)
    monkeypatch.setattr(replay, "UPLOAD_CHUNK_BYTES", 3 * 5 * 4 * 2)  # 2 rows
    src = np.random.default_rng(0).standard_normal((rows, 3, 5)).astype(np.float32)
    src = src[:, :, ::-1]  # not C-contiguous: the staging copy reorders it
    pinned = np.empty(src.shape, np.float32)
    base = 1 << 40
    replay.stage_upload(pinned, _FakeLanding(base, src.shape), src, "stream")
    np.testing.assert_array_equal(pinned, src)
    row = 3 * 5 * 4
    expected = [(base + a * row, src[a : min(rows, a + 2)]) for a in range(0, rows, 2)]
    assert [u[0] for u in fake_driver.uploads] == [e[0] for e in expected]
    for (_, data, stream), (_, chunk) in zip(
        fake_driver.uploads, expected, strict=True
    ):
        # each chunk was fully staged when its upload was queued
        assert data == np.ascontiguousarray(chunk).tobytes()
        assert stream == "stream"


def test_stage_upload_small_inputs_are_one_copy_and_one_upload(fake_driver):
    from cc2ops.cuda.replay import stage_upload

    src = np.arange(12, dtype=np.int32).reshape(3, 4)
    pinned = np.zeros_like(src)
    stage_upload(pinned, _FakeLanding(4096, src.shape), src, None)
    assert fake_driver.uploads == [(4096, src.tobytes(), None)]
    stage_upload(np.zeros((0, 4), np.int32), _FakeLanding(0, (0, 4)),
                 np.zeros((0, 4), np.int32), None)  # fmt: skip
    assert len(fake_driver.uploads) == 1  # nothing queued for an empty input


def test_stage_upload_rejects_a_shape_mismatch(fake_driver):
    from cc2ops.cuda.replay import stage_upload

    with pytest.raises(ValueError, match=r"input has shape \(2, 3\), the staging"):
        stage_upload(np.zeros((3, 2), np.float32), _FakeLanding(0, (3, 2)),
                     np.zeros((2, 3), np.float32), None)  # fmt: skip
    assert fake_driver.uploads == []


def test_stage_upload_a_failed_chunk_raises_after_the_chunks_before_it(
    monkeypatch, fake_driver
):
    from cc2ops.cuda import replay

    monkeypatch.setattr(replay, "PARALLEL_COPY_BYTES", 1)
    monkeypatch.setattr(replay, "UPLOAD_CHUNK_BYTES", 4)  # one row per chunk
    real = replay._copy_rows

    def copy_rows(dst, src):
        if src[0, 0] == 3:
            raise MemoryError("chunk 3")
        real(dst, src)

    monkeypatch.setattr(replay, "_copy_rows", copy_rows)
    src = np.arange(6, dtype=np.float32).reshape(6, 1)
    with pytest.raises(MemoryError, match="chunk 3"):
        replay.stage_upload(np.zeros((6, 1), np.float32), _FakeLanding(0, (6, 1)),
                            src, None)  # fmt: skip
    assert [u[0] for u in fake_driver.uploads] == [0, 4, 8]  # rows 0-2 only


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
def test_auto_replay_large_inputs_staged_in_chunks(monkeypatch):
    """Inputs above the parallel threshold go through the chunked staging and
    upload; every call's result follows its own input."""
    from cc2ops.cuda import replay

    monkeypatch.setattr(replay, "PARALLEL_COPY_BYTES", 1 << 10)
    monkeypatch.setattr(replay, "UPLOAD_CHUNK_BYTES", 1 << 12)
    x = pt.matrix("x", dtype="float32")
    w = cuda.shared(np.full((64, 2), 0.5, np.float32), name="w")
    gx = cuda.gpu_from_host(x)
    # the uploaded input read twice (2 * gx may overwrite it in place)
    outs = [(gx @ w).sum(0), (2 * gx).max(0)]
    fn = pytensor.function([x], outs, mode=cuda.mode(graphs=True))
    r = np.random.default_rng(8)
    for i in range(5):
        v = r.standard_normal((257, 64)).astype(np.float32)  # 64 KiB, 17 chunks
        s, m = fn(v)
        np.testing.assert_allclose(s, (v @ np.full((64, 2), 0.5)).sum(0), rtol=1e-4,
                                   err_msg=f"call {i}")  # fmt: skip
        np.testing.assert_allclose(m, 2 * v.max(0), rtol=1e-6, err_msg=f"call {i}")
    assert fn.vm.stats == {"eager": 1, "captures": 1, "replays": 4}


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
