// SPDX-License-Identifier: Apache-2.0
//
// test_shm_cost.cc - unit tests of loom_shm_predict (shm_cost.c), the shared-memory
// collectives' predicted time: each variant's count of flags, copies and reductions priced with
// the arena probe's constants, the kernel copy's rate for single copy, the ranks sharing CPUs,
// the cold cost past the plan's streaming threshold, the memory's rate past the L3, and the
// link's constants where nothing was probed. Arithmetic
// only; bench/compare sets the predictions against measurements.
#include <gtest/gtest.h>

#include <cmath>

extern "C" {
#include "shm/shm_plan.h"
}

namespace {

constexpr double K = 1024, M = K * K;

// A machine with a 512 KiB slot half, 8 CPUs, and round probe constants.
loom_shm_machine_t Machine()
{
    loom_shm_machine_t m = {};
    m.cpus = 8;
    m.l2 = 1 << 20;
    m.half = 512 * 1024;
    m.page = 4096;
    m.flag_ns = 1000;
    m.local_ns = 0.01;
    m.cross_ns = 0.05;
    m.cross1_ns = 0.03;
    m.kernel_ns = 0.1;
    return m;
}

loom_link_cost_t Link()
{
    loom_link_cost_t l = {};
    l.cls = LOOM_LINK_SHM;
    l.alpha_ns = 300;
    l.beta_ns = 0.2;
    l.beta_one_ns = 0.1;
    l.gamma_ns = 0.02;
    return l;
}

double Predict(loom_coll_kind_t kind, uint32_t variant, double bytes, int n,
               const loom_shm_machine_t &m, const loom_link_cost_t &l)
{
    loom_cost_call_t c = {};
    c.nranks = n;
    c.nbytes = bytes;
    c.acc_ratio = 1;
    return loom_shm_predict(kind, variant, &c, &m, &l);
}

TEST(ShmCost, CountsFlagsCopiesAndReductions)
{
    const loom_shm_machine_t m = Machine();
    const loom_link_cost_t l = Link();
    const double S = 64 * K;
    // AllGather, 2 ranks: one round; the own block in and into recvbuff, the other block out.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S, 2, m, l),
                     1000 + 2 * (S / 2) * 0.01 + (S / 2) * 0.05);
    // AllReduce, 2 ranks: two flag rounds; half in, half read by the reduction and half out,
    // every byte reduced.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, S, 2, m, l),
                     2 * 1000 + (S / 2) * (0.01 + 2 * 0.05) + S * 0.02);
    // ReduceScatter keeps its result: no copy out.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_REDUCE_SCATTER, SHM_ALGO_CICO, S, 2, m, l),
                     1000 + (S / 2) * (0.01 + 0.05) + S * 0.02);
    // Broadcast: a reader copies out every byte the root wrote, one way.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_BCAST, SHM_ALGO_CICO, S, 2, m, l), 1000 + S * 0.03);
    // Reduce: as AllReduce, but the root alone copies the results out, one way.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_REDUCE, SHM_ALGO_CICO, S, 2, m, l),
                     2 * 1000 + (S / 2) * (0.01 + 0.05 + 0.03) + S * 0.02);
    // A flat Reduce's root reads the others' copies one way and reduces all n.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_REDUCE, SHM_ALGO_FLAT, S, 4, m, l),
                     1000 + 3 * S * 0.03 + 4 * S * 0.02);
    // Tiny calls and the barrier: a flag.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_TINY, 8, 4, m, l), 1000);
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_BARRIER, SHM_ALGO_BARRIER, 0, 4, m, l), 1000);
}

TEST(ShmCost, RoundsFollowTheSlotHalf)
{
    const loom_shm_machine_t m = Machine();
    const loom_link_cost_t l = Link();
    // Four halves' worth of a Broadcast takes four flag rounds, and four times the bytes.
    const double one = Predict(LOOM_COLL_BCAST, SHM_ALGO_CICO, 512 * K, 2, m, l);
    const double four = Predict(LOOM_COLL_BCAST, SHM_ALGO_CICO, 2 * M, 2, m, l);
    EXPECT_DOUBLE_EQ(four, 4 * one);
}

