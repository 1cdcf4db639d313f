/* SPDX-License-Identifier: Apache-2.0
 *
 * kernels.c - the entry points of kernels.h and the choice of instruction
 * set. Every reducing collective reaches the kernel tables through here. On
 * first use it builds one complete table per instruction set (scalar, then
 * AVX2 over it, then AVX-512 over that, so a combination a level leaves out
 * runs the best lower one), checks what the CPU supports and picks the set
 * LOOM_KERNELS asks for. loom_reduce_multi without a fused kernel runs as
 * init/acc/finish over L1-sized blocks. The kernels themselves live in
 * kernels_scalar.c, kernels_avx2.c and kernels_avx512.c.
 */
#include "kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "debug.h"
#include "dtype.h"
#include "kernels_impl.h"
#include "param.h"

static const char *const isa_names[LOOM_KERNELS_NUM_ISA] = {"scalar", "avx2", "avx512"};

static struct loom_kernel_row isa_tables[LOOM_KERNELS_NUM_ISA][loomNumTypes];
static int isa_ok[LOOM_KERNELS_NUM_ISA];
static pthread_once_t setup_once = PTHREAD_ONCE_INIT;
static atomic_int active_isa; /* valid once setup_once has run */

const char *loom_kernels_isa_name(loom_kernels_isa_t isa)
{
    return (int)isa >= 0 && isa < LOOM_KERNELS_NUM_ISA ? isa_names[isa] : "invalid";
}

/* ---- CPU features -------------------------------------------------------- */

#if defined(__x86_64__)
/* Older clangs do not know "f16c" in __builtin_cpu_supports; CPUID leaf 1
 * says it directly (the AVX2 check already covers the OS's YMM state). */
static int cpu_has_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

static int cpu_has(const char *feature)
{
    /* __builtin_cpu_supports needs a constant argument. */
    if (strcmp(feature, "avx2") == 0)
        return __builtin_cpu_supports("avx2");
    if (strcmp(feature, "f16c") == 0)
        return cpu_has_f16c();
    if (strcmp(feature, "avx512f") == 0)
        return __builtin_cpu_supports("avx512f");
    if (strcmp(feature, "avx512bw") == 0)
        return __builtin_cpu_supports("avx512bw");
    if (strcmp(feature, "avx512vl") == 0)
        return __builtin_cpu_supports("avx512vl");
    if (strcmp(feature, "avx512dq") == 0)
        return __builtin_cpu_supports("avx512dq");
    return 0;
}

/* The CPU features each instruction set's kernels are compiled for (their
 * target attributes). The compilers' checks include the OS's XCR0 state, so
 * an OS or hypervisor that does not save the AVX-512 registers (valgrind,
 * for one) reads as "no AVX-512". */
static const char *const isa_features[LOOM_KERNELS_NUM_ISA][7] = {
    [LOOM_KERNELS_SCALAR] = {NULL},
    [LOOM_KERNELS_AVX2] = {"avx2", "f16c", NULL},
    [LOOM_KERNELS_AVX512] = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "f16c", NULL},
};

/* The sparse table of an instruction set; NULL when this build has none. */
static const struct loom_kernel_row *isa_overlay(loom_kernels_isa_t isa)
{
    return isa == LOOM_KERNELS_AVX2     ? loom_kernels_avx2_table
           : isa == LOOM_KERNELS_AVX512 ? loom_kernels_avx512_table
                                        : NULL;
}
#else
static const struct loom_kernel_row *isa_overlay(loom_kernels_isa_t isa)
{
    (void)isa;
    return NULL;
}
#endif

/* Writes the features isa needs that this machine lacks into buf ("" if none). */
static void isa_missing(loom_kernels_isa_t isa, char *buf, size_t len)
{
    buf[0] = '\0';
    if (isa == LOOM_KERNELS_SCALAR)
        return;
#if defined(__x86_64__)
    size_t used = 0;
    __builtin_cpu_init();
    for (const char *const *f = isa_features[isa]; *f != NULL; f++) {
        if (!cpu_has(*f) && used < len)
            used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? "," : "", *f);
    }
