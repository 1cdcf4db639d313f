// SPDX-License-Identifier: Apache-2.0
//
// test_fault_mismatch.cc - ranks whose calls of one collective differ in one field (the
// collective itself, count, datatype, op or root) under every algorithm of that collective
// (forced with LOOM_ALGO; the list comes from `loom_info -a`, so that an algorithm added to the
// table is tested without a change here), over shm rings, the shm collectives' arena, tcp, ucx
// (when built) and across modelled hosts (LOOM_HOST_ID) where the hierarchical algorithms run. One
// rank passes the odd value. Every rank must return loomInvalidUsage naming the field ("differ in
// count"), well within the timeout; the only ranks that may complete the call are those that need
// nothing from a rank whose call differs (a Broadcast root, a Reduce rank other than the root, a
// Broadcast receiver whose root agrees with it, whose data is then checked), and they must fail
// their next call the same way. Run by meson's 'fault' suite, with LOOM_INFO pointing at loom_info.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fault_util.h"
#include "loom.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

#ifdef LOOM_HAVE_UCX
constexpr bool kHaveUcx = true;
#else
constexpr bool kHaveUcx = false;
#endif

constexpr size_t kCount = 12;
constexpr int kTimeoutMs = 8000;
constexpr uint64_t kSeed = 5;

enum class Coll {
    kAllReduce,
    kAllGather,
    kReduceScatter,
    kBroadcast,
    kReduce,
    kAllToAll,
    kAllToAllv,
    kBarrier
};
constexpr Coll kColls[] = {Coll::kAllReduce, Coll::kAllGather, Coll::kReduceScatter,
                           Coll::kBroadcast, Coll::kReduce,    Coll::kAllToAll,
                           Coll::kAllToAllv, Coll::kBarrier};

// loom_info's names.
const char *CollName(Coll c)
{
    static const char *const names[] = {"allreduce", "allgather", "reducescatter", "broadcast",
                                        "reduce",    "alltoall",  "alltoallv",     "barrier"};
    return names[static_cast<int>(c)];
}

enum class Field { kKind, kCount, kDatatype, kOp, kRoot };
constexpr Field kFields[] = {Field::kKind, Field::kCount, Field::kDatatype, Field::kOp,
                             Field::kRoot};

// The word the error message uses for the field ("they differ in count").
const char *FieldWord(Field f)
{
    static const char *const words[] = {"collective", "count", "datatype", "op", "root"};
    return words[static_cast<int>(f)];
}

// Whether every rank must pass the field alike for this collective.
bool Compared(Coll c, Field f)
{
    switch (f) {
    case Field::kKind:
        return true;
    case Field::kCount:
        return c != Coll::kAllToAllv && c != Coll::kBarrier;
    case Field::kDatatype:
        return c != Coll::kBarrier;
    case Field::kOp:
        return c == Coll::kAllReduce || c == Coll::kReduceScatter || c == Coll::kReduce;
    default:
        return c == Coll::kBroadcast || c == Coll::kReduce;
    }
}

struct Call {
    Coll coll;
    size_t count;
    loomDataType_t dt;
    loomRedOp_t op;
    int root;
};

Call Majority(Coll coll)
{
    return {coll, kCount, loomFloat32, loomSum, 0};
}

// The odd rank's call: the field changed, to a value of the same size where it has one (float32
// against int32 moves the same bytes, so only a check of the call can tell them apart).
Call Odd(Coll coll, Field f)
{
    Call c = Majority(coll);
    switch (f) {
    case Field::kKind:
        c.coll = coll == Coll::kBroadcast ? Coll::kAllReduce : Coll::kBroadcast;
        break;
    case Field::kCount:
        c.count = kCount + 1;
        break;
    case Field::kDatatype:
        c.dt = loomInt32;
        break;
    case Field::kOp:
        c.op = loomMax;
        break;
    case Field::kRoot:
        c.root = 1;
        break;
    }
    return c;
}

// Runs c with buffers large enough for any call of the test (4-byte elements).
loomResult_t RunCall(const Call &c, int n, loomComm_t comm, std::vector<uint8_t> &send,
                     std::vector<uint8_t> &recv)
{
    void *s = send.data(), *r = recv.data();
    switch (c.coll) {
    case Coll::kAllReduce:
        return loomAllReduce(s, r, c.count, c.dt, c.op, comm, nullptr);
    case Coll::kAllGather:
        return loomAllGather(s, r, c.count, c.dt, comm, nullptr);
    case Coll::kReduceScatter:
        return loomReduceScatter(s, r, c.count, c.dt, c.op, comm, nullptr);
    case Coll::kBroadcast:
        return loomBroadcast(s, r, c.count, c.dt, c.root, comm, nullptr);
    case Coll::kReduce:
        return loomReduce(s, r, c.count, c.dt, c.op, c.root, comm, nullptr);
    case Coll::kAllToAll:
        return loomAllToAll(s, r, c.count, c.dt, comm, nullptr);
    case Coll::kAllToAllv: {
        std::vector<size_t> counts(n, c.count), displs(n);
        for (int i = 0; i < n; i++)
            displs[i] = c.count * i;
        return loomAllToAllv(s, counts.data(), displs.data(), r, counts.data(), displs.data(), c.dt,
                             comm, nullptr);
    }
    default:
        return loomBarrier(comm, nullptr);
    }
}

