/* SPDX-License-Identifier: Apache-2.0
 *
 * ucx.c - the ucx transport (loom_tp_ucx): one UCP context and worker per
 * communicator, one UCP endpoint per peer (peer error handling), tagged
 * messages with ucp_tag_send_nbx/ucp_tag_recv_nbx. UCX chooses its own lanes
 * (shared memory, TCP, RDMA) from UCX_TLS and friends. Connection setup (the
 * TCP side channel that proves the job secret and carries worker addresses)
 * is ucx_conn.c. No progress thread: data moves in isend/irecv (what UCX does
 * at once) and test(); wait() sleeps on the worker's event descriptor.
 * It is used where LOOM_NET names it (LOOM_NET=ucx: every peer, same host
 * included; LOOM_NET=shm,ucx: ucx across hosts) and, with LOOM_NET unset,
 * between hosts whose RDMA ports the cost model prefers to tcp
 * (api/net_auto.c); p2p.c starts it only then. Built only with UCX
 * (LOOM_HAVE_UCX), and UCP itself is loaded only when init first runs
 * (ucx_api.c). Called through the table at the end of this file by p2p.c.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "debug.h"
#include "timer.h"
#include "ucx.h"
#include "ucx_api.h"

/* Matching: a message from rank s carrying loom tag t travels with the UCP tag
 * (s << 32) | t, and a receive from s for t posts exactly that tag with a full
 * mask. The worker belongs to one communicator, so the sender's rank names the
 * connection; UCP matches messages from one endpoint in the order they were
 * sent, and receives with equal tags in the order they were posted: loom's
 * in-order, per-tag contract. A message longer than the posted receive
 * completes it with UCS_ERR_MESSAGE_TRUNCATED (InvalidUsage here).
 *
 * Failures: endpoints use UCP_ERR_HANDLING_MODE_PEER, so a peer that dies or
 * closes makes UCP call ep_error() and fail the endpoint's sends. Receives are
 * worker-wide and not tied to the endpoint: they are still posted after the
 * endpoint failed (what the peer sent before it closed may wait in the
 * unexpected queue), and test() cancels a pending receive whose peer's
 * endpoint failed once progress matched nothing, and returns RemoteError.
 *
 * Teardown: closing a connection cancels its pending receives; the last of a
 * peer's two connections closes its endpoint, flushing (so a final notice
 * arrives) unless the endpoint failed, either connection still had sends
 * pending (UCP must not read a caller's buffer after close) or the layer
 * above gave up (aborted or broken): then forced, after a flush of at most
 * ABORT_FLUSH_NS where nothing of the caller's is pending, since a notice's
 * send completes when UCP has copied it, not when it left, and a forced close
 * drops what has not left. (Closing without force while the peer closes too
 * trips an assertion in UCX 1.13's tcp lanes.) finalize drives the flushes
 * together for at most CLOSE_FLUSH_MS (none when aborted). */

#define CLOSE_FLUSH_MS   1000        /* bound of finalize's wait for endpoint flushes */
#define ABORT_FLUSH_NS   10000000ull /* flush of one endpoint before a forced close (10 ms) */
#define PROGRESS_SPIN_US 1000        /* wait() progresses this long before it arms and sleeps */
#define SEND_POLL_US     50   /* wait()'s longest sleep while sends are in flight (see ucx_wait) */
#define IDLE_POLL_US     1000 /* wait()'s longest sleep otherwise */
#define UNEXPECTED_MAX   1024 /* unreceived messages finalize takes before destroying the worker */
#define PROGRESS_MAX     1000 /* progress calls finalize spends on one of them */

uint64_t loom_ucx_tag_of(int rank, uint32_t tag)
{
    return ((uint64_t)(uint32_t)rank << 32) | tag;
}

static int quiet(const ucx_ctx_t *ctx)
{
    return ctx->quiet_flag != NULL && *ctx->quiet_flag != 0;
}

// ---- requests -----------------------------------------------------------------

ucx_req_t *loom_ucx_req_get(ucx_ctx_t *ctx)
{
    ucx_req_t *r = ctx->free_reqs;
    if (r != NULL)
        ctx->free_reqs = r->next;
    else if ((r = malloc(sizeof(*r))) == NULL)
        LOOM_WARN("ucx: out of memory for a request (%zu bytes)", sizeof(*r));
    if (r != NULL)
        memset(r, 0, sizeof(*r));
    return r;
}

static void list_del(ucx_req_t **head, ucx_req_t *r);

