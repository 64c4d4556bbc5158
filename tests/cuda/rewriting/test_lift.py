"""The lifting machinery and the transfer-cancelling rewrites (structure only, CPU).

A toy host op and a toy GPU op, registered with ``register_lift`` here,
exercise the machinery; each cancelling rule is checked on the graph it
should rewrite and on graphs it must leave alone.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
import pytest
from pytensor.graph.basic import Apply
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.tensor.shape import SpecifyShape
from pytensor.tensor.type import TensorType

import cc2ops.cuda as cuda
from cc2ops._op import Cc2Op
from cc2ops.cuda import GpuFromHost, GpuToGpu, HostFromGpu
from cc2ops.cuda.op import GpuOp, as_gpu_variable, common_device
from cc2ops.cuda.rewriting import lift
from cc2ops.cuda.rewriting.lift import (
    lift_device,
    local_cancel_gpu_host_gpu,
    local_cancel_host_gpu_host,
    local_lift_to_gpu,
    register_lift,
    to_gpu,
)
from cc2ops.cuda.runtime import array as garray
from cc2ops.cuda.transfer import as_gpu_cotangent
from cc2ops.cuda.type import CudaArrayType
from cc2ops.rewriting.db import gpu_lift_db, transfer_cancel_db


class ToyScale(Cc2Op):
    """Host op: ``x * factor``."""

    __props__ = ("factor",)

    def __init__(self, *, factor):
        self.factor = float(factor)

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = np.asarray(inputs[0] * self.factor, dtype=node.outputs[0].dtype)

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]


class ToyScaleSub(ToyScale):
    """A subclass: uses its parent's lifting rule."""


class ToyBad(ToyScale):
    """Its rule returns the wrong number of outputs."""


class GpuToyScale(GpuOp):
    """GPU op: ``x * factor`` (host round trip; never run in these tests)."""

    __props__ = ("factor",)

    def __init__(self, *, factor):
        self.factor = float(factor)

    def make_node(self, x):
        x = as_gpu_variable(x, op="GpuToyScale", role="x")
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        device = self.device_of(node)
        host = garray.to_host(inputs[0], device) * self.factor
        outputs[0][0] = garray.to_gpu(host.astype(inputs[0].dtype), device)

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]

    def pullback(self, inputs, outputs, cotangents):
        g = as_gpu_cotangent(cotangents[0], self.device_of_var(inputs[0]))
        return [GpuToyScale(factor=self.factor)(g)]


@register_lift(ToyScale)
def lift_toy_scale(fgraph, node, device):
    factor = node.op.factor
    if factor == 0:
        return None  # declines
    x = to_gpu(node.inputs[0], device)
    if factor < 0:
        # a "host fallback" built around the same host op: must not loop
        return [
            cuda.gpu_from_host(ToyScale(factor=factor)(cuda.host_from_gpu(x)), device)
        ]
    return [GpuToyScale(factor=factor)(x)]


@register_lift(ToyBad)
def lift_toy_bad(fgraph, node, device):
    x = to_gpu(node.inputs[0], device)
    return [GpuToyScale(factor=1)(x), GpuToyScale(factor=2)(x)]


def gpu_var(shape=(None, 3), device=0, dtype="float32", name="x"):
    return CudaArrayType(dtype, shape, device)(name)


def rewrite(out, include=("fast_run", "cc2ops_gpu")):
    outs = out if isinstance(out, list) else [out]
    fg = FunctionGraph(outputs=outs, clone=False)
    rewrite_graph(fg, include=include, exclude=("inplace",))
    return fg


def structure(fg):
    return [(type(n.op).__name__, n.op._props()) for n in fg.toposort()]


# --------------------------------------------------------------------------
# transfer cancelling
# --------------------------------------------------------------------------


def test_cancel_rules_are_registered_with_both_tags():
    names = {
        "local_cancel_host_gpu_host",
        "local_cancel_gpu_host_gpu",
        "local_gpu_host_gpu_to_gpu_to_gpu",
        "local_cancel_gpu_to_same_gpu",
        "local_merge_gpu_to_gpu",
        "local_host_from_gpu_to_gpu",
        "local_gpu_to_gpu_from_host",
    }
    for tag in ("fast_run", "cc2ops_gpu"):
        registered = {
            getattr(r, "__name__", str(r)) for r in transfer_cancel_db.__db__[tag]
        }
        assert names <= registered, names - registered
    assert local_lift_to_gpu in gpu_lift_db.__db__["cc2ops_gpu"]
    assert local_lift_to_gpu not in gpu_lift_db.__db__.get("fast_run", set())


