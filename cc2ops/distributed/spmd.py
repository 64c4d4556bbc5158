"""SPMD execution of the hybrid-parallel graph: one process per device.

The user's code is the single-device model plus
:func:`cc2ops.distributed.hybrid.distribute`, compiled in :func:`mode`::

    m = cc2ops.distributed.mode()                 # rank and size from MPI
    cost = hybrid.distribute(cost, m, scheme="a")
    fn = pytensor.function([x, y], cost, updates=..., mode=m)

``distribute`` builds the K-device graph exactly as for K virtual devices
(:class:`SpmdBackend` is a
:class:`cc2ops.distributed.collectives.VirtualBackend`), the mode's
function maker localises the state (per-device replicas and shards) and then
**projects** the K-device graph onto this rank (:func:`project`): rank r keeps
the root computation and device r's nodes, and each collective becomes one
:class:`SpmdCollective` call on a communicator spanning the processes. Every
rank calls ``fn`` with the same global batch.

The projection rules (device r = this rank's position in its group)::

    AllGather / AllReduce / ReduceScatter   rank r's input -> rank r's output
    Reduce / Gather (a root value)          all-reduce / all-gather: every rank
                                            holds the root value
    Broadcast of a root value               local (every rank computes it)
    Broadcast of device j's value           broadcast from rank j (scheme b)
    Scatter of a root value                 local: rank r's piece
    Shape of device k's value (k != r)      inferred from the root shapes
                                            (ops' infer_shape), no traffic
    device k's other nodes (k != r)         not compiled here

Collectives run in one order on every rank: each takes the token the previous
one returned (a chain in the order of the K-device graph, which every rank
builds identically, checked once across ranks when compiling), so per-rank
graphs cannot deadlock by issuing them in different orders.

Two levels
----------
With ``group_size`` G < world size, hybrid parallelism runs inside each group
of G ranks (default: the ranks of one host) and groups are data-parallel:
group g takes piece g (``numpy.array_split``) of the global batch along axis 0
of every data input, each parameter gradient is summed across groups weighted
by the group's batch share ``B_g / B``, dropout masks are drawn at the
group's global element offsets, and scalar float outputs (the mean loss, the
error rate) are combined the same way. The cost must be a mean over the batch.

Notes
-----
- Each rank holds only its replicas and shards (others are zero-stride
  placeholders that never enter its graph). ``get_value`` of a sharded
  parameter gathers over the group and ``set_value`` keeps the rank's piece:
  both are collective, every rank of the group calls them.
- Collectives have deadlines (:mod:`cc2ops.distributed.communicator`).
"""

from __future__ import annotations

import hashlib
import inspect
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.io import In
from pytensor.compile.maker import FunctionMaker
from pytensor.compile.mode import Mode
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.traversal import toposort
from pytensor.tensor.basic import MakeVector
from pytensor.tensor.exceptions import ShapeError
from pytensor.tensor.shape import Shape, Shape_i
from pytensor.tensor.sharedvar import TensorSharedVariable
from pytensor.tensor.type import TensorType

from cc2ops._op import Cc2Op
from cc2ops.distributed import hybrid as mg
from cc2ops.distributed import seam
from cc2ops.distributed.collectives import (
    COMM_OPS,
    Shard,
    ShardGrad,
    VirtualBackend,
    shard_bounds,
    symbolic_piece,
)
from cc2ops.distributed.communicator import (
    CommError,
    Communicator,
    MPICommunicator,
    lookup,
    register,
)
from cc2ops.dropout import DropoutAdvance

__all__ = [
    "Topology",
    "topology",
    "SpmdCollective",
    "CrossGroupSum",
    "SpmdBackend",
    "SpmdMode",
    "mode",
    "project",
    "SpmdError",
]


class SpmdError(ValueError):
    """The K-device graph cannot be projected onto one rank."""


# --------------------------------------------------------------------------
# topology: world, groups, cross-group communicators
# --------------------------------------------------------------------------


@dataclass
class Topology:
    """Where this process sits: world rank and size, its group and position.

    Attributes
    ----------
    rank, size : int
        World rank and size.
    local_rank : int
        Rank among the processes of this host (picks the GPU).
    group_size : int
        G, the ranks of one hybrid-parallel group (K of ``distribute``).
    group, n_groups : int
        This rank's group (``rank // G``) and the number of groups.
    group_rank : int
        Position in the group (``rank % G``): the device index of the graph.
    world, group_comm, cross_comm : Communicator
        All ranks; the group; the ranks at this ``group_rank`` in every group.
    """

    rank: int
    size: int
    local_rank: int
    group_size: int
    group: int
    n_groups: int
    group_rank: int
    world: Communicator
    group_comm: Communicator
    cross_comm: Communicator
    key: str

    def set_timeout(self, seconds: float) -> None:
        """Seconds each later collective of this topology may take."""
        for c in (self.world, self.group_comm, self.cross_comm):
            c.timeout = float(seconds)


