/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_mode_prog.c - a program written against NCCL's nccl.h alone (no loom
 * header): what an application linked with -lnccl does, run through the
 * drop-in library in loom mode on host buffers with stream NULL.
 *
 *   loom_mode_prog NRANKS OUTDIR
 *
 * Forks NRANKS rank processes. Rank 0 makes the unique ids and hands them to
 * the others through pipes the parent opened before forking. Each rank runs
 * every case of loom_mode_cases.h (every collective, in place too, PreMulSum
 * with a host and a device-resident scalar, Gather, Scatter, AlltoAll, a
 * Send/Recv ring in a group) and writes its outputs to OUTDIR/nccl.RANK for
 * test_shim_loom to compare with loom's own results bit for bit. Then it
 * checks what has exact expected values itself: a split with
 * NCCL_SPLIT_NOCOLOR, a non-blocking init polled with ncclCommGetAsyncError
 * (and a call made too early refused), two communicators initialised from
 * one thread inside one group (in opposite orders on even and odd ranks, so
 * that inits run one after the other would deadlock), and the error calls.
 * Exit status 0 when every rank passed.
 */
#include <errno.h>
#include <nccl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom_mode_cases.h"
#include "prog_util.h"

#define NIDS      4
#define MAX_CASES 512

static int g_rank = -1;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d: ", g_rank);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (last error: %s)\n", ncclGetLastError(NULL));
    _exit(1);
}

#define CHECK_RES(call, want)                                                                      \
    do {                                                                                           \
        const ncclResult_t r_ = (call);                                                            \
        if (r_ != (want))                                                                          \
            die("%s:%d: %s returned %d (%s), expected %d", __FILE__, __LINE__, #call, (int)r_,     \
                ncclGetErrorString(r_), (int)(want));                                              \
    } while (0)
#define CHECK(call) CHECK_RES(call, ncclSuccess)

static void read_all(int fd, void *buf, size_t len)
{
    if (prog_read_all(fd, buf, len) != 0)
        die("pipe read failed");
}

static void write_all(int fd, const void *buf, size_t len)
{
    if (prog_write_all(fd, buf, len) != 0)
        die("pipe write failed");
}

/* ---- the cases -------------------------------------------------------------------- */

static void *alloc(size_t bytes)
{
    void *p = NULL;
    CHECK(ncclMemAlloc(&p, bytes ? bytes : 1));
    memset(p, 0xa5, bytes ? bytes : 1);
    return p;
}

static void run_case(ncclComm_t comm, int rank, int n, const lm_case_t *c, int idx, FILE *out)
{
    const size_t es = lm_dtype_size(c->dtype);
    const size_t sn = lm_send_elems(c, n), rn = lm_recv_elems(c, n);
    const ncclDataType_t dt = (ncclDataType_t)c->dtype;
    /* One allocation holds both buffers so that the in-place layouts can be laid out. */
    char *send = alloc(sn * es), *recv = alloc(rn * es);
    lm_fill(send, c->dtype, sn, idx, rank);
    ncclRedOp_t op = (ncclRedOp_t)c->op;
    unsigned char scalar[8] = {0};
    if (c->op == LM_PREMUL_HOST || c->op == LM_PREMUL_DEV) {
        lm_scalar(c->dtype, 0, scalar);
        CHECK(ncclRedOpCreatePreMulSum(
            &op, scalar, dt, c->op == LM_PREMUL_HOST ? ncclScalarHostImmediate : ncclScalarDevice,
            comm));
        if ((int)op < (int)ncclNumOps)
            die("PreMulSum op %d is below ncclNumOps", (int)op);
        /* Host immediate: read now, so this change is not seen; device: read by the call. */
        lm_scalar(c->dtype, 1, scalar);
    }
    const void *sb = send;
    void *rb = recv;
    switch (c->kind) {
    case LM_ALLREDUCE:
        if (c->inplace)
            rb = send;
        CHECK(ncclAllReduce(sb, rb, c->count, dt, op, comm, NULL));
        break;
    case LM_REDUCESCATTER:
        if (c->inplace)
            rb = send + (size_t)rank * c->count * es;
        CHECK(ncclReduceScatter(sb, rb, c->count, dt, op, comm, NULL));
        break;
    case LM_REDUCE:
        if (c->inplace)
            rb = send;
        CHECK(ncclReduce(sb, rb, c->count, dt, op, c->root, comm, NULL));
        break;
    case LM_ALLGATHER:
        if (c->inplace) {
            rb = recv;
            sb = recv + (size_t)rank * c->count * es;
            memcpy((void *)sb, send, c->count * es);
        }
        CHECK(ncclAllGather(sb, rb, c->count, dt, comm, NULL));
        break;
    case LM_BROADCAST:
        if (c->inplace) {
            rb = send;
        }
        CHECK(ncclBroadcast(sb, rb, c->count, dt, c->root, comm, NULL));
        break;
    case LM_BCAST:
        rb = send;
        CHECK(ncclBcast(rb, c->count, dt, c->root, comm, NULL));
        break;
    case LM_ALLTOALL:
        CHECK(ncclAlltoAll(sb, rb, c->count, dt, comm, NULL));
        break;
    case LM_GATHER:
        if (c->inplace && rank == c->root) {
            sb = recv + (size_t)rank * c->count * es;
            memcpy((void *)sb, send, c->count * es);
        }
        CHECK(ncclGather(sb, rb, c->count, dt, c->root, comm, NULL));
        break;
    case LM_SCATTER:
        if (c->inplace && rank == c->root)
            rb = send + (size_t)rank * c->count * es;
        CHECK(ncclScatter(sb, rb, c->count, dt, c->root, comm, NULL));
        break;
    case LM_SENDRECV:
        CHECK(ncclGroupStart());
        CHECK(ncclSend(sb, c->count, dt, (rank + 1) % n, comm, NULL));
        CHECK(ncclRecv(rb, c->count, dt, (rank + n - 1) % n, comm, NULL));
        CHECK(ncclGroupEnd());
        break;
    }
    if (c->op == LM_PREMUL_HOST || c->op == LM_PREMUL_DEV) {
        CHECK(ncclRedOpDestroy(op, comm));
        CHECK_RES(ncclRedOpDestroy(op, comm), ncclInvalidArgument);
    }
    /* What the call defines: the root's result of Reduce and Gather, everyone's otherwise. */
    size_t out_elems = rn;
    if ((c->kind == LM_REDUCE || c->kind == LM_GATHER) && rank != c->root)
        out_elems = 0;
    if (lm_record(out, idx, rb, out_elems * es) != 0)
        die("cannot write the record of case %d", idx);
    CHECK(ncclMemFree(send));
    CHECK(ncclMemFree(recv));
}

