"""Max and average pooling (cc2ops.pool) against naive per-window loops."""

from __future__ import annotations

import math
import re

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import TEST_MODE, check_grad, check_op, expect_error, rng
from pytensor.gradient import DisconnectedInputError, pushforward

from cc2ops.pool import (
    AvgPool,
    AvgPoolGrad,
    MaxPool,
    MaxPoolGrad,
    MaxPoolGradGrad,
    avg_pool2d,
    avg_pool_grad_reference,
    avg_pool_reference,
    max_pool2d,
    max_pool_grad_grad_reference,
    max_pool_grad_reference,
    max_pool_reference,
)

# --------------------------------------------------------------------------
# independent naive references
# --------------------------------------------------------------------------


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def naive_windows(length, size, stride, start):
    """Clipped ``[lo, hi)`` of each window along one axis, placed one at a time.

    A window is placed at ``start``; another follows ``stride`` later as long
    as the previous one did not reach the last pixel and the new one starts
    inside the image.
    """
    wins = []
    p = start
    while True:
        wins.append((max(p, 0), min(p + size, length)))
        if p + size >= length:
            break
        p += stride
        if p >= length:
            break
    return wins


def _windows(shape, size, stride, start):
    size, stride, start = _pair(size), _pair(stride), _pair(start)
    rows = naive_windows(shape[2], size[0], stride[0], start[0])
    cols = naive_windows(shape[3], size[1], stride[1], start[1])
    return rows, cols


def naive_max(x, size, stride, start):
    """Window maxima and the (row, col) of each window's FIRST maximum.

    Pixels are scanned in row-major order and only a strictly larger value
    replaces the current best, so ties keep the first.
    """
    rows, cols = _windows(x.shape, size, stride, start)
    b, c = x.shape[:2]
    y = np.empty((b, c, len(rows), len(cols)), x.dtype)
    arg = np.empty((b, c, len(rows), len(cols), 2), np.int64)
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            best = x[:, :, r0, c0].copy()
            br = np.full((b, c), r0)
            bc = np.full((b, c), c0)
            for r in range(r0, r1):
                for q in range(c0, c1):
                    better = x[:, :, r, q] > best
                    best[better] = x[:, :, r, q][better]
                    br[better] = r
                    bc[better] = q
            y[:, :, i, j] = best
            arg[:, :, i, j, 0] = br
            arg[:, :, i, j, 1] = bc
    return y, arg


def naive_max_grad(x, gy, size, stride, start):
    _, arg = naive_max(x, size, stride, start)
    gx = np.zeros_like(x)
    bi, ci = np.indices(x.shape[:2])
    for i in range(gy.shape[2]):
        for j in range(gy.shape[3]):
            gx[bi, ci, arg[:, :, i, j, 0], arg[:, :, i, j, 1]] += gy[:, :, i, j]
    return gx


def naive_max_grad_grad(x, ggx, size, stride, start):
    _, arg = naive_max(x, size, stride, start)
    bi, ci = np.indices(x.shape[:2])
    ggy = np.empty(arg.shape[:4], x.dtype)
    for i in range(ggy.shape[2]):
        for j in range(ggy.shape[3]):
            ggy[:, :, i, j] = ggx[bi, ci, arg[:, :, i, j, 0], arg[:, :, i, j, 1]]
    return ggy


def naive_avg(x, size, stride, start):
    rows, cols = _windows(x.shape, size, stride, start)
    y = np.empty(x.shape[:2] + (len(rows), len(cols)), x.dtype)
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            count = (r1 - r0) * (c1 - c0)
            y[:, :, i, j] = x[:, :, r0:r1, c0:c1].sum(axis=(2, 3)) / count
    return y


def naive_avg_grad(gy, image_hw, size, stride, start):
    shape = gy.shape[:2] + tuple(int(v) for v in image_hw)
    rows, cols = _windows(shape, size, stride, start)
    assert (len(rows), len(cols)) == gy.shape[2:]
    gx = np.zeros(shape, gy.dtype)
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            count = (r1 - r0) * (c1 - c0)
            gx[:, :, r0:r1, c0:c1] += (gy[:, :, i, j] / count)[:, :, None, None]
    return gx


def distinct(shape, dtype, seed=0):
    """Distinct values in random order, spaced well beyond verify_grad's eps
    (1e-7 for float64, 1e-2 for float32) so finite differences cross no tie;
    centred and small so rounding stays below the gradient tolerance."""
    n = int(np.prod(shape))
    step = 1e-5 if dtype == "float64" else 5e-2
    v = (rng(seed).permutation(n) - n / 2).reshape(shape) * step
    return v.astype(dtype)