_TOPOLOGIES: dict[tuple, Topology] = {}


def topology(
    group_size: int | None = None, timeout: float | None = None, comm: Any = None
) -> Topology:
    """This process's :class:`Topology` under MPI (cached per arguments).

    Parameters
    ----------
    group_size : int, optional
        Ranks per hybrid-parallel group; must divide the world size. Default:
        the ranks on this host (MPI's shared-memory split), the same on every
        host, else the world.
    timeout : float, optional
        Seconds per collective and set-up (default
        :func:`cc2ops.distributed.communicator.default_timeout`).
    comm : mpi4py communicator, optional
        The processes taking part (default ``MPI.COMM_WORLD``).
    """
    cache_key = (group_size, timeout, id(comm))
    if cache_key in _TOPOLOGIES:
        return _TOPOLOGIES[cache_key]
    from mpi4py import MPI

    base = MPI.COMM_WORLD if comm is None else comm
    world = MPICommunicator(base, timeout, "world")
    rank, size = world.rank, world.size
    local = world.comm.Split_type(MPI.COMM_TYPE_SHARED, rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    if group_size is None:
        sizes = world.all_gather_ints([local_size], "set-up (host sizes)")[:, 0]
        group_size = int(local_size) if len(set(sizes.tolist())) == 1 else size
    if (
        isinstance(group_size, bool)
        or not isinstance(group_size, (int, np.integer))
        or group_size < 1
        or size % group_size
    ):
        raise ValueError(
            f"cc2ops.distributed: group_size must be an int >= 1 dividing the world "
            f"size {size}, got {group_size!r}"
        )
    g = int(group_size)
    group, group_rank = divmod(rank, g)
    group_comm = world.split(group, group_rank, f"group {group}")
    cross_comm = world.split(group_rank, group, f"cross {group_rank}")
    key = f"spmd{len(_TOPOLOGIES)}"
    topo = Topology(
        rank=rank,
        size=size,
        local_rank=local_rank,
        group_size=g,
        group=group,
        n_groups=size // g,
        group_rank=group_rank,
        world=world,
        group_comm=group_comm,
        cross_comm=cross_comm,
        key=key,
    )
    register(key + ":world", world)
    register(key + ":group", group_comm)
    register(key + ":cross", cross_comm)
    _TOPOLOGIES[cache_key] = topo
    return topo


# --------------------------------------------------------------------------
# the ops
# --------------------------------------------------------------------------

_TOKEN = TensorType("int64", ())


class SpmdCollective(Cc2Op):
    """One collective call of this rank on a communicator (by registry key).

    Inputs ``(token, *data)``, outputs ``(token + 1, result)``; the token
    orders the calls (module docstring). Kinds and data inputs::

        all_reduce      (x,)          -> sum over ranks of x
        all_gather      (x,)          -> concat of every rank's x along axis
        reduce_scatter  (x[, sizes])  -> this rank's piece of the sum along axis
        broadcast       (x,) on root, () elsewhere -> root's x
        offsets         (n,)          -> (exclusive prefix sum, total) of int n

    Parameters
    ----------
    kind : str
    seq : int
        Position in the rank's chain (for messages).
    comm : str
        Registry key of the :class:`Communicator`.
    axis, root : int
    dtype : str
    ndim : int
        The result's dtype and number of dims.
    """

    __props__ = ("kind", "seq", "comm", "axis", "root", "dtype", "ndim")
    KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "offsets")

    def __init__(
        self,
        kind: str,
        seq: int,
        comm: str,
        *,
        axis: int = 0,
        root: int = 0,
        dtype: str = "float32",
        ndim: int = 0,
    ) -> None:
        if kind not in self.KINDS:
            raise ValueError(
                f"SpmdCollective: kind must be one of {self.KINDS}, got {kind!r}"
            )
        self.kind = kind
        self.seq = int(seq)
        self.comm = str(comm)
        self.axis = int(axis)
        self.root = int(root)
        self.dtype = str(dtype)
        self.ndim = int(ndim)

    def do_constant_folding(self, fgraph: Any, node: Apply) -> bool:
        return False

    def make_node(self, token: Any, *xs: Any) -> Apply:
        token = pt.as_tensor_variable(token)
        if token.type != _TOKEN:
            raise TypeError(
                f"SpmdCollective: token must be an int64 scalar, got {token.type}"
            )
        xs = [pt.as_tensor_variable(x) for x in xs]
        if self.kind == "offsets":
            outs = [_TOKEN(), TensorType("int64", ())(), TensorType("int64", ())()]
            return Apply(self, [token, *xs], outs)
        shape: tuple = (None,) * self.ndim
        if self.kind == "all_reduce" and xs:
            shape = xs[0].type.shape
        return Apply(self, [token, *xs], [_TOKEN(), TensorType(self.dtype, shape)()])

    def perform(self, node, inputs, outputs):
        comm = lookup(self.comm)
        token, *xs = inputs
        what = f"collective #{self.seq} {self.kind} on {comm.name}"
        start = time.perf_counter()
        try:
            self._run(comm, what, token, xs, outputs)
        finally:
            stat = comm.stats.setdefault(self.kind, [0, 0.0])
            stat[0] += 1
            stat[1] += time.perf_counter() - start

    def _run(self, comm, what, token, xs, outputs):
        if self.kind == "all_reduce":
            y = comm.all_reduce(xs[0], what)
        elif self.kind == "all_gather":
            y = comm.all_gather(xs[0], self.axis, what)
        elif self.kind == "reduce_scatter":
            sizes = None if len(xs) < 2 else [int(s) for s in np.asarray(xs[1])]
            y = comm.reduce_scatter(xs[0], self.axis, sizes, what)
        elif self.kind == "broadcast":
            x = xs[0] if xs else None
            y = comm.broadcast(x, self.root, self.dtype, self.ndim, what)
        else:
            counts = comm.all_gather_ints([int(xs[0])], what)[:, 0]
            outputs[0][0] = np.asarray(token + 1, dtype="int64")
            outputs[1][0] = np.asarray(int(counts[: comm.rank].sum()), dtype="int64")
            outputs[2][0] = np.asarray(int(counts.sum()), dtype="int64")
            return
        outputs[0][0] = np.asarray(token + 1, dtype="int64")
        outputs[1][0] = np.asarray(y, dtype=self.dtype)

    def _infer_shape(self, node, input_shapes):
        if self.kind == "offsets":
            return [(), (), ()]
        if self.kind == "all_reduce":
            return [(), input_shapes[1]]
        # the extents come from the other ranks: ShapeFeature reads the output
        raise ShapeError(f"SpmdCollective: {self.kind} extents are known at run time")

    def __str__(self) -> str:
        return f"SpmdCollective{{{self.kind} #{self.seq} {self.comm}}}"


