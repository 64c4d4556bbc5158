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

#endif  // CC2OPS_COMMON_CUH
