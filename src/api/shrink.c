/* SPDX-License-Identifier: Apache-2.0
 *
 * shrink.c - loomCommShrink: a communicator of the ranks that survive, built without the
 * excluded ranks and without the parent's connections (which a failure has broken). Every
 * rank opened a listener when the parent was created and told the others where (init.c); the
 * survivors meet at the lowest survivor's, which serves the rendezvous of a fresh creation
 * there. Its secret derives from the parent's job secret, the number of this shrink and the set
 * of survivors, so that ranks that disagree on the set, or on which shrink this is, cannot join
 * one another, and nobody outside the job can join at all.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "comm.h"
#include "init.h"
#include "timer.h"

/* How long a liveness probe may take to be answered. A process that is gone refuses at once
 * (its kernel resets the connection); one that does not answer in this time is counted alive,
 * and a shrink that waits for it then fails by its timeout. */
#define PROBE_MS 2000

/* Marks dead[r] for each rank whose listener refuses a connection: its process is gone. All
 * probes run at once, bounded by PROBE_MS. */
static loomResult_t find_dead(struct loomComm *c, uint8_t *dead)
{
    const int n = c->nranks;
    int *fds = malloc((size_t)n * sizeof(int));
    struct pollfd *pfd = malloc((size_t)n * sizeof(*pfd));
    if (fds == NULL || pfd == NULL) {
        free(fds);
        free(pfd);
        LOOM_WARN("loomCommShrink: out of memory for %d ranks", n);
        return loomSystemError;
    }
    int pending = 0;
    for (int r = 0; r < n; r++) {
        fds[r] = -1;
        if (r == c->rank || dead[r])
            continue;
        if (loom_socket_connect_start(&c->shrink_addrs[r], &fds[r]) != loomSuccess) {
            fds[r] = -1; /* could not even try: counted alive, as an unanswered probe */
            continue;
        }
        pending++;
    }
    const uint64_t deadline = loom_deadline_ms(PROBE_MS);
    while (pending > 0 && loom_now_ns() < deadline) {
        int np = 0;
        for (int r = 0; r < n; r++)
            if (fds[r] >= 0)
                pfd[np++] = (struct pollfd){.fd = fds[r], .events = POLLOUT};
        int rc = poll(pfd, (nfds_t)np, 10);
        if (rc < 0 && errno != EINTR)
            break;
        for (int r = 0; r < n; r++) {
            if (fds[r] < 0)
                continue;
            int done = 0, err = 0;
            if (loom_socket_connect_poll(fds[r], &done, &err) != loomSuccess)
                dead[r] = err == ECONNREFUSED || err == ECONNRESET || err == EHOSTUNREACH ||
                          err == ENETUNREACH;
            else if (!done)
                continue;
            close(fds[r]);
            fds[r] = -1;
            pending--;
        }
    }
    for (int r = 0; r < n; r++)
        if (fds[r] >= 0) {
            LOOM_INFO(LOOM_LOG_INIT,
                      "loomCommShrink: rank %d did not answer a liveness probe "
                      "in %d ms: counted alive",
                      r, PROBE_MS);
            close(fds[r]);
        }
    free(fds);
    free(pfd);
    return loomSuccess;
}

/* The rendezvous secret of shrink number `epoch` of c to the survivors in keep[]. */
static void derive_secret(const struct loomComm *c, uint32_t epoch, const uint8_t *keep,
                          uint8_t out[LOOM_SECRET_BYTES])
{
    const size_t n = (size_t)c->nranks, len = 16 + 8 + (n + 7) / 8;
    uint8_t *msg = calloc(len, 1);
    if (msg == NULL) { /* a secret nobody else derives: the shrink fails, never joins wrongly */
        (void)loom_random_bytes(out, LOOM_SECRET_BYTES);
        return;
    }
    memcpy(msg, "loom shrink v1", 14);
    for (int i = 0; i < 4; i++) {
        msg[16 + i] = (uint8_t)(epoch >> (8 * i));
        msg[20 + i] = (uint8_t)(n >> (8 * i));
    }
    for (size_t r = 0; r < n; r++)
        if (keep[r])
            msg[24 + r / 8] |= (uint8_t)(1u << (r % 8));
    for (int half = 0; half < 2; half++) {
        msg[15] = (uint8_t)half;
        uint64_t h = loom_siphash24(c->secret, msg, len);
        for (int i = 0; i < 8; i++)
            out[8 * half + i] = (uint8_t)(h >> (8 * i));
    }
    loom_secret_wipe(msg, len);
    free(msg);
}

/* The excluded set from the caller's list: InvalidArgument for a rank out of range, listed
 * twice, or this rank itself. */
static loomResult_t read_excluded(const struct loomComm *c, const int *excl, int nexcl,
                                  uint8_t *gone)
{
    for (int i = 0; i < nexcl; i++) {
        int r = excl[i];
        if (r < 0 || r >= c->nranks) {
            LOOM_WARN("loomCommShrink: excluded rank %d is out of range [0, %d)", r, c->nranks);
            return loomInvalidArgument;
        }
        if (gone[r]) {
            LOOM_WARN("loomCommShrink: rank %d is listed twice", r);
            return loomInvalidArgument;
        }
        if (r == c->rank) {
            LOOM_WARN("loomCommShrink: rank %d is in its own exclude list: an excluded rank does "
                      "not call loomCommShrink",
                      r);
            return loomInvalidArgument;
        }
        gone[r] = 1;
    }
    return loomSuccess;
}

