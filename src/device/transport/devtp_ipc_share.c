/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp_ipc_share.c - one mapping per process of each ipc flags segment
 * (devtp_ipc.c). Ranks that are threads of one process use the mapping the
 * first of them made, instead of each mapping the file again: the flags are
 * then one set of addresses in the process, which is what lets a race
 * detector see the order their stores and loads give (two mappings of one
 * file alias behind its back), and the device registration (host_map, on
 * CUDA cudaHostRegister) is made once per process, as CUDA requires.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devtp_ipc.h"

typedef struct share {
    char name[64];
    void *base;
    void *dev;
    size_t bytes;
    int refs;
    struct share *next;
} share_t;

static pthread_mutex_t share_lock = PTHREAD_MUTEX_INITIALIZER;
static share_t *shares;

int loom_ipc_share_find(const char *name, size_t bytes, void **base, void **dev)
{
    int found = 0;
    pthread_mutex_lock(&share_lock);
    for (share_t *s = shares; s != NULL; s = s->next)
        if (strcmp(s->name, name) == 0 && s->bytes == bytes) {
            s->refs++;
            *base = s->base;
            *dev = s->dev;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&share_lock);
    return found;
}

int loom_ipc_share_add(const char *name, void *base, size_t bytes, void *dev)
{
    share_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return 0;
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->base = base;
    s->dev = dev;
    s->bytes = bytes;
    s->refs = 1;
    pthread_mutex_lock(&share_lock);
    s->next = shares;
    shares = s;
    pthread_mutex_unlock(&share_lock);
    return 1;
}

int loom_ipc_share_drop(void *base)
{
    int last = 1; /* a mapping never listed (out of memory at add) is this rank's alone */
    pthread_mutex_lock(&share_lock);
    for (share_t **p = &shares; *p != NULL; p = &(*p)->next)
        if ((*p)->base == base) {
            share_t *s = *p;
            last = --s->refs == 0;
            if (last) {
                *p = s->next;
                free(s);
            }
            break;
        }
    pthread_mutex_unlock(&share_lock);
    return last;
}
