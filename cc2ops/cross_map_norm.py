"""Cross-map (across-channel) response normalisation, cuda-convnet2's ``cmrnorm``.

For images ``x`` in the bc01 layout (B, C, H, W), channel ``c`` is divided by
a power of the (scaled) sum of squares over a window of neighbouring channels::

    d_c = k + (alpha / size) * sum_{c' in W(c)} x_{c'}**2
    y_c = x_c / d_c**beta

``W(c)`` is ``c - size//2 .. c + (size-1)//2`` clipped to the valid channels
(or, with ``blocked=True``, the non-overlapping group of ``size`` channels
that holds ``c``); :func:`cc2ops.shapes.cross_map_window_bounds` states the
rule. The gradient is::

    gx_j = gy_j d_j**-beta
           - (2 alpha beta / size) x_j sum_{c : j in W(c)} gy_c x_c d_c**(-beta-1)

where ``{c : j in W(c)}`` is the transposed window
(:func:`cc2ops.shapes.cross_map_transposed_window_bounds`), which differs from
``W(j)`` for even ``size``.

Public names: the builder :func:`cross_map_norm`, the ops
:class:`CrossMapNorm` and :class:`CrossMapNormGrad`, and the numpy references
:func:`cross_map_norm_reference` and :func:`cross_map_norm_grad_reference`
(the ops' ``perform``; the GPU tests and benchmarks compare against them).
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import numpy as np
import pytensor.gradient
import pytensor.tensor as pt
from pytensor.graph.basic import Apply, Variable
from pytensor.graph.replace import graph_replace
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

from cc2ops._op import Cc2Op, float_tensor, is_disconnected, same_dtype
from cc2ops.layout import axes_doc, check_layout, images_from_bc01, images_to_bc01
from cc2ops.shapes import (
    cross_map_params,
    cross_map_transposed_window_bounds,
    cross_map_window_bounds,
    merge_static_shapes,
)

__all__ = [
    "cross_map_norm",
    "CrossMapNorm",
    "CrossMapNormGrad",
    "cross_map_norm_reference",
    "cross_map_norm_grad_reference",
    # the skeletons the host ops share with their GPU twins
    "CrossMapNormFamily",
    "HOST_FAMILY",
    "CrossMapNormParams",
    "CrossMapNormSkeleton",
    "CrossMapNormGradSkeleton",
]

_BC01 = "(B, C, H, W)"


# --------------------------------------------------------------------------
# numpy references
# --------------------------------------------------------------------------


def _float_array(op: str, role: str, a: Any) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 4:
        raise ValueError(f"{op}: {role} must have 4 dims {_BC01}, got {a.ndim}")
    if a.dtype not in (np.float32, np.float64):
        raise TypeError(f"{op}: {role} must be float32 or float64, got {a.dtype}")
    return a


def _window_sums(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``sum(v[:, lo[c]:hi[c]], axis=1)`` for every channel ``c`` at once.

    One cumulative sum along the channels turns every window sum into a
    difference of two entries. ``v`` is (B, C, H, W); the result has its shape
    and dtype.
    """
    b, c, h, w = v.shape
    # A float32 running sum over all C channels carries an error of about
    # eps * |running sum|, which the difference hands on to a window sum that
    # can be far smaller (signed sums in the gradient, large C). The running
    # sum is therefore kept in float64 and each window sum rounded back to
    # v's dtype, which leaves it as accurate as a direct float32 window sum.
    cs = np.zeros((b, c + 1, h, w), dtype=np.float64)
    np.cumsum(v, axis=1, dtype=np.float64, out=cs[:, 1:])
    return (cs[:, hi] - cs[:, lo]).astype(v.dtype, copy=False)


def _denominators(
    x: np.ndarray, size: int, alpha: float, k: float, blocked: bool
) -> np.ndarray:
    """``d = k + (alpha/size) * window sum of x**2``, in ``x``'s dtype."""
    lo, hi = cross_map_window_bounds(x.shape[1], size, blocked)
    t = x.dtype.type
    return t(k) + t(alpha / size) * _window_sums(x * x, lo, hi)


