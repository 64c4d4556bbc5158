"""Whole training steps of the cuda-convnet2 nets: cc2ops (GPU mode) vs PyTorch.

Every net of :mod:`cc2ops.testing.nets` (the table the example trains), by
default all three: ``imagenet`` (``layers-imagenet-1gpu.cfg``, 224x224),
``small`` (cuda-convnet2's CIFAR-10 11pct, 32x32) and ``cifar18``
(cuda-convnet's CIFAR-10 18pct, 32x32), at batch 128, each timed as one
training step of :func:`cc2ops.testing.nets.build_step` (momentum SGD with
weight decay on the weights, the example's rule) -- the very graph
``examples/imagenet/train.py`` trains:

- cc2ops, eager: ``pytensor.function`` in ``cc2ops.cuda.mode()`` with
  ``cc2ops.cuda.shared`` parameters, GPU inputs (pre-uploaded minibatch) and
  GPU outputs, so a step never waits for the device; CUDA events on
  cc2ops's stream (``time_cuda(on="cc2ops")``). Rows ``<net>_step_b<batch>``
  (``imagenet_step_b128``).
- cc2ops, graph: the same function wrapped by
  :func:`cc2ops.cuda.capture_function`, so that each step replays one CUDA
  graph (no Python per node). Rows ``..._graph``.
- cc2ops, auto: the step as a user writes it -- host numpy minibatches in,
  host loss and error out -- compiled in ``cc2ops.cuda.mode(graphs=True)``
  (automatic graph replay, :mod:`cc2ops.cuda.replay`: inputs staged through
  pinned buffers and uploaded inside the graph, outputs downloaded inside it,
  one synchronisation per call). Rows ``..._auto``.
- PyTorch (:class:`TorchStep`), the peer of all three: the same table entry
  (``StepConfig.network()``), layer for layer in its order (ImageNet: conv1,
  rnorm1, pool1 + ReLU, ...), in ``torch.nn.functional`` (conv2d /
  local_response_norm / max_pool2d and avg_pool2d with ``ceil_mode=True`` /
  linear / relu / dropout / cross_entropy), from the same initial
  parameters, and ``torch.optim.SGD(momentum)`` with ``weight_decay`` on the
  weights' parameter group (with a constant rate the same update as
  cc2ops's); ``cudnn.benchmark=True``, eager; CUDA events on torch's
  stream. All rows of a net and precision carry the same torch time.

``--net`` takes a comma-separated list of nets, each optionally with its
batch (``--net imagenet,cifar18:64``; a bare name uses ``--batch``). Every
row carries ``net``, and one result file holds them all. Rows keep the
fields of the project's result format (``name``, ``batch``, ``pass``
"step", ``precision``, ``cc2ops_ms``, ``peer_ms``, ``ratio``) and add
``net``, ``images_per_s``, ``peer_images_per_s``, ``replay``, ``dropout``,
``timed_steps``, ``correct`` and ``loss_max_rel``.

Precisions: ``fp32`` (TF32 off in torch -- ``backends.cuda.matmul`` and
``backends.cudnn`` -- and in cc2ops) and ``tf32`` (on in both). A captured
graph bakes in the precision it was captured with, so each precision
captures its own.

Stages, net by net; what a stage measured is kept (printed, and written to
the JSON file) when a later stage fails or the time budget runs out:

1. compile the cc2ops step with dropout off; build the torch step;
2. correctness: from the same parameters and minibatches, a few fp32 steps
   of both must give the same losses (relative 1e-3), eagerly, replayed as
   a graph and automatically replayed (each against a fresh torch net);
   rows carry the outcome (``correct``, ``loss_max_rel``) and a mismatch
   makes the exit status 1;
3. timing, fp32 then tf32: eager, graph and auto rows; the JSON file is
   written at once;
4. per-op breakdown: the step compiled with the Python VM
   (``cc2ops.cuda.mode(linker="py")``) and profiled node by node with
   :class:`cc2ops.cuda.runtime.profile.ThunkProfile`: device time (each node's
   kernels run back to back behind a held stream) and host time apart; the
   ten op classes with the most device time go into each eager row as
   ``top_ops``, with the step's summed ``device_ms`` and ``host_ms``;
5. full runs only, nets with dropout layers (ImageNet): the step with its
   dropout 0.5 on both sides (different random masks, so not loss-checked;
   same work), rows ``..._dropout``.

``--quick``: 2 loss-check steps, 2 warm-up + 8 timed steps per precision and
library, 1 profiled step, and a 120 s budget per net (``--budget``). When a
net's budget runs out its run stops where it is, the rows so far are
written and the next net runs. Without a GPU the run says so, measures
nothing and exits 0. ``--dry-run`` needs no CUDA: it builds the graphs the
benchmark compiles and puts them through the GPU mode's rewrites (no
linking), printing their op counts and any host nodes; where torch is
installed it then runs the loss check of stage 2 on the CPU, the torch peer
against cc2ops's host step on a small copy of each net
(:func:`check_peer_on_host`).

Run: ``python benchmarks/bench_step.py [--quick] [--out DIR] [--dry-run]
[--net NET[:BATCH],...] [--batch N]``.
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
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
from cc2ops.testing.nets import (  # noqa: E402
    FC,
    NETS,
    Conv,
    Dropout,
    Pool,
    RNorm,
    StepConfig,
    build_step,
)

LOSS_RTOL = 1e-3
QUICK = {"check_steps": 2, "warmup": 2, "iters": 8, "breakdown_steps": 1, "budget": 120}
PRECISIONS = (("fp32", False), ("tf32", True))

# --------------------------------------------------------------------------
# PyTorch peer
# --------------------------------------------------------------------------


class TorchStep:
    """The same net and optimiser in PyTorch (parameters from ``cfg.init_params``).

    The layer list of ``cfg.network()`` -- the table entry cc2ops's step is
    built from -- walked in its order in ``torch.nn.functional``, each
    layer's ReLU after it where the table puts one; weight decay on the
    weights only, as :func:`cc2ops.testing.nets.training_step`. A layer type
    without a torch form here raises ``TypeError`` (never skipped).
    ``device``: torch's device ("cuda"; the dry run's check uses "cpu").
    """

    def __init__(
        self, cfg: StepConfig, params: dict[str, np.ndarray], dropout: bool,
        device: str = "cuda",
    ) -> None:  # fmt: skip
        import torch

        self.torch = torch
        self.cfg = cfg
        self.net = cfg.network()
        self.dropout = dropout and self.net.has_dropout
        dev = torch.device(device)
        self.p: dict[str, Any] = {}
        for name, value in params.items():
            v = np.asarray(value)
            layer = self.net.layer(name.split(".")[0])
            if isinstance(layer, FC) and name.endswith(".W"):
                v = v.T  # Linear.weight is (out, in)
            self.p[name] = torch.tensor(
                np.ascontiguousarray(v), device=dev, requires_grad=True
            )
        weights = [v for k, v in self.p.items() if k.endswith(".W")]
        biases = [v for k, v in self.p.items() if not k.endswith(".W")]
        self.opt = torch.optim.SGD(
            [
                {"params": weights, "weight_decay": cfg.weight_decay},
                {"params": biases, "weight_decay": 0.0},
            ],
            lr=cfg.lr,
            momentum=cfg.momentum,
        )

    def loss(self, x: Any, y: Any) -> Any:
        F = self.torch.nn.functional  # noqa: N806
        p = self.p
        h = x
        for layer in self.net.layers:
            if isinstance(layer, Conv):
                h = F.conv2d(
                    h, p[f"{layer.name}.W"], p[f"{layer.name}.b"],
                    stride=layer.stride, padding=layer.pad, groups=layer.groups,
                )  # fmt: skip
            elif isinstance(layer, Pool):
                pool = F.max_pool2d if layer.kind == "max" else F.avg_pool2d
                h = pool(h, layer.size, layer.stride, ceil_mode=True)
            elif isinstance(layer, RNorm):
                h = F.local_response_norm(
                    h, layer.size, alpha=layer.alpha, beta=layer.beta, k=layer.k
                )
            elif isinstance(layer, FC):
                h = F.linear(h.flatten(1), p[f"{layer.name}.W"], p[f"{layer.name}.b"])
            elif isinstance(layer, Dropout):
                if self.dropout:
                    h = F.dropout(h, layer.p, training=True)
            else:
                raise TypeError(
                    f"TorchStep: no torch form of {type(layer).__name__} "
                    f"(layer {layer.name} of net {self.net.name!r})"
                )
            if getattr(layer, "relu", False):
                h = F.relu(h)
        return F.cross_entropy(h, y)

    def step(self, x: Any, y: Any) -> Any:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(x, y)
        loss.backward()
        self.opt.step()
        return loss.detach()


def set_torch_tf32(flag: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = flag
    torch.backends.cudnn.allow_tf32 = flag


# --------------------------------------------------------------------------
# cc2ops
# --------------------------------------------------------------------------


def cc2ops_step(
    cfg: StepConfig, params: dict, *, dropout: bool, linker: str = "cvm",
    auto: bool = False,
) -> tuple[Any, Any]:  # fmt: skip
    """(Step, compiled function) of the GPU step: GPU params, GPU inputs and
    outputs; with ``auto``, host inputs and outputs and automatic replay."""
    import cc2ops.cuda as cuda

    step = build_step(
        cfg.with_(dropout=dropout), params, gpu_params=True, gpu_inputs=not auto,
        gpu_outputs=not auto,
    )  # fmt: skip
    return step, step.function(cuda.mode(linker=linker, graphs=auto))


def _host_call(fn: Any) -> Any:
    """``fn`` (host inputs) called with the GPU arrays ``check_losses`` passes."""
    from cc2ops.cuda.runtime import array

    return lambda gx, gy: fn(array.to_host(gx), array.to_host(gy))


def minibatches(cfg: StepConfig, n: int, seed: int = 0) -> list[tuple]:
    r = np.random.default_rng(seed)
    return [
        (
            r.standard_normal(cfg.image_shape).astype(np.float32),
            r.integers(0, cfg.classes, cfg.batch).astype("int32"),
        )
        for _ in range(n)
    ]


def check_losses(fn: Any, ref: TorchStep, cfg: StepConfig, steps: int) -> dict:
    """fp32, dropout off: losses of ``steps`` steps of both from one init."""
    import torch

    from cc2ops.cuda import allow_tf32
    from cc2ops.cuda.runtime import array

    ours, theirs = [], []
    set_torch_tf32(False)
    with allow_tf32(False):
        for x, y in minibatches(cfg, steps, seed=11):
            loss, _ = fn(array.to_gpu(x, 0), array.to_gpu(y, 0))
            ours.append(float(array.to_host(loss)))
            xt = torch.tensor(x, device="cuda")
            yt = torch.tensor(y.astype("int64"), device="cuda")
            theirs.append(float(ref.step(xt, yt)))
    return compare_losses(ours, theirs)


def compare_losses(ours: list[float], theirs: list[float]) -> dict:
    """The loss check's verdict: finite cc2ops losses within ``LOSS_RTOL``
    (relative, the largest over the steps) of torch's."""
    rel = max(
        abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, theirs, strict=True)
    )
    ok = bool(np.isfinite(ours).all() and rel < LOSS_RTOL)
    return {"cc2ops_losses": ours, "torch_losses": theirs, "max_rel": rel, "ok": ok}


