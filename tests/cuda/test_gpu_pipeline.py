"""The example's GPU input pipeline and graph-replayed steps on a GPU.

nvImageCodec against Pillow on the same plans (the CPU logic is tested with a
host twin in tests/test_gpu_data.py), ``train.py --device cuda`` with graphs
against ``--no-graph``, and a mid-epoch resume on the GPU path.
"""

from __future__ import annotations

import hashlib
import io
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("tqdm")
pytest.importorskip("matplotlib")
from PIL import Image  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "imagenet"
sys.path.insert(0, str(EXAMPLE))

import data  # noqa: E402
import gpu_data  # noqa: E402
import gpu_step  # noqa: E402
import train  # noqa: E402

pytestmark = pytest.mark.gpu

SCALE, CROP = 36, 32
NORM = data.Normalisation((120.0, 110.0, 100.0), (60.0, 55.0, 50.0))
QUIET = ["--no-progress", "--quiet", "--no-plot", "--workers", "2"]
SMALL = ["--net", "small", "--width-mult", "0.25", "--batch-size", "8", *QUIET]


def _jpeg(img, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def _smooth(rng, h, w):
    coarse = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """3 classes x (12 train + 4 val) JPEGs of 36-70 px, plus the files the GPU
    must hand to the CPU path (CMYK, PNG) and two unreadable ones."""
    root = tmp_path_factory.mktemp("gpu_pipeline")
    rng = np.random.default_rng(2)
    for split, n in (("train", 12), ("val", 4)):
        for c in range(3):
            d = root / split / f"c{c}"
            d.mkdir(parents=True)
            for k in range(n):
                h, w = int(rng.integers(36, 71)), int(rng.integers(36, 71))
                (d / f"{k}.jpg").write_bytes(_jpeg(_smooth(rng, h, w)))
    t = root / "train"
    (t / "c0" / "cmyk.jpg").write_bytes(_jpeg(_smooth(rng, 45, 38).convert("CMYK")))
    (t / "c1" / "gray.jpg").write_bytes(_jpeg(_smooth(rng, 40, 50).convert("L")))
    png = io.BytesIO()
    _smooth(rng, 44, 39).save(png, "PNG")
    (t / "c2" / "plain.png").write_bytes(png.getvalue())
    good = _jpeg(_smooth(rng, 50, 50))
    (t / "c1" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "val" / "c0" / "empty.jpg").write_bytes(b"")
    return root


def test_gpu_batches_match_the_cpu_path(folder):
    pytest.importorskip("nvidia.nvimgcodec")
    from cc2ops.cuda.runtime import array

    split = data.scan_split(folder, "train")
    cpu = data.FolderSource(split, SCALE, CROP, NORM)
    ops = gpu_data.CudaOps(0, CROP, NORM, 8)
    gpu = gpu_data.GpuFolderSource(split, SCALE, CROP, NORM, "skip", ops, 2)
    plan = data.epoch_plan(len(split), 8, 5, 1)
    with data.iterate(cpu, plan, 0, 2, 2) as it:
        want = list(it)
    std = np.asarray(NORM.std, np.float32).reshape(1, 3, 1, 1)
    diffs = []
    with data.iterate(gpu, plan, 0, 2, 2) as it:
        for k, b in enumerate(it):
            w = want[k]
            assert b.skipped == w.skipped, k
            np.testing.assert_array_equal(array.to_host(b.y), w.y)
            x = array.to_host(b.x)
            assert x.shape == w.x.shape and x.dtype == np.float32
            diffs.append(np.abs(x - w.x) * std)  # levels of 255
    assert len(diffs) == len(want)
    d = np.concatenate([v.ravel() for v in diffs])
    # the decoders' own difference on the same files, at full resolution: the
    # pipelines differ by it (the resize and crop are the twin's, tested
    # exactly in tests/cuda/ops/test_image_augment.py), plus rounding
    blobs = [Path(f).read_bytes() for f in split.paths if f.endswith(".jpg")]
    dec = []
    for blob, got in zip(blobs, ops.decode_to_host(blobs), strict=True):
        if got is None:
            continue  # CMYK: the CPU path's, compared above
        try:
            with Image.open(io.BytesIO(blob)) as im:
                want = np.asarray(im.convert("RGB"))
        except OSError:
            continue  # truncated: nvImageCodec decodes what is there, Pillow refuses
        dec.append(np.abs(got.astype(np.int16) - want))
    dd = np.concatenate([v.ravel() for v in dec])
    print(
        f"GPU vs CPU pipeline: mean |diff| {d.mean():.3f}, max {d.max():.1f} levels; "
        f"nvImageCodec vs Pillow decode alone: mean {dd.mean():.3f}, max {dd.max()}"
    )
    assert len(dec) >= 36
    assert d.mean() <= dd.mean() + 0.5 and d.max() <= max(24, dd.max() + 1)
    assert gpu.routed_to_cpu >= 2  # the CMYK and PNG files at least


def test_a_mid_epoch_start_gives_the_uninterrupted_batches(folder):
    """What a resumed run reads: batches 2.. of a plan started at 2 are the
    uninterrupted iteration's, bit for bit (same decodes, windows, flips)."""
    pytest.importorskip("nvidia.nvimgcodec")
    from cc2ops.cuda.runtime import array

    split = data.scan_split(folder, "train")
    ops = gpu_data.CudaOps(0, CROP, NORM, 8)
    gpu = gpu_data.GpuFolderSource(split, SCALE, CROP, NORM, "skip", ops, 2)
    plan = data.epoch_plan(len(split), 8, 7, 2)
    with data.iterate(gpu, plan, 0, 2, 2) as it:
        full = [(array.to_host(b.x), array.to_host(b.y), b.skipped) for b in it]
    # a resumed run starts with a fresh decoder: so does this iteration
    ops2 = gpu_data.CudaOps(0, CROP, NORM, 8)
    gpu2 = gpu_data.GpuFolderSource(split, SCALE, CROP, NORM, "skip", ops2, 2)
    with data.iterate(gpu2, plan, 2, 2, 2) as it:
        rest = [(array.to_host(b.x), array.to_host(b.y), b.skipped) for b in it]
    assert len(full) == plan.n_batches and len(rest) == plan.n_batches - 2
    for (x, y, sk), (x2, y2, sk2) in zip(full[2:], rest, strict=True):
        np.testing.assert_array_equal(x2, x)
        np.testing.assert_array_equal(y2, y)
        assert sk2 == sk


def _run(args, out):
    return train.main([*args, "--out", str(out)])


def _digest(a) -> str:
    from cc2ops.cuda.runtime import array

    host = array.to_host(a) if array.is_gpuarray(a) else np.ascontiguousarray(a)
    return hashlib.sha1(host.tobytes()).hexdigest()[:12]


class _StepTrace:
    runner = gpu_step.GraphRunner

    """Digests, per training step, of the batch and of the state it starts
    from (every shared variable the step updates: parameters and momenta).

    Reading them synchronises the device at every step, so a trace is taken
    only to explain a failure (a race would show as traced runs that agree).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs: list[dict[int, dict]] = []
        plain = self.runner.train
        trace = self

        def traced(runner, x, y, lr, step):
            fn = runner.train_fn
            state = {
                i.variable.name: _digest(fn.input_storage[k].storage[0])
                for k, i in enumerate(fn.maker.inputs)
                if i.implicit and i.update is not None
            }
            trace.runs[-1][step] = {"x": _digest(x), "y": _digest(y), "state": state}
            return plain(runner, x, y, lr, step)

        monkeypatch.setattr(self.runner, "train", traced)

    def run(self, argv: list[str]) -> dict:
        self.runs.append({})
        return train.main(argv)


def _explain_or_say_why_not(monkeypatch, *args) -> str:
    try:
        return _explain_resume(monkeypatch, *args)
    except Exception as e:  # noqa: BLE001 - the message must not hide the failure
        return f"(the traced rerun failed: {type(e).__name__}: {e})"


def _explain_resume(monkeypatch, base, resume_extra, tmp_path) -> str:
    """Rerun the uninterrupted and the resumed runs traced; say where they part."""
    trace = _StepTrace(monkeypatch)
    full = trace.run([*base, "--out", str(tmp_path / "t_full")])
    part = trace.run([*base, "--max-steps", "6", "--out", str(tmp_path / "t_mid")])
    rest = trace.run(
        ["--resume", str(tmp_path / "t_mid"), "--device", "cuda", *resume_extra, *QUIET]
    )
    want, got = trace.runs[0], {**trace.runs[1], **trace.runs[2]}
    lines = []
    for what in ("x", "y"):
        bad = [s for s in sorted(want) if got[s][what] != want[s][what]]
        first = bad[0] if bad else None
        lines.append(f"first step whose batch {what} differs: {first}")
    for s in sorted(want):
        cells = sorted(
            n for n, d in want[s]["state"].items() if got[s]["state"].get(n) != d
        )
        if cells:
            lines.append(f"first step starting from a different state: {s} ({cells})")
            break
    else:
        lines.append("every step starts from the same state")
    agree = dict(full["step_losses"]) == {
        **dict(part["step_losses"]),
        **dict(rest["step_losses"]),
    }
    lines.append(
        "traced runs (device synchronised every step) agree: "
        + ("yes, so look for a race" if agree else "no")
    )
    return "; ".join(lines)


def _rel(a, b):
    return float(np.max(np.abs(a - b) / np.abs(b)))


def test_graph_replay_matches_eager_steps_on_synthetic_data(tmp_path):
    base = ["--device", "cuda", "--synthetic", "--synthetic-images", "64",
            "--epochs", "2", "--log-every", "3", *SMALL]  # fmt: skip
    g = _run(base, tmp_path / "g")
    e = _run([*base, "--no-graph"], tmp_path / "e")
    assert g["step"] == e["step"] == 16
    lg = np.array([v for _, v in g["step_losses"]])
    le = np.array([v for _, v in e["step_losses"]])
    assert [s for s, _ in g["step_losses"]] == list(range(1, 17))
    assert np.isfinite(lg).all()
    np.testing.assert_allclose(lg, le, rtol=1e-4)
    for a, b in zip(g["history"], e["history"], strict=True):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)


def test_resume_mid_epoch_on_the_gpu_path_reproduces_the_run(
    folder, tmp_path, monkeypatch
):
    pytest.importorskip("nvidia.nvimgcodec")
    base = ["--device", "cuda", "--data", str(folder), "--epochs", "2",
            "--log-every", "2", *SMALL]  # fmt: skip
    full = _run(base, tmp_path / "full")
    part = _run([*base, "--max-steps", "6"], tmp_path / "mid")
    # --device is not a resumed setting: ask for the GPU again
    rest = train.main(["--resume", str(tmp_path / "mid"), "--device", "cuda", *QUIET])
    assert part["step"] == 6 and rest["step"] == full["step"]
    got = dict(part["step_losses"]) | dict(rest["step_losses"])
    want = dict(full["step_losses"])
    assert got.keys() == want.keys()
    # every full-size step is a replay, the resumed run's first one too (the
    # capture's warm-up call is undone): the runs compute the same steps on
    # the same batches, bit for bit. On a failure the runs are repeated with a
    # per-step trace, and the message says whether the batches or the state
    # (parameters, momenta) part first (benchmarks/notes/train.md)
    lg = np.array([got[k] for k in sorted(got)])
    lw = np.array([want[k] for k in sorted(want)])
    print(f"resumed vs uninterrupted (graphs): max rel diff {_rel(lg, lw):.2e}")
    if not np.array_equal(lg, lw):
        why = _explain_or_say_why_not(monkeypatch, base, [], tmp_path)
        np.testing.assert_array_equal(lg, lw, err_msg=why)
    eager = [*base, "--no-graph"]
    full_e = _run(eager, tmp_path / "full_e")
    _run([*eager, "--max-steps", "6"], tmp_path / "mid_e")
    resume_e = ["--resume", str(tmp_path / "mid_e"), "--device", "cuda", "--no-graph"]
    rest_e = train.main([*resume_e, *QUIET])
    got_e = dict(rest_e["step_losses"])
    want_e = {k: v for k, v in full_e["step_losses"] if k in got_e}
    assert sorted(got_e) == sorted(want_e) == list(range(7, full["step"] + 1))
    le = np.array([got_e[k] for k in sorted(got_e)])
    lw = np.array([want_e[k] for k in sorted(want_e)])
    print(f"resumed vs uninterrupted (no graphs): max rel diff {_rel(le, lw):.2e}")
    if not np.array_equal(le, lw):
        why = _explain_or_say_why_not(monkeypatch, eager, ["--no-graph"], tmp_path)
        np.testing.assert_array_equal(le, lw, err_msg=why)
    # the unreadable files are skipped and counted as on the CPU
    cpu = _run([*base, "--data-device", "cpu", "--epochs", "1"], tmp_path / "cpu")
    gpu = _run([*base, "--epochs", "1"], tmp_path / "gpu1")
    assert cpu["skipped_images"] == gpu["skipped_images"] >= 1
