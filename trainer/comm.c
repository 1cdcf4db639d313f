/* SPDX-License-Identifier: Apache-2.0
 *
 * comm.c - loom-train's grid of communicators (TP, CP, data = DP x CP, the pipeline's
 * neighbours, the tied-embedding pair, and for MoE the EP group and the experts' replicas) and the
 * one place every collective goes through, so that each call is counted (calls and bytes per
 * purpose and kind) and its wait is timed.
 */
#include "train.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

double tc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tc_check(loomResult_t r, const tcomm_t *c, const char *what)
{
    if (r == loomSuccess)
        return;
    if (r == loomRemoteError && c && c->recover) {
        c->recover->what = what;
        c->recover->t = tc_now();
        fprintf(stderr, "loom-train: rank %d: %s failed: %s: %s; recovering (--elastic)\n", c->rank,
                what, loomGetErrorString(r), loomGetLastError(c->world));
        longjmp(c->recover->jb, 1);
    }
    fprintf(stderr, "loom-train: rank %d: %s failed: %s: %s\n", c ? c->rank : -1, what,
            loomGetErrorString(r), loomGetLastError(c ? c->world : NULL));
    exit(1);
}

static int grid_rank(const grid_pos_t *g, int dp_i, int pp_i, int cp_i, int tp_i)
{
    return tp_i + g->tp * (cp_i + g->cp * (dp_i + g->dp * pp_i));
}

int tc_init(tcomm_t *c, const opts_t *o)
{
    /* Without a launcher, one process: a world of one rank. */
    const char *launched[] = {"LOOM_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"};
    int any = 0;
    for (size_t i = 0; i < sizeof(launched) / sizeof(launched[0]); i++)
        any |= getenv(launched[i]) != NULL;
    if (any) {
        tc_check(loomCommInitFromEnv(&c->world), NULL, "loomCommInitFromEnv");
    } else {
        loomUniqueId id;
        tc_check(loomGetUniqueId(&id), NULL, "loomGetUniqueId");
        tc_check(loomCommInitRank(&c->world, 1, id, 0), NULL, "loomCommInitRank");
    }
    return tc_grid(c, o);
}

int tc_grid(tcomm_t *c, const opts_t *o)
{
    loomCommUserRank(c->world, &c->rank);
    loomCommCount(c->world, &c->size);
    grid_pos_t *g = &c->g;
    g->tp = o->tp, g->pp = o->pp, g->cp = o->cp;
    g->dp = o->dp > 0 ? o->dp : c->size / (o->tp * o->pp * o->cp);
    if (g->dp < 1 || g->dp * g->tp * g->pp * g->cp != c->size) {
        /* every rank says it: the launcher may stop the others as soon as one exits */
        fprintf(
            stderr,
            "loom-train: rank %d: dp %d x --tp %d x --pp %d x --cp (or --sp) %d must equal the %d "
            "ranks\n",
            c->rank, g->dp, o->tp, o->pp, o->cp, c->size);
        loomCommDestroy(c->world);
        return -1;
    }
    g->ep = o->ep > 0 ? o->ep : 1;
    if (g->dp % g->ep) {
        fprintf(stderr, "loom-train: rank %d: --ep %d must divide the data-parallel degree %d\n",
                c->rank, g->ep, g->dp);
        loomCommDestroy(c->world);
        return -1;
    }
    int r = c->rank;
    g->tp_i = r % g->tp;
    r /= g->tp;
    g->cp_i = r % g->cp;
    r /= g->cp;
    g->dp_i = r % g->dp;
    g->pp_i = r / g->dp;
    c->data_rank = g->cp_i + g->cp * g->dp_i;
    c->data_size = g->cp * g->dp;
    tc_check(loomCommSplit(c->world, g->cp_i + g->cp * (g->dp_i + g->dp * g->pp_i), g->tp_i, &c->tp,
                           NULL),
             c, "split tp");
    tc_check(loomCommSplit(c->world, g->tp_i + g->tp * (g->dp_i + g->dp * g->pp_i), g->cp_i, &c->cp,
                           NULL),
             c, "split cp");
    tc_check(loomCommSplit(c->world, g->tp_i + g->tp * g->pp_i, c->data_rank, &c->data, NULL), c,
             "split data");
    /* EP inside the data group (Megatron's expert parallelism; main.c allows ep > 1 only when
     * the data group is the world): EP groups of consecutive ranks, and the replicas of the same
     * experts, one rank of each EP group. */
    g->ep_i = g->dp_i % g->ep;
    c->edp = c->data;
    c->edp_rank = c->data_rank;
    if (o->model.moe_e > 0)
        tc_check(loomCommSplit(c->world, c->rank / g->ep, g->ep_i, &c->ep, NULL), c, "split ep");
    if (g->ep > 1) {
        tc_check(loomCommSplit(c->world, g->ep_i, c->rank / g->ep, &c->edp, NULL), c, "split edp");
        c->edp_rank = c->rank / g->ep;
    }
    int edge = g->pp > 1 && (g->pp_i == 0 || g->pp_i == g->pp - 1);
    tc_check(
        loomCommSplit(c->world,
                      edge ? g->tp_i + g->tp * (g->cp_i + g->cp * g->dp_i) : LOOM_SPLIT_NOCOLOR,
                      g->pp_i, &c->tie, NULL),
        c, "split tie");
    c->pp_prev = g->pp_i > 0 ? grid_rank(g, g->dp_i, g->pp_i - 1, g->cp_i, g->tp_i) : -1;
    c->pp_next = g->pp_i < g->pp - 1 ? grid_rank(g, g->dp_i, g->pp_i + 1, g->cp_i, g->tp_i) : -1;
    c->cp_next = (g->cp_i + 1) % g->cp;
    c->cp_prev = (g->cp_i + g->cp - 1) % g->cp;
    c->use_echo = o->tp_reduce == TP_ECHO;
    tc_check(loomStreamCreate(&c->stream), c, "loomStreamCreate");
    return 0;
}