def host_check_config(cfg: StepConfig) -> StepConfig:
    """``cfg``'s net, small enough for the dry run's CPU check: batch 4, and
    the ImageNet net at 1/8 width on 67 x 67 inputs (same layers, same order)."""
    if cfg.net == "imagenet":
        return cfg.with_(batch=4, crop=67, width_mult=cfg.width_mult / 8)
    return cfg.with_(batch=4)


def check_peer_on_host(cfg: StepConfig, steps: int = 3) -> dict:
    """The torch peer against cc2ops's host step (``cc2ops.mode``) on the CPU.

    Same table entry (:func:`host_check_config` of ``cfg``), same parameters
    and minibatches, dropout off, ``steps`` steps; the GPU run's verdict
    (:func:`compare_losses`). What it catches before any GPU time is spent: a
    torch net that is not the table's (layer order, ReLU placement, pooling
    or normalisation parameters, the update rule).
    """
    import torch

    import cc2ops

    small = host_check_config(cfg).with_(dropout=False)
    params = small.init_params()
    fn = build_step(small, params).function(cc2ops.mode)
    ref = TorchStep(small, params, dropout=False, device="cpu")
    ours, theirs = [], []
    for x, y in minibatches(small, steps, seed=11):
        ours.append(float(fn(x, y)[0]))
        xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype("int64"))
        theirs.append(float(ref.step(xt, yt)))
    out = compare_losses(ours, theirs)
    out["checked"] = {"net": small.net, "batch": small.batch, "crop": small.crop,
                      "width_mult": small.width_mult, "steps": steps}  # fmt: skip
    return out


