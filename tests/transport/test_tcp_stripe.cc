// SPDX-License-Identifier: Apache-2.0
//
// test_tcp_stripe.cc - the tcp transport with several sockets per peer and direction
// (LOOM_TCP_NSOCKS) and payloads striped across them (LOOM_TCP_PIECE_BYTES). Through the
// loom_tp_t table, with forked ranks: message sizes around the piece boundaries both ways,
// many messages in flight with mixed tags between three ranks, a striped frame that parks,
// ends that stripe differently, and a peer killed in the middle of a striped message. On the
// wire, by hand: an extra socket with a wrong secret or a duplicate hello is refused while
// the connection still completes, and a striped message laid out by hand arrives intact (the
// layout is protocol). Through the public API: a rank killed in the middle of a striped send
// fails its peer with loomRemoteError naming it, within the bound of docs/reliability.md. Also
// the receive side's read-ahead: a frame it holds must wake a wait.
// Ranks come from tests/harness; the parent makes the socket pairs the ranks gather listen
// handles over before it forks. Run by meson's 'transport' suite.

#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../fault/tripwire.h"
#include "mp_fixture.h"
#include "tp_pattern.h"
#include "tp_rank.h"

extern "C" {
#include "debug.h"
#include "param.h"
#include "secret.h"
#include "socket.h"
#include "timer.h"
#include "transport.h"
#include "wire.h"
}

using loomtest::RunDir;
using loomtest::RunOptions;
using loomtest::RunRanks;

namespace {

using loomtest::kTpTimeoutMs;
constexpr int kMaxRanks = loomtest::kTpMaxRanks;
constexpr int kWaitMs = loomtest::kTpWaitMs; // a rank's bound on one exchange
constexpr size_t kPiece = 4096;              // small pieces: many of them in modest messages

// Wire constants of tcp_conn.c (the hand-written peer speaks them).
constexpr uint32_t kTcpRole = 0x20504354u;          // "TCP ": handshake role of data sockets
constexpr uint32_t kStripeHelloMagic = 0x53544d4cu; // "LMTS"
constexpr size_t kHandleAddrOffset = 8;             // tcp handle: u32 magic, u32 pad, address

// ---- ranks ----------------------------------------------------------------------------------

// Socket pairs between every two ranks, made in the parent before the fork.
struct Mesh {
    int fd[kMaxRanks][kMaxRanks][2];
    explicit Mesh(int n)
    {
        for (int a = 0; a < n; a++)
            for (int b = a + 1; b < n; b++)
                EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd[a][b]), 0);
        n_ = n;
    }
    ~Mesh()
    {
        for (int a = 0; a < n_; a++)
            for (int b = a + 1; b < n_; b++) {
                close(fd[a][b][0]);
                close(fd[a][b][1]);
            }
    }
    int To(int me, int other) const
    {
        return me < other ? fd[me][other][0] : fd[other][me][1];
    }
    int n_ = 0;
};

using Rank = loomtest::TpRank;
using Op = loomtest::TpOp;
using loomtest::TpBarrier;
using loomtest::TpCloseAll;
using loomtest::TpConnectAll;
using loomtest::TpRecv;
using loomtest::TpSend;
using loomtest::TpWaitAll;

// Sets this rank's striping (0: leave the default) and reads it afresh.
void SetStriping(int nsocks, size_t piece, size_t sockbuf = 0)
{
    if (nsocks > 0)
        XT_CHECK(setenv("LOOM_TCP_NSOCKS", std::to_string(nsocks).c_str(), 1) == 0);
    if (piece > 0)
        XT_CHECK(setenv("LOOM_TCP_PIECE_BYTES", std::to_string(piece).c_str(), 1) == 0);
    if (sockbuf > 0)
        XT_CHECK(setenv("LOOM_TCP_SOCKBUF", std::to_string(sockbuf).c_str(), 1) == 0);
    loom_param_reset_cache();
}

