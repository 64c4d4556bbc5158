<%doc>
Implicit-GEMM convolution on tensor cores: mma.sync.m16n8k8 TF32 (sm_80+),
fp32 accumulation, cp.async global->shared copies in a STAGES-deep ring, the
im2col addresses computed on the fly (no column buffer).

The index maps are specified, and emulated in numpy, by
cc2ops/cuda/conv_igemm.py (a_offset, b_offset, c_offset, load maps): every
formula below has its twin there, under the same names.

Constants
  name, op       op: "fwd" (FilterActs), "dgrad" (ImageActs) or "wgrad"
                 (WeightActs; its module also has ${name}_sum, the split-K
                 reduction); "fwdtm", "dgradtm": tap-major K order
                 (k = (u*KW + v)*Cg + c, resp. (u*KW + v)*Fg + f) over weights
                 permuted by ${name}_wperm, each BK slice one tap (BK divides
                 Cg, resp. Fg), so B's copies are one pointer increment each
  KH KW SH SW PH PW   filter size, stride, padding (rows x cols)
  BM BN BK       block tile of the GEMM C[M, N] = A[M, K] B[K, N]
  WM WN          warps along M and N (warp tile BM/WM x BN/WN)
  STAGES         depth of the cp.async ring (2 or 3)
  SPLIT          1: TF32 (operands rounded to TF32, ~1e-3 relative error);
                 3: 3xTF32, a = big + small with big = tf32(a),
                 small = tf32(a - big), a*b ~ big*big + big*small + small*big
                 (fp32 accuracy, ~1e-6 relative error, on tensor cores), each
                 k8 step's products summed in a zeroed fragment and added to
                 the accumulators with fp32 FADDs (see compute_tile)
  AVEC           4: A copied as 16-byte vectors of 4 consecutive k (fwd, wgrad;
                 conv_igemm.a_vector_width says when that is exact); 1: 4-byte
  STAGE_C        1: the epilogue stages each warp's C through shared memory,
                 16 rows at a time, and stores 32 consecutive n per warp
                 instruction; 0: stores straight from the fragments

Shared-memory layouts (floats): A is [BM][BK + 8] (k contiguous); B is
[BK][BN + 4] (n contiguous: fwd, dgrad) or [BN][BK + 8] (k contiguous: wgrad),
STAGES of each; wgrad adds a table of BN int4 (its B columns' filter taps).
The epilogue's staging buffer of a warp is [16][WTN + 8] and reuses the
pipeline's buffers (WTN + 8 = 8 mod 32: its float2 writes are conflict-free).
Within every k8 slab the logical k of a thread's fragment registers is
permuted (hardware k column j <-> logical 2j, j + 4 <-> 2j + 1, the same for A
and B, so the sum over k is unchanged): a thread's two k values are adjacent
and its k-contiguous fragments load as float2. With the paddings above every
fragment load is free of bank conflicts.
</%doc>
<%include file="common.cuh"/>
<%
THREADS = WM * WN * 32
WTM = BM // WM
WTN = BN // WN
MT = WTM // 16
NT = WTN // 8
KHKW = KH * KW
B_KMAJOR = op == "wgrad"
IS_FWD = op in ("fwd", "fwdtm")
IS_DGRAD = op in ("dgrad", "dgradtm")
TAPM = op in ("fwdtm", "dgradtm")
SA = BK + 8
SB = (BK + 8) if B_KMAJOR else (BN + 4)
A_TILE = BM * SA
B_TILE = (BN * SB) if B_KMAJOR else (BK * SB)
A_LOADS = BM * BK // THREADS
B_LOADS = BN * BK // THREADS
A_STEP = THREADS // BK
B_STEP = (THREADS // BK) if B_KMAJOR else (THREADS // BN)
assert WTM % 16 == 0 and WTN % 8 == 0 and BK % 8 == 0
assert THREADS % BK == 0 and (BM * BK) % THREADS == 0 and (BN * BK) % THREADS == 0
assert B_KMAJOR or THREADS % BN == 0
assert SPLIT in (1, 3) and STAGES >= 2
assert AVEC == 1 or (AVEC == 4 and op != "dgrad")
AV = BK // AVEC
A_VLOADS = BM * AV // THREADS
A_VSTEP = THREADS // AV
assert THREADS % AV == 0 and (BM * AV) % THREADS == 0
SC = WTN + 8
assert not STAGE_C or WTN % 32 == 0
# 3xTF32 keeps a temporary fragment per k8 step and twice the operand
# fragments: it gets the whole register file of a thread (one 256-thread or
# two 128-thread blocks per SM), spill-free; TF32 fits three or two blocks.
MIN_BLOCKS = (2 if THREADS >= 256 else 3) if SPLIT == 1 else (1 if THREADS >= 256 else 2)
%>
<%def name="params()">
    const float* __restrict__ asrc, const float* __restrict__ bsrc,
    float* __restrict__ out,
    int C, int H, int W, int F, int OH, int OW, int Cg, int Fg,
    int M, int N, int K, int k_chunk, int groups,
    u32 d1_magic, u32 d1_shift, u32 d2_magic, u32 d2_shift</%def>
// n / d for n < 2^31 with (magic, shift) from conv_igemm.fastdiv_magic(d).
__device__ __forceinline__ int fastdiv(int n, u32 magic, u32 shift)
{
    return (int)((__umulhi((u32)n, magic) + (u32)n) >> shift);
}

__device__ __forceinline__ u32 smem_addr(const float* p)
{
    return (u32)__cvta_generic_to_shared(p);
}

// 4-byte asynchronous copy; pred == false writes a zero and reads nothing.
__device__ __forceinline__ void cp_async4(u32 dst, const float* src, bool pred)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(dst), "l"(src), "r"(pred ? 4 : 0));
}

