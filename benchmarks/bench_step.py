"""Whole training steps of the cuda-convnet2 nets: cc2ops (GPU mode) vs PyTorch.

Nets of :mod:`cc2ops.testing.nets` (the table the example trains), by default
those of issue 18: ``imagenet`` (``layers-imagenet-1gpu.cfg``, 224x224) at
batch 128 and at batch 32, and ``cifar18`` (cuda-convnet's CIFAR-10 18pct,
32x32) at batch 128 (``small``, cuda-convnet2's CIFAR-10 11pct, when asked
for), each timed as one training step of
:func:`cc2ops.testing.nets.build_step` (momentum SGD with weight decay on the
weights, the example's rule) -- the very graph ``examples/imagenet/train.py``
trains. cc2ops runs the step three ways, a row's ``mode``:

- ``eager``: ``pytensor.function`` in ``cc2ops.cuda.mode()`` with
  ``cc2ops.cuda.shared`` parameters, GPU inputs (pre-uploaded minibatch) and
  GPU outputs, so a step never waits for the device; CUDA events on
  cc2ops's stream (``time_cuda(on="cc2ops")``). Rows ``<net>_step_b<batch>``
  (``imagenet_step_b128``).
- ``capture``: the same function wrapped by
  :func:`cc2ops.cuda.capture_function`, so that each step replays one CUDA
  graph (no Python per node). A call copies its GPU arguments (the
  pre-uploaded minibatch) into the graph's input buffers, device to device,
  then replays. Rows ``..._graph``.
- ``auto``: the step as a user writes it -- host numpy minibatches in, host
  loss and error out -- compiled in ``cc2ops.cuda.mode(graphs=True)``
  (automatic graph replay, :mod:`cc2ops.cuda.replay`: inputs staged through
  pinned buffers and uploaded inside the graph, outputs downloaded inside it,
  one synchronisation per call). Rows ``..._auto``.

PyTorch, the peers of all three, timed in the same run: the same table entry
(``StepConfig.network()``) as :class:`TorchStep`, layer for layer in its order
(ImageNet: conv1, rnorm1, pool1 + ReLU, ...), in ``torch.nn.functional``
(conv2d / local_response_norm / max_pool2d and avg_pool2d with
``ceil_mode=True``, the average over the window clipped to the image /
linear / relu / dropout / cross_entropy), from the same
initial parameters, and ``torch.optim.SGD(momentum)`` with ``weight_decay``
on the weights' parameter group (with a constant rate the same update as
cc2ops's); ``cudnn.benchmark=True``; CUDA events on torch's stream
(``time_cuda(on="torch")``). Three ways a user runs that step:

- ``torch_eager``: :meth:`TorchStep.step` (zero_grad, forward, backward,
  optimizer step), eagerly.
- ``torch_graph``: :class:`TorchGraphStep`, the whole step in one
  ``torch.cuda.CUDAGraph`` as PyTorch's CUDA-graph notes document
  whole-network capture: :data:`GRAPH_WARMUP` steps on a side stream (cuDNN's
  algorithms chosen, the momentum buffers made), static input tensors, then
  zero_grad (``set_to_none``: the captured backward allocates the gradients
  from the graph's pool), forward, backward and ``optimizer.step()``
  captured. The timed call copies the minibatch into the static tensors and
  replays (copy + replay): the same work per call as cc2ops's ``capture``
  row, whose call copies its arguments into the graph's buffers too.
- ``torch_compile``: :class:`TorchCompiledStep`, ``torch.compile`` (default
  mode, Inductor) of the loss (the model's forward; its backward is compiled
  with it) and of the optimizer's step (PyTorch compiles SGD with momentum,
  its "compiled optimizer" recipe); ``zero_grad`` and the ``backward()``
  call stay Python, as for any torch.compile user. The calls that compile
  are not timed; their wall seconds are the row's ``torch_compile_s``.
  Dynamo's recompile limit raises (``fail_on_recompile_limit_hit``) rather
  than falling back to eager without a word.

All rows of a net and precision carry the same torch times. A peer that
fails (built, captured, compiled, checked or timed) is not dropped: its time
is null, ``<peer>_error`` holds the error's text, ``peer_ms`` is the best of
those that ran, and the run exits 1.

``--net`` takes a comma-separated list of nets, each optionally with its
batch (``--net imagenet,cifar18:64``; a bare name uses ``--batch``). One
result file holds all rows. Rows keep the fields of the project's result
format (``name``, ``batch``, ``pass`` "step", ``precision``, ``cc2ops_ms``,
``peer_ms``, ``ratio``), with ``peer_ms`` the best (smallest) of the torch
peers' times and ``ratio`` = ``cc2ops_ms / peer_ms``, and add ``net``,
``mode``, ``torch_eager_ms``, ``torch_graph_ms``, ``torch_compile_ms``,
``peer_best`` (which peer is ``peer_ms``), ``peers_missing``,
``torch_compile_s``, ``<peer>_error`` where one failed, ``images_per_s``,
``peer_images_per_s``, ``replay``, ``dropout``, ``timed_steps``,
``correct`` and ``loss_max_rel`` (cc2ops's loss check in this mode),
``torch_graph_correct`` and ``torch_compile_correct`` (the peers' loss
checks; null where it could not run), and the bar of the row's mode
(issue 18) as ``bar`` (the rule), ``bar_ratio``, ``bar_limit`` and
``bar_ok`` (null where what it is measured against is missing):

- ``eager``: ``cc2ops_ms <= 1.0 x torch_eager_ms``;
- ``auto``: ``cc2ops_ms <= 1.15 x`` the ``capture`` row's ``cc2ops_ms``
  (same net, precision and dropout);
- ``capture``: ``cc2ops_ms <= 0.7 x peer_ms`` (the best torch).

Precisions: ``fp32`` (TF32 off in torch -- ``backends.cuda.matmul`` and
``backends.cudnn`` -- and in cc2ops) and ``tf32`` (on in both). A captured
graph bakes in the precision it was captured with, so each precision
captures its own, in both libraries; torch.compile guards on the TF32 flag,
so the tf32 warm-up may recompile (counted in that row's ``torch_compile_s``).

Stages, net by net; what a stage measured is kept (printed, and written to
the JSON file) when a later stage fails or the time budget runs out:

1. compile the cc2ops step with dropout off;
2. correctness: from the same parameters and minibatches, a few fp32 steps
   must give the same losses (relative 1e-3): cc2ops eagerly, captured and
   automatically replayed, each against a fresh torch eager step, then the
   torch graph and compiled peers, each from a fresh copy of the initial
   parameters, against torch eager's losses. The graph peer's side-stream
   warm-up steps move its parameters and make its momentum buffers; before
   the capture the parameters are put back and the buffers zeroed (with
   dampening 0 a zero buffer is the same as none: the first update is the
   gradient), so its first replay is the first step from the initial
   parameters. The compiled peer's check steps are its first calls: they
   compile, and that compiled step is the one timed. Rows carry the outcome
   (``correct``, ``loss_max_rel``, ``torch_*_correct``) and a mismatch
   makes the exit status 1;
3. timing, fp32 then tf32: eager, capture and auto rows with the three
   torch peers; the JSON file is written at once;
4. per-op breakdown: the step compiled with the Python VM
   (``cc2ops.cuda.mode(linker="py")``) and profiled node by node with
   :class:`cc2ops.cuda.runtime.profile.ThunkProfile`: device time (each node's
   kernels run back to back behind a held stream) and host time apart; the
   ten op classes with the most device time go into each eager row as
   ``top_ops``, with the step's summed ``device_ms`` and ``host_ms``, and
   the host cost per node of every op class (``host_us_per_node``, after
   four warm-up calls so that launch tapes replay) with issue 18's bar:
   ``host_bar_met`` when no class of :data:`HOST_BAR_OPS` exceeds 15 us;
5. full runs only, nets with dropout layers (ImageNet): the step with its
   dropout 0.5 on both sides and in every torch peer (different random
   masks, so not loss-checked; same work), rows ``..._dropout``.

``--quick``: 2 loss-check steps, 3 warm-up + 8 timed steps per precision and
library, 1 profiled step, and a 180 s budget per net (``--budget``; the
compiled peer's compiles take part of it). When a net's budget runs out its
run stops where it is, the rows so far are written and the next net runs.
Without a GPU the run says so, measures nothing and exits 0. ``--dry-run``
needs no CUDA: it builds the graphs the benchmark compiles and puts them
through the GPU mode's rewrites (no linking), printing their op counts and
any host nodes; where torch is installed it then runs the loss checks of
stage 2 on the CPU on a small copy of each net (:func:`host_check_config`):
the torch peer against cc2ops's host step (:func:`check_peer_on_host`) and
the graph and compiled peers against torch eager
(:func:`check_torch_peers_on_host`). CUDA-graph capture cannot run on the
CPU: the dry run checks the graph peer's warm-up, restore and static-input
path with the step it would capture run eagerly in its place, not the
capture itself. torch.compile compiles for the CPU with Inductor's C++
backend; where no C++ compiler is found the compiled peer's check is
printed as not run, with the reason, and does not fail the dry run (a
missing tool here is not a wrong step, and the GPU run checks the compiled
peer's losses before it times them); an error or a mismatch fails it.

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
from dataclasses import dataclass, field
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
QUICK = {"check_steps": 2, "warmup": 3, "iters": 8, "breakdown_steps": 1, "budget": 180}
PRECISIONS = (("fp32", False), ("tf32", True))
#: The nets and batches of issue 18 (``--net``'s default).
DEFAULT_NETS = "imagenet:128,imagenet:32,cifar18:128"
#: The torch peers, in the order they are timed.
TORCH_PEERS = ("torch_eager", "torch_graph", "torch_compile")
#: cc2ops's modes with their row-name suffixes and what each replays.
MODES = (
    ("eager", "", "eager"),
    ("capture", "_graph", "cuda graph (capture_function), GPU inputs"),
    ("auto", "_auto", "automatic (graphs=True), host inputs and outputs"),
)
#: Issue 18's bar per mode: (rule, limit); the rule's ratio must be <= limit.
BARS = {
    "eager": ("cc2ops_ms <= 1.0 x torch_eager_ms", 1.0),
    "auto": ("cc2ops_ms <= 1.15 x the capture row's cc2ops_ms", 1.15),
    "capture": ("cc2ops_ms <= 0.7 x peer_ms (the best torch)", 0.7),
}
#: Steps of the whole-step CUDA-graph peer run on a side stream before its
#: capture (PyTorch's example uses 3; the momentum buffers exist after one).
GRAPH_WARMUP = 3
#: Untimed calls of the compiled peer at each precision before it is timed.
COMPILE_WARMUP = 3

# --------------------------------------------------------------------------
# PyTorch peers
# --------------------------------------------------------------------------


class TorchStep:
    """The same net and optimiser in PyTorch (parameters from ``cfg.init_params``).

    The layer list of ``cfg.network()`` -- the table entry cc2ops's step is
    built from -- walked in its order in ``torch.nn.functional``, each
    layer's ReLU after it where the table puts one; weight decay on the
    weights only, as :func:`cc2ops.testing.nets.training_step`. A layer type
    without a torch form here raises ``TypeError`` (never skipped).
    ``device``: torch's device ("cuda"; the dry run's check uses "cpu").

    :meth:`step` is the eager peer; :class:`TorchGraphStep` and
    :class:`TorchCompiledStep` run this step the two other ways.
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
        self.device = torch.device(device)
        self.p: dict[str, Any] = {}
        for name, value in params.items():
            v = np.asarray(value)
            layer = self.net.layer(name.split(".")[0])
            if isinstance(layer, FC) and name.endswith(".W"):
                v = v.T  # Linear.weight is (out, in)
            self.p[name] = torch.tensor(
                np.ascontiguousarray(v), device=self.device, requires_grad=True
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
            elif isinstance(layer, Pool) and layer.kind == "max":
                h = F.max_pool2d(h, layer.size, layer.stride, ceil_mode=True)
            elif isinstance(layer, Pool):
                # no padding, so count_include_pad=False is the same average
                # in eager (over the window clipped to the image; bit for bit):
                # with True, Inductor's backward divides a ceil-mode window
                # that overhangs by size**2 -- wrong gradients under
                # torch.compile (pytorch/pytorch#198119), which the compiled
                # peer's loss check caught on cifar18's average pools
                h = F.avg_pool2d(
                    h, layer.size, layer.stride, ceil_mode=True,
                    count_include_pad=False,
                )  # fmt: skip
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

    def snapshot(self) -> dict[str, Any]:
        """Copies of the parameters, for :meth:`restore`."""
        return {k: v.detach().clone() for k, v in self.p.items()}

    def restore(self, snap: dict[str, Any]) -> None:
        """Parameters back to ``snap`` and the momentum buffers to zero, in place.

        In place, so that a graph captured afterwards reads and writes these
        very tensors. A zero buffer updates as no buffer does (dampening is
        0: ``0 * momentum + grad`` is ``grad``, exactly), so the next step is
        the first step from ``snap``.
        """
        with self.torch.no_grad():
            for k, v in self.p.items():
                v.copy_(snap[k])
            for state in self.opt.state.values():
                buf = state.get("momentum_buffer")
                if buf is not None:
                    buf.zero_()
        self.opt.zero_grad(set_to_none=True)


class TorchGraphStep:
    """A :class:`TorchStep`'s whole step in one ``torch.cuda.CUDAGraph``.

    PyTorch's whole-network capture: ``warmup`` steps on a side stream with
    the static inputs (cuDNN algorithms chosen, momentum buffers made), then
    zero_grad (``set_to_none``, so the captured backward allocates the
    gradients from the graph's private pool), forward, backward and
    ``optimizer.step()`` captured into one graph. With ``restore`` (the loss
    check) the warm-up's moves are undone before the capture
    (:meth:`TorchStep.restore`), so the first replay is the first step from
    the parameters the step had. A call (:meth:`__call__`) copies the
    minibatch into the static tensors and replays; :meth:`replay` replays
    alone (on the static minibatch).

    ``capture=False`` (the dry run, on the CPU, where there is no CUDA graph)
    runs the same warm-up, restore and static-input path, with the step it
    would capture run eagerly in place of each replay.

    Parameters
    ----------
    step : TorchStep
    x, y : torch tensors
        A minibatch, images (B, 3, crop, crop) and labels (B,) int64: the
        static tensors' shapes and the warm-up's data.
    """

    def __init__(
        self, step: TorchStep, x: Any, y: Any, *, warmup: int = GRAPH_WARMUP,
        capture: bool = True, restore: bool = True,
    ) -> None:  # fmt: skip
        if warmup < 1:
            raise ValueError(f"TorchGraphStep: warmup must be >= 1, got {warmup}")
        torch = step.torch
        self.step = step
        self.static_x, self.static_y = x.clone(), y.clone()
        snap = step.snapshot() if restore else None
        if capture:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    step.step(self.static_x, self.static_y)
            torch.cuda.current_stream().wait_stream(side)
        else:
            for _ in range(warmup):
                step.step(self.static_x, self.static_y)
        if snap is not None:
            step.restore(snap)
            del snap
        self.graph: Any = None
        self.static_loss: Any = None
        if capture:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                # step() begins with zero_grad(set_to_none=True): no kernel,
                # the captured backward makes the gradients in the graph's pool
                self.static_loss = step.step(self.static_x, self.static_y)

    def replay(self) -> Any:
        """One step on the static minibatch; the loss (the graph's tensor)."""
        if self.graph is None:
            self.static_loss = self.step.step(self.static_x, self.static_y)
        else:
            self.graph.replay()
        return self.static_loss

    def __call__(self, x: Any, y: Any) -> Any:
        """Copy ``x``, ``y`` into the static tensors, then :meth:`replay`."""
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        return self.replay()

    def close(self) -> None:
        """Free the graph and its pool."""
        if self.graph is not None:
            self.graph.reset()
        self.graph = None
        self.static_loss = None


class TorchCompiledStep:
    """A :class:`TorchStep` under ``torch.compile`` (default mode).

    The loss (forward; AOTAutograd compiles its backward with it) and, with
    ``compile_optimizer``, the optimizer's step are compiled, as PyTorch's
    compiled-optimizer recipe does (SGD with momentum is supported; its first
    call, before the momentum buffers exist, and its second compile apart).
    ``zero_grad`` and ``backward()`` stay Python calls. The first calls
    compile; Dynamo's recompile limit raises instead of falling back to
    eager (``torch._dynamo.config.fail_on_recompile_limit_hit``, set here
    for the process).
    """

    def __init__(self, step: TorchStep, *, compile_optimizer: bool = True) -> None:
        torch = step.torch
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        self.step = step
        self.compile_optimizer = compile_optimizer
        self.loss = torch.compile(step.loss)
        opt = step.opt

        def opt_step() -> None:
            opt.step()

        self.opt_step = torch.compile(opt_step) if compile_optimizer else opt.step

    def __call__(self, x: Any, y: Any) -> Any:
        self.step.opt.zero_grad(set_to_none=True)
        loss = self.loss(x, y)
        loss.backward()
        self.opt_step()
        return loss.detach()


def graph_breaks() -> int:
    """Dynamo's graph breaks so far in this process (its counters)."""
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


def cxx_compiler() -> tuple[str | None, str]:
    """(The C++ compiler Inductor's CPU backend would use, or None; why not)."""
    import shutil

    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        cxx = get_cpp_compiler()
    except Exception as e:
        return None, f"Inductor finds no C++ compiler ({_error_text(e)})"
    if not (shutil.which(cxx) or Path(cxx).is_file()):
        return None, f"Inductor's C++ compiler {cxx!r} is not on PATH"
    return cxx, ""


def set_torch_tf32(flag: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = flag
    torch.backends.cudnn.allow_tf32 = flag


def _error_text(e: BaseException, limit: int = 600) -> str:
    """``Type: message``, the message's first nonblank lines, at most ``limit``
    characters (torch.compile's errors run to pages; the log has the rest)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = f"{type(e).__name__}: {' | '.join(lines[:4])}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


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


def torch_batch(x: np.ndarray, y: np.ndarray, device: str) -> tuple[Any, Any]:
    """A minibatch as torch tensors on ``device`` (labels int64)."""
    import torch

    return (
        torch.tensor(x, device=device),
        torch.tensor(y.astype("int64"), device=device),
    )


def torch_losses(
    step: Any, cfg: StepConfig, steps: int, device: str = "cuda"
) -> list[float]:
    """Losses of ``steps`` calls of a torch step (a callable of images and
    labels) on the loss check's minibatches, in order."""
    out = []
    for x, y in minibatches(cfg, steps, seed=11):
        out.append(float(step(*torch_batch(x, y, device))))
    return out


def check_losses(fn: Any, ref: Any, cfg: StepConfig, steps: int) -> dict:
    """fp32, dropout off: losses of ``steps`` steps of cc2ops's ``fn`` and the
    torch step ``ref`` (a callable, e.g. :meth:`TorchStep.step`) from one init."""
    from cc2ops.cuda import allow_tf32
    from cc2ops.cuda.runtime import array

    ours = []
    set_torch_tf32(False)
    with allow_tf32(False):
        for x, y in minibatches(cfg, steps, seed=11):
            loss, _ = fn(array.to_gpu(x, 0), array.to_gpu(y, 0))
            ours.append(float(array.to_host(loss)))
        theirs = torch_losses(ref, cfg, steps)
    return compare_losses(ours, theirs)


def compare_losses(
    ours: list[float], theirs: list[float], names: tuple[str, str] = ("cc2ops", "torch")
) -> dict:
    """The loss check's verdict: finite losses ``ours`` within ``LOSS_RTOL``
    (relative, the largest over the steps) of the reference ``theirs``;
    ``names`` name the two lists in the result (``<name>_losses``)."""
    rel = max(
        abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, theirs, strict=True)
    )
    ok = bool(np.isfinite(ours).all() and rel < LOSS_RTOL)
    return {
        f"{names[0]}_losses": ours,
        f"{names[1]}_losses": theirs,
        "max_rel": rel,
        "ok": ok,
    }


def check_peer(
    peer: str, make: Any, cfg: StepConfig, steps: int, reference: list[float],
    device: str = "cuda",
) -> tuple[dict, Any]:  # fmt: skip
    """The loss check of one torch peer against ``reference`` (torch eager's
    losses from the same parameters and minibatches).

    ``make()`` builds the peer's step (a callable of images and labels);
    building and running are inside the check, so an error is the check's
    outcome (``{"ok": False, "error": ...}``, traceback printed), not the
    run's end. Returns (the verdict with ``seconds``, the wall time of the
    build and the steps; the step, or None after an error).
    """
    t0 = time.perf_counter()
    step = None
    try:
        step = make()
        losses = torch_losses(step, cfg, steps, device)
        _sync(device)
        out = compare_losses(losses, reference, names=(peer, "torch_eager"))
    except Exception as e:
        traceback.print_exc()
        close = getattr(step, "close", None)
        if close is not None:
            close()
        out = {"ok": False, "max_rel": None, "error": _error_text(e)}
        step = None
    out["seconds"] = time.perf_counter() - t0
    return out, step


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
    import cc2ops

    small = host_check_config(cfg).with_(dropout=False)
    params = small.init_params()
    fn = build_step(small, params).function(cc2ops.mode)
    ref = TorchStep(small, params, dropout=False, device="cpu")
    ours = []
    for x, y in minibatches(small, steps, seed=11):
        ours.append(float(fn(x, y)[0]))
    theirs = torch_losses(ref.step, small, steps, device="cpu")
    out = compare_losses(ours, theirs)
    out["checked"] = {"net": small.net, "batch": small.batch, "crop": small.crop,
                      "width_mult": small.width_mult, "steps": steps}  # fmt: skip
    return out


def check_torch_peers_on_host(
    cfg: StepConfig, reference: list[float], steps: int = 3
) -> dict[str, dict]:
    """The graph and compiled torch peers against torch eager on the CPU.

    On :func:`host_check_config` of ``cfg``, from fresh copies of the same
    parameters, against ``reference`` (torch eager's losses there, from
    :func:`check_peer_on_host`), as stage 2 checks them on the GPU:

    - ``torch_graph``: :class:`TorchGraphStep` with ``capture=False`` (no
      CUDA graph on the CPU): the warm-up, restore and static-input path,
      each replay run as the eager step it would capture;
    - ``torch_compile``: :class:`TorchCompiledStep` (Inductor's C++
      backend). Without a C++ compiler it is not run: ``{"ok": None,
      "not_run": why}``.

    Each verdict as :func:`check_peer`'s (``error`` where it raised).
    """
    import torch

    small = host_check_config(cfg).with_(dropout=False)
    params = small.init_params()
    xt, yt = torch_batch(*minibatches(small, 1, seed=1)[0], device="cpu")
    out: dict[str, dict] = {}
    out["torch_graph"], _ = check_peer(
        "torch_graph",
        lambda: TorchGraphStep(
            TorchStep(small, params, dropout=False, device="cpu"), xt, yt,
            capture=False,
        ),
        small, steps, reference, device="cpu",
    )  # fmt: skip
    cxx, why = cxx_compiler()
    if cxx is None:
        out["torch_compile"] = {"ok": None, "max_rel": None, "not_run": why}
        return out
    torch._dynamo.reset()
    breaks = graph_breaks()
    out["torch_compile"], _ = check_peer(
        "torch_compile",
        lambda: TorchCompiledStep(
            TorchStep(small, params, dropout=False, device="cpu")
        ),
        small, steps, reference, device="cpu",
    )  # fmt: skip
    out["torch_compile"]["graph_breaks"] = graph_breaks() - breaks
    out["torch_compile"]["compiler"] = cxx
    return out


#: Issue 18's host-cost bar: microseconds per node for the common op classes.
HOST_BAR_US = 15.0
#: The op classes the bar is for (elementwise, conv passes, pooling, GEMM).
HOST_BAR_OPS = (
    "GpuElemwise", "GpuFilterActs", "GpuImageActs", "GpuWeightActs",
    "GpuMaxPool", "GpuMaxPoolGrad", "GpuAvgPool", "GpuAvgPoolGrad",
    "GpuDot22", "GpuGemm",
)  # fmt: skip
#: Profiled warm-up calls: a launch tape needs two equal recordings, and an
#: autotuned pass a first call to tune (cc2ops.cuda.runtime.tape).
BREAKDOWN_WARMUP = 4


def host_cost(by_op: list[dict]) -> dict:
    """Host microseconds per node of each op class, and the bar's verdict over
    :data:`HOST_BAR_OPS` (pure: the tests feed it made-up records)."""
    per_node = {
        e["op"]: 1e3 * e["host_ms"] / e["nodes"] for e in by_op if e["nodes"] > 0
    }
    barred = {op: us for op, us in per_node.items() if op in HOST_BAR_OPS}
    worst = max(barred, key=barred.get) if barred else None
    return {
        "host_us_per_node": {op: round(us, 1) for op, us in per_node.items()},
        "host_bar_us": HOST_BAR_US,
        "host_bar_worst_op": worst,
        "host_bar_met": bool(barred) and barred[worst] <= HOST_BAR_US,
    }


def tape_coverage(entries: list[dict]) -> dict:
    """How many taped nodes replay, and why the others do not (pure: the
    tests feed it made-up :func:`cc2ops.cuda.mode.launch_tapes` entries).

    Returns ``taped_nodes`` (nodes whose op is taped), ``replaying_nodes``
    (those that replayed a tape at least once) and ``not_replaying``: op
    class -> {reason: nodes}, the reason being the latest refusal (or
    ``"no tape"`` where none was given).
    """
    missing: dict[str, dict[str, int]] = {}
    replaying = 0
    for e in entries:
        if e["plays"] > 0:
            replaying += 1
            continue
        op = str(e["op"]).split("{")[0].split("(")[0]
        reason = e["refusal"] or "no tape"
        by_reason = missing.setdefault(op, {})
        by_reason[reason] = by_reason.get(reason, 0) + 1
    return {
        "taped_nodes": len(entries),
        "replaying_nodes": replaying,
        "not_replaying": missing,
    }


def breakdown(fn: Any, args: tuple, steps: int, tf32: bool, top: int = 10) -> dict:
    """Per-op device and host time of a Python-VM step (ThunkProfile), with
    the host cost per node of every op class (:func:`host_cost`) and which
    nodes replay launch tapes (:func:`tape_coverage`)."""
    from cc2ops.cuda import allow_tf32
    from cc2ops.cuda.mode import launch_tapes
    from cc2ops.cuda.runtime.profile import ThunkProfile

    prof = ThunkProfile(fn)
    with allow_tf32(tf32):
        res = prof.run(*args, steps=steps, warmup=BREAKDOWN_WARMUP)
    return {
        **host_cost(res["by_op"]),
        "tapes": tape_coverage(launch_tapes(fn)),
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
# rows and bars (pure: the tests feed them made-up numbers)
# --------------------------------------------------------------------------


def peer_summary(times: dict[str, float | None], errors: dict[str, str]) -> dict:
    """The torch fields of a row.

    Parameters
    ----------
    times : dict
        Peer (of :data:`TORCH_PEERS`) -> median milliseconds, None (or
        absent) where it did not run.
    errors : dict
        Peer -> error text, for the peers that failed.

    Returns
    -------
    dict
        ``<peer>_ms`` for every peer (None where it did not run), ``peer_ms``
        (the smallest of those that ran; None if none did), ``peer_best``
        (its peer), ``peers_missing`` (the peers without a time, in order)
        and ``<peer>_error`` for each failed peer.
    """
    unknown = sorted((set(times) | set(errors)) - set(TORCH_PEERS))
    if unknown:
        raise ValueError(f"peer_summary: unknown peers {unknown}; know {TORCH_PEERS}")
    out: dict[str, Any] = {f"{p}_ms": times.get(p) for p in TORCH_PEERS}
    ran = {p: t for p in TORCH_PEERS if (t := times.get(p)) is not None}
    best = min(ran, key=ran.__getitem__) if ran else None
    out["peer_ms"] = ran[best] if best is not None else None
    out["peer_best"] = best
    out["peers_missing"] = [p for p in TORCH_PEERS if p not in ran]
    for p in TORCH_PEERS:
        if errors.get(p):
            out[f"{p}_error"] = errors[p]
    return out


def bar_verdict(
    mode: str, cc2ops_ms: float | None, peers: dict, capture_ms: float | None
) -> dict:
    """Issue 18's bar for a row of ``mode`` (:data:`BARS`).

    ``eager`` is measured against ``peers["torch_eager_ms"]``, ``capture``
    against ``peers["peer_ms"]`` (the best torch), ``auto`` against
    ``capture_ms`` (the capture row's ``cc2ops_ms``). Returns ``bar`` (the
    rule), ``bar_limit``, ``bar_ratio`` (``cc2ops_ms`` over what it is measured
    against) and ``bar_ok`` (``bar_ratio <= bar_limit``); the last two are
    None where either time is missing.
    """
    if mode not in BARS:
        raise ValueError(
            f"bar_verdict: mode must be one of {tuple(BARS)}, got {mode!r}"
        )
    rule, limit = BARS[mode]
    against = {
        "eager": peers.get("torch_eager_ms"),
        "capture": peers.get("peer_ms"),
        "auto": capture_ms,
    }[mode]
    if cc2ops_ms is None or not against:
        return {"bar": rule, "bar_limit": limit, "bar_ratio": None, "bar_ok": None}
    ratio = cc2ops_ms / against
    return {"bar": rule, "bar_limit": limit, "bar_ratio": ratio,
            "bar_ok": bool(ratio <= limit)}  # fmt: skip


def step_rows(
    name: str, net: str, batch: int, precision: str,
    cc2ops_ms: dict[str, float | None], peers: dict, checks: dict, *,
    common: dict | None = None, extra: dict[str, dict] | None = None,
) -> list[dict]:  # fmt: skip
    """The rows of one net, precision and dropout setting: one per mode.

    Parameters
    ----------
    name : str
        The eager row's name (``imagenet_step_b128``); the others add their
        suffix (:data:`MODES`).
    cc2ops_ms : dict
        Mode (``eager``, ``capture``, ``auto``) -> cc2ops's median ms.
    peers : dict
        :func:`peer_summary` of the torch times.
    checks : dict
        Loss-check verdicts (:func:`compare_losses`, :func:`check_peer`) by
        mode and by peer (``torch_graph``, ``torch_compile``); a missing or
        failed-to-run check reads as None.
    common, extra : dict
        Fields for every row, and per mode.
    """
    rows = []
    peer_ms = peers.get("peer_ms")
    for mode, suffix, replay in MODES:
        ms = cc2ops_ms[mode]
        check = checks.get(mode) or {}
        row = {
            "name": name + suffix,
            "net": net,
            "batch": batch,
            "pass": "step",
            "precision": precision,
            "mode": mode,
            "cc2ops_ms": ms,
            **peers,
            "ratio": ms / peer_ms if ms is not None and peer_ms else None,
            "images_per_s": batch / (ms / 1e3) if ms else None,
            "peer_images_per_s": batch / (peer_ms / 1e3) if peer_ms else None,
            **bar_verdict(mode, ms, peers, cc2ops_ms.get("capture")),
            "replay": replay,
            "correct": check.get("ok"),
            "loss_max_rel": check.get("max_rel"),
        }
        for peer in TORCH_PEERS[1:]:
            pc = checks.get(peer) or {}
            row[f"{peer}_correct"] = None if "error" in pc else pc.get("ok")
        row.update(common or {})
        row.update((extra or {}).get(mode, {}))
        rows.append(row)
    return rows


def run_status(rows: list[dict], errors: list[str]) -> int:
    """The exit status: 1 without rows, with any error recorded (a failed
    stage, a torch peer that failed, a loss mismatch) or with a row whose
    cc2ops loss check did not pass; else 0. A bar not met is a measurement,
    not a failure."""
    if not rows or errors:
        return 1
    return 0 if all(r.get("correct") is True for r in rows) else 1


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

    def error(self, msg: str) -> None:
        """Record ``msg`` once (the exit status is then 1)."""
        if msg not in self.extra["errors"]:
            self.extra["errors"].append(msg)

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
            if "host_us_per_node" in row:
                verdict = "met" if row["host_bar_met"] else "unmet"
                print(
                    f"  host us per node (bar {row['host_bar_us']:.0f} us on "
                    f"{', '.join(HOST_BAR_OPS)}: {verdict}, worst "
                    f"{row['host_bar_worst_op']}):"
                )
                for op, us in sorted(row["host_us_per_node"].items()):
                    print(f"    {op:<32} {us:7.1f} us")
            if "tapes" in row:
                t = row["tapes"]
                print(
                    f"  launch tapes: {t['replaying_nodes']} of {t['taped_nodes']} "
                    "taped nodes replay"
                )
                for op, reasons in sorted(t["not_replaying"].items()):
                    for reason, n in reasons.items():
                        print(f"    {op:<32} {n} node(s): {reason}")


def log(t0: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True)


def _ms(v: float | None) -> str:
    return "failed" if v is None else f"{v:.2f} ms"


@dataclass
class TorchPeers:
    """The torch steps a net's rows time, one per peer.

    ``eager``: the eager step; ``graph``: the step each precision captures a
    :class:`TorchGraphStep` of; ``compiled``: the compiled step. A peer that
    failed is None, with its error text in ``errors``. ``compile_s`` and
    ``graph_breaks``: the compiled step's compiling calls not yet reported
    (seconds) and Dynamo's graph breaks in it so far.
    """

    eager: TorchStep | None = None
    graph: TorchStep | None = None
    compiled: TorchCompiledStep | None = None
    errors: dict[str, str] = field(default_factory=dict)
    compile_s: float = 0.0
    graph_breaks: int = 0

    def fail(self, peer: str, error: str) -> None:
        self.errors[peer] = error
        setattr(self, {"torch_eager": "eager", "torch_graph": "graph",
                       "torch_compile": "compiled"}[peer], None)  # fmt: skip


def torch_peers(
    cfg: StepConfig, params: dict, *, dropout: bool, steps: int,
    reference: list[float] | None, x: Any, y: Any,
) -> tuple[TorchPeers, dict]:  # fmt: skip
    """The three torch peers of a net from ``params``, and their loss checks.

    With ``reference`` (torch eager's fp32 losses, dropout off), the graph
    and compiled peers are loss-checked (:func:`check_peer`) from fresh
    copies of ``params`` (the graph peer warmed up on ``x``, ``y`` and put
    back); the compiled step that passed its check is the one timed, its
    check's calls being its compile. Without (the dropout rows), nothing is
    checked and the compiled step compiles in its first timing's warm-up.
    """
    import torch

    peers = TorchPeers(eager=TorchStep(cfg, params, dropout=dropout))
    torch._dynamo.reset()  # a net compiles afresh, under its own recompile limit
    if reference is None:
        peers.graph = TorchStep(cfg, params, dropout=dropout)
        peers.compiled = TorchCompiledStep(TorchStep(cfg, params, dropout=dropout))
        return peers, {}
    set_torch_tf32(False)
    checks: dict[str, dict] = {}
    checks["torch_graph"], gstep = check_peer(
        "torch_graph",
        lambda: TorchGraphStep(TorchStep(cfg, params, dropout=False), x, y),
        cfg, steps, reference,
    )  # fmt: skip
    if gstep is None:
        peers.fail("torch_graph", checks["torch_graph"]["error"])
    else:
        gstep.close()
        peers.graph = gstep.step  # each precision captures its own graph of it
    breaks = graph_breaks()
    checks["torch_compile"], cstep = check_peer(
        "torch_compile",
        lambda: TorchCompiledStep(TorchStep(cfg, params, dropout=False)),
        cfg, steps, reference,
    )  # fmt: skip
    peers.graph_breaks = graph_breaks() - breaks
    checks["torch_compile"]["graph_breaks"] = peers.graph_breaks
    if cstep is None:
        peers.fail("torch_compile", checks["torch_compile"]["error"])
    else:
        peers.compiled = cstep
        peers.compile_s = checks["torch_compile"]["seconds"]
    return peers, checks


def time_torch(
    peers: TorchPeers, x: Any, y: Any, warmup: int, iters: int
) -> tuple[dict[str, float | None], dict]:
    """Median ms of each torch peer on ``x``, ``y`` at the current precision
    (None for a peer that failed, now or before: ``peers.errors``), and the
    compiled peer's ``torch_compile_s`` and ``torch_compile_graph_breaks``.

    The graph peer captures a fresh :class:`TorchGraphStep` (warm-up on a
    side stream at this precision) and times its calls: copy + replay. The
    compiled peer's :data:`COMPILE_WARMUP` untimed calls come first; their
    wall seconds, with the check's if not yet reported, are its compile time.
    """
    import torch

    times: dict[str, float | None] = dict.fromkeys(TORCH_PEERS)
    extra: dict[str, Any] = {}

    def eager() -> float:
        return time_cuda(lambda: peers.eager.step(x, y), warmup=warmup, iters=iters)

    def graph() -> float:
        g = TorchGraphStep(peers.graph, x, y, restore=False)
        try:
            return time_cuda(lambda: g(x, y), warmup=warmup, iters=iters)
        finally:
            g.close()

    def compiled() -> float:
        step = peers.compiled
        breaks = graph_breaks()
        t = time.perf_counter()
        for _ in range(COMPILE_WARMUP):
            step(x, y)
        torch.cuda.synchronize()
        extra["torch_compile_s"] = peers.compile_s + time.perf_counter() - t
        peers.compile_s = 0.0
        peers.graph_breaks += graph_breaks() - breaks
        extra["torch_compile_graph_breaks"] = peers.graph_breaks
        extra["torch_compile_optimizer"] = step.compile_optimizer
        return time_cuda(lambda: step(x, y), warmup=warmup, iters=iters)

    for peer, timer, obj in (
        ("torch_eager", eager, peers.eager),
        ("torch_graph", graph, peers.graph),
        ("torch_compile", compiled, peers.compiled),
    ):
        if peer in peers.errors:
            continue
        if obj is None:
            peers.fail(peer, "not built")
            continue
        try:
            times[peer] = timer()
        except Exception as e:  # recorded in the rows, never dropped
            traceback.print_exc()
            peers.fail(peer, _error_text(e))
            torch.cuda.synchronize()
    return times, extra


def time_rows(
    report: Report, name: str, cfg: StepConfig, fn: Any, gfn: Any,
    peers: TorchPeers, args: dict, checks: dict, dropout: float, t0: float,
) -> list[dict]:  # fmt: skip
    """Time ``fn`` eagerly, ``gfn`` replayed as a graph, ``args["auto"]`` (host
    inputs, automatic replay) and the torch ``peers`` at each precision;
    three rows per precision (eager, capture, auto), saved at once."""
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
            theirs, torch_extra = time_torch(
                peers, xt, yt, args["warmup"], args["iters"]
            )
        set_torch_tf32(False)
        for peer, err in peers.errors.items():
            report.error(f"{name}: {peer} failed: {err}")
        summary = peer_summary(theirs, peers.errors)
        new = step_rows(
            name, cfg.net, cfg.batch, precision,
            {"eager": ours, "capture": graphed, "auto": autoed}, summary, checks,
            common={"dropout": dropout, "timed_steps": args["iters"], **torch_extra},
            extra={"capture": {"graph_nodes": nodes},
                   "auto": {"auto_stats": auto_stats,
                            "auto_vs_graph": autoed / graphed}},
        )  # fmt: skip
        report.rows.extend(new)
        rows.extend(new)
        verdicts = {None: "n/a", True: "met", False: "NOT met"}
        bars = ", ".join(f"{r['mode']} {verdicts[r['bar_ok']]}" for r in new)
        log(
            t0,
            f"{name} {precision}: cc2ops eager {ours:.2f} ms, capture "
            f"{graphed:.2f} ms, auto {autoed:.2f} ms; torch eager "
            f"{_ms(theirs['torch_eager'])}, graph {_ms(theirs['torch_graph'])}, "
            f"compile {_ms(theirs['torch_compile'])} (best: {summary['peer_best']}); "
            f"bars: {bars}",
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

    def fresh() -> Any:
        return TorchStep(cfg, params, dropout=False).step

    n = settings["check_steps"]
    log(t0, f"{cfg.name}: checking losses over {n} fp32 steps against torch")
    checks = {
        "eager": check_losses(fn, fresh(), cfg, n),
        "capture": check_losses(capture_function(gfn, warmup=1), fresh(), cfg, n),
        "auto": check_losses(_host_call(auto_fn()), fresh(), cfg, n),
    }
    x, y = minibatches(cfg, 1, seed=1)[0]
    xt, yt = torch_batch(x, y, "cuda")
    log(t0, f"{cfg.name}: checking the torch graph and compiled peers (compiling)")
    peers, peer_checks = torch_peers(
        cfg, params, dropout=False, steps=n,
        reference=checks["eager"]["torch_losses"], x=xt, y=yt,
    )  # fmt: skip
    checks.update(peer_checks)
    report.extra["loss_check"][cfg.name] = checks
    for kind, check in checks.items():
        if "error" in check:
            log(t0, f"{cfg.name} {kind} FAILED ({check['seconds']:.1f} s): "
                f"{check['error']}")  # fmt: skip
            report.error(f"{cfg.name}: {kind} failed: {check['error']}")
            continue
        ours, theirs = (v for k, v in check.items() if k.endswith("_losses"))
        verdict = "agree" if check["ok"] else "DIFFER"
        log(
            t0,
            f"{cfg.name} {kind} losses {verdict} (max rel {check['max_rel']:.2e}): "
            f"{kind} {ours} reference {theirs}",
        )
        if not check["ok"]:
            report.error(
                f"{cfg.name}: {kind} and torch (eager) losses differ: max rel "
                f"{check['max_rel']:.3e}"
            )

    args = {
        "gx": array.to_gpu(x, 0),
        "gy": array.to_gpu(y, 0),
        "xt": xt,
        "yt": yt,
        "hx": x,
        "hy": y,
        "auto": auto_fn,
        "warmup": settings["warmup"],
        "iters": settings["iters"],
    }
    name = cfg.name
    rows = time_rows(report, name, cfg, fn, gfn, peers, args, checks, 0.0, t0)
    del peers

    log(t0, f"{cfg.name}: compiling the step with the Python VM (per-op breakdown)")
    _, pfn = cc2ops_step(cfg, params, dropout=False, linker="py")
    eager_rows = [r for r in rows if r["mode"] == "eager"]
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
    dpeers, _ = torch_peers(cfg, params, dropout=True, steps=0, reference=None,
                            x=xt, y=yt)  # fmt: skip
    dargs = {
        **args,
        "auto": lambda: cc2ops_step(cfg, params, dropout=True, auto=True)[1],
    }
    time_rows(report, f"{name}_dropout", cfg, dfn, dgfn, dpeers, dargs, checks,
              max(drops), t0)  # fmt: skip


# --------------------------------------------------------------------------
# dry run (CPU)
# --------------------------------------------------------------------------


def dry_run(
    cfg: StepConfig, quick: bool, host_checks: dict[StepConfig, str] | None = None
) -> int:
    """Build and rewrite every graph the benchmark compiles (no CUDA), then,
    where torch is installed, :func:`check_peer_on_host` and
    :func:`check_torch_peers_on_host`; 1 if any fails (a compiled peer not
    run for want of a C++ compiler is printed, not failed).

    ``host_checks``: small copy -> the net that checked it, so a net given
    at two batches (same small copy) is checked on the CPU once.
    """
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
        print(f"{cfg.name} torch peers: not checked (torch is not installed)")
        return status
    small = host_check_config(cfg)
    if host_checks is not None and small in host_checks:
        print(f"{cfg.name} torch peers on the CPU: the same check as "
              f"{host_checks[small]} (same small copy), above")  # fmt: skip
        return status
    if host_checks is not None:
        host_checks[small] = cfg.name
    t0 = time.perf_counter()
    check = check_peer_on_host(cfg)
    c = check["checked"]
    verdict = "agree" if check["ok"] else "DIFFER"
    where = (
        f"({c['net']}, batch {c['batch']}, {c['crop']}x{c['crop']}, width "
        f"x{c['width_mult']:g}, {c['steps']} steps"
    )
    print(
        f"{cfg.name} torch peer on the CPU {where}, "
        f"{time.perf_counter() - t0:.1f} s): losses {verdict} (max rel "
        f"{check['max_rel']:.2e}, tolerance {LOSS_RTOL:g}): cc2ops "
        f"{check['cc2ops_losses']} torch {check['torch_losses']}"
    )
    if not check["ok"]:
        status = 1
    peers = check_torch_peers_on_host(cfg, check["torch_losses"])
    what = {
        "torch_graph": "torch_graph (no CUDA graph on the CPU: warm-up, restore "
        "and static inputs, the step it would capture run eagerly)",
        "torch_compile": "torch_compile (torch.compile, Inductor C++)",
    }
    for peer, v in peers.items():
        head = f"{cfg.name} {what[peer]} on the CPU {where}"
        if "not_run" in v:
            print(f"{head}: NOT CHECKED: {v['not_run']}; the GPU run checks its "
                  "losses before timing it")  # fmt: skip
            continue
        if "error" in v:
            status = 1
            print(f"{head}, {v['seconds']:.1f} s): ERROR: {v['error']}")
            continue
        verdict = "agree" if v["ok"] else "DIFFER"
        more = (
            f", {v['graph_breaks']} graph breaks, {v['compiler']}"
            if peer == "torch_compile"
            else ""
        )
        print(
            f"{head}, {v['seconds']:.1f} s{more}): losses {verdict} with torch "
            f"eager's (max rel {v['max_rel']:.2e}, tolerance {LOSS_RTOL:g}): "
            f"{peer} {v[f'{peer}_losses']}"
        )
        if not v["ok"]:
            status = 1
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
        default=DEFAULT_NETS,
        metavar="NET[:BATCH],...",
        help="comma-separated nets of cc2ops.testing.nets to time, in order, each "
        f"with an optional batch (of {', '.join(NETS)}; default {DEFAULT_NETS}, "
        "issue 18's)",
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
        "where torch is installed, check the torch peers' losses on the CPU "
        "(against cc2ops, and the graph and compiled peers against torch eager)",
    )
    args = p.parse_args(argv)
    try:
        configs = parse_nets(args.net, args.batch)
    except ValueError as e:
        p.error(str(e))
    if args.dry_run:
        host_checks: dict[StepConfig, str] = {}
        return max([dry_run(cfg, args.quick, host_checks) for cfg in configs])
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
        "torch_peers": list(TORCH_PEERS),
        "graph_warmup": GRAPH_WARMUP,
        "compile_warmup": COMPILE_WARMUP,
    }  # fmt: skip
    report = Report(args.out, settings)
    report.extra["loss_check"] = {}
    report.extra["timing"] = (
        "CUDA events, median: cc2ops stream for cc2ops (eager; capture_function: "
        "copy of the inputs into the graph's buffers + replay; auto: host inputs), "
        "torch stream for torch (eager; whole-step CUDA graph: copy into the "
        "static inputs + replay; torch.compile default mode, compiling calls "
        "untimed); peer_ms: the best torch; top_ops: Python VM, ThunkProfile "
        "(each node's device time behind a held stream)"
    )
    for cfg in configs:
        try:
            with time_budget(settings["budget_s"]):
                run(cfg, settings, report, args.quick)
        except BudgetExceeded as e:
            report.error(f"{cfg.name}: {e}")
            print(f"\nbench_step: {cfg.name}: {e}; keeping what was measured",
                  file=sys.stderr)  # fmt: skip
        except Exception as e:  # keep the rows measured before the failure
            traceback.print_exc()
            report.error(f"{cfg.name}: {_error_text(e)}")
    if report.rows:
        report.save()  # the final table, with any errors recorded
        report.print_breakdowns()
    else:
        print("bench_step: no rows measured", file=sys.stderr)
    for err in report.extra["errors"]:
        print(f"bench_step: {err}", file=sys.stderr)
    return run_status(report.rows, report.extra["errors"])


if __name__ == "__main__":
    sys.exit(main())