void loom_ucx_req_put(ucx_ctx_t *ctx, ucx_req_t *r)
{
    if (r->done && r->comm != NULL)
        list_del(&r->comm->done, r); /* a completed one waits on its connection's done list */
    r->prev = NULL;
    r->next = ctx->free_reqs;
    ctx->free_reqs = r;
}

static void list_add(ucx_req_t **head, ucx_req_t *r)
{
    r->prev = NULL;
    r->next = *head;
    if (*head != NULL)
        (*head)->prev = r;
    *head = r;
}

static void list_del(ucx_req_t **head, ucx_req_t *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        *head = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

/* UCP is done with r's operation (from a callback, or at once). */
static void req_complete(ucx_ctx_t *ctx, ucx_req_t *r, ucs_status_t status, size_t nbytes)
{
    if (r->ucp != NULL) {
        loom_ucx.request_free(r->ucp);
        r->ucp = NULL;
    }
    if (r->counted) {
        r->counted = 0;
        ctx->nsends--;
    }
    if (r->comm == NULL) { /* orphaned: nobody will test it */
        r->done = 1;       /* for a poster still looking at it */
        list_del(&ctx->orphans, r);
        loom_ucx_req_put(ctx, r);
        return;
    }
    list_del(&r->comm->pending, r);
    list_add(&r->comm->done, r); /* a caller that closes without testing it frees it there */
    r->done = 1;
    r->status = status;
    r->nbytes = nbytes;
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_req_t *r = user_data;
    r->ucp = request;
    req_complete(r->ctx, r, status, r->len);
}

static void recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                    void *user_data)
{
    ucx_req_t *r = user_data;
    r->ucp = request;
    r->sender_tag = info != NULL ? info->sender_tag : 0;
    req_complete(r->ctx, r, status, info != NULL ? info->length : 0);
}

/* Detaches a pending request from its connection (closing, or failed): a
 * receive is cancelled (its callback may run at once); what UCP still holds
 * waits on ctx->orphans for its callback. */
void loom_ucx_req_orphan(ucx_ctx_t *ctx, ucx_req_t *r)
{
    list_del(&r->comm->pending, r);
    r->comm = NULL;
    list_add(&ctx->orphans, r);
    if (!r->is_send && r->ucp != NULL)
        loom_ucx.request_cancel(ctx->worker, r->ucp);
}

// ---- endpoints and connections -------------------------------------------------

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_peer_t *pr = arg;
    (void)ep;
    if (pr->failed)
        return;
    pr->failed = 1;
    pr->status = status;
    /* The requests that depend on it report the failure (test); this is the why. */
    LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d: endpoint to rank %d failed: %s", pr->ctx->rank, pr->rank,
              loom_ucx.status_string(status));
}

static loomResult_t comm_close(ucx_comm_t *c);

loomResult_t loom_ucx_comm_open(ucx_ctx_t *ctx, int peer, int is_send, const void *addr,
                                size_t addr_len, ucx_comm_t **comm_p)
{
    ucx_peer_t *pr = &ctx->peers[peer];
    (void)addr_len; /* UCP reads the length from the address itself; ucx_conn.c bounded it */
    if (pr->failed) {
        LOOM_WARN("ucx: rank %d: endpoint to rank %d already failed: %s", ctx->rank, peer,
                  loom_ucx.status_string(pr->status));
        return loomRemoteError;
    }
    ucx_comm_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        LOOM_WARN("ucx: out of memory for a connection to rank %d (%zu bytes)", peer, sizeof(*c));
        return loomSystemError;
    }
    if (pr->ep == NULL) {
        ucp_ep_params_t ep_params = {
            .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER,
            .address = addr,
            .err_mode = UCP_ERR_HANDLING_MODE_PEER,
            .err_handler = {.cb = ep_error, .arg = pr},
        };
        ucs_status_t st = ctx->no_peer_mode ? UCS_ERR_UNREACHABLE
                                            : loom_ucx.ep_create(ctx->worker, &ep_params, &pr->ep);
        if (st == UCS_ERR_UNREACHABLE) {
            /* UCX 1.13's shared-memory transports (UCX_TLS=sm or posix/sysv/cma alone)
             * cannot detect a peer's failure, so UCP finds no lane for the peer mode.
             * Such lanes only join processes of one machine, whose deaths p2p.c sees
             * through their pids: connect without UCP's error handling (and skip the
             * attempt, and UCX's ERROR line about it, for the next peers). */
            ep_params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
            ep_params.field_mask &= ~(uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER;
            st = loom_ucx.ep_create(ctx->worker, &ep_params, &pr->ep);
            if (st == UCS_OK && !ctx->no_peer_mode)
                LOOM_INFO(LOOM_LOG_UCX,
                          "ucx: rank %d: no UCX transport to rank %d detects peer failures; "
                          "endpoints have no error handling (same-host liveness checks only)",
                          ctx->rank, peer);
            ctx->no_peer_mode = st == UCS_OK;
        }
        if (st != UCS_OK) {
            LOOM_WARN("ucx: rank %d: cannot create an endpoint to rank %d: %s", ctx->rank, peer,
                      loom_ucx.status_string(st));
            pr->ep = NULL;
            free(c);
            return st == UCS_ERR_UNREACHABLE ? loomRemoteError : loomSystemError;
        }
    }
    c->ctx = ctx;
    c->peer = peer;
    c->is_send = is_send;
    pr->comms[is_send] = c;
    pr->refs++;
    if (!is_send && ctx->stamp_ops != NULL && loom_ucx_probe_open(c) != loomSuccess) {
        (void)comm_close(c);
        return loomSystemError;
    }
    *comm_p = c;
    return loomSuccess;
}

