"""``train.py`` under ``mpirun``: one process per device (``cc2ops.distributed``).

``mpirun -n K python train.py ...`` (or ``--spmd``) trains with the hybrid
rewrite run SPMD: every rank builds the same single-device model, draws the
same epoch plan (same seed, same order, crops and flips) and passes the same
global batch of ``K x --batch-size`` images to its step; the step's graph
keeps only the rank's share (its slice of the batch in the conv segment, its
FC slices), so the run equals the single-process one. World rank 0 logs and
writes the checkpoints, metrics and plot into ``--out``; the other ranks run
the same code (their ``get_value`` calls are the gathers rank 0's checkpoint
needs) with their files in a private temporary folder, deleted at exit.
Checkpoints hold whole arrays, so a run resumes at any rank count.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


def launched_by_mpirun() -> bool:
    """True when an MPI launcher started this process among several."""
    for var in _SIZE_VARS:
        try:
            if int(os.environ.get(var, "1")) > 1:
                return True
        except ValueError:
            continue
    return False


def spmd_backend(
    backend_cls: type, device: str, devices: int, group_size: int | None
) -> Any:
    """A ``train.Backend`` running the step SPMD over the MPI world.

    Parameters
    ----------
    backend_cls : type
        ``train.Backend``.
    device : str
        ``cpu`` (MPI collectives on the host) or ``cuda`` (each rank on the
        GPU of its local rank, NCCL collectives).
    devices : int
        Must be 1: each process drives one device.
    group_size : int or None
        Ranks per hybrid-parallel group (default: the ranks of one host).
    """
    import pytensor

    import cc2ops
    import cc2ops.distributed as dist
    from cc2ops.distributed import hybrid as mg

    if devices != 1:
        raise ValueError(
            f"--spmd runs one device per process; --devices {devices} must be 1 "
            "(launch more processes: mpirun -n K)"
        )
    if device == "cpu":
        mode = dist.mode(group_size)
        shared: Callable[[Any, str], Any] = lambda v, name: pytensor.shared(  # noqa: E731
            v, name=name
        )
        eval_mode, label = cc2ops.mode, None
    else:
        from cc2ops import cuda

        probe = dist.topology(group_size)
        label = probe.local_rank
        base = cuda.mode(device=label)
        mode = dist.mode(group_size, base=base, collectives="nccl", device=label)
        shared = lambda v, name: cuda.shared(v, device=label, name=name)  # noqa: E731
        eval_mode = base
    topo = mode.topology
    name = f"spmd rank {topo.rank} of {topo.size} ({device})"
    return backend_cls(
        f"{name}, groups of {topo.group_size}",
        mode,
        shared,
        n_devices=topo.size,
        distribute=lambda outs: mg.distribute(outs, mode),
        sync=mg.sync,
        eval_mode=eval_mode,
        dropout_device=None,
    )


def is_root(backend: Any) -> bool:
    """Whether this process logs and writes (world rank 0, or no SPMD)."""
    topo = getattr(getattr(backend.mode, "backend", None), "topo", None)
    return topo is None or topo.rank == 0


def output_folder(out: Path, backend: Any) -> Path:
    """``out`` on the root rank; a private temporary folder elsewhere."""
    if is_root(backend):
        return out
    private = Path(tempfile.mkdtemp(prefix="cc2ops-rank-"))
    atexit.register(shutil.rmtree, private, True)
    return private


@contextlib.contextmanager
def guard(active: bool) -> Iterator[None]:
    """``cc2ops.distributed.guard()`` when SPMD is on: a failing rank tells
    the others, which stop at once naming it, instead of waiting."""
    if not active:
        yield
        return
    from cc2ops.distributed import guard as dist_guard

    with dist_guard():
        yield
