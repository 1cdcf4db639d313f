/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_flags.h - the flag words of loom's own device-path protocol (the
 * staged transport, the gates of worker streams, the host functions of
 * wrapped streams): 32-bit host words that a stream writes (write_u32) and
 * waits on (wait_u32) and a host thread reads and stores, in pages made
 * addressable by the device with the runtime's host_map.
 *
 * A block of LOOM_DEV_FLAG_WORDS words serves one call for the whole of its
 * life and is zero when handed out, so every wait is "word >= 1" and no
 * sequence number can wrap. A block goes back to the pool only once nothing
 * queued can still wait on it (the call completed, and so did every call
 * that waits on one of its words), which is what makes reuse safe.
 */
#ifndef LOOM_DEV_FLAGS_H
#define LOOM_DEV_FLAGS_H

#include <stdint.h>

#include "devrt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_DEV_FLAG_WORDS 4
/* The words of a call's block. */
enum {
    LOOM_DEV_F_READY = 0, /* the stream reached the call: its inputs are staged */
    LOOM_DEV_F_DONE = 1,  /* the host side finished (or LOOM_DEV_FLAG_ABORT) */
    LOOM_DEV_F_FREED = 2, /* the stream finished the call's work (staged: copied the outputs
                             back, so the staging may be reused) */
    LOOM_DEV_F_GATE = 3   /* a worker stream reached the call (worker-stream calls only) */
};

typedef struct {
    uint32_t *host; /* LOOM_DEV_FLAG_WORDS words as the host addresses them; NULL: none */
    uint32_t *dev;  /* the same words as streams address them */
} loom_dev_flags_t;

/* A zeroed block; SystemError or the runtime's error when no page can be mapped. */
loomResult_t loom_dev_flags_get(const loom_devrt_t *rt, loom_dev_flags_t *f);
/* Returns the block (a no-op for an empty one); f is emptied. */
void loom_dev_flags_put(loom_dev_flags_t *f);

/* Host side of one word. */
static inline uint32_t loom_dev_flag_load(const loom_dev_flags_t *f, int w)
{
    return __atomic_load_n(&f->host[w], __ATOMIC_ACQUIRE);
}
static inline void loom_dev_flag_store(const loom_dev_flags_t *f, int w, uint32_t v)
{
    __atomic_store_n(&f->host[w], v, __ATOMIC_SEQ_CST);
}

#ifdef __cplusplus
}
#endif

#endif
