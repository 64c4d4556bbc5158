"""The seam between the multi-device rewriter and a device backend.

The rewriter (:mod:`cc2ops.distributed.hybrid`) is backend-neutral: on K
virtual devices it uses the host collectives of
:mod:`cc2ops.distributed.collectives` and nothing else. On GPUs it needs what
only the GPU backend has: its transfer ops (a distributed value crosses host
<-> device once per device), the backends that build its collectives, its
device-labelled type, and the device communicator of the SPMD mode. The
backend registers one :class:`DeviceBackend` with :func:`register` when it is
imported (``import cc2ops.cuda`` registers the CUDA backend, from
:mod:`cc2ops.cuda.ops.comm`); this package never imports it (the pattern of
the frontend's :mod:`cc2ops.seam`).

Asking for a backend that is not registered (:func:`device_backend`, as
``distribute(cost, 2, backend="nccl")`` does in a program that never imported
``cc2ops.cuda``) goes through :func:`cc2ops.seam.backend`: the frontend's one
lazy import of the GPU backend, which registers it with both seams. The other
functions never import anything: a transfer op or a device-typed variable can
only exist once its backend was imported, and so registered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytensor.graph.basic import Variable

from cc2ops import seam as frontend_seam
from cc2ops.distributed.collectives import CommBackend

__all__ = [
    "DeviceBackend",
    "register",
    "registered",
    "device_backend",
    "transfer_direction",
    "to_host",
    "to_device",
    "peel",
    "device_label",
    "comm_backend",
]


@dataclass(frozen=True)
class DeviceBackend:
    """What the multi-device rewriter asks of a device backend.

    Attributes
    ----------
    name : str
        The backend's package, for messages.
    to_host : type
        The op class copying a device value to the host (``HostFromGpu``).
    from_host : type
        The op class copying a host value to a device (``GpuFromHost``).
    device_to_device : type
        The op class copying a value between devices (``GpuToGpu``).
    as_host : callable
        ``as_host(x)``: ``x`` as a host variable (a transfer if it is not one).
    as_device : callable
        ``as_device(x, label)``: ``x`` on device ``label``.
    is_device_type : callable
        ``is_device_type(t)``: whether the graph type ``t`` is the backend's
        device-labelled type (its label is ``t.device``).
    comm_backend : callable
        ``comm_backend(labels, impl)``: the :class:`CommBackend` building the
        backend's collectives over the device ``labels``.
    backend_names : mapping of str to str
        The names ``distribute(..., backend=name)`` accepts for this backend,
        and the ``impl`` each one means.
    spmd_communicator : callable
        ``spmd_communicator(mpi, label)``: the
        :class:`~cc2ops.distributed.communicator.Communicator` of the SPMD
        mode's ``collectives="nccl"`` on device ``label``, set up over the
        processes of the :class:`~cc2ops.distributed.communicator.MPICommunicator`
        ``mpi`` (:class:`cc2ops.distributed.nccl.NcclCommunicator`).
    """

    name: str
    to_host: type
    from_host: type
    device_to_device: type
    as_host: Callable[[Variable], Variable]
    as_device: Callable[[Variable, int], Variable]
    is_device_type: Callable[[Any], bool]
    comm_backend: Callable[[Sequence[int], str], CommBackend]
    backend_names: Mapping[str, str]
    spmd_communicator: Callable[[Any, int], Any]


_BACKEND: DeviceBackend | None = None


def register(backend: DeviceBackend) -> None:
    """Make ``backend`` the device backend (a backend calls this at import)."""
    global _BACKEND
    if not isinstance(backend, DeviceBackend):
        raise TypeError(
            f"cc2ops.distributed.seam.register: expected a DeviceBackend, got "
            f"{type(backend).__name__}"
        )
    _BACKEND = backend


def registered() -> DeviceBackend | None:
    """The registered device backend, or ``None``; never imports anything."""
    return _BACKEND


def device_backend() -> DeviceBackend:
    """The device backend, imported through :func:`cc2ops.seam.backend` if needed."""
    if _BACKEND is None:
        frontend_seam.backend()  # imports the GPU backend, which registers here
    if _BACKEND is None:
        raise RuntimeError(
            f"cc2ops.distributed.seam: importing {frontend_seam.DEFAULT_BACKEND} "
            "registered no device backend"
        )
    return _BACKEND


def transfer_direction(op: Any) -> str | None:
    """``"to_host"``, ``"to_device"`` (from the host or another device) or None."""
    be = _BACKEND
    if be is None:
        return None
    if isinstance(op, be.to_host):
        return "to_host"
    if isinstance(op, (be.from_host, be.device_to_device)):
        return "to_device"
    return None


def to_host(x: Variable) -> Variable:
    """``x`` as a host variable (``x`` is a device value: a backend is registered)."""
    return device_backend().as_host(x)


def to_device(x: Variable, label: int) -> Variable:
    """``x`` on device ``label``."""
    return device_backend().as_device(x, label)


def peel(var: Variable) -> Variable:
    """Through host <-> device copies (not device-to-device) to the value below."""
    be = _BACKEND
    if be is None:
        return var
    copies = (be.from_host, be.to_host)
    while var.owner is not None and isinstance(var.owner.op, copies):
        var = var.owner.inputs[0]
    return var


def device_label(t: Any) -> int | None:
    """The device label of the graph type ``t``, or None for a host type."""
    be = _BACKEND
    if be is None or not be.is_device_type(t):
        return None
    return t.device


def comm_backend(labels: Sequence[int], name: str) -> CommBackend:
    """The device backend's :class:`CommBackend` called ``name`` over ``labels``."""
    be = device_backend()
    if name not in be.backend_names:
        raise ValueError(
            f"cc2ops.distributed.hybrid: backend must be 'virtual' or one of "
            f"{tuple(be.backend_names)}, got {name!r}"
        )
    return be.comm_backend(labels, be.backend_names[name])
