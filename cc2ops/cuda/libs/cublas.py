"""cuBLAS through nvmath-python's bindings: row-major GEMM, batched GEMM and GEMV.

The calls go through ``nvmath.bindings.cublas`` (``nvmath-python``, pinned by
the ``cuda`` extra: NVIDIA marks that module experimental, so a new release may
change it), which takes ints for handles, pointers and enums and raises
``cuBLASError`` on a failing status; the enums (operations, compute types,
data types, math mode) are nvmath's. The library is located by
cuda-pathfinder (:mod:`cc2ops.cuda.runtime.libraries`: NVIDIA's wheels,
``$CONDA_PREFIX``, the loader path, ``$CUDA_PATH``/``$CUDA_HOME``). Nothing is
imported or loaded until the first product; without nvmath-python or libcublas
a product raises :class:`CublasError` saying which is missing.

This module keeps only cc2ops's policy over those calls. One handle per
physical device, created lazily with the device's primary context current (the
one pycuda and the CUDA runtime, hence cuBLAS, share) and bound to the device's
stream, so products are ordered with every other cc2ops kernel; each handle
has its own workspace (:data:`WORKSPACE_BYTES`), set explicitly so that a
captured CUDA graph reuses one buffer instead of cuBLAS's pool. Failing
statuses become :class:`CublasError` naming the call and the status.

Row-major arrays
----------------
cuBLAS is column-major. A row-major matrix with row stride ``ld`` (elements)
is, read column-major, its transpose with leading dimension ``ld``; so
``C = op(A) op(B)`` is computed as ``C^T = op(B)^T op(A)^T`` by passing B
before A with the same transpose flags (:func:`_column_major_gemm`). Arrays
may have a row stride larger than the row (views of wider arrays); transposed
views (unit stride along the rows) are folded into the transpose flags instead
of being copied (:func:`_fold`); any other layout is made contiguous first.

Precision
---------
float32 products are true float32 unless TF32 is allowed
(:func:`cc2ops.cuda.set_allow_tf32`, read per call) or ``precision="tf32"``
is passed: then ``cublasGemmEx`` runs with ``CUBLAS_COMPUTE_32F_FAST_TF32``.
float64 products always use ``cublasDgemm``.

Complex products
----------------
:func:`gemm_strided_batched_complex` multiplies complex64 (``CUDA_C_32F``;
``CUBLAS_COMPUTE_32F``, or ``CUBLAS_COMPUTE_32F_FAST_TF32`` under the same
TF32 rule) or complex128 (``CUDA_C_64F``, ``CUBLAS_COMPUTE_64F``) batches
through ``cublasGemmStridedBatchedEx``, with plain, transposed or
conjugate-transposed operands.
"""

from __future__ import annotations

import threading
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np

from cc2ops.cuda.runtime import tape
from cc2ops.cuda.runtime.array import ascontiguous, device_of, empty, is_gpuarray, ptr
from cc2ops.cuda.runtime.device import (
    get_device,
    physical_index,
    register_shutdown_hook,
)
from cc2ops.cuda.runtime.libraries import binding, load_library
from cc2ops.cuda.runtime.precision import get_allow_tf32

__all__ = [
    "CublasError",
    "gemm",
    "gemm_strided_batched",
    "gemm_strided_batched_complex",
    "gemv",
    "library_path",
    "get_handle",
    "status_name",
]

_WHERE = "cc2ops.cuda.libs.cublas"


