"""CUDA-graph capture and replay: a whole compiled step as one launch.

An eager cc2ops step pays Python for every node it runs (finding the kernel,
packing arguments, launching): tens of microseconds per node, more than many
of the kernels take. A CUDA graph records the kernels, copies and cuBLAS
calls that one call queues on a device's stream and replays them with one
driver call, so the host cost of a step becomes a few microseconds.

:class:`CudaGraph` captures any callable that queues work on one device's
stream; :func:`cc2ops.cuda.capture.capture_function` wraps a compiled
PyTensor function (a training step, say) so that its calls replay a graph::

    step = pytensor.function([x, y], [loss], updates=updates,
                             mode=cc2ops.cuda.mode())
    fast = cc2ops.cuda.capture_function(step)
    for xb, yb in batches:
        (loss_gpu,) = fast(xb, yb)   # replays after the first call

What a capture needs, and what it does about it
-----------------------------------------------
- *No synchronisation inside.* Work is recorded, not run, while a stream
  captures, so nothing can be read back. The label checks of the softmax
  ops are deferred (:func:`defer_check`): their flags are read after each
  replay, and a bad label still raises ``ValueError``. Any other read-back
  makes the capture fail with :class:`GraphCaptureError` naming the CUDA
  error; the stream is left usable.
- *Fixed addresses.* A graph replays with the pointers it was captured
  with. Every allocation made during the capture is therefore kept for the
  graph's life (not returned to the pool, where other work could take it),
  inputs are copied into buffers of the graph before each replay, outputs
  are the graph's own buffers (each replay overwrites them: copy what you
  keep), and a shared variable that an update moved to a new buffer is
  copied back into its old buffer at the end of the graph, so the variable
  keeps its address.
- *Fixed host values.* Host-side work of the function (shape arithmetic,
  constants) is baked in: :func:`capture_function` refuses functions with
  host-typed inputs, outputs or updated host shared variables, whose values
  would silently stop changing.
- *Warmed up first.* Kernels are compiled and algorithms autotuned on the
  first use of a shape, which synchronises; :func:`capture_function` makes
  its first ``warmup`` calls eagerly (each is a real call of the function)
  and captures on the next.

The driver calls go through NVIDIA's ``cuda-bindings`` (``cuda.bindings.driver``;
pycuda does not wrap graphs), on pycuda's streams (``int(stream.handle)`` is a
``CUstream``) in the context pycuda made current: both drive the same
``libcuda``. The capture uses the relaxed mode, in which memory may be
allocated while capturing. A failing call raises :class:`GraphCaptureError`
with the driver's error name (``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED``, ...);
without cuda-bindings, capturing raises it naming the package to install.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cc2ops.cuda.runtime.libraries import binding

__all__ = [
    "GraphCaptureError",
    "CudaGraph",
    "any_capture",
    "capturing",
    "defer_check",
    "hold",
]

_WHERE = "cc2ops.cuda.runtime.cudagraph"


class GraphCaptureError(RuntimeError):
    """Capturing or replaying a CUDA graph failed (the message says why)."""


def _driver() -> Any:
    """``cuda.bindings.driver`` (memoised), else :class:`GraphCaptureError`."""
    return binding(
        "cuda.bindings.driver", user=f"{_WHERE} (CUDA graphs)", error=GraphCaptureError
    )


def _error_name(status: int) -> str:
    """The driver's name of a ``CUresult`` (``CUDA_ERROR_INVALID_VALUE``)."""
    drv = _driver()
    try:
        return str(drv.CUresult(int(status)).name)
    except ValueError:  # a code newer than these bindings: ask the driver
        pass
    try:
        err, name = drv.cuGetErrorName(int(status))
        if int(err) == 0 and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # an unknown code is named by its number below
        pass
    return f"CUresult {int(status)}"


