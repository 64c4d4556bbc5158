"""Transfers between the host and CUDA devices, as graph ops.

``GpuFromHost(device)``
    host tensor -> GPU array on ``device`` (copied on the device's stream).
``HostFromGpu()``
    GPU array -> host tensor (the device's stream is synchronised first, so
    the numpy result is complete).
``GpuToGpu(src, dst)``
    GPU array on ``src`` -> a distinct GPU array on ``dst``: a device copy
    when both labels share a physical device, else a peer copy with both
    contexts given explicitly.

Each is the other's pullback (``GpuToGpu(src, dst)``'s is ``GpuToGpu(dst,
src)``), each infers its shape, and none is ever constant-folded: folding
would run CUDA while a graph is rewritten, and a folded GPU constant would not
survive pickling. Back-to-back pairs are cancelled by the rewrites in
:mod:`cc2ops.cuda.rewriting.lift`.

:class:`GpuGradients` gives the GPU ops of cc2ops's families the gradient
hooks of :class:`cc2ops._op.Cc2Op` for GPU tensors: the shared skeletons
(``cc2ops.pool.MaxPoolSkeleton``, ...) build a GPU op's pullback through them,
so cotangents are moved to the op's device with the transfers above.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, disconnected_type
from pytensor.graph.basic import Apply, Variable
from pytensor.graph.null_type import NullType
from pytensor.tensor.shape import Shape_i
from pytensor.tensor.type import TensorType

from cc2ops.cuda.op import GpuOp
from cc2ops.cuda.runtime import tape
from cc2ops.cuda.runtime.array import (
    SUPPORTED_KINDS,
    ascontiguous,
    copy,
    empty,
    ptr,
    to_gpu,
    to_host,
)
from cc2ops.cuda.runtime.availability import driver
from cc2ops.cuda.runtime.cudagraph import GraphCaptureError, capturing, hold
from cc2ops.cuda.runtime.device import get_device
from cc2ops.cuda.type import CudaArrayType

__all__ = [
    "GpuFromHost",
    "HostFromGpu",
    "GpuToGpu",
    "GpuDeepCopy",
    "gpu_from_host",
    "host_from_gpu",
    "gpu_to_gpu",
    "as_gpu",
    "as_host",
    "as_gpu_cotangent",
    "gpu_cotangent",
    "GpuGradients",
]


def _check_device(op: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{op}: {name} must be an int device label, got {type(value).__name__}"
        )
    if value < 0:
        raise ValueError(f"{op}: {name} must be >= 0, got {value}")
    return value


#: While :class:`cc2ops.cuda.replay.ReplayVM` captures a call, the list its
#: pinned download buffers are kept in (innermost last): ``HostFromGpu`` then
#: queues its copy into a pinned buffer instead of synchronising.
capture_downloads: list[list[np.ndarray]] = []
#: The staging buffers of the call being captured, by host address, each
#: with the GPUArray its upload lands in before every replay: ``GpuFromHost``
#: of a staging buffer copies the landing buffer (device to device), so each
#: replay reads what the caller staged.
capture_staged: dict[int, Any] = {}


def pinned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A page-locked host array of ``shape`` (0-d included: pycuda's
    ``pagelocked_empty`` returns one element of shape (1,) for ``()``)."""
    shape = tuple(int(n) for n in shape)
    buf = driver().pagelocked_empty(shape or (1,), dtype)
    return buf.reshape(shape)


def _upload(value: Any, device: int) -> Any:
    """``to_gpu``; while ``device`` captures, from memory that outlives the call.

    A captured copy reads its address on every replay. A staging buffer
    (:data:`capture_staged`) is uploaded before each replay into its landing
    buffer, which the graph copies (a fresh buffer per upload, so a GPU op
    that overwrites its input in place never touches the landing buffer);
    any other host value (one computed from shapes during the capture, say)
    is copied into a pinned buffer held by the graph, whose contents are
    that value for good.
    """
    if not capturing(device):
        return to_gpu(value, device)
    host = np.asarray(value, order="C")  # keeps 0-d (ascontiguousarray does not)
    landing = capture_staged.get(host.ctypes.data) if host.nbytes else None
    if landing is not None:
        if tuple(landing.shape) != host.shape or np.dtype(landing.dtype) != host.dtype:
            raise GraphCaptureError(
                f"GpuFromHost: a view {host.shape} {host.dtype} of a staging buffer "
                f"{tuple(landing.shape)} {landing.dtype} is uploaded; only whole "
                "inputs are staged"
            )
        return copy(landing, device)
    pinned = pinned_empty(host.shape, host.dtype)
    np.copyto(pinned, host)
    hold(device, pinned)
    return to_gpu(pinned, device)


