"""Elementwise GPU ops generated from PyTensor scalar ops: ``GpuElemwise``.

``GpuElemwise(scalar_op, inplace_pattern)`` is PyTensor's
:class:`~pytensor.tensor.elemwise.Elemwise` on GPU arrays. Its per-element C
code is the scalar op's own ``c_code`` (``Composite`` included, which is what
PyTensor's ``fast_run`` fusion makes of a training step's elementwise work),
substituted into ``kernels/elemwise.cu``; that template defines the numpy C
types and macros the scalar code expects (``npy_float32``, ``npy_bool``,
``NPY_INFINITY``, ``KERNEL``, ``WITHIN_KERNEL``...), and CUDA supplies
``exp``, ``fabs``, ``nan`` etc. as device functions.

Code generation rule
--------------------
For input dtypes ``d0..dk`` a scalar ``Apply`` is built with
``get_scalar_type(d)`` inputs and the scalar op's ``c_code(node, "cc2_node",
["cc2_in0", ...], ["cc2_out0", ...], {"fail": ..., "id": "cc2"})`` is taken,
with ``#ifdef KERNEL ... #else ... #endif`` reduced to its device branch.
The op is *not* lifted (the rule declines) when the scalar op has no C code,
when its code still refers to Python (``Py...``) or to the failure code,
when its support code defines host functions (only preprocessor lines or
code written for ``WITHIN_KERNEL`` are accepted), or when a dtype is not one
of bool, int8..uint64, float32, float64.

Kernels
-------
Dims where the output has extent 1 are dropped and adjacent dims whose
strides chain for every operand are merged. When one dim is left and each
operand has stride 1 or 0, the flat kernel (``..._c_<dt>``) indexes every
operand by the element index (or element 0 for a broadcast input); otherwise
the strided kernel (``..._nd<k>_<dt>``) peels the C-order index into
per-operand offsets (broadcast dims have stride 0). Kernel names are
``elemwise_<scalar op>_<hash8>_{c|nd<k>}_<dtype of output 0>``, the hash
covering the scalar code, the dtypes and the specialisation.

In place
--------
``inplace_pattern = {output: input}`` makes the output reuse the input's
buffer (``destroy_map``), as PyTensor's Elemwise does. The rewrite
:data:`gpu_inplace_elemwise` (database ``cc2ops_gpu_inplace``) applies
PyTensor's own in-place machinery (``InplaceGraphOptimizer``: only inputs no
other node needs afterwards, never protected inputs or function outputs,
validated by the destroy handler) to ``GpuElemwise`` nodes. At run time an
in-place target whose buffer overlaps itself (a zero stride on a dim of
extent > 1) is not written in place; a fresh output is returned instead.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor.scalar as ps
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.null_type import NullType
from pytensor.graph.utils import MethodNotDefined
from pytensor.misc.frozendict import frozendict
from pytensor.scalar import get_scalar_type
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.rewriting.elemwise import InplaceGraphOptimizer
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorConstant

from cc2ops.cuda.op import GpuOp, as_gpu_variable, common_device
from cc2ops.cuda.rewriting.lift import register_lift, to_gpu
from cc2ops.cuda.runtime import array
from cc2ops.cuda.runtime.compile import (
    get_kernel,
    kernel_cache,
    launch,
    register_variants,
)
from cc2ops.cuda.runtime.device import get_device
from cc2ops.cuda.type import CudaArrayConstant, CudaArrayType
from cc2ops.rewriting.db import gpu_inplace_db

__all__ = [
    "GpuElemwise",
    "ScalarCode",
    "SUPPORTED_DTYPES",
    "MAX_PARAM_BYTES",
    "scalar_code",
    "elemwise_consts",
    "collapse_dims",
    "gpu_input",
    "lift_elemwise",
    "GpuInplaceElemwiseOptimizer",
    "gpu_inplace_elemwise",
]

#: dtypes GpuElemwise handles (numpy names).
SUPPORTED_DTYPES = (
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
    "uint64", "float32", "float64",
)  # fmt: skip

#: Kernel parameter space a launch may use (CUDA's classic 4 KiB limit).
MAX_PARAM_BYTES = 4096

_BLOCK = 256
#: launch plans of GpuElemwise._run, by (device, code, shape, operand layouts)
_PLANS: dict[tuple, tuple] = kernel_cache()
_SHORT = {
    "bool": "b", "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16",
    "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64",
    "float32": "f32", "float64": "f64",
}  # fmt: skip
_FAIL_MARK = "CC2OPS_SCALAR_FAIL"
_KERNEL_BRANCH = re.compile(
    r"#\s*ifdef\s+KERNEL[ \t]*\n(.*?)\n[ \t]*#\s*else[ \t]*\n.*?\n[ \t]*#\s*endif",
    re.DOTALL,
)
_PYTHON_REF = re.compile(r"\bPy[A-Z_a-z]\w*|%\(")


@dataclass(frozen=True)
class ScalarCode:
    """The device C code of a scalar op for given input dtypes.

    Attributes
    ----------
    scalar_name : str
        Short lower-case name for kernel names (``add``, ``composite``...).
    in_dtypes, out_dtypes : tuple of str
    body : str
        Reads ``cc2_in<k>``, writes ``cc2_out<k>``.
    support : str
        Support code placed before the kernel.
    digest : str
        sha256 hex digest of the above (kernel names use 8 hex digits).
    """

    scalar_name: str
    in_dtypes: tuple[str, ...]
    out_dtypes: tuple[str, ...]
    body: str
    support: str
    digest: str


class _Declined(Exception):
    """A scalar op this back end cannot run (the reason is the message)."""


def _device_branches(code: str) -> str:
    """``#ifdef KERNEL a #else b #endif`` -> ``a`` (PyTensor's GPU convention)."""
    return _KERNEL_BRANCH.sub(lambda m: m.group(1), code)


