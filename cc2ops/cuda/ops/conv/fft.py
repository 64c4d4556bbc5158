"""FFT convolution: the ``fft`` candidate of the passes of :mod:`.ops`.

Stride-1 float32 convolutions (any padding, filter size, groups, rectangular
images) as products of 2-D spectra: the planes are zero-padded to an
``nh x nw`` grid, transformed with real-to-complex FFTs of
``kernels/conv_fft.cu`` (no cuFFT), multiplied bin by bin with one complex
GEMM per bin (``blas.gemm_strided_batched_complex``, batched over the bins
and groups), and transformed back with the crop, the ``1/(nh*nw)``
normalisation and the optional accumulation folded into the inverse.

Sizes
-----
``nh`` is the smallest of :data:`FFT_SIZES` with ``nh >= max(H + pad_h, Ho,
kh)`` (likewise ``nw``), which is all that a circular correlation needs to
give every output without wrap-around: with the planes at the top left of
the grid, the taps that fall on the padding on either side of an image all
land in its ``nh - H >= pad_h`` rows of zeros (both sides of the padding
may share them). The half spectrum has ``bins = nh * (nw/2 + 1)`` bins.
Larger transforms (any side above 64) are not offered.

Spectra and products
--------------------
Spectra are complex64 and bin-major: images (n, c) give ``X`` of shape
(bins, C, nb), output gradients ``DY`` (bins, F, nb) and filters ``W``
(bins, F, C/groups); per bin and group (``G`` groups, ``Fg = F/G``,
``Cg = C/G``) the passes are::

    forward   Y_b  (Fg x nb) = conj(W_b) (Fg x Cg)  X_b  (Cg x nb)
    images    DX_b (Cg x nb) = W_b^T               DY_b (Fg x nb)
    filters   DW_b (Fg x Cg) = sum_n conj(DY_b) (Fg x nb) X_b^T (nb x Cg)

The conjugates are taken by the forward transform (its ``conj`` flag), so
the GEMMs use plain and transposed operands only: the product of a
conjugated spectrum is a correlation (the forward pass and the filter
gradient), the plain product a convolution (the image gradient). The
inverse reads the output (i, j) at transform element ``((i + s_h) mod nh,
(j + s_w) mod nw)``, with ``s = -pad`` for the correlations and ``s = +pad``
for the convolution.

Chunks and workspace
--------------------
The batch is cut into chunks whose spectra (``bins * (C + F) * 8`` bytes
per image) fit in :data:`FFT_CHUNK_MIB` (at least one image; balanced, and
even when the batch takes several chunks, so that the GEMM rows are 16-byte
aligned). The filter spectra (``bins * F * C/groups * 8`` bytes) are not
chunked. The filter gradient accumulates its spectrum over the chunks
(GEMM ``beta = 1``) and transforms it back once. The candidate does not
apply when the filter spectra plus one image's spectra exceed
:data:`FFT_WORKSPACE_MIB`.

Precision: the transforms are float32; the GEMMs are true fp32
(``CUBLAS_COMPUTE_32F``) or TF32 (``CUBLAS_COMPUTE_32F_FAST_TF32``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cc2ops.cuda.libs import cublas as blas
from cc2ops.cuda.ops.conv.geometry import ConvGeometry
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.compile import (
    KernelSpec,
    get_kernel,
    launch,
    register_namer,
    register_variants,
)

__all__ = [
    "FFT_SIZES",
    "FFT_CHUNK_MIB",
    "FFT_WORKSPACE_MIB",
    "FftPlan",
    "FftConv",
    "fft_size",
    "fft_plan",
    "plan_fft_chunk",
    "fft_planes_per_block",
    "fft_threads",
    "fft_kernel_name",
]

#: Transform sides the kernels are generated for (powers of two).
FFT_SIZES = (8, 16, 32, 64)
#: Budget (MiB) of the image and output spectra of one chunk of the batch.
FFT_CHUNK_MIB = 256
#: The candidate applies only where the filter spectra plus one image's
#: spectra fit in this many MiB.
FFT_WORKSPACE_MIB = 1024
#: Shared memory (bytes) a block of the transform kernels may use.
_SMEM_BUDGET = 96 << 10
#: Block size limits: 512 threads (128 registers each), 256 when a side is 64
#: (its unrolled 64-point FFTs need about 170 registers).
_MAX_THREADS = 512
_MAX_THREADS_64 = 256
_INT32 = 2**31 - 1
_COMPLEX = np.dtype(np.complex64)


# --------------------------------------------------------------------------
# sizes and plans (pure)
# --------------------------------------------------------------------------


def fft_size(extent: int, pad: int, out: int, k: int) -> int:
    """The transform side for one dimension: the smallest of :data:`FFT_SIZES`
    that is at least ``max(extent + pad, out, k)``.

    Parameters
    ----------
    extent, pad, out, k : int
        Image extent, padding (each side), output extent and filter extent
        along the dimension.

    Raises
    ------
    ValueError
        If that is above 64.
    """
    need = max(extent + pad, out, k)
    for n in FFT_SIZES:
        if n >= need:
            return n
    raise ValueError(
        f"conv fft: a transform side of at least {need} (image {extent} + padding "
        f"{pad}, output {out}, filter {k}) is above the largest size {FFT_SIZES[-1]}"
    )


@dataclass(frozen=True)
class FftPlan:
    """Transform size (nh, nw) and images per chunk of one FFT convolution."""

    nh: int
    nw: int
    nb: int

    @property
    def nc(self) -> int:
        """Complex columns of the half spectrum."""
        return self.nw // 2 + 1

    @property
    def bins(self) -> int:
        return self.nh * self.nc


def plan_fft_chunk(g: ConvGeometry, bins: int, budget_bytes: int) -> int:
    """Images per chunk: the most whose image and output spectra
    (``bins * (C + F) * 8`` bytes each) fit in ``budget_bytes`` (at least
    one), balanced so the chunks have nearly equal sizes, then made even when
    the batch takes more than one chunk (the chunk is the row length of the
    GEMM operands: even counts give 16-byte rows); up by one image when that
    stays within 1.25 times the budget, else down.
    """
    if g.batch <= 0:
        return 1
    per_image = bins * (g.channels + g.filters) * _COMPLEX.itemsize
    nb = min(g.batch, max(1, int(budget_bytes) // per_image))
    chunks = -(-g.batch // nb)
    nb = -(-g.batch // chunks)
    if nb < g.batch and nb % 2:
        if (nb + 1) * per_image * 4 <= int(budget_bytes) * 5:
            nb += 1
        elif nb > 1:
            nb -= 1
    return nb


def fft_plan(
    op: str,
    g: ConvGeometry,
    dtype: Any,
    precision: str,
    budget_bytes: int = FFT_CHUNK_MIB << 20,
) -> FftPlan:
    """The plan of ``op`` on ``g``, or an error saying why FFT does not apply.

    Parameters
    ----------
    op : {"filter_acts", "image_acts", "weight_acts"}
    g : ConvGeometry
        Images (B, C, H, W), filters (F, C/groups, kh, kw).
    dtype : numpy dtype-like
        Must be float32.
    precision : {"fp32", "tf32"}
    budget_bytes : int
        Budget of one chunk's spectra (:func:`plan_fft_chunk`).

    Raises
    ------
    TypeError
        A dtype other than float32.
    ValueError
        A stride other than 1, an unknown op or precision, an empty batch, a
        transform side above 64, or a workspace above
        :data:`FFT_WORKSPACE_MIB`.
    """
    if op not in ("filter_acts", "image_acts", "weight_acts"):
        raise ValueError(f"conv fft: unknown pass {op!r}")
    if np.dtype(dtype) != np.float32:
        raise TypeError(f"conv fft: float32 only, got {np.dtype(dtype)}")
    if precision not in ("fp32", "tf32"):
        raise ValueError(
            f"conv fft: precision must be 'fp32' or 'tf32', got {precision!r}"
        )
    if (g.stride_h, g.stride_w) != (1, 1):
        raise ValueError(
            f"conv fft: stride must be (1, 1), got {(g.stride_h, g.stride_w)}"
        )
    if g.batch < 1:
        raise ValueError(f"conv fft: batch must be >= 1, got {g.batch}")
    nh = fft_size(g.height, g.pad_h, g.out_h, g.kh)
    nw = fft_size(g.width, g.pad_w, g.out_w, g.kw)
    bins = nh * (nw // 2 + 1)
    cg = g.channels // g.groups
    item = _COMPLEX.itemsize
    fixed = bins * g.filters * cg * item
    one = bins * (g.channels + g.filters) * item
    if fixed + one > FFT_WORKSPACE_MIB << 20:
        raise ValueError(
            f"conv fft: {(fixed + one) / 2**20:.0f} MiB of filter spectra and one "
            f"image's spectra ({nh}x{nw} transforms) exceed the "
            f"{FFT_WORKSPACE_MIB} MiB bound"
        )
    return FftPlan(nh, nw, plan_fft_chunk(g, bins, budget_bytes))


# --------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------


def fft_planes_per_block(nh: int, nw: int) -> int:
    """Planes a block of the ``nh x nw`` transforms handles (``planes``): the
    largest power of two up to 64 with one thread per pair of rows (at most
    256 pairs) and at most 96 KiB of shared memory."""
    nc = nw // 2 + 1
    t = 64
    while t > 1 and (
        t * ((nh + 1) // 2) > 256
        or max(nh * nc * t * 8, nh * nw * (t + 1) * 4) > _SMEM_BUDGET
    ):
        t //= 2
    return t


def fft_threads(nh: int, nw: int) -> int:
    """Block size of the ``nh x nw`` transforms: one thread per column item
    (``planes * (nw/2 + 1)``) and per row pair, rounded to warps, at most 512
    (256 when a side is 64, so that the FFTs stay in registers)."""
    t = fft_planes_per_block(nh, nw)
    items = max(t * ((nh + 1) // 2), t * (nw // 2 + 1))
    cap = _MAX_THREADS_64 if max(nh, nw) >= 64 else _MAX_THREADS
    return min(cap, -(-items // 32) * 32)


def _pair(prefix: str, a: int, b: int) -> str:
    return f"{prefix}{a}" if a == b else f"{prefix}{a}x{b}"


@register_namer("conv_fft")
def fft_kernel_name(
    kind: str, nh: int, nw: int, dh: int, dw: int, sh: int, sw: int, conj: bool,
    accumulate: bool, **_: Any,
) -> str:  # fmt: skip
    """``fft_r2c_n32_d27_conj`` / ``fft_c2r_n32_d27_s30_acc``-style names:
    kind, transform size, data extent, the inverse's shift, then the flags."""
    name = f"fft_{kind}_{_pair('n', nh, nw)}_{_pair('d', dh, dw)}"
    if kind == "c2r":
        name += "_" + _pair("s", sh, sw)
    if conj:
        name += "_conj"
    if accumulate:
        name += "_acc"
    return name


