/* SPDX-License-Identifier: Apache-2.0
 *
 * cost_model.c - the link classes' constants and one cost function per
 * algorithm: T = steps * alpha + msgs * o + bytes * beta + reduced * gamma,
 * with the usual formulas for the busiest rank (Thakur, Rabenseifner and
 * Gropp, "Optimization of collective communication operations in MPICH",
 * IJHPCA 2005; Chan et al., CCPE 2007; LogP's per-message overhead o).
 * Conventions of every function below:
 *  - steps: rounds of messages that wait for the previous round (a ring of
 *    n-1 steps, a butterfly of lg p), times the rounds the implementation
 *    needs to bound its scratch (fractional, so costs are smooth in size);
 *  - msgs: messages the busiest rank sends plus those it receives (an
 *    exchange with one partner is two);
 *  - bytes: what the busiest rank puts on (or takes off) the wire; partial
 *    reductions travel in the accumulator type (acc_ratio);
 *  - reduced: accumulator bytes the busiest rank combines or copies locally.
 * It does not choose (algo_select.c) or measure (calibrate.c).
 */
#include "cost_model.h"
#include "cpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "check.h"
#include "param.h"

/* Fallbacks, per class: alpha ns, beta ns/byte, gamma ns/byte, o ns, beta_one ns/byte, cold
 * ns/byte (none: only a measurement knows the memory's rate). Every
 * communicator measures its own at creation (calibrate.c); these serve only
 * where nothing is measured: LOOM_CALIBRATE=0, and a class the communicator
 * does not use (loom_info's tables). They are deliberately pessimistic
 * (alpha and o as costly as a scheduler hand-over with more ranks than
 * cores), so that an unmeasured model prefers algorithms with few steps. */
static const loom_link_cost_t builtin[LOOM_LINK_NUM] = {
    [LOOM_LINK_SHM] = {LOOM_LINK_SHM, 120000.0, 0.5, 0.15, 7000.0, 0.5, 0.0, {0}},
    /* ucx starts from tcp's constants (the same scheduling costs per step and
     * message); loom_link_cost_at_rate puts the RDMA port's rate in beta. */
    [LOOM_LINK_UCX] = {LOOM_LINK_UCX, 120000.0, 0.5, 0.15, 10000.0, 0.5, 0.0, {0}},
    [LOOM_LINK_TCP] = {LOOM_LINK_TCP, 120000.0, 0.5, 0.15, 10000.0, 0.5, 0.0, {0}},
};

static const char *const class_names[LOOM_LINK_NUM] = {"shm", "ucx", "tcp"};

const char *loom_link_class_name(loom_link_class_t cls)
{
    return (unsigned)cls < LOOM_LINK_NUM ? class_names[cls] : "unknown";
}

int loom_link_class_parse(const char *name, loom_link_class_t *cls_p)
{
    for (int i = 0; i < LOOM_LINK_NUM; i++) {
        if (name != NULL && strcasecmp(name, class_names[i]) == 0) {
            *cls_p = (loom_link_class_t)i;
            return 0;
        }
    }
    return -1;
}

loom_link_cost_t loom_link_cost_builtin(loom_link_class_t cls)
{
    return builtin[(unsigned)cls < LOOM_LINK_NUM ? cls : LOOM_LINK_TCP];
}

int loom_link_cost_parse(const char *text, loom_link_cost_t *l_p)
{
    if (text == NULL)
        return -1;
    double v[6];
    const char *s = text;
    int k = 0;
    for (; k < 6; k++) {
        char *end = NULL;
        v[k] = strtod(s, &end);
        if (end == s || !(v[k] >= 0.0) || isinf(v[k]))
            return -1;
        s = end;
        if (*s != ',')
            break;
        s++;
    }
    if (*s != '\0' || k < 2 || k > 5)
        return -1;
    l_p->alpha_ns = v[0] * 1000.0;
    l_p->beta_ns = v[1];
    l_p->gamma_ns = v[2];
    if (k >= 3)
        l_p->o_ns = v[3] * 1000.0;
    l_p->beta_one_ns = k >= 4 && !(v[4] > v[1]) ? v[4] : v[1]; /* one way never above both */
    l_p->cold_ns = k == 5 ? v[5] : 0.0; /* rates alone: nothing costs more past the cache */
    return 0;
}

