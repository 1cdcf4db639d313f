/* SPDX-License-Identifier: Apache-2.0
 *
 * shm.c - the shared-memory transport (loom_tp_shm) between ranks of one
 * host: wire.c frames over the byte rings of one segment per host
 * (shm_seg.c), with futex doorbells for sleeping in wait().
 * It reaches only ranks with the same host_hash and has no progress thread:
 * data moves inside test(). It does not detect a killed peer (the peer's
 * ring simply stops moving; p2p.c's liveness checks and timeouts cover it),
 * but a peer that closes its ends is seen at once, and no segment name
 * outlives a failure (see below). Called through its table by p2p.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "debug.h"
#include "param.h"
#include "secret.h"
#include "shm_seg.h"
#include "timer.h"
#include "transport.h"
#include "wire.h"

/* Finding the segment without a rendezvous.
 * The local leader (lowest rank with this host_hash) creates the host's one
 * segment at its first connect() or accept(), that is after the handles were
 * exchanged: by then every local rank has run init() and knows the name,
 * which is what lets any of them remove it. The name is not random but
 * derived, so that every local rank can compute it from what the bootstrap
 * already gave everyone:
 *   /loom-<leader pid>-<16 hex digits of SipHash(job secret, "loom-shm" ||
 *        nranks || leader rank || host_hash || pid of every local rank)>
 * Knowing the name needs the secret; the pids make two communicators that
 * share a secret (but not all processes) differ. Non-leaders open the name
 * in connect()/accept(), retrying ENOENT and half-initialised segments until
 * the timeout (the leader may be slower); every handle carries the name too,
 * only to catch ranks that disagree. Each rank bumps `mapped` after mapping
 * and the one completing the count unlinks the name. If the count never
 * completes (a rank died or failed during creation, the leader included),
 * every rank that derived the name unlinks it at finalize (ENOENT ignored):
 * the survivors' error paths all finalize, so a SIGKILL of any one rank at
 * any moment leaves nothing in the directory.
 *
 * Closing: a send connection sets writer_closed (the reader drains the ring,
 * then sees the end); a receive connection sets reader_closed to DONE on a
 * normal destroy and to FAILED when the communicator broke or was aborted
 * (the abort word of the init args is set then), see shm_seg.h.
 *
 * Connections: connect(peer) attaches to ring (me -> peer), sets its
 * `connected` flag and rings the peer's doorbell; the peer's accept() finds
 * the flag and returns a receive connection for that ring. A ring serves
 * one connection in the life of a context.
 *
 * wait(): sleep on this rank's doorbell as shm_seg.c describes, after
 * re-checking every ring with pending work (and unaccepted rings). */

#define SHM_HANDLE_MAGIC 0x4d48534cu /* "LSHM" */

typedef struct {
    uint32_t magic;
    int32_t leader; /* global rank of the local leader */
    int32_t n_local;
    int32_t is_leader;
    char name[LOOM_SHM_NAME_MAX];
} shm_handle_t;

_Static_assert(sizeof(shm_handle_t) <= LOOM_TP_HANDLE_MAX, "shm handle too large");

typedef struct shm_comm {
    struct shm_ctx *ctx;
    int peer;  /* global rank */
    int local; /* its local index */
    int is_send;
    loom_seg_ring_t ring;
    loom_wire_t stream;
} shm_comm_t;

typedef struct shm_ctx {
    int rank;
    int nranks;
    int n_local;
    int local_rank;
    int leader;    /* global rank of the local leader */
    int *local_of; /* [nranks] local index, -1 on other hosts */
    int64_t timeout_ms;
    volatile const int *abort_flag;
    volatile const int *quiet_flag;
    const loom_tp_stamp_ops_t *stamp_ops; /* the init args': every stream stamps with them */
    char name[LOOM_SHM_NAME_MAX];
    char dir[256];
    uint64_t ring_bytes;
    loom_seg_t seg;
    int mapped;
    uint64_t map_deadline_ns; /* 0 until the first attempt to map */
    int listening;
    int accepting;      /* accept() ran since the last wait() */
    shm_comm_t **send;  /* [n_local] open send connections */
    shm_comm_t **recv;  /* [n_local] open receive connections */
    uint8_t *ring_used; /* [n_local] (me -> j) connected */
    uint8_t *accepted;  /* [n_local] (j -> me) accepted */
} shm_ctx_t;

static int aborted(const shm_ctx_t *ctx)
{
    return ctx->abort_flag != NULL && __atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE) != 0;
}

// ---- byte channel for wire.c ---------------------------------------------

