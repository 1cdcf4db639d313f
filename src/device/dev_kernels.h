/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_kernels.h - the array computations of loom's device path: the n-input
 * reduction, the 4-bit codec of Echo and the copy/cast, each twice: as CUDA
 * kernels (dev_kernels.cu, built with the cuda feature) and as host loops
 * (dev_kernels_host.c, always built: the emulated device runs them, and they
 * are the reference the device tests compare with). Both are built from the
 * per-element functions of dev_elem.h, so a value's bits are the same on
 * either side and equal to the CPU kernels' (kernels.h) and codec's (q4.h):
 *   reduce   = loom_reduce_multi: rank order, accumulate in the accumulator
 *              type (float32 for float16/bfloat16), round once, avg divides
 *              once by nranks;
 *   q4_*     = loom_q4_encode / decode / decode_acc, byte for byte.
 *
 * Datatypes: every loom datatype except the two fp8 ones (loom_dk_dtype_ok);
 * the codec takes float32, float16 and bfloat16 (loom_q4_dtype_ok). Pointers
 * need only their element type's alignment: the CUDA kernels take 16-byte
 * vector loads where every pointer allows them and element loads otherwise.
 * n may exceed 2^31. nsrc is 1..LOOM_DK_MAX_SRCS. dst may be one of the
 * sources (the same address), no other overlap.
 *
 * The CUDA launchers return a cudaError_t as int (0: launched; nothing is
 * waited for) and run on `stream` (a cudaStream_t). A call with n == 0
 * launches nothing. Invalid dt/op/nsrc returns -1 without launching.
 */
#ifndef LOOM_DEV_KERNELS_H
#define LOOM_DEV_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_DK_MAX_SRCS 32

/* 1 if the device kernels reduce and copy dt (every datatype but fp8). */
int loom_dk_dtype_ok(loomDataType_t dt);

/* ---- CUDA launchers (dev_kernels.cu; only in builds with the cuda feature) -- */
int loom_dk_reduce(void *stream, loomDataType_t dt, loomRedOp_t op, void *dst,
                   const void *const *srcs, int nsrc, size_t n, int nranks);
int loom_dk_q4_encode(void *stream, const void *src, loomDataType_t dt, const float *err_in,
                      float *err_out, size_t n, uint8_t *dst);
int loom_dk_q4_decode(void *stream, const uint8_t *src, size_t n, void *dst, loomDataType_t dt);
int loom_dk_q4_decode_acc(void *stream, const uint8_t *src, size_t n, float *acc);
/* dst[i] = (ddt) src[i]: a copy when the types are equal, else a conversion
 * through float32 (float32, float16, bfloat16 only), rounding to nearest even.
 * In place (dst == src) only between types of one size; else -1. */
int loom_dk_cast(void *stream, void *dst, loomDataType_t ddt, const void *src, loomDataType_t sdt,
                 size_t n);
/* Launches every kernel once on a zero-length problem so that the module is
 * loaded before any collective runs (lazy loading can deadlock against a
 * waiting stream). */
int loom_dk_preload(void *stream);

/* ---- The same on the host (dev_kernels_host.c), synchronous ------------- */
/* 0, or -1 for an invalid dt/op/nsrc (nothing written). */
int loom_dk_host_reduce(loomDataType_t dt, loomRedOp_t op, void *dst, const void *const *srcs,
                        int nsrc, size_t n, int nranks);
int loom_dk_host_q4_encode(const void *src, loomDataType_t dt, const float *err_in, float *err_out,
                           size_t n, uint8_t *dst);
int loom_dk_host_q4_decode(const uint8_t *src, size_t n, void *dst, loomDataType_t dt);
int loom_dk_host_q4_decode_acc(const uint8_t *src, size_t n, float *acc);
int loom_dk_host_cast(void *dst, loomDataType_t ddt, const void *src, loomDataType_t sdt, size_t n);

#ifdef __cplusplus
}
#endif

#endif
