"""GPU convolution: ``GpuFilterActs``, ``GpuImageActs``, ``GpuWeightActs``.

The GPU ops of :mod:`cc2ops.conv` on bc01 GPU arrays of float32 or float64:
images x (B, C, H, W), filters w (F, C/groups, kh, kw), output / output
gradient (B, F, Ho, Wo), the shape rules of :mod:`cc2ops.shapes`. They have
the host ops' ``__props__`` (``stride``, ``padding``, ``groups``) plus
``precision`` (``None`` follows :func:`cc2ops.cuda.get_allow_tf32` when the
op runs, ``"fp32"`` / ``"tf32"`` fix it) and, for the two gradients,
``accumulate``: ``GpuWeightActs(accumulate=True)(x, dy, filter_hw, acc)``
returns ``acc + dw`` in ``acc``'s buffer (cuda-convnet2's ``scaleTargets``;
GEMM ``beta = 1``, no extra pass). Pullbacks build the other GPU ops, so
gradients of every order stay in the family; ``@register_lift`` rules move
the host ops here in ``cc2ops.cuda.mode()``, and the rewrite
:data:`gpu_conv_accumulate` (database ``cc2ops_gpu_inplace``) turns
``GpuElemwise{add}(acc, GpuWeightActs(x, dy))`` into the accumulating op.

Algorithms
----------
Each pass has candidate algorithms; the :class:`~cc2ops.cuda.runtime.autotune.Autotuner`
times the applicable ones on the first use of a geometry and keeps the
fastest whose output agrees with the default's (``CC2OPS_AUTOTUNE=0``: always
the default, no timing).

``im2col_knp_<N>m`` (the default is ``im2col_knp_32m``)
    A generated im2col kernel (``kernels/conv_im2col.cu``, specialised on
    filter size, stride, padding and dtype: ``im2col_k5x5_s1_p2_f32``) writes
    a chunk of images as one (C*kh*kw, nb*Ho*Wo) column matrix of at most N
    MiB (so it stays in the 50 MB L2 of an H200 while the GEMM reads it),
    and cuBLAS multiplies it per group (``gemm_strided_batched`` over the
    groups). FilterActs: ``w @ cols`` into (F, nb, Ho*Wo), then a layout swap
    into (nb, F, Ho, Wo). ImageActs: the swapped gradient times ``w^T`` into
    columns, then the gather-form col2im (each input pixel sums its taps, no
    atomics). WeightActs: the swapped gradient times ``cols^T``,
    accumulating over chunks with ``beta = 1``. Deterministic.
``im2col_nkp_32m``
    FilterActs and ImageActs only: per-image column matrices and GEMMs
    batched over the images of a chunk (``gemm_strided_batched`` with the
    filters broadcast), no layout swaps; for 1x1 filters with stride 1 and
    no padding the images themselves are the columns (no im2col at all).
``fft``
    :class:`~cc2ops.cuda.ops.conv.fft.FftConv`: float32, stride 1, transform
    sides up to 64. Real-to-complex FFTs of the planes
    (``kernels/conv_fft.cu``, generated per size) into bin-major complex64
    spectra, one complex GEMM per bin and group (``CUBLAS_COMPUTE_32F`` or
    TF32), and the inverse transform with the crop, normalisation and
    accumulation folded in; chunks of the batch within a spectra budget.
``igemm_<tile>``
    The tensor-core implicit-GEMM kernels of :mod:`cc2ops.cuda.ops.conv.igemm`
    (float32; TF32 or fp32-accurate 3xTF32), when that module imports and
    says it supports the geometry.

:func:`filter_acts`, :func:`image_acts` and :func:`weight_acts` run a pass on
GPUArrays (``perform`` calls them; benchmarks time them directly);
``algorithm=`` forces one candidate.

Precision: float32 products are IEEE fp32 unless TF32 is allowed (the
switch shared with cuBLAS) or ``precision="tf32"``; float64 uses DGEMM.
"""

from __future__ import annotations

import dataclasses
import hashlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor.scalar as ps
from pytensor.graph.basic import Apply, Variable
from pytensor.graph.rewriting.basic import copy_stack_trace, in2out, node_rewriter

from cc2ops._op import FLOAT_DTYPES, same_dtype
from cc2ops.conv import (
    ConvFamily,
    ConvSkeleton,
    FilterActs,
    FilterActsSkeleton,
    ImageActs,
    ImageActsSkeleton,
    WeightActs,
    WeightActsSkeleton,
)
from cc2ops.cuda.op import GpuOp, common_device, gpu_float_variable
from cc2ops.cuda.ops.conv import igemm as conv_igemm
from cc2ops.cuda.ops.conv.fft import FftConv
from cc2ops.cuda.ops.conv.geometry import (
    INT32_MAX,
    ConvGeometry,
    geometry_of,
    plan_chunk,
)
from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.compile import (
    KernelSpec,
    register_namer,
    register_variants,
    render,
)
from cc2ops.cuda.runtime.device import get_device
from cc2ops.cuda.transfer import GpuGradients
from cc2ops.cuda.type import CudaArrayType
from cc2ops.rewriting.db import gpu_inplace_db
from cc2ops.shapes import (
    check_conv_batch,
    check_conv_filter_count,
    check_conv_gradient_hw,
    conv_params,
    hw_value,
    merge_static_shapes,
)

__all__ = [
    "ConvGeometry",
    "geometry_of",
    "plan_chunk",
    "DEFAULT_ALGORITHM",
    "CHUNK_BUDGETS_MIB",
    "algorithm_names",
    "kernel_specs",
    "chosen_algorithm",
    "resolve_precision",
    "filter_acts",
    "image_acts",
    "weight_acts",
    "GpuFilterActs",
    "GpuImageActs",
    "GpuWeightActs",
    "im2col_kernel_name",
    "gpu_conv_accumulate",
    "local_gpu_conv_accumulate",
    "GPU_FAMILY",
]


_OPS = ("filter_acts", "image_acts", "weight_acts")
_OP_CLASS = {
    "filter_acts": "GpuFilterActs",
    "image_acts": "GpuImageActs",
    "weight_acts": "GpuWeightActs",
}
_DT = {"float32": "f32", "float64": "f64"}
_BLOCK = 256
#: Column-buffer budgets (MiB) of the im2col candidates; 32 MiB stays in L2.
CHUNK_BUDGETS_MIB = (8, 32, 128)
#: The deterministic default (what ``CC2OPS_AUTOTUNE=0`` always runs).
DEFAULT_ALGORITHM = "im2col_knp_32m"