void tc_free(tcomm_t *c)
{
    if (c->echo)
        loomEchoDestroy(c->echo);
    loomStreamDestroy(c->stream);
    if (c->edp != c->data)
        loomCommDestroy(c->edp);
    loomCommDestroy(c->ep);
    loomCommDestroy(c->tie);
    loomCommDestroy(c->data);
    loomCommDestroy(c->cp);
    loomCommDestroy(c->tp);
    loomCommDestroy(c->world);
}

static int comm_size(loomComm_t comm)
{
    int n = 1;
    loomCommCount(comm, &n);
    return n;
}

static void count(tcomm_t *c, int p, int k, size_t bytes)
{
    if (p == P_DATA && c->kill_after > 0 && --c->kill_after == 0)
        raise(SIGKILL); /* --elastic-kill-rank: a test's rank dies here */
    c->calls[p][k]++;
    c->bytes[p][k] += bytes;
}

void tc_allreduce(tcomm_t *c, int p, loomComm_t comm, float *buf, size_t n, loomStream_t s)
{
    if (comm_size(comm) == 1)
        return;
    count(c, p, K_ALLREDUCE, n * sizeof(float));
    double t = tc_now();
    tc_check(loomAllReduce(buf, buf, n, loomFloat32, loomSum, comm, s), c, "loomAllReduce");
    if (!s)
        c->comm_s += tc_now() - t;
}

void tc_allreduce_d(tcomm_t *c, int p, loomComm_t comm, double *buf, size_t n)
{
    if (comm_size(comm) == 1)
        return;
    count(c, p, K_ALLREDUCE, n * sizeof(double));
    double t = tc_now();
    tc_check(loomAllReduce(buf, buf, n, loomFloat64, loomSum, comm, NULL), c, "loomAllReduce");
    c->comm_s += tc_now() - t;
}

void tc_reduce_scatter(tcomm_t *c, int p, loomComm_t comm, const float *send, float *recv,
                       size_t recvcount, loomStream_t s)
{
    count(c, p, K_REDUCESCATTER, recvcount * sizeof(float) * (size_t)comm_size(comm));
    double t = tc_now();
    tc_check(loomReduceScatter(send, recv, recvcount, loomFloat32, loomSum, comm, s), c,
             "loomReduceScatter");
    if (!s)
        c->comm_s += tc_now() - t;
}

static void allgather(tcomm_t *c, int p, loomComm_t comm, const void *send, void *recv,
                      size_t sendcount, loomDataType_t dt, size_t elem)
{
    count(c, p, K_ALLGATHER, sendcount * elem * (size_t)comm_size(comm));
    double t = tc_now();
    tc_check(loomAllGather(send, recv, sendcount, dt, comm, NULL), c, "loomAllGather");
    c->comm_s += tc_now() - t;
}

void tc_allgather(tcomm_t *c, int p, loomComm_t comm, const float *send, float *recv,
                  size_t sendcount)
{
    allgather(c, p, comm, send, recv, sendcount, loomFloat32, sizeof(float));
}

void tc_allgather_d(tcomm_t *c, int p, loomComm_t comm, const double *send, double *recv,
                    size_t sendcount)
{
    allgather(c, p, comm, send, recv, sendcount, loomFloat64, sizeof(double));
}

