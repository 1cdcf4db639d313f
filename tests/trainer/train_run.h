// SPDX-License-Identifier: Apache-2.0
//
// train_run.h - what the trainer suites share: running loom-train through loomrun on the tiny
// model and reading back its losses, summary, counters, memory and final parameters, and
// comparing two runs. The programs' paths come in LOOMRUN and LOOM_TRAIN.
#ifndef LOOM_TESTS_TRAIN_RUN_H
#define LOOM_TESTS_TRAIN_RUN_H

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The tiny model every test trains: L2 C32 H4 T16, batch 8, 5 steps, one validation batch.
constexpr int kL = 2, kC = 32, kV = 256, kT = 16, kSteps = 5;
const std::string kModel = "--layers 2 --d 32 --heads 4 --ctx 16 --batch 8 --val-batches 1";

inline size_t EmbFloats()
{
    return size_t(kV) * kC + size_t(kT) * kC;
}
inline size_t BlockFloats()
{
    return 4 * size_t(kC) + 12 * size_t(kC) * kC;
}
inline size_t GlobalFloats()
{
    return EmbFloats() + kL * BlockFloats() + 2 * kC;
}

inline std::string TmpDir()
{
    static std::string dir;
    if (dir.empty()) {
        const char *t = getenv("TMPDIR");
        std::string templ = std::string(t ? t : "/tmp") + "/loomtrain.XXXXXX";
        std::vector<char> buf(templ.begin(), templ.end());
        buf.push_back('\0');
        if (!mkdtemp(buf.data()))
            return "/tmp";
        dir = buf.data();
    }
    return dir;
}

inline std::string Slurp(const std::string &path)
{
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// One finished loom-train run.
struct TrainRun {
    int rc = -1;
    std::string log;            // stdout and stderr
    std::vector<double> losses; // per step
    std::string summary;        // the JSON summary line
    std::vector<float> params;  // the final global parameter vector
    std::string name;
};

// The number under key; NAN where it is absent or null (loom-train writes a non-finite loss as
// null), never the 0 that strtod makes of "null", which would pass for a finite, low loss.
inline double JsonNum(const std::string &line, const std::string &key)
{
    size_t p = line.find("\"" + key + "\":");
    if (p == std::string::npos)
        return NAN;
    const char *s = line.c_str() + p + key.size() + 3;
    char *end;
    double x = strtod(s, &end);
    return end == s ? NAN : x;
}

// "purpose.kind":[calls,bytes] from the summary; {0, 0} when absent.
inline std::pair<double, double> Comm(const TrainRun &r, const std::string &key)
{
    size_t p = r.summary.find("\"" + key + "\":[");
    if (p == std::string::npos)
        return {0, 0};
    const char *s = r.summary.c_str() + p + key.size() + 4;
    char *end;
    double calls = strtod(s, &end);
    double bytes = strtod(end + 1, nullptr);
    return {calls, bytes};
}

// The summary's array of per-rank rows under key, `width` numbers a row.
inline std::vector<std::vector<double>> SummaryRows(const TrainRun &r, const std::string &key,
                                                    int width)
{
    std::vector<std::vector<double>> out;
    const std::string tag = "\"" + key + "\":[";
    size_t p = r.summary.find(tag);
    if (p == std::string::npos)
        return out;
    const char *s = r.summary.c_str() + p + tag.size();
    while (*s == '[' || *s == ',') {
        if (*s == ',') {
            s++;
            continue;
        }
        s++;
        std::vector<double> row;
        char *end;
        for (int i = 0; i < width; i++) {
            row.push_back(strtod(s, &end));
            s = end + 1;
        }
        out.push_back(row);
    }
    return out;
}

// Per rank: {params, grads, optimizer, peak temporaries, activations (bytes), local floats}.
inline std::vector<std::vector<double>> Mem(const TrainRun &r)
{
    return SummaryRows(r, "mem", 6);
}

inline TrainRun Train(const std::string &name, int nranks, const std::string &args,
                      const std::string &extra_env = "")
{
    TrainRun r;
    r.name = name;
    const char *loomrun = getenv("LOOMRUN"), *train = getenv("LOOM_TRAIN");
    if (!loomrun || !train) {
        ADD_FAILURE() << "LOOMRUN and LOOM_TRAIN must name the programs";
        return r;
    }
    std::string d = TmpDir() + "/" + name;
    std::string cmd = extra_env + " timeout 300 " + loomrun + " -n " + std::to_string(nranks) +
                      " " + train + " " + kModel + " --steps " + std::to_string(kSteps) +
                      " --quiet --log-json " + d + ".json --dump-params " + d + ".bin " + args +
                      " > " + d + ".log 2>&1";
    int st = system(cmd.c_str());
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.log = Slurp(d + ".log");
    std::istringstream js(Slurp(d + ".json"));
    for (std::string line; std::getline(js, line);) {
        if (line.find("\"summary\"") != std::string::npos)
            r.summary = line;
        else if (line.find("\"step\"") != std::string::npos)
            r.losses.push_back(JsonNum(line, "loss"));
    }
    std::string bin = Slurp(d + ".bin");
    r.params.resize(bin.size() / sizeof(float));
    if (!r.params.empty())
        memcpy(r.params.data(), bin.data(), r.params.size() * sizeof(float));
    return r;
}

// The single-process run every mode is compared with (and one with matching accumulation), with
// the options `opts` (e.g. another optimizer) besides.
inline const TrainRun &Reference(int micro = 1, const std::string &opts = "")
{
    static std::map<std::string, TrainRun> refs;
    const std::string key = opts + "--micro " + std::to_string(micro);
    if (!refs.count(key))
        refs[key] = Train("ref" + std::to_string(micro) +
                              (opts.empty() ? "" : "-" + std::to_string(refs.size())),
                          1, key);
    return refs[key];
}

struct Diff {
    double loss_rel = 0;  // worst relative loss difference over the steps
    double param_rel = 0; // ||a - b|| / ||b|| over the parameter vector
    double param_abs = 0; // max |a - b|
    bool bitwise = false;
};

inline Diff Compare(const TrainRun &a, const TrainRun &b)
{
    Diff d;
    for (size_t i = 0; i < a.losses.size() && i < b.losses.size(); i++)
        d.loss_rel =
            std::max(d.loss_rel, std::fabs(a.losses[i] - b.losses[i]) / std::fabs(b.losses[i]));
    double num = 0, den = 0;
    for (size_t i = 0; i < a.params.size() && i < b.params.size(); i++) {
        double e = double(a.params[i]) - double(b.params[i]);
        num += e * e;
        den += double(b.params[i]) * b.params[i];
        d.param_abs = std::max(d.param_abs, std::fabs(e));
    }
    d.param_rel = den > 0 ? std::sqrt(num / den) : INFINITY;
    d.bitwise = a.params.size() == b.params.size() &&
                memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)) == 0;
    return d;
}

