"""Dropout on the GPU: ``GpuDropout`` and ``GpuDropoutAdvance``, the bit rule of
:mod:`cc2ops.dropout`.

``GpuDropout(p)(x, state)`` takes a GPU array ``x`` and a dropout state
(the uint32 vector ``(key0, key1, counter_lo, counter_hi)`` of
:func:`cc2ops.dropout_state`), which may live in either place:

- a *GPU* state (``dropout_state(seed, device=d)``, a
  :func:`cc2ops.cuda.shared` variable): the kernel reads the four words from
  device memory (the state's pointer is the kernel argument), and the state's
  default update is :class:`GpuDropoutAdvance`, a one-thread kernel that
  writes the state with its 64-bit counter advanced by ``ceil(x.size / 4)``.
  A training step then has no host node and no host read for dropout;
- a *host* state (``dropout_state(seed)``): ``perform`` reads the four words
  from host memory and passes them as kernel arguments (no transfer node),
  and the advance is the host op ``DropoutAdvance``.

The masks are bit-identical to the CPU op's for the same state value,
wherever the state lives. The pullback (and the pushforward) is ``GpuDropout(p)``
of the cotangent with the same state variable, as on the host
(:class:`cc2ops.dropout.DropoutSkeleton`): a compiled function reads every state's value
from before its update for the whole call and stores the updates after all
nodes ran (PyTensor's VMs, which the GPU mode's linker uses unchanged), so
forward and backward use the same mask. Kernel names:
``dropout_philox_f32`` / ``dropout_philox_f64`` (host state),
``dropout_philox_dstate_f32`` / ``dropout_philox_dstate_f64`` (GPU state),
``dropout_advance``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Apply, Variable

from cc2ops import seam
from cc2ops.cuda.op import GpuOp, as_gpu_variable
from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.compile import get_kernel, launch, register_variants
from cc2ops.cuda.runtime.device import get_device
from cc2ops.cuda.transfer import (
    GpuGradients,
    HostFromGpu,
    as_gpu,
    gpu_from_host,
    host_from_gpu,
)
from cc2ops.cuda.type import CudaArrayType, is_gpu_variable
from cc2ops.cuda.type import shared as gpu_shared
from cc2ops.dropout import (
    Dropout,
    DropoutAdvanceSkeleton,
    DropoutFamily,
    DropoutSkeleton,
    check_p,
    check_state_value,
    dropout_scale,
    keep_threshold,
    state_counter,
    state_variable,
)

__all__ = [
    "GpuDropout",
    "GpuDropoutAdvance",
    "dropout_consts",
    "dropout_advance_consts",
    "lift_dropout",
    "GPU_FAMILY",
]

_BLOCK = 256
_SHORT = {"float32": "f32", "float64": "f64"}
_STATES = ("host", "device")


def dropout_consts(dtype: str, state: str = "host") -> dict[str, Any]:
    """Template constants of the mask kernel of ``kernels/dropout.cu``.

    Parameters
    ----------
    dtype : {"float32", "float64"}
    state : {"host", "device"}
        Where the kernel gets the key and counter: kernel arguments, or the
        4-word state in device memory.
    """
    if dtype not in _SHORT:
        raise ValueError(f"GpuDropout: dtype must be float32 or float64, got {dtype}")
    if state not in _STATES:
        raise ValueError(f"GpuDropout: state must be 'host' or 'device', got {state!r}")
    tag = "dstate_" if state == "device" else ""
    return {
        "name": f"dropout_philox_{tag}{_SHORT[dtype]}",
        "kind": "mask",
        "dtype": dtype,
        "state": state,
    }


def dropout_advance_consts() -> dict[str, Any]:
    """Template constants of the counter-advance kernel of ``kernels/dropout.cu``.

    The template declares every constant it names, so the advance kernel also
    gets ``dtype`` (its word type, uint32) and ``state`` ("device").
    """
    return {"name": "dropout_advance", "kind": "advance", "dtype": "uint32",
            "state": "device"}  # fmt: skip


@register_variants("dropout")
def _dropout_variants() -> list[dict[str, Any]]:
    return [
        dropout_consts("float32"),
        dropout_consts("float64"),
        dropout_consts("float32", "device"),
        dropout_consts("float64", "device"),
        dropout_advance_consts(),
    ]


def _is_gpu(v: Any) -> bool:
    return isinstance(getattr(v, "type", None), CudaArrayType)


def _gpu_state_var(op: str, state: Variable, device: int) -> Variable:
    """A GPU dropout state checked for ``op``: uint32, one dim, on ``device``."""
    if state.type.dtype != "uint32" or state.type.ndim != 1:
        raise TypeError(
            f"{op}: state must be the uint32 vector of dropout_state(), got "
            f"{state.type}"
        )
    if state.type.device != device:
        raise ValueError(
            f"{op}: the state lives on device {state.type.device}, x on device {device}"
        )
    return state


class _GpuBase(GpuGradients, GpuOp):
    """The GPU ops' base: the GPU gradient hooks and op machinery."""


