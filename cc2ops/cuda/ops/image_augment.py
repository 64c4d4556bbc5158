"""Input augmentation on the GPU: resize, crop, flip, normalise, bc01, in one kernel.

The training input of the ImageNet example on the CPU is: decode a JPEG with
Pillow, resize so the shorter side is ``scale`` (Pillow's BILINEAR), cut a
``crop`` x ``crop`` window (random for training, centred for evaluation),
mirror it left-right for half the training images, then subtract a
per-channel mean and multiply by the inverse standard deviation, in bc01
order. :func:`augment` does all of that after the decode, for a batch of
decoded uint8 RGB images that each live in their own device buffer (an
nvImageCodec batch decode gives one buffer per image), with one launch of
the kernel ``image_augment_bilinear_c<crop>`` of ``kernels/image_augment.cu``.

Geometry
--------
Image ``b`` is described by one row of an int32 (B, 8) array,
``(h, w, pitch, rh, rw, oy, ox, flip)``: the decoded height, width and row
pitch in bytes, the resized height and width, the top-left corner of the
crop window in the resized image and the flip flag. Where the resize and the
window come from (``epoch_plan``'s uniform numbers, the centre crop) is the
caller's business; :func:`image_augment_reference` is the numpy twin of the
kernel on the same rows, bit for bit.

Resampling
----------
The resize is Pillow's 8-bit BILINEAR resampler exactly (``Resample.c``:
a triangle filter widened by the downscale factor, coefficients normalised
in double and rounded to 22-bit fixed point, a horizontal pass clipped to
uint8 and then a vertical one). On the same decoded pixels the kernel, the
twin and ``PIL.Image.resize(size, BILINEAR)`` agree exactly (max difference
0, tested against Pillow on the CPU). What differs from the CPU pipeline is
the decode:

- nvJPEG's IDCT and chroma upsampling against libjpeg-turbo's (libjpeg
  upsamples 4:2:0 chroma with its "fancy" filter; nvImageCodec by default
  does not, and the example keeps its default for speed); measured by the
  GPU tests, which print both settings' numbers;
- images whose shorter side is at least twice ``scale``: Pillow decodes
  them at 1/2, 1/4 or 1/8 size in the DCT domain (``Image.draft``) before
  the resize, the GPU resizes the full decode (an area-like filter over the
  whole window). The output size and crop window are the same (the caller
  computes them from the drafted size, see ``gpu_data.resize_target``);
  the pixels differ by the two downscalers' difference, measured on the CPU
  by ``tests/cuda/test_image_augment.py`` (mean absolute difference 0.3-1.0
  levels of 255 and at most 6 measured on noisy smooth images of 600x512 to
  2048x1536 pixels; the test bounds them at 1.5 and 8).

Normalisation is ``(float32(v) - mean) * inv_std`` with both operations
rounded separately (no fused multiply-add), as numpy computes it on the CPU:
the same float32 values.

Synthetic images
----------------
:func:`normal` fills a float32 array with standard normals from Philox4x32-10
(key and counter given), with the kernel ``image_augment_normal_c<crop>``:
``--synthetic`` batches drawn on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cc2ops.cuda.runtime.compile import get_kernel, launch, register_variants

__all__ = [
    "GEOMETRY_FIELDS",
    "augment_consts",
    "normal_consts",
    "resize_coefficients",
    "pillow_bilinear_resize",
    "image_augment_reference",
    "check_geometry",
    "augment",
    "normal",
]

#: The columns of a geometry row, in order.
GEOMETRY_FIELDS = ("h", "w", "pitch", "rh", "rw", "oy", "ox", "flip")
_BLOCK = 256
_PRECISION_BITS = 22


def augment_consts(crop: int) -> dict[str, Any]:
    """Template constants of the augmentation kernel for ``crop`` x ``crop`` outputs."""
    _check_crop("augment", crop)
    return {"name": f"image_augment_bilinear_c{crop}", "kind": "augment", "crop": crop}


def normal_consts(crop: int) -> dict[str, Any]:
    """Template constants of the standard-normal kernel (synthetic images)."""
    _check_crop("normal", crop)
    return {"name": f"image_augment_normal_c{crop}", "kind": "normal", "crop": crop}


def _check_crop(where: str, crop: Any) -> None:
    if isinstance(crop, bool) or not isinstance(crop, (int, np.integer)) or crop < 1:
        raise ValueError(
            f"image_augment.{where}: crop must be an int >= 1, got {crop!r}"
        )


@register_variants("image_augment")
def _variants() -> list[dict[str, Any]]:
    # the ImageNet net's 224 and the small CIFAR net's 32
    return [augment_consts(224), augment_consts(32), normal_consts(224)]


# --------------------------------------------------------------------------
# the numpy twin
# --------------------------------------------------------------------------


def resize_coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, list]:
    """Pillow's BILINEAR fixed-point coefficients for ``in_size -> out_size``.

    Returns
    -------
    xmin : ndarray of int64, shape (out_size,)
        First input index of each output's window.
    weights : list of ndarray of int64
        The 22-bit fixed-point weights of each window (``precompute_coeffs``
        and ``normalize_coeffs_8bpc`` of Pillow's ``Resample.c``, term by
        term in double).
    """
    if in_size < 1 or out_size < 1:
        raise ValueError(
            f"resize_coefficients: sizes must be >= 1, got {in_size} -> {out_size}"
        )
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    ss = 1.0 / filterscale
    xmins = np.empty(out_size, dtype=np.int64)
    weights = []
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size)
        taps = [abs(((t + xmin) - center + 0.5) * ss) for t in range(xmax - xmin)]
        k = [1.0 - t if t < 1.0 else 0.0 for t in taps]
        ww = 0.0
        for v in k:
            ww += v
        if ww != 0.0:
            k = [v / ww for v in k]
        xmins[xx] = xmin
        weights.append(
            np.array([int(0.5 + v * (1 << _PRECISION_BITS)) for v in k], np.int64)
        )
    return xmins, weights


def _resample_axis(img: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    """One pass of Pillow's 8-bit resampler along ``axis`` (uint8 in and out)."""
    in_size = img.shape[axis]
    src = np.moveaxis(img, axis, 0).astype(np.int64)
    xmins, weights = resize_coefficients(in_size, out_size)
    out = np.empty((out_size,) + src.shape[1:], dtype=np.int64)
    for xx in range(out_size):
        k = weights[xx]
        win = src[xmins[xx] : xmins[xx] + len(k)]
        acc = np.tensordot(k, win, axes=(0, 0)) + (1 << (_PRECISION_BITS - 1))
        out[xx] = np.clip(acc >> _PRECISION_BITS, 0, 255)
    return np.moveaxis(out.astype(np.uint8), 0, axis)


