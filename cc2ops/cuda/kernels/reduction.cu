<%doc>
Reductions over a strided (kept dims, reduced dims) view: GpuCAReduce and GpuArgmax.

Constants
---------
name : str
kind : str
    "reduce" (fold with a scalar op) or "argmax" (first index of the maximum,
    NaN counting as the maximum, as numpy).
in_dtype, acc_dtype, out_dtype : str
    numpy dtype names. For "argmax" out_dtype is int64 and acc_dtype the
    input dtype.
fold_body, fold_out : str
    "reduce": scalar C code computing cc2_out0 (of dtype fold_out) from the
    accumulator cc2_in0 and the element cc2_in1 (the CAReduce's scalar op,
    possibly a fused Composite).
combine_body : str
    "reduce": scalar C code combining two accumulators cc2_in0, cc2_in1 into
    cc2_out0 (the plain binary op: add, mul, maximum, ...).
support : str
    Support code of the scalar ops.
identity : str
    C literal of the accumulator's start value.
mode : str
    "row": TPO threads reduce one output (a warp when tpo == 32, the block
    when tpo == 256), each striding over the reduced index; right when the
    reduced elements are contiguous, and correct for any strides.
    "col": a 32 x 8 block reduces 32 consecutive outputs (threadIdx.x picks
    the output, threadIdx.y strides over the reduced index), so the loads of
    a warp are coalesced when the outputs are contiguous in the input.
tpo : int
    Threads per output in "row" mode (32 or 256; 256 in "col" mode).
nk, nr : int
    Number of kept (>= 0) and reduced (>= 1) collapsed dims.
split : bool
    "row" mode: output o' = o * nsplit + c holds the accumulator of chunk c
    (of length chunk) of output o's reduced range, in acc_dtype; a second
    launch reduces the chunks.
wide : bool
    64-bit index peeling (otherwise 32-bit division).

Arguments: x, y, n_out (outputs, or outputs * nsplit when split), n_red,
nsplit, chunk, kept extents kn0.. and strides ks0.. (elements, outermost
first), reduced extents rn0.. and strides rs0...
</%doc>
<%namespace name="ew" file="elemwise.cu"/>
<%include file="common.cuh"/>
${ew.npy_env()}
<%
in_t = "npy_" + in_dtype
acc_t = "npy_" + acc_dtype
res_t = acc_t if split else "npy_" + out_dtype
groups = 256 // tpo
%>
${support}

template <typename T>
__device__ __forceinline__ T cc2_shfl_down(T v, int offset)
{
    if constexpr (sizeof(T) == 8) {
        long long bits;
        memcpy(&bits, &v, 8);
        bits = __shfl_down_sync(0xffffffffu, bits, offset);
        T out;
        memcpy(&out, &bits, 8);
        return out;
    } else {
        int bits = 0;
        memcpy(&bits, &v, sizeof(T));
        bits = __shfl_down_sync(0xffffffffu, bits, offset);
        T out;
        memcpy(&out, &bits, sizeof(T));
        return out;
    }
}

// offset of the idx-th element (C order) of a strided group of dims
<%def name="peel(var, idx, prefix, count)">\
<% pidx = "index_t" if wide else "unsigned int" %>\
% if count == 0:
        const index_t ${var} = 0;
% elif count == 1:
        const index_t ${var} = (index_t)(${idx}) * ${prefix}s0;
% else:
        index_t ${var} = 0;
        {
            ${pidx} rest = (${pidx})(${idx});
% for d in reversed(range(count)):
% if d > 0:
            const ${pidx} q = rest / (${pidx})${prefix}n${d};
            ${var} += (index_t)(rest - q * (${pidx})${prefix}n${d}) * ${prefix}s${d};
            rest = q;
% else:
            ${var} += (index_t)rest * ${prefix}s0;
% endif
% endfor
        }
% endif
</%def>

% if kind == "reduce":
__device__ __forceinline__ ${acc_t} cc2_fold(${acc_t} cc2_in0, ${in_t} cc2_in1)
{
    npy_${fold_out} cc2_out0;
    {
${fold_body}
    }
    return (${acc_t})cc2_out0;
}

__device__ __forceinline__ ${acc_t} cc2_combine(${acc_t} cc2_in0, ${acc_t} cc2_in1)
{
    ${acc_t} cc2_out0;
    {
${combine_body}
    }
    return cc2_out0;
}

