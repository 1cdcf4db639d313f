// SPDX-License-Identifier: Apache-2.0
//
// test_ucx.cc - the ucx transport through the public API, with forked ranks (tests/harness):
// every collective over LOOM_NET=ucx at 2 and 3 ranks, once with UCX over TCP (UCX_TLS=tcp)
// and once over UCX's shared memory (UCX_TLS=sm,self), on sizes 0, 1, 7, 4097 and 2^16+3
// elements of several datatypes, each result checked bit for bit (tests/harness/verify.h);
// that every peer really went through ucx (the "rank r -> rank q via X" INFO lines); that a
// SIGKILLed rank makes the survivors return loomRemoteError; that with LOOM_NET unset ucx carries
// the links between modelled hosts exactly where both hosts have an RDMA port the model prefers
// (described by LOOM_TOPO_FILE) and UCX starts; that a missing UCX library is a clear error
// (LOOM_NET=ucx) or leaves tcp (loom's own choice); and that LOOM_NET=ucx in a build
// without UCX fails with a clear message. The table-level cases (sizes, ordering, tag matching,
// a wrong secret refused) are test_transport.cc's, instantiated for ucx. Without UCX the ucx
// cases GTEST_SKIP. Run by meson's 'transport' suite as 'ucx'.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "loom.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

#ifdef LOOM_HAVE_UCX
constexpr bool kHaveUcx = true;
#else
constexpr bool kHaveUcx = false;
#endif

#define SKIP_WITHOUT_UCX()                                                                         \
    do {                                                                                           \
        if (!kHaveUcx)                                                                             \
            GTEST_SKIP() << "this build has no UCX (install libucx-dev, meson -Ducx=enabled)";     \
    } while (0)

using loomtest::GuardedBuffer;

enum class Coll { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kAllToAll };
constexpr Coll kColls[] = {Coll::kAllReduce, Coll::kAllGather, Coll::kReduceScatter,
                           Coll::kBroadcast, Coll::kReduce,    Coll::kAllToAll};
constexpr size_t kCounts[] = {0, 1, 7, 4097, (size_t{1} << 16) + 3};
constexpr loomDataType_t kTypes[] = {loomInt8,    loomInt64,   loomFloat16,
                                     loomFloat32, loomFloat64, loomBfloat16};

const char *CollName(Coll c)
{
    static const char *const names[] = {"AllReduce", "AllGather", "ReduceScatter",
                                        "Broadcast", "Reduce",    "AllToAll"};
    return names[static_cast<int>(c)];
}

std::vector<unsigned char> Bytes(size_t n)
{
    return std::vector<unsigned char>(n);
}