// This rank's tcp transport, listening, with every rank's handle (over the mesh).
void Init(Rank &r, int rank, int n, const Mesh &mesh, const uint8_t *secret)
{
    r.rank = rank;
    r.n = n;
    r.tp = &loom_tp_tcp;
    loom_debug_set_rank(rank);
    for (int j = 0; j < n; j++) {
        r.peers[j].rank = j;
        if (j != rank)
            r.mesh[j] = mesh.To(rank, j);
    }
    memcpy(r.secret, secret, sizeof(r.secret));
    loomtest::TpInit(r);
}

using loomtest::TpFill;
using loomtest::TpFirstWrong;

std::vector<uint8_t> Secret()
{
    std::vector<uint8_t> s(LOOM_SECRET_BYTES);
    EXPECT_EQ(getrandom(s.data(), s.size(), 0), static_cast<ssize_t>(s.size()));
    return s;
}

RunOptions Opts(double deadline_s = 30)
{
    RunOptions o;
    o.create_comm = false;
    o.deadline_s = deadline_s;
    o.unset_env = {"LOOM_TCP_NSOCKS", "LOOM_TCP_PIECE_BYTES", "LOOM_TCP_SOCKBUF", "LOOM_DEBUG",
                   "LOOM_DEBUG_FILE"};
    return o;
}

// Each rank sends every message of sizes[] (at the given buffer offsets) to every other rank
// and receives theirs, all posted at once; tags cycle through ntags values; checks every byte
// and that nothing is written around the receive buffers.
void Exchange(Rank &r, const std::vector<std::pair<size_t, size_t>> &sizes, uint32_t ntags)
{
    const size_t m = sizes.size();
    std::vector<std::vector<uint8_t>> sbuf(m);
    std::vector<std::vector<std::vector<uint8_t>>> rbuf(kMaxRanks);
    for (size_t k = 0; k < m; k++) {
        sbuf[k].resize(sizes[k].first + sizes[k].second);
        TpFill(sbuf[k].data() + sizes[k].second, sizes[k].first, r.rank, static_cast<int>(k));
    }
    std::vector<Op> ops;
    for (int j = 0; j < r.n; j++) {
        if (j == r.rank)
            continue;
        rbuf[j].resize(m);
        for (size_t k = 0; k < m; k++) {
            rbuf[j][k].assign(sizes[k].first + sizes[k].second + 1, 0xee);
            ops.push_back(TpRecv(r, j, rbuf[j][k].data() + sizes[k].second, sizes[k].first,
                                 static_cast<uint32_t>(k % ntags)));
        }
    }
    std::vector<size_t> send_len;
    for (int j = 0; j < r.n; j++)
        for (size_t k = 0; k < m && j != r.rank; k++) {
            ops.push_back(TpSend(r, j, sbuf[k].data() + sizes[k].second, sizes[k].first,
                                 static_cast<uint32_t>(k % ntags)));
            send_len.push_back(sizes[k].first);
        }
    XT_CHECK_LOOM(TpWaitAll(r, ops));
    size_t o = 0;
    for (int j = 0; j < r.n; j++) {
        if (j == r.rank)
            continue;
        for (size_t k = 0; k < m; k++, o++) {
            const size_t len = sizes[k].first, off = sizes[k].second;
            const uint8_t *p = rbuf[j][k].data();
            XT_CHECK_EQ(ops[o].nbytes, len);
            const size_t wrong = TpFirstWrong(p + off, len, j, static_cast<int>(k));
            XT_CHECK_MSG(wrong == len, "message " + std::to_string(k) + " of " +
                                           std::to_string(len) + " bytes from rank " +
                                           std::to_string(j) + " differs at byte " +
                                           std::to_string(wrong));
            for (size_t i = 0; i < off; i++)
                XT_CHECK(p[i] == 0xee);     // nothing written before the buffer
            XT_CHECK(p[off + len] == 0xee); // nor after it
        }
    }
    for (size_t i = 0; i < send_len.size(); i++, o++)
        XT_CHECK_EQ(ops[o].nbytes, send_len[i]);
}

