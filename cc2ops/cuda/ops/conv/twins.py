"""The numpy twins of the implicit-GEMM kernels: their index maps, as a test oracle.

Every address formula of ``kernels/conv_igemm.cu`` (the operand offsets, the
copy maps of ``cp.async``, the fragment and epilogue maps of ``mma.sync``,
the shared-memory layout and matrix descriptors of ``wgmma``, the stream-K
schedule) has its twin here, under the same name, and :func:`emulate` runs a
whole convolution through them in numpy. The tests check the twins against
the convolution references on the CPU, and the kernels against the twins on
the GPU; nothing at run time imports this module (the runtime half, planning
and launching, is :mod:`cc2ops.cuda.ops.conv.igemm`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cc2ops.cuda.ops.conv.geometry import ConvGeometry
from cc2ops.cuda.ops.conv.igemm import (
    _SW128_ROW,
    TILES,
    WGMMA_WGRAD_TILES,
    TileConfig,
    _dims,
    _is_wgradtm,
    _kernel_gemm,
    _out_shape,
    _slices,
    fastdiv_magic,
    gemm_shape,
    plan,
    tap_channels,
    tapmajor_ok,
)

__all__ = [
    "fastdiv",
    "permuted_weights",
    "a_offset",
    "b_offset",
    "c_offset",
    "channels_last",
    "emulate",
    "load_map",
    "fragment_map",
    "emulate_block",
    "epilogue_map",
    "emulate_epilogue",
    "wgmma_smem_offset",
    "gmma_descriptor",
    "gmma_address",
    "wgmma_load_map",
    "wgrad_rot",
    "wgmma_accumulator_map",
    "emulate_wgmma_block",
    "streamk_items",
    "streamk_block_of",
    "streamk_segments",
    "wgrad_copies",
    "emulate_wgrad_wgmma",
]


def fastdiv(n: Any, magic: int, shift: int) -> np.ndarray:
    """``n // d`` the way the kernels compute it (32-bit ``__umulhi``)."""
    n = np.asarray(n, dtype=np.uint64)
    hi = (n * np.uint64(magic)) >> np.uint64(32)
    return ((hi + n) >> np.uint64(shift)).astype(np.int64)


def _div(n: np.ndarray, d: int) -> np.ndarray:
    return fastdiv(n, *fastdiv_magic(d))


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
