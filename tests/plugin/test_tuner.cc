// SPDX-License-Identifier: Apache-2.0
//
// test_tuner.cc - libnccl-tuner-loom.so as NCCL uses it: dlopen, the ncclTunerPlugin_v5 and _v4
// symbols, init on the topology fixtures (LOOM_TOPO_FILE), and getCollInfo on cost tables shaped
// like NCCL's. Its entries must be the times of docs/nccl-plugins.md's formula, computed here
// without the plugin's code: by hand for a few cases (the arithmetic is in the comments) and by a
// reference written from that page, with NCCL's published latencies (or those NCCL hands to init),
// for the whole table; the entries NCCL forbids (negative) and the algorithms loom does not model
// must stay as they were, NCCL's fp8 Ring penalty must stand, the choice NCCL would then make must
// be the model's, and nothing a caller passes may make it fail. The plugin must load without
// hwloc and libibverbs. The plugin's path comes in LOOM_TUNER, the fixtures' folder in
// LOOM_TOPO_FIXTURES.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" {
#include "tuner_abi.h"
}

namespace {

// ---- The reference: docs/nccl-plugins.md's formula ----------------------------------------------

// Latencies in microseconds, indexed [tree, ring][LL, LL128, Simple] and
// [NVLink, PCI, network][tree, ring][protocol].
struct Latencies {
    double base[2][3];
    double hop[3][2][3];
};
// NCCL 2.28's defaults (src/graph/tuning.cc, ncclTunerConstantsDefaults: baseLatencies and
// hwLatencies); the PCI row's Ring is {1.0, 2.5, 5.7}, its Tree {1.0, 1.9, 4.0}.
constexpr Latencies kNccl = {{{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}},
                             {{{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}},
                              {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}},
                              {{5.0, 8.5, 14.0}, {2.7, 4.0, 14.0}}}};

// NCCL's constants as a v5 init receives them: lat's Tree and Ring, and other algorithms'
// latencies as NCCL has them (here all 0, as for NVLS over PCI).
nccl_tuner_constants_v5_t Constants(const Latencies &lat)
{
    nccl_tuner_constants_v5_t k{};
    for (int a = 0; a < 2; a++)
        for (int p = 0; p < 3; p++) {
            k.baseLatencies[a][p] = lat.base[a][p];
            for (int l = 0; l < 3; l++)
                k.hwLatencies[l][a][p] = lat.hop[l][a][p];
        }
    return k;
}
// What each protocol delivers of a link's rate: LL 1/2, LL128 15/16, Simple 1.
constexpr double kProtoShare[3] = {0.5, 15.0 / 16.0, 1.0};

struct Machine {
    int nranks, nodes;
    double intra_gbs; // GB/s a rank moves inside its node
    double net_gbs;   // GB/s a node moves to the network
    int intra_row;    // 0 NVLink, 1 PCIe or shared memory
};

// Microseconds of algo x proto for coll on S bytes, or -1 where loom models nothing.
double Reference(const Machine &m, int coll, int algo, int proto, double S, int pipe_ops,
                 const Latencies &L = kNccl)
{
    if (algo != NCCL_ALGO_RING && (algo != NCCL_ALGO_TREE || coll != NCCL_FN_ALLREDUCE))
        return -1;
    const int n = m.nranks, N = m.nodes, per_node = (n + N - 1) / N;
    const int a = algo == NCCL_ALGO_RING ? 1 : 0;
    // A rank's slowest link: its NVLink/PCIe/memory rate, or its share of the node's network.
    double gbs = m.intra_gbs;
    if (N > 1)
        gbs = std::min(gbs, m.net_gbs / per_node);
    const double bytes_per_us = gbs * kProtoShare[proto] * 1e3;
    const double in = L.hop[m.intra_row][a][proto], net = L.hop[2][a][proto];
    double lat, bytes;
    if (algo == NCCL_ALGO_TREE) {
        // A chain of per_node - 1 hops in the node and a binary tree of ceil(lg N) network hops
        // across nodes, up and back down; the vector goes up and comes down.
        lat = L.base[0][proto] + 2 * ((per_node - 1) * in + std::ceil(std::log2(N)) * net);
        bytes = 2 * S;
    } else {
        // One pass of the ring: n steps, of which N cross the network (once per node).
        const double pass = (n - N) * in + (N > 1 ? N * net : 0.0);
        if (coll == NCCL_FN_ALLREDUCE) { // reduce-scatter pass + all-gather pass
            lat = L.base[1][proto] + 2 * pass;
            bytes = 2.0 * (n - 1) / n * S;
        } else if (coll == NCCL_FN_ALLGATHER || coll == NCCL_FN_REDUCESCATTER) {
            lat = L.base[1][proto] + pass;
            bytes = double(n - 1) / n * S;
        } else { // Broadcast, Reduce: a pipelined chain carries the whole vector once
            lat = L.base[1][proto] + pass;
            bytes = S;
        }
    }
    return lat * (pipe_ops > 0 ? pipe_ops : 1) + bytes / bytes_per_us;
}

