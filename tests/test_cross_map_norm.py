"""Cross-map response normalisation: forward, gradient, second derivatives.

The references here are written independently of :mod:`cc2ops.cross_map_norm`:
explicit per-channel loops with window bounds computed in this file, a
hand-computed example, and PyTorch's documented ``local_response_norm``
formula written out in numpy.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import TEST_MODE, check_op, expect_error, rng
from pytensor.compile.mode import Mode, get_mode
from pytensor.graph.traversal import io_toposort

import cc2ops
from cc2ops.cross_map_norm import (
    CrossMapNorm,
    CrossMapNormGrad,
    cross_map_norm,
    cross_map_norm_grad_reference,
    cross_map_norm_reference,
)

# --------------------------------------------------------------------------
# independent references
# --------------------------------------------------------------------------


def naive_window(c: int, channels: int, size: int, blocked: bool) -> range:
    """Channels whose squares normalise channel ``c``."""
    if blocked:
        start = size * (c // size)
        return range(start, min(start + size, channels))
    return range(max(c - size // 2, 0), min(c + (size - 1) // 2 + 1, channels))


def naive_denominators(x, size, alpha, k, blocked):
    x = x.astype(np.float64)
    d = np.empty_like(x)
    for c in range(x.shape[1]):
        acc = np.zeros_like(x[:, 0])
        for cc in naive_window(c, x.shape[1], size, blocked):
            acc += x[:, cc] ** 2
        d[:, c] = k + alpha / size * acc
    return d


def naive_norm(x, size, alpha, beta, k, blocked=False):
    """bc01 forward, float64 arithmetic, result in ``x``'s dtype."""
    d = naive_denominators(x, size, alpha, k, blocked)
    return (x.astype(np.float64) / d**beta).astype(x.dtype)


def naive_grad(x, gy, size, alpha, beta, k, blocked=False):
    """bc01 gradient: direct sum over every (c, j) pair with j in W(c)."""
    d = naive_denominators(x, size, alpha, k, blocked)
    x64, g64 = x.astype(np.float64), gy.astype(np.float64)
    channels = x.shape[1]
    gx = g64 * d**-beta
    for c in range(channels):
        for j in naive_window(c, channels, size, blocked):
            # y_c depends on x_j through d_c
            gx[:, j] -= (
                2
                * alpha
                * beta
                / size
                * x64[:, j]
                * g64[:, c]
                * x64[:, c]
                * d[:, c] ** (-beta - 1)
            )
    return gx.astype(x.dtype)


def torch_lrn(x, size, alpha, beta, k):
    """PyTorch's documented local_response_norm, written out in numpy.

    ``div = x**2`` zero-padded along the channels by ``size//2`` before and
    ``(size-1)//2`` after, average-pooled over ``size`` channels with stride 1
    (zeros counted), then ``div = (k + alpha * div)**beta`` and ``y = x / div``.
    """
    x64 = x.astype(np.float64)
    b, c, h, w = x.shape
    padded = np.zeros((b, c + size - 1, h, w))
    padded[:, size // 2 : size // 2 + c] = x64**2
    avg = np.stack([padded[:, i : i + size].mean(axis=1) for i in range(c)], axis=1)
    return (x64 / (k + alpha * avg) ** beta).astype(x.dtype)


def to_c01b(a):
    return np.ascontiguousarray(a.transpose(1, 2, 3, 0))


def to_bc01(a):
    return np.ascontiguousarray(a.transpose(3, 0, 1, 2))


def images(shape, seed, dtype="float64", scale=1.5):
    return (scale * rng(seed).standard_normal(shape)).astype(dtype)


# --------------------------------------------------------------------------
# hand-computed examples
# --------------------------------------------------------------------------

# x = [1, 2, 3] over three channels, alpha/size = 1, beta = 1, k = 1:
# y_c = x_c / (1 + sum of the squares in the window)
HAND = [
    # size 3: windows {0,1}, {0,1,2}, {1,2}
    (3, 3.0, False, [1 / 6, 2 / 15, 3 / 14]),
    # size 2 (even: one channel back, none forward): {0}, {0,1}, {1,2}
    (2, 2.0, False, [1 / 2, 2 / 6, 3 / 14]),
    # blocked size 2: groups {0,1}, {2}
    (2, 2.0, True, [1 / 6, 2 / 6, 3 / 10]),
]


@pytest.mark.parametrize("size, alpha, blocked, want", HAND)
def test_hand_example(size, alpha, blocked, want):
    x = np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1, 1)
    v = pt.tensor4("x")
    fn = pytensor.function(
        [v], cross_map_norm(v, size, alpha, 1.0, 1.0, blocked), mode=TEST_MODE
    )
    np.testing.assert_allclose(fn(x).ravel(), want, rtol=1e-14)
    np.testing.assert_allclose(
        cross_map_norm_reference(x, size, alpha, 1.0, 1.0, blocked).ravel(),
        want,
        rtol=1e-14,
    )


