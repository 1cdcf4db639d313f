// SPDX-License-Identifier: Apache-2.0
//
// tp_rank.h - one forked rank driving a transport through its loom_tp_t table, as p2p.c would:
// its context, listener and connections to every other rank, the exchange of listen handles over
// sockets the test made before forking (never loom), and requests waited on with a deadline. It
// does not fork (the test does, or mp_fixture.h) and it reaches library internals (transport.h),
// so only suites built against them use it: test_transport.cc and test_tcp_stripe.cc.
// A failed step prints "rank R file:line: ..." (the rank of loom_debug_set_rank) and _exit(1)s.
#ifndef LOOM_TESTS_HARNESS_TP_RANK_H
#define LOOM_TESTS_HARNESS_TP_RANK_H

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" {
#include "secret.h"
#include "transport.h"
}

namespace loomtest {

constexpr int kTpMaxRanks = 3;
constexpr int kTpTimeoutMs = 10000; // the transport's own bound
constexpr int kTpWaitMs = 20000;    // a rank's bound on one exchange

struct TpRank {
    int rank = -1;
    int n = 0;
    const loom_tp_t *tp = nullptr;
    void *ctx = nullptr;
    void *listen = nullptr;
    void *send[kTpMaxRanks] = {};
    void *recv[kTpMaxRanks] = {};
    int mesh[kTpMaxRanks] = {-1, -1, -1}; // a socket to each other rank, made before the fork
    uint8_t secret[LOOM_SECRET_BYTES] = {};
    loom_peer_info_t peers[kTpMaxRanks] = {};
    uint8_t handles[kTpMaxRanks][LOOM_TP_HANDLE_MAX] = {};
};

// Reads or writes all len bytes of fd within kTpWaitMs (the rank fails past it); false if the
// peer closed the socket or an error ended it.
bool TpIoFull(int fd, void *buf, size_t len, bool writing);
// Every rank's len bytes of mine, in rank order, into all (over the mesh).
void TpAllgather(TpRank &r, const void *mine, size_t len, void *all);
void TpBarrier(TpRank &r);
// r.tp's init with r.rank, r.n, r.peers and r.secret, its listen, and every rank's handle.
void TpInit(TpRank &r);
// Connects to every other rank and accepts every other rank, as p2p.c does.
void TpConnectAll(TpRank &r);
void TpCloseAll(TpRank &r);

struct TpOp {
    void *req = nullptr;
    size_t nbytes = 0;
    bool done = false;
    loomResult_t res = loomSuccess;
};

// Tests ops until all are complete or one fails; returns the first failure, or loomTimeout after
// timeout_ms.
loomResult_t TpWaitAll(const loom_tp_t *tp, void *ctx, std::vector<TpOp> &ops,
                       int timeout_ms = kTpWaitMs);
loomResult_t TpWaitAll(TpRank &r, std::vector<TpOp> &ops, int timeout_ms = kTpWaitMs);
TpOp TpSend(TpRank &r, int to, const void *buf, size_t len, uint32_t tag);
TpOp TpRecv(TpRank &r, int from, void *buf, size_t len, uint32_t tag);

} // namespace loomtest

#endif // LOOM_TESTS_HARNESS_TP_RANK_H
