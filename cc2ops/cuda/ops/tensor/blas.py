"""Matrix products on the GPU through cuBLAS: GpuDot22, GpuDot, GpuGemm, ...

Each op is PyTensor's host BLAS op of the same name on GPU arrays, computed
with :func:`cc2ops.cuda.libs.cublas.gemm` / :func:`~cc2ops.cuda.libs.cublas.gemv` /
:func:`~cc2ops.cuda.libs.cublas.gemm_strided_batched`:

=================  =========================================  =================
host op            computes                                   GPU op
=================  =========================================  =================
``Dot22``          ``x @ y``                                  GpuDot22
``Dot`` (2-d)      ``x @ y``                                  GpuDot
``Dot22Scalar``    ``a * x @ y``                              GpuDot22Scalar
``Gemm``           ``b * z + a * x @ y``                      GpuGemm
``Gemv``           ``b * y + a * A @ x``                      GpuGemv
``Ger``            ``A + a * outer(x, y)``                    GpuGer
``BatchedDot``     ``x[i] @ y[i]``                            GpuBatchedDot
=================  =========================================  =================

(``Ger`` exists in PyTensor 3.0, not in 3.3; ``CGemv``/``CGer`` are matched
through their base classes.)

Transposes are folded into the cuBLAS call: an operand that is a
:class:`~cc2ops.cuda.ops.tensor.basic.GpuDimShuffle` transpose is, at run time, a
transposed strided view, and :func:`~cc2ops.cuda.libs.cublas.gemm` passes the
untransposed matrix with the transpose flag instead of copying it (as it
does for row-strided views of wider matrices). No transpose kernel runs for
``Dot22(x.T, y)``, which is what weight gradients are made of.

Precision: float32 products follow :func:`cc2ops.cuda.get_allow_tf32` when
they run. Scalars (``a``, ``b``) are host 0-d tensors.

In place: the lifting rules build the non-destructive ops; the rewrite
:data:`gpu_inplace_blas` (database ``cc2ops_gpu_inplace``) makes GpuGemm,
GpuGemv and GpuGer overwrite their accumulator input when PyTensor's destroy
handler allows it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor.tensor as pt
import pytensor.tensor.blas as _blas
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.rewriting.basic import (
    WalkingGraphRewriter,
    copy_stack_trace,
    node_rewriter,
)
from pytensor.tensor.math import Dot

from cc2ops._op import same_dtype
from cc2ops.cuda.libs import cublas as blas
from cc2ops.cuda.op import GpuOp, common_device, gpu_float_variable
from cc2ops.cuda.ops.tensor.basic import (
    GpuDimShuffle,
    gpu_constant_or_transfer,
    make_view,
)
from cc2ops.cuda.rewriting.lift import register_lift
from cc2ops.cuda.runtime import array
from cc2ops.cuda.transfer import as_gpu_cotangent
from cc2ops.cuda.type import CudaArrayType
from cc2ops.rewriting.db import gpu_inplace_db

__all__ = [
    "GpuDot22",
    "GpuDot",
    "GpuDot22Scalar",
    "GpuGemm",
    "GpuGemv",
    "GpuGer",
    "GpuBatchedDot",
    "gpu_transpose",
    "gpu_inplace_blas",
]

FLOAT_DTYPES = ("float32", "float64")

_Ger = getattr(_blas, "Ger", None)


def _check_inner(op: str, a: int | None, b: int | None, what: str) -> None:
    if a is not None and b is not None and a != b:
        raise ValueError(f"{op}: {what} differ: {a} and {b}")


def _host_scalar(op: str, role: str, v: Any) -> Variable:
    v = pt.as_tensor_variable(v)
    if v.type.ndim != 0:
        raise TypeError(f"{op}: {role} must be a 0-d tensor, got {v.type}")
    return v


def _value(v: Any) -> float:
    return float(np.asarray(v).item())


def gpu_transpose(x: Variable) -> Variable:
    """The 2-D transpose of a GPU matrix as a view (``GpuDimShuffle{1,0}``)."""
    return GpuDimShuffle(input_ndim=2, new_order=(1, 0))(x)


# --------------------------------------------------------------------------
# products without an accumulator
# --------------------------------------------------------------------------


class _GpuMatMul(GpuOp):
    """``x @ y`` of two GPU matrices (x (m, k), y (k, n) -> (m, n))."""

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ()
    _name = "GpuDot22"

    def make_node(self, x: Any, y: Any) -> Apply:
        op = self._name
        x = gpu_float_variable(op, "x", x, 2, "(m, k)")
        y = gpu_float_variable(op, "y", y, 2, "(k, n)")
        device = common_device(op, x, y)
        dtype = same_dtype(op, x=x, y=y)
        _check_inner(op, x.type.shape[1], y.type.shape[0], "inner dimensions")
        out = CudaArrayType(dtype, (x.type.shape[0], y.type.shape[1]), device)()
        return Apply(self, [x, y], [out])

    def perform(self, node, inputs, outputs):
        x, y = inputs
        outputs[0][0] = blas.gemm(x, y, device=self.device_of(node))

    def _infer_shape(self, node, input_shapes):
        (m, _), (_, n) = input_shapes
        return [(m, n)]

    def pullback(self, inputs, outputs, cotangents):
        x, y = inputs
        (g,) = cotangents
        g = as_gpu_cotangent(g, self.device_of_var(x))
        return [
            type(self)()(g, gpu_transpose(y)),
            type(self)()(gpu_transpose(x), g),
        ]


class GpuDot22(_GpuMatMul):
    """PyTensor's ``Dot22`` on GPU matrices: ``x @ y`` (cuBLAS GEMM).

    Notes
    -----
    x (m, k) and y (k, n), float32 or float64 of one dtype. Transposed and
    row-strided views are passed to cuBLAS as they are (no copy).
    """

    _name = "GpuDot22"


class GpuDot(_GpuMatMul):
    """PyTensor's (2-d) ``Dot`` on GPU matrices: ``x @ y`` (see GpuDot22)."""

    _name = "GpuDot"


