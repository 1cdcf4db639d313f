// SPDX-License-Identifier: Apache-2.0
//
// security_util.cc - hostile clients, the raw bootstrap client, a loopback root, real ranks in
// threads and log helpers for the security suite (see security_util.h). The hostile clients
// use plain sockets; the raw client frames its messages with the library's own encoders so that
// an "insider" differs from a rank only in what it chooses to send.
#include "security_util.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mp_fixture.h"

extern "C" {
#include "debug.h"
}

namespace sectest {

namespace {

// Waits for fd to be ready for events; false after timeout_ms.
bool WaitFd(int fd, short events, int timeout_ms)
{
    uint64_t deadline = loom_deadline_ms(timeout_ms);
    for (;;) {
        int64_t left = static_cast<int64_t>(deadline - loom_now_ns()) / 1000000;
        if (static_cast<int64_t>(deadline - loom_now_ns()) <= 0)
            return false;
        struct pollfd p = {fd, events, 0};
        int rc = poll(&p, 1, static_cast<int>(left) + 1);
        if (rc > 0)
            return true;
        if (rc < 0 && errno != EINTR)
            return false;
    }
}

bool ReadFull(int fd, void *buf, size_t len, int timeout_ms)
{
    char *p = static_cast<char *>(buf);
    uint64_t deadline = loom_deadline_ms(timeout_ms);
    while (len > 0) {
        int64_t left = static_cast<int64_t>(deadline - loom_now_ns()) / 1000000;
        if (left <= 0 || !WaitFd(fd, POLLIN, static_cast<int>(left)))
            return false;
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= static_cast<size_t>(n);
    }
    return true;
}

// Reads until EOF or error: true if the peer closed within timeout_ms.
bool DrainUntilClose(int fd, int timeout_ms)
{
    uint64_t deadline = loom_deadline_ms(timeout_ms);
    char buf[512];
    for (;;) {
        int64_t left = static_cast<int64_t>(deadline - loom_now_ns()) / 1000000;
        if (left <= 0 || !WaitFd(fd, POLLIN, static_cast<int>(left)))
            return false;
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
            return true;
    }
}

// Connections opened as fast as the kernel takes them, without waiting for any to complete.
std::vector<int> Flood(const loom_sockaddr_t &addr, int count)
{
    std::vector<int> fds;
    for (int i = 0; i < count; i++) {
        int fd = -1;
        if (loom_socket_connect_start(&addr, &fd) != loomSuccess)
            break;
        fds.push_back(fd);
    }
    // Then give the TCP handshakes a moment to finish (or fail) before the caller moves on.
    std::vector<struct pollfd> pending;
    for (int fd : fds)
        pending.push_back({fd, POLLOUT, 0});
    uint64_t deadline = loom_deadline_ms(3000);
    while (!pending.empty() && loom_now_ns() < deadline) {
        if (poll(pending.data(), pending.size(), 100) < 0 && errno != EINTR)
            break;
        std::vector<struct pollfd> left;
        for (const struct pollfd &p : pending)
            if (p.revents == 0)
                left.push_back({p.fd, POLLOUT, 0});
        pending.swap(left);
    }
    return fds;
}

} // namespace

std::string HostileName(Hostile kind)
{
    switch (kind) {
    case Hostile::kCloseAtOnce:
        return "CloseAtOnce";
    case Hostile::kPartialHandshake:
        return "PartialHandshake";
    case Hostile::kWrongSecret:
        return "WrongSecret";
    case Hostile::kSilent:
        return "Silent";
    case Hostile::kThousand:
        return "Thousand";
    case Hostile::kHttpGet:
        return "HttpGet";
    }
    return "?";
}

int Connect(const loom_sockaddr_t &addr, int timeout_ms)
{
    int fd = -1, done = 0, err = 0;
    if (loom_socket_connect_start(&addr, &fd) != loomSuccess)
        return -1;
    uint64_t deadline = loom_deadline_ms(timeout_ms);
    while (!done) {
        if (loom_socket_connect_poll(fd, &done, &err) != loomSuccess || loom_now_ns() > deadline) {
            close(fd);
            return -1;
        }
        if (!done)
            WaitFd(fd, POLLOUT, 10);
    }
    return fd;
}

void RaiseFdLimit(long want)
{
    struct rlimit rl;
    XT_CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    rlim_t target = static_cast<rlim_t>(want);
    if (rl.rlim_max != RLIM_INFINITY && target > rl.rlim_max)
        target = rl.rlim_max;
    if (rl.rlim_cur < target) {
        rl.rlim_cur = target;
        XT_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
}

std::vector<int> Attack(Hostile kind, const loom_sockaddr_t &addr, uint32_t role)
{
    std::vector<int> held;
    switch (kind) {
    case Hostile::kCloseAtOnce:
        // Port scanners: connect and go, half of them with a reset instead of a FIN.
        for (int i = 0; i < 40; i++) {
            int fd = Connect(addr, 5000);
            XT_CHECK(fd >= 0);
            if (i % 2) {
                struct linger lg = {1, 0};
                setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
            }
            close(fd);
        }
        break;
    case Hostile::kPartialHandshake:
        // Read the challenge, answer half of it, then go quiet (and one that closes instead).
        for (int i = 0; i < 8; i++) {
            int fd = Connect(addr, 5000);
            XT_CHECK(fd >= 0);
            uint8_t challenge[32], half[16];
            memset(half, 0x5a, sizeof(half));
            XT_CHECK(ReadFull(fd, challenge, sizeof(challenge), 5000));
            XT_CHECK(send(fd, half, i == 0 ? 1 : sizeof(half), MSG_NOSIGNAL) > 0);
            if (i == 7)
                close(fd);
            else
                held.push_back(fd);
        }
        break;
    case Hostile::kWrongSecret: {
        // Another job (or a guess): the listener must refuse the proof and say so.
        uint8_t wrong[LOOM_SECRET_BYTES];
        for (int i = 0; i < 5; i++) {
            XT_CHECK(loom_random_bytes(wrong, sizeof(wrong)) == loomSuccess);
            int fd = Connect(addr, 5000);
            XT_CHECK(fd >= 0);
            loomResult_t res = loom_handshake_connect(fd, wrong, role, loom_deadline_ms(5000));
            XT_CHECK_EQ(res, loomRemoteError);
            XT_CHECK_MSG(strstr(loom_last_error(), "refused this end's proof") != nullptr,
                         loom_last_error());
            close(fd);
        }
        break;
    }
    case Hostile::kSilent:
        // Idle connections: more of them than the old one-at-a-time root could sit out.
        for (int i = 0; i < 16; i++) {
            int fd = Connect(addr, 5000);
            XT_CHECK(fd >= 0);
            held.push_back(fd);
        }
        break;
    case Hostile::kThousand:
        RaiseFdLimit(4096);
        held = Flood(addr, 1000);
        XT_CHECK_EQ(held.size(), 1000u);
        break;
    case Hostile::kHttpGet: {
        static const char get[] = "GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/8.0\r\n"
                                  "Accept: */*\r\n\r\n";
        int fd = Connect(addr, 5000);
        XT_CHECK(fd >= 0);
        XT_CHECK(send(fd, get, sizeof(get) - 1, MSG_NOSIGNAL) ==
                 static_cast<ssize_t>(sizeof(get) - 1));
        XT_CHECK_MSG(DrainUntilClose(fd, 5000), "the listener kept an HTTP client's connection");
        close(fd);
        // A short request (less than a handshake response) that then waits for an answer.
        static const char shortget[] = "GET / HTTP/1.0\r\n\r\n";
        fd = Connect(addr, 5000);
        XT_CHECK(fd >= 0);
        XT_CHECK(send(fd, shortget, sizeof(shortget) - 1, MSG_NOSIGNAL) > 0);
        held.push_back(fd);
        break;
    }
    }
    return held;
}

void CloseFds(std::vector<int> &fds)
{
    for (int fd : fds)
        close(fd);
    fds.clear();
}

std::string ReadFile(const std::string &path)
{
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

TempDir::TempDir()
{
    char tmpl[] = "/tmp/loom-sec-XXXXXX";
    if (mkdtemp(tmpl) != nullptr)
        path_ = tmpl;
}

TempDir::~TempDir()
{
    std::error_code ec;
    if (!path_.empty())
        std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Write(const std::string &name, const std::string &text, unsigned mode) const
{
    const std::string p = path_ + "/" + name;
    int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return p;
    if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        fchmod(fd, static_cast<mode_t>(mode)) != 0)
        perror(p.c_str());
    close(fd);
    return p;
}

std::vector<std::string> ListeningAddrs(int port)
{
    std::vector<std::string> out;
    for (const char *table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
        std::istringstream in(ReadFile(table));
        std::string line;
        std::getline(in, line); // the column titles
        while (std::getline(in, line)) {
            std::istringstream f(line);
            std::string slot, local, remote, state;
            f >> slot >> local >> remote >> state;
            size_t colon = local.rfind(':');
            if (state != "0A" || colon == std::string::npos)
                continue; // 0A: TCP_LISTEN
            if (std::stoi(local.substr(colon + 1), nullptr, 16) == port)
                out.push_back(local.substr(0, colon));
        }
    }
    return out;
}

bool IsWildcard(const std::string &hex)
{
    return hex.find_first_not_of('0') == std::string::npos;
}

int PortOf(const loom_sockaddr_t &addr)
{
    return ntohs(addr.sa.sa_family == AF_INET6 ? addr.sin6.sin6_port : addr.sin.sin_port);
}

int CountLines(const std::string &path, const std::string &what)
{
    std::istringstream in(ReadFile(path));
    std::string line;
    int n = 0;
    while (std::getline(in, line))
        n += line.find(what) != std::string::npos;
    return n;
}

std::string RankLog(int rank)
{
    return loomtest::RunDir() + "/rank" + std::to_string(rank) + ".log";
}

int CountWarnLines(const std::string &path)
{
    return CountLines(path, "LOOM WARN");
}

loom_id_t StartRoot(int64_t timeout_ms)
{
    loom_id_t id;
    memset(&id, 0, sizeof(id));
    id.magic = LOOM_ID_MAGIC;
    id.version = LOOM_ID_VERSION;
    XT_CHECK_LOOM(loom_random_bytes(id.secret, sizeof(id.secret)));
    XT_CHECK_LOOM(loom_sockaddr_parse("127.0.0.1:0", &id.root));
    int fd = -1;
    XT_CHECK_LOOM(loom_socket_listen(&id.root, &fd));
    XT_CHECK_LOOM(loom_bootstrap_root_start(fd, id.secret, timeout_ms));
    return id;
}

std::thread RunRealRank(const loom_id_t &id, int rank, int nranks, int64_t timeout_ms,
                        RankOutcome *out)
{
    return std::thread([id, rank, nranks, timeout_ms, out] {
        loom_bootstrap_t *bs = nullptr;
        out->join = loom_bootstrap_join(&id, rank, nranks, timeout_ms, &bs);
        if (out->join != loomSuccess) {
            out->error = loom_last_error();
            return;
        }
        int32_t mine = rank * 10 + 1;
        out->got.assign(static_cast<size_t>(nranks), -1);
        out->gather = loom_bootstrap_allgather(bs, &mine, sizeof(mine), out->got.data());
        if (out->gather != loomSuccess)
            out->error = loom_last_error();
        (void)loom_bootstrap_leave(bs);
    });
}

bool GatherIsCorrect(const RankOutcome &o, int nranks)
{
    if (o.join != loomSuccess || o.gather != loomSuccess ||
        o.got.size() != static_cast<size_t>(nranks))
        return false;
    for (int r = 0; r < nranks; r++)
        if (o.got[static_cast<size_t>(r)] != r * 10 + 1)
            return false;
    return true;
}

loomResult_t RawClient::Open(const loom_id_t &id, const uint8_t *secret)
{
    fd = Connect(id.root, 5000);
    XT_CHECK(fd >= 0);
    return loom_handshake_connect(fd, secret, LOOM_BS_ROLE, loom_deadline_ms(5000));
}

bool RawClient::Send(const void *buf, size_t len)
{
    return loom_socket_send_all(fd, buf, len, loom_deadline_ms(5000)) == loomSuccess;
}

bool RawClient::SendHello(int32_t rank, int32_t nranks, uint32_t magic)
{
    loom_bs_hello_t h = {magic, rank, nranks, static_cast<uint32_t>(getpid())};
    uint8_t buf[LOOM_BS_HELLO_BYTES];
    loom_bs_hello_encode(&h, buf);
    return Send(buf, sizeof(buf));
}

bool RawClient::SendReq(uint32_t type, uint32_t len, const void *payload, size_t payload_len)
{
    loom_bs_req_t q = {type, len};
    uint8_t buf[LOOM_BS_REQ_BYTES];
    loom_bs_req_encode(&q, buf);
    return Send(buf, sizeof(buf)) && (payload_len == 0 || Send(payload, payload_len));
}

loomResult_t RawClient::ReadReply(uint64_t expect, std::string *out, int timeout_ms)
{
    uint8_t hdr[LOOM_BS_REPLY_BYTES];
    if (!ReadFull(fd, hdr, sizeof(hdr), timeout_ms))
        return loomRemoteError;
    loom_bs_reply_t r = {0, 0};
    char why[128];
    loomResult_t res = loom_bs_reply_decode(hdr, sizeof(hdr), expect, &r, why, sizeof(why));
    if (res != loomSuccess && r.status == 0) {
        *out = why;
        return res;
    }
    std::string data(static_cast<size_t>(r.len), '\0');
    if (r.len > 0 && !ReadFull(fd, &data[0], data.size(), timeout_ms))
        return loomRemoteError;
    *out = data;
    return res;
}

bool RawClient::SeesClose(int timeout_ms)
{
    return DrainUntilClose(fd, timeout_ms);
}

void RawClient::Close()
{
    if (fd >= 0)
        close(fd);
    fd = -1;
}

} // namespace sectest
