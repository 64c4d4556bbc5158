"""Numba implementations of the cc2ops ops, for PyTensor's default linker.

PyTensor 3 compiles a graph in its default mode (``mode="NUMBA"`` or no mode)
into one Numba function; an op without a ``numba_funcify`` registration runs
its Python ``perform`` in Numba *object mode*, with a ``UserWarning`` per op,
and makes the whole graph uncacheable. This module registers native
implementations of every host op that can appear in a single-device forward
or gradient graph, through PyTensor's cache-key machinery
(:func:`~pytensor.link.numba.dispatch.basic.register_funcify_default_op_cache_key`,
or ``register_funcify_and_cache_key`` where the generated function depends on
more than the op's props), so the graphs are cacheable.

============================  ===============================================
op                            implementation
============================  ===============================================
``FilterActs``                images split over Numba's threads; per
                              thread, im2col of a cache-sized chunk of images
                              (:data:`COLS_BUDGET`) and one ``np.dot`` (BLAS,
                              one thread: :mod:`._numba_blas`) per chunk and
                              group, into buffers made once per call
``ImageActs``                 the same split: ``np.dot`` of the filters'
                              transpose by the gradient, then col2im
``WeightActs``                the same split: im2col, ``np.dot`` by the
                              transposed columns into a per-thread sum
``MaxPool`` / ``AvgPool``     a loop over the clipped windows, parallel over
and their gradients           the (image, channel) planes
``CrossMapNorm(Grad)``        direct channel-window sums, parallel over images
``SoftmaxCrossEntropy(Grad)``  rows in parallel: a blocked row maximum, a
                              vectorised float32 exp (:func:`_exp_into`),
                              labels checked first
``TopKError``                 a loop over the rows, labels checked first
``Dropout``, ``DropoutAdvance``  Philox4x32-10 on uint64 words, bit for bit
                              the rule of :mod:`cc2ops.dropout`
============================  ===============================================

The numpy references (``*_reference`` in the frontend modules) are the
specification; the tests compare every op with them. Errors a reference
raises at run time (a label outside ``[0, K)``, shapes that only disagree at
run time) are raised here as ``ValueError`` with the same message, from
inside the compiled code.

The collective ops of :mod:`cc2ops.distributed.collectives` are not
registered: they only appear in graphs rewritten by
:func:`cc2ops.distributed.hybrid.distribute`, which are compiled in the
multi-device mode (``cvm`` linker), never in a single-device default-mode
graph.

The kernels are module-level functions whose geometry is passed as
arguments, so each compiles once per dtype and array rank; the per-op
functions registered with PyTensor are small closures over the op's props.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numba import config, prange, types
from numba.extending import overload, register_jitable
from numba.np.ufunc.parallel import _launch_threads
from pytensor.link.numba.dispatch.basic import (
    default_hash_key_from_props,
    numba_njit,
    register_funcify_and_cache_key,
    register_funcify_default_op_cache_key,
)

from cc2ops.backends._numba_blas import get_blas_threads, set_blas_threads
from cc2ops.conv import FilterActs, ImageActs, WeightActs
from cc2ops.cross_map_norm import CrossMapNorm, CrossMapNormGrad
from cc2ops.dropout import (
    PHILOX_M0,
    PHILOX_M1,
    PHILOX_W0,
    PHILOX_W1,
    Dropout,
    DropoutAdvance,
    dropout_scale,
    keep_threshold,
)
from cc2ops.pool import (
    AvgPool,
    AvgPoolGrad,
    MaxPool,
    MaxPoolGrad,
    MaxPoolGradGrad,
)
from cc2ops.shapes import conv_output_length
from cc2ops.softmax_cross_entropy import (
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyGrad,
    TopKError,
)

__all__ = ["CACHE_VERSION", "pool_output_length"]

#: Salt of every cache key, derived from this module's source (and its BLAS
#: helper's): PyTensor's
#: on-disk cache keeps each op's compiled code (kernels included) under the
#: key, so any edit here must give new keys or an old compilation is served.
_SOURCES = (Path(__file__), Path(__file__).with_name("_numba_blas.py"))
CACHE_VERSION = int(
    hashlib.sha256(b"".join(p.read_bytes() for p in _SOURCES)).hexdigest()[:12], 16
)

#: Largest im2col matrix (elements) built at once: a chunk of images shares
#: one GEMM per group, on buffers allocated once per call. The budget is
#: small on purpose: 2**20 float32 elements (4 MiB) stay in the cache
#: between the im2col that writes them and the GEMM that reads them, and
#: OpenBLAS runs a (64 x 800) x (800 x 1024) GEMM at about three times the
#: rate of one with 64 times the columns (measured on this project's 2-core
#: CI machine: 160 vs 55 GFLOP/s; conv1 of benchmarks/bench_cpu.py went from
#: 207 to 95 ms single-threaded). A chunk is never less than one image.
COLS_BUDGET = 1 << 20


# The kernels below with ``parallel=True`` are called from inside PyTensor's
# jitted graph function, and Numba starts its threading layer only when a
# parallel function is compiled at top level. Without this, linking a graph
# whose first parallel kernel is a callee (one loaded from the on-disk cache,
# say) fails with "LLVM ERROR: Symbol not found: allocate_sched" and aborts the
# process. Starting the threads is idempotent; Numba's own API has no public
# name for it.
_launch_threads()


#: PyTensor's fastmath policy (``numba_njit``'s), for the overloads below
_FASTMATH = numba_njit(lambda: None).targetoptions.get("fastmath", False)


def _jit(*args, **kwargs):
    """``numba_njit`` with PyTensor's fastmath policy, cached on disk."""
    kwargs.setdefault("cache", True)
    return numba_njit(*args, **kwargs)


_conv_length = register_jitable(conv_output_length)


@register_jitable
def pool_output_length(length, size, stride, start):
    """Windows per axis; the rule of :func:`cc2ops.shapes.pool_output_length`.

    That function also takes symbolic integers (it builds ``pt.switch``), which
    Numba cannot compile; this is the same rule for ints, callable from
    Python and from compiled code. ``tests/backends/test_numba.py`` checks that
    the two agree over a sweep of lengths, sizes, strides and starts.
    """
    n = (length - start - size + stride - 1) // stride + 1
    if (n - 1) * stride + start >= length:
        n -= 1
    return n


