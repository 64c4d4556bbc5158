"""Static (H, W) inputs for the backends that trace with concrete shapes (JAX, MLX).

``ImageActs(dy, w, image_hw)``, ``WeightActs(x, dy, filter_hw)`` and
``AvgPoolGrad(gy, image_hw)`` take a small int vector that fixes the shape of
their result. JAX (``jax.jit``) and MLX (``mx.compile``) need that shape while
they trace, when only constants and the shapes of arrays are known: the
pullbacks pass ``x.shape[2:]``, which PyTensor turns into array operations
(``Shape``, ``Subtensor``, ``MakeVector``) whose values are traced.

:func:`local_static_shape_inputs` rewrites such an input, before
canonicalisation can turn ``x.shape[2]`` into arithmetic of other shapes, into

- a constant, where every entry is known at compile time (static type
  shapes, PyTensor's shape feature, constant folding);
- else :class:`ShapeVector`, which reads the entries from the shapes of the
  variables themselves while the backend traces (a tuple of Python ints, like
  PyTensor's ``JAXShapeTuple``).

Anything else (an (H, W) computed from data) stays, and the backend raises a
``ValueError`` naming the op when it converts the graph. The rewrite lives in
the database ``cc2ops_static_shapes`` (:mod:`cc2ops.rewriting.db`), tagged
``jax`` and ``mlx``: the JAX and MLX modes query those tags, no other mode
runs it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.op import Op
from pytensor.graph.rewriting.basic import copy_stack_trace, dfs_rewriter, node_rewriter
from pytensor.scalar.basic import Cast
from pytensor.tensor.basic import (
    MakeVector,
    ScalarFromTensor,
    TensorFromScalar,
    get_underlying_scalar_constant_value,
)
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.shape import Shape, Shape_i
from pytensor.tensor.subtensor import Subtensor, get_idx_list
from pytensor.tensor.type import TensorType

from cc2ops.backends import _generic
from cc2ops.conv import ImageActs, WeightActs
from cc2ops.pool import AvgPoolGrad
from cc2ops.rewriting.db import static_shapes_db

__all__ = ["ShapeVector", "SHAPE_INPUTS", "local_static_shape_inputs"]

#: op class -> (index of its (H, W)-style input, that input's name).
SHAPE_INPUTS: dict[type, tuple[int, str]] = {
    ImageActs: (2, "image_hw"),
    WeightActs: (2, "filter_hw"),
    AvgPoolGrad: (1, "image_hw"),
}


class ShapeVector(Op):
    """``ShapeVector(axes)(v_0, ..., v_n) = [v_0.shape[axes[0]], ...]`` (int64).

    The JAX and MLX implementations return a tuple of Python ints read from
    the traced arrays' shapes, so the op consuming it sees concrete values.
    """

    __props__ = ("axes",)

    def __init__(self, axes: tuple[int, ...]):
        self.axes = tuple(int(a) for a in axes)

    def make_node(self, *variables: Variable) -> Apply:
        if len(variables) != len(self.axes):
            raise ValueError(
                f"ShapeVector: needs one variable per axis ({len(self.axes)}), got "
                f"{len(variables)}"
            )
        for v, a in zip(variables, self.axes, strict=True):
            if not 0 <= a < v.type.ndim:
                raise ValueError(
                    f"ShapeVector: axis {a} out of range for a {v.type.ndim}-d variable"
                )
        out = TensorType("int64", shape=(len(self.axes),))()
        return Apply(self, list(variables), [out])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = np.array(
            [np.shape(v)[a] for v, a in zip(inputs, self.axes, strict=True)],
            dtype="int64",
        )

    def infer_shape(self, *args):
        return [(len(self.axes),)]


def _const_int(v: Variable) -> int | None:
    try:
        return int(get_underlying_scalar_constant_value(v))
    except (NotScalarConstantError, TypeError, ValueError):
        return None


def _unwrap_cast(v: Variable) -> Variable:
    """``v`` without integer casts and tensor<->scalar conversions around it."""
    while v.owner is not None and (
        (isinstance(v.owner.op, Elemwise) and isinstance(v.owner.op.scalar_op, Cast))
        or isinstance(v.owner.op, TensorFromScalar | ScalarFromTensor)
    ):
        v = v.owner.inputs[0]
    return v


def _entry_source(v: Variable) -> tuple[Variable, int] | None:
    """``(x, axis)`` where the scalar ``v`` is ``x.shape[axis]``, else None."""
    v = _unwrap_cast(v)
    node = v.owner
    if node is None:
        return None
    if isinstance(node.op, Shape_i):
        return node.inputs[0], node.op.i
    if isinstance(node.op, Subtensor):
        src = node.inputs[0]
        idx = get_idx_list(node.inputs, node.op.idx_list)
        if (
            src.owner is not None
            and isinstance(src.owner.op, Shape)
            and len(idx) == 1
            and not isinstance(idx[0], slice)
        ):
            i = _const_int(idx[0])
            if i is not None:
                return src.owner.inputs[0], i % src.owner.inputs[0].type.ndim
    return None


def _vector_sources(v: Variable) -> list[tuple[Variable, int]] | None:
    """``[(x, axis), ...]`` where the int vector ``v`` is a list of shape entries."""
    v = _unwrap_cast(v)
    node = v.owner
    if node is None:
        return None
    if isinstance(node.op, Shape):
        x = node.inputs[0]
        return [(x, a) for a in range(x.type.ndim)]
    if isinstance(node.op, Subtensor):
        src = node.inputs[0]
        idx = get_idx_list(node.inputs, node.op.idx_list)
        if (
            src.owner is not None
            and isinstance(src.owner.op, Shape)
            and len(idx) == 1
            and isinstance(idx[0], slice)
        ):
            x = src.owner.inputs[0]
            bounds = [
                None if e is None else _const_int(e)
                for e in (idx[0].start, idx[0].stop, idx[0].step)
            ]
            given = (idx[0].start, idx[0].stop, idx[0].step)
            pairs = zip(bounds, given, strict=True)
            if any(b is None and e is not None for b, e in pairs):
                return None
            axes = range(x.type.ndim)[slice(*bounds)]
            return [(x, a) for a in axes]
        return None
    if isinstance(node.op, MakeVector):
        out = []
        for e in node.inputs:
            src = _entry_source(e)
            if src is None:
                return None
            out.append(src)
        return out
    return None


def _known(fgraph, x: Variable, axis: int) -> int | None:
    """``x.shape[axis]`` if the static type or the shape feature knows it."""
    if x.type.shape[axis] is not None:
        return int(x.type.shape[axis])
    feature = getattr(fgraph, "shape_feature", None)
    if feature is not None and x in feature.shape_of:
        return _const_int(feature.shape_of[x][axis])
    return None


def static_shape_vector(fgraph, v: Variable) -> Variable | None:
    """A constant or a :class:`ShapeVector` equal to the int vector ``v``, or None."""
    if isinstance(v, Constant) or (
        v.owner is not None and isinstance(v.owner.op, ShapeVector)
    ):
        return None
    sources = _vector_sources(v)
    if sources is not None:
        values = [_known(fgraph, x, a) for x, a in sources]
        if all(e is not None for e in values):
            return pt.constant(np.array(values, dtype="int64"))
        return ShapeVector(tuple(a for _, a in sources))(*(x for x, _ in sources))
    length = v.type.shape[0]
    if length is None:
        return None
    values = [_const_int(v[i]) for i in range(length)]
    if all(e is not None for e in values):
        return pt.constant(np.array(values, dtype="int64"))
    return None


@node_rewriter(list(SHAPE_INPUTS))
def local_static_shape_inputs(fgraph, node):
    """``op(..., x.shape[2:])`` -> ``op(..., [H, W])`` or ``op(..., ShapeVector(x))``.

    For ``ImageActs``/``WeightActs``/``AvgPoolGrad``: the (H, W)-style input
    becomes a constant where its entries are known at compile time, else a
    :class:`ShapeVector` of the variables whose shapes it lists; inputs that
    are neither stay (the JAX/MLX conversion then names the op).
    """
    i, _ = SHAPE_INPUTS[type(node.op)]
    new = static_shape_vector(fgraph, node.inputs[i])
    if new is None:
        return None
    copy_stack_trace(node.inputs[i], new)
    inputs = list(node.inputs)
    inputs[i] = new
    out = node.op.make_node(*inputs).outputs
    copy_stack_trace(node.outputs, out)
    return out


static_shapes_db.register(
    "local_static_shape_inputs",
    dfs_rewriter(local_static_shape_inputs),
    "jax",
    "mlx",
    position=0,
)


def check_static_inputs(op: Any, node: Any, library: str) -> None:
    """Raise, naming the op, where an (H, W) input cannot be static for ``library``.

    Tracing backends (JAX, MLX) need the shape inputs of :data:`SHAPE_INPUTS`
    as constants or :class:`ShapeVector` (what :data:`static_shapes_db` makes).
    """
    if node is None or type(op) not in SHAPE_INPUTS:
        return
    i, role = SHAPE_INPUTS[type(op)]
    v = node.inputs[i]
    if isinstance(v, Constant) or (
        v.owner is not None and isinstance(v.owner.op, ShapeVector)
    ):
        return
    tag = library.lower()
    raise ValueError(
        f"{type(op).__name__}: {role} must be static for {library} (a constant or "
        f"the shape of a variable, which the '{tag}'-tagged rewrite "
        f"cc2ops_static_shapes makes static), got {v} computed by "
        f"{v.owner.op if v.owner is not None else 'a graph input'}"
    )


def register_traced(dispatcher: Any, arrays: Any, library: str) -> None:
    """Register the ops and :class:`ShapeVector` with a tracing backend's dispatcher.

    Every op goes through :func:`cc2ops.backends._generic.register` with the
    static-shape check; ``ShapeVector`` reads its variables' shapes while tracing.
    """
    _generic.register(
        dispatcher, arrays, lambda op, node: check_static_inputs(op, node, library)
    )

    @dispatcher.register(ShapeVector)
    def funcify_shape_vector(op, node=None, **kwargs):
        axes = op.axes

        def shape_vector(*variables):
            return tuple(v.shape[a] for v, a in zip(variables, axes, strict=True))

        return shape_vector
