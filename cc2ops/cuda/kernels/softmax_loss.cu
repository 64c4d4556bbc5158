<%doc>
Fused softmax cross-entropy, its gradient, and the top-k error; one block
per row of the logits (B, K), any K.

Constants: name, kind ("xent_fwd", "xent_grad", "topk"), dtype
("float32"/"float64"), soft (bool: soft targets (B, K) of the logits' dtype,
else integer labels (B,)), ltype (the labels' C type), block (threads per
block, a power of two in 32..1024).

Each thread walks its strided share of the row with an online logsumexp
(running max m and sum s of exp(x - m), rescaled when m grows), so the
logits are read once; the per-thread states are combined with warp shuffles
and one shared-memory step. With z = x - m <= 0 the loss terms are all of
one sign (log s >= 0, -(x[y] - m) >= 0; for soft targets t >= 0 the
sum t (x - m) is rebased whenever m grows), so logits of magnitude 1e4 lose
no precision to cancellation.

Labels outside [0, K) are not read from: the row's outputs become NaN and
atomicMin(flag, row) records the first bad row; the host reads the 4-byte
flag after the launch (initialised to 0xffffffff) and raises.

The gradient recomputes m and s from the logits in a first pass (nothing of
the forward is reused), then writes (softmax - onehot) * g, or
(softmax * sum t - t) * g, in a second pass over the row (which the first
pass has just brought into L2).
</%doc>
<%include file="common.cuh"/>
<%
T = dtype
W = block // 32
%>
typedef ${T} T;
typedef ${ltype} L;

__device__ __forceinline__ float cc2_exp(float a) { return expf(a); }
__device__ __forceinline__ double cc2_exp(double a) { return exp(a); }
__device__ __forceinline__ float cc2_log(float a) { return logf(a); }
__device__ __forceinline__ double cc2_log(double a) { return log(a); }
__device__ __forceinline__ float cc2_neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double cc2_neg_inf(double) { return __longlong_as_double(0xfff0000000000000ULL); }
__device__ __forceinline__ float cc2_nan(float) { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double cc2_nan(double) { return __longlong_as_double(0x7ff8000000000000ULL); }

// Running state of a softmax reduction: max m, s = sum exp(x - m), and for
// soft targets tsum = sum t, u = sum t (x - m).
struct State {
    T m, s, tsum, u;
};

__device__ __forceinline__ void cc2_add(State& a, T v, T t) {
    const T ninf = cc2_neg_inf(T(0));
    if (v > a.m) {
% if soft:
        if (a.m != ninf) a.u += a.tsum * (a.m - v);
% endif
        a.s = (a.m == ninf ? T(0) : a.s * cc2_exp(a.m - v)) + T(1);
        a.m = v;
    } else if (a.m != ninf || v != v) {
        a.s += cc2_exp(v - a.m);
    }
% if soft:
    a.tsum += t;
    a.u += t * (v - a.m);
% endif
}

__device__ __forceinline__ State cc2_combine(const State& a, const State& b) {
    const T ninf = cc2_neg_inf(T(0));
    State r;
    r.m = (b.m > a.m || b.m != b.m) ? b.m : a.m;
    const bool ea = a.m != ninf, eb = b.m != ninf;
    r.s = (ea ? a.s * cc2_exp(a.m - r.m) : T(0)) + (eb ? b.s * cc2_exp(b.m - r.m) : T(0));
    r.tsum = a.tsum + b.tsum;
    r.u = a.u + b.u + (ea ? a.tsum * (a.m - r.m) : T(0)) + (eb ? b.tsum * (b.m - r.m) : T(0));
    return r;
}

__device__ __forceinline__ State cc2_shfl(const State& a, int delta) {
    State r;
    r.m = __shfl_xor_sync(0xffffffffu, a.m, delta);
    r.s = __shfl_xor_sync(0xffffffffu, a.s, delta);
    r.tsum = __shfl_xor_sync(0xffffffffu, a.tsum, delta);
    r.u = __shfl_xor_sync(0xffffffffu, a.u, delta);
    return r;
}

// The block's combined state, in every thread.
__device__ State cc2_block_reduce(State a) {
    __shared__ State part[${W}];
    __shared__ State total;
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) a = cc2_combine(a, cc2_shfl(a, d));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = a;
    __syncthreads();
    if (warp == 0) {
        State b = part[lane < ${W} ? lane : 0];
        if (lane >= ${W}) { b.m = cc2_neg_inf(T(0)); b.s = T(0); b.tsum = T(0); b.u = T(0); }
#pragma unroll
        for (int d = 16; d >= 1; d >>= 1) b = cc2_combine(b, cc2_shfl(b, d));
        if (lane == 0) total = b;
    }
    __syncthreads();
    return total;
}