def cross_map_norm_reference(
    x: np.ndarray,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    blocked: bool = False,
) -> np.ndarray:
    """Cross-map response normalisation in numpy (the CPU op's computation).

    Parameters
    ----------
    x : ndarray, float32 or float64, shape (B, C, H, W)
        Images in the bc01 layout.
    size, alpha, beta, k, blocked
        As in :func:`cross_map_norm` (``alpha`` is the un-divided alpha).

    Returns
    -------
    ndarray, shape (B, C, H, W), dtype of ``x``
        ``y = x / (k + (alpha/size) * window sum of x**2)**beta``.

    Notes
    -----
    Vectorised over everything: one cumulative sum along the channels gives
    every window sum (no loop over channels or pixels). The arithmetic runs in
    ``x``'s dtype, except that the cumulative sum itself is accumulated in
    float64 for float32 input and every window sum rounded back to float32:
    differences of a float32 running sum over many channels would lose
    precision that a direct window sum (as the GPU kernel computes it) keeps.
    """
    op = "cross_map_norm_reference"
    x = _float_array(op, "x", x)
    size, alpha, beta, k, blocked = cross_map_params(op, size, alpha, beta, k, blocked)
    d = _denominators(x, size, alpha, k, blocked)
    return x * d ** x.dtype.type(-beta)


def cross_map_norm_grad_reference(
    x: np.ndarray,
    gy: np.ndarray,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    blocked: bool = False,
) -> np.ndarray:
    """Gradient of :func:`cross_map_norm_reference` with respect to ``x``.

    Parameters
    ----------
    x : ndarray, float32 or float64, shape (B, C, H, W)
        The forward input, bc01 layout.
    gy : ndarray, same dtype and shape as ``x``
        Gradient with respect to the forward output, bc01 layout.
    size, alpha, beta, k, blocked
        As in :func:`cross_map_norm`.

    Returns
    -------
    ndarray, shape (B, C, H, W), dtype of ``x``
        ``gx_j = gy_j d_j**-beta - (2 alpha beta / size) x_j
        sum_{c : j in W(c)} gy_c x_c d_c**(-beta-1)``.

    Notes
    -----
    The denominators ``d`` are recomputed from ``x``. The sum over the
    transposed window uses a second cumulative sum with the bounds of
    :func:`cc2ops.shapes.cross_map_transposed_window_bounds`. Arithmetic in
    ``x``'s dtype, with the cumulative sums accumulated as in
    :func:`cross_map_norm_reference`.
    """
    op = "cross_map_norm_grad_reference"
    x = _float_array(op, "x", x)
    gy = _float_array(op, "gy", gy)
    if gy.dtype != x.dtype:
        raise TypeError(f"{op}: gy dtype ({gy.dtype}) must equal x dtype ({x.dtype})")
    if gy.shape != x.shape:
        raise ValueError(
            f"{op}: gy shape must equal x shape {_BC01}, got gy {gy.shape} and x "
            f"{x.shape}"
        )
    size, alpha, beta, k, blocked = cross_map_params(op, size, alpha, beta, k, blocked)
    t = x.dtype.type
    d = _denominators(x, size, alpha, k, blocked)
    p = d ** t(-beta)
    lo_t, hi_t = cross_map_transposed_window_bounds(x.shape[1], size, blocked)
    back = _window_sums(gy * x * (p / d), lo_t, hi_t)
    return gy * p - t(2.0 * alpha * beta / size) * x * back


# --------------------------------------------------------------------------
# the forward written with PyTensor ops (for second derivatives)
# --------------------------------------------------------------------------


