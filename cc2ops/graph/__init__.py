"""Graph rewrites of the frontend. Importing this package registers all of them.

``db`` defines the rewrite databases (the GPU ones too) and their positions in
PyTensor's ``optdb``; each other module registers its rules into them. Nothing
here imports :mod:`cc2ops.cuda`: the GPU rewrites live in
:mod:`cc2ops.cuda.rewriting` and the GPU op modules, and register themselves
into these databases when ``cc2ops.cuda`` is imported.
"""

from cc2ops import _aliases
from cc2ops.graph import db, fuse_softmax_loss  # noqa: F401

#: 0.1 paths of modules that moved; they import with a DeprecationWarning until
#: the next release (by name, only when used: this package never imports CUDA).
MOVED = {"cc2ops.graph.lift": "cc2ops.cuda.rewriting.lift"}

_aliases.install(MOVED)
__getattr__ = _aliases.package_getattr(__name__)
