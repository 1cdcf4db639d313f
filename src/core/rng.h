/* SPDX-License-Identifier: Apache-2.0
 *
 * rng.h - the library's one deterministic pseudo-random generator: splitmix64 (Steele, Lea and
 * Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014), for synthetic inputs
 * that must be the same on every machine for a seed (the MoE routing generators, moe_gen.c).
 * Not for anything secret: secret.h draws from the kernel. Header-only, no state but the caller's.
 */
#ifndef LOOM_RNG_H
#define LOOM_RNG_H

#include <stdint.h>

typedef struct loom_rng {
    uint64_t state;
} loom_rng_t;

static inline loom_rng_t loom_rng_seed(uint64_t seed)
{
    loom_rng_t r = {seed};
    return r;
}

static inline uint64_t loom_rng_next(loom_rng_t *r)
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1), 53 random bits. */
static inline double loom_rng_uniform(loom_rng_t *r)
{
    return (double)(loom_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Uniform in [0, n) for n >= 1, without modulo bias: Lemire's multiply-shift with rejection
 * (arXiv 1805.10941). */
static inline uint32_t loom_rng_below(loom_rng_t *r, uint32_t n)
{
    uint64_t m = (loom_rng_next(r) >> 32) * (uint64_t)n;
    if ((uint32_t)m < n) {
        uint32_t floor = (uint32_t)(-n) % n;
        while ((uint32_t)m < floor)
            m = (loom_rng_next(r) >> 32) * (uint64_t)n;
    }
    return (uint32_t)(m >> 32);
}

#endif
