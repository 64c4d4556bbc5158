"""GPU reductions: ``GpuCAReduce`` (sum, prod, max, min, any, all), ``GpuArgmax``.

``GpuCAReduce(host_op)`` runs PyTensor's :class:`~pytensor.tensor.elemwise.CAReduce`
``host_op`` (``Sum``, ``Prod``, ``Max``, ``Min``, ``Any``, ``All``, or the
``CAReduce`` of a fused ``Composite`` that ``fast_run`` makes of
``sum(f(x))``) on a GPU array; ``GpuArgmax(axis)`` runs
:class:`~pytensor.tensor.math.Argmax` (the same class name in PyTensor 3.0
and 3.3; ``max_and_argmax`` builds a ``Max`` and an ``Argmax`` node). A
mean is ``Sum`` followed by an elementwise division, and ``keepdims`` is a
``DimShuffle`` after the reduction, both lifted by their own rules.

Semantics
---------
The accumulator has the host op's ``acc_dtype`` (PyTensor's default for a
float32 sum is float64: the GPU sums float32 data in float64, which costs
nothing on a memory-bound kernel; ``x.sum(acc_dtype="float32")`` gives a
float32 accumulator) and the result is cast to the output dtype. ``Max`` and
``Min`` propagate NaN (PyTensor's scalar code) and, like PyTensor, refuse an
empty reduction; ``Argmax`` returns the first index of the maximum, a NaN
counting as the maximum (numpy's rule), the index running over the reduced
axes in C order.

Kernels (``kernels/reduction.cu``)
----------------------------------
The input is seen as (kept dims, reduced dims): extent-1 dims are dropped
and each group's chained dims merged (any strides, no copy). When the
reduced elements are contiguous, one warp (fewer than 2048 of them) or one
256-thread block reduces each output with warp shuffles and a shared-memory
step; when instead consecutive outputs are contiguous (a column sum such as a
bias gradient) a 32 x 8 block reduces 32 outputs at once with coalesced
loads. Few outputs over many elements (a full sum) are split into chunks
reduced by a first launch into an ``acc_dtype`` buffer and combined by a
second. Kernel names: ``reduce_<op>_<hash8>_<mode>_k<nk>r<nr>_<dt>`` and
``argmax_<hash8>_<mode>_k<nk>r<nr>_<dt>``.
"""

from __future__ import annotations

import hashlib
from math import prod
from typing import Any

import numpy as np
import pytensor.scalar as ps
from pytensor.graph.basic import Apply, Variable
from pytensor.tensor.elemwise import CAReduce
from pytensor.tensor.math import Argmax
from pytensor.tensor.type import TensorType

from cc2ops.cuda.op import GpuOp, as_gpu_variable
from cc2ops.cuda.ops.tensor.elemwise import ScalarCode, collapse_dims, scalar_code
from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.compile import (
    get_kernel,
    kernel_cache,
    launch,
    register_variants,
)
from cc2ops.cuda.runtime.device import get_device
from cc2ops.cuda.transfer import as_gpu_cotangent
from cc2ops.cuda.type import CudaArrayType

__all__ = [
    "GpuCAReduce",
    "GpuArgmax",
    "ReduceCode",
    "reduce_code",
    "reduction_consts",
    "argmax_consts",
    "split_geometry",
    "lift_careduce",
    "lift_argmax",
    "fused_sum_of_squares",
    "run_reduction",
]

_SHORT = {
    "bool": "b", "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16",
    "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64",
    "float32": "f32", "float64": "f64",
}  # fmt: skip
#: reduced extents from which one 256-thread block (not a warp) reduces an output
BLOCK_ROW_FROM = 2048
#: reductions this long over few outputs are split into chunks (two launches)
SPLIT_FROM = 32768
_CHUNK = 16384