static void closing_add(ucx_ctx_t *ctx, void *req)
{
    if (ctx->nclosing == ctx->closing_cap) {
        int cap = ctx->closing_cap ? 2 * ctx->closing_cap : 16;
        void **p = realloc(ctx->closing, (size_t)cap * sizeof(*p));
        if (p == NULL) {
            /* Not tracked: the worker's destruction ends it. */
            LOOM_INFO(LOOM_LOG_UCX, "ucx: out of memory tracking %d endpoint closes", cap);
            loom_ucx.request_free(req);
            return;
        }
        ctx->closing = p;
        ctx->closing_cap = cap;
    }
    ctx->closing[ctx->nclosing++] = req;
}

/* Drives a flush of pr's endpoint for at most ABORT_FLUSH_NS: what was sent leaves. */
static void ep_flush(ucx_ctx_t *ctx, ucx_peer_t *pr)
{
    ucp_request_param_t param = {.op_attr_mask = 0};
    void *req = loom_ucx.ep_flush_nbx(pr->ep, &param);
    if (req == NULL || UCS_PTR_IS_ERR(req))
        return;
    const uint64_t deadline = loom_now_ns() + ABORT_FLUSH_NS;
    while (loom_ucx.request_check_status(req) == UCS_INPROGRESS && !pr->failed &&
           loom_now_ns() < deadline)
        loom_ucx.worker_progress(ctx->worker);
    loom_ucx.request_free(req); /* released when UCP is done with it */
}

static loomResult_t comm_close(ucx_comm_t *c)
{
    ucx_ctx_t *ctx = c->ctx;
    ucx_peer_t *pr = &ctx->peers[c->peer];
    int sends_pending = 0;
    loom_ucx_stamp_close(c);
    while (c->pending != NULL) {
        sends_pending |= c->pending->is_send;
        loom_ucx_req_orphan(ctx, c->pending);
    }
    while (c->done != NULL) /* completed, never tested: nobody will */
        loom_ucx_req_put(ctx, c->done);
    pr->comms[c->is_send] = NULL;
    free(c);
    if (--pr->refs > 0 || pr->ep == NULL)
        return loomSuccess;
    pr->sends_orphaned |= sends_pending; /* the other connection may close the endpoint */
    const int gave_up = ctx->abort_flag != NULL && *ctx->abort_flag != 0;
    if (gave_up && !pr->failed && !pr->sends_orphaned)
        ep_flush(ctx, pr);
    const int force = pr->failed || pr->sends_orphaned || gave_up;
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *req = loom_ucx.ep_close_nbx(pr->ep, &param);
    pr->ep = NULL;
    if (UCS_PTR_IS_ERR(req)) {
        /* The endpoint is released either way; a failed flush only matters to a peer
         * that is already gone or going. */
        LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d: closing the endpoint to rank %d: %s", ctx->rank,
                  pr->rank, loom_ucx.status_string(UCS_PTR_STATUS(req)));
    } else if (req != NULL) {
        closing_add(ctx, req);
    }
    return loomSuccess;
}

// ---- init ---------------------------------------------------------------------

static loomResult_t ucx_finalize(void *ctx_v);