def test_hand_gradient():
    # two channels, size 2, alpha/size = 1, beta = 1, k = 1, x = [1, 2]:
    # d0 = 1 + x0^2 = 2, d1 = 1 + x0^2 + x1^2 = 6, y0 = x0/d0, y1 = x1/d1
    # d(y0 + y1)/dx0 = 1/d0 - 2 x0^2/d0^2 - 2 x0 x1/d1^2 = 1/2 - 1/2 - 1/9
    # d(y0 + y1)/dx1 = 1/d1 - 2 x1^2/d1^2 = 1/6 - 8/36
    x = np.array([1.0, 2.0]).reshape(1, 2, 1, 1)
    v = pt.tensor4("x")
    g = pytensor.grad(cross_map_norm(v, 2, 2.0, 1.0, 1.0).sum(), v)
    got = pytensor.function([v], g, mode=TEST_MODE)(x).ravel()
    np.testing.assert_allclose(got, [-1 / 9, -1 / 18], rtol=1e-14)
    ref = cross_map_norm_grad_reference(x, np.ones_like(x), 2, 2.0, 1.0, 1.0)
    np.testing.assert_allclose(ref.ravel(), [-1 / 9, -1 / 18], rtol=1e-14)


def test_alpha_zero_divides_by_k_power():
    x = images((2, 4, 3, 3), 7)
    v = pt.tensor4("x")
    fn = pytensor.function([v], cross_map_norm(v, 3, 0.0, 0.6, 1.7), mode=TEST_MODE)
    np.testing.assert_allclose(fn(x), x / 1.7**0.6, rtol=1e-14)


# --------------------------------------------------------------------------
# PyTorch's formula (unblocked)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_matches_torch_local_response_norm_formula(dtype):
    v = pt.tensor4("x", dtype=dtype)
    tol = dict(rtol=1e-12, atol=0) if dtype == "float64" else dict(rtol=2e-6, atol=0)
    for size, channels in itertools.product((1, 2, 3, 4, 5, 7), (1, 3, 4, 8)):
        alpha, beta, k = 1.3, 0.75, 0.8
        x = images((3, channels, 2, 5), 100 * size + channels, dtype)
        fn = pytensor.function(
            [v], cross_map_norm(v, size, alpha, beta, k), mode=TEST_MODE
        )
        np.testing.assert_allclose(
            fn(x),
            torch_lrn(x, size, alpha, beta, k),
            **tol,
            err_msg=f"size {size} channels {channels}",
        )


# --------------------------------------------------------------------------
# forward sweeps
# --------------------------------------------------------------------------

SIZES = (1, 2, 3, 4, 5, 7)
CHANNELS = (1, 3, 5, 64)
BATCHES = (1, 3, 129)
SPATIAL = ((1, 1), (2, 3), (5, 2), (3, 7))
PARAMS = ((0.5, 0.75, 2.0), (2.0, 0.5, 1.0), (7.0, 1.3, 0.5))


