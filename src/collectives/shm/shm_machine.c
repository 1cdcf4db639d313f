/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_machine.c - the cache sizes the shared-memory plan reads (shm_plan.h). The api layer hands
 * them in at communicator creation: those the topology finds on this machine (once per process:
 * a property of the machine, the same at every call), and those of the host a LOOM_TOPO_FILE
 * describes, which stand for this machine's as the file's RDMA ports do for the network's.
 */
#include <stddef.h>
#include <stdint.h>

#include "shm_plan.h"

/* KiB, 0 unknown, per source: [0] detected, [1] the file's; set[s] once the source spoke. */
static int32_t caches_kb[2][3];
static int caches_set[2];

static void set_caches(int source, int32_t l1d_kb, int32_t l2_kb, int32_t l3_kb)
{
    const int32_t kb[3] = {l1d_kb, l2_kb, l3_kb};
    for (int i = 0; i < 3; i++)
        __atomic_store_n(&caches_kb[source][i], kb[i] > 0 ? kb[i] : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&caches_set[source], 1, __ATOMIC_RELEASE);
}

void loom_shm_set_detected_caches(int32_t l1d_kb, int32_t l2_kb, int32_t l3_kb)
{
    set_caches(0, l1d_kb, l2_kb, l3_kb);
}

void loom_shm_set_file_caches(int32_t l1d_kb, int32_t l2_kb, int32_t l3_kb)
{
    set_caches(1, l1d_kb, l2_kb, l3_kb);
}

void loom_shm_caches(size_t *l1d, size_t *l2, size_t *l3)
{
    const int source = __atomic_load_n(&caches_set[1], __ATOMIC_ACQUIRE) ? 1 : 0;
    size_t *out[3] = {l1d, l2, l3};
    const int known = __atomic_load_n(&caches_set[source], __ATOMIC_ACQUIRE);
    for (int i = 0; i < 3; i++) {
        const int32_t kb = known ? __atomic_load_n(&caches_kb[source][i], __ATOMIC_RELAXED) : 0;
        *out[i] = (size_t)kb << 10;
    }
}