#else
    snprintf(buf, len, "x86-64 kernels (not built for this architecture)");
#endif
}

/* ---- Tables and the active set ------------------------------------------- */

static void overlay(struct loom_kernel_row *dst, const struct loom_kernel_row *src)
{
    for (int dt = 0; dt < loomNumTypes; dt++) {
        struct loom_kernel_row *d = &dst[dt];
        const struct loom_kernel_row *s = &src[dt];
        if (s->init)
            d->init = s->init;
        for (int op = 0; op < loomNumOps; op++) {
            if (s->acc[op])
                d->acc[op] = s->acc[op];
            if (s->finish[op])
                d->finish[op] = s->finish[op];
            if (s->multi[op])
                d->multi[op] = s->multi[op];
        }
    }
}

static loom_kernels_isa_t best_available(void)
{
    for (int isa = LOOM_KERNELS_NUM_ISA - 1; isa > 0; isa--)
        if (isa_ok[isa])
            return (loom_kernels_isa_t)isa;
    return LOOM_KERNELS_SCALAR;
}

/* loom_kernels_choose without the setup, which calls it. */
static loom_kernels_isa_t choose(const char *request)
{
    loom_kernels_isa_t best = best_available();
    if (request == NULL || request[0] == '\0' || strcasecmp(request, "auto") == 0)
        return best;
    for (int isa = 0; isa < LOOM_KERNELS_NUM_ISA; isa++) {
        if (strcasecmp(request, isa_names[isa]) != 0)
            continue;
        if (isa_ok[isa])
            return (loom_kernels_isa_t)isa;
        char missing[128];
        isa_missing((loom_kernels_isa_t)isa, missing, sizeof(missing));
        LOOM_WARN("LOOM_KERNELS=%s: this machine lacks %s; using %s kernels", request, missing,
                  isa_names[best]);
        return best;
    }
    LOOM_WARN("LOOM_KERNELS=%s is not one of auto, scalar, avx2, avx512; using %s kernels", request,
              isa_names[best]);
    return best;
}

static void setup(void)
{
    memcpy(isa_tables[LOOM_KERNELS_SCALAR], loom_kernels_scalar_table,
           sizeof(loom_kernels_scalar_table));
    isa_ok[LOOM_KERNELS_SCALAR] = 1;
    for (int isa = 1; isa < LOOM_KERNELS_NUM_ISA; isa++) {
        memcpy(isa_tables[isa], isa_tables[isa - 1], sizeof(isa_tables[isa]));
        const struct loom_kernel_row *o = isa_overlay((loom_kernels_isa_t)isa);
        char missing[128];
        isa_missing((loom_kernels_isa_t)isa, missing, sizeof(missing));
        if (o != NULL) {
            overlay(isa_tables[isa], o);
            isa_ok[isa] = missing[0] == '\0';
        }
    }
    const char *request = loom_param_KERNELS();
    loom_kernels_isa_t isa = choose(request);
    atomic_store(&active_isa, (int)isa);
    LOOM_INFO(LOOM_LOG_INIT, "reduction kernels: %s (LOOM_KERNELS=%s)", isa_names[isa], request);
}

static void ensure_setup(void)
{
    pthread_once(&setup_once, setup);
}

int loom_kernels_isa_available(loom_kernels_isa_t isa)
{
    ensure_setup();
    return (int)isa >= 0 && isa < LOOM_KERNELS_NUM_ISA && isa_ok[isa];
}

loom_kernels_isa_t loom_kernels_choose(const char *request)
{
    ensure_setup();
    return choose(request);
}

loom_kernels_isa_t loom_kernels_isa(void)
{
    ensure_setup();
    return (loom_kernels_isa_t)atomic_load_explicit(&active_isa, memory_order_relaxed);
}