class CublasError(RuntimeError):
    """A cuBLAS call failed, or nvmath-python or libcublas is missing."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------
# the bindings
# --------------------------------------------------------------------------

_lock = threading.RLock()
_enum_cache: SimpleNamespace | None = None
_handles: dict[int, int] = {}
_workspaces: dict[int, Any] = {}
#: cuBLAS workspace per handle (what cuBLAS asks for on Hopper): set
#: explicitly so that captured CUDA graphs reuse one buffer
WORKSPACE_BYTES = 32 << 20
_hook_registered = False


def _nv() -> ModuleType:
    """``nvmath.bindings.cublas`` (memoised), else :class:`CublasError`."""
    return binding(
        "nvmath.bindings.cublas", user=f"{_WHERE} (cuBLAS)", error=CublasError
    )


def _enums() -> SimpleNamespace:
    """The cuBLAS and CUDA enum members this module passes, from nvmath."""
    global _enum_cache
    if _enum_cache is None:
        cublas = _nv()
        data = binding("nvmath", user=f"{_WHERE} (cuBLAS)", error=CublasError)
        data = data.CudaDataType
        _enum_cache = SimpleNamespace(
            op={"n": cublas.Operation.N, "t": cublas.Operation.T,
                "c": cublas.Operation.C},
            data={
                np.dtype(np.float32): data.CUDA_R_32F,
                np.dtype(np.float64): data.CUDA_R_64F,
                np.dtype(np.complex64): data.CUDA_C_32F,
                np.dtype(np.complex128): data.CUDA_C_64F,
            },
            compute_32f=cublas.ComputeType.COMPUTE_32F,
            compute_64f=cublas.ComputeType.COMPUTE_64F,
            compute_tf32=cublas.ComputeType.COMPUTE_32F_FAST_TF32,
            gemm_default=cublas.GemmAlgo.DEFAULT,
            default_math=cublas.Math.DEFAULT_MATH,
        )  # fmt: skip
    return _enum_cache


def _op_enum(op: str) -> int:
    """cuBLAS's ``cublasOperation_t`` of ``"n"``, ``"t"`` or ``"c"``."""
    return _enums().op[op]


def _data_type(dtype: np.dtype) -> int:
    """The ``cudaDataType`` of a float32/float64/complex64/complex128 dtype."""
    return _enums().data[np.dtype(dtype)]


def _compute_type(dtype: np.dtype, tf32: bool) -> int:
    """``cublasComputeType_t`` of a product of ``dtype`` operands: TF32 only
    for single precision (real or complex) and only when asked for."""
    e = _enums()
    if np.dtype(dtype) in (np.dtype(np.float64), np.dtype(np.complex128)):
        return e.compute_64f
    return e.compute_tf32 if tf32 else e.compute_32f


def status_name(status: int) -> str:
    """The ``CUBLAS_STATUS_*`` name of a status code."""
    try:
        return f"CUBLAS_STATUS_{_nv().Status(int(status)).name}"
    except (ValueError, CublasError):
        return f"CUBLAS_STATUS_UNKNOWN({int(status)})"


def library_path() -> str:
    """The path libcublas was loaded from (loads it, through cuda-pathfinder)."""
    return load_library("cublas", user=f"{_WHERE} (cuBLAS)", error=CublasError)


#: The calls that queue work on the handle's stream: a launch tape records
#: them (:mod:`cc2ops.cuda.runtime.tape`); any other call refuses a recording.
_QUEUED_CALLS = frozenset({
    "sgemm", "dgemm", "gemm_ex",
    "sgemm_strided_batched", "dgemm_strided_batched", "gemm_strided_batched_ex",
    "sgemv", "dgemv",
})  # fmt: skip


def _invoke(fname: str, *args: Any) -> Any:
    """``nvmath.bindings.cublas.<fname>(*args)``; a failing status raises
    :class:`CublasError` naming the call and the status."""
    cublas = _nv()
    try:
        return getattr(cublas, fname)(*args)
    except cublas.cuBLASError as e:
        status = int(e.status)
        raise CublasError(
            f"{_WHERE}: {fname} failed: {status_name(status)}", status
        ) from e


def _call(fname: str, *args: Any) -> Any:
    """:func:`_invoke`, reported to a launch tape being recorded."""
    out = _invoke(fname, *args)
    if tape.recorder() is not None:
        if fname in _QUEUED_CALLS:
            tape.note_library(_invoke, fname, args)
        else:
            tape.refuse(f"cuBLAS {fname}")
    return out


