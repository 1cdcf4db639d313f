// SPDX-License-Identifier: Apache-2.0
//
// test_topo_tools.cc - the topology end to end: LOOM_TOPO_DUMP_FILE written at communicator
// creation by ranks on modelled hosts (loomrun --host-groups), read back with LOOM_TOPO_FILE and
// dumped again unchanged, a file for a machine that is not here used instead of detection, files
// that do not match the job refused at init with a message, and loom_info -t. The programs come
// in LOOMRUN, LOOM_INFO and EXAMPLE (a program that makes a communicator from the environment);
// the fixtures' folder in LOOM_TOPO_FIXTURES.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

extern "C" {
#include "topo.h"
}

namespace {

std::string Slurp(const std::string &path)
{
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string TmpDir()
{
    static std::string dir;
    if (dir.empty()) {
        char t[] = "/tmp/loomtopotools.XXXXXX";
        dir = mkdtemp(t) ? t : "/tmp";
    }
    return dir;
}

std::string Fixture(const char *name)
{
    const char *dir = getenv("LOOM_TOPO_FIXTURES");
    return std::string(dir ? dir : "tests/data/topo") + "/" + name;
}

// Runs a shell command line; returns the exit status and fills out with stdout and stderr.
int Sh(const std::string &cmd, std::string *out)
{
    std::string log = TmpDir() + "/out.txt";
    int st = system((cmd + " > " + log + " 2>&1").c_str());
    *out = Slurp(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string Job(int n, const std::string &env, const std::string &launcher_args = "")
{
    return env + " timeout 60 " + getenv("LOOMRUN") + " -n " + std::to_string(n) + " " +
           launcher_args + " " + getenv("EXAMPLE");
}

TEST(TopoDump, RanksOnTwoModelledHostsRoundTrip)
{
    ASSERT_TRUE(getenv("LOOMRUN") && getenv("EXAMPLE"));
    std::string d1 = TmpDir() + "/dump1.json", d2 = TmpDir() + "/dump2.json", out;
    ASSERT_EQ(Sh(Job(4, "LOOM_TOPO_DUMP_FILE=" + d1, "--host-groups 2"), &out), 0) << out;
    loom_topo_t t;
    char err[512];
    ASSERT_EQ(loom_topo_read(d1.c_str(), &t, err, sizeof(err)), 0) << err << "\n" << Slurp(d1);
    EXPECT_EQ(t.nhosts, 2);
    ASSERT_EQ(t.nranks, 4);
    int want_host[] = {0, 0, 1, 1}, want_local[] = {0, 1, 0, 1};
    for (int r = 0; r < 4; r++) {
        EXPECT_EQ(t.ranks[r].host, want_host[r]) << r;
        EXPECT_EQ(t.ranks[r].local_rank, want_local[r]) << r;
        EXPECT_NE(t.ranks[r].cpus[0], '\0') << r;
    }
    EXPECT_EQ(t.hosts[0].cpus, sysconf(_SC_NPROCESSORS_ONLN));
    loom_topo_free(&t);
    // Loaded back, the description is the one dumped again, byte for byte.
    ASSERT_EQ(
        Sh(Job(4, "LOOM_TOPO_FILE=" + d1 + " LOOM_TOPO_DUMP_FILE=" + d2, "--host-groups 2"), &out),
        0)
        << out;
    EXPECT_EQ(Slurp(d2), Slurp(d1));
}

TEST(TopoDump, AFileForAMachineThatIsNotHereReplacesDetection)
{
    std::string d = TmpDir() + "/dump3.json", out;
    std::string file = Fixture("cpu-2socket-2x100g.json");
    ASSERT_EQ(Sh(Job(4, "LOOM_TOPO_FILE=" + file + " LOOM_TOPO_DUMP_FILE=" + d), &out), 0) << out;
    loom_topo_t a, b;
    char err[512];
    ASSERT_EQ(loom_topo_read(file.c_str(), &a, err, sizeof(err)), 0) << err;
    ASSERT_EQ(loom_topo_read(d.c_str(), &b, err, sizeof(err)), 0) << err;
    EXPECT_EQ(b.hosts[0].packages, 2);
    EXPECT_EQ(b.hosts[0].nics[0].speed_mbps, 100000);
    EXPECT_EQ(memcmp(a.hosts, b.hosts, sizeof(*a.hosts)), 0);
    loom_topo_free(&a);
    loom_topo_free(&b);
}

TEST(TopoDump, FilesThatDoNotMatchTheJobAreRefusedAtInit)
{
    std::string out;
    // Two ranks described, four joined (on two hosts).
    EXPECT_NE(Sh(Job(4, "LOOM_TOPO_FILE=" + Fixture("vm-2core.json"), "--host-groups 2"), &out), 0);
    EXPECT_NE(out.find("describes 2 ranks on 1 hosts, but 4 ranks on 2 hosts joined"),
              std::string::npos)
        << out;
    // Right counts, wrong grouping: ranks 1 and 2 swapped between the hosts.
    std::string swapped = TmpDir() + "/swapped.json";
    std::ofstream(swapped) << R"({"loom_topology": 1, "hosts": [
        {"hostname": "a", "packages": 1, "cores": 1, "cpus": 1},
        {"hostname": "b", "packages": 1, "cores": 1, "cpus": 1}],
      "ranks": [{"host": 0, "local_rank": 0}, {"host": 1, "local_rank": 0},
                {"host": 0, "local_rank": 1}, {"host": 1, "local_rank": 1}]})";
    EXPECT_NE(Sh(Job(4, "LOOM_TOPO_FILE=" + swapped, "--host-groups 2"), &out), 0);
    EXPECT_NE(out.find("puts rank 1 on host 1"), std::string::npos) << out;
    // Not a topology file at all.
    std::string bad = TmpDir() + "/bad.json";
    std::ofstream(bad) << "{\"loom_topology\": 1, \"hosts\": [ }";
    EXPECT_NE(Sh(Job(2, "LOOM_TOPO_FILE=" + bad), &out), 0);
    EXPECT_NE(out.find(bad + ": line 1"), std::string::npos) << out;
}

TEST(LoomInfo, PrintsTheTopology)
{
    ASSERT_TRUE(getenv("LOOM_INFO"));
    std::string info = getenv("LOOM_INFO"), out;
    ASSERT_EQ(Sh(info + " -t", &out), 0) << out;
    EXPECT_NE(out.find("topology detected"), std::string::npos) << out;
    EXPECT_NE(out.find("CPUs"), std::string::npos) << out;
    ASSERT_EQ(
        Sh("LOOM_TOPO_FILE=" + Fixture("gpu-8x-nvswitch-8x400g.json") + " " + info + " -t", &out),
        0)
        << out;
    EXPECT_NE(out.find("rdma mlx5_7 port 1: InfiniBand, active, 400 Gbit/s, numa 1"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("18 NVLinks of 200 Gbit/s, NVSwitch"), std::string::npos) << out;
    EXPECT_NE(out.find("nic ibp0s0: up, 400 Gbit/s"), std::string::npos) << out;
    EXPECT_NE(Sh("LOOM_TOPO_FILE=/nonexistent.json " + info + " -t", &out), 0);
    EXPECT_NE(out.find("/nonexistent.json: cannot open"), std::string::npos) << out;
}

} // namespace