// 16-byte asynchronous copy (src and dst 16-byte aligned); pred == false
// writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(u32 dst, const float* src, bool pred)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(pred ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

// x rounded to TF32 (10-bit mantissa), half away from zero, as cvt.rna does
// for finite values: adding half a TF32 ulp and clearing the 13 low bits is
// two integer operations, where cvt.rna issues on a slow conversion pipe.
__device__ __forceinline__ u32 to_tf32(float x)
{
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

// d += a * b for one m16n8k8 tile (a: 4 registers, b: 2, d: 4).
__device__ __forceinline__ void mma_tf32(float* d, const u32* a, const u32* b)
{
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d = a * b (a zero accumulator).
__device__ __forceinline__ void mma_tf32_zero(float* d, const u32* a, const u32* b)
{
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.f));
}

// GEMM C[M, N] = A[M, K] B[K, N] per group (blockIdx.z % groups) and split-K
// slice (blockIdx.z / groups: k in [split * k_chunk, split * k_chunk + k_chunk)).
//   fwd:   A = w  (F, Cg, KH, KW)   B = x im2col    C = y  (B, F, OH, OW)
//          M = Fg, N = B*OH*OW, K = Cg*KH*KW; d1 = OH*OW, d2 = OW
//   dgrad: A = w                    B = dy gathered C = dx (B, C, H, W)
//          M = Cg, N = B*H*W,   K = Fg*KH*KW; d1 = H*W,   d2 = W
//   wgrad: A = dy (B, F, OH, OW)    B = x im2col^T  C = dw (F, Cg, KH, KW),
//          or split-K partials ws[split] of dw's shape
//          M = Fg, N = Cg*KH*KW, K = B*OH*OW; d1 = OH*OW, d2 = OW
// (the declaration carries the launch bounds, the definition the name)
extern "C" __global__ void __launch_bounds__(${THREADS}, ${MIN_BLOCKS}) ${name}(${params()});

extern "C" __global__ void ${name}(${params()})
{
    extern __shared__ float4 smem4[];
    float* As = reinterpret_cast<float*>(smem4);  // [STAGES][A_TILE]
    float* Bs = As + ${STAGES * A_TILE};           // [STAGES][B_TILE]

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int gid = lane >> 2;
    const int tig = lane & 3;
    const int warp_m = warp / ${WN};
    const int warp_n = warp % ${WN};
    const int n0 = blockIdx.x * ${BN};
    const int m0 = blockIdx.y * ${BM};
    const int grp = blockIdx.z % groups;
    const int split = blockIdx.z / groups;
    const int k_begin = split * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);
    const int ktiles = (k_end - k_begin + ${BK - 1}) / ${BK};
    const int HW = H * W;
    const int OHW = OH * OW;