// One collective case on one rank; "" or what was wrong.
std::string RunCase(Coll coll, loomDataType_t dt, loomRedOp_t op, size_t count, int root,
                    uint64_t seed, int rank, int n, loomComm_t comm)
{
    const size_t es = loomtest::TypeSize(dt), bytes = count * es;
    const size_t nsz = static_cast<size_t>(n), urank = static_cast<size_t>(rank);
    std::string diff;
    switch (coll) {
    case Coll::kAllReduce:
    case Coll::kReduce: {
        auto in = Bytes(bytes), want = Bytes(bytes);
        loomtest::FillReduceInput(in.data(), dt, op, rank, seed, 0, count);
        loomtest::FillReduceExpected(want.data(), dt, op, n, seed, 0, count);
        GuardedBuffer send(bytes), recv(bytes);
        if (bytes > 0)
            memcpy(send.data(), in.data(), bytes);
        if (coll == Coll::kAllReduce)
            XT_CHECK_LOOM(loomAllReduce(send.data(), recv.data(), count, dt, op, comm, nullptr));
        else
            XT_CHECK_LOOM(loomReduce(send.data(), recv.data(), count, dt, op, root, comm, nullptr));
        if (coll == Coll::kAllReduce || rank == root)
            diff = loomtest::CompareElements(recv.data(), want.data(), count, dt);
        if (!send.GuardsIntact() || !recv.GuardsIntact())
            diff += " write outside the buffers";
        break;
    }
    case Coll::kReduceScatter: {
        auto in = Bytes(nsz * bytes), want = Bytes(bytes);
        loomtest::FillReduceInput(in.data(), dt, op, rank, seed, 0, nsz * count);
        loomtest::FillReduceExpected(want.data(), dt, op, n, seed, urank * count, count);
        GuardedBuffer send(nsz * bytes), recv(bytes);
        if (bytes > 0)
            memcpy(send.data(), in.data(), nsz * bytes);
        XT_CHECK_LOOM(loomReduceScatter(send.data(), recv.data(), count, dt, op, comm, nullptr));
        diff = loomtest::CompareElements(recv.data(), want.data(), count, dt);
        break;
    }
    case Coll::kAllGather: {
        auto want = Bytes(nsz * bytes);
        for (int r = 0; r < n; r++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(r) * bytes, bytes, r, seed);
        GuardedBuffer send(bytes), recv(nsz * bytes);
        if (bytes > 0)
            memcpy(send.data(), want.data() + urank * bytes, bytes);
        XT_CHECK_LOOM(loomAllGather(send.data(), recv.data(), count, dt, comm, nullptr));
        diff = loomtest::CompareElements(recv.data(), want.data(), nsz * count, dt);
        break;
    }
    case Coll::kBroadcast: {
        auto want = Bytes(bytes);
        loomtest::FillPattern(want.data(), bytes, root, seed);
        GuardedBuffer buf(bytes);
        if (rank == root && bytes > 0)
            memcpy(buf.data(), want.data(), bytes);
        XT_CHECK_LOOM(loomBroadcast(buf.data(), buf.data(), count, dt, root, comm, nullptr));
        diff = loomtest::CompareElements(buf.data(), want.data(), count, dt);
        break;
    }
    case Coll::kAllToAll: {
        auto mine = Bytes(nsz * bytes), want = Bytes(nsz * bytes);
        loomtest::FillPattern(mine.data(), nsz * bytes, rank, seed);
        for (int j = 0; j < n; j++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(j) * bytes, bytes, j, seed,
                                  urank * bytes);
        GuardedBuffer send(nsz * bytes), recv(nsz * bytes);
        if (bytes > 0)
            memcpy(send.data(), mine.data(), nsz * bytes);
        XT_CHECK_LOOM(loomAllToAll(send.data(), recv.data(), count, dt, comm, nullptr));
        diff = loomtest::CompareElements(recv.data(), want.data(), nsz * count, dt);
        break;
    }
    }
    return diff;
}

// Every collective x datatype x count (reductions: sum, and max or avg by datatype); roots
// alternate between the first and the last rank.
void RunGrid(int rank, int n, loomComm_t comm)
{
    int failures = 0, cases = 0;
    for (Coll coll : kColls) {
        for (loomDataType_t dt : kTypes) {
            for (size_t count : kCounts) {
                const int k = cases++;
                const loomRedOp_t op = k % 3 == 0 ? loomSum : k % 3 == 1 ? loomMax : loomAvg;
                const int root = k % 2 ? n - 1 : 0;
                const uint64_t seed = loomtest::Mix64(static_cast<uint64_t>(k));
                const std::string name = std::string(CollName(coll)) + " " +
                                         loomtest::TypeName(dt) + " " + loomtest::OpName(op) +
                                         " count " + std::to_string(count);
                loomtest::SetContext(name);
                const std::string diff = RunCase(coll, dt, op, count, root, seed, rank, n, comm);
                if (!diff.empty() && failures++ < 20)
                    fprintf(stderr, "rank %d: FAIL %s: %s\n", rank, name.c_str(), diff.c_str());
            }
        }
    }
    fprintf(stderr, "rank %d: %d cases, %d failures\n", rank, cases, failures);
    XT_CHECK_EQ(failures, 0);
}

