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

Usage::

    python examples/imagenet/make_dataset.py --out data/digits
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np


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
            im = Image.fromarray(images[i], mode="L")
            im = im.resize((size, size), Image.Resampling.BICUBIC).convert("RGB")
            im.save(class_dir / f"digit{c}_{i:04d}.JPEG", "JPEG", quality=quality)
            n += 1
    return n


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
        Dataset folder; it gets ``train/`` and ``val/``.
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
        Replace existing ``train/`` and ``val/`` folders in ``out``.

    Returns
    -------
    dict
        ``{"train": n_train, "val": n_val, "classes": classes}``.
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
    existing = [out / s for s in ("train", "val") if (out / s).exists()]
    if existing and not force:
        raise FileExistsError(
            f"{existing[0]} already exists; pass --force to replace train/ and val/"
        )
    for folder in existing:
        shutil.rmtree(folder)
    images, labels = load_digits_images()
    train, val = split_indices(labels, val_fraction, seed, range(classes), per_class)
    n_train = write_split(out / "train", images, train, size, quality)
    n_val = write_split(out / "val", images, val, size, quality)
    return {"train": n_train, "val": n_val, "classes": classes}


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """Command line: ``make_dataset.py --out FOLDER [--size 32] ...``."""
    p = argparse.ArgumentParser(
        prog="make_dataset.py",
        description="Write scikit-learn's digits as an ImageNet-layout JPEG folder.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, help="dataset folder to create")
    p.add_argument("--size", type=int, default=32, help="image side in pixels")
    p.add_argument("--val-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0, help="seed of the split")
    p.add_argument("--classes", type=int, default=10, help="digits 0..N-1")
    p.add_argument(
        "--per-class",
        type=int,
        default=None,
        help="at most this many images per class (tiny datasets)",
    )
    p.add_argument("--quality", type=int, default=95, help="JPEG quality")
    p.add_argument(
        "--force", action="store_true", help="replace existing train/ and val/ folders"
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
    print(
        f"wrote {counts['train']} training and {counts['val']} validation images "
        f"of {counts['classes']} classes to {args.out}"
    )
    return counts


if __name__ == "__main__":
    main(sys.argv[1:])
