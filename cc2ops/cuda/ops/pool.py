"""Max and average pooling on the GPU: the GPU ops of :mod:`cc2ops.pool`.

``GpuMaxPool``, ``GpuMaxPoolGrad``, ``GpuMaxPoolGradGrad``, ``GpuAvgPool`` and
``GpuAvgPoolGrad`` compute what their host ops compute (same ``__props__``:
``size``, ``stride``, ``start``; the window rule of :mod:`cc2ops.shapes`) on
bc01 arrays (B, C, H, W) of float32 or float64; c01b graphs reach them through
the builders' dimshuffles. Each shares its host op's skeleton
(:class:`cc2ops.pool.MaxPoolSkeleton`, ...: shape rule, pullback,
pushforward) and adds ``make_node`` and ``perform``; :data:`GPU_FAMILY` makes
the skeletons build GPU ops, so the family stays closed under differentiation
on the GPU. ``@register_lift`` rules move the host ops here in
``cc2ops.cuda.mode()``.

Kernels (``kernels/pool.cu``) are specialised on the window, stride, start,
dtype and index width, e.g. ``max_pool_fwd_s3_st2_f32``. Where whole planes
fit in shared memory the plane kernels run instead: the forward ones are also
specialised on the plane geometry (``max_pool_fwd_plane_s3_st2_f32_54x54_p2_v16``)
and run one persistent wave of blocks, each copying its next group of planes
in with ``cp.async`` while it pools the current one (about 6144 pixels per
group, :data:`_PLANE_PIXELS`: 72-77 % of the H200's copy ceiling at AlexNet's
sizes, ``benchmarks/sweep_pool.py``). The module-level
functions :func:`max_pool_forward`, :func:`max_pool_grad`,
:func:`max_pool_grad_grad`, :func:`avg_pool_forward` and :func:`avg_pool_grad`
launch them on GPUArrays (what ``perform`` runs; benchmarks call them
directly).

What the gradients reuse and recompute: :class:`GpuMaxPoolGrad` reuses the
forward output ``y`` and finds each window's first maximum by comparing ``x``
with ``y`` (gather: each input pixel visits the windows that cover it, no
atomics, deterministic); :class:`GpuAvgPoolGrad` needs only ``gy`` and the
image size and recomputes the clipped window counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pytensor.graph.basic import Apply, Variable

from cc2ops._op import FLOAT_DTYPES, same_dtype
from cc2ops.cuda.op import GpuOp, common_device, gpu_float_variable
from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.compile import (
    get_kernel,
    launch,
    register_namer,
    register_variants,
)
from cc2ops.cuda.transfer import GpuGradients
from cc2ops.cuda.type import CudaArrayType
from cc2ops.pool import (
    AvgPool,
    AvgPoolGrad,
    AvgPoolGradSkeleton,
    AvgPoolSkeleton,
    MaxPool,
    MaxPoolGrad,
    MaxPoolGradGrad,
    MaxPoolGradGradSkeleton,
    MaxPoolGradSkeleton,
    MaxPoolSkeleton,
    PoolFamily,
    image_hw_value,
)
from cc2ops.shapes import (
    pool_output_shape,
    pool_params,
)

__all__ = [
    "GpuMaxPool",
    "GpuMaxPoolGrad",
    "GpuMaxPoolGradGrad",
    "GpuAvgPool",
    "GpuAvgPoolGrad",
    "max_pool_forward",
    "max_pool_grad",
    "max_pool_grad_grad",
    "avg_pool_forward",
    "avg_pool_grad",
    "pool_kernel_name",
    "GPU_FAMILY",
]

Pair = tuple[int, int]
_BC01 = "(B, C, H, W)"
_BLOCK = 256
_KINDS = ("max_fwd", "max_grad", "max_gradgrad", "avg_fwd", "avg_grad")
#: The shared-memory kernels of the kinds that have one (whole planes per block).
_PLANE_KINDS = {
    "max_fwd": "max_fwd_plane",
    "avg_fwd": "avg_fwd_plane",
    "max_grad": "max_grad_plane",
}
#: The plane kinds specialised on the image geometry (persistent, double-buffered).
_FWD_PLANE_KINDS = ("max_fwd_plane", "avg_fwd_plane")
#: Input pixels a plane kernel's block aims for (per buffer), and its
#: shared-memory cap (both buffers of a forward kernel).
_PLANE_PIXELS = 6144  # benchmarks/sweep_pool.py: 72-77 % of the copy ceiling
_PLANE_SMEM = 48 * 1024
#: Cap on the persistent forward plane kernels' grid (None: what the device
#: holds at once); tests lower it so that blocks loop over many groups.
_PLANE_GRID: int | None = None
_DT = {"float32": "f32", "float64": "f64"}


# --------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------


def _pair_tag(prefix: str, p: Pair) -> str:
    def num(v: int) -> str:
        return f"m{-v}" if v < 0 else str(v)

    body = num(p[0]) if p[0] == p[1] else f"{num(p[0])}x{num(p[1])}"
    return f"_{prefix}{body}"


@register_namer("pool")
def pool_kernel_name(
    kind: str,
    sy: int,
    sx: int,
    ty: int,
    tx: int,
    oy: int,
    ox: int,
    dtype: str,
    wide: bool,
    **geometry: Any,
) -> str:
    """``max_pool_fwd_s3_st2_f32``-style names: kind, window, stride, start, dtype.

    The start appears only when it is not 0 (``_o1``, ``_om1`` for -1), the
    index width only when it is 64-bit (``_i64``); the forward plane kernels
    add their geometry (``_54x54_p1_v16``: plane, planes per block, copy width).
    """
    op, _, pas = kind.partition("_")
    name = f"{op}_pool_{pas}" + _pair_tag("s", (sy, sx)) + _pair_tag("st", (ty, tx))
    if (oy, ox) != (0, 0):
        name += _pair_tag("o", (oy, ox))
    name += f"_{_DT[dtype]}"
    if wide:
        name += "_i64"
    if "H" in geometry:
        g = geometry
        name += f"_{g['H']}x{g['W']}_p{g['ppb']}_v{g['vec']}"
    return name


def _consts(
    kind: str,
    size: Pair,
    stride: Pair,
    start: Pair,
    dtype: str,
    wide: bool,
    geometry: Any = None,
) -> dict[str, Any]:
    """Template constants; ``geometry`` = (H, W, Ho, Wo, ppb, vec) for the
    forward plane kinds (:data:`_FWD_PLANE_KINDS`), which are specialised on it."""
    c: dict[str, Any] = dict(
        kind=kind,
        sy=int(size[0]),
        sx=int(size[1]),
        ty=int(stride[0]),
        tx=int(stride[1]),
        oy=int(start[0]),
        ox=int(start[1]),
        dtype=str(dtype),
        wide=bool(wide),
    )
    if kind in _FWD_PLANE_KINDS:
        h, w, ho, wo, ppb, vec = (int(v) for v in geometry)
        c.update(H=h, W=w, Ho=ho, Wo=wo, ppb=ppb, vec=vec, threads=_BLOCK)
    c["name"] = pool_kernel_name(**c)
    return c


@register_variants("pool")
def _pool_variants() -> list[dict[str, Any]]:
    out = [_consts(k, (3, 3), (2, 2), (0, 0), "float32", False) for k in _KINDS]
    out.append(_consts("max_grad_plane", (3, 3), (2, 2), (0, 0), "float32", False))
    # AlexNet's pooling layers (16-byte copies) and an odd one (element copies)
    for kind in _FWD_PLANE_KINDS:
        for geometry in ((54, 54, 26, 26, 2, 16), (27, 27, 13, 13, 8, 16)):
            out.append(
                _consts(kind, (3, 3), (2, 2), (0, 0), "float32", False, geometry)
            )
    out.append(
        _consts("avg_fwd_plane", (2, 3), (3, 1), (1, -1), "float64", False,
                (7, 9, 2, 8, 3, 8))
    )  # fmt: skip
    out.append(_consts("max_grad_plane", (2, 3), (3, 1), (1, -1), "float64", False))
    out.append(_consts("max_fwd", (2, 3), (3, 1), (1, -1), "float64", True))
    out.append(_consts("max_grad", (2, 3), (3, 1), (1, -1), "float64", True))
    out.append(_consts("avg_grad", (2, 2), (1, 2), (0, 1), "float64", False))
    return out


def _launch(
    kind: str,
    args: Sequence[Any],
    n: int,
    wide: bool,
    size: Pair,
    stride: Pair,
    start: Pair,
    dtype: str,
    device: int,
) -> None:
    """Launch ``kind`` over ``n`` elements (one thread each, grid-stride)."""
    if n == 0:
        return
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(device)
    consts = _consts(kind, size, stride, start, dtype, wide)
    fn = get_kernel("pool", device, **consts)
    grid = max(1, min((n + _BLOCK - 1) // _BLOCK, dev.multiprocessors * 16))
    launch(fn, grid, _BLOCK, list(args), device)


def plane_plan(kind: str, image: tuple, pooled: tuple, itemsize: int) -> Any:
    """``(planes per block, shared bytes)`` of ``kind``'s plane kernel, or
    ``None`` when the kind has none or a plane does not fit in shared memory.

    Blocks take about :data:`_PLANE_PIXELS` input pixels; where a plane's size
    is not a multiple of 4, the count is a multiple of 4 (when at least 4) so
    that every block's planes start 16-byte aligned.
    """
    if kind not in _PLANE_KINDS:
        return None
    b, c, h, w = image
    hw, howo = h * w, pooled[2] * pooled[3]
    if hw == 0 or howo == 0:
        return None

    def pad(n: int) -> int:
        return -(-n * itemsize // 16) * 16

    def smem(ppb: int) -> int:
        if kind == "max_grad":
            return pad(ppb * hw) + 2 * pad(ppb * howo) + 4 * ppb * howo
        return 2 * pad(ppb * hw)  # double-buffered

    if smem(1) > _PLANE_SMEM:
        return None
    ppb = max(1, min(b * c, _PLANE_PIXELS // hw))
    while ppb > 1 and smem(ppb) > _PLANE_SMEM:
        ppb -= 1
    if hw % 4 and ppb >= 4:
        ppb -= ppb % 4
    return ppb, smem(ppb)


def _launch_plane(
    kind: str,
    arrays: Sequence[Any],
    image: tuple,
    pooled: tuple,
    size: Pair,
    stride: Pair,
    start: Pair,
    dtype: str,
    device: int,
) -> bool:
    """Launch ``kind``'s plane kernel if it applies; returns whether it did."""
    plan = plane_plan(kind, image, pooled, np.dtype(dtype).itemsize)
    if plan is None:
        return False
    ppb, smem = plan
    planes = image[0] * image[1]
    if not planes:
        return True
    groups = -(-planes // ppb)
    plane_kind = _PLANE_KINDS[kind]
    if plane_kind in _FWD_PLANE_KINDS:
        from cc2ops.cuda.runtime.device import get_device

        itemsize = np.dtype(dtype).itemsize
        chunk_bytes = ppb * image[2] * image[3] * itemsize
        aligned = array.ptr(arrays[0]) % 16 == 0 and chunk_bytes % 16 == 0
        geometry = (*image[2:], *pooled[2:], ppb, 16 if aligned else itemsize)
        consts = _consts(plane_kind, size, stride, start, dtype, False, geometry)
        fn = get_kernel("pool", device, **consts)
        dev = get_device(device)
        grid = min(groups, dev.multiprocessors * dev.resident_blocks(_BLOCK, smem))
        if _PLANE_GRID is not None:
            grid = max(1, min(grid, _PLANE_GRID))
        launch(fn, grid, _BLOCK, [*arrays, np.int64(planes)], device, shared_mem=smem)
        return True
    consts = _consts(plane_kind, size, stride, start, dtype, False)
    fn = get_kernel("pool", device, **consts)
    geometry = [np.int64(planes), np.int32(image[2]), np.int32(image[3]),
                np.int32(pooled[2]), np.int32(pooled[3]), np.int32(ppb)]  # fmt: skip
    launch(fn, groups, _BLOCK, [*arrays, *geometry], device, shared_mem=smem)
    return True


def _index_args(image: tuple, pooled: tuple) -> tuple[bool, list[Any]]:
    """(wide, [planes, H, W, Ho, Wo]): 64-bit indices when an array needs them."""
    b, c, h, w = image
    wide = max(b * c * h * w, b * c * pooled[2] * pooled[3]) >= 2**31
    planes = np.int64(b * c) if wide else np.uint32(b * c)
    return wide, [planes, np.int32(h), np.int32(w)] + [
        np.int32(pooled[2]),
        np.int32(pooled[3]),
    ]


def _check_array(op: str, role: str, a: Any) -> None:
    if len(a.shape) != 4:
        raise ValueError(f"{op}: {role} must have 4 dims {_BC01}, got {len(a.shape)}")
    if str(a.dtype) not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {role} must be float32 or float64, got {a.dtype}")


def _check_shape(op: str, role: str, got: Any, want: tuple, image: tuple) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(
            f"{op}: {role} shape {tuple(got)} does not match the pooled shape "
            f"{tuple(want)} of images {tuple(image)}"
        )


def _pooled(op: str, shape: tuple, size: Pair, stride: Pair, start: Pair) -> tuple:
    ho, wo = pool_output_shape(tuple(shape[2:]), size, stride, start, op)
    return (int(shape[0]), int(shape[1]), ho, wo)


def max_pool_forward(
    x: Any,
    size: Any,
    stride: Any = None,
    start: Any = 0,
    *,
    device: int = 0,
    op: str = "GpuMaxPool",
) -> Any:
    """Max pooling of a GPUArray ``x`` (B, C, H, W); returns ``y`` (B, C, Ho, Wo).

    Launched on ``device``'s stream (asynchronous). ``x`` may be a strided
    view (it is made contiguous first).
    """
    size, stride, start = pool_params(size, stride, start, op)
    _check_array(op, "images", x)
    x = array.ascontiguous(x, device)
    shape = tuple(int(s) for s in x.shape)
    out_shape = _pooled(op, shape, size, stride, start)
    y = array.empty(out_shape, x.dtype, device)
    if _launch_plane("max_fwd", [x, y], shape, out_shape, size, stride, start,
                     str(x.dtype), device):  # fmt: skip
        return y
    wide, geometry = _index_args(shape, out_shape)
    n = int(np.prod(out_shape))
    _launch("max_fwd", [x, y, *geometry], n, wide, size, stride, start, x.dtype, device)
    return y


def _max_backward(
    kind: str,
    x: Any,
    y: Any,
    t: Any,
    t_role: str,
    t_pooled: bool,
    size: Any,
    stride: Any,
    start: Any,
    device: int,
    op: str,
) -> Any:
    size, stride, start = pool_params(size, stride, start, op)
    for role, a in (("images", x), ("pooled output", y), (t_role, t)):
        _check_array(op, role, a)
    if not x.dtype == y.dtype == t.dtype:
        raise TypeError(
            f"{op}: inputs must share one float dtype, got images {x.dtype}, "
            f"pooled output {y.dtype}, {t_role} {t.dtype}"
        )
    image = tuple(int(s) for s in x.shape)
    pooled = _pooled(op, image, size, stride, start)
    _check_shape(op, "pooled output", y.shape, pooled, image)
    if t_pooled:
        _check_shape(op, t_role, t.shape, pooled, image)
    elif tuple(t.shape) != image:
        raise ValueError(
            f"{op}: {t_role} shape {tuple(t.shape)} must equal the image shape {image}"
        )
    x, y, t = (array.ascontiguous(a, device) for a in (x, y, t))
    out_shape = image if kind == "max_grad" else pooled
    out = array.empty(out_shape, x.dtype, device)
    if _launch_plane(kind, [x, y, t, out], image, pooled, size, stride, start,
                     str(x.dtype), device):  # fmt: skip
        return out
    wide, geometry = _index_args(image, pooled)
    n = int(np.prod(out_shape))
    _launch(
        kind, [x, y, t, out, *geometry], n, wide, size, stride, start, x.dtype,
        device,
    )  # fmt: skip
    return out


def max_pool_grad(
    x: Any,
    y: Any,
    gy: Any,
    size: Any,
    stride: Any = None,
    start: Any = 0,
    *,
    device: int = 0,
    op: str = "GpuMaxPoolGrad",
) -> Any:
    """Gradient of max pooling: GPUArrays ``x`` (B, C, H, W), ``y`` and ``gy``
    (B, C, Ho, Wo) give ``gx`` (B, C, H, W); each window's ``gy`` goes to its
    first pixel (row-major) equal to ``y``."""
    return _max_backward(
        "max_grad", x, y, gy, "output gradient", True, size, stride, start,
        device, op,
    )  # fmt: skip


def max_pool_grad_grad(
    x: Any,
    y: Any,
    ggx: Any,
    size: Any,
    stride: Any = None,
    start: Any = 0,
    *,
    device: int = 0,
    op: str = "GpuMaxPoolGradGrad",
) -> Any:
    """Adjoint of :func:`max_pool_grad` in ``gy``: ``ggx`` (B, C, H, W) at each
    window's first maximum, ``ggy`` (B, C, Ho, Wo)."""
    return _max_backward(
        "max_gradgrad", x, y, ggx, "input gradient", False, size, stride, start,
        device, op,
    )  # fmt: skip


def avg_pool_forward(
    x: Any,
    size: Any,
    stride: Any = None,
    start: Any = 0,
    *,
    device: int = 0,
    op: str = "GpuAvgPool",
) -> Any:
    """Average pooling of a GPUArray ``x`` (B, C, H, W) over clipped windows;
    returns ``y`` (B, C, Ho, Wo), each window divided by its pixel count."""
    size, stride, start = pool_params(size, stride, start, op)
    _check_array(op, "images", x)
    x = array.ascontiguous(x, device)
    shape = tuple(int(s) for s in x.shape)
    out_shape = _pooled(op, shape, size, stride, start)
    y = array.empty(out_shape, x.dtype, device)
    if _launch_plane("avg_fwd", [x, y], shape, out_shape, size, stride, start,
                     str(x.dtype), device):  # fmt: skip
        return y
    wide, geometry = _index_args(shape, out_shape)
    n = int(np.prod(out_shape))
    _launch("avg_fwd", [x, y, *geometry], n, wide, size, stride, start, x.dtype, device)
    return y


def avg_pool_grad(
    gy: Any,
    image_hw: Sequence[int],
    size: Any,
    stride: Any = None,
    start: Any = 0,
    *,
    device: int = 0,
    op: str = "GpuAvgPoolGrad",
) -> Any:
    """Gradient of average pooling: ``gy`` (B, C, Ho, Wo) and the image size
    ``(H, W)`` give ``gx`` (B, C, H, W), each pixel summing ``gy / count`` over
    the windows that hold it."""
    size, stride, start = pool_params(size, stride, start, op)
    _check_array(op, "output gradient", gy)
    h, w = image_hw_value(op, image_hw)
    b, c = int(gy.shape[0]), int(gy.shape[1])
    image = (b, c, h, w)
    pooled = _pooled(op, image, size, stride, start)
    _check_shape(op, "output gradient", gy.shape, pooled, image)
    gy = array.ascontiguous(gy, device)
    gx = array.empty(image, gy.dtype, device)
    wide, geometry = _index_args(image, pooled)
    n = b * c * h * w
    _launch(
        "avg_grad", [gy, gx, *geometry], n, wide, size, stride, start, gy.dtype,
        device,
    )  # fmt: skip
    return gx


# --------------------------------------------------------------------------
# ops: the skeletons of cc2ops.pool plus GPU make_node and perform
# --------------------------------------------------------------------------


class _GpuPool(GpuGradients, GpuOp):
    """The GPU pooling ops' base: their props, the GPU gradient hooks and the
    GPU op machinery (the rest is the host ops' skeletons)."""

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("size", "stride", "start")


class GpuMaxPool(MaxPoolSkeleton, _GpuPool):
    """Max pooling of GPU images: ``GpuMaxPool(size=...)(x) -> y``.

    :class:`cc2ops.pool.MaxPool` on the GPU: its parameters (``size``,
    ``stride`` defaulting to ``size``, ``start``), shape rule and gradients
    (:class:`~cc2ops.pool.MaxPoolSkeleton`). ``x`` (B, C, H, W)
    float32/float64 GPU variable; ``y`` (B, C, Ho, Wo) on the same device,
    windows clipped to the image, a NaN in a window makes it NaN. Pullback
    :class:`GpuMaxPoolGrad`, pushforward :class:`GpuMaxPoolGradGrad`.
    """

    def make_node(self, x: Any) -> Apply:
        x = gpu_float_variable(self._name, "images", x, 4, _BC01)
        shape = self._static_pooled(x.type.shape)
        out = CudaArrayType(x.type.dtype, shape, x.type.device)()
        return Apply(self, [x], [out])

    def perform(self, node, inputs, output_storage):
        (x,) = inputs
        output_storage[0][0] = max_pool_forward(
            x, **self._params(), device=self.device_of(node), op=self._name
        )


class _GpuMaxPoolBackward(_GpuPool):
    """The GPU backward ops' ``make_node``: ``op(x, y, t)`` on one device."""

    def make_node(self, x: Any, y: Any, t: Any) -> Apply:
        op = self._name
        x = gpu_float_variable(op, "images", x, 4, _BC01)
        y = gpu_float_variable(op, "pooled output", y, 4, _BC01)
        t = gpu_float_variable(op, self._t_role, t, 4, _BC01)
        device = common_device(op, x, y, t)
        same_dtype(op, **{"images": x, "pooled output": y, self._t_role: t})
        shape = self._backward_shape(x, y, t)
        out = CudaArrayType(x.type.dtype, shape, device)()
        return Apply(self, [x, y, t], [out])


class GpuMaxPoolGrad(MaxPoolGradSkeleton, _GpuMaxPoolBackward):
    """Gradient of :class:`GpuMaxPool` wrt its images: ``(x, y, gy) -> gx``.

    :class:`cc2ops.pool.MaxPoolGrad` on the GPU (parameters, shape rule and
    gradients: :class:`~cc2ops.pool.MaxPoolGradSkeleton`). ``x``
    (B, C, H, W), ``y`` and ``gy`` (B, C, Ho, Wo), GPU, one dtype.
    ``gx`` (B, C, H, W): each window's ``gy`` at the first pixel
    (row-major) equal to ``y``. Reuses the forward's ``y`` instead of
    recomputing the maxima; every input pixel gathers from the windows that
    cover it (deterministic, no atomics). Pullback wrt ``gy``
    :class:`GpuMaxPoolGradGrad`; wrt ``x`` and ``y`` zeros (piecewise
    constant), as the host op.
    """

    def perform(self, node, inputs, output_storage):
        x, y, gy = inputs
        output_storage[0][0] = max_pool_grad(
            x, y, gy, **self._params(), device=self.device_of(node), op=self._name
        )


class GpuMaxPoolGradGrad(MaxPoolGradGradSkeleton, _GpuMaxPoolBackward):
    """Adjoint of :class:`GpuMaxPoolGrad` in ``gy``: ``(x, y, ggx) -> ggy``.

    :class:`cc2ops.pool.MaxPoolGradGrad` on the GPU (parameters, shape rule
    and gradients: :class:`~cc2ops.pool.MaxPoolGradGradSkeleton`). ``x`` and
    ``ggx`` (B, C, H, W), ``y`` (B, C, Ho, Wo), GPU, one dtype;
    ``ggy`` (B, C, Ho, Wo) is ``ggx`` at each window's first maximum (0 where
    no pixel equals ``y``). One thread per window scans it in row-major
    order. Pullback wrt ``ggx`` :class:`GpuMaxPoolGrad`, wrt ``x``, ``y``
    zeros.
    """

    def perform(self, node, inputs, output_storage):
        x, y, ggx = inputs
        output_storage[0][0] = max_pool_grad_grad(
            x, y, ggx, **self._params(), device=self.device_of(node), op=self._name
        )


class GpuAvgPool(AvgPoolSkeleton, _GpuPool):
    """Average pooling of GPU images: ``GpuAvgPool(size=...)(x) -> y``.

    :class:`cc2ops.pool.AvgPool` on the GPU (parameters, shape rule and
    gradients: :class:`~cc2ops.pool.AvgPoolSkeleton`). ``x`` (B, C, H, W)
    float32/float64 GPU variable; ``y`` (B, C, Ho, Wo). Each window is
    clipped to the image and divided by its pixel count; sums accumulate in
    the input dtype. Pullback :class:`GpuAvgPoolGrad`, pushforward
    ``GpuAvgPool`` of the tangent.
    """

    def make_node(self, x: Any) -> Apply:
        x = gpu_float_variable(self._name, "images", x, 4, _BC01)
        shape = self._static_pooled(x.type.shape)
        out = CudaArrayType(x.type.dtype, shape, x.type.device)()
        return Apply(self, [x], [out])

    def perform(self, node, inputs, output_storage):
        (x,) = inputs
        output_storage[0][0] = avg_pool_forward(
            x, **self._params(), device=self.device_of(node), op=self._name
        )


class GpuAvgPoolGrad(AvgPoolGradSkeleton, _GpuPool):
    """Gradient of :class:`GpuAvgPool`: ``(gy, image_hw) -> gx``.

    :class:`cc2ops.pool.AvgPoolGrad` on the GPU (parameters, shape rule and
    gradients: :class:`~cc2ops.pool.AvgPoolGradSkeleton`). ``gy``
    (B, C, Ho, Wo) float32/float64 GPU variable and ``image_hw`` a
    host integer vector (H, W); ``gx`` (B, C, H, W). Each input pixel sums
    ``gy / count`` over the windows that hold it (gather, deterministic); the
    clipped counts are recomputed. Pullback wrt ``gy`` is ``GpuAvgPool`` of
    the cotangent; ``image_hw`` is disconnected.
    """

    def make_node(self, gy: Any, image_hw: Any) -> Apply:
        op = self._name
        gy = gpu_float_variable(op, "output gradient", gy, 4, _BC01)
        image_hw, (h, w) = self._image_hw_input(image_hw)
        image = (gy.type.shape[0], gy.type.shape[1], h, w)
        self._check_static(
            "output gradient", gy.type.shape, self._static_pooled(image), image
        )
        out = CudaArrayType(gy.type.dtype, image, gy.type.device)()
        return Apply(self, [gy, image_hw], [out])

    def perform(self, node, inputs, output_storage):
        gy, image_hw = inputs
        output_storage[0][0] = avg_pool_grad(
            gy, image_hw, **self._params(), device=self.device_of(node), op=self._name
        )


#: The GPU pooling ops by role (their skeletons' ``family``).
GPU_FAMILY = PoolFamily(
    GpuMaxPool, GpuMaxPoolGrad, GpuMaxPoolGradGrad, GpuAvgPool, GpuAvgPoolGrad
)
_GpuPool.family = GPU_FAMILY


# --------------------------------------------------------------------------
# lifting
# --------------------------------------------------------------------------


@register_lift(MaxPool)
def lift_max_pool(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``MaxPool(x) -> host_from_gpu(GpuMaxPool(gpu(x)))``."""
    return [GpuMaxPool(**node.op._props_dict())(to_gpu(node.inputs[0], device))]


@register_lift(MaxPoolGrad)
def lift_max_pool_grad(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``MaxPoolGrad(x, y, gy) -> host_from_gpu(GpuMaxPoolGrad(gpu(x), gpu(y),
    gpu(gy)))``."""
    x, y, gy = (to_gpu(v, device) for v in node.inputs)
    return [GpuMaxPoolGrad(**node.op._props_dict())(x, y, gy)]


@register_lift(MaxPoolGradGrad)
def lift_max_pool_grad_grad(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``MaxPoolGradGrad(x, y, ggx) -> host_from_gpu(GpuMaxPoolGradGrad(...))``."""
    x, y, ggx = (to_gpu(v, device) for v in node.inputs)
    return [GpuMaxPoolGradGrad(**node.op._props_dict())(x, y, ggx)]


@register_lift(AvgPool)
def lift_avg_pool(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``AvgPool(x) -> host_from_gpu(GpuAvgPool(gpu(x)))``."""
    return [GpuAvgPool(**node.op._props_dict())(to_gpu(node.inputs[0], device))]


@register_lift(AvgPoolGrad)
def lift_avg_pool_grad(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``AvgPoolGrad(gy, hw) -> host_from_gpu(GpuAvgPoolGrad(gpu(gy), hw))``.

    ``image_hw`` stays a host int vector (the kernel takes it as arguments).
    """
    gy, hw = node.inputs
    return [GpuAvgPoolGrad(**node.op._props_dict())(to_gpu(gy, device), hw)]
