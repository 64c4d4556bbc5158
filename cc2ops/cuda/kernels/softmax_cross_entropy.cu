<%doc>
Fused softmax cross-entropy, its gradient, and the top-k error over logits
(B, K), any K.

Constants: name, kind ("xent_fwd", "xent_grad", "topk"), dtype
("float32"/"float64"), soft (bool: soft targets (B, K) of the logits' dtype,
else integer labels (B,)), ltype (the labels' C type), block (threads per
block, a power of two in 32..1024), vec (xent_fwd: elements per load, 1 or
the 16-byte width 4 (float32) / 2 (float64); the other kinds take vec=1).

Forward (xent_fwd): a row is cut into S contiguous chunks (S a launch
argument, chosen by the host) and the 1-D grid walks the B * S (row, chunk)
units, the chunks of one row adjacent. With vec > 1 each row is read as a
head of scalars up to its first 16-byte boundary, whole 16-byte vectors, and
a tail of scalars; the vectors are dealt out to the chunks, the head and the
tail to chunk 0 (rows of any K are vectorised; the host makes sure that soft
targets share the logits' misalignment, else it asks for vec = 1). Each
thread loads 4 vectors (all loads in flight before any arithmetic), takes
their max, rescales its running state once and adds one exp per element:
state (m, s) with s = sum exp(x - m), and for soft targets tsum = sum t,
u = sum t (x - m). Warp shuffles and one shared-memory step combine the
block's threads. With S = 1 the block writes the loss. With S > 1 thread 0
stores the chunk's state in the workspace part[B * S][2 or 4], fences, and
counts the row's arrivals in count[row] (atomicAdd); the block that arrives
last reads the row's S states (L2, not L1) and combines them in chunk order
(one sequence per lane of warp 0, then a fixed butterfly): the result does
not depend on the order of arrival. It then sets count[row] back to 0, so
the next launch (or replay of a CUDA graph) finds the counters zeroed
without a memset, and writes the loss; it alone reads the label.

The shift mm = max (0 while the max is -inf) keeps every exp argument <= 0,
and the loss terms of one sign (log s >= 0, -(x[y] - m) >= 0; for soft
targets t >= 0 the rebase tsum (m_old - m_new) and every t (x - m) are
<= 0), so logits of magnitude 1e4 lose no precision to cancellation. A NaN
logit makes s, hence the loss, NaN (max ignores NaN, the exp does not).
float32 exponentials are exp2f((x - m) * log2 e): x - m is formed first, so
the error stays relative to the exponent, not to the logits.

Labels outside [0, K) are not read from: the row's outputs become NaN and
atomicMin(flag, row) records the first bad row; the host reads the 4-byte
flag after the launch (initialised to 0xffffffff) and raises.

The gradient (one block per row) recomputes m and s from the logits in a
first pass (nothing of the forward is reused), then writes
(softmax - onehot) * g, or (softmax * sum t - t) * g, in a second pass over
the row (which the first pass has just brought into L2).
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
// exp of an argument <= 0 in the forward's loops: one ex2 for float32
__device__ __forceinline__ float cc2_exp_fast(float a) { return exp2f(a * 1.4426950408889634f); }
__device__ __forceinline__ double cc2_exp_fast(double a) { return exp(a); }
// max that ignores a NaN (the NaN reaches s through its exp instead)
__device__ __forceinline__ float cc2_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double cc2_max(double a, double b) { return fmax(a, b); }
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

__device__ __forceinline__ State cc2_empty() {
    return State{cc2_neg_inf(T(0)), T(0), T(0), T(0)};
}

// Shift for exponentials: the max, or 0 while the max is -inf (exp(-inf - 0)
// is 0 where exp(-inf - -inf) would be NaN).
__device__ __forceinline__ T cc2_shift(T m) {
    return m == cc2_neg_inf(T(0)) ? T(0) : m;
}

// Both sides rescaled to the larger max; a side at max -inf contributes its s
// times 0 (0, or NaN when a NaN logit made s NaN).
__device__ __forceinline__ State cc2_combine(const State& a, const State& b) {
    const T ninf = cc2_neg_inf(T(0));
    State r;
    r.m = cc2_max(a.m, b.m);
    const T mm = cc2_shift(r.m);
    r.s = a.s * cc2_exp(a.m - mm) + b.s * cc2_exp(b.m - mm);
    r.tsum = a.tsum + b.tsum;
    r.u = a.u + b.u + (a.m != ninf ? a.tsum * (a.m - mm) : T(0))
        + (b.m != ninf ? b.tsum * (b.m - mm) : T(0));
    return r;
}

__device__ __forceinline__ State cc2_shfl(const State& a, int delta) {
    State r;
    r.m = __shfl_xor_sync(0xffffffffu, a.m, delta);
    r.s = __shfl_xor_sync(0xffffffffu, a.s, delta);
% if soft:
    r.tsum = __shfl_xor_sync(0xffffffffu, a.tsum, delta);
    r.u = __shfl_xor_sync(0xffffffffu, a.u, delta);
% else:
    r.tsum = T(0);  // unused with labels
    r.u = T(0);
% endif
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
        if (lane >= ${W}) b = cc2_empty();
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
<%
U = 4  # vectors per thread per batch: their loads are all issued first
NS = 4 if soft else 2  # values of a chunk's state in the workspace
comps = ["x", "y", "z", "w"][:vec] if vec > 1 else [None]


def el(a, c):
    return f"{a}.{c}" if c else a


def tree(terms):
    # a balanced sum: shorter dependency chains than a running total
    while len(terms) > 1:
        pairs = [f"({a} + {b})" for a, b in zip(terms[0::2], terms[1::2])]
        terms = pairs + ([terms[-1]] if len(terms) % 2 else [])
    return terms[0]
%>
% if vec == 4:
typedef float4 V;
__device__ __forceinline__ V cc2_splat(T v) { return make_float4(v, v, v, v); }
% elif vec == 2:
typedef double2 V;
__device__ __forceinline__ V cc2_splat(T v) { return make_double2(v, v); }
% else:
typedef T V;
__device__ __forceinline__ V cc2_splat(T v) { return v; }
% endif

// One logit v (and target t) into a running state: the head and tail scalars.
__device__ __forceinline__ void cc2_add_one(State& a, T v, T t) {
    const T mn = cc2_max(a.m, v);
    const T mm = cc2_shift(mn);
    a.s = a.s * cc2_exp_fast(a.m - mm) + cc2_exp_fast(v - mm);
% if soft:
    a.u += (a.m != cc2_neg_inf(T(0)) ? a.tsum * (a.m - mm) : T(0)) + t * (v - mm);
    a.tsum += t;
% endif
    a.m = mn;
}

// The row's loss from its state, by one thread.
__device__ __forceinline__ void cc2_write_loss(
    const State& st, index_t row, index_t K, const T* __restrict__ xr,
% if not soft:
    const L* __restrict__ labels,
% endif
    T* __restrict__ loss, unsigned int* flag)
{
% if soft:
    loss[row] = st.tsum * cc2_log(st.s) - st.u;
% else:
    const long long lab = cc2_label(labels, row, K, flag);
    loss[row] = lab < 0 ? cc2_nan(T(0)) : cc2_log(st.s) - (cc2_ldg(xr + lab) - st.m);
% endif
}

extern "C" __global__ void ${name}(
    const T* __restrict__ x,
% if soft:
    const T* __restrict__ targets,
% else:
    const L* __restrict__ labels,
% endif
    T* __restrict__ loss, index_t B, index_t K, index_t S,
    T* part, unsigned int* count, unsigned int* flag)
{
    const T ninf = cc2_neg_inf(T(0));
    for (index_t unit = blockIdx.x; unit < B * S; unit += gridDim.x) {
        const index_t row = unit / S, p = unit - row * S;
        const T* __restrict__ xr = x + row * K;
% if soft:
        const T* __restrict__ tr = targets + row * K;
% endif
% if vec > 1:
        // scalars up to the row's first 16-byte boundary, then whole vectors
        const index_t head = min(K, (index_t)((0 - (size_t)xr / sizeof(T)) & ${vec - 1}));
        const index_t nv = (K - head) / ${vec};
        const V* __restrict__ xv = reinterpret_cast<const V*>(xr + head);
% if soft:
        const V* __restrict__ tv = reinterpret_cast<const V*>(tr + head);
% endif
% else:
        const index_t nv = K;
        const V* __restrict__ xv = xr;
% if soft:
        const V* __restrict__ tv = tr;
% endif
% endif
        // this chunk's vectors
        const index_t lo = nv * p / S, hi = nv * (p + 1) / S;
        State st = cc2_empty();
        for (index_t i = lo + threadIdx.x; i < hi; i += ${U * block}) {
% for u in range(U):
            const bool ok${u} = i + ${u * block} < hi;
            const V a${u} = ok${u} ? cc2_ldg(xv + i + ${u * block}) : cc2_splat(ninf);
% if soft:
            const V b${u} = ok${u} ? cc2_ldg(tv + i + ${u * block}) : cc2_splat(T(0));
% endif
% endfor
<% vals = [el(f"a{u}", c) for u in range(U) for c in comps] %>
            T bm = ${vals[0]};
% for v in vals[1:]:
            bm = cc2_max(bm, ${v});
% endfor
            const T mn = cc2_max(st.m, bm);
            const T mm = cc2_shift(mn);
            // one rescale per batch, one exp per element (padding adds exp(-inf) = 0)
            st.s = st.s * cc2_exp_fast(st.m - mm)
                + ${tree([f"cc2_exp_fast({v} - mm)" for v in vals])};
% if soft:
            T ts = T(0), tu = T(0);
% for u in range(U):
            if (ok${u}) {
                ts += ${tree([el(f"b{u}", c) for c in comps])};
                tu += ${tree([f"{el(f'b{u}', c)} * ({el(f'a{u}', c)} - mm)" for c in comps])};
            }
% endfor
            // every term <= 0: no cancellation
            st.u += (st.m != ninf ? st.tsum * (st.m - mm) : T(0)) + tu;
            st.tsum += ts;
% endif
            st.m = mn;
        }
% if vec > 1:
        const index_t scalars = head + (K - head - nv * ${vec});
        if (p == 0 && threadIdx.x < scalars) {
            const index_t e = threadIdx.x < head ? (index_t)threadIdx.x
                                                 : nv * ${vec} + threadIdx.x;
% if soft:
            cc2_add_one(st, cc2_ldg(xr + e), cc2_ldg(tr + e));
% else:
            cc2_add_one(st, cc2_ldg(xr + e), T(0));
% endif
        }
% endif
        st = cc2_block_reduce(st);
<% lab_arg = "" if soft else "labels, " %>
        if (S == 1) {
            if (threadIdx.x == 0) cc2_write_loss(st, row, K, xr, ${lab_arg}loss, flag);
        } else {
            bool arrived = false;
            if (threadIdx.x == 0) {
                T* w = part + unit * ${NS};
                w[0] = st.m;
                w[1] = st.s;
% if soft:
                w[2] = st.tsum;
                w[3] = st.u;
% endif
                // the state is visible device-wide before the count says so
                __threadfence();
                arrived = atomicAdd(count + row, 1u) == (unsigned int)(S - 1);
            }
            // a barrier that also tells every thread whether thread 0 arrived last
            const bool last = __syncthreads_or(arrived);
            if (last && threadIdx.x < 32) {
                __threadfence();
                // chunk order: lane l takes chunks l, l + 32, ...; then a fixed butterfly
                State a = cc2_empty();
                for (index_t q = threadIdx.x; q < S; q += 32) {
                    const T* w = part + (row * S + q) * ${NS};
% if soft:
                    const State b{__ldcg(w), __ldcg(w + 1), __ldcg(w + 2), __ldcg(w + 3)};
% else:
                    const State b{__ldcg(w), __ldcg(w + 1), T(0), T(0)};
% endif
                    a = cc2_combine(a, b);
                }
#pragma unroll
                for (int d = 16; d >= 1; d >>= 1) a = cc2_combine(a, cc2_shfl(a, d));
                if (threadIdx.x == 0) {
                    count[row] = 0;  // every chunk of the row has arrived
                    cc2_write_loss(a, row, K, xr, ${lab_arg}loss, flag);
                }
            }
        }
        __syncthreads();  // the reduction's shared memory is reused
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
        State st = cc2_empty();
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
#error "softmax_cross_entropy.cu: unknown kind ${kind}"
% endif