def _status(fname: str, *args: Any) -> tuple[int, tuple]:
    """``driver.<fname>(*args)`` as ``(status, outputs)``.

    cuda-bindings returns ``(CUresult, output, ...)`` from every call (the
    outputs are ``None`` when the call failed).
    """
    out = getattr(_driver(), fname)(*args)
    if not isinstance(out, tuple):
        out = (out,)
    return int(out[0]), tuple(out[1:])


def _call(fname: str, *args: Any) -> tuple:
    """``driver.<fname>(*args)``'s outputs; a failure raises GraphCaptureError."""
    status, outputs = _status(fname, *args)
    _check(fname, status)
    return outputs


def _check(fname: str, status: int) -> None:
    if status != 0:
        raise GraphCaptureError(f"{_WHERE}: {fname} failed: {_error_name(status)}")


def _stream(dev: Any) -> Any:
    """The driver's ``CUstream`` of a device's pycuda stream."""
    return _driver().CUstream(int(dev.stream.handle))


def _stream_is_capturing(dev: Any) -> bool:
    """Whether the device's stream is capturing now (``cuStreamIsCapturing``)."""
    drv = _driver()
    state = _call("cuStreamIsCapturing", _stream(dev))[0]
    return int(state) != int(drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)


# --------------------------------------------------------------------------
# capture state (read by the allocator and by ops that would synchronise)
# --------------------------------------------------------------------------


class _Capture:
    def __init__(self, physical: int) -> None:
        self.physical = physical
        self.allocations: list[Any] = []
        self.checks: list[Callable[[], None]] = []


_active: dict[int, _Capture] = {}
_active_lock = threading.Lock()


def any_capture() -> bool:
    """Whether any device is being captured into a graph now (cheap: no lookup)."""
    return bool(_active)


def capturing(device: int) -> bool:
    """Whether work queued for ``device`` is being captured into a graph now."""
    if not _active:
        return False
    from cc2ops.cuda.runtime.device import physical_index

    return physical_index(device) in _active


def hold(device: int, obj: Any) -> bool:
    """Keep ``obj`` alive for the life of the graph ``device`` is capturing.

    For host buffers a captured copy reads or writes (pinned staging): returns
    ``False`` when nothing captures.
    """
    if not _active:
        return False
    from cc2ops.cuda.runtime.device import physical_index

    cap = _active.get(physical_index(device))
    if cap is None:
        return False
    cap.allocations.append(obj)
    return True


def defer_check(device: int, check: Callable[[], None]) -> bool:
    """Run ``check()`` after each replay instead of now, if ``device`` captures.

    For ops that read a small result back to validate their input (the
    softmax ops' label flags): returns ``True`` when the check was deferred,
    ``False`` when nothing captures (the caller checks at once).
    """
    if not _active:
        return False
    from cc2ops.cuda.runtime.device import physical_index

    cap = _active.get(physical_index(device))
    if cap is None:
        return False
    cap.checks.append(check)
    return True


# --------------------------------------------------------------------------
# one graph
# --------------------------------------------------------------------------