class GpuDot22Scalar(GpuOp):
    """PyTensor's ``Dot22Scalar``: ``a * x @ y`` with a host scalar ``a``.

    Notes
    -----
    x (m, k), y (k, n) GPU matrices of one float dtype.
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ()

    def make_node(self, x: Any, y: Any, a: Any) -> Apply:
        op = "GpuDot22Scalar"
        x = gpu_float_variable(op, "x", x, 2, "(m, k)")
        y = gpu_float_variable(op, "y", y, 2, "(k, n)")
        device = common_device(op, x, y)
        dtype = same_dtype(op, x=x, y=y)
        _check_inner(op, x.type.shape[1], y.type.shape[0], "inner dimensions")
        a = _host_scalar(op, "a", a)
        out = CudaArrayType(dtype, (x.type.shape[0], y.type.shape[1]), device)()
        return Apply(self, [x, y, a], [out])

    def perform(self, node, inputs, outputs):
        x, y, a = inputs
        outputs[0][0] = blas.gemm(x, y, alpha=_value(a), device=self.device_of(node))

    def _infer_shape(self, node, input_shapes):
        return [(input_shapes[0][0], input_shapes[1][1])]


class GpuBatchedDot(GpuOp):
    """PyTensor's ``BatchedDot``: ``x[i] @ y[i]`` (cuBLAS strided batched GEMM).

    Notes
    -----
    x (batch, m, k), y (batch, k, n), one float dtype.
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ()

    def make_node(self, x: Any, y: Any) -> Apply:
        op = "GpuBatchedDot"
        x = gpu_float_variable(op, "x", x, 3, "(batch, m, k)")
        y = gpu_float_variable(op, "y", y, 3, "(batch, k, n)")
        device = common_device(op, x, y)
        dtype = same_dtype(op, x=x, y=y)
        _check_inner(op, x.type.shape[0], y.type.shape[0], "batch sizes")
        _check_inner(op, x.type.shape[2], y.type.shape[1], "inner dimensions")
        b = x.type.shape[0] if x.type.shape[0] is not None else y.type.shape[0]
        out = CudaArrayType(dtype, (b, x.type.shape[1], y.type.shape[2]), device)()
        return Apply(self, [x, y], [out])

    def perform(self, node, inputs, outputs):
        x, y = inputs
        if int(x.shape[0]) != int(y.shape[0]):
            raise ValueError(
                f"GpuBatchedDot: batch sizes differ: {x.shape[0]} and {y.shape[0]}"
            )
        outputs[0][0] = blas.gemm_strided_batched(x, y, device=self.device_of(node))

    def _infer_shape(self, node, input_shapes):
        (b, m, _), (_, _, n) = input_shapes
        return [(b, m, n)]


