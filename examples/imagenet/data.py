"""Data for the cc2ops ImageNet example: folders, decoding, augmentation, loaders.

The on-disk layout is ImageNet's::

    ROOT/train/<class>/*.JPEG
    ROOT/val/<class>/*.JPEG

Class ``i`` is the ``i``-th class folder name in sorted order; train and val
must hold the same class folders. Images are decoded with Pillow, resized so
their shorter side is ``scale`` pixels, then cropped to ``crop`` x ``crop``:
a random crop plus a random horizontal flip for training, the centre crop for
evaluation. Pixels are normalised per channel with the training set's mean and
standard deviation (:func:`channel_stats`) and delivered as float32 batches in
bc01 order, (B, 3, crop, crop), with int32 labels (B,).

Reproducibility: the order of an epoch and every crop offset and flip of it
are drawn up front from ``numpy.random.default_rng([seed, DATA_STREAM,
epoch])`` (:func:`epoch_plan`), so they are a pure function of
``(seed, epoch)``; worker threads only execute that plan, and
:class:`Prefetcher` hands batches back in plan order whatever order the
threads finish in. Resuming at batch ``k`` of an epoch therefore sees exactly
the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: File name endings (lower case) that count as images.
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".ppm", ".webp")
#: Sub-streams of the one ``--seed``: each consumer of randomness gets its own
#: ``SeedSequence([seed, stream, ...])`` so that, e.g., changing the
#: initialisation never changes the data order.
DATA_STREAM = 0
INIT_STREAM = 1
DROPOUT_STREAM = 2
SYNTHETIC_STREAM = 3
STATS_STREAM = 4

BAD_IMAGE_POLICIES = ("skip", "error")


class DatasetError(ValueError):
    """A dataset folder, image or setting that the example cannot use."""


# --------------------------------------------------------------------------
# folders
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """One split (``train`` or ``val``) of an image folder.

    Attributes
    ----------
    root : Path
        The split folder, ``ROOT/<split>``.
    classes : tuple of str
        Class folder names, sorted; label ``i`` is ``classes[i]``.
    paths : tuple of str
        Image files, grouped by class, each class's files sorted by name.
    labels : ndarray of int32, shape (len(paths),)
    """

    root: Path
    classes: tuple[str, ...]
    paths: tuple[str, ...]
    labels: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return len(self.paths)


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def scan_split(root: str | os.PathLike, split: str) -> Split:
    """List the classes and images of ``root/split``.

    Parameters
    ----------
    root : path
        The dataset folder holding ``train/`` and ``val/``.
    split : str
        ``"train"`` or ``"val"``.

    Returns
    -------
    Split

    Raises
    ------
    DatasetError
        ``root`` or ``root/split`` is missing or not a folder, it holds no
        class folders, or a class folder holds no image files.
    """
    root = Path(root)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise DatasetError(
            f"dataset folder {root} {what} (expected {root}/train/<class>/*.JPEG "
            f"and {root}/val/<class>/*.JPEG)"
        )
    folder = root / split
    if not folder.is_dir():
        raise DatasetError(
            f"{folder} does not exist: the dataset needs the ImageNet layout "
            f"{root}/{split}/<class>/*.JPEG"
        )
    with os.scandir(folder) as it:
        class_names = sorted(
            e.name for e in it if e.is_dir() and not e.name.startswith(".")
        )
    if not class_names:
        raise DatasetError(
            f"{folder} is empty: it holds no class folders "
            f"(expected {folder}/<class>/*.JPEG)"
        )
    paths: list[str] = []
    labels: list[np.ndarray] = []
    empty: list[str] = []
    for label, name in enumerate(class_names):
        with os.scandir(folder / name) as it:
            files = sorted(e.name for e in it if e.is_file() and _is_image(e.name))
        if not files:
            empty.append(name)
            continue
        paths.extend(str(folder / name / f) for f in files)
        labels.append(np.full(len(files), label, dtype=np.int32))
    if empty:
        shown = ", ".join(empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise DatasetError(
            f"{folder}: {len(empty)} class folder(s) hold no images: {shown} "
            f"(image files end in {', '.join(IMAGE_EXTENSIONS)}, any case)"
        )
    return Split(folder, tuple(class_names), tuple(paths), np.concatenate(labels))


def check_same_classes(train: Split, val: Split) -> None:
    """Raise :class:`DatasetError` unless both splits have the same class folders."""
    if train.classes == val.classes:
        return
    only_train = sorted(set(train.classes) - set(val.classes))
    only_val = sorted(set(val.classes) - set(train.classes))

    def show(names: list[str]) -> str:
        return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "") or "none"

    raise DatasetError(
        f"class folders differ between {train.root} ({len(train.classes)} classes) "
        f"and {val.root} ({len(val.classes)} classes): only in train: "
        f"{show(only_train)}; only in val: {show(only_val)}"
    )


# --------------------------------------------------------------------------
# decoding and augmentation
# --------------------------------------------------------------------------


def _pil():
    # imported lazily so that a missing Pillow is reported by the caller with
    # an install hint, and --synthetic runs need no Pillow at all
    from PIL import Image

    return Image


#: Pillow modes of integer grey images wider than 8 bits (16-bit PNG, TIFF).
_WIDE_GREY_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def decode_errors() -> tuple[type[BaseException], ...]:
    """What Pillow raises for a file that is not a usable image.

    ``OSError`` (``UnidentifiedImageError``, truncated data), ``ValueError``,
    ``SyntaxError`` (some broken headers) and ``DecompressionBombError``
    (more than twice ``PIL.Image.MAX_IMAGE_PIXELS`` pixels: a file built to
    exhaust memory, which is not an ``OSError``).
    """
    return (OSError, ValueError, SyntaxError, _pil().DecompressionBombError)


def to_rgb(im):
    """A Pillow image of any mode as 8-bit RGB.

    Grey, palette, CMYK, alpha and 1-bit modes go through Pillow's
    ``convert``. Wider integer grey (16-bit PNG: mode ``I;16`` or ``I``) is
    scaled to 0..255 first (``round(v / 257)``): Pillow's ``convert`` would
    clip it at 255 and the image would come out nearly white.
    """
    if im.mode in _WIDE_GREY_MODES:
        wide = np.asarray(im).astype(np.float64)
        grey = np.clip(np.rint(wide / 257.0), 0, 255).astype(np.uint8)
        im = _pil().fromarray(grey)  # uint8 (H, W): mode L
    return im.convert("RGB")


def load_image(path: str, scale: int) -> np.ndarray:
    """Decode ``path`` to RGB uint8 (H, W, 3) with its shorter side ``scale``.

    JPEG files are decoded directly at a reduced size (Pillow's ``draft``,
    which only picks a size whose both sides are >= ``scale``), which makes
    full-size ImageNet photos several times cheaper to decode; the final
    resize is bilinear. Every mode becomes 8-bit RGB (:func:`to_rgb`).

    Raises
    ------
    OSError, ValueError, SyntaxError, PIL.Image.DecompressionBombError
        The file is not a usable image (Pillow's errors, unchanged; see
        :func:`decode_errors`).
    """
    image_mod = _pil()
    with image_mod.open(path) as im:
        im.draft("RGB", (scale, scale))
        im = to_rgb(im)
        w, h = im.size
        short = min(w, h)
        size = (
            max(scale, round(w * scale / short)),
            max(scale, round(h * scale / short)),
        )
        if size != (w, h):
            im = im.resize(size, image_mod.Resampling.BILINEAR)
        return np.asarray(im, dtype=np.uint8)


def crop_offsets(
    height: int, width: int, crop: int, uy: float, ux: float
) -> tuple[int, int]:
    """Top-left corner of a crop drawn by the uniform numbers ``uy, ux`` in [0, 1)."""
    return int(uy * (height - crop + 1)), int(ux * (width - crop + 1))


def centre_offsets(height: int, width: int, crop: int) -> tuple[int, int]:
    """Top-left corner of the centre ``crop`` x ``crop`` window."""
    return (height - crop) // 2, (width - crop) // 2


@dataclass(frozen=True)
class Normalisation:
    """Per-channel mean and standard deviation of the pixels, in 0..255 units.

    Attributes
    ----------
    mean, std : tuple of 3 float
        R, G, B.
    """

    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def to_json(self) -> dict:
        return {"mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_json(cls, d: dict) -> Normalisation:
        return cls(
            tuple(float(v) for v in d["mean"]), tuple(float(v) for v in d["std"])
        )

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, 1/std)`` as float32 arrays of shape (3, 1, 1)."""
        mean = np.asarray(self.mean, dtype=np.float32).reshape(3, 1, 1)
        inv = (1.0 / np.asarray(self.std, dtype=np.float64)).astype(np.float32)
        return mean, inv.reshape(3, 1, 1)


