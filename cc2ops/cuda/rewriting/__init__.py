"""Rewrites that move host graphs onto the GPU.

:mod:`~.lift` holds the lifting machinery (:func:`~.lift.register_lift`, the
one rewriter that applies every registered rule) and the transfer-cancelling
rules. The rules for each op family live with the family's GPU ops
(:mod:`cc2ops.cuda.ops`), which register them here when imported.
"""

from cc2ops.cuda.rewriting import lift  # noqa: F401  (registers the rewriters)
