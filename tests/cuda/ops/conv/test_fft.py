"""FFT convolution (``fft``): sizes, plans, kernels and the three passes.

CPU: the transform sizes and chunk plans, ``applies`` and its errors, the
kernel names and registered variants, the candidate's place among the conv
algorithms, the passes run on a numpy backend (numpy FFTs standing in for
the kernels, numpy products for cuBLAS: the layouts, conjugations, shifts,
chunking and accumulation of the Python side), and the rendered kernels'
``__host__ __device__`` stages run block by block on the CPU through an
nvcc-built host harness against the same numpy kernel references. GPU
(``gpu`` marker): the kernels against those references, every pass against
the float64 reference convolution in fp32 and tf32 on a shape sweep and
AlexNet's conv2..conv5 on NaN-poisoned outputs, accumulation, uneven chunks,
the forced and autotuned paths, and ``test_conv_fft_sanitize``, small shapes
of every kernel kind for compute-sanitizer.
"""

from __future__ import annotations

import json
import subprocess
from multiprocessing.pool import ThreadPool

import numpy as np
import pytest
from helpers import needs_nvcc, rel_err, rng

from cc2ops.conv import (
    conv_backward_data_reference,
    conv_backward_filter_reference,
    conv_forward_reference,
)
from cc2ops.cuda.ops import load_gpu_op_modules
from cc2ops.cuda.ops.conv import fft as cf
from cc2ops.cuda.ops.conv import ops as gconv
from cc2ops.cuda.ops.conv.ops import ConvGeometry, geometry_of
from cc2ops.cuda.runtime import autotune as at
from cc2ops.cuda.runtime.compile import all_variants

F32, F64 = "float32", "float64"
PASSES = ("filter_acts", "image_acts", "weight_acts")
TOL = {"fp32": 1e-5, "tf32": 5e-3}

# (batch, channels, filters, image hw, filter hw, padding, groups)
SWEEP = [
    (1, 1, 1, (7, 7), (3, 3), (0, 0), 1),
    (3, 3, 4, (8, 6), (3, 2), (1, 0), 1),
    (5, 5, 6, (13, 11), (5, 5), (2, 2), 1),
    (2, 4, 6, (9, 8), (3, 3), (1, 1), 2),
    (3, 8, 8, (10, 7), (2, 3), (1, 2), 4),
    (1, 6, 4, (11, 9), (5, 3), (2, 1), 2),
    (3, 16, 24, (5, 5), (1, 1), (0, 0), 1),
    (7, 3, 5, (6, 12), (7, 1), (3, 0), 1),
    (2, 2, 3, (4, 4), (7, 7), (3, 3), 1),
    (4, 3, 2, (27, 5), (4, 4), (3, 1), 1),
    (3, 4, 4, (33, 31), (3, 3), (1, 1), 2),
    (129, 3, 5, (6, 7), (3, 3), (1, 1), 1),
    (2, 3, 2, (5, 6), (3, 3), (3, 2), 1),  # 8x8: exactly H + pad
    (3, 2, 2, (2, 5), (1, 2), (3, 2), 1),  # 8x8: exactly the output size
]
# (name, channels, filters, hw, k, pad): AlexNet's stride-1 layers
ALEXNET = [
    ("conv2", 64, 192, 27, 5, 2),
    ("conv3", 192, 384, 13, 3, 1),
    ("conv4", 384, 256, 13, 3, 1),
    ("conv5", 256, 256, 13, 3, 1),
]


