// SPDX-License-Identifier: Apache-2.0
//
// test_topo.cc - the topology module: detection from a made-up sysfs tree (a 2-socket host with
// L3 caches, NICs, an RDMA port and a GPU; CPUs with L1 and L2 caches) and from this machine, the
// fixtures of tests/data/topo read and written back unchanged, and bad files refused with a message
// naming the field. The fixtures' folder comes in LOOM_TOPO_FIXTURES.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

extern "C" {
#include "topo.h"
}

namespace {

std::string Fixture(const char *name)
{
    const char *dir = getenv("LOOM_TOPO_FIXTURES");
    return std::string(dir ? dir : "tests/data/topo") + "/" + name;
}

// A temporary directory holding files written by Put.
class FakeRoot {
  public:
    FakeRoot()
    {
        char t[] = "/tmp/loomtopo.XXXXXX";
        root_ = mkdtemp(t) ? t : "";
    }
    ~FakeRoot()
    {
        if (!root_.empty())
            (void)!system(("rm -rf " + root_).c_str());
    }
    void Put(const std::string &rel, const std::string &text)
    {
        std::string path = root_ + rel;
        for (size_t p = 1; (p = path.find('/', p)) != std::string::npos; p++)
            mkdir(path.substr(0, p).c_str(), 0755);
        std::ofstream(path) << text << "\n";
    }
    const char *root() const
    {
        return root_.c_str();
    }