// {length, buffer offset}: every size from 0 to 5 pieces that is a piece boundary or one byte
// either side of one, then lengths of many pieces, odd offsets included.
std::vector<std::pair<size_t, size_t>> BoundarySizes()
{
    std::vector<std::pair<size_t, size_t>> s = {{0, 0}, {1, 3}};
    for (size_t k = 1; k <= 5; k++)
        for (size_t d : {kPiece * k - 1, kPiece * k, kPiece * k + 1})
            s.push_back({d, d % 7});
    s.push_back({37 * kPiece + 11, 5});
    s.push_back({(1u << 20) + 13, 1});
    s.push_back({16u << 20, 0});
    return s;
}

// ---- striping through the table --------------------------------------------------------------

TEST(TcpStripe, SizesAroundPieceBoundariesBothWays)
{
    const Mesh mesh(2);
    const std::vector<uint8_t> secret = Secret();
    XT_ASSERT_RUN(RunRanks(
        2,
        [&](int rank, int n, loomComm_t) {
            SetStriping(4, kPiece);
            Rank r;
            Init(r, rank, n, mesh, secret.data());
            TpConnectAll(r);
            Exchange(r, BoundarySizes(), 1);
            TpBarrier(r);
            TpCloseAll(r);
        },
        Opts()));
}

// Three ranks, three sockets (pieces do not divide evenly among them), 300 messages to each
// peer with five tags, all in flight at once; receives of each tag match in posting order.
TEST(TcpStripe, ManyInFlightMixedTagsThreeRanks)
{
    const Mesh mesh(3);
    const std::vector<uint8_t> secret = Secret();
    XT_ASSERT_RUN(RunRanks(
        3,
        [&](int rank, int n, loomComm_t) {
            SetStriping(3, kPiece);
            Rank r;
            Init(r, rank, n, mesh, secret.data());
            TpConnectAll(r);
            std::vector<std::pair<size_t, size_t>> sizes;
            for (size_t k = 0; k < 300; k++)
                sizes.push_back({(k * 7919) % (11 * kPiece), k % 5});
            Exchange(r, sizes, 5);
            TpBarrier(r);
            TpCloseAll(r);
        },
        Opts()));
}

// The receiver stripes with other settings than the sender: each direction follows its
// sender's hello (4 sockets of 4 KiB pieces one way, one socket the other, then 2 sockets of
// 64 KiB pieces).
TEST(TcpStripe, EachDirectionFollowsItsSender)
{
    const Mesh mesh(3);
    const std::vector<uint8_t> secret = Secret();
    XT_ASSERT_RUN(RunRanks(
        3,
        [&](int rank, int n, loomComm_t) {
            if (rank == 0)
                SetStriping(4, kPiece);
            else if (rank == 1)
                SetStriping(1, 0);
            else
                SetStriping(2, 65536);
            Rank r;
            Init(r, rank, n, mesh, secret.data());
            TpConnectAll(r);
            Exchange(r, {{0, 0}, {kPiece + 1, 1}, {65537, 2}, {(3u << 20) + 5, 3}}, 2);
            TpBarrier(r);
            TpCloseAll(r);
        },
        Opts()));
}

