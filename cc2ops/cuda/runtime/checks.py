"""Deferred checks: a device-side validation read back where it is needed, not
where it was launched.

The softmax ops validate their labels on the device: a kernel lowers a 4-byte
flag to the first row whose label is outside ``[0, K)``, and the host reads
the flag back and raises ``ValueError``. Read at once, that read-back holds
the host until the device has finished everything queued before it, in the
middle of a training step: the host stops queuing the backward pass while the
device runs the forward pass, and the device then idles while the host
catches up (three such stops in a step with a loss, its gradient and a top-k
error).

While a compiled GPU function runs (:func:`scope_open`, called by the GPU
mode's VM, :class:`cc2ops.cuda.mode.CheckedVM`), a check is deferred
instead (:func:`defer_flag`): the flag is copied asynchronously into a slot
of a pinned host buffer, an event is recorded after the copy, and the check
itself runs at the next point that needs it
(:func:`flush`):

- before a node writes in place into memory a function input owns (a shared
  variable's parameters, say), so that a bad label raises before any of the
  caller's state changes (the GPU linker wraps those nodes' thunks,
  :meth:`cc2ops.cuda.mode.GpuVMLinker.make_vm`);
- after any read-back to the host (:func:`cc2ops.cuda.runtime.array.to_host`
  synchronises anyway, and the values it returns may go on to change host
  state);
- when the function's VM returns, before its results and updates are handed
  to the caller (the GPU mode's VM restores updated inputs if a check
  raises there).

Waiting for a check waits for its event only: the device has to have reached
the flag's copy, not the end of everything queued since. Outside a scope (an
op's ``perform`` called directly, a profiler timing nodes one at a time) a
check runs at once, as before. While a CUDA graph captures, the checks are
deferred to after each replay instead (:func:`cc2ops.cuda.runtime.cudagraph.
defer_check`), which the callers try first.

State is per thread (a function runs on the thread that calls it). Nothing
here touches CUDA at import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "scope_open",
    "scope_close",
    "deferring",
    "pending",
    "defer",
    "defer_flag",
    "flush",
    "discard",
    "SLOTS",
]

#: Flags one device's pinned buffer holds; a deferral beyond them flushes first.
SLOTS = 64


class _Staging:
    """One device's pinned flag slots and the event after the latest copy."""

    def __init__(self) -> None:
        from cc2ops.cuda.runtime.availability import driver

        drv = driver()
        self.host = drv.pagelocked_empty((SLOTS,), np.uint32)
        self.event = drv.Event()
        self.used = 0


class _State(threading.local):
    def __init__(self) -> None:
        self.depth = 0
        #: (wait, check) pairs in the order they were deferred
        self.pending: list[tuple[Callable[[], None], Callable[[], None]]] = []
        self.staging: dict[int, _Staging] = {}


_state = _State()


def scope_open() -> None:
    """Enter a scope in which checks are deferred (pair with :func:`scope_close`;
    scopes nest)."""
    _state.depth += 1


def scope_close(run: bool = True) -> None:
    """Leave a scope: run the pending checks (``run``) or drop them (the call
    failed with another error)."""
    st = _state
    st.depth -= 1
    if run:
        flush()
    else:
        discard()


def deferring() -> bool:
    """Whether a check made now would be deferred."""
    return _state.depth > 0


def pending() -> bool:
    """Whether checks wait to be run (cheap)."""
    return bool(_state.pending)


def defer(wait: Callable[[], None], check: Callable[[], None]) -> None:
    """Run ``check()`` at the next :func:`flush`, after ``wait()`` (which makes
    what it reads ready: an event's synchronisation)."""
    if not _state.depth:
        raise RuntimeError("cc2ops.cuda.checks: defer outside a scope")
    _state.pending.append((wait, check))


def defer_flag(
    flag: Any, device: int, check: Callable[[int], None], stream: Any = None
) -> None:
    """Copy the 4-byte device ``flag`` (a uint32 GPUArray) into a pinned slot
    without waiting, and run ``check(value)`` at the next :func:`flush`.

    ``device`` is the flag's device label; ``stream`` the stream its kernel
    ran on (default the device's).
    """
    from cc2ops.cuda.runtime.availability import driver
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(device)
    dev.activate()
    stage = _state.staging.get(dev.index)
    if stage is None:
        stage = _state.staging[dev.index] = _Staging()
    if stage.used == SLOTS:
        flush()
    slot = stage.used
    stage.used += 1
    stream = dev.stream if stream is None else stream
    driver().memcpy_dtoh_async(stage.host[slot : slot + 1], int(flag.gpudata), stream)
    stage.event.record(stream)
    host, event = stage.host, stage.event

    def read() -> None:
        check(int(host[slot]))

    defer(event.synchronize, read)


def flush() -> None:
    """Run the pending checks now (each after its wait); the first to raise
    drops the rest."""
    st = _state
    if not st.pending:
        return
    todo, st.pending = st.pending, []
    for stage in st.staging.values():
        stage.used = 0
    waited: set[Any] = set()
    for wait, check in todo:
        if wait not in waited:
            wait()
            waited.add(wait)
        try:
            check()
        except Exception as e:
            e.add_note(
                "cc2ops: a deferred device check, read back where the step next "
                "needed it (cc2ops.cuda.runtime.checks)"
            )
            raise


def discard() -> None:
    """Drop the pending checks (their call has failed already)."""
    st = _state
    st.pending = []
    for stage in st.staging.values():
        stage.used = 0
