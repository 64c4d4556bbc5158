"""cc2ops: cuda-convnet-style convolutional-network ops for PyTensor.

The public functions build PyTensor graphs; every op has a vectorised numpy
implementation on the CPU, shape inference and gradients. Importing cc2ops
registers its graph rewrites (softmax-loss fusion in ``fast_run``; the GPU
rewrites only in the GPU modes of :mod:`cc2ops.cuda`).

Axis order: images are (B, C, H, W) ("bc01") unless ``layout="c01b"``
(C, H, W, B) is given; see :mod:`cc2ops.layout`.

``cc2ops.mode`` is the registered CPU :class:`pytensor.compile.mode.Mode`
("CC2OPS"): ``fast_run`` rewrites with the ``cvm`` linker.
"""

from cc2ops import (
    _aliases,
    rewriting,  # noqa: F401  (registers the rewrites)
)
from cc2ops.backends import install_hooks as _install_backend_hooks
from cc2ops.conv import FilterActs, ImageActs, WeightActs, conv2d
from cc2ops.cross_map_norm import CrossMapNorm, CrossMapNormGrad, cross_map_norm
from cc2ops.dropout import dropout, dropout_state
from cc2ops.mode import mode
from cc2ops.pool import (
    AvgPool,
    AvgPoolGrad,
    MaxPool,
    MaxPoolGrad,
    MaxPoolGradGrad,
    avg_pool2d,
    max_pool2d,
)
from cc2ops.softmax_cross_entropy import (
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyGrad,
    TopKError,
    softmax_cross_entropy,
    top_k_error,
)

__version__ = "0.1.0"

_install_backend_hooks()

#: 0.1 paths of frontend modules that moved or were renamed (one name per op
#: family at every layer); each imports with a DeprecationWarning until the
#: next release (:mod:`cc2ops._aliases`).
MOVED = {
    "cc2ops.comm": "cc2ops.distributed.collectives",
    "cc2ops.response_norm": "cc2ops.cross_map_norm",
    "cc2ops.softmax_loss": "cc2ops.softmax_cross_entropy",
}

_aliases.install(MOVED)
__getattr__ = _aliases.package_getattr(__name__)

__all__ = [
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "cross_map_norm",
    "softmax_cross_entropy",
    "top_k_error",
    "dropout",
    "dropout_state",
    "mode",
    "FilterActs",
    "ImageActs",
    "WeightActs",
    "MaxPool",
    "MaxPoolGrad",
    "MaxPoolGradGrad",
    "AvgPool",
    "AvgPoolGrad",
    "CrossMapNorm",
    "CrossMapNormGrad",
    "SoftmaxCrossEntropy",
    "SoftmaxCrossEntropyGrad",
    "TopKError",
]
