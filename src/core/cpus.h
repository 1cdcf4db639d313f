/* SPDX-License-Identifier: Apache-2.0
 *
 * cpus.h - whether busy threads outnumber this machine's CPUs: the one rule
 * by which waits stop spinning (the shm arena, point-to-point waits, stream
 * workers) and the shm ring runs one segment deep, since a thread that holds
 * a CPU then keeps the one it waits for from running.
 */
#ifndef LOOM_CPUS_H
#define LOOM_CPUS_H

#include <unistd.h>

/* 1 if threads busy threads outnumber the online CPUs; 0 where the count is unknown. */
static inline int loom_cpus_crowded(long threads)
{
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 && threads > cpus;
}

#endif
