// SPDX-License-Identifier: Apache-2.0
//
// test_echo.cc - Echo through the library (include/loom_echo.h), on forked ranks: the error of
// one call stays bounded and flat in the rank count; every rank gets the same bytes; each value is
// quantized at most twice (the counters add up to exactly one first quantization per non-owner
// contribution and one per sum); the bytes on the wire match the format; the feedback telescopes
// (the outputs over K calls sum to the exact sums up to the last residual) and so bounds the
// accumulated error, across calls and down a 128-layer residual stream, where no feedback lets it
// grow; the per-host variant over modelled hosts; streams, in place, segments; bad arguments.
// Inputs are Gaussian from fixed seeds (printed on failure). Run by meson's 'echo' suite.

#include <unistd.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loom.h"
#include "loom_echo.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

using loomtest::RunOptions;

// The measured errors reach the test's own output: rank 0 appends lines to a file the test made
// before forking, and the test prints it when the ranks are done.
std::string g_report;

struct Report {
    Report()
    {
        char path[] = "/tmp/loom-echo-report-XXXXXX";
        const int fd = mkstemp(path);
        if (fd >= 0) {
            close(fd);
            g_report = path;
        }
    }
    ~Report()
    {
        if (g_report.empty())
            return;
        if (FILE *f = std::fopen(g_report.c_str(), "r")) {
            char line[512];
            while (std::fgets(line, sizeof(line), f))
                std::printf("%s", line);
            std::fclose(f);
        }
        unlink(g_report.c_str());
        g_report.clear();
    }
};

__attribute__((format(printf, 2, 3))) void Say(int rank, const char *fmt, ...)
{
    if (rank != 0 || g_report.empty())
        return;
    FILE *f = std::fopen(g_report.c_str(), "a");
    if (f == nullptr)
        return;
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(f, fmt, ap);
    va_end(ap);
    std::fclose(f);
}

// The seed of rank r's input of call t; failure messages name the calls, this names the seeds.
uint64_t Seed(int rank, uint64_t call)
{
    return 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1) + call * 7919u + 17u;
}

std::string Seeds(uint64_t first_call, uint64_t last_call)
{
    return " (inputs: std::mt19937_64 seeded with Seed(rank, call), calls " +
           std::to_string(first_call) + ".." + std::to_string(last_call) + "; rank 0 call " +
           std::to_string(first_call) + ": seed " + std::to_string(Seed(0, first_call)) + ")";
}

// Rank r's input of call t: N(0,1) values (or one fixed vector when constant), with optional
// outlier channels (2 of every 512 scaled by 50, as LLM activations have).
std::vector<float> Input(int rank, uint64_t call, size_t n, bool outliers = false)
{
    std::mt19937_64 gen(Seed(rank, call));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        v[i] = dist(gen);
        if (outliers && i % 512 < 2)
            v[i] *= 50.0f;
    }
    return v;
}

// The exact sum over ranks, in double.
std::vector<double> ExactSum(int nranks, uint64_t call, size_t n, bool outliers = false)
{
    std::vector<double> s(n, 0.0);
    for (int r = 0; r < nranks; r++) {
        const std::vector<float> x = Input(r, call, n, outliers);
        for (size_t i = 0; i < n; i++)
            s[i] += x[i];
    }
    return s;
}

double Norm(const std::vector<double> &v)
{
    double s = 0;
    for (double x : v)
        s += x * x;
    return std::sqrt(s);
}

double RelErr(const std::vector<double> &got, const std::vector<double> &want)
{
    std::vector<double> d(got.size());
    for (size_t i = 0; i < got.size(); i++)
        d[i] = got[i] - want[i];
    return Norm(d) / Norm(want);
}

