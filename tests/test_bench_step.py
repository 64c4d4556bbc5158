"""benchmarks/bench_step.py on the CPU: its rows, bars and exit status on
made-up numbers, and the torch peers' loss checks on small nets.

The benchmark is loaded from its file: it is what these tests check (the nets
themselves come from cc2ops.testing, as test_architecture asks). The GPU half
(CUDA-graph capture and replay, torch.compile on CUDA, the timings) runs only
on a GPU, in ``python benchmarks/bench_step.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from cc2ops.testing.nets import StepConfig

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while it loads
    spec.loader.exec_module(mod)
    return mod


bench = _load("bench_step_under_test", ROOT / "benchmarks" / "bench_step.py")

PEERS = {"torch_eager": 10.0, "torch_graph": 6.0, "torch_compile": 8.0}
OK = {"ok": True, "max_rel": 1e-6}
CHECKS = {m: OK for m in ("eager", "capture", "auto", "torch_graph", "torch_compile")}


def _rows(cc2ops_ms: dict, times: dict = PEERS, errors: dict | None = None):
    peers = bench.peer_summary(times, errors or {})
    return {
        r["mode"]: r
        for r in bench.step_rows(
            "imagenet_step_b128", "imagenet", 128, "fp32", cc2ops_ms, peers, CHECKS,
            common={"dropout": 0.0},
        )
    }  # fmt: skip


# --------------------------------------------------------------------------
# rows and bars (pure)
# --------------------------------------------------------------------------


def test_peer_summary_takes_the_best_of_the_three():
    s = bench.peer_summary(PEERS, {})
    assert (s["peer_ms"], s["peer_best"], s["peers_missing"]) == (
        6.0,
        "torch_graph",
        [],
    )
    assert s["torch_eager_ms"] == 10.0 and s["torch_compile_ms"] == 8.0
    assert not any(k.endswith("_error") for k in s)


def test_a_failed_peer_is_kept_with_its_error_and_left_out_of_the_best():
    times = {"torch_eager": 10.0, "torch_graph": 6.0, "torch_compile": None}
    err = {"torch_compile": "BackendCompilerFailed: boom"}
    s = bench.peer_summary(times, err)
    assert s["torch_compile_ms"] is None
    assert s["torch_compile_error"] == "BackendCompilerFailed: boom"
    assert (s["peer_ms"], s["peer_best"]) == (6.0, "torch_graph")
    assert s["peers_missing"] == ["torch_compile"]
    # the fastest one failing: the best of the others, not the failed one's
    s = bench.peer_summary({"torch_eager": 10.0, "torch_compile": 8.0},
                           {"torch_graph": "capture failed"})  # fmt: skip
    assert (s["peer_ms"], s["peer_best"]) == (8.0, "torch_compile")
    assert s["torch_graph_ms"] is None and s["peers_missing"] == ["torch_graph"]


def test_peer_summary_rejects_an_unknown_peer():
    with pytest.raises(ValueError, match="unknown peers"):
        bench.peer_summary({"torch_jit": 1.0}, {})


def test_rows_carry_every_field_and_ratio_against_the_best():
    rows = _rows({"eager": 9.0, "capture": 4.0, "auto": 4.4})
    assert [r["name"] for r in rows.values()] == [
        "imagenet_step_b128", "imagenet_step_b128_graph", "imagenet_step_b128_auto",
    ]  # fmt: skip
    for mode, r in rows.items():
        assert r["mode"] == mode and r["pass"] == "step" and r["precision"] == "fp32"
        assert (r["torch_eager_ms"], r["torch_graph_ms"], r["torch_compile_ms"]) == (
            10.0, 6.0, 8.0,
        )  # fmt: skip
        assert r["peer_ms"] == 6.0 and r["peer_best"] == "torch_graph"
        assert r["ratio"] == pytest.approx(r["cc2ops_ms"] / 6.0)
        assert r["correct"] is True and r["dropout"] == 0.0
        assert r["torch_graph_correct"] is True and r["torch_compile_correct"] is True
        assert r["bar"] == bench.BARS[mode][0] and r["bar_limit"] == bench.BARS[mode][1]
    assert rows["eager"]["peer_images_per_s"] == pytest.approx(128 / 6e-3)


def test_each_mode_is_held_to_its_own_bar():
    # eager 9 <= 10 (torch eager, not the best torch); capture 4 <= 0.7 * 6;
    # auto 4.4 <= 1.15 * 4 (the capture row, not torch)
    rows = _rows({"eager": 9.0, "capture": 4.0, "auto": 4.4})
    assert rows["eager"]["bar_ratio"] == pytest.approx(0.9)
    assert rows["capture"]["bar_ratio"] == pytest.approx(4.0 / 6.0)
    assert rows["auto"]["bar_ratio"] == pytest.approx(1.1)
    assert all(r["bar_ok"] is True for r in rows.values())
    # each one just over its limit
    rows = _rows({"eager": 10.01, "capture": 4.21, "auto": 4.21 * 1.151})
    assert {m: r["bar_ok"] for m, r in rows.items()} == dict.fromkeys(rows, False)
    # eager is slower than the best torch (ratio > 1) yet meets its bar
    rows = _rows({"eager": 9.5, "capture": 4.0, "auto": 4.0})
    assert rows["eager"]["ratio"] > 1 and rows["eager"]["bar_ok"] is True


def test_a_bar_without_its_reference_time_is_unknown_not_met():
    times = {"torch_eager": None, "torch_graph": 6.0, "torch_compile": None}
    rows = _rows({"eager": 9.0, "capture": 4.0, "auto": 4.4}, times,
                 {"torch_eager": "OOM", "torch_compile": "boom"})  # fmt: skip
    assert rows["eager"]["bar_ok"] is None and rows["eager"]["bar_ratio"] is None
    assert rows["capture"]["bar_ok"] is True  # the best of those that ran
    rows = _rows({"eager": 9.0, "capture": 4.0, "auto": 4.4},
                 dict.fromkeys(PEERS), dict.fromkeys(PEERS, "failed"))  # fmt: skip
    for r in rows.values():
        assert r["peer_ms"] is None and r["ratio"] is None
    assert rows["capture"]["bar_ok"] is None
    assert rows["auto"]["bar_ok"] is True  # against cc2ops's own capture row


def test_a_peer_check_that_raised_reads_as_unknown():
    peers = bench.peer_summary(PEERS, {})
    checks = {**CHECKS, "torch_compile": {"ok": False, "max_rel": None,
                                          "error": "boom"},
              "torch_graph": {"ok": False, "max_rel": 0.5}}  # fmt: skip
    (row, *_) = bench.step_rows(
        "n", "cifar18", 128, "tf32", {"eager": 1.0, "capture": 1.0, "auto": 1.0},
        peers, checks,
    )  # fmt: skip
    assert row["torch_compile_correct"] is None
    assert row["torch_graph_correct"] is False


def test_exit_status():
    good = _rows({"eager": 9.0, "capture": 4.0, "auto": 4.4})
    assert bench.run_status(list(good.values()), []) == 0
    # a bar not met is a measurement, not a failure
    slow = _rows({"eager": 20.0, "capture": 20.0, "auto": 40.0})
    assert bench.run_status(list(slow.values()), []) == 0
    assert bench.run_status(list(good.values()), ["n: torch_compile failed"]) == 1
    assert bench.run_status([], []) == 1
    wrong = [dict(r) for r in good.values()]
    wrong[1]["correct"] = False
    assert bench.run_status(wrong, []) == 1


def test_default_nets_are_issue_18s():
    cfgs = bench.parse_nets(bench.DEFAULT_NETS, 128)
    assert [(c.net, c.batch) for c in cfgs] == [
        ("imagenet", 128), ("imagenet", 32), ("cifar18", 128),
    ]  # fmt: skip
    assert len({c.name for c in cfgs}) == 3


def test_summary_shows_the_peers_of_new_and_old_rows(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # summarize's `common`
    summarize = _load("summarize_under_test", ROOT / "benchmarks" / "summarize.py")
    for col in ("mode", "torch_eager_ms", "torch_graph_ms", "torch_compile_ms",
                "peer_best", "peer_ms", "bar_ok"):  # fmt: skip
        assert col in summarize.COLUMNS["step"]
    new = summarize.step_row_view(
        {
            "name": "x_step_b128",
            "mode": "eager",
            "peer_ms": 6.0,
            "torch_compile_ms": None,
            "torch_compile_error": "boom",
        }  # fmt: skip
    )
    assert new["torch_compile_ms"] == "error" and new["peer_ms"] == 6.0
    # a row of one peer, from before: that peer was torch eager
    old = summarize.step_row_view({"name": "x_step_b128_graph", "peer_ms": 15.2})
    assert (old["mode"], old["torch_eager_ms"], old["peer_best"]) == (
        "capture", 15.2, "torch_eager",
    )  # fmt: skip
    assert summarize.step_row_view({"name": "x_auto", "peer_ms": 1.0})["mode"] == "auto"


# --------------------------------------------------------------------------
# the peers' loss checks on the CPU
# --------------------------------------------------------------------------


def _small(net: str) -> StepConfig:
    return bench.host_check_config(StepConfig(net, batch=128, dropout=False))


def test_a_peer_that_raises_is_a_failed_check_not_a_crash():
    def make():
        raise RuntimeError("no graph for you\nsecond line")

    out, step = bench.check_peer("torch_graph", make, _small("cifar18"), 2,
                                 [1.0, 1.0], device="cpu")  # fmt: skip
    assert step is None and out["ok"] is False
    assert out["error"] == "RuntimeError: no graph for you | second line"


def test_the_graph_peer_restores_what_its_warmup_moved():
    """The graph peer's path with the step it captures run eagerly: from the
    same parameters, its losses are eager torch's only because the warm-up's
    moves are undone (without restore the check must fail)."""
    torch = pytest.importorskip("torch")
    small = _small("cifar18")
    params = small.init_params()
    ref = bench.torch_losses(
        bench.TorchStep(small, params, dropout=False, device="cpu").step, small, 3,
        device="cpu",
    )  # fmt: skip
    xt, yt = bench.torch_batch(*bench.minibatches(small, 1, seed=1)[0], "cpu")
    for restore in (True, False):
        g = bench.TorchGraphStep(
            bench.TorchStep(small, params, dropout=False, device="cpu"), xt, yt,
            capture=False, restore=restore,
        )  # fmt: skip
        got = bench.compare_losses(bench.torch_losses(g, small, 3, device="cpu"), ref)
        assert got["ok"] is restore, (restore, got)
        if restore:
            assert got["max_rel"] == 0.0
            # the static tensors were written by the last call, not replaced
            x_last, _ = bench.minibatches(small, 3, seed=11)[-1]
            assert torch.equal(g.static_x, torch.from_numpy(x_last))
    # the momentum buffers exist (the capture needs them) and restore zeroes them
    step = bench.TorchStep(small, params, dropout=False, device="cpu")
    snap = step.snapshot()
    step.step(xt, yt)
    step.restore(snap)
    bufs = [s["momentum_buffer"] for s in step.opt.state.values()]
    assert bufs and all(float(b.abs().max()) == 0.0 for b in bufs)
    fresh = bench.TorchStep(small, params, dropout=False, device="cpu")
    for k, v in step.p.items():
        np.testing.assert_array_equal(
            v.detach().numpy(), fresh.p[k].detach().numpy(), err_msg=k
        )


@pytest.mark.slow
def test_dry_run_checks_the_compiled_peer_on_the_cpu():
    """torch.compile (Inductor C++) of the loss and the SGD step, on cifar18's
    small copy, against torch eager -- the dry run's check. cifar18's average
    pools overhang with ceil_mode, where Inductor's gradient went wrong
    (pytorch/pytorch#198119) before the torch net used count_include_pad=False."""
    pytest.importorskip("torch")
    cfg = StepConfig("cifar18", batch=128, dropout=False)
    eager = bench.check_peer_on_host(cfg)
    assert eager["ok"], eager
    peers = bench.check_torch_peers_on_host(cfg, eager["torch_losses"])
    assert peers["torch_graph"]["ok"] is True, peers["torch_graph"]
    compiled = peers["torch_compile"]
    if "not_run" in compiled:
        pytest.skip(f"torch.compile not checked: {compiled['not_run']}")
    assert "error" not in compiled, compiled
    assert compiled["ok"] is True and compiled["max_rel"] < bench.LOSS_RTOL, compiled
    assert len(compiled["torch_compile_losses"]) == 3


def test_host_cost_is_per_node_and_barred_on_the_common_op_classes():
    by_op = [
        {"op": "GpuElemwise", "host_ms": 0.24, "nodes": 20},  # 12 us a node
        {"op": "GpuFilterActs", "host_ms": 0.07, "nodes": 5},  # 14 us
        {"op": "GpuCAReduce", "host_ms": 0.4, "nodes": 4},  # 100 us, not barred
        {"op": "GpuDimShuffle", "host_ms": 0.0, "nodes": 0},
    ]
    got = bench.host_cost(by_op)
    assert got["host_us_per_node"] == {
        "GpuElemwise": 12.0, "GpuFilterActs": 14.0, "GpuCAReduce": 100.0
    }  # fmt: skip
    assert got["host_bar_met"] and got["host_bar_worst_op"] == "GpuFilterActs"
    by_op[1]["host_ms"] = 0.08  # 16 us
    got = bench.host_cost(by_op)
    assert not got["host_bar_met"] and got["host_bar_worst_op"] == "GpuFilterActs"
    assert bench.host_cost(by_op[2:])["host_bar_met"] is False, "nothing barred"


def test_tape_coverage_counts_replaying_nodes_and_groups_the_others_by_reason():
    entries = [
        {"op": "GpuElemwise{add}", "tapes": 1, "plays": 9, "refusal": None},
        {"op": "GpuFilterActs(pad=2)", "tapes": 0, "plays": 0, "refusal": "upload"},
        {"op": "GpuFilterActs(pad=0)", "tapes": 0, "plays": 0, "refusal": "upload"},
        {"op": "GpuDot22", "tapes": 0, "plays": 0, "refusal": None},
        {"op": "GpuDot22", "tapes": 1, "plays": 1, "refusal": None},
    ]
    got = bench.tape_coverage(entries)
    assert got == {
        "taped_nodes": 5,
        "replaying_nodes": 2,
        "not_replaying": {
            "GpuFilterActs": {"upload": 2},
            "GpuDot22": {"no tape": 1},
        },
    }
    assert bench.tape_coverage([])["replaying_nodes"] == 0
