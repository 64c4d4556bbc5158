<%doc>
Strided assignment dst[i] = src[i] ("set") or dst[i] += src[i] ("inc") over
an N-d index space, both operands strided (the source may broadcast with
stride 0). Used by GpuIncSubtensor (a view of the output) and GpuJoin (each
input into its slice of the output).

Constants: name, ctype (the C element type), op ("set" or "inc"), maxdim.
Arguments: dst, src, the element count n, the number of dims ndim, then per
dim d the extent n<d>, the destination stride d<d> and the source stride s<d>,
in elements. The destination must not overlap itself (every element is
written by one thread); "inc" on a destination written twice would race.
</%doc>
<%include file="common.cuh"/>
extern "C" __global__ void ${name}(
    ${ctype}* __restrict__ dst, const ${ctype}* __restrict__ src, index_t n, int ndim,
% for d in range(maxdim):
    index_t n${d}, index_t d${d}, index_t s${d}${"," if d < maxdim - 1 else ")"}
% endfor
{
    const index_t extent[${maxdim}] = {${", ".join("n%d" % d for d in range(maxdim))}};
    const index_t dstride[${maxdim}] = {${", ".join("d%d" % d for d in range(maxdim))}};
    const index_t sstride[${maxdim}] = {${", ".join("s%d" % d for d in range(maxdim))}};
    CC2_GRID_STRIDE_LOOP(i, n) {
        index_t rest = i;
        index_t doff = 0;
        index_t soff = 0;
#pragma unroll
        for (int d = ${maxdim} - 1; d >= 0; --d) {
            if (d < ndim) {
                const index_t q = rest / extent[d];
                const index_t r = rest - q * extent[d];
                doff += r * dstride[d];
                soff += r * sstride[d];
                rest = q;
            }
        }
% if op == "set":
        dst[doff] = src[soff];
% else:
        dst[doff] = dst[doff] + src[soff];
% endif
    }
}