// Every rank's bytes equal rank 0's (through an all-gather of the output).
void CheckSameEverywhere(const void *out, size_t bytes, int nranks, loomComm_t comm)
{
    std::vector<unsigned char> all(bytes * (size_t)nranks);
    XT_CHECK_LOOM(loomAllGather(out, all.data(), bytes, loomUint8, comm, nullptr));
    for (int r = 1; r < nranks; r++)
        XT_CHECK_MSG(std::memcmp(all.data(), all.data() + (size_t)r * bytes, bytes) == 0,
                     "rank " + std::to_string(r) + "'s output differs from rank 0's");
}

uint64_t SumOverRanks(uint64_t v, loomComm_t comm)
{
    uint64_t s = 0;
    XT_CHECK_LOOM(loomAllReduce(&v, &s, 1, loomUint64, loomSum, comm, nullptr));
    return s;
}

// Runs one float32 call of n values and returns this rank's relative error; checks that every
// rank has the same bytes.
double OneCall(int rank, int nranks, loomComm_t comm, size_t n, uint64_t call)
{
    const std::vector<float> x = Input(rank, call, n);
    std::vector<float> y(n);
    XT_CHECK_LOOM(loomEchoAllReduce(x.data(), y.data(), n, loomFloat32, comm, nullptr, nullptr));
    CheckSameEverywhere(y.data(), n * 4, nranks, comm);
    return RelErr(std::vector<double>(y.begin(), y.end()), ExactSum(nranks, call, n));
}

// Ranks modelled as hosts of ranks_per_host each (LOOM_HOST_ID): shm inside, tcp between.
RunOptions HostGroups(int ranks_per_host)
{
    RunOptions o;
    o.rank_env = [ranks_per_host](int rank) {
        return loomtest::EnvList{{"LOOM_HOST_ID", "host" + std::to_string(rank / ranks_per_host)}};
    };
    o.deadline_s = 120;
    return o;
}

} // namespace

TEST(Echo, OneCallErrorIsBoundedAndEqualOnEveryRank)
{
    Report report;
    for (int nranks : {2, 3, 4, 5, 6, 7, 8}) {
        SCOPED_TRACE("ranks " + std::to_string(nranks));
        RunOptions o;
        o.deadline_s = 120;
        XT_ASSERT_RUN(loomtest::RunRanks(
            nranks,
            [](int rank, int n, loomComm_t comm) {
                // Sizes: one value, a partial block, a partial tile, a count not divisible by
                // the ranks, and several tiles per rank.
                for (size_t count : {1ul, 31ul, 2049ul, 100003ul, 65536ul * 4}) {
                    const double err = OneCall(rank, n, comm, count, count);
                    Say(rank, "echo ranks %d count %zu: relative error %.4f\n", n, count, err);
                    XT_CHECK_MSG(err <= 0.16,
                                 "relative error " + std::to_string(err) + Seeds(count, count));
                }
            },
            o));
    }
}

// float16 and bfloat16 inputs and outputs: the same bound against the exact sum of the rounded
// inputs, and the same bytes everywhere.
TEST(Echo, HalfPrecisionInputs)
{
    Report report;
    XT_ASSERT_RUN(loomtest::RunRanks(3, [](int rank, int n, loomComm_t comm) {
        const size_t count = 50001;
        for (loomDataType_t dt : {loomBfloat16, loomFloat16}) {
            auto to = [dt](float f) {
                return dt == loomBfloat16 ? loomtest::RefFloatToBf16(f)
                                          : loomtest::RefFloatToHalf(f);
            };
            auto from = [dt](uint16_t h) {
                return dt == loomBfloat16 ? loomtest::RefBf16ToFloat(h)
                                          : loomtest::RefHalfToFloat(h);
            };
            const std::vector<float> x = Input(rank, 5, count);
            std::vector<uint16_t> xh(count), yh(count);
            for (size_t i = 0; i < count; i++)
                xh[i] = to(x[i]);
            XT_CHECK_LOOM(
                loomEchoAllReduce(xh.data(), yh.data(), count, dt, comm, nullptr, nullptr));
            CheckSameEverywhere(yh.data(), count * 2, n, comm);
            std::vector<double> want(count, 0.0), got(count);
            for (int r = 0; r < n; r++) {
                const std::vector<float> xr = Input(r, 5, count);
                for (size_t i = 0; i < count; i++)
                    want[i] += from(to(xr[i]));
            }
            for (size_t i = 0; i < count; i++)
                got[i] = from(yh[i]);
            const double err = RelErr(got, want);
            Say(rank, "echo %s: relative error %.4f\n", dt == loomBfloat16 ? "bfloat16" : "float16",
                err);
            XT_CHECK_MSG(err <= 0.16, "relative error " + std::to_string(err) + Seeds(5, 5));
        }
    }));
}

