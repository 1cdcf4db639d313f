/* SPDX-License-Identifier: Apache-2.0
 *
 * dk_launch.cuh - what the CUDA kernel files (dev_kernels.cu, dev_kernels_q4.cu)
 * share: the block size, the grid for a problem, pointer alignment, the
 * 16-byte pack the kernels load and store (one ld.global.nc.v4 / st.global.v4
 * per thread and step, coalesced across the warp) and the float element types.
 */
#ifndef LOOM_DK_LAUNCH_CUH
#define LOOM_DK_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "dev_elem.h"

namespace loom_dk {

constexpr int kThreads = 256;

/* Blocks for `work` independent items of kThreads threads each, capped at a
 * few blocks per SM (the kernels stride over the rest). 0 or the CUDA error
 * of asking the device. */
int grid_for(size_t work, unsigned *blocks);

static inline bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* 16 bytes as elements of T. */
template <typename T> union Pack {
    uint4 v;
    T e[16 / sizeof(T)];
};

/* The 16-byte accesses are the toolkit's inline-assembly intrinsics, so each
 * is one vector instruction whatever the optimiser does with the code around
 * it (plain uint4 accesses were split into four scalar ones where a branch
 * also stored the elements one by one).
 *
 * Read-only load through the non-coherent path (ld.global.nc.v4). When the
 * output is one of the inputs a thread reads an element before it writes it,
 * and no thread reads what another wrote, so the path stays valid in place. */
__device__ static inline uint4 load16_nc(const void *p)
{
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

/* Load from memory the kernel also writes (ld.global.cg.v4: through L2). */
__device__ static inline uint4 load16(const void *p)
{
    return __ldcg(reinterpret_cast<const uint4 *>(p));
}

/* st.global.wb.v4: the default write-back store. */
__device__ static inline void store16(void *p, uint4 v)
{
    __stwb(reinterpret_cast<uint4 *>(p), v);
}

/* The kernel's first thread and the grid's thread count. */
__device__ static inline size_t thread_index()
{
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ static inline size_t thread_count()
{
    return (size_t)gridDim.x * blockDim.x;
}

/* The codec's and the cast's element types: float32, float16 and bfloat16
 * as float32 (dev_elem.h's conversions). */
struct CF32 {
    typedef float S;
    __device__ static float load(S x)
    {
        return x;
    }
    __device__ static S store(float f)
    {
        return f;
    }
};
struct CF16 {
    typedef uint16_t S;
    __device__ static float load(S x)
    {
        return loom_de_f16_decode(x);
    }
    __device__ static S store(float f)
    {
        return loom_de_f16_encode(f);
    }
};
struct CBF16 {
    typedef uint16_t S;
    __device__ static float load(S x)
    {
        return loom_de_bf16_decode(x);
    }
    __device__ static S store(float f)
    {
        return loom_de_bf16_encode(f);
    }
};

} // namespace loom_dk

#endif