def normal(shape, dtype, seed=0):
    return rng(seed).standard_normal(shape).astype(dtype)


def to_c01b(a):
    return np.ascontiguousarray(a.transpose(1, 2, 3, 0))


def to_bc01(a):
    return np.ascontiguousarray(a.transpose(3, 0, 1, 2))


# --------------------------------------------------------------------------
# hand-checked examples and the window rule
# --------------------------------------------------------------------------

ARANGE = np.arange(25.0).reshape(1, 1, 5, 5)


def _run(build, *arrays):
    syms = [pt.tensor(dtype=str(a.dtype), shape=(None,) * a.ndim) for a in arrays]
    return pytensor.function(syms, build(*syms), mode=TEST_MODE)(*arrays)


def test_hand_checked_5x5_size2_stride2():
    # windows rows/cols [0,2), [2,4), [4,5): the last is clipped to one pixel
    want_max = [[6, 8, 9], [16, 18, 19], [21, 23, 24]]
    want_avg = [[3, 5, 6.5], [13, 15, 16.5], [20.5, 22.5, 24]]
    np.testing.assert_array_equal(
        _run(lambda x: max_pool2d(x, 2), ARANGE)[0, 0], want_max
    )
    np.testing.assert_array_equal(
        _run(lambda x: avg_pool2d(x, 2), ARANGE)[0, 0], want_avg
    )


def test_hand_checked_5x5_size3_stride2_start_minus1():
    # windows [-1,2) -> [0,2), [1,4), [3,6) -> [3,5)
    want_max = [[6, 8, 9], [16, 18, 19], [21, 23, 24]]
    want_avg = [
        [(0 + 1 + 5 + 6) / 4, (1 + 2 + 3 + 6 + 7 + 8) / 6, (3 + 4 + 8 + 9) / 4],
        [(5 + 6 + 10 + 11 + 15 + 16) / 6, 12, (8 + 9 + 13 + 14 + 18 + 19) / 6],
        [
            (15 + 16 + 20 + 21) / 4,
            (16 + 17 + 18 + 21 + 22 + 23) / 6,
            (18 + 19 + 23 + 24) / 4,
        ],
    ]
    got_max = _run(lambda x: max_pool2d(x, 3, 2, -1), ARANGE)[0, 0]
    got_avg = _run(lambda x: avg_pool2d(x, 3, 2, -1), ARANGE)[0, 0]
    np.testing.assert_array_equal(got_max, want_max)
    np.testing.assert_allclose(got_avg, want_avg, rtol=1e-14)


def test_hand_checked_gradients_5x5():
    x = pt.tensor4("x")
    cost = (max_pool2d(x, 2) * np.arange(1.0, 10.0).reshape(3, 3)).sum()
    gx = pytensor.function([x], pytensor.grad(cost, x), mode=TEST_MODE)(ARANGE)
    want = np.zeros((5, 5))
    want[1, 1], want[1, 3], want[1, 4] = 1, 2, 3
    want[3, 1], want[3, 3], want[3, 4] = 4, 5, 6
    want[4, 1], want[4, 3], want[4, 4] = 7, 8, 9
    np.testing.assert_array_equal(gx[0, 0], want)

    cost = avg_pool2d(x, 2).sum()
    gx = pytensor.function([x], pytensor.grad(cost, x), mode=TEST_MODE)(ARANGE)
    want = np.full((5, 5), 0.25)
    want[4, :4] = want[:4, 4] = 0.5
    want[4, 4] = 1.0
    np.testing.assert_array_equal(gx[0, 0], want)


@pytest.mark.parametrize(
    "length, size, stride, start, fires",
    [
        (6, 2, 3, 0, True),
        (7, 2, 3, 0, False),
        (5, 2, 4, 2, True),
        (5, 1, 5, 0, True),
        (5, 3, 2, 0, False),
        (8, 3, 3, -2, False),
        (9, 2, 5, -1, True),
    ],
)
def test_window_count_and_less_one_rule(length, size, stride, start, fires):
    ceil_count = math.ceil((length - start - size) / stride) + 1
    naive = naive_windows(length, size, stride, start)
    assert (ceil_count - len(naive) == 1) is fires
    assert all(lo < hi for lo, hi in naive)
    x = normal((1, 1, length, 3), "float64")
    y = _run(lambda v: max_pool2d(v, (size, 1), (stride, 1), (start, 0)), x)
    assert y.shape == (1, 1, len(naive), 3)


# --------------------------------------------------------------------------
# seeded sweeps through check_op
# --------------------------------------------------------------------------

