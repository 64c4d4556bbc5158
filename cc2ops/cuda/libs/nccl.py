"""NCCL for one process driving K GPUs, over NVIDIA's nccl4py (module ``nccl``).

:class:`Communicators` is the one-process model of the in-process GPU
collectives (:mod:`cc2ops.cuda.ops.comm`): ``ncclCommInitAll`` over distinct
physical devices, one communicator per device, rank ``k`` on ``physical[k]``;
collectives are issued as group calls (:func:`group`) on each device's cc2ops
stream. :func:`unique_id` and :func:`init_rank` are the one-process-per-GPU
route (ranks started by MPI exchange the id out of band; the SPMD path,
:mod:`cc2ops.distributed.nccl`, uses nccl4py the same way).

What comes from where:

- ``nccl.core`` (nccl4py's public API) for everything it serves: creating the
  communicators (``Communicator.init_all``, ``Communicator.init``), destroying
  them, their last error, group start/end, unique ids, the version, error
  strings, and the enums (``NcclDataType``, ``NcclRedOp``) behind
  :data:`DTYPES` and :data:`SUM`.
- ``nccl.bindings.nccl`` (nccl4py's typed layer under ``nccl.core``: ints for
  pointers, counts and streams; it raises ``NCCLError`` on a failing
  ``ncclResult_t``) for the collectives themselves. ``nccl.core``'s
  ``Communicator.allreduce`` & co. take whole buffer objects (CUDA array
  interface or DLPack) and infer the count from them, while cc2ops exchanges
  pieces at byte offsets inside one pycuda allocation with explicit counts;
  and they resolve every buffer through nccl4py's torch and CuPy interop on
  every call (importing PyTorch, where it is installed, on the first). The
  typed layer takes exactly what the C API takes. No ctypes is left.

libnccl is located by cuda-pathfinder (:mod:`cc2ops.cuda.runtime.libraries`:
NVIDIA's ``nvidia-nccl-cu13`` wheel, ``$CONDA_PREFIX``, the system loader path,
``$NCCL_HOME``); 0.1's ``CC2OPS_NCCL_LIBRARY`` is gone. Importing this module
imports neither nccl4py nor libnccl. Without them :func:`load` raises
:class:`NcclUnavailableError` naming what is missing; a failing call raises
:class:`NcclError` with NCCL's error string and the communicator's last error.

:func:`call` keeps 0.1's calling convention (C function names, ctypes values),
so :mod:`cc2ops.cuda.ops.comm` works unchanged on this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from cc2ops.cuda.runtime.libraries import binding, load_library

__all__ = [
    "NcclError",
    "NcclUnavailableError",
    "load",
    "library_path",
    "version",
    "error_string",
    "unique_id",
    "init_rank",
    "Communicators",
    "communicators",
    "DTYPES",
    "group",
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "call",
]

_WHERE = "cc2ops.cuda.libs.nccl"


class NcclUnavailableError(RuntimeError):
    """nccl4py or libnccl could not be loaded."""


class NcclError(RuntimeError):
    """An NCCL call failed; ``status`` is the ``ncclResult_t``."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------

_lock = threading.Lock()
_loaded: tuple[ModuleType, ModuleType] | None = None


def _modules() -> tuple[ModuleType, ModuleType]:
    """(``nccl.core``, ``nccl.bindings.nccl``) with libnccl loaded, memoised."""
    global _loaded
    if _loaded is None:
        user = f"{_WHERE} (NCCL)"
        core = binding("nccl.core", user=user, error=NcclUnavailableError)
        raw = binding("nccl.bindings.nccl", user=user, error=NcclUnavailableError)
        load_library("nccl", user=user, error=NcclUnavailableError)
        _loaded = (core, raw)
    return _loaded


def _core() -> ModuleType:
    return _modules()[0]


def _enums() -> ModuleType:
    """``nccl.core`` for its enums only (no libnccl needed)."""
    return binding("nccl.core", user=f"{_WHERE} (NCCL)", error=NcclUnavailableError)


def _raw() -> ModuleType:
    return _modules()[1]


def load() -> ModuleType:
    """``nccl.core`` with libnccl loaded (memoised), else
    :class:`NcclUnavailableError` naming what is missing."""
    return _core()


def library_path() -> str:
    """The path libnccl was loaded from."""
    _modules()
    return load_library("nccl", user=_WHERE, error=NcclUnavailableError)


def version() -> tuple[int, int, int]:
    """NCCL's (major, minor, patch), e.g. (2, 28, 3)."""
    lib = _core().get_version().libnccl
    if lib is None:
        raise NcclUnavailableError(f"{_WHERE}: libnccl reports no version")
    v = lib.version
    return int(v.major), int(v.minor), int(v.micro)


