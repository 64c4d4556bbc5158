"""Whether CUDA can be used here, and the one error that says why not.

Nothing in this module touches CUDA at import. :func:`unavailable_reason`
probes once, lazily: it imports pycuda, calls ``cuInit`` and counts devices,
and remembers the answer for the life of the process (a driver or a device
does not appear while a process runs). Setting ``CC2OPS_DISABLE_CUDA=1``
makes CUDA unavailable on purpose; it is read on every call, so tests can
check the no-GPU paths on a GPU machine.
"""

from __future__ import annotations

import os
import threading
from types import ModuleType

__all__ = [
    "CudaUnavailableError",
    "INSTALL_HINT",
    "is_available",
    "unavailable_reason",
    "require",
    "driver",
]

INSTALL_HINT = (
    'install the CUDA extra with `pip install -e ".[cuda]"` (building pycuda needs '
    "the CUDA toolkit's nvcc and headers: put nvcc on PATH or set CUDA_HOME)"
)

_DISABLE_ENV = "CC2OPS_DISABLE_CUDA"

_lock = threading.Lock()
_probed = False
_reason: str | None = None
_driver: ModuleType | None = None


class CudaUnavailableError(RuntimeError):
    """Raised when CUDA is asked for but pycuda, the driver or a device is missing."""


def _probe() -> tuple[str | None, ModuleType | None]:
    try:
        import pycuda.driver as drv
    except ImportError as e:
        return (
            f"pycuda is not installed or does not import ({e}); {INSTALL_HINT}",
            None,
        )
    try:
        drv.init()
    except Exception as e:  # pycuda raises its own driver error classes
        return (
            f"the CUDA driver could not be initialised (cuInit failed: {e}); check "
            "that an NVIDIA driver is installed and /dev/nvidia* is accessible",
            None,
        )
    try:
        count = drv.Device.count()
    except Exception as e:
        return (f"counting CUDA devices failed ({e})", None)
    if count == 0:
        return (
            "no CUDA device found (cuInit succeeded but there are 0 devices; "
            "check CUDA_VISIBLE_DEVICES)",
            None,
        )
    return None, drv


def unavailable_reason() -> str | None:
    """``None`` when CUDA is usable, else why not and how to fix it.

    The reason names which of pycuda, the driver (``cuInit``) or a device is
    missing, with an install hint for pycuda.
    """
    global _probed, _reason, _driver
    if os.environ.get(_DISABLE_ENV, "") not in ("", "0"):
        return f"CUDA is disabled by {_DISABLE_ENV}={os.environ[_DISABLE_ENV]}"
    if not _probed:
        with _lock:
            if not _probed:
                _reason, _driver = _probe()
                _probed = True
    return _reason


def is_available() -> bool:
    """``True`` when pycuda imports, ``cuInit`` succeeds and a device exists."""
    return unavailable_reason() is None


def require() -> None:
    """Raise :class:`CudaUnavailableError` unless CUDA is usable."""
    reason = unavailable_reason()
    if reason is not None:
        raise CudaUnavailableError(f"cc2ops.cuda: CUDA is not available: {reason}")


def driver() -> ModuleType:
    """The initialised ``pycuda.driver`` module (raises if CUDA is unavailable)."""
    require()
    assert _driver is not None  # set together with a None reason
    return _driver
