"""The GPU communicator: NCCL through NVIDIA's ``nccl4py`` (module ``nccl``).

:class:`NcclCommunicator` has the interface of
:class:`cc2ops.distributed.communicator.Communicator`. It is made from an MPI
communicator of the same processes: rank 0 draws the NCCL unique id
(``ncclGetUniqueId``), MPI broadcasts it, and every rank joins with
``ncclCommInitRank`` on its GPU (``Communicator.init`` with a non-blocking
``NCCLConfig``), polled with ``get_async_error`` until ready or until the
deadline, when the communicator is aborted and :class:`CollectiveTimeout`
names the rank. Collectives run on cc2ops's stream of the rank's device and
are polled the same way (stream query + ``get_async_error``; ``abort`` on the
deadline), so a dead peer never hangs this rank.

Data arrive as host arrays (the :class:`~cc2ops.distributed.spmd.SpmdCollective`
op is a host op) and are staged through the device; the integer exchanges of
the SPMD chain (extents, dropout offsets) and set-up go through MPI.

The one-process ``ncclCommInitAll`` path of :mod:`cc2ops.cuda.ops.comm` uses
the same nccl4py through :mod:`cc2ops.cuda.libs.nccl`; this module needs what
only the multi-process route does (unique ids over MPI, non-blocking configs,
abort) and takes nccl4py's buffer objects directly. ``nccl4py`` is imported
lazily (only when a NCCL communicator is made).
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import numpy as np

from cc2ops.cuda.runtime import array as ga
from cc2ops.cuda.runtime.device import get_device
from cc2ops.distributed.collectives import shard_sizes
from cc2ops.distributed.communicator import (
    CommError,
    Communicator,
    MPICommunicator,
)

__all__ = ["NcclCommunicator", "nccl_module"]


def nccl_module() -> Any:
    """``nccl.core`` of nccl4py, or an ImportError saying how to install it."""
    try:
        import nccl.core as core
    except ImportError as e:
        raise ImportError(
            "cc2ops.distributed: the NCCL communicator needs nccl4py (pip install "
            "'cc2ops[cuda]', which installs nccl4py; module 'nccl')"
        ) from e
    return core


def _attr(core: Any, *names: str) -> Any:
    for name in names:
        obj = core
        for part in name.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            return obj
    raise CommError(
        f"NcclCommunicator: this nccl4py has none of {names} (tested against the "
        "nccl4py 0.6 API)"
    )


def _in_progress(core: Any, state: Any) -> bool:
    text = str(getattr(state, "name", state)).lower()
    return "inprogress" in text.replace("_", "") or int(state) == 7


def _success(state: Any) -> bool:
    return int(state) == 0


class NcclCommunicator(Communicator):
    """NCCL over the processes of ``mpi`` (one GPU each); see the module doc.

    Parameters
    ----------
    mpi : MPICommunicator
        The same processes; carries the unique id and the small int exchanges.
    device : int
        The cc2ops device label of this rank's GPU.
    """

    def __init__(self, mpi: MPICommunicator, device: int) -> None:
        self.mpi = mpi
        self.rank, self.size = mpi.rank, mpi.size
        self.timeout = mpi.timeout
        self.name = f"nccl {mpi.name}"
        self.device = int(device)
        self.dev = get_device(self.device)
        core = self.core = nccl_module()
        uid = _attr(core, "get_unique_id")() if self.rank == 0 else None
        blob = pickle.dumps(uid) if uid is not None else b""
        blob = mpi.comm.bcast(blob, root=0)  # set-up: MPI already checked peers
        uid = pickle.loads(blob)
        config_cls = _attr(core, "NCCLConfig")
        config = config_cls(blocking=False)
        with self.dev.using():
            self.comm = _attr(core, "Communicator").init(
                self.size, self.rank, uid, config
            )
        self._poll(None, f"set-up ({self.name}: ncclCommInitRank)")
        red = _attr(core, "NcclRedOp", "RedOp")
        # ncclSum is 0: a falsy IntEnum member, so no ``getattr(...) or`` here
        self.SUM = red.SUM if hasattr(red, "SUM") else red.Sum

    # ---- progress ----------------------------------------------------------
    def _poll(self, stream_done: Any, what: str) -> None:
        start = time.monotonic()
        pause = 0.0
        while True:
            state = self.comm.get_async_error()
            done = _success(state) and (stream_done is None or stream_done())
            if done:
                return
            if not _success(state) and not _in_progress(self.core, state):
                self.comm.abort()
                raise CommError(
                    f"rank {self.rank} of {self.name}: {what} failed: NCCL "
                    f"{state} ({self.comm.get_last_error()})"
                )
            waited = time.monotonic() - start
            if waited > self.timeout:
                self.comm.abort()
                raise self._timeout_error(what, waited)
            if pause:
                time.sleep(pause)
            pause = min(1e-3, pause * 2 if pause else 1e-5)

    def _run(self, what: str, launch: Any, out_shape, dtype) -> np.ndarray:
        with self.dev.using():
            stream = self.dev.stream
            recv = ga.empty(out_shape, dtype, self.device)
            launch(recv, int(stream.handle))
            self._poll(stream.is_done, what)
            return ga.to_host(recv, self.device)

    def _dev(self, x: np.ndarray) -> Any:
        return ga.to_gpu(np.ascontiguousarray(x), self.device)

    # ---- collectives -------------------------------------------------------
    def all_reduce(self, x, what="all_reduce"):
        x = np.asarray(x)
        send = self._dev(x)
        return self._run(
            what,
            lambda recv, s: self.comm.allreduce(send, recv, self.SUM, stream=s),
            x.shape,
            x.dtype,
        )

    def all_gather(self, x, axis, what="all_gather"):
        x = np.asarray(x)
        front = np.ascontiguousarray(np.moveaxis(x, axis, 0))
        extents = self.mpi.all_gather_ints([front.shape[0]], what + " (extents)")[:, 0]
        rest = front.shape[1:]
        width = int(extents.max())
        # NCCL's all-gather takes equal pieces: pad each to the largest extent
        padded = np.zeros((width,) + rest, dtype=front.dtype)
        padded[: front.shape[0]] = front
        send = self._dev(padded)
        full = self._run(
            what,
            lambda recv, s: self.comm.allgather(send, recv, stream=s),
            (self.size * width,) + rest,
            front.dtype,
        )
        pieces = [full[k * width : k * width + int(e)] for k, e in enumerate(extents)]
        return np.ascontiguousarray(np.moveaxis(np.concatenate(pieces), 0, axis))

    def reduce_scatter(self, x, axis, sizes=None, what="reduce_scatter"):
        x = np.asarray(x)
        extent = x.shape[axis]
        sizes = shard_sizes(extent, self.size) if sizes is None else list(sizes)
        if len(sizes) != self.size or sum(sizes) != extent or min(sizes) < 0:
            raise ValueError(
                f"{what}: sizes {sizes} do not split an extent of {extent} into "
                f"{self.size} pieces"
            )
        front = np.ascontiguousarray(np.moveaxis(x, axis, 0))
        rest = front.shape[1:]
        width = max(sizes)
        padded = np.zeros((self.size * width,) + rest, dtype=front.dtype)
        start = 0
        for k, s in enumerate(sizes):
            padded[k * width : k * width + s] = front[start : start + s]
            start += s
        send = self._dev(padded)
        mine = self._run(
            what,
            lambda recv, st: self.comm.reduce_scatter(send, recv, self.SUM, stream=st),
            (width,) + rest,
            front.dtype,
        )[: sizes[self.rank]]
        return np.ascontiguousarray(np.moveaxis(mine, 0, axis))

    def broadcast(self, x, root, dtype, ndim, what="broadcast"):
        shape = np.zeros(ndim, dtype=np.int64)
        if self.rank == root:
            shape[:] = np.shape(x)
        shape = self.mpi.broadcast(shape, root, "int64", 1, what + " (shape)")
        send = self._dev(np.asarray(x, dtype=dtype)) if self.rank == root else None
        return self._run(
            what,
            lambda recv, s: self.comm.broadcast(
                send if send is not None else recv, recv, root, stream=s
            ),
            tuple(int(v) for v in shape),
            np.dtype(dtype),
        )

    def all_gather_ints(self, values, what="counts"):
        return self.mpi.all_gather_ints(values, what)

    def barrier(self, what="barrier"):
        self.mpi.barrier(what)

    def __repr__(self) -> str:
        return (
            f"NcclCommunicator({self.name}, rank={self.rank}, size={self.size}, "
            f"device={self.device}, timeout={self.timeout:g})"
        )