TEST(ShmCost, SingleCopyPaysTheKernelsRate)
{
    const loom_shm_machine_t m = Machine();
    const loom_link_cost_t l = Link();
    const double S = 1 * M;
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_BCAST, SHM_ALGO_CMA, S, 2, m, l), 2 * 1000 + S * 0.1);
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLTOALL, SHM_ALGO_CMA, S, 4, m, l),
                     2 * 1000 + 0.75 * S * 0.1 + S / 4 * 0.01);
    // A faster kernel copy predicts a faster call.
    loom_shm_machine_t fast = m;
    fast.kernel_ns = 0.02;
    EXPECT_LT(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CMA, S, 4, fast, l),
              Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CMA, S, 4, m, l));
}

TEST(ShmCost, RanksSharingCpusStretchTheLocalWork)
{
    loom_shm_machine_t m = Machine();
    const loom_link_cost_t l = Link();
    const double roomy = Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, 1 * M, 4, m, l);
    m.cpus = 2; // 4 ranks on 2 CPUs: the copies of two ranks take turns on each
    const double crowded = Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, 1 * M, 4, m, l);
    const double q = 0.75, S = 1 * M;
    EXPECT_DOUBLE_EQ(crowded - roomy, q * S * 0.01 + S * 0.02); // local copies and reductions
}

TEST(ShmCost, BytesPastTheStreamingThresholdPayTheColdCost)
{
    const loom_shm_machine_t m = Machine(); // 1 MiB L2, no L3 known: streaming from 2 MiB
    ASSERT_EQ(loom_shm_nt_threshold(&m, 2), size_t{2} << 20);
    loom_link_cost_t l = Link();
    const double S = 64 * M;
    const double warm = Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S, 2, m, l);
    l.cold_ns = 0.04;
    const double cold = Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S, 2, m, l);
    const double extra = 0.04 * (1 - 2 * M / S); // the share of the bytes past the threshold
    EXPECT_NEAR(cold - warm, (2 * S / 2 + S / 2) * extra, 1e-6 * cold);
    // Below the threshold the call stays in the caches: nothing changes, whatever the L2.
    loom_link_cost_t none = l;
    none.cold_ns = 0;
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, 2 * M, 2, m, l),
                     Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, 2 * M, 2, m, none));
}

TEST(ShmCost, WithoutTheProbeTheLinkPrices)
{
    loom_shm_machine_t m = Machine();
    m.flag_ns = m.local_ns = m.cross_ns = m.cross1_ns = 0; // LOOM_CALIBRATE=0
    const loom_link_cost_t l = Link();
    const double S = 64 * K;
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S, 2, m, l),
                     300 + (2 * (S / 2) + S / 2) * 0.1);
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_BCAST, SHM_ALGO_CICO, S, 2, m, l), 300 + S * 0.1);
}

TEST(ShmCost, AProbedCallPricesItsOwnBytes)
{
    loom_shm_machine_t m = Machine();
    const loom_link_cost_t l = Link();
    const int slot = loom_shm_probe_slot(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO);
    ASSERT_GE(slot, 0);
    const double S0 = (double)loom_shm_probe_bytes(&m, 2, slot, 0);
    ASSERT_GT(S0, 0);
    const double formula = Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, S0, 2, m, l);
    m.call_ns[0][slot] = 20000;
    m.probe_ranks = 2;
    // The probe's own call is predicted as it ran, whatever the rates would sum to.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, S0, 2, m, l), 20000);
    // Twice the bytes cost twice the probe's bytes; the flags (two rounds) stay the count's.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, 2 * S0, 2, m, l),
                     2 * 1000 + 2 * (20000 - 2 * 1000));
    // Another rank count, or a call the probe did not time, is the count's.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, S0, 4, m, l),
                     Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, S0, 4, Machine(), l));
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S0, 2, m, l),
                     Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S0, 2, Machine(), l));
    EXPECT_NE(formula, 20000);
    // Past the streaming threshold the cold cost comes on top, as in the count.
    loom_link_cost_t cold = l;
    cold.cold_ns = 0.04;
    const double S = 64 * M;
    EXPECT_NEAR(Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, S, 2, m, cold) -
                    Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, S, 2, m, l),
                Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, S, 2, Machine(), cold) -
                    Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, S, 2, Machine(), l),
                1e-6 * S);
}

