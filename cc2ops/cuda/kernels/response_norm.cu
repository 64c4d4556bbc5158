<%doc>
Cross-map response normalisation of bc01 images (cuda-convnet2's cmrnorm).

Constants: name, kind ("fwd" or "grad"), size (window, 1..MAX_SIZE), channels
(C), blocked (bool), dtype ("float32"/"float64"), wide (64-bit indices).

    d_c = k + (alpha/size) * sum_{c' in W(c)} x_{c'}^2,   y_c = x_c d_c^-beta
    gx_j = gy_j d_j^-beta - (2 alpha beta/size) x_j sum_{c: j in W(c)} gy_c x_c d_c^(-beta-1)

One thread per (b, h, w) column walks the channels; consecutive threads take
consecutive w, so every load and store is coalesced along W. Each thread
keeps the last `size` inputs of its column in a register ring (the ring
slot of a channel is known at compile time because the channel loop is
unrolled in chunks of a multiple of `size`), so every input element is read
from memory exactly once and every output written once. The window sum is
summed afresh from the ring at each channel (size multiply-adds, in the
data's dtype: fp32 for float32, fp64 for float64): a sliding add/subtract
sum would drift, this one is exact up to the rounding of a direct sum.

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
U = size * max(1, (8 + size - 1) // size)   # chunk: a multiple of size, >= 8
C = channels
%>
typedef ${T} T;
typedef ${I} I;

__device__ __forceinline__ float cc2_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double cc2_pow(double a, double b) { return pow(a, b); }

% if kind == "fwd":
extern "C" __global__ void ${name}(
    const T* __restrict__ x, T* __restrict__ y, I columns, int hw,
    T k, T alpha_over_size, T neg_beta)
{
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < columns; t += (I)gridDim.x * blockDim.x) {
        const I b = t / (I)hw;
        const I base = b * (I)${C} * (I)hw + (t - b * (I)hw);
        const T* __restrict__ xp = x + base;
        T* __restrict__ yp = y + base;
% if blocked:
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
% else:
        // ring[s] holds the channel c' with c' % size == s among the last `size` read
        T ring[${size}];
#pragma unroll
        for (int s = 0; s < ${size}; ++s) ring[s] = T(0);
#pragma unroll
        for (int r = 0; r < ${F}; ++r) {
            if (r < ${C}) ring[r % ${size}] = cc2_ldg(xp + (I)r * (I)hw);
        }
        for (int cb = 0; cb < ${C}; cb += ${U}) {
#pragma unroll
            for (int j = 0; j < ${U}; ++j) {
                const int c = cb + j;
                if (c < ${C}) {
                    const int r = c + ${F};
                    ring[(j + ${F}) % ${size}] = (r < ${C}) ? cc2_ldg(xp + (I)r * (I)hw) : T(0);
                    T sum = T(0);
#pragma unroll
                    for (int s = 0; s < ${size}; ++s) sum += ring[s] * ring[s];
                    const T p = cc2_pow(k + alpha_over_size * sum, neg_beta);
                    yp[(I)c * (I)hw] = ring[j % ${size}] * p;
                }
            }
        }
% endif
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
% if blocked:
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
% else:
        // rings indexed by channel % size: x (channels c-A .. c+F after step
        // c's load), gy, p = d^-beta and q = gy x p / d (channels c-size+1 .. c)
        T xr[${size}], gr[${size}], pr[${size}], qr[${size}];
#pragma unroll
        for (int s = 0; s < ${size}; ++s) {
            xr[s] = T(0); gr[s] = T(0); pr[s] = T(0); qr[s] = T(0);
        }
#pragma unroll
        for (int r = 0; r < ${F}; ++r) {
            if (r < ${C}) xr[r % ${size}] = cc2_ldg(xp + (I)r * (I)hw);
        }
        for (int cb = 0; cb < ${C + A}; cb += ${U}) {
#pragma unroll
            for (int j = 0; j < ${U}; ++j) {
                const int c = cb + j;
                if (c < ${C + A}) {
                    const int r = c + ${F};
                    const int sc = j % ${size};
                    xr[(j + ${F}) % ${size}] = (r < ${C}) ? cc2_ldg(xp + (I)r * (I)hw) : T(0);
                    if (c < ${C}) {
                        gr[sc] = cc2_ldg(gp + (I)c * (I)hw);
                        T sum = T(0);
#pragma unroll
                        for (int s = 0; s < ${size}; ++s) sum += xr[s] * xr[s];
                        const T d = k + alpha_over_size * sum;
                        const T p = cc2_pow(d, neg_beta);
                        pr[sc] = p;
                        qr[sc] = gr[sc] * xr[sc] * (p / d);
                    } else {
                        qr[sc] = T(0);
                    }
                    const int jo = c - ${A};
                    if (jo >= 0) {
                        const int so = (j + ${size} - ${A} % ${size}) % ${size};
                        T s = T(0);
#pragma unroll
                        for (int q = 0; q < ${size}; ++q) s += qr[q];
                        op[(I)jo * (I)hw] = gr[so] * pr[so] - coef * xr[so] * s;
                    }
                }
            }
        }
% endif
    }
}
% else:
#error "response_norm.cu: unknown kind ${kind}"
% endif
