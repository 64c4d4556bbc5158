"""cc2ops.cuda.libs.cublas on the CPU, against an emulated cuBLAS.

The adapter's own logic runs unchanged: row-major folding (operands swapped,
transposed views folded into the flags, row strides as leading dimensions),
the choice of call (sgemm/dgemm, gemm_ex for TF32, the strided-batched calls,
gemv), enum members, host scalars, handle set-up (stream, math mode, its own
workspace) and error mapping. Only the library is replaced: a stand-in for
``nvmath.bindings.cublas`` whose functions have nvmath's argument lists and
compute the column-major BLAS products in numpy on the memory the pointers
address (numpy arrays stand in for GPUArrays, so a pointer is a host address).
A wrong argument order, flag, leading dimension or stride gives wrong numbers
or a CUBLAS_STATUS_INVALID_VALUE here.

Enum values are checked against cuBLAS's and CUDA's headers (written out
below), and, where nvmath-python is installed, nvmath's members against them.
"""

from __future__ import annotations

import ctypes
import enum
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from cc2ops.cuda.libs import cublas as blas
from cc2ops.cuda.runtime import libraries

# cublas_api.h / library_types.h
HEADER = {
    "CUBLAS_OP_N": 0,
    "CUBLAS_OP_T": 1,
    "CUBLAS_OP_C": 2,
    "CUBLAS_COMPUTE_32F": 68,
    "CUBLAS_COMPUTE_32F_FAST_TF32": 77,
    "CUBLAS_COMPUTE_64F": 70,
    "CUBLAS_GEMM_DEFAULT": -1,
    "CUBLAS_DEFAULT_MATH": 0,
    "CUDA_R_32F": 0,
    "CUDA_R_64F": 1,
    "CUDA_C_32F": 4,
    "CUDA_C_64F": 5,
    "CUBLAS_STATUS_INVALID_VALUE": 7,
    "CUBLAS_STATUS_EXECUTION_FAILED": 13,
}


# --------------------------------------------------------------------------
# the emulated library
# --------------------------------------------------------------------------


class Operation(enum.IntEnum):
    N = 0
    T = 1
    C = 2


class ComputeType(enum.IntEnum):
    COMPUTE_32F = 68
    COMPUTE_64F = 70
    COMPUTE_32F_FAST_TF32 = 77


class GemmAlgo(enum.IntEnum):
    DEFAULT = -1


class Math(enum.IntEnum):
    DEFAULT_MATH = 0
    TF32_TENSOR_OP_MATH = 3


class Status(enum.IntEnum):
    SUCCESS = 0
    INVALID_VALUE = 7
    EXECUTION_FAILED = 13


class CudaDataType(enum.IntEnum):
    CUDA_R_32F = 0
    CUDA_R_64F = 1
    CUDA_C_32F = 4
    CUDA_C_64F = 5


class cuBLASError(Exception):
    def __init__(self, status):
        self.status = status
        super().__init__(f"{Status(status).name} ({status})")


_DTYPE = {
    CudaDataType.CUDA_R_32F: np.float32,
    CudaDataType.CUDA_R_64F: np.float64,
    CudaDataType.CUDA_C_32F: np.complex64,
    CudaDataType.CUDA_C_64F: np.complex128,
}


#: (start, end) of every buffer whose address cublas handed out (through
#: ``ptr``): the emulation refuses to touch memory outside them, so a wrong
#: dimension fails the test instead of corrupting the heap
_BUFFERS: list[tuple[int, int]] = []


def _scalar(address, dtype):
    """The host scalar at ``address`` (alpha, beta: cuBLAS's host pointer mode)."""
    raw = (ctypes.c_char * np.dtype(dtype).itemsize).from_address(address)
    return np.frombuffer(raw, dtype=dtype)[0]