# --------------------------------------------------------------------------
# epoch plans and batches
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochPlan:
    """What one epoch reads, decided before any image is decoded.

    Attributes
    ----------
    order : ndarray of int64
        Example indices in reading order.
    uy, ux : ndarray of float64, or None
        Uniform [0, 1) numbers placing each example's random crop (None:
        centre crops).
    flip : ndarray of bool, or None
        Horizontal flip of each example (None: no flips).
    batch_size : int
    drop_last : bool
        Whether a final partial batch is dropped (training) or kept (evaluation).
    epoch : int
        The epoch the plan is for (evaluation plans: 0).
    """

    order: np.ndarray
    uy: np.ndarray | None
    ux: np.ndarray | None
    flip: np.ndarray | None
    batch_size: int
    drop_last: bool
    epoch: int = 0

    @property
    def n_batches(self) -> int:
        n, b = len(self.order), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def batch_slice(self, i: int) -> slice:
        return slice(
            i * self.batch_size, min((i + 1) * self.batch_size, len(self.order))
        )


def epoch_plan(n: int, batch_size: int, seed: int, epoch: int) -> EpochPlan:
    """The training plan of ``epoch``: shuffled order, random crops and flips.

    A pure function of its arguments (it draws from
    ``default_rng([seed, DATA_STREAM, epoch])``); the final partial batch is
    dropped so every update sees ``batch_size`` examples.
    """
    rng = np.random.default_rng([seed, DATA_STREAM, epoch])
    order = rng.permutation(n)
    uy = rng.random(n)
    ux = rng.random(n)
    flip = rng.random(n) < 0.5
    return EpochPlan(order, uy, ux, flip, batch_size, drop_last=True, epoch=epoch)