// A striped frame whose tag nobody receives yet parks; its pieces on the other sockets wait in
// the kernel. A later frame of another tag cannot overtake it; posting the first tag's receive
// releases both in order.
TEST(TcpStripe, StripedFrameParksUntilItsReceiveIsPosted)
{
    const Mesh mesh(2);
    const std::vector<uint8_t> secret = Secret();
    XT_ASSERT_RUN(RunRanks(
        2,
        [&](int rank, int n, loomComm_t) {
            SetStriping(4, kPiece);
            Rank r;
            Init(r, rank, n, mesh, secret.data());
            TpConnectAll(r);
            const uint32_t kA = 0x80000011u, kB = 5;
            const size_t la1 = 9 * kPiece + 5, lb = 6 * kPiece, la2 = 30;
            if (rank == 0) {
                std::vector<uint8_t> a1(la1), b(lb), a2(la2);
                TpFill(a1.data(), la1, 0, 1);
                TpFill(b.data(), lb, 0, 2);
                TpFill(a2.data(), la2, 0, 3);
                std::vector<Op> ops = {
                    TpSend(r, 1, a1.data(), la1, kA), TpSend(r, 1, b.data(), lb, kB),
                    TpSend(r, 1, a2.data(), la2, kA), TpSend(r, 1, nullptr, 0, kA)};
                XT_CHECK_LOOM(TpWaitAll(r, ops));
            } else {
                std::vector<uint8_t> ra1(la1), rb(lb), ra2(64), ra3(8);
                std::vector<Op> first = {TpRecv(r, 0, rb.data(), lb, kB)};
                TpBarrier(r); // rank 0 posted everything
                for (int i = 0; i < 200; i++) {
                    int done = 0;
                    size_t nb = 0;
                    XT_CHECK_LOOM(loom_tp_tcp.test(first[0].req, &done, &nb));
                    XT_CHECK(!done);
                }
                std::vector<Op> rest = {TpRecv(r, 0, ra1.data(), la1, kA),
                                        TpRecv(r, 0, ra2.data(), ra2.size(), kA),
                                        TpRecv(r, 0, ra3.data(), ra3.size(), kA)};
                XT_CHECK_LOOM(TpWaitAll(r, first));
                XT_CHECK_LOOM(TpWaitAll(r, rest));
                XT_CHECK(first[0].nbytes == lb && TpFirstWrong(rb.data(), lb, 0, 2) == lb);
                XT_CHECK(rest[0].nbytes == la1 && TpFirstWrong(ra1.data(), la1, 0, 1) == la1);
                XT_CHECK(rest[1].nbytes == la2 && TpFirstWrong(ra2.data(), la2, 0, 3) == la2);
                XT_CHECK(rest[2].nbytes == 0);
            }
            if (rank == 0)
                TpBarrier(r);
            TpBarrier(r);
            TpCloseAll(r);
        },
        Opts()));
}

// Two small frames arrive in one read: the second waits in the receive connection's
// read-ahead, with no receive for its tag. Once one is posted, wait() must not sleep on a
// socket that has nothing more to say (it would sleep the full minute, past the watchdog).
TEST(TcpStripe, WaitReturnsWhenTheReadAheadHoldsTheFrame)
{
    const Mesh mesh(2);
    const std::vector<uint8_t> secret = Secret();
    XT_ASSERT_RUN(RunRanks(
        2,
        [&](int rank, int n, loomComm_t) {
            Rank r;
            Init(r, rank, n, mesh, secret.data());
            TpConnectAll(r);
            uint64_t a = 0xa11ce, b = 0xb0b;
            if (rank == 0) {
                std::vector<Op> ops = {TpSend(r, 1, &a, sizeof(a), 1),
                                       TpSend(r, 1, &b, sizeof(b), 2)};
                XT_CHECK_LOOM(TpWaitAll(r, ops));
                TpBarrier(r);
            } else {
                TpBarrier(r); // both frames are in rank 1's socket
                uint64_t got_a = 0, got_b = 0;
                std::vector<Op> first = {TpRecv(r, 0, &got_a, sizeof(got_a), 1)};
                XT_CHECK_LOOM(TpWaitAll(r, first));
                std::vector<Op> second = {TpRecv(r, 0, &got_b, sizeof(got_b), 2)};
                XT_CHECK_LOOM(loom_tp_tcp.wait(r.ctx, 60 * 1000 * 1000));
                XT_CHECK_LOOM(TpWaitAll(r, second));
                XT_CHECK(got_a == a && got_b == b);
            }
            TpBarrier(r);
            TpCloseAll(r);
        },
        Opts(20)));
}

