/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_kernels.cu - the CUDA n-input reduce, copy and cast of dev_kernels.h,
 * plus loom_dk_preload (the codec is dev_kernels_q4.cu). Every value goes
 * through dev_elem.h's functions in the host twins' order (source 0, then
 * 1..nsrc-1, one rounding), so the results are dev_kernels_host.c's bits.
 *
 * Memory: each thread strides over 16-byte packs (one ld.global.nc.v4 per
 * source, one st.global.v4), when every pointer sits at the same offset
 * modulo 16: the elements before the first 16-byte boundary (the head) and
 * after the last whole pack (the tail) are done one at a time by the same
 * kernel, as is everything when the pointers' offsets differ. Indices are
 * size_t, so n above 2^31 works. The sources travel by value in a struct of
 * LOOM_DK_MAX_SRCS pointers; the loop over them is unrolled to the smallest
 * of 2, 8 and 32 that covers nsrc, so the pointers stay in the parameter
 * space and no kernel has a stack frame.
 */
#include <cuda_runtime.h>

#include "dev_elem.h"
#include "dev_kernels.h"
#include "dk_launch.cuh"

namespace loom_dk {

struct Srcs {
    const void *p[LOOM_DK_MAX_SRCS];
};

/* ---- Element traits: storage S, accumulator A, the op, the rounding ------ */

/* Integers: sum/prod wrap in the unsigned type of the same width, max/min and
 * avg's division use the datatype's signedness. */
#define DK_INT(Name, T, U, s, u)                                                                   \
    struct Name {                                                                                  \
        typedef T S;                                                                               \
        typedef T A;                                                                               \
        __device__ static A load(S x)                                                              \
        {                                                                                          \
            return x;                                                                              \
        }                                                                                          \
        template <int OP> __device__ static A acc(A a, A b)                                        \
        {                                                                                          \
            if constexpr (OP == loomSum)                                                           \
                return (T)loom_de_sum_##u((U)a, (U)b);                                             \
            else if constexpr (OP == loomProd)                                                     \
                return (T)loom_de_prod_##u((U)a, (U)b);                                            \
            else if constexpr (OP == loomMax)                                                      \
                return loom_de_max_##s(a, b);                                                      \
            else                                                                                   \
                return loom_de_min_##s(a, b);                                                      \
        }                                                                                          \
        __device__ static S fin(A a, int nranks, bool avg)                                         \
        {                                                                                          \
            return avg ? loom_de_avg_##s(a, nranks) : a;                                           \
        }                                                                                          \
    };

DK_INT(EI8, int8_t, uint8_t, i8, u8)
DK_INT(EU8, uint8_t, uint8_t, u8, u8)
DK_INT(EI32, int32_t, uint32_t, i32, u32)
DK_INT(EU32, uint32_t, uint32_t, u32, u32)
DK_INT(EI64, int64_t, uint64_t, i64, u64)
DK_INT(EU64, uint64_t, uint64_t, u64, u64)

#define DK_FLOAT(Name, T, s)                                                                       \
    struct Name {                                                                                  \
        typedef T S;                                                                               \
        typedef T A;                                                                               \
        __device__ static A load(S x)                                                              \
        {                                                                                          \
            return x;                                                                              \
        }                                                                                          \
        template <int OP> __device__ static A acc(A a, A b)                                        \
        {                                                                                          \
            if constexpr (OP == loomSum)                                                           \
                return loom_de_sum_##s(a, b);                                                      \
            else if constexpr (OP == loomProd)                                                     \
                return loom_de_prod_##s(a, b);                                                     \
            else if constexpr (OP == loomMax)                                                      \
                return loom_de_max_##s(a, b);                                                      \
            else                                                                                   \
                return loom_de_min_##s(a, b);                                                      \
        }                                                                                          \
        __device__ static S fin(A a, int nranks, bool avg)                                         \
        {                                                                                          \
            return avg ? loom_de_avg_##s(a, nranks) : a;                                           \
        }                                                                                          \
    };

DK_FLOAT(EF32, float, f32)
DK_FLOAT(EF64, double, f64)

/* float16 and bfloat16: accumulate in float32, round once. */
#define DK_NARROW(Name, s)                                                                         \
    struct Name {                                                                                  \
        typedef uint16_t S;                                                                        \
        typedef float A;                                                                           \
        __device__ static A load(S x)                                                              \
        {                                                                                          \
            return loom_de_##s##_decode(x);                                                        \
        }                                                                                          \
        template <int OP> __device__ static A acc(A a, A b)                                        \
        {                                                                                          \
            return EF32::acc<OP>(a, b);                                                            \
        }                                                                                          \
        __device__ static S fin(A a, int nranks, bool avg)                                         \
        {                                                                                          \
            return loom_de_##s##_encode(avg ? loom_de_avg_f32(a, nranks) : a);                     \
        }                                                                                          \
    };

DK_NARROW(EF16, f16)
DK_NARROW(EBF16, bf16)

/* ---- Reduce ------------------------------------------------------------------ */

/* dst[i] = fin(src0[i] op src1[i] op ... ) for i in [0, n): packs
 * [head + P*p, head + P*(p+1)) for p < npack, single elements elsewhere.
 * Two blocks per SM at least, so up to 128 registers: with the block size
 * alone ptxas held the float16 32-source kernels to 64 and spilled. */
template <class E, int OP, int MAXS>
__global__ void __launch_bounds__(kThreads, 2)
    reduce_kernel(Srcs srcs, int nsrc, typename E::S *dst, size_t n, size_t head, size_t npack,
                  int nranks, int avg)
{
    typedef typename E::S S;
    typedef typename E::A A;
    constexpr int P = 16 / sizeof(S);
    const size_t t0 = thread_index(), nt = thread_count();

    for (size_t p = t0; p < npack; p += nt) {
        const size_t off = head + p * P;
        Pack<S> x;
        A a[P];
        x.v = load16_nc((const S *)srcs.p[0] + off);
#pragma unroll
        for (int j = 0; j < P; j++)
            a[j] = E::load(x.e[j]);
            /* Four loads in flight before their sums, in source order. */
#pragma unroll
        for (int k0 = 1; k0 < MAXS; k0 += 4) {
            if (k0 >= nsrc)
                break;
            Pack<S> y[4];
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (k0 + q < MAXS && k0 + q < nsrc)
                    y[q].v = load16_nc((const S *)srcs.p[k0 + q] + off);
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (k0 + q < MAXS && k0 + q < nsrc) {
#pragma unroll
                    for (int j = 0; j < P; j++)
                        a[j] = E::template acc<OP>(a[j], E::load(y[q].e[j]));
                }
        }
        Pack<S> out;
#pragma unroll
        for (int j = 0; j < P; j++)
            out.e[j] = E::fin(a[j], nranks, avg != 0);
        store16(dst + off, out.v);
    }

    const size_t body = npack * P;
    for (size_t t = t0; t < n - body; t += nt) {
        const size_t i = t < head ? t : t + body;
        A a = E::load(__ldg((const S *)srcs.p[0] + i));
#pragma unroll
        for (int k = 1; k < MAXS; k++) {
            if (k >= nsrc)
                break;
            a = E::template acc<OP>(a, E::load(__ldg((const S *)srcs.p[k] + i)));
        }
        dst[i] = E::fin(a, nranks, avg != 0);
    }
}

/* Elements before the first pack boundary when every pointer has dst's
 * offset modulo 16; n (no packs) when they differ. */
static size_t pack_head(const void *dst, const void *const *srcs, int nsrc, size_t n, size_t sz)
{
    const uintptr_t mis = (uintptr_t)dst & 15u;
    for (int k = 0; k < nsrc; k++)
        if (((uintptr_t)srcs[k] & 15u) != mis)
            return n;
    const size_t h = mis ? (16 - mis) / sz : 0;
    return h < n ? h : n;
}

template <class E, int OP>
static int launch_reduce_op(cudaStream_t st, unsigned grid, const Srcs &s, int nsrc, void *dst,
                            size_t n, size_t head, size_t npack, int nranks, int avg)
{
    typedef typename E::S S;
    if (nsrc <= 2)
        reduce_kernel<E, OP, 2>
            <<<grid, kThreads, 0, st>>>(s, nsrc, (S *)dst, n, head, npack, nranks, avg);
    else if (nsrc <= 8)
        reduce_kernel<E, OP, 8>
            <<<grid, kThreads, 0, st>>>(s, nsrc, (S *)dst, n, head, npack, nranks, avg);
    else
        reduce_kernel<E, OP, LOOM_DK_MAX_SRCS>
            <<<grid, kThreads, 0, st>>>(s, nsrc, (S *)dst, n, head, npack, nranks, avg);
    return (int)cudaGetLastError();
}

template <class E>
static int launch_reduce_type(cudaStream_t st, loomRedOp_t op, const void *const *srcs, int nsrc,
                              void *dst, size_t n, int nranks, bool preload)
{
    typedef typename E::S S;
    constexpr size_t P = 16 / sizeof(S);
    const size_t head = preload ? 0 : pack_head(dst, srcs, nsrc, n, sizeof(S));
    const size_t npack = (n - head) / P;
    const size_t scalar = n - npack * P;
    unsigned grid = 1;
    if (!preload) {
        int rc = grid_for(npack > scalar ? npack : scalar, &grid);
        if (rc != 0)
            return rc;
    }
    Srcs s = {};
    for (int k = 0; k < nsrc; k++)
        s.p[k] = srcs[k];
    const int avg = op == loomAvg;
    switch (op) {
    case loomSum:
    case loomAvg:
        return launch_reduce_op<E, loomSum>(st, grid, s, nsrc, dst, n, head, npack, nranks, avg);
    case loomProd:
        return launch_reduce_op<E, loomProd>(st, grid, s, nsrc, dst, n, head, npack, nranks, 0);
    case loomMax:
        return launch_reduce_op<E, loomMax>(st, grid, s, nsrc, dst, n, head, npack, nranks, 0);
    default:
        return launch_reduce_op<E, loomMin>(st, grid, s, nsrc, dst, n, head, npack, nranks, 0);
    }
}

static int launch_reduce(cudaStream_t st, loomDataType_t dt, loomRedOp_t op, void *dst,
                         const void *const *srcs, int nsrc, size_t n, int nranks, bool preload)
{
    switch (dt) {
    case loomInt8:
        return launch_reduce_type<EI8>(st, op, srcs, nsrc, dst, n, nranks, preload);
    case loomUint8:
        return launch_reduce_type<EU8>(st, op, srcs, nsrc, dst, n, nranks, preload);
    case loomInt32:
        return launch_reduce_type<EI32>(st, op, srcs, nsrc, dst, n, nranks, preload);
    case loomUint32:
        return launch_reduce_type<EU32>(st, op, srcs, nsrc, dst, n, nranks, preload);
    case loomInt64:
        return launch_reduce_type<EI64>(st, op, srcs, nsrc, dst, n, nranks, preload);
    case loomUint64:
        return launch_reduce_type<EU64>(st, op, srcs, nsrc, dst, n, nranks, preload);
    case loomFloat16:
        return launch_reduce_type<EF16>(st, op, srcs, nsrc, dst, n, nranks, preload);
    case loomFloat32:
        return launch_reduce_type<EF32>(st, op, srcs, nsrc, dst, n, nranks, preload);
    case loomFloat64:
        return launch_reduce_type<EF64>(st, op, srcs, nsrc, dst, n, nranks, preload);
    case loomBfloat16:
        return launch_reduce_type<EBF16>(st, op, srcs, nsrc, dst, n, nranks, preload);
    default:
        return -1;
    }
}

/* ---- Copy and cast ------------------------------------------------------------- */

/* Bytes: 16-byte packs [head + 16p, ...) for p < npack, single bytes elsewhere. */
__global__ void __launch_bounds__(kThreads)
    copy_kernel(uint8_t *dst, const uint8_t *src, size_t nbytes, size_t head, size_t npack)
{
    const size_t t0 = thread_index(), nt = thread_count();
    for (size_t p = t0; p < npack; p += nt)
        store16(dst + head + 16 * p, load16_nc(src + head + 16 * p));
    const size_t body = npack * 16;
    for (size_t t = t0; t < nbytes - body; t += nt) {
        const size_t i = t < head ? t : t + body;
        dst[i] = __ldg(src + i);
    }
}

/* Eight elements per step: one or two 16-byte loads and stores. Steps
 * [head + 8p, ...) for p < nstep when both pointers are 16-byte aligned
 * there, single elements elsewhere. */
template <class D, class C>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(typename D::S *dst, const typename C::S *src, size_t n, size_t head, size_t nstep)
{
    typedef typename D::S DS;
    typedef typename C::S CS;
    constexpr int DP = 16 / sizeof(DS), CP = 16 / sizeof(CS);
    const size_t t0 = thread_index(), nt = thread_count();
    for (size_t p = t0; p < nstep; p += nt) {
        const size_t off = head + 8 * p;
        Pack<CS> in[8 / CP];
        Pack<DS> out[8 / DP];
#pragma unroll
        for (int q = 0; q < 8 / CP; q++)
            in[q].v = load16_nc(src + off + q * CP);
#pragma unroll
        for (int j = 0; j < 8; j++)
            out[j / DP].e[j % DP] = D::store(C::load(in[j / CP].e[j % CP]));
#pragma unroll
        for (int q = 0; q < 8 / DP; q++)
            store16(dst + off + q * DP, out[q].v);
    }
    const size_t body = nstep * 8;
    for (size_t t = t0; t < n - body; t += nt) {
        const size_t i = t < head ? t : t + body;
        dst[i] = D::store(C::load(__ldg(src + i)));
    }
}

static size_t dk_size(loomDataType_t dt)
{
    switch (dt) {
    case loomInt8:
    case loomUint8:
        return 1;
    case loomFloat16:
    case loomBfloat16:
        return 2;
    case loomInt32:
    case loomUint32:
    case loomFloat32:
        return 4;
    default:
        return 8;
    }
}

static bool cast_type_ok(loomDataType_t dt)
{
    return dt == loomFloat32 || dt == loomFloat16 || dt == loomBfloat16;
}

static int launch_copy(cudaStream_t st, void *dst, const void *src, size_t nbytes, bool preload)
{
    const uintptr_t mis = (uintptr_t)dst & 15u;
    size_t head = nbytes;
    if (((uintptr_t)src & 15u) == mis)
        head = mis ? 16 - mis : 0;
    head = head < nbytes ? head : nbytes;
    const size_t npack = (nbytes - head) / 16;
    unsigned grid = 1;
    if (!preload) {
        int rc = grid_for(npack > 32 ? npack : 32, &grid);
        if (rc != 0)
            return rc;
    }
    copy_kernel<<<grid, kThreads, 0, st>>>((uint8_t *)dst, (const uint8_t *)src, nbytes, head,
                                           npack);
    return (int)cudaGetLastError();
}

template <class D, class C>
static int launch_cast_pair(cudaStream_t st, void *dst, const void *src, size_t n, bool preload)
{
    const size_t dsz = sizeof(typename D::S), csz = sizeof(typename C::S);
    /* The first element where both pointers are 16-byte aligned, if one of
     * the first eight is (else everything goes one element at a time). */
    size_t head = n;
    for (size_t h = 0; h < 8 && h < n; h++)
        if (aligned16((const char *)dst + h * dsz) && aligned16((const char *)src + h * csz)) {
            head = h;
            break;
        }
    head = preload ? 0 : head;
    const size_t nstep = (n - head) / 8;
    unsigned grid = 1;
    if (!preload) {
        size_t work = nstep > n - nstep * 8 ? nstep : n - nstep * 8;
        int rc = grid_for(work, &grid);
        if (rc != 0)
            return rc;
    }
    cast_kernel<D, C><<<grid, kThreads, 0, st>>>((typename D::S *)dst, (const typename C::S *)src,
                                                 n, head, nstep);
    return (int)cudaGetLastError();
}

template <class D>
static int launch_cast_to(cudaStream_t st, void *dst, const void *src, loomDataType_t sdt, size_t n,
                          bool preload)
{
    switch (sdt) {
    case loomFloat32:
        return launch_cast_pair<D, CF32>(st, dst, src, n, preload);
    case loomFloat16:
        return launch_cast_pair<D, CF16>(st, dst, src, n, preload);
    default:
        return launch_cast_pair<D, CBF16>(st, dst, src, n, preload);
    }
}

static int launch_cast(cudaStream_t st, void *dst, loomDataType_t ddt, const void *src,
                       loomDataType_t sdt, size_t n, bool preload)
{
    switch (ddt) {
    case loomFloat32:
        return launch_cast_to<CF32>(st, dst, src, sdt, n, preload);
    case loomFloat16:
        return launch_cast_to<CF16>(st, dst, src, sdt, n, preload);
    default:
        return launch_cast_to<CBF16>(st, dst, src, sdt, n, preload);
    }
}

/* ---- Grid ------------------------------------------------------------------- */

#define DK_MAX_DEVICES 64
static int sm_count_cache[DK_MAX_DEVICES];

int grid_for(size_t work, unsigned *blocks)
{
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return (int)e;
    if (dev >= 0 && dev < DK_MAX_DEVICES)
        sms = __atomic_load_n(&sm_count_cache[dev], __ATOMIC_RELAXED);
    if (sms <= 0) {
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess)
            return (int)e;
        if (dev >= 0 && dev < DK_MAX_DEVICES)
            __atomic_store_n(&sm_count_cache[dev], sms, __ATOMIC_RELAXED);
    }
    /* Four blocks of 256 threads per SM keep enough 16-byte loads in flight
     * for the copy bandwidth; more blocks only add scheduling. */
    const size_t cap = (size_t)(sms > 0 ? sms : 1) * 4;
    size_t b = (work + kThreads - 1) / kThreads;
    b = b < 1 ? 1 : b > cap ? cap : b;
    *blocks = (unsigned)b;
    return 0;
}