static const char *cost_text(loom_link_class_t cls)
{
    switch (cls) {
    case LOOM_LINK_SHM:
        return loom_param_COST_SHM();
    case LOOM_LINK_UCX:
        return loom_param_COST_UCX();
    default:
        return loom_param_COST_TCP();
    }
}

int loom_link_cost_is_set(loom_link_class_t cls)
{
    const char *text = cost_text(cls);
    return text != NULL && text[0] != '\0';
}

/* l with LOOM_COST_<cls>'s constants when it is set and valid (source ENV);
 * an invalid value is WARNed once and l stays. */
static loom_link_cost_t apply_env(loom_link_cost_t l)
{
    static const char *const env_names[LOOM_LINK_NUM] = {"SHM", "UCX", "TCP"};
    static int warned[LOOM_LINK_NUM];
    const char *text = cost_text(l.cls);
    if (text == NULL || text[0] == '\0')
        return l;
    loom_link_cost_t set = l;
    if (loom_link_cost_parse(text, &set) != 0) {
        if (!__atomic_exchange_n(&warned[l.cls], 1, __ATOMIC_RELAXED))
            LOOM_WARN("LOOM_COST_%s=\"%s\" is not "
                      "\"alpha_us,beta_ns,gamma_ns[,o_us[,beta_one_ns[,cold_ns]]]\" "
                      "(non-negative numbers); ignored",
                      env_names[l.cls], text);
        return l;
    }
    set.src[LOOM_COST_ALPHA] = set.src[LOOM_COST_BETA] = set.src[LOOM_COST_GAMMA] =
        set.src[LOOM_COST_BETA_ONE] = set.src[LOOM_COST_COLD] = LOOM_COST_SRC_ENV;
    int commas = 0; /* o is the fourth value, optional */
    for (const char *c = text; *c; c++)
        commas += *c == ',';
    if (commas >= 3)
        set.src[LOOM_COST_O] = LOOM_COST_SRC_ENV;

    return set;
}

loom_link_cost_t loom_link_cost_default(loom_link_class_t cls)
{
    return apply_env(loom_link_cost_builtin(cls));
}

loom_link_cost_t loom_link_cost_with_rate(loom_link_cost_t l, double ns_per_byte)
{
    if (!(ns_per_byte > 0) || l.src[LOOM_COST_BETA] == LOOM_COST_SRC_ENV)
        return l;
    /* An interface is full duplex: its rate bounds one way and both ways alike. */
    if (l.cls == LOOM_LINK_UCX || (l.cls == LOOM_LINK_TCP && ns_per_byte > l.beta_ns)) {
        l.beta_ns = ns_per_byte;
        l.src[LOOM_COST_BETA] = LOOM_COST_SRC_TOPOLOGY;
    }
    if (l.cls == LOOM_LINK_UCX || (l.cls == LOOM_LINK_TCP && ns_per_byte > l.beta_one_ns)) {
        l.beta_one_ns = fmin(ns_per_byte, l.beta_ns);
        l.src[LOOM_COST_BETA_ONE] = LOOM_COST_SRC_TOPOLOGY;
    }
    return l;
}

loom_link_cost_t loom_link_cost_at_rate(loom_link_class_t cls, double ns_per_byte)
{
    return loom_link_cost_with_rate(loom_link_cost_default(cls), ns_per_byte);
}

double loom_cost_round(double v)
{
    if (!(v > 0) || isinf(v))
        return v > 0 ? v : 0.0;
    return exp2(round(4.0 * log2(v)) / 4.0);
}

