/* SPDX-License-Identifier: Apache-2.0
 *
 * mpi_alltoallv_bench.c - the MPI side of moe_perf's naive mode: replays the bytes each rank
 * sends each rank in every step's dispatch and combine, as `moe_perf --exchange FILE` wrote
 * them (the same rows, headers and trailers included), through MPI_Alltoallv of MPI_BYTE, and
 * times them as moe_perf does: a barrier before each step, each exchange's time its slowest
 * rank's, the median over the timed steps, which walk through the file's steps in turn. It
 * moves bytes only; loom's dispatch and combine also pack and unpack rows and add partials, so
 * loom / MPI compares the whole exchange with MPI's transport alone. Built by
 * bench/hosts/moe with Open MPI's mpicc; it uses nothing of loom.
 * Usage: mpi_alltoallv_bench [-w WARMUP] [-n ITERS] [-J FILE] EXCHANGE_FILE
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* getopt */
#endif
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CASES 64

typedef struct xcase {
    char label[160];
    int steps;
    long long *bytes; /* [steps][2][G][G]: dispatch then combine, row s what rank s sends */
} xcase_t;

static int g_rank, g_nranks;

static void die(const char *what, const char *arg)
{
    if (g_rank == 0)
        fprintf(stderr,
                "mpi_alltoallv_bench: %s%s\nHINT: mpi_alltoallv_bench [-w N] [-n N] [-J FILE] "
                "FILE (moe_perf --exchange FILE, written on as many ranks)\n",
                what, arg);
    MPI_Finalize();
    exit(2);
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL)
        die("out of memory", "");
    return p;
}

/* Reads every case of the file; each rank reads it itself (it is small). */
static int read_cases(const char *path, xcase_t *cases)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        die("cannot open ", path);
    int G = 0, n = 0;
    char what[32];
    if (fscanf(f, "moe-exchange v1 ranks %d %31s", &G, what) != 2)
        die("not a moe_perf --exchange file: ", path);
    if (G != g_nranks) {
        char msg[64];
        snprintf(msg, sizeof(msg), "%d ranks, run on %d: ", G, g_nranks);
        die(msg, path);
    }
    size_t GG = (size_t)G * (size_t)G;
    int k, steps;
    size_t hidden;
    char dtype[32], trace[96];
    while (fscanf(f, " case k %d hidden %zu dtype %31s trace %95s steps %d", &k, &hidden, dtype,
                  trace, &steps) == 5) {
        if (n == MAX_CASES || steps < 1 || steps > 1 << 20)
            die("too many cases or steps in ", path);
        xcase_t *c = &cases[n++];
        snprintf(c->label, sizeof(c->label), "%s k %d H %zu %s", trace, k, hidden, dtype);
        c->steps = steps;
        c->bytes = xcalloc((size_t)steps * 2 * GG, sizeof(long long));
        for (int s = 0; s < steps; s++)
            for (int p = 0; p < 2; p++) {
                int step;
                if (fscanf(f, " step %d %31s", &step, what) != 2 || step != s ||
                    strcmp(what, p ? "combine" : "dispatch") != 0)
                    die("steps out of order in ", path);
                for (size_t i = 0; i < GG; i++) {
                    long long *v = &c->bytes[((size_t)s * 2 + (size_t)p) * GG + i];
                    if (fscanf(f, "%lld", v) != 1 || *v < 0 || *v > 0x7fffffff)
                        die("a byte count is missing or beyond an int in ", path);
                }
            }
    }
    if (!feof(f) && fgetc(f) != EOF)
        die("unreadable text after the last case in ", path);
    fclose(f);
    if (n == 0)
        die("no case in ", path);
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One exchange of this rank's row of bytes (and column, received); returns its seconds. */
static double exchange(const long long *m, char *send, char *recv)
{
    int G = g_nranks, sc[G], sd[G], rc[G], rd[G];
    for (int p = 0, so = 0, ro = 0; p < G; p++) {
        sc[p] = (int)m[(size_t)g_rank * (size_t)G + (size_t)p];
        rc[p] = (int)m[(size_t)p * (size_t)G + (size_t)g_rank];
        sd[p] = so;
        rd[p] = ro;
        so += sc[p];
        ro += rc[p];
    }
    double t0 = MPI_Wtime();
    MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, MPI_COMM_WORLD);
    return MPI_Wtime() - t0;
}