/* ---- what the program checks itself ---------------------------------------------- */

static void check_sum(ncclComm_t comm, int want_sum_of, const char *what)
{
    /* Every rank contributes (its rank in comm + 1): the sum is n(n+1)/2, exactly. */
    int n = 0, r = -1;
    CHECK(ncclCommCount(comm, &n));
    CHECK(ncclCommUserRank(comm, &r));
    if (n != want_sum_of)
        die("%s: %d ranks, expected %d", what, n, want_sum_of);
    int32_t v[3] = {r + 1, r + 1, r + 1}, got[3];
    CHECK(ncclAllReduce(v, got, 3, ncclInt32, ncclSum, comm, NULL));
    for (int i = 0; i < 3; i++)
        if (got[i] != n * (n + 1) / 2)
            die("%s: sum %d, expected %d", what, got[i], n * (n + 1) / 2);
}

static void check_split(ncclComm_t comm, int rank, int n)
{
    /* The last rank takes no part; the others split by parity, ordered by descending key. */
    const int color = rank == n - 1 && n > 2 ? NCCL_SPLIT_NOCOLOR : rank % 2;
    ncclComm_t sub = (ncclComm_t)(void *)&sub; /* must be overwritten */
    CHECK(ncclCommSplit(comm, color, -rank, &sub, NULL));
    if (color == NCCL_SPLIT_NOCOLOR) {
        if (sub != NULL)
            die("split with NCCL_SPLIT_NOCOLOR gave a communicator");
        return;
    }
    int members = 0, below = 0;
    for (int r = 0; r < n; r++) {
        const int c = r == n - 1 && n > 2 ? -1 : r % 2;
        if (c == color) {
            members++;
            below += r > rank;
        }
    }
    int sr = -1;
    CHECK(ncclCommUserRank(sub, &sr));
    if (sr != below)
        die("split: rank %d in the child, expected %d (keys descend)", sr, below);
    check_sum(sub, members, "split child");
    CHECK(ncclCommDestroy(sub));
}

