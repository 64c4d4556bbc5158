"""The cc2ops rewrite databases and where they sit in PyTensor's ``optdb``.

Each database is registered once, here, under its own tag, so a mode opts in
by name (``mode.including("cc2ops_gpu")``) and a user opts out the same way
(``mode.excluding("cc2ops_fuse_softmax_loss")``). Rewrite modules under
``cc2ops.rewriting`` register their rules into these databases when
:mod:`cc2ops.rewriting` is imported; the GPU rules (:mod:`cc2ops.cuda.rewriting`
and the GPU op modules) register theirs when :mod:`cc2ops.cuda` is imported.
The databases live here, in the frontend, so the GPU backend registers into
them and nothing here imports the backend.

Positions in ``optdb`` (PyTensor's own stages for reference: ``canonicalize``
1, ``stabilize`` 1.5, ``BlasOpt`` 1.7, ``specialize`` 2, ``elemwise_fusion``
49, ``add_destroy_handler`` 49.5, ``inplace_elemwise`` 50.5):

``cc2ops_fuse_softmax_loss`` (1.55)
    After ``stabilize`` has turned ``log(softmax(x))`` into ``log_softmax(x)``
    and before ``specialize``. Tagged ``fast_run`` too: the fused op is exact,
    more stable than the graph it replaces, and only matches the softmax-loss
    patterns, so the default mode gets it once cc2ops is imported.
``cc2ops_static_shapes`` (0.2)
    Tagged ``jax`` and ``mlx`` only: makes the (H, W)-style inputs of the
    gradient ops static for backends that trace with concrete shapes (see
    :mod:`cc2ops.backends.rewriting`). Right after ``ShapeOpt`` (0.1) and
    before ``canonicalize``, which would turn ``x.shape[2]`` into arithmetic
    of other shapes that a tracer cannot read.
``cc2ops_gpu_lift`` (49.2)
    Host op -> GPU op rules and transfer cancelling. After PyTensor's
    elementwise fusion, so fused ``Composite`` nodes are lifted whole; before
    the destroy handler, so lifted nodes are still pure. Only GPU modes
    include it.
``cc2ops_gpu_inplace`` (50.6)
    In-place variants of GPU ops, after ``add_destroy_handler`` and after
    PyTensor's own ``inplace_elemwise``.
``cc2ops_transfer_cancel``
    At 49.25 under ``fast_run`` because cancelling a transfer pair is always
    right and only ever matches cc2ops transfer ops. Inside
    ``cc2ops_gpu_lift`` every cancelling rule but
    ``host_from_gpu(gpu_from_host(x)) -> x`` runs too (see
    :mod:`cc2ops.cuda.rewriting.lift`): that one waits until lifting is done,
    since an explicit upload is what tells the lifting which data is on the
    GPU.
"""

from __future__ import annotations

from pytensor.compile.mode import optdb
from pytensor.graph.rewriting.db import EquilibriumDB, SequenceDB

STATIC_SHAPES_POSITION = 0.2
FUSE_SOFTMAX_LOSS_POSITION = 1.55
GPU_LIFT_POSITION = 49.2
TRANSFER_CANCEL_POSITION = 49.25
GPU_INPLACE_POSITION = 50.6

#: Softmax + cross-entropy fusion rules (CPU; GPU lifting picks the result up).
fuse_softmax_loss_db = EquilibriumDB()

#: Static (H, W) inputs for JAX and MLX (tags ``jax``, ``mlx``).
static_shapes_db = SequenceDB()

#: Host -> GPU lifting, applied until no rule matches.
gpu_lift_db = EquilibriumDB()

#: Cancelling back-to-back transfers (a sub-database of the lift and on its own).
transfer_cancel_db = EquilibriumDB()

#: In-place GPU variants, one pass after the destroy handler exists.
gpu_inplace_db = SequenceDB()

_REGISTERED = False


def register_databases() -> None:
    """Put the cc2ops databases into ``optdb`` (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    optdb.register(
        "cc2ops_fuse_softmax_loss",
        fuse_softmax_loss_db,
        "fast_run",
        "cc2ops",
        position=FUSE_SOFTMAX_LOSS_POSITION,
    )
    optdb.register(
        "cc2ops_static_shapes",
        static_shapes_db,
        "jax",
        "mlx",
        position=STATIC_SHAPES_POSITION,
    )
    optdb.register(
        "cc2ops_gpu_lift",
        gpu_lift_db,
        "cc2ops_gpu",
        position=GPU_LIFT_POSITION,
    )
    optdb.register(
        "cc2ops_transfer_cancel",
        transfer_cancel_db,
        "fast_run",
        "cc2ops_gpu",
        position=TRANSFER_CANCEL_POSITION,
    )
    optdb.register(
        "cc2ops_gpu_inplace",
        gpu_inplace_db,
        "cc2ops_gpu",
        "inplace",
        position=GPU_INPLACE_POSITION,
    )
    _REGISTERED = True


register_databases()
