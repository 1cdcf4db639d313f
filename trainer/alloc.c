/* SPDX-License-Identifier: Apache-2.0
 *
 * alloc.c - the trainer's one allocation that cannot fail quietly: every buffer of a run is
 * needed, so running out of memory ends the run with a message.
 */
#include "train.h"

#include <stdio.h>
#include <stdlib.h>

void *train_calloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p) {
        fprintf(stderr, "loom-train: out of memory (%zu x %zu bytes)\n", n, sz);
        exit(1);
    }
    return p;
}
