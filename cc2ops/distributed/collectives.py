"""Collective communication as graph ops, for K devices driven by one process.

Every op here works on the host (numpy) and stands for K logical devices: an
op with K per-device inputs and/or K per-device outputs is ONE ``Apply`` node,
input/output ``k`` belonging to device ``k`` (the one-process-drives-K-devices
model of ``ncclCommInitAll`` + group calls). These host ops are the *virtual*
backend (K logical devices sharing the CPU) and the reference semantics of the
GPU collectives in :mod:`cc2ops.cuda.ops.comm`.

The ops and their pullbacks (each family is closed under differentiation)::

    AllGather(n, axis)     x_0..x_{n-1}  -> n copies of concat(x, axis)
    ReduceScatter(n, axis) x_0..x_{n-1}  -> piece k of sum(x) along axis
        pullback(AllGather) = ReduceScatter (pieces sized like the inputs)
        pullback(ReduceScatter) = AllGather
    AllReduce(n)           x_0..x_{n-1}  -> n copies of sum(x)
        pullback(AllReduce) = AllReduce
    Broadcast(n, root)     x (on root)   -> n copies of x
    Reduce(n, root)        x_0..x_{n-1}  -> sum(x) (on root)
        pullback(Broadcast) = Reduce, pullback(Reduce) = Broadcast
    Scatter(n, axis)       x (on root)   -> piece k of x along axis
    Gather(n, axis)        x_0..x_{n-1}  -> concat(x, axis) (on root)
        pullback(Scatter) = Gather, pullback(Gather) = Scatter (sized)

Two local (no-communication) ops select one device's piece of a value that
every device holds::

    Shard(n, index, axis)      x -> piece ``index`` of x along axis
    ShardGrad(n, index, axis)  (g, x) -> zeros like x, piece ``index`` = g

Pieces follow ``numpy.array_split``: piece ``i`` of an extent ``m`` has
``(m + n - 1 - i) // n`` entries (the first ``m % n`` pieces are one longer),
so uneven batches split exactly; :func:`shard_bounds` gives the offsets.
``Broadcast`` takes the root's value only: in the one-process model the other
devices' receive buffers are not graph values.

Outputs never alias inputs (every op copies), so the ops need no
``view_map``; disconnected cotangents count as zeros.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, disconnected_type
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.null_type import NullType
from pytensor.graph.traversal import graph_inputs
from pytensor.tensor.type import TensorType

from cc2ops._op import Cc2Op, as_tensor

__all__ = [
    "check_split",
    "shard_bounds",
    "shard_sizes",
    "symbolic_piece",
    "AllGather",
    "ReduceScatter",
    "AllReduce",
    "Broadcast",
    "Reduce",
    "Scatter",
    "Gather",
    "Shard",
    "ShardGrad",
    "COMM_OPS",
    "LOCAL_OPS",
    "CommBackend",
    "VirtualBackend",
]


def shard_sizes(extent: int, n: int) -> list[int]:
    """The sizes of the ``n`` pieces of ``extent`` (``numpy.array_split``'s rule)."""
    return [(extent + n - 1 - i) // n for i in range(n)]


def shard_bounds(extent: int, n: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each of the ``n`` pieces of ``extent``."""
    out, start = [], 0
    for size in shard_sizes(extent, n):
        out.append((start, start + size))
        start += size
    return out


def symbolic_piece(extent: Any, n: int, i: int) -> tuple[Any, Any]:
    """(start, size) of piece ``i`` of a symbolic ``extent`` (array_split rule)."""
    size = (extent + (n - 1 - i)) // n
    start = i * (extent // n) + pt.minimum(i, extent % n)
    return start, size


def _check_n(op: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(
            f"{op}: n (the number of devices) must be an int >= 1, got {n!r}"
        )
    return int(n)


def _check_axis(op: str, axis: Any) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or axis < 0:
        raise ValueError(f"{op}: axis must be an int >= 0, got {axis!r}")
    return int(axis)


def _tensors(op: str, xs: Sequence[Any], n: int, axis: int | None = None) -> list:
    if len(xs) != n:
        raise ValueError(
            f"{op}: expected {n} per-device inputs (one per device), got {len(xs)}"
        )
    xs = [as_tensor(op, f"input {k}", x) for k, x in enumerate(xs)]
    first = xs[0].type
    for k, x in enumerate(xs[1:], start=1):
        if x.type.dtype != first.dtype or x.type.ndim != first.ndim:
            raise TypeError(
                f"{op}: per-device inputs must share dtype and ndim; input 0 is "
                f"{first.dtype} with {first.ndim} dims, input {k} is {x.type.dtype} "
                "with "
                f"{x.type.ndim} dims"
            )
    if axis is not None and axis >= first.ndim:
        raise ValueError(
            f"{op}: axis {axis} is out of range for {first.ndim}-dim inputs"
        )
    return xs


def _merged_shape(types: Sequence[TensorType], skip: int | None = None) -> list:
    """Per-dim static extent common to ``types`` (None where unknown or different)."""
    shape = []
    for d in range(types[0].ndim):
        vals = {t.shape[d] for t in types}
        shape.append(vals.pop() if len(vals) == 1 and d != skip else None)
    return shape


def _concat_extent(types: Sequence[TensorType], axis: int) -> int | None:
    ext = [t.shape[axis] for t in types]
    return None if any(e is None for e in ext) else int(sum(ext))


def _zeros_for(g: Variable, like: Variable) -> Variable:
    if isinstance(g.type, (DisconnectedType, NullType)):
        return pt.zeros_like(like)
    return g


def _connected(g: Variable) -> bool:
    return not isinstance(g.type, (DisconnectedType, NullType))


def _sizes_input(op: str, sizes: Any, n: int) -> Variable:
    sizes = pt.as_tensor_variable(sizes)
    if sizes.type.ndim != 1 or sizes.type.dtype not in ("int32", "int64"):
        raise TypeError(
            f"{op}: sizes must be an int vector of length {n}, got {sizes.type}"
        )
    return pt.cast(sizes, "int64")


def check_split(op: str, extent: int, n: int, axis: int) -> None:
    """Refuse to cut ``extent`` entries into ``n`` pieces when some would be empty.

    Every device needs >= 1 entry: a batch smaller than K would otherwise fail
    later, deep inside a device's graph (an empty reshape).
    """
    if extent < n:
        raise ValueError(
            f"{op}: cannot split an extent of {extent} along axis {axis} over "
            f"n={n} devices: every device needs >= 1 entry (a batch must have "
            f"at least K={n} examples)"
        )


def _split_numpy(op: str, x: np.ndarray, n: int, axis: int, sizes: Any) -> list:
    extent = x.shape[axis]
    if sizes is None:
        check_split(op, extent, n, axis)
        sizes = shard_sizes(extent, n)
    else:
        sizes = [int(s) for s in np.asarray(sizes)]
        if len(sizes) != n or sum(sizes) != extent or min(sizes) < 0:
            raise ValueError(
                f"{op}: sizes {sizes} do not split an extent of {extent} into {n} "
                "pieces"
            )
    out, start = [], 0
    for s in sizes:
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, start + s)
        out.append(np.array(x[tuple(index)], copy=True))
        start += s
    return out


def _check_same_shape(op: str, xs: Sequence[np.ndarray]) -> None:
    for k, x in enumerate(xs[1:], start=1):
        if x.shape != xs[0].shape:
            raise ValueError(
                f"{op}: per-device inputs must have one shape; input 0 has "
                f"{xs[0].shape}, input {k} has {x.shape}"
            )


# --------------------------------------------------------------------------
# the skeletons: what a host collective and its GPU twin share
# --------------------------------------------------------------------------


class CollectiveBase:
    """The skeleton shared by the host ops here and their GPU twins.

    A family's base (:class:`AllGatherBase`, ...) writes shape inference, the
    connection pattern and the pullback once; the host op (below) and the GPU
    op (:mod:`cc2ops.cuda.ops.comm`) add their props, ``make_node`` and
    ``perform``, and two hooks through which the pullbacks stay on their
    backend:

    - ``_cotangent(g, out)``: ``g`` as a cotangent of the output ``out``
      (zeros like ``out`` where ``g`` is disconnected; on ``out``'s device for
      a GPU op);
    - ``_op(kind, **params)``: the op of ``kind`` (a ``comm_kind``, or
      ``"shard"`` / ``"shard_grad"``) of the same backend and devices.

    ``n`` is the number of devices. The backend's base class (``_HostOp``
    here) derives from this one, so its hooks come before the family
    skeleton's in the method order.
    """

    n: int
    #: Whether a cotangent that is a graph of constants is the same on every
    #: device without a broadcast (host values; a GPU value has one device)
    _constant_cotangent_is_local = False

    def _cotangent(self, g: Variable, out: Variable) -> Variable:
        raise NotImplementedError(f"{type(self).__name__} has no _cotangent")

    def _op(self, kind: str, **params: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no _op")

    def _cotangents(self, outputs, cotangents) -> list[Variable]:
        return [self._cotangent(g, o) for g, o in zip(cotangents, outputs, strict=True)]


class AllGatherBase(CollectiveBase):
    """Every device gets the concatenation along ``axis``; pullback: reduce-scatter
    with the pieces' extents."""

    comm_kind = "all_gather"
    axis: int

    def _infer_shape(self, node, input_shapes):
        shape = list(input_shapes[0])
        shape[self.axis] = sum(s[self.axis] for s in input_shapes)
        return [tuple(shape)] * self.n

    def pullback(self, inputs, outputs, cotangents):
        gs = self._cotangents(outputs, cotangents)
        sizes = pt.stack([x.shape[self.axis] for x in inputs])
        return self._op("reduce_scatter", axis=self.axis)(*gs, sizes=sizes)


class ReduceScatterBase(CollectiveBase):
    """Device k gets piece k of the sum (optional ``sizes`` input after the
    ``n`` data inputs); pullback: all-gather."""

    comm_kind = "reduce_scatter"
    axis: int

    def _infer_shape(self, node, input_shapes):
        out = []
        for k in range(self.n):
            s = list(input_shapes[0])
            if len(node.inputs) > self.n:
                s[self.axis] = node.inputs[self.n][k]
            else:
                s[self.axis] = symbolic_piece(s[self.axis], self.n, k)[1]
            out.append(tuple(s))
        return out

    def connection_pattern(self, node):
        pattern = [[True] * self.n for _ in range(self.n)]
        if len(node.inputs) > self.n:
            pattern.append([False] * self.n)
        return pattern

    def pullback(self, inputs, outputs, cotangents):
        gs = self._cotangents(outputs, cotangents)
        grads = list(self._op("all_gather", axis=self.axis)(*gs))
        if len(inputs) > self.n:
            grads.append(disconnected_type())
        return grads


class AllReduceBase(CollectiveBase):
    """Every device gets the sum; pullback: all-reduce."""

    comm_kind = "all_reduce"

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]] * self.n

    def pullback(self, inputs, outputs, cotangents):
        gs = self._cotangents(outputs, cotangents)
        return list(self._op("all_reduce")(*gs))