# (shape bc01, size, stride, start, dtype, check gradients)
CASES = [
    ((1, 1, 5, 5), 2, 2, 0, "float64", True),  # stride == size, clipped border
    ((3, 3, 7, 6), 3, 2, 0, "float64", True),  # overlapping, rectangular
    ((2, 5, 6, 7), 2, 3, 0, "float64", True),  # stride > size; rows: less one
    ((1, 3, 5, 5), 1, 1, 0, "float64", True),  # size 1
    ((2, 1, 6, 5), 1, 2, 1, "float64", True),  # size 1, stride 2, start > 0
    ((2, 2, 7, 7), 3, 2, 1, "float64", True),  # start > 0
    ((2, 2, 6, 7), 3, 2, -1, "float64", True),  # start < 0
    ((1, 2, 5, 6), (2, 3), (1, 2), (-1, 0), "float64", True),  # pairs
    ((2, 3, 5, 6), 2, 4, 2, "float64", True),  # less one on both axes
    ((1, 1, 4, 4), 4, 1, 0, "float64", True),  # window == image
    ((1, 1, 5, 5), 3, 2, -2, "float64", True),  # start == 1 - size
    ((1, 1, 5, 5), 3, 1, 2, "float64", True),  # size == L - start
    ((2, 3, 6, 6), 3, 2, 0, "float32", True),
    ((1, 4, 7, 5), (3, 2), (2, 3), (0, -1), "float32", True),
    ((129, 3, 8, 8), 3, 2, 0, "float32", False),
    ((129, 1, 5, 7), 2, 3, -1, "float64", False),
    ((3, 64, 13, 13), 3, 2, 0, "float32", False),
    ((1, 64, 9, 11), 2, 2, 1, "float64", False),
    ((129, 5, 3, 2), 2, 1, 0, "float64", True),  # batch 129, tiny spatial
]


def _case_id(case):
    shape, size, stride, start, dtype, grads = case
    return f"{'x'.join(map(str, shape))}-k{size}-s{stride}-o{start}-{dtype}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_max_pool_sweep(case):
    shape, size, stride, start, dtype, grads = case
    x = distinct(shape, dtype)
    check_op(
        lambda v: max_pool2d(v, size, stride, start),
        [x],
        lambda a: naive_max(a, size, stride, start)[0],
        label=f"max_pool2d {_case_id(case)}",
        names=["x"],
        wrt=None if grads else (),
    )


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_avg_pool_sweep(case):
    shape, size, stride, start, dtype, grads = case
    x = normal(shape, dtype, seed=1)
    check_op(
        lambda v: avg_pool2d(v, size, stride, start),
        [x],
        lambda a: naive_avg(a, size, stride, start),
        label=f"avg_pool2d {_case_id(case)}",
        names=["x"],
        wrt=None if grads else (),
    )


GRAD_CASES = [c for c in CASES if c[5]][::2] + [CASES[-1]]


@pytest.mark.parametrize("case", GRAD_CASES, ids=_case_id)
def test_max_pool_grad_op(case):
    shape, size, stride, start, dtype, _ = case
    x = distinct(shape, dtype)
    y = naive_max(x, size, stride, start)[0]
    gy = normal(y.shape, dtype, seed=2)
    params = dict(size=size, stride=stride, start=start)
    check_op(
        lambda a, b, g: MaxPoolGrad(**params)(a, b, g),
        [x, y, gy],
        lambda a, b, g: naive_max_grad(a, g, size, stride, start),
        label=f"MaxPoolGrad {_case_id(case)}",
        names=["x", "y", "gy"],
        wrt=[2],
    )


@pytest.mark.parametrize("case", GRAD_CASES, ids=_case_id)
def test_max_pool_grad_grad_op(case):
    shape, size, stride, start, dtype, _ = case
    x = distinct(shape, dtype)
    y = naive_max(x, size, stride, start)[0]
    ggx = normal(shape, dtype, seed=3)
    params = dict(size=size, stride=stride, start=start)
    check_op(
        lambda a, b, g: MaxPoolGradGrad(**params)(a, b, g),
        [x, y, ggx],
        lambda a, b, g: naive_max_grad_grad(a, g, size, stride, start),
        label=f"MaxPoolGradGrad {_case_id(case)}",
        names=["x", "y", "ggx"],
        wrt=[2],
    )


@pytest.mark.parametrize("case", GRAD_CASES, ids=_case_id)
def test_avg_pool_grad_op(case):
    shape, size, stride, start, dtype, _ = case
    y_shape = naive_avg(np.zeros(shape), size, stride, start).shape
    gy = normal(y_shape, dtype, seed=4)
    hw = np.array(shape[2:], dtype="int64")
    params = dict(size=size, stride=stride, start=start)
    check_op(
        lambda g, h: AvgPoolGrad(**params)(g, h),
        [gy, hw],
        lambda g, h: naive_avg_grad(g, h, size, stride, start),
        label=f"AvgPoolGrad {_case_id(case)}",
        names=["gy", "image_hw"],
    )


