"""The GPU input pipeline's logic on the CPU (examples/imagenet/gpu_data.py).

nvImageCodec and CUDA are replaced by :class:`HostOps`, a host twin of
``gpu_data.CudaOps``: it "decodes" with Pillow at full size (as nvImageCodec
does: no DCT-domain draft) and runs the augmentation kernel's numpy twin. On
images whose shorter side is under twice ``--scale`` (no draft on the CPU
path either) the batches must then be the CPU path's exactly: same images,
same order, same crops and flips, same labels, same skipped files. The real
decoder and kernel are checked against these twins by the GPU tests.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "imagenet"
sys.path.insert(0, str(EXAMPLE))

import data  # noqa: E402
import gpu_data  # noqa: E402
from cc2ops.cuda.ops.image_augment import image_augment_reference  # noqa: E402

SCALE, CROP = 36, 32
NORM = data.Normalisation((120.0, 110.5, 100.25), (60.0, 55.0, 50.0))


class HostOps:
    """``gpu_data.CudaOps`` on the host: Pillow full-size decode, numpy twin."""

    def __init__(self, crop: int, norm: data.Normalisation, refuse=()) -> None:
        self.crop = crop
        mean, inv = norm.arrays()
        self.mean, self.inv = mean.ravel(), inv.ravel()
        self.refuse = set(refuse)  # blobs the "decoder" fails on
        self.decoded = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.ended = []  # threads that called end_thread
        self.freed = []  # (slot index, thread) of free_slot calls

    def decode(self, blobs):
        out = []
        for b in blobs:
            if b in self.refuse:
                out.append(None)
                continue
            with Image.open(io.BytesIO(b)) as im:
                arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
            self.decoded += 1
            out.append(gpu_data.Decoded(id(arr), arr.shape[0], arr.shape[1],
                                        3 * arr.shape[1], arr))  # fmt: skip
        return out

    def new_slot(self, index):
        return gpu_data.Slot(index, {"busy": False})

    def wait_released(self, slot):
        assert not slot.state["busy"], "a slot was refilled before its release"

    def upload(self, slot, images, geometry, labels):
        slot.state.update(
            busy=True,
            images=[im.keep if isinstance(im, gpu_data.Decoded) else im
                    for im in images],
            geometry=geometry.copy(),
            labels=labels.copy(),
        )  # fmt: skip
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def finish(self, slot, n):
        st = slot.state
        assert len(st["images"]) == n
        if n == 0:
            x = np.empty((0, 3, self.crop, self.crop), np.float32)
        else:
            x = image_augment_reference(
                st["images"], st["geometry"], self.crop, self.mean, self.inv
            )
        return x, st["labels"]

    def release(self, slot):
        slot.state["busy"] = False
        with self.lock:
            self.in_flight -= 1

    def free_slot(self, slot):
        # the consumer's thread frees every slot once (CudaOps frees buffers)
        assert not slot.state.get("freed"), "a slot was freed twice"
        self.freed.append((slot.index, threading.current_thread().name))
        slot.state["freed"] = True

    def end_thread(self):
        # which thread ends, and whether it still had work to hand over
        self.ended.append(threading.current_thread().name)


def _smooth(rng, h, w):
    """A smooth random RGB image (bilinear upsampling of a coarse grid)."""
    coarse = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize((w, h), Image.Resampling.BILINEAR)


def _jpeg(img, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """2 classes, 14 train / 5 val images of 36-70 px, among them one of every
    kind of file the GPU must hand to the CPU path (and two unreadable)."""
    root = tmp_path_factory.mktemp("gpu_data")
    rng = np.random.default_rng(5)
    for split, n in (("train", 7), ("val", 3)):
        for c in range(2):
            d = root / split / f"c{c}"
            d.mkdir(parents=True)
            for k in range(n):
                h, w = int(rng.integers(36, 71)), int(rng.integers(36, 71))
                (d / f"img{k}.jpg").write_bytes(_jpeg(_smooth(rng, h, w)))
    t = root / "train"
    (t / "c0" / "gray.jpg").write_bytes(_jpeg(_smooth(rng, 40, 50).convert("L")))
    (t / "c0" / "cmyk.jpg").write_bytes(_jpeg(_smooth(rng, 45, 38).convert("CMYK")))
    (t / "c0" / "prog.jpg").write_bytes(_jpeg(_smooth(rng, 50, 60), progressive=True))
    png = io.BytesIO()
    _smooth(rng, 44, 39).save(png, "PNG")
    (t / "c1" / "plain.png").write_bytes(png.getvalue())
    good = _jpeg(_smooth(rng, 50, 50))
    (t / "c1" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (t / "c1" / "empty.jpg").write_bytes(b"")
    (root / "val" / "c1" / "garbage.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return root


def _sources(root, split, bad="skip", refuse=()):
    s = data.scan_split(root, split)
    cpu = data.FolderSource(s, SCALE, CROP, NORM, bad)
    ops = HostOps(CROP, NORM, refuse)
    return cpu, gpu_data.GpuFolderSource(s, SCALE, CROP, NORM, bad, ops, 2), ops


def _batches(source, plan, start=0, workers=2, depth=2):
    with data.iterate(source, plan, start, workers, depth) as it:
        return list(it)


def _same_batches(got, want):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.x.shape == w.x.shape and g.x.dtype == w.x.dtype, f"batch {k}"
        np.testing.assert_allclose(g.x, w.x, rtol=0, atol=1e-6, err_msg=f"batch {k}")
        np.testing.assert_array_equal(g.y, w.y, err_msg=f"batch {k}")
        assert g.skipped == w.skipped, f"batch {k}"


# --------------------------------------------------------------------------
# host-side decisions
# --------------------------------------------------------------------------


def test_route_sends_only_plain_8bit_jpegs_to_the_gpu(folder):
    t = folder / "train"
    rd = lambda p: p.read_bytes()  # noqa: E731
    assert gpu_data.route(rd(t / "c0" / "img0.jpg"), None) == "gpu"
    assert gpu_data.route(rd(t / "c0" / "gray.jpg"), None) == "gpu"
    assert gpu_data.route(rd(t / "c0" / "prog.jpg"), None) == "gpu"
    for name in ("c0/cmyk.jpg", "c1/plain.png", "c1/truncated.jpg", "c1/empty.jpg"):
        assert gpu_data.route(rd(t / name), None) == "pillow", name
    assert gpu_data.route(None, None) == "pillow"
    # Pillow's decompression-bomb limit: a huge image goes to the CPU path,
    # which reports it as --device cpu does
    head = gpu_data.jpeg_header(rd(t / "c0" / "img0.jpg"))
    assert head.precision == 8 and head.components == 3 and head.sof == 0xC0
    assert gpu_data.route(rd(t / "c0" / "img0.jpg"), head.width * head.height - 1) == (
        "pillow"
    )
    assert gpu_data.jpeg_header(rd(t / "c0" / "cmyk.jpg")).components == 4
    assert gpu_data.jpeg_header(rd(t / "c0" / "prog.jpg")).sof == 0xC2
    assert gpu_data.jpeg_header(b"\xff\xd8\xff\xe0\x00") is None


@pytest.mark.parametrize(
    "size", [(500, 375), (1024, 768), (640, 2000), (3000, 2000), (300, 256), (90, 80)]
)
def test_draft_and_resize_target_are_pillows(tmp_path, size):
    w, h = size
    path = tmp_path / "x.jpg"
    path.write_bytes(_jpeg(Image.new("RGB", (w, h), (10, 200, 30))))
    scale = min(256, min(w, h))
    with Image.open(path) as im:
        im.draft("RGB", (scale, scale))
        assert gpu_data.draft_size(w, h, scale) == im.size
    got = data.load_image(str(path), scale)
    assert gpu_data.resize_target(w, h, scale) == (got.shape[1], got.shape[0])


# --------------------------------------------------------------------------
# the pipeline against the CPU path
# --------------------------------------------------------------------------


def test_training_batches_equal_the_cpu_path(folder):
    cpu, gpu, ops = _sources(folder, "train")
    plan = data.epoch_plan(len(cpu), 4, seed=3, epoch=1)
    want = _batches(cpu, plan)
    got = _batches(gpu, plan)
    _same_batches(got, want)
    skipped = {p.rsplit("/", 1)[1] for b in got for p, _ in b.skipped}
    assert skipped <= {"truncated.jpg", "empty.jpg"}
    # the GPU took the plain JPEGs (grey and progressive too), the CPU the rest
    used = [cpu.split.paths[k] for k in plan.order[: plan.n_batches * 4]]
    kinds = [gpu_data.route(Path(p).read_bytes(), None) for p in used]
    assert ops.decoded == kinds.count("gpu") > 0
    assert gpu.routed_to_cpu == kinds.count("pillow") > 0


def test_evaluation_batches_equal_the_cpu_path(folder):
    cpu, gpu, _ = _sources(folder, "val")
    plan = data.eval_plan(len(cpu), 4)
    _same_batches(_batches(gpu, plan), _batches(cpu, plan))


def test_a_file_the_decoder_refuses_goes_through_the_cpu_path(folder):
    refused = (folder / "train" / "c1" / "img2.jpg").read_bytes()
    cpu, gpu, ops = _sources(folder, "train", refuse=[refused])
    plan = data.epoch_plan(len(cpu), 5, seed=0, epoch=0)
    _same_batches(_batches(gpu, plan), _batches(cpu, plan))


def test_the_decoder_takes_the_hardware_then_the_cuda_backend_each_for_every_image():
    """The hardware decoder first, then the CUDA decoder, each taking every image
    it can (load hint 1.0, FIXED): nvImageCodec's defaults split batches by
    hints that depended on the batches decoded before, and the two decoders
    round some pixels differently, so a resumed run read other pixels."""
    from types import SimpleNamespace

    class Backend:
        def __init__(self, kind, load_hint, policy):  # no defaults: all must be given
            self.args = (kind, load_hint, policy)

    fake = SimpleNamespace(
        Backend=Backend,
        BackendKind=SimpleNamespace(HW_GPU_ONLY="hw", GPU_ONLY="cuda",
                                    HYBRID_CPU_GPU="hybrid", CPU_ONLY="cpu"),
        LoadHintPolicy=SimpleNamespace(FIXED="FIXED", IGNORE="IGNORE",
                                       ADAPTIVE_MINIMIZE_IDLE_TIME="ADAPTIVE"),
    )  # fmt: skip
    got = [b.args for b in gpu_data.decode_backends(fake)]
    assert got == [("hw", 1.0, "FIXED"), ("cuda", 1.0, "FIXED")]


def test_resume_mid_epoch_sees_the_uninterrupted_batches(folder):
    cpu, gpu, _ = _sources(folder, "train")
    plan = data.epoch_plan(len(cpu), 3, seed=7, epoch=2)
    full = _batches(gpu, plan)
    _same_batches(_batches(gpu, plan, start=2), full[2:])
    _same_batches(_batches(gpu, plan, start=plan.n_batches), [])


def test_bad_images_error_raises_the_cpu_paths_error_at_its_batch(folder):
    cpu, gpu, _ = _sources(folder, "train", bad="error")
    plan = data.epoch_plan(len(cpu), 4, seed=3, epoch=1)
    want_n, want_err = 0, None
    with data.iterate(cpu, plan, 0, 0, 1) as it:
        try:
            for _ in it:
                want_n += 1
        except data.DatasetError as e:
            want_err = str(e)
    assert want_err is not None
    got_n = 0
    with pytest.raises(data.DatasetError) as err:
        with data.iterate(gpu, plan, 0, 2, 2) as it:
            for _ in it:
                got_n += 1
    assert str(err.value) == want_err and got_n == want_n


def test_the_queue_is_bounded_and_slots_are_reused_only_after_release(folder):
    _, gpu, ops = _sources(folder, "train")
    plan = data.epoch_plan(len(gpu), 2, seed=1, epoch=0)
    depth = 2
    n = 0
    with data.iterate(gpu, plan, 0, 2, depth) as it:
        for _ in it:
            time.sleep(0.02)  # a slow step: the loader runs ahead and waits
            n += 1
    assert n == plan.n_batches
    # prepared and not yet released: `depth` queued + one filling + one held
    assert 2 <= ops.max_in_flight <= depth + 2
    assert ops.in_flight == 0


def test_close_mid_epoch_stops_the_loader(folder):
    _, gpu, ops = _sources(folder, "train")
    plan = data.epoch_plan(len(gpu), 2, seed=1, epoch=0)
    loader = data.iterate(gpu, plan, 0, 2, 1)
    it = iter(loader)
    next(it)
    loader.close()
    assert not loader._thread.is_alive()
    assert ops.in_flight <= 2  # the queued one stays unconsumed; nothing leaks


@pytest.mark.parametrize("how", ["end of epoch", "error", "close mid-epoch"])
def test_the_loader_thread_releases_its_device_contexts_before_it_ends(folder, how):
    """pycuda aborts the process when a thread ends with a context current (the
    H200 runs of the pipeline died so): the loader thread calls
    ``ops.end_thread`` once, on every way out, before the consumer can see its
    last item."""
    bad = "error" if how == "error" else "skip"
    _, gpu, ops = _sources(folder, "train", bad=bad)
    plan = data.epoch_plan(len(gpu), 4, seed=3, epoch=1)
    loader = data.iterate(gpu, plan, 0, 2, 1)
    try:
        if how == "close mid-epoch":
            next(iter(loader))
            loader.close()
        else:
            expect = (
                pytest.raises(data.DatasetError) if how == "error" else nullcontext()
            )
            with expect:
                for _ in loader:
                    # the loader ends its thread before it hands over the end
                    pass
            assert ops.ended == ["cc2ops-gpu-loader"], how
    finally:
        loader.close()
    assert not loader._thread.is_alive()
    assert ops.ended == ["cc2ops-gpu-loader"], how
    # every slot freed once, by the consumer, not by a loader or reading thread
    me = threading.current_thread().name
    assert sorted(ops.freed) == [(k, me) for k in range(1 + 2)], how
    with pytest.raises(ValueError, match="closed loader"):
        next(iter(loader))


def test_synthetic_batches_are_reproducible_and_labels_in_range():
    drawn = []

    def draw(shape, key, crop):
        drawn.append(key)
        return np.zeros(shape, np.float32)

    src = gpu_data.GpuSyntheticSource(20, 7, CROP, 3, 0, device=0, draw=draw)
    plan = data.epoch_plan(20, 8, seed=3, epoch=1)
    a = _batches(src, plan)
    b = _batches(src, plan, start=1)
    assert len(a) == 2 and a[0].x.shape == (8, 3, CROP, CROP)
    np.testing.assert_array_equal(a[1].y, b[0].y)
    assert drawn[1] == drawn[2] and drawn[0] != drawn[1]
    assert all(0 <= v < 7 for bt in a for v in bt.y)
    with pytest.raises(data.DatasetError, match="synthetic data needs"):
        gpu_data.GpuSyntheticSource(0, 7, CROP, 3, 0, device=0)