class BroadcastBase(CollectiveBase):
    """The root's input on every device; pullback: reduce to the root."""

    comm_kind = "broadcast"
    root: int

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]] * self.n

    def pullback(self, inputs, outputs, cotangents):
        gs = self._cotangents(outputs, cotangents)
        return [self._op("reduce", root=self.root)(*gs)]


class ReduceBase(CollectiveBase):
    """The sum on the root device; pullback: broadcast from the root."""

    comm_kind = "reduce"
    root: int

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        if not _connected(g):
            return [disconnected_type() for _ in inputs]
        g = self._cotangent(g, outputs[0])
        if self._constant_cotangent_is_local and all(
            isinstance(v, Constant) for v in graph_inputs([g])
        ):
            # every device can compute a constant (the cost's seed cotangent)
            return [g] * self.n
        return _as_list(self._op("broadcast", root=self.root)(g))


class ShardBase(CollectiveBase):
    """Piece ``index`` of ``n`` along ``axis`` (local); pullback: shard_grad."""

    def __init__(self, n: int, index: int, axis: int = 0) -> None:
        # the messages name Shard for the whole family (as in 0.1)
        self.n = _check_n("Shard", n)
        if (
            isinstance(index, bool)
            or not isinstance(index, (int, np.integer))
            or not (0 <= index < self.n)
        ):
            raise ValueError(f"Shard: index must be in 0..{self.n - 1}, got {index!r}")
        self.index = int(index)
        self.axis = _check_axis("Shard", axis)

    def _infer_shape(self, node, input_shapes):
        s = list(input_shapes[0])
        s[self.axis] = symbolic_piece(s[self.axis], self.n, self.index)[1]
        return [tuple(s)]

    def _piece_op(self, kind: str) -> Any:
        return self._op(kind, index=self.index, axis=self.axis)

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        if not _connected(g):
            return [disconnected_type()]
        g = self._cotangent(g, outputs[0])
        return [self._piece_op("shard_grad")(g, inputs[0])]


