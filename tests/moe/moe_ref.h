// SPDX-License-Identifier: Apache-2.0
//
// moe_ref.h - what the MoE dispatch tests share: batches that every rank can regenerate for any
// rank (routing from moe_gen.h, token rows from a seed), placements, the test's experts
// (y = x * (e + 1) + e in float32, rounded to the datatype), the plan config and the fixture of
// the multi-rank grids, and the single-process references of combine. Used by test_moe_dispatch.cc
// and test_moe_errors.cc.
#ifndef LOOM_TESTS_MOE_REF_H
#define LOOM_TESTS_MOE_REF_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "loom_moe.h"

namespace moetest {

struct Batch {
    size_t tokens = 0;
    std::vector<int32_t> topk;  // [T*k]
    std::vector<float> weights; // [T*k]
    std::vector<uint8_t> x;     // [T*H] in the datatype
};

struct Shape {
    int num_experts, top_k;
    size_t hidden;
    loomDataType_t dtype;
    bool planted; // planted-partition routing with 10% -1 selections; else uniform
    bool dyadic;  // small integers and weights in eighths: every sum exact
    uint64_t seed;
};

// The grid the multi-rank tests run: four (experts, top-k) shapes (one sized by nranks), three
// dtypes, uniform and planted routing, exact and random inputs, contiguous and random placement;
// seeds from seed0 up, one per shape.
void ForEachShape(int nranks, uint64_t seed0, const std::function<void(const Shape &, bool)> &fn);

// Tokens of `rank`: 0 on rank 1 (and everywhere when seed says so), different on the others.
size_t TokensOf(const Shape &s, int rank, int nranks);
// Rank `rank`'s batch; any rank can make any rank's. Columns 0 and 1 of a token hold the
// rank and the token index, so a row can be recognised after it moved.
Batch MakeBatch(const Shape &s, int rank, int nranks);
// Contiguous (as a NULL expert_rank gives) or a seeded permutation of the same shares.
std::vector<int32_t> Placement(int num_experts, int nranks, bool random, uint64_t seed);

size_t ElemBytes(loomDataType_t dt);
float Load(loomDataType_t dt, const uint8_t *buf, size_t i);
void Store(loomDataType_t dt, uint8_t *buf, size_t i, float v);
// The test's expert e on one element, rounded to the datatype as an expert output would be.
float Expert(loomDataType_t dt, int e, float v);

// The plan config of a shape: a NULL placement (contiguous) unless random_place.
loomMoeConfig_t Config(const Shape &s, const std::vector<int32_t> &place, bool random_place,
                       int mode);
// expert_out of the received slots, sized as recv_x: slot i of local expert l runs the test's
// expert of l's global id.
std::vector<uint8_t> RunExperts(const Shape &s, const std::vector<int32_t> &place, int rank,
                                const std::vector<uint8_t> &recv_x,
                                const std::vector<int64_t> &offset,
                                const std::vector<int64_t> &count);

// The rows that the rank of batch b sends to rank dst in this mode, and the pairs among them.
void RowsBetween(const Shape &s, const Batch &b, const std::vector<int32_t> &place, int dst,
                 int mode, size_t *rows, size_t *pairs);
// The wire stride of a dispatch row (docs/moe.md): round16(round4(H*s) + 4 + 6*pairs_per_row).
size_t RowStride(const Shape &s, int mode);

// The multi-rank grids: 1 to 4 ranks, LOOM_NET shm and tcp (instantiated once, in
// test_moe_dispatch.cc); each TEST_P calls RunGrid with its body.
class MoeRanks : public ::testing::TestWithParam<std::tuple<int, const char *>> {
  protected:
    void RunGrid(void (*body)(int rank, int nranks, loomComm_t comm));
};

// y of one rank's batch. grouped: the canonical order with this placement (per rank ascending,
// a float32 partial over its pairs in slot order, partials added from 0); otherwise all
// experts on one process (one float32 sum over the slots in order).
std::vector<uint8_t> Reference(const Shape &s, const Batch &b, const std::vector<int32_t> &place,
                               bool grouped);

} // namespace moetest

#endif