def _support_ok(support: str) -> bool:
    """Whether support code is preprocessor-only or written for WITHIN_KERNEL."""
    if "WITHIN_KERNEL" in support:
        return True
    text = re.sub(r"/\*.*?\*/", "", support, flags=re.DOTALL)
    text = re.sub(r"//[^\n]*", "", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return all(ln.startswith("#") for ln in lines)


def _scalar_name(scalar_op: Any) -> str:
    name = type(scalar_op).__name__.lower()
    name = re.sub(r"[^a-z0-9]", "", name)[:24]
    return name or "op"


_code_lock = threading.Lock()
_code_cache: dict[tuple[Any, tuple[str, ...]], ScalarCode | str] = {}


def _generate(scalar_op: Any, in_dtypes: tuple[str, ...]) -> ScalarCode:
    for d in in_dtypes:
        if d not in SUPPORTED_DTYPES:
            raise _Declined(f"input dtype {d} is not supported on the GPU")
    try:
        node = scalar_op.make_node(*[get_scalar_type(d)() for d in in_dtypes])
    except (TypeError, ValueError, NotImplementedError) as e:
        raise _Declined(f"scalar make_node failed: {e}") from e
    out_dtypes = tuple(o.type.dtype for o in node.outputs)
    for d in out_dtypes:
        if d not in SUPPORTED_DTYPES:
            raise _Declined(f"output dtype {d} is not supported on the GPU")
    inames = [f"cc2_in{k}" for k in range(len(in_dtypes))]
    onames = [f"cc2_out{k}" for k in range(len(out_dtypes))]
    sub = {"fail": _FAIL_MARK, "id": "cc2"}
    try:
        body = scalar_op.c_code(node, "cc2_node", inames, onames, sub)
        support = scalar_op.c_support_code() or ""
        apply_support = scalar_op.c_support_code_apply(node, "cc2_node") or ""
    except (MethodNotDefined, NotImplementedError, TypeError, KeyError) as e:
        raise _Declined(f"{scalar_op} has no usable C code ({e})") from e
    body = _device_branches(body)
    if _FAIL_MARK in body or _PYTHON_REF.search(body):
        raise _Declined(f"the C code of {scalar_op} refers to Python or fails")
    support = "\n".join(s for s in (support.strip(), apply_support.strip()) if s)
    support = _device_branches(support)
    if not _support_ok(support) or _PYTHON_REF.search(support):
        raise _Declined(f"the support code of {scalar_op} defines host functions")
    name = _scalar_name(scalar_op)
    blob = "\0".join([name, ",".join(in_dtypes), ",".join(out_dtypes), body, support])
    digest = hashlib.sha256(blob.encode("utf-8")).hexdigest()
    return ScalarCode(name, in_dtypes, out_dtypes, body, support, digest)


def scalar_code(scalar_op: Any, in_dtypes: tuple[str, ...]) -> ScalarCode | None:
    """The :class:`ScalarCode` of ``scalar_op`` for ``in_dtypes``, else ``None``.

    ``None`` means the op cannot run on the GPU (see the module docstring);
    :func:`scalar_code_reason` says why. Memoised per (op, dtypes).
    """
    got = _lookup_code(scalar_op, tuple(in_dtypes))
    return got if isinstance(got, ScalarCode) else None


def scalar_code_reason(scalar_op: Any, in_dtypes: tuple[str, ...]) -> str | None:
    """Why :func:`scalar_code` declines ``scalar_op`` (``None`` when it does not)."""
    got = _lookup_code(scalar_op, tuple(in_dtypes))
    return None if isinstance(got, ScalarCode) else got


def _lookup_code(scalar_op: Any, in_dtypes: tuple[str, ...]) -> ScalarCode | str:
    key = (scalar_op, in_dtypes)
    with _code_lock:
        got = _code_cache.get(key)
    if got is None:
        try:
            got = _generate(scalar_op, in_dtypes)
        except _Declined as e:
            got = str(e)
        with _code_lock:
            _code_cache[key] = got
    return got


def elemwise_consts(
    code: ScalarCode, ndim: int, pattern: str = "", wide: bool = False
) -> dict[str, Any]:
    """Template constants (with the kernel name) for ``kernels/elemwise.cu``.

    Parameters
    ----------
    code : ScalarCode
    ndim : int
        0 for the flat kernel, else the number of collapsed dims.
    pattern : str
        Flat kernel: ``'c'``/``'s'`` per operand (inputs then outputs).
    wide : bool
        Strided kernel: 64-bit index arithmetic.
    """
    nops = len(code.in_dtypes) + len(code.out_dtypes)
    if ndim == 0:
        if len(pattern) != nops or set(pattern) - {"c", "s"}:
            raise ValueError(
                f"elemwise_consts: pattern must have one of 'c'/'s' per operand "
                f"({nops}), got {pattern!r}"
            )
        if "s" in pattern[len(code.in_dtypes) :]:
            raise ValueError("elemwise_consts: outputs are never broadcast")
        spec = f"{pattern}"
        wide = False
    else:
        pattern = "c" * nops
        spec = f"nd{ndim}_{'w' if wide else 'n'}"
    tag = hashlib.sha256(f"{code.digest}|{spec}".encode()).hexdigest()[:8]
    shape = "c" if ndim == 0 else f"nd{ndim}"
    name = f"elemwise_{code.scalar_name}_{tag}_{shape}_{_SHORT[code.out_dtypes[0]]}"
    return {
        "name": name,
        "in_dtypes": ",".join(code.in_dtypes),
        "out_dtypes": ",".join(code.out_dtypes),
        "body": code.body,
        "support": code.support,
        "ndim": int(ndim),
        "pattern": pattern,
        "wide": bool(wide),
    }


def param_bytes(nops: int, ndim: int) -> int:
    """Bytes of kernel parameters for ``nops`` operands over ``ndim`` dims."""
    return nops * 8 * (1 + ndim) + 8 * ndim + 8


# --------------------------------------------------------------------------
# geometry
# --------------------------------------------------------------------------


def collapse_dims(
    shape: tuple[int, ...], strides: list[list[int]]
) -> tuple[list[int], list[list[int]]]:
    """Drop extent-1 dims and merge chained dims of ``shape`` for every operand.

    Parameters
    ----------
    shape : tuple of int
        The output shape (C order).
    strides : list of list of int
        Per operand, its element strides (0 on broadcast dims).

    Returns
    -------
    extents : list of int
        Collapsed extents, outermost first (empty for a single element).
    strides : list of list of int
        Per operand, the collapsed strides.

    Notes
    -----
    Dim ``d + 1`` merges into dim ``d`` when, for every operand,
    ``stride[d] == stride[d + 1] * shape[d + 1]`` (zero strides chain with
    zero strides, so broadcast dims merge with each other).
    """
    keep = [d for d, n in enumerate(shape) if n != 1]
    extents: list[int] = []
    out: list[list[int]] = [[] for _ in strides]
    for d in keep:
        n = shape[d]
        if extents and all(
            s_op[-1] == st[d] * n for s_op, st in zip(out, strides, strict=True)
        ):
            extents[-1] *= n
            for s_op, st in zip(out, strides, strict=True):
                s_op[-1] = st[d]
            continue
        extents.append(n)
        for s_op, st in zip(out, strides, strict=True):
            s_op.append(st[d])
    return extents, out


def _elem_strides(garray: Any, bcast_to: tuple[int, ...]) -> list[int] | None:
    """Element strides of ``garray`` broadcast to ``bcast_to`` (None: unaligned)."""
    itemsize = np.dtype(garray.dtype).itemsize
    out = []
    for n, s, want in zip(garray.shape, garray.strides, bcast_to, strict=True):
        if n == 1 and want != 1:
            out.append(0)
            continue
        if n == 1:
            out.append(0)
            continue
        if s % itemsize:
            return None
        out.append(int(s) // itemsize)
    return out


def _self_overlapping(garray: Any) -> bool:
    """Whether some element of ``garray`` is reachable by two indices (stride 0)."""
    return any(
        n > 1 and s == 0 for n, s in zip(garray.shape, garray.strides, strict=True)
    )


def _broadcast_shape(op: str, node: Apply, inputs: list[Any]) -> tuple[int, ...]:
    ndim = node.outputs[0].type.ndim
    shape = []
    for d in range(ndim):
        extent = 1
        for x in inputs:
            n = int(x.shape[d])
            if n == 1:
                continue
            if extent != 1 and n != extent:
                raise ValueError(
                    f"{op}: input shapes {[tuple(i.shape) for i in inputs]} do not "
                    f"broadcast (dim {d}: {extent} vs {n})"
                )
            extent = n
        for k, x in enumerate(inputs):
            if int(x.shape[d]) == 1 and extent != 1:
                if node.inputs[k].type.shape[d] != 1:
                    raise ValueError(
                        f"{op}: runtime broadcasting is not allowed: input {k} has "
                        f"extent 1 on dim {d} (output {extent}) but its type "
                        f"{node.inputs[k].type} does not declare it broadcastable"
                    )
        shape.append(extent)
    return tuple(shape)


# --------------------------------------------------------------------------
# the op
# --------------------------------------------------------------------------


def gpu_input(var: Variable, device: int) -> Variable:
    """``var`` on ``device`` for a lifting rule; tensor constants become GPU constants.

    A ``TensorConstant`` becomes a :class:`~cc2ops.cuda.type.CudaArrayConstant`
    (uploaded once, when a function is linked) instead of a per-call
    ``gpu_from_host``.
    """
    if isinstance(var, TensorConstant):
        return CudaArrayConstant(
            CudaArrayType(var.type.dtype, var.type.shape, device), var.data
        )
    return to_gpu(var, device)


def _host_like(var: Variable) -> Variable:
    return TensorType(var.type.dtype, var.type.shape)()


class GpuElemwise(GpuOp):
    """PyTensor's ``Elemwise(scalar_op)`` on GPU arrays.

    Parameters
    ----------
    scalar_op : pytensor.scalar.ScalarOp
        Any scalar op with C code (``Composite`` and ``Cast`` included).
    inplace_pattern : dict of int to int, optional
        ``{output index: input index}``: the output overwrites that input
        (same dtype and static shape).

    Notes
    -----
    Inputs are GPU variables with the same number of dims (the host
    ``Elemwise`` has already inserted the broadcasting ``DimShuffle``s);
    extents of 1 broadcast only where the input's type declares them
    (PyTensor forbids runtime broadcasting). Several outputs are computed
    by one kernel. See the module docstring for code generation and the
    launch-parameter limit (:data:`MAX_PARAM_BYTES`).
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("scalar_op", "inplace_pattern")

    def __init__(self, scalar_op: Any, inplace_pattern: dict[int, int] | None = None):
        if not isinstance(scalar_op, ps.ScalarOp):
            raise TypeError(
                f"GpuElemwise: scalar_op must be a pytensor ScalarOp, got "
                f"{type(scalar_op).__name__}"
            )
        pattern = dict(inplace_pattern or {})
        for o, i in pattern.items():
            if not (isinstance(o, int) and isinstance(i, int)) or o < 0 or i < 0:
                raise ValueError(
                    f"GpuElemwise: inplace_pattern must map output indices to input "
                    f"indices, got {pattern}"
                )
        if len(set(pattern.values())) != len(pattern):
            raise ValueError(
                f"GpuElemwise: two outputs cannot overwrite one input, got {pattern}"
            )
        self.scalar_op = scalar_op
        self.inplace_pattern = frozendict(pattern)
        self.destroy_map = {o: [i] for o, i in pattern.items()}
        super().__init__()

    def make_node(self, *inputs: Any) -> Apply:
        op = "GpuElemwise"
        if not inputs:
            raise TypeError(f"{op}: needs at least one input")
        inputs = [
            as_gpu_variable(x, op=op, role=f"input {k}") for k, x in enumerate(inputs)
        ]
        device = common_device(op, *inputs)
        ndims = {x.type.ndim for x in inputs}
        if len(ndims) != 1:
            raise TypeError(
                f"{op}: inputs must have the same number of dims (broadcast with "
                f"DimShuffle first), got {[x.type.ndim for x in inputs]}"
            )
        try:
            host = Elemwise(self.scalar_op).make_node(*[_host_like(x) for x in inputs])
        except (TypeError, ValueError) as e:
            raise type(e)(f"{op}: {e}") from e
        outputs = [
            CudaArrayType(o.type.dtype, o.type.shape, device)() for o in host.outputs
        ]
        for o, i in self.inplace_pattern.items():
            if o >= len(outputs) or i >= len(inputs):
                raise ValueError(
                    f"{op}: inplace_pattern {dict(self.inplace_pattern)} names output "
                    f"{o} or input {i}, but the node has {len(outputs)} outputs and "
                    f"{len(inputs)} inputs"
                )
            if inputs[i].type != outputs[o].type:
                raise TypeError(
                    f"{op}: output {o} ({outputs[o].type}) cannot overwrite input {i} "
                    f"({inputs[i].type}): dtype and static shape must match"
                )
        return Apply(self, inputs, outputs)

    # code -------------------------------------------------------------
    def code_for(self, node: Apply) -> ScalarCode:
        """The scalar device code of ``node`` (``ValueError`` when unavailable)."""
        dtypes = tuple(x.type.dtype for x in node.inputs)
        code = scalar_code(self.scalar_op, dtypes)
        if code is None:
            raise ValueError(
                f"GpuElemwise: {self.scalar_op} cannot run on the GPU: "
                f"{scalar_code_reason(self.scalar_op, dtypes)}"
            )
        return code

    def perform(self, node: Apply, inputs: list[Any], outputs: list[list[Any]]) -> None:
        device = self.device_of(node)
        code = self.code_for(node)
        shape = _broadcast_shape("GpuElemwise", node, inputs)
        inputs = list(inputs)
        results: list[Any] = []
        for o, var in enumerate(node.outputs):
            i = self.inplace_pattern.get(o)
            if i is not None and not _self_overlapping(inputs[i]):
                results.append(inputs[i])
            else:
                results.append(array.empty(shape, var.type.dtype, device))
        n = int(np.prod(shape, dtype=np.int64))
        if n:
            self._run(code, shape, inputs, results, device)
        for o, r in enumerate(results):
            outputs[o][0] = r

    def _run(
        self,
        code: ScalarCode,
        shape: tuple[int, ...],
        inputs: list[Any],
        results: list[Any],
        device: int,
    ) -> None:
        operands = inputs + results
        # the launch plan depends only on the scalar code and the operands'
        # shapes and strides: memoised, so a steady-state call only gathers
        # pointers (the plan says which operands need a contiguous copy)
        key = (
            device,
            code.digest,
            shape,
            tuple((a.shape, a.strides) for a in operands),
        )
        plan = _PLANS.get(key)
        if plan is None:
            plan = self._plan(code, shape, operands, len(inputs), device)
            if len(_PLANS) > 4096:
                _PLANS.clear()
            _PLANS[key] = plan
        fn, grid, copy, per_operand, tail = plan
        args: list[Any] = []
        for k, a in enumerate(operands):
            if k in copy:
                a = array.ascontiguous(a, device)
            args.append(a)
            args.extend(per_operand[k])
        args.extend(tail)
        launch(fn, grid, _BLOCK, args, device)

    def _plan(
        self,
        code: ScalarCode,
        shape: tuple[int, ...],
        operands: list[Any],
        nin: int,
        device: int,
    ) -> tuple:
        """(kernel, grid, operands to copy, per-operand stride arguments, tail)."""
        strides = []
        copy = set()
        for k, a in enumerate(operands):
            st = _elem_strides(a, shape)
            if st is None:
                if k >= nin:
                    raise ValueError(
                        "GpuElemwise: an output's strides are not a multiple of its "
                        "itemsize"
                    )
                copy.add(k)
                st = _elem_strides(array.ascontiguous(a, device), shape)
            strides.append(st)
        extents, cstrides = collapse_dims(shape, strides)
        n = int(np.prod(shape, dtype=np.int64))
        dev = get_device(device)
        grid = max(1, min((n + _BLOCK - 1) // _BLOCK, dev.multiprocessors * 32))
        if len(extents) <= 1 and all(not s or s[0] in (0, 1) for s in cstrides):
            pattern = "".join(
                "c" if (s and s[0] == 1) or not extents else "s" for s in cstrides
            )
            consts = elemwise_consts(code, 0, pattern)
            per_operand: list[tuple] = [() for _ in operands]
            tail: tuple = (np.int64(n),)
        else:
            ndim = len(extents)
            if param_bytes(len(operands), ndim) > MAX_PARAM_BYTES:
                raise ValueError(
                    f"GpuElemwise: {len(operands)} operands over {ndim} dims need "
                    f"{param_bytes(len(operands), ndim)} bytes of kernel parameters "
                    f"(limit {MAX_PARAM_BYTES})"
                )
            wide = n >= 2**31 or any(e >= 2**31 for e in extents)
            consts = elemwise_consts(code, ndim, wide=wide)
            per_operand = [tuple(np.int64(v) for v in s) for s in cstrides]
            tail = (*(np.int64(e) for e in extents), np.int64(n))
        fn = get_kernel("elemwise", device, **consts)
        return fn, grid, frozenset(copy), per_operand, tail

    # graph ------------------------------------------------------------
    def _infer_shape(self, node: Apply, input_shapes: list[Any]) -> list[Any]:
        ndim = node.outputs[0].type.ndim
        shape = []
        for d in range(ndim):
            # the first non-broadcast input's extent, a static one if any
            dim: Any = 1
            found = False
            for x, s in zip(node.inputs, input_shapes, strict=True):
                static = x.type.shape[d]
                if static == 1:
                    continue
                if not found or static is not None:
                    dim, found = s[d], True
                if static is not None:
                    break
            shape.append(dim)
        return [tuple(shape)] * len(node.outputs)

    def pullback(self, inputs, outputs, cotangents):
        from cc2ops.cuda.transfer import as_gpu, as_host

        device = self.device_of_var(inputs[0])
        host_in = [as_host(x) for x in inputs]
        host_out = Elemwise(self.scalar_op).make_node(*host_in).outputs
        host_g = [
            g if isinstance(g.type, (DisconnectedType, NullType)) else as_host(g)
            for g in cotangents
        ]
        grads = Elemwise(self.scalar_op).pullback(host_in, host_out, host_g)
        out = []
        for x, g in zip(inputs, grads, strict=True):
            if isinstance(g.type, (DisconnectedType, NullType)) or not isinstance(
                g.type, TensorType
            ):
                out.append(g)
            elif g.type.dtype != x.type.dtype:
                out.append(as_gpu(g.astype(x.type.dtype), device))
            else:
                out.append(as_gpu(g, device))
        return out

    def __str__(self) -> str:
        inplace = (
            f", inplace={dict(self.inplace_pattern)}" if self.inplace_pattern else ""
        )
        return f"GpuElemwise{{{self.scalar_op}{inplace}}}"


# --------------------------------------------------------------------------
# lifting and the in-place rewrite
# --------------------------------------------------------------------------


@register_lift(Elemwise)
def lift_elemwise(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Elemwise(op)(host_from_gpu(x), ...) -> host_from_gpu(GpuElemwise(op)(x,...))``.

    Declines (returns ``None``) when the scalar op has no device C code (see
    the module docstring), when the launch parameters would exceed
    :data:`MAX_PARAM_BYTES`, and for 0-d arithmetic none of whose inputs comes
    from the GPU (shape arithmetic stays on the host). The host op's in-place
    pattern is dropped; the in-place rewrite decides again on the GPU graph.
    """
    from cc2ops.cuda.transfer import HostFromGpu

    op = node.op
    dtypes = tuple(x.type.dtype for x in node.inputs)
    if scalar_code(op.scalar_op, dtypes) is None:
        return None
    ndim = node.outputs[0].type.ndim
    if param_bytes(len(node.inputs) + len(node.outputs), ndim) > MAX_PARAM_BYTES:
        return None
    if ndim == 0 and not any(
        x.owner is not None and isinstance(x.owner.op, HostFromGpu) for x in node.inputs
    ):
        return None
    gpu_inputs = [gpu_input(x, device) for x in node.inputs]
    outs = GpuElemwise(op.scalar_op)(*gpu_inputs, return_list=True)
    return list(outs)


class GpuInplaceElemwiseOptimizer(InplaceGraphOptimizer):
    """PyTensor's in-place Elemwise rewriter, applied to :class:`GpuElemwise`.

    ``GpuElemwise(op)(x, y) -> GpuElemwise(op, {0: 0})(x, y)`` when ``x`` has
    the output's type, is no constant, no protected input (function inputs
    that are not being updated) or function output, and no other node reads
    ``x`` (or a view of it) later; the destroy handler validates each
    replacement. Update pairs (``p <- f(p, ...)``) are tried first, so
    parameter and momentum updates write their buffers in place.
    """

    op = GpuElemwise

    def filter_candidate_pairs(self, fgraph, node, protected_inputs):
        from pytensor.graph.destroyhandler import inplace_candidates

        candidates = [
            (node.inputs.index(inp), inp)
            for inp in inplace_candidates(
                fgraph, node.inputs, protected_inputs=protected_inputs
            )
        ]
        return [
            ((o, out), (i, inp))
            for o, out in enumerate(node.outputs)
            for i, inp in candidates
            if inp.type == out.type and not isinstance(inp, Constant)
        ]

    def create_inplace_node(self, node, inplace_pattern):
        pattern = {o: i for o, [i] in inplace_pattern.items()}
        try:
            return GpuElemwise(node.op.scalar_op, pattern).make_node(*node.inputs)
        except (TypeError, ValueError):
            return node

    def __str__(self) -> str:
        return "gpu_inplace_elemwise"


#: The in-place rewrite of GpuElemwise (database ``cc2ops_gpu_inplace``).
gpu_inplace_elemwise = GpuInplaceElemwiseOptimizer()
gpu_inplace_db.register(
    "gpu_inplace_elemwise", gpu_inplace_elemwise, "cc2ops_gpu", "inplace"
)


# --------------------------------------------------------------------------
# variants for the compile test
# --------------------------------------------------------------------------


def _training_composites() -> list[tuple[Any, tuple[str, ...]]]:
    """Composites PyTensor's fast_run fusion makes of a small training step."""
    import pytensor
    import pytensor.tensor as pt
    from pytensor.compile.mode import Mode

    x = pt.matrix("x", dtype="float32")
    w = pt.matrix("w", dtype="float32")
    b = pt.vector("b", dtype="float32")
    v = pt.matrix("v", dtype="float32")
    h = pt.maximum(x @ w + b, 0)
    cost = pt.sqr(h).mean() + np.float32(1e-4) * pt.sqr(w).sum()
    gw = pytensor.grad(cost, w)
    v_new = np.float32(0.9) * v - np.float32(0.01) * gw
    w_new = w + v_new
    mode = Mode(linker="py", optimizer="fast_run").excluding("inplace")
    fg = pytensor.function([x, w, b, v], [w_new, v_new, cost], mode=mode).maker.fgraph
    found = []
    for n in fg.toposort():
        if isinstance(n.op, Elemwise) and isinstance(n.op.scalar_op, ps.Composite):
            found.append((n.op.scalar_op, tuple(i.type.dtype for i in n.inputs)))
    return found


def _basic_scalar_ops() -> list[tuple[Any, tuple[str, ...]]]:
    f, b, i = "float32", "bool", "int64"
    return [
        (ps.add, (f, f)),
        (ps.mul, (f, f, f)),
        (ps.sub, (f, f)),
        (ps.true_div, (f, f)),
        (ps.exp, (f,)),
        (ps.log, (f,)),
        (ps.sqr, (f,)),
        (ps.sqrt, (f,)),
        (ps.maximum, (f, f)),
        (ps.switch, (b, f, f)),
        (ps.gt, (f, f)),
        (ps.ge, (f, f)),
        (ps.eq, (i, i)),
        (ps.neg, (f,)),
        (ps.Cast(ps.float32), (i,)),
        (ps.Cast(ps.int64), (f,)),
        (ps.int_div, (i, i)),
        (ps.abs, (i,)),
        (ps.sigmoid, ("float64",)),
        (ps.softplus, (f,)),
    ]


@register_variants("elemwise")
def _elemwise_variants() -> list[dict[str, Any]]:
    out = []
    for k, (op, dtypes) in enumerate(_basic_scalar_ops() + _training_composites()):
        code = scalar_code(op, dtypes)
        if code is None:
            raise ValueError(
                f"elemwise variants: {op} {dtypes} declined: "
                f"{scalar_code_reason(op, dtypes)}"
            )
        nops = len(code.in_dtypes) + len(code.out_dtypes)
        # alternate the flat path (first input broadcast) and strided paths
        if k % 3 == 0:
            pattern = "s" + "c" * (nops - 1) if len(code.in_dtypes) > 1 else "c" * nops
            out.append(elemwise_consts(code, 0, pattern))
        else:
            out.append(elemwise_consts(code, 1 + k % 4, wide=(k % 2 == 0)))
    return out