// cluster-4x-gpu-node.json as 32 ranks on 4 nodes: 18 NVLinks of 200 Gbit/s per GPU (450 GB/s),
// 8 active 400 Gbit/s RDMA ports per node (400 GB/s).
const Machine kCluster = {32, 4, 18 * 200 / 8.0, 8 * 400 / 8.0, 0};
// cpu-2socket-2x100g.json as 4 ranks on 1 node: CPU processes over shared memory (10 GB/s, the
// PCIe row of NCCL's hop latencies).
const Machine kCpu = {4, 1, 10.0, 2 * 100 / 8.0, 1};

// The entry must equal want to float precision (the table holds floats).
::testing::AssertionResult Near(float got, double want)
{
    if (std::fabs(got - want) <= 1e-6 * std::fabs(want))
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "got " << got << ", want " << want;
}

std::string g_log;

void Logger(int level, unsigned long flags, const char *file, int line, const char *fmt, ...)
{
    (void)flags, (void)file, (void)line;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    g_log += std::to_string(level) + ": " + buf + "\n";
}

std::string Fixture(const char *name)
{
    const char *dir = getenv("LOOM_TOPO_FIXTURES");
    return std::string(dir ? dir : "tests/data/topo") + "/" + name;
}

class Tuner : public ::testing::Test {
  protected:
    void SetUp() override
    {
        const char *path = getenv("LOOM_TUNER");
        ASSERT_NE(path, nullptr) << "LOOM_TUNER must name libnccl-tuner-loom.so";
        lib_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        ASSERT_NE(lib_, nullptr) << dlerror();
        v5_ = static_cast<const nccl_tuner_v5_t *>(dlsym(lib_, "ncclTunerPlugin_v5"));
        v4_ = static_cast<const nccl_tuner_v4_t *>(dlsym(lib_, "ncclTunerPlugin_v4"));
        ASSERT_NE(v5_, nullptr);
        ASSERT_NE(v4_, nullptr);
        g_log.clear();
    }
    void TearDown() override
    {
        unsetenv("LOOM_TOPO_FILE");
        if (lib_)
            dlclose(lib_);
    }
    // A v5 init as NCCL 2.28 makes it: its default constants unless told otherwise.
    void *Init(const char *fixture, size_t nranks, size_t nnodes,
               nccl_tuner_constants_v5_t constants = Constants(kNccl))
    {
        if (fixture)
            setenv("LOOM_TOPO_FILE", Fixture(fixture).c_str(), 1);
        else
            unsetenv("LOOM_TOPO_FILE");
        void *ctx = nullptr;
        nccl_nvl_domain_info_v5_t nvl{};
        EXPECT_EQ(v5_->init(&ctx, 42, nranks, nnodes, Logger, &nvl, &constants), NCCL_OK);
        return ctx;
    }
    void *lib_ = nullptr;
    const nccl_tuner_v5_t *v5_ = nullptr;
    const nccl_tuner_v4_t *v4_ = nullptr;
};

// A table as NCCL fills it before the tuner: its own times, -1 where a combination is not
// allowed (here CollNet and NVLS, and Tree with LL128).
struct Table {
    float t[NCCL_ALGOS][NCCL_PROTOS];
    Table()
    {
        for (int a = 0; a < NCCL_ALGOS; a++)
            for (int p = 0; p < NCCL_PROTOS; p++)
                t[a][p] = 1000.0f + a * 10 + p;
        for (int a : {NCCL_ALGO_COLLNET_DIRECT, NCCL_ALGO_COLLNET_CHAIN, NCCL_ALGO_NVLS,
                      NCCL_ALGO_NVLS_TREE})
            for (int p = 0; p < NCCL_PROTOS; p++)
                t[a][p] = NCCL_ALGO_PROTO_IGNORE;
        t[NCCL_ALGO_TREE][NCCL_PROTO_LL128] = NCCL_ALGO_PROTO_IGNORE;
    }
    float **ptr()
    {
        return reinterpret_cast<float **>(t);
    }
    // NCCL's choice: the smallest entry that is not -1.
    std::pair<int, int> Chosen() const
    {
        std::pair<int, int> best{-1, -1};
        for (int a = 0; a < NCCL_ALGOS; a++)
            for (int p = 0; p < NCCL_PROTOS; p++)
                if (t[a][p] >= 0 && (best.first < 0 || t[a][p] < t[best.first][best.second]))
                    best = {a, p};
        return best;
    }
};