loom_link_cost_t loom_link_cost_measured(loom_link_class_t cls, const double *v)
{
    loom_link_cost_t l = loom_link_cost_builtin(cls);
    double *field[LOOM_COST_NCONST] = {&l.alpha_ns, &l.beta_ns,     &l.gamma_ns,
                                       &l.o_ns,     &l.beta_one_ns, &l.cold_ns};
    for (int k = 0; k < LOOM_COST_NCONST; k++) {
        if (!(v[k] >= 0))
            continue;
        *field[k] = loom_cost_round(v[k]);
        l.src[k] = LOOM_COST_SRC_MEASURED;
    }
    if (!(v[LOOM_COST_BETA_ONE] >= 0) || l.beta_one_ns > l.beta_ns) {
        l.beta_one_ns = l.beta_ns;
        l.src[LOOM_COST_BETA_ONE] = l.src[LOOM_COST_BETA];
    }
    return apply_env(l);
}

const char *loom_cost_src_name(loom_cost_src_t src)
{
    static const char *const names[LOOM_COST_SRC_NUM] = {"builtin", "measured", "topology", "env"};
    return (unsigned)src < LOOM_COST_SRC_NUM ? names[src] : "unknown";
}

void loom_link_cost_describe(const loom_link_cost_t *l, char *buf, size_t len)
{
    snprintf(buf, len,
             "alpha %.3g us (%s), o %.3g us (%s), beta %.3g ns/B (%s), one way %.3g ns/B (%s), "
             "gamma %.3g ns/B (%s), cold %.3g ns/B (%s)",
             l->alpha_ns / 1e3, loom_cost_src_name(l->src[LOOM_COST_ALPHA]), l->o_ns / 1e3,
             loom_cost_src_name(l->src[LOOM_COST_O]), l->beta_ns,
             loom_cost_src_name(l->src[LOOM_COST_BETA]), l->beta_one_ns,
             loom_cost_src_name(l->src[LOOM_COST_BETA_ONE]), l->gamma_ns,
             loom_cost_src_name(l->src[LOOM_COST_GAMMA]), l->cold_ns,
             loom_cost_src_name(l->src[LOOM_COST_COLD]));
}

loom_link_cost_t loom_link_cost_for_call(const loom_link_cost_t *l, const loom_cost_call_t *c)
{
    loom_link_cost_t at = *l;
    const double fits = c->cache_bytes / 2;
    if (!(l->cold_ns > 0) || !(fits > 0) || !(c->nbytes > fits))
        return at;
    const double cold = l->cold_ns * (1.0 - fits / c->nbytes);
    at.beta_ns += 2 * cold;
    at.beta_one_ns += cold;
    at.gamma_ns += cold;
    return at;
}

loom_link_cost_t loom_link_cost_shared(const loom_link_cost_t *l, double flows)
{
    loom_link_cost_t shared = *l;
    shared.beta_ns *= flows;
    shared.beta_one_ns *= flows;
    return shared;
}

double loom_link_message_ns(const loom_link_cost_t *l, double nbytes)
{
    return loom_cost_eval(l, 1, 2, nbytes, 0);
}

int loom_ring_depth(loom_link_class_t cls, int nranks)
{
    return cls == LOOM_LINK_SHM && loom_cpus_crowded(nranks) ? 1 : 4;
}

int loom_ceil_log2(int n)
{
    int k = 0;
    while ((1 << k) < n)
        k++;
    return k;
}

int loom_floor_log2(int n)
{
    int k = 0;
    while ((2 << k) <= n)
        k++;
    return k;
}

// ---- helpers --------------------------------------------------------------------

/* Rounds of at most per_round bytes, at least 1. Fractional on purpose: a
 * smooth cost keeps the choice monotone in the size (no flip-flopping between
 * two algorithms at every round boundary). */
static double rounds(double bytes, double per_round)
{
    double r = per_round > 0 ? bytes / per_round : 1.0;
    return r < 1.0 ? 1.0 : r;
}

/* Butterfly shape of n: p = 2^floor(log2 n), lg p, and whether ranks are folded. */
typedef struct {
    double p, lgp, fold;
} bfly_shape_t;

static bfly_shape_t shape(int n)
{
    int lgp = loom_floor_log2(n);
    bfly_shape_t s = {(double)(1 << lgp), (double)lgp, (1 << lgp) != n ? 1.0 : 0.0};
    return s;
}

