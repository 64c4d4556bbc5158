"""cuBLAS through a small ctypes binding: row-major GEMM, batched GEMM and GEMV.

The library is found as ``libcublas.so.13``, ``.so.12`` or ``.so`` in, in
order: ``$CC2OPS_CUBLAS``, the ``nvidia-cublas`` wheel (``nvidia/cublas/lib``
or ``nvidia/cu*/lib`` on ``sys.path``), ``$CUDA_HOME``/``$CUDA_PATH``
``/lib64``, ``/usr/local/cuda/lib64``, then the dynamic loader's search path.
Nothing is loaded until the first product.

One handle per physical device, created lazily with the device's primary
context current (the one the CUDA runtime, hence cuBLAS, uses) and bound to
the device's stream, so products are ordered with every other cc2ops kernel.
Status codes become :class:`CublasError` naming the function and the status.

Row-major arrays
----------------
cuBLAS is column-major. A row-major matrix with row stride ``ld`` (elements)
is, read column-major, its transpose with leading dimension ``ld``; so
``C = op(A) op(B)`` is computed as ``C^T = op(B)^T op(A)^T`` by passing B
before A with the same transpose flags. Arrays may have a row stride larger
than the row (views of wider arrays); transposed views (unit stride along
the rows) are folded into the transpose flags instead of being copied; any
other layout is made contiguous first.

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

import ctypes
import glob
import os
import sys
import threading
from typing import Any

import numpy as np

from cc2ops.cuda.runtime.array import ascontiguous, device_of, empty, is_gpuarray, ptr
from cc2ops.cuda.runtime.device import (
    get_device,
    physical_index,
    register_shutdown_hook,
)
from cc2ops.cuda.runtime.precision import get_allow_tf32

__all__ = [
    "CublasError",
    "gemm",
    "gemm_strided_batched",
    "gemm_strided_batched_complex",
    "gemv",
    "library_path",
    "get_handle",
]

LIB_ENV = "CC2OPS_CUBLAS"
_LIB_NAMES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so")

_OP_N, _OP_T, _OP_C = 0, 1, 2
_CUDA_R_32F = 0
_CUDA_C_32F = 4
_CUDA_C_64F = 5
_COMPUTE_32F = 68
_COMPUTE_64F = 70
_COMPUTE_32F_FAST_TF32 = 77
_GEMM_DEFAULT = -1
_DEFAULT_MATH = 0

_STATUS = {
    0: "CUBLAS_STATUS_SUCCESS",
    1: "CUBLAS_STATUS_NOT_INITIALIZED",
    3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE",
    8: "CUBLAS_STATUS_ARCH_MISMATCH",
    11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED",
    14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED",
    16: "CUBLAS_STATUS_LICENSE_ERROR",
}


class CublasError(RuntimeError):
    """A cuBLAS call failed, or libcublas could not be loaded."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def status_name(status: int) -> str:
    """The ``CUBLAS_STATUS_*`` name of a status code."""
    return _STATUS.get(int(status), f"CUBLAS_STATUS_UNKNOWN({int(status)})")


# --------------------------------------------------------------------------
# the library
# --------------------------------------------------------------------------

_lock = threading.RLock()
_lib: ctypes.CDLL | None = None
_lib_path: str | None = None
_handles: dict[int, ctypes.c_void_p] = {}
_workspaces: dict[int, Any] = {}
#: cuBLAS workspace per handle (what cuBLAS asks for on Hopper): set
#: explicitly so that captured CUDA graphs reuse one buffer
WORKSPACE_BYTES = 32 << 20
_hook_registered = False

_p = ctypes.c_void_p
_i = ctypes.c_int
_ll = ctypes.c_longlong

