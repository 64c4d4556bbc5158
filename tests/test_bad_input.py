"""Bad input to every public builder and every op's ``make_node``, as a table.

The promise (STYLE.md): a wrong type or dtype raises ``TypeError``, a wrong
shape or parameter ``ValueError``, and the message names the op, the rule and
the value. Issue 20 found inputs that escaped it (``None`` given to
``conv2d`` raised PyTensor's ``NotImplementedError`` naming neither op nor
input; ``dropout(x, p="0.5")`` was parsed; ``p=False`` was read as 0; a
negative ``image_hw`` quoted the pooling ``start`` rule). Each row below gives
the call, the exception class and the exact text the message must contain.
The family test files keep their own, finer checks (shapes known only at run
time, references).
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import TEST_MODE, expect_error

from cc2ops import (
    AvgPool,
    AvgPoolGrad,
    CrossMapNorm,
    CrossMapNormGrad,
    FilterActs,
    ImageActs,
    MaxPool,
    MaxPoolGrad,
    MaxPoolGradGrad,
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyGrad,
    TopKError,
    WeightActs,
    avg_pool2d,
    conv2d,
    cross_map_norm,
    dropout,
    dropout_state,
    max_pool2d,
    softmax_cross_entropy,
    top_k_error,
)
from cc2ops.dropout import Dropout, DropoutAdvance

B01 = "(B, C, H, W)"
FILT = "(F, C/groups, kh, kw)"
GRAD = "(B, F, Ho, Wo)"
BK = "(B, K)"


def t4(dtype="float64"):
    return pt.tensor4(dtype=dtype)


def lv():
    return pt.lvector()


# (op in the message, role, axes, ndim, build(bad)) of every float tensor input
FLOAT_INPUTS = [
    ("conv2d", "images", B01, 4, lambda b: conv2d(b, t4())),
    ("conv2d", "filters", FILT, 4, lambda b: conv2d(t4(), b)),
    ("FilterActs", "images", B01, 4, lambda b: FilterActs()(b, t4())),
    ("FilterActs", "filters", FILT, 4, lambda b: FilterActs()(t4(), b)),
    ("ImageActs", "gradient", GRAD, 4, lambda b: ImageActs()(b, t4(), lv())),
    ("ImageActs", "filters", FILT, 4, lambda b: ImageActs()(t4(), b, lv())),
    ("WeightActs", "images", B01, 4, lambda b: WeightActs()(b, t4(), lv())),
    ("WeightActs", "gradient", GRAD, 4, lambda b: WeightActs()(t4(), b, lv())),
    ("MaxPool", "images", B01, 4, lambda b: max_pool2d(b, 2)),
    ("MaxPool", "images", B01, 4, lambda b: MaxPool(size=2)(b)),
    ("MaxPoolGrad", "images", B01, 4, lambda b: MaxPoolGrad(size=2)(b, t4(), t4())),
    (
        "MaxPoolGrad",
        "pooled output",
        B01,
        4,
        lambda b: MaxPoolGrad(size=2)(t4(), b, t4()),
    ),
    (
        "MaxPoolGrad",
        "output gradient",
        B01,
        4,
        lambda b: MaxPoolGrad(size=2)(t4(), t4(), b),
    ),
    (
        "MaxPoolGradGrad",
        "input gradient",
        B01,
        4,
        lambda b: MaxPoolGradGrad(size=2)(t4(), t4(), b),
    ),
    ("AvgPool", "images", B01, 4, lambda b: avg_pool2d(b, 2)),
    ("AvgPool", "images", B01, 4, lambda b: AvgPool(size=2)(b)),
    ("AvgPoolGrad", "output gradient", B01, 4, lambda b: AvgPoolGrad(size=2)(b, lv())),
    ("CrossMapNorm", "x", B01, 4, lambda b: cross_map_norm(b)),
    ("CrossMapNorm", "x", B01, 4, lambda b: CrossMapNorm()(b)),
    ("CrossMapNormGrad", "x", B01, 4, lambda b: CrossMapNormGrad()(b, t4())),
    ("CrossMapNormGrad", "gy", B01, 4, lambda b: CrossMapNormGrad()(t4(), b)),
    (
        "SoftmaxCrossEntropy",
        "logits",
        BK,
        2,
        lambda b: softmax_cross_entropy(b, lv()),
    ),
    ("SoftmaxCrossEntropy", "logits", BK, 2, lambda b: SoftmaxCrossEntropy()(b, lv())),
    (
        "SoftmaxCrossEntropyGrad",
        "g",
        "(B,)",
        1,
        lambda b: SoftmaxCrossEntropyGrad()(b, pt.matrix(), lv()),
    ),
    (
        "SoftmaxCrossEntropyGrad",
        "logits",
        BK,
        2,
        lambda b: SoftmaxCrossEntropyGrad()(pt.vector(), b, lv()),
    ),
    ("TopKError", "logits", BK, 2, lambda b: top_k_error(b, lv())),
    ("TopKError", "logits", BK, 2, lambda b: TopKError()(b, lv())),
    # dropout takes any number of dims: no ndim row
    ("dropout", "x", "", None, lambda b: dropout(b, 0.5, dropout_state(0))),
    ("dropout", "x", "", None, lambda b: dropout(b, 0.0, dropout_state(0))),
    ("Dropout", "x", "", None, lambda b: Dropout(0.5)(b, dropout_state(0))),
]

# (op, role, axes, build(bad)) of the integer (H, W)-style vectors
INT_VECTORS = [
    ("ImageActs", "image_hw", "(H, W)", lambda b: ImageActs()(t4(), t4(), b)),
    ("WeightActs", "filter_hw", "(kh, kw)", lambda b: WeightActs()(t4(), t4(), b)),
    ("AvgPoolGrad", "image_hw", "(H, W)", lambda b: AvgPoolGrad(size=2)(t4(), b)),
]

# what is not a tensor at all, and the message's "got ..." text for it
NOT_TENSORS = [
    (None, "got NoneType None"),
    ("abc", "got str 'abc'"),
    ({"a": 1}, "got dict {'a': 1}"),
    (["a", "b"], "got list ['a', 'b']"),
    (object(), "got object <object object"),
]

TENSOR_RULE = "must be a tensor (a PyTensor variable or numeric array)"


def _not_a_tensor_cases(table):
    for op, role, *_, build in table:
        for bad, got in NOT_TENSORS:
            text = f"{op}: {role} {TENSOR_RULE}, {got}"
            yield pytest.param(build, bad, TypeError, text, id=f"{op}-{role}-{got}")


def _float_cases():
    for op, role, axes, ndim, build in FLOAT_INPUTS:
        n = 4 if ndim is None else ndim
        for dtype in ("complex128", "int32", "bool", "uint8"):
            yield pytest.param(
                build,
                pt.tensor(dtype=dtype, shape=(None,) * n),
                TypeError,
                f"{op}: {role} must be float32 or float64, got {dtype}",
                id=f"{op}-{role}-{dtype}",
            )
        if ndim is not None:
            wrong = 3 if ndim == 4 else ndim + 1
            dims = "dim" if ndim == 1 else "dims"
            yield pytest.param(
                build,
                pt.tensor(dtype="float64", shape=(None,) * wrong),
                TypeError,
                f"{op}: {role} must have {ndim} {dims} {axes}, got {wrong}",
                id=f"{op}-{role}-ndim{wrong}",
            )


def _int_vector_cases():
    for op, role, axes, build in INT_VECTORS:
        rows = [
            (pt.vector(), TypeError, "must have an integer dtype, got float64"),
            (pt.lmatrix(), TypeError, f"must have 1 dim {axes}, got 2"),
            ([4, 4, 4], ValueError, f"must have 2 entries {axes}, got 3"),
            ([True, 3], TypeError, f"{TENSOR_RULE}; bools are not numbers here"),
            ([2.0, 3.0], TypeError, "must have an integer dtype, got float64"),
        ]
        for bad, exc, text in rows:
            yield pytest.param(
                build, bad, exc, f"{op}: {role} {text}", id=f"{op}-{role}-{bad}"
            )
    # a negative or zero size is reported as such, not through another rule
    yield pytest.param(
        INT_VECTORS[0][3],
        [-1, 5],
        ValueError,
        "ImageActs: image_hw must be >= 1, got (-1, 5)",
        id="ImageActs-negative",
    )
    yield pytest.param(
        INT_VECTORS[1][3],
        [3, 0],
        ValueError,
        "WeightActs: filter_hw must be >= 1, got (3, 0)",
        id="WeightActs-zero",
    )
    yield pytest.param(
        INT_VECTORS[2][3],
        [-1, 5],
        ValueError,
        "AvgPoolGrad: image_hw (H, W) must be >= 1, got (-1, 5)",
        id="AvgPoolGrad-negative",
    )


# the other non-float tensor inputs: labels, targets, the dropout state, n
OTHER_INPUTS = [
    (
        "SoftmaxCrossEntropy",
        "targets",
        lambda b: softmax_cross_entropy(pt.matrix(), b),
    ),
    ("SoftmaxCrossEntropy", "targets", lambda b: SoftmaxCrossEntropy()(pt.matrix(), b)),
    (
        "SoftmaxCrossEntropyGrad",
        "targets",
        lambda b: SoftmaxCrossEntropyGrad()(pt.vector(), pt.matrix(), b),
    ),
    ("TopKError", "labels", lambda b: top_k_error(pt.matrix(), b)),
    ("TopKError", "labels", lambda b: TopKError()(pt.matrix(), b)),
    ("Dropout", "state", lambda b: Dropout(0.5)(t4(), b)),
    ("DropoutAdvance", "state", lambda b: DropoutAdvance()(b, 3)),
    ("DropoutAdvance", "n", lambda b: DropoutAdvance()(dropout_state(0), b)),
]

TARGETS = "targets must be integer labels (B,) or float32/float64 probabilities (B, K)"
STATE = "state must be the uint32 vector of dropout_state(), got"
OTHER_CASES = [
    (OTHER_INPUTS[0][2], pt.zvector(), TypeError, f"{TARGETS}, got dtype complex128"),
    (
        OTHER_INPUTS[1][2],
        pt.tensor(dtype="bool", shape=(None,)),
        TypeError,
        "got dtype bool",
    ),
    (
        OTHER_INPUTS[0][2],
        pt.lmatrix(),
        TypeError,
        "SoftmaxCrossEntropy: integer targets (labels) must have 1 dim (B,), got 2",
    ),
    (
        OTHER_INPUTS[2][2],
        pt.tensor3(),
        TypeError,
        "SoftmaxCrossEntropyGrad: float targets (probabilities) must have 2 dims "
        "(B, K), got 3",
    ),
    (
        OTHER_INPUTS[3][2],
        pt.vector(),
        TypeError,
        "TopKError: labels must have an integer dtype, got float64",
    ),
    (
        OTHER_INPUTS[4][2],
        pt.zvector(),
        TypeError,
        "TopKError: labels must have an integer dtype, got complex128",
    ),
    (
        OTHER_INPUTS[4][2],
        pt.lmatrix(),
        TypeError,
        "TopKError: labels must have 1 dim (B,), got 2",
    ),
    (OTHER_INPUTS[5][2], pt.lvector(), TypeError, f"Dropout: {STATE} Vector(int64"),
    (
        OTHER_INPUTS[6][2],
        pt.matrix(dtype="uint32"),
        TypeError,
        f"DropoutAdvance: {STATE} Matrix(uint32",
    ),
    (
        OTHER_INPUTS[7][2],
        pt.dscalar(),
        TypeError,
        "DropoutAdvance: n must be an integer scalar (the element count), got "
        "Scalar(float64",
    ),
    (
        OTHER_INPUTS[7][2],
        pt.lvector(),
        TypeError,
        "DropoutAdvance: n must be an integer scalar (the element count), got "
        "Vector(int64",
    ),
    (
        OTHER_INPUTS[7][2],
        True,
        TypeError,
        f"DropoutAdvance: n {TENSOR_RULE}, got bool True",
    ),
]


TENSOR_CASES = [
    *_not_a_tensor_cases(FLOAT_INPUTS),
    *_not_a_tensor_cases(INT_VECTORS),
    *_not_a_tensor_cases(OTHER_INPUTS),
    *_float_cases(),
    *_int_vector_cases(),
    *(
        pytest.param(build, bad, exc, text, id=f"other-{i}")
        for i, (build, bad, exc, text) in enumerate(OTHER_CASES)
    ),
]


@pytest.mark.parametrize("build, bad, exc, text", TENSOR_CASES)
def test_bad_tensor_input(build, bad, exc, text):
    with pytest.raises(exc) as info:
        build(bad)
    assert text in str(info.value), f"message {str(info.value)!r} lacks {text!r}"


def test_table_covers_every_builder_and_op():
    # the tables above name every public builder and op of the CPU frontend
    import cc2ops

    named = {row[0] for row in FLOAT_INPUTS + INT_VECTORS + OTHER_INPUTS}
    ops = {n for n in cc2ops.__all__ if isinstance(getattr(cc2ops, n), type)}
    assert ops <= named, ops - named
    builders = {
        "conv2d": "conv2d",
        "max_pool2d": "MaxPool",
        "avg_pool2d": "AvgPool",
        "cross_map_norm": "CrossMapNorm",
        "softmax_cross_entropy": "SoftmaxCrossEntropy",
        "top_k_error": "TopKError",
        "dropout": "dropout",
    }
    assert set(builders.values()) <= named
    assert {"Dropout", "DropoutAdvance"} <= named


# --------------------------------------------------------------------------
# parameters: ints where ints are meant, real numbers where numbers are meant,
# bools never standing in for either
# --------------------------------------------------------------------------

X4 = pt.tensor4()


def _p(build, exc, text, id):
    return pytest.param(build, exc, text, id=id)


def _int_param_cases():
    # (op in the message, name, build(value), minimum, rule shown for pairs)
    int_params = [
        ("FilterActs", "stride", lambda v: conv2d(X4, X4, stride=v), 1, True),
        ("FilterActs", "padding", lambda v: conv2d(X4, X4, padding=v), 0, True),
        ("ImageActs", "stride", lambda v: ImageActs(stride=v), 1, True),
        ("WeightActs", "padding", lambda v: WeightActs(padding=v), 0, True),
        ("MaxPool", "size", lambda v: max_pool2d(X4, v), 1, True),
        ("MaxPool", "stride", lambda v: max_pool2d(X4, 2, stride=v), 1, True),
        ("AvgPool", "start", lambda v: avg_pool2d(X4, 2, start=v), None, True),
        ("MaxPoolGrad", "size", lambda v: MaxPoolGrad(size=v), 1, True),
        ("AvgPoolGrad", "stride", lambda v: AvgPoolGrad(size=2, stride=v), 1, True),
        ("FilterActs", "groups", lambda v: conv2d(X4, X4, groups=v), 1, False),
        ("CrossMapNorm", "size", lambda v: cross_map_norm(X4, size=v), 1, False),
        ("CrossMapNormGrad", "size", lambda v: CrossMapNormGrad(size=v), 1, False),
        ("TopKError", "k", lambda v: top_k_error(pt.matrix(), lv(), k=v), 1, False),
        ("TopKError", "k", lambda v: TopKError(k=v), 1, False),
    ]
    for op, name, build, minimum, pairs in int_params:
        kind = "an int or a pair of ints" if pairs else "an int"
        for bad in (True, False, "2", 2.0, 2.5, float("nan"), None, [1, 2, 3]):
            if bad is None and name == "stride" and "Pool" in op:
                continue  # stride=None means stride = size
            yield _p(
                lambda b=build, v=bad: b(v),
                TypeError,
                f"{op}: {name} must be {kind}, got {bad!r}",
                f"{op}-{name}-{bad!r}",
            )
        if pairs:
            yield _p(
                lambda b=build: b((True, 1)),
                TypeError,
                f"{op}: {name} must be {kind}, got (True, 1)",
                f"{op}-{name}-pair-with-bool",
            )
        if minimum is not None:
            # the pooling rules quote the (rows, cols) pair they check
            got = "(-1, -1)" if "Pool" in op else "-1"
            yield _p(
                lambda b=build: b(-1),
                ValueError,
                f"{op}: {name} must be >= {minimum}, got {got}",
                f"{op}-{name}-negative",
            )
    yield _p(
        lambda: avg_pool2d(X4, 2, start=-2),
        ValueError,
        "AvgPool: start (-2) must be > -size (-2) so the first window holds a pixel",
        "AvgPool-start-too-negative",
    )


def _real_param_cases():
    real_params = [
        ("CrossMapNorm", "alpha", lambda v: cross_map_norm(X4, alpha=v)),
        ("CrossMapNorm", "beta", lambda v: cross_map_norm(X4, beta=v)),
        ("CrossMapNorm", "k", lambda v: CrossMapNorm(k=v)),
        ("CrossMapNormGrad", "alpha", lambda v: CrossMapNormGrad(alpha=v)),
    ]
    for op, name, build in real_params:
        for bad in (True, False, "1.0", None, [1.0]):
            yield _p(
                lambda b=build, v=bad: b(v),
                TypeError,
                f"{op}: {name} must be a real number, got {bad!r}",
                f"{op}-{name}-{bad!r}",
            )
        for bad in (float("nan"), float("inf")):
            yield _p(
                lambda b=build, v=bad: b(v),
                ValueError,
                f"{op}: {name} must be finite, got {bad!r}",
                f"{op}-{name}-{bad!r}",
            )
    yield _p(
        lambda: cross_map_norm(X4, alpha=-1.0),
        ValueError,
        "CrossMapNorm: alpha must be >= 0 (with k > 0 that keeps the denominator "
        "positive for every input), got -1.0",
        "CrossMapNorm-alpha-negative",
    )
    yield _p(
        lambda: cross_map_norm(X4, k=-2),
        ValueError,
        "CrossMapNorm: k must be > 0 so the denominator is positive, got -2",
        "CrossMapNorm-k-negative",
    )
    for bad in (1, 0, None, "yes"):
        yield _p(
            lambda v=bad: cross_map_norm(X4, blocked=v),
            TypeError,
            f"CrossMapNorm: blocked must be a bool, got {bad!r}",
            f"CrossMapNorm-blocked-{bad!r}",
        )


def _dropout_param_cases():
    rule = (
        "p must be a real number (int, float or NumPy scalar; not a bool or a "
        "string) with 0 <= p < 1, got"
    )
    for op, build in (
        ("dropout", lambda v: dropout(X4, v, dropout_state(0))),
        ("Dropout", lambda v: Dropout(v)),
    ):
        for bad, got in (
            ("0.5", "str '0.5'"),
            (False, "bool False"),
            (True, "bool True"),
            (np.bool_(False), f"bool {np.bool_(False)!r}"),
            (None, "NoneType None"),
            ([0.5], "list [0.5]"),
            (np.array(0.5), "ndarray array(0.5)"),
        ):
            yield _p(
                lambda b=build, v=bad: b(v),
                TypeError,
                f"{op}: {rule} {got}",
                f"{op}-p-{got}",
            )
        for bad in (1, 1.0, -0.1, float("nan"), np.float32(1.5)):
            yield _p(
                lambda b=build, v=bad: b(v),
                ValueError,
                f"{op}: p must satisfy 0 <= p < 1, got {bad!r}",
                f"{op}-p-{bad!r}",
            )
    for bad in (True, "7", 7.0, None):
        yield _p(
            lambda v=bad: dropout_state(v),
            TypeError,
            f"dropout_state: seed must be an int, got {type(bad).__name__} {bad!r}",
            f"dropout_state-seed-{bad!r}",
        )
    yield _p(
        lambda: dropout_state(2**64),
        ValueError,
        f"dropout_state: seed must satisfy 0 <= seed < 2**64, got {2**64}",
        "dropout_state-seed-too-large",
    )
    for bad in (True, "0", 0.0):
        yield _p(
            lambda v=bad: dropout_state(0, device=v),
            TypeError,
            "dropout_state: device must be None or an int device label, got "
            f"{type(bad).__name__} {bad!r}",
            f"dropout_state-device-{bad!r}",
        )
    yield _p(
        lambda: dropout_state(0, name=3),
        TypeError,
        "dropout_state: name must be None or a str, got int 3",
        "dropout_state-name",
    )


def _layout_cases():
    rule = "layout must be one of ('bc01', 'c01b'), got"
    for op, build in (
        ("conv2d", lambda v: conv2d(X4, X4, layout=v)),
        ("MaxPool", lambda v: max_pool2d(X4, 2, layout=v)),
        ("AvgPool", lambda v: avg_pool2d(X4, 2, layout=v)),
        ("CrossMapNorm", lambda v: cross_map_norm(X4, layout=v)),
    ):
        for bad in ("bchw", None, True):
            yield _p(
                lambda b=build, v=bad: b(v),
                ValueError,
                f"{op}: {rule} {bad!r}",
                f"{op}-layout-{bad!r}",
            )


PARAM_CASES = [
    *_int_param_cases(),
    *_real_param_cases(),
    *_dropout_param_cases(),
    *_layout_cases(),
]


@pytest.mark.parametrize("build, exc, text", PARAM_CASES)
def test_bad_parameter(build, exc, text):
    with pytest.raises(exc) as info:
        build()
    assert text in str(info.value), f"message {str(info.value)!r} lacks {text!r}"


def test_bad_shape_inputs_at_run_time():
    # shape vectors known only when the function runs get the same messages
    gy, hw = pt.tensor4("gy"), pt.lvector("hw")
    fn = pytensor.function([gy, hw], AvgPoolGrad(size=2)(gy, hw), mode=TEST_MODE)
    for bad in ([-1, 5], [0, 0]):
        expect_error(
            ValueError,
            f"AvgPoolGrad: image_hw (H, W) must be >= 1, got {tuple(bad)}",
            fn,
            np.zeros((1, 1, 2, 2)),
            np.array(bad),
        )
    dy, w = pt.tensor4("dy"), pt.tensor4("w")
    fn = pytensor.function([dy, w, hw], ImageActs()(dy, w, hw), mode=TEST_MODE)
    expect_error(
        ValueError,
        "ImageActs: image_hw must be >= 1, got (-1, 5)",
        fn,
        np.zeros((1, 1, 2, 2)),
        np.zeros((1, 1, 2, 2)),
        np.array([-1, 5]),
    )
    x = pt.tensor4("x")
    fn = pytensor.function([x, dy, hw], WeightActs()(x, dy, hw), mode=TEST_MODE)
    expect_error(
        ValueError,
        "WeightActs: filter_hw must be >= 1, got (0, 2)",
        fn,
        np.zeros((1, 1, 3, 3)),
        np.zeros((1, 1, 2, 2)),
        np.array([0, 2]),
    )


def test_empty_static_image_names_the_size_rule():
    # a static image with no rows: the rule is the image size, not `start`
    x = pt.tensor("x", shape=(1, 1, 0, 4))
    with pytest.raises(ValueError) as info:
        max_pool2d(x, 2)
    assert "MaxPool: the image rows (0) must be >= 1" in str(info.value)
