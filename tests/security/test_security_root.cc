// SPDX-License-Identifier: Apache-2.0
//
// test_security_root.cc - the bootstrap root under hostile and broken input. Part 1 sends the
// issue's six kinds of stray traffic at the root of a real loomCommInitRank (3 ranks and an
// attacker process): creation completes, correctly, and the root logs the strays with at most
// two WARN lines. Part 2 plays an insider that knows the job secret against a root started
// with loom_bootstrap_root_start while real ranks (threads) join: bad hellos are refused with a
// reason and the real ranks complete; bad requests from a member fail every rank cleanly.
// Part 3 covers the rank side: reconnecting when the root sheds a connection, failing at once
// on a wrong secret, and the listener's address. Memory safety is ASan's part.
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <dirent.h>
#include <string>
#include <thread>
#include <vector>

#include "mp_fixture.h"
#include "security_util.h"

extern "C" {
#include "debug.h"
#include "param.h"
}

using loomtest::RunOptions;
using loomtest::RunRanks;
using namespace sectest;

namespace {

constexpr int kReal = 3; // real ranks of the creation tests

bool Contains(const std::string &s, const char *what)
{
    return s.find(what) != std::string::npos;
}

// ---- part 1: stray traffic during loomCommInitRank ---------------------------------------------

class HostileAtCreation : public ::testing::TestWithParam<Hostile> {};

TEST_P(HostileAtCreation, CreationCompletesAndStraysAreLoggedOnce)
{
    const Hostile kind = GetParam();
    int go[kReal][2], done[2];
    for (auto &p : go)
        ASSERT_EQ(pipe(p), 0);
    ASSERT_EQ(pipe(done), 0);
    RunOptions opts;
    opts.create_comm = false;
    opts.unset_env = {"LOOM_DEBUG", "LOOM_DEBUG_FILE"};
    opts.deadline_s = 25; // the old root, one connection at a time, needed 32 s for kSilent
    XT_ASSERT_RUN(RunRanks(
        kReal + 1,
        [&](int rank, int, loomComm_t) {
            loomUniqueId uid;
            loomtest::ShareUniqueId(&uid); // rank 0 now serves the rendezvous
            if (rank == kReal) {
                // The attacker: hostile traffic first, then the real ranks may start.
                loom_id_t id;
                XT_CHECK_LOOM(loom_id_decode(&uid, &id));
                std::vector<int> held = Attack(kind, id.root, LOOM_BS_ROLE);
                for (auto &p : go)
                    XT_CHECK(write(p[1], "g", 1) == 1);
                struct pollfd p = {done[0], POLLIN, 0};
                XT_CHECK_MSG(poll(&p, 1, 20000) == 1, "rank 0 never reported its communicator");
                CloseFds(held);
                return;
            }
            char g = 0;
            XT_CHECK(read(go[rank][0], &g, 1) == 1);
            loomComm_t comm = nullptr;
            XT_CHECK_LOOM(loomCommInitRank(&comm, kReal, uid, rank));
            float x = static_cast<float>(rank + 1), y = 0;
            XT_CHECK_LOOM(loomAllReduce(&x, &y, 1, loomFloat32, loomSum, comm, nullptr));
            XT_CHECK_EQ(y, 6.0f);
            if (rank == 0) {
                // The root lives here; it logged the strays before it answered the ranks.
                const std::string log = ReadFile(RankLog(0));
                XT_CHECK_MSG(Contains(log, "bootstrap root: dropped a connection"), log);
                XT_CHECK_MSG(CountWarnLines(RankLog(0)) <= 2, log);
                XT_CHECK(write(done[1], "d", 1) == 1);
            } else {
                XT_CHECK_MSG(CountWarnLines(RankLog(rank)) == 0, ReadFile(RankLog(rank)));
            }
            XT_CHECK_LOOM(loomCommDestroy(comm));
        },
        opts));
    for (auto &p : go) {
        close(p[0]);
        close(p[1]);
    }
    close(done[0]);
    close(done[1]);
}

INSTANTIATE_TEST_SUITE_P(All, HostileAtCreation,
                         ::testing::Values(Hostile::kCloseAtOnce, Hostile::kPartialHandshake,
                                           Hostile::kWrongSecret, Hostile::kSilent,
                                           Hostile::kThousand, Hostile::kHttpGet),
                         [](const ::testing::TestParamInfo<Hostile> &info) {
                             return HostileName(info.param);
                         });

// ---- part 2: an insider that knows the job secret -------------------------------------------

// Runs body in one process that holds a root (10 s timeout) and waits for nothing else.
void InProcess(const std::function<void()> &body)
{
    RunOptions opts;
    opts.create_comm = false;
    opts.unset_env = {"LOOM_DEBUG_FILE"};
    opts.deadline_s = 20;
    XT_ASSERT_RUN(RunRanks(
        1, [&](int, int, loomComm_t) { body(); }, opts));
}

struct BadHello {
    const char *name;
    int32_t rank;
    int32_t nranks;
    uint32_t magic;
    size_t bytes;       // of the 16-byte hello actually sent before closing
    const char *reason; // in the root's reply; nullptr: the root just closes
};

class InsiderHello : public ::testing::TestWithParam<BadHello> {};

// Rank 0 (a raw client) joins first, then the insider sends its hello, then ranks 1 and 2 join:
// the insider is refused with a reason and the three ranks complete an all-gather.
TEST_P(InsiderHello, IsRefusedAndRealRanksComplete)
{
    const BadHello c = GetParam();
    InProcess([c] {
        loom_id_t id = StartRoot(10000);
        RawClient r0;
        XT_CHECK_LOOM(r0.Open(id, id.secret));
        XT_CHECK(r0.SendHello(0, kReal));

        RawClient bad;
        XT_CHECK_LOOM(bad.Open(id, id.secret));
        loom_bs_hello_t h = {c.magic, c.rank, c.nranks, 4242};
        uint8_t hb[LOOM_BS_HELLO_BYTES];
        loom_bs_hello_encode(&h, hb);
        XT_CHECK(bad.Send(hb, c.bytes));
        if (c.reason != nullptr) {
            std::string text;
            XT_CHECK_EQ(bad.ReadReply(0, &text), loomInvalidUsage);
            XT_CHECK_MSG(Contains(text, c.reason), text);
        } else {
            bad.Close(); // a truncated hello from a peer that goes away
        }
        if (bad.fd >= 0)
            XT_CHECK_MSG(bad.SeesClose(), "the root kept a refused connection");
        bad.Close();

        RankOutcome o1, o2;
        std::thread t1 = RunRealRank(id, 1, kReal, 10000, &o1);
        std::thread t2 = RunRealRank(id, 2, kReal, 10000, &o2);
        std::string data;
        XT_CHECK_LOOM(r0.ReadReply(0, &data));
        int32_t mine = 1;
        XT_CHECK(r0.SendReq(LOOM_BS_REQ_ALLGATHER, sizeof(mine), &mine, sizeof(mine)));
        XT_CHECK_LOOM(r0.ReadReply(kReal * sizeof(int32_t), &data));
        int32_t got[kReal];
        memcpy(got, data.data(), sizeof(got));
        XT_CHECK(got[0] == 1 && got[1] == 11 && got[2] == 21);
        XT_CHECK(r0.SendReq(LOOM_BS_REQ_BYE, 0, nullptr, 0));
        t1.join();
        t2.join();
        XT_CHECK_MSG(GatherIsCorrect(o1, kReal), o1.error);
        XT_CHECK_MSG(GatherIsCorrect(o2, kReal), o2.error);
        r0.Close();
    });
}

INSTANTIATE_TEST_SUITE_P(
    All, InsiderHello,
    ::testing::Values(BadHello{"BadMagic", 1, kReal, 0xdeadbeefu, LOOM_BS_HELLO_BYTES,
                               "bad hello magic"},
                      BadHello{"NegativeRank", -1, kReal, LOOM_BS_HELLO_MAGIC, LOOM_BS_HELLO_BYTES,
                               "rank -1 out of range"},
                      BadHello{"RankEqualsNranks", kReal, kReal, LOOM_BS_HELLO_MAGIC,
                               LOOM_BS_HELLO_BYTES, "out of range"},
                      BadHello{"HugeRank", INT32_MAX, kReal, LOOM_BS_HELLO_MAGIC,
                               LOOM_BS_HELLO_BYTES, "out of range"},
                      BadHello{"ZeroNranks", 0, 0, LOOM_BS_HELLO_MAGIC, LOOM_BS_HELLO_BYTES,
                               "nranks 0 out of range"},
                      BadHello{"NegativeNranks", 0, INT32_MIN, LOOM_BS_HELLO_MAGIC,
                               LOOM_BS_HELLO_BYTES, "out of range"},
                      BadHello{"TooManyRanks", 0, LOOM_BOOTSTRAP_MAX_RANKS + 1, LOOM_BS_HELLO_MAGIC,
                               LOOM_BS_HELLO_BYTES, "out of range"},
                      BadHello{"NranksMismatch", 1, kReal + 2, LOOM_BS_HELLO_MAGIC,
                               LOOM_BS_HELLO_BYTES, "others said 3"},
                      BadHello{"DuplicateOfArrivedRank", 0, kReal, LOOM_BS_HELLO_MAGIC,
                               LOOM_BS_HELLO_BYTES, "rank 0 joined twice"},
                      BadHello{"TruncatedThenClosed", 1, kReal, LOOM_BS_HELLO_MAGIC, 7, nullptr}),
    [](const ::testing::TestParamInfo<BadHello> &info) { return std::string(info.param.name); });

struct BadReq {
    const char *name;
    uint32_t type;
    uint32_t len;
    size_t bytes;       // of the 8-byte request actually sent before closing
    loomResult_t every; // what every real rank's all-gather returns
    const char *reason; // in the real ranks' error text
};

class InsiderRequest : public ::testing::TestWithParam<BadReq> {};

// The insider is rank 1 of a complete rendezvous and breaks the all-gather: every rank gets a
// clean error that names it; nothing is read past a bound.
TEST_P(InsiderRequest, FailsEveryRankCleanly)
{
    const BadReq c = GetParam();
    InProcess([c] {
        loom_id_t id = StartRoot(10000);
        RawClient r1;
        XT_CHECK_LOOM(r1.Open(id, id.secret));
        XT_CHECK(r1.SendHello(1, kReal));
        RankOutcome o0, o2;
        std::thread t0 = RunRealRank(id, 0, kReal, 10000, &o0);
        std::thread t2 = RunRealRank(id, 2, kReal, 10000, &o2);
        std::string text;
        XT_CHECK_LOOM(r1.ReadReply(0, &text));
        loom_bs_req_t q = {c.type, c.len};
        uint8_t qb[LOOM_BS_REQ_BYTES];
        loom_bs_req_encode(&q, qb);
        XT_CHECK(r1.Send(qb, c.bytes));
        if (c.bytes < sizeof(qb))
            r1.Close();
        else
            XT_CHECK_EQ(r1.ReadReply(0, &text), c.every);
        t0.join();
        t2.join();
        for (const RankOutcome *o : {&o0, &o2}) {
            XT_CHECK_LOOM(o->join);
            XT_CHECK_EQ(o->gather, c.every);
            XT_CHECK_MSG(Contains(o->error, c.reason), o->error);
        }
        r1.Close();
    });
}

INSTANTIATE_TEST_SUITE_P(
    All, InsiderRequest,
    ::testing::Values(
        BadReq{"LengthOverflow", LOOM_BS_REQ_ALLGATHER, 0xffffffffu, LOOM_BS_REQ_BYTES,
               loomInvalidUsage, "exceeds the 1048576 byte limit"},
        BadReq{"OverPayloadLimit", LOOM_BS_REQ_ALLGATHER, LOOM_BOOTSTRAP_MAX_PAYLOAD + 1,
               LOOM_BS_REQ_BYTES, loomInvalidUsage, "exceeds"},
        BadReq{"UnknownType", 7, 4, LOOM_BS_REQ_BYTES, loomInvalidUsage, "unknown request type 7"},
        BadReq{"ByeWithPayload", LOOM_BS_REQ_BYE, 4, LOOM_BS_REQ_BYTES, loomInvalidUsage,
               "bye with 4 payload bytes"},
        BadReq{"LengthUnlikeOtherRanks", LOOM_BS_REQ_ALLGATHER, 8, LOOM_BS_REQ_BYTES,
               loomInvalidUsage, "the first rank sent 1 of 4 bytes"},
        BadReq{"TruncatedThenClosed", LOOM_BS_REQ_ALLGATHER, 4, 3, loomRemoteError,
               "rank 1 left the rendezvous"}),
    [](const ::testing::TestParamInfo<BadReq> &info) { return std::string(info.param.name); });

// A job-secret holder that takes a rank first is inside the trust boundary: it can make
// creation fail, but only with clean errors (the design decision of docs/security.md).
TEST(Insider, DuplicateRankFirstFailsCreationCleanly)
{
    InProcess([] {
        loom_id_t id = StartRoot(10000);
        RawClient imp;
        XT_CHECK_LOOM(imp.Open(id, id.secret));
        XT_CHECK(imp.SendHello(1, kReal));
        // The real rank 1 comes next (one that came after the rendezvous completed would find
        // the root gone and time out instead), then the others.
        RankOutcome o[kReal];
        std::thread t[kReal];
        t[1] = RunRealRank(id, 1, kReal, 10000, &o[1]);
        t[1].join();
        XT_CHECK_EQ(o[1].join, loomInvalidUsage);
        XT_CHECK_MSG(Contains(o[1].error, "rank 1 joined twice"), o[1].error);
        t[0] = RunRealRank(id, 0, kReal, 10000, &o[0]);
        t[2] = RunRealRank(id, 2, kReal, 10000, &o[2]);
        std::string text;
        XT_CHECK_LOOM(imp.ReadReply(0, &text)); // the impostor completed the rendezvous...
        imp.Close();                            // ...and walks away
        t[0].join();
        t[2].join();
        for (int r : {0, 2}) {
            XT_CHECK_LOOM(o[r].join);
            XT_CHECK_EQ(o[r].gather, loomRemoteError);
            XT_CHECK_MSG(Contains(o[r].error, "rank 1 left the rendezvous"), o[r].error);
        }
    });
}

// ---- part 3: the rank side, and where the root listens ----------------------------------------

// A root that is not started yet takes the first connection and closes it at once (before or
// after its challenge, as a shedding root does): the rank connects again and completes.
class ShedConnection : public ::testing::TestWithParam<bool> {};

TEST_P(ShedConnection, RankConnectsAgain)
{
    const bool after_challenge = GetParam();
    InProcess([after_challenge] {
        loom_id_t id;
        memset(&id, 0, sizeof(id));
        id.magic = LOOM_ID_MAGIC;
        id.version = LOOM_ID_VERSION;
        XT_CHECK_LOOM(loom_random_bytes(id.secret, sizeof(id.secret)));
        XT_CHECK_LOOM(loom_sockaddr_parse("127.0.0.1:0", &id.root));
        int lfd = -1;
        XT_CHECK_LOOM(loom_socket_listen(&id.root, &lfd));
        RankOutcome o;
        std::thread t = RunRealRank(id, 0, 1, 10000, &o);
        struct pollfd p = {lfd, POLLIN, 0};
        XT_CHECK(poll(&p, 1, 10000) == 1);
        int fd = -1;
        XT_CHECK_LOOM(loom_socket_accept(lfd, &fd));
        XT_CHECK(fd >= 0);
        if (after_challenge) {
            // A valid challenge (secret.c's wire format: "LMHS", version 1, role, 0, nonce)...
            uint8_t ch[32] = {'L', 'M', 'H', 'S', 1, 0, 0, 0};
            for (int k = 0; k < 4; k++)
                ch[8 + k] = static_cast<uint8_t>(LOOM_BS_ROLE >> (8 * k));
            XT_CHECK_LOOM(loom_random_bytes(ch + 16, 16));
            XT_CHECK_LOOM(loom_socket_send_all(fd, ch, sizeof(ch), loom_deadline_ms(10000)));
            // ...and once the rank's proof is there, unread, a close that resets the connection.
            struct pollfd q = {fd, POLLIN, 0};
            XT_CHECK(poll(&q, 1, 10000) == 1);
        }
        close(fd);
        XT_CHECK_LOOM(loom_bootstrap_root_start(lfd, id.secret, 10000));
        t.join();
        XT_CHECK_MSG(GatherIsCorrect(o, 1), o.error);
    });
}

INSTANTIATE_TEST_SUITE_P(All, ShedConnection, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool> &info) {
                             return std::string(info.param ? "AfterChallenge" : "BeforeChallenge");
                         });

