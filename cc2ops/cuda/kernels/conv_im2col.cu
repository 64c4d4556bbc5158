<%doc>
im2col / col2im and two small helpers of the im2col + GEMM convolution path.

Constants: name (kernel name), kind ("im2col", "col2im", "swap01", "add"),
dtype ("float32" or "float64"), kh, kw (filter size), sh, sw (stride), ph, pw
(zero padding), layout ("knp" or "nkp") and accumulate (bool, col2im only).
swap01 and add ignore the tap constants (the host passes neutral values).

Column layouts (K = C*kh*kw rows, row k = (c*kh + u)*kw + v; P = Ho*Wo):

knp
    cols[k][n][p]: one (K, nb*P) matrix for the whole chunk of nb images;
    group g is the row block [g*K/groups, (g+1)*K/groups), so one GEMM per
    group covers the chunk.
nkp
    cols[n][k][p]: one (K, P) matrix per image (Caffe's im2col), for GEMMs
    batched over the images.

Every kernel walks a flat index with a grid-stride loop; the index is 32-bit
unsigned (the host checks every count is below 2^31) and addresses are
64-bit. Consecutive threads take consecutive output columns (wo, or w for
col2im), so loads and stores are coalesced.

im2col: one thread per (c, n, ho, wo) (knp) or (n, c, ho, wo) (nkp) writes
the kh*kw taps of that position (zero outside the image).

col2im: the gather form: one thread per input pixel (n, c, h, w) sums the
column entries of the taps (u, v) whose output position
((h + ph - u)/sh, (w + pw - v)/sw) is integral and inside the output; no
atomics, a fixed summation order (u, then v), so it is deterministic. With
accumulate the sum is added to dx (cuda-convnet2's scaleTargets = 1).

swap01: out[b][a][p] = in[a][b][p] for in of shape (A, B, P), the layout
change between (B, F, Ho*Wo) images and (F, B, Ho*Wo) GEMM operands.

add: out[i] += in[i] (accumulating a result computed into scratch).
</%doc>
<%include file="common.cuh"/>
typedef ${dtype} T;
typedef unsigned int u32i;

% if kind == "im2col":
extern "C" __global__ void ${name}(
    const T* __restrict__ x, T* __restrict__ cols,
    u32i nb, u32i C, int H, int W, int Ho, int Wo)
{
    const u32i P = (u32i)Ho * (u32i)Wo;
    const u32i total = nb * C * P;
    for (u32i i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += gridDim.x * blockDim.x) {
        const u32i p = i % P;
        const u32i q = i / P;
        const int ho = (int)(p / (u32i)Wo);
        const int wo = (int)(p % (u32i)Wo);
% if layout == "knp":
        // q = c*nb + n
        const u32i n = q % nb;
        const u32i c = q / nb;
        const index_t tap_stride = (index_t)nb * P;
        T* __restrict__ dst = cols + (index_t)c * (${kh * kw}) * tap_stride
                                   + (index_t)n * P + p;
% else:
        // q = n*C + c
        const u32i c = q % C;
        const u32i n = q / C;
        const index_t tap_stride = (index_t)P;
        T* __restrict__ dst = cols + ((index_t)n * C + c) * (${kh * kw}) * tap_stride + p;
% endif
        const T* __restrict__ src = x + ((index_t)n * C + c) * H * W;
        const int r0 = ho * ${sh} - ${ph};
        const int c0 = wo * ${sw} - ${pw};
#pragma unroll
        for (int u = 0; u < ${kh}; ++u) {
            const int r = r0 + u;
            const bool row_ok = r >= 0 && r < H;
#pragma unroll
            for (int v = 0; v < ${kw}; ++v) {
                const int cc = c0 + v;
                T val = T(0);
                if (row_ok && cc >= 0 && cc < W) val = src[(index_t)r * W + cc];
                dst[(index_t)(u * ${kw} + v) * tap_stride] = val;
            }
        }
    }
}
% elif kind == "col2im":
extern "C" __global__ void ${name}(
    const T* __restrict__ cols, T* __restrict__ dx,
    u32i nb, u32i C, int H, int W, int Ho, int Wo)
{
    const u32i P = (u32i)Ho * (u32i)Wo;
    const u32i HW = (u32i)H * (u32i)W;
    const u32i total = nb * C * HW;
    for (u32i i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += gridDim.x * blockDim.x) {
        const u32i pix = i % HW;
        const u32i q = i / HW;  // n*C + c
        const u32i c = q % C;
        const u32i n = q / C;
        const int h = (int)(pix / (u32i)W);
        const int w = (int)(pix % (u32i)W);
% if layout == "knp":
        const index_t tap_stride = (index_t)nb * P;
        const T* __restrict__ src = cols + (index_t)c * (${kh * kw}) * tap_stride
                                         + (index_t)n * P;
% else:
        const index_t tap_stride = (index_t)P;
        const T* __restrict__ src = cols + ((index_t)n * C + c) * (${kh * kw}) * tap_stride;
% endif
        T acc = T(0);
#pragma unroll
        for (int u = 0; u < ${kh}; ++u) {
            const int rp = h + ${ph} - u;
            // rp must be a multiple of the stride and inside the output
            if (rp < 0 || rp % ${sh} != 0) continue;
            const int ho = rp / ${sh};
            if (ho >= Ho) continue;
#pragma unroll
            for (int v = 0; v < ${kw}; ++v) {
                const int cp = w + ${pw} - v;
                if (cp < 0 || cp % ${sw} != 0) continue;
                const int wo = cp / ${sw};
                if (wo >= Wo) continue;
                acc += cc2_ldg(src + (index_t)(u * ${kw} + v) * tap_stride
                                   + (index_t)ho * Wo + wo);
            }
        }
% if accumulate:
        dx[i] += acc;
% else:
        dx[i] = acc;
% endif
    }
}
% elif kind == "swap01":
extern "C" __global__ void ${name}(
    const T* __restrict__ in, T* __restrict__ out, u32i A, u32i B, u32i P)
{
    const u32i total = A * B * P;
    for (u32i i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += gridDim.x * blockDim.x) {
        // i = (b*A + a)*P + p
        const u32i p = i % P;
        const u32i q = i / P;
        const u32i a = q % A;
        const u32i b = q / A;
        out[i] = cc2_ldg(in + ((index_t)a * B + b) * P + p);
    }
}
% elif kind == "add":
extern "C" __global__ void ${name}(
    const T* __restrict__ in, T* __restrict__ out, index_t n)
{
    CC2_GRID_STRIDE_LOOP(i, n) {
        out[i] += cc2_ldg(in + i);
    }
}
% endif
