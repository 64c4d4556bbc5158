"""Where the time of GPU work goes: device time and host (launch) time, apart.

A call that queues GPU work costs two clocks: the host's, spent in Python and
the driver while the work is queued, and the device's, spent running it.
CUDA events around a call measure whichever is longer, so a host-bound call
looks like slow kernels. The functions here separate the two:

:func:`hold` queues a one-thread kernel (``kernels/spin.cu``) that keeps the
device's stream busy for a given time. :func:`split_time` holds the stream,
records an event, calls ``fn``, records another event and waits: the host
queues all of ``fn``'s work while the device is still spinning, so the
events measure the device time of the work alone, back to back, and the host
clock measures the time to queue it. A call that waits for the device inside
(a read-back, a synchronisation) is caught because its host time outlasts the
hold; it is reported with ``synchronizes=True``.

:class:`ThunkProfile` does the same for every node of a function compiled
with the Python VM (``cc2ops.cuda.mode(linker="py")``): per node its host
time, device time and whether it synchronises; the sums give the step's
device-bound time (what a CUDA-graph replay would approach) and its host
time (what an eager step costs when the host is the bottleneck).

Everything here touches CUDA; nothing runs at import.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cc2ops.cuda.runtime import checks
from cc2ops.cuda.runtime.compile import get_kernel, launch, register_variants
from cc2ops.cuda.runtime.device import get_device

__all__ = ["hold", "SplitTime", "split_time", "ThunkProfile"]

_SPIN = {"name": "spin_hold"}
#: Longest hold: beyond it a call is reported as synchronising.
MAX_HOLD_MS = 2000.0


@register_variants("spin")
def _spin_variants() -> list[dict[str, Any]]:
    return [dict(_SPIN)]


def hold(device: int, ms: float) -> None:
    """Queue a kernel that keeps ``device``'s stream busy for ``ms`` milliseconds."""
    if not ms >= 0:
        raise ValueError(f"hold: ms must be >= 0, got {ms!r}")
    fn = get_kernel("spin", device, **_SPIN)
    launch(fn, 1, 32, [np.uint64(int(ms * 1e6))], device)


@dataclass(frozen=True)
class SplitTime:
    """Medians over the repetitions of :func:`split_time`, in milliseconds.

    ``device_ms``: the device time of the work, queued back to back.
    ``host_ms``: the host time to queue it. ``synchronizes``: the call waited
    for the device (its device time then includes host gaps).
    """

    host_ms: float
    device_ms: float
    synchronizes: bool
    reps: int


def _events() -> tuple[Any, Any]:
    import pycuda.driver as drv

    return drv.Event(), drv.Event()


def split_time(
    fn: Callable[[], Any],
    device: int = 0,
    *,
    reps: int = 5,
    warmup: int = 1,
    hold_ms: float | None = None,
) -> SplitTime:
    """Device and host time of ``fn()``, measured apart (see the module docstring).

    Parameters
    ----------
    fn : callable
        Queues work on ``device``'s stream (cc2ops's stream); no arguments.
    device : int
        Device label.
    reps, warmup : int
        Timed and untimed calls.
    hold_ms : float, optional
        How long the stream is held before each call; default four times the
        host time of the last warm-up call (at least 2 ms). It is doubled,
        and the repetition redone, while the host outlasts it, up to
        :data:`MAX_HOLD_MS`; beyond that the call is taken to synchronise.
    """

    if reps < 1 or warmup < 0:
        raise ValueError(
            f"split_time: need reps >= 1 and warmup >= 0, got {reps}, {warmup}"
        )
    dev = get_device(device)
    dev.activate()
    last = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        last = (time.perf_counter() - t0) * 1e3
    dev.synchronize()
    h = float(hold_ms) if hold_ms is not None else max(2.0, 4.0 * last)
    hosts: list[float] = []
    devices: list[float] = []
    synced = False
    while len(hosts) < reps:
        start, end = _events()
        dev.synchronize()
        hold(device, h)
        start.record(dev.stream)
        t0 = time.perf_counter()
        fn()
        host = (time.perf_counter() - t0) * 1e3
        end.record(dev.stream)
        end.synchronize()
        if host > 0.8 * h and h < MAX_HOLD_MS:
            h = min(MAX_HOLD_MS, 2.0 * max(h, host))
            continue
        if host > 0.8 * h:
            synced = True
        hosts.append(host)
        devices.append(end.time_since(start))
    return SplitTime(
        host_ms=float(statistics.median(hosts)),
        device_ms=float(statistics.median(devices)),
        synchronizes=synced,
        reps=reps,
    )


