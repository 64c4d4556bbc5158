"""The cc2ops ops written once against a small array interface, for every backend.

The JAX, PyTorch and MLX modules (:mod:`cc2ops.backends.jax`,
:mod:`~cc2ops.backends.pytorch`, :mod:`~cc2ops.backends.mlx`) each give an
:class:`Arrays` adapter (a dozen array primitives plus the three convolutions,
which every library has natively) and register :data:`BUILDERS` with their
PyTensor dispatcher. The arithmetic below follows the numpy references of the
frontend modules operation for operation (same tap order, same scalars in the
same dtype), so results match them to rounding; where they differ (window sums
of the cross-map norm, the libraries' convolutions) the docstrings say so.

All images are bc01 (B, C, H, W): the frontend ops compute in bc01 and the
c01b layout is a pair of ``DimShuffle`` nodes that every backend already has.

Labels outside ``[0, K)``
    cannot raise inside a compiled (jitted) function. The loss, its gradient
    and the top-k error of such a row are NaN instead (a NaN mean loss, NaN
    gradients), so a training loop or a sampler sees the error rather than a
    plausible number; the numpy ``perform`` raises ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from pytensor.graph.basic import Apply, Constant

from cc2ops.conv import FilterActs, ImageActs, WeightActs
from cc2ops.cross_map_norm import CrossMapNorm, CrossMapNormGrad
from cc2ops.dropout import (
    PHILOX_M0,
    PHILOX_M1,
    PHILOX_W0,
    PHILOX_W1,
    Dropout,
    DropoutAdvance,
    dropout_scale,
    keep_threshold,
)
from cc2ops.pool import (
    AvgPool,
    AvgPoolGrad,
    MaxPool,
    MaxPoolGrad,
    MaxPoolGradGrad,
    PoolPlan,
)
from cc2ops.softmax_cross_entropy import (
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyGrad,
    TopKError,
)

_M16 = 0xFFFF
_M32 = 0xFFFFFFFF


class Arrays:
    """What a backend provides; the generic ops use nothing else.

    Python slicing with positive steps, the arithmetic, comparison and bitwise
    operators, ``.shape`` (Python ints) and ``.dtype`` must work on the
    backend's arrays. Dtypes are given by name (``"float32"``, ``"bool"``,
    ...). The Philox words live in :attr:`word` (``"uint32"`` where the
    library multiplies and shifts uint32, else ``"int64"`` holding values
    below 2**32): the arithmetic below is correct in either.
    """

    name = "?"
    word = "uint32"

    # -- primitives -------------------------------------------------------
    def constant(self, value: np.ndarray) -> Any:
        raise NotImplementedError

    def astype(self, a: Any, dtype: str) -> Any:
        raise NotImplementedError

    def arange(self, n: int, dtype: str) -> Any:
        """``0 .. n-1``; computed on the backend, not embedded as a constant."""
        raise NotImplementedError

    def dtype_name(self, a: Any) -> str:
        raise NotImplementedError

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Any:
        raise NotImplementedError

    def pad(self, a: Any, pads: list[tuple[int, int]], value: float) -> Any:
        raise NotImplementedError

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def maximum(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def exp(self, a: Any) -> Any:
        raise NotImplementedError

    def log(self, a: Any) -> Any:
        raise NotImplementedError

    def sum(self, a: Any, axis: int, keepdims: bool = False) -> Any:
        raise NotImplementedError

    def amax(self, a: Any, axis: int, keepdims: bool = False) -> Any:
        raise NotImplementedError

    def reshape(self, a: Any, shape: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def stack(self, items: list[Any], axis: int) -> Any:
        raise NotImplementedError

    def take_along_axis(self, a: Any, idx: Any, axis: int) -> Any:
        raise NotImplementedError

    def add_at(self, a: Any, index: tuple, v: Any) -> Any:
        """``a`` with ``v`` added at ``a[index]`` (``a`` is a fresh local array)."""
        raise NotImplementedError

    def static_ints(self, v: Any, op: str, role: str) -> tuple[int, ...]:
        """The run-time value of a small int vector as Python ints."""
        raise NotImplementedError

    # -- convolutions (bc01 images, (F, C/groups, kh, kw) filters) ----------
    def conv(self, x, w, stride, padding, groups):
        raise NotImplementedError

    def conv_data(self, dy, w, image_hw, stride, padding, groups):
        raise NotImplementedError

    def conv_filter(self, x, dy, filter_hw, stride, padding, groups):
        raise NotImplementedError

    # -- overridable window reductions -------------------------------------
    def window_max(self, xp, plan: PoolPlan):
        """Max over every window of the padded images ``xp`` (taps in order)."""
        y = None
        for tap in plan.taps():
            y = xp[tap] if y is None else self.maximum(y, xp[tap])
        return y

    def window_sum(self, xp, plan: PoolPlan):
        """Sum over every window of the padded images ``xp`` (taps in order)."""
        y = None
        for tap in plan.taps():
            y = xp[tap] if y is None else y + xp[tap]
        return y


# --------------------------------------------------------------------------
# static (H, W) inputs
# --------------------------------------------------------------------------


def hw_input(A: Arrays, node: Apply, i: int, role: str) -> Callable[[Any], tuple]:
    """A function giving input ``i`` of ``node`` (an (H, W) vector) as ints.

    A constant is read now; anything else when the function runs, through
    :meth:`Arrays.static_ints`, which raises naming the op where the library
    cannot know the value while it traces (see :mod:`cc2ops.backends.rewriting`).
    """
    v = node.inputs[i]
    op = type(node.op).__name__
    if isinstance(v, Constant):
        fixed = tuple(int(e) for e in np.asarray(v.data).reshape(-1))
        return lambda _value: fixed
    return lambda value: A.static_ints(value, op, role)


# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------


def filter_acts(A: Arrays, op: FilterActs, node: Apply):
    stride, padding, groups = op.stride, op.padding, op.groups

    def filter_acts(x, w):
        return A.conv(x, w, stride, padding, groups)

    return filter_acts


def image_acts(A: Arrays, op: ImageActs, node: Apply):
    stride, padding, groups = op.stride, op.padding, op.groups
    hw_of = hw_input(A, node, 2, "image_hw")

    def image_acts(dy, w, image_hw):
        return A.conv_data(dy, w, hw_of(image_hw), stride, padding, groups)

    return image_acts


def weight_acts(A: Arrays, op: WeightActs, node: Apply):
    stride, padding, groups = op.stride, op.padding, op.groups
    hw_of = hw_input(A, node, 2, "filter_hw")

    def weight_acts(x, dy, filter_hw):
        return A.conv_filter(x, dy, hw_of(filter_hw), stride, padding, groups)

    return weight_acts


def transposed_conv_pads(
    length: int, out: int, k: int, s: int, p: int
) -> tuple[int, int]:
    """(lo, hi) padding of the ``s``-dilated gradient for the image gradient.

    Correlating the dilated gradient (``(out-1)*s + 1`` long) padded by
    ``(lo, hi)`` with the flipped filter gives ``length`` outputs when
    ``lo = k - 1 - p`` and ``hi = length + p - 1 - (out-1)*s``; ``hi`` covers
    the trailing rows that the floor in the output-size rule left out (they
    get 0). Either may be negative (a crop).
    """
    return k - 1 - p, length + p - 1 - (out - 1) * s


def filter_grad_pads(length: int, out: int, k: int, s: int, p: int) -> tuple[int, int]:
    """(lo, hi) padding of the images for the filter gradient (``k`` outputs).

    Correlating the images padded by ``(p, hi)`` with the ``s``-dilated
    gradient gives ``k`` outputs when ``hi = k + (out-1)*s - length - p``
    (negative where the floor left trailing rows unused).
    """
    return p, k + (out - 1) * s - length - p


# --------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------


def _plan(op, x_shape) -> PoolPlan:
    return PoolPlan(tuple(x_shape[2:]), op.size, op.stride, op.start)


def _full(plan: PoolPlan) -> list[tuple[int, int]]:
    return [(0, 0), (0, 0), *plan.pads]


def _from_first(xp, plan: PoolPlan):
    """The padded images from window 0's first tap on (what ``lax`` windows see)."""
    r0, c0 = plan.first
    return xp[:, :, r0:, c0:]


