"""Graph rewrites of cc2ops. Importing this package registers all of them.

``db`` defines the rewrite databases and their positions in PyTensor's
``optdb``; each other module registers its rules into them.
"""

from cc2ops.graph import db, fuse_softmax_loss, lift  # noqa: F401