class CrossGroupSum(Cc2Op):
    """Marks a parameter gradient (per device) to be summed across groups.

    The identity in the K-device graph (one group); :func:`project` turns it
    into an all-reduce over the cross-group communicator of the gradient
    times the group's batch share.
    """

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = np.array(inputs[0], copy=True)

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]


# --------------------------------------------------------------------------
# the backend: K = group size virtual devices, this rank's position known
# --------------------------------------------------------------------------


def _ghost(value: np.ndarray, name: str) -> SharedVariable:
    """A shared variable with another rank's part's static shape and no memory
    (a zero-stride view): never computed here, only its shape is read."""
    value = np.asarray(value)
    ghost = np.broadcast_to(np.zeros((), dtype=value.dtype), value.shape)
    return pytensor.shared(ghost, name=name, shape=value.shape, borrow=True)


def _part_like(var: SharedVariable, value: np.ndarray, name: str) -> SharedVariable:
    """A shared variable of ``var``'s class (a GPU shared variable stays one, on
    its device) holding ``value`` (its static shape, when ``var``'s type has one)."""
    if type(var) is TensorSharedVariable:
        return pytensor.shared(value, name=name)
    typ = var.type
    if any(d is not None for d in getattr(typ, "shape", ())):
        typ = typ.clone(shape=tuple(value.shape))
    return type(var)(name=name, type=typ, value=value, strict=False)


class _SpmdLocalised(mg._Localised):
    """The state of one rank: its own parts are real, the others are ghosts."""

    def __init__(self, backend: SpmdBackend) -> None:
        super().__init__()
        self.backend = backend

    def assemble(self, var):
        placement, parts = self.state[var]
        own = np.asarray(parts[self.backend.position].get_value())
        if placement == mg.REPLICATED:
            return own
        what = f"get_value of {var.name or var} (gather of the group's shards)"
        return self.backend.topo.group_comm.all_gather(own, placement.axis, what)

    def install_views(self, var):
        loc, pos = self, self.backend.position
        if self.state[var][1][pos] is var:
            return  # var is this rank's replica: its own methods are right

        def get_value(self, borrow=False, return_internal_type=False):
            return loc.assemble(self)

        def set_value(self, value, borrow=False):
            placement, parts = loc.state[self]
            value = np.asarray(value)
            if placement == mg.REPLICATED:
                parts[pos].set_value(value.copy())
                return
            start, stop = shard_bounds(value.shape[placement.axis], len(parts))[pos]
            index = [slice(None)] * value.ndim
            index[placement.axis] = slice(start, stop)
            parts[pos].set_value(np.array(value[tuple(index)], copy=True))

        var.get_value = types.MethodType(get_value, var)
        var.set_value = types.MethodType(set_value, var)