class GpuDropout(DropoutSkeleton, _GpuBase):
    """``x * mask / (1 - p)`` on the GPU with the mask of a dropout state.

    :class:`cc2ops.dropout.Dropout` on the GPU (parameter ``p``, shape rule,
    pullback and pushforward: :class:`~cc2ops.dropout.DropoutSkeleton`).
    Inputs ``(x, state)``: ``x`` a float32/float64 GPU array of any shape
    (the element index is the C-order index; strided views are copied to C
    order first), ``state`` the uint32 vector ``(key0, key1, counter_lo,
    counter_hi)``, either a host tensor (read by ``perform``) or a GPU array
    on ``x``'s device (read by the kernel). See :mod:`cc2ops.dropout` for the
    bit rule.
    """

    __props__ = ("p",)
    # replayed from launch tapes (cc2ops.cuda.runtime.tape) when the state is
    # on the GPU: the kernel reads key and counter from it, so every call
    # queues the same launch
    tape_replay = True

    def __init__(self, p: float) -> None:
        self.p = check_p(p)

    def _node_tapes(self, node: Apply, dev: Any) -> Any:
        # a host state's key and counter are kernel constants that change every
        # call: no two calls queue the same work, so recording would only cost
        if not _is_gpu(node.inputs[1]):
            return None
        return super()._node_tapes(node, dev)

    def make_node(self, x: Any, state: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuDropout", role="x")
        if x.type.dtype not in _SHORT:
            raise TypeError(
                f"GpuDropout: x must be float32 or float64, got {x.type.dtype}"
            )
        if _is_gpu(state):
            state = _gpu_state_var("GpuDropout", state, x.type.device)
        else:
            state = state_variable("GpuDropout", state)
        return Apply(self, [x, state], [x.type()])

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        x, state = inputs
        on_device = _is_gpu(node.inputs[1])
        if not on_device:
            state = np.asarray(state)
        # shape and dtype only: no device read for a GPU state
        check_state_value("GpuDropout", state)
        device = self.device_of(node)
        src = array.ascontiguous(x, device)
        out = array.empty(tuple(x.shape), x.dtype, device)
        n = int(np.prod(x.shape, dtype=np.int64))
        if n:
            dtype = str(np.dtype(x.dtype))
            where = "device" if on_device else "host"
            fn = get_kernel("dropout", device, **dropout_consts(dtype, where))
            blocks = -(-n // 4)
            dev = get_device(device)
            grid = max(1, min(-(-blocks // _BLOCK), dev.multiprocessors * 32))
            if on_device:
                key_and_counter = [array.ascontiguous(state, device)]
            else:
                key_and_counter = [
                    np.uint32(state[0]), np.uint32(state[1]),
                    np.uint64(state_counter(state)),
                ]  # fmt: skip
            args = [
                src, out, np.int64(n), *key_and_counter,
                np.uint64(keep_threshold(self.p)), dropout_scale(self.p, dtype),
            ]  # fmt: skip
            launch(fn, grid, _BLOCK, args, device)
        outputs[0][0] = out

    def __str__(self) -> str:
        return f"GpuDropout{{p={self.p}}}"


class GpuDropoutAdvance(DropoutAdvanceSkeleton, _GpuBase):
    """A GPU dropout state with its counter advanced by ``ceil(x.size / 4)``.

    Notes
    -----
    Inputs ``(state, x)``: ``state`` the uint32 GPU vector ``(key0, key1,
    counter_lo, counter_hi)``, ``x`` the GPU array the dropout was applied to
    (any shape and layout; only its element count is used, read from its
    shape without touching its data). The output is a new 4-word GPU array
    (the 64-bit counter wraps mod 2**64), the state's default update; a
    one-thread kernel computes it, so the state never leaves the device.
    """

    __props__ = ()
    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    def make_node(self, state: Any, x: Any) -> Apply:
        state = as_gpu_variable(state, op="GpuDropoutAdvance", role="state")
        state = _gpu_state_var("GpuDropoutAdvance", state, state.type.device)
        x = as_gpu_variable(x, op="GpuDropoutAdvance", role="x")
        if x.type.device != state.type.device:
            raise ValueError(
                f"GpuDropoutAdvance: the state lives on device {state.type.device}, "
                f"x on device {x.type.device}"
            )
        out = CudaArrayType("uint32", (4,), state.type.device)()
        return Apply(self, [state, x], [out])

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        state, x = inputs
        check_state_value("GpuDropoutAdvance", state)
        device = self.device_of(node)
        n = int(np.prod(x.shape, dtype=np.int64))
        out = array.empty((4,), np.uint32, device)
        fn = get_kernel("dropout", device, **dropout_advance_consts())
        args = [array.ascontiguous(state, device), out, np.uint64(-(-n // 4))]
        launch(fn, 1, 1, args, device)
        outputs[0][0] = out


#: The GPU ops by role (their skeletons' ``family``).
GPU_FAMILY = DropoutFamily(GpuDropout, GpuDropoutAdvance)
_GpuBase.family = GPU_FAMILY


@register_lift(Dropout)
def lift_dropout(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Dropout(host_from_gpu(x), state) -> host_from_gpu(GpuDropout(x, state))``.

    A host state stays a host input (read by ``perform``, no transfer); a
    state ``host_from_gpu(s)`` with ``s`` on ``device`` becomes ``s`` (read
    by the kernel, no transfer).
    """
    x, state = node.inputs
    owner = state.owner
    if (
        owner is not None
        and isinstance(owner.op, HostFromGpu)
        and owner.inputs[0].type.device == device
    ):
        state = owner.inputs[0]
    else:
        state = pt.as_tensor_variable(state)
    return [GpuDropout(node.op.p)(to_gpu(x, device), state)]


def _dropout_on_gpu_state(x: Any, p: float, state: Variable) -> tuple[Any, Any]:
    """``dropout(x, p, state)`` for a GPU ``state`` on device ``d``.

    ``(host_from_gpu(GpuDropout(p)(x on d, state)), GpuDropoutAdvance()(state,
    x on d))``: the frontend's :func:`cc2ops.dropout.dropout` asks for this
    through :mod:`cc2ops.seam`.
    """
    gx = as_gpu(x, state.type.device)
    return host_from_gpu(GpuDropout(p)(gx, state)), GpuDropoutAdvance()(state, gx)


def _gpu_variable(dtype: str, shape: tuple, device: int, name: str) -> Variable:
    """``CudaArrayType(dtype, shape, device)(name)``: a GPU graph input."""
    return CudaArrayType(dtype, shape, device)(name)


seam.register(
    seam.GpuBackend(
        name="cc2ops.cuda",
        shared=gpu_shared,
        is_gpu_variable=is_gpu_variable,
        dropout=_dropout_on_gpu_state,
        variable=_gpu_variable,
        to_host=host_from_gpu,
        to_device=gpu_from_host,
    )
)
