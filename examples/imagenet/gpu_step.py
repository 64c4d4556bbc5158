"""Training and evaluation steps of the ImageNet example on one GPU, as CUDA graphs.

An eager step in the GPU mode pays Python for every node, and reading the
loss back after each step makes the host wait for the device: together they
held ``train.py --device cuda`` to 1/20 of what its own step can do. Here:

- :func:`gpu_inputs` / :func:`gpu_outputs` give ``train.compile_functions``
  GPU inputs (images, labels *and the learning rate*, a 0-d float32 GPU
  array) and GPU outputs, so :func:`cc2ops.cuda.capture_function` accepts
  the compiled functions;
- :class:`GraphRunner` calls the training step through a captured graph (the
  learning rate is an input copied into the graph's buffer before each
  replay: a schedule is never baked in). The capture's eager warm-up call is
  undone (:func:`snapshot_updates`) and its batch replayed, so every
  full-size step of a run, the first after a resume included, is a replay:
  an eager call and a replay of the same step differ in rounding, and a
  resumed run whose first step was eager drifted from the uninterrupted
  run (1.8e-4 after ten steps of the test net on the H200). It copies each
  step's loss and error
  into a device-side history (two 4-byte device copies) and reads the
  history back every ``log_every`` steps (:meth:`GraphRunner.flush`), so the
  host runs ahead of the device in between;
- batches of another size than the captured one (a batch with skipped
  images) run the same compiled function eagerly, with every updated shared
  variable copied back into the buffer the graph reads
  (:func:`call_keeping_buffers`), so the graph and the variables never part;
- evaluation replays its own graph (only once the training step replays,
  whose capture pins the parameters' buffers) and sums on the host at the
  end;
- :class:`EagerRunner` is the same interface over the CPU path's functions
  (host inputs and outputs, one read-back per step): ``--device cpu``,
  ``--devices K`` and ``--no-graph`` use it, unchanged in behaviour.

The runners return :class:`StepMetrics` records; ``train.py`` checks them
for NaN and logs them as it did per step (a NaN is reported with its step,
at most ``log_every`` steps after it happened).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "DEVICE_WORK",
    "StepMetrics",
    "gpu_inputs",
    "gpu_outputs",
    "call_keeping_buffers",
    "snapshot_updates",
    "DeviceHistory",
    "EagerRunner",
    "GraphRunner",
]


#: Held while a graph is being captured, and by other threads while they queue
#: device work (the GPU input pipeline's decodes and uploads): a stream that
#: captures must not see work from another thread that could touch the legacy
#: default stream (nvImageCodec's internals are not ours to check), which
#: would invalidate the capture. Captures happen twice a run, so the pause is
#: short.
DEVICE_WORK = threading.Lock()


class StepMetrics(NamedTuple):
    """One training step's result: global step number (1-based), images, the
    mean loss and top-1 error of its batch, the learning rate it used."""

    step: int
    n: int
    loss: float
    err: float
    lr: float


def gpu_inputs(device: int, crop: int, with_lr: bool) -> tuple[list, list]:
    """(GPU input variables, host views of them) for a step's graph.

    Images (B, 3, crop, crop) float32, labels (B,) int32 and, with
    ``with_lr``, the learning rate: a 0-d float32 GPU array, an input of
    every call (so a captured graph reads the value given to each replay).
    """
    from cc2ops.cuda import CudaArrayType, host_from_gpu

    ins = [
        CudaArrayType("float32", (None, 3, crop, crop), device)("images"),
        CudaArrayType("int32", (None,), device)("labels"),
    ]
    if with_lr:
        ins.append(CudaArrayType("float32", (), device)("lr"))
    return ins, [host_from_gpu(v) for v in ins]


def gpu_outputs(outputs: Sequence[Any], device: int) -> list:
    """The outputs as GPU values (a captured graph cannot read back)."""
    from cc2ops.cuda import gpu_from_host

    return [gpu_from_host(v, device) for v in outputs]


def _updated_cells(fn: Any) -> list[tuple[Any, Any]]:
    """(storage cell, current value) of every shared variable ``fn`` updates."""
    return [
        (fn.input_storage[k], fn.input_storage[k].storage[0])
        for k, i in enumerate(fn.maker.inputs)
        if i.implicit and i.update is not None
    ]


def call_keeping_buffers(fn: Any, args: Sequence[Any], device: int) -> Any:
    """``fn(*args)``, then every updated GPU shared variable copied back into
    the buffer it had before the call (a captured graph reads that one)."""
    from cc2ops.cuda.runtime import array

    before = _updated_cells(fn)
    out = fn(*args)
    for cell, old in before:
        new = cell.storage[0]
        if array.is_gpuarray(old) and array.ptr(new) != array.ptr(old):
            array._copy_into_contiguous(new, old, device)
            cell.storage[0] = old
    return out


def snapshot_updates(fn: Any, device: int) -> Callable[[], None]:
    """Copy the values of every GPU shared variable ``fn`` updates; returns
    ``restore()``, which copies them back into the variables' buffers of the
    moment (the ones a graph captured after it will read)."""
    from cc2ops.cuda.runtime import array

    saved = [
        (cell, array.copy(value, device))
        for cell, value in _updated_cells(fn)
        if array.is_gpuarray(value)
    ]

    def restore() -> None:
        for cell, value in saved:
            array._copy_into_contiguous(value, cell.storage[0], device)

    return restore


class DeviceHistory:
    """Scalars of successive calls gathered on the device, read back at once.

    ``push(values)`` queues a device copy of each 0-d GPU value into row k of
    a column of the same dtype; :meth:`read` copies the rows so far to the
    host (this synchronises) and starts again. ``copy`` and ``read_column``
    are the device operations (``cc2ops.cuda`` by default; the tests give
    host ones).
    """

    def __init__(
        self,
        device: int,
        capacity: int,
        copy: Callable[[Any, int, Any], None] | None = None,
        alloc: Callable[[int, Any], Any] | None = None,
        read_column: Callable[[Any, int], np.ndarray] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"DeviceHistory: capacity must be >= 1, got {capacity}")
        self.device = device
        self.capacity = capacity
        self.rows = 0
        self._cols: list[Any] | None = None
        self._copy = copy or self._cuda_copy
        self._alloc = alloc or self._cuda_alloc
        self._read = read_column or self._cuda_read

    def _cuda_alloc(self, n: int, dtype: Any) -> Any:
        from cc2ops.cuda.runtime import array

        return array.empty((n,), dtype, self.device)

    def _cuda_copy(self, col: Any, row: int, value: Any) -> None:
        from cc2ops.cuda.runtime import array
        from cc2ops.cuda.runtime.availability import driver
        from cc2ops.cuda.runtime.device import get_device

        dev = get_device(self.device)
        size = np.dtype(col.dtype).itemsize
        driver().memcpy_dtod_async(
            array.ptr(col) + row * size, array.ptr(value), size, dev.stream
        )

    def _cuda_read(self, col: Any, rows: int) -> np.ndarray:
        from cc2ops.cuda.runtime import array

        return array.to_host(col[:rows], self.device)

    @property
    def full(self) -> bool:
        return self.rows >= self.capacity

    def push(self, values: Sequence[Any]) -> None:
        if self.full:
            raise RuntimeError("DeviceHistory: full; read() it first")
        if self._cols is None:
            self._cols = [self._alloc(self.capacity, v.dtype) for v in values]
        for col, v in zip(self._cols, values, strict=True):
            self._copy(col, self.rows, v)
        self.rows += 1

    def read(self) -> list[np.ndarray]:
        """The columns of the rows pushed since the last read (float64)."""
        if self._cols is None or self.rows == 0:
            return []
        out = [np.asarray(self._read(c, self.rows), np.float64) for c in self._cols]
        self.rows = 0
        return out


def _call_graph(graph: Any, args: Sequence[Any]) -> Any:
    """Call a captured function; the calls before its capture (warm-up and
    capture) hold :data:`DEVICE_WORK`."""
    if getattr(graph, "graph", True) is None:
        with DEVICE_WORK:
            return graph(*args)
    return graph(*args)


class EagerRunner:
    """The CPU path's step interface: one call and one read-back per step.

    ``train_fn(x, y, lr) -> (loss, err)`` and ``eval_fn(x, y) -> (loss sum,
    top-1 errors, top-k errors)`` as ``train.compile_functions`` builds them
    for host inputs and outputs.
    """

    graph = False

    def __init__(self, train_fn: Callable, eval_fn: Callable) -> None:
        self.train_fn = train_fn
        self.eval_fn = eval_fn
        self._eval = np.zeros(3)

    def train(self, x: Any, y: Any, lr: float, step: int) -> list[StepMetrics]:
        loss, err = self.train_fn(x, y, np.float32(lr))
        return [StepMetrics(step, len(y), float(loss), float(err), lr)]

    def flush(self) -> list[StepMetrics]:
        return []

    def evaluate(self, x: Any, y: Any) -> None:
        self._eval += [float(v) for v in self.eval_fn(x, y)]

    def eval_sums(self) -> tuple[float, float, float]:
        out = tuple(float(v) for v in self._eval)
        self._eval = np.zeros(3)
        return out  # type: ignore[return-value]

    def close(self) -> None:
        pass


class GraphRunner:
    """Training and evaluation steps on one GPU, replayed as CUDA graphs.

    Parameters
    ----------
    train_fn : pytensor Function
        ``(x, y, lr) -> (loss, err)`` with GPU inputs and outputs
        (:func:`gpu_inputs`, :func:`gpu_outputs`), updates on GPU shared
        variables only.
    eval_fn : pytensor Function
        ``(x, y) -> (loss sum, top-1 errors, top-k errors)``, GPU inputs and
        outputs.
    device : int
    log_every : int
        Steps between read-backs (:meth:`train` returns the steps read).
    graph : bool
        Replay graphs (False: the same functions called eagerly, still with
        the read-back every ``log_every`` steps).
    batch_sizes : (int, int) or None
        The training and evaluation batch sizes the graphs are captured for
        (None: the first batch's); other sizes run eagerly.
    capture : callable
        ``capture(fn) -> callable`` (default ``cc2ops.cuda.capture_function``
        with one eager warm-up call).
    history : callable
        ``history(capacity) -> DeviceHistory`` (the tests give host ones).
    to_device : callable
        ``to_device(ndarray) -> GPU array`` for the learning rate of eager calls.
    snapshot : callable
        ``snapshot(fn) -> restore`` (default :func:`snapshot_updates` on
        ``device``): taken before the capture's warm-up call and restored
        after it, so that the warm-up leaves no trace and its batch is then
        replayed.
    """

    def __init__(
        self,
        train_fn: Any,
        eval_fn: Any,
        device: int,
        log_every: int,
        graph: bool = True,
        batch_sizes: tuple[int, int] | None = None,
        capture: Callable[[Any], Any] | None = None,
        history: Callable[[int], DeviceHistory] | None = None,
        keep_buffers: Callable[[Any, Sequence[Any], int], Any] | None = None,
        to_device: Callable[[np.ndarray], Any] | None = None,
        snapshot: Callable[[Any], Callable[[], None]] | None = None,
    ) -> None:
        if log_every < 1:
            raise ValueError(f"GraphRunner: log_every must be >= 1, got {log_every}")
        self.train_fn = train_fn
        self.eval_fn = eval_fn
        self.device = device
        self.log_every = log_every
        self.graph = graph
        if capture is None:
            from cc2ops.cuda import capture_function

            def capture(fn: Any) -> Any:
                return capture_function(fn, warmup=1)

        self._capture = capture
        self._keep = keep_buffers or call_keeping_buffers
        if to_device is None:

            def to_device(a: np.ndarray) -> Any:
                from cc2ops.cuda.runtime import array

                return array.to_gpu(a, device)

        self._to_device = to_device
        self._snapshot = snapshot or (lambda fn: snapshot_updates(fn, device))
        make_history = history or (lambda n: DeviceHistory(device, n))
        self._train_hist = make_history(log_every)
        self._eval_hist = make_history(256)
        self._pending: list[tuple[int, int, float]] = []
        self._eval = np.zeros(3)
        self._train_graph: Any = None
        self._eval_graph: Any = None
        self._train_n, self._eval_n = batch_sizes or (None, None)
        self.replays = 0  # calls that went through a graph (statistics)

    # ---- training ---------------------------------------------------------
    def _train_call(self, x: Any, y: Any, lr: np.ndarray) -> Any:
        n = int(x.shape[0])
        if self._train_n is None:
            self._train_n = n
        if self.graph and n == self._train_n:
            if self._train_graph is None:
                self._train_graph = self._capture_undoing_warmup((x, y, lr))
            self.replays += 1
            return _call_graph(self._train_graph, (x, y, lr))
        # another batch size (skipped images), or no graph
        return self._keep(self.train_fn, (x, y, self._to_device(lr)), self.device)

    def _capture_undoing_warmup(self, args: Sequence[Any]) -> Any:
        """The captured training step, its warm-up call made on ``args`` and
        undone: the caller then replays ``args``, and the step's result is the
        replay's, as every later step's is (see the module docstring)."""
        graph = self._capture(self.train_fn)
        restore = self._snapshot(self.train_fn)
        _call_graph(graph, args)  # eager: compiles, autotunes, updates the state
        restore()
        return graph

    def train(self, x: Any, y: Any, lr: float, step: int) -> list[StepMetrics]:
        """Queue step ``step`` (1-based); returns the steps read back now
        (every ``log_every`` steps), else an empty list."""
        lr_arr = np.asarray(lr, dtype=np.float32)
        loss, err = self._train_call(x, y, lr_arr)
        self._train_hist.push([loss, err])
        self._pending.append((step, len(y), float(lr)))
        if step % self.log_every == 0 or self._train_hist.full:
            return self.flush()
        return []

    def flush(self) -> list[StepMetrics]:
        """Read back every step queued since the last read (synchronises)."""
        if not self._pending:
            return []
        loss, err = self._train_hist.read()
        out = [
            StepMetrics(s, n, float(a), float(b), lr)
            for (s, n, lr), a, b in zip(self._pending, loss, err, strict=True)
        ]
        self._pending = []
        return out

    # ---- evaluation -------------------------------------------------------
    def evaluate(self, x: Any, y: Any) -> None:
        """Queue the evaluation of a batch (sums gathered on the device)."""
        n = int(x.shape[0])
        if self._eval_n is None:
            self._eval_n = n
        # the evaluation graph reads the parameters' buffers: capture it only
        # once the training graph has pinned them
        if n == self._eval_n and self._train_graph is not None:
            if self._eval_graph is None:
                self._eval_graph = self._capture(self.eval_fn)
            self.replays += 1
            outs = _call_graph(self._eval_graph, (x, y))
        else:
            outs = self.eval_fn(x, y)
        if self._eval_hist.full:
            self._eval += [c.sum() for c in self._eval_hist.read()]
        self._eval_hist.push(list(outs))

    def eval_sums(self) -> tuple[float, float, float]:
        """(loss sum, top-1 errors, top-k errors) since the last call."""
        cols = self._eval_hist.read()
        if cols:
            self._eval += [c.sum() for c in cols]
        out = tuple(float(v) for v in self._eval)
        self._eval = np.zeros(3)
        return out  # type: ignore[return-value]

    def close(self) -> None:
        """Free the graphs."""
        for g in (self._train_graph, self._eval_graph):
            if g is not None and hasattr(g, "close"):
                g.close()
        self._train_graph = self._eval_graph = None
