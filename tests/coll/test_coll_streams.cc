// SPDX-License-Identifier: Apache-2.0
//
// test_coll_streams.cc - loomStream_t: collectives queued on a stream complete in order with
// exact results, also many more than the stream's queue holds; a queued operation returns before it
// completes (checked by construction, not by timing: the peer does not join until the caller has
// seen loomInProgress); stream and blocking calls on one communicator run in issue order; a
// failed operation surfaces at loomStreamSynchronize and through loomCommGetAsyncError; and host
// functions (loomStreamLaunchHostFunc) run in queue order, each seeing the results of what was
// queued before it and the failure of its own batch only; loomStreamIsLive tells live streams from
// other values without a word. Polling loops spin on loomStreamQuery; the harness deadline bounds
// them. Run by meson's 'coll' suite.

#include <sched.h>

#include <cstring>
#include <string>
#include <vector>

#include "loom.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

using Bytes = std::vector<unsigned char>;

Bytes ReduceInput(loomDataType_t dt, loomRedOp_t op, int rank, uint64_t seed, size_t count)
{
    Bytes b(count * loomtest::TypeSize(dt));
    loomtest::FillReduceInput(b.data(), dt, op, rank, seed, 0, count);
    return b;
}

Bytes ReduceWant(loomDataType_t dt, loomRedOp_t op, int n, uint64_t seed, size_t first,
                 size_t count)
{
    Bytes b(count * loomtest::TypeSize(dt));
    loomtest::FillReduceExpected(b.data(), dt, op, n, seed, first, count);
    return b;
}

void CheckEqual(const void *got, const Bytes &want, loomDataType_t dt, const std::string &what)
{
    const std::string diff =
        loomtest::CompareElements(got, want.data(), want.size() / loomtest::TypeSize(dt), dt);
    XT_CHECK_MSG(diff.empty(), what + ": " + diff);
}

TEST(Streams, QueuedCollectivesCompleteInOrder)
{
    XT_ASSERT_RUN(loomtest::RunRanks(2, [](int rank, int n, loomComm_t comm) {
        const size_t count = 4097;
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        XT_CHECK(s != nullptr);

        const Bytes ar_in = ReduceInput(loomFloat32, loomSum, rank, 1, count);
        Bytes ar_out(count * 4);
        XT_CHECK_LOOM(
            loomAllReduce(ar_in.data(), ar_out.data(), count, loomFloat32, loomSum, comm, s));
        // The second all-reduce reads the first one's output: only in-order execution
        // gives the expected result.
        Bytes ar2_out(count * 4);
        XT_CHECK_LOOM(
            loomAllReduce(ar_out.data(), ar2_out.data(), count, loomFloat32, loomSum, comm, s));
        const Bytes rs_in = ReduceInput(loomBfloat16, loomAvg, rank, 2, count * 2);
        Bytes rs_out(count * 2);
        XT_CHECK_LOOM(
            loomReduceScatter(rs_in.data(), rs_out.data(), count, loomBfloat16, loomAvg, comm, s));
        Bytes bc(count * 8, 0);
        if (rank == 1)
            loomtest::FillPattern(bc.data(), bc.size(), 1, 3);
        XT_CHECK_LOOM(loomBroadcast(bc.data(), bc.data(), count, loomFloat64, 1, comm, s));
        Bytes ag(2 * count);
        XT_CHECK_LOOM(loomAllGather(bc.data(), ag.data(), count, loomUint8, comm, s));

        loomResult_t r;
        while ((r = loomStreamQuery(s)) == loomInProgress)
            sched_yield();
        XT_CHECK_EQ(r, loomSuccess);
        XT_CHECK_LOOM(loomStreamSynchronize(s));

        const Bytes ar_want = ReduceWant(loomFloat32, loomSum, n, 1, 0, count);
        CheckEqual(ar_out.data(), ar_want, loomFloat32, "first all-reduce");
        std::vector<float> twice(count);
        memcpy(twice.data(), ar_want.data(), ar_want.size());
        for (float &x : twice)
            x = x + x; // exact: integer-valued and far below 2^24
        Bytes twice_bytes(count * 4);
        memcpy(twice_bytes.data(), twice.data(), twice_bytes.size());
        CheckEqual(ar2_out.data(), twice_bytes, loomFloat32, "second all-reduce");
        CheckEqual(rs_out.data(), ReduceWant(loomBfloat16, loomAvg, n, 2, rank * count, count),
                   loomBfloat16, "reduce-scatter");
        Bytes bc_want(count * 8);
        loomtest::FillPattern(bc_want.data(), bc_want.size(), 1, 3);
        CheckEqual(bc.data(), bc_want, loomFloat64, "broadcast");
        for (int r2 = 0; r2 < 2; r2++)
            XT_CHECK(memcmp(ag.data() + static_cast<size_t>(r2) * count, bc_want.data(), count) ==
                     0);
        XT_CHECK_LOOM(loomStreamDestroy(s));
    }));
}