C01B_CASES = [
    ((3, 5, 7, 6), 3, 2, 0, "float64", True),
    ((2, 3, 6, 5), 2, 3, -1, "float32", True),
    ((129, 3, 8, 8), 3, 2, 1, "float32", False),
    ((2, 64, 5, 5), 2, 2, 0, "float64", False),
]


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("case", C01B_CASES, ids=_case_id)
def test_c01b_layout(case, kind):
    shape, size, stride, start, dtype, grads = case
    build, naive, op = {
        "max": (max_pool2d, lambda a: naive_max(a, size, stride, start)[0], MaxPool),
        "avg": (avg_pool2d, lambda a: naive_avg(a, size, stride, start), AvgPool),
    }[kind]
    x = to_c01b(distinct(shape, dtype))
    check_op(
        lambda v: build(v, size, stride, start, layout="c01b"),
        [x],
        lambda a: to_c01b(naive(to_bc01(a))),
        label=f"{kind} c01b {_case_id(case)}",
        names=["x"],
        wrt=None if grads else (),
        op_class=op,
    )


def test_static_shapes():
    x = pt.tensor("x", dtype="float32", shape=(4, 3, 7, 6))
    assert max_pool2d(x, 3, 2).type.shape == (4, 3, 3, 3)
    assert avg_pool2d(x, 2, 3).type.shape == (4, 3, 3, 2)
    assert max_pool2d(x, 3, 2, layout="c01b").type.shape == (4, 1, 3, 6)
    part = pt.tensor("p", dtype="float64", shape=(None, 2, 9, None))
    assert max_pool2d(part, 3, 2, -1).type.shape == (None, 2, 5, None)
    y = MaxPool(size=3, stride=2)(x)
    assert MaxPoolGrad(size=3, stride=2)(x, y, y).type.shape == (4, 3, 7, 6)
    assert MaxPoolGradGrad(size=3, stride=2)(x, y, x).type.shape == (4, 3, 3, 3)
    gx = AvgPoolGrad(size=3, stride=2)(y, [7, 6])
    assert gx.type.shape == (4, 3, 7, 6)
    # the gradient graph keeps the static image shape
    gx = pytensor.grad(avg_pool2d(x, 3, 2).sum(), x)
    assert gx.type.shape == (4, 3, 7, 6)


def test_op_props_and_equality():
    assert MaxPool(size=2) == MaxPool(size=(2, 2), stride=(2, 2), start=(0, 0))
    assert hash(MaxPool(size=2)) == hash(MaxPool(size=(2, 2), stride=2))
    assert MaxPool(size=2) != MaxPool(size=2, start=1)
    assert MaxPool(size=2) != AvgPool(size=2)
    op = AvgPool(size=(3, 2), stride=(1, 2), start=(-1, 0))
    assert (op.size, op.stride, op.start) == ((3, 2), (1, 2), (-1, 0))
    with pytest.raises(TypeError):
        MaxPool(2)


def test_references_match_naive():
    x = distinct((2, 3, 9, 8), "float64", seed=5)
    size, stride, start = (3, 2), (2, 3), (-1, 1)
    y, _ = naive_max(x, size, stride, start)
    gy = normal(y.shape, "float64", seed=6)
    ggx = normal(x.shape, "float64", seed=7)
    np.testing.assert_array_equal(max_pool_reference(x, size, stride, start), y)
    np.testing.assert_array_equal(
        max_pool_grad_reference(x, y, gy, size, stride, start),
        naive_max_grad(x, gy, size, stride, start),
    )
    np.testing.assert_array_equal(
        max_pool_grad_grad_reference(x, y, ggx, size, stride, start),
        naive_max_grad_grad(x, ggx, size, stride, start),
    )
    np.testing.assert_allclose(
        avg_pool_reference(x, size, stride, start),
        naive_avg(x, size, stride, start),
        rtol=1e-13,
    )
    np.testing.assert_allclose(
        avg_pool_grad_reference(gy, (9, 8), size, stride, start),
        naive_avg_grad(gy, (9, 8), size, stride, start),
        rtol=1e-13,
    )
    # stride None means stride = size; float32 stays float32
    x32 = x.astype("float32")
    out = avg_pool_reference(x32, 2, None)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, naive_avg(x32, 2, 2, 0), rtol=1e-6)


# --------------------------------------------------------------------------
# ties, -inf
# --------------------------------------------------------------------------