def error_string(status: int) -> str:
    """NCCL's text for an ``ncclResult_t``."""
    return str(_core().get_error_string(int(status)))


def _raise(name: str, e: Exception, comm: Any) -> None:
    status = getattr(e, "status", None)
    status = int(status) if status is not None else None
    text = error_string(status) if status is not None else str(e)
    msg = f"{_WHERE}: {name} failed: {text}"
    if status is not None:
        msg += f" (status {status})"
    if comm is not None:
        try:
            last = _raw().get_last_error(comm)
        except Exception:  # the message above already says what failed
            last = ""
        if last:
            msg += f": {last}"
    raise NcclError(msg, status) from e


def _run(name: str, fn: Any, *args: Any, comm: Any = None) -> Any:
    """``fn(*args)``; nccl4py's ``NCCLError`` becomes :class:`NcclError`."""
    try:
        return fn(*args)
    except _raw().NCCLError as e:
        _raise(name, e, comm)


# --------------------------------------------------------------------------
# enums
# --------------------------------------------------------------------------


class _DataTypes(Mapping):
    """numpy dtype -> nccl4py's ``NcclDataType``; resolved on first use, so
    membership tests need no nccl4py."""

    _KEYS = tuple(
        np.dtype(n)
        for n in (
            "int8",
            "uint8",
            "int32",
            "uint32",
            "int64",
            "uint64",
            "float16",
            "float32",
            "float64",
        )
    )

    def __getitem__(self, dtype: Any) -> Any:
        dt = np.dtype(dtype)
        if dt not in self._KEYS:
            raise KeyError(dt)
        return _enums().NcclDataType.from_numpy_dtype(dt)

    def __contains__(self, dtype: object) -> bool:
        try:
            return np.dtype(dtype) in self._KEYS  # type: ignore[call-overload]
        except TypeError:
            return False

    def __iter__(self) -> Iterator[np.dtype]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)


#: numpy dtype -> ``ncclDataType_t`` (nccl4py's ``NcclDataType`` members)
DTYPES: Mapping[np.dtype, Any] = _DataTypes()


def __getattr__(name: str) -> Any:
    # ``SUM`` (ncclSum) is nccl4py's NcclRedOp.SUM, looked up when first asked
    # for so that importing this module imports no nccl4py (hence not in
    # __all__: a star import would load it)
    if name == "SUM":
        return _enums().NcclRedOp.SUM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------
# communicators
# --------------------------------------------------------------------------


def unique_id() -> Any:
    """A new ``nccl.core.UniqueId`` (rank 0 makes it and sends it to the others;
    it pickles, and ``bytes(uid)`` / ``UniqueId.from_bytes`` round-trip)."""
    return _run("ncclGetUniqueId", _core().get_unique_id)


def init_rank(nranks: int, uid: Any, rank: int) -> Any:
    """``ncclCommInitRank``: this process's ``nccl.core.Communicator`` (on the
    current CUDA device)."""
    core = _core()
    return _run("ncclCommInitRank", core.Communicator.init, int(nranks), int(rank), uid)


class Communicators:
    """One NCCL communicator per physical device, from ``ncclCommInitAll``.

    Parameters
    ----------
    physical : sequence of int
        Distinct physical device indices, in rank order.

    Attributes
    ----------
    communicators : list of nccl.core.Communicator
        nccl4py's communicators, rank order.
    comms : list
        Their handles as the collectives take them (``comm`` of
        :func:`all_reduce` & co., and of :func:`call`).
    """

    def __init__(self, physical: Sequence[int]) -> None:
        physical = [int(p) for p in physical]
        if len(set(physical)) != len(physical):
            raise ValueError(
                f"{_WHERE}: a communicator needs distinct physical devices, got "
                f"{physical} (labels sharing a GPU use the virtual backend)"
            )
        core, raw = _modules()
        self.physical = tuple(physical)
        self.communicators = list(
            _run("ncclCommInitAll", core.Communicator.init_all, list(physical))
        )
        self.comms = [raw.Comm(c.ptr) for c in self.communicators]
        self._alive = True

    @property
    def n(self) -> int:
        return len(self.comms)

    def destroy(self) -> None:
        """``ncclCommDestroy`` every communicator, one after the other, as
        0.1 did and as nccl-tests does for ``ncclCommInitAll`` (idempotent)."""
        if not self._alive:
            return
        self._alive = False
        for c in self.communicators:
            _run("ncclCommDestroy", c.destroy)

    def __repr__(self) -> str:
        return f"Communicators(physical={self.physical})"


_comms: dict[tuple[int, ...], Communicators] = {}
_hook_registered = False


def _destroy_all() -> None:
    for c in list(_comms.values()):
        try:
            c.destroy()
        except NcclError:
            pass
    _comms.clear()


