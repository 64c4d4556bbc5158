"""What every cc2ops op shares: version-neutral hooks and input validation.

PyTensor 3.0 calls ``infer_shape(fgraph, node, input_shapes)``; 3.1 and later
call ``infer_shape(node, input_shapes)`` (and wrap four-argument overrides with
a deprecation warning). :class:`Cc2Op` accepts both and forwards to
``_infer_shape(node, input_shapes)``, which subclasses implement. Gradients use
``pullback``/``pushforward``, which both versions call.

One skeleton per family
-----------------------
A host op and its GPU twin share everything but their props, ``make_node``
and ``perform``: each family module (:mod:`cc2ops.pool`, :mod:`cc2ops.conv`,
...) writes the shape rule, connection pattern, pullback and pushforward of
each op once, in a public skeleton class (``MaxPoolSkeleton``,
``FilterActsSkeleton``, ...) that both ops inherit. The skeletons build their
gradient terms through two things each op provides:

- ``family``, a class attribute naming the op classes of its own backend by
  role (``self.family.max_pool_grad``), so a host op's pullback builds host
  ops and a GPU op's builds GPU ops: each family stays closed under
  differentiation on each backend;
- the gradient hooks of :class:`Cc2Op` (``_cotangent``, ``_zeros_like``,
  ``_hw_of``, ``_host``, ``_on_device``), here for host tensors; the GPU
  backend overrides them for GPU tensors
  (:class:`cc2ops.cuda.transfer.GpuGradients`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Variable
from pytensor.graph.op import Op
from pytensor.tensor.variable import TensorVariable

FLOAT_DTYPES = ("float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


class Cc2Op(Op):
    """Base class of the cc2ops ops (CPU and GPU)."""

    def infer_shape(self, *args: Any):
        # (fgraph, node, shapes) on pytensor 3.0, (node, shapes) from 3.1 on
        node, input_shapes = args[-2], args[-1]
        return self._infer_shape(node, input_shapes)

    def _infer_shape(self, node, input_shapes):
        raise NotImplementedError(f"{type(self).__name__} does not infer its shape")

    # -- gradient hooks (the module docstring): the host versions ----------

    def _cotangent(self, g: Variable, like: Variable) -> Variable:
        """Cotangent or tangent ``g`` in ``like``'s dtype, where ``like`` is.

        Disconnected and undefined ones (no dtype) pass unchanged.
        """
        if not hasattr(g.type, "dtype") or g.type.dtype == like.type.dtype:
            return g
        return pt.cast(g, like.type.dtype)

    def _zeros_like(self, v: Variable) -> Variable:
        """Zeros of ``v``'s type, where ``v`` is (a gradient that is zero)."""
        return pt.zeros_like(v)

    def _hw_of(self, x: Variable) -> Variable:
        """(H, W) of a 4-d ``x`` as an int vector (a constant where static)."""
        h, w = x.type.shape[2:]
        if h is not None and w is not None:
            return pt.as_tensor_variable(np.array([h, w], dtype="int64"))
        return x.shape[2:]

    def _host(self, v: Variable) -> Variable:
        """``v`` as a host tensor, for gradients written with PyTensor's ops."""
        return v

    def _on_device(self, v: Variable, like: Variable) -> Variable:
        """A term built by ``_host`` graphs, moved to where ``like`` lives."""
        return v


def float_tensor(op: str, role: str, x: Any, ndim: int, axes: str) -> TensorVariable:
    """``x`` as a float32/float64 tensor of ``ndim`` dims, else ``TypeError``.

    Parameters
    ----------
    op, role : str
        Names for the message: ``"FilterActs: images must ..."``.
    axes : str
        The expected axis order, e.g. ``"(B, C, H, W)"``.
    """
    x = as_tensor(op, role, x)
    if x.type.ndim != ndim:
        raise TypeError(
            f"{op}: {role} must have {_dims(ndim)} {axes}, got {x.type.ndim}"
        )
    if x.type.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {role} must be float32 or float64, got {x.type.dtype}")
    return x