def test_host_gpu_host_cancels():
    # without lifting (fast_run alone) the round trip is just removed
    h = pt.tensor("h", dtype="float32", shape=(None, 3))
    out = cuda.host_from_gpu(cuda.gpu_from_host(h, 1)) * 2
    fg = rewrite(out, ("fast_run",))
    ops = {type(n.op) for n in fg.apply_nodes}
    assert not ops & {GpuFromHost, HostFromGpu}, ops
    assert h in fg.outputs[0].owner.inputs


def test_an_explicit_upload_lifts_its_consumer_before_the_pair_cancels():
    # in GPU modes an explicit upload says "compute on the GPU": the consumer of
    # host_from_gpu(gpu_from_host(h)) is lifted first, then the pair cancels
    h = pt.tensor("h", dtype="float32", shape=(None, 3))
    out = cuda.host_from_gpu(cuda.gpu_from_host(h, 1)) * 2
    fg = rewrite(out, ("fast_run", "cc2ops_gpu"))
    names = [type(n.op).__name__ for n in fg.toposort()]
    assert names == ["GpuFromHost", "GpuElemwise", "HostFromGpu"], names
    assert fg.outputs[0].owner.inputs[0].type.device == 1


def test_gpu_host_gpu_cancels_on_one_device():
    x = gpu_var()
    out = cuda.gpu_from_host(cuda.host_from_gpu(x), 0)
    fg = rewrite(out)
    assert fg.outputs[0] is x and not fg.apply_nodes


def test_gpu_host_gpu_across_devices_becomes_gpu_to_gpu():
    x = gpu_var(device=0)
    out = cuda.gpu_from_host(cuda.host_from_gpu(x), 1)
    fg = rewrite(out)
    assert structure(fg) == [("GpuToGpu", (0, 1))]
    assert fg.outputs[0].owner.inputs[0] is x
    assert fg.outputs[0].type == CudaArrayType("float32", (None, 3), 1)


def test_gpu_to_same_gpu_cancels():
    x = gpu_var(device=2)
    fg = rewrite(GpuToGpu(2, 2)(x))
    assert fg.outputs[0] is x


def test_gpu_to_gpu_chains_merge():
    x = gpu_var(device=0)
    fg = rewrite(cuda.gpu_to_gpu(cuda.gpu_to_gpu(cuda.gpu_to_gpu(x, 1), 2), 3))
    assert structure(fg) == [("GpuToGpu", (0, 3))]
    back = rewrite(cuda.gpu_to_gpu(cuda.gpu_to_gpu(x, 1), 0))
    assert back.outputs[0] is x


def test_download_after_a_device_copy_reads_the_source():
    x = gpu_var(device=0)
    fg = rewrite(cuda.host_from_gpu(cuda.gpu_to_gpu(x, 1)))
    assert structure(fg) == [("HostFromGpu", ())]
    assert fg.outputs[0].owner.inputs[0] is x


def test_upload_then_device_copy_uploads_to_the_target():
    h = pt.matrix("h", dtype="float32")
    fg = rewrite(cuda.gpu_to_gpu(cuda.gpu_from_host(h, 0), 1))
    assert structure(fg) == [("GpuFromHost", (1,))]
    assert fg.outputs[0].owner.inputs[0] is h


def test_transfers_around_other_ops_stay():
    # the cancelling rules alone (fast_run without cc2ops's lifting, which
    # would move the Mul to the GPU): transfers around a host op are kept
    x = gpu_var()
    h = cuda.host_from_gpu(x) * 2
    out = cuda.gpu_from_host(h, 0)
    fg = FunctionGraph(outputs=[out], clone=False)
    rewrite_graph(fg, include=("fast_run",), exclude=("inplace", "cc2ops_gpu"))
    names = [type(n.op).__name__ for n in fg.toposort()]
    assert names == ["HostFromGpu", "Elemwise", "GpuFromHost"]


