<%doc>
Implicit-GEMM convolution on tensor cores: mma.sync.m16n8k8 TF32 (sm_80+),
fp32 accumulation, cp.async global->shared copies in a STAGES-deep ring, the
im2col addresses computed on the fly (no column buffer).

The index maps are specified, and emulated in numpy, by
cc2ops/cuda/ops/conv/twins.py (a_offset, b_offset, c_offset, load maps): every
formula below has its twin there, under the same names.

Constants
  name, op       op: "fwd" (FilterActs), "dgrad" (ImageActs) or "wgrad"
                 (WeightActs; its module also has ${name}_sum, the split-K
                 reduction); "fwdtm", "dgradtm": tap-major K order
                 (k = (u*KW + v)*Cg + c, resp. (u*KW + v)*Fg + f) over weights
                 permuted by ${name}_wperm, each BK slice one tap (BK divides
                 Cg, resp. Fg), so B's copies are one pointer increment each;
                 "wgradtm" (WGMMA only): the weight gradient one filter tap
                 per block, see "wgmma weight gradient" below (its module has
                 ${name}_sum too)
  KH KW SH SW PH PW   filter size, stride, padding (rows x cols)
  BM BN BK       block tile of the GEMM C[M, N] = A[M, K] B[K, N]
  WM WN          warps along M and N (warp tile BM/WM x BN/WN)
  STAGES         depth of the cp.async ring (2 or 3; wgmma: 3 or 4)
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
  WGMMA          1: the Hopper warpgroup MMA main loop described under
                 "wgmma" below (sm_90a only; fwdtm, dgradtm and wgradtm,
                 SPLIT 1, AVEC 4 (wgradtm: 4 or 1), BK 32, WN 1, WM = BM/16);
                 0: mma.sync
  BNHWC          1 (WGMMA, fwdtm and dgradtm): B's tensor is the channels-last
                 copy, x as (B, H, W, C) or dy as (B, OH, OW, F): a B row is
                 one pixel's 32 channels of one tap, 128 contiguous bytes,
                 copied in 16-byte cp.async by the map of A (nhwc_b_copies)
  STREAMK        1 (WGMMA, fwdtm and dgradtm): the stream-K schedule below

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

wgmma (WGMMA = 1, compiled for sm_90a; twins.py's wgmma_* and gmma_*
functions specify and emulate every map below, under the same names)
  BM/64 warpgroups of 128 threads. Warpgroup g owns rows 64g .. 64g + 63 of
  the block tile and all BN columns: per k8 step it issues one
  wgmma.mma_async.m64nBNk8.f32.tf32.tf32 whose operands the tensor cores read
  from shared memory through matrix descriptors. tf32 wgmma reads A and B
  K-major only, so a stage is A [BM][32] then B [BN][32] (k contiguous), rows
  of 128 bytes in the 128-byte swizzle: 16-byte chunk j of row r sits at
  chunk position j ^ (r % 8) (sw128_offset). The stages start at the first
  1024-byte boundary of the dynamic shared memory (the swizzle works on
  address bits 4-9, so its 8-row atoms must be 1024-byte aligned).
  Descriptors (gmma_desc_sw128): layout SWIZZLE_128B, stride byte offset 1024
  (from one 8-row group to the next), the start address 32 bytes further per
  k8 step (the hardware applies the swizzle to the address it forms).
  Copies: A in 16-byte cp.async, 8 threads per row, whose 8 chunks land in 8
  distinct bank groups; B in 4-byte cp.async, each thread one column n for
  all its copies (its pixel decoded once, as above), a warp's copy
  instruction 8 columns x 4 consecutive k of one chunk: 32 distinct banks
  (wgmma_b_col, wgmma_b_k).
  Pipeline: the STAGES-deep ring runs STAGES - 2 tiles ahead and one wgmma
  group stays in flight. Per k tile kt: wait for the tile's copies,
  fence.proxy.async (the generic-proxy copies become visible to the async
  proxy the tensor cores read through), __syncthreads, wgmma.fence, BK/8
  wgmmas, commit, copy tile kt + STAGES - 2 into the stage of tile kt - 2
  (every warpgroup finished those wgmmas before the barrier), then
  wgmma.wait_group 1.
  Accumulators: d[i][q] of warp w of a warpgroup, lane l, is row
  16w + l/4 + 8(q/2), column 8i + 2(l%4) + q%2 of the warpgroup's 64 x BN
  tile: the m16n8 fragment layout, so the epilogue below serves unchanged
  with warp tiles of 16 x BN (warp 4g + w owns rows 16(4g + w) ..).
  Precision: the tensor cores drop the low 13 mantissa bits of the fp32 data
  they read (truncation), so ${name}_wperm rounds the weights to TF32 once;
  the activations are truncated.

