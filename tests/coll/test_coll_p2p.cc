// SPDX-License-Identifier: Apache-2.0
//
// test_coll_p2p.cc - point-to-point and groups, on each transport: blocking Send/Recv pairs,
// ring shifts, all-pairs exchanges, self-sends and mixed posting orders inside groups, groups
// that mix Send/Recv with collectives posted in different relative orders, AllToAllv with zero
// and uneven counts and gapped displacements, and nested groups. Messages are large enough that
// a Send executed outside its group would block, so a broken group shows as a timeout. It does
// not test argument errors (test_coll_args.cc). Run by meson's 'coll' suite.

#include <cstring>
#include <string>
#include <vector>

#include "loom.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

using Bytes = std::vector<unsigned char>;

// The bytes rank `from` sends to rank `to` under `seed` (distinct for every ordered pair).
Bytes Message(int from, int to, uint64_t seed, size_t nbytes)
{
    Bytes b(nbytes);
    loomtest::FillPattern(b.data(), nbytes, from * 1000 + to, seed);
    return b;
}

void CheckBytes(const void *got, const Bytes &want, loomDataType_t dt, const std::string &what)
{
    const size_t es = loomtest::TypeSize(dt);
    const std::string diff = loomtest::CompareElements(got, want.data(), want.size() / es, dt);
    XT_CHECK_MSG(diff.empty(), what + ": " + diff);
}

constexpr size_t kLarge = 1 << 20; // 4 MiB of float32: beyond any transport's buffering

class P2P : public ::testing::TestWithParam<const char *> {
  protected:
    ::testing::AssertionResult Run(int nranks, const loomtest::RankBody &body)
    {
        loomtest::RunOptions opts;
        opts.env = {{"LOOM_NET", GetParam()}};
        return loomtest::RunRanks(nranks, body, opts);
    }
};

TEST_P(P2P, BlockingSendRecvPairs)
{
    XT_ASSERT_RUN(Run(2, [](int rank, int, loomComm_t comm) {
        uint64_t seed = 1;
        for (loomDataType_t dt : {loomInt8, loomFloat32, loomFloat64, loomBfloat16}) {
            for (size_t count : {size_t{0}, size_t{1}, size_t{4097}, kLarge}) {
                loomtest::SetContext(std::string(loomtest::TypeName(dt)) + " count " +
                                     std::to_string(count));
                const size_t nbytes = count * loomtest::TypeSize(dt);
                const int peer = 1 - rank;
                const Bytes out = Message(rank, peer, seed, nbytes);
                loomtest::GuardedBuffer in(nbytes);
                // Rank 0 sends first and rank 1 receives first, so neither blocks forever.
                if (rank == 0) {
                    XT_CHECK_LOOM(loomSend(out.data(), count, dt, peer, comm, nullptr));
                    XT_CHECK_LOOM(loomRecv(in.data(), count, dt, peer, comm, nullptr));
                } else {
                    XT_CHECK_LOOM(loomRecv(in.data(), count, dt, peer, comm, nullptr));
                    XT_CHECK_LOOM(loomSend(out.data(), count, dt, peer, comm, nullptr));
                }
                CheckBytes(in.data(), Message(peer, rank, seed, nbytes), dt, "received data");
                XT_CHECK(in.GuardsIntact());
                seed++;
            }
        }
    }));
}

TEST_P(P2P, RingShiftInGroup)
{
    XT_ASSERT_RUN(Run(4, [](int rank, int n, loomComm_t comm) {
        const int right = (rank + 1) % n, left = (rank + n - 1) % n;
        for (size_t count : {size_t{3}, kLarge}) {
            loomtest::SetContext("count " + std::to_string(count));
            const Bytes out = Message(rank, right, count, count * 4);
            loomtest::GuardedBuffer in(count * 4);
            XT_CHECK_LOOM(loomGroupStart());
            XT_CHECK_LOOM(loomSend(out.data(), count, loomFloat32, right, comm, nullptr));
            XT_CHECK_LOOM(loomRecv(in.data(), count, loomFloat32, left, comm, nullptr));
            XT_CHECK_LOOM(loomGroupEnd());
            CheckBytes(in.data(), Message(left, rank, count, count * 4), loomFloat32,
                       "from the left neighbour");
            XT_CHECK(in.GuardsIntact());
        }
    }));
}

