"""The GPU input pipeline of the ImageNet example (``--device cuda``).

The CPU path (``data.py``) decodes, resizes, crops, flips and normalises with
Pillow and numpy in worker threads: at most about 1k images/s on 16 cores,
twenty times less than the captured training step consumes. Here:

- a *loader thread* executes the same :func:`data.epoch_plan` batch by
  batch: it reads the batch's files (a small thread pool), looks at each
  JPEG's header on the host (:func:`route`), decodes the JPEGs it can in one
  nvImageCodec batch call on a second CUDA stream, and uploads the batch's
  geometry and labels from pinned host buffers on that stream, then records
  an event;
- files nvImageCodec should not or cannot decode (not JPEG, CMYK/YCCK,
  12-bit, arithmetic-coded, truncated, larger than Pillow's
  ``MAX_IMAGE_PIXELS``, or refused by the decoder) go through the CPU path
  itself, :meth:`data.FolderSource.batch` on a one-image plan with the same
  crop numbers and flip, so they are decoded, skipped, counted and reported,
  or raise :class:`data.DatasetError` under ``--bad-images error``, exactly
  as ``--device cpu`` does;
- the *consumer* (the training loop) makes the device's stream wait for that
  event and launches one kernel, :func:`cc2ops.cuda.ops.image_augment.augment`,
  which resizes (Pillow's BILINEAR arithmetic), cuts the plan's crop window,
  flips, normalises and writes the (B, 3, crop, crop) float32 batch;
- at most ``depth`` prepared batches wait in a bounded queue, so reading and
  decoding batch i+1 overlaps step i; a batch's buffers (pinned host, device)
  belong to a *slot* that is reused only after the device's stream has
  passed the step that read them (an event), and the decoded images are
  kept alive until then.

Crop windows and flips come from the plan exactly as on the CPU (the resized
size is computed from the size Pillow's JPEG ``draft`` would decode, see
:func:`resize_target`), so a resumed run sees the same crops and flips, and
the pixels differ from the CPU path only by the decoders (see
:mod:`cc2ops.cuda.ops.image_augment`).

``--synthetic`` draws its images on the device (:class:`GpuSyntheticSource`,
Philox standard normals: other values than the CPU's
:class:`data.SyntheticSource`, the same distribution).

Everything but :class:`CudaOps` is plain Python over a small interface (the
``ops`` object: decode, slots, finish, release), which the tests replace by
a host twin to check plan slicing, routing, ordering, queueing and resume on
the CPU. nvImageCodec (``pip install nvidia-nvimgcodec-cu13``, or
``cc2ops[gpu-data]``) is imported only when a :class:`CudaOps` is made.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

# the sibling modules, also when this file is imported from elsewhere
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import data  # noqa: E402
import gpu_step  # noqa: E402

__all__ = [
    "GpuDataError",
    "JpegHeader",
    "jpeg_header",
    "route",
    "draft_size",
    "resize_target",
    "Decoded",
    "Slot",
    "decode_backends",
    "CudaOps",
    "GpuFolderSource",
    "GpuSyntheticSource",
    "GpuLoader",
    "make_sources",
]

#: JPEG start-of-frame markers nvJPEG decodes: baseline, extended, progressive
#: (Huffman-coded). Lossless (C3), arithmetic (C9-CB) and the hierarchical
#: ones go to Pillow.
GPU_SOF = (0xC0, 0xC1, 0xC2)
_SOF = tuple(m for m in range(0xC0, 0xD0) if m not in (0xC4, 0xC8, 0xCC))


class GpuDataError(data.DatasetError):
    """The GPU input pipeline cannot run here (no nvImageCodec, say)."""


# --------------------------------------------------------------------------
# host-side decisions
# --------------------------------------------------------------------------


class JpegHeader(NamedTuple):
    """What a JPEG's start-of-frame segment says."""

    sof: int
    precision: int
    height: int
    width: int
    components: int
    adobe: bool