class SpmdBackend(VirtualBackend):
    """The K-device graph of one group, built on every rank (K = group size).

    Parameters
    ----------
    topo : Topology
    """

    def __init__(
        self,
        topo: Topology,
        keys: dict[str, str] | None = None,
        keep_trivial: bool = False,
    ) -> None:
        super().__init__(range(topo.group_size))
        self.topo = topo
        #: registry keys of the communicators the ops call ("group", "cross")
        self.keys = keys or {c: f"{topo.key}:{c}" for c in ("group", "cross")}
        #: keep collectives over one process (tests of the communicator path);
        #: by default they are the identity and cost nothing
        self.keep_trivial = bool(keep_trivial)

    @property
    def position(self) -> int:
        """This rank's device index in the graph."""
        return self.topo.group_rank

    def new_state(self, var, placement):
        value = np.asarray(var.get_value())
        name = var.name or "shared"
        if placement.kind == "replicated":
            pieces = [value] * self.n
        else:
            pieces = []
            for start, stop in shard_bounds(value.shape[placement.axis], self.n):
                index = [slice(None)] * value.ndim
                index[placement.axis] = slice(start, stop)
                pieces.append(value[tuple(index)])
        parts = []
        for k, piece in enumerate(pieces):
            if k != self.position:
                parts.append(_ghost(piece, f"{name}@{k}"))
            elif placement.kind == "replicated" and k == 0:
                parts.append(var)
            else:
                parts.append(_part_like(var, np.array(piece, copy=True), f"{name}@{k}"))
        return parts

    def root_view(self, parts, placement, like=None):
        if placement.kind == "replicated":
            # every rank holds the whole value: its own replica stands for it
            view = parts[self.position]
            if like is not None and view.type != like.type:
                view = like.type.filter_variable(view, allow_convert=True)
            return view
        return super().root_view(parts, placement, like)

    def new_localised(self) -> _SpmdLocalised:
        return _SpmdLocalised(self)

    def gradient_all_reduce(self, xs):
        out = self.all_reduce(xs)
        if self.topo.n_groups > 1:
            out = [CrossGroupSum()(v) for v in out]
        return out

    def gradient_shards(self, xs):
        if self.topo.n_groups > 1:
            return [CrossGroupSum()(v) for v in xs]
        return list(xs)

    def __repr__(self) -> str:
        t = self.topo
        return (
            f"SpmdBackend(rank={t.rank}/{t.size}, group {t.group}/{t.n_groups} of "
            f"{t.group_size}, device {t.group_rank})"
        )


# --------------------------------------------------------------------------
# the projection
# --------------------------------------------------------------------------

_MIXED = -1


def _infer_shape_call(node: Apply, shapes: list) -> list:
    fn = node.op.infer_shape
    params = list(inspect.signature(fn).parameters)
    if len(params) >= 3:  # (fgraph, node, shapes): PyTensor 3.0
        return fn(None, node, shapes)
    return fn(node, shapes)