// The row's label, or -1 (flag raised) when it is outside [0, K).
__device__ __forceinline__ long long cc2_label(
    const L* __restrict__ labels, index_t row, index_t K, unsigned int* flag)
{
    const L raw = labels[row];
    // unsigned labels >= 2^63 wrap negative and are caught as well
    const long long lab = (long long)raw;
    if (lab < 0 || lab >= K) {
        if (threadIdx.x == 0) atomicMin(flag, (unsigned int)row);
        return -1;
    }
    return lab;
}

% if kind == "xent_fwd":
extern "C" __global__ void ${name}(
    const T* __restrict__ x,
% if soft:
    const T* __restrict__ targets,
% else:
    const L* __restrict__ labels,
% endif
    T* __restrict__ loss, index_t B, index_t K, unsigned int* flag)
{
    for (index_t row = blockIdx.x; row < B; row += gridDim.x) {
        const T* __restrict__ xr = x + row * K;
% if soft:
        const T* __restrict__ tr = targets + row * K;
% endif
        State st{cc2_neg_inf(T(0)), T(0), T(0), T(0)};
#pragma unroll 4
        for (index_t i = threadIdx.x; i < K; i += ${block}) {
% if soft:
            cc2_add(st, cc2_ldg(xr + i), cc2_ldg(tr + i));
% else:
            cc2_add(st, cc2_ldg(xr + i), T(0));
% endif
        }
        st = cc2_block_reduce(st);
        if (threadIdx.x == 0) {
% if soft:
            loss[row] = st.tsum * cc2_log(st.s) - st.u;
% else:
            const long long lab = cc2_label(labels, row, K, flag);
            loss[row] = lab < 0 ? cc2_nan(T(0)) : cc2_log(st.s) - (xr[lab] - st.m);
% endif
        }
        __syncthreads();
    }
}
% elif kind == "xent_grad":
extern "C" __global__ void ${name}(
    const T* __restrict__ g, const T* __restrict__ x,
% if soft:
    const T* __restrict__ targets,
% else:
    const L* __restrict__ labels,
% endif
    T* __restrict__ dx, index_t B, index_t K, unsigned int* flag)
{
    for (index_t row = blockIdx.x; row < B; row += gridDim.x) {
        const T* __restrict__ xr = x + row * K;
        T* __restrict__ dr = dx + row * K;
% if soft:
        const T* __restrict__ tr = targets + row * K;
% endif
        State st{cc2_neg_inf(T(0)), T(0), T(0), T(0)};
#pragma unroll 4
        for (index_t i = threadIdx.x; i < K; i += ${block}) {
% if soft:
            cc2_add(st, cc2_ldg(xr + i), cc2_ldg(tr + i));
% else:
            cc2_add(st, cc2_ldg(xr + i), T(0));
% endif
        }
        st = cc2_block_reduce(st);
        const T gr = cc2_ldg(g + row);
        const T scale = gr / st.s;
% if soft:
        const T ts = st.tsum * scale;
#pragma unroll 4
        for (index_t i = threadIdx.x; i < K; i += ${block}) {
            dr[i] = cc2_exp(cc2_ldg(xr + i) - st.m) * ts - cc2_ldg(tr + i) * gr;
        }
% else:
        const long long lab = cc2_label(labels, row, K, flag);
        if (lab < 0) {
            for (index_t i = threadIdx.x; i < K; i += ${block}) dr[i] = cc2_nan(T(0));
        } else {
#pragma unroll 4
            for (index_t i = threadIdx.x; i < K; i += ${block}) {
                const T p = cc2_exp(cc2_ldg(xr + i) - st.m) * scale;
                dr[i] = i == lab ? p - gr : p;
            }
        }
% endif
        __syncthreads();
    }
}
% elif kind == "topk":
extern "C" __global__ void ${name}(
    const T* __restrict__ x, const L* __restrict__ labels, T* __restrict__ err,
    index_t B, index_t K, long long k, unsigned int* flag)
{
    __shared__ long long part[${W}];
    for (index_t row = blockIdx.x; row < B; row += gridDim.x) {
        const T* __restrict__ xr = x + row * K;
        const long long lab = cc2_label(labels, row, K, flag);
        if (lab < 0) {
            if (threadIdx.x == 0) err[row] = cc2_nan(T(0));
            continue;  // uniform across the block: every thread saw the same label
        }
        const T xt = cc2_ldg(xr + lab);
        long long count = 0;
#pragma unroll 4
        for (index_t i = threadIdx.x; i < K; i += ${block}) count += cc2_ldg(xr + i) > xt;
#pragma unroll
        for (int d = 16; d >= 1; d >>= 1) count += __shfl_xor_sync(0xffffffffu, count, d);
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        if (lane == 0) part[warp] = count;
        __syncthreads();
        if (threadIdx.x == 0) {
            long long total = 0;
            for (int w = 0; w < ${W}; ++w) total += part[w];
            // ties count for the true class: fewer than k strictly greater
            err[row] = total >= k ? T(1) : T(0);
        }
        __syncthreads();
    }
}
% else:
#error "softmax_loss.cu: unknown kind ${kind}"
% endif
