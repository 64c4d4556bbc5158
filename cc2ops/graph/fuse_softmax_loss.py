"""Rewrite hand-written softmax cross-entropy graphs into the fused cc2ops ops.

The rules live in :data:`cc2ops.graph.db.fuse_softmax_loss_db` (tags
``fast_run`` and ``cc2ops``), which runs at position 1.55 of PyTensor's
``optdb``: after ``canonicalize`` (negation is then ``mul(-1, .)``, shapes are
``Shape_i``, constant ``arange`` s are folded) and ``stabilize`` (which turns
``log(softmax(x))`` into ``log_softmax(x)``, lifting subtensors out of the
way), and before ``specialize``. In what follows ``LS`` is
``LogSoftmax{axis=1}`` and ``SM`` ``Softmax{axis=1}`` of a 2-d ``x`` (B, K)
(``axis=-1`` is the same op), ``rows`` is ``arange(B)`` written either as
``ARange(0, n, 1)`` with ``n`` provably the number of rows of ``x`` (its
``Shape_i{0}``, the same shape-feature entry, or the same constant) or as the
folded constant ``[0, 1, ..., B-1]`` with ``B`` the static batch size.

Forward rules (each replaces the log-probability it recognises by
``-SoftmaxCrossEntropy``; :func:`local_fold_loss_negation` then cancels the
loss's own minus sign)::

    LS(x)[rows, y]                          -> -SoftmaxCrossEntropy(x, y)
    LS(x)[rows[:, None], y[:, None]]        -> -SoftmaxCrossEntropy(x, y)[:, None]
                                               (take_along_axis)
    LS(x).flatten()[rows * K + y]           -> -SoftmaxCrossEntropy(x, y)
                                               (also pt.take; the index op
                                               is AdvancedSubtensor, or
                                               AdvancedSubtensor1 built
                                               explicitly on PyTensor 3.0)
    sum(t * LS(x), axis=1)                  -> -SoftmaxCrossEntropy(x, t)
    sum(t * LS(x))                          -> -sum(SoftmaxCrossEntropy(x, t))
    a * (-1 * loss)                         -> (-a) * loss

Gradient rules. PyTensor 3.0 and 3.3 have no ``SoftmaxGrad`` op:
``pytensor.grad`` of any function of ``LS(x)`` (or of ``log(SM(x))``, whose
``gz / SM(x) * SM(x)`` canonicalize cancels) produces the log-softmax
pullback ``gz - sum(gz, axis=1, keepdims=True) * SM(x)``, where ``gz`` is the
cotangent of ``LS(x)``; for a cross-entropy ``gz`` is a scatter of the
per-example cotangent into zeros (integer labels) or ``-t * g[:, None]`` (soft
targets)::

    gz - sum(gz, 1)[:, None] * SM(x)        -> SoftmaxCrossEntropyGrad(g, x, y)
      gz = AdvancedIncSubtensor(zeros, -g, rows, y)                (and the
           take_along_axis and flat-index forms, AdvancedIncSubtensor1 too)
      gz = mul(scatter, SM(x)) with scatter = AdvancedIncSubtensor(zeros,
           u / SM(x)[rows, y], rows, y)                              (g = -u;
           the gradient of -log(softmax(x)[rows, y]))
    gz - sum(gz, 1)[:, None] * SM(x)        -> SoftmaxCrossEntropyGrad(g, x, t)
      gz = mul(c_1, ..., t_1, ...), the c's (B or 1, 1) per-row scales
           (g = -prod c[:, 0]), the t's the targets (t = prod t)

The soft-target gradient rule is an identity for every such product
(``SoftmaxCrossEntropyGrad(g, x, t) = (SM(x) sum t - t) g``), so it is exact
whatever the factors are (any linear function of ``LS(x)`` is a soft-target
cross-entropy); it is confined to products without ``SM(x)`` or ``LS(x)`` among
the factors, so that it only meets cross-entropy-shaped cotangents.

Exactness and limits:

* A rule fires only when the row index is provably ``arange`` of the logits'
  rows. ``arange(y.shape[0])`` does not fuse unless the labels' length is
  provably the batch size (the naive graph would silently use the first
  ``len(y)`` rows when it is shorter); write ``arange(x.shape[0])``.
* Labels whose static length is 1 are broadcast explicitly. Labels of unknown
  static length are taken to hold one entry per row (PyTensor's rule that a
  dimension not statically 1 does not broadcast); a mismatch raises
  ``ValueError`` at run time.
* The fused ops reject labels outside ``[0, K)``; the naive graph would wrap
  negative labels numpy-style (and the flat-index form would read a
  neighbouring row).
* A log-softmax with other consumers keeps them: the loss still fuses, the
  log-softmax is still computed for the rest, and a gradient whose ``gz``
  mixes other terms (a sum of cotangents) keeps PyTensor's pullback.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
import pytensor.tensor.subtensor as _subtensor
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.rewriting.basic import copy_stack_trace, node_rewriter
from pytensor.scalar import basic as ps
from pytensor.tensor.basic import ARange, get_underlying_scalar_constant_value
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.math import Sum, mul, sub
from pytensor.tensor.shape import Reshape, Shape_i
from pytensor.tensor.special import LogSoftmax, Softmax
from pytensor.tensor.subtensor import AdvancedIncSubtensor, AdvancedSubtensor

from cc2ops._op import FLOAT_DTYPES, INT_DTYPES
from cc2ops.graph.db import fuse_softmax_loss_db
from cc2ops.softmax_loss import SoftmaxCrossEntropy, SoftmaxCrossEntropyGrad

__all__ = [
    "local_softmax_cross_entropy_labels",
    "local_softmax_cross_entropy_soft",
    "local_fold_loss_negation",
    "local_softmax_cross_entropy_grad",
]

# PyTensor 3.0 still has the one-vector indexing ops; 3.3 folds them into the
# general ones.
_ADV_SUB1 = getattr(_subtensor, "AdvancedSubtensor1", None)
_ADV_INC1 = getattr(_subtensor, "AdvancedIncSubtensor1", None)
_PICK_OPS = tuple(c for c in (AdvancedSubtensor, _ADV_SUB1) if c is not None)
_SCATTER_OPS = tuple(c for c in (AdvancedIncSubtensor, _ADV_INC1) if c is not None)

_TAGS = ("fast_run", "cc2ops")


# --------------------------------------------------------------------------
# small matchers
# --------------------------------------------------------------------------


def _scalar_int(v: Variable) -> int | None:
    """``v``'s value when it is a constant integer scalar (dug out), else None."""
    try:
        value = get_underlying_scalar_constant_value(v)
    except (NotScalarConstantError, TypeError, ValueError):
        return None
    value = np.asarray(value)
    if value.dtype.kind not in "iu":
        return None
    return int(value)