# --------------------------------------------------------------------------
# products with an accumulator (in place after the in-place rewrite)
# --------------------------------------------------------------------------


def _accumulator(z: Any, inplace: bool, beta: float, device: int) -> Any:
    """The output buffer: ``z`` itself, a copy of it, or (beta == 0) a fresh one."""
    if inplace:
        return z
    if beta == 0:
        return array.empty(z.shape, z.dtype, device)
    return array.copy(z, device)


def _writable_matrix(c: Any) -> bool:
    """Whether cuBLAS can write ``c`` in place (unit stride along one axis)."""
    itemsize = np.dtype(c.dtype).itemsize
    r, k = (int(s) for s in c.shape)
    s0, s1 = (int(s) for s in c.strides)
    return (
        (k == 1 or s1 == itemsize)
        and (r == 1 or s0 >= k * itemsize)
        or ((r == 1 or s0 == itemsize) and (k == 1 or s1 >= r * itemsize))
    )


class GpuGemm(GpuOp):
    """PyTensor's ``Gemm``: ``b * z + a * x @ y`` on GPU matrices.

    Parameters
    ----------
    inplace : bool
        Overwrite ``z`` (``destroy_map``); set by :data:`gpu_inplace_blas`.

    Notes
    -----
    z (m, n), x (m, k), y (k, n): one float dtype; ``a`` and ``b`` are host
    scalars. With ``b == 0`` the old ``z`` is not read (NaNs in it do not
    propagate), as in BLAS. A ``z`` view cuBLAS cannot write is copied even
    in place.
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False) -> None:
        self.inplace = bool(inplace)
        self.destroy_map = {0: [0]} if self.inplace else {}

    def make_node(self, z: Any, a: Any, x: Any, y: Any, b: Any) -> Apply:
        op = "GpuGemm"
        z = gpu_float_variable(op, "z", z, 2, "(m, n)")
        x = gpu_float_variable(op, "x", x, 2, "(m, k)")
        y = gpu_float_variable(op, "y", y, 2, "(k, n)")
        common_device(op, z, x, y)
        same_dtype(op, z=z, x=x, y=y)
        _check_inner(op, x.type.shape[1], y.type.shape[0], "inner dimensions")
        _check_inner(op, z.type.shape[0], x.type.shape[0], "rows of z and x")
        _check_inner(op, z.type.shape[1], y.type.shape[1], "columns of z and y")
        a = _host_scalar(op, "a", a)
        b = _host_scalar(op, "b", b)
        return Apply(self, [z, a, x, y, b], [z.type()])

    def perform(self, node, inputs, outputs):
        z, a, x, y, b = inputs
        device = self.device_of(node)
        beta = _value(b)
        c = _accumulator(z, self.inplace, beta, device)
        if not _writable_matrix(c):
            c = array.copy(c, device)
        blas.gemm(x, y, c, alpha=_value(a), beta=beta, device=device)
        outputs[0][0] = c

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]

    def __str__(self) -> str:
        return f"GpuGemm{{{'inplace' if self.inplace else 'no_inplace'}}}"


class GpuGemv(GpuOp):
    """PyTensor's ``Gemv``: ``b * y + a * A @ x`` on GPU arrays.

    Parameters
    ----------
    inplace : bool
        Overwrite ``y`` (``destroy_map``).

    Notes
    -----
    y (m,), A (m, n), x (n,): one float dtype; ``a``, ``b`` host scalars.
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False) -> None:
        self.inplace = bool(inplace)
        self.destroy_map = {0: [0]} if self.inplace else {}

    def make_node(self, y: Any, alpha: Any, A: Any, x: Any, beta: Any) -> Apply:  # noqa: N803
        op = "GpuGemv"
        y = gpu_float_variable(op, "y", y, 1, "(m,)")
        A = gpu_float_variable(op, "A", A, 2, "(m, n)")  # noqa: N806
        x = gpu_float_variable(op, "x", x, 1, "(n,)")
        common_device(op, y, A, x)
        same_dtype(op, y=y, A=A, x=x)
        _check_inner(op, A.type.shape[1], x.type.shape[0], "columns of A and x")
        _check_inner(op, A.type.shape[0], y.type.shape[0], "rows of A and y")
        alpha = _host_scalar(op, "alpha", alpha)
        beta = _host_scalar(op, "beta", beta)
        return Apply(self, [y, alpha, A, x, beta], [y.type()])

    def perform(self, node, inputs, outputs):
        y, alpha, A, x, beta = inputs  # noqa: N806
        device = self.device_of(node)
        b = _value(beta)
        out = _accumulator(y, self.inplace, b, device)
        s = int(out.strides[0]) if out.shape[0] > 1 else np.dtype(out.dtype).itemsize
        if s <= 0 or s % np.dtype(out.dtype).itemsize:
            out = array.copy(out, device)
        blas.gemv(A, x, out, alpha=_value(alpha), beta=b, device=device)
        outputs[0][0] = out

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]

    def __str__(self) -> str:
        return f"GpuGemv{{{'inplace' if self.inplace else 'no_inplace'}}}"


