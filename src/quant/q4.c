/* SPDX-License-Identifier: Apache-2.0
 *
 * q4.c - the entry points of q4.h and the scalar reference codec. The entry
 * points pick the instruction set loom_kernels_isa() names (so LOOM_KERNELS
 * and loom_kernels_use() steer the codec and the reduction kernels alike);
 * the vector codecs live in q4_avx2.c and q4_avx512.c and must give this
 * file's bytes and values. The reference is written for clarity, one block
 * at a time, with the formula of q4.h step by step; it is also what runs on
 * machines without AVX2.
 */
#include "q4.h"

#include "debug.h"
#include "q4_impl.h"

int loom_q4_dtype_ok(loomDataType_t dt)
{
    return dt == loomFloat32 || dt == loomFloat16 || dt == loomBfloat16;
}

// ---- Scalar reference -------------------------------------------------------

/* One block: u holds the 32 values (zeros past the m real ones); writes 16
 * code bytes, the scale's two bytes and, if err_out, m residuals. Each step
 * is dev_elem.h's (the device kernels' own). */
static void encode_block(const float *u, size_t m, float *err_out, uint8_t *codes,
                         uint8_t *scale_le)
{
    uint32_t amax = 0;
    for (int j = 0; j < LOOM_Q4_BLOCK; j++) {
        uint32_t a = loom_de_q4_abs_bits(u[j]);
        amax = a > amax ? a : amax;
    }
    const uint32_t sb = q4_scale_bits(amax);
    scale_le[0] = (uint8_t)(sb & 0xffu);
    scale_le[1] = (uint8_t)(sb >> 8);
    const float scale = loom_bf16_decode((uint16_t)sb);

    int c[LOOM_Q4_BLOCK] = {0};
    if (!q4_block_special(amax)) {
        const float inv = loom_de_fdiv(1.0f, scale);
        for (int j = 0; j < LOOM_Q4_BLOCK; j++)
            c[j] = loom_de_q4_code(u[j], inv);
    }
    for (int k = 0; k < LOOM_Q4_BLOCK / 2; k++)
        codes[k] = loom_de_q4_pack(c[2 * k], c[2 * k + 1]);
    for (size_t j = 0; err_out != NULL && j < m; j++)
        err_out[j] = loom_de_q4_residual(u[j], c[j], scale);
}

static void encode_scalar(const void *src, loomDataType_t dt, const float *err_in, float *err_out,
                          size_t n, uint8_t *dst)
{
    const size_t nblocks = loom_q4_bytes(n) / LOOM_Q4_TILE_BYTES * Q4_BLOCKS_PER_TILE;
    for (size_t k = 0; k < nblocks; k++) {
        const size_t i0 = k * LOOM_Q4_BLOCK;
        const size_t m = i0 >= n ? 0 : n - i0 < LOOM_Q4_BLOCK ? n - i0 : LOOM_Q4_BLOCK;
        float u[LOOM_Q4_BLOCK] = {0};
        for (size_t j = 0; j < m; j++)
            u[j] = q4_load(src, dt, i0 + j);
        for (size_t j = 0; err_in != NULL && j < m; j++)
            u[j] = loom_de_fadd(u[j], err_in[i0 + j]);
        encode_block(u, m, err_out != NULL ? err_out + i0 : NULL, dst + q4_codes_off(k),
                     dst + q4_scale_off(k));
    }
}

/* The 32 values D(code) of block k into d. */
static void decode_block(const uint8_t *src, size_t k, float *d)
{
    const uint8_t *codes = src + q4_codes_off(k), *s = src + q4_scale_off(k);
    const float scale = loom_bf16_decode((uint16_t)(s[0] | s[1] << 8));
    for (int j = 0; j < LOOM_Q4_BLOCK / 2; j++) {
        d[2 * j] = loom_de_q4_dequant(loom_de_q4_nibble(codes[j], 0), scale);
        d[2 * j + 1] = loom_de_q4_dequant(loom_de_q4_nibble(codes[j], 1), scale);
    }
}

