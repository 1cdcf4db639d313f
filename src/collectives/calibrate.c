/* SPDX-License-Identifier: Apache-2.0
 *
 * calibrate.c - sets up a communicator's collective context: its link class
 * (the slowest transport any peer is reached by: tcp unless every peer is
 * reached through shared memory), the class's cost constants, and with
 * LOOM_CALIBRATE=1 a short measurement of them at creation.
 *
 * Measurement: every rank sends to rank+1 and receives from rank-1 at the
 * same time, 8-byte messages (alpha + o: median time per exchange) and 1 MiB
 * messages (beta: the extra median time per byte), so the ring-coupled
 * exchanges run at the pace of the slowest link; then CAL_MSGS 8-byte
 * messages at once to rank+1, rank+2, ... (o: the extra time per message);
 * gamma times a float32 sum over 256 KiB locally.
 * The ranks' values differ, so they then agree: one AllReduce (direct, max,
 * float64) of {class, alpha, beta, gamma, o}; every rank adopts the maximum,
 * so every rank's model, hence every rank's choice of algorithm, is the same
 * (different choices would deadlock). Costs a few milliseconds per
 * communicator; off by default.
 */
#include <stdlib.h>
#include <string.h>

#include "algo_util.h"
#include "check.h"
#include "param.h"
#include "timer.h"

#define CAL_SMALL_BYTES 8
#define CAL_SMALL_ITERS 20
#define CAL_BIG_BYTES   (1u << 20)
#define CAL_BIG_ITERS   5
#define CAL_MAX_ITERS   20
#define CAL_GAMMA_ELEMS (64u * 1024u)
#define CAL_GAMMA_REPS  8
#define CAL_MSGS        8   /* messages posted at once to measure o */
#define CAL_STEP        100 /* tag steps of the calibration messages */

/* The slowest class of this rank's links: tcp for a peer reached by tcp,
 * ucx for one reached by ucx, else shm. Ranks can differ (a pair of hosts
 * may fall back to tcp), so contexts that span hosts agree on the maximum. */