class ShardGradBase(ShardBase):
    """Zeros like ``x`` with piece ``index`` set to ``g``; pullback: shard."""

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[1]]

    def connection_pattern(self, node):
        return [[True], [False]]

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        if not _connected(g):
            return [disconnected_type(), disconnected_type()]
        g = self._cotangent(g, outputs[0])
        return [self._piece_op("shard")(g), disconnected_type()]


# --------------------------------------------------------------------------
# the host ops
# --------------------------------------------------------------------------


class _HostOp(CollectiveBase, Cc2Op):
    """The host side of the skeleton's hooks: host cotangents, host ops."""

    _constant_cotangent_is_local = True

    def _cotangent(self, g: Variable, out: Variable) -> Variable:
        return _zeros_for(g, out)

    def _op(self, kind: str, **params: Any) -> Any:
        return _HOST_OPS[kind](self.n, **params)


class _CommOp(_HostOp):
    """Base of the host collectives: ``n`` devices, optional ``axis``."""

    def do_constant_folding(self, fgraph: Any, node: Apply) -> bool:
        # folding would run a collective while a graph is rewritten
        return False


class AllGather(AllGatherBase, _CommOp):
    """Every device receives the concatenation of all devices' inputs along ``axis``.

    Parameters
    ----------
    n : int
        Number of devices (inputs and outputs).
    axis : int
        Concatenation axis; pieces may have different extents along it.

    Notes
    -----
    Inputs ``x_0 .. x_{n-1}`` share dtype and ndim; outputs are ``n`` equal
    arrays. Pullback: :class:`ReduceScatter` with the inputs' extents.
    """

    __props__ = ("n", "axis")

    def __init__(self, n: int, axis: int = 0) -> None:
        self.n = _check_n("AllGather", n)
        self.axis = _check_axis("AllGather", axis)

    def make_node(self, *xs: Any) -> Apply:
        xs = _tensors("AllGather", xs, self.n, self.axis)
        shape = _merged_shape([x.type for x in xs], skip=self.axis)
        shape[self.axis] = _concat_extent([x.type for x in xs], self.axis)
        out = TensorType(xs[0].type.dtype, shape)
        return Apply(self, xs, [out() for _ in range(self.n)])

    def perform(self, node, inputs, outputs):
        full = np.concatenate(inputs, axis=self.axis)
        for k in range(self.n):
            outputs[k][0] = full if k == 0 else full.copy()


