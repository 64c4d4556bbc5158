"""Fused softmax + cross-entropy, its gradient, and the top-k error, on the CPU.

For logits ``x`` of shape (B, K) (B examples, K classes) the per-example loss
is::

    integer labels y (B,):          loss_i = logsumexp(x_i) - x_i[y_i]
    soft targets t (B, K):          loss_i = -sum_k t_ik log softmax(x_i)_k
                                           = logsumexp(x_i) sum_k t_ik - sum_k t_ik x_ik

and its gradient with respect to the logits, given the loss's cotangent ``g``
(B,), is::

    integer labels:   dx = (softmax(x) - onehot(y)) * g[:, None]
    soft targets:     dx = (softmax(x) * sum_k t_k - t) * g[:, None]

(for soft targets ``d/dx [-sum_k t_k log softmax(x)_k] = softmax(x) sum_k t_k
- t``; it reduces to the one-hot form when the targets sum to one). Soft
targets are differentiable: ``d loss / d t = -log_softmax(x) * g[:, None]``.

The ops form a family closed under differentiation::

    SoftmaxCrossEntropy(x, y) = loss            (B,)
    SoftmaxCrossEntropyGrad(g, x, y) = dx       (B, K), pullback of the above
    pullback of SoftmaxCrossEntropyGrad         PyTensor graph (softmax ops)

:class:`TopKError` (builder :func:`top_k_error`) is the classification error
that cuda-convnet2 reports next to the loss.

Public names: the builders :func:`softmax_cross_entropy` and
:func:`top_k_error`, the ops :class:`SoftmaxCrossEntropy`,
:class:`SoftmaxCrossEntropyGrad` and :class:`TopKError`, and the numpy
references :func:`softmax_cross_entropy_reference`,
:func:`softmax_cross_entropy_grad_reference` and :func:`top_k_error_reference`
(what ``perform`` runs; the GPU tests and benchmarks compare against them).
The rewrites in :mod:`cc2ops.rewriting.fuse_softmax_loss` turn the usual
hand-written cross-entropy graphs into these ops.
"""

from __future__ import annotations

import numbers
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pytensor.gradient
import pytensor.tensor as pt
from pytensor.gradient import disconnected_type
from pytensor.graph.basic import Apply, Variable
from pytensor.graph.replace import graph_replace
from pytensor.tensor.special import log_softmax, softmax
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

from cc2ops._op import (
    FLOAT_DTYPES,
    INT_DTYPES,
    Cc2Op,
    as_tensor,
    float_tensor,
    is_disconnected,
    same_dtype,
    upcast_floats,
)

__all__ = [
    "softmax_cross_entropy",
    "top_k_error",
    "SoftmaxCrossEntropy",
    "SoftmaxCrossEntropyGrad",
    "TopKError",
    "softmax_cross_entropy_reference",
    "softmax_cross_entropy_grad_reference",
    "top_k_error_reference",
    # the skeletons the host ops share with their GPU twins
    "SoftmaxCrossEntropyFamily",
    "HOST_FAMILY",
    "SoftmaxCrossEntropySkeleton",
    "SoftmaxCrossEntropyGradSkeleton",
    "TopKErrorSkeleton",
]

_BK = "(B, K)"
_B = "(B,)"

_SCE = "SoftmaxCrossEntropy"
_SCE_GRAD = "SoftmaxCrossEntropyGrad"
_TOPK = "TopKError"


# --------------------------------------------------------------------------
# numpy references
# --------------------------------------------------------------------------


def _check_logits(op: str, x: Any) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{op}: logits must have 2 dims {_BK}, got {x.ndim}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{op}: logits must be float32 or float64, got {x.dtype}")
    if x.shape[1] < 1:
        raise ValueError(
            f"{op}: logits must have at least one class (K >= 1), got shape {x.shape}"
        )
    return x


