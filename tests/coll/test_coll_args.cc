// SPDX-License-Identifier: Apache-2.0
//
// test_coll_args.cc - invalid arguments, table driven: in a 2-rank run, every public function
// is called with NULL handles and pointers, overflowing counts, counts that fit size_t but no
// buffer (more than 2^56 bytes, passed with buffers that fault on any access), bad datatypes,
// ops, roots and peers, overlapping buffers, bad configs and ids, and things that are not
// streams. Each must return its documented code (InvalidArgument, or InvalidUsage for a stray
// loomGroupEnd) with a fresh, non-empty loomGetLastError that names the cause where the row
// says so, and the communicator must still work afterwards. Also the
// error strings, loomGetVersion and use after destroy. Both ranks run the same rows, so a
// check the library is missing cannot leave one rank waiting. Run by meson's 'coll' suite.

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "loom.h"
#include "mp_fixture.h"

namespace {

// What a row's call may use. Buffers are large enough for every valid-looking call.
struct Ctx {
    loomComm_t comm;
    int rank;
    int n;
    float *a; // 64 floats
    float *b; // 64 floats
    size_t counts[2];
    size_t displs[2];
    char *none; // two pages that fault on any access (PROT_NONE)

    loomUniqueId id;
    uint64_t junk[16]; // zeros: not a stream, not a communicator
};

struct Row {
    const char *name;
    loomResult_t expected;
    std::function<loomResult_t(Ctx &)> call;
    std::vector<std::string> says = {}; // words the message must contain
};

constexpr size_t kHuge = SIZE_MAX / 2 + 1; // times any element size > 1 overflows
constexpr size_t kThird = SIZE_MAX / 6;    // times 4 fits; times 4 * 2 ranks overflows
// Fit size_t, but no address space: 2^60 floats are 2^62 bytes; 2^54 floats are the 2^56-byte
// limit exactly, twice that for the 2 ranks' blocks.
constexpr size_t kBeyond = size_t{1} << 60;
constexpr size_t kBlock = size_t{1} << 54;
const std::vector<std::string> kSaysBeyond = {std::to_string(kBeyond), "2^56"};
const std::vector<std::string> kSaysBlock = {std::to_string(kBlock), "times 2 ranks", "2^56"};
const auto kBadType = static_cast<loomDataType_t>(99);
const auto kBadOp = static_cast<loomRedOp_t>(99);

loomStream_t NotAStream(Ctx &c)
{
    return reinterpret_cast<loomStream_t>(c.junk);
}

std::vector<Row> Rows()
{
    const loomResult_t kArg = loomInvalidArgument;
    using C = Ctx &;
    return {
        // ---- NULL communicator
        {"AllReduce NULL comm", kArg,
         [](C c) { return loomAllReduce(c.a, c.b, 4, loomFloat32, loomSum, nullptr, nullptr); }},
        {"AllGather NULL comm", kArg,
         [](C c) { return loomAllGather(c.a, c.b, 4, loomFloat32, nullptr, nullptr); }},
        {"ReduceScatter NULL comm", kArg,
         [](C c) {
             return loomReduceScatter(c.a, c.b, 4, loomFloat32, loomSum, nullptr, nullptr);
         }},
        {"Broadcast NULL comm", kArg,
         [](C c) { return loomBroadcast(c.a, c.b, 4, loomFloat32, 0, nullptr, nullptr); }},
        {"Reduce NULL comm", kArg,
         [](C c) { return loomReduce(c.a, c.b, 4, loomFloat32, loomSum, 0, nullptr, nullptr); }},
        {"AllToAll NULL comm", kArg,
         [](C c) { return loomAllToAll(c.a, c.b, 4, loomFloat32, nullptr, nullptr); }},
        {"AllToAllv NULL comm", kArg,
         [](C c) {
             return loomAllToAllv(c.a, c.counts, c.displs, c.b, c.counts, c.displs, loomFloat32,
                                  nullptr, nullptr);
         }},
        {"Send NULL comm", kArg,
         [](C c) { return loomSend(c.a, 4, loomFloat32, 0, nullptr, nullptr); }},
        {"Recv NULL comm", kArg,
         [](C c) { return loomRecv(c.a, 4, loomFloat32, 0, nullptr, nullptr); }},
        {"Barrier NULL comm", kArg, [](C) { return loomBarrier(nullptr, nullptr); }},
        {"CommCount NULL comm", kArg,
         [](C) {
             int x;
             return loomCommCount(nullptr, &x);
         }},
        {"CommUserRank NULL comm", kArg,
         [](C) {
             int x;
             return loomCommUserRank(nullptr, &x);
         }},
        {"CommGetAsyncError NULL comm", kArg,
         [](C) {
             loomResult_t x;
             return loomCommGetAsyncError(nullptr, &x);
         }},
        {"CommSplit NULL comm", kArg,
         [](C) {
             loomComm_t x = nullptr;
             return loomCommSplit(nullptr, 0, 0, &x, nullptr);
         }},
        {"CommDestroy not a comm", kArg,
         [](C c) { return loomCommDestroy(reinterpret_cast<loomComm_t>(c.junk)); }},
        {"AllReduce not a comm", kArg,
         [](C c) {
             return loomAllReduce(c.a, c.b, 4, loomFloat32, loomSum,
                                  reinterpret_cast<loomComm_t>(c.junk), nullptr);
         }},

        // ---- NULL output pointers
        {"CommCount NULL count", kArg, [](C c) { return loomCommCount(c.comm, nullptr); }},
        {"CommUserRank NULL rank", kArg, [](C c) { return loomCommUserRank(c.comm, nullptr); }},
        {"CommGetAsyncError NULL out", kArg,
         [](C c) { return loomCommGetAsyncError(c.comm, nullptr); }},
        {"GetVersion NULL", kArg, [](C) { return loomGetVersion(nullptr); }},
        {"GetUniqueId NULL", kArg, [](C) { return loomGetUniqueId(nullptr); }},
        {"StreamCreate NULL", kArg, [](C) { return loomStreamCreate(nullptr); }},
        {"CommInitRank NULL comm pointer", kArg,
         [](C c) { return loomCommInitRank(nullptr, c.n, c.id, c.rank); }},
        {"CommInitFromEnv NULL comm pointer", kArg, [](C) { return loomCommInitFromEnv(nullptr); }},
        {"CommSplit NULL newcomm", kArg,
         [](C c) { return loomCommSplit(c.comm, 0, 0, nullptr, nullptr); }},
        {"CommPlan NULL comm", kArg,
         [](C) {
             return loomCommPlan(nullptr, loomCollAllReduce, 4, loomFloat32, nullptr, nullptr);
         }},
        {"CommPlan bad collective", kArg,
         [](C c) {
             return loomCommPlan(c.comm, static_cast<loomCollective_t>(loomNumCollectives), 4,
                                 loomFloat32, nullptr, nullptr);
         }},
        {"CommPlan bad datatype", kArg,
         [](C c) {
             return loomCommPlan(c.comm, loomCollAllReduce, 4,
                                 static_cast<loomDataType_t>(loomNumTypes), nullptr, nullptr);
         }},
        {"CommPlan count overflows", kArg,
         [](C c) {
             return loomCommPlan(c.comm, loomCollAllGather, SIZE_MAX / 2, loomFloat32, nullptr,
                                 nullptr);
         }},

        // ---- NULL buffers with count > 0
        {"AllReduce NULL sendbuff", kArg,
         [](C c) { return loomAllReduce(nullptr, c.b, 4, loomFloat32, loomSum, c.comm, nullptr); }},
        {"AllReduce NULL recvbuff", kArg,
         [](C c) { return loomAllReduce(c.a, nullptr, 4, loomFloat32, loomSum, c.comm, nullptr); }},
        {"AllGather NULL sendbuff", kArg,
         [](C c) { return loomAllGather(nullptr, c.b, 4, loomFloat32, c.comm, nullptr); }},
        {"AllGather NULL recvbuff", kArg,
         [](C c) { return loomAllGather(c.a, nullptr, 4, loomFloat32, c.comm, nullptr); }},
        {"ReduceScatter NULL sendbuff", kArg,
         [](C c) {
             return loomReduceScatter(nullptr, c.b, 4, loomFloat32, loomSum, c.comm, nullptr);
         }},
        {"ReduceScatter NULL recvbuff", kArg,
         [](C c) {
             return loomReduceScatter(c.a, nullptr, 4, loomFloat32, loomSum, c.comm, nullptr);
         }},
        {"Broadcast NULL sendbuff on root", kArg,
         [](C c) { return loomBroadcast(nullptr, c.b, 4, loomFloat32, c.rank, c.comm, nullptr); }},
        {"Broadcast NULL recvbuff", kArg,
         [](C c) { return loomBroadcast(c.a, nullptr, 4, loomFloat32, c.rank, c.comm, nullptr); }},
        {"Reduce NULL sendbuff", kArg,
         [](C c) {
             return loomReduce(nullptr, c.b, 4, loomFloat32, loomSum, c.rank, c.comm, nullptr);
         }},
        {"Reduce NULL recvbuff on root", kArg,
         [](C c) {
             return loomReduce(c.a, nullptr, 4, loomFloat32, loomSum, c.rank, c.comm, nullptr);
         }},
        {"AllToAll NULL sendbuff", kArg,
         [](C c) { return loomAllToAll(nullptr, c.b, 4, loomFloat32, c.comm, nullptr); }},
        {"AllToAll NULL recvbuff", kArg,
         [](C c) { return loomAllToAll(c.a, nullptr, 4, loomFloat32, c.comm, nullptr); }},
        {"AllToAllv NULL sendbuff", kArg,
         [](C c) {
             return loomAllToAllv(nullptr, c.counts, c.displs, c.b, c.counts, c.displs, loomFloat32,
                                  c.comm, nullptr);
         }},
        {"AllToAllv NULL recvbuff", kArg,
         [](C c) {
             return loomAllToAllv(c.a, c.counts, c.displs, nullptr, c.counts, c.displs, loomFloat32,
                                  c.comm, nullptr);
         }},
        {"Send NULL buffer", kArg,
         [](C c) { return loomSend(nullptr, 4, loomFloat32, 1 - c.rank, c.comm, nullptr); }},
        {"Recv NULL buffer", kArg,
         [](C c) { return loomRecv(nullptr, 4, loomFloat32, 1 - c.rank, c.comm, nullptr); }},

        // ---- counts whose byte size overflows size_t
        {"AllReduce overflowing count", kArg,
         [](C c) { return loomAllReduce(c.a, c.b, kHuge, loomFloat64, loomSum, c.comm, nullptr); }},
        {"AllGather overflowing count", kArg,
         [](C c) { return loomAllGather(c.a, c.b, kHuge, loomFloat32, c.comm, nullptr); }},
        {"AllGather count overflowing times nranks", kArg,
         [](C c) { return loomAllGather(c.a, c.b, kThird, loomFloat32, c.comm, nullptr); }},
        {"ReduceScatter count overflowing times nranks", kArg,
         [](C c) {
             return loomReduceScatter(c.a, c.b, kThird, loomFloat32, loomSum, c.comm, nullptr);
         }},
        {"Broadcast overflowing count", kArg,
         [](C c) { return loomBroadcast(c.a, c.b, kHuge, loomInt32, 0, c.comm, nullptr); }},
        {"Reduce overflowing count", kArg,
         [](C c) { return loomReduce(c.a, c.b, kHuge, loomUint64, loomSum, 0, c.comm, nullptr); }},
        {"AllToAll count overflowing times nranks", kArg,
         [](C c) { return loomAllToAll(c.a, c.b, kThird, loomFloat32, c.comm, nullptr); }},
        {"AllToAllv overflowing count and displacement", kArg,
         [](C c) {
             const size_t counts[2] = {kHuge, kHuge}, displs[2] = {kHuge, 0};
             return loomAllToAllv(c.a, counts, displs, c.b, c.counts, c.displs, loomFloat32, c.comm,
                                  nullptr);
         }},
        {"Send overflowing count", kArg,
         [](C c) { return loomSend(c.a, kHuge, loomFloat16, 1 - c.rank, c.comm, nullptr); }},
        {"Recv overflowing count", kArg,
         [](C c) { return loomRecv(c.a, kHuge, loomFloat16, 1 - c.rank, c.comm, nullptr); }},

        // ---- counts that fit size_t but exceed any buffer; the buffers fault if touched
        {"AllReduce 2^60 floats", kArg,
         [](C c) {
             return loomAllReduce(c.none, c.none + 4096, kBeyond, loomFloat32, loomSum, c.comm,
                                  nullptr);
         },
         kSaysBeyond},
        {"AllReduce 2^60 floats in place", kArg,
         [](C c) {
             return loomAllReduce(c.none, c.none, kBeyond, loomFloat32, loomSum, c.comm, nullptr);
         },
         kSaysBeyond},
        {"AllGather 2^54 floats times 2 ranks", kArg,
         [](C c) {
             return loomAllGather(c.none, c.none + 4096, kBlock, loomFloat32, c.comm, nullptr);
         },
         kSaysBlock},
        {"ReduceScatter 2^54 floats times 2 ranks", kArg,
         [](C c) {
             return loomReduceScatter(c.none, c.none + 4096, kBlock, loomFloat32, loomSum, c.comm,
                                      nullptr);
         },
         kSaysBlock},
        {"AllToAll 2^54 floats times 2 ranks", kArg,
         [](C c) {
             return loomAllToAll(c.none, c.none + 4096, kBlock, loomFloat32, c.comm, nullptr);
         },
         kSaysBlock},
        {"Broadcast 2^60 floats", kArg,
         [](C c) {
             return loomBroadcast(c.none, c.none, kBeyond, loomFloat32, 0, c.comm, nullptr);
         },
         kSaysBeyond},
        {"Reduce 2^60 floats", kArg,
         [](C c) {
             return loomReduce(c.none, c.none, kBeyond, loomFloat32, loomSum, 0, c.comm, nullptr);
         },
         kSaysBeyond},
        {"AllToAllv 2^60 floats", kArg,
         [](C c) {
             const size_t counts[2] = {kBeyond, 0}, displs[2] = {0, 0};
             return loomAllToAllv(c.none, counts, displs, c.none + 4096, counts, displs,
                                  loomFloat32, c.comm, nullptr);
         },
         kSaysBeyond},
        {"AllToAllv 1 float at displacement 2^60", kArg,
         [](C c) {
             const size_t counts[2] = {1, 1}, displs[2] = {0, kBeyond};
             return loomAllToAllv(c.none, counts, displs, c.none + 4096, counts, displs,
                                  loomFloat32, c.comm, nullptr);
         },
         kSaysBeyond},
        {"Send 2^60 floats", kArg,
         [](C c) { return loomSend(c.none, kBeyond, loomFloat32, 1 - c.rank, c.comm, nullptr); },
         kSaysBeyond},
        {"Recv 2^60 floats", kArg,
         [](C c) { return loomRecv(c.none, kBeyond, loomFloat32, 1 - c.rank, c.comm, nullptr); },
         kSaysBeyond},

        // ---- bad datatype / op
        {"AllReduce datatype 99", kArg,
         [](C c) { return loomAllReduce(c.a, c.b, 4, kBadType, loomSum, c.comm, nullptr); }},
        {"AllReduce datatype loomNumTypes", kArg,
         [](C c) {
             return loomAllReduce(c.a, c.b, 4, static_cast<loomDataType_t>(loomNumTypes), loomSum,
                                  c.comm, nullptr);
         }},
        {"AllReduce datatype -1", kArg,
         [](C c) {
             return loomAllReduce(c.a, c.b, 4, static_cast<loomDataType_t>(-1), loomSum, c.comm,
                                  nullptr);
         }},
        {"AllGather datatype 99", kArg,
         [](C c) { return loomAllGather(c.a, c.b, 4, kBadType, c.comm, nullptr); }},
        {"ReduceScatter datatype 99", kArg,
         [](C c) { return loomReduceScatter(c.a, c.b, 4, kBadType, loomSum, c.comm, nullptr); }},
        {"Broadcast datatype 99", kArg,
         [](C c) { return loomBroadcast(c.a, c.b, 4, kBadType, 0, c.comm, nullptr); }},
        {"Reduce datatype 99", kArg,
         [](C c) { return loomReduce(c.a, c.b, 4, kBadType, loomSum, 0, c.comm, nullptr); }},
        {"AllToAll datatype 99", kArg,
         [](C c) { return loomAllToAll(c.a, c.b, 4, kBadType, c.comm, nullptr); }},
        {"AllToAllv datatype 99", kArg,
         [](C c) {
             return loomAllToAllv(c.a, c.counts, c.displs, c.b, c.counts, c.displs, kBadType,
                                  c.comm, nullptr);
         }},
        {"Send datatype 99", kArg,
         [](C c) { return loomSend(c.a, 4, kBadType, 1 - c.rank, c.comm, nullptr); }},
        {"Recv datatype 99", kArg,
         [](C c) { return loomRecv(c.a, 4, kBadType, 1 - c.rank, c.comm, nullptr); }},
        {"AllReduce op 99", kArg,
         [](C c) { return loomAllReduce(c.a, c.b, 4, loomFloat32, kBadOp, c.comm, nullptr); }},
        {"AllReduce op loomNumOps", kArg,
         [](C c) {
             return loomAllReduce(c.a, c.b, 4, loomFloat32, static_cast<loomRedOp_t>(loomNumOps),
                                  c.comm, nullptr);
         }},
        {"AllReduce op -1", kArg,
         [](C c) {
             return loomAllReduce(c.a, c.b, 4, loomFloat32, static_cast<loomRedOp_t>(-1), c.comm,
                                  nullptr);
         }},
        {"ReduceScatter op 99", kArg,
         [](C c) { return loomReduceScatter(c.a, c.b, 4, loomFloat32, kBadOp, c.comm, nullptr); }},
        {"Reduce op 99", kArg,
         [](C c) { return loomReduce(c.a, c.b, 4, loomFloat32, kBadOp, 0, c.comm, nullptr); }},

        // ---- root / peer out of range
        {"Broadcast root -1", kArg,
         [](C c) { return loomBroadcast(c.a, c.b, 4, loomFloat32, -1, c.comm, nullptr); }},
        {"Broadcast root nranks", kArg,
         [](C c) { return loomBroadcast(c.a, c.b, 4, loomFloat32, c.n, c.comm, nullptr); }},
        {"Reduce root -1", kArg,
         [](C c) { return loomReduce(c.a, c.b, 4, loomFloat32, loomSum, -1, c.comm, nullptr); }},
        {"Reduce root nranks", kArg,
         [](C c) { return loomReduce(c.a, c.b, 4, loomFloat32, loomSum, c.n, c.comm, nullptr); }},
        {"Send peer -1", kArg,
         [](C c) { return loomSend(c.a, 4, loomFloat32, -1, c.comm, nullptr); }},
        {"Send peer nranks", kArg,
         [](C c) { return loomSend(c.a, 4, loomFloat32, c.n, c.comm, nullptr); }},
        {"Recv peer -1", kArg,
         [](C c) { return loomRecv(c.a, 4, loomFloat32, -1, c.comm, nullptr); }},
        {"Recv peer nranks", kArg,
         [](C c) { return loomRecv(c.a, 4, loomFloat32, c.n, c.comm, nullptr); }},

        // ---- partially overlapping buffers (not the documented in-place layout)
        {"AllReduce recv = send + 1", kArg,
         [](C c) { return loomAllReduce(c.a, c.a + 1, 4, loomFloat32, loomSum, c.comm, nullptr); }},
        {"AllReduce send = recv + 1", kArg,
         [](C c) { return loomAllReduce(c.a + 1, c.a, 4, loomFloat32, loomSum, c.comm, nullptr); }},
        {"AllGather send = recv + 1", kArg,
         [](C c) { return loomAllGather(c.a + 1, c.a, 4, loomFloat32, c.comm, nullptr); }},
        {"ReduceScatter recv = send + 1", kArg,
         [](C c) {
             return loomReduceScatter(c.a, c.a + 1, 4, loomFloat32, loomSum, c.comm, nullptr);
         }},
        {"Broadcast recv = send + 1 on root", kArg,
         [](C c) { return loomBroadcast(c.a, c.a + 1, 4, loomFloat32, c.rank, c.comm, nullptr); }},
        {"Reduce recv = send + 1 on root", kArg,
         [](C c) {
             return loomReduce(c.a, c.a + 1, 4, loomFloat32, loomSum, c.rank, c.comm, nullptr);
         }},
        {"AllToAll in place", kArg,
         [](C c) { return loomAllToAll(c.a, c.a, 4, loomFloat32, c.comm, nullptr); }},
        {"AllToAll recv = send + 1", kArg,
         [](C c) { return loomAllToAll(c.a, c.a + 1, 4, loomFloat32, c.comm, nullptr); }},
        {"AllToAllv overlapping", kArg,
         [](C c) {
             return loomAllToAllv(c.a, c.counts, c.displs, c.a + 1, c.counts, c.displs, loomFloat32,
                                  c.comm, nullptr);
         }},

        // ---- AllToAllv count arrays
        {"AllToAllv NULL sendcounts", kArg,
         [](C c) {
             return loomAllToAllv(c.a, nullptr, c.displs, c.b, c.counts, c.displs, loomFloat32,
                                  c.comm, nullptr);
         }},
        {"AllToAllv NULL sdispls", kArg,
         [](C c) {
             return loomAllToAllv(c.a, c.counts, nullptr, c.b, c.counts, c.displs, loomFloat32,
                                  c.comm, nullptr);
         }},
        {"AllToAllv NULL recvcounts", kArg,
         [](C c) {
             return loomAllToAllv(c.a, c.counts, c.displs, c.b, nullptr, c.displs, loomFloat32,
                                  c.comm, nullptr);
         }},
        {"AllToAllv NULL rdispls", kArg,
         [](C c) {
             return loomAllToAllv(c.a, c.counts, c.displs, c.b, c.counts, nullptr, loomFloat32,
                                  c.comm, nullptr);
         }},

        // ---- communicator creation
        {"CommInitRankConfig zeroed config", kArg,
         [](C c) {
             loomConfig_t cfg;
             memset(&cfg, 0, sizeof(cfg));
             loomComm_t x = nullptr;
             return loomCommInitRankConfig(&x, c.n, c.id, c.rank, &cfg);
         }},
        {"CommInitRankConfig wrong magic", kArg,
         [](C c) {
             loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
             cfg.magic = 0x12345678u;
             loomComm_t x = nullptr;
             return loomCommInitRankConfig(&x, c.n, c.id, c.rank, &cfg);
         }},
        {"CommInitRank nranks 0", kArg,
         [](C c) {
             loomComm_t x = nullptr;
             return loomCommInitRank(&x, 0, c.id, 0);
         }},
        {"CommInitRank nranks -1", kArg,
         [](C c) {
             loomComm_t x = nullptr;
             return loomCommInitRank(&x, -1, c.id, 0);
         }},
        {"CommInitRank rank nranks", kArg,
         [](C c) {
             loomComm_t x = nullptr;
             return loomCommInitRank(&x, c.n, c.id, c.n);
         }},
        {"CommInitRank rank -1", kArg,
         [](C c) {
             loomComm_t x = nullptr;
             return loomCommInitRank(&x, c.n, c.id, -1);
         }},
        {"CommInitRank zeroed id", kArg,
         [](C c) {
             loomUniqueId id;
             memset(&id, 0, sizeof(id));
             loomComm_t x = nullptr;
             return loomCommInitRank(&x, c.n, id, c.rank);
         }},
        {"CommInitRank garbage id", kArg,
         [](C c) {
             loomUniqueId id;
             for (size_t i = 0; i < sizeof(id.internal); i++)
                 id.internal[i] = static_cast<char>(0x5b + 31 * i);
             loomComm_t x = nullptr;
             return loomCommInitRank(&x, c.n, id, c.rank);
         }},

        // ---- streams
        {"AllReduce on a non-stream", kArg,
         [](C c) {
             return loomAllReduce(c.a, c.b, 4, loomFloat32, loomSum, c.comm, NotAStream(c));
         }},
        {"Send on a non-stream", kArg,
         [](C c) { return loomSend(c.a, 4, loomFloat32, 1 - c.rank, c.comm, NotAStream(c)); }},
        {"Barrier on a non-stream", kArg, [](C c) { return loomBarrier(c.comm, NotAStream(c)); }},
        {"StreamSynchronize non-stream", kArg,
         [](C c) { return loomStreamSynchronize(NotAStream(c)); }},
        {"StreamQuery non-stream", kArg, [](C c) { return loomStreamQuery(NotAStream(c)); }},
        {"StreamDestroy non-stream", kArg, [](C c) { return loomStreamDestroy(NotAStream(c)); }},

        // ---- groups
        {"GroupEnd without GroupStart", loomInvalidUsage, [](C) { return loomGroupEnd(); }},
    };
}

// Runs one row; returns "" or what was wrong: the code, or a last error that is empty or was
// not replaced. The sentinel call before the row plants a known message; a row calling the
// sentinel's function uses another one.
std::string CheckRow(const Row &row, Ctx &c)
{
    loomtest::SetContext(row.name);
    const bool alt = strstr(row.name, "CommCount") != nullptr;
    XT_CHECK_LOOM_RES(alt ? loomCommUserRank(nullptr, nullptr) : loomCommCount(nullptr, nullptr),
                      loomInvalidArgument);
    const std::string sentinel = loomGetLastError(nullptr);
    XT_CHECK(!sentinel.empty());
    const loomResult_t got = row.call(c);
    const std::string msg = loomGetLastError(c.comm);
    fprintf(stderr, "%-44s -> %s: '%s'\n", row.name, loomtest::Show(got).c_str(), msg.c_str());
    if (got != row.expected)
        return std::string(row.name) + ": returned " + loomtest::Show(got) + ", expected " +
               loomtest::Show(row.expected);
    if (msg.empty() || msg == sentinel)
        return std::string(row.name) + ": no message in loomGetLastError";
    for (const std::string &w : row.says)
        if (msg.find(w) == std::string::npos)
            return std::string(row.name) + ": '" + w + "' not in the message";
    return "";
}

// A sum all-reduce over 2 ranks that must succeed and be right.
void CheckCommWorks(loomComm_t comm, int rank)
{
    float in[5], out[5];
    for (int i = 0; i < 5; i++)
        in[i] = static_cast<float>(rank * 10 + i);
    XT_CHECK_LOOM(loomAllReduce(in, out, 5, loomFloat32, loomSum, comm, nullptr));
    for (int i = 0; i < 5; i++)
        XT_CHECK_EQ(out[i], static_cast<float>(10 + 2 * i));
    XT_CHECK_LOOM(loomBarrier(comm, nullptr));
}

TEST(Args, EveryInvalidArgumentIsRejected)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t) {
            Ctx c;
            memset(&c, 0, sizeof(c));
            std::vector<float> a(64, 1.0f), b(64, 2.0f);
            c.rank = rank;
            c.n = n;
            c.a = a.data();
            c.b = b.data();
            c.counts[0] = c.counts[1] = 2;
            c.displs[0] = 0;
            c.displs[1] = 2;
            void *none = mmap(nullptr, 2 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            XT_CHECK(none != MAP_FAILED);
            c.none = static_cast<char *>(none);
            loomtest::ShareUniqueId(&c.id);
            XT_CHECK_LOOM(loomCommInitRank(&c.comm, n, c.id, rank));
            std::string failures;
            for (const Row &row : Rows()) {
                const std::string f = CheckRow(row, c);
                if (!f.empty())
                    failures += "\n  " + f;
            }
            loomtest::SetContext("the communicator after the table");
            CheckCommWorks(c.comm, rank);
            XT_CHECK_LOOM(loomCommDestroy(c.comm));
            XT_CHECK_MSG(failures.empty(), "rows that failed:" + failures);
        },
        opts));
}

