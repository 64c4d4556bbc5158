"""What the ImageNet example trains at on one GPU, against its own step (issue 17).

In one run, cuda-convnet2's ImageNet net (``--net imagenet``), batch 128,
224x224 crops of images resized to 256, in fp32 and then in TF32:

(a) ``step_graph``: the example's training step (``train.compile_functions``
    with GPU inputs and outputs) replayed as a CUDA graph on one device
    batch, timed with CUDA events after warm-up (learning rate 0, so the
    parameters stay put); checked: the replayed step and an eager call from
    the same dropout state give the same loss;
(b) ``train_synthetic``: ``train.py --device cuda --synthetic`` (graphs and
    device-drawn images, the defaults), one epoch of ``--steps`` steps;
(c) ``train_jpeg``: ``train.py --device cuda`` on an ImageNet-like JPEG folder
    the benchmark writes first (``--images`` training images, default 4096,
    of 500x375 pixels, quality 90, from random smooth images with Pillow;
    1000 classes as ImageNet, so every row trains the same net; one
    validation image per class), one epoch, GPU input pipeline;
(d) ``decode_only``: the GPU input pipeline alone on the same folder
    (read, nvImageCodec decode, augment kernel), one pass over the training
    plan; checked first against the CPU path on the first batch (mean
    absolute difference in pixel levels, the decoders' difference).

Images/s of (b) and (c) come from ``metrics.jsonl``'s step records (one every
5 steps, written after the runner's read-back, which waits for the device):
the images between the record at step ``--warmup-steps`` (default 10) and the
last one over the time between them, so compiling, capturing and the first
steps are excluded. Rows: ``images_per_s``, ``cc2ops_ms`` (ms per batch),
and on the train rows ``ratio`` = (b)/(a) and (c)/min(a, d) in images/s (the
issue's bars: >= 0.9 and >= 0.8); ``peer_ms`` is the ms per batch of the
reference of that ratio. Result file ``results/train-<gpu>-<date>.json``.

Without a GPU (or pycuda) the script says so and exits with status 0 having
measured nothing; without nvImageCodec, (c) and (d) are recorded as errors.

Run: ``python benchmarks/bench_train.py [--quick] [--out DIR]
[--precisions fp32,tf32] [--folder DIR] [--images N]``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "imagenet"))

from benchmarks.common import base_parser, time_cuda, write_results  # noqa: E402

BATCH = 128
SCALE, CROP = 256, 224
CLASSES = 1000
VAL_IMAGES = 1000
LOG_EVERY = 5
PRECISIONS = {"fp32": False, "tf32": True}


# --------------------------------------------------------------------------
# the JPEG folder
# --------------------------------------------------------------------------


def _write_images(args: tuple[str, int, int]) -> int:
    """Write ``count`` JPEGs (500x375, quality 90) into ``folder`` from ``seed``."""
    folder, seed, count = args
    from PIL import Image

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for k in range(count):
        coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        img = Image.fromarray(coarse).resize((500, 375), Image.Resampling.BICUBIC)
        px = np.asarray(img).astype(np.int16)
        px += rng.integers(-8, 9, px.shape, dtype=np.int16)
        buf = io.BytesIO()
        Image.fromarray(np.clip(px, 0, 255).astype(np.uint8)).save(
            buf, "JPEG", quality=90
        )
        Path(folder, f"{seed}_{k:05d}.JPEG").write_bytes(buf.getvalue())
    return count


def make_folder(root: Path, n_train: int, say) -> Path:
    """An ImageNet-layout folder of ``n_train`` + 1000 JPEGs (kept for reruns)."""
    marker = root / f"complete-{n_train}"
    if marker.exists():
        say(f"JPEG folder {root} exists ({n_train} training images)")
        return root
    t0 = time.perf_counter()
    jobs = []
    for split, n in (("train", n_train), ("val", VAL_IMAGES)):
        if n < CLASSES:
            raise ValueError(f"{split} needs >= {CLASSES} images (one per class)")
        for c in range(CLASSES):
            count = n // CLASSES + (1 if c < n % CLASSES else 0)
            seed = (0 if split == "train" else 100_000) + c
            jobs.append((str(root / split / f"n{c:04d}"), seed, count))
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        written = sum(pool.map(_write_images, jobs))
    marker.write_text(str(written))
    say(f"wrote {written} JPEGs to {root} in {time.perf_counter() - t0:.1f} s")
    return root


# --------------------------------------------------------------------------
# (a) the captured step
# --------------------------------------------------------------------------


def build_step(train_mod: Any) -> tuple[Any, dict]:
    """The example's training step with GPU I/O (what train.py --device cuda
    compiles) and its dropout states (on the device), He init."""
    backend = train_mod.select_backend("cuda", 1)
    net = train_mod.nets.Network("imagenet", CLASSES, CROP, 1.0)
    values = net.init_params([0, 1], "he")
    params = {k: backend.shared(values[k], k) for k in net.param_shapes}
    moms = {
        k: backend.shared(np.zeros_like(v), f"{k}.momentum") for k, v in values.items()
    }
    states = net.make_dropout_states([0, 2], device=backend.dropout_device)
    cfg = train_mod.argparse.Namespace(crop=CROP, weight_decay=5e-4, momentum=0.9)
    train_fn, _ = train_mod.compile_functions(net, params, moms, states, cfg, backend)
    return train_fn, states


def step_graph(
    train_mod: Any, step: tuple[Any, dict], precision: str, iters: int, warmup: int
) -> dict:
    from cc2ops.cuda import allow_tf32, capture_function
    from cc2ops.cuda.runtime import array

    train_fn, states = step
    nets = train_mod.nets
    rng = np.random.default_rng(0)
    x = array.to_gpu(rng.standard_normal((BATCH, 3, CROP, CROP), np.float32), 0)
    y = array.to_gpu(rng.integers(0, CLASSES, BATCH).astype(np.int32), 0)
    lr = np.asarray(0.0, np.float32)  # lr 0: the parameters stay put
    with allow_tf32(PRECISIONS[precision]):
        captured = capture_function(train_fn, warmup=1)
        try:
            captured(x, y, lr)  # the eager warm-up call
            before = {k: nets.get_dropout_state(v)[1] for k, v in states.items()}
            replayed = float(array.to_host(captured(x, y, lr)[0]))
            ms = time_cuda(
                lambda: captured(x, y, lr), warmup=warmup, iters=iters, on="cc2ops"
            )
        finally:
            captured.close()
        for k, v in states.items():
            nets.set_dropout_state(v, "cc2ops", before[k])
        eager = float(array.to_host(train_fn(x, y, lr)[0]))
    ok = bool(np.isfinite(eager) and abs(replayed - eager) <= 1e-4 * abs(eager))
    return {
        "name": "step_graph",
        "batch": BATCH,
        "pass": "step",
        "precision": precision,
        "cc2ops_ms": ms,
        "peer_ms": None,
        "ratio": None,
        "images_per_s": BATCH / (ms / 1e3),
        "correct": ok,
        "loss_eager": eager,
        "loss_replayed": replayed,
    }


# --------------------------------------------------------------------------
# (b), (c) train.py
# --------------------------------------------------------------------------


def window_rate(metrics: Path, warmup_steps: int) -> dict:
    """Images/s between the step record at ``warmup_steps`` and the last one."""
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line]
    steps = [r for r in recs if r.get("kind") == "step" and "time_s" in r]
    first = [r for r in steps if r["step"] >= warmup_steps]
    if len(first) < 2:
        raise RuntimeError(
            f"{metrics}: fewer than two step records after step {warmup_steps} "
            f"({[r['step'] for r in steps]}); run more steps"
        )
    a, b = first[0], first[-1]
    n = (b["step"] - a["step"]) * BATCH
    return {
        "images_per_s": n / (b["time_s"] - a["time_s"]),
        "timed_steps": b["step"] - a["step"],
        "from_step": a["step"],
    }


def run_train(train_mod: Any, args: list[str], precision: str, warmup: int) -> dict:
    from cc2ops.cuda import allow_tf32

    with tempfile.TemporaryDirectory(prefix="cc2ops-bench-train-") as out:
        t0 = time.perf_counter()
        with allow_tf32(PRECISIONS[precision]):
            summary = train_mod.main(
                [*args, "--out", out, "--log-every", str(LOG_EVERY), "--no-plot",
                 "--no-progress", "--quiet", "--keep-checkpoints", "1"]
            )  # fmt: skip
        res = window_rate(Path(out) / "metrics.jsonl", warmup)
    res["wall_s"] = time.perf_counter() - t0
    res["steps"] = summary["step"]
    res["skipped_images"] = summary["skipped_images"]
    res["final_loss"] = summary["step_losses"][-1][1]
    return res


# --------------------------------------------------------------------------
# (d) decode + augment
# --------------------------------------------------------------------------


def decode_only(folder: Path, workers: int, warm_batches: int = 3) -> dict:
    import data
    import gpu_data
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.device import get_device

    split = data.scan_split(folder, "train")
    norm = data.Normalisation((120.0, 115.0, 105.0), (60.0, 58.0, 57.0))
    ops = gpu_data.CudaOps(0, CROP, norm, BATCH)
    src = gpu_data.GpuFolderSource(split, SCALE, CROP, norm, "skip", ops, workers)
    plan = data.epoch_plan(len(split), BATCH, 0, 0)
    # correctness first: the first batch against the CPU path (decoders differ)
    cpu = data.FolderSource(split, SCALE, CROP, norm).batch(plan, 0)
    with data.iterate(src, plan, 0, workers, 1) as it:
        first = next(iter(it))
        got = array.to_host(first.x)
    std = np.asarray(norm.std, np.float32).reshape(1, 3, 1, 1)
    diff = np.abs(got - cpu.x) * std
    # the decoders' own difference on the batch's files, at full resolution:
    # the pipelines may differ by that (resize and crop are the same twin's)
    from PIL import Image

    blobs = [Path(split.paths[int(k)]).read_bytes() for k in plan.order[:BATCH]]
    dec = []
    for blob, img in zip(blobs, ops.decode_to_host(blobs), strict=True):
        if img is not None:
            with Image.open(io.BytesIO(blob)) as im:
                want = np.asarray(im.convert("RGB"))
            dec.append(np.abs(img.astype(np.int16) - want).mean())
    dec_mean = float(np.mean(dec)) if dec else float("nan")
    ok = bool(got.shape == cpu.x.shape and diff.mean() <= dec_mean + 0.5)
    dev = get_device(0)
    t0 = None
    n = 0
    with data.iterate(src, plan, 0, workers, 4) as it:
        for k, b in enumerate(it):
            if k == warm_batches:
                dev.synchronize()
                t0 = time.perf_counter()
            elif k > warm_batches:
                n += len(b.y)
        dev.synchronize()
    dt = time.perf_counter() - t0
    return {
        "images_per_s": n / dt,
        "timed_batches": n // BATCH,
        "correct": ok,
        "mean_level_diff_vs_cpu": float(diff.mean()),
        "mean_level_diff_decoders": dec_mean,
        "max_level_diff_vs_cpu": float(diff.max()),
        "routed_to_cpu": src.routed_to_cpu,
    }


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--precisions", default="fp32,tf32")
    p.add_argument(
        "--folder",
        type=Path,
        default=Path(tempfile.gettempdir()) / "cc2ops-bench-train-jpeg",
        help="where the JPEG folder is written (kept and reused)",
    )
    p.add_argument("--images", type=int, default=4096, help="training JPEGs")
    p.add_argument("--steps", type=int, default=40, help="steps of the synthetic run")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    args = p.parse_args(argv)
    precisions = [s for s in args.precisions.split(",") if s]
    bad = [s for s in precisions if s not in PRECISIONS]
    if bad:
        p.error(f"--precisions: unknown {bad}; choose from {sorted(PRECISIONS)}")
    if args.quick:
        # fewer synthetic steps and replays; the JPEG folder keeps the 4096
        # training images the bars are defined on
        args.steps, args.iters = 25, 10

    def say(msg: str) -> None:
        print(f"[bench_train] {msg}", flush=True)

    import cc2ops.cuda as cuda

    if not cuda.is_available():
        say(f"no GPU here ({cuda.unavailable_reason()}); nothing measured")
        return 0
    import train as train_mod

    rows: list[dict] = []
    errors: list[str] = []
    extra: dict[str, Any] = {
        "settings": {
            "net": "imagenet", "batch": BATCH, "scale": SCALE, "crop": CROP,
            "images": args.images, "synthetic_steps": args.steps,
            "warmup_steps": args.warmup_steps, "workers": args.workers,
            "log_every": LOG_EVERY,
        },
        "timing": "(a) CUDA events, median of replays; (b)(c) metrics.jsonl step "
        "records after the warm-up steps (the read-back waits for the device); "
        "(d) wall time after 3 warm-up batches, device synchronised",
        "errors": errors,
    }  # fmt: skip
    folder = None
    try:
        folder = make_folder(args.folder, args.images, say)
    except Exception as e:  # (c), (d) cannot run; (a), (b) still do
        errors.append(f"writing the JPEG folder: {type(e).__name__}: {e}")
    say("compiling the example's step for (a)")
    step = build_step(train_mod)
    decode = None
    if folder is not None:
        try:
            say("(d) decode + augment alone")
            decode = decode_only(folder, args.workers)
            say(f"(d) {decode['images_per_s']:.0f} images/s; vs CPU mean "
                f"{decode['mean_level_diff_vs_cpu']:.2f} levels")  # fmt: skip
        except Exception as e:
            traceback.print_exc()
            errors.append(f"decode_only: {type(e).__name__}: {e}")
    for precision in precisions:
        a = step_graph(train_mod, step, precision, args.iters, args.warmup)
        rows.append(a)
        say(f"(a) {precision}: {a['images_per_s']:.0f} images/s")
        if decode is not None:
            rows.append({
                "name": "decode_only", "batch": BATCH, "pass": "step",
                "precision": precision, "cc2ops_ms": BATCH / decode["images_per_s"]
                * 1e3, "peer_ms": None, "ratio": None, **decode,
            })  # fmt: skip
        synth = [
            "--device", "cuda", "--synthetic", "--net", "imagenet",
            "--synthetic-images", str(BATCH * args.steps), "--epochs", "1",
            "--batch-size", str(BATCH), "--classes", str(CLASSES),
        ]  # fmt: skip
        try:
            b = run_train(train_mod, synth, precision, args.warmup_steps)
            ref = a["images_per_s"]
            rows.append({
                "name": "train_synthetic", "batch": BATCH, "pass": "step",
                "precision": precision,
                "cc2ops_ms": BATCH / b["images_per_s"] * 1e3,
                "peer_ms": BATCH / ref * 1e3, "ratio": b["images_per_s"] / ref,
                "ratio_of": "step_graph", **b,
            })  # fmt: skip
            say(f"(b) {precision}: {b['images_per_s']:.0f} images/s, "
                f"{rows[-1]['ratio']:.2f} of (a)")  # fmt: skip
        except Exception as e:
            traceback.print_exc()
            errors.append(f"train_synthetic {precision}: {type(e).__name__}: {e}")
        if folder is not None:
            jpeg = [
                "--device", "cuda", "--data", str(folder), "--net", "imagenet",
                "--epochs", "1", "--batch-size", str(BATCH), "--stats-images",
                "256", "--workers", str(args.workers),
            ]  # fmt: skip
            try:
                c = run_train(train_mod, jpeg, precision, args.warmup_steps)
                ref = min(a["images_per_s"],
                          decode["images_per_s"] if decode else np.inf)  # fmt: skip
                rows.append({
                    "name": "train_jpeg", "batch": BATCH, "pass": "step",
                    "precision": precision,
                    "cc2ops_ms": BATCH / c["images_per_s"] * 1e3,
                    "peer_ms": BATCH / ref * 1e3, "ratio": c["images_per_s"] / ref,
                    "ratio_of": "min(step_graph, decode_only)", **c,
                })  # fmt: skip
                say(f"(c) {precision}: {c['images_per_s']:.0f} images/s, "
                    f"{rows[-1]['ratio']:.2f} of min(a, d)")  # fmt: skip
            except Exception as e:
                traceback.print_exc()
                errors.append(f"train_jpeg {precision}: {type(e).__name__}: {e}")
        write_results("train", rows, "the example's own step (a) and pipeline (d)",
                      args.out, extra=extra)  # fmt: skip
    for err in errors:
        say(f"error: {err}")
    correct = all(r.get("correct", True) for r in rows)
    return 0 if rows and not errors and correct else 1


if __name__ == "__main__":
    sys.exit(main())
