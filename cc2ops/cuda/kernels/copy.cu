<%doc>
Strided -> C-contiguous copy of `unit`-byte elements.

Constants: name (kernel name), unit (1, 2, 4 or 8 bytes), maxdim (the most
dimensions a geometry may have). The Python side (cc2ops.cuda.runtime.array) merges
mergeable dimensions and splits elements wider than `unit`, then passes the
element count, the number of dimensions and, per dimension, the extent n<d> and
the source stride s<d> in elements (may be negative or zero); unused
dimensions are ignored.
</%doc>
<%include file="common.cuh"/>
<% T = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}[unit] %>
extern "C" __global__ void ${name}(
    const ${T}* __restrict__ src, ${T}* __restrict__ dst, index_t n, index_t ndim,
% for d in range(maxdim):
    index_t n${d}, index_t s${d}${"," if d < maxdim - 1 else ")"}
% endfor
{
    const index_t extent[${maxdim}] = {${", ".join("n%d" % d for d in range(maxdim))}};
    const index_t stride[${maxdim}] = {${", ".join("s%d" % d for d in range(maxdim))}};
    CC2_GRID_STRIDE_LOOP(i, n) {
        // peel the destination's C-order index into source offsets, innermost first
        index_t rest = i;
        index_t offset = 0;
#pragma unroll
        for (int d = ${maxdim} - 1; d >= 0; --d) {
            if (d < ndim) {
                const index_t q = rest / extent[d];
                offset += (rest - q * extent[d]) * stride[d];
                rest = q;
            }
        }
        dst[i] = cc2_ldg(src + offset);
    }
}
