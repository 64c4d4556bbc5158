"""Automatic CUDA-graph replay of compiled functions: ``cc2ops.cuda.mode(graphs=True)``.

A function compiled in ``cc2ops.cuda.mode(graphs=True)`` is called like any
other: numpy arrays in, numpy arrays (host outputs) or GPUArrays (GPU outputs)
out. Behind the call, its VM is wrapped in a :class:`ReplayVM`:

- The first call with a given *signature* (every input's kind, shape, dtype
  and strides) runs eagerly: it compiles kernels and autotunes.
- The next call with the same signature is captured into a
  :class:`~cc2ops.cuda.runtime.cudagraph.CudaGraph`; that call and every later one with
  the signature replays it with one driver call.
- Host inputs are copied into pinned (page-locked) staging buffers in
  chunks, and each chunk is uploaded as soon as it is staged, so the host's
  copy of one chunk overlaps the upload of the one before
  (:func:`stage_upload`); the uploads land in device buffers of the graph,
  which the graph copies from (device to device) where the eager function
  would have uploaded. Host outputs are downloaded inside the graph into
  pinned buffers, and each call returns fresh copies of them, after one
  synchronisation. GPU outputs are copied into fresh GPUArrays (a device
  copy each), so values a caller keeps are never overwritten by a later
  replay.
- Updated GPU shared variables keep their buffers: the graph copies each new
  value back into the variable's buffer (as :func:`capture_function` does).
  Updated host shared variables work too when their new value is computed on
  the GPU (it comes back through a pinned output).
- A new signature captures a new graph; at most ``max_graphs`` are kept (the
  least recently used is freed first).
- The softmax ops' label checks still raise ``ValueError``: they are deferred
  to after each replay (:func:`~cc2ops.cuda.runtime.cudagraph.defer_check`).

What cannot be captured runs eagerly, and a :class:`ReplayWarning` says why,
once per function: host work that depends on *values* (not shapes) of host
inputs or of downloaded results (its result would be baked into the graph), a
GPU op that reads a host value on the host, a function spanning several
physical devices, an input that is neither a host nor a GPU array, or a
capture that failed (something synchronised). :func:`capture_plan` gives the
verdict for a rewritten graph without a GPU.

:func:`~cc2ops.cuda.runtime.cudagraph.capture_function` stays the explicit API (GPU
inputs and outputs only, outputs are the graph's own buffers).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pytensor.compile.ops import DeepCopyOp
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.tensor.shape import Shape, Shape_i
from pytensor.tensor.type import TensorType

from cc2ops.cuda import transfer
from cc2ops.cuda.op import GpuOp
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.cudagraph import CudaGraph, GraphCaptureError
from cc2ops.cuda.runtime.device import get_device, physical_index
from cc2ops.cuda.transfer import GpuFromHost, HostFromGpu
from cc2ops.cuda.type import CudaArrayType

__all__ = [
    "ReplayVM",
    "ReplayWarning",
    "CapturePlan",
    "capture_plan",
    "stage_upload",
    "DEFAULT_MAX_GRAPHS",
]

#: Graphs kept per function (each holds the memory of one step's intermediates).
DEFAULT_MAX_GRAPHS = 4

#: Staging copies of at least this many bytes are split over threads (numpy
#: releases the GIL while copying; one thread copies about 10 GB/s).
PARALLEL_COPY_BYTES = 8 << 20
#: The size of the chunks a large host input is staged and uploaded in: the
#: upload of one chunk overlaps the staging copy of the next ones.
UPLOAD_CHUNK_BYTES = 4 << 20

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()

#: Host ops whose outputs depend on the *shapes* of their inputs only.
_SHAPE_OPS = (Shape, Shape_i)


class ReplayWarning(UserWarning):
    """A function of a ``graphs=True`` mode that runs eagerly, and why."""


@dataclass
class CapturePlan:
    """What :func:`capture_plan` found out about a rewritten graph.

    Attributes
    ----------
    capturable : bool
    reason : str
        Why not, when not capturable ("" otherwise).
    device : int or None
        The device label whose stream a graph captures.
    """

    capturable: bool
    reason: str = ""
    device: int | None = None


def _is_gpu(var: Variable) -> bool:
    return isinstance(var.type, CudaArrayType)


def capture_plan(fgraph: Any) -> CapturePlan:
    """Whether calls of the (rewritten) ``fgraph`` can be replayed as a CUDA graph.

    A host value is *value-dependent* when it is a non-constant host input or
    the result of ``HostFromGpu``, or is computed from one by a host op other
    than ``Shape``/``Shape_i`` (shapes are part of a call's signature, so work
    on them is the same on every replay). A graph is capturable when it has
    GPU variables on one physical device, every GPU op reads only
    non-value-dependent host inputs (``GpuFromHost`` excepted: its copy is
    captured), and no host op computes on value-dependent data (except that a
    value-dependent host value may be an output of the function).

    Needs no GPU: it reads types and ops only.
    """
    labels = sorted({v.type.device for v in fgraph.variables if _is_gpu(v)})
    if not labels:
        return CapturePlan(False, "the function has no GPU variables")
    try:
        physical = {physical_index(d) for d in labels}
    except Exception as e:  # a label the device map cannot place
        return CapturePlan(False, f"device labels {labels}: {e}")
    if len(physical) != 1:
        return CapturePlan(
            False,
            f"the function spans physical devices {sorted(physical)}; a graph "
            "captures one device's stream",
        )
    for v in fgraph.inputs:
        if not isinstance(v.type, (TensorType, CudaArrayType)):
            return CapturePlan(False, f"input {v} has type {v.type}, not an array")
    value_dep: set[Variable] = {
        v
        for v in fgraph.inputs
        if isinstance(v.type, TensorType) and not isinstance(v, Constant)
    }
    for node in fgraph.toposort():
        op = node.op
        if isinstance(op, HostFromGpu):
            value_dep.update(node.outputs)
            continue
        if isinstance(op, GpuFromHost):
            continue
        if isinstance(op, GpuOp):
            for i in node.inputs:
                if i in value_dep:
                    return CapturePlan(
                        False,
                        f"{op} reads the host value {i} on the host; a graph would "
                        "replay the value of its capture",
                    )
            continue
        if isinstance(op, _SHAPE_OPS):
            continue
        hit = [i for i in node.inputs if i in value_dep]
        if hit:
            what = "copies" if isinstance(op, DeepCopyOp) else "computes on"
            return CapturePlan(
                False,
                f"host op {op} {what} the value of {hit[0]}; host work on values "
                "is not recorded in a CUDA graph",
            )
    return CapturePlan(True, "", labels[0])


def _stage_pool() -> ThreadPoolExecutor | None:
    """The staging threads (``None`` on a one-core machine)."""
    global _pool
    n = min(8, os.cpu_count() or 1)
    if n < 2:
        return None
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(n, thread_name_prefix="cc2ops-stage")
    return _pool


def _chunks(rows: int, row_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """Row ranges ``[a, b)`` of about ``chunk_bytes`` each covering ``rows``."""
    per = max(1, chunk_bytes // max(1, row_bytes))
    return [(a, min(rows, a + per)) for a in range(0, rows, per)]


def _copy_rows(dst: np.ndarray, src: np.ndarray) -> None:
    np.copyto(dst, src, casting="no")


def stage_upload(
    pinned: np.ndarray, landing: Any, src: np.ndarray, stream: Any
) -> None:
    """Copy ``src`` into ``pinned`` and queue its upload into ``landing``.

    ``pinned`` is a C-contiguous page-locked array of ``src``'s shape and
    dtype, ``landing`` a C-contiguous GPUArray of the same shape. Inputs of
    at least :data:`PARALLEL_COPY_BYTES` are split along axis 0 into chunks
    of about :data:`UPLOAD_CHUNK_BYTES`, copied by the staging threads, and
    each chunk's upload is queued on ``stream`` as soon as its copy is done:
    the upload of a chunk runs while later chunks are still being copied.
    Returns once every upload is queued; ``pinned`` must not be written
    again until ``stream`` has done them (a replay synchronises once per
    call, so the next call's staging starts after).
    """
    from cc2ops.cuda.runtime.availability import driver

    if pinned.shape != src.shape:
        raise ValueError(
            f"stage_upload: the input has shape {src.shape}, the staging buffer "
            f"{pinned.shape}"
        )
    if not pinned.nbytes:
        return
    memcpy = driver().memcpy_htod_async
    base = array.ptr(landing)
    pool = _stage_pool()
    if pinned.nbytes < PARALLEL_COPY_BYTES or pinned.ndim == 0 or pool is None:
        _copy_rows(pinned, src)
        memcpy(base, pinned, stream)
        return
    row_bytes = pinned.nbytes // pinned.shape[0]
    ranges = _chunks(pinned.shape[0], row_bytes, UPLOAD_CHUNK_BYTES)
    jobs = [pool.submit(_copy_rows, pinned[a:b], src[a:b]) for a, b in ranges]
    try:
        for (a, b), job in zip(ranges, jobs, strict=True):
            job.result()
            memcpy(base + a * row_bytes, pinned[a:b], stream)
    finally:
        # a failed copy leaves no thread writing pinned behind the caller
        for job in jobs:
            job.cancel()
        for job in jobs:
            if not job.cancelled():
                job.exception()


def _signature(values: Sequence[Any]) -> tuple:
    sig = []
    for v in values:
        if array.is_gpuarray(v):
            sig.append(("g", tuple(v.shape), np.dtype(v.dtype).str, tuple(v.strides)))
        elif isinstance(v, np.ndarray):
            sig.append(("h", v.shape, v.dtype.str))
        else:
            sig.append(("?", type(v).__name__))
    return tuple(sig)


@dataclass
class _Entry:
    """One captured graph and the buffers its addresses point to."""

    graph: CudaGraph | None = None
    #: input position -> pinned host staging buffer (host inputs)
    pinned_in: dict[int, np.ndarray] = field(default_factory=dict)
    #: input position -> the GPUArray a host input's upload lands in, which
    #: the graph copies from
    landing: dict[int, Any] = field(default_factory=dict)
    #: input position -> the GPUArray whose address the graph reads
    gpu_in: dict[int, Any] = field(default_factory=dict)
    #: the output values of the captured call (pinned arrays or GPUArrays)
    outputs: list[Any] = field(default_factory=list)
    #: pinned download buffers made during the capture (kept alive)
    downloads: list[np.ndarray] = field(default_factory=list)
    seen: int = 0


class ReplayVM:
    """A PyTensor VM whose calls replay CUDA graphs once a signature repeats.

    Made by the ``graphs=True`` GPU linker; everything but ``__call__`` is the
    wrapped VM's (``storage_map``, ``thunks``, ``allow_gc``, ...), so
    PyTensor's ``Function`` uses it as its VM.

    Parameters
    ----------
    vm : callable
        The VM the linker made.
    fgraph : FunctionGraph
        The rewritten graph the VM runs.
    max_graphs : int
        Captured graphs kept (least recently used freed first).
    """

    def __init__(self, vm: Any, fgraph: Any, max_graphs: int = DEFAULT_MAX_GRAPHS):
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int):
            raise TypeError(
                f"cc2ops.cuda.mode: max_graphs must be an int, got "
                f"{type(max_graphs).__name__}"
            )
        if max_graphs < 1:
            raise ValueError(
                f"cc2ops.cuda.mode: max_graphs must be >= 1, got {max_graphs}"
            )
        self.vm = vm
        self.fgraph = fgraph
        self.max_graphs = max_graphs
        smap = vm.storage_map
        self._in_cells = [smap[v] for v in fgraph.inputs]
        self._in_vars = list(fgraph.inputs)
        self._out_cells = [smap[v] for v in fgraph.outputs]
        self._out_vars = list(fgraph.outputs)
        self._updates = dict(getattr(fgraph, "update_mapping", None) or {})
        self._explicit = {k for k, v in enumerate(fgraph.inputs) if not _is_shared(v)}
        self.plan = capture_plan(fgraph)
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._warned = False
        #: counters: eager calls, captures, replays (for tests and profiling)
        self.stats = {"eager": 0, "captures": 0, "replays": 0}

    #: attributes of the wrapper itself; any other is set on the wrapped VM
    #: (a profiler replacing ``thunks``, PyTensor setting ``allow_gc``)
    _OWN = frozenset({"vm", "fgraph", "max_graphs", "plan", "stats"})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["vm"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN or name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.vm, name, value)

    # ---- the call ----------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.plan.capturable or args or kwargs:
            self._warn_once(self.plan.reason or "called with VM arguments")
            return self._eager(*args, **kwargs)
        values = [c[0] for c in self._in_cells]
        sig = _signature(values)
        if any(s[0] == "?" for s in sig):
            self._warn_once(f"an input value is neither a numpy nor a GPU array: {sig}")
            return self._eager()
        entry = self._entries.get(sig)
        if entry is None:
            entry = _Entry()
            self._entries[sig] = entry
            self._evict()
        self._entries.move_to_end(sig)
        entry.seen += 1
        if entry.graph is None:
            if entry.seen < 2:
                return self._eager()
            try:
                return self._capture(entry, values)
            except GraphCaptureError as e:
                self.plan = CapturePlan(False, f"the capture failed: {e}")
                self._entries.clear()
                self._restore(values)
                self._warn_once(self.plan.reason)
                return self._eager()
        return self._replay(entry, values)

    def _eager(self, *args: Any, **kwargs: Any) -> Any:
        self.stats["eager"] += 1
        return self.vm(*args, **kwargs)

    def _warn_once(self, reason: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"cc2ops.cuda.mode(graphs=True): this function runs eagerly: {reason}",
                ReplayWarning,
                stacklevel=3,
            )

    def _evict(self) -> None:
        while len(self._entries) > self.max_graphs:
            _, old = self._entries.popitem(last=False)
            if old.graph is not None:
                old.graph.close()

    def _restore(self, values: Sequence[Any]) -> None:
        for cell, v in zip(self._in_cells, values, strict=True):
            cell[0] = v

    # ---- capture and replay ------------------------------------------------
    def _stage(self, entry: _Entry, values: Sequence[Any], stream: Any) -> None:
        """Copy this call's inputs into the buffers the graph reads."""
        for k, v in enumerate(values):
            pinned = entry.pinned_in.get(k)
            if pinned is not None:
                stage_upload(pinned, entry.landing[k], v, stream)
                continue
            buf = entry.gpu_in[k]
            if array.ptr(v) == array.ptr(buf) and tuple(v.strides) == tuple(
                buf.strides
            ):
                continue
            array._copy_into_contiguous(v, buf, self.plan.device)

    def _capture(self, entry: _Entry, values: Sequence[Any]) -> list[Any]:
        device = self.plan.device
        dev = get_device(device)
        staged = []
        for k, v in enumerate(values):
            if isinstance(v, np.ndarray):
                # filled by each call before its replay (_stage); nothing
                # reads them while the graph is captured
                pinned = transfer.pinned_empty(v.shape, v.dtype)
                entry.pinned_in[k] = pinned
                entry.landing[k] = array.empty(v.shape, v.dtype, device)
                staged.append(pinned)
            elif k in self._explicit or not array.is_c_contiguous(v):
                # the caller's array stays the caller's: the graph reads a copy
                buf = array.copy(v, device)
                entry.gpu_in[k] = buf
                staged.append(buf)
            else:
                entry.gpu_in[k] = v  # a shared variable's buffer: read in place
                staged.append(v)
        graph = CudaGraph(device)
        self._restore(staged)

        def body() -> list[Any]:
            out = self.vm()
            if out is None:
                out = [c[0] for c in self._out_cells]
            out = list(out)
            # an updated GPU shared variable keeps its buffer
            for o, i in self._updates.items():
                new, old = out[o], entry.gpu_in.get(i)
                if old is None or not array.is_gpuarray(new):
                    continue
                if array.ptr(new) != array.ptr(old):
                    array._copy_into_contiguous(new, old, device)
                    out[o] = old
            return out

        staged_at = {
            p.ctypes.data: entry.landing[k]
            for k, p in entry.pinned_in.items()
            if p.nbytes
        }
        with _capture_buffers(entry.downloads, staged_at):
            entry.outputs = graph.capture(body)
        entry.graph = graph
        self.stats["captures"] += 1
        dev.activate()
        return self._replay(entry, values)

    def _replay(self, entry: _Entry, values: Sequence[Any]) -> list[Any]:
        device = self.plan.device
        dev = get_device(device)
        dev.activate()
        self._stage(entry, values, dev.stream)
        self._restore(
            [entry.pinned_in.get(k, entry.gpu_in.get(k)) for k in range(len(values))]
        )
        entry.graph.replay()
        self.stats["replays"] += 1
        results = []
        host = any(isinstance(o, np.ndarray) for o in entry.outputs)
        for n, o in enumerate(entry.outputs):
            if array.is_gpuarray(o) and n not in self._updates:
                results.append(array.copy(o, device))
            else:
                # an updated GPU shared variable's new value is its own buffer
                results.append(o)
        if host:
            dev.stream.synchronize()
            results = [np.array(r) if isinstance(r, np.ndarray) else r for r in results]
        for cell, r in zip(self._out_cells, results, strict=True):
            cell[0] = r
        # the function's input cells go back to what the caller gave, then the
        # updates, which PyTensor's VMs make themselves (need_update_inputs False)
        # and a replay skips along with the rest of the VM
        self._restore(values)
        if not getattr(self.vm, "need_update_inputs", True):
            for o, i in self._updates.items():
                self._in_cells[i][0] = results[o]
        return results

    def close(self) -> None:
        """Free every captured graph (idempotent)."""
        for entry in self._entries.values():
            if entry.graph is not None:
                entry.graph.close()
        self._entries.clear()


def _is_shared(var: Variable) -> bool:
    return isinstance(var, SharedVariable)


class _capture_buffers:
    """While capturing: ``HostFromGpu`` downloads into pinned buffers kept in
    ``keep``; ``GpuFromHost`` of a staging buffer (host address -> landing
    GPUArray in ``staged``) copies from its landing buffer on the device."""

    def __init__(self, keep: list[np.ndarray], staged: dict[int, Any]) -> None:
        self.keep, self.staged = keep, staged

    def __enter__(self) -> None:
        transfer.capture_downloads.append(self.keep)
        transfer.capture_staged.update(self.staged)

    def __exit__(self, *exc: Any) -> None:
        transfer.capture_downloads.pop()
        for address in self.staged:
            transfer.capture_staged.pop(address, None)
