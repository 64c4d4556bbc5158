"""Every op family in one graph compiles and agrees across PyTensor's modes.

PyTensor 3's default mode uses the Numba linker, which runs cc2ops ops (they
have no Numba implementation) in object mode; ``FAST_COMPILE`` uses the
Python linker; ``cc2ops.mode`` (registered as ``"CC2OPS"``) uses ``cvm``.
The same training-step graph must give the same loss and gradients in all of
them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import get_mode

import cc2ops
from cc2ops import (
    AvgPool,
    CrossMapNorm,
    FilterActs,
    MaxPool,
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyGrad,
    WeightActs,
)


def _small_net_step():
    rng = np.random.default_rng(7)
    x = pt.tensor4("x", dtype="float64")
    y = pt.ivector("y")
    w1 = pt.tensor4("w1", dtype="float64")
    w2 = pt.matrix("w2", dtype="float64")
    h = pt.maximum(cc2ops.conv2d(x, w1, stride=1, padding=1), 0)
    h = cc2ops.cross_map_norm(h, size=3)
    h = cc2ops.max_pool2d(h, 3, 2)
    h = cc2ops.avg_pool2d(h, 2)
    logits = pt.dot(h.flatten(2), w2)
    loss = cc2ops.softmax_cross_entropy(logits, y).mean()
    err = cc2ops.top_k_error(logits, y, 1).mean()
    gw1, gw2 = pytensor.grad(loss, [w1, w2])
    values = [
        rng.normal(size=(3, 2, 9, 9)),
        rng.integers(0, 4, size=3).astype("int32"),
        rng.normal(size=(5, 2, 3, 3)) * 0.3,
        rng.normal(size=(5 * 2 * 2, 4)) * 0.3,
    ]
    return [x, y, w1, w2], [loss, err, gw1, gw2], values


@pytest.mark.parametrize("mode_name", ["CC2OPS", "FAST_COMPILE", None])
def test_training_graph_runs_in_every_mode(mode_name):
    inputs, outputs, values = _small_net_step()
    ref = pytensor.function(inputs, outputs, mode="FAST_COMPILE")(*values)
    with warnings.catch_warnings():
        # the Numba linker warns that it runs our ops in object mode: expected
        warnings.filterwarnings("ignore", message=".*object mode.*")
        warnings.filterwarnings("ignore", message=".*Numba will use object mode.*")
        fn = pytensor.function(inputs, outputs, mode=mode_name)
        got = fn(*values)
    for name, g, r in zip(["loss", "err", "grad w1", "grad w2"], got, ref, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12, err_msg=name)
    ops = {type(n.op) for n in fn.maker.fgraph.apply_nodes}
    # the forward ops and the fused gradients are in the compiled graph
    for op in (FilterActs, WeightActs, CrossMapNorm, MaxPool, AvgPool):
        assert op in ops, f"{op.__name__} missing from the {mode_name} graph"
    assert SoftmaxCrossEntropy in ops and SoftmaxCrossEntropyGrad in ops


def test_cc2ops_mode_is_registered_and_documented():
    assert get_mode("CC2OPS") is cc2ops.mode
    from pytensor.link.vm import VMLinker

    # "cvm" is the VM linker with its C loop
    assert isinstance(cc2ops.mode.linker, VMLinker) and cc2ops.mode.linker.use_cloop
    # the cc2ops rewrites are in it
    assert "cc2ops" in cc2ops.mode._optimizer.include


def test_import_needs_no_pycuda():
    import importlib.util

    import cc2ops.cuda as cuda

    if importlib.util.find_spec("pycuda") is None:
        assert not cuda.is_available()
        assert "pycuda" in cuda.unavailable_reason()