static loomResult_t shm_writev(void *chan, const struct iovec *iov, int iovcnt, size_t *nbytes_p,
                               int *gone_errno_p)
{
    return loom_seg_ring_write(&((shm_comm_t *)chan)->ring, iov, iovcnt, nbytes_p, gone_errno_p);
}

static loomResult_t shm_readv(void *chan, const struct iovec *iov, int iovcnt, size_t *nbytes_p,
                              int *gone_errno_p)
{
    return loom_seg_ring_read(&((shm_comm_t *)chan)->ring, iov, iovcnt, nbytes_p, gone_errno_p);
}

static const loom_wire_io_t shm_io = {.writev = shm_writev, .readv = shm_readv};

// ---- init -------------------------------------------------------------------

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static loomResult_t derive_name(shm_ctx_t *ctx, const loom_tp_init_args_t *args)
{
    size_t len = 8 + 3 * 8 + (size_t)ctx->n_local * 8;
    uint8_t *msg = malloc(len);
    if (msg == NULL) {
        LOOM_WARN("shm: out of memory (%zu bytes)", len);
        return loomSystemError;
    }
    memcpy(msg, "loom-shm", 8);
    put_le64(msg + 8, (uint64_t)ctx->nranks);
    put_le64(msg + 16, (uint64_t)ctx->leader);
    put_le64(msg + 24, args->peers[ctx->rank].host_hash);
    size_t off = 32;
    for (int r = 0; r < ctx->nranks; r++) {
        if (ctx->local_of[r] >= 0) {
            put_le64(msg + off, (uint64_t)(uint32_t)args->peers[r].pid);
            off += 8;
        }
    }
    uint64_t h = loom_siphash24(args->secret, msg, len);
    free(msg);
    snprintf(ctx->name, sizeof(ctx->name), "/loom-%d-%016llx", (int)args->peers[ctx->leader].pid,
             (unsigned long long)h);
    return loomSuccess;
}

static loomResult_t shm_finalize(void *ctx_v);

static loomResult_t shm_init(const loom_tp_init_args_t *args, void **ctx_p)
{
    loomResult_t res = loomSystemError;
    shm_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        LOOM_WARN("shm: out of memory for the context (%zu bytes)", sizeof(*ctx));
        return loomSystemError;
    }
    ctx->rank = args->rank;
    ctx->nranks = args->nranks;
    ctx->timeout_ms = args->timeout_ms;
    ctx->abort_flag = args->abort_flag;
    ctx->quiet_flag = args->quiet_flag;
    ctx->stamp_ops = args->stamp_ops;
    ctx->leader = -1;
    ctx->local_of = malloc((size_t)args->nranks * sizeof(int));
    if (ctx->local_of == NULL) {
        LOOM_WARN("shm: out of memory for the rank table of %d ranks", args->nranks);
        goto err_free;
    }
    uint64_t host = args->peers[args->rank].host_hash;
    for (int r = 0; r < args->nranks; r++) {
        ctx->local_of[r] = args->peers[r].host_hash == host ? ctx->n_local++ : -1;
        if (ctx->local_of[r] == 0)
            ctx->leader = r;
    }
    ctx->local_rank = ctx->local_of[args->rank];
    size_t n = (size_t)ctx->n_local;
    ctx->send = calloc(n, sizeof(*ctx->send));
    ctx->recv = calloc(n, sizeof(*ctx->recv));
    ctx->ring_used = calloc(n, 1);
    ctx->accepted = calloc(n, 1);
    if (ctx->send == NULL || ctx->recv == NULL || ctx->ring_used == NULL || ctx->accepted == NULL) {
        LOOM_WARN("shm: out of memory for the tables of %d local ranks", ctx->n_local);
        goto err_free;
    }
    snprintf(ctx->dir, sizeof(ctx->dir), "%s", loom_param_SHM_DIR());
    ctx->ring_bytes = loom_seg_ring_bytes(ctx->n_local, loom_param_SHM_RING_BYTES());
    LOOM_CHECK_GOTO(derive_name(ctx, args), res, err_free);
    *ctx_p = ctx;
    return loomSuccess;
err_free:
    shm_finalize(ctx);
    return res;
}

static loomResult_t shm_can_connect(void *ctx, const loom_peer_info_t *self,
                                    const loom_peer_info_t *peer, int *ok_p)
{
    (void)ctx;
    *ok_p = peer->host_hash == self->host_hash;
    return loomSuccess;
}

// ---- the segment --------------------------------------------------------------

/* Creates (leader) or maps (others) the segment if not yet done. *ready_p = 0:
 * the leader has not created it yet. */
