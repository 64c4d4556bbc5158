"""JAX differentiates cc2ops's JAX implementations, under ``jax.jit`` too.

PyTensor builds gradients itself, but samplers that jaxify only the log density
(numpyro and blackjax through PyMC) call ``jax.grad`` on the jaxified forward
graph and jit the result. So each forward op's JAX implementation must have a
reverse-mode rule inside ``jax.jit``; its gradient must equal the one PyTensor
computes with cc2ops's own gradient ops in ``cc2ops.mode``.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import get_mode
from pytensor.graph.fg import FunctionGraph

import cc2ops

jax = pytest.importorskip("jax")

from pytensor.link.jax.dispatch import jax_funcify  # noqa: E402

rng = np.random.default_rng(1234)
X = rng.standard_normal((3, 4, 9, 7))  # (B, C, H, W), odd and rectangular
W = rng.standard_normal((5, 4, 3, 3))  # (F, C, kh, kw)
WEIGHTS = rng.standard_normal(X.size)  # fixed cotangent, as many as the largest output


def _conv(x):
    return cc2ops.conv2d(x, pt.constant(W), stride=2, padding=1)


def _loss(x):
    logits = x.reshape((3, -1))[:, :6]
    return cc2ops.softmax_cross_entropy(logits, pt.constant(np.array([0, 5, 2])))


CASES = {
    "conv2d": _conv,
    "max_pool2d": lambda x: cc2ops.max_pool2d(x, 3, stride=2, start=-1),
    "avg_pool2d": lambda x: cc2ops.avg_pool2d(x, 3, stride=2),
    "cross_map_norm": lambda x: cc2ops.cross_map_norm(x, size=3, alpha=0.1, k=1.0),
    "softmax_cross_entropy": _loss,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jitted_jax_grad_equals_the_pytensor_gradient(name):
    x = pt.tensor4("x", dtype="float64", shape=X.shape)
    y = CASES[name](x)
    # a fixed random weighting of the outputs, so that every output element's
    # gradient path counts (a plain sum hides swapped or dropped windows)
    weights = WEIGHTS[: int(np.prod(y.type.shape))]
    cost = (y.flatten() * pt.constant(weights)).sum()
    fgraph = FunctionGraph([x], [cost], clone=True)
    get_mode("JAX").optimizer.rewrite(fgraph)
    jax_cost = jax_funcify(fgraph)
    got = jax.jit(jax.grad(lambda v: jax_cost(v)[0]))(X)
    want = pytensor.function([x], pytensor.grad(cost, x), mode=cc2ops.mode)(X)
    assert np.asarray(got).shape == want.shape, f"{name}: gradient shape"
    np.testing.assert_allclose(
        np.asarray(got), want, rtol=1e-9, atol=1e-12, err_msg=f"jax.grad wrt x: {name}"
    )
