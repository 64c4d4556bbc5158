"""Whole ImageNet training step: cc2ops (GPU mode) vs the same net in PyTorch.

The cuda-convnet2 one-tower ImageNet net of ``benchmarks/step_net.py``
(batch 128, 224x224, cross-map norm, overlapping max pooling, momentum SGD
with weight decay) is timed as one training step:

- cc2ops: ``pytensor.function`` in ``cc2ops.cuda.mode()`` with
  ``cc2ops.cuda.shared`` parameters, GPU inputs (pre-uploaded minibatch) and
  GPU outputs, so a step never waits for the device; CUDA events on
  cc2ops's stream (``time_cuda(on="cc2ops")``).
- PyTorch: ``torch.nn.functional`` conv2d / relu / local_response_norm /
  max_pool2d(3, 2, ceil_mode=True) / linear / dropout / cross_entropy and
  ``torch.optim.SGD(momentum, weight_decay)``, ``cudnn.benchmark=True``;
  CUDA events on torch's stream.

Precisions: ``fp32`` (TF32 off in torch -- ``backends.cuda.matmul`` and
``backends.cudnn`` -- and in cc2ops) and ``tf32`` (on in both).

Stages; what a stage measured is kept (printed, and written to the JSON
file) when a later stage fails or the time budget runs out:

1. compile the cc2ops step with dropout off; build the torch step;
2. correctness: from the same parameters and minibatches, a few fp32 steps
   of both must give the same losses (relative 1e-3); rows carry the
   outcome (``correct``, ``loss_max_rel``) and a mismatch makes the exit
   status 1;
3. timing, fp32 then tf32: one row each (``pass`` "step", ``cc2ops_ms``,
   ``peer_ms``, ``ratio``, ``images_per_s``, ``peer_images_per_s``); the
   JSON file is written at once;
4. per-op breakdown: the step compiled with the Python VM
   (``cc2ops.cuda.mode(linker="py")``), each thunk wrapped to synchronise
   the device after it and timed, so GPU time is attributed to the op that
   launched it (each includes a launch and a sync, so the sum exceeds the
   asynchronous step time); the top 10 op classes go into each row as
   ``top_ops`` and the file is rewritten;
5. full runs only: the step with dropout 0.5 on both sides (different
   random masks, so not loss-checked; same work), rows ``..._dropout``.

``--quick``: batch 128, 2 loss-check steps, 2 warm-up + 8 timed steps per
precision and library, 2 breakdown steps, and a 90 s budget (``--budget``).
When the budget runs out the run stops where it is, and the rows so far are
written. ``--dry-run`` needs neither CUDA nor torch: it builds the graphs the
benchmark compiles and puts them through the GPU mode's rewrites (no
linking), printing their op counts and any host nodes.

Run: ``python benchmarks/bench_step.py [--quick] [--out DIR] [--dry-run]``.
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    base_parser,
    time_cuda,
    torch_peer,
    write_results,
)
from benchmarks.step_net import (  # noqa: E402
    NetConfig,
    build_step,
    imagenet_config,
    init_params,
)

LOSS_RTOL = 1e-3
QUICK = {"check_steps": 2, "warmup": 2, "iters": 8, "breakdown_steps": 2, "budget": 90}
PRECISIONS = (("fp32", False), ("tf32", True))

# --------------------------------------------------------------------------
# PyTorch peer
# --------------------------------------------------------------------------


class TorchStep:
    """The same net and optimiser in PyTorch (parameters from ``init_params``)."""

    def __init__(self, cfg: NetConfig, params: dict[str, np.ndarray], dropout: bool):
        import torch

        self.torch = torch
        self.cfg = cfg
        self.dropout = dropout and cfg.dropout > 0
        dev = torch.device("cuda")
        self.p: dict[str, Any] = {}
        for name, value in params.items():
            v = np.asarray(value)
            if name.startswith("fc") and name.endswith("_w"):
                v = v.T  # Linear.weight is (out, in)
            self.p[name] = torch.tensor(
                np.ascontiguousarray(v), device=dev, requires_grad=True
            )
        self.opt = torch.optim.SGD(
            list(self.p.values()),
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
        )

    def loss(self, x: Any, y: Any) -> Any:
        F = self.torch.nn.functional  # noqa: N806
        cfg, p = self.cfg, self.p
        h = x
        for i, layer in enumerate(cfg.conv):
            h = F.conv2d(
                h, p[f"conv{i + 1}_w"], p[f"conv{i + 1}_b"],
                stride=layer.stride, padding=layer.padding,
            )  # fmt: skip
            h = F.relu(h)
            if layer.norm:
                h = F.local_response_norm(
                    h, cfg.norm_size, alpha=cfg.norm_alpha, beta=cfg.norm_beta,
                    k=cfg.norm_k,
                )  # fmt: skip
            if layer.pool:
                h = F.max_pool2d(h, 3, 2, ceil_mode=True)
        h = h.flatten(1)
        for j in range(len(cfg.fc)):
            h = F.relu(F.linear(h, p[f"fc{j + 1}_w"], p[f"fc{j + 1}_b"]))
            if self.dropout:
                h = F.dropout(h, cfg.dropout, training=True)
        j = len(cfg.fc)
        logits = F.linear(h, p[f"fc{j + 1}_w"], p[f"fc{j + 1}_b"])
        return F.cross_entropy(logits, y)

    def step(self, x: Any, y: Any) -> Any:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(x, y)
        loss.backward()
        self.opt.step()
        return loss


def set_torch_tf32(flag: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = flag
    torch.backends.cudnn.allow_tf32 = flag


# --------------------------------------------------------------------------
# cc2ops
# --------------------------------------------------------------------------


def cc2ops_step(
    cfg: NetConfig, params: dict, *, dropout: bool, linker: str = "cvm"
) -> tuple[Any, Any]:
    """(Step, compiled function) of the GPU step: GPU params, inputs and outputs."""
    import cc2ops.cuda as cuda

    step = build_step(
        cfg, params, gpu_params=True, dropout=dropout, gpu_inputs=True,
        gpu_outputs=True,
    )  # fmt: skip
    return step, step.function(cuda.mode(linker=linker))


def minibatches(cfg: NetConfig, n: int, seed: int = 0) -> list[tuple]:
    r = np.random.default_rng(seed)
    shape = (cfg.batch, cfg.channels, cfg.image, cfg.image)
    return [
        (
            r.standard_normal(shape).astype(cfg.dtype),
            r.integers(0, cfg.classes, cfg.batch).astype("int32"),
        )
        for _ in range(n)
    ]


def check_losses(fn: Any, ref: TorchStep, cfg: NetConfig, steps: int) -> dict:
    """fp32, dropout off: losses of ``steps`` steps of both from one init."""
    import torch

    from cc2ops.cuda import allow_tf32, array

    ours, theirs = [], []
    set_torch_tf32(False)
    with allow_tf32(False):
        for x, y in minibatches(cfg, steps, seed=11):
            loss, _ = fn(array.to_gpu(x, 0), array.to_gpu(y, 0))
            ours.append(float(array.to_host(loss)))
            xt = torch.tensor(x, device="cuda")
            yt = torch.tensor(y.astype("int64"), device="cuda")
            theirs.append(float(ref.step(xt, yt)))
    rel = max(
        abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, theirs, strict=True)
    )
    ok = bool(np.isfinite(ours).all() and rel < LOSS_RTOL)
    return {"cc2ops_losses": ours, "torch_losses": theirs, "max_rel": rel, "ok": ok}


class SyncedThunks:
    """Per-op-class time of a Python-VM function, the device synchronised per thunk.

    Wraps ``fn.vm.thunks`` once (the Python VMs call them through that list);
    :meth:`run` returns the top op classes over some steps.
    """

    def __init__(self, fn: Any, device: int = 0) -> None:
        from cc2ops.cuda.device import get_device

        self.fn = fn
        self.dev = get_device(device)
        self.acc: dict[str, float] = defaultdict(float)
        vm = fn.vm
        if not hasattr(vm, "thunks") or not hasattr(vm, "nodes"):
            raise TypeError(f"SyncedThunks: {type(vm).__name__} has no thunk list")
        self.nodes = Counter(type(n.op).__name__ for n in vm.nodes)
        vm.thunks = [
            self._wrap(t, type(n.op).__name__)
            for t, n in zip(vm.thunks, vm.nodes, strict=True)
        ]

    def _wrap(self, thunk: Callable, key: str) -> Callable:
        acc, dev = self.acc, self.dev

        def run() -> Any:
            t0 = time.perf_counter()
            out = thunk()
            dev.synchronize()
            acc[key] += time.perf_counter() - t0
            return out

        for attr in ("inputs", "outputs", "lazy", "perform"):
            if hasattr(thunk, attr):
                setattr(run, attr, getattr(thunk, attr))
        return run

    def run(self, args: tuple, steps: int, tf32: bool, top: int = 10) -> dict:
        from cc2ops.cuda import allow_tf32

        with allow_tf32(tf32):
            self.fn(*args)  # warm-up: kernels compiled and loaded
            self.dev.synchronize()
            self.acc.clear()
            t0 = time.perf_counter()
            for _ in range(steps):
                self.fn(*args)
            self.dev.synchronize()
            wall = time.perf_counter() - t0
        total = sum(self.acc.values())
        ranked = sorted(self.acc.items(), key=lambda kv: -kv[1])[:top]
        return {
            "synced_step_ms": 1e3 * wall / steps,
            "top_ops": [
                {
                    "op": name,
                    "ms_per_step": 1e3 * t / steps,
                    "share": t / total if total else 0.0,
                    "nodes": self.nodes[name],
                }
                for name, t in ranked
            ],
        }


# --------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------


class BudgetExceeded(BaseException):
    """The time budget ran out (a BaseException: library code does not catch it)."""


@contextmanager
def time_budget(seconds: float | None) -> Iterator[None]:
    """Raise :class:`BudgetExceeded` in the main thread after ``seconds``."""
    if not seconds or seconds <= 0:
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise BudgetExceeded(f"time budget of {seconds:.0f} s exhausted")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, old)


class Report:
    """The rows measured so far, written to JSON on every :meth:`save`."""

    def __init__(self, out: Path, settings: dict) -> None:
        self.out = out
        self.rows: list[dict] = []
        self.extra: dict[str, Any] = {"settings": settings, "errors": []}
        self.peer = "torch (not loaded)"
        self.path: Path | None = None

    def save(self) -> None:
        if self.rows:
            self.path = write_results(
                "step", self.rows, self.peer, self.out, extra=self.extra
            )

    def print_breakdowns(self) -> None:
        for row in self.rows:
            if "top_ops" not in row:
                continue
            print(
                f"\ncc2ops per-op time, {row['name']} {row['precision']} (device "
                f"synchronised per thunk; {row['synced_step_ms']:.1f} ms/step so):"
            )
            for r in row["top_ops"]:
                print(
                    f"  {r['op']:<32} {r['ms_per_step']:8.3f} ms "
                    f"{100 * r['share']:5.1f}%  ({r['nodes']} nodes)"
                )


def log(t0: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True)


def time_rows(
    report: Report, name: str, cfg: NetConfig, fn: Any, ref: TorchStep, args: dict,
    check: dict, dropout: float, t0: float,
) -> list[dict]:  # fmt: skip
    """Time ``fn`` and ``ref`` at each precision; one row each, saved at once."""
    from cc2ops.cuda import allow_tf32

    rows = []
    gx, gy, xt, yt = args["gx"], args["gy"], args["xt"], args["yt"]
    for precision, tf32 in PRECISIONS:
        set_torch_tf32(tf32)
        with allow_tf32(tf32):
            ours = time_cuda(
                lambda: fn(gx, gy), warmup=args["warmup"], iters=args["iters"],
                on="cc2ops",
            )  # fmt: skip
            theirs = time_cuda(
                lambda: ref.step(xt, yt), warmup=args["warmup"], iters=args["iters"]
            )
        set_torch_tf32(False)
        row = {
            "name": name,
            "batch": cfg.batch,
            "pass": "step",
            "precision": precision,
            "cc2ops_ms": ours,
            "peer_ms": theirs,
            "ratio": ours / theirs,
            "images_per_s": cfg.batch / (ours / 1e3),
            "peer_images_per_s": cfg.batch / (theirs / 1e3),
            "dropout": dropout,
            "timed_steps": args["iters"],
            "correct": check["ok"],
            "loss_max_rel": check["max_rel"],
        }
        report.rows.append(row)
        rows.append(row)
        log(t0, f"{name} {precision}: cc2ops {ours:.2f} ms, torch {theirs:.2f} ms")
        report.save()
    return rows


def run(cfg: NetConfig, settings: dict, report: Report, quick: bool) -> None:
    import torch

    from cc2ops.cuda import array

    t0 = time.perf_counter()
    torch.backends.cudnn.benchmark = True
    report.peer = torch_peer()
    params = init_params(cfg, seed=0)

    log(t0, "compiling the cc2ops step (dropout off)")
    _, fn = cc2ops_step(cfg, params, dropout=False)
    ref = TorchStep(cfg, params, dropout=False)
    log(t0, f"checking losses over {settings['check_steps']} fp32 steps")
    check = check_losses(fn, ref, cfg, settings["check_steps"])
    report.extra["loss_check"] = check
    verdict = "agree" if check["ok"] else "DIFFER"
    log(
        t0,
        f"losses {verdict} (max rel {check['max_rel']:.2e}): cc2ops "
        f"{check['cc2ops_losses']} torch {check['torch_losses']}",
    )
    if not check["ok"]:
        report.extra["errors"].append(
            f"cc2ops and torch losses differ: max rel {check['max_rel']:.3e}"
        )

    x, y = minibatches(cfg, 1, seed=1)[0]
    args = {
        "gx": array.to_gpu(x, 0),
        "gy": array.to_gpu(y, 0),
        "xt": torch.tensor(x, device="cuda"),
        "yt": torch.tensor(y.astype("int64"), device="cuda"),
        "warmup": settings["warmup"],
        "iters": settings["iters"],
    }
    name = f"imagenet_step_b{cfg.batch}"
    rows = time_rows(report, name, cfg, fn, ref, args, check, 0.0, t0)

    log(t0, "compiling the step with the Python VM for the per-op breakdown")
    _, pfn = cc2ops_step(cfg, params, dropout=False, linker="py")
    synced = SyncedThunks(pfn)
    for row, (precision, tf32) in zip(rows, PRECISIONS, strict=True):
        row.update(
            synced.run((args["gx"], args["gy"]), settings["breakdown_steps"], tf32)
        )
        log(t0, f"breakdown {precision}: {row['synced_step_ms']:.1f} ms/step synced")
        report.save()

    if quick:
        return
    log(t0, "compiling the cc2ops step with dropout")
    dcfg = cfg.with_(dropout=0.5) if cfg.dropout <= 0 else cfg
    _, dfn = cc2ops_step(dcfg, params, dropout=True)
    dref = TorchStep(dcfg, params, dropout=True)
    time_rows(report, f"{name}_dropout", dcfg, dfn, dref, args, check, dcfg.dropout, t0)


# --------------------------------------------------------------------------
# dry run (CPU)
# --------------------------------------------------------------------------


def dry_run(cfg: NetConfig, quick: bool) -> int:
    """Build and rewrite every graph the benchmark compiles; no CUDA, no torch."""
    from pytensor.compile.rebuild import construct_function_ins_and_outs

    import cc2ops.cuda as cuda
    from cc2ops.cuda.op import GpuOp

    params = init_params(cfg, seed=0)
    graphs = [
        ("timed step, dropout off (cvm)", False, "cvm"),
        ("breakdown step, dropout off (py VM)", False, "py"),
    ]
    if not quick:
        graphs.append(("timed step, dropout 0.5 (cvm)", True, "cvm"))
    status = 0
    for label, dropout, linker in graphs:
        t0 = time.perf_counter()
        c = cfg.with_(dropout=0.5) if dropout and cfg.dropout <= 0 else cfg
        step = build_step(
            c, params, gpu_params=True, dropout=dropout, gpu_inputs=True,
            gpu_outputs=True,
        )  # fmt: skip
        mode = cuda.mode(linker=linker)
        ins, outs = construct_function_ins_and_outs(
            step.inputs, step.outputs, updates=step.updates
        )
        fgraph = mode.function_maker(ins, outs, mode, on_unused_input="ignore").fgraph
        dt = time.perf_counter() - t0
        nodes = list(fgraph.apply_nodes)
        host = [n for n in nodes if not isinstance(n.op, GpuOp)]
        print(
            f"{label}: batch {c.batch}, {len(nodes)} nodes ({len(host)} on the "
            f"host), built and rewritten in {dt:.1f} s"
        )
        for op, k in Counter(type(n.op).__name__ for n in nodes).most_common():
            print(f"  {op:<32} {k}")
        if host:
            print(f"  host nodes: {sorted({str(n.op) for n in host})}")
        on_arrays = [str(n.op) for n in host if _is_array(n)]
        if on_arrays:
            status = 1
            print(f"  ERROR: host nodes compute on float arrays: {on_arrays}")
    return status


def _is_array(node: Any) -> bool:
    """Whether a host node touches float arrays (shape arithmetic does not)."""
    return any(
        str(getattr(v.type, "dtype", "")).startswith("float")
        and getattr(v.type, "ndim", 0) > 0
        for v in node.inputs + node.outputs
    )


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"hard cap on the run in seconds (default {QUICK['budget']} with "
        "--quick, none otherwise); when it runs out the rows so far are written",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU only: build and rewrite the benchmark's graphs (no CUDA, no torch)",
    )
    args = p.parse_args(argv)
    cfg = imagenet_config(batch=args.batch, dropout=0.0)
    if args.dry_run:
        return dry_run(cfg, args.quick)
    settings = {
        "batch": args.batch,
        "check_steps": QUICK["check_steps"] if args.quick else 3,
        "warmup": QUICK["warmup"] if args.quick else args.warmup,
        "iters": QUICK["iters"] if args.quick else args.iters,
        "breakdown_steps": QUICK["breakdown_steps"] if args.quick else 5,
        "budget_s": args.budget if args.budget is not None else (
            QUICK["budget"] if args.quick else None
        ),
        "quick": args.quick,
    }  # fmt: skip
    report = Report(args.out, settings)
    report.extra["timing"] = (
        "CUDA events, median: cc2ops stream for cc2ops, torch stream for torch; "
        "top_ops: Python VM, device synchronised after each thunk"
    )
    failed = False
    try:
        with time_budget(settings["budget_s"]):
            run(cfg, settings, report, args.quick)
    except BudgetExceeded as e:
        failed = True
        report.extra["errors"].append(str(e))
        print(f"\nbench_step: {e}; keeping what was measured", file=sys.stderr)
    except Exception as e:  # keep the rows measured before the failure
        failed = True
        traceback.print_exc()
        report.extra["errors"].append(f"{type(e).__name__}: {e}")
    if report.rows:
        report.save()  # the final table, with any errors recorded
        report.print_breakdowns()
    else:
        print("bench_step: no rows measured", file=sys.stderr)
    for err in report.extra["errors"]:
        print(f"bench_step: {err}", file=sys.stderr)
    correct = all(r.get("correct", False) for r in report.rows)
    return 1 if failed or not report.rows or not correct else 0


if __name__ == "__main__":
    sys.exit(main())