// The transport of every peer, from this rank's INFO lines "rank r -> rank q via X"; checks
// that each of the n - 1 peers q uses want(q).
void CheckVia(int rank, int n, const std::function<std::string(int peer)> &want)
{
    const std::string path = "/tmp/loom-test-ucx." + std::to_string(getpid()) + ".log";
    std::ifstream in(path);
    XT_CHECK_MSG(in.good(), "no LOOM_DEBUG_FILE log at " + path);
    std::string line;
    int seen = 0;
    const std::string me = "rank " + std::to_string(rank) + " -> rank ";
    while (std::getline(in, line)) {
        const size_t at = line.find(me), via = line.find(" via ");
        if (at == std::string::npos || via == std::string::npos)
            continue;
        const int peer = atoi(line.c_str() + at + me.size());
        XT_CHECK_MSG(line.substr(via + 5) == want(peer), line + " (want " + want(peer) + ")");
        seen++;
    }
    unlink(path.c_str());
    XT_CHECK_EQ(seen, n - 1);
}

void CheckAllViaUcx(int rank, int n)
{
    CheckVia(rank, n, [](int) { return std::string("ucx"); });
}

struct GridParam {
    int nranks;
    const char *tls; // UCX_TLS
    const char *label;
};

class UcxGrid : public ::testing::TestWithParam<GridParam> {};

