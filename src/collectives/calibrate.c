/* SPDX-License-Identifier: Apache-2.0
 *
 * calibrate.c - sets up a communicator's collective context: the shm
 * collectives' arena (shm/shm_open.c; first, as every rank then agrees on
 * whether there is one before anything else), its link class (the slowest
 * transport any peer is reached by: tcp unless every peer is reached through
 * shared memory), and the model's constants for that class and for the links
 * inside a host, measured at creation unless LOOM_CALIBRATE=0; and ends the
 * arena (loom_coll_ctx_close) after the communicator's point-to-point layer.
 *
 * Measurement: every rank sends to rank+1 and receives from rank-1 at the
 * same time, 8-byte messages (alpha + o: median time per exchange) and
 * CAL_BIG_BYTES messages (beta: the extra median time per byte), so the
 * ring-coupled exchanges run at the pace of the slowest link; then CAL_MSGS
 * 8-byte messages at once to rank+1, rank+2, ... (o: the extra time per
 * message); then CAL_BIG_BYTES over every link of the ring one way, 8 bytes
 * back (beta_one: a full-duplex link moves bytes one way as fast as both ways,
 * a CPU that copies them, as loopback TCP and shared memory do, twice as fast);
 * gamma times a float32 sum over 256 KiB locally; cold compares memcpy's rate
 * in the L2 with its rate past it, once per process (loom_link_cost_for_call
 * charges it to the bytes of calls whose buffers outgrow the L2); where there is an arena, the
 * arena probe (shm/shm_probe.c) times its flag round, its copies and a call of each
 * collective for the shm collectives' prediction, agreed with the rest (the slowest rank's). Across
 * hosts the same exchanges among the ranks of each host measure the links inside it. The ranks'
 * values differ, so they then agree: one AllReduce (direct, max, float64) of the class, both sets
 * of constants, the rates of the hosts' interfaces and RDMA ports and the smallest L2; every rank
 * adopts the maximum (the L2: the minimum), the constants rounded to a coarse grid
 * (loom_cost_round), so every rank's model, hence every rank's choice of algorithm, is the same
 * (different choices would deadlock), and reruns on one machine mostly get the same constants. The
 * interface's rate bounds a measured beta across hosts from below, the RDMA port's rate replaces it
 * (loom_link_cost_with_rate); LOOM_COST_<CLASS> wins over all.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo_util.h"
#include "check.h"
#include "param.h"
#include "shm/shm_coll.h"
#include "timer.h"

#define CAL_SMALL_BYTES 8
#define CAL_SMALL_ITERS 10
#define CAL_BIG_BYTES   (1u << 20)
#define CAL_BIG_ITERS   3
#define CAL_MAX_ITERS   10
#define CAL_GAMMA_ELEMS (64u * 1024u)
#define CAL_GAMMA_REPS  8
#define CAL_MSGS        8 /* messages posted at once to measure o */
#define CAL_COLD_REPS   3
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

/* iters rounds of one nbytes message over every link of the ring one way: in the first half
 * every even rank sends to the next rank, in the second every odd one does, so each link
 * rank -> rank+1 carries bytes one way in one of them (an odd count leaves the link from the
 * last rank to rank 0 out). Each message is answered by an 8-byte one before the next, else
 * the sender runs ahead into the socket's buffer and the receiver times only its copy out.
 * *ns_p = the larger of the two halves' median round times on this rank, 0 if it idled in
 * both. */
