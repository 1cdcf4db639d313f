// SPDX-License-Identifier: Apache-2.0
//
// fault_util.cc - the helpers of fault_util.h: clock, environment, message checks and the
// /dev/shm listing. Used by tests/fault.

#include "fault_util.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

namespace loomtest {

double NowSec()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

EnvList FaultEnv(const std::string &net, int timeout_ms)
{
    return {{"LOOM_NET", net},
            {"LOOM_TIMEOUT_MS", std::to_string(timeout_ms)},
            {"LOOM_SHM_RING_BYTES", "65536"},
            {"LOOM_TCP_SOCKBUF", "65536"},
            {"LOOM_CHUNK_BYTES", "65536"}};
}

void CheckNamesRank(const char *file, int line, int rank, const std::string &op)
{
    const std::string msg = loomGetLastError(nullptr);
    const int pid = RankPid(rank);
    const std::string who = "rank " + std::to_string(rank) + " (host ";
    const std::string pid_text = "pid " + std::to_string(pid);
    const size_t at = msg.find(pid_text);
    const bool pid_named = at != std::string::npos && at + pid_text.size() < msg.size() &&
                           !isdigit(static_cast<unsigned char>(msg[at + pid_text.size()]));
    if (pid <= 0 || msg.find(who) == std::string::npos || !pid_named ||
        msg.find(op) == std::string::npos || msg.find(" seq ") == std::string::npos)
        Fail(file, line,
             "last error does not name " + who + "..., " + pid_text + " and '" + op + " seq': '" +
                 msg + "'");
}

void WaitForRankExit(int rank)
{
    const int pid = RankPid(rank);
    XT_CHECK_MSG(pid > 0, "rank " + std::to_string(rank) + " has not started");
    const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0 && errno == ESRCH)
        return;
    XT_CHECK_MSG(fd >= 0, std::string("pidfd_open: ") + strerror(errno));
    pollfd p = {fd, POLLIN, 0};
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    close(fd);
}

std::vector<std::string> ShmLeftovers(const std::vector<int> &pids)
{
    std::vector<std::string> left;
    DIR *d = opendir("/dev/shm");
    if (d == nullptr)
        return left;
    while (dirent *e = readdir(d)) {
        for (int pid : pids) {
            const std::string prefix = "loom-" + std::to_string(pid) + "-";
            if (strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0)
                left.push_back(std::string("/dev/shm/") + e->d_name);
        }
    }
    closedir(d);
    return left;
}

void CheckSurvivorOf(const char *file, int line, int rank, int victim, const std::string &what,
                     const std::string &op, const std::function<loomResult_t()> &call)
{
    const double t0 = NowSec();
    const loomResult_t r = call();
    const double secs = NowSec() - t0;
    if (rank == victim)
        Fail(file, line, "the victim's " + what + " returned instead of dying");
    fprintf(stderr, "rank %d: %s returned %s after %.1f ms: %s\n", rank, what.c_str(),
            Show(r).c_str(), secs * 1e3, loomGetLastError(nullptr));
    if (r != loomRemoteError)
        FailLoom(file, line, what.c_str(), r, loomRemoteError);
    if (secs >= 2.0)
        Fail(file, line, "detection took " + std::to_string(secs) + " s");
    CheckNamesRank(file, line, victim, op);
}

::testing::AssertionResult RunWithVictim(const std::string &layout, int nranks, int victim,
                                         const EnvList &extra, const RankBody &body)
{
    std::vector<int> pids;
    RunOptions opts;
    opts.env = FaultEnv(layout == "tcp" ? "tcp" : "", 20000);
    opts.env.insert(opts.env.end(), extra.begin(), extra.end());
    if (layout == "hosts") {
        const int per_host = (nranks + 1) / 2;
        opts.rank_env = [per_host](int rank) {
            return EnvList{{"LOOM_HOST_ID", "host" + std::to_string(rank / per_host)}};
        };
    }
    opts.expected_exit.assign(static_cast<size_t>(nranks), 0);
    opts.expected_exit[static_cast<size_t>(victim)] = 128 + SIGKILL;
    opts.pids_out = &pids;
    ::testing::AssertionResult run = RunRanks(nranks, body, opts);
    if (!run)
        return run;
    const std::vector<std::string> left = ShmLeftovers(pids);
    if (!left.empty())
        return ::testing::AssertionFailure() << "left in /dev/shm: " << left.front();
    return ::testing::AssertionSuccess();
}

} // namespace loomtest
