// Asynchronous global -> shared copies (cp.async, sm_80+), for templates that
// stage tiles in shared memory. Pulled in with Mako's include tag after
// common.cuh, like it. (conv_igemm.cu has its own predicated variants.)
#ifndef CC2OPS_ASYNC_COPY_CUH
#define CC2OPS_ASYNC_COPY_CUH

// BYTES is 4, 8 or 16 and both addresses are BYTES-aligned; 16-byte copies
// bypass L1 (.cg), the others cannot (.ca). A thread's copies form a group
// at cc2_cp_async_commit(); cc2_cp_async_wait<N>() returns when at most N of
// the thread's groups are pending (other threads': a barrier after it).
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

#endif  // CC2OPS_ASYNC_COPY_CUH