% if AVEC == 1 or B_KMAJOR:
    // k-major load map (A in 4-byte copies, B for wgrad): element e of this
    // thread is tile row load_r + e * STEP, tile column load_k.
    const int load_k = tid % ${BK};
    const int load_r = tid / ${BK};
% endif
% if AVEC == 4:
    // A in 16-byte vectors: vector e of this thread is tile row
    // av_r + e * A_VSTEP, tile columns av_k .. av_k + 3
    const int av_k = (tid % ${AV}) * 4;
    const int av_r = tid / ${AV};
% endif
% if not B_KMAJOR:
    // n-major load map of B: element e is tile row (k) bn_k + e * B_STEP,
    // tile column (n) bn_n, the same n for every e: its pixel is decoded once.
    const int bn_n = tid % ${BN};
    const int bn_k = tid / ${BN};
    const int n_fixed = n0 + bn_n;
    const bool n_ok = n_fixed < N;
    const int n_img = fastdiv(n_fixed, d1_magic, d1_shift);
    const int n_pix = n_fixed - n_img * ${"OHW" if IS_FWD else "HW"};
    const int n_row = fastdiv(n_pix, d2_magic, d2_shift);
    const int n_col = n_pix - n_row * ${"OW" if IS_FWD else "W"};
%   if IS_FWD:
    // b_offset(fwd): x[n_img][grp*Cg + c][n_row*SH - PH + u][n_col*SW - PW + v]
    const int ih0 = n_row * ${SH} - ${PH};
    const int iw0 = n_col * ${SW} - ${PW};
    const float* b_base = bsrc + (n_img * C + grp * Cg) * HW;
%   else:
    // b_offset(dgrad): dy[n_img][grp*Fg + f][(ih + PH - u)/SH][(iw + PW - v)/SW]
    // where both divisions are exact and in range
    const int ohs = n_row + ${PH};
    const int ows = n_col + ${PW};
    const float* b_base = bsrc + (n_img * F + grp * Fg) * OHW;
%   endif
% endif
% if IS_FWD:
    const float* a_base = asrc + grp * Fg * K;  // a_offset(fwd): w[grp*Fg + m][k]
% elif op == "dgradtm":
    const float* a_base = asrc + grp * Cg * K;  // a_offset(dgradtm): wq[grp][m][k]
% elif op == "dgrad":
    const float* a_base = asrc + grp * Fg * Cg * ${KHKW};
% endif

% if op == "wgrad":
    // per column n0 + r of B: n = (c*KH + u)*KW + v -> (c*HW + u*W + v, u, v);
    // columns past N get u = -2^30, which fails every bounds check
    int4* n_tab = reinterpret_cast<int4*>(Bs + ${STAGES * B_TILE});
    for (int r = tid; r < ${BN}; r += ${THREADS}) {
        const int n = n0 + r;
        const int c = (int)((unsigned)n / ${KHKW}u);
        const int t = n - c * ${KHKW};
        const int u = (int)((unsigned)t / ${KW}u);
        const int v = t - u * ${KW};
        n_tab[r] = n < N ? make_int4(c * HW + u * W + v, u, v, 0)
                         : make_int4(0, -(1 << 30), 0, 0);
    }
    __syncthreads();
