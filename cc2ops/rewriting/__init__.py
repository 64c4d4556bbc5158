"""Graph rewrites of the frontend. Importing this package registers all of them.

``db`` defines the rewrite databases (the GPU ones too) and their positions in
PyTensor's ``optdb``; each other module registers its rules into them. Nothing
here imports :mod:`cc2ops.cuda`: the GPU rewrites live in
:mod:`cc2ops.cuda.rewriting` and the GPU op modules, and register themselves
into these databases when ``cc2ops.cuda`` is imported. The multi-device
rewriter is :mod:`cc2ops.distributed.hybrid`.

The 0.1 path of this package, ``cc2ops.graph``, still imports, with a
``DeprecationWarning``, until the next release.
"""

from cc2ops.rewriting import db, fuse_softmax_loss  # noqa: F401
