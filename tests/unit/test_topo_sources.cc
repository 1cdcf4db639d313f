// SPDX-License-Identifier: Apache-2.0
//
// test_topo_sources.cc - the detection sources beside sysfs (src/topology/topo_sources.h):
// hwloc on synthetic machines, the InfiniBand rate table and libibverbs on this machine (no
// devices: no ports, no error), and NVML loaded with dlopen, from a fake library built with the
// tests (its path in LOOM_FAKE_NVML) and from libraries that are absent or are not NVML. Also
// the host record's cache sizes through a topology file, where they are optional.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

extern "C" {
#include "param.h"
#include "topo_sources.h"
}

namespace {

// Sets one variable for the scope of a test and makes the parameter cache read it again.
class ScopedEnv {
  public:
    ScopedEnv(const char *name, const char *value) : name_(name)
    {
        const char *old = getenv(name);
        had_ = old != nullptr;
        if (had_)
            old_ = old;
        setenv(name, value, 1);
        loom_param_reset_cache();
    }
    ~ScopedEnv()
    {
        if (had_)
            setenv(name_.c_str(), old_.c_str(), 1);
        else
            unsetenv(name_.c_str());
        loom_param_reset_cache();
    }

  private:
    std::string name_, old_;
    bool had_ = false;
};

#if LOOM_HAVE_HWLOC
TEST(TopoHwloc, DescribesASyntheticTwoSocketHost)
{
    loom_topo_host_t h;
    memset(&h, 0, sizeof(h));
    ASSERT_EQ(loom_topo_hwloc_detect(&h, "pack:2 numa:1 core:4 pu:2"), 0);
    EXPECT_EQ(h.packages, 2);
    EXPECT_EQ(h.cores, 8);
    EXPECT_EQ(h.cpus, 16);
    EXPECT_EQ(h.l3_kb, -1); // no cache level in the description
    EXPECT_EQ(h.l1d_kb, -1);
    EXPECT_EQ(h.l2_kb, -1);
    ASSERT_EQ(h.nnuma, 2);
    EXPECT_EQ(h.numa[0].id, 0);
    EXPECT_STREQ(h.numa[0].cpulist, "0-7");
    EXPECT_EQ(h.numa[0].cpus, 8);
    EXPECT_EQ(h.numa[1].id, 1);
    EXPECT_STREQ(h.numa[1].cpulist, "8-15");
    EXPECT_EQ(h.numa[1].mem_mb, 1024); // hwloc's synthetic default
}

TEST(TopoHwloc, CountsEveryL3OfAPackageTheCoreCachesAndTheNodesMemory)
{
    loom_topo_host_t h;
    memset(&h, 0, sizeof(h));
    // one package with two L3s of 32 MiB (a chiplet CPU), each over two L2s of 1 MiB that two
    // cores share; per core an L1d of 32 KiB and an L1i of 64 KiB (not the L1d); a node of
    // 64 GiB, one PU per core
    ASSERT_EQ(loom_topo_hwloc_detect(&h, "pack:1 [numa(memory=68719476736)] l3:2(size=33554432) "
                                         "l2:2(size=1048576) l1d:2(size=32768) "
                                         "l1i:1(size=65536) core:1 pu:1"),
              0);
    EXPECT_EQ(h.packages, 1);
    EXPECT_EQ(h.cores, 8);
    EXPECT_EQ(h.cpus, 8);
    EXPECT_EQ(h.l3_kb, 65536);
    EXPECT_EQ(h.l1d_kb, 32);
    EXPECT_EQ(h.l2_kb, 1024); // shared, at its full size
    ASSERT_EQ(h.nnuma, 1);
    EXPECT_EQ(h.numa[0].mem_mb, 65536);
    EXPECT_STREQ(h.numa[0].cpulist, "0-7");
}

TEST(TopoHwloc, LeavesTheRecordAloneOnABadDescription)
{
    loom_topo_host_t h;
    memset(&h, 0, sizeof(h));
    h.cpus = 3;
    EXPECT_EQ(loom_topo_hwloc_detect(&h, "pack:zero"), -1);
    EXPECT_EQ(h.cpus, 3);
    EXPECT_EQ(h.nnuma, 0);
}

// On this machine hwloc and the sysfs reader must describe the same CPUs and nodes.
TEST(TopoHwloc, AgreesWithSysfsOnThisMachine)
{
    loom_topo_host_t hw, fs;
    memset(&hw, 0, sizeof(hw));
    ASSERT_EQ(loom_topo_hwloc_detect(&hw, nullptr), 0);
    char root[] = "/"; // a sysroot, so sysfs alone; "/" + "/sys/..." is the real tree
    loom_topo_detect_host(&fs, root);
    EXPECT_EQ(hw.cpus, sysconf(_SC_NPROCESSORS_ONLN));
    EXPECT_EQ(hw.cpus, fs.cpus);
    EXPECT_EQ(hw.cores, fs.cores);
    EXPECT_EQ(hw.packages, fs.packages);
    EXPECT_EQ(hw.l3_kb, fs.l3_kb);
    EXPECT_EQ(hw.l1d_kb, fs.l1d_kb);
    EXPECT_EQ(hw.l2_kb, fs.l2_kb);
    EXPECT_NE(fs.l1d_kb, 0); // a size, or -1 where sysfs shows none; never left unset
    EXPECT_NE(fs.l2_kb, 0);
    if (fs.nnuma > 0) { // a kernel without NUMA has no node directory; hwloc still shows one
        ASSERT_EQ(hw.nnuma, fs.nnuma);
        for (int i = 0; i < fs.nnuma; i++) {
            EXPECT_EQ(hw.numa[i].id, fs.numa[i].id);
            EXPECT_STREQ(hw.numa[i].cpulist, fs.numa[i].cpulist);
            EXPECT_EQ(hw.numa[i].cpus, fs.numa[i].cpus);
            EXPECT_EQ(hw.numa[i].mem_mb, fs.numa[i].mem_mb);
        }
    }
}
#else
TEST(TopoHwloc, NotBuilt)
{
    GTEST_SKIP() << "this build has no hwloc (meson -Dhwloc=disabled, or libhwloc-dev missing)";
}
#endif

// The decode table against the rates the kernel prints in /sys/class/infiniband/*/ports/*/rate.
TEST(TopoIbv, RateFromWidthAndSpeedCodes)
{
    struct Case {
        int width, speed;
        double gbps;
    };
    for (const Case &c : {
             Case{1, 1, 2.5},   // 1X SDR
             Case{2, 1, 10},    // 4X SDR
             Case{2, 2, 20},    // 4X DDR
             Case{2, 4, 40},    // 4X QDR
             Case{2, 8, 40},    // 4X FDR10
             Case{2, 16, 56},   // 4X FDR
             Case{2, 32, 100},  // 4X EDR
             Case{16, 64, 100}, // 2X HDR (HDR100)
             Case{2, 64, 200},  // 4X HDR
             Case{2, 128, 400}, // 4X NDR
             Case{8, 32, 300},  // 12X EDR
             Case{4, 128, 800}, // 8X NDR
             Case{2, 256, 800}, // 4X XDR
             Case{1, 16, 14},   // 1X FDR
         })
        EXPECT_EQ(loom_topo_ibv_rate_gbps(c.width, c.speed), c.gbps)
            << "width " << c.width << " speed " << c.speed;
    for (int bad : {0, 3, 32, 255, -1})
        EXPECT_EQ(loom_topo_ibv_rate_gbps(bad, 1), -1) << "width " << bad;
    for (int bad : {0, 3, 512, -1})
        EXPECT_EQ(loom_topo_ibv_rate_gbps(2, bad), -1) << "speed " << bad;
}

#if LOOM_HAVE_IBVERBS
// Whatever devices this machine has, each record is complete; with none, there are none.
TEST(TopoIbv, ListsThisMachinesPorts)
{
    loom_topo_host_t h;
    memset(&h, 0, sizeof(h));
    h.nrdma = 5; // stale: replaced, not appended to
    ASSERT_EQ(loom_topo_ibv_detect(&h), 0);
    EXPECT_GE(h.nrdma, 0);
    EXPECT_LE(h.nrdma, LOOM_TOPO_MAX_RDMA);
    if (access("/sys/class/infiniband", F_OK) != 0) {
        EXPECT_EQ(h.nrdma, 0);
    }
    for (int i = 0; i < h.nrdma; i++) {
        EXPECT_NE(h.rdma[i].name[0], '\0');
        EXPECT_GE(h.rdma[i].port, 1);
        EXPECT_EQ(h.rdma[i].numa, -1); // placed by topo_detect.c
    }
}
#endif

// ---- NVML ----

std::string FakeNvml()
{
    const char *p = getenv("LOOM_FAKE_NVML");
    return p ? p : "";
}

TEST(TopoNvml, ReadsGpusThroughTheLoadedLibrary)
{
    std::string lib = FakeNvml();
    ASSERT_FALSE(lib.empty()) << "LOOM_FAKE_NVML names the fake library (tests/unit/meson.build)";
    // Held open here, so that its counters outlive the detection's dlclose.
    void *held = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(held, nullptr) << dlerror();
    auto inits = reinterpret_cast<int (*)()>(dlsym(held, "fake_nvml_inits"));
    ASSERT_NE(inits, nullptr);

    loom_topo_host_t h;
    memset(&h, 0, sizeof(h));
    h.ngpus = 7; // stale: replaced
    ASSERT_EQ(loom_topo_nvml_detect(&h, lib.c_str()), 0);
    EXPECT_EQ(inits(), 0) << "nvmlInit_v2 without nvmlShutdown";
    ASSERT_EQ(h.ngpus, 2);
    EXPECT_STREQ(h.gpus[0].name, "NVIDIA H100 80GB HBM3");
    EXPECT_STREQ(h.gpus[0].pci, "0000:18:00.0");
    EXPECT_STREQ(h.gpus[1].pci, "0000:3b:00.0"); // as /sys/bus/pci/devices spells it
    for (int i = 0; i < 2; i++) {
        EXPECT_EQ(h.gpus[i].nvlinks, 4) << i; // links 4 and 5 are down
        EXPECT_EQ(h.gpus[i].nvlink_gbps, 200) << i;
        EXPECT_EQ(h.gpus[i].numa, -1) << i;
    }
    EXPECT_EQ(h.nvswitch, 1);
    dlclose(held);
}

// Detection picks NVML up through LOOM_NVML_LIB, and places its GPUs from sysfs (-1 here:
// the fake bus ids do not exist).
TEST(TopoNvml, DetectionUsesTheLibraryLoomNvmlLibNames)
{
    std::string lib = FakeNvml();
    ASSERT_FALSE(lib.empty());
    loom_topo_host_t h;
    {
        ScopedEnv env("LOOM_NVML_LIB", lib.c_str());
        loom_topo_detect_host(&h, nullptr);
    }
    ASSERT_EQ(h.ngpus, 2);
    EXPECT_EQ(h.gpus[1].nvlinks, 4);
    EXPECT_EQ(h.nvswitch, 1);
    if (access("/sys/bus/pci/devices/0000:18:00.0", F_OK) != 0) {
        EXPECT_EQ(h.gpus[0].numa, -1);
    }
    // Empty: NVML is not loaded, and the GPUs are those on the PCI bus.
    loom_topo_host_t pci;
    {
        ScopedEnv env("LOOM_NVML_LIB", "");
        loom_topo_detect_host(&pci, nullptr);
    }
    for (int i = 0; i < pci.ngpus; i++)
        EXPECT_EQ(pci.gpus[i].nvlinks, 0);
    EXPECT_EQ(pci.nvswitch, 0);
}

TEST(TopoNvml, AnAbsentOrForeignLibraryChangesNothing)
{
    for (const char *lib : {"/nonexistent/libnvidia-ml.so.1", "libm.so.6", ""}) {
        loom_topo_host_t h;
        memset(&h, 0x5a, sizeof(h));
        loom_topo_host_t before = h;
        EXPECT_EQ(loom_topo_nvml_detect(&h, lib), -1) << lib;
        EXPECT_EQ(memcmp(&h, &before, sizeof(h)), 0) << lib;
    }
}

// ---- The cache fields in files ----

// t as loom_topo_write writes it, or as loom_topo_print prints it.
std::string Render(const loom_topo_t &t, bool print)
{
    char *buf = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (print)
        loom_topo_print(&t, f);
    else
        EXPECT_EQ(loom_topo_write(&t, f), 0);
    fclose(f);
    std::string text(buf, len);
    free(buf);
    return text;
}

TEST(TopoFile, L3IsOptionalAndRoundTrips)
{
    const std::string with = R"({"loom_topology": 1, "hosts": [{"hostname": "h", "packages": 2,
        "cores": 64, "cpus": 128, "l3_kb": 262144}]})";
    const std::string without = R"({"loom_topology": 1, "hosts": [{"hostname": "h",
        "packages": 1, "cores": 2, "cpus": 2}]})";
    loom_topo_t t;
    char err[512];
    ASSERT_EQ(loom_topo_parse(with.data(), with.size(), &t, err, sizeof(err)), 0) << err;
    EXPECT_EQ(t.hosts[0].l3_kb, 262144);
    std::string text = Render(t, false) + Render(t, true);
    EXPECT_NE(text.find("\"l3_kb\": 262144"), std::string::npos) << text;
    EXPECT_NE(text.find("L3 256 MiB per package"), std::string::npos) << text;
    loom_topo_free(&t);
    ASSERT_EQ(loom_topo_parse(without.data(), without.size(), &t, err, sizeof(err)), 0) << err;
    EXPECT_EQ(t.hosts[0].l3_kb, -1);
    loom_topo_free(&t);
    const std::string bad = R"({"loom_topology": 1, "hosts": [{"hostname": "h", "packages": 1,
        "cores": 2, "cpus": 2, "l3_kb": -7}]})";
    EXPECT_EQ(loom_topo_parse(bad.data(), bad.size(), &t, err, sizeof(err)), -1);
    EXPECT_NE(std::string(err).find("l3_kb"), std::string::npos) << err;
}

