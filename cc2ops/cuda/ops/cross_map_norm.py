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

from typing import Any

import numpy as np
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply, Variable

from cc2ops._op import FLOAT_DTYPES
from cc2ops.cross_map_norm import CrossMapNorm, CrossMapNormGrad, _check_params
from cc2ops.cuda.op import GpuOp, as_gpu_variable, common_device
from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.compile import (
    get_kernel,
    launch,
    register_namer,
    register_variants,
)
from cc2ops.cuda.transfer import as_gpu_cotangent
from cc2ops.cuda.type import CudaArrayType

__all__ = [
    "MAX_SIZE",
    "GpuCrossMapNorm",
    "GpuCrossMapNormGrad",
    "cross_map_norm_forward",
    "cross_map_norm_grad",
    "cross_map_norm_kernel_name",
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


def cross_map_norm_forward(
    x: Any,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    blocked: bool = False,
    *,
    device: int = 0,
    op: str = "GpuCrossMapNorm",
) -> Any:
    """Cross-map normalisation of a GPUArray ``x`` (B, C, H, W); returns ``y``.

    Launched on ``device``'s stream (asynchronous); ``x`` may be a strided
    view (made contiguous first).
    """
    size, alpha, beta, k, blocked = _check_params(op, size, alpha, beta, k, blocked)
    _check_size(op, size)
    _check_array(op, "x", x)
    x = array.ascontiguous(x, device)
    y = array.empty(x.shape, x.dtype, device)
    shape = tuple(int(s) for s in x.shape)
    _launch("fwd", [x, y], shape, size, alpha, beta, k, blocked, str(x.dtype), device)
    return y


def cross_map_norm_grad(
    x: Any,
    gy: Any,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    blocked: bool = False,
    *,
    device: int = 0,
    op: str = "GpuCrossMapNormGrad",
) -> Any:
    """Gradient of cross-map normalisation: GPUArrays ``x`` and ``gy``
    (B, C, H, W) give ``gx`` (B, C, H, W); the denominators are recomputed
    from ``x``."""
    size, alpha, beta, k, blocked = _check_params(op, size, alpha, beta, k, blocked)
    _check_size(op, size)
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
# ops
# --------------------------------------------------------------------------


def _gpu_x(op: str, role: str, x: Any) -> Variable:
    x = as_gpu_variable(x, op=op, role=role)
    if x.type.ndim != 4:
        raise TypeError(f"{op}: {role} must have 4 dims {_BC01}, got {x.type.ndim}")
    if x.type.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {role} must be float32 or float64, got {x.type.dtype}")
    return x


def _cotangent(g: Variable, dtype: str, device: int) -> Variable:
    if isinstance(g.type, DisconnectedType) or not hasattr(g.type, "dtype"):
        return as_gpu_cotangent(g, device)
    if g.type.dtype != dtype:
        from cc2ops.cuda.transfer import as_host

        g = as_host(g).astype(dtype)
    return as_gpu_cotangent(g, device)


class _GpuCrossMapBase(GpuOp):
    __props__ = ("size", "alpha", "beta", "k", "blocked")

    def __init__(
        self,
        *,
        size: int = 5,
        alpha: float = 1e-4,
        beta: float = 0.75,
        k: float = 2.0,
        blocked: bool = False,
    ) -> None:
        name = type(self).__name__
        self.size, self.alpha, self.beta, self.k, self.blocked = _check_params(
            name, size, alpha, beta, k, blocked
        )
        _check_size(name, self.size)

    @property
    def _params(self) -> dict[str, Any]:
        return {p: getattr(self, p) for p in self.__props__}

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]


class GpuCrossMapNorm(_GpuCrossMapBase):
    """Cross-map response normalisation of GPU images (bc01).

    ``GpuCrossMapNorm(size=..., alpha=..., beta=..., k=..., blocked=...)(x)``:
    ``x`` (B, C, H, W) float32/float64 GPU variable, ``y`` of the same shape,
    dtype and device.

    Notes
    -----
    ``size`` must be <= :data:`MAX_SIZE` (the lifting rule leaves larger
    windows on the host). Sums of squares accumulate in the data's dtype.
    The gradient is :class:`GpuCrossMapNormGrad`.
    """

    def make_node(self, x: Any) -> Apply:
        x = _gpu_x("GpuCrossMapNorm", "x", x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, output_storage):
        (x,) = inputs
        output_storage[0][0] = cross_map_norm_forward(
            x, **self._params, device=self.device_of(node), op="GpuCrossMapNorm"
        )

    def pullback(self, inputs, outputs, cotangents):
        (x,) = inputs
        gy = _cotangent(cotangents[0], x.type.dtype, x.type.device)
        return [GpuCrossMapNormGrad(**self._params)(x, gy)]


class GpuCrossMapNormGrad(_GpuCrossMapBase):
    """Gradient of :class:`GpuCrossMapNorm` wrt its input: ``(x, gy) -> gx``.

    ``x`` and ``gy`` (B, C, H, W), one float dtype, one device; ``gx`` the
    same shape.

    Notes
    -----
    Recomputes the denominators from ``x`` (reads ``x`` and ``gy`` once,
    writes ``gx`` once; nothing of the forward is reused). Its own pullback
    (second derivatives) is the host op's: the forward written with PyTensor
    ops and differentiated, on host views of the inputs, its results moved
    to this device; ``cc2ops.cuda.mode()`` lifts that graph's elementwise
    work back to the GPU.
    """

    def make_node(self, x: Any, gy: Any) -> Apply:
        op = "GpuCrossMapNormGrad"
        x = _gpu_x(op, "x", x)
        gy = _gpu_x(op, "gy", gy)
        device = common_device(op, x, gy)
        if x.type.dtype != gy.type.dtype:
            raise TypeError(
                f"{op}: inputs must share one float dtype, got x {x.type.dtype}, gy "
                f"{gy.type.dtype}"
            )
        shape = []
        for xs, gs in zip(x.type.shape, gy.type.shape, strict=True):
            if xs is not None and gs is not None and xs != gs:
                raise ValueError(
                    f"{op}: gy shape must equal x shape {_BC01}, got gy "
                    f"{gy.type.shape} and x {x.type.shape}"
                )
            shape.append(xs if xs is not None else gs)
        out = CudaArrayType(x.type.dtype, tuple(shape), device)()
        return Apply(self, [x, gy], [out])

    def perform(self, node, inputs, output_storage):
        x, gy = inputs
        output_storage[0][0] = cross_map_norm_grad(
            x, gy, **self._params, device=self.device_of(node), op="GpuCrossMapNormGrad"
        )

    def pullback(self, inputs, outputs, cotangents):
        from cc2ops.cuda.transfer import as_host

        x, gy = inputs
        device = x.type.device
        ggx = cotangents[0]
        if isinstance(ggx.type, DisconnectedType):
            return [ggx, ggx]
        hx, hgy = as_host(x), as_host(gy)
        host_op = CrossMapNormGrad(**self._params)
        out = host_op(hx, hgy)
        grads = host_op.pullback([hx, hgy], [out], [as_host(ggx)])
        return [_cotangent(g, x.type.dtype, device) for g in grads]


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