// 4000 operations queued at once, far more than a stream holds (256): the caller waits for room
// instead of failing or growing without bound, and tasks are reused. Call 2i sums rank + i,
// call 2i + 1 takes the max of call 2i's output: it sees that output only if every call ran in
// order.
TEST(Streams, MoreCallsThanTheQueueHoldsRunInOrder)
{
    XT_ASSERT_RUN(loomtest::RunRanks(3, [](int rank, int n, loomComm_t comm) {
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        const size_t calls = 2000;
        std::vector<int64_t> in(calls), sum(calls, -1), max(calls, -1);
        for (size_t i = 0; i < calls; i++) {
            in[i] = rank + static_cast<int64_t>(i);
            XT_CHECK_LOOM(loomAllReduce(&in[i], &sum[i], 1, loomInt64, loomSum, comm, s));
            XT_CHECK_LOOM(loomAllReduce(&sum[i], &max[i], 1, loomInt64, loomMax, comm, s));
        }
        XT_CHECK_LOOM(loomStreamSynchronize(s));
        int wrong = 0;
        for (size_t i = 0; i < calls; i++) {
            const int64_t want = n * static_cast<int64_t>(i) + n * (n - 1) / 2;
            wrong += sum[i] != want || max[i] != want;
        }
        XT_CHECK_EQ(wrong, 0);
        XT_CHECK_LOOM(loomStreamDestroy(s));
    }));
}

// Rank 0 queues a 64 MiB all-reduce and must see it still in progress: rank 1 only joins
// after rank 0 says so over a second communicator, so the operation cannot have finished.
TEST(Streams, EnqueueReturnsBeforeCompletion)
{
    loomtest::RunOptions opts;
    opts.deadline_s = 60;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t comm) {
            const size_t count = size_t{16} << 20; // float32: 64 MiB
            loomComm_t side = nullptr;
            XT_CHECK_LOOM(loomCommSplit(comm, 0, rank, &side, nullptr));
            const Bytes in = ReduceInput(loomFloat32, loomSum, rank, 5, count);
            Bytes out(count * 4);
            loomStream_t s = nullptr;
            XT_CHECK_LOOM(loomStreamCreate(&s));
            int32_t go = 1;
            if (rank == 1)
                XT_CHECK_LOOM(loomRecv(&go, 1, loomInt32, 0, side, nullptr));
            XT_CHECK_LOOM(
                loomAllReduce(in.data(), out.data(), count, loomFloat32, loomSum, comm, s));
            if (rank == 0) {
                XT_CHECK_EQ(loomStreamQuery(s), loomInProgress);
                XT_CHECK_LOOM(loomSend(&go, 1, loomInt32, 1, side, nullptr));
            }
            // Work on the calling thread while the stream runs: the expected result.
            const Bytes want = ReduceWant(loomFloat32, loomSum, n, 5, 0, count);
            XT_CHECK_LOOM(loomStreamSynchronize(s));
            CheckEqual(out.data(), want, loomFloat32, "all-reduce");
            XT_CHECK_LOOM(loomStreamDestroy(s));
            XT_CHECK_LOOM(loomCommDestroy(side));
        },
        opts));
}