// A rank holding another secret is told so and gives up at once instead of retrying for its
// whole timeout (30 s here, past the watchdog).
TEST(RankSide, WrongSecretFailsAtOnce)
{
    InProcess([] {
        loom_id_t id = StartRoot(10000);
        loom_id_t other = id;
        other.secret[5] ^= 0x40;
        RankOutcome bad, good;
        std::thread tb = RunRealRank(other, 0, 1, 30000, &bad);
        tb.join();
        XT_CHECK_EQ(bad.join, loomRemoteError);
        XT_CHECK_MSG(Contains(bad.error, "refused this end's proof"), bad.error);
        std::thread tg = RunRealRank(id, 0, 1, 10000, &good);
        tg.join();
        XT_CHECK_MSG(GatherIsCorrect(good, 1), good.error);
    });
}

// The root process runs out of descriptors while an attacker holds hundreds of connections:
// the root evicts unproven ones to make room, and the real ranks (another process) complete.
TEST(RootResources, OutOfDescriptorsStillServesRealRanks)
{
    int id_pipe[2], go[2], done[2];
    ASSERT_EQ(pipe(id_pipe), 0);
    ASSERT_EQ(pipe(go), 0);
    ASSERT_EQ(pipe(done), 0);
    RunOptions opts;
    opts.create_comm = false;
    opts.unset_env = {"LOOM_DEBUG_FILE"};
    opts.deadline_s = 20;
    XT_ASSERT_RUN(RunRanks(
        3,
        [&](int rank, int, loomComm_t) {
            loom_id_t id;
            if (rank == 0) {
                int open_fds = 0;
                DIR *d = opendir("/proc/self/fd");
                XT_CHECK(d != nullptr);
                while (readdir(d) != nullptr)
                    open_fds++;
                closedir(d);
                struct rlimit rl;
                XT_CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
                rl.rlim_cur = static_cast<rlim_t>(open_fds + 24);
                id = StartRoot(15000);
                XT_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
            }
            loomtest::ShareFromRank0(&id, sizeof(id));
            if (rank == 0) {
                struct pollfd p = {done[0], POLLIN, 0};
                XT_CHECK_MSG(poll(&p, 1, 18000) == 1, "the real ranks never finished");
                XT_CHECK_MSG(CountWarnLines(RankLog(0)) <= 3, ReadFile(RankLog(0)));
            } else if (rank == 1) {
                RaiseFdLimit(1024);
                std::vector<int> held = Attack(Hostile::kSilent, id.root, LOOM_BS_ROLE);
                for (int i = 0; i < 12; i++) {
                    std::vector<int> more = Attack(Hostile::kSilent, id.root, LOOM_BS_ROLE);
                    held.insert(held.end(), more.begin(), more.end());
                }
                XT_CHECK(write(go[1], "g", 1) == 1);
                struct pollfd p = {done[0], POLLIN, 0};
                XT_CHECK(poll(&p, 1, 18000) == 1);
                CloseFds(held);
            } else {
                char g = 0;
                XT_CHECK(read(go[0], &g, 1) == 1);
                RankOutcome o[2];
                std::thread t0 = RunRealRank(id, 0, 2, 15000, &o[0]);
                std::thread t1 = RunRealRank(id, 1, 2, 15000, &o[1]);
                t0.join();
                t1.join();
                XT_CHECK_MSG(GatherIsCorrect(o[0], 2), o[0].error);
                XT_CHECK_MSG(GatherIsCorrect(o[1], 2), o[1].error);
                XT_CHECK(write(done[1], "dd", 2) == 2);
            }
        },
        opts));
    for (int *p : {id_pipe, go, done}) {
        close(p[0]);
        close(p[1]);
    }
}

