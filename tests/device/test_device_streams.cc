// SPDX-License-Identifier: Apache-2.0
//
// test_device_streams.cc - the streams a device call may be given: none (the communicator's own
// device stream, waited for), a worker stream (the worker waits in its turn), and a loom stream
// wrapping the emulation's default stream or one of its own (queued, returns at once): results
// bitwise equal to the host call's with the transports' choice and with host staging forced; a
// chain of host and device calls on one worker stream in order; a wrapped stream's query, host
// functions (in order, seeing what came before, the failure of their batch only) and the failure
// surfacing at synchronize and through loomCommGetAsyncError; and the LOOM_COLL_TRACE line that
// names each device call's transport and why. Run by meson's 'device' suite.

#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dev_cases.h"
#include "mp_fixture.h"

namespace {

using devtest::Case;
using devtest::Coll;
using devtest::StreamKind;

std::vector<Case> StreamCases()
{
    return {Case{Coll::AllReduce, loomFloat32, loomSum},
            Case{Coll::AllReduce, loomBfloat16, loomAvg},
            Case{Coll::AllGatherV, loomFloat16},
            Case{Coll::SendRecv, loomInt32},
            Case{Coll::Barrier, loomUint8},
            Case{Coll::Echo, loomFloat32},
            Case{Coll::AllReduce, loomInt32, loomMax, 1001, false, devtest::Place::Host,
                 devtest::Place::Host}};
}

void EveryStreamKind(const std::string &transports)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t comm) {
            for (StreamKind k : {StreamKind::Null, StreamKind::Worker, StreamKind::WrapDefault,
                                 StreamKind::WrapCreated})
                for (const Case &c : StreamCases())
                    devtest::CheckCase(c, comm, rank, n, k);
        },
        devtest::Options(transports)));
}

TEST(DeviceStreams, EveryStreamKind)
{
    EveryStreamKind("");
}

TEST(DeviceStreams, EveryStreamKindStaged)
{
    EveryStreamKind("staged");
}

// Host, device, device, host calls on one worker stream, each reading the one before: only the
// issue order gives the expected values.
TEST(DeviceStreams, WorkerStreamKeepsHostAndDeviceCallsInOrder)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t comm) {
            const size_t count = 5000;
            loomStream_t s = nullptr;
            XT_CHECK_LOOM(loomStreamCreate(&s));
            std::vector<int64_t> in(count), a(count), d(count);
            for (size_t i = 0; i < count; i++)
                in[i] = rank * 1000 + static_cast<int64_t>(i);
            devtest::DevBuf b(count * 8), c(count * 8);
            XT_CHECK_LOOM(loomAllReduce(in.data(), a.data(), count, loomInt64, loomSum, comm, s));
            XT_CHECK_LOOM(loomAllReduce(a.data(), b.data(), count, loomInt64, loomSum, comm, s));
            XT_CHECK_LOOM(loomAllReduce(b.data(), c.data(), count, loomInt64, loomSum, comm, s));
            XT_CHECK_LOOM(loomAllReduce(c.data(), d.data(), count, loomInt64, loomSum, comm, s));
            XT_CHECK_LOOM(loomStreamSynchronize(s));
            int wrong = 0;
            for (size_t i = 0; i < count; i++) {
                const int64_t sum = 1000 * n * (n - 1) / 2 + n * static_cast<int64_t>(i);
                wrong += d[i] != sum * n * n * n;
            }
            XT_CHECK_EQ(wrong, 0);
            XT_CHECK_LOOM(loomStreamDestroy(s));
        },
        devtest::Options()));
}

struct Seen {
    const int64_t *buf = nullptr; // device memory, host-addressable in the emulation
    int64_t value = -1;
    loomResult_t status = loomInternalError;
    std::string error;
    int order = -1;
    int *counter = nullptr;
};

void Record(void *arg, loomResult_t status)
{
    Seen *s = static_cast<Seen *>(arg);
    s->value = s->buf[0];
    s->status = status;
    s->error = loomGetLastError(nullptr);
    s->order = (*s->counter)++;
}

// Host functions on a wrapped stream run in queue order after what was queued before them; the
// first sees the first all-reduce's result, the second the second's.
TEST(DeviceStreams, HostFunctionsOnAWrappedStream)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t comm) {
            devtest::Stream s(StreamKind::WrapCreated);
            devtest::DevBuf x(8);
            int64_t v = rank + 1;
            memcpy(x.data(), &v, 8);
            int counter = 0;
            Seen first, second;
            first.buf = second.buf = reinterpret_cast<const int64_t *>(x.data());
            first.counter = second.counter = &counter;
            XT_CHECK_LOOM(loomAllReduce(x.data(), x.data(), 1, loomInt64, loomSum, comm, s.get()));
            XT_CHECK_LOOM(loomStreamLaunchHostFunc(s.get(), Record, &first));
            XT_CHECK_LOOM(loomAllReduce(x.data(), x.data(), 1, loomInt64, loomSum, comm, s.get()));
            XT_CHECK_LOOM(loomStreamLaunchHostFunc(s.get(), Record, &second));
            s.Sync();
            const int64_t sum = n * (n + 1) / 2;
            XT_CHECK_EQ(first.value, sum);
            XT_CHECK_EQ(second.value, sum * n);
            XT_CHECK_EQ(first.order, 0);
            XT_CHECK_EQ(second.order, 1);
            XT_CHECK_EQ(first.status, loomSuccess);
            XT_CHECK_EQ(second.status, loomSuccess);
            XT_CHECK_EQ(loomStreamQuery(s.get()), loomSuccess);
        },
        devtest::Options()));
}

