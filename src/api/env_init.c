/* SPDX-License-Identifier: Apache-2.0
 *
 * env_init.c - loomCommInitFromEnv: the world communicator from a launcher's
 * environment. This is the one place that reads launcher variables (rank,
 * size, local rank, rendezvous address); tunables go through param.c.
 * Conventions, first match wins: loom (loomrun), torchrun, Slurm, Open MPI.
 * The rendezvous address is LOOM_COMM_ID, else MASTER_ADDR:MASTER_PORT;
 * rank 0 serves it. The job secret is LOOM_SECRET, else the content of
 * LOOM_SECRET_FILE; without either a secret is derived from the address and
 * size, which only keeps unrelated jobs apart (rank 0 WARNs it).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "check.h"
#include "init.h"
#include "param.h"

typedef struct {
    const char *name;
    const char *rank_var;
    const char *size_var;
    const char *local_var;
} convention_t;

static const convention_t conventions[] = {
    {"loom", "LOOM_RANK", "LOOM_WORLD_SIZE", "LOOM_LOCAL_RANK"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"open mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
};

static loomResult_t parse_int(const char *var, int min, int max, int *out_p)
{
    const char *s = getenv(var);
    char *end = NULL;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (s == NULL || *s == '\0' || errno != 0 || *end != '\0' || v < min || v > max) {
        LOOM_WARN("loomCommInitFromEnv: %s='%s' is not an integer in [%d, %d]", var, s ? s : "",
                  min, max);
        return loomInvalidArgument;
    }
    *out_p = (int)v;
    return loomSuccess;
}

/* LOOM_SECRET wins over LOOM_SECRET_FILE: it is the more specific of the
 * two (loomrun sets a fresh one per job, while a file is typically kept for
 * all of a user's jobs). */
static loomResult_t env_secret(const char *addr, int nranks, int rank,
                               uint8_t secret[LOOM_SECRET_BYTES])
{
    const char *hex = loom_param_SECRET(), *file = loom_param_SECRET_FILE();
    char why[160];
    if (hex && *hex) {
        if (loom_secret_parse_hex(hex, secret, why, sizeof(why)) != loomSuccess) {
            /* The value itself is never logged: it is the job's secret. */
            LOOM_WARN("loomCommInitFromEnv: LOOM_SECRET %s", why);
            return loomInvalidArgument;
        }
        if (file && *file)
            LOOM_INFO(LOOM_LOG_INIT, "LOOM_SECRET is set: LOOM_SECRET_FILE %s is not read", file);
        return loomSuccess;
    }
    if (file && *file) {
        loomResult_t res = loom_secret_read_file(file, secret, why, sizeof(why));
        if (res != loomSuccess) {
            LOOM_WARN("loomCommInitFromEnv: rank %d: LOOM_SECRET_FILE %s %s", rank, file, why);
            return res;
        }
        LOOM_INFO(LOOM_LOG_INIT, "job secret read from LOOM_SECRET_FILE %s", file);
        return loomSuccess;
    }
    char text[320];
    snprintf(text, sizeof(text), "loom-env-secret:%s:%d", addr, nranks);
    static const uint8_t k1[16] = {1}, k2[16] = {2};
    uint64_t a = loom_siphash24(k1, text, strlen(text)), b = loom_siphash24(k2, text, strlen(text));
    memcpy(secret, &a, 8);
    memcpy(secret + 8, &b, 8);
    /* WARNed by rank 0 alone, once per process: one line per job, from the
     * rank whose rendezvous port the derived secret fails to protect; the
     * other ranks (and later inits) say it at INFO. */
    static atomic_int warned;
#define DERIVED_MSG                                                                                \
    "LOOM_SECRET and LOOM_SECRET_FILE are unset: the job secret is derived from the rendezvous "   \
    "address %s and the job size, which anyone who can reach that port can compute; set "          \
    "LOOM_SECRET or LOOM_SECRET_FILE to keep others out of the job (docs/security.md)"
    if (rank == 0 && !atomic_exchange(&warned, 1))
        LOOM_WARN(DERIVED_MSG, addr);
    else
        LOOM_INFO(LOOM_LOG_INIT, DERIVED_MSG, addr);
#undef DERIVED_MSG
    return loomSuccess;
}