class GpuGer(GpuOp):
    """PyTensor's ``Ger``: ``A + alpha * outer(x, y)`` (a rank-1 GEMM).

    Parameters
    ----------
    destructive : bool
        Overwrite ``A`` (``destroy_map``).

    Notes
    -----
    A (m, n), x (m,), y (n,): one float dtype; ``alpha`` a host scalar.
    """

    tape_replay = True  # replayed from launch tapes (cc2ops.cuda.runtime.tape)

    __props__ = ("destructive",)

    def __init__(self, destructive: bool = False) -> None:
        self.destructive = bool(destructive)
        self.destroy_map = {0: [0]} if self.destructive else {}

    def make_node(self, A: Any, alpha: Any, x: Any, y: Any) -> Apply:  # noqa: N803
        op = "GpuGer"
        A = gpu_float_variable(op, "A", A, 2, "(m, n)")  # noqa: N806
        x = gpu_float_variable(op, "x", x, 1, "(m,)")
        y = gpu_float_variable(op, "y", y, 1, "(n,)")
        common_device(op, A, x, y)
        same_dtype(op, A=A, x=x, y=y)
        _check_inner(op, A.type.shape[0], x.type.shape[0], "rows of A and x")
        _check_inner(op, A.type.shape[1], y.type.shape[0], "columns of A and y")
        alpha = _host_scalar(op, "alpha", alpha)
        return Apply(self, [A, alpha, x, y], [A.type()])

    def perform(self, node, inputs, outputs):
        A, alpha, x, y = inputs  # noqa: N806
        device = self.device_of(node)
        c = A if self.destructive else array.copy(A, device)
        if not _writable_matrix(c):
            c = array.copy(c, device)
        m, n = int(x.shape[0]), int(y.shape[0])
        sx = int(x.strides[0]) if m > 1 else np.dtype(x.dtype).itemsize
        sy = int(y.strides[0]) if n > 1 else np.dtype(y.dtype).itemsize
        col = make_view(x, (m, 1), (sx, sx))
        row = make_view(y, (1, n), (sy * n, sy))
        blas.gemm(col, row, c, alpha=_value(alpha), beta=1.0, device=device)
        outputs[0][0] = c

    def _infer_shape(self, node, input_shapes):
        return [input_shapes[0]]


# --------------------------------------------------------------------------
# lifting rules
# --------------------------------------------------------------------------


def _floats(*vs: Variable) -> bool:
    dts = {v.type.dtype for v in vs}
    return len(dts) == 1 and dts.pop() in FLOAT_DTYPES


