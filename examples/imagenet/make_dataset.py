"""Write a real small image dataset in the ImageNet folder layout, no downloads.

The images are scikit-learn's handwritten digits (``sklearn.datasets.
load_digits``: 1 797 grey 8 x 8 scans of the digits 0-9, shipped inside the
scikit-learn package), upscaled with Pillow's bicubic filter to ``--size``
pixels and saved as RGB JPEG files::

    OUT/train/<digit>/digit<digit>_<index>.JPEG
    OUT/val/<digit>/digit<digit>_<index>.JPEG

so ``train.py`` reads them with the very loader it uses for ImageNet. The
split is fixed and stratified: per class, a permutation drawn from
``default_rng([seed, digit])`` sends the first ``round(val_fraction * n)``
images to ``val/``. With the defaults that is 1 440 training and 357
validation images.

Running it again is safe. ``OUT/make_dataset.json`` records the settings and
the image counts, and whether the dataset was finished:

- the same settings over a finished dataset whose files are all there: nothing
  to do (a message says so), so the Quickstart line can be run twice;
- an unfinished dataset (an earlier run was killed): it is written again;
- other settings: refused, unless ``--force`` (which replaces the ``train/``
  and ``val/`` that this script wrote);
- ``train/`` or ``val/`` without ``make_dataset.json`` (someone else's images):
  always refused, ``--force`` or not; this script never deletes them.

Usage::

    python examples/imagenet/make_dataset.py --out data/digits
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

MANIFEST = "make_dataset.json"
FORMAT = "cc2ops-digits-dataset"


def load_digits_images() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as uint8 images (N, 8, 8) in 0..255 and labels (N,)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    # the scans count ink in 0..16
    images = np.round(d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    return images, d.target.astype(np.int64)


def split_indices(
    labels: np.ndarray,
    val_fraction: float,
    seed: int,
    classes: Sequence[int],
    per_class: int | None = None,
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Stratified fixed split: ``{class: train indices}, {class: val indices}``.

    ``per_class`` (optional) first keeps only that many images of each class,
    for tiny test datasets.
    """
    train, val = {}, {}
    for c in classes:
        idx = np.flatnonzero(labels == c)
        idx = idx[np.random.default_rng([seed, int(c)]).permutation(len(idx))]
        if per_class is not None:
            idx = idx[:per_class]
        n_val = int(round(val_fraction * len(idx)))
        if n_val < 1 or n_val >= len(idx):
            raise ValueError(
                f"class {c}: {len(idx)} images cannot give both splits an image "
                f"with --val-fraction {val_fraction}"
            )
        val[c], train[c] = np.sort(idx[:n_val]), np.sort(idx[n_val:])
    return train, val


def write_split(
    folder: Path,
    images: np.ndarray,
    by_class: dict[int, np.ndarray],
    size: int,
    quality: int,
) -> int:
    """Save the images of ``by_class`` under ``folder/<class>/``; returns the count."""
    from PIL import Image

    n = 0
    for c, idx in by_class.items():
        class_dir = folder / str(c)
        class_dir.mkdir(parents=True, exist_ok=True)
        for i in idx:
            im = Image.fromarray(images[i])  # uint8 (8, 8): mode L
            im = im.resize((size, size), Image.Resampling.BICUBIC).convert("RGB")
            im.save(class_dir / f"digit{c}_{i:04d}.JPEG", "JPEG", quality=quality)
            n += 1
    return n


def _read_manifest(out: Path) -> dict | None:
    """``OUT/make_dataset.json``, or None when there is none."""
    path = out / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        # a torn manifest is this script's own, written when it was killed
        return {"format": FORMAT, "complete": False}
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    return manifest


def _write_manifest(out: Path, manifest: dict) -> None:
    tmp = out / f".{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out / MANIFEST)


def _count_images(folder: Path) -> int:
    if not folder.is_dir():
        return -1
    return sum(1 for p in folder.glob("*/*.JPEG") if p.is_file())


def _existing_dataset(out: Path, settings: dict, force: bool) -> dict | None:
    """The counts of a finished dataset with ``settings`` at ``out``, or None
    when the dataset is to be written (after removing an unfinished or, with
    ``force``, another one that this script wrote).

    Raises
    ------
    FileExistsError
        ``out`` holds ``train/`` or ``val/`` that this script did not write,
        a finished dataset with other settings (without ``force``), or one
        whose files changed since.
    """
    splits = [out / s for s in ("train", "val") if (out / s).exists()]
    manifest = _read_manifest(out)
    if manifest is None:
        if splits:
            raise FileExistsError(
                f"{splits[0]} already exists and was not written by make_dataset.py "
                f"(no {MANIFEST} beside it); it is left alone, --force or not: "
                "choose another --out"
            )
        return None
    counts = manifest.get("counts", {})
    if manifest.get("complete") and not force:
        if manifest.get("settings") != settings:
            differ = sorted(
                k
                for k in settings
                if manifest.get("settings", {}).get(k) != settings[k]
            )
            shown = ", ".join(
                f"{k} {manifest.get('settings', {}).get(k)} (asked: {settings[k]})"
                for k in differ
            )
            raise FileExistsError(
                f"{out} holds a digits dataset made with other settings: {shown}; "
                "pass --force to replace it, or choose another --out"
            )
        found = {s: _count_images(out / s) for s in ("train", "val")}
        if found != {s: counts.get(s) for s in ("train", "val")}:
            raise FileExistsError(
                f"{out} holds a digits dataset whose files changed since it was "
                f"made ({found['train']} training and {found['val']} validation "
                f"images, {counts.get('train')} and {counts.get('val')} written); "
                "pass --force to write it again"
            )
        return dict(counts)
    for folder in splits:  # this script's own: unfinished, or --force
        shutil.rmtree(folder)
    return None