// Whether `rank`, which called `own`, may complete the call: it needs nothing from a rank whose
// call differs from its own (odd is the rank with the odd call, majority the others').
bool MaySucceed(const Call &own, int rank, int odd)
{
    if (own.coll == Coll::kBroadcast)
        return own.root == rank || (rank != odd && own.root != odd);
    if (own.coll == Coll::kReduce)
        return own.root != rank;
    return false;
}

struct Case {
    Coll coll;
    std::string algo;
    Field field;
};

std::string CaseName(const Case &c)
{
    return std::string(CollName(c.coll)) + ":" + c.algo + " " + FieldWord(c.field);
}

// Whether every rank's call may complete (then no rank is bound to see the difference).
bool AllMaySucceed(const Case &c, int odd, int n)
{
    for (int r = 0; r < n; r++)
        if (!MaySucceed(r == odd ? Odd(c.coll, c.field) : Majority(c.coll), r, odd))
            return false;
    return true;
}

// One case on one rank: a communicator of its own, the mismatched call, a Barrier after it.
// Over the arena, calls whose every rank may complete leave no trace there for the next call;
// over ucx their untaken message may still be in flight when the next call looks (quiet_ok).
void RunCase(const Case &c, int odd, int rank, int n, bool quiet_ok)
{
    loomtest::SetContext(CaseName(c) + " (odd rank " + std::to_string(odd) + ")");
    const std::string want = std::string("differ in ") + FieldWord(c.field);
    loomUniqueId id;
    memset(&id, 0, sizeof(id));
    loomtest::ShareUniqueId(&id);
    loomComm_t comm = nullptr;
    const loomResult_t created = loomCommInitRankConfig(&comm, n, id, rank, nullptr);
    if (created != loomSuccess) {
        // Peers that finished creation first may already have broken on the mismatched call;
        // a rank still creating then reads their notice and fails with their cause. That
        // still names the field.
        const std::string why = loomGetLastError(nullptr);
        XT_CHECK_MSG(created == loomInvalidUsage && why.find(want) != std::string::npos,
                     std::string("creation returned ") + loomGetErrorString(created) + ": " + why);
        return;
    }
    const Call call = rank == odd ? Odd(c.coll, c.field) : Majority(c.coll);
    const size_t room = (kCount + 1) * static_cast<size_t>(n) * 4;
    std::vector<uint8_t> send(room), recv(room, 0xee);
    loomtest::FillPattern(send.data(), room, rank, kSeed);
    const double t0 = loomtest::NowSec();
    const loomResult_t res = RunCall(call, n, comm, send, recv);
    const double took_ms = (loomtest::NowSec() - t0) * 1e3;
    const std::string msg = loomGetLastError(comm);
    XT_CHECK_MSG(took_ms < kTimeoutMs, "the call took " + std::to_string(took_ms) + " ms");
    if (res == loomSuccess) {
        XT_CHECK_MSG(MaySucceed(call, rank, odd), "the mismatched call succeeded");
        if (call.coll == Coll::kBroadcast && call.root != rank) { // its root's data, exactly
            std::vector<uint8_t> want_data(call.count * 4);
            loomtest::FillPattern(want_data.data(), want_data.size(), call.root, kSeed);
            XT_CHECK_MSG(memcmp(want_data.data(), recv.data(), want_data.size()) == 0,
                         "a broadcast that succeeded delivered other data than its root's");
        }
    } else {
        XT_CHECK_MSG(res == loomInvalidUsage,
                     std::string("got ") + loomGetErrorString(res) + ": " + msg);
        XT_CHECK_MSG(msg.find(want) != std::string::npos, "no '" + want + "' in: " + msg);
    }
    // The communicator is broken for everyone; a rank that finished the call learns it now.
    const loomResult_t next = loomBarrier(comm, nullptr);
    const std::string next_msg = loomGetLastError(comm);
    if (next == loomSuccess && quiet_ok && AllMaySucceed(c, odd, n)) {
        loomCommDestroy(comm);
        return;
    }
    XT_CHECK_MSG(next == loomInvalidUsage, std::string("the next call returned ") +
                                               loomGetErrorString(next) + ": " + next_msg);
    if (res == loomSuccess)
        XT_CHECK_MSG(next_msg.find(want) != std::string::npos,
                     "no '" + want + "' in the next call's error: " + next_msg);
    loomCommDestroy(comm); // may report the broken connections
}

// ---- the grid ------------------------------------------------------------------------------

