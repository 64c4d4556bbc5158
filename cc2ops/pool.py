"""Max and average pooling with cuda-convnet2's window rule, on the CPU.

The builders :func:`max_pool2d` and :func:`avg_pool2d` accept images in the
``bc01`` (B, C, H, W) or ``c01b`` (C, H, W, B) order; the ops compute in
``bc01``. Window placement is the pooling rule of :mod:`cc2ops.shapes`: along
each axis window ``o`` covers ``[start + o*stride, start + o*stride + size)``
clipped to the image, and there are

    n = ceil((L - start - size) / stride) + 1

windows, one fewer when the last would start at or past the image edge
(PyTorch's ``ceil_mode`` fix of cuda-convnet2's rule).

The ops form two families closed under differentiation::

    MaxPool(x) = y
    MaxPoolGrad(x, y, gy) = gx          pullback of MaxPool
    MaxPoolGradGrad(x, y, ggx) = ggy    pullback of MaxPoolGrad wrt gy
    AvgPool(x) = y
    AvgPoolGrad(gy, image_hw) = gx      pullback of AvgPool (its adjoint)

The module-level ``*_reference`` functions are the vectorised numpy
implementations that ``perform`` runs; the GPU tests and benchmarks compare
against them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import disconnected_type
from pytensor.graph.basic import Apply, Variable
from pytensor.tensor.basic import get_underlying_scalar_constant_value
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.variable import TensorConstant, TensorVariable

from cc2ops._op import (
    FLOAT_DTYPES,
    Cc2Op,
    float_tensor,
    int_tensor,
    is_disconnected,
    same_dtype,
)
from cc2ops.layout import axes_doc, check_layout, images_from_bc01, images_to_bc01
from cc2ops.shapes import (
    check_pool_params,
    merge_static_shapes,
    pool_output_length,
    pool_output_shape,
    pool_params,
    pool_window_bounds,
)

__all__ = [
    "max_pool2d",
    "avg_pool2d",
    "MaxPool",
    "MaxPoolGrad",
    "MaxPoolGradGrad",
    "AvgPool",
    "AvgPoolGrad",
    "max_pool_reference",
    "max_pool_grad_reference",
    "max_pool_grad_grad_reference",
    "avg_pool_reference",
    "avg_pool_grad_reference",
    "PoolPlan",
    "image_hw_value",
    # the skeletons the host ops share with their GPU twins
    "PoolFamily",
    "HOST_FAMILY",
    "PoolGeometry",
    "MaxPoolSkeleton",
    "MaxPoolBackwardSkeleton",
    "MaxPoolGradSkeleton",
    "MaxPoolGradGradSkeleton",
    "AvgPoolSkeleton",
    "AvgPoolGradSkeleton",
]

Pair = tuple[int, int]
IntOrPair = int | Sequence[int]

_BC01 = "(B, C, H, W)"


# --------------------------------------------------------------------------
# numpy references
# --------------------------------------------------------------------------


def _describe(size: Pair, stride: Pair, start: Pair) -> str:
    return f"size {size}, stride {stride}, start {start}"


def _array(op: str, role: str, a, axes: str = _BC01) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 4:
        raise TypeError(f"{op}: {role} must have 4 dims {axes}, got {a.ndim}")
    if str(a.dtype) not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {role} must be float32 or float64, got {a.dtype}")
    return a


def _pooled_shape(
    op: str, image_shape: tuple, size: Pair, stride: Pair, start: Pair
) -> tuple[int, int, int, int]:
    ho, wo = pool_output_shape(tuple(image_shape[2:]), size, stride, start, op)
    return (int(image_shape[0]), int(image_shape[1]), ho, wo)


def _check_pooled(
    op: str,
    role: str,
    shape: tuple,
    want: tuple,
    image_shape: tuple,
    size: Pair,
    stride: Pair,
    start: Pair,
) -> None:
    if tuple(shape) != tuple(want):
        raise ValueError(
            f"{op}: {role} shape {tuple(shape)} does not match the pooled shape "
            f"{tuple(want)} of images {tuple(image_shape)} with "
            f"{_describe(size, stride, start)}"
        )


class PoolPlan:
    """Where the windows of one pooling geometry lie in a padded image.

    The image is padded so that every window is a full ``size`` window; tap
    ``(i, j)`` of all windows is then one strided slice of the padded image,
    so the references loop over the ``size[0] * size[1]`` taps only. The
    numba/jax/pytorch/mlx bodies (:mod:`cc2ops.backends`) use the same plan.

    Attributes
    ----------
    n : list of int
        Windows along (rows, cols).
    pads : list of (int, int)
        Padding (before, after) along (rows, cols).
    first : list of int
        Padded index of window 0's first tap along (rows, cols).
    """

    def __init__(self, image_hw: Sequence[int], size: Pair, stride: Pair, start: Pair):
        self.image_hw = (int(image_hw[0]), int(image_hw[1]))
        self.size = size
        self.stride = stride
        self.n: list[int] = []
        self.pads: list[tuple[int, int]] = []
        self.first: list[int] = []  # padded index of window 0's first tap
        for length, k, s, st in zip(self.image_hw, size, stride, start, strict=True):
            n = int(pool_output_length(length, k, s, st))
            lo = max(0, -st)
            hi = max(0, st + (n - 1) * s + k - length)
            self.n.append(n)
            self.pads.append((lo, hi))
            self.first.append(st + lo)

    def pad(self, a: np.ndarray, value: float) -> np.ndarray:
        if not any(lo or hi for lo, hi in self.pads):
            return a
        return np.pad(a, ((0, 0), (0, 0), *self.pads), constant_values=value)

    def crop(self, a: np.ndarray) -> np.ndarray:
        (r0, _), (c0, _) = self.pads
        h, w = self.image_hw
        return a[:, :, r0 : r0 + h, c0 : c0 + w]

    def taps(self) -> Iterator[tuple[slice, slice, slice, slice]]:
        """Index of tap ``(i, j)`` of every window, taps in row-major order."""
        (nr, nc), (sr, sc) = self.n, self.stride
        r0, c0 = self.first
        for i in range(self.size[0]):
            rows = slice(r0 + i, r0 + i + (nr - 1) * sr + 1, sr)
            for j in range(self.size[1]):
                cols = slice(c0 + j, c0 + j + (nc - 1) * sc + 1, sc)
                yield (slice(None), slice(None), rows, cols)

    def counts(self, start: Pair, dtype) -> np.ndarray:
        """Pixels in each clipped window, shape (Ho, Wo)."""
        lo_r, hi_r = pool_window_bounds(
            self.image_hw[0], self.size[0], self.stride[0], start[0]
        )
        lo_c, hi_c = pool_window_bounds(
            self.image_hw[1], self.size[1], self.stride[1], start[1]
        )
        return np.multiply.outer(hi_r - lo_r, hi_c - lo_c).astype(dtype)


def _max_pool(x, size, stride, start, op: str) -> np.ndarray:
    size, stride, start = pool_params(size, stride, start, op)
    x = _array(op, "images", x)
    _pooled_shape(op, x.shape, size, stride, start)
    plan = PoolPlan(x.shape[2:], size, stride, start)
    # -inf padding never wins a max against a real pixel (a window always
    # holds one), and a window of real -inf pixels still yields -inf
    xp = plan.pad(x, -np.inf)
    y = None
    for tap in plan.taps():
        if y is None:
            y = xp[tap].copy()
        else:
            np.maximum(y, xp[tap], out=y)
    return y


def _first_hits(plan: PoolPlan, xp: np.ndarray, y: np.ndarray) -> Iterator[tuple]:
    """Per tap: the windows whose first pixel equal to ``y`` is this tap."""
    found = np.zeros(y.shape, dtype=bool)
    for tap in plan.taps():
        hit = xp[tap] == y
        hit &= ~found
        found |= hit
        yield tap, hit


def _max_inputs(op, x, y, other, other_role, other_is_pooled, size, stride, start):
    size, stride, start = pool_params(size, stride, start, op)
    x = _array(op, "images", x)
    y = _array(op, "pooled output", y)
    other = _array(op, other_role, other)
    want = _pooled_shape(op, x.shape, size, stride, start)
    _check_pooled(op, "pooled output", y.shape, want, x.shape, size, stride, start)
    if other_is_pooled:
        _check_pooled(op, other_role, other.shape, want, x.shape, size, stride, start)
    elif other.shape != x.shape:
        raise ValueError(
            f"{op}: {other_role} shape {other.shape} must equal the image shape "
            f"{x.shape}"
        )
    if not x.dtype == y.dtype == other.dtype:
        raise TypeError(
            f"{op}: inputs must share one float dtype, got images {x.dtype}, "
            f"pooled output {y.dtype}, {other_role} {other.dtype}"
        )
    return x, y, other, size, stride, start


def _max_pool_grad(x, y, gy, size, stride, start, op: str) -> np.ndarray:
    x, y, gy, size, stride, start = _max_inputs(
        op, x, y, gy, "output gradient", True, size, stride, start
    )
    plan = PoolPlan(x.shape[2:], size, stride, start)
    # NaN padding never compares equal to y, so padded pixels never take the
    # gradient, even in a window whose real pixels are all -inf
    xp = plan.pad(x, np.nan)
    gxp = np.zeros(xp.shape, dtype=x.dtype)
    for tap, hit in _first_hits(plan, xp, y):
        # one tap of distinct windows touches distinct pixels: a plain add
        gxp[tap] += np.where(hit, gy, 0)
    return np.ascontiguousarray(plan.crop(gxp))


def _max_pool_grad_grad(x, y, ggx, size, stride, start, op: str) -> np.ndarray:
    x, y, ggx, size, stride, start = _max_inputs(
        op, x, y, ggx, "input gradient", False, size, stride, start
    )
    plan = PoolPlan(x.shape[2:], size, stride, start)
    xp = plan.pad(x, np.nan)
    ggxp = plan.pad(ggx, 0)
    ggy = np.zeros(y.shape, dtype=x.dtype)
    for tap, hit in _first_hits(plan, xp, y):
        np.copyto(ggy, ggxp[tap], where=hit)
    return ggy


def _avg_pool(x, size, stride, start, op: str) -> np.ndarray:
    size, stride, start = pool_params(size, stride, start, op)
    x = _array(op, "images", x)
    _pooled_shape(op, x.shape, size, stride, start)
    plan = PoolPlan(x.shape[2:], size, stride, start)
    xp = plan.pad(x, 0)
    total = None
    for tap in plan.taps():
        if total is None:
            total = xp[tap].copy()
        else:
            total += xp[tap]
    total /= plan.counts(start, x.dtype)
    return total


def image_hw_value(op: str, image_hw: Any) -> Pair:
    """The run-time value of an ``image_hw`` input as a pair of ints.

    An integer vector of 2 entries (H, W), else ``TypeError``/``ValueError``
    naming ``op``; the values themselves are checked by the caller (the
    pooled-shape rule of :mod:`cc2ops.shapes`).
    """
    hw = np.asarray(image_hw)
    if hw.dtype.kind not in "iu":
        raise TypeError(f"{op}: image_hw must have an integer dtype, got {hw.dtype}")
    if hw.shape != (2,):
        raise ValueError(
            f"{op}: image_hw must have 2 entries (H, W), got {hw.tolist()!r}"
        )
    return int(hw[0]), int(hw[1])


def _hw_pair(op: str, image_hw) -> Pair:
    out = image_hw_value(op, image_hw)
    _check_image_hw(op, out)
    return out


def _check_image_hw(op: str, hw: Sequence[int | None]) -> None:
    """An (H, W) of the images, where known, must be >= 1 along both axes.

    Checked before the window rules so that a negative or zero size is
    reported as what it is, not as a window that does not fit.
    """
    if any(n is not None and n < 1 for n in hw):
        raise ValueError(f"{op}: image_hw (H, W) must be >= 1, got {tuple(hw)}")


def _avg_pool_grad(gy, image_hw, size, stride, start, op: str) -> np.ndarray:
    size, stride, start = pool_params(size, stride, start, op)
    gy = _array(op, "output gradient", gy)
    h, w = _hw_pair(op, image_hw)
    image_shape = (gy.shape[0], gy.shape[1], h, w)
    want = _pooled_shape(op, image_shape, size, stride, start)
    _check_pooled(
        op, "output gradient", gy.shape, want, image_shape, size, stride, start
    )
    plan = PoolPlan((h, w), size, stride, start)
    g = gy / plan.counts(start, gy.dtype)
    rows = h + sum(plan.pads[0])
    cols = w + sum(plan.pads[1])
    gxp = np.zeros((gy.shape[0], gy.shape[1], rows, cols), dtype=gy.dtype)
    for tap in plan.taps():
        gxp[tap] += g
    return np.ascontiguousarray(plan.crop(gxp))


def max_pool_reference(
    x: np.ndarray, size: IntOrPair, stride: IntOrPair | None, start: IntOrPair = 0
) -> np.ndarray:
    """Max pooling in numpy (the reference ``MaxPool`` runs).

    Parameters
    ----------
    x : ndarray, float32 or float64, shape (B, C, H, W)
        Images.
    size, stride, start : int or pair of int
        Window size, step and first window position (rows, cols); ``stride``
        ``None`` means ``size``.

    Returns
    -------
    ndarray, shape (B, C, Ho, Wo), dtype of ``x``
        The maximum of every clipped window.

    Notes
    -----
    The image is padded with ``-inf`` so that every window is full, then the
    ``size[0] * size[1]`` window taps (strided slices) are reduced with
    ``np.maximum``. A window holding NaN yields NaN.
    """
    return _max_pool(x, size, stride, start, "max_pool_reference")


def max_pool_grad_reference(
    x: np.ndarray,
    y: np.ndarray,
    gy: np.ndarray,
    size: IntOrPair,
    stride: IntOrPair | None,
    start: IntOrPair = 0,
) -> np.ndarray:
    """Gradient of max pooling wrt the images (the reference ``MaxPoolGrad`` runs).

    Parameters
    ----------
    x : ndarray, shape (B, C, H, W)
        Images.
    y : ndarray, shape (B, C, Ho, Wo)
        The max-pooled images, ``max_pool_reference(x, ...)``.
    gy : ndarray, shape (B, C, Ho, Wo)
        Gradient wrt ``y``.
    size, stride, start : int or pair of int
        As in :func:`max_pool_reference`.

    Returns
    -------
    ndarray, shape (B, C, H, W), dtype of ``x``
        ``gy`` of each window added at the window's first pixel (row-major
        order within the window) equal to ``y``; every other pixel 0.

    Notes
    -----
    With ties the first maximum wins, also when the window's real pixels are
    all ``-inf`` (pixels outside the image never take the gradient). A window
    with no pixel equal to ``y`` (NaN, or a ``y`` not computed from ``x``)
    passes no gradient.
    """
    return _max_pool_grad(x, y, gy, size, stride, start, "max_pool_grad_reference")


def max_pool_grad_grad_reference(
    x: np.ndarray,
    y: np.ndarray,
    ggx: np.ndarray,
    size: IntOrPair,
    stride: IntOrPair | None,
    start: IntOrPair = 0,
) -> np.ndarray:
    """Adjoint of :func:`max_pool_grad_reference` in its ``gy`` argument.

    Parameters
    ----------
    x : ndarray, shape (B, C, H, W)
        Images.
    y : ndarray, shape (B, C, Ho, Wo)
        The max-pooled images.
    ggx : ndarray, shape (B, C, H, W)
        A tensor shaped like the images (the cotangent of the image gradient).
    size, stride, start : int or pair of int
        As in :func:`max_pool_reference`.

    Returns
    -------
    ndarray, shape (B, C, Ho, Wo), dtype of ``x``
        For each window, ``ggx`` at the window's first pixel equal to ``y``
        (0 where no pixel equals ``y``).

    Notes
    -----
    It is also the forward-mode derivative of max pooling: the tangent of
    ``y`` is the tangent of ``x`` at each window's first maximum.
    """
    return _max_pool_grad_grad(
        x, y, ggx, size, stride, start, "max_pool_grad_grad_reference"
    )


def avg_pool_reference(
    x: np.ndarray, size: IntOrPair, stride: IntOrPair | None, start: IntOrPair = 0
) -> np.ndarray:
    """Average pooling in numpy (the reference ``AvgPool`` runs).

    Parameters
    ----------
    x : ndarray, float32 or float64, shape (B, C, H, W)
        Images.
    size, stride, start : int or pair of int
        As in :func:`max_pool_reference`.

    Returns
    -------
    ndarray, shape (B, C, Ho, Wo), dtype of ``x``
        The mean of every window clipped to the image.

    Notes
    -----
    The divisor is the clipped window's pixel count (from
    :func:`cc2ops.shapes.pool_window_bounds`); pixels outside the image are
    never counted. Sums accumulate in the input dtype.
    """
    return _avg_pool(x, size, stride, start, "avg_pool_reference")


def avg_pool_grad_reference(
    gy: np.ndarray,
    image_hw: Sequence[int],
    size: IntOrPair,
    stride: IntOrPair | None,
    start: IntOrPair = 0,
) -> np.ndarray:
    """Gradient of average pooling wrt the images (the reference ``AvgPoolGrad`` runs).

    Parameters
    ----------
    gy : ndarray, float32 or float64, shape (B, C, Ho, Wo)
        Gradient wrt the pooled images.
    image_hw : pair of int
        The image size (H, W); several sizes pool to the same (Ho, Wo).
    size, stride, start : int or pair of int
        As in :func:`max_pool_reference`.

    Returns
    -------
    ndarray, shape (B, C, H, W), dtype of ``gy``
        Each pixel sums ``gy / count`` over the windows that hold it.

    Notes
    -----
    This is the adjoint of :func:`avg_pool_reference`, so applying
    :func:`avg_pool_reference` to a cotangent of the result gives the
    gradient wrt ``gy``.
    """
    return _avg_pool_grad(gy, image_hw, size, stride, start, "avg_pool_grad_reference")


# --------------------------------------------------------------------------
# ops: one skeleton per op, shared with the GPU ops
# --------------------------------------------------------------------------


def _static_hw(image_hw: TensorVariable) -> tuple[int | None, int | None]:
    """The values of a length-2 int vector where they are constants."""
    if isinstance(image_hw, TensorConstant):
        return tuple(int(v) for v in np.asarray(image_hw.data))
    out = []
    for i in range(2):
        try:
            out.append(int(get_underlying_scalar_constant_value(image_hw[i])))
        except NotScalarConstantError:
            out.append(None)
    return tuple(out)


class PoolFamily(NamedTuple):
    """The pooling op classes of one backend by role: a skeleton's ``family``
    (:mod:`cc2ops._op`; :data:`HOST_FAMILY` here, ``GPU_FAMILY`` on the GPU)."""

    max_pool: type
    max_pool_grad: type
    max_pool_grad_grad: type
    avg_pool: type
    avg_pool_grad: type


class PoolGeometry:
    """Parameters and shape rules of the pooling ops, host and GPU alike.

    A mixin for op classes with ``__props__ = ("size", "stride", "start")``
    (declared on the op class itself, where PyTensor builds equality and
    hashing from it), the base of the per-op skeletons below. ``family`` is
    the op classes of the op's backend (:class:`PoolFamily`).
    """

    size: Pair
    stride: Pair
    start: Pair
    family: ClassVar[PoolFamily]

    def __init__(
        self,
        *,
        size: IntOrPair,
        stride: IntOrPair | None = None,
        start: IntOrPair = 0,
    ):
        self.size, self.stride, self.start = pool_params(
            size, stride, start, type(self).__name__
        )

    @property
    def _name(self) -> str:
        return type(self).__name__

    def _params(self) -> dict:
        return dict(size=self.size, stride=self.stride, start=self.start)

    def _static_pooled(self, image_shape: Sequence[int | None]) -> tuple:
        """Static (B, C, Ho, Wo) of static images (B, C, H, W), validated."""
        check_pool_params(
            self._name, self.size, self.stride, self.start, tuple(image_shape[2:])
        )
        hw = tuple(
            None if n is None else int(pool_output_length(n, k, s, st))
            for n, k, s, st in zip(
                image_shape[2:], self.size, self.stride, self.start, strict=True
            )
        )
        return (image_shape[0], image_shape[1], *hw)

    def _symbolic_pooled(self, image_shape: Sequence) -> tuple:
        b, c, h, w = image_shape
        return (
            b,
            c,
            pool_output_length(h, self.size[0], self.stride[0], self.start[0]),
            pool_output_length(w, self.size[1], self.stride[1], self.start[1]),
        )

    def _check_static(
        self, role: str, got: Sequence, want: Sequence, image_shape: Sequence
    ) -> None:
        if any(
            g is not None and w is not None and g != w
            for g, w in zip(got, want, strict=True)
        ):
            raise ValueError(
                f"{self._name}: {role} shape {tuple(got)} does not match the pooled "
                f"shape {tuple(want)} of images {tuple(image_shape)} with "
                f"{_describe(self.size, self.stride, self.start)}"
            )


class MaxPoolSkeleton(PoolGeometry):
    """:class:`MaxPool` and its GPU twin but for ``make_node`` and ``perform``.

    ``(x) -> y``: shape rule, pullback (``family.max_pool_grad``) and
    pushforward (``family.max_pool_grad_grad``).
    """

    def _infer_shape(self, node, input_shapes):
        return [self._symbolic_pooled(input_shapes[0])]

    def pullback(self, inputs, outputs, cotangents):
        (x,), (y,), (gy,) = inputs, outputs, cotangents
        grad = self.family.max_pool_grad(**self._params())
        return [grad(x, y, self._cotangent(gy, x))]

    def pushforward(self, inputs, outputs, tangents):
        (x,), (y,), (dx,) = inputs, outputs, tangents
        if is_disconnected(dx):
            return [disconnected_type()]
        grad_grad = self.family.max_pool_grad_grad(**self._params())
        return [grad_grad(x, y, self._cotangent(dx, x))]


class MaxPoolBackwardSkeleton(PoolGeometry):
    """``op(x, y, t)`` with ``y`` the max-pooled ``x``, linear in ``t``.

    The skeleton of :class:`MaxPoolGrad` and :class:`MaxPoolGradGrad` (and
    their GPU twins): the static-shape rule of ``make_node``
    (:meth:`_backward_shape`), the shape rule, pullback and pushforward. A
    subclass sets the role of ``t`` and whether ``t`` and the result are
    shaped like ``y`` (pooled) or like ``x``, and ``_adjoint_role``, the
    :class:`PoolFamily` role of the op whose linear map in ``t`` is its
    transpose.
    """

    _t_role: str
    _t_pooled: bool  # t shaped like y (else like x)
    _out_pooled: bool  # the result shaped like y (else like x)
    _adjoint_role: str

    def _backward_shape(self, x: Variable, y: Variable, t: Variable) -> tuple:
        """The output's static shape, after checking the inputs' static shapes."""
        pooled = self._static_pooled(x.type.shape)
        self._check_static("pooled output", y.type.shape, pooled, x.type.shape)
        if self._t_pooled:
            self._check_static(self._t_role, t.type.shape, pooled, x.type.shape)
            pooled = merge_static_shapes(pooled, y.type.shape, t.type.shape)
            image = x.type.shape
        else:
            image = merge_static_shapes(x.type.shape, t.type.shape)
            if any(
                g is not None and w is not None and g != w
                for g, w in zip(t.type.shape, x.type.shape, strict=True)
            ):
                raise ValueError(
                    f"{self._name}: {self._t_role} shape {t.type.shape} must equal "
                    f"the image shape {x.type.shape}"
                )
            pooled = merge_static_shapes(pooled, y.type.shape)
        return pooled if self._out_pooled else image

    def _infer_shape(self, node, input_shapes):
        if self._out_pooled:
            return [self._symbolic_pooled(input_shapes[0])]
        return [input_shapes[0]]

    def _adjoint(self) -> MaxPoolBackwardSkeleton:
        """The op whose linear map in ``t`` is this one's transpose."""
        return getattr(self.family, self._adjoint_role)(**self._params())

    # Both backward ops are linear in ``t`` and piecewise constant in ``x`` and
    # ``y`` (they change only where a window's argmax moves, a set of measure
    # zero): the pullback wrt ``t`` is the adjoint op, wrt ``x`` and ``y`` zeros;
    # the pushforward is the op itself applied to ``t``'s tangent.

    def pullback(self, inputs, outputs, cotangents):
        x, y, _ = inputs
        (g,) = cotangents
        gt = self._adjoint()(x, y, self._cotangent(g, x))
        return [self._zeros_like(x), self._zeros_like(y), gt]

    def pushforward(self, inputs, outputs, tangents):
        x, y, _ = inputs
        dt = tangents[2]
        if is_disconnected(dt):
            if all(is_disconnected(t) for t in tangents):
                return [disconnected_type()]
            return [self._zeros_like(outputs[0])]
        return [type(self)(**self._params())(x, y, self._cotangent(dt, x))]