def test_cancelling_never_loses_static_shape():
    x = gpu_var(shape=(None, 3))
    # a download whose output claims a more specific shape than x has
    host = Apply(HostFromGpu(), [x], [TensorType("float32", (2, 3))()]).outputs[0]
    up = cuda.gpu_from_host(host, 0)
    assert up.type == CudaArrayType("float32", (2, 3), 0)
    fg = FunctionGraph(outputs=[up], clone=False)
    # x's type is less specific than the upload's: no replacement by x
    assert local_cancel_gpu_host_gpu.transform(fg, up.owner) is None
    # the reverse pair: the replacement gets specify_shape
    h = pt.tensor("h", dtype="float32", shape=(None, 3))
    g = cuda.gpu_from_host(h, 0)
    down = Apply(HostFromGpu(), [g], [TensorType("float32", (2, 3))()]).outputs[0]
    fg = FunctionGraph(outputs=[down], clone=False)
    (new,) = local_cancel_host_gpu_host.transform(fg, down.owner)
    assert isinstance(new.owner.op, SpecifyShape) and new.owner.inputs[0] is h
    assert new.type == down.type


# --------------------------------------------------------------------------
# lifting
# --------------------------------------------------------------------------


def test_host_op_next_to_gpu_data_is_lifted():
    x = gpu_var()
    out = ToyScale(factor=2)(cuda.host_from_gpu(x))
    fg = rewrite(out)
    assert structure(fg) == [("GpuToyScale", (2.0,)), ("HostFromGpu", ())]
    assert fg.outputs[0].type == out.type


def test_lifting_spreads_along_a_chain():
    x = gpu_var()
    h = ToyScale(factor=3)(ToyScale(factor=2)(cuda.host_from_gpu(x)))
    out = cuda.gpu_from_host(ToyScale(factor=5)(h), 0)
    fg = rewrite(out)
    assert structure(fg) == [
        ("GpuToyScale", (2.0,)),
        ("GpuToyScale", (3.0,)),
        ("GpuToyScale", (5.0,)),
    ]
    assert fg.outputs[0].type == out.type


def test_host_op_without_gpu_neighbours_stays():
    h = pt.matrix("h", dtype="float32")
    out = ToyScale(factor=2)(h)
    fg = rewrite(out)
    assert structure(fg) == [("ToyScale", (2.0,))]


def test_host_shape_arithmetic_stays_on_the_host():
    """An integer scalar or vector made from host values only (a shape, a
    size) is not lifted even with a GPU consumer: lifted, its host readers
    would read it back (a device synchronisation); it is uploaded once."""
    h = pt.lvector("h")
    out = cuda.gpu_from_host(ToyScale(factor=2)(h), 0)
    fg = rewrite(out)
    assert structure(fg) == [("ToyScale", (2.0,)), ("GpuFromHost", (0,))]
    # a float of the same graph is lifted; an integer read from the GPU too
    f = cuda.gpu_from_host(ToyScale(factor=2)(pt.vector("f", dtype="float32")), 0)
    assert ("GpuToyScale", (2.0,)) in structure(rewrite(f))
    x = gpu_var(shape=(None,), dtype="int64")
    assert ("GpuToyScale", (2.0,)) in structure(
        rewrite(ToyScale(factor=2)(cuda.host_from_gpu(x)))
    )


def test_a_gpu_consumer_decides_the_device():
    h = pt.matrix("h", dtype="float32")
    out = cuda.gpu_from_host(ToyScale(factor=2)(h), 1)
    fg = rewrite(out)
    assert structure(fg) == [("GpuFromHost", (1,)), ("GpuToyScale", (2.0,))]
    assert fg.outputs[0].type.device == 1


def test_an_input_device_decides_the_device():
    x = gpu_var(device=1)
    fg = rewrite(ToyScale(factor=2)(cuda.host_from_gpu(x)))
    (gpu_node,) = [n for n in fg.apply_nodes if isinstance(n.op, GpuToyScale)]
    assert gpu_node.outputs[0].type.device == 1 and gpu_node.inputs[0] is x


