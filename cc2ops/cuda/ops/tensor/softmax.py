"""Softmax, log-softmax and the softmax gradient on the GPU (one block per row).

``GpuSoftmax(axis)`` and ``GpuLogSoftmax(axis)`` are PyTensor's
``pytensor.tensor.special.Softmax`` / ``LogSoftmax`` over one axis;
``GpuSoftmaxGrad(axis)(dy, y)`` is ``(dy - sum(dy * y, axis)) * y``, the
gradient of softmax given its output ``y``. Kernels
(``kernels/softmax.cu``) are stable: the row maximum is subtracted before
``exp``, so logits of magnitude 1e4 give finite results.

PyTensor 3.0's ``fast_run`` keeps ``Softmax``/``LogSoftmax`` nodes (lifted
by the rules here); 3.3 inlines them into elementwise and reduction ops
before cc2ops lifts anything, and the elementwise/reduction GPU ops take
over.

Notes
-----
The reduced axis may be any single axis; inputs are made C-contiguous and
viewed as (outer, n, inner). float32 and float64.
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Apply, Variable
from pytensor.tensor.special import LogSoftmax, Softmax

from cc2ops.cuda.op import GpuOp, as_gpu_variable, common_device
from cc2ops.cuda.ops.tensor.basic import contiguous
from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.compile import (
    get_kernel,
    launch,
    register_namer,
    register_variants,
)
from cc2ops.cuda.runtime.device import get_device
from cc2ops.cuda.transfer import as_gpu, as_gpu_cotangent, as_host

__all__ = [
    "GpuSoftmax",
    "GpuLogSoftmax",
    "GpuSoftmaxGrad",
    "softmax_rows",
]

_BLOCK = 256
_OPS = ("softmax", "log_softmax", "softmax_grad")
_SHORT = {"float32": "f32", "float64": "f64"}


@register_namer("softmax")
def _name(op: str, dtype: str, block: int, **_: Any) -> str:
    return f"row_{op}_{_SHORT[dtype]}_b{block}"


def _consts(op: str, dtype: str) -> dict[str, Any]:
    return {"name": _name(op, dtype, _BLOCK), "op": op, "dtype": dtype, "block": _BLOCK}


@register_variants("softmax")
def _variants() -> list[dict[str, Any]]:
    return [_consts(op, dt) for op in _OPS for dt in ("float32", "float64")]


def _geometry(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    n = int(shape[axis])
    inner = prod(int(s) for s in shape[axis + 1 :])
    rows = prod(int(s) for s in shape) // n if n else 0
    return rows, n, inner


def softmax_rows(op: str, x: Any, axis: int, device: int, dy: Any = None) -> Any:
    """Run ``op`` ("softmax", "log_softmax", "softmax_grad") along ``axis``.

    ``x`` (``y`` for the gradient) and ``dy`` are GPUArrays of one shape and
    float dtype; returns a new C-contiguous array.
    """
    dtype = str(np.dtype(x.dtype))
    shape = tuple(int(s) for s in x.shape)
    axis = axis % max(len(shape), 1)
    out = array.empty(shape, dtype, device)
    rows, n, inner = _geometry(shape, axis)
    if rows == 0 or n == 0:
        return out
    args = [contiguous(x, device), out]
    if op == "softmax_grad":
        args.insert(0, contiguous(dy, device))
    fn = get_kernel("softmax", device, **_consts(op, dtype))
    grid = min(rows, get_device(device).multiprocessors * 16)
    launch(
        fn, grid, _BLOCK,
        [*args, np.int64(rows), np.int64(n), np.int64(inner)],
        device,
    )  # fmt: skip
    return out


def _single_axis(op: str, axis: Any, ndim: int) -> int:
    if axis is None:
        if ndim != 1:
            raise ValueError(f"{op}: axis=None is supported for 1-d inputs only")
        return 0
    if isinstance(axis, (tuple, list)):
        if len(axis) != 1:
            raise ValueError(f"{op}: exactly one axis is supported, got {tuple(axis)}")
        axis = axis[0]
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for {ndim} dims")
    return axis % ndim


def _float_gpu(op: str, role: str, x: Any) -> Variable:
    x = as_gpu_variable(x, op=op, role=role)
    if x.type.dtype not in _SHORT:
        raise TypeError(f"{op}: {role} must be float32 or float64, got {x.type.dtype}")
    if x.type.ndim < 1:
        raise TypeError(f"{op}: {role} must have at least 1 dim, got 0")
    return x


class _GpuRowOp(GpuOp):
    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)
    __props__ = ("axis",)
    _kernel_op = "softmax"

    def __init__(self, axis: int) -> None:
        self.axis = int(axis)

    def make_node(self, x: Any) -> Apply:
        op = type(self).__name__
        x = _float_gpu(op, "x", x)
        _single_axis(op, self.axis, x.type.ndim)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = softmax_rows(
            self._kernel_op, inputs[0], self.axis, self.device_of(node)
        )

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]


class GpuSoftmax(_GpuRowOp):
    """``softmax(x, axis)`` of a GPU array (stable; one block per row).

    Parameters
    ----------
    axis : int
        The normalised axis (any one axis of x).
    """

    _kernel_op = "softmax"

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        g = as_gpu_cotangent(g, self.device_of_var(inputs[0]))
        return [GpuSoftmaxGrad(self.axis)(g, outputs[0])]


class GpuLogSoftmax(_GpuRowOp):
    """``log_softmax(x, axis)`` of a GPU array: ``x - max - log(sum(exp(x - max)))``.

    Parameters
    ----------
    axis : int
    """

    _kernel_op = "log_softmax"

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        device = self.device_of_var(inputs[0])
        gh, yh = as_host(g), as_host(outputs[0])
        gx = gh - pt.exp(yh) * gh.sum(axis=self.axis, keepdims=True)
        return [as_gpu(gx, device)]


class GpuSoftmaxGrad(GpuOp):
    """``(dy - sum(dy * y, axis)) * y``: the softmax gradient from its output ``y``.

    Parameters
    ----------
    axis : int

    Notes
    -----
    dy and y have one shape and float dtype.
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("axis",)

    def __init__(self, axis: int) -> None:
        self.axis = int(axis)

    def make_node(self, dy: Any, y: Any) -> Apply:
        op = "GpuSoftmaxGrad"
        dy = _float_gpu(op, "dy", dy)
        y = _float_gpu(op, "y", y)
        common_device(op, dy, y)
        if dy.type.dtype != y.type.dtype or dy.type.ndim != y.type.ndim:
            raise TypeError(f"{op}: dy and y must match, got {dy.type} and {y.type}")
        for a, b in zip(dy.type.shape, y.type.shape, strict=True):
            if a is not None and b is not None and a != b:
                raise ValueError(
                    f"{op}: dy and y shapes differ: {dy.type.shape} and {y.type.shape}"
                )
        _single_axis(op, self.axis, y.type.ndim)
        return Apply(self, [dy, y], [y.type()])

    def perform(self, node, inputs, outputs):
        dy, y = inputs
        if tuple(dy.shape) != tuple(y.shape):
            raise ValueError(
                f"GpuSoftmaxGrad: dy and y shapes differ: {dy.shape} and {y.shape}"
            )
        outputs[0][0] = softmax_rows(
            "softmax_grad", y, self.axis, self.device_of(node), dy=dy
        )

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[1]]

    def pullback(self, inputs, outputs, cotangents):
        dy, y = inputs
        (g,) = cotangents
        device = self.device_of_var(y)
        dyh, yh, gh = as_host(dy), as_host(y), as_host(g)
        s = (dyh * yh).sum(axis=self.axis, keepdims=True)
        gs = (gh * yh).sum(axis=self.axis, keepdims=True)
        g_dy = gh * yh - yh * gs
        g_y = gh * (dyh - s) - dyh * gs
        return [as_gpu(g_dy, device), as_gpu(g_y, device)]


def _lift_axis(node: Apply) -> int | None:
    x = node.inputs[0]
    try:
        return _single_axis("softmax", node.op.axis, x.type.ndim)
    except ValueError:
        return None


@register_lift(Softmax)
def lift_softmax(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Softmax(axis)(host_from_gpu(x)) -> host_from_gpu(GpuSoftmax(axis)(x))``."""
    axis = _lift_axis(node)
    if axis is None or node.inputs[0].type.dtype not in _SHORT:
        return None
    return [GpuSoftmax(axis)(to_gpu(node.inputs[0], device))]


@register_lift(LogSoftmax)
def lift_log_softmax(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``LogSoftmax(axis)(host_from_gpu(x)) -> host_from_gpu(GpuLogSoftmax(axis)(x))``.

    Declines for several axes and non-float dtypes.
    """
    axis = _lift_axis(node)
    if axis is None or node.inputs[0].type.dtype not in _SHORT:
        return None
    return [GpuLogSoftmax(axis)(to_gpu(node.inputs[0], device))]
