"""The Numba backend (:mod:`cc2ops.backends.numba`), PyTensor's default linker.

Every graph is compiled in ``mode="NUMBA"`` (a few also with no mode, which is
Numba in PyTensor 3) with the object-mode warning turned into an error, and
its values are compared with the numpy references (or, for second
derivatives, with ``cc2ops.mode``). Numba compiles each kernel once per dtype
and rank, so the sweeps vary the props and shapes (which are run-time
arguments of the kernels) more than the dtypes.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.link.numba.dispatch.basic import numba_funcify_and_cache_key

import cc2ops
from cc2ops.backends.numba import pool_output_length
from cc2ops.conv import (
    conv_backward_data_reference,
    conv_backward_filter_reference,
    conv_forward_reference,
)
from cc2ops.cross_map_norm import (
    cross_map_norm_grad_reference,
    cross_map_norm_reference,
)
from cc2ops.dropout import advance_state, dropout_mask_reference, dropout_scale
from cc2ops.pool import (
    avg_pool_grad_reference,
    avg_pool_reference,
    max_pool_grad_reference,
    max_pool_reference,
)
from cc2ops.shapes import pool_output_length as shapes_pool_output_length
from cc2ops.softmax_cross_entropy import (
    softmax_cross_entropy_grad_reference,
    softmax_cross_entropy_reference,
    top_k_error_reference,
)

OBJECT_MODE = "Numba will use object mode"
TOL = {"float32": 2e-5, "float64": 1e-11}


def numba_function(inputs, outputs, mode="NUMBA", **kwargs):
    """``pytensor.function`` in a Numba mode; an object-mode warning is an error."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=OBJECT_MODE, category=UserWarning)
        return pytensor.function(inputs, outputs, mode=mode, **kwargs)


def check(label, got, want, dtype):
    """Shape and dtype first, then values (relative to the largest entry)."""
    want = np.asarray(want)
    assert got.shape == want.shape, f"{label}: shape {got.shape} != {want.shape}"
    assert got.dtype == np.dtype(dtype), f"{label}: dtype {got.dtype} != {dtype}"
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    err = float(np.max(np.abs(got - want), initial=0.0)) / scale
    assert err <= TOL[dtype], f"{label}: relative error {err:.3g} > {TOL[dtype]}"


def run(fn, *args):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=OBJECT_MODE, category=UserWarning)
        return fn(*args)


def test_pool_output_length_is_the_shapes_rule():
    for length in range(1, 12):
        for size in range(1, 5):
            for stride in range(1, 4):
                for start in range(-size + 1, 3):
                    if start >= length or size > length - start:
                        continue
                    assert pool_output_length(
                        length, size, stride, start
                    ) == shapes_pool_output_length(length, size, stride, start), (
                        length,
                        size,
                        stride,
                        start,
                    )


# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------

# (B, C, H, W), (F, kh, kw), stride, padding, groups (float32 is covered by the
# README example below, which runs the whole family in float32)
CONV_CASES = [
    ((1, 3, 7, 5), (4, 3, 3), 1, 1, 1),
    ((2, 4, 6, 7), (6, 3, 2), (2, 1), (0, 1), 2),
    ((3, 1, 5, 5), (1, 5, 5), 1, 2, 1),
    ((2, 6, 9, 8), (9, 3, 3), 2, 1, 3),
    ((2, 3, 4, 4), (2, 4, 4), 1, 0, 1),
    # im2col chunks (cc2ops.backends.numba.COLS_BUDGET, 2**20 elements): two
    # images of 8*25*2304 columns per chunk, then a shorter last chunk; one
    # image per chunk in each of two groups
    ((3, 8, 48, 48), (4, 5, 5), 1, 2, 1),
    ((3, 24, 48, 48), (6, 5, 5), 1, 2, 2),
]


