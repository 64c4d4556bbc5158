"""Convolution on the CPU: ``FilterActs``, ``ImageActs``, ``WeightActs``.

The three ops of cuda-convnet's convolution family, in the bc01 layout:

``FilterActs(x, w) -> y``
    the forward cross-correlation (what ``torch.nn.functional.conv2d``
    computes), images x (B, C, H, W), filters w (F, C/groups, kh, kw), output
    y (B, F, Ho, Wo).
``ImageActs(dy, w, image_hw) -> dx``
    the gradient with respect to the images, (B, C, H, W).
``WeightActs(x, dy, filter_hw) -> dw``
    the gradient with respect to the filters, (F, C/groups, kh, kw).

The family is closed under differentiation (each op's pullback and
pushforward are built from the three), so gradients of any order stay inside
it and a GPU backend only has to lift three ops. :func:`conv2d` is the public
builder; it also accepts cuda-convnet's c01b layout.

The numpy references (:func:`conv_forward_reference`,
:func:`conv_backward_data_reference`, :func:`conv_backward_filter_reference`)
are what ``perform`` runs; GPU tests and benchmarks import them as the ground
truth. They are vectorised: im2col strided views and batched matrix products.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pytensor.tensor as pt
from numpy.lib.stride_tricks import sliding_window_view
from pytensor.gradient import disconnected_type
from pytensor.graph.basic import Apply, Variable
from pytensor.tensor.basic import get_underlying_scalar_constant_value
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.shape import Shape
from pytensor.tensor.subtensor import Subtensor, get_idx_list
from pytensor.tensor.variable import TensorConstant, TensorVariable

from cc2ops._op import (
    Cc2Op,
    float_tensor,
    int_tensor,
    is_disconnected,
    same_dtype,
    upcast_floats,
)
from cc2ops.layout import (
    axes_doc,
    check_layout,
    filters_to_bc01,
    images_from_bc01,
    images_to_bc01,
)
from cc2ops.shapes import (
    check_conv_batch,
    check_conv_filter_count,
    check_conv_gradient_hw,
    check_conv_shapes,
    check_hw_values,
    conv_output_length,
    conv_params,
    hw_value,
    image_acts_shape,
    pair,
    weight_acts_shape,
)

__all__ = [
    "conv2d",
    "FilterActs",
    "ImageActs",
    "WeightActs",
    "conv_forward_reference",
    "conv_backward_data_reference",
    "conv_backward_filter_reference",
    # the skeletons the host ops share with their GPU twins
    "ConvFamily",
    "HOST_FAMILY",
    "ConvSkeleton",
    "FilterActsSkeleton",
    "ImageActsSkeleton",
    "WeightActsSkeleton",
]

IMAGE_AXES = "(B, C, H, W)"
FILTER_AXES = "(F, C/groups, kh, kw)"
FILTER_AXES_C01B = "(C/groups, kh, kw, F)"
GRADIENT_AXES = "(B, F, Ho, Wo)"

#: Largest im2col matrix (in elements) the references build at once. Larger
#: batches are processed in chunks of images so that memory stays bounded
#: (2**24 float32 elements are 64 MiB) while each chunk is still one BLAS call.
COLS_BUDGET = 1 << 24


# --------------------------------------------------------------------------
# numpy references
# --------------------------------------------------------------------------


def _pad(x: np.ndarray, padding: tuple[int, int]) -> np.ndarray:
    ph, pw = padding
    if ph == 0 and pw == 0:
        return x
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def _windows(
    xp: np.ndarray,
    filter_hw: tuple[int, int],
    stride: tuple[int, int],
    out_hw: tuple[int, int],
) -> np.ndarray:
    """Strided (no-copy) view (B, C, Ho, Wo, kh, kw) of every filter position."""
    view = sliding_window_view(xp, filter_hw, axis=(2, 3))
    (sh, sw), (ho, wo) = stride, out_hw
    return view[:, :, : (ho - 1) * sh + 1 : sh, : (wo - 1) * sw + 1 : sw]


def _im2col(win: np.ndarray, groups: int) -> np.ndarray:
    """(B, C, Ho, Wo, kh, kw) windows -> (groups, B*Ho*Wo, C/groups*kh*kw) copy."""
    b, c, ho, wo, kh, kw = win.shape
    cg = c // groups
    cols = win.reshape(b, groups, cg, ho, wo, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
    return cols.reshape(groups, b * ho * wo, cg * kh * kw)


def _chunk(per_image: int) -> int:
    return max(1, COLS_BUDGET // max(1, per_image))


def conv_forward_reference(
    x: np.ndarray,
    w: np.ndarray,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    groups: int = 1,
) -> np.ndarray:
    """Forward convolution (cross-correlation) in numpy, the ground truth.

    Parameters
    ----------
    x : ndarray, shape (B, C, H, W)
        Images, float32 or float64.
    w : ndarray, shape (F, C/groups, kh, kw)
        Filters; filter ``f`` sees the channels of group ``f // (F/groups)``.
    stride, padding : int or pair of int
        Step between filter positions and zero padding on each side, as
        (rows, cols) where a pair is given.
    groups : int
        Number of channel groups; divides C and F.

    Returns
    -------
    ndarray, shape (B, F, Ho, Wo)
        ``y[b, f, i, j] = sum_{c, u, v} w[f, c, u, v] *
        xpad[b, g*C/groups + c, i*sh + u, j*sw + v]`` with ``g`` the group of
        ``f``; ``Ho = floor((H + 2*ph - kh) / sh) + 1`` (likewise ``Wo``).
        Dtype ``np.result_type(x, w)``.

    Notes
    -----
    im2col: a strided view of every filter position, copied per group into a
    (B*Ho*Wo, C/groups*kh*kw) matrix and multiplied by the filters in one
    batched matmul over groups, accumulating in the input dtype (float32 stays
    float32). Batches whose im2col matrix exceeds :data:`COLS_BUDGET` elements
    are processed in chunks of images.
    """
    op = "conv_forward_reference"
    x, w = np.asarray(x), np.asarray(w)
    stride, padding, groups = conv_params(stride, padding, groups, op)
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"{op}: x and w must have 4 dims, got {x.ndim} and {w.ndim}")
    b, f, ho, wo = check_conv_shapes(op, x.shape, w.shape, stride, padding, groups)
    dtype = np.result_type(x, w)
    _, c, _, _ = x.shape
    _, cg, kh, kw = w.shape
    fg = f // groups
    win = _windows(_pad(x, padding), (kh, kw), stride, (ho, wo))
    # (groups, C/groups*kh*kw, F/groups): matches the im2col column order
    wt = w.reshape(groups, fg, cg * kh * kw).transpose(0, 2, 1)
    y = np.empty((b, groups, fg, ho, wo), dtype=dtype)
    nb = _chunk(ho * wo * c * kh * kw)
    for b0 in range(0, b, nb):
        part = win[b0 : b0 + nb]
        n = part.shape[0]
        prod = np.matmul(_im2col(part, groups), wt)
        y[b0 : b0 + n] = prod.reshape(groups, n, ho, wo, fg).transpose(1, 0, 4, 2, 3)
    return y.reshape(b, f, ho, wo)


def conv_backward_data_reference(
    dy: np.ndarray,
    w: np.ndarray,
    image_hw: tuple[int, int],
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    groups: int = 1,
) -> np.ndarray:
    """Gradient of the convolution with respect to the images, in numpy.

    Parameters
    ----------
    dy : ndarray, shape (B, F, Ho, Wo)
        Gradient with respect to the forward output.
    w : ndarray, shape (F, C/groups, kh, kw)
        Filters.
    image_hw : pair of int
        (H, W) of the images. Needed because the floor in the output-size
        rule maps several image sizes to one output size.
    stride, padding, groups
        As in :func:`conv_forward_reference`.

    Returns
    -------
    ndarray, shape (B, C, H, W)
        ``dx`` with ``sum(dx * x) == sum(dy * conv_forward_reference(x, w))``
        for every ``x``. Rows/columns that no filter position covers get 0.

    Raises
    ------
    ValueError
        If (Ho, Wo) is not the forward output shape of ``image_hw``.

    Notes
    -----
    col2im as a loop over the kh*kw filter taps: each tap is one batched
    matmul (over groups) of the gradient by that tap's weights and one strided
    add into the padded result.
    """
    op = "conv_backward_data_reference"
    dy, w = np.asarray(dy), np.asarray(w)
    stride, padding, groups = conv_params(stride, padding, groups, op)
    image_hw = pair(image_hw, "image_hw", op, minimum=1)
    if dy.ndim != 4 or w.ndim != 4:
        raise ValueError(f"{op}: dy and w must have 4 dims, got {dy.ndim} and {w.ndim}")
    b, f, ho, wo = dy.shape
    _, cg, kh, kw = w.shape
    check_conv_filter_count(op, f, w.shape[0])
    check_conv_shapes(op, (b, None, *image_hw), w.shape, stride, padding, groups)
    check_conv_gradient_hw(op, (ho, wo), image_hw, (kh, kw), stride, padding)
    dtype = np.result_type(dy, w)
    (h, wd), (ph, pw), (sh, sw) = image_hw, padding, stride
    fg = f // groups
    dxp = np.zeros((b, groups, cg, h + 2 * ph, wd + 2 * pw), dtype=dtype)
    dyt = dy.reshape(b, groups, fg, ho, wo).transpose(1, 0, 3, 4, 2)
    dyt = dyt.reshape(groups, b * ho * wo, fg)
    wg = w.reshape(groups, fg, cg, kh, kw)
    for i in range(kh):
        rows = slice(i, i + (ho - 1) * sh + 1, sh)
        for j in range(kw):
            cols = slice(j, j + (wo - 1) * sw + 1, sw)
            tap = np.matmul(dyt, wg[:, :, :, i, j])  # (groups, B*Ho*Wo, C/groups)
            dxp[:, :, :, rows, cols] += tap.reshape(groups, b, ho, wo, cg).transpose(
                1, 0, 4, 2, 3
            )
    dxp = dxp.reshape(b, groups * cg, h + 2 * ph, wd + 2 * pw)
    return np.ascontiguousarray(dxp[:, :, ph : ph + h, pw : pw + wd])


def conv_backward_filter_reference(
    x: np.ndarray,
    dy: np.ndarray,
    filter_hw: tuple[int, int],
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    groups: int = 1,
) -> np.ndarray:
    """Gradient of the convolution with respect to the filters, in numpy.

    Parameters
    ----------
    x : ndarray, shape (B, C, H, W)
        Images.
    dy : ndarray, shape (B, F, Ho, Wo)
        Gradient with respect to the forward output.
    filter_hw : pair of int
        (kh, kw) of the filters.
    stride, padding, groups
        As in :func:`conv_forward_reference`.

    Returns
    -------
    ndarray, shape (F, C/groups, kh, kw)
        ``dw`` with ``sum(dw * w) == sum(dy * conv_forward_reference(x, w))``
        for every ``w``.

    Raises
    ------
    ValueError
        If (Ho, Wo) is not the forward output shape, or the batches differ.

    Notes
    -----
    The same im2col matrix as the forward pass, multiplied on the left by the
    gradient (one batched matmul over groups per chunk of images, chunks as in
    :func:`conv_forward_reference`).
    """
    op = "conv_backward_filter_reference"
    x, dy = np.asarray(x), np.asarray(dy)
    stride, padding, groups = conv_params(stride, padding, groups, op)
    filter_hw = pair(filter_hw, "filter_hw", op, minimum=1)
    if x.ndim != 4 or dy.ndim != 4:
        raise ValueError(f"{op}: x and dy must have 4 dims, got {x.ndim} and {dy.ndim}")
    b, c, h, wd = x.shape
    _, f, ho, wo = dy.shape
    check_conv_batch(op, b, dy.shape[0])
    check_conv_shapes(op, x.shape, (f, None, *filter_hw), stride, padding, groups)
    check_conv_gradient_hw(op, (ho, wo), (h, wd), filter_hw, stride, padding)
    dtype = np.result_type(x, dy)
    kh, kw = filter_hw
    cg, fg = c // groups, f // groups
    win = _windows(_pad(x, padding), filter_hw, stride, (ho, wo))
    dw = np.zeros((groups, fg, cg * kh * kw), dtype=dtype)
    nb = _chunk(ho * wo * c * kh * kw)
    for b0 in range(0, b, nb):
        part = win[b0 : b0 + nb]
        n = part.shape[0]
        # (groups, F/groups, n*Ho*Wo) in the im2col row order (image, row, col)
        dyt = dy[b0 : b0 + n].reshape(n, groups, fg, ho * wo).transpose(1, 2, 0, 3)
        dw += np.matmul(dyt.reshape(groups, fg, n * ho * wo), _im2col(part, groups))
    return dw.reshape(f, cg, kh, kw)


# --------------------------------------------------------------------------
# ops: one skeleton per op, shared with the GPU ops
# --------------------------------------------------------------------------


def _static_pair(v: TensorVariable) -> tuple[int | None, int | None]:
    """The entries of a length-2 int vector known before run time, else None.

    Recognises constants, ``x.shape[a:b]`` of a tensor with static shape
    (what the pullbacks pass), ``x.shape`` itself and ``MakeVector`` of
    constant scalars.
    """
    if isinstance(v, TensorConstant):
        data = np.asarray(v.data).reshape(-1)
        if data.shape[0] == 2:
            return int(data[0]), int(data[1])
        return None, None
    node = v.owner
    if node is not None and isinstance(node.op, Subtensor):
        src = node.inputs[0]
        if src.owner is not None and isinstance(src.owner.op, Shape):
            static = src.owner.inputs[0].type.shape
            idx = get_idx_list(node.inputs, node.op.idx_list)
            if len(idx) == 1 and isinstance(idx[0], slice):
                try:
                    sl = slice(
                        *(
                            None
                            if e is None
                            else int(get_underlying_scalar_constant_value(e))
                            for e in (idx[0].start, idx[0].stop, idx[0].step)
                        )
                    )
                except NotScalarConstantError:
                    return None, None
                part = static[sl]
                if len(part) == 2:
                    return part[0], part[1]
            return None, None
    if node is not None and isinstance(node.op, Shape):
        static = node.inputs[0].type.shape
        if len(static) == 2:
            return static[0], static[1]
        return None, None
    out: list[int | None] = []
    for i in range(2):
        try:
            out.append(int(get_underlying_scalar_constant_value(v[i])))
        except (NotScalarConstantError, IndexError, ValueError, TypeError):
            out.append(None)
    return out[0], out[1]


def _hw_vector(op: str, role: str, v: Any, axes: str) -> TensorVariable:
    """Validate an (H, W)-style int vector input and make it int64."""
    v = int_tensor(op, role, v, 1, axes)
    length = v.type.shape[0]
    if length is None:
        try:
            length = pt.get_vector_length(v)
        except ValueError:
            length = None
    if length is not None and length != 2:
        raise ValueError(f"{op}: {role} must have 2 entries {axes}, got {length}")
    if isinstance(v, TensorConstant):
        check_hw_values(op, role, tuple(int(e) for e in np.asarray(v.data)))
        return pt.constant(np.asarray(v.data, dtype="int64"))
    return v if v.type.dtype == "int64" else pt.cast(v, "int64")


def _sum_terms(terms: Sequence[Variable]) -> Variable:
    if not terms:
        return disconnected_type()
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


class ConvFamily(NamedTuple):
    """The convolution op classes of one backend by role: a skeleton's ``family``
    (:mod:`cc2ops._op`; :data:`HOST_FAMILY` here, ``GPU_FAMILY`` on the GPU)."""

    filter_acts: type
    image_acts: type
    weight_acts: type


class ConvSkeleton:
    """Parameters of the three convolution ops, host and GPU alike.

    The base of the per-op skeletons below, for op classes whose
    ``__props__`` start with ``("stride", "padding", "groups")``.
    ``family`` is the op classes of the op's backend (:class:`ConvFamily`);
    ``accumulate`` is true for a GPU gradient op that adds into a fourth
    input ``acc`` (the host ops never do).
    """

    stride: tuple[int, int]
    padding: tuple[int, int]
    groups: int
    family: ClassVar[ConvFamily]
    accumulate: bool = False

    def __init__(
        self,
        *,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        groups: int = 1,
    ):
        self.stride, self.padding, self.groups = conv_params(
            stride, padding, groups, type(self).__name__
        )

    @property
    def _name(self) -> str:
        return type(self).__name__

    def _params(self) -> dict[str, Any]:
        """The parameters a family op is built with (no ``accumulate``)."""
        return dict(stride=self.stride, padding=self.padding, groups=self.groups)


class FilterActsSkeleton(ConvSkeleton):
    """:class:`FilterActs` and its GPU twin but for ``make_node`` and ``perform``.

    ``(x, w) -> y``: the static-shape rule (:meth:`_out_shape`), the shape
    rule, pullback (``family.image_acts`` and ``family.weight_acts``) and
    pushforward (the op itself, once per connected tangent).
    """

    def _out_shape(self, x: Variable, w: Variable) -> tuple:
        shape_x, shape_w = x.type.shape, w.type.shape
        return check_conv_shapes(
            self._name, shape_x, shape_w, self.stride, self.padding, self.groups
        )

    def _infer_shape(self, node, input_shapes):
        (b, _, h, wd), (f, _, kh, kw) = input_shapes[:2]
        return [
            (
                b,
                f,
                conv_output_length(h, kh, self.stride[0], self.padding[0]),
                conv_output_length(wd, kw, self.stride[1], self.padding[1]),
            )
        ]

    def pullback(self, inputs, outputs, cotangents):
        x, w = inputs
        gy = self._cotangent(cotangents[0], outputs[0])
        gx = self.family.image_acts(**self._params())(gy, w, self._hw_of(x))
        gw = self.family.weight_acts(**self._params())(x, gy, self._hw_of(w))
        return [gx, gw]

    def pushforward(self, inputs, outputs, tangents):
        x, w = inputs
        tx, tw = tangents
        terms = []
        if not is_disconnected(tx):
            terms.append(self(self._cotangent(tx, x), w))
        if not is_disconnected(tw):
            terms.append(self(x, self._cotangent(tw, w)))
        return [_sum_terms(terms)]


class _ConvGradSkeleton(ConvSkeleton):
    """What the two gradient skeletons share: ``(a, b, hw[, acc])``, linear in
    ``a`` and ``b``, with an int vector input ``hw`` (the image or filter
    size) that is disconnected, and the optional accumulator ``acc``.

    A subclass names ``hw`` (``_hw_role``, ``_hw_axes``), its static-shape
    rule in :mod:`cc2ops.shapes` (``_shape_rule``), its symbolic shape
    (``_plain_shape``) and the pullbacks wrt ``a`` and ``b``
    (``_data_grads``).
    """

    _hw_role: str
    _hw_axes: str

    def _out_shape(self, a: Variable, b: Variable, hw: Any) -> tuple:
        """``(hw as an int64 vector, the result's static shape)``, validated."""
        op = self._name
        hw = _hw_vector(op, self._hw_role, hw, self._hw_axes)
        shape = self._shape_rule(
            op,
            a.type.shape,
            b.type.shape,
            _static_pair(hw),
            self.stride,
            self.padding,
            self.groups,
        )
        return hw, shape

    def _infer_shape(self, node, input_shapes):
        if self.accumulate:
            return [input_shapes[3]]
        return [self._plain_shape(input_shapes, node.inputs[2])]

    def pullback(self, inputs, outputs, cotangents):
        a, b = inputs[:2]
        g = self._cotangent(cotangents[0], outputs[0])
        grads = [*self._data_grads(a, b, g), disconnected_type()]
        if self.accumulate:
            grads.append(g)
        return grads

    def connection_pattern(self, node):
        pattern = [[True], [True], [False]]
        if self.accumulate:
            pattern.append([True])
        return pattern

    def _nargs(self, args: tuple) -> None:
        want = 4 if self.accumulate else 3
        if len(args) != want:
            extra = " (the accumulator acc last)" if self.accumulate else ""
            raise TypeError(
                f"{self._name}: takes {want} inputs{extra} with accumulate="
                f"{self.accumulate}, got {len(args)}"
            )

    def pushforward(self, inputs, outputs, tangents):
        # linear in both data inputs (and in acc): the op without accumulation
        # applied once per connected tangent, plus acc's tangent
        a, b, hw = inputs[:3]
        ta, tb = tangents[:2]
        plain = type(self)(**self._params())
        terms = []
        if not is_disconnected(ta):
            terms.append(plain(self._cotangent(ta, a), b, hw))
        if not is_disconnected(tb):
            terms.append(plain(a, self._cotangent(tb, b), hw))
        if self.accumulate and not is_disconnected(tangents[3]):
            terms.append(self._cotangent(tangents[3], a))
        return [_sum_terms(terms)]


class ImageActsSkeleton(_ConvGradSkeleton):
    """:class:`ImageActs` and its GPU twin but for ``make_node`` and ``perform``.

    ``(dy, w, image_hw[, acc]) -> dx``: the ``image_hw`` input and
    static-shape rule (:meth:`_out_shape`), the shape rule, connection
    pattern, pullback (``family.filter_acts`` and ``family.weight_acts``) and
    pushforward.
    """

    _hw_role, _hw_axes = "image_hw", "(H, W)"
    _shape_rule = staticmethod(image_acts_shape)

    def _plain_shape(self, input_shapes, hw):
        (b, _, _, _), (_, cg, _, _) = input_shapes[:2]
        return (b, cg * self.groups, hw[0], hw[1])

    def _data_grads(self, dy, w, gdx):
        return [
            self.family.filter_acts(**self._params())(gdx, w),
            self.family.weight_acts(**self._params())(gdx, dy, self._hw_of(w)),
        ]


class WeightActsSkeleton(_ConvGradSkeleton):
    """:class:`WeightActs` and its GPU twin but for ``make_node`` and ``perform``.

    ``(x, dy, filter_hw[, acc]) -> dw``: the ``filter_hw`` input and
    static-shape rule (:meth:`_out_shape`), the shape rule, connection
    pattern, pullback (``family.image_acts`` and ``family.filter_acts``) and
    pushforward.
    """

    _hw_role, _hw_axes = "filter_hw", "(kh, kw)"
    _shape_rule = staticmethod(weight_acts_shape)

    def _plain_shape(self, input_shapes, khw):
        (_, c, _, _), (_, f, _, _) = input_shapes[:2]
        return (f, c // self.groups, khw[0], khw[1])

    def _data_grads(self, x, dy, gdw):
        return [
            self.family.image_acts(**self._params())(dy, gdw, self._hw_of(x)),
            self.family.filter_acts(**self._params())(x, gdw),
        ]


class _ConvOp(Cc2Op):
    """The host convolution ops' base: their props and the host op machinery."""

    __props__ = ("stride", "padding", "groups")


class FilterActs(FilterActsSkeleton, _ConvOp):
    """Forward convolution (cross-correlation), bc01.

    ``FilterActs(stride=..., padding=..., groups=...)(x, w) -> y``.

    Parameters
    ----------
    stride : int or pair of int
        Step between filter positions, (rows, cols); >= 1.
    padding : int or pair of int
        Zero padding on each side, (rows, cols); >= 0.
    groups : int
        Channel groups; must divide C and F.

    Notes
    -----
    Inputs: images x (B, C, H, W) and filters w (F, C/groups, kh, kw) of one
    float dtype; output (B, F, Ho, Wo) with ``Ho = floor((H + 2*ph - kh)/sh)
    + 1``. ``perform`` runs :func:`conv_forward_reference`. The pullback is
    ``ImageActs`` (images) and ``WeightActs`` (filters).
    """

    def make_node(self, x: Any, w: Any) -> Apply:
        op = "FilterActs"
        x = float_tensor(op, "images", x, 4, IMAGE_AXES)
        w = float_tensor(op, "filters", w, 4, FILTER_AXES)
        dtype = same_dtype(op, images=x, filters=w)
        shape = self._out_shape(x, w)
        return Apply(self, [x, w], [pt.tensor(dtype=dtype, shape=shape)])

    def perform(self, node, inputs, output_storage):
        x, w = inputs
        check_conv_shapes(
            "FilterActs", x.shape, w.shape, self.stride, self.padding, self.groups
        )
        output_storage[0][0] = conv_forward_reference(
            x, w, self.stride, self.padding, self.groups
        )


class ImageActs(ImageActsSkeleton, _ConvOp):
    """Gradient of the convolution with respect to the images, bc01.

    ``ImageActs(stride=..., padding=..., groups=...)(dy, w, image_hw) -> dx``.

    Parameters
    ----------
    stride, padding, groups
        Those of the forward ``FilterActs``.

    Notes
    -----
    Inputs: the output gradient dy (B, F, Ho, Wo), the filters w
    (F, C/groups, kh, kw) of dy's dtype, and ``image_hw``, an int vector
    (H, W) of the images (a constant or ``x.shape[2:]``; the floor in the
    output-size rule makes it necessary). Output dx (B, C, H, W). (Ho, Wo)
    must be the forward output shape of (H, W); where that is known only at
    run time ``perform`` checks it. Linear in dy and in w: the pullback is
    ``FilterActs`` (dy) and ``WeightActs`` (w).
    """

    def make_node(self, dy: Any, w: Any, image_hw: Any) -> Apply:
        op = "ImageActs"
        dy = float_tensor(op, "gradient", dy, 4, GRADIENT_AXES)
        w = float_tensor(op, "filters", w, 4, FILTER_AXES)
        dtype = same_dtype(op, gradient=dy, filters=w)
        image_hw, shape = self._out_shape(dy, w, image_hw)
        return Apply(self, [dy, w, image_hw], [pt.tensor(dtype=dtype, shape=shape)])

    def perform(self, node, inputs, output_storage):
        op = "ImageActs"
        dy, w, image_hw = inputs
        hw = hw_value(op, "image_hw", image_hw)
        b, f, ho, wo = dy.shape
        check_conv_filter_count(op, f, w.shape[0])
        check_conv_shapes(
            op, (b, None, *hw), w.shape, self.stride, self.padding, self.groups
        )
        check_conv_gradient_hw(op, (ho, wo), hw, w.shape[2:], self.stride, self.padding)
        output_storage[0][0] = conv_backward_data_reference(
            dy, w, hw, self.stride, self.padding, self.groups
        )


class WeightActs(WeightActsSkeleton, _ConvOp):
    """Gradient of the convolution with respect to the filters, bc01.

    ``WeightActs(stride=..., padding=..., groups=...)(x, dy, filter_hw) -> dw``.

    Parameters
    ----------
    stride, padding, groups
        Those of the forward ``FilterActs``.

    Notes
    -----
    Inputs: the images x (B, C, H, W), the output gradient dy (B, F, Ho, Wo)
    of x's dtype, and ``filter_hw``, an int vector (kh, kw) (a constant or
    ``w.shape[2:]``). Output dw (F, C/groups, kh, kw). (Ho, Wo) must be the
    forward output shape; where that is known only at run time ``perform``
    checks it. Linear in x and in dy: the pullback is ``ImageActs`` (x) and
    ``FilterActs`` (dy).
    """

    def make_node(self, x: Any, dy: Any, filter_hw: Any) -> Apply:
        op = "WeightActs"
        x = float_tensor(op, "images", x, 4, IMAGE_AXES)
        dy = float_tensor(op, "gradient", dy, 4, GRADIENT_AXES)
        dtype = same_dtype(op, images=x, gradient=dy)
        filter_hw, shape = self._out_shape(x, dy, filter_hw)
        return Apply(self, [x, dy, filter_hw], [pt.tensor(dtype=dtype, shape=shape)])

    def perform(self, node, inputs, output_storage):
        op = "WeightActs"
        x, dy, filter_hw = inputs
        khw = hw_value(op, "filter_hw", filter_hw)
        check_conv_batch(op, x.shape[0], dy.shape[0])
        check_conv_shapes(
            op,
            x.shape,
            (dy.shape[1], None, *khw),
            self.stride,
            self.padding,
            self.groups,
        )
        check_conv_gradient_hw(
            op, dy.shape[2:], x.shape[2:], khw, self.stride, self.padding
        )
        output_storage[0][0] = conv_backward_filter_reference(
            x, dy, khw, self.stride, self.padding, self.groups
        )


#: The host convolution ops by role (their skeletons' ``family``).
HOST_FAMILY = ConvFamily(FilterActs, ImageActs, WeightActs)
_ConvOp.family = HOST_FAMILY


# --------------------------------------------------------------------------
# builder
# --------------------------------------------------------------------------


def conv2d(
    x: Any,
    w: Any,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    groups: int = 1,
    layout: str = "bc01",
) -> TensorVariable:
    """2-D convolution (cross-correlation, as ``torch.nn.functional.conv2d``).

    Parameters
    ----------
    x : tensor-like, float32 or float64
        Images: (B, C, H, W) for ``layout="bc01"``, (C, H, W, B) for
        ``layout="c01b"``.
    w : tensor-like, float32 or float64
        Filters: (F, C/groups, kh, kw) for ``"bc01"``, (C/groups, kh, kw, F)
        for ``"c01b"``. Filter ``f`` sees the channels of group
        ``f // (F/groups)``.
    stride : int or pair of int
        Step between filter positions, (rows, cols); >= 1.
    padding : int or pair of int
        Zero padding on each side, (rows, cols); >= 0.
    groups : int
        Number of channel groups; a positive int dividing C and F.
    layout : {"bc01", "c01b"}
        Axis order of ``x``, ``w`` and the result.

    Returns
    -------
    TensorVariable
        (B, F, Ho, Wo) for ``"bc01"``, (F, Ho, Wo, B) for ``"c01b"``, in the
        common float dtype of ``x`` and ``w`` (mixed dtypes are upcast).

    Raises
    ------
    TypeError
        ``x`` or ``w`` not a tensor (``None``, a string, ...), wrong number of
        dims, non-float dtype, parameters that are not ints (bools included).
    ValueError
        Bad layout, stride < 1, padding < 0, groups < 1 or not dividing C and
        F, channel mismatch, filter larger than the padded image.

    Notes
    -----
    ``Ho = floor((H + 2*ph - kh) / sh) + 1`` and likewise ``Wo``.
    cuda-convnet2 rounded this up (its last filter position could hang over
    the padded edge); cc2ops rounds down, like PyTorch and cuDNN, so trailing
    rows/columns that no filter position reaches get zero gradient.
    The op computes in bc01; ``"c01b"`` inserts dimshuffles around it. The
    graph is a :class:`FilterActs` node; its gradients of every order are
    :class:`ImageActs` / :class:`WeightActs` / :class:`FilterActs` nodes.
    """
    name = "conv2d"
    check_layout(name, layout)
    op = FilterActs(stride=stride, padding=padding, groups=groups)
    x, w = upcast_floats(name, images=x, filters=w)
    filter_axes = FILTER_AXES if layout == "bc01" else FILTER_AXES_C01B
    x = float_tensor(name, "images", x, 4, axes_doc(layout))
    w = float_tensor(name, "filters", w, 4, filter_axes)
    y = op(images_to_bc01(x, layout), filters_to_bc01(w, layout))
    return images_from_bc01(y, layout)
