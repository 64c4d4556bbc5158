"""GPU softmax cross-entropy and top-k error: lifting, validation (CPU); values (GPU).

GPU tests (``gpu`` marker) compare with :mod:`cc2ops.softmax_cross_entropy`'s
references for K = 1, 7, 1000, 21841, labels 0 and K-1, soft targets, logits
of magnitude 1e4, NaN-poisoned outputs (``CC2OPS_DEBUG=1``); labels outside
``[0, K)`` raise; ``verify_grad`` runs through the GPU ops in
``cc2ops.cuda.mode()``. The forward's split rows (``test_forward_split_*``)
are checked against the float64 reference for forced and automatic chunk
counts, aligned and misaligned rows and base pointers, reuse of the
workspace over launches and CUDA-graph replays, and bad labels. CPU tests
cover the host's choice of chunks and load width.
"""

from __future__ import annotations

import functools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import close as gpu_close
from helpers import rng, to_gpu
from pytensor.compile.aliasing import add_supervisor_to_fgraph
from pytensor.compile.io import SymbolicInput
from pytensor.gradient import verify_grad
from pytensor.graph.basic import Constant
from pytensor.graph.fg import FunctionGraph

import cc2ops.cuda as cuda
from cc2ops.cuda.ops import softmax_cross_entropy as gsl
from cc2ops.cuda.ops.softmax_cross_entropy import (
    GpuSoftmaxCrossEntropy,
    GpuSoftmaxCrossEntropyGrad,
    GpuTopKError,
    block_size,
    softmax_cross_entropy_kernel_name,
)
from cc2ops.cuda.type import CudaArrayType
from cc2ops.softmax_cross_entropy import (
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyGrad,
    TopKError,
    softmax_cross_entropy,
    softmax_cross_entropy_grad_reference,
    softmax_cross_entropy_reference,
    top_k_error,
    top_k_error_reference,
)

close = functools.partial(gpu_close, tol32=2e-6)

HOST_OPS = {SoftmaxCrossEntropy, SoftmaxCrossEntropyGrad, TopKError}


def gvar(shape=(None, None), dtype="float32", device=0, name="x"):
    return CudaArrayType(dtype, shape, device)(name)


def lifted(outputs):
    outs = outputs if isinstance(outputs, list) else [outputs]
    fg = FunctionGraph(outputs=outs, clone=False)
    add_supervisor_to_fgraph(
        fg, [SymbolicInput(v) for v in fg.inputs if not isinstance(v, Constant)]
    )
    cuda.mode().optimizer.rewrite(fg)
    return fg


def op_types(fg):
    return {type(n.op) for n in fg.apply_nodes}


# --------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------


@pytest.mark.parametrize("soft", [False, True])
def test_loss_and_gradient_lift(soft):
    x = gvar()
    t = gvar(dtype="float32", name="t") if soft else gvar((None,), "int64", name="y")
    loss = softmax_cross_entropy(cuda.host_from_gpu(x), cuda.host_from_gpu(t))
    wrt = [x, t] if soft else [x]
    grads = pytensor.grad(loss.mean(), wrt)
    fg = lifted([cuda.gpu_from_host(loss, 0), *grads])
    types = op_types(fg)
    assert {GpuSoftmaxCrossEntropy, GpuSoftmaxCrossEntropyGrad} <= types, types
    assert not types & HOST_OPS, types
    assert grads[0].type == x.type


def test_top_k_error_lifts():
    x, y = gvar(), gvar((None,), "int32", name="y")
    err = top_k_error(cuda.host_from_gpu(x), cuda.host_from_gpu(y), k=5)
    fg = lifted([cuda.gpu_from_host(err, 0)])
    assert fg.outputs[0].owner.op == GpuTopKError(k=5)
    assert GpuTopKError.__props__ == TopKError.__props__


def test_host_labels_are_uploaded_when_the_logits_live_on_the_gpu():
    x = gvar()
    y = pt.lvector("y")
    loss = SoftmaxCrossEntropy()(cuda.host_from_gpu(x), y)
    fg = lifted([cuda.gpu_from_host(loss, 0)])
    node = fg.outputs[0].owner
    assert isinstance(node.op, GpuSoftmaxCrossEntropy)
    assert node.inputs[1].owner.inputs[0] is y