def _download_captured(garray: Any, label: int, keep: list[np.ndarray]) -> np.ndarray:
    """Queue a copy of ``garray`` into a new pinned host buffer; no synchronisation.

    The buffer is filled when the captured graph replays; ``keep`` holds it
    for the graph's life.
    """
    src = ascontiguous(garray, label)
    host = pinned_empty(tuple(src.shape), src.dtype)
    dev = get_device(label)
    dev.activate()
    if host.nbytes:
        tape.refuse("a download to the host")
        driver().memcpy_dtoh_async(host, ptr(src), dev.stream)
    keep.append(host)
    return host


def _skip(t: Any) -> bool:
    return isinstance(t.type, (DisconnectedType, NullType))


class GpuFromHost(GpuOp):
    """Copy a host tensor to device ``device``.

    Parameters
    ----------
    device : int
        Destination device label.

    Notes
    -----
    The input may have any axis order and strides; the output is a new
    C-contiguous GPUArray with the input's dtype and static shape.
    """

    __props__ = ("device",)

    def __init__(self, device: int = 0) -> None:
        self.device = _check_device("GpuFromHost", "device", device)

    def make_node(self, x: Any) -> Apply:
        if isinstance(getattr(x, "type", None), CudaArrayType):
            raise TypeError(
                f"GpuFromHost: the input already lives on GPU device {x.type.device}; "
                "use gpu_to_gpu to move it between devices"
            )
        try:
            x = pt.as_tensor_variable(x)
        except (TypeError, ValueError, NotImplementedError) as e:
            raise TypeError(
                f"GpuFromHost: input must be a tensor, got {type(x).__name__}: {e}"
            ) from e
        if x.type.numpy_dtype.kind not in SUPPORTED_KINDS:
            raise TypeError(
                f"GpuFromHost: dtype {x.type.dtype} is not supported on the GPU"
            )
        out = CudaArrayType(x.type.dtype, x.type.shape, self.device)()
        return Apply(self, [x], [out])

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        outputs[0][0] = _upload(inputs[0], self.device)

    def _infer_shape(self, node: Apply, input_shapes: list[Any]) -> list[Any]:
        return [input_shapes[0]]

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        if _skip(g):
            return [g]
        return [as_host(g)]

    def pushforward(self, inputs, outputs, tangents):
        (t,) = tangents
        if _skip(t):
            return [disconnected_type()]
        return [as_gpu(t, self.device)]

    def __str__(self) -> str:
        return f"GpuFromHost{{device={self.device}}}"


class HostFromGpu(GpuOp):
    """Copy a GPU array to a host tensor (numpy, C-contiguous).

    Notes
    -----
    Synchronises the source device's stream, so the result is complete when
    the op returns.
    """

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        if not isinstance(getattr(x, "type", None), CudaArrayType):
            got = getattr(x, "type", type(x).__name__)
            raise TypeError(
                f"HostFromGpu: input must be a GPU variable (CudaArrayType), got {got}"
            )
        out = TensorType(x.type.dtype, x.type.shape)()
        return Apply(self, [x], [out])

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        label = node.inputs[0].type.device
        if capture_downloads and capturing(label):
            outputs[0][0] = _download_captured(inputs[0], label, capture_downloads[-1])
        else:
            outputs[0][0] = to_host(inputs[0], label)

    def _infer_shape(self, node: Apply, input_shapes: list[Any]) -> list[Any]:
        return [input_shapes[0]]

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        if _skip(g):
            return [g]
        return [as_gpu(g, inputs[0].type.device)]

    def pushforward(self, inputs, outputs, tangents):
        (t,) = tangents
        if _skip(t):
            return [disconnected_type()]
        return [as_host(t)]

    def __str__(self) -> str:
        return "HostFromGpu"