def _memory(address, dtype, count):
    """``count`` elements of ``dtype`` at host ``address`` (writable)."""
    nbytes = count * np.dtype(dtype).itemsize
    assert any(lo <= address and address + nbytes <= hi for lo, hi in _BUFFERS), (
        f"cuBLAS would access [{address:#x}, +{nbytes}) outside every array"
    )
    raw = (ctypes.c_char * max(1, nbytes)).from_address(address)
    return np.frombuffer(raw, dtype=dtype, count=count)


def _colmajor(address, dtype, rows, cols, ld):
    """The column-major ``rows x cols`` matrix at ``address``, leading dim ``ld``."""
    if ld < max(1, rows):
        raise cuBLASError(Status.INVALID_VALUE)
    itemsize = np.dtype(dtype).itemsize
    flat = _memory(address, dtype, (cols - 1) * ld + rows)
    return np.lib.stride_tricks.as_strided(
        flat, (rows, cols), (itemsize, ld * itemsize)
    )


def _op(trans, address, dtype, rows, cols, ld):
    """``op(X)`` of shape (rows, cols): X stored column-major, ``ld``."""
    if trans == Operation.N:
        return _colmajor(address, dtype, rows, cols, ld)
    x = _colmajor(address, dtype, cols, rows, ld).T
    return x.conj() if trans == Operation.C else x