def test_grad_of_grad_builds():
    x, t = gvar(dtype="float64"), gvar(dtype="float64", name="t")
    loss = GpuSoftmaxCrossEntropy()(x, t)
    g = pytensor.grad(cuda.host_from_gpu(loss).sum(), x)
    gg = pytensor.grad((cuda.host_from_gpu(g) ** 2).sum(), [x, t])
    assert all(v.type.ndim == 2 and v.type.dtype == "float64" for v in gg)


def test_grad_of_grad_with_int_labels_builds():
    # the labels' cotangent is disconnected: the GPU gradient op's pullback
    # must pass it through (it once asked a DisconnectedType for its dtype)
    x = gvar(dtype="float64")
    y = CudaArrayType("int64", (None,), 0)("y")
    g = GpuSoftmaxCrossEntropyGrad()(gvar((None,), dtype="float64", name="g"), x, y)
    gx = pytensor.grad((cuda.host_from_gpu(g) ** 2).sum(), x)
    assert gx.type.ndim == 2 and gx.type.dtype == "float64"
    with pytest.raises(pytensor.gradient.DisconnectedInputError):
        pytensor.grad((cuda.host_from_gpu(g) ** 2).sum(), y)


def test_make_node_errors_and_shapes():
    f = GpuSoftmaxCrossEntropy()
    with pytest.raises(TypeError, match="GpuSoftmaxCrossEntropy: logits must be a GPU"):
        f(pt.matrix(), gvar((None,), "int64"))
    with pytest.raises(TypeError, match=r"logits must have 2 dims \(B, K\), got 1"):
        f(gvar((None,)), gvar((None,), "int64"))
    with pytest.raises(ValueError, match=r"at least one class \(K >= 1\)"):
        f(gvar((3, 0)), gvar((3,), "int64"))
    with pytest.raises(TypeError, match=r"integer targets \(labels\) must have 1 dim"):
        f(gvar(), gvar((None, None), "int64"))
    with pytest.raises(TypeError, match="inputs must share one float dtype"):
        f(gvar(), gvar(dtype="float64"))
    with pytest.raises(ValueError, match="labels must match the logits"):
        f(gvar((3, 5)), gvar((4,), "int64"))
    with pytest.raises(ValueError, match="soft targets must match the logits"):
        f(gvar((3, 5)), gvar((3, 6)))
    with pytest.raises(TypeError, match="targets must be integer labels"):
        f(gvar(), gvar((None,), "bool"))
    with pytest.raises(ValueError, match="inputs live on devices 0 and 1"):
        f(gvar(), gvar((None,), "int64", device=1))
    g = GpuSoftmaxCrossEntropyGrad()
    with pytest.raises(TypeError, match="GpuSoftmaxCrossEntropyGrad: inputs must"):
        g(gvar((None,), "float64"), gvar(), gvar((None,), "int64"))
    with pytest.raises(ValueError, match=r"g must have one entry per row .*B = 3"):
        g(gvar((4,)), gvar((3, 5)), gvar((3,), "int64"))
    with pytest.raises(TypeError, match="GpuTopKError: labels must have an integer"):
        GpuTopKError(k=1)(gvar(), gvar((None,)))
    with pytest.raises(ValueError, match="TopKError: k must be >= 1"):
        GpuTopKError(k=0)
    assert f(gvar((3, 5)), gvar((None,), "int64")).type.shape == (3,)
    assert f(gvar((None, 5)), gvar((3, None))).type.shape == (None,)
    assert g(gvar((3,)), gvar((None, 5)), gvar((None,), "uint8")).type.shape == (3, 5)
    assert GpuTopKError(k=2)(gvar(), gvar((7,), "int16")).type.shape == (7,)
    b, k = pt.lscalar(), pt.lscalar()
    node = f(gvar(), gvar((None,), "int64")).owner
    assert node.op._infer_shape(node, [(b, k), (b,)]) == [(b,)]
    node = g(gvar((None,)), gvar(), gvar((None,), "int64")).owner
    assert node.op._infer_shape(node, [(b,), (b, k), (b,)]) == [(b, k)]