class MaxPoolGradSkeleton(MaxPoolBackwardSkeleton):
    """:class:`MaxPoolGrad` and its GPU twin but for ``make_node``/``perform``."""

    _t_role = "output gradient"
    _t_pooled = True
    _out_pooled = False
    _adjoint_role = "max_pool_grad_grad"


class MaxPoolGradGradSkeleton(MaxPoolBackwardSkeleton):
    """:class:`MaxPoolGradGrad` and its GPU twin but for ``make_node``/``perform``."""

    _t_role = "input gradient"
    _t_pooled = False
    _out_pooled = True
    _adjoint_role = "max_pool_grad"


class AvgPoolSkeleton(PoolGeometry):
    """:class:`AvgPool` and its GPU twin but for ``make_node`` and ``perform``.

    ``(x) -> y``, linear: pullback ``family.avg_pool_grad`` of the cotangent
    and the image size, pushforward the op itself.
    """

    def _infer_shape(self, node, input_shapes):
        return [self._symbolic_pooled(input_shapes[0])]

    def pullback(self, inputs, outputs, cotangents):
        (x,), (gy,) = inputs, cotangents
        grad = self.family.avg_pool_grad(**self._params())
        return [grad(self._cotangent(gy, x), self._hw_of(x))]

    def pushforward(self, inputs, outputs, tangents):
        (x,), (dx,) = inputs, tangents
        if is_disconnected(dx):
            return [disconnected_type()]
        return [self.family.avg_pool(**self._params())(self._cotangent(dx, x))]