// count == 0 is valid, and NULL buffers are an error only with count > 0.
TEST(Args, ZeroCountWithNullBuffersIsValid)
{
    XT_ASSERT_RUN(loomtest::RunRanks(2, [](int rank, int n, loomComm_t comm) {
        const size_t zeros[2] = {0, 0};
        XT_CHECK_LOOM(loomAllReduce(nullptr, nullptr, 0, loomFloat32, loomSum, comm, nullptr));
        XT_CHECK_LOOM(loomAllGather(nullptr, nullptr, 0, loomInt8, comm, nullptr));
        XT_CHECK_LOOM(loomReduceScatter(nullptr, nullptr, 0, loomBfloat16, loomAvg, comm, nullptr));
        XT_CHECK_LOOM(loomBroadcast(nullptr, nullptr, 0, loomFloat64, n - 1, comm, nullptr));
        XT_CHECK_LOOM(loomReduce(nullptr, nullptr, 0, loomUint64, loomMax, 0, comm, nullptr));
        XT_CHECK_LOOM(loomAllToAll(nullptr, nullptr, 0, loomInt32, comm, nullptr));
        XT_CHECK_LOOM(loomAllToAllv(nullptr, zeros, zeros, nullptr, zeros, zeros, loomFloat8e4m3,
                                    comm, nullptr));
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_LOOM(loomSend(nullptr, 0, loomFloat16, 1 - rank, comm, nullptr));
        XT_CHECK_LOOM(loomRecv(nullptr, 0, loomFloat16, 1 - rank, comm, nullptr));
        XT_CHECK_LOOM(loomGroupEnd());
        CheckCommWorks(comm, rank);
    }));
}

