"""The GPU convolution family: ``GpuFilterActs``, ``GpuImageActs``, ``GpuWeightActs``.

:mod:`~.geometry` (the integers of a problem and the im2col chunking, pure),
:mod:`~.ops` (the ops, their lifting rules, the im2col algorithm, the
candidate list and its autotuning), :mod:`~.fft` (the FFT algorithm),
:mod:`~.igemm` (the implicit-GEMM tiles).
"""

from cc2ops.cuda.ops.conv import fft, geometry, igemm, ops  # noqa: F401
from cc2ops.cuda.ops.conv.ops import GpuFilterActs, GpuImageActs, GpuWeightActs

__all__ = ["GpuFilterActs", "GpuImageActs", "GpuWeightActs"]

MODULES = (geometry, igemm, fft, ops)