class AvgPoolGradSkeleton(PoolGeometry):
    """:class:`AvgPoolGrad` and its GPU twin but for ``make_node``/``perform``.

    ``(gy, image_hw) -> gx``: the ``image_hw`` input rule
    (:meth:`_image_hw_input`), the shape rule, the connection pattern (the
    image size is disconnected), pullback ``family.avg_pool`` and pushforward
    the op itself.
    """

    def _image_hw_input(self, image_hw: Any) -> tuple[Variable, tuple]:
        """``image_hw`` as a validated int vector of 2 entries, and its values
        where they are constants."""
        op = self._name
        image_hw = int_tensor(op, "image_hw", image_hw, 1, "(H, W)")
        length = image_hw.type.shape[0]
        if length is not None and length != 2:
            raise ValueError(f"{op}: image_hw must have 2 entries (H, W), got {length}")
        return image_hw, _static_hw(image_hw)

    def _infer_shape(self, node, input_shapes):
        b, c = input_shapes[0][:2]
        h, w = node.outputs[0].type.shape[2:]
        hw = node.inputs[1]
        return [
            (
                b,
                c,
                pt.cast(hw[0], "int64") if h is None else h,
                pt.cast(hw[1], "int64") if w is None else w,
            )
        ]

    def connection_pattern(self, node):
        return [[True], [False]]

    def pullback(self, inputs, outputs, cotangents):
        gy, _ = inputs
        (g,) = cotangents
        avg_pool = self.family.avg_pool(**self._params())
        return [avg_pool(self._cotangent(g, gy)), disconnected_type()]

    def pushforward(self, inputs, outputs, tangents):
        gy, image_hw = inputs
        dgy = tangents[0]
        if is_disconnected(dgy):
            return [disconnected_type()]
        grad = self.family.avg_pool_grad(**self._params())
        return [grad(self._cotangent(dgy, gy), image_hw)]