class ThunkProfile:
    """Per-node host and device time of a function compiled with the Python VM.

    Parameters
    ----------
    fn : pytensor Function
        Compiled with ``cc2ops.cuda.mode(linker="py")`` (its VM calls the
        thunks of ``fn.vm.thunks`` one by one).
    hold_ms : float
        The stream is held this long before each GPU node; a node whose host
        time outlasts most of it is marked as synchronising.

    Notes
    -----
    :meth:`run` profiles each step twice. The device pass holds the stream
    before every node and waits after it: each node's device time, and
    whether it synchronises. The host pass holds the stream once for the
    whole step and times each node's queueing back to back, as an eager
    call queues it: that is each record's ``host_ms`` (the device pass's is
    kept as ``host_ms_isolated``; a synchronising node keeps it as
    ``host_ms`` too, since its host time is the hold's).

    Wrapping is permanent for ``fn``: build a separate function for
    profiling. Each GPU node costs about ``hold_ms`` of wall time per call.
    """

    def __init__(self, fn: Any, hold_ms: float = 5.0) -> None:

        vm = fn.vm
        if not hasattr(vm, "thunks") or not hasattr(vm, "nodes"):
            raise TypeError(
                f"ThunkProfile: {type(vm).__name__} has no thunk list; compile with "
                "cc2ops.cuda.mode(linker='py')"
            )
        self.fn = fn
        self.hold_ms = float(hold_ms)
        self.records: list[dict[str, Any]] = []
        self._recording = False
        self._phase = "device"
        self._host: list[float] = []
        self._devices = sorted(
            {get_device(node.op.thunk_device(node)).label for node in vm.nodes
             if getattr(node.op, "thunk_device", None) is not None},
        )  # fmt: skip
        wrapped = []
        for k, (thunk, node) in enumerate(zip(vm.thunks, vm.nodes, strict=True)):
            dev = None
            # a GPU op says which device its thunk runs on (GpuOp.thunk_device);
            # asked by method so the runtime needs no graph-level class
            thunk_device = getattr(node.op, "thunk_device", None)
            if thunk_device is not None:
                dev = get_device(thunk_device(node))
            wrapped.append(self._wrap(thunk, k, node, dev))
        vm.thunks = wrapped

    def _wrap(self, thunk: Callable, k: int, node: Any, dev: Any) -> Callable:
        op = type(node.op).__name__
        # set by the GPU linker on nodes that write into a function input
        flushes = getattr(thunk, "flushes_checks", False)
        label = str(node.op)[:80]

        def run() -> Any:
            if not self._recording:
                return thunk()
            if self._phase == "host":
                # the stream is held for the whole step: queueing never waits,
                # and nothing synchronises between nodes (warm host caches).
                # A node that reads the deferred label checks first would wait
                # for the hold here: that wait is the check's, not the node's
                # queueing, so the checks are read before its clock starts
                if flushes and checks.pending():
                    checks.flush()
                t0 = time.perf_counter()
                out = thunk()
                self._host.append((time.perf_counter() - t0) * 1e3)
                return out
            if dev is None:
                t0 = time.perf_counter()
                out = thunk()
                host = (time.perf_counter() - t0) * 1e3
                self.records.append(
                    dict(index=k, op=op, node=label, host_ms=host, device_ms=0.0,
                         synchronizes=False, gpu=False)
                )  # fmt: skip
                return out
            start, end = _events()
            dev.synchronize()
            hold(dev.label, self.hold_ms)
            start.record(dev.stream)
            t0 = time.perf_counter()
            out = thunk()
            host = (time.perf_counter() - t0) * 1e3
            end.record(dev.stream)
            end.synchronize()
            self.records.append(
                dict(index=k, op=op, node=label, host_ms=host,
                     device_ms=end.time_since(start),
                     synchronizes=host > 0.8 * self.hold_ms, gpu=True)
            )  # fmt: skip
            return out

        for attr in ("inputs", "outputs", "lazy", "perform", "tapes", "flushes_checks"):
            if hasattr(thunk, attr):
                setattr(run, attr, getattr(thunk, attr))
        return run

    def run(self, *args: Any, steps: int = 1, warmup: int = 1) -> dict[str, Any]:
        """Call the function ``warmup`` times unrecorded, then ``steps`` times.

        Returns ``per_node`` (one record per node and step), ``by_op`` (host
        and device milliseconds per step summed per op class, with node
        counts, largest device time first) and the step totals
        ``host_ms``, ``device_ms`` (per step) and ``synchronizing_nodes``.
        """
        for _ in range(warmup):
            self.fn(*args)
        self.records = []
        self._recording = True
        try:
            for _ in range(steps):
                self.fn(*args)
            # host time: each node's, with the stream held for the whole step
            # (a per-node synchronisation would leave the host's caches cold
            # and its clock low, inflating what queueing a node costs)
            self._phase = "host"
            hosts: list[list[float]] = []
            step_ms = max(1.0, sum(r["host_ms"] for r in self.records) / max(1, steps))
            for _ in range(steps):
                for label in self._devices:
                    get_device(label).synchronize()
                    hold(label, min(MAX_HOLD_MS, 4.0 * step_ms + 20.0))
                self._host = []
                self.fn(*args)
                hosts.append(self._host)
                for label in self._devices:
                    get_device(label).synchronize()
        finally:
            self._recording = False
            self._phase = "device"
        flat = [h for step in hosts for h in step]
        if len(flat) == len(self.records):
            for r, h in zip(self.records, flat, strict=True):
                r["host_ms_isolated"] = r["host_ms"]
                if not r["synchronizes"]:  # one that waits only measures the hold
                    r["host_ms"] = h
        by_op: dict[str, dict[str, float]] = defaultdict(
            lambda: {"host_ms": 0.0, "device_ms": 0.0, "nodes": 0}
        )
        for r in self.records:
            e = by_op[r["op"]]
            e["host_ms"] += r["host_ms"] / steps
            e["device_ms"] += r["device_ms"] / steps
            e["nodes"] += 1
        for e in by_op.values():
            e["nodes"] = int(e["nodes"] // steps)
        ranked = sorted(by_op.items(), key=lambda kv: -kv[1]["device_ms"])
        return {
            "per_node": list(self.records),
            "by_op": [{"op": k, **v} for k, v in ranked],
            "host_ms": sum(r["host_ms"] for r in self.records) / steps,
            "device_ms": sum(r["device_ms"] for r in self.records) / steps,
            "synchronizing_nodes": sorted(
                {r["node"] for r in self.records if r["synchronizes"]}
            ),
        }