def test_subclasses_use_the_parent_rule():
    x = gpu_var()
    fg = rewrite(ToyScaleSub(factor=2)(cuda.host_from_gpu(x)))
    assert ("GpuToyScale", (2.0,)) in structure(fg)


def test_a_declining_rule_leaves_the_node():
    x = gpu_var()
    fg = rewrite(ToyScale(factor=0)(cuda.host_from_gpu(x)))
    assert structure(fg) == [("HostFromGpu", ()), ("ToyScale", (0.0,))]


def test_a_rule_building_host_ops_terminates():
    x = gpu_var()
    fg = rewrite(ToyScale(factor=-1)(cuda.host_from_gpu(x)))
    assert structure(fg) == [("HostFromGpu", ()), ("ToyScale", (-1.0,))]


def test_lift_device():
    x = gpu_var(device=3)
    node = ToyScale(factor=2)(cuda.host_from_gpu(x)).owner
    assert lift_device(FunctionGraph(outputs=node.outputs, clone=False), node) == 3
    h = pt.matrix("h", dtype="float32")
    y = ToyScale(factor=2)(h)
    out = cuda.gpu_from_host(y, 4)
    fg = FunctionGraph(outputs=[out], clone=False)
    assert lift_device(fg, y.owner) == 4
    fg = FunctionGraph(outputs=[y], clone=False)
    assert lift_device(fg, y.owner) is None


def test_rule_errors_are_reported():
    x = gpu_var()
    out = ToyBad(factor=1)(cuda.host_from_gpu(x))
    fg = FunctionGraph(outputs=[out], clone=False)
    with pytest.raises(
        ValueError, match="lift_toy_bad for .* returned 2 outputs, the node has 1"
    ):
        local_lift_to_gpu.transform(fg, out.owner)


def test_register_lift_validates():
    with pytest.raises(TypeError, match="give at least one host Op class"):
        register_lift()
    with pytest.raises(TypeError, match="is not an Op class"):
        register_lift(int)
    assert lift.lift_rules()[ToyScale] is lift_toy_scale
    assert ToyScale in local_lift_to_gpu.tracks()


def test_to_gpu_helper():
    x = gpu_var(device=0)
    assert to_gpu(cuda.host_from_gpu(x), 0) is x
    assert to_gpu(cuda.host_from_gpu(x), 1).owner.op == GpuToGpu(0, 1)
    h = pt.matrix(dtype="float32")
    assert to_gpu(h, 2).owner.op == GpuFromHost(2)


def test_gpu_op_helpers():
    a, b = gpu_var(device=0), gpu_var(device=1)
    assert common_device("GpuToy", a, pt.scalar(), a) == 0
    with pytest.raises(
        ValueError, match="GpuFilterActs: inputs live on devices 0 and 1"
    ):
        common_device("GpuFilterActs", a, b)
    with pytest.raises(ValueError, match="GpuToy: no input lives on a GPU"):
        common_device("GpuToy", pt.matrix())
    with pytest.raises(
        TypeError, match="GpuToyScale: x must be a GPU variable .* lift"
    ):
        GpuToyScale(factor=1)(pt.matrix(dtype="float32"))
    with pytest.raises(ValueError, match="x lives on device 1, expected device 0"):
        as_gpu_variable(b, 0, op="GpuToy", role="x")
    assert as_gpu_variable(a, 0) is a and as_gpu_variable(b) is b
    with pytest.raises(
        TypeError,
        match=r"GpuOp: input must be a GPU variable \(CudaArrayType\), got ndarray",
    ):
        as_gpu_variable(np.zeros(2))
    node = GpuToyScale(factor=2)(a).owner
    assert node.op.device_of(node) == 0
    assert node.op.do_constant_folding(None, node) is False
    mixed = Apply(GpuToyScale(factor=1), [a], [b.type()])
    with pytest.raises(ValueError, match="GpuToyScale: the node spans devices 0 and 1"):
        mixed.op.device_of(mixed)


def test_lifted_graph_gradient_stays_typed():
    import pytensor

    x = gpu_var(shape=(None,))
    cost = ToyScale(factor=1)(cuda.host_from_gpu(x)).sum()
    fg = rewrite(cost)
    lifted = fg.outputs[0]
    (g,) = pytensor.grad(lifted, [x])
    assert g.type == x.type
