// SPDX-License-Identifier: Apache-2.0
//
// test_security_tcp.cc - the tcp transport's listener under hostile and broken input, driven
// through its loom_tp_t table: rank 0 accepts on a data listener while the six kinds
// of stray traffic hit it, an insider that knows the job secret sends bad hellos (wrong magic,
// rank or size, a second connection for a connected rank), and rank 1 must still connect and
// deliver a message. Also checks that the listener binds the chosen interface, not the
// wildcard. Both ranks are threads of one forked process (tests/harness), each with its own
// transport context, as p2p.c would drive them.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>

#include "mp_fixture.h"
#include "security_util.h"

extern "C" {
#include "debug.h"
#include "param.h"
#include "transport.h"
}

using loomtest::RunDir;
using loomtest::RunOptions;
using loomtest::RunRanks;
using namespace sectest;

namespace {

// Wire constants of tcp.c's connection setup (the test speaks it by hand).
constexpr uint32_t kTcpRole = 0x20504354u;       // "TCP ": handshake role of data connections
constexpr uint32_t kTcpHelloMagic = 0x48544d4cu; // "LMTH"
constexpr size_t kHandleAddrOffset = 8;          // tcp handle: u32 magic, u32 pad, address
constexpr int kTimeoutMs = 10000;

// One rank's transport context with its listener.
struct End {
    int rank = -1;
    void *ctx = nullptr;
    void *listen = nullptr;
    uint8_t handle[LOOM_TP_HANDLE_MAX] = {};
    loom_peer_info_t peers[2] = {};
};

void Init(End &e, int rank, int nranks, const uint8_t *secret)
{
    e.rank = rank;
    for (int r = 0; r < nranks; r++)
        e.peers[r].rank = r;
    loom_tp_init_args_t args = {};
    args.rank = rank;
    args.nranks = nranks;
    args.peers = e.peers;
    args.secret = secret;
    args.timeout_ms = kTimeoutMs;
    XT_CHECK_LOOM(loom_tp_tcp.init(&args, &e.ctx));
    XT_CHECK_LOOM(loom_tp_tcp.listen(e.ctx, e.handle, &e.listen));
}

void Fini(End &e)
{
    XT_CHECK_LOOM(loom_tp_tcp.close_listen(e.listen));
    XT_CHECK_LOOM(loom_tp_tcp.finalize(e.ctx));
}

loom_sockaddr_t HandleAddr(const End &e)
{
    loom_sockaddr_t a;
    memcpy(&a, e.handle + kHandleAddrOffset, sizeof(a));
    XT_CHECK(a.sa.sa_family == AF_INET || a.sa.sa_family == AF_INET6);
    return a;
}

// Completes req, waiting on ctx between tests.
void Complete(void *ctx, void *req, size_t *nbytes)
{
    uint64_t deadline = loom_deadline_ms(kTimeoutMs);
    for (;;) {
        int done = 0;
        XT_CHECK_LOOM(loom_tp_tcp.test(req, &done, nbytes));
        if (done)
            return;
        XT_CHECK(loom_now_ns() < deadline);
        XT_CHECK_LOOM(loom_tp_tcp.wait(ctx, 1000));
    }
}

// A proven connection to the listener that then says the given 12-byte hello.
void InsiderHello(const loom_sockaddr_t &addr, const uint8_t *secret, uint32_t magic, int32_t rank,
                  int32_t nranks)
{
    int fd = Connect(addr, 5000);
    XT_CHECK(fd >= 0);
    XT_CHECK_LOOM(loom_handshake_connect(fd, secret, kTcpRole, loom_deadline_ms(5000)));
    uint32_t v[3] = {magic, static_cast<uint32_t>(rank), static_cast<uint32_t>(nranks)};
    uint8_t b[12];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            b[4 * i + k] = static_cast<uint8_t>(v[i] >> (8 * k));
    XT_CHECK_LOOM(loom_socket_send_all(fd, b, sizeof(b), loom_deadline_ms(5000)));
    RawClient c;
    c.fd = fd;
    XT_CHECK_MSG(c.SeesClose(), "the listener kept a connection with a bad hello");
    c.Close();
}

class TcpListenerHostile : public ::testing::TestWithParam<Hostile> {};

TEST_P(TcpListenerHostile, RealPeerConnectsAndStraysAreLoggedOnce)
{
    const Hostile kind = GetParam();
    RunOptions opts;
    opts.create_comm = false;
    opts.unset_env = {"LOOM_DEBUG", "LOOM_DEBUG_FILE"};
    opts.deadline_s = 25;
    XT_ASSERT_RUN(RunRanks(
        1,
        [kind](int, int, loomComm_t) {
            uint8_t secret[LOOM_SECRET_BYTES];
            XT_CHECK_LOOM(loom_random_bytes(secret, sizeof(secret)));
            End a, b;
            Init(a, 0, 2, secret);
            const loom_sockaddr_t addr = HandleAddr(a);

            // Rank 0 accepts, as p2p.c does, until told to stop; it must get rank 1 only.
            std::atomic<bool> stop{false};
            std::mutex mu;
            std::condition_variable cv;
            bool got = false;
            void *recv = nullptr;
            int from = -1, extra = 0;
            std::thread acceptor([&] {
                uint64_t deadline = loom_deadline_ms(20000);
                while (!stop.load()) {
                    void *rc = nullptr;
                    int peer = -1;
                    XT_CHECK_LOOM(loom_tp_tcp.accept(a.listen, &rc, &peer));
                    if (rc != nullptr && recv == nullptr) {
                        std::lock_guard<std::mutex> lock(mu);
                        recv = rc;
                        from = peer;
                        got = true;
                        cv.notify_all();
                    } else if (rc != nullptr) {
                        extra++;
                        XT_CHECK_LOOM(loom_tp_tcp.close_recv(rc));
                    }
                    XT_CHECK(loom_now_ns() < deadline);
                    XT_CHECK_LOOM(loom_tp_tcp.wait(a.ctx, 1000));
                }
            });

            RaiseFdLimit(4096);
            std::vector<int> held = Attack(kind, addr, kTcpRole);
            // Insiders: proven connections with hellos the listener must refuse.
            InsiderHello(addr, secret, 0xdeadbeefu, 1, 2);
            InsiderHello(addr, secret, kTcpHelloMagic, 2, 2);
            InsiderHello(addr, secret, kTcpHelloMagic, -7, 2);
            InsiderHello(addr, secret, kTcpHelloMagic, 1, 3);

            // The real peer.
            Init(b, 1, 2, secret);
            void *send = nullptr;
            uint64_t deadline = loom_deadline_ms(kTimeoutMs);
            while (send == nullptr) {
                XT_CHECK_LOOM(loom_tp_tcp.connect(b.ctx, a.handle, 0, &send));
                XT_CHECK(loom_now_ns() < deadline);
                if (send == nullptr)
                    XT_CHECK_LOOM(loom_tp_tcp.wait(b.ctx, 1000));
            }
            {
                std::unique_lock<std::mutex> lock(mu);
                XT_CHECK(cv.wait_for(lock, std::chrono::seconds(10), [&] { return got; }));
            }
            // A second connection claiming the connected rank is refused too.
            InsiderHello(addr, secret, kTcpHelloMagic, 1, 2);
            stop.store(true);
            acceptor.join();
            XT_CHECK_EQ(from, 1);
            XT_CHECK_EQ(extra, 0);

            const char msg[] = "still here";
            char in[32] = {};
            void *sreq = nullptr, *rreq = nullptr;
            size_t n = 0;
            XT_CHECK_LOOM(loom_tp_tcp.irecv(recv, in, sizeof(in), 9, &rreq));
            XT_CHECK_LOOM(loom_tp_tcp.isend(send, msg, sizeof(msg), 9, &sreq));
            Complete(b.ctx, sreq, &n);
            Complete(a.ctx, rreq, &n);
            XT_CHECK_EQ(n, sizeof(msg));
            XT_CHECK(strcmp(in, msg) == 0);

            XT_CHECK_LOOM(loom_tp_tcp.close_send(send));
            XT_CHECK_LOOM(loom_tp_tcp.close_recv(recv));
            Fini(b);
            Fini(a); // the listener's stray summary is logged here
            CloseFds(held);

            // The listener's strays: one WARN for the first, one for the summary. (The attacker
            // shares this log; its own lines do not start with the listener's name.)
            const std::string log = RunDir() + "/rank0.log";
            XT_CHECK_MSG(CountLines(log, "LOOM WARN tcp: rank 0: ") <= 2, ReadFile(log));
            XT_CHECK_MSG(CountLines(log, "LOOM WARN tcp: rank 0 refused a connection: hello") == 4,
                         ReadFile(log));
            XT_CHECK_MSG(ReadFile(log).find("refused a second connection from rank 1") !=
                             std::string::npos,
                         ReadFile(log));
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(All, TcpListenerHostile,
                         ::testing::Values(Hostile::kCloseAtOnce, Hostile::kPartialHandshake,
                                           Hostile::kWrongSecret, Hostile::kSilent,
                                           Hostile::kThousand, Hostile::kHttpGet),
                         [](const ::testing::TestParamInfo<Hostile> &info) {
                             return HostileName(info.param);
                         });

class TcpListens : public ::testing::TestWithParam<const char *> {};

TEST_P(TcpListens, OnTheChosenInterfaceOnly)
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
            uint8_t secret[LOOM_SECRET_BYTES] = {1};
            End e;
            Init(e, 0, 1, secret);
            std::vector<std::string> addrs = ListeningAddrs(PortOf(HandleAddr(e)));
            XT_CHECK_EQ(addrs.size(), 1u);
            XT_CHECK_MSG(!IsWildcard(addrs[0]), "the tcp listener listens on " + addrs[0]);
            if (ifname == "=lo")
                XT_CHECK_MSG(addrs[0] == "0100007F", addrs[0]);
            Fini(e);
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(All, TcpListens, ::testing::Values("", "=lo"),
                         [](const ::testing::TestParamInfo<const char *> &info) {
                             return std::string(info.index == 0 ? "DefaultInterface" : "Loopback");
                         });

} // namespace
