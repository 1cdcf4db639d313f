/* SPDX-License-Identifier: Apache-2.0
 *
 * init.h - communicator creation shared by init.c, env_init.c and split.
 */
#ifndef LOOM_API_INIT_H
#define LOOM_API_INIT_H

#include "bootstrap.h"
#include "loom.h"
#include "transport.h"

/* Creates the communicator once the rendezvous address and secret are known. */
loomResult_t loom_comm_create(loomComm_t *comm_p, int nranks, const loom_id_t *id, int rank,
                              const loomConfig_t *config);
/* Fills this process's identity: pid, hostname, host id (LOOM_HOST_ID), hashes. */
void loom_identity_fill(loom_peer_info_t *me, int rank);

/* Removes comm from the registry of live communicators; 1 if it was there. */
int loom_comm_live_remove(struct loomComm *comm);

#endif