TEST_F(Tuner, ExportsBothVersionsNamedLoom)
{
    EXPECT_STREQ(v5_->name, "loom");
    EXPECT_STREQ(v4_->name, "loom");
    EXPECT_EQ(v5_->getCollInfo, v4_->getCollInfo);
}

TEST_F(Tuner, FillsTheTableWithLoomsModelOnTheFourNodeCluster)
{
    void *ctx = Init("cluster-4x-gpu-node.json", 32, 4);
    ASSERT_NE(ctx, nullptr);
    EXPECT_NE(g_log.find("32 ranks on 4 nodes; 450.0 GB/s per rank inside a node, 400.0 GB/s per "
                         "node to the network (topology: "),
              std::string::npos)
        << g_log;
    EXPECT_NE(g_log.find("; latencies: NCCL's)"), std::string::npos) << g_log;
    for (int coll = 0; coll < NCCL_FN_COUNT; coll++) {
        for (size_t bytes : {size_t(8), size_t(1) << 10, size_t(1) << 20, size_t(1) << 30}) {
            Table tab, before;
            int nch = 0;
            ASSERT_EQ(
                v5_->getCollInfo(ctx, coll, bytes, 1, tab.ptr(), NCCL_ALGOS, NCCL_PROTOS, 0, &nch),
                NCCL_OK);
            EXPECT_EQ(nch, 0);
            for (int a = 0; a < NCCL_ALGOS; a++)
                for (int p = 0; p < NCCL_PROTOS; p++) {
                    const double want = Reference(kCluster, coll, a, p, double(bytes), 1);
                    if (before.t[a][p] == NCCL_ALGO_PROTO_IGNORE || want < 0)
                        EXPECT_EQ(tab.t[a][p], before.t[a][p]) << coll << " " << a << " " << p;
                    else
                        EXPECT_TRUE(Near(tab.t[a][p], want))
                            << coll << " " << a << " " << p << " " << bytes << " bytes";
                }
        }
    }
    // What NCCL then picks for AllReduce (where it allows no PAT): the tree (fewer network hops)
    // for small messages, the ring (fewer bytes per rank) for large ones.
    Table small, large;
    for (int p = 0; p < NCCL_PROTOS; p++)
        small.t[NCCL_ALGO_PAT][p] = large.t[NCCL_ALGO_PAT][p] = NCCL_ALGO_PROTO_IGNORE;
    int nch = 0;
    v5_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, 1024, 1, small.ptr(), NCCL_ALGOS, NCCL_PROTOS, 0,
                     &nch);
    v5_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, size_t(1) << 30, 1, large.ptr(), NCCL_ALGOS,
                     NCCL_PROTOS, 0, &nch);
    EXPECT_EQ(small.Chosen(), std::make_pair(int(NCCL_ALGO_TREE), int(NCCL_PROTO_LL)));
    EXPECT_EQ(large.Chosen(), std::make_pair(int(NCCL_ALGO_RING), int(NCCL_PROTO_SIMPLE)));
    EXPECT_EQ(v5_->finalize(ctx), NCCL_OK);
}

