"""Full-model checkpoints of SPMD training: gathered, written by one rank.

Each rank holds only its replicas and shards; :func:`save` assembles every
variable (``get_value`` of a localised variable gathers its shards over the
group, a collective every rank calls) and world rank 0 writes one ``.npz``
holding whole arrays. Because nothing in it depends on the rank count,
:func:`load` + ``set_value`` (or setting the values before compiling)
resumes at any K, group size or on a single device.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["save", "load", "FORMAT"]

#: Written into every checkpoint (key ``__format__``).
FORMAT = "cc2ops.distributed.checkpoint/1"


def _world() -> Any:
    """mpi4py's COMM_WORLD when this process runs under MPI, else None."""
    if "mpi4py.MPI" not in sys.modules:
        return None
    return sys.modules["mpi4py.MPI"].COMM_WORLD


def save(path: str | os.PathLike, variables: Sequence[Any], **meta: Any) -> Path:
    """Write the whole values of ``variables`` (by name) from world rank 0.

    Parameters
    ----------
    path : path-like
        The ``.npz`` file; written to a temporary name and renamed, so a
        crash never leaves half a checkpoint under ``path``.
    variables : sequence of shared variables
        Each must have a unique ``name``. Every rank calls ``save`` with the
        same list (the gathers are collective).
    **meta
        Scalars stored alongside (``step=...``).

    Returns
    -------
    Path
        ``path`` (on every rank, after rank 0 wrote it).
    """
    names = [v.name for v in variables]
    if any(n is None for n in names) or len(set(names)) != len(names):
        raise ValueError(f"checkpoint.save: variables need unique names, got {names}")
    values = {v.name: np.asarray(v.get_value()) for v in variables}
    path = Path(path)
    world = _world()
    rank = 0 if world is None else world.Get_rank()
    if rank == 0:
        for key in meta:
            if key in values or key == "__format__":
                raise ValueError(f"checkpoint.save: meta key {key!r} is a variable")
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            np.savez(
                f,
                __format__=FORMAT,
                **values,
                **{k: np.asarray(v) for k, v in meta.items()},
            )
        os.replace(tmp, path)
    if world is not None and world.Get_size() > 1:
        from cc2ops.distributed.communicator import MPICommunicator

        MPICommunicator(world, name="world").barrier("checkpoint.save (written)")
    return path


def load(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint written by :func:`save` (every rank reads it)."""
    with np.load(path, allow_pickle=False) as f:
        if "__format__" not in f.files or str(f["__format__"]) != FORMAT:
            raise ValueError(
                f"checkpoint.load: {path} is not a cc2ops.distributed checkpoint "
                f"(no __format__ {FORMAT!r})"
            )
        return {k: f[k] for k in f.files if k != "__format__"}