class GpuToGpu(GpuOp):
    """Copy a GPU array from device ``src`` to device ``dst`` (always a new buffer).

    Parameters
    ----------
    src, dst : int
        Source and destination device labels (equal labels make a device
        copy; the transfer-cancelling rewrites remove such nodes).

    Notes
    -----
    Labels on one physical device copy on that device; different physical
    devices use ``cuMemcpyPeer`` with both contexts passed explicitly, which
    is ordered after all work queued on both devices.
    """

    __props__ = ("src", "dst")

    def __init__(self, src: int, dst: int) -> None:
        self.src = _check_device("GpuToGpu", "src", src)
        self.dst = _check_device("GpuToGpu", "dst", dst)

    def make_node(self, x: Any) -> Apply:
        if not isinstance(getattr(x, "type", None), CudaArrayType):
            got = getattr(x, "type", type(x).__name__)
            raise TypeError(
                f"GpuToGpu: input must be a GPU variable (CudaArrayType), got {got}"
            )
        if x.type.device != self.src:
            raise ValueError(
                f"GpuToGpu({self.src}->{self.dst}): the input lives on device "
                f"{x.type.device}, not on the source device {self.src}"
            )
        return Apply(self, [x], [x.type.clone(device=self.dst)()])

    def device_of(self, node: Apply) -> int:
        return self.dst

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        (x,) = inputs
        src, dst = get_device(self.src), get_device(self.dst)
        if src.shares_physical(dst):
            outputs[0][0] = copy(x, self.dst)
            return
        contiguous = ascontiguous(x, self.src)
        out = empty(contiguous.shape, contiguous.dtype, self.dst)
        if out.nbytes:
            tape.refuse("a copy between devices")
            driver().memcpy_peer(
                ptr(out), ptr(contiguous), out.nbytes,
                dest_context=dst.context, src_context=src.context,
            )  # fmt: skip
        dst.activate()
        outputs[0][0] = out

    def _infer_shape(self, node: Apply, input_shapes: list[Any]) -> list[Any]:
        return [input_shapes[0]]

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        if _skip(g):
            return [g]
        return [as_gpu(g, self.src)]

    def pushforward(self, inputs, outputs, tangents):
        (t,) = tangents
        if _skip(t):
            return [disconnected_type()]
        return [as_gpu(t, self.dst)]

    def __str__(self) -> str:
        return f"GpuToGpu{{{self.src}->{self.dst}}}"


