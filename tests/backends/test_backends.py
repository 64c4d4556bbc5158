"""Every cc2ops op on every PyTensor backend that imports here.

Backends: ``cc2ops.mode`` (the baseline: numpy ``perform`` under the cvm
linker), PyTensor's default ``NUMBA``, ``JAX``, ``PYTORCH`` and ``MLX``; a
backend is skipped only when its library does not import. Each case compiles
one function per backend holding the forward values, the first-order
gradients (compared with the numpy references) and, where the family has
them, second-order gradients (compared with the baseline mode). JAX and MLX run
every case; the baseline, NUMBA and PYTORCH, whose compiles take seconds per
graph on a fresh cache, run the cases marked ``everywhere``. Second-order
expected values come from :data:`REFERENCE_MODE` (Python linker).

Second-order outputs are compared by value only: they run PyTensor's own ops
(sums, softmax), whose JAX versions return float64 for float32 sums.
MLX computes float64 graphs in float32 (``mx.array`` of float64 data is
float32), so its tolerance is float32's for both dtypes.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from functools import cache

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import Mode, get_mode
from pytensor.graph.basic import Constant
from pytensor.tensor.special import softmax

import cc2ops
from cc2ops import backends
from cc2ops.backends import _generic
from cc2ops.backends.rewriting import ShapeVector
from cc2ops.conv import (
    ImageActs,
    WeightActs,
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
    AvgPoolGrad,
    avg_pool_grad_reference,
    avg_pool_reference,
    max_pool_grad_grad_reference,
    max_pool_grad_reference,
    max_pool_reference,
)
from cc2ops.softmax_cross_entropy import (
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyGrad,
    softmax_cross_entropy_grad_reference,
    softmax_cross_entropy_reference,
    top_k_error_reference,
)

_LIBRARY = {"NUMBA": "numba", "JAX": "jax", "PYTORCH": "torch", "MLX": "mlx.core"}


def _importable(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any failure means "not importable"
        return f"{module} not importable: {type(e).__name__}: {e}"
    return None


def _backend_params(names):
    out = []
    for name in names:
        reason = _importable(_LIBRARY[name]) if name in _LIBRARY else None
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


ALL = ["CC2OPS", "NUMBA", "JAX", "PYTORCH", "MLX"]
QUICK = ["JAX", "MLX"]  # compile in about a second per graph or less

#: Second-order expected values: the numpy ``perform`` of every op under the
#: Python linker (a C-compiled baseline costs minutes on a fresh cache).
REFERENCE_MODE = Mode(linker="py", optimizer="fast_run").including("cc2ops")


def _mode(name: str):
    return cc2ops.mode if name == "CC2OPS" else get_mode(name)


def _tol(backend: str, dtype: str) -> dict:
    if dtype == "float64" and backend != "MLX":
        return dict(rtol=1e-9, atol=1e-11)
    return dict(rtol=2e-4, atol=2e-5)


def _compile(inputs, outputs, backend, **kwargs):
    with warnings.catch_warnings():
        # NUMBA runs ops without a Numba implementation in object mode and
        # says so once per op; this file is about values, not about that
        warnings.simplefilter("ignore", UserWarning)
        return pytensor.function(inputs, outputs, mode=_mode(backend), **kwargs)


def _run(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return [np.asarray(v) for v in fn(*args)]


def _check(label, got, want, backend, dtype, check_dtype=True):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{label}: shape {got.shape} != {want.shape}"
    if check_dtype and backend != "MLX":
        assert str(got.dtype) == str(want.dtype), (
            f"{label}: dtype {got.dtype} != {want.dtype}"
        )
    np.testing.assert_allclose(
        got, want, err_msg=f"{backend} {label}", **_tol(backend, dtype)
    )


def _param_cases(cases, quick_only=QUICK):
    """(backend, case) pairs: every backend for ``everywhere`` cases."""
    out = []
    for case in cases:
        names = ALL if case.get("everywhere") else quick_only
        for p in _backend_params(names):
            out.append(
                pytest.param(
                    p.values[0], case, marks=p.marks, id=f"{p.id}-{case['id']}"
                )
            )
    return out


_BASELINES: dict = {}


def _second_order(key, build_fn, args):
    """All outputs of the graph under :data:`REFERENCE_MODE` (cached per case)."""
    if key not in _BASELINES:
        inputs, outputs = build_fn()
        _BASELINES[key] = pytensor.function(inputs, outputs, mode=REFERENCE_MODE)
    return _run(_BASELINES[key], *args)


# --------------------------------------------------------------------------
# convolution: FilterActs, ImageActs, WeightActs
# --------------------------------------------------------------------------

CONV_CASES = [
    dict(id="f64-s1p1", dtype="float64", b=2, c=3, f=4, hw=(7, 6), k=(3, 3),
         stride=1, padding=1, groups=1, everywhere=True),
    dict(id="f32-s2-g2-floor", dtype="float32", b=1, c=4, f=6, hw=(9, 8), k=(3, 2),
         stride=2, padding=0, groups=2),
    dict(id="f64-pad-gt-k-depthwise", dtype="float64", b=3, c=3, f=3, hw=(5, 7),
         k=(2, 3), stride=(3, 2), padding=(2, 1), groups=3),
    dict(id="f32-size1", dtype="float32", b=1, c=1, f=1, hw=(1, 1), k=(1, 1),
         stride=1, padding=0, groups=1),
    dict(id="f64-c01b", dtype="float64", b=2, c=2, f=3, hw=(5, 5), k=(3, 3),
         stride=1, padding=0, groups=1, layout="c01b"),
]  # fmt: skip


def _conv_graph(case):
    dtype, layout = case["dtype"], case.get("layout", "bc01")
    x = pt.tensor4("x", dtype=dtype)
    w = pt.tensor4("w", dtype=dtype)
    g = pt.tensor4("g", dtype=dtype)
    y = cc2ops.conv2d(x, w, case["stride"], case["padding"], case["groups"], layout)
    gx, gw = pytensor.grad((y * g).sum(), [x, w])
    # second order: the pullbacks of ImageActs and WeightActs
    h = (gx * gx).sum() + (gw * gw).sum()
    hg, hw_ = pytensor.grad(h, [g, w])
    return [x, w, g], [y, gx, gw, hg, hw_]


def _conv_data(case):
    r = np.random.default_rng(1)
    dtype = case["dtype"]
    b, c, f, (h, w), k = case["b"], case["c"], case["f"], case["hw"], case["k"]
    x = r.normal(size=(b, c, h, w)).astype(dtype)
    wt = r.normal(size=(f, c // case["groups"], *k)).astype(dtype)
    y = conv_forward_reference(x, wt, case["stride"], case["padding"], case["groups"])
    g = r.normal(size=y.shape).astype(dtype)
    return x, wt, g, y


@pytest.mark.parametrize("backend, case", _param_cases(CONV_CASES))
def test_conv_family(backend, case):
    dtype, layout = case["dtype"], case.get("layout", "bc01")
    x, w, g, y = _conv_data(case)
    params = (case["stride"], case["padding"], case["groups"])
    gx = conv_backward_data_reference(g, w, x.shape[2:], *params)
    gw = conv_backward_filter_reference(x, g, w.shape[2:], *params)
    if layout == "c01b":
        to = (1, 2, 3, 0)
        args = (x.transpose(to), w.transpose(1, 2, 3, 0), g.transpose(to))
        want = [y.transpose(to), gx.transpose(to), gw.transpose(1, 2, 3, 0)]
    else:
        args, want = (x, w, g), [y, gx, gw]
    inputs, outputs = _conv_graph(case)
    got = _run(_compile(inputs, outputs, backend), *args)
    labels = ["forward", "pullback wrt images", "pullback wrt filters"]
    for label, a, b in zip(labels, got, want, strict=False):
        _check(f"{case['id']} {label}", a, b, backend, dtype)
    second = _second_order(("conv", case["id"]), lambda: _conv_graph(case), args)
    _check(f"{case['id']} second order wrt g", got[3], second[3], backend, dtype, False)
    _check(f"{case['id']} second order wrt w", got[4], second[4], backend, dtype, False)


# --------------------------------------------------------------------------
# pooling: MaxPool(Grad, GradGrad), AvgPool(Grad)
# --------------------------------------------------------------------------

POOL_CASES = [
    dict(id="f64-3s2", dtype="float64", shape=(2, 3, 7, 8), size=3, stride=2,
         start=0, everywhere=True),
    dict(id="f32-2s1-start-1-ties", dtype="float32", shape=(1, 2, 5, 6), size=2,
         stride=1, start=-1, ties=True),
    dict(id="f64-3s2-start1", dtype="float64", shape=(3, 1, 8, 9), size=3, stride=2,
         start=1),
    dict(id="f32-rect", dtype="float32", shape=(2, 2, 6, 7), size=(2, 3),
         stride=(1, 2), start=(0, -1)),
    dict(id="f64-size1", dtype="float64", shape=(1, 1, 3, 2), size=1, stride=1,
         start=0),
    dict(id="f64-c01b", dtype="float64", shape=(2, 3, 5, 5), size=3, stride=2,
         start=0, layout="c01b"),
]  # fmt: skip


def _pool_graph(case, kind):
    dtype, layout = case["dtype"], case.get("layout", "bc01")
    build = cc2ops.max_pool2d if kind == "max" else cc2ops.avg_pool2d
    x = pt.tensor4("x", dtype=dtype)
    g = pt.tensor4("g", dtype=dtype)
    c2 = pt.tensor4("c2", dtype=dtype)
    y = build(x, case["size"], case["stride"], case["start"], layout)
    gx = pytensor.grad((y * g).sum(), x)
    # the pullback of the gradient wrt g: MaxPoolGradGrad / AvgPool
    gg = pytensor.grad((gx * c2).sum(), g)
    return [x, g, c2], [y, gx, gg]


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("backend, case", _param_cases(POOL_CASES))
def test_pool_family(backend, case, kind):
    dtype, layout = case["dtype"], case.get("layout", "bc01")
    r = np.random.default_rng(2)
    x = r.normal(size=case["shape"])
    if case.get("ties"):
        x = np.round(x)  # many equal maxima: the first in row-major order wins
    x = x.astype(dtype)
    p = (case["size"], case["stride"], case["start"])
    if kind == "max":
        y = max_pool_reference(x, *p)
    else:
        y = avg_pool_reference(x, *p)
    g = r.normal(size=y.shape).astype(dtype)
    c2 = r.normal(size=x.shape).astype(dtype)
    if kind == "max":
        gx = max_pool_grad_reference(x, y, g, *p)
        gg = max_pool_grad_grad_reference(x, y, c2, *p)
    else:
        gx = avg_pool_grad_reference(g, x.shape[2:], *p)
        gg = avg_pool_reference(c2, *p)
    want = [y, gx, gg]
    args = (x, g, c2)
    if layout == "c01b":
        to = (1, 2, 3, 0)
        args = tuple(a.transpose(to) for a in args)
        want = [a.transpose(to) for a in want]
    inputs, outputs = _pool_graph(case, kind)
    got = _run(_compile(inputs, outputs, backend), *args)
    labels = ["forward", "pullback wrt images", "second order wrt gy"]
    for label, a, b in zip(labels, got, want, strict=True):
        _check(f"{kind} {case['id']} {label}", a, b, backend, dtype)


# --------------------------------------------------------------------------
# cross-map norm
# --------------------------------------------------------------------------

NORM_CASES = [
    dict(id="f64-size5-c7", dtype="float64", shape=(2, 7, 3, 4), size=5,
         blocked=False, everywhere=True),
    dict(id="f32-size4-blocked-c6", dtype="float32", shape=(1, 6, 3, 3), size=4,
         blocked=True),
    dict(id="f64-size4-even-c5", dtype="float64", shape=(2, 5, 2, 3), size=4,
         blocked=False),
    dict(id="f64-size1-c1", dtype="float64", shape=(1, 1, 2, 2), size=1,
         blocked=False),
    dict(id="f32-size3-c2-blocked-c01b", dtype="float32", shape=(3, 2, 3, 3), size=3,
         blocked=True, layout="c01b"),
]  # fmt: skip
NORM_PARAMS = dict(alpha=0.5, beta=0.75, k=2.0)


def _norm_graph(case, second=True):
    dtype, layout = case["dtype"], case.get("layout", "bc01")
    shape = case["shape"]
    if layout == "c01b":
        shape = tuple(shape[i] for i in (1, 2, 3, 0))
    # static shapes: the second-order graph is PyTensor's own (zeros of a
    # padded channel count), which JAX can only build with known shapes
    x = pt.tensor4("x", dtype=dtype, shape=shape)
    g = pt.tensor4("g", dtype=dtype, shape=shape)
    y = cc2ops.cross_map_norm(
        x, case["size"], blocked=case["blocked"], layout=layout, **NORM_PARAMS
    )
    gx = pytensor.grad((y * g).sum(), x)
    if not second:
        return [x, g], [y, gx]
    h = (gx * gx).sum()
    return [x, g], [y, gx, *pytensor.grad(h, [x, g])]


@pytest.mark.parametrize("backend, case", _param_cases(NORM_CASES))
def test_cross_map_norm_family(backend, case):
    dtype, layout = case["dtype"], case.get("layout", "bc01")
    r = np.random.default_rng(3)
    x = r.normal(size=case["shape"]).astype(dtype)
    g = r.normal(size=case["shape"]).astype(dtype)
    p = dict(size=case["size"], blocked=case["blocked"], **NORM_PARAMS)
    want = [cross_map_norm_reference(x, **p), cross_map_norm_grad_reference(x, g, **p)]
    args = (x, g)
    if layout == "c01b":
        to = (1, 2, 3, 0)
        args = tuple(a.transpose(to) for a in args)
        want = [a.transpose(to) for a in want]
    # The second-order graph is PyTensor's own ops (CrossMapNormGrad's pullback
    # differentiates the forward written in PyTensor), which PyTensor 3.0's
    # other backends cannot run or take too long to compile: MLX's
    # IncSubtensor needs Python-int slice bounds, PyTorch's Pow dispatch
    # calls a missing torch.power, Numba compiles it for over ten minutes.
    second = backend in ("CC2OPS", "JAX")
    inputs, outputs = _norm_graph(case, second)
    got = _run(_compile(inputs, outputs, backend), *args)
    for label, a, b in zip(["forward", "pullback"], got, want, strict=False):
        _check(f"{case['id']} {label}", a, b, backend, dtype)
    if not second:
        return
    want2 = _second_order(("norm", case["id"]), lambda: _norm_graph(case), args)
    _check(f"{case['id']} second order wrt x", got[2], want2[2], backend, dtype, False)
    _check(f"{case['id']} second order wrt gy", got[3], want2[3], backend, dtype, False)


# --------------------------------------------------------------------------
# softmax loss and top-k error
# --------------------------------------------------------------------------

SOFTMAX_CASES = [
    dict(id="f64-labels", dtype="float64", b=5, k=7, soft=False, everywhere=True),
    dict(id="f32-labels-batch1-k1", dtype="float32", b=1, k=1, soft=False),
    dict(id="f64-soft", dtype="float64", b=4, k=3, soft=True, everywhere=True),
    dict(id="f32-soft", dtype="float32", b=3, k=5, soft=True),
]


#: Backends whose PyTensor 3.0 dispatch of PyTensor's own ops fails on the
#: softmax family's second-order graph (PyTorch: Elemwise's run-time broadcast
#: check on a Python-scalar constant; MLX: its scalar-op stack of a 0-d and a
#: 1-d array). The cc2ops ops in it are tested by the first-order outputs.
NO_SOFTMAX_SECOND_ORDER = ("PYTORCH", "MLX")


def _softmax_graph(case, second=True, target_grad=True):
    dtype = case["dtype"]
    b, k = case["b"], case["k"]
    # static shapes: PyTensor's MLX arange (in the second-order graph) needs them
    x = pt.matrix("x", dtype=dtype, shape=(b, k))
    g = pt.vector("g", dtype=dtype, shape=(b,))
    if case["soft"]:
        t = pt.matrix("t", dtype=dtype, shape=(b, k))
    else:
        t = pt.lvector("t", shape=(b,))
    loss = cc2ops.softmax_cross_entropy(x, t)
    wrt = [x, t] if case["soft"] and target_grad else [x]
    grads = pytensor.grad((loss * g).sum(), wrt)
    outs = [loss, *grads]
    if not case["soft"]:
        outs.append(cc2ops.top_k_error(x, t, k=2))
    if second:
        outs += pytensor.grad((grads[0] ** 2).sum(), [x, g])
    return [x, t, g], outs


def _softmax_data(case):
    r = np.random.default_rng(4)
    dtype, b, k = case["dtype"], case["b"], case["k"]
    x = (3 * r.normal(size=(b, k))).astype(dtype)
    if case["soft"]:
        t = r.dirichlet(np.ones(k), size=b).astype(dtype)
    else:
        t = r.integers(0, k, size=b).astype("int64")
    g = r.normal(size=b).astype(dtype)
    return x, t, g


@pytest.mark.parametrize("backend, case", _param_cases(SOFTMAX_CASES))
def test_softmax_loss_family(backend, case):
    dtype = case["dtype"]
    x, t, g = _softmax_data(case)
    second = backend not in NO_SOFTMAX_SECOND_ORDER
    # PyTensor 3.0's MLX dispatch cannot run -log_softmax(x) * g[:, None] (the
    # frontend's pullback wrt soft targets, no cc2ops op in it) at all
    target_grad = backend != "MLX"
    inputs, outputs = _softmax_graph(case, second, target_grad)
    got = _run(_compile(inputs, outputs, backend), x, t, g)
    want = [
        softmax_cross_entropy_reference(x, t),
        softmax_cross_entropy_grad_reference(g, x, t),
    ]
    if case["soft"] and target_grad:
        z = x - x.max(1, keepdims=True)
        log_softmax = z - np.log(np.exp(z).sum(1, keepdims=True))
        want.append(-log_softmax * g[:, None])
    labels = ["loss", "pullback wrt logits", "pullback wrt soft targets"]
    for label, a, b in zip(labels, got, want, strict=False):
        _check(f"{case['id']} {label}", a, b, backend, dtype)
    if not case["soft"]:
        n_first = len(want) + 1
        _check(f"{case['id']} top-2 error", got[n_first - 1],
               top_k_error_reference(x, t, 2), backend, dtype)  # fmt: skip
    else:
        n_first = len(want)
    if not second:
        return
    n = n_first
    want2 = _second_order(("sm", case["id"]), lambda: _softmax_graph(case), (x, t, g))
    _check(f"{case['id']} second order wrt x", got[n], want2[n], backend, dtype, False)
    _check(
        f"{case['id']} second order wrt g", got[n + 1], want2[n + 1], backend,
        dtype, False,
    )  # fmt: skip


@cache
def _bad_label_fn(backend):
    x = pt.matrix("x")
    y = pt.lvector("y")
    loss = cc2ops.softmax_cross_entropy(x, y)
    gx = pytensor.grad(loss.sum(), x)
    return _compile([x, y], [loss, gx, cc2ops.top_k_error(x, y)], backend)


@pytest.mark.parametrize("backend", _backend_params(["CC2OPS", "JAX", "MLX",
                                                     "PYTORCH"]))  # fmt: skip
def test_labels_out_of_range(backend):
    """numpy raises; the compiled backends give NaN rows (documented)."""
    x = np.zeros((3, 4))
    y = np.array([1, 4, -1])
    fn = _bad_label_fn(backend)
    if backend == "CC2OPS":
        with pytest.raises(ValueError, match=r"labels must be in \[0, K\) = \[0, 4\)"):
            fn(x, y)
        return
    loss, gx, err = _run(fn, x, y)
    assert np.isfinite(loss[0]) and np.isnan(loss[1:]).all(), loss
    assert np.isfinite(gx[0]).all() and np.isnan(gx[1:]).all(), gx
    assert err[0] == 0 and np.isnan(err[1:]).all(), err


# --------------------------------------------------------------------------
# dropout
# --------------------------------------------------------------------------


def _dropout_params():
    out = []
    for p in _backend_params(ALL):
        # the slow-compiling backends once; the masks do not depend on dtype
        for dtype in ["float64", "float32"] if p.values[0] in QUICK else ["float32"]:
            out.append(pytest.param(p.values[0], dtype, marks=p.marks,
                                    id=f"{p.id}-{dtype}"))  # fmt: skip
    return out


@pytest.mark.parametrize("backend, dtype", _dropout_params())
def test_dropout_masks(backend, dtype):
    """Bit-identical masks, the state's advance and the gradient's mask."""
    state = cc2ops.dropout_state(2**40 + 12345)
    # counter_lo just below 2**32: the second call's blocks carry into hi
    state.set_value(np.array([12345, 256, 2**32 - 3, 7], dtype=np.uint32))
    x = pt.tensor3("x", dtype=dtype)
    g = pt.tensor3("g", dtype=dtype)
    p = 0.375
    y = cc2ops.dropout(x, p, state)
    gx = pytensor.grad((y * g).sum(), x)
    fn = _compile([x, g], [y, gx], backend)
    r = np.random.default_rng(5)
    shape = (3, 5, 7)  # 105 elements: not a multiple of 4
    xv = r.normal(size=shape).astype(dtype)
    gv = r.normal(size=shape).astype(dtype)
    s = state.get_value().copy()
    for call in range(2):
        yv, gxv = _run(fn, xv, gv)
        mask = dropout_mask_reference(s, xv.size, p).reshape(shape)
        scale = dropout_scale(p, dtype)
        np.testing.assert_array_equal(yv != 0, mask, err_msg=f"{backend} call {call}")
        np.testing.assert_allclose(
            yv, np.where(mask, xv * scale, 0), **_tol(backend, dtype)
        )
        np.testing.assert_allclose(
            gxv, np.where(mask, gv * scale, 0), **_tol(backend, dtype)
        )
        s = advance_state(s, xv.size)
        np.testing.assert_array_equal(np.asarray(state.get_value()), s)


# --------------------------------------------------------------------------
# registration and the static-shape rewrite
# --------------------------------------------------------------------------


def _frontend_ops() -> set[type]:
    import importlib

    from cc2ops._op import Cc2Op

    out = set()
    # by module name: the attributes cc2ops.cross_map_norm,
    # cc2ops.softmax_cross_entropy and cc2ops.dropout are the builders
    for name in ("conv", "pool", "cross_map_norm", "softmax_cross_entropy", "dropout"):
        mod = importlib.import_module(f"cc2ops.{name}")
        for v in vars(mod).values():
            if (
                isinstance(v, type)
                and issubclass(v, Cc2Op)
                and v.__module__ == mod.__name__
                and not v.__name__.startswith("_")
            ):
                out.add(v)
    return out


def test_every_frontend_op_has_a_backend_body():
    assert _frontend_ops() <= set(_generic.BUILDERS), _frontend_ops() - set(
        _generic.BUILDERS
    )


@pytest.mark.parametrize(
    "backend, dispatch",
    [
        pytest.param(
            n, d, marks=[pytest.mark.skip(reason=r)] if (r := _importable(lib)) else []
        )
        for n, d, lib in [
            ("JAX", "pytensor.link.jax.dispatch:jax_funcify", "jax"),
            ("PYTORCH", "pytensor.link.pytorch.dispatch:pytorch_funcify", "torch"),
            ("MLX", "pytensor.link.mlx.dispatch:mlx_funcify", "mlx.core"),
        ]
    ],
)
def test_dispatch_registered_by_the_hook(backend, dispatch):
    module, name = dispatch.split(":")
    funcify = getattr(importlib.import_module(module), name)
    default = funcify.dispatch(object)
    for cls in _generic.BUILDERS:
        assert funcify.dispatch(cls) is not default, f"{backend}: {cls.__name__}"
    assert f"cc2ops.backends.{backend.lower()}" in sys.modules


def test_broken_backend_module_fails_loudly(monkeypatch):
    monkeypatch.setitem(backends.BACKENDS, "broken", "json")
    monkeypatch.setitem(sys.modules, "cc2ops.backends.broken", None)
    with pytest.raises(
        ImportError, match=r"cc2ops.backends.broken failed to import after json"
    ):
        backends._loader("broken")(None)


jax_only = pytest.mark.skipif(
    _importable("jax") is not None, reason=str(_importable("jax"))
)


def _hw_input(fn, op_type):
    (node,) = [n for n in fn.maker.fgraph.apply_nodes if isinstance(n.op, op_type)]
    i = 1 if op_type is AvgPoolGrad else 2
    return node.inputs[i]


@jax_only
def test_static_shape_rewrite_shape_vector_and_constant():
    x = pt.tensor4("x")  # shape unknown until JAX traces
    w = pytensor.shared(np.ones((2, 3, 3, 3)), name="w", shape=(2, 3, 3, 3))
    y = cc2ops.avg_pool2d(cc2ops.conv2d(x, w, padding=1), 2)
    gx, gw = pytensor.grad((y**2).sum(), [x, w])
    fn = _compile([x], [gx, gw], "JAX")
    hw = _hw_input(fn, ImageActs)
    assert isinstance(hw.owner.op, ShapeVector) and hw.owner.op.axes == (2, 3)
    assert isinstance(_hw_input(fn, WeightActs), Constant)
    assert isinstance(_hw_input(fn, AvgPoolGrad).owner.op, ShapeVector)
    xv = np.random.default_rng(6).normal(size=(2, 3, 5, 4))
    want = _run(_compile([x], [gx, gw], "CC2OPS"), xv)
    for a, b in zip(_run(fn, xv), want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    # static image shape: every (H, W) input becomes a constant
    xs = pt.tensor4("xs", shape=(2, 3, 5, 4))
    gxs = pytensor.grad((cc2ops.conv2d(xs, w, padding=1) ** 2).sum(), xs)
    assert isinstance(_hw_input(_compile([xs], gxs, "JAX"), ImageActs), Constant)


@jax_only
def test_static_shape_rewrite_only_in_jax_and_mlx_modes():
    x = pt.tensor4("x")
    w = pt.tensor4("w")
    gx = pytensor.grad((cc2ops.conv2d(x, w) ** 2).sum(), x)
    fn = _compile([x, w], gx, "CC2OPS")
    assert not any(isinstance(n.op, ShapeVector) for n in fn.maker.fgraph.apply_nodes)


@jax_only
def test_non_static_shape_input_names_the_op():
    dy = pt.tensor4("dy")
    w = pt.tensor4("w")
    hw = pt.lvector("hw")  # data, not a shape: JAX cannot trace with it
    dx = ImageActs(stride=1, padding=0, groups=1)(dy, w, hw)
    with pytest.raises(ValueError, match="ImageActs: image_hw must be static for JAX"):
        _compile([dy, w, hw], dx, "JAX")


# --------------------------------------------------------------------------
# the fast_run softmax-loss fusion in JAX / PyTorch mode
# --------------------------------------------------------------------------


def _handwritten_model():
    """A cc2ops-free model: ``-log(softmax(X @ W))[arange(n), y].mean()``."""
    X = pt.matrix("X")
    y = pt.lvector("y")
    W = pytensor.shared(
        np.random.default_rng(7).normal(size=(4, 3)), name="W", shape=(4, 3)
    )
    p = softmax(X @ W, axis=-1)
    loss = -pt.log(p)[pt.arange(X.shape[0]), y].mean()
    return [X, y], [loss, pytensor.grad(loss, W)]


@pytest.mark.parametrize("backend", _backend_params(["JAX", "PYTORCH"]))
def test_handwritten_softmax_loss_compiles_after_import(backend):
    inputs, outputs = _handwritten_model()
    fused = _compile(inputs, outputs, backend)
    ops = {type(n.op) for n in fused.maker.fgraph.apply_nodes}
    # the fusion fired, and the fused ops run on this backend
    assert SoftmaxCrossEntropy in ops and SoftmaxCrossEntropyGrad in ops, ops
    plain = pytensor.function(
        inputs,
        outputs,
        mode=get_mode(backend).excluding("cc2ops_fuse_softmax_loss"),
    )
    assert not any(
        isinstance(n.op, SoftmaxCrossEntropy) for n in plain.maker.fgraph.apply_nodes
    )
    r = np.random.default_rng(8)
    X = r.normal(size=(6, 4))
    y = r.integers(0, 3, size=6)
    try:
        want = _run(plain, X, y)
    except Exception as e:  # noqa: BLE001 - the backend itself, not cc2ops
        pytest.skip(
            f"{backend} cannot run this cc2ops-free graph without the fusion "
            f"either (PyTensor's own dispatch): {type(e).__name__}: {e}"
        )
    for a, b in zip(_run(fused, X, y), want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