class ReduceCode:
    """Device code of a reduction: fold, combine and identity.

    Attributes
    ----------
    name : str
        ``sum``, ``prod``, ``max``, ``min``, ``all``, ``any`` (``sum``/``prod``
        also for fused composites).
    in_dtype, acc_dtype, out_dtype : str
    fold : ScalarCode
        ``acc, x -> acc`` (the host op's scalar op).
    combine : ScalarCode
        ``acc, acc -> acc`` (the plain binary op).
    identity : str
        C literal of the accumulator's start value.
    """

    def __init__(
        self,
        name: str,
        in_dtype: str,
        acc_dtype: str,
        out_dtype: str,
        fold: ScalarCode,
        combine: ScalarCode,
        identity: str,
    ) -> None:
        self.name = name
        self.in_dtype = in_dtype
        self.acc_dtype = acc_dtype
        self.out_dtype = out_dtype
        self.fold = fold
        self.combine = combine
        self.identity = identity

    @property
    def key(self) -> tuple:
        """What identifies the generated code (equal keys, equal kernels)."""
        return (self.name, self.in_dtype, self.acc_dtype, self.out_dtype,
                self.fold.digest, self.combine.digest, self.identity)  # fmt: skip

    def chunk_code(self) -> ReduceCode:
        """The code that reduces the chunk accumulators of a split reduction."""
        return ReduceCode(
            self.name, self.acc_dtype, self.acc_dtype, self.out_dtype,
            self.combine, self.combine, self.identity,
        )  # fmt: skip


def _base_op(scalar_op: Any) -> Any:
    """The binary op combining accumulators (the fused op's Add/Mul for composites)."""
    if isinstance(scalar_op, ps.Composite):
        outs = scalar_op.fgraph.outputs
        if len(outs) != 1 or outs[0].owner is None:
            return None
        node = outs[0].owner
        if isinstance(node.op, ps.Cast) and node.inputs[0].owner is not None:
            node = node.inputs[0].owner
        return node.op if isinstance(node.op, (ps.Add, ps.Mul)) else None
    return scalar_op


def _literal(value: Any, dtype: str) -> str:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        if np.isinf(value):
            return "INFINITY" if value > 0 else "(-INFINITY)"
        return repr(float(value))
    if dt.kind == "b":
        return "1" if value else "0"
    value = int(value)
    if dt == np.int64 and value == np.iinfo(np.int64).min:
        return "(-9223372036854775807LL - 1LL)"
    suffix = "ULL" if dt.kind == "u" else "LL"
    return f"((npy_{dtype}){value}{suffix})"


def _identity(base: Any, acc_dtype: str) -> tuple[str, str] | None:
    """(name, C literal) of ``base``'s identity in ``acc_dtype``, else ``None``."""
    dt = np.dtype(acc_dtype)
    if isinstance(base, ps.Add):
        return "sum", _literal(0, acc_dtype)
    if isinstance(base, ps.Mul):
        return "prod", _literal(1, acc_dtype)
    if isinstance(base, (ps.Maximum, ps.Minimum)):
        big = isinstance(base, ps.Minimum)
        if dt.kind == "f":
            value: Any = np.inf if big else -np.inf
        elif dt.kind == "b":
            value = big
        else:
            info = np.iinfo(dt)
            value = info.max if big else info.min
        return ("min" if big else "max"), _literal(value, acc_dtype)
    if isinstance(base, ps.AND):
        return "all", _literal(1, acc_dtype)
    if isinstance(base, ps.OR):
        return "any", _literal(0, acc_dtype)
    return None


def _acc_dtype(host_op: CAReduce, in_dtype: str) -> str:
    return getattr(host_op, "acc_dtype", None) or in_dtype


def reduce_code(host_op: CAReduce, in_dtype: str, out_dtype: str) -> ReduceCode | None:
    """The device code of ``host_op`` on ``in_dtype`` data, or ``None`` (declined).

    Declined: scalar ops other than add, mul, maximum, minimum, and, or (and
    composites fused into add/mul), and dtypes the GPU does not handle.
    """
    acc = _acc_dtype(host_op, in_dtype)
    base = _base_op(host_op.scalar_op)
    if base is None:
        return None
    ident = _identity(base, acc)
    if ident is None:
        return None
    fold = scalar_code(host_op.scalar_op, (acc, in_dtype))
    combine = scalar_code(base, (acc, acc))
    if fold is None or combine is None or combine.out_dtypes != (acc,):
        return None
    if out_dtype not in _SHORT:
        return None
    return ReduceCode(ident[0], in_dtype, acc, out_dtype, fold, combine, ident[1])