// A double with every bit (%.17g reads back to the same value), for failure messages.
inline std::string Exact(double x)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%.17g", x);
    return buf;
}

// The run finished and produced every step and the full parameter vector (of `floats` floats).
// Run r against the single-process ref: prints the differences, checks them against the 1e-5
// bound of trainer/README.md and, when first_bitwise, that the first loss is bitwise equal.
inline void ExpectAsOneProcess(const TrainRun &r, const TrainRun &ref, const char *name,
                               bool first_bitwise)
{
    Diff d = Compare(r, ref);
    printf("[ measured ] %-14s loss rel %.2e  params rel %.2e  max abs %.2e%s\n", name, d.loss_rel,
           d.param_rel, d.param_abs, d.bitwise ? "  (bitwise)" : "");
    if (first_bitwise) {
        EXPECT_EQ(memcmp(&r.losses[0], &ref.losses[0], sizeof(double)), 0)
            << name << " first loss " << Exact(r.losses[0]) << ", one process "
            << Exact(ref.losses[0]);
    }
    EXPECT_LE(d.loss_rel, 1e-5);
    EXPECT_LE(d.param_rel, 1e-5);
    EXPECT_LE(d.param_abs, 1e-5);
}

inline ::testing::AssertionResult Complete(const TrainRun &r, size_t floats = GlobalFloats())
{
    if (r.rc != 0)
        return ::testing::AssertionFailure() << r.name << " exited " << r.rc << ":\n" << r.log;
    if (r.losses.size() != size_t(kSteps) || r.params.size() != floats || r.summary.empty())
        return ::testing::AssertionFailure()
               << r.name << ": " << r.losses.size() << " steps, " << r.params.size()
               << " parameters (want " << floats << ")\n"
               << r.log;
    for (double l : r.losses)
        if (!std::isfinite(l))
            return ::testing::AssertionFailure() << r.name << ": a loss is not finite";
    return ::testing::AssertionSuccess();
}

inline bool Near(double x, double want, double slack)
{
    return std::fabs(x - want) <= slack;
}

} // namespace

#endif