def resolve_precision(dtype: Any, precision: str | None) -> str:
    """The precision a pass runs at: ``"fp64"`` for float64, else ``"fp32"`` or
    ``"tf32"`` (``None`` reads :func:`cc2ops.cuda.get_allow_tf32` now)."""
    if np.dtype(dtype) == np.float64:
        return "fp64"
    if precision is None:
        from cc2ops.cuda.runtime.precision import get_allow_tf32

        return "tf32" if get_allow_tf32() else "fp32"
    if precision not in ("fp32", "tf32"):
        raise ValueError(
            f"conv: precision must be None, 'fp32' or 'tf32', got {precision!r}"
        )
    return precision


def _check_precision_prop(op: str, precision: Any) -> str | None:
    if precision is not None and precision not in ("fp32", "tf32"):
        raise ValueError(
            f"{op}: precision must be None, 'fp32' or 'tf32', got {precision!r}"
        )
    return precision


# --------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------


def _pair_tag(prefix: str, a: int, b: int) -> str:
    return f"{prefix}{a}" if a == b else f"{prefix}{a}x{b}"


@register_namer("conv_im2col")
def im2col_kernel_name(kind: str, dtype: str, **c: Any) -> str:
    """``im2col_k5x5_s1_p2_f32``-style names: kind, filter, stride, padding,
    dtype, then the layout when it is not ``knp`` and ``_acc`` when col2im
    accumulates. The helpers are ``swap01_f32`` and ``add_f32``."""
    if kind in ("swap01", "add"):
        return f"{kind}_{_DT[dtype]}"
    name = (
        f"{kind}_k{c['kh']}x{c['kw']}"
        + "_"
        + _pair_tag("s", c["sh"], c["sw"])
        + "_"
        + _pair_tag("p", c["ph"], c["pw"])
        + f"_{_DT[dtype]}"
    )
    if c["layout"] != "knp":
        name += f"_{c['layout']}"
    if c.get("accumulate"):
        name += "_acc"
    return name


def _tap_consts(
    kind: str, g: ConvGeometry, dtype: str, layout: str, accumulate: bool = False
) -> dict[str, Any]:
    c: dict[str, Any] = dict(
        kind=kind,
        dtype=str(dtype),
        kh=g.kh,
        kw=g.kw,
        sh=g.stride_h,
        sw=g.stride_w,
        ph=g.pad_h,
        pw=g.pad_w,
        layout=layout,
        accumulate=bool(accumulate),
    )
    c["name"] = im2col_kernel_name(**c)
    return c


def _helper_consts(kind: str, dtype: str) -> dict[str, Any]:
    # the template names every constant (Mako's strict_undefined checks them
    # all), so the helpers pass neutral tap constants
    c: dict[str, Any] = dict(
        kind=kind, dtype=str(dtype), kh=1, kw=1, sh=1, sw=1, ph=0, pw=0,
        layout="knp", accumulate=False,
    )  # fmt: skip
    c["name"] = im2col_kernel_name(**c)
    return c


@register_variants("conv_im2col")
def _im2col_variants() -> list[dict[str, Any]]:
    g5 = ConvGeometry(1, 64, 27, 27, 192, 5, 5, 1, 1, 2, 2, 1, 27, 27)
    g11 = ConvGeometry(1, 3, 224, 224, 64, 11, 11, 4, 4, 0, 0, 1, 54, 54)
    grect = ConvGeometry(1, 4, 9, 7, 4, 2, 3, 2, 1, 1, 0, 2, 5, 5)
    return [
        _tap_consts("im2col", g5, "float32", "knp"),
        _tap_consts("col2im", g11, "float32", "knp"),
        _tap_consts("col2im", grect, "float64", "nkp", accumulate=True),
        _tap_consts("im2col", grect, "float64", "nkp"),
        _helper_consts("swap01", "float32"),
        _helper_consts("add", "float64"),
    ]


