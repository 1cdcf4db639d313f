// SPDX-License-Identifier: Apache-2.0
//
// security_util.h - the tools of the security suite: hostile clients (the kinds of stray
// traffic a listening port sees: scanners, half-open and idle connections, other jobs, floods,
// HTTP probes), an insider that knows the job secret and speaks the bootstrap wire format
// through the library's own encoders, a bootstrap root on loopback, real ranks in threads, and
// log inspection. It asserts nothing about the library itself; the tests do. Everything here
// runs inside rank processes of tests/harness (XT_CHECK on failure). Used by tests/security.
#ifndef LOOM_TESTS_SECURITY_UTIL_H
#define LOOM_TESTS_SECURITY_UTIL_H

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "bootstrap.h"
#include "secret.h"
#include "socket.h"
#include "timer.h"
}

namespace sectest {

// The kinds of hostile traffic of the issue, in the order it lists them.
enum class Hostile { kCloseAtOnce, kPartialHandshake, kWrongSecret, kSilent, kThousand, kHttpGet };
std::string HostileName(Hostile kind);

// Sends kind against the listener at addr, which serves handshake `role`. Returns the
// connections the attack keeps open; the caller closes them (CloseFds) once the real work is
// done. What the attacker can see itself is checked here: a wrong secret must be refused, an
// HTTP request must see its connection closed.
std::vector<int> Attack(Hostile kind, const loom_sockaddr_t &addr, uint32_t role);
void CloseFds(std::vector<int> &fds);

// A connected blocking TCP socket to addr, or -1 after timeout_ms.
int Connect(const loom_sockaddr_t &addr, int timeout_ms);
// Raises the soft limit on descriptors to want (or the hard limit, if lower).
void RaiseFdLimit(long want);

std::string ReadFile(const std::string &path);
// A fresh directory under /tmp, removed with everything in it when the object goes. path() is
// empty if it could not be made.
class TempDir {
  public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;
    const std::string &path() const
    {
        return path_;
    }
    // Writes text to the file name in it with exactly mode (whatever the umask); its path.
    std::string Write(const std::string &name, const std::string &text, unsigned mode) const;

  private:
    std::string path_;
};
// The local addresses (hex, as /proc/net/tcp{,6} print them) of the listening sockets on port.
std::vector<std::string> ListeningAddrs(int port);
// True if a /proc/net address is the wildcard (0.0.0.0 or ::).
bool IsWildcard(const std::string &hex);
// The port of addr, host order.
int PortOf(const loom_sockaddr_t &addr);
// The log file of rank `rank` of the current run (tests/harness): its stdout and stderr.
std::string RankLog(int rank);
// Lines of the file that are loom WARN lines / that contain what.
int CountWarnLines(const std::string &path);
int CountLines(const std::string &path, const std::string &what);

// Starts a bootstrap root on 127.0.0.1 with a fresh secret; returns the id to join.
loom_id_t StartRoot(int64_t timeout_ms);

// What a real rank (a thread running the library's rank side) saw.
struct RankOutcome {
    loomResult_t join = loomInternalError;
    loomResult_t gather = loomInternalError;
    std::vector<int32_t> got; // the all-gathered values, rank order
    std::string error;        // loom_last_error() of the thread after the first failure
};
// join, all-gather (rank * 10 + 1), leave - the bootstrap part of communicator creation.
std::thread RunRealRank(const loom_id_t &id, int rank, int nranks, int64_t timeout_ms,
                        RankOutcome *out);
bool GatherIsCorrect(const RankOutcome &o, int nranks);

// One bootstrap connection driven by hand: an insider that holds the job secret (or not).
struct RawClient {
    int fd = -1;
    // TCP connect and the handshake with `secret`.
    loomResult_t Open(const loom_id_t &id, const uint8_t *secret);
    bool Send(const void *buf, size_t len);
    bool SendHello(int32_t rank, int32_t nranks, uint32_t magic = LOOM_BS_HELLO_MAGIC);
    bool SendReq(uint32_t type, uint32_t len, const void *payload, size_t payload_len);
    // Reads one REPLY. Success: *out gets exactly expect bytes. A failure status is returned
    // with its text in *out. RemoteError when the connection closed first.
    loomResult_t ReadReply(uint64_t expect, std::string *out, int timeout_ms = 10000);
    // True once the root closed the connection (EOF within timeout_ms).
    bool SeesClose(int timeout_ms = 10000);
    void Close();
};

} // namespace sectest

#endif // LOOM_TESTS_SECURITY_UTIL_H