class _Pool(Cc2Op):
    """The host pooling ops' base: their props and the host op machinery."""

    __props__ = ("size", "stride", "start")


class MaxPool(MaxPoolSkeleton, _Pool):
    """Max pooling of (B, C, H, W) images: ``MaxPool(size=...)(x) -> y``.

    Parameters
    ----------
    size : int or pair of int
        Window (rows, cols), >= 1.
    stride : int or pair of int, optional
        Step between windows, >= 1; default ``size``.
    start : int or pair of int, optional
        Position of the first window, > -size: positive skips leading pixels,
        negative acts like padding that never wins.

    Notes
    -----
    Input ``x`` (B, C, H, W) float32/float64; output ``y`` (B, C, Ho, Wo) with
    the window count of :func:`cc2ops.shapes.pool_output_length`. Its pullback
    is :class:`MaxPoolGrad`, its pushforward :class:`MaxPoolGradGrad`.
    """

    def make_node(self, x):
        x = float_tensor(self._name, "images", x, 4, _BC01)
        shape = self._static_pooled(x.type.shape)
        return Apply(self, [x], [pt.tensor(dtype=x.type.dtype, shape=shape)])

    def perform(self, node, inputs, output_storage):
        (x,) = inputs
        output_storage[0][0] = _max_pool(
            x, self.size, self.stride, self.start, self._name
        )


