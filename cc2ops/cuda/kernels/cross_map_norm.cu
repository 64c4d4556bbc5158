<%doc>
Cross-map response normalisation of bc01 images (cuda-convnet2's cmrnorm).

Constants: name, kind ("fwd" or "grad"), size (window, 1..MAX_SIZE), channels
(C), blocked (bool), dtype ("float32"/"float64"), wide (64-bit indices),
chunk (channels per thread of the overlapping kernels; C when blocked).

    d_c = k + (alpha/size) * sum_{c' in W(c)} x_{c'}^2,   y_c = x_c d_c^-beta
    gx_j = gy_j d_j^-beta - (2 alpha beta/size) x_j sum_{c: j in W(c)} gy_c x_c d_c^(-beta-1)

One thread per (b, h, w) column and chunk of `chunk` channels walks its
channels; consecutive threads take consecutive columns (w), so every load
and store is coalesced along W, and the chunks multiply the threads of
layers with few columns (192x27x27 at batch 128: 93k columns, 1.1M threads
with chunks of 16). A chunk also reads its window's halo (size - 1
neighbouring channels, L2 hits). The forward loads its chunk and halo into
registers before any arithmetic, so all its loads are in flight at once; the
gradient keeps register rings (the ring slot of a channel is known at
compile time because the channel loop is unrolled). Each window sum is
summed afresh (size multiply-adds, in the data's dtype: fp32 for float32,
fp64 for float64): a sliding add/subtract sum would drift, this one is exact
up to the rounding of a direct sum. float32 powers go through the hardware's
log2/exp2 (see cc2_pow).

