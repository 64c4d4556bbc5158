<%doc>
Max and average pooling of bc01 images, cuda-convnet2's window rule.

Constants: name (kernel name), kind ("max_fwd", "max_grad", "max_gradgrad",
"avg_fwd", "avg_grad"), sy, sx (window rows, cols), ty, tx (stride), oy, ox
(start: the position of window 0, may be negative), dtype ("float32" or
"float64"), wide (bool: 64-bit element indices, else 32-bit unsigned).

Every kernel takes (planes = B*C, H, W, Ho, Wo) and walks its elements with a
grid-stride loop over a flat C-order index; consecutive threads take
consecutive columns, so loads and stores are coalesced along W.

The *_plane kinds ("max_fwd_plane", "avg_fwd_plane", "max_grad_plane") are
used when a plane fits in shared memory: a block takes `ppb` whole planes,
copies them in with 16-byte loads where aligned (each input element read
from memory once), and works from shared memory. The forward plane kernels
are specialised on the geometry too (extra constants H, W, Ho, Wo, ppb, vec:
16 for 16-byte copies, else the element size, threads) and run persistent
blocks that double-buffer: the next group of planes is copied in with
cp.async while the current one is pooled, and take only (x, y, planes).
The max gradient first
finds each window's first maximum (one scan per window, not per pixel) and
then lets every pixel gather from the windows that chose it, in the same
order as the per-pixel kernel (bit-identical sums).
Window o along an axis covers [start + o*stride, start + o*stride + size)
clipped to [0, L); the host side computed (Ho, Wo) with cc2ops.shapes.

Forward kernels: one thread per output. Gradient kernels use the gather
formulation: one thread per input pixel loops over the windows that cover it
(no atomics, deterministic summation order). The max gradient goes to the
first pixel (row-major within the clipped window) equal to y: a pixel equal
to its window's y scans the window's earlier taps, which happens about once
per window.
</%doc>
<%include file="common.cuh"/>
<%include file="async_copy.cuh"/>
<%
T = dtype
I = "index_t" if wide else "unsigned int"
%>
typedef ${T} T;
typedef ${I} I;

__device__ __forceinline__ float cc2_neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double cc2_neg_inf(double) { return __longlong_as_double(0xfff0000000000000ULL); }