TEST(Echo, AtMostTwoQuantizationsAndTheWireBytes)
{
    Report report;
    for (int nranks : {2, 4}) {
        XT_ASSERT_RUN(loomtest::RunRanks(nranks, [](int rank, int n, loomComm_t comm) {
            // One tile-aligned chunk per rank: the wire bytes are exactly the format's.
            const size_t count = (size_t)n * 2048 * 8;
            loomEchoCounters_t c0, c1;
            XT_CHECK_LOOM(loomEchoGetCounters(comm, &c0));
            (void)OneCall(rank, n, comm, count, 1);
            XT_CHECK_LOOM(loomEchoGetCounters(comm, &c1));
            XT_CHECK_EQ(c1.calls - c0.calls, 1u);
            const uint64_t q1 = SumOverRanks(c1.values_sent_q4 - c0.values_sent_q4, comm);
            const uint64_t q2 = SumOverRanks(c1.values_owner_q4 - c0.values_owner_q4, comm);
            // Each non-owner contribution quantized once, each sum once: P values per element,
            // so none is quantized more than twice on its way (a ring would re-quantize sums).
            XT_CHECK_EQ(q1, (uint64_t)(n - 1) * count);
            XT_CHECK_EQ(q2, (uint64_t)count);
            const uint64_t want = 2ull * (uint64_t)(n - 1) * (count / 2048) * 1152 / (uint64_t)n;
            XT_CHECK_EQ(c1.bytes_sent - c0.bytes_sent, want);
            // An uneven count costs at most one partial tile per peer and direction.
            const size_t odd = count + 777;
            XT_CHECK_LOOM(loomEchoGetCounters(comm, &c0));
            (void)OneCall(rank, n, comm, odd, 2);
            XT_CHECK_LOOM(loomEchoGetCounters(comm, &c1));
            const double ideal = 2.0 * (n - 1) / n * (double)odd / 2048.0 * 1152.0;
            const double got = (double)(c1.bytes_sent - c0.bytes_sent);
            XT_CHECK_MSG(got >= ideal * 0.9 && got <= ideal + 2.0 * (n - 1) * 1152,
                         "bytes " + std::to_string(got) + " vs " + std::to_string(ideal));
        }));
    }
}

// E5: sum of outputs over K calls = sum of exact sums + E_0 - E_K.
TEST(Echo, FeedbackTelescopes)
{
    Report report;
    XT_ASSERT_RUN(loomtest::RunRanks(4, [](int rank, int n, loomComm_t comm) {
        const size_t count = 20000;
        const int K = 200;
        loomEchoState_t st = nullptr;
        XT_CHECK_LOOM(loomEchoCreate(comm, count, loomFloat32, &st));
        std::vector<double> sum_y(count, 0.0), sum_s(count, 0.0), s1;
        std::vector<float> y(count);
        for (int t = 0; t < K; t++) {
            const std::vector<float> x = Input(rank, 1000 + t, count);
            XT_CHECK_LOOM(
                loomEchoAllReduce(x.data(), y.data(), count, loomFloat32, comm, st, nullptr));
            const std::vector<double> s = ExactSum(n, 1000 + t, count);
            if (t == 0)
                s1 = s;
            for (size_t i = 0; i < count; i++)
                sum_y[i] += y[i], sum_s[i] += s[i];
        }
        std::vector<float> res(count), total(count);
        XT_CHECK_LOOM(loomEchoResidual(st, res.data()));
        XT_CHECK_LOOM(
            loomAllReduce(res.data(), total.data(), count, loomFloat32, loomSum, comm, nullptr));
        std::vector<double> d(count);
        for (size_t i = 0; i < count; i++)
            d[i] = sum_y[i] - sum_s[i] + total[i]; /* E_0 = 0 */
        const double gap = Norm(d) / Norm(s1);
        Say(rank, "echo telescoping over %d calls: %.2e\n", K, gap);
        XT_CHECK_MSG(gap <= 1e-5, "telescoping gap " + std::to_string(gap) + Seeds(1000, 1199));
        XT_CHECK_LOOM(loomEchoDestroy(st));
    }));
}

