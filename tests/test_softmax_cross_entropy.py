"""Softmax cross-entropy, its gradient (and second derivatives), top-k error.

The references here are written independently of :mod:`cc2ops.softmax_cross_entropy`:
explicit per-row loops in float64 with ``math.fsum`` for the normaliser, and
a per-row count for the top-k rule.
"""

from __future__ import annotations

import math

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import TEST_MODE, check_op, expect_error, rng

from cc2ops.softmax_cross_entropy import (
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyGrad,
    TopKError,
    softmax_cross_entropy,
    softmax_cross_entropy_grad_reference,
    softmax_cross_entropy_reference,
    top_k_error,
    top_k_error_reference,
)

DTYPES = ("float64", "float32")

# --------------------------------------------------------------------------
# independent references
# --------------------------------------------------------------------------


def naive_log_softmax_row(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    m = max(row)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in row))
    return row - lse


def naive_loss(x: np.ndarray, targets: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[0], dtype=np.float64)
    for i in range(x.shape[0]):
        logp = naive_log_softmax_row(x[i])
        if targets.dtype.kind in "iu":
            out[i] = -logp[targets[i]]
        else:
            out[i] = -math.fsum(
                float(t) * lp for t, lp in zip(targets[i], logp, strict=True)
            )
    return out.astype(x.dtype)


def naive_grad(g: np.ndarray, x: np.ndarray, targets: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, dtype=np.float64)
    for i in range(x.shape[0]):
        p = np.exp(naive_log_softmax_row(x[i]))
        if targets.dtype.kind in "iu":
            d = p.copy()
            d[targets[i]] -= 1.0
        else:
            t = targets[i].astype(np.float64)
            d = p * t.sum() - t
        out[i] = d * float(g[i])
    return out.astype(x.dtype)