def _destroy_handles() -> None:
    for index, handle in list(_handles.items()):
        try:
            get_device(_label_of_physical(index)).activate()
            _call("destroy", handle)
        except Exception:  # the context may already be unusable at exit
            pass
        _handles.pop(index, None)
        _workspaces.pop(index, None)


def _label_of_physical(index: int) -> int:
    from cc2ops.cuda.runtime.device import initialized_devices

    for dev in initialized_devices():
        if dev.index == index:
            return dev.label
    return index


def get_handle(device: int) -> int:
    """The cuBLAS handle (an int) of ``device``'s physical device, bound to its
    stream, with its own workspace."""
    global _hook_registered
    dev = get_device(device)
    handle = _handles.get(dev.index)
    if handle is not None:
        return handle
    with _lock:
        handle = _handles.get(dev.index)
        if handle is not None:
            return handle
        library_path()  # a missing libcublas is named here, not deep in nvmath
        e = _enums()
        dev.activate()
        handle = int(_call("create"))
        _call("set_stream", handle, int(dev.stream.handle))
        _call("set_math_mode", handle, e.default_math)
        # after set_stream, which resets the workspace to cuBLAS's own pool
        workspace = dev.alloc(WORKSPACE_BYTES)
        _call("set_workspace", handle, int(workspace), WORKSPACE_BYTES)
        _workspaces[dev.index] = workspace
        _handles[dev.index] = handle
        if not _hook_registered:
            register_shutdown_hook(_destroy_handles)
            _hook_registered = True
        return handle


# --------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------


def _matrix(base: int, shape: tuple[int, int], strides: tuple[int, int], itemsize: int):
    """``(transposed, ld)`` describing a matrix view for cuBLAS, or ``None``.

    ``transposed=False``: row-major with row stride ``ld`` elements.
    ``transposed=True``: the transpose of a row-major matrix (shape reversed)
    with row stride ``ld``. ``None``: needs a contiguous copy.
    """
    r, c = shape
    s0, s1 = strides
    if r == 0 or c == 0:
        return False, max(1, c)
    if (c == 1 or s1 == itemsize) and (r == 1 or (s0 > 0 and s0 % itemsize == 0)):
        ld = s0 // itemsize if r > 1 else c
        if ld >= c:
            return False, max(1, ld)
    if (r == 1 or s0 == itemsize) and (c == 1 or (s1 > 0 and s1 % itemsize == 0)):
        ld = s1 // itemsize if c > 1 else r
        if ld >= r:
            return True, max(1, ld)
    return None


def _layout(x: Any, itemsize: int, batched: bool):
    """``(transposed, ld, batch_stride)`` of an operand, or ``None`` (needs a copy)."""
    inner = slice(1, 3) if batched else slice(0, 2)
    shape = tuple(int(s) for s in x.shape[inner])
    strides = tuple(int(s) for s in x.strides[inner])
    layout = _matrix(ptr(x), shape, strides, itemsize)  # type: ignore[arg-type]
    if layout is None:
        return None
    batch_stride = 0
    if batched and int(x.shape[0]) > 1:
        bs = int(x.strides[0])
        if bs < 0 or bs % itemsize:
            return None
        batch_stride = bs // itemsize
    return layout[0], layout[1], batch_stride


def _operand(x: Any, device: int, itemsize: int, batched: bool):
    """(array, transposed, ld, batch_stride) of an input, copying odd layouts."""
    layout = _layout(x, itemsize, batched)
    if layout is None:
        x = ascontiguous(x, device)
        layout = _layout(x, itemsize, batched)
        assert layout is not None, "a C-contiguous array always has a cuBLAS layout"
    return (x, *layout)


_REAL = (np.dtype(np.float32), np.dtype(np.float64))
_COMPLEX = (np.dtype(np.complex64), np.dtype(np.complex128))


