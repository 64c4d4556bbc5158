"""Hand-written tensor-core convolution kernels: implicit GEMM, TF32 and 3xTF32.

The three convolution passes of the conv family (bc01 layout, cross-correlation,
see :mod:`cc2ops.conv`) as one GEMM ``C[M, N] = A[M, K] B[K, N]`` per channel
group, run by ``kernels/conv_igemm.cu`` with ``mma.sync.m16n8k8`` TF32 tensor
core instructions (sm_80 and later), fp32 accumulation and a 3-stage
``cp.async`` pipeline from global to shared memory. The im2col matrix is never
built: each thread computes the addresses of the elements it copies, and
out-of-image taps are zero-filled by the copy itself.

================  ==========  ==========  ============  =======================
op                M           N           K             A, B -> C
================  ==========  ==========  ============  =======================
``filter_acts``   F/g         B*Ho*Wo     C/g*kh*kw     w, im2col(x) -> y
``image_acts``    C/g         B*H*W       F/g*kh*kw     w, gather(dy) -> dx
``weight_acts``   F/g         C/g*kh*kw   B*Ho*Wo       dy, im2col(x)^T -> dw
================  ==========  ==========  ============  =======================

``image_acts`` is the gather formulation: input pixel (ih, iw) sums over the
filter taps (u, v) whose output position ``((ih + ph - u)/sh, (iw + pw -
v)/sw)`` is integral and inside the output, so any stride is exact (for stride
s only about 1/s^2 of the taps contribute and the rest are predicated-off
zeros: correct, not fast). ``weight_acts`` splits its long K (every output
pixel of the batch) into slices that write partial results to a workspace,
summed afterwards in a fixed order by a second kernel: deterministic, no
atomics.

Precision
---------
``precision="tf32"``: every operand is rounded to TF32 (10-bit mantissa,
``cvt.rna``) and multiplied on the tensor cores: relative error about 1e-3.

``precision="fp32"``: **3xTF32**, an fp32-accurate algorithm on the tensor
cores, not FFMA. Each operand is split as ``a = big + small`` with ``big =
tf32(a)`` and ``small = tf32(a - big)`` (22 of fp32's 24 mantissa bits), and
``a*b ~ small*big + big*small + big*big`` (the ``small*small`` term, about
2^-22 relative, is dropped): relative error about 1e-6, within fp32
tolerances, at a third of the TF32 tensor-core rate. The tensor cores do not
accumulate in round-to-nearest fp32: inside an ``mma`` the addends are
aligned to the largest and truncated, so accumulating into a large
accumulator loses low bits with a bias, and the error grows linearly with K
(measured on an H200: 1.1e-5 at K = 1600, 3.4e-5 at K = 4800). So each k8
step's three products go to a zeroed fragment (small terms first) that is
added to the accumulators with ordinary round-to-nearest FADDs, the
promotion DeepSeek-V3 applies to FP8 ``wgmma``: the truncation then acts on
sums of 8 products only (the tests model it in numpy). The extra fragment
costs registers: 3xTF32 kernels get up to 255 per thread (one 256-thread or
two 128-thread blocks per SM), spill-free.

Data movement
-------------
:class:`TileConfig` switches two paths of the template (both on by default,
both off is the original kernel): ``vec`` copies A as 16-byte vectors of 4
consecutive k where that is exact (:func:`a_vector_width`: ``filter_acts``
with ``K % 4 == 0``, ``weight_acts`` with ``Ho*Wo % 4 == 0``, and A's
pointer 16-byte aligned), else 4-byte copies; ``stage_c`` writes C through
shared memory so that each warp store covers 32 consecutive n of one row.

Hopper warpgroup MMA
--------------------
The tiles of :data:`WGMMA_TILES` (``TileConfig.wgmma``; tap-major
``filter_acts`` and ``image_acts``, TF32) replace ``mma.sync`` by
``wgmma.mma_async.m64nNk8.f32.tf32.tf32``: each warpgroup of 128 threads
multiplies 64 rows of the tile by all its columns with both operands read by
the tensor cores straight from shared memory, K-major in the 128-byte
swizzle, through matrix descriptors (see "wgmma" in the .cu). They compile
for ``sm_90a`` (:func:`cc2ops.cuda.runtime.compile.kernel_arch`) and are offered
only on devices of compute capability 9.0 (:func:`variants`'
``capability``). The tensor cores truncate fp32 operands to TF32, so the
weights are rounded once when they are permuted and the activations are
truncated: relative error about 1e-3, as the other TF32 tiles. The layout,
the descriptors, the copy maps and the accumulator map are specified here
in :mod:`.twins` (``wgmma_smem_offset``, ``gmma_descriptor``, ``gmma_address``,
``wgmma_load_map``, ``wgmma_accumulator_map``) and its ``emulate_wgmma_block``
multiplies a tile through them.

Two switches of the ``wgmma`` tiles reach further. ``nhwc``
(:attr:`TileConfig.nhwc`): the image operand (x for ``filter_acts``, dy for
``image_acts``) is first transposed to channels-last, so that one row of a B
tile (one pixel, 32 channels of one tap) is 128 contiguous bytes, copied in
16-byte ``cp.async`` by the map of A (``twins.channels_last``,
``twins.b_offset``'s ``nhwc``). ``streamk`` (:attr:`TileConfig.streamk`): a
persistent grid of one wave of blocks shares the (tile, k tile) iterations
of all tiles evenly, so a tile count just past a whole number of waves (the
13x13 layers: 338 tiles of 128x128 for 132 SMs) leaves no SM idle; tiles
cut between blocks are summed in block order through a workspace by the
segment that finishes last (``twins.streamk_items``,
``twins.streamk_segments``; ``twins.emulate`` follows the schedule). The
192-row tiles run three consumer warpgroups (M = 192: conv2's forward and
conv3's input gradient).

The tiles of :data:`WGMMA_WGRAD_TILES` run ``weight_acts`` the same way,
one filter tap per block (op ``"wgradtm"``): per tap ``(u, v)`` a GEMM of
M = F/g filters, N = C/g channels and K = B*Ho*Wo pixels, both operands
K-major in global memory (dy's rows, and x's shifted rows), so both are
copied as A is above; the grid covers M and N tiles, taps, groups and
split-K slices of the pixels (:func:`_split_k`: about two waves of resident
blocks), the partials summed by the existing reduction. dy is copied with
16-byte ``cp.async`` wherever 4 pixels of a row are one aligned run of one
image, else 4-byte; both are truncated to TF32 by the tensor cores.
``twins.wgrad_copies`` specifies the copies and ``twins.emulate_wgrad_wgmma``
computes the pass through them.

Interface
---------
The conv GPU ops (``cc2ops.cuda.ops.conv.ops``) call :func:`supports`,
:func:`variants` and :func:`filter_acts` / :func:`image_acts` /
:func:`weight_acts` as autotuner candidates. ``geometry`` is a
:class:`cc2ops.cuda.ops.conv.geometry.ConvGeometry`.

The index arithmetic of the kernels is written down once more, in numpy, in
the test oracle :mod:`cc2ops.cuda.ops.conv.twins` (``a_offset``, ``b_offset``,
``c_offset``, ``fastdiv``, ``load_map``, ``fragment_map``, ``epilogue_map``),
and its ``emulate`` / ``emulate_block`` / ``emulate_epilogue`` compute
convolutions (and a block's product and stores) through it on the CPU: the
tests check them against :func:`cc2ops.conv.conv_forward_reference` and its
gradients, so the formulas the CUDA C uses are tested without a GPU.

Notes
-----
- float32 only; C-contiguous arrays (others are copied first).
- Every tensor, and the split-K workspace, must have fewer than 2^31
  elements (the kernels index in 32 bits): :func:`supports` says no otherwise.
- Needs a device of compute capability 8.0 or later (TF32 ``mma.sync``,
  ``cp.async``); the run functions raise ``ValueError`` on older devices,
  and for a ``wgmma`` tile on any device but compute capability 9.0.
- One kernel is compiled per (pass, filter size, stride, padding, tile,
  precision, copy width, epilogue); image and batch sizes, channels and
  groups are run-time values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cc2ops.cuda.ops.conv.geometry import ConvGeometry
from cc2ops.cuda.runtime.compile import (
    KernelSpec,
    kernel_cache,
    register_arch_suffix,
    register_namer,
    register_variants,
)

__all__ = [
    "OPS",
    "PRECISIONS",
    "TileConfig",
    "TILES",
    "TAP_TILES",
    "WGMMA_TILES",
    "WGMMA_WGRAD_TILES",
    "WGMMA_CAPABILITY",
    "tap_channels",
    "tapmajor_ok",
    "Plan",
    "gemm_shape",
    "fastdiv_magic",
    "a_vector_width",
    "streamk_grid",
    "plan",
    "supports",
    "kernel_spec",
    "variants",
    "filter_acts",
    "image_acts",
    "weight_acts",
]

#: The passes, by the names of the conv family's ops.
OPS = ("filter_acts", "image_acts", "weight_acts")
#: ``"fp32"``: 3xTF32 (fp32-accurate); ``"tf32"``: one TF32 product.
PRECISIONS = ("fp32", "tf32")

_TAG = {"filter_acts": "fwd", "image_acts": "dgrad", "weight_acts": "wgrad"}
_SPLIT = {"tf32": 1, "fp32": 3}
_INDEX_LIMIT = 2**31 - 1
_GRID_YZ_LIMIT = 65535
_REDUCE_BLOCK = 256
#: The compute capability of the devices that run the ``wgmma`` tiles (their
#: cubins are ``sm_90a``, which runs on 9.0 only).
WGMMA_CAPABILITY = (9, 0)
#: Bytes of a K-major wgmma operand row: bk = 32 floats, the 128-byte swizzle.
_SW128_ROW = 128


@dataclass(frozen=True)
class TileConfig:
    """A block tile: ``bm x bn`` of C per block, ``bk`` deep per pipeline stage.

    ``wm x wn`` warps, each owning a ``bm/wm x bn/wn`` sub-tile;
    ``stages`` shared-memory buffers in the ``cp.async`` ring.

    ``vec``: copy A with 16-byte ``cp.async`` (4 consecutive k) wherever the
    geometry and the pointer allow it (:func:`a_vector_width`), else 4-byte
    copies. ``stage_c``: write C through shared memory, a warp storing 32
    consecutive n of one row per instruction (coalesced), instead of straight
    from the mma fragments (4 scattered pairs of floats per row); needs a warp
    tile ``bn/wn`` that is a multiple of 32, else the direct stores are used.
    Both off is the original kernel.

    ``tapmajor`` (``filter_acts`` and ``image_acts`` only): K runs over the
    filter taps outermost and the channels (filters) innermost, with the
    weights permuted to match first, so that a ``bk``-deep slice of K is one
    tap and B's copies need no per-element index arithmetic; applies when
    ``bk`` divides the channels (filters) per group (:func:`tapmajor_ok`).

    ``wgmma`` (tap-major, TF32, compute capability 9.0): the Hopper
    warpgroup MMA kernel. ``bm/64`` warpgroups each multiply 64 rows by all
    ``bn`` columns, so ``wm = bm/16`` and ``wn = 1`` (a warp's accumulators
    are 16 rows of the tile, as a ``16 x bn`` warp tile of ``mma.sync``);
    ``bk = 32`` (a 128-byte operand row), ``stages >= 3`` (the ring runs
    ``stages - 2`` tiles ahead and one wgmma group stays in flight). With
    ``weight_acts`` a ``wgmma`` tile is the tap-major weight gradient (one
    filter tap per block, any channel count; see the module's notes), which
    also copies ``bm`` and ``bn`` rows in 8-thread groups
    (:meth:`valid_wgrad`).

    ``nhwc`` (``wgmma`` tiles of ``filter_acts`` and ``image_acts``): B's
    tensor (x, resp. dy) is first copied channels-last, (B, H, W, C) resp.
    (B, Ho, Wo, F), so that a B row (one pixel, one tap's ``bk`` channels)
    is 128 contiguous bytes: 16-byte copies, 8 threads per row, the map of
    A, instead of 4-byte copies gathered ``H*W`` floats apart.

    ``streamk`` (``wgmma`` tiles of ``filter_acts`` and ``image_acts``): a
    persistent grid of about one wave of blocks shares the (tile, k tile)
    iterations evenly (:func:`~.twins.streamk_items`), so a tile count just above a
    whole number of waves costs no idle SMs; tiles split between blocks are
    summed through a workspace by the block that finishes last.
    """

    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int = 3
    vec: bool = True
    stage_c: bool = True
    tapmajor: bool = False
    wgmma: bool = False
    nhwc: bool = False
    streamk: bool = False

    @property
    def threads(self) -> int:
        return self.wm * self.wn * 32

    def valid(self) -> bool:
        """The constraints the template asserts (load maps, warp tiling)."""
        t = self.threads
        ok = (
            self.bm % (16 * self.wm) == 0
            and self.bn % (8 * self.wn) == 0
            and self.bk % 8 == 0
            and t % self.bk == 0
            and (self.bm * self.bk) % t == 0
            and (self.bn * self.bk) % t == 0
            and t % self.bn == 0
            and self.stages >= 2
        )
        if not self.wgmma:
            return ok and not self.nhwc and not self.streamk
        return (
            ok
            and (not self.nhwc or (self.bn * 8) % t == 0)
            and self.tapmajor
            and self.vec
            and self.bk == 32
            and self.wn == 1
            and self.bm % 64 == 0
            and self.wm * 16 == self.bm
            and t // self.bn in (1, 2, 4)
            and self.bn <= 256
            and self.stages >= 3
        )

    def valid_wgrad(self) -> bool:
        """Whether this tile runs the tap-major weight gradient (``wgmma`` and
        both operands' rows in whole passes of ``threads/8`` rows)."""
        t = self.threads
        return (
            self.wgmma
            and self.valid()
            and (self.bm * 8) % t == 0
            and (self.bn * 8) % t == 0
        )

    @property
    def warp_tile(self) -> tuple[int, int]:
        return self.bm // self.wm, self.bn // self.wn

    def can_vec(self) -> bool:
        """Whether the 16-byte A load map fits (``bk/4`` vectors per row)."""
        v = self.bk // 4
        return self.threads % v == 0 and (self.bm * v) % self.threads == 0

    def can_stage_c(self) -> bool:
        """Whether the staged epilogue fits (warp tile width a multiple of 32)."""
        return self.warp_tile[1] % 32 == 0

    def stage_c_floats(self) -> int:
        """Floats of the epilogue's staging buffers: 16 rows of each warp's tile."""
        return (self.threads // 32) * 16 * (self.warp_tile[1] + 8)

    def smem_floats(self, op: str) -> tuple[int, int]:
        """Floats of one stage of A and of B (row strides padded, see the .cu;
        ``wgmma``: unpadded K-major rows, swizzled)."""
        if self.wgmma:
            return self.bm * self.bk, self.bn * self.bk
        a = self.bm * (self.bk + 8)
        if op == "weight_acts":
            b = self.bn * (self.bk + 8)
        else:
            b = self.bk * (self.bn + 4)
        return a, b

    def shared_bytes(self, op: str) -> int:
        """Dynamic shared memory: the stages and wgrad's tap table (int4/column);
        the epilogue's staging buffers reuse it (and enlarge it if they need to).
        ``wgmma`` stages start at a 1024-byte boundary: 1024 bytes of slack."""
        a, b = self.smem_floats(op)
        table = 16 * self.bn if op == "weight_acts" and not self.wgmma else 0
        pipeline = 4 * self.stages * (a + b) + table + (1024 if self.wgmma else 0)
        if self.stage_c and self.can_stage_c():
            return max(pipeline, 4 * self.stage_c_floats())
        return pipeline

    @property
    def label(self) -> str:
        flags = ("" if self.vec else "_a4") + ("" if self.stage_c else "_cdirect")
        flags += "_tm" if self.tapmajor else ""
        flags += "_wgmma" if self.wgmma else ""
        flags += "_nhwc" if self.nhwc else ""
        flags += "_sk" if self.streamk else ""
        return (
            f"bm{self.bm}_bn{self.bn}_bk{self.bk}_w{self.wm}x{self.wn}_st{self.stages}"
            + flags
        )


#: The tile shapes offered to the autotuner (largest first).
TILES = (
    TileConfig(128, 128, 16, 2, 4),  # 256 threads, warp tile 64x32
    TileConfig(128, 64, 16, 2, 2),  # 128 threads, warp tile 64x32
    TileConfig(64, 128, 16, 2, 2),  # 128 threads, warp tile 32x64
    TileConfig(64, 64, 32, 2, 2),  # 128 threads, warp tile 32x32
    TileConfig(32, 128, 32, 1, 4),  # 128 threads, warp tile 32x32, small M
)

#: Tap-major tiles offered beside :data:`TILES` where :func:`tapmajor_ok`.
TAP_TILES = (
    TileConfig(128, 128, 16, 2, 4, tapmajor=True),
    TileConfig(128, 128, 32, 2, 4, tapmajor=True),
    TileConfig(192, 128, 16, 2, 4, tapmajor=True),  # warp tile 96x32: M = 192
    TileConfig(128, 64, 16, 2, 2, tapmajor=True),
    TileConfig(64, 128, 16, 2, 2, tapmajor=True),
    TileConfig(64, 64, 32, 2, 2, tapmajor=True),
    TileConfig(32, 128, 32, 1, 4, tapmajor=True),  # small M (conv1's dgrad: 3)
)


def _wg(bm: int, bn: int, stages: int, nhwc: bool = False) -> TileConfig:
    return TileConfig(
        bm, bn, 32, bm // 16, 1, stages, tapmajor=True, wgmma=True, nhwc=nhwc
    )


#: Hopper warpgroup-MMA tiles (``wgmma``), offered beside :data:`TAP_TILES`
#: for TF32 where :func:`tapmajor_ok`, on compute capability 9.0 only.
WGMMA_TILES = (
    _wg(128, 128, 4),  # 2 warpgroups, 129 KiB: one block per SM
    _wg(128, 256, 4),  # 2 warpgroups of 64 x 256, 193 KiB
    _wg(128, 128, 3),  # 97 KiB: two blocks per SM
    _wg(64, 128, 4),  # 1 warpgroup, M = 64; 97 KiB: two blocks per SM
    _wg(192, 192, 3),  # 3 warpgroups, M = 192 (conv2 fwd, conv3 dgrad); 145 KiB
    _wg(192, 96, 3),  # 3 warpgroups, 109 KiB: two blocks per SM
    # B channels-last (16-byte B copies after a transpose of x, resp. dy)
    _wg(128, 128, 4, nhwc=True),
    _wg(128, 256, 4, nhwc=True),
    _wg(128, 128, 3, nhwc=True),
    _wg(64, 128, 4, nhwc=True),
    _wg(192, 192, 3, nhwc=True),
    _wg(192, 96, 3, nhwc=True),
    # stream-K over about one wave of the big channels-last tiles
    replace(_wg(128, 128, 4, nhwc=True), streamk=True),
    replace(_wg(128, 256, 4, nhwc=True), streamk=True),
    replace(_wg(192, 192, 3, nhwc=True), streamk=True),
)

#: Hopper warpgroup-MMA tiles of the tap-major weight gradient (op
#: ``"wgradtm"``), offered for ``weight_acts`` in TF32 on compute capability
#: 9.0 only: M is filters, N channels per group.
WGMMA_WGRAD_TILES = (
    _wg(128, 128, 4),  # 129 KiB: one block per SM (conv3..conv5)
    _wg(128, 64, 4),  # 97 KiB: two blocks per SM; N = 64 (conv2)
    _wg(64, 128, 4),  # 1 warpgroup, 97 KiB: two blocks per SM
    _wg(64, 64, 4),  # 1 warpgroup, 65 KiB: small M and N
)


# --------------------------------------------------------------------------
# index arithmetic: the spec of the CUDA C, in numpy
# --------------------------------------------------------------------------


def _dims(g: ConvGeometry) -> dict[str, int]:
    return dict(
        B=int(g.batch),
        C=int(g.channels),
        H=int(g.height),
        W=int(g.width),
        F=int(g.filters),
        KH=int(g.kh),
        KW=int(g.kw),
        SH=int(g.stride_h),
        SW=int(g.stride_w),
        PH=int(g.pad_h),
        PW=int(g.pad_w),
        G=int(g.groups),
        OH=int(g.out_h),
        OW=int(g.out_w),
        Cg=int(g.channels) // int(g.groups),
        Fg=int(g.filters) // int(g.groups),
    )


def gemm_shape(op: str, g: ConvGeometry) -> tuple[int, int, int]:
    """``(M, N, K)`` of one group's GEMM for ``op`` (see the module table)."""
    d = _dims(g)
    khkw = d["KH"] * d["KW"]
    if op == "filter_acts":
        return d["Fg"], d["B"] * d["OH"] * d["OW"], d["Cg"] * khkw
    if op == "image_acts":
        return d["Cg"], d["B"] * d["H"] * d["W"], d["Fg"] * khkw
    if op == "weight_acts":
        return d["Fg"], d["Cg"] * khkw, d["B"] * d["OH"] * d["OW"]
    raise ValueError(f"conv_igemm: op must be one of {OPS}, got {op!r}")


def _divisors(op: str, g: ConvGeometry) -> tuple[int, int]:
    """The run-time divisors (d1, d2): pixels per image and pixels per row."""
    d = _dims(g)
    if op == "image_acts":
        return d["H"] * d["W"], d["W"]
    return d["OH"] * d["OW"], d["OW"]


def fastdiv_magic(d: int) -> tuple[int, int]:
    """``(magic, shift)`` with ``n // d == (umulhi(n, magic) + n) >> shift``.

    For ``1 <= d < 2^31`` and ``0 <= n < 2^31`` (Granlund and Montgomery;
    ``shift = ceil(log2 d)``, ``magic = 2^32 (2^shift - d) / d + 1`` rounded
    down, below 2^32). The kernels divide by run-time image sizes this way.
    """
    d = int(d)
    if not 1 <= d <= _INDEX_LIMIT:
        raise ValueError(f"fastdiv_magic: divisor must be in [1, 2^31), got {d}")
    shift = (d - 1).bit_length()
    magic = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return magic, shift


def tap_channels(op: str, g: ConvGeometry) -> int:
    """The inner extent of a tap-major K: channels per group (``filter_acts``)
    or filters per group (``image_acts``)."""
    d = _dims(g)
    if op == "filter_acts":
        return d["Cg"]
    if op == "image_acts":
        return d["Fg"]
    raise ValueError(
        f"conv_igemm: only filter_acts and image_acts are tap-major, got {op!r}"
    )


def tapmajor_ok(op: str, g: ConvGeometry, config: TileConfig) -> bool:
    """Whether the tap-major kernel applies: its ``bk``-deep K slices must each
    lie within one tap, so ``bk`` must divide :func:`tap_channels`.
    ``weight_acts``: the tap-major weight gradient (a tap per block) exists
    as a ``wgmma`` kernel only, and applies to any shape."""
    if op == "weight_acts":
        return config.valid_wgrad()
    return op in ("filter_acts", "image_acts") and tap_channels(op, g) % config.bk == 0


def _is_wgradtm(op: str, config: TileConfig) -> bool:
    return op == "weight_acts" and config.wgmma


def _kernel_gemm(op: str, g: ConvGeometry, config: TileConfig) -> tuple[int, int, int]:
    """``(M, N, K)`` of the kernel's GEMM: :func:`gemm_shape`, but per tap
    ``(F/g, C/g, B*Ho*Wo)`` for the tap-major weight gradient."""
    if _is_wgradtm(op, config):
        d = _dims(g)
        return d["Fg"], d["Cg"], d["B"] * d["OH"] * d["OW"]
    return gemm_shape(op, g)


def _out_shape(op: str, g: ConvGeometry) -> tuple[int, ...]:
    d = _dims(g)
    if op == "filter_acts":
        return (d["B"], d["F"], d["OH"], d["OW"])
    if op == "image_acts":
        return (d["B"], d["C"], d["H"], d["W"])
    return (d["F"], d["Cg"], d["KH"], d["KW"])


def _in_shapes(op: str, g: ConvGeometry) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of (A's tensor, B's tensor)."""
    d = _dims(g)
    x = (d["B"], d["C"], d["H"], d["W"])
    w = (d["F"], d["Cg"], d["KH"], d["KW"])
    dy = (d["B"], d["F"], d["OH"], d["OW"])
    return {"filter_acts": (w, x), "image_acts": (w, dy), "weight_acts": (dy, x)}[op]


# --------------------------------------------------------------------------
# wgmma: shared-memory layout, matrix descriptors, copy and accumulator maps
# --------------------------------------------------------------------------


# --------------------------------------------------------------------------
# stream-K: the schedule of the persistent wgmma tiles (the kernel's streamk_loop)
# --------------------------------------------------------------------------


#: Test hook: the blocks of every stream-K launch (None: one wave of them).
STREAMK_GRID: int | None = None


def streamk_grid(total: int, resident: int) -> int:
    """Blocks of a stream-K launch: the resident blocks of one wave, at most
    one per iteration (every block then runs at least one)."""
    if total < 1 or resident < 1:
        raise ValueError(
            f"conv_igemm: stream-K needs iterations and blocks, got {total}, {resident}"
        )
    return min(int(total), int(resident))


# --------------------------------------------------------------------------
# planning
# --------------------------------------------------------------------------


def a_vector_width(op: str, g: ConvGeometry, tapmajor: bool = False) -> int:
    """4 when every k-aligned group of 4 elements of A is one 16-byte vector.

    That is: contiguous in memory, 16-byte aligned (given an aligned base
    pointer) and wholly inside or outside ``[0, K)`` and every split-K slice.
    ``filter_acts``: A is w viewed as (F, K), so ``K % 4 == 0``.
    ``weight_acts``: A[m, k] is ``dy[img][grp*Fg + m][pix]``, contiguous
    within one image, so ``Ho*Wo % 4 == 0``. ``image_acts``: A[m, k] is
    ``w[grp*Fg + f][m][t]``, not contiguous along k: 1. Tap-major: A is a
    row of :func:`~.twins.permuted_weights` (K contiguous elements), so ``K % 4 == 0``.
    """
    if op not in OPS:
        raise ValueError(f"conv_igemm: op must be one of {OPS}, got {op!r}")
    d = _dims(g)
    if op == "filter_acts" or (tapmajor and op == "image_acts"):
        return 4 if gemm_shape(op, g)[2] % 4 == 0 else 1
    if op == "weight_acts":
        return 4 if (d["OH"] * d["OW"]) % 4 == 0 else 1
    return 1


def _consts(
    op: str, g: ConvGeometry, config: TileConfig, precision: str, aligned: bool = True
) -> dict:
    d = _dims(g)
    tm = config.tapmajor
    if tm and not tapmajor_ok(op, g, config):
        raise ValueError(
            f"conv_igemm: tap-major tile {config.label} applies to filter_acts and "
            f"image_acts whose channels (filters) per group bk={config.bk} divides, "
            f"not {op} on {g}"
        )
    vec_ok = config.vec and config.can_vec() and aligned
    avec = a_vector_width(op, g, tm) if vec_ok else 1
    if _is_wgradtm(op, config):
        # dy's rows: the kernel takes a 16-byte copy wherever a run of 4
        # pixels is one aligned vector (wgrad_copies), given an aligned pointer
        avec = 4 if vec_ok else 1
    elif config.wgmma and (precision != "tf32" or avec != 4):
        raise ValueError(
            f"conv_igemm: wgmma tile {config.label} runs TF32 with 16-byte A copies "
            f"only, not precision {precision!r} with {4 * avec}-byte copies"
        )
    if config.streamk and op == "weight_acts":
        raise ValueError(
            f"conv_igemm: stream-K tile {config.label} applies to filter_acts and "
            f"image_acts, not weight_acts"
        )
    if config.nhwc and op == "weight_acts":
        raise ValueError(
            f"conv_igemm: channels-last tile {config.label} applies to filter_acts "
            f"and image_acts, not weight_acts"
        )
    if _is_wgradtm(op, config) and precision != "tf32":
        raise ValueError(
            f"conv_igemm: wgmma tile {config.label} runs TF32 only, not precision "
            f"{precision!r}"
        )
    consts = dict(
        op=_TAG[op] + ("tm" if tm else ""),
        KH=d["KH"],
        KW=d["KW"],
        SH=d["SH"],
        SW=d["SW"],
        PH=d["PH"],
        PW=d["PW"],
        BM=config.bm,
        BN=config.bn,
        BK=config.bk,
        WM=config.wm,
        WN=config.wn,
        STAGES=config.stages,
        SPLIT=_SPLIT[precision],
        AVEC=avec,
        STAGE_C=int(config.stage_c and config.can_stage_c()),
        WGMMA=int(config.wgmma),
        BNHWC=int(config.nhwc),
        STREAMK=int(config.streamk),
    )
    consts["name"] = _kernel_name(**consts)
    return consts


@register_namer("conv_igemm")
def _kernel_name(op: str, **c: Any) -> str:
    prec = "3xtf32" if c["SPLIT"] == 3 else "tf32"
    flags = ("_av4" if c["AVEC"] == 4 else "") + ("_cst" if c["STAGE_C"] else "")
    flags += "_wgmma" if c.get("WGMMA") else ""
    flags += "_nhwc" if c.get("BNHWC") else ""
    flags += "_sk" if c.get("STREAMK") else ""
    return (
        f"conv_igemm_{op}_k{c['KH']}x{c['KW']}_s{c['SH']}x{c['SW']}"
        f"_p{c['PH']}x{c['PW']}_bm{c['BM']}_bn{c['BN']}_bk{c['BK']}"
        f"_w{c['WM']}x{c['WN']}_st{c['STAGES']}{flags}_{prec}"
    )


@register_arch_suffix("conv_igemm")
def _arch_suffix(**c: Any) -> str:
    """wgmma exists in the arch-specific target only: ``sm_90a``."""
    return "a" if c.get("WGMMA") else ""


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything a launch needs: kernel constants, grid, split-K slicing."""

    op: str
    config: TileConfig
    consts: dict
    m: int
    n: int
    k: int
    splits: int
    k_chunk: int
    grid: tuple[int, int, int]
    block: int
    shared_bytes: int
    divisors: tuple[int, int]
    #: stream-K: (M tiles, N tiles, k tiles per tile); the grid is (blocks, 1, 1)
    streamk: tuple[int, int, int] | None = None


def _slices(big_k: int, bk: int, splits: int) -> tuple[int, int]:
    """(k_chunk, splits): whole ``bk`` tiles per slice, no empty slice."""
    ktiles = -(-big_k // bk)
    k_chunk = -(-ktiles // splits) * bk
    return k_chunk, -(-big_k // k_chunk)


def _blocks_per_sm(config: TileConfig, op: str) -> int:
    """Resident blocks per SM of a ``wgmma`` tile (the template's MIN_BLOCKS:
    two where two stages' worth of shared memory fit in 228 KiB)."""
    a, b = config.smem_floats(op)
    return 2 if 2 * (4 * config.stages * (a + b) + 2048) <= 228 * 1024 else 1


def _split_k(op: str, g: ConvGeometry, config: TileConfig, num_sms: int) -> int:
    """Slices of K for ``weight_acts``: enough blocks for two per SM.

    The tap-major ``wgmma`` weight gradient: enough blocks (tiles x taps x
    groups x slices) for two waves of the resident blocks
    (:func:`_blocks_per_sm`), each slice at least 8 k tiles (256 pixels).
    """
    if op != "weight_acts":
        return 1
    if config.wgmma:
        big_m, big_n, big_k = _kernel_gemm(op, g, config)
        taps = int(g.kh) * int(g.kw) * int(g.groups)
        tiles = -(-big_m // config.bm) * -(-big_n // config.bn) * taps
        want = -(-2 * num_sms * _blocks_per_sm(config, op) // tiles)
        splits = max(1, min(want, -(-big_k // config.bk) // 8, 64))
        while splits > 1 and not _splits_fit(op, g, config, splits):
            splits -= 1
        return splits
    big_m, big_n, big_k = gemm_shape(op, g)
    tiles = -(-big_m // config.bm) * -(-big_n // config.bn) * int(g.groups)
    ktiles = -(-big_k // config.bk)
    want = -(-2 * num_sms // tiles)
    splits = max(1, min(want, ktiles // 8, 64))
    size = int(g.filters) * big_n
    while splits > 1 and (
        splits * size > _INDEX_LIMIT or splits * int(g.groups) > _GRID_YZ_LIMIT
    ):
        splits -= 1
    return splits


def default_config(op: str, g: ConvGeometry) -> TileConfig:
    """The tile used when none is given: by the GEMM's M."""
    big_m, _, _ = gemm_shape(op, g)
    if big_m <= 32:
        return TILES[4]
    if big_m <= 64:
        return TILES[2]
    return TILES[0]


def _splits_fit(op: str, g: ConvGeometry, config: TileConfig, splits: int) -> bool:
    """The workspace below 2^31 elements and the grid's z within its limit
    (the tap-major weight gradient's z also counts the taps)."""
    size = int(g.filters) * gemm_shape(op, g)[1]
    z = splits * int(g.groups)
    if _is_wgradtm(op, config):
        z *= int(g.kh) * int(g.kw)
    return splits * size <= _INDEX_LIMIT and z <= _GRID_YZ_LIMIT


def _check_splits(op: str, g: ConvGeometry, splits: Any) -> int:
    if isinstance(splits, bool) or not isinstance(splits, (int, np.integer)):
        raise TypeError(f"conv_igemm: splits must be an int, got {splits!r}")
    splits = int(splits)
    if splits < 1:
        raise ValueError(f"conv_igemm: splits must be >= 1, got {splits}")
    if splits > 1 and op != "weight_acts":
        raise ValueError(
            f"conv_igemm: only weight_acts splits K, got splits={splits} for {op}"
        )
    size = int(g.filters) * gemm_shape(op, g)[1]
    if splits * size > _INDEX_LIMIT or splits * int(g.groups) > _GRID_YZ_LIMIT:
        raise ValueError(
            f"conv_igemm: splits={splits} exceeds the 2^31-element workspace or "
            f"the grid's z limit for {op}"
        )
    return splits


def plan(
    op: str,
    g: ConvGeometry,
    precision: str,
    config: TileConfig | None = None,
    num_sms: int = 132,
    splits: int | None = None,
    aligned: bool = True,
) -> Plan:
    """The launch of ``op`` on ``g``: grid (N tiles, M tiles, groups*splits).

    ``splits``: K slices of ``weight_acts`` (None: enough blocks for two per
    SM; an int forces that many, fewer only where slices would be empty).
    The tap-major ``wgmma`` weight gradient (a :data:`WGMMA_WGRAD_TILES`
    tile): grid (channel tiles, filter tiles, groups*kh*kw*splits), its
    ``m``, ``n``, ``k`` those of one tap's GEMM (:func:`_kernel_gemm`).
    ``aligned``: whether A's pointer is 16-byte aligned (else no 16-byte
    copies).
    """
    if op not in OPS:
        raise ValueError(f"conv_igemm: op must be one of {OPS}, got {op!r}")
    if precision not in PRECISIONS:
        raise ValueError(
            f"conv_igemm: precision must be one of {PRECISIONS}, got {precision!r}"
        )
    config = config or default_config(op, g)
    if not config.valid():
        raise ValueError(f"conv_igemm: tile {config} breaks the template's rules")
    big_m, big_n, big_k = _kernel_gemm(op, g, config)
    if splits is None:
        splits = _split_k(op, g, config, num_sms)
    else:
        splits = _check_splits(op, g, splits)
        if not _splits_fit(op, g, config, splits):
            raise ValueError(
                f"conv_igemm: splits={splits} exceeds the grid's z limit for the "
                f"tap-major weight gradient on {g}"
            )
    k_chunk, splits = _slices(big_k, config.bk, splits)
    # the tap-major weight gradient: a block per filter tap too
    taps = int(g.kh) * int(g.kw) if _is_wgradtm(op, config) else 1
    grid = (
        -(-big_n // config.bn),
        -(-big_m // config.bm),
        int(g.groups) * taps * splits,
    )
    sk = None
    if config.streamk:
        sk = (grid[1], grid[0], -(-big_k // config.bk))
        total = grid[0] * grid[1] * grid[2] * sk[2]
        resident = STREAMK_GRID or num_sms * _blocks_per_sm(config, op)
        grid = (streamk_grid(total, resident), 1, 1)
    return Plan(
        op=op,
        config=config,
        consts=_consts(op, g, config, precision, aligned),
        m=big_m,
        n=big_n,
        k=big_k,
        splits=splits,
        k_chunk=k_chunk,
        grid=grid,
        block=config.threads,
        shared_bytes=config.shared_bytes(op),
        divisors=_divisors(op, g),
        streamk=sk,
    )


def kernel_spec(
    op: str, g: ConvGeometry, precision: str, config: TileConfig | None = None
) -> KernelSpec:
    """The kernel :func:`plan` picks for ``op`` on ``g`` with 16-byte aligned
    operands (for :func:`cc2ops.cuda.runtime.compile.precompile`)."""
    return KernelSpec("conv_igemm", plan(op, g, precision, config).consts)


def supports(op: str, geometry: ConvGeometry, dtype: Any, precision: str) -> bool:
    """Whether these kernels compute ``op`` on ``geometry`` (see Notes of the module).

    Any batch, channels, filters, image and filter size, stride, padding and
    groups; float32 only; every tensor below 2^31 elements.
    """
    if op not in OPS or precision not in PRECISIONS:
        return False
    try:
        if np.dtype(dtype) != np.float32:
            return False
        d = _dims(geometry)
    except (TypeError, AttributeError, ValueError):
        return False
    if min(d.values()) < 0 or min(d[k] for k in d if k not in ("PH", "PW")) < 1:
        return False
    if d["C"] % d["G"] or d["F"] % d["G"] or d["G"] > _GRID_YZ_LIMIT:
        return False
    want_oh = (d["H"] + 2 * d["PH"] - d["KH"]) // d["SH"] + 1
    want_ow = (d["W"] + 2 * d["PW"] - d["KW"]) // d["SW"] + 1
    if (d["OH"], d["OW"]) != (want_oh, want_ow):
        return False
    shapes = (*_in_shapes(op, geometry), _out_shape(op, geometry))
    sizes = [math.prod(s) for s in shapes]
    big_m, big_n, big_k = gemm_shape(op, geometry)
    tiles = TILES + TAP_TILES + WGMMA_TILES + WGMMA_WGRAD_TILES
    pad = max(max(t.bm, t.bn, t.bk) for t in tiles)
    if max(sizes) > _INDEX_LIMIT or max(big_n, big_k) + pad > _INDEX_LIMIT:
        return False
    return -(-big_m // min(t.bm for t in TILES)) <= _GRID_YZ_LIMIT


def variants(
    op: str,
    geometry: ConvGeometry,
    precision: str,
    capability: tuple[int, int] | None = None,
) -> list[TileConfig]:
    """Tile shapes worth timing for ``op`` on ``geometry`` (pass one as ``config``).

    Drops tiles whose M is more than twice the GEMM's M (mostly idle rows).
    Each has the default data paths (``vec`` and ``stage_c`` on); tiles that
    differ only in those are distinguished by ``TileConfig.label``. The
    tap-major tiles of :data:`TAP_TILES` come next, where they apply, and
    last the ``wgmma`` tiles of :data:`WGMMA_TILES` (``weight_acts``:
    :data:`WGMMA_WGRAD_TILES`), for TF32 and only when ``capability`` (the
    device's compute capability; None: unknown) is :data:`WGMMA_CAPABILITY`.
    """
    if not supports(op, geometry, np.float32, precision):
        return []
    big_m, _, _ = gemm_shape(op, geometry)
    out = [t for t in TILES if t.bm <= max(32, 2 * big_m)] or [TILES[-1]]
    tap = TAP_TILES
    if capability is not None and tuple(capability) == WGMMA_CAPABILITY:
        if precision == "tf32":
            tap += WGMMA_WGRAD_TILES if op == "weight_acts" else WGMMA_TILES
    out += [
        t for t in tap if t.bm <= max(32, 2 * big_m) and tapmajor_ok(op, geometry, t)
    ]
    return out


# --------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------


def _prepare(name: str, arr: Any, shape: tuple[int, ...], device: int) -> Any:
    from cc2ops.cuda.runtime.array import ascontiguous

    if tuple(arr.shape) != shape:
        raise ValueError(
            f"conv_igemm.{name}: expected shape {shape}, got {tuple(arr.shape)}"
        )
    if np.dtype(arr.dtype) != np.float32:
        raise TypeError(f"conv_igemm.{name}: float32 only, got {arr.dtype}")
    return ascontiguous(arr, device)


@dataclass(frozen=True, eq=False)
class _Recipe:
    """A planned launch with its kernels loaded: what every call reuses."""

    plan: Plan
    fn: Any
    static_args: tuple
    reduce_fn: Any
    reduce_blocks: int
    #: tap-major: the weight permutation kernel, its grid, its output's size
    perm_fn: Any = None
    perm_blocks: int = 0
    perm_size: int = 0


_RECIPES: dict[tuple, _Recipe] = kernel_cache()


def _recipe(
    op: str,
    g: ConvGeometry,
    precision: str,
    device: int,
    config: TileConfig | None,
    splits: int | None,
    aligned: bool,
) -> _Recipe:
    """The memoised plan, kernels and constant arguments of a launch."""
    from cc2ops.cuda.runtime.compile import get_kernel
    from cc2ops.cuda.runtime.device import get_device

    dev = get_device(device)
    key = (op, g, precision, dev.index, config, splits, aligned, STREAMK_GRID)
    hit = _RECIPES.get(key)
    if hit is not None:
        return hit
    if not supports(op, g, np.float32, precision):
        raise ValueError(f"conv_igemm.{op}: geometry {g} is not supported")
    if tuple(dev.compute_capability) < (8, 0):
        raise ValueError(
            f"conv_igemm.{op}: needs compute capability 8.0 or later (TF32 mma.sync, "
            f"cp.async), device {device} has {dev.compute_capability}"
        )
    if config is not None and config.wgmma:
        if tuple(dev.compute_capability) != WGMMA_CAPABILITY:
            raise ValueError(
                f"conv_igemm.{op}: wgmma tile {config.label} needs compute capability "
                f"9.0 (sm_90a), device {device} has {dev.compute_capability}"
            )
    p = plan(op, g, precision, config, dev.multiprocessors, splits, aligned)
    d = _dims(g)
    (m1, s1), (m2, s2) = (fastdiv_magic(v) for v in p.divisors)
    i32, u32 = np.int32, np.uint32
    static = (
        *(i32(d[k]) for k in ("C", "H", "W", "F", "OH", "OW", "Cg", "Fg")),
        i32(p.m), i32(p.n), i32(p.k), i32(p.k_chunk), i32(d["G"]),
        u32(m1), u32(s1), u32(m2), u32(s2),
    )  # fmt: skip
    fn = get_kernel("conv_igemm", device, **p.consts)
    red, blocks = None, 0
    if p.splits > 1:
        total = math.prod(_out_shape(op, g))
        # the reduction lives in the wgrad kernel's module
        red = get_kernel("conv_igemm", device, f"{p.consts['name']}_sum", **p.consts)
        blocks = min(-(-total // _REDUCE_BLOCK), 8 * dev.multiprocessors)
    perm, perm_blocks, perm_size = None, 0, 0
    if p.consts["op"] in ("fwdtm", "dgradtm"):
        perm = get_kernel("conv_igemm", device, f"{p.consts['name']}_wperm", **p.consts)
        perm_size = d["F"] * d["Cg"] * d["KH"] * d["KW"]
        perm_blocks = min(-(-perm_size // _REDUCE_BLOCK), 8 * dev.multiprocessors)
        perm_blocks = max(1, perm_blocks)
    recipe = _Recipe(p, fn, static, red, blocks, perm, perm_blocks, perm_size)
    _RECIPES[key] = recipe
    return recipe


def _channels_last(t: Any, device: int) -> Any:
    """(B, C, H, W) -> its C-contiguous (B, H, W, C) copy on ``device``, as
    a (B, H*W, C) array: the tiled transpose of
    :func:`cc2ops.cuda.ops.tensor.basic.contiguous` over that view of ``t``; ``t``
    itself when the layouts agree (H*W or C is 1) and it is 16-byte aligned
    (the kernel's 16-byte copies), else a fresh copy."""
    from cc2ops.cuda.ops.tensor.basic import contiguous, make_view
    from cc2ops.cuda.runtime import array

    b, c, h, w = (int(v) for v in t.shape)
    item = np.dtype(t.dtype).itemsize
    view = make_view(t, (b, h * w, c), (c * h * w * item, item, h * w * item))
    out = contiguous(view, device)
    if array.ptr(out) % 16:
        out = array.copy(out, device)
    return out


def _run(
    op: str,
    a: Any,
    b: Any,
    out: Any,
    g: ConvGeometry,
    precision: str,
    device: int,
    config: TileConfig | None,
    splits: int | None = None,
) -> None:
    from cc2ops.cuda.runtime import array
    from cc2ops.cuda.runtime.compile import launch

    a_shape, b_shape = _in_shapes(op, g)
    a = _prepare(op, a, a_shape, device)
    b = _prepare(op, b, b_shape, device)
    out_shape = _out_shape(op, g)
    if tuple(out.shape) != out_shape or np.dtype(out.dtype) != np.float32:
        raise ValueError(
            f"conv_igemm.{op}: out must be float32 of shape {out_shape}, got "
            f"{out.dtype} {tuple(out.shape)}"
        )
    if not array.is_c_contiguous(out):
        raise ValueError(f"conv_igemm.{op}: out must be C-contiguous")
    # tap-major kernels read the permuted copy, a fresh (aligned) allocation
    # (the tap-major weight gradient reads dy itself)
    permuted = bool(config and config.tapmajor and op != "weight_acts")
    aligned = array.ptr(a) % 16 == 0 or permuted
    r = _recipe(op, g, precision, device, config, splits, aligned)
    p = r.plan
    target = out
    if p.splits > 1:
        target = array.empty((p.splits, *out_shape), np.float32, device)
    if r.perm_fn is not None:
        # tap-major: A is the weights permuted to (tap, channel) order
        d = _dims(g)
        wp = array.empty((r.perm_size,), np.float32, device)
        launch(r.perm_fn, r.perm_blocks, _REDUCE_BLOCK,
               [a, wp, np.int32(d["G"]), np.int32(d["Cg"]), np.int32(d["Fg"])],
               device)  # fmt: skip
        a = wp
    if p.config.nhwc:
        b = _channels_last(b, device)
    extra: list[Any] = []
    if p.streamk is not None:
        # stream-K: two partial slots of the tile per block, a zeroed
        # counter per tile (the kernel zeroes the ones it used again)
        tiles_m, tiles_n, kt = p.streamk
        ws = array.empty((p.grid[0] * 2 * p.config.bm * p.config.bn,), np.float32,
                         device)  # fmt: skip
        flags = array.zeros((tiles_m * tiles_n * int(g.groups),), np.int32, device)
        extra = [np.int32(tiles_m), np.int32(tiles_n), np.int32(kt), ws, flags]
    launch(r.fn, p.grid, p.block, [a, b, target, *r.static_args, *extra], device,
           shared_mem=p.shared_bytes)  # fmt: skip
    if p.splits > 1:
        total = math.prod(out_shape)
        launch(r.reduce_fn, r.reduce_blocks, _REDUCE_BLOCK,
               [target, out, np.int64(total), np.int32(p.splits)], device)  # fmt: skip


def filter_acts(
    x: Any,
    w: Any,
    out: Any,
    geometry: ConvGeometry,
    precision: str,
    device: int,
    config: TileConfig | None = None,
) -> None:
    """Forward convolution ``out = conv(x, w)`` on the tensor cores.

    Parameters
    ----------
    x : GPUArray, shape (B, C, H, W)
    w : GPUArray, shape (F, C/groups, kh, kw)
    out : GPUArray, shape (B, F, Ho, Wo)
        C-contiguous, overwritten completely.
    geometry : ConvGeometry
    precision : {"fp32", "tf32"}
        3xTF32 (fp32-accurate) or TF32.
    device : int
        Device label; runs on its stream.
    config : TileConfig, optional
        One of :func:`variants`; default :func:`default_config`.
    """
    _run("filter_acts", w, x, out, geometry, precision, device, config)


def image_acts(
    dy: Any,
    w: Any,
    out: Any,
    geometry: ConvGeometry,
    precision: str,
    device: int,
    config: TileConfig | None = None,
) -> None:
    """Gradient wrt the images, ``out = dx``, on the tensor cores.

    Parameters
    ----------
    dy : GPUArray, shape (B, F, Ho, Wo)
    w : GPUArray, shape (F, C/groups, kh, kw)
    out : GPUArray, shape (B, C, H, W)
        C-contiguous, overwritten completely (0 where no filter tap reaches).
    geometry, precision, device, config
        As in :func:`filter_acts`.
    """
    _run("image_acts", w, dy, out, geometry, precision, device, config)


def weight_acts(
    x: Any,
    dy: Any,
    out: Any,
    geometry: ConvGeometry,
    precision: str,
    device: int,
    config: TileConfig | None = None,
    splits: int | None = None,
) -> None:
    """Gradient wrt the filters, ``out = dw``, on the tensor cores.

    Parameters
    ----------
    x : GPUArray, shape (B, C, H, W)
    dy : GPUArray, shape (B, F, Ho, Wo)
    out : GPUArray, shape (F, C/groups, kh, kw)
        C-contiguous, overwritten completely.
    geometry, precision, device, config
        As in :func:`filter_acts`.
    splits : int, optional
        K slices (see Notes); default: enough blocks for about two per SM.

    Notes
    -----
    K (every output pixel of the batch) is cut into slices so that there
    are about two blocks per SM; with more than one slice the partial
    products go to a workspace from the device pool and a second kernel sums
    them in slice order (deterministic).
    """
    _run("weight_acts", dy, x, out, geometry, precision, device, config, splits)


# --------------------------------------------------------------------------
# variants compiled by the CPU test suite
# --------------------------------------------------------------------------


def _geom(c: int, f: int, hw: int, k: int, s: int, p: int) -> ConvGeometry:
    o = (hw + 2 * p - k) // s + 1
    return ConvGeometry(8, c, hw, hw, f, k, k, s, s, p, p, 1, o, o)


@register_variants("conv_igemm")
def _variants() -> list[dict[str, Any]]:
    conv3 = _geom(192, 384, 13, 3, 1, 1)
    conv2 = _geom(64, 192, 27, 5, 1, 2)
    conv1 = _geom(3, 64, 224, 11, 4, 2)
    res14 = _geom(64, 64, 14, 3, 1, 1)  # Ho*Wo % 4 == 0: 16-byte dy copies
    res14s2 = _geom(64, 64, 14, 3, 2, 1)

    def _tile(nhwc: bool, bm: int = 128, bn: int = 128, sk: bool = False) -> TileConfig:
        key = (nhwc, bm, bn, sk)
        return next(t for t in WGMMA_TILES if (t.nhwc, t.bm, t.bn, t.streamk) == key)

    original = replace(TILES[0], vec=False, stage_c=False)
    return [
        _consts("filter_acts", conv3, TILES[0], "tf32"),
        _consts("filter_acts", conv3, original, "tf32"),
        _consts("filter_acts", conv2, TILES[0], "fp32"),
        _consts("filter_acts", conv1, TILES[3], "tf32"),
        _consts("image_acts", conv3, TILES[2], "tf32"),
        _consts("weight_acts", conv3, TILES[1], "fp32"),
        _consts("weight_acts", res14, TILES[4], "tf32"),
        _consts("filter_acts", conv3, TAP_TILES[0], "tf32"),
        _consts("filter_acts", conv2, TAP_TILES[2], "fp32"),
        _consts("image_acts", conv3, TAP_TILES[1], "fp32"),
        _consts("image_acts", conv1, TAP_TILES[5], "tf32"),
        # wgmma (sm_90a): every tile shape; both epilogues; both passes
        _consts("filter_acts", conv3, WGMMA_TILES[0], "tf32"),
        _consts("image_acts", conv3, WGMMA_TILES[1], "tf32"),
        _consts("filter_acts", conv2, WGMMA_TILES[2], "tf32"),
        _consts("image_acts", conv2, replace(WGMMA_TILES[3], stage_c=False), "tf32"),
        _consts("filter_acts", conv2, WGMMA_TILES[4], "tf32"),  # 3 warpgroups
        _consts("image_acts", conv3, WGMMA_TILES[5], "tf32"),
        # channels-last B: both passes, strides 1 and 2, 1 and 3 warpgroups
        _consts("filter_acts", conv3, _tile(nhwc=True), "tf32"),
        _consts("image_acts", conv3, _tile(nhwc=True, bm=192, bn=96), "tf32"),
        _consts("filter_acts", res14s2, _tile(nhwc=True, bm=64), "tf32"),
        _consts("image_acts", res14s2, _tile(nhwc=True), "tf32"),
        # stream-K: both passes, 2 and 3 warpgroups
        _consts("filter_acts", conv3, _tile(True, 128, 256, sk=True), "tf32"),
        _consts("image_acts", res14s2, _tile(True, 192, 192, sk=True), "tf32"),
        # the tap-major wgmma weight gradient: every tile shape, both dy copy
        # paths (aligned or not), both epilogues, strides 1 and 4
        _consts("weight_acts", conv3, WGMMA_WGRAD_TILES[0], "tf32"),
        _consts("weight_acts", conv2, WGMMA_WGRAD_TILES[1], "tf32"),
        _consts("weight_acts", conv1, WGMMA_WGRAD_TILES[2], "tf32", aligned=False),
        _consts(
            "weight_acts", res14, replace(WGMMA_WGRAD_TILES[3], stage_c=False), "tf32"
        ),
    ]
