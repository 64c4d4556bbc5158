"""Cross-map response normalisation on the GPU: the GPU ops of
:mod:`cc2ops.cross_map_norm`.

``GpuCrossMapNorm`` and ``GpuCrossMapNormGrad`` compute what
:class:`~cc2ops.cross_map_norm.CrossMapNorm` and
:class:`~cc2ops.cross_map_norm.CrossMapNormGrad` compute (same ``__props__``:
``size``, ``alpha``, ``beta``, ``k``, ``blocked``; the formula is in
:mod:`cc2ops.cross_map_norm`) on bc01 GPU arrays (B, C, H, W) of float32 or
float64, any C; c01b graphs reach them through the builder's dimshuffles.
``@register_lift`` rules move the host ops here in ``cc2ops.cuda.mode()``.

Kernels (``kernels/cross_map_norm.cu``): one thread per (b, h, w) column walks
the channels with the last ``size`` inputs in registers, so each input is
read once and each output written once; they are specialised on size,
blocked, channel count and dtype (``cross_map_norm_fwd_n5_c64_f32``). The
module functions :func:`cross_map_norm_forward` and
:func:`cross_map_norm_grad` launch them on GPUArrays (``perform`` runs them;
benchmarks call them directly).

What the gradient recomputes: :class:`GpuCrossMapNormGrad` takes ``x`` and
``gy`` only and recomputes every denominator ``d`` (and ``d**-beta``) from
``x`` in the same sliding pass; it reuses no forward result (the forward's
output is not an input), so the forward keeps nothing alive.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
from pytensor.graph.basic import Apply, Variable

from cc2ops._op import FLOAT_DTYPES, same_dtype
from cc2ops.cross_map_norm import (
    CrossMapNorm,
    CrossMapNormFamily,
    CrossMapNormGrad,
    CrossMapNormGradSkeleton,
    CrossMapNormParams,
    CrossMapNormSkeleton,
    cross_map_norm,
)
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
from cc2ops.shapes import cross_map_params

__all__ = [
    "MAX_SIZE",
    "GpuCrossMapNorm",
    "GpuCrossMapNormGrad",
    "cross_map_norm_forward",
    "cross_map_norm_grad",
    "cross_map_norm_kernel_name",
    "GPU_FAMILY",
]

#: The largest window the kernels keep in registers.
MAX_SIZE = 32
_BC01 = "(B, C, H, W)"
_BLOCK = 128
_DT = {"float32": "f32", "float64": "f64"}


# --------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------


@register_namer("cross_map_norm")
def cross_map_norm_kernel_name(
    kind: str,
    size: int,
    channels: int,
    blocked: bool,
    dtype: str,
    wide: bool,
    chunk: int = 0,
    **_: Any,
) -> str:
    """``cross_map_norm_fwd_n5_c64_f32_ch16``: ``_blk`` for blocked, ``_i64`` for
    wide, ``_ch<k>`` when a thread walks k channels of more."""
    chunk = chunk or channels
    name = f"cross_map_norm_{kind}_n{size}"
    if blocked:
        name += "_blk"
    name += f"_c{channels}_{_DT[dtype]}"
    if wide:
        name += "_i64"
    if chunk < channels:
        name += f"_ch{chunk}"
    return name


#: Channels per thread of the overlapping kernels (more threads for layers
#: with few columns); up to this many channels a thread takes them all.
CHUNK = 16


def channel_chunk(channels: int, blocked: bool) -> int:
    """Channels one thread walks: all of them when blocked or few, else CHUNK."""
    if blocked or channels <= CHUNK + CHUNK // 2:
        return max(1, int(channels))
    return CHUNK


def _consts(
    kind: str, size: int, channels: int, blocked: bool, dtype: str, wide: bool
) -> dict[str, Any]:
    c: dict[str, Any] = dict(
        kind=kind,
        size=int(size),
        channels=int(channels),
        blocked=bool(blocked),
        dtype=str(dtype),
        wide=bool(wide),
        chunk=channel_chunk(channels, blocked),
    )
    c["name"] = cross_map_norm_kernel_name(**c)
    return c


@register_variants("cross_map_norm")
def _cross_map_norm_variants() -> list[dict[str, Any]]:
    out = []
    for kind in ("fwd", "grad"):
        out.append(_consts(kind, 5, 64, False, "float32", False))
        out.append(_consts(kind, 5, 192, False, "float32", False))
        out.append(_consts(kind, 4, 37, False, "float64", False))
        out.append(_consts(kind, 3, 7, True, "float32", False))
        out.append(_consts(kind, 2, 5, False, "float64", True))
    out.append(_consts("grad", 7, 3, False, "float64", False))
    out.append(_consts("fwd", 1, 1, False, "float32", False))
    return out


def _check_size(op: str, size: int) -> None:
    if size > MAX_SIZE:
        raise ValueError(
            f"{op}: size must be <= {MAX_SIZE} (the kernels keep the window in "
            f"registers), got {size}"
        )


def _check_array(op: str, role: str, a: Any) -> None:
    if len(a.shape) != 4:
        raise ValueError(f"{op}: {role} must have 4 dims {_BC01}, got {len(a.shape)}")
    if str(a.dtype) not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {role} must be float32 or float64, got {a.dtype}")


def _launch(
    kind: str,
    arrays: list[Any],
    shape: tuple[int, ...],
    size: int,
    alpha: float,
    beta: float,
    k: float,
    blocked: bool,
    dtype: str,
    device: int,
) -> None:
    b, c, h, w = shape
    columns = b * h * w
    if columns == 0 or c == 0:
        return
    from cc2ops.cuda.runtime.device import get_device

    # 64-bit indices when an element index or the thread count needs them
    wide = max(b * c * h * w, columns * -(-c // channel_chunk(c, blocked))) >= 2**31
    t = np.dtype(dtype).type
    scalars = [t(k), t(alpha / size), t(-beta)]
    if kind == "grad":
        scalars.append(t(2.0 * alpha * beta / size))
    fn = get_kernel(
        "cross_map_norm", device, **_consts(kind, size, c, blocked, dtype, wide)
    )
    dev = get_device(device)
    threads = columns * -(-c // channel_chunk(c, blocked))
    grid = max(1, min((threads + _BLOCK - 1) // _BLOCK, dev.multiprocessors * 32))
    idx = np.int64(columns) if wide else np.uint32(columns)
    launch(fn, grid, _BLOCK, [*arrays, idx, np.int32(h * w), *scalars], device)


#: the builder's parameters and defaults (:func:`cc2ops.cross_map_norm`), which
#: the launchers take as keywords
_PARAM_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(cross_map_norm).parameters.items()
    if name in ("size", "alpha", "beta", "k", "blocked")
}


def _launch_params(op: str, params: dict) -> tuple:
    """The launchers' keywords checked as the builder checks them, defaults
    filled in: ``(size, alpha, beta, k, blocked)``."""
    unknown = sorted(set(params) - set(_PARAM_DEFAULTS))
    if unknown:
        raise TypeError(
            f"{op}: unknown parameter(s) {unknown}; the parameters are "
            f"{list(_PARAM_DEFAULTS)}"
        )
    values = [params.get(name, default) for name, default in _PARAM_DEFAULTS.items()]
    size, alpha, beta, k, blocked = cross_map_params(op, *values)
    _check_size(op, size)
    return size, alpha, beta, k, blocked


def cross_map_norm_forward(
    x: Any, *, device: int = 0, op: str = "GpuCrossMapNorm", **params: Any
) -> Any:
    """Cross-map normalisation of a GPUArray ``x`` (B, C, H, W); returns ``y``.

    ``params`` are :func:`cc2ops.cross_map_norm`'s keywords (``size``,
    ``alpha``, ``beta``, ``k``, ``blocked``; its defaults where left out).
    Launched on ``device``'s stream (asynchronous); ``x`` may be a strided
    view (made contiguous first).
    """
    size, alpha, beta, k, blocked = _launch_params(op, params)
    _check_array(op, "x", x)
    x = array.ascontiguous(x, device)
    y = array.empty(x.shape, x.dtype, device)
    shape = tuple(int(s) for s in x.shape)
    _launch("fwd", [x, y], shape, size, alpha, beta, k, blocked, str(x.dtype), device)
    return y


def cross_map_norm_grad(
    x: Any, gy: Any, *, device: int = 0, op: str = "GpuCrossMapNormGrad", **params: Any
) -> Any:
    """Gradient of cross-map normalisation: GPUArrays ``x`` and ``gy``
    (B, C, H, W) give ``gx`` (B, C, H, W); the denominators are recomputed
    from ``x``. ``params`` as for :func:`cross_map_norm_forward`."""
    size, alpha, beta, k, blocked = _launch_params(op, params)
    _check_array(op, "x", x)
    _check_array(op, "gy", gy)
    if gy.dtype != x.dtype:
        raise TypeError(f"{op}: gy dtype ({gy.dtype}) must equal x dtype ({x.dtype})")
    if tuple(gy.shape) != tuple(x.shape):
        raise ValueError(
            f"{op}: gy shape must equal x shape {_BC01}, got gy {tuple(gy.shape)} "
            f"and x {tuple(x.shape)}"
        )
    x = array.ascontiguous(x, device)
    gy = array.ascontiguous(gy, device)
    gx = array.empty(x.shape, x.dtype, device)
    shape = tuple(int(s) for s in x.shape)
    _launch(
        "grad", [x, gy, gx], shape, size, alpha, beta, k, blocked, str(x.dtype), device
    )
    return gx


# --------------------------------------------------------------------------
# ops: the skeletons of cc2ops.cross_map_norm plus GPU make_node and perform
# --------------------------------------------------------------------------


class _GpuCrossMapBase(CrossMapNormParams, GpuGradients, GpuOp):
    """The GPU ops' base: the host props (``size`` at most :data:`MAX_SIZE`),
    the GPU gradient hooks and the GPU op machinery."""

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("size", "alpha", "beta", "k", "blocked")

    def _check_props(self) -> None:
        _check_size(type(self).__name__, self.size)


class GpuCrossMapNorm(CrossMapNormSkeleton, _GpuCrossMapBase):
    """Cross-map response normalisation of GPU images (bc01).

    ``GpuCrossMapNorm(size=..., alpha=..., beta=..., k=..., blocked=...)(x)``:
    ``x`` (B, C, H, W) float32/float64 GPU variable, ``y`` of the same shape,
    dtype and device.

    Notes
    -----
    :class:`cc2ops.cross_map_norm.CrossMapNorm` on the GPU (parameters, shape
    rule and gradient: :class:`~cc2ops.cross_map_norm.CrossMapNormSkeleton`);
    ``size`` must be <= :data:`MAX_SIZE` (the lifting rule leaves larger
    windows on the host). Sums of squares accumulate in the data's dtype.
    The gradient is :class:`GpuCrossMapNormGrad`.
    """

    def make_node(self, x: Any) -> Apply:
        x = gpu_float_variable("GpuCrossMapNorm", "x", x, 4, _BC01)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, output_storage):
        (x,) = inputs
        output_storage[0][0] = cross_map_norm_forward(
            x, **self._params(), device=self.device_of(node), op="GpuCrossMapNorm"
        )


class GpuCrossMapNormGrad(CrossMapNormGradSkeleton, _GpuCrossMapBase):
    """Gradient of :class:`GpuCrossMapNorm` wrt its input: ``(x, gy) -> gx``.

    ``x`` and ``gy`` (B, C, H, W), one float dtype, one device; ``gx`` the
    same shape.

    Notes
    -----
    Recomputes the denominators from ``x`` (reads ``x`` and ``gy`` once,
    writes ``gx`` once; nothing of the forward is reused). Its own pullback
    (second derivatives) is the host op's
    (:class:`~cc2ops.cross_map_norm.CrossMapNormGradSkeleton`): the forward
    written with PyTensor ops and differentiated, on host views of the
    inputs, its results moved to this device; ``cc2ops.cuda.mode()`` lifts
    that graph's elementwise work back to the GPU.
    """

    def make_node(self, x: Any, gy: Any) -> Apply:
        op = "GpuCrossMapNormGrad"
        x = gpu_float_variable(op, "x", x, 4, _BC01)
        gy = gpu_float_variable(op, "gy", gy, 4, _BC01)
        device = common_device(op, x, gy)
        same_dtype(op, x=x, gy=gy)
        out = CudaArrayType(x.type.dtype, self._grad_shape(x, gy), device)()
        return Apply(self, [x, gy], [out])

    def perform(self, node, inputs, output_storage):
        x, gy = inputs
        output_storage[0][0] = cross_map_norm_grad(
            x,
            gy,
            **self._params(),
            device=self.device_of(node),
            op="GpuCrossMapNormGrad",
        )


#: The GPU ops by role (their skeletons' ``family``).
GPU_FAMILY = CrossMapNormFamily(GpuCrossMapNorm, GpuCrossMapNormGrad)
_GpuCrossMapBase.family = GPU_FAMILY


# --------------------------------------------------------------------------
# lifting
# --------------------------------------------------------------------------


@register_lift(CrossMapNorm)
def lift_cross_map_norm(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``CrossMapNorm(x) -> host_from_gpu(GpuCrossMapNorm(gpu(x)))``.

    Declines for ``size > MAX_SIZE``.
    """
    if node.op.size > MAX_SIZE:
        return None
    return [GpuCrossMapNorm(**node.op._props_dict())(to_gpu(node.inputs[0], device))]


@register_lift(CrossMapNormGrad)
def lift_cross_map_norm_grad(
    fgraph: Any, node: Apply, device: int
) -> list[Variable] | None:
    """``CrossMapNormGrad(x, gy) -> host_from_gpu(GpuCrossMapNormGrad(gpu(x),
    gpu(gy)))``; declines for ``size > MAX_SIZE``."""
    if node.op.size > MAX_SIZE:
        return None
    x, gy = (to_gpu(v, device) for v in node.inputs)
    return [GpuCrossMapNormGrad(**node.op._props_dict())(x, gy)]
