"""GPU collectives: K inputs on K device labels -> K outputs, one ``Apply`` node each.

The GPU counterparts of :mod:`cc2ops.distributed.collectives` (same values,
same pullbacks: each op takes its family's skeleton from there, shape
inference, connection pattern and pullback, and adds its props, ``make_node``
and ``perform``)::

    GpuAllGather(labels, axis)     <-> GpuReduceScatter(labels, axis)
    GpuAllReduce(labels)           <-> GpuAllReduce(labels)
    GpuBroadcast(labels, root)     <-> GpuReduce(labels, root)

Input/output ``k`` lives on ``labels[k]``. How the bytes move is chosen when
the op runs (``impl``):

``"nccl"``
    :mod:`cc2ops.cuda.libs.nccl`, one communicator per physical device
    (``ncclCommInitAll``), one group call per collective on the devices'
    cc2ops streams. Needs distinct physical devices.
``"peer"``
    ``cuMemcpyPeer`` with both contexts passed explicitly (default contexts
    crash on some drivers) plus a cuBLAS accumulate for sums.
``"virtual"``
    Labels mapped to one physical GPU (:func:`cc2ops.cuda.set_device_map`):
    device copies and cuBLAS accumulates on that GPU.
``"auto"`` (default)
    ``nccl`` when every label is its own physical device and libnccl loads,
    else ``peer`` for distinct devices, else ``virtual``.

Concatenation along ``axis`` > 0 moves the axis to the front (a strided
copy), exchanges contiguous pieces and moves it back. Uneven pieces use
grouped ``ncclBroadcast``/``ncclReduce`` (one root per piece); even axis-0
pieces use ``ncclAllGather``/``ncclReduceScatter``.

:class:`GpuBackend` is the :class:`~cc2ops.distributed.collectives.CommBackend`
the multi-device rewriter uses on GPUs. Importing this module registers the
GPU backend with the rewriter (:mod:`cc2ops.distributed.seam`: the transfer
ops, the device type, :class:`GpuBackend`, the SPMD mode's NCCL
communicator), so the rewriter never imports CUDA code, and
:func:`cc2ops.cuda.mode` builds its multi-GPU mode
(:class:`cc2ops.cuda.mode.MultiGpuMode`) over the registered backend.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply, Variable
from pytensor.graph.null_type import NullType

from cc2ops.cuda.libs import cublas, nccl
from cc2ops.cuda.mode import MultiGpuMode, multi_gpu_mode
from cc2ops.cuda.op import GpuOp, as_gpu_variable
from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.availability import driver
from cc2ops.cuda.runtime.device import get_device, physical_index
from cc2ops.cuda.transfer import (
    GpuFromHost,
    GpuToGpu,
    HostFromGpu,
    as_gpu,
    as_gpu_cotangent,
    as_host,
    host_from_gpu,
)
from cc2ops.cuda.type import CudaArrayType, CudaSharedVariable, shared
from cc2ops.distributed import seam
from cc2ops.distributed.collectives import (
    AllGatherBase,
    AllReduceBase,
    BroadcastBase,
    CollectiveBase,
    CommBackend,
    Gather,
    Reduce,
    ReduceBase,
    ReduceScatterBase,
    Scatter,
    Shard,
    ShardBase,
    ShardGrad,
    ShardGradBase,
    VirtualBackend,
    shard_bounds,
    shard_sizes,
)
from cc2ops.distributed.nccl import NcclCommunicator

__all__ = [
    "IMPLS",
    "GpuAllGather",
    "GpuReduceScatter",
    "GpuAllReduce",
    "GpuBroadcast",
    "GpuReduce",
    "GPU_COMM_OPS",
    "GpuShard",
    "GpuShardGrad",
    "GpuBackend",
    "gpu_backend",
    "resolve_impl",
    # defined in cc2ops.cuda.mode, where the modes live; the 0.1 module
    # cc2ops.cuda.comm (an alias of this one now) had them
    "MultiGpuMode",
    "multi_gpu_mode",
]

IMPLS = ("auto", "nccl", "peer", "virtual")


def _labels(op: str, labels: Any) -> tuple[int, ...]:
    labels = tuple(int(d) for d in labels)
    if not labels:
        raise ValueError(f"{op}: labels must not be empty")
    if len(set(labels)) != len(labels):
        raise ValueError(f"{op}: repeated device labels {labels}")
    if any(d < 0 for d in labels):
        raise ValueError(f"{op}: device labels must be >= 0, got {labels}")
    return labels


def _impl(op: str, impl: str) -> str:
    if impl not in IMPLS:
        raise ValueError(f"{op}: impl must be one of {IMPLS}, got {impl!r}")
    return impl


def resolve_impl(labels: Sequence[int], impl: str = "auto") -> str:
    """The implementation ``impl`` means for ``labels`` now (needs no CUDA)."""
    physical = [physical_index(d) for d in labels]
    distinct = len(set(physical)) == len(physical)
    if impl in ("nccl", "peer") and not distinct:
        raise ValueError(
            f"cc2ops.cuda.comm: impl {impl!r} needs distinct physical devices, labels "
            f"{tuple(labels)} map to {physical}; use 'virtual'"
        )
    if impl != "auto":
        return impl
    if not distinct:
        return "virtual"
    if len(physical) == 1:
        return "virtual"
    try:
        nccl.load()
        return "nccl"
    except Exception:  # no libnccl: peer copies still work
        return "peer"


def _zeros_like_out(g: Variable, out: Variable) -> Variable:
    if isinstance(g.type, (DisconnectedType, NullType)):
        return as_gpu(pt.zeros_like(host_from_gpu(out)), out.type.device)
    return as_gpu_cotangent(g, out.type.device)


class _GpuFamily(CollectiveBase, GpuOp):
    """The GPU side of the skeleton's hooks: GPU cotangents, GPU ops of ``n``."""

    def _cotangent(self, g: Variable, out: Variable) -> Variable:
        return _zeros_like_out(g, out)

    def _op(self, kind: str, **params: Any) -> Any:
        return _GPU_OPS[kind](self.n, **params)