def naive_top_k(x: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    out = np.empty(x.shape[0], dtype=x.dtype)
    for i in range(x.shape[0]):
        true = x[i, labels[i]]
        above = sum(1 for v in x[i] if v > true)
        out[i] = 1.0 if above >= k else 0.0
    return out


def make_labels(r: np.random.Generator, b: int, k: int) -> np.ndarray:
    """Random labels that include the boundary classes 0 and K-1."""
    y = r.integers(0, k, size=b)
    y[0] = 0
    if b > 1:
        y[-1] = k - 1
    return y.astype(np.int64)


def make_soft(r: np.random.Generator, b: int, k: int, dtype: str) -> np.ndarray:
    t = r.random((b, k)) + 0.05
    t /= t.sum(axis=1, keepdims=True)
    return t.astype(dtype)


def sce(x, t):
    return softmax_cross_entropy(x, t)


def sce_grad(g, x, t):
    return SoftmaxCrossEntropyGrad()(g, x, t)


# --------------------------------------------------------------------------
# forward values (and inferred shape)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b", [1, 3, 129])
@pytest.mark.parametrize("k", [1, 2, 1000])
def test_forward_int_labels(b, k, dtype):
    r = rng(b * 1000 + k)
    x = (r.normal(size=(b, k)) * 3).astype(dtype)
    y = make_labels(r, b, k)
    check_op(
        sce,
        [x, y],
        naive_loss,
        label=f"sce labels b{b} k{k} {dtype}",
        names=["logits", "labels"],
        wrt=(),
        op_class=SoftmaxCrossEntropy,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,k", [(1, 1), (3, 2), (129, 7), (5, 1000)])
def test_forward_soft_targets(b, k, dtype):
    r = rng(b * 1000 + k + 1)
    x = (r.normal(size=(b, k)) * 3).astype(dtype)
    t = make_soft(r, b, k, dtype)
    check_op(
        sce,
        [x, t],
        naive_loss,
        label=f"sce soft b{b} k{k} {dtype}",
        names=["logits", "targets"],
        wrt=(),
        op_class=SoftmaxCrossEntropy,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_imagenet_22k_classes(dtype):
    r = rng(21841)
    x = (r.normal(size=(3, 21841)) * 4).astype(dtype)
    y = np.array([0, 12345, 21840], dtype=np.int64)
    check_op(
        sce, [x, y], naive_loss, label=f"sce k21841 {dtype}", wrt=(), check_shape=False
    )
    t = make_soft(r, 3, 21841, dtype)
    check_op(
        sce,
        [x, t],
        naive_loss,
        label=f"sce soft k21841 {dtype}",
        wrt=(),
        check_shape=False,
    )


def test_one_hot_targets_equal_labels():
    r = rng(7)
    x = r.normal(size=(6, 5))
    y = make_labels(r, 6, 5)
    onehot = np.eye(5)[y]
    np.testing.assert_allclose(
        softmax_cross_entropy_reference(x, onehot),
        softmax_cross_entropy_reference(x, y),
        rtol=1e-12,
    )
    g = r.normal(size=6)
    np.testing.assert_allclose(
        softmax_cross_entropy_grad_reference(g, x, onehot),
        softmax_cross_entropy_grad_reference(g, x, y),
        rtol=1e-12,
        atol=1e-15,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_huge_logits_are_stable(dtype):
    """Logits of +-1e4 give finite losses and gradients, equal to float64 loops."""
    x = np.array(
        [[1e4, -1e4, 0.0, 5.0], [-1e4, -1e4, -1e4, -1e4], [1e4, 1e4, -1e4, 3.0]],
        dtype=dtype,
    )
    y = np.array([1, 2, 0], dtype=np.int64)
    t = make_soft(rng(3), 3, 4, dtype)
    g = np.array([1.0, -2.0, 0.5], dtype=dtype)
    for targets in (y, t):
        got = check_op(sce, [x, targets], naive_loss, label=f"huge {dtype}", wrt=())
        assert np.all(np.isfinite(got))
        dx = check_op(
            sce_grad, [g, x, targets], naive_grad, label=f"huge grad {dtype}", wrt=()
        )
        assert np.all(np.isfinite(dx))
    # hand-checked values: row 0 picks -1e4 against a 1e4 maximum
    loss = softmax_cross_entropy_reference(x, y)
    assert loss.dtype == np.dtype(dtype)
    np.testing.assert_allclose(loss, [2e4, math.log(4.0), math.log(2.0)], rtol=1e-6)


# --------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,k", [(1, 1), (3, 4), (4, 2)])
def test_pullback_int_labels(b, k, dtype):
    r = rng(10 + b + k)
    x = r.normal(size=(b, k)).astype(dtype)
    y = make_labels(r, b, k)
    check_op(sce, [x, y], naive_loss, label=f"sce grad b{b} k{k} {dtype}", wrt=[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_pullback_soft_targets(dtype):
    r = rng(11)
    x = r.normal(size=(3, 4)).astype(dtype)
    t = make_soft(r, 3, 4, dtype)
    check_op(
        sce,
        [x, t],
        naive_loss,
        label=f"sce soft grad {dtype}",
        names=["logits", "targets"],
        wrt=[0, 1],
    )


def test_pullback_builds_fused_grad_op():
    x = pt.matrix("x")
    y = pt.lvector("y")
    t = pt.matrix("t")
    (dx,) = pytensor.grad(softmax_cross_entropy(x, y).sum(), [x])
    assert isinstance(dx.owner.op, SoftmaxCrossEntropyGrad)
    dx, dt = pytensor.grad(softmax_cross_entropy(x, t).sum(), [x, t])
    assert isinstance(dx.owner.op, SoftmaxCrossEntropyGrad)
    # integer labels are disconnected from the loss
    with pytest.raises(pytensor.gradient.DisconnectedInputError):
        pytensor.grad(softmax_cross_entropy(x, y).sum(), [y])
    f = pytensor.function([x, t], dt, mode=TEST_MODE)
    xv = rng(12).normal(size=(2, 3))
    tv = make_soft(rng(13), 2, 3, "float64")
    np.testing.assert_allclose(
        f(xv, tv), -np.stack([naive_log_softmax_row(row) for row in xv]), rtol=1e-12
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,k", [(1, 3), (3, 4), (129, 5)])
def test_grad_op_forward(b, k, dtype):
    r = rng(20 + b + k)
    x = (r.normal(size=(b, k)) * 2).astype(dtype)
    g = r.normal(size=b).astype(dtype)
    y = make_labels(r, b, k)
    t = make_soft(r, b, k, dtype)
    for targets, kind in ((y, "labels"), (t, "soft")):
        check_op(
            sce_grad,
            [g, x, targets],
            naive_grad,
            label=f"sce_grad {kind} b{b} k{k} {dtype}",
            wrt=(),
            op_class=SoftmaxCrossEntropyGrad,
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_second_derivatives_int_labels(dtype):
    r = rng(30)
    x = r.normal(size=(3, 4)).astype(dtype)
    g = r.normal(size=3).astype(dtype)
    y = make_labels(r, 3, 4)
    check_op(
        sce_grad,
        [g, x, y],
        naive_grad,
        label=f"sce_grad labels {dtype}",
        names=["g", "logits", "labels"],
        wrt=[0, 1],
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_second_derivatives_soft_targets(dtype):
    r = rng(31)
    x = r.normal(size=(3, 4)).astype(dtype)
    g = r.normal(size=3).astype(dtype)
    # targets that do not sum to one exercise the sum_k t_k factor
    t = (r.random((3, 4)) * 2).astype(dtype)
    check_op(
        sce_grad,
        [g, x, t],
        naive_grad,
        label=f"sce_grad soft {dtype}",
        names=["g", "logits", "targets"],
        wrt=[0, 1, 2],
    )


def test_hessian_of_loss():
    """d2 loss / dx2 through SoftmaxCrossEntropyGrad's pullback, vs a formula."""
    x = pt.vector("x")
    y = pt.constant(np.array([2], dtype=np.int64))
    loss = softmax_cross_entropy(x[None, :], y).sum()
    dx = pytensor.grad(loss, x)
    # row by row: pytensor.gradient.hessian would build a Scan
    h = pt.stack([pytensor.grad(dx[i], x) for i in range(5)])
    xv = rng(32).normal(size=5)
    p = np.exp(naive_log_softmax_row(xv))
    np.testing.assert_allclose(
        pytensor.function([x], h, mode=TEST_MODE)(xv),
        np.diag(p) - np.outer(p, p),
        rtol=1e-10,
        atol=1e-12,
    )


# --------------------------------------------------------------------------
# top-k error
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 5])
def test_top_k_error(k, dtype):
    r = rng(40 + k)
    # few distinct values: many ties, some with the true class
    x = r.integers(0, 4, size=(129, 10)).astype(dtype)
    y = make_labels(r, 129, 10)
    got = check_op(
        lambda a, b: top_k_error(a, b, k=k),
        [x, y],
        lambda a, b: naive_top_k(a, b, k),
        label=f"top{k} {dtype}",
        wrt=(),
        op_class=TopKError,
    )
    assert 0 < got.sum() < 129


def test_top_k_tie_rule_by_hand():
    x = np.array(
        [
            [1.0, 3.0, 3.0, 0.0],  # label 1 ties with 2 for the top: correct at k=1
            [3.0, 2.0, 2.0, 2.0],  # label 3: one class above, three tied
            [5.0, 4.0, 3.0, 2.0],  # label 3: three classes above
        ]
    )
    y = np.array([1, 3, 3])
    np.testing.assert_array_equal(top_k_error_reference(x, y, 1), [0.0, 1.0, 1.0])
    np.testing.assert_array_equal(top_k_error_reference(x, y, 2), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(top_k_error_reference(x, y, 3), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(top_k_error_reference(x, y, 4), [0.0, 0.0, 0.0])
    # k larger than K: always correct
    np.testing.assert_array_equal(top_k_error_reference(x, y, 50), [0.0, 0.0, 0.0])


def test_top_k_gradient_is_zero():
    x = pt.matrix("x")
    y = pt.lvector("y")
    err = top_k_error(x, y, k=2).sum()
    dx = pytensor.grad(err, x)
    xv = rng(41).normal(size=(4, 6))
    f = pytensor.function([x, y], dx, mode=TEST_MODE, on_unused_input="ignore")
    got = f(xv, np.array([0, 1, 2, 5]))
    np.testing.assert_array_equal(got, np.zeros((4, 6)))
    with pytest.raises(pytensor.gradient.DisconnectedInputError):
        pytensor.grad(err, y)


def test_top_k_props():
    assert TopKError(k=1) == TopKError(k=1)
    assert hash(TopKError(k=5)) == hash(TopKError(k=5))
    assert TopKError(k=1) != TopKError(k=5)
    with pytest.raises(TypeError):
        TopKError(5)  # keyword-only


@pytest.mark.parametrize("k", [0, -1])
def test_top_k_bad_k_value(k):
    with pytest.raises(ValueError, match=rf"TopKError: k must be >= 1, got {k}"):
        top_k_error(pt.matrix(), pt.lvector(), k=k)
    with pytest.raises(ValueError, match=rf"TopKError: k must be >= 1, got {k}"):
        top_k_error_reference(np.zeros((2, 3)), np.zeros(2, dtype=int), k)


@pytest.mark.parametrize("k", [1.5, "2", True])
def test_top_k_bad_k_type(k):
    with pytest.raises(TypeError, match="TopKError: k must be an int"):
        TopKError(k=k)


# --------------------------------------------------------------------------
# labels out of range, at run time
# --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 5])
def test_labels_out_of_range_raise_at_run_time(bad):
    x = pt.matrix("x")
    y = pt.lvector("y")
    g = pt.vector("g")
    xv = np.zeros((3, 5))
    yv = np.array([0, 4, bad])
    msg = f"labels must be in [0, K) = [0, 5), got {bad} at row 2"
    cases = [
        ("SoftmaxCrossEntropy", [x, y], softmax_cross_entropy(x, y), [xv, yv]),
        (
            "SoftmaxCrossEntropyGrad",
            [g, x, y],
            SoftmaxCrossEntropyGrad()(g, x, y),
            [np.ones(3), xv, yv],
        ),
        ("TopKError", [x, y], top_k_error(x, y, k=1), [xv, yv]),
    ]
    for op, ins, out, vals in cases:
        f = pytensor.function(ins, out, mode=TEST_MODE)  # builds fine
        expect_error(ValueError, f"{op}: {msg}", f, *vals)


def test_runtime_shape_mismatches():
    x = pt.matrix("x")
    y = pt.lvector("y")
    t = pt.matrix("t")
    g = pt.vector("g")
    f = pytensor.function([x, y], softmax_cross_entropy(x, y), mode=TEST_MODE)
    expect_error(
        ValueError,
        "SoftmaxCrossEntropy: labels must have one entry per row of logits (B = 3), "
        "got 2",
        f,
        np.zeros((3, 4)),
        np.array([0, 1]),
    )
    f = pytensor.function([x, t], softmax_cross_entropy(x, t), mode=TEST_MODE)
    expect_error(
        ValueError,
        "SoftmaxCrossEntropy: soft targets must have the logits' shape (B, K) = "
        "(3, 4), got (3, 5)",
        f,
        np.zeros((3, 4)),
        np.zeros((3, 5)),
    )
    f = pytensor.function([g, x, y], sce_grad(g, x, y), mode=TEST_MODE)
    expect_error(
        ValueError,
        "SoftmaxCrossEntropyGrad: g must have one entry per row of logits (B = 3), "
        "got 4",
        f,
        np.zeros(4),
        np.zeros((3, 4)),
        np.array([0, 1, 2]),
    )
    with pytest.raises(ValueError, match=r"at least one class \(K >= 1\)"):
        softmax_cross_entropy_reference(np.zeros((2, 0)), np.zeros(2, dtype=int))


# --------------------------------------------------------------------------
# bad inputs at graph-building time
# --------------------------------------------------------------------------


def test_bad_logits():
    y = pt.lvector()
    with pytest.raises(
        TypeError, match=r"SoftmaxCrossEntropy: logits must have 2 dims \(B, K\), got 3"
    ):
        SoftmaxCrossEntropy()(pt.tensor3(), y)
    with pytest.raises(
        TypeError,
        match="SoftmaxCrossEntropy: logits must be float32 or float64, got int64",
    ):
        SoftmaxCrossEntropy()(pt.lmatrix(), y)
    with pytest.raises(ValueError, match=r"at least one class \(K >= 1\)"):
        SoftmaxCrossEntropy()(pt.tensor(shape=(None, 0)), y)


def test_bad_targets():
    x = pt.matrix()
    with pytest.raises(
        TypeError,
        match=r"SoftmaxCrossEntropy: integer targets \(labels\) must have 1 dim "
        r"\(B,\), got 2",
    ):
        SoftmaxCrossEntropy()(x, pt.lmatrix())
    with pytest.raises(
        TypeError,
        match=r"SoftmaxCrossEntropy: float targets \(probabilities\) must have 2 dims "
        r"\(B, K\), got 1",
    ):
        SoftmaxCrossEntropy()(x, pt.vector())
    with pytest.raises(
        TypeError,
        match="SoftmaxCrossEntropy: inputs must share one float dtype, got logits "
        "float64, targets float32",
    ):
        SoftmaxCrossEntropy()(x, pt.fmatrix())
    with pytest.raises(
        TypeError, match="SoftmaxCrossEntropy: targets must be integer labels"
    ):
        SoftmaxCrossEntropy()(x, pt.bvector().astype("bool"))


def test_static_shape_mismatches():
    x = pt.tensor("x", shape=(3, 4))
    with pytest.raises(
        ValueError,
        match=r"SoftmaxCrossEntropy: labels must match the logits \(B, K\) = \(3, 4\), "
        r"got shape \(2,\)",
    ):
        SoftmaxCrossEntropy()(x, pt.tensor(dtype="int64", shape=(2,)))
    with pytest.raises(
        ValueError,
        match=r"SoftmaxCrossEntropy: soft targets must match the logits \(B, K\) = "
        r"\(3, 4\), got shape \(3, 5\)",
    ):
        SoftmaxCrossEntropy()(x, pt.tensor(shape=(3, 5)))
    with pytest.raises(
        ValueError,
        match=r"SoftmaxCrossEntropyGrad: g must have one entry per row of logits "
        r"\(B = 3\), got shape \(4,\)",
    ):
        SoftmaxCrossEntropyGrad()(pt.tensor(shape=(4,)), x, pt.lvector())
    with pytest.raises(
        ValueError,
        match=r"TopKError: labels must have one entry per row of logits \(B = 3\)",
    ):
        TopKError(k=1)(x, pt.tensor(dtype="int32", shape=(5,)))


def test_bad_grad_op_inputs():
    x = pt.matrix()
    y = pt.lvector()
    with pytest.raises(
        TypeError, match=r"SoftmaxCrossEntropyGrad: g must have 1 dim \(B,\), got 2"
    ):
        SoftmaxCrossEntropyGrad()(pt.matrix(), x, y)
    with pytest.raises(
        TypeError,
        match="SoftmaxCrossEntropyGrad: inputs must share one float dtype, got g "
        "float32, logits float64",
    ):
        SoftmaxCrossEntropyGrad()(pt.fvector(), x, y)


def test_bad_top_k_labels():
    x = pt.matrix()
    with pytest.raises(
        TypeError, match="TopKError: labels must have an integer dtype, got float64"
    ):
        top_k_error(x, pt.vector())
    with pytest.raises(TypeError, match=r"TopKError: labels must have 1 dim \(B,\)"):
        top_k_error(x, pt.lmatrix())


def test_builder_upcasts_float_targets():
    x = pt.fmatrix("x")
    t = pt.matrix("t")
    loss = softmax_cross_entropy(x, t)
    assert loss.type.dtype == "float64"
    assert softmax_cross_entropy(x, pt.ivector()).type.dtype == "float32"
    # lists of ints are labels
    xv = rng(50).normal(size=(2, 3)).astype("float32")
    f = pytensor.function([x], softmax_cross_entropy(x, [2, 0]), mode=TEST_MODE)
    np.testing.assert_allclose(f(xv), naive_loss(xv, np.array([2, 0])), rtol=1e-5)


def test_static_shape_propagates():
    x = pt.tensor("x", shape=(7, 5))
    y = pt.lvector("y")
    assert softmax_cross_entropy(x, y).type.shape == (7,)
    assert SoftmaxCrossEntropyGrad()(pt.vector(), x, y).type.shape == (7, 5)
    assert top_k_error(
        pt.matrix(), pt.tensor(dtype="int64", shape=(4,))
    ).type.shape == (4,)


def test_references_keep_float32():
    r = rng(60)
    x = r.normal(size=(4, 6)).astype("float32")
    y = make_labels(r, 4, 6)
    g = np.ones(4, dtype="float32")
    assert softmax_cross_entropy_reference(x, y).dtype == np.float32
    assert softmax_cross_entropy_grad_reference(g, x, y).dtype == np.float32
    assert top_k_error_reference(x, y, 1).dtype == np.float32
    with pytest.raises(TypeError, match="soft targets must have the logits' dtype"):
        softmax_cross_entropy_reference(x, x.astype("float64"))


# --------------------------------------------------------------------------
# PyTensor's default (Numba) linker: the ops run in object mode
# --------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Numba will use object mode")
def test_default_mode():
    x = pt.matrix("x")
    y = pt.lvector("y")
    loss = softmax_cross_entropy(x, y)
    outs = [loss, pytensor.grad(loss.sum(), x), top_k_error(x, y, k=2)]
    f = pytensor.function([x, y], outs)  # the default mode
    r = rng(70)
    xv = r.normal(size=(5, 4))
    yv = make_labels(r, 5, 4)
    got = f(xv, yv)
    np.testing.assert_allclose(got[0], naive_loss(xv, yv), rtol=1e-10)
    np.testing.assert_allclose(got[1], naive_grad(np.ones(5), xv, yv), atol=1e-12)
    np.testing.assert_array_equal(got[2], naive_top_k(xv, yv, 2))
    expect_error(ValueError, "got 4 at row 0", f, xv, np.array([4, 0, 0, 0, 0]))
