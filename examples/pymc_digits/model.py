"""The Bayesian CNN of the PyMC digits example, without PyMC.

A small convolutional net on scikit-learn's 8 x 8 ``load_digits`` images, in
cc2ops ops: ``conv2d`` (1 -> ``channels`` filters, 3 x 3, padding 1), ReLU,
``max_pool2d`` (2 x 2), a dense layer to the 10 classes, and
``softmax_cross_entropy`` as the likelihood::

    log p(theta | X, y) = sum_i -CE(logits(theta, X_i), y_i)
                          + sum_j log Normal(theta_j | 0, prior_sigma)  + const

Everything here is plain PyTensor, so the same log density compiles in
``cc2ops.mode``, the default mode, ``mode="JAX"`` (what numpyro samples) and
is tested without PyMC (``tests/test_pymc_example.py``); :mod:`main` wraps
the same :func:`logits` in a PyMC model.

Axis orders: images (B, 1, 8, 8) (bc01), conv filters (F, 1, 3, 3), dense
weights (F*4*4, 10), logits (B, 10).
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt

import cc2ops

N_CLASSES = 10


def param_shapes(channels: int = 4) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter (the order :func:`unflatten` uses)."""
    return {
        "w_conv": (channels, 1, 3, 3),
        "b_conv": (channels,),
        "w_out": (channels * 4 * 4, N_CLASSES),
        "b_out": (N_CLASSES,),
    }


def load_data(n_train: int = 1000, n_test: int = 500, seed: int = 0):
    """scikit-learn's digits as (B, 1, 8, 8) float64 images in [0, 1] and labels.

    Returns
    -------
    (X_train, y_train, X_test, y_test)
        Images (B, 1, 8, 8) float64, labels (B,) int64, a fixed random split.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = (digits.images / 16.0).astype("float64")[:, None, :, :]
    y = digits.target.astype("int64")
    order = np.random.default_rng(seed).permutation(len(y))
    if n_train + n_test > len(y):
        raise ValueError(
            f"load_data: n_train + n_test must be <= {len(y)}, got {n_train + n_test}"
        )
    tr, te = order[:n_train], order[n_train : n_train + n_test]
    return X[tr], y[tr], X[te], y[te]


def logits(params: dict, X) -> pt.TensorVariable:
    """Class scores (B, 10) of images X (B, 1, 8, 8) under ``params``."""
    h = cc2ops.conv2d(X, params["w_conv"], padding=1)
    h = pt.maximum(h + params["b_conv"][None, :, None, None], 0.0)
    h = cc2ops.max_pool2d(h, 2)  # (B, F, 4, 4)
    h = h.reshape((h.shape[0], -1))
    return h @ params["w_out"] + params["b_out"]


def unflatten(theta: pt.TensorVariable, channels: int = 4) -> dict:
    """The parameters as views of one flat vector ``theta`` (samplers' layout)."""
    out, i = {}, 0
    for name, shape in param_shapes(channels).items():
        n = int(np.prod(shape))
        out[name] = theta[i : i + n].reshape(shape)
        i += n
    return out


def n_params(channels: int = 4) -> int:
    return sum(int(np.prod(s)) for s in param_shapes(channels).values())


def log_density(theta, X, y, channels: int = 4, prior_sigma: float = 1.0):
    """Unnormalised log posterior of the flat parameter vector ``theta``."""
    params = unflatten(theta, channels)
    loglik = -cc2ops.softmax_cross_entropy(logits(params, X), y).sum()
    logprior = -0.5 * pt.sum(pt.sqr(theta)) / prior_sigma**2
    return loglik + logprior


def log_density_function(X, y, channels: int = 4, mode=None, grad: bool = True):
    """Compiled ``theta -> [logp, dlogp/dtheta]`` for fixed data (any mode)."""
    theta = pt.vector("theta", shape=(n_params(channels),))
    Xc = pt.constant(np.asarray(X, dtype="float64"))
    yc = pt.constant(np.asarray(y, dtype="int64"))
    logp = log_density(theta, Xc, yc, channels)
    outs = [logp, pytensor.grad(logp, theta)] if grad else [logp]
    return pytensor.function([theta], outs, mode=mode)


def accuracy(samples: dict, X, y) -> float:
    """Accuracy of the posterior mean class probabilities.

    Parameters
    ----------
    samples : dict
        Name -> array (S, *shape) of S posterior draws per parameter.
    """
    params = {k: pt.tensor(k, shape=v.shape[1:], dtype="float64")
              for k, v in samples.items()}  # fmt: skip
    probs = pt.special.softmax(logits(params, pt.constant(np.asarray(X))), axis=1)
    f = pytensor.function(list(params.values()), probs, mode=cc2ops.mode)
    names = list(params)
    n = len(samples[names[0]])
    mean = sum(f(*(samples[k][s] for k in names)) for s in range(n)) / n
    return float(np.mean(mean.argmax(axis=1) == np.asarray(y)))