def eval_plan(n: int, batch_size: int) -> EpochPlan:
    """The evaluation plan: every example once, in order, centre crops."""
    return EpochPlan(np.arange(n), None, None, None, batch_size, drop_last=False)


@dataclass
class Batch:
    """One batch: images (B, 3, crop, crop) float32 in bc01 order, labels (B,).

    ``skipped`` lists ``(path, reason)`` of the planned images that could not
    be read (they are left out, so ``B`` can be smaller than planned).
    """

    x: np.ndarray
    y: np.ndarray
    skipped: list[tuple[str, str]] = field(default_factory=list)


class FolderSource:
    """Reads batches of a :class:`Split` according to an :class:`EpochPlan`.

    Parameters
    ----------
    split : Split
    scale : int
        Shorter side after resizing.
    crop : int
        Side of the square crop; ``crop <= scale``.
    norm : Normalisation or None
        None delivers raw 0..255 pixel values (used to compute the statistics).
    bad_images : {"skip", "error"}
        What an unreadable image does: it is left out of its batch and
        reported in :attr:`Batch.skipped`, or it raises :class:`DatasetError`.
    """

    def __init__(
        self,
        split: Split,
        scale: int,
        crop: int,
        norm: Normalisation | None,
        bad_images: str = "skip",
    ) -> None:
        if crop > scale:
            raise DatasetError(
                f"crop ({crop}) must not exceed the resized shorter side --scale "
                f"({scale})"
            )
        if bad_images not in BAD_IMAGE_POLICIES:
            raise DatasetError(
                f"bad_images must be one of {BAD_IMAGE_POLICIES}, got {bad_images!r}"
            )
        self.split = split
        self.scale = scale
        self.crop = crop
        self.bad_images = bad_images
        self._norm = norm.arrays() if norm is not None else None

    def __len__(self) -> int:
        return len(self.split)

    def batch(self, plan: EpochPlan, i: int) -> Batch:
        """Decode batch ``i`` of ``plan`` (thread-safe; PIL and numpy drop the GIL)."""
        positions = range(len(plan.order))[plan.batch_slice(i)]
        c = self.crop
        x = np.empty((len(positions), 3, c, c), dtype=np.float32)
        y = np.empty(len(positions), dtype=np.int32)
        skipped: list[tuple[str, str]] = []
        unreadable = decode_errors()
        n = 0
        for pos in positions:
            idx = int(plan.order[pos])
            path = self.split.paths[idx]
            try:
                img = load_image(path, self.scale)
            except unreadable as e:
                reason = f"{type(e).__name__}: {e}"
                if self.bad_images == "error":
                    raise DatasetError(
                        f"cannot read image {path} ({reason}); pass --bad-images skip "
                        "to leave unreadable images out"
                    ) from e
                skipped.append((path, reason))
                continue
            h, w = img.shape[:2]
            if plan.uy is None:
                oy, ox = centre_offsets(h, w, c)
            else:
                oy, ox = crop_offsets(h, w, c, plan.uy[pos], plan.ux[pos])
            win = img[oy : oy + c, ox : ox + c]
            if plan.flip is not None and plan.flip[pos]:
                win = win[:, ::-1]
            x[n] = win.transpose(2, 0, 1)
            y[n] = self.split.labels[idx]
            n += 1
        x, y = x[:n], y[:n]
        if self._norm is not None:
            mean, inv_std = self._norm
            x -= mean
            x *= inv_std
        return Batch(x, y, skipped)