// A few entries worked out by hand from docs/nccl-plugins.md, independent of the reference above.
TEST_F(Tuner, EntriesWorkedOutByHand)
{
    struct Case {
        const Machine *m;
        const char *fixture;
        int coll, algo, proto;
        size_t bytes;
        int pipe_ops;
        double want_us;
    };
    const Case cases[] = {
        // Cluster (a rank's rate: min(450, 400 / 8) = 50 GB/s), AllReduce Ring Simple, 1 GiB:
        // hops (32 - 4) x 3.4 + 4 x 14.0 = 151.2; latency 8.4 + 2 x 151.2 = 310.8;
        // 2 x 31/32 x 2^30 = 2080374784 bytes at 50000 B/us = 41607.49568 us.
        {&kCluster, "cluster-4x-gpu-node.json", NCCL_FN_ALLREDUCE, NCCL_ALGO_RING,
         NCCL_PROTO_SIMPLE, size_t(1) << 30, 1, 310.8 + 41607.49568},
        // Cluster, AllReduce Tree LL, 1 KiB: 6.8 + 2 x (7 x 0.6 + 2 x 5.0) = 35.2;
        // 2 x 1024 bytes at 25000 B/us = 0.08192 us.
        {&kCluster, "cluster-4x-gpu-node.json", NCCL_FN_ALLREDUCE, NCCL_ALGO_TREE, NCCL_PROTO_LL,
         1024, 1, 35.2 + 0.08192},
        // Cluster, AllGather Ring LL128, 1 MiB: 14.0 + 28 x 1.9 + 4 x 4.0 = 83.2;
        // 31/32 x 2^20 = 1015808 bytes at 46875 B/us = 21.67057066... us.
        {&kCluster, "cluster-4x-gpu-node.json", NCCL_FN_ALLGATHER, NCCL_ALGO_RING, NCCL_PROTO_LL128,
         size_t(1) << 20, 1, 83.2 + 1015808.0 / 46875.0},
        // Cluster, Broadcast Ring Simple, 8 bytes, 4 pipelined ops: 4 x (8.4 + 151.2) = 638.4;
        // 8 bytes at 50000 B/us = 0.00016 us.
        {&kCluster, "cluster-4x-gpu-node.json", NCCL_FN_BROADCAST, NCCL_ALGO_RING,
         NCCL_PROTO_SIMPLE, 8, 4, 638.4 + 0.00016},
        // CPU node, 4 ranks over shared memory (10 GB/s, NCCL's PCI hops), AllReduce Ring
        // Simple, 1 MiB: 8.4 + 2 x 3 x 5.7 = 42.6; 1.5 x 2^20 bytes at 10000 B/us = 157.2864.
        {&kCpu, "cpu-2socket-2x100g.json", NCCL_FN_ALLREDUCE, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE,
         size_t(1) << 20, 1, 42.6 + 157.2864},
        // CPU node, ReduceScatter Ring LL128, 64 KiB: 14.0 + 3 x 2.5 = 21.5;
        // 3/4 x 65536 = 49152 bytes at 9375 B/us = 5.24288 us.
        {&kCpu, "cpu-2socket-2x100g.json", NCCL_FN_REDUCESCATTER, NCCL_ALGO_RING, NCCL_PROTO_LL128,
         65536, 1, 21.5 + 5.24288},
        // CPU node, AllReduce Tree Simple, 4 KiB: 8.4 + 2 x 3 x 4.0 = 32.4;
        // 8192 bytes at 10000 B/us = 0.8192 us.
        {&kCpu, "cpu-2socket-2x100g.json", NCCL_FN_ALLREDUCE, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE,
         4096, 1, 32.4 + 0.8192},
    };
    for (const Case &c : cases) {
        void *ctx = Init(c.fixture, c.m->nranks, c.m->nodes);
        ASSERT_NE(ctx, nullptr);
        Table tab;
        int nch = 0;
        ASSERT_EQ(v5_->getCollInfo(ctx, c.coll, c.bytes, c.pipe_ops, tab.ptr(), NCCL_ALGOS,
                                   NCCL_PROTOS, 0, &nch),
                  NCCL_OK);
        EXPECT_TRUE(Near(tab.t[c.algo][c.proto], c.want_us))
            << c.fixture << " coll " << c.coll << " algo " << c.algo << " proto " << c.proto;
        EXPECT_TRUE(Near(tab.t[c.algo][c.proto],
                         Reference(*c.m, c.coll, c.algo, c.proto, double(c.bytes), c.pipe_ops)))
            << "the reference disagrees with the hand computation";
        v5_->finalize(ctx);
    }
}

TEST_F(Tuner, ReadsEachFixturesLinks)
{
    struct Case {
        const char *fixture;
        int nranks, nnodes;
        const char *log;
    };
    for (const Case &c : {Case{"gpu-8x-nvswitch-8x400g.json", 8, 1, "450.0 GB/s per rank inside"},
                          Case{"cpu-2socket-2x100g.json", 4, 1, "25.0 GB/s per node"},
                          Case{"vm-2core.json", 2, 1, "1.2 GB/s per node"}}) {
        g_log.clear();
        void *ctx = Init(c.fixture, c.nranks, c.nnodes);
        ASSERT_NE(ctx, nullptr);
        EXPECT_NE(g_log.find(c.log), std::string::npos) << c.fixture << "\n" << g_log;
        v5_->finalize(ctx);
    }
}

