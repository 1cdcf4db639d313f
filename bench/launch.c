/* SPDX-License-Identifier: Apache-2.0
 *
 * launch.c - how a benchmark process becomes a rank: from the environment of
 * the launcher that started it (loomrun, torchrun, Open MPI, a multi-task
 * Slurm step), or as a lone rank when nothing launched it. Shared by the
 * *_perf driver (common.c) and the programs with drivers of their own.
 */
#include "common.h"

#include <stdlib.h>

static int env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v;
}

int bench_launched(void)
{
    if (env_set("LOOM_RANK") || env_set("RANK") || env_set("OMPI_COMM_WORLD_RANK"))
        return 1;
    return env_set("SLURM_PROCID") && env_set("SLURM_NTASKS") && atoi(getenv("SLURM_NTASKS")) > 1;
}

loomResult_t bench_comm_create(loomComm_t *comm, const char **hint)
{
    *hint = NULL;
    if (bench_launched()) {
        *hint = "start ranks with loomrun -n N, which sets LOOM_RANK, LOOM_WORLD_SIZE and "
                "LOOM_COMM_ID; unset them to run a single rank";
        return loomCommInitFromEnv(comm);
    }
    loomUniqueId id;
    loomResult_t res = loomGetUniqueId(&id);
    return res != loomSuccess ? res : loomCommInitRank(comm, 1, id, 0);
}
