/* SPDX-License-Identifier: Apache-2.0
 *
 * bootstrap.h - rendezvous of the ranks of one communicator. A root service
 * (a thread in the process that made the unique id, or in rank 0 for env
 * initialisation) accepts one connection per rank, proves the job secret on
 * each, and then serves all-gathers through itself until every rank leaves.
 * Used only during communicator setup: data never flows through it.
 */
#ifndef LOOM_BOOTSTRAP_H
#define LOOM_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "bootstrap_wire.h"
#include "loom.h"
#include "secret.h"
#include "socket.h"

typedef struct loom_bootstrap loom_bootstrap_t;

/* Decodes and checks a unique id (loom_bs_id_decode); WARNs what is wrong. */
loomResult_t loom_id_decode(const loomUniqueId *uid, loom_id_t *id_p);
void loom_id_encode(const loom_id_t *id, loomUniqueId *uid);

/* Starts the root service on an already bound, listening socket (it takes
 * ownership of listen_fd). The thread ends when every rank has left, when a
 * rank fails, or after timeout_ms without all ranks arriving. Until every
 * rank has said hello it serves all pending connections at once (poll), so
 * stray or hostile ones cannot delay the ranks; see bootstrap.c. */
loomResult_t loom_bootstrap_root_start(int listen_fd, const uint8_t secret[LOOM_SECRET_BYTES],
                                       int64_t timeout_ms);

/* As loom_bootstrap_root_start; quiet_probes: a shrink's rendezvous, where a connection that
 * closes before sending a byte is another survivor's liveness probe, dropped at INFO instead
 * of logged and counted as a stray. */
loomResult_t loom_bootstrap_root_start_shrink(int listen_fd,
                                              const uint8_t secret[LOOM_SECRET_BYTES],
                                              int64_t timeout_ms, int quiet_probes);

/* Joins the rendezvous as rank of nranks. Blocking, bounded by timeout_ms;
 * Timeout names the ranks that never arrived. */
loomResult_t loom_bootstrap_join(const loom_id_t *id, int rank, int nranks, int64_t timeout_ms,
                                 loom_bootstrap_t **bs_p);
/* out[r*len .. (r+1)*len) = rank r's data. Every rank must pass the same len. */
loomResult_t loom_bootstrap_allgather(loom_bootstrap_t *bs, const void *data, size_t len,
                                      void *out);
/* This rank's address on its connection to the root (port 0): an interface
 * the root's network reaches, for a listener of this rank's own. */
loomResult_t loom_bootstrap_local_addr(const loom_bootstrap_t *bs, loom_sockaddr_t *addr_p);
/* Leaves the rendezvous (tells the root) and frees bs. */
loomResult_t loom_bootstrap_leave(loom_bootstrap_t *bs);

#endif