TEST_F(Tuner, NeverFailsACall)
{
    // A topology file that cannot be read: a warning, and this host instead.
    setenv("LOOM_TOPO_FILE", "/nonexistent/topo.json", 1);
    void *ctx = nullptr;
    ASSERT_EQ(v4_->init(16, 2, Logger, &ctx), NCCL_OK);
    ASSERT_NE(ctx, nullptr);
    EXPECT_NE(g_log.find("/nonexistent/topo.json: cannot open"), std::string::npos) << g_log;
    EXPECT_NE(g_log.find("topology: detected"), std::string::npos) << g_log;
    Table tab, before;
    int nch = 0;
    // Unknown collectives, tables of another shape, no table, no context: nothing changes.
    EXPECT_EQ(v4_->getCollInfo(ctx, 7, 1024, 1, tab.ptr(), NCCL_ALGOS, NCCL_PROTOS, 0, &nch),
              NCCL_OK);
    EXPECT_EQ(v4_->getCollInfo(ctx, -3, 1024, 1, tab.ptr(), NCCL_ALGOS, NCCL_PROTOS, 0, &nch),
              NCCL_OK);
    EXPECT_EQ(v4_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, 1024, 1, tab.ptr(), NCCL_ALGOS, 2, 0, &nch),
              NCCL_OK);
    EXPECT_EQ(memcmp(tab.t, before.t, sizeof(tab.t)), 0);
    EXPECT_EQ(v4_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, 1024, 1, nullptr, NCCL_ALGOS, NCCL_PROTOS, 0,
                               &nch),
              NCCL_OK);
    EXPECT_EQ(v4_->getCollInfo(nullptr, NCCL_FN_ALLREDUCE, 1024, 1, tab.ptr(), NCCL_ALGOS,
                               NCCL_PROTOS, 0, &nch),
              NCCL_OK);
    // Fewer algorithms than loom knows: only those are touched; zero bytes and zero pipe ops are
    // ordinary calls.
    Table two;
    EXPECT_EQ(v4_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, 0, 0, two.ptr(), 2, NCCL_PROTOS, 1, &nch),
              NCCL_OK);
    EXPECT_NE(two.t[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE],
              before.t[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE]);
    EXPECT_EQ(two.t[NCCL_ALGO_PAT][NCCL_PROTO_SIMPLE], before.t[NCCL_ALGO_PAT][NCCL_PROTO_SIMPLE]);
    EXPECT_EQ(v4_->destroy(ctx), NCCL_OK);
    // Degenerate sizes at init.
    ASSERT_EQ(v4_->init(0, 0, nullptr, &ctx), NCCL_OK);
    EXPECT_EQ(v4_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, 1 << 20, 1, two.ptr(), NCCL_ALGOS,
                               NCCL_PROTOS, 0, &nch),
              NCCL_OK);
    EXPECT_EQ(v4_->destroy(ctx), NCCL_OK);
    EXPECT_EQ(v4_->init(4, 1, nullptr, nullptr), NCCL_OK);
}

