"""A compiled PyTensor function whose calls replay a CUDA graph.

:func:`capture_function` wraps a compiled function (a training step, say) so
that its calls replay one :class:`~cc2ops.cuda.runtime.cudagraph.CudaGraph`::

    step = pytensor.function([x, y], [loss], updates=updates,
                             mode=cc2ops.cuda.mode())
    fast = cc2ops.cuda.capture_function(step)
    for xb, yb in batches:
        (loss_gpu,) = fast(xb, yb)   # replays after the first call

What a capture needs (no synchronisation inside, fixed addresses, fixed host
values, a warm-up call first) is described in
:mod:`cc2ops.cuda.runtime.cudagraph`, which holds the runtime half (capturing
a stream, replaying a graph) and needs no PyTensor; this module is the graph
half: it reads the function's GPU-typed inputs, outputs and updates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.availability import driver
from cc2ops.cuda.runtime.cudagraph import (
    CudaGraph,
    GraphCaptureError,
    capturing,
    defer_check,
)
from cc2ops.cuda.runtime.device import physical_index
from cc2ops.cuda.type import CudaArrayType

# the runtime names are re-exported: cc2ops.cuda.graphs (the old module, an
# alias of this one until the next release) had all six
__all__ = [
    "CapturedFunction",
    "capture_function",
    "CudaGraph",
    "GraphCaptureError",
    "capturing",
    "defer_check",
]


# --------------------------------------------------------------------------
# a compiled function as a graph
# --------------------------------------------------------------------------


def _is_gpu_type(t: Any) -> bool:
    return isinstance(t, CudaArrayType)


class CapturedFunction:
    """A compiled PyTensor function whose calls replay a CUDA graph.

    Build it with :func:`capture_function`. Calls take the function's
    explicit inputs (GPUArrays or numpy arrays of the captured shapes and
    dtypes) and return its outputs like the function does, as the graph's
    own GPUArrays: the next call overwrites them.
    """

    def __init__(self, fn: Any, warmup: int = 1) -> None:
        if warmup < 1:
            raise ValueError(f"capture_function: warmup must be >= 1, got {warmup}")
        self.fn = fn
        self.warmup = int(warmup)
        self.calls = 0
        maker = fn.maker
        self._explicit = [k for k, i in enumerate(maker.inputs) if not i.implicit]
        for n, k in enumerate(self._explicit):
            t = maker.inputs[k].variable.type
            if not _is_gpu_type(t):
                raise TypeError(
                    f"capture_function: input {n} ({maker.inputs[k].variable}) is a "
                    f"host variable ({t}); its value would be baked into the graph. "
                    "Make it a GPU input (cc2ops.cuda.CudaArrayType) or a GPU shared "
                    "variable"
                )
        for n, out in enumerate(maker.outputs):
            t = out.variable.type
            if not _is_gpu_type(t):
                raise TypeError(
                    f"capture_function: output {n} ({out.variable}) is a host value "
                    f"({t}); reading it back cannot be captured. Return GPU values "
                    "(compile with the outputs left on the GPU) and read them after "
                    "the call"
                )
        for i in maker.inputs:
            if (
                i.implicit
                and i.update is not None
                and not _is_gpu_type(i.variable.type)
            ):
                raise TypeError(
                    f"capture_function: the update of host shared variable "
                    f"{i.variable} would run once at capture and never again; keep "
                    "updated state on the GPU (cc2ops.cuda.shared)"
                )
        self._devices = sorted(
            {v.type.device for v in maker.fgraph.variables if _is_gpu_type(v.type)}
        )
        if not self._devices:
            raise TypeError("capture_function: the function has no GPU variables")

        physical = {physical_index(d) for d in self._devices}
        if len(physical) != 1:
            raise ValueError(
                f"capture_function: the function uses physical devices "
                f"{sorted(physical)}; a graph captures one device's stream"
            )
        self.device = self._devices[0]
        self.graph: CudaGraph | None = None
        self._static: list[Any] = []
        self._outputs: Any = None

    # ---- inputs -----------------------------------------------------------
    def _input_type(self, n: int) -> Any:
        return self.fn.maker.inputs[self._explicit[n]].variable.type

    def _stage(self, args: Sequence[Any]) -> None:
        """Copy the call's arguments into the graph's input buffers."""

        dev = self.graph._dev if self.graph is not None else None
        for n, (arg, buf) in enumerate(zip(args, self._static, strict=True)):
            if array.is_gpuarray(arg):
                if array.ptr(arg) == array.ptr(buf) and tuple(arg.strides) == tuple(
                    buf.strides
                ):
                    continue
                shape, dtype = tuple(arg.shape), np.dtype(arg.dtype)
            else:
                arg = np.asarray(arg)
                shape, dtype = arg.shape, arg.dtype
            if shape != tuple(buf.shape) or dtype != np.dtype(buf.dtype):
                raise ValueError(
                    f"CapturedFunction: input {n} has shape {shape} and dtype "
                    f"{dtype}; the graph was captured with {tuple(buf.shape)} "
                    f"{np.dtype(buf.dtype)} (capture another function for other "
                    "shapes)"
                )
            assert dev is not None
            dev.activate()
            if array.is_gpuarray(arg):
                array._copy_into_contiguous(arg, buf, self.device)
            elif arg.nbytes:
                host = np.ascontiguousarray(arg)
                driver().memcpy_htod_async(array.ptr(buf), host, dev.stream)

    def _make_static(self, args: Sequence[Any]) -> list[Any]:

        out = []
        for n, arg in enumerate(args):
            t = self._input_type(n)
            if array.is_gpuarray(arg):
                buf = array.copy(arg, t.device)
            else:
                buf = array.to_gpu(t.filter_host(arg), t.device)
            out.append(buf)
        return out

    # ---- calling ----------------------------------------------------------
    def _shared_cells(self) -> list[tuple[Any, Any]]:

        cells = []
        for k, i in enumerate(self.fn.maker.inputs):
            if i.implicit and i.update is not None:
                cell = self.fn.input_storage[k]
                if array.is_gpuarray(cell.storage[0]):
                    cells.append((cell, cell.storage[0]))
        return cells

    def _capture_now(self, args: Sequence[Any]) -> None:

        graph = CudaGraph(self.device)
        self.graph = graph
        self._static = self._make_static(args)
        before = self._shared_cells()

        def body() -> Any:
            out = self.fn(*self._static)
            # updates that moved a shared variable: copy back into its buffer
            for cell, old in before:
                new = cell.storage[0]
                if array.ptr(new) != array.ptr(old):
                    if tuple(new.shape) != tuple(old.shape) or not (
                        array.is_c_contiguous(new) and array.is_c_contiguous(old)
                    ):
                        array._copy_into_contiguous(new, old, self.device)
                    elif old.nbytes:
                        driver().memcpy_dtod_async(
                            array.ptr(old), array.ptr(new), old.nbytes,
                            graph._dev.stream,
                        )  # fmt: skip
                    cell.storage[0] = old
            return out

        try:
            self._outputs = graph.capture(body)
        except BaseException:
            for cell, old in before:
                cell.storage[0] = old
            self.graph = None
            raise

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self._explicit):
            raise TypeError(
                f"CapturedFunction: takes {len(self._explicit)} inputs, got {len(args)}"
            )
        self.calls += 1
        if self.graph is None and self.calls <= self.warmup:
            return self.fn(*args)
        if self.graph is None:
            self._capture_now(args)
        else:
            self._stage(args)
        self.graph.replay()
        return self._outputs

    def close(self) -> None:
        """Free the graph, its buffers and its held allocations."""
        if self.graph is not None:
            self.graph.close()
            self.graph = None
        self._static = []
        self._outputs = None


def capture_function(fn: Any, *, warmup: int = 1) -> CapturedFunction:
    """Wrap a compiled function so that its calls replay a CUDA graph.

    Parameters
    ----------
    fn : pytensor Function
        Compiled in ``cc2ops.cuda.mode()`` on one physical device, with GPU
        inputs and outputs only (``CudaArrayType``); its updates may only
        touch GPU shared variables.
    warmup : int
        Calls made eagerly (real calls: they compile kernels and autotune)
        before the next call is captured.

    Returns
    -------
    CapturedFunction
        Call it like ``fn``; see the module docstring for what changes
        (outputs are the graph's buffers, overwritten by the next call).

    Raises
    ------
    TypeError
        For host inputs, host outputs or updated host shared variables.
    ValueError
        For a function spanning several physical devices.
    """
    if not hasattr(fn, "maker") or not hasattr(fn, "input_storage"):
        raise TypeError(
            f"capture_function: expected a compiled pytensor Function, got "
            f"{type(fn).__name__}"
        )
    return CapturedFunction(fn, warmup=warmup)
