/* SPDX-License-Identifier: Apache-2.0
 *
 * init.h - communicator creation shared by init.c, env_init.c and split.
 */
#ifndef LOOM_API_INIT_H
#define LOOM_API_INIT_H

#include "bootstrap.h"
#include "loom.h"
#include "transport.h"

/* Creates the communicator once the rendezvous address and secret are known. topo: apply
 * LOOM_TOPO_FILE and LOOM_TOPO_DUMP_FILE (0 for the children of loomCommSplit). */
loomResult_t loom_comm_create(loomComm_t *comm_p, int nranks, const loom_id_t *id, int rank,
                              const loomConfig_t *config, int topo);
/* loomCommInitRankConfig's checks, then loom_comm_create. */
loomResult_t loom_comm_init_checked(loomComm_t *comm, int nranks, loomUniqueId commId, int rank,
                                    const loomConfig_t *config, int topo);
/* The topology work at creation (topo_init.c): after the identities are exchanged, collective
 * over the bootstrap when any rank set LOOM_TOPO_FILE or LOOM_TOPO_DUMP_FILE. */
loomResult_t loom_topo_at_init(struct loomComm *c, loom_bootstrap_t *bs);
/* Fills this process's identity: pid, hostname, host id (LOOM_HOST_ID), hashes. */
void loom_identity_fill(loom_peer_info_t *me, int rank);

#endif
