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

The driver calls go through ctypes to ``libcuda`` (pycuda does not wrap
graphs); the capture uses the relaxed mode, in which memory may be
allocated while capturing.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "GraphCaptureError",
    "CudaGraph",
    "capturing",
    "defer_check",
    "hold",
]

_CAPTURE_RELAXED = 2
_lib: Any = None
_lib_lock = threading.Lock()
_p = ctypes.c_void_p

_PROTOTYPES: dict[str, list[Any]] = {
    "cuStreamBeginCapture_v2": [_p, ctypes.c_int],
    "cuStreamEndCapture": [_p, ctypes.POINTER(_p)],
    "cuStreamIsCapturing": [_p, ctypes.POINTER(ctypes.c_int)],
    "cuGraphInstantiateWithFlags": [ctypes.POINTER(_p), _p, ctypes.c_ulonglong],
    "cuGraphLaunch": [_p, _p],
    "cuGraphExecDestroy": [_p],
    "cuGraphDestroy": [_p],
    "cuGraphGetNodes": [_p, _p, ctypes.POINTER(ctypes.c_size_t)],
    "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
}


class GraphCaptureError(RuntimeError):
    """Capturing or replaying a CUDA graph failed (the message says why)."""


def _driver_lib() -> Any:
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                try:
                    lib = ctypes.CDLL("libcuda.so.1")
                except OSError as e:
                    raise GraphCaptureError(
                        "cc2ops.cuda.runtime.cudagraph: libcuda.so.1 could not be "
                        f"loaded ({e})"
                    ) from e
                for name, argtypes in _PROTOTYPES.items():
                    fn = getattr(lib, name)
                    fn.argtypes = argtypes
                    fn.restype = ctypes.c_int
                _lib = lib
    return _lib


def _error_name(status: int) -> str:
    name = ctypes.c_char_p()
    if _driver_lib().cuGetErrorName(status, ctypes.byref(name)) == 0 and name.value:
        return name.value.decode()
    return f"CUresult {status}"


def _call(fname: str, *args: Any) -> int:
    return int(getattr(_driver_lib(), fname)(*args))


def _check(fname: str, status: int) -> None:
    if status != 0:
        raise GraphCaptureError(
            f"cc2ops.cuda.runtime.cudagraph: {fname} failed: {_error_name(status)}"
        )


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
        self._graph = _p()
        self._exec = _p()
        self._capture: _Capture | None = None
        self.nodes = 0

    @property
    def captured(self) -> bool:
        return bool(self._exec.value)

    def capture(self, fn: Callable[[], Any]) -> Any:
        """Record the work ``fn()`` queues on the device's stream; returns its result.

        Nothing runs on the device while capturing: the result's GPUArrays are
        filled by :meth:`replay`.

        Raises
        ------
        GraphCaptureError
            If ``fn`` did something a capture cannot record (a read-back or
            synchronisation, work on another stream's device, ...); the stream
            is usable again and nothing is kept.
        """
        from cc2ops.cuda.runtime import device as devmod

        if self.captured:
            raise GraphCaptureError("CudaGraph.capture: this graph is already captured")
        dev = self._dev
        dev.synchronize()
        stream = _p(int(dev.stream.handle))
        cap = _Capture(dev.index)
        with _active_lock:
            if dev.index in _active:
                raise GraphCaptureError(
                    f"CudaGraph.capture: physical device {dev.index} is already "
                    "capturing (graphs do not nest)"
                )
            _active[dev.index] = cap
            devmod._capture_holds[dev.index] = cap.allocations
        dev.activate()
        _check("cuStreamBeginCapture_v2", _call("cuStreamBeginCapture_v2", stream,
                                                 _CAPTURE_RELAXED))  # fmt: skip
        result: Any = None
        failure: BaseException | None = None
        try:
            result = fn()
        except BaseException as e:  # ended below whatever happened
            failure = e
        finally:
            graph = _p()
            status = _call("cuStreamEndCapture", stream, ctypes.byref(graph))
            with _active_lock:
                _active.pop(dev.index, None)
                devmod._capture_holds.pop(dev.index, None)
        if failure is not None or status != 0:
            if graph.value:
                _call("cuGraphDestroy", graph)
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
        count = ctypes.c_size_t(0)
        _check("cuGraphGetNodes", _call("cuGraphGetNodes", graph, None,
                                         ctypes.byref(count)))  # fmt: skip
        exe = _p()
        status = _call("cuGraphInstantiateWithFlags", ctypes.byref(exe), graph, 0)
        if status != 0:
            _call("cuGraphDestroy", graph)
            cap.allocations.clear()
            _check("cuGraphInstantiateWithFlags", status)
        self._graph, self._exec, self._capture = graph, exe, cap
        self.nodes = int(count.value)
        return result

    def replay(self) -> None:
        """Queue the captured work on the device's stream; then run the deferred
        checks (waiting for the device) if there are any."""
        if not self.captured:
            raise GraphCaptureError("CudaGraph.replay: nothing has been captured")
        dev = self._dev
        dev.activate()
        _check("cuGraphLaunch", _call("cuGraphLaunch", self._exec,
                                       _p(int(dev.stream.handle))))  # fmt: skip
        assert self._capture is not None
        if self._capture.checks:
            dev.synchronize()
            for check in self._capture.checks:
                check()

    def close(self) -> None:
        """Free the graph and the allocations it holds (idempotent)."""
        if self._exec.value:
            self._dev.synchronize()
            _call("cuGraphExecDestroy", self._exec)
            self._exec = _p()
        if self._graph.value:
            _call("cuGraphDestroy", self._graph)
            self._graph = _p()
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
