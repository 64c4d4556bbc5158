"""cc2ops.distributed.collectives on the host: values, shapes, pullbacks, errors."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from helpers import TEST_MODE, rng

from cc2ops.distributed.collectives import (
    AllGather,
    AllReduce,
    Broadcast,
    Gather,
    Reduce,
    ReduceScatter,
    Scatter,
    Shard,
    ShardGrad,
    VirtualBackend,
    shard_bounds,
    shard_sizes,
)


def _mats(n, shape, seed=0):
    r = rng(seed)
    return [r.normal(size=shape(k) if callable(shape) else shape) for k in range(n)]


def _fn(inputs, outputs):
    return pytensor.function(inputs, outputs, mode=TEST_MODE)


@pytest.mark.parametrize("extent,n", [(7, 3), (6, 3), (1, 1), (8, 4), (5, 2)])
def test_shard_sizes_follow_array_split(extent, n):
    want = [len(p) for p in np.array_split(np.arange(extent), n)]
    assert shard_sizes(extent, n) == want
    bounds = shard_bounds(extent, n)
    assert bounds[0][0] == 0 and bounds[-1][1] == extent
    assert [b - a for a, b in bounds] == want


@pytest.mark.parametrize("n,axis", [(2, 0), (3, 1), (4, 1)])
def test_all_gather_and_reduce_scatter_values(n, axis):
    xs = [pt.matrix(f"x{k}") for k in range(n)]
    vals = _mats(n, lambda k: (3 + (axis == 0) * k, 2 + (axis == 1) * k))
    outs = AllGather(n, axis)(*xs)
    got = _fn(xs, outs)(*vals)
    want = np.concatenate(vals, axis=axis)
    assert len(got) == n
    for g in got:
        np.testing.assert_array_equal(g, want)
    same = _mats(n, (5, 7), seed=1)
    pieces = _fn(xs, ReduceScatter(n, axis)(*xs))(*same)
    total = sum(same)
    for g, w in zip(pieces, np.array_split(total, n, axis=axis), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_all_reduce_broadcast_reduce_scatter_gather_values():
    n = 3
    xs = [pt.matrix(f"x{k}") for k in range(n)]
    vals = _mats(n, (4, 2))
    for g in _fn(xs, AllReduce(n)(*xs))(*vals):
        np.testing.assert_allclose(g, sum(vals), rtol=1e-12)
    np.testing.assert_allclose(_fn(xs, Reduce(n)(*xs))(*vals), sum(vals), rtol=1e-12)
    x = pt.matrix("x")
    for g in _fn([x], Broadcast(n, root=1)(x))(vals[0]):
        np.testing.assert_array_equal(g, vals[0])
    big = rng(3).normal(size=(7, 5))
    pieces = _fn([x], Scatter(n, 0)(x))(big)
    for g, w in zip(pieces, np.array_split(big, n), strict=True):
        np.testing.assert_array_equal(g, w)
    back = _fn(xs, Gather(n, 0)(*xs))(*pieces)
    np.testing.assert_array_equal(back, big)
    for k in range(n):
        np.testing.assert_array_equal(
            _fn([x], Shard(n, k, 1)(x))(big), np.array_split(big, n, 1)[k]
        )


def test_outputs_do_not_alias_inputs():
    x = pt.vector("x")
    v = np.arange(3.0)
    outs = _fn([x], Broadcast(2)(x))(v)
    outs[0][0] = 99
    assert outs[1][0] == 0 and v[0] == 0


def _check_pullback(build, vals, label):
    """Finite-difference check of a scalar function of per-device inputs."""
    r = rng(5)
    xs = [
        pt.tensor(f"x{k}", dtype="float64", shape=(None,) * v.ndim)
        for k, v in enumerate(vals)
    ]
    cost = build(xs)
    grads = pytensor.grad(cost, xs)
    f = _fn(xs, [cost, *grads])
    base, *gs = f(*vals)
    eps = 1e-6
    for k, v in enumerate(vals):
        d = r.normal(size=v.shape)
        plus = list(vals)
        plus[k] = v + eps * d
        minus = list(vals)
        minus[k] = v - eps * d
        fd = (f(*plus)[0] - f(*minus)[0]) / (2 * eps)
        np.testing.assert_allclose(
            np.sum(gs[k] * d),
            fd,
            rtol=1e-6,
            atol=1e-8,
            err_msg=f"{label}: pullback wrt x{k}",
        )


@pytest.mark.parametrize("n", [2, 3])
def test_pullbacks_match_finite_differences(n):
    r = rng(7)
    uneven = [r.normal(size=(2 + k, 4)) for k in range(n)]
    same = [r.normal(size=(5, 4)) for _ in range(n)]

    def weighted(outs):
        # a different function of each device's output, so every cotangent differs
        return sum(((o**2).sum() * (k + 1) + o.sum() * k) for k, o in enumerate(outs))

    _check_pullback(lambda xs: weighted(AllGather(n, 0)(*xs)), uneven, "AllGather")
    _check_pullback(
        lambda xs: weighted(ReduceScatter(n, 1)(*xs)), same, "ReduceScatter"
    )
    _check_pullback(lambda xs: weighted(AllReduce(n)(*xs)), same, "AllReduce")
    _check_pullback(lambda xs: (Reduce(n)(*xs) ** 2).sum(), same, "Reduce")
    _check_pullback(lambda xs: (Gather(n, 0)(*xs) ** 3).sum(), uneven, "Gather")
    _check_pullback(lambda xs: weighted(Broadcast(n)(xs[0])), same[:1], "Broadcast")
    _check_pullback(
        lambda xs: weighted(Scatter(n, 0)(xs[0])), [r.normal(size=(7, 3))], "Scatter"
    )
    _check_pullback(
        lambda xs: (Shard(n, n - 1, 0)(xs[0]) ** 2).sum(),
        [r.normal(size=(7, 3))],
        "Shard",
    )


def test_pullback_pairs_are_the_documented_ops():
    n = 2
    xs = [pt.matrix(f"x{k}") for k in range(n)]
    pairs = [
        (AllGather(n, 1), xs, ReduceScatter),
        (ReduceScatter(n, 1), xs, AllGather),
        (AllReduce(n), xs, AllReduce),
        (Broadcast(n), xs[:1], Reduce),
        (Scatter(n, 0), xs[:1], Gather),
    ]
    for op, ins, expected in pairs:
        outs = op(*ins)
        outs = outs if isinstance(outs, list) else [outs]
        g = pytensor.grad(sum((o**2).sum() for o in outs), ins[0])
        ops = {type(nd.op) for nd in pytensor.graph.traversal.applys_between(ins, [g])}
        assert expected in ops, f"pullback of {op} lacks {expected.__name__}: {ops}"
    g = pytensor.grad((Shard(2, 1, 0)(xs[0]) ** 2).sum(), xs[0])
    assert isinstance(g.owner.op, ShardGrad) or any(
        isinstance(nd.op, ShardGrad)
        for nd in pytensor.graph.traversal.applys_between([xs[0]], [g])
    )


def test_disconnected_outputs_count_as_zeros():
    xs = [pt.matrix(f"x{k}") for k in range(3)]
    outs = AllGather(3, 0)(*xs)
    g = pytensor.grad(outs[1].sum(), xs)
    vals = _mats(3, (2, 2))
    for gv in _fn(xs, g)(*vals):
        np.testing.assert_array_equal(gv, np.ones((2, 2)))


def test_infer_shape_without_running_the_ops():
    x = pt.matrix("x")
    pieces = Scatter(3, 0)(x)
    shapes = pytensor.function([x], [p.shape for p in pieces], mode="FAST_RUN")
    assert [tuple(s) for s in shapes(np.zeros((7, 2)))] == [(3, 2), (2, 2), (2, 2)]
    ops = {type(nd.op) for nd in shapes.maker.fgraph.apply_nodes}
    assert Scatter not in ops
    gathered = AllGather(3, 0)(*pieces)
    f = pytensor.function([x], gathered[2].shape, mode="FAST_RUN")
    assert tuple(f(np.zeros((7, 2)))) == (7, 2)


def test_static_shapes():
    xs = [pt.tensor("a", shape=(2, 3)), pt.tensor("b", shape=(4, 3))]
    out = AllGather(2, 0)(*xs)[0]
    assert out.type.shape == (6, 3)
    pieces = Scatter(3, 0)(pt.tensor("c", shape=(7, 5)))
    assert [p.type.shape for p in pieces] == [(3, 5), (2, 5), (2, 5)]


def test_errors_name_op_and_rule():
    a, b = pt.matrix("a"), pt.vector("b")
    with pytest.raises(
        TypeError, match="AllGather: per-device inputs must share dtype and ndim"
    ):
        AllGather(2, 0)(a, b)
    with pytest.raises(ValueError, match="AllReduce: expected 3 per-device inputs"):
        AllReduce(3)(a, a)
    with pytest.raises(ValueError, match="AllGather: axis 2 is out of range"):
        AllGather(2, 2)(a, a)
    with pytest.raises(ValueError, match="Broadcast: root must be in 0..1"):
        Broadcast(2, root=2)
    with pytest.raises(
        ValueError, match="n \\(the number of devices\\) must be an int >= 1"
    ):
        Reduce(0)
    c = pt.matrix("c")
    f = _fn([a, c], AllReduce(2)(a, c))
    with pytest.raises(
        ValueError, match="AllReduce: per-device inputs must have one shape"
    ):
        f(np.zeros((2, 2)), np.zeros((3, 2)))


def test_virtual_backend_builds_one_node_per_collective():
    be = VirtualBackend([0, 1, 2])
    xs = [pt.matrix(f"x{k}") for k in range(3)]
    outs = be.all_gather(xs, 1)
    assert len(outs) == 3 and len({o.owner for o in outs}) == 1
    assert isinstance(outs[0].owner.op, AllGather)
    assert isinstance(be.reduce(xs).owner.op, Reduce)
    with pytest.raises(ValueError, match="repeated device labels"):
        VirtualBackend([0, 0])


def test_reduce_scatter_takes_its_sizes_positionally_when_cloned():
    import pytensor
    import pytensor.tensor as pt

    from cc2ops.distributed.collectives import ReduceScatter

    a, b = pt.matrix("a"), pt.matrix("b")
    outs = ReduceScatter(2, 0)(a, b, sizes=[1, 2])
    node = outs[0].owner
    clone = node.op.make_node(*node.inputs)  # what clone_with_new_inputs does
    assert len(clone.inputs) == 3
    f = pytensor.function([a, b], clone.outputs)
    x = np.arange(6, dtype=a.dtype).reshape(3, 2)
    got = f(x, x)
    np.testing.assert_array_equal(got[0], 2 * x[:1])
    np.testing.assert_array_equal(got[1], 2 * x[1:])


def test_scatter_and_shard_refuse_an_extent_smaller_than_n():
    import pytensor
    import pytensor.tensor as pt

    from cc2ops.distributed.collectives import Scatter, Shard

    x = pt.matrix("x")
    f = pytensor.function([x], Scatter(3, 0)(x))
    with pytest.raises(ValueError, match=r"Scatter: cannot split an extent of 2 along "
                       r"axis 0 over n=3 devices"):  # fmt: skip
        f(np.zeros((2, 4), dtype=x.dtype))
    g = pytensor.function([x], Shard(4, 1, 1)(x))
    with pytest.raises(ValueError, match=r"Shard: cannot split an extent of 3 along "
                       r"axis 1 over n=4 devices"):  # fmt: skip
        g(np.zeros((2, 3), dtype=x.dtype))
