// SPDX-License-Identifier: Apache-2.0
//
// shard_lists.cc - the parameter lists of shard_lists.h.
#include "shard_lists.h"

namespace shardtest {

loomShardParam_t Matrix(size_t rows, size_t cols, int bucket, int owner)
{
    return loomShardParam_t{rows, cols, loomShardMatrix, owner, bucket};
}

loomShardParam_t Vector(size_t n, int bucket)
{
    return loomShardParam_t{n, 1, loomShardElementwise, -1, bucket};
}

std::vector<loomShardParam_t> GptTiny()
{
    const size_t C = 128, V = 256, T = 128;
    const int L = 4;
    std::vector<loomShardParam_t> l;
    l.push_back({V, C, loomShardElementwise, -1, 0}); // wte, tied with the head
    l.push_back({T, C, loomShardElementwise, -1, 0}); // wpe
    for (int i = 0; i < L; i++) {
        const int b = 1 + i;
        l.push_back(Vector(C, b)); // ln1 weight, bias
        l.push_back(Vector(C, b));
        l.push_back(Matrix(3 * C, C, b)); // qkv
        l.push_back(Vector(3 * C, b));
        l.push_back(Matrix(C, C, b)); // attention projection
        l.push_back(Vector(C, b));
        l.push_back(Vector(C, b)); // ln2
        l.push_back(Vector(C, b));
        l.push_back(Matrix(4 * C, C, b)); // fc
        l.push_back(Vector(4 * C, b));
        l.push_back(Matrix(C, 4 * C, b)); // fc projection
        l.push_back(Vector(C, b));
    }
    l.push_back(Vector(C, L + 1)); // final norm
    l.push_back(Vector(C, L + 1));
    return l;
}

std::vector<loomShardParam_t> OddShapes()
{
    return {Matrix(1, 1, 0),  Vector(5, 0),      Matrix(1, 17, 0), Matrix(17, 1, 1),
            Vector(1, 1),     Matrix(7, 13, 1),  Matrix(13, 7, 1), Vector(7, 2),
            Matrix(97, 3, 2), Matrix(257, 31, 2)};
}

std::vector<loomShardParam_t> RandomList(Rng &rng, int max_params, size_t max_side, int nranks,
                                         bool fixed)
{
    const int n = 1 + (int)rng.Below((uint32_t)max_params);
    std::vector<loomShardParam_t> l;
    int bucket = 0;
    for (int i = 0; i < n; i++) {
        if (rng.Below(4) == 0)
            bucket += 1 + (int)rng.Below(2);
        const size_t rows = 1 + rng.Below((uint32_t)max_side);
        if (rng.Below(3) == 0) {
            l.push_back({rows, rng.Below(4) == 0 ? 1 + rng.Below((uint32_t)max_side) : 1,
                         loomShardElementwise, -1, bucket});
        } else {
            const int owner = fixed && rng.Below(10) == 0 ? (int)rng.Below((uint32_t)nranks) : -1;
            l.push_back(Matrix(rows, 1 + rng.Below((uint32_t)max_side), bucket, owner));
        }
    }
    return l;
}

size_t Numel(const std::vector<loomShardParam_t> &list)
{
    size_t n = 0;
    for (const auto &p : list)
        n += p.rows * p.cols;
    return n;
}

} // namespace shardtest
