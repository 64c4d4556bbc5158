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
(:func:`wgmma_smem_offset`, :func:`gmma_descriptor`, :func:`gmma_address`,
:func:`wgmma_load_map`, :func:`wgmma_accumulator_map`) and
:func:`emulate_wgmma_block` multiplies a tile through them.

Two switches of the ``wgmma`` tiles reach further. ``nhwc``
(:attr:`TileConfig.nhwc`): the image operand (x for ``filter_acts``, dy for
``image_acts``) is first transposed to channels-last, so that one row of a B
tile (one pixel, 32 channels of one tap) is 128 contiguous bytes, copied in
16-byte ``cp.async`` by the map of A (:func:`channels_last`,
:func:`b_offset`'s ``nhwc``). ``streamk`` (:attr:`TileConfig.streamk`): a
persistent grid of one wave of blocks shares the (tile, k tile) iterations
of all tiles evenly, so a tile count just past a whole number of waves (the
13x13 layers: 338 tiles of 128x128 for 132 SMs) leaves no SM idle; tiles
cut between blocks are summed in block order through a workspace by the
segment that finishes last (:func:`streamk_items`,
:func:`streamk_segments`; :func:`emulate` follows the schedule). The
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
:func:`wgrad_copies` specifies the copies and :func:`emulate_wgrad_wgmma`
computes the pass through them.

Interface
---------
The conv GPU ops (``cc2ops.cuda.ops.conv.ops``) call :func:`supports`,
:func:`variants` and :func:`filter_acts` / :func:`image_acts` /
:func:`weight_acts` as autotuner candidates. ``geometry`` is a
:class:`cc2ops.cuda.ops.conv.ops.ConvGeometry`.

The index arithmetic of the kernels is written down here once more, in numpy
(:func:`a_offset`, :func:`b_offset`, :func:`c_offset`, :func:`fastdiv`,
:func:`load_map`, :func:`fragment_map`, :func:`epilogue_map`), and
:func:`emulate` / :func:`emulate_block` / :func:`emulate_epilogue` compute
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
    "permuted_weights",
    "Plan",
    "gemm_shape",
    "fastdiv_magic",
    "fastdiv",
    "a_offset",
    "b_offset",
    "c_offset",
    "emulate",
    "load_map",
    "fragment_map",
    "emulate_block",
    "epilogue_map",
    "a_vector_width",
    "emulate_epilogue",
    "wgmma_smem_offset",
    "gmma_descriptor",
    "gmma_address",
    "wgmma_load_map",
    "wgmma_accumulator_map",
    "emulate_wgmma_block",
    "channels_last",
    "streamk_grid",
    "streamk_items",
    "streamk_block_of",
    "streamk_segments",
    "wgrad_copies",
    "emulate_wgrad_wgmma",
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
    iterations evenly (:func:`streamk_items`), so a tile count just above a
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


def fastdiv(n: Any, magic: int, shift: int) -> np.ndarray:
    """``n // d`` the way the kernels compute it (32-bit ``__umulhi``)."""
    n = np.asarray(n, dtype=np.uint64)
    hi = (n * np.uint64(magic)) >> np.uint64(32)
    return ((hi + n) >> np.uint64(shift)).astype(np.int64)


def _div(n: np.ndarray, d: int) -> np.ndarray:
    return fastdiv(n, *fastdiv_magic(d))


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


def permuted_weights(op: str, g: ConvGeometry, w: np.ndarray) -> np.ndarray:
    """The weights as the tap-major kernels read them (what ``_wperm`` writes).

    ``filter_acts``: ``wp[f][t][c] = w[f][c][t]``, (F, kh*kw*Cg);
    ``image_acts``: ``wq[grp][c][t][f] = w[grp*Fg + f][c][t]``,
    (groups, Cg, kh*kw*Fg); ``t = u*kw + v``.
    """
    d = _dims(g)
    khkw = d["KH"] * d["KW"]
    w3 = np.asarray(w).reshape(d["F"], d["Cg"], khkw)
    if op == "filter_acts":
        return np.ascontiguousarray(w3.transpose(0, 2, 1)).reshape(d["F"], -1)
    w4 = w3.reshape(d["G"], d["Fg"], d["Cg"], khkw)
    return np.ascontiguousarray(w4.transpose(0, 2, 3, 1)).reshape(d["G"], d["Cg"], -1)


def a_offset(
    op: str,
    g: ConvGeometry,
    grp: int,
    m: np.ndarray,
    k: np.ndarray,
    tapmajor: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Flat offset into A's tensor (w, w, dy) of ``A[m, k]``, and its predicate.

    ``filter_acts``: ``w[grp*Fg + m][k]``; ``image_acts``: ``w[grp*Fg +
    f][m][t]`` with ``k = f*kh*kw + t``; ``weight_acts``: ``dy[img][grp*Fg +
    m][pix]`` with ``k = img*Ho*Wo + pix``. Offsets where the predicate is
    False are meaningless (the kernel copies a zero there). ``tapmajor``: A's
    tensor is :func:`permuted_weights`, row ``grp*Fg + m`` (``filter_acts``)
    or ``grp*Cg + m`` (``image_acts``) of K elements.
    """
    d = _dims(g)
    m, k = np.broadcast_arrays(np.asarray(m, np.int64), np.asarray(k, np.int64))
    big_m, _, big_k = gemm_shape(op, g)
    ok = (m < big_m) & (k < big_k)
    khkw = d["KH"] * d["KW"]
    if tapmajor:
        rows = d["Fg"] if op == "filter_acts" else d["Cg"]
        return (grp * rows + m) * big_k + k, ok
    if op == "filter_acts":
        off = (grp * d["Fg"] + m) * big_k + k
    elif op == "image_acts":
        f = k // khkw
        t = k - f * khkw
        off = ((grp * d["Fg"] + f) * d["Cg"] + m) * khkw + t
    else:
        ohw = d["OH"] * d["OW"]
        img = _div(k, ohw)
        pix = k - img * ohw
        off = (img * d["F"] + grp * d["Fg"] + m) * ohw + pix
    return off, ok


def _tap_split(
    op: str, g: ConvGeometry, k: np.ndarray, tapmajor: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(channel or filter, tap t = u*kw + v) of a K index of fwd or dgrad."""
    d = _dims(g)
    khkw = d["KH"] * d["KW"]
    if tapmajor:
        ck = tap_channels(op, g)
        t = k // ck
        return k - t * ck, t
    c = k // khkw
    return c, k - c * khkw


def b_offset(
    op: str,
    g: ConvGeometry,
    grp: int,
    k: np.ndarray,
    n: np.ndarray,
    tapmajor: bool = False,
    nhwc: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Flat offset into B's tensor (x, dy, x) of ``B[k, n]``, and its predicate.

    ``filter_acts``: ``x[img][grp*Cg + c][oh*sh - ph + u][ow*sw - pw + v]``
    with ``n = (img*Ho + oh)*Wo + ow`` and ``k = (c*kh + u)*kw + v``;
    ``image_acts``: ``dy[img][grp*Fg + f][(ih + ph - u)/sh][(iw + pw -
    v)/sw]`` with ``n = (img*H + ih)*W + iw``, ``k = (f*kh + u)*kw + v``, where
    both quotients are exact and inside the output; ``weight_acts``: as
    ``filter_acts`` with the roles of k and n exchanged. ``tapmajor``:
    ``k = (u*kw + v)*Cg + c`` (``filter_acts``) or ``(u*kw + v)*Fg + f``
    (``image_acts``) instead. ``nhwc`` (``filter_acts`` and ``image_acts``):
    the offset into the channels-last copy, ``x`` as (B, H, W, C), resp.
    ``dy`` as (B, Ho, Wo, F) (:attr:`TileConfig.nhwc`).
    """
    if nhwc and op == "weight_acts":
        raise ValueError("conv_igemm.b_offset: nhwc applies to filter_acts, image_acts")
    d = _dims(g)
    k, n = np.broadcast_arrays(np.asarray(k, np.int64), np.asarray(n, np.int64))
    _, big_n, big_k = gemm_shape(op, g)
    ok = (k < big_k) & (n < big_n)
    if op == "image_acts":
        hw = d["H"] * d["W"]
        img = _div(n, hw)
        pix = n - img * hw
        ih = _div(pix, d["W"])
        iw = pix - ih * d["W"]
        f, t = _tap_split(op, g, k, tapmajor)
        u = t // d["KW"]
        v = t - u * d["KW"]
        ohn = ih + d["PH"] - u
        own = iw + d["PW"] - v
        oh = np.where(ohn >= 0, ohn, 0) // d["SH"]
        ow = np.where(own >= 0, own, 0) // d["SW"]
        ok &= (ohn >= 0) & (own >= 0) & (oh * d["SH"] == ohn) & (ow * d["SW"] == own)
        ok &= (oh < d["OH"]) & (ow < d["OW"])
        if nhwc:
            off = ((img * d["OH"] + oh) * d["OW"] + ow) * d["F"] + grp * d["Fg"] + f
            return off, ok
        off = ((img * d["F"] + grp * d["Fg"] + f) * d["OH"] + oh) * d["OW"] + ow
        return off, ok
    pixel, tap = (n, k) if op == "filter_acts" else (k, n)
    ohw = d["OH"] * d["OW"]
    img = _div(pixel, ohw)
    pix = pixel - img * ohw
    oh = _div(pix, d["OW"])
    ow = pix - oh * d["OW"]
    c, t = _tap_split(op, g, tap, tapmajor and op == "filter_acts")
    u = t // d["KW"]
    v = t - u * d["KW"]
    ih = oh * d["SH"] - d["PH"] + u
    iw = ow * d["SW"] - d["PW"] + v
    ok &= (ih >= 0) & (ih < d["H"]) & (iw >= 0) & (iw < d["W"])
    if nhwc:
        return ((img * d["H"] + ih) * d["W"] + iw) * d["C"] + grp * d["Cg"] + c, ok
    off = ((img * d["C"] + grp * d["Cg"] + c) * d["H"] + ih) * d["W"] + iw
    return off, ok


def c_offset(
    op: str,
    g: ConvGeometry,
    grp: int,
    m: np.ndarray,
    n: np.ndarray,
    split: int = 0,
    tap: int | None = None,
) -> np.ndarray:
    """Flat offset into the output (y, dx, dw or split-K partials) of ``C[m, n]``.

    Only for ``m < M``, ``n < N`` (the kernel's stores are predicated so).
    ``weight_acts`` partials of slice ``split`` start at ``split*F*N``.
    ``tap`` (the tap-major weight gradient's GEMM of filter tap ``tap = u*kw
    + v``, n a channel): ``dw[grp*Fg + m][n][tap]``, the kernel's ``(grp*Fg +
    m)*N*KHKW + tap`` plus ``n*KHKW``.
    """
    d = _dims(g)
    m, n = np.broadcast_arrays(np.asarray(m, np.int64), np.asarray(n, np.int64))
    if tap is not None:
        khkw = d["KH"] * d["KW"]
        size = d["F"] * d["Cg"] * khkw
        return split * size + (grp * d["Fg"] + m) * d["Cg"] * khkw + tap + n * khkw
    if op == "filter_acts":
        ohw = d["OH"] * d["OW"]
        img = _div(n, ohw)
        return img * d["F"] * ohw + (n - img * ohw) + (grp * d["Fg"] + m) * ohw
    if op == "image_acts":
        hw = d["H"] * d["W"]
        img = _div(n, hw)
        return img * d["C"] * hw + (n - img * hw) + (grp * d["Cg"] + m) * hw
    _, big_n, _ = gemm_shape(op, g)
    return split * d["F"] * big_n + (grp * d["Fg"] + m) * big_n + n


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


def channels_last(t: np.ndarray) -> np.ndarray:
    """(B, C, H, W) -> (B, H, W, C), C-contiguous: the copy an ``nhwc`` tile
    reads B from (what :func:`_run` makes on the GPU)."""
    return np.ascontiguousarray(np.asarray(t).transpose(0, 2, 3, 1))


def _gather(t: np.ndarray, off: np.ndarray, ok: np.ndarray) -> np.ndarray:
    flat = np.asarray(t, dtype=np.float64).reshape(-1)
    safe = np.where(ok, off, 0)
    if ok.any() and (off[ok].min() < 0 or off[ok].max() >= flat.size):
        raise AssertionError(
            "conv_igemm.emulate: a predicated-on offset is out of range"
        )
    return np.where(ok, flat[safe], 0.0)


def emulate(
    op: str,
    g: ConvGeometry,
    a: np.ndarray,
    b: np.ndarray,
    *,
    config: TileConfig | None = None,
    splits: int = 1,
    streamk_blocks: int = 7,
) -> np.ndarray:
    """The convolution pass computed through the kernels' index maps, in float64.

    ``a``, ``b`` are the pass's operands as in :func:`filter_acts` etc.
    reordered to (A's tensor, B's tensor): (w, x), (w, dy) or (dy, x). The
    GEMM operands are gathered with :func:`a_offset` / :func:`b_offset` over
    the tile-padded ranges of ``config`` (the predicates must zero the
    padding), products of ``weight_acts`` are cut into ``splits`` K slices
    stored at their :func:`c_offset` and summed in slice order, and every
    element of the output must be written exactly once per slice. A
    ``streamk`` tile multiplies tile by tile through the schedule of
    ``streamk_blocks`` blocks (:func:`_streamk_product`).
    """
    config = config or TILES[0]
    if _is_wgradtm(op, config):
        return emulate_wgrad_wgmma(g, a, b, config=config, splits=splits)
    tm = config.tapmajor
    if tm:
        if not tapmajor_ok(op, g, config):
            raise ValueError(f"conv_igemm.emulate: tap-major {config} does not apply")
        a = permuted_weights(op, g, a)
    if config.nhwc:
        b = channels_last(b)
    big_m, big_n, big_k = gemm_shape(op, g)
    d = _dims(g)
    pm = -(-big_m // config.bm) * config.bm
    pn = -(-big_n // config.bn) * config.bn
    pk = -(-big_k // config.bk) * config.bk
    k_chunk, splits = _slices(big_k, config.bk, splits)
    size = math.prod(_out_shape(op, g))
    out = np.full(splits * size, np.nan)
    written = np.zeros(splits * size, dtype=np.int64)
    m = np.arange(pm)[:, None]
    n = np.arange(pn)[None, :]
    for grp in range(d["G"]):
        big_a = _gather(a, *a_offset(op, g, grp, m, np.arange(pk)[None, :], tm))
        b_off = b_offset(op, g, grp, np.arange(pk)[:, None], n, tm, config.nhwc)
        big_b = _gather(b, *b_off)
        store = (m < big_m) & (n < big_n)
        for s in range(splits):
            ks = slice(s * k_chunk, min(big_k, (s + 1) * k_chunk))
            if config.streamk:
                prod = _streamk_product(
                    config, big_a, big_b, grp, d["G"], streamk_blocks
                )
            else:
                prod = big_a[:, ks] @ big_b[ks, :]
            off = c_offset(op, g, grp, np.minimum(m, big_m - 1), n, split=s)
            off = np.where(store, off, 0)
            out[off[store]] = prod[store]
            np.add.at(written, off[store], 1)
    if not (written == 1).all():
        raise AssertionError("conv_igemm.emulate: an output written never or twice")
    return out.reshape(splits, size).sum(axis=0).reshape(_out_shape(op, g))


def _streamk_product(
    config: TileConfig,
    big_a: np.ndarray,
    big_b: np.ndarray,
    grp: int,
    groups: int,
    blocks: int,
) -> np.ndarray:
    """Group ``grp``'s tile-padded product as the stream-K kernel forms it:
    each tile the sum, in :func:`streamk_segments` order, of its segments'
    products over their k tiles (:func:`streamk_items`). Raises if a (tile,
    k tile) is run never or twice, a block's slot holds two pending partials,
    or a segment is not where the summing block looks for it."""
    bm, bn, bk = config.bm, config.bn, config.bk
    tm, tn, kt = big_a.shape[0] // bm, big_b.shape[1] // bn, big_a.shape[1] // bk
    tiles = tm * tn * groups
    total = tiles * kt
    grid = min(blocks, total)
    held: dict[tuple[int, int], tuple[int, int, int]] = {}
    for b, mine in enumerate(streamk_items(tiles, kt, grid)):
        for tile, lo, hi, slot in mine:
            key = (b, slot) if (lo or hi != kt) else (b, -1 - tile)
            if key in held:
                raise AssertionError(f"conv_igemm: stream-K slot {key} reused")
            held[key] = (tile, lo, hi)
    prod = np.full((tm * bm, tn * bn), np.nan)
    for nt in range(tn):
        for mt in range(tm):
            tile = (grp * tn + nt) * tm + mt
            segs = streamk_segments(tile, kt, total, grid)
            rows, cols = slice(mt * bm, (mt + 1) * bm), slice(nt * bn, (nt + 1) * bn)
            covered = np.zeros(kt, dtype=np.int64)
            acc = np.zeros((bm, bn))
            for b, slot in segs:
                key = (b, -1 - tile) if len(segs) == 1 else (b, slot)
                if held.get(key, (None,))[0] != tile:
                    raise AssertionError(
                        f"conv_igemm: stream-K tile {tile}: no segment at {key}"
                    )
                _, lo, hi = held[key]
                covered[lo:hi] += 1
                ks = slice(lo * bk, hi * bk)
                acc = acc + big_a[rows, ks] @ big_b[ks, cols]
            if not (covered == 1).all():
                raise AssertionError(f"conv_igemm: stream-K tile {tile} k coverage")
            prod[rows, cols] = acc
    return prod


def load_map(
    config: TileConfig, op: str, operand: str, vec: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """(row, k) of every tile element each thread copies: arrays (threads, loads).

    Rows are m for A and n for B. A, and B of ``weight_acts``, are copied
    k-major (``k = tid % bk``, ``row = tid // bk + e * threads/bk``); B of
    the other passes n-major (``n = tid % bn``, ``k = tid // bn + e *
    threads/bn``), so each thread decodes one output (or input) pixel once.
    ``vec=4`` (A only, the kernel's ``AVEC``): vector e of a thread is row
    ``tid // (bk/4) + e * threads/(bk/4)``, columns ``4*(tid % (bk/4)) + i``
    for i < 4 (element ``4e + i``).
    """
    t = config.threads
    tid = np.arange(t)[:, None]
    rows = config.bm if operand == "A" else config.bn
    if vec == 4:
        if operand != "A":
            raise ValueError("conv_igemm.load_map: only A is copied in vectors")
        v = config.bk // 4
        e = np.arange(rows * v // t)[:, None]
        i = np.arange(4)[None, :]
        r = (tid // v)[:, :, None] + (e * (t // v))[None]
        k = (4 * (tid % v))[:, :, None] + i[None]
        r, k = np.broadcast_arrays(r, k)
        return r.reshape(t, -1), k.reshape(t, -1)
    if vec != 1:
        raise ValueError(f"conv_igemm.load_map: vec must be 1 or 4, got {vec}")
    e = np.arange(rows * config.bk // t)[None, :]
    if operand == "A" or op == "weight_acts":
        k = np.broadcast_to(tid % config.bk, (t, e.shape[1]))
        r = tid // config.bk + e * (t // config.bk)
    else:
        r = np.broadcast_to(tid % config.bn, (t, e.shape[1]))
        k = tid // config.bn + e * (t // config.bn)
    return r, k


def fragment_map(config: TileConfig, op: str, lane_warp: tuple[int, int]) -> dict:
    """Shared-memory float indices of one thread's mma fragments (one stage).

    Returns ``a`` (mt, kk, 4), ``b`` (nt, kk, 2) and the logical tile
    coordinates: ``a_mk`` (mt, kk, 4, 2) as (m, k), ``b_kn`` (nt, kk, 2, 2)
    as (k, n), and ``c_mn`` (mt, nt, 4, 2) of the accumulators. Register q of
    A sits at hardware (row gid + 8*(q & 1), column tig + 4*(q >> 1)) and
    holds logical k ``2*tig + (q >> 1)``; B's register q at hardware row
    ``tig + 4q`` holds logical k ``2*tig + q``.
    """
    lane, warp = lane_warp
    gid, tig = lane >> 2, lane & 3
    warp_m, warp_n = warp // config.wn, warp % config.wn
    wtm, wtn = config.bm // config.wm, config.bn // config.wn
    mt_n, nt_n, kk_n = wtm // 16, wtn // 8, config.bk // 8
    sa = config.bk + 8
    kmajor_b = op == "weight_acts"
    sb = config.bk + 8 if kmajor_b else config.bn + 4
    a = np.zeros((mt_n, kk_n, 4), np.int64)
    a_mk = np.zeros((mt_n, kk_n, 4, 2), np.int64)
    b = np.zeros((nt_n, kk_n, 2), np.int64)
    b_kn = np.zeros((nt_n, kk_n, 2, 2), np.int64)
    for kk in range(kk_n):
        for mt in range(mt_n):
            for q in range(4):
                row = warp_m * wtm + mt * 16 + gid + 8 * (q & 1)
                k = kk * 8 + 2 * tig + (q >> 1)
                a[mt, kk, q] = row * sa + k
                a_mk[mt, kk, q] = (row, k)
        for nt in range(nt_n):
            for q in range(2):
                col = warp_n * wtn + nt * 8 + gid
                k = kk * 8 + 2 * tig + q
                b[nt, kk, q] = col * sb + k if kmajor_b else k * sb + col
                b_kn[nt, kk, q] = (k, col)
    c_mn = np.zeros((mt_n, nt_n, 4, 2), np.int64)
    for mt in range(mt_n):
        for nt in range(nt_n):
            for q in range(4):
                c_mn[mt, nt, q] = (
                    warp_m * wtm + mt * 16 + gid + 8 * (q >> 1),
                    warp_n * wtn + nt * 8 + 2 * tig + (q & 1),
                )
    return dict(a=a, b=b, a_mk=a_mk, b_kn=b_kn, c_mn=c_mn)


def emulate_block(
    config: TileConfig, op: str, a_tile: np.ndarray, b_tile: np.ndarray
) -> np.ndarray:
    """One block's product of one stage through the kernel's data movement.

    ``a_tile`` (bm, bk) and ``b_tile`` (bk, bn) are copied to shared memory
    as :func:`load_map` says, read back as :func:`fragment_map` says, and
    multiplied with the documented m16n8k8 semantics (``D[r, c] += sum_j
    A[r, j] B[j, c]`` over hardware k ``j``); returns C (bm, bn) assembled
    from every thread's accumulators.
    """
    sa_f, sb_f = config.smem_floats(op)
    sa, sb = np.full(sa_f, np.nan), np.full(sb_f, np.nan)
    kmajor_b = op == "weight_acts"
    stride_a = config.bk + 8
    stride_b = config.bk + 8 if kmajor_b else config.bn + 4
    r, k = load_map(config, op, "A")
    sa[r * stride_a + k] = a_tile[r, k]
    r, k = load_map(config, op, "B")
    sb[r * stride_b + k if kmajor_b else k * stride_b + r] = b_tile[k, r]
    out = np.full((config.bm, config.bn), np.nan)
    for warp in range(config.threads // 32):
        frags = [fragment_map(config, op, (lane, warp)) for lane in range(32)]
        mt_n, kk_n = frags[0]["a"].shape[:2]
        nt_n = frags[0]["b"].shape[0]
        for mt in range(mt_n):
            for nt in range(nt_n):
                acc = np.zeros((16, 8))
                for kk in range(kk_n):
                    hw_a = np.zeros((16, 8))
                    hw_b = np.zeros((8, 8))
                    for lane in range(32):
                        gid, tig = lane >> 2, lane & 3
                        for q in range(4):
                            hw_a[gid + 8 * (q & 1), tig + 4 * (q >> 1)] = sa[
                                frags[lane]["a"][mt, kk, q]
                            ]
                        for q in range(2):
                            hw_b[tig + 4 * q, gid] = sb[frags[lane]["b"][nt, kk, q]]
                    acc += hw_a @ hw_b
                for lane in range(32):
                    gid, tig = lane >> 2, lane & 3
                    for q in range(4):
                        rr, cc = frags[lane]["c_mn"][mt, nt, q]
                        out[rr, cc] = acc[gid + 8 * (q >> 1), 2 * tig + (q & 1)]
    return out


def epilogue_map(config: TileConfig, lane_warp: tuple[int, int]) -> dict:
    """Shared-memory float indices of one thread's staged epilogue (``STAGE_C``).

    Warp w stages through floats ``[w*16*sc, (w+1)*16*sc)`` of the block's
    shared memory, ``sc = bn/wn + 8``, one 16-row block ``mt`` at a time.
    Returns ``write`` (mt, h, nt): the index of the float2 holding
    accumulators ``h*2``, ``h*2 + 1`` of fragment (mt, nt) (the pass of
    ``mt`` only reuses the same indices), ``read`` (16, wtn/32): the index the
    thread reads for row r and column block c, and ``read_mn`` (mt, 16,
    wtn/32, 2): the tile coordinates (m, n) it then stores.
    """
    lane, warp = lane_warp
    gid, tig = lane >> 2, lane & 3
    warp_m, warp_n = warp // config.wn, warp % config.wn
    wtm, wtn = config.warp_tile
    mt_n, nt_n, cb = wtm // 16, wtn // 8, wtn // 32
    sc = wtn + 8
    base = warp * 16 * sc
    write = np.zeros((mt_n, 2, nt_n), np.int64)
    for h in range(2):
        for nt in range(nt_n):
            write[:, h, nt] = base + (gid + 8 * h) * sc + nt * 8 + 2 * tig
    r = np.arange(16)[:, None]
    c = np.arange(cb)[None, :]
    read = base + r * sc + c * 32 + lane
    mt = np.arange(mt_n)[:, None, None]
    read_mn = np.stack(
        np.broadcast_arrays(
            warp_m * wtm + mt * 16 + r[None], warp_n * wtn + c[None] * 32 + lane
        ),
        axis=-1,
    )
    return dict(write=write, read=read, read_mn=read_mn)


def emulate_epilogue(config: TileConfig, c_tile: np.ndarray) -> np.ndarray:
    """A block's C tile (bm, bn) stored through the staged epilogue.

    Every thread's accumulators (per :func:`fragment_map`'s ``c_mn``) are
    written to its warp's staging buffer as :func:`epilogue_map` says, read
    back and stored; returns the stored tile. Raises if a warp's buffer
    leaves its own range or the block's shared memory, or if an element is
    stored never or twice.
    """
    if not config.can_stage_c():
        raise ValueError(f"conv_igemm: tile {config} cannot stage C (bn/wn % 32)")
    floats = config.shared_bytes("filter_acts") // 4
    out = np.full((config.bm, config.bn), np.nan)
    count = np.zeros((config.bm, config.bn), np.int64)
    wtn = config.warp_tile[1]
    for warp in range(config.threads // 32):
        lo, hi = warp * 16 * (wtn + 8), (warp + 1) * 16 * (wtn + 8)
        if hi > floats:
            raise AssertionError("conv_igemm: staging buffer past shared memory")
        emaps = [epilogue_map(config, (lane, warp)) for lane in range(32)]
        cmaps = [
            fragment_map(config, "filter_acts", (lane, warp))["c_mn"]
            for lane in range(32)
        ]
        for mt in range(emaps[0]["write"].shape[0]):
            smem = np.full(floats, np.nan)
            for lane in range(32):
                w = emaps[lane]["write"][mt]
                if w.min() < lo or w.max() + 1 >= hi:
                    raise AssertionError("conv_igemm: staging write outside the warp")
                for h in range(2):
                    for nt in range(w.shape[1]):
                        for j in range(2):
                            m, n = cmaps[lane][mt, nt, h * 2 + j]
                            smem[w[h, nt] + j] = c_tile[m, n]
            for lane in range(32):
                idx = emaps[lane]["read"]
                mn = emaps[lane]["read_mn"][mt]
                out[mn[..., 0], mn[..., 1]] = smem[idx]
                np.add.at(count, (mn[..., 0], mn[..., 1]), 1)
    if not (count == 1).all():
        raise AssertionError("conv_igemm: a C element stored never or twice")
    return out


# --------------------------------------------------------------------------
# wgmma: shared-memory layout, matrix descriptors, copy and accumulator maps
# --------------------------------------------------------------------------


def wgmma_smem_offset(row: Any, k: Any) -> np.ndarray:
    """Byte offset of element ``(row, k)`` in a K-major wgmma operand tile.

    Rows of ``bk = 32`` floats, 128 bytes, one after the other; within a row
    the 16-byte chunk ``k // 4`` sits at chunk position ``(k // 4) ^ (row %
    8)`` (the 128-byte swizzle). Where the copies write (the kernel's
    ``sw128_offset``); the tile starts 1024-byte aligned.
    """
    row, k = np.broadcast_arrays(np.asarray(row, np.int64), np.asarray(k, np.int64))
    return row * _SW128_ROW + ((((k >> 2) ^ row) & 7) << 4) + (k & 3) * 4


def gmma_descriptor(
    address: int, lbo: int = 16, sbo: int = 1024, layout: int = 1, base_offset: int = 0
) -> int:
    """The 64-bit wgmma shared-memory matrix descriptor.

    PTX ISA, "Matrix Descriptor Format": bits 0-13 the start address, 16-29
    the leading-dimension byte offset, 32-45 the stride-dimension byte offset
    (each in 16-byte units, the byte value >> 4; the address modulo 2^18, as
    ``(addr & 0x3FFFF) >> 4``), 49-51 the base offset, 62-63 the layout type
    (0: no swizzle, 1: 128-byte, 2: 64-byte, 3: 32-byte swizzle). The
    defaults are the kernel's ``gmma_desc_sw128``: 128-byte swizzle, 1024
    bytes from one 8-row group to the next, the leading offset unused (16
    bytes, as CUTLASS sets it).
    """
    for what, v in (("lbo", lbo), ("sbo", sbo)):
        if v % 16 or not 0 <= v >> 4 < 1 << 14:
            raise ValueError(f"gmma_descriptor: {what} must be 16*[0, 2^14), got {v}")
    if not (0 <= layout < 4 and 0 <= base_offset < 8 and address % 16 == 0):
        raise ValueError(
            f"gmma_descriptor: layout {layout}, base offset {base_offset} or "
            f"address {address} out of range (address 16-byte aligned)"
        )
    return (
        ((int(address) & 0x3FFFF) >> 4)
        | ((lbo >> 4) << 16)
        | ((sbo >> 4) << 32)
        | (base_offset << 49)
        | (layout << 62)
    )


def gmma_address(desc: int, row: Any, k: Any) -> np.ndarray:
    """Byte address at which the tensor cores read element ``(row, k)`` of a
    K-major tf32 operand through descriptor ``desc``, ``k < 8`` (one step).

    Decodes :func:`gmma_descriptor`'s fields and applies the canonical K-major
    layouts (PTX ISA "Shared Memory Matrix Layout"; CUTLASS's
    ``make_gmma_desc<Major::K>``), in units of T = 4 tf32 (16 bytes): no
    swizzle ``((8,m),(T,2)):((1T,SBO),(1,LBO))``, core matrices of 8 rows of
    16 bytes, the next 8 rows SBO and the second 4 k LBO bytes further;
    128-byte swizzle ``((8,m),(T,2)):((8T,SBO),(1,T))``, rows 128 bytes
    apart with their 8 k contiguous, the next 8 rows SBO bytes further, then
    the swizzle on the address formed: bits 4-6 XOR bits 7-9. Base offset 0
    only (8-row atoms 1024-byte aligned).
    """
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    base, layout = (desc >> 49) & 7, (desc >> 62) & 3
    row, k = np.broadcast_arrays(np.asarray(row, np.int64), np.asarray(k, np.int64))
    if base or layout not in (0, 1):
        raise ValueError("gmma_address: base offset 0 and layouts 0, 1 only")
    if (k < 0).any() or (k >= 8).any() or (row < 0).any():
        raise ValueError("gmma_address: k must be in [0, 8) and rows >= 0")
    if layout == 0:
        return start + (row % 8) * 16 + (row // 8) * sbo + (k % 4) * 4 + (k // 4) * lbo
    addr = start + (row % 8) * 128 + (row // 8) * sbo + k * 4
    return addr ^ (((addr >> 7) & 7) << 4)


def wgmma_load_map(
    config: TileConfig, operand: str, op: str = "filter_acts"
) -> tuple[np.ndarray, np.ndarray]:
    """(row, k) of every element each thread copies: arrays (threads, copies).

    The kernel's ``wgmma_a_row``/``wgmma_a_k`` and ``wgmma_b_col``/``wgmma_b_k``.
    A (rows m): 16-byte vector e of thread t is row ``t // 8 + e*threads/8``,
    k ``4*(t % 8) + i`` (element ``4e + i``). B (rows n): every copy of
    thread t is column ``t % 8 + 8*(t // (8*tpn))``, ``tpn = threads/bn``;
    copy ``(c, s)`` (element ``c*(4/tpn) + s``) is k ``4c + ((t // 8 +
    tpn*s) % 4)``. B of an ``nhwc`` tile (rows n): the map of A, 16-byte
    vectors of 8 threads per row (the kernel's ``nhwc_b_copies``).

    ``op="weight_acts"`` (the tap-major weight gradient, the kernel's
    ``wgmma_wgrad_k``): A and B alike, element ``4e + s`` of thread t is row
    ``t // 8 + e*threads/8``, k ``4*(t % 8) + ((s + t // 8) % 4)`` (the same
    4 elements as A's vector, rotated so that a warp's 4-byte copies hit 32
    banks).
    """
    t = config.threads
    tid = np.arange(t)[:, None, None]
    if op == "weight_acts" and operand in ("A", "B"):
        rows = config.bm if operand == "A" else config.bn
        e = np.arange(rows * 8 // t)[None, :, None]
        s = np.arange(4)[None, None, :]
        r, k = np.broadcast_arrays(
            tid // 8 + e * (t // 8), 4 * (tid % 8) + wgrad_rot(tid, s)
        )
    elif operand == "A" or (operand == "B" and config.nhwc):
        rows = config.bm if operand == "A" else config.bn
        e = np.arange(rows * 8 // t)[None, :, None]
        i = np.arange(4)[None, None, :]
        r, k = np.broadcast_arrays(tid // 8 + e * (t // 8), 4 * (tid % 8) + i)
    elif operand == "B":
        tpn = t // config.bn
        c = np.arange(config.bk // 4)[None, :, None]
        s = np.arange(4 // tpn)[None, None, :]
        r, k = np.broadcast_arrays(
            tid % 8 + 8 * (tid // (8 * tpn)), 4 * c + ((tid // 8 + tpn * s) & 3)
        )
    else:
        raise ValueError(f"conv_igemm.wgmma_load_map: operand A or B, got {operand!r}")
    return r.reshape(t, -1), k.reshape(t, -1)


def wgrad_rot(tid: Any, s: Any) -> np.ndarray:
    """The residue of copy ``s`` of thread ``tid`` in its 16-byte chunk (wgradtm)."""
    return (np.asarray(s) + np.asarray(tid) // 8) & 3


def wgmma_accumulator_map(lane: int, warp: int, bn: int) -> np.ndarray:
    """(row, column) in its warpgroup's 64 x ``bn`` tile of accumulator
    ``d[i][q]`` of lane ``lane`` of warp ``warp`` (0-3 within the warpgroup):
    ``(16*warp + lane//4 + 8*(q//2), 8*i + 2*(lane % 4) + q % 2)`` (PTX ISA,
    the wgmma ``.m64nNk8`` D fragment). Shape ``(bn/8, 4, 2)``."""
    i = np.arange(bn // 8)[:, None]
    q = np.arange(4)[None, :]
    row = 16 * warp + lane // 4 + 8 * (q >> 1)
    col = 8 * i + 2 * (lane % 4) + (q & 1)
    return np.stack(np.broadcast_arrays(row, col), axis=-1)


def emulate_wgmma_block(
    config: TileConfig,
    a_tile: np.ndarray,
    b_tile: np.ndarray,
    base: int = 0,
    stage: int | None = None,
    op: str = "filter_acts",
) -> np.ndarray:
    """One block's product of one stage through the wgmma kernel's data path.

    ``a_tile`` (bm, 32) and ``b_tile`` (32, bn) are copied into a model of
    the dynamic shared memory starting at byte ``base`` (the stages from the
    first 1024-byte boundary, ``stage`` default the last) as
    :func:`wgmma_load_map` and :func:`wgmma_smem_offset` say; each
    warpgroup's k8 steps read them back through the descriptors the kernel
    builds (:func:`gmma_descriptor`, :func:`gmma_address`) and multiply; the
    accumulators (:func:`wgmma_accumulator_map`) go to C as the epilogue
    stores them (:func:`fragment_map`'s ``c_mn``). Returns C (bm, bn). Raises
    if a copy or a read leaves its operand's stage, two copies collide, or a
    read finds no copied element. ``op="weight_acts"``: the copy maps of the
    tap-major weight gradient.
    """
    if not (config.wgmma and config.valid()):
        raise ValueError(f"conv_igemm: {config} is not a valid wgmma tile")
    a_floats, b_floats = config.smem_floats("filter_acts")
    a_bytes, b_bytes = 4 * a_floats, 4 * b_floats
    stage = config.stages - 1 if stage is None else stage
    smem0 = (base + 1023) & ~1023
    a_st = smem0 + stage * (a_bytes + b_bytes)
    b_st = a_st + a_bytes
    if b_st + b_bytes > base + config.shared_bytes("filter_acts"):
        raise AssertionError("conv_igemm: a wgmma stage past the shared memory")
    smem = np.full((base + config.shared_bytes("filter_acts")) // 4, np.nan)
    for operand, start, size in (("A", a_st, a_bytes), ("B", b_st, b_bytes)):
        r, k = wgmma_load_map(config, operand, op)
        addr = start + wgmma_smem_offset(r, k)
        if addr.min() < start or addr.max() + 4 > start + size:
            raise AssertionError(
                f"conv_igemm: a wgmma copy of {operand} leaves its stage"
            )
        if len(np.unique(addr)) != addr.size or addr.size * 4 != size:
            raise AssertionError(f"conv_igemm: wgmma copies of {operand} collide")
        smem[addr // 4] = a_tile[r, k] if operand == "A" else b_tile[k, r]
    out = np.full((config.bm, config.bn), np.nan)
    j = np.arange(8)[None, :]
    for wg in range(config.threads // 128):
        d = np.zeros((64, config.bn))
        for kk in range(config.bk // 8):
            reads = []
            a_wg = a_st + wg * 64 * _SW128_ROW  # this warpgroup's 64 rows of A
            for start, rows in ((a_wg, 64), (b_st, config.bn)):
                addr = gmma_address(
                    gmma_descriptor(start + kk * 32), np.arange(rows)[:, None], j
                )
                if addr.min() < start or addr.max() + 4 > start + rows * _SW128_ROW:
                    raise AssertionError("conv_igemm: a wgmma read leaves its operand")
                reads.append(smem[addr // 4])
                if np.isnan(reads[-1]).any():
                    raise AssertionError("conv_igemm: a wgmma read finds no copy")
            d += reads[0] @ reads[1].T
        for warp in range(4):
            for lane in range(32):
                acc = wgmma_accumulator_map(lane, warp, config.bn)
                cmn = fragment_map(config, "filter_acts", (lane, 4 * wg + warp))
                cmn = cmn["c_mn"][0]
                out[cmn[..., 0], cmn[..., 1]] = d[acc[..., 0], acc[..., 1]]
    return out


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


def _streamk_check(total: int, grid: int) -> None:
    if not 1 <= grid <= total:
        raise ValueError(
            f"conv_igemm: stream-K grid {grid} outside [1, {total} iterations]"
        )


def streamk_items(tiles: int, kt: int, grid: int) -> list[list[tuple[int, ...]]]:
    """Per block, its items ``(tile, kt_lo, kt_hi, slot)``: block ``b`` runs
    iterations ``[T*b // grid, T*(b + 1) // grid)`` of ``T = tiles*kt``
    (tile-major), cut at tile boundaries; ``slot`` (where a segment's partial
    goes) is 0 for the block's first item and 1 for later ones."""
    total = tiles * kt
    _streamk_check(total, grid)
    out = []
    for b in range(grid):
        it, stop = total * b // grid, total * (b + 1) // grid
        mine, slot = [], 0
        while it < stop:
            tile = it // kt
            lo = it - tile * kt
            hi = min(kt, lo + stop - it)
            it += hi - lo
            mine.append((tile, lo, hi, slot))
            slot = 1
        out.append(mine)
    return out


def streamk_block_of(i: Any, total: int, grid: int) -> Any:
    """The block whose run holds iteration ``i``: ``((i + 1)*grid - 1) // total``."""
    _streamk_check(total, grid)
    return ((np.asarray(i, np.int64) + 1) * grid - 1) // total


def streamk_segments(
    tile: int, kt: int, total: int, grid: int
) -> list[tuple[int, int]]:
    """``(block, slot)`` of each segment of ``tile``, in the order the last
    arriving block sums them: the blocks holding its first to its last
    iteration; the first one's slot is 1 when its run starts before the tile."""
    first = tile * kt
    b_first = int(streamk_block_of(first, total, grid))
    b_last = int(streamk_block_of(first + kt - 1, total, grid))
    first_slot = 1 if total * b_first // grid < first else 0
    return [(b, first_slot if b == b_first else 0) for b in range(b_first, b_last + 1)]


def wgrad_copies(
    config: TileConfig,
    g: ConvGeometry,
    grp: int,
    tap: int,
    m0: int,
    n0: int,
    k0: int,
    k_end: int,
    aligned: bool = True,
) -> dict:
    """The global sources of one stage's copies of a tap-major weight-gradient
    block (the kernel's ``wgrad_load_tile``): group ``grp``, filter tap ``tap =
    u*kw + v``, tile rows ``m0`` (filters) and ``n0`` (channels), k tile
    ``k0`` of a slice ending at ``k_end``.

    Element ``4e + s`` of thread t copies pixel ``k0 + k`` with (row, k) from
    :func:`wgmma_load_map` (``op="weight_acts"``); the thread decodes its 4
    pixels ``k = (img*Ho + oh)*Wo + ow`` once (``wgrad_pixels``): A's offset
    ``dy[img][grp*Fg + m][oh][ow]``, B's ``x[img][grp*Cg + n][oh*sh - ph +
    u][ow*sw - pw + v]``, predicated by ``k < k_end``, the row inside M (N)
    and, for B, the pixel inside the image. ``vec`` (threads, rows): the row
    takes one 16-byte copy (``aligned``: dy's pointer is 16-byte aligned; the
    4 pixels one run of one image inside the slice; the run's offset a
    multiple of 4), which must land the same 4 elements as the 4-byte copies.

    Returns ``a``, ``b``: dicts of ``row``, ``k``, ``off``, ``ok`` (threads,
    copies), and ``vec``, ``vec_off`` (threads, A rows per thread).
    """
    d = _dims(g)
    t = config.threads
    big_m, big_n, _ = _kernel_gemm("weight_acts", g, config)
    tid = np.arange(t)[:, None, None]
    s = np.arange(4)[None, None, :]
    k = k0 + 4 * (tid % 8) + wgrad_rot(tid, s)  # (t, 1, 4)
    ohw, hw = d["OH"] * d["OW"], d["H"] * d["W"]
    img = _div(k, ohw)
    pix = k - img * ohw
    oh = _div(pix, d["OW"])
    ow = pix - oh * d["OW"]
    u = tap // d["KW"]
    v = tap - u * d["KW"]
    ih = oh * d["SH"] - d["PH"] + u
    iw = ow * d["SW"] - d["PW"] + v
    k_ok = k < k_end
    b_ok = k_ok & (ih >= 0) & (ih < d["H"]) & (iw >= 0) & (iw < d["W"])
    a_off = img * d["F"] * ohw + pix
    b_off = (img * d["C"] * hw) + ih * d["W"] + iw
    out: dict = {}
    for operand, rows, lim, r0, off, ok, rstride, rbase in (
        ("a", config.bm, big_m, m0, a_off, k_ok, ohw, grp * d["Fg"]),
        ("b", config.bn, big_n, n0, b_off, b_ok, hw, grp * d["Cg"]),
    ):
        e = np.arange(rows * 8 // t)[None, :, None]
        r = tid // 8 + e * (t // 8)  # (t, E, 1)
        row_ok = r0 + r < lim
        row = (rbase + r0 + r) * rstride
        full = np.broadcast_to
        shape = (t, r.shape[1], 4)
        out[operand] = dict(
            row=full(r, shape).reshape(t, -1),
            k=full(k - k0, shape).reshape(t, -1),
            off=full(off + row, shape).reshape(t, -1),
            ok=full(ok & row_ok, shape).reshape(t, -1),
        )
        if operand == "a":
            run = k_ok.all(axis=-1) & (img == img[..., :1]).all(axis=-1)  # (t, 1)
            run_off = a_off[..., 0] - wgrad_rot(tid[..., 0], 0)  # pixel k0 + a_k
            vec_off = run_off + row[..., 0]
            vec = aligned & run & row_ok[..., 0] & (vec_off % 4 == 0)
            out["a"]["vec"], out["a"]["vec_off"] = vec, vec_off
    return out


def emulate_wgrad_wgmma(
    g: ConvGeometry,
    dy: np.ndarray,
    x: np.ndarray,
    *,
    config: TileConfig | None = None,
    splits: int | None = 1,
    aligned: bool = True,
    num_sms: int = 132,
) -> np.ndarray:
    """``weight_acts`` computed through the tap-major wgmma kernel's maps, float64.

    The grid of :func:`plan` (``splits=None``: its split-K rule for
    ``num_sms``): per block (channel tile, filter tile, ``(split*kh*kw +
    tap)*groups + grp``) and k tile of its slice, the operand tiles are
    gathered through :func:`wgrad_copies` (each tile element copied exactly
    once, 16-byte copies at the offsets of the 4-byte ones), multiplied, and
    stored at :func:`c_offset` (``tap``) of the partials, which are summed in
    slice order; every output element must be written once per slice.
    """
    config = config or WGMMA_WGRAD_TILES[0]
    if not config.valid_wgrad():
        raise ValueError(f"conv_igemm: {config} is not a wgmma weight-gradient tile")
    d = _dims(g)
    p = plan("weight_acts", g, "tf32", config, num_sms, splits, aligned)
    khkw = d["KH"] * d["KW"]
    size = math.prod(_out_shape("weight_acts", g))
    out = np.full(p.splits * size, np.nan)
    written = np.zeros(p.splits * size, dtype=np.int64)
    flats = [np.asarray(t, np.float64).reshape(-1) for t in (dy, x)]
    for bx, by, bz in np.ndindex(*p.grid):
        grp = bz % d["G"]
        tap = (bz // d["G"]) % khkw
        split = bz // (d["G"] * khkw)
        m0, n0 = by * config.bm, bx * config.bn
        k_begin = split * p.k_chunk
        k_end = min(p.k, k_begin + p.k_chunk)
        acc = np.zeros((config.bm, config.bn))
        for k0 in range(k_begin, k_end, config.bk):
            cp = wgrad_copies(config, g, grp, tap, m0, n0, k0, k_end, aligned)
            tiles = []
            for key, flat, rows in (
                ("a", flats[0], config.bm),
                ("b", flats[1], config.bn),
            ):
                c = cp[key]
                tile = np.full((rows, config.bk), np.nan)
                tile[c["row"], c["k"]] = _gather(flat, c["off"], c["ok"])
                if (
                    np.isnan(tile).any()
                    or len(np.unique(c["row"] * 32 + c["k"])) != tile.size
                ):
                    raise AssertionError(
                        "conv_igemm: a wgrad tile element copied never or twice"
                    )
                tiles.append(tile)
            a = cp["a"]
            four = a["off"].reshape(*a["vec"].shape, 4)
            run = a["vec_off"][..., None] + (
                a["k"].reshape(four.shape)
                - 4 * (np.arange(config.threads)[:, None, None] % 8)
            )
            if (a["vec"] & (four != run).any(axis=-1)).any() or (
                a["vec_off"][a["vec"]] % 4
            ).any():
                raise AssertionError(
                    "conv_igemm: a 16-byte dy copy reads other elements"
                )
            acc += tiles[0] @ tiles[1].T
        m = m0 + np.arange(config.bm)[:, None]
        n = n0 + np.arange(config.bn)[None, :]
        store = (m < p.m) & (n < p.n)
        off = c_offset("weight_acts", g, grp, m, n, split=split, tap=tap)[store]
        out[off] = acc[store]
        np.add.at(written, off, 1)
    if not (written == 1).all():
        raise AssertionError("conv_igemm.emulate: an output written never or twice")
    return out.reshape(p.splits, size).sum(axis=0).reshape(_out_shape("weight_acts", g))


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
    row of :func:`permuted_weights` (K contiguous elements), so ``K % 4 == 0``.
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
