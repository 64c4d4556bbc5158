"""The graph-replayed steps of the ImageNet example (examples/imagenet/gpu_step.py)
on the CPU: the runner's logic with the device faked, and the training graph
with GPU inputs and outputs built and rewritten by the GPU mode (no CUDA)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("tqdm")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "imagenet"
sys.path.insert(0, str(EXAMPLE))

import gpu_step  # noqa: E402
import train  # noqa: E402


def host_history(capacity):
    """A DeviceHistory whose 'device' columns are numpy arrays."""
    return gpu_step.DeviceHistory(
        0,
        capacity,
        copy=lambda col, row, v: col.__setitem__(row, v),
        alloc=lambda n, dtype: np.zeros(n, dtype),
        read_column=lambda col, rows: col[:rows].copy(),
    )


class FakeStep:
    """train_fn(x, y, lr) -> (loss, err): loss = lr * sum(x), err = len(y)."""

    def __init__(self, nan_at=None):
        self.calls = []
        self.nan_at = nan_at

    def __call__(self, x, y, lr):
        self.calls.append(float(np.asarray(lr)))
        loss = np.float32(float(np.asarray(lr)) * float(np.sum(x)))
        if self.nan_at is not None and len(self.calls) == self.nan_at:
            loss = np.float32("nan")
        return loss, np.float32(len(y))


def fake_eval(x, y):
    return np.float32(np.sum(x)), np.int64(len(y)), np.int64(1)


def make_runner(step, log_every=3, graph=True):
    captured = []
    kept = []
    snapshots = []

    def capture(fn):
        captured.append(fn)

        def replay(*args):
            return fn(*args)

        return replay

    def keep(fn, args, device):
        kept.append(np.asarray(args[0]).shape)
        return fn(*args)

    def snapshot(fn):
        snapshots.append(fn)
        return lambda: None

    runner = gpu_step.GraphRunner(
        step, fake_eval, 0, log_every, graph=graph, capture=capture,
        history=host_history, keep_buffers=keep, to_device=lambda a: a,
        snapshot=snapshot,
    )  # fmt: skip
    runner.snapshots = snapshots
    return runner, captured, kept


def test_steps_are_read_back_every_log_every_steps_with_their_own_lr():
    step = FakeStep()
    runner, captured, kept = make_runner(step, log_every=3)
    x = np.ones((4, 3, 2, 2), np.float32)
    y = np.zeros(4, np.int32)
    returned = []
    for s in range(1, 8):
        done = runner.train(x, y, 0.1 * s, s)
        returned.append([m.step for m in done])
    assert returned == [[], [], [1, 2, 3], [], [], [4, 5, 6], []]
    (last,) = runner.flush()
    assert last.step == 7 and last.n == 4
    assert last.loss == pytest.approx(0.7 * 48, rel=1e-6)
    assert last.lr == pytest.approx(0.7)
    # the learning rate reached every call: never baked into the graph (the
    # first step twice: the capture's warm-up, undone, then its replay)
    want = [0.1] + [0.1 * s for s in range(1, 8)]
    assert step.calls == pytest.approx(want, rel=1e-6)
    assert len(captured) == 1 and runner.replays == 7 and kept == []
    assert runner.snapshots == [step]
    assert runner.flush() == []


def test_a_batch_of_another_size_runs_eagerly_keeping_the_graphs_buffers():
    runner, captured, kept = make_runner(FakeStep(), log_every=2)
    big, small = np.ones((4, 3, 2, 2), np.float32), np.ones((3, 3, 2, 2), np.float32)
    runner.train(big, np.zeros(4, np.int32), 0.1, 1)
    done = runner.train(small, np.zeros(3, np.int32), 0.1, 2)
    assert [m.n for m in done] == [4, 3]
    assert kept == [(3, 3, 2, 2)] and runner.replays == 1


class CounterStep:
    """A step with state, as a training step has: each call adds lr to
    ``state`` and returns the state it started from as its loss."""

    def __init__(self):
        self.state = 0.0
        self.calls = 0

    def __call__(self, x, y, lr):
        self.calls += 1
        before = self.state
        self.state += float(np.asarray(lr))
        return np.float32(before), np.float32(0.0)


def test_the_captures_warm_up_is_undone_and_its_batch_replayed():
    """Every full-size step is a replay, the first of a run too: a resumed run
    then computes each step as the uninterrupted run did."""
    step = CounterStep()
    events = []

    def capture(fn):
        events.append("capture")

        def call(*args):
            events.append("call")
            return fn(*args)

        return call

    def snapshot(fn):
        saved = fn.state
        events.append("snapshot")

        def restore():
            events.append("restore")
            fn.state = saved

        return restore

    runner = gpu_step.GraphRunner(
        step, fake_eval, 0, 3, capture=capture, history=host_history,
        to_device=lambda a: a, snapshot=snapshot,
    )  # fmt: skip
    x = np.ones((2, 3, 2, 2), np.float32)
    done = []
    for s in range(1, 4):
        done += runner.train(x, np.zeros(2, np.int32), 1.0, s)
    assert events == ["capture", "snapshot", "call", "restore", "call", "call", "call"]
    assert step.calls == 4
    # the warm-up's update was undone: three steps, three updates
    assert step.state == 3.0
    assert [m.loss for m in done] == [0.0, 1.0, 2.0]
    assert runner.replays == 3


def test_no_graph_calls_eagerly_and_still_reads_back_every_log_every_steps():
    runner, captured, kept = make_runner(FakeStep(), log_every=2, graph=False)
    x = np.ones((2, 3, 2, 2), np.float32)
    assert runner.train(x, np.zeros(2, np.int32), 0.1, 1) == []
    assert len(runner.train(x, np.zeros(2, np.int32), 0.1, 2)) == 2
    assert captured == [] and runner.replays == 0 and len(kept) == 2


def test_a_nan_comes_back_with_its_step():
    # call 3 is step 2's (call 1 is the capture's warm-up, call 2 step 1's replay)
    runner, _, _ = make_runner(FakeStep(nan_at=3), log_every=4)
    x = np.ones((2, 3, 2, 2), np.float32)
    for s in range(1, 4):
        runner.train(x, np.zeros(2, np.int32), 0.1, s)
    done = runner.flush()
    assert [np.isnan(m.loss) for m in done] == [False, True, False]
    assert done[1].step == 2


def test_evaluation_replays_only_after_the_training_graph_and_sums_every_batch():
    runner, captured, _ = make_runner(FakeStep(), log_every=2)
    runner._eval_hist = host_history(2)  # wraps around: 5 batches
    x = np.ones((2, 3, 2, 2), np.float32)
    runner.evaluate(x, np.zeros(2, np.int32))
    assert captured == []  # no training graph yet: evaluation stays eager
    runner.train(x, np.zeros(2, np.int32), 0.1, 1)
    for _ in range(3):
        runner.evaluate(x, np.zeros(2, np.int32))
    runner.evaluate(x[:1], np.zeros(1, np.int32))  # the last, partial batch
    assert len(captured) == 2
    assert runner.eval_sums() == (4 * 24 + 12, 9, 5)
    assert runner.eval_sums() == (0, 0, 0)


def test_the_gpu_training_graph_has_gpu_inputs_outputs_and_no_host_float_work(
    monkeypatch,
):
    """train.compile_functions with graph_device: what capture_function needs."""
    import pytensor
    from pytensor.compile.rebuild import construct_function_ins_and_outs

    import cc2ops.cuda as cuda
    from cc2ops.cuda.op import GpuOp
    from cc2ops.cuda.type import CudaArrayType

    built = []

    def fake_function(inputs, outputs, updates=None, mode=None, name=None):
        built.append((inputs, outputs, updates or [], mode, name))
        return name

    monkeypatch.setattr(pytensor, "function", fake_function)
    backend = train.Backend(
        "cuda:0", cuda.mode(device=0),
        lambda v, name: cuda.shared(v, device=0, name=name),
        dropout_device=0, graph_device=0,
    )  # fmt: skip
    net = train.nets.Network("small", 10, 32, 0.25)
    values = net.init_params([0, 1], "he")
    params = {k: backend.shared(values[k], k) for k in net.param_shapes}
    moms = {k: backend.shared(np.zeros_like(v), f"{k}.m") for k, v in values.items()}
    states = net.make_dropout_states([0, 2], device=0)
    cfg = train.argparse.Namespace(crop=32, weight_decay=5e-4, momentum=0.9)
    train.compile_functions(net, params, moms, states, cfg, backend)
    assert [b[4] for b in built] == ["train_step", "evaluate"]
    for inputs, outputs, updates, mode, name in built:
        assert all(isinstance(v.type, CudaArrayType) for v in inputs), name
        assert all(isinstance(v.type, CudaArrayType) for v in outputs), name
        assert all(isinstance(p.type, CudaArrayType) for p, _ in updates), name
        ins, outs = construct_function_ins_and_outs(inputs, outputs, updates=updates)
        fgraph = mode.function_maker(ins, outs, mode, on_unused_input="ignore").fgraph
        host_float = [
            str(n.op)
            for n in fgraph.apply_nodes
            if not isinstance(n.op, GpuOp)
            and any(
                str(getattr(v.type, "dtype", "")).startswith("float")
                and getattr(v.type, "ndim", 0) > 0
                for v in n.inputs + n.outputs
            )
        ]
        assert host_float == [], (name, host_float)
    lr_in = built[0][0][2]
    assert lr_in.type.ndim == 0 and lr_in.type.dtype == "float32"


def test_data_device_gpu_needs_one_cuda_device(tmp_path):
    args = ["--synthetic", "--net", "small", "--width-mult", "0.25", "--batch-size",
            "8", "--quiet", "--no-progress", "--out", str(tmp_path / "o")]  # fmt: skip
    with pytest.raises(train.DeviceError, match="data-device gpu needs --device cuda"):
        train.main([*args, "--data-device", "gpu"])
    assert not (tmp_path / "o").exists()


def test_calls_until_the_capture_hold_the_device_work_lock():
    """The GPU pipeline's loader queues no device work while a graph captures."""
    held = []

    class Captured:
        graph = None

        def __call__(self, x, y, lr):
            held.append(gpu_step.DEVICE_WORK.locked())
            if len(held) == 2:
                self.graph = object()  # captured on the second call
            return np.float32(1.0), np.float32(0.0)

    runner = gpu_step.GraphRunner(
        FakeStep(), fake_eval, 0, 10, capture=lambda fn: Captured(),
        history=host_history, to_device=lambda a: a, snapshot=lambda fn: lambda: None,
    )  # fmt: skip
    x = np.ones((2, 3, 2, 2), np.float32)
    for s in range(1, 4):
        runner.train(x, np.zeros(2, np.int32), 0.1, s)
    # step 1: the warm-up and the capture; steps 2 and 3: replays
    assert held == [True, True, False, False]
    assert not gpu_step.DEVICE_WORK.locked()
