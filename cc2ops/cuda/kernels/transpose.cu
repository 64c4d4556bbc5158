<%doc>
Tiled shared-memory transpose into a C-contiguous output, batched over the
other dimensions.

Constants: name (kernel name), unit (element size in bytes: 1, 2, 4 or 8),
maxbatch (the most batch dimensions a geometry may have).

The Python side (cc2ops.cuda.ops.tensor.basic.contiguous) sees an output of C-order
shape (..., J, ..., L) where L is the output's innermost axis and J is the
axis along which the *input* has unit stride. Each 32x32 tile is read from
the input along J (coalesced), kept in shared memory and written to the
output along L (coalesced). Arguments, strides in elements:

  nl, in_sl         extent of L and the input stride along L
  nj, out_sj        extent of J and the output stride along J (input stride 1)
  nbatch, nb        number of batch positions and of batch dims
  b<d>, ib<d>, ob<d>  per batch dim: extent, input stride, output stride
</%doc>
<%include file="common.cuh"/>
<% T = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}[unit] %>
#define CC2_TILE 32
#define CC2_ROWS 8
extern "C" __global__ void ${name}(
    const ${T}* __restrict__ src, ${T}* __restrict__ dst,
    index_t nl, index_t in_sl, index_t nj, index_t out_sj,
    index_t nbatch, int nb,
% for d in range(maxbatch):
    index_t b${d}, index_t ib${d}, index_t ob${d}${"," if d < maxbatch - 1 else ")"}
% endfor
{
    // +1 column: the column-wise reads of the store phase hit 32 distinct banks
    __shared__ ${T} tile[CC2_TILE][CC2_TILE + 1];
    const index_t bext[${maxbatch}] = {${", ".join("b%d" % d for d in range(maxbatch))}};
    const index_t bin[${maxbatch}] = {${", ".join("ib%d" % d for d in range(maxbatch))}};
    const index_t bout[${maxbatch}] = {${", ".join("ob%d" % d for d in range(maxbatch))}};
    const index_t l0 = (index_t)blockIdx.x * CC2_TILE;
    const index_t j0 = (index_t)blockIdx.y * CC2_TILE;
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    for (index_t b = blockIdx.z; b < nbatch; b += gridDim.z) {
        index_t rest = b;
        index_t in_off = 0;
        index_t out_off = 0;
#pragma unroll
        for (int d = ${maxbatch} - 1; d >= 0; --d) {
            if (d < nb) {
                const index_t q = rest / bext[d];
                const index_t r = rest - q * bext[d];
                in_off += r * bin[d];
                out_off += r * bout[d];
                rest = q;
            }
        }
        // load: consecutive threads walk J, where the input is contiguous
        const index_t j = j0 + tx;
        for (int k = ty; k < CC2_TILE; k += CC2_ROWS) {
            const index_t l = l0 + k;
            if (j < nj && l < nl) tile[k][tx] = cc2_ldg(src + in_off + l * in_sl + j);
        }
        __syncthreads();
        // store: consecutive threads walk L, the output's contiguous axis
        const index_t l = l0 + tx;
        for (int k = ty; k < CC2_TILE; k += CC2_ROWS) {
            const index_t jj = j0 + k;
            if (jj < nj && l < nl) dst[out_off + jj * out_sj + l] = tile[tx][k];
        }
        // the next batch position reuses the tile
        __syncthreads();
    }
}
