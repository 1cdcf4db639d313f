/* SPDX-License-Identifier: Apache-2.0
 *
 * ucx_stamp.c - call stamps (transport.h) over ucx, whose tagged messages
 * have no header of loom's. A collective message of at most
 * LOOM_UCX_INLINE_MAX bytes carries the stamp in front of its payload (an
 * iovec: nothing is copied) and says so in UCP tag bit INLINE_BIT; a longer
 * one is preceded, once per call on a connection, by the stamp in a message
 * of its own (loom tag TAG_STAMP), so that a large message stays contiguous
 * for UCX's zero-copy protocols. A collective receive matches either form
 * (the bit is not compared) and sorts it out when it completes, before the
 * payload's size is judged. Probes are stamps in messages of their own that
 * every receive connection keeps a receive posted for. It decides nothing
 * about a difference (the stamp ops of p2p.c do). Callers: ucx.c (isend,
 * irecv, test, connection open and close).
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "debug.h"
#include "ucx.h"
#include "ucx_api.h"

#define INLINE_BIT        (1ull << 63) /* UCP tags: ranks stay below 2^31 */
#define TAG_STAMP         0x7ffffffdu  /* the loom tag of a stamp in a message of its own */
#define STAMP             LOOM_TP_STAMP_BYTES
#define LEFTOVER_PROGRESS 1000 /* progress calls spent taking one unexpected message */

static int is_coll(uint32_t tag)
{
    return (tag & LOOM_TP_TAG_COLL) != 0;
}

/* A receive of one stamp with loom tag `tag` on c, into the request itself. */
static loomResult_t internal_recv(ucx_comm_t *c, uint32_t tag, ucx_req_t **req_p)
{
    ucx_req_t *r = loom_ucx_req_get(c->ctx);
    if (r == NULL)
        return loomSystemError;
    r->len = STAMP;
    r->tag = tag;
    LOOM_CHECK(loom_ucx_recv_post(c, r, r->stamp, STAMP, ucp_dt_make_contig(1), 0));
    *req_p = r;
    return loomSuccess;
}

/* The current stamp, ahead of c's next message; nobody tests the send. */
static loomResult_t stamp_send(ucx_comm_t *c)
{
    ucx_ctx_t *ctx = c->ctx;
    ucx_req_t *r = loom_ucx_req_get(ctx);
    if (r == NULL)
        return loomSystemError;
    r->len = STAMP;
    r->tag = TAG_STAMP;
    memcpy(r->stamp, ctx->stamp_ops->stamp, STAMP);
    LOOM_CHECK(loom_ucx_send_post(ctx, c->peer, r, r->stamp, STAMP, ucp_dt_make_contig(1),
                                  loom_ucx_tag_of(ctx->rank, TAG_STAMP)));
    memcpy(c->stamp_sent, ctx->stamp_ops->stamp, STAMP);
    c->stamp_sent_valid = 1;
    return loomSuccess;
}

loomResult_t loom_ucx_stamp_send_prep(ucx_comm_t *c, ucx_req_t *r, const void **buffer,
                                      size_t *count, ucp_datatype_t *dt, uint64_t *utag)
{
    const loom_tp_stamp_ops_t *ops = c->ctx->stamp_ops;
    if (r->tag == LOOM_TP_TAG_PROBE) { /* the stamp is the probe */
        memcpy(r->stamp, ops->stamp, STAMP);
        r->len = STAMP;
        *buffer = r->stamp;
        *count = STAMP;
        return loomSuccess;
    }
    if (!is_coll(r->tag))
        return loomSuccess;
    if (r->len > LOOM_UCX_INLINE_MAX) {
        if (!c->stamp_sent_valid || memcmp(c->stamp_sent, ops->stamp, STAMP) != 0)
            LOOM_CHECK(stamp_send(c));
        return loomSuccess;
    }
    memcpy(r->stamp, ops->stamp, STAMP);
    r->iov[0] = (ucp_dt_iov_t){.buffer = r->stamp, .length = STAMP};
    r->iov[1] = (ucp_dt_iov_t){.buffer = r->buf, .length = r->len};
    *buffer = r->iov;
    *count = 2;
    *dt = ucp_dt_make_iov();
    *utag |= INLINE_BIT;
    return loomSuccess;
}

void loom_ucx_stamp_recv_prep(ucx_comm_t *c, ucx_req_t *r, void **buffer, size_t *count,
                              ucp_datatype_t *dt, uint64_t *ignore)
{
    if (!is_coll(r->tag))
        return;
    r->coll = 1;
    *ignore = INLINE_BIT;
    if (r->len > LOOM_UCX_INLINE_MAX)
        return;
    /* Room past the buffer: a peer whose count is a little larger still fits,
     * so its stamp is read and the error names the count, not just a size. */
    r->inline_form = 1;
    r->iov[0] = (ucp_dt_iov_t){.buffer = r->stamp, .length = STAMP};
    r->iov[1] = (ucp_dt_iov_t){.buffer = r->buf, .length = r->len};
    r->iov[2] = (ucp_dt_iov_t){.buffer = c->ctx->spill, .length = LOOM_UCX_INLINE_MAX};
    *buffer = r->iov;
    *count = 3;
    *dt = ucp_dt_make_iov();
}

