// SPDX-License-Identifier: Apache-2.0
//
// mp_fixture.cc - the fork/wait/report machinery behind RunRanks and the rank-side helpers
// (unique-id sharing through pipes, failure reporting). The parent waits for the ranks with one
// poll() on their pidfds against the deadline, so nothing sleeps (kernels without pidfd_open
// fall back to a 20 ms watchdog tick). It does not interpret the body's work: a rank's exit code
// is the whole verdict, with two additions: a rank that would exit 0 runs LeakSanitizer's check
// first (leak_check.h), and a rank may leave a reason to report the test skipped (SkipRun).
// Used by every multi-process suite through mp_fixture.h.

#include "mp_fixture.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>

#ifdef LOOMTEST_HAVE_LSAN
// AddressSanitizer's defaults for every test that forks ranks (ASAN_OPTIONS still overrides).
// Its tracking of dynamic TLS (intercept_tls_get_addr) leaves entries behind for blocks that
// UCX's modules free, and LeakSanitizer's tracer then reads one and crashes ("Tracer caught
// signal 11", "DTLS ... at 0x1c8"): a rank that used ucx would fail its leak check for nothing.
// Without the tracking, memory reachable only from dynamic TLS could be reported as a leak,
// never hidden.
extern "C" const char *__asan_default_options()
{
    return "intercept_tls_get_addr=0";
}
#endif