// Rank 0 sends 8 bytes, rank 1 receives them into 4 bytes of device memory on a wrapped stream:
// the failure reaches the next host function (not the one after), loomStreamSynchronize (once)
// and loomCommGetAsyncError, and the stream goes on.
TEST(DeviceStreams, FailureSurfacesOnAWrappedStream)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t comm) {
            devtest::Stream s(StreamKind::WrapDefault);
            devtest::DevBuf buf(8);
            memset(buf.data(), 7, 8);
            if (rank == 0) {
                XT_CHECK_LOOM(loomSend(buf.data(), 8, loomUint8, 1, comm, s.get()));
                s.Sync();
                return;
            }
            int counter = 0;
            Seen after, later;
            after.buf = later.buf = reinterpret_cast<const int64_t *>(buf.data());
            after.counter = later.counter = &counter;
            XT_CHECK_LOOM(loomRecv(buf.data(), 4, loomUint8, 0, comm, s.get()));
            XT_CHECK_LOOM(loomStreamLaunchHostFunc(s.get(), Record, &after));
            XT_CHECK_LOOM(loomStreamLaunchHostFunc(s.get(), Record, &later));
            XT_CHECK_EQ(loomStreamSynchronize(s.get()), loomInvalidUsage);
            XT_CHECK_LOOM(loomStreamSynchronize(s.get()));
            XT_CHECK_EQ(after.status, loomInvalidUsage);
            XT_CHECK_MSG(after.error.find("8-byte message") != std::string::npos, after.error);
            XT_CHECK_EQ(later.status, loomSuccess);
            loomResult_t async = loomSuccess;
            XT_CHECK_LOOM(loomCommGetAsyncError(comm, &async));
            XT_CHECK_EQ(async, loomInvalidUsage);
        },
        devtest::Options("staged")));
}

// A call queued on a wrapped stream returns before it completes: rank 1 joins only after rank 0
// saw loomStreamQuery say InProgress (told over a second communicator).
TEST(DeviceStreams, WrappedStreamCallReturnsBeforeCompletion)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t comm) {
            loomComm_t side = nullptr;
            XT_CHECK_LOOM(loomCommSplit(comm, 0, rank, &side, nullptr));
            devtest::Stream s(StreamKind::WrapCreated);
            devtest::DevBuf x(4096 * 4);
            memset(x.data(), 0, x.size());
            int32_t go = 1;
            if (rank == 1)
                XT_CHECK_LOOM(loomRecv(&go, 1, loomInt32, 0, side, nullptr));
            XT_CHECK_LOOM(
                loomAllReduce(x.data(), x.data(), 4096, loomFloat32, loomSum, comm, s.get()));
            if (rank == 0) {
                XT_CHECK_EQ(loomStreamQuery(s.get()), loomInProgress);
                XT_CHECK_LOOM(loomSend(&go, 1, loomInt32, 1, side, nullptr));
            }
            s.Sync();
            XT_CHECK_EQ(loomStreamQuery(s.get()), loomSuccess);
            XT_CHECK_LOOM(loomCommDestroy(side));
        },
        devtest::Options()));
}

// LOOM_COLL_TRACE=1 logs one line per device call naming its transport and why.
TEST(DeviceStreams, TraceNamesTheTransport)
{
    loomtest::RunOptions o = devtest::Options();
    o.env.push_back({"LOOM_COLL_TRACE", "1"});
    o.env.push_back({"LOOM_DEBUG", "INFO"});
    o.env.push_back({"LOOM_DEBUG_SUBSYS", "DEVICE"});
    o.rank_env = [](int) {
        return loomtest::EnvList{{"LOOM_DEBUG_FILE", loomtest::RunDir() + "/trace.%p"}};
    };
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t comm) {
            devtest::CheckCase(Case{Coll::AllReduce, loomFloat32, loomSum}, comm, rank, n,
                               StreamKind::Null);
            devtest::CheckCase(Case{Coll::Echo, loomFloat32}, comm, rank, n,
                               StreamKind::WrapDefault);
            std::ifstream f(loomtest::RunDir() + "/trace." + std::to_string(getpid()));
            std::stringstream text;
            text << f.rdbuf();
            const std::string t = text.str();
            XT_CHECK_MSG(t.find("device allreduce #1") != std::string::npos, t);
            XT_CHECK_MSG(t.find("transport ipc: every rank on this host") != std::string::npos ||
                             t.find("transport staged: ipc not available") != std::string::npos,
                         t);
            XT_CHECK_MSG(t.find("device echo #2") != std::string::npos, t);
            XT_CHECK_MSG(t.find("codec runs on the CPU") != std::string::npos, t);
            XT_CHECK_MSG(t.find("transports: ipc") != std::string::npos, t);
        },
        o));
}

} // namespace