class ReduceScatter(ReduceScatterBase, _CommOp):
    """Device ``k`` receives piece ``k`` (along ``axis``) of the sum of all inputs.

    Parameters
    ----------
    n : int
        Number of devices.
    axis : int
        The axis cut into pieces.

    Notes
    -----
    Inputs share one shape. Piece sizes follow ``numpy.array_split`` unless an
    int vector ``sizes`` (keyword, length ``n``) is given. Pullback:
    :class:`AllGather`.
    """

    __props__ = ("n", "axis")

    def __init__(self, n: int, axis: int = 0) -> None:
        self.n = _check_n("ReduceScatter", n)
        self.axis = _check_axis("ReduceScatter", axis)

    def make_node(self, *xs: Any, sizes: Any = None) -> Apply:
        if sizes is None and len(xs) == self.n + 1:
            # the sizes input passed positionally (clone_with_new_inputs)
            *xs, sizes = xs
        xs = _tensors("ReduceScatter", xs, self.n, self.axis)
        inputs = list(xs)
        if sizes is not None:
            inputs.append(_sizes_input("ReduceScatter", sizes, self.n))
        shape = _merged_shape([x.type for x in xs])
        extent = shape[self.axis]
        outs = []
        for k in range(self.n):
            s = list(shape)
            s[self.axis] = (
                shard_sizes(extent, self.n)[k]
                if extent is not None and sizes is None
                else None
            )
            outs.append(TensorType(xs[0].type.dtype, s)())
        return Apply(self, inputs, outs)

    def perform(self, node, inputs, outputs):
        xs = inputs[: self.n]
        _check_same_shape("ReduceScatter", xs)
        total = xs[0].copy()
        for x in xs[1:]:
            total += x
        sizes = inputs[self.n] if len(inputs) > self.n else None
        for k, piece in enumerate(
            _split_numpy("ReduceScatter", total, self.n, self.axis, sizes)
        ):
            outputs[k][0] = piece