// The root listens on the chosen interface's address, never on the wildcard.
class RootListens : public ::testing::TestWithParam<const char *> {};

TEST_P(RootListens, OnTheChosenInterfaceOnly)
{
    const std::string ifname = GetParam();
    RunOptions opts;
    opts.create_comm = false;
    if (ifname.empty())
        opts.unset_env = {"LOOM_SOCKET_IFNAME"};
    else
        opts.env = {{"LOOM_SOCKET_IFNAME", ifname}};
    XT_ASSERT_RUN(RunRanks(
        1,
        [&](int, int, loomComm_t) {
            loomUniqueId uid;
            XT_CHECK_LOOM(loomGetUniqueId(&uid));
            loom_id_t id;
            XT_CHECK_LOOM(loom_id_decode(&uid, &id));
            char buf[96];
            loom_sockaddr_str(&id.root, buf, sizeof(buf));
            std::vector<std::string> addrs = ListeningAddrs(PortOf(id.root));
            XT_CHECK_MSG(addrs.size() == 1, std::string("listeners on the port of ") + buf);
            XT_CHECK_MSG(!IsWildcard(addrs[0]), std::string("the root listens on ") + addrs[0]);
            if (ifname == "=lo")
                XT_CHECK_MSG(addrs[0] == "0100007F", addrs[0]); // 127.0.0.1
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(All, RootListens, ::testing::Values("", "=lo"),
                         [](const ::testing::TestParamInfo<const char *> &info) {
                             return std::string(info.index == 0 ? "DefaultInterface" : "Loopback");
                         });

} // namespace