static loomResult_t ucx_warn(const ucx_ctx_t *ctx, const char *what, ucs_status_t st)
{
    LOOM_WARN("ucx: rank %d: %s failed: %s", ctx->rank, what, loom_ucx.status_string(st));
    return loomSystemError;
}

static loomResult_t worker_open(ucx_ctx_t *ctx)
{
    ucp_config_t *config = NULL;
    ucs_status_t st = loom_ucx.config_read(NULL, NULL, &config);
    if (st != UCS_OK)
        return ucx_warn(ctx, "ucp_config_read (check the UCX_* environment)", st);
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
        .estimated_num_eps = (size_t)ctx->nranks,
        .mt_workers_shared = 0,
    };
    st = loom_ucx.init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &ctx->ucp);
    loom_ucx.config_release(config);
    if (st != UCS_OK) {
        ctx->ucp = NULL;
        return ucx_warn(ctx, "ucp_init", st);
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    st = loom_ucx.worker_create(ctx->ucp, &wp, &ctx->worker);
    if (st != UCS_OK) {
        ctx->worker = NULL;
        return ucx_warn(ctx, "ucp_worker_create", st);
    }
    st = loom_ucx.worker_get_efd(ctx->worker, &ctx->efd);
    if (st != UCS_OK)
        return ucx_warn(ctx, "ucp_worker_get_efd", st);
    st = loom_ucx.worker_get_address(ctx->worker, &ctx->my_addr, &ctx->my_addr_len);
    if (st != UCS_OK) {
        ctx->my_addr = NULL;
        return ucx_warn(ctx, "ucp_worker_get_address", st);
    }
    if (ctx->my_addr_len == 0 || ctx->my_addr_len > LOOM_UCX_ADDR_MAX) {
        LOOM_WARN("ucx: rank %d: the worker address has %zu bytes (at most %u)", ctx->rank,
                  ctx->my_addr_len, LOOM_UCX_ADDR_MAX);
        return loomSystemError;
    }
    return loomSuccess;
}

static loomResult_t ucx_init(const loom_tp_init_args_t *args, void **ctx_p)
{
    loomResult_t res;
    LOOM_CHECK(loom_ucx_load());
    ucx_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        LOOM_WARN("ucx: out of memory for the context (%zu bytes)", sizeof(*ctx));
        return loomSystemError;
    }
    ctx->rank = args->rank;
    ctx->nranks = args->nranks;
    memcpy(ctx->secret, args->secret, LOOM_SECRET_BYTES);
    ctx->timeout_ms = args->timeout_ms;
    ctx->abort_flag = args->abort_flag;
    ctx->quiet_flag = args->quiet_flag;
    ctx->stamp_ops = args->stamp_ops;
    ctx->efd = -1;
    ctx->peers = calloc((size_t)args->nranks, sizeof(*ctx->peers));
    ctx->connecting = calloc((size_t)args->nranks, sizeof(*ctx->connecting));
    if (ctx->peers == NULL || ctx->connecting == NULL) {
        LOOM_WARN("ucx: out of memory for the peer tables of %d ranks", args->nranks);
        res = loomSystemError;
        goto err_free;
    }
    for (int p = 0; p < args->nranks; p++)
        ctx->peers[p] = (ucx_peer_t){.ctx = ctx, .rank = p};
    if (ctx->stamp_ops != NULL && (ctx->spill = malloc(LOOM_UCX_INLINE_MAX)) == NULL) {
        LOOM_WARN("ucx: out of memory for a %u-byte spill buffer", LOOM_UCX_INLINE_MAX);
        res = loomSystemError;
        goto err_free;
    }
    loom_ucx_conn_init(ctx);
    LOOM_CHECK_GOTO(loom_socket_pick_addr(&ctx->sockaddr, ctx->ifname, sizeof(ctx->ifname)), res,
                    err_free);
    LOOM_CHECK_GOTO(worker_open(ctx), res, err_free);
    LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d: UCX %s worker up, %zu-byte address", ctx->rank,
              loom_ucx.get_version_string(), ctx->my_addr_len);
    *ctx_p = ctx;
    return loomSuccess;
err_free:
    ucx_finalize(ctx);
    return res;
}

static loomResult_t ucx_can_connect(void *ctx, const loom_peer_info_t *self,
                                    const loom_peer_info_t *peer, int *ok_p)
{
    /* UCX picks a lane for any peer (shared memory on one host, the network across). */
    (void)ctx;
    (void)self;
    (void)peer;
    *ok_p = 1;
    return loomSuccess;
}