def geom(b, c, f, hw, khw, pad, groups=1, stride=(1, 1)):
    return geometry_of("test", (b, c, *hw), (f, c // groups, *khw), stride, pad,
                       groups)  # fmt: skip


def _case(b, c, f, hw, khw, pad, groups, seed=0):
    r = rng(seed)
    x = r.standard_normal((b, c, *hw)).astype(F32)
    w = r.standard_normal((f, c // groups, *khw)).astype(F32)
    ho = hw[0] + 2 * pad[0] - khw[0] + 1
    wo = hw[1] + 2 * pad[1] - khw[1] + 1
    dy = r.standard_normal((b, f, ho, wo)).astype(F32)
    return x, w, dy


def _references(x, w, dy, hw, khw, pad, groups):
    x64, w64, dy64 = (a.astype(F64) for a in (x, w, dy))
    return {
        "filter_acts": conv_forward_reference(x64, w64, 1, pad, groups),
        "image_acts": conv_backward_data_reference(dy64, w64, hw, 1, pad, groups),
        "weight_acts": conv_backward_filter_reference(x64, dy64, khw, 1, pad, groups),
    }


# --------------------------------------------------------------------------
# the kernels' numpy references (their specification in kernels/conv_fft.cu)
# --------------------------------------------------------------------------


def _plane_index(q, n_fast, fast_step, slow_step):
    i = np.arange(q)
    return (i % n_fast) * fast_step + (i // n_fast) * slow_step


def r2c_reference(src, q, n_fast, fast_step, slow_step, size, data, conj):
    """(bins, q) spectra of the planes ``_r2c`` reads (numpy's rfft2)."""
    nh, nw = size
    dh, dw = data
    flat = np.reshape(src, -1)
    planes = flat.reshape(-1, dh, dw)[_plane_index(q, n_fast, fast_step, slow_step)]
    spec = np.fft.rfft2(planes.astype(np.float64), s=(nh, nw))
    if conj:
        spec = spec.conj()
    return spec.reshape(q, -1).T


def c2r_reference(spec, dst, q, n_fast, fast_step, slow_step, size, data, shift,
                  accumulate):  # fmt: skip
    """What ``_c2r`` writes into ``dst`` (numpy's irfft2, cropped, shifted)."""
    nh, nw = size
    dh, dw = data
    z = np.fft.irfft2(np.asarray(spec).T.reshape(q, nh, nw // 2 + 1), s=(nh, nw))
    rows = (np.arange(dh) + shift[0]) % nh
    cols = (np.arange(dw) + shift[1]) % nw
    crop = z[:, rows][:, :, cols]
    planes = np.reshape(dst, -1).reshape(-1, dh, dw)
    idx = _plane_index(q, n_fast, fast_step, slow_step)
    if accumulate:
        planes[idx] += crop
    else:
        planes[idx] = crop


# --------------------------------------------------------------------------
# sizes, plans, applies (CPU)
# --------------------------------------------------------------------------


def test_fft_size():
    assert cf.fft_size(27, 2, 27, 5) == 32  # conv2: 29 rows needed
    assert cf.fft_size(13, 1, 13, 3) == 16  # conv3..5
    assert cf.fft_size(7, 1, 7, 3) == 8  # 7x7 layers fit 8 (7 + 2*1 would not)
    assert cf.fft_size(56, 1, 56, 3) == 64
    assert cf.fft_size(2, 3, 2, 7) == 8  # the filter is the largest extent
    assert cf.fft_size(4, 5, 6, 8) == 16  # pad >= k: the output is larger
    assert cf.fft_size(8, 0, 6, 3) == 8
    assert cf.fft_size(9, 0, 7, 3) == 16
    with pytest.raises(ValueError, match=r"conv fft: a transform side of at least 65 "
                       r"\(image 64 \+ padding 1, output 64, filter 3\) is above "
                       r"the largest size 64"):  # fmt: skip
        cf.fft_size(64, 1, 64, 3)


def _circular_passes_1d(x, w, dy, pad, n):
    """The three passes in 1-D through length-n DFTs, as FftConv does them."""
    h, k, ho = len(x), len(w), len(dy)
    X, W, DY = (np.fft.fft(a, n) for a in (x, w, dy))
    y = np.fft.ifft(W.conj() * X).real[(np.arange(ho) - pad) % n]
    dx = np.fft.ifft(W * DY).real[(np.arange(h) + pad) % n]
    dw = np.fft.ifft(DY.conj() * X).real[(np.arange(k) - pad) % n]
    return y, dx, dw


def test_size_rule_exhaustively_in_1d():
    """n >= max(H + pad, Ho, k) gives every output of every pass without
    wrap-around (the padding of both sides shares the n - H zeros), for all
    H <= 9, pad <= 5, k <= H + 2 pad; where H + pad binds (pad > 0), one
    element less fails. (Where the output or filter binds, the extra outputs
    see only padding, but the kernels need the data planes to fit.)"""
    r = rng(7)
    binding = 0
    for h in range(1, 10):
        for pad in range(6):
            for k in range(1, h + 2 * pad + 1):
                ho = h + 2 * pad - k + 1
                x, w = r.standard_normal(h), r.standard_normal(k)
                dy = r.standard_normal(ho)
                xp = np.pad(x, pad)
                want = (
                    np.array([xp[i : i + k] @ w for i in range(ho)]),
                    np.array([sum(w[u] * dy[i + pad - u] for u in range(k)
                                  if 0 <= i + pad - u < ho) for i in range(h)]),
                    np.array([xp[u : u + ho] @ dy for u in range(k)]),
                )  # fmt: skip
                n = max(h + pad, ho, k)
                for got, ref in zip(_circular_passes_1d(x, w, dy, pad, n), want,
                                    strict=True):  # fmt: skip
                    np.testing.assert_allclose(got, ref, atol=1e-9, err_msg=str(
                        (h, pad, k, n)))  # fmt: skip
                if pad and n == h + pad:
                    # where H + pad binds, one less wraps a tap around
                    binding += 1
                    short = _circular_passes_1d(x, w, dy, pad, n - 1)
                    assert any(
                        not np.allclose(a, b, atol=1e-9)
                        for a, b in zip(short, want, strict=True)
                    ), (h, pad, k)
    assert binding > 200


@pytest.mark.parametrize("layer", ALEXNET, ids=[a[0] for a in ALEXNET])
def test_alexnet_plans(layer):
    name, c, f, hw, k, p = layer
    g = geom(128, c, f, (hw, hw), (k, k), (p, p))
    plan = cf.fft_plan("filter_acts", g, np.float32, "fp32")
    n = 32 if name == "conv2" else 16
    assert (plan.nh, plan.nw, plan.nc, plan.bins) == (n, n, n // 2 + 1,
                                                     n * (n // 2 + 1))  # fmt: skip
    per_image = plan.bins * (c + f) * 8
    assert plan.nb == 128 and 128 * per_image <= cf.FFT_CHUNK_MIB << 20
    for op in PASSES:
        assert cf.FftConv().applies(op, g, np.float32, "tf32")


def test_plan_fft_chunk():
    g = geom(129, 3, 5, (6, 7), (3, 3), (1, 1))
    bins = 8 * 5  # 8x8 transforms
    per_image = bins * (3 + 5) * 8
    assert cf.plan_fft_chunk(g, bins, 1 << 40) == 129  # one chunk, odd is fine
    # room for 64: three balanced chunks of 43, made even: 44 (within 1.25x)
    assert cf.plan_fft_chunk(g, bins, 64 * per_image) == 44
    # room for exactly 43: 44 would pass the budget by less than a quarter
    assert cf.plan_fft_chunk(g, bins, 43 * per_image) == 44
    # room for 3: 43 chunks of 3; 4 is 1.33x the budget, so down to 2
    assert cf.plan_fft_chunk(g, bins, 3 * per_image) == 2
    assert cf.plan_fft_chunk(g, bins, 1) == 1
    assert cf.plan_fft_chunk(g, bins, 2 * per_image) == 2
    conv2 = geom(128, 64, 192, (27, 27), (5, 5), (2, 2))
    nb = cf.plan_fft_chunk(conv2, 544, 32 << 20)
    assert nb % 2 == 0 and nb * 544 * 256 * 8 <= (32 << 20) * 5 // 4


def test_fft_plan_errors_and_applies():
    fft = cf.FftConv()
    good = geom(2, 4, 6, (9, 8), (3, 3), (1, 1), 2)
    for op in PASSES:
        assert fft.applies(op, good, np.float32, "fp32")
        assert fft.applies(op, good, np.float32, "tf32")
    cases = [
        (("filter_acts", good, np.float64, "fp64"), TypeError,
         "conv fft: float32 only, got float64"),
        (("filter_acts", good, np.float32, "fp16"), ValueError,
         "conv fft: precision must be 'fp32' or 'tf32', got 'fp16'"),
        (("filter_acts", geom(2, 4, 6, (9, 8), (3, 3), (1, 1), 1, (2, 1)),
          np.float32, "fp32"), ValueError,
         r"conv fft: stride must be \(1, 1\), got \(2, 1\)"),
        (("image_acts", geom(2, 3, 4, (64, 8), (3, 3), (1, 1)), np.float32,
          "fp32"), ValueError, "transform side of at least 65 .* is above"),
        (("weight_acts", geom(2, 3, 4, (8, 70), (3, 3), (0, 0)), np.float32,
          "fp32"), ValueError, "transform side of at least 70"),
        (("weight_acts", ConvGeometry(0, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 8, 8),
          np.float32, "fp32"), ValueError, "conv fft: batch must be >= 1, got 0"),
        (("conv", good, np.float32, "fp32"), ValueError,
         "conv fft: unknown pass 'conv'"),
        # 2048 x 2048 filters of 64x64 transforms: 66 GiB of filter spectra
        (("filter_acts", geom(1, 2048, 2048, (60, 60), (3, 3), (1, 1)),
          np.float32, "fp32"), ValueError,
         r"conv fft: \d+ MiB of filter spectra and one image's spectra "
         r"\(64x64 transforms\) exceed the 1024 MiB bound"),
    ]  # fmt: skip
    for args, exc, message in cases:
        with pytest.raises(exc, match=message):
            cf.fft_plan(*args)
        assert not fft.applies(*args), args
    # 63 + 1 fits 64: the largest side offered
    assert fft.applies("filter_acts", geom(1, 3, 4, (63, 63), (3, 3), (1, 1)),
                       np.float32, "fp32")  # fmt: skip
    with pytest.raises(ValueError, match="FilterActs does not accumulate"):
        fft.filter_acts(None, None, None, good, "fp32", 0, accumulate=True)
    with pytest.raises(ValueError, match="conv fft: kernel kind must be"):
        cf._consts("fft", 8, 8, 3, 3)
    with pytest.raises(ValueError, match=r"transform size \(12, 8\) not in"):
        cf._consts("r2c", 12, 8, 3, 3)
    with pytest.raises(ValueError, match=r"data planes \(9, 3\) must fit the 8x8"):
        cf._consts("r2c", 8, 8, 9, 3)


def test_blocks_and_names():
    assert [cf.fft_planes_per_block(n, n) for n in cf.FFT_SIZES] == [64, 32, 16, 4]
    assert [cf.fft_threads(n, n) for n in cf.FFT_SIZES] == [320, 288, 288, 160]
    for nh in cf.FFT_SIZES:
        for nw in cf.FFT_SIZES:
            t = cf.fft_planes_per_block(nh, nw)
            c = cf._consts("r2c", nh, nw, nh, nw)
            # one thread per pair of rows (S overlays the staged planes)
            assert t * ((nh + 1) // 2) <= c["threads"] <= 512
            assert cf._smem_bytes(c) <= 96 << 10
    c = cf._consts("c2r", 32, 32, 27, 27, sh=-2, sw=-2, accumulate=True)
    assert c["name"] == "fft_c2r_n32_d27_s30_acc" and (c["sh"], c["sw"]) == (30, 30)
    c = cf._consts("r2c", 16, 32, 5, 3, conj=True)
    assert c["name"] == "fft_r2c_n16x32_d5x3_conj"
    c = cf._consts("c2r", 8, 16, 3, 4, sh=1, sw=2)
    assert c["name"] == "fft_c2r_n8x16_d3x4_s1x2"


def test_variants_cover_every_size_and_kind():
    load_gpu_op_modules()
    variants = [c for f, c in all_variants() if f == "conv_fft"]
    kinds = {(c["kind"], n) for c in variants for n in (c["nh"], c["nw"])}
    assert kinds == {(k, n) for k in ("r2c", "c2r") for n in cf.FFT_SIZES}
    flags = {(c["kind"], c["conj"], c["accumulate"]) for c in variants}
    assert flags == {("r2c", False, False), ("r2c", True, False),
                     ("c2r", False, False), ("c2r", False, True)}  # fmt: skip
    assert any(c["nh"] != c["nw"] for c in variants)


def test_fft_is_a_candidate():
    g = geom(4, 8, 6, (9, 9), (3, 3), (1, 1), 2)
    for op in PASSES:
        names = gconv.algorithm_names(op, g, np.float32, "fp32")
        assert "fft" in names and names[0] == gconv.DEFAULT_ALGORITHM
        # after the im2col candidates
        assert names.index("fft") > max(
            i for i, n in enumerate(names) if n.startswith("im2col")
        )
        assert "fft" not in gconv.algorithm_names(op, g, np.float64)
        strided = geom(4, 8, 6, (9, 9), (3, 3), (1, 1), 2, (2, 2))
        assert "fft" not in gconv.algorithm_names(op, strided, np.float32, "fp32")
        specs = gconv.kernel_specs(op, g, np.float32, "tf32")
        fft_specs = [s for s in specs if s.family == "conv_fft"]
        assert fft_specs == cf.FftConv().kernel_specs(op, g, np.float32, "tf32")
        assert len(fft_specs) == (3 if op == "filter_acts" else 4)


def test_kernel_specs_of_a_pass():
    g = geom(2, 4, 6, (9, 8), (3, 2), (1, 0))
    names = {
        op: [s.consts["name"] for s in cf.FftConv().kernel_specs(op, g, F32, "fp32")]
        for op in PASSES
    }
    assert names == {
        "filter_acts": ["fft_r2c_n16x8_d3x2_conj", "fft_r2c_n16x8_d9x8",
                        "fft_c2r_n16x8_d9x7_s15x0"],
        "image_acts": ["fft_r2c_n16x8_d3x2", "fft_r2c_n16x8_d9x7",
                       "fft_c2r_n16x8_d9x8_s1x0", "fft_c2r_n16x8_d9x8_s1x0_acc"],
        "weight_acts": ["fft_r2c_n16x8_d9x8", "fft_r2c_n16x8_d9x7_conj",
                        "fft_c2r_n16x8_d3x2_s15x0", "fft_c2r_n16x8_d3x2_s15x0_acc"],
    }  # fmt: skip


# --------------------------------------------------------------------------
# the passes on a numpy backend (CPU)
# --------------------------------------------------------------------------


class NumpyFftBackend:
    """numpy stand-ins for what :class:`cc2ops.cuda.ops.conv.fft.FftConv` calls.

    GPUArrays become numpy arrays (complex buffers complex128, so that only
    the algorithm is checked, not rounding); the kernels are
    :func:`r2c_reference` / :func:`c2r_reference` and cuBLAS a numpy
    product. ``chunk`` forces the images per chunk.
    """

    def __init__(self, monkeypatch, chunk=None):
        from cc2ops.cuda.libs import cublas as blas
        from cc2ops.cuda.runtime import array

        mp = monkeypatch
        mp.setattr(array, "view", self.view)
        mp.setattr(gconv, "_conv_igemm", lambda: None)  # no device queries
        mp.setattr(array, "empty", self.empty)
        mp.setattr(array, "fill", self.fill)
        mp.setattr(array, "ascontiguous", lambda a, d=None: np.ascontiguousarray(a))
        mp.setattr(array, "is_c_contiguous", lambda a: a.flags.c_contiguous)
        mp.setattr(array, "copy", lambda a, d=None: np.array(a, order="C"))
        mp.setattr(blas, "gemm_strided_batched_complex", self.cgemm)
        mp.setattr(cf, "_r2c", self.r2c)
        mp.setattr(cf, "_c2r", self.c2r)
        if chunk is not None:
            mp.setattr(cf, "plan_fft_chunk",
                       lambda g, bins, budget: min(g.batch, chunk))  # fmt: skip
        self.calls = []

    @staticmethod
    def empty(shape, dtype, device):
        dt = np.complex128 if np.dtype(dtype).kind == "c" else np.dtype(dtype)
        return np.full(shape, np.nan, dt)

    @staticmethod
    def fill(a, value, device=None):
        a[...] = value
        return a

    @staticmethod
    def view(base, offset, shape, strides):
        assert base.flags.c_contiguous
        flat = base.reshape(-1)[offset:]
        item = base.dtype.itemsize
        last = sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        assert min(shape) == 0 or last < flat.size, (offset, shape, strides)
        return np.lib.stride_tricks.as_strided(
            flat, shape, tuple(s * item for s in strides)
        )

    def r2c(self, src, spec, q, n_fast, fast_step, slow_step, size, data, conj,
            device):  # fmt: skip
        self.calls.append(("r2c", size, data, conj))
        out = r2c_reference(src, q, n_fast, fast_step, slow_step, size, data, conj)
        assert spec.size >= out.size
        spec.reshape(-1)[: out.size] = out.reshape(-1)

    def c2r(self, spec, dst, q, n_fast, fast_step, slow_step, size, data, shift,
            accumulate, device):  # fmt: skip
        wrapped = (shift[0] % size[0], shift[1] % size[1])
        self.calls.append(("c2r", size, data, wrapped))
        bins = size[0] * (size[1] // 2 + 1)
        part = spec.reshape(-1)[: bins * q].reshape(bins, q)
        assert np.isfinite(part).all(), "c2r reads unwritten spectra"
        c2r_reference(part, dst, q, n_fast, fast_step, slow_step, size, data, shift,
                      accumulate)  # fmt: skip

    def cgemm(self, a, b, c, *, op_a="n", op_b="n", alpha=1.0, beta=0.0, device,
              precision=None):  # fmt: skip
        def op(x, o):
            if o == "n":
                return x
            return x.transpose(0, 2, 1) if o == "t" else x.conj().transpose(0, 2, 1)

        assert precision in ("fp32", "tf32")
        prod = np.matmul(op(a, op_a), op(b, op_b))
        assert prod.shape == c.shape, (prod.shape, c.shape)
        c[...] = alpha * prod + (beta * c if beta else 0)
        return c


def _run_pass(name, x, w, dy, hw, khw, pad, groups, precision, acc=None):
    params = dict(padding=pad, groups=groups, precision=precision, algorithm="fft")
    if name == "filter_acts":
        return gconv.filter_acts(x, w, **params)
    if name == "image_acts":
        return gconv.image_acts(dy, w, hw, **params, acc=acc)
    return gconv.weight_acts(x, dy, khw, **params, acc=acc)


@pytest.mark.parametrize("chunk", [None, 2, 3])
@pytest.mark.parametrize("case", SWEEP, ids=[f"sweep{i}" for i in range(len(SWEEP))])
def test_passes_on_a_numpy_backend(case, chunk, monkeypatch):
    backend = NumpyFftBackend(monkeypatch, chunk)
    b, c, f, hw, khw, pad, groups = case
    x, w, dy = _case(*case)
    refs = _references(x, w, dy, hw, khw, pad, groups)
    g = geom(b, c, f, hw, khw, pad, groups)
    plan = cf.fft_plan("filter_acts", g, F32, "fp32")
    for name in PASSES:
        backend.calls.clear()
        got = _run_pass(name, x, w, dy, hw, khw, pad, groups, "fp32")
        where = f"{case} chunk {chunk} {name}"
        assert got.shape == refs[name].shape and got.dtype == np.float32, where
        err = rel_err(got, refs[name])
        assert err < 1e-6, f"{where}: rel err {err:.3g}"
        sizes = {call[1] for call in backend.calls}
        assert sizes == {(plan.nh, plan.nw)}, where
        chunks = -(-b // (chunk or b))
        r2c = [call for call in backend.calls if call[0] == "r2c"]
        assert len(r2c) == (1 + chunks if name != "weight_acts" else 2 * chunks)
        assert len(backend.calls) - len(r2c) == (1 if name == "weight_acts" else chunks)
    # accumulate: written into acc, no extra pass
    r = rng(4)
    for name in ("image_acts", "weight_acts"):
        acc0 = r.standard_normal(refs[name].shape).astype(F32)
        acc = acc0.copy()
        out = _run_pass(name, x, w, dy, hw, khw, pad, groups, "tf32", acc=acc)
        assert out is acc
        err = rel_err(out, refs[name] + acc0)
        assert err < 1e-6, f"{case} chunk {chunk} {name} accumulate: {err:.3g}"


def test_conjugations_and_shifts_of_the_passes(monkeypatch):
    backend = NumpyFftBackend(monkeypatch)
    case = (2, 4, 6, (9, 8), (3, 2), (1, 0), 2)
    x, w, dy = _case(*case)
    for name in PASSES:
        backend.calls.clear()
        _run_pass(name, x, w, dy, (9, 8), (3, 2), (1, 0), 2, "fp32")
        assert backend.calls == {
            "filter_acts": [("r2c", (16, 8), (3, 2), True),
                            ("r2c", (16, 8), (9, 8), False),
                            ("c2r", (16, 8), (9, 7), (15, 0))],
            "image_acts": [("r2c", (16, 8), (3, 2), False),
                           ("r2c", (16, 8), (9, 7), False),
                           ("c2r", (16, 8), (9, 8), (1, 0))],
            "weight_acts": [("r2c", (16, 8), (9, 8), False),
                            ("r2c", (16, 8), (9, 7), True),
                            ("c2r", (16, 8), (3, 2), (15, 0))],
        }[name], name  # fmt: skip


def test_forced_fft_where_it_does_not_apply(monkeypatch):
    NumpyFftBackend(monkeypatch)
    x, w, dy = _case(2, 3, 4, (9, 9), (3, 3), (1, 1), 1)
    with pytest.raises(ValueError, match="algorithm 'fft' does not apply here"):
        gconv.filter_acts(x, w, stride=2, padding=1, algorithm="fft")
    with pytest.raises(ValueError, match="algorithm 'fft' does not apply here"):
        gconv.weight_acts(x.astype(F64), dy.astype(F64), (3, 3), padding=1,
                          algorithm="fft")  # fmt: skip


# --------------------------------------------------------------------------
# the kernels' stages on the CPU (host harness)
# --------------------------------------------------------------------------

# (kind, size, data, shift, conj, accumulate, q, n_fast, fast_step, slow_step):
# image-, filter- and gradient-like plane orders, partial last blocks
KERNEL_CASES = [
    ("r2c", (32, 32), (27, 27), (0, 0), False, False, 15, 3, 5, 1),
    ("r2c", (8, 8), (3, 2), (0, 0), True, False, 77, 11, 1, 11),
    ("r2c", (16, 64), (9, 50), (0, 0), False, False, 20, 4, 5, 1),
    ("r2c", (64, 64), (64, 63), (0, 0), True, False, 6, 2, 3, 1),
    ("r2c", (16, 16), (1, 1), (0, 0), False, False, 40, 8, 5, 1),
    ("c2r", (16, 16), (13, 13), (1, 1), False, True, 40, 8, 5, 1),
    ("c2r", (32, 32), (5, 5), (30, 30), False, False, 33, 3, 1, 3),
    ("c2r", (64, 8), (33, 3), (2, 5), False, False, 9, 3, 3, 1),
    ("c2r", (8, 32), (8, 32), (7, 0), False, True, 70, 7, 10, 1),
    ("c2r", (64, 64), (56, 56), (1, 1), False, False, 5, 5, 1, 5),
]

_HARNESS = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
struct Regs { float2 v[NW]; };
// argv: data path, output path, Q, n_fast, fast_step, slow_step, input
// floats, output floats; the data file holds the input then the output's
// initial values
int main(int argc, char** argv)
{
    const long long Q = atoll(argv[3]), n_fast = atoll(argv[4]);
    const long long fast_step = atoll(argv[5]), slow_step = atoll(argv[6]);
    const long long n_in = atoll(argv[7]), n_out = atoll(argv[8]);
    std::vector<float> in(n_in), out(n_out);
    FILE* f = fopen(argv[1], "rb");
    if (fread(in.data(), 4, n_in, f) != (size_t)n_in) return 2;
    if (fread(out.data(), 4, n_out, f) != (size_t)n_out) return 2;
    fclose(f);
    std::vector<float4> smem(SMEM / 16 + 1);
    for (long long q0 = 0; q0 < Q; q0 += PLANES) {
        // unwritten shared memory reads as NaN
        for (float4& s : smem) s = make_float4(NAN, NAN, NAN, NAN);
        index_t base[PLANES];
        for (int t = 0; t < PLANES; ++t)
            if (q0 + t < Q)
                base[t] = fft_plane_base(q0 + t, n_fast, fast_step, slow_step);
        std::vector<Regs> regs(ROW_ITEMS);
        BODY
    }
    f = fopen(argv[2], "wb");
    fwrite(out.data(), 4, n_out, f);
    fclose(f);
    return 0;
}
"""

_R2C_BODY = """
        float* xs = reinterpret_cast<float*>(smem.data());
        float2* S = reinterpret_cast<float2*>(smem.data());
        for (int i = 0; i < STAGE; ++i) r2c_stage(in.data(), xs, base, i, q0, Q);
        for (int it = 0; it < ROW_ITEMS; ++it) r2c_rows(xs, it, regs[it].v);
        for (int it = 0; it < ROW_ITEMS; ++it) r2c_rows_store(regs[it].v, S, it);
        for (int it = 0; it < COL_ITEMS; ++it)
            r2c_cols(S, reinterpret_cast<float2*>(out.data()), it, q0, Q);
"""

_C2R_BODY = """
        float2* S = reinterpret_cast<float2*>(smem.data());
        float* os = reinterpret_cast<float*>(smem.data());
        for (int it = 0; it < COL_ITEMS; ++it)
            c2r_cols(reinterpret_cast<const float2*>(in.data()), S, it, q0, Q);
        for (int it = 0; it < ROW_ITEMS; ++it) c2r_rows(S, it, regs[it].v);
        for (int it = 0; it < ROW_ITEMS; ++it) c2r_rows_store(regs[it].v, os, it);
        for (int i = 0; i < STAGE; ++i) c2r_unstage(os, out.data(), base, i, q0, Q);
"""


def _kernel_consts(case):
    kind, size, data, shift, conj, accumulate = case[:6]
    return cf._consts(kind, *size, *data, sh=shift[0], sw=shift[1], conj=conj,
                      accumulate=accumulate)  # fmt: skip


def _kernel_inputs(case, seed=0):
    """(input, initial output, expected output) of a kernel case, float32/complex64
    as the kernels see them."""
    kind, size, data, shift, conj, accumulate, q, n_fast, fs, ss = case
    r = rng(seed)
    planes = int(_plane_index(q, n_fast, fs, ss).max()) + 1
    bins = size[0] * (size[1] // 2 + 1)
    real = r.standard_normal((planes, *data)).astype(F32)
    spec = r.standard_normal((bins, q)) + 1j * r.standard_normal((bins, q))
    spec = spec.astype(np.complex64)
    if kind == "r2c":
        want = r2c_reference(real, q, n_fast, fs, ss, size, data, conj)
        return real, np.full((bins, q), np.nan, np.complex64), want
    init = r.standard_normal(real.shape).astype(F32) if accumulate else real * np.nan
    want = init.astype(F64)
    c2r_reference(spec.astype(np.complex128), want, q, n_fast, fs, ss, size, data,
                  shift, accumulate)  # fmt: skip
    return spec, init, want


def _check_kernel_output(case, got, want):
    where = f"{case[0]} {case[1:]}"
    assert got.shape == want.shape, where
    assert np.isfinite(got).all(), f"{where}: unwritten outputs"
    err = rel_err(got, want)
    assert err < 2e-6, f"{where}: rel err {err:.3g}"


@pytest.fixture(scope="module")
def nvcc():
    return needs_nvcc()


def test_kernel_stages_on_the_host(nvcc, tmp_path):
    """Each rendered kernel's __host__ __device__ stages, run block by block
    in the kernel's order (a stage's items all read before any writes where
    shared memory is overlaid), against the numpy kernel references."""
    from cc2ops.cuda.runtime.compile import render

    def build_and_run(i):
        case = KERNEL_CASES[i]
        c = _kernel_consts(case)
        t = c["planes"]
        rows = t * ((c["dh"] + 1) // 2)
        body = _R2C_BODY if c["kind"] == "r2c" else _C2R_BODY
        main = _HARNESS.replace("BODY", body)
        for key, value in (("NW", c["nw"]), ("SMEM", cf._smem_bytes(c)),
                           ("PLANES", t), ("ROW_ITEMS", rows),
                           ("COL_ITEMS", t * (c["nw"] // 2 + 1)),
                           ("STAGE", t * c["dh"] * c["dw"])):  # fmt: skip
            main = main.replace(key, str(value))
        d = tmp_path / f"case{i}"
        d.mkdir()
        (d / "harness.cu").write_text(render("conv_fft", **c) + main)
        build = subprocess.run(
            [nvcc, "-arch=sm_90", "-std=c++17", "-O1", "-o", str(d / "harness"),
             str(d / "harness.cu")], capture_output=True, text=True,
        )  # fmt: skip
        assert build.returncode == 0, build.stderr
        src, init, want = _kernel_inputs(case)
        with open(d / "data.bin", "wb") as fh:
            fh.write(src.tobytes() + init.tobytes())
        q, n_fast, fs, ss = case[6:]
        run = subprocess.run(
            [str(d / "harness"), str(d / "data.bin"), str(d / "out.bin"), str(q),
             str(n_fast), str(fs), str(ss), str(src.size * src.itemsize // 4),
             str(init.size * init.itemsize // 4)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        got = np.fromfile(d / "out.bin", dtype=init.dtype).reshape(init.shape)
        return case, got, want

    with ThreadPool(2) as pool:
        results = pool.map(build_and_run, range(len(KERNEL_CASES)))
    for case, got, want in results:
        _check_kernel_output(case, got, want)


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------


def _gpu(*arrays):
    from cc2ops.cuda.runtime import array

    return tuple(array.to_gpu(a, 0) for a in arrays)


def _check_passes(case, precisions, label, acc=False):
    """Every pass of ``case`` forced to ``fft`` against the float64 reference,
    on NaN-poisoned outputs (``CC2OPS_DEBUG=1``; the forward's ``out`` too)."""
    from cc2ops.cuda.runtime import array

    b, c, f, hw, khw, pad, groups = case
    x, w, dy = _case(*case)
    refs = _references(x, w, dy, hw, khw, pad, groups)
    gx, gw, gdy = _gpu(x, w, dy)
    g = geom(b, c, f, hw, khw, pad, groups)
    r = rng(5)
    for precision in precisions:
        for name in PASSES:
            assert "fft" in gconv.algorithm_names(name, g, F32, precision, device=0)
            where = f"{label} {name} {precision}"
            if name == "filter_acts":
                out = array.to_gpu(np.full(refs[name].shape, np.nan, F32), 0)
                got = gconv.filter_acts(gx, gw, padding=pad, groups=groups,
                                        precision=precision, algorithm="fft",
                                        out=out)  # fmt: skip
                assert got is out, where
            else:
                got = _run_pass(name, gx, gw, gdy, hw, khw, pad, groups, precision)
            got = array.to_host(got)
            assert got.shape == refs[name].shape and got.dtype == np.float32, where
            assert np.isfinite(got).all(), f"{where}: non-finite output"
            err = rel_err(got, refs[name])
            assert err < TOL[precision], f"{where}: rel err {err:.3g}"
            if acc and name != "filter_acts":
                acc0 = r.standard_normal(refs[name].shape).astype(F32)
                (gacc,) = _gpu(acc0)
                out = _run_pass(name, gx, gw, gdy, hw, khw, pad, groups, precision,
                                acc=gacc)  # fmt: skip
                assert out is gacc, f"{where}: accumulate not in place"
                err = rel_err(array.to_host(out), refs[name] + acc0)
                assert err < TOL[precision], f"{where} accumulate: rel err {err:.3g}"


@pytest.mark.gpu
def test_kernels_on_the_device():
    """The transforms against the numpy kernel references."""
    from cc2ops.cuda.runtime import array

    for case in KERNEL_CASES:
        kind, size, data, shift, conj, accumulate, q, n_fast, fs, ss = case
        src, init, want = _kernel_inputs(case)
        gsrc, gout = _gpu(src, init)
        if kind == "r2c":
            cf._r2c(gsrc, gout, q, n_fast, fs, ss, size, data, conj, 0)
        else:
            cf._c2r(gsrc, gout, q, n_fast, fs, ss, size, data, shift, accumulate, 0)
        _check_kernel_output(case, array.to_host(gout), want)


@pytest.mark.gpu
@pytest.mark.parametrize("case", SWEEP, ids=[f"sweep{i}" for i in range(len(SWEEP))])
def test_passes_on_the_device(case, debug):
    _check_passes(case, ("fp32", "tf32"), str(case), acc=True)


@pytest.mark.gpu
@pytest.mark.parametrize("layer", ALEXNET, ids=[a[0] for a in ALEXNET])
def test_alexnet_layers_on_the_device(layer, debug):
    name, c, f, hw, k, p = layer
    case = (16, c, f, (hw, hw), (k, k), (p, p), 1)
    _check_passes(case, ("fp32", "tf32"), name)


@pytest.mark.gpu
def test_uneven_chunks_on_the_device(debug, monkeypatch):
    # 7 images in chunks of 3, 3, 1: spectra buffers reused with fewer images,
    # the filter gradient accumulated over chunks (beta = 1)
    monkeypatch.setattr(cf, "plan_fft_chunk", lambda g, bins, budget: min(g.batch, 3))
    _check_passes((7, 6, 4, (11, 9), (5, 3), (2, 1), 2), ("fp32",), "chunks",
                  acc=True)  # fmt: skip


@pytest.mark.gpu
def test_fft_through_the_autotuner(tmp_path, monkeypatch):
    from cc2ops.cuda.runtime import array

    monkeypatch.setenv("CC2OPS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(at.AUTOTUNE_ENV, raising=False)
    monkeypatch.setattr(gconv, "_TUNER", None)
    case = (8, 16, 32, (12, 12), (3, 3), (1, 1), 1)
    x, w, dy = _case(*case)
    refs = _references(x, w, dy, (12, 12), (3, 3), (1, 1), 1)
    gx, gw, gdy = _gpu(x, w, dy)
    g = geom(8, 16, 32, (12, 12), (3, 3), (1, 1))
    for name in PASSES:
        got = _run_pass(name, gx, gw, gdy, (12, 12), (3, 3), (1, 1), 1, "fp32")
        # _run_pass forces fft; the autotuned call passes no algorithm
        fn = getattr(gconv, name)
        args = {"filter_acts": (gx, gw), "image_acts": (gdy, gw, (12, 12)),
                "weight_acts": (gx, gdy, (3, 3))}[name]  # fmt: skip
        tuned = fn(*args, padding=1, precision="fp32")
        for out in (got, tuned):
            assert rel_err(array.to_host(out), refs[name]) < 1e-5, name
        names = gconv.algorithm_names(name, g, F32, "fp32", device=0)
        assert "fft" in names
        key = gconv._tune_key(name, g, F32, "fp32", 0, names)
        record = gconv._tuner().records[at.key_string(key)]
        assert "fft" in record["times_ms"], record
        assert "fft" not in record.get("rejected", {}), record
    doc = json.loads(next(tmp_path.glob("autotune-*.json")).read_text())
    assert len(doc["entries"]) == 3


@pytest.mark.gpu
def test_conv_fft_sanitize(monkeypatch):
    """Small shapes of every kernel kind (r2c plain and conj, c2r plain and
    accumulating; 8, 16, 32 and 64 point sides, rectangular, groups, uneven
    chunks) for compute-sanitizer memcheck / racecheck."""
    monkeypatch.setenv(at.AUTOTUNE_ENV, "0")
    monkeypatch.setattr(cf, "plan_fft_chunk", lambda g, bins, budget: min(g.batch, 2))
    for case in (
        (3, 2, 3, (5, 6), (3, 3), (3, 2), 1),  # 8x8
        (3, 4, 6, (9, 8), (3, 2), (1, 0), 2),  # 16x8
        (1, 3, 2, (27, 20), (5, 5), (2, 2), 1),  # 32x32
        (1, 2, 2, (50, 9), (3, 3), (1, 1), 1),  # 64x16
    ):
        _check_passes(case, ("fp32",), f"sanitize {case}", acc=True)
