/* SPDX-License-Identifier: Apache-2.0
 *
 * transport.c - the registry of built-in transports, in default preference
 * order: shared memory first (same host only), tcp (reaches everyone), then
 * ucx when built with UCX. ucx is opt-in: it is used only where LOOM_NET
 * names it, so by default loom keeps its own shm within a host and tcp across
 * hosts. Selection per peer and LOOM_NET filtering are p2p.c's job, not this
 * file's. Callers: p2p.c, tools/loom_info.
 */
#include "transport.h"

static const loom_tp_t *const registry[] = {
    &loom_tp_shm,
    &loom_tp_tcp,
#ifdef LOOM_HAVE_UCX
    &loom_tp_ucx,
#endif
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