def _constant_data(v: Variable) -> np.ndarray | None:
    return np.asarray(v.data) if isinstance(v, Constant) else None


def _is_elemwise(v: Variable, scalar_op_type: type) -> bool:
    return (
        v.owner is not None
        and isinstance(v.owner.op, Elemwise)
        and isinstance(v.owner.op.scalar_op, scalar_op_type)
    )


def _softmax_input(v: Variable, op_type: type) -> Variable | None:
    """``x`` when ``v`` is ``op_type{axis=1}(x)`` of a 2-d float ``x``."""
    if v.owner is None or not isinstance(v.owner.op, op_type):
        return None
    (x,) = v.owner.inputs
    if x.type.ndim != 2 or x.type.dtype not in FLOAT_DTYPES:
        return None
    axis = v.owner.op.axis
    if axis is None or tuple(a % 2 for a in axis) != (1,):
        return None
    return x


def _dim_key(fgraph, v: Variable, axis: int, depth: int = 0):
    """A key for the length of axis ``axis`` of ``v``.

    An int when it is known, else a ``(variable, axis)`` pair, followed
    through softmax ops (which keep the shape) and through the fgraph's
    shape feature, so that two lengths that PyTensor knows to be equal get
    the same key.
    """
    while v.owner is not None and isinstance(v.owner.op, (Softmax, LogSoftmax)):
        v = v.owner.inputs[0]
    if v.type.shape[axis] is not None:
        return int(v.type.shape[axis])
    sf = getattr(fgraph, "shape_feature", None)
    if sf is not None and depth < 8:
        try:
            d = sf.get_shape(v, axis)
        except Exception:
            # the shape of an arbitrary op may not be inferable; then the
            # variable itself is all we know
            d = None
        own = d is None or (
            d.owner is not None
            and isinstance(d.owner.op, Shape_i)
            and d.owner.op.i == axis
            and d.owner.inputs[0] is v
        )
        if not own:
            return _length_key(fgraph, d, depth + 1)
    return (v, axis)


