"""Structural GPU ops: views, reshapes, slicing, allocation, joins, shapes, checks.

These are the array-shuffling ops PyTensor's ``fast_run`` leaves in a
training graph around the compute ops. Each is PyTensor's host op of the
same name (``Gpu`` prefix) on :class:`~cc2ops.cuda.type.CudaArrayType`
values, with a ``@register_lift`` rule:

============================  =================================================
host op                       GPU op (run time)
============================  =================================================
``DimShuffle``                :class:`GpuDimShuffle`: a strided view
``Reshape``                   :class:`GpuReshape`: a view when the strides
                              allow, else a copy (:func:`contiguous`)
``SpecifyShape``              :class:`GpuSpecifyShape`: checks, returns x
``Subtensor`` (basic)         :class:`GpuSubtensor`: a strided view
``IncSubtensor`` (basic)      :class:`GpuIncSubtensor`: set/inc kernel, in place
                              after :data:`gpu_inplace_incsubtensor`
``Alloc``                     :class:`GpuAlloc`: fill or broadcast copy
``AllocEmpty``                :class:`GpuAllocEmpty`
``Join``                      :class:`GpuJoin`: one set kernel per input
``Split``                     :class:`GpuSplit`: views
``CheckAndRaise``/``Assert``  :class:`GpuCheckAndRaise`: checks, returns x
``Shape``/``Shape_i``         :class:`GpuShape`/:class:`GpuShape_i`: host ints
============================  =================================================

Shapes of GPU values stay host integers: ``Shape(host_from_gpu(x)) ->
GpuShape(x)`` (rule :func:`local_gpu_shape`) reads the GPUArray's shape
without copying the array; integer scalar and vector inputs of these ops
(shapes, indices, split sizes) stay on the host.

Views carry ``view_map`` so PyTensor's destroy handler knows they alias
their input; a view's GPUArray keeps its parent alive through ``base``.

Gradients are built with the host op's own ``pullback`` on
``host_from_gpu`` versions of the inputs; the lifting rewrites move the
resulting graph back to the GPU, so every rule is written once.

Notes
-----
Advanced (integer-array) indexing is not lifted. Complex dtypes are viewed
and reshaped but not set/incremented, joined or allocated from a value.
"""

from __future__ import annotations

import inspect
from math import prod
from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.null_type import NullType
from pytensor.graph.rewriting.basic import (
    WalkingGraphRewriter,
    copy_stack_trace,
    node_rewriter,
)
from pytensor.raise_op import CheckAndRaise
from pytensor.tensor.basic import Alloc, AllocEmpty, Join, Split
from pytensor.tensor.elemwise import DimShuffle
from pytensor.tensor.shape import Reshape, Shape, Shape_i, SpecifyShape
from pytensor.tensor.subtensor import (
    IncSubtensor,
    Subtensor,
    unflatten_index_variables,
)
from pytensor.tensor.type import TensorType, integer_dtypes
from pytensor.tensor.variable import TensorConstant

from cc2ops.cuda.op import GpuOp, as_gpu_variable, common_device
from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.compile import (
    get_kernel,
    launch,
    register_namer,
    register_variants,
)
from cc2ops.cuda.runtime.device import get_device
from cc2ops.cuda.transfer import GpuFromHost, HostFromGpu, as_gpu, as_host
from cc2ops.cuda.type import CudaArrayConstant, CudaArrayType
from cc2ops.rewriting.db import gpu_inplace_db, gpu_lift_db

__all__ = [
    "make_view",
    "broadcast_view",
    "dimshuffle_view",
    "reshape_strides",
    "subtensor_view",
    "contiguous",
    "strided_assign",
    "gpu_constant_or_transfer",
    "GpuDimShuffle",
    "GpuReshape",
    "GpuSpecifyShape",
    "GpuSubtensor",
    "GpuIncSubtensor",
    "GpuAlloc",
    "GpuAllocEmpty",
    "GpuJoin",
    "GpuSplit",
    "GpuCheckAndRaise",
    "GpuShape",
    "GpuShape_i",
    "local_gpu_shape",
    "gpu_inplace_incsubtensor",
    "local_gpu_from_host_constant",
]

#: Dims the strided assignment kernel handles after merging.
ASSIGN_MAX_DIMS = 8
#: Batch dims (besides the two transposed ones) the transpose kernel handles.
TRANSPOSE_MAX_BATCH = 6
_BLOCK = 256
_TILE = 32
_TILE_ROWS = 8

_CTYPES = {
    "bool": "bool",
    "int8": "signed char",
    "uint8": "unsigned char",
    "int16": "short",
    "uint16": "unsigned short",
    "int32": "int",
    "uint32": "unsigned int",
    "int64": "long long",
    "uint64": "unsigned long long",
    "float32": "float",
    "float64": "double",
}
_SHORT = {
    "bool": "b", "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16",
    "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64",
    "float32": "f32", "float64": "f64",
}  # fmt: skip


# --------------------------------------------------------------------------
# kernels: names and variants
# --------------------------------------------------------------------------


@register_namer("subtensor")
def _assign_name(op: str, ctype: str, maxdim: int, **_: Any) -> str:
    short = {v: _SHORT[k] for k, v in _CTYPES.items()}[ctype]
    return f"strided_{op}_{short}_d{maxdim}"


@register_namer("transpose")
def _transpose_name(unit: int, maxbatch: int, **_: Any) -> str:
    return f"transpose_tiled_u{unit}_b{maxbatch}"


def _assign_consts(op: str, dtype: str) -> dict[str, Any]:
    ctype = _CTYPES[dtype]
    return {
        "name": _assign_name(op, ctype, ASSIGN_MAX_DIMS),
        "op": op,
        "ctype": ctype,
        "maxdim": ASSIGN_MAX_DIMS,
    }


def _transpose_consts(unit: int) -> dict[str, Any]:
    return {
        "name": _transpose_name(unit, TRANSPOSE_MAX_BATCH),
        "unit": unit,
        "maxbatch": TRANSPOSE_MAX_BATCH,
    }


@register_variants("subtensor")
def _assign_variants() -> list[dict[str, Any]]:
    pairs = [
        ("set", "float32"),
        ("inc", "float32"),
        ("set", "float64"),
        ("inc", "float64"),
        ("set", "bool"),
        ("inc", "int64"),
    ]
    return [_assign_consts(op, dt) for op, dt in pairs]


@register_variants("transpose")
def _transpose_variants() -> list[dict[str, Any]]:
    return [_transpose_consts(u) for u in (1, 2, 4, 8)]


# --------------------------------------------------------------------------
# run-time helpers on GPUArrays
# --------------------------------------------------------------------------


