"""Tests of the CPU convolution family: conv2d, FilterActs, ImageActs, WeightActs.

The expected values come from naive loops over output positions written here
(cross-checked once against ``scipy.signal.correlate``), never from the module's
own references.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import check_op, expect_error, rng
from pytensor.compile.mode import Mode
from pytensor.gradient import Rop
from scipy.signal import correlate

import cc2ops.conv as conv
from cc2ops.conv import (
    FilterActs,
    ImageActs,
    WeightActs,
    conv2d,
    conv_backward_data_reference,
    conv_backward_filter_reference,
    conv_forward_reference,
)

# --------------------------------------------------------------------------
# independent references: loops over output positions, one einsum per position
# --------------------------------------------------------------------------


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _out_len(n, k, s, p):
    return (n + 2 * p - k) // s + 1


def _padded(x, p):
    return np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))


def _group_slices(groups, fg, cg):
    for g in range(groups):
        yield slice(g * fg, (g + 1) * fg), slice(g * cg, (g + 1) * cg)


def naive_forward(x, w, stride=1, padding=0, groups=1):
    s, p = _pair(stride), _pair(padding)
    b, _, h, wd = x.shape
    f, cg, kh, kw = w.shape
    ho, wo = _out_len(h, kh, s[0], p[0]), _out_len(wd, kw, s[1], p[1])
    xp = _padded(x, p)
    y = np.zeros((b, f, ho, wo), dtype=np.result_type(x, w))
    for fs, cs in _group_slices(groups, f // groups, cg):
        for i in range(ho):
            for j in range(wo):
                patch = xp[:, cs, i * s[0] : i * s[0] + kh, j * s[1] : j * s[1] + kw]
                y[:, fs, i, j] = np.einsum("bckl,fckl->bf", patch, w[fs])
    return y


def naive_backward_data(dy, w, image_hw, stride=1, padding=0, groups=1):
    s, p = _pair(stride), _pair(padding)
    b, f, ho, wo = dy.shape
    _, cg, kh, kw = w.shape
    h, wd = image_hw
    dxp = np.zeros((b, cg * groups, h + 2 * p[0], wd + 2 * p[1]), np.result_type(dy, w))
    for fs, cs in _group_slices(groups, f // groups, cg):
        for i in range(ho):
            for j in range(wo):
                dxp[:, cs, i * s[0] : i * s[0] + kh, j * s[1] : j * s[1] + kw] += (
                    np.einsum("bf,fckl->bckl", dy[:, fs, i, j], w[fs])
                )
    return dxp[:, :, p[0] : p[0] + h, p[1] : p[1] + wd]


def naive_backward_filter(x, dy, filter_hw, stride=1, padding=0, groups=1):
    s, p = _pair(stride), _pair(padding)
    _, c, _, _ = x.shape
    _, f, ho, wo = dy.shape
    kh, kw = filter_hw
    cg = c // groups
    xp = _padded(x, p)
    dw = np.zeros((f, cg, kh, kw), dtype=np.result_type(x, dy))
    for fs, cs in _group_slices(groups, f // groups, cg):
        for i in range(ho):
            for j in range(wo):
                patch = xp[:, cs, i * s[0] : i * s[0] + kh, j * s[1] : j * s[1] + kw]
                dw[fs] += np.einsum("bf,bckl->fckl", dy[:, fs, i, j], patch)
    return dw


def scipy_forward(x, w, stride, padding, groups):
    s, p = _pair(stride), _pair(padding)
    xp = _padded(x, p)
    f, cg = w.shape[:2]
    fg = f // groups
    out = []
    for bi in range(x.shape[0]):
        rows = []
        for fi in range(f):
            g = fi // fg
            acc = sum(
                correlate(xp[bi, g * cg + c], w[fi, c], mode="valid") for c in range(cg)
            )
            rows.append(acc[:: s[0], :: s[1]])
        out.append(rows)
    return np.array(out)


def _data(r, shape, dtype="float64"):
    return r.standard_normal(shape).astype(dtype)


def _shapes(case):
    b, c, f, h, w, kh, kw, stride, padding, groups = case
    s, p = _pair(stride), _pair(padding)
    ho, wo = _out_len(h, kh, s[0], p[0]), _out_len(w, kw, s[1], p[1])
    return (b, c, h, w), (f, c // groups, kh, kw), (b, f, ho, wo)


def _label(case, dtype="float64"):
    b, c, f, h, w, kh, kw, stride, padding, groups = case
    return f"b{b} c{c} f{f} {h}x{w} k{kh}x{kw} s{stride} p{padding} g{groups} {dtype}"


# B, C, F, H, W, kh, kw, stride, padding, groups
GRAD_CASES = [
    (1, 1, 1, 5, 5, 3, 3, 1, 0, 1),  # smallest ordinary case
    (3, 3, 2, 6, 7, 3, 2, 1, 1, 1),  # rectangular image and filter
    (2, 5, 3, 7, 5, 2, 3, 2, 1, 1),  # stride > 1 with padding, odd sizes
    (2, 4, 6, 6, 8, 3, 2, (2, 3), (1, 0), 2),  # stride/padding pairs, groups 2
    (1, 8, 4, 5, 5, 3, 3, 1, 1, 4),  # groups 4
    (2, 3, 2, 4, 4, 4, 4, 1, 0, 1),  # filter covers the whole image: 1x1 out
    (1, 2, 2, 3, 3, 5, 5, 1, 1, 1),  # filter larger than the image, fits padded
    (2, 2, 2, 7, 7, 3, 3, 3, 0, 1),  # floor rule: the last image row is unused
    (129, 1, 2, 3, 3, 2, 2, 1, 0, 1),  # batch 129, tiny image
]

FORWARD_CASES = [
    (129, 3, 4, 12, 12, 3, 3, 1, 1, 1),
    (3, 64, 16, 9, 9, 3, 3, 2, 1, 1),
    (2, 64, 8, 8, 10, 3, 5, (1, 2), (1, 2), 4),
    (1, 5, 5, 11, 6, 1, 1, 1, 0, 5),  # 1x1 filters, depthwise
]


# --------------------------------------------------------------------------
# the test references themselves, and the module's references
# --------------------------------------------------------------------------


@pytest.mark.parametrize("case", [GRAD_CASES[3], GRAD_CASES[7], FORWARD_CASES[2]])
def test_naive_forward_matches_scipy(case):
    r = rng(1)
    xs, ws, _ = _shapes(case)
    x, w = _data(r, xs), _data(r, ws)
    stride, padding, groups = case[7:]
    np.testing.assert_allclose(
        naive_forward(x, w, stride, padding, groups),
        scipy_forward(x, w, stride, padding, groups),
        rtol=1e-10,
        atol=1e-10,
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("budget", [conv.COLS_BUDGET, 40])
def test_module_references(dtype, budget, monkeypatch):
    # budget 40 forces one image per im2col chunk
    monkeypatch.setattr(conv, "COLS_BUDGET", budget)
    r = rng(2)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=1e-10)
    for case in (GRAD_CASES[3], GRAD_CASES[4], GRAD_CASES[7], FORWARD_CASES[2]):
        xs, ws, ys = _shapes(case)
        stride, padding, groups = case[7:]
        x, w, dy = _data(r, xs, dtype), _data(r, ws, dtype), _data(r, ys, dtype)
        y = conv_forward_reference(x, w, stride, padding, groups)
        dx = conv_backward_data_reference(dy, w, xs[2:], stride, padding, groups)
        dw = conv_backward_filter_reference(x, dy, ws[2:], stride, padding, groups)
        assert y.dtype == dx.dtype == dw.dtype == np.dtype(dtype)
        assert (y.shape, dx.shape, dw.shape) == (ys, xs, ws)
        np.testing.assert_allclose(
            y, naive_forward(x, w, stride, padding, groups), **tol
        )
        np.testing.assert_allclose(
            dx, naive_backward_data(dy, w, xs[2:], stride, padding, groups), **tol
        )
        np.testing.assert_allclose(
            dw, naive_backward_filter(x, dy, ws[2:], stride, padding, groups), **tol
        )


def test_reference_rejects_mismatched_gradient():
    w = np.zeros((2, 1, 5, 5))
    with pytest.raises(ValueError, match=r"gradient rows \(7\) do not match"):
        conv_backward_data_reference(np.zeros((1, 2, 7, 7)), w, (14, 14), 2, 1, 1)
    with pytest.raises(ValueError, match="gradient cols"):
        conv_backward_filter_reference(
            np.zeros((1, 1, 14, 14)), np.zeros((1, 2, 6, 5)), (5, 5), 2, 1, 1
        )


# --------------------------------------------------------------------------
# forward values, inferred shapes and first gradients through check_op
# --------------------------------------------------------------------------


@pytest.mark.parametrize("case", GRAD_CASES, ids=_label)
def test_conv2d_bc01(case):
    r = rng(3)
    xs, ws, _ = _shapes(case)
    stride, padding, groups = case[7:]
    check_op(
        lambda x, w: conv2d(x, w, stride=stride, padding=padding, groups=groups),
        [_data(r, xs), _data(r, ws)],
        lambda x, w: naive_forward(x, w, stride, padding, groups),
        label=f"conv2d {_label(case)}",
        names=["x", "w"],
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", FORWARD_CASES, ids=_label)
def test_conv2d_forward_only(case, dtype):
    r = rng(4)
    xs, ws, _ = _shapes(case)
    stride, padding, groups = case[7:]
    check_op(
        lambda x, w: conv2d(x, w, stride=stride, padding=padding, groups=groups),
        [_data(r, xs, dtype), _data(r, ws, dtype)],
        lambda x, w: naive_forward(x, w, stride, padding, groups),
        label=f"conv2d {_label(case, dtype)}",
        names=["x", "w"],
        wrt=(),
        fwd_tol=dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else None,
    )


@pytest.mark.parametrize(
    "case", [GRAD_CASES[2], GRAD_CASES[3]], ids=lambda c: _label(c, "float32")
)
def test_conv2d_float32_gradients(case):
    r = rng(5)
    xs, ws, _ = _shapes(case)
    stride, padding, groups = case[7:]
    check_op(
        lambda x, w: conv2d(x, w, stride=stride, padding=padding, groups=groups),
        [_data(r, xs, "float32"), _data(r, ws, "float32")],
        lambda x, w: naive_forward(x, w, stride, padding, groups),
        label=f"conv2d {_label(case, 'float32')}",
        names=["x", "w"],
    )


@pytest.mark.parametrize("case", [GRAD_CASES[1], GRAD_CASES[3]], ids=_label)
def test_conv2d_c01b(case):
    r = rng(6)
    xs, ws, _ = _shapes(case)
    stride, padding, groups = case[7:]
    x, w = _data(r, xs), _data(r, ws)

    def reference(xc, wc):
        y = naive_forward(
            xc.transpose(3, 0, 1, 2), wc.transpose(3, 0, 1, 2), stride, padding, groups
        )
        return y.transpose(1, 2, 3, 0)

    out = check_op(
        lambda x, w: conv2d(
            x, w, stride=stride, padding=padding, groups=groups, layout="c01b"
        ),
        [x.transpose(1, 2, 3, 0).copy(), w.transpose(1, 2, 3, 0).copy()],
        reference,
        label=f"conv2d c01b {_label(case)}",
        names=["x", "w"],
        op_class=FilterActs,
    )
    b, f = xs[0], ws[0]
    assert out.shape[0] == f and out.shape[3] == b


def test_conv2d_upcasts_mixed_dtypes():
    x = pt.tensor4("x", dtype="float32")
    w = pt.tensor4("w", dtype="float64")
    y = conv2d(x, w, padding=1)
    assert y.type.dtype == "float64"
    assert y.owner.op == FilterActs(padding=(1, 1))
    r = rng(7)
    xv, wv = _data(r, (2, 3, 5, 4), "float32"), _data(r, (2, 3, 3, 3))
    got = pytensor.function([x, w], y, mode=Mode(linker="py"))(xv, wv)
    np.testing.assert_allclose(got, naive_forward(xv, wv, 1, 1, 1), rtol=1e-10)


def test_op_props_and_static_shape():
    assert FilterActs(stride=2, padding=1) == FilterActs(stride=(2, 2), padding=(1, 1))
    assert hash(FilterActs(groups=2)) == hash(FilterActs(groups=2))
    assert FilterActs(stride=2) != FilterActs(stride=(2, 1))
    assert ImageActs(groups=2) != WeightActs(groups=2)
    x = pt.tensor("x", shape=(2, 4, 9, 8))
    w = pt.tensor("w", shape=(6, 2, 3, 2))
    y = FilterActs(stride=2, padding=1, groups=2)(x, w)
    assert y.type.shape == (2, 6, 5, 5)
    gx, gw = pytensor.grad((y**2).sum(), [x, w])
    assert isinstance(gx.owner.op, ImageActs) and gx.type.shape == (2, 4, 9, 8)
    assert isinstance(gw.owner.op, WeightActs) and gw.type.shape == (6, 2, 3, 2)
    dy = pt.tensor4("dy")
    assert ImageActs(groups=3)(dy, w, (5, 6)).type.shape == (None, 6, 5, 6)
    assert ImageActs()(dy, w, pt.lvector("hw")).type.shape == (None, 2, None, None)
    assert WeightActs(groups=2)(x, dy, [3, 3]).type.shape == (None, 2, 3, 3)


def _image_acts_case(case):
    xs, ws, ys = _shapes(case)
    return xs, ws, ys, case[7:]


@pytest.mark.parametrize(
    "case", [GRAD_CASES[2], GRAD_CASES[3], GRAD_CASES[4], GRAD_CASES[7]], ids=_label
)
def test_image_acts(case):
    r = rng(8)
    xs, ws, ys, (stride, padding, groups) = _image_acts_case(case)
    op = ImageActs(stride=stride, padding=padding, groups=groups)
    check_op(
        lambda dy, w: op(dy, w, xs[2:]),
        [_data(r, ys), _data(r, ws)],
        lambda dy, w: naive_backward_data(dy, w, xs[2:], stride, padding, groups),
        label=f"ImageActs {_label(case)}",
        names=["dy", "w"],
    )


@pytest.mark.parametrize(
    "case", [GRAD_CASES[2], GRAD_CASES[3], GRAD_CASES[4], GRAD_CASES[7]], ids=_label
)
def test_weight_acts(case):
    r = rng(9)
    xs, ws, ys, (stride, padding, groups) = _image_acts_case(case)
    op = WeightActs(stride=stride, padding=padding, groups=groups)
    check_op(
        lambda x, dy: op(x, dy, ws[2:]),
        [_data(r, xs), _data(r, ys)],
        lambda x, dy: naive_backward_filter(x, dy, ws[2:], stride, padding, groups),
        label=f"WeightActs {_label(case)}",
        names=["x", "dy"],
    )


def test_image_and_weight_acts_symbolic_hw_float32():
    # (H, W) / (kh, kw) as symbolic int inputs: shapes known only at run time
    case = GRAD_CASES[3]
    r = rng(10)
    xs, ws, ys, (stride, padding, groups) = _image_acts_case(case)
    kw = dict(stride=stride, padding=padding, groups=groups)
    check_op(
        lambda dy, w, hw: ImageActs(**kw)(dy, w, hw),
        [_data(r, ys, "float32"), _data(r, ws, "float32"), np.array(xs[2:])],
        lambda dy, w, hw: naive_backward_data(
            dy, w, tuple(hw), stride, padding, groups
        ),
        label=f"ImageActs symbolic hw {_label(case, 'float32')}",
        names=["dy", "w", "hw"],
    )
    check_op(
        lambda x, dy, khw: WeightActs(**kw)(x, dy, khw),
        [_data(r, xs, "float32"), _data(r, ys, "float32"), np.array(ws[2:], "int32")],
        lambda x, dy, khw: naive_backward_filter(
            x, dy, tuple(khw), stride, padding, groups
        ),
        label=f"WeightActs symbolic hw {_label(case, 'float32')}",
        names=["x", "dy", "khw"],
    )


def test_integer_inputs_are_disconnected():
    dy, w, x = pt.tensor4("dy"), pt.tensor4("w"), pt.tensor4("x")
    hw = pt.lvector("hw")
    for out in (ImageActs()(dy, w, hw), WeightActs()(x, dy, hw)):
        assert out.owner.op.connection_pattern(out.owner) == [[True], [True], [False]]
        with pytest.raises(pytensor.gradient.DisconnectedInputError):
            pytensor.grad(out.sum(), hw)


# --------------------------------------------------------------------------
# second derivatives
# --------------------------------------------------------------------------


# The first gradient is quadratic in (x, w), so verify_grad's one-sided finite
# difference (eps 1e-7) carries an O(eps * curvature) ~ 1e-6 error of its own.
SECOND_ORDER_TOL = dict(abs_tol=1e-5, rel_tol=1e-5)


@pytest.mark.parametrize("case", [GRAD_CASES[2], GRAD_CASES[3]], ids=_label)
def test_second_derivatives(case):
    r = rng(11)
    xs, ws, _ = _shapes(case)
    stride, padding, groups = case[7:]
    x, w = _data(r, xs), _data(r, ws)
    kw = dict(stride=stride, padding=padding, groups=groups)

    def grad_x(x, w):
        return pytensor.grad((conv2d(x, w, **kw) ** 2).sum(), x)

    def grad_w(x, w):
        return pytensor.grad((conv2d(x, w, **kw) ** 2).sum(), w)

    # d/dx sum(y^2) = ImageActs(2y, w); d/dw = WeightActs(x, 2y). Their pullbacks
    # wrt x and w are the second derivatives verify_grad checks.
    check_op(
        grad_x,
        [x, w],
        lambda x, w: naive_backward_data(
            2 * naive_forward(x, w, stride, padding, groups),
            w,
            xs[2:],
            stride,
            padding,
            groups,
        ),
        label=f"d/dx sum(conv^2) {_label(case)}",
        names=["x", "w"],
        op_class=ImageActs,
        grad_tol=SECOND_ORDER_TOL,
    )
    check_op(
        grad_w,
        [x, w],
        lambda x, w: naive_backward_filter(
            x,
            2 * naive_forward(x, w, stride, padding, groups),
            ws[2:],
            stride,
            padding,
            groups,
        ),
        label=f"d/dw sum(conv^2) {_label(case)}",
        names=["x", "w"],
        op_class=WeightActs,
        grad_tol=SECOND_ORDER_TOL,
    )


# --------------------------------------------------------------------------
# pushforward (Rop)
# --------------------------------------------------------------------------

ROP_CASE = GRAD_CASES[3]


def _rop_values(build, shapes, dtype="float64"):
    """Rop of ``build`` wrt all inputs, through the ops' pushforward and through
    the pullback, for random points and tangents."""
    r = rng(12)
    syms = [pt.tensor(f"in{i}", dtype=dtype, shape=(None,) * 4) for i in range(2)]
    tans = [pt.tensor(f"t{i}", dtype=dtype, shape=(None,) * 4) for i in range(2)]
    out = build(*syms)
    vals = [_data(r, s, dtype) for s in shapes]
    tvals = [_data(r, s, dtype) for s in shapes]
    results = {}
    for direct in (True, False):
        both = Rop(out, syms, tans, use_op_rop_implementation=direct)
        only0 = Rop(out, syms[:1], tans[:1], use_op_rop_implementation=direct)
        fn = pytensor.function(syms + tans, [both, only0], mode=Mode(linker="py"))
        results[direct] = fn(*vals, *tvals)
    return vals, tvals, results


@pytest.mark.filterwarnings("ignore:Rop is deprecated:FutureWarning")
@pytest.mark.parametrize("which", ["FilterActs", "ImageActs", "WeightActs"])
def test_pushforward(which):
    xs, ws, ys = _shapes(ROP_CASE)
    stride, padding, groups = ROP_CASE[7:]
    kw = dict(stride=stride, padding=padding, groups=groups)
    if which == "FilterActs":
        shapes = (xs, ws)

        def build(x, w):
            return conv2d(x, w, **kw)

        def ref(a, b):
            return naive_forward(a, b, stride, padding, groups)

    elif which == "ImageActs":
        shapes = (ys, ws)

        def build(dy, w):
            return ImageActs(**kw)(dy, w, xs[2:])

        def ref(a, b):
            return naive_backward_data(a, b, xs[2:], stride, padding, groups)

    else:
        shapes = (xs, ys)

        def build(x, dy):
            return WeightActs(**kw)(x, dy, ws[2:])

        def ref(a, b):
            return naive_backward_filter(a, b, ws[2:], stride, padding, groups)

    (a, b), (ta, tb), results = _rop_values(build, shapes)
    # bilinear: the directional derivative is exact
    want_both = ref(ta, b) + ref(a, tb)
    want_only0 = ref(ta, b)
    for direct, (both, only0) in results.items():
        np.testing.assert_allclose(
            both, want_both, rtol=1e-10, atol=1e-12, err_msg=f"{which} direct={direct}"
        )
        np.testing.assert_allclose(
            only0,
            want_only0,
            rtol=1e-10,
            atol=1e-12,
            err_msg=f"{which} one tangent direct={direct}",
        )


@pytest.mark.filterwarnings("ignore:Rop is deprecated:FutureWarning")
def test_pushforward_of_gradient_matches_finite_difference():
    xs, ws, _ = _shapes(ROP_CASE)
    stride, padding, groups = ROP_CASE[7:]
    kw = dict(stride=stride, padding=padding, groups=groups)
    x, w = pt.tensor4("x"), pt.tensor4("w")
    tx, tw = pt.tensor4("tx"), pt.tensor4("tw")
    gx = pytensor.grad((conv2d(x, w, **kw) ** 2).sum(), x)
    jvp = Rop(gx, [x, w], [tx, tw], use_op_rop_implementation=True)
    mode = Mode(linker="py")
    f_jvp = pytensor.function([x, w, tx, tw], jvp, mode=mode)
    f_gx = pytensor.function([x, w], gx, mode=mode)
    r = rng(13)
    xv, wv, txv, twv = (_data(r, s) for s in (xs, ws, xs, ws))
    eps = 1e-5
    fd = f_gx(xv + eps * txv, wv + eps * twv) - f_gx(xv - eps * txv, wv - eps * twv)
    np.testing.assert_allclose(
        f_jvp(xv, wv, txv, twv), fd / (2 * eps), rtol=1e-6, atol=1e-7
    )


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------


def _x(shape=(None,) * 4, dtype="float64"):
    return pt.tensor("x", dtype=dtype, shape=shape)


def _t4(dtype="float64"):
    return pt.tensor4(dtype=dtype)


# (exception, regex on the message, graph construction that must raise)
BUILD_ERRORS = {
    "ndim images": (
        TypeError,
        r"conv2d: images must have 4 dims \(B, C, H, W\), got 3",
        lambda: conv2d(pt.tensor3(), _t4()),
    ),
    "ndim filters c01b": (
        TypeError,
        r"conv2d: filters must have 4 dims \(C/groups, kh, kw, F\), got 5",
        lambda: conv2d(_t4(), pt.tensor5(), layout="c01b"),
    ),
    "ndim op filters": (
        TypeError,
        r"FilterActs: filters must have 4 dims \(F, C/groups, kh, kw\), got 3",
        lambda: FilterActs()(_t4(), pt.tensor3()),
    ),
    "ndim gradient": (
        TypeError,
        r"ImageActs: gradient must have 4 dims \(B, F, Ho, Wo\), got 2",
        lambda: ImageActs()(pt.matrix(), _t4(), (3, 3)),
    ),
    "ndim filter_hw": (
        TypeError,
        r"WeightActs: filter_hw must have 1 dim \(kh, kw\), got 2",
        lambda: WeightActs()(_t4(), _t4(), pt.lmatrix()),
    ),
    "int images": (
        TypeError,
        "conv2d: images must be float32 or float64, got int64",
        lambda: conv2d(_t4("int64"), _t4()),
    ),
    "int op filters": (
        TypeError,
        "FilterActs: filters must be float32 or float64, got int32",
        lambda: FilterActs()(_t4(), _t4("int32")),
    ),
    "op dtype mismatch": (
        TypeError,
        "FilterActs: inputs must share one float dtype, got images float32, "
        "filters float64",
        lambda: FilterActs()(_t4("float32"), _t4()),
    ),
    "ImageActs dtype mismatch": (
        TypeError,
        "ImageActs: inputs must share one float dtype",
        lambda: ImageActs()(_t4(), _t4("float32"), (3, 3)),
    ),
    "float image_hw": (
        TypeError,
        "ImageActs: image_hw must have an integer dtype, got float64",
        lambda: ImageActs()(_t4(), _t4(), pt.dvector()),
    ),
    "groups 0": (
        ValueError,
        "FilterActs: groups must be >= 1, got 0",
        lambda: conv2d(_t4(), _t4(), groups=0),
    ),
    "groups negative": (
        ValueError,
        "FilterActs: groups must be >= 1, got -2",
        lambda: FilterActs(groups=-2),
    ),
    "groups float": (
        TypeError,
        "FilterActs: groups must be an int, got 2.0",
        lambda: FilterActs(groups=2.0),
    ),
    "stride 0": (
        ValueError,
        "FilterActs: stride must be >= 1, got 0",
        lambda: conv2d(_t4(), _t4(), stride=0),
    ),
    "stride pair 0": (
        ValueError,
        r"ImageActs: stride must be >= 1, got \(1, 0\)",
        lambda: ImageActs(stride=(1, 0)),
    ),
    "padding negative": (
        ValueError,
        r"FilterActs: padding must be >= 0, got \(1, -1\)",
        lambda: conv2d(_t4(), _t4(), padding=(1, -1)),
    ),
    "stride triple": (
        TypeError,
        "WeightActs: stride must be an int or a pair of ints",
        lambda: WeightActs(stride=(1, 2, 3)),
    ),
    "layout": (
        ValueError,
        r"conv2d: layout must be one of \('bc01', 'c01b'\), got 'b01c'",
        lambda: conv2d(_t4(), _t4(), layout="b01c"),
    ),
    "channel mismatch": (
        ValueError,
        r"FilterActs: filters have 2 input channels but images have 3 channels "
        r"in 1 group\(s\)",
        lambda: conv2d(_x((1, 3, 4, 4)), _x((2, 2, 3, 3))),
    ),
    "groups vs channels": (
        ValueError,
        r"FilterActs: groups \(2\) must divide the image channels \(3\)",
        lambda: conv2d(_x((1, 3, 4, 4)), _x((2, 1, 3, 3)), groups=2),
    ),
    "groups vs filters": (
        ValueError,
        r"FilterActs: groups \(2\) must divide the number of filters \(3\)",
        lambda: conv2d(_x((1, 4, 4, 4)), _x((3, 2, 3, 3)), groups=2),
    ),
    "filter too large": (
        ValueError,
        r"FilterActs: filter cols \(7\) larger than the padded image "
        r"\(4 \+ 2\*1 = 6\)",
        lambda: conv2d(_x((1, 3, 9, 4)), _x((2, 3, 3, 7)), padding=1),
    ),
    "ImageActs gradient rows": (
        ValueError,
        r"ImageActs: gradient rows \(7\) do not match the output rows \(6\) of a "
        r"5-row filter over 14 rows with stride 2, padding 1",
        lambda: ImageActs(stride=2, padding=1)(
            _x((1, 2, 7, 6)), _x((2, 1, 5, 5)), (14, 14)
        ),
    ),
    "ImageActs filter count": (
        ValueError,
        "ImageActs: gradient has 3 channels but there are 2 filters",
        lambda: ImageActs()(_x((1, 3, 2, 2)), _x((2, 1, 3, 3)), (4, 4)),
    ),
    "image_hw length": (
        ValueError,
        r"ImageActs: image_hw must have 2 entries \(H, W\), got 3",
        lambda: ImageActs()(_t4(), _t4(), (4, 4, 4)),
    ),
    "image_hw zero": (
        ValueError,
        r"ImageActs: image_hw must be >= 1, got \(0, 4\)",
        lambda: ImageActs()(_t4(), _t4(), (0, 4)),
    ),
    "WeightActs batch": (
        ValueError,
        r"WeightActs: gradient batch \(3\) does not match the image batch \(2\)",
        lambda: WeightActs()(_x((2, 1, 4, 4)), _x((3, 1, 2, 2)), (3, 3)),
    ),
    "WeightActs filter too large": (
        ValueError,
        r"WeightActs: filter rows \(9\) larger than the padded image",
        lambda: WeightActs()(_x((2, 1, 4, 4)), _t4(), (9, 3)),
    ),
}


@pytest.mark.parametrize("name", list(BUILD_ERRORS))
def test_bad_input(name):
    exc, pattern, thunk = BUILD_ERRORS[name]
    with pytest.raises(exc, match=pattern):
        thunk()


def _run(build, *arrays):
    syms = [_x(dtype=str(a.dtype)) if a.ndim == 4 else pt.lvector() for a in arrays]
    return pytensor.function(syms, build(*syms), mode=Mode(linker="py"))(*arrays)


_z = np.zeros

# (message text, graph on shapes unknown until run time, its input values)
RUN_ERRORS = {
    "channel mismatch": (
        "FilterActs: filters have 2 input channels but images have 3",
        lambda x, w: conv2d(x, w),
        (_z((1, 3, 4, 4)), _z((2, 2, 3, 3))),
    ),
    "groups vs channels": (
        "FilterActs: groups (2) must divide the image channels (3)",
        lambda x, w: conv2d(x, w, groups=2),
        (_z((1, 3, 4, 4)), _z((2, 1, 3, 3))),
    ),
    "groups vs filters": (
        "FilterActs: groups (2) must divide the number of filters (3)",
        lambda x, w: conv2d(x, w, groups=2),
        (_z((1, 4, 4, 4)), _z((3, 2, 3, 3))),
    ),
    "filter too large": (
        "FilterActs: filter rows (5) larger than the padded image (2 + 2*1 = 4)",
        lambda x, w: conv2d(x, w, padding=1),
        (_z((1, 1, 2, 9)), _z((1, 1, 5, 3))),
    ),
    "ImageActs gradient rows": (
        "ImageActs: gradient rows (7) do not match the output rows (6) of a 5-row "
        "filter over 14 rows with stride 2, padding 1",
        lambda dy, w: ImageActs(stride=2, padding=1)(dy, w, (14, 14)),
        (_z((1, 2, 7, 6)), _z((2, 1, 5, 5))),
    ),
    "ImageActs gradient cols, symbolic hw": (
        "ImageActs: gradient cols (5) do not match the output cols (4)",
        lambda dy, w, hw: ImageActs()(dy, w, hw),
        (_z((1, 2, 4, 5)), _z((2, 1, 3, 3)), np.array([6, 6])),
    ),
    "image_hw length": (
        "ImageActs: image_hw must have 2 entries, got shape (3,)",
        lambda dy, w, hw: ImageActs()(dy, w, hw),
        (_z((1, 2, 4, 4)), _z((2, 1, 3, 3)), np.array([6, 6, 6])),
    ),
    "WeightActs gradient rows": (
        "WeightActs: gradient rows (3) do not match the output rows (4)",
        lambda x, dy: WeightActs()(x, dy, (3, 3)),
        (_z((2, 1, 6, 6)), _z((2, 1, 3, 4))),
    ),
    "WeightActs batch": (
        "WeightActs: gradient batch (1) does not match the image batch (2)",
        lambda x, dy: WeightActs()(x, dy, (3, 3)),
        (_z((2, 1, 6, 6)), _z((1, 1, 4, 4))),
    ),
}


@pytest.mark.parametrize("name", list(RUN_ERRORS))
def test_bad_runtime_shapes(name):
    text, build, arrays = RUN_ERRORS[name]
    expect_error(ValueError, text, _run, build, *arrays)


# --------------------------------------------------------------------------
# compiled under the modes users meet
# --------------------------------------------------------------------------


def _mode_check(mode):
    r = rng(14)
    x, w = pt.tensor4("x"), pt.tensor4("w")
    y = conv2d(x, w, stride=2, padding=1, groups=2)
    gx, gw = pytensor.grad((y**2).sum(), [x, w])
    fn = pytensor.function([x, w], [y, gx, gw], mode=mode)
    xv, wv = _data(r, (2, 4, 7, 6)), _data(r, (4, 2, 3, 3))
    got_y, got_gx, got_gw = fn(xv, wv)
    want_y = naive_forward(xv, wv, 2, 1, 2)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-10)
    np.testing.assert_allclose(
        got_gx, naive_backward_data(2 * want_y, wv, (7, 6), 2, 1, 2), rtol=1e-10
    )
    np.testing.assert_allclose(
        got_gw, naive_backward_filter(xv, 2 * want_y, (3, 3), 2, 1, 2), rtol=1e-10
    )


@pytest.mark.filterwarnings("ignore:Numba will use object mode:UserWarning")
def test_default_mode():
    _mode_check(None)


def test_fast_compile_mode():
    _mode_check("FAST_COMPILE")


def test_cc2ops_mode():
    from cc2ops.mode import mode

    _mode_check(mode)