def _check_labels(op: str, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Integer labels, one per row of ``x``, each in ``[0, K)``."""
    b, k = x.shape
    if y.ndim != 1:
        raise ValueError(f"{op}: integer labels must have 1 dim {_B}, got {y.ndim}")
    if y.shape[0] != b:
        raise ValueError(
            f"{op}: labels must have one entry per row of logits (B = {b}), got "
            f"{y.shape[0]}"
        )
    bad = (y < 0) | (y >= k)
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(
            f"{op}: labels must be in [0, K) = [0, {k}), got {int(y[row])} at row {row}"
        )
    return y


def _check_targets(op: str, t: Any, x: np.ndarray) -> np.ndarray:
    """Integer labels (B,) or soft targets of ``x``'s dtype and shape."""
    t = np.asarray(t)
    if t.dtype.kind in "iu":
        return _check_labels(op, t, x)
    if t.dtype.kind != "f":
        raise TypeError(
            f"{op}: targets must be integer labels {_B} or float probabilities "
            f"{_BK}, got dtype {t.dtype}"
        )
    if t.dtype != x.dtype:
        raise TypeError(
            f"{op}: soft targets must have the logits' dtype ({x.dtype}), got {t.dtype}"
        )
    if t.shape != x.shape:
        raise ValueError(
            f"{op}: soft targets must have the logits' shape {_BK} = {x.shape}, got "
            f"{t.shape}"
        )
    return t


def _shifted_logsumexp(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(z, e, log s)``: ``z = x - max``, ``e = exp(z)``, ``s = sum e`` (B, 1).

    Subtracting the row maximum keeps ``exp`` in range for any finite logits
    (``z <= 0`` and the largest term is 1, so ``1 <= s <= K``).
    """
    z = x - x.max(axis=1, keepdims=True)
    e = np.exp(z)
    return z, e, np.log(e.sum(axis=1, keepdims=True))


def softmax_cross_entropy_reference(
    logits: np.ndarray, targets: np.ndarray
) -> np.ndarray:
    """Per-example softmax cross-entropy in numpy (the CPU op's computation).

    Parameters
    ----------
    logits : ndarray, float32 or float64, shape (B, K)
        Unnormalised class scores, one row per example, ``K >= 1``.
    targets : ndarray
        Integer labels of shape (B,), each in ``[0, K)``; or soft targets
        (probabilities) of shape (B, K) and the logits' dtype.

    Returns
    -------
    ndarray, shape (B,), dtype of ``logits``
        ``logsumexp(x_i) - x_i[y_i]``, or ``-sum_k t_ik log softmax(x_i)_k``.

    Raises
    ------
    ValueError
        A label outside ``[0, K)`` (the message gives the value and its row),
        or mismatched shapes.
    TypeError
        Wrong dtypes.

    Notes
    -----
    Vectorised over the batch; the arithmetic runs in the logits' dtype. With
    ``z = x - max(x)`` the loss is ``log sum exp(z) - z[y]``, which stays finite
    and accurate for logits as large as ``1e4`` in magnitude, in float32 too.
    """
    x = _check_logits(_SCE, logits)
    t = _check_targets(_SCE, targets, x)
    z, _, log_s = _shifted_logsumexp(x)
    if t.dtype.kind in "iu":
        picked = np.take_along_axis(z, t.astype(np.intp)[:, None], axis=1)
        return (log_s - picked)[:, 0]
    return -(t * (z - log_s)).sum(axis=1)


def softmax_cross_entropy_grad_reference(
    g: np.ndarray, logits: np.ndarray, targets: np.ndarray
) -> np.ndarray:
    """Gradient of :func:`softmax_cross_entropy_reference` wrt the logits.

    Parameters
    ----------
    g : ndarray, shape (B,), dtype of ``logits``
        Cotangent of the per-example loss.
    logits : ndarray, float32 or float64, shape (B, K)
        The forward logits.
    targets : ndarray
        Integer labels (B,) in ``[0, K)`` or soft targets (B, K), as in the
        forward.

    Returns
    -------
    ndarray, shape (B, K), dtype of ``logits``
        ``(softmax(x) - onehot(y)) * g[:, None]``, or for soft targets
        ``(softmax(x) * sum_k t_k - t) * g[:, None]``.

    Notes
    -----
    The softmax is recomputed from the logits (max-subtracted), as the GPU
    kernel does: it reads the logits once and writes the gradient once.
    """
    x = _check_logits(_SCE_GRAD, logits)
    g = np.asarray(g)
    if g.ndim != 1:
        raise ValueError(f"{_SCE_GRAD}: g must have 1 dim {_B}, got {g.ndim}")
    if g.dtype != x.dtype:
        raise TypeError(
            f"{_SCE_GRAD}: g must have the logits' dtype ({x.dtype}), got {g.dtype}"
        )
    if g.shape[0] != x.shape[0]:
        raise ValueError(
            f"{_SCE_GRAD}: g must have one entry per row of logits (B = "
            f"{x.shape[0]}), got {g.shape[0]}"
        )
    t = _check_targets(_SCE_GRAD, targets, x)
    _, e, _ = _shifted_logsumexp(x)
    sm = e / e.sum(axis=1, keepdims=True)
    if t.dtype.kind in "iu":
        rows = np.arange(x.shape[0])
        sm[rows, t] -= x.dtype.type(1)
        return sm * g[:, None]
    return (sm * t.sum(axis=1, keepdims=True) - t) * g[:, None]


def _check_k(op: str, k: Any) -> int:
    if not isinstance(k, numbers.Integral) or isinstance(k, bool):
        raise TypeError(f"{op}: k must be an int, got {k!r}")
    if k < 1:
        raise ValueError(f"{op}: k must be >= 1, got {k}")
    return int(k)


def top_k_error_reference(logits: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Top-k classification error per example, in numpy.

    Parameters
    ----------
    logits : ndarray, float32 or float64, shape (B, K)
        Class scores.
    labels : ndarray of int, shape (B,)
        True classes, each in ``[0, K)``.
    k : int, >= 1
        How many of the highest-scoring classes count as a hit.

    Returns
    -------
    ndarray, shape (B,), dtype of ``logits``
        1.0 where the true class is not among the ``k`` largest logits, else
        0.0.

    Notes
    -----
    Ties: an example is correct when fewer than ``k`` classes have a logit
    strictly greater than the true class's logit, so ties are resolved in
    the true class's favour. ``k >= K`` makes every example correct. A NaN
    true logit compares false against every class and so counts as correct.
    """
    x = _check_logits(_TOPK, logits)
    y = np.asarray(labels)
    if y.dtype.kind not in "iu":
        raise TypeError(f"{_TOPK}: labels must have an integer dtype, got {y.dtype}")
    y = _check_labels(_TOPK, y, x)
    k = _check_k(_TOPK, k)
    true = np.take_along_axis(x, y.astype(np.intp)[:, None], axis=1)
    above = np.count_nonzero(x > true, axis=1)
    return (above >= k).astype(x.dtype)


# --------------------------------------------------------------------------
# ops: one skeleton per op, shared with the GPU ops
# --------------------------------------------------------------------------


def _is_soft(targets: TensorVariable) -> bool:
    return targets.type.dtype in FLOAT_DTYPES


def _symbolic_grad(
    g: TensorVariable, x: TensorVariable, t: TensorVariable
) -> TensorVariable:
    """:class:`SoftmaxCrossEntropyGrad` as a plain PyTensor graph.

    Differentiating it gives the op's own gradient (second derivatives of the
    loss); it is never used for the gradient values themselves.
    """
    sm = softmax(x, axis=1)
    if _is_soft(t):
        d = sm * t.sum(axis=1, keepdims=True) - t
    else:
        classes = pt.arange(x.shape[1], dtype=t.type.dtype)
        d = sm - pt.cast(pt.eq(classes[None, :], t[:, None]), x.type.dtype)
    return d * g[:, None]


class SoftmaxCrossEntropyFamily(NamedTuple):
    """The softmax cross-entropy op classes of one backend by role: a skeleton's
    ``family`` (:mod:`cc2ops._op`; :data:`HOST_FAMILY` here, ``GPU_FAMILY`` on
    the GPU)."""

    loss: type
    loss_grad: type
    top_k_error: type


class _Skeleton:
    """The input rules every op of the family shares, host and GPU alike.

    Each takes a variable that the op's ``make_node`` already converted (a
    host tensor or a GPU variable) and checks what does not depend on where
    it lives.
    """

    family: ClassVar[SoftmaxCrossEntropyFamily]

    @staticmethod
    def _check_classes(op: str, x: Variable) -> Variable:
        """Logits (B, K) with at least one class."""
        if x.type.shape[1] == 0:
            raise ValueError(
                f"{op}: logits must have at least one class (K >= 1), got shape "
                f"{x.type.shape}"
            )
        return x

    @staticmethod
    def _checked_targets(op: str, t: Variable, x: Variable) -> Variable:
        """Integer labels (B,) or soft targets (B, K) of the logits' dtype."""
        dtype = t.type.dtype
        if dtype in INT_DTYPES:
            if t.type.ndim != 1:
                raise TypeError(
                    f"{op}: integer targets (labels) must have 1 dim {_B}, got "
                    f"{t.type.ndim}"
                )
            expected, what = x.type.shape[:1], "labels"
        elif dtype in FLOAT_DTYPES:
            if t.type.ndim != 2:
                raise TypeError(
                    f"{op}: float targets (probabilities) must have 2 dims {_BK}, "
                    f"got {t.type.ndim}"
                )
            same_dtype(op, logits=x, targets=t)
            expected, what = x.type.shape, "soft targets"
        else:
            raise TypeError(
                f"{op}: targets must be integer labels {_B} or float32/float64 "
                f"probabilities {_BK}, got dtype {dtype}"
            )
        for e, s in zip(expected, t.type.shape, strict=True):
            if e is not None and s is not None and e != s:
                raise ValueError(
                    f"{op}: {what} must match the logits {_BK} = {x.type.shape}, "
                    f"got shape {t.type.shape}"
                )
        return t

    @staticmethod
    def _rows(op: str, role: str, v: Variable, x: Variable) -> int | None:
        """The static B of ``v`` (B,) and the logits (B, K), which must agree."""
        b, vb = x.type.shape[0], v.type.shape[0]
        if b is not None and vb is not None and b != vb:
            raise ValueError(
                f"{op}: {role} must have one entry per row of logits (B = {b}), "
                f"got shape {v.type.shape}"
            )
        return b if b is not None else vb


class SoftmaxCrossEntropySkeleton(_Skeleton):
    """:class:`SoftmaxCrossEntropy` and its GPU twin but for ``make_node`` and
    ``perform``.

    ``(logits, targets) -> loss``: shape rule, connection pattern (labels are
    disconnected) and pullback (``family.loss_grad`` wrt the logits,
    ``-log_softmax(logits) * g[:, None]`` wrt soft targets, a PyTensor graph
    on host views moved to the targets' place).
    """

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0][:1]]

    def connection_pattern(self, node):
        return [[True], [_is_soft(node.inputs[1])]]

    def pullback(self, inputs, outputs, cotangents):
        x, t = inputs
        g = cotangents[0]
        if is_disconnected(g):
            return [disconnected_type(), disconnected_type()]
        g = self._cotangent(g, x)
        dx = self.family.loss_grad()(g, x, t)
        if not _is_soft(t):
            return [dx, disconnected_type()]
        dt = -log_softmax(self._host(x), axis=1) * self._host(g)[:, None]
        return [dx, self._on_device(dt, x)]


class SoftmaxCrossEntropyGradSkeleton(_Skeleton):
    """:class:`SoftmaxCrossEntropyGrad` and its GPU twin but for ``make_node``
    and ``perform``.

    ``(g, logits, targets) -> dlogits``: shape rule, connection pattern and
    pullback (second derivatives): the formula written with PyTensor's
    softmax and differentiated, on host views of the inputs (``_host``), each
    result moved to its input's place (``_cotangent``).
    """

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[1]]

    def connection_pattern(self, node):
        return [[True], [True], [_is_soft(node.inputs[2])]]

    def pullback(self, inputs, outputs, cotangents):
        ggx = cotangents[0]
        if is_disconnected(ggx):
            return [disconnected_type()] * 3
        g, x, t = (self._host(v) for v in inputs)
        ggx = self._host(ggx)
        if ggx.type.dtype != x.type.dtype:
            ggx = pt.cast(ggx, x.type.dtype)
        soft = _is_soft(t)
        # Stand-ins for the inputs: g is usually computed from x (g = dL/dloss),
        # and differentiating through that path here would count it twice once
        # the caller's chain rule adds it again.
        g_, x_ = g.type(), x.type()
        t_ = t.type() if soft else t
        wrt = [g_, x_, t_] if soft else [g_, x_]
        grads = pytensor.gradient.pullback(
            _symbolic_grad(g_, x_, t_), wrt, ggx, disconnected_inputs="ignore"
        )
        replace = {g_: g, x_: x}
        if soft:
            replace[t_] = t
        grads = list(graph_replace(grads, replace, strict=False))
        if not soft:
            grads.append(disconnected_type())
        # each cotangent takes its input's dtype and place (a disconnected one
        # passes)
        return [self._cotangent(gv, v) for gv, v in zip(grads, inputs, strict=True)]


