/* SPDX-License-Identifier: Apache-2.0
 *
 * blocked_for.h - an element loop run in fixed-length blocks plus a scalar tail, for the kernels
 * that want SIMD code (the reduction kernels, MoE's combine sums). At -O2 gcc vectorises only
 * loops whose trip count needs no epilogue, so the constant-length inner loop is what gets SIMD
 * code in a debugoptimized build; at -O3 it costs nothing. The element order of each output is
 * unchanged, so results are the same bits as a plain loop's.
 */
#ifndef LOOM_CORE_BLOCKED_FOR_H
#define LOOM_CORE_BLOCKED_FOR_H

#include <stddef.h>

#define KBLOCK 32

/* for (size_t i = 0; i < n; i++) body, as blocks of KBLOCK and a tail. */
#define BLOCKED_FOR(i, n, ...)                                                                     \
    do {                                                                                           \
        size_t base_ = 0;                                                                          \
        for (; base_ + KBLOCK <= (n); base_ += KBLOCK) {                                           \
            for (size_t k_ = 0; k_ < KBLOCK; k_++) {                                               \
                size_t i = base_ + k_;                                                             \
                __VA_ARGS__;                                                                       \
            }                                                                                      \
        }                                                                                          \
        for (size_t i = base_; i < (n); i++) {                                                     \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)

#endif
