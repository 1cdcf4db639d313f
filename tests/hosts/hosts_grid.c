/* SPDX-License-Identifier: Apache-2.0
 *
 * hosts_grid.c - every collective of loom.h, checked exactly, for the multi-host tests
 * (tests/hosts/run): AllReduce (sum, max; float, int32, bfloat16), AllGather, ReduceScatter,
 * Broadcast and Reduce from every root, AllToAll, AllToAllv, a Send/Recv ring and Barrier, at
 * 8 B, 64 KiB and 4 MiB per rank (and with --big 16 MiB + 12 B, which the hierarchical
 * algorithms cut in several rounds), AllReduce in place (float avg) and AllGather and
 * ReduceScatter in place too, and AllToAllv with blocks from 0 B to 1 MiB mixed (on both sides
 * of the hierarchical AllToAllv's small-block limit). Values are small integers, so every sum is
 * exact in every order and datatype. Prints "grid ok: N checks" on rank 0; exits 1 with the first
 * wrong value.
 * With --expect-hier ran|fallback (for LOOM_ALGO=hier) each rank also traces its calls
 * (LOOM_COLL_TRACE into a file of its own, then copied to stderr) and checks that every call of a
 * collective with a hierarchical row traced "algo hier", and that the hierarchy itself ran (its
 * buffer was allocated: "ran") or that it fell back to the flat algorithms ("fallback": hosts of
 * unequal sizes), rather than trusting the exit status alone; --expect-chain does the same for
 * AllReduce's hier_chain (LOOM_ALGO=allreduce:hier_chain). With --order, AllReduce,
 * ReduceScatter and Reduce of random floats at every size are checked bit for bit against the
 * sum in rank order.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom.h"

static int g_rank, g_n;
static long g_checks;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        loomResult_t r_ = (call);                                                                  \
        if (r_ != loomSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s: %s (%s)\n", g_rank, #call, loomGetErrorString(r_),       \
                    loomGetLastError(NULL));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void expect(double got, double want, const char *what, size_t count, size_t i)
{
    g_checks++;
    if (got != want) {
        fprintf(stderr, "rank %d: %s count %zu: element %zu is %g, want %g\n", g_rank, what, count,
                i, got, want);
        exit(1);
    }
}

/* The value rank r contributes at index i: a small integer. */
static int val(int r, size_t i)
{
    return (int)((i * 7 + (size_t)r * 13) % 31) - 15;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact for small integers */
}
static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void allreduce(loomComm_t c, size_t n)
{
    float *f = malloc(n * 4), *fo = malloc(n * 4);
    int32_t *k = malloc(n * 4), *ko = malloc(n * 4);
    uint16_t *b = malloc(n * 2), *bo = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)val(g_rank, i);
        k[i] = val(g_rank, i);
        b[i] = to_bf16((float)val(g_rank, i));
    }
    CHECK(loomAllReduce(f, fo, n, loomFloat32, loomSum, c, NULL));
    CHECK(loomAllReduce(k, ko, n, loomInt32, loomMax, c, NULL));
    CHECK(loomAllReduce(b, bo, n, loomBfloat16, loomSum, c, NULL));
    CHECK(loomAllReduce(f, f, n, loomFloat32, loomAvg, c, NULL)); /* in place */
    for (size_t i = 0; i < n; i++) {
        int sum = 0, max = -1000;
        for (int r = 0; r < g_n; r++) {
            sum += val(r, i);
            max = val(r, i) > max ? val(r, i) : max;
        }
        expect(fo[i], sum, "AllReduce float sum", n, i);
        expect(ko[i], max, "AllReduce int32 max", n, i);
        expect(from_bf16(bo[i]), sum, "AllReduce bfloat16 sum", n, i);
        expect(f[i], (float)sum / (float)g_n, "AllReduce float avg in place", n, i);
    }
    free(f), free(fo), free(k), free(ko), free(b), free(bo);
}