class _Projector:
    """Builds rank r's graph from the K-device graph (see :func:`project`)."""

    def __init__(self, backend: SpmdBackend, loc: mg._Localised) -> None:
        self.be = backend
        self.topo = backend.topo
        self.r = backend.position
        self.dev: dict[Variable, int | None] = {}
        for _, parts in loc.state.values():
            for k, part in enumerate(parts):
                self.dev[part] = k
        self.memo: dict[Variable, Variable] = {}
        self.token: Variable | None = None
        self.seq = 0
        self.signature: list[str] = []
        self.shape_memo: dict[tuple, list] = {}

    # ---- devices -----------------------------------------------------------
    def assign(self, order: Sequence[Apply]) -> None:
        for node in order:
            kind = mg.comm_kind(node.op)
            if kind is not None:
                if kind in ("reduce", "gather"):
                    self.dev[node.outputs[0]] = None
                else:
                    for k, o in enumerate(node.outputs):
                        self.dev[o] = k
                continue
            if isinstance(node.op, (Shape, Shape_i)):
                self.dev[node.outputs[0]] = None
                continue
            ds = {self.dev.get(i) for i in node.inputs} - {None}
            d = None if not ds else (ds.pop() if len(ds) == 1 else _MIXED)
            for o in node.outputs:
                self.dev[o] = d

    def mine(self, v: Variable) -> bool:
        return self.dev.get(v) in (None, self.r)

    # ---- values --------------------------------------------------------------
    def avail(self, v: Variable) -> Variable | None:
        if v in self.memo:
            return self.memo[v]
        if v.owner is None and self.mine(v):
            return v
        return None

    def need(self, v: Variable, why: str) -> Variable:
        got = self.avail(v)
        if got is None:
            got = self.expr(v)
        return got

    def expr(self, v: Variable) -> Variable:
        """Project an expression (new shape arithmetic, or a graph value)."""
        for node in toposort([v], blockers=list(self.memo)):
            if all(o in self.memo for o in node.outputs):
                continue
            self.visit(node, strict=True)
        got = self.avail(v)
        if got is None:
            raise SpmdError(
                f"cc2ops.distributed: rank {self.topo.rank} (device {self.r}) cannot "
                f"compute {v} ({v.owner.op if v.owner else 'an input'}): it belongs "
                f"to device {self.dev.get(v)}"
            )
        return got

    # ---- shapes of other devices' values --------------------------------------
    def shape_of(self, v: Variable, force: bool = False) -> list:
        """Symbolic shape of ``v`` from root shapes (no value of another device)."""
        key = (v, force)
        if key in self.shape_memo:
            return self.shape_memo[key]
        static = getattr(v.type, "shape", None)
        if static is not None and all(s is not None for s in static):
            out = [pt.constant(int(s), dtype="int64") for s in static]
        elif v.owner is None or (self.mine(v) and not force):
            if v.owner is None and not self.mine(v):
                raise SpmdError(f"cc2ops.distributed: no static shape for {v}")
            out = [v.shape[i] for i in range(v.type.ndim)]
        else:
            node = v.owner
            shapes = [
                tuple(self.shape_of(i, force)) if hasattr(i.type, "ndim") else None
                for i in node.inputs
            ]
            try:
                res = _infer_shape_call(node, shapes)
            except Exception as e:  # noqa: BLE001 - reported with the op's name
                raise SpmdError(
                    f"cc2ops.distributed: the shape of {v} (output of {node.op}) on "
                    f"device {self.dev.get(v)} is needed on rank {self.topo.rank} and "
                    f"{type(node.op).__name__} cannot infer it: {e}"
                ) from e
            out = list(res[node.outputs.index(v)])
        self.shape_memo[key] = out
        return out

    def substitute_shape(self, node: Apply) -> None:
        (x,) = node.inputs
        shp = self.shape_of(x)
        if isinstance(node.op, Shape_i):
            val = pt.cast(shp[node.op.i], node.outputs[0].type.dtype)
        else:
            # a MakeVector (not pt.stack's Join of ExpandDims), which
            # canonicalize folds with the graph's other shape vectors (a
            # flatten's [n, -1]); a Join would be lifted to the GPU and read
            # back, a device sync per step
            val = (
                MakeVector("int64")(*[pt.cast(d, "int64") for d in shp])
                if shp
                else pt.zeros((0,), "int64")
            )
        out = node.outputs[0]
        self.memo[out] = out.type.filter_variable(self.expr(val), allow_convert=True)

    # ---- collectives ---------------------------------------------------------
    def call(self, kind: str, comm: str, data: Sequence[Variable], like: Any, **kw):
        if self.token is None:
            raise SpmdError("cc2ops.distributed: internal: no token")
        key = self.be.keys[comm]
        if lookup(key).size == 1 and not self.be.keep_trivial:
            # a collective over one process is the identity
            self.signature.append(f"trivial {kind}/{comm}")
            if kind == "offsets":
                return pt.constant(0, dtype="int64"), data[0]
            return data[0]
        op = SpmdCollective(
            kind,
            self.seq,
            key,
            dtype=getattr(like, "dtype", "int64"),
            ndim=getattr(like, "ndim", 0),
            **kw,
        )
        self.signature.append(f"{kind}/{comm}/{kw}/{op.dtype}/{op.ndim}")
        self.seq += 1
        outs = op(self.token, *data)
        self.token = outs[0]
        return outs[1:] if len(outs) > 2 else outs[1]

    def put(self, orig: Variable, new: Variable) -> None:
        self.memo[orig] = orig.type.filter_variable(new, allow_convert=True)

    def collective(self, node: Apply) -> None:
        kind = mg.comm_kind(node.op)
        op, r = node.op, self.r
        if not isinstance(op, COMM_OPS):
            raise SpmdError(
                f"cc2ops.distributed: {op} is a GPU collective of the one-process "
                "multi-GPU mode; distribute for SPMD with the SPMD mode: "
                "distribute(cost, cc2ops.distributed.mode())"
            )
        if kind in ("all_gather", "all_reduce", "reduce_scatter"):
            x = self.need(node.inputs[r], str(op))
            data = [x]
            kw = {}
            if kind != "all_reduce":
                kw["axis"] = op.axis
            if kind == "reduce_scatter" and len(node.inputs) > op.n:
                data.append(self.need(node.inputs[op.n], "sizes"))
            y = self.call(kind, "group", data, x.type, **kw)
            self.put(node.outputs[r], y)
        elif kind == "reduce":
            x = self.need(node.inputs[r], str(op))
            self.put(node.outputs[0], self.call("all_reduce", "group", [x], x.type))
        elif kind == "gather":
            x = self.need(node.inputs[r], str(op))
            y = self.call("all_gather", "group", [x], x.type, axis=op.axis)
            self.put(node.outputs[0], y)
        elif kind == "broadcast":
            src = node.inputs[0]
            owner = self.dev.get(src)
            if owner is None:
                self.put(node.outputs[r], self.need(src, str(op)))
            else:
                data = [self.need(src, str(op))] if owner == r else []
                y = self.call("broadcast", "group", data, src.type, root=owner)
                self.put(node.outputs[r], y)
        elif kind == "scatter":
            x = self.need(node.inputs[0], str(op))
            if len(node.inputs) > 1:
                sizes = self.need(node.inputs[1], "sizes")
                start = pt.sum(sizes[:r]) if r else pt.constant(0, dtype="int64")
                index = [slice(None)] * x.type.ndim
                index[op.axis] = slice(start, start + sizes[r])
                piece = x[tuple(index)]
            elif op.n == 1:
                piece = x  # the one piece of one
            else:
                piece = Shard(op.n, r, op.axis)(x)
            self.put(node.outputs[r], piece)
        else:  # pragma: no cover - every host collective kind is handled above
            raise SpmdError(f"cc2ops.distributed: no SPMD form of {op}")

    # ---- the walk --------------------------------------------------------------
    def visit(self, node: Apply, strict: bool = False) -> None:
        if mg.comm_kind(node.op) is not None:
            self.collective(node)
            return
        if isinstance(node.op, (Shape, Shape_i)) and not self.mine(node.inputs[0]):
            self.substitute_shape(node)
            return
        if isinstance(node.op, CrossGroupSum):
            x = self.avail(node.inputs[0])
            if x is None:
                return
            self.put(node.outputs[0], self.cross_sum(x))
            return
        if not all(self.mine(o) for o in node.outputs) and not strict:
            return
        new_inputs = [self.avail(i) for i in node.inputs]
        if any(i is None for i in new_inputs):
            if strict:
                bad = [
                    i for i, n in zip(node.inputs, new_inputs, strict=True) if n is None
                ]
                raise SpmdError(
                    f"cc2ops.distributed: rank {self.topo.rank} (device {self.r}) "
                    f"needs {node.op} of {bad}, values of another device"
                )
            return
        if isinstance(node.op, (Shard, ShardGrad)) and node.op.n == 1:
            # the one piece of one is the whole (ShardGrad: its cotangent):
            # left in, they are host ops that keep the GPU lifting from
            # keeping the loss and its gradient on the device
            self.put(node.outputs[0], new_inputs[0])
            return
        if all(n is o for n, o in zip(new_inputs, node.inputs, strict=True)):
            for o in node.outputs:
                self.memo[o] = o
            return
        new = node.clone_with_new_inputs(new_inputs, strict=False)
        for o, n in zip(node.outputs, new.outputs, strict=True):
            self.put(o, n)

    # ---- two levels --------------------------------------------------------------
    def cross_sum(self, x: Variable) -> Variable:
        share = pt.cast(self.group_share, x.type.dtype)
        return self.call("all_reduce", "cross", [x * share], x.type)