class AllReduce(AllReduceBase, _CommOp):
    """Every device receives the sum of all devices' inputs.

    Notes
    -----
    Inputs share one shape. Pullback: :class:`AllReduce` of the cotangents.
    """

    __props__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = _check_n("AllReduce", n)

    def make_node(self, *xs: Any) -> Apply:
        xs = _tensors("AllReduce", xs, self.n)
        out = TensorType(xs[0].type.dtype, _merged_shape([x.type for x in xs]))
        return Apply(self, xs, [out() for _ in range(self.n)])

    def perform(self, node, inputs, outputs):
        _check_same_shape("AllReduce", inputs)
        total = np.array(inputs[0], copy=True)
        for x in inputs[1:]:
            total += x
        for k in range(self.n):
            outputs[k][0] = total if k == 0 else total.copy()


class Broadcast(BroadcastBase, _CommOp):
    """The root device's input, copied to all ``n`` devices.

    Parameters
    ----------
    n : int
        Number of devices (outputs).
    root : int
        The device holding the input (0 .. n-1).

    Notes
    -----
    One input (the root's), ``n`` outputs. Pullback: :class:`Reduce` to root.
    """

    __props__ = ("n", "root")

    def __init__(self, n: int, root: int = 0) -> None:
        self.n = _check_n("Broadcast", n)
        if (
            isinstance(root, bool)
            or not isinstance(root, (int, np.integer))
            or not (0 <= root < self.n)
        ):
            raise ValueError(
                f"Broadcast: root must be in 0..{self.n - 1}, got {root!r}"
            )
        self.root = int(root)

    def do_constant_folding(self, fgraph: Any, node: Apply) -> bool:
        # a broadcast constant is the constant on every device (the cost's seed
        # cotangent after folding): no communication needed
        return isinstance(node.inputs[0], Constant)

    def make_node(self, x: Any) -> Apply:
        x = as_tensor("Broadcast", "input", x)
        return Apply(self, [x], [x.type() for _ in range(self.n)])

    def perform(self, node, inputs, outputs):
        for k in range(self.n):
            outputs[k][0] = np.array(inputs[0], copy=True)


class Reduce(ReduceBase, _CommOp):
    """The sum of all devices' inputs, on the root device.

    Notes
    -----
    Inputs share one shape. Pullback: :class:`Broadcast` from root.
    """

    __props__ = ("n", "root")

    def __init__(self, n: int, root: int = 0) -> None:
        self.n = _check_n("Reduce", n)
        if (
            isinstance(root, bool)
            or not isinstance(root, (int, np.integer))
            or not (0 <= root < self.n)
        ):
            raise ValueError(f"Reduce: root must be in 0..{self.n - 1}, got {root!r}")
        self.root = int(root)

    def make_node(self, *xs: Any) -> Apply:
        xs = _tensors("Reduce", xs, self.n)
        out = TensorType(xs[0].type.dtype, _merged_shape([x.type for x in xs]))
        return Apply(self, xs, [out()])

    def perform(self, node, inputs, outputs):
        _check_same_shape("Reduce", inputs)
        total = np.array(inputs[0], copy=True)
        for x in inputs[1:]:
            total += x
        outputs[0][0] = total