class FakeCublas:
    """nvmath.bindings.cublas's argument lists, numpy's arithmetic."""

    Operation = Operation
    ComputeType = ComputeType
    GemmAlgo = GemmAlgo
    Math = Math
    Status = Status
    cuBLASError = cuBLASError

    def __init__(self):
        self.calls = []
        self.handles = {}
        self.fail_next = None

    def _log(self, name, **kw):
        self.calls.append((name, kw))
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            raise cuBLASError(status)

    # ---- handles ----------------------------------------------------------
    def create(self):
        handle = 0x1000 + len(self.handles)
        self.handles[handle] = {}
        self._log("create")
        return handle

    def destroy(self, handle):
        self._log("destroy", handle=handle)
        del self.handles[handle]

    def set_stream(self, handle, stream_id):
        self._log("set_stream", handle=handle)
        self.handles[handle] = {"stream": stream_id}  # resets the workspace

    def set_math_mode(self, handle, mode):
        self._log("set_math_mode", handle=handle)
        self.handles[handle]["math"] = Math(mode)

    def set_workspace(self, handle, workspace, workspace_size_in_bytes):
        self._log("set_workspace", handle=handle)
        self.handles[handle]["workspace"] = (workspace, workspace_size_in_bytes)

    # ---- products ---------------------------------------------------------
    def _gemm(self, dtype, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta,
              c, ldc, batch=1, sa=0, sb=0, sc=0):  # fmt: skip
        itemsize = np.dtype(dtype).itemsize
        al, be = _scalar(alpha, dtype), _scalar(beta, dtype)
        for i in range(batch):
            A = _op(Operation(transa), a + i * sa * itemsize, dtype, m, k, lda)
            B = _op(Operation(transb), b + i * sb * itemsize, dtype, k, n, ldb)
            C = _colmajor(c + i * sc * itemsize, dtype, m, n, ldc)
            prod = al * (A.astype(np.complex128) @ B)
            # beta == 0: C is not read (it may hold garbage), as in cuBLAS
            out = prod if be == 0 else prod + be * C
            C[...] = out.real if not np.iscomplexobj(C) else out

    def sgemm(self, handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta,
              c, ldc):  # fmt: skip
        self._log("sgemm", transa=transa, transb=transb)
        self._gemm(np.float32, transa, transb, m, n, k, alpha, a, lda, b, ldb,
                   beta, c, ldc)  # fmt: skip

    def dgemm(self, handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta,
              c, ldc):  # fmt: skip
        self._log("dgemm", transa=transa, transb=transb)
        self._gemm(np.float64, transa, transb, m, n, k, alpha, a, lda, b, ldb,
                   beta, c, ldc)  # fmt: skip

    def gemm_ex(self, handle, transa, transb, m, n, k, alpha, a, atype, lda, b,
                btype, ldb, beta, c, ctype, ldc, compute_type, algo):  # fmt: skip
        self._log("gemm_ex", compute_type=ComputeType(compute_type), algo=algo)
        assert atype == btype == ctype, (atype, btype, ctype)
        self._gemm(_DTYPE[CudaDataType(atype)], transa, transb, m, n, k, alpha, a,
                   lda, b, ldb, beta, c, ldc)  # fmt: skip

    def sgemm_strided_batched(self, handle, transa, transb, m, n, k, alpha, a, lda,
                              stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                              batch_count):  # fmt: skip
        self._log("sgemm_strided_batched", batch=batch_count)
        self._gemm(np.float32, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta,
                   c, ldc, batch_count, stride_a, stride_b, stride_c)  # fmt: skip

    def dgemm_strided_batched(self, handle, transa, transb, m, n, k, alpha, a, lda,
                              stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                              batch_count):  # fmt: skip
        self._log("dgemm_strided_batched", batch=batch_count)
        self._gemm(np.float64, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta,
                   c, ldc, batch_count, stride_a, stride_b, stride_c)  # fmt: skip

    def gemm_strided_batched_ex(self, handle, transa, transb, m, n, k, alpha, a,
                                atype, lda, stride_a, b, btype, ldb, stride_b, beta,
                                c, ctype, ldc, stride_c, batch_count, compute_type,
                                algo):  # fmt: skip
        self._log("gemm_strided_batched_ex", compute_type=ComputeType(compute_type),
                  algo=algo, datatype=CudaDataType(atype))  # fmt: skip
        assert atype == btype == ctype, (atype, btype, ctype)
        self._gemm(_DTYPE[CudaDataType(atype)], transa, transb, m, n, k, alpha, a,
                   lda, b, ldb, beta, c, ldc, batch_count, stride_a, stride_b,
                   stride_c)  # fmt: skip

    def _gemv(self, dtype, trans, m, n, alpha, a, lda, x, incx, beta, y, incy):
        itemsize = np.dtype(dtype).itemsize
        A = _colmajor(a, dtype, m, n, lda)
        A = A if trans == Operation.N else A.T
        rows, cols = A.shape
        xs = np.lib.stride_tricks.as_strided(
            _memory(x, dtype, (cols - 1) * incx + 1), (cols,), (incx * itemsize,)
        )
        ys = np.lib.stride_tricks.as_strided(
            _memory(y, dtype, (rows - 1) * incy + 1), (rows,), (incy * itemsize,)
        )
        al, be = _scalar(alpha, dtype), _scalar(beta, dtype)
        prod = al * (A.astype(np.float64) @ xs)
        ys[...] = prod if be == 0 else prod + be * ys

    def sgemv(self, handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy):
        self._log("sgemv", trans=trans)
        self._gemv(np.float32, trans, m, n, alpha, a, lda, x, incx, beta, y, incy)

    def dgemv(self, handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy):
        self._log("dgemv", trans=trans)
        self._gemv(np.float64, trans, m, n, alpha, a, lda, x, incx, beta, y, incy)


class FakeDevice:
    index = 0
    label = 0

    def __init__(self):
        self.stream = SimpleNamespace(handle=0x5E)
        self.allocations = []

    def activate(self):
        pass

    def alloc(self, nbytes):
        self.allocations.append(nbytes)
        return 0xA000