def _length_key(fgraph, n: Variable, depth: int = 0):
    """The key (see :func:`_dim_key`) of a scalar integer length ``n``."""
    c = _scalar_int(n)
    if c is not None:
        return c
    if n.owner is not None and isinstance(n.owner.op, Shape_i):
        return _dim_key(fgraph, n.owner.inputs[0], n.owner.op.i, depth)
    return n


def _same(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, tuple) and isinstance(b, tuple):
        return a[0] is b[0] and a[1] == b[1]
    return a is b


def _is_rows(fgraph, idx: Variable, x: Variable) -> bool:
    """``idx`` is ``arange(B)`` with ``B`` the number of rows of ``x``."""
    if idx.type.ndim != 1 or idx.type.dtype not in INT_DTYPES:
        return False
    data = _constant_data(idx)
    if data is not None:
        b = _dim_key(fgraph, x, 0)
        return (
            isinstance(b, int)
            and data.shape == (b,)
            and np.array_equal(data, np.arange(b))
        )
    if idx.owner is None or not isinstance(idx.owner.op, ARange):
        return False
    start, stop, step = idx.owner.inputs
    return (
        _scalar_int(start) == 0
        and _scalar_int(step) == 1
        and _same(_length_key(fgraph, stop), _dim_key(fgraph, x, 0))
    )


def _column(v: Variable) -> Variable | None:
    """``u`` when ``v`` is ``u[:, None]`` (an ExpandDims or a (n, 1) constant)."""
    if v.type.ndim != 2:
        return None
    if (
        v.owner is not None
        and isinstance(v.owner.op, DimShuffle)
        and tuple(v.owner.op.new_order) == (0, "x")
    ):
        return v.owner.inputs[0]
    data = _constant_data(v)
    if data is not None and data.shape[1:] == (1,):
        return pt.constant(data[:, 0])
    return None


def _is_labels(y: Variable) -> bool:
    return y.type.ndim == 1 and y.type.dtype in INT_DTYPES


def _match_flat_index(fgraph, idx: Variable, x: Variable) -> Variable | None:
    """``y`` when ``idx`` is ``arange(B) * K + y`` (either order) for ``x``."""
    if not _is_elemwise(idx, ps.Add) or len(idx.owner.inputs) != 2:
        return None
    for scaled, y in (idx.owner.inputs, idx.owner.inputs[::-1]):
        if not _is_labels(y) or not _is_elemwise(scaled, ps.Mul):
            continue
        if len(scaled.owner.inputs) != 2:
            continue
        for rows, k in (scaled.owner.inputs, scaled.owner.inputs[::-1]):
            if _is_rows(fgraph, rows, x) and _is_length(fgraph, k, x, 1):
                return y
    return None


def _is_length(fgraph, v: Variable, x: Variable, axis: int) -> bool:
    """``v`` (a scalar, or a broadcast length-1 vector of it) is ``x.shape[axis]``."""
    while (
        v.owner is not None
        and isinstance(v.owner.op, DimShuffle)
        and v.owner.inputs[0].type.ndim == 0
    ):
        v = v.owner.inputs[0]
    if v.type.ndim > 1 or (v.type.ndim == 1 and v.type.shape != (1,)):
        return False
    return _same(_length_key(fgraph, v), _dim_key(fgraph, x, axis))


def _per_row(v: Variable, x: Variable, dtype: str | None = None) -> Variable:
    """``v`` (0-d or (1,) or (B,)) as a (B,) vector for the rows of ``x``."""
    if dtype is not None and v.type.dtype != dtype:
        v = pt.cast(v, dtype)
    if v.type.ndim == 0:
        v = pt.alloc(v, x.shape[0])
    elif v.type.shape[0] == 1 and x.type.shape[0] != 1:
        v = pt.alloc(v[0], x.shape[0])
    return v


def _like(old: Variable, new: Variable) -> Variable:
    """``new`` with ``old``'s dtype and at least its static shape."""
    if new.type.dtype != old.type.dtype:
        new = pt.cast(new, old.type.dtype)
    if any(
        o is not None and n is None
        for o, n in zip(old.type.shape, new.type.shape, strict=True)
    ):
        new = pt.specify_shape(new, old.type.shape)
    return new