def _check_inputs(
    where: str, device: int, ndim: int, allowed: tuple = _REAL, **arrays: Any
) -> np.dtype:
    dtype = None
    want = physical_index(device)
    for name, x in arrays.items():
        if not is_gpuarray(x):
            raise TypeError(
                f"{where}: {name} must be a GPUArray, got {type(x).__name__}"
            )
        if len(x.shape) != ndim:
            raise TypeError(
                f"{where}: {name} must have {ndim} dims, got {len(x.shape)}"
            )
        dt = np.dtype(x.dtype)
        if dt not in allowed:
            names = " or ".join(str(a) for a in allowed)
            raise TypeError(f"{where}: {name} must be {names}, got {dt}")
        if dtype is None:
            dtype = dt
        elif dt != dtype:
            raise TypeError(
                f"{where}: inputs must share one dtype, got {dtype} and {dt}"
            )
        where_dev = device_of(x)
        if where_dev is not None and where_dev != want:
            raise ValueError(
                f"{where}: {name} lives on physical device {where_dev}, not on device "
                f"{device} (physical {want})"
            )
    assert dtype is not None
    return dtype


def _use_tf32(where: str, precision: str | None, dtype: np.dtype) -> bool:
    if precision is None:
        tf32 = get_allow_tf32()
    elif precision == "tf32":
        tf32 = True
    elif precision in ("fp32", "ieee"):
        tf32 = False
    else:
        raise ValueError(
            f"{where}: precision must be None, 'fp32' or 'tf32', got {precision!r}"
        )
    return tf32 and dtype == np.float32


def _scalars(dtype: np.dtype, alpha: Any, beta: Any) -> tuple[np.ndarray, np.ndarray]:
    """``alpha`` and ``beta`` as host scalars of ``dtype`` (cuBLAS's default
    host pointer mode: it reads them before the call returns, so a captured
    graph keeps the values)."""
    al, be = np.array(alpha, dtype=dtype), np.array(beta, dtype=dtype)
    tape.note_host_scalar(al)
    tape.note_host_scalar(be)
    return al, be


def _fold(op: str, transposed: bool) -> str:
    """The cuBLAS op that applies ``op`` to an operand whose storage is
    transposed (``True``: the operand is the transpose of a row-major array).

    A transposed storage swaps ``"n"`` and ``"t"``; ``"c"`` of a transposed
    storage would be a conjugate without a transpose, which cuBLAS has no op
    for (the caller copies such an operand first).
    """
    if not transposed:
        return op
    if op == "c":
        raise ValueError("cublas: a conjugate of a transposed view needs a copy")
    return "t" if op == "n" else "n"


def _column_major_gemm(
    m: int,
    n: int,
    k: int,
    op_a: str,
    op_b: str,
    a_transposed: bool,
    b_transposed: bool,
) -> tuple[str, str, int, int, int]:
    """``(transa, transb, M, N, K)`` of the column-major product computing the
    row-major ``C (m x n) = op_a(a) op_b(b)``.

    Read column-major, the row-major ``C`` is ``C^T`` (n x m) and each operand's
    storage is its transpose, so cuBLAS computes ``C^T = op(B)^T op(A)^T``: B is
    passed first (as cuBLAS's A) with ``op_b``, A second with ``op_a``, and
    ``M, N = n, m``. (``"c"`` stays ``"c"``: ``(A^H)^T = conj(A) = (A^T)^H``.)
    Transposed storages are folded into the flags (:func:`_fold`); the leading
    dimensions are the storages' row strides, unchanged.
    """
    return _fold(op_b, b_transposed), _fold(op_a, a_transposed), n, m, k


def _column_major_gemv(
    rows: int, cols: int, trans: bool, transposed: bool
) -> tuple[str, int, int]:
    """``(trans, M, N)`` of the column-major GEMV computing ``y = op(a) x`` for a
    row-major ``a`` of shape (rows, cols), ``op`` transposing when ``trans``.

    The row-major storage ``S`` of ``a`` is ``a`` (rows x cols) or, for a
    transposed view, ``a^T`` (cols x rows); cuBLAS reads ``S`` as the
    column-major ``S^T`` (``M x N`` = S's columns x S's rows). When ``op(a)``
    is ``S`` (``trans == transposed``), ``S x = (S^T)^T x`` needs op ``"t"``;
    when it is ``S^T``, op ``"n"``.
    """
    s_rows, s_cols = (cols, rows) if transposed else (rows, cols)
    return ("n" if trans != transposed else "t"), s_cols, s_rows


