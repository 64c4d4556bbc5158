"""The integers of one convolution problem, and how the im2col path chunks it.

Pure functions, no CUDA: :class:`ConvGeometry` is the autotuner's key and the
input of every algorithm module (:mod:`~cc2ops.cuda.ops.conv.ops`,
:mod:`~cc2ops.cuda.ops.conv.fft`, :mod:`~cc2ops.cuda.ops.conv.igemm`), which is
why it lives apart from all of them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from cc2ops.shapes import check_conv_shapes

__all__ = ["ConvGeometry", "geometry_of", "plan_chunk", "INT32_MAX"]


@dataclass(frozen=True)
class ConvGeometry:
    """Every integer that fixes one convolution problem, bc01.

    Images (batch, channels, height, width), filters
    (filters, channels/groups, kh, kw), output (batch, filters, out_h, out_w).
    Built by :func:`geometry_of`; the autotuner's key and conv_igemm's input.
    """

    batch: int
    channels: int
    height: int
    width: int
    filters: int
    kh: int
    kw: int
    stride_h: int
    stride_w: int
    pad_h: int
    pad_w: int
    groups: int
    out_h: int
    out_w: int


#: The largest index a 32-bit signed kernel index holds (2**31 - 1).
INT32_MAX = 2**31 - 1
#: Row alignment (bytes) that plan_chunk gives the im2col GEMMs.
_ALIGN_BYTES = 16


# --------------------------------------------------------------------------
# geometry and chunk planning (pure)
# --------------------------------------------------------------------------


def geometry_of(
    op: str,
    image_shape: Sequence[int],
    filter_shape: Sequence[int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    groups: int,
) -> ConvGeometry:
    """The :class:`ConvGeometry` of images (B, C, H, W) and filters
    (F, C/groups, kh, kw), validated with :func:`cc2ops.shapes.check_conv_shapes`.
    """
    return _geometry(
        op,
        tuple(int(v) for v in image_shape),
        tuple(int(v) for v in filter_shape),
        tuple(stride),
        tuple(padding),
        int(groups),
    )


@functools.lru_cache(maxsize=4096)
def _geometry(
    op: str,
    image_shape: tuple[int, ...],
    filter_shape: tuple[int, ...],
    stride: tuple[int, int],
    padding: tuple[int, int],
    groups: int,
) -> ConvGeometry:
    # memoised: the pass functions ask for it on every call (errors are not
    # cached, so a bad shape raises every time)
    b, c, h, w = image_shape
    f, cg, kh, kw = filter_shape
    _, _, ho, wo = check_conv_shapes(
        op, (b, c, h, w), (f, cg, kh, kw), stride, padding, groups
    )
    return ConvGeometry(
        b, c, h, w, f, kh, kw, stride[0], stride[1], padding[0], padding[1],
        groups, int(ho), int(wo),
    )  # fmt: skip


def plan_chunk(g: ConvGeometry, itemsize: int, budget_bytes: int) -> int:
    """Images per chunk of the im2col path.

    The largest count whose (C*kh*kw, nb*Ho*Wo) column matrix fits in
    ``budget_bytes`` (at least one image), lowered so that every buffer and
    kernel index stays below 2^31 elements, then balanced so that the chunks
    of the batch have nearly equal sizes (129 images with room for 64 give
    three chunks of 43). When the batch takes more than one chunk, the count
    is then rounded to a multiple that makes ``nb*Ho*Wo`` a multiple of 16
    bytes: that product is the leading dimension of every GEMM of the path,
    and cuBLAS's tensor-core kernels want 16-byte aligned rows (at 13x13
    outputs, 43 images give rows of 7267 floats, 44 give 7436). Up when the
    columns stay within 1.25 times the budget and the 2^31 limits, else down
    when that leaves at least one step, else not at all.

    Raises
    ------
    ValueError
        If a single image needs more than 2^31 elements in some buffer.
    """
    if g.batch <= 0:
        return 1
    p = g.out_h * g.out_w
    per_image = {
        "columns": g.channels * g.kh * g.kw * p,
        "images": g.channels * g.height * g.width,
        "outputs": g.filters * p,
    }
    worst = max(per_image, key=lambda k: per_image[k])
    if per_image[worst] > INT32_MAX:
        raise ValueError(
            f"conv im2col: one image needs {per_image[worst]} elements of {worst}, "
            f"above the 2^31 limit of the kernels ({g})"
        )
    hard = min(g.batch, *(INT32_MAX // max(1, v) for v in per_image.values()))
    nb = min(hard, max(1, int(budget_bytes) // max(1, per_image["columns"] * itemsize)))
    chunks = -(-g.batch // nb)
    nb = -(-g.batch // chunks)
    if nb < g.batch:
        align = max(1, _ALIGN_BYTES // int(itemsize))
        step = align // math.gcd(p, align)
        up = -(-nb // step) * step
        cols = per_image["columns"] * int(itemsize)
        if up <= hard and up * cols * 4 <= int(budget_bytes) * 5:
            nb = min(up, g.batch)
        elif nb >= step:
            nb = nb // step * step
    return nb