class TopKErrorSkeleton(_Skeleton):
    """:class:`TopKError` and its GPU twin but for ``make_node`` and ``perform``.

    ``(logits, labels) -> err``: the parameter ``k``, the labels rule
    (:meth:`_check_labels`), the shape rule, connection pattern and the
    pullback (zero wrt the logits: the function is piecewise constant).
    """

    def __init__(self, *, k: int = 1) -> None:
        self.k = _check_k(_TOPK, k)

    def _check_labels(self, op: str, y: Variable, x: Variable) -> int | None:
        """Integer labels (B,), one per row of the logits; their static B."""
        if y.type.dtype not in INT_DTYPES:
            raise TypeError(
                f"{op}: labels must have an integer dtype, got {y.type.dtype}"
            )
        if y.type.ndim != 1:
            raise TypeError(f"{op}: labels must have 1 dim {_B}, got {y.type.ndim}")
        return self._rows(op, "labels", y, x)

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0][:1]]

    def connection_pattern(self, node):
        return [[True], [False]]

    def pullback(self, inputs, outputs, cotangents):
        x, _ = inputs
        return [self._zeros_like(x), disconnected_type()]


class _HostOp(Cc2Op):
    """The host ops' base: the host op machinery (and no props but ``k``)."""

    __props__ = ()