static loomResult_t ensure_mapped(shm_ctx_t *ctx, int *ready_p)
{
    if (ctx->mapped) {
        *ready_p = 1;
        return loomSuccess;
    }
    if (ctx->n_local < 2) {
        LOOM_WARN("shm: rank %d has no other rank on its host", ctx->rank);
        return loomInvalidUsage;
    }
    if (ctx->rank == ctx->leader) {
        LOOM_CHECK(loom_seg_create(ctx->dir, ctx->name, ctx->n_local, ctx->ring_bytes, &ctx->seg));
        ctx->mapped = 1;
        *ready_p = 1;
        return loomSuccess;
    }
    uint64_t now = loom_now_ns();
    if (ctx->map_deadline_ns == 0)
        ctx->map_deadline_ns = now + (uint64_t)ctx->timeout_ms * 1000000ull;
    int ready = 0;
    LOOM_CHECK(loom_seg_open(ctx->dir, ctx->name, ctx->n_local, &ctx->seg, &ready));
    if (!ready) {
        if (now >= ctx->map_deadline_ns) {
            LOOM_WARN("shm: rank %d: segment %s of local leader rank %d did not appear in %s "
                      "within %lld ms",
                      ctx->rank, ctx->name, ctx->leader, ctx->dir, (long long)ctx->timeout_ms);
            return loomTimeout;
        }
        *ready_p = 0;
        return loomSuccess;
    }
    ctx->mapped = 1;
    LOOM_INFO(LOOM_LOG_SHM, "shm: rank %d mapped segment %s (%llu-byte rings)", ctx->rank,
              ctx->name, (unsigned long long)ctx->seg.ring_bytes);
    *ready_p = 1;
    return loomSuccess;
}

static loomResult_t shm_listen(void *ctx_v, void *handle, void **listen_p)
{
    shm_ctx_t *ctx = ctx_v;
    if (ctx->listening) {
        LOOM_WARN("shm: rank %d called listen twice on one context", ctx->rank);
        return loomInvalidUsage;
    }
    shm_handle_t h;
    memset(&h, 0, sizeof(h));
    h.magic = SHM_HANDLE_MAGIC;
    h.leader = ctx->leader;
    h.n_local = ctx->n_local;
    h.is_leader = ctx->rank == ctx->leader;
    snprintf(h.name, sizeof(h.name), "%s", ctx->name);
    memset(handle, 0, LOOM_TP_HANDLE_MAX);
    memcpy(handle, &h, sizeof(h));
    ctx->listening = 1;
    *listen_p = ctx;
    return loomSuccess;
}

// ---- connections --------------------------------------------------------------

static loomResult_t comm_create(shm_ctx_t *ctx, int peer, int is_send, shm_comm_t **comm_p)
{
    shm_comm_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        LOOM_WARN("shm: out of memory for a connection to rank %d (%zu bytes)", peer, sizeof(*c));
        return loomSystemError;
    }
    int j = ctx->local_of[peer];
    c->ctx = ctx;
    c->peer = peer;
    c->local = j;
    c->is_send = is_send;
    if (is_send)
        loom_seg_ring_attach(&c->ring, &ctx->seg, ctx->local_rank, j, 1, ctx->rank, peer);
    else
        loom_seg_ring_attach(&c->ring, &ctx->seg, j, ctx->local_rank, 0, ctx->rank, peer);
    loom_wire_init(&c->stream, &shm_io, c, "shm", ctx->rank, peer, ctx->quiet_flag);
    loom_wire_set_stamp(&c->stream, ctx->stamp_ops);
    *comm_p = c;
    return loomSuccess;
}