/* The stamp of c's peer's call, taken once per call of this rank from its
 * message of its own, and checked for receive r. */
static loomResult_t stamp_take(ucx_comm_t *c, const ucx_req_t *r, int *ready_p)
{
    ucx_ctx_t *ctx = c->ctx;
    const loom_tp_stamp_ops_t *ops = ctx->stamp_ops;
    if (c->stamp_got_valid && memcmp(c->stamp_got, ops->stamp, STAMP) == 0)
        return loomSuccess;
    if (c->stamp_rx == NULL)
        LOOM_CHECK(internal_recv(c, TAG_STAMP, &c->stamp_rx));
    ucx_req_t *s = c->stamp_rx;
    if (!s->done)
        loom_ucx.worker_progress(ctx->worker);
    if (!s->done) {
        if (ctx->peers[c->peer].failed)
            return loom_ucx_peer_failed(ctx, c->peer, 0, ctx->peers[c->peer].status);
        *ready_p = 0; /* sent ahead of the message: it comes */
        return loomSuccess;
    }
    uint8_t got[STAMP];
    const ucs_status_t st = s->status;
    memcpy(got, s->stamp, STAMP);
    loom_ucx_req_put(ctx, s);
    c->stamp_rx = NULL;
    if (st != UCS_OK)
        return loom_ucx_peer_failed(ctx, c->peer, 0, st);
    if (ops->check(ops->arg, c->peer, r->tag, got) == loomInvalidUsage)
        return loomInvalidUsage;
    memcpy(c->stamp_got, ops->stamp, STAMP);
    c->stamp_got_valid = 1;
    return loomSuccess;
}

/* A plain message taken by an inline receive: its first bytes went to the
 * stamp's place; puts them in order in the buffer. */
static void unshift(ucx_req_t *r, size_t n)
{
    uint8_t *b = r->buf;
    if (b == NULL) /* a count-0 receive may have no buffer; n is 0 then */
        return;
    if (n > STAMP)
        memmove(b + STAMP, b, n - STAMP);
    memcpy(b, r->stamp, n < STAMP ? n : STAMP);
}

loomResult_t loom_ucx_stamp_recv_done(ucx_req_t *r, int *ready_p)
{
    ucx_comm_t *c = r->comm;
    ucx_ctx_t *ctx = c->ctx;
    const loom_tp_stamp_ops_t *ops = ctx->stamp_ops;
    const int truncated = r->status == UCS_ERR_MESSAGE_TRUNCATED;
    const size_t n = r->nbytes; /* the message's bytes as sent */
    size_t payload = n;
    *ready_p = 1;
    if (r->status != UCS_OK && !truncated)
        return loomSuccess; /* failed: reported as any receive's failure */
    if ((r->sender_tag & INLINE_BIT) != 0) {
        if (n < STAMP) {
            LOOM_WARN("ucx: rank %d: a %zu-byte collective message from rank %d (tag 0x%08x) is "
                      "shorter than its call stamp",
                      ctx->rank, n, c->peer, r->tag);
            return loomInvalidUsage;
        }
        payload = n - STAMP;
        if (!r->inline_form && !truncated) { /* a long receive: the stamp is in front */
            memcpy(r->stamp, r->buf, STAMP);
            memmove(r->buf, (uint8_t *)r->buf + STAMP, payload);
        }
        if (ops->check(ops->arg, c->peer, r->tag, r->stamp) == loomInvalidUsage)
            return loomInvalidUsage;
    } else {
        LOOM_CHECK(stamp_take(c, r, ready_p));
        if (!*ready_p)
            return loomSuccess;
        if (r->inline_form && !truncated && payload <= r->len)
            unshift(r, payload);
    }
    if (truncated || payload > r->len)
        return ops->oversize(ops->arg, c->peer, r->tag, payload, r->len);
    r->nbytes = payload;
    return loomSuccess;
}

/* Takes unexpected message msg (info) into a buffer of its own: 1 and
 * *buf_p (malloc'd) once it arrived within LEFTOVER_PROGRESS progress calls,
 * else 0. */
