"""The 0.1 path of :mod:`cc2ops.rewriting`; importing it warns (until the next release).

Only this ``__init__`` is left here. The old module paths resolve, each with
its own ``DeprecationWarning``, to where the modules are now (:data:`MOVED`,
through :mod:`cc2ops._aliases`). Nothing in cc2ops imports this package.
"""

from cc2ops import _aliases

#: The 0.1 paths of this package's modules and where they are now; each old
#: path imports with a DeprecationWarning until the next release (by name,
#: only when used: this package never imports CUDA).
MOVED = {
    "cc2ops.graph.db": "cc2ops.rewriting.db",
    "cc2ops.graph.fuse_softmax_loss": "cc2ops.rewriting.fuse_softmax_loss",
    "cc2ops.graph.lift": "cc2ops.cuda.rewriting.lift",
    "cc2ops.graph.multi_gpu": "cc2ops.distributed.hybrid",
}

_aliases.install(MOVED)
__getattr__ = _aliases.package_getattr(__name__)
_aliases.warn_moved_package(__name__, "cc2ops.rewriting")