def _support(*codes: ScalarCode) -> str:
    seen: list[str] = []
    for c in codes:
        if c.support and c.support not in seen:
            seen.append(c.support)
    return "\n".join(seen)


def _tag(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:8]


def _check_mode(mode: str, tpo: int, split: bool) -> None:
    if mode not in ("row", "col"):
        raise ValueError(f"reduction: mode must be 'row' or 'col', got {mode!r}")
    if tpo not in (32, 256) or (mode == "col" and tpo != 256):
        raise ValueError(f"reduction: tpo must be 32 or 256 (256 for col), got {tpo}")
    if split and (mode != "row" or tpo != 256):
        raise ValueError("reduction: split needs mode 'row' with tpo 256")


def reduction_consts(
    code: ReduceCode,
    *,
    mode: str,
    tpo: int,
    nk: int,
    nr: int,
    split: bool = False,
    wide: bool = False,
) -> dict[str, Any]:
    """Template constants of ``kernels/reduction.cu`` (kind ``reduce``)."""
    _check_mode(mode, tpo, split)
    spec = f"{mode}{tpo}_k{nk}r{nr}_{'s' if split else ''}{'w' if wide else ''}"
    tag = _tag(code.fold.digest, code.combine.digest, code.identity, code.out_dtype,
               spec)  # fmt: skip
    out = code.acc_dtype if split else code.out_dtype
    shape = f"{mode}{'s' if split else ''}_k{nk}r{nr}"
    return {
        "name": f"reduce_{code.name}_{tag}_{shape}_{_SHORT[out]}",
        "kind": "reduce",
        "in_dtype": code.in_dtype,
        "acc_dtype": code.acc_dtype,
        "out_dtype": code.out_dtype,
        "fold_body": code.fold.body,
        "fold_out": code.fold.out_dtypes[0],
        "combine_body": code.combine.body,
        "support": _support(code.fold, code.combine),
        "identity": code.identity,
        "mode": mode,
        "tpo": int(tpo),
        "nk": int(nk),
        "nr": int(nr),
        "split": bool(split),
        "wide": bool(wide),
    }


def argmax_consts(
    in_dtype: str, *, mode: str, tpo: int, nk: int, nr: int, wide: bool = False
) -> dict[str, Any]:
    """Template constants of ``kernels/reduction.cu`` (kind ``argmax``)."""
    _check_mode(mode, tpo, False)
    if in_dtype not in _SHORT:
        raise ValueError(f"argmax: dtype {in_dtype} is not supported on the GPU")
    dt = np.dtype(in_dtype)
    lowest: Any = (
        -np.inf if dt.kind == "f" else (False if dt.kind == "b" else np.iinfo(dt).min)
    )
    spec = f"{mode}{tpo}_k{nk}r{nr}_{'w' if wide else ''}"
    tag = _tag("argmax", in_dtype, spec)
    return {
        "name": f"argmax_{tag}_{mode}_k{nk}r{nr}_{_SHORT[in_dtype]}",
        "kind": "argmax",
        "in_dtype": in_dtype,
        "acc_dtype": in_dtype,
        "out_dtype": "int64",
        "fold_body": "",
        "fold_out": in_dtype,
        "combine_body": "",
        "support": "",
        "identity": _literal(lowest, in_dtype),
        "mode": mode,
        "tpo": int(tpo),
        "nk": int(nk),
        "nr": int(nr),
        "split": False,
        "wide": bool(wide),
    }


# --------------------------------------------------------------------------
# geometry and launching
# --------------------------------------------------------------------------


def split_geometry(
    shape: tuple[int, ...], strides: tuple[int, ...], axes: tuple[int, ...]
) -> tuple[list[int], list[int], list[int], list[int]]:
    """(kept extents, kept strides, reduced extents, reduced strides), collapsed.

    Parameters
    ----------
    shape, strides : tuple of int
        The input's shape and element strides.
    axes : tuple of int
        The reduced axes.

    Notes
    -----
    Extent-1 dims are dropped and chained dims merged within each group, in
    the input's axis order, so the C-order index over each group is kept.
    """
    kept = [d for d in range(len(shape)) if d not in axes]
    red = [d for d in range(len(shape)) if d in axes]
    ke, (ks,) = collapse_dims(
        tuple(shape[d] for d in kept), [[strides[d] for d in kept]]
    )
    re_, (rs,) = collapse_dims(
        tuple(shape[d] for d in red), [[strides[d] for d in red]]
    )
    return ke, ks, re_, rs


