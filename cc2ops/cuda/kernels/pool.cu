<%doc>
Max and average pooling of bc01 images, cuda-convnet2's window rule.

Constants: name (kernel name), kind ("max_fwd", "max_grad", "max_gradgrad",
"avg_fwd", "avg_grad"), sy, sx (window rows, cols), ty, tx (stride), oy, ox
(start: the position of window 0, may be negative), dtype ("float32" or
"float64"), wide (bool: 64-bit element indices, else 32-bit unsigned).

Every kernel takes (planes = B*C, H, W, Ho, Wo) and walks its elements with a
grid-stride loop over a flat C-order index; consecutive threads take
consecutive columns, so loads and stores are coalesced along W.
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
        // -inf never beats a real pixel and every clipped window holds one;
        // a NaN pixel makes the window NaN (numpy's maximum)
        T m = cc2_neg_inf(T(0));
#pragma unroll
        for (int dy = 0; dy < ${sy}; ++dy) {
            const int r = r0 + dy;
            if (r < 0 || r >= H) continue;
#pragma unroll
            for (int dx = 0; dx < ${sx}; ++dx) {
                const int c = c0 + dx;
                if (c < 0 || c >= W) continue;
                const T v = cc2_ldg(xp + r * W + c);
                m = (v > m || v != v) ? v : m;
            }
        }
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
        // windows o with start + o*stride <= r < start + o*stride + size
        const int ho_lo = max(cc2_floordiv(r - ${oy} - ${sy}, ${ty}) + 1, 0);
        const int ho_hi = min(cc2_floordiv(r - ${oy}, ${ty}), Ho - 1);
        const int wo_lo = max(cc2_floordiv(c - ${ox} - ${sx}, ${tx}) + 1, 0);
        const int wo_hi = min(cc2_floordiv(c - ${ox}, ${tx}), Wo - 1);
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
        T acc = T(0);
#pragma unroll
        for (int dy = 0; dy < ${sy}; ++dy) {
            const int r = r0 + dy;
            if (r < 0 || r >= H) continue;
#pragma unroll
            for (int dx = 0; dx < ${sx}; ++dx) {
                const int c = c0 + dx;
                if (c < 0 || c >= W) continue;
                acc += cc2_ldg(xp + r * W + c);
            }
        }
        // the clipped window's pixel count
        const int rows = min(r0 + ${sy}, H) - max(r0, 0);
        const int cols = min(c0 + ${sx}, W) - max(c0, 0);
        y[i] = acc / (T)(rows * cols);
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
        const int ho_lo = max(cc2_floordiv(r - ${oy} - ${sy}, ${ty}) + 1, 0);
        const int ho_hi = min(cc2_floordiv(r - ${oy}, ${ty}), Ho - 1);
        const int wo_lo = max(cc2_floordiv(c - ${ox} - ${sx}, ${tx}) + 1, 0);
        const int wo_hi = min(cc2_floordiv(c - ${ox}, ${tx}), Wo - 1);
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
% else:
#error "pool.cu: unknown kind ${kind}"
% endif