def breakdown(fn: Any, args: tuple, steps: int, tf32: bool, top: int = 10) -> dict:
    """Per-op device and host time of a Python-VM step (ThunkProfile)."""
    from cc2ops.cuda import allow_tf32
    from cc2ops.cuda.runtime.profile import ThunkProfile

    prof = ThunkProfile(fn)
    with allow_tf32(tf32):
        res = prof.run(*args, steps=steps, warmup=1)
    return {
        "device_ms_summed": res["device_ms"],
        "host_ms_summed": res["host_ms"],
        "synchronizing_nodes": res["synchronizing_nodes"],
        "top_ops": [
            {
                "op": e["op"],
                "device_ms": e["device_ms"],
                "host_ms": e["host_ms"],
                "share": e["device_ms"] / res["device_ms"] if res["device_ms"] else 0.0,
                "nodes": e["nodes"],
            }
            for e in res["by_op"][:top]
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
                f"\ncc2ops per-op time, {row['name']} {row['precision']}: device "
                f"{row['device_ms_summed']:.2f} ms, host {row['host_ms_summed']:.2f} "
                "ms per step (summed over nodes; ThunkProfile):"
            )
            for r in row["top_ops"]:
                print(
                    f"  {r['op']:<32} device {r['device_ms']:8.3f} ms "
                    f"{100 * r['share']:5.1f}%  host {r['host_ms']:7.3f} ms "
                    f"({r['nodes']} nodes)"
                )


def log(t0: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True)


def time_rows(
    report: Report, name: str, cfg: StepConfig, fn: Any, gfn: Any, ref: TorchStep,
    args: dict, checks: dict, dropout: float, t0: float,
) -> list[dict]:  # fmt: skip
    """Time ``fn`` eagerly, ``gfn`` replayed as a graph, ``args["auto"]`` (host
    inputs, automatic replay) and ``ref`` at each precision; three rows per
    precision (eager, graph, auto), saved at once."""
    from cc2ops.cuda import allow_tf32, capture_function

    rows = []
    gx, gy, xt, yt = args["gx"], args["gy"], args["xt"], args["yt"]
    afn, hx, hy = args["auto"], args["hx"], args["hy"]
    for precision, tf32 in PRECISIONS:
        set_torch_tf32(tf32)
        with allow_tf32(tf32):
            ours = time_cuda(
                lambda: fn(gx, gy), warmup=args["warmup"], iters=args["iters"],
                on="cc2ops",
            )  # fmt: skip
            # a graph bakes in the precision it is captured with: one each
            captured = capture_function(gfn, warmup=1)
            try:
                graphed = time_cuda(
                    lambda c=captured: c(gx, gy), warmup=args["warmup"],
                    iters=args["iters"], on="cc2ops",
                )  # fmt: skip
                nodes = captured.graph.nodes if captured.graph is not None else 0
            finally:
                captured.close()
            # automatic replay captures per signature, and the precision is
            # part of what a capture bakes in: a fresh function per precision
            auto = afn()
            autoed = time_cuda(
                lambda a=auto: a(hx, hy), warmup=max(args["warmup"], 2),
                iters=args["iters"], on="cc2ops",
            )  # fmt: skip
            auto_stats = dict(auto.vm.stats)
            auto.vm.close()
            theirs = time_cuda(
                lambda: ref.step(xt, yt), warmup=args["warmup"], iters=args["iters"]
            )
        set_torch_tf32(False)
        for suffix, ms, check, extra in (
            ("", ours, checks["eager"], {"replay": "eager"}),
            ("_graph", graphed, checks["graph"],
             {"replay": "cuda graph", "graph_nodes": nodes}),
            ("_auto", autoed, checks["auto"],
             {"replay": "automatic (graphs=True), host inputs and outputs",
              "auto_stats": auto_stats, "auto_vs_graph": autoed / graphed}),
        ):  # fmt: skip
            row = {
                "name": name + suffix,
                "net": cfg.net,
                "batch": cfg.batch,
                "pass": "step",
                "precision": precision,
                "cc2ops_ms": ms,
                "peer_ms": theirs,
                "ratio": ms / theirs,
                "images_per_s": cfg.batch / (ms / 1e3),
                "peer_images_per_s": cfg.batch / (theirs / 1e3),
                "dropout": dropout,
                "timed_steps": args["iters"],
                "correct": check["ok"],
                "loss_max_rel": check["max_rel"],
                **extra,
            }
            report.rows.append(row)
            rows.append(row)
        log(
            t0,
            f"{name} {precision}: cc2ops eager {ours:.2f} ms, graph {graphed:.2f} ms, "
            f"auto {autoed:.2f} ms, torch {theirs:.2f} ms",
        )
        report.save()
    return rows


def run(cfg: StepConfig, settings: dict, report: Report, quick: bool) -> None:
    import torch

    from cc2ops.cuda import capture_function
    from cc2ops.cuda.runtime import array

    t0 = time.perf_counter()
    torch.backends.cudnn.benchmark = True
    report.peer = torch_peer()
    params = cfg.init_params()

    log(t0, f"{cfg.name}: compiling the cc2ops step (dropout off), eager and graph")
    _, fn = cc2ops_step(cfg, params, dropout=False)
    _, gfn = cc2ops_step(cfg, params, dropout=False)

    def auto_fn() -> Any:
        return cc2ops_step(cfg, params, dropout=False, auto=True)[1]

    n = settings["check_steps"]
    log(t0, f"{cfg.name}: checking losses over {n} fp32 steps against torch")
    checks = {
        "eager": check_losses(fn, TorchStep(cfg, params, dropout=False), cfg, n),
        "graph": check_losses(
            capture_function(gfn, warmup=1),
            TorchStep(cfg, params, dropout=False), cfg, n,
        ),
        "auto": check_losses(
            _host_call(auto_fn()), TorchStep(cfg, params, dropout=False), cfg, n
        ),
    }  # fmt: skip
    report.extra["loss_check"][cfg.name] = checks
    for kind, check in checks.items():
        verdict = "agree" if check["ok"] else "DIFFER"
        log(
            t0,
            f"{cfg.name} {kind} losses {verdict} (max rel {check['max_rel']:.2e}): "
            f"cc2ops {check['cc2ops_losses']} torch {check['torch_losses']}",
        )
        if not check["ok"]:
            report.extra["errors"].append(
                f"{cfg.name}: cc2ops ({kind}) and torch losses differ: max rel "
                f"{check['max_rel']:.3e}"
            )
    ref = TorchStep(cfg, params, dropout=False)

    x, y = minibatches(cfg, 1, seed=1)[0]
    args = {
        "gx": array.to_gpu(x, 0),
        "gy": array.to_gpu(y, 0),
        "xt": torch.tensor(x, device="cuda"),
        "yt": torch.tensor(y.astype("int64"), device="cuda"),
        "hx": x,
        "hy": y,
        "auto": auto_fn,
        "warmup": settings["warmup"],
        "iters": settings["iters"],
    }
    name = cfg.name
    rows = time_rows(report, name, cfg, fn, gfn, ref, args, checks, 0.0, t0)

    log(t0, f"{cfg.name}: compiling the step with the Python VM (per-op breakdown)")
    _, pfn = cc2ops_step(cfg, params, dropout=False, linker="py")
    eager_rows = [r for r in rows if r["replay"] == "eager"]
    for row, (precision, tf32) in zip(eager_rows, PRECISIONS, strict=True):
        row.update(
            breakdown(pfn, (args["gx"], args["gy"]), settings["breakdown_steps"], tf32)
        )
        log(
            t0,
            f"{cfg.name} breakdown {precision}: device "
            f"{row['device_ms_summed']:.2f} ms, host {row['host_ms_summed']:.2f} ms "
            "per step (summed over nodes)",
        )
        report.save()

    drops = [layer.p for layer in cfg.network().dropout_layers()]
    if quick or not drops:
        return
    log(t0, f"{cfg.name}: compiling the cc2ops step with dropout")
    _, dfn = cc2ops_step(cfg, params, dropout=True)
    _, dgfn = cc2ops_step(cfg, params, dropout=True)
    dref = TorchStep(cfg, params, dropout=True)
    dargs = {
        **args,
        "auto": lambda: cc2ops_step(cfg, params, dropout=True, auto=True)[1],
    }
    time_rows(report, f"{name}_dropout", cfg, dfn, dgfn, dref, dargs, checks,
              max(drops), t0)  # fmt: skip


# --------------------------------------------------------------------------
# dry run (CPU)
# --------------------------------------------------------------------------


def dry_run(cfg: StepConfig, quick: bool) -> int:
    """Build and rewrite every graph the benchmark compiles (no CUDA), then,
    where torch is installed, :func:`check_peer_on_host`; 1 if either fails."""
    from pytensor.compile.rebuild import construct_function_ins_and_outs

    import cc2ops.cuda as cuda
    from cc2ops.cuda.op import GpuOp

    params = cfg.init_params()
    from cc2ops.cuda.replay import capture_plan

    graphs = [
        ("timed step, dropout off (cvm)", False, "cvm", False),
        ("breakdown step, dropout off (py VM)", False, "py", False),
        ("auto step, host inputs, dropout off (graphs=True)", False, "cvm", True),
    ]
    if not quick and cfg.network().has_dropout:
        graphs.append(("timed step, dropout 0.5 (cvm)", True, "cvm", False))
        graphs.append(("auto step, dropout 0.5 (graphs=True)", True, "cvm", True))
    status = 0
    for label, dropout, linker, auto in graphs:
        t0 = time.perf_counter()
        c = cfg.with_(dropout=dropout)
        step = build_step(
            c, params, gpu_params=True, gpu_inputs=not auto, gpu_outputs=not auto
        )
        mode = cuda.mode(linker=linker, graphs=auto)
        ins, outs = construct_function_ins_and_outs(
            step.inputs, step.outputs, updates=step.updates
        )
        fgraph = mode.function_maker(ins, outs, mode, on_unused_input="ignore").fgraph
        dt = time.perf_counter() - t0
        nodes = list(fgraph.apply_nodes)
        host = [n for n in nodes if not isinstance(n.op, GpuOp)]
        print(
            f"{c.name} {label}: batch {c.batch}, {len(nodes)} nodes ({len(host)} "
            f"on the host), built and rewritten in {dt:.1f} s"
        )
        for op, k in Counter(type(n.op).__name__ for n in nodes).most_common():
            print(f"  {op:<32} {k}")
        if host:
            print(f"  host nodes: {sorted({str(n.op) for n in host})}")
        if auto:
            plan = capture_plan(fgraph)
            print(f"  automatic replay: {plan.capturable} {plan.reason}")
            if not plan.capturable:
                status = 1
        on_arrays = [str(n.op) for n in host if _is_array(n) and not auto]
        if on_arrays:
            status = 1
            print(f"  ERROR: host nodes compute on float arrays: {on_arrays}")
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"{cfg.name} torch peer: not checked (torch is not installed)")
        return status
    t0 = time.perf_counter()
    check = check_peer_on_host(cfg)
    c = check["checked"]
    verdict = "agree" if check["ok"] else "DIFFER"
    print(
        f"{cfg.name} torch peer on the CPU ({c['net']}, batch {c['batch']}, "
        f"{c['crop']}x{c['crop']}, width x{c['width_mult']:g}, {c['steps']} steps, "
        f"{time.perf_counter() - t0:.1f} s): losses {verdict} (max rel "
        f"{check['max_rel']:.2e}, tolerance {LOSS_RTOL:g}): cc2ops "
        f"{check['cc2ops_losses']} torch {check['torch_losses']}"
    )
    return status if check["ok"] else 1


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


