/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_plan.h - how one shared-memory collective runs: the variant (tiny, flat, cico, cma), its
 * store modes and its reduction block, decided by one pure function (shm_plan.c) from the call
 * and from what the machine measurably is: cache sizes from the topology, the CPU count, the
 * arena's slot half and the creation-time agreement on single copy. The same inputs give the
 * same plan on every rank and at every call; nothing depends on the calls before.
 * docs/shm-collectives.md states the rules and why each holds.
 */
#ifndef LOOM_SHM_PLAN_H
#define LOOM_SHM_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "cost_model.h"

/* Algorithm ids, carried in the call descriptor: ranks that run different
 * algorithms on one call fail instead of misreading each other's slots. */
enum { SHM_ALGO_FLAT = 1, SHM_ALGO_CICO, SHM_ALGO_CMA, SHM_ALGO_BARRIER, SHM_ALGO_TINY };

/* Environment overrides (params.def); 0 leaves the choice to the rules. */
typedef struct {
    int nt_stores;      /* LOOM_SHM_NT_STORES: 1 always, -1 never */
    size_t block_bytes; /* LOOM_SHM_BLOCK_BYTES */
    size_t cma_min;     /* LOOM_SHM_CMA_MIN_BYTES */
} loom_shm_overrides_t;

/* Thresholds meaning "never". */
#define SHM_NEVER ((size_t)-1)

typedef struct {
    uint32_t variant;         /* SHM_ALGO_* */
    size_t nt_out_min;        /* copies into recvbuff of this many bytes or more stream */
    size_t nt_in_min;         /* copies into the arena of this many bytes or more stream */
    size_t block_bytes;       /* reduction block */
    size_t piece_bytes;       /* a flat Reduce's smallest piece: at least the L1d */
    const char *reason;       /* the property or override that chose the variant */
    const char *store_reason; /* ... and the store thresholds */
} loom_shm_plan_t;

/* Where a cache size is unknown, the plan assumes the smallest of current server cores. */
#define SHM_L1D_ASSUMED (32u << 10)
#define SHM_L2_ASSUMED  (512u << 10)

/* 1 if a call of kind moving `bytes` on n ranks runs tiny: a rank's input fits one cell. */
int loom_shm_is_tiny(loom_coll_kind_t kind, size_t bytes, int n);
/* The plan for a call of kind moving `bytes` (loom_coll_bytes) on n ranks. */
void loom_shm_plan(loom_coll_kind_t kind, size_t bytes, int n, const loom_shm_machine_t *m,
                   const loom_shm_overrides_t *o, loom_shm_plan_t *p);
/* The overrides this process's environment sets (a bad value WARNs once and is ignored). */
void loom_shm_overrides(loom_shm_overrides_t *o);
/* Bytes from which a copy's destination streams past the cache: it no longer fits the
 * writer's L2 twice over, or its share of the L3, whichever is smaller. */
size_t loom_shm_nt_threshold(const loom_shm_machine_t *m, int n);
/* Predicted ns of call c (c->nbytes as loom_coll_bytes) of kind when it runs variant
 * (SHM_ALGO_*) on machine m, from the shm link's constants (shm_cost.c); LOOM_COST_NA for one
 * rank and for AllToAllv. A pure function of its arguments. */
double loom_shm_predict(loom_coll_kind_t kind, uint32_t variant, const loom_cost_call_t *c,
                        const loom_shm_machine_t *m, const loom_link_cost_t *link);
/* The slot of loom_shm_machine_t.call_ns that the arena probe times kind's variant in, or -1
 * where it times none (shm_probe.c). */
int loom_shm_probe_slot(loom_coll_kind_t kind, uint32_t variant);
/* The collective and variant of the probe's call in slot. */
void loom_shm_probe_call(int slot, loom_coll_kind_t *kind, uint32_t *variant);
/* The bytes (as loom_coll_bytes) of the probe's call in slot at footprint tier on machine m
 * with n ranks. */
size_t loom_shm_probe_bytes(const loom_shm_machine_t *m, int n, int slot, int tier);
/* "shm_tiny", "shm_flat", ... for an SHM_ALGO_* id. */
const char *loom_shm_algo_name(uint32_t algo);
/* One line describing m, for logs and loom_info. */
void loom_shm_machine_text(const loom_shm_machine_t *m, char *buf, size_t len);

/* This process's caches (bytes, 0 unknown): LOOM_TOPO_FILE's host where a communicator read
 * one, else this machine's as detected; 0 before either was set. */
void loom_shm_caches(size_t *l1d, size_t *l2, size_t *l3);
/* This machine's caches as the topology detects them (KiB, <= 0 unknown). */
void loom_shm_set_detected_caches(int32_t l1d_kb, int32_t l2_kb, int32_t l3_kb);
/* A topology file's caches (KiB, <= 0 unknown) stand for this machine's from now on. */
void loom_shm_set_file_caches(int32_t l1d_kb, int32_t l2_kb, int32_t l3_kb);

#endif
