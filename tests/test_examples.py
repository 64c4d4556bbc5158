"""The ImageNet-style training example runs end to end on a tiny real JPEG folder.

Everything here runs on the CPU in well under a minute: a folder of real JPEG
files written by ``make_dataset.py`` (3 digit classes, 16 training and 4
validation images each, 36 x 36 pixels, 32 x 32 crops), the small net at a
quarter of its width, and the ImageNet net on 67 x 67 synthetic inputs (the
smallest its layers accept) for dropout.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("sklearn")
pytest.importorskip("tqdm")
pytest.importorskip("matplotlib")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "imagenet"
sys.path.insert(0, str(EXAMPLE))

import make_dataset  # noqa: E402
import train  # noqa: E402

ckpt_mod = train.ckpt_mod
data = train.data
nets = train.nets
run_folder = train.run_folder

#: Small-net settings shared by the runs (a resumed run takes them from the
#: checkpoint).
QUIET = ["--no-progress", "--quiet", "--workers", "2"]
SMALL = ["--net", "small", "--width-mult", "0.25", "--batch-size", "8", *QUIET]


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """3 classes x (16 train + 4 val) real JPEG files, 36 x 36."""
    root = tmp_path_factory.mktemp("digits")
    counts = make_dataset.make_digits_dataset(root, size=36, classes=3, per_class=20)
    assert counts == {"train": 48, "val": 12, "classes": 3, "written": True}
    return root


def _copy_tree(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _run(data_dir: Path, out: Path, *extra: str) -> dict:
    return train.main(["--data", str(data_dir), "--out", str(out), *SMALL, *extra])


def _params(path: Path) -> dict[str, np.ndarray]:
    c = ckpt_mod.load_checkpoint(path)
    return {**{f"p/{k}": v for k, v in c.params.items()},
            **{f"m/{k}": v for k, v in c.momenta.items()},
            **{f"s/{k}": v for k, v in c.states.items()}}  # fmt: skip


def _assert_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert np.array_equal(a[k], b[k]), f"{k} differs"


# ---------------------------------------------------------------- the dataset


def test_make_dataset_writes_the_imagenet_layout_as_jpeg(digits):
    from PIL import Image

    for split, n in (("train", 16), ("val", 4)):
        classes = sorted(p.name for p in (digits / split).iterdir())
        assert classes == ["0", "1", "2"]
        for c in classes:
            files = sorted((digits / split / c).iterdir())
            assert len(files) == n
            assert all(f.suffix == ".JPEG" for f in files)
    with Image.open(next((digits / "train" / "0").iterdir())) as im:
        assert im.format == "JPEG" and im.mode == "RGB" and im.size == (36, 36)


def _tree_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()
    }


def test_make_dataset_twice_is_a_no_op_and_never_deletes_other_images(tmp_path, capsys):
    out = tmp_path / "d"
    argv = ["--out", str(out), "--classes", "2", "--per-class", "5", "--size", "8"]
    assert make_dataset.main(argv)["written"]
    before = _tree_files(out)
    # the Quickstart line, run again: nothing to do, nothing touched
    again = make_dataset.main(argv)
    assert again == {"train": 8, "val": 2, "classes": 2, "written": False}
    assert "nothing to do" in capsys.readouterr().out
    assert _tree_files(out) == before
    # other settings: refused without --force, replaced with it
    with pytest.raises(SystemExit, match=r"other settings: size 8 \(asked: 9\)"):
        make_dataset.main([*argv[:-1], "9"])
    assert _tree_files(out) == before
    assert make_dataset.main([*argv[:-1], "9", "--force"])["written"]
    # an unfinished dataset (a killed run) is written again
    manifest = out / make_dataset.MANIFEST
    manifest.write_text(manifest.read_text()[:20])  # torn
    next((out / "train").rglob("*.JPEG")).unlink()
    assert make_dataset.main(argv)["written"]
    assert _tree_files(out) == before
    # images that the script did not write: refused, even with --force
    other = tmp_path / "mine"
    (other / "train" / "cat").mkdir(parents=True)
    (other / "train" / "cat" / "a.JPEG").write_bytes(b"my photo")
    for extra in ([], ["--force"]):
        with pytest.raises(SystemExit, match="not written by make_dataset.py"):
            make_dataset.main(["--out", str(other), *argv[2:], *extra])
    assert (other / "train" / "cat" / "a.JPEG").read_bytes() == b"my photo"


def test_loader_crops_flips_and_normalises(digits):
    split = data.scan_split(digits, "train")
    assert split.classes == ("0", "1", "2") and len(split) == 48
    norm, used, skipped = data.channel_stats(split, 36, 32, 1000, seed=0)
    assert used == 48 and not skipped
    src = data.FolderSource(split, 36, 32, norm)
    plan = data.epoch_plan(len(split), 8, seed=0, epoch=0)
    b = src.batch(plan, 0)
    assert b.x.shape == (8, 3, 32, 32) and b.x.dtype == np.float32
    assert b.y.dtype == np.int32
    np.testing.assert_array_equal(b.y, split.labels[plan.order[:8]])
    # the same plan gives the same batch; another epoch another one
    np.testing.assert_array_equal(src.batch(plan, 0).x, b.x)
    other = data.epoch_plan(len(split), 8, seed=0, epoch=1)
    assert not np.array_equal(other.order, plan.order)
    # the centre crops of the whole training set are normalised to mean 0, std 1
    full = data.FolderSource(split, 36, 32, norm).batch(data.eval_plan(48, 48), 0)
    np.testing.assert_allclose(full.x.mean(axis=(0, 2, 3)), 0, atol=1e-4)
    np.testing.assert_allclose(full.x.std(axis=(0, 2, 3)), 1, atol=1e-4)


def test_prefetcher_keeps_order_bounds_the_queue_and_reraises():
    import threading
    import time

    lock = threading.Lock()
    started: list[int] = []
    consumed = [0]
    ahead = [0]

    def make(i: int) -> int:
        with lock:
            started.append(i)
            ahead[0] = max(ahead[0], len(started) - consumed[0])
        time.sleep(0.002 * ((7 * i) % 5))  # finish out of order
        if i == 17:
            raise ValueError("bad batch 17")
        return i * i

    got = []
    with pytest.raises(ValueError, match="bad batch 17"):
        with data.Prefetcher(make, range(30), workers=3, depth=4) as it:
            for v in it:
                got.append(v)
                consumed[0] += 1
    assert got == [i * i for i in range(17)]
    assert ahead[0] <= 4 + 1  # the queue bound, plus the batch being consumed


# ------------------------------------------------------------------ training


def _train_set_loss(digits: Path, values: dict[str, np.ndarray], norm) -> float:
    """Mean loss of the small net with ``values`` over the training centre crops."""
    import pytensor

    net = nets.Network("small", 3, 32, width_mult=0.25)
    params = {k: pytensor.shared(values[k], name=k) for k in net.param_shapes}
    evaluate = train.compile_evaluate(net, params, train.select_backend("cpu", 1))
    src = data.FolderSource(data.scan_split(digits, "train"), 36, 32, norm)
    loss, _, _, skipped = train._evaluate(evaluate, src, 48, 0, 1)
    assert not skipped
    return loss


def test_one_epoch_runs_end_to_end_and_the_loss_falls(digits, tmp_path):
    out = tmp_path / "run"
    r = _run(digits, out, "--epochs", "1", "--warmup-epochs", "0")
    assert r["epoch"] == 1 and r["step"] == 6 and r["skipped_images"] == 0
    losses = [loss for _, loss in r["step_losses"]]
    assert len(losses) == 6 and all(np.isfinite(losses))
    # the loss over the whole training set, before and after the epoch
    header = ckpt_mod.read_header(r["checkpoint"])
    norm = data.Normalisation.from_json(header["normalisation"])
    net = nets.Network("small", 3, 32, width_mult=0.25)
    before = _train_set_loss(digits, net.init_params([0, data.INIT_STREAM]), norm)
    after = _train_set_loss(digits, ckpt_mod.load_checkpoint(out).params, norm)
    assert after < 0.9 * before, (before, after)
    (rec,) = r["history"]
    assert 0 <= rec["val_top1_err"] <= 1 and rec["val_top5_err"] == 0  # 3 classes
    # the outputs: an epoch checkpoint, the CSV / JSON logs, the curves
    assert Path(r["checkpoint"]).name == "ckpt-epoch001.npz"
    assert header["epoch"] == 1 and header["step"] == 6
    assert header["classes"] == ["0", "1", "2"]
    split = data.scan_split(digits, "train")
    norm, _, _ = data.channel_stats(split, 36, 32, 5000, seed=0)
    assert header["normalisation"] == norm.to_json()
    rows = (out / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,step,lr,train_loss") and len(rows) == 2
    kinds = [json.loads(x)["kind"] for x in (out / "metrics.jsonl").open()]
    assert kinds == ["epoch"]  # --log-every 20 > 6 steps
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_training_graph_is_float32():
    import pytensor

    net = nets.Network("small", 3, 32, width_mult=0.25)
    values = net.init_params([0, 1])
    params = {k: pytensor.shared(v, name=k) for k, v in values.items()}
    moms = {k: pytensor.shared(np.zeros_like(v)) for k, v in values.items()}
    cfg = train.resolve_config(
        train.build_parser().parse_args(["--net", "small"]), None, print
    )
    backend = train.select_backend("cpu", 1)
    fn, _ = train.compile_functions(net, params, moms, {}, cfg, backend)
    dtypes = {
        v.type.dtype
        for v in fn.maker.fgraph.variables
        if hasattr(v.type, "dtype") and v.type.dtype.startswith("float")
    }
    assert dtypes == {"float32"}


def _step_records(out: Path) -> list[tuple]:
    """``(step, loss, top1_err)`` of the step records of ``out``'s metrics.jsonl."""
    recs = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    return [(r["step"], r["loss"], r["top1_err"]) for r in recs if r["kind"] == "step"]