def _crop(plan: PoolPlan, a):
    (r0, _), (c0, _) = plan.pads
    h, w = plan.image_hw
    return a[:, :, r0 : r0 + h, c0 : c0 + w]


def max_pool(A: Arrays, op: MaxPool, node: Apply):
    def max_pool(x):
        plan = _plan(op, x.shape)
        # -inf never wins against a real pixel, as in max_pool_reference
        return A.window_max(A.pad(x, _full(plan), -math.inf), plan)

    return max_pool


def _first_hits(A: Arrays, plan: PoolPlan, xp, y):
    """Per tap: the windows whose first pixel equal to ``y`` is this tap."""
    found = None
    for tap in plan.taps():
        hit = xp[tap] == y
        if found is None:
            found = hit
        else:
            hit = hit & ~found
            found = found | hit
        yield tap, hit


def max_pool_grad(A: Arrays, op: MaxPoolGrad, node: Apply):
    def max_pool_grad(x, y, gy):
        plan = _plan(op, x.shape)
        # NaN padding never equals y, so pixels outside never take a gradient
        xp = A.pad(x, _full(plan), math.nan)
        gxp = A.zeros(tuple(xp.shape), A.dtype_name(x))
        zero = A.zeros((), A.dtype_name(x))
        for tap, hit in _first_hits(A, plan, xp, y):
            gxp = A.add_at(gxp, tap, A.where(hit, gy, zero))
        return _crop(plan, gxp)

    return max_pool_grad