% endif

    auto load_tile = [&](int stage, int k0) {
        float* as = As + stage * ${A_TILE};
        float* bs = Bs + stage * ${B_TILE};
% if op in ("dgrad", "wgrad") or AVEC == 1:
        const int k = k0 + load_k;
        const bool k_ok = k < k_end;
% endif
% if op == "wgrad":
        // k is a pixel of the batch: k = (img * OH + oh) * OW + ow
        const int k_img = fastdiv(k, d1_magic, d1_shift);
        const int k_pix = k - k_img * OHW;
        const int k_oh = fastdiv(k_pix, d2_magic, d2_shift);
        const int k_ow = k_pix - k_oh * OW;
%   if AVEC == 1:
        const float* a_base = asrc + (k_img * F + grp * Fg) * OHW + k_pix;
%   endif
        const int ih0 = k_oh * ${SH} - ${PH};
        const int iw0 = k_ow * ${SW} - ${PW};
        const float* x_pix = bsrc + (k_img * C + grp * Cg) * HW + ih0 * W + iw0;
% elif op == "dgrad":
        // k = f * KHKW + t
        const int a_f = (int)((unsigned)k / ${KHKW}u);
        const int a_t = k - a_f * ${KHKW};
% endif
% if AVEC == 4:
        {
            // the 4 k of a vector are one aligned run of A's row, all in or
            // all out of [k_begin, k_end) (conv_igemm.a_vector_width)
            const int ka = k0 + av_k;
            const bool ka_ok = ka < k_end;
%   if op != "wgrad":
            const float* a_vbase = a_base + ka;  // a_offset(fwd): w[grp*Fg + m][ka]
%   else:
            // a_offset(wgrad): dy[img][grp*Fg + m][pix], ka = img*OHW + pix
            const int ka_img = fastdiv(ka, d1_magic, d1_shift);
            const float* a_vbase = asrc + (ka_img * F + grp * Fg) * OHW + (ka - ka_img * OHW);
%   endif
#pragma unroll
            for (int e = 0; e < ${A_VLOADS}; ++e) {
                const int r = av_r + e * ${A_VSTEP};
                const int m = m0 + r;
                const bool ok = ka_ok && m < M;
                const float* src = a_vbase + m * ${"OHW" if op == "wgrad" else "K"};
                cp_async16(smem_addr(as + r * ${SA} + av_k), ok ? src : asrc, ok);
            }
        }
% else:
#pragma unroll
        for (int e = 0; e < ${A_LOADS}; ++e) {
            const int r = load_r + e * ${A_STEP};
            const int m = m0 + r;
            const bool ok = k_ok && m < M;
% if op != "wgrad" and op != "dgrad":
            const float* src = a_base + m * K + k;
% elif op == "dgrad":
            // a_offset(dgrad): w[grp*Fg + f][m][t]
            const float* src = a_base + (a_f * Cg + m) * ${KHKW} + a_t;
% else:
            // a_offset(wgrad): dy[k_img][grp*Fg + m][k_pix]
            const float* src = a_base + m * OHW;
% endif
            cp_async4(smem_addr(as + r * ${SA} + load_k), ok ? src : asrc, ok);
        }
% endif
% if TAPM:
        {
            // the whole slice is tap t = k0 / CK; this thread's n is fixed
            const int tap = k0 / ${"Cg" if op == "fwdtm" else "Fg"};
            const int kc0 = k0 - tap * ${"Cg" if op == "fwdtm" else "Fg"};
            const int u = tap / ${KW};
            const int v = tap - u * ${KW};
%   if op == "fwdtm":
            // b_offset(fwdtm): x[n_img][grp*Cg + kc0 + kr][ih0 + u][iw0 + v]
            const int ih = ih0 + u;
            const int iw = iw0 + v;
            const bool ok = n_ok && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
            const float* src0 = b_base + kc0 * HW + ih * W + iw;
            const int kstep = ${B_STEP} * HW;
%   else:
            // b_offset(dgradtm): dy[n_img][grp*Fg + kc0 + kr][oh][ow] where
            // oh = (ih + PH - u)/SH, ow = (iw + PW - v)/SW are exact and in range
            const unsigned ohn = (unsigned)(ohs - u);
            const unsigned own = (unsigned)(ows - v);
            const unsigned oh = ohn / ${SH};
            const unsigned ow = own / ${SW};
            const bool ok = n_ok && oh * ${SH} == ohn && ow * ${SW} == own
                            && oh < (unsigned)OH && ow < (unsigned)OW;
            const float* src0 = b_base + kc0 * OHW + (int)oh * OW + (int)ow;
            const int kstep = ${B_STEP} * OHW;
%   endif
            const float* src = src0 + bn_k * (kstep / ${B_STEP});
#pragma unroll
            for (int e = 0; e < ${B_LOADS}; ++e) {
                const int kr = bn_k + e * ${B_STEP};
                cp_async4(smem_addr(bs + kr * ${SB} + bn_n), ok ? src : bsrc, ok);
                src += kstep;
            }
        }
% else:
#pragma unroll
        for (int e = 0; e < ${B_LOADS}; ++e) {
% if op == "wgrad":
            // b_offset(wgrad): x[k_img][grp*Cg + c][k_oh*SH - PH + u][k_ow*SW - PW + v]
            // (c*H + ih)*W + iw = (c*HW + u*W + v) + ih0*W + iw0, from the table
            const int r = load_r + e * ${B_STEP};
            const int4 tap = n_tab[r];
            const int ih = ih0 + tap.y;
            const int iw = iw0 + tap.z;
            const bool ok = k_ok && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
            const float* src = x_pix + tap.x;
            cp_async4(smem_addr(bs + r * ${SB} + load_k), ok ? src : bsrc, ok);
% else:
            const int kr = bn_k + e * ${B_STEP};
            const int kb = k0 + kr;
            const int c = (int)((unsigned)kb / ${KHKW}u);  // fwd: input channel; dgrad: filter
            const int t = kb - c * ${KHKW};
            const int u = (int)((unsigned)t / ${KW}u);
            const int v = t - u * ${KW};
%   if op == "fwd":
            const int ih = ih0 + u;
            const int iw = iw0 + v;
            const bool ok = n_ok && kb < k_end && (unsigned)ih < (unsigned)H
                            && (unsigned)iw < (unsigned)W;
            const float* src = b_base + (c * H + ih) * W + iw;
%   else:
            const unsigned ohn = (unsigned)(ohs - u);  // huge when negative
            const unsigned own = (unsigned)(ows - v);
            const unsigned oh = ohn / ${SH};
            const unsigned ow = own / ${SW};
            const bool ok = n_ok && kb < k_end && oh * ${SH} == ohn && ow * ${SW} == own
                            && oh < (unsigned)OH && ow < (unsigned)OW;
            const float* src = b_base + (c * OH + (int)oh) * OW + (int)ow;
%   endif
            cp_async4(smem_addr(bs + kr * ${SB} + bn_n), ok ? src : bsrc, ok);
% endif
        }
% endif
    };

    float acc[${MT}][${NT}][4];