def _minus_one(ndim: int, dtype: str) -> Variable:
    return pt.constant(np.full((1,) * ndim, -1, dtype=dtype))


def _shape_fits(v: Variable, x: Variable) -> bool:
    """No axis of ``v`` is statically 1 where the logits' axis may not be."""
    return all(
        s != 1 or xs == 1 for s, xs in zip(v.type.shape, x.type.shape, strict=True)
    )


def _is_zeros(v: Variable) -> bool:
    try:
        return float(get_underlying_scalar_constant_value(v)) == 0.0
    except (NotScalarConstantError, TypeError, ValueError):
        return False


# --------------------------------------------------------------------------
# forward: integer labels
# --------------------------------------------------------------------------


def _match_pick(fgraph, node) -> tuple[Variable, Variable, bool] | None:
    """``(x, y, column)`` when ``node`` picks ``LS(x)`` at ``(rows, y)``.

    ``column`` is true for the take_along_axis form, whose result is (B, 1).
    """
    src, *idx = node.inputs
    if len(idx) == 2 and isinstance(node.op, AdvancedSubtensor):
        if getattr(node.op, "idx_list", (0, 1)) != (0, 1):
            return None
        x = _softmax_input(src, LogSoftmax)
        if x is None:
            return None
        rows, labels = idx
        if rows.type.ndim == 1 and _is_labels(labels) and _is_rows(fgraph, rows, x):
            return x, labels, False
        rows, labels = _column(rows), _column(labels)
        if (
            rows is not None
            and labels is not None
            and _is_labels(labels)
            and _is_rows(fgraph, rows, x)
        ):
            return x, labels, True
        return None
    if len(idx) == 1:
        if isinstance(node.op, AdvancedSubtensor) and (
            getattr(node.op, "idx_list", (0,)) != (0,)
        ):
            return None
        if src.owner is None or not isinstance(src.owner.op, Reshape):
            return None
        # a reshape to 1-d of a (B, K) array can only be its row-major flatten
        if src.owner.op.ndim != 1:
            return None
        x = _softmax_input(src.owner.inputs[0], LogSoftmax)
        if x is None:
            return None
        y = _match_flat_index(fgraph, idx[0], x)
        if y is not None:
            return x, y, False
    return None


@node_rewriter(list(_PICK_OPS))
def local_softmax_cross_entropy_labels(fgraph, node):
    """log_softmax(x)[arange(B), y] -> -SoftmaxCrossEntropy(x, y).

    Also ``log_softmax(x)[arange(B)[:, None], y[:, None]]`` (take_along_axis)
    -> ``-SoftmaxCrossEntropy(x, y)[:, None]`` and
    ``log_softmax(x).flatten()[arange(B) * K + y]`` -> ``-SoftmaxCrossEntropy(x,
    y)``. The minus sign of the usual ``-log_softmax(...)[...]`` cost cancels
    against this one in :func:`local_fold_loss_negation`.
    """
    match = _match_pick(fgraph, node)
    if match is None:
        return None
    x, y, column = match
    if y.type.shape[0] == 1 and x.type.shape[0] != 1:
        y = pt.alloc(y[0], x.shape[0])
    loss = SoftmaxCrossEntropy()(x, y)
    logp = _minus_one(1, loss.type.dtype) * loss
    if column:
        logp = pt.expand_dims(logp, 1)
    out = _like(node.outputs[0], logp)
    copy_stack_trace(node.outputs[0], [loss, out])
    return [out]


# --------------------------------------------------------------------------
# forward: soft targets
# --------------------------------------------------------------------------


def _split_log_softmax(v: Variable) -> tuple[Variable, list[Variable]] | None:
    """``(x, others)`` when ``v = mul(others..., LS(x))`` with one ``LS``."""
    if not _is_elemwise(v, ps.Mul) or v.type.ndim != 2:
        return None
    found = [(i, _softmax_input(f, LogSoftmax)) for i, f in enumerate(v.owner.inputs)]
    found = [(i, x) for i, x in found if x is not None]
    if len(found) != 1:
        return None
    i, x = found[0]
    others = [f for j, f in enumerate(v.owner.inputs) if j != i]
    if not others or v.type.dtype != x.type.dtype:
        return None
    return x, others


