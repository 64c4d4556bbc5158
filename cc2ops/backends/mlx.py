"""MLX implementations of the cc2ops ops (``mode="MLX"``).

Imported by the post-import hook of :mod:`cc2ops.backends` right after
PyTensor's ``pytensor.link.mlx.dispatch``; registers every op of
:data:`cc2ops.backends._generic.BUILDERS` and
:class:`cc2ops.backends.rewriting.ShapeVector` with ``mlx_funcify``.

- Convolutions: ``mx.conv2d`` (channels-last, so the bc01 arrays are
  transposed around it); the two gradients are ``mx.vjp`` of that forward
  convolution, which is linear, so they are exact transposes.
- Pooling, cross-map norm, softmax loss, top-k error: the shared bodies of
  :mod:`cc2ops.backends._generic`.
- Dropout: Philox4x32-10 in uint32 arithmetic; bit-identical masks.

Labels outside ``[0, K)`` give NaN losses, gradients and top-k errors for
their rows (``mx.compile`` cannot raise on data). The MLX mode queries the
``mlx`` tag, so the static-shape rewrite of :mod:`cc2ops.backends.rewriting`
runs there as in JAX: ``mx.compile`` traces with concrete shapes but
placeholder values. MLX computes float64 on the CPU only.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from pytensor.link.mlx.dispatch import mlx_funcify

from cc2ops.backends import _generic
from cc2ops.backends.rewriting import register_traced

_DTYPES = {
    "float32": mx.float32,
    "float64": mx.float64,
    "int64": mx.int64,
    "int32": mx.int32,
    "uint32": mx.uint32,
    "bool": mx.bool_,
}


def _nhwc(a):
    return mx.transpose(a, (0, 2, 3, 1))


def _nchw(a):
    return mx.transpose(a, (0, 3, 1, 2))


class MlxArrays(_generic.Arrays):
    name = "mlx"
    word = "uint32"

    def constant(self, value: np.ndarray) -> Any:
        return mx.array(np.asarray(value))

    def astype(self, a, dtype):
        if not isinstance(a, mx.array):
            a = mx.array(a)
        return a.astype(_DTYPES[dtype])

    def arange(self, n, dtype):
        return mx.arange(n, dtype=_DTYPES[dtype])

    def dtype_name(self, a):
        return str(a.dtype).removeprefix("mlx.core.")

    def zeros(self, shape, dtype):
        return mx.zeros(shape, dtype=_DTYPES[dtype])

    def pad(self, a, pads, value):
        if not any(lo or hi for lo, hi in pads):
            return a
        return mx.pad(a, pads, constant_values=mx.array(value, dtype=a.dtype))

    def where(self, cond, a, b):
        return mx.where(cond, a, b)

    def maximum(self, a, b):
        return mx.maximum(a, b)

    def exp(self, a):
        return mx.exp(a)

    def log(self, a):
        return mx.log(a)

    def sum(self, a, axis, keepdims=False):
        return mx.sum(a, axis=axis, keepdims=keepdims)

    def amax(self, a, axis, keepdims=False):
        return mx.max(a, axis=axis, keepdims=keepdims)

    def reshape(self, a, shape):
        return mx.reshape(a, shape)

    def stack(self, items, axis):
        return mx.stack(items, axis=axis)

    def take_along_axis(self, a, idx, axis):
        return mx.take_along_axis(a, idx, axis=axis)

    def add_at(self, a, index, v):
        return a.at[index].add(v)

    def static_ints(self, v, op, role):
        if isinstance(v, tuple | list):
            return tuple(int(e) for e in v)
        try:
            return tuple(int(e) for e in np.asarray(v).reshape(-1))
        except Exception as e:  # mx.compile placeholders cannot be read
            raise ValueError(
                f"{op}: {role} must be known while MLX compiles the function (a "
                f"constant or the shape of a variable): {e}"
            ) from e

    def conv(self, x, w, stride, padding, groups):
        y = mx.conv2d(_nhwc(x), _nhwc(w), stride=stride, padding=padding, groups=groups)
        return _nchw(y)

    def conv_data(self, dy, w, image_hw, stride, padding, groups):
        primal = mx.zeros((dy.shape[0], w.shape[1] * groups, *image_hw), dy.dtype)
        _, (dx,) = mx.vjp(
            lambda x: self.conv(x, w, stride, padding, groups), [primal], [dy]
        )
        return dx

    def conv_filter(self, x, dy, filter_hw, stride, padding, groups):
        primal = mx.zeros((dy.shape[1], x.shape[1] // groups, *filter_hw), x.dtype)
        _, (dw,) = mx.vjp(
            lambda w: self.conv(x, w, stride, padding, groups), [primal], [dy]
        )
        return dw


ARRAYS = MlxArrays()


register_traced(mlx_funcify, ARRAYS, "MLX")
