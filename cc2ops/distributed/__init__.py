"""Backend-neutral hybrid parallelism across processes (SPMD, one per device).

- :mod:`cc2ops.distributed.spmd`: the SPMD mode (rank and size from MPI),
  the projection of the K-device graph that
  :func:`cc2ops.distributed.hybrid.distribute` builds onto one rank, two levels
  (hybrid inside a group, data-parallel across groups).
- :mod:`cc2ops.distributed.communicator`: communicators with deadlines (MPI
  on the CPU), :class:`CollectiveTimeout`, :class:`RankFailed`.
- :mod:`cc2ops.distributed.nccl`: the GPU communicator (NCCL through
  ``nccl4py``).
- :mod:`cc2ops.distributed.checkpoint`: full-model checkpoints written by
  one rank, loadable at any rank count.

Launch with ``mpirun -n K python train.py``; see the README's SPMD section.
"""

from cc2ops.distributed.communicator import (
    CollectiveTimeout,
    CommError,
    Communicator,
    MPICommunicator,
    RankFailed,
    guard,
)
from cc2ops.distributed.spmd import (
    SpmdBackend,
    SpmdCollective,
    SpmdError,
    SpmdMode,
    Topology,
    mode,
    project,
    topology,
)

__all__ = [
    "CollectiveTimeout",
    "CommError",
    "Communicator",
    "MPICommunicator",
    "RankFailed",
    "guard",
    "SpmdBackend",
    "SpmdCollective",
    "SpmdError",
    "SpmdMode",
    "Topology",
    "mode",
    "project",
    "topology",
]