// E6/E7: ||S_K - T_K|| / ||one call's exact sum|| with and without feedback, K = 200, 8 ranks.
TEST(Echo, FeedbackBoundsTheAccumulatedError)
{
    Report report;
    RunOptions o;
    o.deadline_s = 240;
    XT_ASSERT_RUN(loomtest::RunRanks(
        8,
        [](int rank, int n, loomComm_t comm) {
            const size_t count = 8192;
            const int K = 200;
            for (int fresh = 0; fresh < 2; fresh++) {
                for (int fb = 0; fb < 2; fb++) {
                    loomEchoState_t st = nullptr;
                    if (fb)
                        XT_CHECK_LOOM(loomEchoCreate(comm, count, loomFloat32, &st));
                    std::vector<double> acc(count, 0.0), s1;
                    std::vector<float> y(count);
                    double worst = 0;
                    for (int t = 0; t < K; t++) {
                        const uint64_t call = fresh ? 5000 + (uint64_t)t : 5000;
                        const std::vector<float> x = Input(rank, call, count);
                        XT_CHECK_LOOM(loomEchoAllReduce(x.data(), y.data(), count, loomFloat32,
                                                        comm, st, nullptr));
                        const std::vector<double> s = ExactSum(n, call, count);
                        if (t == 0)
                            s1 = s;
                        for (size_t i = 0; i < count; i++)
                            acc[i] += y[i] - s[i];
                        const double e = Norm(acc) / Norm(s1);
                        worst = e > worst ? e : worst;
                    }
                    const double last = Norm(acc) / Norm(s1);
                    Say(rank, "echo K=%d %s inputs, feedback %s: worst %.3f, at K %.3f\n", K,
                        fresh ? "fresh" : "constant", fb ? "on" : "off", worst, last);
                    if (fb)
                        XT_CHECK_MSG(worst <= 0.2,
                                     "with feedback " + std::to_string(worst) + Seeds(5000, 5199));
                    else
                        XT_CHECK_MSG(last >= (fresh ? 1.0 : 10.0),
                                     "without feedback only " + std::to_string(last));
                    XT_CHECK_LOOM(loomEchoDestroy(st));
                }
            }
        },
        o));
}