static void gather_scatter(loomComm_t c, size_t n)
{
    size_t all = n * (size_t)g_n;
    float *s = malloc(all * 4), *o = malloc(all * 4);
    for (size_t i = 0; i < all; i++)
        s[i] = (float)val(g_rank, i);
    CHECK(loomAllGather(s, o, n, loomFloat32, c, NULL));
    for (int r = 0; r < g_n; r++)
        for (size_t i = 0; i < n; i++)
            expect(o[(size_t)r * n + i], val(r, i), "AllGather", n, (size_t)r * n + i);
    /* In place: AllGather's input is this rank's block of the output, ReduceScatter's
     * output is this rank's block of the input. */
    float *ip = malloc(all * 4);
    for (size_t i = 0; i < n; i++)
        ip[(size_t)g_rank * n + i] = s[i];
    CHECK(loomAllGather(ip + (size_t)g_rank * n, ip, n, loomFloat32, c, NULL));
    for (size_t i = 0; i < all; i++)
        expect(ip[i], o[i], "AllGather in place", n, i);
    CHECK(loomReduceScatter(s, o, n, loomFloat32, loomSum, c, NULL));
    for (size_t i = 0; i < n; i++) {
        int sum = 0;
        for (int r = 0; r < g_n; r++)
            sum += val(r, (size_t)g_rank * n + i);
        expect(o[i], sum, "ReduceScatter", n, i);
    }
    memcpy(ip, s, all * 4);
    CHECK(loomReduceScatter(ip, ip + (size_t)g_rank * n, n, loomFloat32, loomSum, c, NULL));
    for (size_t i = 0; i < n; i++)
        expect(ip[(size_t)g_rank * n + i], o[i], "ReduceScatter in place", n, i);
    free(ip);
    CHECK(loomAllToAll(s, o, n, loomFloat32, c, NULL));
    for (int r = 0; r < g_n; r++)
        for (size_t i = 0; i < n; i++)
            expect(o[(size_t)r * n + i], val(r, (size_t)g_rank * n + i), "AllToAll", n, i);
    /* AllToAllv: rank r sends j+1 (mod n+1) elements of block j to rank j */
    size_t *sc = malloc((size_t)g_n * sizeof(size_t)), *sd = malloc((size_t)g_n * sizeof(size_t));
    size_t *rc = malloc((size_t)g_n * sizeof(size_t)), *rd = malloc((size_t)g_n * sizeof(size_t));
    for (int j = 0; j < g_n; j++) {
        sc[j] = ((size_t)j + (size_t)g_rank + 1) % (n + 1);
        sd[j] = (size_t)j * n;
        rc[j] = ((size_t)g_rank + (size_t)j + 1) % (n + 1);
        rd[j] = (size_t)j * n;
    }
    CHECK(loomAllToAllv(s, sc, sd, o, rc, rd, loomFloat32, c, NULL));
    for (int r = 0; r < g_n; r++)
        for (size_t i = 0; i < rc[r]; i++)
            expect(o[rd[r] + i], val(r, (size_t)g_rank * n + i), "AllToAllv", n, i);
    free(sc), free(sd), free(rc), free(rd), free(s), free(o);
}

/* Mixed AllToAllv: rank s sends rank d v_count(s, d, salt) floats, 0, 3, 1000 or 2^18 + 5
 * (0 B, 12 B, 4000 B, 1 MiB + 20 B), so that blocks on both sides of the hierarchical
 * algorithm's small-block limit cross between hosts, and a pair's two directions often differ.
 * Three salts give every rank of the hosts suite's layouts each kind to and from another host. */
static size_t v_count(int s, int d, int salt)
{
    static const size_t sizes[] = {0, 3, 1000, (1u << 18) + 5};
    return sizes[(size_t)(s + 2 * d + s * d + salt) % 4];
}

/* Where rank s's block for rank d starts in its sendbuff: in rank order, one float apart. */
static size_t v_sdispl(int s, int d, int salt)
{
    size_t at = 0;
    for (int j = 0; j < d; j++)
        at += v_count(s, j, salt) + 1;
    return at;
}

static void alltoallv_mixed(loomComm_t c, int salt)
{
    size_t *sc = malloc((size_t)g_n * sizeof(size_t)), *sd = malloc((size_t)g_n * sizeof(size_t));
    size_t *rc = malloc((size_t)g_n * sizeof(size_t)), *rd = malloc((size_t)g_n * sizeof(size_t));
    const size_t stotal = v_sdispl(g_rank, g_n, salt);
    size_t rtotal = 0;
    for (int j = g_n - 1; j >= 0; j--) { /* received blocks in reverse rank order, gaps between */
        rc[j] = v_count(j, g_rank, salt);
        rd[j] = rtotal;
        rtotal += rc[j] + 1;
    }
    for (int j = 0; j < g_n; j++) {
        sc[j] = v_count(g_rank, j, salt);
        sd[j] = v_sdispl(g_rank, j, salt);
    }
    float *s = malloc(stotal * 4), *o = malloc(rtotal * 4);
    for (size_t i = 0; i < stotal; i++)
        s[i] = (float)val(g_rank, i);
    for (size_t i = 0; i < rtotal; i++)
        o[i] = -99;
    CHECK(loomAllToAllv(s, sc, sd, o, rc, rd, loomFloat32, c, NULL));
    for (int r = 0; r < g_n; r++) {
        const size_t from = v_sdispl(r, g_rank, salt);
        for (size_t i = 0; i < rc[r]; i++)
            expect(o[rd[r] + i], val(r, from + i), "AllToAllv mixed", rc[r], i);
        expect(o[rd[r] + rc[r]], -99, "AllToAllv mixed: the gap after a block", rc[r], rc[r]);
    }
    for (size_t i = 0; i < stotal; i++)
        expect(s[i], val(g_rank, i), "AllToAllv mixed: sendbuff unchanged", stotal, i);
    free(sc), free(sd), free(rc), free(rd), free(s), free(o);
}