def pillow_bilinear_resize(img: np.ndarray, rh: int, rw: int) -> np.ndarray:
    """``img`` (H, W, C) uint8 resized to (rh, rw) as Pillow's BILINEAR does.

    The horizontal pass first, clipped to uint8, then the vertical pass; an
    axis whose size does not change is copied (Pillow skips that pass, and
    its identity weights would give the same bytes).
    """
    out = img
    if rw != img.shape[1]:
        out = _resample_axis(out, rw, axis=1)
    if rh != img.shape[0]:
        out = _resample_axis(out, rh, axis=0)
    return np.ascontiguousarray(out)


def check_geometry(geometry: Any, batch: int, crop: int) -> np.ndarray:
    """``geometry`` as a C-contiguous int32 (batch, 8) array, or ``ValueError``.

    Rules: ``h, w >= 1``; ``pitch >= 3 w``; ``rh, rw >= crop``; the window
    ``[oy, oy + crop) x [ox, ox + crop)`` inside the resized ``rh x rw``
    image; ``flip`` 0 or 1.
    """
    g = np.ascontiguousarray(geometry, dtype=np.int32)
    if g.shape != (batch, 8):
        raise ValueError(
            f"image_augment: geometry must have shape ({batch}, 8) "
            f"{GEOMETRY_FIELDS}, got {g.shape}"
        )
    for b, (h, w, pitch, rh, rw, oy, ox, flip) in enumerate(g.tolist()):
        problems = []
        if h < 1 or w < 1:
            problems.append(f"decoded size {h}x{w} must be >= 1")
        if pitch < 3 * w:
            problems.append(f"pitch {pitch} must be >= 3 w = {3 * w}")
        if rh < crop or rw < crop:
            problems.append(f"resized size {rh}x{rw} must be >= crop {crop}")
        if not (0 <= oy <= rh - crop and 0 <= ox <= rw - crop):
            problems.append(
                f"window at ({oy}, {ox}) must fit the resized {rh}x{rw} image"
            )
        if flip not in (0, 1):
            problems.append(f"flip must be 0 or 1, got {flip}")
        if problems:
            raise ValueError(f"image_augment: image {b}: " + "; ".join(problems))
    return g