TEST_P(UcxGrid, EveryCollectiveOverUcx)
{
    SKIP_WITHOUT_UCX();
    const GridParam p = GetParam();
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "ucx"},
                {"UCX_TLS", p.tls},
                {"LOOM_DEBUG", "INFO"},
                {"LOOM_DEBUG_SUBSYS", "TRANSPORT"},
                {"LOOM_DEBUG_FILE", "/tmp/loom-test-ucx.%p.log"}};
    opts.deadline_s = 60;
    XT_ASSERT_RUN(loomtest::RunRanks(
        p.nranks,
        [](int rank, int n, loomComm_t comm) {
            CheckAllViaUcx(rank, n);
            RunGrid(rank, n, comm);
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(Ucx, UcxGrid,
                         ::testing::Values(GridParam{2, "tcp", "tcp"}, GridParam{3, "tcp", "tcp"},
                                           GridParam{2, "sm,self", "sm"},
                                           GridParam{3, "sm,self", "sm"}),
                         [](const ::testing::TestParamInfo<GridParam> &info) {
                             return std::to_string(info.param.nranks) + "ranks_" + info.param.label;
                         });

// loom's own choice between hosts (LOOM_NET unset), on 2 hosts x 2 ranks modelled with
// LOOM_HOST_ID. LOOM_TOPO_FILE gives each host an RDMA port (the rate in Gbit/s; 0: none), since
// this machine has none; UCX then runs over TCP (UCX_TLS=tcp). ucx must carry the links between
// hosts exactly where both hosts have a port the model prefers to TCP, and shm the links inside.
struct AutoParam {
    const char *label;
    int rdma_a, rdma_b; // Gbit/s of each host's port
    const char *net;    // LOOM_NET, or nullptr for unset
    bool want_ucx;
    const char *break_b = nullptr; // a variable that keeps UCX from starting on host 1
};

class UcxAuto : public ::testing::TestWithParam<AutoParam> {};

TEST_P(UcxAuto, BetweenHostsWhereTheModelPrefersIt)
{
    SKIP_WITHOUT_UCX();
    const AutoParam p = GetParam();
    const std::string topo = "/tmp/loom-test-ucx-topo." + std::to_string(getpid()) + ".json";
    {
        std::ofstream f(topo);
        f << "{\"loom_topology\": 1, \"hosts\": [";
        for (int h = 0; h < 2; h++) {
            const int gbps = h == 0 ? p.rdma_a : p.rdma_b;
            f << (h ? "," : "") << "{\"hostname\": \"host" << h
              << "\", \"packages\": 1, \"cores\": 2, \"cpus\": 2, \"rdma\": [";
            if (gbps > 0)
                f << "{\"name\": \"mlx5_0\", \"port\": 1, \"link_layer\": \"InfiniBand\", "
                     "\"active\": true, \"rate_gbps\": "
                  << gbps << ", \"numa\": -1}";
            f << "]}";
        }
        f << "]}\n";
    }
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_TOPO_FILE", topo},
                {"UCX_TLS", "tcp"},
                {"LOOM_DEBUG", "INFO"},
                {"LOOM_DEBUG_SUBSYS", "TRANSPORT"},
                {"LOOM_DEBUG_FILE", "/tmp/loom-test-ucx.%p.log"}};
    if (p.net != nullptr)
        opts.env.push_back({"LOOM_NET", p.net});
    else
        opts.unset_env = {"LOOM_NET"};
    const std::string break_b = p.break_b ? p.break_b : "";
    opts.rank_env = [break_b](int rank) {
        loomtest::EnvList env{{"LOOM_HOST_ID", "host" + std::to_string(rank / 2)}};
        const size_t eq = break_b.find('=');
        if (eq != std::string::npos && rank / 2 == 1)
            env.push_back({break_b.substr(0, eq), break_b.substr(eq + 1)});
        return env;
    };
    opts.deadline_s = 60;
    const bool want_ucx = p.want_ucx;
    const ::testing::AssertionResult run = loomtest::RunRanks(
        4,
        [want_ucx](int rank, int n, loomComm_t comm) {
            CheckVia(rank, n, [rank, want_ucx](int peer) {
                return std::string(peer / 2 == rank / 2 ? "shm" : want_ucx ? "ucx" : "tcp");
            });
            RunGrid(rank, n, comm);
        },
        opts);
    unlink(topo.c_str());
    XT_ASSERT_RUN(run);
}

INSTANTIATE_TEST_SUITE_P(
    Ucx, UcxAuto,
    ::testing::Values(AutoParam{"both_100g", 100, 100, nullptr, true},
                      AutoParam{"one_host_without_rdma", 100, 0, nullptr, false},
                      AutoParam{"slow_port", 1, 1, nullptr, false},
                      AutoParam{"net_names_tcp", 100, 100, "shm,tcp", false},
                      AutoParam{"ucx_fails_on_one_host", 100, 100, nullptr, false,
                                "UCX_TLS=no-such-transport"},
                      AutoParam{"no_ucx_library_on_one_host", 100, 100, nullptr, false,
                                "LOOM_UCX_LIB=libloom-no-such-ucx.so.0"}),
    [](const ::testing::TestParamInfo<AutoParam> &info) { return info.param.label; });

// Rank 2 dies by SIGKILL after one all-reduce; ranks 0 and 1 then wait on it (in that one or
// the next) and must fail with loomRemoteError well within the 20 s timeout (so only the detection
// of the death can pass), naming rank 2. The harness then destroys the broken communicators.
TEST(Ucx, KilledPeerIsRemoteError)
{
    SKIP_WITHOUT_UCX();
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "ucx"}, {"UCX_TLS", "tcp"}, {"LOOM_TIMEOUT_MS", "20000"}};
    opts.expected_exit = {0, 0, 128 + SIGKILL};
    opts.deadline_s = 15;
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int, loomComm_t comm) {
            // The first all-reduce wires every endpoint up (UCX 1.13 can abort a process whose
            // peer fails while an endpoint is still being wired up: docs/transports.md).
            // Rank 2 may leave it before the others finish, so they may already fail in it.
            std::vector<float> buf(1 << 16, 1.0f);
            loomResult_t first = loomAllReduce(buf.data(), buf.data(), buf.size(), loomFloat32,
                                               loomSum, comm, nullptr);
            if (rank == 2)
                raise(SIGKILL);
            XT_CHECK_MSG(first == loomSuccess || first == loomRemoteError,
                         "the first all-reduce returned " + loomtest::Show(first));
            if (first == loomRemoteError) {
                const std::string err = loomGetLastError(comm);
                XT_CHECK_MSG(err.find("rank 2") != std::string::npos, err);
                return;
            }
            const auto start = std::chrono::steady_clock::now();
            const loomResult_t res = loomAllReduce(buf.data(), buf.data(), buf.size(), loomFloat32,
                                                   loomSum, comm, nullptr);
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            XT_CHECK_EQ(res, loomRemoteError);
            XT_CHECK_MSG(s < 10.0, "detection took " + std::to_string(s) + " s (timeout 20 s)");
            const std::string err = loomGetLastError(comm);
            XT_CHECK_MSG(err.find("rank 2") != std::string::npos, err);
        },
        opts));
}