static loomResult_t one_way(loom_coll_ctx_t *ctx, uint8_t *sbuf, uint8_t *rbuf, size_t nbytes,
                            int iters, unsigned step, uint64_t *ns_p)
{
    const int n = ctx->nranks, me = ctx->rank;
    const uint32_t tag = loom_tag_coll(ctx->seq, step);
    *ns_p = 0;
    for (int half = 0; half < 2; half++) {
        const int sender = me % 2 == half;
        const int peer = sender ? me + 1 : me - 1;
        if (peer < 0 || peer >= n)
            continue;
        uint64_t t[CAL_MAX_ITERS];
        for (int i = 0; i < iters; i++) {
            uint64_t t0 = loom_now_ns();
            loom_p2p_req_t r[2];
            if (sender) {
                LOOM_CHECK(loom_coll_irecv(ctx, peer, rbuf, CAL_SMALL_BYTES, tag, &r[0]));
                LOOM_CHECK(loom_coll_isend(ctx, peer, sbuf, nbytes, tag, &r[1]));
                LOOM_CHECK(loom_p2p_wait_all(ctx->p2p, r, 2));
            } else {
                LOOM_CHECK(loom_coll_irecv(ctx, peer, rbuf, nbytes, tag, &r[0]));
                LOOM_CHECK(loom_p2p_wait_all(ctx->p2p, r, 1));
                LOOM_CHECK(loom_coll_isend(ctx, peer, sbuf, CAL_SMALL_BYTES, tag, &r[1]));
                LOOM_CHECK(loom_p2p_wait_all(ctx->p2p, &r[1], 1));
            }
            t[i] = loom_now_ns() - t0;
        }
        qsort(t, (size_t)iters, sizeof(t[0]), cmp_u64);
        if (t[iters / 2] > *ns_p)
            *ns_p = t[iters / 2];
    }
    return loomSuccess;
}

/* ns of memcpy per byte into buffers past the L2 less that into buffers within it: what a
 * byte costs more once a call's buffers no longer fit (0: no difference seen). Measured once
 * per process (the machine does not change), in about a millisecond: buffers of a quarter and
 * of twice the L2, the best of a few copies of each. */
static double measure_cold(void)
{
    static uint64_t cached = UINT64_MAX; /* the double's bits once measured */
    uint64_t bits = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
    double v;
    if (bits != UINT64_MAX) {
        memcpy(&v, &bits, sizeof(v));
        return v;
    }
    size_t l1d, l2, l3;
    loom_shm_caches(&l1d, &l2, &l3);
    if (l2 == 0)
        return 0.0; /* unknown: no cold cost, and nothing to remember */
    const size_t hot = l2 / 4, cold = 2 * l2;
    uint8_t *buf = malloc(2 * cold);
    if (buf == NULL)
        return 0.0;
    memset(buf, 1, 2 * cold); /* faulted in before timing */
    double per_byte[2];
    const size_t sizes[2] = {hot, cold};
    for (int k = 0; k < 2; k++) {
        uint64_t best = UINT64_MAX;
        for (int i = 0; i < CAL_COLD_REPS; i++) {
            const uint64_t t0 = loom_now_ns();
            memcpy(buf + cold, buf, sizes[k]);
            __asm__ __volatile__("" : : "r"(buf) : "memory"); /* the copy is not dead */
            const uint64_t t = loom_now_ns() - t0;
            best = t < best ? t : best;
        }
        per_byte[k] = (double)best / (double)sizes[k];
    }
    free(buf);
    v = fmax(per_byte[1] - per_byte[0], 0.0);
    memcpy(&bits, &v, sizeof(bits));
    __atomic_store_n(&cached, bits, __ATOMIC_RELEASE);
    return v;
}

/* The best of CAL_GAMMA_REPS sums: one preemption of one rank must not make every rank's
 * reductions look slow (the ranks agree on the maximum). */
static double measure_gamma(uint8_t *acc, uint8_t *src)
{
    memset(acc, 0, CAL_GAMMA_ELEMS * sizeof(float));
    memset(src, 0, CAL_GAMMA_ELEMS * sizeof(float));
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < CAL_GAMMA_REPS; i++) {
        const uint64_t t0 = loom_now_ns();
        loom_reduce_acc(loomFloat32, loomSum, acc, src, CAL_GAMMA_ELEMS);
        const uint64_t t = loom_now_ns() - t0;
        best = t < best ? t : best;
    }
    return (double)best / ((double)CAL_GAMMA_ELEMS * sizeof(float));
}

/* Measures alpha, beta, gamma, o, beta_one (ns) of the links among ctx's
 * ranks into v; steps CAL_STEP + step0 .. + 4 of the running collective's tags. */
