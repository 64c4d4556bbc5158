<%doc>
2-D real FFTs of the FFT convolution (cc2ops.cuda.ops.conv.fft): the forward
transform of planes into bin-major spectra, and the inverse transform of
bin-major spectra into cropped planes. No cuFFT: every transform is
generated here for one size, and the one-dimensional FFTs are unrolled
radix-2 butterflies with literal twiddles (Mako emits them).

Constants: name (kernel name), kind ("r2c" or "c2r"), nh, nw (transform
size, powers of two), dh, dw (extent of the data planes: the real planes
r2c reads, which sit at the top left of the nh x nw grid with zeros around
them, or the planes c2r writes), sh, sw (c2r only: output row i, column j
is transform element ((i + sh) mod nh, (j + sw) mod nw)), conj (r2c only:
store the complex conjugate of the spectrum), accumulate (c2r only: add to
the output instead of overwriting it), planes (T, planes per block),
threads (block size). The host passes neutral values for the constants a
kind does not use.

Planes and spectra
------------------
A kernel handles Q planes in spectrum order: plane q has slow index
q / n_fast and fast index q % n_fast, and its data plane (dh*dw
contiguous floats) starts at element (fast*fast_step + slow*slow_step)*dh*dw
of the data array (steps in planes). Spectra are bin-major: bin (kr, kc)
(kr < nh, kc < nc = nw/2 + 1, bin = kr*nc + kc) of plane q is element
bin*Q + q of a complex64 array. So the images (n, c) with n fast give
(bins, C, nb) spectra, the filters (f, c) with c fast give (bins, F, C/G)
spectra, and one GEMM per bin (batched over the bins) multiplies them.

The DFT is X[kr, kc] = sum x[r, c] exp(-2 pi i (kr r / nh + kc c / nw)); c2r
computes the inverse with the 1/(nh*nw) normalisation and, as numpy's
irfft2 does, ignores the imaginary parts of the kc = 0 and kc = nw/2
columns.

One block
---------
A block transforms T consecutive planes q0 = blockIdx.x*T, ..., all of the
work in shared memory:

r2c
    1. stage: the T data planes, coalesced, into xs[pix][t] (row stride
       T + 1 floats: the writes of consecutive pixels hit distinct banks).
    2. rows: one thread per (plane, pair of data rows) packs the two real
       rows into one complex row (a + i b), runs an nw-point FFT and
       separates the two half spectra into S[r][kc][t] (S overlays xs: the
       thread reads its rows, the block synchronises, then it writes).
    3. columns: one thread per (kc, plane) runs an nh-point FFT of
       S[0..dh)[kc][t] padded with zeros and stores its nh bins; the planes
       t are consecutive threads, so every store is T consecutive complex
       values.
c2r
    1. columns: one thread per (kc, plane) loads its nh bins (T consecutive
       complex values per load), runs the inverse nh-point FFT and keeps
       the dh output rows in S[i][kc][t].
    2. rows: one thread per (plane, pair of output rows) builds the full
       nw-point spectrum of a + i b from the two half spectra, runs the
       inverse FFT, crops dw columns, scales by 1/(nh*nw) and writes
       os[pix][t] (overlaying S, after a block synchronisation).
    3. unstage: the T output planes, coalesced, written (or added) to the
       output.

The stages are __host__ __device__ functions of one item each, so a host
harness can run a block's stages in order on the CPU (the tests do).
</%doc>
<%include file="common.cuh"/>
<%!
import math


def bitrev(i, bits):
    return int(format(i, "0%db" % bits)[::-1], 2) if bits else 0


def flit(x):
    # 17 significant digits: the literal is the double, rounded once to float
    return "%.16ef" % x


def butterfly(p, q, k, m, inverse):
    """u[p], u[q] <- u[p] + w u[q], u[p] - w u[q] with w = exp(-+2 pi i k/m)."""
    b = "u[%d]" % q
    if k == 0:
        t = b
    elif 4 * k == m:  # w = -i (forward) or i (inverse)
        t = ("make_float2(-%s.y, %s.x)" if inverse else "make_float2(%s.y, -%s.x)") % (
            b,
            b,
        )
    else:
        angle = 2.0 * math.pi * k / m
        wr, wi = math.cos(angle), math.sin(angle) * (1.0 if inverse else -1.0)
        t = "fft_cmul(%s, make_float2(%s, %s))" % (b, flit(wr), flit(wi))
    return "{ const float2 t = %s; u[%d] = fft_csub(u[%d], t); u[%d] = fft_cadd(u[%d], t); }" % (
        t,
        q,
        p,
        p,
        p,
    )