TEST_P(P2P, AllPairsExchangeInGroup)
{
    XT_ASSERT_RUN(Run(4, [](int rank, int n, loomComm_t comm) {
        // Pair (a -> b) moves 1000 + 4099 * (a * n + b) int32 elements: every size differs.
        auto count_of = [n](int a, int b) { return size_t{1000} + 4099u * (a * n + b); };
        std::vector<Bytes> out(static_cast<size_t>(n));
        std::vector<loomtest::GuardedBuffer> in;
        for (int p = 0; p < n; p++) {
            out[static_cast<size_t>(p)] = Message(rank, p, 7, count_of(rank, p) * 4);
            in.emplace_back(count_of(p, rank) * 4);
        }
        XT_CHECK_LOOM(loomGroupStart());
        for (int p = 0; p < n; p++) {
            if (p == rank)
                continue;
            const size_t i = static_cast<size_t>(p);
            XT_CHECK_LOOM(loomSend(out[i].data(), count_of(rank, p), loomInt32, p, comm, nullptr));
            XT_CHECK_LOOM(loomRecv(in[i].data(), count_of(p, rank), loomInt32, p, comm, nullptr));
        }
        XT_CHECK_LOOM(loomGroupEnd());
        for (int p = 0; p < n; p++) {
            if (p == rank)
                continue;
            const size_t i = static_cast<size_t>(p);
            CheckBytes(in[i].data(), Message(p, rank, 7, count_of(p, rank) * 4), loomInt32,
                       "from rank " + std::to_string(p));
            XT_CHECK(in[i].GuardsIntact());
        }
    }));
}

TEST_P(P2P, SelfSendInGroup)
{
    XT_ASSERT_RUN(Run(2, [](int rank, int, loomComm_t comm) {
        for (bool recv_first : {false, true}) {
            for (size_t count : {size_t{0}, size_t{5}, kLarge}) {
                loomtest::SetContext(std::string(recv_first ? "recv first" : "send first") +
                                     " count " + std::to_string(count));
                const Bytes out = Message(rank, rank, count + recv_first, count * 2);
                loomtest::GuardedBuffer in(count * 2);
                XT_CHECK_LOOM(loomGroupStart());
                if (recv_first)
                    XT_CHECK_LOOM(loomRecv(in.data(), count, loomFloat16, rank, comm, nullptr));
                XT_CHECK_LOOM(loomSend(out.data(), count, loomFloat16, rank, comm, nullptr));
                if (!recv_first)
                    XT_CHECK_LOOM(loomRecv(in.data(), count, loomFloat16, rank, comm, nullptr));
                XT_CHECK_LOOM(loomGroupEnd());
                CheckBytes(in.data(), out, loomFloat16, "self-sent data");
                XT_CHECK(in.GuardsIntact());
            }
        }
    }));
}

TEST_P(P2P, MixedPostingOrderInGroup)
{
    XT_ASSERT_RUN(Run(4, [](int rank, int n, loomComm_t comm) {
        // Both directions around the ring; even ranks post receives first, odd ranks sends.
        const int right = (rank + 1) % n, left = (rank + n - 1) % n;
        const Bytes to_right = Message(rank, right, 11, kLarge * 4);
        const Bytes to_left = Message(rank, left, 12, kLarge * 4);
        loomtest::GuardedBuffer from_left(kLarge * 4), from_right(kLarge * 4);
        XT_CHECK_LOOM(loomGroupStart());
        if (rank % 2 == 0) {
            XT_CHECK_LOOM(loomRecv(from_left.data(), kLarge, loomUint32, left, comm, nullptr));
            XT_CHECK_LOOM(loomRecv(from_right.data(), kLarge, loomUint32, right, comm, nullptr));
            XT_CHECK_LOOM(loomSend(to_right.data(), kLarge, loomUint32, right, comm, nullptr));
            XT_CHECK_LOOM(loomSend(to_left.data(), kLarge, loomUint32, left, comm, nullptr));
        } else {
            XT_CHECK_LOOM(loomSend(to_left.data(), kLarge, loomUint32, left, comm, nullptr));
            XT_CHECK_LOOM(loomSend(to_right.data(), kLarge, loomUint32, right, comm, nullptr));
            XT_CHECK_LOOM(loomRecv(from_right.data(), kLarge, loomUint32, right, comm, nullptr));
            XT_CHECK_LOOM(loomRecv(from_left.data(), kLarge, loomUint32, left, comm, nullptr));
        }
        XT_CHECK_LOOM(loomGroupEnd());
        CheckBytes(from_left.data(), Message(left, rank, 11, kLarge * 4), loomUint32, "from left");
        CheckBytes(from_right.data(), Message(right, rank, 12, kLarge * 4), loomUint32,
                   "from right");
    }));
}

