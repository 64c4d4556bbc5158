<%doc>
Row softmax family, one thread block per row (grid-stride over rows).

Constants: name, op ("softmax", "log_softmax" or "softmax_grad"), dtype
("float32" or "float64"), block (threads per block, a multiple of 32, <= 1024).

A "row" is the n elements along the reduced axis of a C-contiguous array
viewed as (outer, n, inner): row r starts at (r / inner) * n * inner +
r % inner and steps by inner. Stable: the row maximum is subtracted before
exp. softmax_grad takes (dy, y) and writes dx = (dy - sum(dy * y)) * y.
Accumulation is in the element type (sums of exp(x - max) <= n).
</%doc>
<%include file="common.cuh"/>
<% T = dtype %>
__device__ __forceinline__ float cc2_exp(float v) { return expf(v); }
__device__ __forceinline__ double cc2_exp(double v) { return exp(v); }
__device__ __forceinline__ float cc2_log(float v) { return logf(v); }
__device__ __forceinline__ double cc2_log(double v) { return log(v); }

// all threads of the block get the reduction; `sh` holds >= 32 values
template <typename T, bool IsMax>
__device__ __forceinline__ T cc2_block_reduce(T v, T* sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = IsMax ? (w > v ? w : v) : v + w;
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    __syncthreads();  // sh may still be read by the previous reduction
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    const int nwarps = (blockDim.x + 31) >> 5;
    v = lane < nwarps ? sh[lane] : (IsMax ? -INFINITY : (T)0);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = IsMax ? (w > v ? w : v) : v + w;
    }
    return v;
}

extern "C" __global__ void ${name}(
% if op == "softmax_grad":
    const ${T}* __restrict__ dy,
% endif
    const ${T}* __restrict__ x, ${T}* __restrict__ out,
    index_t nrows, index_t n, index_t inner)
{
    __shared__ ${T} sh[32];
    for (index_t row = blockIdx.x; row < nrows; row += gridDim.x) {
        const index_t base = (row / inner) * n * inner + row % inner;
        const ${T}* xr = x + base;
        ${T}* outr = out + base;
% if op == "softmax_grad":
        const ${T}* dyr = dy + base;
        ${T} s = 0;
        for (index_t i = threadIdx.x; i < n; i += ${block}) s += dyr[i * inner] * xr[i * inner];
        s = cc2_block_reduce<${T}, false>(s, sh);
        for (index_t i = threadIdx.x; i < n; i += ${block})
            outr[i * inner] = (dyr[i * inner] - s) * xr[i * inner];
% else:
        ${T} m = -INFINITY;
        for (index_t i = threadIdx.x; i < n; i += ${block}) {
            const ${T} v = xr[i * inner];
            m = v > m ? v : m;
        }
        m = cc2_block_reduce<${T}, true>(m, sh);
        ${T} s = 0;
        for (index_t i = threadIdx.x; i < n; i += ${block}) s += cc2_exp(xr[i * inner] - m);
        s = cc2_block_reduce<${T}, false>(s, sh);
%   if op == "softmax":
        const ${T} r = (${T})1 / s;
        for (index_t i = threadIdx.x; i < n; i += ${block})
            outr[i * inner] = cc2_exp(xr[i * inner] - m) * r;
%   else:
        // (x - m) - log(s), not x - (m + log(s)): m + log(s) would round to
        // m's ulp, an absolute error that swamps results near 0
        const ${T} ls = cc2_log(s);
        for (index_t i = threadIdx.x; i < n; i += ${block})
            outr[i * inner] = (xr[i * inner] - m) - ls;
%   endif
% endif
        // the next row's first reduction rewrites sh only after a barrier
    }
}
