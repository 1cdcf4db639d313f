// SPDX-License-Identifier: Apache-2.0
//
// test_shm_plan.cc - unit tests of loom_shm_plan (shm_plan.c), the one decision of how a
// shared-memory collective runs, for machines described by the topology fixtures
// shm-small-l3.json (an EPYC-like chiplet part: 16 CPUs, 32 KiB L1d, 512 KiB L2, 32 MiB L3) and
// shm-large-l3.json (a cloud Xeon: 2 CPUs, 48 KiB L1d, 2 MiB L2, 300 MiB L3), and for overrides.
// Decisions only, no timing: docs/shm-collectives.md states each rule and docs/PERFORMANCE.md
// the measurements behind it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

extern "C" {
#include "shm/shm_plan.h"
#include "topo.h"
}

namespace {

constexpr size_t K = 1024, M = K * K;

// The machine a communicator on the fixture's host plans with: its caches and CPUs, a 1 MiB
// slot (512 KiB halves), 4 KiB pages, single copy agreed and the kernel's copy fast.
loom_shm_machine_t FromFixture(const char *name)
{
    loom_shm_machine_t m = {};
    const char *dir = getenv("LOOM_TOPO_FIXTURES");
    const std::string path = std::string(dir ? dir : "tests/data/topo") + "/" + name;
    loom_topo_t t = {};
    char err[256] = "";
    EXPECT_EQ(loom_topo_read(path.c_str(), &t, err, sizeof(err)), 0) << err;
    EXPECT_EQ(t.nhosts, 1) << path;
    if (t.nhosts > 0) {
        m.cpus = t.hosts[0].cpus;
        m.l1d = (size_t)t.hosts[0].l1d_kb * K;
        m.l2 = (size_t)t.hosts[0].l2_kb * K;
        m.l3 = (size_t)t.hosts[0].l3_kb * K;
    }
    loom_topo_free(&t);
    m.half = 512 * K;
    m.page = 4 * K;
    m.single_copy = 1;
    m.kernel_fast = 1;
    return m;
}

loom_shm_plan_t Plan(loom_coll_kind_t kind, size_t bytes, int n, const loom_shm_machine_t &m,
                     loom_shm_overrides_t o = {})
{
    loom_shm_plan_t p;
    loom_shm_plan(kind, bytes, n, &m, &o, &p);
    return p;
}

TEST(ShmPlan, FixturesDescribeTheTwoMachines)
{
    const loom_shm_machine_t small = FromFixture("shm-small-l3.json");
    const loom_shm_machine_t large = FromFixture("shm-large-l3.json");
    EXPECT_EQ(small.l3, 32 * M);
    EXPECT_EQ(small.l2, 512 * K);
    EXPECT_EQ(small.cpus, 16);
    EXPECT_EQ(large.l3, 300 * M);
    EXPECT_EQ(large.l2, 2 * M);
    EXPECT_EQ(large.cpus, 2);
}

// Streaming stores start where the destination fits neither twice the L2 nor the L3's share:
// on the large-L3 VM the L2 decides (4 MiB); on the chiplet part with 8 ranks the L2 too
// (1 MiB), and with the L3 shared by 16 ranks its 2 MiB share would still be above that.
TEST(ShmPlan, StreamingThresholdFollowsTheCaches)
{
    const loom_shm_machine_t small = FromFixture("shm-small-l3.json");
    const loom_shm_machine_t large = FromFixture("shm-large-l3.json");
    EXPECT_EQ(loom_shm_nt_threshold(&large, 2), 4 * M);
    EXPECT_EQ(loom_shm_nt_threshold(&large, 8), 4 * M); // 2 CPUs share the L3, not 8
    EXPECT_EQ(loom_shm_nt_threshold(&small, 8), 1 * M);
    // An L3 smaller than the L2s it serves: its share decides.
    loom_shm_machine_t tight = small;
    tight.l3 = 4 * M;
    EXPECT_EQ(loom_shm_nt_threshold(&tight, 16), 256 * K);
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 64 * M, 2, large).nt_out_min, 4 * M);
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 64 * M, 8, small).nt_out_min, 1 * M);
    // Only a Broadcast root streams its copy in, from the same threshold with more ranks than
    // CPUs too.
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 64 * M, 2, large).nt_in_min, SHM_NEVER);
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 64 * M, 2, large).nt_in_min, 4 * M);
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 64 * M, 4, large).nt_in_min, 4 * M);
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 64 * M, 8, small).nt_in_min, 1 * M); // 8 <= 16 CPUs
}