class _GpuComm(_GpuFamily):
    """Base: ``labels`` (device k of the collective is ``labels[k]``), ``impl``."""

    def _op(self, kind: str, **params: Any) -> Any:
        return _GPU_OPS[kind](self.labels, impl=self.impl, **params)

    def device_of(self, node: Apply) -> int:
        return self.labels[0]

    def thunk_device(self, node: Apply) -> int:
        return self.labels[0]

    @property
    def n(self) -> int:
        return len(self.labels)

    def _inputs(self, xs: Sequence[Any], name: str) -> list[Variable]:
        if len(xs) != self.n:
            raise ValueError(
                f"{name}: expected {self.n} per-device inputs (labels {self.labels}), "
                f"got {len(xs)}"
            )
        xs = [
            as_gpu_variable(x, d, op=name, role=f"input {k}")
            for k, (x, d) in enumerate(zip(xs, self.labels, strict=True))
        ]
        for k, x in enumerate(xs[1:], start=1):
            if x.type.dtype != xs[0].type.dtype or x.type.ndim != xs[0].type.ndim:
                raise TypeError(
                    f"{name}: per-device inputs must share dtype and ndim; input 0 is "
                    f"{xs[0].type}, input {k} is {x.type}"
                )
        return xs

    def _out_type(self, x: Variable, k: int, shape: Sequence[Any]) -> CudaArrayType:
        return CudaArrayType(x.type.dtype, tuple(shape), self.labels[k])


# --------------------------------------------------------------------------
# run-time helpers (CUDA only inside)
# --------------------------------------------------------------------------


def _move(x: Any, src: int, dst: int) -> Any:
    """A C-contiguous copy of GPUArray ``x`` (on label ``src``) on label ``dst``."""
    s, d = get_device(src), get_device(dst)
    if s.shares_physical(d):
        return array.copy(x, dst)
    c = array.ascontiguous(x, src)
    s.synchronize()  # memcpy_peer is synchronous w.r.t. the host, not our stream
    out = array.empty(c.shape, c.dtype, dst)
    if out.nbytes:
        driver().memcpy_peer(
            array.ptr(out), array.ptr(c), out.nbytes,
            dest_context=d.context, src_context=s.context,
        )  # fmt: skip
    return out


_ONES: dict = {}


def _accumulate(dst: Any, src: Any, label: int) -> None:
    """``dst += src`` (C-contiguous, same shape, one device) with cuBLAS gemv."""
    n = int(np.prod(dst.shape, dtype=np.int64))
    if n == 0:
        return
    dtype = np.dtype(dst.dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"cc2ops.cuda.comm: sums need float32/float64, got {dtype}")
    key = (get_device(label).index, dtype.str)
    one = _ONES.get(key)
    if one is None:
        one = _ONES[key] = array.full((1,), 1.0, dtype, label)
    cublas.gemv(
        array.ascontiguous(src, label).reshape(n, 1), one, dst.reshape(n),
        beta=1.0, device=label,
    )  # fmt: skip


