"""The one test helper of cc2ops: forward values, shape inference and every
gradient of an op graph, checked against independent references.

Use :func:`check_op` for every op test. It

1. builds symbolic inputs matching the numpy inputs and the graph ``build(*vars)``;
2. compiles it, asserts the output's **shape, then dtype, then values** against
   ``reference(*arrays)``;
3. checks ``infer_shape``: the compiled ``out.shape`` equals the real shape and
   the graph computing it no longer contains the op (so the shape really is
   inferred, not computed by running the op);
4. runs ``verify_grad`` for every float input in ``wrt`` (float64: tight
   tolerance; float32: float32's tolerance), labelling each failure
   ``"<label>: pullback wrt <name>"``.

References must be independent of the code under test: naive loops or scipy
written in the test, never the module's own reference function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import Mode
from pytensor.gradient import verify_grad

from cc2ops.testing.compare import rel_err

#: Fast to compile: Python linker, PyTensor's fast_compile rewrites. The ops'
#: ``perform`` is what runs, which is what these tests are about.
TEST_MODE = Mode(linker="py", optimizer="fast_compile")
#: For shape inference checks: the rewrites that replace ``x.shape`` by
#: ``infer_shape`` results.
SHAPE_MODE = Mode(linker="py", optimizer="fast_run")

FWD_TOL = {
    "float64": dict(rtol=1e-10, atol=1e-12),
    "float32": dict(rtol=1e-4, atol=1e-5),
}
GRAD_TOL = {
    "float64": dict(abs_tol=1e-6, rel_tol=1e-6, eps=1e-7),
    "float32": dict(abs_tol=5e-2, rel_tol=5e-2, eps=1e-2),
}


def needs_nvcc() -> str:
    """The nvcc the kernel templates compile with; skips the test without one
    (CI has nvcc: the CPU-side kernel checks run there)."""
    from cc2ops.cuda.runtime.compile import find_nvcc

    path = find_nvcc()
    if path is None:
        pytest.skip("nvcc not found (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda/bin)")
    return path


def rng(seed: int = 0) -> np.random.Generator:
    """The fixed-seed generator every sweep uses."""
    return np.random.default_rng(seed)


def symbolic_like(a: np.ndarray, name: str) -> pt.TensorVariable:
    """A symbolic tensor with ``a``'s dtype and number of dims (shape unknown)."""
    return pt.tensor(name=name, dtype=str(a.dtype), shape=(None,) * a.ndim)


def _ops_in(fn) -> set[type]:
    return {type(n.op) for n in fn.maker.fgraph.apply_nodes}


def check_op(
    build: Callable[..., pt.TensorVariable],
    inputs: Sequence[np.ndarray],
    reference: Callable[..., np.ndarray],
    *,
    label: str,
    names: Sequence[str] | None = None,
    wrt: Sequence[int] | None = None,
    op_class: type | tuple[type, ...] | None = None,
    mode: Mode = TEST_MODE,
    fwd_tol: dict | None = None,
    grad_tol: dict | None = None,
    n_grad_tests: int = 1,
    check_shape: bool = True,
    seed: int = 0,
) -> np.ndarray:
    """Check forward values, inferred shape and gradients of ``build``.

    Parameters
    ----------
    build : callable
        Maps symbolic inputs (one per array in ``inputs``) to one output.
    inputs : sequence of ndarray
        Input values; float and integer arrays.
    reference : callable
        Independent numpy reference: same arguments, returns the expected array.
    label : str
        Prefix of every failure message, e.g. ``"conv2d b3 c5 s2 p1"``.
    names : sequence of str, optional
        Names of the inputs for messages (default ``in0, in1, ...``).
    wrt : sequence of int, optional
        Indices of the inputs to check gradients for; default every float
        input. Pass ``()`` to skip gradient checks.
    op_class : type or tuple of types, optional
        The op(s) whose ``infer_shape`` must make them disappear from the
        compiled shape graph; default ``type(out.owner.op)``.
    fwd_tol, grad_tol : dict, optional
        Override the dtype's default tolerances.

    Returns
    -------
    ndarray
        The computed forward value (for further checks by the caller).
    """
    names = list(names or [f"in{i}" for i in range(len(inputs))])
    syms = [symbolic_like(a, n) for a, n in zip(inputs, names, strict=True)]
    out = build(*syms)
    want = np.asarray(reference(*inputs))

    fn = pytensor.function(syms, out, mode=mode)
    got = fn(*inputs)
    assert got.shape == want.shape, (
        f"{label}: forward shape {got.shape}, reference {want.shape}"
    )
    assert str(got.dtype) == str(want.dtype), (
        f"{label}: forward dtype {got.dtype}, reference {want.dtype}"
    )
    assert out.type.dtype == str(want.dtype), (
        f"{label}: symbolic dtype {out.type.dtype}, reference {want.dtype}"
    )
    tol = fwd_tol or FWD_TOL.get(str(want.dtype), dict(rtol=0, atol=0))
    np.testing.assert_allclose(got, want, err_msg=f"{label}: forward values", **tol)

    if check_shape:
        shape_fn = pytensor.function(syms, out.shape, mode=SHAPE_MODE)
        assert tuple(int(s) for s in shape_fn(*inputs)) == want.shape, (
            f"{label}: inferred shape differs from the computed one"
        )
        target = op_class or (type(out.owner.op) if out.owner is not None else ())
        present = _ops_in(shape_fn) & set(
            target if isinstance(target, tuple) else (target,)
        )
        assert not present, (
            f"{label}: computing out.shape still runs {present}: infer_shape unused"
        )

    float_idx = [i for i, a in enumerate(inputs) if a.dtype.kind == "f"]
    for i in float_idx if wrt is None else wrt:
        check_grad(
            build,
            inputs,
            i,
            label=f"{label}: pullback wrt {names[i]}",
            mode=mode,
            tol=grad_tol,
            n_tests=n_grad_tests,
            seed=seed,
        )
    return got