TIES = np.array([[1.0, 2.0, 2.0], [2.0, 0.0, 2.0], [1.0, 2.0, 1.0]])[None, None]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_gradient_ties_go_to_first(dtype):
    # 2x2 windows, stride 1; first maxima (row-major): (0,1) (0,1) (1,0) (1,2)
    x = TIES.astype(dtype)
    w = np.array([[1.0, 10.0], [100.0, 1000.0]], dtype)
    xs = pt.tensor4("x", dtype=dtype)
    gx = pytensor.grad((max_pool2d(xs, 2, 1) * w).sum(), xs)
    got = pytensor.function([xs], gx, mode=TEST_MODE)(x)
    want = np.array([[0, 11, 0], [100, 0, 1000], [0, 0, 0]], dtype)
    np.testing.assert_array_equal(got[0, 0], want)
    assert got.dtype == dtype

    y = np.full((1, 1, 2, 2), 2.0, dtype)
    ggx = np.arange(9, dtype=dtype).reshape(1, 1, 3, 3)
    ggy = _run(lambda a, b, g: MaxPoolGradGrad(size=2, stride=1)(a, b, g), x, y, ggx)
    np.testing.assert_array_equal(ggy[0, 0], [[1, 1], [3, 5]])


@pytest.mark.parametrize("fill", [1.0, -np.inf])
def test_max_ties_with_start_below_zero(fill):
    # windows [-1,2) -> [0,2) and [1,4) per axis; all pixels equal, so each
    # window's gradient goes to its first real pixel, never to the padding
    x = np.full((1, 1, 4, 4), fill)
    xs = pt.tensor4("x")
    y = max_pool2d(xs, 3, 2, -1)
    w = np.array([[1.0, 2.0], [3.0, 4.0]])
    fn = pytensor.function([xs], [y, pytensor.grad((y * w).sum(), xs)], mode=TEST_MODE)
    got_y, got_gx = fn(x)
    np.testing.assert_array_equal(got_y, np.full((1, 1, 2, 2), fill))
    want = np.zeros((4, 4))
    want[:2, :2] = w
    np.testing.assert_array_equal(got_gx[0, 0], want)


def test_max_with_neg_inf_pixels():
    x = distinct((2, 2, 5, 5), "float64", seed=8)
    x[0, 0, :3, :3] = -np.inf
    x[1, 1] = -np.inf
    y, _ = naive_max(x, 3, 2, 0)
    gy = normal(y.shape, "float64", seed=9)
    got_y = _run(lambda a: max_pool2d(a, 3, 2), x)
    np.testing.assert_array_equal(got_y, y)
    got = _run(lambda a, b, g: MaxPoolGrad(size=3, stride=2)(a, b, g), x, y, gy)
    np.testing.assert_array_equal(got, naive_max_grad(x, gy, 3, 2, 0))
    assert np.isneginf(got_y[1, 1]).all()
    assert got[1, 1, 0, 0] == gy[1, 1, 0, 0]


# --------------------------------------------------------------------------
# higher derivatives, zero pullbacks, pushforward
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_second_derivative_avg(dtype):
    x = normal((2, 2, 5, 6), dtype, seed=10)
    size, stride, start = 3, 2, -1

    def first(v):
        return pytensor.grad((avg_pool2d(v, size, stride, start) ** 2).sum(), v)

    got = _run(first, x)
    want = 2 * naive_avg_grad(
        naive_avg(x, size, stride, start), (5, 6), size, stride, start
    )
    np.testing.assert_allclose(got, want, rtol=1e-4 if dtype == "float32" else 1e-12)
    check_grad(first, [x], 0, label=f"d2 avg_pool2d {dtype}")


def test_second_derivative_max():
    x = distinct((2, 2, 6, 5), "float64", seed=11)
    size, stride, start = 3, 2, 1

    def first(v):
        return pytensor.grad((max_pool2d(v, size, stride, start) ** 3).sum(), v)

    y, _ = naive_max(x, size, stride, start)
    np.testing.assert_allclose(
        _run(first, x), naive_max_grad(x, 3 * y**2, size, stride, start), rtol=1e-12
    )
    check_grad(first, [x], 0, label="d2 max_pool2d")

    # and once more: the family is closed under differentiation
    def second(v):
        return pytensor.grad((first(v) ** 2).sum(), v)

    check_grad(second, [x], 0, label="d3 max_pool2d")