def _check_int32(where: str, **values: int) -> None:
    for name, v in values.items():
        if v > 2**31 - 1:
            raise ValueError(f"{where}: {name}={v} exceeds cuBLAS's 32-bit int limit")


# --------------------------------------------------------------------------
# products
# --------------------------------------------------------------------------


def gemm(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    device: int,
    precision: str | None = None,
) -> Any:
    """``c = alpha * op(a) @ op(b) + beta * c`` for row-major 2-D GPUArrays.

    Parameters
    ----------
    a, b : GPUArray
        2-D float32 or float64 (same dtype), rows x columns; ``op`` transposes
        when ``trans_a``/``trans_b``. Row strides larger than the row, and
        transposed views, are used in place.
    c : GPUArray, optional
        (m, n) output, row-major (unit column stride) or a transposed view;
        allocated from the device pool when omitted (then ``beta`` must be 0).
    alpha, beta : float
    device : int
        Device label the arrays live on.
    precision : {None, "fp32", "tf32"}
        float32 only: ``None`` follows :func:`~cc2ops.cuda.get_allow_tf32`.

    Returns
    -------
    GPUArray
        ``c``.
    """
    dtype = _check_inputs("gemm", device, 2, a=a, b=b)
    tf32 = _use_tf32("gemm", precision, dtype)
    get_device(device).activate()
    ar, ac = (int(s) for s in a.shape)
    br, bc = (int(s) for s in b.shape)
    m, k = (ac, ar) if trans_a else (ar, ac)
    kb, n = (bc, br) if trans_b else (br, bc)
    if k != kb:
        raise ValueError(
            f"gemm: op(a) is {m}x{k} and op(b) is {kb}x{n}; inner dimensions differ"
        )
    if c is None:
        if beta != 0:
            raise ValueError("gemm: beta != 0 needs an output array c")
        c = empty((m, n), dtype, device)
    else:
        _check_inputs("gemm", device, 2, c=c)
        if np.dtype(c.dtype) != dtype:
            raise TypeError(f"gemm: c has dtype {c.dtype}, the inputs {dtype}")
        if tuple(int(s) for s in c.shape) != (m, n):
            raise ValueError(f"gemm: c must have shape {(m, n)}, got {tuple(c.shape)}")
    if m == 0 or n == 0:
        return c
    itemsize = dtype.itemsize
    c_layout = _matrix(ptr(c), (m, n), tuple(int(s) for s in c.strides), itemsize)
    if c_layout is None:
        raise ValueError(
            f"gemm: c must be row-major with unit column stride, or a transposed view; "
            f"got strides {tuple(c.strides)} for shape {(m, n)}"
        )
    if c_layout[0]:
        # c is the transpose of a row-major (n, m) array: compute that instead,
        # c^T = op(b)^T op(a)^T
        gemm(b, a, c.T, trans_a=not trans_b, trans_b=not trans_a, alpha=alpha,
             beta=beta, device=device, precision=precision)  # fmt: skip
        return c
    ldc = c_layout[1]
    a, ta, lda, _ = _operand(a, device, itemsize, batched=False)
    b, tb, ldb, _ = _operand(b, device, itemsize, batched=False)
    _check_int32("gemm", m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc)
    handle = get_handle(device)
    get_device(device).activate()
    al, be = _scalars(dtype, alpha, beta)
    # cuBLAS's first operand is b, its second a (see _column_major_gemm)
    op1, op2, mm, nn, kk = _column_major_gemm(
        m, n, k, "t" if trans_a else "n", "t" if trans_b else "n", ta, tb
    )
    opa, opb = _op_enum(op1), _op_enum(op2)
    if tf32:
        dt = _data_type(dtype)
        _call(
            "gemm_ex", handle, opa, opb, mm, nn, kk, al.ctypes.data,
            ptr(b), dt, ldb, ptr(a), dt, lda, be.ctypes.data,
            ptr(c), dt, ldc, _compute_type(dtype, True), _enums().gemm_default,
        )  # fmt: skip
    else:
        fname = "sgemm" if dtype == np.float32 else "dgemm"
        _call(
            fname, handle, opa, opb, mm, nn, kk, al.ctypes.data, ptr(b), ldb,
            ptr(a), lda, be.ctypes.data, ptr(c), ldc,
        )  # fmt: skip
    return c