namespace loomtest {

namespace {

// What a rank process knows about its run; unset (-1) in the parent.
struct RankState {
    int rank = -1;
    int nranks = 0;
    int share_fd = -1;         // ranks > 0: read end of the pipe from rank 0
    std::vector<int> share_to; // rank 0: write ends, indexed by rank (entry 0 unused)
};

RankState g_rank;
std::string g_run_dir;
std::string g_skip_reason; // the parent's copy of the last run's SkipRun reason

double NowSeconds()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Plain write/read loops: the id pipes carry a few hundred bytes at most.
bool WriteAll(int fd, const void *data, size_t n)
{
    const char *p = static_cast<const char *>(data);
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

bool ReadAll(int fd, void *data, size_t n)
{
    char *p = static_cast<char *>(data);
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        p += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

std::string ReadLogTail(const std::string &path, size_t max_bytes)
{
    std::ifstream in(path, std::ios::binary);
    if (!in)
        return "(no log)\n";
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (s.empty())
        return "(empty)\n";
    if (s.size() > max_bytes)
        s = "[... " + std::to_string(s.size() - max_bytes) + " bytes cut ...]\n" +
            s.substr(s.size() - max_bytes);
    if (s.back() != '\n')
        s += '\n';
    return s;
}

std::string DescribeStatus(int code)
{
    if (code == kExitLeak)
        return "exit code " + std::to_string(code) +
               " (LeakSanitizer found leaks; the report is in the rank's log)";
    if (code > 128)
        return "killed by signal " + std::to_string(code - 128) + " (" + strsignal(code - 128) +
               ")";
    return "exit code " + std::to_string(code);
}

std::string PidFile(int rank)
{
    return g_run_dir + "/rank" + std::to_string(rank) + ".pid";
}

std::string SkipFile(int rank)
{
    return g_run_dir + "/rank" + std::to_string(rank) + ".skip";
}

// The reason the first rank that called SkipRun gave, or "".
std::string ReadSkipReason(int nranks)
{
    for (int r = 0; r < nranks; r++) {
        std::ifstream in(SkipFile(r));
        std::string reason;
        if (in && std::getline(in, reason) && !reason.empty())
            return reason;
    }
    return "";
}

// Written whole or not at all (rename), so a reader never sees half a number.
void WritePidFile(int rank)
{
    const std::string path = PidFile(rank), tmp = path + ".tmp";
    FILE *f = fopen(tmp.c_str(), "w");
    if (f == nullptr || fprintf(f, "%d\n", static_cast<int>(getpid())) < 0 || fclose(f) != 0 ||
        rename(tmp.c_str(), path.c_str()) != 0)
        _exit(kExitHarness);
}

// Everything the rank process does between fork() and _exit(). Never returns.
[[noreturn]] void RankMain(int rank, int nranks, const RankBody &body, const RunOptions &opts,
                           pid_t parent, const std::vector<int> &close_fds, int share_fd,
                           const std::vector<int> &share_to)
{
    // Die with the parent (a killed gtest must not leave ranks behind), in a process group of
    // our own so that the watchdog's killpg also reaches anything we start.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(kExitHarness);
    setpgid(0, 0);
    for (int fd : close_fds)
        close(fd);

    const std::string log = g_run_dir + "/rank" + std::to_string(rank) + ".log";
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
        _exit(kExitHarness);
    close(fd);
    setvbuf(stdout, nullptr, _IOLBF, 0);
    setvbuf(stderr, nullptr, _IONBF, 0);

    g_rank.rank = rank;
    g_rank.nranks = nranks;
    g_rank.share_fd = share_fd;
    g_rank.share_to = share_to;
    WritePidFile(rank);

    for (const std::string &name : opts.unset_env)
        unsetenv(name.c_str());
    EnvList env = opts.env;
    if (opts.rank_env) {
        EnvList extra = opts.rank_env(rank);
        env.insert(env.end(), extra.begin(), extra.end());
    }
    for (const auto &kv : env) {
        setenv(kv.first.c_str(), kv.second.c_str(), 1);
        fprintf(stderr, "rank %d: %s=%s\n", rank, kv.first.c_str(), kv.second.c_str());
    }
    fprintf(stderr, "rank %d of %d: pid %d\n", rank, nranks, static_cast<int>(getpid()));

    loomComm_t comm = nullptr;
    if (opts.create_comm)
        comm = CreateComm(nullptr);
    try {
        body(rank, nranks, comm);
    } catch (const std::exception &e) {
        Fail(__FILE__, __LINE__, std::string("uncaught exception: ") + e.what());
    } catch (...) {
        Fail(__FILE__, __LINE__, "uncaught exception of unknown type");
    }
    if (comm != nullptr)
        XT_CHECK_LOOM(loomCommDestroy(comm));
    fprintf(stderr, "rank %d: done\n", rank);
    fflush(stdout);
    if (LeakCheckRank() != 0) {
        fprintf(stderr, "rank %d: LeakSanitizer found leaks (reported above)\n", rank);
        _exit(kExitLeak);
    }
    _exit(kExitOk);
}

struct Child {
    pid_t pid = -1;
    int pidfd = -1; // readable once the rank has exited; -1 without pidfd_open
    bool done = false;
    bool timed_out = false;
    int code = -1;
};

// Collects the rank's status if it has exited (or, with block, once it does).
void Reap(Child &c, bool block)
{
    int status = 0;
    pid_t got;
    while ((got = waitpid(c.pid, &status, block ? 0 : WNOHANG)) < 0 && errno == EINTR) {
    }
    if (got != c.pid)
        return;
    c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    c.done = true;
    if (c.pidfd >= 0)
        close(c.pidfd);
    c.pidfd = -1;
}

} // namespace

int CurrentRank()
{
    return g_rank.rank;
}

int CurrentNranks()
{
    return g_rank.nranks;
}

const std::string &RunDir()
{
    return g_run_dir;
}

int RankPid(int rank)
{
    FILE *f = fopen(PidFile(rank).c_str(), "r");
    if (f == nullptr)
        return -1;
    int pid = -1;
    if (fscanf(f, "%d", &pid) != 1)
        pid = -1;
    fclose(f);
    return pid;
}

void SkipRun(const std::string &reason)
{
    if (g_rank.rank < 0)
        Fail(__FILE__, __LINE__, "SkipRun called outside a rank process");
    fprintf(stderr, "rank %d: the test is skipped: %s\n", g_rank.rank, reason.c_str());
    std::ofstream out(SkipFile(g_rank.rank), std::ios::trunc);
    out << (reason.empty() ? std::string("skipped by the rank") : reason) << "\n";
    if (!out.flush())
        Fail(__FILE__, __LINE__, "cannot write " + SkipFile(g_rank.rank));
}

const std::string &LastRunSkipReason()
{
    return g_skip_reason;
}

// Per thread: the device suite runs ranks as threads of one process too.
static thread_local std::string t_context;

void SetContext(const std::string &context)
{
    t_context = context;
}

void Fail(const char *file, int line, const std::string &message)
{
    const char *base = strrchr(file, '/');
    fprintf(stderr, "rank %d %s:%d: %s\n", g_rank.rank, base ? base + 1 : file, line,
            message.c_str());
    if (!t_context.empty())
        fprintf(stderr, "rank %d   while: %s\n", g_rank.rank, t_context.c_str());
    fflush(stdout);
    _exit(kExitCheckFailed);
}

void FailLoom(const char *file, int line, const char *call, loomResult_t got, loomResult_t expected)
{
    const char *last = loomGetLastError(nullptr);
    Fail(file, line,
         std::string(call) + " returned " + Show(got) + ", expected " + Show(expected) +
             "; last error: '" + (last ? last : "(null)") + "'");
}

std::string Show(loomResult_t r)
{
    const char *s = loomGetErrorString(r);
    return std::to_string(static_cast<int>(r)) + " (" + (s ? s : "null") + ")";
}

void ShareFromRank0(void *data, size_t nbytes)
{
    if (g_rank.rank < 0)
        Fail(__FILE__, __LINE__, "ShareFromRank0 called outside a rank process");
    if (g_rank.rank == 0) {
        for (int r = 1; r < g_rank.nranks; r++)
            if (!WriteAll(g_rank.share_to[static_cast<size_t>(r)], data, nbytes))
                Fail(__FILE__, __LINE__,
                     "cannot send " + std::to_string(nbytes) + " bytes to rank " +
                         std::to_string(r) + ": " + strerror(errno));
        return;
    }
    if (!ReadAll(g_rank.share_fd, data, nbytes))
        Fail(__FILE__, __LINE__,
             "rank 0 exited before sending " + std::to_string(nbytes) + " bytes");
}

void ShareUniqueId(loomUniqueId *id)
{
    if (g_rank.rank == 0)
        XT_CHECK_LOOM(loomGetUniqueId(id));
    ShareFromRank0(id, sizeof(*id));
}

loomComm_t CreateComm(const loomConfig_t *config)
{
    loomUniqueId id;
    memset(&id, 0, sizeof(id));
    ShareUniqueId(&id);
    loomComm_t comm = nullptr;
    XT_CHECK_LOOM(loomCommInitRankConfig(&comm, g_rank.nranks, id, g_rank.rank,
                                         const_cast<loomConfig_t *>(config)));
    XT_CHECK(comm != nullptr);
    return comm;
}

::testing::AssertionResult RunRanks(int nranks, const RankBody &body, const RunOptions &opts)
{
    if (nranks < 1)
        return ::testing::AssertionFailure() << "RunRanks: nranks " << nranks << " < 1";
    if (!opts.expected_exit.empty() && opts.expected_exit.size() != static_cast<size_t>(nranks))
        return ::testing::AssertionFailure()
               << "RunRanks: expected_exit has " << opts.expected_exit.size() << " entries for "
               << nranks << " ranks";
    const char *tmp = getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/loom-test-XXXXXX";
    std::vector<char> dir(templ.begin(), templ.end());
    dir.push_back('\0');
    g_skip_reason.clear();
    if (mkdtemp(dir.data()) == nullptr)
        return ::testing::AssertionFailure() << "mkdtemp " << templ << ": " << strerror(errno);
    g_run_dir = dir.data();

    // Pipes from rank 0 to each other rank, made before any fork.
    std::vector<int> share_rd(static_cast<size_t>(nranks), -1);
    std::vector<int> share_wr(static_cast<size_t>(nranks), -1);
    std::vector<int> parent_fds; // every descriptor a rank must not inherit
    for (int r = 1; r < nranks; r++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0)
            return ::testing::AssertionFailure() << "pipe: " << strerror(errno);
        share_rd[static_cast<size_t>(r)] = p[0];
        share_wr[static_cast<size_t>(r)] = p[1];
    }

    fflush(nullptr); // buffered gtest output must not be duplicated into the ranks
    const pid_t parent = getpid();
    std::vector<Child> kids(static_cast<size_t>(nranks));
    std::string start_error;
    for (int r = 0; r < nranks; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            std::vector<int> close_fds = parent_fds;
            for (int q = 1; q < nranks; q++) {
                const size_t i = static_cast<size_t>(q);
                if (q != r)
                    close_fds.push_back(share_rd[i]);
                if (r != 0)
                    close_fds.push_back(share_wr[i]);
            }
            RankMain(r, nranks, body, opts, parent, close_fds,
                     r > 0 ? share_rd[static_cast<size_t>(r)] : -1,
                     r == 0 ? share_wr : std::vector<int>());
        }
        if (pid < 0) {
            start_error = std::string("fork: ") + strerror(errno);
            break;
        }
        setpgid(pid, pid); // also done by the rank; whichever runs first wins
        Child &c = kids[static_cast<size_t>(r)];
        c.pid = pid;
        c.pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
        if (c.pidfd >= 0) {
            fcntl(c.pidfd, F_SETFD, FD_CLOEXEC);
            parent_fds.push_back(c.pidfd);
        }
    }
    for (int r = 1; r < nranks; r++) {
        close(share_rd[static_cast<size_t>(r)]);
        close(share_wr[static_cast<size_t>(r)]);
    }

