"""The multi-device rewriter on K virtual CPU devices: rules, structure, equivalence."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.tensor.shape import Reshape

import cc2ops
from cc2ops.distributed import hybrid as mg
from cc2ops.distributed.collectives import (
    COMM_OPS,
    AllGather,
    AllReduce,
    Broadcast,
    Gather,
    Reduce,
    ReduceScatter,
    Scatter,
    Shard,
    VirtualBackend,
)
from cc2ops.distributed.hybrid import (
    PARTIAL,
    REPLICATED,
    ROOT,
    Distributor,
    NotBatchSeparableError,
    sharded,
)

F32 = np.float32


# --------------------------------------------------------------------------
# the small convnet (conv, bias, relu, cross-map norm, max pool, 2 FC, loss)
# --------------------------------------------------------------------------


def _net(seed=0, dtype="float32"):
    r = np.random.default_rng(seed)

    def sh(shape, name, s=0.3):
        return pytensor.shared((r.normal(size=shape) * s).astype(dtype), name=name)

    params = [
        sh((4, 3, 3, 3), "w1"),
        sh((4,), "b1", 0.1),
        sh((4 * 3 * 3, 8), "wf1"),
        sh((8,), "bf1", 0.1),
        sh((8, 5), "wf2"),
        sh((5,), "bf2", 0.1),
    ]
    w1, b1, wf1, bf1, wf2, bf2 = params
    x = pt.tensor4("x", dtype=dtype)
    y = pt.ivector("y")
    h = pt.maximum(cc2ops.conv2d(x, w1, padding=1) + b1.dimshuffle("x", 0, "x", "x"), 0)
    h = cc2ops.cross_map_norm(h, size=3)
    h = cc2ops.max_pool2d(h, 3, 2)
    f = pt.maximum(pt.dot(h.flatten(2), wf1) + bf1, 0)
    logits = pt.dot(f, wf2) + bf2
    cost = cc2ops.softmax_cross_entropy(logits, y).mean()
    return x, y, params, cost, h


def _train(k, batch=6, scheme="a", steps=5, seed=0):
    x, y, params, cost, _ = _net(seed)
    if k:
        cost = mg.distribute(cost, k, scheme=scheme)
    grads = pytensor.grad(cost, params)
    updates, moms = [], []
    for p, g in zip(params, grads, strict=True):
        m = pytensor.shared(np.zeros_like(p.get_value()), name="m_" + p.name)
        moms.append(m)
        new_m = F32(0.9) * m - F32(0.05) * (g + F32(5e-4) * p)
        updates += [(m, new_m), (p, p + new_m)]
    fn = pytensor.function(
        [x, y], cost, updates=updates, mode=mg.mode(k) if k else cc2ops.mode
    )
    r = np.random.default_rng(seed + 1)
    data = r.normal(size=(batch, 3, 7, 7)).astype("float32")
    labels = r.integers(0, 5, size=batch).astype("int32")
    losses = [float(fn(data, labels)) for _ in range(steps)]
    return losses, params, moms, fn


_REF: dict = {}


def _reference(batch):
    if batch not in _REF:
        losses, params, moms, _ = _train(0, batch)
        _REF[batch] = (
            losses,
            [p.get_value() for p in params],
            [m.get_value() for m in moms],
        )
    return _REF[batch]


def _assert_equivalent(k, batch, scheme):
    ref_losses, ref_params, ref_moms = _reference(batch)
    losses, params, moms, fn = _train(k, batch, scheme)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-6, atol=1e-6, err_msg="loss")
    for p, want in zip(params, ref_params, strict=True):
        got = p.get_value()
        assert got.shape == want.shape, f"{p.name}: shape {got.shape} vs {want.shape}"
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6, err_msg=p.name)
    for m, want in zip(moms, ref_moms, strict=True):
        np.testing.assert_allclose(
            m.get_value(), want, rtol=1e-5, atol=2e-6, err_msg=m.name
        )
    return fn


@pytest.mark.parametrize("k", [2, 3, 4])
def test_five_sgd_steps_equal_the_single_device_run(k):
    _assert_equivalent(k, 12, "a")


@pytest.mark.parametrize("k,batch", [(3, 7), (4, 5), (2, 9)])
def test_uneven_batches_split_like_array_split_and_stay_exact(k, batch):
    _assert_equivalent(k, batch, "a")


@pytest.mark.parametrize("k", [2, 3])
def test_scheme_b_equals_the_single_device_run(k):
    _assert_equivalent(k, 7, "b")


def test_batch_smaller_than_devices_is_a_clear_error():
    _, _, _, fn = _train(3, batch=3, steps=1)
    r = np.random.default_rng(0)
    with pytest.raises(
        ValueError,
        match=r"Scatter: cannot split an extent of 2 "
        r"along axis 0 over n=3 devices: every device needs >= 1 "
        r"entry \(a batch must have at least K=3 examples\)",
    ):
        fn(r.normal(size=(2, 3, 7, 7)).astype("float32"), np.zeros(2, "int32"))


@pytest.mark.parametrize(
    "devices,error,message",
    [
        (1.5, TypeError, "got float 1.5"),
        ("2", TypeError, "got str '2'"),
        ("12", TypeError, "got str '12'"),
        (True, TypeError, "got the bool True"),
        (0, ValueError, "must be >= 1, got 0"),
        ([], ValueError, "must not be empty"),
        ([0, 0], ValueError, "repeated device labels"),
        ([0, 1.0], TypeError, "device labels must be ints, got float 1.0"),
        ([0, -1], ValueError, "device labels must be >= 0, got -1"),
    ],
)
def test_mode_and_distribute_refuse_bad_devices_by_name(devices, error, message):
    with pytest.raises(error, match=r"multi_gpu\.mode: .*" + re.escape(message)):
        mg.mode(devices)
    x, y, params, cost, _ = _net()
    with pytest.raises(error, match=r"multi_gpu\.distribute: .*" + re.escape(message)):
        mg.distribute(cost, devices)


# --------------------------------------------------------------------------
# structure of the training graph
# --------------------------------------------------------------------------


def _comm_counts(fn):
    return Counter(
        str(n.op) for n in fn.maker.fgraph.apply_nodes if isinstance(n.op, COMM_OPS)
    )


@pytest.mark.parametrize("k", [2, 3, 4])
def test_training_graph_has_exactly_the_expected_collectives(k):
    _, _, _, fn = _train(k, batch=12, steps=1)
    want = Counter(
        {
            f"Scatter{{n={k}, axis=0}}": 2,  # the images and the labels
            f"AllGather{{n={k}, axis=0}}": 1,  # conv activations -> FC1 (scheme a)
            f"AllGather{{n={k}, axis=1}}": 2,  # FC1 features -> FC2, logits -> loss
            f"ReduceScatter{{n={k}, axis=0}}": 1,  # their pullbacks
            f"ReduceScatter{{n={k}, axis=1}}": 2,
            f"AllReduce{{n={k}}}": 2,  # conv weight and conv bias gradients
            f"Reduce{{n={k}, root=0}}": 1,  # the loss
        }
    )
    assert _comm_counts(fn) == want


def test_scheme_b_broadcasts_each_workers_batch():
    k = 3
    _, _, _, fn = _train(k, batch=6, scheme="b", steps=1)
    counts = _comm_counts(fn)
    for j in range(k):
        assert counts[f"Broadcast{{n={k}, root={j}}}"] == 1
        assert counts[f"Reduce{{n={k}, root={j}}}"] == (2 if j == 0 else 1)
    assert counts[f"AllGather{{n={k}, axis=0}}"] == 0


def test_state_is_per_device_replicas_and_shards():
    k = 3
    losses, params, moms, fn = _train(k, batch=6, steps=1)
    loc = fn.maker.cc2ops_multi
    placements = {v.name: p for v, (p, _) in loc.state.items()}
    assert placements == {
        "w1": REPLICATED,
        "b1": REPLICATED,
        "m_w1": REPLICATED,
        "m_b1": REPLICATED,
        "wf1": sharded(1),
        "m_wf1": sharded(1),
        "bf1": sharded(0),
        "m_bf1": sharded(0),
        "wf2": sharded(1),
        "m_wf2": sharded(1),
        "bf2": sharded(0),
        "m_bf2": sharded(0),
    }
    inputs = {v.name for v in fn.maker.fgraph.inputs}
    assert {"wf1@0", "wf1@1", "wf1@2", "w1", "w1@1", "w1@2"} <= inputs
    assert "wf1" not in inputs  # the full FC weight is not a function input any more
    _, parts = loc.state[params[2]]
    assert [p.get_value().shape for p in parts] == [(36, 3), (36, 3), (36, 2)]
    # replicas stay identical
    _, reps = loc.state[params[0]]
    for rep in reps[1:]:
        np.testing.assert_array_equal(rep.get_value(), reps[0].get_value())


def test_original_shared_variables_are_views_of_the_state():
    _, params, _, fn = _train(2, batch=6, steps=1)
    wf1 = params[2]
    loc = fn.maker.cc2ops_multi
    _, parts = loc.state[wf1]
    full = wf1.get_value()
    np.testing.assert_array_equal(
        full, np.concatenate([p.get_value() for p in parts], axis=1)
    )
    new = np.arange(full.size, dtype="float32").reshape(full.shape)
    wf1.set_value(new)
    np.testing.assert_array_equal(parts[1].get_value(), new[:, 4:])
    w1 = params[0]
    w1.set_value(np.ones_like(w1.get_value()))
    _, reps = loc.state[w1]
    np.testing.assert_array_equal(reps[1].get_value(), np.ones_like(w1.get_value()))
    mg.sync(fn)
    np.testing.assert_array_equal(wf1.container.storage[0], new)


def test_per_device_nodes_are_labelled():
    x, y, params, cost, _ = _net()
    out = mg.distribute(cost, 3)
    dz = out.tag.cc2ops_distributor
    labelled = Counter(
        (type(n.op).__name__, k)
        for n, k in dz.device_of.items()
        if type(n.op).__name__
        in ("FilterActs", "MaxPool", "SoftmaxCrossEntropy", "Dot")
    )
    for k in range(3):
        assert labelled[("FilterActs", k)] == 1
        assert labelled[("MaxPool", k)] == 1
        assert labelled[("SoftmaxCrossEntropy", k)] == 1
        assert labelled[("Dot", k)] == 2
    # device k's conv reads shard k of the images and replica k of w1
    convs = sorted(
        (dz.device_of[n], n)
        for n in dz.device_of
        if type(n.op).__name__ == "FilterActs"
    )
    for k, node in convs:
        images, weights = node.inputs
        assert (
            isinstance(images.owner.op, Scatter)
            and images.owner.outputs.index(images) == k
        )
        assert (
            isinstance(weights.owner.op, Broadcast)
            and weights.owner.outputs.index(weights) == k
        )


def test_distributed_cost_alone_works_in_any_mode():
    """Step 1 without step 2: the parameter-server form, still exact."""
    x, y, params, cost, _ = _net()
    dist = mg.distribute(cost, 2)
    grads = pytensor.grad(dist, params)
    ref_grads = pytensor.grad(cost, params)
    f = pytensor.function([x, y], [dist, *grads, cost, *ref_grads], mode=cc2ops.mode)
    r = np.random.default_rng(3)
    out = f(
        r.normal(size=(5, 3, 7, 7)).astype("float32"),
        r.integers(0, 5, 5).astype("int32"),
    )
    half = len(out) // 2
    for a, b in zip(out[:half], out[half:], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# each rule on the graph alone
# --------------------------------------------------------------------------


def _dz(k=2, conv=(), fc=()):
    return Distributor(VirtualBackend(range(k)), set(conv), set(fc))


def _seed(dz, var, placement):
    if placement == ROOT:
        dz.set(var, ROOT, [var])
    else:
        dz.set(var, placement, [var.type() for _ in range(dz.k)])
    return dz.dist(var).vars


def test_rule_elemwise_sharded_wins_and_broadcasting_inputs_are_replicated():
    dz = _dz(2)
    a = pt.matrix("a")
    b = pt.vector("b")
    out = a + b.dimshuffle("x", 0)
    _seed(dz, a, sharded(0))
    dz.place([out])
    d = dz.dist(out)
    assert d.placement == sharded(0)
    # b broadcasts along axis 0: replicated via one Broadcast of the root value
    bs = [
        n
        for n in pytensor.graph.traversal.toposort(d.vars)
        if isinstance(n.op, Broadcast)
    ]
    assert len(bs) == 1 and bs[0].inputs[0] is b


def test_rule_elemwise_non_broadcasting_root_input_is_scattered_at_its_leaf():
    dz = _dz(3)
    a = pt.matrix("a")
    b = pt.vector("b")
    out = a + b.dimshuffle("x", 0)
    _seed(dz, a, sharded(1))
    dz.place([out])
    assert dz.dist(out).placement == sharded(1)
    nodes = list(pytensor.graph.traversal.toposort(dz.dist(out).vars))
    scatters = [n for n in nodes if isinstance(n.op, Scatter)]
    assert (
        len(scatters) == 1 and scatters[0].inputs[0] is b and scatters[0].op.axis == 0
    )


def test_rule_dimshuffle_moves_the_shard_axis():
    dz = _dz(2)
    a = pt.matrix("a")
    _seed(dz, a, sharded(1))
    t = a.T
    dz.place([t])
    assert dz.dist(t).placement == sharded(0)


def test_rule_reshape_keeps_the_local_batch():
    dz = _dz(2)
    a = pt.tensor4("a")
    flat = a.flatten(2)
    vars_ = _seed(dz, a, sharded(0))
    dz.place([flat])
    d = dz.dist(flat)
    assert d.placement == sharded(0)
    f = pytensor.function(list(vars_), list(d.vars), mode="FAST_COMPILE")
    got = f(np.zeros((3, 2, 2, 2)), np.zeros((2, 2, 2, 2)))
    assert [g.shape for g in got] == [(3, 8), (2, 8)]


def test_rule_shape_is_the_global_shape():
    dz = _dz(3)
    a = pt.matrix("a")
    vars_ = _seed(dz, a, sharded(0))
    shape = a.shape
    dz.place([shape])
    d = dz.dist(shape)
    assert d.placement == ROOT
    f = pytensor.function(list(vars_), d.vars[0], mode="FAST_COMPILE")
    assert list(f(np.zeros((3, 4)), np.zeros((2, 4)), np.zeros((2, 4)))) == [7, 4]


def test_rule_sum_over_the_shard_axis_is_partial_and_the_root_is_a_reduce():
    dz = _dz(2)
    a = pt.matrix("a")
    s = a.sum()
    _seed(dz, a, sharded(0))
    root = dz.run([s])[0]
    assert dz.dist(s).placement == PARTIAL
    assert isinstance(root.owner.op, Reduce)
    col = a.sum(axis=0)
    dz.place([col])
    assert dz.dist(col).placement == PARTIAL
    row = a.sum(axis=1)
    dz.place([row])
    assert dz.dist(row).placement == sharded(0)


def test_rule_partial_linear_keeps_partials_and_all_reduces_otherwise():
    dz = _dz(2)
    a, b = pt.scalar("a"), pt.scalar("b")
    c = pt.scalar("c")
    _seed(dz, a, PARTIAL)
    _seed(dz, b, PARTIAL)
    lin = (a + b) / c
    nonlin = pt.exp(a)
    dz.place([lin, nonlin])
    assert dz.dist(lin).placement == PARTIAL
    assert dz.dist(nonlin).placement == REPLICATED
    node = dz.dist(nonlin).vars[0].owner
    assert isinstance(node.inputs[0].owner.op, AllReduce)


def test_rule_matmul_fc_all_gathers_the_batch_and_shards_the_weight():
    a = pt.matrix("a")
    w = pytensor.shared(np.zeros((4, 6), "float32"), name="w")
    out = pt.dot(a, w)
    dz = _dz(2, fc=[out.owner])
    _seed(dz, a, sharded(0))
    dz.place([out])
    d = dz.dist(out)
    assert d.placement == sharded(1)
    left, right = d.vars[0].owner.inputs
    assert isinstance(left.owner.op, AllGather) and left.owner.op.axis == 0
    assert isinstance(right.owner.op, Scatter) and right.owner.op.axis == 1
    assert right.owner.inputs[0] is w


def test_rule_matmul_data_parallel_outside_the_fc_segment():
    a = pt.matrix("a")
    w = pytensor.shared(np.zeros((4, 6), "float32"), name="w")
    out = pt.dot(a, w)
    dz = _dz(2)
    _seed(dz, a, sharded(0))
    dz.place([out])
    assert dz.dist(out).placement == sharded(0)
    assert isinstance(dz.dist(out).vars[1].owner.inputs[1].owner.op, Broadcast)


def test_rule_batch_separable_shards_replicated_logits_locally():
    logits = pt.matrix("logits")
    y = pt.ivector("y")
    loss = cc2ops.softmax_cross_entropy(logits, y)
    dz = _dz(2)
    _seed(dz, logits, REPLICATED)
    dz.place([loss])
    d = dz.dist(loss)
    assert d.placement == sharded(0)
    node = d.vars[1].owner
    assert (
        isinstance(node.inputs[0].owner.op, Shard)
        and node.inputs[0].owner.op.index == 1
    )
    assert isinstance(node.inputs[1].owner.op, Scatter)


def test_rule_conversions_use_one_collective_each():
    dz = _dz(3)
    a = pt.matrix("a")
    _seed(dz, a, PARTIAL)
    pieces = dz.sharded(a, 1)
    assert isinstance(pieces[0].owner.op, ReduceScatter)
    b = pt.matrix("b")
    _seed(dz, b, sharded(0))
    assert isinstance(dz.root(b).owner.op, Gather)
    assert dz.replicated(b)[0].owner is dz.replicated(b)[2].owner  # cached, one node


def test_batch_reduction_in_the_conv_segment_is_rejected():
    x = pt.tensor4("x")
    w = pytensor.shared(np.zeros((2, 3, 3, 3)), name="w")
    wf = pytensor.shared(np.zeros((2 * 5 * 5, 3)), name="wf")
    h = cc2ops.conv2d(x, w)
    h = h - h.mean(axis=0, keepdims=True)  # batch norm-like statistic
    cost = pt.dot(h.flatten(2), wf).sum()
    with pytest.raises(NotBatchSeparableError, match="reduces over the batch axis"):
        mg.distribute(cost, 2)


def test_unregistered_op_in_the_conv_segment_is_rejected():
    x = pt.tensor4("x")
    w = pytensor.shared(np.zeros((3, 3, 1, 1)), name="w")
    wf = pytensor.shared(np.zeros((3 * 5 * 5, 3)), name="wf")
    h = cc2ops.conv2d(x, w)
    h = pt.sort(h, axis=0)  # not batch-separable, no rule
    cost = pt.dot(h.flatten(2), wf).sum()
    with pytest.raises(NotBatchSeparableError, match="register_batch_separable"):
        mg.distribute(cost, 2)


def test_split_point_found_and_overridable_and_missing():
    x, y, params, cost, h = _net()
    split = mg.find_split([cost])
    assert isinstance(split.owner.op, Reshape)
    assert split.owner.inputs[0] is h
    with pytest.raises(ValueError, match="pass split_at"):
        mg.find_split([(x**2).sum()])
    # override: split after the first FC layer; FC1 becomes data-parallel
    logits_node = cost.owner.inputs[0].owner.inputs[0].owner.inputs[0].owner
    fc2_product = logits_node.inputs[0]
    fc1 = fc2_product.owner.inputs[0]  # relu(FC1): the new end of the conv segment
    out = mg.distribute(cost, 2, split_at=fc1)
    ops = Counter(
        str(n.op)
        for n in pytensor.graph.traversal.toposort([out])
        if isinstance(n.op, COMM_OPS)
    )
    assert ops["AllGather{n=2, axis=0}"] == 1  # now before FC2
    assert ops["Scatter{n=2, axis=1}"] == 1  # only wf2 is sharded


def test_non_elementwise_update_rules_are_refused():
    x, y, params, cost, _ = _net()
    cost = mg.distribute(cost, 2)
    g = pytensor.grad(cost, params[2])
    bad = params[2] - g / pt.sqrt((g**2).sum())  # a global norm over the sharded grad
    with pytest.raises(ValueError, match="only elementwise update rules"):
        pytensor.function([x, y], cost, updates=[(params[2], bad)], mode=mg.mode(2))


def test_modes_keep_their_backend_when_cloned():
    m = mg.mode(3)
    assert m.backend.n == 3
    assert m.excluding("cc2ops_fuse_softmax_loss").backend is m.backend


@pytest.mark.parametrize("k", [2, 3])
def test_undistributed_models_are_refused_in_a_multi_device_mode(k):
    x, y, params, cost, _ = _net()
    mode = mg.mode(k)
    with pytest.raises(ValueError) as info:
        pytensor.function([x, y], cost, mode=mode)
    msg = str(info.value)
    for part in (
        "MultiDeviceMode",
        f"K={k}",
        "not passed through distribute",
        "input x",
        "cc2ops.distributed.hybrid.distribute(cost, mode) before pytensor.grad",
    ):
        assert part in msg, (part, msg)
    # the training function too (gradients of the undistributed cost)
    g = pytensor.grad(cost, params[0])
    with pytest.raises(ValueError, match="not passed through distribute"):
        pytensor.function([x, y], cost, updates=[(params[0], params[0] - g)], mode=mode)
    # a model reading its batch from shared variables (no data input) as well
    data = pytensor.shared(np.zeros((4, 3, 7, 7), "float32"), name="data")
    with pytest.raises(ValueError, match="op FilterActs"):
        pytensor.function([], cc2ops.conv2d(data, params[0]).sum(), mode=mode)


def test_graphs_without_a_batch_compile_unchanged_in_a_multi_device_mode():
    lr = pytensor.shared(np.float32(0.1), name="lr")
    s = pt.fscalar("s")
    f = pytensor.function([s], lr * s, updates=[(lr, lr * F32(0.5))], mode=mg.mode(2))
    assert np.isclose(f(np.float32(3.0)), 0.3) and np.isclose(lr.get_value(), 0.05)
    # a hand-written multi-device graph (collectives) is not a silent fallback
    a, b = pt.fmatrix("a"), pt.fmatrix("b")
    g = pytensor.function([a, b], AllGather(2, 0)(a, b), mode=mg.mode(2))
    va, vb = np.ones((2, 3), "float32"), np.zeros((1, 3), "float32")
    for out in g(va, vb):
        np.testing.assert_array_equal(out, np.concatenate([va, vb]))
    # K = 1 is a single device: nothing to distribute, nothing refused
    x, y, params, cost, _ = _net()
    f1 = pytensor.function([x, y], cost, mode=mg.mode(1))
    r = np.random.default_rng(0)
    assert np.isfinite(
        f1(r.normal(size=(4, 3, 7, 7)).astype("float32"), np.zeros(4, "int32"))
    )


def test_distributed_for_another_k_is_refused():
    x, y, params, cost, _ = _net()
    cost = mg.distribute(cost, 3)
    with pytest.raises(ValueError, match="distributed over 3 devices but the mode"):
        pytensor.function([x, y], cost, mode=mg.mode(2))


# --------------------------------------------------------------------------
# dropout: each device draws the mask slice of its examples, or runs replicated
# --------------------------------------------------------------------------


def _dropout_train(k, where, batch=7, steps=3, seed=0):
    """The small net with dropout ``where`` ("conv": after the pool, rows of 36;
    "conv_unaligned": rows of 27; "fc": after FC1, sharded by units)."""
    r = np.random.default_rng(seed)
    filters = 3 if where == "conv_unaligned" else 4

    def sh(shape, name, s=0.3):
        value = (r.normal(size=shape) * s).astype("float32")
        return pytensor.shared(value, name=name, shape=shape)  # static row sizes

    params = [
        sh((filters, 3, 3, 3), "w1"),
        sh((filters,), "b1", 0.1),
        sh((filters * 9, 8), "wf1"),
        sh((8,), "bf1", 0.1),
        sh((8, 5), "wf2"),
        sh((5,), "bf2", 0.1),
    ]
    w1, b1, wf1, bf1, wf2, bf2 = params
    x = pt.tensor("x", dtype="float32", shape=(None, 3, 7, 7))
    y = pt.ivector("y")
    state = cc2ops.dropout_state(1234, name="drop")
    h = pt.maximum(cc2ops.conv2d(x, w1, padding=1) + b1.dimshuffle("x", 0, "x", "x"), 0)
    h = cc2ops.max_pool2d(h, 3, 2)
    if where != "fc":
        h = cc2ops.dropout(h, 0.5, state)
    f = pt.maximum(pt.dot(h.flatten(2), wf1) + bf1, 0)
    if where == "fc":
        f = cc2ops.dropout(f, 0.5, state)
    cost = cc2ops.softmax_cross_entropy(pt.dot(f, wf2) + bf2, y).mean()
    if k:
        cost = mg.distribute(cost, k)
    grads = pytensor.grad(cost, params)
    updates = [(p, p - F32(0.1) * g) for p, g in zip(params, grads, strict=True)]
    fn = pytensor.function(
        [x, y], cost, updates=updates, mode=mg.mode(k) if k else cc2ops.mode
    )
    r2 = np.random.default_rng(seed + 1)
    data = r2.normal(size=(batch, 3, 7, 7)).astype("float32")
    labels = r2.integers(0, 5, size=batch).astype("int32")
    losses = [float(fn(data, labels)) for _ in range(steps)]
    return losses, [p.get_value() for p in params], state.get_value(), fn


@pytest.mark.parametrize("where", ["conv", "conv_unaligned", "fc"])
@pytest.mark.parametrize("k", [2, 3])
def test_dropout_steps_equal_the_single_device_run(k, where):
    ref_losses, ref_params, ref_state, _ = _dropout_train(0, where)
    losses, params, state, fn = _dropout_train(k, where)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-6, atol=1e-6, err_msg="loss")
    for got, want in zip(params, ref_params, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    # the counter advanced by the global size each step, as on one device
    np.testing.assert_array_equal(state, ref_state)
    assert state[2] > 0
    drops = [n for n in fn.maker.fgraph.apply_nodes if type(n.op).__name__ == "Dropout"]
    advances = [
        n
        for n in fn.maker.fgraph.apply_nodes
        if type(n.op).__name__ == "DropoutAdvance"
    ]
    # K forward + K pullback masks; device k > 0 reads an advanced state only
    # where it draws its own slice
    assert len(drops) == 2 * k, drops
    assert len(advances) == (k if where == "conv" else 1), advances


def test_rule_dropout_slices_aligned_batch_shards_and_replicates_the_rest():
    state = cc2ops.dropout_state(5)
    x = pt.tensor("x", dtype="float32", shape=(None, 8))
    node = cc2ops.dropout(x, 0.5, state).owner
    dz = _dz(3)
    _seed(dz, x, sharded(0))
    placement, outs = mg.rule_dropout(dz, node, [dz.dist(i) for i in node.inputs])
    assert placement == sharded(0)
    states = [o[0].owner.inputs[1] for o in outs]
    assert states[0] is state
    assert all(type(s.owner.op).__name__ == "DropoutAdvance" for s in states[1:])
    # the state's counter advance now adds up the per-device sizes
    assert state.default_update.owner.inputs[0] is state
    # sharded by units (the FC segment): replicated after one all-gather
    state2 = cc2ops.dropout_state(6)
    node2 = cc2ops.dropout(x, 0.5, state2).owner
    dz2 = _dz(2)
    _seed(dz2, x, sharded(1))
    placement, outs = mg.rule_dropout(dz2, node2, [dz2.dist(i) for i in node2.inputs])
    assert placement == REPLICATED
    assert all(o[0].owner.inputs[1] is state2 for o in outs)
    assert isinstance(outs[0][0].owner.inputs[0].owner.op, AllGather)
    # partial sums stay partial (dropout is linear)
    dz3 = _dz(2)
    _seed(dz3, x, PARTIAL)
    node3 = cc2ops.dropout(x, 0.5, cc2ops.dropout_state(7)).owner
    assert (
        mg.rule_dropout(dz3, node3, [dz3.dist(i) for i in node3.inputs])[0] == PARTIAL
    )
