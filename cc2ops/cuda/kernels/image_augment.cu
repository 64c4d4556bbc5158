<%doc>
Training-input augmentation of decoded images, and synthetic images, in one
pass each: the GPU side of examples/imagenet/gpu_data.py.

Constants: name, kind ("augment" or "normal"), crop (output side, > 0).

kind "augment": one thread per output pixel (b, y, x) of a batch of B
decoded uint8 HWC RGB images, each in its own device buffer (image b starts
at address src[b]; geom[8 b ...] = h, w, pitch in bytes, rh, rw, oy, ox,
flip). Image b is resized to rh x rw with Pillow's 8-bit BILINEAR resampler
(Resample.c: triangle filter widened by the downscale factor, coefficients
normalised in double then rounded to 22-bit fixed point with +0.5, a
horizontal pass clipped to uint8, then a vertical pass clipped to uint8),
cropped to the crop x crop window at (oy, ox) of the resized image,
mirrored left-right when flip != 0, and written as
out[b, ch, y, x] = (float(v) - mean[ch]) * inv_std[ch] (float32, bc01,
round-to-nearest sub then mul: no contraction, so the values are the CPU
path's bit for bit). One pass: each output pixel recomputes the horizontal
pass for the rows of its vertical window, so no intermediate image is
stored; the coefficient arithmetic is Pillow's, term by term, in IEEE
double (nvcc does not contract an add and a multiply that are not a*b+c,
and the one a*b+c here multiplies by 2^22, which is exact). With rh == h
and rw == w every window is the identity (one weight 2^22), which is how
images already resized on the host (the Pillow fallback) pass through.

kind "normal": out[i] for i < n gets a standard normal drawn from
Philox4x32-10 (counter = (i / 4, 0, 0, 0) relative to counter0, key =
(k0, k1)) through Box-Muller on word pairs: synthetic images drawn on the
device, reproducible from (key, counter0). crop is unused there but named
for the kernel's specialisation like the augment kernel's.
</%doc>
<%include file="common.cuh"/>
% if kind == "augment":
#define CC2_AUG_ONE (1 << 22)

// Pillow's bilinear_filter
__device__ __forceinline__ double cc2_aug_tri(double x)
{
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

// Pillow's precompute_coeffs for output index xx of in_size -> out_size:
// window start, tap count and the weight sum (un-normalised).
struct CC2AugWindow {
    double center, ss, ww;
    int xmin, n;
};

__device__ __forceinline__ CC2AugWindow cc2_aug_window(int in_size, int out_size, int xx)
{
    CC2AugWindow win;
    const double scale = (double)in_size / (double)out_size;
    const double filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = 1.0 * filterscale;
    win.center = ((double)xx + 0.5) * scale;
    win.ss = 1.0 / filterscale;
    int xmin = (int)(win.center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = (int)(win.center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    win.xmin = xmin;
    win.n = xmax - xmin;
    double ww = 0.0;
    for (int t = 0; t < win.n; ++t) {
        ww += cc2_aug_tri(((double)(t + xmin) - win.center + 0.5) * win.ss);
    }
    win.ww = ww;
    return win;
}

// Pillow's normalize_coeffs_8bpc of tap t (bilinear weights are >= 0)
__device__ __forceinline__ int cc2_aug_coeff(const CC2AugWindow& win, int t)
{
    double k = cc2_aug_tri(((double)(t + win.xmin) - win.center + 0.5) * win.ss);
    if (win.ww != 0.0) k = k / win.ww;
    return (int)(0.5 + k * (double)CC2_AUG_ONE);
}

__device__ __forceinline__ int cc2_aug_clip8(int v)
{
    v >>= 22;
    return v < 0 ? 0 : (v > 255 ? 255 : v);
}

extern "C" __global__ void ${name}(
    const u64* __restrict__ src, const int* __restrict__ geom,
    float* __restrict__ out, int batch,
    float mean0, float mean1, float mean2,
    float inv0, float inv1, float inv2)
{
    const index_t plane = (index_t)${crop} * ${crop};
    CC2_GRID_STRIDE_LOOP(i, (index_t)batch * plane) {
        const int b = (int)(i / plane);
        const int p = (int)(i - (index_t)b * plane);
        const int y = p / ${crop};
        const int x = p - y * ${crop};
        const int* g = geom + 8 * b;
        const int h = g[0], w = g[1], pitch = g[2], rh = g[3], rw = g[4];
        const int ry = g[5] + y;
        const int rx = g[6] + (g[7] ? ${crop} - 1 - x : x);
        const u8* img = (const u8*)src[b];
        const CC2AugWindow wy = cc2_aug_window(h, rh, ry);
        const CC2AugWindow wx = cc2_aug_window(w, rw, rx);
        int acc0 = 1 << 21, acc1 = 1 << 21, acc2 = 1 << 21;
        for (int ty = 0; ty < wy.n; ++ty) {
            const u8* row = img + (index_t)(wy.xmin + ty) * pitch + 3 * wx.xmin;
            int h0 = 1 << 21, h1 = 1 << 21, h2 = 1 << 21;
            for (int tx = 0; tx < wx.n; ++tx) {
                const int k = cc2_aug_coeff(wx, tx);
                h0 += (int)row[3 * tx + 0] * k;
                h1 += (int)row[3 * tx + 1] * k;
                h2 += (int)row[3 * tx + 2] * k;
            }
            const int k = cc2_aug_coeff(wy, ty);
            acc0 += cc2_aug_clip8(h0) * k;
            acc1 += cc2_aug_clip8(h1) * k;
            acc2 += cc2_aug_clip8(h2) * k;
        }
        float* o = out + (index_t)b * 3 * plane + p;
        o[0] = __fmul_rn(__fsub_rn((float)cc2_aug_clip8(acc0), mean0), inv0);
        o[plane] = __fmul_rn(__fsub_rn((float)cc2_aug_clip8(acc1), mean1), inv1);
        o[2 * plane] = __fmul_rn(__fsub_rn((float)cc2_aug_clip8(acc2), mean2), inv2);
    }
}
% else:
#define CC2_PHILOX_M0 0xD2511F53u
#define CC2_PHILOX_M1 0xCD9E8D57u
#define CC2_PHILOX_W0 0x9E3779B9u
#define CC2_PHILOX_W1 0xBB67AE85u

__device__ __forceinline__ uint4 cc2_aug_philox(uint4 c, u32 k0, u32 k1)
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

// (0, 1]: never 0, so the logarithm is finite
__device__ __forceinline__ float cc2_aug_unit(u32 v)
{
    return ((float)(v >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

extern "C" __global__ void ${name}(
    float* __restrict__ out, index_t n, u32 k0, u32 k1, u64 counter0)
{
    const index_t blocks = (n + 3) / 4;
    CC2_GRID_STRIDE_LOOP(t, blocks) {
        const u64 c = counter0 + (u64)t;
        const uint4 r = cc2_aug_philox(
            make_uint4((u32)(c & 0xffffffffull), (u32)(c >> 32), 0u, 0u), k0, k1);
        const u32 words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int j = 0; j < 4; j += 2) {
            const float rad = sqrtf(-2.0f * logf(cc2_aug_unit(words[j])));
            float s, co;
            sincospif(2.0f * cc2_aug_unit(words[j + 1]), &s, &co);
            const index_t i = 4 * t + j;
            if (i < n) out[i] = rad * co;
            if (i + 1 < n) out[i + 1] = rad * s;
        }
    }
}
% endif