TEST(ShmCost, TheProbeTimesEveryCollectivesArenaPath)
{
    const loom_shm_machine_t m = Machine();
    const loom_coll_kind_t kinds[] = {LOOM_COLL_ALLREDUCE,      LOOM_COLL_ALLGATHER,
                                      LOOM_COLL_REDUCE_SCATTER, LOOM_COLL_BCAST,
                                      LOOM_COLL_REDUCE,         LOOM_COLL_ALLTOALL};
    for (loom_coll_kind_t k : kinds) {
        const int slot = loom_shm_probe_slot(k, SHM_ALGO_CICO);
        ASSERT_GE(slot, 0) << loom_coll_name(k);
        loom_coll_kind_t kind;
        uint32_t variant;
        loom_shm_probe_call(slot, &kind, &variant);
        EXPECT_EQ(kind, k);
        EXPECT_EQ(variant, (uint32_t)SHM_ALGO_CICO);
        EXPECT_EQ(loom_shm_probe_slot(k, SHM_ALGO_CMA), -1); // single copy is priced by rates
    }
    // The uneven calls run as the even ones do.
    EXPECT_EQ(loom_shm_probe_slot(LOOM_COLL_ALLGATHERV, SHM_ALGO_CICO),
              loom_shm_probe_slot(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO));
    EXPECT_EQ(loom_shm_probe_slot(LOOM_COLL_REDUCE_SCATTERV, SHM_ALGO_CICO),
              loom_shm_probe_slot(LOOM_COLL_REDUCE_SCATTER, SHM_ALGO_CICO));
    // A flat call fits one slot half, or it would run cico.
    loom_shm_machine_t small = m;
    small.half = 64 * 1024;
    const int flat = loom_shm_probe_slot(LOOM_COLL_REDUCE, SHM_ALGO_FLAT);
    ASSERT_GE(flat, 0);
    for (int tier = 0; tier < LOOM_SHM_PROBE_TIERS; tier++)
        EXPECT_LE(loom_shm_probe_bytes(&small, 8, flat, tier), small.half);
    // The second footprint fills the L2, the first a quarter of it.
    const int ag = loom_shm_probe_slot(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO);
    for (int n : {2, 4, 8}) {
        EXPECT_EQ(loom_shm_probe_bytes(&m, n, ag, 1), m.l2) << n;
        EXPECT_LE(loom_shm_probe_bytes(&m, n, ag, 0), m.l2 / 4) << n;
    }
}

TEST(ShmCost, CallsBetweenTheProbesFootprintsPayARateBetweenTheirs)
{
    loom_shm_machine_t m = Machine();
    const loom_link_cost_t l = Link();
    const loom_coll_kind_t ar = LOOM_COLL_ALLREDUCE;
    const int slot = loom_shm_probe_slot(ar, SHM_ALGO_CICO);
    ASSERT_GE(slot, 0);
    const double S0 = (double)loom_shm_probe_bytes(&m, 2, slot, 0);
    const double S1 = (double)loom_shm_probe_bytes(&m, 2, slot, 1);
    ASSERT_EQ(S0, 256 * K);
    ASSERT_EQ(S1, 1 * M); // two rounds of the 512 KiB half: four flag rounds
    m.probe_ranks = 2;
    m.call_ns[0][slot] = 2 * 1000 + S0 * 0.08;
    m.call_ns[1][slot] = 4 * 1000 + S1 * 0.02;
    // Each footprint's call is predicted as it ran; past the second one its rate holds.
    EXPECT_NEAR(Predict(ar, SHM_ALGO_CICO, S0, 2, m, l), m.call_ns[0][slot], 1e-6);
    EXPECT_NEAR(Predict(ar, SHM_ALGO_CICO, S1, 2, m, l), m.call_ns[1][slot], 1e-6);
    EXPECT_NEAR(Predict(ar, SHM_ALGO_CICO, 2 * M, 2, m, l), 8 * 1000 + 2 * M * 0.02, 1e-6);
    // Halfway between them in bytes, halfway between their rates.
    const double mid = (S0 + S1) / 2;
    EXPECT_NEAR(Predict(ar, SHM_ALGO_CICO, mid, 2, m, l), 4 * 1000 + mid * 0.05, 1e-6);
    // Below the first footprint the first rate holds.
    EXPECT_NEAR(Predict(ar, SHM_ALGO_CICO, 64 * K, 2, m, l), 2 * 1000 + 64 * K * 0.08, 1e-6);
    // Without the second time, the first rate prices every size.
    m.call_ns[1][slot] = 0;
    EXPECT_NEAR(Predict(ar, SHM_ALGO_CICO, S1, 2, m, l), 4 * 1000 + S1 * 0.08, 1e-6);
}