def image_augment_reference(
    images: Sequence[np.ndarray],
    geometry: Any,
    crop: int,
    mean: Sequence[float],
    inv_std: Sequence[float],
) -> np.ndarray:
    """The augmentation kernel on the host: what :func:`augment` computes.

    Parameters
    ----------
    images : sequence of ndarray of uint8, each (h, w, 3)
        Decoded RGB images in HWC order.
    geometry : array-like of int, shape (B, 8)
        Rows ``(h, w, pitch, rh, rw, oy, ox, flip)``; ``h, w`` must match the
        image (the pitch is not used by the twin).
    crop : int
    mean, inv_std : 3 floats
        Per-channel mean and inverse standard deviation (R, G, B), applied
        in float32.

    Returns
    -------
    ndarray of float32, shape (B, 3, crop, crop)
        bc01.
    """
    _check_crop("reference", crop)
    g = check_geometry(geometry, len(images), crop)
    m = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    inv = np.asarray(inv_std, dtype=np.float32).reshape(3, 1, 1)
    out = np.empty((len(images), 3, crop, crop), dtype=np.float32)
    for b, img in enumerate(images):
        h, w, _, rh, rw, oy, ox, flip = g[b].tolist()
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(
                f"image_augment_reference: image {b} must be uint8 (h, w, 3), got "
                f"{img.dtype} {img.shape}"
            )
        if img.shape[:2] != (h, w):
            raise ValueError(
                f"image_augment_reference: image {b} is {img.shape[0]}x{img.shape[1]}"
                f", its geometry row says {h}x{w}"
            )
        resized = pillow_bilinear_resize(img, rh, rw)
        win = resized[oy : oy + crop, ox : ox + crop]
        if flip:
            win = win[:, ::-1]
        x = win.transpose(2, 0, 1).astype(np.float32)
        x -= m
        x *= inv
        out[b] = x
    return out


# --------------------------------------------------------------------------
# launching
# --------------------------------------------------------------------------


def augment(
    sources: Any,
    geometry: Any,
    out: Any,
    crop: int,
    mean: Sequence[float],
    inv_std: Sequence[float],
    device: int,
) -> None:
    """Queue the augmentation of a batch on ``device``'s stream.

    Parameters
    ----------
    sources : GPUArray of uint64, shape (B,)
        The device address of each image's first byte (uint8 HWC RGB, rows
        ``pitch`` bytes apart).
    geometry : GPUArray of int32, shape (B, 8)
        The rows of :func:`check_geometry` (checked on the host by whoever
        built them: the kernel trusts them).
    out : GPUArray of float32, shape (B', 3, crop, crop), B' >= B, C-contiguous
        Receives the first B images.
    crop : int
    mean, inv_std : 3 floats
    device : int
        Device label; the images must be readable there, and any work that
        writes them must be ordered before this launch on the device's stream.
    """
    _check_crop("augment", crop)
    batch = int(sources.shape[0])
    if np.dtype(sources.dtype) != np.uint64 or len(sources.shape) != 1:
        raise TypeError(
            f"image_augment.augment: sources must be a uint64 vector, got "
            f"{np.dtype(sources.dtype)} {tuple(sources.shape)}"
        )
    if np.dtype(geometry.dtype) != np.int32 or tuple(geometry.shape) != (batch, 8):
        raise TypeError(
            f"image_augment.augment: geometry must be int32 ({batch}, 8), got "
            f"{np.dtype(geometry.dtype)} {tuple(geometry.shape)}"
        )
    if (
        np.dtype(out.dtype) != np.float32
        or len(out.shape) != 4
        or tuple(out.shape[1:]) != (3, crop, crop)
        or out.shape[0] < batch
    ):
        raise ValueError(
            f"image_augment.augment: out must be float32 (>= {batch}, 3, {crop}, "
            f"{crop}), got {np.dtype(out.dtype)} {tuple(out.shape)}"
        )
    if batch == 0:
        return
    from cc2ops.cuda.runtime.device import get_device

    fn = get_kernel("image_augment", device, **augment_consts(crop))
    n = batch * crop * crop
    grid = max(1, min(-(-n // _BLOCK), get_device(device).multiprocessors * 32))
    m = [np.float32(v) for v in mean]
    s = [np.float32(v) for v in inv_std]
    launch(fn, grid, _BLOCK, [sources, geometry, out, np.int32(batch), *m, *s], device)


def normal(
    out: Any, key: tuple[int, int], counter: int, crop: int, device: int
) -> None:
    """Fill the C-contiguous float32 GPUArray ``out`` with standard normals.

    Element ``i`` comes from Philox4x32-10 block ``counter + i // 4`` under
    ``key``; the same (key, counter) gives the same values.
    """
    if np.dtype(out.dtype) != np.float32:
        raise TypeError(f"image_augment.normal: out must be float32, got {out.dtype}")
    n = int(np.prod(out.shape, dtype=np.int64))
    if n == 0:
        return
    from cc2ops.cuda.runtime.device import get_device

    fn = get_kernel("image_augment", device, **normal_consts(crop))
    blocks = -(-n // 4)
    grid = max(1, min(-(-blocks // _BLOCK), get_device(device).multiprocessors * 32))
    args = [out, np.int64(n), np.uint32(key[0]), np.uint32(key[1]), np.uint64(counter)]
    launch(fn, grid, _BLOCK, args, device)