// A Reduce's non-root ranks are done once their data is sent: they leave (destroy and exit)
// while the root still takes their last pieces, which wait in UCX's queue of unexpected messages
// when the root posts their receives after the peers' endpoints closed. The root must still get
// every piece (before, it reported a closed peer as lost in about one run in three).
TEST(Ucx, ReduceRootGetsTheDataOfRanksThatLeft)
{
    SKIP_WITHOUT_UCX();
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "ucx"},
                {"UCX_TLS", "tcp"},
                {"LOOM_ALGO", "reduce:direct"},
                {"LOOM_CHUNK_BYTES", "4096"}, // dozens of pieces: most arrive before their receive
                {"LOOM_TIMEOUT_MS", "20000"}};
    opts.deadline_s = 60;
    for (int run = 0; run < 10; run++)
        XT_ASSERT_RUN(loomtest::RunRanks(
            3,
            [](int rank, int n, loomComm_t comm) {
                const size_t count = 70001;
                std::vector<float> in(count, static_cast<float>(rank + 1)), out(count, -1.0f);
                XT_CHECK_LOOM(loomReduce(in.data(), out.data(), count, loomFloat32, loomSum, 0,
                                         comm, nullptr));
                if (rank == 0)
                    for (size_t i = 0; i < count; i++)
                        XT_CHECK_EQ(out[i], static_cast<float>(n * (n + 1) / 2));
            },
            opts));
}

// LOOM_NET=ucx without UCX: communicator creation fails and says why.
TEST(Ucx, NetUcxWithoutUcxIsAClearError)
{
    if (kHaveUcx)
        GTEST_SKIP() << "this build has UCX";
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "ucx"}};
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t) {
            loomUniqueId id;
            loomtest::ShareUniqueId(&id);
            loomComm_t comm = nullptr;
            XT_CHECK_LOOM_RES(loomCommInitRank(&comm, 1, id, 0), loomInvalidArgument);
            const std::string err = loomGetLastError(nullptr);
            XT_CHECK_MSG(err.find("no UCX support") != std::string::npos, err);
        },
        opts));
}

// UCX is loaded at run time: a build with UCX on a machine without the library (here: a name
// that resolves to nothing) fails creation with LOOM_NET=ucx and says what is missing (a
// non-root rank may instead learn first that the failed root left).
TEST(Ucx, MissingLibraryIsAClearError)
{
    SKIP_WITHOUT_UCX();
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "ucx"}, {"LOOM_UCX_LIB", "libloom-no-such-ucx.so.0"}};
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t) {
            loomUniqueId id;
            loomtest::ShareUniqueId(&id);
            loomComm_t comm = nullptr;
            const loomResult_t res = loomCommInitRank(&comm, n, id, rank);
            const std::string err = loomGetLastError(nullptr);
            // Rank 0 is the bootstrap root: when it fails first and leaves, rank 1 may learn
            // that it lost the root before it reaches the library itself.
            if (rank != 0 && res == loomRemoteError) {
                XT_CHECK_MSG(err.find("lost the bootstrap root") != std::string::npos, err);
                return;
            }
            XT_CHECK_EQ(res, loomSystemError);
            XT_CHECK_MSG(err.find("cannot load libloom-no-such-ucx.so.0") != std::string::npos,
                         err);
        },
        opts));
}

} // namespace