class SyntheticSource:
    """Random images and labels for benchmarking: no files, no decoding cost.

    Batch ``i`` of a plan for epoch ``e`` is drawn from
    ``default_rng([seed, SYNTHETIC_STREAM, split_id, e, i])``: standard-normal
    pixels (already "normalised") and uniform labels, so there is nothing to
    learn; the point is the images/s of the compute.
    """

    def __init__(
        self, n_images: int, n_classes: int, crop: int, seed: int, split_id: int
    ) -> None:
        if n_images < 1 or n_classes < 2:
            raise DatasetError(
                f"synthetic data needs >= 1 image and >= 2 classes, got {n_images} "
                f"images and {n_classes} classes"
            )
        self.n_images = n_images
        self.n_classes = n_classes
        self.crop = crop
        self.seed = seed
        self.split_id = split_id

    def __len__(self) -> int:
        return self.n_images

    def batch(self, plan: EpochPlan, i: int) -> Batch:
        rows = plan.batch_slice(i)
        n = rows.stop - rows.start
        rng = np.random.default_rng(
            [self.seed, SYNTHETIC_STREAM, self.split_id, plan.epoch, i]
        )
        x = rng.standard_normal((n, 3, self.crop, self.crop), dtype=np.float32)
        y = rng.integers(0, self.n_classes, n).astype(np.int32)
        return Batch(x, y)


# --------------------------------------------------------------------------
# background loading
# --------------------------------------------------------------------------


