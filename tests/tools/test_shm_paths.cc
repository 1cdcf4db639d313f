// SPDX-License-Identifier: Apache-2.0
//
// test_shm_paths.cc - the shared-memory plan seen from outside: a benchmark run twice on this
// machine takes the same path for every call (LOOM_COLL_TRACE: algorithm, shm variant, copy and
// store modes, block, reasons), whatever the timings did in between; and loom_info plans for the
// machine a LOOM_TOPO_FILE describes. The programs come in LOOMRUN, LOOM_INFO and *_PERF, the
// fixtures' folder in LOOM_TOPO_FIXTURES.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

// Runs a shell command line; returns its exit status and fills out with stdout and stderr.
int Sh(const std::string &cmd, std::string *out)
{
    out->clear();
    FILE *f = popen((cmd + " 2>&1").c_str(), "r");
    if (f == nullptr)
        return -1;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        out->append(buf, n);
    const int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string Fixture(const char *name)
{
    const char *dir = getenv("LOOM_TOPO_FIXTURES");
    return std::string(dir ? dir : "tests/data/topo") + "/" + name;
}

// Each traced call's path, keyed by rank and sequence number: the trace line's message without
// its two times ("12.3 us (model 4.5 us)"), the only part that may differ between runs. (Parsed
// by hand: std::regex does not build warning-free under the sanitizers with GCC 12.)
std::map<std::string, std::string> Paths(const std::string &log)
{
    std::map<std::string, std::string> paths;
    std::istringstream in(log);
    std::string line;
    while (std::getline(in, line)) {
        const size_t info = line.find("] LOOM INFO ");
        const size_t open = info == std::string::npos ? info : line.rfind('[', info);
        if (open == std::string::npos)
            continue;
        const std::string rank = line.substr(open + 1, info - open - 1);
        std::string msg = line.substr(info + 12);
        const size_t colon = msg.find(": ");
        const size_t model = msg.find(" us (model ");
        if (colon == std::string::npos || msg.substr(0, colon).find(" seq ") == std::string::npos ||
            model == std::string::npos)
            continue;
        const size_t start = msg.rfind(' ', model - 1); // before the measured time
        const size_t close = msg.find(')', model);
        if (start == std::string::npos || close == std::string::npos)
            continue;
        paths[rank + " " + msg.substr(0, colon)] =
            msg.substr(colon + 2, start - colon - 2) + msg.substr(close + 1);
    }
    return paths;
}

std::string Run(const char *perf_var, int n, const std::string &args)
{
    const char *perf = getenv(perf_var);
    EXPECT_NE(perf, nullptr) << perf_var;
    std::string out;
    const std::string cmd = std::string("LOOM_NET=shm LOOM_COLL_TRACE=1 LOOM_DEBUG=INFO ") +
                            "LOOM_DEBUG_SUBSYS=COLL timeout 120 " + getenv("LOOMRUN") + " -n " +
                            std::to_string(n) + " " + (perf ? perf : "false") + " " + args;
    EXPECT_EQ(Sh(cmd, &out), 0) << out.substr(0, 4000);
    return out;
}

void ExpectSamePaths(const char *perf_var, int n, const std::string &args, const char *variant)
{
    const auto first = Paths(Run(perf_var, n, args));
    const auto second = Paths(Run(perf_var, n, args));
    ASSERT_GT(first.size(), 20u) << "too few traced calls";
    EXPECT_EQ(first.size(), second.size());
    int shm = 0, named = 0;
    for (const auto &[call, path] : first) {
        auto it = second.find(call);
        ASSERT_NE(it, second.end()) << call;
        EXPECT_EQ(path, it->second) << call;
        shm += path.find(" shm variant ") != std::string::npos;
        named += path.find(variant) != std::string::npos;
    }
    EXPECT_GT(shm, 0) << "no shm plan traced";
    EXPECT_GT(named, 0) << "no call ran " << variant;
}

TEST(ShmPaths, TwoRunsTakeTheSamePaths)
{
    ASSERT_TRUE(getenv("LOOMRUN"));
    // Sizes across every rule: tiny, flat, cico, single copy, streaming, several rounds. The
    // variant each must show runs on any machine: tiny at 8 B, flat at 64 B, cico below a page
    // (single copy depends on the kernel's copy and on process_vm_readv being allowed).
    ExpectSamePaths("ALL_REDUCE_PERF", 2, "-b 8 -e 8M -f 8 -n 3 -w 1 -c 1", "shm_flat");
    ExpectSamePaths("BROADCAST_PERF", 2, "-b 8 -e 8M -f 8 -n 3 -w 1 -c 1", "shm_tiny");
    ExpectSamePaths("ALL_GATHER_PERF", 3, "-b 8 -e 8M -f 8 -n 3 -w 1 -c 1", "shm_cico");
}

TEST(ShmPaths, LoomInfoPlansForTheDescribedMachine)
{
    ASSERT_TRUE(getenv("LOOM_INFO"));
    std::string small, large;
    ASSERT_EQ(Sh("LOOM_TOPO_FILE=" + Fixture("shm-small-l3.json") + " " + getenv("LOOM_INFO") +
                     " -d -c shm -n 2",
                 &small),
              0)
        << small;
    ASSERT_EQ(Sh("LOOM_TOPO_FILE=" + Fixture("shm-large-l3.json") + " " + getenv("LOOM_INFO") +
                     " -d -c shm -n 2",
                 &large),
              0)
        << large;
    EXPECT_NE(small.find("L1d 32 KiB, L2 512 KiB, L3 32768 KiB"), std::string::npos) << small;
    EXPECT_NE(large.find("L1d 48 KiB, L2 2048 KiB, L3 307200 KiB"), std::string::npos) << large;
    // Twice the L2: 1 MiB against 4 MiB.
    EXPECT_NE(small.find("streaming from 1024 KiB written"), std::string::npos) << small;
    EXPECT_NE(large.find("streaming from 4096 KiB written"), std::string::npos) << large;
    auto row = [](const std::string &text, const char *size) {
        std::istringstream in(text);
        std::string line;
        while (std::getline(in, line))
            if (line.find(std::string(" ") + size + " ") != std::string::npos &&
                line.find("shm_") != std::string::npos)
                return line;
        return std::string();
    };
    // A 512 KiB Reduce on 2 ranks: 1 MiB of copies fits half the large machine's L2 (flat) but
    // not the small one's (cico), whatever this machine's kernel copy.
    const std::string s512 = row(small, "512 KiB"), l512 = row(large, "512 KiB");
    ASSERT_FALSE(s512.empty()) << small;
    ASSERT_FALSE(l512.empty()) << large;
    EXPECT_NE(s512, l512) << small << large;
    EXPECT_NE(l512.find("shm_flat"), std::string::npos) << large;
}

} // namespace