TEST_P(P2P, GroupMixesSendRecvWithCollectives)
{
    XT_ASSERT_RUN(Run(4, [](int rank, int n, loomComm_t comm) {
        const int right = (rank + 1) % n, left = (rank + n - 1) % n;
        const size_t count = 4097;
        const Bytes msg = Message(rank, right, 21, kLarge * 4);
        loomtest::GuardedBuffer got(kLarge * 4);
        std::vector<unsigned char> ar_in(count * 4), ar_want(count * 4);
        loomtest::FillReduceInput(ar_in.data(), loomFloat32, loomSum, rank, 22, 0, count);
        loomtest::FillReduceExpected(ar_want.data(), loomFloat32, loomSum, n, 22, 0, count);
        loomtest::GuardedBuffer ar_out(count * 4);
        const Bytes ag_in = Message(rank, -1, 23, count * 8);
        loomtest::GuardedBuffer ag_out(count * 8 * static_cast<size_t>(n));

        auto send = [&] {
            XT_CHECK_LOOM(loomSend(msg.data(), kLarge, loomFloat32, right, comm, nullptr));
        };
        auto recv = [&] {
            XT_CHECK_LOOM(loomRecv(got.data(), kLarge, loomFloat32, left, comm, nullptr));
        };
        auto allreduce = [&] {
            XT_CHECK_LOOM(loomAllReduce(ar_in.data(), ar_out.data(), count, loomFloat32, loomSum,
                                        comm, nullptr));
        };
        auto allgather = [&] {
            XT_CHECK_LOOM(
                loomAllGather(ag_in.data(), ag_out.data(), count, loomFloat64, comm, nullptr));
        };
        // Collectives stay in the same order on every rank; the point-to-point calls move.
        XT_CHECK_LOOM(loomGroupStart());
        switch (rank % 4) {
        case 0:
            send(), recv(), allreduce(), allgather();
            break;
        case 1:
            allreduce(), recv(), allgather(), send();
            break;
        case 2:
            allreduce(), allgather(), recv(), send();
            break;
        default:
            recv(), allreduce(), send(), allgather();
            break;
        }
        XT_CHECK_LOOM(loomGroupEnd());
        CheckBytes(got.data(), Message(left, rank, 21, kLarge * 4), loomFloat32, "ring data");
        CheckBytes(ar_out.data(), ar_want, loomFloat32, "all-reduce");
        Bytes ag_want;
        for (int r = 0; r < n; r++) {
            const Bytes part = Message(r, -1, 23, count * 8);
            ag_want.insert(ag_want.end(), part.begin(), part.end());
        }
        CheckBytes(ag_out.data(), ag_want, loomFloat64, "all-gather");
        XT_CHECK(got.GuardsIntact() && ar_out.GuardsIntact() && ag_out.GuardsIntact());
    }));
}