def _symbolic_forward(
    x: TensorVariable, size: int, alpha: float, beta: float, k: float, blocked: bool
) -> TensorVariable:
    """The forward as a plain PyTensor graph of a bc01 ``x`` (any symbolic C).

    Differentiating it gives the gradient of :class:`CrossMapNormGrad`; it is
    never used for the forward values themselves.
    """
    dtype = x.type.dtype

    def const(v: float) -> TensorVariable:
        return pt.constant(np.asarray(v, dtype=dtype))

    # Channel padding is built by concatenating zero blocks, never by
    # set_subtensor into a zeros tensor: PyTensor 3.0.7's
    # local_add_of_sparse_write turns `a + set_subtensor(zeros[idx], v)` into
    # `inc_subtensor(a[idx], v)` even when `a` is a broadcast scalar such as
    # k, which then fails at run time (issue 20). A join has no such rewrite.
    sq = pt.sqr(x)
    b, c, h, w = x.shape[0], x.shape[1], x.shape[2], x.shape[3]

    def zeros(channels) -> TensorVariable:
        return pt.zeros((b, channels, h, w), dtype=dtype)

    if blocked:
        # pad the channels to whole groups, sum each group, spread it back
        groups = (c + size - 1) // size
        padded = pt.concatenate([sq, zeros(groups * size - c)], axis=1)
        g = padded.reshape((b, groups, size, h, w)).sum(axis=2, keepdims=True)
        spread = pt.broadcast_to(g, (b, groups, size, h, w))
        sums = spread.reshape((b, groups * size, h, w))[:, :c]
    else:
        # zero padding makes the clipped window a sum of `size` shifted slices
        before, after = size // 2, (size - 1) // 2
        parts = [zeros(before)] if before else []
        parts.append(sq)
        if after:
            parts.append(zeros(after))
        padded = pt.concatenate(parts, axis=1) if len(parts) > 1 else sq
        sums = padded[:, :c]
        for tap in range(1, size):
            sums = sums + padded[:, tap : tap + c]
    d = const(k) + const(alpha / size) * sums
    return x * d ** const(-beta)


# --------------------------------------------------------------------------
# ops: one skeleton per op, shared with the GPU ops
# --------------------------------------------------------------------------


class CrossMapNormFamily(NamedTuple):
    """The cross-map normalisation op classes of one backend by role: a skeleton's
    ``family`` (:mod:`cc2ops._op`; :data:`HOST_FAMILY` here, ``GPU_FAMILY`` on
    the GPU)."""

    norm: type
    norm_grad: type


class CrossMapNormParams:
    """Parameters and shape rule of the two ops, host and GPU alike.

    The base of the skeletons below, for op classes with ``__props__ =
    ("size", "alpha", "beta", "k", "blocked")``. ``family`` is the op classes
    of the op's backend (:class:`CrossMapNormFamily`).
    """

    size: int
    alpha: float
    beta: float
    k: float
    blocked: bool
    family: ClassVar[CrossMapNormFamily]

    def __init__(
        self,
        *,
        size: int = 5,
        alpha: float = 1e-4,
        beta: float = 0.75,
        k: float = 2.0,
        blocked: bool = False,
    ) -> None:
        # the parameters are fixed at construction, so they are checked here,
        # once, rather than in every make_node
        self.size, self.alpha, self.beta, self.k, self.blocked = cross_map_params(
            type(self).__name__, size, alpha, beta, k, blocked
        )
        self._check_props()

    def _check_props(self) -> None:
        """A backend's own limits on the parameters (the host has none)."""

    def _params(self) -> dict[str, Any]:
        return dict(
            size=self.size, alpha=self.alpha, beta=self.beta, k=self.k,
            blocked=self.blocked,
        )  # fmt: skip

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]


class CrossMapNormSkeleton(CrossMapNormParams):
    """:class:`CrossMapNorm` and its GPU twin but for ``make_node``/``perform``.

    ``(x) -> y``: the shape rule and the pullback (``family.norm_grad``).
    """

    def pullback(self, inputs, outputs, cotangents):
        (x,) = inputs
        gy = self._cotangent(cotangents[0], x)
        return [self.family.norm_grad(**self._params())(x, gy)]