/* Bytes this rank sends or receives at most in any step of c. */
static size_t buffer_bytes(const xcase_t *c)
{
    size_t G = (size_t)g_nranks, most = 0;
    for (size_t m = 0; m < (size_t)c->steps * 2; m++) {
        size_t out = 0, in = 0;
        for (size_t p = 0; p < G; p++) {
            out += (size_t)c->bytes[m * G * G + (size_t)g_rank * G + p];
            in += (size_t)c->bytes[m * G * G + p * G + (size_t)g_rank];
        }
        most = out > most ? out : most;
        most = in > most ? in : most;
    }
    return most;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_nranks);
    int warmup = 2, iters = 10, c;
    const char *json = NULL;
    while ((c = getopt(argc, argv, "w:n:J:")) != -1) {
        if (c == 'w')
            warmup = atoi(optarg);
        else if (c == 'n')
            iters = atoi(optarg);
        else if (c == 'J')
            json = optarg;
        else
            die("bad flag", "");
    }
    if (optind + 1 != argc || warmup < 0 || iters < 1)
        die("wants -w >= 0, -n >= 1 and one exchange file", "");
    static xcase_t cases[MAX_CASES];
    int ncases = read_cases(argv[optind], cases);
    size_t GG = (size_t)g_nranks * (size_t)g_nranks;
    FILE *jf = NULL;
    if (g_rank == 0) {
        if (json && (jf = fopen(json, "w")) == NULL)
            die("cannot write ", json);
        if (jf)
            fprintf(jf,
                    "{\"program\":\"mpi_alltoallv_bench\",\"nranks\":%d,\"iters\":%d,"
                    "\"results\":[",
                    g_nranks, iters);
        printf("# mpi_alltoallv_bench: %d ranks, %d warm-up and %d timed steps; MPI_Alltoallv "
               "of MPI_BYTE, times the slowest rank's, median\n",
               g_nranks, warmup, iters);
        printf("#%-40s %12s %12s %10s\n", "case", "dispatch(us)", "combine(us)", "d+c(us)");
    }
    for (int i = 0; i < ncases; i++) {
        xcase_t *x = &cases[i];
        size_t nbytes = buffer_bytes(x);
        char *send = xcalloc(nbytes, 1), *recv = xcalloc(nbytes, 1);
        memset(send, 0x5a, nbytes);
        double *t = xcalloc((size_t)iters * 3, sizeof(double));
        for (int s = 0; s < warmup + iters; s++) {
            const long long *m = x->bytes + (size_t)(s % x->steps) * 2 * GG;
            MPI_Barrier(MPI_COMM_WORLD);
            double d = exchange(m, send, recv), cb = exchange(m + GG, send, recv);
            if (s >= warmup) {
                t[(size_t)(s - warmup) * 2] = d * 1e6;
                t[(size_t)(s - warmup) * 2 + 1] = cb * 1e6;
            }
        }
        MPI_Allreduce(MPI_IN_PLACE, t, iters * 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double *col = t + (size_t)iters * 2, med[3];
        for (int p = 0; p < 3; p++) {
            for (int s = 0; s < iters; s++)
                col[s] = p < 2 ? t[(size_t)s * 2 + (size_t)p] : t[(size_t)s * 2] + t[s * 2 + 1];
            med[p] = median(col, iters);
        }
        if (g_rank == 0) {
            printf(" %-40s %12.1f %12.1f %10.1f\n", x->label, med[0], med[1], med[2]);
            if (jf)
                fprintf(jf,
                        "%s{\"case\":\"%s\",\"dispatch_us\":%.2f,\"combine_us\":%.2f,"
                        "\"dispatch_combine_us\":%.2f}",
                        i ? "," : "", x->label, med[0], med[1], med[2]);
        }
        free(send);
        free(recv);
        free(t);
        free(x->bytes);
    }
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    MPI_Finalize();
    return 0;
}
