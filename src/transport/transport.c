/* SPDX-License-Identifier: Apache-2.0
 *
 * transport.c - the registry of built-in transports, in default preference
 * order: shared memory first (same host only), ucx when built with UCX, then
 * tcp (reaches everyone). ucx is opt-in: it is used where LOOM_NET names it,
 * or, with LOOM_NET unset, between hosts where loom's model prefers it
 * (api/net_auto.c); otherwise loom keeps its own shm within a host and tcp
 * across hosts. Selection per peer and LOOM_NET filtering are p2p_setup.c's job,
 * not this file's. Callers: p2p_setup.c, tools/loom_info.
 */
#include <string.h>

#include "transport.h"

static const loom_tp_t *const registry[] = {
    &loom_tp_shm,
#ifdef LOOM_HAVE_UCX
    &loom_tp_ucx,
#endif
    &loom_tp_tcp,
};

const loom_tp_t *const *loom_tp_registry(int *n_p)
{
    *n_p = (int)(sizeof(registry) / sizeof(registry[0]));
    return registry;
}

int loom_tp_opt_in(const loom_tp_t *tp)
{
#ifdef LOOM_HAVE_UCX
    return tp == &loom_tp_ucx;
#else
    (void)tp;
    return 0;
#endif
}

int loom_tp_built(const char *name)
{
    int n = 0;
    const loom_tp_t *const *reg = loom_tp_registry(&n);
    for (int i = 0; i < n; i++)
        if (strcmp(reg[i]->name, name) == 0)
            return 1;
    return 0;
}