def parse_nets(spec: str, batch: int) -> list[StepConfig]:
    """``"imagenet,cifar18:64"`` -> step configs, in order (dropout off: the
    dropout rows turn it on themselves).

    Each comma-separated item is a net of :data:`cc2ops.testing.nets.NETS`,
    optionally with ``:BATCH`` (default ``batch``). ``ValueError`` for an
    unknown net, a bad batch, an empty list or an item given twice.
    """
    configs: list[StepConfig] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, _, b = item.partition(":")
        if name not in NETS:
            raise ValueError(
                f"--net {item}: unknown net {name!r}; choose from {', '.join(NETS)}"
            )
        try:
            n = int(b) if b else batch
        except ValueError:
            raise ValueError(
                f"--net {item}: the batch after ':' must be an int, got {b!r}"
            ) from None
        if n < 1:
            raise ValueError(f"--net {item}: the batch must be >= 1, got {n}")
        cfg = StepConfig(name, batch=n, dropout=False)
        if any(c.name == cfg.name for c in configs):
            raise ValueError(f"--net: {name} at batch {n} is given twice")
        configs.append(cfg)
    if not configs:
        raise ValueError(f"--net {spec!r}: no net given; choose from {', '.join(NETS)}")
    return configs


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument(
        "--net",
        default=",".join(NETS),
        metavar="NET[:BATCH],...",
        help="comma-separated nets of cc2ops.testing.nets to time, in order, each "
        f"with an optional batch (default: all of them, {','.join(NETS)})",
    )
    p.add_argument(
        "--batch", type=int, default=128, help="batch of a --net without ':BATCH'"
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"hard cap per net in seconds (default {QUICK['budget']} with "
        "--quick, none otherwise); when it runs out the rows so far are written",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU only: build and rewrite the benchmark's graphs (no CUDA) and, "
        "where torch is installed, check the torch peer against cc2ops on the CPU",
    )
    args = p.parse_args(argv)
    try:
        configs = parse_nets(args.net, args.batch)
    except ValueError as e:
        p.error(str(e))
    if args.dry_run:
        return max([dry_run(cfg, args.quick) for cfg in configs])
    import cc2ops.cuda as cuda

    if not cuda.is_available():
        print(
            f"bench_step: no GPU here ({cuda.unavailable_reason()}); nothing measured"
        )
        return 0
    settings = {
        "nets": [[cfg.net, cfg.batch] for cfg in configs],
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
    report.extra["loss_check"] = {}
    report.extra["timing"] = (
        "CUDA events, median: cc2ops stream for cc2ops (eager, and replayed as a "
        "CUDA graph), torch stream for torch (eager); top_ops: Python VM, "
        "ThunkProfile (each node's device time behind a held stream)"
    )
    failed = False
    for cfg in configs:
        try:
            with time_budget(settings["budget_s"]):
                run(cfg, settings, report, args.quick)
        except BudgetExceeded as e:
            failed = True
            report.extra["errors"].append(f"{cfg.name}: {e}")
            print(f"\nbench_step: {cfg.name}: {e}; keeping what was measured",
                  file=sys.stderr)  # fmt: skip
        except Exception as e:  # keep the rows measured before the failure
            failed = True
            traceback.print_exc()
            report.extra["errors"].append(f"{cfg.name}: {type(e).__name__}: {e}")
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
