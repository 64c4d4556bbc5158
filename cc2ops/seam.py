"""The seam between the frontend and a GPU backend: backends register, the core asks.

A few frontend builders depend on where a value lives: ``dropout_state(seed,
device=d)`` makes a GPU shared variable, and ``dropout(x, p, state)`` with a GPU
state builds the GPU op at once (the state never leaves the device). The
frontend does not import a backend for that, and neither does
:mod:`cc2ops.testing`, whose step builder makes GPU inputs, outputs and
parameters on request. A backend registers one :class:`GpuBackend` (six
functions) with :func:`register` when it is imported;
``import cc2ops.cuda`` registers the CUDA backend. Lifting host ops onto the GPU
is the other half of the seam and needs nothing from here: GPU op modules
register their rules with :func:`cc2ops.cuda.rewriting.lift.register_lift`.

The one lazy import
-------------------
Asking for a GPU object (:func:`backend`) when no backend is registered, as
``dropout_state(seed, device=0)`` in a program that never imported
``cc2ops.cuda`` does, imports :data:`DEFAULT_BACKEND` by name: that is the only
place where the frontend loads backend code, and only on that request.
Importing ``cc2ops.cuda`` never touches CUDA, so this works without a GPU.
:func:`is_gpu_variable` never imports anything: a GPU variable can only exist
once its backend was imported, and so registered.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["GpuBackend", "register", "registered", "backend", "is_gpu_variable"]

#: The module imported by :func:`backend` when no backend is registered.
DEFAULT_BACKEND = "cc2ops.cuda"


@dataclass(frozen=True)
class GpuBackend:
    """What the frontend asks of a GPU backend.

    Attributes
    ----------
    name : str
        The backend's package, for messages.
    shared : callable
        ``shared(value, device, name, shape)``: a GPU shared variable on device
        label ``device`` holding the numpy array ``value``, static shape
        ``shape``; creating it must not touch the device.
    is_gpu_variable : callable
        ``is_gpu_variable(x)``: whether the graph variable ``x`` has the
        backend's GPU type.
    dropout : callable
        ``dropout(x, p, state)`` for a GPU ``state`` made by ``shared``:
        ``(y, update)``, ``y`` a host variable with ``x``'s type and
        ``update`` the new state (see :func:`cc2ops.dropout.dropout`).
    variable : callable
        ``variable(dtype, shape, device, name)``: a GPU graph input (no value;
        the caller passes device arrays), static shape ``shape`` (``None``
        entries: unknown).
    to_host : callable
        ``to_host(x)``: the host view of the GPU variable ``x`` (a transfer
        node that the GPU mode's rewrites remove where GPU ops consume it).
    to_device : callable
        ``to_device(x, device)``: the host variable ``x`` as a GPU value on
        ``device`` (for outputs that stay on the device).
    """

    name: str
    shared: Callable[..., Any]
    is_gpu_variable: Callable[[Any], bool]
    dropout: Callable[[Any, float, Any], tuple[Any, Any]]
    variable: Callable[[str, tuple, int, str], Any]
    to_host: Callable[[Any], Any]
    to_device: Callable[[Any, int], Any]


_BACKEND: GpuBackend | None = None


def register(gpu_backend: GpuBackend) -> None:
    """Make ``gpu_backend`` the GPU backend (a backend calls this at import)."""
    global _BACKEND
    if not isinstance(gpu_backend, GpuBackend):
        raise TypeError(
            f"cc2ops.seam.register: expected a GpuBackend, got "
            f"{type(gpu_backend).__name__}"
        )
    _BACKEND = gpu_backend


def registered() -> GpuBackend | None:
    """The registered GPU backend, or ``None``; never imports anything."""
    return _BACKEND


def backend() -> GpuBackend:
    """The GPU backend, importing :data:`DEFAULT_BACKEND` if none is registered."""
    if _BACKEND is None:
        importlib.import_module(DEFAULT_BACKEND)  # registers itself at import
    if _BACKEND is None:
        raise RuntimeError(
            f"cc2ops.seam: importing {DEFAULT_BACKEND} registered no GPU backend"
        )
    return _BACKEND


def is_gpu_variable(x: Any) -> bool:
    """Whether ``x`` is a variable of the registered backend's GPU type."""
    return _BACKEND is not None and _BACKEND.is_gpu_variable(x)