static void decode_scalar(const uint8_t *src, size_t n, void *dst, loomDataType_t dt)
{
    for (size_t i0 = 0; i0 < n; i0 += LOOM_Q4_BLOCK) {
        float d[LOOM_Q4_BLOCK];
        decode_block(src, i0 / LOOM_Q4_BLOCK, d);
        for (size_t j = 0; j < LOOM_Q4_BLOCK && i0 + j < n; j++)
            q4_store(dst, dt, i0 + j, d[j]);
    }
}

static void decode_acc_scalar(const uint8_t *src, size_t n, float *acc)
{
    for (size_t i0 = 0; i0 < n; i0 += LOOM_Q4_BLOCK) {
        float d[LOOM_Q4_BLOCK];
        decode_block(src, i0 / LOOM_Q4_BLOCK, d);
        for (size_t j = 0; j < LOOM_Q4_BLOCK && i0 + j < n; j++)
            acc[i0 + j] = loom_de_fadd(acc[i0 + j], d[j]);
    }
}

const struct loom_q4_ops loom_q4_scalar_ops = {
    .encode = encode_scalar,
    .decode = decode_scalar,
    .decode_acc = decode_acc_scalar,
};

// ---- Dispatch ---------------------------------------------------------------

/* The set that runs for a request: the scalar codec where the machine lacks it. */
static loom_kernels_isa_t runnable(loom_kernels_isa_t isa)
{
#if defined(__x86_64__)
    if (isa != LOOM_KERNELS_SCALAR && loom_kernels_isa_available(isa))
        return isa;
#else
    (void)isa;
#endif
    return LOOM_KERNELS_SCALAR;
}

static const struct loom_q4_ops *ops_of(loom_kernels_isa_t isa)
{
#if defined(__x86_64__)
    switch (runnable(isa)) {
    case LOOM_KERNELS_AVX512:
        return &loom_q4_avx512_ops;
    case LOOM_KERNELS_AVX2:
        return &loom_q4_avx2_ops;
    default:
        break;
    }
#else
    (void)isa;
#endif
    return &loom_q4_scalar_ops;
}

/* The set the entry points below use. The QUANT log names it at the first
 * call and whenever it changes (loom_kernels_use), so a log shows which codec
 * produced the bytes; the check costs one relaxed load per call. */
static int logged_isa = -1;

static loom_kernels_isa_t active_isa(void)
{
    const loom_kernels_isa_t isa = runnable(loom_kernels_isa());
    if (__atomic_load_n(&logged_isa, __ATOMIC_RELAXED) != (int)isa &&
        __atomic_exchange_n(&logged_isa, (int)isa, __ATOMIC_RELAXED) != (int)isa)
        LOOM_INFO(LOOM_LOG_QUANT, "q4 codec: %s (the reduction kernels' set, LOOM_KERNELS)",
                  loom_kernels_isa_name(isa));
    return isa;
}

void loom_q4_encode_isa(loom_kernels_isa_t isa, const void *src, loomDataType_t dt,
                        const float *err_in, float *err_out, size_t n, uint8_t *dst)
{
    if (loom_q4_dtype_ok(dt) && n > 0)
        ops_of(isa)->encode(src, dt, err_in, err_out, n, dst);
}

void loom_q4_decode_isa(loom_kernels_isa_t isa, const uint8_t *src, size_t n, void *dst,
                        loomDataType_t dt)
{
    if (loom_q4_dtype_ok(dt) && n > 0)
        ops_of(isa)->decode(src, n, dst, dt);
}

void loom_q4_decode_acc_isa(loom_kernels_isa_t isa, const uint8_t *src, size_t n, float *acc)
{
    if (n > 0)
        ops_of(isa)->decode_acc(src, n, acc);
}

void loom_q4_encode(const void *src, loomDataType_t dt, const float *err_in, float *err_out,
                    size_t n, uint8_t *dst)
{
    loom_q4_encode_isa(active_isa(), src, dt, err_in, err_out, n, dst);
}

void loom_q4_decode(const uint8_t *src, size_t n, void *dst, loomDataType_t dt)
{
    loom_q4_decode_isa(active_isa(), src, n, dst, dt);
}

void loom_q4_decode_acc(const uint8_t *src, size_t n, float *acc)
{
    loom_q4_decode_acc_isa(active_isa(), src, n, acc);
}