static loomResult_t check_args(const int *excl, int nexcl, loomComm_t *newcomm, int flags)
{
    if (newcomm == NULL) {
        LOOM_WARN("loomCommShrink: newcomm is NULL");
        return loomInvalidArgument;
    }
    if (flags != LOOM_SHRINK_DEFAULT && flags != LOOM_SHRINK_PLANNED) {
        LOOM_WARN("loomCommShrink: flags %d: LOOM_SHRINK_DEFAULT (0) or LOOM_SHRINK_PLANNED (1)",
                  flags);
        return loomInvalidArgument;
    }
    if (nexcl < 0 || (nexcl > 0 && excl == NULL)) {
        LOOM_WARN("loomCommShrink: %d excluded ranks in %s", nexcl, excl ? "a list" : "no list");
        return loomInvalidArgument;
    }
    if (flags == LOOM_SHRINK_PLANNED && nexcl == 0) {
        LOOM_WARN("loomCommShrink: a planned shrink (LOOM_SHRINK_PLANNED) names the ranks it "
                  "removes");
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* Writes "0, 3, 5" (at most len bytes) of the ranks with gone[r] set. */
static void list_ranks(const uint8_t *gone, int n, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int r = 0; r < n && at + 16 < len; r++)
        if (gone[r])
            at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? ", " : "", r);
    if (at == 0)
        snprintf(buf, len, "none");
}

static loomResult_t shrink(struct loomComm *c, const int *excl, int nexcl, loomComm_t *newcomm,
                           loomConfig_t *config, int flags)
{
    LOOM_CHECK(check_args(excl, nexcl, newcomm, flags));
    *newcomm = NULL;
    const int n = c->nranks;
    uint8_t *gone = calloc((size_t)n, 2);
    if (gone == NULL) {
        LOOM_WARN("loomCommShrink: out of memory for %d ranks", n);
        return loomSystemError;
    }
    uint8_t *keep = gone + n;
    loomResult_t res = read_excluded(c, excl, nexcl, gone);
    if (res != loomSuccess)
        goto out;
    if (flags == LOOM_SHRINK_DEFAULT)
        loom_comm_revoke(c);
    if (nexcl == 0)
        LOOM_CHECK_GOTO(find_dead(c, gone), res, out);
    int members = 0, newrank = -1, leader = -1;
    for (int r = 0; r < n; r++) {
        keep[r] = !gone[r];
        if (!keep[r])
            continue;
        if (leader < 0)
            leader = r;
        if (r == c->rank)
            newrank = members;
        members++;
    }
    loom_id_t id = {.magic = LOOM_ID_MAGIC, .version = LOOM_ID_VERSION};
    id.root = c->shrink_addrs[leader];
    derive_secret(c, c->shrinks++, keep, id.secret);
    char list[256];
    list_ranks(gone, n, list, sizeof(list));
    LOOM_INFO(LOOM_LOG_INIT,
              "comm %s rank %d: shrink to %d of %d ranks (excluded: %s%s) as rank "
              "%d, rendezvous at rank %d",
              c->name, c->rank, members, n, list, nexcl == 0 ? ", found dead" : "", newrank,
              leader);
    if (leader == c->rank) {
        int fd = fcntl(c->shrink_fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
            LOOM_WARN("loomCommShrink: duplicating the rendezvous listener: %s", strerror(errno));
            res = loomSystemError;
            goto wipe;
        }
        LOOM_CHECK_GOTO(loom_bootstrap_root_start_shrink(fd, id.secret, c->timeout_ms, 1), res,
                        wipe);
    }
    loomConfig_t inherited = LOOM_CONFIG_INITIALIZER;
    inherited.timeout_ms = (int)c->timeout_ms;
    inherited.net = c->net;
    loomUniqueId uid;
    loom_id_encode(&id, &uid);
    res = loom_comm_init_checked(newcomm, members, uid, newrank, config ? config : &inherited, 0);
    loom_secret_wipe(&uid, sizeof(uid));
    if (res != loomSuccess) {
        *newcomm = NULL;
        loom_set_last_error("rank %d: loomCommShrink of communicator %s to %d ranks (excluded: "
                            "%s) failed: %s; every survivor must pass the same excluded ranks "
                            "and make as many shrinks of the communicator",
                            c->rank, c->name, members, list, loomGetErrorString(res));
    }
wipe:
    loom_secret_wipe(&id, sizeof(id));
out:
    free(gone);
    return res;
}

LOOM_API loomResult_t loomCommShrink(loomComm_t comm, const int *excludeRanks, int nExclude,
                                     loomComm_t *newcomm, loomConfig_t *config, int flags)
{
    LOOM_WITH_COMM(comm, "loomCommShrink",
                   shrink(comm, excludeRanks, nExclude, newcomm, config, flags));
}