class SoftmaxCrossEntropy(SoftmaxCrossEntropySkeleton, _HostOp):
    """Per-example cross-entropy of softmax(logits) against targets.

    ``SoftmaxCrossEntropy()(logits, targets)``: ``logits`` (B, K) float32 or
    float64; ``targets`` integer labels (B,) or soft targets (B, K) of the
    logits' dtype (which of the two is decided by the targets' dtype). Returns
    the loss (B,) in the logits' dtype.

    Notes
    -----
    Prefer the builder :func:`softmax_cross_entropy`. The gradient wrt the
    logits is :class:`SoftmaxCrossEntropyGrad`; soft targets get
    ``-log_softmax(logits) * g[:, None]``; integer labels are disconnected.
    Labels outside ``[0, K)`` raise ``ValueError`` when the function runs.
    """

    def make_node(self, logits: Any, targets: Any) -> Apply:
        x = self._check_classes(_SCE, float_tensor(_SCE, "logits", logits, 2, _BK))
        t = self._checked_targets(_SCE, as_tensor(_SCE, "targets", targets), x)
        out = TensorType(x.type.dtype, shape=x.type.shape[:1])()
        return Apply(self, [x, t], [out])

    def perform(self, node, inputs, output_storage):
        x, t = inputs
        output_storage[0][0] = softmax_cross_entropy_reference(x, t)