def _interrupt_at(monkeypatch, at_step: int) -> None:
    """Send this process a real SIGINT (Ctrl-C) as step ``at_step`` begins."""
    real = train.learning_rate
    sent = []

    def lr_then_ctrl_c(step, cfg, steps_per_epoch):
        if step + 1 == at_step and not sent:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGINT)
        return real(step, cfg, steps_per_epoch)

    monkeypatch.setattr(train, "learning_rate", lr_then_ctrl_c)


def test_resume_from_the_epoch_1_checkpoint_reproduces_two_epochs_exactly(
    digits, tmp_path, monkeypatch, capsys
):
    full = tmp_path / "full"
    _run(digits, full, "--epochs", "2", "--keep-checkpoints", "0", "--log-every", "2")
    # resume the epoch-1 checkpoint into another folder
    part = tmp_path / "part"
    part.mkdir()
    (part / "ckpt-epoch001.npz").write_bytes((full / "ckpt-epoch001.npz").read_bytes())
    r = train.main(["--resume", str(part), *QUIET])
    assert r["epoch"] == 2 and r["step"] == 12 and len(r["history"]) == 1
    _assert_identical(
        _params(full / "ckpt-epoch002.npz"), _params(part / "ckpt-epoch002.npz")
    )
    # a stop in the middle of an epoch (--max-steps) resumes exactly too
    mid = tmp_path / "mid"
    r = _run(digits, mid, "--epochs", "2", "--max-steps", "9", "--log-every", "2")
    assert r["step"] == 9 and Path(r["checkpoint"]).name.startswith("ckpt-epoch001-")
    r = train.main(["--resume", str(mid), "--log-every", "2", *QUIET])
    assert r["step"] == 12
    _assert_identical(
        _params(full / "ckpt-epoch002.npz"), _params(mid / "ckpt-epoch002.npz")
    )
    # the resumed epoch's logged training loss covers the whole epoch, and the
    # step records (windows of --log-every steps) are the uninterrupted ones
    a = list((full / "metrics.csv").read_text().splitlines())
    b = list((mid / "metrics.csv").read_text().splitlines())
    cut = lambda row: row.split(",")[:5]  # noqa: E731  epoch..train_top1_err
    assert [cut(x) for x in a] == [cut(x) for x in b]
    assert _step_records(mid) == _step_records(full)

    # Ctrl-C in the middle of epoch 2 (a real SIGINT as step 9 begins): the
    # step finishes, its exact position is checkpointed, and the hint names
    # the real folder
    intr = tmp_path / "interrupted run"
    _interrupt_at(monkeypatch, 9)
    capsys.readouterr()
    args = ["--data", str(digits), "--out", str(intr), *SMALL, "--epochs", "2"]
    assert train.cli([*args, "--log-every", "2"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    name = "ckpt-epoch001-step00000009.npz"
    assert err[-1] == (
        f"train.py: interrupted at step 9; wrote {intr / name}; resume with "
        f"--resume '{intr}'"
    )
    assert ckpt_mod.read_header(intr / name)["kind"] == "interrupted"
    monkeypatch.undo()
    r = train.main(["--resume", str(intr), "--log-every", "2", *QUIET])
    assert r["step"] == 12
    _assert_identical(
        _params(full / "ckpt-epoch002.npz"), _params(intr / "ckpt-epoch002.npz")
    )
    assert _step_records(intr) == _step_records(full)

    # a corrupt newest checkpoint (one flipped parameter byte: its CRC-32
    # fails) is passed over, with a warning naming it; the older one is
    # resumed and epoch 2 comes out the same again
    want = _params(full / "ckpt-epoch002.npz")
    newest = full / "ckpt-epoch002.npz"
    raw = bytearray(newest.read_bytes())
    w = ckpt_mod.load_checkpoint(newest).params["fc10.W"]
    at = raw.find(w.tobytes()[:16])
    raw[at] ^= 0xFF
    newest.write_bytes(bytes(raw))
    capsys.readouterr()
    r = train.main(["--resume", str(full), *QUIET])
    err = capsys.readouterr().err
    assert f"skipping a corrupt checkpoint: {newest} is not a readable" in err
    assert "Bad CRC-32" in err and "falling back to the next older one" in err
    assert r["step"] == 12
    _assert_identical(want, _params(newest))


def test_dropout_state_is_checkpointed_and_resumed_exactly(tmp_path):
    kind = "cc2ops"
    common = [
        "--net", "imagenet", "--synthetic", "--synthetic-images", "8",
        "--classes", "4", "--scale", "67", "--crop", "67", "--width-mult", "0.02",
        "--batch-size", "4", "--epochs", "2", "--no-progress", "--quiet",
        "--no-plot",
    ]  # fmt: skip
    full = tmp_path / "full"
    train.main([*common, "--out", str(full)])
    mid = tmp_path / "mid"
    train.main([*common, "--out", str(mid), "--max-steps", "3"])
    header = ckpt_mod.read_header(next(mid.glob("ckpt-epoch001-*.npz")))
    states = header["dropout_states"]
    assert set(states) == {"dropout1", "dropout2"}
    assert {s["kind"] for s in states.values()} == {kind}
    # the Philox states, as arrays
    arrays = ckpt_mod.load_checkpoint(mid).states
    assert sorted(arrays) == ["dropout/dropout1", "dropout/dropout2"]
    assert all(a.dtype == np.uint32 and a[2:].any() for a in arrays.values())
    train.main(["--resume", str(mid), "--no-progress", "--quiet", "--no-plot"])
    _assert_identical(
        _params(full / "ckpt-epoch002.npz"), _params(mid / "ckpt-epoch002.npz")
    )


def _disk_full() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_while_writing_a_checkpoint_leaves_the_previous_one(
    digits, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    _run(digits, out, "--epochs", "1", "--no-plot")
    before = _params(out / "ckpt-epoch001.npz")

    def half_then_disk_full(f, header, arrays):
        f.write(b"PK\x03\x04 half a zip file")
        raise _disk_full()

    monkeypatch.setattr(ckpt_mod, "_write_npz", half_then_disk_full)
    capsys.readouterr()
    assert train.cli(["--resume", str(out), "--epochs", "2", *QUIET]) == 2
    # one line, no traceback (after the warning that --epochs 2 extends the run)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line == (
        f"train.py: error: cannot write checkpoint {out / 'ckpt-epoch002.npz'}: "
        "[Errno 28] No space left on device; the previous checkpoint "
        f"{out / 'ckpt-epoch001.npz'} is intact; free space and resume with "
        f"--resume {out}"
    )
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".npz") == [
        "ckpt-epoch001.npz"
    ]
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    assert ckpt_mod.find_latest(out).name == "ckpt-epoch001.npz"
    _assert_identical(before, _params(out / "ckpt-epoch001.npz"))


def test_a_second_run_into_the_same_out_is_refused_or_moves_the_first_aside(
    digits, tmp_path
):
    out = tmp_path / "run"
    first = _run(digits, out, "--epochs", "1")
    files = _tree_files(out)
    assert sorted(files) == [
        "ckpt-epoch001.npz", "curves.png", "metrics.csv", "metrics.jsonl"
    ]  # fmt: skip
    # the same command again: nothing to do, nothing changed
    again = _run(digits, out, "--epochs", "1")
    assert again["step_losses"] == [] and again["checkpoint"] == first["checkpoint"]
    assert _tree_files(out) == files
    # another run (other settings): refused before anything is compiled or written
    with pytest.raises(
        run_folder.RunFolderError,
        match=rf"--out {re.escape(str(out))} already holds a run "
        r"\(ckpt-epoch001\.npz, metrics\.csv, metrics\.jsonl \.\.\.\); nothing was "
        r"changed\. Give --resume .* to continue it, or another --out, or "
        r"--overwrite to move it aside to .*run\.old-1 \(nothing is deleted\)",
    ):
        _run(digits, out, "--epochs", "1", "--seed", "1")
    assert _tree_files(out) == files
    # resuming from an earlier checkpoint into a folder that went further
    _run(digits, tmp_path / "two", "--epochs", "2", "--keep-checkpoints", "0")
    earlier = ["--resume", str(tmp_path / "two" / "ckpt-epoch001.npz"), *QUIET]
    with pytest.raises(run_folder.RunFolderError, match="after the resumed one"):
        train.main(earlier)
    # ... --overwrite moves that folder aside; the new one starts with the
    # moved run's log up to the resumed checkpoint
    assert train.main([*earlier, "--overwrite", "--no-plot"])["step"] == 12
    for name in ("two", "two.old-1"):
        rows = (tmp_path / name / "metrics.csv").read_text().splitlines()
        assert [r.split(",")[:2] for r in rows[1:]] == [["1", "6"], ["2", "12"]]
    assert sorted(p.name for p in (tmp_path / "two").glob("*.npz")) == [
        "ckpt-epoch002.npz"
    ]
    # --overwrite: the first run is moved aside whole; nothing is mixed
    second = _run(digits, out, "--epochs", "1", "--seed", "1", "--overwrite")
    assert _tree_files(tmp_path / "run.old-1") == files
    assert sorted(_tree_files(out)) == sorted(files)
    rows = (out / "metrics.csv").read_text().splitlines()
    assert len(rows) == 2  # the header and this run's one epoch
    old = tmp_path / "run.old-1" / Path(first["checkpoint"]).name
    ids = {ckpt_mod.read_header(p)["run_id"] for p in (old, second["checkpoint"])}
    assert len(ids) == 2


def test_prune_never_deletes_the_checkpoint_just_written(tmp_path):
    w = {"a.W": np.zeros(2, np.float32)}
    for step in (10, 20, 30):
        ckpt_mod.save_checkpoint(tmp_path / f"ckpt-{step}.npz", {"step": step}, w, w)
    (tmp_path / "ckpt-99.npz").write_bytes(b"unreadable")
    fresh = ckpt_mod.save_checkpoint(tmp_path / "ckpt-5.npz", {"step": 5}, w, w)
    removed = ckpt_mod.prune(tmp_path, 1, current=fresh)
    assert sorted(p.name for p in removed) == ["ckpt-10.npz", "ckpt-20.npz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-30.npz", "ckpt-5.npz", "ckpt-99.npz"
    ]  # fmt: skip


def test_logs_are_written_whole_on_a_full_disk_and_a_torn_line_is_dropped(
    digits, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    _run(digits, out, "--epochs", "1", "--no-plot", "--log-every", "2")
    jsonl = out / "metrics.jsonl"
    assert len(jsonl.read_text().splitlines()) == 4  # 3 step records, 1 epoch
    calls = []

    def half_then_disk_full(fd, data):
        calls.append(len(data))
        if len(calls) < 2:
            return os.write(fd, data)
        os.write(fd, data[: len(data) // 2])
        raise _disk_full()

    monkeypatch.setattr(run_folder, "_write", half_then_disk_full)
    resume = ["--resume", str(out), "--epochs", "2", "--log-every", "2", *QUIET]
    capsys.readouterr()
    assert train.cli(resume) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line == (
        f"train.py: error: cannot write {jsonl}: [Errno 28] No space left on device"
    )
    text = jsonl.read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 5  # + step 8's
    assert [json.loads(x)["step"] for x in text.splitlines()] == [2, 4, 6, 6, 8]
    monkeypatch.undo()
    # a torn last line (a killed writer) is dropped with a warning on --resume
    with jsonl.open("a") as f:
        f.write('{"kind": "step", "epoch": 1, "st')
    r = train.main(resume)
    assert r["step"] == 12
    err = capsys.readouterr().err
    assert f"{jsonl} line 6 (a torn last line) is not a whole record" in err
    steps = [json.loads(x)["step"] for x in jsonl.read_text().splitlines()]
    assert steps == [2, 4, 6, 6, 8, 10, 12, 12]


def test_resume_dir_passes_over_a_torn_newest_checkpoint_with_a_warning(tmp_path):
    w = {"a.W": np.arange(3, dtype=np.float32)}
    ckpt_mod.save_checkpoint(tmp_path / "ckpt-a.npz", {"step": 1}, w, w)
    torn = ckpt_mod.save_checkpoint(tmp_path / "ckpt-b.npz", {"step": 2}, w, w)
    torn.write_bytes(torn.read_bytes()[:300])
    seen: list[str] = []
    assert ckpt_mod.load_checkpoint(tmp_path, seen.append).path.name == "ckpt-a.npz"
    (msg,) = seen
    assert msg.startswith(
        f"skipping an unreadable checkpoint: {torn} is not a readable checkpoint"
    )
    with pytest.warns(UserWarning, match="ckpt-b.npz is not a readable"):
        ckpt_mod.load_checkpoint(tmp_path)
    # an explicit file is not replaced by another one
    with pytest.raises(ckpt_mod.CheckpointError, match="ckpt-b.npz is not a readable"):
        ckpt_mod.load_checkpoint(torn)


def test_sigkill_during_checkpoint_write_leaves_the_previous_one(tmp_path):
    """A real SIGKILL half-way through the bytes: no cleanup code runs."""
    w = {"a.W": np.arange(6, dtype=np.float32)}
    ckpt_mod.save_checkpoint(tmp_path / "ckpt-epoch001.npz", {"step": 1}, w, w)
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(EXAMPLE)!r})
        import numpy as np
        import checkpoint

        def half_then_die(f, header, arrays):
            f.write(b"PK\\x03\\x04" + b"x" * 1000)
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        checkpoint._write_npz = half_then_die
        w = {{"a.W": np.zeros(6, np.float32)}}
        checkpoint.save_checkpoint({str(tmp_path / "ckpt-epoch002.npz")!r},
                                   {{"step": 2}}, w, w)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "ckpt-epoch002.npz" not in names
    (tmp,) = [n for n in names if ".tmp-" in n]  # the killed writer's leftover
    latest = ckpt_mod.load_checkpoint(tmp_path)
    assert latest.path.name == "ckpt-epoch001.npz"
    np.testing.assert_array_equal(latest.params["a.W"], w["a.W"])
    # the next save removes the dead writer's temporary file
    ckpt_mod.save_checkpoint(tmp_path / "ckpt-epoch002.npz", {"step": 2}, w, w)
    assert not (tmp_path / tmp).exists()
    assert ckpt_mod.find_latest(tmp_path).name == "ckpt-epoch002.npz"


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(kind + body) & 0xFFFFFFFF
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def _decompression_bomb_png() -> bytes:
    """A valid 40000 x 40000 grey PNG header: Pillow refuses it on open."""
    ihdr = struct.pack(">IIBBBBB", 40000, 40000, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def test_image_modes_decode_to_8_bit_rgb(tmp_path):
    from PIL import Image

    grey = np.arange(24 * 40, dtype=np.uint32).reshape(24, 40) * 68 % 65536
    Image.fromarray(grey.astype(np.uint16)).save(tmp_path / "g16.png")
    with Image.open(tmp_path / "g16.png") as im:
        assert im.mode in ("I;16", "I")  # Pillow's 16-bit grey
    x = data.load_image(str(tmp_path / "g16.png"), 24)
    assert x.shape == (24, 40, 3) and x.dtype == np.uint8
    want = np.rint(grey / 257).astype(np.uint8)
    np.testing.assert_array_equal(x[..., 0], want)  # not clipped to white
    np.testing.assert_array_equal(x[..., 2], want)
    # 8-bit grey, CMYK and palette JPEG/PNG files
    g8 = (grey >> 8).astype(np.uint8)
    Image.fromarray(g8).save(tmp_path / "g8.png")
    np.testing.assert_array_equal(
        data.load_image(str(tmp_path / "g8.png"), 24), np.stack([g8] * 3, -1)
    )
    Image.new("CMYK", (40, 24), (0, 255, 255, 0)).save(tmp_path / "c.jpg", quality=95)
    red = data.load_image(str(tmp_path / "c.jpg"), 24)
    assert red.shape == (24, 40, 3)
    np.testing.assert_allclose(red.mean(axis=(0, 1)), [255, 0, 0], atol=3)
    Image.fromarray(g8).convert("P").save(tmp_path / "p.png")
    assert data.load_image(str(tmp_path / "p.png"), 24).shape == (24, 40, 3)
    # empty, truncated and bomb files raise what decode_errors() lists
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "cut.png").write_bytes((tmp_path / "g8.png").read_bytes()[:60])
    (tmp_path / "bomb.png").write_bytes(_decompression_bomb_png())
    for name in ("empty.png", "cut.png", "bomb.png"):
        with pytest.raises(data.decode_errors()):
            data.load_image(str(tmp_path / name), 24)


def test_unreadable_images_are_skipped_and_counted_or_stop_the_run(digits, tmp_path):
    from PIL import Image

    bad = _copy_tree(digits, tmp_path / "bad")
    (bad / "train" / "1" / "broken.JPEG").write_bytes(b"not a jpeg at all")
    (bad / "train" / "1" / "empty.JPEG").write_bytes(b"")
    (bad / "train" / "0" / "bomb.png").write_bytes(_decompression_bomb_png())
    (bad / "val" / "2" / "truncated.JPEG").write_bytes(
        (digits / "val" / "2").iterdir().__next__().read_bytes()[:40]
    )
    # readable, in other modes: 16-bit grey PNG, CMYK JPEG
    Image.fromarray(np.full((36, 36), 30000, np.uint16)).save(bad / "train/2/g.png")
    Image.new("CMYK", (36, 36), (0, 255, 255, 0)).save(bad / "train/2/c.JPEG")
    r = _run(bad, tmp_path / "skip", "--epochs", "1", "--no-plot")
    assert r["skipped_images"] == 4 and r["epoch"] == 1
    # the first bad image in reading order stops the run
    with pytest.raises(
        data.DatasetError, match=r"cannot read image .*bomb\.png \(DecompressionBomb"
    ):
        _run(bad, tmp_path / "error", "--epochs", "1", "--bad-images", "error")
    (bad / "train" / "0" / "bomb.png").unlink()
    with pytest.raises(data.DatasetError, match=r"cannot read image .*broken\.JPEG"):
        _run(bad, tmp_path / "error2", "--epochs", "1", "--bad-images", "error")


# ------------------------------------------------------------- clear errors


def _tree_from(digits: Path, root: Path, train_classes, val_classes) -> Path:
    """``root/<split>/<class>/`` holding two real JPEG files each."""
    for split, classes in (("train", train_classes), ("val", val_classes)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for c in classes:
            d = root / split / c
            d.mkdir()
            for f in sorted((digits / split / "0").iterdir())[:2]:
                (d / f.name).write_bytes(f.read_bytes())
    return root


def _bad_folder(kind: str, digits: Path, tmp: Path) -> Path:
    if kind == "missing":
        return tmp / "nowhere"
    if kind == "no-val":
        root = _tree_from(digits, tmp / kind, "ab", "")
        (root / "val").rmdir()
        return root
    if kind == "empty":
        return _tree_from(digits, tmp / kind, "", "")
    if kind == "empty-class":
        root = _tree_from(digits, tmp / kind, "ab", "ab")
        (root / "train" / "c").mkdir()
        (root / "train" / "c" / "notes.txt").write_text("not an image")
        return root
    assert kind == "classes-differ"
    return _tree_from(digits, tmp / kind, "abc", "abd")


@pytest.mark.parametrize(
    "kind, match",
    [
        ("missing", r"dataset folder .*nowhere does not exist"),
        ("no-val", r"no-val/val does not exist: the dataset needs the ImageNet"),
        ("empty", r"train is empty: it holds no class folders"),
        ("empty-class", r"1 class folder\(s\) hold no images: c "),
        ("classes-differ", r"class folders differ .*only in train: c; only in val: d"),
    ],
)
def test_bad_folders_raise_clear_errors(digits, tmp_path, kind, match):
    root = _bad_folder(kind, digits, tmp_path)
    with pytest.raises(data.DatasetError, match=match):
        _run(root, tmp_path / "out", "--epochs", "1")
    assert not (tmp_path / "out").exists()


def test_the_example_trains_the_net_table_of_cc2ops_testing():
    from cc2ops.testing import nets as table

    net = nets.Network("imagenet", 10, 67, width_mult=1 / 16)
    assert isinstance(net, table.Network) and nets.Network.__name__ == "Network"
    assert net.layers == table.Network("imagenet", 10, 67, 1 / 16).layers
    assert nets.Conv is table.Conv and nets.Dropout is table.Dropout
    assert nets.INITS == table.INITS
    assert sorted(nets.NETS) == ["imagenet", "small"]
    assert [l.name for l in nets.NETS["small"]()] == [
        l.name for l in table.small_layers()
    ]
    # the example's own error, also from the table's checks
    with pytest.raises(nets.NetworkError, match=r"choose from \['imagenet', 'small'\]"):
        nets.Network("cifar18", 10, 32)
    with pytest.raises(nets.NetworkError, match="does not fit 4x4 inputs"):
        nets.Network("small", 10, 4)
    import pytensor
    import pytensor.tensor as pt

    params = {k: pytensor.shared(v) for k, v in net.init_params(0).items()}
    x = pt.tensor4("x", dtype="float32")
    with pytest.raises(nets.NetworkError, match="layer dropout1: .* dropout states"):
        net.forward(x, params, train=True)


def test_a_checkpoint_from_another_network_is_refused(digits, tmp_path):
    out = tmp_path / "run"
    _run(digits, out, "--epochs", "1", "--no-plot")
    with pytest.raises(ckpt_mod.CheckpointError, match="from another network"):
        train.main(["--resume", str(out), "--width-mult", "0.5", *QUIET])
    with pytest.raises(ckpt_mod.CheckpointError, match="from another network"):
        train.main(["--resume", str(out), "--net", "imagenet", "--synthetic",
                    "--classes", "3", "--width-mult", "0.25", "--quiet"])  # fmt: skip
    other = _tree_from(digits, tmp_path / "abcd", "abcd", "abcd")
    with pytest.raises(ckpt_mod.CheckpointError, match="trained on 3 classes"):
        train.main(["--resume", str(out), "--data", str(other), *QUIET])
    with pytest.raises(ckpt_mod.CheckpointError, match="no readable checkpoint"):
        train.main(["--resume", str(tmp_path), "--quiet"])
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"junk")
    with pytest.raises(ckpt_mod.CheckpointError, match="junk.npz is not a cc2ops"):
        train.main(["--resume", str(junk), "--quiet"])
    readme = EXAMPLE / "README.md"
    with pytest.raises(ckpt_mod.CheckpointError) as e:
        train.main(["--resume", str(readme), "--quiet"])
    assert str(e.value) == (
        f"{readme} is not a cc2ops checkpoint (it is not an .npz (zip) file); give "
        "--resume a ckpt-*.npz file written by train.py, or the folder holding them"
    )
    assert "pickle" not in str(e.value)


def test_gpu_flags_fail_clearly_instead_of_running_on_the_cpu(
    digits, tmp_path, monkeypatch
):
    monkeypatch.setenv("CC2OPS_DISABLE_CUDA", "1")
    args = ["--data", str(digits), "--out", str(tmp_path / "o"), *SMALL]
    with pytest.raises(train.DeviceError, match="CUDA is not available"):
        train.main([*args, "--device", "cuda"])
    with pytest.raises(train.DeviceError, match="--devices 2|CUDA is not available"):
        train.main([*args, "--device", "cuda:0", "--devices", "2"])
    with pytest.raises(train.DeviceError, match="cpu, cuda or cuda:N"):
        train.main([*args, "--device", "tpu"])
    assert not (tmp_path / "o").exists(), "nothing may run before the device check"


def test_data_parallel_on_virtual_devices_matches_one_device(digits, tmp_path):
    """--devices 2 splits each batch over 2 devices (host collectives here).

    --batch-size is per device and the learning rate scales linearly with K,
    so 2 x 8 images at lr 0.005 is the single-device step on 16 at lr 0.01.
    """
    args = [
        "--data", str(digits), "--net", "small", "--width-mult", "0.25",
        "--epochs", "1", "--max-steps", "2", "--warmup-epochs", "0",
        "--lr-schedule", "constant", "--no-plot", *QUIET,
    ]  # fmt: skip
    one = train.main([*args, "--out", str(tmp_path / "one"), "--batch-size", "16",
                      "--lr", "0.01"])  # fmt: skip
    two = train.main([*args, "--out", str(tmp_path / "two"), "--batch-size", "8",
                      "--lr", "0.005", "--devices", "2"])  # fmt: skip
    assert one["step"] == two["step"] == 2
    a = ckpt_mod.load_checkpoint(one["checkpoint"])
    b = ckpt_mod.load_checkpoint(two["checkpoint"])
    assert ckpt_mod.read_header(two["checkpoint"])["devices"] == 2
    for k in a.params:  # equal up to float rounding (sums in another order)
        rel = np.linalg.norm(a.params[k] - b.params[k]) / np.linalg.norm(a.params[k])
        assert rel < 1e-4, (k, rel)
    np.testing.assert_allclose(
        [x for _, x in one["step_losses"]], [x for _, x in two["step_losses"]],
        rtol=1e-5,
    )  # fmt: skip


def test_cli_turns_user_errors_into_a_message_and_status_2(tmp_path, capsys):
    out = ["--out", str(tmp_path / "out")]
    assert train.cli(["--data", str(tmp_path / "missing"), *out, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: dataset folder") and "missing" in err
    script = EXAMPLE / "train.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--data", str(tmp_path / "missing"), *out],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_help_gives_each_default_once(capsys):
    parser = train.build_parser()
    text = " ".join(parser.format_help().split())  # unwrapped
    assert "(default: None)" not in text and "(default: False)" not in text
    fmt = train.HelpFormatter("train.py")
    for action in parser._actions:
        shown = fmt._get_help_string(action) or ""
        shown = shown.replace("%(default)s", str(action.default))
        assert shown.count("default") <= 1, (action.dest, shown)
    assert "(default: 2)" in text and "(default: 1280)" in text
    with pytest.raises(SystemExit):
        make_dataset.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "(default: 32)" in text


def test_flag_errors_come_before_pytensor_is_imported():
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(EXAMPLE)!r})
        import train
        try:
            train.main(["--epochs", "0"])
        except SystemExit as e:
            heavy = [m for m in ("pytensor", "cc2ops", "PIL") if m in sys.modules]
            print(e.code, heavy)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == "2 []", proc.stderr
    assert "--epochs: must be >= 1, got 0" in proc.stderr


def test_the_readme_documents_every_flag():
    readme = (EXAMPLE / "README.md").read_text()
    flags = [
        opt
        for action in train.build_parser()._actions
        for opt in action.option_strings
        if opt.startswith("--") and opt != "--help"
    ]
    assert len(flags) > 30
    missing = [f for f in flags if not re.search(rf"`{re.escape(f)}[` ]", readme)]
    assert not missing, f"examples/imagenet/README.md does not document {missing}"