@pytest.fixture
def emulated(monkeypatch):
    """cublas with numpy arrays as GPUArrays and the emulated library."""
    lib = FakeCublas()
    dev = FakeDevice()
    monkeypatch.setattr(
        libraries,
        "_modules",
        {
            "nvmath.bindings.cublas": lib,
            "nvmath": SimpleNamespace(CudaDataType=CudaDataType),
        },
    )
    monkeypatch.setattr(blas, "_enum_cache", None)
    monkeypatch.setattr(blas, "_handles", {})
    monkeypatch.setattr(blas, "_workspaces", {})
    monkeypatch.setattr(blas, "_hook_registered", True)
    monkeypatch.setattr(blas, "load_library", lambda *a, **k: "/x/libcublas.so.13")
    monkeypatch.setattr(blas, "is_gpuarray", lambda x: isinstance(x, np.ndarray))
    monkeypatch.setattr(blas, "device_of", lambda x: None)
    monkeypatch.setattr(blas, "physical_index", lambda d: 0)
    monkeypatch.setattr(blas, "get_device", lambda d: dev)
    buffers: list[tuple[int, int]] = []
    monkeypatch.setattr(sys.modules[__name__], "_BUFFERS", buffers)

    def ptr(x):
        owner = x
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        start = owner.__array_interface__["data"][0]
        buffers.append((start, start + owner.nbytes))
        return x.__array_interface__["data"][0]

    monkeypatch.setattr(blas, "ptr", ptr)
    monkeypatch.setattr(blas, "empty", lambda shape, dtype, d: np.empty(shape, dtype))
    copies = []

    def ascontiguous(x, device=None):
        out = np.ascontiguousarray(x)
        if out is not x:
            copies.append(tuple(x.strides))
        return out

    monkeypatch.setattr(blas, "ascontiguous", ascontiguous)
    return SimpleNamespace(lib=lib, dev=dev, copies=copies)


def rng(seed):
    return np.random.default_rng(seed)


def rel(got, want):
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


def _layouts(x, r):
    """``x`` (2-D) as a contiguous array, a view with a wider row stride and a
    transposed view of a row-major array: every layout cuBLAS takes in place."""
    wide = np.zeros((x.shape[0], x.shape[1] + 3), x.dtype)
    wide[:, : x.shape[1]] = x
    return {
        "contiguous": x.copy(),
        "row-stride": wide[:, : x.shape[1]],
        "transposed-view": np.ascontiguousarray(x.T).T,
    }


# --------------------------------------------------------------------------
# the pure folding rules
# --------------------------------------------------------------------------


def test_fold_swaps_n_and_t_for_transposed_storage():
    assert blas._fold("n", False) == "n" and blas._fold("t", False) == "t"
    assert blas._fold("c", False) == "c"
    assert blas._fold("n", True) == "t" and blas._fold("t", True) == "n"
    with pytest.raises(ValueError, match="conjugate of a transposed view"):
        blas._fold("c", True)


def test_column_major_gemm_passes_b_first():
    # row-major C (m x n) = a @ b.T: cuBLAS computes C^T (n x m) = b a^T
    assert blas._column_major_gemm(5, 7, 3, "n", "t", False, False) == (
        "t", "n", 7, 5, 3,
    )  # fmt: skip
    # transposed views flip their own flag only
    assert blas._column_major_gemm(5, 7, 3, "n", "n", True, False) == (
        "n", "t", 7, 5, 3,
    )  # fmt: skip
    assert blas._column_major_gemm(5, 7, 3, "c", "n", False, True) == (
        "t", "c", 7, 5, 3,
    )  # fmt: skip


def test_column_major_gemv():
    # a (4 x 6) row-major reads column-major as a^T (6 x 4): a @ x needs "t"
    assert blas._column_major_gemv(4, 6, False, False) == ("t", 6, 4)
    assert blas._column_major_gemv(4, 6, True, False) == ("n", 6, 4)
    # a transposed view's storage is a^T (6 x 4), read as a (4 x 6)
    assert blas._column_major_gemv(4, 6, False, True) == ("n", 4, 6)
    assert blas._column_major_gemv(4, 6, True, True) == ("t", 4, 6)