def _targets_from(factors: list[Variable], x: Variable) -> Variable:
    """The product of ``factors`` as (B, K) targets in ``x``'s dtype."""
    t = factors[0] if len(factors) == 1 else mul(*factors)
    if t.type.dtype != x.type.dtype:
        t = pt.cast(t, x.type.dtype)
    if t.type.broadcastable != x.type.broadcastable:
        t = pt.alloc(t, x.shape[0], x.shape[1])
    return t


@node_rewriter([Sum])
def local_softmax_cross_entropy_soft(fgraph, node):
    """sum(t * log_softmax(x), axis=1) -> -SoftmaxCrossEntropy(x, t).

    And ``sum(t * log_softmax(x))`` over both axes -> ``-sum(SoftmaxCrossEntropy(x,
    t))``. ``t`` is the product of every other factor of the ``mul``
    (broadcast to (B, K)); the loss is linear in it, so any targets (one-hot,
    smoothed, weighted) are exact.
    """
    (v,) = node.inputs
    if v.type.ndim != 2 or node.outputs[0].type.dtype != v.type.dtype:
        return None
    axis = node.op.axis
    axes = (0, 1) if axis is None else tuple(sorted(a % 2 for a in axis))
    if axes not in ((1,), (0, 1)):
        return None
    split = _split_log_softmax(v)
    if split is None:
        return None
    x, others = split
    loss = SoftmaxCrossEntropy()(x, _targets_from(others, x))
    total = loss if axes == (1,) else loss.sum()
    if total.type.dtype != node.outputs[0].type.dtype:
        total = pt.cast(total, node.outputs[0].type.dtype)
    out = _like(node.outputs[0], _minus_one(total.type.ndim, total.type.dtype) * total)
    copy_stack_trace(node.outputs[0], [loss, out])
    return [out]


# --------------------------------------------------------------------------
# forward: the loss's minus sign
# --------------------------------------------------------------------------


def _from_loss(v: Variable) -> bool:
    """``v`` is a SoftmaxCrossEntropy output, or its sum, or it with a new axis."""
    while v.owner is not None and isinstance(v.owner.op, (DimShuffle, Sum)):
        v = v.owner.inputs[0]
    return v.owner is not None and isinstance(v.owner.op, SoftmaxCrossEntropy)


def _negated_loss(v: Variable) -> Variable | None:
    """``z`` when ``v = mul(-1, z)`` and ``z`` comes from a fused loss."""
    if not _is_elemwise(v, ps.Mul) or len(v.owner.inputs) != 2:
        return None
    for c, z in (v.owner.inputs, v.owner.inputs[::-1]):
        data = _constant_data(c)
        if (
            data is not None
            and data.ndim == z.type.ndim
            and all(s == 1 for s in data.shape)
            and np.all(data == -1)
            and z.type.dtype == v.type.dtype
            and _from_loss(z)
        ):
            return z
    return None


@node_rewriter([mul])
def local_fold_loss_negation(fgraph, node):
    """a * (-1 * loss) -> (-a) * loss, with -1 * (-1 * loss) -> loss.

    ``a`` must hold a constant factor to take the sign; ``loss`` is an output
    of a fused :class:`SoftmaxCrossEntropy` (or its sum), so this only ever
    meets the minus signs that the forward rules put in.
    """
    out = node.outputs[0]
    for i, v in enumerate(node.inputs):
        z = _negated_loss(v)
        if z is None or len(fgraph.clients[v]) != 1:
            continue
        rest = [f for j, f in enumerate(node.inputs) if j != i]
        consts = [j for j, f in enumerate(rest) if _constant_data(f) is not None]
        if not consts:
            continue
        j = consts[0]
        negated = -_constant_data(rest[j])
        rest[j] = pt.constant(negated.astype(rest[j].type.dtype))
        if (
            len(rest) == 1
            and np.all(negated == 1)
            and negated.ndim == z.type.ndim
            and all(s == 1 for s in negated.shape)
            and z.type.dtype == out.type.dtype
        ):
            new = z
        else:
            new = mul(*rest, z)
        new = _like(out, new)
        copy_stack_trace(out, new)
        return [new]
    return None


# --------------------------------------------------------------------------
# gradient
# --------------------------------------------------------------------------