class SoftmaxCrossEntropyGrad(SoftmaxCrossEntropyGradSkeleton, _HostOp):
    """Gradient of :class:`SoftmaxCrossEntropy` with respect to the logits.

    ``SoftmaxCrossEntropyGrad()(g, logits, targets)``: ``g`` (B,) the
    cotangent of the loss, ``logits`` (B, K), ``targets`` integer labels (B,)
    or soft targets (B, K), all floats of one dtype. Returns ``dlogits``
    (B, K)::

        integer labels:  (softmax(x) - onehot(y)) * g[:, None]
        soft targets:    (softmax(x) * sum_k t_k - t) * g[:, None]

    Notes
    -----
    One fused op: it recomputes the softmax from the logits instead of
    keeping the forward's probabilities alive, so the GPU kernel reads the
    logits once and writes ``dlogits`` once. Its own gradient (wrt ``g``, the
    logits and soft targets) differentiates the formula above written with
    PyTensor's softmax, so derivatives of any order are available.
    """

    def make_node(self, g: Any, logits: Any, targets: Any) -> Apply:
        op = _SCE_GRAD
        x = self._check_classes(op, float_tensor(op, "logits", logits, 2, _BK))
        g = float_tensor(op, "g", g, 1, _B)
        same_dtype(op, g=g, logits=x)
        b = self._rows(op, "g", g, x)
        t = self._checked_targets(op, as_tensor(op, "targets", targets), x)
        out = TensorType(x.type.dtype, shape=(b, x.type.shape[1]))()
        return Apply(self, [g, x, t], [out])

    def perform(self, node, inputs, output_storage):
        g, x, t = inputs
        output_storage[0][0] = softmax_cross_entropy_grad_reference(g, x, t)