class _MaxPoolBackward(_Pool):
    """The host backward ops' ``make_node``: ``op(x, y, t)`` on host tensors."""

    def make_node(self, x, y, t):
        op = self._name
        x = float_tensor(op, "images", x, 4, _BC01)
        y = float_tensor(op, "pooled output", y, 4, _BC01)
        t = float_tensor(op, self._t_role, t, 4, _BC01)
        dtype = same_dtype(op, **{"images": x, "pooled output": y, self._t_role: t})
        out_shape = self._backward_shape(x, y, t)
        return Apply(self, [x, y, t], [pt.tensor(dtype=dtype, shape=out_shape)])


class MaxPoolGrad(MaxPoolGradSkeleton, _MaxPoolBackward):
    """Gradient of :class:`MaxPool` wrt its images: ``(x, y, gy) -> gx``.

    Parameters
    ----------
    size, stride, start : int or pair of int
        As in :class:`MaxPool`.

    Notes
    -----
    Inputs: images ``x`` (B, C, H, W), the forward output ``y``
    (B, C, Ho, Wo) and its gradient ``gy`` (B, C, Ho, Wo), one float dtype.
    Output ``gx`` (B, C, H, W): each window's ``gy`` goes to the first pixel
    (row-major order within the window) whose value equals ``y``. Taking ``y``
    as an input lets a GPU kernel reuse the forward result instead of
    recomputing every window's max, as cuda-convnet2 did.

    ``gx`` is linear in ``gy`` (pullback :class:`MaxPoolGradGrad`) and
    piecewise constant in ``x`` and ``y``: it changes only where the argmax
    moves, a set of measure zero, so the pullbacks wrt ``x`` and ``y`` are
    zeros, as is their contribution to the pushforward.
    """

    def perform(self, node, inputs, output_storage):
        x, y, gy = inputs
        output_storage[0][0] = _max_pool_grad(
            x, y, gy, self.size, self.stride, self.start, self._name
        )


