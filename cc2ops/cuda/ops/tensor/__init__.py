"""GPU ports of PyTensor's own ops, with their lifting rules.

:mod:`~.basic` (transfers of views, reshapes, dimshuffles, joins, ...),
:mod:`~.elemwise` (``Elemwise`` and fused ``Composite`` kernels),
:mod:`~.reduction` (``CAReduce`` family), :mod:`~.blas` (``Dot``, ``Gemm``,
batched products over :mod:`cc2ops.cuda.libs.cublas`), :mod:`~.softmax`.
"""

from cc2ops.cuda.ops.tensor import (  # noqa: F401  (each registers its rules)
    basic,
    blas,
    elemwise,
    reduction,
    softmax,
)

MODULES = (basic, elemwise, reduction, blas, softmax)