// ---- data -------------------------------------------------------------------

/* Why a request to or from peer fails: WARN, or INFO while the layer above tears down. */
loomResult_t loom_ucx_peer_failed(ucx_ctx_t *ctx, int peer, int is_send, ucs_status_t st)
{
    if (quiet(ctx))
        LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d: connection %s rank %d failed: %s", ctx->rank,
                  is_send ? "to" : "from", peer, loom_ucx.status_string(st));
    else
        LOOM_WARN("ucx: rank %d: connection %s rank %d failed: %s", ctx->rank,
                  is_send ? "to" : "from", peer, loom_ucx.status_string(st));
    return loomRemoteError;
}

loomResult_t loom_ucx_send_post(ucx_ctx_t *ctx, int peer, ucx_req_t *r, const void *buffer,
                                size_t count, ucp_datatype_t dt, uint64_t utag)
{
    ucx_peer_t *pr = &ctx->peers[peer];
    r->ctx = ctx;
    r->is_send = 1;
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
        .cb = {.send = send_cb},
        .user_data = r,
        .datatype = dt,
    };
    /* Before the call: its callback may run inside it. */
    list_add(r->comm != NULL ? &r->comm->pending : &ctx->orphans, r);
    void *ucp = loom_ucx.tag_send_nbx(pr->ep, buffer, count, utag, &param);
    if (UCS_PTR_IS_ERR(ucp)) {
        list_del(r->comm != NULL ? &r->comm->pending : &ctx->orphans, r);
        loom_ucx_req_put(ctx, r);
        return loom_ucx_peer_failed(ctx, peer, 1, UCS_PTR_STATUS(ucp));
    }
    if (ucp == NULL) { /* done at once; the callback does not run */
        req_complete(ctx, r, UCS_OK, r->len);
    } else if (!r->done) {
        r->ucp = ucp;
        r->counted = 1;
        ctx->nsends++;
    }
    return loomSuccess;
}

loomResult_t loom_ucx_recv_post(ucx_comm_t *c, ucx_req_t *r, void *buffer, size_t count,
                                ucp_datatype_t dt, uint64_t ignore)
{
    ucx_ctx_t *ctx = c->ctx;
    r->comm = c;
    r->ctx = ctx;
    /* NO_IMM_CMPL: a message that is already there completes through the callback,
     * the one place that learns its length (UCX 1.13 leaves recv_info unset then). */
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb = {.recv = recv_cb},
        .user_data = r,
        .datatype = dt,
    };
    list_add(&c->pending, r); /* before the call: its callback may run inside it */
    void *ucp = loom_ucx.tag_recv_nbx(ctx->worker, buffer, count, loom_ucx_tag_of(c->peer, r->tag),
                                      UINT64_MAX & ~ignore, &param);
    if (UCS_PTR_IS_ERR(ucp) || ucp == NULL) {
        ucs_status_t st = ucp == NULL ? UCS_ERR_NO_MESSAGE : UCS_PTR_STATUS(ucp);
        list_del(&c->pending, r);
        loom_ucx_req_put(ctx, r);
        LOOM_WARN("ucx: rank %d: posting a %zu-byte receive from rank %d failed: %s", ctx->rank,
                  r->len, c->peer, loom_ucx.status_string(st));
        return loomSystemError;
    }
    if (!r->done)
        r->ucp = ucp;
    return loomSuccess;
}

/* Whether c can carry a request in direction is_send: InvalidUsage on the
 * wrong connection, RemoteError for a send once its endpoint failed. A
 * receive is still posted then: a peer that sent its last messages and closed
 * (a Reduce's non-root that finished) leaves them in the worker's unexpected
 * queue, where the receive matches them at once; test() reports the failure
 * for a receive that found nothing. */
static loomResult_t comm_usable(const ucx_comm_t *c, int is_send)
{
    ucx_ctx_t *ctx = c->ctx;
    const ucx_peer_t *pr = &ctx->peers[c->peer];
    if (c->is_send != is_send) {
        LOOM_WARN("ucx: rank %d: %s on the %s connection %s rank %d", ctx->rank,
                  is_send ? "isend" : "irecv", c->is_send ? "send" : "receive",
                  c->is_send ? "to" : "from", c->peer);
        return loomInvalidUsage;
    }
    return pr->failed && is_send ? loom_ucx_peer_failed(ctx, c->peer, is_send, pr->status)
                                 : loomSuccess;
}

/* The first steps of isend and irecv on c: the connection's checks, a look
 * for a previous call's leftovers, and a request for buf. */