class CudaGraph:
    """Work queued on one device's stream, captured once and replayed.

    Parameters
    ----------
    device : int
        Device label; its stream (cc2ops's stream of the physical device) is
        captured.

    Notes
    -----
    Allocations made while capturing (GPUArrays of the device's pool) stay
    allocated until :meth:`close`; checks deferred with :func:`defer_check`
    run after every :meth:`replay` (which then waits for the device).
    """

    def __init__(self, device: int = 0) -> None:
        from cc2ops.cuda.runtime.device import get_device

        self.device = device
        self._dev = get_device(device)
        self._graph: Any = None  # driver CUgraph
        self._exec: Any = None  # driver CUgraphExec
        self._capture: _Capture | None = None
        self.nodes = 0

    @property
    def captured(self) -> bool:
        return self._exec is not None

    def capture(self, fn: Callable[[], Any]) -> Any:
        """Record the work ``fn()`` queues on the device's stream; returns its result.

        Nothing runs on the device while capturing: the result's GPUArrays are
        filled by :meth:`replay`.

        Raises
        ------
        GraphCaptureError
            If ``fn`` did something a capture cannot record (a read-back or
            synchronisation, work on another stream's device, ...); the stream
            is usable again and nothing is kept. Also when cuda-bindings is
            missing (the message names the package).
        """
        from cc2ops.cuda.runtime import device as devmod

        if self.captured:
            raise GraphCaptureError("CudaGraph.capture: this graph is already captured")
        drv = _driver()  # a missing cuda-bindings fails before anything starts
        dev = self._dev
        dev.synchronize()
        stream = _stream(dev)
        cap = _Capture(dev.index)
        with _active_lock:
            if dev.index in _active:
                raise GraphCaptureError(
                    f"CudaGraph.capture: physical device {dev.index} is already "
                    "capturing (graphs do not nest)"
                )
            _active[dev.index] = cap
            devmod._capture_holds[dev.index] = cap.allocations

        def forget() -> None:
            with _active_lock:
                _active.pop(dev.index, None)
                devmod._capture_holds.pop(dev.index, None)

        dev.activate()
        status, _ = _status(
            "cuStreamBeginCapture",
            stream,
            drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
        )
        if status != 0:
            forget()
            _check("cuStreamBeginCapture", status)
        result: Any = None
        failure: BaseException | None = None
        try:
            result = fn()
        except BaseException as e:  # ended below whatever happened
            failure = e
        finally:
            try:
                status, outputs = _status("cuStreamEndCapture", stream)
            finally:
                forget()
        graph = outputs[0] if outputs else None
        if graph is not None and not int(graph):
            graph = None  # an invalidated capture gives a NULL graph
        if failure is not None or status != 0:
            if graph is not None:
                _status("cuGraphDestroy", graph)
            cap.allocations.clear()
            why = _error_name(status) if status else "the capture ended"
            if failure is not None:
                raise GraphCaptureError(
                    f"CudaGraph.capture: the captured call raised "
                    f"{type(failure).__name__}: {failure} ({why}); work that reads "
                    "results back or synchronises cannot be captured"
                ) from failure
            raise GraphCaptureError(
                f"CudaGraph.capture: cuStreamEndCapture failed: {why} (something "
                "synchronised or used another stream while capturing)"
            )
        try:
            # numNodes=0 asks for the count only (no node handles)
            count = _call("cuGraphGetNodes", graph)[1]
            # cuda-bindings' cuGraphInstantiate is cuGraphInstantiateWithFlags
            exe = _call("cuGraphInstantiate", graph, 0)[0]
        except GraphCaptureError:
            _status("cuGraphDestroy", graph)
            cap.allocations.clear()
            raise
        self._graph, self._exec, self._capture = graph, exe, cap
        self.nodes = int(count)
        return result

    def replay(self) -> None:
        """Queue the captured work on the device's stream; then run the deferred
        checks (waiting for the device) if there are any."""
        if not self.captured:
            raise GraphCaptureError("CudaGraph.replay: nothing has been captured")
        dev = self._dev
        dev.activate()
        _call("cuGraphLaunch", self._exec, _stream(dev))
        assert self._capture is not None
        if self._capture.checks:
            dev.synchronize()
            for check in self._capture.checks:
                check()

    def close(self) -> None:
        """Free the graph and the allocations it holds (idempotent)."""
        if self._exec is not None:
            self._dev.synchronize()
            _status("cuGraphExecDestroy", self._exec)
            self._exec = None
        if self._graph is not None:
            _status("cuGraphDestroy", self._graph)
            self._graph = None
        if self._capture is not None:
            self._capture.allocations.clear()
            self._capture = None

    def __del__(self) -> None:  # pragma: no cover - depends on interpreter exit order
        try:
            from cc2ops.cuda.runtime.device import is_shut_down

            if not is_shut_down():
                self.close()
        except Exception:
            pass