def _batched_dims(
    where: str, a: Any, b: Any, trans_a: bool, trans_b: bool
) -> tuple[int, int, int, int]:
    """(batch, m, k, n) of a strided-batched product of 3-D ``op(a)`` and
    ``op(b)``; a batch extent of 1 broadcasts over the other operand's."""
    na, ar, ac = (int(s) for s in a.shape)
    nb, br, bc = (int(s) for s in b.shape)
    if na != nb and 1 not in (na, nb):
        raise ValueError(f"{where}: batch sizes {na} and {nb} differ")
    batch = max(na, nb) if 0 not in (na, nb) else 0
    m, k = (ac, ar) if trans_a else (ar, ac)
    kb, n = (bc, br) if trans_b else (br, bc)
    if k != kb:
        raise ValueError(
            f"{where}: op(a) is {m}x{k} and op(b) is {kb}x{n}; inner dimensions differ"
        )
    return batch, m, k, n


def _batched_output(
    where: str,
    c: Any,
    shape: tuple[int, int, int],
    dtype: np.dtype,
    beta: Any,
    device: int,
    allowed: tuple,
) -> Any:
    """The output of a strided-batched product: ``c`` checked against the
    inputs' dtype and ``shape``, or a new array when ``c`` is None (then
    ``beta`` must be 0)."""
    if c is None:
        if beta != 0:
            raise ValueError(f"{where}: beta != 0 needs an output array c")
        return empty(shape, dtype, device)
    _check_inputs(where, device, 3, allowed, c=c)
    if np.dtype(c.dtype) != dtype:
        raise TypeError(f"{where}: c has dtype {c.dtype}, the inputs {dtype}")
    if tuple(int(s) for s in c.shape) != shape:
        raise ValueError(f"{where}: c must have shape {shape}, got {tuple(c.shape)}")
    return c


def _batched_output_layout(
    where: str, c: Any, m: int, n: int, itemsize: int
) -> tuple[int, int]:
    """(ldc, batch stride) of a strided-batched output, in elements: row-major
    inner matrices with unit column stride and a positive batch stride."""
    c_layout = _matrix(ptr(c), (m, n), tuple(int(s) for s in c.strides[1:]), itemsize)
    c_bs = int(c.strides[0])
    if (
        c_layout is None
        or c_layout[0]
        or (int(c.shape[0]) > 1 and (c_bs <= 0 or c_bs % itemsize))
    ):
        raise ValueError(
            f"{where}: c must have row-major inner matrices (unit column stride) and "
            f"a positive batch stride; got strides {tuple(c.strides)}"
        )
    return c_layout[1], c_bs // itemsize


