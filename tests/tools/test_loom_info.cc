// SPDX-License-Identifier: Apache-2.0
//
// test_loom_info.cc - loom_info's decision table (-d), run as a subprocess (its path comes in
// the LOOM_INFO environment variable): on the shm link class every collective shows the shm
// variant that its plan runs at each size (shm_tiny up to a 48-byte input per rank, shm_flat
// for small all-reduces and reduces, shm_cico above), and on tcp a modelled algorithm with its
// predicted time. And -v's device section: the runtime LOOM_DEVICE picks (the emulation, none,
// or what this machine gives), the CUDA runtime with each GPU, the emulation, and the three
// device transports with what each needs and why it cannot run (LOOM_INFO_CUDA=1 says the
// build has the cuda feature). Run by meson's 'tools' suite.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace {

// Runs loom_info with args (env: "NAME=value" settings before it); returns its standard output
// ("" if it could not run) and sets *status to its wait status.
std::string RunInfo(const std::string &args, int *status, const std::string &env = "")
{
    const char *path = getenv("LOOM_INFO");
    *status = -1;
    if (path == nullptr)
        return "";
    const std::string cmd = env + " " + std::string(path) + " " + args + " 2>&1";
    FILE *f = popen(cmd.c_str(), "r");
    if (f == nullptr)
        return "";
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        out.append(buf, n);
    *status = pclose(f);
    return out;
}

// The row of the table whose size column is `size` ("8 B", "16 KiB"), split into words.
std::vector<std::string> Row(const std::string &out, const std::string &size)
{
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
        if (line.empty() || line[0] == '#')
            continue;
        std::istringstream words(line);
        std::vector<std::string> w;
        for (std::string x; words >> x;)
            w.push_back(x);
        if (w.size() >= 2 && w[0] + " " + w[1] == size)
            return w;
    }
    return {};
}

TEST(LoomInfo, ShmDecisionTableShowsTheVariantThatRuns)
{
    ASSERT_NE(getenv("LOOM_INFO"), nullptr) << "LOOM_INFO is not set";
    int status = 0;
    // The machine the large-L3 fixture describes (48 KiB L1d, 2 MiB L2), single copy off: the
    // rules then give the same table on every machine that runs this test.
    const char *fixtures = getenv("LOOM_TOPO_FIXTURES");
    ASSERT_NE(fixtures, nullptr) << "LOOM_TOPO_FIXTURES is not set";
    const std::string out = RunInfo("-d -c shm -n 4", &status,
                                    "LOOM_SHM_COLL_CMA=0 LOOM_TOPO_FILE=" + std::string(fixtures) +
                                        "/shm-large-l3.json");
    ASSERT_EQ(status, 0) << out;
    // Columns: allreduce allgather reducescatter broadcast reduce alltoall, each the variant
    // and its predicted time ("12.5us").
    const std::vector<std::string> tiny = Row(out, "8 B"), flat = Row(out, "8 KiB"),
                                   big = Row(out, "512 KiB");
    ASSERT_EQ(tiny.size(), 14u) << out;
    ASSERT_EQ(flat.size(), 14u) << out;
    ASSERT_EQ(big.size(), 14u) << out;
    auto variant = [](const std::vector<std::string> &row, size_t col) { return row[2 + 2 * col]; };
    auto us = [](const std::vector<std::string> &row, size_t col) {
        return std::stod(row[3 + 2 * col]);
    };
    for (size_t k = 0; k < 6; k++)
        EXPECT_EQ(variant(tiny, k), "shm_tiny") << "8 B, column " << k << "\n" << out;
    EXPECT_EQ(variant(flat, 0), "shm_flat") << out;
    EXPECT_EQ(variant(flat, 4), "shm_flat") << out;
    EXPECT_EQ(variant(flat, 1), "shm_cico") << out;
    for (size_t k = 0; k < 6; k++) {
        EXPECT_EQ(variant(big, k), "shm_cico") << "512 KiB, column " << k << "\n" << out;
        // Predicted: more bytes take longer.
        EXPECT_GT(us(big, k), us(flat, k)) << "column " << k << "\n" << out;
        EXPECT_GT(us(flat, k), 0.0) << "column " << k << "\n" << out;
    }
}