// A communicator made with every config field set: blocking 0 is accepted (and blocks), the
// transport list and name are taken.
TEST(Args, InitWithConfigFields)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t) {
            loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
            cfg.blocking = 0;
            cfg.timeout_ms = 60000;
            cfg.net = "tcp";
            cfg.commName = "config-test";
            loomComm_t comm = loomtest::CreateComm(&cfg);
            int count = 0;
            XT_CHECK_LOOM(loomCommCount(comm, &count));
            XT_CHECK_EQ(count, n);
            CheckCommWorks(comm, rank);
            XT_CHECK_LOOM(loomCommDestroy(comm));
        },
        opts));
}

TEST(Args, NullHandlesAreNoOpsWhereDocumented)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t) {
            XT_CHECK_LOOM(loomCommDestroy(nullptr));
            XT_CHECK_LOOM(loomCommAbort(nullptr));
        },
        opts));
}

TEST(Args, ErrorStringsAndVersion)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t) {
            std::set<std::string> seen;
            for (int r = 0; r < loomNumResults; r++) {
                const char *s = loomGetErrorString(static_cast<loomResult_t>(r));
                XT_CHECK(s != nullptr);
                XT_CHECK_MSG(*s != '\0', "empty string for code " + std::to_string(r));
                XT_CHECK_MSG(seen.insert(s).second, "duplicate string '" + std::string(s) + "'");
            }
            for (int r : {static_cast<int>(loomNumResults), 99, -1})
                XT_CHECK(loomGetErrorString(static_cast<loomResult_t>(r)) != nullptr);
            int version = -1;
            XT_CHECK_LOOM(loomGetVersion(&version));
            XT_CHECK_EQ(version, LOOM_VERSION_CODE);
            XT_CHECK(loomGetLastError(nullptr) != nullptr);
        },
        opts));
}

TEST(Args, UseAfterDestroyIsInvalidArgument)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t) {
            loomComm_t comm = loomtest::CreateComm();
            CheckCommWorks(comm, rank);
            XT_CHECK_LOOM(loomCommDestroy(comm));
            float x[2] = {1, 2}, y[2];
            XT_CHECK_LOOM_RES(loomAllReduce(x, y, 2, loomFloat32, loomSum, comm, nullptr),
                              loomInvalidArgument);
            XT_CHECK(strlen(loomGetLastError(nullptr)) > 0);
            int count = 0;
            XT_CHECK_LOOM_RES(loomCommCount(comm, &count), loomInvalidArgument);
        },
        opts));
}

} // namespace