class CrossMapNormGradSkeleton(CrossMapNormParams):
    """:class:`CrossMapNormGrad` and its GPU twin but for ``make_node`` and
    ``perform``.

    ``(x, gy) -> gx``: the static-shape rule (:meth:`_grad_shape`), the shape
    rule and the pullback (second derivatives): the forward written with
    PyTensor ops and differentiated twice, on host views of the inputs
    (``_host``), each result moved to its input's place (``_cotangent``).
    """

    def _grad_shape(self, x: Variable, gy: Variable) -> tuple:
        """The output's static shape; ``gy`` must have ``x``'s shape."""
        for xs, gs in zip(x.type.shape, gy.type.shape, strict=True):
            if xs is not None and gs is not None and xs != gs:
                raise ValueError(
                    f"{type(self).__name__}: gy shape must equal x shape {_BC01}, "
                    f"got gy {gy.type.shape} and x {x.type.shape}"
                )
        return merge_static_shapes(x.type.shape, gy.type.shape)

    def pullback(self, inputs, outputs, cotangents):
        x, gy = inputs
        ggx = cotangents[0]
        if is_disconnected(ggx):
            return [ggx, ggx]
        hx, hgy, hggx = self._host(x), self._host(gy), self._host(ggx)
        if hggx.type.dtype != hx.type.dtype:
            hggx = pt.cast(hggx, hx.type.dtype)
        # Differentiate with stand-ins for the inputs: gy is usually computed
        # from x (gy = dL/dy(x)), and differentiating through that path here
        # would count it twice once the caller's chain rule adds it again.
        x_, gy_ = hx.type(), hgy.type()
        y = _symbolic_forward(x_, **self._params())
        gx = pytensor.gradient.pullback(y, x_, gy_, disconnected_inputs="ignore")
        grads = pytensor.gradient.pullback(
            gx, [x_, gy_], hggx, disconnected_inputs="ignore"
        )
        grads = graph_replace(grads, {x_: hx, gy_: hgy}, strict=False)
        return [self._cotangent(g, x) for g in grads]


class _CrossMapBase(Cc2Op):
    """The host ops' base: their props and the host op machinery."""

    __props__ = ("size", "alpha", "beta", "k", "blocked")


class CrossMapNorm(CrossMapNormSkeleton, _CrossMapBase):
    """Cross-map response normalisation of bc01 images.

    ``CrossMapNorm(size=..., alpha=..., beta=..., k=..., blocked=...)(x)``
    with ``x`` of shape (B, C, H, W) returns ``y`` of the same shape and
    dtype; see :func:`cross_map_norm` for the formula and the parameters.

    Notes
    -----
    Prefer the builder :func:`cross_map_norm`, which also accepts the c01b
    layout. The gradient is :class:`CrossMapNormGrad`.
    """

    def make_node(self, x: Any) -> Apply:
        x = float_tensor("CrossMapNorm", "x", x, 4, _BC01)
        out = TensorType(x.type.dtype, shape=x.type.shape)()
        return Apply(self, [x], [out])

    def perform(self, node, inputs, output_storage):
        (x,) = inputs
        output_storage[0][0] = cross_map_norm_reference(x, **self._params())


class CrossMapNormGrad(CrossMapNormGradSkeleton, _CrossMapBase):
    """Gradient of :class:`CrossMapNorm` with respect to its input.

    ``CrossMapNormGrad(size=..., alpha=..., beta=..., k=..., blocked=...)(x,
    gy)``: ``x`` is the forward input (B, C, H, W) and ``gy`` the gradient of
    the forward output (B, C, H, W), same dtype and shape; returns ``gx``
    (B, C, H, W).

    Notes
    -----
    The denominators are recomputed from ``x`` instead of being kept alive as
    a second forward output: the GPU kernel reads ``x`` and ``gy`` once each
    and writes ``gx``, so the forward needs no extra memory. With ``d_c = k +
    (alpha/size) * sum_{c' in W(c)} x_{c'}**2``::

        gx_j = gy_j d_j**-beta
               - (2 alpha beta / size) x_j sum_{c : j in W(c)} gy_c x_c d_c**(-beta-1)

    Its own gradient (second derivatives of the forward, with respect to both
    ``x`` and ``gy``) differentiates the forward written as a PyTensor graph,
    so any order of derivative is available.
    """

    def make_node(self, x: Any, gy: Any) -> Apply:
        op = "CrossMapNormGrad"
        x = float_tensor(op, "x", x, 4, _BC01)
        gy = float_tensor(op, "gy", gy, 4, _BC01)
        same_dtype(op, x=x, gy=gy)
        out = TensorType(x.type.dtype, shape=self._grad_shape(x, gy))()
        return Apply(self, [x, gy], [out])

    def perform(self, node, inputs, output_storage):
        x, gy = inputs
        if x.shape != gy.shape:
            raise ValueError(
                f"CrossMapNormGrad: gy shape must equal x shape {_BC01}, got gy "
                f"{gy.shape} and x {x.shape}"
            )
        output_storage[0][0] = cross_map_norm_grad_reference(x, gy, **self._params())


