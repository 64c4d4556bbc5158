"""cuBLAS products on a GPU against numpy (float64 references).

Row-major GEMM in every transpose combination, row strides and transposed
views (used in place, not copied), batched GEMM, GEMV, alpha/beta, and the
TF32 switch: off is true float32 (relative error < 1e-5), on is TF32 (< 5e-3,
and > 1e-6 on a 4096-deep product, which proves TF32 was used). The calls go
through nvmath-python's bindings: status codes become CublasError, the handle
is bound to cc2ops's stream, and the products replay from a captured CUDA
graph. (tests/cuda/libs/test_cublas_emulated.py runs the same adapter on the
CPU against an emulated cuBLAS.)
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rel_err, rng

import cc2ops.cuda as cuda
from cc2ops.cuda.libs import cublas as blas
from cc2ops.cuda.libs.cublas import CublasError, gemm, gemm_strided_batched, gemv
from cc2ops.cuda.runtime import array as garray

pytestmark = pytest.mark.gpu

TOL = {"float64": 1e-12, "float32": 1e-5}
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


def g(x):
    return garray.to_gpu(x, 0)


def host(x):
    return garray.to_host(x)


def operands(dtype, m, k, n, ta, tb, seed=0):
    r = rng(seed)
    A = r.standard_normal((m, k)).astype(dtype)
    B = r.standard_normal((k, n)).astype(dtype)
    a = np.ascontiguousarray(A.T) if ta else A
    b = np.ascontiguousarray(B.T) if tb else B
    return A, B, a, b


@pytest.fixture
def no_copies(monkeypatch):
    """Count operand copies blas makes (layouts it could not use in place)."""
    calls = []
    real = blas.ascontiguous

    def counting(x, device=None):
        out = real(x, device)
        if out is not x:
            calls.append(tuple(x.strides))
        return out

    monkeypatch.setattr(blas, "ascontiguous", counting)
    return calls


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
def test_gemm_every_transpose(dtype, ta, tb, no_copies):
    A, B, a, b = operands(dtype, 37, 53, 29, ta, tb)
    out = gemm(g(a), g(b), trans_a=ta, trans_b=tb, device=0, precision="fp32")
    assert tuple(out.shape) == (37, 29) and np.dtype(out.dtype) == dtype
    assert rel_err(host(out), A.astype(np.float64) @ B) < TOL[dtype], (dtype, ta, tb)
    assert not no_copies


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
def test_gemm_folds_transposed_views_into_the_flags(dtype, ta, tb, no_copies):
    A, B, a, b = operands(dtype, 19, 31, 23, ta, tb, seed=1)
    # column-major views: the transposes of row-major device arrays
    a_view = g(np.ascontiguousarray(a.T)).T
    b_view = g(np.ascontiguousarray(b.T)).T
    out = gemm(a_view, b_view, trans_a=ta, trans_b=tb, device=0)
    assert rel_err(host(out), A.astype(np.float64) @ B) < TOL[dtype]
    assert not no_copies, no_copies


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm_with_row_strides_alpha_beta(dtype, no_copies):
    r = rng(2)
    big = r.standard_normal((40, 50)).astype(dtype)
    out_big = r.standard_normal((30, 35)).astype(dtype)
    G, C = g(big), g(out_big)
    a, b = G[3:20, 5:30], G[10:35, 30:41]  # views with row stride 50
    c = C[4:21, 2:13]  # output view with row stride 35
    gemm(a, b, c, alpha=1.5, beta=-0.5, device=0)
    want = out_big.astype(np.float64)
    want[4:21, 2:13] = 1.5 * (big[3:20, 5:30].astype(np.float64) @ big[10:35, 30:41])
    want[4:21, 2:13] += -0.5 * out_big[4:21, 2:13]
    assert rel_err(host(C), want) < TOL[dtype]
    assert not no_copies  # row-strided views are used in place


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm_into_a_transposed_output(dtype):
    A, B, _, _ = operands(dtype, 11, 13, 7, False, False, seed=3)
    ct = g(np.zeros((7, 11), dtype))
    gemm(g(A), g(B), ct.T, device=0)
    assert rel_err(host(ct).T, A.astype(np.float64) @ B) < TOL[dtype]


def test_gemm_copies_unusable_layouts(no_copies):
    A, B, _, _ = operands("float64", 9, 8, 5, False, False, seed=4)
    wide = np.zeros((9, 24))
    wide[:, ::3] = A
    out = gemm(g(wide)[:, ::3], g(B), device=0)  # column stride 3: copied
    assert rel_err(host(out), A @ B) < 1e-12
    assert len(no_copies) == 1


def test_gemm_empty_and_zero_depth():
    x = g(np.ones((0, 4), "float32"))
    assert tuple(gemm(x, g(np.ones((4, 3), "float32")), device=0).shape) == (0, 3)
    c = g(np.full((2, 3), 5.0, "float64"))
    gemm(g(np.ones((2, 0))), g(np.ones((0, 3))), c, beta=2.0, device=0)
    np.testing.assert_array_equal(host(c), np.full((2, 3), 10.0))


def test_gemm_rejects():
    a32, b32 = g(np.ones((2, 3), "float32")), g(np.ones((3, 4), "float32"))
    with pytest.raises(TypeError, match="gemm: inputs must share one dtype"):
        gemm(a32, g(np.ones((3, 4))), device=0)
    with pytest.raises(ValueError, match="op\\(a\\) is 2x3 and op\\(b\\) is 4x3"):
        gemm(a32, b32, trans_b=True, device=0)
    with pytest.raises(ValueError, match="c must have shape \\(2, 4\\)"):
        gemm(a32, b32, g(np.ones((4, 2), "float32")), device=0)
    with pytest.raises(ValueError, match="beta != 0 needs an output array c"):
        gemm(a32, b32, beta=1.0, device=0)
    with pytest.raises(TypeError, match="gemm: a must have 2 dims, got 3"):
        gemm(g(np.ones((1, 2, 3), "float32")), b32, device=0)
    with pytest.raises(TypeError, match="must be float32 or float64, got int32"):
        gemm(g(np.ones((2, 3), "int32")), b32, device=0)
    with pytest.raises(TypeError, match="a must be a GPUArray, got ndarray"):
        gemm(np.ones((2, 3), "float32"), b32, device=0)
    with pytest.raises(ValueError, match="precision must be None, 'fp32' or 'tf32'"):
        gemm(a32, b32, device=0, precision="fp16")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
def test_gemm_strided_batched(dtype, ta, tb):
    r = rng(5)
    A = r.standard_normal((6, 9, 14)).astype(dtype)
    B = r.standard_normal((6, 14, 5)).astype(dtype)
    a = np.ascontiguousarray(A.transpose(0, 2, 1)) if ta else A
    b = np.ascontiguousarray(B.transpose(0, 2, 1)) if tb else B
    out = gemm_strided_batched(g(a), g(b), trans_a=ta, trans_b=tb, device=0)
    assert tuple(out.shape) == (6, 9, 5)
    assert rel_err(host(out), A.astype(np.float64) @ B) < TOL[dtype]


def test_gemm_strided_batched_broadcast_views_alpha_beta():
    r = rng(6)
    A = r.standard_normal((1, 7, 8))
    B = r.standard_normal((5, 8, 3))
    out = gemm_strided_batched(g(A), g(B), device=0)
    assert rel_err(host(out), A @ B) < 1e-12
    wide = r.standard_normal((4, 10, 12))
    Bv = r.standard_normal((4, 12, 6))
    C0 = r.standard_normal((4, 10, 6))
    c = g(C0)
    gemm_strided_batched(g(wide), g(Bv), c, alpha=2.0, beta=0.25, device=0)
    assert rel_err(host(c), 2 * wide @ Bv + 0.25 * C0) < 1e-12
    # inner views with a row stride and a batch stride
    view = g(wide)[:, 1:9, 2:10]
    out = gemm_strided_batched(view, g(Bv[:, :8, :]), device=0)
    assert rel_err(host(out), wide[:, 1:9, 2:10] @ Bv[:, :8, :]) < 1e-12
    with pytest.raises(ValueError, match="batch sizes 4 and 5 differ"):
        gemm_strided_batched(g(wide), g(r.standard_normal((5, 12, 6))), device=0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemv(dtype):
    r = rng(7)
    A = r.standard_normal((13, 17)).astype(dtype)
    x = r.standard_normal(17).astype(dtype)
    xt = r.standard_normal(13).astype(dtype)
    y0 = r.standard_normal(13).astype(dtype)
    tol = TOL[dtype]
    assert rel_err(host(gemv(g(A), g(x), device=0)), A.astype(np.float64) @ x) < tol
    assert (
        rel_err(
            host(gemv(g(A), g(xt), trans=True, device=0)), A.T.astype(np.float64) @ xt
        )
        < tol
    )
    # a transposed view and a strided x
    At = g(np.ascontiguousarray(A.T)).T
    wide_x = np.zeros(34, dtype)
    wide_x[::2] = x
    assert (
        rel_err(host(gemv(At, g(wide_x)[::2], device=0)), A.astype(np.float64) @ x)
        < tol
    )
    y = g(y0)
    gemv(g(A), g(x), y, alpha=2.0, beta=-1.0, device=0)
    assert rel_err(host(y), 2 * A.astype(np.float64) @ x - y0) < tol


def test_tf32_switch():
    r = rng(8)
    A = r.standard_normal((256, 4096)).astype(np.float32)
    B = r.standard_normal((4096, 256)).astype(np.float32)
    want = A.astype(np.float64) @ B
    a, b = g(A), g(B)
    assert not cuda.get_allow_tf32()  # true float32 by default
    fp32 = rel_err(host(gemm(a, b, device=0)), want)
    assert fp32 < 1e-5, fp32
    with cuda.allow_tf32(True):
        assert cuda.get_allow_tf32()
        tf32 = rel_err(host(gemm(a, b, device=0)), want)
        forced_fp32 = rel_err(host(gemm(a, b, device=0, precision="fp32")), want)
        a3, b3 = g(A[None]), g(B[None])
        batched = rel_err(host(gemm_strided_batched(a3, b3, device=0))[0], want)
    assert not cuda.get_allow_tf32()
    assert 1e-6 < tf32 < 5e-3, tf32
    assert 1e-6 < batched < 5e-3, batched
    assert forced_fp32 < 1e-5, forced_fp32
    forced_tf32 = rel_err(host(gemm(a, b, device=0, precision="tf32")), want)
    assert 1e-6 < forced_tf32 < 5e-3, forced_tf32
    # float64 never uses TF32
    with cuda.allow_tf32(True):
        A64, B64 = A[:64, :512].astype(np.float64), B[:512, :64].astype(np.float64)
        assert rel_err(host(gemm(g(A64), g(B64), device=0)), A64 @ B64) < 1e-12


def test_set_allow_tf32_validates():
    with pytest.raises(TypeError, match="flag must be a bool"):
        cuda.set_allow_tf32(1)


def test_status_codes_become_errors():
    handle = blas.get_handle(0)
    assert isinstance(handle, int) and blas.get_handle(0) == handle
    x = g(np.ones((2, 2), "float32"))
    p = garray.ptr(x)
    one = np.ones((), np.float32)
    n = blas._op_enum("n")
    with pytest.raises(
        CublasError, match="cublas: sgemm failed: CUBLAS_STATUS_INVALID_VALUE"
    ) as info:
        blas._call(
            "sgemm", handle, n, n, -1, 2, 2, one.ctypes.data, p, 2, p, 2,
            one.ctypes.data, p, 2,
        )  # fmt: skip
    assert info.value.status == 7
    assert blas.status_name(13) == "CUBLAS_STATUS_EXECUTION_FAILED"
    assert "libcublas" in blas.library_path()


def test_nvmath_products_match_numpy_eagerly_and_replayed_from_a_graph():
    """gemm (fp32 and TF32), strided-batched gemm and gemv through nvmath's
    bindings, on cc2ops's handle (bound to cc2ops's stream, its own workspace):
    eagerly, then captured into a CUDA graph and replayed with new operands."""
    from nvmath.bindings import cublas as nv

    from cc2ops.cuda.runtime.cudagraph import CudaGraph
    from cc2ops.cuda.runtime.device import get_device

    handle = blas.get_handle(0)
    assert nv.get_version(handle) >= 120000
    assert nv.get_stream(handle) == int(get_device(0).stream.handle)
    m, k, n = 64, 96, 48

    def data(seed):
        r = rng(seed)
        return {
            "a": r.standard_normal((m, k)).astype(np.float32),
            "b": r.standard_normal((k, n)).astype(np.float32),
            "a3": r.standard_normal((4, m, k)).astype(np.float32),
            "b3": r.standard_normal((4, k, n)).astype(np.float32),
            "x": r.standard_normal(k).astype(np.float32),
        }

    host_in = data(20)
    dev_in = {name: g(v) for name, v in host_in.items()}
    c = garray.empty((m, n), np.float32, 0)
    c_tf32 = garray.empty((m, n), np.float32, 0)
    c3 = garray.empty((4, m, n), np.float32, 0)
    y = garray.empty((m,), np.float32, 0)

    def products():
        d = dev_in
        gemm(d["a"], d["b"], c, device=0, precision="fp32")
        gemm(d["a"], d["b"], c_tf32, device=0, precision="tf32")
        gemm_strided_batched(d["a3"], d["b3"], c3, device=0, precision="fp32")
        gemv(d["a"], d["x"], y, device=0)

    def check(h, label):
        a64 = h["a"].astype(np.float64)
        assert rel_err(host(c), a64 @ h["b"]) < 1e-5, label
        assert 1e-7 < rel_err(host(c_tf32), a64 @ h["b"]) < 5e-3, label
        assert rel_err(host(c3), h["a3"].astype(np.float64) @ h["b3"]) < 1e-5, label
        assert rel_err(host(y), a64 @ h["x"]) < 1e-5, label

    products()
    check(host_in, "eager")
    graph = CudaGraph(0)
    graph.capture(products)
    assert graph.nodes >= 4
    for seed in (21, 22):
        host_in = data(seed)
        for name, v in host_in.items():
            garray._copy_into_contiguous(g(v), dev_in[name], 0)
        graph.replay()
        check(host_in, f"replay {seed}")
    graph.close()


COMPLEX_OPS = ["n", "t", "c"]


def _complex(r, shape, dtype):
    return (r.standard_normal(shape) + 1j * r.standard_normal(shape)).astype(dtype)


def _op(x, op):
    if op == "n":
        return x
    x = x.transpose(0, 2, 1)
    return x.conj() if op == "c" else x


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("op_a", COMPLEX_OPS)
@pytest.mark.parametrize("op_b", COMPLEX_OPS)
def test_gemm_strided_batched_complex(dtype, op_a, op_b, no_copies):
    from cc2ops.cuda.libs.cublas import gemm_strided_batched_complex

    r = rng(9)
    m, k, n = 9, 14, 5
    A = _complex(r, (6, m, k) if op_a == "n" else (6, k, m), dtype)
    B = _complex(r, (6, k, n) if op_b == "n" else (6, n, k), dtype)
    want = _op(A.astype(np.complex128), op_a) @ _op(B.astype(np.complex128), op_b)
    out = gemm_strided_batched_complex(g(A), g(B), op_a=op_a, op_b=op_b, device=0,
                                       precision="fp32")  # fmt: skip
    assert tuple(out.shape) == (6, m, n) and np.dtype(out.dtype) == dtype
    tol = 1e-5 if dtype == "complex64" else 1e-12
    assert rel_err(host(out), want) < tol, (dtype, op_a, op_b)
    assert not no_copies
    # transposed views: folded into "n"/"t", copied for "c"
    At = g(np.ascontiguousarray(A.transpose(0, 2, 1))).transpose((0, 2, 1))
    out = gemm_strided_batched_complex(At, g(B), op_a=op_a, op_b=op_b, device=0)
    assert rel_err(host(out), want) < tol, ("view", dtype, op_a, op_b)
    assert len(no_copies) == (1 if op_a == "c" else 0)


def test_gemm_strided_batched_complex_alpha_beta_broadcast_tf32():
    from cc2ops.cuda.libs.cublas import gemm_strided_batched_complex

    r = rng(10)
    A = _complex(r, (1, 7, 8), "complex64")
    B = _complex(r, (5, 8, 3), "complex64")
    C0 = _complex(r, (5, 7, 3), "complex64")
    c = g(C0)
    alpha, beta = 1.5 - 0.5j, 0.25 + 1j
    gemm_strided_batched_complex(g(A), g(B), c, alpha=alpha, beta=beta, device=0)
    want = alpha * (A.astype(np.complex128) @ B) + beta * C0
    assert rel_err(host(c), want) < 1e-5
    # a deep product: true fp32 (CUBLAS_COMPUTE_32F) vs TF32
    A = _complex(r, (2, 64, 4096), "complex64")
    B = _complex(r, (2, 4096, 64), "complex64")
    want = A.astype(np.complex128) @ B
    a, b = g(A), g(B)
    fp32 = rel_err(host(gemm_strided_batched_complex(a, b, device=0)), want)
    assert fp32 < 1e-5, fp32
    tf32 = gemm_strided_batched_complex(a, b, device=0, precision="tf32")
    assert 1e-6 < rel_err(host(tf32), want) < 5e-3
    with cuda.allow_tf32(True):
        on = rel_err(host(gemm_strided_batched_complex(a, b, device=0)), want)
    assert 1e-6 < on < 5e-3, on


def test_gemm_strided_batched_complex_rejects():
    from cc2ops.cuda.libs.cublas import gemm_strided_batched_complex as cgemm

    where = "gemm_strided_batched_complex"
    a = g(np.ones((2, 3, 4), "complex64"))
    b = g(np.ones((2, 4, 5), "complex64"))
    with pytest.raises(TypeError, match=f"{where}: a must be complex64 or complex128"):
        cgemm(g(np.ones((2, 3, 4), "float32")), b, device=0)
    with pytest.raises(TypeError, match="must share one dtype"):
        cgemm(a, g(np.ones((2, 4, 5), "complex128")), device=0)
    with pytest.raises(ValueError, match="op_a must be 'n', 't' or 'c', got 'h'"):
        cgemm(a, b, op_a="h", device=0)
    with pytest.raises(ValueError, match=r"op\(a\) is 4x3 and op\(b\) is 4x5"):
        cgemm(a, b, op_a="t", device=0)
    with pytest.raises(ValueError, match="batch sizes 2 and 3 differ"):
        cgemm(a, g(np.ones((3, 4, 5), "complex64")), device=0)
    with pytest.raises(ValueError, match=r"c must have shape \(2, 3, 5\)"):
        cgemm(a, b, g(np.ones((2, 5, 3), "complex64")), device=0)
    with pytest.raises(ValueError, match="beta != 0 needs an output array c"):
        cgemm(a, b, beta=1.0, device=0)