#pragma unroll
    for (int i = 0; i < ${MT}; ++i)
#pragma unroll
        for (int j = 0; j < ${NT}; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

    auto compute_tile = [&](int stage) {
        // fragment rows of this thread: A row warp_m*WTM + mt*16 + gid (+8),
        // B column warp_n*WTN + nt*8 + gid; logical k = kk + 2*tig (+1)
        const float* as = As + stage * ${A_TILE} + (warp_m * ${WTM} + gid) * ${SA} + 2 * tig;
% if B_KMAJOR:
        const float* bs = Bs + stage * ${B_TILE} + (warp_n * ${WTN} + gid) * ${SB} + 2 * tig;
% else:
        const float* bs = Bs + stage * ${B_TILE} + (2 * tig) * ${SB} + warp_n * ${WTN} + gid;
% endif
% if SPLIT == 1:
#pragma unroll
        for (int kk = 0; kk < ${BK}; kk += 8) {
            u32 a_big[${MT}][4], b_big[${NT}][2];
#pragma unroll
            for (int mt = 0; mt < ${MT}; ++mt) {
                const float2 lo = *reinterpret_cast<const float2*>(as + (mt * 16) * ${SA} + kk);
                const float2 hi = *reinterpret_cast<const float2*>(as + (mt * 16 + 8) * ${SA} + kk);
                const float av[4] = {lo.x, hi.x, lo.y, hi.y};
#pragma unroll
                for (int q = 0; q < 4; ++q) a_big[mt][q] = to_tf32(av[q]);
            }
#pragma unroll
            for (int nt = 0; nt < ${NT}; ++nt) {
%   if B_KMAJOR:
                const float2 bv2 = *reinterpret_cast<const float2*>(bs + (nt * 8) * ${SB} + kk);
                const float bv[2] = {bv2.x, bv2.y};
%   else:
                const float bv[2] = {bs[kk * ${SB} + nt * 8], bs[(kk + 1) * ${SB} + nt * 8]};
%   endif
#pragma unroll
                for (int q = 0; q < 2; ++q) b_big[nt][q] = to_tf32(bv[q]);
            }
#pragma unroll
            for (int mt = 0; mt < ${MT}; ++mt)
#pragma unroll
                for (int nt = 0; nt < ${NT}; ++nt) mma_tf32(acc[mt][nt], a_big[mt], b_big[nt]);
        }
% else:
        // 3xTF32. The tensor cores' own accumulation is not fp32
        // round-to-nearest: inside the mma the addends are aligned and
        // truncated, a bias that grows with K when the accumulator is large
        // (~1e-5 relative at K of a few thousand). So the three products of
        // each k8 step go to a zeroed fragment t, the small terms first, and
        // only t is added to acc, with round-to-nearest FADDs. B's fragments
        // of the step are split once; A's one mt row at a time, which keeps
        // few fragments and temporaries live.
#pragma unroll
        for (int kk = 0; kk < ${BK}; kk += 8) {
            u32 b_big[${NT}][2], b_small[${NT}][2];
#pragma unroll
            for (int nt = 0; nt < ${NT}; ++nt) {
%   if B_KMAJOR:
                const float2 bv2 = *reinterpret_cast<const float2*>(bs + (nt * 8) * ${SB} + kk);
                const float bv[2] = {bv2.x, bv2.y};
%   else:
                const float bv[2] = {bs[kk * ${SB} + nt * 8], bs[(kk + 1) * ${SB} + nt * 8]};
%   endif
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    b_big[nt][q] = to_tf32(bv[q]);
                    b_small[nt][q] = to_tf32(bv[q] - __uint_as_float(b_big[nt][q]));
                }
            }
#pragma unroll
            for (int mt = 0; mt < ${MT}; ++mt) {
                u32 a_big[4], a_small[4];
                const float2 lo = *reinterpret_cast<const float2*>(as + (mt * 16) * ${SA} + kk);
                const float2 hi = *reinterpret_cast<const float2*>(as + (mt * 16 + 8) * ${SA} + kk);
                const float av[4] = {lo.x, hi.x, lo.y, hi.y};
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    a_big[q] = to_tf32(av[q]);
                    a_small[q] = to_tf32(av[q] - __uint_as_float(a_big[q]));
                }
#pragma unroll
                for (int nt = 0; nt < ${NT}; ++nt) {
                    float t[4];
                    mma_tf32_zero(t, a_small, b_big[nt]);
                    mma_tf32(t, a_big, b_small[nt]);
                    mma_tf32(t, a_big, b_big[nt]);
#pragma unroll
                    for (int q = 0; q < 4; ++q) acc[mt][nt][q] += t[q];
                }
            }
        }