static loomResult_t req_start(ucx_comm_t *c, int is_send, void *buf, size_t len, uint32_t tag,
                              ucx_req_t **r_p)
{
    ucx_ctx_t *ctx = c->ctx;
    LOOM_CHECK(comm_usable(c, is_send));
    if (ctx->stamp_ops != NULL)
        LOOM_CHECK(loom_ucx_stamp_leftovers(ctx, tag));
    ucx_req_t *r = loom_ucx_req_get(ctx);
    if (r == NULL)
        return loomSystemError;
    r->comm = c;
    r->len = len;
    r->tag = tag;
    r->buf = buf;
    *r_p = r;
    return loomSuccess;
}

static loomResult_t ucx_isend(void *send_comm, const void *buf, size_t len, uint32_t tag,
                              void **req_p)
{
    ucx_comm_t *c = send_comm;
    ucx_ctx_t *ctx = c->ctx;
    ucx_req_t *r;
    LOOM_CHECK(req_start(c, 1, (void *)buf, len, tag, &r));
    const void *buffer = buf;
    size_t count = len;
    ucp_datatype_t dt = ucp_dt_make_contig(1);
    uint64_t utag = loom_ucx_tag_of(ctx->rank, tag);
    if (ctx->stamp_ops != NULL) {
        loomResult_t res = loom_ucx_stamp_send_prep(c, r, &buffer, &count, &dt, &utag);
        if (res != loomSuccess) {
            loom_ucx_req_put(ctx, r);
            return res;
        }
    }
    LOOM_CHECK(loom_ucx_send_post(ctx, c->peer, r, buffer, count, dt, utag));
    *req_p = r;
    return loomSuccess;
}

static loomResult_t ucx_irecv(void *recv_comm, void *buf, size_t len, uint32_t tag, void **req_p)
{
    ucx_comm_t *c = recv_comm;
    ucx_req_t *r;
    LOOM_CHECK(req_start(c, 0, buf, len, tag, &r));
    void *buffer = buf;
    size_t count = len;
    ucp_datatype_t dt = ucp_dt_make_contig(1);
    uint64_t ignore = 0;
    if (c->ctx->stamp_ops != NULL)
        loom_ucx_stamp_recv_prep(c, r, &buffer, &count, &dt, &ignore);
    LOOM_CHECK(loom_ucx_recv_post(c, r, buffer, count, dt, ignore));
    *req_p = r;
    return loomSuccess;
}

static loomResult_t ucx_test(void *req, int *done_p, size_t *nbytes_p)
{
    ucx_req_t *r = req;
    ucx_comm_t *c = r->comm;
    ucx_ctx_t *ctx = c->ctx;
    const int peer = c->peer;
    if (!r->done)
        loom_ucx.worker_progress(ctx->worker);
    loomResult_t res = ctx->stamp_ops != NULL ? loom_ucx_probe_poll(ctx, peer) : loomSuccess;
    int ready = 1;
    if (res == loomSuccess && r->done && r->coll)
        res = loom_ucx_stamp_recv_done(r, &ready); /* what the message belongs to, first */
    if (res != loomSuccess) {
        if (r->done)
            loom_ucx_req_put(ctx, r);
        else
            loom_ucx_req_orphan(ctx, r);
        return res;
    }
    if (!r->done && ctx->peers[peer].failed) {
        const ucs_status_t st = ctx->peers[peer].status;
        const int is_send = r->is_send;
        loom_ucx_req_orphan(ctx, r); /* a send fails with the endpoint; a receive is cancelled */
        return loom_ucx_peer_failed(ctx, peer, is_send, st);
    }
    if (!r->done || !ready) {
        *done_p = 0;
        return loomSuccess;
    }
    const ucs_status_t st = r->status;
    const size_t nbytes = r->nbytes, len = r->len;
    const uint32_t tag = r->tag;
    const int is_send = r->is_send;
    loom_ucx_req_put(ctx, r);
    if (st == UCS_OK) {
        *done_p = 1;
        *nbytes_p = nbytes;
        return loomSuccess;
    }
    if (st == UCS_ERR_MESSAGE_TRUNCATED && !is_send) {
        if (ctx->stamp_ops != NULL)
            return ctx->stamp_ops->oversize(ctx->stamp_ops->arg, peer, tag, nbytes, len);
        LOOM_WARN("ucx: rank %d: a %zu-byte message from rank %d (tag 0x%08x) is longer than the "
                  "%zu-byte receive posted for it",
                  ctx->rank, nbytes, peer, tag, len);
        return loomInvalidUsage;
    }
    return loom_ucx_peer_failed(ctx, peer, is_send, st);
}