/* How many times the busiest host link carries what one rank sends when
 * every rank sends to every other alike (the direct and pairwise
 * algorithms): the ppn ranks of a host send (n - ppn) / (n - 1) of their
 * bytes off the host, all through its link; 1 on one host (or where that is
 * less). beta is per byte of one flow, as measured between two hosts. */
static double host_share(const loom_cost_call_t *c)
{
    if (c->nhosts <= 1 || c->ppn <= 1 || c->nranks <= 1)
        return 1.0;
    const double n = c->nranks, P = c->ppn;
    return fmax(1.0, P * (n - P) / (n - 1));
}

static double ring_depth(const loom_cost_call_t *c)
{
    return c->ring_depth > 0 ? (double)c->ring_depth : 1.0;
}

// ---- AllReduce ------------------------------------------------------------------

#define RD_ROUND_SEGS 4 /* chunks per rank and recursive-doubling round (algo_rhd.c) */

/* Per round of RD_ROUND_SEGS chunks per rank: the recursive doubling
 * AllGather of the n raw contributions (lg p exchanges of doubling size; the
 * fold: a round in, all n out), then every rank reduces the n of them. */
double loom_cost_allreduce_rd(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    bfly_shape_t s = shape(c->nranks);
    double n = c->nranks, S = c->nbytes;
    double r = rounds(S, RD_ROUND_SEGS * (double)c->chunk_bytes);
    return loom_cost_eval(l, (s.lgp + 2 * s.fold) * r, (2 * s.lgp + 2 * s.fold) * r,
                          (s.p - 1) / s.p * n * S + s.fold * (S + n * S), n * S * c->acc_ratio);
}

/* Rabenseifner: recursive halving (partials) + recursive doubling (results). */
double loom_cost_allreduce_rhd(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    bfly_shape_t s = shape(c->nranks);
    double S = c->nbytes, ar = c->acc_ratio, q = (s.p - 1) / s.p;
    double r = rounds(S, s.p * (double)c->chunk_bytes);
    double steps = (2 * s.lgp + 2 * s.fold) * r;
    return loom_cost_eval(l, steps, (4 * s.lgp + 2 * s.fold) * r,
                          q * S * ar + q * S + s.fold * (S * ar + S), (q + s.fold + 1) * S * ar);
}

/* Ring: (n-1) reduce-scatter steps (partials) + (n-1) all-gather steps, one
 * message per segment of C each. */
double loom_cost_allreduce_ring(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes, ar = c->acc_ratio, q = (n - 1) / n;
    double steps = 2 * (n - 1) * rounds(S, n * ring_depth(c) * (double)c->chunk_bytes);
    double msgs = 4 * (n - 1) * rounds(S, n * (double)c->chunk_bytes);
    return loom_cost_eval(l, steps, msgs, q * S * ar + q * S, S * ar);
}

/* Two-shot: per round, n-1 raw slices to their owners, then n-1 results back. */
double loom_cost_allreduce_direct(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes, q = (n - 1) / n;
    double r = rounds(S, n * (double)c->chunk_bytes);
    return loom_cost_eval(l, 2 * r, 4 * (n - 1) * r, 2 * q * S * host_share(c), S * c->acc_ratio);
}

/* Reduce to rank 0 (n-1 messages per chunk round into it), then its broadcast:
 * the busiest rank handles 2(n-1) messages, the others 2. */
double loom_cost_allreduce_reduce_bcast(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes;
    double r = rounds(S, (double)c->chunk_bytes);
    /* Its bytes go one way at a time, but the root receives, reduces and sends in turn, chunk
     * by chunk, and that chain runs at the exchange's rate: priced at beta_one it won on paper
     * where it lost in fact (docs/ALGORITHMS.md). */
    return loom_cost_eval(l, r + 1, (n - 1) * (r + 1), 2 * (n - 1) * S, n * S * c->acc_ratio);
}

// ---- AllGather ------------------------------------------------------------------

double loom_cost_allgather_rd(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    bfly_shape_t s = shape(c->nranks);
    double n = c->nranks, S = c->nbytes;
    return loom_cost_eval(l, s.lgp + 2 * s.fold, 2 * s.lgp + 2 * s.fold,
                          (s.p - 1) / s.p * S + s.fold * (S / n + S), S / n);
}