def _front(x: Any, axis: int, label: int) -> Any:
    """``x`` with ``axis`` moved to the front, C-contiguous."""
    if axis == 0:
        return array.ascontiguous(x, label)
    perm = [axis] + [i for i in range(len(x.shape)) if i != axis]
    return array.ascontiguous(x.transpose(perm), label)


def _back(x: Any, axis: int, label: int) -> Any:
    """Inverse of :func:`_front`."""
    if axis == 0:
        return x
    ndim = len(x.shape)
    perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, ndim))
    return array.ascontiguous(x.transpose(perm), label)


def _rows(x: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a C-contiguous array (a contiguous view)."""
    return x[start:stop]


def _stream(label: int) -> ctypes.c_void_p:
    return ctypes.c_void_p(int(get_device(label).stream.handle))


def _comms(labels: Sequence[int]) -> Any:
    return nccl.communicators([physical_index(d) for d in labels])


def _nccl_dtype(dtype: Any) -> int:
    dt = np.dtype(dtype)
    if dt not in nccl.DTYPES:
        raise TypeError(f"cc2ops.cuda.comm: NCCL has no type for {dt}")
    return nccl.DTYPES[dt]


class _Group:
    """``ncclGroupStart``/``End`` around a block."""

    def __enter__(self) -> None:
        nccl.call("ncclGroupStart")

    def __exit__(self, *exc: Any) -> None:
        nccl.call("ncclGroupEnd")


def _vp(garray: Any, offset_bytes: int = 0) -> ctypes.c_void_p:
    return ctypes.c_void_p(array.ptr(garray) + offset_bytes)


def _nccl_broadcast_pieces(fronts, sizes, labels, outs_front, comms) -> None:
    """Device j's rows go to rows offset_j of every output (one group)."""
    row_bytes = [
        int(np.prod(f.shape[1:], dtype=np.int64)) * f.dtype.itemsize for f in fronts
    ]
    dt = _nccl_dtype(fronts[0].dtype)
    offset = 0
    with _Group():
        for j, size in enumerate(sizes):
            count = size * row_bytes[j] // fronts[j].dtype.itemsize
            for k, lab in enumerate(labels):
                nccl.call(
                    "ncclBroadcast", _vp(fronts[j]),
                    _vp(outs_front[k], offset * row_bytes[j]), ctypes.c_size_t(count),
                    dt, j, comms.comms[k], _stream(lab), comm=comms.comms[k],
                )  # fmt: skip
            offset += size


def _nccl_reduce_pieces(fronts, sizes, labels, outs, comms) -> None:
    """Piece j of the sum of all fronts lands on device j (one group)."""
    row = int(np.prod(fronts[0].shape[1:], dtype=np.int64))
    itemsize = fronts[0].dtype.itemsize
    dt = _nccl_dtype(fronts[0].dtype)
    offset = 0
    with _Group():
        for j, size in enumerate(sizes):
            for k, lab in enumerate(labels):
                recv = _vp(outs[j]) if k == j else ctypes.c_void_p(0)
                nccl.call(
                    "ncclReduce", _vp(fronts[k], offset * row * itemsize), recv,
                    ctypes.c_size_t(size * row), dt, nccl.SUM, j, comms.comms[k],
                    _stream(lab), comm=comms.comms[k],
                )  # fmt: skip
            offset += size


# --------------------------------------------------------------------------
# the ops
# --------------------------------------------------------------------------


class GpuAllGather(AllGatherBase, _GpuComm):
    """Device k gets the concatenation along ``axis`` of every device's input.

    Parameters
    ----------
    labels : sequence of int
        Device labels, input/output k on ``labels[k]``.
    axis : int
    impl : {"auto", "nccl", "peer", "virtual"}

    Notes
    -----
    Pieces may differ along ``axis``. Pullback: :class:`GpuReduceScatter`
    with the pieces' extents.
    """

    __props__ = ("labels", "axis", "impl")

    def __init__(self, labels: Sequence[int], axis: int = 0, impl: str = "auto"):
        self.labels = _labels("GpuAllGather", labels)
        self.axis = int(axis)
        self.impl = _impl("GpuAllGather", impl)

    def make_node(self, *xs: Any) -> Apply:
        xs = self._inputs(xs, "GpuAllGather")
        if self.axis >= xs[0].type.ndim:
            raise ValueError(f"GpuAllGather: axis {self.axis} is out of range")
        shape = [None] * xs[0].type.ndim
        for d in range(len(shape)):
            vals = {x.type.shape[d] for x in xs}
            if d != self.axis and len(vals) == 1:
                shape[d] = vals.pop()
        ext = [x.type.shape[self.axis] for x in xs]
        shape[self.axis] = None if None in ext else sum(ext)
        outs = [self._out_type(xs[0], k, shape)() for k in range(self.n)]
        return Apply(self, xs, outs)

    def perform(self, node, inputs, outputs):
        labels, axis = self.labels, self.axis
        impl = resolve_impl(labels, self.impl)
        fronts = [_front(x, axis, d) for x, d in zip(inputs, labels, strict=True)]
        sizes = [int(f.shape[0]) for f in fronts]
        full_front = (sum(sizes), *fronts[0].shape[1:])
        outs_front = [array.empty(full_front, fronts[0].dtype, d) for d in labels]
        if impl == "nccl":
            comms = _comms(labels)
            if len(set(sizes)) == 1:
                count = int(np.prod(fronts[0].shape, dtype=np.int64))
                dt = _nccl_dtype(fronts[0].dtype)
                with _Group():
                    for k, d in enumerate(labels):
                        nccl.call(
                            "ncclAllGather", _vp(fronts[k]), _vp(outs_front[k]),
                            ctypes.c_size_t(count), dt, comms.comms[k], _stream(d),
                            comm=comms.comms[k],
                        )  # fmt: skip
            else:
                _nccl_broadcast_pieces(fronts, sizes, labels, outs_front, comms)
        else:
            for k, d in enumerate(labels):
                offset = 0
                for j, src in enumerate(labels):
                    piece = fronts[j] if src == d else _move(fronts[j], src, d)
                    dst = _rows(outs_front[k], offset, offset + sizes[j])
                    if piece.nbytes:
                        get_device(d).activate()
                        driver().memcpy_dtod_async(
                            array.ptr(dst), array.ptr(piece), piece.nbytes,
                            get_device(d).stream,
                        )  # fmt: skip
                    offset += sizes[j]
        for k, d in enumerate(labels):
            outputs[k][0] = _back(outs_front[k], axis, d)


class GpuReduceScatter(ReduceScatterBase, _GpuComm):
    """Device k gets piece k (along ``axis``) of the sum of every device's input.

    Notes
    -----
    Inputs share one shape; pieces follow ``numpy.array_split`` unless the
    host int vector ``sizes`` (keyword) is given. Float32/float64 only.
    Pullback: :class:`GpuAllGather`.
    """

    __props__ = ("labels", "axis", "impl")

    def __init__(self, labels: Sequence[int], axis: int = 0, impl: str = "auto"):
        self.labels = _labels("GpuReduceScatter", labels)
        self.axis = int(axis)
        self.impl = _impl("GpuReduceScatter", impl)

    def make_node(self, *xs: Any, sizes: Any = None) -> Apply:
        xs = self._inputs(xs, "GpuReduceScatter")
        inputs = list(xs)
        if sizes is not None:
            inputs.append(pt.cast(pt.as_tensor_variable(sizes), "int64"))
        base = list(xs[0].type.shape)
        outs = []
        for k in range(self.n):
            s = list(base)
            ext = base[self.axis]
            s[self.axis] = (
                shard_sizes(ext, self.n)[k]
                if ext is not None and sizes is None
                else None
            )
            outs.append(self._out_type(xs[0], k, s)())
        return Apply(self, inputs, outs)

    def perform(self, node, inputs, outputs):
        labels, axis, n = self.labels, self.axis, self.n
        impl = resolve_impl(labels, self.impl)
        xs = inputs[:n]
        fronts = [_front(x, axis, d) for x, d in zip(xs, labels, strict=True)]
        extent = int(fronts[0].shape[0])
        if len(inputs) > n:
            sizes = [int(s) for s in np.asarray(inputs[n])]
        else:
            sizes = shard_sizes(extent, n)
        if sum(sizes) != extent:
            raise ValueError(
                f"GpuReduceScatter: sizes {sizes} do not split an extent of {extent}"
            )
        rest = tuple(fronts[0].shape[1:])
        outs = [
            array.empty((s, *rest), fronts[0].dtype, d)
            for s, d in zip(sizes, labels, strict=True)
        ]
        if impl == "nccl":
            comms = _comms(labels)
            if len(set(sizes)) == 1:
                count = int(np.prod(outs[0].shape, dtype=np.int64))
                dt = _nccl_dtype(fronts[0].dtype)
                with _Group():
                    for k, d in enumerate(labels):
                        nccl.call(
                            "ncclReduceScatter", _vp(fronts[k]), _vp(outs[k]),
                            ctypes.c_size_t(count), dt, nccl.SUM, comms.comms[k],
                            _stream(d), comm=comms.comms[k],
                        )  # fmt: skip
            else:
                _nccl_reduce_pieces(fronts, sizes, labels, outs, comms)
        else:
            bounds = []
            start = 0
            for s in sizes:
                bounds.append((start, start + s))
                start += s
            for k, d in enumerate(labels):
                a, b = bounds[k]
                acc = array.copy(_rows(fronts[k], a, b), d)
                for j, src in enumerate(labels):
                    if j == k:
                        continue
                    _accumulate(acc, _move(_rows(fronts[j], a, b), src, d), d)
                outs[k] = acc
        for k, d in enumerate(labels):
            outputs[k][0] = _back(outs[k], axis, d)


class GpuAllReduce(AllReduceBase, _GpuComm):
    """Every device gets the sum of every device's input (float32/float64).

    Pullback: :class:`GpuAllReduce`.
    """

    __props__ = ("labels", "impl")

    def __init__(self, labels: Sequence[int], impl: str = "auto"):
        self.labels = _labels("GpuAllReduce", labels)
        self.impl = _impl("GpuAllReduce", impl)

    def make_node(self, *xs: Any) -> Apply:
        xs = self._inputs(xs, "GpuAllReduce")
        shape = [None] * xs[0].type.ndim
        for d in range(len(shape)):
            vals = {x.type.shape[d] for x in xs}
            if len(vals) == 1:
                shape[d] = vals.pop()
        return Apply(
            self, xs, [self._out_type(xs[0], k, shape)() for k in range(self.n)]
        )

    def perform(self, node, inputs, outputs):
        labels = self.labels
        impl = resolve_impl(labels, self.impl)
        xs = [array.ascontiguous(x, d) for x, d in zip(inputs, labels, strict=True)]
        for k, x in enumerate(xs[1:], start=1):
            if tuple(x.shape) != tuple(xs[0].shape):
                raise ValueError(
                    f"GpuAllReduce: input {k} has shape {tuple(x.shape)}, input 0 "
                    f"{tuple(xs[0].shape)}"
                )
        if impl == "nccl":
            comms = _comms(labels)
            outs = [array.empty(xs[0].shape, xs[0].dtype, d) for d in labels]
            count = int(np.prod(xs[0].shape, dtype=np.int64))
            dt = _nccl_dtype(xs[0].dtype)
            with _Group():
                for k, d in enumerate(labels):
                    nccl.call(
                        "ncclAllReduce", _vp(xs[k]), _vp(outs[k]),
                        ctypes.c_size_t(count), dt, nccl.SUM, comms.comms[k],
                        _stream(d), comm=comms.comms[k],
                    )  # fmt: skip
        else:
            root = labels[0]
            total = array.copy(xs[0], root)
            for x, d in zip(xs[1:], labels[1:], strict=True):
                _accumulate(total, _move(x, d, root), root)
            outs = [total] + [_move(total, root, d) for d in labels[1:]]
        for k in range(self.n):
            outputs[k][0] = outs[k]


class GpuBroadcast(BroadcastBase, _GpuComm):
    """The root device's input copied to every device.

    One input, on ``labels[root]``; ``n`` outputs. Pullback: :class:`GpuReduce`.

    Notes
    -----
    ``stream="comm"`` is the scheme-(b) option: the copy is issued on a
    second stream of each device, ordered after the input's producer by an
    event, so it overlaps FC compute already queued on the main stream; the
    main stream waits on a second event before the output is used.
    """

    __props__ = ("labels", "root", "impl", "stream")

    def __init__(
        self,
        labels: Sequence[int],
        root: int = 0,
        impl: str = "auto",
        stream: str = "main",
    ):
        self.labels = _labels("GpuBroadcast", labels)
        if not 0 <= int(root) < len(self.labels):
            raise ValueError(f"GpuBroadcast: root must be in 0..{len(self.labels) - 1}")
        self.root = int(root)
        self.impl = _impl("GpuBroadcast", impl)
        if stream not in ("main", "comm"):
            raise ValueError(
                f"GpuBroadcast: stream must be 'main' or 'comm', got {stream!r}"
            )
        self.stream = stream

    def make_node(self, x: Any) -> Apply:
        x = as_gpu_variable(x, self.labels[self.root], op="GpuBroadcast", role="input")
        outs = [self._out_type(x, k, x.type.shape)() for k in range(self.n)]
        return Apply(self, [x], outs)

    def perform(self, node, inputs, outputs):
        labels, root = self.labels, self.root
        impl = resolve_impl(labels, self.impl)
        x = array.ascontiguous(inputs[0], labels[root])
        if impl == "nccl":
            comms = _comms(labels)
            outs = [array.empty(x.shape, x.dtype, d) for d in labels]
            count = int(np.prod(x.shape, dtype=np.int64))
            dt = _nccl_dtype(x.dtype)
            streams = [
                _comm_stream(d) if self.stream == "comm" else None for d in labels
            ]
            if self.stream == "comm":
                _wait_main(labels, streams)
            with _Group():
                for k, d in enumerate(labels):
                    s = (
                        _stream(d)
                        if streams[k] is None
                        else ctypes.c_void_p(int(streams[k].handle))
                    )
                    nccl.call(
                        "ncclBroadcast", _vp(x), _vp(outs[k]), ctypes.c_size_t(count),
                        dt, root, comms.comms[k], s, comm=comms.comms[k],
                    )  # fmt: skip
            if self.stream == "comm":
                _main_waits(labels, streams)
        else:
            outs = [
                array.copy(x, d) if d == labels[root] else _move(x, labels[root], d)
                for d in labels
            ]
        for k in range(self.n):
            outputs[k][0] = outs[k]


_COMM_STREAMS: dict = {}


def _comm_stream(label: int) -> Any:
    """The second (communication) stream of ``label``'s physical device."""
    dev = get_device(label)
    s = _COMM_STREAMS.get(dev.index)
    if s is None:
        dev.activate()
        s = _COMM_STREAMS[dev.index] = driver().Stream()
    return s


def _wait_main(labels, streams) -> None:
    """Comm streams wait for the work queued so far on the main streams."""
    for d, s in zip(labels, streams, strict=True):
        dev = get_device(d)
        dev.activate()
        ev = driver().Event()
        ev.record(dev.stream)
        s.wait_for_event(ev)


def _main_waits(labels, streams) -> None:
    """Main streams wait for the communication before using its outputs."""
    for d, s in zip(labels, streams, strict=True):
        dev = get_device(d)
        dev.activate()
        ev = driver().Event()
        ev.record(s)
        dev.stream.wait_for_event(ev)


class GpuReduce(ReduceBase, _GpuComm):
    """The sum of every device's input, on ``labels[root]`` (float32/float64).

    Pullback: :class:`GpuBroadcast` from root.
    """

    __props__ = ("labels", "root", "impl")

    def __init__(self, labels: Sequence[int], root: int = 0, impl: str = "auto"):
        self.labels = _labels("GpuReduce", labels)
        if not 0 <= int(root) < len(self.labels):
            raise ValueError(f"GpuReduce: root must be in 0..{len(self.labels) - 1}")
        self.root = int(root)
        self.impl = _impl("GpuReduce", impl)

    def device_of(self, node: Apply) -> int:
        return self.labels[self.root]

    thunk_device = device_of

    def make_node(self, *xs: Any) -> Apply:
        xs = self._inputs(xs, "GpuReduce")
        out = self._out_type(xs[0], self.root, [None] * xs[0].type.ndim)
        return Apply(self, xs, [out()])

    def perform(self, node, inputs, outputs):
        labels, root = self.labels, self.root
        impl = resolve_impl(labels, self.impl)
        xs = [array.ascontiguous(x, d) for x, d in zip(inputs, labels, strict=True)]
        rl = labels[root]
        if impl == "nccl":
            comms = _comms(labels)
            out = array.empty(xs[0].shape, xs[0].dtype, rl)
            count = int(np.prod(xs[0].shape, dtype=np.int64))
            dt = _nccl_dtype(xs[0].dtype)
            with _Group():
                for k, d in enumerate(labels):
                    recv = _vp(out) if k == root else ctypes.c_void_p(0)
                    nccl.call(
                        "ncclReduce", _vp(xs[k]), recv, ctypes.c_size_t(count), dt,
                        nccl.SUM, root, comms.comms[k], _stream(d), comm=comms.comms[k],
                    )  # fmt: skip
        else:
            out = array.copy(xs[root], rl)
            for k, (x, d) in enumerate(zip(xs, labels, strict=True)):
                if k != root:
                    _accumulate(out, _move(x, d, rl), rl)
        outputs[0][0] = out


GPU_COMM_OPS = (GpuAllGather, GpuReduceScatter, GpuAllReduce, GpuBroadcast, GpuReduce)


class GpuShard(ShardBase, _GpuFamily):
    """Piece ``index`` of ``n`` along ``axis`` of a GPU array (local, no exchange).

    The GPU :class:`~cc2ops.distributed.collectives.Shard`; pullback
    :class:`GpuShardGrad`.
    """

    __props__ = ("n", "index", "axis")

    def make_node(self, x: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuShard", role="x")
        s = list(x.type.shape)
        s[self.axis] = None
        return Apply(self, [x], [CudaArrayType(x.type.dtype, s, x.type.device)()])

    def perform(self, node, inputs, outputs):
        (x,) = inputs
        d = node.inputs[0].type.device
        start, stop = shard_bounds(int(x.shape[self.axis]), self.n)[self.index]
        front = _front(x, self.axis, d)
        outputs[0][0] = _back(array.copy(_rows(front, start, stop), d), self.axis, d)


class GpuShardGrad(ShardGradBase, _GpuFamily):
    """Zeros like ``x`` with piece ``index`` along ``axis`` set to ``g`` (GPU)."""

    __props__ = ("n", "index", "axis")

    def make_node(self, g: Any, x: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuShardGrad", role="x")
        g = as_gpu_variable(g, x.type.device, op="GpuShardGrad", role="g")
        return Apply(self, [g, x], [x.type()])

    def perform(self, node, inputs, outputs):
        g, x = inputs
        d = node.inputs[1].type.device
        start, stop = shard_bounds(int(x.shape[self.axis]), self.n)[self.index]
        if int(g.shape[self.axis]) != stop - start:
            raise ValueError(
                f"GpuShardGrad: piece {self.index} of {self.n} has {stop - start} "
                f"entries along axis {self.axis}, the cotangent {g.shape[self.axis]}"
            )
        gf = _front(g, self.axis, d)
        full = array.zeros((int(x.shape[self.axis]), *gf.shape[1:]), g.dtype, d)
        dst = _rows(full, start, stop)
        if gf.nbytes:
            dev = get_device(d)
            dev.activate()
            driver().memcpy_dtod_async(
                array.ptr(dst), array.ptr(gf), gf.nbytes, dev.stream
            )
        outputs[0][0] = _back(full, self.axis, d)


@register_lift(Shard)
def lift_shard(fgraph, node, device):
    """Shard(host_from_gpu(x)) -> host_from_gpu(GpuShard(x))"""
    op = node.op
    return [GpuShard(op.n, op.index, op.axis)(to_gpu(node.inputs[0], device))]


@register_lift(ShardGrad)
def lift_shard_grad(fgraph, node, device):
    """ShardGrad(g, x) next to GPU data -> GpuShardGrad(gpu(g), gpu(x))"""
    op = node.op
    g, x = (to_gpu(v, device) for v in node.inputs)
    return [GpuShardGrad(op.n, op.index, op.axis)(g, x)]


# --------------------------------------------------------------------------
# the backend for the multi-device rewriter
# --------------------------------------------------------------------------


class GpuBackend(CommBackend):
    """Collectives between GPUs for :func:`cc2ops.distributed.hybrid.distribute`.

    Device-to-device collectives are the GPU ops above (inputs moved to their
    labels with ``as_gpu``; outputs returned as ``host_from_gpu``, which the
    GPU mode's lifting removes again around lifted consumers). Root <-> device
    operations on host values (the batch ``Scatter``, the loss ``Reduce``, the
    root ``Gather``) are the host ops of :mod:`cc2ops.distributed.collectives`.

    Parameters
    ----------
    labels : sequence of int
    impl : {"auto", "nccl", "peer", "virtual"}
    bcast_stream : {"main", "comm"}
        Stream of the scheme-(b) broadcasts.
    """

    def __init__(
        self, labels: Sequence[int], impl: str = "auto", bcast_stream: str = "main"
    ) -> None:
        self.labels = _labels("GpuBackend", labels)
        self.impl = _impl("GpuBackend", impl)
        self.bcast_stream = bcast_stream
        self._host = VirtualBackend(self.labels)

    def _gpu(self, xs: Sequence[Variable]) -> list[Variable]:
        return [as_gpu(x, d) for x, d in zip(xs, self.labels, strict=True)]

    @staticmethod
    def _host_of(outs: Any) -> list[Variable]:
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        return [host_from_gpu(o) for o in outs]

    def all_gather(self, xs, axis):
        return self._host_of(GpuAllGather(self.labels, axis, self.impl)(*self._gpu(xs)))

    def reduce_scatter(self, xs, axis):
        return self._host_of(
            GpuReduceScatter(self.labels, axis, self.impl)(*self._gpu(xs))
        )

    def all_reduce(self, xs):
        return self._host_of(GpuAllReduce(self.labels, self.impl)(*self._gpu(xs)))

    def broadcast(self, x, root=0):
        op = GpuBroadcast(self.labels, root, self.impl, self.bcast_stream)
        return self._host_of(op(as_gpu(x, self.labels[root])))

    def reduce(self, xs, root=0):
        return self._host.reduce([_host(x) for x in xs], root)

    def scatter(self, x, axis):
        return self._host.scatter(_host(x), axis)

    def gather(self, xs, axis):
        return self._host.gather([_host(x) for x in xs], axis)

    def new_state(self, var, placement):
        value = np.asarray(var.get_value())
        name = var.name or "shared"
        # the parts keep the original's static shape (pieces: their extent along
        # the axis), so they pass where the distribution nodes' outputs went
        static = tuple(getattr(var.type, "shape", (None,) * value.ndim))
        if placement.kind == "replicated":
            first = (
                var
                if isinstance(var, CudaSharedVariable)
                and var.type.device == self.labels[0]
                else shared(
                    value, device=self.labels[0], name=f"{name}@0", shape=static
                )
            )
            return [first] + [
                shared(value.copy(), device=d, name=f"{name}@{k}", shape=static)
                for k, d in enumerate(self.labels[1:], start=1)
            ]
        parts = []
        axis = placement.axis
        bounds = shard_bounds(value.shape[axis], self.n)
        for k, ((start, stop), d) in enumerate(zip(bounds, self.labels, strict=True)):
            index = [slice(None)] * value.ndim
            index[axis] = slice(start, stop)
            shape = list(static)
            if shape[axis] is not None:
                shape[axis] = stop - start
            parts.append(
                shared(
                    np.array(value[tuple(index)], copy=True),
                    device=d,
                    name=f"{name}@{k}",
                    shape=tuple(shape),
                )
            )
        return parts

    def state_view(self, part, out):
        if isinstance(out.type, CudaArrayType):
            if part.type == out.type:
                return part
            return out.type.filter_variable(part, allow_convert=True)
        view = host_from_gpu(part)
        return view if view.type == out.type else out.type.filter_variable(view)

    def root_view(self, parts, placement, like=None):
        hosts = [host_from_gpu(p) for p in parts]
        view = (
            hosts[0]
            if placement.kind == "replicated"
            else self.gather(hosts, placement.axis)
        )
        if like is None or view.type == like.type:
            return view
        if isinstance(like.type, CudaArrayType):
            # a GPU shared variable's stand-in: the gathered value on its device
            if tuple(view.type.shape) != tuple(like.type.shape):
                view = pt.specify_shape(view, like.type.shape)
            view = as_gpu(view, like.type.device)
        return like.type.filter_variable(view, allow_convert=True)

    def __repr__(self) -> str:
        return f"GpuBackend(labels={self.labels}, impl={self.impl!r})"


def _host(x: Variable) -> Variable:
    return as_host(x)


_BACKEND_NAMES = {
    "nccl": "nccl",
    "peer": "peer",
    "gpu_virtual": "virtual",
    "gpu": "auto",
}


def gpu_backend(labels: Sequence[int], name: str = "gpu") -> GpuBackend:
    """The GPU backend called ``name`` ("gpu"/auto, "nccl", "peer", "gpu_virtual")."""
    return seam.comm_backend(labels, name)


# keep the host root ops importable from here for the structure tests
HOST_ROOT_OPS = (Reduce, Scatter, Gather)

#: The GPU op of each kind (the skeleton's ``_op`` hook).
_GPU_OPS = {
    "all_gather": GpuAllGather,
    "reduce_scatter": GpuReduceScatter,
    "all_reduce": GpuAllReduce,
    "broadcast": GpuBroadcast,
    "reduce": GpuReduce,
    "shard": GpuShard,
    "shard_grad": GpuShardGrad,
}

seam.register(
    seam.DeviceBackend(
        name="cc2ops.cuda",
        to_host=HostFromGpu,
        from_host=GpuFromHost,
        device_to_device=GpuToGpu,
        as_host=as_host,
        as_device=as_gpu,
        is_device_type=lambda t: isinstance(t, CudaArrayType),
        comm_backend=GpuBackend,
        backend_names=_BACKEND_NAMES,
        spmd_communicator=NcclCommunicator,
    )
)
