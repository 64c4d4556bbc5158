// Shared definitions of the cc2ops kernel templates.
// Templates pull this in with Mako's include tag (not #include), so every
// rendered kernel is one self-contained translation unit and the cubin cache
// key covers this header too. No Mako syntax in here: it is rendered as well.
#ifndef CC2OPS_COMMON_CUH
#define CC2OPS_COMMON_CUH

// 64-bit indices: tensors of more than 2^31 elements are ordinary on an H200.
typedef long long index_t;

// Element types by size (copies and fills move bits, not values).
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Floating types by the numpy dtype names the Python side uses.
typedef float float32;
typedef double float64;

// for (index_t i = ...; i < n; ...) over a 1-D grid of any size.
#define CC2_GRID_STRIDE_LOOP(i, n) for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < (index_t)(n); i += (index_t)gridDim.x * blockDim.x)

// Read-only loads through the non-coherent cache; only for data no thread of
// the kernel writes.
template <typename T>
__device__ __forceinline__ T cc2_ldg(const T* p) { return __ldg(p); }

// Asynchronous global -> shared copies (sm_80+): BYTES is 4, 8 or 16 and both
// addresses are BYTES-aligned; 16-byte copies bypass L1 (.cg), the others
// cannot (.ca). A thread's copies form a group at cc2_cp_async_commit();
// cc2_cp_async_wait<N>() returns when at most N of its groups are pending.
template <int BYTES>
__device__ __forceinline__ void cc2_cp_async(void* smem_dst, const void* src)
{
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
    const unsigned int dst = (unsigned int)__cvta_generic_to_shared(smem_dst);
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" :: "r"(dst), "l"(src), "n"(BYTES));
}

__device__ __forceinline__ void cc2_cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void cc2_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

#endif  // CC2OPS_COMMON_CUH