class Scatter(_CommOp):
    """Piece ``k`` (along ``axis``) of the root's input goes to device ``k``.

    Parameters
    ----------
    n : int
        Number of devices (outputs).
    axis : int
        The axis cut into pieces.

    Notes
    -----
    Piece sizes follow ``numpy.array_split``, or the int vector ``sizes``
    (keyword, length ``n``). Pullback: :class:`Gather`.
    """

    comm_kind = "scatter"
    __props__ = ("n", "axis")

    def __init__(self, n: int, axis: int = 0) -> None:
        self.n = _check_n("Scatter", n)
        self.axis = _check_axis("Scatter", axis)

    def make_node(self, x: Any, sizes: Any = None) -> Apply:
        (x,) = _tensors("Scatter", [x], 1, self.axis)
        inputs = [x]
        if sizes is not None:
            inputs.append(_sizes_input("Scatter", sizes, self.n))
        extent = x.type.shape[self.axis]
        outs = []
        for k in range(self.n):
            s = list(x.type.shape)
            s[self.axis] = (
                shard_sizes(extent, self.n)[k]
                if extent is not None and sizes is None
                else None
            )
            outs.append(TensorType(x.type.dtype, s)())
        return Apply(self, inputs, outs)

    def perform(self, node, inputs, outputs):
        sizes = inputs[1] if len(inputs) > 1 else None
        for k, piece in enumerate(
            _split_numpy("Scatter", inputs[0], self.n, self.axis, sizes)
        ):
            outputs[k][0] = piece

    def _infer_shape(self, node, input_shapes):
        shape = list(input_shapes[0])
        out = []
        for k in range(self.n):
            s = list(shape)
            if len(node.inputs) > 1:
                s[self.axis] = node.inputs[1][k]
            else:
                s[self.axis] = symbolic_piece(shape[self.axis], self.n, k)[1]
            out.append(tuple(s))
        return out

    def connection_pattern(self, node):
        pattern = [[True] * self.n]
        if len(node.inputs) > 1:
            pattern.append([False] * self.n)
        return pattern

    def pullback(self, inputs, outputs, cotangents):
        gs = [_zeros_for(g, o) for g, o in zip(cotangents, outputs, strict=True)]
        grads = [Gather(self.n, self.axis)(*gs)]
        if len(inputs) > 1:
            grads.append(disconnected_type())
        return grads