static loomResult_t measure(loom_coll_ctx_t *ctx, uint8_t *s, uint8_t *r, unsigned step0, double *v)
{
    uint64_t warm, one, many, big, big_one;
    const unsigned st = CAL_STEP + step0;
    LOOM_CHECK(exchange(ctx, s, r, CAL_SMALL_BYTES, 1, 2, st, &warm));
    LOOM_CHECK(exchange(ctx, s, r, CAL_SMALL_BYTES, 1, CAL_SMALL_ITERS, st + 1, &one));
    LOOM_CHECK(exchange(ctx, s, r, CAL_SMALL_BYTES, CAL_MSGS, CAL_SMALL_ITERS, st + 2, &many));
    LOOM_CHECK(exchange(ctx, s, r, CAL_BIG_BYTES, 1, CAL_BIG_ITERS, st + 3, &big));
    LOOM_CHECK(one_way(ctx, s, r, CAL_BIG_BYTES, CAL_BIG_ITERS, st + 4, &big_one));
    /* one = alpha + 2 o (a send and a receive), many = alpha + 2 CAL_MSGS o,
     * big = one + CAL_BIG_BYTES beta. */
    double o = many > one ? (double)(many - one) / (2.0 * (CAL_MSGS - 1)) : 0.0;
    if (o > (double)one / 4)
        o = (double)one / 4; /* noise in "many" must not leave a step without latency */
    double beta = ((double)big - (double)one) / CAL_BIG_BYTES;
    if (beta < 1e-3)
        beta = 1e-3; /* a noisy measurement never makes bytes free */
    v[LOOM_COST_ALPHA] = (double)one - 2 * o;
    v[LOOM_COST_BETA] = beta;
    v[LOOM_COST_GAMMA] = measure_gamma(s, r);
    v[LOOM_COST_O] = o;
    v[LOOM_COST_COLD] = measure_cold();
    /* big_one = one (the bytes' way) + CAL_BIG_BYTES beta_one + one (the answer's way); a rank
     * that idled in both halves measured nothing (-1), and the others' values stand. */
    v[LOOM_COST_BETA_ONE] =
        big_one == 0 ? -1.0 : fmax(((double)big_one - 2.0 * (double)one) / CAL_BIG_BYTES, 1e-3);
    return loomSuccess;
}

/* The context of this rank's host's ranks (group: their communicator ranks,
 * room for nranks), for measuring the links inside it; 0 ranks where the host
 * has only this one. */
static loom_coll_ctx_t host_part(const loom_coll_ctx_t *ctx, int *group)
{
    loom_coll_ctx_t part = *ctx;
    part.nranks = 0;
    for (int r = 0; r < ctx->nranks; r++) {
        if (ctx->hosts.host_of[r] != ctx->hosts.host)
            continue;
        if (r == ctx->rank)
            part.rank = part.nranks;
        group[part.nranks++] = r;
    }
    part.group = group;
    if (part.nranks < 2)
        part.nranks = 0;
    return part;
}

/* rank < 0: the agreed values, logged under INIT as well. */
static void log_constants(int rank, const char *what, loom_link_class_t cls, const double *v)
{
    char who[32] = "";
    if (rank >= 0)
        snprintf(who, sizeof(who), "rank %d ", rank);
    LOOM_INFO(LOOM_LOG_COLL | (rank < 0 ? LOOM_LOG_INIT : 0),
              "calibration %s: %sclass %s alpha %.17g ns beta %.17g ns/B one way %.17g ns/B "
              "gamma %.17g ns/B o %.17g ns cold %.17g ns/B",
              what, who, loom_link_class_name(cls), v[LOOM_COST_ALPHA], v[LOOM_COST_BETA],
              v[LOOM_COST_BETA_ONE], v[LOOM_COST_GAMMA], v[LOOM_COST_O], v[LOOM_COST_COLD]);
}

/* The agreement vector: the class, the communicator's constants, the host's
 * (-1: none measured), the ns per byte of the interface and of the port, minus
 * the L2's bytes (the maximum of which is the smallest L2). */
enum {
    AG_CLASS,
    AG_LINK,
    AG_INTRA = AG_LINK + LOOM_COST_NCONST,
    AG_TCP = AG_INTRA + LOOM_COST_NCONST,
    AG_RDMA,
    AG_CACHE,
    AG_ARENA, /* the arena probe's flag, local, cross, cross1 (loom_shm_probe_t; -1: none) */
    AG_ARENA_LOCAL,
    AG_ARENA_CROSS,
    AG_ARENA_CROSS1,
    AG_ARENA_CALL, /* the probe's calls' times (loom_shm_probe_t.call_ns) */
    AG_NUM = AG_ARENA_CALL + LOOM_SHM_PROBE_TIERS * LOOM_SHM_PROBE_CALLS
};