// Rank 1 dies with a 16 MiB striped message half sent (64 KiB socket buffers cannot hold it):
// rank 0's receive fails with RemoteError naming rank 1, long before any timeout.
TEST(TcpStripe, PeerKilledMidStripe)
{
    const Mesh mesh(2);
    const std::vector<uint8_t> secret = Secret();
    RunOptions opts = Opts();
    opts.expected_exit = {0, 128 + SIGKILL};
    XT_ASSERT_RUN(RunRanks(
        2,
        [&](int rank, int n, loomComm_t) {
            SetStriping(4, 65536, 65536);
            Rank r;
            Init(r, rank, n, mesh, secret.data());
            TpConnectAll(r);
            std::vector<uint8_t> buf(16u << 20, 0x5a);
            std::vector<Op> ops;
            if (rank == 0)
                ops.push_back(TpRecv(r, 1, buf.data(), buf.size(), 1));
            TpBarrier(r);
            if (rank == 1) {
                ops.push_back(TpSend(r, 0, buf.data(), buf.size(), 1));
                int done = 0;
                size_t nb = 0;
                XT_CHECK_LOOM(loom_tp_tcp.test(ops[0].req, &done, &nb)); // some pieces leave
                XT_CHECK(!done);
                raise(SIGKILL);
            }
            const double t0 = static_cast<double>(loom_now_ns());
            XT_CHECK_LOOM_RES(TpWaitAll(r, ops), loomRemoteError);
            XT_CHECK((static_cast<double>(loom_now_ns()) - t0) / 1e9 < kTpTimeoutMs / 2000.0);
            XT_CHECK_MSG(strstr(loom_last_error(), "lost its connection from rank 1") != nullptr,
                         loom_last_error());
            TpCloseAll(r);
        },
        opts));
}

// ---- the wire, by hand -----------------------------------------------------------------------

// A connected TCP socket to addr (blocking connect with a deadline), tuned like loom's.
int Dial(const loom_sockaddr_t &addr)
{
    int fd = -1, done = 0, err = 0;
    XT_CHECK_LOOM(loom_socket_connect_start(&addr, &fd));
    const uint64_t deadline = loom_deadline_ms(kWaitMs);
    while (!done) {
        pollfd p = {fd, POLLOUT, 0};
        (void)poll(&p, 1, 100);
        XT_CHECK_LOOM(loom_socket_connect_poll(fd, &done, &err));
        XT_CHECK(loom_now_ns() < deadline);
    }
    XT_CHECK_LOOM(loom_socket_tune(fd, 0));
    return fd;
}

void SendStripeHello(int fd, int32_t rank, int32_t nranks, int index, int nsocks, uint32_t piece)
{
    uint8_t b[20];
    const uint32_t v[5] = {
        kStripeHelloMagic, static_cast<uint32_t>(rank), static_cast<uint32_t>(nranks),
        static_cast<uint32_t>(index) | static_cast<uint32_t>(nsocks) << 16, piece};
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 4; k++)
            b[4 * i + k] = static_cast<uint8_t>(v[i] >> (8 * k));
    XT_CHECK_LOOM(loom_socket_send_all(fd, b, sizeof(b), loom_deadline_ms(kWaitMs)));
}

// True once the listener closed fd (end of stream or reset within the deadline).
bool SeesClose(int fd)
{
    const uint64_t deadline = loom_deadline_ms(kWaitMs);
    while (loom_now_ns() < deadline) {
        pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        char c[64];
        const ssize_t n = read(fd, c, sizeof(c));
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return true;
    }
    return false;
}

std::string ReadLog(const std::string &path)
{
    std::string out;
    FILE *f = fopen(path.c_str(), "r");
    if (f == nullptr)
        return out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        out.append(buf, n);
    fclose(f);
    return out;
}