def _log_softmax_pullback(node) -> tuple[Variable, Variable] | None:
    """``(gz, x)`` when ``node`` is ``gz - sum(gz, 1)[:, None] * SM(x)``."""
    gz, prod = node.inputs
    if not _is_elemwise(prod, ps.Mul) or len(prod.owner.inputs) != 2:
        return None
    for sm, expanded in (prod.owner.inputs, prod.owner.inputs[::-1]):
        x = _softmax_input(sm, Softmax)
        if x is None or expanded.owner is None:
            continue
        if not isinstance(expanded.owner.op, DimShuffle):
            continue
        if tuple(expanded.owner.op.new_order) != (0, "x"):
            continue
        total = expanded.owner.inputs[0]
        if total.owner is None or not isinstance(total.owner.op, Sum):
            continue
        axis = total.owner.op.axis
        if axis is None or tuple(a % 2 for a in axis) != (1,):
            continue
        if total.owner.inputs[0] is gz and gz.type.dtype == x.type.dtype:
            return gz, x
    return None


def _match_scatter(fgraph, gz: Variable, x: Variable):
    """``(v, y)`` when ``gz`` scatters per-row values ``v`` into zeros at ``(rows, y)``.

    ``v`` is 0-d or 1-d (one value per row, or one for all).
    """
    if gz.owner is None:
        return None
    op = gz.owner.op
    if isinstance(op, Reshape):
        # the flat-index form: reshape(scatter into zeros(B*K)), (B, K))
        if op.ndim != 2:
            return None
        flat = gz.owner.inputs[0]
        if flat.owner is None or not isinstance(flat.owner.op, _SCATTER_OPS):
            return None
        zeros, v, *idx = flat.owner.inputs
        if len(idx) != 1 or flat.type.ndim != 1 or not _is_zeros(zeros):
            return None
        if getattr(flat.owner.op, "idx_list", (0,)) != (0,):
            return None
        y = _match_flat_index(fgraph, idx[0], x)
        if y is None or v.type.ndim > 1:
            return None
        return v, y
    if not isinstance(op, AdvancedIncSubtensor) or len(gz.owner.inputs) != 4:
        return None
    if getattr(op, "idx_list", (0, 1)) != (0, 1):
        return None
    zeros, v, rows, labels = gz.owner.inputs
    if not _is_zeros(zeros):
        return None
    if rows.type.ndim == 1:
        if _is_labels(labels) and _is_rows(fgraph, rows, x) and v.type.ndim <= 1:
            return v, labels
        return None
    rows, labels = _column(rows), _column(labels)
    if rows is None or labels is None or not _is_labels(labels):
        return None
    if not _is_rows(fgraph, rows, x):
        return None
    # values broadcast against the (B, 1) index: (B, 1), (1, 1), (1,) or 0-d
    if v.type.ndim == 2 and v.type.shape[1] == 1:
        col = _column(v)
        return (col if col is not None else v[:, 0]), labels
    if v.type.ndim == 0 or v.type.shape == (1,):
        return v, labels
    return None


def _is_picked_softmax(fgraph, v: Variable, x: Variable, y: Variable) -> bool:
    """``v`` is ``softmax(x)[rows, y]``."""
    if v.owner is None or not isinstance(v.owner.op, AdvancedSubtensor):
        return False
    if len(v.owner.inputs) != 3:
        return False
    src, rows, labels = v.owner.inputs
    return (
        _softmax_input(src, Softmax) is x and labels is y and _is_rows(fgraph, rows, x)
    )


def _divided_by_picked_softmax(fgraph, v: Variable, x: Variable, y: Variable):
    """``u`` when ``v = u / softmax(x)[rows, y]`` (the pullback of a log).

    The denominator may carry other factors: ``u / (a * softmax(x)[rows, y])``
    gives ``u / a``.
    """
    if not _is_elemwise(v, ps.TrueDiv) or v.type.ndim > 1:
        return None
    u, den = v.owner.inputs
    if _is_picked_softmax(fgraph, den, x, y):
        return u
    if not _is_elemwise(den, ps.Mul):
        return None
    factors = den.owner.inputs
    picked = [i for i, f in enumerate(factors) if _is_picked_softmax(fgraph, f, x, y)]
    if len(picked) != 1:
        return None
    rest = [f for i, f in enumerate(factors) if i != picked[0]]
    return u / (rest[0] if len(rest) == 1 else mul(*rest))


