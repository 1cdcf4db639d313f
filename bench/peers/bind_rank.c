/* SPDX-License-Identifier: Apache-2.0
 *
 * bind_rank.c - pins a launched rank to one CPU the way loomrun does, then
 * runs the program: rank r goes to the (r mod C)-th of the C CPUs this process
 * may use. The rank comes from the launcher's environment (Open MPI, MPICH's
 * Hydra, loomrun, torchrun). It exists so that bench/compare binds every
 * implementation alike: MPI is started with --bind-to none and this wrapper.
 * It does not pick ranks or start processes itself.
 * Usage: bind_rank [-v] PROGRAM [ARGS...]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#endif
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* In the order they are looked up: the first one set wins. */
static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                        "LOOM_RANK", "RANK"};

static int env_rank(const char **name_p)
{
    for (size_t i = 0; i < sizeof(rank_vars) / sizeof(rank_vars[0]); i++) {
        const char *v = getenv(rank_vars[i]);
        char *end;
        if (!v || !*v)
            continue;
        long r = strtol(v, &end, 10);
        if (*end || r < 0 || r > 1000000) {
            fprintf(stderr, "bind_rank: %s='%s' is not a rank\n", rank_vars[i], v);
            exit(2);
        }
        *name_p = rank_vars[i];
        return (int)r;
    }
    fprintf(stderr, "bind_rank: no rank in the environment (OMPI_COMM_WORLD_RANK, PMI_RANK, "
                    "PMIX_RANK, LOOM_RANK or RANK)\n"
                    "HINT: start it under mpirun, mpiexec or loomrun\n");
    exit(2);
}

/* The (r mod C)-th CPU of this process's affinity mask, as loomrun deals them. */
static int pick_cpu(int rank)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set)) {
        fprintf(stderr, "bind_rank: sched_getaffinity: %s\n", strerror(errno));
        exit(1);
    }
    int ncpus = CPU_COUNT(&set);
    if (ncpus == 0) {
        fprintf(stderr, "bind_rank: empty affinity mask\n");
        exit(1);
    }
    int want = rank % ncpus;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &set) && want-- == 0)
            return cpu;
    return -1; /* unreachable: the mask has ncpus bits set */
}

int main(int argc, char **argv)
{
    int verbose = argc > 1 && !strcmp(argv[1], "-v");
    char **prog = argv + 1 + verbose;
    if (!*prog) {
        fprintf(stderr, "usage: bind_rank [-v] PROGRAM [ARGS...]\n");
        return 2;
    }
    const char *var = NULL;
    int rank = env_rank(&var);
    int cpu = pick_cpu(rank);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one)) {
        fprintf(stderr, "bind_rank: rank %d: cannot bind to cpu %d: %s\n", rank, cpu,
                strerror(errno));
        return 1;
    }
    if (verbose)
        fprintf(stderr, "bind_rank: rank %d (%s) on cpu %d\n", rank, var, cpu);
    execvp(prog[0], prog);
    fprintf(stderr, "bind_rank: cannot run %s: %s\n", prog[0], strerror(errno));
    return 127;
}
