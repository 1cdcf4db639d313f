/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_flags.c - the pool of flag-word blocks (dev_flags.h): one pool per
 * process, since a mapping for the device is the process's. Pages come from
 * mmap (page aligned, as host_map wants) and stay mapped for the life of the
 * process: a page is small and a runtime may not be able to unmap while a
 * stream of a communicator being torn down still touches it.
 */
#include "dev_flags.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

#define BLOCK_BYTES (LOOM_DEV_FLAG_WORDS * sizeof(uint32_t))

/* A free block: its host address is where the next free block's pointer is
 * kept (the words are unused while free), so the pool needs no memory of its
 * own beyond the pages' device offsets. */
typedef struct free_block {
    struct free_block *next;
    uint32_t *dev;
} free_block_t;

_Static_assert(sizeof(free_block_t) <= BLOCK_BYTES, "a free block's link fits its words");

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static free_block_t *pool_free;
static const loom_devrt_t *pool_rt;

/* Maps one more page and threads its blocks onto the free list (pool_lock held). */
static loomResult_t pool_grow(const loom_devrt_t *rt)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t bytes = page > 0 ? (size_t)page : 4096;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        LOOM_WARN("device flags: mmap of %zu bytes failed: %s", bytes, strerror(errno));
        return loomSystemError;
    }
    void *dev = NULL;
    loomResult_t res = rt->host_map(p, bytes, &dev);
    if (res != loomSuccess) {
        munmap(p, bytes);
        return res;
    }
    for (size_t off = 0; off + BLOCK_BYTES <= bytes; off += BLOCK_BYTES) {
        free_block_t *b = (free_block_t *)((char *)p + off);
        b->dev = (uint32_t *)((char *)dev + off);
        b->next = pool_free;
        pool_free = b;
    }
    return loomSuccess;
}

loomResult_t loom_dev_flags_get(const loom_devrt_t *rt, loom_dev_flags_t *f)
{
    pthread_mutex_lock(&pool_lock);
    loomResult_t res = loomSuccess;
    if (pool_rt != NULL && pool_rt != rt) {
        /* One runtime per process (devrt.h): a second would need pages of its own. */
        LOOM_WARN("device flags: runtime %s asked for flags of a pool mapped for %s", rt->name,
                  pool_rt->name);
        res = loomInternalError;
    } else if (pool_free == NULL) {
        res = pool_grow(rt);
    }
    if (res == loomSuccess) {
        pool_rt = rt;
        free_block_t *b = pool_free;
        pool_free = b->next;
        f->dev = b->dev;
        f->host = (uint32_t *)(void *)b;
        for (int w = 0; w < LOOM_DEV_FLAG_WORDS; w++)
            __atomic_store_n(&f->host[w], 0u, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&pool_lock);
    return res;
}

void loom_dev_flags_put(loom_dev_flags_t *f)
{
    if (f->host == NULL)
        return;
    pthread_mutex_lock(&pool_lock);
    free_block_t *b = (free_block_t *)(void *)f->host;
    b->dev = f->dev;
    b->next = pool_free;
    pool_free = b;
    pthread_mutex_unlock(&pool_lock);
    f->host = f->dev = NULL;
}