%>
<%def name="fft_function(n, inverse)">
<%
    bits = n.bit_length() - 1
%>
// ${n}-point ${"inverse (unnormalised)" if inverse else "forward"} FFT of v in place:
// radix-2 decimation in time on a bit-reversed copy, unrolled
__host__ __device__ __forceinline__ void fft${n}_${"inv" if inverse else "fwd"}(float2 (&v)[${n}])
{
    float2 u[${n}];
% for i in range(n):
    u[${i}] = v[${bitrev(i, bits)}];
% endfor
% for s in range(1, bits + 1):
<% m = 1 << s %>
% for j in range(0, n, m):
% for k in range(m // 2):
    ${butterfly(j + k, j + k + m // 2, k, m, inverse)}
% endfor
% endfor
% endfor
% for i in range(n):
    v[${i}] = u[${i}];
% endfor
}
</%def>
<%
    NC = nw // 2 + 1
    T = planes
    PIX = dh * dw
    ROWS = (dh + 1) // 2
    ROW_ITEMS = T * ROWS
    COL_ITEMS = T * NC
    SCALE = 1.0 / (nh * nw)
%>
#ifdef __CUDA_ARCH__
#define FFT_LDG(p) __ldg(p)
#else
#define FFT_LDG(p) (*(p))
#endif

__host__ __device__ __forceinline__ float2 fft_cadd(float2 a, float2 b)
{
    return make_float2(a.x + b.x, a.y + b.y);
}
__host__ __device__ __forceinline__ float2 fft_csub(float2 a, float2 b)
{
    return make_float2(a.x - b.x, a.y - b.y);
}
__host__ __device__ __forceinline__ float2 fft_cmul(float2 a, float2 b)
{
    return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}

${fft_function(nh, kind == "c2r")}
% if nw != nh:
${fft_function(nw, kind == "c2r")}
% endif

// Element offset of plane q's data: (fast*fast_step + slow*slow_step)*dh*dw.
__host__ __device__ __forceinline__ index_t fft_plane_base(
    index_t q, index_t n_fast, index_t fast_step, index_t slow_step)
{
    const index_t slow = q / n_fast;
    const index_t fast = q - slow * n_fast;
    return (fast * fast_step + slow * slow_step) * ${PIX};
}

% if kind == "r2c":
// stage 1, item i < T*dh*dw: pixel i % (dh*dw) of the block's plane i / (dh*dw)
__host__ __device__ __forceinline__ void r2c_stage(
    const float* __restrict__ src, float* __restrict__ xs, const index_t* base,
    int i, index_t q0, index_t Q)
{
    const int t = i / ${PIX};
    const int pix = i - t * ${PIX};
    float val = 0.0f;
    if (q0 + t < Q) val = FFT_LDG(src + base[t] + pix);
    xs[pix * ${T + 1} + t] = val;
}

// stage 2, item < T*ceil(dh/2): data rows 2p, 2p+1 of plane t (t = item % T,
// p = item / T) as one complex row, transformed
__host__ __device__ __forceinline__ void r2c_rows(
    const float* __restrict__ xs, int item, float2 (&v)[${nw}])
{
    const int t = item % ${T};
    const int ra = 2 * (item / ${T});
    const bool has_b = ra + 1 < ${dh};
#pragma unroll
    for (int j = 0; j < ${nw}; ++j) {
        float a = 0.0f, b = 0.0f;
        if (j < ${dw}) {
            a = xs[(ra * ${dw} + j) * ${T + 1} + t];
            if (has_b) b = xs[((ra + 1) * ${dw} + j) * ${T + 1} + t];
        }
        v[j] = make_float2(a, b);
    }
    fft${nw}_fwd(v);
}

// stage 2, after the block synchronised: the two rows' half spectra
// A = (Z[k] + conj Z[-k]) / 2 and B = (Z[k] - conj Z[-k]) / 2i into S[r][kc][t]
__host__ __device__ __forceinline__ void r2c_rows_store(
    const float2 (&v)[${nw}], float2* __restrict__ S, int item)
{
    const int t = item % ${T};
    const int ra = 2 * (item / ${T});
    const bool has_b = ra + 1 < ${dh};
#pragma unroll
    for (int k = 0; k < ${NC}; ++k) {
        const float2 z = v[k];
        const float2 zm = v[(${nw} - k) % ${nw}];
        S[(ra * ${NC} + k) * ${T} + t] =
            make_float2(0.5f * (z.x + zm.x), 0.5f * (z.y - zm.y));
        if (has_b)
            S[((ra + 1) * ${NC} + k) * ${T} + t] =
                make_float2(0.5f * (z.y + zm.y), 0.5f * (zm.x - z.x));
    }
}

// stage 3, item < nc*T: column kc = item / T of plane t = item % T, all nh bins
__host__ __device__ __forceinline__ void r2c_cols(
    const float2* __restrict__ S, float2* __restrict__ spec, int item, index_t q0,
    index_t Q)
{
    const int t = item % ${T};
    const int k = item / ${T};
    float2 v[${nh}];
#pragma unroll
    for (int r = 0; r < ${nh}; ++r)
        v[r] = r < ${dh} ? S[(r * ${NC} + k) * ${T} + t] : make_float2(0.0f, 0.0f);
    fft${nh}_fwd(v);
    if (q0 + t >= Q) return;
    float2* __restrict__ dst = spec + q0 + t;
#pragma unroll
    for (int r = 0; r < ${nh}; ++r)
% if conj:
        dst[(index_t)(r * ${NC} + k) * Q] = make_float2(v[r].x, -v[r].y);
% else:
        dst[(index_t)(r * ${NC} + k) * Q] = v[r];
% endif
}

// (the declaration carries the launch bounds, the definition the name)
extern "C" __global__ void __launch_bounds__(${threads}) ${name}(
    const float* __restrict__ src, float2* __restrict__ spec,
    index_t Q, index_t n_fast, index_t fast_step, index_t slow_step);
extern "C" __global__ void ${name}(
    const float* __restrict__ src, float2* __restrict__ spec,
    index_t Q, index_t n_fast, index_t fast_step, index_t slow_step)
{
    static_assert(${ROW_ITEMS} <= ${threads}, "one row item per thread (S overlays xs)");
    extern __shared__ float4 fft_smem[];
    __shared__ index_t base[${T}];
    float* xs = reinterpret_cast<float*>(fft_smem);
    float2* S = reinterpret_cast<float2*>(fft_smem);
    const index_t q0 = (index_t)blockIdx.x * ${T};
    if (threadIdx.x < ${T} && q0 + threadIdx.x < Q)
        base[threadIdx.x] = fft_plane_base(q0 + threadIdx.x, n_fast, fast_step, slow_step);
    __syncthreads();
    for (int i = threadIdx.x; i < ${T * PIX}; i += ${threads})
        r2c_stage(src, xs, base, i, q0, Q);
    __syncthreads();
    float2 v[${nw}];
    const int item = threadIdx.x;
    if (item < ${ROW_ITEMS}) r2c_rows(xs, item, v);
    __syncthreads();
    if (item < ${ROW_ITEMS}) r2c_rows_store(v, S, item);
    __syncthreads();
    for (int it = threadIdx.x; it < ${COL_ITEMS}; it += ${threads})
        r2c_cols(S, spec, it, q0, Q);
}
% else:
// stage 1, item < nc*T: the inverse column FFT of column kc = item / T of
// plane t = item % T; output rows i < dh are transform rows (i + sh) mod nh
__host__ __device__ __forceinline__ void c2r_cols(
    const float2* __restrict__ spec, float2* __restrict__ S, int item, index_t q0,
    index_t Q)
{
    const int t = item % ${T};
    const int k = item / ${T};
    float2 v[${nh}];
    const bool live = q0 + t < Q;
    const float2* __restrict__ src = spec + q0 + t;
#pragma unroll
    for (int r = 0; r < ${nh}; ++r)
        v[r] = live ? FFT_LDG(src + (index_t)(r * ${NC} + k) * Q) : make_float2(0.0f, 0.0f);
    fft${nh}_inv(v);
#pragma unroll
    for (int i = 0; i < ${dh}; ++i)
        S[(i * ${NC} + k) * ${T} + t] = v[(i + ${sh}) % ${nh}];
}

// stage 2, item < T*ceil(dh/2): output rows 2p, 2p+1 of plane t as one
// complex row a + i b, whose spectrum is A + iB (k <= nw/2) and
// conj(A) + i conj(B) at nw - k; inverse transformed
__host__ __device__ __forceinline__ void c2r_rows(
    const float2* __restrict__ S, int item, float2 (&v)[${nw}])
{
    const int t = item % ${T};
    const int ra = 2 * (item / ${T});
    const bool has_b = ra + 1 < ${dh};
#pragma unroll
    for (int k = 0; k < ${NC}; ++k) {
        float2 a = S[(ra * ${NC} + k) * ${T} + t];
        float2 b = has_b ? S[((ra + 1) * ${NC} + k) * ${T} + t] : make_float2(0.0f, 0.0f);
        if (k == 0 || 2 * k == ${nw}) {
            a.y = 0.0f;  // the spectra of real rows are real there
            b.y = 0.0f;
        }
        v[k] = make_float2(a.x - b.y, a.y + b.x);
        if (k > 0 && 2 * k < ${nw}) v[${nw} - k] = make_float2(a.x + b.y, b.x - a.y);
    }
    fft${nw}_inv(v);
}

// stage 2, after the block synchronised: columns j < dw (transform columns
// (j + sw) mod nw), scaled, into os[pix][t]
__host__ __device__ __forceinline__ void c2r_rows_store(
    const float2 (&v)[${nw}], float* __restrict__ os, int item)
{
    const int t = item % ${T};
    const int ra = 2 * (item / ${T});
    const bool has_b = ra + 1 < ${dh};
#pragma unroll
    for (int j = 0; j < ${dw}; ++j) {
        const float2 z = v[(j + ${sw}) % ${nw}];
        os[(ra * ${dw} + j) * ${T + 1} + t] = z.x * ${flit(SCALE)};
        if (has_b) os[((ra + 1) * ${dw} + j) * ${T + 1} + t] = z.y * ${flit(SCALE)};
    }
}

// stage 3, item i < T*dh*dw: pixel i % (dh*dw) of the block's plane i / (dh*dw)
__host__ __device__ __forceinline__ void c2r_unstage(
    const float* __restrict__ os, float* __restrict__ dst, const index_t* base,
    int i, index_t q0, index_t Q)
{
    const int t = i / ${PIX};
    const int pix = i - t * ${PIX};
    if (q0 + t >= Q) return;
    const float val = os[pix * ${T + 1} + t];
% if accumulate:
    dst[base[t] + pix] += val;
% else:
    dst[base[t] + pix] = val;
% endif
}

extern "C" __global__ void __launch_bounds__(${threads}) ${name}(
    const float2* __restrict__ spec, float* __restrict__ dst,
    index_t Q, index_t n_fast, index_t fast_step, index_t slow_step);
extern "C" __global__ void ${name}(
    const float2* __restrict__ spec, float* __restrict__ dst,
    index_t Q, index_t n_fast, index_t fast_step, index_t slow_step)
{
    static_assert(${ROW_ITEMS} <= ${threads}, "one row item per thread (os overlays S)");
    extern __shared__ float4 fft_smem[];
    __shared__ index_t base[${T}];
    float2* S = reinterpret_cast<float2*>(fft_smem);
    float* os = reinterpret_cast<float*>(fft_smem);
    const index_t q0 = (index_t)blockIdx.x * ${T};
    if (threadIdx.x < ${T} && q0 + threadIdx.x < Q)
        base[threadIdx.x] = fft_plane_base(q0 + threadIdx.x, n_fast, fast_step, slow_step);
    for (int it = threadIdx.x; it < ${COL_ITEMS}; it += ${threads})
        c2r_cols(spec, S, it, q0, Q);
    __syncthreads();
    float2 v[${nw}];
    const int item = threadIdx.x;
    if (item < ${ROW_ITEMS}) c2r_rows(S, item, v);
    __syncthreads();
    if (item < ${ROW_ITEMS}) c2r_rows_store(v, os, item);
    __syncthreads();
    for (int i = threadIdx.x; i < ${T * PIX}; i += ${threads})
        c2r_unstage(os, dst, base, i, q0, Q);
}
% endif