class TopKError(TopKErrorSkeleton, _HostOp):
    """Top-k classification error per example.

    ``TopKError(k=...)(logits, labels)``: ``logits`` (B, K) float32/float64,
    ``labels`` integer (B,). Returns (B,) in the logits' dtype: 1.0 where the
    true class is not among the ``k`` largest logits, else 0.0.

    Notes
    -----
    Ties count in the true class's favour: an example is correct when fewer
    than ``k`` classes have a logit strictly greater than its true class's.
    ``k`` larger than K is allowed (every example is then correct). Labels
    outside ``[0, K)`` raise ``ValueError`` when the function runs. The
    function is piecewise constant: its gradient wrt the logits is zero and
    the labels are disconnected.
    """

    __props__ = ("k",)

    def make_node(self, logits: Any, labels: Any) -> Apply:
        x = self._check_classes(_TOPK, float_tensor(_TOPK, "logits", logits, 2, _BK))
        y = as_tensor(_TOPK, "labels", labels)
        b = self._check_labels(_TOPK, y, x)
        out = TensorType(x.type.dtype, shape=(b,))()
        return Apply(self, [x, y], [out])

    def perform(self, node, inputs, output_storage):
        x, y = inputs
        output_storage[0][0] = top_k_error_reference(x, y, self.k)


#: The host ops by role (their skeletons' ``family``).
HOST_FAMILY = SoftmaxCrossEntropyFamily(
    SoftmaxCrossEntropy, SoftmaxCrossEntropyGrad, TopKError
)
_HostOp.family = HOST_FAMILY


# --------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------


def softmax_cross_entropy(logits: Any, targets: Any) -> TensorVariable:
    """Per-example cross-entropy of ``softmax(logits)`` against ``targets``.

    Parameters
    ----------
    logits : tensor, float32 or float64, shape (B, K)
        Unnormalised class scores, one row per example (K >= 1).
    targets : tensor
        Either integer labels of shape (B,), each in ``[0, K)``, or soft
        targets (probabilities, e.g. one-hot or label-smoothed) of shape
        (B, K). Float logits and soft targets of different float dtypes are
        both cast to the wider one.

    Returns
    -------
    tensor, shape (B,)
        ``logsumexp(x_i) - x_i[y_i]`` for labels, ``-sum_k t_ik log
        softmax(x_i)_k`` for soft targets; the logits' (common) dtype.

    Raises
    ------
    TypeError
        Logits or targets that are not tensors at all (``None``, a string,
        ...); logits that are not a 2-d float tensor; targets that are neither
        a 1-d integer nor a 2-d float tensor.
    ValueError
        Statically known shapes that disagree; at run time, shapes that
        disagree or a label outside ``[0, K)`` (the message gives the label
        and its row).

    Notes
    -----
    Numerically stable: the row maximum is subtracted before ``exp``, so
    logits of magnitude ``1e4`` give finite, accurate losses in float32 and
    float64. Soft targets need not sum to one; the loss is linear in them and
    they are differentiable. Reduce with ``.mean()`` for the usual batch cost.
    """
    logits, targets = upcast_floats(_SCE, logits=logits, targets=targets)
    return SoftmaxCrossEntropy()(logits, targets)


def top_k_error(logits: Any, labels: Any, k: int = 1) -> TensorVariable:
    """Top-k classification error per example (1.0 = wrong, 0.0 = right).

    Parameters
    ----------
    logits : tensor, float32 or float64, shape (B, K)
        Class scores (logits or probabilities: only their order matters).
    labels : tensor of int, shape (B,)
        True classes, each in ``[0, K)``.
    k : int, >= 1
        An example is right when its true class is among the ``k`` highest
        scores.

    Returns
    -------
    tensor, shape (B,), dtype of ``logits``
        ``.mean()`` of it is the batch's top-k error rate.

    Raises
    ------
    TypeError
        Wrong tensor types, or a ``k`` that is not an int.
    ValueError
        ``k < 1``; statically mismatched batch sizes; at run time, a label
        outside ``[0, K)``.

    Notes
    -----
    Tie rule: an example is correct when fewer than ``k`` classes have a score
    strictly greater than the true class's score. ``k >= K`` is allowed and
    makes every example correct. The gradient wrt the logits is zero.
    """
    return TopKError(k=k)(logits, labels)
