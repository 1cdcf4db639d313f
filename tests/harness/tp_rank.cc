// SPDX-License-Identifier: Apache-2.0
//
// tp_rank.cc - the transport-table rank of tp_rank.h: the handle exchange over the test's
// sockets, connection set-up and tear-down, and bounded waits on requests.
#include "tp_rank.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

extern "C" {
#include "debug.h"
#include "timer.h"
}

namespace loomtest {
namespace {

[[noreturn]] void Fail(const char *file, int line, const char *what, const char *detail)
{
    fprintf(stderr, "rank %d %s:%d: %s%s%s\n", loom_debug_get_rank(), file, line, what,
            detail ? ": " : "", detail ? detail : "");
    fflush(stderr);
    _exit(1);
}

#define TP_CHECK(_cond)                                                                            \
    do {                                                                                           \
        if (!(_cond))                                                                              \
            Fail(__FILE__, __LINE__, "check failed: " #_cond, nullptr);                            \
    } while (0)

#define TP_OK(_call)                                                                               \
    do {                                                                                           \
        loomResult_t _r = (_call);                                                                 \
        if (_r != loomSuccess)                                                                     \
            Fail(__FILE__, __LINE__, #_call " failed", loom_last_error());                         \
    } while (0)

} // namespace

bool TpIoFull(int fd, void *buf, size_t len, bool writing)
{
    char *p = static_cast<char *>(buf);
    const uint64_t deadline = loom_deadline_ms(kTpWaitMs);
    while (len > 0) {
        pollfd pfd = {fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0};
        const int64_t left = static_cast<int64_t>(deadline - loom_now_ns()) / 1000000;
        TP_CHECK(left > 0);
        if (poll(&pfd, 1, static_cast<int>(left)) <= 0)
            continue;
        ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= static_cast<size_t>(n);
    }
    return true;
}

void TpAllgather(TpRank &r, const void *mine, size_t len, void *all)
{
    char *out = static_cast<char *>(all);
    for (int j = 0; j < r.n; j++)
        if (j != r.rank)
            TP_CHECK(TpIoFull(r.mesh[j], const_cast<void *>(mine), len, true));
    for (int j = 0; j < r.n; j++) {
        if (j == r.rank)
            memcpy(out + j * len, mine, len);
        else
            TP_CHECK(TpIoFull(r.mesh[j], out + j * len, len, false));
    }
}

void TpBarrier(TpRank &r)
{
    char b = 1, all[kTpMaxRanks];
    TpAllgather(r, &b, 1, all);
}

void TpInit(TpRank &r)
{
    loom_tp_init_args_t args = {};
    args.rank = r.rank;
    args.nranks = r.n;
    args.peers = r.peers;
    args.secret = r.secret;
    args.timeout_ms = kTpTimeoutMs;
    args.abort_flag = nullptr;
    TP_OK(r.tp->init(&args, &r.ctx));
    uint8_t handle[LOOM_TP_HANDLE_MAX] = {};
    TP_OK(r.tp->listen(r.ctx, handle, &r.listen));
    TpAllgather(r, handle, sizeof(handle), r.handles);
}

void TpConnectAll(TpRank &r)
{
    const uint64_t deadline = loom_deadline_ms(kTpWaitMs);
    for (;;) {
        int pending = 0;
        for (int j = 0; j < r.n; j++) {
            if (j == r.rank || r.send[j] != nullptr)
                continue;
            TP_OK(r.tp->connect(r.ctx, r.handles[j], j, &r.send[j]));
            pending += r.send[j] == nullptr;
        }
        for (;;) {
            void *rc = nullptr;
            int from = -1;
            TP_OK(r.tp->accept(r.listen, &rc, &from));
            if (rc == nullptr)
                break;
            TP_CHECK(from >= 0 && from < r.n && from != r.rank && r.recv[from] == nullptr);
            r.recv[from] = rc;
        }
        for (int j = 0; j < r.n; j++)
            pending += j != r.rank && r.recv[j] == nullptr;
        if (pending == 0)
            return;
        TP_CHECK(loom_now_ns() < deadline);
        TP_OK(r.tp->wait(r.ctx, 1000));
    }
}

void TpCloseAll(TpRank &r)
{
    for (int j = 0; j < r.n; j++) {
        if (r.send[j] != nullptr)
            TP_OK(r.tp->close_send(r.send[j]));
        if (r.recv[j] != nullptr)
            TP_OK(r.tp->close_recv(r.recv[j]));
        r.send[j] = r.recv[j] = nullptr;
    }
    TP_OK(r.tp->close_listen(r.listen));
    TP_OK(r.tp->finalize(r.ctx));
}

loomResult_t TpWaitAll(const loom_tp_t *tp, void *ctx, std::vector<TpOp> &ops, int timeout_ms)
{
    const uint64_t deadline = loom_deadline_ms(timeout_ms);
    for (;;) {
        bool all = true, progress = false;
        for (TpOp &op : ops) {
            if (op.done)
                continue;
            int done = 0;
            size_t nb = 0;
            op.res = tp->test(op.req, &done, &nb);
            if (op.res != loomSuccess) {
                op.done = true;
                return op.res;
            }
            if (done) {
                op.done = true;
                op.nbytes = nb;
                progress = true;
            } else {
                all = false;
            }
        }
        if (all)
            return loomSuccess;
        if (loom_now_ns() >= deadline)
            return loomTimeout;
        if (!progress)
            TP_OK(tp->wait(ctx, 1000));
    }
}

loomResult_t TpWaitAll(TpRank &r, std::vector<TpOp> &ops, int timeout_ms)
{
    return TpWaitAll(r.tp, r.ctx, ops, timeout_ms);
}

TpOp TpSend(TpRank &r, int to, const void *buf, size_t len, uint32_t tag)
{
    TpOp op;
    TP_OK(r.tp->isend(r.send[to], buf, len, tag, &op.req));
    return op;
}

TpOp TpRecv(TpRank &r, int from, void *buf, size_t len, uint32_t tag)
{
    TpOp op;
    TP_OK(r.tp->irecv(r.recv[from], buf, len, tag, &op.req));
    return op;
}

} // namespace loomtest