// floor(a / b) for b > 0 and any sign of a
__device__ __forceinline__ int cc2_floordiv(int a, int b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// dst[0, n) = src[0, n) by the whole block; 16-byte loads where src is
// aligned (dst, shared memory, always is), the tail element by element
__device__ __forceinline__ void cc2_copy_in(T* dst, const T* __restrict__ src, int n)
{
    int done = 0;
    if ((reinterpret_cast<size_t>(src) & 15) == 0) {
        const int n4 = (int)((n * sizeof(T)) / 16);
        const uint4* __restrict__ s4 = reinterpret_cast<const uint4*>(src);
        uint4* d4 = reinterpret_cast<uint4*>(dst);
#pragma unroll 4
        for (int i = threadIdx.x; i < n4; i += blockDim.x) d4[i] = __ldg(s4 + i);
        done = (int)(n4 * 16 / sizeof(T));
    }
    for (int i = done + threadIdx.x; i < n; i += blockDim.x) dst[i] = cc2_ldg(src + i);
}

<%def name="window_loop(load, op)">\
        // over the window at (r0, c0) clipped to the image: m = max (a NaN
        // pixel makes it NaN, numpy's maximum) or sum of ${load}
#pragma unroll
        for (int dy = 0; dy < ${sy}; ++dy) {
            const int r = r0 + dy;
            if (r < 0 || r >= H) continue;
#pragma unroll
            for (int dx = 0; dx < ${sx}; ++dx) {
                const int c = c0 + dx;
                if (c < 0 || c >= W) continue;
                const T v = ${load};
% if op == "max":
                m = (v > m || v != v) ? v : m;
% else:
                m += v;
% endif
            }
        }\
</%def>
<%def name="covering_windows()">\
        // the windows o with start + o*stride <= pixel < start + o*stride + size
        const int ho_lo = max(cc2_floordiv(r - ${oy} - ${sy}, ${ty}) + 1, 0);
        const int ho_hi = min(cc2_floordiv(r - ${oy}, ${ty}), Ho - 1);
        const int wo_lo = max(cc2_floordiv(c - ${ox} - ${sx}, ${tx}) + 1, 0);
        const int wo_hi = min(cc2_floordiv(c - ${ox}, ${tx}), Wo - 1);\
</%def>
% if kind == "max_fwd":
extern "C" __global__ void ${name}(
    const T* __restrict__ x, T* __restrict__ y, I planes, int H, int W, int Ho, int Wo)
{
    const I n = planes * (I)Ho * (I)Wo;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        const int wo = (int)(i % (I)Wo);
        const I t = i / (I)Wo;
        const int ho = (int)(t % (I)Ho);
        const I p = t / (I)Ho;
        const T* __restrict__ xp = x + p * (I)H * (I)W;
        const int r0 = ho * ${ty} + ${oy};
        const int c0 = wo * ${tx} + ${ox};
        // -inf never beats a real pixel and every clipped window holds one
        T m = cc2_neg_inf(T(0));
${window_loop("cc2_ldg(xp + r * W + c)", "max")}
        y[i] = m;
    }
}
% elif kind == "max_grad":
extern "C" __global__ void ${name}(
    const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ gy,
    T* __restrict__ gx, I planes, int H, int W, int Ho, int Wo)
{
    const I n = planes * (I)H * (I)W;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        const int c = (int)(i % (I)W);
        const I t = i / (I)W;
        const int r = (int)(t % (I)H);
        const I p = t / (I)H;
        const T* __restrict__ xp = x + p * (I)H * (I)W;
        const T* __restrict__ yp = y + p * (I)Ho * (I)Wo;
        const T* __restrict__ gp = gy + p * (I)Ho * (I)Wo;
        const T xv = cc2_ldg(x + i);
${covering_windows()}
        T acc = T(0);
        for (int ho = ho_lo; ho <= ho_hi; ++ho) {
            for (int wo = wo_lo; wo <= wo_hi; ++wo) {
                const int o = ho * Wo + wo;
                const T yv = cc2_ldg(yp + o);
                if (!(xv == yv)) continue;
                // first maximum? scan the window's taps before (r, c)
                const int rs = max(ho * ${ty} + ${oy}, 0);
                const int cs = max(wo * ${tx} + ${ox}, 0);
                const int ce = min(wo * ${tx} + ${ox} + ${sx}, W);
                bool first = true;
                for (int rr = rs; rr <= r && first; ++rr) {
                    const int cend = rr < r ? ce : c;
                    for (int cc = cs; cc < cend; ++cc) {
                        if (cc2_ldg(xp + rr * W + cc) == yv) { first = false; break; }
                    }
                }
                if (first) acc += cc2_ldg(gp + o);
            }
        }
        gx[i] = acc;
    }
}
% elif kind == "max_gradgrad":
extern "C" __global__ void ${name}(
    const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ ggx,
    T* __restrict__ ggy, I planes, int H, int W, int Ho, int Wo)
{
    const I n = planes * (I)Ho * (I)Wo;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        const int wo = (int)(i % (I)Wo);
        const I t = i / (I)Wo;
        const int ho = (int)(t % (I)Ho);
        const I p = t / (I)Ho;
        const I base = p * (I)H * (I)W;
        const int r0 = ho * ${ty} + ${oy};
        const int c0 = wo * ${tx} + ${ox};
        const T yv = cc2_ldg(y + i);
        T out = T(0);
        bool found = false;
#pragma unroll
        for (int dy = 0; dy < ${sy}; ++dy) {
            const int r = r0 + dy;
            if (r < 0 || r >= H) continue;
#pragma unroll
            for (int dx = 0; dx < ${sx}; ++dx) {
                const int c = c0 + dx;
                if (c < 0 || c >= W) continue;
                const I off = base + (I)(r * W + c);
                if (!found && cc2_ldg(x + off) == yv) {
                    out = cc2_ldg(ggx + off);
                    found = true;
                }
            }
        }
        ggy[i] = out;
    }
}
% elif kind == "avg_fwd":
extern "C" __global__ void ${name}(
    const T* __restrict__ x, T* __restrict__ y, I planes, int H, int W, int Ho, int Wo)
{
    const I n = planes * (I)Ho * (I)Wo;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        const int wo = (int)(i % (I)Wo);
        const I t = i / (I)Wo;
        const int ho = (int)(t % (I)Ho);
        const I p = t / (I)Ho;
        const T* __restrict__ xp = x + p * (I)H * (I)W;
        const int r0 = ho * ${ty} + ${oy};
        const int c0 = wo * ${tx} + ${ox};
        T m = T(0);
${window_loop("cc2_ldg(xp + r * W + c)", "sum")}
        // the clipped window's pixel count
        const int rows = min(r0 + ${sy}, H) - max(r0, 0);
        const int cols = min(c0 + ${sx}, W) - max(c0, 0);
        y[i] = m / (T)(rows * cols);
    }
}
% elif kind == "avg_grad":
extern "C" __global__ void ${name}(
    const T* __restrict__ gy, T* __restrict__ gx, I planes, int H, int W, int Ho, int Wo)
{
    const I n = planes * (I)H * (I)W;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        const int c = (int)(i % (I)W);
        const I t = i / (I)W;
        const int r = (int)(t % (I)H);
        const I p = t / (I)H;
        const T* __restrict__ gp = gy + p * (I)Ho * (I)Wo;
${covering_windows()}
        T acc = T(0);
        for (int ho = ho_lo; ho <= ho_hi; ++ho) {
            const int r0 = ho * ${ty} + ${oy};
            const int rows = min(r0 + ${sy}, H) - max(r0, 0);
            for (int wo = wo_lo; wo <= wo_hi; ++wo) {
                const int c0 = wo * ${tx} + ${ox};
                const int cols = min(c0 + ${sx}, W) - max(c0, 0);
                acc += cc2_ldg(gp + ho * Wo + wo) / (T)(rows * cols);
            }
        }
        gx[i] = acc;
    }
}
% elif kind in ("max_fwd_plane", "avg_fwd_plane"):
<%
# geometry constants exist only for these kinds (strict undefined names)
GH, GW, GHO, GWO = (context.get(k) for k in ("H", "W", "Ho", "Wo"))
ppb, vec, threads = (context.get(k) for k in ("ppb", "vec", "threads"))
HW = GH * GW
HOWO = GHO * GWO
CHUNK = ppb * HW
ISZ = 4 if dtype == "float32" else 8
# each buffer starts 16-byte aligned
CHUNK_PAD = -(-CHUNK * ISZ // 16) * 16 // ISZ
%>
// Copies n elements (a group's planes) from src into buf with cp.async:
// 16-byte pieces when vec == 16 (the host checked that every group starts
// 16-byte aligned), element-sized pieces otherwise.
__device__ __forceinline__ void cc2_stage(T* buf, const T* __restrict__ src, int n)
{
% if vec == 16:
    constexpr int PER = 16 / sizeof(T);
    const int n16 = n / PER;
#pragma unroll 4
    for (int i = threadIdx.x; i < n16; i += ${threads}) cc2_cp_async<16>(buf + i * PER, src + i * PER);
    for (int i = n16 * PER + threadIdx.x; i < n; i += ${threads}) cc2_cp_async<sizeof(T)>(buf + i, src + i);
% else:
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += ${threads}) cc2_cp_async<sizeof(T)>(buf + i, src + i);
% endif
}