// E8: a residual stream h += AllReduce(x_l) down L layers with one state for the stream.
TEST(Echo, ResidualStreamErrorDoesNotGrowWithDepth)
{
    Report report;
    RunOptions o;
    o.deadline_s = 240;
    XT_ASSERT_RUN(loomtest::RunRanks(
        8,
        [](int rank, int n, loomComm_t comm) {
            const size_t count = 8192;
            double err[2][3] = {};
            for (int fb = 0; fb < 2; fb++) {
                loomEchoState_t st = nullptr;
                if (fb)
                    XT_CHECK_LOOM(loomEchoCreate(comm, count, loomFloat32, &st));
                std::vector<double> h(count, 0.0), h_exact(count, 0.0), ar1;
                std::vector<float> y(count);
                int m = 0;
                for (int layer = 1; layer <= 128; layer++) {
                    const std::vector<float> x = Input(rank, 90000 + (uint64_t)layer, count, true);
                    XT_CHECK_LOOM(loomEchoAllReduce(x.data(), y.data(), count, loomFloat32, comm,
                                                    st, nullptr));
                    const std::vector<double> s = ExactSum(n, 90000 + (uint64_t)layer, count, true);
                    if (layer == 1)
                        ar1 = s;
                    std::vector<double> d(count);
                    for (size_t i = 0; i < count; i++) {
                        h[i] += y[i];
                        h_exact[i] += s[i];
                        d[i] = h[i] - h_exact[i];
                    }
                    if (layer == 8 || layer == 32 || layer == 128)
                        err[fb][m++] = Norm(d) / Norm(ar1);
                }
                XT_CHECK_LOOM(loomEchoDestroy(st));
            }
            Say(rank,
                "echo residual stream error at 8/32/128 layers: feedback off %.3f "
                "%.3f %.3f, on %.3f %.3f %.3f\n",
                err[0][0], err[0][1], err[0][2], err[1][0], err[1][1], err[1][2]);
            for (int m = 0; m < 3; m++)
                XT_CHECK_MSG(err[1][m] <= 0.25,
                             "with feedback " + std::to_string(err[1][m]) + Seeds(90001, 90128));
            XT_CHECK(err[1][2] / err[1][1] <= 1.2);
            XT_CHECK(err[0][2] / err[0][1] >= 1.6);
        },
        o));
}

TEST(Echo, PerHostVariantOverModelledHosts)
{
    Report report;
    struct Case {
        int ranks, per_host;
    };
    for (Case cs : {Case{4, 2}, Case{6, 3}, Case{6, 2}}) {
        SCOPED_TRACE(std::to_string(cs.ranks) + " ranks, " + std::to_string(cs.per_host) +
                     " per host");
        const int per_host = cs.per_host;
        XT_ASSERT_RUN(loomtest::RunRanks(
            cs.ranks,
            [per_host](int rank, int n, loomComm_t comm) {
                const int hosts = n / per_host;
                for (size_t count : {7ul, 100003ul}) {
                    loomEchoCounters_t c0, c1;
                    XT_CHECK_LOOM(loomEchoGetCounters(comm, &c0));
                    const double err = OneCall(rank, n, comm, count, 77 + count);
                    XT_CHECK_LOOM(loomEchoGetCounters(comm, &c1));
                    Say(rank, "echo %d hosts x %d ranks, count %zu: relative error %.4f\n", hosts,
                        per_host, count, err);
                    XT_CHECK_MSG(err <= 0.16, "relative error " + std::to_string(err) +
                                                  Seeds(77 + count, 77 + count));
                    XT_CHECK_EQ(c1.hierarchical - c0.hierarchical, 1u);
                    // Exact inside hosts (every rank sends the other slices); one first
                    // quantization per other host's contribution.
                    XT_CHECK_EQ(SumOverRanks(c1.values_sent_q4 - c0.values_sent_q4, comm),
                                (uint64_t)(hosts - 1) * count);
                    XT_CHECK_EQ(SumOverRanks(c1.values_owner_q4 - c0.values_owner_q4, comm),
                                (uint64_t)count);
                    XT_CHECK_EQ(SumOverRanks(c1.values_exact - c0.values_exact, comm),
                                (uint64_t)hosts * (uint64_t)(per_host - 1) * count);
                }
            },
            HostGroups(per_host)));
    }
}