@pytest.mark.parametrize("op_class", [MaxPoolGrad, MaxPoolGradGrad])
def test_max_backward_pullbacks_zero_wrt_x_and_y(op_class):
    x = distinct((2, 3, 6, 5), "float64", seed=12)
    y, _ = naive_max(x, 2, 2, 0)
    third = normal(y.shape if op_class is MaxPoolGrad else x.shape, "float64", 13)
    xs, ys, ts = (pt.tensor4(n) for n in "xyt")
    out = op_class(size=2)(xs, ys, ts)
    weights = normal(x.shape if op_class is MaxPoolGrad else y.shape, "float64", 14)
    gx, gy = pytensor.grad((out * weights).sum(), [xs, ys])
    fn = pytensor.function(
        [xs, ys, ts], [gx, gy], mode=TEST_MODE, on_unused_input="ignore"
    )
    got_gx, got_gy = fn(x, y, third)
    np.testing.assert_array_equal(got_gx, np.zeros_like(x))
    np.testing.assert_array_equal(got_gy, np.zeros_like(y))


def test_avg_pool_grad_image_hw_disconnected():
    gy = pt.tensor4("gy")
    hw = pt.lvector("hw")
    cost = AvgPoolGrad(size=2)(gy, hw).sum()
    with pytest.raises(DisconnectedInputError):
        pytensor.grad(cost, hw)


def _fd(build, args, index, direction, h=1e-6):
    plus = list(args)
    minus = list(args)
    plus[index] = args[index] + h * direction
    minus[index] = args[index] - h * direction
    return (_run(build, *plus) - _run(build, *minus)) / (2 * h)


def _jvp(build, args, index, direction, use_op):
    syms = [pt.tensor(dtype=str(a.dtype), shape=(None,) * a.ndim) for a in args]
    v = pt.tensor(dtype=str(direction.dtype), shape=(None,) * direction.ndim)
    r = pushforward(build(*syms), syms[index], v, use_op_pushforward=use_op)
    fn = pytensor.function(syms + [v], r, mode=TEST_MODE, on_unused_input="ignore")
    return fn(*args, direction)


@pytest.mark.parametrize("use_op", [True, False])
def test_pushforward(use_op):
    x = distinct((2, 2, 6, 5), "float64", seed=15)
    size, stride, start = 3, 2, -1
    y, _ = naive_max(x, size, stride, start)
    gy = normal(y.shape, "float64", 16)
    ggx = normal(x.shape, "float64", 17)
    vx = normal(x.shape, "float64", 18)
    vy = normal(y.shape, "float64", 19)
    params = dict(size=size, stride=stride, start=start)
    hw = np.array([6, 5])

    cases = [
        ("max_pool2d", lambda a: max_pool2d(a, size, stride, start), [x], 0, vx),
        ("avg_pool2d", lambda a: avg_pool2d(a, size, stride, start), [x], 0, vx),
        (
            "MaxPoolGrad gy",
            lambda a, b, g: MaxPoolGrad(**params)(a, b, g),
            [x, y, gy],
            2,
            vy,
        ),
        (
            "MaxPoolGradGrad ggx",
            lambda a, b, g: MaxPoolGradGrad(**params)(a, b, g),
            [x, y, ggx],
            2,
            vx,
        ),
        ("AvgPoolGrad gy", lambda g, h: AvgPoolGrad(**params)(g, h), [gy, hw], 0, vy),
    ]
    for label, build, args, index, direction in cases:
        got = _jvp(build, args, index, direction, use_op)
        want = _fd(build, args, index, direction)
        np.testing.assert_allclose(
            got, want, rtol=1e-6, atol=1e-8, err_msg=f"pushforward {label}"
        )

    if use_op:
        # piecewise constant in x and y: the pushforward along them is zero
        for op_class, third in ((MaxPoolGrad, gy), (MaxPoolGradGrad, ggx)):
            for index, direction in ((0, vx), (1, vy)):
                got = _jvp(
                    lambda a, b, g, op_class=op_class: op_class(**params)(a, b, g),
                    [x, y, third],
                    index,
                    direction,
                    True,
                )
                assert got.shape == (x if op_class is MaxPoolGrad else y).shape
                assert not got.any(), f"{op_class.__name__} along input {index}"


def test_compiles_in_cc2ops_mode():
    from cc2ops.mode import mode

    x = pt.tensor4("x")
    cost = (max_pool2d(x, 3, 2, -1, layout="c01b") ** 2).sum() + avg_pool2d(x, 2).sum()
    fn = pytensor.function([x], [cost, pytensor.grad(cost, x)], mode=mode)
    a = normal((3, 7, 6, 2), "float64", seed=20)
    got_cost, got_grad = fn(a)
    ym = naive_max(to_bc01(a), 3, 2, -1)[0]
    want_cost = (ym**2).sum() + naive_avg(a, 2, 2, 0).sum()
    want_grad = to_c01b(naive_max_grad(to_bc01(a), 2 * ym, 3, 2, -1))
    want_grad += naive_avg_grad(np.ones((3, 7, 3, 1)), (6, 2), 2, 2, 0)
    np.testing.assert_allclose(got_cost, want_cost, rtol=1e-12)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-12)


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------


