"""The tensor-core implicit-GEMM convolution kernels (``cc2ops.cuda.ops.conv.igemm``).

CPU tests (run everywhere): the kernels' index maps, emulated in numpy, compute
the three passes exactly like the references of ``cc2ops.conv``; the fast
division matches ``//``; the tile load maps (4-byte and 16-byte) cover each
tile once and the 16-byte copies are exact where :func:`a_vector_width` says
so; the fragment maps with the permuted k and the documented m16n8k8
semantics reproduce a block's product; the staged epilogue stores every C
element once; shared-memory fragment and staging accesses are free of bank
conflicts; a model of the tensor cores' truncating accumulation shows why
3xTF32 promotes every k8 step's sum to fp32 FADDs; plans and ``supports``.

GPU tests (``gpu`` marker): the kernels against the float64 references on odd
shapes, groups, strides, rectangular images and filters and the AlexNet
layers, with NaN-poisoned outputs; TF32 relative error < 5e-3 (and > 1e-6, so
TF32 really ran), 3xTF32 < 1e-5; each data path (16-byte or 4-byte A copies,
staged or direct C stores), misaligned operands, and forced split-K (the
sanitize test exercises the reduction kernel whatever the SM count).

The wgmma (sm_90a) tiles: CPU tests check that the copies cover each operand
tile once, free of bank conflicts, that the matrix descriptors find every
element where the copies wrote it (a model of the hardware's K-major,
128-byte-swizzled addressing), that a block's product through copies,
descriptors and the accumulator map is the matrix product, that the C
helpers of the rendered kernel compute the numpy spec (a host program built
with nvcc), that the tiles compile for sm_90a and are offered only on
compute capability 9.0. GPU tests (``-k wgmma``, on a 9.0 device) run every
tile on a sweep of shapes and the AlexNet layers, and accumulate. The
tap-major wgmma weight gradient (``-k "wgmma and wgrad"``): its copies,
split-K slices, taps and stores reproduce dW in numpy, its C copy map is the
numpy one; on the GPU every tile on a sweep, AlexNet conv2..conv5, forced
splits, misaligned dy, accumulate, a sanitize case.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import needs_nvcc, rel_err

from cc2ops.conv import (
    conv_backward_data_reference,
    conv_backward_filter_reference,
    conv_forward_reference,
)
from cc2ops.cuda.ops.conv import igemm as ci
from cc2ops.cuda.ops.conv import twins as tw
from cc2ops.cuda.ops.conv.ops import ConvGeometry as Geom
from cc2ops.shapes import conv_output_shape


def geom(b, c, hw, f, khw, stride=1, pad=0, groups=1) -> Geom:
    hw = hw if isinstance(hw, tuple) else (hw, hw)
    khw = khw if isinstance(khw, tuple) else (khw, khw)
    st = stride if isinstance(stride, tuple) else (stride, stride)
    pd = pad if isinstance(pad, tuple) else (pad, pad)
    oh, ow = conv_output_shape(hw, khw, st, pd)
    return Geom(b, c, *hw, f, *khw, *st, *pd, groups, oh, ow)


def tensors(g: Geom, seed: int = 0, dtype=np.float32):
    r = np.random.default_rng(seed)
    x = r.standard_normal((g.batch, g.channels, g.height, g.width)).astype(dtype)
    w = r.standard_normal((g.filters, g.channels // g.groups, g.kh, g.kw))
    dy = r.standard_normal((g.batch, g.filters, g.out_h, g.out_w))
    return x, w.astype(dtype), dy.astype(dtype)


def conv_args(g: Geom):
    return dict(
        stride=(g.stride_h, g.stride_w),
        padding=(g.pad_h, g.pad_w),
        groups=g.groups,
    )


def reference(op: str, g: Geom, x, w, dy) -> np.ndarray:
    """float64 references of cc2ops.conv."""
    x, w, dy = (np.asarray(t, np.float64) for t in (x, w, dy))
    kw = conv_args(g)
    if op == "filter_acts":
        return conv_forward_reference(x, w, **kw)
    if op == "image_acts":
        return conv_backward_data_reference(dy, w, (g.height, g.width), **kw)
    return conv_backward_filter_reference(x, dy, (g.kh, g.kw), **kw)


def operands(op: str, x, w, dy):
    """(A's tensor, B's tensor) of a pass."""
    return {"filter_acts": (w, x), "image_acts": (w, dy), "weight_acts": (dy, x)}[op]


#: Every mma.sync tile the autotuner may run (the structural checks apply to all).
ALL_TILES = ci.TILES + ci.TAP_TILES
#: ... and the wgmma tiles, which share the staged epilogue.
EPILOGUE_TILES = ALL_TILES + ci.WGMMA_TILES

#: Shapes of the sweeps: odd batches and channels, groups, rectangular images
#: and filters, strides and paddings (b, c, hw, f, khw, stride, pad, groups).
SHAPES = {
    "b1 c1 3x3": (1, 1, 6, 4, 3, 1, 1, 1),
    "b3 c3 5x5 p2": (3, 3, 9, 5, 5, 1, 2, 1),
    "b2 c5 s2 p1": (2, 5, 9, 7, 3, 2, 1, 1),
    "b2 c6 groups2": (2, 6, 7, 4, 3, 1, 1, 2),
    "b2 c3 7x5 img 3x2 filt": (2, 3, (7, 5), 5, (3, 2), 1, 0, 1),
    "b3 c4 rect stride/pad": (3, 4, (8, 6), 6, (3, 2), (2, 1), (1, 0), 2),
    "b2 c3 11x11 s4 p2": (2, 3, 23, 4, 11, 4, 2, 1),
    "b1 c64 1x1": (1, 64, 5, 3, 1, 1, 0, 1),
    "b2 c2 s3 no pad": (2, 2, 10, 3, 4, 3, 0, 1),
}


# --------------------------------------------------------------------------
# CPU: the index maps
# --------------------------------------------------------------------------


@pytest.mark.parametrize("op", ci.OPS)
@pytest.mark.parametrize("label", list(SHAPES))
def test_emulated_index_maps_match_the_references(op, label):
    g = geom(*SHAPES[label])
    x, w, dy = tensors(g, dtype=np.float64)
    want = reference(op, g, x, w, dy)
    for config in (ci.TILES[0], ci.TILES[4]):
        got = tw.emulate(op, g, *operands(op, x, w, dy), config=config)
        assert got.shape == want.shape, (label, op)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=label)


@pytest.mark.parametrize("splits", [2, 3, 7])
def test_emulated_split_k_slices_sum_to_weight_acts(splits):
    g = geom(3, 4, 9, 6, 3, 1, 1, 2)
    x, w, dy = tensors(g, dtype=np.float64)
    want = reference("weight_acts", g, x, w, dy)
    config = ci.TileConfig(32, 128, 8, 1, 4)  # bk 8: enough k tiles to slice
    got = tw.emulate("weight_acts", g, dy, x, config=config, splits=splits)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


#: Tap-major shapes: channels and filters per group multiples of 32
#: (b, c, hw, f, khw, stride, pad, groups).
TAP_SHAPES = {
    "b3 c32 f64 3x3 p1": (3, 32, 7, 64, 3, 1, 1, 1),
    "b2 c64 f32 5x5 p2 rect": (2, 64, (9, 6), 32, (5, 3), 1, (2, 1), 1),
    "b2 c64 f64 s2 g2": (2, 64, 9, 64, 3, 2, 1, 2),
    "b1 c32 f32 11x11 s4 p2": (1, 32, 23, 32, 11, 4, 2, 1),
    "b5 c32 f96 1x1": (5, 32, 6, 96, 1, 1, 0, 1),
}


@pytest.mark.parametrize("op", ["filter_acts", "image_acts"])
@pytest.mark.parametrize("label", list(TAP_SHAPES))
def test_emulated_tapmajor_index_maps_match_the_references(op, label):
    g = geom(*TAP_SHAPES[label])
    x, w, dy = tensors(g, dtype=np.float64)
    want = reference(op, g, x, w, dy)
    tiles = [t for t in ci.TAP_TILES if ci.tapmajor_ok(op, g, t)]
    assert tiles, label
    for config in tiles:
        got = tw.emulate(op, g, *operands(op, x, w, dy), config=config)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-11, err_msg=label)


def test_permuted_weights_and_when_tapmajor_applies():
    g = geom(2, 64, 9, 32, (3, 2), 1, 1, 2)  # Cg 32, Fg 16
    w = np.arange(32 * 32 * 6, dtype=np.float64).reshape(32, 32, 3, 2)
    wp = tw.permuted_weights("filter_acts", g, w)
    assert wp.shape == (32, 6 * 32)
    assert wp[5, 4 * 32 + 7] == w[5, 7, 2, 0]  # tap 4 = (u 2, v 0), channel 7
    wq = tw.permuted_weights("image_acts", g, w)
    assert wq.shape == (2, 32, 6 * 16)
    assert wq[1, 3, 5 * 16 + 9] == w[16 + 9, 3, 2, 1]
    t16, t32 = ci.TAP_TILES[0], ci.TAP_TILES[1]
    assert ci.tapmajor_ok("filter_acts", g, t32) and ci.tapmajor_ok(
        "image_acts", g, t16
    )
    assert not ci.tapmajor_ok("image_acts", g, t32)  # Fg 16
    assert not ci.tapmajor_ok("weight_acts", g, t16)
    conv1 = geom(8, 3, 224, 64, 11, 4, 2)
    assert not any(t.tapmajor for t in ci.variants("filter_acts", conv1, "tf32"))
    assert any(t.tapmajor for t in ci.variants("image_acts", conv1, "tf32"))
    with pytest.raises(ValueError, match="tap-major tile .* applies to"):
        ci.plan("image_acts", g, "tf32", t32)
    p = ci.plan("filter_acts", g, "fp32", t32)
    assert p.consts["op"] == "fwdtm" and p.consts["AVEC"] == 4
    assert "_fwdtm_" in p.consts["name"] and t32.label.endswith("_tm")
    assert ci.a_vector_width("image_acts", g, tapmajor=True) == 4


def test_emulated_batch_129_alexnet_conv3_slice():
    g = geom(129, 6, 13, 5, 3, 1, 1)
    x, w, dy = tensors(g, dtype=np.float64)
    for op in ci.OPS:
        got = tw.emulate(op, g, *operands(op, x, w, dy))
        np.testing.assert_allclose(
            got, reference(op, g, x, w, dy), rtol=1e-11, atol=1e-10
        )


def test_fastdiv_matches_floor_division():
    r = np.random.default_rng(1)
    divisors = [1, 2, 3, 5, 7, 13, 27 * 27, 55 * 55, 169, 224 * 224, 2**20 + 7]
    divisors += [2**31 - 1, 2**30, 2**30 + 1] + list(r.integers(1, 2**31, 20))
    n = np.concatenate(
        [np.arange(5000), r.integers(0, 2**31, 20000), [2**31 - 1, 2**31 - 2]]
    )
    for d in divisors:
        magic, shift = ci.fastdiv_magic(int(d))
        assert 0 < magic < 2**32 and 0 <= shift <= 31
        got = tw.fastdiv(n, magic, shift)
        np.testing.assert_array_equal(got, n // int(d), err_msg=f"d={d}")
    with pytest.raises(ValueError, match="divisor must be in"):
        ci.fastdiv_magic(0)


@pytest.mark.parametrize("config", ALL_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("op", ci.OPS)
def test_load_maps_cover_each_tile_once(config, op):
    assert config.valid() and config.can_vec()
    maps = [("A", config.bm, 1), ("B", config.bn, 1), ("A", config.bm, 4)]
    for operand, rows, vec in maps:
        r, k = tw.load_map(config, op, operand, vec)
        assert r.min() >= 0 and r.max() < rows and k.min() >= 0 and k.max() < config.bk
        flat = np.sort((r * config.bk + k).ravel())
        np.testing.assert_array_equal(flat, np.arange(rows * config.bk))
        if vec == 4:  # each vector: 4 consecutive k of one row, 16-byte aligned
            rv, kv = r.reshape(len(r), -1, 4), k.reshape(len(k), -1, 4)
            assert (rv == rv[..., :1]).all()
            assert (kv == kv[..., :1] + np.arange(4)).all()
            assert (kv[..., 0] % 4 == 0).all()
            assert ((rv[..., 0] * (config.bk + 8) + kv[..., 0]) % 4 == 0).all()
    with pytest.raises(ValueError, match="only A"):
        tw.load_map(config, op, "B", 4)


def _vectors_exact(op: str, g: Geom) -> bool:
    """Whether every k-aligned group of 4 elements of A (every group, padded
    k range) is one aligned, contiguous, all-or-nothing 16-byte run."""
    big_m, _, big_k = ci.gemm_shape(op, g)
    m = np.arange(big_m)[:, None, None]
    k = (np.arange(0, big_k + 8, 4)[:, None] + np.arange(4))[None]
    for grp in range(g.groups):
        off, ok = tw.a_offset(op, g, grp, m, k)
        if not (ok == ok[..., :1]).all():
            return False
        o = np.where(ok, off, 0)
        if not ((o == o[..., :1] + np.arange(4)) | ~ok).all():
            return False
        if not ((o[..., 0] % 4 == 0) | ~ok[..., 0]).all():
            return False
    return True


VEC_SHAPES = dict(SHAPES)
VEC_SHAPES.update(
    {
        "b2 c4 8x8 (Ho*Wo 64, K 36)": (2, 4, 8, 6, 3, 1, 1, 1),
        "b3 c8 14x14 g2 (K 36)": (3, 8, 14, 4, 3, 1, 1, 2),
        "b2 c12 6x6 1x1 (K 12)": (2, 12, 6, 5, 1, 1, 0, 1),
    }
)


@pytest.mark.parametrize("op", ci.OPS)
@pytest.mark.parametrize("label", list(VEC_SHAPES))
def test_a_vector_width_is_exact_and_necessary(op, label):
    g = geom(*VEC_SHAPES[label])
    exact = _vectors_exact(op, g)
    if op == "image_acts":  # contiguous along k only when C/groups == 1: unused
        assert ci.a_vector_width(op, g) == 1
    else:
        assert ci.a_vector_width(op, g) == (4 if exact else 1), label
        assert any(ci.a_vector_width(op, geom(*s)) == 4 for s in VEC_SHAPES.values())


def test_plan_uses_16_byte_copies_where_exact():
    conv3 = geom(8, 192, 13, 384, 3, 1, 1)  # K = 1728; Ho*Wo = 169
    res = geom(8, 64, 14, 64, 3, 1, 1)  # Ho*Wo = 196
    t = ci.TILES[0]
    assert ci.plan("filter_acts", conv3, "tf32", t).consts["AVEC"] == 4
    assert ci.plan("weight_acts", conv3, "tf32", t).consts["AVEC"] == 1
    assert ci.plan("weight_acts", res, "fp32", t).consts["AVEC"] == 4
    assert ci.plan("image_acts", res, "tf32", t).consts["AVEC"] == 1
    p = ci.plan("filter_acts", conv3, "tf32", t, aligned=False)
    assert p.consts["AVEC"] == 1 and "_av4" not in p.consts["name"]
    old = ci.TileConfig(128, 128, 16, 2, 4, vec=False, stage_c=False)
    p = ci.plan("filter_acts", conv3, "tf32", old)
    assert (p.consts["AVEC"], p.consts["STAGE_C"]) == (1, 0)
    assert p.consts["name"].endswith("_st3_tf32") and old.label.endswith("_a4_cdirect")
    narrow = ci.TileConfig(64, 64, 16, 2, 4)  # warp tile 32 x 16: direct stores
    assert not narrow.can_stage_c()
    assert ci.plan("filter_acts", conv3, "tf32", narrow).consts["STAGE_C"] == 0


@pytest.mark.parametrize("config", ALL_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("op", ["filter_acts", "weight_acts"])
def test_fragments_with_permuted_k_reproduce_the_block_product(config, op):
    r = np.random.default_rng(2)
    a = r.standard_normal((config.bm, config.bk))
    b = r.standard_normal((config.bk, config.bn))
    got = tw.emulate_block(config, op, a, b)
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("config", EPILOGUE_TILES, ids=lambda t: t.label)
def test_staged_epilogue_stores_each_element_once(config):
    c = np.random.default_rng(3).standard_normal((config.bm, config.bn))
    np.testing.assert_array_equal(tw.emulate_epilogue(config, c), c)
    assert 4 * config.stage_c_floats() <= config.shared_bytes("filter_acts")


def _bank_conflicts(addresses: np.ndarray, width: int) -> int:
    """Extra wavefronts of one warp-wide shared load of ``width`` floats each."""
    per_phase = 32 // width  # threads served per 128-byte wavefront
    worst = 0
    for start in range(0, 32, per_phase):
        words = addresses[start : start + per_phase]
        banks = [(w + i) % 32 for w in words for i in range(width)]
        worst = max(worst, max(np.bincount(banks, minlength=32)) - 1)
    return worst


@pytest.mark.parametrize("config", ALL_TILES, ids=lambda t: t.label)
@pytest.mark.parametrize("op", ["filter_acts", "weight_acts"])
def test_fragment_loads_are_free_of_bank_conflicts(config, op):
    for warp in range(config.threads // 32):
        frags = [tw.fragment_map(config, op, (lane, warp)) for lane in range(32)]
        a = np.stack([f["a"] for f in frags])  # (lane, mt, kk, 4)
        b = np.stack([f["b"] for f in frags])  # (lane, nt, kk, 2)
        for mt in range(a.shape[1]):
            for kk in range(a.shape[2]):
                for q in (0, 1):  # float2 loads of registers (q, q + 2)
                    assert (a[:, mt, kk, q + 2] == a[:, mt, kk, q] + 1).all()
                    assert a[:, mt, kk, q].min() % 2 == 0  # 8-byte aligned
                    assert _bank_conflicts(a[:, mt, kk, q], 2) == 0
        for nt in range(b.shape[1]):
            for kk in range(b.shape[2]):
                if op == "weight_acts":
                    assert (b[:, nt, kk, 1] == b[:, nt, kk, 0] + 1).all()
                    assert _bank_conflicts(b[:, nt, kk, 0], 2) == 0
                else:
                    for q in (0, 1):
                        assert _bank_conflicts(b[:, nt, kk, q], 1) == 0


@pytest.mark.parametrize("config", EPILOGUE_TILES, ids=lambda t: t.label)
def test_staged_epilogue_is_free_of_bank_conflicts(config):
    for warp in range(config.threads // 32):
        maps = [tw.epilogue_map(config, (lane, warp)) for lane in range(32)]
        write = np.stack([m["write"] for m in maps])  # (lane, mt, h, nt)
        read = np.stack([m["read"] for m in maps])  # (lane, r, c)
        assert (write % 2 == 0).all()  # float2-aligned
        for mt, h, nt in np.ndindex(*write.shape[1:]):
            assert _bank_conflicts(write[:, mt, h, nt], 2) == 0
        for r, c in np.ndindex(*read.shape[1:]):
            assert _bank_conflicts(read[:, r, c], 1) == 0


# --------------------------------------------------------------------------
# CPU: a model of the tensor cores' accumulation (why 3xTF32 promotes)
# --------------------------------------------------------------------------


def _tf32(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32: round to 10 fraction bits, ties away from zero."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x1000) & ~np.uint64(0x1FFF)
    return u.astype(np.uint32).view(np.float32)


def _mma_model(c: np.ndarray, a: np.ndarray, b: np.ndarray, extra: int) -> np.ndarray:
    """One m16n8k8 dot row, c + sum_j a_j b_j, as the tensor cores are modelled
    (Fasi et al. 2021, and the FP8 finding of DeepSeek-V3): exact products, every
    addend aligned to the largest one and truncated to 24 + ``extra`` bits,
    an exact sum, the result truncated to fp32."""
    terms = np.concatenate(
        [np.float64(a) * np.float64(b), np.float64(c)[:, None]], axis=1
    )
    mx = np.abs(terms).max(axis=1)
    e = np.floor(np.log2(np.where(mx > 0, mx, 1.0)))
    q = np.exp2(e - 23 - extra)[:, None]
    s = (np.trunc(terms / q) * q).sum(axis=1)
    f = s.astype(np.float32)
    over = np.abs(np.float64(f)) > np.abs(s)  # rounded away from zero: step back
    return np.where(over, np.nextafter(f, np.float32(0)), f)


def _dot_3xtf32(a: np.ndarray, b: np.ndarray, promote: bool, extra: int) -> np.ndarray:
    """Row-wise dot products through the kernel's 3xTF32 k8 steps."""
    ab, bb = _tf32(a), _tf32(b)
    asm, bsm = _tf32(a - ab), _tf32(b - bb)
    acc = np.zeros(len(a), np.float32)
    for k in range(0, a.shape[1], 8):
        s = slice(k, k + 8)
        if promote:  # the kernel: a zeroed fragment, small terms first, FADD
            t = _mma_model(np.zeros_like(acc), asm[:, s], bb[:, s], extra)
            t = _mma_model(t, ab[:, s], bsm[:, s], extra)
            t = _mma_model(t, ab[:, s], bb[:, s], extra)
            acc = acc + t
        else:  # conv-b's first version: all three into the accumulator
            acc = _mma_model(acc, asm[:, s], bb[:, s], extra)
            acc = _mma_model(acc, ab[:, s], bsm[:, s], extra)
            acc = _mma_model(acc, ab[:, s], bb[:, s], extra)
    return acc