def test_kernel_names_and_block_sizes():
    name = softmax_cross_entropy_kernel_name(
        "xent_fwd", "float32", False, "int64", 256, vec=4
    )
    assert name == "softmax_xent_fwd_i64_t256_v4_f32"
    name = softmax_cross_entropy_kernel_name("xent_fwd", "float64", True, "int64", 1024)
    assert name == "softmax_xent_fwd_soft_t1024_v1_f64"
    name = softmax_cross_entropy_kernel_name("xent_grad", "float64", True, "int64", 32)
    assert name == "softmax_xent_grad_soft_t32_f64"
    assert softmax_cross_entropy_kernel_name("topk", "float32", False, "uint8", 64) == (
        "top_k_error_u8_t64_f32"
    )
    assert [block_size(k) for k in (1, 7, 1000, 21841, 10**6)] == [
        32, 32, 256, 1024, 1024
    ]  # fmt: skip


@pytest.mark.parametrize(
    "b, k, itemsize, want",
    [
        (128, 21841, 4, 1),  # the benchmark: a row per SM already
        (128, 21841, 8, 1),
        (66, 21841, 4, 1),  # half of the 132 SMs
        (65, 21841, 4, 3),
        (16, 21841, 4, 9),  # about one block per SM
        (1, 21841, 4, 10),  # capped by the 8 KiB smallest chunk
        (5, 21841, 4, 10),
        (528, 21841, 4, 1),
        (1024, 21841, 4, 1),
        (128, 1000, 4, 1),  # a short row is not split
        (1, 4095, 4, 1),
        (1, 4096, 4, 2),
        (0, 21841, 4, 1),
        (1, 1, 8, 1),
    ],
)
def test_forward_splits_rule(b, k, itemsize, want):
    assert gsl.forward_splits(b, k, itemsize, 132) == want