// One AllToAllv: counts(a, b) elements from rank a to rank b, displacements with gaps.
void AllToAllvCase(int rank, int n, loomComm_t comm, loomDataType_t dt, uint64_t seed,
                   size_t (*counts)(int a, int b))
{
    const size_t es = loomtest::TypeSize(dt), un = static_cast<size_t>(n);
    std::vector<size_t> scount(un), sdispl(un), rcount(un), rdispl(un);
    size_t stotal = 0, rtotal = 0;
    for (int p = 0; p < n; p++) {
        const size_t i = static_cast<size_t>(p);
        // A gap of 3 + p elements before each block; the blocks in reverse peer order on the
        // send side, so displacements are not monotonic in the peer index.
        scount[un - 1 - i] = counts(rank, n - 1 - p);
        stotal += 3 + i;
        sdispl[un - 1 - i] = stotal;
        stotal += scount[un - 1 - i];
        rcount[i] = counts(p, rank);
        rtotal += 2 * i + 1;
        rdispl[i] = rtotal;
        rtotal += rcount[i];
    }
    Bytes send(stotal * es);
    for (int p = 0; p < n; p++) {
        const size_t i = static_cast<size_t>(p);
        const Bytes m = Message(rank, p, seed, scount[i] * es);
        if (!m.empty())
            memcpy(send.data() + sdispl[i] * es, m.data(), m.size());
    }
    const Bytes send_copy = send;
    loomtest::GuardedBuffer recv(rtotal * es, 0xee);
    XT_CHECK_LOOM(loomAllToAllv(stotal ? send.data() : nullptr, scount.data(), sdispl.data(),
                                rtotal ? recv.data() : nullptr, rcount.data(), rdispl.data(), dt,
                                comm, nullptr));
    XT_CHECK(send == send_copy);
    size_t pos = 0;
    for (int p = 0; p < n; p++) {
        const size_t i = static_cast<size_t>(p);
        for (; pos < rdispl[i]; pos++) // the gap must be untouched
            for (size_t b = 0; b < es; b++)
                XT_CHECK_EQ(recv.bytes()[pos * es + b], 0xee);
        CheckBytes(recv.bytes() + rdispl[i] * es, Message(p, rank, seed, rcount[i] * es), dt,
                   "block from rank " + std::to_string(p));
        pos += rcount[i];
    }
    XT_CHECK(recv.GuardsIntact());
}

TEST_P(P2P, AllToAllvZeroAndUnevenCounts)
{
    XT_ASSERT_RUN(Run(4, [](int rank, int n, loomComm_t comm) {
        loomtest::SetContext("uneven counts, int64");
        AllToAllvCase(rank, n, comm, loomInt64, 31, [](int a, int b) -> size_t {
            return (a + b) % 3 == 0 ? 0 : size_t(1 + 37 * a + 1001 * b);
        });
        loomtest::SetContext("uneven counts, bfloat16");
        AllToAllvCase(rank, n, comm, loomBfloat16, 32,
                      [](int a, int b) -> size_t { return a == b ? 0 : size_t(a * 70000 + b); });
        loomtest::SetContext("only rank 0 receives");
        AllToAllvCase(rank, n, comm, loomUint8, 33,
                      [](int, int b) -> size_t { return b == 0 ? 5 : 0; });
        loomtest::SetContext("all counts zero");
        AllToAllvCase(rank, n, comm, loomFloat32, 34, [](int, int) -> size_t { return 0; });
    }));
}

TEST_P(P2P, NestedGroups)
{
    XT_ASSERT_RUN(Run(4, [](int rank, int n, loomComm_t comm) {
        const int right = (rank + 1) % n, left = (rank + n - 1) % n;
        const Bytes out = Message(rank, right, 41, kLarge * 4);
        loomtest::GuardedBuffer in(kLarge * 4);
        std::vector<unsigned char> ar_in(8 * 4), ar_want(8 * 4), ar_out(8 * 4);
        loomtest::FillReduceInput(ar_in.data(), loomInt32, loomMax, rank, 42, 0, 8);
        loomtest::FillReduceExpected(ar_want.data(), loomInt32, loomMax, n, 42, 0, 8);
        // If an inner GroupEnd ran the large Send, every rank would block in it before posting
        // its Recv: only the outermost GroupEnd may start the operations.
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_LOOM(loomSend(out.data(), kLarge, loomFloat32, right, comm, nullptr));
        XT_CHECK_LOOM(loomGroupEnd());
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_LOOM(
            loomAllReduce(ar_in.data(), ar_out.data(), 8, loomInt32, loomMax, comm, nullptr));
        XT_CHECK_LOOM(loomGroupEnd());
        XT_CHECK_LOOM(loomRecv(in.data(), kLarge, loomFloat32, left, comm, nullptr));
        XT_CHECK_LOOM(loomGroupEnd());
        XT_CHECK_LOOM(loomGroupEnd());
        CheckBytes(in.data(), Message(left, rank, 41, kLarge * 4), loomFloat32, "ring data");
        CheckBytes(ar_out.data(), ar_want, loomInt32, "all-reduce");
        // The group state is back at depth 0: one more GroupEnd is a usage error.
        XT_CHECK_LOOM_RES(loomGroupEnd(), loomInvalidUsage);
    }));
}

INSTANTIATE_TEST_SUITE_P(Net, P2P, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<const char *> &info) {
                             return std::string(info.param);
                         });

} // namespace