def gemm_strided_batched(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    device: int,
    precision: str | None = None,
) -> Any:
    """``c[i] = alpha * op(a[i]) @ op(b[i]) + beta * c[i]`` for 3-D GPUArrays.

    Parameters
    ----------
    a, b : GPUArray
        (batch, rows, columns) float32/float64; a batch extent of 1 is
        broadcast over the other operand's batch. Inner matrices may be
        row-major with a row stride or transposed views.
    c : GPUArray, optional
        (batch, m, n), row-major inner matrices; allocated when omitted.
    alpha, beta, device, precision
        As for :func:`gemm`.

    Returns
    -------
    GPUArray
        ``c``.
    """
    dtype = _check_inputs("gemm_strided_batched", device, 3, a=a, b=b)
    tf32 = _use_tf32("gemm_strided_batched", precision, dtype)
    get_device(device).activate()
    where = "gemm_strided_batched"
    batch, m, k, n = _batched_dims(where, a, b, trans_a, trans_b)
    c = _batched_output(where, c, (batch, m, n), dtype, beta, device, _REAL)
    if batch == 0 or m == 0 or n == 0:
        return c
    itemsize = dtype.itemsize
    ldc, sc = _batched_output_layout(where, c, m, n, itemsize)
    a, ta, lda, sa = _operand(a, device, itemsize, batched=True)
    b, tb, ldb, sb = _operand(b, device, itemsize, batched=True)
    _check_int32("gemm_strided_batched", m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc,
                 batch=batch)  # fmt: skip
    handle = get_handle(device)
    get_device(device).activate()
    al, be = _scalars(dtype, alpha, beta)
    # cuBLAS's first operand is b, its second a (see _column_major_gemm)
    op1, op2, mm, nn, kk = _column_major_gemm(
        m, n, k, "t" if trans_a else "n", "t" if trans_b else "n", ta, tb
    )
    opa, opb = _op_enum(op1), _op_enum(op2)
    if tf32:
        dt = _data_type(dtype)
        _call(
            "gemm_strided_batched_ex", handle, opa, opb, mm, nn, kk, al.ctypes.data,
            ptr(b), dt, ldb, sb, ptr(a), dt, lda, sa,
            be.ctypes.data, ptr(c), dt, ldc, sc, batch,
            _compute_type(dtype, True), _enums().gemm_default,
        )  # fmt: skip
    else:
        fname = (
            "sgemm_strided_batched" if dtype == np.float32 else "dgemm_strided_batched"
        )
        _call(
            fname, handle, opa, opb, mm, nn, kk, al.ctypes.data, ptr(b), ldb, sb,
            ptr(a), lda, sa, be.ctypes.data, ptr(c), ldc, sc, batch,
        )  # fmt: skip
    return c


_COMPLEX_OPS = ("n", "t", "c")


def gemm_strided_batched_complex(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    op_a: str = "n",
    op_b: str = "n",
    alpha: complex = 1.0,
    beta: complex = 0.0,
    device: int,
    precision: str | None = None,
) -> Any:
    """``c[i] = alpha * op(a[i]) @ op(b[i]) + beta * c[i]`` for 3-D complex GPUArrays.

    Parameters
    ----------
    a, b : GPUArray
        (batch, rows, columns) complex64 or complex128 (same dtype); a batch
        extent of 1 is broadcast over the other operand's batch. Inner
        matrices may be row-major with a row stride; transposed views are
        folded into ``"n"``/``"t"`` and copied for ``"c"``.
    c : GPUArray, optional
        (batch, m, n), row-major inner matrices; allocated when omitted
        (then ``beta`` must be 0).
    op_a, op_b : {"n", "t", "c"}
        The operand as is, transposed, or conjugated and transposed.
    alpha, beta : complex
    device : int
        Device label the arrays live on.
    precision : {None, "fp32", "tf32"}
        complex64 only: ``"tf32"`` (or ``None`` with
        :func:`~cc2ops.cuda.get_allow_tf32` on) computes with
        ``CUBLAS_COMPUTE_32F_FAST_TF32``, else ``CUBLAS_COMPUTE_32F``.

    Returns
    -------
    GPUArray
        ``c``.
    """
    where = "gemm_strided_batched_complex"
    dtype = _check_inputs(where, device, 3, _COMPLEX, a=a, b=b)
    for name, op in (("op_a", op_a), ("op_b", op_b)):
        if op not in _COMPLEX_OPS:
            raise ValueError(f"{where}: {name} must be 'n', 't' or 'c', got {op!r}")
    single = dtype == np.complex64
    tf32 = _use_tf32(where, precision, np.dtype(np.float32 if single else np.float64))
    get_device(device).activate()
    batch, m, k, n = _batched_dims(where, a, b, op_a != "n", op_b != "n")
    c = _batched_output(where, c, (batch, m, n), dtype, beta, device, _COMPLEX)
    if batch == 0 or m == 0 or n == 0:
        return c
    itemsize = dtype.itemsize
    ldc, sc = _batched_output_layout(where, c, m, n, itemsize)
    operands = []
    transposed_views = []
    for x, op in ((a, op_a), (b, op_b)):
        x, transposed, ld, stride = _operand(x, device, itemsize, batched=True)
        if transposed and op == "c":
            # conj(x) without a transpose is no cuBLAS op: copy to row-major
            x = ascontiguous(x, device)
            x, transposed, ld, stride = _operand(x, device, itemsize, batched=True)
        transposed_views.append(transposed)
        operands.append((x, ld, stride))
    (a, lda, sa), (b, ldb, sb) = operands
    _check_int32(where, m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, batch=batch)
    handle = get_handle(device)
    get_device(device).activate()
    al, be = _scalars(dtype, complex(alpha), complex(beta))
    fa, fb, mm, nn, kk = _column_major_gemm(m, n, k, op_a, op_b, *transposed_views)
    dt = _data_type(dtype)
    _call(
        "gemm_strided_batched_ex", handle, _op_enum(fa), _op_enum(fb), mm, nn, kk,
        al.ctypes.data, ptr(b), dt, ldb, sb, ptr(a), dt, lda, sa,
        be.ctypes.data, ptr(c), dt, ldc, sc, batch,
        _compute_type(dtype, tf32), _enums().gemm_default,
    )  # fmt: skip
    return c


