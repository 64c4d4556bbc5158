"""The augmentation kernel (cc2ops/cuda/image_augment.py): its numpy twin against
Pillow and the example's CPU pipeline (CPU), the kernel against the twin (GPU).

Measured differences to the CPU pipeline, stated in the module docstring:

- resampling: 0 (the twin and the kernel are Pillow's 8-bit BILINEAR bit for
  bit, checked here against ``PIL.Image.resize`` and, on the GPU, the kernel
  against the twin);
- the DCT-domain draft Pillow applies to images at least twice ``scale`` on
  the shorter side (the GPU resizes the full decode instead): mean absolute
  difference under 1.5 levels of 255 and at most 8 on the noisy smooth images
  here (0.3-1.0 and 2-6 measured);
- normalisation: the same float32 operations, equal values (1e-6 asserted);
- the decoders themselves (nvJPEG against libjpeg-turbo): measured by the GPU
  test ``test_nvimgcodec_decodes_like_pillow``, which prints the numbers.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

from cc2ops.cuda.ops.image_augment import (
    augment_consts,
    check_geometry,
    image_augment_reference,
    normal_consts,
    pillow_bilinear_resize,
    resize_coefficients,
)
from cc2ops.cuda.runtime.compile import all_variants, render

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "imagenet"
sys.path.insert(0, str(EXAMPLE))

import data  # noqa: E402
import gpu_data  # noqa: E402

MEAN = (123.5, 116.25, 103.0)
STD = (58.4, 57.1, 57.4)


def _inv(std):
    return (1.0 / np.asarray(std, np.float64)).astype(np.float32)


def _smooth(rng, h, w, grid=8, noise=6):
    """A photograph-like image: a smooth field plus a little noise."""
    coarse = rng.integers(0, 256, (grid, grid, 3), dtype=np.uint8)
    im = Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC)
    a = np.asarray(im).astype(np.int16) + rng.integers(-noise, noise + 1, (h, w, 3))
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


# --------------------------------------------------------------------------
# the twin (CPU)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "h, w, rh, rw",
    [(375, 500, 256, 341), (37, 53, 36, 51), (100, 80, 36, 29), (40, 40, 40, 40),
     (300, 200, 300, 150), (20, 31, 40, 62), (1, 7, 3, 2), (257, 1, 33, 5)],
)  # fmt: skip
def test_the_twin_resizes_exactly_as_pillow_bilinear(h, w, rh, rw):
    img = np.random.default_rng(h * w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    want = np.asarray(Image.fromarray(img).resize((rw, rh), Image.Resampling.BILINEAR))
    got = pillow_bilinear_resize(img, rh, rw)
    assert got.shape == want.shape and got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


def test_resize_coefficients_sum_to_one_in_fixed_point():
    for n_in, n_out in ((500, 341), (36, 51), (7, 1)):
        xmin, weights = resize_coefficients(n_in, n_out)
        assert len(weights) == n_out and (xmin >= 0).all()
        for x0, k in zip(xmin, weights, strict=True):
            assert x0 + len(k) <= n_in
            assert abs(int(k.sum()) - (1 << 22)) <= len(k)
    with pytest.raises(ValueError, match="sizes must be >= 1"):
        resize_coefficients(0, 3)


def test_the_twin_is_the_cpu_pipeline_on_the_same_plan(tmp_path):
    """Same crops, flips and pixels (to 1e-6) as data.FolderSource, for images
    Pillow does not draft (shorter side < 2 scale) and the full-size decode."""
    rng = np.random.default_rng(1)
    scale, crop = 36, 32
    for c in range(2):
        (tmp_path / "train" / f"c{c}").mkdir(parents=True)
    sizes = [(40, 50), (71, 36), (36, 36), (55, 44), (64, 70), (37, 69), (50, 51)]
    for k, (h, w) in enumerate(sizes):
        buf = io.BytesIO()
        _smooth(rng, h, w).save(buf, "JPEG", quality=90)
        (tmp_path / "train" / f"c{k % 2}" / f"{k}.jpg").write_bytes(buf.getvalue())
    split = data.scan_split(tmp_path, "train")
    norm = data.Normalisation(MEAN, STD)
    src = data.FolderSource(split, scale, crop, norm)
    mean, inv = norm.arrays()
    for plan in (data.epoch_plan(len(split), 7, 4, 2), data.eval_plan(len(split), 7)):
        want = src.batch(plan, 0)
        images, rows = [], []
        for pos in range(7):
            with Image.open(split.paths[plan.order[pos]]) as im:
                img = np.asarray(im.convert("RGB"))
            h, w = img.shape[:2]
            rw, rh = gpu_data.resize_target(w, h, scale)
            if plan.uy is None:
                oy, ox = data.centre_offsets(rh, rw, crop)
                flip = 0
            else:
                oy, ox = data.crop_offsets(rh, rw, crop, plan.uy[pos], plan.ux[pos])
                flip = int(plan.flip[pos])
            images.append(img)
            rows.append([h, w, 3 * w, rh, rw, oy, ox, flip])
        got = image_augment_reference(images, rows, crop, mean.ravel(), inv.ravel())
        assert got.shape == want.x.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want.x, rtol=0, atol=1e-6)


@pytest.mark.parametrize("w, h", [(1000, 750), (800, 600), (600, 512)])
def test_the_difference_where_pillow_drafts_is_small(tmp_path, w, h):
    """Pillow decodes these at 1/2 or 1/4 size before its resize; the GPU path
    resizes the full decode to the same size: same windows, close pixels."""
    rng = np.random.default_rng(w)
    path = tmp_path / "x.jpg"
    _smooth(rng, h, w).save(path, "JPEG", quality=90)
    cpu = data.load_image(str(path), 256)
    with Image.open(path) as im:
        full = np.asarray(im.convert("RGB"))
    rw, rh = gpu_data.resize_target(w, h, 256)
    assert gpu_data.draft_size(w, h, 256) != (w, h)
    gpu = pillow_bilinear_resize(full, rh, rw)
    assert gpu.shape == cpu.shape
    d = np.abs(gpu.astype(np.int16) - cpu)
    assert d.mean() < 1.5 and d.max() <= 8, (d.mean(), d.max())


def test_geometry_is_checked_with_clear_messages():
    ok = [[40, 50, 150, 36, 45, 2, 3, 1]]
    assert check_geometry(ok, 1, 32).dtype == np.int32
    cases = [
        ([[40, 50, 149, 36, 45, 2, 3, 1]], "pitch 149 must be >= 3 w = 150"),
        ([[40, 50, 150, 31, 45, 0, 0, 0]], "resized size 31x45 must be >= crop 32"),
        ([[40, 50, 150, 36, 45, 5, 0, 0]], r"window at \(5, 0\) must fit"),
        ([[40, 50, 150, 36, 45, 0, 0, 2]], "flip must be 0 or 1, got 2"),
        ([[0, 50, 150, 36, 45, 0, 0, 0]], "decoded size 0x50 must be >= 1"),
    ]
    for rows, msg in cases:
        with pytest.raises(ValueError, match=f"image_augment: image 0: {msg}"):
            check_geometry(rows, 1, 32)
    with pytest.raises(ValueError, match=r"geometry must have shape \(2, 8\)"):
        check_geometry(ok, 2, 32)
    img = np.zeros((40, 50, 3), np.uint8)
    with pytest.raises(ValueError, match="image 0 is 40x50, its geometry row says"):
        image_augment_reference([img], [[41, 50, 150, 36, 45, 0, 0, 0]], 32,
                                MEAN, _inv(STD))  # fmt: skip
    with pytest.raises(ValueError, match="crop must be an int >= 1, got 0"):
        augment_consts(0)


def test_variants_are_named_by_their_specialisation():
    names = {c["name"] for f, c in all_variants() if f == "image_augment"}
    assert {"image_augment_bilinear_c224", "image_augment_bilinear_c32",
            "image_augment_normal_c224"} <= names  # fmt: skip
    src = render("image_augment", **augment_consts(224))
    assert 'extern "C" __global__ void image_augment_bilinear_c224(' in src
    assert "image_augment_normal_c64(" in render("image_augment", **normal_consts(64))


# --------------------------------------------------------------------------
# the kernel (GPU)
# --------------------------------------------------------------------------


def _device_images(images, pitches, device=0):
    """Upload each image into its own buffer with rows ``pitch`` bytes apart."""
    from cc2ops.cuda.runtime import array

    bufs, ptrs = [], []
    for img, pitch in zip(images, pitches, strict=True):
        h, w, _ = img.shape
        padded = np.zeros((h, pitch), np.uint8)
        padded[:, : 3 * w] = img.reshape(h, 3 * w)
        g = array.to_gpu(padded, device)
        bufs.append(g)
        ptrs.append(array.ptr(g))
    return bufs, array.to_gpu(np.asarray(ptrs, np.uint64), device)


@pytest.mark.gpu
@pytest.mark.parametrize("crop, batch", [(32, 1), (32, 5), (224, 3)])
def test_the_kernel_equals_the_twin(crop, batch):
    from cc2ops.cuda.ops.image_augment import augment
    from cc2ops.cuda.runtime import array

    rng = np.random.default_rng(crop + batch)
    images, rows, pitches = [], [], []
    for b in range(batch):
        h = int(rng.integers(crop, 3 * crop))
        w = int(rng.integers(crop, 3 * crop))
        img = np.asarray(_smooth(rng, h, w, noise=40))
        short = min(h, w)
        scale = int(rng.integers(crop, short + 1))
        rh = max(scale, round(h * scale / short))
        rw = max(scale, round(w * scale / short))
        if b == batch - 1:
            rh, rw = h, w  # the identity window (CPU-decoded images)
        oy = int(rng.integers(0, rh - crop + 1))
        ox = int(rng.integers(0, rw - crop + 1))
        pitch = 3 * w + int(rng.integers(0, 9)) * 16
        images.append(img)
        pitches.append(pitch)
        rows.append([h, w, pitch, rh, rw, oy, ox, b % 2])
    inv = _inv(STD)
    want = image_augment_reference(images, rows, crop, MEAN, inv)
    keep, ptrs = _device_images(images, pitches)
    geom = array.to_gpu(check_geometry(rows, batch, crop), 0)
    out = array.empty((batch, 3, crop, crop), np.float32, 0)
    augment(ptrs, geom, out, crop, MEAN, inv, 0)
    got = array.to_host(out)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
def test_the_normal_kernel_is_standard_normal_and_reproducible():
    from cc2ops.cuda.ops.image_augment import normal
    from cc2ops.cuda.runtime import array

    a = array.empty((64, 3, 32, 33), np.float32, 0)
    b = array.empty((64, 3, 32, 33), np.float32, 0)
    normal(a, (1, 2), 0, 32, 0)
    normal(b, (1, 2), 0, 32, 0)
    x, y = array.to_host(a), array.to_host(b)
    np.testing.assert_array_equal(x, y)
    assert np.isfinite(x).all()
    assert abs(x.mean()) < 0.01 and abs(x.std() - 1) < 0.01
    normal(b, (1, 3), 0, 32, 0)
    assert not np.array_equal(array.to_host(b), x)


@pytest.mark.gpu
@pytest.mark.parametrize("fancy", [False, True])
def test_nvimgcodec_decodes_like_pillow(fancy):
    """The decoders' difference on ImageNet-like JPEGs (500x375, quality 90,
    4:2:0), printed; bounded loosely (IDCT rounding, chroma upsampling:
    nvImageCodec's default, and libjpeg's "fancy" one)."""
    nvimgcodec = pytest.importorskip("nvidia.nvimgcodec")
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(0)
    dev.activate()
    dec = nvimgcodec.Decoder(options=f":fancy_upsampling={int(fancy)}")
    params = nvimgcodec.DecodeParams(apply_exif_orientation=False)
    rng = np.random.default_rng(3)
    blobs, wants = [], []
    for _ in range(8):
        buf = io.BytesIO()
        _smooth(rng, 375, 500).save(buf, "JPEG", quality=90)
        blobs.append(buf.getvalue())
        with Image.open(io.BytesIO(blobs[-1])) as im:
            wants.append(np.asarray(im.convert("RGB")))
    imgs = dec.decode(blobs, params=params)
    diffs = []
    for img, want in zip(imgs, wants, strict=True):
        assert img is not None
        got = np.asarray(img.cpu())
        assert got.shape == want.shape
        diffs.append(np.abs(got.astype(np.int16) - want))
    d = np.stack(diffs)
    print(
        f"nvImageCodec (fancy_upsampling={int(fancy)}) vs Pillow: mean |diff| "
        f"{d.mean():.3f}, 99.9th percentile {np.percentile(d, 99.9):.0f}, max "
        f"{d.max()} (levels of 255)"
    )
    assert d.mean() < 2.0 and np.percentile(d, 99.9) <= 24
