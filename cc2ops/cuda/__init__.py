"""The CUDA backend of cc2ops: GPU type, transfers, GPU ops and the GPU mode.

Importing this package never touches CUDA and works without pycuda: graphs
with GPU types can be built and rewritten anywhere (CI has no GPU). CUDA is
first used when a function with GPU-typed variables is compiled in the GPU
mode, or when a runtime helper (``get_device``,
:mod:`cc2ops.cuda.runtime.array`) is called. pycuda is imported lazily then.

Without pycuda, a driver or a device, asking for the GPU raises
:class:`CudaUnavailableError` saying which is missing; pycuda comes with
``pip install -e ".[cuda]"``, which needs the CUDA toolkit's nvcc and headers.

Layers, each importing only those below it (``pyproject.toml``'s import
contracts check it):

- :mod:`cc2ops.cuda.runtime`: CUDA without PyTensor (availability, devices,
  memory, kernels, precision, timing, autotuning, CUDA graphs);
- :mod:`cc2ops.cuda.libs`: adapters over NVIDIA libraries (cuBLAS through
  nvmath-python, NCCL through nccl4py);
- the GPU graph core: :mod:`~cc2ops.cuda.type` (``CudaArrayType``,
  ``shared``), :mod:`~cc2ops.cuda.transfer` (host/GPU/GPU copies as ops),
  :mod:`~cc2ops.cuda.op` (``GpuOp``), :mod:`~cc2ops.cuda.mode` (the GPU
  mode), :mod:`~cc2ops.cuda.capture` (compiled steps replayed as CUDA graphs);
- :mod:`cc2ops.cuda.rewriting`: lifting host graphs to the GPU;
- :mod:`cc2ops.cuda.ops`: the GPU op families and ports of PyTensor's ops.

Importing this package imports all of them: the op modules register their
lifting rules, and :mod:`cc2ops.cuda.ops.dropout` registers the backend with
the frontend (:mod:`cc2ops.seam`) and :mod:`cc2ops.cuda.ops.comm` registers
it with the multi-device rewriter (:mod:`cc2ops.distributed.seam`); neither
the frontend nor :mod:`cc2ops.distributed` imports this package.
The 0.1 module paths (``cc2ops.cuda.device``, ``cc2ops.cuda.conv``,
``cc2ops.cuda.graphs``, ...) still import, with a ``DeprecationWarning``, until
the next release (:data:`MOVED`).
"""

from __future__ import annotations

from cc2ops import _aliases
from cc2ops.cuda import (
    ops,  # noqa: F401  (every GPU op family and its rules)
    rewriting,  # noqa: F401  (the lifting rewriter)
)
from cc2ops.cuda.capture import CapturedFunction, capture_function
from cc2ops.cuda.mode import launch_tapes, mode
from cc2ops.cuda.op import GpuOp
from cc2ops.cuda.runtime.availability import (
    CudaUnavailableError,
    is_available,
    require,
    unavailable_reason,
)
from cc2ops.cuda.runtime.cudagraph import CudaGraph, GraphCaptureError
from cc2ops.cuda.runtime.device import get_device, set_device_map
from cc2ops.cuda.runtime.precision import allow_tf32, get_allow_tf32, set_allow_tf32
from cc2ops.cuda.transfer import (
    GpuFromHost,
    GpuToGpu,
    HostFromGpu,
    gpu_from_host,
    gpu_to_gpu,
    host_from_gpu,
)
from cc2ops.cuda.type import (
    CudaArrayConstant,
    CudaArrayType,
    CudaArrayVariable,
    CudaSharedVariable,
    shared,
)

__all__ = [
    "CudaUnavailableError",
    "is_available",
    "unavailable_reason",
    "require",
    "get_device",
    "set_device_map",
    "set_allow_tf32",
    "get_allow_tf32",
    "allow_tf32",
    "CudaArrayType",
    "CudaArrayVariable",
    "CudaArrayConstant",
    "CudaSharedVariable",
    "shared",
    "GpuFromHost",
    "HostFromGpu",
    "GpuToGpu",
    "gpu_from_host",
    "host_from_gpu",
    "gpu_to_gpu",
    "GpuOp",
    "mode",
    "launch_tapes",
    "CudaGraph",
    "CapturedFunction",
    "GraphCaptureError",
    "capture_function",
]

#: The 0.1 module paths and where the modules are now; each old path imports
#: with a DeprecationWarning until the next release (:mod:`cc2ops._aliases`).
MOVED = {
    "cc2ops.cuda.availability": "cc2ops.cuda.runtime.availability",
    "cc2ops.cuda.device": "cc2ops.cuda.runtime.device",
    "cc2ops.cuda.array": "cc2ops.cuda.runtime.array",
    "cc2ops.cuda.compile": "cc2ops.cuda.runtime.compile",
    "cc2ops.cuda.precision": "cc2ops.cuda.runtime.precision",
    "cc2ops.cuda.profile": "cc2ops.cuda.runtime.profile",
    "cc2ops.cuda.autotune": "cc2ops.cuda.runtime.autotune",
    # the runtime half is cc2ops.cuda.runtime.cudagraph; capture re-exports it
    "cc2ops.cuda.graphs": "cc2ops.cuda.capture",
    "cc2ops.cuda.blas": "cc2ops.cuda.libs.cublas",
    # the ctypes binding of 0.1, now an adapter over nccl4py
    "cc2ops.cuda.nccl": "cc2ops.cuda.libs.nccl",
    "cc2ops.cuda.conv": "cc2ops.cuda.ops.conv.ops",
    "cc2ops.cuda.conv_fft": "cc2ops.cuda.ops.conv.fft",
    "cc2ops.cuda.conv_igemm": "cc2ops.cuda.ops.conv.igemm",
    "cc2ops.cuda.pool": "cc2ops.cuda.ops.pool",
    "cc2ops.cuda.response_norm": "cc2ops.cuda.ops.cross_map_norm",
    "cc2ops.cuda.softmax_loss": "cc2ops.cuda.ops.softmax_cross_entropy",
    "cc2ops.cuda.dropout": "cc2ops.cuda.ops.dropout",
    "cc2ops.cuda.basic": "cc2ops.cuda.ops.tensor.basic",
    "cc2ops.cuda.elemwise": "cc2ops.cuda.ops.tensor.elemwise",
    "cc2ops.cuda.reduction": "cc2ops.cuda.ops.tensor.reduction",
    "cc2ops.cuda.blas_ops": "cc2ops.cuda.ops.tensor.blas",
    "cc2ops.cuda.softmax": "cc2ops.cuda.ops.tensor.softmax",
    "cc2ops.cuda.comm": "cc2ops.cuda.ops.comm",
}

_aliases.install(MOVED)
__getattr__ = _aliases.package_getattr(__name__)