double loom_cost_allgather_ring(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes;
    double steps = (n - 1) * rounds(S / n, ring_depth(c) * (double)c->chunk_bytes);
    double msgs = 2 * (n - 1) * rounds(S / n, (double)c->chunk_bytes);
    return loom_cost_eval(l, steps, msgs, (n - 1) / n * S, S / n);
}

double loom_cost_allgather_direct(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes;
    return loom_cost_eval(l, 1, 2 * (n - 1), (n - 1) / n * S * host_share(c), S / n);
}

// ---- ReduceScatter --------------------------------------------------------------

double loom_cost_reduce_scatter_rhd(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    bfly_shape_t s = shape(c->nranks);
    double n = c->nranks, S = c->nbytes, ar = c->acc_ratio, q = (s.p - 1) / s.p;
    double r = rounds(S / n, (double)c->chunk_bytes);
    return loom_cost_eval(l, (s.lgp + 2 * s.fold) * r, (2 * s.lgp + 2 * s.fold) * r,
                          q * S * ar + s.fold * (S * ar + S / n), (q + s.fold + 1) * S * ar);
}

double loom_cost_reduce_scatter_ring(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes, q = (n - 1) / n;
    double steps = (n - 1) * rounds(S / n, ring_depth(c) * (double)c->chunk_bytes);
    double msgs = 2 * (n - 1) * rounds(S / n, (double)c->chunk_bytes);
    return loom_cost_eval(l, steps, msgs, q * S * c->acc_ratio, S * c->acc_ratio);
}

double loom_cost_reduce_scatter_direct(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes, q = (n - 1) / n;
    double r = rounds(S / n, (double)c->chunk_bytes);
    return loom_cost_eval(l, r, 2 * (n - 1) * r, q * S * host_share(c), S * c->acc_ratio);
}

// ---- AllGatherV and ReduceScatterV -------------------------------------------------

/* The largest block of a call: max_block for the uneven collectives, S/n otherwise. */
static double largest_block(const loom_cost_call_t *c)
{
    return c->max_block > 0 ? c->max_block : c->nbytes / c->nranks;
}

/* Direct: the rank with the largest block B sends it to n-1 peers, the busiest share. */
double loom_cost_allgatherv_direct(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, B = largest_block(c);
    return loom_cost_eval(l, 1, 2 * (n - 1), (n - 1) * B * host_share(c), B);
}

/* Ring: every link carries about (n-1)/n S whatever the imbalance; the rounds follow the
 * largest block, which every step waits for. */
double loom_cost_allgatherv_ring(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes, B = largest_block(c);
    double steps = (n - 1) * rounds(B, ring_depth(c) * (double)c->chunk_bytes);
    double msgs = 2 * (n - 1) * rounds(B, (double)c->chunk_bytes);
    return loom_cost_eval(l, steps, msgs, (n - 1) / n * S, B);
}

/* Direct: the owner of the largest block B receives n-1 parts of it and reduces n. */
double loom_cost_reduce_scatterv_direct(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, B = largest_block(c);
    double r = rounds(B, (double)c->chunk_bytes);
    return loom_cost_eval(l, r, 2 * (n - 1) * r, (n - 1) * B * host_share(c), n * B * c->acc_ratio);
}

double loom_cost_reduce_scatterv_ring(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes, B = largest_block(c), q = (n - 1) / n;
    double steps = (n - 1) * rounds(B, ring_depth(c) * (double)c->chunk_bytes);
    double msgs = 2 * (n - 1) * rounds(B, (double)c->chunk_bytes);
    return loom_cost_eval(l, steps, msgs, q * S * c->acc_ratio, S * c->acc_ratio);
}

// ---- Broadcast ------------------------------------------------------------------

/* Pipelined down the tree: L steps to fill it, one more per further segment;
 * the root sends every segment to its L children. */
double loom_cost_bcast_binomial(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double L = loom_ceil_log2(c->nranks), S = c->nbytes;
    double m = rounds(S, (double)c->chunk_bytes);
    return loom_cost_eval_one_way(l, L + m - 1, L * m, 0, L * S, 0.0);
}