static loomResult_t agree_max(loom_coll_ctx_t *ctx, double *v, size_t n)
{
    loom_coll_args_t agree = {.kind = LOOM_COLL_ALLREDUCE,
                              .sendbuff = v,
                              .recvbuff = v,
                              .count = n,
                              .dt = loomFloat64,
                              .op = loomMax};
    return loom_allreduce_direct(ctx, &agree);
}

static loom_link_class_t class_of(double v)
{
    return v >= (double)LOOM_LINK_TCP   ? LOOM_LINK_TCP
           : v >= (double)LOOM_LINK_UCX ? LOOM_LINK_UCX
                                        : LOOM_LINK_SHM;
}

/* Measures (unless LOOM_CALIBRATE=0) and agrees; across hosts the constants
 * then follow the agreed rates. Every rank makes the same calls: whether it
 * measures depends on LOOM_CALIBRATE alone (the same on every rank), whether
 * it agrees also on the host count. */
static loomResult_t calibrate(loom_coll_ctx_t *ctx, int tcp_mbps, int rdma_mbps)
{
    const int measuring = loom_param_CALIBRATE() != 0;
    const int spans = ctx->hosts.nhosts > 1;
    size_t l1d, l2, l3;
    loom_shm_caches(&l1d, &l2, &l3);
    ctx->cache_bytes = (double)l2; /* one host's ranks share the machine, so agree already */
    if (!measuring && !spans)
        return loomSuccess;
    double v[AG_NUM];
    for (int k = 0; k < AG_NUM; k++)
        v[k] = -1.0;
    v[AG_CLASS] = (double)ctx->link.cls;
    v[AG_TCP] = spans && tcp_mbps > 0 ? 8000.0 / tcp_mbps : 0;
    v[AG_RDMA] = spans && rdma_mbps > 0 ? 8000.0 / rdma_mbps : 0;
    v[AG_CACHE] = -ctx->cache_bytes;
    if (measuring) {
        uint8_t *parts[2];
        size_t sizes[2] = {CAL_BIG_BYTES, CAL_BIG_BYTES};
        LOOM_CHECK(loom_coll_scratch_parts(ctx, sizes, 2, parts));
        memset(parts[0], 0, CAL_BIG_BYTES);
        loom_p2p_set_context(ctx->p2p, "calibration", ctx->seq);
        LOOM_CHECK(measure(ctx, parts[0], parts[1], 0, &v[AG_LINK]));
        log_constants(ctx->rank, "measured", ctx->link.cls, &v[AG_LINK]);
        if (!spans) {
            memcpy(&v[AG_INTRA], &v[AG_LINK], sizeof(double) * LOOM_COST_NCONST);
        } else {
            int *group = malloc((size_t)ctx->nranks * sizeof(*group));
            if (group == NULL) {
                LOOM_WARN("rank %d: out of memory for a host's ranks (%d)", ctx->rank, ctx->nranks);
                return loomSystemError;
            }
            loom_coll_ctx_t part = host_part(ctx, group);
            loomResult_t res = loomSuccess;
            if (part.nranks > 0)
                res = measure(&part, parts[0], parts[1], 5, &v[AG_INTRA]);
            free(group);
            LOOM_CHECK(res);
        }
        /* Every rank agreed at creation on whether there is an arena. */
        if (loom_shm_arena(ctx) != NULL) {
            loom_shm_probe_t pr;
            LOOM_CHECK(loom_shm_probe(ctx, &pr));
            v[AG_ARENA] = pr.flag_ns;
            v[AG_ARENA_LOCAL] = pr.local_ns;
            v[AG_ARENA_CROSS] = pr.cross_ns;
            v[AG_ARENA_CROSS1] = pr.cross1_ns;
            memcpy(&v[AG_ARENA_CALL], pr.call_ns, sizeof(pr.call_ns));
            loom_p2p_set_context(ctx->p2p, "calibration", ctx->seq); /* the probe's last call */
        }
    }
    LOOM_CHECK(agree_max(ctx, v, AG_NUM));
    ctx->cache_bytes = -v[AG_CACHE];
    if (v[AG_ARENA_CROSS] > 0) {
        ctx->shm.flag_ns = v[AG_ARENA];
        ctx->shm.local_ns = v[AG_ARENA_LOCAL];
        ctx->shm.cross_ns = v[AG_ARENA_CROSS];
        ctx->shm.cross1_ns = v[AG_ARENA_CROSS1];
        memcpy(ctx->shm.call_ns, &v[AG_ARENA_CALL], sizeof(ctx->shm.call_ns));
        ctx->shm.probe_ranks = ctx->nranks;
    }
    const loom_link_class_t cls = class_of(v[AG_CLASS]);
    if (measuring)
        log_constants(-1, "agreed", cls, &v[AG_LINK]);
    const loom_link_class_t intra_cls = ctx->intra.cls;
    ctx->link = measuring ? loom_link_cost_measured(cls, &v[AG_LINK]) : loom_link_cost_default(cls);
    /* Inside the host of a single-host communicator the links are the communicator's. */
    if (measuring && (spans || intra_cls == cls))
        ctx->intra = loom_link_cost_measured(intra_cls, &v[AG_INTRA]);
    if (spans && cls != LOOM_LINK_SHM) {
        const double ns_per_byte = cls == LOOM_LINK_TCP ? v[AG_TCP] : v[AG_RDMA];
        const double before = ctx->link.beta_ns;
        ctx->link = loom_link_cost_with_rate(ctx->link, ns_per_byte);
        if (ctx->link.beta_ns != before)
            LOOM_INFO(LOOM_LOG_COLL | LOOM_LOG_INIT,
                      "rank %d: slowest %s link between hosts %.0f Mbit/s: beta %.3f ns/B "
                      "instead of %.3f",
                      ctx->rank, loom_link_class_name(cls), 8000.0 / ns_per_byte, ctx->link.beta_ns,
                      before);
    }
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

loomResult_t loom_coll_ctx_init(loom_coll_ctx_t *ctx, loom_p2p_t *p2p,
                                const loom_tp_init_args_t *args, int tcp_mbps, int rdma_mbps)
{
    const int rank = args->rank, nranks = args->nranks;
    const loom_peer_info_t *peers = args->peers;
    ctx->p2p = p2p;
    ctx->rank = rank;
    ctx->nranks = nranks;
    ctx->group = NULL;
    ctx->arena = NULL;
    LOOM_CHECK(loom_shm_open(ctx, args));
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
    ctx->seq = 0; /* calibration runs as collective 0, the arena probe's calls next; user
                     collectives follow them */
    memset(ctx->memo, 0, sizeof(ctx->memo));
    ctx->chunk_bytes = (size_t)loom_param_CHUNK_BYTES();
    if (ctx->chunk_bytes < 4096)
        ctx->chunk_bytes = 4096;
    ctx->link = loom_link_cost_default(detect_class(p2p, rank, nranks));
    loom_shm_machine(ctx, &ctx->shm); /* the arena probe's calls are planned with it */
    if (nranks > 1)
        LOOM_CHECK(calibrate(ctx, tcp_mbps, rdma_mbps));
    ctx->ring_depth = loom_ring_depth(ctx->link.cls, nranks);
    if (rank == 0 && ctx->arena != NULL) { /* bench/compare records this line */
        char text[1280];
        loom_shm_machine_text(&ctx->shm, text, sizeof(text));
        LOOM_INFO(LOOM_LOG_SHM, "shm machine: %s; streaming from %zu KiB written", text,
                  loom_shm_nt_threshold(&ctx->shm, nranks) >> 10);
    }
    char link[256], intra[256];
    loom_link_cost_describe(&ctx->link, link, sizeof(link));
    loom_link_cost_describe(&ctx->intra, intra, sizeof(intra));
    LOOM_INFO(LOOM_LOG_COLL,
              "rank %d: link class %s, %s, ring depth %d; inside a host %s, %s; %d host(s), %d "
              "rank(s) per host",
              rank, loom_link_class_name(ctx->link.cls), link, ctx->ring_depth,
              loom_link_class_name(ctx->intra.cls), intra, ctx->hosts.nhosts, ctx->hosts.ppn);
    return loomSuccess;
}

loomResult_t loom_coll_ctx_close(loom_coll_ctx_t *ctx)
{
    return loom_shm_close(ctx);
}