def jpeg_header(blob: bytes) -> JpegHeader | None:
    """The frame header of a JPEG file's bytes, or None if it is not a JPEG.

    Walks the marker segments from SOI to the first SOF (or gives up at SOS
    or on a malformed segment); notes an Adobe APP14 segment, whose colour
    transform flag nvJPEG and libjpeg may read differently.
    """
    n = len(blob)
    if n < 4 or blob[0] != 0xFF or blob[1] != 0xD8:
        return None
    i = 2
    adobe = False
    while i + 4 <= n:
        if blob[i] != 0xFF:
            return None
        marker = blob[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # no length
            i += 2
            continue
        length = (blob[i + 2] << 8) | blob[i + 3]
        if length < 2:
            return None
        if marker == 0xEE and blob[i + 4 : i + 9] == b"Adobe":
            adobe = True
        if marker in _SOF:
            if i + 10 > n:
                return None
            return JpegHeader(
                sof=marker,
                precision=blob[i + 4],
                height=(blob[i + 5] << 8) | blob[i + 6],
                width=(blob[i + 7] << 8) | blob[i + 8],
                components=blob[i + 9],
                adobe=adobe,
            )
        if marker == 0xDA:
            return None
        i += 2 + length
    return None


def _max_pixels() -> int | None:
    # read when asked: follows whatever the run (or data.py) sets
    return data._pil().MAX_IMAGE_PIXELS


def route(blob: bytes | None, max_pixels: int | None) -> str:
    """``"gpu"`` for a file nvImageCodec decodes like Pillow, else ``"pillow"``.

    GPU: an 8-bit Huffman-coded JPEG (SOF0/1/2) of 1 or 3 components without
    an Adobe segment, ending with its EOI marker (trailing zero bytes
    allowed), of at most ``max_pixels`` pixels (Pillow's decompression-bomb
    limit; None: no limit). Everything else -- unreadable, not a JPEG, CMYK,
    12-bit, truncated, huge -- goes to the CPU path, which decodes it, or
    skips and reports it, or raises, exactly as ``--device cpu`` would.
    """
    if blob is None:
        return "pillow"
    head = jpeg_header(blob)
    if (
        head is None
        or head.sof not in GPU_SOF
        or head.precision != 8
        or head.components not in (1, 3)
        or head.adobe
        or head.height < 1
        or head.width < 1
    ):
        return "pillow"
    if max_pixels is not None and head.width * head.height > max_pixels:
        return "pillow"
    if not blob.rstrip(b"\x00").endswith(b"\xff\xd9"):
        return "pillow"
    return "gpu"


def draft_size(width: int, height: int, scale: int) -> tuple[int, int]:
    """The (width, height) Pillow decodes a JPEG at after ``draft("RGB", (s, s))``.

    Pillow's ``JpegImageFile.draft``: the largest of 8, 4, 2, 1 that divides
    both sides down to at least ``scale`` (by floor division), sides rounded up.
    """
    ratio = min(width // scale, height // scale)
    s = next(s for s in (8, 4, 2, 1) if ratio >= s)
    return (width + s - 1) // s, (height + s - 1) // s


def resize_target(width: int, height: int, scale: int) -> tuple[int, int]:
    """The (width, height) ``data.load_image`` resizes a JPEG of this size to.

    The size after :func:`draft_size`, then the shorter side to ``scale``
    (``data.load_image``'s rule, rounding included); with it, the crop
    windows of the GPU path are the CPU path's.
    """
    w, h = draft_size(width, height, scale)
    short = min(w, h)
    return max(scale, round(w * scale / short)), max(scale, round(h * scale / short))


# --------------------------------------------------------------------------
# the device side: an interface and its CUDA implementation
# --------------------------------------------------------------------------


@dataclass
class Decoded:
    """One decoded image in device memory: uint8 RGB rows ``pitch`` bytes apart.

    ``keep`` holds whatever owns the memory (the nvImageCodec image).
    """

    ptr: int
    height: int
    width: int
    pitch: int
    keep: Any = None


@dataclass
class Slot:
    """The buffers of one batch in flight (see the module docstring).

    ``state`` is the ``ops`` object's own (pinned and device buffers, events);
    ``keep`` the decoded images the batch reads.
    """

    index: int
    state: Any = None
    keep: list = field(default_factory=list)


def decode_backends(nvimgcodec: Any) -> list:
    """nvImageCodec's backends for :class:`CudaOps`: which decoder takes an
    image depends on the image alone.

    The hardware JPEG decoder (NVJPG engines, where the GPU has them) takes
    every image it can, the CUDA decoder the others, each with load hint 1.0
    and the ``FIXED`` policy. nvImageCodec's default backends split batches by
    hints that follow the batches decoded before, and the two decoders round
    some pixels differently, so a run resumed mid-epoch read other pixels than
    the uninterrupted run (benchmarks/notes/train.md). Images neither backend
    decodes come back as None and go to the CPU path.
    """
    fixed = nvimgcodec.LoadHintPolicy.FIXED
    return [
        nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY, 1.0, fixed),
        nvimgcodec.Backend(nvimgcodec.BackendKind.GPU_ONLY, 1.0, fixed),
    ]


class CudaOps:
    """nvImageCodec decoding, uploads on a second stream, and the augment kernel.

    Parameters
    ----------
    device : int
        Device label.
    crop : int
    norm : data.Normalisation
    capacity : int
        The most images of one batch.
    decode_threads : int
        nvImageCodec's CPU threads (Huffman decoding of the hybrid backend);
        0: its default (the core count).
    fancy_upsampling : bool
        libjpeg's (and so Pillow's) chroma upsampling, closer to the CPU
        path; off by default, as in nvImageCodec, whose hardware JPEG
        decoder (the H200 has NVJPG engines) may not offer it. The chroma
        difference it makes is measured by the GPU tests.

    Raises
    ------
    GpuDataError
        nvImageCodec is not installed (``pip install -e ".[gpu-data]"``).
    """

    def __init__(
        self,
        device: int,
        crop: int,
        norm: data.Normalisation,
        capacity: int,
        decode_threads: int = 0,
        fancy_upsampling: bool = False,
    ) -> None:
        try:
            from nvidia import nvimgcodec
        except ImportError as e:
            raise GpuDataError(
                f"the GPU input pipeline needs nvImageCodec ({e}); pip install -e "
                "'.[gpu-data]' (nvidia-nvimgcodec-cu13), or pass --data-device cpu "
                "to decode with Pillow"
            ) from e
        from cc2ops.cuda.runtime.availability import driver
        from cc2ops.cuda.runtime.device import get_device

        self.device = device
        self.crop = crop
        self.capacity = capacity
        mean, inv = norm.arrays()
        self.mean = [float(v) for v in mean.ravel()]
        self.inv_std = [float(v) for v in inv.ravel()]
        self._dev = get_device(device)
        self._drv = driver()
        self._dev.activate()
        self.side = self._drv.Stream()
        self.decoder = nvimgcodec.Decoder(
            device_id=self._dev.index,
            max_num_cpu_threads=decode_threads,
            backends=decode_backends(nvimgcodec),
            options=f":fancy_upsampling={int(fancy_upsampling)}",
        )
        # EXIF orientation ignored, as Pillow's decode in data.load_image
        self.params = nvimgcodec.DecodeParams(apply_exif_orientation=False)
        self._nv = nvimgcodec

    # ---- loader thread ----------------------------------------------------
    def _wrap(self, img: Any) -> Decoded | None:
        if img is None:
            return None
        cai = img.__cuda_array_interface__
        shape = tuple(cai["shape"])
        if cai.get("typestr") != "|u1" or len(shape) != 3 or shape[2] != 3:
            return None
        strides = cai.get("strides")
        pitch = int(strides[0]) if strides else 3 * int(shape[1])
        return Decoded(int(cai["data"][0]), int(shape[0]), int(shape[1]), pitch, img)

    def decode(self, blobs: Sequence[bytes]) -> list[Decoded | None]:
        """Decode a batch on the side stream; None where it failed."""
        self._dev.activate()
        stream = int(self.side.handle)

        def run(items: Any) -> Any:
            return self.decoder.decode(items, params=self.params, cuda_stream=stream)

        items: list[Any] = list(blobs)
        try:
            try:
                out = run(items)
            except TypeError:
                # a version that takes code streams rather than bytes
                items = [self._nv.CodeStream(b) for b in blobs]
                out = run(items)
        except RuntimeError:
            out = None  # the batch call failed: image by image below
        if out is None or len(out) != len(items):
            # some versions drop a refused image from the list instead of
            # returning None in its place
            out = []
            for item in items:
                try:
                    out.append(run(item))
                except RuntimeError:
                    out.append(None)
        return [self._wrap(img) for img in out]

    def decode_to_host(self, blobs: Sequence[bytes]) -> list[np.ndarray | None]:
        """:meth:`decode`, then each image copied back as (H, W, 3) uint8, for
        measuring the decoder's difference from Pillow (tests, benchmarks)."""
        out = self.decode(blobs)
        self.side.synchronize()
        return [None if d is None else np.asarray(d.keep.cpu()) for d in out]

    def new_slot(self, index: int) -> Slot:
        drv = self._drv
        self._dev.activate()
        from pycuda.gpuarray import GPUArray

        cap = self.capacity

        def device_array(shape: tuple, dtype: Any) -> Any:
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            # not from cc2ops's pool: the pool assumes one stream, these
            # buffers are written on the side stream
            alloc = drv.mem_alloc(max(nbytes, 1))
            return GPUArray(shape, dtype, gpudata=alloc), alloc

        c = self.crop
        ptrs, a1 = device_array((cap,), np.uint64)
        geom, a2 = device_array((cap, 8), np.int32)
        labels, a3 = device_array((cap,), np.int32)
        # the CPU-decoded images of a batch (already cropped): allocated here,
        # on the consumer's thread, like every other buffer of the slot, never
        # in the loader thread (pycuda cannot free an object made there once
        # the thread has released its context)
        host, a4 = device_array((cap, c, c, 3), np.uint8)
        state = {
            "h_ptrs": drv.pagelocked_empty((cap,), np.uint64),
            "h_geom": drv.pagelocked_empty((cap, 8), np.int32),
            "h_labels": drv.pagelocked_empty((cap,), np.int32),
            "h_host": drv.pagelocked_empty((cap, c, c, 3), np.uint8),
            "ptrs": ptrs,
            "geom": geom,
            "labels": labels,
            "host": int(host.gpudata),
            "allocs": [a1, a2, a3, a4],
            "ready": drv.Event(),
            "released": drv.Event(),
            "used": False,
        }
        return Slot(index, state)

    def free_slot(self, slot: Slot) -> None:
        """Free a slot's buffers now, on the calling (consumer) thread.

        Waits for the side stream and for the device's last use of the slot,
        then frees its device and pinned buffers and drops its events and
        decoded images. The batches :meth:`finish` returned do not refer to
        the slot and stay valid.
        """
        st = slot.state
        if not st:
            return
        self._dev.activate()
        self.side.synchronize()
        if st["used"]:
            st["released"].synchronize()
        for alloc in st["allocs"]:
            alloc.free()
        for key in ("h_ptrs", "h_geom", "h_labels", "h_host"):
            st[key].base.free()
        st.clear()
        slot.keep = []

    def wait_released(self, slot: Slot) -> None:
        if slot.state["used"]:
            slot.state["released"].synchronize()

    def upload(
        self,
        slot: Slot,
        images: Sequence[Decoded | np.ndarray],
        geometry: np.ndarray,
        labels: np.ndarray,
    ) -> None:
        """Queue the batch's geometry, labels and CPU-decoded images on the side
        stream, then record the slot's ready event."""
        st = slot.state
        drv = self._drv
        self._dev.activate()
        n = len(images)
        host_imgs = [k for k, im in enumerate(images) if isinstance(im, np.ndarray)]
        if host_imgs:
            for j, k in enumerate(host_imgs):
                st["h_host"][j] = images[k]
            drv.memcpy_htod_async(st["host"], st["h_host"][: len(host_imgs)], self.side)
        j = 0
        for k, im in enumerate(images):
            if isinstance(im, np.ndarray):
                st["h_ptrs"][k] = st["host"] + j * self.crop * self.crop * 3
                j += 1
            else:
                st["h_ptrs"][k] = im.ptr
        st["h_geom"][:n] = geometry
        st["h_labels"][:n] = labels
        if n:
            drv.memcpy_htod_async(int(st["ptrs"].gpudata), st["h_ptrs"][:n], self.side)
            drv.memcpy_htod_async(int(st["geom"].gpudata), st["h_geom"][:n], self.side)
            drv.memcpy_htod_async(
                int(st["labels"].gpudata), st["h_labels"][:n], self.side
            )
        st["ready"].record(self.side)
        st["used"] = True

    # ---- consumer thread --------------------------------------------------
    def finish(self, slot: Slot, n: int) -> tuple[Any, Any]:
        """(x, y) of a prepared slot: the augment kernel and a copy of the labels
        queued on the device's stream after the slot's uploads and decodes.

        ``x`` and ``y`` are new arrays from the device's pool: they outlive
        the slot (:meth:`free_slot`).
        """
        from cc2ops.cuda.ops.image_augment import augment
        from cc2ops.cuda.runtime import array

        st = slot.state
        self._dev.activate()
        stream = self._dev.stream
        stream.wait_for_event(st["ready"])
        x = array.empty((n, 3, self.crop, self.crop), np.float32, self.device)
        augment(
            st["ptrs"][:n], st["geom"][:n], x, self.crop, self.mean, self.inv_std,
            self.device,
        )  # fmt: skip
        y = array.empty((n,), np.int32, self.device)
        if n:
            self._drv.memcpy_dtod_async(
                int(y.gpudata), int(st["labels"].gpudata), 4 * n, stream
            )
        return x, y

    def release(self, slot: Slot) -> None:
        """The device's stream has been given every use of the slot."""
        self._dev.activate()
        slot.state["released"].record(self._dev.stream)

    def end_thread(self) -> None:
        """The loader thread is about to end: pop the contexts it made current.

        pycuda aborts the process when a thread ends with a context on its
        stack (:func:`cc2ops.cuda.runtime.device.release_thread`).
        """
        from cc2ops.cuda.runtime.device import release_thread

        release_thread()


# --------------------------------------------------------------------------
# sources
# --------------------------------------------------------------------------


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None  # the CPU path reports it with its own message


class GpuFolderSource:
    """A :class:`data.Split` read by the GPU pipeline (same plans, same batches).

    Parameters
    ----------
    split, scale, crop, norm, bad_images
        As :class:`data.FolderSource` (``norm`` is required here).
    ops : CudaOps or a twin with the same methods
    read_workers : int
        Threads reading files (and running the CPU fallback) in the loader.
    """

    def __init__(
        self,
        split: data.Split,
        scale: int,
        crop: int,
        norm: data.Normalisation,
        bad_images: str,
        ops: Any,
        read_workers: int = 4,
    ) -> None:
        # the CPU path for the files the GPU does not take; it also checks the
        # arguments and their messages are the CPU's
        self.cpu = data.FolderSource(split, scale, crop, None, bad_images)
        self.split = split
        self.scale = scale
        self.crop = crop
        self.ops = ops
        self.read_workers = max(1, read_workers)
        self.routed_to_cpu = 0  # files the GPU did not take (statistics)

    def __len__(self) -> int:
        return len(self.split)

    def _cpu_one(self, plan: data.EpochPlan, pos: int) -> data.Batch:
        """The CPU path on the one-image plan of position ``pos`` (same crop, flip)."""
        one = data.EpochPlan(
            plan.order[pos : pos + 1],
            None if plan.uy is None else plan.uy[pos : pos + 1],
            None if plan.ux is None else plan.ux[pos : pos + 1],
            None if plan.flip is None else plan.flip[pos : pos + 1],
            1,
            drop_last=False,
            epoch=plan.epoch,
        )
        return self.cpu.batch(one, 0)

    def prepare(
        self, plan: data.EpochPlan, i: int, slot: Slot, pool: ThreadPoolExecutor
    ) -> tuple[int, list[tuple[str, str]]]:
        """Read, route, decode and upload batch ``i`` of ``plan`` into ``slot``.

        Returns the number of images and the skipped ``(path, reason)`` list;
        raises :class:`data.DatasetError` like the CPU path under
        ``--bad-images error``. Runs in the loader thread.
        """
        positions = list(range(len(plan.order))[plan.batch_slice(i)])
        idx = [int(plan.order[p]) for p in positions]
        paths = [self.split.paths[k] for k in idx]
        blobs = list(pool.map(_read, paths))
        limit = _max_pixels()
        kinds = [route(b, limit) for b in blobs]
        gpu_at = [j for j, k in enumerate(kinds) if k == "gpu"]
        self.ops.wait_released(slot)
        slot.keep = []
        decoded: dict[int, Decoded] = {}
        if gpu_at:
            with gpu_step.DEVICE_WORK:  # never while a graph is being captured
                results = self.ops.decode([blobs[j] for j in gpu_at])
            for j, img in zip(gpu_at, results, strict=True):
                if img is not None:
                    decoded[j] = img
        cpu_at = [j for j in range(len(positions)) if j not in decoded]
        cpu_batches = dict(
            zip(cpu_at, pool.map(lambda j: self._cpu_one(plan, positions[j]), cpu_at),
                strict=True)
        )  # fmt: skip
        self.routed_to_cpu += len(cpu_at)
        images: list[Decoded | np.ndarray] = []
        geometry: list[list[int]] = []
        labels: list[int] = []
        skipped: list[tuple[str, str]] = []
        c = self.crop
        for j, pos in enumerate(positions):
            if j in decoded:
                im = decoded[j]
                rw, rh = resize_target(im.width, im.height, self.scale)
                if plan.uy is None:
                    oy, ox = data.centre_offsets(rh, rw, c)
                else:
                    oy, ox = data.crop_offsets(rh, rw, c, plan.uy[pos], plan.ux[pos])
                flip = int(plan.flip is not None and bool(plan.flip[pos]))
                images.append(im)
                slot.keep.append(im.keep)
                geometry.append([im.height, im.width, im.pitch, rh, rw, oy, ox, flip])
            else:
                b = cpu_batches[j]
                if b.skipped:
                    skipped.extend(b.skipped)
                    continue
                # already resized, cropped and flipped by the CPU path: the
                # kernel's identity window only normalises it
                images.append(
                    np.ascontiguousarray(b.x[0].transpose(1, 2, 0).astype(np.uint8))
                )
                geometry.append([c, c, 3 * c, c, c, 0, 0, 0])
            labels.append(int(self.split.labels[idx[j]]))
        g = np.asarray(geometry, dtype=np.int32).reshape(len(images), 8)
        with gpu_step.DEVICE_WORK:
            self.ops.upload(slot, images, g, np.asarray(labels, dtype=np.int32))
        return len(images), skipped

    def iterate(
        self, plan: data.EpochPlan, start: int = 0, workers: int = 2, depth: int = 4
    ) -> GpuLoader:
        """Batches ``start, start+1, ...`` of ``plan`` (``data.iterate``'s contract)."""
        return GpuLoader(self, plan, start, workers, depth)


class GpuSyntheticSource:
    """Random standard-normal images drawn on the device, uniform labels.

    Batch ``i`` of a plan for epoch ``e`` uses the Philox key drawn from
    ``SeedSequence([seed, SYNTHETIC_STREAM, split_id, e, i])`` and its labels
    ``default_rng`` of the same sequence: reproducible, no host images.
    """

    def __init__(
        self,
        n_images: int,
        n_classes: int,
        crop: int,
        seed: int,
        split_id: int,
        device: int,
        draw: Callable[[Any, tuple[int, int], int], None] | None = None,
    ) -> None:
        # SyntheticSource checks the arguments with the CPU path's messages
        self._cpu = data.SyntheticSource(n_images, n_classes, crop, seed, split_id)
        self.n_images = n_images
        self.n_classes = n_classes
        self.crop = crop
        self.seed = seed
        self.split_id = split_id
        self.device = device
        self._draw = draw

    def __len__(self) -> int:
        return self.n_images

    def keys(self, plan: data.EpochPlan, i: int) -> tuple[tuple[int, int], np.ndarray]:
        """The Philox key and the labels of batch ``i`` (host side, tiny)."""
        rows = plan.batch_slice(i)
        n = rows.stop - rows.start
        ss = np.random.SeedSequence(
            [self.seed, data.SYNTHETIC_STREAM, self.split_id, plan.epoch, i]
        )
        k0, k1 = (int(v) for v in ss.generate_state(2, np.uint32))
        y = np.random.default_rng(ss).integers(0, self.n_classes, n).astype(np.int32)
        return (k0, k1), y

    def batch(self, plan: data.EpochPlan, i: int) -> data.Batch:
        (k0, k1), y = self.keys(plan, i)
        n = len(y)
        if self._draw is not None:
            x = self._draw((n, 3, self.crop, self.crop), (k0, k1), self.crop)
            return data.Batch(x, y)
        from cc2ops.cuda.ops.image_augment import normal
        from cc2ops.cuda.runtime import array

        x = array.empty((n, 3, self.crop, self.crop), np.float32, self.device)
        normal(x, (k0, k1), 0, self.crop, self.device)
        return data.Batch(x, array.to_gpu(y, self.device))

    def iterate(
        self, plan: data.EpochPlan, start: int = 0, workers: int = 2, depth: int = 4
    ) -> data.Prefetcher:
        # a kernel launch per batch: nothing to overlap, no threads
        return data.Prefetcher(
            lambda i: self.batch(plan, i), range(start, plan.n_batches), 0, depth
        )


# --------------------------------------------------------------------------
# the loader
# --------------------------------------------------------------------------

_DONE = object()


class GpuLoader:
    """Prepared batches of a :class:`GpuFolderSource`, in plan order, one thread ahead.

    Iterating yields :class:`data.Batch` objects whose ``x`` and ``y`` live on
    the device (``ops.finish``). At most ``depth`` prepared batches wait; the
    slot of a batch is released (``ops.release``) when the next batch is
    asked for or the loader is closed, i.e. after the caller queued the work
    that reads it. An error of the loader thread (a ``DatasetError`` under
    ``--bad-images error``) is raised by the iteration at its batch.
    """

    def __init__(
        self,
        source: GpuFolderSource,
        plan: data.EpochPlan,
        start: int,
        workers: int,
        depth: int,
    ) -> None:
        if depth < 1:
            raise ValueError(f"GpuLoader: depth must be >= 1, got {depth}")
        self.source = source
        self.plan = plan
        self.indices = range(start, plan.n_batches)
        self.depth = depth
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        # one slot filling, `depth` waiting, one in the consumer's hands
        self._free: queue.Queue = queue.Queue()
        self._slots = [source.ops.new_slot(k) for k in range(depth + 2)]
        for slot in self._slots:
            self._free.put(slot)
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, workers), thread_name_prefix="cc2ops-gpu-read"
        )
        self._thread = threading.Thread(
            target=self._run, name="cc2ops-gpu-loader", daemon=True
        )
        self._held: Slot | None = None
        self._started = False
        self._closed = False

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _take_slot(self) -> Slot | None:
        while not self._stop.is_set():
            try:
                return self._free.get(timeout=0.1)
            except queue.Empty:
                continue
        return None

    def _run(self) -> None:
        try:
            for i in self.indices:
                slot = self._take_slot()
                if slot is None:
                    return
                n, skipped = self.source.prepare(self.plan, i, slot, self._pool)
                if not self._put((i, slot, n, skipped)):
                    return
        except BaseException as e:  # handed to the consumer, in order
            self._put(e)
            return
        finally:
            # before the last item is handed over: the consumer may end the
            # process as soon as it has it, and this thread must not end with
            # a device context current (pycuda would abort)
            self.source.ops.end_thread()
        self._put(_DONE)

    def _release_held(self) -> None:
        if self._held is not None:
            self.source.ops.release(self._held)
            self._free.put(self._held)
            self._held = None

    def __iter__(self) -> Iterator[data.Batch]:
        if self._closed:
            raise ValueError(
                "GpuLoader: cannot iterate a closed loader (its slots "
                "are freed); make a new one with source.iterate"
            )
        if not self._started:
            self._started = True
            self._thread.start()
        while True:
            self._release_held()
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            _, slot, n, skipped = item
            self._held = slot
            x, y = self.source.ops.finish(slot, n)
            yield data.Batch(x, y, skipped)

    def close(self) -> None:
        """Stop the loader thread, release the slot in the consumer's hands and
        free every slot on the calling thread (the batches already yielded stay
        valid). Closing twice is a no-op."""
        self._closed = True
        self._stop.set()
        if self._started:
            self._thread.join()
        self._release_held()
        self._pool.shutdown(wait=True)
        # free on this thread, not wherever the garbage collector would run
        # (a reading thread has no device context: pycuda cannot free there)
        slots, self._slots = self._slots, []
        for slot in slots:
            self.source.ops.free_slot(slot)

    def __enter__(self) -> GpuLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------
