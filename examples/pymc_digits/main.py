"""A Bayesian CNN on scikit-learn's digits, sampled with PyMC and numpyro.

The net and the likelihood are :mod:`model` (cc2ops ``conv2d``,
``max_pool2d`` and ``softmax_cross_entropy``); this file wraps them in a PyMC
model (Normal priors, the loss as a ``pm.Potential``) and samples it with
PyMC's default NUTS sampler and with numpyro (``nuts_sampler="numpyro"``,
which jaxifies the graph through cc2ops's JAX backend), printing the sampling
time and the test accuracy of the posterior mean prediction for each.

Needs PyMC (6.x; Python 3.12 with PyTensor 3.3: no PyMC release supports
PyTensor 3 on Python 3.11) and numpyro for the second sampler::

    python examples/pymc_digits/main.py --draws 200 --tune 200 --chains 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import model as digits_model  # noqa: E402


def build_model(X, y, channels: int = 4, prior_sigma: float = 1.0):
    """The PyMC model: Normal(0, prior_sigma) weights, softmax-loss likelihood."""
    import pymc as pm
    import pytensor.tensor as pt

    import cc2ops

    with pm.Model() as m:
        params = {
            name: pm.Normal(name, 0.0, prior_sigma, shape=shape)
            for name, shape in digits_model.param_shapes(channels).items()
        }
        X_data = pm.Data("X", np.asarray(X, dtype="float64"))
        y_data = pm.Data("y", np.asarray(y, dtype="int64"))
        scores = digits_model.logits(params, X_data)
        loss = cc2ops.softmax_cross_entropy(scores, pt.cast(y_data, "int64"))
        pm.Potential("loglik", -loss.sum())
    return m


def main(
    n_train: int = 500,
    n_test: int = 300,
    channels: int = 4,
    draws: int = 200,
    tune: int = 200,
    chains: int = 2,
    samplers: tuple[str, ...] = ("pymc", "numpyro"),
    seed: int = 0,
    progressbar: bool = False,
) -> dict:
    """Sample the posterior with each sampler; print and return time and accuracy.

    Returns
    -------
    dict
        sampler -> {"seconds": wall time of ``pm.sample``, "accuracy": test
        accuracy of the posterior mean prediction, "draws": draws per chain,
        "chains": chains}.
    """
    import pymc as pm

    X_tr, y_tr, X_te, y_te = digits_model.load_data(n_train, n_test, seed)
    results = {}
    for sampler in samplers:
        m = build_model(X_tr, y_tr, channels)
        with m:
            t0 = time.perf_counter()
            idata = pm.sample(
                draws=draws,
                tune=tune,
                chains=chains,
                nuts_sampler=sampler,
                random_seed=seed,
                progressbar=progressbar,
                # chains one after another: PyMC's worker processes are forked,
                # and fork() after Numba's OpenMP threads started aborts them
                cores=1,
            )
            seconds = time.perf_counter() - t0
        post = idata.posterior
        samples = {
            name: np.asarray(post[name]).reshape(-1, *shape)
            for name, shape in digits_model.param_shapes(channels).items()
        }
        acc = digits_model.accuracy(samples, X_te, y_te)
        results[sampler] = dict(
            seconds=seconds,
            accuracy=acc,
            draws=draws,
            tune=tune,
            chains=chains,
            n_train=len(y_tr),
            jax_backend=_jax_backend() if sampler != "pymc" else None,
            divergences=_divergences(idata),
            max_rhat=_max_rhat(idata) if chains > 1 else None,
        )
        rhat = results[sampler]["max_rhat"]
        backend = results[sampler]["jax_backend"]
        print(
            f"{sampler:>8}: {chains} chains x ({tune} tune + {draws} draws) in "
            f"{seconds:.1f} s; test accuracy {acc:.3f} ({n_test} images); "
            f"divergences {results[sampler]['divergences']}"
            + (f"; max r-hat {rhat:.3f}" if rhat is not None else "")
            + (f"; JAX on {backend}" if backend is not None else "")
        )
    return results


def _jax_backend() -> str | None:
    try:
        import jax
    except ImportError:
        return None
    return jax.default_backend()


def _divergences(idata) -> int | None:
    """Divergent transitions over all chains (None: the sampler reports none)."""
    try:
        diverging = idata.sample_stats["diverging"]
    except (AttributeError, KeyError):
        return None
    return int(np.asarray(diverging).sum())


def _max_rhat(idata) -> float | None:
    """The largest rank-normalised split r-hat over every parameter (ArviZ);
    None, with the reason printed, where this ArviZ cannot compute it."""
    import arviz as az

    try:
        rhat = az.rhat(idata.posterior)
        values = [np.nanmax(np.asarray(rhat[v])) for v in rhat.data_vars]
    except (AttributeError, TypeError, ValueError, KeyError) as e:
        print(f"r-hat not computed: arviz {az.__version__}: {type(e).__name__}: {e}")
        return None
    return float(max(values))


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-train", type=int, default=500)
    p.add_argument("--n-test", type=int, default=300)
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--draws", type=int, default=200)
    p.add_argument("--tune", type=int, default=200)
    p.add_argument("--chains", type=int, default=2)
    p.add_argument("--samplers", default="pymc,numpyro")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--json", default=None, help="also write the results to this file")
    return p.parse_args(argv)


if __name__ == "__main__":
    a = _parse()
    res = main(
        a.n_train,
        a.n_test,
        a.channels,
        a.draws,
        a.tune,
        a.chains,
        tuple(a.samplers.split(",")),
        a.seed,
        a.progress,
    )
    if a.json:
        import json

        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