static loomResult_t ucx_wait(void *ctx_v, int timeout_us)
{
    ucx_ctx_t *ctx = ctx_v;
    /* UCP's wakeup protocol: progress until nothing is left, then arm; BUSY means
     * events arrived meanwhile. Unlike the other transports this moves data, and
     * first for up to PROGRESS_SPIN_US: UCX 1.13's tcp lanes read a socket only as
     * far as one progress call goes and do not signal what is left, so a worker
     * armed too early sleeps the whole timeout on data that is already there
     * (measured: a 1 MiB all-reduce over UCX_TLS=tcp took 22 ms per call). */
    const uint64_t spin_until =
        loom_now_ns() +
        1000ull * (uint64_t)(timeout_us < PROGRESS_SPIN_US ? timeout_us : PROGRESS_SPIN_US);
    do {
        if (loom_ucx.worker_progress(ctx->worker) != 0)
            return loomSuccess; /* the caller's test() sees what moved */
    } while (loom_now_ns() < spin_until);
    for (int p = 0; p < ctx->nranks; p++)
        for (int d = 0; d < 2; d++)
            if (ctx->peers[p].failed && ctx->peers[p].comms[d] != NULL &&
                ctx->peers[p].comms[d]->pending != NULL)
                return loomSuccess; /* a test() reports it now */
    ucs_status_t st = loom_ucx.worker_arm(ctx->worker);
    if (st == UCS_ERR_BUSY)
        return loomSuccess;
    if (st != UCS_OK)
        return ucx_warn(ctx, "ucp_worker_arm", st);
    ctx->pollset.n = 0;
    LOOM_CHECK(loom_pollset_add(&ctx->pollset, ctx->efd, POLLIN));
    LOOM_CHECK(loom_ucx_setup_poll(ctx));
    const size_t n = ctx->pollset.n;
    if (timeout_us < 0)
        timeout_us = 0;
    /* The wakeup reports arrivals, not room to send: UCX's tcp lanes push a large
     * message in fragments as the socket drains, and only progress does that. So while
     * sends are in flight the sleep stays short, and otherwise bounded too, since those
     * lanes may leave data unsignalled (see above). Returning early is in the contract. */
    const int cap_us = ctx->nsends > 0 ? SEND_POLL_US : IDLE_POLL_US;
    if (timeout_us > cap_us)
        timeout_us = cap_us;
    struct timespec ts = {.tv_sec = timeout_us / 1000000,
                          .tv_nsec = (timeout_us % 1000000) * 1000L};
    if (ppoll(ctx->pollset.fds, n, &ts, NULL) < 0 && errno != EINTR) {
        LOOM_WARN("ucx: rank %d: ppoll over %zu descriptors failed: %s", ctx->rank, n,
                  strerror(errno));
        return loomSystemError;
    }
    return loomSuccess;
}

// ---- teardown ---------------------------------------------------------------

static loomResult_t ucx_close_comm(void *comm)
{
    return comm == NULL ? loomSuccess : comm_close(comm);
}

/* Drives the endpoint closes in flight for at most CLOSE_FLUSH_MS (none when
 * aborted), then lets the worker's destruction end the rest. */
static void closing_drain(ucx_ctx_t *ctx)
{
    const int aborted = ctx->abort_flag != NULL && *ctx->abort_flag != 0;
    const int64_t ms = aborted                            ? 0
                       : ctx->timeout_ms < CLOSE_FLUSH_MS ? ctx->timeout_ms
                                                          : CLOSE_FLUSH_MS;
    const uint64_t deadline = loom_deadline_ms(ms);
    while (ctx->nclosing > 0) {
        loom_ucx.worker_progress(ctx->worker);
        for (int i = 0; i < ctx->nclosing;) {
            if (loom_ucx.request_check_status(ctx->closing[i]) != UCS_INPROGRESS) {
                loom_ucx.request_free(ctx->closing[i]);
                ctx->closing[i] = ctx->closing[--ctx->nclosing];
            } else {
                i++;
            }
        }
        if (ctx->nclosing > 0 && loom_now_ns() >= deadline) {
            LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d: %d endpoint flushes unfinished after %lld ms",
                      ctx->rank, ctx->nclosing, (long long)ms);
            for (int i = 0; i < ctx->nclosing; i++)
                loom_ucx.request_free(ctx->closing[i]); /* released when UCP is done with it */
            ctx->nclosing = 0;
        }
    }
}