def max_pool_grad_grad(A: Arrays, op: MaxPoolGradGrad, node: Apply):
    def max_pool_grad_grad(x, y, ggx):
        plan = _plan(op, x.shape)
        xp = A.pad(x, _full(plan), math.nan)
        ggxp = A.pad(ggx, _full(plan), 0.0)
        ggy = A.zeros(tuple(y.shape), A.dtype_name(x))
        for tap, hit in _first_hits(A, plan, xp, y):
            ggy = A.where(hit, ggxp[tap], ggy)
        return ggy

    return max_pool_grad_grad


def avg_pool(A: Arrays, op: AvgPool, node: Apply):
    def avg_pool(x):
        plan = _plan(op, x.shape)
        total = A.window_sum(A.pad(x, _full(plan), 0.0), plan)
        counts = plan.counts(op.start, A.dtype_name(x))
        return total / A.constant(counts)

    return avg_pool


def avg_pool_grad(A: Arrays, op: AvgPoolGrad, node: Apply):
    hw_of = hw_input(A, node, 1, "image_hw")

    def avg_pool_grad(gy, image_hw):
        h, w = hw_of(image_hw)
        plan = PoolPlan((h, w), op.size, op.stride, op.start)
        dtype = A.dtype_name(gy)
        g = gy / A.constant(plan.counts(op.start, dtype))
        rows = h + sum(plan.pads[0])
        cols = w + sum(plan.pads[1])
        gxp = A.zeros((gy.shape[0], gy.shape[1], rows, cols), dtype)
        for tap in plan.taps():
            gxp = A.add_at(gxp, tap, g)
        return _crop(plan, gxp)

    return avg_pool_grad


# --------------------------------------------------------------------------
# cross-map response normalisation
# --------------------------------------------------------------------------