def check_grad(
    build: Callable[..., pt.TensorVariable],
    inputs: Sequence[np.ndarray],
    index: int,
    *,
    label: str,
    mode: Mode = TEST_MODE,
    tol: dict | None = None,
    n_tests: int = 1,
    seed: int = 0,
) -> None:
    """``verify_grad`` of ``build`` with respect to ``inputs[index]`` only."""
    fixed = [pt.constant(a) for a in inputs]

    def partial(v):
        args = list(fixed)
        args[index] = v
        return build(*args)

    dtype = str(inputs[index].dtype)
    t = dict(GRAD_TOL[dtype])
    t.update(tol or {})
    try:
        verify_grad(
            partial, [inputs[index]], n_tests=n_tests, rng=rng(seed), mode=mode, **t
        )
    except Exception as e:  # verify_grad raises its own error class
        raise AssertionError(f"{label}: {e}") from e


def expect_error(exc: type[Exception], match: str, fn: Callable, *args, **kwargs):
    """Run ``fn`` and assert it raises ``exc`` whose message contains ``match``.

    Prefer ``pytest.raises(exc, match=...)``; this helper exists for errors
    raised while a compiled function runs, where the message text must be
    found in the chained exception.
    """
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert match in str(e), f"message {str(e)!r} lacks {match!r}"
        return e
    except Exception as e:  # pytensor may wrap errors raised in perform
        cause = e
        while cause is not None and not isinstance(cause, exc):
            cause = cause.__cause__ or cause.__context__
        assert cause is not None, (
            f"expected {exc.__name__}, got {type(e).__name__}: {e}"
        )
        assert match in str(cause), f"message {str(cause)!r} lacks {match!r}"
        return cause
    raise AssertionError(
        f"expected {exc.__name__} containing {match!r}, nothing raised"
    )


# --------------------------------------------------------------------------
# GPU test helpers (the tests under tests/cuda; the ``debug`` fixture is in
# tests/cuda/conftest.py). ``rel_err`` is cc2ops.testing.compare's, the one the
# benchmarks use too; it is re-exported here for ``from helpers import rel_err``.
# --------------------------------------------------------------------------


def to_gpu(a: np.ndarray, device: int = 0):
    """``a`` copied to a GPUArray on device label ``device``."""
    from cc2ops.cuda.runtime import array

    return array.to_gpu(a, device)


def close(
    got,
    want: np.ndarray,
    dtype: str,
    label: str,
    tol: float | None = None,
    *,
    tol32: float = 1e-5,
    check_dtype: bool = True,
) -> None:
    """Assert a GPU result (as numpy) against a float64 reference: shape, then
    dtype (``check_dtype``), then finite values (NaN: unwritten under
    ``CC2OPS_DEBUG``), then the relative error below ``tol`` (default ``tol32``
    for float32, 1e-12 for float64). Every failure names ``label``."""
    got = np.asarray(got)
    assert got.shape == want.shape, f"{label}: shape {got.shape} vs {want.shape}"
    if check_dtype:
        assert str(got.dtype) == str(dtype), f"{label}: dtype {got.dtype}"
    assert np.isfinite(got).all(), f"{label}: non-finite values (unwritten?)"
    tol = tol or (tol32 if dtype == "float32" else 1e-12)
    err = rel_err(got, want)
    assert err < tol, f"{label}: relative error {err:.3g}"