def gemv(
    a: Any,
    x: Any,
    y: Any = None,
    *,
    trans: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    device: int,
) -> Any:
    """``y = alpha * op(a) @ x + beta * y`` for a row-major 2-D ``a`` and vectors.

    Parameters
    ----------
    a : GPUArray
        2-D (rows, columns), float32/float64; row stride or transposed view.
    x, y : GPUArray
        1-D, any positive element stride; ``y`` allocated when omitted.
    trans : bool
        Use ``a.T``.

    Returns
    -------
    GPUArray
        ``y``.
    """
    dtype = _check_inputs("gemv", device, 2, a=a)
    _check_inputs("gemv", device, 1, x=x)
    if np.dtype(x.dtype) != dtype:
        raise TypeError(f"gemv: x has dtype {x.dtype}, a has {dtype}")
    r, cdim = (int(s) for s in a.shape)
    rows, cols = (cdim, r) if trans else (r, cdim)
    if int(x.shape[0]) != cols:
        raise ValueError(f"gemv: op(a) is {rows}x{cols} but x has length {x.shape[0]}")
    if y is None:
        if beta != 0:
            raise ValueError("gemv: beta != 0 needs an output vector y")
        y = empty((rows,), dtype, device)
    else:
        _check_inputs("gemv", device, 1, y=y)
        if np.dtype(y.dtype) != dtype or int(y.shape[0]) != rows:
            raise ValueError(f"gemv: y must be a {dtype} vector of length {rows}")
    if rows == 0:
        return y
    itemsize = dtype.itemsize

    def inc(v: Any) -> int:
        s = int(v.strides[0])
        return s // itemsize if s > 0 and s % itemsize == 0 else 0

    if inc(x) == 0 and x.shape[0] > 1:
        x = ascontiguous(x, device)
    if inc(y) == 0 and y.shape[0] > 1:
        raise ValueError(
            f"gemv: y must have a positive element stride, got {y.strides}"
        )
    a, ta, lda, _ = _operand(a, device, itemsize, batched=False)
    handle = get_handle(device)
    get_device(device).activate()
    al, be = _scalars(dtype, alpha, beta)
    flag, mm, nn = _column_major_gemv(r, cdim, trans, ta)
    fname = "sgemv" if dtype == np.float32 else "dgemv"
    _call(
        fname, handle, _op_enum(flag), mm, nn, al.ctypes.data, ptr(a), lda, ptr(x),
        max(1, inc(x)), be.ctypes.data, ptr(y), max(1, inc(y)),
    )  # fmt: skip
    return y
