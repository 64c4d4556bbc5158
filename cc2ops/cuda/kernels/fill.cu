<%doc>
Fill a contiguous buffer of `unit`-byte words with a bit pattern.

Constants: name, unit (1, 2, 4 or 8). Word i gets p0, or p1 when period == 2
and i is odd (a 16-byte element such as complex128 is two 8-byte words). The
patterns arrive as 64-bit words and are truncated to `unit` bytes.
</%doc>
<%include file="common.cuh"/>
<% T = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}[unit] %>
extern "C" __global__ void ${name}(
    ${T}* __restrict__ dst, index_t n, u64 p0, u64 p1, index_t period)
{
    const ${T} w0 = (${T})p0;
    const ${T} w1 = (${T})p1;
    CC2_GRID_STRIDE_LOOP(i, n) {
        dst[i] = (period == 2 && (i & 1)) ? w1 : w0;
    }
}