def _launch_flat(consts: dict[str, Any], n: int, args: list[Any], device: int) -> None:
    if n <= 0:
        return
    from cc2ops.cuda.runtime.compile import get_kernel, launch
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(device)
    fn = get_kernel("conv_im2col", device, **consts)
    grid = max(1, min(-(-n // _BLOCK), dev.multiprocessors * 32))
    launch(fn, grid, _BLOCK, args, device)


def _u32(v: int) -> np.uint32:
    if not 0 <= v <= INT32_MAX:
        raise ValueError(f"conv im2col: index count {v} outside [0, 2^31)")
    return np.uint32(v)


def _im2col(
    x: Any, cols: Any, n: int, g: ConvGeometry, layout: str, device: int
) -> None:
    """Columns of ``n`` images starting at ``x`` (a pointer-bearing view)."""
    consts = _tap_consts("im2col", g, str(x.dtype), layout)
    args = [
        x, cols, _u32(n), _u32(g.channels), np.int32(g.height), np.int32(g.width),
        np.int32(g.out_h), np.int32(g.out_w),
    ]  # fmt: skip
    _launch_flat(consts, n * g.channels * g.out_h * g.out_w, args, device)


def _col2im(
    cols: Any,
    dx: Any,
    n: int,
    g: ConvGeometry,
    layout: str,
    accumulate: bool,
    device: int,
) -> None:
    consts = _tap_consts("col2im", g, str(dx.dtype), layout, accumulate)
    args = [
        cols, dx, _u32(n), _u32(g.channels), np.int32(g.height), np.int32(g.width),
        np.int32(g.out_h), np.int32(g.out_w),
    ]  # fmt: skip
    _launch_flat(consts, n * g.channels * g.height * g.width, args, device)


def _swap01(src: Any, dst: Any, a: int, b: int, p: int, device: int) -> None:
    """``dst[b][a][p] = src[a][b][p]`` (both C-contiguous buffers)."""
    consts = _helper_consts("swap01", str(src.dtype))
    _launch_flat(consts, a * b * p, [src, dst, _u32(a), _u32(b), _u32(p)], device)


def _add_into(src: Any, dst: Any, device: int) -> None:
    """``dst += src`` for C-contiguous arrays of one size."""
    n = int(np.prod(dst.shape))
    _launch_flat(_helper_consts("add", str(dst.dtype)), n, [src, dst, np.int64(n)],
                 device)  # fmt: skip


def _view(base: Any, offset: int, shape: Sequence[int], strides: Sequence[int]) -> Any:
    # looked up on the array module at each call, so a test can stand in numpy
    return array.view(base, offset, shape, strides)


def _flat(base: Any, offset: int, shape: Sequence[int]) -> Any:
    return array.flat_view(base, offset, shape)


# --------------------------------------------------------------------------
# algorithms
# --------------------------------------------------------------------------


def _blas_precision(precision: str) -> str:
    return "tf32" if precision == "tf32" else "fp32"


def _grouped_gemm(
    a: Any,
    b: Any,
    c: Any,
    groups: int,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    beta: float = 0.0,
    precision: str,
    device: int,
) -> None:
    """``c[g] = op(a[g]) op(b[g]) + beta c[g]`` over (groups, rows, cols) views."""
    from cc2ops.cuda.libs import cublas as blas

    prec = _blas_precision(precision)
    if groups == 1:
        blas.gemm(
            _flat(a, 0, a.shape[1:]), _flat(b, 0, b.shape[1:]),
            _flat(c, 0, c.shape[1:]), trans_a=trans_a, trans_b=trans_b,
            beta=beta, device=device, precision=prec,
        )  # fmt: skip
    else:
        blas.gemm_strided_batched(
            a, b, c, trans_a=trans_a, trans_b=trans_b, beta=beta, device=device,
            precision=prec,
        )  # fmt: skip


@dataclass(frozen=True)
class Im2colGemm:
    """im2col + cuBLAS GEMM (see the module docstring), one layout and budget."""

    layout: str
    budget_mib: int

    @property
    def name(self) -> str:
        return f"im2col_{self.layout}_{self.budget_mib}m"

    def applies(self, op: str, g: ConvGeometry, dtype: Any, precision: str) -> bool:
        if self.layout == "nkp" and op == "weight_acts":
            return False
        try:
            plan_chunk(g, np.dtype(dtype).itemsize, self.budget_mib << 20)
        except ValueError:
            return False
        return True

    def _nb(self, g: ConvGeometry, dtype: Any) -> int:
        return plan_chunk(g, np.dtype(dtype).itemsize, self.budget_mib << 20)

    def kernel_specs(
        self, op: str, g: ConvGeometry, dtype: Any, precision: str
    ) -> list[KernelSpec]:
        """The kernels this algorithm launches for ``op`` on ``g`` (both the
        plain and the accumulating col2im)."""
        dt = str(np.dtype(dtype))
        specs = [KernelSpec("conv_im2col", _helper_consts("swap01", dt))]
        if self.layout == "knp":
            if op == "image_acts":
                specs += [
                    KernelSpec("conv_im2col", _tap_consts("col2im", g, dt, "knp", a))
                    for a in (False, True)
                ]
            else:
                im2col = _tap_consts("im2col", g, dt, "knp")
                specs.append(KernelSpec("conv_im2col", im2col))
            return specs
        if self._direct(g):
            return []
        if op == "image_acts":
            return [
                KernelSpec("conv_im2col", _tap_consts("col2im", g, dt, "nkp", a))
                for a in (False, True)
            ]
        return [KernelSpec("conv_im2col", _tap_consts("im2col", g, dt, "nkp"))]

    def _direct(self, g: ConvGeometry) -> bool:
        """1x1, stride 1, no padding: the images are their own nkp columns."""
        return (g.kh, g.kw, g.stride_h, g.stride_w, g.pad_h, g.pad_w) == (
            1, 1, 1, 1, 0, 0,
        )  # fmt: skip

    # ---- forward -------------------------------------------------------
    def filter_acts(
        self, x: Any, w: Any, out: Any, g: ConvGeometry, precision: str,
        device: int, accumulate: bool = False,
    ) -> None:  # fmt: skip
        if accumulate:
            raise ValueError("conv: FilterActs does not accumulate")
        dt = x.dtype
        G, F, C = g.groups, g.filters, g.channels
        Fg, KK, P = F // G, g.kh * g.kw, g.out_h * g.out_w
        K = C // G * KK
        nb = self._nb(g, dt)
        for b0 in range(0, g.batch, nb):
            n = min(nb, g.batch - b0)
            xs = _flat(x, b0 * C * g.height * g.width, (n, C, g.height, g.width))
            if self.layout == "knp":
                if b0 == 0:
                    cols = array.empty((C * KK * nb * P,), dt, device)
                    ytmp = array.empty((F * nb * P,), dt, device) if nb > 1 else None
                _im2col(xs, cols, n, g, "knp", device)
                target = ytmp if n > 1 else _flat(out, b0 * F * P, (F * P,))
                _grouped_gemm(
                    _flat(w, 0, (G, Fg, K)), _flat(cols, 0, (G, K, n * P)),
                    _flat(target, 0, (G, Fg, n * P)), G, precision=precision,
                    device=device,
                )  # fmt: skip
                if n > 1:
                    _swap01(ytmp, _flat(out, b0 * F * P, (n * F * P,)), F, n, P, device)
            else:
                direct = self._direct(g)
                if direct:
                    cols = xs
                else:
                    if b0 == 0:
                        cols_buf = array.empty((nb * C * KK * P,), dt, device)
                    cols = cols_buf
                    _im2col(xs, cols, n, g, "nkp", device)
                for gi in range(G):
                    _batched_gemm(
                        _view(w, gi * Fg * K, (1, Fg, K), (0, K, 1)),
                        _view(cols, gi * K * P, (n, K, P), (C * KK * P, P, 1)),
                        _view(out, b0 * F * P + gi * Fg * P, (n, Fg, P),
                              (F * P, P, 1)),
                        precision=precision, device=device,
                    )  # fmt: skip

    # ---- gradient wrt the images ----------------------------------------
    def image_acts(
        self, dy: Any, w: Any, out: Any, g: ConvGeometry, precision: str,
        device: int, accumulate: bool = False,
    ) -> None:  # fmt: skip
        dt = dy.dtype
        G, F, C = g.groups, g.filters, g.channels
        Fg, Cg, KK, P = F // G, C // G, g.kh * g.kw, g.out_h * g.out_w
        K = Cg * KK
        HW = g.height * g.width
        nb = self._nb(g, dt)
        for b0 in range(0, g.batch, nb):
            n = min(nb, g.batch - b0)
            dys = _flat(dy, b0 * F * P, (n * F * P,))
            dxs = _flat(out, b0 * C * HW, (n * C * HW,))
            if self.layout == "knp":
                if b0 == 0:
                    dcols = array.empty((C * KK * nb * P,), dt, device)
                    dyt = array.empty((F * nb * P,), dt, device) if nb > 1 else None
                if n > 1:
                    _swap01(dys, dyt, n, F, P, device)
                    src = dyt
                else:
                    src = dys
                _grouped_gemm(
                    _flat(w, 0, (G, Fg, K)), _flat(src, 0, (G, Fg, n * P)),
                    _flat(dcols, 0, (G, K, n * P)), G, trans_a=True,
                    precision=precision, device=device,
                )  # fmt: skip
                _col2im(dcols, dxs, n, g, "knp", accumulate, device)
            else:
                direct = self._direct(g)
                if not direct and b0 == 0:
                    dcols_buf = array.empty((nb * C * KK * P,), dt, device)
                for gi in range(G):
                    if direct:
                        target = _view(dxs, gi * Cg * P, (n, Cg, P), (C * P, P, 1))
                    else:
                        target = _view(
                            dcols_buf, gi * K * P, (n, K, P), (C * KK * P, P, 1)
                        )
                    _batched_gemm(
                        _view(w, gi * Fg * K, (1, Fg, K), (0, K, 1)),
                        _view(dys, gi * Fg * P, (n, Fg, P), (F * P, P, 1)),
                        target, trans_a=True,
                        beta=1.0 if (direct and accumulate) else 0.0,
                        precision=precision, device=device,
                    )  # fmt: skip
                if not direct:
                    _col2im(dcols_buf, dxs, n, g, "nkp", accumulate, device)

    # ---- gradient wrt the filters ---------------------------------------
    def weight_acts(
        self, x: Any, dy: Any, out: Any, g: ConvGeometry, precision: str,
        device: int, accumulate: bool = False,
    ) -> None:  # fmt: skip
        if self.layout != "knp":
            raise ValueError(f"conv: {self.name} does not compute WeightActs")
        dt = x.dtype
        G, F, C = g.groups, g.filters, g.channels
        Fg, KK, P = F // G, g.kh * g.kw, g.out_h * g.out_w
        K = C // G * KK
        if g.batch == 0:
            if not accumulate:
                array.fill(out, 0, device=device)
            return
        nb = self._nb(g, dt)
        cols = array.empty((C * KK * nb * P,), dt, device)
        dyt = array.empty((F * nb * P,), dt, device) if nb > 1 else None
        for b0 in range(0, g.batch, nb):
            n = min(nb, g.batch - b0)
            xs = _flat(x, b0 * C * g.height * g.width, (n, C, g.height, g.width))
            dys = _flat(dy, b0 * F * P, (n * F * P,))
            _im2col(xs, cols, n, g, "knp", device)
            if n > 1:
                _swap01(dys, dyt, n, F, P, device)
                src = dyt
            else:
                src = dys
            _grouped_gemm(
                _flat(src, 0, (G, Fg, n * P)), _flat(cols, 0, (G, K, n * P)),
                _flat(out, 0, (G, Fg, K)), G, trans_b=True,
                beta=1.0 if (accumulate or b0 > 0) else 0.0,
                precision=precision, device=device,
            )  # fmt: skip


def _batched_gemm(
    a: Any,
    b: Any,
    c: Any,
    *,
    trans_a: bool = False,
    beta: float = 0.0,
    precision: str,
    device: int,
) -> None:
    from cc2ops.cuda.libs import cublas as blas

    blas.gemm_strided_batched(
        a, b, c, trans_a=trans_a, beta=beta, device=device,
        precision=_blas_precision(precision),
    )  # fmt: skip


def _conv_igemm() -> Any:
    """:mod:`cc2ops.cuda.ops.conv.igemm` (a function so that a test can hide it)."""
    return conv_igemm


@dataclass(frozen=True)
class Igemm:
    """conv-b's tensor-core implicit GEMM with one tile configuration."""

    config: Any = None

    @property
    def name(self) -> str:
        # one name per tile: the tile's own label (bm/bn/bk/w/st and flags),
        # the vocabulary of its kernel names (conv_igemm_..._bm64_bn128_...)
        return "igemm" if self.config is None else f"igemm_{self.config.label}"

    def applies(self, op: str, g: ConvGeometry, dtype: Any, precision: str) -> bool:
        mod = _conv_igemm()
        if mod is None or precision not in ("fp32", "tf32"):
            return False
        # supports() answers False for anything it cannot run; an exception
        # there is a bug to see, not a candidate to skip
        return bool(mod.supports(op, g, np.dtype(dtype), precision))

    def kernel_specs(
        self, op: str, g: ConvGeometry, dtype: Any, precision: str
    ) -> list[KernelSpec]:
        """The kernels this tile launches for ``op`` on ``g`` (16-byte aligned
        operands, as the device pool allocates them), and the accumulate helper."""
        mod = _conv_igemm()
        if mod is None:
            return []
        dt = str(np.dtype(dtype))
        return [
            mod.kernel_spec(op, g, precision, self.config),
            KernelSpec("conv_im2col", _helper_consts("add", dt)),
        ]

    def _run(
        self, op: str, a: Any, b: Any, out: Any, g: ConvGeometry, precision: str,
        device: int, accumulate: bool,
    ) -> None:  # fmt: skip
        mod = _conv_igemm()
        if mod is None:
            raise ValueError("conv: cc2ops.cuda.ops.conv.igemm does not import")
        fn = getattr(mod, op)
        kwargs = {} if self.config is None else {"config": self.config}
        if accumulate:
            scratch = array.empty(out.shape, out.dtype, device)
            fn(a, b, scratch, g, precision, device, **kwargs)
            _add_into(scratch, out, device)
        else:
            fn(a, b, out, g, precision, device, **kwargs)

    def filter_acts(self, x, w, out, g, precision, device, accumulate=False):
        self._run("filter_acts", x, w, out, g, precision, device, accumulate)

    def image_acts(self, dy, w, out, g, precision, device, accumulate=False):
        self._run("image_acts", dy, w, out, g, precision, device, accumulate)

    def weight_acts(self, x, dy, out, g, precision, device, accumulate=False):
        self._run("weight_acts", x, dy, out, g, precision, device, accumulate)


_IM2COL = tuple(Im2colGemm("knp", m) for m in CHUNK_BUDGETS_MIB) + (
    Im2colGemm("nkp", 32),
)


def _candidates(
    op: str,
    g: ConvGeometry,
    dtype: Any,
    precision: str,
    device: int | None = None,
    capability: tuple[int, int] | None = None,
) -> list[Any]:
    """The applicable algorithms of ``op``, the default first. With a
    ``device`` (or a ``capability`` given as ``(major, minor)``, for building
    kernels ahead without one), also the tiles only that compute capability
    runs (wgmma on 9.0); without either, only the portable candidates."""
    out = [a for a in _IM2COL if a.applies(op, g, dtype, precision)]
    out.sort(key=lambda a: a.name != DEFAULT_ALGORITHM)
    fft = FftConv()
    if fft.applies(op, g, dtype, precision):
        out.append(fft)
    mod = _conv_igemm()
    if mod is not None and Igemm().applies(op, g, dtype, precision):
        if capability is None and device is not None:
            from cc2ops.cuda.runtime.device import get_device

            capability = tuple(get_device(device).compute_capability)
        configs = list(mod.variants(op, g, precision, capability)) or [None]
        out.extend(Igemm(c) for c in configs)
    return out


def kernel_specs(
    op: str,
    g: ConvGeometry,
    dtype: Any,
    precision: str | None = None,
    device: int | None = None,
    capability: tuple[int, int] | None = None,
) -> list[KernelSpec]:
    """Every kernel the applicable algorithms of ``op`` on ``g`` may launch
    (for :func:`cc2ops.cuda.runtime.compile.precompile`); ``device`` (or
    ``capability``, ``(major, minor)``, without a device) adds those of the
    candidates only that compute capability runs (see :func:`algorithm_names`)."""
    if op not in _OPS:
        raise ValueError(f"conv: op must be one of {_OPS}, got {op!r}")
    prec = resolve_precision(dtype, precision)
    specs: list[KernelSpec] = []
    for alg in _candidates(op, g, dtype, prec, device, capability):
        specs.extend(alg.kernel_specs(op, g, dtype, prec))
    return specs


def algorithm_names(
    op: str,
    g: ConvGeometry,
    dtype: Any,
    precision: str | None = None,
    device: int | None = None,
) -> list[str]:
    """Names of the algorithms that apply to ``op`` (``"filter_acts"``,
    ``"image_acts"``, ``"weight_acts"``) on ``g``, the default first.

    ``device``: include the candidates only that device's compute capability
    runs (the ``wgmma`` tiles on 9.0), as the passes on it do; ``None``
    (no CUDA touched): the portable candidates only."""
    if op not in _OPS:
        raise ValueError(f"conv: op must be one of {_OPS}, got {op!r}")
    prec = resolve_precision(dtype, precision)
    return [a.name for a in _candidates(op, g, dtype, prec, device)]


def chosen_algorithm(
    op: str, g: ConvGeometry, dtype: Any, precision: str | None, device: int = 0
) -> str:
    """The algorithm a pass runs now for ``g``: the autotuner's remembered
    choice, else the default (before tuning, or with ``CC2OPS_AUTOTUNE=0``)."""
    from cc2ops.cuda.runtime.autotune import autotune_enabled

    prec = resolve_precision(dtype, precision)
    cands = _candidates(op, g, dtype, prec, device)
    if len(cands) == 1 or not autotune_enabled():
        return cands[0].name
    names = [a.name for a in cands]
    hit = _tuner().cached(_tune_key(op, g, dtype, prec, device, names))
    return hit if hit in names else cands[0].name


_TUNER: Any = None
#: Decided choices per tuner (a fresh tuner, as a test makes, starts empty).
_CHOICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tuner() -> Any:
    global _TUNER
    if _TUNER is None:
        from cc2ops.cuda.runtime.autotune import Autotuner

        _TUNER = Autotuner("conv")
    return _TUNER


_TOLERANCE = {"fp32": 2e-5, "tf32": 1e-2, "fp64": 1e-10}


def _sources_digest(
    op: str, g: ConvGeometry, dtype: Any, precision: str, device: int
) -> str:
    """sha256 (16 hex digits) of the rendered CUDA source of every kernel the
    candidates of ``op`` on ``g`` may launch, each once, in a fixed order.

    The autotuner's key holds it where a hand-bumped version number used to
    be: editing a template, a tile's constants or the kernels an algorithm
    launches changes the key, so timings of other code are never reused.
    Host-side planning that launches the same kernels (a chunk count, say)
    does not change it; such a change must change a candidate's name, which
    the key holds too.
    """
    seen: dict[tuple, KernelSpec] = {}
    for spec in kernel_specs(op, g, dtype, precision, device=device):
        seen.setdefault((spec.family, repr(sorted(spec.consts.items()))), spec)
    digest = hashlib.sha256()
    for key in sorted(seen, key=repr):
        spec = seen[key]
        digest.update(render(spec.family, **spec.consts).encode("utf-8"))
    return digest.hexdigest()[:16]


def _tune_key(
    op: str, g: ConvGeometry, dtype: Any, precision: str, device: int, names: list
) -> dict[str, Any]:
    return {
        "op": _OP_CLASS[op],
        "geometry": dataclasses.astuple(g),
        "dtype": str(np.dtype(dtype)),
        "precision": precision,
        "device": get_device(device).name,
        "sources": _sources_digest(op, g, dtype, precision, device),
        "candidates": list(names),
    }


def _choose(
    op: str,
    g: ConvGeometry,
    dtype: Any,
    precision: str,
    device: int,
    inputs: tuple[Any, Any],
    out_shape: tuple[int, ...],
    algorithm: str | None,
) -> Any:
    """The algorithm to run: forced, or chosen by the autotuner.

    A decided choice is remembered per tuner (:data:`_CHOICES`) and (op,
    geometry, dtype, precision, device, forced name, autotune switch), so later
    calls skip the candidate enumeration and the key's JSON (a fresh tuner
    forgets them).
    """
    from cc2ops.cuda.runtime.autotune import autotune_enabled

    tuner = _tuner()
    memo = _CHOICES.setdefault(tuner, {})
    mkey = (op, g, str(dtype), precision, device, algorithm, autotune_enabled())
    hit = memo.get(mkey)
    if hit is not None:
        return hit
    alg = _choose_uncached(op, g, dtype, precision, device, inputs, out_shape,
                           algorithm)  # fmt: skip
    decided = algorithm is not None or not autotune_enabled()
    if not decided:
        names = [a.name for a in _candidates(op, g, dtype, precision, device)]
        key = _tune_key(op, g, dtype, precision, device, names)
        decided = len(names) == 1 or tuner.cached(key) is not None
    if decided:  # for good (not the fallback of a tuning that decided nothing)
        memo[mkey] = alg
    return alg


def _choose_uncached(
    op: str,
    g: ConvGeometry,
    dtype: Any,
    precision: str,
    device: int,
    inputs: tuple[Any, Any],
    out_shape: tuple[int, ...],
    algorithm: str | None,
) -> Any:
    cands = _candidates(op, g, dtype, precision, device)
    by_name = {a.name: a for a in cands}
    if algorithm is not None:
        if algorithm not in by_name:
            raise ValueError(
                f"{_OP_CLASS[op]}: algorithm {algorithm!r} does not apply here; "
                f"applicable: {', '.join(by_name) or 'none'}"
            )
        return by_name[algorithm]
    if len(cands) == 1:
        return cands[0]
    a, b = inputs

    def runner(alg: Any) -> Callable[[Any], None]:
        return lambda out: getattr(alg, op)(a, b, out, g, precision, device)

    from cc2ops.cuda.runtime.autotune import autotune_enabled
    from cc2ops.cuda.runtime.compile import precompile

    key = _tune_key(op, g, dtype, precision, device, list(by_name))
    if autotune_enabled() and _tuner().cached(key) is None:
        # every candidate is about to run: compile them side by side first
        specs = [s for alg in cands for s in alg.kernel_specs(op, g, dtype, precision)]
        precompile(specs, device=device)
    name = _tuner().select(
        key,
        {n: runner(alg) for n, alg in by_name.items()},
        default=cands[0].name,
        scratch=lambda: array.empty(out_shape, dtype, device),
        tolerance=_TOLERANCE[precision],
        device=device,
    )
    return by_name.get(name, cands[0])


# --------------------------------------------------------------------------
# the passes on GPUArrays
# --------------------------------------------------------------------------


def _check_arrays(op: str, **arrays: Any) -> str:
    dtypes = {}
    for role, a in arrays.items():
        if len(a.shape) != 4:
            raise ValueError(f"{op}: {role} must have 4 dims, got {len(a.shape)}")
        dtypes[role] = str(a.dtype)
        if dtypes[role] not in FLOAT_DTYPES:
            raise TypeError(f"{op}: {role} must be float32 or float64, got {a.dtype}")
    if len(set(dtypes.values())) != 1:
        got = ", ".join(f"{k} {v}" for k, v in dtypes.items())
        raise TypeError(f"{op}: inputs must share one float dtype, got {got}")
    return next(iter(dtypes.values()))


def _accumulator(op: str, acc: Any, shape: tuple, dtype: str, device: int) -> Any:
    """The buffer an accumulating pass adds into: ``acc`` or a contiguous copy."""
    if tuple(int(s) for s in acc.shape) != tuple(shape):
        raise ValueError(
            f"{op}: acc has shape {tuple(acc.shape)}, the result {tuple(shape)}"
        )
    if str(acc.dtype) != dtype:
        raise TypeError(f"{op}: acc has dtype {acc.dtype}, the inputs {dtype}")
    if array.is_c_contiguous(acc):
        return acc
    return array.copy(acc, device)


def filter_acts(
    x: Any,
    w: Any,
    *,
    stride: Any = 1,
    padding: Any = 0,
    groups: int = 1,
    precision: str | None = None,
    device: int = 0,
    algorithm: str | None = None,
    out: Any = None,
) -> Any:
    """Forward convolution of GPUArrays: ``y = conv(x, w)``.

    Parameters
    ----------
    x : GPUArray, shape (B, C, H, W)
        Images (any strides; copied to C order when needed).
    w : GPUArray, shape (F, C/groups, kh, kw)
        Filters, x's dtype (float32 or float64).
    stride, padding, groups
        As in :class:`cc2ops.conv.FilterActs`.
    precision : {None, "fp32", "tf32"}
        float32 only; ``None`` follows :func:`cc2ops.cuda.get_allow_tf32`.
    device : int
        Device label; the work is queued on its stream.
    algorithm : str, optional
        Force one of :func:`algorithm_names` (default: the autotuner's choice).
    out : GPUArray, optional
        C-contiguous (B, F, Ho, Wo) output to write (allocated when omitted).

    Returns
    -------
    GPUArray, shape (B, F, Ho, Wo)
    """
    op = "GpuFilterActs"
    stride, padding, groups = conv_params(stride, padding, groups, op)
    dtype = _check_arrays(op, images=x, filters=w)
    g = geometry_of(op, x.shape, w.shape, stride, padding, groups)
    prec = resolve_precision(dtype, precision)
    shape = (g.batch, g.filters, g.out_h, g.out_w)
    if out is None:
        out = array.empty(shape, dtype, device)
    elif tuple(out.shape) != shape or not array.is_c_contiguous(out):
        raise ValueError(f"{op}: out must be C-contiguous of shape {shape}")
    if 0 in shape:
        return out
    x, w = array.ascontiguous(x, device), array.ascontiguous(w, device)
    if g.channels // g.groups * g.kh * g.kw == 0:
        array.fill(out, 0, device=device)
        return out
    alg = _choose("filter_acts", g, dtype, prec, device, (x, w), shape, algorithm)
    alg.filter_acts(x, w, out, g, prec, device)
    return out


def image_acts(
    dy: Any,
    w: Any,
    image_hw: Sequence[int],
    *,
    stride: Any = 1,
    padding: Any = 0,
    groups: int = 1,
    precision: str | None = None,
    device: int = 0,
    algorithm: str | None = None,
    acc: Any = None,
) -> Any:
    """Gradient wrt the images of GPUArrays: ``dx`` (or ``acc + dx``).

    Parameters
    ----------
    dy : GPUArray, shape (B, F, Ho, Wo)
        Gradient wrt the forward output.
    w : GPUArray, shape (F, C/groups, kh, kw)
        Filters, dy's dtype.
    image_hw : pair of int
        (H, W) of the images.
    stride, padding, groups, precision, device, algorithm
        As in :func:`filter_acts`.
    acc : GPUArray, shape (B, C, H, W), optional
        Added to: the result is written into ``acc`` (C-contiguous; else into a
        copy of it) and returned.

    Returns
    -------
    GPUArray, shape (B, C, H, W)
        0 where no filter tap reaches a pixel.
    """
    op = "GpuImageActs"
    stride, padding, groups = conv_params(stride, padding, groups, op)
    dtype = _check_arrays(op, gradient=dy, filters=w)
    hw = hw_value(op, "image_hw", np.asarray(image_hw))
    b, f, ho, wo = (int(s) for s in dy.shape)
    check_conv_filter_count(op, f, int(w.shape[0]))
    g = geometry_of(op, (b, int(w.shape[1]) * groups, *hw), w.shape, stride, padding,
                    groups)  # fmt: skip
    check_conv_gradient_hw(op, (ho, wo), hw, tuple(w.shape[2:]), stride, padding)
    prec = resolve_precision(dtype, precision)
    shape = (g.batch, g.channels, g.height, g.width)
    if acc is not None:
        out = _accumulator(op, acc, shape, dtype, device)
    else:
        out = array.empty(shape, dtype, device)
    if 0 in shape:
        return out
    if g.filters == 0 or g.out_h * g.out_w == 0:
        if acc is None:
            array.fill(out, 0, device=device)
        return out
    dy, w = array.ascontiguous(dy, device), array.ascontiguous(w, device)
    alg = _choose("image_acts", g, dtype, prec, device, (dy, w), shape, algorithm)
    alg.image_acts(dy, w, out, g, prec, device, accumulate=acc is not None)
    return out


def weight_acts(
    x: Any,
    dy: Any,
    filter_hw: Sequence[int],
    *,
    stride: Any = 1,
    padding: Any = 0,
    groups: int = 1,
    precision: str | None = None,
    device: int = 0,
    algorithm: str | None = None,
    acc: Any = None,
) -> Any:
    """Gradient wrt the filters of GPUArrays: ``dw`` (or ``acc + dw``).

    Parameters
    ----------
    x : GPUArray, shape (B, C, H, W)
        Images.
    dy : GPUArray, shape (B, F, Ho, Wo)
        Gradient wrt the forward output, x's dtype.
    filter_hw : pair of int
        (kh, kw).
    stride, padding, groups, precision, device, algorithm
        As in :func:`filter_acts`.
    acc : GPUArray, shape (F, C/groups, kh, kw), optional
        Added to (GEMM ``beta = 1``); the result is written into ``acc``
        (C-contiguous; else into a copy of it) and returned.

    Returns
    -------
    GPUArray, shape (F, C/groups, kh, kw)
    """
    op = "GpuWeightActs"
    stride, padding, groups = conv_params(stride, padding, groups, op)
    dtype = _check_arrays(op, images=x, gradient=dy)
    khw = hw_value(op, "filter_hw", np.asarray(filter_hw))
    check_conv_batch(op, int(x.shape[0]), int(dy.shape[0]))
    f = int(dy.shape[1])
    c = int(x.shape[1])
    g = geometry_of(op, x.shape, (f, c // groups, *khw), stride, padding, groups)
    check_conv_gradient_hw(op, tuple(dy.shape[2:]), (g.height, g.width), khw, stride,
                       padding)  # fmt: skip
    prec = resolve_precision(dtype, precision)
    shape = (g.filters, g.channels // g.groups, g.kh, g.kw)
    if acc is not None:
        out = _accumulator(op, acc, shape, dtype, device)
    else:
        out = array.empty(shape, dtype, device)
    if 0 in shape:
        return out
    if g.batch * g.out_h * g.out_w == 0:
        if acc is None:
            array.fill(out, 0, device=device)
        return out
    x, dy = array.ascontiguous(x, device), array.ascontiguous(dy, device)
    alg = _choose("weight_acts", g, dtype, prec, device, (x, dy), shape, algorithm)
    alg.weight_acts(x, dy, out, g, prec, device, accumulate=acc is not None)
    return out


# --------------------------------------------------------------------------
# ops: the skeletons of cc2ops.conv plus GPU props, make_node and perform
# --------------------------------------------------------------------------

_IMAGES = "(B, C, H, W)"
_FILTERS = "(F, C/groups, kh, kw)"
_GRADIENT = "(B, F, Ho, Wo)"


def _check_acc(op: str, acc: Variable, shape: tuple, dtype: str) -> tuple:
    if acc.type.dtype != dtype:
        raise TypeError(f"{op}: acc has dtype {acc.type.dtype}, the inputs {dtype}")
    for a, s in zip(acc.type.shape, shape, strict=True):
        if a is not None and s is not None and a != s:
            raise ValueError(
                f"{op}: acc has shape {acc.type.shape}, the result {tuple(shape)}"
            )
    return merge_static_shapes(acc.type.shape, shape)


class _GpuConv(ConvSkeleton, GpuGradients, GpuOp):
    """The GPU convolution ops' base: the host parameters plus ``precision``,
    the GPU gradient hooks and the GPU op machinery."""

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("stride", "padding", "groups", "precision")

    def __init__(
        self,
        *,
        stride: Any = 1,
        padding: Any = 0,
        groups: int = 1,
        precision: str | None = None,
    ) -> None:
        super().__init__(stride=stride, padding=padding, groups=groups)
        self.precision = _check_precision_prop(self._name, precision)

    def _params(self) -> dict[str, Any]:
        return dict(super()._params(), precision=self.precision)


class _GpuConvGrad(_GpuConv):
    """The gradients: an optional accumulator input (``accumulate=True``)."""

    __props__ = ("stride", "padding", "groups", "precision", "accumulate")

    def __init__(
        self,
        *,
        stride: Any = 1,
        padding: Any = 0,
        groups: int = 1,
        precision: str | None = None,
        accumulate: bool = False,
    ) -> None:
        super().__init__(
            stride=stride, padding=padding, groups=groups, precision=precision
        )
        if not isinstance(accumulate, bool):
            raise TypeError(
                f"{self._name}: accumulate must be a bool, got {accumulate!r}"
            )
        self.accumulate = accumulate
        if accumulate:
            self.destroy_map = {0: [3]}


class GpuFilterActs(FilterActsSkeleton, _GpuConv):
    """Forward convolution of GPU images: ``GpuFilterActs(...)(x, w) -> y``.

    :class:`cc2ops.conv.FilterActs` on the GPU (parameters ``stride``,
    ``padding``, ``groups``, shape rule and gradients:
    :class:`~cc2ops.conv.FilterActsSkeleton`) plus ``precision``
    (``{None, "fp32", "tf32"}``, float32 only: ``None`` follows
    :func:`cc2ops.cuda.get_allow_tf32` when the op runs). ``x`` (B, C, H, W)
    and ``w`` (F, C/groups, kh, kw), float32/float64 GPU variables on one
    device; ``y`` (B, F, Ho, Wo). Runs :func:`filter_acts` (the autotuned
    algorithm). Pullback ``GpuImageActs`` (x) and ``GpuWeightActs`` (w).
    """

    def make_node(self, x: Any, w: Any) -> Apply:
        op = self._name
        x = gpu_float_variable(op, "images", x, 4, _IMAGES)
        w = gpu_float_variable(op, "filters", w, 4, _FILTERS)
        device = common_device(op, x, w)
        dtype = same_dtype(op, images=x, filters=w)
        shape = self._out_shape(x, w)
        return Apply(self, [x, w], [CudaArrayType(dtype, shape, device)()])

    def perform(self, node, inputs, output_storage):
        x, w = inputs
        output_storage[0][0] = filter_acts(
            x, w, **self._params(), device=self.device_of(node)
        )


class GpuImageActs(ImageActsSkeleton, _GpuConvGrad):
    """Gradient wrt the images on the GPU: ``(dy, w, image_hw[, acc]) -> dx``.

    :class:`cc2ops.conv.ImageActs` on the GPU (shape rule and gradients:
    :class:`~cc2ops.conv.ImageActsSkeleton`), parameters as
    :class:`GpuFilterActs` plus ``accumulate``: with ``True`` the op takes a
    fourth input ``acc`` (B, C, H, W) and returns ``acc + dx`` in acc's
    buffer (``destroy_map``). ``dy`` (B, F, Ho, Wo) and ``w``
    (F, C/groups, kh, kw) GPU variables of one dtype and device,
    ``image_hw`` a host int vector (H, W); ``dx`` (B, C, H, W), 0 where no
    filter tap reaches. Runs :func:`image_acts`. Pullback ``GpuFilterActs``
    (dy), ``GpuWeightActs`` (w), the cotangent itself (acc).
    """

    def make_node(self, dy: Any, w: Any, image_hw: Any, *acc: Any) -> Apply:
        op = self._name
        self._nargs((dy, w, image_hw, *acc))
        dy = gpu_float_variable(op, "gradient", dy, 4, _GRADIENT)
        w = gpu_float_variable(op, "filters", w, 4, _FILTERS)
        accs = [gpu_float_variable(op, "acc", a, 4, _IMAGES) for a in acc]
        device = common_device(op, dy, w, *accs)
        dtype = same_dtype(op, gradient=dy, filters=w)
        image_hw, shape = self._out_shape(dy, w, image_hw)
        if accs:
            shape = _check_acc(op, accs[0], shape, dtype)
        out = CudaArrayType(dtype, shape, device)()
        return Apply(self, [dy, w, image_hw, *accs], [out])

    def perform(self, node, inputs, output_storage):
        dy, w, image_hw = inputs[:3]
        acc = inputs[3] if self.accumulate else None
        output_storage[0][0] = image_acts(
            dy, w, image_hw, **self._params(), device=self.device_of(node), acc=acc
        )


class GpuWeightActs(WeightActsSkeleton, _GpuConvGrad):
    """Gradient wrt the filters on the GPU: ``(x, dy, filter_hw[, acc]) -> dw``.

    :class:`cc2ops.conv.WeightActs` on the GPU (shape rule and gradients:
    :class:`~cc2ops.conv.WeightActsSkeleton`), parameters as
    :class:`GpuFilterActs` plus ``accumulate``: with ``True`` the op takes a
    fourth input ``acc`` (F, C/groups, kh, kw) and returns ``acc + dw`` in
    acc's buffer (``destroy_map``; GEMM ``beta = 1``, no extra pass). ``x``
    (B, C, H, W) and ``dy`` (B, F, Ho, Wo) GPU variables of one dtype and
    device, ``filter_hw`` a host int vector (kh, kw); ``dw``
    (F, C/groups, kh, kw). Runs :func:`weight_acts`. Pullback
    ``GpuImageActs`` (x), ``GpuFilterActs`` (dy), the cotangent itself (acc).
    """

    def make_node(self, x: Any, dy: Any, filter_hw: Any, *acc: Any) -> Apply:
        op = self._name
        self._nargs((x, dy, filter_hw, *acc))
        x = gpu_float_variable(op, "images", x, 4, _IMAGES)
        dy = gpu_float_variable(op, "gradient", dy, 4, _GRADIENT)
        accs = [gpu_float_variable(op, "acc", a, 4, _FILTERS) for a in acc]
        device = common_device(op, x, dy, *accs)
        dtype = same_dtype(op, images=x, gradient=dy)
        filter_hw, shape = self._out_shape(x, dy, filter_hw)
        if accs:
            shape = _check_acc(op, accs[0], shape, dtype)
        out = CudaArrayType(dtype, shape, device)()
        return Apply(self, [x, dy, filter_hw, *accs], [out])

    def perform(self, node, inputs, output_storage):
        x, dy, filter_hw = inputs[:3]
        acc = inputs[3] if self.accumulate else None
        output_storage[0][0] = weight_acts(
            x, dy, filter_hw, **self._params(), device=self.device_of(node), acc=acc
        )


#: The GPU convolution ops by role (their skeletons' ``family``).
GPU_FAMILY = ConvFamily(GpuFilterActs, GpuImageActs, GpuWeightActs)
_GpuConv.family = GPU_FAMILY


# --------------------------------------------------------------------------
# lifting
# --------------------------------------------------------------------------


@register_lift(FilterActs)
def lift_filter_acts(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``FilterActs(x, w) -> host_from_gpu(GpuFilterActs(gpu(x), gpu(w)))``."""
    x, w = (to_gpu(v, device) for v in node.inputs)
    return [GpuFilterActs(**node.op._props_dict())(x, w)]


@register_lift(ImageActs)
def lift_image_acts(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``ImageActs(dy, w, hw) -> host_from_gpu(GpuImageActs(gpu(dy), gpu(w), hw))``
    (``hw`` stays a host int vector)."""
    dy, w, hw = node.inputs
    op = GpuImageActs(**node.op._props_dict())
    return [op(to_gpu(dy, device), to_gpu(w, device), hw)]


@register_lift(WeightActs)
def lift_weight_acts(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``WeightActs(x, dy, khw) -> host_from_gpu(GpuWeightActs(gpu(x), gpu(dy),
    khw))`` (``khw`` stays a host int vector)."""
    x, dy, khw = node.inputs
    op = GpuWeightActs(**node.op._props_dict())
    return [op(to_gpu(x, device), to_gpu(dy, device), khw)]


# --------------------------------------------------------------------------
# accumulation rewrite
# --------------------------------------------------------------------------


def _gpu_elemwise_class() -> type | None:
    try:
        from cc2ops.cuda.ops.tensor.elemwise import GpuElemwise
    except ImportError:
        return None
    return GpuElemwise


def _tracks() -> list[type] | None:
    cls = _gpu_elemwise_class()
    return [cls] if cls is not None else None


@node_rewriter(_tracks())
def local_gpu_conv_accumulate(fgraph, node):
    """``GpuElemwise{add}(acc, GpuWeightActs(x, dy, khw)) ->
    GpuWeightActs{accumulate}(x, dy, khw, acc)`` (likewise ``GpuImageActs``).

    Only when the gradient's output has no other client, ``acc`` has the
    result's dtype and shape (no broadcasting), and the destroy handler
    accepts ``acc`` being overwritten (not a protected input, not needed
    later): the rewrite is validated like PyTensor's in-place rewrites.
    """
    cls = _gpu_elemwise_class()
    if cls is None or not isinstance(node.op, cls):
        return None
    if not isinstance(getattr(node.op, "scalar_op", None), ps.Add):
        return None
    if len(node.inputs) != 2:
        return None
    clients = getattr(fgraph, "clients", {})
    for i in (1, 0):
        grad, acc = node.inputs[i], node.inputs[1 - i]
        owner = grad.owner
        if owner is None or not isinstance(owner.op, (GpuWeightActs, GpuImageActs)):
            continue
        if owner.op.accumulate or len(clients.get(grad, ())) != 1:
            continue
        if acc is grad or not isinstance(acc.type, CudaArrayType):
            continue
        if acc.type.dtype != grad.type.dtype or acc.type.ndim != 4:
            continue
        if acc.type.device != grad.type.device:
            continue
        if any(
            a == 1 and s != 1
            for a, s in zip(acc.type.shape, grad.type.shape, strict=True)
        ):
            continue  # acc would be broadcast
        old = node.outputs[0]
        if any(
            a is not None and s is not None and a != s
            for a, s in zip(acc.type.shape, old.type.shape, strict=True)
        ):
            continue
        new_op = type(owner.op)(**owner.op._params(), accumulate=True)
        try:
            new = new_op(*owner.inputs, acc)
        except (TypeError, ValueError):
            continue
        if new.type != old.type:
            try:
                new = old.type.filter_variable(new, allow_convert=True)
            except TypeError:
                continue
        copy_stack_trace([old, grad], new)
        return [new]
    return None


#: The accumulation rewrite as a graph pass of ``cc2ops_gpu_inplace``.
gpu_conv_accumulate = in2out(local_gpu_conv_accumulate, name="gpu_conv_accumulate")

if _tracks() is not None:
    # before the in-place elementwise pass, which would otherwise claim acc
    gpu_inplace_db.register(
        "gpu_conv_accumulate",
        gpu_conv_accumulate,
        "cc2ops_gpu",
        "inplace",
        position=-1,
    )
