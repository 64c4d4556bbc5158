"""Hybrid data/model parallelism ("one weird trick", Krizhevsky 2014), a graph rewrite.

The convolutional segment runs data-parallel (each device its shard of the
batch, with its own replica of the conv weights); the fully connected segment
runs model-parallel (each device a slice of every FC layer's output units,
for the whole batch). The user writes the single-device model; two steps turn
it into K-device training:

1. ``cost = distribute(cost, devices=K)`` **before** ``pytensor.grad``.
   Every variable of the forward graph gets a *placement* over the K
   devices, and small rules (the table :data:`RULES`, below) rebuild each
   node per device, inserting collectives (:mod:`cc2ops.distributed.collectives`)
   where placements do not fit. The result is a graph with the single-device
   value; ``pytensor.grad`` of it goes through the collectives' pullbacks
   (the pullback of an all-gather is a reduce-scatter, of a broadcast a
   reduce), so gradients are exact by construction. In this graph the
   parameters are still the user's shared variables, distributed each step
   (``Broadcast`` for replicated conv weights, ``Scatter`` by output units
   for FC weights), with gradients summed back (``Reduce`` / ``Gather``).
2. ``pytensor.function(..., updates=..., mode=multi_gpu.mode(K))`` (or
   ``cc2ops.cuda.mode(devices=[...])``): the mode's function maker
   *localises the state*. Each distributed shared variable (and, by a fixed
   point over the update pairs, its momentum) becomes K per-device shared
   variables, replicas or shards; ``Reduce`` of a replicated weight's
   gradient becomes an ``AllReduce`` and the user's (elementwise) update
   rule is applied identically on every device, so replicas stay equal;
   ``Gather`` of a sharded weight's gradient becomes the local shard.

Placements (:class:`Placement`)
-------------------------------
``root``         one value, not distributed (inputs, constants, shapes)
``replicated``   every device holds the whole value
``sharded(a)``   device k holds piece k along axis a (``numpy.array_split``)
``partial``      device k holds a summand; the value is the sum

The rule table
--------------
Each rule takes a node whose inputs have placements and returns per-device
outputs (or ``None`` to pass). In order::

    batch_separable registered ops (conv, pools, norms, softmax loss) in the
                    conv segment or with distributed inputs: batched inputs
                    -> sharded(0), the others replicated -> sharded(0)
    all_root        every input root                -> the node as is (root)
    dropout         sharded(0) with rows of a static size % 4 == 0 -> sharded(0)
                    (each device the mask slice of its examples); partial ->
                    partial; else replicated (the state stays root)
    shape           Shape/Shape_i of a distributed value -> root global shape
    partial_linear  Add/Sub/Neg of partials, partial * or / replicated -> partial
    elemwise        sharded(a) with others broadcasting or sharded(a)
                    -> sharded(a); replicated/root mixes -> replicated
    dimshuffle      the sharded axis moves with its dimension
    reshape         sharded(0) keeping the batch as axis 0 (``flatten(2)``)
                    -> sharded(0), per device with its local batch extent
    matmul_fc       a product in the FC segment: left replicated (scheme a:
                    all-gather; scheme b: one worker's batch at a time by
                    broadcast), right sharded(1) -> sharded(1)
    matmul_data     a product in the conv segment: left sharded(0), right
                    replicated -> sharded(0)
    sum             sum over a sharded axis -> partial (rejected in the conv
                    segment: batch-norm-like reductions are not separable)
    transfer        host <-> GPU copies keep the placement, per device label
    fallback        conv segment: error naming the op; elsewhere gather
                    every input and run the op on every device -> replicated

Converting a value to a placement inserts at most one collective: sharded
-> replicated is ``AllGather``, partial -> replicated ``AllReduce``, partial
-> sharded ``ReduceScatter``, replicated -> sharded a local ``Shard``; a
root shared variable becomes ``Broadcast``/``Scatter`` and a root data input
``Scatter``. Root subgraphs of cheap ops (elementwise, dimshuffle) are
replicated or sharded at their leaves, so ``b.dimshuffle('x', 0)`` of an FC
bias scatters ``b`` itself.

The segments: the conv segment is everything computing the *split variable*,
by default the left operand of the first matrix product whose left operand is
a reshape of a >= 3-dim activation (the flattened conv output), or
``split_at=<variable>``. Nodes downstream of it are the FC segment.

Notes
-----
- Exactness: every rule keeps the value (concatenation, sum or copy of the
  per-device values equals the single-device value), so the loss and the
  gradients equal the single-device ones up to float rounding (sums in
  another order). The mean loss divides the sum of the K shard sums by the
  global batch size.
- Uneven batches are allowed: shards follow ``numpy.array_split`` (the first
  ``B % K`` devices get one more example); each device needs >= 1 example.
- Only elementwise update rules (SGD, momentum, weight decay...) can be
  localised; others raise ``ValueError`` at compile time.
- Compiling a model (a data input with >= 1 dim, or a conv/pool/norm/loss
  op) in a K > 1 multi-device mode without :func:`distribute` raises
  ``ValueError`` (it would silently run on one device). Graphs of scalar
  inputs and shared state, hand-written multi-device graphs (several device
  labels, or collectives) and inner graphs (Scan) compile unchanged.
- A sharded original shared variable is a view afterwards: ``get_value`` /
  ``set_value`` on it assemble / split the shards; other compiled functions
  that read it see its last synchronised value (call :func:`sync`).
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.io import In
from pytensor.compile.maker import FunctionMaker
from pytensor.compile.mode import Mode
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors, graph_inputs, toposort
from pytensor.scalar.basic import Add, Cast, Identity, Mul, Neg, Sub, TrueDiv
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.math import Dot, Sum
from pytensor.tensor.shape import Reshape, Shape, Shape_i

from cc2ops.conv import FilterActs
from cc2ops.cross_map_norm import CrossMapNorm
from cc2ops.distributed import seam
from cc2ops.distributed.collectives import CommBackend, VirtualBackend, shard_bounds
from cc2ops.dropout import Dropout, DropoutAdvance
from cc2ops.pool import AvgPool, MaxPool
from cc2ops.softmax_cross_entropy import SoftmaxCrossEntropy, TopKError

__all__ = [
    "Placement",
    "ROOT",
    "REPLICATED",
    "PARTIAL",
    "sharded",
    "Dist",
    "RULES",
    "register_batch_separable",
    "batch_separable_ops",
    "find_split",
    "Distributor",
    "distribute",
    "MultiDeviceMode",
    "mode",
    "sync",
    "comm_kind",
    "device_labels",
    "NotBatchSeparableError",
]


# --------------------------------------------------------------------------
# placements
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """How a value lives on the K devices (see the module docstring)."""

    kind: str
    axis: int | None = None

    def __str__(self) -> str:
        return f"sharded({self.axis})" if self.kind == "sharded" else self.kind


ROOT = Placement("root")
REPLICATED = Placement("replicated")
PARTIAL = Placement("partial")


def sharded(axis: int) -> Placement:
    """The placement "device k holds piece k along ``axis``"."""
    return Placement("sharded", int(axis))


@dataclass
class Dist:
    """A placed value: its placement and its variables (1 for root, else K)."""

    placement: Placement
    vars: tuple[Variable, ...]


class NotBatchSeparableError(ValueError):
    """An op in the conv (data-parallel) segment cannot run on batch shards."""


def comm_kind(op: Any) -> str | None:
    """The collective an op performs (``"all_gather"``, ``"broadcast"``...) or None.

    Host ops of :mod:`cc2ops.distributed.collectives` and the GPU ops of
    :mod:`cc2ops.cuda.ops.comm` both carry it (class attribute ``comm_kind``).
    """
    return getattr(op, "comm_kind", None)


# --------------------------------------------------------------------------
# batch-separable ops: which inputs carry the batch (axis 0, bc01)
# --------------------------------------------------------------------------

_BATCHED: dict[type, tuple[int, ...]] = {}


def register_batch_separable(op_class: type, batched: Sequence[int] = (0,)) -> None:
    """Declare ``op_class`` batch-separable: running it on batch shards of the
    inputs listed in ``batched`` (batch = axis 0 of each, and of every output)
    and concatenating equals running it on the batch. Its other inputs are
    parameters, replicated on every device.
    """
    _BATCHED[op_class] = tuple(int(i) for i in batched)


def batch_separable_ops() -> dict[type, tuple[int, ...]]:
    """The registered ``{op class: batched input indices}`` (a copy)."""
    return dict(_BATCHED)


for _cls, _batched in (
    (FilterActs, (0,)),
    (MaxPool, (0,)),
    (AvgPool, (0,)),
    (CrossMapNorm, (0,)),
    (SoftmaxCrossEntropy, (0, 1)),
    (TopKError, (0, 1)),
):
    register_batch_separable(_cls, _batched)


def _batched_inputs(op: Any) -> tuple[int, ...] | None:
    for cls in type(op).__mro__:
        if cls in _BATCHED:
            return _BATCHED[cls]
    return None


def _is_matmul(node: Any) -> bool:
    op = node.op
    if isinstance(op, Blockwise):
        op = op.core_op
    return (
        isinstance(op, Dot)
        and len(node.inputs) == 2
        and all(i.type.ndim == 2 for i in node.inputs)
    )


# --------------------------------------------------------------------------
# segments
# --------------------------------------------------------------------------


def find_split(outputs: Sequence[Variable]) -> Variable:
    """The split variable: the flattened conv activations entering the first FC.

    The left operand of the first matrix product (in topological order) whose
    left operand is a ``Reshape`` of a tensor with >= 3 dims.

    Raises
    ------
    ValueError
        When there is no such product (pass ``split_at`` explicitly).
    """
    for node in toposort(list(outputs)):
        if not _is_matmul(node):
            continue
        left = node.inputs[0]
        owner = left.owner
        if owner is not None and isinstance(owner.op, Reshape):
            if owner.inputs[0].type.ndim >= 3:
                return left
    raise ValueError(
        "multi_gpu: no fully connected product on flattened activations found "
        "(a dot whose left operand is a reshape of a >= 3-dim tensor); pass "
        "split_at=<the variable that ends the conv segment>"
    )


# --------------------------------------------------------------------------
# the distributor
# --------------------------------------------------------------------------

#: Ops whose root subgraphs are distributed at their leaves rather than
#: computed on the root and then sent (cheap, placement-transparent).
_CHEAP = (Elemwise, DimShuffle)


class Distributor:
    """Places a graph on K devices with the rule table (module docstring).

    Parameters
    ----------
    backend : CommBackend
        Builds the collectives
        (:class:`~cc2ops.distributed.collectives.VirtualBackend`, or a GPU
        backend from :mod:`cc2ops.cuda.ops.comm`).
    conv_nodes : set of Apply
        The nodes of the conv (data-parallel) segment.
    fc_nodes : set of Apply
        The nodes of the FC (model-parallel) segment.
    scheme : {"a", "b"}
        How the FC segment gets the conv activations: ``"a"`` all-gathers them,
        ``"b"`` broadcasts one worker's shard at a time.
    rules : sequence of callables, optional
        The rule table (default :data:`RULES`).
    """

    def __init__(
        self,
        backend: CommBackend,
        conv_nodes: set | None = None,
        fc_nodes: set | None = None,
        scheme: str = "a",
        rules: Sequence[Callable] | None = None,
    ) -> None:
        if scheme not in ("a", "b"):
            raise ValueError(f"multi_gpu: scheme must be 'a' or 'b', got {scheme!r}")
        self.backend = backend
        self.k = backend.n
        self.conv_nodes = conv_nodes or set()
        self.fc_nodes = fc_nodes or set()
        self.scheme = scheme
        self.rules = list(RULES if rules is None else rules)
        self.memo: dict[Variable, Dist] = {}
        self._cache: dict[tuple, Any] = {}
        #: node -> device position, for the per-device nodes built (structure tests)
        self.device_of: dict[Any, int] = {}

    # ---- bookkeeping -----------------------------------------------------
    def dist(self, var: Variable) -> Dist:
        d = self.memo.get(var)
        if d is None:
            d = Dist(ROOT, (var,))
            self.memo[var] = d
        return d

    def set(
        self, var: Variable, placement: Placement, vars_: Sequence[Variable]
    ) -> None:
        self.memo[var] = Dist(placement, tuple(vars_))

    def _tag(self, per_device: Sequence[Variable]) -> list[Variable]:
        for k, v in enumerate(per_device):
            if v.owner is not None and v.owner not in self.device_of:
                self.device_of[v.owner] = k
        return list(per_device)

    def per_device(self, node: Any, inputs_k: Sequence[Sequence[Variable]]) -> list:
        """Clone ``node`` once per device with ``inputs_k[k]``; K lists of outputs."""
        outs = []
        for k in range(self.k):
            new = node.op.make_node(*inputs_k[k])
            self.device_of[new] = k
            outs.append(new.outputs)
        return outs

    # ---- conversions -------------------------------------------------------
    def replicated(self, var: Variable) -> list[Variable]:
        """``var``'s value on every device."""
        d = self.dist(var)
        p = d.placement
        if p == REPLICATED:
            return list(d.vars)
        key = ("replicated", var)
        if key in self._cache:
            return self._cache[key]
        if p.kind == "sharded":
            out = self._tag(self.backend.all_gather(d.vars, p.axis))
        elif p == PARTIAL:
            out = self._tag(self.backend.all_reduce(d.vars))
        else:
            out = self._replicate_root(var, d.vars[0])
        self._cache[key] = out
        return out

    def _replicate_root(self, var: Variable, value: Variable) -> list[Variable]:
        if isinstance(var, Constant):
            return [self.backend.place(var, k) for k in range(self.k)]
        src = _peel(var) if value is var else var
        if src.owner is None and not isinstance(src, Constant):
            # a shared parameter or a data input (possibly through a transfer):
            # the same value on every device
            return self._tag(self.backend.broadcast(src))
        node = var.owner
        if value is var and isinstance(node.op, _CHEAP):
            inputs_k = list(
                zip(*[self.replicated(i) for i in node.inputs], strict=True)
            )
            outs = self.per_device(node, inputs_k)
            for o, per in zip(node.outputs, zip(*outs, strict=True), strict=True):
                self._cache[("replicated", o)] = list(per)
            return self._cache[("replicated", var)]
        # a root value computed from distributed ones (shapes): a host value
        return [self.backend.place(value, k) for k in range(self.k)]

    def sharded(self, var: Variable, axis: int) -> list[Variable]:
        """``var``'s piece k along ``axis`` on device k."""
        d = self.dist(var)
        p = d.placement
        if p == sharded(axis):
            return list(d.vars)
        key = ("sharded", axis, var)
        if key in self._cache:
            return self._cache[key]
        if p == PARTIAL:
            out = self._tag(self.backend.reduce_scatter(d.vars, axis))
        elif p == REPLICATED or p.kind == "sharded":
            full = self.replicated(var)
            out = self._tag(
                [self.backend.shard(full[k], k, axis) for k in range(self.k)]
            )
        else:
            out = self._shard_root(var, d.vars[0], axis)
        self._cache[key] = out
        return out

    def _shard_root(self, var: Variable, value: Variable, axis: int) -> list[Variable]:
        if var.type.broadcastable[axis]:
            return self.replicated(var)
        if isinstance(var, Constant):
            pieces = [self.backend.shard(var, k, axis) for k in range(self.k)]
            return [self.backend.place(p, k) for k, p in enumerate(pieces)]
        src = _peel(var) if value is var else var
        if src.owner is None and not isinstance(src, Constant):
            return self._tag(self.backend.scatter(src, axis))
        node = var.owner
        if value is var and isinstance(node.op, DimShuffle):
            order = node.op.new_order
            src = order[axis]
            (inp,) = node.inputs
            inputs_k = [[v] for v in self.sharded(inp, src)]
            return [outs[0] for outs in self.per_device(node, inputs_k)]
        if value is var and isinstance(node.op, Elemwise) and len(node.outputs) == 1:
            per_input = [
                self.replicated(i)
                if i.type.broadcastable[axis]
                else self.sharded(i, axis)
                for i in node.inputs
            ]
            inputs_k = list(zip(*per_input, strict=True))
            return [outs[0] for outs in self.per_device(node, inputs_k)]
        return self._tag(self.backend.scatter(value, axis))

    def root(self, var: Variable) -> Variable:
        """``var``'s value as one root variable."""
        d = self.dist(var)
        p = d.placement
        if p in (ROOT, REPLICATED):
            return d.vars[0]
        key = ("root", var)
        if key not in self._cache:
            if p == PARTIAL:
                self._cache[key] = self.backend.reduce(d.vars)
            else:
                self._cache[key] = self.backend.gather(d.vars, p.axis)
        return self._cache[key]

    # ---- the walk --------------------------------------------------------
    def run(self, outputs: Sequence[Variable]) -> list[Variable]:
        """Place every node computing ``outputs``; returns their root values."""
        self.place(outputs)
        return [self.root(o) for o in outputs]

    def place(self, outputs: Sequence[Variable]) -> None:
        """Apply the rule table to every node computing ``outputs``, in order."""
        for node in toposort(list(outputs), blockers=list(self.memo)):
            if all(o in self.memo for o in node.outputs):
                continue
            dists = [self.dist(i) for i in node.inputs]
            for rule in self.rules:
                result = rule(self, node, dists)
                if result is not None:
                    break
            else:  # pragma: no cover - the fallback rule always answers
                raise RuntimeError(f"multi_gpu: no rule placed {node}")
            placement, outs = result
            for i, o in enumerate(node.outputs):
                if placement == ROOT:
                    self.set(o, ROOT, [outs[0][i]])
                else:
                    self.set(o, placement, [outs[k][i] for k in range(self.k)])