def test_forward_splits_bounds_over_a_sweep():
    for sms in (1, 8, 132):
        for b in (1, 2, 3, 5, 17, 64, 128, 129, 600):
            for k in (1, 7, 1000, 2048, 4097, 21841, 10**6):
                for item in (4, 8):
                    s = gsl.forward_splits(b, k, item, sms)
                    row = k * item
                    label = f"b{b} k{k} item{item} sms{sms}: S = {s}"
                    assert 1 <= s <= max(1, row // 8192), label
                    if 2 * b >= sms:
                        assert s == 1, label
                    elif s > 1:
                        # a block per SM, unless the row has no more 8 KiB chunks
                        assert b * s >= sms or s == row // 8192, label


def test_forward_vector_width():
    vw = gsl.forward_vector_width
    assert vw(0x1000, None, 4, False) == 4
    assert vw(0x1004, None, 4, False) == 4  # misaligned rows: scalar head
    assert vw(0x1002, None, 4, False) == 1  # not even float-aligned
    assert vw(0x1004, 0x2004, 4, True) == 4
    assert vw(0x1004, 0x2008, 4, True) == 1  # targets misaligned differently
    assert vw(0x1008, None, 8, False) == 2
    assert vw(0x1004, None, 8, False) == 1
    assert vw(0x1008, 0x2018, 8, True) == 2


def test_forward_splits_argument_is_checked():
    x, y = np.zeros((2, 3), "float32"), np.zeros(2, "int64")
    f = gsl.softmax_cross_entropy_forward
    with pytest.raises(ValueError, match=r"GpuSoftmaxCrossEntropy: splits must be in "
                       r"\[1, 4096\], got 0"):  # fmt: skip
        f(x, y, splits=0)
    with pytest.raises(ValueError, match="splits must be in .*got 4097"):
        f(x, y, splits=4097)
    with pytest.raises(TypeError, match="splits must be an int or None, got 2.5"):
        f(x, y, splits=2.5)
    with pytest.raises(TypeError, match="splits must be an int or None, got True"):
        f(x, y, splits=True)


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------


def to_host(g):
    from cc2ops.cuda.runtime import array

    return array.to_host(g)


def make_case(b, k, dtype, scale, seed=0):
    r = rng(seed)
    x = (scale * r.standard_normal((b, k))).astype(dtype)
    y = r.integers(0, k, b).astype("int64")
    y[0] = 0
    y[-1] = k - 1
    t = r.random((b, k)).astype(dtype)
    t /= t.sum(axis=1, keepdims=True)
    return x, y, t


def run_case(b, k, dtype, scale, seed=0):
    x, y, t = make_case(b, k, dtype, scale, seed)
    label = f"b{b} K{k} {dtype} scale {scale:g}"
    g = rng(seed + 1).standard_normal(b).astype(dtype)
    for targets, kind in ((y, "labels"), (t, "soft")):
        loss = to_host(gsl.softmax_cross_entropy_forward(to_gpu(x), to_gpu(targets)))
        want = softmax_cross_entropy_reference(x, targets)
        close(loss, want, dtype, f"{label} {kind}: loss")
        dx = to_host(gsl.softmax_cross_entropy_grad(to_gpu(g), to_gpu(x),
                                                    to_gpu(targets)))  # fmt: skip
        want = softmax_cross_entropy_grad_reference(g, x, targets)
        close(dx, want, dtype, f"{label} {kind}: gradient")
    for kk in (1, 5):
        err = to_host(gsl.top_k_error(to_gpu(x), to_gpu(y), kk))
        np.testing.assert_array_equal(
            err, top_k_error_reference(x, y, kk), err_msg=f"{label}: top-{kk}"
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", [1, 7, 1000, 21841])
def test_kernels_match_the_references(k, dtype, debug):
    run_case(3, k, dtype, 3.0)
    if k >= 1000:
        run_case(129, k, dtype, 1.0, seed=2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", [7, 1000, 21841])
def test_large_logits_stay_finite_and_accurate(k, dtype, debug):
    run_case(4, k, dtype, 1e4, seed=3)
    x = np.full((2, k), -1e4, dtype)
    x[:, 0] = 1e4
    y = np.array([0, k - 1])
    loss = to_host(gsl.softmax_cross_entropy_forward(to_gpu(x), to_gpu(y)))
    np.testing.assert_allclose(loss, softmax_cross_entropy_reference(x, y), rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("ldtype", ["int32", "uint8", "int16", "uint64"])
def test_label_dtypes(ldtype, debug):
    x, y, _ = make_case(5, 200, "float32", 2.0)
    yl = y.astype(ldtype)
    loss = to_host(gsl.softmax_cross_entropy_forward(to_gpu(x), to_gpu(yl)))
    close(loss, softmax_cross_entropy_reference(x, y), "float32", ldtype)


@pytest.mark.gpu
def test_top_k_ties_count_for_the_true_class(debug):
    x = np.array([[1, 2, 2, 2, 0], [3, 3, 3, 3, 3], [5, 1, 5, 9, 5]], "float32")
    y = np.array([1, 4, 0])
    for k in (1, 2, 3, 9):
        err = to_host(gsl.top_k_error(to_gpu(x), to_gpu(y), k))
        np.testing.assert_array_equal(err, top_k_error_reference(x, y, k))


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [-1, 7, 100])
def test_out_of_range_labels_raise(bad):
    x = to_gpu(rng().standard_normal((4, 7)).astype("float32"))
    y = np.array([0, 6, bad, bad if bad != 7 else 0])
    msg = rf"labels must be in \[0, K\) = \[0, 7\), got {bad} at row 2"
    with pytest.raises(ValueError, match="GpuSoftmaxCrossEntropy: " + msg):
        gsl.softmax_cross_entropy_forward(x, to_gpu(y))
    with pytest.raises(ValueError, match="GpuSoftmaxCrossEntropyGrad: " + msg):
        gsl.softmax_cross_entropy_grad(to_gpu(np.ones(4, "float32")), x, to_gpu(y))
    with pytest.raises(ValueError, match="GpuTopKError: " + msg):
        gsl.top_k_error(x, to_gpu(y), 1)
    # the flag is per call: a good call afterwards passes
    gsl.softmax_cross_entropy_forward(x, to_gpu(np.array([0, 1, 2, 3])))


@pytest.mark.gpu
def test_out_of_range_labels_raise_in_a_compiled_graph():
    from helpers import expect_error

    v, y = pt.matrix("x", dtype="float32"), pt.lvector("y")
    loss = softmax_cross_entropy(cuda.host_from_gpu(cuda.gpu_from_host(v, 0)), y)
    fn = pytensor.function([v, y], loss, mode=cuda.mode())
    assert GpuSoftmaxCrossEntropy in {type(n.op) for n in fn.maker.fgraph.apply_nodes}
    xv = np.zeros((2, 3), "float32")
    expect_error(ValueError, "got 3 at row 1", fn, xv, np.array([0, 3]))


@pytest.mark.gpu
@pytest.mark.parametrize("soft", [False, True])
def test_compiled_graph_runs_on_the_gpu(soft, debug):
    x, y, t = make_case(6, 50, "float32", 2.0)
    targets = t if soft else y
    v = pt.matrix("x", dtype="float32")
    tv = pt.matrix("t", dtype="float32") if soft else pt.lvector("y")
    hv = cuda.host_from_gpu(cuda.gpu_from_host(v, 0))
    loss = softmax_cross_entropy(hv, tv)
    err = top_k_error(hv, pt.lvector("yy"), k=3) if not soft else None
    ins = [v, tv] + ([err.owner.inputs[1]] if err is not None else [])
    outs = [loss, pytensor.grad(loss.sum(), v)] + ([err] if err is not None else [])
    fn = pytensor.function(ins, outs, mode=cuda.mode())
    types = {type(n.op) for n in fn.maker.fgraph.apply_nodes}
    assert {GpuSoftmaxCrossEntropy, GpuSoftmaxCrossEntropyGrad} <= types
    assert not types & HOST_OPS
    args = [x, targets] + ([y] if not soft else [])
    got = fn(*args)
    close(np.asarray(got[0]), softmax_cross_entropy_reference(x, targets), "float32",
          "graph loss")  # fmt: skip
    want = softmax_cross_entropy_grad_reference(np.ones(6, "float32"), x, targets)
    close(np.asarray(got[1]), want, "float32", "graph gradient")
    if not soft:
        np.testing.assert_array_equal(got[2], top_k_error_reference(x, y, 3))


VG = dict(abs_tol=1e-6, rel_tol=1e-6, eps=1e-7)


@pytest.mark.gpu
def test_verify_grad_through_gpu_ops():
    x, y, t = make_case(3, 6, "float64", 1.5)
    gy = cuda.gpu_from_host(pt.constant(y), 0)

    def with_labels(v):
        return cuda.host_from_gpu(
            GpuSoftmaxCrossEntropy()(cuda.gpu_from_host(v, 0), gy)
        )

    def with_soft(v, w):
        return cuda.host_from_gpu(
            GpuSoftmaxCrossEntropy()(cuda.gpu_from_host(v, 0), cuda.gpu_from_host(w, 0))
        )

    mode = cuda.mode()
    verify_grad(with_labels, [x], rng=rng(0), mode=mode, **VG)
    verify_grad(with_soft, [x, t], rng=rng(0), mode=mode, **VG)
    # the gradient op's own gradient (second derivatives)
    g = rng(1).standard_normal(3)

    def grad_op(gv, v):
        return cuda.host_from_gpu(
            GpuSoftmaxCrossEntropyGrad()(
                cuda.gpu_from_host(gv, 0), cuda.gpu_from_host(v, 0), gy
            )
        )

    verify_grad(grad_op, [g, x], rng=rng(0), mode=mode, **VG)


@pytest.mark.gpu
def test_softmax_cross_entropy_sanitize():
    """Small launches of every kernel kind (compute-sanitizer)."""
    run_case(3, 37, "float32", 2.0)
    run_case(2, 5, "float64", 1.0)
    # the split forward: vector loads, head and tail, the workspace combine
    for dtype in ("float32", "float64"):
        x, y, t = make_case(3, 4097, dtype, 3.0, seed=2)
        for targets in (y, t):
            got = forward(to_gpu(x), to_gpu(targets), splits=3)
            check_forward(got, x, targets, f"sanitize split {dtype}")


# --------------------------------------------------------------------------
# GPU: the forward's split rows
# --------------------------------------------------------------------------

SPLITS = [1, 2, 3, 7, None]


def forward_reference(x, targets):
    """The float64 reference of the loss of float32 or float64 inputs."""
    t = targets.astype(np.float64) if targets.dtype.kind == "f" else targets
    return softmax_cross_entropy_reference(x.astype(np.float64), t)


def check_forward(got, x, targets, label):
    want = forward_reference(x, targets)
    assert got.shape == want.shape, f"{label}: shape {got.shape} vs {want.shape}"
    assert got.dtype == x.dtype, f"{label}: dtype {got.dtype}"
    assert np.isfinite(got).all(), f"{label}: non-finite losses (unwritten?) {got}"
    # relative to the loss, absolute below 1 (a loss near 0 has no relative scale)
    tol = 1e-5 if x.dtype == np.float32 else 1e-12
    err = np.abs(got - want) / np.maximum(np.abs(want), 1.0)
    assert err.max() < tol, f"{label}: error {err.max():.3g} at row {err.argmax()}"


def forward(x, targets, **kw):
    return to_host(gsl.softmax_cross_entropy_forward(x, targets, **kw))


def offset_view(host, offset):
    """A C-contiguous GPU view of ``host``'s values starting ``offset`` elements
    into its buffer (so its base address is misaligned)."""
    from pycuda.gpuarray import GPUArray

    from cc2ops.cuda.runtime import array

    flat = array.empty((host.size + offset,), host.dtype, 0)
    view = GPUArray(host.shape, host.dtype, allocator=flat.allocator, base=flat,
                    gpudata=array.ptr(flat) + offset * host.itemsize)  # fmt: skip
    array._copy_into_contiguous(to_gpu(host), view, 0)
    return view


@pytest.mark.gpu
@pytest.mark.parametrize("splits", SPLITS, ids=lambda s: f"S{s or 'auto'}")
@pytest.mark.parametrize("k", [1, 3, 5, 1000, 1001, 4097, 21841])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_forward_split_matches_the_float64_reference(dtype, k, splits, debug):
    for b in (1, 5, 128):
        for scale in (3.0, 1e4) if b == 5 else (3.0,):
            x, y, t = make_case(b, k, dtype, scale, seed=b + k)
            gx = to_gpu(x)
            for targets, kind in ((y, "labels"), (t, "soft")):
                label = f"b{b} K{k} {dtype} S={splits} scale {scale:g} {kind}"
                got = forward(gx, to_gpu(targets), splits=splits)
                check_forward(got, x, targets, label)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3, None], ids=lambda s: f"S{s or 'auto'}")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_forward_split_misaligned_base_pointers(dtype, splits, debug):
    from cc2ops.cuda.runtime import array

    x, y, t = make_case(5, 4097, dtype, 3.0, seed=1)
    item = np.dtype(dtype).itemsize
    for xo, to in ((1, 1), (1, 0), (0, 1), (3, 3)):
        gx, gt = offset_view(x, xo), offset_view(t, to)
        vec = gsl.forward_vector_width(array.ptr(gx), array.ptr(gt), item, True)
        assert vec == (16 // item if (xo - to) * item % 16 == 0 else 1), (xo, to)
        label = f"{dtype} S={splits} offsets {xo}, {to}"
        check_forward(forward(gx, gt, splits=splits), x, t, label + " soft")
        check_forward(forward(gx, to_gpu(y), splits=splits), x, y, label + " labels")


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [3, None], ids=lambda s: f"S{s or 'auto'}")
def test_forward_split_reuses_its_workspace(splits, debug):
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(0)
    split = (splits or gsl.forward_splits(128, 21841, 4, dev.multiprocessors)) > 1
    seen = set()
    for seed in range(3):
        x, y, t = make_case(128, 21841, "float32", 3.0, seed=seed)
        gx = to_gpu(x)
        check_forward(forward(gx, to_gpu(y), splits=splits), x, y, f"call {seed}")
        check_forward(forward(gx, to_gpu(t), splits=splits), x, t, f"soft {seed}")
        if split:
            ws = gsl._workspaces[dev.index]
            assert ws.zeroed
            seen.add(int(ws.alloc))
    assert len(seen) == int(split), "the workspace was reallocated for the same sizes"


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3, None], ids=lambda s: f"S{s or 'auto'}")
def test_forward_split_bad_labels_raise_and_leave_their_row_nan(splits, debug):
    x, y, _ = make_case(5, 4097, "float32", 3.0, seed=4)
    bad = y.copy()
    bad[2], bad[4] = 4097, -1
    gx = to_gpu(x)
    msg = r"labels must be in \[0, K\) = \[0, 4097\), got 4097 at row 2"
    with pytest.raises(ValueError, match="GpuSoftmaxCrossEntropy: " + msg):
        gsl.softmax_cross_entropy_forward(gx, to_gpu(bad), splits=splits)
    got = forward(gx, to_gpu(bad), splits=splits, check=False)
    assert np.isnan(got[[2, 4]]).all(), got
    check_forward(got[[0, 1, 3]], x[[0, 1, 3]], y[[0, 1, 3]], "good rows")
    # the bad rows' counters were reset too: the next launch is right
    check_forward(forward(gx, to_gpu(y), splits=splits), x, y, "after")