% endif
    };

#pragma unroll
    for (int s = 0; s < ${STAGES - 1}; ++s) {
        if (s < ktiles) load_tile(s, k_begin + s * ${BK});
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<${STAGES - 2}>();  // tile kt has landed (this thread's part)
        __syncthreads();  // everyone's part; everyone is done with tile kt - 1
        const int next = kt + ${STAGES - 1};
        if (next < ktiles) load_tile(next % ${STAGES}, k_begin + next * ${BK});
        cp_async_commit();
        compute_tile(kt % ${STAGES});
    }
    cp_async_wait<0>();

% if IS_FWD:
<%  ROW = "(grp * Fg + m) * OHW" %>
% elif IS_DGRAD:
<%  ROW = "(grp * Cg + m) * HW" %>
% else:
<%  ROW = "(grp * Fg + m) * N" %>
% endif
<%def name="col_offset(n)">\
% if IS_FWD:
            // c_offset(fwd): y[img][grp*Fg + m][pix], n = img*OHW + pix
            const int img = fastdiv(${n}, d1_magic, d1_shift);
            const int off = img * F * OHW + (${n} - img * OHW);
% elif IS_DGRAD:
            // c_offset(dgrad): dx[img][grp*Cg + m][pix], n = img*HW + pix
            const int img = fastdiv(${n}, d1_magic, d1_shift);
            const int off = img * C * HW + (${n} - img * HW);
% else:
            // c_offset(wgrad): ws[split][grp*Fg + m][n] (dw itself when split = 0)
            const int off = ${n};
% endif
</%def>
% if op == "wgrad":
    float* out_base = out + split * F * N;
% else:
    float* out_base = out;
% endif
    // epilogue: acc[mt][nt][h*2 + j] is C[row m][column n] with
    // m = m0 + warp_m*WTM + mt*16 + gid + 8h, n = n0 + warp_n*WTN + nt*8 + 2*tig + j