@register_jitable
def _typed(value, like):
    """``value`` as a scalar of ``like``'s dtype (a zero-size array works)."""
    out = np.empty(1, like.dtype)
    out[0] = value
    return out[0]


# --------------------------------------------------------------------------
# convolution: im2col / col2im and BLAS
# --------------------------------------------------------------------------


@register_jitable
def _valid_range(n_out, stride, offset, length):
    """Outputs ``o`` in ``[0, n_out)`` with ``0 <= o*stride + offset < length``."""
    lo = 0
    if offset < 0:
        lo = (-offset + stride - 1) // stride
    hi = 0
    if length - 1 - offset >= 0:
        hi = min(n_out, (length - 1 - offset) // stride + 1)
    return lo, max(lo, hi)


@_jit
def _im2col(x, b0, n, g, cg, kh, kw, sh, sw, ph, pw, ho, wo, cols):
    """Fill ``cols`` (cg*kh*kw, n*ho*wo) from images ``b0 .. b0+n`` of group ``g``.

    Row ``(c, u, v)`` holds, for every image and output pixel (row-major), the
    padded input pixel that filter tap ``(u, v)`` of channel ``c`` sees.
    """
    h, wd = x.shape[2], x.shape[3]
    npix = ho * wo
    taps = kh * kw
    for r in range(cg * taps):
        c = g * cg + r // taps
        u = (r // kw) % kh
        v = r % kw
        lo, hi = _valid_range(wo, sw, v - pw, wd)
        for i in range(n):
            for oy in range(ho):
                off = i * npix + oy * wo
                iy = oy * sh - ph + u
                if iy < 0 or iy >= h:
                    for ox in range(wo):
                        cols[r, off + ox] = 0
                    continue
                for ox in range(lo):
                    cols[r, off + ox] = 0
                if sw == 1:
                    # a contiguous run: a slice copy the compiler vectorises
                    cols[r, off + lo : off + hi] = x[
                        b0 + i, c, iy, lo - pw + v : hi - pw + v
                    ]
                else:
                    for ox in range(lo, hi):
                        cols[r, off + ox] = x[b0 + i, c, iy, ox * sw - pw + v]
                for ox in range(hi, wo):
                    cols[r, off + ox] = 0


@_jit
def _col2im(cols, dx, b0, n, g, cg, kh, kw, sh, sw, ph, pw, ho, wo):
    """Add ``cols`` (cg*kh*kw, n*ho*wo) back into the images of ``dx``.

    The transpose of :func:`_im2col`.
    """
    h, wd = dx.shape[2], dx.shape[3]
    npix = ho * wo
    taps = kh * kw
    for cl in range(cg):
        c = g * cg + cl
        for i in range(n):
            for u in range(kh):
                for v in range(kw):
                    r = cl * taps + u * kw + v
                    lo, hi = _valid_range(wo, sw, v - pw, wd)
                    for oy in range(ho):
                        iy = oy * sh - ph + u
                        if iy < 0 or iy >= h:
                            continue
                        off = i * npix + oy * wo
                        if sw == 1:
                            dx[b0 + i, c, iy, lo - pw + v : hi - pw + v] += cols[
                                r, off + lo : off + hi
                            ]
                        else:
                            for ox in range(lo, hi):
                                dx[b0 + i, c, iy, ox * sw - pw + v] += cols[r, off + ox]


@_jit
def _gather_rows(src, b0, n, f0, fg, out):
    """``out[f, i*npix:(i+1)*npix] = src[b0+i, f0+f]`` for a (B, F, npix) ``src``."""
    npix = src.shape[2]
    for i in range(n):
        for f in range(fg):
            for p in range(npix):
                out[f, i * npix + p] = src[b0 + i, f0 + f, p]


@_jit
def _scatter_rows(prod, b0, n, f0, fg, dst):
    """Transpose of :func:`_gather_rows`: ``dst[b0+i, f0+f] = prod[f, part i]``."""
    npix = dst.shape[2]
    for i in range(n):
        for f in range(fg):
            for p in range(npix):
                dst[b0 + i, f0 + f, p] = prod[f, i * npix + p]


@register_jitable
def _chunk(per_image, b):
    return max(1, min(b, COLS_BUDGET // max(1, per_image)))


@register_jitable
def _check_groups(op, c, f, cg, groups):
    if c % groups != 0:
        raise ValueError(
            op
            + ": groups ("
            + str(groups)
            + ") must divide the image channels ("
            + str(c)
            + ")"
        )
    if f % groups != 0:
        raise ValueError(
            op
            + ": groups ("
            + str(groups)
            + ") must divide the number of filters ("
            + str(f)
            + ")"
        )
    if c // groups != cg:
        raise ValueError(
            op
            + ": filters have "
            + str(cg)
            + " input channels but images have "
            + str(c)
            + " channels in "
            + str(groups)
            + " group(s)"
        )


@register_jitable
def _check_fits(op, n, k, p, side):
    if n + 2 * p < k:
        raise ValueError(
            op
            + ": filter "
            + side
            + " ("
            + str(k)
            + ") larger than the padded image ("
            + str(n)
            + " + 2*"
            + str(p)
            + " = "
            + str(n + 2 * p)
            + ")"
        )


@register_jitable
def _check_grad_hw(op, got, want, side):
    if got != want:
        raise ValueError(
            op
            + ": gradient "
            + side
            + " ("
            + str(got)
            + ") do not match the output "
            + side
            + " ("
            + str(want)
            + ") of the forward convolution"
        )


@register_jitable
def _hw_pair(op, role, hw):
    if hw.shape[0] != 2:
        raise ValueError(op + ": " + role + " must have 2 entries")
    a, b = hw[0], hw[1]
    if a < 1 or b < 1:
        raise ValueError(
            op + ": " + role + " must be >= 1, got (" + str(a) + ", " + str(b) + ")"
        )
    return a, b


@register_jitable
def _group_rows(m, groups):
    """(F, K) -> (groups, F/groups, K), C-contiguous: ``[g]`` is a BLAS operand."""
    f, k = m.shape
    return np.ascontiguousarray(m).reshape(groups, f // groups, k)


#: Spans a conv kernel splits its images into, one per Numba thread of a
#: default start. A compile-time constant: reading the live thread count
#: (``numba.get_num_threads``) would make the kernels uncacheable, and a
#: count changed later only changes how the spans share the threads.
_SPANS = config.NUMBA_NUM_THREADS


@register_jitable
def _workers(b):
    """Spans to split ``b`` images into: one per image at most, and one (the
    chunks in turn, each GEMM on the BLAS's own threads) where the BLAS's
    thread count cannot be set."""
    if get_blas_threads() < 1:
        return 1
    return max(1, min(b, _SPANS))


@register_jitable
def _span(t, nt, b):
    """Images ``[i0, i1)`` of worker ``t`` of ``nt``."""
    per = (b + nt - 1) // nt
    return min(b, t * per), min(b, (t + 1) * per)


@register_jitable
def _filter_acts_images(x, w3, y, i0, i1, nb, kh, kw, sh, sw, ph, pw, ho, wo):
    """``y[i0:i1]`` in chunks of ``nb`` images: im2col, one GEMM per group."""
    groups, fg, kk = w3.shape
    cg = x.shape[1] // groups
    npix = ho * wo
    cols = np.empty((kk, nb * npix), x.dtype)
    prod = np.empty((fg, nb * npix), x.dtype)
    for b0 in range(i0, i1, nb):
        n = min(nb, i1 - b0)
        if n < nb:  # the last, shorter chunk
            cols = np.empty((kk, n * npix), x.dtype)
            prod = np.empty((fg, n * npix), x.dtype)
        for g in range(groups):
            _im2col(x, b0, n, g, cg, kh, kw, sh, sw, ph, pw, ho, wo, cols)
            np.dot(w3[g], cols, prod)
            _scatter_rows(prod, b0, n, g * fg, fg, y)


@_jit(parallel=True)
def _filter_acts(x, w, sh, sw, ph, pw, groups):
    op = "FilterActs"
    b, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    _check_groups(op, c, f, cg, groups)
    _check_fits(op, h, kh, ph, "rows")
    _check_fits(op, wd, kw, pw, "cols")
    ho = _conv_length(h, kh, sh, ph)
    wo = _conv_length(wd, kw, sw, pw)
    kk = cg * kh * kw
    y = np.empty((b, f, ho * wo), x.dtype)
    w3 = _group_rows(np.ascontiguousarray(w).reshape(f, kk), groups)
    xc = np.ascontiguousarray(x)
    nb = _chunk(kk * ho * wo, b)
    nt = _workers(b)
    if nt == 1:
        _filter_acts_images(xc, w3, y, 0, b, nb, kh, kw, sh, sw, ph, pw, ho, wo)
    else:
        threads = get_blas_threads()
        set_blas_threads(1)
        for t in prange(nt):
            i0, i1 = _span(t, nt, b)
            _filter_acts_images(xc, w3, y, i0, i1, nb, kh, kw, sh, sw, ph, pw, ho, wo)
        set_blas_threads(threads)
    return y.reshape(b, f, ho, wo)


@register_jitable
def _image_acts_images(dy3, wt, dx, i0, i1, nb, kh, kw, sh, sw, ph, pw, ho, wo):
    """``dx[i0:i1]`` in chunks of ``nb`` images: one GEMM per group, col2im."""
    groups, kk, fg = wt.shape
    cg = dx.shape[1] // groups
    npix = ho * wo
    dyg = np.empty((fg, nb * npix), dx.dtype)
    cols = np.empty((kk, nb * npix), dx.dtype)
    for b0 in range(i0, i1, nb):
        n = min(nb, i1 - b0)
        if n < nb:
            dyg = np.empty((fg, n * npix), dx.dtype)
            cols = np.empty((kk, n * npix), dx.dtype)
        for g in range(groups):
            _gather_rows(dy3, b0, n, g * fg, fg, dyg)
            np.dot(wt[g], dyg, cols)
            _col2im(cols, dx, b0, n, g, cg, kh, kw, sh, sw, ph, pw, ho, wo)


@_jit(parallel=True)
def _image_acts(dy, w, image_hw, sh, sw, ph, pw, groups):
    op = "ImageActs"
    h, wd = _hw_pair(op, "image_hw", image_hw)
    b, f, ho, wo = dy.shape
    fw, cg, kh, kw = w.shape
    if f != fw:
        raise ValueError(
            op
            + ": gradient has "
            + str(f)
            + " channels but there are "
            + str(fw)
            + " filters"
        )
    c = cg * groups
    _check_groups(op, c, f, cg, groups)
    _check_fits(op, h, kh, ph, "rows")
    _check_fits(op, wd, kw, pw, "cols")
    _check_grad_hw(op, ho, _conv_length(h, kh, sh, ph), "rows")
    _check_grad_hw(op, wo, _conv_length(wd, kw, sw, pw), "cols")
    fg = f // groups
    kk = cg * kh * kw
    dx = np.zeros((b, c, h, wd), dy.dtype)
    dy3 = np.ascontiguousarray(dy).reshape(b, f, ho * wo)
    # each group's filters transposed, (groups, kk, F/groups)
    w3 = _group_rows(np.ascontiguousarray(w).reshape(f, kk), groups)
    wt = np.empty((groups, kk, fg), dy.dtype)
    for g in range(groups):
        wt[g] = w3[g].T
    nb = _chunk(kk * ho * wo, b)
    nt = _workers(b)
    if nt == 1:
        _image_acts_images(dy3, wt, dx, 0, b, nb, kh, kw, sh, sw, ph, pw, ho, wo)
    else:
        threads = get_blas_threads()
        set_blas_threads(1)
        # each worker adds into its own images of dx only
        for t in prange(nt):
            i0, i1 = _span(t, nt, b)
            _image_acts_images(dy3, wt, dx, i0, i1, nb, kh, kw, sh, sw, ph, pw, ho, wo)
        set_blas_threads(threads)
    return dx


@register_jitable
def _weight_acts_images(x, dy3, dw, i0, i1, nb, kh, kw, sh, sw, ph, pw, ho, wo):
    """Add images ``[i0, i1)``'s filter gradient into ``dw`` (groups, F/groups,
    kk), in chunks of ``nb`` images: im2col, one GEMM per group."""
    groups, fg, kk = dw.shape
    cg = x.shape[1] // groups
    npix = ho * wo
    cols = np.empty((kk, nb * npix), x.dtype)
    dyg = np.empty((fg, nb * npix), x.dtype)
    part = np.empty((fg, kk), x.dtype)
    for b0 in range(i0, i1, nb):
        n = min(nb, i1 - b0)
        if n < nb:
            cols = np.empty((kk, n * npix), x.dtype)
            dyg = np.empty((fg, n * npix), x.dtype)
        for g in range(groups):
            _im2col(x, b0, n, g, cg, kh, kw, sh, sw, ph, pw, ho, wo, cols)
            _gather_rows(dy3, b0, n, g * fg, fg, dyg)
            np.dot(dyg, cols.T, part)
            dw[g] += part


@_jit(parallel=True)
def _weight_acts(x, dy, filter_hw, sh, sw, ph, pw, groups):
    op = "WeightActs"
    kh, kw = _hw_pair(op, "filter_hw", filter_hw)
    b, c, h, wd = x.shape
    bd, f, ho, wo = dy.shape
    if b != bd:
        raise ValueError(
            op
            + ": gradient batch ("
            + str(bd)
            + ") does not match the image batch ("
            + str(b)
            + ")"
        )
    if c % groups != 0 or f % groups != 0:
        _check_groups(op, c, f, c // groups, groups)
    cg = c // groups
    _check_fits(op, h, kh, ph, "rows")
    _check_fits(op, wd, kw, pw, "cols")
    _check_grad_hw(op, ho, _conv_length(h, kh, sh, ph), "rows")
    _check_grad_hw(op, wo, _conv_length(wd, kw, sw, pw), "cols")
    fg = f // groups
    kk = cg * kh * kw
    xc = np.ascontiguousarray(x)
    dy3 = np.ascontiguousarray(dy).reshape(b, f, ho * wo)
    nb = _chunk(kk * ho * wo, b)
    nt = _workers(b)
    # one partial sum per worker, added in worker order: the result depends
    # on the thread count only through that fixed order
    parts = np.zeros((nt, groups, fg, kk), x.dtype)
    if nt == 1:
        _weight_acts_images(xc, dy3, parts[0], 0, b, nb, kh, kw, sh, sw, ph, pw, ho, wo)
    else:
        threads = get_blas_threads()
        set_blas_threads(1)
        for t in prange(nt):
            i0, i1 = _span(t, nt, b)
            _weight_acts_images(
                xc, dy3, parts[t], i0, i1, nb, kh, kw, sh, sw, ph, pw, ho, wo
            )
        set_blas_threads(threads)
    dw = parts[0]
    for t in range(1, nt):
        dw += parts[t]
    return dw.reshape(f, cg, kh, kw)


@register_funcify_default_op_cache_key(FilterActs)
def numba_funcify_FilterActs(op, node=None, **kwargs):
    (sh, sw), (ph, pw), groups = op.stride, op.padding, op.groups

    @numba_njit
    def filter_acts(x, w):
        return _filter_acts(x, w, sh, sw, ph, pw, groups)

    return filter_acts, CACHE_VERSION


@register_funcify_default_op_cache_key(ImageActs)
def numba_funcify_ImageActs(op, node=None, **kwargs):
    (sh, sw), (ph, pw), groups = op.stride, op.padding, op.groups

    @numba_njit
    def image_acts(dy, w, image_hw):
        return _image_acts(dy, w, image_hw, sh, sw, ph, pw, groups)

    return image_acts, CACHE_VERSION


@register_funcify_default_op_cache_key(WeightActs)
def numba_funcify_WeightActs(op, node=None, **kwargs):
    (sh, sw), (ph, pw), groups = op.stride, op.padding, op.groups

    @numba_njit
    def weight_acts(x, dy, filter_hw):
        return _weight_acts(x, dy, filter_hw, sh, sw, ph, pw, groups)

    return weight_acts, CACHE_VERSION


# --------------------------------------------------------------------------
# pooling: loops over clipped windows
# --------------------------------------------------------------------------


@register_jitable
def _pooled_length(op, length, size, stride, start, side):
    """Windows along one axis, after the checks of ``check_pool_params``."""
    if start >= length:
        raise ValueError(
            op
            + ": start ("
            + str(start)
            + ") must be < the image "
            + side
            + " ("
            + str(length)
            + ")"
        )
    if size > length - start:
        raise ValueError(
            op
            + ": window "
            + side
            + " ("
            + str(size)
            + ") larger than the image from start ("
            + str(length)
            + " - "
            + str(start)
            + " = "
            + str(length - start)
            + ")"
        )
    return pool_output_length(length, size, stride, start)


@register_jitable
def _check_pooled_shape(op, role, got, ho, wo):
    if got[0] != ho or got[1] != wo:
        raise ValueError(
            op
            + ": "
            + role
            + " shape does not match the pooled shape ("
            + str(ho)
            + ", "
            + str(wo)
            + ") of the images"
        )


@register_jitable
def _check_same_shape(op, role, a, b):
    if a.shape != b.shape:
        raise ValueError(op + ": " + role + " shape must equal the image shape")


@register_jitable
def _first_max(x, bi, ci, r0, r1, c0, c1, m):
    """Flat index ``r*W + c`` of the first pixel of a window equal to ``m``, or -1."""
    wd = x.shape[3]
    for r in range(r0, r1):
        for q in range(c0, c1):
            if x[bi, ci, r, q] == m:
                return r * wd + q
    return -1


@_jit(parallel=True)
def _max_pool(x, kh, kw, sh, sw, th, tw):
    op = "MaxPool"
    b, c, h, wd = x.shape
    ho = _pooled_length(op, h, kh, sh, th, "rows")
    wo = _pooled_length(op, wd, kw, sw, tw, "cols")
    y = np.empty((b, c, ho, wo), x.dtype)
    for p in prange(b * c):
        bi, ci = p // c, p % c
        for oy in range(ho):
            r0 = th + oy * sh
            r1 = min(r0 + kh, h)
            r0 = max(r0, 0)
            for ox in range(wo):
                c0 = tw + ox * sw
                c1 = min(c0 + kw, wd)
                c0 = max(c0, 0)
                m = x[bi, ci, r0, c0]
                for r in range(r0, r1):
                    for q in range(c0, c1):
                        v = x[bi, ci, r, q]
                        # NaN wins, as np.maximum makes it win in the reference
                        if v > m or v != v:
                            m = v
                y[bi, ci, oy, ox] = m
    return y


@_jit(parallel=True)
def _max_pool_grad(x, y, gy, kh, kw, sh, sw, th, tw):
    op = "MaxPoolGrad"
    b, c, h, wd = x.shape
    ho = _pooled_length(op, h, kh, sh, th, "rows")
    wo = _pooled_length(op, wd, kw, sw, tw, "cols")
    _check_pooled_shape(op, "pooled output", y.shape[2:], ho, wo)
    _check_pooled_shape(op, "output gradient", gy.shape[2:], ho, wo)
    if y.shape[:2] != x.shape[:2] or gy.shape[:2] != x.shape[:2]:
        raise ValueError(op + ": (B, C) of the pooled tensors must equal the images'")
    gx = np.zeros((b, c, h, wd), x.dtype)
    for p in prange(b * c):
        bi, ci = p // c, p % c
        for oy in range(ho):
            r0 = th + oy * sh
            r1 = min(r0 + kh, h)
            r0 = max(r0, 0)
            for ox in range(wo):
                c0 = tw + ox * sw
                c1 = min(c0 + kw, wd)
                c0 = max(c0, 0)
                hit = _first_max(x, bi, ci, r0, r1, c0, c1, y[bi, ci, oy, ox])
                if hit >= 0:
                    gx[bi, ci, hit // wd, hit % wd] += gy[bi, ci, oy, ox]
    return gx


@_jit(parallel=True)
def _max_pool_grad_grad(x, y, ggx, kh, kw, sh, sw, th, tw):
    op = "MaxPoolGradGrad"
    b, c, h, wd = x.shape
    ho = _pooled_length(op, h, kh, sh, th, "rows")
    wo = _pooled_length(op, wd, kw, sw, tw, "cols")
    _check_pooled_shape(op, "pooled output", y.shape[2:], ho, wo)
    if y.shape[:2] != x.shape[:2]:
        raise ValueError(op + ": (B, C) of the pooled output must equal the images'")
    _check_same_shape(op, "input gradient", ggx, x)
    ggy = np.zeros((b, c, ho, wo), x.dtype)
    for p in prange(b * c):
        bi, ci = p // c, p % c
        for oy in range(ho):
            r0 = th + oy * sh
            r1 = min(r0 + kh, h)
            r0 = max(r0, 0)
            for ox in range(wo):
                c0 = tw + ox * sw
                c1 = min(c0 + kw, wd)
                c0 = max(c0, 0)
                hit = _first_max(x, bi, ci, r0, r1, c0, c1, y[bi, ci, oy, ox])
                if hit >= 0:
                    ggy[bi, ci, oy, ox] = ggx[bi, ci, hit // wd, hit % wd]
    return ggy


@_jit(parallel=True)
def _avg_pool(x, kh, kw, sh, sw, th, tw):
    op = "AvgPool"
    b, c, h, wd = x.shape
    ho = _pooled_length(op, h, kh, sh, th, "rows")
    wo = _pooled_length(op, wd, kw, sw, tw, "cols")
    y = np.empty((b, c, ho, wo), x.dtype)
    zero = _typed(0, x)
    for p in prange(b * c):
        bi, ci = p // c, p % c
        for oy in range(ho):
            r0 = th + oy * sh
            r1 = min(r0 + kh, h)
            r0 = max(r0, 0)
            for ox in range(wo):
                c0 = tw + ox * sw
                c1 = min(c0 + kw, wd)
                c0 = max(c0, 0)
                s = zero
                for r in range(r0, r1):
                    for q in range(c0, c1):
                        s += x[bi, ci, r, q]
                # the division rounds once to x's dtype, as the reference's does
                y[bi, ci, oy, ox] = s / ((r1 - r0) * (c1 - c0))
    return y


@_jit(parallel=True)
def _avg_pool_grad(gy, image_hw, kh, kw, sh, sw, th, tw):
    op = "AvgPoolGrad"
    h, wd = _hw_pair(op, "image_hw", image_hw)
    b, c, ho, wo = gy.shape
    _check_pooled_shape(
        op,
        "output gradient",
        gy.shape[2:],
        _pooled_length(op, h, kh, sh, th, "rows"),
        _pooled_length(op, wd, kw, sw, tw, "cols"),
    )
    gx = np.zeros((b, c, h, wd), gy.dtype)
    for p in prange(b * c):
        bi, ci = p // c, p % c
        for oy in range(ho):
            r0 = th + oy * sh
            r1 = min(r0 + kh, h)
            r0 = max(r0, 0)
            for ox in range(wo):
                c0 = tw + ox * sw
                c1 = min(c0 + kw, wd)
                c0 = max(c0, 0)
                share = _typed(gy[bi, ci, oy, ox] / ((r1 - r0) * (c1 - c0)), gy)
                for r in range(r0, r1):
                    for q in range(c0, c1):
                        gx[bi, ci, r, q] += share
    return gx


def _pool_params(op):
    (kh, kw), (sh, sw), (th, tw) = op.size, op.stride, op.start
    return kh, kw, sh, sw, th, tw


@register_funcify_default_op_cache_key(MaxPool)
def numba_funcify_MaxPool(op, node=None, **kwargs):
    kh, kw, sh, sw, th, tw = _pool_params(op)

    @numba_njit
    def max_pool(x):
        return _max_pool(x, kh, kw, sh, sw, th, tw)

    return max_pool, CACHE_VERSION


@register_funcify_default_op_cache_key(MaxPoolGrad)
def numba_funcify_MaxPoolGrad(op, node=None, **kwargs):
    kh, kw, sh, sw, th, tw = _pool_params(op)

    @numba_njit
    def max_pool_grad(x, y, gy):
        return _max_pool_grad(x, y, gy, kh, kw, sh, sw, th, tw)

    return max_pool_grad, CACHE_VERSION


@register_funcify_default_op_cache_key(MaxPoolGradGrad)
def numba_funcify_MaxPoolGradGrad(op, node=None, **kwargs):
    kh, kw, sh, sw, th, tw = _pool_params(op)

    @numba_njit
    def max_pool_grad_grad(x, y, ggx):
        return _max_pool_grad_grad(x, y, ggx, kh, kw, sh, sw, th, tw)

    return max_pool_grad_grad, CACHE_VERSION


@register_funcify_default_op_cache_key(AvgPool)
def numba_funcify_AvgPool(op, node=None, **kwargs):
    kh, kw, sh, sw, th, tw = _pool_params(op)

    @numba_njit
    def avg_pool(x):
        return _avg_pool(x, kh, kw, sh, sw, th, tw)

    return avg_pool, CACHE_VERSION


@register_funcify_default_op_cache_key(AvgPoolGrad)
def numba_funcify_AvgPoolGrad(op, node=None, **kwargs):
    kh, kw, sh, sw, th, tw = _pool_params(op)

    @numba_njit
    def avg_pool_grad(gy, image_hw):
        return _avg_pool_grad(gy, image_hw, kh, kw, sh, sw, th, tw)

    return avg_pool_grad, CACHE_VERSION


# --------------------------------------------------------------------------
# cross-map response normalisation
# --------------------------------------------------------------------------


@register_jitable
def _window(c, channels, size, blocked):
    """``[lo, hi)`` of :func:`cc2ops.shapes.cross_map_window_bounds` for channel c."""
    if blocked:
        lo = (c // size) * size
        hi = lo + size
    else:
        lo = c - size // 2
        hi = c + (size - 1) // 2 + 1
    return max(lo, 0), min(hi, channels)


@register_jitable
def _transposed_window(j, channels, size, blocked):
    """``[lo, hi)`` of :func:`cc2ops.shapes.cross_map_transposed_window_bounds`."""
    if blocked:
        return _window(j, channels, size, blocked)
    return max(j - (size - 1) // 2, 0), min(j + size // 2 + 1, channels)


@register_jitable
def _window_sums(v, size, blocked, transposed, out):
    """``out[c] = sum(v[lo(c):hi(c)])`` over the (C, HW) planes of ``v``."""
    channels, npix = v.shape
    for c in range(channels):
        if transposed:
            lo, hi = _transposed_window(c, channels, size, blocked)
        else:
            lo, hi = _window(c, channels, size, blocked)
        for p in range(npix):
            out[c, p] = v[lo, p]
        for cc in range(lo + 1, hi):
            for p in range(npix):
                out[c, p] += v[cc, p]


@_jit(parallel=True)
def _cross_map_norm(x, size, alpha, beta, k, blocked):
    b, c, h, wd = x.shape
    npix = h * wd
    x3 = np.ascontiguousarray(x).reshape(b, c, npix)
    y = np.empty((b, c, npix), x.dtype)
    kt = _typed(k, x)
    at = _typed(alpha / size, x)
    nb = _typed(-beta, x)
    for bi in prange(b):
        xb = x3[bi]
        sq = xb * xb
        d = np.empty((c, npix), x.dtype)
        _window_sums(sq, size, blocked, False, d)
        for ci in range(c):
            for p in range(npix):
                y[bi, ci, p] = xb[ci, p] * (kt + at * d[ci, p]) ** nb
    return y.reshape(b, c, h, wd)


@_jit(parallel=True)
def _cross_map_norm_grad(x, gy, size, alpha, beta, k, blocked):
    if x.shape != gy.shape:
        raise ValueError("CrossMapNormGrad: gy shape must equal x shape (B, C, H, W)")
    b, c, h, wd = x.shape
    npix = h * wd
    x3 = np.ascontiguousarray(x).reshape(b, c, npix)
    g3 = np.ascontiguousarray(gy).reshape(b, c, npix)
    gx = np.empty((b, c, npix), x.dtype)
    kt = _typed(k, x)
    at = _typed(alpha / size, x)
    nb = _typed(-beta, x)
    two_ab = _typed(2.0 * alpha * beta / size, x)
    for bi in prange(b):
        xb = x3[bi]
        gb = g3[bi]
        sq = xb * xb
        d = np.empty((c, npix), x.dtype)
        _window_sums(sq, size, blocked, False, d)
        p = np.empty((c, npix), x.dtype)
        t = np.empty((c, npix), x.dtype)
        for ci in range(c):
            for q in range(npix):
                dd = kt + at * d[ci, q]
                pp = dd**nb
                p[ci, q] = pp
                t[ci, q] = gb[ci, q] * xb[ci, q] * (pp / dd)
        back = np.empty((c, npix), x.dtype)
        _window_sums(t, size, blocked, True, back)
        for ci in range(c):
            for q in range(npix):
                gx[bi, ci, q] = gb[ci, q] * p[ci, q] - two_ab * xb[ci, q] * back[ci, q]
    return gx.reshape(b, c, h, wd)


def _cmr_params(op):
    return op.size, op.alpha, op.beta, op.k, op.blocked


@register_funcify_default_op_cache_key(CrossMapNorm)
def numba_funcify_CrossMapNorm(op, node=None, **kwargs):
    size, alpha, beta, k, blocked = _cmr_params(op)

    @numba_njit
    def cross_map_norm(x):
        return _cross_map_norm(x, size, alpha, beta, k, blocked)

    return cross_map_norm, CACHE_VERSION


@register_funcify_default_op_cache_key(CrossMapNormGrad)
def numba_funcify_CrossMapNormGrad(op, node=None, **kwargs):
    size, alpha, beta, k, blocked = _cmr_params(op)

    @numba_njit
    def cross_map_norm_grad(x, gy):
        return _cross_map_norm_grad(x, gy, size, alpha, beta, k, blocked)

    return cross_map_norm_grad, CACHE_VERSION


# --------------------------------------------------------------------------
# softmax cross-entropy and top-k error
# --------------------------------------------------------------------------


@register_jitable
def _check_logits(op, x):
    if x.shape[1] < 1:
        raise ValueError(op + ": logits must have at least one class (K >= 1)")


@register_jitable
def _check_labels(op, y, x):
    """The reference's label checks, same messages (first bad row)."""
    b, k = x.shape
    if y.shape[0] != b:
        raise ValueError(
            op
            + ": labels must have one entry per row of logits (B = "
            + str(b)
            + "), got "
            + str(y.shape[0])
        )
    for i in range(b):
        v = y[i]
        if v < 0 or v >= k:
            raise ValueError(
                op
                + ": labels must be in [0, K) = [0, "
                + str(k)
                + "), got "
                + str(v)
                + " at row "
                + str(i)
            )


@register_jitable
def _check_soft(op, t, x):
    if t.shape != x.shape:
        raise ValueError(op + ": soft targets must have the logits' shape (B, K)")


#: Lanes of :func:`_row_max`: independent running maxima the compiler keeps
#: in vector registers (a single running maximum is a serial dependency)
_MAX_LANES = 16


@register_jitable
def _row_max(x, i):
    """Largest entry of row ``i``.

    A NaN in the row may or may not be returned; the callers do not need it
    to be: the row's NaN reaches their exp-sum (``exp(NaN - m)``), which makes
    the loss and every gradient entry of the row NaN, as in the references.
    """
    k = x.shape[1]
    m = x[i, 0]
    full = k // _MAX_LANES * _MAX_LANES
    if full:
        acc = np.empty(_MAX_LANES, x.dtype)
        for lane in range(_MAX_LANES):
            acc[lane] = x[i, lane]
        for j in range(_MAX_LANES, full, _MAX_LANES):
            for lane in range(_MAX_LANES):
                v = x[i, j + lane]
                acc[lane] = v if v > acc[lane] else acc[lane]
        m = acc[0]
        for lane in range(1, _MAX_LANES):
            m = acc[lane] if acc[lane] > m else m
    for j in range(full, k):
        m = x[i, j] if x[i, j] > m else m
    return m


# exp without SVML: Numba compiles ``np.exp`` to one libm call per element
# (llvmlite's PyPI builds have no SVML), which kept the softmax loss at 8x
# PyTorch-CPU. The float32 rule below is arithmetic only, so LLVM vectorises
# it: Cody-Waite reduction by ln 2, Cephes' degree-6 minimax polynomial for
# exp(r) on [-ln2/2, ln2/2] (relative error below 3.1e-7 over float32's range),
# the power of two built in the exponent bits.
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
#: exp below this is not a normal float32: the result is 0
_EXP_MIN = np.float32(-87.33654)
#: exp above this overflows float32: the result is inf
_EXP_MAX = np.float32(88.72283)
_EXP_P0 = np.float32(1.9875691500e-4)
_EXP_P1 = np.float32(1.3981999507e-3)
_EXP_P2 = np.float32(8.3334519073e-3)
_EXP_P3 = np.float32(4.1665795894e-2)
_EXP_P4 = np.float32(1.6666665459e-1)
_EXP_P5 = np.float32(5.0000001201e-1)


def _exp_into(t, e, bits):
    """``e[j] = exp(t[j])`` for 1-D ``t``; ``bits`` is (2, len(t)) int32
    scratch (used by the float32 rule)."""
    raise NotImplementedError("only callable from Numba-compiled code")


def _exp_into_any(t, e, bits):
    for j in range(t.shape[0]):
        e[j] = np.exp(t[j])


def _exp_into_float32(t, e, bits):
    k = t.shape[0]
    lo, hi = bits[0], bits[1]
    for j in range(k):
        v = t[j]
        v = _EXP_MIN if v < _EXP_MIN else v
        v = _EXP_MAX if v > _EXP_MAX else v
        # NaN: a finite n keeps the exponent bits valid; the polynomial of
        # r = NaN makes the result NaN
        n = np.floor(v * _LOG2E + np.float32(0.5)) if v == v else np.float32(0)
        r = v - n * _LN2_HI - n * _LN2_LO
        p = _EXP_P0
        p = p * r + _EXP_P1
        p = p * r + _EXP_P2
        p = p * r + _EXP_P3
        p = p * r + _EXP_P4
        p = p * r + _EXP_P5
        e[j] = p * r * r + r + np.float32(1)
        # 2**n as 2**(n//2) * 2**(n - n//2): n in [-126, 128] and each half
        # has a normal float32 exponent
        ni = np.int32(n)
        n1 = ni >> np.int32(1)
        lo[j] = (n1 + np.int32(127)) << np.int32(23)
        hi[j] = (ni - n1 + np.int32(127)) << np.int32(23)
    s1, s2 = lo.view(np.float32), hi.view(np.float32)
    for j in range(k):
        v = e[j] * s1[j] * s2[j]
        if t[j] < _EXP_MIN:
            v = np.float32(0)
        elif t[j] > _EXP_MAX:
            v = np.float32(np.inf)
        e[j] = v


@overload(_exp_into, jit_options={"fastmath": _FASTMATH, "cache": True})
def _overload_exp_into(t, e, bits):
    if isinstance(t, types.Array) and t.dtype == types.float32:
        return _exp_into_float32
    return _exp_into_any


@register_jitable
def _shifted_exp(x, i, m):
    """(exp(x[i] - m), its sum) for row ``i`` of ``x``."""
    k = x.shape[1]
    t = x[i] - m
    e = np.empty(k, x.dtype)
    _exp_into(t, e, np.empty((2, k), np.int32))
    s = _typed(0, x)
    for j in range(k):
        s += e[j]
    return e, s


@_jit(parallel=True)
def _sce_labels(x, y):
    op = "SoftmaxCrossEntropy"
    _check_logits(op, x)
    _check_labels(op, y, x)
    b = x.shape[0]
    out = np.empty(b, x.dtype)
    for i in prange(b):
        m = _row_max(x, i)
        _, s = _shifted_exp(x, i, m)
        out[i] = np.log(s) - (x[i, y[i]] - m)
    return out


@_jit(parallel=True)
def _sce_soft(x, t):
    op = "SoftmaxCrossEntropy"
    _check_logits(op, x)
    _check_soft(op, t, x)
    b, k = x.shape
    out = np.empty(b, x.dtype)
    for i in prange(b):
        m = _row_max(x, i)
        _, s = _shifted_exp(x, i, m)
        log_s = np.log(s)
        acc = _typed(0, x)
        for j in range(k):
            acc += t[i, j] * ((x[i, j] - m) - log_s)
        out[i] = -acc
    return out


@register_jitable
def _check_g(op, g, x):
    if g.shape[0] != x.shape[0]:
        raise ValueError(
            op
            + ": g must have one entry per row of logits (B = "
            + str(x.shape[0])
            + "), got "
            + str(g.shape[0])
        )


@_jit(parallel=True)
def _sce_grad_labels(g, x, y):
    op = "SoftmaxCrossEntropyGrad"
    _check_logits(op, x)
    _check_g(op, g, x)
    _check_labels(op, y, x)
    b, k = x.shape
    dx = np.empty((b, k), x.dtype)
    for i in prange(b):
        e, s = _shifted_exp(x, i, _row_max(x, i))
        scale = g[i] / s
        for j in range(k):
            dx[i, j] = e[j] * scale
        dx[i, y[i]] -= g[i]
    return dx


@_jit(parallel=True)
def _sce_grad_soft(g, x, t):
    op = "SoftmaxCrossEntropyGrad"
    _check_logits(op, x)
    _check_g(op, g, x)
    _check_soft(op, t, x)
    b, k = x.shape
    dx = np.empty((b, k), x.dtype)
    for i in prange(b):
        e, s = _shifted_exp(x, i, _row_max(x, i))
        ts = _typed(0, x)
        for j in range(k):
            ts += t[i, j]
        scale = ts / s
        for j in range(k):
            dx[i, j] = (e[j] * scale - t[i, j]) * g[i]
    return dx


@_jit
def _top_k_error(x, y, topk):
    op = "TopKError"
    _check_logits(op, x)
    _check_labels(op, y, x)
    b, k = x.shape
    out = np.empty(b, x.dtype)
    for i in range(b):
        true = x[i, y[i]]
        above = 0
        for j in range(k):
            if x[i, j] > true:
                above += 1
        out[i] = 1 if above >= topk else 0
    return out


def _soft(var) -> bool:
    return var.type.dtype.startswith("float")


@register_funcify_and_cache_key(SoftmaxCrossEntropy)
def numba_funcify_SoftmaxCrossEntropy(op, node=None, **kwargs):
    # labels or soft targets is decided by the targets' type, not by a prop,
    # so it goes into the cache key
    soft = _soft(node.inputs[1])
    kernel = _sce_soft if soft else _sce_labels

    @numba_njit
    def softmax_cross_entropy(x, t):
        return kernel(x, t)

    key = default_hash_key_from_props(op, soft=soft, version=CACHE_VERSION)
    return softmax_cross_entropy, key


@register_funcify_and_cache_key(SoftmaxCrossEntropyGrad)
def numba_funcify_SoftmaxCrossEntropyGrad(op, node=None, **kwargs):
    soft = _soft(node.inputs[2])
    kernel = _sce_grad_soft if soft else _sce_grad_labels

    @numba_njit
    def softmax_cross_entropy_grad(g, x, t):
        return kernel(g, x, t)

    key = default_hash_key_from_props(op, soft=soft, version=CACHE_VERSION)
    return softmax_cross_entropy_grad, key


@register_funcify_default_op_cache_key(TopKError)
def numba_funcify_TopKError(op, node=None, **kwargs):
    topk = op.k

    @numba_njit
    def top_k_error(x, y):
        return _top_k_error(x, y, topk)

    return top_k_error, CACHE_VERSION


# --------------------------------------------------------------------------
# dropout: Philox4x32-10, the bit rule of cc2ops.dropout
# --------------------------------------------------------------------------

_M0 = np.uint64(PHILOX_M0)
_M1 = np.uint64(PHILOX_M1)
_W0 = np.uint64(PHILOX_W0)
_W1 = np.uint64(PHILOX_W1)
_LO32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


@register_jitable
def _philox4x32_10(c0, c1, c2, c3, k0, k1):
    """One Philox4x32-10 block; every word a uint64 holding 32 bits."""
    for r in range(10):
        if r > 0:
            k0 = (k0 + _W0) & _LO32
            k1 = (k1 + _W1) & _LO32
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = (
            (p1 >> _S32) ^ c1 ^ k0,
            p1 & _LO32,
            (p0 >> _S32) ^ c3 ^ k1,
            p0 & _LO32,
        )
    return c0, c1, c2, c3


@register_jitable
def _check_state(op, state):
    if state.shape[0] != 4:
        raise ValueError(
            op
            + ": the dropout state must be a uint32 vector of 4 words "
            + "(key0, key1, counter_lo, counter_hi)"
        )


@register_jitable
def _counter(state):
    return np.uint64(state[2]) | (np.uint64(state[3]) << _S32)


@_jit
def _dropout(x, state, threshold, scale):
    _check_state("Dropout", state)
    flat = np.ascontiguousarray(x).reshape(-1)
    n = flat.shape[0]
    out = np.empty(n, x.dtype)
    s = _typed(scale, x)
    zero = _typed(0, x)
    k0 = np.uint64(state[0])
    k1 = np.uint64(state[1])
    base = _counter(state)
    t = np.uint64(threshold)
    for blk in range((n + 3) // 4):
        b = base + np.uint64(blk)  # wraps mod 2**64, as the rule says
        w0, w1, w2, w3 = _philox4x32_10(
            b & _LO32, b >> _S32, np.uint64(0), np.uint64(0), k0, k1
        )
        i = 4 * blk
        out[i] = flat[i] * s if w0 < t else zero
        if i + 1 < n:
            out[i + 1] = flat[i + 1] * s if w1 < t else zero
        if i + 2 < n:
            out[i + 2] = flat[i + 2] * s if w2 < t else zero
        if i + 3 < n:
            out[i + 3] = flat[i + 3] * s if w3 < t else zero
    return out.reshape(x.shape)


@_jit
def _dropout_advance(state, n):
    _check_state("DropoutAdvance", state)
    count = n.item()
    if count < 0:
        raise ValueError("DropoutAdvance: n must be >= 0, got " + str(count))
    c = _counter(state) + (np.uint64(count) + np.uint64(3)) // np.uint64(4)
    out = np.empty(4, np.uint32)
    out[0] = state[0]
    out[1] = state[1]
    out[2] = np.uint32(c & _LO32)
    out[3] = np.uint32(c >> _S32)
    return out


@register_funcify_and_cache_key(Dropout)
def numba_funcify_Dropout(op, node=None, **kwargs):
    # the scale is rounded to x's dtype (dropout_scale), so the key holds it
    dtype = node.inputs[0].type.dtype
    threshold = keep_threshold(op.p)
    scale = float(dropout_scale(op.p, dtype))

    @numba_njit
    def dropout(x, state):
        return _dropout(x, state, threshold, scale)

    key = default_hash_key_from_props(op, dtype=dtype, version=CACHE_VERSION)
    return dropout, key


@register_funcify_default_op_cache_key(DropoutAdvance)
def numba_funcify_DropoutAdvance(op, node=None, **kwargs):
    @numba_njit
    def dropout_advance(state, n):
        return _dropout_advance(state, n)

    return dropout_advance, CACHE_VERSION