# for train.py
# --------------------------------------------------------------------------


def make_sources(
    train: data.FolderSource | data.SyntheticSource,
    val: data.FolderSource | data.SyntheticSource,
    norm: data.Normalisation,
    device: int,
    batch_sizes: tuple[int, int],
    decode_threads: int = 0,
    read_workers: int = 4,
) -> tuple[Any, Any]:
    """The GPU counterparts of the CPU path's training and validation sources.

    Synthetic sources become :class:`GpuSyntheticSource` (same sizes and
    seeds); folder sources become :class:`GpuFolderSource` over one
    :class:`CudaOps` each (which raises :class:`GpuDataError` without
    nvImageCodec). ``batch_sizes``: the training and evaluation batch sizes
    (the most images a slot of each holds).
    """
    out = []
    for src, capacity in zip((train, val), batch_sizes, strict=True):
        if isinstance(src, data.SyntheticSource):
            out.append(
                GpuSyntheticSource(
                    src.n_images,
                    src.n_classes,
                    src.crop,
                    src.seed,
                    src.split_id,
                    device,
                )  # fmt: skip
            )
        else:
            ops = CudaOps(device, src.crop, norm, capacity, decode_threads)
            out.append(
                GpuFolderSource(
                    src.split,
                    src.scale,
                    src.crop,
                    norm,
                    src.bad_images,
                    ops,
                    read_workers,
                )  # fmt: skip
            )
    return out[0], out[1]