    if (opts.pids_out != nullptr) {
        opts.pids_out->clear();
        for (const Child &c : kids)
            opts.pids_out->push_back(static_cast<int>(c.pid));
    }
    auto kill_at_end = [&opts](int r) {
        for (int k : opts.kill_when_others_exit)
            if (k == r)
                return true;
        return false;
    };

    // Watchdog: wait for every rank to exit, up to the deadline.
    const double t0 = NowSeconds();
    const double deadline = t0 + (start_error.empty() ? opts.deadline_s : 0.0);
    for (;;) {
        std::vector<pollfd> fds;
        bool running = false, blind = false; // blind: a running rank without a pidfd
        bool others_running = false;         // a rank not listed in kill_when_others_exit
        for (int r = 0; r < nranks; r++) {
            Child &c = kids[static_cast<size_t>(r)];
            if (c.pid > 0 && !c.done)
                Reap(c, false);
            if (c.pid > 0 && !c.done && !kill_at_end(r))
                others_running = true;
        }
        if (!others_running)
            for (int r : opts.kill_when_others_exit)
                if (r >= 0 && r < nranks && kids[static_cast<size_t>(r)].pid > 0 &&
                    !kids[static_cast<size_t>(r)].done) {
                    killpg(kids[static_cast<size_t>(r)].pid, SIGKILL);
                    kill(kids[static_cast<size_t>(r)].pid, SIGKILL);
                    Reap(kids[static_cast<size_t>(r)], true);
                }
        for (Child &c : kids) {
            if (c.pid <= 0 || c.done)
                continue;
            running = true;
            if (c.pidfd >= 0)
                fds.push_back({c.pidfd, POLLIN, 0});
            else
                blind = true;
        }
        const double left = deadline - NowSeconds();
        if (!running || left <= 0)
            break;
        int wait_ms = static_cast<int>(left * 1000.0) + 1;
        if (blind && wait_ms > 20)
            wait_ms = 20;
        if (poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR)
            break;
    }
    for (Child &c : kids) {
        if (c.pid > 0 && !c.done) {
            killpg(c.pid, SIGKILL);
            kill(c.pid, SIGKILL);
            Reap(c, true);
            c.timed_out = true;
        }
    }
    const double elapsed = NowSeconds() - t0;

