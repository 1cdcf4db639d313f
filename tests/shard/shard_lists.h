// SPDX-License-Identifier: Apache-2.0
//
// shard_lists.h - parameter lists the shard tests share: gpt-tiny (L4 C128 V256 T128, tied
// embedding, one bucket for the embeddings, one per layer, one for the final norm), the odd
// shapes, seeded random lists, and a tiny xorshift so lists and gradients are the same in every
// rank and in the single-process reference.
#ifndef LOOM_TESTS_SHARD_SHARD_LISTS_H
#define LOOM_TESTS_SHARD_SHARD_LISTS_H

#include <cstdint>
#include <vector>

#include "loom_shard.h"

namespace shardtest {

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull) {}
    uint64_t Next()
    {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
    uint32_t Below(uint32_t n)
    {
        return (uint32_t)(Next() % n);
    }
    double Uniform()
    {
        return (double)(Next() >> 11) * 0x1.0p-53;
    }
};

loomShardParam_t Matrix(size_t rows, size_t cols, int bucket, int owner = -1);
loomShardParam_t Vector(size_t n, int bucket);
// gpt-tiny: 16 matrices, about 0.85M elements.
std::vector<loomShardParam_t> GptTiny();
// Matrices 1x1, 1x17, 17x1, 7x13, 13x7, 97x3, 257x31 and vectors of 1, 5, 7, over 3 buckets.
std::vector<loomShardParam_t> OddShapes();
// 1..max_params params, random kinds, shapes up to max_side, buckets, 10 % fixed owners
// (below nranks) when fixed is set.
std::vector<loomShardParam_t> RandomList(Rng &rng, int max_params, size_t max_side, int nranks,
                                         bool fixed);
size_t Numel(const std::vector<loomShardParam_t> &list);

} // namespace shardtest

#endif // LOOM_TESTS_SHARD_SHARD_LISTS_H