def _scale_vector(factors: list[Variable]) -> tuple[list[Variable], float]:
    """Per-row vectors of (n, 1) factors, constant scalars folded into a float."""
    vectors, scalar = [], 1.0
    for f in factors:
        data = _constant_data(f)
        if data is not None and data.size == 1:
            scalar *= float(data.reshape(()))
            continue
        col = _column(f)
        vectors.append(col if col is not None else f[:, 0])
    return vectors, scalar


def _soft_cotangent(gz: Variable, x: Variable):
    """``(g, t)`` with ``gz = -t * g[:, None]`` for a product ``gz``."""
    if not _is_elemwise(gz, ps.Mul) or len(gz.owner.inputs) < 2:
        return None
    factors = gz.owner.inputs
    # a factor that is the softmax (or log-softmax) of x itself makes gz no
    # cross-entropy cotangent (e.g. the softmax pullback); leave it alone
    if any(_softmax_input(f, op) is x for f in factors for op in (Softmax, LogSoftmax)):
        return None
    scales = [f for f in factors if f.type.ndim == 2 and f.type.shape[1] == 1]
    targets = [f for f in factors if not any(f is s for s in scales)]
    if not targets:
        return None
    # gz = scalar * prod(vectors)[:, None] * t = -g[:, None] * t
    vectors, scalar = _scale_vector(scales)
    dtype = x.type.dtype
    minus = pt.constant(np.asarray(-scalar, dtype=dtype))
    if not vectors:
        g = pt.alloc(minus, x.shape[0])
    else:
        g = vectors[0] if len(vectors) == 1 else mul(*vectors)
        g = pt.cast(g, dtype) if g.type.dtype != dtype else g
        if scalar == 1.0:
            g = -g
        elif scalar != -1.0:
            g = minus * g
    return _per_row(g, x), _targets_from(targets, x)


@node_rewriter([sub])
def local_softmax_cross_entropy_grad(fgraph, node):
    """gz - sum(gz, 1)[:, None] * softmax(x) -> SoftmaxCrossEntropyGrad(g, x, y).

    The log-softmax pullback, with ``gz`` the cotangent of a cross-entropy:
    ``AdvancedIncSubtensor(zeros, -g, arange(B), y)`` (and the take_along_axis
    and flat-index forms) gives integer labels ``y``;
    ``mul(scatter, softmax(x))`` with the scattered values ``u / softmax(x)[arange(B),
    y]`` (the gradient of ``-log(softmax(x)[arange(B), y])``) gives ``y`` with
    ``g = -u``; a product ``gz = -t * g[:, None]`` gives soft targets ``t``.
    """
    match = _log_softmax_pullback(node)
    if match is None:
        return None
    gz, x = match
    if not _shape_fits(gz, x):
        return None
    dtype = x.type.dtype
    scatter = _match_scatter(fgraph, gz, x)
    if scatter is None and _is_elemwise(gz, ps.Mul) and len(gz.owner.inputs) == 2:
        # -log(softmax(x)[rows, y]): gz = scatter(u / softmax(x)[rows, y]) * SM(x)
        for s, sm in (gz.owner.inputs, gz.owner.inputs[::-1]):
            if _softmax_input(sm, Softmax) is not x:
                continue
            inner = _match_scatter(fgraph, s, x)
            if inner is None:
                continue
            u = _divided_by_picked_softmax(fgraph, inner[0], x, inner[1])
            if u is not None:
                scatter = (u, inner[1])
                break
    if scatter is not None:
        v, y = scatter
        if y.type.shape[0] == 1 and x.type.shape[0] != 1:
            y = pt.alloc(y[0], x.shape[0])
        g = _per_row(-pt.cast(v, dtype) if v.type.dtype != dtype else -v, x, dtype)
        dx = SoftmaxCrossEntropyGrad()(g, x, y)
    else:
        soft = _soft_cotangent(gz, x)
        if soft is None:
            return None
        g, t = soft
        dx = SoftmaxCrossEntropyGrad()(g, x, t)
    out = _like(node.outputs[0], dx)
    copy_stack_trace(node.outputs[0], [dx, out])
    return [out]


for _rule in (
    local_softmax_cross_entropy_labels,
    local_softmax_cross_entropy_soft,
    local_fold_loss_negation,
    local_softmax_cross_entropy_grad,
):
    fuse_softmax_loss_db.register(_rule.__name__, _rule, *_TAGS)
