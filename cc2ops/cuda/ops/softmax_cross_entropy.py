"""Fused softmax cross-entropy, its gradient and the top-k error on the GPU.

``GpuSoftmaxCrossEntropy``, ``GpuSoftmaxCrossEntropyGrad`` and
``GpuTopKError`` compute what the host ops of :mod:`cc2ops.softmax_cross_entropy`
compute (same ``__props__``) on GPU arrays: logits (B, K) float32/float64,
integer labels (B,) of any integer dtype or soft targets (B, K) of the
logits' dtype. ``@register_lift`` rules move the host ops here in
``cc2ops.cuda.mode()``.

Kernels (``kernels/softmax_cross_entropy.cu``): an online logsumexp over each row
(the logits are read once by the forward), warp shuffles and one
shared-memory step to combine, any K (tested to 21841). They are
specialised on dtype, target kind (label dtype or soft), block size and, for
the forward, the load width: ``softmax_xent_fwd_i64_t256_v4_f32``. The
module functions :func:`softmax_cross_entropy_forward`,
:func:`softmax_cross_entropy_grad` and :func:`top_k_error` launch them on
GPUArrays (what ``perform`` runs; benchmarks call them directly).

How the forward spreads a row: the gradient and the top-k error run one
block per row. The forward cuts each row into S chunks when there are too
few rows to give every SM work (:func:`forward_splits`: S = 1 from B = SMs/2
rows up, so 128 x 21841 on an H200 runs one block per row) and reads them
with 16-byte loads (a scalar head and tail around the row's
16-byte-aligned middle, so odd K are vectorised too). With S > 1 the chunks'
partial states go to a per-device workspace; the last chunk of a row to
finish (a per-row arrival counter) combines them in chunk order, so the
result is deterministic, writes the loss and zeroes its counter again, so
the workspace is reused by every later launch and by CUDA-graph replays
without a memset (:func:`forward_workspace`).

What the gradient recomputes: :class:`GpuSoftmaxCrossEntropyGrad` takes
``(g, logits, targets)`` and recomputes the row max and the sum of
exponentials from the logits in a first pass, then writes ``(softmax -
onehot) * g`` (soft: ``(softmax * sum t - t) * g``) in one fused second
pass; it reuses no forward result.

Labels outside ``[0, K)``: the kernels leave the row NaN and record the
first bad row in a 4-byte device flag; with ``check=True`` (what ``perform``
does) the launch function reads the flag back, which synchronises the
device's stream once per call, and raises ``ValueError`` naming the op, the
label and its row, as the host ops do.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from pytensor.graph.basic import Apply, Variable

from cc2ops._op import FLOAT_DTYPES
from cc2ops.cuda.op import GpuOp, as_gpu_variable, common_device, gpu_float_variable
from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
from cc2ops.cuda.runtime import array, checks, tape
from cc2ops.cuda.runtime.availability import driver
from cc2ops.cuda.runtime.compile import (
    get_kernel,
    launch,
    register_namer,
    register_variants,
)
from cc2ops.cuda.runtime.device import get_device, register_shutdown_hook
from cc2ops.cuda.transfer import GpuGradients
from cc2ops.cuda.type import CudaArrayType
from cc2ops.softmax_cross_entropy import (
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyFamily,
    SoftmaxCrossEntropyGrad,
    SoftmaxCrossEntropyGradSkeleton,
    SoftmaxCrossEntropySkeleton,
    TopKError,
    TopKErrorSkeleton,
)

__all__ = [
    "GpuSoftmaxCrossEntropy",
    "GpuSoftmaxCrossEntropyGrad",
    "GpuTopKError",
    "softmax_cross_entropy_forward",
    "softmax_cross_entropy_grad",
    "top_k_error",
    "softmax_cross_entropy_kernel_name",
    "block_size",
    "forward_splits",
    "forward_vector_width",
    "forward_workspace",
    "SPLIT_BLOCK",
    "MAX_SPLITS",
    "new_label_flag",
    "check_label_flag",
    "GPU_FAMILY",
]

_BK = "(B, K)"
_B = "(B,)"
_DT = {"float32": "f32", "float64": "f64"}
#: numpy integer dtype -> the C type the kernels read labels as.
LABEL_CTYPES = {
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
}
_NO_ERROR = 0xFFFFFFFF
#: threads per block of the forward when a row is split
SPLIT_BLOCK = 256
#: the most chunks a row may be split into (``splits=``)
MAX_SPLITS = 4096


# --------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------


@register_namer("softmax_cross_entropy")
def softmax_cross_entropy_kernel_name(
    kind: str,
    dtype: str,
    soft: bool,
    label: str | None = None,
    block: int = 1024,
    ltype: str | None = None,
    vec: int = 1,
    **_: Any,
) -> str:
    """``softmax_xent_fwd_i64_t256_v4_f32``, ``..._soft_...``, ``top_k_error_...``.

    ``label`` is the labels' numpy dtype (``i64``, ``u8``...; or give the C
    type ``ltype``), ignored for soft targets. ``vec`` (elements per load)
    appears in forward names only: the other kernels load scalars.
    """
    if label is None:
        label = {c: d for d, c in LABEL_CTYPES.items()}[ltype]
    base = {
        "xent_fwd": "softmax_xent_fwd",
        "xent_grad": "softmax_xent_grad",
        "topk": "top_k_error",
    }[kind]
    tgt = "soft" if soft else label.replace("uint", "u").replace("int", "i")
    width = f"_v{vec}" if kind == "xent_fwd" else ""
    return f"{base}_{tgt}_t{block}{width}_{_DT[dtype]}"


def _consts(
    kind: str, dtype: str, soft: bool, label: str, block: int, vec: int = 1
) -> dict[str, Any]:
    c: dict[str, Any] = dict(
        kind=kind,
        dtype=str(dtype),
        soft=bool(soft),
        label=str(label),
        block=int(block),
        vec=int(vec),
    )
    c["name"] = softmax_cross_entropy_kernel_name(**c)
    c["ltype"] = LABEL_CTYPES[c["label"]]
    del c["label"]
    return c


@register_variants("softmax_cross_entropy")
def _softmax_cross_entropy_variants() -> list[dict[str, Any]]:
    return [
        _consts("xent_fwd", "float32", False, "int64", 1024, 4),
        _consts("xent_fwd", "float32", False, "int64", SPLIT_BLOCK, 4),
        _consts("xent_fwd", "float32", False, "int32", SPLIT_BLOCK, 1),
        _consts("xent_fwd", "float32", True, "int64", SPLIT_BLOCK, 4),
        _consts("xent_fwd", "float32", True, "int64", 1024, 1),
        _consts("xent_fwd", "float64", False, "uint8", SPLIT_BLOCK, 2),
        _consts("xent_fwd", "float64", False, "int64", 32, 1),
        _consts("xent_fwd", "float64", True, "int64", 32, 2),
        _consts("xent_fwd", "float64", True, "int64", SPLIT_BLOCK, 1),
        _consts("xent_grad", "float32", False, "int32", 256),
        _consts("xent_grad", "float64", True, "int64", 128),
        _consts("topk", "float32", False, "int64", 1024),
        _consts("topk", "float64", False, "uint8", 32),
    ]


def block_size(k: int) -> int:
    """Threads per row: a power of two near K/4, clamped to 32..1024."""
    want = max(1, (int(k) + 3) // 4)
    return int(min(1024, max(32, _pow2(want))))


#: a chunk of a split row is at least this many bytes
_MIN_CHUNK = 8192


def forward_splits(b: int, k: int, itemsize: int, multiprocessors: int) -> int:
    """Chunks per row (S) of the forward kernel; 1 is one block per row.

    Parameters
    ----------
    b, k : int
        Rows and classes of the logits (B, K).
    itemsize : int
        Bytes per logit: 4 (float32) or 8 (float64).
    multiprocessors : int
        The device's SM count.

    Returns
    -------
    int
        S >= 1; the grid has B * S blocks (of :data:`SPLIT_BLOCK` threads
        when S > 1).

    Notes
    -----
    S = 1 when the rows alone give at least one block to half of the SMs, or
    when a row has fewer than two chunks of 8 KiB; otherwise about one block
    per SM, S = ceil(SMs / B), as far as no chunk is under 8 KiB. Measured
    on an H200 (``benchmarks/sweep_softmax.py``): at 128 x 21841 float32 one
    block per row takes 6.2 us and 2, 3, 6 chunks per row 6.2, 6.4, 7.6 us,
    the combine (fence, arrival count, partial reads) costing what the extra
    blocks save once every SM has a row; with few rows, one block per row
    leaves most SMs idle.
    """
    b, k = int(b), int(k)
    sms = int(multiprocessors)
    row = k * int(itemsize)
    if b < 1 or 2 * b >= sms or row < 2 * _MIN_CHUNK:
        return 1
    return max(1, min(row // _MIN_CHUNK, -(-sms // b)))


def forward_vector_width(
    x_ptr: int, t_ptr: int | None, itemsize: int, soft: bool
) -> int:
    """Elements per load of the forward kernel: 16 bytes' worth, or 1.

    Any K is read with 16-byte loads (each row's misaligned head and tail
    are read as scalars), provided the logits' address is a multiple of
    ``itemsize`` and, for soft targets (``t_ptr``), the targets are
    misaligned like the logits (so that one head serves both); else 1.
    """
    itemsize = int(itemsize)
    if x_ptr % itemsize:
        return 1
    if soft and (t_ptr is None or (x_ptr - t_ptr) % 16):
        return 1
    return 16 // itemsize


class _Workspace:
    """The forward's split workspace on one physical device."""

    __slots__ = ("alloc", "rows", "part_bytes", "count_bytes", "zeroed")

    def __init__(self, alloc: Any, rows: int, part_bytes: int, count_bytes: int):
        self.alloc = alloc
        self.rows = rows
        self.part_bytes = part_bytes
        self.count_bytes = count_bytes
        self.zeroed = False