struct cc2_acc {
    ${acc_t} v;
    __device__ __forceinline__ void init() { v = ${identity}; }
    __device__ __forceinline__ void add(${in_t} x, index_t) { v = cc2_fold(v, x); }
    __device__ __forceinline__ void merge(const cc2_acc& o) { v = cc2_combine(v, o.v); }
    __device__ __forceinline__ cc2_acc down(int offset) const {
        cc2_acc o; o.v = cc2_shfl_down(v, offset); return o;
    }
    __device__ __forceinline__ ${res_t} result() const { return (${res_t})v; }
};
% else:
<% isfloat = in_dtype.startswith("float") %>
struct cc2_acc {
    ${acc_t} v;
    index_t i;
    __device__ __forceinline__ void init() { v = ${identity}; i = NPY_MAX_INT64; }
    // whether (bv, bi) beats (v, i): NaN beats everything, ties go to the lower index
    __device__ __forceinline__ bool beaten(${acc_t} bv, index_t bi) const {
% if isfloat:
        if (isnan(v)) return isnan(bv) && bi < i;
        if (isnan(bv)) return true;
% endif
        return bv > v || (bv == v && bi < i);
    }
    __device__ __forceinline__ void add(${in_t} x, index_t r) {
        if (beaten(x, r)) { v = x; i = r; }
    }
    __device__ __forceinline__ void merge(const cc2_acc& o) {
        if (beaten(o.v, o.i)) { v = o.v; i = o.i; }
    }
    __device__ __forceinline__ cc2_acc down(int offset) const {
        cc2_acc o; o.v = cc2_shfl_down(v, offset); o.i = cc2_shfl_down(i, offset); return o;
    }
    __device__ __forceinline__ npy_int64 result() const { return (npy_int64)i; }
};
% endif

extern "C" __global__ void ${name}(
    const ${in_t}* __restrict__ x, ${res_t}* __restrict__ y,
    index_t n_out, index_t n_red, index_t nsplit, index_t chunk
% for d in range(nk):
    , index_t kn${d}, index_t ks${d}
% endfor
% for d in range(nr):
    , index_t rn${d}, index_t rs${d}
% endfor
    )
{
% if mode == "row":
    const int lane = threadIdx.x % ${tpo};
    const int group = threadIdx.x / ${tpo};
% if tpo == 256:
    __shared__ cc2_acc partial[8];
% endif
    for (index_t oo = (index_t)blockIdx.x * ${groups} + group; oo < n_out;
         oo += (index_t)gridDim.x * ${groups}) {
% if split:
        const index_t o = oo / nsplit;
        const index_t r_begin = (oo - o * nsplit) * chunk;
        const index_t r_end = min(r_begin + chunk, n_red);
% else:
        const index_t o = oo;
        const index_t r_begin = 0;
        const index_t r_end = n_red;
% endif
${peel("base", "o", "k", nk)}
        cc2_acc acc;
        acc.init();
        for (index_t r = r_begin + lane; r < r_end; r += ${tpo}) {
${peel("off", "r", "r", nr)}
            acc.add(x[base + off], r);
        }
        // tree reduction: within the warp, then (tpo 256) across the 8 warps
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            acc.merge(acc.down(offset));
        }
% if tpo == 256:
        if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;
        __syncthreads();
        if (threadIdx.x < 32) {
            if (threadIdx.x < 8) acc = partial[threadIdx.x]; else acc.init();
#pragma unroll
            for (int offset = 4; offset > 0; offset >>= 1) {
                acc.merge(acc.down(offset));
            }
            if (threadIdx.x == 0) y[oo] = acc.result();
        }
        __syncthreads();
% else:
        if (lane == 0) y[oo] = acc.result();
% endif
    }
% else:
    // "col": blockDim = (32, 8)
    __shared__ cc2_acc partial[8][33];
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    for (index_t tile = blockIdx.x; tile * 32 < n_out; tile += gridDim.x) {
        const index_t o = tile * 32 + tx;
        cc2_acc acc;
        acc.init();
        if (o < n_out) {
${peel("base", "o", "k", nk)}
            for (index_t r = ty; r < n_red; r += 8) {
${peel("off", "r", "r", nr)}
                acc.add(x[base + off], r);
            }
        }
        partial[ty][tx] = acc;
        __syncthreads();
        if (ty == 0 && o < n_out) {
#pragma unroll
            for (int k = 1; k < 8; ++k) acc.merge(partial[k][tx]);
            y[o] = acc.result();
        }
        __syncthreads();
    }
% endif
}
