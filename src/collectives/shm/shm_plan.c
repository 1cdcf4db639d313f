/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_plan.c - the one place that decides how a shared-memory collective runs (shm_plan.h). Every
 * rule reads a measured property of the machine (a cache size, the CPU count, the slot half, the
 * creation-time probe of the kernel's copy) or an override; docs/shm-collectives.md gives the
 * reasoning and docs/PERFORMANCE.md the measurements that check it.
 */
#include "shm_plan.h"

#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "debug.h"
#include "param.h"

static const char *const algo_names[] = {"?",       "shm_flat",    "shm_cico",
                                         "shm_cma", "shm_barrier", "shm_tiny"};

const char *loom_shm_algo_name(uint32_t algo)
{
    return algo < sizeof(algo_names) / sizeof(algo_names[0]) ? algo_names[algo] : "?";
}

/* LOOM_SHM_BLOCK_BYTES must hold whole cache lines and fit the scratch. */
#define BLOCK_SET_MIN (4u << 10)
#define BLOCK_SET_MAX (64u << 20)
/* The derived block stays within these: smaller ones pay the loop's overhead per line, larger
 * ones than any L2 holds buy nothing. */
#define BLOCK_MIN (16u << 10)
#define BLOCK_MAX (1u << 20)

void loom_shm_overrides(loom_shm_overrides_t *o)
{
    static int warned;
    o->nt_stores = (int)loom_param_SHM_NT_STORES();
    o->cma_min = (size_t)loom_param_SHM_CMA_MIN_BYTES();
    o->block_bytes = (size_t)loom_param_SHM_BLOCK_BYTES();
    if (o->block_bytes != 0 && (o->block_bytes < BLOCK_SET_MIN || o->block_bytes > BLOCK_SET_MAX)) {
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            LOOM_WARN(
                "LOOM_SHM_BLOCK_BYTES=%zu is outside %u to %u bytes; the block follows the L2",
                o->block_bytes, BLOCK_SET_MIN, BLOCK_SET_MAX);
        o->block_bytes = 0;
    }
    o->block_bytes &= ~(size_t)63;
}

static size_t l1d_of(const loom_shm_machine_t *m)
{
    return m->l1d ? m->l1d : SHM_L1D_ASSUMED;
}

static size_t l2_of(const loom_shm_machine_t *m)
{
    return m->l2 ? m->l2 : SHM_L2_ASSUMED;
}

size_t loom_shm_nt_threshold(const loom_shm_machine_t *m, int n)
{
    size_t t = 2 * l2_of(m);
    const int sharing = n < m->cpus ? n : m->cpus;
    if (m->l3 && sharing > 0 && m->l3 / (size_t)sharing < t)
        t = m->l3 / (size_t)sharing;
    return t;
}

/* Accumulators, a block from a peer and the destination's block stay in the L2 with room for
 * the prefetcher's lines and the other data a rank touches: a sixteenth of it. */
static size_t block_bytes(const loom_shm_machine_t *m, const loom_shm_overrides_t *o)
{
    if (o->block_bytes > 0)
        return o->block_bytes;
    size_t b = BLOCK_MIN;
    while (b * 2 <= l2_of(m) / 16 && b < BLOCK_MAX)
        b *= 2;
    return b;
}

static void plan_stores(loom_coll_kind_t kind, int n, const loom_shm_machine_t *m,
                        const loom_shm_overrides_t *o, loom_shm_plan_t *p)
{
    if (o->nt_stores != 0) {
        p->nt_out_min = p->nt_in_min = o->nt_stores > 0 ? 0 : SHM_NEVER;
        p->store_reason = o->nt_stores > 0 ? "LOOM_SHM_NT_STORES=1" : "LOOM_SHM_NT_STORES=-1";
        return;
    }
    /* A Broadcast's copy in is the one write its readers wait for: where it would not stay in
     * the root's cache, streaming it spares the root reading each line first. */
    const size_t t = loom_shm_nt_threshold(m, n);
    p->nt_out_min = t;
    p->nt_in_min = kind == LOOM_COLL_BCAST ? t : SHM_NEVER;
    p->store_reason =
        kind == LOOM_COLL_BCAST
            ? "recvbuff and the root's copy in stream past twice the L2 or the L3 share"
            : "recvbuff streams past twice the L2 or the L3 share";
}

/* Single copy replaces two user copies by one kernel copy, from a page on (below it the
 * system call's fixed cost exceeds both copies). A Broadcast's readers copy the root's buffer
 * once either way and, through the arena, also wait for the root's copy in: single copy takes a
 * whole copy off the critical path at every size. AllGather and AllToAll make every rank both
 * copy in and copy out; past the streaming threshold the arena's two streaming copies beat one
 * kernel copy that reads every destination line first. The reductions keep the arena: their
 * owners read the peers' parts once either way, and reduce them where they read. */
static int single_copy_pays(loom_coll_kind_t kind, size_t bytes, int n, const loom_shm_machine_t *m,
                            size_t cma_min, const char **why)
{
    if (bytes < cma_min) {
        *why = cma_min == m->page ? "through the arena: less than a page"
                                  : "through the arena: below LOOM_SHM_CMA_MIN_BYTES";
        return 0;
    }
    /* With more ranks than CPUs every flag a rank waits for costs a context switch: single
     * copy waits for two per call, cico for one per round, so it pays only past one round...
     * except an AllToAll, whose arena copies every byte twice (in and out) where single copy
     * copies it once: the CPUs that the ranks share save a whole copy of what a rank receives
     * once that outweighs the extra wait, from about a rank's L1d on (docs/PERFORMANCE.md). */
    const int crowded = m->cpus > 0 && n > m->cpus;
    const size_t received = bytes / (size_t)n * (size_t)(n - 1);
    if (crowded && kind == LOOM_COLL_ALLTOALL) {
        *why = received < l1d_of(m)
                   ? "through the arena: more ranks than CPUs and a rank receives less than its L1d"
                   : "single copy: more ranks than CPUs share the copies, and it copies once";
        return received >= l1d_of(m);
    }
    if (crowded && bytes <= m->half) {
        *why = "through the arena: more ranks than CPUs and one round of cico";
        return 0;
    }
    switch (kind) {
    case LOOM_COLL_BCAST:
        if (crowded && bytes >= loom_shm_nt_threshold(m, n)) {
            *why = "through the arena: more ranks than CPUs and past the streaming threshold";
            return 0;
        }
        *why = "single copy: the readers skip the root's copy in";
        return 1;
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_ALLGATHERV:
    case LOOM_COLL_ALLTOALL:
        if (received >= loom_shm_nt_threshold(m, n)) {
            *why = "through the arena: a rank receives past the streaming threshold";
            return 0;
        }
        *why = "single copy: one kernel copy beats two through the arena";
        return 1;
    default:
        *why = "through the arena: single copy does not pay where ranks reduce";
        return 0;
    }
}

int loom_shm_is_tiny(loom_coll_kind_t kind, size_t bytes, int n)
{
    /* A rank's input: the whole vector, but one block of an all-gather. The uneven
     * collectives have no tiny form (their blocks would need their counts in the cell). */
    const size_t input = kind == LOOM_COLL_ALLGATHER && n > 0 ? bytes / (size_t)n : bytes;
    return kind != LOOM_COLL_BARRIER && kind != LOOM_COLL_ALLGATHERV &&
           kind != LOOM_COLL_REDUCE_SCATTERV && input > 0 && input <= LOOM_ARENA_CELL_BYTES;
}

void loom_shm_plan(loom_coll_kind_t kind, size_t bytes, int n, const loom_shm_machine_t *m,
                   const loom_shm_overrides_t *o, loom_shm_plan_t *p)
{
    p->variant = SHM_ALGO_CICO;
    p->nt_out_min = p->nt_in_min = SHM_NEVER;
    p->block_bytes = block_bytes(m, o);
    /* A flat Reduce's root reads a piece while a non-root writes the next; a piece smaller than
     * the writer's L1d leaves the two on lines the writer still holds, and pays the flag's
     * handover for little. */
    p->piece_bytes = (l1d_of(m) + 63) & ~(size_t)63;
    p->store_reason = "no copies";
    if (kind == LOOM_COLL_BARRIER) {
        p->variant = SHM_ALGO_BARRIER;
        p->reason = "barrier";
        return;
    }
    if (loom_shm_is_tiny(kind, bytes, n)) {
        p->variant = SHM_ALGO_TINY;
        p->reason = "input fits a cell";
        p->store_reason = "plain stores into cells";
        return;
    }
    plan_stores(kind, n, m, o, p);
    /* Flat has every rank (the root) reduce all n copies for one flag less than cico. */
    const size_t work = (size_t)n * bytes;
    if (kind == LOOM_COLL_ALLREDUCE && bytes <= m->half && work <= l1d_of(m)) {
        p->variant = SHM_ALGO_FLAT;
        p->reason = "flat: the n copies every rank reduces fit its L1d";
        return;
    }
    if (kind == LOOM_COLL_REDUCE && bytes <= m->half && work <= l2_of(m) / 2) {
        p->variant = SHM_ALGO_FLAT;
        p->reason = "flat: the n copies the root reduces fit half its L2, and the others leave";
        return;
    }
    if (m->single_copy <= 0 || n < 2) {
        p->reason = "through the arena: no single copy (LOOM_SHM_COLL_CMA=0, or "
                    "process_vm_readv failed at creation)";
        return;
    }
    if (m->single_copy >= 2) {
        p->variant = SHM_ALGO_CMA;
        p->reason = "single copy: LOOM_SHM_COLL_CMA=2";
        return;
    }
    if (!m->kernel_fast) {
        p->reason = "through the arena: the kernel's copy costs more than two memcpys (probe)";
        return;
    }
    const char *why = NULL;
    if (single_copy_pays(kind, bytes, n, m, o->cma_min ? o->cma_min : m->page, &why))
        p->variant = SHM_ALGO_CMA;
    p->reason = why;
}

void loom_shm_machine_text(const loom_shm_machine_t *m, char *buf, size_t len)
{
    snprintf(buf, len,
             "%d CPUs, L1d %zu KiB%s, L2 %zu KiB%s, L3 %zu KiB%s, slot half %zu KiB; single copy "
             "%s%s",
             m->cpus, l1d_of(m) >> 10, m->l1d ? "" : " (assumed)", l2_of(m) >> 10,
             m->l2 ? "" : " (assumed)", m->l3 >> 10, m->l3 ? "" : " (unknown)", m->half >> 10,
             m->single_copy == 0   ? "off"
             : m->single_copy == 2 ? "always"
                                   : "by the rules",
             m->single_copy == 1 ? (m->kernel_fast ? ", kernel copy fast" : ", kernel copy slow")
                                 : "");
    size_t used = strlen(buf);
    if (m->half > 0 && used < len)
        snprintf(buf + used, len - used, "; near pairs copied %s",
                 m->copy_backward ? "backwards" : "forwards");
    used = strlen(buf);
    if (m->copy_forward_ns > 0 && used < len)
        snprintf(buf + used, len - used, " (probe: %.2f us forwards, %.2f backwards)",
                 m->copy_forward_ns / 1e3, m->copy_backward_ns / 1e3);
    used = strlen(buf);
    if (m->cross_ns > 0 && used < len)
        snprintf(buf + used, len - used,
                 "; arena probe: flag round %.2f us, copy %.4f ns/B from lines this core wrote, "
                 "%.4f from another's both ways, %.4f one way",
                 m->flag_ns / 1e3, m->local_ns, m->cross_ns, m->cross1_ns);
    used = strlen(buf);
    if (m->memory_ns > 0 && used < len)
        snprintf(buf + used, len - used, "; memory copy %.2f GB/s (LOOM_SHM_MEMORY_MBPS)",
                 1.0 / m->memory_ns);
    if (m->probe_ranks < 2)
        return;
    used = strlen(buf);
    if (used < len)
        snprintf(buf + used, len - used, "; probed calls of %d ranks:", m->probe_ranks);
    for (int slot = 0; slot < LOOM_SHM_PROBE_CALLS && (used = strlen(buf)) < len; slot++) {
        loom_coll_kind_t kind;
        uint32_t variant;
        loom_shm_probe_call(slot, &kind, &variant);
        snprintf(buf + used, len - used, "%s %s %s", slot ? "," : "", loom_coll_name(kind),
                 loom_shm_algo_name(variant));
        for (int tier = 0; tier < LOOM_SHM_PROBE_TIERS && (used = strlen(buf)) < len; tier++)
            snprintf(buf + used, len - used, "%s %zu KiB %.2f us", tier ? " and" : "",
                     loom_shm_probe_bytes(m, m->probe_ranks, slot, tier) >> 10,
                     m->call_ns[tier][slot] / 1e3);
    }
}