  private:
    std::string root_;
};

TEST(Topo, DetectsAMadeUpTwoSocketHost)
{
    FakeRoot fs;
    fs.Put("/proc/sys/kernel/hostname", "server7");
    fs.Put("/sys/devices/system/cpu/online", "0-7");
    for (int c = 0; c < 8; c++) {
        std::string d = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
        fs.Put(d + "physical_package_id", std::to_string(c / 4));
        fs.Put(d + "core_id", std::to_string((c % 4) / 2)); // two threads per core
        // An L1 and an L3; package 0 has two L3s of 8 MiB (one per core), package 1 one of 32.
        std::string cache = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/cache/";
        fs.Put(cache + "index0/level", "1");
        fs.Put(cache + "index0/size", "48K");
        fs.Put(cache + "index0/shared_cpu_list", std::to_string(c));
        fs.Put(cache + "index1/level", "3");
        fs.Put(cache + "index1/size", c < 4 ? "8192K" : "32768K");
        fs.Put(cache + "index1/shared_cpu_list", c < 2 ? "0-1" : c < 4 ? "2-3" : "4-7");
    }
    fs.Put("/sys/devices/system/node/node0/cpulist", "0-3");
    fs.Put("/sys/devices/system/node/node1/cpulist", "4-7");
    fs.Put("/sys/devices/system/node/node0/meminfo", "Node 0 MemTotal:       33554432 kB");
    fs.Put("/sys/devices/system/node/node1/meminfo", "Node 1 MemTotal:       16777216 kB");
    fs.Put("/sys/class/net/lo/operstate", "unknown");
    fs.Put("/sys/class/net/ens1/operstate", "up");
    fs.Put("/sys/class/net/ens1/speed", "100000");
    fs.Put("/sys/class/net/ens1/device/numa_node", "1");
    fs.Put("/sys/class/net/veth0/operstate", "unknown");
    fs.Put("/sys/class/net/veth0/carrier", "1");
    fs.Put("/sys/class/net/eno2/operstate", "down");
    fs.Put("/sys/class/net/eno2/speed", "-1");
    fs.Put("/sys/class/infiniband/mlx5_0/ports/1/link_layer", "InfiniBand");
    fs.Put("/sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE");
    fs.Put("/sys/class/infiniband/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)");
    fs.Put("/sys/class/infiniband/mlx5_0/device/numa_node", "0");
    fs.Put("/sys/bus/pci/devices/0000:18:00.0/vendor", "0x10de");
    fs.Put("/sys/bus/pci/devices/0000:18:00.0/class", "0x030200");
    fs.Put("/sys/bus/pci/devices/0000:18:00.0/device", "0x2330");
    fs.Put("/sys/bus/pci/devices/0000:18:00.0/numa_node", "0");
    fs.Put("/sys/bus/pci/devices/0000:00:1f.6/vendor", "0x8086"); // not a GPU
    fs.Put("/sys/bus/pci/devices/0000:00:1f.6/class", "0x020000");

    loom_topo_host_t h;
    loom_topo_detect_host(&h, fs.root());
    EXPECT_STREQ(h.hostname, "server7");
    EXPECT_EQ(h.cpus, 8);
    EXPECT_EQ(h.packages, 2);
    EXPECT_EQ(h.cores, 4);
    EXPECT_EQ(h.l3_kb, 16384); // the first package's two L3s
    ASSERT_EQ(h.nnuma, 2);
    EXPECT_EQ(h.numa[0].cpus, 4);
    EXPECT_STREQ(h.numa[1].cpulist, "4-7");
    EXPECT_EQ(h.numa[0].mem_mb, 32768);
    EXPECT_EQ(h.numa[1].mem_mb, 16384);
    ASSERT_EQ(h.nnics, 3); // lo is left out; sorted by name
    EXPECT_STREQ(h.nics[0].name, "eno2");
    EXPECT_EQ(h.nics[0].up, 0);
    EXPECT_EQ(h.nics[0].speed_mbps, -1);
    EXPECT_STREQ(h.nics[1].name, "ens1");
    EXPECT_EQ(h.nics[1].up, 1);
    EXPECT_EQ(h.nics[1].speed_mbps, 100000);
    EXPECT_EQ(h.nics[1].numa, 1);
    EXPECT_STREQ(h.nics[2].name, "veth0");
    EXPECT_EQ(h.nics[2].up, 1); // unknown with a carrier
    EXPECT_EQ(h.nics[2].numa, -1);
    ASSERT_EQ(h.nrdma, 1);
    EXPECT_STREQ(h.rdma[0].link_layer, "InfiniBand");
    EXPECT_EQ(h.rdma[0].active, 1);
    EXPECT_EQ(h.rdma[0].rate_gbps, 400);
    ASSERT_EQ(h.ngpus, 1);
    EXPECT_STREQ(h.gpus[0].pci, "0000:18:00.0");
    EXPECT_EQ(h.gpus[0].numa, 0);

    // The RDMA ports alone (what creation reads to choose a transport) are the same ones.
    loom_topo_host_t r;
    loom_topo_detect_rdma(&r, fs.root());
    ASSERT_EQ(r.nrdma, 1);
    EXPECT_EQ(r.rdma[0].rate_gbps, 400);
    EXPECT_EQ(r.cpus, 0); // nothing else is read
    EXPECT_EQ(loom_topo_best_rdma_gbps(&r), 400);
}

// The L1d and L2 of the first online CPU (cpu2 here): the L1 Instruction cache is not the L1d,
// in whichever order sysfs lists them; the L2 shared by two cores counts whole; the other CPUs'
// caches do not count.
TEST(Topo, DetectsTheCoreCachesOfTheFirstOnlineCpu)
{
    for (bool instruction_first : {false, true}) {
        FakeRoot fs;
        fs.Put("/sys/devices/system/cpu/online", "2-5");
        for (int c = 0; c < 6; c++) {
            std::string cache = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/cache/";
            std::string l1d = instruction_first ? "index1/" : "index0/";
            std::string l1i = instruction_first ? "index0/" : "index1/";
            fs.Put(cache + l1d + "level", "1");
            fs.Put(cache + l1d + "type", "Data");
            fs.Put(cache + l1d + "size", c == 2 ? "48K" : "16K");
            fs.Put(cache + l1i + "level", "1");
            fs.Put(cache + l1i + "type", "Instruction");
            fs.Put(cache + l1i + "size", "64K");
            fs.Put(cache + "index2/level", "2");
            fs.Put(cache + "index2/type", "Unified");
            fs.Put(cache + "index2/size", c == 2 ? "2M" : "512K");
            fs.Put(cache + "index2/shared_cpu_list", c < 4 ? "2-3" : "4-5");
            fs.Put(cache + "index3/level", "3");
            fs.Put(cache + "index3/type", "Unified");
            fs.Put(cache + "index3/size", "32768K");
            fs.Put(cache + "index3/shared_cpu_list", "2-5");
        }
        loom_topo_host_t h;
        loom_topo_detect_host(&h, fs.root());
        EXPECT_EQ(h.l1d_kb, 48) << "L1i listed first: " << instruction_first;
        EXPECT_EQ(h.l2_kb, 2048) << "L1i listed first: " << instruction_first;
        EXPECT_EQ(h.l3_kb, 32768);
    }
    // A unified L1 is the data cache too; a CPU without cache directories has neither.
    FakeRoot unified;
    unified.Put("/sys/devices/system/cpu/online", "0");
    unified.Put("/sys/devices/system/cpu/cpu0/cache/index0/level", "1");
    unified.Put("/sys/devices/system/cpu/cpu0/cache/index0/type", "Unified");
    unified.Put("/sys/devices/system/cpu/cpu0/cache/index0/size", "32K");
    loom_topo_host_t h;
    loom_topo_detect_host(&h, unified.root());
    EXPECT_EQ(h.l1d_kb, 32);
    EXPECT_EQ(h.l2_kb, -1);
    EXPECT_EQ(h.l3_kb, -1);
    FakeRoot none;
    none.Put("/sys/devices/system/cpu/online", "0-1");
    loom_topo_detect_host(&h, none.root());
    EXPECT_EQ(h.l1d_kb, -1);
    EXPECT_EQ(h.l2_kb, -1);
}

TEST(Topo, BestRdmaRateCountsActivePortsOnly)
{
    loom_topo_host_t h;
    memset(&h, 0, sizeof(h));
    EXPECT_EQ(loom_topo_best_rdma_gbps(&h), 0); // no port
    h.nrdma = 3;
    h.rdma[0] = {"mlx5_0", 1, "InfiniBand", 0, 400, -1}; // down: does not count
    h.rdma[1] = {"mlx5_1", 1, "Ethernet", 1, 100, -1};
    h.rdma[2] = {"mlx5_2", 1, "InfiniBand", 1, 200, -1};
    EXPECT_EQ(loom_topo_best_rdma_gbps(&h), 200);
}

TEST(Topo, InterfaceSpeedForTheCostModel)
{
    FakeRoot fs;
    fs.Put("/sys/class/net/ens1/speed", "25000");
    fs.Put("/sys/class/net/veth0/speed", "-1"); // what virtual interfaces without a speed say
    EXPECT_EQ(loom_topo_nic_speed_mbps("ens1", fs.root()), 25000);
    EXPECT_EQ(loom_topo_nic_speed_mbps("veth0", fs.root()), -1);
    EXPECT_EQ(loom_topo_nic_speed_mbps("missing", fs.root()), -1);
    EXPECT_EQ(loom_topo_nic_speed_mbps("", fs.root()), -1);
    EXPECT_EQ(loom_topo_nic_speed_mbps(nullptr, fs.root()), -1);
    // A name is an interface, never a path out of /sys/class/net.
    fs.Put("/sys/class/speed", "1000");
    EXPECT_EQ(loom_topo_nic_speed_mbps("../speed", fs.root()), -1);
    EXPECT_EQ(loom_topo_nic_speed_mbps("..", fs.root()), -1);
}

TEST(Topo, DetectsThisMachine)
{
    loom_topo_host_t h;
    loom_topo_detect_host(&h, nullptr);
    EXPECT_EQ(h.cpus, sysconf(_SC_NPROCESSORS_ONLN));
    EXPECT_GE(h.packages, 1);
    EXPECT_GE(h.cores, 1);
    EXPECT_LE(h.cores, h.cpus);
    for (int i = 0; i < h.nnics; i++)
        EXPECT_STRNE(h.nics[i].name, "lo");
    loom_topo_rank_t r;
    loom_topo_detect_rank(&r, nullptr);
    EXPECT_NE(r.cpus[0], '\0');
    if (h.nnuma > 0) {
        EXPECT_GE(r.numa, 0);
    }
}

std::string WriteToString(const loom_topo_t &t)
{
    char *buf = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    EXPECT_EQ(loom_topo_write(&t, f), 0);
    fclose(f);
    std::string s(buf, len);
    free(buf);
    return s;
}

TEST(Topo, FixturesReadAndWriteBackUnchanged)
{
    struct Want {
        const char *file;
        int hosts, ranks, gpus, nics;
    };
    for (const Want &w :
         {Want{"vm-2core.json", 1, 2, 0, 1}, Want{"cpu-2socket-2x100g.json", 1, 4, 0, 3},
          Want{"gpu-8x-nvswitch-8x400g.json", 1, 8, 8, 9},
          Want{"cluster-4x-gpu-node.json", 4, 32, 8, 9}, Want{"shm-small-l3.json", 1, 0, 0, 0},
          Want{"shm-large-l3.json", 1, 0, 0, 0}}) {
        loom_topo_t t, back;
        char err[512];
        ASSERT_EQ(loom_topo_read(Fixture(w.file).c_str(), &t, err, sizeof(err)), 0) << err;
        EXPECT_EQ(t.nhosts, w.hosts) << w.file;
        EXPECT_EQ(t.nranks, w.ranks) << w.file;
        EXPECT_EQ(t.hosts[0].ngpus, w.gpus) << w.file;
        EXPECT_EQ(t.hosts[0].nnics, w.nics) << w.file;
        std::string text = WriteToString(t);
        ASSERT_EQ(loom_topo_parse(text.data(), text.size(), &back, err, sizeof(err)), 0)
            << err << "\n"
            << text;
        ASSERT_EQ(back.nhosts, t.nhosts);
        ASSERT_EQ(back.nranks, t.nranks);
        EXPECT_EQ(memcmp(back.hosts, t.hosts, sizeof(*t.hosts) * t.nhosts), 0) << w.file;
        EXPECT_EQ(memcmp(back.ranks, t.ranks, sizeof(*t.ranks) * t.nranks), 0) << w.file;
        EXPECT_EQ(WriteToString(back), text) << w.file;
        loom_topo_free(&t);
        loom_topo_free(&back);
    }
    loom_topo_t t;
    char err[512];
    ASSERT_EQ(loom_topo_read(Fixture("gpu-8x-nvswitch-8x400g.json").c_str(), &t, err, sizeof(err)),
              0);
    EXPECT_EQ(t.hosts[0].nvswitch, 1);
    EXPECT_EQ(t.hosts[0].gpus[7].nvlinks, 18);
    EXPECT_EQ(t.hosts[0].gpus[7].nvlink_gbps, 200);
    EXPECT_EQ(t.hosts[0].rdma[7].rate_gbps, 400);
    EXPECT_EQ(t.hosts[0].numa[1].cpus, 112);
    loom_topo_free(&t);
}

// The caches each fixture gives: the shm collectives' decision tests plan with them.
TEST(Topo, FixturesDescribeTheirCaches)
{
    struct Want {
        const char *file;
        int packages, cores, cpus, l1d_kb, l2_kb, l3_kb;
    };
    for (const Want &w : {
             Want{"shm-small-l3.json", 1, 8, 16, 32, 512, 32768},  // EPYC-like, 32 MiB L3
             Want{"shm-large-l3.json", 1, 2, 2, 48, 2048, 307200}, // cloud Xeon VM, 300 MiB
             Want{"vm-2core.json", 1, 2, 2, 48, 2048, -1},         // no L3 in the file
             Want{"gpu-8x-nvswitch-8x400g.json", 2, 112, 224, 48, 2048, -1},
             Want{"cpu-2socket-2x100g.json", 2, 64, 128, -1, -1, -1}, // no caches in the file
         }) {
        loom_topo_t t;
        char err[512];
        ASSERT_EQ(loom_topo_read(Fixture(w.file).c_str(), &t, err, sizeof(err)), 0) << err;
        ASSERT_EQ(t.nhosts, 1) << w.file;
        const loom_topo_host_t &h = t.hosts[0];
        EXPECT_EQ(h.packages, w.packages) << w.file;
        EXPECT_EQ(h.cores, w.cores) << w.file;
        EXPECT_EQ(h.cpus, w.cpus) << w.file;
        EXPECT_EQ(h.l1d_kb, w.l1d_kb) << w.file;
        EXPECT_EQ(h.l2_kb, w.l2_kb) << w.file;
        EXPECT_EQ(h.l3_kb, w.l3_kb) << w.file;
        EXPECT_EQ(h.nnuma, 1 + (w.packages > 1)) << w.file;
        loom_topo_free(&t);
    }
    loom_topo_t t;
    char err[512];
    ASSERT_EQ(loom_topo_read(Fixture("cluster-4x-gpu-node.json").c_str(), &t, err, sizeof(err)), 0)
        << err;
    for (int i = 0; i < t.nhosts; i++) {
        EXPECT_EQ(t.hosts[i].l1d_kb, 48) << i;
        EXPECT_EQ(t.hosts[i].l2_kb, 2048) << i;
    }
    loom_topo_free(&t);
}

// Records from other ranks arrive as raw bytes: whatever they hold, once sanitized they are
// safe to print and write.
TEST(Topo, SanitizedRecordsAreSafeWhateverTheyHeld)
{
    loom_topo_t t;
    ASSERT_EQ(loom_topo_alloc(&t, 1, 1), 0);
    memset(t.hosts, 'x', sizeof(*t.hosts)); // no terminators, absurd counts
    memset(t.ranks, 'y', sizeof(*t.ranks));
    t.hosts[0].nnics = 1000;
    t.hosts[0].ngpus = -5;
    t.hosts[0].l2_kb = 2048; // a size a file holds stays; the 'x' bytes of the others do not
    loom_topo_sanitize_host(&t.hosts[0]);
    EXPECT_EQ(t.hosts[0].l1d_kb, -1);
    EXPECT_EQ(t.hosts[0].l2_kb, 2048);
    EXPECT_EQ(t.hosts[0].l3_kb, -1);
    loom_topo_sanitize_rank(&t.ranks[0]);
    t.ranks[0].host = 0;
    EXPECT_EQ(t.hosts[0].nnics, LOOM_TOPO_MAX_NICS);
    EXPECT_EQ(t.hosts[0].ngpus, 0);
    EXPECT_EQ(strlen(t.hosts[0].hostname), size_t(LOOM_TOPO_NAME - 1));
    EXPECT_EQ(strlen(t.ranks[0].cpus), size_t(LOOM_TOPO_CPULIST - 1));
    char *buf = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    loom_topo_print(&t, f);
    EXPECT_EQ(loom_topo_write(&t, f), 0);
    fclose(f);
    EXPECT_GT(len, 0u);
    free(buf);
    loom_topo_free(&t);
}

TEST(Topo, BadFilesAreRefusedWithTheFieldNamed)
{
    const std::string host = R"("hostname": "h", "packages": 1, "cores": 2, "cpus": 2)";
    struct Case {
        std::string text, message;
    };
    for (
        const Case &c : std::initializer_list<Case>{
            {"", "line 1"},
            {"[]", "must be an object"},
            {R"({"hosts": []})", "loom_topology"},
            {R"({"loom_topology": 2, "hosts": [{)" + host + "}]}", "version"},
            {R"({"loom_topology": 1, "hosts": []})", "\"hosts\" is empty"},
            {R"({"loom_topology": 1, "hosts": [{"hostname": "h"}]})", "hosts[0]"},
            {R"({"loom_topology": 1, "hosts": [{"hostname": "h", "packages": 1, "cores": 3, "cpus": 2}]})",
             "cores"},
            {R"({"loom_topology": 1, "hosts": [{)" + host +
                 R"(, "nics": [{"name": "e", "up": 1}]}]})",
             "hosts[0].nics[0]"},
            {R"({"loom_topology": 1, "hosts": [{)" + host +
                 R"(, "nics": [{"name": "e", "up": true, "speed_mbps": 0}]}]})",
             "speed_mbps"},
            {R"({"loom_topology": 1, "hosts": [{)" + host +
                 R"(, "numa": [{"id": 0, "cpus": "3-1"}]}]})",
             "CPU list"},
            // found by fuzz_topo_file: a range this wide overflowed the CPU count
            {R"({"loom_topology": 1, "hosts": [{)" + host +
                 R"(, "numa": [{"id": 0, "cpus": "0-9223372036854775807"}]}]})",
             "ids below 2^20"},
            {R"({"loom_topology": 1, "hosts": [{)" + host +
                 R"(}], "ranks": [{"host": 1, "local_rank": 0}]})",
             "ranks[0]"},
            {R"({"loom_topology": 1, "hosts": [{)" + host +
                 R"(}], "ranks": [{"host": 0, "local_rank": 1}]})",
             "local_rank"},
            {R"({"loom_topology": 1, "hosts": [{)" + host + R"(, "hostname": "x"}]})", "duplicate"},
        }) {
        loom_topo_t t;
        char err[512] = "";
        EXPECT_EQ(loom_topo_parse(c.text.data(), c.text.size(), &t, err, sizeof(err)), -1)
            << c.text;
        EXPECT_NE(std::string(err).find(c.message), std::string::npos)
            << "text: " << c.text << "\nmessage: " << err;
    }
    // More than 16 GPUs on a host.
    std::string gpus;
    for (int i = 0; i < 17; i++)
        gpus += std::string(i ? "," : "") + R"({"name": "g", "pci": "p"})";
    std::string text =
        R"({"loom_topology": 1, "hosts": [{)" + host + R"(, "gpus": [)" + gpus + "]}]}";
    loom_topo_t t;
    char err[512];
    EXPECT_EQ(loom_topo_parse(text.data(), text.size(), &t, err, sizeof(err)), -1);
    EXPECT_NE(std::string(err).find("at most 16"), std::string::npos) << err;
    // A missing file.
    EXPECT_EQ(loom_topo_read("/nonexistent/topo.json", &t, err, sizeof(err)), -1);
    EXPECT_NE(std::string(err).find("/nonexistent/topo.json: cannot open"), std::string::npos);
}

} // namespace