static void check_nonblocking(const ncclUniqueId *id, int rank, int n, int go_rd, int go_wr)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "nonblocking";
    ncclComm_t comm = NULL;
    if (rank == 0) {
        /* Rank 0 joins only once every other rank has seen its communicator InProgress. */
        for (int i = 1; i < n; i++) {
            char b;
            read_all(go_rd, &b, 1);
        }
    }
    ncclResult_t r = ncclCommInitRankConfig(&comm, n, *id, rank, &cfg);
    if (r != ncclInProgress && r != ncclSuccess)
        die("non-blocking init returned %d", (int)r);
    if (comm == NULL)
        die("non-blocking init left *comm NULL");
    if (rank != 0) {
        /* Rank 0 has not joined: the communicator cannot be ready. */
        if (r != ncclInProgress)
            die("non-blocking init returned %d before rank 0 joined", (int)r);
        ncclResult_t state = ncclSuccess;
        CHECK(ncclCommGetAsyncError(comm, &state));
        if (state != ncclInProgress)
            die("async state %d before rank 0 joined", (int)state);
        float x = 1;
        CHECK_RES(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL), ncclInvalidUsage);
        if (strstr(ncclGetLastError(NULL), "before the previous operation") == NULL)
            die("early use: unexpected last error");
        write_all(go_wr, "g", 1);
    }
    ncclResult_t state = ncclInProgress;
    for (long spins = 0; state == ncclInProgress; spins++) {
        CHECK(ncclCommGetAsyncError(comm, &state));
        if (spins > 200000)
            die("non-blocking init still in progress after 20 s");
        if (state == ncclInProgress) {
            const struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    if (state != ncclSuccess)
        die("non-blocking init ended with %d", (int)state);
    check_sum(comm, n, "non-blocking communicator");
    CHECK(ncclCommFinalize(comm));
    CHECK(ncclCommDestroy(comm));
}

static void check_grouped_init(const ncclUniqueId ids[2], int rank, int n)
{
    ncclComm_t c[2] = {NULL, NULL};
    /* Even ranks create 0 then 1, odd ranks 1 then 0; the second uses reversed ranks. */
    CHECK(ncclGroupStart());
    for (int k = 0; k < 2; k++) {
        const int which = rank % 2 ? 1 - k : k;
        CHECK(ncclCommInitRank(&c[which], n, ids[which], which ? n - 1 - rank : rank));
    }
    CHECK(ncclGroupEnd());
    check_sum(c[0], n, "grouped init, first");
    check_sum(c[1], n, "grouped init, second");
    int r1 = -1;
    CHECK(ncclCommUserRank(c[1], &r1));
    if (r1 != n - 1 - rank)
        die("grouped init: rank %d in the second communicator, expected %d", r1, n - 1 - rank);
    CHECK(ncclCommDestroy(c[0]));
    CHECK(ncclCommDestroy(c[1]));
}

static void check_errors(ncclComm_t comm)
{
    int v = 0;
    CHECK(ncclGetVersion(&v));
    if (v != NCCL_VERSION_CODE)
        die("ncclGetVersion gave %d, expected %d", v, NCCL_VERSION_CODE);
    float x = 0;
    CHECK_RES(ncclAllReduce(&x, &x, 1, (ncclDataType_t)99, ncclSum, comm, NULL),
              ncclInvalidArgument);
    if (strstr(ncclGetLastError(NULL), "datatype") == NULL)
        die("bad datatype: last error does not say so");
    CHECK_RES(ncclAllReduce(&x, &x, 1, ncclFloat32, (ncclRedOp_t)(ncclNumOps + 7), comm, NULL),
              ncclInvalidArgument);
    if (strcmp(ncclGetErrorString(ncclInvalidUsage),
               "invalid usage (run with NCCL_DEBUG=WARN for details)") != 0)
        die("ncclGetErrorString(ncclInvalidUsage) is not NCCL's text");
}

/* ---- one rank --------------------------------------------------------------------- */

static int run_rank(int rank, int n, const char *outdir, int id_rd, const int *id_wr, int go_rd,
                    int go_wr)
{
    g_rank = rank;
    ncclUniqueId ids[NIDS];
    if (rank == 0) {
        for (int i = 0; i < NIDS; i++)
            CHECK(ncclGetUniqueId(&ids[i]));
        for (int r = 1; r < n; r++)
            write_all(id_wr[r], ids, sizeof(ids));
    } else {
        read_all(id_rd, ids, sizeof(ids));
    }
    ncclComm_t comm = NULL;
    CHECK(ncclCommInitRank(&comm, n, ids[0], rank));
    check_sum(comm, n, "world");

    char path[4096];
    snprintf(path, sizeof(path), "%s/nccl.%d", outdir, rank);
    FILE *out = fopen(path, "wb");
    if (out == NULL)
        die("cannot open %s", path);
    static lm_case_t cases[MAX_CASES];
    const int ncases = lm_cases(n, cases, MAX_CASES);
    for (int i = 0; i < ncases; i++)
        run_case(comm, rank, n, &cases[i], i, out);
    if (fclose(out) != 0)
        die("cannot write %s", path);

    check_errors(comm);
    check_split(comm, rank, n);
    check_nonblocking(&ids[1], rank, n, go_rd, go_wr);
    check_grouped_init(&ids[2], rank, n);
    CHECK(ncclCommDestroy(comm));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3 || atoi(argv[1]) < 1 || atoi(argv[1]) > 64) {
        fprintf(stderr, "usage: %s NRANKS OUTDIR\n", argv[0]);
        return 2;
    }
    const int n = atoi(argv[1]);
    int id_pipe[64][2], go[2];
    for (int r = 0; r < n; r++)
        if (pipe(id_pipe[r]) != 0)
            return 2;
    if (pipe(go) != 0)
        return 2;
    pid_t pids[64];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0)
            return 2;
        if (pids[r] == 0) {
            int wr[64];
            for (int i = 0; i < n; i++)
                wr[i] = id_pipe[i][1];
            _exit(run_rank(r, n, argv[2], id_pipe[r][0], wr, go[0], go[1]));
        }
    }
    int failed = 0;
    for (int left = n; left > 0; left--) {
        int status = 0;
        pid_t p = wait(&status);
        if (p < 0)
            return 2;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            failed = 1;
            /* A rank that failed leaves the others waiting for it: stop them. */
            for (int r = 0; r < n; r++)
                if (pids[r] != p)
                    kill(pids[r], SIGKILL);
        }
    }
    return failed;
}
