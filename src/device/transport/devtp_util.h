/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp_util.h - what the ipc and nccl device transports share: the exchange
 * of one record per rank over the host communicator, the agreement that ends
 * every open (each rank learns whether all succeeded, and the first failing
 * rank's one-line reason), and the bookkeeping of the work a transport
 * queued, which close waits for before it frees what that work touches.
 */
#ifndef LOOM_DEVTP_UTIL_H
#define LOOM_DEVTP_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "devtp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_DEVTP_WHY_BYTES 120 /* a rank's reason, as exchanged */

/* Every rank's `bytes` of `mine` into all[nranks * bytes] (loomAllGather of
 * bytes on dc->comm, blocking). On failure why says so (the host
 * communicator's last error) and the host result comes back. */
loomResult_t loom_devtp_allgather(loom_dev_comm_t *dc, const void *mine, void *all, size_t bytes,
                                  char *why, size_t why_len);

/* The agreement: every rank passes its result (loomSuccess or the error it
 * met) and reason; all ranks return the same thing: loomSuccess when every
 * rank succeeded, else the first failing rank's error with
 * why = "rank R: its reason". A failing exchange is a failure too (its
 * reason, on the ranks that see it; the others see it fail as well). */
loomResult_t loom_devtp_agree(loom_dev_comm_t *dc, loomResult_t mine, const char *my_why, char *why,
                              size_t why_len);

/* Formats a reason into why (never more than why_len - 1 characters). */
void loom_devtp_why(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The points a transport's queued work must pass before close may free what
 * it reads and writes: one event recorded at the end of each run (not while
 * the stream captures a graph, whose replays close cannot see). */
typedef struct {
    pthread_mutex_t lock;
    loom_dev_event_t *pending; /* recorded, not known to be passed */
    size_t npending, cap_pending;
    loom_dev_event_t *spare; /* passed, for reuse */
    size_t nspare, cap_spare;
} loom_devtp_track_t;

void loom_devtp_track_init(loom_devtp_track_t *t);
/* Records the end of the work queued on s so far (a no-op while s captures).
 * Errors from the runtime come back (the work is queued all the same). */
loomResult_t loom_devtp_track(loom_devtp_track_t *t, const loom_devrt_t *rt, loom_dev_stream_t s);
/* Waits until every recorded point is passed (or its stream failed):
 * 1 when all are, 0 when timeout_ms (>= 0) ran out first. */
int loom_devtp_track_wait(loom_devtp_track_t *t, const loom_devrt_t *rt, int64_t timeout_ms);
/* Destroys the events (after a wait that returned 1, or to leak nothing the
 * runtime would not free anyway). */
void loom_devtp_track_fini(loom_devtp_track_t *t, const loom_devrt_t *rt);

/* Monotonic milliseconds. */
int64_t loom_devtp_now_ms(void);

#ifdef __cplusplus
}
#endif

#endif