class MaxPoolGradGrad(MaxPoolGradGradSkeleton, _MaxPoolBackward):
    """Adjoint of :class:`MaxPoolGrad` in ``gy``: ``(x, y, ggx) -> ggy``.

    Parameters
    ----------
    size, stride, start : int or pair of int
        As in :class:`MaxPool`.

    Notes
    -----
    Inputs: images ``x`` (B, C, H, W), the forward output ``y``
    (B, C, Ho, Wo) and ``ggx`` (B, C, H, W), one float dtype. Output ``ggy``
    (B, C, Ho, Wo): for each window, ``ggx`` at the window's first pixel equal
    to ``y`` (the same argmax :class:`MaxPoolGrad` uses). It is also the
    pushforward of :class:`MaxPool`. Its pullback wrt ``ggx`` is
    :class:`MaxPoolGrad`; wrt ``x`` and ``y`` it is zeros (piecewise constant,
    as for :class:`MaxPoolGrad`).
    """

    def perform(self, node, inputs, output_storage):
        x, y, ggx = inputs
        output_storage[0][0] = _max_pool_grad_grad(
            x, y, ggx, self.size, self.stride, self.start, self._name
        )


class AvgPool(AvgPoolSkeleton, _Pool):
    """Average pooling of (B, C, H, W) images: ``AvgPool(size=...)(x) -> y``.

    Parameters
    ----------
    size, stride, start : int or pair of int
        As in :class:`MaxPool`.

    Notes
    -----
    Input ``x`` (B, C, H, W) float32/float64; output ``y`` (B, C, Ho, Wo).
    Each window is clipped to the image and divided by its pixel count, so
    pixels outside the image (``start < 0`` or a window hanging over the far
    edge) are never counted. Linear: pullback :class:`AvgPoolGrad`,
    pushforward ``AvgPool`` of the tangent.
    """

    def make_node(self, x):
        x = float_tensor(self._name, "images", x, 4, _BC01)
        shape = self._static_pooled(x.type.shape)
        return Apply(self, [x], [pt.tensor(dtype=x.type.dtype, shape=shape)])

    def perform(self, node, inputs, output_storage):
        (x,) = inputs
        output_storage[0][0] = _avg_pool(
            x, self.size, self.stride, self.start, self._name
        )