#: The host ops by role (their skeletons' ``family``).
HOST_FAMILY = CrossMapNormFamily(CrossMapNorm, CrossMapNormGrad)
_CrossMapBase.family = HOST_FAMILY


# --------------------------------------------------------------------------
# builder
# --------------------------------------------------------------------------


def cross_map_norm(
    x: Any,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    blocked: bool = False,
    layout: str = "bc01",
) -> TensorVariable:
    """Cross-map (across-channel) response normalisation, cuda-convnet2's cmrnorm.

    ``y_c = x_c / (k + (alpha/size) * sum_{c'} x_{c'}**2)**beta`` where ``c'``
    runs over ``c - size//2 .. c + (size-1)//2`` clipped to the valid
    channels.

    Parameters
    ----------
    x : tensor, float32 or float64
        Images, (B, C, H, W) for ``layout="bc01"`` or (C, H, W, B) for
        ``layout="c01b"``. Any number of channels, including ``C < size`` and
        ``C = 1``.
    size : int, >= 1
        Number of channels in the window (or in a group when ``blocked``).
    alpha : float, >= 0
        Scale of the sum of squares, *before* the division by ``size``:
        the sum is multiplied by ``alpha / size``. This is the ``alpha`` of
        PyTorch's ``local_response_norm`` and the ``scale`` of a cuda-convnet2
        layer config (cuda-convnet2 divides ``scale`` by ``size`` itself), and
        it is *not* the per-element alpha of some other libraries.
    beta : float
        Exponent of the denominator.
    k : float, > 0
        Additive constant of the denominator.
    blocked : bool
        If true, channel ``c`` is normalised over its own non-overlapping
        group ``[size*(c//size), size*(c//size) + size)`` clipped to the
        channels, with the same ``alpha/size`` scaling.
    layout : {"bc01", "c01b"}
        Axis order of ``x`` and of the result.

    Returns
    -------
    tensor
        ``y``, same shape, layout and dtype as ``x``.

    Raises
    ------
    TypeError
        ``x`` is not a 4-d float32/float64 tensor; ``size`` is not an int;
        ``alpha``, ``beta`` or ``k`` is not a real number; ``blocked`` is not
        a bool.
    ValueError
        ``size < 1``; ``alpha < 0``; ``k <= 0``; a non-finite parameter; an
        unknown layout.

    Notes
    -----
    Without ``blocked``, PyTorch's
    ``local_response_norm(x, size, alpha, beta, k)`` computes the same
    function (it averages ``x**2`` over the zero-padded window, which is
    ``1/size`` times the clipped sum). For an even ``size`` the window reaches
    one channel further back than forward. ``k > 0`` and ``alpha >= 0`` keep
    the denominator positive, so the result is finite for every finite input.
    The computation runs in bc01; ``layout="c01b"`` adds a dimshuffle on
    either side.
    """
    op = CrossMapNorm(size=size, alpha=alpha, beta=beta, k=k, blocked=blocked)
    check_layout("CrossMapNorm", layout)
    x = float_tensor("CrossMapNorm", "x", x, 4, axes_doc(layout))
    return images_from_bc01(op(images_to_bc01(x, layout)), layout)