TEST(ShmCost, AnUnevenReduceScatterGoesAtItsLargestOwnersPace)
{
    const loom_shm_machine_t m = Machine(); // 8 CPUs
    const loom_link_cost_t l = Link();
    loom_cost_call_t c = {};
    c.nranks = 2;
    c.nbytes = 96 * K;
    c.acc_ratio = 1;
    c.max_block = 64 * K; // blocks of 32 and 64 KiB
    const double even = Predict(LOOM_COLL_REDUCE_SCATTER, SHM_ALGO_CICO, 128 * K, 2, m, l);
    EXPECT_DOUBLE_EQ(loom_shm_predict(LOOM_COLL_REDUCE_SCATTERV, SHM_ALGO_CICO, &c, &m, &l), even);
    // Even blocks, or 4 ranks sharing 2 CPUs: the even call of the same bytes.
    c.max_block = 48 * K;
    EXPECT_DOUBLE_EQ(loom_shm_predict(LOOM_COLL_REDUCE_SCATTERV, SHM_ALGO_CICO, &c, &m, &l),
                     Predict(LOOM_COLL_REDUCE_SCATTER, SHM_ALGO_CICO, 96 * K, 2, m, l));
    loom_shm_machine_t crowded = m;
    crowded.cpus = 2;
    c.nranks = 4;
    c.max_block = 48 * K;
    EXPECT_DOUBLE_EQ(loom_shm_predict(LOOM_COLL_REDUCE_SCATTERV, SHM_ALGO_CICO, &c, &crowded, &l),
                     Predict(LOOM_COLL_REDUCE_SCATTER, SHM_ALGO_CICO, 96 * K, 4, crowded, l));
}

TEST(ShmCost, NothingToPredict)
{
    const loom_shm_machine_t m = Machine();
    const loom_link_cost_t l = Link();
    EXPECT_TRUE(std::isinf(Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, 1 * M, 1, m, l)));
    EXPECT_TRUE(std::isinf(Predict(LOOM_COLL_ALLTOALLV, SHM_ALGO_CICO, 1 * M, 4, m, l)));
}

TEST(ShmCost, PastTheL3ACallMovesItsBuffersBytesAtTheMemorysRate)
{
    loom_shm_machine_t m = Machine();
    const loom_link_cost_t l = Link();
    m.l3 = 32 << 20;
    const double S = 128 * M;
    const double cached = Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S, 2, m, l);
    m.memory_ns = 1.0; // 1 GB/s of copies: slower than every cache rate above
    // The bytes all ranks read and write, half of them copied (a copy reads and writes a byte):
    // an AllGather rank reads its block and writes the vector, an AllReduce or AllToAll rank
    // reads and writes the vector, a Broadcast's root reads it and its reader writes it, a
    // Reduce's ranks read it and the root writes it.
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S, 2, m, l), 3 * S / 2);
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_REDUCE_SCATTER, SHM_ALGO_CICO, S, 4, m, l), 5 * S / 2);
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, S, 2, m, l), 4 * S / 2);
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLTOALL, SHM_ALGO_CMA, S, 2, m, l), 4 * S / 2);
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_BCAST, SHM_ALGO_CICO, S, 2, m, l), 2 * S / 2);
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_REDUCE, SHM_ALGO_CICO, S, 2, m, l), 3 * S / 2);
    // A memory faster than the caches' price changes nothing: the floor never lowers it.
    m.memory_ns = 1e-6;
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S, 2, m, l), cached);
    // Buffers and arena within the L3 (3 x 4 MiB and two 1 MiB slots) keep the caches' price;
    // so does an unknown rate or L3.
    m.memory_ns = 1.0;
    loom_shm_machine_t none = m;
    none.memory_ns = 0;
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, 4 * M, 2, m, l),
                     Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, 4 * M, 2, none, l));
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S, 2, none, l), cached);
    none = m;
    none.l3 = 0;
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S, 2, none, l), cached);
    // The probed rates give way to it as the sums do.
    const int slot = loom_shm_probe_slot(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO);
    m.probe_ranks = 2;
    m.call_ns[0][slot] = 50000;
    EXPECT_DOUBLE_EQ(Predict(LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, S, 2, m, l), 3 * S / 2);
}

} // namespace
