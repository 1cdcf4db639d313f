/* SPDX-License-Identifier: Apache-2.0
 *
 * nccl_homes.h - where a real libnccl.so.2 is looked for when LOOM_NCCL_LIBRARY does not say:
 * beside NCCL_HOME, the CUDA toolkit (CUDA_HOME, CUDA_PATH, /usr/local/cuda) and the system
 * library directories, in that order. One list for the drop-in NCCL library (shim_real.c) and
 * the nccl device transport (devtp_nccl.c), so both find the same library.
 */
#ifndef LOOM_NCCL_HOMES_H
#define LOOM_NCCL_HOMES_H

#include <stdio.h>
#include <stdlib.h>

/* Writes the i-th candidate path into path: 1 if there is one, 0 if the i-th home is unset
 * (skip it), -1 past the end of the list. */
static inline int loom_nccl_home(size_t i, char *path, size_t len)
{
    const char *homes[][2] = {
        {getenv("NCCL_HOME"), "/lib"},
        {getenv("CUDA_HOME"), "/lib64"},
        {getenv("CUDA_HOME"), "/lib"},
        {getenv("CUDA_PATH"), "/lib64"},
        {getenv("CUDA_PATH"), "/lib"},
        {"/usr/local/cuda", "/lib64"},
        {"/usr/local/cuda", "/lib"},
#if defined(__x86_64__)
        {"/usr/lib", "/x86_64-linux-gnu"},
#elif defined(__aarch64__)
        {"/usr/lib", "/aarch64-linux-gnu"},
#endif
        {"/usr", "/lib64"},
        {"/usr", "/lib"},
    };
    if (i >= sizeof(homes) / sizeof(homes[0]))
        return -1;
    if (homes[i][0] == NULL || homes[i][0][0] == '\0')
        return 0;
    snprintf(path, len, "%s%s/libnccl.so.2", homes[i][0], homes[i][1]);
    return 1;
}

#endif