TEST(ShmPlan, FlatWhileTheReductionFitsItsCache)
{
    const loom_shm_machine_t small = FromFixture("shm-small-l3.json");
    const loom_shm_machine_t large = FromFixture("shm-large-l3.json");
    // AllReduce: n copies in the L1d (48 KiB: 24 KiB at 2 ranks; 32 KiB: 4 KiB at 8).
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 24 * K, 2, large).variant, (uint32_t)SHM_ALGO_FLAT);
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 32 * K, 2, large).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 4 * K, 8, small).variant, (uint32_t)SHM_ALGO_FLAT);
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 8 * K, 8, small).variant, (uint32_t)SHM_ALGO_CICO);
    // Reduce: n copies in half the L2 (1 MiB: 512 KiB at 2 ranks; 256 KiB: 32 KiB at 8).
    EXPECT_EQ(Plan(LOOM_COLL_REDUCE, 512 * K, 2, large).variant, (uint32_t)SHM_ALGO_FLAT);
    EXPECT_EQ(Plan(LOOM_COLL_REDUCE, 1 * M, 2, large).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_REDUCE, 32 * K, 8, small).variant, (uint32_t)SHM_ALGO_FLAT);
    EXPECT_EQ(Plan(LOOM_COLL_REDUCE, 64 * K, 8, small).variant, (uint32_t)SHM_ALGO_CICO);
    // Never more than a slot half, whatever the caches.
    loom_shm_machine_t huge = large;
    huge.l2 = 64 * M;
    EXPECT_EQ(Plan(LOOM_COLL_REDUCE, 1 * M, 2, huge).variant, (uint32_t)SHM_ALGO_CICO);
}

TEST(ShmPlan, SingleCopyWhereOneKernelCopyBeatsTwo)
{
    const loom_shm_machine_t small = FromFixture("shm-small-l3.json");
    const loom_shm_machine_t large = FromFixture("shm-large-l3.json");
    // From a page on.
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 2 * K, 2, large).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 4 * K, 2, large).variant, (uint32_t)SHM_ALGO_CMA);
    // AllGather, AllToAll: while a rank receives less than the streaming threshold; the
    // chiplet part's smaller L2 ends single copy sooner.
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 4 * M, 2, large).variant, (uint32_t)SHM_ALGO_CMA);
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 8 * M, 2, large).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_ALLTOALL, 1 * M, 8, small).variant, (uint32_t)SHM_ALGO_CMA);
    EXPECT_EQ(Plan(LOOM_COLL_ALLTOALL, 2 * M, 8, small).variant, (uint32_t)SHM_ALGO_CICO);
    // Broadcast at every size.
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 1 * (K * M), 2, large).variant, (uint32_t)SHM_ALGO_CMA);
    // More ranks than CPUs: only past one round of cico (a slot half).
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 1 * M, 8, large).variant, (uint32_t)SHM_ALGO_CMA);
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 512 * K, 8, large).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 64 * K, 4, large).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 1 * M, 4, large).variant, (uint32_t)SHM_ALGO_CMA);
    EXPECT_EQ(Plan(LOOM_COLL_ALLTOALL, 64 * K, 16, small).variant, (uint32_t)SHM_ALGO_CMA);
    // An AllToAll, whose arena copies each byte twice, from where a rank receives its L1d, at
    // every size past that (32 KiB on the chiplet part, 48 KiB on the VM).
    EXPECT_EQ(Plan(LOOM_COLL_ALLTOALL, 32 * K, 4, large).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_ALLTOALL, 64 * K, 4, large).variant, (uint32_t)SHM_ALGO_CMA);
    EXPECT_EQ(Plan(LOOM_COLL_ALLTOALL, 16 * M, 4, large).variant, (uint32_t)SHM_ALGO_CMA);
    EXPECT_EQ(Plan(LOOM_COLL_ALLTOALL, 32 * K, 32, small).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_ALLTOALL, 40 * K, 32, small).variant, (uint32_t)SHM_ALGO_CMA);
    EXPECT_EQ(Plan(LOOM_COLL_ALLTOALL, 1 * (K * M), 32, small).variant, (uint32_t)SHM_ALGO_CMA);
    // ... and a Broadcast then only below the streaming threshold, as the others.
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 2 * M, 4, large).variant, (uint32_t)SHM_ALGO_CMA);
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 16 * M, 4, large).variant, (uint32_t)SHM_ALGO_CICO);
    // Never where ranks reduce.
    EXPECT_EQ(Plan(LOOM_COLL_REDUCE_SCATTER, 1 * M, 2, large).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 1 * M, 2, large).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_REDUCE, 4 * M, 2, large).variant, (uint32_t)SHM_ALGO_CICO);
    // A kernel copy slower than two memcpys, or no single copy agreed: never.
    loom_shm_machine_t slow = large;
    slow.kernel_fast = 0;
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 1 * M, 2, slow).variant, (uint32_t)SHM_ALGO_CICO);
    loom_shm_machine_t none = large;
    none.single_copy = 0;
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 1 * M, 2, none).variant, (uint32_t)SHM_ALGO_CICO);
    // LOOM_SHM_COLL_CMA=2: every call past tiny and flat, reductions too.
    loom_shm_machine_t always = slow;
    always.single_copy = 2;
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 1 * M, 2, always).variant, (uint32_t)SHM_ALGO_CMA);
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 8 * K, 2, always).variant, (uint32_t)SHM_ALGO_FLAT);
}