def _forward_cases():
    for i, (size, blocked, channels) in enumerate(
        itertools.product(SIZES, (False, True), CHANNELS)
    ):
        batch = BATCHES[i % 3]
        layout = ("bc01", "c01b")[(i // 3) % 2]
        dtype = ("float64", "float32")[(i // 6) % 2]
        h, w = SPATIAL[i % 4] if channels < 64 else SPATIAL[(i % 2) + 1]
        alpha, beta, k = PARAMS[i % 3]
        yield pytest.param(
            (batch, channels, h, w),
            size,
            alpha,
            beta,
            k,
            blocked,
            layout,
            dtype,
            id=f"b{batch}-c{channels}-{h}x{w}-s{size}-{'blk' if blocked else 'win'}"
            f"-{layout}-{dtype}",
        )


@pytest.mark.parametrize(
    "shape, size, alpha, beta, k, blocked, layout, dtype", list(_forward_cases())
)
def test_forward_sweep(shape, size, alpha, beta, k, blocked, layout, dtype):
    x = images(shape, 1000 * size + 10 * shape[1] + shape[0] + blocked, dtype)
    if layout == "bc01":
        inp, ref = x, lambda a: naive_norm(a, size, alpha, beta, k, blocked)
    else:
        inp = to_c01b(x)

        def ref(a):
            return to_c01b(naive_norm(to_bc01(a), size, alpha, beta, k, blocked))

    check_op(
        lambda v: cross_map_norm(v, size, alpha, beta, k, blocked, layout),
        [inp],
        ref,
        label=f"cross_map_norm {shape} size {size} blocked {blocked} {layout}",
        names=["x"],
        wrt=(),
        op_class=CrossMapNorm,
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("blocked", [False, True])
def test_references_match_naive(dtype, blocked):
    # the module's references are what the GPU tests compare against
    for size, channels in itertools.product(SIZES, (1, 2, 6, 13, 64)):
        x = images((3, channels, 2, 3), size * channels, dtype)
        gy = images((3, channels, 2, 3), size * channels + 1, dtype)
        params = (size, 1.7, 0.8, 1.2, blocked)
        y = cross_map_norm_reference(x, *params)
        gx = cross_map_norm_grad_reference(x, gy, *params)
        assert y.dtype == x.dtype and gx.dtype == x.dtype
        tol = (
            dict(rtol=1e-12, atol=1e-14)
            if dtype == "float64"
            else dict(rtol=2e-5, atol=2e-6)
        )
        msg = f"size {size} channels {channels}"
        np.testing.assert_allclose(y, naive_norm(x, *params), err_msg=msg, **tol)
        np.testing.assert_allclose(gx, naive_grad(x, gy, *params), err_msg=msg, **tol)


def test_empty_batch():
    x = np.zeros((0, 3, 2, 2))
    v = pt.tensor4("x")
    assert pytensor.function([v], cross_map_norm(v, 3), mode=TEST_MODE)(x).shape == (
        0,
        3,
        2,
        2,
    )


# --------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------

GRAD_CASES = [
    # (shape bc01, size, blocked, layout, dtype)
    ((2, 5, 2, 3), 5, False, "bc01", "float64"),
    ((1, 4, 3, 2), 2, False, "bc01", "float64"),
    ((3, 6, 1, 2), 4, False, "c01b", "float64"),
    ((2, 3, 2, 2), 7, False, "bc01", "float64"),  # size > C
    ((2, 1, 3, 2), 3, False, "bc01", "float64"),  # C = 1
    ((1, 5, 2, 2), 1, False, "c01b", "float64"),
    ((2, 7, 2, 1), 3, True, "bc01", "float64"),  # C not a multiple of size
    ((1, 5, 2, 3), 2, True, "c01b", "float64"),
    ((2, 3, 2, 2), 5, True, "bc01", "float64"),  # one partial group
    ((2, 6, 2, 3), 4, False, "bc01", "float32"),
    ((2, 5, 2, 2), 3, True, "c01b", "float32"),
]


@pytest.mark.parametrize("shape, size, blocked, layout, dtype", GRAD_CASES)
def test_gradient(shape, size, blocked, layout, dtype):
    alpha, beta, k = 2.5, 0.75, 1.0
    x = images(shape, size + shape[1], dtype)
    if layout == "bc01":
        inp, ref = x, lambda a: naive_norm(a, size, alpha, beta, k, blocked)
    else:
        inp = to_c01b(x)

        def ref(a):
            return to_c01b(naive_norm(to_bc01(a), size, alpha, beta, k, blocked))

    check_op(
        lambda v: cross_map_norm(v, size, alpha, beta, k, blocked, layout),
        [inp],
        ref,
        label=f"cross_map_norm grad {shape} size {size} blocked {blocked} {layout}",
        names=["x"],
        op_class=CrossMapNorm,
    )


GRAD_OP_CASES = [
    # (shape, size, blocked, dtype): both inputs of CrossMapNormGrad
    ((2, 5, 2, 2), 3, False, "float64"),
    ((1, 6, 2, 3), 2, False, "float64"),
    ((2, 5, 1, 3), 4, False, "float64"),
    ((2, 4, 2, 2), 7, False, "float64"),
    ((2, 1, 2, 2), 2, False, "float64"),
    ((1, 7, 2, 2), 3, True, "float64"),
    ((2, 5, 2, 1), 2, True, "float64"),
    ((1, 5, 2, 2), 4, False, "float32"),
]


@pytest.mark.parametrize("shape, size, blocked, dtype", GRAD_OP_CASES)
def test_grad_op_and_second_derivatives(shape, size, blocked, dtype):
    alpha, beta, k = 3.0, 0.75, 1.0
    x = images(shape, 31 * size + shape[1], dtype)
    gy = images(shape, 31 * size + shape[1] + 1, dtype, scale=1.0)
    op = CrossMapNormGrad(size=size, alpha=alpha, beta=beta, k=k, blocked=blocked)
    check_op(
        op,
        [x, gy],
        lambda a, g: naive_grad(a, g, size, alpha, beta, k, blocked),
        label=f"CrossMapNormGrad {shape} size {size} blocked {blocked}",
        names=["x", "gy"],
    )


def test_second_derivative_through_builder():
    # d/dx of <w, d cross_map_norm(x)/dx . u>: a Hessian-vector product
    shape, size, alpha, beta, k = (2, 6, 2, 2), 4, 3.0, 0.75, 1.0
    x = images(shape, 3)
    w = pt.constant(images(shape, 4, scale=1.0))

    def build(v):
        return pytensor.grad((cross_map_norm(v, size, alpha, beta, k) * w).sum(), v)

    check_op(
        build,
        [x],
        lambda a: naive_grad(a, w.data, size, alpha, beta, k),
        label="grad of cross_map_norm",
        names=["x"],
        op_class=CrossMapNormGrad,
    )


@pytest.mark.parametrize("size, blocked", [(2, False), (4, False), (3, True)])
def test_hessian_is_symmetric(size, blocked):
    # f = <w, y> + <y, y>: its gradient is CrossMapNormGrad(x, w + 2y), whose
    # gy itself depends on x. The Hessian of a scalar must be symmetric (a
    # transposed window for even sizes breaks that) and match finite
    # differences of the independent gradient.
    n, params = 5, (size, 3.0, 0.75, 1.0, blocked)
    x = images((1, n, 1, 1), size)
    w = images((1, n, 1, 1), size + 1, scale=1.0)
    v = pt.tensor4("x")
    y = cross_map_norm(v, *params)
    g = pytensor.grad((y * w).sum() + (y**2).sum(), v).flatten()
    hess = pt.stack([pytensor.grad(g[r], v).flatten() for r in range(n)])
    h = pytensor.function([v], hess, mode=TEST_MODE)(x)
    np.testing.assert_allclose(h, h.T, rtol=1e-12, atol=1e-14)

    def grad_at(a):
        return naive_grad(a, w + 2 * naive_norm(a, *params), *params).ravel()

    eps = 1e-6
    fd = np.empty((n, n))
    for col in range(n):
        step = np.zeros(n)
        step[col] = eps
        step = step.reshape(x.shape)
        fd[:, col] = (grad_at(x + step) - grad_at(x - step)) / (2 * eps)
    np.testing.assert_allclose(h, fd, rtol=1e-6, atol=1e-8)


def _fd_jvp(f, x, u, eps=1e-4):
    """The directional derivative of ``f`` at ``x`` along ``u``.

    Fourth-order central differences: the error is O(eps**4) plus rounding
    of about 1e-12 relative, well inside the tests' 1e-6.
    """
    near = f(x + eps * u) - f(x - eps * u)
    far = f(x + 2 * eps * u) - f(x - 2 * eps * u)
    return (8 * near - far) / (12 * eps)


def _fd_vjp(f, x, u):
    """``d/dx <u, f(x)>``, one entry of ``x`` at a time (:func:`_fd_jvp`)."""
    out = np.empty(x.size)
    for i in range(x.size):
        unit = np.zeros(x.size)
        unit[i] = 1.0
        out[i] = (u * _fd_jvp(f, x, unit.reshape(x.shape))).sum()
    return out.reshape(x.shape)


#: (size, blocked, layout, beta): size 1, odd and even windows (padding before
#: only, or on both sides), groups that do and do not divide C, both layouts.
#: alpha = size, so alpha/size = 1 and the rewrites drop the scale: that is
#: what exposed `k + set_subtensor(zeros, x**2)` to the bad rewrite (issue
#: 20's crash, blocked size 1); other alphas are covered with unknown shapes
#: by test_grad_op_and_second_derivatives.
SECOND_DERIVATIVE_CASES = [
    (size, blocked, ("bc01", "c01b")[(size + blocked) % 2], (0.75, 1.0)[size % 2])
    for size in (1, 2, 3, 4)
    for blocked in (False, True)
]


def _second_derivative_graph(cases, x, gy, u):
    """``[y, gx, d<u, gx>/dx, d<u, gx>/dgy]`` for every case, ``gx`` the gradient
    of ``<gy, y>`` (a ``CrossMapNormGrad`` node whose pullback is under test)."""
    outputs = []
    for size, blocked, layout, beta in cases:
        y = cross_map_norm(x, size, float(size), beta, 1.0, blocked, layout)
        g = pytensor.grad((y * gy).sum(), x)
        outputs += [y, g, *pytensor.grad((g * u).sum(), [x, gy])]
    return outputs


def _check_second_derivatives(fn, cases, label, rtol=1e-6):
    """Run ``fn`` (compiled from :func:`_second_derivative_graph`) on several
    channel counts, C = 1, C < size, C not a multiple of size, and compare with
    finite differences of the naive references."""
    names = ("y", "gx", "d2 wrt x", "d2 wrt gy")
    for channels in (1, 3, 4, 7):
        shape = (2, channels, 2, 1)
        xv, gv, uv = (images(shape, 10 * channels + i, scale=1.0) for i in range(3))
        got_bc01 = fn(xv, gv, uv)
        got_c01b = [to_bc01(a) for a in fn(to_c01b(xv), to_c01b(gv), to_c01b(uv))]
        for i, (size, blocked, layout, beta) in enumerate(cases):
            params = (size, float(size), beta, 1.0, blocked)
            got = (got_bc01 if layout == "bc01" else got_c01b)[4 * i : 4 * i + 4]
            want = [
                naive_norm(xv, *params),
                naive_grad(xv, gv, *params),
                # <u, G(x, gy)>: nonlinear in x; linear in gy, its gy-gradient
                # is the forward's Jacobian applied to u
                _fd_vjp(lambda a, p=params, g=gv: naive_grad(a, g, *p), xv, uv),
                _fd_jvp(lambda a, p=params: naive_norm(a, *p), xv, uv),
            ]
            for name, a, b in zip(names, got, want, strict=True):
                np.testing.assert_allclose(
                    a,
                    b,
                    rtol=rtol,
                    atol=1e-8,
                    err_msg=f"{label}: size {size} blocked {blocked} {layout} "
                    f"beta {beta} C={channels}: {name}",
                )


@pytest.mark.parametrize(
    "mode_name, mode",
    [
        ("FAST_COMPILE", get_mode("FAST_COMPILE")),
        ("py linker", Mode(linker="py", optimizer="fast_run")),
    ],
)
def test_second_derivatives_with_unknown_shapes(mode_name, mode):
    # Issue 20: with shapes unknown when the graph is built, the symbolic
    # forward that CrossMapNormGrad differentiates must survive every mode's
    # rewrites (a set_subtensor into zeros added to k did not, for blocked
    # size 1). Both pullbacks of CrossMapNormGrad (wrt x and wrt gy) of every
    # parameter set, fed several channel counts through one compiled function.
    # The py linker runs fast_run, the rewrites of cc2ops.mode; one function
    # per parameter set there (a single fused graph of all of them trips
    # PyTensor 3.0's Python Elemwise, which cannot run more than 32 operands).
    x, gy, u = (pt.tensor4(n) for n in ("x", "gy", "u"))
    if mode_name == "FAST_COMPILE":
        groups = [SECOND_DERIVATIVE_CASES]
    else:
        groups = [[case] for case in SECOND_DERIVATIVE_CASES]
    for cases in groups:
        outputs = _second_derivative_graph(cases, x, gy, u)
        fn = pytensor.function([x, gy, u], outputs, mode=mode)
        # PyTensor 3.0.7's Python implementation of a multi-output fused
        # Composite (py linker + fast_run) is off by up to ~2e-6 relative on
        # these graphs; the same graph unfused, or run as C, agrees with the
        # differences to 1e-12
        rtol = 1e-5 if mode_name == "py linker" else 1e-6
        _check_second_derivatives(fn, cases, mode_name, rtol)


def test_second_derivatives_in_cc2ops_mode():
    # The same in cc2ops.mode (C linker) for the crash (blocked size
    # 1) and an even window: compiling every parameter set's C code would
    # cost minutes, and the rewrites are those the py-linker test runs.
    cases = [(1, True, "bc01", 1.0), (2, False, "c01b", 0.75)]
    x, gy, u = (pt.tensor4(n) for n in ("x", "gy", "u"))
    fn = pytensor.function(
        [x, gy, u], _second_derivative_graph(cases, x, gy, u), mode=cc2ops.mode
    )
    _check_second_derivatives(fn, cases, "cc2ops.mode")


def test_pullback_is_the_grad_op():
    v = pt.tensor4("x")
    g = pytensor.grad(cross_map_norm(v, 4, 1.0, 0.5, 1.5, True).sum(), v)
    ops = [n.op for n in io_toposort([v], [g])]
    grads = [o for o in ops if isinstance(o, CrossMapNormGrad)]
    assert grads == [CrossMapNormGrad(size=4, alpha=1.0, beta=0.5, k=1.5, blocked=True)]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_second_derivative_with_gy_depending_on_x(dtype):
    # grad of sum(y**2) is CrossMapNormGrad(x, 2y(x)): its pullback must not
    # follow gy back to x itself (the outer chain rule does that)
    size, alpha, beta, k = 3, 2.0, 0.75, 2.0
    x = images((1, 4, 2, 2), 9, dtype)

    def build(v):
        return pytensor.grad((cross_map_norm(v, size, alpha, beta, k) ** 2).sum(), v)

    def ref(a):
        y = naive_norm(a, size, alpha, beta, k).astype(np.float64)
        return naive_grad(a, (2 * y).astype(a.dtype), size, alpha, beta, k)

    got = check_op(
        build,
        [x],
        ref,
        label=f"grad of sum(y**2) {dtype}",
        names=["x"],
        op_class=(CrossMapNorm, CrossMapNormGrad),
    )
    assert got.dtype == dtype
    v = pt.tensor4("x", dtype=dtype)
    gg = pytensor.grad(build(v).sum(), v)
    assert gg.dtype == dtype


# --------------------------------------------------------------------------
# static shapes, props
# --------------------------------------------------------------------------


def test_static_shapes_pass_through():
    x = pt.tensor("x", dtype="float32", shape=(2, 3, 4, 5))
    assert cross_map_norm(x).type.shape == (2, 3, 4, 5)
    assert cross_map_norm(x, layout="c01b").type.shape == (2, 3, 4, 5)
    xc = pt.tensor("x", dtype="float64", shape=(3, None, 5, 2))
    y = cross_map_norm(xc, layout="c01b")
    assert y.type.shape == (3, None, 5, 2) and y.owner.inputs[0].type.shape == (
        2,
        3,
        None,
        5,
    )
    a = pt.tensor("a", dtype="float64", shape=(2, None, None, 5))
    b = pt.tensor("b", dtype="float64", shape=(None, 3, 4, None))
    assert CrossMapNormGrad()(a, b).type.shape == (2, 3, 4, 5)


def test_props_equality_and_keyword_only():
    a = CrossMapNorm(size=3, alpha=1, beta=0.5, k=2, blocked=False)
    b = CrossMapNorm(size=np.int64(3), alpha=1.0, beta=0.5, k=2.0)
    assert a == b and hash(a) == hash(b)
    assert isinstance(a.alpha, float) and isinstance(a.size, int)
    for change in (
        dict(size=4),
        dict(alpha=2.0),
        dict(beta=0.6),
        dict(k=1.5),
        dict(blocked=True),
    ):
        params = dict(size=3, alpha=1.0, beta=0.5, k=2.0, blocked=False) | change
        assert CrossMapNorm(**params) != a, change
    assert CrossMapNorm() != CrossMapNormGrad()
    assert CrossMapNorm.__props__ == ("size", "alpha", "beta", "k", "blocked")
    assert CrossMapNormGrad.__props__ == CrossMapNorm.__props__
    with pytest.raises(TypeError):
        CrossMapNorm(3)  # keyword-only


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------


def test_bad_ndim_and_dtype():
    cases = [
        (
            lambda: cross_map_norm(pt.tensor3("x")),
            r"CrossMapNorm: x must have 4 dims \(B, C, H, W\), got 3",
        ),
        (
            lambda: cross_map_norm(pt.tensor5("x"), layout="c01b"),
            r"CrossMapNorm: x must have 4 dims \(C, H, W, B\), got 5",
        ),
        (
            lambda: cross_map_norm(pt.itensor4("x")),
            "CrossMapNorm: x must be float32 or float64, got int32",
        ),
        (
            lambda: CrossMapNorm()(pt.ltensor4("x")),
            "CrossMapNorm: x must be float32 or float64, got int64",
        ),
        (
            lambda: CrossMapNormGrad()(pt.tensor4("x"), pt.matrix("gy")),
            r"CrossMapNormGrad: gy must have 4 dims \(B, C, H, W\), got 2",
        ),
        (
            lambda: CrossMapNormGrad()(pt.tensor4("x"), pt.itensor4("gy")),
            "CrossMapNormGrad: gy must be float32 or float64, got int32",
        ),
        (
            lambda: CrossMapNormGrad()(pt.dtensor4("x"), pt.ftensor4("gy")),
            "CrossMapNormGrad: inputs must share one float dtype, "
            "got x float64, gy float32",
        ),
    ]
    for fn, match in cases:
        with pytest.raises(TypeError, match=match):
            fn()


BAD_PARAMS = [
    (dict(size=0), ValueError, "size must be >= 1, got 0"),
    (dict(size=-3), ValueError, "size must be >= 1, got -3"),
    (dict(size=2.5), TypeError, "size must be an int, got 2.5"),
    (dict(size=True), TypeError, "size must be an int, got True"),
    (dict(size="5"), TypeError, "size must be an int, got '5'"),
    (dict(alpha=-1e-4), ValueError, r"alpha must be >= 0 .*got -0.0001"),
    (dict(alpha="a"), TypeError, "alpha must be a real number, got 'a'"),
    (dict(alpha=float("nan")), ValueError, "alpha must be finite, got nan"),
    (dict(k=0.0), ValueError, r"k must be > 0 .*got 0.0"),
    (dict(k=-2), ValueError, r"k must be > 0 .*got -2"),
    (dict(beta=float("inf")), ValueError, "beta must be finite, got inf"),
    (dict(beta=float("nan")), ValueError, "beta must be finite, got nan"),
    (dict(blocked=1), TypeError, "blocked must be a bool, got 1"),
    (
        dict(layout="bchw"),
        ValueError,
        r"layout must be one of \('bc01', 'c01b'\), got 'bchw'",
    ),
]


@pytest.mark.parametrize("kwargs, exc, match", BAD_PARAMS)
def test_bad_parameters(kwargs, exc, match):
    with pytest.raises(exc, match="CrossMapNorm: " + match):
        cross_map_norm(pt.tensor4("x"), **kwargs)


def test_bad_parameters_of_the_ops_and_references():
    ones = np.ones((1, 2, 1, 1))
    cases = [
        (
            lambda: CrossMapNormGrad(size=0),
            ValueError,
            "CrossMapNormGrad: size must be >= 1, got 0",
        ),
        (lambda: CrossMapNorm(k=0), ValueError, "CrossMapNorm: k must be > 0"),
        (
            lambda: cross_map_norm_reference(ones, 3, -1.0),
            ValueError,
            "cross_map_norm_reference: alpha must be >= 0",
        ),
        (
            lambda: cross_map_norm_reference(np.ones((2, 1, 1))),
            ValueError,
            r"cross_map_norm_reference: x must have 4 dims \(B, C, H, W\), got 3",
        ),
        (
            lambda: cross_map_norm_reference(ones.astype(np.int32)),
            TypeError,
            "cross_map_norm_reference: x must be float32 or float64, got int32",
        ),
        (
            lambda: cross_map_norm_grad_reference(ones, np.ones((1, 3, 1, 1))),
            ValueError,
            "cross_map_norm_grad_reference: gy shape must equal x shape",
        ),
        (
            lambda: cross_map_norm_grad_reference(ones, ones.astype(np.float32)),
            TypeError,
            r"cross_map_norm_grad_reference: gy dtype \(float32\) must",
        ),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match):
            fn()


def test_gy_shape_mismatch():
    x = pt.tensor("x", shape=(2, 3, None, None))
    with pytest.raises(
        ValueError, match=r"CrossMapNormGrad: gy shape must equal x shape"
    ):
        CrossMapNormGrad()(x, pt.tensor("gy", shape=(2, 4, None, None)))
    # only known at run time
    a, b = pt.tensor4("x"), pt.tensor4("gy")
    fn = pytensor.function([a, b], CrossMapNormGrad(size=3)(a, b), mode=TEST_MODE)
    expect_error(
        ValueError,
        "CrossMapNormGrad: gy shape must equal x shape (B, C, H, W), got gy "
        "(1, 3, 2, 2) and x (1, 3, 2, 3)",
        fn,
        np.ones((1, 3, 2, 3)),
        np.ones((1, 3, 2, 2)),
    )


# --------------------------------------------------------------------------
# the registered CPU mode
# --------------------------------------------------------------------------


def test_runs_in_cc2ops_mode():
    from cc2ops.mode import mode

    x = images((3, 6, 4, 5), 11, "float32")
    v = pt.tensor4("x", dtype="float32")
    y = cross_map_norm(v, 4, 2.0, 0.75, 1.0, layout="c01b")
    g = pytensor.grad((y**2).sum(), v)
    fn = pytensor.function([v], [y, g], mode=mode)
    got_y, got_g = fn(to_c01b(x))
    want_y = naive_norm(x, 4, 2.0, 0.75, 1.0)
    np.testing.assert_allclose(to_bc01(got_y), want_y, rtol=1e-5, atol=1e-6)
    want_g = naive_grad(x, 2 * want_y, 4, 2.0, 0.75, 1.0)
    np.testing.assert_allclose(to_bc01(got_g), want_g, rtol=1e-4, atol=1e-5)
