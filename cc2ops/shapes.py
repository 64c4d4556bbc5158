"""Shape arithmetic for every cc2ops op family, written down once.

Every function here is pure. The integer versions validate their arguments and
raise ``ValueError`` naming the op, the rule and the value received; the
``*_length`` functions also accept symbolic PyTensor integers (they use only
``+ - * //`` and :func:`_where`), so ``infer_shape`` of the ops, the GPU ops,
the benchmarks and the tests all call the same rule.

Axis orders
-----------
``bc01`` (the default) is (batch, channels, rows, columns), the order of
``torch.nn.functional.conv2d``. ``c01b`` is (channels, rows, columns, batch),
cuda-convnet's native order; in that layout convolution filters are
(C/groups, kh, kw, F). :mod:`cc2ops.layout` converts between them.

Rules
-----
Convolution (cross-correlation)::

    out = floor((L + 2 * pad - k) / stride) + 1

cuda-convnet2 rounded this up (it let the last filter position hang over the
padded edge); cc2ops follows PyTorch and cuDNN and rounds down.

Pooling (cuda-convnet2 semantics, with PyTorch's ``ceil_mode`` fix)::

    n = ceil((L - start - size) / stride) + 1
    if (n - 1) * stride + start >= L:   # last window would start past the edge
        n -= 1

Window ``o`` covers ``[start + o*stride, start + o*stride + size)`` clipped to
``[0, L)``, so every window holds at least one pixel. Average pooling divides
by the clipped window's pixel count.

Cross-map response normalisation: channel ``c`` sums the squares of channels
``c - size//2 .. c + (size-1)//2`` clipped to ``[0, C)``; with
``blocked=True`` it sums its own non-overlapping group
``[size*(c//size), size*(c//size) + size)`` clipped to ``[0, C)``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "pair",
    "merge_static_shapes",
    "check_hw_values",
    "hw_value",
    "conv_params",
    "conv_output_length",
    "conv_output_shape",
    "check_conv_shapes",
    "check_conv_filter_count",
    "check_conv_batch",
    "check_conv_gradient_hw",
    "image_acts_shape",
    "weight_acts_shape",
    "pool_output_length",
    "pool_output_shape",
    "check_pool_params",
    "pool_params",
    "pool_window_bounds",
    "cross_map_window_bounds",
    "check_cross_map_params",
    "cross_map_params",
    "conv_flops",
]


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _where(cond, a, b):
    """``a if cond else b`` for Python ints, ``pt.switch`` for symbolic ones."""
    if isinstance(cond, (bool, np.bool_)):
        return a if cond else b
    import pytensor.tensor as pt

    return pt.switch(cond, a, b)


def pair(
    value: Any, name: str, op: str, *, minimum: int | None = None
) -> tuple[int, int]:
    """Normalise an int or a pair of ints to a ``(rows, cols)`` tuple.

    Parameters
    ----------
    value : int or sequence of two ints
        The parameter as the user gave it.
    name : str
        The parameter's name, for the error message.
    op : str
        The op's name, for the error message.
    minimum : int, optional
        Smallest allowed value of each entry.

    Returns
    -------
    tuple of int
        ``(value_rows, value_cols)``.
    """
    if _is_int(value) or isinstance(value, np.integer):
        out = (int(value), int(value))
    else:
        try:
            items = tuple(value)
        except TypeError:
            raise TypeError(
                f"{op}: {name} must be an int or a pair of ints, got {value!r}"
            ) from None
        if len(items) != 2 or not all(
            _is_int(v) or isinstance(v, np.integer) for v in items
        ):
            raise TypeError(
                f"{op}: {name} must be an int or a pair of ints, got {value!r}"
            )
        out = (int(items[0]), int(items[1]))
    if minimum is not None and min(out) < minimum:
        raise ValueError(f"{op}: {name} must be >= {minimum}, got {value!r}")
    return out


def merge_static_shapes(*shapes: Sequence[int | None]) -> tuple[int | None, ...]:
    """Entry-wise the first known entry of several static shapes (that agree).

    For ``make_node``: the static output shape of an op whose inputs must have
    equal shapes, each known in part (``None`` where unknown). The shapes must
    have one length; that they agree where known is checked by the caller.
    """
    out = []
    for dims in zip(*shapes, strict=True):
        known = [d for d in dims if d is not None]
        out.append(known[0] if known else None)
    return tuple(out)


def check_hw_values(op: str, role: str, hw: Sequence[int | None]) -> None:
    """An (H, W) / (kh, kw) pair, where known, must be >= 1 along both axes."""
    known = [v for v in hw if v is not None]
    if known and min(known) < 1:
        raise ValueError(f"{op}: {role} must be >= 1, got {tuple(hw)}")


def hw_value(op: str, role: str, value: Any) -> tuple[int, int]:
    """A run-time (H, W) / (kh, kw) int vector as a validated pair of ints.

    The value of an ``image_hw`` / ``filter_hw`` input when the op runs: one
    dim of 2 entries, an integer dtype, both entries >= 1.
    """
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.shape[0] != 2:
        raise ValueError(f"{op}: {role} must have 2 entries, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{op}: {role} must have an integer dtype, got {arr.dtype}")
    out = (int(arr[0]), int(arr[1]))
    check_hw_values(op, role, out)
    return out


# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------

_SIDES = ("rows", "cols")
_SIDE = ("row", "col")


def conv_params(
    stride: Any, padding: Any, groups: Any, op: str
) -> tuple[tuple[int, int], tuple[int, int], int]:
    """Normalised, validated ``(stride, padding, groups)`` of a convolution.

    The one place the convolution ops (host and GPU), the references and the
    GPU launchers read their parameters: ``stride`` and ``padding`` become
    (rows, cols) pairs, ``stride >= 1``, ``padding >= 0``; ``groups`` is an
    int (not a bool) ``>= 1``.
    """
    stride = pair(stride, "stride", op, minimum=1)
    padding = pair(padding, "padding", op, minimum=0)
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral):
        raise TypeError(f"{op}: groups must be an int, got {groups!r}")
    if groups < 1:
        raise ValueError(f"{op}: groups must be >= 1, got {groups}")
    return stride, padding, int(groups)


def conv_output_length(length, filter_size: int, stride: int, padding: int):
    """Output length of a convolution along one axis.

    ``floor((length + 2*padding - filter_size) / stride) + 1``. ``length`` may
    be a Python int or a symbolic integer scalar.
    """
    return (length + 2 * padding - filter_size) // stride + 1


def conv_output_shape(
    image_hw: tuple[int, int],
    filter_hw: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    op: str = "FilterActs",
) -> tuple[int, int]:
    """Output ``(rows, cols)`` of a convolution, validated.

    Parameters
    ----------
    image_hw, filter_hw, stride, padding : pair of int
        Image size (H, W), filter size (kh, kw), stride (sh, sw) and zero
        padding (ph, pw).

    Raises
    ------
    ValueError
        If the filter is larger than the padded image along an axis.
    """
    out = []
    axes = zip(image_hw, filter_hw, stride, padding, strict=True)
    for axis, (n, k, s, p) in enumerate(axes):
        if n + 2 * p < k:
            side = "rows" if axis == 0 else "cols"
            raise ValueError(
                f"{op}: filter {side} ({k}) larger than the padded image "
                f"({n} + 2*{p} = {n + 2 * p})"
            )
        out.append(conv_output_length(n, k, s, p))
    return out[0], out[1]


def check_conv_shapes(
    op: str,
    image_shape: tuple,
    filter_shape: tuple,
    stride: tuple[int, int],
    padding: tuple[int, int],
    groups: int,
) -> tuple | None:
    """Validate a convolution's shapes in the bc01 layout.

    Parameters
    ----------
    image_shape : tuple
        (B, C, H, W); entries may be ``None`` where unknown (static shapes).
    filter_shape : tuple
        (F, C/groups, kh, kw); entries may be ``None``.

    Returns
    -------
    tuple or None
        The output shape (B, F, Ho, Wo) with ``None`` where it cannot be known.
    """
    b, c, h, w = image_shape
    f, cg, kh, kw = filter_shape
    if c is not None and c % groups:
        raise ValueError(
            f"{op}: groups ({groups}) must divide the image channels ({c})"
        )
    if f is not None and f % groups:
        raise ValueError(
            f"{op}: groups ({groups}) must divide the number of filters ({f})"
        )
    if c is not None and cg is not None and c // groups != cg:
        raise ValueError(
            f"{op}: filters have {cg} input channels but images have {c} channels "
            f"in {groups} group(s) ({c // groups} per group)"
        )
    ho = wo = None
    if h is not None and kh is not None:
        ho = conv_output_shape((h, 1), (kh, 1), (stride[0], 1), (padding[0], 0), op)[0]
    if w is not None and kw is not None:
        wo = conv_output_shape((1, w), (1, kw), (1, stride[1]), (0, padding[1]), op)[1]
    return (b, f, ho, wo)


def _axis_output(op: str, axis: int, n: int, k: int, s: int, p: int) -> int:
    """``conv_output_shape`` along one axis, so its message names that axis."""
    hw, khw, st, pd = [1, 1], [1, 1], [1, 1], [0, 0]
    hw[axis], khw[axis], st[axis], pd[axis] = n, k, s, p
    return conv_output_shape(tuple(hw), tuple(khw), tuple(st), tuple(pd), op)[axis]


def check_conv_gradient_hw(
    op: str,
    grad_hw: Sequence[int | None],
    image_hw: Sequence[int | None],
    filter_hw: Sequence[int | None],
    stride: tuple[int, int],
    padding: tuple[int, int],
) -> None:
    """An output gradient's (Ho, Wo) must be the forward output shape.

    ``None`` entries (static shapes) skip their axis. Needed by both
    gradients: the floor in the output rule maps several image sizes to one
    output size, so (Ho, Wo) does not determine (H, W).
    """
    for axis in range(2):
        n, k, got = image_hw[axis], filter_hw[axis], grad_hw[axis]
        if n is None or k is None:
            continue
        s, p = stride[axis], padding[axis]
        want = _axis_output(op, axis, n, k, s, p)
        if got is not None and got != want:
            side = _SIDES[axis]
            raise ValueError(
                f"{op}: gradient {side} ({got}) do not match the output {side} "
                f"({want}) of a {k}-{_SIDE[axis]} filter over {n} {side} with "
                f"stride {s}, padding {p}"
            )


def check_conv_filter_count(op: str, grad_f: int | None, filters_f: int | None) -> None:
    """The output gradient has one channel per filter (``None`` skips)."""
    if grad_f is not None and filters_f is not None and grad_f != filters_f:
        raise ValueError(
            f"{op}: gradient has {grad_f} channels but there are {filters_f} filters"
        )


def check_conv_batch(op: str, images_b: int | None, grad_b: int | None) -> None:
    """Images and output gradient have one batch (``None`` skips)."""
    if images_b is not None and grad_b is not None and images_b != grad_b:
        raise ValueError(
            f"{op}: gradient batch ({grad_b}) does not match the image batch "
            f"({images_b})"
        )


def image_acts_shape(
    op: str,
    dy_shape: Sequence[int | None],
    w_shape: Sequence[int | None],
    hw: tuple[int | None, int | None],
    stride: tuple[int, int],
    padding: tuple[int, int],
    groups: int,
) -> tuple[int | None, ...]:
    """Validated static (B, C, H, W) of the gradient wrt the images.

    Parameters
    ----------
    dy_shape : tuple
        (B, F, Ho, Wo) of the output gradient; entries may be ``None``.
    w_shape : tuple
        (F, C/groups, kh, kw) of the filters; entries may be ``None``.
    hw : pair
        (H, W) of the images where known.
    """
    check_hw_values(op, "image_hw", hw)
    b, f, ho, wo = dy_shape
    check_conv_filter_count(op, f, w_shape[0])
    check_conv_shapes(op, (b, None, *hw), w_shape, stride, padding, groups)
    check_conv_gradient_hw(op, (ho, wo), hw, w_shape[2:], stride, padding)
    cg = w_shape[1]
    return (b, None if cg is None else cg * groups, *hw)


def weight_acts_shape(
    op: str,
    x_shape: Sequence[int | None],
    dy_shape: Sequence[int | None],
    khw: tuple[int | None, int | None],
    stride: tuple[int, int],
    padding: tuple[int, int],
    groups: int,
) -> tuple[int | None, ...]:
    """Validated static (F, C/groups, kh, kw) of the gradient wrt the filters.

    Parameters
    ----------
    x_shape : tuple
        (B, C, H, W) of the images; entries may be ``None``.
    dy_shape : tuple
        (B, F, Ho, Wo) of the output gradient; entries may be ``None``.
    khw : pair
        (kh, kw) of the filters where known.
    """
    check_hw_values(op, "filter_hw", khw)
    b, c, h, wd = x_shape
    check_conv_batch(op, b, dy_shape[0])
    f = dy_shape[1]
    check_conv_shapes(op, x_shape, (f, None, *khw), stride, padding, groups)
    check_conv_gradient_hw(op, dy_shape[2:], (h, wd), khw, stride, padding)
    return (f, None if c is None else c // groups, *khw)


def conv_flops(
    batch: int,
    channels: int,
    filters: int,
    out_hw: tuple[int, int],
    filter_hw: tuple[int, int],
    groups: int = 1,
) -> int:
    """Multiply-adds times two of one convolution pass (any of the three)."""
    return (
        2
        * batch
        * filters
        * out_hw[0]
        * out_hw[1]
        * (channels // groups)
        * (filter_hw[0] * filter_hw[1])
    )


# --------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------


def pool_params(
    size: Any, stride: Any, start: Any, op: str
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """Normalised, validated ``(size, stride, start)`` pairs; stride defaults to size.

    The one place the pooling ops (host and GPU) and their launchers read
    their parameters: ints become pairs, ``stride=None`` is ``size``, and
    :func:`check_pool_params` validates them.
    """
    size = pair(size, "size", op)
    stride = size if stride is None else pair(stride, "stride", op)
    start = pair(start, "start", op)
    check_pool_params(op, size, stride, start)
    return size, stride, start


def check_pool_params(
    op: str,
    size: tuple[int, int],
    stride: tuple[int, int],
    start: tuple[int, int],
    image_hw: tuple | None = None,
) -> None:
    """Validate pooling parameters (and the image size where it is known).

    Rules: ``size >= 1``, ``stride >= 1``, ``-size < start`` (the first window
    holds a pixel), and for a known length ``L``: ``L >= 1``, ``start < L`` and
    ``size <= L - start`` (the window fits in the image from ``start``).
    """
    for name, val in (("size", size), ("stride", stride)):
        if min(val) < 1:
            raise ValueError(f"{op}: {name} must be >= 1, got {val}")
    for axis in range(2):
        if start[axis] <= -size[axis]:
            raise ValueError(
                f"{op}: start ({start[axis]}) must be > -size ({-size[axis]}) so the "
                "first window holds a pixel"
            )
    if image_hw is None:
        return
    for axis, n in enumerate(image_hw):
        if n is None:
            continue
        side = "rows" if axis == 0 else "cols"
        if n < 1:
            raise ValueError(f"{op}: the image {side} ({n}) must be >= 1")
        if start[axis] >= n:
            raise ValueError(
                f"{op}: start ({start[axis]}) must be < the image {side} ({n})"
            )
        if size[axis] > n - start[axis]:
            raise ValueError(
                f"{op}: window {side} ({size[axis]}) larger than the image from start "
                f"({n} - {start[axis]} = {n - start[axis]})"
            )


def pool_output_length(length, size: int, stride: int, start: int):
    """Number of pooling windows along one axis (the rule in the module doc).

    ``length`` may be a Python int or a symbolic integer scalar.
    """
    n = (length - start - size + stride - 1) // stride + 1
    return _where((n - 1) * stride + start >= length, n - 1, n)


def pool_output_shape(
    image_hw: tuple[int, int],
    size: tuple[int, int],
    stride: tuple[int, int],
    start: tuple[int, int],
    op: str = "MaxPool",
) -> tuple[int, int]:
    """Validated output ``(rows, cols)`` of a pooling op."""
    check_pool_params(op, size, stride, start, image_hw)
    return (
        int(pool_output_length(image_hw[0], size[0], stride[0], start[0])),
        int(pool_output_length(image_hw[1], size[1], stride[1], start[1])),
    )


def pool_window_bounds(
    length: int, size: int, stride: int, start: int
) -> tuple[np.ndarray, np.ndarray]:
    """Clipped ``[lo, hi)`` bounds of every pooling window along one axis.

    Returns
    -------
    lo, hi : ndarray of int64, shape (n_windows,)
    """
    n = pool_output_length(length, size, stride, start)
    first = start + stride * np.arange(n, dtype=np.int64)
    return np.maximum(first, 0), np.minimum(first + size, length)


# --------------------------------------------------------------------------
# cross-map response normalisation
# --------------------------------------------------------------------------


def check_cross_map_params(op: str, size: int, alpha, beta, k) -> None:
    """Validate cross-map normalisation parameters."""
    if not _is_int(size) and not isinstance(size, np.integer):
        raise TypeError(f"{op}: size must be an int, got {size!r}")
    if size < 1:
        raise ValueError(f"{op}: size must be >= 1, got {size}")
    for name, val in (("alpha", alpha), ("beta", beta), ("k", k)):
        if not isinstance(val, numbers.Real) or isinstance(val, bool):
            raise TypeError(f"{op}: {name} must be a real number, got {val!r}")
        if not np.isfinite(val):
            raise ValueError(f"{op}: {name} must be finite, got {val!r}")
    if k <= 0:
        raise ValueError(f"{op}: k must be > 0 so the denominator is positive, got {k}")


def cross_map_params(
    op: str, size: Any, alpha: Any, beta: Any, k: Any, blocked: Any
) -> tuple[int, float, float, float, bool]:
    """Validated cross-map normalisation parameters as plain Python values.

    :func:`check_cross_map_params` plus ``alpha >= 0`` (with ``k > 0`` the
    denominator is then positive for every input) and a bool ``blocked``.
    The host ops, the GPU ops, the references and the launchers read their
    parameters through it.
    """
    check_cross_map_params(op, size, alpha, beta, k)
    if alpha < 0:
        raise ValueError(
            f"{op}: alpha must be >= 0 (with k > 0 that keeps the denominator "
            f"positive for every input), got {alpha}"
        )
    if not isinstance(blocked, (bool, np.bool_)):
        raise TypeError(f"{op}: blocked must be a bool, got {blocked!r}")
    return int(size), float(alpha), float(beta), float(k), bool(blocked)


def cross_map_window_bounds(
    channels: int, size: int, blocked: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Clipped ``[lo, hi)`` channel range that normalises each channel.

    Returns
    -------
    lo, hi : ndarray of int64, shape (channels,)
    """
    c = np.arange(channels, dtype=np.int64)
    if blocked:
        lo = (c // size) * size
        hi = lo + size
    else:
        lo = c - size // 2
        hi = c + (size - 1) // 2 + 1
    return np.maximum(lo, 0), np.minimum(hi, channels)


def cross_map_transposed_window_bounds(
    channels: int, size: int, blocked: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Clipped ``[lo, hi)`` range of the channels whose window holds each channel.

    Channel ``j`` lies in the window of channel ``c``
    (:func:`cross_map_window_bounds`) exactly when ``lo[j] <= c < hi[j]``; the
    gradient of cross-map normalisation sums over this range. For an even
    ``size`` the unblocked window is not symmetric, so this range
    (``j - (size-1)//2 .. j + size//2``, clipped) differs from the window
    itself; blocked groups are their own transpose.

    Returns
    -------
    lo, hi : ndarray of int64, shape (channels,)
    """
    lo, hi = cross_map_window_bounds(channels, size, blocked)
    j = np.arange(channels, dtype=np.int64)
    # lo and hi are non-decreasing, so {c : lo[c] <= j < hi[c]} is the range
    # between the first c with hi[c] > j and the last c with lo[c] <= j
    return (
        np.searchsorted(hi, j, side="right").astype(np.int64),
        np.searchsorted(lo, j, side="right").astype(np.int64),
    )


__all__ += ["cross_map_transposed_window_bounds"]