def make_digits_dataset(
    out: str | Path,
    size: int = 32,
    val_fraction: float = 0.2,
    seed: int = 0,
    classes: int = 10,
    per_class: int | None = None,
    quality: int = 95,
    force: bool = False,
) -> dict[str, int]:
    """Write the digits dataset to ``out`` (see the module docstring).

    Parameters
    ----------
    out : path
        Dataset folder; it gets ``train/``, ``val/`` and ``make_dataset.json``.
    size : int
        Side of the square JPEG images (>= 8).
    val_fraction : float
        Share of each class that goes to ``val/``.
    seed : int
        Seed of the split.
    classes : int
        Use the digits ``0 .. classes-1`` (2..10).
    per_class : int, optional
        Keep at most this many images per class (before splitting).
    quality : int
        JPEG quality (1..95).
    force : bool
        Replace a dataset that this script wrote with other settings.

    Returns
    -------
    dict
        ``{"train": n_train, "val": n_val, "classes": classes, "written":
        bool}``; ``written`` is False when ``out`` already held this dataset.

    Raises
    ------
    ValueError
        A setting out of range.
    FileExistsError
        ``out`` holds images this script did not write, or (without
        ``force``) a dataset with other settings.
    """
    out = Path(out)
    if size < 8:
        raise ValueError(f"--size must be >= 8 (the scans are 8x8), got {size}")
    if not 2 <= classes <= 10:
        raise ValueError(f"--classes must be in 2..10, got {classes}")
    if not 0 < val_fraction < 1:
        raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if not 1 <= quality <= 95:
        raise ValueError(f"--quality must be in 1..95, got {quality}")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a folder")
    settings = dict(
        size=size, val_fraction=val_fraction, seed=seed, classes=classes,
        per_class=per_class, quality=quality,
    )  # fmt: skip
    done = _existing_dataset(out, settings, force)
    if done is not None:
        return {**done, "written": False}
    images, labels = load_digits_images()
    train, val = split_indices(labels, val_fraction, seed, range(classes), per_class)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"format": FORMAT, "complete": False, "settings": settings}
    _write_manifest(out, manifest)
    n_train = write_split(out / "train", images, train, size, quality)
    n_val = write_split(out / "val", images, val, size, quality)
    counts = {"train": n_train, "val": n_val, "classes": classes}
    _write_manifest(out, {**manifest, "complete": True, "counts": counts})
    return {**counts, "written": True}


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """Command line: ``make_dataset.py --out FOLDER [--size 32] ...``."""
    p = argparse.ArgumentParser(
        prog="make_dataset.py",
        description="Write scikit-learn's digits as an ImageNet-layout JPEG folder "
        "(again: nothing to do when it is already there).",
    )
    dflt = " (default: %(default)s)"
    p.add_argument("--out", required=True, help="dataset folder to create")
    p.add_argument("--size", type=int, default=32, help="image side in pixels" + dflt)
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.2,
        help="share of each class in val/" + dflt,
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the split" + dflt)
    p.add_argument("--classes", type=int, default=10, help="digits 0..N-1" + dflt)
    p.add_argument(
        "--per-class",
        type=int,
        default=None,
        help="at most this many images per class (tiny datasets; default: all)",
    )
    p.add_argument("--quality", type=int, default=95, help="JPEG quality" + dflt)
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a dataset that this script wrote with other settings "
        "(never images it did not write)",
    )
    args = p.parse_args(argv)
    try:
        counts = make_digits_dataset(
            args.out,
            args.size,
            args.val_fraction,
            args.seed,
            args.classes,
            args.per_class,
            args.quality,
            args.force,
        )
    except (ValueError, FileExistsError) as e:
        raise SystemExit(f"make_dataset.py: error: {e}") from e
    what = "wrote" if counts["written"] else "nothing to do: already holds"
    print(
        f"{args.out}: {what} {counts['train']} training and {counts['val']} "
        f"validation images of {counts['classes']} classes"
    )
    return counts


if __name__ == "__main__":
    main(sys.argv[1:])