def make_view(
    x: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0
) -> Any:
    """A GPUArray viewing ``x``'s memory with ``shape``, byte ``strides``, ``offset``.

    The view keeps ``x`` alive (``base``); nothing is copied or checked
    against ``x``'s extent, so callers derive shapes and strides from ``x``.
    """
    from pycuda.gpuarray import GPUArray

    shape = tuple(int(s) for s in shape)
    strides = tuple(int(s) for s in strides)
    if x.gpudata is None:
        # x is empty and owns no memory, and so is every view of it (pycuda
        # accepts no base without data)
        if prod(shape):
            raise ValueError(f"make_view: a {shape} view of an empty array")
        return GPUArray(shape, x.dtype, allocator=x.allocator, strides=strides)
    gpudata = int(x.gpudata) + (int(offset) if prod(shape) else 0)
    return GPUArray(
        shape,
        x.dtype,
        allocator=x.allocator,
        base=x,
        gpudata=gpudata,
        strides=strides,
    )


def broadcast_view(x: Any, shape: tuple[int, ...]) -> Any:
    """``x`` broadcast to ``shape`` by numpy's rules (stride 0), as a view."""
    shape = tuple(int(s) for s in shape)
    xs, st = tuple(x.shape), tuple(x.strides)
    if len(xs) > len(shape):
        raise ValueError(f"broadcast_view: cannot broadcast shape {xs} to {shape}")
    lead = len(shape) - len(xs)
    strides = [0] * lead
    for n, s, want in zip(xs, st, shape[lead:], strict=True):
        if n == want:
            strides.append(s)
        elif n == 1:
            strides.append(0)
        else:
            raise ValueError(f"broadcast_view: cannot broadcast shape {xs} to {shape}")
    if tuple(xs) == shape:
        return x
    return make_view(x, shape, tuple(strides))


def dimshuffle_view(x: Any, new_order: tuple[Any, ...]) -> Any:
    """The view of ``x`` that ``DimShuffle(new_order)`` describes.

    ``"x"`` inserts an axis of extent 1; dropped axes must have extent 1.
    """
    kept = {o for o in new_order if o != "x"}
    for axis, n in enumerate(x.shape):
        if axis not in kept and n != 1:
            raise ValueError(
                f"GpuDimShuffle: cannot drop axis {axis} of extent {n} (shape "
                f"{tuple(x.shape)}, order {tuple(new_order)})"
            )
    shape, strides = [], []
    for o in new_order:
        if o == "x":
            shape.append(1)
            strides.append(0)
        else:
            shape.append(int(x.shape[o]))
            strides.append(int(x.strides[o]))
    return make_view(x, tuple(shape), tuple(strides))


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(out))


def reshape_strides(
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    new_shape: tuple[int, ...],
    itemsize: int,
) -> tuple[int, ...] | None:
    """Byte strides that view ``(shape, strides)`` as ``new_shape``, or ``None``.

    numpy's no-copy reshape rule (C order): groups of old axes that map onto
    groups of new axes must be contiguous among themselves.
    """
    if prod(shape) != prod(new_shape):
        raise ValueError(f"reshape_strides: cannot view {shape} as {new_shape}")
    if prod(new_shape) == 0:
        return _c_strides(new_shape, itemsize)
    old = [(int(n), int(s)) for n, s in zip(shape, strides, strict=True) if n != 1]
    od = [n for n, _ in old]
    os_ = [s for _, s in old]
    nd = [int(n) for n in new_shape]
    ns = [0] * len(nd)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(nd) and oi < len(od):
        np_, op_ = nd[ni], od[oi]
        while np_ != op_:
            if np_ < op_:
                np_ *= nd[nj]
                nj += 1
            else:
                op_ *= od[oj]
                oj += 1
        for ok in range(oi, oj - 1):
            if os_[ok] != od[ok + 1] * os_[ok + 1]:
                return None
        ns[nj - 1] = os_[oj - 1]
        for nk in range(nj - 1, ni, -1):
            ns[nk - 1] = ns[nk] * nd[nk]
        ni, nj = nj, nj + 1
        oi, oj = oj, oj + 1
    last = ns[ni - 1] if ni >= 1 else itemsize
    for nk in range(ni, len(nd)):
        ns[nk] = last
    return tuple(ns)


def _normalise_index(i: Any, n: int, axis: int) -> int:
    i = int(i)
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        raise IndexError(
            f"GpuSubtensor: index {i} is out of bounds for axis {axis} with size {n}"
        )
    return j


def subtensor_view(x: Any, indices: tuple[Any, ...]) -> Any:
    """The view ``x[indices]`` for ints and slices (numpy's basic indexing)."""
    if len(indices) > len(x.shape):
        raise IndexError(
            f"GpuSubtensor: {len(indices)} indices for an array of {len(x.shape)} dims"
        )
    offset = 0
    shape, strides = [], []
    for axis, (n, s) in enumerate(zip(x.shape, x.strides, strict=True)):
        n, s = int(n), int(s)
        idx = indices[axis] if axis < len(indices) else slice(None)
        if isinstance(idx, slice):
            start, stop, step = slice(
                None if idx.start is None else int(idx.start),
                None if idx.stop is None else int(idx.stop),
                None if idx.step is None else int(idx.step),
            ).indices(n)
            length = len(range(start, stop, step))
            if length:
                offset += start * s
            shape.append(length)
            strides.append(s * step)
        else:
            offset += _normalise_index(idx, n, axis) * s
    return make_view(x, tuple(shape), tuple(strides), offset)