TEST(Echo, FlatWhenAskedOrWhenHostsDiffer)
{
    Report report;
    RunOptions o = HostGroups(2);
    o.env = {{"LOOM_ECHO_HIER", "0"}};
    XT_ASSERT_RUN(loomtest::RunRanks(
        4,
        [](int rank, int n, loomComm_t comm) {
            loomEchoCounters_t c;
            XT_CHECK(OneCall(rank, n, comm, 5000, 3) <= 0.16);
            XT_CHECK_LOOM(loomEchoGetCounters(comm, &c));
            XT_CHECK_EQ(c.hierarchical, 0u);
            XT_CHECK_EQ(c.values_exact, 0u);
        },
        o));
    // Three ranks on two hosts (2 + 1): uneven, so flat.
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t comm) {
            loomEchoCounters_t c;
            XT_CHECK(OneCall(rank, n, comm, 5000, 4) <= 0.16);
            XT_CHECK_LOOM(loomEchoGetCounters(comm, &c));
            XT_CHECK_EQ(c.hierarchical, 0u);
        },
        HostGroups(2)));
}

// Segments only schedule the work: any segment size gives the same bytes.
TEST(Echo, SegmentsDoNotChangeTheResult)
{
    Report report;
    for (int per_host : {1, 2}) {
        RunOptions o = per_host > 1 ? HostGroups(per_host) : RunOptions();
        XT_ASSERT_RUN(loomtest::RunRanks(
            4,
            [](int rank, int n, loomComm_t comm) {
                (void)n;
                const size_t count = 4 * 2048 * 5 + 123;
                const std::vector<float> x = Input(rank, 9, count);
                std::vector<float> a(count), b(count);
                loomEchoState_t st = nullptr;
                XT_CHECK_LOOM(loomEchoCreate(comm, count, loomFloat32, &st));
                XT_CHECK_LOOM(
                    loomEchoAllReduce(x.data(), a.data(), count, loomFloat32, comm, st, nullptr));
                XT_CHECK_LOOM(
                    loomEchoAllReduce(x.data(), a.data(), count, loomFloat32, comm, st, nullptr));
                std::vector<float> ra(count);
                XT_CHECK_LOOM(loomEchoResidual(st, ra.data()));
                setenv("LOOM_ECHO_SEGMENT", "2048", 1);
                loomEchoState_t st2 = nullptr;
                XT_CHECK_LOOM(loomEchoCreate(comm, count, loomFloat32, &st2));
                XT_CHECK_LOOM(
                    loomEchoAllReduce(x.data(), b.data(), count, loomFloat32, comm, st2, nullptr));
                XT_CHECK_LOOM(
                    loomEchoAllReduce(x.data(), b.data(), count, loomFloat32, comm, st2, nullptr));
                std::vector<float> rb(count);
                XT_CHECK_LOOM(loomEchoResidual(st2, rb.data()));
                XT_CHECK(std::memcmp(a.data(), b.data(), count * 4) == 0);
                XT_CHECK(std::memcmp(ra.data(), rb.data(), count * 4) == 0);
                XT_CHECK_LOOM(loomEchoDestroy(st));
                XT_CHECK_LOOM(loomEchoDestroy(st2));
            },
            o));
    }
}

// Queued on a stream, in place, the state destroyed while calls still hold it.
TEST(Echo, StreamsAndInPlace)
{
    Report report;
    XT_ASSERT_RUN(loomtest::RunRanks(2, [](int rank, int n, loomComm_t comm) {
        const size_t count = 30000;
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        loomEchoState_t st = nullptr, ref = nullptr;
        XT_CHECK_LOOM(loomEchoCreate(comm, count, loomFloat32, &st));
        XT_CHECK_LOOM(loomEchoCreate(comm, count, loomFloat32, &ref));
        std::vector<std::vector<float>> bufs, want(3, std::vector<float>(count));
        for (int t = 0; t < 3; t++)
            bufs.push_back(Input(rank, 300 + (uint64_t)t, count));
        for (int t = 0; t < 3; t++)
            XT_CHECK_LOOM(
                loomEchoAllReduce(bufs[t].data(), bufs[t].data(), count, loomFloat32, comm, st, s));
        XT_CHECK_LOOM(loomEchoDestroy(st)); /* the queued calls keep it alive */
        XT_CHECK_LOOM(loomStreamSynchronize(s));
        for (int t = 0; t < 3; t++) {
            const std::vector<float> x = Input(rank, 300 + (uint64_t)t, count);
            XT_CHECK_LOOM(loomEchoAllReduce(x.data(), want[t].data(), count, loomFloat32, comm, ref,
                                            nullptr));
            XT_CHECK(std::memcmp(bufs[t].data(), want[t].data(), count * 4) == 0);
        }
        CheckSameEverywhere(bufs[2].data(), count * 4, n, comm);
        XT_CHECK_LOOM(loomEchoDestroy(ref));
        XT_CHECK_LOOM(loomStreamDestroy(s));
    }));
}