static loomResult_t shm_connect(void *ctx_v, const void *handle, int peer, void **send_comm_p)
{
    shm_ctx_t *ctx = ctx_v;
    if (peer < 0 || peer >= ctx->nranks || ctx->local_of[peer] < 0 || peer == ctx->rank) {
        LOOM_WARN("shm: rank %d cannot connect to rank %d: not another rank of this host",
                  ctx->rank, peer);
        return loomInvalidArgument;
    }
    shm_handle_t h;
    memcpy(&h, handle, sizeof(h));
    h.name[sizeof(h.name) - 1] = '\0';
    if (h.magic != SHM_HANDLE_MAGIC || h.leader != ctx->leader || h.n_local != ctx->n_local ||
        strcmp(h.name, ctx->name) != 0) {
        LOOM_WARN("shm: rank %d and rank %d disagree on their host's segment: %s (leader rank %d, "
                  "%d local ranks) here, %.*s (leader rank %d, %d local ranks) there",
                  ctx->rank, peer, ctx->name, ctx->leader, ctx->n_local, LOOM_SHM_NAME_MAX,
                  h.magic == SHM_HANDLE_MAGIC ? h.name : "<bad handle>", (int)h.leader,
                  (int)h.n_local);
        return loomInvalidUsage;
    }
    int j = ctx->local_of[peer];
    if (ctx->ring_used[j]) {
        LOOM_WARN("shm: rank %d connected to rank %d twice in one context", ctx->rank, peer);
        return loomInvalidUsage;
    }
    if (aborted(ctx)) {
        LOOM_INFO(LOOM_LOG_SHM, "shm: rank %d: connect to rank %d aborted", ctx->rank, peer);
        return loomRemoteError;
    }
    int ready = 0;
    LOOM_CHECK(ensure_mapped(ctx, &ready));
    if (!ready) {
        *send_comm_p = NULL;
        return loomSuccess;
    }
    shm_comm_t *c;
    LOOM_CHECK(comm_create(ctx, peer, 1, &c));
    ctx->ring_used[j] = 1;
    ctx->send[j] = c;
    atomic_store_explicit(&c->ring.ctl->connected, 1, memory_order_release);
    loom_seg_bell_notify(c->ring.peer_bell);
    LOOM_INFO(LOOM_LOG_SHM, "shm: rank %d connected to rank %d", ctx->rank, peer);
    *send_comm_p = c;
    return loomSuccess;
}

static loomResult_t shm_accept(void *listen_v, void **recv_comm_p, int *peer_p)
{
    shm_ctx_t *ctx = listen_v;
    if (aborted(ctx)) {
        LOOM_INFO(LOOM_LOG_SHM, "shm: rank %d: accept aborted", ctx->rank);
        return loomRemoteError;
    }
    *recv_comm_p = NULL;
    ctx->accepting = 1;
    if (ctx->n_local < 2)
        return loomSuccess;
    int ready = 0;
    LOOM_CHECK(ensure_mapped(ctx, &ready));
    if (!ready)
        return loomSuccess;
    for (int r = 0; r < ctx->nranks; r++) {
        int j = ctx->local_of[r];
        if (j < 0 || r == ctx->rank || ctx->accepted[j])
            continue;
        loom_seg_ring_ctl_t *ctl = loom_seg_ctl(&ctx->seg, j, ctx->local_rank);
        if (!atomic_load_explicit(&ctl->connected, memory_order_acquire))
            continue;
        shm_comm_t *c;
        LOOM_CHECK(comm_create(ctx, r, 0, &c));
        ctx->accepted[j] = 1;
        ctx->recv[j] = c;
        LOOM_INFO(LOOM_LOG_SHM, "shm: rank %d accepted rank %d", ctx->rank, r);
        *recv_comm_p = c;
        *peer_p = r;
        return loomSuccess;
    }
    return loomSuccess;
}

// ---- data -------------------------------------------------------------------

static loomResult_t shm_isend(void *send_comm, const void *buf, size_t len, uint32_t tag,
                              void **req_p)
{
    shm_comm_t *c = send_comm;
    if (!c->is_send) {
        LOOM_WARN("shm: rank %d: isend on the receive connection from rank %d", c->ctx->rank,
                  c->peer);
        return loomInvalidUsage;
    }
    loom_wire_req_t *r;
    LOOM_CHECK(loom_wire_isend(&c->stream, buf, len, tag, &r));
    *req_p = r;
    return loomSuccess;
}

static loomResult_t shm_irecv(void *recv_comm, void *buf, size_t len, uint32_t tag, void **req_p)
{
    shm_comm_t *c = recv_comm;
    if (c->is_send) {
        LOOM_WARN("shm: rank %d: irecv on the send connection to rank %d", c->ctx->rank, c->peer);
        return loomInvalidUsage;
    }
    loom_wire_req_t *r;
    LOOM_CHECK(loom_wire_irecv(&c->stream, buf, len, tag, &r));
    *req_p = r;
    return loomSuccess;
}

static loomResult_t shm_test(void *req, int *done_p, size_t *nbytes_p)
{
    return loom_wire_test(req, done_p, nbytes_p);
}