TEST(LoomInfo, TcpDecisionTableShowsModelledAlgorithms)
{
    ASSERT_NE(getenv("LOOM_INFO"), nullptr) << "LOOM_INFO is not set";
    int status = 0;
    const std::string out = RunInfo("-d -c tcp -n 4", &status);
    ASSERT_EQ(status, 0) << out;
    const std::vector<std::string> row = Row(out, "512 KiB");
    ASSERT_EQ(row.size(), 14u) << out; // size, unit, then name and time per collective
    for (size_t k = 2; k < row.size(); k += 2) {
        EXPECT_NE(row[k].rfind("shm", 0), 0u) << row[k] << "\n" << out;
        EXPECT_NE(row[k + 1].find("us"), std::string::npos) << row[k + 1] << "\n" << out;
    }
}

TEST(LoomInfo, HostsDecisionTablePicksTheHierarchyOnASlowNetwork)
{
    ASSERT_NE(getenv("LOOM_INFO"), nullptr) << "LOOM_INFO is not set";
    int status = 0;
    // A 1 Gbit/s network (8 ns per byte) between 2 hosts of 2 ranks: large calls go through
    // the hierarchy, tiny ones stay flat. Every algorithm competes with LOOM_DETERMINISTIC=0.
    // Every constant is given (loom_info would otherwise measure shm and tcp's o on this
    // machine): tiny calls stay flat only while a step inside a host costs as much as these say.
    const char *costs = "LOOM_COST_TCP=100,8,0.15,10 LOOM_COST_SHM=120,0.5,0.15,7";
    const std::string out =
        RunInfo("-d -n 4 -H 2", &status, std::string(costs) + " LOOM_DETERMINISTIC=0");
    ASSERT_EQ(status, 0) << out;
    EXPECT_NE(out.find("4 ranks on 2 host(s)"), std::string::npos) << out;
    const std::vector<std::string> big = Row(out, "32 MiB"), tiny = Row(out, "8 B");
    ASSERT_EQ(big.size(), 14u) << out;
    ASSERT_EQ(tiny.size(), 14u) << out;
    for (size_t k : {2, 4, 6, 8}) // allreduce, allgather, reducescatter, broadcast
        EXPECT_EQ(big[k].substr(0, 4), "hier") << "column " << (k - 2) / 2 << "\n" << out;
    for (size_t k = 2; k < tiny.size(); k += 2)
        EXPECT_EQ(tiny[k].find("hier"), std::string::npos) << out;
    // In rank order (the default) AllReduce takes the chain across the hosts, which moves as
    // few bytes between 2 hosts as the hierarchy; ReduceScatter's hierarchy has no rank-order
    // form, so a flat algorithm serves it.
    const std::string ordered = RunInfo("-d -n 4 -H 2", &status, costs);
    ASSERT_EQ(status, 0) << ordered;
    const std::vector<std::string> row = Row(ordered, "32 MiB");
    ASSERT_EQ(row.size(), 14u) << ordered;
    EXPECT_EQ(row[2], "hier_chain") << ordered;
    EXPECT_EQ(row[6], "direct") << ordered;
    EXPECT_EQ(row[4], "hier") << ordered; // AllGather reduces nothing
    // Ranks that the hosts do not divide are refused.
    RunInfo("-d -n 5 -H 2", &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
}

// The line of out that starts with prefix (without its newline), or "".
std::string Line(const std::string &out, const std::string &prefix)
{
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
        if (line.rfind(prefix, 0) == 0)
            return line;
    return "";
}

bool Has(const std::string &s, const std::string &part)
{
    return s.find(part) != std::string::npos;
}

// loom_info -v with the environment env, checked for what every run's device section has: one
// runtime line, one CUDA line (with a line per GPU it counts), the emulation, the three
// transports in the order the calls try them, each with what it needs.
std::string DeviceSection(const std::string &env)
{
    int status = 0;
    const std::string out = RunInfo("-v", &status, env);
    EXPECT_EQ(status, 0) << out;
    EXPECT_FALSE(Has(out, "device buffers: none")) << out;
    EXPECT_NE(Line(out, "# device runtime: "), "") << out;
    const std::string cuda = Line(out, "# CUDA runtime: ");
    EXPECT_NE(cuda, "") << out;
    int gpus = 0;
    if (sscanf(cuda.c_str(), "# CUDA runtime: available, %d GPU", &gpus) == 1) {
        for (int d = 0; d < gpus; d++) {
            const std::string gpu = Line(out, "#   GPU " + std::to_string(d) + ": ");
            EXPECT_TRUE(Has(gpu, ", PCI ") && Has(gpu, ", compute capability ") &&
                        Has(gpu, " GiB, ") && Has(gpu, " SMs"))
                << gpu << "\n"
                << out;
        }
    } else {
        EXPECT_GT(cuda.size(), strlen("# CUDA runtime: not available: ")) << out;
        EXPECT_EQ(Line(out, "#   GPU "), "") << out;
    }
    EXPECT_NE(Line(out, "# emulation: available"), "") << out;
    const size_t ipc = out.find("#   ipc "), nccl = out.find("#   nccl "),
                 staged = out.find("#   staged ");
    EXPECT_TRUE(ipc < nccl && nccl < staged && staged != std::string::npos) << out;
    for (const char *name : {"#   ipc ", "#   nccl ", "#   staged "})
        EXPECT_TRUE(Has(Line(out, name), "; needs ")) << out;
    return out;
}

TEST(LoomInfo, DeviceSectionUnderTheEmulation)
{
    ASSERT_NE(getenv("LOOM_INFO"), nullptr) << "LOOM_INFO is not set";
    const std::string out = DeviceSection("LOOM_DEVICE=emulated");
    EXPECT_EQ(Line(out, "# device runtime: "), "# device runtime: emulated (LOOM_DEVICE=emulated)")
        << out;
    // ipc and staged run on the emulation; NCCL needs CUDA, whatever the library does.
    EXPECT_TRUE(Has(Line(out, "#   ipc "), "available on the emulated runtime")) << out;
    EXPECT_TRUE(Has(Line(out, "#   staged "), "available on the emulated runtime")) << out;
    EXPECT_TRUE(Has(Line(out, "#   nccl "), "not available here: no CUDA runtime (the emulation "
                                            "has no NCCL)"))
        << out;
}

TEST(LoomInfo, DeviceSectionWithoutARuntime)
{
    ASSERT_NE(getenv("LOOM_INFO"), nullptr) << "LOOM_INFO is not set";
    const std::string out = DeviceSection("LOOM_DEVICE=none");
    EXPECT_EQ(Line(out, "# device runtime: "), "# device runtime: none: LOOM_DEVICE=none") << out;
    // The emulation is still there to be chosen, but no transport has a runtime to run on.
    for (const char *name : {"#   ipc ", "#   nccl ", "#   staged "})
        EXPECT_TRUE(Has(Line(out, name), "not available here: no ")) << Line(out, name);
}

TEST(LoomInfo, DeviceSectionOfThisMachine)
{
    ASSERT_NE(getenv("LOOM_INFO"), nullptr) << "LOOM_INFO is not set";
    const char *flag = getenv("LOOM_INFO_CUDA");
    const bool cuda_build = flag != nullptr && strcmp(flag, "1") == 0;
    const std::string out = DeviceSection("env -u LOOM_DEVICE");
    const std::string rt = Line(out, "# device runtime: "), cuda = Line(out, "# CUDA runtime: ");
    if (!cuda_build) {
        // Without the cuda feature neither this process nor any other has CUDA.
        EXPECT_EQ(rt.rfind("# device runtime: none (LOOM_DEVICE=auto): ", 0), 0u) << out;
        EXPECT_TRUE(Has(cuda, "not available: ") && Has(cuda, "cuda feature")) << out;
    }
    if (Has(cuda, "not available: ")) {
        // No runtime at all: every transport says so, nccl with CUDA's own reason.
        for (const char *name : {"#   ipc ", "#   nccl ", "#   staged "})
            EXPECT_TRUE(Has(Line(out, name), "not available here: no ")) << Line(out, name);
        EXPECT_TRUE(Has(Line(out, "#   nccl "), "no CUDA runtime (")) << out;
    } else {
        // A GPU machine: a process that uses CUDA gets it, and ipc and staged with it.
        EXPECT_TRUE(Has(Line(out, "#   ipc "), "available on the cuda runtime")) << out;
        EXPECT_TRUE(Has(Line(out, "#   staged "), "available on the cuda runtime")) << out;
    }
}

} // namespace