/* van de Geijn: the root scatters n blocks, then a ring all-gather. */
double loom_cost_bcast_scatter_allgather(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes;
    double steps = 1 + (n - 1) * rounds(S / n, ring_depth(c) * (double)c->chunk_bytes);
    double msgs = (n - 1) * (1 + 2 * rounds(S / n, (double)c->chunk_bytes));
    return loom_cost_eval_one_way(l, steps, msgs, (n - 1) / n * S, (n - 1) / n * S, 0.0);
}

double loom_cost_bcast_direct(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes;
    return loom_cost_eval_one_way(l, 1, n - 1, 0, (n - 1) * S, 0.0);
}

// ---- Reduce ---------------------------------------------------------------------

/* Pipelined up the tree; the root receives L partials per segment and
 * combines them. */
double loom_cost_reduce_binomial(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double L = loom_ceil_log2(c->nranks), S = c->nbytes, ar = c->acc_ratio;
    double m = rounds(S, (double)c->chunk_bytes);
    return loom_cost_eval_one_way(l, L + m - 1, L * m, 0, L * S * ar, (L + 1) * S * ar);
}

double loom_cost_reduce_direct(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes;
    double m = rounds(S, (double)c->chunk_bytes);
    return loom_cost_eval_one_way(l, m, (n - 1) * m, 0, (n - 1) * S, n * S * c->acc_ratio);
}

size_t loom_chain_segments(const loom_link_cost_t *l, double acc_bytes, int nranks, size_t chunk)
{
    if (acc_bytes <= 0 || nranks < 2)
        return 1;
    double least = ceil(acc_bytes / (double)(chunk ? chunk : 1));
    double per_step = l->alpha_ns + 3 * l->o_ns;
    double best = per_step > 0 ? sqrt(acc_bytes * (nranks - 1) * l->beta_ns / per_step) : least;
    double m = fmax(least, round(best));
    return m < 1 ? 1 : (size_t)m;
}

/* Pipelined along ranks 0..n-1 in m segments of partials (loom_chain_segments),
 * and on to the root: every segment takes n hops, one after another, so the
 * call is m + n - 1 steps that each move one segment, with a send and a
 * receive on the path in each (the root also receives the m results). */
double loom_cost_reduce_chain(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes, ar = c->acc_ratio;
    double m = (double)loom_chain_segments(l, S * ar, c->nranks, c->chunk_bytes);
    return loom_cost_eval(l, m + n - 1, 2 * (m + n - 1) + m, S * ar * (m + n - 1) / m, S * ar);
}

// ---- AllToAll -------------------------------------------------------------------

/* Every block travels once per set bit of its distance; packing and the two
 * rotations are local copies. */
double loom_cost_alltoall_bruck(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    const int n = c->nranks;
    double blocks = 0;
    for (int bit = 1; bit < n; bit <<= 1)
        for (int i = bit; i < n; i++)
            blocks += (i & bit) != 0;
    double bytes = blocks * c->nbytes / n;
    double steps = loom_ceil_log2(n) * rounds(c->nbytes / n, (double)c->chunk_bytes / 4);
    return loom_cost_eval(l, steps, 2 * steps, bytes, 2 * c->nbytes + 2 * bytes);
}

double loom_cost_alltoall_pairwise(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (c->nranks <= 1)
        return 0.0;
    double n = c->nranks, S = c->nbytes;
    return loom_cost_eval(l, 1, 2 * (n - 1), (n - 1) / n * S * host_share(c), S / n);
}

double loom_cost_alltoallv_pairwise(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    return c->nranks <= 1 ? 0.0 : loom_cost_eval(l, 1, 2 * (c->nranks - 1.0), 0, 0);
}

double loom_cost_only(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    (void)c;
    (void)l;
    return 0.0;
}

double loom_cost_shm_family(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    (void)c;
    return l->cls == LOOM_LINK_SHM ? 0.0 : LOOM_COST_NA;
}

double loom_cost_shm_forced(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    (void)c;
    (void)l;
    return LOOM_COST_NA;
}