def _channel_window_sums(A: Arrays, v, size: int, blocked: bool, transposed: bool):
    """Sum of ``v`` over each channel's (or transposed) window, in ``v``'s dtype.

    Direct sums of ``size`` shifted channel slices of the zero-padded ``v``
    (blocked: sums of whole groups). The numpy reference differences a
    float64 running sum instead; both are exact up to the rounding of one
    direct window sum.
    """
    b, c, h, w = v.shape
    if blocked:
        groups = -(-c // size)
        vp = A.pad(v, [(0, 0), (0, groups * size - c), (0, 0), (0, 0)], 0.0)
        g = A.sum(A.reshape(vp, (b, groups, size, h, w)), axis=2, keepdims=True)
        spread = g + A.zeros((b, groups, size, h, w), A.dtype_name(v))
        return A.reshape(spread, (b, groups * size, h, w))[:, :c]
    # window of c: c - size//2 .. c + (size-1)//2; the transposed window of j
    # (the channels whose window holds j) is j - (size-1)//2 .. j + size//2
    before = (size - 1) // 2 if transposed else size // 2
    after = size - 1 - before
    vp = A.pad(v, [(0, 0), (before, after), (0, 0), (0, 0)], 0.0)
    out = vp[:, 0:c]
    for t in range(1, size):
        out = out + vp[:, t : t + c]
    return out


def _denominators(A: Arrays, x, op):
    return op.k + (op.alpha / op.size) * _channel_window_sums(
        A, x * x, op.size, op.blocked, False
    )


def cross_map_norm(A: Arrays, op: CrossMapNorm, node: Apply):
    def cross_map_norm(x):
        return x * _denominators(A, x, op) ** (-op.beta)

    return cross_map_norm


def cross_map_norm_grad(A: Arrays, op: CrossMapNormGrad, node: Apply):
    scale = 2.0 * op.alpha * op.beta / op.size

    def cross_map_norm_grad(x, gy):
        d = _denominators(A, x, op)
        p = d ** (-op.beta)
        back = _channel_window_sums(A, gy * x * (p / d), op.size, op.blocked, True)
        return gy * p - scale * x * back

    return cross_map_norm_grad


# --------------------------------------------------------------------------
# softmax loss and top-k error
# --------------------------------------------------------------------------


def _is_soft(node: Apply, i: int) -> bool:
    return node.inputs[i].type.dtype.startswith("float")


def _labels(A: Arrays, y, k: int):
    """(valid rows, labels clipped into range for a safe gather) as int64."""
    y = A.astype(y, "int64")
    valid = (y >= 0) & (y < k)
    return valid, A.where(valid, y, A.zeros((), "int64"))


def _nan_rows(A: Arrays, valid, v, dtype: str):
    nan = A.constant(np.array(np.nan, dtype=dtype))
    if len(v.shape) == 2:
        valid = A.reshape(valid, (v.shape[0], 1))
    return A.where(valid, v, nan)


def softmax_cross_entropy(A: Arrays, op: SoftmaxCrossEntropy, node: Apply):
    soft = _is_soft(node, 1)

    def softmax_cross_entropy(x, t):
        z = x - A.amax(x, axis=1, keepdims=True)
        log_s = A.log(A.sum(A.exp(z), axis=1, keepdims=True))
        if soft:
            return -A.sum(t * (z - log_s), axis=1)
        valid, y = _labels(A, t, x.shape[1])
        picked = A.take_along_axis(z, A.reshape(y, (x.shape[0], 1)), axis=1)
        loss = A.reshape(log_s - picked, (x.shape[0],))
        return _nan_rows(A, valid, loss, A.dtype_name(x))

    return softmax_cross_entropy


def softmax_cross_entropy_grad(A: Arrays, op: SoftmaxCrossEntropyGrad, node: Apply):
    soft = _is_soft(node, 2)

    def softmax_cross_entropy_grad(g, x, t):
        e = A.exp(x - A.amax(x, axis=1, keepdims=True))
        sm = e / A.sum(e, axis=1, keepdims=True)
        g = A.reshape(g, (x.shape[0], 1))
        if soft:
            return (sm * A.sum(t, axis=1, keepdims=True) - t) * g
        dtype = A.dtype_name(x)
        valid, y = _labels(A, t, x.shape[1])
        classes = A.constant(np.arange(x.shape[1], dtype=np.int64))
        onehot = A.astype(
            A.reshape(classes, (1, x.shape[1])) == A.reshape(y, (x.shape[0], 1)),
            dtype,
        )
        return _nan_rows(A, valid, (sm - onehot) * g, dtype)

    return softmax_cross_entropy_grad


def top_k_error(A: Arrays, op: TopKError, node: Apply):
    k = op.k

    def top_k_error(x, y):
        dtype = A.dtype_name(x)
        valid, y = _labels(A, y, x.shape[1])
        true = A.take_along_axis(x, A.reshape(y, (x.shape[0], 1)), axis=1)
        above = A.sum(A.astype(x > true, "int64"), axis=1)
        return _nan_rows(A, valid, A.astype(above >= k, dtype), dtype)

    return top_k_error


# --------------------------------------------------------------------------
# dropout: Philox4x32-10 in 16-bit halves
# --------------------------------------------------------------------------


def _mulhilo(A: Arrays, a, m: int):
    """``(hi, lo)`` 32-bit halves of ``a * m`` (``a`` words, ``m`` a uint32).

    Schoolbook multiplication of 16-bit halves: every partial product stays
    below 2**32, so it is exact in uint32 arithmetic and in int64 alike.
    """
    m_lo, m_hi = m & _M16, m >> 16
    a_lo, a_hi = a & _M16, a >> 16
    t = a_lo * m_lo
    u = a_hi * m_lo + (t >> 16)
    v = a_lo * m_hi + (u & _M16)
    hi = a_hi * m_hi + (u >> 16) + (v >> 16)
    lo = ((v & _M16) << 16) | (t & _M16)
    return hi, lo


def _word_const(A: Arrays, value: int):
    return A.constant(np.array(value, dtype=A.word))


def philox4x32_10(A: Arrays, c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of word arrays, as :func:`cc2ops.dropout.philox4x32_reference`."""
    w0, w1, m32 = (_word_const(A, v) for v in (PHILOX_W0, PHILOX_W1, _M32))
    for r in range(10):
        if r:
            k0 = (k0 + w0) & m32
            k1 = (k1 + w1) & m32
        hi0, lo0 = _mulhilo(A, c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(A, c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def _add_counter(A: Arrays, lo, hi, q):
    """The 64-bit counter ``(lo, hi) + q`` (``q`` words below 2**32), mod 2**64."""
    m32 = _word_const(A, _M32)
    s = (lo + q) & m32
    carry = A.astype(s < lo, A.word)
    return s, (hi + carry) & m32


def dropout_mask(A: Arrays, state, n: int, p: float):
    """The keep mask (bool, ``n`` elements, C order), :func:`dropout_mask_reference`."""
    s = A.astype(state, A.word)
    blocks = -(-n // 4)
    q = A.arange(blocks, A.word)
    b_lo, b_hi = _add_counter(A, s[2], s[3], q)
    zero = A.zeros((blocks,), A.word)
    words = philox4x32_10(A, b_lo, b_hi, zero, zero, s[0], s[1])
    flat = A.reshape(A.stack(list(words), axis=1), (4 * blocks,))[:n]
    threshold = keep_threshold(p)
    if threshold > _M32:  # p == 0: every word is below 2**32
        return flat == flat
    return flat < _word_const(A, threshold)


def dropout(A: Arrays, op: Dropout, node: Apply):
    p = op.p

    def dropout(x, state):
        n = math.prod(x.shape)
        mask = A.reshape(dropout_mask(A, state, n, p), tuple(x.shape))
        dtype = A.dtype_name(x)
        scale = A.constant(np.asarray(dropout_scale(p, dtype)))
        return A.where(mask, x * scale, A.zeros((), dtype))

    return dropout


def dropout_advance(A: Arrays, op: DropoutAdvance, node: Apply):
    def dropout_advance(state, n):
        s = A.astype(state, A.word)
        n = A.reshape(A.astype(n, "int64"), ())  # a 0-d array on every backend
        blocks = A.astype((n + 3) // 4, A.word)
        lo, hi = _add_counter(A, s[2], s[3], blocks)
        return A.astype(A.stack([s[0], s[1], lo, hi], axis=0), "uint32")

    return dropout_advance


#: op class -> ``builder(arrays, op, node)`` returning the backend function.
BUILDERS: dict[type, Callable[[Arrays, Any, Apply], Callable]] = {
    FilterActs: filter_acts,
    ImageActs: image_acts,
    WeightActs: weight_acts,
    MaxPool: max_pool,
    MaxPoolGrad: max_pool_grad,
    MaxPoolGradGrad: max_pool_grad_grad,
    AvgPool: avg_pool,
    AvgPoolGrad: avg_pool_grad,
    CrossMapNorm: cross_map_norm,
    CrossMapNormGrad: cross_map_norm_grad,
    SoftmaxCrossEntropy: softmax_cross_entropy,
    SoftmaxCrossEntropyGrad: softmax_cross_entropy_grad,
    TopKError: top_k_error,
    Dropout: dropout,
    DropoutAdvance: dropout_advance,
}


def register(
    dispatcher, arrays: Arrays, check: Callable[[Any, Any], None] | None = None
) -> None:
    """Register every op of :data:`BUILDERS` with a PyTensor ``*_funcify``.

    ``check(op, node)``, if given, runs before each build (the tracing
    backends' static-shape check, :func:`cc2ops.backends.rewriting.register_traced`).
    """
    for cls, build in BUILDERS.items():

        def funcify(op, node=None, build=build, **kwargs):
            if check is not None:
                check(op, node)
            return build(arrays, op, node)

        funcify.__name__ = f"{arrays.name}_funcify_{cls.__name__}"
        dispatcher.register(cls)(funcify)