static loom_link_class_t detect_class(loom_p2p_t *p2p, int rank, int nranks)
{
    loom_link_class_t cls = LOOM_LINK_SHM;
    for (int peer = 0; peer < nranks; peer++) {
        const char *tp = peer == rank ? "shm" : loom_p2p_transport_name(p2p, peer);
        if (strcmp(tp, "ucx") == 0 && cls < LOOM_LINK_UCX)
            cls = LOOM_LINK_UCX;
        else if (strcmp(tp, "shm") != 0 && strcmp(tp, "ucx") != 0)
            return LOOM_LINK_TCP;
    }
    return cls;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* iters rounds of msgs concurrent messages of nbytes each way, message k to
 * rank + 1 + k mod (n-1) and from rank - 1 - k mod (n-1); *ns_p = the median
 * time of a round (robust to a rank being descheduled now and then). */
static loomResult_t exchange(loom_coll_ctx_t *ctx, uint8_t *sbuf, uint8_t *rbuf, size_t nbytes,
                             int msgs, int iters, unsigned step, uint64_t *ns_p)
{
    const int n = ctx->nranks, me = ctx->rank;
    const uint32_t tag = loom_tag_coll(ctx->seq, step);
    uint64_t t[CAL_MAX_ITERS];
    for (int i = 0; i < iters; i++) {
        uint64_t t0 = loom_now_ns();
        loom_p2p_req_t r[2 * CAL_MSGS];
        for (int k = 0; k < msgs; k++) {
            int d = 1 + k % (n - 1);
            LOOM_CHECK(loom_coll_irecv(ctx, (me - d + n) % n, rbuf + (size_t)k * nbytes, nbytes,
                                       tag, &r[2 * k]));
            LOOM_CHECK(loom_coll_isend(ctx, (me + d) % n, sbuf, nbytes, tag, &r[2 * k + 1]));
        }
        LOOM_CHECK(loom_p2p_wait_all(ctx->p2p, r, 2 * msgs));
        t[i] = loom_now_ns() - t0;
    }
    qsort(t, (size_t)iters, sizeof(t[0]), cmp_u64);
    *ns_p = t[iters / 2];
    return loomSuccess;
}

static double measure_gamma(uint8_t *acc, uint8_t *src)
{
    memset(acc, 0, CAL_GAMMA_ELEMS * sizeof(float));
    memset(src, 0, CAL_GAMMA_ELEMS * sizeof(float));
    uint64_t t0 = loom_now_ns();
    for (int i = 0; i < CAL_GAMMA_REPS; i++)
        loom_reduce_acc(loomFloat32, loomSum, acc, src, CAL_GAMMA_ELEMS);
    double ns = (double)(loom_now_ns() - t0);
    return ns / ((double)CAL_GAMMA_REPS * CAL_GAMMA_ELEMS * sizeof(float));
}

static loomResult_t calibrate(loom_coll_ctx_t *ctx)
{
    uint8_t *parts[2];
    size_t sizes[2] = {CAL_BIG_BYTES, CAL_BIG_BYTES};
    LOOM_CHECK(loom_coll_scratch_parts(ctx, sizes, 2, parts));
    memset(parts[0], 0, CAL_BIG_BYTES);
    loom_p2p_set_context(ctx->p2p, "calibration", ctx->seq);
    uint64_t warm, one, many, big;
    uint8_t *s = parts[0], *r = parts[1];
    LOOM_CHECK(exchange(ctx, s, r, CAL_SMALL_BYTES, 1, 2, CAL_STEP, &warm));
    LOOM_CHECK(exchange(ctx, s, r, CAL_SMALL_BYTES, 1, CAL_SMALL_ITERS, CAL_STEP + 1, &one));
    LOOM_CHECK(
        exchange(ctx, s, r, CAL_SMALL_BYTES, CAL_MSGS, CAL_SMALL_ITERS, CAL_STEP + 2, &many));
    LOOM_CHECK(exchange(ctx, s, r, CAL_BIG_BYTES, 1, CAL_BIG_ITERS, CAL_STEP + 3, &big));
    loom_link_cost_t *l = &ctx->link;
    /* one = alpha + 2 o (a send and a receive), many = alpha + 2 CAL_MSGS o,
     * big = one + CAL_BIG_BYTES beta. */
    double o = many > one ? (double)(many - one) / (2.0 * (CAL_MSGS - 1)) : 0.0;
    if (o > (double)one / 4)
        o = (double)one / 4; /* noise in "many" must not leave a step without latency */
    double alpha = (double)one - 2 * o;
    double beta = ((double)big - (double)one) / CAL_BIG_BYTES;
    if (beta < 1e-3)
        beta = 1e-3; /* a noisy measurement never makes bytes free */
    double gamma = measure_gamma(s, r);
    LOOM_INFO(LOOM_LOG_COLL,
              "calibration measured: rank %d class %s alpha %.17g ns beta %.17g ns/B gamma %.17g "
              "ns/B o %.17g ns",
              ctx->rank, loom_link_class_name(l->cls), alpha, beta, gamma, o);
    /* Agree on the maximum of every value (the class too: tcp > ucx > shm). */
    double v[5] = {(double)l->cls, alpha, beta, gamma, o};
    loom_coll_args_t agree = {.kind = LOOM_COLL_ALLREDUCE,
                              .sendbuff = v,
                              .recvbuff = v,
                              .count = 5,
                              .dt = loomFloat64,
                              .op = loomMax};
    LOOM_CHECK(loom_allreduce_direct(ctx, &agree));
    l->cls = v[0] >= (double)LOOM_LINK_TCP   ? LOOM_LINK_TCP
             : v[0] >= (double)LOOM_LINK_UCX ? LOOM_LINK_UCX
                                             : LOOM_LINK_SHM;
    l->alpha_ns = v[1];
    l->beta_ns = v[2];
    l->gamma_ns = v[3];
    l->o_ns = v[4];
    LOOM_INFO(LOOM_LOG_COLL | LOOM_LOG_INIT,
              "calibration agreed: class %s alpha %.17g ns beta %.17g ns/B gamma %.17g ns/B o "
              "%.17g ns",
              loom_link_class_name(l->cls), l->alpha_ns, l->beta_ns, l->gamma_ns, l->o_ns);
    return loomSuccess;
}

/* The class of the links inside this rank's host: shm unless a peer on the
 * host is reached another way (LOOM_NET=tcp). Equal on every rank whenever
 * the transports' choice is, which the layout's hierarchy relies on. */
static loom_link_class_t intra_class(loom_p2p_t *p2p, const loom_hosts_t *h, int rank, int nranks)
{
    for (int peer = 0; peer < nranks; peer++)
        if (peer != rank && h->host_of[peer] == h->host &&
            strcmp(loom_p2p_transport_name(p2p, peer), "shm") != 0)
            return LOOM_LINK_TCP;
    return LOOM_LINK_SHM;
}

/* Across hosts the ranks agree on the link class (a pair of hosts may have
 * fallen back from ucx to tcp) and on the rate of the slowest network link:
 * each rank knows the speed of the interface its TCP uses and the rate of
 * its best RDMA port; one small AllReduce takes the maximum of the class and
 * of the time per byte, and the class's constants then follow that rate
 * (loom_link_cost_at_rate). Interfaces without a speed (loopback, most
 * virtual ones) leave the defaults. Not done when LOOM_CALIBRATE measures. */
static loomResult_t link_rate(loom_coll_ctx_t *ctx, int tcp_mbps, int rdma_mbps)
{
    double v[3] = {(double)ctx->link.cls, tcp_mbps > 0 ? 8000.0 / tcp_mbps : 0,
                   rdma_mbps > 0 ? 8000.0 / rdma_mbps : 0};
    loom_coll_args_t agree = {.kind = LOOM_COLL_ALLREDUCE,
                              .sendbuff = v,
                              .recvbuff = v,
                              .count = 3,
                              .dt = loomFloat64,
                              .op = loomMax};
    LOOM_CHECK(loom_allreduce_direct(ctx, &agree));
    loom_link_class_t cls = v[0] >= (double)LOOM_LINK_TCP ? LOOM_LINK_TCP : LOOM_LINK_UCX;
    double ns_per_byte = cls == LOOM_LINK_TCP ? v[1] : v[2];
    double before = loom_link_cost_default(cls).beta_ns;
    ctx->link = loom_link_cost_at_rate(cls, ns_per_byte);
    if (ctx->link.beta_ns != before)
        LOOM_INFO(LOOM_LOG_COLL | LOOM_LOG_INIT,
                  "rank %d: slowest %s link between hosts %.0f Mbit/s: beta %.3f ns/B instead "
                  "of %.3f",
                  ctx->rank, loom_link_class_name(cls), 8000.0 / ns_per_byte, ctx->link.beta_ns,
                  before);
    return loomSuccess;
}

loomResult_t loom_coll_ctx_init(loom_coll_ctx_t *ctx, loom_p2p_t *p2p, int rank, int nranks,
                                const loom_peer_info_t *peers, int tcp_mbps, int rdma_mbps)
{
    ctx->p2p = p2p;
    ctx->rank = rank;
    ctx->nranks = nranks;
    ctx->group = NULL;
    uint64_t *hash = calloc((size_t)nranks, sizeof(*hash));
    if (hash == NULL) {
        LOOM_WARN("out of memory for %d host hashes", nranks);
        return loomSystemError;
    }
    for (int r = 0; r < nranks; r++)
        hash[r] = peers[r].host_hash;
    loomResult_t res = loom_hosts_init(&ctx->hosts, hash, nranks, rank);
    free(hash);
    LOOM_CHECK(res);
    ctx->intra = loom_link_cost_default(intra_class(p2p, &ctx->hosts, rank, nranks));
    ctx->seq = 0; /* calibration runs as collective 0; user collectives start at 1 */
    memset(ctx->memo, 0, sizeof(ctx->memo));
    ctx->chunk_bytes = (size_t)loom_param_CHUNK_BYTES();
    if (ctx->chunk_bytes < 4096)
        ctx->chunk_bytes = 4096;
    ctx->link = loom_link_cost_default(detect_class(p2p, rank, nranks));
    if (loom_param_CALIBRATE() != 0 && nranks > 1)
        LOOM_CHECK(calibrate(ctx));
    else if (ctx->hosts.nhosts > 1 && ctx->link.cls != LOOM_LINK_SHM)
        LOOM_CHECK(link_rate(ctx, tcp_mbps, rdma_mbps));
    ctx->ring_depth = loom_ring_depth(ctx->link.cls, nranks);
    LOOM_INFO(LOOM_LOG_COLL,
              "rank %d: link class %s, alpha %.1f us, beta %.3f ns/B, gamma %.3f ns/B, o %.1f "
              "us, ring depth %d%s; %d host(s), %d rank(s) per host",
              rank, loom_link_class_name(ctx->link.cls), ctx->link.alpha_ns / 1e3,
              ctx->link.beta_ns, ctx->link.gamma_ns, ctx->link.o_ns / 1e3, ctx->ring_depth,
              loom_param_CALIBRATE() != 0 ? " (calibrated)" : "", ctx->hosts.nhosts,
              ctx->hosts.ppn);
    return loomSuccess;
}
