/* SPDX-License-Identifier: Apache-2.0
 *
 * transport.c - the registry of built-in transports, in default preference
 * order: shared memory first (same host only), tcp last (reaches everyone).
 * Selection per peer and LOOM_NET filtering are p2p.c's job, not this file's.
 * Callers: p2p.c, tools/loom_info.
 */
#include "transport.h"

static const loom_tp_t *const registry[] = {&loom_tp_shm, &loom_tp_tcp};

const loom_tp_t *const *loom_tp_registry(int *n_p)
{
    *n_p = (int)(sizeof(registry) / sizeof(registry[0]));
    return registry;
}
