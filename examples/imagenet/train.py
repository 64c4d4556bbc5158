"""Train cuda-convnet2's ImageNet network (or its small CIFAR net) with cc2ops.

Usage (see README.md in this folder)::

    python examples/imagenet/make_dataset.py --out data/digits
    python examples/imagenet/train.py --net small --data data/digits --out runs/digits
    python examples/imagenet/train.py --resume runs/digits --epochs 12

The script uses only the public cc2ops API: ``cc2ops.conv2d``,
``cc2ops.max_pool2d``, ``cc2ops.cross_map_norm``,
``cc2ops.softmax_cross_entropy``, ``cc2ops.top_k_error``, ``cc2ops.dropout``
(when this cc2ops has it), the shape rules of ``cc2ops.shapes`` and the CPU
mode ``cc2ops.mode``; ``--device cuda`` uses ``cc2ops.cuda.mode`` with the
parameters in ``cc2ops.cuda.shared`` variables, ``--devices K`` the
multi-GPU rewriter through ``cc2ops.cuda.mode(devices=[...])``. Either
raises :class:`DeviceError` when it cannot run; it never falls back to the
CPU. Everything runs through :func:`main`, which takes an argument list, so
the tests drive it in-process; :func:`cli` is the command line.

What a run writes to ``--out``: ``ckpt-epochNNN.npz`` checkpoints (atomic,
see ``checkpoint.py``), ``metrics.csv`` (one row per epoch),
``metrics.jsonl`` (one record per ``--log-every`` steps and per epoch) and
``curves.png`` (training curves, redrawn from the whole log at the end). One
folder holds one run: ``run_folder.py`` refuses an ``--out`` that holds
another run (``--overwrite`` moves that run aside, never deletes it). Error
rates are fractions in [0, 1] everywhere (progress bar, messages, logs, plot).

The command line is parsed before PyTensor and cc2ops are imported (a few
seconds), so a mistyped flag is reported at once; the heavy modules are
imported where they are first needed.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# the sibling modules, also when this file is imported from elsewhere (the tests)
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import checkpoint as ckpt_mod  # noqa: E402
import data  # noqa: E402
import distributed as spmd  # noqa: E402
import gpu_data  # noqa: E402
import gpu_step  # noqa: E402
import nets  # noqa: E402
import run_folder  # noqa: E402

SCHEDULES = ("step", "cosine", "constant")
CSV_FIELDS = (
    "epoch",
    "step",
    "lr",
    "train_loss",
    "train_top1_err",
    "val_loss",
    "val_top1_err",
    "val_top5_err",
    "images_per_s",
    "data_wait_s",
    "epoch_s",
    "skipped_images",
)
#: Settings a checkpoint remembers: on --resume, any of them not given on the
#: command line is taken from the checkpoint, so the run continues as it was.
RESUMED = (
    "net",
    "width_mult",
    "data",
    "synthetic",
    "synthetic_images",
    "classes",
    "scale",
    "crop",
    "batch_size",
    "epochs",
    "lr",
    "lr_schedule",
    "lr_step_epochs",
    "lr_gamma",
    "warmup_epochs",
    "momentum",
    "weight_decay",
    "init",
    "seed",
    "stats_images",
)
#: Defaults of the resumed settings not in ``nets.NET_DEFAULTS``.
GENERIC_DEFAULTS: dict[str, Any] = dict(
    net="small",
    width_mult=1.0,
    data=None,
    synthetic=False,
    synthetic_images=1280,
    classes=10,
    lr_gamma=0.1,
    momentum=0.9,
    init="he",
    seed=0,
    stats_images=5000,
)


class DeviceError(RuntimeError):
    """The requested device or device count cannot be used by this cc2ops."""


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the run; ``checkpoint`` holds its exact position.

    Attributes
    ----------
    out : str or None
        The run's folder (None: interrupted before it was known).
    checkpoint : str or None
        The checkpoint written at the interruption, or None when none was
        written (interrupted before the first step, or a second Ctrl-C).
    step : int or None
        Steps done in all at the interruption.
    """

    def __init__(
        self, out: str | None, checkpoint: str | None = None, step: int | None = None
    ) -> None:
        super().__init__(out, checkpoint, step)
        self.out, self.checkpoint, self.step = out, checkpoint, step


