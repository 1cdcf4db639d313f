/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_probe.c - see shm_probe.h: C wrappers over shm_seg.h for the C++ tests.
 */
#include "shm_probe.h"

#include <fcntl.h>
#include <string.h>

#include "shm/shm_seg.h"

loomResult_t shm_probe_create(const char *dir, const char *name, int n_local)
{
    loom_seg_t seg;
    loomResult_t res = loom_seg_create(dir, name, n_local, LOOM_SHM_RING_MIN_BYTES, &seg);
    return res != loomSuccess ? res : loom_seg_unmap(&seg);
}

loomResult_t shm_probe_open(const char *dir, const char *name, int n_local, int *ready_p)
{
    loom_seg_t seg;
    memset(&seg, 0, sizeof(seg));
    loomResult_t res = loom_seg_open(dir, name, n_local, &seg, ready_p);
    if (res == loomSuccess && *ready_p)
        res = loom_seg_unmap(&seg);
    return res;
}

int shm_probe_file_open(const char *dir, const char *name)
{
    return loom_seg_file_open(dir, name, O_RDWR);
}