def test_matrix_layouts_of_numpy_views():
    x = np.zeros((4, 6), np.float32)
    assert blas._matrix(0, (4, 6), x.strides, 4) == (False, 6)
    assert blas._matrix(0, (4, 3), x[:, :3].strides, 4) == (False, 6)
    assert blas._matrix(0, (6, 4), x.T.strides, 4) == (True, 6)
    assert blas._matrix(0, (4, 3), x[:, ::2].strides, 4) is None  # needs a copy


# --------------------------------------------------------------------------
# the products, end to end on the emulated library
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
def test_gemm_every_transpose_and_layout(emulated, dtype, ta, tb):
    r = rng(0)
    m, k, n = 5, 7, 3
    A = r.standard_normal((m, k)).astype(dtype)
    B = r.standard_normal((k, n)).astype(dtype)
    want = A.astype(np.float64) @ B
    a_src = A.T if ta else A
    b_src = B.T if tb else B
    for la, a in _layouts(a_src, r).items():
        for lb, b in _layouts(b_src, r).items():
            c = blas.gemm(a, b, trans_a=ta, trans_b=tb, device=0, precision="fp32")
            assert c.shape == (m, n) and c.dtype == dtype
            assert rel(c, want) < 1e-6, (la, lb)
    assert not emulated.copies  # every layout was used in place
    name = "sgemm" if dtype == "float32" else "dgemm"
    assert {call[0] for call in emulated.lib.calls} == {
        "create", "set_stream", "set_math_mode", "set_workspace", name,
    }  # fmt: skip


def test_gemm_alpha_beta_and_a_transposed_output(emulated):
    r = rng(1)
    A = r.standard_normal((4, 6)).astype(np.float32)
    B = r.standard_normal((6, 5)).astype(np.float32)
    C0 = r.standard_normal((4, 5)).astype(np.float32)
    c = C0.copy()
    blas.gemm(A, B, c, alpha=0.5, beta=2.0, device=0)
    assert rel(c, 0.5 * (A @ B) + 2.0 * C0) < 1e-6
    # c a transposed view: computed as c^T = b^T a^T
    ct = np.ascontiguousarray(C0.T)
    blas.gemm(A, B, ct.T, alpha=1.0, beta=1.0, device=0)
    assert rel(ct.T, A @ B + C0) < 1e-6


