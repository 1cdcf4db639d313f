/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_kernels_q4.cu - the CUDA 4-bit codec of dev_kernels.h: encode (with
 * the residual in and out), decode to float32/float16/bfloat16 and decode
 * into a float32 accumulator, byte for byte the CPU codec's layout (q4.h) and
 * values (dev_elem.h's block rules, as dev_kernels_host.c applies them).
 *
 * Work split: a 32-value block belongs to G lanes of a warp, each holding V
 * values = 16 bytes of its datatype (float32: 8 lanes x 4; 16-bit: 4 x 8), so
 * the warp's loads and stores of values are 16-byte, coalesced. The block's
 * absolute maximum is combined with shuffles inside the lane group; the 16
 * code bytes are gathered at the group's first lane and stored as one
 * 16-byte word (a warp's blocks are contiguous in the tile), the warp's
 * W = 32 / G scales by lane 0 as one 16- or 8-byte word. Pointers that are
 * not 16-byte aligned, and lanes that straddle n, use element accesses. A
 * warp walks W blocks at a time, so every shuffle has the whole warp.
 */
#include <cuda_runtime.h>

#include "dev_elem.h"
#include "dev_kernels.h"
#include "dk_launch.cuh"

namespace loom_dk {

enum { F_SRC = 1, F_DST = 2, F_EIN = 4, F_EOUT = 8 };
constexpr unsigned kFull = 0xffffffffu;

/* V values of a lane as float32: one 16-byte load where allowed, else element
 * loads with zeros past n. */
template <class C, int V>
__device__ static inline void load_values(const typename C::S *src, size_t i0, size_t n, bool vec,
                                          float *u)
{
    if (vec && i0 + V <= n) {
        Pack<typename C::S> x;
        x.v = load16_nc(src + i0);
#pragma unroll
        for (int j = 0; j < V; j++)
            u[j] = C::load(x.e[j]);
    } else {
#pragma unroll
        for (int j = 0; j < V; j++)
            u[j] = i0 + j < n ? C::load(__ldg(src + i0 + j)) : 0.0f;
    }
}

/* V float32 values from p (read-write memory: no non-coherent loads). */
template <int V>
__device__ static inline void load_f32(const float *p, size_t i0, size_t n, bool vec, float *e)
{
    if (vec && i0 + V <= n) {
#pragma unroll
        for (int q = 0; q < V / 4; q++) {
            Pack<float> x;
            x.v = load16(p + i0 + 4 * q);
#pragma unroll
            for (int j = 0; j < 4; j++)
                e[4 * q + j] = x.e[j];
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; j++)
            e[j] = i0 + j < n ? p[i0 + j] : 0.0f;
    }
}

/* The bits of a float32 or 16-bit element. */
__device__ static inline uint32_t elem_bits(float f)
{
    return __float_as_uint(f);
}

__device__ static inline uint32_t elem_bits(uint16_t h)
{
    return h;
}

template <class C, int V>
__device__ static inline void store_values(typename C::S *dst, size_t i0, size_t n, bool vec,
                                           const float *v)
{
    typedef typename C::S S;
    constexpr int P = 16 / sizeof(S), E = 4 / sizeof(S); /* per 16 bytes, per word */
    if (vec && i0 + V <= n) {
#pragma unroll
        for (int q = 0; q < V / P; q++) {
            uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
            for (int j = 0; j < P; j++)
                w[j / E] |= elem_bits(C::store(v[q * P + j])) << (32 / E * (j % E));
            store16(dst + i0 + q * P, make_uint4(w[0], w[1], w[2], w[3]));
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; j++)
            if (i0 + j < n)
                dst[i0 + j] = C::store(v[j]);
    }
}

/* 16 bytes to p: one store when aligned, else byte by byte. */
__device__ static inline void store_bytes16(uint8_t *p, bool vec, uint4 w)
{
    if (vec) {
        store16(p, w);
        return;
    }
    const uint32_t q[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 16; j++)
        p[j] = (uint8_t)(q[j / 4] >> (8 * (j % 4)));
}

template <class C>
__global__ void __launch_bounds__(kThreads)
    q4_encode_kernel(const typename C::S *src, const float *err_in, float *err_out, size_t n,
                     uint8_t *dst, size_t nblocks, int flags)
{
    constexpr int V = 16 / sizeof(typename C::S), G = 32 / V, W = 32 / G;
    const unsigned lane = threadIdx.x & 31u, sub = lane % G, first = lane - sub;
    const size_t nchunks = nblocks / W, nwarps = thread_count() / 32;
    for (size_t ch = thread_index() / 32; ch < nchunks; ch += nwarps) {
        const size_t k = ch * W + lane / G, i0 = k * LOOM_DE_Q4_BLOCK + sub * V;
        float u[V];
        load_values<C, V>(src, i0, n, flags & F_SRC, u);
        if (err_in != NULL) {
            float e[V];
            load_f32<V>(err_in, i0, n, flags & F_EIN, e);
#pragma unroll
            for (int j = 0; j < V; j++)
                if (i0 + j < n)
                    u[j] = loom_de_fadd(u[j], e[j]);
        }
        uint32_t amax = 0;
#pragma unroll
        for (int j = 0; j < V; j++) {
            uint32_t a = loom_de_q4_abs_bits(u[j]);
            amax = a > amax ? a : amax;
        }
#pragma unroll
        for (int off = 1; off < G; off <<= 1) {
            uint32_t o = __shfl_xor_sync(kFull, amax, off);
            amax = o > amax ? o : amax;
        }
        const uint32_t sb = loom_de_q4_scale_bits(amax);
        const float scale = loom_de_bf16_decode((uint16_t)sb);
        int c[V];
        const float inv = loom_de_q4_special(amax) ? 0.0f : loom_de_fdiv(1.0f, scale);
#pragma unroll
        for (int j = 0; j < V; j++)
            c[j] = loom_de_q4_special(amax) ? 0 : loom_de_q4_code(u[j], inv);

        /* This lane's V/2 code bytes, then the block's 16 at its first lane. */
        uint32_t w = 0;
#pragma unroll
        for (int j = 0; j < V / 2; j++)
            w |= (uint32_t)loom_de_q4_pack(c[2 * j], c[2 * j + 1]) << (8 * j);
        uint32_t q[4];
        if constexpr (V == 8) {
#pragma unroll
            for (int j = 0; j < 4; j++)
                q[j] = __shfl_sync(kFull, w, first + j);
        } else {
            const uint32_t pair = w | __shfl_down_sync(kFull, w, 1) << 16;
#pragma unroll
            for (int j = 0; j < 4; j++)
                q[j] = __shfl_sync(kFull, pair, first + 2 * j);
        }
        if (sub == 0)
            store_bytes16(dst + loom_de_q4_codes_off(k), flags & F_DST,
                          make_uint4(q[0], q[1], q[2], q[3]));

        /* The warp's W scales, contiguous in the tile, from lane 0. */
        uint32_t s2[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < W / 2; j++)
            s2[j] = __shfl_sync(kFull, sb, 2 * j * G) | __shfl_sync(kFull, sb, (2 * j + 1) * G)
                                                            << 16;
        if (lane == 0) {
            uint8_t *sp = dst + loom_de_q4_scale_off(ch * W);
            if ((flags & F_DST) && W == 8) {
                store16(sp, make_uint4(s2[0], s2[1], s2[2], s2[3]));
            } else if (flags & F_DST) {
                *reinterpret_cast<uint2 *>(sp) = make_uint2(s2[0], s2[1]);
            } else {
#pragma unroll
                for (int j = 0; j < 2 * W; j++)
                    sp[j] = (uint8_t)(s2[j / 4] >> (8 * (j % 4)));
            }
        }

        if (err_out != NULL) {
            float r[V];
#pragma unroll
            for (int j = 0; j < V; j++)
                r[j] = loom_de_q4_residual(u[j], c[j], scale);
            store_values<CF32, V>(err_out, i0, n, flags & F_EOUT, r);
        }
    }
}

/* Decode: dst[i] = D(code_i) as C's type; with ACC (C = CF32) dst is the
 * accumulator and gets dst[i] + D(code_i). */
template <class C, bool ACC>
__global__ void __launch_bounds__(kThreads)
    q4_decode_kernel(const uint8_t *src, size_t n, typename C::S *dst, int flags)
{
    constexpr int V = 16 / sizeof(typename C::S), G = 32 / V, W = 32 / G;
    const unsigned lane = threadIdx.x & 31u, sub = lane % G, first = lane - sub;
    const size_t nblocks = (n + LOOM_DE_Q4_BLOCK - 1) / LOOM_DE_Q4_BLOCK;
    const size_t nchunks = (nblocks + W - 1) / W, nwarps = thread_count() / 32;
    for (size_t ch = thread_index() / 32; ch < nchunks; ch += nwarps) {
        const size_t k = ch * W + lane / G, i0 = k * LOOM_DE_Q4_BLOCK + sub * V;
        const bool live = k < nblocks;
        uint4 cw = make_uint4(0, 0, 0, 0);
        uint32_t scale_bits = 0;
        if (live) {
            const uint8_t *cp = src + loom_de_q4_codes_off(k);
            const uint8_t *sp = src + loom_de_q4_scale_off(k);
            if (flags & F_SRC) {
                if (sub == 0)
                    cw = load16_nc(cp);
                scale_bits = __ldg(reinterpret_cast<const unsigned short *>(sp));
            } else {
                if (sub == 0) {
                    uint32_t b[4] = {0, 0, 0, 0};
#pragma unroll
                    for (int j = 0; j < 16; j++)
                        b[j / 4] |= (uint32_t)__ldg(cp + j) << (8 * (j % 4));
                    cw = make_uint4(b[0], b[1], b[2], b[3]);
                }
                scale_bits = (uint32_t)__ldg(sp) | (uint32_t)__ldg(sp + 1) << 8;
            }
        }
        /* Every lane of the group takes its V/2 code bytes from the first. */
        const uint32_t w[4] = {__shfl_sync(kFull, cw.x, first), __shfl_sync(kFull, cw.y, first),
                               __shfl_sync(kFull, cw.z, first), __shfl_sync(kFull, cw.w, first)};
        /* Selects, not an indexed array: that would live in local memory. */
        const unsigned word = V == 8 ? sub : sub / 2;
        uint32_t mine = word == 0 ? w[0] : word == 1 ? w[1] : word == 2 ? w[2] : w[3];
        if (V == 4)
            mine >>= 16 * (sub & 1);
        if (!live)
            continue;
        const float scale = loom_de_bf16_decode((uint16_t)scale_bits);
        float d[V];
#pragma unroll
        for (int j = 0; j < V; j++)
            d[j] = loom_de_q4_dequant(loom_de_q4_nibble((mine >> (8 * (j / 2))) & 0xffu, j & 1),
                                      scale);
        if constexpr (ACC) {
            float a[V];
            load_f32<V>(dst, i0, n, flags & F_DST, a);
#pragma unroll
            for (int j = 0; j < V; j++)
                d[j] = loom_de_fadd(a[j], d[j]);
        }
        store_values<C, V>(dst, i0, n, flags & F_DST, d);
    }
}

/* Threads for nchunks warp steps. */
static int codec_grid(size_t nchunks, unsigned *grid, bool preload)
{
    *grid = 1;
    return preload ? 0 : grid_for(nchunks * 32, grid);
}

template <class C>
static int launch_encode(cudaStream_t st, const void *src, const float *err_in, float *err_out,
                         size_t n, uint8_t *dst, bool preload)
{
    constexpr int W = 32 / (32 / (16 / (int)sizeof(typename C::S)));
    const size_t nblocks = loom_de_q4_bytes(n) / LOOM_DE_Q4_TILE_BYTES * LOOM_DE_Q4_BLOCKS_PER_TILE;
    const int flags = (aligned16(src) ? F_SRC : 0) | (aligned16(dst) ? F_DST : 0) |
                      (aligned16(err_in) ? F_EIN : 0) | (aligned16(err_out) ? F_EOUT : 0);
    unsigned grid;
    int rc = codec_grid(nblocks / W, &grid, preload);
    if (rc != 0)
        return rc;
    q4_encode_kernel<C><<<grid, kThreads, 0, st>>>((const typename C::S *)src, err_in, err_out, n,
                                                   dst, nblocks, flags);
    return (int)cudaGetLastError();
}

template <class C, bool ACC>
static int launch_decode(cudaStream_t st, const uint8_t *src, size_t n, void *dst, bool preload)
{
    constexpr int W = 32 / (32 / (16 / (int)sizeof(typename C::S)));
    const size_t nblocks = (n + LOOM_DE_Q4_BLOCK - 1) / LOOM_DE_Q4_BLOCK;
    const int flags = (aligned16(src) ? F_SRC : 0) | (aligned16(dst) ? F_DST : 0);
    unsigned grid;
    int rc = codec_grid((nblocks + W - 1) / W, &grid, preload);
    if (rc != 0)
        return rc;
    q4_decode_kernel<C, ACC><<<grid, kThreads, 0, st>>>(src, n, (typename C::S *)dst, flags);
    return (int)cudaGetLastError();
}

static bool codec_type_ok(loomDataType_t dt)
{
    return dt == loomFloat32 || dt == loomFloat16 || dt == loomBfloat16;
}

static int encode(cudaStream_t st, const void *src, loomDataType_t dt, const float *err_in,
                  float *err_out, size_t n, uint8_t *dst, bool preload)
{
    if (dt == loomFloat32)
        return launch_encode<CF32>(st, src, err_in, err_out, n, dst, preload);
    if (dt == loomFloat16)
        return launch_encode<CF16>(st, src, err_in, err_out, n, dst, preload);
    return launch_encode<CBF16>(st, src, err_in, err_out, n, dst, preload);
}

static int decode(cudaStream_t st, const uint8_t *src, size_t n, void *dst, loomDataType_t dt,
                  bool preload)
{
    if (dt == loomFloat32)
        return launch_decode<CF32, false>(st, src, n, dst, preload);
    if (dt == loomFloat16)
        return launch_decode<CF16, false>(st, src, n, dst, preload);
    return launch_decode<CBF16, false>(st, src, n, dst, preload);
}

int q4_preload(cudaStream_t st)
{
    int rc = launch_decode<CF32, true>(st, NULL, 0, NULL, true);
    const loomDataType_t f[] = {loomFloat32, loomFloat16, loomBfloat16};
    for (loomDataType_t dt : f) {
        if (rc == 0)
            rc = encode(st, NULL, dt, NULL, NULL, 0, NULL, true);
        if (rc == 0)
            rc = decode(st, NULL, 0, NULL, dt, true);
    }
    return rc;
}

} // namespace loom_dk

using namespace loom_dk;

extern "C" int loom_dk_q4_encode(void *stream, const void *src, loomDataType_t dt,
                                 const float *err_in, float *err_out, size_t n, uint8_t *dst)
{
    if (!codec_type_ok(dt))
        return -1;
    if (n == 0)
        return 0;
    if (src == NULL || dst == NULL)
        return -1;
    return encode((cudaStream_t)stream, src, dt, err_in, err_out, n, dst, false);
}

extern "C" int loom_dk_q4_decode(void *stream, const uint8_t *src, size_t n, void *dst,
                                 loomDataType_t dt)
{
    if (!codec_type_ok(dt))
        return -1;
    if (n == 0)
        return 0;
    if (src == NULL || dst == NULL)
        return -1;
    return decode((cudaStream_t)stream, src, n, dst, dt, false);
}

extern "C" int loom_dk_q4_decode_acc(void *stream, const uint8_t *src, size_t n, float *acc)
{
    if (n == 0)
        return 0;
    if (src == NULL || acc == NULL)
        return -1;
    return launch_decode<CF32, true>((cudaStream_t)stream, src, n, acc, false);
}