/* Takes the messages that arrived for receives never posted (a peer's final
 * notice after this end closed, say): UCX warns about each one it still holds
 * when the worker is destroyed. Bounded by UNEXPECTED_MAX messages. */
static void unexpected_drain(ucx_ctx_t *ctx)
{
    for (int k = 0; k < UNEXPECTED_MAX; k++) {
        ucp_tag_recv_info_t info;
        ucp_tag_message_h msg = loom_ucx.tag_probe_nb(ctx->worker, 0, 0, 1, &info);
        if (msg == NULL)
            return;
        void *buf = malloc(info.length > 0 ? info.length : 1);
        if (buf == NULL)
            return; /* the worker's destruction frees it, with UCX's warning */
        ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE,
                                     .datatype = ucp_dt_make_contig(1)};
        void *req = loom_ucx.tag_msg_recv_nbx(ctx->worker, buf, info.length, msg, &param);
        for (int i = 0; i < PROGRESS_MAX && UCS_PTR_IS_PTR(req) &&
                        loom_ucx.request_check_status(req) == UCS_INPROGRESS;
             i++)
            loom_ucx.worker_progress(ctx->worker);
        int busy = 0;
        if (UCS_PTR_IS_PTR(req)) {
            busy = loom_ucx.request_check_status(req) == UCS_INPROGRESS;
            loom_ucx.request_free(req); /* released when UCP is done with it */
        }
        LOOM_INFO(LOOM_LOG_UCX,
                  "ucx: rank %d: dropped a %zu-byte message never received (tag 0x%016llx)",
                  ctx->rank, info.length, (unsigned long long)info.sender_tag);
        if (busy) { /* still being written: buf lives until the worker is gone */
            ctx->drain_buf = buf;
            return;
        }
        free(buf);
    }
}

static void reqs_free(ucx_req_t *r)
{
    while (r != NULL) {
        ucx_req_t *next = r->next;
        free(r);
        r = next;
    }
}

static loomResult_t ucx_finalize(void *ctx_v)
{
    ucx_ctx_t *ctx = ctx_v;
    loomResult_t res = loomSuccess;
    if (ctx == NULL)
        return loomSuccess;
    if (ctx->listen != NULL)
        LOOM_CHECK_IGNORE(loom_ucx_close_listen(ctx->listen), res);
    for (int p = 0; ctx->peers != NULL && p < ctx->nranks; p++) {
        for (int d = 0; d < 2; d++) {
            ucx_comm_t *c = ctx->peers[p].comms[d];
            if (c == NULL)
                continue;
            LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d: connection %s rank %d still open at finalize",
                      ctx->rank, d ? "to" : "from", p);
            LOOM_CHECK_IGNORE(comm_close(c), res);
        }
    }
    if (ctx->connecting != NULL)
        for (int p = 0; p < ctx->nranks; p++)
            loom_ucx_connect_drop(ctx, p);
    if (ctx->worker != NULL) {
        closing_drain(ctx);
        unexpected_drain(ctx);
        if (ctx->my_addr != NULL)
            loom_ucx.worker_release_address(ctx->worker, ctx->my_addr);
        loom_ucx.worker_destroy(ctx->worker); /* after this no callback runs */
    }
    free(ctx->drain_buf);
    free(ctx->spill);
    if (ctx->ucp != NULL)
        loom_ucx.cleanup(ctx->ucp);
    reqs_free(ctx->orphans);
    reqs_free(ctx->free_reqs);
    free(ctx->closing);
    free(ctx->connecting);
    free(ctx->peers);
    free(ctx->pollset.fds);
    loom_secret_wipe(ctx->secret, sizeof(ctx->secret));
    free(ctx);
    return res;
}

const loom_tp_t loom_tp_ucx = {
    .abi_version = LOOM_TP_ABI_V1,
    .name = "ucx",
    .init = ucx_init,
    .finalize = ucx_finalize,
    .can_connect = ucx_can_connect,
    .listen = loom_ucx_listen,
    .connect = loom_ucx_connect,
    .accept = loom_ucx_accept,
    .isend = ucx_isend,
    .irecv = ucx_irecv,
    .test = ucx_test,
    .wait = ucx_wait,
    .close_send = ucx_close_comm,
    .close_recv = ucx_close_comm,
    .close_listen = loom_ucx_close_listen,
};