def communicators(physical: Sequence[int]) -> Communicators:
    """The memoised :class:`Communicators` of ``physical`` (destroyed at shutdown)."""
    global _hook_registered
    key = tuple(int(p) for p in physical)
    with _lock:
        comm = _comms.get(key)
    if comm is None:
        comm = Communicators(key)
        with _lock:
            _comms[key] = comm
            if not _hook_registered:
                from cc2ops.cuda.runtime.device import register_shutdown_hook

                register_shutdown_hook(_destroy_all)
                _hook_registered = True
    return comm


# --------------------------------------------------------------------------
# group calls and collectives (pointers, counts and streams as ints)
# --------------------------------------------------------------------------


def group_start() -> None:
    """``ncclGroupStart``."""
    _run("ncclGroupStart", _core().group_start)


def group_end() -> None:
    """``ncclGroupEnd``: the grouped collectives are enqueued on their streams."""
    _run("ncclGroupEnd", _core().group_end)


@contextlib.contextmanager
def group() -> Iterator[None]:
    """``ncclGroupStart`` ... ``ncclGroupEnd`` around a block (one collective
    over K devices from one thread must be grouped, or the first call waits
    for the others forever)."""
    group_start()
    try:
        yield
    finally:
        group_end()


def all_reduce(
    send: int, recv: int, count: int, dtype: Any, op: Any, comm: Any, stream: int
) -> None:
    """``ncclAllReduce`` of ``count`` elements at device address ``send``."""
    _run("ncclAllReduce", _raw().all_reduce, int(send), int(recv), int(count),
         int(dtype), int(op), comm, int(stream), comm=comm)  # fmt: skip


def broadcast(
    send: int, recv: int, count: int, dtype: Any, root: int, comm: Any, stream: int
) -> None:
    """``ncclBroadcast`` from rank ``root`` (``send`` is read on the root only)."""
    _run("ncclBroadcast", _raw().broadcast, int(send), int(recv), int(count),
         int(dtype), int(root), comm, int(stream), comm=comm)  # fmt: skip


def reduce(
    send: int,
    recv: int,
    count: int,
    dtype: Any,
    op: Any,
    root: int,
    comm: Any,
    stream: int,
) -> None:
    """``ncclReduce`` to rank ``root`` (``recv`` is written on the root only)."""
    _run("ncclReduce", _raw().reduce, int(send), int(recv), int(count), int(dtype),
         int(op), int(root), comm, int(stream), comm=comm)  # fmt: skip


def all_gather(
    send: int, recv: int, count: int, dtype: Any, comm: Any, stream: int
) -> None:
    """``ncclAllGather``: ``count`` elements from each rank, in rank order."""
    _run("ncclAllGather", _raw().all_gather, int(send), int(recv), int(count),
         int(dtype), comm, int(stream), comm=comm)  # fmt: skip


def reduce_scatter(
    send: int, recv: int, count: int, dtype: Any, op: Any, comm: Any, stream: int
) -> None:
    """``ncclReduceScatter``: rank k receives reduced piece k of ``count``."""
    _run("ncclReduceScatter", _raw().reduce_scatter, int(send), int(recv),
         int(count), int(dtype), int(op), comm, int(stream), comm=comm)  # fmt: skip


_CALLS = {
    "ncclGroupStart": group_start,
    "ncclGroupEnd": group_end,
    "ncclAllReduce": all_reduce,
    "ncclBroadcast": broadcast,
    "ncclReduce": reduce,
    "ncclAllGather": all_gather,
    "ncclReduceScatter": reduce_scatter,
}


def _plain(value: Any) -> Any:
    """A ctypes scalar as its Python value (a NULL ``c_void_p`` as 0); anything
    else (ints, enum members, communicator handles) unchanged."""
    if isinstance(value, ctypes._SimpleCData):
        return value.value or 0
    return value


def call(name: str, *args: Any, comm: Any = None) -> None:
    """Call NCCL function ``name`` with the C API's arguments, in its order.

    0.1's convention, kept for :mod:`cc2ops.cuda.ops.comm`: ``name`` is the C name
    (``"ncclAllReduce"``, ``"ncclBroadcast"``, ``"ncclReduce"``,
    ``"ncclAllGather"``, ``"ncclReduceScatter"``, ``"ncclGroupStart"``,
    ``"ncclGroupEnd"``), pointers and counts may be ctypes values, and the
    communicator is an entry of :attr:`Communicators.comms`. ``comm`` is
    accepted for compatibility (the functions name the communicator's last
    error themselves). New code calls :func:`all_reduce` & co. directly.
    """
    fn = _CALLS.get(name)
    if fn is None:
        raise ValueError(
            f"{_WHERE}.call: unknown NCCL function {name!r}; this adapter calls "
            f"{', '.join(sorted(_CALLS))}"
        )
    fn(*(_plain(a) for a in args))