// The latencies NCCL hands to a v5 init are the ones its own model uses, and the plugin's; v4
// gets none, and constants that are not times leave NCCL 2.28's defaults with a WARN.
TEST_F(Tuner, TakesItsLatenciesFromNcclsConstants)
{
    Latencies other = kNccl;
    other.base[1][NCCL_PROTO_SIMPLE] = 20.0;  // Ring Simple base
    other.hop[1][1][NCCL_PROTO_SIMPLE] = 7.5; // PCI Ring Simple hop
    other.hop[1][0][NCCL_PROTO_LL] = 3.0;     // PCI Tree LL hop
    struct Case {
        nccl_tuner_constants_v5_t k;
        const Latencies *want;
        const char *log;
        bool warn;
    };
    nccl_tuner_constants_v5_t zero{}, nan_hop = Constants(kNccl);
    nan_hop.hwLatencies[NCCL_HW_NET][NCCL_ALGO_RING][NCCL_PROTO_LL128] = NAN;
    const Case cases[] = {{Constants(other), &other, "latencies: NCCL's)", false},
                          {Constants(kNccl), &kNccl, "latencies: NCCL's)", false},
                          {zero, &kNccl, "latencies: NCCL 2.28's defaults)", true},
                          {nan_hop, &kNccl, "latencies: NCCL 2.28's defaults)", true}};
    for (const Case &c : cases) {
        g_log.clear();
        void *ctx = Init("cpu-2socket-2x100g.json", kCpu.nranks, kCpu.nodes, c.k);
        ASSERT_NE(ctx, nullptr);
        EXPECT_NE(g_log.find(c.log), std::string::npos) << g_log;
        EXPECT_EQ(g_log.find("2: loom tuner: NCCL's latency constants are not times") !=
                      std::string::npos,
                  c.warn)
            << g_log;
        for (int coll : {int(NCCL_FN_ALLREDUCE), int(NCCL_FN_ALLGATHER)}) {
            Table tab;
            int nch = 0;
            ASSERT_EQ(v5_->getCollInfo(ctx, coll, 1 << 20, 1, tab.ptr(), NCCL_ALGOS, NCCL_PROTOS, 0,
                                       &nch),
                      NCCL_OK);
            for (int a : {int(NCCL_ALGO_TREE), int(NCCL_ALGO_RING)})
                for (int p = 0; p < NCCL_PROTOS; p++) {
                    const double want = Reference(kCpu, coll, a, p, 1 << 20, 1, *c.want);
                    if (want >= 0 && tab.t[a][p] >= 0) {
                        EXPECT_TRUE(Near(tab.t[a][p], want)) << coll << " " << a << " " << p;
                    }
                }
        }
        v5_->finalize(ctx);
    }
    // By hand, CPU node (PCI hops, 10 GB/s), AllReduce Ring Simple, 1 MiB, with NCCL's constants
    // changed: 20.0 + 2 x 3 x 7.5 = 65.0; 1.5 x 2^20 bytes at 10000 B/us = 157.2864 us.
    void *ctx = Init("cpu-2socket-2x100g.json", kCpu.nranks, kCpu.nodes, Constants(other));
    Table tab;
    int nch = 0;
    v5_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, 1 << 20, 1, tab.ptr(), NCCL_ALGOS, NCCL_PROTOS, 0,
                     &nch);
    EXPECT_TRUE(Near(tab.t[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE], 65.0 + 157.2864));
    v5_->finalize(ctx);
    // v4 has no constants: NCCL 2.28's defaults, 8.4 + 2 x 3 x 5.7 = 42.6 for the same entry.
    setenv("LOOM_TOPO_FILE", Fixture("cpu-2socket-2x100g.json").c_str(), 1);
    g_log.clear();
    ASSERT_EQ(v4_->init(kCpu.nranks, kCpu.nodes, Logger, &ctx), NCCL_OK);
    EXPECT_NE(g_log.find("latencies: NCCL 2.28's defaults)"), std::string::npos) << g_log;
    v4_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, 1 << 20, 1, tab.ptr(), NCCL_ALGOS, NCCL_PROTOS, 0,
                     &nch);
    EXPECT_TRUE(Near(tab.t[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE], 42.6 + 157.2864));
    v4_->destroy(ctx);
}

// NCCL's table for an fp8 collective on more than 8 ranks: its own times (here loom's reference
// times 3, so that the two differ), with every Ring entry multiplied by 1024 (a disabled one, -1,
// becoming -1024). Tree for AllReduce; PAT for AllGather and ReduceScatter; Ring alone for
// Broadcast and Reduce.
Table Fp8Table(const Machine &m, int coll, size_t bytes)
{
    Table t;
    for (int a = 0; a < NCCL_ALGOS; a++)
        for (int p = 0; p < NCCL_PROTOS; p++)
            t.t[a][p] = NCCL_ALGO_PROTO_IGNORE;
    for (int p = 0; p < NCCL_PROTOS; p++) {
        const float ring = float(3 * Reference(m, coll, NCCL_ALGO_RING, p, double(bytes), 1));
        t.t[NCCL_ALGO_RING][p] = ring * 1024.0f;
        if (coll == NCCL_FN_ALLREDUCE)
            t.t[NCCL_ALGO_TREE][p] =
                float(3 * Reference(m, coll, NCCL_ALGO_TREE, p, double(bytes), 1));
        if (coll == NCCL_FN_ALLGATHER || coll == NCCL_FN_REDUCESCATTER)
            t.t[NCCL_ALGO_PAT][p] = 1.5f * ring;
    }
    t.t[NCCL_ALGO_RING][NCCL_PROTO_LL128] = NCCL_ALGO_PROTO_IGNORE * 1024.0f;
    return t;
}