def raises(exc, text):
    """``pytest.raises`` matching ``text`` literally."""
    return pytest.raises(exc, match=re.escape(text))


@pytest.mark.parametrize(
    "builder, op", [(max_pool2d, "MaxPool"), (avg_pool2d, "AvgPool")]
)
def test_bad_builder_input(builder, op):
    x = pt.tensor4("x")
    with raises(TypeError, f"{op}: images must have 4 dims (B, C, H, W), got 3"):
        builder(pt.tensor3("x"), 2)
    with raises(TypeError, f"{op}: images must have 4 dims (C, H, W, B), got 2"):
        builder(pt.matrix("x"), 2, layout="c01b")
    with raises(TypeError, f"{op}: images must be float32 or float64, got int32"):
        builder(pt.tensor4("x", dtype="int32"), 2)
    with raises(ValueError, f"{op}: size must be >= 1, got (0, 2)"):
        builder(x, (0, 2))
    with raises(ValueError, f"{op}: stride must be >= 1, got (1, -1)"):
        builder(x, 2, (1, -1))
    with raises(ValueError, f"{op}: start (-3) must be > -size (-3)"):
        builder(x, 3, 1, -3)
    with raises(TypeError, f"{op}: size must be an int or a pair of ints, got 2.5"):
        builder(x, 2.5)
    with raises(TypeError, f"{op}: start must be an int or a pair of ints"):
        builder(x, 2, 2, (0, 0, 0))
    with raises(ValueError, f"{op}: layout must be one of ('bc01', 'c01b'), got 'hw'"):
        builder(x, 2, layout="hw")

    static = pt.tensor("x", shape=(1, 1, 5, 6))
    with raises(ValueError, f"{op}: start (5) must be < the image rows (5)"):
        builder(static, 1, 1, 5)
    with raises(ValueError, f"{op}: start (7) must be < the image cols (6)"):
        builder(static, 1, 1, (0, 7))
    with raises(
        ValueError,
        f"{op}: window cols (5) larger than the image from start (6 - 2 = 4)",
    ):
        builder(static, (1, 5), 1, 2)

    # the same rules at run time when the shape is not static
    arr = np.zeros((1, 1, 5, 6))
    for args, text in [
        ((3, 1, 3), "window rows (3) larger than the image from start (5 - 3 = 2)"),
        ((2, 1, 6), "start (6) must be < the image rows (5)"),
        ((7,), "window rows (7) larger than the image from start (5 - 0 = 5)"),
        (((1, 2), 1, (0, 6)), "start (6) must be < the image cols (6)"),
    ]:
        fn = pytensor.function([x], builder(x, *args), mode=TEST_MODE)
        expect_error(ValueError, f"{op}: {text}", fn, arr)


def test_bad_max_grad_input():
    x, y, g = pt.tensor4("x"), pt.tensor4("y"), pt.tensor4("g")
    with raises(TypeError, "MaxPoolGrad: output gradient must have 4 dims"):
        MaxPoolGrad(size=2)(x, y, pt.matrix())
    with raises(
        TypeError,
        "MaxPoolGrad: inputs must share one float dtype, got images float64, "
        "pooled output float64, output gradient float32",
    ):
        MaxPoolGrad(size=2)(x, y, pt.tensor4(dtype="float32"))
    with raises(TypeError, "MaxPoolGradGrad: pooled output must be float32"):
        MaxPoolGradGrad(size=2)(x, pt.tensor4(dtype="int64"), g)
    with raises(ValueError, "MaxPoolGrad: size must be >= 1, got (0, 0)"):
        MaxPoolGrad(size=0)

    xs = pt.tensor("xs", shape=(2, 3, 6, 6))
    with raises(
        ValueError,
        "MaxPoolGrad: output gradient shape (2, 3, 4, 3) does not match the pooled "
        "shape (2, 3, 3, 3)",
    ):
        MaxPoolGrad(size=2)(xs, y, pt.tensor("g", shape=(2, 3, 4, 3)))
    with raises(
        ValueError,
        "MaxPoolGradGrad: pooled output shape (2, 3, 3, 4) does not match",
    ):
        MaxPoolGradGrad(size=2)(xs, pt.tensor("y", shape=(2, 3, 3, 4)), g)
    with raises(
        ValueError,
        "MaxPoolGradGrad: input gradient shape (2, 3, 6, 5) must equal the image "
        "shape (2, 3, 6, 6)",
    ):
        MaxPoolGradGrad(size=2)(xs, y, pt.tensor("g", shape=(2, 3, 6, 5)))

    xv, yv = np.zeros((2, 3, 6, 6)), np.zeros((2, 3, 3, 3))
    fn = pytensor.function([x, y, g], MaxPoolGrad(size=2)(x, y, g), mode=TEST_MODE)
    expect_error(
        ValueError,
        "MaxPoolGrad: output gradient shape (2, 3, 3, 2) does not match the pooled "
        "shape (2, 3, 3, 3) of images (2, 3, 6, 6) with size (2, 2), stride (2, 2), "
        "start (0, 0)",
        fn,
        xv,
        yv,
        np.zeros((2, 3, 3, 2)),
    )
    expect_error(
        ValueError,
        "MaxPoolGrad: pooled output shape (2, 1, 3, 3) does not match",
        fn,
        xv,
        np.zeros((2, 1, 3, 3)),
        yv,
    )
    fn = pytensor.function([x, y, g], MaxPoolGradGrad(size=2)(x, y, g), mode=TEST_MODE)
    expect_error(
        ValueError,
        "MaxPoolGradGrad: input gradient shape (2, 3, 6, 7) must equal the image "
        "shape (2, 3, 6, 6)",
        fn,
        xv,
        yv,
        np.zeros((2, 3, 6, 7)),
    )


