"""JAX implementations of the cc2ops ops (``mode="JAX"``, numpyro, blackjax).

Imported by the post-import hook of :mod:`cc2ops.backends` right after
PyTensor's ``pytensor.link.jax.dispatch``; it registers every op of
:data:`cc2ops.backends._generic.BUILDERS` (the whole forward and gradient
family: ``FilterActs``, ``ImageActs``, ``WeightActs``, ``MaxPool``,
``MaxPoolGrad``, ``MaxPoolGradGrad``, ``AvgPool``, ``AvgPoolGrad``,
``CrossMapNorm``, ``CrossMapNormGrad``, ``SoftmaxCrossEntropy``,
``SoftmaxCrossEntropyGrad``, ``TopKError``, ``Dropout``, ``DropoutAdvance``)
and :class:`cc2ops.backends.rewriting.ShapeVector` with ``jax_funcify``.

- Convolutions: ``lax.conv_general_dilated`` with ``feature_group_count``
  (forward); the image gradient is the transposed convolution (the gradient
  dilated by the stride, the flipped filters with input and output channels
  swapped per group); the filter gradient correlates the images with the
  dilated gradient, channels as the batch, ``batch_group_count`` for groups.
  ``precision=HIGHEST``, so a GPU runs them in full float32 (no TF32).
- Pooling: ``lax.reduce_window`` over the images padded to cuda-convnet2's
  clipped windows (``start`` offset, ceil-mode count); the gradients are the
  same tap loops as the numpy references (first maximum in row-major order
  within each window), scatter-adds into a padded buffer.
- Dropout: Philox4x32-10 in uint32 arithmetic (16-bit halves for the
  32x32-bit products, so it needs no ``jax_enable_x64``); masks are
  bit-identical to :func:`cc2ops.dropout.dropout_mask_reference`.

Labels outside ``[0, K)`` cannot raise inside ``jax.jit``: the loss, its
gradient and the top-k error of such a row are NaN (see
:mod:`cc2ops.backends._generic`).

The (H, W) inputs of ``ImageActs``, ``WeightActs`` and ``AvgPoolGrad`` must
be known while JAX traces: the ``jax``-tagged rewrite of
:mod:`cc2ops.backends.rewriting` makes them constants or
:class:`~cc2ops.backends.rewriting.ShapeVector`; any other such input raises
``ValueError`` naming the op when the graph is converted.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from pytensor.link.jax.dispatch import jax_funcify

from cc2ops.backends import _generic
from cc2ops.backends.rewriting import register_traced

_DN = ("NCHW", "OIHW", "NCHW")
_HIGHEST = lax.Precision.HIGHEST


def _crop_pads(pads):
    """Non-negative pads and the crops that make up for the negative parts."""
    return [(max(lo, 0), max(hi, 0)) for lo, hi in pads], [
        (max(-lo, 0), max(-hi, 0)) for lo, hi in pads
    ]


def _crop(a, crops):
    (t, b), (left, r) = crops
    h, w = a.shape[2], a.shape[3]
    return a[:, :, t : h - b, left : w - r]


class JaxArrays(_generic.Arrays):
    name = "jax"
    word = "uint32"

    def constant(self, value: np.ndarray) -> Any:
        return jnp.asarray(value)

    def astype(self, a, dtype):
        return jnp.asarray(a).astype(dtype)

    def arange(self, n, dtype):
        return jnp.arange(n, dtype=dtype)

    def dtype_name(self, a):
        return str(a.dtype)

    def zeros(self, shape, dtype):
        return jnp.zeros(shape, dtype=dtype)

    def pad(self, a, pads, value):
        if not any(lo or hi for lo, hi in pads):
            return a
        return jnp.pad(a, pads, constant_values=jnp.asarray(value, a.dtype))

    def where(self, cond, a, b):
        return jnp.where(cond, a, b)

    def maximum(self, a, b):
        return jnp.maximum(a, b)

    def exp(self, a):
        return jnp.exp(a)

    def log(self, a):
        return jnp.log(a)

    def sum(self, a, axis, keepdims=False):
        return jnp.sum(a, axis=axis, keepdims=keepdims)

    def amax(self, a, axis, keepdims=False):
        return jnp.max(a, axis=axis, keepdims=keepdims)

    def reshape(self, a, shape):
        return jnp.reshape(a, shape)

    def stack(self, items, axis):
        return jnp.stack(items, axis=axis)

    def take_along_axis(self, a, idx, axis):
        return jnp.take_along_axis(a, idx, axis=axis)

    def add_at(self, a, index, v):
        return a.at[index].add(v)

    def static_ints(self, v, op, role):
        try:
            return tuple(int(e) for e in v)
        except (jax.errors.ConcretizationTypeError, TypeError) as e:
            raise ValueError(
                f"{op}: {role} must be known while JAX traces the function (a "
                f"constant or the shape of a variable), got a traced value: {e}"
            ) from e

    def conv(self, x, w, stride, padding, groups):
        return lax.conv_general_dilated(
            x,
            w,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            dimension_numbers=_DN,
            feature_group_count=groups,
            precision=_HIGHEST,
        )

    def conv_data(self, dy, w, image_hw, stride, padding, groups):
        f, cg, kh, kw = w.shape
        fg = f // groups
        # (C, F/groups, kh, kw): per group, input and output channels swapped
        wt = w.reshape(groups, fg, cg, kh, kw).transpose(0, 2, 1, 3, 4)
        wt = wt.reshape(groups * cg, fg, kh, kw)[:, :, ::-1, ::-1]
        pads = [
            _generic.transposed_conv_pads(n, o, k, s, p)
            for n, o, k, s, p in zip(
                image_hw, dy.shape[2:], (kh, kw), stride, padding, strict=True
            )
        ]
        pads, crops = _crop_pads(pads)
        dx = lax.conv_general_dilated(
            dy,
            wt,
            window_strides=(1, 1),
            padding=pads,
            lhs_dilation=stride,
            dimension_numbers=_DN,
            feature_group_count=groups,
            precision=_HIGHEST,
        )
        return _crop(dx, crops)

    def conv_filter(self, x, dy, filter_hw, stride, padding, groups):
        pads = [
            _generic.filter_grad_pads(n, o, k, s, p)
            for n, o, k, s, p in zip(
                x.shape[2:], dy.shape[2:], filter_hw, stride, padding, strict=True
            )
        ]
        pads, crops = _crop_pads(pads)
        # images as (batch = C, features = B), gradient as filters (in = B,
        # out = F), result (F, C/groups, kh, kw); a group of C pairs with the
        # same group of F through batch_group_count
        dw = lax.conv_general_dilated(
            x,
            dy,
            window_strides=(1, 1),
            padding=pads,
            rhs_dilation=stride,
            dimension_numbers=("CNHW", "IOHW", "CNHW"),
            batch_group_count=groups,
            precision=_HIGHEST,
        )
        return _crop(dw, crops)

    def window_max(self, xp, plan):
        return self._window(xp, plan, -jnp.inf, lax.max)

    def window_sum(self, xp, plan):
        return self._window(xp, plan, 0, lax.add)

    @staticmethod
    def _window(xp, plan, init, reducer):
        r0, c0 = plan.first
        (kh, kw), (sh, sw), (nr, nc) = plan.size, plan.stride, plan.n
        # a numpy scalar, not jnp.asarray: under jax.jit the latter is a tracer,
        # and reduce_window then takes its generic form, which JAX cannot
        # differentiate in reverse mode (numpyro jits jax.grad of the log density)
        out = lax.reduce_window(
            xp[:, :, r0:, c0:],
            np.asarray(init, xp.dtype),
            reducer,
            (1, 1, kh, kw),
            (1, 1, sh, sw),
            "VALID",
        )
        return out[:, :, :nr, :nc]


ARRAYS = JaxArrays()


register_traced(jax_funcify, ARRAYS, "JAX")