def _consts(
    kind: str,
    nh: int,
    nw: int,
    dh: int,
    dw: int,
    *,
    sh: int = 0,
    sw: int = 0,
    conj: bool = False,
    accumulate: bool = False,
) -> dict[str, Any]:
    if kind not in ("r2c", "c2r"):
        raise ValueError(f"conv fft: kernel kind must be 'r2c' or 'c2r', got {kind!r}")
    if nh not in FFT_SIZES or nw not in FFT_SIZES:
        raise ValueError(f"conv fft: transform size {(nh, nw)} not in {FFT_SIZES}")
    if not (1 <= dh <= nh and 1 <= dw <= nw):
        raise ValueError(
            f"conv fft: data planes {(dh, dw)} must fit the {nh}x{nw} transform"
        )
    c: dict[str, Any] = dict(
        kind=kind, nh=int(nh), nw=int(nw), dh=int(dh), dw=int(dw),
        sh=int(sh) % nh, sw=int(sw) % nw, conj=bool(conj),
        accumulate=bool(accumulate), planes=fft_planes_per_block(nh, nw),
        threads=fft_threads(nh, nw),
    )  # fmt: skip
    c["name"] = fft_kernel_name(**c)
    return c


def _smem_bytes(c: dict[str, Any]) -> int:
    """Dynamic shared memory of a kernel: the staged real planes or the
    half spectra of its dh rows, whichever is larger (they overlay)."""
    t, dh, dw = c["planes"], c["dh"], c["dw"]
    return max(dh * dw * (t + 1) * 4, dh * (c["nw"] // 2 + 1) * t * 8)


@register_variants("conv_fft")
def _fft_variants() -> list[dict[str, Any]]:
    # every size and kind, the flags spread over them, data extents odd and full
    return [
        _consts("r2c", 8, 8, 7, 5, conj=True),
        _consts("c2r", 8, 8, 3, 3, sh=7, sw=7),
        _consts("r2c", 16, 16, 13, 13),
        _consts("c2r", 16, 16, 13, 13, sh=1, sw=1, accumulate=True),
        _consts("r2c", 32, 32, 27, 27),
        _consts("r2c", 32, 32, 5, 5, conj=True),
        _consts("c2r", 32, 32, 27, 27, sh=30, sw=30),
        _consts("c2r", 32, 32, 5, 5, sh=30, sw=30, accumulate=True),
        _consts("r2c", 64, 64, 64, 64, conj=True),
        _consts("c2r", 64, 64, 56, 56, sh=1, sw=1, accumulate=True),
        _consts("r2c", 16, 64, 9, 50),
        _consts("c2r", 64, 8, 33, 3, sh=2, sw=5),
    ]


def _launch(c: dict[str, Any], q: int, args: list[Any], device: int) -> None:
    fn = get_kernel("conv_fft", device, **c)
    grid = -(-q // c["planes"])
    launch(fn, grid, c["threads"], args, device, shared_mem=_smem_bytes(c))


def _check_planes(q: int) -> None:
    if not 0 <= q <= _INT32:
        raise ValueError(f"conv fft: {q} planes, above the 2^31 limit of the kernels")


def _r2c(
    src: Any, spec: Any, q: int, n_fast: int, fast_step: int, slow_step: int,
    size: tuple[int, int], data: tuple[int, int], conj: bool, device: int,
) -> None:  # fmt: skip
    """Spectra of ``q`` planes of ``src`` into the bin-major ``spec``.

    Plane ``i`` (slow ``i // n_fast``, fast ``i % n_fast``) is the ``data``
    (h, w) block of ``src`` starting at element ``(fast*fast_step +
    slow*slow_step)*h*w``; its bin ``b`` goes to ``spec[b*q + i]`` (conjugated
    with ``conj``).
    """
    if q <= 0:
        return
    _check_planes(q)
    c = _consts("r2c", *size, *data, conj=conj)
    args = [src, spec, np.int64(q), np.int64(n_fast), np.int64(fast_step),
            np.int64(slow_step)]  # fmt: skip
    _launch(c, q, args, device)


def _c2r(
    spec: Any, dst: Any, q: int, n_fast: int, fast_step: int, slow_step: int,
    size: tuple[int, int], data: tuple[int, int], shift: tuple[int, int],
    accumulate: bool, device: int,
) -> None:  # fmt: skip
    """The inverse of :func:`_r2c`: plane ``i`` of ``dst`` (same indexing)
    gets the (h, w) = ``data`` crop of the inverse transform of
    ``spec[:, i]``, element (r, c) from ``((r + shift[0]) mod nh, (c +
    shift[1]) mod nw)``, written or (``accumulate``) added."""
    if q <= 0:
        return
    _check_planes(q)
    c = _consts("c2r", *size, *data, sh=shift[0], sw=shift[1], accumulate=accumulate)
    args = [spec, dst, np.int64(q), np.int64(n_fast), np.int64(fast_step),
            np.int64(slow_step)]  # fmt: skip
    _launch(c, q, args, device)


def _cgemm(
    a: Any, b: Any, c: Any, *, op_a: str = "n", op_b: str = "n", beta: float = 0.0,
    precision: str, device: int,
) -> None:  # fmt: skip
    blas.gemm_strided_batched_complex(
        a, b, c, op_a=op_a, op_b=op_b, beta=beta, device=device,
        precision="tf32" if precision == "tf32" else "fp32",
    )  # fmt: skip


def _flat(base: Any, offset: int, shape: tuple[int, ...]) -> Any:
    return array.flat_view(base, offset, shape)


# --------------------------------------------------------------------------
# the algorithm
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class FftConv:
    """FFT convolution (see the module docstring): the ``fft`` candidate.

    Applies to float32 with stride 1 in both directions, any padding, filter
    size, groups (batched with the bins) and batch >= 1, precision ``"fp32"``
    or ``"tf32"``, where every transform side is at most 64 and the
    workspace bound holds; :meth:`applies` returns ``False`` elsewhere.
    """

    budget_mib: int = FFT_CHUNK_MIB

    @property
    def name(self) -> str:
        return "fft"

    def _plan(self, op: str, g: ConvGeometry, dtype: Any, precision: str) -> FftPlan:
        return fft_plan(op, g, dtype, precision, self.budget_mib << 20)

    def applies(self, op: str, g: ConvGeometry, dtype: Any, precision: str) -> bool:
        try:
            self._plan(op, g, dtype, precision)
        except (TypeError, ValueError):
            return False
        return True

    def kernel_specs(
        self, op: str, g: ConvGeometry, dtype: Any, precision: str
    ) -> list[KernelSpec]:
        """The transforms ``op`` launches on ``g`` (the inverse of the
        gradients both plain and accumulating)."""
        p = self._plan(op, g, dtype, precision)
        size = (p.nh, p.nw)
        image, out, filt = (g.height, g.width), (g.out_h, g.out_w), (g.kh, g.kw)
        minus, plus = (-g.pad_h, -g.pad_w), (g.pad_h, g.pad_w)
        if op == "filter_acts":
            consts = [
                _consts("r2c", *size, *filt, conj=True),
                _consts("r2c", *size, *image),
                _consts("c2r", *size, *out, sh=minus[0], sw=minus[1]),
            ]
        elif op == "image_acts":
            consts = [_consts("r2c", *size, *filt), _consts("r2c", *size, *out)]
            consts += [
                _consts("c2r", *size, *image, sh=plus[0], sw=plus[1], accumulate=a)
                for a in (False, True)
            ]
        else:
            consts = [
                _consts("r2c", *size, *image),
                _consts("r2c", *size, *out, conj=True),
            ]
            consts += [
                _consts("c2r", *size, *filt, sh=minus[0], sw=minus[1], accumulate=a)
                for a in (False, True)
            ]
        return [KernelSpec("conv_fft", c) for c in consts]

    # ---- forward -------------------------------------------------------
    def filter_acts(
        self, x: Any, w: Any, out: Any, g: ConvGeometry, precision: str,
        device: int, accumulate: bool = False,
    ) -> None:  # fmt: skip
        """``out`` (B, F, Ho, Wo) = conv(x (B, C, H, W), w (F, C/groups, kh, kw))."""
        if accumulate:
            raise ValueError("conv fft: FilterActs does not accumulate")
        p = self._plan("filter_acts", g, x.dtype, precision)
        size, bins, G = (p.nh, p.nw), p.bins, g.groups
        B, C, F = g.batch, g.channels, g.filters
        Cg, Fg = C // G, F // G
        wspec = array.empty((bins * F * Cg,), _COMPLEX, device)
        _r2c(w, wspec, F * Cg, Cg, 1, Cg, size, (g.kh, g.kw), True, device)
        xspec = array.empty((bins * C * p.nb,), _COMPLEX, device)
        yspec = array.empty((bins * F * p.nb,), _COMPLEX, device)
        HW, P = g.height * g.width, g.out_h * g.out_w
        shift = (-g.pad_h, -g.pad_w)
        for b0 in range(0, B, p.nb):
            n = min(p.nb, B - b0)
            xs = _flat(x, b0 * C * HW, (n * C * HW,))
            _r2c(xs, xspec, C * n, n, C, 1, size, (g.height, g.width), False, device)
            _cgemm(
                _flat(wspec, 0, (bins * G, Fg, Cg)),
                _flat(xspec, 0, (bins * G, Cg, n)),
                _flat(yspec, 0, (bins * G, Fg, n)),
                precision=precision, device=device,
            )  # fmt: skip
            ys = _flat(out, b0 * F * P, (n * F * P,))
            _c2r(yspec, ys, F * n, n, F, 1, size, (g.out_h, g.out_w), shift, False,
                 device)  # fmt: skip

    # ---- gradient wrt the images ----------------------------------------
    def image_acts(
        self, dy: Any, w: Any, out: Any, g: ConvGeometry, precision: str,
        device: int, accumulate: bool = False,
    ) -> None:  # fmt: skip
        """``out`` (B, C, H, W) (``+=`` with ``accumulate``) = the gradient wrt
        the images of dy (B, F, Ho, Wo) through w (F, C/groups, kh, kw)."""
        p = self._plan("image_acts", g, dy.dtype, precision)
        size, bins, G = (p.nh, p.nw), p.bins, g.groups
        B, C, F = g.batch, g.channels, g.filters
        Cg, Fg = C // G, F // G
        wspec = array.empty((bins * F * Cg,), _COMPLEX, device)
        _r2c(w, wspec, F * Cg, Cg, 1, Cg, size, (g.kh, g.kw), False, device)
        dyspec = array.empty((bins * F * p.nb,), _COMPLEX, device)
        dxspec = array.empty((bins * C * p.nb,), _COMPLEX, device)
        HW, P = g.height * g.width, g.out_h * g.out_w
        shift = (g.pad_h, g.pad_w)
        for b0 in range(0, B, p.nb):
            n = min(p.nb, B - b0)
            dys = _flat(dy, b0 * F * P, (n * F * P,))
            _r2c(dys, dyspec, F * n, n, F, 1, size, (g.out_h, g.out_w), False, device)
            _cgemm(
                _flat(wspec, 0, (bins * G, Fg, Cg)),
                _flat(dyspec, 0, (bins * G, Fg, n)),
                _flat(dxspec, 0, (bins * G, Cg, n)),
                op_a="t", precision=precision, device=device,
            )  # fmt: skip
            dxs = _flat(out, b0 * C * HW, (n * C * HW,))
            _c2r(dxspec, dxs, C * n, n, C, 1, size, (g.height, g.width), shift,
                 accumulate, device)  # fmt: skip

    # ---- gradient wrt the filters ---------------------------------------
    def weight_acts(
        self, x: Any, dy: Any, out: Any, g: ConvGeometry, precision: str,
        device: int, accumulate: bool = False,
    ) -> None:  # fmt: skip
        """``out`` (F, C/groups, kh, kw) (``+=`` with ``accumulate``) = the
        gradient wrt the filters of x (B, C, H, W) and dy (B, F, Ho, Wo)."""
        p = self._plan("weight_acts", g, x.dtype, precision)
        size, bins, G = (p.nh, p.nw), p.bins, g.groups
        B, C, F = g.batch, g.channels, g.filters
        Cg, Fg = C // G, F // G
        xspec = array.empty((bins * C * p.nb,), _COMPLEX, device)
        dyspec = array.empty((bins * F * p.nb,), _COMPLEX, device)
        dwspec = array.empty((bins * F * Cg,), _COMPLEX, device)
        HW, P = g.height * g.width, g.out_h * g.out_w
        for b0 in range(0, B, p.nb):
            n = min(p.nb, B - b0)
            xs = _flat(x, b0 * C * HW, (n * C * HW,))
            _r2c(xs, xspec, C * n, n, C, 1, size, (g.height, g.width), False, device)
            dys = _flat(dy, b0 * F * P, (n * F * P,))
            _r2c(dys, dyspec, F * n, n, F, 1, size, (g.out_h, g.out_w), True, device)
            _cgemm(
                _flat(dyspec, 0, (bins * G, Fg, n)),
                _flat(xspec, 0, (bins * G, Cg, n)),
                _flat(dwspec, 0, (bins * G, Fg, Cg)),
                op_b="t", beta=1.0 if b0 > 0 else 0.0, precision=precision,
                device=device,
            )  # fmt: skip
        _c2r(dwspec, out, F * Cg, Cg, 1, Cg, size, (g.kh, g.kw),
             (-g.pad_h, -g.pad_w), accumulate, device)  # fmt: skip
