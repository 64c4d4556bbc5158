"""NVIDIA's Python bindings and shared libraries, found in one place.

cc2ops calls CUDA libraries through the bindings NVIDIA maintains, never through
prototypes typed by hand:

- ``cuda.bindings.driver`` (package ``cuda-bindings``): the driver API, for
  :mod:`~.cudagraph` (stream capture, graph launch);
- ``nvmath.bindings.cublas`` (``nvmath-python``): cuBLAS, for
  :mod:`cc2ops.cuda.libs.cublas`;
- ``nccl.core`` and ``nccl.bindings.nccl`` (``nccl4py``): NCCL, for
  :mod:`cc2ops.cuda.libs.nccl`;
- ``cuda.pathfinder`` (``cuda-pathfinder``): library lookup, for
  :func:`load_library`.

All of them come with the ``cuda`` extra (``pip install "cc2ops[cuda]"``).
:func:`binding` imports one lazily (importing cc2ops never does); a missing one
raises the caller's own error type, naming the package to install.

Shared libraries (``libcublas``, ``libnccl``, the driver's ``libcuda``) are
located by ``cuda.pathfinder.load_nvidia_dynamic_lib`` (nccl4py looks libnccl up
the same way; a binding that later opens a library by its soname gets the copy
already in the process, so cc2ops and the bindings share one). Its search order:
a copy already loaded in the process; NVIDIA's wheels in ``site-packages``
(``nvidia-cublas``, ``nvidia-nccl-cu13``); ``$CONDA_PREFIX``; the system loader
(``LD_LIBRARY_PATH``, ``ld.so.conf``); then product roots such as
``$NCCL_HOME`` and ``$CUDA_PATH``/``$CUDA_HOME``. The driver is looked up on
the system loader path only. cc2ops adds no environment variable of its own
(0.1's ``CC2OPS_CUBLAS`` and ``CC2OPS_NCCL_LIBRARY`` are gone): the variables
above are the one convention.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType

__all__ = ["PACKAGES", "binding", "load_library", "library_path"]

#: importable module -> the pip package that provides it
PACKAGES = {
    "cuda.bindings.driver": "cuda-bindings",
    "cuda.pathfinder": "cuda-pathfinder",
    # the version the cuda extra pins: nvmath marks its bindings experimental
    "nvmath": "nvmath-python==1.0.1",
    "nvmath.bindings.cublas": "nvmath-python==1.0.1",
    "nccl.core": "nccl4py",
    "nccl.bindings.nccl": "nccl4py",
}

_EXTRA = 'pip install "cc2ops[cuda]"'
_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}
_paths: dict[str, str] = {}


def _install_hint(module: str) -> str:
    package = PACKAGES.get(module, module.split(".")[0])
    return (
        f"the {package.split('=')[0]} package (module {module}) is not installed or "
        f"does not import; `pip install {package}` or {_EXTRA}"
    )


def binding(
    module: str, *, user: str, error: type[Exception] = ImportError
) -> ModuleType:
    """Import ``module`` (a key of :data:`PACKAGES`), memoised.

    Parameters
    ----------
    module : str
        The dotted module name, e.g. ``"cuda.bindings.driver"``.
    user : str
        What needs it, for the message (``"cc2ops.cuda.runtime.cudagraph"``).
    error : exception type
        Raised (from the ``ImportError``) when the module does not import; its
        message names ``user``, the package and how to install it.
    """
    mod = _modules.get(module)
    if mod is not None:
        return mod
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise error(f"{user}: {_install_hint(module)} ({e})") from e
    _modules[module] = mod
    return mod


def load_library(libname: str, *, user: str, error: type[Exception] = OSError) -> str:
    """Load NVIDIA library ``libname`` through cuda-pathfinder; its path.

    Parameters
    ----------
    libname : str
        cuda-pathfinder's short name: ``"cublas"``, ``"nccl"``, ``"cuda"``.
    user, error
        As for :func:`binding`. A library that is not found raises ``error``
        with pathfinder's own account of where it looked.

    Notes
    -----
    The library stays loaded for the life of the process (pathfinder memoises
    the handle; it must never be closed). Bindings that locate it again get
    the same copy.
    """
    path = _paths.get(libname)
    if path is not None:
        return path
    pathfinder = binding("cuda.pathfinder", user=user, error=error)
    with _lock:
        path = _paths.get(libname)
        if path is not None:
            return path
        try:
            loaded = pathfinder.load_nvidia_dynamic_lib(libname)
        except Exception as e:  # DynamicLibNotFoundError & co. (RuntimeErrors)
            raise error(
                f"{user}: the NVIDIA library {libname!r} could not be loaded "
                f"({str(e).strip()}); cuda-pathfinder looked in the process, "
                "NVIDIA's wheels, $CONDA_PREFIX, the system loader path "
                "(LD_LIBRARY_PATH), product roots such as $NCCL_HOME and "
                "$CUDA_PATH/$CUDA_HOME; install the library (its nvidia-* wheel or "
                "the CUDA toolkit) or put it on one of those paths"
            ) from e
        path = str(loaded.abs_path or libname)
        _paths[libname] = path
        return path


def library_path(libname: str) -> str | None:
    """The path ``libname`` was loaded from by :func:`load_library`, or ``None``."""
    return _paths.get(libname)