static void rooted(loomComm_t c, size_t n)
{
    float *s = malloc(n * 4), *o = malloc(n * 4);
    for (int root = 0; root < g_n; root++) {
        for (size_t i = 0; i < n; i++)
            s[i] = (float)val(g_rank, i), o[i] = -99;
        CHECK(loomBroadcast(s, o, n, loomFloat32, root, c, NULL));
        for (size_t i = 0; i < n; i++)
            expect(o[i], val(root, i), "Broadcast", n, i);
        CHECK(loomReduce(s, o, n, loomFloat32, loomSum, root, c, NULL));
        for (size_t i = 0; g_rank == root && i < n; i++) {
            int sum = 0;
            for (int r = 0; r < g_n; r++)
                sum += val(r, i);
            expect(o[i], sum, "Reduce", n, i);
        }
    }
    /* a ring of Send/Recv, in a group */
    int next = (g_rank + 1) % g_n, prev = (g_rank + g_n - 1) % g_n;
    for (size_t i = 0; i < n; i++)
        s[i] = (float)val(g_rank, i);
    CHECK(loomGroupStart());
    CHECK(loomSend(s, n, loomFloat32, next, c, NULL));
    CHECK(loomRecv(o, n, loomFloat32, prev, c, NULL));
    CHECK(loomGroupEnd());
    for (size_t i = 0; i < n; i++)
        expect(o[i], val(prev, i), "Send/Recv ring", n, i);
    CHECK(loomBarrier(c, NULL));
    free(s), free(o);
}

/* ---- rank order ---- */

/* splitmix64 */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Rank r's value at index i: a random sign, 24-bit mantissa and exponent in [-6, 6], so that
 * float32 sums of such values round differently in every order but rank order. */
static float rval(int r, size_t i)
{
    const uint64_t h = mix(((uint64_t)r << 48) ^ (uint64_t)i);
    const float m = 1.0f + (float)(h >> 41) / 8388608.0f;
    return ((h & 1) ? -m : m) * ldexpf(1.0f, (int)((h >> 4) % 13) - 6);
}

/* ((x0 + x1) + x2) ... + x[n-1] at index i, as include/loom.h promises. */
static float rank_order_sum(size_t i)
{
    float acc = rval(0, i);
    for (int r = 1; r < g_n; r++)
        acc += rval(r, i);
    return acc;
}

static void expect_bits(float got, float want, const char *what, size_t n, size_t i)
{
    g_checks++;
    if (memcmp(&got, &want, sizeof(got)) != 0) {
        fprintf(stderr, "rank %d: %s count %zu: element %zu is %.9g, the rank-order sum %.9g\n",
                g_rank, what, n, i, got, want);
        exit(1);
    }
}

/* AllReduce, ReduceScatter and Reduce (root n-1) of random floats, bit for bit against the sum
 * in rank order (--order): what LOOM_DETERMINISTIC=1 promises on every algorithm and layout. */
static void rank_order(loomComm_t c, size_t n)
{
    const size_t all = n * (size_t)g_n;
    float *s = malloc(all * 4), *o = malloc(all * 4);
    for (size_t i = 0; i < all; i++)
        s[i] = rval(g_rank, i);
    CHECK(loomAllReduce(s, o, n, loomFloat32, loomSum, c, NULL));
    for (size_t i = 0; i < n; i++)
        expect_bits(o[i], rank_order_sum(i), "AllReduce in rank order", n, i);
    CHECK(loomReduceScatter(s, o, n, loomFloat32, loomSum, c, NULL));
    for (size_t i = 0; i < n; i++)
        expect_bits(o[i], rank_order_sum((size_t)g_rank * n + i), "ReduceScatter in rank order", n,
                    i);
    CHECK(loomReduce(s, o, n, loomFloat32, loomSum, g_n - 1, c, NULL));
    for (size_t i = 0; g_rank == g_n - 1 && i < n; i++)
        expect_bits(o[i], rank_order_sum(i), "Reduce in rank order", n, i);
    free(s), free(o);
}

/* ---- which algorithm ran (--expect-hier, --expect-chain) ---- */

static char g_trace[256]; /* this rank's log file; "" when not tracing */