@register_lift(_blas.Dot22)
def lift_dot22(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Dot22(host_from_gpu(x), y) -> host_from_gpu(GpuDot22(x, gpu(y)))``."""
    x, y = node.inputs
    if not _floats(x, y):
        return None
    return [GpuDot22()(*(gpu_constant_or_transfer(v, device) for v in (x, y)))]


@register_lift(Dot)
def lift_dot(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Dot(x, y) -> GpuDot(gpu(x), gpu(y))`` for 2-d float operands of one dtype."""
    x, y = node.inputs
    if x.type.ndim != 2 or y.type.ndim != 2 or not _floats(x, y):
        return None
    return [GpuDot()(*(gpu_constant_or_transfer(v, device) for v in (x, y)))]


@register_lift(_blas.Dot22Scalar)
def lift_dot22scalar(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Dot22Scalar(x, y, a) -> GpuDot22Scalar(gpu(x), gpu(y), a)``."""
    x, y, a = node.inputs
    if not _floats(x, y):
        return None
    gx, gy = (gpu_constant_or_transfer(v, device) for v in (x, y))
    return [GpuDot22Scalar()(gx, gy, a)]


@register_lift(_blas.BatchedDot)
def lift_batched_dot(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``BatchedDot(x, y) -> GpuBatchedDot(gpu(x), gpu(y))`` for 3-d floats."""
    x, y = node.inputs
    if x.type.ndim != 3 or y.type.ndim != 3 or not _floats(x, y):
        return None
    return [GpuBatchedDot()(*(gpu_constant_or_transfer(v, device) for v in (x, y)))]


@register_lift(_blas.Gemm)
def lift_gemm(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Gemm(z, a, x, y, b) -> GpuGemm(gpu(z), a, gpu(x), gpu(y), b)`` (no inplace)."""
    z, a, x, y, b = node.inputs
    if not _floats(z, x, y):
        return None
    gz, gx, gy = (gpu_constant_or_transfer(v, device) for v in (z, x, y))
    return [GpuGemm()(gz, a, gx, gy, b)]


@register_lift(_blas.Gemv)
def lift_gemv(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Gemv(y, a, A, x, b) -> GpuGemv(gpu(y), a, gpu(A), gpu(x), b)``."""
    y, alpha, A, x, beta = node.inputs  # noqa: N806
    if not _floats(y, A, x):
        return None
    gy, gA, gx = (gpu_constant_or_transfer(v, device) for v in (y, A, x))  # noqa: N806
    return [GpuGemv()(gy, alpha, gA, gx, beta)]


def lift_ger(fgraph: Any, node: Apply, device: int) -> list[Variable] | None:
    """``Ger(A, a, x, y) -> GpuGer(gpu(A), a, gpu(x), gpu(y))`` (pytensor 3.0)."""
    A, alpha, x, y = node.inputs  # noqa: N806
    if not _floats(A, x, y):
        return None
    gA, gx, gy = (gpu_constant_or_transfer(v, device) for v in (A, x, y))  # noqa: N806
    return [GpuGer()(gA, alpha, gx, gy)]


if _Ger is not None:
    register_lift(_Ger)(lift_ger)


def _blas_c_classes() -> None:
    """Register ``blas_c``'s C classes where they are not subclasses (pytensor 3.0)."""
    try:
        import pytensor.tensor.blas_c as blas_c  # pytensor 3.0
    except ImportError:
        return
    pairs = [("CGemv", lift_gemv)]
    if _Ger is not None:
        pairs.append(("CGer", lift_ger))
    for name, rule in pairs:
        cls = getattr(blas_c, name, None)
        if cls is not None:
            register_lift(cls)(rule)


_blas_c_classes()


# --------------------------------------------------------------------------
# in place
# --------------------------------------------------------------------------


@node_rewriter([GpuGemm, GpuGemv, GpuGer])
def local_gpu_inplace_blas(fgraph, node):
    """``GpuGemm(z, ...) -> GpuGemm{inplace}(z, ...)``, likewise GpuGemv and GpuGer.

    Runs after the destroy handler exists; it rejects the replacement when
    the accumulator is protected or still needed elsewhere.
    """
    op = node.op
    if isinstance(node.inputs[0], Constant):
        return None
    if isinstance(op, GpuGer):
        if op.destructive:
            return None
        new_op: GpuOp = GpuGer(destructive=True)
    else:
        if op.inplace:
            return None
        new_op = type(op)(inplace=True)
    new = new_op(*node.inputs)
    copy_stack_trace(node.outputs[0], new)
    return [new]


#: The in-place rewrite of the accumulating products (``cc2ops_gpu_inplace``).
gpu_inplace_blas = WalkingGraphRewriter(
    local_gpu_inplace_blas, failure_callback=WalkingGraphRewriter.warn_inplace
)
gpu_inplace_db.register("gpu_inplace_blas", gpu_inplace_blas, "cc2ops_gpu", "inplace")