def _data_inputs(ins: Sequence[In], roots: Sequence[Variable]) -> list[Variable]:
    from pytensor.graph.traversal import graph_inputs

    found = []
    for v in [i.variable for i in ins] + list(graph_inputs(roots)):
        if isinstance(v, (SharedVariable, Constant)) or v.owner is not None:
            continue
        if getattr(v.type, "ndim", 0) >= 1 and v not in found:
            found.append(v)
    return found


def project(
    ins: Sequence[In], outs: Sequence[Variable], backend: SpmdBackend, loc: Any
) -> tuple[list[In], list[Variable]]:
    """Rank r's part of a localised K-device function (the module docstring).

    Parameters
    ----------
    ins : sequence of In
        The localised inputs (with updates; other devices' parts included).
    outs : sequence of Variable
        The root outputs.
    backend : SpmdBackend
    loc : the localised state record

    Returns
    -------
    (inputs, outputs) of rank r's function; the inputs carry a token shared
    variable whose update ends the collectives' chain.
    """
    topo = backend.topo
    pj = _Projector(backend, loc)
    token_var = pytensor.shared(np.asarray(0, dtype="int64"), name="spmd_token")
    pj.token = token_var
    updates = {i.variable: i.update for i in ins if i.update is not None}
    roots = list(outs) + list(updates.values())
    order = list(toposort(roots))
    pj.assign(order)

    two_level = topo.n_groups > 1
    dropout_states: dict[Variable, Variable] = {}
    first_use: dict[Apply, list[Variable]] = {}
    if two_level:
        data = _data_inputs(ins, roots)
        if not data:
            raise SpmdError(
                "cc2ops.distributed: several groups split the batch of the data "
                "inputs, and this function has none"
            )
        batch = data[0].shape[0]
        local = symbolic_piece(batch, topo.n_groups, topo.group)[1]
        pj.group_share = pt.cast(local, "float64") / pt.cast(batch, "float64")
        for x in data:
            pj.memo[x] = Shard(topo.n_groups, topo.group, 0)(x)
        # dropout states advance by the whole batch and start at the group's offset
        for var, upd in updates.items():
            if (
                upd.owner is not None
                and isinstance(upd.owner.op, DropoutAdvance)
                and upd.owner.inputs[0] is var
            ):
                dropout_states[var] = upd.owner.inputs[1]
        for node in order:
            for s in dropout_states:
                if s in node.inputs and not any(s in v for v in first_use.values()):
                    first_use.setdefault(node, []).append(s)
    new_state_updates: dict[Variable, Variable] = {}

    for node in order:
        for s in first_use.get(node, []):
            count = pj.expr(_forced_count(pj, dropout_states[s]))
            offset, total = pj.call("offsets", "cross", [count], None)
            pj.memo[s] = DropoutAdvance()(s, offset)
            new_state_updates[s] = DropoutAdvance()(s, total)
        if all(o in pj.memo for o in node.outputs):
            continue
        pj.visit(node)

    new_outs = []
    for o in outs:
        v = pj.expr(o)
        if two_level and v.type.ndim == 0 and v.type.dtype.startswith("float"):
            v = pj.cross_sum(v)
        new_outs.append(v)
    new_ins: list[In] = []
    for i in ins:
        if not pj.mine(i.variable):
            continue  # another device's part
        if i.update is not None:
            j = i.__class__.__new__(i.__class__)
            j.__dict__.update(i.__dict__)
            if i.variable in new_state_updates:
                j.update = new_state_updates[i.variable]
            else:
                j.update = i.variable.type.filter_variable(
                    pj.expr(i.update), allow_convert=True
                )
            i = j
        new_ins.append(i)
    _check_same_chain(topo, pj.signature)
    new_ins.append(
        In(
            variable=token_var,
            value=token_var.container,
            update=pj.token,
            mutable=True,
            borrow=True,
            shared=True,
        )
    )
    return new_ins, new_outs