/* 1 if something of ctx could move now (checked after sleep_begin). */
static int work_ready(const shm_ctx_t *ctx)
{
    for (int j = 0; j < ctx->n_local; j++) {
        const shm_comm_t *s = ctx->send[j], *r = ctx->recv[j];
        if (s != NULL && loom_wire_wants_write(&s->stream) && loom_seg_ring_can_write(&s->ring))
            return 1;
        if (r != NULL && loom_wire_wants_read(&r->stream) && loom_seg_ring_can_read(&r->ring))
            return 1;
        if (ctx->accepting && !ctx->accepted[j] && j != ctx->local_rank &&
            atomic_load_explicit(&loom_seg_ctl(&ctx->seg, j, ctx->local_rank)->connected,
                                 memory_order_acquire))
            return 1;
    }
    return 0;
}

static loomResult_t shm_wait(void *ctx_v, int timeout_us)
{
    shm_ctx_t *ctx = ctx_v;
    if (timeout_us <= 0)
        return loomSuccess;
    if (!ctx->mapped) {
        /* Nothing to sleep on before the segment exists: nap, bounded. */
        struct timespec ts = {.tv_sec = 0,
                              .tv_nsec = (timeout_us < 1000 ? timeout_us : 1000) * 1000L};
        nanosleep(&ts, NULL);
        return loomSuccess;
    }
    loom_seg_bell_t *bell = &ctx->seg.bells[ctx->local_rank];
    uint32_t seen = loom_seg_bell_sleep_begin(bell);
    loomResult_t res = loomSuccess;
    if (!work_ready(ctx))
        res = loom_seg_bell_sleep(bell, seen, timeout_us);
    loom_seg_bell_sleep_end(bell);
    /* An unaccepted ring nobody accepts would make every wait return at once. */
    ctx->accepting = 0;
    return res;
}

// ---- teardown ---------------------------------------------------------------

static loomResult_t shm_close_send(void *send_comm)
{
    shm_comm_t *c = send_comm;
    if (c == NULL)
        return loomSuccess;
    atomic_store_explicit(&c->ring.ctl->writer_closed, 1, memory_order_release);
    loom_seg_bell_notify(c->ring.peer_bell);
    c->ctx->send[c->local] = NULL;
    loom_wire_fini(&c->stream);
    free(c);
    return loomSuccess;
}

static loomResult_t shm_close_recv(void *recv_comm)
{
    shm_comm_t *c = recv_comm;
    if (c == NULL)
        return loomSuccess;
    atomic_store_explicit(&c->ring.ctl->reader_closed,
                          aborted(c->ctx) ? LOOM_SHM_READER_FAILED : LOOM_SHM_READER_DONE,
                          memory_order_release);
    loom_seg_bell_notify(c->ring.peer_bell);
    c->ctx->recv[c->local] = NULL;
    loom_wire_fini(&c->stream);
    free(c);
    return loomSuccess;
}

static loomResult_t shm_close_listen(void *listen_v)
{
    shm_ctx_t *ctx = listen_v;
    if (ctx != NULL)
        ctx->listening = 0;
    return loomSuccess;
}

static loomResult_t shm_finalize(void *ctx_v)
{
    shm_ctx_t *ctx = ctx_v;
    loomResult_t res = loomSuccess;
    if (ctx == NULL)
        return loomSuccess;
    for (int j = 0; ctx->send != NULL && ctx->recv != NULL && j < ctx->n_local; j++) {
        if (ctx->send[j] != NULL)
            LOOM_CHECK_IGNORE(shm_close_send(ctx->send[j]), res);
        if (ctx->recv[j] != NULL)
            LOOM_CHECK_IGNORE(shm_close_recv(ctx->recv[j]), res);
    }
    /* Covers a local rank (leader or not) that died or failed before the count
     * completed. name is set once init derived it. */
    if (ctx->name[0] != '\0' && ctx->n_local > 1 &&
        !(ctx->mapped && loom_seg_all_mapped(&ctx->seg)))
        LOOM_CHECK_IGNORE(loom_seg_unlink(ctx->dir, ctx->name), res);
    if (ctx->mapped)
        LOOM_CHECK_IGNORE(loom_seg_unmap(&ctx->seg), res);
    free(ctx->local_of);
    free(ctx->send);
    free(ctx->recv);
    free(ctx->ring_used);
    free(ctx->accepted);
    free(ctx);
    return res;
}

const loom_tp_t loom_tp_shm = {
    .abi_version = LOOM_TP_ABI_V1,
    .name = "shm",
    .init = shm_init,
    .finalize = shm_finalize,
    .can_connect = shm_can_connect,
    .listen = shm_listen,
    .connect = shm_connect,
    .accept = shm_accept,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .test = shm_test,
    .wait = shm_wait,
    .close_send = shm_close_send,
    .close_recv = shm_close_recv,
    .close_listen = shm_close_listen,
};