@pytest.mark.gpu
@pytest.mark.parametrize("soft", [False, True])
def test_forward_split_nan_logits_poison_only_their_row(soft, debug):
    x, y, t = make_case(4, 4097, "float32", 3.0, seed=5)
    x[1, 17] = np.nan
    x[3, 4096] = np.nan
    targets = t if soft else y
    got = forward(to_gpu(x), to_gpu(targets), splits=3)
    assert np.isnan(got[[1, 3]]).all(), got
    check_forward(got[[0, 2]], x[[0, 2]], targets[[0, 2]], "finite rows")


def _drop_workspace():
    """Forget the device's workspace (kept alive: a graph may still use it), so
    that the next launch allocates and zeroes a new one."""
    from cc2ops.cuda.runtime.device import get_device

    ws = gsl._workspaces.pop(get_device(0).index, None)
    if ws is not None:
        gsl._outgrown.append(ws.alloc)


@pytest.mark.gpu
@pytest.mark.parametrize("fresh", [False, True], ids=["cached", "allocated-in-capture"])
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("splits", [3, None], ids=lambda s: f"S{s or 'auto'}")
def test_forward_split_replays_in_a_cuda_graph(splits, soft, fresh):
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.cudagraph import CudaGraph

    b, k = 128, 21841
    x, y, t = make_case(b, k, "float32", 3.0, seed=0)
    targets = t if soft else y
    gx, gt = to_gpu(x), to_gpu(targets)
    forward(gx, gt, splits=splits)  # compiles the kernel, makes the workspace
    if fresh:
        _drop_workspace()
    graph = CudaGraph(0)
    loss = graph.capture(
        lambda: gsl.softmax_cross_entropy_forward(gx, gt, splits=splits)
    )
    try:
        for seed in (1, 2, 3):
            xn, yn, tn = make_case(b, k, "float32", 3.0 * seed, seed=seed)
            tgn = tn if soft else yn
            array._copy_into_contiguous(to_gpu(xn), gx, 0)
            array._copy_into_contiguous(to_gpu(tgn), gt, 0)
            graph.replay()
            check_forward(to_host(loss), xn, tgn, f"replay {seed}")
        # eager launches share the workspace with the graph
        check_forward(forward(gx, gt, splits=splits), xn, tgn, "eager after replays")
        graph.replay()
        check_forward(to_host(loss), xn, tgn, "replay after eager")
        if not soft:
            bad = yn.copy()
            bad[7] = k
            array._copy_into_contiguous(to_gpu(bad), gt, 0)
            with pytest.raises(ValueError, match=f"got {k} at row 7"):
                graph.replay()
            got = to_host(loss)
            assert np.isnan(got[7]), got[7]
    finally:
        graph.close()