// Rank 0's listener faces a hand-written rank 1 of two sockets: the first proves the secret;
// an extra one with a wrong secret is refused, and so is a second claim on socket 0; the
// connection completes only with the honest socket 1. A message of 2.4 pieces is then laid
// out by hand (pieces 0 and 2 after the header on socket 0, piece 1 on socket 1) and must
// arrive intact, followed by a small one on socket 0 alone.
TEST(TcpStripe, ExtraSocketsProveTheSecretAndTheLayoutIsProtocol)
{
    RunOptions opts = Opts();
    XT_ASSERT_RUN(RunRanks(
        1,
        [](int, int, loomComm_t) {
            uint8_t secret[LOOM_SECRET_BYTES], wrong[LOOM_SECRET_BYTES];
            XT_CHECK_LOOM(loom_random_bytes(secret, sizeof(secret)));
            memcpy(wrong, secret, sizeof(wrong));
            wrong[7] ^= 0x40;
            loom_peer_info_t peers[2] = {};
            peers[1].rank = 1;
            loom_tp_init_args_t args = {};
            args.rank = 0;
            args.nranks = 2;
            args.peers = peers;
            args.secret = secret;
            args.timeout_ms = kTpTimeoutMs;
            void *ctx = nullptr, *listen = nullptr;
            uint8_t handle[LOOM_TP_HANDLE_MAX] = {};
            XT_CHECK_LOOM(loom_tp_tcp.init(&args, &ctx));
            XT_CHECK_LOOM(loom_tp_tcp.listen(ctx, handle, &listen));
            loom_sockaddr_t addr;
            memcpy(&addr, handle + kHandleAddrOffset, sizeof(addr));

            // Rank 0 accepts, as p2p.c does, in a thread of its own.
            std::atomic<bool> stop{false};
            std::mutex mu;
            std::condition_variable cv;
            void *recv = nullptr;
            int from = -1, extra = 0;
            std::thread acceptor([&] {
                const uint64_t deadline = loom_deadline_ms(kWaitMs);
                while (!stop.load()) {
                    void *rc = nullptr;
                    int peer = -1;
                    XT_CHECK_LOOM(loom_tp_tcp.accept(listen, &rc, &peer));
                    if (rc != nullptr) {
                        std::lock_guard<std::mutex> lock(mu);
                        if (recv == nullptr) {
                            recv = rc;
                            from = peer;
                        } else {
                            extra++;
                        }
                        cv.notify_all();
                    }
                    XT_CHECK(loom_now_ns() < deadline);
                    XT_CHECK_LOOM(loom_tp_tcp.wait(ctx, 1000));
                }
            });
            auto connected = [&] {
                std::lock_guard<std::mutex> lock(mu);
                return recv != nullptr;
            };

            const int s0 = Dial(addr);
            XT_CHECK_LOOM(loom_handshake_connect(s0, secret, kTcpRole, loom_deadline_ms(kWaitMs)));
            SendStripeHello(s0, 1, 2, 0, 2, kPiece);
            const int bad = Dial(addr);
            XT_CHECK_LOOM_RES(
                loom_handshake_connect(bad, wrong, kTcpRole, loom_deadline_ms(kWaitMs)),
                loomRemoteError);
            close(bad);
            XT_CHECK_MSG(!connected(), "a connection completed without its second socket");
            const int dup = Dial(addr);
            XT_CHECK_LOOM(loom_handshake_connect(dup, secret, kTcpRole, loom_deadline_ms(kWaitMs)));
            SendStripeHello(dup, 1, 2, 0, 2, kPiece);
            XT_CHECK_MSG(SeesClose(dup), "the listener kept a second socket 0");
            close(dup);
            XT_CHECK(!connected());
            const int s1 = Dial(addr);
            XT_CHECK_LOOM(loom_handshake_connect(s1, secret, kTcpRole, loom_deadline_ms(kWaitMs)));
            SendStripeHello(s1, 1, 2, 1, 2, kPiece);
            {
                std::unique_lock<std::mutex> lock(mu);
                XT_CHECK(
                    cv.wait_for(lock, std::chrono::seconds(10), [&] { return recv != nullptr; }));
            }
            stop.store(true);
            acceptor.join();
            XT_CHECK_EQ(from, 1);
            XT_CHECK_EQ(extra, 0);

            const size_t len = 2 * kPiece + kPiece / 2 + 3;
            std::vector<uint8_t> msg(len), small(100), got(len + 1, 0xee), got_small(100);
            TpFill(msg.data(), len, 1, 1);
            TpFill(small.data(), small.size(), 1, 2);
            void *r1 = nullptr, *r2 = nullptr;
            XT_CHECK_LOOM(loom_tp_tcp.irecv(recv, got.data(), len, 9, &r1));
            XT_CHECK_LOOM(loom_tp_tcp.irecv(recv, got_small.data(), small.size(), 9, &r2));
            uint8_t hdr[LOOM_WIRE_HDR_BYTES], hdr_small[LOOM_WIRE_HDR_BYTES];
            loom_tp_frame_header_encode(9, len, hdr);
            loom_tp_frame_header_encode(9, small.size(), hdr_small);
            const uint64_t dl = loom_deadline_ms(kWaitMs);
            XT_CHECK_LOOM(loom_socket_send_all(s1, msg.data() + kPiece, kPiece, dl));
            XT_CHECK_LOOM(loom_socket_send_all(s0, hdr, sizeof(hdr), dl));
            XT_CHECK_LOOM(loom_socket_send_all(s0, msg.data(), kPiece, dl));
            XT_CHECK_LOOM(loom_socket_send_all(s0, msg.data() + 2 * kPiece, len - 2 * kPiece, dl));
            XT_CHECK_LOOM(loom_socket_send_all(s0, hdr_small, sizeof(hdr_small), dl));
            XT_CHECK_LOOM(loom_socket_send_all(s0, small.data(), small.size(), dl));
            std::vector<Op> ops(2);
            ops[0].req = r1;
            ops[1].req = r2;
            XT_CHECK_LOOM(TpWaitAll(&loom_tp_tcp, ctx, ops));
            XT_CHECK(ops[0].nbytes == len && TpFirstWrong(got.data(), len, 1, 1) == len);
            XT_CHECK(got[len] == 0xee);
            XT_CHECK(ops[1].nbytes == 100 && TpFirstWrong(got_small.data(), 100, 1, 2) == 100);

            close(s0);
            close(s1);
            XT_CHECK_LOOM(loom_tp_tcp.close_recv(recv));
            XT_CHECK_LOOM(loom_tp_tcp.close_listen(listen));
            XT_CHECK_LOOM(loom_tp_tcp.finalize(ctx));
            const std::string log = ReadLog(RunDir() + "/rank0.log");
            XT_CHECK_MSG(log.find("did not prove the job secret") != std::string::npos, log);
            XT_CHECK_MSG(log.find("refused a second connection from rank 1 for socket 0 of 2") !=
                             std::string::npos,
                         log);
        },
        opts));
}