_workspaces: dict[int, _Workspace] = {}
#: outgrown workspaces, never freed: a CUDA graph captured with one may
#: still replay into it (they grow by powers of two: at most 2x the memory)
_outgrown: list[Any] = []
_workspace_lock = threading.Lock()
_workspace_hook = False


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _free_workspaces() -> None:
    _workspaces.clear()
    _outgrown.clear()


def forward_workspace(device: int, rows: int, partial_bytes: int) -> tuple[int, int]:
    """Device addresses ``(counters, partials)`` of the forward's split workspace.

    Parameters
    ----------
    device : int
        Device label; the workspace belongs to its physical device.
    rows : int
        uint32 arrival counters needed (B), each 0 between launches.
    partial_bytes : int
        Bytes of partial states needed (B * S states of 2 or 4 values).

    Notes
    -----
    One workspace per physical device, reused by every launch: they are all
    ordered on the device's one stream, and each launch leaves its counters
    0. It grows to powers of two when a launch needs more. New counters are
    zeroed by an asynchronous memset on the stream; while the device is
    captured into a CUDA graph that memset is recorded into the graph
    instead (nothing runs during a capture), so the workspace stays marked
    unzeroed and the next eager call zeroes it again.
    """
    global _workspace_hook
    from cc2ops.cuda.runtime.cudagraph import capturing

    dev = get_device(device)
    with _workspace_lock:
        ws = _workspaces.get(dev.index)
        if ws is None or ws.rows < rows or ws.part_bytes < partial_bytes:
            new_rows = _pow2(max(rows, ws.rows if ws else 1))
            new_part = _pow2(max(partial_bytes, ws.part_bytes if ws else 1))
            count_bytes = -(-4 * new_rows // 256) * 256
            dev.activate()
            alloc = dev.allocator(count_bytes + new_part)
            if ws is not None:
                _outgrown.append(ws.alloc)
            ws = _Workspace(alloc, new_rows, new_part, count_bytes)
            _workspaces[dev.index] = ws
            if not _workspace_hook:
                register_shutdown_hook(_free_workspaces)
                _workspace_hook = True
        base = int(ws.alloc)
        if not ws.zeroed:
            dev.activate()
            args = (base, 0, ws.rows, dev.stream)
            driver().memset_d32_async(*args)
            tape.note_driver("memset_d32_async", args, (0,))
            ws.zeroed = not capturing(device)
        return base, base + ws.count_bytes


def _check_splits(op: str, splits: Any) -> int | None:
    if splits is None:
        return None
    if isinstance(splits, bool) or not isinstance(splits, (int, np.integer)):
        raise TypeError(f"{op}: splits must be an int or None, got {splits!r}")
    if not 1 <= int(splits) <= MAX_SPLITS:
        raise ValueError(f"{op}: splits must be in [1, {MAX_SPLITS}], got {splits}")
    return int(splits)


def _check_logits(op: str, x: Any) -> None:
    if len(x.shape) != 2:
        raise ValueError(f"{op}: logits must have 2 dims {_BK}, got {len(x.shape)}")
    if str(x.dtype) not in FLOAT_DTYPES:
        raise TypeError(f"{op}: logits must be float32 or float64, got {x.dtype}")
    if x.shape[1] < 1:
        raise ValueError(
            f"{op}: logits must have at least one class (K >= 1), got shape "
            f"{tuple(x.shape)}"
        )
    if x.shape[0] >= _NO_ERROR:
        raise ValueError(f"{op}: at most {_NO_ERROR - 1} rows, got {x.shape[0]}")


def _check_targets(op: str, t: Any, x: Any) -> bool:
    """Whether ``t`` holds soft targets; raises on a mismatch."""
    b, k = (int(s) for s in x.shape)
    if np.dtype(t.dtype).kind in "iu":
        if len(t.shape) != 1:
            raise ValueError(
                f"{op}: integer labels must have 1 dim {_B}, got {len(t.shape)}"
            )
        if int(t.shape[0]) != b:
            raise ValueError(
                f"{op}: labels must have one entry per row of logits (B = {b}), got "
                f"{int(t.shape[0])}"
            )
        return False
    if t.dtype != x.dtype:
        raise TypeError(
            f"{op}: soft targets must have the logits' dtype ({x.dtype}), got {t.dtype}"
        )
    if tuple(t.shape) != (b, k):
        raise ValueError(
            f"{op}: soft targets must have the logits' shape {_BK} = {(b, k)}, got "
            f"{tuple(t.shape)}"
        )
    return True


def check_label_flag(flag: Any, labels: Any, op: str, k: int, device: int) -> None:
    """Raise ``ValueError`` if a kernel flagged a label outside ``[0, K)``.

    While ``device`` is captured into a CUDA graph the check runs after each
    replay (:func:`cc2ops.cuda.runtime.cudagraph.defer_check`); while a GPU
    function runs, at the next point that needs it, before the caller's state
    can change (:mod:`cc2ops.cuda.runtime.checks`: the flag is copied back
    without waiting); otherwise at once (reading the 4-byte flag back
    synchronises the stream). On an error the offending label is read too.
    """
    from cc2ops.cuda.runtime.cudagraph import defer_check

    if defer_check(device, lambda: check_label_flag(flag, labels, op, k, device)):
        return
    if checks.deferring():
        checks.defer_flag(
            flag, device, lambda row: _raise_on_bad_row(row, labels, op, k, device)
        )
        # a launch tape replays this call with its own flag and labels
        tape.note_call(check_label_flag, (flag, labels, op, k, device))
        return
    _raise_on_bad_row(int(array.to_host(flag, device)[0]), labels, op, k, device)


def _raise_on_bad_row(row: int, labels: Any, op: str, k: int, device: int) -> None:
    """The error for a flag value ``row`` (``_NO_ERROR``: none)."""
    if row == _NO_ERROR:
        return
    label = array.to_host(labels[row : row + 1], device)[0]
    raise ValueError(
        f"{op}: labels must be in [0, K) = [0, {k}), got {int(label)} at row {row}"
    )


def new_label_flag(device: int) -> Any:
    """A 4-byte device flag meaning "no bad label" (``0xffffffff``).

    The kernels only ever lower it (to the first bad row), so one flag may
    serve many launches until it is found set.
    """
    return array.full((1,), _NO_ERROR, np.uint32, device)


def _kernel(
    kind: str, x: Any, t: Any, soft: bool, block: int, vec: int, device: int
) -> Any:
    """The ``kind`` kernel for logits ``x`` and targets ``t`` (labels or soft)."""
    label = "int64" if soft else str(t.dtype)
    consts = _consts(kind, str(x.dtype), soft, label, block, vec)
    # 1024 threads per block fit the register file only with <= 64 registers
    options = ("-maxrregcount=64",) if block > 512 else ()
    return get_kernel("softmax_cross_entropy", device, options=options, **consts)


def _run(
    kind: str,
    x: Any,
    t: Any,
    soft: bool,
    out: Any,
    pre: list[Any],
    post: list[Any],
    device: int,
    flag: Any = None,
) -> Any:
    b, k = (int(s) for s in x.shape)
    flag = flag if flag is not None else new_label_flag(device)
    if b == 0:
        return flag
    block = block_size(k)
    fn = _kernel(kind, x, t, soft, block, 1, device)
    grid = min(b, 2**31 - 1)
    args = [*pre, x, t, out, np.int64(b), np.int64(k), *post, flag]
    launch(fn, grid, block, args, device)
    return flag


def _forward(
    x: Any, t: Any, soft: bool, loss: Any, device: int, flag: Any, splits: int | None
) -> Any:
    b, k = (int(s) for s in x.shape)
    flag = flag if flag is not None else new_label_flag(device)
    if b == 0:
        return flag
    dev = get_device(device)
    itemsize = np.dtype(x.dtype).itemsize
    if splits is None:
        splits = forward_splits(b, k, itemsize, dev.multiprocessors)
    block = SPLIT_BLOCK if splits > 1 else block_size(k)
    t_ptr = array.ptr(t) if soft else None
    vec = forward_vector_width(array.ptr(x), t_ptr, itemsize, soft)
    fn = _kernel("xent_fwd", x, t, soft, block, vec, device)
    count = part = 0
    if splits > 1:
        part_bytes = b * splits * (4 if soft else 2) * itemsize
        count, part = forward_workspace(device, b, part_bytes)
    grid = min(b * splits, 2**31 - 1)
    args = [x, t, loss, np.int64(b), np.int64(k), np.int64(splits),
            np.uintp(part), np.uintp(count), flag]  # fmt: skip
    launch(fn, grid, block, args, device)
    return flag


def softmax_cross_entropy_forward(
    logits: Any,
    targets: Any,
    *,
    device: int = 0,
    check: bool = True,
    flag: Any = None,
    splits: int | None = None,
    op: str = "GpuSoftmaxCrossEntropy",
) -> Any:
    """Per-example softmax cross-entropy of GPUArrays; returns the loss (B,).

    Parameters
    ----------
    logits : GPUArray, float32 or float64, shape (B, K)
    targets : GPUArray
        Integer labels (B,) or soft targets (B, K) of the logits' dtype.
    device : int
        Device label the arrays live on.
    check : bool
        Read the label-error flag back and raise ``ValueError`` on a label
        outside ``[0, K)`` (synchronises the stream; deferred to after each
        replay while a CUDA graph captures); ``False`` leaves the launch
        asynchronous (bad rows are NaN).
    flag : GPUArray, optional
        The label-error flag to use (:func:`new_label_flag`); default a new
        one per call. A reused flag saves one small fill per launch.
    splits : int, optional
        Chunks per row, 1 to :data:`MAX_SPLITS` (``None``: chosen by
        :func:`forward_splits`). For tests and tuning: every value gives the
        loss to rounding, more chunks than 16-byte vectors leave some empty.

    Returns
    -------
    GPUArray, shape (B,), the logits' dtype

    Notes
    -----
    With more than one chunk per row the launch uses the device's workspace
    (:func:`forward_workspace`); the result is deterministic for a given
    ``splits`` (partials are combined in chunk order), and may differ from
    another ``splits`` in the last bits.
    """
    _check_logits(op, logits)
    soft = _check_targets(op, targets, logits)
    splits = _check_splits(op, splits)
    x = array.ascontiguous(logits, device)
    t = array.ascontiguous(targets, device)
    loss = array.empty((int(x.shape[0]),), x.dtype, device)
    flag = _forward(x, t, soft, loss, device, flag, splits)
    if check and not soft:
        check_label_flag(flag, t, op, int(x.shape[1]), device)
    return loss


def softmax_cross_entropy_grad(
    g: Any,
    logits: Any,
    targets: Any,
    *,
    device: int = 0,
    check: bool = True,
    flag: Any = None,
    op: str = "GpuSoftmaxCrossEntropyGrad",
) -> Any:
    """Gradient wrt the logits: ``g`` (B,), logits (B, K), targets as in
    :func:`softmax_cross_entropy_forward`; returns ``dlogits`` (B, K)."""
    _check_logits(op, logits)
    soft = _check_targets(op, targets, logits)
    if len(g.shape) != 1:
        raise ValueError(f"{op}: g must have 1 dim {_B}, got {len(g.shape)}")
    if g.dtype != logits.dtype:
        raise TypeError(
            f"{op}: g must have the logits' dtype ({logits.dtype}), got {g.dtype}"
        )
    if int(g.shape[0]) != int(logits.shape[0]):
        raise ValueError(
            f"{op}: g must have one entry per row of logits (B = "
            f"{int(logits.shape[0])}), got {int(g.shape[0])}"
        )
    x = array.ascontiguous(logits, device)
    t = array.ascontiguous(targets, device)
    gc = array.ascontiguous(g, device)
    dx = array.empty(x.shape, x.dtype, device)
    flag = _run("xent_grad", x, t, soft, dx, [gc], [], device, flag)
    if check and not soft:
        check_label_flag(flag, t, op, int(x.shape[1]), device)
    return dx


def top_k_error(
    logits: Any,
    labels: Any,
    k: int,
    *,
    device: int = 0,
    check: bool = True,
    flag: Any = None,
    op: str = "GpuTopKError",
) -> Any:
    """Top-k error per row of GPUArrays: 1.0 where fewer than ``k`` logits are
    not strictly greater than the label's, else 0.0; returns (B,)."""
    _check_logits(op, logits)
    if np.dtype(labels.dtype).kind not in "iu":
        raise TypeError(f"{op}: labels must have an integer dtype, got {labels.dtype}")
    _check_targets(op, labels, logits)
    x = array.ascontiguous(logits, device)
    t = array.ascontiguous(labels, device)
    err = array.empty((int(x.shape[0]),), x.dtype, device)
    flag = _run("topk", x, t, False, err, [], [np.int64(k)], device, flag)
    if check:
        check_label_flag(flag, t, op, int(x.shape[1]), device)
    return err


# --------------------------------------------------------------------------
# ops: the skeletons of cc2ops.softmax_cross_entropy plus GPU make_node and
# perform
# --------------------------------------------------------------------------


def _gpu_logits(op: str, x: Any) -> Variable:
    x = gpu_float_variable(op, "logits", x, 2, _BK)
    return SoftmaxCrossEntropySkeleton._check_classes(op, x)


def _gpu_targets(op: str, t: Any, x: Variable) -> Variable:
    t = as_gpu_variable(t, op=op, role="targets")
    return SoftmaxCrossEntropySkeleton._checked_targets(op, t, x)


class _GpuBase(GpuGradients, GpuOp):
    """The GPU ops' base: the GPU gradient hooks and op machinery (no props
    but ``k``)."""

    __props__ = ()
    # replayed from launch tapes (cc2ops.cuda.runtime.tape) once their label
    # checks are deferred (inside a GPU-mode function; a check read back at
    # once refuses the recording); the split forward's workspace is kept for
    # the process's life, so a tape may hold its address
    tape_replay = True


class GpuSoftmaxCrossEntropy(SoftmaxCrossEntropySkeleton, _GpuBase):
    """Per-example softmax cross-entropy on the GPU: ``(logits, targets) -> loss``.

    ``logits`` (B, K) float32/float64; ``targets`` integer labels (B,) or
    soft targets (B, K) of the logits' dtype, on the same device; ``loss``
    (B,) in the logits' dtype.

    Notes
    -----
    :class:`cc2ops.softmax_cross_entropy.SoftmaxCrossEntropy` on the GPU
    (shape rule and gradients:
    :class:`~cc2ops.softmax_cross_entropy.SoftmaxCrossEntropySkeleton`). A
    label outside ``[0, K)`` raises ``ValueError`` when the function runs
    (the op's kernel lowers a 4-byte error flag, read back where the step
    needs it: :mod:`cc2ops.cuda.runtime.checks`). Long rows are spread over
    several blocks when the batch alone would not fill the device
    (:func:`softmax_cross_entropy_forward`); the loss is deterministic either
    way. Pullback wrt the logits
    :class:`GpuSoftmaxCrossEntropyGrad`; soft targets get
    ``-log_softmax(logits) * g[:, None]`` (a host graph that the GPU mode
    lifts); labels are disconnected.
    """

    def make_node(self, logits: Any, targets: Any) -> Apply:
        op = "GpuSoftmaxCrossEntropy"
        x = _gpu_logits(op, logits)
        t = _gpu_targets(op, targets, x)
        device = common_device(op, x, t)
        out = CudaArrayType(x.type.dtype, x.type.shape[:1], device)()
        return Apply(self, [x, t], [out])

    def perform(self, node, inputs, output_storage):
        x, t = inputs
        output_storage[0][0] = softmax_cross_entropy_forward(
            x, t, device=self.device_of(node)
        )


class GpuSoftmaxCrossEntropyGrad(SoftmaxCrossEntropyGradSkeleton, _GpuBase):
    """Gradient of :class:`GpuSoftmaxCrossEntropy` wrt the logits.

    ``(g, logits, targets) -> dlogits``: ``g`` (B,), ``logits`` (B, K),
    ``targets`` labels (B,) or soft targets (B, K); ``dlogits`` (B, K) is
    ``(softmax - onehot) * g[:, None]`` or ``(softmax * sum t - t) * g[:, None]``.

    Notes
    -----
    One fused kernel recomputes the row max and sum from the logits and
    writes the gradient; bad labels raise as in the forward. Its own
    pullback is the host op's
    (:class:`~cc2ops.softmax_cross_entropy.SoftmaxCrossEntropyGradSkeleton`:
    the formula written with PyTensor's softmax, differentiated on host views
    of the inputs), moved to this device.
    """

    def make_node(self, g: Any, logits: Any, targets: Any) -> Apply:
        op = "GpuSoftmaxCrossEntropyGrad"
        x = _gpu_logits(op, logits)
        g = as_gpu_variable(g, op=op, role="g")
        if g.type.ndim != 1:
            raise TypeError(f"{op}: g must have 1 dims {_B}, got {g.type.ndim}")
        if g.type.dtype != x.type.dtype:
            raise TypeError(
                f"{op}: inputs must share one float dtype, got g {g.type.dtype}, "
                f"logits {x.type.dtype}"
            )
        b = self._rows(op, "g", g, x)
        t = _gpu_targets(op, targets, x)
        device = common_device(op, g, x, t)
        out = CudaArrayType(x.type.dtype, (b, x.type.shape[1]), device)()
        return Apply(self, [g, x, t], [out])

    def perform(self, node, inputs, output_storage):
        g, x, t = inputs
        output_storage[0][0] = softmax_cross_entropy_grad(
            g, x, t, device=self.device_of(node)
        )


class GpuTopKError(TopKErrorSkeleton, _GpuBase):
    """Top-k error per example on the GPU: ``(logits, labels) -> err`` (B,).

    :class:`cc2ops.softmax_cross_entropy.TopKError` on the GPU (parameter
    ``k >= 1``, shape rule and gradient:
    :class:`~cc2ops.softmax_cross_entropy.TopKErrorSkeleton`). ``logits``
    (B, K) float32/float64, ``labels`` integer (B,), same device; ``err`` is
    1.0 where at least ``k`` logits are strictly greater than the true
    class's (ties count for the true class, as in the host op), else 0.0.
    Bad labels raise ``ValueError`` at run time. Gradient zero wrt the
    logits; the labels are disconnected.
    """

    __props__ = ("k",)

    def make_node(self, logits: Any, labels: Any) -> Apply:
        op = "GpuTopKError"
        x = _gpu_logits(op, logits)
        y = as_gpu_variable(labels, op=op, role="labels")
        b = self._check_labels(op, y, x)
        device = common_device(op, x, y)
        return Apply(self, [x, y], [CudaArrayType(x.type.dtype, (b,), device)()])

    def perform(self, node, inputs, output_storage):
        x, y = inputs
        output_storage[0][0] = top_k_error(x, y, self.k, device=self.device_of(node))


#: The GPU ops by role (their skeletons' ``family``).
GPU_FAMILY = SoftmaxCrossEntropyFamily(
    GpuSoftmaxCrossEntropy, GpuSoftmaxCrossEntropyGrad, GpuTopKError
)
_GpuBase.family = GPU_FAMILY


# --------------------------------------------------------------------------
# lifting
# --------------------------------------------------------------------------


@register_lift(SoftmaxCrossEntropy)
def lift_softmax_cross_entropy(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``SoftmaxCrossEntropy(x, t) -> host_from_gpu(GpuSoftmaxCrossEntropy(gpu(x),
    gpu(t)))`` (labels are uploaded too)."""
    x, t = (to_gpu(v, device) for v in node.inputs)
    return [GpuSoftmaxCrossEntropy()(x, t)]


@register_lift(SoftmaxCrossEntropyGrad)
def lift_softmax_cross_entropy_grad(
    fgraph: Any, node: Apply, device: int
) -> list[Variable]:
    """``SoftmaxCrossEntropyGrad(g, x, t) -> host_from_gpu(
    GpuSoftmaxCrossEntropyGrad(gpu(g), gpu(x), gpu(t)))``."""
    g, x, t = (to_gpu(v, device) for v in node.inputs)
    return [GpuSoftmaxCrossEntropyGrad()(g, x, t)]


@register_lift(TopKError)
def lift_top_k_error(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``TopKError(x, y) -> host_from_gpu(GpuTopKError(gpu(x), gpu(y)))``."""
    x, y = (to_gpu(v, device) for v in node.inputs)
    return [GpuTopKError(k=node.op.k)(x, y)]


def __getattr__(name: str) -> Any:
    # the family's 0.1 name (softmax_loss) is softmax_cross_entropy at every
    # layer now; the old namer name works until the next release
    if name == "softmax_loss_kernel_name":
        import warnings

        warnings.warn(
            f"{__name__}.softmax_loss_kernel_name is now "
            "softmax_cross_entropy_kernel_name; the old name works until the next "
            "release",
            DeprecationWarning,
            stacklevel=2,
        )
        return softmax_cross_entropy_kernel_name
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