def _transpose_plan(x: Any) -> dict[str, Any] | None:
    """Geometry for the tiled transpose kernel, or ``None`` (use the copy kernel)."""
    itemsize = np.dtype(x.dtype).itemsize
    if itemsize not in (1, 2, 4, 8) or array.ptr(x) % itemsize:
        return None
    dims = [(int(n), int(s)) for n, s in zip(x.shape, x.strides, strict=True) if n != 1]
    if len(dims) < 2 or any(s % itemsize for _, s in dims):
        return None
    ins = [s // itemsize for _, s in dims]
    ext = [n for n, _ in dims]
    outs = [st // itemsize for st in _c_strides(tuple(ext), itemsize)]
    if ins[-1] == 1:
        return None  # rows already contiguous: the copy kernel is coalesced
    unit_axes = [k for k, s in enumerate(ins) if s == 1]
    if not unit_axes:
        return None
    j = unit_axes[-1]
    batch = [k for k in range(len(ext) - 1) if k != j]
    if len(batch) > TRANSPOSE_MAX_BATCH:
        return None
    nl, nj = ext[-1], ext[j]
    if (nj + _TILE - 1) // _TILE > 65535:
        return None
    return {
        "unit": itemsize,
        "nl": nl,
        "in_sl": ins[-1],
        "nj": nj,
        "out_sj": outs[j],
        "batch": [(ext[k], ins[k], outs[k]) for k in batch],
    }


def _launch_transpose(x: Any, out: Any, plan: dict[str, Any], device: int) -> None:
    consts = _transpose_consts(plan["unit"])
    fn = get_kernel("transpose", device, **consts)
    batch = plan["batch"]
    nbatch = prod(b for b, _, _ in batch) if batch else 1
    geometry: list[Any] = []
    pad = TRANSPOSE_MAX_BATCH - len(batch)
    for b, ib, ob in list(batch) + [(1, 0, 0)] * pad:
        geometry += [np.int64(b), np.int64(ib), np.int64(ob)]
    grid = (
        (plan["nl"] + _TILE - 1) // _TILE,
        (plan["nj"] + _TILE - 1) // _TILE,
        min(nbatch, 65535),
    )
    launch(
        fn, grid, (_TILE, _TILE_ROWS),
        [x, out, np.int64(plan["nl"]), np.int64(plan["in_sl"]),
         np.int64(plan["nj"]), np.int64(plan["out_sj"]), np.int64(nbatch),
         np.int32(len(batch)), *geometry],
        device,
    )  # fmt: skip


def contiguous(x: Any, device: int) -> Any:
    """``x`` if C-contiguous, else a C-contiguous copy on ``device``.

    Transposes (the output's innermost axis is strided in ``x`` while another
    axis has unit stride) use the tiled shared-memory kernel
    (``kernels/transpose.cu``, coalesced reads and writes); other layouts use
    :func:`cc2ops.cuda.runtime.array.ascontiguous`.
    """
    if array.is_c_contiguous(x):
        return x
    plan = _transpose_plan(x)
    if plan is None:
        return array.ascontiguous(x, device)
    out = array.empty(x.shape, x.dtype, device)
    _launch_transpose(x, out, plan, device)
    return out


def _merge_pair(
    shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]
) -> list[tuple[int, int, int]]:
    """Merge dims of two strided operands of one shape (element strides)."""
    dims = [
        (int(n), int(sa), int(sb))
        for n, sa, sb in zip(shape, a, b, strict=True)
        if n != 1
    ]
    merged: list[tuple[int, int, int]] = []
    for n, sa, sb in dims:
        if merged:
            n0, sa0, sb0 = merged[-1]
            if sa0 == sa * n and sb0 == sb * n:
                merged[-1] = (n0 * n, sa, sb)
                continue
        merged.append((n, sa, sb))
    return merged


def strided_assign(dst: Any, src: Any, device: int, *, inc: bool = False) -> None:
    """``dst[...] = src`` (or ``+=`` with ``inc``) for strided GPUArrays.

    ``src`` broadcasts to ``dst``'s shape by numpy's rules. ``dst`` must not
    overlap itself (no zero strides on extents > 1).
    """
    dt = str(np.dtype(dst.dtype))
    if str(np.dtype(src.dtype)) != dt:
        raise TypeError(f"strided_assign: dtypes differ: {dst.dtype} and {src.dtype}")
    if dt not in _CTYPES:
        raise TypeError(f"strided_assign: dtype {dt} is not supported")
    if inc and dt == "bool":
        raise TypeError("strided_assign: cannot increment a bool array")
    shape = tuple(int(s) for s in dst.shape)
    if not prod(shape):
        return
    src = broadcast_view(src, shape)
    itemsize = np.dtype(dt).itemsize
    for n, s in zip(shape, dst.strides, strict=True):
        if n > 1 and s == 0:
            raise ValueError("strided_assign: the destination overlaps itself")
    merged = _merge_pair(
        shape,
        tuple(int(s) // itemsize for s in dst.strides),
        tuple(int(s) // itemsize for s in src.strides),
    )
    if len(merged) > ASSIGN_MAX_DIMS:
        raise ValueError(
            f"strided_assign: {len(merged)} dims after merging; the kernel handles "
            f"{ASSIGN_MAX_DIMS}"
        )
    if not merged:
        merged = [(1, 0, 0)]
    n = prod(m for m, _, _ in merged)
    consts = _assign_consts("inc" if inc else "set", dt)
    fn = get_kernel("subtensor", device, **consts)
    geometry: list[Any] = []
    pad = ASSIGN_MAX_DIMS - len(merged)
    for e, sd, ss in merged + [(1, 0, 0)] * pad:
        geometry += [np.int64(e), np.int64(sd), np.int64(ss)]
    dev = get_device(device)
    grid = min((n + _BLOCK - 1) // _BLOCK, dev.multiprocessors * 32)
    launch(
        fn, grid, _BLOCK,
        [dst, src, np.int64(n), np.int32(len(merged)), *geometry],
        device,
    )  # fmt: skip


# --------------------------------------------------------------------------
# graph helpers
# --------------------------------------------------------------------------


def _host_like(var: Variable) -> Variable:
    """A host variable with ``var``'s dtype and static shape (for type inference)."""
    if isinstance(var.type, CudaArrayType):
        return TensorType(var.type.dtype, var.type.shape)()
    return var


def _is_gpu(var: Any) -> bool:
    return isinstance(getattr(var, "type", None), CudaArrayType)


def _gpu_out(host_out: Variable, device: int) -> Variable:
    return CudaArrayType(host_out.type.dtype, host_out.type.shape, device)()


def gpu_constant_or_transfer(var: Variable, device: int) -> Variable:
    """``var`` on ``device``; a tensor constant becomes a GPU constant (no transfer)."""
    if isinstance(var, TensorConstant):
        return CudaArrayConstant(
            CudaArrayType(var.type.dtype, var.type.shape, device), var.data
        )
    return to_gpu(var, device)


def _skip(g: Any) -> bool:
    return isinstance(getattr(g, "type", None), (DisconnectedType, NullType))


def _host_pullback(
    host_op: Any, inputs: list[Variable], cotangents: list[Variable]
) -> list[Variable]:
    """Gradients by the host op's own rule; GPU inputs get GPU gradients."""
    h_inputs = [as_host(x) if _is_gpu(x) else x for x in inputs]
    h_outputs = host_op.make_node(*h_inputs).outputs
    h_cot = [g if _skip(g) or not _is_gpu(g) else as_host(g) for g in cotangents]
    grads = host_op.pullback(h_inputs, h_outputs, h_cot)
    out = []
    for x, g in zip(inputs, grads, strict=True):
        if _is_gpu(x) and not _skip(g):
            if g.type.dtype != x.type.dtype:
                g = pt.cast(g, x.type.dtype)
            g = as_gpu(g, x.type.device)
        out.append(g)
    return out


def _host_infer_shape(op: Any, node: Apply, input_shapes: list[Any]) -> list[Any]:
    """``op.infer_shape`` on a host node (PyTensor 3.0 passes an fgraph first)."""
    params = inspect.signature(op.infer_shape).parameters
    if len(params) >= 3:
        return op.infer_shape(None, node, input_shapes)
    return op.infer_shape(node, input_shapes)


class _HostDelegate(GpuOp):
    """A GPU op that shares type inference and gradients with a host op."""

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    def host_op(self) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} must define host_op() (the host op it mirrors)"
        )

    def _host_node(self, inputs: list[Variable]) -> Apply:
        return self.host_op().make_node(*[_host_like(x) for x in inputs])

    def pullback(self, inputs, outputs, cotangents):
        return _host_pullback(self.host_op(), list(inputs), list(cotangents))

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        host = self._host_node(list(node.inputs))
        fn = getattr(self.host_op(), "connection_pattern", None)
        if fn is None:
            return [[True] * len(node.outputs) for _ in node.inputs]
        return fn(host)

    def _infer_shape(self, node, input_shapes):
        host = self._host_node(list(node.inputs))
        return _host_infer_shape(self.host_op(), host, input_shapes)


# --------------------------------------------------------------------------
# views
# --------------------------------------------------------------------------


class GpuDimShuffle(_HostDelegate):
    """``DimShuffle(input_ndim, new_order)`` on a GPU array: a strided view.

    Parameters
    ----------
    input_ndim : int
    new_order : sequence of int or "x"
        As for PyTensor's ``DimShuffle``: input axes in their new order,
        ``"x"`` for a new axis of extent 1; omitted axes must have extent 1.

    Notes
    -----
    Never copies: a transpose is a view with permuted strides. Consumers that
    need C order call :func:`contiguous` (tiled transpose kernel); cuBLAS
    products take transposed views directly (:mod:`cc2ops.cuda.ops.tensor.blas`).
    """

    __props__ = ("input_ndim", "new_order")
    view_map = {0: [0]}

    def __init__(self, *, input_ndim: int, new_order: Any) -> None:
        self.input_ndim = int(input_ndim)
        self.new_order = tuple(new_order)

    def host_op(self) -> DimShuffle:
        return DimShuffle(input_ndim=self.input_ndim, new_order=self.new_order)

    @property
    def is_transpose(self) -> bool:
        """Whether this is the 2-D transpose ``(1, 0)``."""
        return self.input_ndim == 2 and self.new_order == (1, 0)

    def make_node(self, x: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuDimShuffle", role="x")
        if x.type.ndim != self.input_ndim:
            raise TypeError(
                f"GpuDimShuffle: x must have input_ndim={self.input_ndim} dims, got "
                f"{x.type.ndim}"
            )
        try:
            host = self._host_node([x])
        except (TypeError, ValueError) as e:
            raise ValueError(f"GpuDimShuffle: {e}") from e
        return Apply(self, [x], [_gpu_out(host.outputs[0], x.type.device)])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = dimshuffle_view(inputs[0], self.new_order)

    def __str__(self) -> str:
        if self.is_transpose:
            return "GpuDimShuffle{T}"
        return f"GpuDimShuffle{{{','.join(str(o) for o in self.new_order)}}}"


class GpuReshape(_HostDelegate):
    """``Reshape(ndim)(x, shape)`` on a GPU array: a view when possible.

    Parameters
    ----------
    ndim : int
        Number of dims of the result.

    Notes
    -----
    ``shape`` is a host integer vector (one ``-1`` allowed). The result is a
    view of ``x`` when numpy would return one (C order), otherwise a
    C-contiguous copy made by :func:`contiguous`.
    """

    __props__ = ("ndim",)
    view_map = {0: [0]}

    def __init__(self, ndim: int) -> None:
        self.ndim = int(ndim)

    def host_op(self) -> Reshape:
        return Reshape(self.ndim)

    def make_node(self, x: Any, shape: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuReshape", role="x")
        shape = pt.as_tensor_variable(shape)
        if shape.type.ndim != 1 or shape.type.dtype not in integer_dtypes:
            raise TypeError(
                f"GpuReshape: shape must be an integer vector, got {shape.type}"
            )
        try:
            host = Reshape(self.ndim).make_node(_host_like(x), shape)
        except (TypeError, ValueError) as e:
            raise ValueError(f"GpuReshape: {e}") from e
        return Apply(self, [x, shape], [_gpu_out(host.outputs[0], x.type.device)])

    def perform(self, node, inputs, outputs):
        x, shape = inputs
        new = [int(s) for s in shape]
        if len(new) != self.ndim:
            raise ValueError(
                f"GpuReshape: shape has {len(new)} entries, expected ndim={self.ndim}"
            )
        size = prod(int(s) for s in x.shape)
        if new.count(-1) > 1 or any(s < -1 for s in new):
            raise ValueError(f"GpuReshape: invalid shape {tuple(new)}")
        if -1 in new:
            known = prod(s for s in new if s != -1)
            if known == 0 or size % known:
                raise ValueError(
                    f"GpuReshape: cannot reshape an array of size {size} into "
                    f"{tuple(new)}"
                )
            new[new.index(-1)] = size // known
        new_shape = tuple(new)
        if prod(new_shape) != size:
            raise ValueError(
                f"GpuReshape: cannot reshape an array of shape {tuple(x.shape)} into "
                f"{new_shape}"
            )
        itemsize = np.dtype(x.dtype).itemsize
        strides = reshape_strides(tuple(x.shape), tuple(x.strides), new_shape, itemsize)
        if strides is None:
            x = contiguous(x, self.device_of(node))
            strides = _c_strides(new_shape, itemsize)
        outputs[0][0] = make_view(x, new_shape, strides)


class GpuSpecifyShape(_HostDelegate):
    """``SpecifyShape(x, *shape)`` on a GPU array: checks the shape, returns ``x``.

    Notes
    -----
    ``shape`` entries are host integer scalars or ``None`` (unchecked).
    """

    __props__ = ()
    view_map = {0: [0]}

    def host_op(self) -> SpecifyShape:
        return SpecifyShape()

    def make_node(self, x: Any, *shape: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuSpecifyShape", role="x")
        try:
            host = SpecifyShape().make_node(_host_like(x), *shape)
        except (TypeError, ValueError) as e:
            raise type(e)(f"GpuSpecifyShape: {e}") from e
        return Apply(
            self,
            [x, *host.inputs[1:]],
            [_gpu_out(host.outputs[0], x.type.device)],
        )

    def perform(self, node, inputs, outputs):
        x, *shape = inputs
        got = tuple(int(s) for s in x.shape)
        if len(got) != len(shape) or any(
            s is not None and int(s) != g for g, s in zip(got, shape, strict=False)
        ):
            want = tuple(None if s is None else int(s) for s in shape)
            raise AssertionError(f"GpuSpecifyShape: got shape {got}, expected {want}")
        outputs[0][0] = x


def _hashable(idx_list: tuple[Any, ...]) -> tuple[Any, ...]:
    """``idx_list`` with slices as tuples (slices are unhashable before 3.12)."""
    return tuple(
        ("slice", e.start, e.stop, e.step) if isinstance(e, slice) else e
        for e in idx_list
    )


class GpuSubtensor(_HostDelegate):
    """Basic indexing ``x[ints and slices]`` on a GPU array: a strided view.

    Parameters
    ----------
    idx_list : tuple
        PyTensor's ``Subtensor.idx_list`` (positions of the index inputs).

    Notes
    -----
    Index inputs are host integer scalars. Negative steps give negative
    strides (kernels and cuBLAS wrappers copy such views when needed).
    """

    __props__ = ("idx_list",)
    view_map = {0: [0]}

    def __init__(self, idx_list: Any) -> None:
        self.idx_list = tuple(idx_list)

    def __hash__(self) -> int:
        return hash((type(self), _hashable(self.idx_list)))

    def host_op(self) -> Subtensor:
        return Subtensor(self.idx_list)

    def make_node(self, x: Any, *index: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuSubtensor", role="x")
        try:
            host = Subtensor(self.idx_list).make_node(_host_like(x), *index)
        except (TypeError, ValueError, IndexError) as e:
            raise ValueError(f"GpuSubtensor: {e}") from e
        return Apply(
            self,
            [x, *host.inputs[1:]],
            [_gpu_out(host.outputs[0], x.type.device)],
        )

    def perform(self, node, inputs, outputs):
        x, *index = inputs
        indices = unflatten_index_variables(index, self.idx_list)
        outputs[0][0] = subtensor_view(x, tuple(indices))


class GpuIncSubtensor(_HostDelegate):
    """``x[idx] = y`` or ``x[idx] += y`` (basic indexing) on GPU arrays.

    Parameters
    ----------
    idx_list : tuple
        As PyTensor's ``IncSubtensor``.
    inplace : bool
        Write into ``x``'s buffer (``destroy_map``); set by the in-place
        rewrite :data:`gpu_inplace_incsubtensor`.
    set_instead_of_inc : bool
        Assign instead of adding.

    Notes
    -----
    ``y`` broadcasts to ``x[idx]`` by numpy's rules. Not in place, ``x`` is
    copied first (C-contiguous). bool arrays can be set, not incremented.
    """

    __props__ = ("idx_list", "inplace", "set_instead_of_inc")

    def __init__(
        self, idx_list: Any, inplace: bool = False, set_instead_of_inc: bool = False
    ) -> None:
        self.idx_list = tuple(idx_list)
        self.inplace = bool(inplace)
        self.set_instead_of_inc = bool(set_instead_of_inc)
        self.destroy_map = {0: [0]} if self.inplace else {}

    def __hash__(self) -> int:
        return hash(
            (
                type(self),
                _hashable(self.idx_list),
                self.inplace,
                self.set_instead_of_inc,
            )
        )

    def host_op(self) -> IncSubtensor:
        return IncSubtensor(self.idx_list, set_instead_of_inc=self.set_instead_of_inc)

    def make_node(self, x: Any, y: Any, *index: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuIncSubtensor", role="x")
        y = as_gpu_variable(y, op="GpuIncSubtensor", role="y")
        device = common_device("GpuIncSubtensor", x, y)
        if x.type.dtype != y.type.dtype:
            raise TypeError(
                f"GpuIncSubtensor: x and y must share a dtype, got {x.type.dtype} and "
                f"{y.type.dtype}"
            )
        if x.type.dtype not in _CTYPES:
            raise TypeError(f"GpuIncSubtensor: dtype {x.type.dtype} is not supported")
        if x.type.dtype == "bool" and not self.set_instead_of_inc:
            raise TypeError("GpuIncSubtensor: bool arrays can be set, not incremented")
        try:
            host = self.host_op().make_node(_host_like(x), _host_like(y), *index)
        except (TypeError, ValueError, IndexError) as e:
            raise ValueError(f"GpuIncSubtensor: {e}") from e
        return Apply(
            self,
            [x, y, *host.inputs[2:]],
            [_gpu_out(host.outputs[0], device)],
        )

    def perform(self, node, inputs, outputs):
        x, y, *index = inputs
        device = self.device_of(node)
        out = x if self.inplace else array.copy(x, device)
        view = subtensor_view(
            out, tuple(unflatten_index_variables(index, self.idx_list))
        )
        strided_assign(view, y, device, inc=not self.set_instead_of_inc)
        outputs[0][0] = out

    def __str__(self) -> str:
        kind = "Set" if self.set_instead_of_inc else "Inc"
        return f"Gpu{kind}Subtensor{{{'inplace' if self.inplace else ''}}}"


# --------------------------------------------------------------------------
# allocation, joins, splits
# --------------------------------------------------------------------------


class GpuAlloc(_HostDelegate):
    """``Alloc(value, *shape)``: a new C-contiguous array of ``value`` broadcast.

    Notes
    -----
    ``value`` is a GPU array (a GPU constant of one element is written with
    the fill kernel without being read); ``shape`` entries are host integer
    scalars. Static extents of 1 in ``value`` broadcast; others must match.
    """

    __props__ = ()

    def host_op(self) -> Alloc:
        return Alloc()

    def make_node(self, value: Any, *shape: Any) -> Apply:
        value = as_gpu_variable(value, op="GpuAlloc", role="value")
        try:
            host = Alloc().make_node(_host_like(value), *shape)
        except (TypeError, ValueError) as e:
            raise ValueError(f"GpuAlloc: {e}") from e
        return Apply(
            self,
            [value, *host.inputs[1:]],
            [_gpu_out(host.outputs[0], value.type.device)],
        )

    def perform(self, node, inputs, outputs):
        value, *shape = inputs
        device = self.device_of(node)
        shape = tuple(int(s) for s in shape)
        dtype = node.outputs[0].type.dtype
        const = node.inputs[0]
        if isinstance(const, CudaArrayConstant) and const.data.size == 1:
            outputs[0][0] = array.full(shape, const.data.item(), dtype, device)
            return
        vshape = tuple(int(s) for s in value.shape)
        static = node.inputs[0].type.shape
        lead = len(shape) - len(vshape)
        for k, (n, want) in enumerate(zip(vshape, shape[lead:], strict=True)):
            if n != want and not (n == 1 and static[k] == 1):
                raise ValueError(
                    f"GpuAlloc: value of shape {vshape} does not broadcast to {shape} "
                    "(runtime broadcasting of a dim not statically 1 is not allowed)"
                )
        out = array.empty(shape, dtype, device)
        if dtype in _CTYPES:
            strided_assign(out, value, device)
        else:
            out = array.copy(broadcast_view(value, shape), device)
        outputs[0][0] = out


class GpuAllocEmpty(_HostDelegate):
    """``AllocEmpty(dtype)(*shape)``: an uninitialised C-contiguous GPU array."""

    __props__ = ("dtype", "device")

    def __init__(self, dtype: str, device: int = 0) -> None:
        self.dtype = str(np.dtype(dtype))
        self.device = int(device)

    def host_op(self) -> AllocEmpty:
        return AllocEmpty(self.dtype)

    def make_node(self, *shape: Any) -> Apply:
        try:
            host = AllocEmpty(self.dtype).make_node(*shape)
        except (TypeError, ValueError) as e:
            raise ValueError(f"GpuAllocEmpty: {e}") from e
        return Apply(self, list(host.inputs), [_gpu_out(host.outputs[0], self.device)])

    def perform(self, node, inputs, outputs):
        shape = tuple(int(s) for s in inputs)
        outputs[0][0] = array.empty(shape, self.dtype, self.device)


def _const_axis(op: str, axis: Any) -> int:
    if isinstance(axis, Variable):
        if not isinstance(axis, Constant):
            raise ValueError(f"{op}: axis must be a constant")
        axis = axis.data
    return int(np.asarray(axis).item())


class GpuJoin(GpuOp):
    """``Join`` (concatenate) of GPU arrays along ``axis``.

    Parameters
    ----------
    axis : int
        Join axis (negative counts from the end).

    Notes
    -----
    The result is a new C-contiguous array; each input is written into its
    slice by the strided set kernel. Gradients are views (:class:`GpuSplit`
    through the host rule).
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("axis",)

    def __init__(self, axis: int) -> None:
        self.axis = int(axis)

    def _host(self, tensors: list[Variable]) -> Apply:
        try:
            return Join(self.axis).make_node(*tensors)  # pytensor >= 3.1
        except TypeError:
            return Join().make_node(self.axis, *tensors)

    def make_node(self, *tensors: Any) -> Apply:
        if not tensors:
            raise TypeError("GpuJoin: needs at least one input")
        tensors = [
            as_gpu_variable(t, op="GpuJoin", role=f"input {k}")
            for k, t in enumerate(tensors)
        ]
        device = common_device("GpuJoin", *tensors)
        dtypes = {t.type.dtype for t in tensors}
        if len(dtypes) != 1:
            raise TypeError(
                f"GpuJoin: inputs must share one dtype, got {sorted(dtypes)}"
            )
        if tensors[0].type.dtype not in _CTYPES:
            raise TypeError(f"GpuJoin: dtype {tensors[0].type.dtype} is not supported")
        ndim = tensors[0].type.ndim
        if not -ndim <= self.axis < ndim:
            raise ValueError(
                f"GpuJoin: axis {self.axis} is out of range for {ndim} dims"
            )
        try:
            host = self._host([_host_like(t) for t in tensors])
        except (TypeError, ValueError) as e:
            raise ValueError(f"GpuJoin: {e}") from e
        return Apply(self, tensors, [_gpu_out(host.outputs[-1], device)])

    def perform(self, node, inputs, outputs):
        device = self.device_of(node)
        ndim = len(inputs[0].shape)
        axis = self.axis % ndim
        base = list(int(s) for s in inputs[0].shape)
        for k, t in enumerate(inputs):
            shp = [int(s) for s in t.shape]
            if len(shp) != ndim or any(
                a != b
                for d, (a, b) in enumerate(zip(shp, base, strict=True))
                if d != axis
            ):
                raise ValueError(
                    f"GpuJoin: input {k} has shape {tuple(shp)}; all inputs must match "
                    f"{tuple(base)} except along axis {axis}"
                )
        total = sum(int(t.shape[axis]) for t in inputs)
        shape = tuple(base[:axis] + [total] + base[axis + 1 :])
        out = array.empty(shape, inputs[0].dtype, device)
        start = 0
        for t in inputs:
            n = int(t.shape[axis])
            if n:
                index = (slice(None),) * axis + (slice(start, start + n),)
                strided_assign(subtensor_view(out, index), t, device)
            start += n
        outputs[0][0] = out

    def _infer_shape(self, node, input_shapes):
        axis = self.axis % node.inputs[0].type.ndim
        shape = list(input_shapes[0])
        total = input_shapes[0][axis]
        for s in input_shapes[1:]:
            total = total + s[axis]
        shape[axis] = total
        return [tuple(shape)]

    def pullback(self, inputs, outputs, cotangents):
        (g,) = cotangents
        if _skip(g):
            return [g for _ in inputs]
        g = as_host(g)
        axis = self.axis % inputs[0].type.ndim
        sizes = pt.stack([as_host(t).shape[axis] for t in inputs])
        parts = pt.split(g, sizes, n_splits=len(inputs), axis=axis)
        if len(inputs) == 1:
            parts = [parts] if not isinstance(parts, (list, tuple)) else parts
        return [as_gpu(p, t.type.device) for p, t in zip(parts, inputs, strict=True)]


class GpuSplit(GpuOp):
    """``Split(len_splits)`` of a GPU array along ``axis``: views.

    Notes
    -----
    ``splits`` is a host integer vector of ``len_splits`` sizes summing to
    the axis extent.
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("len_splits", "axis")

    def __init__(self, len_splits: int, axis: int) -> None:
        self.len_splits = int(len_splits)
        self.axis = int(axis)
        self.view_map = {i: [0] for i in range(self.len_splits)}

    def _host(self, x: Variable, splits: Variable) -> Apply:
        try:
            return Split(self.len_splits, self.axis).make_node(x, splits)
        except TypeError:  # pytensor 3.0: axis is an input
            return Split(self.len_splits).make_node(x, self.axis, splits)

    def make_node(self, x: Any, splits: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuSplit", role="x")
        splits = pt.as_tensor_variable(splits)
        if splits.type.ndim != 1 or splits.type.dtype not in integer_dtypes:
            raise TypeError(f"GpuSplit: splits must be an integer vector, got {splits}")
        if not -x.type.ndim <= self.axis < x.type.ndim:
            raise ValueError(
                f"GpuSplit: axis {self.axis} is out of range for {x.type.ndim} dims"
            )
        try:
            host = self._host(_host_like(x), splits)
        except (TypeError, ValueError) as e:
            raise ValueError(f"GpuSplit: {e}") from e
        outs = [_gpu_out(o, x.type.device) for o in host.outputs]
        return Apply(self, [x, splits], outs)

    def perform(self, node, inputs, outputs):
        x, splits = inputs
        axis = self.axis % len(x.shape)
        sizes = [int(s) for s in splits]
        if len(sizes) != self.len_splits or any(s < 0 for s in sizes):
            raise ValueError(
                f"GpuSplit: expected {self.len_splits} non-negative sizes, got {sizes}"
            )
        if sum(sizes) != int(x.shape[axis]):
            raise ValueError(
                f"GpuSplit: sizes {sizes} do not sum to the axis extent {x.shape[axis]}"
            )
        start = 0
        for k, n in enumerate(sizes):
            index = (slice(None),) * axis + (slice(start, start + n),)
            outputs[k][0] = subtensor_view(x, index)
            start += n

    def _infer_shape(self, node, input_shapes):
        x, splits = node.inputs
        axis = self.axis % x.type.ndim
        out = []
        for k in range(self.len_splits):
            shape = list(input_shapes[0])
            shape[axis] = splits[k]
            out.append(tuple(shape))
        return out

    def connection_pattern(self, node):
        return [[True] * self.len_splits, [False] * self.len_splits]

    def pullback(self, inputs, outputs, cotangents):
        x, splits = inputs
        device = x.type.device
        parts = []
        for g, o in zip(cotangents, outputs, strict=True):
            if _skip(g):
                parts.append(pt.zeros_like(as_host(o)))
            else:
                parts.append(as_host(g))
        axis = self.axis % x.type.ndim
        from pytensor.gradient import DisconnectedType as _D

        return [as_gpu(pt.concatenate(parts, axis=axis), device), _D()()]


# --------------------------------------------------------------------------
# checks and shapes
# --------------------------------------------------------------------------


class GpuCheckAndRaise(GpuOp):
    """``CheckAndRaise(exc_type, msg)(x, *conds)`` with a GPU ``x``: returns ``x``.

    The conditions are host boolean scalars; when one is false,
    ``exc_type(msg)`` is raised.
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("msg", "exc_type")
    view_map = {0: [0]}

    def __init__(self, exc_type: type, msg: str = "") -> None:
        if not (isinstance(exc_type, type) and issubclass(exc_type, Exception)):
            raise TypeError(
                f"GpuCheckAndRaise: exc_type must be an Exception class, got {exc_type}"
            )
        self.exc_type = exc_type
        self.msg = str(msg)

    def make_node(self, x: Any, *conds: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuCheckAndRaise", role="x")
        host = CheckAndRaise(self.exc_type, self.msg).make_node(_host_like(x), *conds)
        return Apply(self, [x, *host.inputs[1:]], [x.type()])

    def perform(self, node, inputs, outputs):
        x, *conds = inputs
        if not all(bool(c) for c in conds):
            raise self.exc_type(self.msg)
        outputs[0][0] = x

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]

    def connection_pattern(self, node):
        return [[True]] + [[False] for _ in node.inputs[1:]]

    def pullback(self, inputs, outputs, cotangents):
        from pytensor.gradient import DisconnectedType as _D

        return [cotangents[0]] + [_D()() for _ in inputs[1:]]

    def __str__(self) -> str:
        return f"GpuCheckAndRaise{{{self.exc_type.__name__}, {self.msg!r}}}"


class GpuShape(GpuOp):
    """The shape of a GPU array as a host int64 vector (the array is not copied)."""

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuShape", role="x")
        return Apply(self, [x], [TensorType("int64", (x.type.ndim,))()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = np.asarray(inputs[0].shape, dtype="int64")

    def _infer_shape(self, node, input_shapes):
        return [(node.inputs[0].type.ndim,)]

    def connection_pattern(self, node):
        return [[False]]

    def pullback(self, inputs, outputs, cotangents):
        from pytensor.gradient import DisconnectedType as _D

        return [_D()()]


class GpuShape_i(GpuOp):  # noqa: N801  (PyTensor's Shape_i, with the Gpu prefix)
    """Extent ``i`` of a GPU array as a host int64 scalar."""

    __props__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = int(i)

    def make_node(self, x: Any) -> Apply:
        x = as_gpu_variable(x, op="GpuShape_i", role="x")
        if not 0 <= self.i < x.type.ndim:
            raise ValueError(
                f"GpuShape_i: axis {self.i} is out of range for {x.type.ndim} dims"
            )
        return Apply(self, [x], [TensorType("int64", ())()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = np.asarray(inputs[0].shape[self.i], dtype="int64")

    def _infer_shape(self, node, input_shapes):
        return [()]

    def connection_pattern(self, node):
        return [[False]]

    def pullback(self, inputs, outputs, cotangents):
        from pytensor.gradient import DisconnectedType as _D

        return [_D()()]


# --------------------------------------------------------------------------
# lifting rules
# --------------------------------------------------------------------------


@register_lift(DimShuffle)
def lift_dimshuffle(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``DimShuffle(host_from_gpu(x)) -> host_from_gpu(GpuDimShuffle(x))``."""
    op = node.op
    x = gpu_constant_or_transfer(node.inputs[0], device)
    return [GpuDimShuffle(input_ndim=op.input_ndim, new_order=op.new_order)(x)]


@register_lift(Reshape)
def lift_reshape(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``Reshape(host_from_gpu(x), shape) -> host_from_gpu(GpuReshape(x, shape))``."""
    x, shape = node.inputs
    return [GpuReshape(node.op.ndim)(gpu_constant_or_transfer(x, device), shape)]


@register_lift(SpecifyShape)
def lift_specify_shape(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``SpecifyShape(hfg(x), *s) -> hfg(GpuSpecifyShape(x, *s))``."""
    x, *shape = node.inputs
    return [GpuSpecifyShape()(gpu_constant_or_transfer(x, device), *shape)]


def _basic_index_inputs(node: Apply) -> bool:
    return all(
        i.type.ndim == 0 and i.type.dtype in integer_dtypes
        for i in node.inputs[(2 if isinstance(node.op, IncSubtensor) else 1) :]
        if hasattr(i.type, "ndim")
    )


@register_lift(Subtensor)
def lift_subtensor(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Subtensor(host_from_gpu(x), *i) -> host_from_gpu(GpuSubtensor(x, *i))``.

    Declines for index inputs that are not integer scalars.
    """
    if not _basic_index_inputs(node):
        return None
    x, *index = node.inputs
    return [GpuSubtensor(node.op.idx_list)(gpu_constant_or_transfer(x, device), *index)]


@register_lift(IncSubtensor)
def lift_inc_subtensor(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``IncSubtensor(x, y, *i) -> GpuIncSubtensor(gpu(x), gpu(y), *i)`` (not inplace).

    A constant ``y`` of another dtype (``set_subtensor(x[:, 0], 0.0)`` on a
    float64 ``x`` gets a float32 ``0.0``) is cast to ``x``'s dtype, as the host
    op's numpy assignment does. Declines for other ``y`` of another dtype,
    non-scalar indices, unsupported dtypes, and for ``inc`` on bool; the
    in-place decision is taken again on the GPU graph.
    """
    op = node.op
    x, y, *index = node.inputs
    if not _basic_index_inputs(node) or x.type.dtype not in _CTYPES:
        return None
    if x.type.dtype == "bool" and not op.set_instead_of_inc:
        return None
    if isinstance(y, TensorConstant) and y.type.dtype != x.type.dtype:
        y = pt.constant(np.asarray(y.data).astype(x.type.dtype))
    gx = gpu_constant_or_transfer(x, device)
    gy = gpu_constant_or_transfer(y, device)
    if gy.type.dtype != gx.type.dtype:
        return None
    return [
        GpuIncSubtensor(op.idx_list, set_instead_of_inc=op.set_instead_of_inc)(
            gx, gy, *index
        )
    ]


@register_lift(Alloc)
def lift_alloc(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Alloc(v, *shape) -> GpuAlloc(gpu(v), *shape)`` (constants stay constants)."""
    value, *shape = node.inputs
    if value.type.dtype not in _CTYPES:
        return None
    return [GpuAlloc()(gpu_constant_or_transfer(value, device), *shape)]


@register_lift(AllocEmpty)
def lift_alloc_empty(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``gpu_from_host(AllocEmpty(dtype)(*shape)) -> GpuAllocEmpty(dtype)(*shape)``."""
    return [GpuAllocEmpty(node.op.dtype, device)(*node.inputs)]


def _join_parts(node: Apply) -> tuple[int, list[Variable]] | None:
    axis = getattr(node.op, "axis", None)
    tensors = list(node.inputs)
    if axis is None:  # pytensor 3.0: the axis is the first input
        if not isinstance(tensors[0], Constant):
            return None
        axis, tensors = _const_axis("Join", tensors[0]), tensors[1:]
    return int(axis), tensors


@register_lift(Join)
def lift_join(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Join(axis, *xs) -> GpuJoin(axis)(*gpu(xs))`` for a constant axis."""
    parts = _join_parts(node)
    if parts is None:
        return None
    axis, tensors = parts
    if tensors[0].type.dtype not in _CTYPES:
        return None
    return [GpuJoin(axis)(*[gpu_constant_or_transfer(t, device) for t in tensors])]


@register_lift(Split)
def lift_split(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Split(n)(host_from_gpu(x), axis, splits) -> GpuSplit(n, axis)(x, splits)``."""
    op = node.op
    if hasattr(op, "axis"):
        x, splits = node.inputs
        axis = op.axis
    else:
        x, axis_v, splits = node.inputs
        if not isinstance(axis_v, Constant):
            return None
        axis = _const_axis("Split", axis_v)
    outs = GpuSplit(op.len_splits, int(axis))(
        gpu_constant_or_transfer(x, device), splits, return_list=True
    )
    return list(outs)


@register_lift(CheckAndRaise)
def lift_check_and_raise(fgraph: Any, node: Apply, device: int) -> list[Variable]:
    """``CheckAndRaise(host_from_gpu(x), *c) -> GpuCheckAndRaise(x, *c)``.

    Covers ``Assert`` (a subclass); conditions stay on the host.
    """
    x, *conds = node.inputs
    op = node.op
    return [
        GpuCheckAndRaise(op.exc_type, op.msg)(
            gpu_constant_or_transfer(x, device), *conds
        )
    ]


@node_rewriter([Shape, Shape_i])
def local_gpu_shape(fgraph, node):
    """``Shape(host_from_gpu(x)) -> GpuShape(x)``, same for ``Shape_i(i)``.

    ``Shape_i(i)(x)`` of a GPU ``x`` itself (PyTensor's shape feature builds
    those) becomes ``GpuShape_i(i)(x)`` too.

    The shape of a GPU value is read from the GPUArray, so ``x.shape`` never
    pulls ``x`` to the host. Not a ``register_lift`` rule: the result is a
    host integer, not a GPU value.
    """
    (h,) = node.inputs
    if _is_gpu(h):
        x = h  # Shape_i accepts any variable with ndim (PyTensor's ShapeFeature)
    elif h.owner is not None and isinstance(h.owner.op, HostFromGpu):
        x = h.owner.inputs[0]
    else:
        return None
    if isinstance(node.op, Shape_i):
        new = GpuShape_i(node.op.i)(x)
    else:
        new = GpuShape()(x)
    old = node.outputs[0]
    if new.type != old.type:
        try:
            new = old.type.filter_variable(new, allow_convert=True)
        except TypeError:
            return None
    copy_stack_trace(old, new)
    return [new]


gpu_lift_db.register("local_gpu_shape", local_gpu_shape, "cc2ops_gpu")


@node_rewriter([GpuIncSubtensor])
def local_gpu_inplace_incsubtensor(fgraph, node):
    """``GpuIncSubtensor(x, y) -> GpuIncSubtensor(x, y, inplace=True)``.

    Applied after the destroy handler exists, which rejects the replacement
    when ``x`` is protected (a function input or output that may not be
    overwritten) or still needed by another node.
    """
    op = node.op
    if op.inplace or isinstance(node.inputs[0], Constant):
        return None
    new_op = GpuIncSubtensor(
        op.idx_list, inplace=True, set_instead_of_inc=op.set_instead_of_inc
    )
    new = new_op(*node.inputs)
    copy_stack_trace(node.outputs[0], new)
    return [new]


#: The in-place rewrite of GpuIncSubtensor (database ``cc2ops_gpu_inplace``).
gpu_inplace_incsubtensor = WalkingGraphRewriter(
    local_gpu_inplace_incsubtensor, failure_callback=WalkingGraphRewriter.warn_inplace
)
gpu_inplace_db.register(
    "gpu_inplace_incsubtensor", gpu_inplace_incsubtensor, "cc2ops_gpu", "inplace"
)


@node_rewriter([GpuFromHost])
def local_gpu_from_host_constant(fgraph, node):
    """``gpu_from_host[d](tensor constant c) -> GPU constant c on d``.

    A constant is uploaded once, when the function is linked, instead of on
    every call (lifting rules that move constant inputs with ``to_gpu``
    produce such transfers, e.g. the ``1/B`` vector of a mean's gradient).
    """
    (x,) = node.inputs
    if not isinstance(x, TensorConstant):
        return None
    new = gpu_constant_or_transfer(x, node.op.device)
    old = node.outputs[0]
    if not old.type.is_super(new.type):
        return None
    copy_stack_trace(old, new)
    return [new]


gpu_lift_db.register(
    "local_gpu_from_host_constant", local_gpu_from_host_constant, "cc2ops_gpu"
)