static int take_unexpected(ucx_ctx_t *ctx, ucp_tag_message_h msg, const ucp_tag_recv_info_t *info,
                           uint8_t **buf_p)
{
    uint8_t *buf = malloc(info->length > 0 ? info->length : 1);
    if (buf == NULL)
        return 0; /* the worker's destruction frees the message */
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE,
                                 .datatype = ucp_dt_make_contig(1)};
    void *req = loom_ucx.tag_msg_recv_nbx(ctx->worker, buf, info->length, msg, &param);
    ucs_status_t st = UCS_PTR_IS_ERR(req) ? UCS_PTR_STATUS(req) : UCS_OK;
    if (UCS_PTR_IS_PTR(req)) {
        for (int i = 0;
             i < LEFTOVER_PROGRESS && (st = loom_ucx.request_check_status(req)) == UCS_INPROGRESS;
             i++)
            loom_ucx.worker_progress(ctx->worker);
        loom_ucx.request_free(req); /* released when UCP is done with it */
    }
    if (st == UCS_INPROGRESS) {
        /* Still being written: buf must outlive the worker (one is kept; a second,
         * which only a peer that keeps sending mismatched calls makes, is left). */
        if (ctx->drain_buf == NULL)
            ctx->drain_buf = buf;
        return 0;
    }
    if (st != UCS_OK) {
        free(buf);
        return 0;
    }
    *buf_p = buf;
    return 1;
}

loomResult_t loom_ucx_stamp_leftovers(ucx_ctx_t *ctx, uint32_t tag)
{
    const uint32_t seq = (tag >> 7) & 0xFFFFFFu;
    if (!is_coll(tag) || (ctx->coll_seq_valid && seq == ctx->coll_seq))
        return loomSuccess;
    const uint32_t old = ctx->coll_seq;
    const int had = ctx->coll_seq_valid;
    ctx->coll_seq = seq;
    ctx->coll_seq_valid = 1;
    if (!had)
        return loomSuccess;
    /* A message of the previous call that is still unexpected was never taken by
     * this rank's call of that number: the calls differ. Its stamp says how. */
    const uint64_t mask = LOOM_TP_TAG_COLL | (0xFFFFFFull << 7);
    ucp_tag_recv_info_t info;
    ucp_tag_message_h msg =
        loom_ucx.tag_probe_nb(ctx->worker, LOOM_TP_TAG_COLL | ((uint64_t)old << 7), mask, 1, &info);
    if (msg == NULL)
        return loomSuccess;
    const int peer = (int)((info.sender_tag >> 32) & 0x7fffffffu);
    const uint32_t ltag = (uint32_t)info.sender_tag;
    uint8_t stamp[STAMP] = {0}, *buf = NULL;
    if ((info.sender_tag & INLINE_BIT) != 0) {
        if (take_unexpected(ctx, msg, &info, &buf) && info.length >= STAMP)
            memcpy(stamp, buf, STAMP);
    } else { /* its stamp went ahead in a message of its own */
        ucp_tag_recv_info_t sinfo;
        ucp_tag_message_h smsg = loom_ucx.tag_probe_nb(
            ctx->worker, loom_ucx_tag_of(peer, TAG_STAMP), UINT64_MAX, 1, &sinfo);
        if (smsg != NULL && take_unexpected(ctx, smsg, &sinfo, &buf) && sinfo.length == STAMP)
            memcpy(stamp, buf, STAMP);
    }
    free(buf);
    if (peer < 0 || peer >= ctx->nranks)
        return loomSuccess; /* not a rank's: UCP's matching would never take it anyway */
    /* A stamp of a call this rank has finished is a difference of the calls of that
     * number in any case (a stamp that could not be read says nothing). */
    return ctx->stamp_ops->check(ctx->stamp_ops->arg, peer, ltag, stamp) == loomInvalidUsage
               ? loomInvalidUsage
               : loomSuccess;
}

loomResult_t loom_ucx_probe_open(ucx_comm_t *c)
{
    return internal_recv(c, LOOM_TP_TAG_PROBE, &c->probe_rx);
}

loomResult_t loom_ucx_probe_poll(ucx_ctx_t *ctx, int peer)
{
    ucx_comm_t *c = ctx->peers[peer].comms[0];
    if (c == NULL || c->probe_rx == NULL || !c->probe_rx->done)
        return loomSuccess;
    ucx_req_t *r = c->probe_rx;
    c->probe_rx = NULL;
    const int ok = r->status == UCS_OK;
    loomResult_t res = loomSuccess;
    if (ok)
        res = ctx->stamp_ops->check(ctx->stamp_ops->arg, peer, LOOM_TP_TAG_PROBE, r->stamp);
    loom_ucx_req_put(ctx, r);
    if (res == loomInvalidUsage)
        return res;
    if (ok) /* a probe lost for want of memory only delays a diagnosis */
        (void)loom_ucx_probe_open(c);
    return loomSuccess;
}

void loom_ucx_stamp_close(ucx_comm_t *c)
{
    if (c->stamp_rx != NULL && c->stamp_rx->done)
        loom_ucx_req_put(c->ctx, c->stamp_rx);
    if (c->probe_rx != NULL && c->probe_rx->done)
        loom_ucx_req_put(c->ctx, c->probe_rx);
    c->stamp_rx = c->probe_rx = NULL;
}
