"""The GPU ops, one module (or package) per family, above the GPU graph core.

Families of cc2ops: :mod:`~.conv`, :mod:`~.pool`, :mod:`~.cross_map_norm`,
:mod:`~.softmax_cross_entropy`, :mod:`~.dropout`, the collectives :mod:`~.comm`
(which also register the GPU backend of the multi-device rewriter); the input
pipeline's :mod:`~.image_augment` (a launcher, no graph op); GPU ports of
PyTensor's ops: :mod:`~.tensor`. Each module registers, when imported, its lifting rules
(:func:`cc2ops.cuda.rewriting.lift.register_lift`) and kernel variants
(:func:`cc2ops.cuda.runtime.compile.register_variants`); importing this package
imports every one of them, by name, so there is no scan and a new family is
added to the list below.
"""

from __future__ import annotations

from cc2ops import _aliases
from cc2ops.cuda.ops import (  # noqa: F401  (each registers its rules at import)
    comm,
    conv,
    cross_map_norm,
    dropout,
    image_augment,
    pool,
    softmax_cross_entropy,
    tensor,
)
from cc2ops.cuda.runtime import array, profile  # register the copy/fill/spin kernels

__all__ = ["MODULES", "MOVED", "load_gpu_op_modules"]

#: Family modules that were renamed (one name per op family at every layer);
#: the old paths import with a DeprecationWarning until the next release.
MOVED = {
    "cc2ops.cuda.ops.response_norm": "cc2ops.cuda.ops.cross_map_norm",
    "cc2ops.cuda.ops.softmax_loss": "cc2ops.cuda.ops.softmax_cross_entropy",
}

#: Every module that registers GPU ops, lifting rules or kernel variants (the
#: runtime's copy, fill and spin kernels included, for the compile test).
MODULES = (
    array,
    profile,
    *tensor.MODULES,
    *conv.MODULES,
    pool,
    cross_map_norm,
    softmax_cross_entropy,
    dropout,
    comm,
    image_augment,
)


def load_gpu_op_modules() -> list[str]:
    """The names of :data:`MODULES` (all imported with this package)."""
    return [m.__name__ for m in MODULES]


_aliases.install(MOVED)
__getattr__ = _aliases.package_getattr(__name__)