// ---- through the public API ------------------------------------------------------------------

// Rank 1 sends 16 MiB in 64 KiB pieces over 4 sockets and dies (tripwire) when it reaches the
// piece at 5 MiB, with pieces after it already sent on the other sockets; rank 0's receive
// returns loomRemoteError within 2 s, naming rank 1 with its pid.
TEST(TcpStripe, ApiRankKilledMidStripeIsNamed)
{
    RunOptions opts;
    opts.env = {{"LOOM_NET", "tcp"},
                {"LOOM_TCP_NSOCKS", "4"},
                {"LOOM_TCP_PIECE_BYTES", "65536"},
                {"LOOM_TCP_SOCKBUF", "65536"},
                {"LOOM_TIMEOUT_MS", "20000"}};
    opts.expected_exit = {0, 128 + SIGKILL};
    XT_ASSERT_RUN(RunRanks(
        2,
        [](int rank, int, loomComm_t comm) {
            constexpr size_t kBytes = 16u << 20;
            if (rank == 1) {
                loomtest::TripBuffer buf(kBytes);
                TpFill(buf.data(), kBytes, 1, 0);
                buf.Arm(5u << 20, SIGKILL);
                (void)loomSend(buf.data(), kBytes, loomUint8, 0, comm, nullptr);
                XT_CHECK_MSG(false, "the tripwire did not fire");
            }
            std::vector<uint8_t> got(kBytes);
            const uint64_t t0 = loom_now_ns();
            XT_CHECK_LOOM_RES(loomRecv(got.data(), kBytes, loomUint8, 1, comm, nullptr),
                              loomRemoteError);
            XT_CHECK((loom_now_ns() - t0) / 1000000ull < 2000);
            const std::string msg = loomGetLastError(nullptr);
            const std::string pid = "pid " + std::to_string(loomtest::RankPid(1)) + ")";
            XT_CHECK_MSG(msg.find("rank 1 (host ") != std::string::npos &&
                             msg.find(pid) != std::string::npos,
                         msg);
        },
        opts));
}

} // namespace