class AvgPoolGrad(AvgPoolGradSkeleton, _Pool):
    """Gradient of :class:`AvgPool` wrt its images: ``(gy, image_hw) -> gx``.

    Parameters
    ----------
    size, stride, start : int or pair of int
        As in :class:`MaxPool`.

    Notes
    -----
    Inputs: ``gy`` (B, C, Ho, Wo) float32/float64 and ``image_hw``, an
    integer vector (H, W) (a constant or ``x.shape[2:]``): several image sizes
    pool to the same (Ho, Wo), and an int vector does not keep the images
    alive. Output ``gx`` (B, C, H, W). This is the adjoint of
    :class:`AvgPool`, so its pullback wrt ``gy`` is ``AvgPool`` of the
    cotangent; ``image_hw`` is disconnected.
    """

    def make_node(self, gy, image_hw):
        op = self._name
        gy = float_tensor(op, "output gradient", gy, 4, _BC01)
        image_hw, (h, w) = self._image_hw_input(image_hw)
        _check_image_hw(op, (h, w))
        image = (gy.type.shape[0], gy.type.shape[1], h, w)
        self._check_static(
            "output gradient", gy.type.shape, self._static_pooled(image), image
        )
        out = pt.tensor(dtype=gy.type.dtype, shape=image)
        return Apply(self, [gy, image_hw], [out])

    def perform(self, node, inputs, output_storage):
        gy, image_hw = inputs
        output_storage[0][0] = _avg_pool_grad(
            gy, image_hw, self.size, self.stride, self.start, self._name
        )