// `loom_info -a`: the algorithms of every collective, in table order.
std::map<std::string, std::vector<std::string>> ListAlgorithms()
{
    std::map<std::string, std::vector<std::string>> algos;
    const char *path = getenv("LOOM_INFO");
    if (path == nullptr)
        return algos;
    std::unique_ptr<FILE, int (*)(FILE *)> f(popen((std::string(path) + " -a").c_str(), "r"),
                                             pclose);
    if (!f)
        return algos;
    char line[512];
    while (fgets(line, sizeof(line), f.get()) != nullptr) {
        std::vector<std::string> words;
        for (char *save = nullptr, *w = strtok_r(line, " \t\n", &save); w != nullptr;
             w = strtok_r(nullptr, " \t\n", &save))
            words.emplace_back(std::string(w, strcspn(w, "*"))); // "*": an order of its own
        if (words.size() >= 2 && words[0][0] != '#')
            algos[words[0]].assign(words.begin() + 1, words.end());
    }
    return algos;
}

struct Net {
    const char *name;
    int nranks;
    loomtest::EnvList env;
    bool hosts; // ranks on two modelled hosts
    bool arena; // every rank on one host over shm, with the shm collectives' arena
};

// The algorithms tested over net: the shm collectives' (shm*) where the arena is, every other
// one elsewhere (without the arena a forced shm* algorithm falls back to the model's choice),
// the hierarchical ones only across hosts.
bool Runs(const Net &net, const std::string &algo)
{
    if ((algo.rfind("shm", 0) == 0) != net.arena)
        return false;
    return algo.rfind("hier", 0) != 0 || net.hosts;
}

// Rounds of cases: round k forces the k-th tested algorithm of every collective at once
// (LOOM_ALGO is read once per process), and runs all its fields.
std::vector<std::vector<Case>> Rounds(const Net &net)
{
    const auto listed = ListAlgorithms();
    std::vector<std::vector<Case>> rounds;
    for (Coll coll : kColls) {
        auto it = listed.find(CollName(coll));
        if (it == listed.end())
            continue;
        size_t k = 0;
        for (const std::string &algo : it->second) {
            if (!Runs(net, algo))
                continue;
            if (rounds.size() <= k)
                rounds.emplace_back();
            for (Field f : kFields)
                if (Compared(coll, f))
                    rounds[k].push_back({coll, algo, f});
            k++;
        }
    }
    return rounds;
}

std::string AlgoSpec(const std::vector<Case> &round)
{
    std::string spec;
    for (const Case &c : round)
        if (spec.find(std::string(CollName(c.coll)) + ":") == std::string::npos)
            spec += (spec.empty() ? "" : ",") + std::string(CollName(c.coll)) + ":" + c.algo;
    return spec;
}

class Mismatch : public ::testing::TestWithParam<Net> {};

TEST_P(Mismatch, EveryRankFailsNamingTheField)
{
    const Net net = GetParam();
    if (std::string(net.name) == "ucx" && !kHaveUcx)
        GTEST_SKIP() << "this build has no UCX (install libucx-dev, meson -Ducx=enabled)";
    ASSERT_NE(getenv("LOOM_INFO"), nullptr) << "LOOM_INFO is not set";
    const auto rounds = Rounds(net);
    ASSERT_FALSE(rounds.empty()) << "loom_info -a listed no algorithm";
    for (const auto &round : rounds) {
        loomtest::RunOptions opts;
        opts.env = net.env;
        opts.env.push_back({"LOOM_TIMEOUT_MS", std::to_string(kTimeoutMs)});
        opts.env.push_back({"LOOM_ALGO", AlgoSpec(round)});
        opts.env.push_back({"LOOM_DETERMINISTIC", "0"}); // the own-order algorithms run too
        opts.unset_env = {"LOOM_COST_SHM", "LOOM_COST_TCP", "LOOM_CALIBRATE"};
        if (net.hosts)
            opts.rank_env = [](int rank) {
                return loomtest::EnvList{{"LOOM_HOST_ID", "host" + std::to_string(rank / 2)}};
            };
        opts.create_comm = false;
        opts.deadline_s = 60;
        XT_ASSERT_RUN(loomtest::RunRanks(
            net.nranks,
            [&round, &net](int rank, int n, loomComm_t) {
                for (size_t i = 0; i < round.size(); i++)
                    RunCase(round[i], static_cast<int>(i % static_cast<size_t>(n)), rank, n,
                            net.arena || std::string(net.name) == "ucx");
            },
            opts));
    }
}

INSTANTIATE_TEST_SUITE_P(
    Nets, Mismatch,
    ::testing::Values(
        Net{"shm", 3, {{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "0"}}, false, false},
        Net{"shm_arena", 3, {{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "1"}}, false, true},
        Net{"tcp", 3, {{"LOOM_NET", "tcp"}}, false, false},
        Net{"ucx", 3, {{"LOOM_NET", "ucx"}, {"UCX_TLS", "tcp"}}, false, false},
        Net{"hosts", 4, {{"LOOM_NET", "shm,tcp"}}, true, false}),
    [](const ::testing::TestParamInfo<Net> &info) { return std::string(info.param.name); });

} // namespace