TEST_F(Tuner, KeepsNcclsFp8RingPenalty)
{
    void *ctx = Init("cluster-4x-gpu-node.json", kCluster.nranks, kCluster.nodes);
    ASSERT_NE(ctx, nullptr);
    for (int coll = 0; coll < NCCL_FN_COUNT; coll++)
        for (size_t bytes : {size_t(8), size_t(1) << 10, size_t(1) << 20, size_t(1) << 30}) {
            Table tab = Fp8Table(kCluster, coll, bytes), before = tab;
            int nch = 0;
            ASSERT_EQ(
                v5_->getCollInfo(ctx, coll, bytes, 1, tab.ptr(), NCCL_ALGOS, NCCL_PROTOS, 0, &nch),
                NCCL_OK);
            // what NCCL disabled stays disabled, penalty or not
            EXPECT_EQ(tab.t[NCCL_ALGO_RING][NCCL_PROTO_LL128], -1024.0f) << coll << " " << bytes;
            const bool alone = coll == NCCL_FN_BROADCAST || coll == NCCL_FN_REDUCE;
            if (alone)
                continue; // Ring is NCCL's only algorithm: loom picks its protocol
            for (int p = 0; p < NCCL_PROTOS; p++)
                EXPECT_EQ(tab.t[NCCL_ALGO_RING][p], before.t[NCCL_ALGO_RING][p])
                    << "coll " << coll << " proto " << p << " " << bytes << " bytes";
            EXPECT_NE(tab.Chosen().first, int(NCCL_ALGO_RING)) << coll << " " << bytes;
            // loom still models the other algorithm where it stays ahead of Ring
            if (coll == NCCL_FN_ALLREDUCE) {
                EXPECT_TRUE(Near(tab.t[NCCL_ALGO_TREE][NCCL_PROTO_SIMPLE],
                                 Reference(kCluster, coll, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE,
                                           double(bytes), 1)));
            }
        }
    // Where loom's time for Tree would rank it behind the penalized Ring, NCCL's stays: the tuner
    // never makes NCCL choose the lossy ring. NCCL: Tree 1 us, Ring 100 us (penalized); loom's
    // Tree for 1 GiB is tens of milliseconds.
    Table t;
    for (int a = 0; a < NCCL_ALGOS; a++)
        for (int p = 0; p < NCCL_PROTOS; p++)
            t.t[a][p] = a == NCCL_ALGO_TREE ? 1.0f + p : a == NCCL_ALGO_RING ? 100.0f + p : -1.0f;
    Table before = t;
    int nch = 0;
    v5_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, size_t(1) << 30, 1, t.ptr(), NCCL_ALGOS, NCCL_PROTOS,
                     0, &nch);
    EXPECT_EQ(memcmp(t.t, before.t, sizeof(t.t)), 0);
    EXPECT_EQ(t.Chosen(), std::make_pair(int(NCCL_ALGO_TREE), int(NCCL_PROTO_LL)));
    v5_->finalize(ctx);
}

// What is not the penalty: Ring 20 times the best other entry on 32 ranks (NCCL's own model at
// thousands of ranks), or 1024 times on 8 ranks (NCCL penalizes only above 8). loom's times go in.
TEST_F(Tuner, TellsThePenaltyFromOrdinaryTables)
{
    struct Case {
        const char *fixture;
        Machine m;
        float ring_factor;
    };
    const Case cases[] = {{"cluster-4x-gpu-node.json", kCluster, 20.0f},
                          {"gpu-8x-nvswitch-8x400g.json", {8, 1, 450.0, 400.0, 0}, 1024.0f}};
    for (const Case &c : cases) {
        void *ctx = Init(c.fixture, c.m.nranks, c.m.nodes);
        ASSERT_NE(ctx, nullptr);
        Table t;
        for (int a = 0; a < NCCL_ALGOS; a++)
            for (int p = 0; p < NCCL_PROTOS; p++)
                t.t[a][p] = a == NCCL_ALGO_TREE   ? 10.0f + p
                            : a == NCCL_ALGO_RING ? c.ring_factor * (10.0f + p)
                                                  : -1.0f;
        int nch = 0;
        v5_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, 1 << 20, 1, t.ptr(), NCCL_ALGOS, NCCL_PROTOS, 0,
                         &nch);
        for (int p = 0; p < NCCL_PROTOS; p++)
            EXPECT_TRUE(Near(t.t[NCCL_ALGO_RING][p],
                             Reference(c.m, NCCL_FN_ALLREDUCE, NCCL_ALGO_RING, p, 1 << 20, 1)))
                << c.fixture << " proto " << p;
        v5_->finalize(ctx);
    }
}

