<%doc>
Dropout with Philox4x32-10 masks: the bit rule of cc2ops/dropout.py, and the
counter advance of a GPU-resident dropout state.

Constants: name, kind ("mask" or "advance"), dtype ("float32" or "float64"
for "mask", "uint32" for "advance"), state ("host" or "device"; "device" for
"advance").

kind "mask": thread t handles counter block b = C + t (64-bit, wrapping): it
computes philox4x32_10(counter = (b_lo, b_hi, 0, 0), key = (k0, k1)) and
element i = 4 t + j (j < 4, i < n, C order) is y[i] = x[i] * scale when word
j is below threshold (a 64-bit compare, so threshold 2^32 keeps everything),
else 0. x and y are C-contiguous. With state "host" the key and counter C
are kernel arguments; with state "device" every thread reads them from the
4-word state (key0, key1, counter_lo, counter_hi) in device memory, which no
thread of this kernel writes (the advance writes a new array).

kind "advance": one thread writes out = (key0, key1, C + blocks) with the
64-bit counter wrapping mod 2^64 (the carry goes into counter_hi); state and
out are distinct 4-word arrays.
</%doc>
<%include file="common.cuh"/>
% if kind == "advance":
extern "C" __global__ void ${name}(
    const u32* __restrict__ state, u32* __restrict__ out, u64 blocks)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const u64 c = ((u64)state[2] | ((u64)state[3] << 32)) + blocks;
        out[0] = state[0];
        out[1] = state[1];
        out[2] = (u32)(c & 0xffffffffull);
        out[3] = (u32)(c >> 32);
    }
}
% else:
<% T = {"float32": "float", "float64": "double"}[dtype] %>
#define CC2_PHILOX_M0 0xD2511F53u
#define CC2_PHILOX_M1 0xCD9E8D57u
#define CC2_PHILOX_W0 0x9E3779B9u
#define CC2_PHILOX_W1 0xBB67AE85u

__device__ __forceinline__ uint4 cc2_philox4x32_10(uint4 c, u32 k0, u32 k1)
{
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k0 += CC2_PHILOX_W0;
            k1 += CC2_PHILOX_W1;
        }
        const u32 hi0 = __umulhi(CC2_PHILOX_M0, c.x);
        const u32 lo0 = CC2_PHILOX_M0 * c.x;
        const u32 hi1 = __umulhi(CC2_PHILOX_M1, c.z);
        const u32 lo1 = CC2_PHILOX_M1 * c.z;
        c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
    }
    return c;
}

% if state == "device":
extern "C" __global__ void ${name}(
    const ${T}* __restrict__ x, ${T}* __restrict__ y, index_t n,
    const u32* __restrict__ state, u64 threshold, ${T} scale)
{
    const u32 k0 = cc2_ldg(state + 0);
    const u32 k1 = cc2_ldg(state + 1);
    const u64 counter = (u64)cc2_ldg(state + 2) | ((u64)cc2_ldg(state + 3) << 32);
% else:
extern "C" __global__ void ${name}(
    const ${T}* __restrict__ x, ${T}* __restrict__ y, index_t n,
    u32 k0, u32 k1, u64 counter, u64 threshold, ${T} scale)
{
% endif
    const index_t blocks = (n + 3) / 4;
    CC2_GRID_STRIDE_LOOP(t, blocks) {
        const u64 b = counter + (u64)t;
        const uint4 w = cc2_philox4x32_10(
            make_uint4((u32)(b & 0xffffffffull), (u32)(b >> 32), 0u, 0u), k0, k1);
        const u32 words[4] = {w.x, w.y, w.z, w.w};
        const index_t i0 = 4 * t;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const index_t i = i0 + j;
            if (i < n) {
                y[i] = ((u64)words[j] < threshold) ? x[i] * scale : (${T})0;
            }
        }
    }
}
% endif