stream-K (STREAMK = 1; twins.py's streamk_* functions and
emulate_streamk)
  A persistent grid of G blocks shares the iterations (tile, k tile) of all
  tiles x ktiles, tile-major (tile = (grp*tiles_n + n tile)*tiles_m + m tile):
  block b runs [T*b/G, T*(b+1)/G), T their count, G <= T, so every block
  runs at least one and whole waves of tiles no longer leave SMs idle. Each
  maximal run inside one tile is an item: a whole tile is stored as usual;
  a segment of a tile writes its accumulators to ws[b][slot] ([NACC]
  [THREADS], slot 0 for the block's first item, 1 for a later one), then
  counts itself on flags[tile]; the segment that arrives last sums every
  segment's partial in block order (its own read back too), zeroes the
  flag for the next launch and stores the tile. No block waits for another.

wgmma weight gradient (op "wgradtm"; twins.py's wgrad_* functions)
  Per filter tap t = u*KW + v: C[f, c] = sum over pixels k = (img*OH + oh)*OW
  + ow of dy[img][grp*Fg + f][oh][ow] * x[img][grp*Cg + c][oh*SH - PH + u]
  [ow*SW - PW + v]: M = Fg, N = Cg, K = B*OH*OW, both operands K-major in
  global memory, so both tiles are copied as A is above (rows of 32 k in the
  128-byte swizzle). blockIdx.z = (split*KHKW + t)*groups + grp; a block
  multiplies its split-K slice and stores C to dw[grp*Fg + f][c][t] (or to
  the partials ws[split] of dw's shape, summed by ${name}_sum).
  Copies: thread tid owns the 16-byte chunk k = 4(tid%8) .. + 3 of rows
  tid/8 + e*THREADS/8 of A (filters) and B (channels); its 4-byte copy s of
  a row is k = 4(tid%8) + ((s + tid/8) % 4) (wgmma_wgrad_k: a warp's copy
  instruction then covers 4 rows x 8 chunks x 4 distinct residues, all 32
  banks). The 4 pixels are decoded once per tile and serve every row of
  both operands. A's row takes one 16-byte copy where its 4 pixels are one
  16-byte aligned run of one image inside the slice (AVEC 4: dy's pointer
  is 16-byte aligned), else four 4-byte copies; B (x) takes 4-byte copies,
  zero-filled outside the image.
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
% if WGMMA:
<%
NWG = THREADS // 128  # warpgroups
TPN = THREADS // BN  # threads per column of B (each copies BK / TPN of its k)
ROWB = BK * 4  # bytes of a K-major operand row: 128, the swizzle's width
A_BYTES = BM * ROWB
B_BYTES = BN * ROWB
STAGE_BYTES = A_BYTES + B_BYTES
AHEAD = STAGES - 2  # tiles in flight ahead of the one computed
NACC = BN // 2  # accumulators per thread: 64 x BN over 128 threads
WGRADTM = op == "wgradtm"
assert (TAPM or WGRADTM) and SPLIT == 1 and BK == 32 and WN == 1
assert AVEC == 4 or (WGRADTM and AVEC == 1)
assert not WGRADTM or (BM * 8 % THREADS == 0 and BN * 8 % THREADS == 0)
assert THREADS == 128 * NWG and BM == 64 * NWG and WM * 16 == BM
assert THREADS % BN == 0 and TPN in (1, 2, 4) and BN % 8 == 0 and BN <= 256
assert STAGES >= 3 and STAGE_C in (0, 1)
WG_D = ", ".join("%" + str(i) for i in range(NACC))
WG_OUT = ", ".join('"+f"(d[' + str(i // 4) + '][' + str(i % 4) + '])' for i in range(NACC))
# two blocks per SM where their shared memory fits (228 KB, 1 KB reserved per block)
MIN_BLOCKS = 2 if 2 * (STAGES * STAGE_BYTES + 2048) <= 228 * 1024 else 1
%>
% endif
<%def name="params()">
    const float* __restrict__ asrc, const float* __restrict__ bsrc,
    float* __restrict__ out,
    int C, int H, int W, int F, int OH, int OW, int Cg, int Fg,
    int M, int N, int K, int k_chunk, int groups,
    u32 d1_magic, u32 d1_shift, u32 d2_magic, u32 d2_shift\
% if STREAMK:
,
    int sk_tiles_m, int sk_tiles_n, int sk_kt, float* __restrict__ sk_ws,
    int* __restrict__ sk_flags\
% endif
</%def>
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
% if WGMMA:

// ---- wgmma (sm_90a): see "wgmma" in the doc block --------------------------

// Byte offset of element (row, k) in a K-major operand tile of 128-byte rows
// in the 128-byte swizzle: 16-byte chunk k/4 of the row at chunk position
// (k/4) ^ (row % 8). k < 32.
__host__ __device__ __forceinline__ u32 sw128_offset(int row, int k)
{
    return (u32)(row * 128 + ((((k >> 2) ^ row) & 7) << 4) + (k & 3) * 4);
}

// The wgmma matrix descriptor of a K-major, 128-byte-swizzled operand whose
// first row starts at shared address addr: bits 0-13 addr >> 4; bits 16-29 the
// leading byte offset >> 4 (unused by swizzled K-major layouts; 16 bytes as
// CUTLASS sets it); bits 32-45 the stride byte offset >> 4 (1024 bytes from
// one 8-row group to the next); bits 49-51 base offset 0 (the 8-row atoms are
// 1024-byte aligned); bits 62-63 layout type 1 (SWIZZLE_128B).
__host__ __device__ __forceinline__ u64 gmma_desc_sw128(u32 addr)
{
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)(16u >> 4) << 16)
           | ((u64)(1024u >> 4) << 32) | ((u64)1 << 62);
}

// The copy maps. A: 16-byte vector e of thread tid is row
// wgmma_a_row(tid, e), k = wgmma_a_k(tid) .. + 3 (8 threads per row).
__host__ __device__ __forceinline__ int wgmma_a_row(int tid, int e)
{
    return (tid >> 3) + e * ${THREADS // 8};
}

__host__ __device__ __forceinline__ int wgmma_a_k(int tid) { return (tid & 7) * 4; }

// B: every copy of thread tid is column wgmma_b_col(tid); copy (c, s), for
// c < BK/4 and s < 4/TPN, is k = wgmma_b_k(tid, c, s). Lanes 8j .. 8j + 7 of
// a warp take 8 consecutive columns and, at each copy, k residue
// (j + TPN*s) % 4 of chunk c: a warp writes 8 columns x 4 residues, all 32
// banks once through the swizzle.
__host__ __device__ __forceinline__ int wgmma_b_col(int tid)
{
    return (tid & 7) + 8 * (tid / ${8 * TPN});
}

__host__ __device__ __forceinline__ int wgmma_b_k(int tid, int c, int s)
{
    return 4 * c + (((tid >> 3) + ${TPN} * s) & 3);
}
%   if WGRADTM:

// wgradtm, A and B: copy s < 4 of each row wgmma_a_row(tid, e) of thread tid
// is k = wgmma_wgrad_k(tid, s), within the chunk of wgmma_a_k(tid); rows
// 4j .. 4j + 3 of a warp's copy take 4 distinct residues: 32 banks.
__host__ __device__ __forceinline__ int wgmma_wgrad_k(int tid, int s)
{
    return (tid & 7) * 4 + ((s + (tid >> 3)) & 3);
}
%   endif

// Orders this thread's generic-proxy shared-memory writes (cp.async, st)
// before later async-proxy accesses (wgmma operand reads).
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Returns when at most N of this warpgroup's committed wgmma groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

// Keeps the compiler from moving accesses to the accumulators across the
// asynchronous wgmmas (CUTLASS's warpgroup_fence_operand); emits nothing.
__device__ __forceinline__ void fence_acc(float (&d)[${NACC // 4}][4])
{
#pragma unroll
    for (int i = 0; i < ${NACC // 4}; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) asm volatile("" : "+f"(d[i][q]) :: "memory");
}

// d += A B for this warpgroup, A 64 x 8 (desc_a) and B 8 x ${BN} (desc_b,
// stored as its transpose, K-major) in shared memory. d[i][q] of warp w of the
// warpgroup, lane l: row 16w + l/4 + 8(q/2), column 8i + 2(l%4) + q%2.
__device__ __forceinline__ void wgmma_tf32(float (&d)[${NACC // 4}][4], u64 desc_a, u64 desc_b)
{
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %${NACC + 2}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n${BN}k8.f32.tf32.tf32 "
        "{${WG_D}}, %${NACC}, %${NACC + 1}, p, 1, 1;\n"
        "}\n"
        : ${WG_OUT}
        : "l"(desc_a), "l"(desc_b), "n"(1));
}
% endif

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
% if WGMMA:
    // the pipeline's stages start at the first 1024-byte boundary (see
    // wgmma_mainloop); As is the epilogue's staging buffer
    float* As = reinterpret_cast<float*>(smem4);
% else:
    float* As = reinterpret_cast<float*>(smem4);  // [STAGES][A_TILE]
    float* Bs = As + ${STAGES * A_TILE};           // [STAGES][B_TILE]
% endif

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int gid = lane >> 2;
    const int tig = lane & 3;
    const int warp_m = warp / ${WN};
    const int warp_n = warp % ${WN};
% if STREAMK:
${streamk_loop()}\
}
% else:
    const int n0 = blockIdx.x * ${BN};
    const int m0 = blockIdx.y * ${BM};
    const int grp = blockIdx.z % groups;
% if op == "wgradtm":
    // blockIdx.z = (split * KHKW + tap) * groups + grp: this block's filter tap
    const int tap = (blockIdx.z / groups) % ${KHKW};
    const int split = blockIdx.z / (groups * ${KHKW});
% else:
    const int split = blockIdx.z / groups;
% endif
    const int k_begin = split * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);
    const int ktiles = (k_end - k_begin + ${BK - 1}) / ${BK};
    const int HW = H * W;
    const int OHW = OH * OW;

% if WGMMA:
${wgmma_mainloop()}\
% else:
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
${b_pixel()}\
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
${tap_source(B_STEP)}\
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
% endif

${epilogue()}\
}
% endif
% if TAPM:

// The weights in this module's tap-major K order (conv_igemm.permuted_weights):
//   fwdtm:   wp[f][t][c]      = w[f][c][t]          (F, KHKW*Cg)
//   dgradtm: wq[g][c][t][f]   = w[g*Fg + f][c][t]   (G, Cg, KHKW*Fg)
// one thread per destination element, t = u*KW + v.
% if WGMMA:
// (rounded to TF32 here: the tensor cores would drop their low 13 bits)
% endif
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
%   if WGMMA:
        wp[i] = __uint_as_float(to_tf32(w[(f * Cg + c) * ${KHKW} + t]));  // wgmma would truncate
%   else:
        wp[i] = w[(f * Cg + c) * ${KHKW} + t];
%   endif
%   else:
        const index_t gc = i / (${KHKW} * Fg);  // g * Cg + c
        const int r = (int)(i - gc * (${KHKW} * Fg));
        const int t = r / Fg;
        const int f = r - t * Fg;
        const index_t g = gc / Cg;
        const index_t c = gc - g * Cg;
%   if WGMMA:
        wp[i] = __uint_as_float(to_tf32(w[((g * Fg + f) * Cg + c) * ${KHKW} + t]));  // wgmma would truncate
%   else:
        wp[i] = w[((g * Fg + f) * Cg + c) * ${KHKW} + t];
%   endif
%   endif
    }
}
% endif
% if op in ("wgrad", "wgradtm"):

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
<%def name="b_pixel()">\
## The pixel of this thread's B column n0 + bn_n (fixed for all its copies),
## and where its data starts: shared by the mma.sync and wgmma loops.
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
</%def>\
<%def name="tap_source(step)">\
## A tap-major slice's tap and this thread's first source element (tile row
## kr = 0 of its column); kstep is the source step of `step` k.
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
            const int kstep = ${step} * HW;
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
            const int kstep = ${step} * OHW;
%   endif
</%def>\
<%def name="nhwc_b_pixels()">\
## BNHWC = 1: the pixels of the B rows this thread copies (rows
## wgmma_a_row(tid, e), as A's), decoded once (twins.b_offset, nhwc).
<%
NBR = BN * 8 // THREADS
%>\
    // B channels-last: row r of the tile is pixel n0 + r, its 32 k one tap's
    // 32 consecutive channels (filters): 16-byte copies, 8 threads per row,
    // the map of A (wgmma_a_row, wgmma_a_k)
    int b_img[${NBR}];  // the pixel's image times the pixels of an image
    int b_row[${NBR}];  // fwd: oh*SH - PH; dgrad: ih + PH
    int b_col[${NBR}];  // fwd: ow*SW - PW; dgrad: iw + PW
    bool b_in[${NBR}];  // n < N
#pragma unroll
    for (int e = 0; e < ${NBR}; ++e) {
        const int n = n0 + wgmma_a_row(tid, e);
        const int img = fastdiv(n, d1_magic, d1_shift);
        const int pix = n - img * ${"OHW" if IS_FWD else "HW"};
        const int row = fastdiv(pix, d2_magic, d2_shift);
        const int col = pix - row * ${"OW" if IS_FWD else "W"};
        b_in[e] = n < N;
%   if IS_FWD:
        b_img[e] = img * HW;
        b_row[e] = row * ${SH} - ${PH};
        b_col[e] = col * ${SW} - ${PW};
%   else:
        b_img[e] = img * OHW;
        b_row[e] = row + ${PH};
        b_col[e] = col + ${PW};
%   endif
    }
</%def>\
<%def name="nhwc_b_copies()">\
## BNHWC = 1: load_tile's B copies (twins.b_offset with nhwc=True).
        {
            // the whole slice is tap t = k0 / CK; kc0 its first channel (filter)
            const int tap = k0 / ${"Cg" if op == "fwdtm" else "Fg"};
            const int kc0 = k0 - tap * ${"Cg" if op == "fwdtm" else "Fg"};
            const int u = tap / ${KW};
            const int v = tap - u * ${KW};
%   if op == "fwdtm":
            // x as (B, H, W, C): xh[img][ih][iw][grp*Cg + kc0 + k]
            const float* b_chan = bsrc + grp * Cg + kc0 + a_k;
%   else:
            // dy as (B, OH, OW, F): dyh[img][oh][ow][grp*Fg + kc0 + k]
            const float* b_chan = bsrc + grp * Fg + kc0 + a_k;
%   endif
#pragma unroll
            for (int e = 0; e < ${BN * 8 // THREADS}; ++e) {
%   if op == "fwdtm":
                const int ih = b_row[e] + u;
                const int iw = b_col[e] + v;
                const bool ok = b_in[e] && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
                const float* src = b_chan + (b_img[e] + ih * W + iw) * C;
%   else:
                const unsigned ohn = (unsigned)(b_row[e] - u);
                const unsigned own = (unsigned)(b_col[e] - v);
                const unsigned oh = ohn / ${SH};
                const unsigned ow = own / ${SW};
                const bool ok = b_in[e] && oh * ${SH} == ohn && ow * ${SW} == own
                                && oh < (unsigned)OH && ow < (unsigned)OW;
                const float* src = b_chan + (b_img[e] + (int)oh * OW + (int)ow) * F;
%   endif
                cp_async16(bs + sw128_offset(wgmma_a_row(tid, e), a_k), ok ? src : bsrc, ok);
            }
        }
</%def>\
<%def name="wgmma_mainloop()">\
## The WGMMA = 1 main loop (see "wgmma" in the doc block): leaves C's tile in
## acc[0][i][q], the layout of the mma.sync loop's acc[mt][nt][q] with MT = 1.
<%
CSTEP = "HW" if op == "fwdtm" else "OHW"
%>\
    // ---- wgmma main loop ----
    const u32 smem0 = (smem_addr(As) + 1023u) & ~1023u;  // stage s at + s * STAGE_BYTES
    const int wg = warp >> 2;  // this warpgroup's rows: 64 * wg .. + 63
% if op == "wgradtm":
${wgrad_load_tile()}\
% else:
    // A: 16-byte copies of row wgmma_a_row(tid, e), k = a_k .. a_k + 3
    const int a_k = wgmma_a_k(tid);
    // a_offset(tap-major): wp[grp*rows + m][k], a row of K permuted weights
    const float* a_base = asrc + grp * ${"Fg" if op == "fwdtm" else "Cg"} * K;
%   if BNHWC:
${nhwc_b_pixels()}\
%   else:
    // B: this thread's column for all its copies, its pixel decoded once
    const int bn_n = wgmma_b_col(tid);
${b_pixel()}\
%   endif

    auto load_tile = [&](int stage, int k0) {
        const u32 as = smem0 + stage * ${STAGE_BYTES};
        const u32 bs = as + ${A_BYTES};
        {
            // the 4 k of a vector lie in [k_begin, k_end) (K % BK == 0)
            const int ka = k0 + a_k;
            const bool ka_ok = ka < k_end;
#pragma unroll
            for (int e = 0; e < ${BM * 8 // THREADS}; ++e) {
                const int r = wgmma_a_row(tid, e);
                const int m = m0 + r;
                const bool ok = ka_ok && m < M;
                cp_async16(as + sw128_offset(r, a_k), ok ? a_base + m * K + ka : asrc, ok);
            }
        }
%   if BNHWC:
${nhwc_b_copies()}\
%   else:
        {
${tap_source(1)}\
#pragma unroll
            for (int c = 0; c < ${BK // 4}; ++c)
#pragma unroll
                for (int s = 0; s < ${4 // TPN}; ++s) {
                    const int kr = wgmma_b_k(tid, c, s);
                    cp_async4(bs + sw128_offset(bn_n, kr), ok ? src0 + kr * kstep : bsrc, ok);
                }
        }
%   endif
    };
% endif

    float acc[1][${NACC // 4}][4];
#pragma unroll
    for (int i = 0; i < ${NACC // 4}; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[0][i][q] = 0.f;

#pragma unroll
    for (int s = 0; s < ${AHEAD}; ++s) {
        if (s < ktiles) load_tile(s, k_begin + s * ${BK});
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<${AHEAD - 1}>();  // tile kt has landed (this thread's part)
        fence_proxy_async();  // ... and is visible to the wgmmas' async proxy
        __syncthreads();  // everyone's part; every warpgroup is done with tile kt - 2
        const u32 stage = smem0 + (kt % ${STAGES}) * ${STAGE_BYTES};
        const u32 as = stage + wg * ${64 * ROWB};
        const u32 bs = stage + ${A_BYTES};
        fence_acc(acc[0]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < ${BK // 8}; ++kk)  // a k8 step is 32 bytes of each row
            wgmma_tf32(acc[0], gmma_desc_sw128(as + kk * 32), gmma_desc_sw128(bs + kk * 32));
        wgmma_commit();
        fence_acc(acc[0]);
        // into the stage of tile kt - 2: no wgmma reads it any more
        const int next = kt + ${AHEAD};
        if (next < ktiles) load_tile(next % ${STAGES}, k_begin + next * ${BK});
        cp_async_commit();
        wgmma_wait<1>();  // this warpgroup's wgmmas of tile kt - 1 are done
        fence_acc(acc[0]);
    }
    wgmma_wait<0>();
    fence_acc(acc[0]);
    cp_async_wait<0>();
</%def>\
<%def name="wgrad_load_tile()">\
## wgradtm's copies (see "wgmma weight gradient" in the doc block): the
## load_tile of wgmma_mainloop.
    // this block's filter tap (u, v): the input pixel is (oh*SH - PH + u, ow*SW - PW + v)
    const int u = tap / ${KW};
    const int v = tap - u * ${KW};
    // this thread's 16-byte chunk of every row it copies
    const int a_k = wgmma_a_k(tid);
%   if AVEC == 4:
    const int a_rot = (tid >> 3) & 3;  // copy s = 0 is k = a_k + a_rot
%   endif

    auto load_tile = [&](int stage, int k0) {
        const u32 as = smem0 + stage * ${STAGE_BYTES};
        const u32 bs = as + ${A_BYTES};
        // wgrad_pixels: the 4 pixels k = k0 + wgmma_wgrad_k(tid, s), decoded
        // once for all rows of A (dy) and B (x)
        int a_off[4], b_off[4];
        bool k_ok[4], b_ok[4];
%   if AVEC == 4:
        int k_img[4];  // the 4 pixels' images
%   endif
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int k = k0 + wgmma_wgrad_k(tid, s);
            const int img = fastdiv(k, d1_magic, d1_shift);
            const int pix = k - img * OHW;
            const int oh = fastdiv(pix, d2_magic, d2_shift);
            const int ow = pix - oh * OW;
            const int ih = oh * ${SH} - ${PH} + u;
            const int iw = ow * ${SW} - ${PW} + v;
%   if AVEC == 4:
            k_img[s] = img;
%   endif
            k_ok[s] = k < k_end;
            b_ok[s] = k_ok[s] && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
            a_off[s] = img * F * OHW + pix;     // a_offset(wgradtm): dy[img][row][pix]
            b_off[s] = img * C * HW + ih * W + iw;  // b_offset(wgradtm): x[img][row][ih][iw]
        }
%   if AVEC == 4:
        // one run of 4 pixels of one image inside the slice: 16-byte copies
        // for the rows where it is 16-byte aligned
        const bool run = k_ok[0] && k_ok[1] && k_ok[2] && k_ok[3] && k_img[0] == k_img[1]
                         && k_img[0] == k_img[2] && k_img[0] == k_img[3];
        const int run_off = a_off[0] - a_rot;  // pixel k0 + a_k
%   endif
#pragma unroll
        for (int e = 0; e < ${BM * 8 // THREADS}; ++e) {
            const int r = wgmma_a_row(tid, e);
            const int m = m0 + r;
            const int row = (grp * Fg + m) * OHW;
%   if AVEC == 4:
            if (run && m < M && ((run_off + row) & 3) == 0) {
                cp_async16(as + sw128_offset(r, a_k), asrc + run_off + row, true);
                continue;
            }
%   endif
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                const bool ok = k_ok[s] && m < M;
                const int kr = wgmma_wgrad_k(tid, s);
                cp_async4(as + sw128_offset(r, kr), ok ? asrc + a_off[s] + row : asrc, ok);
            }
        }
#pragma unroll
        for (int e = 0; e < ${BN * 8 // THREADS}; ++e) {
            const int r = wgmma_a_row(tid, e);
            const int n = n0 + r;
            const int row = (grp * Cg + n) * HW;
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                const bool ok = b_ok[s] && n < N;
                const int kr = wgmma_wgrad_k(tid, s);
                cp_async4(bs + sw128_offset(r, kr), ok ? bsrc + b_off[s] + row : bsrc, ok);
            }
        }
    };
</%def>\
<%def name="epilogue()">\
## C's tile (acc) to the output: the end of every kernel of the template.
% if IS_FWD:
<%  ROW = "(grp * Fg + m) * OHW" %>
% elif IS_DGRAD:
<%  ROW = "(grp * Cg + m) * HW" %>
% elif op == "wgradtm":
<%  ROW = "(grp * Fg + m) * N * " + str(KHKW) + " + tap" %>
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
% elif op == "wgradtm":
            // c_offset(wgradtm): ws[split][grp*Fg + m][n][tap] (dw itself
            // when split = 0), n a channel
            const int off = ${n} * ${KHKW};
% else:
            // c_offset(wgrad): ws[split][grp*Fg + m][n] (dw itself when split = 0)
            const int off = ${n};
% endif
</%def>
% if op == "wgrad":
    float* out_base = out + split * F * N;
% elif op == "wgradtm":
    float* out_base = out + split * F * N * ${KHKW};
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
</%def>\
<%def name="streamk_loop()">\
## STREAMK = 1: the kernel body after the thread indices (see "stream-K" in
## the doc block; twins.streamk_items and emulate_streamk are its twins).
    const int HW = H * W;
    const int OHW = OH * OW;
    // this block's run [it, it_stop) of the iterations (tile, k tile), tile-major
    const int sk_tiles = sk_tiles_m * sk_tiles_n * groups;
    const long long sk_total = (long long)sk_tiles * sk_kt;
    long long it = sk_total * blockIdx.x / gridDim.x;
    const long long it_stop = sk_total * (blockIdx.x + 1) / gridDim.x;
    int sk_slot = 0;  // this block's first item writes its partial to slot 0, a later one to 1
    __shared__ int sk_last;
    while (it < it_stop) {
        const int tile = (int)(it / sk_kt);
        const int kt_lo = (int)(it - (long long)tile * sk_kt);
        const int kt_hi = (int)min((long long)sk_kt, kt_lo + (it_stop - it));
        it += kt_hi - kt_lo;
        const int slot = sk_slot;
        sk_slot = 1;
        // tile = (grp * tiles_n + n tile) * tiles_m + m tile
        const int m0 = (tile % sk_tiles_m) * ${BM};
        const int n0 = (tile / sk_tiles_m % sk_tiles_n) * ${BN};
        const int grp = tile / (sk_tiles_m * sk_tiles_n);
        const int k_begin = kt_lo * ${BK};
        const int k_end = min(K, kt_hi * ${BK});
        const int ktiles = kt_hi - kt_lo;
${wgmma_mainloop()}\
        if (kt_lo != 0 || kt_hi != sk_kt) {
            // one segment of a tile that several blocks share: its partial
            // goes to ws[block][slot] as [NACC][THREADS]; the segment that
            // arrives last sums them all in block order (deterministic)
            // and stores the tile
            float* mine = sk_ws + ((size_t)blockIdx.x * 2 + slot) * ${NACC * THREADS};
#pragma unroll
            for (int i = 0; i < ${NACC // 4}; ++i)
#pragma unroll
                for (int q = 0; q < 4; ++q) mine[(i * 4 + q) * ${THREADS} + tid] = acc[0][i][q];
            __threadfence();
            __syncthreads();
            // the tile's blocks: those holding its first and its last iteration
            const long long t_first = (long long)tile * sk_kt;
            const int b_first = (int)(((t_first + 1) * gridDim.x - 1) / sk_total);
            const int b_last = (int)(((t_first + sk_kt) * gridDim.x - 1) / sk_total);
            if (tid == 0) sk_last = atomicAdd(sk_flags + tile, 1) == b_last - b_first;
            __syncthreads();
            if (!sk_last) continue;
            __threadfence();
            if (tid == 0) sk_flags[tile] = 0;  // zero again for the next launch
            // b_first's segment is its last item (slot 1) when its run starts
            // before the tile; the sum reads this block's own partial back too
            const int first_slot = sk_total * b_first / gridDim.x < t_first ? 1 : 0;
            for (int b = b_first; b <= b_last; ++b) {
                const float* part = sk_ws + ((size_t)b * 2 + (b == b_first ? first_slot : 0))
                                            * ${NACC * THREADS} + tid;
#pragma unroll
                for (int i = 0; i < ${NACC // 4}; ++i)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const float v = __ldcg(part + (i * 4 + q) * ${THREADS});
                        acc[0][i][q] = b == b_first ? v : acc[0][i][q] + v;
                    }
            }
        }
${epilogue()}\
        __syncthreads();  // the epilogue's staging buffer is the next item's stages
    }
</%def>\