// ---- Loading without hwloc and libibverbs ------------------------------------------------------

// The DT_NEEDED entries of an ELF64 shared object, read from the file.
std::vector<std::string> Needed(const char *path)
{
    std::ifstream f(path, std::ios::binary);
    std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<std::string> out;
    if (b.size() < sizeof(Elf64_Ehdr) || memcmp(b.data(), ELFMAG, SELFMAG) != 0 ||
        b[EI_CLASS] != ELFCLASS64)
        return out;
    Elf64_Ehdr eh;
    memcpy(&eh, b.data(), sizeof(eh));
    std::vector<Elf64_Phdr> ph(eh.e_phnum);
    if (eh.e_phoff + size_t(eh.e_phnum) * sizeof(Elf64_Phdr) > b.size())
        return out;
    memcpy(ph.data(), b.data() + eh.e_phoff, ph.size() * sizeof(Elf64_Phdr));
    // the string table is named by its address: the file offset is in the load segment holding it
    auto offset_of = [&](Elf64_Addr addr) -> size_t {
        for (const Elf64_Phdr &p : ph)
            if (p.p_type == PT_LOAD && addr >= p.p_vaddr && addr < p.p_vaddr + p.p_filesz)
                return size_t(addr - p.p_vaddr + p.p_offset);
        return b.size();
    };
    for (const Elf64_Phdr &p : ph) {
        if (p.p_type != PT_DYNAMIC || p.p_offset + p.p_filesz > b.size())
            continue;
        std::vector<Elf64_Dyn> dyn(p.p_filesz / sizeof(Elf64_Dyn));
        memcpy(dyn.data(), b.data() + p.p_offset, dyn.size() * sizeof(Elf64_Dyn));
        size_t strtab = b.size();
        for (const Elf64_Dyn &d : dyn)
            if (d.d_tag == DT_STRTAB)
                strtab = offset_of(d.d_un.d_ptr);
        for (const Elf64_Dyn &d : dyn)
            if (d.d_tag == DT_NEEDED && strtab + d.d_un.d_val < b.size())
                out.emplace_back(
                    b.data() + strtab + d.d_un.d_val,
                    strnlen(b.data() + strtab + d.d_un.d_val, b.size() - strtab - d.d_un.d_val));
    }
    return out;
}

int AddMapped(struct dl_phdr_info *info, size_t, void *data)
{
    static_cast<std::vector<std::string> *>(data)->push_back(info->dlpi_name ? info->dlpi_name
                                                                             : "");
    return 0;
}

bool IsHwlocOrVerbs(const std::string &lib)
{
    return lib.find("libhwloc") != std::string::npos || lib.find("libibverbs") != std::string::npos;
}

// NCCL drops a tuner whose libraries are missing, silently: the plugin must need none but libc's.
// Its NEEDED entries name neither hwloc nor libibverbs, and this process (which links neither)
// has neither mapped after loading it, detecting this host and answering a call.
TEST_F(Tuner, LoadsWithoutHwlocAndLibibverbs)
{
    const std::vector<std::string> needed = Needed(getenv("LOOM_TUNER"));
    ASSERT_FALSE(needed.empty()) << "no DT_NEEDED entries read from " << getenv("LOOM_TUNER");
    std::string all;
    for (const std::string &n : needed)
        all += n + " ";
    EXPECT_NE(all.find("libc.so"), std::string::npos) << all;
    for (const std::string &n : needed)
        EXPECT_FALSE(IsHwlocOrVerbs(n)) << all;

    void *ctx = Init(nullptr, 16, 2); // no topology file: this host, detected
    ASSERT_NE(ctx, nullptr);
    Table tab, before;
    int nch = 0;
    ASSERT_EQ(v5_->getCollInfo(ctx, NCCL_FN_ALLREDUCE, 1 << 20, 1, tab.ptr(), NCCL_ALGOS,
                               NCCL_PROTOS, 0, &nch),
              NCCL_OK);
    EXPECT_NE(tab.t[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE],
              before.t[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE]);
    std::vector<std::string> mapped;
    dl_iterate_phdr(AddMapped, &mapped);
    bool plugin_mapped = false;
    for (const std::string &m : mapped) {
        EXPECT_FALSE(IsHwlocOrVerbs(m)) << m;
        plugin_mapped |= m.find("libnccl-tuner-loom") != std::string::npos;
    }
    EXPECT_TRUE(plugin_mapped) << "the walk over the mapped objects found not even the plugin";
    v5_->finalize(ctx);
}

} // namespace