_PROTOTYPES: dict[str, list[Any]] = {
    "cublasCreate_v2": [ctypes.POINTER(ctypes.c_void_p)],
    "cublasDestroy_v2": [_p],
    "cublasSetStream_v2": [_p, _p],
    "cublasSetMathMode": [_p, _i],
    "cublasSetWorkspace_v2": [_p, _p, ctypes.c_size_t],
    "cublasSgemm_v2": [_p, _i, _i, _i, _i, _i, _p, _p, _i, _p, _i, _p, _p, _i],
    "cublasDgemm_v2": [_p, _i, _i, _i, _i, _i, _p, _p, _i, _p, _i, _p, _p, _i],
    "cublasGemmEx": [
        _p, _i, _i, _i, _i, _i, _p, _p, _i, _i, _p, _i, _i, _p, _p, _i, _i, _i, _i,
    ],
    "cublasSgemmStridedBatched": [
        _p, _i, _i, _i, _i, _i, _p, _p, _i, _ll, _p, _i, _ll, _p, _p, _i, _ll, _i,
    ],
    "cublasDgemmStridedBatched": [
        _p, _i, _i, _i, _i, _i, _p, _p, _i, _ll, _p, _i, _ll, _p, _p, _i, _ll, _i,
    ],
    "cublasGemmStridedBatchedEx": [
        _p, _i, _i, _i, _i, _i, _p, _p, _i, _i, _ll, _p, _i, _i, _ll, _p, _p, _i, _i,
        _ll, _i, _i, _i,
    ],
    "cublasSgemv_v2": [_p, _i, _i, _i, _p, _p, _i, _p, _i, _p, _p, _i],
    "cublasDgemv_v2": [_p, _i, _i, _i, _p, _p, _i, _p, _i, _p, _p, _i],
}  # fmt: skip


def _candidates() -> list[str]:
    paths: list[str] = []
    env = os.environ.get(LIB_ENV)
    if env:
        paths.append(env)
    wheel_dirs: list[str] = []
    for entry in sys.path:
        if entry and os.path.isdir(os.path.join(entry, "nvidia")):
            wheel_dirs.append(os.path.join(entry, "nvidia", "cublas", "lib"))
            wheel_dirs.extend(
                sorted(glob.glob(os.path.join(entry, "nvidia", "cu*", "lib")))
            )
    roots = [
        os.environ.get("CUDA_HOME"),
        os.environ.get("CUDA_PATH"),
        "/usr/local/cuda",
    ]
    lib_dirs = wheel_dirs + [
        os.path.join(r, sub) for r in roots if r for sub in ("lib64", "lib")
    ]
    for name in _LIB_NAMES:
        for d in lib_dirs:
            path = os.path.join(d, name)
            if os.path.isfile(path):
                paths.append(path)
    paths.extend(_LIB_NAMES)  # the loader's own search path
    return paths


def _load() -> ctypes.CDLL:
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            for fname, argtypes in _PROTOTYPES.items():
                fn = getattr(lib, fname)
                fn.argtypes = argtypes
                fn.restype = ctypes.c_int
            _lib, _lib_path = lib, path
            return lib
        raise CublasError(
            "cc2ops.cuda.libs.cublas: libcublas could not be loaded (tried "
            f"{', '.join(_LIB_NAMES)} in ${LIB_ENV}, the nvidia-cublas wheel, "
            "$CUDA_HOME/lib64 and the loader path); install the CUDA toolkit or "
            "`pip install nvidia-cublas`. Errors: " + "; ".join(errors[-3:])
        )


def library_path() -> str:
    """The path libcublas was loaded from (loads it)."""
    _load()
    assert _lib_path is not None
    return _lib_path


def _call(fname: str, *args: Any) -> None:
    status = getattr(_load(), fname)(*args)
    if status != 0:
        raise CublasError(
            f"cc2ops.cuda.libs.cublas: {fname} failed: {status_name(status)}", status
        )


def _destroy_handles() -> None:
    for index, handle in list(_handles.items()):
        try:
            get_device(_label_of_physical(index)).activate()
            _call("cublasDestroy_v2", handle)
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


def get_handle(device: int) -> ctypes.c_void_p:
    """The cuBLAS handle of ``device``'s physical device (bound to its stream)."""
    global _hook_registered
    dev = get_device(device)
    handle = _handles.get(dev.index)
    if handle is not None:
        return handle
    with _lock:
        handle = _handles.get(dev.index)
        if handle is not None:
            return handle
        dev.activate()
        handle = ctypes.c_void_p()
        _call("cublasCreate_v2", ctypes.byref(handle))
        _call("cublasSetStream_v2", handle, ctypes.c_void_p(int(dev.stream.handle)))
        _call("cublasSetMathMode", handle, _DEFAULT_MATH)
        # after SetStream, which resets the workspace to cuBLAS's own pool
        workspace = dev.alloc(WORKSPACE_BYTES)
        _call("cublasSetWorkspace_v2", handle, ctypes.c_void_p(int(workspace)),
              WORKSPACE_BYTES)  # fmt: skip
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