// l1d_kb and l2_kb: optional (-1 when absent), written beside l3_kb, read back unchanged,
// printed per core, and refused out of range with the key named.
TEST(TopoFile, CoreCachesAreOptionalAndRoundTrip)
{
    const std::string with = R"({"loom_topology": 1, "hosts": [{"hostname": "h", "packages": 1,
        "cores": 2, "cpus": 2, "l1d_kb": 48, "l2_kb": 2048, "l3_kb": 307200}]})";
    loom_topo_t t, back;
    char err[512];
    ASSERT_EQ(loom_topo_parse(with.data(), with.size(), &t, err, sizeof(err)), 0) << err;
    EXPECT_EQ(t.hosts[0].l1d_kb, 48);
    EXPECT_EQ(t.hosts[0].l2_kb, 2048);
    std::string text = Render(t, false);
    EXPECT_NE(text.find("\"l1d_kb\": 48, \"l2_kb\": 2048, \"l3_kb\": 307200"), std::string::npos)
        << text;
    ASSERT_EQ(loom_topo_parse(text.data(), text.size(), &back, err, sizeof(err)), 0) << err;
    EXPECT_EQ(back.hosts[0].l1d_kb, 48);
    EXPECT_EQ(back.hosts[0].l2_kb, 2048);
    EXPECT_EQ(back.hosts[0].l3_kb, 307200);
    loom_topo_free(&back);
    text = Render(t, true);
    EXPECT_NE(text.find("L3 300 MiB per package, L1d 48 KiB, L2 2 MiB per core"), std::string::npos)
        << text;
    loom_topo_free(&t);

    // A file written before these keys existed: unknown, and written as unknown.
    const std::string without = R"({"loom_topology": 1, "hosts": [{"hostname": "h",
        "packages": 1, "cores": 2, "cpus": 2, "l3_kb": 1024}]})";
    ASSERT_EQ(loom_topo_parse(without.data(), without.size(), &t, err, sizeof(err)), 0) << err;
    EXPECT_EQ(t.hosts[0].l1d_kb, -1);
    EXPECT_EQ(t.hosts[0].l2_kb, -1);
    text = Render(t, false) + Render(t, true);
    EXPECT_NE(text.find("\"l1d_kb\": -1, \"l2_kb\": -1"), std::string::npos) << text;
    EXPECT_EQ(text.find("per core"), std::string::npos) << text;
    loom_topo_free(&t);

    struct Bad {
        const char *field, *key;
    };
    for (const Bad &b : {Bad{R"("l1d_kb": 1073741825)", "hosts[0].l1d_kb"},
                         Bad{R"("l1d_kb": -2)", "hosts[0].l1d_kb"},
                         Bad{R"("l2_kb": 2147483648)", "hosts[0].l2_kb"},
                         Bad{R"("l2_kb": "2048")", "hosts[0].l2_kb"}}) {
        const std::string bad = R"({"loom_topology": 1, "hosts": [{"hostname": "h",
            "packages": 1, "cores": 2, "cpus": 2, )" +
                                std::string(b.field) + "}]}";
        EXPECT_EQ(loom_topo_parse(bad.data(), bad.size(), &t, err, sizeof(err)), -1) << bad;
        EXPECT_NE(std::string(err).find(b.key), std::string::npos) << b.field << ": " << err;
    }
}

} // namespace
