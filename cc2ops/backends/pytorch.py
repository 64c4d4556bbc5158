"""PyTorch implementations of the cc2ops ops (``mode="PYTORCH"``).

Imported by the post-import hook of :mod:`cc2ops.backends` right after
PyTensor's ``pytensor.link.pytorch.dispatch``; registers every op of
:data:`cc2ops.backends._generic.BUILDERS` with ``pytorch_funcify``.

- Convolutions: ``torch.nn.functional.conv2d`` and the two gradients of
  ``torch.nn.grad`` (``conv2d_input`` for the image gradient, whose
  ``input_size`` fixes the rows the floor in the output-size rule leaves out;
  ``conv2d_weight`` for the filter gradient), groups included.
- Pooling, cross-map norm, softmax loss, top-k error: the shared bodies of
  :mod:`cc2ops.backends._generic` (the numpy references' tap loops).
- Dropout: Philox4x32-10 with the words held in int64 (PyTorch's uint32 has
  few kernels); bit-identical masks.

Labels outside ``[0, K)`` give NaN losses, gradients and top-k errors for
their rows, as in JAX: PyTensor compiles the graph with ``torch.compile``,
and a data-dependent raise would break the compiled graph.

The PyTorch mode queries only ``fast_run``, so the static-shape rewrite does
not run there; PyTorch reads the (H, W) inputs of the gradient ops at run
time (``tolist``), which needs none.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pytensor.link.pytorch.dispatch import pytorch_funcify

from cc2ops.backends import _generic
from cc2ops.backends.rewriting import ShapeVector

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint32": torch.uint32,
    "bool": torch.bool,
}


def _torch_pads(pads):
    # F.pad lists (lo, hi) from the last axis backwards
    out = []
    for lo, hi in reversed(pads):
        out += [lo, hi]
    return out


class TorchArrays(_generic.Arrays):
    name = "pytorch"
    word = "int64"

    def constant(self, value: np.ndarray) -> Any:
        return torch.as_tensor(np.array(value, order="C"))

    def astype(self, a, dtype):
        return torch.as_tensor(a).to(_DTYPES[dtype])

    def arange(self, n, dtype):
        return torch.arange(n, dtype=_DTYPES[dtype])

    def dtype_name(self, a):
        return str(a.dtype).removeprefix("torch.")

    def zeros(self, shape, dtype):
        return torch.zeros(shape, dtype=_DTYPES[dtype])

    def pad(self, a, pads, value):
        if not any(lo or hi for lo, hi in pads):
            return a
        return F.pad(a, _torch_pads(pads), value=value)

    def where(self, cond, a, b):
        return torch.where(cond, a, b)

    def maximum(self, a, b):
        return torch.maximum(a, b)

    def exp(self, a):
        return torch.exp(a)

    def log(self, a):
        return torch.log(a)

    def sum(self, a, axis, keepdims=False):
        return torch.sum(a, dim=axis, keepdim=keepdims)

    def amax(self, a, axis, keepdims=False):
        return torch.amax(a, dim=axis, keepdim=keepdims)

    def reshape(self, a, shape):
        return torch.reshape(a, shape)

    def stack(self, items, axis):
        return torch.stack(items, dim=axis)

    def take_along_axis(self, a, idx, axis):
        return torch.take_along_dim(a, idx, dim=axis)

    def add_at(self, a, index, v):
        # ``a`` is a buffer the op made itself, so adding in place is safe
        a[index] += v
        return a

    def static_ints(self, v, op, role):
        if isinstance(v, tuple | list):
            return tuple(int(e) for e in v)
        return tuple(int(e) for e in torch.as_tensor(v).tolist())

    def conv(self, x, w, stride, padding, groups):
        return F.conv2d(x, w, stride=stride, padding=padding, groups=groups)

    def conv_data(self, dy, w, image_hw, stride, padding, groups):
        size = (dy.shape[0], w.shape[1] * groups, *image_hw)
        return torch.nn.grad.conv2d_input(
            size, w, dy, stride=stride, padding=padding, groups=groups
        )

    def conv_filter(self, x, dy, filter_hw, stride, padding, groups):
        size = (dy.shape[1], x.shape[1] // groups, *filter_hw)
        return torch.nn.grad.conv2d_weight(
            x, size, dy, stride=stride, padding=padding, groups=groups
        )


ARRAYS = TorchArrays()


def _register() -> None:
    for cls, build in _generic.BUILDERS.items():

        def funcify(op, node=None, build=build, **kwargs):
            # Eager inside the compiled graph: the bodies are a few aten
            # kernels each (conv, or short tap loops), and tracing them through
            # dynamo and inductor costs tens of seconds per graph
            # (shape-specialised recompiles of every tap slice) for no speed.
            return torch.compiler.disable(build(ARRAYS, op, node), recursive=True)

        funcify.__name__ = f"pytorch_funcify_{cls.__name__}"
        pytorch_funcify.register(cls)(funcify)

    @pytorch_funcify.register(ShapeVector)
    def pytorch_funcify_ShapeVector(op, node=None, **kwargs):
        axes = op.axes

        def shape_vector(*variables):
            return torch.tensor(
                [v.shape[a] for v, a in zip(variables, axes, strict=True)],
                dtype=torch.int64,
            )

        return shape_vector


_register()