def int_tensor(op: str, role: str, x: Any, ndim: int, axes: str) -> TensorVariable:
    """``x`` as an integer tensor of ``ndim`` dims, else ``TypeError``."""
    x = as_tensor(op, role, x)
    if x.type.ndim != ndim:
        raise TypeError(
            f"{op}: {role} must have {_dims(ndim)} {axes}, got {x.type.ndim}"
        )
    if x.type.dtype not in INT_DTYPES:
        raise TypeError(f"{op}: {role} must have an integer dtype, got {x.type.dtype}")
    return x


def same_dtype(op: str, **named: TensorVariable) -> str:
    """The one dtype shared by ``named`` tensors, else ``TypeError``."""
    dtypes = {name: v.type.dtype for name, v in named.items()}
    if len(set(dtypes.values())) != 1:
        got = ", ".join(f"{n} {d}" for n, d in dtypes.items())
        raise TypeError(f"{op}: inputs must share one float dtype, got {got}")
    return next(iter(dtypes.values()))


def upcast_floats(op: str, **named: Any) -> list[TensorVariable]:
    """Builder helper: ``named`` as tensors, floats cast to their common float dtype.

    Each value is converted with :func:`as_tensor` (a ``TypeError`` naming
    ``op`` and the keyword as the role for anything that is not a tensor).
    Non-float inputs pass through unchanged so that ``make_node`` reports them.
    """
    xs = [as_tensor(op, role, x) for role, x in named.items()]
    floats = [x.type.dtype for x in xs if x.type.dtype in FLOAT_DTYPES]
    if not floats:
        return xs
    target = "float64" if "float64" in floats else "float32"
    return [
        x.astype(target)
        if x.type.dtype in FLOAT_DTYPES and x.type.dtype != target
        else x
        for x in xs
    ]


def _dims(ndim: int) -> str:
    return f"{ndim} dim" if ndim == 1 else f"{ndim} dims"


def _show(x: Any) -> str:
    """``x`` for a message: its type and a repr cut to a readable length."""
    text = repr(x)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(x).__name__} {text}"


def _has_bool_among_numbers(x: Any) -> bool:
    """Whether a (nested) list/tuple mixes bools with other entries.

    NumPy reads ``[True, 3]`` as the integers ``[1, 3]``; a bool where a
    number belongs is a mistake, so it is refused instead. All-bool sequences
    pass (they become a bool tensor, which the dtype checks then refuse).
    """
    flat: list[Any] = []
    stack = [x]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            flat.append(item)
    bools = [isinstance(v, (bool, np.bool_)) for v in flat]
    return any(bools) and not all(bools)


def as_tensor(op: str, role: str, x: Any) -> TensorVariable:
    """``x`` as a tensor variable, else ``TypeError`` naming ``op``, ``role``, ``x``.

    Accepts what :func:`pytensor.tensor.as_tensor_variable` accepts (tensor
    variables, numbers, arrays, nested lists of numbers) except lists that
    mix bools with numbers. ``None``, strings, dicts and other objects raise
    ``TypeError("<op>: <role> must be a tensor ..., got <type> <value>")``
    instead of PyTensor's ``NotImplementedError``, which names neither.
    """
    rule = f"{op}: {role} must be a tensor (a PyTensor variable or numeric array)"
    if isinstance(x, (str, bytes, dict, set, type(None))):
        raise TypeError(f"{rule}, got {_show(x)}")
    if isinstance(x, (list, tuple)) and _has_bool_among_numbers(x):
        raise TypeError(f"{rule}; bools are not numbers here, got {_show(x)}")
    try:
        return pt.as_tensor_variable(x)
    except (TypeError, ValueError, NotImplementedError) as e:
        raise TypeError(f"{rule}, got {_show(x)} ({e})") from e


def is_disconnected(v: Any) -> bool:
    """Whether a cotangent or tangent is PyTensor's "disconnected" placeholder."""
    return isinstance(getattr(v, "type", None), DisconnectedType)
