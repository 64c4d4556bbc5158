"""The ImageNet-style training example runs end to end on a tiny real JPEG folder.

Everything here runs on the CPU in well under a minute: a folder of real JPEG
files written by ``make_dataset.py`` (3 digit classes, 16 training and 4
validation images each, 36 x 36 pixels, 32 x 32 crops), the small net at a
quarter of its width, and the ImageNet net on 67 x 67 synthetic inputs (the
smallest its layers accept) for dropout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
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

#: Small-net settings shared by the runs (a resumed run takes them from the
#: checkpoint).
QUIET = ["--no-progress", "--quiet", "--workers", "2"]
SMALL = ["--net", "small", "--width-mult", "0.25", "--batch-size", "8", *QUIET]


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """3 classes x (16 train + 4 val) real JPEG files, 36 x 36."""
    root = tmp_path_factory.mktemp("digits")
    counts = make_dataset.make_digits_dataset(root, size=36, classes=3, per_class=20)
    assert counts == {"train": 48, "val": 12, "classes": 3}
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
    with pytest.raises(FileExistsError, match="--force"):
        make_dataset.make_digits_dataset(digits, classes=3, per_class=20)


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


def test_resume_from_the_epoch_1_checkpoint_reproduces_two_epochs_exactly(
    digits, tmp_path
):
    full = tmp_path / "full"
    _run(digits, full, "--epochs", "2", "--keep-checkpoints", "0")
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
    r = _run(digits, mid, "--epochs", "2", "--max-steps", "9")
    assert r["step"] == 9 and Path(r["checkpoint"]).name.startswith("ckpt-epoch001-")
    r = train.main(["--resume", str(mid), *QUIET])
    assert r["step"] == 12
    _assert_identical(
        _params(full / "ckpt-epoch002.npz"), _params(mid / "ckpt-epoch002.npz")
    )
    # the resumed epoch's logged training loss covers the whole epoch
    a = list((full / "metrics.csv").read_text().splitlines())
    b = list((mid / "metrics.csv").read_text().splitlines())
    cut = lambda row: row.split(",")[:5]  # noqa: E731  epoch..train_top1_err
    assert [cut(x) for x in a] == [cut(x) for x in b]


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


def test_a_kill_while_writing_a_checkpoint_leaves_the_previous_one(
    digits, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    _run(digits, out, "--epochs", "1", "--no-plot")
    before = _params(out / "ckpt-epoch001.npz")

    def half_then_crash(f, header, arrays):
        f.write(b"PK\x03\x04 half a zip file")
        raise OSError("simulated crash while writing")

    monkeypatch.setattr(ckpt_mod, "_write_npz", half_then_crash)
    with pytest.raises(OSError, match="simulated crash"):
        train.main(["--resume", str(out), "--epochs", "2", *QUIET])
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".npz") == [
        "ckpt-epoch001.npz"
    ]
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    assert ckpt_mod.find_latest(out).name == "ckpt-epoch001.npz"
    _assert_identical(before, _params(out / "ckpt-epoch001.npz"))


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


def test_unreadable_images_are_skipped_and_counted_or_stop_the_run(digits, tmp_path):
    bad = _copy_tree(digits, tmp_path / "bad")
    (bad / "train" / "1" / "broken.JPEG").write_bytes(b"not a jpeg at all")
    (bad / "val" / "2" / "truncated.JPEG").write_bytes(
        (digits / "val" / "2").iterdir().__next__().read_bytes()[:40]
    )
    r = _run(bad, tmp_path / "skip", "--epochs", "1", "--no-plot")
    assert r["skipped_images"] == 2 and r["epoch"] == 1
    with pytest.raises(data.DatasetError, match=r"cannot read image .*broken\.JPEG"):
        _run(bad, tmp_path / "error", "--epochs", "1", "--bad-images", "error")


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
    with pytest.raises(ckpt_mod.CheckpointError, match="not a readable checkpoint"):
        train.main(["--resume", str(junk), "--quiet"])


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
    assert train.cli(["--data", str(tmp_path / "missing"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: dataset folder") and "missing" in err
    script = EXAMPLE / "train.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--data", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr
