"""Hand-written cross-entropy graphs compile to the fused softmax-loss ops.

Every case compiles the naive graph with the fusion (``cc2ops.mode.mode``,
and PyTensor's default mode in a few) and without it
(``mode.excluding("cc2ops_fuse_softmax_loss")``), and checks both the
structure (fused ops present and no softmax work left; the unfused graph has
no fused op, so the structure assertions fail when the rewrite is removed)
and the values of the loss and of its gradients.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import rng
from pytensor.compile.mode import get_default_mode
from pytensor.graph.traversal import ancestors

import cc2ops.rewriting.fuse_softmax_loss  # noqa: F401  (registers the rules)
from cc2ops.mode import mode as CC2OPS_MODE
from cc2ops.softmax_cross_entropy import SoftmaxCrossEntropy

UNFUSED = CC2OPS_MODE.excluding("cc2ops_fuse_softmax_loss")

B, K = 5, 7

# --------------------------------------------------------------------------
# graph inspection
# --------------------------------------------------------------------------

_SOFTMAX_OPS = {"Softmax", "LogSoftmax", "SoftmaxGrad", "LogSoftmaxGrad"}
_SOFTMAX_SCALARS = {"Exp", "Log", "Softplus", "Log1p"}


def _op_names(fgraph) -> set[str]:
    """Op class names in ``fgraph``, looking inside fused and composite ops.

    PyTensor 3.3 inlines Softmax/LogSoftmax into fused elementwise kernels
    (exp/log scalars inside ``FusedElemwise`` or ``Composite``), so the
    softmax's work is recognised by its scalar ops too.
    """
    names: set[str] = set()
    for node in fgraph.apply_nodes:
        op = node.op
        names.add(type(op).__name__)
        scalar = getattr(op, "scalar_op", None)
        if scalar is not None:
            names.add(type(scalar).__name__)
            if getattr(scalar, "fgraph", None) is not None:
                names |= _op_names(scalar.fgraph)
        inner = getattr(op, "fgraph", None)
        if inner is not None:
            names |= _op_names(inner)
    return names


def fused_names(fn) -> set[str]:
    return _op_names(fn.maker.fgraph)


def assert_fused_forward(fn, label):
    names = fused_names(fn)
    assert "SoftmaxCrossEntropy" in names, f"{label}: forward not fused: {names}"
    left = names & (_SOFTMAX_OPS | _SOFTMAX_SCALARS)
    assert not left, f"{label}: softmax work left in the forward: {left}"


def assert_fused_grad(fn, label):
    names = fused_names(fn)
    assert "SoftmaxCrossEntropyGrad" in names, f"{label}: gradient not fused: {names}"
    left = names & (_SOFTMAX_OPS | _SOFTMAX_SCALARS)
    assert not left, f"{label}: softmax work left in the gradient: {left}"


def assert_not_fused(fn, label):
    names = fused_names(fn)
    present = names & {"SoftmaxCrossEntropy", "SoftmaxCrossEntropyGrad"}
    assert not present, f"{label}: fused op present: {present}"


# --------------------------------------------------------------------------
# the naive forms
# --------------------------------------------------------------------------


def _log_softmax_pick(x, y, t):
    return -pt.special.log_softmax(x, axis=1)[pt.arange(x.shape[0]), y]


def _log_of_softmax_pick(x, y, t):
    return -pt.log(pt.special.softmax(x, axis=-1))[pt.arange(x.shape[0]), y]


def _log_after_pick(x, y, t):
    return -pt.log(pt.special.softmax(x, axis=1)[pt.arange(x.shape[0]), y])


def _minus_before_pick(x, y, t):
    return (-pt.log(pt.special.softmax(x, axis=1)))[pt.arange(x.shape[0]), y]


def _labels_length_rows(x, y, t):
    return -pt.special.log_softmax(x, axis=1)[pt.arange(y.shape[0]), y]


def _take_along_axis(x, y, t):
    ls = pt.special.log_softmax(x, axis=-1)
    return -pt.take_along_axis(ls, y[:, None], axis=1)[:, 0]


def _flat_index(x, y, t):
    ls = pt.special.log_softmax(x, axis=1)
    return -ls.flatten()[pt.arange(x.shape[0]) * x.shape[1] + y]


def _soft_log_softmax(x, y, t):
    return -(t * pt.special.log_softmax(x, axis=1)).sum(axis=1)


def _soft_log_of_softmax(x, y, t):
    return -(t * pt.log(pt.special.softmax(x, axis=-1))).sum(axis=-1)


FORMS = {
    "-log_softmax(x)[arange, y]": _log_softmax_pick,
    "-log(softmax(x))[arange, y]": _log_of_softmax_pick,
    "-log(softmax(x)[arange, y])": _log_after_pick,
    "(-log(softmax(x)))[arange, y]": _minus_before_pick,
    "-log_softmax(x)[arange(y.shape[0]), y]": _labels_length_rows,
    "take_along_axis": _take_along_axis,
    "flat index": _flat_index,
    "-(t * log_softmax(x)).sum(1)": _soft_log_softmax,
    "-(t * log(softmax(x))).sum(-1)": _soft_log_of_softmax,
}
REDUCTIONS = ("per-example", "mean", "sum")


def _values(dtype="float64", b=B, k=K, seed=0):
    r = rng(seed)
    x = (r.normal(size=(b, k)) * 2).astype(dtype)
    y = r.integers(0, k, size=b).astype(np.int64)
    y[0], y[-1] = 0, k - 1
    t = r.random((b, k)).astype(dtype)
    t /= t.sum(axis=1, keepdims=True)
    g = r.normal(size=b).astype(dtype)
    return x, y, t, g


def _symbols(dtype="float64"):
    return (
        pt.matrix("x", dtype=dtype),
        pt.lvector("y"),
        pt.matrix("t", dtype=dtype),
        pt.vector("g", dtype=dtype),
    )


def _cost_and_grad(form, reduction, x, y, t, g, wrt):
    per_example = form(x, y, t)
    if reduction == "per-example":
        # the per-example loss with an arbitrary cotangent g
        cost = per_example
        grads = pytensor.gradient.pullback(per_example, wrt, g)
    else:
        cost = getattr(per_example, reduction)()
        grads = pytensor.grad(cost, wrt)
    return cost, grads


def _compare(fused_fn, unfused_fn, args, label, rtol=1e-10, atol=1e-12):
    got = fused_fn(*args)
    want = unfused_fn(*args)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(
            a, b, rtol=rtol, atol=atol, err_msg=f"{label}: output {i}"
        )


# --------------------------------------------------------------------------
# every naive form x reduction, in cc2ops's mode
# --------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("form", list(FORMS))
def test_naive_form_fuses(form, reduction):
    label = f"{form} {reduction}"
    x, y, t, g = _symbols()
    cost, dx = _cost_and_grad(FORMS[form], reduction, x, y, t, g, x)
    ins = [x, y, t, g]
    kw = dict(on_unused_input="ignore")
    f_cost = pytensor.function(ins, cost, mode=CC2OPS_MODE, **kw)
    f_grad = pytensor.function(ins, dx, mode=CC2OPS_MODE, **kw)
    assert_fused_forward(f_cost, label)
    assert_fused_grad(f_grad, label)

    f_ref = pytensor.function(ins, [cost, dx], mode=UNFUSED, **kw)
    assert_not_fused(f_ref, f"{label} (rewrite excluded)")
    assert fused_names(f_ref) & (_SOFTMAX_OPS | _SOFTMAX_SCALARS), label

    args = _values()
    got = [f_cost(*args), f_grad(*args)]
    want = f_ref(*args)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=f"{label} {i}")


@pytest.mark.parametrize("form", ["-log_softmax(x)[arange, y]", "flat index"])
def test_cost_and_grad_in_one_function(form):
    """Forward and gradient compiled together share the fused forward."""
    x, y, t, g = _symbols()
    cost, dx = _cost_and_grad(FORMS[form], "mean", x, y, t, g, x)
    f = pytensor.function([x, y], [cost, dx], mode=CC2OPS_MODE)
    assert_fused_forward(f, form)
    assert_fused_grad(f, form)
    n_fwd = sum(
        isinstance(n.op, SoftmaxCrossEntropy) for n in f.maker.fgraph.apply_nodes
    )
    assert n_fwd == 1
    ref = pytensor.function([x, y], [cost, dx], mode=UNFUSED)
    xv, yv, _, _ = _values(seed=1)
    _compare(f, ref, [xv, yv], form)


@pytest.mark.parametrize("kind", ["labels", "soft"])
def test_affine_logits_and_all_parameter_gradients(kind):
    """x = dot(h, W) + b: the rewrite does not care what x is."""
    h = pt.matrix("h")
    w = pt.matrix("w")
    bias = pt.vector("bias")
    y = pt.lvector("y")
    t = pt.matrix("t")
    x = pt.dot(h, w) + bias
    form = _log_of_softmax_pick if kind == "labels" else _soft_log_of_softmax
    cost = form(x, y, t).mean()
    grads = pytensor.grad(cost, [h, w, bias])
    ins = [h, w, bias, y, t]
    f = pytensor.function(
        ins, [cost, *grads], mode=CC2OPS_MODE, on_unused_input="ignore"
    )
    assert "SoftmaxCrossEntropy" in fused_names(f)
    assert_fused_grad(f, f"affine {kind}")
    ref = pytensor.function(ins, [cost, *grads], mode=UNFUSED, on_unused_input="ignore")
    r = rng(2)
    hv = r.normal(size=(B, 4))
    wv = r.normal(size=(4, K))
    bv = r.normal(size=K)
    _, yv, tv, _ = _values(seed=2)
    _compare(f, ref, [hv, wv, bv, yv, tv], f"affine {kind}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float32_and_float64(dtype):
    x, y, t, g = _symbols(dtype)
    for form in ("-log_softmax(x)[arange, y]", "-(t * log_softmax(x)).sum(1)"):
        cost, dx = _cost_and_grad(FORMS[form], "mean", x, y, t, g, x)
        f = pytensor.function(
            [x, y, t], [cost, dx], mode=CC2OPS_MODE, on_unused_input="ignore"
        )
        assert_fused_forward(f, f"{form} {dtype}")
        assert_fused_grad(f, f"{form} {dtype}")
        assert f.maker.fgraph.outputs[0].type.dtype == dtype
        ref = pytensor.function(
            [x, y, t], [cost, dx], mode=UNFUSED, on_unused_input="ignore"
        )
        xv, yv, tv, _ = _values(dtype, seed=3)
        tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else {}
        _compare(f, ref, [xv, yv, tv], f"{form} {dtype}", **tol)


def test_constant_batch_size():
    """arange(5) with logits of static batch 5 (the index is a folded constant)."""
    x = pt.matrix("x", shape=(B, None))
    y = pt.lvector("y")
    cost = -pt.special.log_softmax(x, axis=1)[pt.arange(B), y].mean()
    dx = pytensor.grad(cost, x)
    f = pytensor.function([x, y], [cost, dx], mode=CC2OPS_MODE)
    assert_fused_forward(f, "constant arange")
    assert_fused_grad(f, "constant arange")
    ref = pytensor.function([x, y], [cost, dx], mode=UNFUSED)
    xv, yv, _, _ = _values(seed=4)
    _compare(f, ref, [xv, yv], "constant arange")


def test_single_static_label_is_broadcast():
    """A label vector of static length 1 broadcasts over the batch, as unfused."""
    x = pt.matrix("x")
    y = pt.lvector("y", shape=(1,))
    cost = -pt.special.log_softmax(x, axis=1)[pt.arange(x.shape[0]), y]
    dx = pytensor.grad(cost.sum(), x)
    f = pytensor.function([x, y], [cost, dx], mode=CC2OPS_MODE)
    assert_fused_forward(f, "broadcast label")
    assert_fused_grad(f, "broadcast label")
    ref = pytensor.function([x, y], [cost, dx], mode=UNFUSED)
    xv = _values(seed=5)[0]
    _compare(f, ref, [xv, np.array([3])], "broadcast label")


def test_advanced_subtensor1_flat_form():
    """PyTensor 3.0's one-vector indexing ops (3.3 has only the general ones)."""
    from pytensor.tensor import subtensor

    if not hasattr(subtensor, "AdvancedSubtensor1"):
        pytest.skip("this PyTensor has no AdvancedSubtensor1")
    x = pt.matrix("x")
    y = pt.lvector("y")
    flat = pt.special.log_softmax(x, axis=1).flatten()
    idx = pt.arange(x.shape[0]) * x.shape[1] + y
    cost = -subtensor.advanced_subtensor1(flat, idx).mean()
    dx = pytensor.grad(cost, x)
    naive_ops = {type(v.owner.op) for v in ancestors([cost, dx]) if v.owner}
    assert subtensor.AdvancedSubtensor1 in naive_ops
    assert subtensor.AdvancedIncSubtensor1 in naive_ops
    f = pytensor.function([x, y], [cost, dx], mode=CC2OPS_MODE)
    assert_fused_forward(f, "AdvancedSubtensor1")
    assert_fused_grad(f, "AdvancedSubtensor1")
    ref = pytensor.function([x, y], [cost, dx], mode=UNFUSED)
    xv, yv, _, _ = _values(seed=6)
    _compare(f, ref, [xv, yv], "AdvancedSubtensor1")


def test_second_derivative_after_fusion():
    """A graph holding second derivatives of the naive cost fuses to the same values.

    (The fused gradient op's own pullback is checked in test_softmax_cross_entropy.)
    """
    x = pt.matrix("x")
    y = pt.lvector("y")
    v = pt.matrix("v")
    cost = _log_softmax_pick(x, y, None).mean()
    dx = pytensor.grad(cost, x)
    hv = pytensor.grad((dx * v).sum(), x)
    f = pytensor.function([x, y, v], [dx, hv], mode=CC2OPS_MODE)
    ref = pytensor.function([x, y, v], [dx, hv], mode=UNFUSED)
    xv, yv, _, _ = _values(seed=7)
    vv = rng(8).normal(size=(B, K))
    _compare(f, ref, [xv, yv, vv], "hessian-vector")


# --------------------------------------------------------------------------
# graphs that are not (exactly) a cross-entropy must not fuse
# --------------------------------------------------------------------------


def _not_cross_entropy():
    x, y, t, g = _symbols()
    ls = pt.special.log_softmax(x, axis=1)
    n = x.shape[0]
    return {
        # rows other than arange(B): the reversed batch
        "reversed rows": -ls[pt.arange(n)[::-1], y],
        # a row count that is neither the batch size nor the labels' length
        # (here K - 2 = B; a negative count would make x[:n] wrong)
        "arange(K - 2)": -ls[pt.arange(x.shape[1] - 2), y],
        # rows that do not start at 0
        "arange(1, B)": -ls[pt.arange(1, n), y[1:]],
        # softmax over the batch axis
        "softmax axis 0": -pt.special.log_softmax(x, axis=0)[pt.arange(n), y],
        # log_softmax twice in one product: quadratic, not a cross-entropy
        "t * ls * ls": -(t * ls * ls).sum(axis=1),
        # a per-class sum over the batch (K,), not a per-example loss
        "soft sum axis 0": -(t * ls).sum(axis=0),
    }, (x, y, t, g)


@pytest.mark.parametrize(
    "case",
    [
        "reversed rows",
        "arange(K - 2)",
        "arange(1, B)",
        "softmax axis 0",
        "t * ls * ls",
        "soft sum axis 0",
    ],
)
def test_not_a_cross_entropy_does_not_fuse(case):
    costs, (x, y, t, g) = _not_cross_entropy()
    cost = costs[case]
    c = pt.vector("c")  # a cotangent for the (B,) or (K,) result
    dx = pytensor.gradient.pullback(cost, x, c)
    ins = [x, y, t, c]
    kw = dict(mode=CC2OPS_MODE, on_unused_input="ignore")
    assert_not_fused(pytensor.function(ins, cost, **kw), case)
    f_grad = pytensor.function(ins, dx, **kw)
    if case == "soft sum axis 0":
        # Its pullback still is the log-softmax pullback of a product cotangent,
        # gz = -t * c[None, :]: a (class-weighted) soft-target cross-entropy
        # gradient, which the identity rule fuses exactly.
        assert_fused_grad(f_grad, case)
    else:
        assert_not_fused(f_grad, case)
    f = pytensor.function(ins, [cost, dx], **kw)
    ref = pytensor.function(ins, [cost, dx], mode=UNFUSED, on_unused_input="ignore")
    xv, yv, tv, _ = _values(seed=9)
    cv = rng(10).normal(size={"soft sum axis 0": K, "arange(1, B)": B - 1}.get(case, B))
    _compare(f, ref, [xv, yv, tv, cv], case)


def test_constant_arange_shorter_than_batch_fuses_on_the_first_rows():
    """arange(B - 1) reads the first B - 1 rows: fused on x[:B - 1], same values."""
    x = pt.matrix("x", shape=(B, None))
    y = pt.lvector("y")
    cost = -pt.special.log_softmax(x, axis=1)[pt.arange(B - 1), y].sum()
    dx = pytensor.grad(cost, x)
    f = pytensor.function([x, y], [cost, dx], mode=CC2OPS_MODE)
    assert_fused_forward(f, "arange(B - 1)")
    assert_fused_grad(f, "arange(B - 1)")
    ref = pytensor.function([x, y], [cost, dx], mode=UNFUSED)
    xv, yv, _, _ = _values(seed=10)
    _compare(f, ref, [xv, yv[: B - 1]], "arange(B - 1)")
    assert not f(xv, yv[: B - 1])[1][B - 1].any()


def test_more_labels_than_rows_fails_as_unfused():
    """arange(y.shape[0]) past the batch: both graphs refuse to run."""
    x, y, t, g = _symbols()
    cost = _labels_length_rows(x, y, t).sum()
    xv, _, _, _ = _values(seed=14)
    yv = np.zeros(B + 1, dtype=np.int64)
    for mode in (CC2OPS_MODE, UNFUSED):
        f = pytensor.function([x, y], cost, mode=mode)
        with pytest.raises((IndexError, ValueError)):
            f(xv, yv)


def test_log_softmax_with_another_consumer():
    """The loss fuses; the other use of log_softmax and the gradient stay right."""
    x, y, t, g = _symbols()
    ls = pt.special.log_softmax(x, axis=1)
    xent = -ls[pt.arange(x.shape[0]), y]
    cost = xent.mean() + 0.1 * (ls**2).sum()
    dx = pytensor.grad(cost, x)
    f = pytensor.function([x, y], [cost, dx, ls], mode=CC2OPS_MODE)
    names = fused_names(f)
    assert "SoftmaxCrossEntropy" in names, names
    # the log-softmax cotangent mixes both terms: PyTensor's pullback stays
    assert "SoftmaxCrossEntropyGrad" not in names, names
    ref = pytensor.function([x, y], [cost, dx, ls], mode=UNFUSED)
    xv, yv, _, _ = _values(seed=11)
    _compare(f, ref, [xv, yv], "log_softmax with another consumer")


def test_out_of_range_label_raises_after_fusion():
    x, y, t, g = _symbols()
    cost = _log_softmax_pick(x, y, t).mean()
    f = pytensor.function([x, y], cost, mode=CC2OPS_MODE)
    xv = _values(seed=12)[0]
    bad = np.zeros(B, dtype=np.int64)
    bad[3] = K
    with pytest.raises(ValueError, match=rf"got {K} at row 3"):
        f(xv, bad)


# --------------------------------------------------------------------------
# PyTensor's default mode, once the rules are registered
# --------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Numba will use object mode")
@pytest.mark.parametrize(
    "form", ["-log(softmax(x))[arange, y]", "-(t * log_softmax(x)).sum(1)"]
)
def test_default_mode_fuses(form):
    x, y, t, g = _symbols()
    cost, dx = _cost_and_grad(FORMS[form], "mean", x, y, t, g, x)
    ins = [x, y, t]
    f = pytensor.function(ins, [cost, dx], mode=None, on_unused_input="ignore")
    assert_fused_forward(f, f"default mode {form}")
    assert_fused_grad(f, f"default mode {form}")
    ref = pytensor.function(ins, [cost, dx], mode=UNFUSED, on_unused_input="ignore")
    xv, yv, tv, _ = _values(seed=13)
    _compare(f, ref, [xv, yv, tv], f"default mode {form}")


# --------------------------------------------------------------------------
# Theano's family of cross-entropy expressions (theano/tensor/nnet/tests/
# test_nnet.py: test_get_rid_of_advanced_indexing_version_of_xent,
# test_xent_thing_int32, test_optimize_xent_vector*, the scaled-cost test; and
# the Deep Learning Tutorials' cost), each checked output by output in one
# compiled function per group
# --------------------------------------------------------------------------

#: What the naive graph computes and a fused one must not: softmax work and
#: the picks and one-hot scatters of advanced indexing.
_NAIVE_OPS = (
    _SOFTMAX_OPS
    | _SOFTMAX_SCALARS
    | {"AdvancedSubtensor", "AdvancedSubtensor1"}
    | {"AdvancedIncSubtensor", "AdvancedIncSubtensor1"}
)


def _names_above(fgraph, out) -> set[str]:
    """Op names (inside composites too) of every node that ``out`` depends on."""
    nodes = [v.owner for v in ancestors([out]) if v.owner is not None]
    names: set[str] = set()
    for node in nodes:
        names.add(type(node.op).__name__)
        for op in (getattr(node.op, "scalar_op", None), node.op):
            inner = getattr(op, "fgraph", None)
            if inner is not None:
                names |= _op_names(inner)
            if op is not None and op is not node.op:
                names.add(type(op).__name__)
    return names


def assert_each_output_fused(fn, labels):
    """Each output is computed by the fused op of its kind, with no naive op."""
    fgraph = fn.maker.fgraph
    for out, label in zip(fgraph.outputs, labels, strict=True):
        names = _names_above(fgraph, out)
        want = (
            "SoftmaxCrossEntropyGrad"
            if label.startswith("d")
            else "SoftmaxCrossEntropy"
        )
        assert want in names, f"{label}: not fused: {sorted(names)}"
        left = names & _NAIVE_OPS
        assert not left, f"{label}: naive ops left: {sorted(left)}"


def _theano_spellings(p, rows, y, reduce):
    """Theano's four spellings of the cross-entropy of probabilities ``p``."""
    return {
        f"{reduce.__name__}(-log(p[rows, y]))": reduce(-pt.log(p[rows, y])),
        f"-{reduce.__name__}(log(p[rows, y]))": -reduce(pt.log(p[rows, y])),
        f"-{reduce.__name__}(log(p)[rows, y])": -reduce(pt.log(p)[rows, y]),
        f"{reduce.__name__}(-log(p)[rows, y])": reduce((-pt.log(p))[rows, y]),
    }


def _scaled_spellings(p, rows, y, a):
    """The scaled costs of Theano's dxcale test, sum and mean."""
    out = {}
    for r in (pt.sum, pt.mean):
        n = r.__name__
        for where, pick in (
            ("log(p[rows, y])", lambda: pt.log(p[rows, y])),
            ("log(p)[rows, y]", lambda: pt.log(p)[rows, y]),
        ):
            out[f"a * {n}(-{where})"] = a * r(-pick())
            out[f"-a * {n}({where})"] = -a * r(pick())
            out[f"a * (-{n}({where}))"] = a * (-r(pick()))
            out[f"a * {n}({where})"] = a * r(pick())
    return out


#: PyTensor's own unfused gradient of ``mean((-log(p))[arange(n), y])`` is off
#: by float32 rounding (about 1e-8 relative) where the fused one is exact.
_FAMILY_TOL = dict(rtol=1e-7, atol=1e-12)


def _check_family(ins, costs, wrt, values, mode=CC2OPS_MODE):
    """Compile every cost and its gradients fused and unfused; check both."""
    outs, labels = [], []
    for name, cost in costs.items():
        outs.append(cost)
        labels.append(name)
        for w in wrt:
            if w not in ancestors([cost]):
                continue
            outs.append(pytensor.grad(cost, w))
            labels.append(f"d/d{w.name} {name}")
    kw = dict(on_unused_input="ignore")
    fused = pytensor.function(ins, outs, mode=mode, **kw)
    assert_each_output_fused(fused, labels)
    unfused = mode.excluding("cc2ops_fuse_softmax_loss")
    ref = pytensor.function(ins, outs, mode=unfused, **kw)
    assert _names_above(ref.maker.fgraph, ref.maker.fgraph.outputs[0]) & _NAIVE_OPS
    for args in values:
        got, want = fused(*args), ref(*args)
        for a, b, label in zip(got, want, labels, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype, label
            np.testing.assert_allclose(a, b, **_FAMILY_TOL, err_msg=label)


def _family_values(b, k, n_labels, seed, *, dtype="float64", label_dtype="int64"):
    r = rng(seed)
    x = (r.normal(size=(b, k)) * 2).astype(dtype)
    bias = r.normal(size=k).astype(dtype)
    y = r.integers(0, k, size=n_labels).astype(label_dtype)
    return x, bias, y


def _rows(spelling, x, y):
    """``arange(x.shape[0])`` or Theano's ``arange(y.shape[0])``."""
    return pt.arange((x if spelling == "x.shape[0]" else y).shape[0])


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("labels", ["int64", "int32", "cast int32"])
@pytest.mark.parametrize("rows", ["x.shape[0]", "y.shape[0]"])
def test_theano_xent_family(rows, labels, bias):
    """Sum and mean of Theano's four spellings, gradients wrt x (and b)."""
    x = pt.matrix("x")
    b = pt.vector("b")
    y_in = pt.ivector("y") if labels == "int32" else pt.lvector("y")
    y = pt.cast(y_in, "int32") if labels == "cast int32" else y_in
    costs = {}
    for i, reduce in enumerate((pt.sum, pt.mean)):
        # Theano's bias tests alternate x + b and b + x
        logits = (x + b if i == 0 else b + x) if bias else x
        p = pt.special.softmax(logits, axis=-1)
        costs.update(_theano_spellings(p, _rows(rows, x, y), y, reduce))
    wrt = [x, b] if bias else [x]
    dtype = "int32" if labels == "int32" else "int64"
    values = [_family_values(4, 5, 4, seed=20, label_dtype=dtype)]
    if rows == "y.shape[0]":
        # fewer labels than rows: the naive graph reads the first len(y) rows
        values.append(_family_values(4, 5, 3, seed=21, label_dtype=dtype))
    _check_family([x, b, y_in], costs, wrt, values)


@pytest.mark.parametrize("rows", ["x.shape[0]", "y.shape[0]"])
def test_theano_scaled_costs(rows):
    """a * sum(...), -a * sum(...), a * (-sum(...)), a * sum(log ...), and means."""
    x = pt.matrix("x")
    y = pt.lvector("y")
    a = pt.scalar("a")
    p = pt.special.softmax(x, axis=-1)
    costs = _scaled_spellings(p, _rows(rows, x, y), y, a)
    xv, _, yv = _family_values(3, 5, 3, seed=22)
    values = [(xv, yv, 0.1), (xv, yv, -2.5)]
    if rows == "y.shape[0]":
        values.append((_family_values(4, 5, 2, seed=23)[0], yv[:2], 0.7))
    _check_family([x, y, a], costs, [x], values)


def _vector_labels(kind, y_in):
    if kind == "lvector":
        return y_in
    if kind == "flatten":  # test_optimize_xent_vector3
        return y_in.flatten()
    return pt.specify_shape(y_in, (1,))  # test_optimize_xent_vector4


@pytest.mark.parametrize("labels", ["lvector", "flatten", "specify_shape (1,)"])
@pytest.mark.parametrize("row", ["shape_padleft", "[None, :], axis=-1"])
def test_theano_vector_logits(row, labels):
    """Vector logits made a (1, K) row (Theano's softmax of a vector), batch 1."""
    x = pt.vector("x")
    b = pt.vector("b")
    y_in = pt.lvector("y")
    y = _vector_labels(labels, y_in)

    def as_row(v):
        if row == "shape_padleft":
            return pt.special.softmax(pt.shape_padleft(v))  # axis=None
        return pt.special.softmax(v[None, :], axis=-1)

    costs = {}
    for name, logits in (("x", x), ("x + b", x + b)):
        spellings = _theano_spellings(as_row(logits), pt.arange(y.shape[0]), y, pt.sum)
        costs.update({f"{k} of {name}": v for k, v in spellings.items()})
    r = rng(24)
    values = [(r.normal(size=5), r.normal(size=5), np.array([2]))]
    _check_family([x, b, y_in], costs, [x, b], values)


@pytest.mark.filterwarnings("ignore:Numba will use object mode")
@pytest.mark.parametrize("mode", ["cc2ops", "default"])
def test_deep_learning_tutorial_cost(mode):
    """LogisticRegression.negative_log_likelihood of the Deep Learning Tutorials."""
    inp = pt.matrix("input")
    w = pt.matrix("W")
    b = pt.vector("b")
    y = pt.ivector("y")
    p_y_given_x = pt.special.softmax(pt.dot(inp, w) + b, axis=-1)
    cost = -pt.mean(pt.log(p_y_given_x)[pt.arange(y.shape[0]), y])
    r = rng(25)
    values = [
        (r.normal(size=(6, 4)), r.normal(size=(4, 3)), r.normal(size=3), y_v)
        for y_v in (r.integers(0, 3, size=6, dtype=np.int32),)
    ]
    m = CC2OPS_MODE if mode == "cc2ops" else get_default_mode()
    _check_family([inp, w, b, y], {"nll": cost}, [w, b], values, mode=m)


@pytest.mark.filterwarnings("ignore:Numba will use object mode")
def test_default_mode_fuses_vector_logits_and_scaled_costs():
    """PyTensor's default mode picks up the new idioms too."""
    x = pt.matrix("x")
    v = pt.vector("v")
    y = pt.lvector("y")
    a = pt.scalar("a")
    p = pt.special.softmax(x, axis=-1)
    rows = pt.arange(y.shape[0])
    costs = {
        "a * sum(-log(p[rows, y]))": a * pt.sum(-pt.log(p[rows, y])),
        "vector sum(-log(p[rows, y]))": pt.sum(
            -pt.log(pt.special.softmax(pt.shape_padleft(v))[rows, y])
        ),
    }
    r = rng(26)
    # one label: the vector logits' batch, and the first row of the matrix's
    values = [(r.normal(size=(3, 4)), r.normal(size=4), np.array([1]), 0.5)]
    values.append((values[0][0], values[0][1], np.array([3]), -1.5))
    _check_family([x, v, y, a], costs, [x, v], values, mode=get_default_mode())


def test_single_static_label_over_a_row_prefix():
    """arange(3) with one static label: the label repeats over the first 3 rows."""
    x = pt.matrix("x")
    y = pt.lvector("y", shape=(1,))
    cost = -pt.special.log_softmax(x, axis=1)[pt.arange(3), y]
    dx = pytensor.gradient.pullback(cost, x, pt.ones(3))
    f = pytensor.function([x, y], [cost, dx], mode=CC2OPS_MODE)
    assert_fused_forward(pytensor.function([x, y], cost, mode=CC2OPS_MODE), "arange(3)")
    assert_fused_grad(f, "arange(3)")
    ref = pytensor.function([x, y], [cost, dx], mode=UNFUSED)
    xv = _values(seed=15)[0]
    _compare(f, ref, [xv, np.array([2])], "arange(3), one label")
    for fn in (f, ref):  # two rows: too few for arange(3), fused or not
        with pytest.raises((IndexError, ValueError)):
            fn(xv[:2], np.array([2]))
