// SPDX-License-Identifier: Apache-2.0
//
// test_tuner.cc - libnccl-tuner-loom.so as NCCL uses it: dlopen, the ncclTunerPlugin_v5 and _v4
// symbols, init on the topology fixtures (LOOM_TOPO_FILE), and getCollInfo on cost tables shaped
// like NCCL's. Its entries must be loom's model's predictions (computed here directly), the
// entries NCCL forbids (-1) and the algorithms loom does not model must stay as they were, the
// choice NCCL would then make must be the model's, and nothing a caller passes may make it fail.
// The plugin's path comes in LOOM_TUNER, the fixtures' folder in LOOM_TOPO_FIXTURES.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>

extern "C" {
#include "topo.h"
#include "tuner_abi.h"
#include "tuner_model.h"
}

namespace {

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
    void *Init(const char *fixture, size_t nranks, size_t nnodes)
    {
        if (fixture)
            setenv("LOOM_TOPO_FILE", Fixture(fixture).c_str(), 1);
        else
            unsetenv("LOOM_TOPO_FILE");
        void *ctx = nullptr;
        nccl_tuner_constants_v5_t constants{};
        nccl_nvl_domain_info_v5_t nvl{};
        EXPECT_EQ(v5_->init(&ctx, 42, nranks, nnodes, Logger, &nvl, &constants), NCCL_OK);
        return ctx;
    }
    // The loom model for the same machine, built here without the plugin.
    loom_tuner_model_t Model(const char *fixture, int nranks, int nnodes)
    {
        loom_topo_t t;
        char err[512];
        EXPECT_EQ(loom_topo_read(Fixture(fixture).c_str(), &t, err, sizeof(err)), 0) << err;
        loom_tuner_model_t m;
        loom_tuner_model_init(&m, &t, nranks, nnodes);
        loom_topo_free(&t);
        return m;
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
                         "node to the network"),
              std::string::npos)
        << g_log;
    loom_tuner_model_t m = Model("cluster-4x-gpu-node.json", 32, 4);
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
                    double want = loom_tuner_predict(&m, coll, a, p, bytes, 1);
                    if (before.t[a][p] == NCCL_ALGO_PROTO_IGNORE || want < 0)
                        EXPECT_EQ(tab.t[a][p], before.t[a][p]) << coll << " " << a << " " << p;
                    else
                        EXPECT_FLOAT_EQ(tab.t[a][p], float(want)) << coll << " " << a << " " << p;
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

} // namespace
