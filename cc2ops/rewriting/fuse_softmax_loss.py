"""Rewrite hand-written softmax cross-entropy graphs into the fused cc2ops ops.

The rules live in :data:`cc2ops.rewriting.db.fuse_softmax_loss_db` (tags
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
``rows(n)`` is ``arange(n)`` with ``n`` the labels' length (``arange(y.shape[0])``,
Theano's tutorial spelling) or a constant, when ``n`` is not provably ``B``:
the naive pick then reads the first ``n`` rows, so the fused ops run on
``x[:n]``. A softmax over all axes (PyTensor's default ``axis=None``) of an
``x`` of static shape (1, K) is the row softmax too: vector logits made a row,
``softmax(shape_padleft(v))``.

Forward rules (each replaces the log-probability it recognises by
``-SoftmaxCrossEntropy``; :func:`local_fold_loss_negation` then cancels the
loss's own minus sign)::

    LS(x)[rows, y]                          -> -SoftmaxCrossEntropy(x, y)
    LS(x)[rows(n), y]                       -> -SoftmaxCrossEntropy(x[:n], y)
    (c * LS(x))[rows, y]                    -> c * -SoftmaxCrossEntropy(x, y)
                                               (c of shape (1, 1); c = -1 is
                                               (-log(softmax(x)))[rows, y])
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
           the gradient of -log(softmax(x)[rows, y]); the scattered value
           may be scaled, d * (u / (e * SM(x)[rows, y])) giving g = -d u / e:
           the gradient of a * sum(-log(...)), a * (-sum(...)), a * mean(...))
      gz = c_1 * ... * scatter, the c's (B or 1, 1) per-row scales
           (g = -v * prod c; c = -1 for (-log(softmax(x)))[rows, y])
    the same with rows(n)                   -> set_subtensor(zeros_like(x)[:n],
                                               SoftmaxCrossEntropyGrad(g, x[:n], y))
                                               (the rows from n on have a zero
                                               cotangent, so a zero gradient)
    gz[0] - SM(x)[0] * sum(gz)              -> SoftmaxCrossEntropyGrad(g, x, y)[0]
                                               (x of static shape (1, K): the
                                               squeezed pullback of vector logits)
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
  rows, or ``arange(n)`` with ``n`` the labels' length or a constant, both
  starting at 0; other row counts (which might be negative, where ``x[:n]``
  would count from the end) keep the naive graph. With ``n > B`` both the
  naive and the fused graph fail at run time (``IndexError`` and
  ``ValueError``).
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

from typing import NamedTuple

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
from cc2ops.rewriting.db import fuse_softmax_loss_db
from cc2ops.softmax_cross_entropy import SoftmaxCrossEntropy, SoftmaxCrossEntropyGrad

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
    """``x`` when ``v`` is ``op_type{axis=1}(x)`` of a 2-d float ``x``.

    A softmax over all axes (``axis=None``, PyTensor's default) of an ``x``
    whose static shape has one row is the same row softmax: that is the
    vector-logits idiom ``softmax(shape_padleft(x))``.
    """
    if v.owner is None or not isinstance(v.owner.op, op_type):
        return None
    (x,) = v.owner.inputs
    if x.type.ndim != 2 or x.type.dtype not in FLOAT_DTYPES:
        return None
    axis = v.owner.op.axis
    axes = (0, 1) if axis is None else tuple(sorted({a % 2 for a in axis}))
    if axes == (1,) or (axes == (0, 1) and x.type.shape[0] == 1):
        return x
    return None


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


#: What :func:`_match_rows` returns for an index that is every row of ``x``.
ALL_ROWS = "all rows"


def _match_rows(fgraph, idx: Variable, x: Variable, labels: Variable):
    """Which rows of ``x`` a pick or scatter at ``(idx, labels)`` reads.

    :data:`ALL_ROWS` when ``idx`` is ``arange(B)`` for the rows of ``x``. A
    scalar length ``n`` when ``idx`` is ``arange(n)`` with ``n`` the labels'
    length (``arange(y.shape[0])``, the Theano tutorial's spelling) or a
    constant: the naive graph then reads the first ``n`` rows, ``x[:n]``,
    whatever the batch size (and fails, as the fused op does, when ``n > B``).
    None for any other index.
    """
    if not _is_labels(labels) or idx.type.ndim != 1:
        return None
    if idx.type.dtype not in INT_DTYPES:
        return None
    if _is_rows(fgraph, idx, x):
        return ALL_ROWS
    n_labels = labels.type.shape[0]
    data = _constant_data(idx)
    if data is not None:
        m = data.shape[0]
        if np.array_equal(data, np.arange(m)) and n_labels in (None, 1, m):
            return pt.constant(np.int64(m))
        return None
    if idx.owner is None or not isinstance(idx.owner.op, ARange):
        return None
    start, stop, step = idx.owner.inputs
    if _scalar_int(start) != 0 or _scalar_int(step) != 1:
        return None
    if _same(_length_key(fgraph, stop), _dim_key(fgraph, labels, 0)):
        return stop
    m = _scalar_int(stop)
    if m is not None and m >= 0 and n_labels in (None, 1, m):
        return stop
    return None


def _first_rows(x: Variable, n) -> Variable:
    """``x`` itself for :data:`ALL_ROWS`, else ``x[:n]``."""
    return x if isinstance(n, str) else x[:n]


def _labels_for(y: Variable, x: Variable, n) -> Variable:
    """Labels ``y`` broadcast (from a static length 1) to the picked rows.

    ``n`` is what :func:`_match_rows` gave: for a prefix the labels get ``n``
    entries, not ``len(x[:n])``, so that ``n > B`` fails in the fused op as
    it does in the naive pick.
    """
    count = x.shape[0] if isinstance(n, str) else n
    if y.type.shape[0] == 1 and (x.type.shape[0] != 1 or not isinstance(n, str)):
        y = pt.alloc(y[0], count)
    return y


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


class _Pick(NamedTuple):
    """A recognised pick of log-probabilities: ``scale * LS(x)[rows(n), y]``."""

    x: Variable
    y: Variable
    n: object  # ALL_ROWS, or the scalar length of the row prefix x[:n]
    column: bool  # the take_along_axis form, whose result is (n, 1)
    scale: list[Variable]  # 2-d factors broadcast over the whole (B, K)


def _scaled_log_softmax(v: Variable) -> tuple[Variable, list[Variable]] | None:
    """``(x, scale)`` when ``v`` is ``LS(x)`` or ``mul(c, ..., LS(x))``.

    The ``c`` are statically (1, 1) (``-log(softmax(x))`` is ``mul([[-1]],
    LS(x))`` after canonicalize), so they scale every entry alike and pass
    through a pick unchanged.
    """
    x = _softmax_input(v, LogSoftmax)
    if x is not None:
        return x, []
    if not _is_elemwise(v, ps.Mul) or v.type.ndim != 2:
        return None
    found = [(f, _softmax_input(f, LogSoftmax)) for f in v.owner.inputs]
    inner = [(f, x) for f, x in found if x is not None]
    if len(inner) != 1:
        return None
    ls, x = inner[0]
    scale = [f for f in v.owner.inputs if f is not ls]
    if not all(f.type.broadcastable == (True, True) for f in scale):
        return None
    return x, scale


def _match_pick(fgraph, node) -> _Pick | None:
    """The :class:`_Pick` that ``node`` computes, or None."""
    src, *idx = node.inputs
    if len(idx) == 2 and isinstance(node.op, AdvancedSubtensor):
        if getattr(node.op, "idx_list", (0, 1)) != (0, 1):
            return None
        scaled = _scaled_log_softmax(src)
        if scaled is None:
            return None
        x, scale = scaled
        rows, labels = idx
        if rows.type.ndim == 1:
            n = _match_rows(fgraph, rows, x, labels)
            return None if n is None else _Pick(x, labels, n, False, scale)
        rows, labels = _column(rows), _column(labels)
        if rows is None or labels is None:
            return None
        n = _match_rows(fgraph, rows, x, labels)
        return None if n is None else _Pick(x, labels, n, True, scale)
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
            return _Pick(x, y, ALL_ROWS, False, [])
    return None


def _scale_factors(scale: list[Variable], ndim: int, dtype: str) -> list[Variable]:
    """(1, 1) factors as ``ndim``-d factors, the constants folded into one."""
    const = np.ones((1,) * ndim)
    factors = []
    for f in scale:
        data = _constant_data(f)
        if data is not None:
            const = const * data.reshape((1,) * ndim)
        else:
            factors.append(f if ndim == 2 else f.dimshuffle(0))
    return [pt.constant(const.astype(dtype)), *factors]


@node_rewriter(list(_PICK_OPS))
def local_softmax_cross_entropy_labels(fgraph, node):
    """log_softmax(x)[arange(B), y] -> -SoftmaxCrossEntropy(x, y).

    Also ``log_softmax(x)[arange(B)[:, None], y[:, None]]`` (take_along_axis)
    -> ``-SoftmaxCrossEntropy(x, y)[:, None]`` and
    ``log_softmax(x).flatten()[arange(B) * K + y]`` -> ``-SoftmaxCrossEntropy(x,
    y)``. With the row index ``arange(n)``, ``n = y.shape[0]`` (or a constant),
    the naive pick reads the first ``n`` rows: ``log_softmax(x)[arange(n), y]``
    -> ``-SoftmaxCrossEntropy(x[:n], y)``. A (1, 1) scale inside the pick
    comes out: ``(c * log_softmax(x))[rows, y]`` -> ``c * -SoftmaxCrossEntropy(x,
    y)`` (``c = -1`` for ``(-log(softmax(x)))[rows, y]``). The minus signs
    cancel in :func:`local_fold_loss_negation`.
    """
    pick = _match_pick(fgraph, node)
    if pick is None:
        return None
    x = _first_rows(pick.x, pick.n)
    loss = SoftmaxCrossEntropy()(x, _labels_for(pick.y, x, pick.n))
    dtype = loss.type.dtype
    if pick.column:
        logp = _minus_one(2, dtype) * pt.expand_dims(loss, 1)
    else:
        logp = _minus_one(1, dtype) * loss
    if pick.scale:
        out_dtype = node.outputs[0].type.dtype
        logp = mul(*_scale_factors(pick.scale, logp.type.ndim, out_dtype), logp)
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


class _Pullback(NamedTuple):
    """A recognised log-softmax pullback ``gz - sum(gz, 1)[:, None] * SM(x)``."""

    gz: Variable  # the cotangent of LS(x), (B, K)
    x: Variable
    squeezed: bool  # the (K,) form of a one-row x: the node computes dx[0]


def _squeezed_row(v: Variable) -> Variable | None:
    """``u`` when ``v`` is ``u[0]`` written as a squeeze of a (1, K) ``u``."""
    if v.owner is None or not isinstance(v.owner.op, DimShuffle):
        return None
    (u,) = v.owner.inputs
    if u.type.ndim != 2 or tuple(v.owner.op.new_order) != (1,):
        return None
    return u


def _is_row_sum(v: Variable, gz: Variable) -> bool:
    """``v`` is ``sum(gz, axis=1)`` laid out to broadcast over the classes.

    ``v`` is ``sum(gz, 1)[:, None]`` (B, 1); when ``gz`` has one row, any
    layout of its one total (``sum(gz)`` over both axes, a (1,) vector for the
    squeezed form) is the same thing.
    """
    if v.type.ndim not in (1, 2) or not v.type.broadcastable[-1]:
        return False
    total, order = v, None
    if v.owner is not None and isinstance(v.owner.op, DimShuffle):
        total, order = v.owner.inputs[0], tuple(v.owner.op.new_order)
    if total.owner is None or not isinstance(total.owner.op, Sum):
        return False
    if total.owner.inputs[0] is not gz:
        return False
    axis = total.owner.op.axis
    axes = (0, 1) if axis is None else tuple(sorted({a % 2 for a in axis}))
    if gz.type.shape[0] == 1:
        return axes in ((1,), (0, 1))
    return axes == (1,) and order == (0, "x")


def _log_softmax_pullback(node) -> _Pullback | None:
    """The :class:`_Pullback` that the ``sub`` ``node`` computes, or None.

    Also its squeezed form for one-row logits (the gradient of vector logits
    made a row, ``softmax(shape_padleft(x))``), where canonicalize has lifted
    the squeeze into the terms: ``gz[0] - SM(x)[0] * sum(gz)``.
    """
    a, prod = node.inputs
    squeezed = node.outputs[0].type.ndim == 1
    gz = _squeezed_row(a) if squeezed else a
    if gz is None or gz.type.ndim != 2:
        return None
    if not _is_elemwise(prod, ps.Mul) or len(prod.owner.inputs) != 2:
        return None
    for sm, expanded in (prod.owner.inputs, prod.owner.inputs[::-1]):
        if squeezed:
            sm = _squeezed_row(sm)
            if sm is None:
                continue
        x = _softmax_input(sm, Softmax)
        if x is None or gz.type.dtype != x.type.dtype:
            continue
        if _is_row_sum(expanded, gz):
            return _Pullback(gz, x, squeezed)
    return None


class _Scatter(NamedTuple):
    """Per-row values ``v`` scattered into zeros at ``(rows(n), y)``."""

    v: Variable  # 0-d, (1,) or one value per row
    y: Variable
    n: object  # ALL_ROWS, or the length of the row prefix
    rows: Variable | None  # the row index (None for the flat-index form)


def _match_scatter(fgraph, gz: Variable, x: Variable) -> _Scatter | None:
    """The :class:`_Scatter` that ``gz`` is, or None."""
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
        return _Scatter(v, y, ALL_ROWS, None)
    if not isinstance(op, AdvancedIncSubtensor) or len(gz.owner.inputs) != 4:
        return None
    if getattr(op, "idx_list", (0, 1)) != (0, 1):
        return None
    zeros, v, rows, labels = gz.owner.inputs
    if not _is_zeros(zeros):
        return None
    if rows.type.ndim == 1:
        n = _match_rows(fgraph, rows, x, labels)
        if n is None or v.type.ndim > 1:
            return None
        return _Scatter(v, labels, n, rows)
    rows, labels = _column(rows), _column(labels)
    if rows is None or labels is None:
        return None
    n = _match_rows(fgraph, rows, x, labels)
    if n is None:
        return None
    # values broadcast against the (B, 1) index: (B, 1), (1, 1), (1,) or 0-d
    if v.type.ndim == 2 and v.type.shape[1] == 1:
        col = _column(v)
        return _Scatter(col if col is not None else v[:, 0], labels, n, rows)
    if v.type.ndim == 0 or v.type.shape == (1,):
        return _Scatter(v, labels, n, rows)
    return None


def _is_picked_softmax(fgraph, v: Variable, x: Variable, sc: _Scatter) -> bool:
    """``v`` is ``softmax(x)[rows, y]`` at the scatter's own ``(rows, y)``."""
    if v.owner is None or not isinstance(v.owner.op, AdvancedSubtensor):
        return False
    if len(v.owner.inputs) != 3 or sc.rows is None:
        return False
    src, rows, labels = v.owner.inputs
    if _softmax_input(src, Softmax) is not x or labels is not sc.y:
        return False
    return rows is sc.rows or (
        sc.n is ALL_ROWS and _match_rows(fgraph, rows, x, labels) is ALL_ROWS
    )


def _product(factors: list[Variable]) -> Variable:
    return factors[0] if len(factors) == 1 else mul(*factors)


def _divided_by_picked_softmax(fgraph, v: Variable, x: Variable, sc: _Scatter):
    """``u`` when ``v = u / softmax(x)[rows, y]`` (the pullback of a log).

    The denominator may carry other factors, and the quotient too (a scaled
    cost ``a * sum(-log(...))`` scatters ``-1 * (a / softmax(x)[rows, y])``):
    ``c * (u / (d * softmax(x)[rows, y]))`` gives ``c * u / d``.
    """
    if v.type.ndim > 1:
        return None
    factors = v.owner.inputs if _is_elemwise(v, ps.Mul) else [v]
    divs = [f for f in factors if _is_elemwise(f, ps.TrueDiv)]
    if len(divs) != 1:
        return None
    (div,) = divs
    others = [f for f in factors if f is not div]
    u, den = div.owner.inputs
    den_factors = den.owner.inputs if _is_elemwise(den, ps.Mul) else [den]
    picked = [f for f in den_factors if _is_picked_softmax(fgraph, f, x, sc)]
    if len(picked) != 1:
        return None
    rest = [f for f in den_factors if f is not picked[0]]
    num = _product([*others, u])
    return num / _product(rest) if rest else num


def _labels_cotangent(fgraph, gz: Variable, x: Variable):
    """``(g, y, n)`` when ``gz`` is the log-softmax cotangent of a labels loss.

    ``gz`` is ``c_1 * ... * scatter``: one :class:`_Scatter` of per-row
    values ``v`` at ``(rows(n), y)``, per-row scales ``c`` ((B, 1) or (1, 1)
    factors) and at most one ``SM(x)``, in which case ``v`` must be ``u /
    SM(x)[rows, y]`` (the gradient of ``-log(softmax(x)[rows, y])``, whose
    ``SM(x) / SM(x)[rows, y]`` is one at the scattered entries). Then ``gz =
    -g[:, None] * onehot(y)`` on the first ``n`` rows (zero below), with
    ``g = -v * prod(c)``, which is exactly the cotangent that
    ``SoftmaxCrossEntropyGrad(g, x[:n], y)`` pulls back.
    """
    factors = gz.owner.inputs if _is_elemwise(gz, ps.Mul) else [gz]
    found = [(f, _match_scatter(fgraph, f, x)) for f in factors]
    found = [(f, sc) for f, sc in found if sc is not None]
    if len(found) != 1:
        return None
    scattered, sc = found[0]
    rest = [f for f in factors if f is not scattered]
    sms = [f for f in rest if _softmax_input(f, Softmax) is x]
    scales = [f for f in rest if not any(f is s for s in sms)]
    if len(sms) > 1 or not all(f.type.shape[1:] == (1,) for f in scales):
        return None
    v = sc.v
    if sms:
        v = _divided_by_picked_softmax(fgraph, v, x, sc)
        if v is None:
            return None
    dtype = x.type.dtype
    v = pt.cast(v, dtype) if v.type.dtype != dtype else v
    vectors, scalar = _scale_vector(scales)
    if sc.n is not ALL_ROWS:
        vectors = [c if c.type.shape[0] == 1 else c[: sc.n] for c in vectors]
    vectors = [pt.cast(c, dtype) if c.type.dtype != dtype else c for c in vectors]
    g = _product([pt.constant(np.asarray(-scalar, dtype=dtype)), *vectors, v])
    return g, sc.y, sc.n


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

    * ``c * AdvancedIncSubtensor(zeros, v, arange(B), y)`` (and the
      take_along_axis and flat-index forms; ``c`` per-row or constant scales,
      e.g. ``-1`` for ``(-log(softmax(x)))[rows, y]``) gives integer labels
      ``y`` with ``g = -c * v``;
    * ``c * scatter(u / softmax(x)[arange(B), y]) * softmax(x)`` (the gradient
      of ``-log(softmax(x)[arange(B), y])``, scaled costs included) gives
      ``g = -c * u``;
    * with the row index ``arange(n)``, ``n = y.shape[0]``, the rows from ``n``
      on have a zero cotangent: ``set_subtensor(zeros_like(x)[:n],
      SoftmaxCrossEntropyGrad(g, x[:n], y))``;
    * a product ``gz = -t * g[:, None]`` gives soft targets ``t``.

    One-row logits (vector logits made a row) have the squeezed pullback
    ``gz[0] - softmax(x)[0] * sum(gz)`` -> ``SoftmaxCrossEntropyGrad(g, x,
    y)[0]``.
    """
    match = _log_softmax_pullback(node)
    if match is None:
        return None
    gz, x, squeezed = match
    if not _shape_fits(gz, x):
        return None
    labels = _labels_cotangent(fgraph, gz, x)
    if labels is not None:
        g, y, n = labels
        xs = _first_rows(x, n)
        dxs = SoftmaxCrossEntropyGrad()(
            _per_row(g, xs, x.type.dtype), xs, _labels_for(y, xs, n)
        )
        dx = dxs if n is ALL_ROWS else pt.set_subtensor(pt.zeros_like(x)[:n], dxs)
        new = [dxs, dx]
    else:
        soft = _soft_cotangent(gz, x)
        if soft is None:
            return None
        g, t = soft
        dx = SoftmaxCrossEntropyGrad()(g, x, t)
        new = [dx]
    if squeezed:
        dx = dx[0]
        new.append(dx)
    out = _like(node.outputs[0], dx)
    copy_stack_trace(node.outputs[0], [*new, out])
    return [out]


for _rule in (
    local_softmax_cross_entropy_labels,
    local_softmax_cross_entropy_soft,
    local_fold_loss_negation,
    local_softmax_cross_entropy_grad,
):
    fuse_softmax_loss_db.register(_rule.__name__, _rule, *_TAGS)