def test_bad_avg_grad_input():
    gy = pt.tensor4("gy")
    with raises(
        TypeError, "AvgPoolGrad: image_hw must have an integer dtype, got float64"
    ):
        AvgPoolGrad(size=2)(gy, pt.vector())
    with raises(TypeError, "AvgPoolGrad: image_hw must have 1 dim (H, W), got 2"):
        AvgPoolGrad(size=2)(gy, pt.lmatrix())
    with raises(ValueError, "AvgPoolGrad: image_hw must have 2 entries (H, W), got 3"):
        AvgPoolGrad(size=2)(gy, [4, 4, 4])
    with raises(TypeError, "AvgPoolGrad: output gradient must be float32 or float64"):
        AvgPoolGrad(size=2)(pt.tensor4(dtype="int16"), [4, 4])
    with raises(
        ValueError,
        "AvgPoolGrad: output gradient shape (1, 1, 3, 3) does not match the pooled "
        "shape (1, 1, 2, 2)",
    ):
        AvgPoolGrad(size=2)(pt.tensor("g", shape=(1, 1, 3, 3)), [4, 4])
    with raises(ValueError, "AvgPoolGrad: window rows (2) larger than the image"):
        AvgPoolGrad(size=2)(gy, [1, 4])

    hw = pt.lvector("hw")
    grad = AvgPoolGrad(size=3, stride=2)(gy, hw)
    fn = pytensor.function([gy, hw], grad, mode=TEST_MODE)
    expect_error(
        ValueError,
        "AvgPoolGrad: output gradient shape (1, 2, 3, 3) does not match the pooled "
        "shape (1, 2, 2, 3) of images (1, 2, 5, 7) with size (3, 3), stride (2, 2), "
        "start (0, 0)",
        fn,
        np.zeros((1, 2, 3, 3)),
        np.array([5, 7]),
    )
    expect_error(
        ValueError,
        "AvgPoolGrad: image_hw must have 2 entries (H, W), got [5, 7, 1]",
        fn,
        np.zeros((1, 2, 2, 3)),
        np.array([5, 7, 1]),
    )
    expect_error(
        ValueError,
        "AvgPoolGrad: image_hw (H, W) must be >= 1, got (0, 7)",
        fn,
        np.zeros((1, 2, 2, 3)),
        np.array([0, 7]),
    )


def test_bad_reference_input():
    with raises(TypeError, "max_pool_reference: images must have 4 dims"):
        max_pool_reference(np.zeros((3, 3)), 2, 2)
    with raises(TypeError, "avg_pool_reference: images must be float32 or float64"):
        avg_pool_reference(np.zeros((1, 1, 3, 3), dtype=int), 2, 2)
    with raises(ValueError, "avg_pool_grad_reference: output gradient shape"):
        avg_pool_grad_reference(np.zeros((1, 1, 3, 3)), (4, 4), 2, 2)
    with raises(ValueError, "max_pool_grad_reference: start (-2) must be > -size"):
        max_pool_grad_reference(np.zeros((1, 1, 3, 3)), None, None, 2, 1, -2)
    with raises(ValueError, "max_pool_grad_grad_reference: window rows (4) larger"):
        x = np.zeros((1, 1, 3, 3))
        max_pool_grad_grad_reference(x, x, x, 4, 1, 0)