void tc_tp_forward(tcomm_t *c, float *buf, size_t n, int eval)
{
    if (c->g.tp == 1)
        return;
    if (eval || !c->use_echo) {
        tc_allreduce(c, P_TP, c->tp, buf, n, NULL);
        return;
    }
    if (!c->echo) {
        tc_check(loomEchoCreate(c->tp, n, loomFloat32, &c->echo), c, "loomEchoCreate");
        c->echo_count = n;
    }
    if (n != c->echo_count) {
        fprintf(stderr, "loom-train: Echo state made for %zu values, called with %zu\n",
                c->echo_count, n);
        exit(1);
    }
    count(c, P_TP, K_ECHO, n * sizeof(float));
    double t = tc_now();
    tc_check(loomEchoAllReduce(buf, buf, n, loomFloat32, c->tp, c->echo, NULL), c,
             "loomEchoAllReduce");
    c->comm_s += tc_now() - t;
}

void tc_tp_backward(tcomm_t *c, float *buf, size_t n)
{
    tc_allreduce(c, P_TP, c->tp, buf, n, NULL);
}

void tc_exchange(tcomm_t *c, int p, loomComm_t comm, int to, const float *s1, const float *s2,
                 int from, float *r1, float *r2, size_t n)
{
    double t = tc_now();
    tc_check(loomGroupStart(), c, "loomGroupStart");
    const float *sends[2] = {s1, s2};
    float *recvs[2] = {r1, r2};
    for (int i = 0; i < 2; i++) {
        if (sends[i]) {
            count(c, p, K_SEND, n * sizeof(float));
            tc_check(loomSend(sends[i], n, loomFloat32, to, comm, NULL), c, "loomSend");
        }
        if (recvs[i]) {
            count(c, p, K_RECV, n * sizeof(float));
            tc_check(loomRecv(recvs[i], n, loomFloat32, from, comm, NULL), c, "loomRecv");
        }
    }
    tc_check(loomGroupEnd(), c, "loomGroupEnd");
    c->comm_s += tc_now() - t;
}

void tc_alltoall(tcomm_t *c, int p, loomComm_t comm, const float *send, float *recv, size_t n)
{
    count(c, p, K_ALLTOALL, n * sizeof(float) * (size_t)comm_size(comm));
    double t = tc_now();
    tc_check(loomAllToAll(send, recv, n, loomFloat32, comm, NULL), c, "loomAllToAll");
    c->comm_s += tc_now() - t;
}

void tc_pp(tcomm_t *c, int to, const float *send, size_t sn, int from, float *recv, size_t rn)
{
    if ((to < 0 || !send) && (from < 0 || !recv))
        return;
    double t = tc_now();
    tc_check(loomGroupStart(), c, "loomGroupStart");
    if (to >= 0 && send) {
        count(c, P_PP, K_SEND, sn * sizeof(float));
        tc_check(loomSend(send, sn, loomFloat32, to, c->world, NULL), c, "loomSend");
    }
    if (from >= 0 && recv) {
        count(c, P_PP, K_RECV, rn * sizeof(float));
        tc_check(loomRecv(recv, rn, loomFloat32, from, c->world, NULL), c, "loomRecv");
    }
    tc_check(loomGroupEnd(), c, "loomGroupEnd");
    double dt = tc_now() - t;
    c->comm_s += dt;
    c->pp_wait_s += dt;
}

void tc_pp_many(tcomm_t *c, const tc_p2p_t *ops, int n)
{
    if (n <= 0)
        return;
    double t = tc_now();
    tc_check(loomGroupStart(), c, "loomGroupStart");
    for (int i = 0; i < n; i++) {
        count(c, P_PP, ops[i].send ? K_SEND : K_RECV, ops[i].n * sizeof(float));
        if (ops[i].send)
            tc_check(loomSend(ops[i].buf, ops[i].n, loomFloat32, ops[i].peer, c->world, NULL), c,
                     "loomSend");
        else
            tc_check(loomRecv(ops[i].buf, ops[i].n, loomFloat32, ops[i].peer, c->world, NULL), c,
                     "loomRecv");
    }
    tc_check(loomGroupEnd(), c, "loomGroupEnd");
    double dt = tc_now() - t;
    c->comm_s += dt;
    c->pp_wait_s += dt;
}

void tc_stream_sync(tcomm_t *c)
{
    double t = tc_now();
    tc_check(loomStreamSynchronize(c->stream), c, "loomStreamSynchronize");
    c->comm_s += tc_now() - t;
}