class Prefetcher:
    """Produce ``make(i)`` for each ``i`` in ``indices`` on background threads.

    At most ``depth`` batches are decoded or waiting ahead of the consumer (a
    bounded queue of futures), so decoding overlaps the training step without
    unbounded memory. Results come back strictly in ``indices`` order: the
    queue is first in, first out, whichever thread finishes first. An
    exception raised by ``make`` is re-raised by the iteration, in order.

    Parameters
    ----------
    make : callable
        ``make(i) -> item``; must be thread-safe.
    indices : iterable of int
    workers : int
        Threads; 0 runs ``make`` in the consumer's thread (no overlap).
    depth : int
        Bound of the queue (>= 1); at least ``workers`` keeps every thread busy.
    """

    def __init__(
        self,
        make: Callable[[int], object],
        indices: Iterable[int],
        workers: int = 2,
        depth: int = 4,
    ) -> None:
        if workers < 0:
            raise ValueError(f"Prefetcher: workers must be >= 0, got {workers}")
        if depth < 1:
            raise ValueError(f"Prefetcher: depth must be >= 1, got {depth}")
        self._make = make
        self._indices = iter(indices)
        self._depth = depth
        self._pool = (
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cc2ops-data")
            if workers
            else None
        )
        self._queue: deque[Future] = deque()

    def _fill(self) -> None:
        while len(self._queue) < self._depth:
            i = next(self._indices, None)
            if i is None:
                return
            self._queue.append(self._pool.submit(self._make, i))

    def __iter__(self) -> Iterator:
        if self._pool is None:
            for i in self._indices:
                yield self._make(i)
            return
        self._fill()
        while self._queue:
            fut = self._queue.popleft()
            self._fill()
            yield fut.result()

    def close(self) -> None:
        """Cancel what has not started and wait for the running threads."""
        for fut in self._queue:
            fut.cancel()
        self._queue.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def iterate(
    source: FolderSource | SyntheticSource,
    plan: EpochPlan,
    start: int = 0,
    workers: int = 2,
    depth: int = 4,
) -> Prefetcher:
    """Batches ``start, start+1, ...`` of ``plan`` read by ``workers`` threads.

    A source with its own ``iterate(plan, start, workers, depth)`` (the GPU
    pipeline's, ``gpu_data.py``) is asked for its batches instead.
    """
    own = getattr(source, "iterate", None)
    if own is not None:
        return own(plan, start, workers, depth)
    return Prefetcher(
        lambda i: source.batch(plan, i), range(start, plan.n_batches), workers, depth
    )


# --------------------------------------------------------------------------
# normalisation statistics
# --------------------------------------------------------------------------


def channel_stats(
    split: Split,
    scale: int,
    crop: int,
    max_images: int,
    seed: int,
    workers: int = 2,
    bad_images: str = "skip",
    chunk: int = 64,
) -> tuple[Normalisation, int, list[tuple[str, str]]]:
    """Per-channel pixel mean and std of (a sample of) the training set.

    The statistics are over the centre crops (what evaluation sees) of
    ``min(max_images, len(split))`` training images chosen by
    ``default_rng([seed, STATS_STREAM])``, accumulated in float64.

    Returns
    -------
    norm : Normalisation
    used : int
        Images that went into the statistics.
    skipped : list of (path, reason)
        Unreadable images (with ``bad_images="skip"``).

    Raises
    ------
    DatasetError
        No image of the sample could be read, or an image is unreadable and
        ``bad_images="error"``.
    """
    n = len(split)
    if max_images < 1:
        raise DatasetError(f"--stats-images must be >= 1, got {max_images}")
    rng = np.random.default_rng([seed, STATS_STREAM])
    sample = np.sort(rng.choice(n, size=min(n, max_images), replace=False))
    plan = EpochPlan(sample, None, None, None, chunk, drop_last=False)
    source = FolderSource(split, scale, crop, None, bad_images)
    total = np.zeros(3)
    total_sq = np.zeros(3)
    used = 0
    skipped: list[tuple[str, str]] = []
    with iterate(source, plan, workers=workers, depth=max(2, workers * 2)) as batches:
        for b in batches:
            skipped.extend(b.skipped)
            if len(b.y) == 0:
                continue
            px = b.x.astype(np.float64)
            total += px.sum(axis=(0, 2, 3))
            total_sq += np.square(px).sum(axis=(0, 2, 3))
            used += len(b.y)
    if used == 0:
        raise DatasetError(
            f"none of the {len(sample)} sampled training images of {split.root} "
            f"could be read (first error: {skipped[0][0]}: {skipped[0][1]})"
        )
    count = used * crop * crop
    mean = total / count
    var = np.maximum(total_sq / count - np.square(mean), 0.0)
    # a constant channel (e.g. grey images) must not divide by zero
    std = np.maximum(np.sqrt(var), 1.0)
    return (
        Normalisation(tuple(float(m) for m in mean), tuple(float(s) for s in std)),
        used,
        skipped,
    )


def summarise_skipped(skipped: Sequence[tuple[str, str]]) -> str:
    """One line: how many images were skipped and the first few."""
    shown = "; ".join(f"{p}: {r}" for p, r in skipped[:3])
    more = f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""
    return f"skipped {len(skipped)} unreadable image(s): {shown}{more}"