The gradient recomputes d (and d^-beta) from x in the same sliding way, one
step ahead of the output channel: at step c it forms q_c = gy_c x_c d_c^-beta
/ d_c and writes gx_j for j = c - size//2, whose transposed window
[j - (size-1)//2, j + size//2] = [c - size + 1, c] is exactly the q ring.
Blocked mode (non-overlapping groups of `size` channels) loads one group at
a time; a group is its own transposed window.
</%doc>
<%include file="common.cuh"/>
<%
T = dtype
I = "index_t" if wide else "unsigned int"
A = size // 2           # channels before c in its window
F = (size - 1) // 2     # channels after c
U = size * max(1, (8 + size - 1) // size)   # blocked unroll: a multiple of size
C = channels
CH = chunk
NCH = (C + CH - 1) // CH
%>
typedef ${T} T;
typedef ${I} I;

// a^b for a >= k > 0 (the denominators): float32 through the hardware's
// log2/exp2 (relative error about 3e-7 here, 2 instructions on the special
// function unit instead of powf's ~40); float64 exact
__device__ __forceinline__ float cc2_pow(float a, float b) { return exp2f(b * __log2f(a)); }
__device__ __forceinline__ double cc2_pow(double a, double b) { return pow(a, b); }

<%def name="chunk_loop()">\
    // thread t: column t % columns (consecutive threads, consecutive w), chunk
    // t / columns of CH channels starting at c0; base is (b, 0, h, w)
    const I total = columns * (I)${NCH};
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (I)gridDim.x * blockDim.x) {
        const int c0 = (int)(t / columns) * ${CH};
        const I col = t - (I)(c0 / ${CH}) * columns;
        const I b = col / (I)hw;
        const I base = b * (I)${C} * (I)hw + (col - b * (I)hw);\
</%def>
% if kind == "fwd" and not blocked:
extern "C" __global__ void ${name}(
    const T* __restrict__ x, T* __restrict__ y, I columns, int hw,
    T k, T alpha_over_size, T neg_beta)
{
${chunk_loop()}
        const T* __restrict__ xp = x + base;
        T* __restrict__ yp = y + base;
        // v[e] is channel c0 - A + e: the chunk and its halo, all loaded before
        // any arithmetic (every load in flight at once); channel c0 + j's
        // window [c0 + j - A, c0 + j + F] is v[j .. j + size - 1]
        T v[${CH + size - 1}];
#pragma unroll
        for (int e = 0; e < ${CH + size - 1}; ++e) {
            const int cc = c0 - ${A} + e;
            v[e] = (cc >= 0 && cc < ${C}) ? cc2_ldg(xp + (I)cc * (I)hw) : T(0);
        }
#pragma unroll
        for (int j = 0; j < ${CH}; ++j) {
            const int c = c0 + j;
            if (c < ${C}) {
                T sum = T(0);
#pragma unroll
                for (int s = 0; s < ${size}; ++s) sum += v[j + s] * v[j + s];
                const T p = cc2_pow(k + alpha_over_size * sum, neg_beta);
                yp[(I)c * (I)hw] = v[j + ${A}] * p;
            }
        }
    }
}
% elif kind == "fwd":
extern "C" __global__ void ${name}(
    const T* __restrict__ x, T* __restrict__ y, I columns, int hw,
    T k, T alpha_over_size, T neg_beta)
{
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < columns; t += (I)gridDim.x * blockDim.x) {
        const I b = t / (I)hw;
        const I base = b * (I)${C} * (I)hw + (t - b * (I)hw);
        const T* __restrict__ xp = x + base;
        T* __restrict__ yp = y + base;
#pragma unroll 2
        for (int lo = 0; lo < ${C}; lo += ${size}) {
            T v[${size}];
            T sum = T(0);
#pragma unroll
            for (int j = 0; j < ${size}; ++j) {
                v[j] = (lo + j < ${C}) ? cc2_ldg(xp + (I)(lo + j) * (I)hw) : T(0);
                sum += v[j] * v[j];
            }
            const T p = cc2_pow(k + alpha_over_size * sum, neg_beta);
#pragma unroll
            for (int j = 0; j < ${size}; ++j) {
                if (lo + j < ${C}) yp[(I)(lo + j) * (I)hw] = v[j] * p;
            }
        }
    }
}
% elif kind == "grad" and not blocked:
extern "C" __global__ void ${name}(
    const T* __restrict__ x, const T* __restrict__ gy, T* __restrict__ gx,
    I columns, int hw, T k, T alpha_over_size, T neg_beta, T coef)
{
${chunk_loop()}
        const T* __restrict__ xp = x + base;
        const T* __restrict__ gp = gy + base;
        T* __restrict__ op = gx + base;
        // step s handles channel c = c0 - F + s: it forms q_c = gy_c x_c p_c / d_c
        // (p = d^-beta) and writes gx for jo = c - A once s >= size - 1, whose
        // transposed window [jo - F, jo + A] = [c - size + 1, c] is the q ring.
        // x ring: slot e % size holds channel c0 - F - A + e (step s: e = s ..
        // s + size - 1, the window of c); g, p, q rings: slot s % size.
        T xr[${size}], gr[${size}], pr[${size}], qr[${size}];
#pragma unroll
        for (int s = 0; s < ${size}; ++s) {
            xr[s] = T(0); gr[s] = T(0); pr[s] = T(0); qr[s] = T(0);
        }
#pragma unroll
        for (int e = 0; e < ${size - 1}; ++e) {
            const int cc = c0 - ${F + A} + e;
            xr[e] = (cc >= 0 && cc < ${C}) ? cc2_ldg(xp + (I)cc * (I)hw) : T(0);
        }
#pragma unroll
        for (int s = 0; s < ${CH + size - 1}; ++s) {
            const int c = c0 - ${F} + s;
            const int r = c + ${F};
            xr[(s + ${size - 1}) % ${size}] = (r >= 0 && r < ${C}) ? cc2_ldg(xp + (I)r * (I)hw) : T(0);
            if (c >= 0 && c < ${C}) {
                const T g = cc2_ldg(gp + (I)c * (I)hw);
                T sum = T(0);
#pragma unroll
                for (int q = 0; q < ${size}; ++q) sum += xr[q] * xr[q];
                const T d = k + alpha_over_size * sum;
                const T p = cc2_pow(d, neg_beta);
                gr[s % ${size}] = g;
                pr[s % ${size}] = p;
                qr[s % ${size}] = g * xr[(s + ${A}) % ${size}] * (p / d);
            } else {
                qr[s % ${size}] = T(0);
            }
%   if size > 1:
            if (s >= ${size - 1}) {
%   endif
                const int jo = c - ${A};
                if (jo < ${C}) {
                    const int so = (s + ${size} - ${A % size}) % ${size};
                    T sq = T(0);
#pragma unroll
                    for (int q = 0; q < ${size}; ++q) sq += qr[q];
                    op[(I)jo * (I)hw] = gr[so] * pr[so] - coef * xr[s % ${size}] * sq;
                }
%   if size > 1:
            }
%   endif
        }
    }
}
% elif kind == "grad":
extern "C" __global__ void ${name}(
    const T* __restrict__ x, const T* __restrict__ gy, T* __restrict__ gx,
    I columns, int hw, T k, T alpha_over_size, T neg_beta, T coef)
{
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < columns; t += (I)gridDim.x * blockDim.x) {
        const I b = t / (I)hw;
        const I base = b * (I)${C} * (I)hw + (t - b * (I)hw);
        const T* __restrict__ xp = x + base;
        const T* __restrict__ gp = gy + base;
        T* __restrict__ op = gx + base;
#pragma unroll 2
        for (int lo = 0; lo < ${C}; lo += ${size}) {
            T v[${size}], g[${size}];
            T sum = T(0), dot = T(0);
#pragma unroll
            for (int j = 0; j < ${size}; ++j) {
                const bool in = lo + j < ${C};
                v[j] = in ? cc2_ldg(xp + (I)(lo + j) * (I)hw) : T(0);
                g[j] = in ? cc2_ldg(gp + (I)(lo + j) * (I)hw) : T(0);
                sum += v[j] * v[j];
                dot += g[j] * v[j];
            }
            const T d = k + alpha_over_size * sum;
            const T p = cc2_pow(d, neg_beta);
            const T s = dot * (p / d);
#pragma unroll
            for (int j = 0; j < ${size}; ++j) {
                if (lo + j < ${C}) op[(I)(lo + j) * (I)hw] = g[j] * p - coef * v[j] * s;
            }
        }
    }
}
% else:
#error "cross_map_norm.cu: unknown kind ${kind}"
% endif