def _elem_strides(garray: Any) -> tuple[int, ...]:
    itemsize = np.dtype(garray.dtype).itemsize
    out = []
    for n, s in zip(garray.shape, garray.strides, strict=True):
        if n != 1 and s % itemsize:
            raise ValueError("reduction: strides are not a multiple of the itemsize")
        out.append(0 if n == 1 else int(s) // itemsize)
    return tuple(out)


def _choose(
    ke: list[int], ks: list[int], re_: list[int], rs: list[int], n_red: int
) -> tuple[str, int]:
    inner_out_contig = bool(ke) and ks[-1] == 1
    inner_red_contig = bool(re_) and rs[-1] == 1
    if inner_out_contig and not inner_red_contig:
        return "col", 256
    return "row", 256 if n_red >= BLOCK_ROW_FROM else 32


def _args(
    x: Any, y: Any, n_out: int, n_red: int, nsplit: int, chunk: int,
    ke: list[int], ks: list[int], re_: list[int], rs: list[int],
) -> list[Any]:  # fmt: skip
    args: list[Any] = [x, y, np.int64(n_out), np.int64(n_red), np.int64(nsplit),
                       np.int64(chunk)]  # fmt: skip
    for e, s in zip(ke, ks, strict=True):
        args += [np.int64(e), np.int64(s)]
    for e, s in zip(re_, rs, strict=True):
        args += [np.int64(e), np.int64(s)]
    return args


def _grid(mode: str, tpo: int, n_out: int, dev: Any) -> tuple[Any, Any]:
    cap = dev.multiprocessors * 32
    if mode == "col":
        return max(1, min((n_out + 31) // 32, cap)), (32, 8)
    per_block = 256 // tpo
    return max(1, min((n_out + per_block - 1) // per_block, cap)), 256


def _is_wide(*counts: int) -> bool:
    return any(c >= 2**31 for c in counts)


def _static(
    n_out: int, n_red: int, nsplit: int, chunk: int,
    ke: list[int], ks: list[int], re_: list[int], rs: list[int],
) -> tuple:  # fmt: skip
    """The launch arguments after the two pointers (see :func:`_args`)."""
    return tuple(_args(None, None, n_out, n_red, nsplit, chunk, ke, ks, re_, rs)[2:])


def _plan_reduction(
    code: ReduceCode | None, x: Any, axes: tuple[int, ...], device: int
) -> tuple:
    """``(launches, partial)``: each launch is (kernel, grid, block, source,
    static args) with source ``"x"`` or ``"partial"`` (its output is the
    partial buffer when a second launch follows, else ``out``); ``partial``
    is (elements, dtype) of the split reduction's buffer, or ``None``."""
    ke, ks, re_, rs = split_geometry(tuple(x.shape), _elem_strides(x), axes)
    n_out, n_red = prod(ke), prod(re_)
    if n_out == 0:
        return (), None
    dev = get_device(device)
    mode, tpo = _choose(ke, ks, re_, rs, n_red)
    wide = _is_wide(n_out, n_red, *ke, *re_)
    nk, nr = len(ke), len(re_)
    if code is None:
        consts = argmax_consts(str(x.dtype), mode=mode, tpo=tpo, nk=nk, nr=nr,
                               wide=wide)  # fmt: skip
        fn = get_kernel("reduction", device, **consts)
        grid, block = _grid(mode, tpo, n_out, dev)
        static = _static(n_out, n_red, 1, n_red, ke, ks, re_, rs)
        return ((fn, grid, block, "x", static),), None
    if mode == "row" and n_red >= SPLIT_FROM and n_out < 2 * dev.multiprocessors:
        nsplit = min(-(-4 * dev.multiprocessors // n_out), -(-n_red // _CHUNK))
        chunk = -(-n_red // nsplit)
        consts = reduction_consts(code, mode="row", tpo=256, nk=nk, nr=nr, split=True,
                                  wide=wide)  # fmt: skip
        fn1 = get_kernel("reduction", device, **consts)
        grid1, block1 = _grid("row", 256, n_out * nsplit, dev)
        static1 = _static(n_out * nsplit, n_red, nsplit, chunk, ke, ks, re_, rs)
        # second pass: (n_out, nsplit) accumulators, reduced over the chunks
        ke2, ks2 = ([n_out], [nsplit]) if n_out > 1 else ([], [])
        tpo2 = 256 if nsplit >= BLOCK_ROW_FROM else 32
        consts = reduction_consts(code.chunk_code(), mode="row", tpo=tpo2,
                                  nk=len(ke2), nr=1)  # fmt: skip
        fn2 = get_kernel("reduction", device, **consts)
        grid2, block2 = _grid("row", tpo2, n_out, dev)
        static2 = _static(n_out, nsplit, 1, nsplit, ke2, ks2, [nsplit], [1])
        launches = (
            (fn1, grid1, block1, "x", static1),
            (fn2, grid2, block2, "partial", static2),
        )
        return launches, (n_out * nsplit, code.acc_dtype)
    consts = reduction_consts(code, mode=mode, tpo=tpo, nk=nk, nr=nr, wide=wide)
    fn = get_kernel("reduction", device, **consts)
    grid, block = _grid(mode, tpo, n_out, dev)
    static = _static(n_out, n_red, 1, n_red, ke, ks, re_, rs)
    return ((fn, grid, block, "x", static),), None


#: launch plans of run_reduction, by (device, code, input layout, axes)
_PLANS: dict[tuple, tuple] = kernel_cache()


def run_reduction(
    code: ReduceCode | None, x: Any, axes: tuple[int, ...], out: Any, device: int
) -> None:
    """Reduce GPUArray ``x`` over ``axes`` into the C-contiguous ``out``.

    ``code=None`` computes the argmax (``out`` is int64). The launches are
    planned once per (code, shape, strides, dtype, axes) and memoised.
    """
    key = (device, None if code is None else code.key, tuple(x.shape),
           tuple(x.strides), str(x.dtype), axes)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan_reduction(code, x, axes, device)
        if len(_PLANS) > 4096:
            _PLANS.clear()
        _PLANS[key] = plan
    launches, partial_spec = plan
    if not launches:
        return
    partial = None
    if partial_spec is not None:
        partial = array.empty((partial_spec[0],), partial_spec[1], device)
    last = len(launches) - 1
    for i, (fn, grid, block, source, static) in enumerate(launches):
        src = x if source == "x" else partial
        dst = out if i == last else partial
        launch(fn, grid, block, [src, dst, *static], device)


# --------------------------------------------------------------------------
# ops
# --------------------------------------------------------------------------


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return tuple(sorted(int(a) + ndim if int(a) < 0 else int(a) for a in axis))


def _kept_shape(shape: tuple[Any, ...], axes: tuple[int, ...]) -> tuple[Any, ...]:
    return tuple(s for d, s in enumerate(shape) if d not in axes)


class _GpuReduceBase(GpuOp):
    """Shared graph logic of the GPU reductions (host op kept for the pullback)."""

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    host_op: Any
    op_name = "GpuReduce"

    def _host_node(self, x: Variable) -> Apply:
        return self.host_op.make_node(TensorType(x.type.dtype, x.type.shape)())

    def make_node(self, x: Any) -> Apply:
        x = as_gpu_variable(x, op=self.op_name, role="x")
        axes = _axes(self.host_axis, x.type.ndim)
        for a in axes:
            if not 0 <= a < x.type.ndim:
                raise ValueError(
                    f"{self.op_name}: axis {a} is out of range for an input of "
                    f"{x.type.ndim} dims"
                )
        host = self._host_node(x)
        out = CudaArrayType(host.outputs[0].type.dtype, host.outputs[0].type.shape,
                            x.type.device)()  # fmt: skip
        return Apply(self, [x], [out])

    @property
    def host_axis(self) -> Any:
        return self.host_op.axis

    def axes_of(self, node: Apply) -> tuple[int, ...]:
        return _axes(self.host_axis, node.inputs[0].type.ndim)

    def _infer_shape(self, node: Apply, input_shapes: list[Any]) -> list[Any]:
        return [_kept_shape(tuple(input_shapes[0]), self.axes_of(node))]

    def pullback(self, inputs, outputs, cotangents):
        from cc2ops.cuda.transfer import as_gpu, as_host

        (x,) = inputs
        hx = as_host(x)
        hout = self.host_op(hx)
        (g,) = cotangents
        hg = g if not isinstance(g.type, CudaArrayType) else as_host(g)
        (gx,) = self.host_op.pullback([hx], [hout], [hg])
        if isinstance(gx.type, TensorType):
            if gx.type.dtype != x.type.dtype:
                gx = gx.astype(x.type.dtype)
            return [as_gpu(gx, x.type.device)]
        return [as_gpu_cotangent(gx, x.type.device)]


class GpuCAReduce(_GpuReduceBase):
    """PyTensor's ``CAReduce`` ``host_op`` (Sum, Prod, Max, Min, Any, All) on the GPU.

    Parameters
    ----------
    host_op : pytensor.tensor.elemwise.CAReduce
        The host reduction; its scalar op, axes, ``acc_dtype`` and ``dtype``
        define this op.

    Notes
    -----
    The input may be any GPU array (strided views included, no copy). See the
    module docstring for accumulation and NaN semantics; ``Max``/``Min`` of an
    empty reduction raise ``ValueError``, like PyTensor.
    """

    __props__ = ("host_op",)
    op_name = "GpuCAReduce"

    def __init__(self, host_op: CAReduce) -> None:
        if not isinstance(host_op, CAReduce):
            raise TypeError(
                f"GpuCAReduce: host_op must be a CAReduce, got {type(host_op).__name__}"
            )
        self.host_op = host_op
        super().__init__()

    def code_for(self, node: Apply) -> ReduceCode:
        code = reduce_code(self.host_op, node.inputs[0].type.dtype,
                           node.outputs[0].type.dtype)  # fmt: skip
        if code is None:
            raise ValueError(
                f"GpuCAReduce: {self.host_op} on {node.inputs[0].type.dtype} cannot "
                "run on the GPU"
            )
        return code

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        (x,) = inputs
        device = self.device_of(node)
        axes = self.axes_of(node)
        code = self.code_for(node)
        if code.name in ("max", "min") and any(int(x.shape[a]) == 0 for a in axes):
            raise ValueError(
                f"GpuCAReduce: {code.name} of an empty reduction (input shape "
                f"{tuple(x.shape)}, axes {axes}) has no identity"
            )
        out = array.empty(_kept_shape(tuple(x.shape), axes), code.out_dtype, device)
        run_reduction(code, x, axes, out, device)
        outputs[0][0] = out

    def __str__(self) -> str:
        return f"Gpu{self.host_op}"


class GpuArgmax(_GpuReduceBase):
    """PyTensor's ``Argmax(axis)`` on the GPU (int64 indices).

    Parameters
    ----------
    axis : tuple of int or None
        The reduced axes (all when ``None``).

    Notes
    -----
    Index over the reduced axes in C order, first maximum, NaN as the
    maximum (numpy's ``argmax``). An empty reduction raises ``ValueError``.
    """

    __props__ = ("axis",)
    op_name = "GpuArgmax"

    def __init__(self, axis: Any = None) -> None:
        self.axis = None if axis is None else tuple(sorted(int(a) for a in axis))
        self.host_op = Argmax(self.axis)
        super().__init__()

    @property
    def host_axis(self) -> Any:
        return self.axis

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        (x,) = inputs
        device = self.device_of(node)
        axes = self.axes_of(node)
        if any(int(x.shape[a]) == 0 for a in axes):
            raise ValueError(
                f"GpuArgmax: argmax of an empty reduction (input shape "
                f"{tuple(x.shape)}, axes {axes})"
            )
        out = array.empty(_kept_shape(tuple(x.shape), axes), "int64", device)
        run_reduction(None, x, axes, out, device)
        outputs[0][0] = out

    def __str__(self) -> str:
        return f"GpuArgmax{{axis={self.axis}}}"


# --------------------------------------------------------------------------
# lifting
# --------------------------------------------------------------------------


@register_lift(CAReduce)
def lift_careduce(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``CAReduce(host_from_gpu(x)) -> host_from_gpu(GpuCAReduce(x))``.

    Declines scalar ops other than add/mul/maximum/minimum/and/or (and
    composites fused into add/mul), and 0-d inputs (nothing to reduce).
    """
    x = node.inputs[0]
    if x.type.ndim == 0:
        return None
    if reduce_code(node.op, x.type.dtype, node.outputs[0].type.dtype) is None:
        return None
    return [GpuCAReduce(node.op)(to_gpu(x, device))]


@register_lift(Argmax)
def lift_argmax(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Argmax(host_from_gpu(x)) -> host_from_gpu(GpuArgmax(x))``."""
    x = node.inputs[0]
    if len(node.inputs) != 1 or x.type.ndim == 0 or x.type.dtype not in _SHORT:
        return None
    return [GpuArgmax(node.op.axis)(to_gpu(x, device))]


# --------------------------------------------------------------------------
# variants for the compile test
# --------------------------------------------------------------------------


@register_variants("reduction")
def _reduction_variants() -> list[dict[str, Any]]:
    import pytensor.tensor as pt
    from pytensor.tensor.math import All, Max, Min, Prod, Sum
    from pytensor.tensor.math import Any as AnyOp

    out = []
    cases = [
        (Sum(axis=(1,)), "float32", "float32", dict(mode="row", tpo=256, nk=1, nr=1)),
        (Sum(axis=(0,)), "float32", "float32", dict(mode="col", tpo=256, nk=1, nr=1)),
        (Sum(axis=None), "float32", "float32",
         dict(mode="row", tpo=256, nk=0, nr=1, split=True)),
        (Prod(axis=(0, 2)), "float64", "float64", dict(mode="row", tpo=32, nk=1, nr=2)),
        (Max(axis=(1,)), "float32", "float32",
         dict(mode="row", tpo=32, nk=2, nr=1, wide=True)),
        (Min(axis=(0,)), "int64", "int64", dict(mode="col", tpo=256, nk=2, nr=2)),
        (AnyOp(axis=(1,)), "bool", "bool", dict(mode="row", tpo=32, nk=1, nr=1)),
        (All(axis=(1,)), "bool", "bool", dict(mode="col", tpo=256, nk=1, nr=1)),
    ]  # fmt: skip
    for host, dt_in, dt_out, kw in cases:
        x = pt.tensor(dtype=dt_in, shape=(None,) * 3)
        op = host.make_node(x).op
        code = reduce_code(op, dt_in, dt_out)
        if code is None:
            raise ValueError(f"reduction variants: {op} on {dt_in} declined")
        out.append(reduction_consts(code, **kw))
    # the chunk pass of the split sum, and a fused sum of squares (fast_run)
    code = reduce_code(Sum(axis=None).make_node(pt.matrix(dtype="float32")).op,
                       "float32", "float32")  # fmt: skip
    out.append(reduction_consts(code.chunk_code(), mode="row", tpo=32, nk=1, nr=1))
    fused = _fused_sum_of_squares()
    if fused is not None:
        out.append(reduction_consts(fused, mode="row", tpo=256, nk=1, nr=1))
    for dt, kw in [
        ("float32", dict(mode="row", tpo=32, nk=1, nr=1)),
        ("float32", dict(mode="row", tpo=256, nk=0, nr=2)),
        ("int64", dict(mode="col", tpo=256, nk=1, nr=1)),
    ]:
        out.append(argmax_consts(dt, **kw))
    return out


def fused_sum_of_squares(axis: tuple[int, ...] | None = (1,)) -> CAReduce:
    """The ``CAReduce(Composite)`` ``fast_run`` makes of ``sum(sqr(x), axis)``.

    Built as PyTensor's ``local_careduce_fusion`` builds it (that rewrite
    only runs with a C linker, as in the GPU mode): the composite takes the
    float64 accumulator and a float32 element and returns ``acc + sqr(x)``.
    """
    acc = ps.float64("acc")
    x = ps.float32("x")
    comp = ps.Composite([acc, x], [ps.add(acc, ps.sqr(x))])
    comp.identity = ps.add.identity
    comp.nin = 2
    comp.nout = 1
    return CAReduce(comp, axis=axis, acc_dtype="float64", dtype="float32")


def _fused_sum_of_squares() -> ReduceCode | None:
    return reduce_code(fused_sum_of_squares(), "float32", "float32")