% if STAGE_C:
    // Staged through this warp's [16][SC] buffer, one mt row block at a time:
    // written as float2 from the fragments, read back by rows, lane = column,
    // so each store instruction covers 32 consecutive n of one row.
    __syncthreads();  // every warp is done reading the pipeline's buffers
    float* stg = As + warp * ${16 * SC};
    int col_off[${WTN // 32}];
    bool col_ok[${WTN // 32}];
#pragma unroll
    for (int c = 0; c < ${WTN // 32}; ++c) {
        const int n = n0 + warp_n * ${WTN} + c * 32 + lane;
        col_ok[c] = n < N;
        {
${col_offset("n")}
            col_off[c] = off;
        }
    }
#pragma unroll
    for (int mt = 0; mt < ${MT}; ++mt) {
        __syncwarp();  // the previous block's reads are done
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int nt = 0; nt < ${NT}; ++nt)
                *reinterpret_cast<float2*>(stg + (gid + 8 * h) * ${SC} + nt * 8 + 2 * tig) =
                    make_float2(acc[mt][nt][h * 2], acc[mt][nt][h * 2 + 1]);
        __syncwarp();
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            const int m = m0 + warp_m * ${WTM} + mt * 16 + r;
            if (m >= M) break;  // warp-uniform; rows only grow
            const int row_off = ${ROW};
#pragma unroll
            for (int c = 0; c < ${WTN // 32}; ++c)
                if (col_ok[c]) out_base[row_off + col_off[c]] = stg[r * ${SC} + c * 32 + lane];
        }
    }
% else:
    int col_off[${NT}][2];
    bool col_ok[${NT}][2];
#pragma unroll
    for (int nt = 0; nt < ${NT}; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int n = n0 + warp_n * ${WTN} + nt * 8 + 2 * tig + j;
            col_ok[nt][j] = n < N;
            {
${col_offset("n")}
                col_off[nt][j] = off;
            }
        }
#pragma unroll
    for (int mt = 0; mt < ${MT}; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + warp_m * ${WTM} + mt * 16 + gid + 8 * h;
            if (m >= M) continue;
            const int row_off = ${ROW};
#pragma unroll
            for (int nt = 0; nt < ${NT}; ++nt)
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    if (col_ok[nt][j]) out_base[row_off + col_off[nt][j]] = acc[mt][nt][h * 2 + j];
        }
% endif
}
% if TAPM:

// The weights in this module's tap-major K order (conv_igemm.permuted_weights):
//   fwdtm:   wp[f][t][c]      = w[f][c][t]          (F, KHKW*Cg)
//   dgradtm: wq[g][c][t][f]   = w[g*Fg + f][c][t]   (G, Cg, KHKW*Fg)
// one thread per destination element, t = u*KW + v.
extern "C" __global__ void ${name}_wperm(
    const float* __restrict__ w, float* __restrict__ wp, int G, int Cg, int Fg)
{
    const index_t total = (index_t)G * Fg * Cg * ${KHKW};
    CC2_GRID_STRIDE_LOOP(i, total) {
%   if op == "fwdtm":
        const index_t f = i / (Cg * ${KHKW});
        const int r = (int)(i - f * (Cg * ${KHKW}));
        const int t = r / Cg;
        const int c = r - t * Cg;
        wp[i] = w[(f * Cg + c) * ${KHKW} + t];
%   else:
        const index_t gc = i / (${KHKW} * Fg);  // g * Cg + c
        const int r = (int)(i - gc * (${KHKW} * Fg));
        const int t = r / Fg;
        const int f = r - t * Fg;
        const index_t g = gc / Cg;
        const index_t c = gc - g * Cg;
        wp[i] = w[((g * Fg + f) * Cg + c) * ${KHKW} + t];
%   endif
    }
}
% endif
% if op == "wgrad":

// The split-K reduction of this module's wgrad kernel:
// out[i] = sum over s of ws[s][i], in slice order (deterministic).
extern "C" __global__ void ${name}_sum(
    const float* __restrict__ ws, float* __restrict__ out, index_t total, int splits)
{
    CC2_GRID_STRIDE_LOOP(i, total) {
        float s = 0.f;
        for (int k = 0; k < splits; ++k) s += ws[(index_t)k * total + i];
        out[i] = s;
    }
}
% endif