class GpuDeepCopy(GpuOp):
    """A fresh C-contiguous copy of a GPU array on its own device.

    The GPU mode's linker puts it in place of PyTensor's ``DeepCopyOp`` on
    GPU values (the copies that keep function outputs from aliasing inputs):
    ``DeepCopyOp`` calls ``GPUArray.copy()``, which keeps the source's strides
    and so cannot copy a view with gaps into a buffer of the view's size.
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        if not isinstance(getattr(x, "type", None), CudaArrayType):
            got = getattr(x, "type", type(x).__name__)
            raise TypeError(f"GpuDeepCopy: input must be a GPU variable, got {got}")
        return Apply(self, [x], [x.type()])

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        outputs[0][0] = copy(inputs[0], node.inputs[0].type.device)

    def _infer_shape(self, node: Apply, input_shapes: list[Any]) -> list[Any]:
        return [input_shapes[0]]

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        if _skip(g):
            return [g]
        return [as_gpu(g, inputs[0].type.device)]

    def __str__(self) -> str:
        return "GpuDeepCopy"


def gpu_from_host(x: Any, device: int = 0) -> Variable:
    """``x`` (a host tensor or array-like) copied to device ``device``.

    A GPU variable is moved with :func:`gpu_to_gpu` instead (or returned as is
    when it already lives on ``device``).
    """
    if isinstance(getattr(x, "type", None), CudaArrayType):
        return x if x.type.device == device else gpu_to_gpu(x, device)
    return GpuFromHost(device)(x)


def host_from_gpu(x: Variable) -> Variable:
    """The host tensor of GPU variable ``x``."""
    return HostFromGpu()(x)


def gpu_to_gpu(x: Variable, dst: int) -> Variable:
    """GPU variable ``x`` copied to device ``dst``."""
    if not isinstance(getattr(x, "type", None), CudaArrayType):
        got = getattr(x, "type", type(x).__name__)
        raise TypeError(
            f"gpu_to_gpu: input must be a GPU variable (CudaArrayType), got {got}"
        )
    return GpuToGpu(x.type.device, dst)(x)


def as_gpu(x: Any, device: int) -> Variable:
    """``x`` as a GPU variable on ``device``, with the fewest transfers.

    A GPU variable on ``device`` passes; on another device it gets
    :func:`gpu_to_gpu`. ``host_from_gpu(v)`` is unwrapped to ``v`` (moved if
    needed); any other host tensor gets :func:`gpu_from_host`.
    """
    if isinstance(getattr(x, "type", None), CudaArrayType):
        return x if x.type.device == device else gpu_to_gpu(x, device)
    x = pt.as_tensor_variable(x)
    owner = x.owner
    if owner is not None and isinstance(owner.op, HostFromGpu):
        return as_gpu(owner.inputs[0], device)
    return GpuFromHost(device)(x)


def as_host(x: Any) -> Variable:
    """``x`` as a host tensor: ``gpu_from_host(h)`` is unwrapped to ``h``."""
    if isinstance(getattr(x, "type", None), CudaArrayType):
        owner = x.owner
        if owner is not None and isinstance(owner.op, GpuFromHost):
            return owner.inputs[0]
        return host_from_gpu(x)
    return pt.as_tensor_variable(x)


def as_gpu_cotangent(g: Variable, device: int) -> Variable:
    """A cotangent as a GPU variable on ``device`` (disconnected/undefined pass).

    Host cotangents get ``gpu_from_host``, GPU ones on another device get
    ``gpu_to_gpu``.
    """
    if isinstance(g.type, (DisconnectedType, NullType)):
        return g
    return as_gpu(g, device)


def gpu_cotangent(g: Variable, dtype: str, device: int) -> Variable:
    """A cotangent on ``device`` in ``dtype`` (disconnected/undefined ones pass).

    Host cotangents of another dtype are cast on the host before the upload.
    """
    if isinstance(g.type, DisconnectedType) or not hasattr(g.type, "dtype"):
        return as_gpu_cotangent(g, device)
    if g.type.dtype != dtype:
        g = as_host(g).astype(dtype)
    return as_gpu_cotangent(g, device)


class GpuGradients:
    """The gradient hooks of :class:`cc2ops._op.Cc2Op` for GPU tensors.

    A mixin placed before :class:`~cc2ops.cuda.op.GpuOp` in a GPU family op's
    bases (``class _GpuPool(PoolGeometry, GpuGradients, GpuOp)``): the
    family's skeleton then writes the GPU op's pullback and pushforward with
    the host op's code, and every term it builds lives on the device of the
    input it belongs to. Cotangents may arrive host-typed (PyTensor adds
    gradient terms with host ops) or in another dtype; :func:`gpu_cotangent`
    moves and casts them.
    """

    def _cotangent(self, g: Variable, like: Variable) -> Variable:
        return gpu_cotangent(g, like.type.dtype, like.type.device)

    def _zeros_like(self, v: Variable) -> Variable:
        return as_gpu_cotangent(pt.zeros_like(v), v.type.device)

    def _hw_of(self, x: Variable) -> Variable:
        # (H, W) of GPU images as a host int64 vector (a constant when static)
        h, w = x.type.shape[2:]
        if h is not None and w is not None:
            return pt.as_tensor_variable(np.array([h, w], dtype="int64"))
        return pt.stack([Shape_i(2)(x), Shape_i(3)(x)])

    def _host(self, v: Variable) -> Variable:
        return as_host(v)

    def _on_device(self, v: Variable, like: Variable) -> Variable:
        return as_gpu_cotangent(v, like.type.device)