TEST(Streams, StreamAndBlockingCallsRunInIssueOrder)
{
    XT_ASSERT_RUN(loomtest::RunRanks(3, [](int rank, int n, loomComm_t comm) {
        const size_t count = 1 << 18;
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        Bytes a = ReduceInput(loomInt32, loomSum, rank, 7, count);
        const Bytes b_in = ReduceInput(loomFloat16, loomMax, rank, 8, count);
        Bytes b_out(count * 2);
        XT_CHECK_LOOM(loomAllReduce(a.data(), a.data(), count, loomInt32, loomSum, comm, s));
        XT_CHECK_LOOM(
            loomAllReduce(b_in.data(), b_out.data(), count, loomFloat16, loomMax, comm, nullptr));
        XT_CHECK_LOOM(loomStreamSynchronize(s));
        CheckEqual(a.data(), ReduceWant(loomInt32, loomSum, n, 7, 0, count), loomInt32,
                   "stream all-reduce");
        CheckEqual(b_out.data(), ReduceWant(loomFloat16, loomMax, n, 8, 0, count), loomFloat16,
                   "blocking all-reduce");
        XT_CHECK_LOOM(loomStreamDestroy(s));
    }));
}

// Rank 0 sends 8 bytes; rank 1 receives into 4 bytes on a stream. The mismatch must surface
// on rank 1 at Synchronize (then be cleared) and through loomCommGetAsyncError.
TEST(Streams, FailedOperationSurfacesAtSynchronize)
{
    XT_ASSERT_RUN(loomtest::RunRanks(2, [](int rank, int, loomComm_t comm) {
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        loomResult_t async = loomInternalError;
        XT_CHECK_LOOM(loomCommGetAsyncError(comm, &async));
        XT_CHECK_EQ(async, loomSuccess);
        uint8_t buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        if (rank == 0) {
            XT_CHECK_LOOM(loomSend(buf, 8, loomUint8, 1, comm, s));
            const loomResult_t r = loomStreamSynchronize(s);
            fprintf(stderr, "rank 0: the oversized send finished with %s\n",
                    loomtest::Show(r).c_str());
        } else {
            XT_CHECK_LOOM(loomRecv(buf, 4, loomUint8, 0, comm, s));
            const loomResult_t r = loomStreamSynchronize(s);
            XT_CHECK(r != loomSuccess && r != loomInProgress);
            fprintf(stderr, "rank 1: synchronize returned %s: %s\n", loomtest::Show(r).c_str(),
                    loomGetLastError(comm));
            XT_CHECK(strlen(loomGetLastError(comm)) > 0);
            XT_CHECK_LOOM(loomCommGetAsyncError(comm, &async));
            XT_CHECK_EQ(async, r);
            XT_CHECK_LOOM(loomStreamSynchronize(s)); // the stream's error was cleared
            XT_CHECK_LOOM(loomCommGetAsyncError(comm, &async));
            XT_CHECK_EQ(async, r); // the communicator keeps its first failure
        }
        XT_CHECK_LOOM(loomStreamDestroy(s));
    }));
}

// loomStreamQuery reports a failed operation, but only Synchronize clears it: the header says
// Synchronize returns the first error "since the last synchronize (then clears it)".
TEST(Streams, QueryReportsAnErrorWithoutClearingIt)
{
    XT_ASSERT_RUN(loomtest::RunRanks(2, [](int rank, int, loomComm_t comm) {
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        uint8_t buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        if (rank == 0) {
            XT_CHECK_LOOM(loomSend(buf, 8, loomUint8, 1, comm, s));
            (void)loomStreamSynchronize(s);
        } else {
            XT_CHECK_LOOM(loomRecv(buf, 4, loomUint8, 0, comm, s));
            loomResult_t q;
            while ((q = loomStreamQuery(s)) == loomInProgress)
                sched_yield();
            XT_CHECK(q != loomSuccess);
            XT_CHECK_EQ(loomStreamQuery(s), q); // still reported
            XT_CHECK_EQ(loomStreamSynchronize(s), q);
            XT_CHECK_LOOM(loomStreamSynchronize(s)); // cleared by the synchronize
            XT_CHECK_LOOM(loomStreamQuery(s));
        }
        XT_CHECK_LOOM(loomStreamDestroy(s));
    }));
}