// Persistent blocks over groups of ${ppb} whole ${GH}x${GW} planes: group
// g + gridDim.x is copied into one shared buffer while group g is pooled
// from the other, so every block keeps a group's loads in flight while it
// computes. Geometry is compile-time (divisions by Wo, Ho*Wo are multiplies).
extern "C" __global__ void __launch_bounds__(${threads}) ${name}(
    const T* __restrict__ x, T* __restrict__ y, index_t planes);
extern "C" __global__ void ${name}(
    const T* __restrict__ x, T* __restrict__ y, index_t planes)
{
    extern __shared__ uint4 cc2_smem4[];
    T* const bufs = reinterpret_cast<T*>(cc2_smem4);
    const index_t groups = (planes + ${ppb} - 1) / ${ppb};
    index_t g = blockIdx.x;
    if (g >= groups) return;  // the whole block
    cc2_stage(bufs, x + g * ${CHUNK}, (int)min((index_t)${ppb}, planes - g * ${ppb}) * ${HW});
    cc2_cp_async_commit();
    for (int it = 0; g < groups; g += gridDim.x, ++it) {
        const T* cur = bufs + (it & 1) * ${CHUNK_PAD};
        const index_t gn = g + gridDim.x;
        if (gn < groups)
            cc2_stage(bufs + ((it + 1) & 1) * ${CHUNK_PAD}, x + gn * ${CHUNK},
                      (int)min((index_t)${ppb}, planes - gn * ${ppb}) * ${HW});
        cc2_cp_async_commit();  // possibly empty: one group per iteration
        cc2_cp_async_wait<1>();  // group g's copies (this thread's) have landed
        __syncthreads();         // ... and every other thread's
        const int n_out = (int)min((index_t)${ppb}, planes - g * ${ppb}) * ${HOWO};
        T* __restrict__ yb = y + g * ${ppb * HOWO};
        for (int o = threadIdx.x; o < n_out; o += ${threads}) {
            const int q = o / ${HOWO};
            const int rest = o - q * ${HOWO};
            const int ho = rest / ${GWO};
            const int wo = rest - ho * ${GWO};
            const T* xp = cur + q * ${HW};
            const int r0 = ho * ${ty} + ${oy};
            const int c0 = wo * ${tx} + ${ox};
            constexpr int H = ${GH}, W = ${GW};
% if kind == "max_fwd_plane":
            T m = cc2_neg_inf(T(0));
% else:
            T m = T(0);
% endif
${window_loop("xp[r * W + c]", "max" if kind == "max_fwd_plane" else "sum")}
% if kind == "max_fwd_plane":
            yb[o] = m;
% else:
            const int rows = min(r0 + ${sy}, H) - max(r0, 0);
            const int cols = min(c0 + ${sx}, W) - max(c0, 0);
            yb[o] = m / (T)(rows * cols);
% endif
        }
        __syncthreads();  // the buffer just read is the next iteration's target
    }
}
% elif kind == "max_grad_plane":
// shared memory: x planes [np*HW], y and gy [np*HoWo] each, then the
// windows' chosen pixel (int, -1 for none) [np*HoWo]
extern "C" __global__ void ${name}(
    const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ gy,
    T* __restrict__ gx, index_t planes, int H, int W, int Ho, int Wo, int ppb)
{
    extern __shared__ uint4 cc2_smem4[];
    const index_t p0 = (index_t)blockIdx.x * ppb;
    const int np = (int)min((index_t)ppb, planes - p0);
    const int HW = H * W;
    const int HoWo = Ho * Wo;
    // offsets in whole 16-byte units so each array stays 16-byte aligned
    const int pad_in = (ppb * HW * (int)sizeof(T) + 15) / 16;
    const int pad_out = (ppb * HoWo * (int)sizeof(T) + 15) / 16;
    T* sx = reinterpret_cast<T*>(cc2_smem4);
    T* sy = reinterpret_cast<T*>(cc2_smem4 + pad_in);
    T* sg = reinterpret_cast<T*>(cc2_smem4 + pad_in + pad_out);
    int* sarg = reinterpret_cast<int*>(cc2_smem4 + pad_in + 2 * pad_out);
    cc2_copy_in(sx, x + p0 * HW, np * HW);
    cc2_copy_in(sy, y + p0 * HoWo, np * HoWo);
    cc2_copy_in(sg, gy + p0 * HoWo, np * HoWo);
    __syncthreads();
    const int n_out = np * HoWo;
    for (int o = threadIdx.x; o < n_out; o += blockDim.x) {
        const int q = o / HoWo;
        const int rest = o - q * HoWo;
        const int ho = rest / Wo;
        const int wo = rest - ho * Wo;
        const int rs = max(ho * ${ty} + ${oy}, 0);
        const int re = min(ho * ${ty} + ${oy} + ${sy}, H);
        const int cs = max(wo * ${tx} + ${ox}, 0);
        const int ce = min(wo * ${tx} + ${ox} + ${sx}, W);
        const T yv = sy[o];
        int arg = -1;
        for (int r = rs; r < re && arg < 0; ++r)
            for (int c = cs; c < ce; ++c)
                if (sx[q * HW + r * W + c] == yv) { arg = q * HW + r * W + c; break; }
        sarg[o] = arg;
    }
    __syncthreads();
    T* __restrict__ gb = gx + p0 * HW;
    const int n_in = np * HW;
    for (int e = threadIdx.x; e < n_in; e += blockDim.x) {
        const int q = e / HW;
        const int pix = e - q * HW;
        const int r = pix / W;
        const int c = pix - r * W;
${covering_windows()}
        T acc = T(0);
        for (int ho = ho_lo; ho <= ho_hi; ++ho)
            for (int wo = wo_lo; wo <= wo_hi; ++wo) {
                const int o = q * HoWo + ho * Wo + wo;
                if (sarg[o] == e) acc += sg[o];
            }
        gb[e] = acc;
    }
}
% else:
#error "pool.cu: unknown kind ${kind}"
% endif