def test_truncating_accumulation_model_and_per_step_promotion():
    # The H200 measured 1.1e-5 .. 3.4e-5 for K = 1600 .. 4800 with the
    # direct accumulation; this model gives the same growth with K, and the
    # per-k8-step promotion bounds it far below the 1e-5 fp32 tolerance.
    r = np.random.default_rng(4)
    errs = {}
    for big_k in (384, 4800):
        a = r.standard_normal((400, big_k)).astype(np.float32)
        b = r.standard_normal((400, big_k)).astype(np.float32)
        want = (np.float64(a) * np.float64(b)).sum(axis=1)
        for promote in (False, True):
            got = _dot_3xtf32(a, b, promote, extra=3)
            errs[big_k, promote] = rel_err(got, want)
    assert errs[4800, False] > 1.5e-5  # the failure seen on the H200
    assert errs[4800, False] > 5 * errs[384, False]  # grows ~linearly with K
    assert errs[4800, True] < 1e-6 and errs[384, True] < 5e-7
    assert errs[4800, True] < 2 * errs[384, True] * math.sqrt(4800 / 384)


# --------------------------------------------------------------------------
# CPU: plans, names, supports
# --------------------------------------------------------------------------


def test_plan_grid_and_split_k():
    g = geom(128, 192, 13, 384, 3, 1, 1)  # AlexNet conv3
    p = ci.plan("filter_acts", g, "tf32", ci.TILES[0])
    assert (p.m, p.n, p.k) == (384, 128 * 169, 192 * 9)
    assert p.grid == (-(-128 * 169 // 128), 3, 1) and p.splits == 1
    assert p.block == 256 and p.shared_bytes == 62208
    assert (
        p.consts["name"]
        == "conv_igemm_fwd_k3x3_s1x1_p1x1_bm128_bn128_bk16_w2x4_st3_av4_cst_tf32"
    )
    w = ci.plan("weight_acts", g, "fp32", ci.TILES[0], num_sms=132)
    assert (w.m, w.n, w.k) == (384, 192 * 9, 128 * 169)
    assert w.splits > 1 and w.grid[2] == w.splits
    assert w.k_chunk % 16 == 0
    assert (w.splits - 1) * w.k_chunk < w.k <= w.splits * w.k_chunk
    assert w.grid[0] * w.grid[1] * w.splits >= 2 * 132
    assert w.consts["name"].endswith("_3xtf32") and "wgrad" in w.consts["name"]
    d = ci.plan("image_acts", g, "tf32")
    assert (d.m, d.n, d.k) == (192, 128 * 169, 384 * 9) and d.divisors == (169, 13)


def test_plan_forced_split_k():
    wg = geom(4, 8, 9, 16, 3, 1, 1)  # K = 324: the heuristic does not split
    assert ci.plan("weight_acts", wg, "tf32", ci.TILES[3]).splits == 1
    p = ci.plan("weight_acts", wg, "tf32", ci.TILES[3], splits=3)
    assert p.splits == 3 and p.grid[2] == 3 and p.k_chunk % 32 == 0
    assert (p.splits - 1) * p.k_chunk < p.k <= p.splits * p.k_chunk
    many = ci.plan("weight_acts", wg, "tf32", ci.TILES[3], splits=50)
    assert many.splits == -(-324 // 32) and many.k_chunk == 32  # no empty slice
    assert ci.plan("filter_acts", wg, "tf32", splits=1).splits == 1
    with pytest.raises(ValueError, match="only weight_acts splits K"):
        ci.plan("filter_acts", wg, "tf32", splits=2)
    with pytest.raises(ValueError, match="splits must be >= 1"):
        ci.plan("weight_acts", wg, "tf32", splits=0)
    with pytest.raises(TypeError, match="splits must be an int"):
        ci.plan("weight_acts", wg, "tf32", splits=True)
    huge = geom(1, 2**14, 1, 2**13, 1)  # dw has 2^27 elements
    with pytest.raises(ValueError, match="workspace"):
        ci.plan("weight_acts", huge, "tf32", splits=16)


def test_plan_groups_use_grid_z():
    g = geom(4, 6, 7, 4, 3, 1, 1, groups=2)
    p = ci.plan("filter_acts", g, "fp32")
    assert p.grid[2] == 2 and (p.m, p.k) == (2, 27)
    assert p.config == ci.TILES[4]  # small M gets the bm=32 tile


def test_supports():
    g = geom(8, 64, 27, 192, 5, 1, 2)
    for op in ci.OPS:
        assert ci.supports(op, g, np.float32, "tf32")
        assert ci.supports(op, g, "float32", "fp32")
        assert not ci.supports(op, g, np.float64, "fp32")
        assert not ci.supports(op, g, np.float32, "fp16")
    assert not ci.supports("conv3d", g, np.float32, "tf32")
    huge = geom(2**16, 256, 128, 8, 3, 1, 1)  # x has 2^34 elements
    assert not ci.supports("filter_acts", huge, np.float32, "tf32")
    bad = Geom(8, 6, 9, 9, 4, 3, 3, 1, 1, 1, 1, 4, 9, 9)  # groups do not divide C
    assert not ci.supports("filter_acts", bad, np.float32, "tf32")
    wrong_out = Geom(8, 6, 9, 9, 4, 3, 3, 1, 1, 1, 1, 1, 8, 9)
    assert not ci.supports("filter_acts", wrong_out, np.float32, "tf32")


def test_variants_are_valid_tiles():
    g = geom(8, 3, 224, 64, 11, 4, 2)
    for op in ci.OPS:
        vs = ci.variants(op, g, "tf32")
        assert vs and all(v in ALL_TILES and v.valid() for v in vs)
    assert ci.TileConfig(128, 128, 16, 2, 4) in ci.variants("filter_acts", g, "tf32")
    # image_acts of conv1 has M = 3: no 128-row tiles
    assert all(v.bm <= 32 for v in ci.variants("image_acts", g, "tf32"))
    assert ci.variants("filter_acts", g, "fp16") == []


def test_kernel_names_carry_the_specialisation():
    from cc2ops.cuda.ops import load_gpu_op_modules
    from cc2ops.cuda.runtime.compile import all_variants, kernel_name

    load_gpu_op_modules()
    names = [c["name"] for f, c in all_variants() if f == "conv_igemm"]
    assert 4 <= len(names) <= 32 and len(set(names)) == len(names)
    for f, c in all_variants():
        if f == "conv_igemm":
            assert kernel_name(f, **c) == c["name"]
    assert "conv_igemm_fwd_k11x11_s4x4_p2x2_bm64_bn64_bk32_w2x2_st3_cst_tf32" in names
    # the registered variants cover both sides of every template switch
    consts = [c for f, c in all_variants() if f == "conv_igemm"]
    switches = (("AVEC", {1, 4}), ("STAGE_C", {0, 1}), ("SPLIT", {1, 3}))
    for key, values in (*switches, ("WGMMA", {0, 1})):
        assert {c[key] for c in consts} == values, key
    wg = [c for c in consts if c["WGMMA"]]
    assert {c["op"] for c in wg} == {"fwdtm", "dgradtm", "wgradtm"}
    for ops, tiles in (
        ({"fwdtm", "dgradtm"}, ci.WGMMA_TILES),
        ({"wgradtm"}, ci.WGMMA_WGRAD_TILES),
    ):
        these = [c for c in wg if c["op"] in ops]
        assert {c["STAGE_C"] for c in these} == {0, 1}
        assert {(c["BM"], c["BN"], c["STAGES"]) for c in these} == {
            (t.bm, t.bn, t.stages) for t in tiles
        }
    assert {c["AVEC"] for c in wg if c["op"] == "wgradtm"} == {1, 4}
    # channels-last B: both passes, both strides of the registered geometries
    for op in ("fwdtm", "dgradtm"):
        assert {c["BNHWC"] for c in wg if c["op"] == op} == {0, 1}, op
        assert {c["SH"] for c in wg if c["op"] == op and c["BNHWC"]} == {1, 2}, op
    assert not any(c["BNHWC"] for c in consts if c["op"] == "wgradtm")
    # stream-K: both passes, 2 and 3 warpgroups
    sk = [c for c in wg if c["STREAMK"]]
    assert {c["op"] for c in sk} == {"fwdtm", "dgradtm"}
    assert {c["BM"] for c in sk} == {128, 192}
    assert all(c["name"].endswith("_sk_tf32") for c in sk)
    assert {c["STREAMK"] for c in consts} == {0, 1}
    assert all("_wgmma" in c["name"] and c["name"].endswith("_tf32") for c in wg)
    assert {c["op"] for c in consts if c["AVEC"] == 4} == {
        "fwd",
        "wgrad",
        "fwdtm",
        "dgradtm",
        "wgradtm",
    }


# --------------------------------------------------------------------------
# CPU: the wgmma (sm_90a) tiles
# --------------------------------------------------------------------------

WG_IDS = {"ids": lambda t: t.label}
#: (stage bases of the dynamic shared memory) aligned, and 16 bytes past
SMEM_BASES = (0, 16, 1008)


def test_wgmma_tiles_are_valid_and_fit_shared_memory():
    assert len(ci.WGMMA_TILES) == len(set(ci.WGMMA_TILES))
    for t in ci.WGMMA_TILES:
        assert t.valid() and t.wgmma and t.tapmajor and "_wgmma" in t.label
        assert ("_nhwc" in t.label) == t.nhwc and t.label.endswith("_sk") == t.streamk
        assert t.threads == 128 * (t.bm // 64) and t.warp_tile == (16, t.bn)
        pipeline = 4 * t.stages * (t.bm + t.bn) * 32 + 1024
        assert t.shared_bytes("filter_acts") == max(pipeline, 4 * t.stage_c_floats())
        assert t.shared_bytes("image_acts") <= 227 * 1024  # the H200's opt-in limit
        assert t not in ci.TAP_TILES and t not in ci.TILES
    base = ci.WGMMA_TILES[0]
    for bad in (
        dataclasses.replace(base, bk=16),  # rows of 64 bytes: not the 128B swizzle
        dataclasses.replace(base, wm=4, wn=2),  # a warpgroup owns all columns
        dataclasses.replace(base, stages=2),  # a wgmma group stays in flight
        dataclasses.replace(base, tapmajor=False),
        dataclasses.replace(base, vec=False),
        dataclasses.replace(base, bn=512),  # n <= 256
        dataclasses.replace(base, bm=96, wm=6),  # 64-row warpgroups
    ):
        assert not bad.valid(), bad
    g = geom(2, 64, 9, 64, 3, 1, 1)
    with pytest.raises(ValueError, match="runs TF32 with 16-byte A copies only"):
        ci.plan("filter_acts", g, "fp32", base)
    with pytest.raises(ValueError, match="breaks the template's rules"):
        ci.plan("filter_acts", g, "tf32", dataclasses.replace(base, stages=2))
    p = ci.plan("image_acts", g, "tf32", base)
    assert p.consts["WGMMA"] == 1 and p.consts["op"] == "dgradtm"
    assert p.block == 256 and p.shared_bytes == base.shared_bytes("image_acts")


@pytest.mark.parametrize("config", ci.WGMMA_TILES, **WG_IDS)
def test_wgmma_copies_cover_each_tile_once_free_of_bank_conflicts(config):
    threads = config.threads
    for operand, rows in (("A", config.bm), ("B", config.bn)):
        r, k = tw.wgmma_load_map(config, operand)
        assert r.shape[0] == threads and r.min() >= 0 and r.max() < rows
        flat = np.sort((r * 32 + k).ravel())
        np.testing.assert_array_equal(flat, np.arange(rows * 32), err_msg=operand)
        off = tw.wgmma_smem_offset(r, k)
        np.testing.assert_array_equal(np.sort(off.ravel()), 4 * np.arange(rows * 32))
        for warp in range(threads // 32):
            lanes = slice(32 * warp, 32 * warp + 32)
            if operand == "A" or config.nhwc:
                # 16-byte vectors: 8 lanes per 128-byte wavefront
                rv, kv = r[lanes].reshape(32, -1, 4), k[lanes].reshape(32, -1, 4)
                assert (rv == rv[..., :1]).all()
                assert (kv == kv[..., :1] + np.arange(4)).all()
                assert (kv[..., 0] % 4 == 0).all()
                for e in range(rv.shape[1]):
                    chunks = tw.wgmma_smem_offset(rv[:, e, 0], kv[:, e, 0]) // 16
                    for q in range(4):
                        assert len(set(chunks[8 * q : 8 * q + 8] % 8)) == 8
            else:  # B: a column per thread, 32 lanes on 32 banks per copy
                assert (r[lanes] == r[lanes][:, :1]).all()
                for e in range(r.shape[1]):
                    banks = tw.wgmma_smem_offset(r[lanes, e], k[lanes, e]) // 4 % 32
                    assert len(set(banks)) == 32, (warp, e)


def test_gmma_descriptor_encoding():
    # start address 0x12340 >> 4 in bits 0-13, LBO 16 >> 4 in 16-29, SBO
    # 1024 >> 4 in 32-45, base offset bits 49-51, layout 1 (128B) in 62-63
    d = tw.gmma_descriptor(0x12340)
    assert d == 0x1234 | 1 << 16 | 64 << 32 | 1 << 62
    assert tw.gmma_descriptor(0x12340 + 2**18) == d  # the address modulo 2^18
    assert tw.gmma_descriptor(0, lbo=256, sbo=16, layout=3, base_offset=5) == (
        16 << 16 | 1 << 32 | 5 << 49 | 3 << 62
    )
    assert tw.gmma_descriptor(0x400) + 2 == tw.gmma_descriptor(0x420)  # a k8 step
    with pytest.raises(ValueError, match="sbo must be"):
        tw.gmma_descriptor(0, sbo=1000)
    with pytest.raises(ValueError, match="out of range"):
        tw.gmma_descriptor(8)
    # the no-swizzle layout: core matrices of 8 rows x 16 bytes
    d0 = tw.gmma_descriptor(0, lbo=128, sbo=256, layout=0)
    got = tw.gmma_address(d0, np.array([0, 1, 7, 8, 9]), np.array([0, 1, 4, 5, 7]))
    np.testing.assert_array_equal(
        got, [0, 20, 112 + 128, 256 + 128 + 4, 256 + 16 + 140]
    )
    with pytest.raises(ValueError, match="base offset 0"):
        tw.gmma_address(d | 1 << 49, 0, 0)
    with pytest.raises(ValueError, match="k must be in"):
        tw.gmma_address(d, 0, 8)


@pytest.mark.parametrize("config", ci.WGMMA_TILES, **WG_IDS)
def test_descriptors_find_every_element_where_the_copies_wrote_it(config):
    """The main guard against a layout bug: for every stage, warpgroup and k8
    step, the address at which the descriptor the kernel builds makes the
    tensor cores read (row, k) is where the copies wrote (row, k)."""
    a_bytes, b_bytes = (4 * f for f in config.smem_floats("filter_acts"))
    j = np.arange(8)[None, :]
    for base in SMEM_BASES:
        smem0 = (base + 1023) & ~1023  # the kernel's smem0
        assert smem0 % 1024 == 0 and smem0 - base < 1024
        for stage in range(config.stages):
            a_st = smem0 + stage * (a_bytes + b_bytes)
            b_st = a_st + a_bytes
            assert b_st + b_bytes <= base + config.shared_bytes("filter_acts")
            for kk in range(4):
                for wg in range(config.bm // 64):
                    rows = np.arange(64)[:, None]
                    start = a_st + wg * 64 * 128 + kk * 32
                    got = tw.gmma_address(tw.gmma_descriptor(start), rows, j)
                    want = a_st + tw.wgmma_smem_offset(64 * wg + rows, 8 * kk + j)
                    np.testing.assert_array_equal(got, want)
                rows = np.arange(config.bn)[:, None]
                got = tw.gmma_address(tw.gmma_descriptor(b_st + kk * 32), rows, j)
                want = b_st + tw.wgmma_smem_offset(rows, 8 * kk + j)
                np.testing.assert_array_equal(got, want)
    # the check has teeth: without the swizzle, or with the stages not
    # 1024-byte aligned, the descriptors would find other elements
    rows = np.arange(64)[:, None]
    want = tw.wgmma_smem_offset(rows, j)
    unswizzled = tw.gmma_descriptor(0, lbo=16, sbo=1024, layout=0)
    assert (tw.gmma_address(unswizzled, rows, j) != want).any()
    shifted = tw.gmma_address(tw.gmma_descriptor(512), rows, j) - 512
    assert (shifted != want).any()


def test_wgmma_accumulator_map_is_the_epilogue_fragment_layout():
    for config in ci.WGMMA_TILES:
        for wg in range(config.bm // 64):
            seen = np.zeros((64, config.bn), np.int64)
            for warp in range(4):
                for lane in range(32):
                    acc = tw.wgmma_accumulator_map(lane, warp, config.bn)
                    np.add.at(seen, (acc[..., 0], acc[..., 1]), 1)
                    frag = tw.fragment_map(config, "filter_acts", (lane, 4 * wg + warp))
                    np.testing.assert_array_equal(
                        frag["c_mn"][0], acc + np.array([64 * wg, 0])
                    )
            assert (seen == 1).all()


@pytest.mark.parametrize("config", ci.WGMMA_TILES, **WG_IDS)
def test_emulated_wgmma_block_reproduces_the_product(config):
    r = np.random.default_rng(5)
    a = r.standard_normal((config.bm, 32))
    b = r.standard_normal((32, config.bn))
    for base, stage in ((0, None), (16, 0), (1008, 1)):
        got = tw.emulate_wgmma_block(config, a, b, base=base, stage=stage)
        np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="not a valid wgmma tile"):
        tw.emulate_wgmma_block(ci.TAP_TILES[1], a, b)


@pytest.mark.parametrize(
    "tiles, kt, grid",
    [(1, 1, 1), (1, 9, 4), (3, 7, 2), (5, 3, 15), (338, 108, 132), (13, 5, 12),
     (7, 1, 5), (4, 6, 5)],
)  # fmt: skip
def test_streamk_schedule_covers_every_iteration_once(tiles, kt, grid):
    total = tiles * kt
    items = tw.streamk_items(tiles, kt, grid)
    assert len(items) == grid and all(items)  # every block runs something
    seen = np.zeros((tiles, kt), dtype=np.int64)
    where = {}  # (tile, block) -> (lo, hi, slot)
    for b, mine in enumerate(items):
        lo_it = total * b // grid
        assert mine[0][1] == lo_it % kt and mine[0][3] == 0
        assert all(slot == 1 for *_, slot in mine[1:])
        # only the first and the last item may be segments of a tile
        for _tile, lo, hi, _slot in mine[1:-1]:
            assert (lo, hi) == (0, kt)
        for tile, lo, hi, slot in mine:
            seen[tile, lo:hi] += 1
            where[tile, b] = (lo, hi, slot)
            blocks = tw.streamk_block_of(np.arange(tile * kt + lo, tile * kt + hi),
                                         total, grid)  # fmt: skip
            assert (blocks == b).all()
    assert (seen == 1).all()
    for tile in range(tiles):
        segs = tw.streamk_segments(tile, kt, total, grid)
        blocks = [b for t, b in where if t == tile]
        assert [b for b, _ in segs] == sorted(blocks)
        los = [where[tile, b][0] for b, _ in segs]
        assert los == sorted(los) and los[0] == 0
        for b, slot in segs:
            if len(segs) > 1:
                assert where[tile, b][2] == slot
    for bad in (0, total + 1):
        with pytest.raises(ValueError, match="stream-K grid"):
            tw.streamk_items(tiles, kt, bad)
    assert ci.streamk_grid(total, 10**9) == total
    assert ci.streamk_grid(total, 3) == min(3, total)


def test_streamk_plan_and_rules(monkeypatch):
    g = geom(128, 384, 13, 256, 3, 1, 1)  # AlexNet conv4
    sk = next(t for t in ci.WGMMA_TILES if t.streamk and (t.bm, t.bn) == (128, 128))
    p = ci.plan("filter_acts", g, "tf32", sk, num_sms=132)
    # 2 x 169 tiles of 108 k tiles: one wave of 132 blocks (one per SM)
    assert p.streamk == (2, 169, 108) and p.grid == (132, 1, 1)
    assert p.consts["STREAMK"] == 1 and p.consts["name"].endswith("_nhwc_sk_tf32")
    monkeypatch.setattr(ci, "STREAMK_GRID", 7)
    assert ci.plan("image_acts", g, "tf32", sk).grid == (7, 1, 1)
    tiny = geom(1, 32, 2, 32, 1)  # one tile of one k tile: one block
    assert ci.plan("filter_acts", tiny, "tf32", sk).grid == (1, 1, 1)
    with pytest.raises(ValueError, match="not weight_acts"):
        ci.plan("weight_acts", g, "tf32", dataclasses.replace(
            ci.WGMMA_WGRAD_TILES[0], streamk=True))  # fmt: skip
    assert not dataclasses.replace(ci.TAP_TILES[0], streamk=True).valid()
    assert gconv_name(sk).endswith("_nhwc_sk")


def gconv_name(config):
    from cc2ops.cuda.ops.conv import ops as gconv

    return gconv.Igemm(config).name


def test_channels_last_tiles_rules():
    """nhwc: wgmma tiles of filter_acts and image_acts only; b_offset's
    nhwc offsets index the channels-last copy (emulate reads through them)."""
    nh = [t for t in ci.WGMMA_TILES if t.nhwc]
    assert {(t.bm, t.bn, t.stages) for t in nh} == {
        (t.bm, t.bn, t.stages) for t in ci.WGMMA_TILES if not t.nhwc
    }
    assert not dataclasses.replace(ci.TAP_TILES[0], nhwc=True).valid()
    g = geom(3, 64, (5, 6), 64, 3, 1, 1)
    with pytest.raises(ValueError, match="not weight_acts"):
        ci.plan("weight_acts", g, "tf32", dataclasses.replace(
            ci.WGMMA_WGRAD_TILES[0], nhwc=True))  # fmt: skip
    with pytest.raises(ValueError, match="nhwc applies to filter_acts"):
        tw.b_offset("weight_acts", g, 0, np.arange(4), np.arange(4), nhwc=True)
    assert ci.plan("image_acts", g, "tf32", nh[0]).consts["BNHWC"] == 1
    assert (
        ci.plan("image_acts", g, "tf32", nh[0])
        .consts["name"]
        .endswith("_wgmma_nhwc_tf32")
    )
    x = np.arange(3 * 64 * 30, dtype=np.float64).reshape(3, 64, 5, 6)
    xh = tw.channels_last(x)
    k = np.arange(64)[:, None]  # tap-major k of tap 0: the channels
    n = np.arange(90)[None, :]
    off, ok = tw.b_offset("filter_acts", g, 0, k, n, tapmajor=True, nhwc=True)
    ref, ref_ok = tw.b_offset("filter_acts", g, 0, k, n, tapmajor=True)
    np.testing.assert_array_equal(ok, ref_ok)
    np.testing.assert_array_equal(xh.ravel()[off[ok]], x.ravel()[ref[ok]])


@pytest.mark.parametrize("op", ["filter_acts", "image_acts"])
@pytest.mark.parametrize("label", list(TAP_SHAPES))
def test_emulated_wgmma_index_maps_match_the_references(op, label):
    g = geom(*TAP_SHAPES[label])
    x, w, dy = tensors(g, dtype=np.float64)
    want = reference(op, g, x, w, dy)
    for config in (t for t in ci.WGMMA_TILES if ci.tapmajor_ok(op, g, t)):
        got = tw.emulate(op, g, *operands(op, x, w, dy), config=config)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-11, err_msg=label)


# the tap-major wgmma weight gradient (op "wgradtm")

WGRAD_IDS = {"ids": lambda t: t.label}


def test_wgmma_wgrad_tiles_are_valid_and_fit_shared_memory():
    assert len(ci.WGMMA_WGRAD_TILES) == len(set(ci.WGMMA_WGRAD_TILES))
    for t in ci.WGMMA_WGRAD_TILES:
        assert t.valid_wgrad() and t.wgmma and t.tapmajor
        assert t.shared_bytes("weight_acts") == t.shared_bytes(
            "filter_acts"
        )  # no table
        assert t.shared_bytes("weight_acts") <= 227 * 1024
    assert not ci.TAP_TILES[0].valid_wgrad()  # mma.sync tiles have no tap-major wgrad
    g = geom(2, 5, 7, 3, 3, 1, 1)  # any channel count
    base = ci.WGMMA_WGRAD_TILES[0]
    assert ci.tapmajor_ok("weight_acts", g, base)
    assert not ci.tapmajor_ok("weight_acts", g, ci.TAP_TILES[1])
    with pytest.raises(ValueError, match="runs TF32 only"):
        ci.plan("weight_acts", g, "fp32", base)
    p = ci.plan("weight_acts", g, "tf32", base)
    assert p.consts["op"] == "wgradtm" and p.consts["WGMMA"] == 1
    assert p.consts["AVEC"] == 4  # decided per vector by the kernel
    assert ci.plan("weight_acts", g, "tf32", base, aligned=False).consts["AVEC"] == 1
    assert "_wgradtm_" in p.consts["name"] and p.consts["name"].endswith("_wgmma_tf32")


def test_plan_wgmma_wgrad_grid_and_split_k():
    """A block per (channel tile, filter tile, tap, group, slice); the split
    fills about two waves of resident blocks, slices of whole k tiles."""
    for b in (32, 64, 128):
        for layer in ("conv2", "conv3", "conv4", "conv5"):
            g = geom(b, *ALEXNET[layer][1:])
            for t in ci.WGMMA_WGRAD_TILES:
                p = ci.plan("weight_acts", g, "tf32", t, num_sms=132)
                taps = g.kh * g.kw
                assert (p.m, p.n, p.k) == (g.filters, g.channels, b * g.out_h**2)
                assert p.grid == (-(-p.n // t.bn), -(-p.m // t.bm), taps * p.splits)
                assert p.k_chunk % 32 == 0 and p.k_chunk >= 8 * 32
                assert (p.splits - 1) * p.k_chunk < p.k <= p.splits * p.k_chunk
                resident = 132 * ci._blocks_per_sm(t, "weight_acts")
                blocks = math.prod(p.grid)
                assert (
                    2 * resident <= blocks < 2 * resident + p.grid[0] * p.grid[1] * taps
                )
    g = geom(2, 64, 9, 64, 3, 1, 1, groups=2)
    p = ci.plan("weight_acts", g, "tf32", ci.WGMMA_WGRAD_TILES[3], splits=3)
    assert p.splits == 3 and p.grid == (1, 1, 2 * 9 * 3) and p.k_chunk == 64
    assert ci.plan("weight_acts", g, "tf32", ci.WGMMA_WGRAD_TILES[3]).splits == 1
    with pytest.raises(ValueError, match="grid's z limit"):
        ci.plan("weight_acts", g, "tf32", ci.WGMMA_WGRAD_TILES[3], splits=4000)


@pytest.mark.parametrize("config", ci.WGMMA_WGRAD_TILES, **WGRAD_IDS)
def test_wgmma_wgrad_copies_cover_each_tile_once_free_of_bank_conflicts(config):
    threads = config.threads
    for operand, rows in (("A", config.bm), ("B", config.bn)):
        r, k = tw.wgmma_load_map(config, operand, "weight_acts")
        flat = np.sort((r * 32 + k).ravel())
        np.testing.assert_array_equal(flat, np.arange(rows * 32), err_msg=operand)
        # a thread's 4 copies of a row are one 16-byte chunk (A's vector)
        rv, kv = r.reshape(threads, -1, 4), k.reshape(threads, -1, 4)
        assert (rv == rv[..., :1]).all()
        np.testing.assert_array_equal(
            np.sort(kv, axis=-1) % 4, np.tile(np.arange(4), kv.shape[:2] + (1,))
        )
        assert (kv // 4 == (np.arange(threads) % 8)[:, None, None]).all()
        for warp in range(threads // 32):
            lanes = slice(32 * warp, 32 * warp + 32)
            for c in range(r.shape[1]):
                banks = tw.wgmma_smem_offset(r[lanes, c], k[lanes, c]) // 4 % 32
                assert len(set(banks)) == 32, (operand, warp, c)


@pytest.mark.parametrize("config", ci.WGMMA_WGRAD_TILES, **WGRAD_IDS)
def test_emulated_wgmma_wgrad_block_reproduces_the_product(config):
    r = np.random.default_rng(7)
    a = r.standard_normal((config.bm, 32))
    b = r.standard_normal((32, config.bn))
    for base, stage in ((0, None), (16, 0), (1008, 2)):
        got = tw.emulate_wgmma_block(config, a, b, base, stage, op="weight_acts")
        np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)


#: The wgmma weight-gradient sweep (b, c, hw, f, khw, stride, pad, groups):
#: SHAPES (odd counts, strides 2-4, groups, rectangles), 16-byte dy runs
#: (Ho*Wo % 4 == 0 and not), several k tiles and images per tile.
WGRAD_SHAPES = dict(
    SHAPES,
    **{
        "b5 c3 f70 5x5 p2 (Ho*Wo 36)": (5, 3, 6, 70, 5, 1, 2, 1),
        "b3 c66 f5 3x3 p1 (Ho*Wo 81)": (3, 66, 9, 5, 3, 1, 1, 1),
        "b2 c4 f6 1x1 (Ho*Wo 2: runs across images)": (2, 4, (1, 2), 6, 1, 1, 0, 1),
        "b7 c8 f9 g2 3x2 s(1,2)": (7, 8, (8, 11), 10, (3, 2), (1, 2), 1, 2),
    },
)


@pytest.mark.parametrize("label", list(WGRAD_SHAPES))
def test_emulated_wgmma_wgrad_index_maps_match_the_reference(label):
    """The copies' global addresses (A: dy, 16-byte runs at the 4-byte
    copies' addresses; B: x, zero outside the image), the split-K slice
    bounds, the taps and the stores reproduce dW (float64)."""
    g = geom(*WGRAD_SHAPES[label])
    x, w, dy = tensors(g, dtype=np.float64)
    want = reference("weight_acts", g, x, w, dy)
    for i, config in enumerate(ci.WGMMA_WGRAD_TILES[1:]):
        for splits in (1, 3) if i == 0 else (None,):
            got = tw.emulate("weight_acts", g, dy, x, config=config, splits=splits)
            assert got.shape == want.shape, label
            np.testing.assert_allclose(
                got, want, rtol=1e-12, atol=1e-11, err_msg=f"{label} {config.label}"
            )
    got = tw.emulate_wgrad_wgmma(
        g, dy, x, config=ci.WGMMA_WGRAD_TILES[3], aligned=False
    )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-11, err_msg=label)


def test_wgmma_wgrad_copies_take_16_byte_runs_where_exact():
    g = geom(3, 8, 8, 12, 3, 1, 1)  # Ho*Wo = 64: every run aligned
    t = ci.WGMMA_WGRAD_TILES[3]
    cp = tw.wgrad_copies(t, g, 0, 4, 0, 0, 32, 3 * 64)
    rows = np.arange(t.threads)[:, None] // 8 + 16 * np.arange(4)[None, :]
    np.testing.assert_array_equal(cp["a"]["vec"], rows < 12)  # M = 12 filters
    assert not tw.wgrad_copies(t, g, 0, 4, 0, 0, 32, 3 * 64, aligned=False)["a"][
        "vec"
    ].any()
    g = geom(2, 8, 13, 16, 3, 1, 1)  # Ho*Wo = 169: rows alternate alignment
    cp = tw.wgrad_copies(t, g, 0, 0, 0, 0, 160, 2 * 169)
    vec = cp["a"]["vec"]
    assert 0 < vec.sum() < vec.size
    np.testing.assert_array_equal(cp["a"]["vec_off"][vec] % 4, 0)
    # the run 164..167 crosses no image; 168..171 does (k = 169 starts image 1)
    tid = np.arange(t.threads)
    assert not vec[tid % 8 == 2].any()


def _trunc_tf32(x: np.ndarray) -> np.ndarray:
    """What wgmma does to an fp32 operand: the low 13 mantissa bits dropped."""
    u = np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return u.view(np.float32)


def test_wgmma_tf32_error_model():
    """Weights rounded once (the wperm kernel), activations truncated by the
    tensor cores: the error stays well inside the TF32 tolerance and is
    below that of truncating both."""
    r = np.random.default_rng(6)
    for big_k in (576, 3456):
        a = r.standard_normal((64, big_k)).astype(np.float32)
        b = r.standard_normal((big_k, 64)).astype(np.float32)
        want = np.float64(a) @ np.float64(b)
        rounded = np.float64(_tf32(a)) @ np.float64(_trunc_tf32(b))
        both = np.float64(_trunc_tf32(a)) @ np.float64(_trunc_tf32(b))
        assert 1e-5 < rel_err(rounded, want) < 1.5e-3 < TOL["tf32"] / 3
        assert rel_err(rounded, want) < rel_err(both, want)


def _fake_device(capability):
    return SimpleNamespace(
        compute_capability=capability,
        arch=f"sm_{capability[0]}{capability[1]}",
        index=0,
        multiprocessors=132,
        name="fake",
    )


def test_wgmma_tiles_are_offered_on_compute_capability_9_0_only(monkeypatch):
    from cc2ops.cuda.ops.conv import ops as gconv
    from cc2ops.cuda.runtime import device as cdevice
    from cc2ops.cuda.runtime.compile import kernel_arch

    g = geom(8, 192, 13, 384, 3, 1, 1)  # AlexNet conv3
    for op in ("filter_acts", "image_acts"):
        base = ci.variants(op, g, "tf32")
        assert not any(t.wgmma for t in base)
        for cap in ((8, 0), (8, 9), (9, 1), (10, 0), (12, 0)):
            assert ci.variants(op, g, "tf32", cap) == base, cap
        on_h = ci.variants(op, g, "tf32", (9, 0))
        assert on_h == base + list(ci.WGMMA_TILES)
        assert not any(t.wgmma for t in ci.variants(op, g, "fp32", (9, 0)))
    wgrad = ci.variants("weight_acts", g, "tf32", (9, 0))
    assert [t for t in wgrad if t.wgmma] == list(ci.WGMMA_WGRAD_TILES)
    assert wgrad[: -len(ci.WGMMA_WGRAD_TILES)] == ci.variants("weight_acts", g, "tf32")
    assert not any(t.wgmma for t in ci.variants("weight_acts", g, "fp32", (9, 0)))
    assert not any(t.wgmma for t in ci.variants("weight_acts", g, "tf32", (8, 0)))
    small_m = geom(4, 32, 9, 32, 3, 1, 1)  # M = 32: 64-row tiles at most
    assert {t.bm for t in ci.variants("filter_acts", small_m, "tf32", (9, 0))
            if t.wgmma} == {64}  # fmt: skip
    # through the conv ops' candidate list, with a mocked device
    for cap, want in (((9, 0), True), ((8, 0), False), ((10, 0), False)):
        monkeypatch.setattr(cdevice, "get_device", lambda d, cap=cap: _fake_device(cap))
        names = gconv.algorithm_names("image_acts", g, np.float32, "tf32", device=0)
        assert any(n.endswith("_wgmma") for n in names) == want, cap
        assert len(set(names)) == len(names)
        specs = gconv.kernel_specs("filter_acts", g, np.float32, "tf32", device=0)
        arches = {kernel_arch(s.family, "sm_90", **s.consts) for s in specs}
        assert ("sm_90a" in arches) == want, cap
        if not want:
            with pytest.raises(ValueError, match="needs compute capability 9.0"):
                ci._recipe("filter_acts", g, "tf32", 0, ci.WGMMA_TILES[0], None, True)
    # no device given: no CUDA touched, the portable candidates only
    monkeypatch.setattr(cdevice, "get_device", None)
    names = gconv.algorithm_names("image_acts", g, np.float32, "tf32")
    assert names and not any(n.endswith("_wgmma") for n in names)


def test_wgmma_kernels_compile_for_sm_90a(tmp_path, monkeypatch):
    from cc2ops.cuda.runtime.compile import (
        KernelCompileError,
        compile_cubin,
        kernel_arch,
        render,
    )

    needs_nvcc()
    monkeypatch.setenv("CC2OPS_CACHE_DIR", str(tmp_path))
    g = geom(3, 64, (9, 7), 96, (3, 2), 2, 1)
    for i, t in enumerate(ci.WGMMA_TILES):
        op = ("filter_acts", "image_acts")[i % 2]
        consts = ci.plan(op, g, "tf32", t).consts
        assert kernel_arch("conv_igemm", "sm_90", **consts) == "sm_90a"
        source = render("conv_igemm", **consts)
        assert f"wgmma.mma_async.sync.aligned.m64n{t.bn}k8.f32.tf32.tf32" in source
        assert f'extern "C" __global__ void {consts["name"]}_wperm(' in source
        assert compile_cubin(source, "sm_90a")[:4] == b"\x7fELF"
    with pytest.raises(KernelCompileError, match="not supported on .target 'sm_90'"):
        compile_cubin(source, "sm_90")


#: Prints the C helpers' copy maps, swizzle and descriptors (THREADS,
#: A_COPIES and B_LINE, B's copy loop, are replaced by the tile's).
_HARNESS = r"""
#include <cstdio>
int main()
{
    for (int t = 0; t < THREADS; ++t) {
        printf("A %d", wgmma_a_k(t));
        for (int e = 0; e < A_COPIES; ++e) printf(" %d", wgmma_a_row(t, e));
        B_LINE
        printf("\n");
    }
    for (int r = 0; r < 256; ++r)
        for (int k = 0; k < 32; ++k) printf("S %u\n", sw128_offset(r, k));
    for (unsigned a = 0; a < (1u << 18) + 4096; a += 1008)
        printf("D %u %llu\n", a & ~15u, gmma_desc_sw128(a & ~15u));
    return 0;
}
"""


def _run_host_harness(nvcc: str, tmp_path, source: str):
    """Build ``source`` (a rendered kernel module plus a ``main``) for sm_90a
    and run it on the CPU: the kernel's ``__host__ __device__`` helpers, with
    no GPU. Returns the finished process (stdout holds what main printed)."""
    (tmp_path / "harness.cu").write_text(source)
    build = subprocess.run(
        [nvcc, "-gencode", "arch=compute_90a,code=sm_90a", "-std=c++17", "-o",
         str(tmp_path / "harness"), str(tmp_path / "harness.cu")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(tmp_path / "harness")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run


@pytest.mark.parametrize(
    "config",
    {(t.bm, t.bn, t.nhwc): t for t in ci.WGMMA_TILES}.values(),  # distinct maps
    **WG_IDS,
)
def test_wgmma_c_helpers_compute_the_numpy_spec(config, tmp_path):
    """The copy maps, swizzle and descriptor of the rendered kernel (its
    __host__ __device__ helpers, run on the CPU) against the numpy spec."""
    from cc2ops.cuda.runtime.compile import render

    nvcc = needs_nvcc()
    g = geom(2, 64, 9, 64, 3, 1, 1)
    source = render("conv_igemm", **ci.plan("filter_acts", g, "tf32", config).consts)
    harness = _HARNESS.replace("THREADS", str(config.threads))
    harness = harness.replace("A_COPIES", str(config.bm * 8 // config.threads))
    if config.nhwc:  # B's rows copied as A's: wgmma_a_row / wgmma_a_k, bn rows
        b_line = (
            'printf("\\nB %d", wgmma_a_k(t));\n'
            f"        for (int e = 0; e < {config.bn * 8 // config.threads}; ++e)"
            ' printf(" %d", wgmma_a_row(t, e));'
        )
    else:
        copies = 4 // (config.threads // config.bn)
        b_line = (
            'printf("\\nB %d", wgmma_b_col(t));\n'
            "        for (int c = 0; c < 8; ++c)\n"
            f"            for (int s = 0; s < {copies}; ++s)"
            ' printf(" %d", wgmma_b_k(t, c, s));'
        )
    harness = harness.replace("B_LINE", b_line)
    run = _run_host_harness(nvcc, tmp_path, source + harness)
    lines = [ln.split() for ln in run.stdout.splitlines()]
    ra, ka = tw.wgmma_load_map(config, "A")
    rb, kb = tw.wgmma_load_map(config, "B")
    a_rows = np.array([[int(v) for v in ln[1:]] for ln in lines if ln[0] == "A"])
    b_rows = np.array([[int(v) for v in ln[1:]] for ln in lines if ln[0] == "B"])
    np.testing.assert_array_equal(a_rows[:, 0], ka[:, 0])  # the vector's first k
    np.testing.assert_array_equal(a_rows[:, 1:], ra[:, ::4])
    if config.nhwc:
        np.testing.assert_array_equal(b_rows[:, 0], kb[:, 0])
        np.testing.assert_array_equal(b_rows[:, 1:], rb[:, ::4])
    else:
        np.testing.assert_array_equal(b_rows[:, 0], rb[:, 0])
        np.testing.assert_array_equal(b_rows[:, 1:], kb)
    s = np.array([int(ln[1]) for ln in lines if ln[0] == "S"]).reshape(256, 32)
    r, k = np.meshgrid(np.arange(256), np.arange(32), indexing="ij")
    np.testing.assert_array_equal(s, tw.wgmma_smem_offset(r, k))
    descs = [(int(ln[1]), int(ln[2])) for ln in lines if ln[0] == "D"]
    assert len(descs) > 200
    for addr, desc in descs:
        assert desc == tw.gmma_descriptor(addr), addr


def test_wgmma_wgrad_c_helpers_compute_the_numpy_spec(tmp_path):
    """wgradtm's copy map in the rendered kernel (wgmma_a_row, wgmma_a_k,
    wgmma_wgrad_k, run on the CPU) against :func:`tw.wgmma_load_map`."""
    from cc2ops.cuda.runtime.compile import render

    nvcc = needs_nvcc()
    config = ci.WGMMA_WGRAD_TILES[1]  # 256 threads, bm 128, bn 64
    g = geom(2, 64, 9, 64, 3, 1, 1)
    source = render("conv_igemm", **ci.plan("weight_acts", g, "tf32", config).consts)
    harness = f"""
#include <cstdio>
int main()
{{
    for (int t = 0; t < {config.threads}; ++t)
        for (int e = 0; e < {config.bm * 8 // config.threads}; ++e)
            for (int s = 0; s < 4; ++s)
                printf("%d %d %d\\n", wgmma_a_row(t, e), wgmma_wgrad_k(t, s),
                       wgmma_a_k(t));
    return 0;
}}
"""
    run = _run_host_harness(nvcc, tmp_path, source + harness)
    got = np.array([[int(v) for v in ln.split()] for ln in run.stdout.splitlines()])
    r, k = tw.wgmma_load_map(config, "A", "weight_acts")
    np.testing.assert_array_equal(got[:, 0], r.ravel())
    np.testing.assert_array_equal(got[:, 1], k.ravel())
    np.testing.assert_array_equal(got[:, 2], (k.ravel() // 4) * 4)


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------

RUN = {"filter_acts": ci.filter_acts, "image_acts": ci.image_acts}
RUN["weight_acts"] = ci.weight_acts
TOL = {"tf32": 5e-3, "fp32": 1e-5}


def _to_gpu_misaligned(a):
    """A C-contiguous GPU copy of ``a`` whose first element is 4 bytes past a
    16-byte boundary (a view into a larger allocation)."""
    from cc2ops.cuda.runtime import array as garray

    flat = np.zeros(a.size + 1, np.float32)
    flat[1:] = a.ravel()
    view = garray.to_gpu(flat, 0)[1:].reshape(a.shape)
    assert garray.ptr(view) % 16 == 4
    return view


def run_gpu(op, g, precision, config=None, seed=0, splits=None, misaligned=False):
    from cc2ops.cuda.runtime import array as garray

    x, w, dy = tensors(g, seed)
    args = {
        "filter_acts": (x, w),
        "image_acts": (dy, w),
        "weight_acts": (x, dy),
    }[op]
    out_shape = reference(op, g, x, w, dy).shape
    out = garray.empty(out_shape, np.float32, 0)
    assert np.isnan(garray.to_host(out)).all()  # poisoned
    kw = {"config": config} if splits is None else {"config": config, "splits": splits}
    up = _to_gpu_misaligned if misaligned else (lambda t: garray.to_gpu(t, 0))
    RUN[op](*(up(a) for a in args), out, g, precision, 0, **kw)
    got = garray.to_host(out)
    return got, reference(op, g, x, w, dy)


def check(op, g, precision, config=None, label="", splits=None, misaligned=False):
    got, want = run_gpu(op, g, precision, config, splits=splits, misaligned=misaligned)
    assert got.shape == want.shape and got.dtype == np.float32, label
    assert np.isfinite(got).all(), f"{label} {op} {precision}: unwritten outputs"
    err = rel_err(got, want)
    assert err < TOL[precision], f"{label} {op} {precision} {config}: rel err {err}"
    return err


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ci.PRECISIONS)
@pytest.mark.parametrize("op", ci.OPS)
@pytest.mark.parametrize("label", list(SHAPES))
def test_gpu_odd_shapes(op, label, precision, debug):
    check(op, geom(*SHAPES[label]), precision, label=label)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ci.PRECISIONS)
@pytest.mark.parametrize("op", ci.OPS)
@pytest.mark.parametrize("config", ci.TILES, ids=lambda t: t.label)
def test_gpu_every_tile(op, config, precision, debug):
    # batch 129, 70 filters: partial tiles along every GEMM axis; K = 36 and
    # Ho*Wo = 108, so filter_acts and weight_acts take the 16-byte copies
    g = geom(129, 4, (12, 9), 70, 3, 1, 1)
    assert ci.plan(op, g, precision, config).consts["AVEC"] == (
        1 if op == "image_acts" else 4
    )
    check(op, g, precision, config, label="b129 c4 f70")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ci.OPS)
def test_gpu_channels_64_groups_2(op, debug):
    g = geom(3, 64, 9, 32, 3, 2, 1, groups=2)
    for precision in ci.PRECISIONS:
        check(op, g, precision, label="c64 g2 s2")


ALEXNET = {
    "conv1": (8, 3, 224, 64, 11, 4, 2),
    "conv2": (8, 64, 27, 192, 5, 1, 2),
    "conv3": (8, 192, 13, 384, 3, 1, 1),
    "conv4": (8, 384, 13, 256, 3, 1, 1),
    "conv5": (8, 256, 13, 256, 3, 1, 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ci.PRECISIONS)
@pytest.mark.parametrize("op", ci.OPS)
@pytest.mark.parametrize("layer", list(ALEXNET))
def test_gpu_alexnet_layers(layer, op, precision, debug):
    g = geom(*ALEXNET[layer])
    err = check(op, g, precision, label=layer)
    if precision == "tf32" and op == "filter_acts" and layer != "conv1":
        assert err > 1e-6, f"{layer}: tf32 error {err} looks like fp32 (TF32 unused?)"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ci.PRECISIONS)
@pytest.mark.parametrize("op", ["filter_acts", "image_acts"])
@pytest.mark.parametrize("config", ci.TAP_TILES, ids=lambda t: t.label)
def test_gpu_every_tapmajor_tile(op, config, precision, debug):
    # batch 33, 96 filters of 64 channels: partial tiles along M and N
    g = geom(33, 64, (9, 7), 96, 3, 1, 1)
    assert ci.tapmajor_ok(op, g, config)
    check(op, g, precision, config, label="tap-major b33 c64 f96")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ci.PRECISIONS)
@pytest.mark.parametrize("op", ["filter_acts", "image_acts"])
@pytest.mark.parametrize("label", list(TAP_SHAPES))
def test_gpu_tapmajor_shapes(op, label, precision, debug):
    g = geom(*TAP_SHAPES[label])
    for config in (t for t in ci.TAP_TILES if ci.tapmajor_ok(op, g, t)):
        check(op, g, precision, config, label=label)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["filter_acts", "image_acts"])
@pytest.mark.parametrize("layer", list(ALEXNET))
def test_gpu_alexnet_layers_tapmajor(layer, op, debug):
    g = geom(*ALEXNET[layer])
    tiles = [t for t in ci.TAP_TILES if ci.tapmajor_ok(op, g, t)]
    if not tiles:  # conv1's forward: 3 channels
        assert layer == "conv1" and op == "filter_acts"
        return
    for precision in ci.PRECISIONS:
        err = check(op, g, precision, tiles[0], label=f"{layer} tap-major")
        if precision == "tf32":
            assert err > 1e-6, f"{layer}: tf32 error {err} looks like fp32"


@pytest.mark.gpu
def test_conv_igemm_tapmajor_sanitize(debug):
    """Tap-major kernels and their weight permutation (compute-sanitizer)."""
    g = geom(3, 32, (7, 6), 32, (3, 2), 1, 1)  # partial tiles along M and N
    for op in ("filter_acts", "image_acts"):
        for config in (ci.TAP_TILES[1], ci.TAP_TILES[6]):
            for precision in ci.PRECISIONS:
                check(op, g, precision, config, label="sanitize tap-major")


@pytest.mark.gpu
def test_gpu_weight_acts_split_k_is_deterministic(debug):
    g = geom(16, 32, 13, 48, 3, 1, 1)
    assert ci.plan("weight_acts", g, "fp32", splits=5).splits == 5  # forced
    first, want = run_gpu("weight_acts", g, "fp32", splits=5)
    again, _ = run_gpu("weight_acts", g, "fp32", splits=5)
    np.testing.assert_array_equal(first, again)
    assert rel_err(first, want) < 1e-5
    single, _ = run_gpu("weight_acts", g, "fp32", splits=1)
    assert rel_err(single, want) < 1e-5


# --------------------------------------------------------------------------
# GPU: the wgmma (sm_90a) tiles, on a device of compute capability 9.0
# --------------------------------------------------------------------------


def needs_wgmma():
    from cc2ops.cuda.runtime.device import get_device

    cap = tuple(get_device(0).compute_capability)
    if cap != ci.WGMMA_CAPABILITY:
        pytest.skip(f"wgmma tiles need compute capability 9.0, device 0 has {cap}")


#: wgmma sweep (b, c, hw, f, khw, stride, pad, groups): channels and filters
#: per group multiples of 32 (bk), M = Fg or Cg below, at and above a tile's
#: rows (32, 96, 160, 256), odd batches, strides 1, 2 and 4, paddings,
#: rectangular images and filters, groups.
WGMMA_SHAPES = {
    "b3 c32 f64 3x3 p1": (3, 32, 7, 64, 3, 1, 1, 1),
    "b5 c64 f96 5x3 p(2,1) rect": (5, 64, (9, 6), 96, (5, 3), 1, (2, 1), 1),
    "b3 c64 f64 s2 g2": (3, 64, 9, 64, 3, 2, 1, 2),
    "b1 c32 f32 11x11 s4 p2": (1, 32, 23, 32, 11, 4, 2, 1),
    "b7 c96 f160 1x1": (7, 96, 6, 160, 1, 1, 0, 1),
    "b3 c128 f256 3x2 s4 rect": (3, 128, (17, 13), 256, (3, 2), 4, 1, 1),
    "b9 c256 f128 g2 s(1,2)": (9, 256, (8, 11), 128, 3, (1, 2), 1, 2),
    "b1 c160 f96 7x7 s1 p3": (1, 160, 10, 96, 7, 1, 3, 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["filter_acts", "image_acts"])
@pytest.mark.parametrize("config", ci.WGMMA_TILES, ids=lambda t: t.label)
def test_gpu_every_wgmma_tile(op, config, debug):
    # batch 33, 96 filters of 64 channels: partial tiles along M and N
    needs_wgmma()
    g = geom(33, 64, (9, 7), 96, 3, 1, 1)
    assert ci.tapmajor_ok(op, g, config)
    err = check(op, g, "tf32", config, label="wgmma b33 c64 f96")
    assert err > 1e-6, f"{config.label}: error {err} looks like fp32 (TF32 unused?)"


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["filter_acts", "image_acts"])
@pytest.mark.parametrize("label", list(WGMMA_SHAPES))
def test_gpu_wgmma_shapes(op, label, debug):
    needs_wgmma()
    g = geom(*WGMMA_SHAPES[label])
    tiles = [t for t in ci.WGMMA_TILES if ci.tapmajor_ok(op, g, t)]
    assert tiles == list(ci.WGMMA_TILES), label
    for config in tiles:
        check(op, g, "tf32", config, label=f"{label} {config.label}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["filter_acts", "image_acts"])
@pytest.mark.parametrize("layer", ["conv2", "conv3", "conv4", "conv5"])
def test_gpu_alexnet_layers_wgmma(layer, op, debug):
    needs_wgmma()
    g = geom(*ALEXNET[layer])
    for config in ci.WGMMA_TILES:
        assert ci.tapmajor_ok(op, g, config)
        err = check(op, g, "tf32", config, label=f"{layer} {config.label}")
        assert err > 1e-6, f"{layer} {config.label}: error {err} looks like fp32"


@pytest.mark.gpu
@pytest.mark.parametrize("config", ci.WGMMA_TILES, ids=lambda t: t.label)
def test_gpu_wgmma_through_the_conv_ops_and_accumulate(config, debug):
    """The tiles are candidates on this device; forced by name, image_acts
    adds into an accumulator (the only scaling the epilogue supports: beta
    = 1) and filter_acts writes into a given output."""
    from cc2ops.cuda.ops.conv import ops as gconv
    from cc2ops.cuda.runtime import array as garray

    needs_wgmma()
    # 96 channels and filters: the 192-row tiles are candidates of both passes
    g = geom(5, 96, (9, 7), 96, 3, 2, 1)
    x, w, dy = tensors(g, seed=4)
    kw = dict(conv_args(g), precision="tf32", device=0)
    name = gconv.Igemm(config).name
    for op in ("filter_acts", "image_acts"):
        assert name in gconv.algorithm_names(op, g, np.float32, "tf32", device=0)
    assert name not in gconv.algorithm_names("filter_acts", g, np.float32, "fp32", 0)
    acc = np.random.default_rng(9).standard_normal(x.shape).astype(np.float32)
    acc_gpu = garray.to_gpu(acc, 0)
    dy_gpu, w_gpu = garray.to_gpu(dy, 0), garray.to_gpu(w, 0)
    got = gconv.image_acts(
        dy_gpu, w_gpu, (g.height, g.width), algorithm=name, acc=acc_gpu, **kw
    )
    want = acc + reference("image_acts", g, x, w, dy)
    assert garray.ptr(got) == garray.ptr(acc_gpu)  # written into acc
    err = rel_err(garray.to_host(got), want)
    assert err < TOL["tf32"], f"accumulate {config.label}: rel err {err}"
    out = garray.empty(dy.shape, np.float32, 0)
    assert np.isnan(garray.to_host(out)).all()  # poisoned
    y = gconv.filter_acts(garray.to_gpu(x, 0), w_gpu, algorithm=name, out=out, **kw)
    assert garray.ptr(y) == garray.ptr(out)
    err = rel_err(garray.to_host(y), reference("filter_acts", g, x, w, dy))
    assert err < TOL["tf32"], f"filter_acts {config.label}: rel err {err}"


@pytest.mark.gpu
def test_gpu_wgmma_rejected_off_compute_capability_9_0(debug):
    from cc2ops.cuda.runtime.device import get_device

    if tuple(get_device(0).compute_capability) == ci.WGMMA_CAPABILITY:
        pytest.skip("device 0 runs the wgmma tiles")
    with pytest.raises(ValueError, match="needs compute capability 9.0"):
        run_gpu("filter_acts", geom(2, 32, 5, 32, 3, 1, 1), "tf32", ci.WGMMA_TILES[0])


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["filter_acts", "image_acts"])
def test_gpu_channels_last_from_misaligned_and_1x1_inputs(op, debug):
    """nhwc tiles read a fresh aligned channels-last copy: from a misaligned
    view, and from 1x1 images (where the copy would be the input itself)."""
    needs_wgmma()
    config = next(t for t in ci.WGMMA_TILES if t.nhwc)
    for g in (geom(5, 64, (9, 7), 96, 3, 1, 1), geom(7, 64, 1, 64, 1, 1, 0)):
        check(op, g, "tf32", config, label=f"nhwc misaligned {g}", misaligned=True)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["filter_acts", "image_acts"])
@pytest.mark.parametrize(
    "config", [t for t in ci.WGMMA_TILES if t.streamk], ids=lambda t: t.label
)
def test_gpu_streamk_grids_and_repeat(op, config, monkeypatch, debug):
    """Every grid from one block (all tiles in one run) to one block per
    iteration (every tile summed from k-tile segments); a repeated launch
    (the counters zeroed again) gives the same bits."""
    needs_wgmma()
    g = geom(33, 64, (9, 7), 96, 3, 1, 1)  # partial tiles along M and N
    for grid in (1, 2, 3, 7, 64, 10**6, None):
        monkeypatch.setattr(ci, "STREAMK_GRID", grid)
        label = f"stream-K grid {grid}"
        check(op, g, "tf32", config, label=label)
    first, _ = run_gpu(op, g, "tf32", config, seed=3)
    again, _ = run_gpu(op, g, "tf32", config, seed=3)
    np.testing.assert_array_equal(first, again)


@pytest.mark.gpu
def test_conv_igemm_wgmma_sanitize(debug):
    """wgmma kernels and their weight permutation (compute-sanitizer)."""
    needs_wgmma()
    g = geom(3, 32, (7, 6), 32, (3, 2), 1, 1)  # partial tiles along M and N
    for op in ("filter_acts", "image_acts"):
        for config in ci.WGMMA_TILES:
            check(op, g, "tf32", config, label="sanitize wgmma")


# the tap-major wgmma weight gradient


@pytest.mark.gpu
@pytest.mark.parametrize("config", ci.WGMMA_WGRAD_TILES, ids=lambda t: t.label)
def test_gpu_every_wgmma_wgrad_tile(config, debug):
    # batch 33, 70 channels, 100 filters: partial tiles along M and N; Ho*Wo
    # = 63: most dy rows take 4-byte copies, a quarter 16-byte
    needs_wgmma()
    g = geom(33, 70, (9, 7), 100, 3, 1, 1)
    err = check("weight_acts", g, "tf32", config, label="wgmma wgrad b33 c70 f100")
    assert err > 1e-6, f"{config.label}: error {err} looks like fp32 (TF32 unused?)"
    for splits in (1, 5):  # straight into dw, and forced partials
        check("weight_acts", g, "tf32", config, f"wgrad splits {splits}", splits)


@pytest.mark.gpu
@pytest.mark.parametrize("label", list(WGRAD_SHAPES) + list(WGMMA_SHAPES))
def test_gpu_wgmma_wgrad_shapes(label, debug):
    needs_wgmma()
    g = geom(*(WGRAD_SHAPES.get(label) or WGMMA_SHAPES[label]))
    for config in ci.WGMMA_WGRAD_TILES:
        check("weight_acts", g, "tf32", config, label=f"wgrad {label} {config.label}")


@pytest.mark.gpu
@pytest.mark.parametrize("layer", ["conv2", "conv3", "conv4", "conv5"])
def test_gpu_alexnet_layers_wgmma_wgrad(layer, debug):
    needs_wgmma()
    g = geom(4, *ALEXNET[layer][1:])
    for config in ci.WGMMA_WGRAD_TILES:
        err = check("weight_acts", g, "tf32", config, label=f"{layer} {config.label}")
        assert err > 1e-6, f"{layer} {config.label}: error {err} looks like fp32"


@pytest.mark.gpu
def test_gpu_wgmma_wgrad_deterministic_and_misaligned(debug):
    needs_wgmma()
    g = geom(6, 40, 13, 72, 3, 1, 1)
    config = ci.WGMMA_WGRAD_TILES[1]
    first, want = run_gpu("weight_acts", g, "tf32", config, splits=4)
    again, _ = run_gpu("weight_acts", g, "tf32", config, splits=4)
    np.testing.assert_array_equal(first, again)
    assert rel_err(first, want) < TOL["tf32"]
    check("weight_acts", g, "tf32", config, "wgrad misaligned", misaligned=True)


@pytest.mark.gpu
@pytest.mark.parametrize("config", ci.WGMMA_WGRAD_TILES, ids=lambda t: t.label)
def test_gpu_wgmma_wgrad_through_the_conv_ops_and_accumulate(config, debug):
    """The tiles are weight_acts candidates on this device (TF32 only);
    forced by name, weight_acts adds into an accumulator (Igemm's scratch
    and add, as for every tile) and writes a fresh output."""
    from cc2ops.cuda.ops.conv import ops as gconv
    from cc2ops.cuda.runtime import array as garray

    needs_wgmma()
    g = geom(5, 48, (9, 7), 160, (3, 2), 2, 1, groups=2)  # 80 filters per group
    x, w, dy = tensors(g, seed=4)
    kw = dict(conv_args(g), precision="tf32", device=0)
    name = gconv.Igemm(config).name
    assert name in gconv.algorithm_names("weight_acts", g, np.float32, "tf32", 0)
    assert name not in gconv.algorithm_names("weight_acts", g, np.float32, "fp32", 0)
    acc = np.random.default_rng(9).standard_normal(w.shape).astype(np.float32)
    acc_gpu = garray.to_gpu(acc, 0)
    x_gpu, dy_gpu = garray.to_gpu(x, 0), garray.to_gpu(dy, 0)
    fhw = (g.kh, g.kw)
    got = gconv.weight_acts(x_gpu, dy_gpu, fhw, algorithm=name, acc=acc_gpu, **kw)
    want = reference("weight_acts", g, x, w, dy)
    assert garray.ptr(got) == garray.ptr(acc_gpu)  # written into acc
    err = rel_err(garray.to_host(got), acc + want)
    assert err < TOL["tf32"], f"accumulate {config.label}: rel err {err}"
    dw = gconv.weight_acts(x_gpu, dy_gpu, fhw, algorithm=name, **kw)
    err = rel_err(garray.to_host(dw), want)
    assert err < TOL["tf32"], f"weight_acts {config.label}: rel err {err}"


@pytest.mark.gpu
def test_conv_igemm_wgmma_wgrad_sanitize(debug):
    """The wgmma weight gradient and its reduction (compute-sanitizer)."""
    needs_wgmma()
    g = geom(3, 35, (7, 6), 33, (3, 2), 1, 1)  # partial tiles along M and N
    for config in ci.WGMMA_WGRAD_TILES:
        for splits in (1, 3):
            check("weight_acts", g, "tf32", config, "sanitize wgmma wgrad", splits)
    check("weight_acts", g, "tf32", ci.WGMMA_WGRAD_TILES[3], "sanitize", 2, True)


#: The kernel paths behind TileConfig's switches (vec, stage_c): the original
#: (both off) and each one alone; the default (both on) runs everywhere else.
PATHS = [(False, False), (True, False), (False, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ci.PRECISIONS)
@pytest.mark.parametrize("op", ci.OPS)
@pytest.mark.parametrize("path", PATHS, ids=lambda p: f"vec{p[0]:d}_stage{p[1]:d}")
def test_gpu_kernel_paths(op, path, precision, debug):
    # K = 8*9 (16-byte w copies) and Ho*Wo = 12*8 (16-byte dy copies);
    # batch 33, 70 filters: partial tiles along every GEMM axis; warp tile
    # 32 x 64: two 32-column blocks per staged row
    g = geom(33, 8, (12, 8), 70, 3, 1, 1)
    assert ci.a_vector_width(op, g) == (1 if op == "image_acts" else 4)
    config = dataclasses.replace(ci.TILES[2], vec=path[0], stage_c=path[1])
    check(op, g, precision, config, label=f"path {path}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ci.OPS)
def test_gpu_misaligned_operands_use_4_byte_copies(op, debug):
    g = geom(5, 8, 8, 12, 3, 1, 1)  # vectors would apply to aligned operands
    for precision in ci.PRECISIONS:
        check(op, g, precision, label="misaligned", misaligned=True)


@pytest.mark.gpu
def test_gpu_rejects_wrong_shapes(debug):
    from cc2ops.cuda.runtime import array as garray

    g = geom(2, 3, 5, 4, 3, 1, 1)
    x, w, _ = tensors(g)
    out = garray.empty((2, 4, 5, 4), np.float32, 0)
    with pytest.raises(ValueError, match="out must be float32 of shape"):
        ci.filter_acts(garray.to_gpu(x, 0), garray.to_gpu(w, 0), out, g, "tf32", 0)
    with pytest.raises(ValueError, match="expected shape"):
        ci.filter_acts(garray.to_gpu(w, 0), garray.to_gpu(x, 0), out, g, "tf32", 0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape",
    [(3, 5, 7, 6, 3, 1, 1, 1), (2, 4, (7, 5), 6, (3, 2), 2, 1, 2)],
    ids=["b3 c5 3x3", "rect s2 g2"],
)
def test_conv_igemm_sanitize(shape, debug):
    g = geom(*shape)
    for op in ci.OPS:
        for precision in ci.PRECISIONS:
            check(op, g, precision, label="sanitize")
    if shape[-1] == 1:  # the original kernel paths (4-byte copies, direct stores)
        old = ci.TileConfig(64, 64, 32, 2, 2, vec=False, stage_c=False)
        for op in ci.OPS:
            check(op, g, "fp32", old, label="sanitize original paths")
    # split-K with its reduction kernel, forced (the heuristic would not split
    # these): Ho*Wo = 81 (4-byte dy copies) and 64 (16-byte)
    for hw in (9, 8):
        wg = geom(4, 8, hw, 16, 3, 1, 1)
        assert ci.plan("weight_acts", wg, "tf32", ci.TILES[3], splits=3).splits == 3
        for precision in ci.PRECISIONS:
            check("weight_acts", wg, precision, ci.TILES[3], "sanitize split-k", 3)


def test_shapes_table_is_consistent():
    for label, shape in SHAPES.items():
        g = geom(*shape)
        assert g.out_h >= 1 and g.out_w >= 1, label
        assert math.prod((g.batch, g.filters, g.out_h, g.out_w)) > 0


def test_accepts_the_conv_ops_geometry_record():
    from cc2ops.cuda.ops.conv.ops import ConvGeometry

    g = ConvGeometry(**vars(geom(3, 6, (7, 5), 4, (3, 2), 1, 1, 2)))
    assert ci.supports("filter_acts", g, np.float32, "fp32")
    x, w, dy = tensors(g, dtype=np.float64)
    for op in ci.OPS:
        got = tw.emulate(op, g, *operands(op, x, w, dy))
        np.testing.assert_allclose(got, reference(op, g, x, w, dy), rtol=1e-12)