#: The host pooling ops by role (their skeletons' ``family``).
HOST_FAMILY = PoolFamily(MaxPool, MaxPoolGrad, MaxPoolGradGrad, AvgPool, AvgPoolGrad)
_Pool.family = HOST_FAMILY


# --------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------


def _build(op: _Pool, x, layout: str) -> TensorVariable:
    check_layout(op._name, layout)
    x = float_tensor(op._name, "images", x, 4, axes_doc(layout))
    return images_from_bc01(op(images_to_bc01(x, layout)), layout)


def max_pool2d(
    x,
    size: IntOrPair,
    stride: IntOrPair | None = None,
    start: IntOrPair = 0,
    layout: str = "bc01",
) -> TensorVariable:
    """Max pooling with cuda-convnet2's window rule.

    Parameters
    ----------
    x : tensor-like, float32 or float64
        Images, (B, C, H, W) for ``layout="bc01"``, (C, H, W, B) for
        ``"c01b"``.
    size : int or pair of int
        Window (rows, cols), >= 1.
    stride : int or pair of int, optional
        Step between windows, >= 1; default ``size`` (non-overlapping).
    start : int or pair of int, optional
        Position of the first window: > 0 skips leading pixels, < 0 (but
        > -size) lets the first window hang over the leading edge.
    layout : {"bc01", "c01b"}
        Axis order of ``x`` and of the result.

    Returns
    -------
    TensorVariable
        (B, C, Ho, Wo) or (C, Ho, Wo, B): the maximum of every window.

    Notes
    -----
    Windows per axis ``n = ceil((L - start - size)/stride) + 1``, one fewer
    when the last window would start at or past the edge (PyTorch's
    ``ceil_mode`` rule); windows are clipped to the image. Requires
    ``start < L`` and ``size <= L - start``. The gradient goes to the first
    maximum (row-major order) of each window.
    """
    return _build(MaxPool(size=size, stride=stride, start=start), x, layout)


def avg_pool2d(
    x,
    size: IntOrPair,
    stride: IntOrPair | None = None,
    start: IntOrPair = 0,
    layout: str = "bc01",
) -> TensorVariable:
    """Average pooling with cuda-convnet2's window rule.

    Parameters
    ----------
    x : tensor-like, float32 or float64
        Images, (B, C, H, W) for ``layout="bc01"``, (C, H, W, B) for
        ``"c01b"``.
    size, stride, start : int or pair of int
        As in :func:`max_pool2d`.
    layout : {"bc01", "c01b"}
        Axis order of ``x`` and of the result.

    Returns
    -------
    TensorVariable
        (B, C, Ho, Wo) or (C, Ho, Wo, B): the mean of every window.

    Notes
    -----
    Window placement as in :func:`max_pool2d`. Each window is clipped to the
    image and divided by the number of image pixels it holds; pixels outside
    the image are never counted.
    """
    return _build(AvgPool(size=size, stride=stride, start=start), x, layout)