def _scalars(dtype: np.dtype, alpha: float, beta: float):
    ctype = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    return ctype(alpha), ctype(beta)


def _op(trans: bool) -> int:
    return _OP_T if trans else _OP_N


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
    opa, opb = _op(trans_a != ta), _op(trans_b != tb)
    if tf32:
        _call(
            "cublasGemmEx", handle, opb, opa, n, m, k, ctypes.byref(al),
            ptr(b), _CUDA_R_32F, ldb, ptr(a), _CUDA_R_32F, lda, ctypes.byref(be),
            ptr(c), _CUDA_R_32F, ldc, _COMPUTE_32F_FAST_TF32, _GEMM_DEFAULT,
        )  # fmt: skip
    else:
        fname = "cublasSgemm_v2" if dtype == np.float32 else "cublasDgemm_v2"
        _call(
            fname, handle, opb, opa, n, m, k, ctypes.byref(al), ptr(b), ldb,
            ptr(a), lda, ctypes.byref(be), ptr(c), ldc,
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
    opa, opb = _op(trans_a != ta), _op(trans_b != tb)
    if tf32:
        _call(
            "cublasGemmStridedBatchedEx", handle, opb, opa, n, m, k, ctypes.byref(al),
            ptr(b), _CUDA_R_32F, ldb, sb, ptr(a), _CUDA_R_32F, lda, sa,
            ctypes.byref(be), ptr(c), _CUDA_R_32F, ldc, sc, batch,
            _COMPUTE_32F_FAST_TF32, _GEMM_DEFAULT,
        )  # fmt: skip
    else:
        fname = (
            "cublasSgemmStridedBatched"
            if dtype == np.float32
            else "cublasDgemmStridedBatched"
        )
        _call(
            fname, handle, opb, opa, n, m, k, ctypes.byref(al), ptr(b), ldb, sb,
            ptr(a), lda, sa, ctypes.byref(be), ptr(c), ldc, sc, batch,
        )  # fmt: skip
    return c


_COMPLEX_OPS = {"n": _OP_N, "t": _OP_T, "c": _OP_C}


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
    ops = []
    operands = []
    for x, op in ((a, op_a), (b, op_b)):
        x, transposed, ld, stride = _operand(x, device, itemsize, batched=True)
        if transposed and op == "c":
            # conj(x) without a transpose is no cuBLAS op: copy to row-major
            x = ascontiguous(x, device)
            x, transposed, ld, stride = _operand(x, device, itemsize, batched=True)
        if transposed:
            op = "t" if op == "n" else "n"
        ops.append(_COMPLEX_OPS[op])
        operands.append((x, ld, stride))
    (a, lda, sa), (b, ldb, sb) = operands
    _check_int32(where, m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, batch=batch)
    handle = get_handle(device)
    get_device(device).activate()
    scalar = ctypes.c_float * 2 if single else ctypes.c_double * 2
    al = scalar(complex(alpha).real, complex(alpha).imag)
    be = scalar(complex(beta).real, complex(beta).imag)
    dt = _CUDA_C_32F if single else _CUDA_C_64F
    if single:
        compute = _COMPUTE_32F_FAST_TF32 if tf32 else _COMPUTE_32F
    else:
        compute = _COMPUTE_64F
    # row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
    # same flags, B first (op "c" maps to "c": (A^H)^T = conj(A) = (A^T)^H)
    _call(
        "cublasGemmStridedBatchedEx", handle, ops[1], ops[0], n, m, k,
        ctypes.byref(al), ptr(b), dt, ldb, sb, ptr(a), dt, lda, sa,
        ctypes.byref(be), ptr(c), dt, ldc, sc, batch,
        compute, _GEMM_DEFAULT,
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
    # the row-major storage M of a is (r, c) when not transposed, (c, r) when it is
    mr, mc = (cdim, r) if ta else (r, cdim)
    handle = get_handle(device)
    get_device(device).activate()
    al, be = _scalars(dtype, alpha, beta)
    # column-major, M reads as M^T: op(a) x = M x needs "T", M^T x needs "N"
    flag = _OP_N if (trans != ta) else _OP_T
    fname = "cublasSgemv_v2" if dtype == np.float32 else "cublasDgemv_v2"
    _call(
        fname, handle, flag, mc, mr, ctypes.byref(al), ptr(a), lda, ptr(x),
        max(1, inc(x)), ctypes.byref(be), ptr(y), max(1, inc(y)),
    )  # fmt: skip
    return y