class Gather(_CommOp):
    """The concatenation of all devices' inputs along ``axis``, on the root device.

    Notes
    -----
    Pieces may differ in extent along ``axis``. Pullback: :class:`Scatter`
    with the inputs' extents.
    """

    comm_kind = "gather"
    __props__ = ("n", "axis")

    def __init__(self, n: int, axis: int = 0) -> None:
        self.n = _check_n("Gather", n)
        self.axis = _check_axis("Gather", axis)

    def make_node(self, *xs: Any) -> Apply:
        xs = _tensors("Gather", xs, self.n, self.axis)
        shape = _merged_shape([x.type for x in xs], skip=self.axis)
        shape[self.axis] = _concat_extent([x.type for x in xs], self.axis)
        return Apply(self, xs, [TensorType(xs[0].type.dtype, shape)()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = np.concatenate(inputs, axis=self.axis)

    def _infer_shape(self, node, input_shapes):
        shape = list(input_shapes[0])
        shape[self.axis] = sum(s[self.axis] for s in input_shapes)
        return [tuple(shape)]

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        if not _connected(g):
            return [disconnected_type() for _ in inputs]
        sizes = pt.stack([x.shape[self.axis] for x in inputs])
        return list(Scatter(self.n, self.axis)(g, sizes=sizes))


class Shard(ShardBase, _HostOp):
    """Piece ``index`` of ``n`` (``numpy.array_split`` rule) of ``x`` along ``axis``.

    A local op: a device that holds the whole value keeps its own piece.
    Pullback: :class:`ShardGrad`.
    """

    __props__ = ("n", "index", "axis")

    def make_node(self, x: Any) -> Apply:
        (x,) = _tensors("Shard", [x], 1, self.axis)
        s = list(x.type.shape)
        extent = s[self.axis]
        s[self.axis] = (
            None if extent is None else shard_sizes(extent, self.n)[self.index]
        )
        return Apply(self, [x], [TensorType(x.type.dtype, s)()])

    def perform(self, node, inputs, outputs):
        (x,) = inputs
        check_split("Shard", x.shape[self.axis], self.n, self.axis)
        start, stop = shard_bounds(x.shape[self.axis], self.n)[self.index]
        index = [slice(None)] * x.ndim
        index[self.axis] = slice(start, stop)
        outputs[0][0] = np.array(x[tuple(index)], copy=True)


class ShardGrad(ShardGradBase, _HostOp):
    """Zeros shaped like ``x`` with piece ``index`` (along ``axis``) set to ``g``.

    The pullback of :class:`Shard`; ``x`` only gives the shape.
    """

    __props__ = ("n", "index", "axis")

    def make_node(self, g: Any, x: Any) -> Apply:
        g, x = _tensors("ShardGrad", [g, x], 2, self.axis)
        return Apply(self, [g, x], [x.type()])

    def perform(self, node, inputs, outputs):
        g, x = inputs
        start, stop = shard_bounds(x.shape[self.axis], self.n)[self.index]
        if g.shape[self.axis] != stop - start:
            raise ValueError(
                f"ShardGrad: piece {self.index} of {self.n} along axis {self.axis} has "
                f"{stop - start} entries, the cotangent has {g.shape[self.axis]}"
            )
        out = np.zeros(x.shape, dtype=g.dtype)
        index = [slice(None)] * x.ndim
        index[self.axis] = slice(start, stop)
        out[tuple(index)] = g
        outputs[0][0] = out


#: The collectives (the ops that move data between devices).
COMM_OPS = (AllGather, ReduceScatter, AllReduce, Broadcast, Reduce, Scatter, Gather)
#: Local piece selection (no data moves between devices).
LOCAL_OPS = (Shard, ShardGrad)

#: The host op of each kind (the skeleton's ``_op`` hook).
_HOST_OPS = {
    "all_gather": AllGather,
    "reduce_scatter": ReduceScatter,
    "all_reduce": AllReduce,
    "broadcast": Broadcast,
    "reduce": Reduce,
    "scatter": Scatter,
    "gather": Gather,
    "shard": Shard,
    "shard_grad": ShardGrad,
}


class CommBackend(ABC):
    """How the multi-device rewriter builds communication (one per backend).

    Each method takes per-device graph variables (index = device position
    0..K-1) and returns per-device variables as *host tensors* the rewritten
    graph can use: the host/virtual backend returns the host ops' outputs,
    the GPU backends (:mod:`cc2ops.cuda.ops.comm`) move the inputs to their
    devices, run a GPU collective and return ``host_from_gpu`` of its
    outputs, which the GPU mode's lifting then keeps on the devices.

    A one-process-per-GPU backend (MPI + ``ncclCommInitRank``) would hold one
    device's variables only; the rewriter asks for the same collectives.
    """

    #: Device labels in device-position order.
    labels: tuple[int, ...] = ()

    @property
    def n(self) -> int:
        return len(self.labels)

    @abstractmethod
    def all_gather(self, xs: Sequence[Variable], axis: int) -> list[Variable]:
        """See the class docstring."""

    @abstractmethod
    def reduce_scatter(self, xs: Sequence[Variable], axis: int) -> list[Variable]:
        """See the class docstring."""

    @abstractmethod
    def all_reduce(self, xs: Sequence[Variable]) -> list[Variable]:
        """See the class docstring."""

    @abstractmethod
    def broadcast(self, x: Variable, root: int = 0) -> list[Variable]:
        """See the class docstring."""

    @abstractmethod
    def reduce(self, xs: Sequence[Variable], root: int = 0) -> Variable:
        """See the class docstring."""

    @abstractmethod
    def scatter(self, x: Variable, axis: int) -> list[Variable]:
        """See the class docstring."""

    @abstractmethod
    def gather(self, xs: Sequence[Variable], axis: int) -> Variable:
        """See the class docstring."""

    def shard(self, x: Variable, k: int, axis: int) -> Variable:
        """Device ``k``'s piece of ``x``, a value device ``k`` holds whole (local)."""
        return Shard(self.n, k, axis)(x)

    def place(self, x: Variable, k: int) -> Variable:
        """A root-side value (constant, scalar) used by device ``k``'s computation."""
        return x

    # ---- per-device state (step 2 of the multi-device rewrite) --------------
    def new_state(self, var: Any, placement: Any) -> list:
        """K per-device shared variables holding ``var``'s value.

        ``placement.kind == "replicated"``: ``var`` itself is device 0's
        replica, the others are copies; ``"sharded"``: piece k along
        ``placement.axis`` (``numpy.array_split`` rule).
        """
        import pytensor

        value = np.asarray(var.get_value())
        name = var.name or "shared"
        if placement.kind == "replicated":
            return [var] + [
                pytensor.shared(value.copy(), name=f"{name}@{k}")
                for k in range(1, self.n)
            ]
        pieces = []
        for k, (start, stop) in enumerate(
            shard_bounds(value.shape[placement.axis], self.n)
        ):
            index = [slice(None)] * value.ndim
            index[placement.axis] = slice(start, stop)
            pieces.append(
                pytensor.shared(
                    np.array(value[tuple(index)], copy=True), name=f"{name}@{k}"
                )
            )
        return pieces

    def gradient_all_reduce(self, xs: Sequence[Variable]) -> list[Variable]:
        """The per-device sums of a replicated parameter's gradient summands
        (what localisation turns its ``Reduce`` into); a backend with several
        data-parallel groups adds the reduction across groups here."""
        return self.all_reduce(xs)

    def gradient_shards(self, xs: Sequence[Variable]) -> list[Variable]:
        """The per-device gradient shards of a sharded parameter (its
        ``Gather``'s inputs, kept local)."""
        return list(xs)

    def state_view(self, part: Variable, out: Variable) -> Variable:
        """``part`` typed to replace ``out`` (a Broadcast/Scatter output)."""
        if part.type == out.type:
            return part
        return out.type.filter_variable(part, allow_convert=True)

    def root_view(
        self, parts: Sequence[Variable], placement: Any, like: Variable | None = None
    ) -> Variable:
        """The whole value of per-device state, as one root variable (of
        ``like``'s type when given: it stands for that variable)."""
        view = parts[0] if placement.kind == "replicated" else None
        if view is None:
            view = self.gather(parts, placement.axis)
        if like is not None and view.type != like.type:
            view = like.type.filter_variable(view, allow_convert=True)
        return view


class VirtualBackend(CommBackend):
    """K logical devices on the host: the ops of this module, run with numpy.

    Parameters
    ----------
    labels : sequence of int
        The logical device labels (only their number matters for computing).
    """

    def __init__(self, labels: Sequence[int]) -> None:
        labels = tuple(int(d) for d in labels)
        if not labels:
            raise ValueError("VirtualBackend: give at least one device label")
        if len(set(labels)) != len(labels):
            raise ValueError(f"VirtualBackend: repeated device labels {labels}")
        self.labels = labels

    def all_gather(self, xs, axis):
        return list(AllGather(self.n, axis)(*xs)) if self.n > 1 else [xs[0]]

    def reduce_scatter(self, xs, axis):
        return list(ReduceScatter(self.n, axis)(*xs)) if self.n > 1 else [xs[0]]

    def all_reduce(self, xs):
        return _as_list(AllReduce(self.n)(*xs))

    def broadcast(self, x, root=0):
        return _as_list(Broadcast(self.n, root)(x))

    def reduce(self, xs, root=0):
        return Reduce(self.n, root)(*xs)

    def scatter(self, x, axis):
        return _as_list(Scatter(self.n, axis)(x))

    def gather(self, xs, axis):
        return Gather(self.n, axis)(*xs)

    def __repr__(self) -> str:
        return f"VirtualBackend(labels={self.labels})"


def _as_list(out: Any) -> list[Variable]:
    return list(out) if isinstance(out, (list, tuple)) else [out]
