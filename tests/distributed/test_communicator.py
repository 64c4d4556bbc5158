"""Communicators, checkpoints and the SPMD op in one process (no mpirun needed).

A single-process MPI world (mpi4py's singleton) runs every collective of
:class:`MPICommunicator` with size 1; the multi-rank behaviour is tested under
``mpirun`` in ``test_spmd.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mpi4py")

from cc2ops.distributed import checkpoint  # noqa: E402
from cc2ops.distributed.communicator import (  # noqa: E402
    MPICommunicator,
    default_timeout,
)
from cc2ops.distributed.spmd import SpmdCollective  # noqa: E402


@pytest.fixture(scope="module")
def comm():
    return MPICommunicator(timeout=30, name="world")


def test_collectives_of_one_rank_are_copies_with_shapes_and_dtypes(comm):
    r = np.random.default_rng(0)
    x = r.normal(size=(3, 5)).astype("float32")
    for got in (
        comm.all_reduce(x),
        comm.all_gather(x, 1),
        comm.reduce_scatter(x, 0),
        comm.broadcast(x, 0, "float32", 2),
    ):
        assert got.shape == x.shape and got.dtype == x.dtype
        np.testing.assert_array_equal(got, x)
    scalar = comm.all_reduce(np.float32(2.5))
    assert scalar.shape == () and scalar == np.float32(2.5)
    assert comm.all_gather_ints([4, 7]).tolist() == [[4, 7]]


def test_reduce_scatter_refuses_sizes_that_do_not_split_the_extent(comm):
    with pytest.raises(ValueError, match=r"rs: sizes \[2\] do not split an extent "
                       r"of 3 into 1 pieces"):  # fmt: skip
        comm.reduce_scatter(np.zeros((3, 2)), 0, [2], "rs")


@pytest.mark.parametrize(
    "timeout,error,message",
    [
        ("5", TypeError, "timeout must be a number of seconds, got str '5'"),
        (True, TypeError, "got bool True"),
        (0, ValueError, "timeout must be > 0 seconds, got 0"),
        (-1.5, ValueError, "got -1.5"),
    ],
)
def test_bad_timeouts_are_refused_by_name(timeout, error, message):
    with pytest.raises(error, match=message) as info:
        MPICommunicator(timeout=timeout)
    assert str(info.value).startswith("MPICommunicator: timeout must be ")


def test_the_default_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("CC2OPS_COMM_TIMEOUT", "12.5")
    assert default_timeout() == 12.5
    monkeypatch.setenv("CC2OPS_COMM_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="CC2OPS_COMM_TIMEOUT must be a number"):
        default_timeout()
    monkeypatch.setenv("CC2OPS_COMM_TIMEOUT", "0")
    with pytest.raises(ValueError, match=r"CC2OPS_COMM_TIMEOUT must be > 0 seconds"):
        default_timeout()


def test_checkpoints_round_trip_and_refuse_other_files(tmp_path, comm):
    import pytensor

    a = pytensor.shared(np.arange(6, dtype="float32").reshape(2, 3), name="a")
    s = pytensor.shared(np.array([1, 2, 3, 4], dtype="uint32"), name="s")
    path = checkpoint.save(tmp_path / "c.npz", [a, s], step=7)
    got = checkpoint.load(path)
    assert sorted(got) == ["a", "s", "step"]
    np.testing.assert_array_equal(got["a"], a.get_value())
    assert got["s"].dtype == np.uint32 and int(got["step"]) == 7
    np.savez(tmp_path / "other.npz", a=np.zeros(2))
    with pytest.raises(ValueError, match="is not a cc2ops.distributed checkpoint"):
        checkpoint.load(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="variables need unique names"):
        checkpoint.save(tmp_path / "d.npz", [a, a])


def test_the_spmd_op_refuses_unknown_kinds_and_non_token_inputs():
    with pytest.raises(ValueError, match="SpmdCollective: kind must be one of"):
        SpmdCollective("gather", 0, "x")
    op = SpmdCollective("all_reduce", 0, "x", dtype="float32", ndim=1)
    with pytest.raises(TypeError, match="token must be an int64 scalar"):
        op(np.float32(0), np.zeros(3, "float32"))


@pytest.mark.parametrize("keep_trivial", [True, False])
def test_the_gpu_step_of_one_rank_builds_without_a_gpu(keep_trivial):
    """Rank graphs in ``cc2ops.cuda.mode``: lifted GPU ops; on one rank the
    collectives vanish unless kept (the 1-rank NCCL test keeps them)."""
    import pytensor
    import pytensor.tensor as pt
    from pytensor.compile.maker import construct_function_ins_and_outs

    import cc2ops
    from cc2ops import cuda
    from cc2ops import distributed as dist
    from cc2ops.distributed import hybrid as mg

    r = np.random.default_rng(0)
    w = cuda.shared(r.normal(size=(2, 3, 3, 3)).astype("float32"), device=0, name="w")
    f = cuda.shared(r.normal(size=(8, 4)).astype("float32"), device=0, name="f")
    x, y = pt.tensor4("x", dtype="float32"), pt.ivector("y")
    h = cc2ops.conv2d(x, w, stride=4)
    loss = cc2ops.softmax_cross_entropy(pt.dot(h.flatten(2), f), y).mean()
    m = dist.mode(base=cuda.mode(device=0), keep_trivial=keep_trivial)
    loss = mg.distribute(loss, m, scheme="b")
    gw, gf = pytensor.grad(loss, [w, f])
    ups = [(w, w - np.float32(0.1) * gw), (f, f - np.float32(0.1) * gf)]
    ins, outs = construct_function_ins_and_outs([x, y], loss, updates=ups)
    fg = m.function_maker(ins, outs, m).maker.fgraph
    kinds = {type(n.op).__name__ for n in fg.apply_nodes}
    assert {"GpuFilterActs", "GpuWeightActs"} <= kinds
    assert ("SpmdCollective" in kinds) == keep_trivial