    std::ostringstream why;
    bool ok = start_error.empty();
    if (!ok)
        why << "could not start every rank: " << start_error << "\n";
    for (int r = 0; r < nranks; r++) {
        const Child &c = kids[static_cast<size_t>(r)];
        const int expect =
            opts.expected_exit.empty() ? kExitOk : opts.expected_exit[static_cast<size_t>(r)];
        if (c.pid <= 0)
            continue;
        if (c.timed_out) {
            ok = false;
            why << "rank " << r << " timed out (deadline " << opts.deadline_s << " s)\n";
        } else if (c.code != expect) {
            ok = false;
            why << "rank " << r << ": " << DescribeStatus(c.code) << ", expected "
                << DescribeStatus(expect) << "\n";
        }
    }
    if (ok) {
        g_skip_reason = ReadSkipReason(nranks);
        if (getenv("LOOMTEST_KEEP_LOGS") != nullptr) {
            printf("rank logs kept in %s\n", g_run_dir.c_str());
        } else {
            std::error_code ec;
            std::filesystem::remove_all(g_run_dir, ec);
        }
        return ::testing::AssertionSuccess();
    }
    why << nranks << " ranks ran " << elapsed << " s; logs in " << g_run_dir << "\n";
    for (int r = 0; r < nranks; r++)
        why << "----- rank " << r << " log -----\n"
            << ReadLogTail(g_run_dir + "/rank" + std::to_string(r) + ".log", 16384);
    return ::testing::AssertionFailure() << why.str();
}

} // namespace loomtest