def _distributed(dists: Sequence[Dist]) -> bool:
    return any(d.placement != ROOT for d in dists)


# ---- the rules --------------------------------------------------------------


def rule_all_root(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """Every input root -> the node itself (rebuilt if an input was), root."""
    if _distributed(dists):
        return None
    new_inputs = [d.vars[0] for d in dists]
    if all(n is o for n, o in zip(new_inputs, node.inputs, strict=True)):
        return ROOT, [node.outputs]
    return ROOT, [node.op.make_node(*new_inputs).outputs]


def rule_shape(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """Shape / Shape_i of a distributed value -> its global shape, root.

    sharded(a): extent a is the sum of the devices' extents.
    """
    if not isinstance(node.op, (Shape, Shape_i)):
        return None
    d = dists[0]
    x = node.inputs[0]

    def extent(i: int) -> Variable:
        if d.placement.kind == "sharded" and d.placement.axis == i:
            return (
                pt.add(*[v.shape[i] for v in d.vars])
                if dz.k > 1
                else d.vars[0].shape[i]
            )
        return d.vars[0].shape[i]

    if isinstance(node.op, Shape_i):
        out = pt.cast(extent(node.op.i), node.outputs[0].type.dtype)
    else:
        out = pt.cast(pt.stack([extent(i) for i in range(x.type.ndim)]), "int64")
    return ROOT, [[out]]


def _scalar_op(node: Any) -> Any:
    return node.op.scalar_op if isinstance(node.op, Elemwise) else None


def rule_partial_linear(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """Linear maps of partial sums stay partial (no communication).

    Add/Sub of partials; Neg/Cast/Identity of a partial; a partial times a
    replicated or root value; a partial divided by one.
    """
    sop = _scalar_op(node)
    kinds = [d.placement for d in dists]
    if sop is None or PARTIAL not in kinds:
        return None
    n_partial = sum(p == PARTIAL for p in kinds)
    ok = False
    if isinstance(sop, (Add, Sub)):
        ok = n_partial == len(kinds)
    elif isinstance(sop, (Neg, Cast, Identity)):
        ok = True
    elif isinstance(sop, Mul):
        ok = n_partial == 1 and all(p in (ROOT, REPLICATED, PARTIAL) for p in kinds)
    elif isinstance(sop, TrueDiv):
        ok = kinds[0] == PARTIAL and kinds[1] in (ROOT, REPLICATED)
    if not ok:
        return None
    per_input = [
        list(d.vars) if d.placement == PARTIAL else dz.replicated(i)
        for d, i in zip(dists, node.inputs, strict=True)
    ]
    return PARTIAL, dz.per_device(node, list(zip(*per_input, strict=True)))


def rule_elemwise(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """Elemwise: sharded(a) wins (inputs broadcasting along a are replicated,
    the others sharded along a); else everything replicated."""
    if not isinstance(node.op, Elemwise):
        return None
    axes = [d.placement.axis for d in dists if d.placement.kind == "sharded"]
    if axes:
        a = axes[0]
        per_input = [
            dz.replicated(i) if i.type.broadcastable[a] else dz.sharded(i, a)
            for i in node.inputs
        ]
        placement = sharded(a)
    else:
        per_input = [dz.replicated(i) for i in node.inputs]
        placement = REPLICATED
    return placement, dz.per_device(node, list(zip(*per_input, strict=True)))


def rule_dimshuffle(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """DimShuffle: the sharded axis moves with its dimension."""
    if not isinstance(node.op, DimShuffle):
        return None
    (d,) = dists
    p = d.placement
    if p.kind == "sharded":
        order = list(node.op.new_order)
        if p.axis not in order:
            return None
        placement = sharded(order.index(p.axis))
    else:
        placement = p
    return placement, dz.per_device(node, [[v] for v in d.vars])


def rule_reshape(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """Reshape of a sharded(0) value keeping the batch as axis 0 -> sharded(0).

    Device k reshapes to ``(local batch,) + shape[1:]``. A reshape that does
    not keep the batch axis fails on the devices (sizes do not match), it
    cannot silently mix examples: ``B_k * prod(shape[1:])`` equals the shard's
    size only if ``shape[0]`` was the global batch.
    """
    if not isinstance(node.op, Reshape):
        return None
    x, shp = node.inputs
    p = dists[0].placement
    if p in (REPLICATED, PARTIAL):
        shp_k = dz.replicated(shp)
        return p, dz.per_device(
            node, [[v, s] for v, s in zip(dists[0].vars, shp_k, strict=True)]
        )
    if p != sharded(0) or node.outputs[0].type.ndim < 1:
        return None
    shp_k = dz.replicated(shp)
    inputs_k = []
    for v, s in zip(dists[0].vars, shp_k, strict=True):
        local = pt.concatenate([pt.cast(v.shape[:1], "int64"), pt.cast(s[1:], "int64")])
        inputs_k.append([v, local])
    return sharded(0), dz.per_device(node, inputs_k)


def rule_batch_separable(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """A registered batch-separable op: batched inputs sharded(0), others
    replicated -> every output sharded(0)."""
    batched = _batched_inputs(node.op)
    if batched is None or (not _distributed(dists) and node not in dz.conv_nodes):
        # the data-parallel segment starts at its first batch-separable op
        return None
    per_input = [
        dz.sharded(i, 0) if idx in batched else dz.replicated(i)
        for idx, i in enumerate(node.inputs)
    ]
    return sharded(0), dz.per_device(node, list(zip(*per_input, strict=True)))


def _aligned_rows(x: Variable) -> bool:
    """Rows (everything after axis 0) of a static size divisible by 4."""
    rest = x.type.shape[1:]
    if x.type.ndim < 2 or any(s is None for s in rest):
        return False
    return int(np.prod(rest, dtype=np.int64)) % 4 == 0


def rule_dropout(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """Dropout (:mod:`cc2ops.dropout`): the mask of element ``i`` is a function of
    the state and ``i`` (C order), so a device can draw the mask of its slice.

    x sharded(0) with rows of a static size divisible by 4 -> sharded(0), no
    communication: device k uses the state advanced past the elements of the
    shards before it (``DropoutAdvance(state, offset_k)``; ``offset_k`` is a
    multiple of 4, so its Philox blocks start at block ``offset_k / 4``).
    x partial -> partial (dropout is linear). Otherwise (sharded by FC output
    units, or unaligned rows) x replicated -> replicated: in the FC segment this
    is the all-gather the next product needs anyway, plus K copies of an
    elementwise op. The state stays one root host value read by every device,
    and its default update (the counter advance) is rewritten to count the
    global size from the per-device shapes, so it no longer reads the
    single-device graph.
    """
    if not isinstance(node.op, Dropout):
        return None
    (d, ds) = dists
    if d.placement == ROOT or ds.placement != ROOT:
        return None
    x, state = node.inputs
    if d.placement == sharded(0) and _aligned_rows(x):
        states: list[Variable] = [state]
        offset = None
        for v in d.vars[:-1]:
            offset = v.size if offset is None else offset + v.size
            states.append(DropoutAdvance()(state, offset))
        placement = d.placement
        inputs_k = [[v, st] for v, st in zip(d.vars, states, strict=True)]
        total = pt.add(*[v.size for v in d.vars]) if dz.k > 1 else d.vars[0].size
    elif d.placement == PARTIAL:
        placement = PARTIAL
        inputs_k = [[v, state] for v in d.vars]
        total = d.vars[0].size
    else:
        placement = REPLICATED
        inputs_k = [[v, state] for v in dz.replicated(x)]
        total = inputs_k[0][0].size
    upd = getattr(state, "default_update", None)
    if (
        upd is not None
        and upd.owner is not None
        and isinstance(upd.owner.op, DropoutAdvance)
        and upd.owner.inputs[0] is state
    ):
        with warnings.catch_warnings():
            # deprecated in PyTensor 3 but honoured (cc2ops.dropout sets it too)
            warnings.simplefilter("ignore", DeprecationWarning)
            state.default_update = DropoutAdvance()(state, total)
    return placement, dz.per_device(node, inputs_k)


def rule_matmul_fc(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """A product in the FC segment: model-parallel by output units.

    Right operand sharded(1) (each device a slice of the output units); left
    operand whole on every device: scheme a all-gathers it, scheme b (for
    batch-sharded activations) broadcasts worker j's shard, multiplies it on
    every device and stacks the K row blocks. Output sharded(1).
    """
    if node not in dz.fc_nodes or not _is_matmul(node):
        return None
    left, right = node.inputs
    w_k = dz.sharded(right, 1)
    if dz.scheme == "b" and dists[0].placement == sharded(0) and dz.k > 1:
        shards = dists[0].vars
        rows: list[list[Variable]] = [[] for _ in range(dz.k)]
        for j in range(dz.k):
            copies = dz._tag(dz.backend.broadcast(shards[j], root=j))
            outs = dz.per_device(node, [[copies[k], w_k[k]] for k in range(dz.k)])
            for k in range(dz.k):
                rows[k].append(outs[k][0])
        out = [[pt.concatenate(rows[k], axis=0)] for k in range(dz.k)]
        dz._tag([o[0] for o in out])
        return sharded(1), out
    x_k = dz.replicated(left)
    return sharded(1), dz.per_device(node, [[x_k[k], w_k[k]] for k in range(dz.k)])


def rule_matmul_data(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """A product on batch-sharded rows outside the FC segment: data-parallel."""
    if not _is_matmul(node) or dists[0].placement != sharded(0):
        return None
    left, right = node.inputs
    w_k = dz.replicated(right)
    return sharded(0), dz.per_device(
        node, [[v, w_k[k]] for k, v in enumerate(dists[0].vars)]
    )


def rule_sum(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """Sum: over a sharded axis -> partial; over other axes the shard axis
    shifts; replicated/partial stay. Reducing the batch in the conv segment is
    refused (batch statistics are not batch-separable)."""
    if not isinstance(node.op, CAReduce):
        return None
    (d,) = dists
    p = d.placement
    ndim = node.inputs[0].type.ndim
    axes = tuple(range(ndim)) if node.op.axis is None else tuple(node.op.axis)
    if p.kind == "sharded" and p.axis in axes:
        if node in dz.conv_nodes:
            raise NotBatchSeparableError(
                f"multi_gpu: {node.op} reduces over the batch axis in the conv "
                "(data-parallel) segment; batch-norm-like statistics over the batch "
                "are not batch-separable (move the split point with split_at, or "
                "compute them per example)"
            )
        if not isinstance(node.op, Sum):
            return None
        return PARTIAL, dz.per_device(node, [[v] for v in d.vars])
    if p.kind == "sharded":
        placement = sharded(p.axis - sum(a < p.axis for a in axes))
    elif p == PARTIAL and not isinstance(node.op, Sum):
        return None
    else:
        placement = p
    return placement, dz.per_device(node, [[v] for v in d.vars])


def rule_transfer(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """host <-> GPU transfers of a distributed value: per device, to that
    device's label; the placement is kept (the transfer ops are the ones the
    device backend registered, :mod:`cc2ops.distributed.seam`)."""
    direction = seam.transfer_direction(node.op)
    if direction is None:
        return None
    (d,) = dists
    if direction == "to_host":
        outs = [[seam.to_host(v)] for v in d.vars]
    else:
        outs = [[seam.to_device(v, dz.backend.labels[k])] for k, v in enumerate(d.vars)]
    dz._tag([o[0] for o in outs])
    return d.placement, outs


def rule_fallback(dz: Distributor, node: Any, dists: Sequence[Dist]):
    """Anything else: refused in the conv segment; elsewhere every input is
    gathered and the op runs on every device (replicated)."""
    if node in dz.conv_nodes and any(d.placement.kind == "sharded" for d in dists):
        raise NotBatchSeparableError(
            f"multi_gpu: {node.op} ({type(node.op).__name__}) in the conv "
            "(data-parallel) segment has no rule for batch-sharded inputs; if it is "
            "batch-separable declare it with cc2ops.distributed.hybrid."
            "register_batch_separable(OpClass, batched=(input indices)), else move "
            "the split point with split_at"
        )
    per_input = [dz.replicated(i) for i in node.inputs]
    return REPLICATED, dz.per_device(node, list(zip(*per_input, strict=True)))


#: The rule table, tried in order (the first answer wins).
RULES: tuple[Callable, ...] = (
    rule_batch_separable,
    rule_all_root,
    rule_dropout,
    rule_shape,
    rule_partial_linear,
    rule_elemwise,
    rule_dimshuffle,
    rule_reshape,
    rule_matmul_fc,
    rule_matmul_data,
    rule_sum,
    rule_transfer,
    rule_fallback,
)


# --------------------------------------------------------------------------
# step 1: distribute a cost
# --------------------------------------------------------------------------


def _segments(outputs: Sequence[Variable], split: Variable) -> tuple[set, set]:
    if split not in set(ancestors(list(outputs))):
        raise ValueError(f"multi_gpu: split_at {split} is not part of the graph")
    conv = set(toposort([split]))
    fc = set()
    downstream = {split}
    for node in toposort(list(outputs)):
        if node in conv:
            continue
        if any(i in downstream for i in node.inputs):
            fc.add(node)
            downstream.update(node.outputs)
    return conv, fc


def device_labels(devices: Any, func: str = "multi_gpu") -> tuple[int, ...]:
    """The device labels of ``devices``: K (an int >= 1) or a sequence of ints.

    Raises ``TypeError`` for anything else (a float, a string, a bool: ``"12"``
    must not become two devices, ``True`` not K = 1) and ``ValueError`` for
    K < 1, an empty sequence or repeated labels; the message names ``func``.
    """
    if isinstance(devices, (bool, np.bool_)):
        raise TypeError(
            f"{func}: devices must be K (an int >= 1) or a sequence of int device "
            f"labels, got the bool {devices!r}"
        )
    if isinstance(devices, (int, np.integer)):
        if devices < 1:
            raise ValueError(
                f"{func}: devices (K, the number of devices) must be >= 1, got "
                f"{int(devices)}"
            )
        return tuple(range(int(devices)))
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise TypeError(
            f"{func}: devices must be K (an int >= 1) or a sequence of int device "
            f"labels, got {type(devices).__name__} {devices!r}"
        )
    labels = []
    for d in devices:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise TypeError(
                f"{func}: device labels must be ints, got {type(d).__name__} {d!r} "
                f"in {devices!r}"
            )
        if d < 0:
            raise ValueError(f"{func}: device labels must be >= 0, got {int(d)}")
        labels.append(int(d))
    if not labels:
        raise ValueError(f"{func}: devices must not be empty, got {devices!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"{func}: repeated device labels in {devices!r}")
    return tuple(labels)


def _backend(devices: Any, backend: Any, func: str = "multi_gpu") -> CommBackend:
    if isinstance(backend, CommBackend):
        return backend
    if isinstance(getattr(devices, "backend", None), CommBackend):
        return devices.backend  # a multi-device mode
    labels = device_labels(devices, func)
    if backend in (None, "virtual", "host"):
        return VirtualBackend(labels)
    return seam.comm_backend(labels, backend)


def distribute(
    outputs: Variable | Sequence[Variable],
    devices: int | Sequence[int] = 2,
    *,
    backend: str | CommBackend = "virtual",
    split_at: Variable | None = None,
    scheme: str = "a",
) -> Any:
    """Rewrite a single-device cost (and other outputs) for K devices.

    Call it before ``pytensor.grad``; gradients of the result with respect to
    the original parameters equal the single-device ones.

    Parameters
    ----------
    outputs : Variable or sequence of Variable
        The cost, and any other outputs sharing the graph (error rates...).
        Images enter as (B, C, H, W); the batch axis is axis 0 of every
        batch-separable op's batched inputs.
    devices : int, sequence of int or MultiDeviceMode
        K, the K device labels (GPU backends), or the multi-device mode the
        function will be compiled in (its backend is used).
    backend : {"virtual", "nccl", "peer", "gpu_virtual"} or CommBackend
        ``"virtual"``: host collectives
        (:mod:`cc2ops.distributed.collectives`), K logical devices on the CPU.
        The others are GPU backends (:mod:`cc2ops.cuda.ops.comm`).
    split_at : Variable, optional
        The variable ending the conv segment (default :func:`find_split`).
    scheme : {"a", "b"}
        FC input exchange: all-gather (a) or per-worker broadcasts (b).

    Returns
    -------
    Variable or list of Variable
        Same structure as ``outputs``, with the single-device values.

    Raises
    ------
    NotBatchSeparableError
        An op of the conv segment cannot run on batch shards.
    ValueError
        No split point found, or a bad argument.
    """
    single = isinstance(outputs, Variable)
    outs = [outputs] if single else list(outputs)
    be = _backend(devices, backend, "multi_gpu.distribute")
    split = find_split(outs) if split_at is None else split_at
    conv, fc = _segments(outs, split)
    dz = Distributor(be, conv, fc, scheme=scheme)
    result = dz.run(outs)
    for r in result:
        r.tag.cc2ops_distributor = dz
    return result[0] if single else result


# --------------------------------------------------------------------------
# step 2: localise the state (the mode's function maker)
# --------------------------------------------------------------------------


def _peel(var: Variable) -> Variable:
    """Through transfers (gpu_from_host, host_from_gpu) to the underlying value."""
    return seam.peel(var)


def _rebuild(outputs: Sequence[Variable], memo: dict) -> list[Variable]:
    """``outputs`` with ``memo``'s replacements, rebuilding only changed nodes."""
    for node in toposort(list(outputs), blockers=list(memo)):
        if all(o in memo for o in node.outputs):
            continue
        new_inputs = [memo.get(i, i) for i in node.inputs]
        if all(n is o for n, o in zip(new_inputs, node.inputs, strict=True)):
            continue
        new = node.clone_with_new_inputs(new_inputs, strict=False)
        for o, n in zip(node.outputs, new.outputs, strict=True):
            memo[o] = n
    return [memo.get(o, o) for o in outputs]


def _update_rules() -> tuple[Callable, ...]:
    """Rules allowed in update expressions: elementwise maps only."""

    def refuse(dz: Distributor, node: Any, dists: Sequence[Dist]):
        raise ValueError(
            f"multi_gpu: the update rule applies {node.op} to distributed state; only "
            "elementwise update rules (SGD, momentum, weight decay) can be applied "
            "per device"
        )

    return (
        rule_all_root,
        rule_shape,
        rule_elemwise,
        rule_dimshuffle,
        rule_transfer,
        refuse,
    )


class _Localised:
    """What step 2 made: per-device state for each distributed shared variable."""

    def __init__(self) -> None:
        self.state: dict[SharedVariable, tuple[Placement, list[SharedVariable]]] = {}

    def assemble(self, var: SharedVariable) -> np.ndarray:
        placement, parts = self.state[var]
        values = [np.asarray(p.get_value()) for p in parts]
        if placement == REPLICATED:
            return values[0]
        return np.concatenate(values, axis=placement.axis)

    def split(self, var: SharedVariable, value: Any) -> list[np.ndarray]:
        placement, parts = self.state[var]
        value = np.asarray(value)
        if placement == REPLICATED:
            return [value.copy() for _ in parts]
        bounds = shard_bounds(value.shape[placement.axis], len(parts))
        out = []
        for start, stop in bounds:
            index = [slice(None)] * value.ndim
            index[placement.axis] = slice(start, stop)
            out.append(np.array(value[tuple(index)], copy=True))
        return out

    def install_views(self, var: SharedVariable) -> None:
        """Make ``var.get_value``/``set_value`` assemble from / split into the parts."""
        _view_methods(var, self)


def _view_methods(var: SharedVariable, loc: _Localised) -> None:
    """Make ``var.get_value``/``set_value`` assemble from / split into the parts."""
    placement, parts = loc.state[var]
    if placement == REPLICATED and parts[0] is var:
        # var is replica 0: only set_value needs to reach the other replicas
        orig_set = var.set_value

        def set_value(self, value, borrow=False):
            orig_set(value, borrow=borrow)
            for p in parts[1:]:
                p.set_value(np.array(self.get_value(), copy=True))

        var.set_value = types.MethodType(set_value, var)
        return

    def get_value(self, borrow=False, return_internal_type=False):
        return loc.assemble(self)

    def set_value(self, value, borrow=False):
        for p, v in zip(parts, loc.split(self, value), strict=True):
            p.set_value(v)

    var.get_value = types.MethodType(get_value, var)
    var.set_value = types.MethodType(set_value, var)


def sync(fn: Any) -> None:
    """Write the assembled per-device state of a multi-device function back into
    the original shared variables' containers (for other functions reading them)."""
    loc = getattr(getattr(fn, "maker", None), "cc2ops_multi", None)
    if loc is None:
        raise ValueError(
            "multi_gpu.sync: the function was not compiled in a multi-device mode"
        )
    for var in loc.state:
        var.container.storage[0] = var.type.filter(loc.assemble(var))


def _distribution_nodes(outputs: Sequence[Variable]) -> dict:
    """{shared variable: (placement, node)} of Broadcast/Scatter of parameters."""
    found: dict = {}
    for node in toposort(list(outputs)):
        kind = comm_kind(node.op)
        if kind not in ("broadcast", "scatter"):
            continue
        src = _peel(node.inputs[0])
        if not isinstance(src, SharedVariable):
            continue
        placement = REPLICATED if kind == "broadcast" else sharded(node.op.axis)
        if src in found and found[src][0] != placement:
            raise ValueError(
                f"multi_gpu: shared variable {src} is used both {found[src][0]} and "
                f"{placement}"
            )
        found.setdefault(src, (placement, []))[1].append(node)
    return found


def localise(
    inputs: list,
    outputs: Any,
    backend: CommBackend,
) -> tuple[list, Any, _Localised]:
    """Step 2 on a function's (inputs, outputs): per-device state, local updates.

    Returns new inputs, new outputs and the record of the distributed state.
    """
    single = isinstance(outputs, Variable)
    outs = [outputs] if single else list(outputs)
    outs = [getattr(o, "variable", o) for o in outs]
    ins = [FunctionMaker.wrap_in(i) for i in inputs]
    updates = {i.variable: i.update for i in ins if i.update is not None}
    graph_outs = outs + list(updates.values())
    loc = backend.new_localised() if hasattr(backend, "new_localised") else None
    loc = _Localised() if loc is None else loc
    found = _distribution_nodes(graph_outs)
    if not found:
        return inputs, outputs, loc
    k = backend.n
    for var, (_, nodes) in found.items():
        for node in nodes:
            if len(node.outputs) != k:
                raise ValueError(
                    f"multi_gpu: {var} was distributed over {len(node.outputs)} "
                    f"devices but the mode has K={k} ({backend!r}); pass the mode to "
                    "distribute: distribute(cost, mode)"
                )
    placements = {v: p for v, (p, _) in found.items()}
    parts_cache: dict = {}

    # the fixed point: state whose update is distributed becomes distributed
    while True:
        dz = _state_distributor(backend, found, placements, updates, parts_cache)
        changed = False
        for var, upd in updates.items():
            p = dz.dist(upd).placement
            if p in (ROOT,):
                continue
            if p == PARTIAL:
                raise ValueError(f"multi_gpu: the update of {var} is a partial sum")
            if var not in placements:
                placements[var] = p
                changed = True
            elif placements[var] != p:
                raise ValueError(
                    f"multi_gpu: {var} is {placements[var]} but its update is {p}"
                )
        if not changed:
            break

    memo = dz._state_memo
    new_outs = _rebuild(outs, memo)
    new_ins = []
    for i in ins:
        if i.variable in placements:
            continue
        if i.update is not None:
            j = i.__class__.__new__(i.__class__)
            j.__dict__.update(i.__dict__)
            j.update = _rebuild([i.update], memo)[0]
            i = j
        new_ins.append(i)
    for var, p in placements.items():
        parts = dz._parts[var]
        loc.state[var] = (p, parts)
        upd = updates.get(var)
        per_dev = None
        if upd is not None:
            per_dev = dz.replicated(upd) if p == REPLICATED else dz.sharded(upd, p.axis)
        for kk in range(k):
            u = None if per_dev is None else parts[kk].type.filter_variable(per_dev[kk])
            new_ins.append(
                In(
                    variable=parts[kk],
                    value=parts[kk].container,
                    update=u,
                    mutable=u is not None,
                    borrow=True,
                    shared=True,
                )
            )
        loc.install_views(var)
    return new_ins, (new_outs[0] if single else new_outs), loc


def _state_distributor(backend, found, placements, updates, parts_cache) -> Distributor:
    """A distributor seeded with the per-device state and the gradient leaves."""
    dz = Distributor(backend, rules=_update_rules())
    dz._parts = {}
    memo: dict = {}
    for var, p in placements.items():
        parts = parts_cache.get((var, p))
        if parts is None:
            parts = backend.new_state(var, p)
            parts_cache[(var, p)] = parts
        dz._parts[var] = parts
        dz.set(var, p, parts)
        for node in found.get(var, (None, []))[1]:
            for kk, o in enumerate(node.outputs):
                memo[o] = backend.state_view(parts[kk], o)
        memo[var] = (
            parts[0]
            if (p == REPLICATED and parts[0] is var)
            else backend.root_view(parts, p, var)
        )
    # rebuild the graph on the per-device state, then seed the gradient leaves
    leaves_memo = dict(memo)
    rebuilt_updates = {
        v: u
        for v, u in zip(
            updates, _rebuild(list(updates.values()), leaves_memo), strict=True
        )
    }
    update_nodes = list(toposort(list(rebuilt_updates.values())))
    for node in update_nodes:
        kind = comm_kind(node.op)
        if kind == "reduce":
            dz.set(
                node.outputs[0],
                REPLICATED,
                dz._tag(backend.gradient_all_reduce(node.inputs)),
            )
        elif kind == "gather":
            dz.set(
                node.outputs[0],
                sharded(node.op.axis),
                backend.gradient_shards(list(node.inputs)),
            )
    # Shapes of values that are not distributed state (e.g. the per-device
    # activations whose sizes a dropout state's counter advance adds up) are
    # root integers: their ancestors, the already per-device forward graph,
    # need no placing, and placing them would mistake device 0's replica
    # (the original variable) for distributed state.
    for node in update_nodes:
        if isinstance(node.op, (Shape, Shape_i)) and node.inputs[0] not in dz.memo:
            dz.set(node.outputs[0], ROOT, [node.outputs[0]])
    for var, p in placements.items():
        root_view = leaves_memo.get(var)
        if root_view is not None and root_view is not var:
            dz.set(root_view, p, dz._parts[var])
    dz.place(list(rebuilt_updates.values()))
    # updates are read through the rebuilt expressions
    for v, u in rebuilt_updates.items():
        dz.memo[updates[v]] = dz.dist(u)
    dz._state_memo = leaves_memo
    return dz


def _batch_evidence(inputs: list, outputs: Any) -> list[str]:
    """What makes an undistributed graph a model over a batch (for the error).

    The non-shared, non-constant inputs with >= 1 dim (data inputs), and the
    registered batch-separable ops (conv, pools, norms, losses: a model reading
    its batch from shared variables). Empty for a graph of scalar inputs and
    shared state only, and for a hand-written multi-device graph (values on
    several device labels, or collectives): it does not run on one device.
    """
    outs = [outputs] if isinstance(outputs, Variable) else list(outputs)
    outs = [getattr(o, "variable", o) for o in outs]
    ins = [FunctionMaker.wrap_in(i) for i in inputs]
    roots = outs + [i.update for i in ins if i.update is not None]
    nodes = list(toposort(roots))
    if any(comm_kind(n.op) is not None for n in nodes):
        return []
    labels = {
        seam.device_label(v.type)
        for n in nodes
        for v in (*n.inputs, *n.outputs)
        if seam.device_label(v.type) is not None
    }
    if len(labels) > 1:
        return []
    found: list[str] = []
    for v in [i.variable for i in ins] + list(graph_inputs(roots)):
        if isinstance(v, (SharedVariable, Constant)) or v.owner is not None:
            continue
        if getattr(v.type, "ndim", 0) >= 1:
            name = f"input {v.name or v}"
            if name not in found:
                found.append(name)
    ops = {type(n.op).__name__ for n in nodes if _batched_inputs(n.op)}
    found += [f"op {name}" for name in sorted(ops)]
    return found


def _refuse_undistributed(mode: MultiDeviceMode, inputs: list, outputs: Any) -> None:
    """A K > 1 mode compiling a model that ``distribute`` never saw: refuse.

    Without this the function would silently run on one device. Graphs with no
    batch (scalar inputs and shared state only) compile unchanged.
    """
    evidence = _batch_evidence(inputs, outputs)
    if not evidence:
        return
    be = mode.backend
    raise ValueError(
        f"multi_gpu: compiling in {type(mode).__name__} with K={be.n} devices "
        f"(labels {tuple(be.labels)}) a graph that was not passed through "
        f"distribute ({', '.join(evidence[:4])}); it would run on one device. Call "
        "cc2ops.distributed.hybrid.distribute(cost, mode) before pytensor.grad, or "
        "compile it in a single-device mode (cc2ops.mode, cc2ops.cuda.mode(device))"
    )


class _MultiMaker:
    """Stands in for ``FunctionMaker``: localises the state, then compiles.

    Inner graphs (Scan, OpFromGraph) linked in the mode arrive with a prepared
    ``fgraph``; they are parts of an outer graph and pass unchanged.
    """

    def __init__(self, mode: MultiDeviceMode, inputs, outputs, *args, **kwargs):
        if kwargs.get("fgraph") is not None:
            self.loc = _Localised()
            self.maker = FunctionMaker(inputs, outputs, mode, *args, **kwargs)
            return
        new_ins, new_outs, loc = localise(inputs, outputs, mode.backend)
        if not loc.state and mode.backend.n > 1:
            _refuse_undistributed(mode, inputs, outputs)
        self.loc = loc
        self.maker = FunctionMaker(new_ins, new_outs, mode, *args, **kwargs)

    def create(self, *args, **kwargs):
        fn = self.maker.create(*args, **kwargs)
        # Function has __slots__: the record lives on its maker
        self.maker.cc2ops_multi = self.loc
        return fn


class MultiDeviceMode(Mode):
    """A ``Mode`` whose function maker localises distributed state (step 2).

    Graphs are distributed with :func:`distribute` (step 1) before
    ``pytensor.grad``; compiling the training function in this mode makes the
    per-device replicas and shards (module docstring).
    """

    backend: CommBackend

    @property
    def function_maker(self):
        mode = self

        def make(inputs, outputs, mode_arg=None, *args, **kwargs):
            return _MultiMaker(mode, inputs, outputs, *args, **kwargs)

        return make

    def clone(self, link_kwargs=None, optimizer="", **kwargs):
        new = super().clone(link_kwargs, optimizer, **kwargs)
        new.backend = getattr(self, "backend", None)
        return new

    def __str__(self) -> str:
        return f"MultiDeviceMode(backend={self.backend!r}, {super().__str__()})"


def mode(
    devices: int | Sequence[int] = 2,
    backend: str | CommBackend = "virtual",
    *,
    linker: str = "cvm",
) -> MultiDeviceMode:
    """The CPU multi-device mode: K virtual devices on the host.

    Parameters
    ----------
    devices : int or sequence of int
        K, or the device labels.
    backend : "virtual" or CommBackend
    linker : str
        PyTensor linker (``"cvm"``, ``"py"``).

    Returns
    -------
    MultiDeviceMode
        ``fast_run`` + the cc2ops CPU rewrites, with step 2 in its function maker.
    """
    m = MultiDeviceMode(linker=linker, optimizer="fast_run").including("cc2ops")
    m.backend = _backend(devices, backend, "multi_gpu.mode")
    return m