def _forced_count(pj: _Projector, total: Variable) -> Variable:
    """``total`` (an element count of per-device activations) computed from
    shapes inferred from the inputs only: it must not wait for values computed
    after the collective that uses it."""
    memo: dict[Variable, Variable] = {}
    for node in toposort([total]):
        if isinstance(node.op, (Shape, Shape_i)):
            (x,) = node.inputs
            shp = pj.shape_of(x, force=True)
            if isinstance(node.op, Shape_i):
                val = pt.cast(shp[node.op.i], node.outputs[0].type.dtype)
            else:
                val = pt.cast(pt.stack(shp), "int64")
            memo[node.outputs[0]] = val
            continue
        new_inputs = [memo.get(i, i) for i in node.inputs]
        if all(n is o for n, o in zip(new_inputs, node.inputs, strict=True)):
            continue
        new = node.clone_with_new_inputs(new_inputs, strict=False)
        memo.update(zip(node.outputs, new.outputs, strict=True))
    return pt.cast(memo.get(total, total), "int64")


def _check_same_chain(topo: Topology, signature: list[str]) -> None:
    """Every rank of a group must issue the same collectives in the same order."""
    digest = hashlib.sha256("\n".join(signature).encode()).digest()[:7]
    mine = int.from_bytes(digest, "little")
    all_ = topo.world.all_gather_ints(
        [mine, len(signature)], "set-up (collective order check)"
    )
    if len(set(all_[:, 0].tolist())) != 1:
        raise SpmdError(
            f"cc2ops.distributed: rank {topo.rank}: the ranks built different "
            f"collective sequences (lengths {all_[:, 1].tolist()}); every rank must "
            "compile the same model with the same arguments"
        )