def test_tf32_goes_through_gemm_ex_with_the_fast_compute_type(emulated):
    r = rng(2)
    A = r.standard_normal((3, 8)).astype(np.float32)
    B = r.standard_normal((8, 4)).astype(np.float32)
    c = blas.gemm(A, B, device=0, precision="tf32")
    assert rel(c, A @ B) < 1e-6
    (_, kw) = emulated.lib.calls[-1]
    assert emulated.lib.calls[-1][0] == "gemm_ex"
    assert kw == {"compute_type": ComputeType.COMPUTE_32F_FAST_TF32, "algo": -1}
    blas.gemm(A.astype(np.float64), B.astype(np.float64), device=0, precision="tf32")
    assert emulated.lib.calls[-1][0] == "dgemm"  # float64 never uses TF32


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
def test_gemm_strided_batched(emulated, dtype, ta, tb):
    r = rng(3)
    A = r.standard_normal((4, 5, 6)).astype(dtype)
    B = r.standard_normal((1, 6, 3)).astype(dtype)  # broadcast over the batch
    want = A.astype(np.float64) @ B
    a = np.ascontiguousarray(A.transpose(0, 2, 1)) if ta else A
    b = np.ascontiguousarray(B.transpose(0, 2, 1)) if tb else B
    c = blas.gemm_strided_batched(a, b, trans_a=ta, trans_b=tb, device=0,
                                  precision="fp32")  # fmt: skip
    assert c.shape == (4, 5, 3)
    assert rel(c, want) < 1e-6
    # transposed inner views, folded into the flags
    av = np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1)
    precision = "tf32" if dtype == "float32" else None
    c = blas.gemm_strided_batched(av, b, trans_a=ta, trans_b=tb, device=0,
                                  precision=precision)  # fmt: skip
    assert rel(c, want) < 1e-6
    assert not emulated.copies


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("op_a", ["n", "t", "c"])
@pytest.mark.parametrize("op_b", ["n", "t", "c"])
def test_gemm_strided_batched_complex(emulated, dtype, op_a, op_b):
    r = rng(4)

    def cplx(shape):
        return (r.standard_normal(shape) + 1j * r.standard_normal(shape)).astype(dtype)

    def op(x, o):
        x = x if o == "n" else x.transpose(0, 2, 1)
        return x.conj() if o == "c" else x

    m, k, n = 3, 4, 2
    A = cplx((2, m, k) if op_a == "n" else (2, k, m))
    B = cplx((2, k, n) if op_b == "n" else (2, n, k))
    alpha, beta = 1.5 - 0.5j, 0.25 + 1j
    C0 = cplx((2, m, n))
    c = C0.copy()
    blas.gemm_strided_batched_complex(A, B, c, op_a=op_a, op_b=op_b, alpha=alpha,
                                      beta=beta, device=0)  # fmt: skip
    want = alpha * (op(A.astype(np.complex128), op_a) @ op(B, op_b)) + beta * C0
    assert rel(c, want) < 1e-5
    name, kw = emulated.lib.calls[-1]
    assert name == "gemm_strided_batched_ex"
    single = dtype == "complex64"
    assert kw["datatype"] == (
        CudaDataType.CUDA_C_32F if single else CudaDataType.CUDA_C_64F
    )
    assert kw["compute_type"] == (
        ComputeType.COMPUTE_32F if single else ComputeType.COMPUTE_64F
    )
    # a transposed view of A: folded for "n"/"t", copied for "c"
    Av = np.ascontiguousarray(A.transpose(0, 2, 1)).transpose(0, 2, 1)
    out = blas.gemm_strided_batched_complex(Av, B, op_a=op_a, op_b=op_b, device=0)
    assert rel(out, op(A.astype(np.complex128), op_a) @ op(B, op_b)) < 1e-5
    assert len(emulated.copies) == (1 if op_a == "c" else 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("trans", [False, True])
def test_gemv_every_layout(emulated, dtype, trans):
    r = rng(5)
    A = r.standard_normal((4, 6)).astype(dtype)
    x_len, y_len = (4, 6) if trans else (6, 4)
    X = r.standard_normal(x_len).astype(dtype)
    Y0 = r.standard_normal(y_len).astype(dtype)
    want = 2.0 * ((A.T if trans else A).astype(np.float64) @ X) + 0.5 * Y0
    for layout, a in _layouts(A, r).items():
        xs = np.zeros(2 * x_len, dtype)
        xs[::2] = X  # a strided vector, used in place
        y = Y0.copy()
        blas.gemv(a, xs[::2], y, trans=trans, alpha=2.0, beta=0.5, device=0)
        assert rel(y, want) < 1e-6, layout
    assert not emulated.copies


# --------------------------------------------------------------------------
# handles, errors, enums
# --------------------------------------------------------------------------


def test_one_handle_per_device_with_stream_math_mode_and_workspace(emulated):
    handle = blas.get_handle(0)
    assert blas.get_handle(0) == handle
    state = emulated.lib.handles[handle]
    assert state["stream"] == 0x5E
    assert state["math"] == Math.DEFAULT_MATH
    # set after the stream (set_stream resets it), of cc2ops's size
    assert state["workspace"] == (0xA000, blas.WORKSPACE_BYTES)
    assert emulated.dev.allocations == [blas.WORKSPACE_BYTES]
    names = [c[0] for c in emulated.lib.calls]
    assert names == ["create", "set_stream", "set_math_mode", "set_workspace"]


def test_failing_status_is_a_cublas_error_naming_call_and_status(emulated):
    A = np.ones((2, 2), np.float32)
    blas.get_handle(0)
    emulated.lib.fail_next = 7
    with pytest.raises(
        blas.CublasError,
        match=r"cublas: sgemm failed: CUBLAS_STATUS_INVALID_VALUE",
    ) as info:
        blas.gemm(A, A, device=0)
    assert info.value.status == 7
    assert isinstance(info.value.__cause__, cuBLASError)
    assert blas.status_name(13) == "CUBLAS_STATUS_EXECUTION_FAILED"
    assert blas.status_name(99) == "CUBLAS_STATUS_UNKNOWN(99)"


def test_missing_nvmath_is_a_cublas_error_naming_the_package(monkeypatch):
    monkeypatch.setattr(libraries, "_modules", {})
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cublas", None)
    with pytest.raises(blas.CublasError, match=r"pip install nvmath-python==1\.0\.1"):
        blas._nv()
    assert blas.status_name(7) == "CUBLAS_STATUS_UNKNOWN(7)"


def test_emulated_enums_are_the_headers():
    assert Operation.N == HEADER["CUBLAS_OP_N"] and Operation.T == 1
    assert Operation.C == HEADER["CUBLAS_OP_C"]
    assert ComputeType.COMPUTE_32F_FAST_TF32 == HEADER["CUBLAS_COMPUTE_32F_FAST_TF32"]
    assert CudaDataType.CUDA_C_64F == HEADER["CUDA_C_64F"]


def test_nvmath_enums_are_the_headers(monkeypatch):
    """The members cublas passes, from the real nvmath-python (no GPU needed)."""
    cublas = pytest.importorskip("nvmath.bindings.cublas")
    monkeypatch.setattr(libraries, "_modules", {})
    monkeypatch.setattr(blas, "_enum_cache", None)
    assert blas._op_enum("n") == HEADER["CUBLAS_OP_N"]
    assert blas._op_enum("t") == HEADER["CUBLAS_OP_T"]
    assert blas._op_enum("c") == HEADER["CUBLAS_OP_C"]
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    c64, c128 = np.dtype(np.complex64), np.dtype(np.complex128)
    assert blas._compute_type(f32, False) == HEADER["CUBLAS_COMPUTE_32F"]
    assert blas._compute_type(f32, True) == HEADER["CUBLAS_COMPUTE_32F_FAST_TF32"]
    assert blas._compute_type(c64, True) == HEADER["CUBLAS_COMPUTE_32F_FAST_TF32"]
    assert blas._compute_type(f64, True) == HEADER["CUBLAS_COMPUTE_64F"]
    assert blas._compute_type(c128, False) == HEADER["CUBLAS_COMPUTE_64F"]
    assert blas._data_type(f32) == HEADER["CUDA_R_32F"]
    assert blas._data_type(c64) == HEADER["CUDA_C_32F"]
    assert blas._data_type(c128) == HEADER["CUDA_C_64F"]
    assert blas._enums().gemm_default == HEADER["CUBLAS_GEMM_DEFAULT"]
    assert blas._enums().default_math == HEADER["CUBLAS_DEFAULT_MATH"]
    assert blas.status_name(7) == "CUBLAS_STATUS_INVALID_VALUE"
    assert blas.status_name(13) == "CUBLAS_STATUS_EXECUTION_FAILED"
    # the argument lists the emulation copies are nvmath's
    import inspect

    for name in ("sgemm", "dgemm", "gemm_ex", "sgemm_strided_batched",
                 "dgemm_strided_batched", "gemm_strided_batched_ex", "sgemv",
                 "dgemv", "set_stream", "set_math_mode", "set_workspace"):  # fmt: skip
        want = getattr(cublas, name).__doc__.split("(", 1)[1].split(")", 1)[0]
        want = [p.split()[-1] for p in want.split(",")]
        got = list(inspect.signature(getattr(FakeCublas, name)).parameters)[1:]
        assert got == want, name