def test_conv_family():
    """Forward and both pullbacks of every case, compiled as one function."""
    rng = np.random.default_rng(19)
    inputs, outputs, values, wants = [], [], [], []
    for xs, (f, kh, kw), stride, padding, groups in CONV_CASES:
        x, w, gy = pt.tensor4("x"), pt.tensor4("w"), pt.tensor4("gy")
        y = cc2ops.conv2d(x, w, stride=stride, padding=padding, groups=groups)
        inputs += [x, w, gy]
        outputs += [y, *pytensor.grad((y * gy).sum(), [x, w])]
        xv = rng.standard_normal(xs)
        wv = rng.standard_normal((f, xs[1] // groups, kh, kw))
        yref = conv_forward_reference(xv, wv, stride, padding, groups)
        gyv = rng.standard_normal(yref.shape)
        values += [xv, wv, gyv]
        wants += [
            yref,
            conv_backward_data_reference(gyv, wv, xs[2:], stride, padding, groups),
            conv_backward_filter_reference(xv, gyv, (kh, kw), stride, padding, groups),
        ]
    got = run(numba_function(inputs, outputs), *values)
    roles = ["forward", "pullback wrt images", "pullback wrt filters"]
    for i, (g, want) in enumerate(zip(got, wants, strict=True)):
        check(f"case {CONV_CASES[i // 3]}: {roles[i % 3]}", g, want, "float64")


def test_conv_second_order_and_c01b():
    """Second derivatives (all three ops differentiated) and the c01b layout."""
    rng = np.random.default_rng(3)
    x, w = pt.tensor4("x"), pt.tensor4("w")
    y = cc2ops.conv2d(x, w, stride=(1, 2), padding=1, groups=2, layout="c01b")
    gx, gw = pytensor.grad((y**2).sum(), [x, w])
    second = pytensor.grad((gx**2).sum() + (gw**2).sum(), [x, w])
    outs = [y, gx, gw, *second]
    fn = numba_function([x, w], outs)
    ref = pytensor.function([x, w], outs, mode=cc2ops.mode)
    xv = rng.standard_normal((4, 5, 6, 3))  # (C, H, W, B)
    wv = rng.standard_normal((2, 3, 3, 6))  # (C/groups, kh, kw, F)
    names = ["forward", "grad x", "grad w", "second wrt x", "second wrt w"]
    for name, got, want in zip(names, run(fn, xv, wv), ref(xv, wv), strict=True):
        check(name, got, want, "float64")


def test_conv_kernels_give_the_blas_its_threads_back():
    """The conv kernels run their GEMMs on one BLAS thread each (set through
    cc2ops.backends._numba_blas) and restore the BLAS's count after; the
    intrinsics read and set the count threadpoolctl sees."""
    numba = pytest.importorskip("numba")
    from cc2ops.backends import _numba_blas as blas

    if blas.LIBRARY is None:
        pytest.skip("the BLAS behind Numba's np.dot has no known thread-count API")

    @numba.njit
    def roundtrip(n):
        before = blas.get_blas_threads()
        blas.set_blas_threads(n)
        during = blas.get_blas_threads()
        blas.set_blas_threads(before)
        return before, during, blas.get_blas_threads()

    before, during, after = roundtrip(1)
    assert before >= 1 and during == 1 and after == before
    threadpoolctl = pytest.importorskip("threadpoolctl")
    counts = {i["filepath"]: i["num_threads"] for i in threadpoolctl.threadpool_info()}
    assert before in counts.values()
    x, w = pt.tensor4("x"), pt.tensor4("w")
    y = cc2ops.conv2d(x, w, padding=1)
    fn = numba_function([x, w], [y, *pytensor.grad(y.sum(), [x, w])])
    run(fn, np.ones((4, 2, 5, 5)), np.ones((3, 2, 3, 3)))
    assert roundtrip(1)[0] == before


def test_conv_runtime_shape_error_names_the_op():
    x, w = pt.tensor4("x"), pt.tensor4("w")
    fn = numba_function([x, w], cc2ops.conv2d(x, w, groups=2))
    with pytest.raises(ValueError, match=r"FilterActs: groups \(2\) must divide"):
        run(fn, np.zeros((1, 3, 4, 4)), np.zeros((2, 1, 3, 3)))


# --------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------

# size, stride, start, (B, C, H, W)
POOL_CASES = [
    (3, 2, 0, (1, 2, 7, 6)),
    (2, 1, -1, (2, 3, 5, 5)),
    ((3, 2), (2, 3), (1, -1), (2, 1, 9, 8)),
    (3, 3, 0, (1, 3, 3, 3)),
    (2, 2, 0, (1, 1, 4, 4)),
]


def _pool_values(rng, case):
    size, stride, start, shape = case
    if shape == (1, 1, 4, 4):
        # a window of -inf with a NaN, a window of -inf only, and real pixels
        xv = np.full(shape, -np.inf)
        xv[0, 0, 0, 1] = np.nan
        xv[0, 0, 3, 3] = 1.0
        return xv
    # integer-valued images: many ties, so the first-maximum rule is exercised
    return rng.integers(-3, 4, shape).astype("float64")


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool(kind):
    """Forward and pullback of every case, compiled as one function."""
    rng = np.random.default_rng(5)
    build = cc2ops.max_pool2d if kind == "max" else cc2ops.avg_pool2d
    fwd = max_pool_reference if kind == "max" else avg_pool_reference
    inputs, outputs, values, wants = [], [], [], []
    for case in POOL_CASES:
        size, stride, start, shape = case
        x, gy = pt.tensor4("x"), pt.tensor4("gy")
        y = build(x, size, stride=stride, start=start)
        inputs += [x, gy]
        outputs += [y, pytensor.grad((y * gy).sum(), x)]
        xv = _pool_values(rng, case)
        yref = fwd(xv, size, stride, start)
        gyv = rng.standard_normal(yref.shape)
        values += [xv, gyv]
        if kind == "max":
            gref = max_pool_grad_reference(xv, yref, gyv, size, stride, start)
        else:
            gref = avg_pool_grad_reference(gyv, shape[2:], size, stride, start)
        wants += [yref, gref]
    got = run(numba_function(inputs, outputs), *values)
    for i, (g, want) in enumerate(zip(got, wants, strict=True)):
        label = f"{kind} pool {POOL_CASES[i // 2]} {('forward', 'pullback')[i % 2]}"
        if not np.all(np.isfinite(want)):
            np.testing.assert_array_equal(g, want, err_msg=label)
        else:
            check(label, g, want, "float64")


def test_pool_second_order():
    """MaxPoolGradGrad and AvgPool as pullbacks of the gradient ops."""
    rng = np.random.default_rng(8)
    x, r = pt.tensor4("x"), pt.tensor4("r")
    outputs = []
    for build in (cc2ops.max_pool2d, cc2ops.avg_pool2d):
        y = build(x, 3, stride=2, start=-1)
        gx = pytensor.grad((y * r).sum(), x)
        outputs += [y, gx, pytensor.grad((gx**2).sum(), r)]
    fn = numba_function([x, r], outputs)
    ref = pytensor.function([x, r], outputs, mode=cc2ops.mode)
    xv = rng.standard_normal((2, 3, 7, 6))
    rv = rng.standard_normal((2, 3, 4, 3))
    names = [f"{k} {n}" for k in ("max", "avg") for n in ("fwd", "grad", "second")]
    for name, got, want in zip(names, run(fn, xv, rv), ref(xv, rv), strict=True):
        check(name, got, want, "float64")


# --------------------------------------------------------------------------
# cross-map normalisation
# --------------------------------------------------------------------------


# size, blocked, C (float32 is covered by the README example)
CMR_CASES = [(5, False, 7), (4, False, 6), (3, True, 7), (5, False, 1), (2, True, 5)]


def test_cross_map_norm():
    rng = np.random.default_rng(11)
    inputs, outputs, values, wants = [], [], [], []
    for size, blocked, channels in CMR_CASES:
        params = dict(size=size, alpha=0.5, beta=0.75, k=2.0, blocked=blocked)
        x, gy = pt.tensor4("x"), pt.tensor4("gy")
        y = cc2ops.cross_map_norm(x, **params)
        inputs += [x, gy]
        outputs += [y, pytensor.grad((y * gy).sum(), x)]
        xv = rng.standard_normal((2, channels, 3, 5))
        gyv = rng.standard_normal(xv.shape)
        values += [xv, gyv]
        wants += [
            cross_map_norm_reference(xv, **params),
            cross_map_norm_grad_reference(xv, gyv, **params),
        ]
    got = run(numba_function(inputs, outputs), *values)
    for i, (g, want) in enumerate(zip(got, wants, strict=True)):
        label = f"{CMR_CASES[i // 2]} {('forward', 'pullback')[i % 2]}"
        check(label, g, want, "float64")


def test_cross_map_norm_second_order():
    rng = np.random.default_rng(12)
    x = pt.tensor4("x")
    y = cc2ops.cross_map_norm(x, size=4, alpha=0.5, layout="c01b")
    gx = pytensor.grad((y**2).sum(), x)
    second = pytensor.grad((gx**2).sum(), x)
    fn = numba_function([x], [y, gx, second])
    ref = pytensor.function([x], [y, gx, second], mode=cc2ops.mode)
    xv = rng.standard_normal((6, 3, 2, 2))
    names = ["forward", "grad", "second"]
    for name, got, want in zip(names, run(fn, xv), ref(xv), strict=True):
        check(name, got, want, "float64")


# --------------------------------------------------------------------------
# softmax loss and top-k error
# --------------------------------------------------------------------------

LABEL_DTYPES = ["int8", "int16", "int32", "int64"] + [
    "uint8",
    "uint16",
    "uint32",
    "uint64",
]


def test_softmax_loss_labels_of_every_int_dtype():
    """One loss per label dtype in one function; each dtype's bad labels raise."""
    rng = np.random.default_rng(2)
    x = pt.matrix("x")
    ys = [pt.vector(f"y_{d}", dtype=d) for d in LABEL_DTYPES]
    fn = numba_function([x, *ys], [cc2ops.softmax_cross_entropy(x, y) for y in ys])
    xv = rng.standard_normal((5, 4))
    good = [np.array([0, 3, 1, 2, 3], dtype=d) for d in LABEL_DTYPES]
    want = softmax_cross_entropy_reference(xv, good[0])
    for d, got in zip(LABEL_DTYPES, run(fn, xv, *good), strict=True):
        check(f"loss with {d} labels", got, want, "float64")
    for i, d in enumerate(LABEL_DTYPES):
        for value in (4, -1) if np.dtype(d).kind == "i" else (4,):
            labels = list(good)
            labels[i] = good[i].copy()
            labels[i][2] = value
            with pytest.raises(
                ValueError,
                match=r"SoftmaxCrossEntropy: labels must be in \[0, K\) = \[0, 4\), "
                f"got {value} at row 2",
            ):
                run(fn, xv, *labels)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_softmax_loss_family(dtype):
    """Loss, gradient and top-k with labels and soft targets; second order."""
    rng = np.random.default_rng(4)
    x, y = pt.matrix("x", dtype=dtype), pt.ivector("y")
    t, g = pt.matrix("t", dtype=dtype), pt.vector("g", dtype=dtype)
    hard = cc2ops.softmax_cross_entropy(x, y)
    soft = cc2ops.softmax_cross_entropy(x, t)
    err = cc2ops.top_k_error(x, y, k=2)
    dx_hard = pytensor.grad((hard * g).sum(), x)
    dx_soft, dt = pytensor.grad((soft * g).sum(), [x, t])
    second = pytensor.grad((dx_hard**2).sum() + (dx_soft**2).sum(), [x, g])
    outs = [hard, soft, err, dx_hard, dx_soft, dt, *second]
    fn = numba_function([x, y, t, g], outs)
    xv = (3 * rng.standard_normal((7, 5))).astype(dtype)
    xv[0] = 1e4  # stable for large logits, and a row of ties for top-k
    yv = rng.integers(0, 5, 7).astype("int32")
    tv = rng.dirichlet(np.ones(5), 7).astype(dtype)
    gv = rng.standard_normal(7).astype(dtype)
    got = run(fn, xv, yv, tv, gv)
    want = [
        softmax_cross_entropy_reference(xv, yv),
        softmax_cross_entropy_reference(xv, tv),
        top_k_error_reference(xv, yv, 2),
        softmax_cross_entropy_grad_reference(gv, xv, yv),
        softmax_cross_entropy_grad_reference(gv, xv, tv),
    ]
    names = ["loss labels", "loss soft", "top-2 error", "grad labels", "grad soft"]
    for name, a, b in zip(names, got, want, strict=False):
        check(name, a, b, dtype)
    ref = pytensor.function([x, y, t, g], outs, mode=cc2ops.mode)(xv, yv, tv, gv)
    for name, a, b in zip(
        ["grad t", "second x", "second g"], got[5:], ref[5:], strict=True
    ):
        check(name, a, b, dtype)
    bad = yv.copy()
    bad[6] = 5
    with pytest.raises(ValueError, match=r"labels must be in \[0, K\) = \[0, 5\)"):
        run(fn, xv, bad, tv, gv)


def test_float32_exp_rule_against_float64_exp():
    """The vectorisable float32 exp of the softmax kernels: relative error
    below 3.1e-7 wherever exp is a normal float32, 0 below, inf above, NaN
    for NaN, and float64 goes to libm's exp."""
    numba = pytest.importorskip("numba")
    from cc2ops.backends import numba as backend

    @numba.njit
    def exp(t):
        e = np.empty_like(t)
        backend._exp_into(t, e, np.empty((2, t.shape[0]), np.int32))
        return e

    grid = np.linspace(-87.3, 88.7, 1_000_003, dtype=np.float32)
    want = np.exp(grid.astype(np.float64))
    rel = np.abs(exp(grid) / want - 1)
    assert rel.max() < 3.1e-7, rel.max()
    special = np.array([np.nan, -np.inf, np.inf, -88.0, 89.0, 0.0], np.float32)
    got = exp(special)
    assert np.isnan(got[0]) and got[1] == 0 and got[2] == np.inf
    assert got[3] == 0 and got[4] == np.inf and got[5] == 1
    t64 = np.linspace(-700, 700, 1001)
    np.testing.assert_allclose(exp(t64), np.exp(t64), rtol=1e-15)  # libm's exp


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_loss_rows_with_nan_inf_and_underflow(dtype):
    """Rows the kernels must not get wrong: a NaN (the row's loss and
    gradient are NaN), -inf logits (probability 0; inf loss at the label),
    logits 200 apart (exp underflows) and a wide row (K = 1003: the blocked
    maximum's tail)."""
    rng = np.random.default_rng(8)
    x, y, g = pt.matrix("x", dtype=dtype), pt.ivector("y"), pt.vector("g", dtype=dtype)
    loss = cc2ops.softmax_cross_entropy(x, y)
    dx = pytensor.grad((loss * g).sum(), x)
    fn = numba_function([x, y, g], [loss, dx])
    xv = rng.standard_normal((6, 1003)).astype(dtype)
    xv[0, 500] = np.nan
    xv[1, :3] = -np.inf
    xv[2, 7] = -np.inf
    xv[3, ::2] -= 200
    xv[4, 1002] = 40  # the maximum in the tail past the last full block
    yv = np.array([1, 5, 7, 2, 1002, 0], "int32")
    gv = rng.standard_normal(6).astype(dtype)
    got_loss, got_dx = run(fn, xv, yv, gv)
    with np.errstate(invalid="ignore"):
        want_loss = softmax_cross_entropy_reference(xv, yv)
        want_dx = softmax_cross_entropy_grad_reference(gv, xv, yv)
    assert np.isnan(got_loss[0]) and np.isnan(got_dx[0]).all()
    assert got_loss[2] == np.inf
    np.testing.assert_array_equal(np.isnan(got_dx), np.isnan(want_dx))
    np.testing.assert_array_equal(np.isinf(got_loss), np.isinf(want_loss))
    finite = np.isfinite(want_loss)
    check("finite losses", got_loss[finite], want_loss[finite], dtype)
    check("gradient rows 1-5", got_dx[1:], want_dx[1:], dtype)


# --------------------------------------------------------------------------
# dropout
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, p, dtype, counter",
    [
        ((5, 7), 0.3, "float64", (0, 0)),
        ((2, 3, 3, 5), 0.5, "float32", (0xFFFFFFFE, 7)),  # counter_lo carries
        ((1, 1, 1, 1), 0.9, "float32", (0xFFFFFFFF, 0xFFFFFFFF)),  # 2**64 wraps
    ],
    ids=str,
)
def test_dropout_masks_equal_the_reference(shape, p, dtype, counter):
    rng = np.random.default_rng(6)
    state = cc2ops.dropout_state(0x1234_5678_9ABC_DEF0)
    value = state.get_value()
    value[2:] = counter
    state.set_value(value)
    x = pt.tensor(dtype=dtype, shape=(None,) * len(shape), name="x")
    gy = pt.tensor(dtype=dtype, shape=(None,) * len(shape), name="gy")
    y = cc2ops.dropout(x, p, state)
    gx = pytensor.grad((y * gy).sum(), x)
    fn = numba_function([x, gy], [y, gx])
    xv = rng.standard_normal(shape).astype(dtype)
    gyv = rng.standard_normal(shape).astype(dtype)
    n = xv.size
    for _ in range(2):  # the second call draws from the advanced counter
        before = state.get_value()
        yv, gxv = run(fn, xv, gyv)
        mask = dropout_mask_reference(before, n, p).reshape(shape)
        scale = dropout_scale(p, dtype)
        np.testing.assert_array_equal(yv, np.where(mask, xv * scale, 0).astype(dtype))
        np.testing.assert_array_equal(gxv, np.where(mask, gyv * scale, 0).astype(dtype))
        np.testing.assert_array_equal(state.get_value(), advance_state(before, n))


# --------------------------------------------------------------------------
# whole graphs: the README's worked example, cacheability
# --------------------------------------------------------------------------


def _readme_step():
    rng = np.random.default_rng(0)
    x = pt.tensor4("x", dtype="float32")
    y = pt.ivector("y")

    def param(shape, name):
        return pytensor.shared(
            (0.05 * rng.standard_normal(shape)).astype("float32"), name
        )

    w1, w2 = param((32, 3, 5, 5), "w1"), param((64, 32, 5, 5), "w2")
    w3 = param((64 * 4 * 4, 10), "w3")
    h = pt.maximum(cc2ops.conv2d(x, w1, padding=2), 0)
    h = cc2ops.max_pool2d(h, 3, stride=2)
    h = cc2ops.cross_map_norm(h, size=5, alpha=1e-4, beta=0.75, k=2.0)
    h = pt.maximum(cc2ops.conv2d(h, w2, padding=2), 0)
    h = cc2ops.avg_pool2d(h, 3, stride=2)
    h = cc2ops.max_pool2d(h, 2)
    logits = h.flatten(2) @ w3
    loss = cc2ops.softmax_cross_entropy(logits, y).mean()
    err = cc2ops.top_k_error(logits, y, k=1).mean()
    params = [w1, w2, w3]
    grads = pytensor.grad(loss, params)
    return [x, y], [loss, err, *grads]


def test_readme_example_in_the_default_mode():
    inputs, outputs = _readme_step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = pytensor.function(inputs, outputs)  # no mode: PyTensor's default
        rng = np.random.default_rng(1)
        images = rng.standard_normal((3, 3, 32, 32)).astype("float32")
        labels = rng.integers(0, 10, 3).astype("int32")
        got = fn(images, labels)
    object_mode = [str(w.message) for w in caught if OBJECT_MODE in str(w.message)]
    assert object_mode == []
    want = pytensor.function(inputs, outputs, mode=cc2ops.mode)(images, labels)
    names = ["loss", "error", "grad w1", "grad w2", "grad w3"]
    for name, a, b in zip(names, got, want, strict=True):
        check(name, a, b, "float32")
    # every node of the compiled graph has a cache key, so the graph is cacheable
    fgraph = fn.maker.fgraph
    cc2_nodes = [
        n for n in fgraph.toposort() if type(n.op).__module__.startswith("cc2ops")
    ]
    assert {type(n.op).__name__ for n in cc2_nodes} >= {
        "FilterActs",
        "ImageActs",
        "WeightActs",
        "MaxPool",
        "MaxPoolGrad",
        "AvgPool",
        "AvgPoolGrad",
        "CrossMapNorm",
        "CrossMapNormGrad",
        "SoftmaxCrossEntropy",
        "SoftmaxCrossEntropyGrad",
        "TopKError",
    }
    for node in cc2_nodes:
        _, key = numba_funcify_and_cache_key(node.op, node=node)
        assert key is not None, f"{node.op} has no cache key"
    _, graph_key = numba_funcify_and_cache_key(fgraph)
    assert graph_key is not None


def test_dropout_graph_is_cacheable():
    state = cc2ops.dropout_state(1)
    x = pt.matrix("x")
    fn = numba_function([x], cc2ops.dropout(x, 0.5, state))
    kinds = set()
    for node in fn.maker.fgraph.toposort():
        if type(node.op).__module__.startswith("cc2ops"):
            kinds.add(type(node.op).__name__)
            assert numba_funcify_and_cache_key(node.op, node=node)[1] is not None
    assert kinds == {"Dropout", "DropoutAdvance"}


def test_parallel_kernels_link_in_a_fresh_process(tmp_path):
    """A graph of cc2ops's parallel kernels links in a first and a second session.

    Numba starts its threading layer (which registers the scheduler symbols)
    when it lowers a ``parallel=True`` function; a graph function that only
    links cached parallel kernels needs it started too, or LLVM aborts the
    process ("Symbol not found: allocate_sched", seen once on this project's
    CPU machine when the PyMC example's test ran on its own).
    ``cc2ops.backends.numba`` starts the threads at import. This test runs
    the example's log density in two fresh interpreters sharing fresh caches
    (the second one loads what the first compiled); it did not reproduce the
    abort on demand, so it guards the path, not the exact trigger.
    """
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys; sys.path.insert(0, 'examples/pymc_digits')\n"
        "import numpy as np, model\n"
        "X, y, _, _ = model.load_data(100, 10, 0)\n"
        "theta = np.random.default_rng(3).normal(scale=0.3, size=model.n_params())\n"
        "f = model.log_density_function(X, y, mode='FAST_RUN')\n"
        "print(float(f(theta)[0]))\n"
    )
    env = dict(
        os.environ,
        PYTHONPATH=str(root),
        PYTENSOR_FLAGS=f"base_compiledir={tmp_path / 'pytensor'}",
        NUMBA_CACHE_DIR=str(tmp_path / "numba"),
    )
    for session in ("first", "second"):
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, f"{session} process: {proc.stderr[-3000:]}"
        assert np.isfinite(float(proc.stdout.strip().splitlines()[-1]))