// A host function runs after every operation queued before it and before any queued after it:
// each snapshot of the buffer taken by a host function holds the result of the AllReduce queued
// just before it, although the next AllReduce overwrites the buffer. 300 rounds: more than the
// stream's queue holds, so host functions also come from the spare tasks of operations.
struct HostSnap {
    const std::vector<int32_t> *buf;
    std::vector<std::vector<int32_t>> snaps;
    std::vector<loomResult_t> status;
};

void SnapHostFn(void *arg, loomResult_t status)
{
    auto *h = static_cast<HostSnap *>(arg);
    h->snaps.push_back(*h->buf);
    h->status.push_back(status);
}

TEST(Streams, HostFunctionsRunInQueueOrderAfterTheirOperations)
{
    XT_ASSERT_RUN(loomtest::RunRanks(2, [](int rank, int n, loomComm_t comm) {
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        const int rounds = 300;
        std::vector<std::vector<int32_t>> in(rounds, std::vector<int32_t>(16));
        std::vector<int32_t> out(16);
        HostSnap h{&out, {}, {}};
        for (int i = 0; i < rounds; i++) {
            for (int j = 0; j < 16; j++)
                in[i][j] = (rank + 1) * (i * 16 + j);
            XT_CHECK_LOOM(loomAllReduce(in[i].data(), out.data(), 16, loomInt32, loomSum, comm, s));
            XT_CHECK_LOOM(loomStreamLaunchHostFunc(s, SnapHostFn, &h));
        }
        XT_CHECK_LOOM(loomStreamSynchronize(s));
        XT_CHECK_EQ(h.snaps.size(), (size_t)rounds);
        const int32_t factor = n * (n + 1) / 2;
        for (int i = 0; i < rounds && i < (int)h.snaps.size(); i++) {
            XT_CHECK_EQ(h.status[i], loomSuccess);
            for (int j = 0; j < 16; j++)
                XT_CHECK_EQ(h.snaps[i][j], factor * (i * 16 + j));
        }
        XT_CHECK_LOOM(loomStreamDestroy(s));
    }));
}

struct HostStatus {
    std::vector<loomResult_t> status;
    std::vector<std::string> msg;
};

void StatusHostFn(void *arg, loomResult_t status)
{
    auto *h = static_cast<HostStatus *>(arg);
    h->status.push_back(status);
    h->msg.push_back(loomGetLastError(nullptr));
}

// The failure of an operation reaches the next host function with its message, and only that one:
// a host function queued right after it sees Success. The stream keeps its own error for
// loomStreamSynchronize independently.
TEST(Streams, HostFunctionGetsTheFailureOfItsOwnBatch)
{
    XT_ASSERT_RUN(loomtest::RunRanks(2, [](int rank, int, loomComm_t comm) {
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        HostStatus h;
        uint8_t buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        XT_CHECK_LOOM(loomStreamLaunchHostFunc(s, StatusHostFn, &h)); // nothing before it
        if (rank == 0)
            XT_CHECK_LOOM(loomSend(buf, 8, loomUint8, 1, comm, s));
        else
            XT_CHECK_LOOM(loomRecv(buf, 4, loomUint8, 0, comm, s)); // too small: fails
        XT_CHECK_LOOM(loomStreamLaunchHostFunc(s, StatusHostFn, &h));
        XT_CHECK_LOOM(loomStreamLaunchHostFunc(s, StatusHostFn, &h));
        const loomResult_t sync = loomStreamSynchronize(s);
        XT_CHECK_EQ(h.status.size(), (size_t)3);
        if (h.status.size() == 3) {
            XT_CHECK_EQ(h.status[0], loomSuccess);
            XT_CHECK_EQ(h.status[2], loomSuccess);
            XT_CHECK_MSG(h.msg[2].empty(), h.msg[2]);
            if (rank == 1) {
                XT_CHECK(h.status[1] != loomSuccess);
                XT_CHECK_EQ(h.status[1], sync); // the same failure, also kept for Synchronize
                XT_CHECK_MSG(!h.msg[1].empty(), "no message for the failed receive");
                fprintf(stderr, "rank 1: the host function saw %s: %s\n",
                        loomtest::Show(h.status[1]).c_str(), h.msg[1].c_str());
            }
        }
        XT_CHECK_LOOM(loomStreamDestroy(s));
    }));
}