TEST(ShmPlan, TinyAndBarrierBeforeAnyRule)
{
    const loom_shm_machine_t large = FromFixture("shm-large-l3.json");
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 48, 2, large).variant, (uint32_t)SHM_ALGO_TINY);
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 2 * 40, 2, large).variant, (uint32_t)SHM_ALGO_TINY);
    EXPECT_EQ(Plan(LOOM_COLL_BCAST, 56, 2, large).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_BARRIER, 0, 2, large).variant, (uint32_t)SHM_ALGO_BARRIER);
}

TEST(ShmPlan, OverridesWin)
{
    const loom_shm_machine_t large = FromFixture("shm-large-l3.json");
    loom_shm_overrides_t o = {};
    o.nt_stores = 1;
    loom_shm_plan_t p = Plan(LOOM_COLL_ALLGATHER, 64 * K, 2, large, o);
    EXPECT_EQ(p.nt_out_min, 0u);
    EXPECT_EQ(p.nt_in_min, 0u);
    o.nt_stores = -1;
    p = Plan(LOOM_COLL_BCAST, 64 * M, 2, large, o);
    EXPECT_EQ(p.nt_out_min, SHM_NEVER);
    EXPECT_EQ(p.nt_in_min, SHM_NEVER);
    o = {};
    o.cma_min = 1 * M;
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 512 * K, 2, large, o).variant, (uint32_t)SHM_ALGO_CICO);
    EXPECT_EQ(Plan(LOOM_COLL_ALLGATHER, 1 * M, 2, large, o).variant, (uint32_t)SHM_ALGO_CMA);
    o = {};
    o.block_bytes = 64 * K;
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 1 * M, 2, large, o).block_bytes, 64 * K);
}

// The block is a sixteenth of the L2 within 16 KiB to 1 MiB; unknown caches take the
// documented assumption.
// A flat Reduce's pieces are at least the L1d: 48 KiB on the VM, 32 KiB on the chiplet part, and
// the assumed 32 KiB where the L1d is unknown.
TEST(ShmPlan, PieceFollowsTheL1d)
{
    const loom_shm_machine_t small = FromFixture("shm-small-l3.json");
    const loom_shm_machine_t large = FromFixture("shm-large-l3.json");
    EXPECT_EQ(Plan(LOOM_COLL_REDUCE, 256 * K, 2, large).piece_bytes, 48 * K);
    EXPECT_EQ(Plan(LOOM_COLL_REDUCE, 256 * K, 2, small).piece_bytes, 32 * K);
    loom_shm_machine_t unknown = large;
    unknown.l1d = 0;
    EXPECT_EQ(Plan(LOOM_COLL_REDUCE, 256 * K, 2, unknown).piece_bytes, 32 * K);
}

TEST(ShmPlan, BlockFollowsTheL2)
{
    const loom_shm_machine_t small = FromFixture("shm-small-l3.json");
    const loom_shm_machine_t large = FromFixture("shm-large-l3.json");
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 1 * M, 2, large).block_bytes, 128 * K);
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 1 * M, 2, small).block_bytes, 32 * K);
    loom_shm_machine_t unknown = large;
    unknown.l1d = unknown.l2 = unknown.l3 = 0;
    EXPECT_EQ(Plan(LOOM_COLL_ALLREDUCE, 1 * M, 2, unknown).block_bytes, SHM_L2_ASSUMED / 16);
    EXPECT_EQ(loom_shm_nt_threshold(&unknown, 2), 2 * (size_t)SHM_L2_ASSUMED);
}

// Every plan names its reasons, and the same inputs give the same plan.
TEST(ShmPlan, ReasonsAndRepeatability)
{
    const loom_shm_machine_t large = FromFixture("shm-large-l3.json");
    const loom_coll_kind_t kinds[] = {LOOM_COLL_ALLREDUCE, LOOM_COLL_REDUCE_SCATTER,
                                      LOOM_COLL_REDUCE,    LOOM_COLL_ALLGATHER,
                                      LOOM_COLL_BCAST,     LOOM_COLL_ALLTOALL};
    for (loom_coll_kind_t k : kinds)
        for (size_t b = 8; b <= 256 * M; b *= 4) {
            const loom_shm_plan_t p = Plan(k, b, 2, large), q = Plan(k, b, 2, large);
            ASSERT_NE(p.reason, nullptr);
            ASSERT_NE(p.store_reason, nullptr);
            EXPECT_GT(std::string(p.reason).size(), 4u);
            EXPECT_EQ(p.variant, q.variant);
            EXPECT_EQ(p.nt_out_min, q.nt_out_min);
            EXPECT_EQ(p.nt_in_min, q.nt_in_min);
        }
}

} // namespace