loomResult_t loom_kernels_use(loom_kernels_isa_t isa)
{
    if (!loom_kernels_isa_available(isa)) {
        char missing[128] = "";
        if ((int)isa >= 0 && isa < LOOM_KERNELS_NUM_ISA)
            isa_missing(isa, missing, sizeof(missing));
        LOOM_WARN("reduction kernels %s (%d) are not available here%s%s",
                  loom_kernels_isa_name(isa), (int)isa, missing[0] ? ": no " : "", missing);
        return loomInvalidArgument;
    }
    atomic_store_explicit(&active_isa, (int)isa, memory_order_relaxed);
    return loomSuccess;
}

/* The tables are complete and never change after setup, so which set a call
 * sees only needs the index to be read whole. */
static const struct loom_kernel_row *row_of(loomDataType_t dt)
{
    if (!loom_dtype_valid(dt))
        return NULL;
    ensure_setup();
    return &isa_tables[atomic_load_explicit(&active_isa, memory_order_relaxed)][dt];
}

/* ---- Entry points -------------------------------------------------------- */

size_t loom_acc_size(loomDataType_t dt)
{
    return loom_dtype_valid(dt) ? loom_kernels_scalar_table[dt].acc_size : 0;
}

int loom_acc_is_native(loomDataType_t dt)
{
    return loom_dtype_valid(dt) ? loom_kernels_scalar_table[dt].native : 0;
}

void loom_reduce_init(loomDataType_t dt, void *acc, const void *src, size_t n)
{
    const struct loom_kernel_row *r = row_of(dt);
    if (r != NULL && n > 0)
        r->init(acc, src, n);
}

void loom_reduce_acc(loomDataType_t dt, loomRedOp_t op, void *acc, const void *src, size_t n)
{
    const struct loom_kernel_row *r = row_of(dt);
    if (r != NULL && loom_redop_valid(op) && n > 0)
        r->acc[op](acc, src, n);
}

void loom_reduce_finish(loomDataType_t dt, loomRedOp_t op, void *dst, const void *acc, size_t n,
                        int nranks)
{
    const struct loom_kernel_row *r = row_of(dt);
    if (r == NULL || !loom_redop_valid(op) || n == 0)
        return;
    /* Only the scalar finish copes with a partial overlap (it goes through a
     * bounce buffer); the vector ones need dst == acc or no overlap. */
    if (dst != acc && loom_kernels_overlap(dst, n * loom_dtype_size(dt), acc, n * r->acc_size))
        r = &isa_tables[LOOM_KERNELS_SCALAR][dt];
    r->finish[op](dst, acc, n, nranks < 1 ? 1 : nranks);
}

/* Accumulator bytes per block of the unfused loom_reduce_multi: the block
 * stays in L1 between the passes over the sources. */
#define MULTI_BLOCK_BYTES 8192

static void multi_blocked(const struct loom_kernel_row *r, loomDataType_t dt, loomRedOp_t op,
                          void *dst, const void *const *srcs, int nsrc, size_t n, int nranks)
{
    _Alignas(64) unsigned char acc[MULTI_BLOCK_BYTES];
    const size_t esz = loom_dtype_size(dt), blk = MULTI_BLOCK_BYTES / r->acc_size;
    for (size_t off = 0; off < n; off += blk) {
        size_t len = n - off < blk ? n - off : blk;
        /* Every source's block is read before finish writes dst's, so dst
         * may be one of the sources. */
        r->init(acc, (const unsigned char *)srcs[0] + off * esz, len);
        for (int j = 1; j < nsrc; j++)
            r->acc[op](acc, (const unsigned char *)srcs[j] + off * esz, len);
        r->finish[op]((unsigned char *)dst + off * esz, acc, len, nranks);
    }
}

void loom_reduce_multi(loomDataType_t dt, loomRedOp_t op, void *dst, const void *const *srcs,
                       int nsrc, size_t n, int nranks)
{
    const struct loom_kernel_row *r = row_of(dt);
    if (r == NULL || !loom_redop_valid(op) || n == 0 || nsrc < 1 || srcs == NULL)
        return;
    nranks = nranks < 1 ? 1 : nranks;
    if (r->multi[op] != NULL)
        r->multi[op](dst, srcs, nsrc, n, nranks);
    else
        multi_blocked(r, dt, op, dst, srcs, nsrc, n, nranks);
}