# --------------------------------------------------------------------------
# the mode
# --------------------------------------------------------------------------


class _SpmdMaker:
    def __init__(self, mode: SpmdMode, inputs, outputs, *args, **kwargs):
        if kwargs.get("fgraph") is not None:
            self.loc = mg._Localised()
            self.maker = FunctionMaker(inputs, outputs, mode, *args, **kwargs)
            return
        backend = mode.backend
        new_ins, new_outs, loc = mg.localise(inputs, outputs, backend)
        if not loc.state and backend.n > 1:
            mg._refuse_undistributed(mode, inputs, outputs)
        single = isinstance(new_outs, Variable)
        outs = [new_outs] if single else list(new_outs)
        outs = [getattr(o, "variable", o) for o in outs]
        wrapped = [FunctionMaker.wrap_in(i) for i in new_ins]
        p_ins, p_outs = project(wrapped, outs, backend, loc)
        self.loc = loc
        self.maker = FunctionMaker(
            p_ins, p_outs[0] if single else p_outs, mode, *args, **kwargs
        )

    def create(self, *args, **kwargs):
        fn = self.maker.create(*args, **kwargs)
        self.maker.cc2ops_multi = self.loc
        return fn


class SpmdMode(mg.MultiDeviceMode):
    """A multi-device mode that compiles only this rank's part (module docstring)."""

    backend: SpmdBackend

    @property
    def function_maker(self):
        mode = self

        def make(inputs, outputs, mode_arg=None, *args, **kwargs):
            return _SpmdMaker(mode, inputs, outputs, *args, **kwargs)

        return make

    @property
    def topology(self) -> Topology:
        return self.backend.topo


def mode(
    group_size: int | None = None,
    *,
    timeout: float | None = None,
    base: Any = None,
    comm: Any = None,
    collectives: str = "mpi",
    device: int | None = None,
    keep_trivial: bool = False,
) -> SpmdMode:
    """The SPMD mode of this process (rank and size from MPI).

    Parameters
    ----------
    group_size : int, optional
        Ranks per hybrid-parallel group (see :func:`topology`; default the
        ranks of one host).
    timeout : float, optional
        Seconds per collective and set-up.
    base : pytensor Mode, optional
        The rewrites and linker of this rank's graph (default ``cc2ops.mode``:
        ``fast_run`` + the cc2ops CPU rewrites on the cvm linker).
    comm : mpi4py communicator, optional
        The processes taking part (default the world).
    collectives : {"mpi", "nccl"}
        Who moves the data: MPI on host arrays, or NCCL (nccl4py) on the
        rank's GPU (:mod:`cc2ops.distributed.nccl`; set-up and small integer
        exchanges stay on MPI).
    device : int, optional
        The GPU label of this rank for ``"nccl"`` (default its local rank).
    keep_trivial : bool
        Run collectives over one process through the communicator too (by
        default they are the identity; tests of the NCCL path keep them).
    """
    import cc2ops

    if collectives not in ("mpi", "nccl"):
        raise ValueError(
            f"cc2ops.distributed.mode: collectives must be 'mpi' or 'nccl', got "
            f"{collectives!r}"
        )
    topo = topology(group_size, timeout, comm)
    keys = None
    if collectives == "nccl":
        # the GPU backend registered its communicator (cc2ops.distributed.nccl)
        gpu_communicator = seam.device_backend().spmd_communicator
        label = topo.local_rank if device is None else int(device)
        keys = {}
        for name, mpi_comm in (("group", topo.group_comm), ("cross", topo.cross_comm)):
            key = f"{topo.key}:nccl{label}:{name}"
            try:
                lookup(key)
            except CommError:
                register(key, gpu_communicator(mpi_comm, label))
            keys[name] = key
    base = cc2ops.mode if base is None else base
    m = _spmd_class(type(base))(linker=base.linker, optimizer=base.provided_optimizer)
    m.backend = SpmdBackend(topo, keys, keep_trivial)
    return m


_CLASSES: dict[type, type] = {}


def _spmd_class(base_cls: type) -> type:
    """:class:`SpmdMode` keeping the behaviour of ``base_cls`` (the GPU mode
    loads its op modules before rewriting and names its devices)."""
    if base_cls is Mode or issubclass(base_cls, SpmdMode):
        return SpmdMode
    if base_cls not in _CLASSES:
        name = f"Spmd{base_cls.__name__}"
        _CLASSES[base_cls] = type(name, (SpmdMode, base_cls), {})
    return _CLASSES[base_cls]
