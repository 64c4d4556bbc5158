"""The CUDA runtime of cc2ops: GPU type, transfers, devices, kernels, cuBLAS, GPU mode.

Importing this package never touches CUDA and works without pycuda: graphs
with GPU types can be built and rewritten anywhere (CI has no GPU). CUDA is
first used when a function with GPU-typed variables is compiled in the GPU
mode, or when a runtime helper (``get_device``, ``cc2ops.cuda.array``) is
called. pycuda is imported lazily then.

Without pycuda, a driver or a device, asking for the GPU raises
:class:`CudaUnavailableError` saying which is missing; pycuda comes with
``pip install -e ".[cuda]"``, which needs the CUDA toolkit's nvcc and headers.

Modules: :mod:`~cc2ops.cuda.type` (``CudaArrayType``, ``shared``),
:mod:`~cc2ops.cuda.transfer` (host/GPU/GPU copies as ops),
:mod:`~cc2ops.cuda.device` (contexts, streams, pools, device labels),
:mod:`~cc2ops.cuda.array` (GPUArray helpers), :mod:`~cc2ops.cuda.compile`
(kernel templates, nvcc, cubin cache, launching), :mod:`~cc2ops.cuda.blas`
(cuBLAS), :mod:`~cc2ops.cuda.precision` (the TF32 switch),
:mod:`~cc2ops.cuda.op` (``GpuOp``), :mod:`~cc2ops.cuda.mode` (the GPU mode),
:mod:`~cc2ops.cuda.graphs` (CUDA-graph capture and replay of compiled steps),
:mod:`~cc2ops.cuda.profile` (host and device time apart).
"""

from __future__ import annotations

from cc2ops.cuda.availability import (
    CudaUnavailableError,
    is_available,
    require,
    unavailable_reason,
)
from cc2ops.cuda.device import get_device, set_device_map
from cc2ops.cuda.graphs import (
    CapturedFunction,
    CudaGraph,
    GraphCaptureError,
    capture_function,
)
from cc2ops.cuda.mode import mode
from cc2ops.cuda.op import GpuOp
from cc2ops.cuda.precision import allow_tf32, get_allow_tf32, set_allow_tf32
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
    "CudaGraph",
    "CapturedFunction",
    "GraphCaptureError",
    "capture_function",
]
