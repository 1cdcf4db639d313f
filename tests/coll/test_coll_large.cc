// SPDX-License-Identifier: Apache-2.0
//
// test_coll_large.cc - one all-reduce of more than 2^31 elements (int8 sum, 2 ranks, 2^31 + 5
// elements, 2 GiB per buffer): catches 32-bit counts and offsets anywhere on the path. Every
// output element is checked (the input pattern is not periodic in 2^31, so an offset that wraps
// shows), the send buffer is sampled, and both ranks' outputs must have the same checksum.
// Skipped with a reason when the machine has less than 12 GiB of available memory. It does not
// time anything. Run by meson's 'coll' suite.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "loom.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

constexpr size_t kCount = (size_t{1} << 31) + 5;
constexpr uint64_t kNeedBytes = uint64_t{12} << 30;

// MemAvailable from /proc/meminfo in bytes; 0 if unknown.
uint64_t AvailableMemory()
{
    std::ifstream in("/proc/meminfo");
    std::string key;
    uint64_t kb = 0;
    std::string unit;
    while (in >> key >> kb >> unit)
        if (key == "MemAvailable:")
            return kb * 1024;
    return 0;
}

// Element i of rank r is (i ^ BlockMix(i)) + 37 r, modulo 256. BlockMix depends only on i >> 8;
// its i >> 31 term makes element 2^31 + k differ from element k, so an offset that wraps at 2^31
// shows.
inline uint8_t BlockMix(size_t i)
{
    const size_t h = (i >> 8) ^ ((i >> 16) * 3) ^ ((i >> 24) * 5) ^ ((i >> 31) * 0x5b);
    return static_cast<uint8_t>(h);
}

inline uint8_t Input(size_t i, int rank)
{
    return static_cast<uint8_t>((i ^ BlockMix(i)) + static_cast<size_t>(rank) * 37);
}

// The sum of both ranks' elements, modulo 256.
inline uint8_t Expected(size_t i)
{
    return static_cast<uint8_t>(Input(i, 0) + Input(i, 1));
}

// Element counts of the blocks of 256 that the loops below work in: inside a block only the low
// byte of i changes, so each inner loop is a plain byte loop that vectorises.
inline size_t BlockLen(size_t base)
{
    return kCount - base < 256 ? kCount - base : 256;
}

void FillInput(uint8_t *send, int rank)
{
    const uint8_t add = static_cast<uint8_t>(rank * 37);
    for (size_t base = 0; base < kCount; base += 256) {
        const uint8_t mix = BlockMix(base);
        uint8_t *p = send + base;
        const size_t len = BlockLen(base);
        for (size_t k = 0; k < len; k++)
            p[k] = static_cast<uint8_t>((k ^ mix) + add);
    }
}

struct ScanResult {
    size_t bad = 0;
    uint64_t checksum = 0; // a block-weighted sum of the output's 8-byte words
};

// Compares each block of the output with its expected bytes (memcmp) and folds its 8-byte words
// into the checksum. (The send buffer is only sampled: the grid checks it in full elsewhere, and
// another 2 GiB pass would double this test's memory traffic.)
ScanResult Scan(const uint8_t *recv)
{
    ScanResult res;
    uint8_t want[256];
    for (size_t base = 0; base < kCount; base += 256) {
        const uint8_t mix = BlockMix(base);
        const size_t len = BlockLen(base);
        for (size_t k = 0; k < 256; k++)
            want[k] = static_cast<uint8_t>(2 * static_cast<uint8_t>(k ^ mix) + 37);
        if (memcmp(recv + base, want, len) != 0)
            for (size_t k = 0; k < len; k++)
                res.bad += recv[base + k] != want[k];
        uint64_t sum = 0;
        for (size_t k = 0; k + 8 <= len; k += 8) {
            uint64_t w;
            memcpy(&w, recv + base + k, 8);
            sum += w;
        }
        for (size_t k = len & ~size_t{7}; k < len; k++)
            sum += recv[base + k];
        res.checksum = res.checksum * 31 + sum;
    }
    return res;
}

void Body(int rank, int nranks, loomComm_t comm)
{
    XT_CHECK_EQ(nranks, 2);
    uint8_t *send = static_cast<uint8_t *>(malloc(kCount));
    uint8_t *recv = static_cast<uint8_t *>(malloc(kCount));
    XT_CHECK(send != nullptr && recv != nullptr);
    FillInput(send, rank);

    XT_CHECK_LOOM(loomAllReduce(send, recv, kCount, loomInt8, loomSum, comm, nullptr));

    // Sampled positions first, for a readable message, then every element.
    const size_t samples[] = {
        0, 1, 255, (size_t{1} << 31) - 1, size_t{1} << 31, (size_t{1} << 31) + 1, kCount - 1};
    for (size_t i : samples) {
        loomtest::SetContext("element " + std::to_string(i));
        XT_CHECK_EQ(recv[i], Expected(i));
        XT_CHECK_EQ(send[i], Input(i, rank));
    }
    loomtest::SetContext("send buffer samples");
    for (size_t i = 3; i < kCount; i += (size_t{1} << 20) + 7)
        XT_CHECK_EQ(send[i], Input(i, rank));
    loomtest::SetContext("full scan");
    const ScanResult scan = Scan(recv);
    if (scan.bad != 0) {
        size_t first = 0;
        while (recv[first] == Expected(first))
            first++;
        XT_CHECK_MSG(false, std::to_string(scan.bad) + " wrong elements, the first at " +
                                std::to_string(first));
    }
    uint64_t all[2] = {0, 0};
    XT_CHECK_LOOM(loomAllGather(&scan.checksum, all, 1, loomUint64, comm, nullptr));
    XT_CHECK_EQ(all[0], all[1]);
    free(send);
    free(recv);
}

TEST(LargeCount, Int8AllReduceSumBeyond2To31Elements)
{
    const uint64_t avail = AvailableMemory();
    if (avail < kNeedBytes)
        GTEST_SKIP() << "needs 12 GiB of available memory for 2 ranks x 2 buffers of 2 GiB; "
                     << "MemAvailable is " << (avail >> 20) << " MiB";
    loomtest::RunOptions opts;
    opts.deadline_s = 120;
    XT_ASSERT_RUN(loomtest::RunRanks(2, Body, opts));
}

} // namespace