/* Launcher entry points of dev_kernels_q4.cu, for the preload. */
int q4_preload(cudaStream_t st);

} // namespace loom_dk

using namespace loom_dk;

extern "C" int loom_dk_reduce(void *stream, loomDataType_t dt, loomRedOp_t op, void *dst,
                              const void *const *srcs, int nsrc, size_t n, int nranks)
{
    if (!loom_dk_dtype_ok(dt) || (int)op < 0 || op >= loomNumOps || nsrc < 1 ||
        nsrc > LOOM_DK_MAX_SRCS)
        return -1;
    if (n == 0)
        return 0;
    if (dst == NULL || srcs == NULL)
        return -1;
    for (int k = 0; k < nsrc; k++)
        if (srcs[k] == NULL)
            return -1;
    return launch_reduce((cudaStream_t)stream, dt, op, dst, srcs, nsrc, n, loom_de_ranks(nranks),
                         false);
}

extern "C" int loom_dk_cast(void *stream, void *dst, loomDataType_t ddt, const void *src,
                            loomDataType_t sdt, size_t n)
{
    if (!loom_dk_dtype_ok(ddt) || !loom_dk_dtype_ok(sdt))
        return -1;
    if (ddt != sdt && (!cast_type_ok(ddt) || !cast_type_ok(sdt)))
        return -1;
    if (n == 0)
        return 0;
    if (dst == src && dk_size(ddt) != dk_size(sdt))
        return -1;
    if (dst == NULL || src == NULL)
        return -1;
    if (ddt == sdt)
        return dst == src ? 0
                          : launch_copy((cudaStream_t)stream, dst, src, n * dk_size(ddt), false);
    return launch_cast((cudaStream_t)stream, dst, ddt, src, sdt, n, false);
}

extern "C" int loom_dk_preload(void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    const void *srcs[LOOM_DK_MAX_SRCS] = {};
    static const int counts[] = {2, 8, LOOM_DK_MAX_SRCS};
    for (int dt = 0; dt < loomNumTypes; dt++) {
        if (!loom_dk_dtype_ok((loomDataType_t)dt))
            continue;
        for (int op = 0; op < loomNumOps; op++)
            for (int c : counts) {
                int rc = launch_reduce(st, (loomDataType_t)dt, (loomRedOp_t)op, NULL, srcs, c, 0, 1,
                                       true);
                if (rc != 0)
                    return rc;
            }
    }
    int rc = launch_copy(st, NULL, NULL, 0, true);
    const loomDataType_t f[] = {loomFloat32, loomFloat16, loomBfloat16};
    for (loomDataType_t d : f)
        for (loomDataType_t s : f)
            if (rc == 0 && d != s)
                rc = launch_cast(st, NULL, d, NULL, s, 0, true);
    return rc != 0 ? rc : q4_preload(st);
}