TEST(Echo, BadArguments)
{
    Report report;
    XT_ASSERT_RUN(loomtest::RunRanks(2, [](int rank, int n, loomComm_t comm) {
        (void)rank;
        (void)n;
        std::vector<float> x(100), y(100);
        loomEchoState_t st = nullptr;
        XT_CHECK_LOOM_RES(loomEchoCreate(comm, 100, loomInt32, &st), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomEchoCreate(comm, 100, loomFloat32, nullptr), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomEchoCreate(nullptr, 100, loomFloat32, &st), loomInvalidArgument);
        // A state whose residuals (4 bytes a value) could not fit any address space.
        XT_CHECK_LOOM_RES(loomEchoCreate(comm, size_t{1} << 55, loomFloat32, &st),
                          loomInvalidArgument);
        XT_CHECK_MSG(std::string(loomGetLastError(comm)).find("2^56") != std::string::npos,
                     loomGetLastError(comm));
        XT_CHECK_LOOM(loomEchoCreate(comm, 100, loomFloat32, &st));
        XT_CHECK_LOOM_RES(
            loomEchoAllReduce(x.data(), y.data(), 100, loomInt32, comm, nullptr, nullptr),
            loomInvalidArgument);
        XT_CHECK_LOOM_RES(
            loomEchoAllReduce(x.data(), y.data(), 100, loomFloat64, comm, nullptr, nullptr),
            loomInvalidArgument);
        XT_CHECK_LOOM_RES(
            loomEchoAllReduce(nullptr, y.data(), 100, loomFloat32, comm, nullptr, nullptr),
            loomInvalidArgument);
        XT_CHECK_LOOM_RES(
            loomEchoAllReduce(x.data(), x.data() + 1, 50, loomFloat32, comm, nullptr, nullptr),
            loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomEchoAllReduce(x.data(), y.data(), 99, loomFloat32, comm, st, nullptr),
                          loomInvalidArgument);
        XT_CHECK_LOOM_RES(
            loomEchoAllReduce(x.data(), y.data(), 50, loomBfloat16, comm, st, nullptr),
            loomInvalidArgument);
        XT_CHECK_LOOM_RES(
            loomEchoAllReduce(x.data(), y.data(), 100, loomFloat32, nullptr, st, nullptr),
            loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomEchoResidual(st, nullptr), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomEchoGetCounters(comm, nullptr), loomInvalidArgument);
        // Nothing moved: count 0 is a valid call, and the communicator still works.
        XT_CHECK_LOOM(loomEchoAllReduce(nullptr, nullptr, 0, loomFloat32, comm, nullptr, nullptr));
        XT_CHECK_LOOM(loomEchoAllReduce(x.data(), y.data(), 100, loomFloat32, comm, st, nullptr));
        XT_CHECK_LOOM(loomEchoReset(st));
        std::vector<float> r(100, 1.0f);
        XT_CHECK_LOOM(loomEchoResidual(st, r.data()));
        for (float v : r)
            XT_CHECK(v == 0.0f);
        XT_CHECK_LOOM(loomEchoDestroy(st));
        XT_CHECK_LOOM(loomEchoDestroy(nullptr));
    }));
}
