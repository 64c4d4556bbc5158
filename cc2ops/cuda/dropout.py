"""Dropout on the GPU: ``GpuDropout``, the Philox bit rule of :mod:`cc2ops.dropout`.

``GpuDropout(p)(x, state)`` takes a GPU array ``x`` and the *host* dropout
state (the uint32 vector of :func:`cc2ops.dropout_state`): ``perform`` reads
its four words from host memory and passes them to ``kernels/dropout.cu`` as
kernel arguments, so there is no transfer node and no device-to-host read;
the state's counter advance (``DropoutAdvance``) stays a tiny host op. The
masks are bit-identical to the CPU op's for the same state value, and the
pullback is ``GpuDropout(p)`` of the cotangent with the same state (the same
mask). Kernel names: ``dropout_philox_f32`` / ``dropout_philox_f64``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import disconnected_type
from pytensor.graph.basic import Apply, Variable

from cc2ops.cuda import array
from cc2ops.cuda.compile import get_kernel, launch, register_variants
from cc2ops.cuda.device import get_device
from cc2ops.cuda.op import GpuOp, as_gpu_cotangent, as_gpu_variable
from cc2ops.dropout import (
    Dropout,
    _check_p,
    _check_state_value,
    _counter,
    _state_var,
    dropout_scale,
    keep_threshold,
)
from cc2ops.graph.lift import register_lift, to_gpu

__all__ = ["GpuDropout", "dropout_consts", "lift_dropout"]

_BLOCK = 256
_SHORT = {"float32": "f32", "float64": "f64"}


def dropout_consts(dtype: str) -> dict[str, Any]:
    """Template constants of ``kernels/dropout.cu`` for ``dtype``."""
    if dtype not in _SHORT:
        raise ValueError(f"GpuDropout: dtype must be float32 or float64, got {dtype}")
    return {"name": f"dropout_philox_{_SHORT[dtype]}", "dtype": dtype}


@register_variants("dropout")
def _dropout_variants() -> list[dict[str, Any]]:
    return [dropout_consts("float32"), dropout_consts("float64")]


class GpuDropout(GpuOp):
    """``x * mask / (1 - p)`` on the GPU with the mask of a host dropout state.

    Parameters
    ----------
    p : float
        Drop probability, ``0 <= p < 1``.

    Notes
    -----
    Inputs ``(x, state)``: ``x`` a float32/float64 GPU array of any shape
    (the element index is the C-order index; strided views are copied to C
    order first), ``state`` the host uint32 vector ``(key0, key1, counter_lo,
    counter_hi)``. See :mod:`cc2ops.dropout` for the bit rule.
    """

    __props__ = ("p",)

    def __init__(self, p: float) -> None:
        self.p = _check_p(p)

    def make_node(self, x: Any, state: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuDropout", role="x")
        if x.type.dtype not in _SHORT:
            raise TypeError(
                f"GpuDropout: x must be float32 or float64, got {x.type.dtype}"
            )
        state = _state_var("GpuDropout", state)
        return Apply(self, [x, state], [x.type()])

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        x, state = inputs
        state = np.asarray(state)
        _check_state_value("GpuDropout", state)
        device = self.device_of(node)
        src = array.ascontiguous(x, device)
        out = array.empty(tuple(x.shape), x.dtype, device)
        n = int(np.prod(x.shape, dtype=np.int64))
        if n:
            dtype = str(np.dtype(x.dtype))
            fn = get_kernel("dropout", device, **dropout_consts(dtype))
            blocks = -(-n // 4)
            dev = get_device(device)
            grid = max(1, min(-(-blocks // _BLOCK), dev.multiprocessors * 32))
            args = [
                src, out, np.int64(n), np.uint32(state[0]), np.uint32(state[1]),
                np.uint64(_counter(state)), np.uint64(keep_threshold(self.p)),
                dropout_scale(self.p, dtype),
            ]  # fmt: skip
            launch(fn, grid, _BLOCK, args, device)
        outputs[0][0] = out

    def _infer_shape(self, node: Apply, input_shapes: list[Any]) -> list[Any]:
        return [input_shapes[0]]

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        return [[True], [False]]

    def pullback(self, inputs, outputs, cotangents):
        x, state = inputs
        g = as_gpu_cotangent(cotangents[0], self.device_of_var(x))
        return [GpuDropout(self.p)(g, state), disconnected_type()]

    def __str__(self) -> str:
        return f"GpuDropout{{p={self.p}}}"


@register_lift(Dropout)
def lift_dropout(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Dropout(host_from_gpu(x), state) -> host_from_gpu(GpuDropout(x, state))``.

    The state stays a host input (read by ``perform``, no transfer).
    """
    x, state = node.inputs
    return [GpuDropout(node.op.p)(to_gpu(x, device), pt.as_tensor_variable(state))]