static void trace_start(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(g_trace, sizeof(g_trace), "%s/loom-hosts-grid-%d.log", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    const char *sub = getenv("LOOM_DEBUG_SUBSYS");
    char subsys[256];
    snprintf(subsys, sizeof(subsys), "%s%sCOLL,ALLOC", sub ? sub : "", sub && *sub ? "," : "");
    setenv("LOOM_COLL_TRACE", "1", 1);
    setenv("LOOM_DEBUG", "INFO", 1);
    setenv("LOOM_DEBUG_SUBSYS", subsys, 1);
    setenv("LOOM_DEBUG_FILE", g_trace, 1);
}

/* The collectives with a "hier" row (docs/ALGORITHMS.md), as the trace names them. */
static int has_hier_row(const char *coll, size_t len)
{
    static const char *const names[] = {"allreduce", "reducescatter", "allgather",
                                        "broadcast", "alltoall",      "alltoallv"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strlen(names[i]) == len && strncmp(coll, names[i], len) == 0)
            return 1;
    return 0;
}

/* Reads the trace back (copying it to stderr) and checks it; exits 1 on a wrong algorithm.
 * chain: AllReduce alone must have run hier_chain (--expect-chain); else every collective with
 * a hier row must have run hier. */
static void trace_check(int want_ran, int chain)
{
    FILE *f = fopen(g_trace, "r");
    if (f == NULL) {
        fprintf(stderr, "rank %d: no trace in %s\n", g_rank, g_trace);
        exit(1);
    }
    char line[1024];
    long hier = 0, other = 0, buffers = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        fputs(line, stderr);
        const char *info = strstr(line, "LOOM INFO "), *seq = strstr(line, " seq ");
        if (strstr(line, "hierarchical collective buffer is now") != NULL)
            buffers++;
        if (info == NULL || seq == NULL || strstr(line, " algo ") == NULL)
            continue;
        const char *coll = info + 10;
        const size_t len = (size_t)(seq - coll);
        if (chain ? len != 9 || strncmp(coll, "allreduce", 9) != 0 : !has_hier_row(coll, len))
            continue;
        if (strstr(line, chain ? " algo hier_chain " : " algo hier ") != NULL) {
            hier++;
        } else if (other++ == 0) {
            fprintf(stderr, "rank %d: LOOM_ALGO=%s, but: %s", g_rank,
                    chain ? "allreduce:hier_chain" : "hier", line);
        }
    }
    fclose(f);
    unlink(g_trace);
    const int ok = hier > 0 && other == 0 && (want_ran ? buffers > 0 : buffers == 0);
    fprintf(stderr,
            "rank %d: %ld calls traced %s, %ld another algorithm; the hierarchy's buffer "
            "allocated %ld times (%s expected)\n",
            g_rank, hier, chain ? "hier_chain" : "hier", other, buffers,
            want_ran ? "the hierarchy" : "the flat fallback");
    if (!ok)
        exit(1);
}

int main(int argc, char **argv)
{
    int big = 0, order = 0, chain = 0, expect_hier = -1; /* -1: not checked; 1: ran; 0: fell back */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--big") == 0) {
            big = 1;
        } else if (strcmp(argv[i], "--order") == 0) {
            order = 1;
        } else if ((strcmp(argv[i], "--expect-hier") == 0 ||
                    strcmp(argv[i], "--expect-chain") == 0) &&
                   i + 1 < argc &&
                   (strcmp(argv[i + 1], "ran") == 0 || strcmp(argv[i + 1], "fallback") == 0)) {
            chain = strcmp(argv[i], "--expect-chain") == 0;
            expect_hier = strcmp(argv[++i], "ran") == 0;
        } else {
            fprintf(stderr, "usage: hosts_grid [--big] [--order] "
                            "[--expect-hier|--expect-chain ran|fallback]\n");
            return 2;
        }
    }
    if (expect_hier >= 0)
        trace_start();
    loomComm_t c;
    CHECK(loomCommInitFromEnv(&c));
    loomCommUserRank(c, &g_rank);
    loomCommCount(c, &g_n);
    /* 8 B, 64 KiB and 4 MiB of float32, and 16 MiB + 12 B with --big */
    const size_t counts[] = {2, 16384, 1 << 20, (1 << 22) + 3};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]) - (big ? 0 : 1); k++) {
        allreduce(c, counts[k]);
        gather_scatter(c, counts[k] / (size_t)g_n + 1);
        rooted(c, counts[k]);
        if (order)
            rank_order(c, counts[k] + 1);
    }
    for (int salt = 0; salt < 3; salt++)
        alltoallv_mixed(c, salt);
    CHECK(loomCommDestroy(c));
    if (expect_hier >= 0)
        trace_check(expect_hier, chain);
    if (g_rank == 0)
        printf("grid ok: %d ranks, %ld checks\n", g_n, g_checks);
    return 0;
}