USER_ERRORS = (
    data.DatasetError,
    ckpt_mod.CheckpointError,
    nets.NetworkError,
    DeviceError,
    TrainingError,
    run_folder.RunFolderError,
)


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _nonneg_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _nonneg_float(text: str) -> float:
    v = float(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` only where the help text does not give it.

    A default of None (the value depends on the net, or comes from a
    checkpoint: the help text says which) or of a flag's False is not shown.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False) or "default" in text:
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (``--help`` lists every flag)."""
    p = argparse.ArgumentParser(
        prog="train.py",
        description="Train cuda-convnet2's ImageNet net or its small CIFAR net "
        "with cc2ops ops, on an ImageNet-layout image folder.",
        formatter_class=HelpFormatter,
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--data", help="dataset folder with train/<class>/*.JPEG and val/<class>/*.JPEG"
    )
    g.add_argument(
        "--synthetic",
        action="store_true",
        default=None,
        help="random images instead of --data (benchmarking)",
    )
    g.add_argument(
        "--synthetic-images",
        type=_positive_int,
        help="training images per epoch of --synthetic (default: 1280)",
    )
    g.add_argument(
        "--classes", type=_positive_int, help="classes of --synthetic (default: 10)"
    )
    g.add_argument(
        "--scale",
        type=_positive_int,
        help="shorter image side after resizing (default: 256 imagenet, 36 small)",
    )
    g.add_argument(
        "--crop",
        type=_positive_int,
        help="square crop side fed to the net (default: 224 imagenet, 32 small)",
    )
    g.add_argument(
        "--stats-images",
        type=_positive_int,
        help="training images sampled for the mean/std (default: 5000)",
    )
    g.add_argument(
        "--bad-images",
        choices=data.BAD_IMAGE_POLICIES,
        default="skip",
        help="unreadable images: skip them (and count) or stop with an error",
    )
    g.add_argument(
        "--workers",
        type=_nonneg_int,
        default=2,
        help="decoding threads (0: decode in the main thread)",
    )
    g.add_argument(
        "--prefetch",
        type=_positive_int,
        default=4,
        help="batches decoded ahead of the training step (queue bound)",
    )
    g.add_argument(
        "--data-device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="where images are decoded and augmented: gpu (nvImageCodec and a "
        "cc2ops kernel), cpu (Pillow); auto: gpu with --device cuda on one GPU",
    )
    g.add_argument(
        "--decode-threads",
        type=_nonneg_int,
        default=0,
        help="nvImageCodec's CPU threads of the GPU pipeline (0: one per core)",
    )

    g = p.add_argument_group("network")
    g.add_argument(
        "--net",
        choices=sorted(nets.NETS),
        help="imagenet: cuda-convnet2 layers-imagenet-1gpu (224 input); "
        "small: the CIFAR-10 11pct net (32 input) (default: small)",
    )
    g.add_argument(
        "--width-mult", type=float, help="multiply every layer's width (default: 1.0)"
    )
    g.add_argument(
        "--init",
        choices=nets.INITS,
        help="he: He-normal weights, zero biases; cc2: the cfg files' "
        "initW/initB (default: he)",
    )

    g = p.add_argument_group("training")
    g.add_argument(
        "--epochs",
        type=_positive_int,
        help="epochs in all (default: 90 imagenet, 8 small)",
    )
    g.add_argument(
        "--max-steps",
        type=_positive_int,
        default=None,
        help="stop after this many training steps in all (checkpointed)",
    )
    g.add_argument(
        "--batch-size",
        type=_positive_int,
        help="images per training step, per device with --devices K "
        "(default: 128 imagenet, 64 small)",
    )
    g.add_argument(
        "--eval-batch-size",
        type=_positive_int,
        default=None,
        help="images per evaluation batch (default: --batch-size)",
    )
    g.add_argument(
        "--lr",
        type=_nonneg_float,
        help="base learning rate (default: 0.01; x K with --devices K)",
    )
    g.add_argument(
        "--lr-schedule",
        choices=SCHEDULES,
        help="step: times --lr-gamma every --lr-step-epochs; cosine: "
        "half a cosine to 0 over --epochs (default: step imagenet, "
        "cosine small)",
    )
    g.add_argument(
        "--lr-step-epochs",
        type=_positive_int,
        help="epochs between steps of the step schedule (default: 20 "
        "imagenet, 10 small)",
    )
    g.add_argument(
        "--lr-gamma",
        type=_nonneg_float,
        help="factor of each step of the step schedule (default: 0.1)",
    )
    g.add_argument(
        "--warmup-epochs",
        type=_nonneg_float,
        help="linear ramp of the learning rate from 0 over this many "
        "epochs (fractions allowed) before the schedule (default: 0 "
        "imagenet, 0.5 small)",
    )
    g.add_argument("--momentum", type=_nonneg_float, help="SGD momentum (default: 0.9)")
    g.add_argument(
        "--weight-decay",
        type=_nonneg_float,
        help="L2 decay of the weights, not the biases (default: 5e-4)",
    )
    g.add_argument(
        "--seed",
        type=_nonneg_int,
        help="seeds init, data order, augmentation, dropout (default: 0)",
    )

    g = p.add_argument_group("output")
    g.add_argument(
        "--out",
        default=None,
        help="folder for checkpoints and logs (default: runs/<net>; on "
        "--resume, the checkpoint's folder)",
    )
    g.add_argument(
        "--resume",
        default=None,
        help="checkpoint file, or a folder (its newest intact checkpoint)",
    )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="when --out holds another run, move that run aside to "
        "<out>.old-N and start afresh (nothing is deleted); without it such "
        "an --out is refused",
    )
    g.add_argument(
        "--keep-checkpoints",
        type=_nonneg_int,
        default=3,
        help="newest checkpoints kept in --out (0: all)",
    )
    g.add_argument(
        "--log-every",
        type=_positive_int,
        default=20,
        help="steps between metrics.jsonl step records",
    )
    g.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    g.add_argument("--quiet", action="store_true", help="no messages except warnings")
    g.add_argument("--no-plot", action="store_true", help="do not draw curves.png")

    g = p.add_argument_group("device")
    g.add_argument(
        "--device",
        default="cpu",
        help="cpu, or cuda / cuda:N (one GPU, through cc2ops.cuda)",
    )
    g.add_argument(
        "--devices",
        type=_positive_int,
        default=1,
        help="number of GPUs (> 1 needs the multi-GPU rewriter)",
    )
    g.add_argument(
        "--no-graph",
        action="store_true",
        help="on one GPU, call the steps eagerly instead of replaying CUDA graphs",
    )
    g.add_argument(
        "--spmd",
        action="store_true",
        help="one process per device under mpirun (on by itself when mpirun "
        "starts several processes); see distributed.py",
    )
    g.add_argument(
        "--group-size",
        type=_positive_int,
        default=None,
        help="--spmd: ranks per hybrid-parallel group (default: ranks per host)",
    )
    return p


def resolve_config(
    args: argparse.Namespace, header: dict | None, say: Callable[[str], None]
) -> argparse.Namespace:
    """Fill unset settings from the checkpoint (on --resume) or the defaults.

    An explicitly given setting that differs from the checkpoint's wins, with
    a warning that the run no longer continues the interrupted one exactly.
    """
    cfg = argparse.Namespace(**vars(args))
    saved = (header or {}).get("config", {})
    net = args.net or saved.get("net") or GENERIC_DEFAULTS["net"]
    defaults = {**GENERIC_DEFAULTS, **nets.NET_DEFAULTS[net]}
    for key in RESUMED:
        given = getattr(args, key)
        if given is None:
            value = saved[key] if key in saved else defaults[key]
        else:
            value = given
            if key in saved and saved[key] != given and key != "data":
                say(
                    f"warning: --{key.replace('_', '-')} {given} differs from the "
                    f"checkpoint's {saved[key]}; the resumed run will not match an "
                    "uninterrupted one"
                )
        setattr(cfg, key, value)
    cfg.net = net
    cfg.synthetic = bool(cfg.synthetic)
    if cfg.eval_batch_size is None:
        cfg.eval_batch_size = cfg.batch_size
    if cfg.out is None:
        if header is not None and args.resume is not None:
            r = Path(args.resume)
            cfg.out = str(r if r.is_dir() else r.parent)
        else:
            cfg.out = str(Path("runs") / net)
    return cfg


# --------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------


@dataclass
class Backend:
    """Where the training graph runs.

    Attributes
    ----------
    name : str
        ``"cpu"``, ``"cuda:N"``, ``"cuda:N-M"`` (several GPUs) or
        ``"cpu x K virtual devices"``.
    mode : pytensor Mode
        The mode of the training step: ``cc2ops.mode``, ``cc2ops.cuda.mode``
        or a multi-device mode of ``cc2ops.distributed.hybrid``.
    shared : callable
        ``shared(value, name)`` for the parameters and momenta.
    n_devices : int
        Devices the data-parallel rewriter splits each batch over (1: none).
    distribute : callable or None
        ``distribute(outputs) -> outputs``: ``cc2ops.distributed.hybrid.distribute``
        for these devices, applied to the loss before ``pytensor.grad``.
    sync : callable or None
        ``sync(train_fn)``: writes the per-device parameters back into the
        shared variables before another function (evaluation) reads them.
    eval_mode : pytensor Mode or None
        Mode of the evaluation function (default: ``mode``).
    dropout_device : int or None
        GPU label the dropout states live on (one GPU: the step then has no
        host node), or ``None`` for host states.
    """

    name: str
    mode: Any
    shared: Callable[[np.ndarray, str], Any]
    n_devices: int = 1
    distribute: Callable[[list], list] | None = None
    sync: Callable[[Any], None] | None = None
    eval_mode: Any = None
    dropout_device: int | None = None
    graph_device: int | None = None


def select_backend(device: str, devices: int) -> Backend:
    """The backend for ``--device`` / ``--devices``, or :class:`DeviceError`.

    Never falls back to the CPU when a GPU was asked for: an unusable
    ``--device cuda`` (no pycuda, driver or device) or ``--devices K`` without
    a multi-device rewriter for that device raises, saying why.
    ``--device cpu --devices K`` runs the rewriter on K virtual devices of the
    host (``cc2ops.distributed.hybrid``'s host collectives): the same maths as
    K GPUs, no speed-up; it is how the data-parallel path is tested on a CPU.
    """
    import pytensor

    import cc2ops
    from cc2ops.distributed import hybrid

    if device == "cpu":
        if devices == 1:
            return Backend(
                "cpu", cc2ops.mode, lambda v, name: pytensor.shared(v, name=name)
            )
        mg = hybrid
        return Backend(
            f"cpu x {devices} virtual devices",
            mg.mode(devices, "virtual"),
            lambda v, name: pytensor.shared(v, name=name),
            n_devices=devices,
            distribute=lambda outs: mg.distribute(outs, devices, backend="virtual"),
            sync=mg.sync,
            eval_mode=cc2ops.mode,
        )
    if device != "cuda" and not device.startswith("cuda:"):
        raise DeviceError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    try:
        index = int(device.partition(":")[2] or 0)
    except ValueError:
        raise DeviceError(f"--device {device}: N in cuda:N must be an int") from None
    if index < 0:
        raise DeviceError(f"--device {device}: N in cuda:N must be >= 0")
    from cc2ops import cuda

    labels = list(range(index, index + devices))
    mg = hybrid if devices > 1 else None
    if mg is not None:
        mode = cuda.mode(device=index, devices=labels)
        if not isinstance(mode, mg.MultiDeviceMode):
            raise DeviceError(
                f"--devices {devices}: this version of cc2ops has the multi-GPU "
                "rewriter only for virtual devices on the host (--device cpu "
                f"--devices {devices}); cc2ops.cuda.mode(devices={labels}) does not "
                "distribute the graph over GPUs yet; train on one GPU (--devices 1)"
            )
    if not cuda.is_available():
        raise DeviceError(
            f"--device {device}: CUDA is not available: {cuda.unavailable_reason()}"
        )
    if mg is None:
        return Backend(
            f"cuda:{index}",
            cuda.mode(device=index),
            lambda v, name: cuda.shared(v, device=index, name=name),
            dropout_device=index,
            graph_device=index,
        )
    return Backend(
        f"cuda:{labels[0]}-{labels[-1]}",
        mode,
        lambda v, name: cuda.shared(v, device=index, name=name),
        n_devices=devices,
        distribute=lambda outs: mg.distribute(outs, labels, backend=mode.backend),
        sync=mg.sync,
        eval_mode=cuda.mode(device=index),
    )


def _to_host(value: Any) -> np.ndarray:
    # GPU shared variables may hand back device arrays; .get() copies them
    if not isinstance(value, np.ndarray) and hasattr(value, "get"):
        value = value.get()
    return np.array(value, copy=True)


# --------------------------------------------------------------------------
# schedule and graph
# --------------------------------------------------------------------------


def learning_rate(step: int, cfg: argparse.Namespace, steps_per_epoch: int) -> float:
    """The learning rate of global step ``step`` (0-based; a pure function of it).

    ``--warmup-epochs`` ramps it linearly from ``lr/w`` to ``lr`` over the
    first ``w = warmup_epochs * steps_per_epoch`` steps; the schedule then
    runs on the global step: ``step`` multiplies by ``lr_gamma`` every
    ``lr_step_epochs`` epochs, ``cosine`` follows half a cosine from ``lr``
    to 0 at the end of ``--epochs``, ``constant`` keeps ``lr``. With
    ``--devices K`` the base rate is ``K * lr`` (``cfg.lr_scale``).
    """
    base = cfg.lr * getattr(cfg, "lr_scale", 1.0)
    if cfg.lr_schedule == "constant":
        lr = base
    elif cfg.lr_schedule == "step":
        lr = base * cfg.lr_gamma ** (step // (cfg.lr_step_epochs * steps_per_epoch))
    else:
        total = cfg.epochs * steps_per_epoch
        lr = base * 0.5 * (1.0 + math.cos(math.pi * min(step / total, 1.0)))
    warmup = cfg.warmup_epochs * steps_per_epoch
    if step < warmup:
        lr *= (step + 1) / warmup
    return lr


def compile_functions(
    net: nets.Network,
    params: dict[str, Any],
    momenta: dict[str, Any],
    dropout_states: dict[str, Any],
    cfg: argparse.Namespace,
    backend: Backend,
) -> tuple[Callable, Callable]:
    """The compiled training step and evaluation functions.

    ``train(x, y, lr) -> (mean loss, mean top-1 error)`` applies one step of
    momentum SGD with weight decay (``v <- m v - lr (g + wd W)``,
    ``W <- W + v``; biases are not decayed) and advances the dropout states.
    ``evaluate(x, y) -> (loss sum, top-1 errors, top-5 errors)``. ``x`` is
    float32 (B, 3, crop, crop), ``y`` int32 (B,); every intermediate is
    float32 (the graphs are built with ``floatX=float32``). With
    ``backend.graph_device`` the inputs (the learning rate too) and outputs
    are GPU values there (``gpu_step.gpu_inputs``), as graph capture needs.
    """
    import pytensor
    import pytensor.tensor as pt

    from cc2ops.testing.nets import training_step

    gd = backend.graph_device
    with pytensor.config.change_flags(floatX="float32"):
        if gd is None:
            inputs = [pt.tensor4("images", dtype="float32"), pt.ivector("labels"),
                      pt.fscalar("lr")]  # fmt: skip
            x, y, lr = inputs
        else:
            inputs, (x, y, lr) = gpu_step.gpu_inputs(gd, cfg.crop, with_lr=True)

        # the step of the benchmarks and tests too; with --devices K,
        # distribute makes the conv segment data-parallel and the FC segment
        # model-parallel (the gradients equal the single-device ones)
        step = training_step(
            net, x, y, params, momenta, lr=lr, momentum=cfg.momentum,
            weight_decay=cfg.weight_decay, dropout_states=dropout_states,
            distribute=backend.distribute,
        )  # fmt: skip
        loss, err = step.loss, step.error
        train = pytensor.function(
            inputs,
            [loss, err] if gd is None else gpu_step.gpu_outputs([loss, err], gd),
            updates=step.updates,
            mode=backend.mode,
            name="train_step",
        )

    return train, compile_evaluate(net, params, backend)


def compile_evaluate(net: nets.Network, params: dict[str, Any], backend: Backend):
    """``evaluate(x, y) -> (loss sum, top-1 errors, top-k errors)`` of a batch.

    ``k = min(5, classes)``; ``x`` float32 (B, 3, crop, crop), ``y`` int32 (B,).
    """
    import pytensor
    import pytensor.tensor as pt

    import cc2ops

    gd = backend.graph_device
    with pytensor.config.change_flags(floatX="float32"):
        if gd is None:
            inputs = [pt.tensor4("images", dtype="float32"), pt.ivector("labels")]
            x, y = inputs
        else:
            inputs, (x, y) = gpu_step.gpu_inputs(gd, net.crop, with_lr=False)
        logits = net.forward(x, params, train=False)
        k5 = min(5, net.n_classes)
        outputs = [
            cc2ops.softmax_cross_entropy(logits, y).sum(),
            cc2ops.top_k_error(logits, y, k=1).sum(),
            cc2ops.top_k_error(logits, y, k=k5).sum(),
        ]
        return pytensor.function(
            inputs,
            outputs if gd is None else gpu_step.gpu_outputs(outputs, gd),
            mode=backend.eval_mode or backend.mode,
            name="evaluate",
        )


# --------------------------------------------------------------------------
# logging
# --------------------------------------------------------------------------


def _latest_per_step(records: list[dict], kind: str) -> list[dict]:
    # a resumed run re-logs the steps after its checkpoint; the last one wins
    by_step: dict[int, dict] = {}
    for r in records:
        if r.get("kind") == kind:
            by_step[int(r["step"])] = r
    return [by_step[s] for s in sorted(by_step)]


def plot_curves(records: list[dict], path: Path) -> Path:
    """Draw training loss / error and validation errors to ``path`` (PNG).

    Errors are fractions, as everywhere. The file is replaced whole (a
    temporary file, fsync, rename), so a failure leaves the previous plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = _latest_per_step(records, "step")
    epochs = _latest_per_step(records, "epoch")
    fig, (ax_loss, ax_err) = plt.subplots(1, 2, figsize=(11, 4))
    if steps:
        s = [r["step"] for r in steps]
        ax_loss.plot(s, [r["loss"] for r in steps], lw=1, label="train (per log)")
        ax_err.plot(
            s,
            [r["top1_err"] for r in steps],
            lw=1,
            alpha=0.6,
            label="train top-1",
        )
    if epochs:
        s = [r["step"] for r in epochs]
        ax_loss.plot(s, [r["val_loss"] for r in epochs], "o-", label="val")
        ax_err.plot(s, [r["val_top1_err"] for r in epochs], "o-", label="val top-1")
        ax_err.plot(s, [r["val_top5_err"] for r in epochs], "s-", label="val top-5")
    ax_loss.set(xlabel="step", ylabel="cross-entropy", title="loss")
    ax_err.set(xlabel="step", ylabel="error (fraction)", title="error")
    for ax in (ax_loss, ax_err):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    try:
        run_folder.atomic_replace(
            path, lambda tmp: fig.savefig(tmp, dpi=100, format="png")
        )
    finally:
        plt.close(fig)
    return path


# --------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------


def _printer(quiet: bool) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if quiet:
            return
        from tqdm import tqdm

        tqdm.write(msg, file=sys.stderr)

    return say


class _InterruptGuard:
    """Ctrl-C while training: finish the step, write a checkpoint, then stop.

    While :attr:`armed` (the training loop), the first SIGINT only sets
    :attr:`requested`; the loop looks at it after each step, where the
    parameters, momenta, dropout states, data position and running sums
    agree, writes the mid-epoch checkpoint there and raises
    :class:`Interrupted`, so resuming it gives the uninterrupted run (during an
    epoch's evaluation, the epoch's own checkpoint is that position). A
    second Ctrl-C, or one outside the loop (loading, compiling, plotting),
    raises :class:`Interrupted` at once. Signal handlers can only be set in
    the main thread; elsewhere Ctrl-C stays Python's plain
    ``KeyboardInterrupt``.
    """

    def __init__(self) -> None:
        self.out: str | None = None
        self.armed = False
        self.requested = False
        self._old: Any = None

    def __enter__(self) -> _InterruptGuard:
        # only the main thread may set handlers; an ignored SIGINT (nohup,
        # a background job) stays ignored
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.armed and not self.requested:
            self.requested = True
            return
        raise Interrupted(self.out)


def _interrupt_message(e: KeyboardInterrupt) -> str:
    """The one line :func:`cli` prints for Ctrl-C: what was kept, how to go on."""
    import shlex

    out = getattr(e, "out", None)
    ckpt = getattr(e, "checkpoint", None)
    if not out:  # before the run's folder was known: nothing was written
        return "train.py: interrupted"
    if ckpt:
        return (
            f"train.py: interrupted at step {e.step}; wrote {ckpt}; resume with "
            f"--resume {shlex.quote(out)}"
        )
    if Path(out).is_dir() and ckpt_mod.list_checkpoints(out):
        return (
            f"train.py: interrupted; resume with --resume {shlex.quote(out)} (its "
            "newest checkpoint; the steps after it are redone)"
        )
    return "train.py: interrupted before the first checkpoint; nothing to resume"


def _evaluate(runner, source, batch_size: int, workers: int, depth: int):
    if not hasattr(runner, "eval_sums"):  # a compiled evaluate function
        runner = gpu_step.EagerRunner(None, runner)
    n = 0
    skipped: list[tuple[str, str]] = []
    with data.iterate(
        source, data.eval_plan(len(source), batch_size), 0, workers, depth
    ) as batches:
        for b in batches:
            skipped.extend(b.skipped)
            if len(b.y) == 0:
                continue
            runner.evaluate(b.x, b.y)
            n += len(b.y)
    loss, top1, top5 = runner.eval_sums()
    if n == 0:
        raise data.DatasetError("no validation image could be read")
    return loss / n, top1 / n, top5 / n, skipped


def _make_sources(cfg, say, header):
    """Training and validation sources, class names and normalisation."""
    if cfg.synthetic:
        classes = tuple(f"class{i:04d}" for i in range(cfg.classes))
        n_val = max(cfg.eval_batch_size, cfg.synthetic_images // 10)
        train = data.SyntheticSource(
            cfg.synthetic_images, cfg.classes, cfg.crop, cfg.seed, split_id=0
        )
        val = data.SyntheticSource(n_val, cfg.classes, cfg.crop, cfg.seed, split_id=1)
        return train, val, classes, data.Normalisation((0.0,) * 3, (1.0,) * 3)
    if cfg.data is None:
        raise data.DatasetError("give --data FOLDER (ImageNet layout) or --synthetic")
    try:
        import PIL  # noqa: F401
    except ImportError as e:
        raise data.DatasetError(
            f"reading images needs Pillow ({e}); pip install -e '.[examples]'"
        ) from e
    train_split = data.scan_split(cfg.data, "train")
    val_split = data.scan_split(cfg.data, "val")
    data.check_same_classes(train_split, val_split)
    if cfg.crop > cfg.scale:
        raise data.DatasetError(
            f"--crop ({cfg.crop}) must not exceed --scale ({cfg.scale})"
        )
    say(
        f"data {cfg.data}: {len(train_split)} training and {len(val_split)} "
        f"validation images, {len(train_split.classes)} classes"
    )
    if header is not None:
        saved = tuple(header.get("classes", ()))
        if saved != train_split.classes:
            raise ckpt_mod.CheckpointError(
                f"the checkpoint was trained on {len(saved)} classes "
                f"({', '.join(saved[:3])} ...) but {cfg.data} has "
                f"{len(train_split.classes)} ({', '.join(train_split.classes[:3])} ...)"
            )
        norm = data.Normalisation.from_json(header["normalisation"])
    else:
        t0 = time.perf_counter()
        norm, used, skipped = data.channel_stats(
            train_split,
            cfg.scale,
            cfg.crop,
            cfg.stats_images,
            cfg.seed,
            workers=cfg.workers,
            bad_images=cfg.bad_images,
        )
        say(
            f"normalisation from {used} training images "
            f"({time.perf_counter() - t0:.1f} s): mean "
            f"{', '.join(f'{m:.1f}' for m in norm.mean)}, std "
            f"{', '.join(f'{s:.1f}' for s in norm.std)}"
        )
        if skipped:
            say("warning: " + data.summarise_skipped(skipped))
    train = data.FolderSource(train_split, cfg.scale, cfg.crop, norm, cfg.bad_images)
    val = data.FolderSource(val_split, cfg.scale, cfg.crop, norm, cfg.bad_images)
    return train, val, train_split.classes, norm


def _gpu_sources(args, cfg, backend, train_src, val_src, norm, say):
    """The GPU input pipeline's sources (``gpu_data``) where it is chosen."""
    want = args.data_device
    if want == "cpu" or (want == "auto" and backend.graph_device is None):
        return train_src, val_src
    if backend.graph_device is None:
        raise DeviceError(
            "--data-device gpu needs --device cuda on one GPU (--devices 1)"
        )
    sizes = (cfg.batch_size, cfg.eval_batch_size)
    try:
        return gpu_data.make_sources(
            train_src, val_src, norm, backend.graph_device, sizes,
            args.decode_threads, max(1, args.workers),
        )  # fmt: skip
    except gpu_data.GpuDataError as e:
        if want == "gpu":
            raise
        say(f"warning: {e}; decoding with Pillow on the CPU")
        return train_src, val_src


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the training script with command-line arguments ``argv``.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (``python train.py --help`` lists them); default
        ``sys.argv[1:]``.

    Returns
    -------
    dict
        Summary: ``out``, ``epoch`` (epochs completed), ``step``, ``history``
        (the epoch records of this run), ``step_losses`` (``(step, loss)`` of
        every step of this run), ``skipped_images`` (distinct unreadable
        images met), ``checkpoint`` (last written), ``curves`` and
        ``network`` (the layer-spec hash).

    Raises
    ------
    data.DatasetError
        Missing or empty folders, class folders differing between train and
        val, an unreadable image with ``--bad-images error``, no readable
        image at all.
    checkpoint.CheckpointError
        A ``--resume`` checkpoint that is missing, unreadable or from another
        network or class list.
    nets.NetworkError
        A network that does not fit the input size.
    DeviceError
        ``--device cuda`` without a usable GPU, ``--devices K`` without the
        multi-GPU rewriter (never a silent CPU run).
    TrainingError
        The loss became NaN or infinite.
    run_folder.RunFolderError
        ``--out`` holds another run (without ``--overwrite``), or a
        checkpoint or log cannot be written (a full disk); what was written
        before stays intact.
    Interrupted
        Ctrl-C (a ``KeyboardInterrupt``); during training, after writing a
        checkpoint of the exact position (its ``checkpoint`` attribute).
    SystemExit
        Bad command-line arguments (argparse). :func:`cli` turns the errors
        above into a message and exit status 2 (130 for Ctrl-C).
    """
    # parsed before PyTensor is imported (seconds): flag errors come at once
    args = build_parser().parse_args(argv)
    args.spmd = args.spmd or spmd.launched_by_mpirun()
    with spmd.guard(args.spmd), _InterruptGuard() as guard:
        return _run(args, guard)


def cli(argv: Sequence[str] | None = None) -> int:
    """:func:`main` for the command line: user errors become one message, status 2."""
    try:
        main(argv)
    except USER_ERRORS as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(_interrupt_message(e), file=sys.stderr)
        return 130
    return 0


def _run(args: argparse.Namespace, guard: _InterruptGuard) -> dict[str, Any]:
    backend = None
    if args.spmd:
        # the MPI world first; ranks other than the root log nothing and write
        # into a private folder (below), but every rank checks --out alike
        backend = spmd.spmd_backend(Backend, args.device, args.devices, args.group_size)
        args.quiet = args.quiet or not spmd.is_root(backend)
    say = _printer(args.quiet)
    warn = _printer(False)  # warnings are shown with --quiet too
    # the checks that need no PyTensor come first: checkpoint, settings, --out
    resume = ckpt_mod.load_checkpoint(args.resume, warn) if args.resume else None
    header = resume.header if resume else None
    cfg = resolve_config(args, header, warn)
    if resume is None and not args.overwrite:
        done = _finished(cfg, warn)
        if done is not None:
            return done
    folder = run_folder.plan_run_folder(cfg.out, resume, args.overwrite)
    guard.out = cfg.out
    resumed_here = resume is not None and (
        Path(resume.path).resolve().parent == Path(cfg.out).resolve()
    )
    run_id = (header or {}).get("run_id") or uuid.uuid4().hex[:16]
    # fail on an unusable device before any data is read: never a silent CPU run
    if backend is None:
        backend = select_backend(args.device, args.devices)
    # data-parallel training over K GPUs: --batch-size images per GPU, so the
    # batch the rewriter splits is K times larger, and the learning rate is
    # scaled linearly with K (as cuda-convnet2's multi-GPU configurations do)
    cfg.lr_scale = float(backend.n_devices)
    global_batch = cfg.batch_size * backend.n_devices
    if resume and header.get("net", {}).get("name") != cfg.net:
        raise ckpt_mod.CheckpointError(
            f"checkpoint {resume.path} is from another network: it holds "
            f"{header.get('net', {}).get('name')!r}, this run asks for --net "
            f"{cfg.net}"
        )
    if resume:
        say(
            f"resuming from {resume.path}: epoch {header['epoch']}, step "
            f"{header['step']}"
        )
        saved_devices = int(header.get("devices", 1))
        if saved_devices != backend.n_devices:
            warn(
                f"warning: the checkpoint was trained on {saved_devices} device(s), "
                f"this run uses {backend.n_devices}; the batch and learning rate "
                "change with it"
            )
    train_src, val_src, classes, norm = _make_sources(cfg, say, header)
    train_src, val_src = _gpu_sources(args, cfg, backend, train_src, val_src, norm, say)

    net = nets.Network(cfg.net, len(classes), cfg.crop, cfg.width_mult)
    if resume:
        ckpt_mod.check_network(
            resume, net.spec_hash(), _net_header(net), net.param_shapes
        )
    say(net.describe())

    steps_per_epoch = len(train_src) // global_batch
    if steps_per_epoch == 0:
        raise data.DatasetError(
            f"the training set has {len(train_src)} images, fewer than one batch "
            f"of {global_batch} (--batch-size {cfg.batch_size}"
            + (f" x {backend.n_devices} devices)" if backend.n_devices > 1 else ")")
        )

    # ---- state: parameters, momenta, dropout states, position
    dropout_states = net.make_dropout_states(
        [cfg.seed, data.DROPOUT_STREAM], device=backend.dropout_device
    )
    progress = _fresh_progress()
    if resume:
        values, moms = resume.params, resume.momenta
        epoch = int(header["epoch"])
        step_in_epoch = int(header["step_in_epoch"])
        step = int(header["step"])
        if step_in_epoch:
            progress.update(header.get("epoch_progress", {}))
        _restore_dropout(dropout_states, header, resume.states, warn)
    else:
        values = net.init_params([cfg.seed, data.INIT_STREAM], cfg.init)
        moms = {k: np.zeros_like(v) for k, v in values.items()}
        epoch = step_in_epoch = step = 0
    params = {k: backend.shared(values[k], k) for k in net.param_shapes}
    momenta = {k: backend.shared(moms[k], f"{k}.momentum") for k in net.param_shapes}

    say(
        f"compiling the training step and the evaluation ({backend.name}): "
        "15-30 s on a CPU, seconds when PyTensor's cache already holds them..."
    )
    t0 = time.perf_counter()
    train_fn, eval_fn = compile_functions(
        net, params, momenta, dropout_states, cfg, backend
    )
    say(
        f"compiled the training and evaluation functions in "
        f"{time.perf_counter() - t0:.1f} s ({backend.name}, dropout: "
        f"{'cc2ops' if dropout_states else 'none'})"
    )
    if backend.graph_device is None:
        runner = gpu_step.EagerRunner(train_fn, eval_fn)
    else:
        runner = gpu_step.GraphRunner(
            train_fn, eval_fn, backend.graph_device, args.log_every,
            graph=not args.no_graph,
            batch_sizes=(cfg.batch_size, cfg.eval_batch_size),
        )  # fmt: skip

    out = spmd.output_folder(Path(cfg.out), backend)  # the root rank writes
    if out == Path(cfg.out):
        run_folder.apply_run_folder(folder, warn)
    else:
        out.mkdir(parents=True, exist_ok=True)
    log = run_folder.MetricsLog(out, CSV_FIELDS, warn)
    if resume and folder.action == "replace" and resumed_here and out == Path(cfg.out):
        # the old run's history up to the checkpoint is this run's too
        run_folder.MetricsLog(folder.aside, CSV_FIELDS, warn).copy_until(step, log)
    elif resume:
        # records of steps after the checkpoint belong to the interrupted run
        log.truncate(step)

    def save(kind: str) -> Path:
        name = (
            f"ckpt-epoch{epoch:03d}.npz"
            if step_in_epoch == 0
            else f"ckpt-epoch{epoch:03d}-step{step:08d}.npz"
        )
        drop_hdr, drop_arrays = _dropout_header(dropout_states)
        hdr = {
            "run_id": run_id,
            "net": _net_header(net),
            "classes": list(classes),
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "step": step,
            "kind": kind,
            "devices": backend.n_devices,
            "normalisation": norm.to_json(),
            "seed": cfg.seed,
            "data_rng": {
                "scheme": "numpy.random.default_rng([seed, 0, epoch]) draws each "
                "epoch's order, crops and flips",
                "seed": cfg.seed,
                "epoch": epoch,
                "batches_done": step_in_epoch,
            },
            "dropout_states": drop_hdr,
            "epoch_progress": progress if step_in_epoch else {},
            "schedule": {
                "kind": cfg.lr_schedule,
                "lr": cfg.lr,
                "lr_scale": cfg.lr_scale,
                "gamma": cfg.lr_gamma,
                "step_epochs": cfg.lr_step_epochs,
                "epochs": cfg.epochs,
                "warmup_epochs": cfg.warmup_epochs,
                "steps_per_epoch": steps_per_epoch,
                "current_lr": learning_rate(step, cfg, steps_per_epoch),
            },
            "config": {k: getattr(cfg, k) for k in RESUMED},
        }
        try:
            path = ckpt_mod.save_checkpoint(
                out / name,
                hdr,
                {k: _to_host(p.get_value(borrow=True)) for k, p in params.items()},
                {k: _to_host(v.get_value(borrow=True)) for k, v in momenta.items()},
                drop_arrays,
            )
        except OSError as e:
            raise run_folder.RunFolderError(_save_failed(out / name, e)) from e
        ckpt_mod.prune(out, args.keep_checkpoints, current=path)
        return path

    from tqdm import tqdm

    history: list[dict] = []
    step_losses: list[tuple[int, float]] = []
    skipped_paths: set[str] = set()
    last_ckpt: Path | None = None
    depth = max(args.prefetch, 1)
    stopped = cfg.max_steps is not None and step >= cfg.max_steps
    if epoch >= cfg.epochs:
        say(f"nothing to do: {epoch} of --epochs {cfg.epochs} are done")
    t_run = time.perf_counter()
    guard.armed = True

    while epoch < cfg.epochs and not stopped:
        plan = data.epoch_plan(len(train_src), global_batch, cfg.seed, epoch)
        bar = tqdm(
            total=steps_per_epoch,
            initial=step_in_epoch,
            desc=f"epoch {epoch + 1}/{cfg.epochs}",
            unit="batch",
            disable=args.no_progress or args.quiet,
            dynamic_ncols=True,
            file=sys.stderr,
        )
        t_epoch = time.perf_counter()
        epoch_skips: list[tuple[str, str]] = []
        queued, wait0 = 0, progress["wait"]

        def account(done: list[gpu_step.StepMetrics], progress=progress) -> None:
            # steps come back from the runner every --log-every steps on a GPU
            for m in done:
                if not math.isfinite(m.loss):
                    raise TrainingError(
                        f"the training loss became {m.loss} at step {m.step} "
                        f"(lr {m.lr:g}); lower --lr"
                    )
                progress["seen"] += m.n
                progress["loss_sum"] += m.loss * m.n
                progress["err_sum"] += m.err * m.n
                progress["win_loss"] += m.loss
                progress["win_err"] += m.err
                progress["win_n"] += 1
                step_losses.append((m.step, m.loss))

        with data.iterate(
            train_src, plan, step_in_epoch, args.workers, depth
        ) as batches:
            it = iter(batches)
            while True:
                t_wait = time.perf_counter()
                b = next(it, None)
                progress["wait"] += time.perf_counter() - t_wait
                if b is None:
                    break
                epoch_skips.extend(b.skipped)
                lr = learning_rate(step, cfg, steps_per_epoch)
                if len(b.y):
                    account(runner.train(b.x, b.y, lr, step + 1))
                    queued += len(b.y)
                step += 1
                step_in_epoch += 1
                seen = progress["seen"]
                elapsed = max(time.perf_counter() - t_epoch, 1e-9)
                rate = queued / elapsed
                bar.update(1)
                post = {
                    "img_s": f"{rate:.0f}",
                    "data_wait": f"{100 * (progress['wait'] - wait0) / elapsed:.0f}%",
                }
                if seen:  # on a GPU, known from the first read-back on
                    post = {
                        "loss": f"{progress['loss_sum'] / seen:.3f}",
                        "top1_err": f"{progress['err_sum'] / seen:.3f}",
                        **post,
                    }
                bar.set_postfix(post, refresh=False)
                if step % args.log_every == 0 and progress["win_n"]:
                    win_n = progress["win_n"]
                    log.record(
                        {
                            "kind": "step",
                            "epoch": epoch,
                            "step": step,
                            "lr": lr,
                            "loss": progress["win_loss"] / win_n,
                            "top1_err": progress["win_err"] / win_n,
                            "images_per_s": rate,
                            "time_s": time.perf_counter() - t_run,
                        }
                    )
                    progress.update(win_loss=0.0, win_err=0.0, win_n=0)
                if guard.requested:
                    break
                if cfg.max_steps is not None and step >= cfg.max_steps:
                    stopped = True
                    break
        account(runner.flush())
        bar.close()
        skipped_paths.update(p for p, _ in epoch_skips)
        if epoch_skips:
            warn("warning: " + data.summarise_skipped(epoch_skips))
        if guard.requested:
            # Ctrl-C: the exact position, as --max-steps writes it
            last_ckpt = save("interrupted")
            raise Interrupted(str(out), str(last_ckpt), step)
        if step_in_epoch < steps_per_epoch:
            # stopped by --max-steps inside the epoch: checkpoint the position
            last_ckpt = save("max-steps")
            say(f"stopped at step {step} (--max-steps); checkpoint {last_ckpt}")
            break
        epoch_s = time.perf_counter() - t_epoch
        if backend.sync is not None:
            backend.sync(train_fn)  # the evaluation reads the shared variables
        val_loss, val_top1, val_top5, val_skips = _evaluate(
            runner, val_src, cfg.eval_batch_size, args.workers, depth
        )
        skipped_paths.update(p for p, _ in val_skips)
        if val_skips:
            warn("warning: validation " + data.summarise_skipped(val_skips))
        epoch += 1
        step_in_epoch = 0
        seen = progress["seen"]
        rec = {
            "epoch": epoch,
            "step": step,
            "lr": learning_rate(step - 1, cfg, steps_per_epoch),
            "train_loss": progress["loss_sum"] / seen if seen else float("nan"),
            "train_top1_err": progress["err_sum"] / seen if seen else float("nan"),
            "val_loss": val_loss,
            "val_top1_err": val_top1,
            "val_top5_err": val_top5,
            "images_per_s": seen / max(epoch_s, 1e-9),
            "data_wait_s": progress["wait"],
            "epoch_s": epoch_s,
            "skipped_images": len(epoch_skips) + len(val_skips),
        }
        progress = _fresh_progress()
        log.epoch(rec)
        history.append(rec)
        last_ckpt = save("epoch")
        say(
            f"epoch {epoch}/{cfg.epochs}: train loss {rec['train_loss']:.4f} "
            f"top-1 err {rec['train_top1_err']:.4f} | val loss {val_loss:.4f} "
            f"top-1 err {val_top1:.4f} top-5 err {val_top5:.4f} | "
            f"{rec['images_per_s']:.0f} img/s, {epoch_s:.1f} s "
            f"(waited {rec['data_wait_s']:.1f} s for data) | {last_ckpt.name}"
        )
        if guard.requested:  # Ctrl-C during the evaluation
            raise Interrupted(str(out), str(last_ckpt), step)
    guard.armed = False

    runner.close()
    curves = None
    if not args.no_plot:
        try:
            curves = plot_curves(log.read(), out / "curves.png")
        except OSError as e:  # the checkpoints and logs are written
            warn(f"warning: could not draw {out / 'curves.png'}: {e}")
    if skipped_paths:
        say(f"{len(skipped_paths)} distinct unreadable image(s) were skipped")
    return {
        "out": str(out),
        "epoch": epoch,
        "step": step,
        "history": history,
        "step_losses": step_losses,
        "skipped_images": len(skipped_paths),
        "checkpoint": str(last_ckpt) if last_ckpt else None,
        "curves": str(curves) if curves else None,
        "network": net.spec_hash(),
    }


def _finished(cfg: argparse.Namespace, warn: Callable[[str], None]) -> dict | None:
    """The summary of :func:`main` when ``--out`` already holds this very run,
    finished (the same command run twice), else None."""
    config = {k: getattr(cfg, k) for k in RESUMED}
    last = run_folder.finished_run(cfg.out, config, cfg.epochs)
    if last is None:
        return None
    header = ckpt_mod.read_header(last)
    warn(
        f"nothing to do: {cfg.out} already holds this run, finished ({last.name}); "
        "to train it again, give another --out or --overwrite, to train longer "
        f"--resume {cfg.out} --epochs N"
    )
    curves = Path(cfg.out) / "curves.png"
    return {
        "out": str(cfg.out),
        "epoch": int(header["epoch"]),
        "step": int(header["step"]),
        "history": [],
        "step_losses": [],
        "skipped_images": 0,
        "checkpoint": str(last),
        "curves": str(curves) if curves.exists() else None,
        "network": header.get("net", {}).get("spec_hash"),
    }


def _fresh_progress() -> dict[str, float]:
    """Running sums of an epoch; a mid-epoch checkpoint stores them.

    ``seen``, ``loss_sum``, ``err_sum``: the epoch's training mean so far;
    ``wait``: seconds waited for data; ``win_*``: the window of the next
    ``metrics.jsonl`` step record.
    """
    return dict(
        seen=0.0, loss_sum=0.0, err_sum=0.0, wait=0.0, win_loss=0.0, win_err=0.0,
        win_n=0,
    )  # fmt: skip


def _save_failed(path: Path, e: OSError) -> str:
    """One line for a checkpoint that could not be written (a full disk)."""
    kept = ckpt_mod.list_checkpoints(path.parent)
    then = (
        f"the previous checkpoint {kept[-1][1]} is intact; free space and resume "
        f"with --resume {path.parent}"
        if kept
        else "no earlier checkpoint exists"
    )
    return f"cannot write checkpoint {path}: {e}; {then}"


def _dropout_header(
    states: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The dropout states as checkpoint header entries and arrays."""
    hdr: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for name, state in states.items():
        kind, value = nets.get_dropout_state(state)
        hdr[name] = {"kind": kind, "array": f"dropout/{name}"}
        arrays[f"dropout/{name}"] = value
    return hdr, arrays


def _restore_dropout(
    states: dict[str, Any],
    header: dict[str, Any],
    arrays: dict[str, np.ndarray],
    say: Callable[[str], None],
) -> None:
    saved = header.get("dropout_states") or {}
    for name, state in states.items():
        entry = saved.get(name)
        if entry is None:
            raise ckpt_mod.CheckpointError(
                f"the checkpoint holds no state for dropout layer {name}"
            )
        try:
            nets.set_dropout_state(state, entry["kind"], arrays.get(entry.get("array")))
        except nets.NetworkError as e:
            # e.g. saved before cc2ops had dropout: the masks cannot continue
            say(f"warning: {e}; dropout starts from a fresh state")


def _net_header(net: nets.Network) -> dict[str, Any]:
    return {
        "name": net.name,
        "width_mult": net.width_mult,
        "n_classes": net.n_classes,
        "input": [3, net.crop, net.crop],
        "spec_hash": net.spec_hash(),
    }


if __name__ == "__main__":
    sys.exit(cli())
