"""The PyMC digits example: its log density everywhere, its sampling where PyMC is.

The PyMC-free part (``examples/pymc_digits/model.py``) always runs: the log
density and its gradient agree between ``cc2ops.mode``, the default mode and
``mode="JAX"``, and ``jax.grad`` of the jaxified log density (what numpyro
differentiates) equals PyTensor's gradient. The sampling part needs PyMC,
which has no release for PyTensor 3 on Python 3.11 (it runs on the GPU
machine's Python 3.12); it skips where ``pymc`` does not import.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytensor.tensor as pt
import pytest

import cc2ops

pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pymc_digits"
sys.path.insert(0, str(EXAMPLE))

import model as digits_model  # noqa: E402


@pytest.fixture(scope="module")
def data():
    X, y, X_te, y_te = digits_model.load_data(40, 10, seed=1)
    return X, y, X_te, y_te


def test_load_data_shapes(data):
    X, y, X_te, y_te = data
    assert X.shape == (40, 1, 8, 8) and X.dtype == np.float64
    assert y.shape == (40,) and y.dtype == np.int64
    assert X_te.shape == (10, 1, 8, 8) and y_te.shape == (10,)
    assert 0.0 <= X.min() and X.max() <= 1.0 and set(y) <= set(range(10))


def test_log_density_matches_a_numpy_forward(data):
    """The model's logits and loss against a direct numpy computation."""
    from cc2ops.conv import conv_forward_reference
    from cc2ops.pool import max_pool_reference

    X, y, _, _ = data
    theta = np.random.default_rng(2).normal(scale=0.3, size=digits_model.n_params())
    (logp,) = digits_model.log_density_function(X, y, mode=cc2ops.mode, grad=False)(
        theta
    )
    p, i = {}, 0
    for name, shape in digits_model.param_shapes().items():
        n = int(np.prod(shape))
        p[name] = theta[i : i + n].reshape(shape)
        i += n
    h = conv_forward_reference(X, p["w_conv"], 1, 1) + p["b_conv"][None, :, None, None]
    h = max_pool_reference(np.maximum(h, 0), 2, 2).reshape(len(X), -1)
    z = h @ p["w_out"] + p["b_out"]
    z = z - z.max(1, keepdims=True)
    logsm = z - np.log(np.exp(z).sum(1, keepdims=True))
    want = logsm[np.arange(len(y)), y].sum() - 0.5 * np.sum(theta**2)
    np.testing.assert_allclose(logp, want, rtol=1e-10)


@pytest.mark.parametrize("mode", ["JAX", "FAST_RUN"])
def test_log_density_modes_agree(data, mode):
    if mode == "JAX":
        pytest.importorskip("jax")
    X, y, _, _ = data
    theta = np.random.default_rng(3).normal(scale=0.3, size=digits_model.n_params())
    want = digits_model.log_density_function(X, y, mode=cc2ops.mode)(theta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # numba object-mode notes
        got = digits_model.log_density_function(X, y, mode=mode)(theta)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-9, atol=1e-10)


def test_jax_grad_of_the_jaxified_log_density(data):
    """numpyro's path: JAX differentiates cc2ops's JAX implementations, jitted.

    numpyro jits the gradient; under ``jax.jit`` a reduction's initial value made
    with ``jnp.asarray`` is a tracer, and ``lax.reduce_window`` then falls back to
    its generic form, which has no reverse-mode rule (the H200 run of the example
    failed so). Both the eager and the jitted gradient are checked.
    """
    jax = pytest.importorskip("jax")
    from pytensor.compile.mode import get_mode
    from pytensor.graph.fg import FunctionGraph
    from pytensor.link.jax.dispatch import jax_funcify

    X, y, _, _ = data
    theta = pt.vector("theta", shape=(digits_model.n_params(),))
    logp = digits_model.log_density(theta, pt.constant(X), pt.constant(y))
    fgraph = FunctionGraph([theta], [logp], clone=True)
    get_mode("JAX").optimizer.rewrite(fgraph)
    jax_logp = jax_funcify(fgraph)
    value = np.random.default_rng(4).normal(scale=0.3, size=digits_model.n_params())
    grad = jax.grad(lambda t: jax_logp(t)[0])
    want = digits_model.log_density_function(X, y, mode=cc2ops.mode)(value)[1]
    for label, fn in [("eager", grad), ("jit", jax.jit(grad))]:
        got = fn(value)
        np.testing.assert_allclose(
            np.asarray(got), want, rtol=1e-8, atol=1e-10, err_msg=label
        )


def test_accuracy_of_a_point_posterior(data):
    X, y, _, _ = data
    rng = np.random.default_rng(5)
    samples = {
        k: rng.normal(size=(2, *s)) for k, s in digits_model.param_shapes().items()
    }
    acc = digits_model.accuracy(samples, X, y)
    assert 0.0 <= acc <= 1.0
    # a posterior whose every draw predicts one class scores that class's share
    samples = {k: np.zeros((2, *s)) for k, s in digits_model.param_shapes().items()}
    samples["b_out"][:, 3] = 1.0
    assert digits_model.accuracy(samples, X, y) == pytest.approx(np.mean(y == 3))


def test_pymc_sampling_runs(data):
    pytest.importorskip("pymc")
    import main as digits_main

    samplers = ["pymc"]
    try:
        import numpyro  # noqa: F401

        samplers.append("numpyro")
    except ImportError:
        pass
    out = digits_main.main(
        n_train=40, n_test=20, draws=20, tune=20, chains=1, samplers=tuple(samplers)
    )
    for s in samplers:
        assert out[s]["seconds"] > 0 and 0.0 <= out[s]["accuracy"] <= 1.0