static loomResult_t env_address(const convention_t *c, char *buf, size_t len)
{
    const char *id = loom_param_COMM_ID();
    int n;
    if (id && *id) {
        n = snprintf(buf, len, "%s", id);
        if (n < 0 || (size_t)n >= len) {
            LOOM_WARN("loomCommInitFromEnv: LOOM_COMM_ID is %zu characters long, more than the "
                      "%zu a host:port may have",
                      strlen(id), len - 1);
            return loomInvalidArgument;
        }
        return loomSuccess;
    }
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    if (addr && *addr && port && *port) {
        if (strchr(addr, ':') && addr[0] != '[')
            n = snprintf(buf, len, "[%s]:%s", addr, port);
        else
            n = snprintf(buf, len, "%s:%s", addr, port);
        if (n < 0 || (size_t)n >= len) {
            LOOM_WARN("loomCommInitFromEnv: MASTER_ADDR and MASTER_PORT make an address of more "
                      "than %zu characters",
                      len - 1);
            return loomInvalidArgument;
        }
        return loomSuccess;
    }
    LOOM_WARN("loomCommInitFromEnv: %s variables found but no rendezvous address: set "
              "LOOM_COMM_ID=host:port or MASTER_ADDR and MASTER_PORT",
              c->name);
    return loomInvalidArgument;
}

LOOM_API loomResult_t loomCommInitFromEnv(loomComm_t *comm)
{
    if (comm == NULL) {
        LOOM_WARN("loomCommInitFromEnv: comm pointer is NULL");
        return loomInvalidArgument;
    }
    const convention_t *c = NULL;
    for (size_t i = 0; i < sizeof(conventions) / sizeof(conventions[0]) && !c; i++)
        if (getenv(conventions[i].rank_var) && getenv(conventions[i].size_var))
            c = &conventions[i];
    if (c == NULL) {
        LOOM_WARN("loomCommInitFromEnv: no launcher variables found (tried LOOM_RANK/"
                  "LOOM_WORLD_SIZE, RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, "
                  "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)");
        return loomInvalidArgument;
    }
    int nranks, rank, local = -1;
    LOOM_CHECK(parse_int(c->size_var, 1, LOOM_BOOTSTRAP_MAX_RANKS, &nranks));
    LOOM_CHECK(parse_int(c->rank_var, 0, 0x7fffffff, &rank));
    if (rank >= nranks) {
        LOOM_WARN("loomCommInitFromEnv: %s=%d is not below %s=%d", c->rank_var, rank, c->size_var,
                  nranks);
        return loomInvalidArgument;
    }
    if (getenv(c->local_var))
        LOOM_CHECK(parse_int(c->local_var, 0, nranks - 1, &local));
    char addr[256];
    LOOM_CHECK(env_address(c, addr, sizeof(addr)));
    loom_id_t id;
    memset(&id, 0, sizeof(id));
    id.magic = LOOM_ID_MAGIC;
    id.version = LOOM_ID_VERSION;
    LOOM_CHECK(loom_sockaddr_parse(addr, &id.root));
    LOOM_CHECK(env_secret(addr, nranks, rank, id.secret));
    LOOM_INFO(LOOM_LOG_INIT,
              "loomCommInitFromEnv: %s convention, rank %d of %d, local rank %d, "
              "rendezvous %s",
              c->name, rank, nranks, local, addr);
    if (rank == 0) {
        loom_sockaddr_t bind_addr = id.root;
        int fd = -1;
        loomResult_t res = loom_socket_listen(&bind_addr, &fd);
        if (res != loomSuccess) {
            LOOM_WARN("loomCommInitFromEnv: rank 0 cannot serve the rendezvous at %s (is the port "
                      "in use or the address not local?)",
                      addr);
            return res;
        }
        LOOM_CHECK(loom_bootstrap_root_start(fd, id.secret, loom_param_TIMEOUT_MS()));
    }
    return loom_comm_create(comm, nranks, &id, rank, NULL, 1);
}