void NoopHostFn(void *, loomResult_t) {}

// In a rank process, as every test here: loom touched in the test binary's own process would
// leave state (its log and trace files) that later tests in the same binary trip over.
TEST(Streams, HostFunctionArgumentsAreChecked)
{
    XT_ASSERT_RUN(loomtest::RunRanks(1, [](int, int, loomComm_t) {
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        XT_CHECK_EQ(loomStreamLaunchHostFunc(s, nullptr, nullptr), loomInvalidArgument);
        XT_CHECK_EQ(loomStreamLaunchHostFunc(nullptr, NoopHostFn, nullptr), loomInvalidArgument);
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_EQ(loomStreamLaunchHostFunc(s, NoopHostFn, nullptr), loomInvalidUsage);
        XT_CHECK(std::string(loomGetLastError(nullptr)).find("group") != std::string::npos);
        XT_CHECK_LOOM(loomGroupEnd());
        XT_CHECK_LOOM(loomStreamLaunchHostFunc(s, NoopHostFn, nullptr));
        XT_CHECK_LOOM(loomStreamDestroy(s));
        XT_CHECK_EQ(loomStreamLaunchHostFunc(s, NoopHostFn, nullptr), loomInvalidArgument);
    }));
}

// loomStreamIsLive answers by address alone and quietly: the last error set by an earlier failure
// stays as it was whatever it is asked about (the NCCL drop-in library asks it about CUDA streams).
TEST(Streams, IsLiveTellsLiveStreamsFromOtherValues)
{
    XT_ASSERT_RUN(loomtest::RunRanks(1, [](int, int, loomComm_t comm) {
        loomStream_t s = nullptr, other = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        XT_CHECK_LOOM(loomStreamCreate(&other));
        int live = -1;
        XT_CHECK_LOOM(loomStreamIsLive(s, &live));
        XT_CHECK_EQ(live, 1);
        XT_CHECK_LOOM(loomStreamIsLive(other, &live));
        XT_CHECK_EQ(live, 1);
        // A failure whose text must survive the questions below.
        XT_CHECK_EQ(loomStreamSynchronize(nullptr), loomInvalidArgument);
        const std::string before = loomGetLastError(nullptr);
        XT_CHECK(!before.empty());
        int on_stack = 0;
        const void *not_streams[] = {nullptr, &on_stack, comm, reinterpret_cast<const void *>(0x1),
                                     reinterpret_cast<const char *>(s) + 1};
        for (const void *v : not_streams) {
            live = -1;
            XT_CHECK_LOOM(loomStreamIsLive(v, &live));
            XT_CHECK_EQ(live, 0);
        }
        XT_CHECK_EQ(std::string(loomGetLastError(nullptr)), before);
        XT_CHECK_LOOM(loomStreamDestroy(s));
        XT_CHECK_LOOM(loomStreamIsLive(s, &live));
        XT_CHECK_EQ(live, 0);
        XT_CHECK_LOOM(loomStreamIsLive(other, &live));
        XT_CHECK_EQ(live, 1);
        XT_CHECK_EQ(loomStreamIsLive(other, nullptr), loomInvalidArgument);
        XT_CHECK_LOOM(loomStreamDestroy(other));
    }));
}

} // namespace
