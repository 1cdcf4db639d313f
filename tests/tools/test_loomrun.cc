/* SPDX-License-Identifier: Apache-2.0
 *
 * Tests of the loomrun launcher, run as a subprocess (its path comes in the
 * LOOMRUN environment variable): the variables each rank gets, host groups,
 * line labels, failure and signal handling, timeouts, CPU binding and usage
 * errors. The ranks are small sh scripts, so libloom is not involved: these
 * tests do not check that the library accepts what loomrun sets. Run by
 * meson's 'tools' suite.
 */
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

double now_s()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

std::vector<std::string> split_lines(const std::string &s)
{
    std::vector<std::string> lines;
    std::istringstream in(s);
    for (std::string line; std::getline(in, line);)
        lines.push_back(line);
    return lines;
}

std::vector<std::string> split_words(const std::string &s)
{
    std::vector<std::string> words;
    std::istringstream in(s);
    for (std::string w; in >> w;)
        words.push_back(w);
    return words;
}

/* std::regex is avoided: GCC 12 warns inside it under -O2 with sanitizers. */
bool is_secret(const std::string &s)
{
    return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

bool is_number(const std::string &s)
{
    return !s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos;
}

/* Whether text has a line "<head><number><tail>", as in a message naming a pid. */
bool has_line(const std::string &text, const std::string &head, const std::string &tail)
{
    for (const auto &line : split_lines(text)) {
        if (line.rfind(head, 0) != 0 || line.size() < head.size() + tail.size())
            continue;
        std::string mid = line.substr(head.size(), line.size() - head.size() - tail.size());
        if (is_number(mid) && line.compare(line.size() - tail.size(), tail.size(), tail) == 0)
            return true;
    }
    return false;
}

/* Splits "[R] rest" into R and rest; R is -1 when the label is missing. */
std::pair<int, std::string> unlabel(const std::string &line)
{
    size_t close = line.find("] ");
    if (line.empty() || line[0] != '[' || close == std::string::npos ||
        !is_number(line.substr(1, close - 1)))
        return {-1, line};
    return {std::stoi(line.substr(1, close - 1)), line.substr(close + 2)};
}

/* One loomrun process with its stdout and stderr captured. */
class Launch {
  public:
    std::string out, err;
    int status = -1;
    double started = now_s(), elapsed = 0;

    explicit Launch(const std::vector<std::string> &args,
                    const std::vector<std::pair<std::string, const char *>> &env = {})
    {
        const char *path = getenv("LOOMRUN");
        if (!path) {
            ADD_FAILURE() << "LOOMRUN must name the loomrun program";
            return;
        }
        int o[2], e[2];
        if (pipe2(o, O_CLOEXEC) || pipe2(e, O_CLOEXEC)) {
            ADD_FAILURE() << "pipe: " << strerror(errno);
            return;
        }
        std::vector<char *> argv{const_cast<char *>(path)};
        for (const auto &a : args)
            argv.push_back(const_cast<char *>(a.c_str()));
        argv.push_back(nullptr);
        pid_ = fork();
        if (pid_ == 0) {
            dup2(o[1], 1);
            dup2(e[1], 2);
            /* The signal tests need default dispositions, whatever ran us. */
            for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE})
                signal(sig, SIG_DFL);
            for (const auto &[name, value] : env) {
                if (value)
                    setenv(name.c_str(), value, 1);
                else
                    unsetenv(name.c_str());
            }
            execv(path, argv.data());
            _exit(126);
        }
        close(o[1]);
        close(e[1]);
        fds_[0] = o[0];
        fds_[1] = e[0];
    }

    ~Launch()
    {
        if (pid_ > 0 && status < 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        for (int fd : fds_)
            if (fd >= 0)
                close(fd);
    }

    pid_t pid() const
    {
        return pid_;
    }

    /* Reads output until pred(out) holds; false after timeout_s. */
    bool wait_for(const std::function<bool(const std::string &)> &pred, double timeout_s = 5)
    {
        double end = now_s() + timeout_s;
        while (!pred(out)) {
            if (now_s() > end || !pump(50))
                return pred(out);
        }
        return true;
    }

    /* Waits for loomrun to exit (killing it after timeout_s) and returns its
     * wait status. Ranks that outlive it may hold the pipes open, so the end
     * is its exit, not end of file. */
    int finish(double timeout_s = 8)
    {
        double end = now_s() + timeout_s;
        while (pid_ > 0 && status < 0) {
            int st;
            if (waitpid(pid_, &st, WNOHANG) == pid_) {
                status = st;
                elapsed = now_s() - started;
                break;
            }
            if (now_s() > end) {
                ADD_FAILURE() << "loomrun still running after " << timeout_s << " s";
                kill(pid_, SIGKILL);
                waitpid(pid_, &status, 0);
                elapsed = now_s() - started;
                break;
            }
            pump(20);
        }
        while (pump(0))
            ;
        return status;
    }

    int exit_code()
    {
        finish();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }

  private:
    pid_t pid_ = -1;
    int fds_[2] = {-1, -1};

    /* Reads what arrives within wait_ms; false once nothing more can come. */
    bool pump(int wait_ms)
    {
        pollfd p[2];
        int n = 0;
        for (int fd : fds_)
            if (fd >= 0)
                p[n++] = {fd, POLLIN, 0};
        if (n == 0 || poll(p, n, wait_ms) <= 0)
            return n > 0 && wait_ms > 0;
        for (int i = 0; i < n; i++) {
            if (!p[i].revents)
                continue;
            char buf[65536];
            ssize_t r = read(p[i].fd, buf, sizeof(buf));
            int k = p[i].fd == fds_[0] ? 0 : 1;
            if (r > 0) {
                (k == 0 ? out : err).append(buf, size_t(r));
            } else {
                close(fds_[k]);
                fds_[k] = -1;
            }
        }
        return true;
    }
};

/* The rank's view of one variable per word, one line per rank. */
const char *kEnvScript = "echo $LOOM_RANK $LOOM_WORLD_SIZE $LOOM_LOCAL_RANK $LOOM_LOCAL_SIZE "
                         "$LOOM_COMM_ID $LOOM_SECRET ${LOOM_HOST_ID-unset}";

std::map<int, std::vector<std::string>> by_rank(const std::string &out)
{
    std::map<int, std::vector<std::string>> rows;
    for (const auto &line : split_lines(out)) {
        auto w = split_words(line);
        EXPECT_EQ(w.size(), 7u) << line;
        if (w.size() == 7)
            rows[std::stoi(w[0])] = w;
    }
    return rows;
}

/* CPUs as listed in /proc/<pid>/status: "0-3,8". */
std::vector<int> expand_cpu_list(const std::string &list)
{
    std::vector<int> cpus;
    std::istringstream in(list);
    for (std::string part; std::getline(in, part, ',');) {
        size_t dash = part.find('-');
        int lo = std::stoi(part.substr(0, dash));
        int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
        for (int c = lo; c <= hi; c++)
            cpus.push_back(c);
    }
    return cpus;
}

std::string own_cpu_list()
{
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("Cpus_allowed_list:", 0) == 0)
            return split_words(line)[1];
    return "";
}

/* Whether pid has exited (a zombie counts: nobody may be reaping orphans). */
bool gone(pid_t pid)
{
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line))
        return true;
    size_t paren = line.rfind(')');
    return paren != std::string::npos && line.compare(paren + 2, 1, "Z") == 0;
}

bool all_gone(const std::vector<pid_t> &pids, double timeout_s)
{
    double end = now_s() + timeout_s;
    for (pid_t pid : pids) {
        while (!gone(pid)) {
            if (now_s() > end)
                return false;
            usleep(10000);
        }
    }
    return true;
}

/* Starts n ranks that print their pid and then sleep; returns the pids. */
std::vector<pid_t> start_sleepers(Launch &run, int n)
{
    auto have_all = [n](const std::string &out) { return (int)split_lines(out).size() >= n; };
    EXPECT_TRUE(run.wait_for(have_all)) << run.out << run.err;
    std::vector<pid_t> pids;
    for (const auto &line : split_lines(run.out))
        pids.push_back(std::stoi(line));
    return pids;
}

TEST(Loomrun, SetsTheEnvironmentOfEveryRank)
{
    Launch run({"-n", "4", "sh", "-c", kEnvScript}, {{"LOOM_RANK", "77"},
                                                     {"LOOM_WORLD_SIZE", "99"},
                                                     {"LOOM_LOCAL_SIZE", "99"},
                                                     {"LOOM_COMM_ID", "example.org:1"},
                                                     {"LOOM_SECRET", "00"},
                                                     {"LOOM_HOST_ID", nullptr}});
    ASSERT_EQ(run.exit_code(), 0) << run.err;
    EXPECT_EQ(run.err, "");
    auto rows = by_rank(run.out);
    ASSERT_EQ(rows.size(), 4u) << run.out;
    const std::string local = "127.0.0.1:";
    for (int r = 0; r < 4; r++) {
        const auto &w = rows[r];
        EXPECT_EQ(w[1], "4");
        EXPECT_EQ(w[2], std::to_string(r));
        EXPECT_EQ(w[3], "4");
        ASSERT_EQ(w[4].rfind(local, 0), 0u) << w[4];
        ASSERT_TRUE(is_number(w[4].substr(local.size()))) << w[4];
        int port = std::stoi(w[4].substr(local.size()));
        EXPECT_TRUE(port > 0 && port < 65536);
        EXPECT_EQ(w[4], rows[0][4]) << "every rank must meet at the same address";
        EXPECT_TRUE(is_secret(w[5])) << w[5];
        EXPECT_EQ(w[5], rows[0][5]);
        EXPECT_EQ(w[6], "unset");
    }
}

TEST(Loomrun, KeepsAnInheritedHostIdWithoutHostGroups)
{
    Launch run({"-n", "2", "sh", "-c", kEnvScript}, {{"LOOM_HOST_ID", "rack7"}});
    ASSERT_EQ(run.exit_code(), 0) << run.err;
    auto rows = by_rank(run.out);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0][6], "rack7");
    EXPECT_EQ(rows[1][6], "rack7");
}

TEST(Loomrun, SecretIsFreshForEveryRun)
{
    Launch a({"-n", "1", "sh", "-c", "echo $LOOM_SECRET"});
    Launch b({"-n", "1", "sh", "-c", "echo $LOOM_SECRET"});
    ASSERT_EQ(a.exit_code(), 0);
    ASSERT_EQ(b.exit_code(), 0);
    EXPECT_TRUE(is_secret(a.out.substr(0, 32)) && a.out.size() == 33) << a.out;
    EXPECT_TRUE(is_secret(b.out.substr(0, 32)) && b.out.size() == 33) << b.out;
    EXPECT_NE(a.out, b.out);
}

TEST(Loomrun, HostGroupsSplitRanksContiguously)
{
    struct Want {
        int local_rank, local_size;
        const char *host;
    };
    const std::vector<std::pair<std::vector<std::string>, std::vector<Want>>> cases = {
        {{"-n", "5", "--host-groups", "2"},
         {{0, 3, "host0"}, {1, 3, "host0"}, {2, 3, "host0"}, {0, 2, "host1"}, {1, 2, "host1"}}},
        {{"-n", "4", "--host-groups=4"},
         {{0, 1, "host0"}, {0, 1, "host1"}, {0, 1, "host2"}, {0, 1, "host3"}}},
        {{"-n", "3", "--host-groups", "1"}, {{0, 3, "host0"}, {1, 3, "host0"}, {2, 3, "host0"}}},
        {{"-n", "4", "--host-groups", "2", "--host-map", "block"},
         {{0, 2, "host0"}, {1, 2, "host0"}, {0, 2, "host1"}, {1, 2, "host1"}}},
        // cyclic: rank r on host r mod G, as a round-robin launcher deals them
        {{"-n", "5", "--host-groups", "2", "--host-map", "cyclic"},
         {{0, 3, "host0"}, {0, 2, "host1"}, {1, 3, "host0"}, {1, 2, "host1"}, {2, 3, "host0"}}},
    };
    for (const auto &[args, want] : cases) {
        auto argv = args;
        argv.insert(argv.end(), {"sh", "-c", kEnvScript});
        Launch run(argv, {{"LOOM_HOST_ID", "overridden"}});
        ASSERT_EQ(run.exit_code(), 0) << run.err;
        auto rows = by_rank(run.out);
        ASSERT_EQ(rows.size(), want.size()) << run.out;
        for (size_t r = 0; r < want.size(); r++) {
            EXPECT_EQ(rows[int(r)][2], std::to_string(want[r].local_rank)) << "rank " << r;
            EXPECT_EQ(rows[int(r)][3], std::to_string(want[r].local_size)) << "rank " << r;
            EXPECT_EQ(rows[int(r)][6], want[r].host) << "rank " << r;
        }
    }
}

TEST(Loomrun, LabelsEveryLineOfBothStreams)
{
    Launch run({"-l", "-n", "3", "sh", "-c",
                "echo out $LOOM_RANK; echo err $LOOM_RANK >&2; echo more $LOOM_RANK; "
                "printf 'tail %s' $LOOM_RANK"});
    ASSERT_EQ(run.exit_code(), 0) << run.err;
    std::map<int, std::vector<std::string>> seen;
    for (const auto &line : split_lines(run.out)) {
        auto [rank, text] = unlabel(line);
        auto w = split_words(text);
        ASSERT_EQ(w.size(), 2u) << line;
        EXPECT_EQ(w[1], std::to_string(rank)) << line;
        seen[rank].push_back(w[0]);
    }
    for (int r = 0; r < 3; r++)
        EXPECT_EQ(seen[r], (std::vector<std::string>{"out", "more", "tail"})) << "rank " << r;
    EXPECT_EQ(run.out.back(), '\n') << "a partial last line is ended";
    auto errs = split_lines(run.err);
    EXPECT_EQ(errs.size(), 3u) << run.err;
    for (const auto &line : errs) {
        auto [rank, text] = unlabel(line);
        EXPECT_EQ(text, "err " + std::to_string(rank)) << line;
    }
}

TEST(Loomrun, LabelsKeepEveryByteOfLargeOutput)
{
    /* seq writes in blocks that split lines; the long line exceeds the
     * launcher's line buffer and must come out in labelled pieces. */
    Launch run({"-l", "-n", "3", "sh", "-c",
                "seq -f \"$LOOM_RANK %g\" 1 20000; "
                "if [ $LOOM_RANK = 0 ]; then head -c 200000 /dev/zero | tr '\\0' x; echo; fi"});
    ASSERT_EQ(run.exit_code(), 0) << run.err;
    std::map<int, int> next;
    std::string long_line;
    for (const auto &line : split_lines(run.out)) {
        auto [rank, text] = unlabel(line);
        if (rank == 0 && text.rfind("x", 0) == 0) {
            long_line += text;
            continue;
        }
        ASSERT_EQ(text, std::to_string(rank) + " " + std::to_string(++next[rank])) << line;
    }
    for (int r = 0; r < 3; r++)
        EXPECT_EQ(next[r], 20000);
    EXPECT_EQ(long_line, std::string(200000, 'x'));
}

TEST(Loomrun, FailingRankStopsTheOthers)
{
    Launch run({"-n", "4", "sh", "-c", "if [ $LOOM_RANK = 2 ]; then exit 3; fi; exec sleep 30"});
    EXPECT_EQ(run.exit_code(), 3) << run.err;
    EXPECT_LT(run.elapsed, 5);
    EXPECT_TRUE(has_line(run.err, "loomrun: rank 2 (pid ", ") exited with status 3")) << run.err;
    EXPECT_NE(run.err.find("loomrun: killing the remaining 3 ranks"), std::string::npos) << run.err;
}

TEST(Loomrun, RankKilledBySignal)
{
    Launch run(
        {"-n", "2", "sh", "-c", "if [ $LOOM_RANK = 1 ]; then kill -KILL $$; fi; exec sleep 30"});
    EXPECT_EQ(run.exit_code(), 137) << run.err;
    EXPECT_LT(run.elapsed, 5);
    EXPECT_TRUE(has_line(run.err, "loomrun: rank 1 (pid ", ") killed by signal SIGKILL"))
        << run.err;
    EXPECT_NE(run.err.find("killing the remaining 1 rank\n"), std::string::npos) << run.err;
}

/* --keep-going: the others run to their end; loomrun waits for them and exits with the first
 * failure's status, naming every failed rank. */
TEST(Loomrun, KeepGoingLetsTheOthersFinish)
{
    Launch run({"--keep-going", "-n", "4", "sh", "-c",
                "if [ $LOOM_RANK = 1 ]; then kill -KILL $$; fi; sleep 1; "
                "if [ $LOOM_RANK = 3 ]; then exit 5; fi; echo done $LOOM_RANK"});
    EXPECT_EQ(run.exit_code(), 137) << run.err;
    EXPECT_GE(run.elapsed, 1);
    EXPECT_TRUE(has_line(run.err, "loomrun: rank 1 (pid ", ") killed by signal SIGKILL"))
        << run.err;
    EXPECT_TRUE(has_line(run.err, "loomrun: rank 3 (pid ", ") exited with status 5")) << run.err;
    EXPECT_EQ(run.err.find("killing the remaining"), std::string::npos) << run.err;
    for (int r : {0, 2})
        EXPECT_NE(run.out.find("done " + std::to_string(r) + "\n"), std::string::npos) << run.out;
    Launch ok({"--keep-going", "-n", "2", "true"});
    EXPECT_EQ(ok.exit_code(), 0) << ok.err;
}

TEST(Loomrun, RanksIgnoringSigtermGetSigkill)
{
    /* The fifo holds rank 0's failure back until rank 1 ignores SIGTERM. */
    const char *tmp = getenv("TMPDIR");
    std::string dir = std::string(tmp ? tmp : "/tmp") + "/loomrun-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr) << dir;
    std::string fifo = dir + "/ready";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    Launch run({"-n", "2", "sh", "-c",
                "if [ $LOOM_RANK = 0 ]; then read x < \"$READY\"; exit 1; fi; "
                "trap '' TERM; echo > \"$READY\"; exec sleep 30"},
               {{"READY", fifo.c_str()}});
    EXPECT_EQ(run.exit_code(), 1) << run.err;
    EXPECT_GT(run.elapsed, 1.5);
    EXPECT_LT(run.elapsed, 6);
    unlink(fifo.c_str());
    rmdir(dir.c_str());
}

TEST(Loomrun, ForwardsSignalsToTheRanks)
{
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
        Launch run({"-n", "3", "sh", "-c", "echo $$; exec sleep 30"});
        auto pids = start_sleepers(run, 3);
        ASSERT_EQ(pids.size(), 3u);
        kill(run.pid(), sig);
        run.finish();
        EXPECT_TRUE(WIFSIGNALED(run.status) && WTERMSIG(run.status) == sig)
            << strsignal(sig) << ": status " << run.status << " " << run.err;
        EXPECT_LT(run.elapsed, 5);
        EXPECT_TRUE(all_gone(pids, 1)) << strsignal(sig);
    }
}

TEST(Loomrun, RanksDieWithAKilledLauncher)
{
    Launch run({"-n", "2", "sh", "-c", "echo $$; exec sleep 30"});
    auto pids = start_sleepers(run, 2);
    ASSERT_EQ(pids.size(), 2u);
    kill(run.pid(), SIGKILL);
    run.finish();
    EXPECT_TRUE(all_gone(pids, 5));
}

TEST(Loomrun, TimeoutNamesTheRanksStillRunning)
{
    Launch run({"--timeout", "1", "-n", "3", "sh", "-c",
                "if [ $LOOM_RANK = 1 ]; then exit 0; fi; exec sleep 30"});
    EXPECT_EQ(run.exit_code(), 124) << run.err;
    EXPECT_GT(run.elapsed, 0.9);
    EXPECT_LT(run.elapsed, 5);
    EXPECT_NE(run.err.find("ranks still running: 0,2\n"), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("killing the remaining 2 ranks"), std::string::npos) << run.err;
}

TEST(Loomrun, TimeoutDoesNotFireForAFinishedJob)
{
    Launch run({"--timeout", "30", "-n", "2", "true"});
    EXPECT_EQ(run.exit_code(), 0) << run.err;
    EXPECT_LT(run.elapsed, 5);
    EXPECT_EQ(run.err, "");
}

TEST(Loomrun, ProgramThatCannotRunExits127)
{
    for (const char *prog : {"/nonexistent/program", "loomrun-test-no-such-program"}) {
        Launch run({"-n", "2", prog, "arg"});
        EXPECT_EQ(run.exit_code(), 127) << run.err;
        std::string said =
            std::string("loomrun: cannot run ") + prog + ": No such file or directory\nHINT: ";
        size_t at = run.err.find(said);
        EXPECT_NE(at, std::string::npos) << run.err;
        EXPECT_EQ(run.err.find(said, at + 1), std::string::npos) << "said once: " << run.err;
        EXPECT_NE(run.err.find("exited with status 127"), std::string::npos) << run.err;
    }
}

TEST(Loomrun, PassesProgramArgumentsUntouched)
{
    Launch run({"-n", "1", "printf", "%s|", "-l", "-n", "a b", "--timeout"});
    EXPECT_EQ(run.exit_code(), 0) << run.err;
    EXPECT_EQ(run.out, "-l|-n|a b|--timeout|");
    Launch dashes({"-n", "1", "--", "printf", "%s|", "x"});
    EXPECT_EQ(dashes.exit_code(), 0) << dashes.err;
    EXPECT_EQ(dashes.out, "x|");
}

TEST(Loomrun, UsageErrorsExit2WithAHint)
{
    const std::vector<std::vector<std::string>> bad = {
        {},
        {"true"},
        {"-n"},
        {"-n", "0", "true"},
        {"-n", "4097", "true"},
        {"-n", "two", "true"},
        {"-n", "2"},
        {"-n", "2", "--bind", "socket", "true"},
        {"-n", "2", "--host-groups", "3", "true"},
        {"-n", "2", "--host-groups", "0", "true"},
        {"-n", "2", "--host-groups", "2", "--host-map", "random", "true"},
        {"-n", "2", "--timeout", "0", "true"},
        {"-n", "2", "--timeout", "soon", "true"},
        {"-x", "-n", "2", "true"},
        {"--frobnicate", "-n", "2", "true"},
    };
    for (const auto &args : bad) {
        std::string shown;
        for (const auto &a : args)
            shown += a + " ";
        Launch run(args);
        EXPECT_EQ(run.exit_code(), 2) << shown << run.err;
        EXPECT_EQ(run.err.rfind("loomrun: ", 0), 0u) << shown << run.err;
        EXPECT_NE(run.err.find("\nHINT: "), std::string::npos) << shown << run.err;
        EXPECT_EQ(run.out, "");
    }
}

TEST(Loomrun, HelpPrintsUsage)
{
    for (const char *flag : {"-h", "--help"}) {
        Launch run({flag});
        EXPECT_EQ(run.exit_code(), 0);
        EXPECT_EQ(run.out.rfind("usage: loomrun -n N", 0), 0u) << run.out;
        EXPECT_EQ(run.err, "");
    }
}

const char *kAffinityScript =
    "while read key value; do "
    "if [ \"$key\" = Cpus_allowed_list: ]; then echo $LOOM_RANK $value; fi; "
    "done < /proc/self/status";

TEST(Loomrun, BindsEachRankToOneCpuByDefault)
{
    auto cpus = expand_cpu_list(own_cpu_list());
    ASSERT_FALSE(cpus.empty());
    int n = int(cpus.size()) + 1; /* one more rank than CPUs: the first is shared */
    Launch run({"-n", std::to_string(n), "sh", "-c", kAffinityScript});
    ASSERT_EQ(run.exit_code(), 0) << run.err;
    std::map<int, std::string> got;
    for (const auto &line : split_lines(run.out)) {
        auto w = split_words(line);
        ASSERT_EQ(w.size(), 2u) << line;
        got[std::stoi(w[0])] = w[1];
    }
    ASSERT_EQ(int(got.size()), n) << run.out;
    for (int r = 0; r < n; r++)
        EXPECT_EQ(got[r], std::to_string(cpus[size_t(r) % cpus.size()])) << "rank " << r;
}

TEST(Loomrun, BindNoneLeavesAffinityAlone)
{
    std::string own = own_cpu_list();
    Launch run({"--bind", "none", "-n", "2", "sh", "-c", kAffinityScript});
    ASSERT_EQ(run.exit_code(), 0) << run.err;
    auto lines = split_lines(run.out);
    ASSERT_EQ(lines.size(), 2u) << run.out;
    for (const auto &line : lines)
        EXPECT_EQ(split_words(line).at(1), own) << line;
}

TEST(Loomrun, VerboseDescribesEachRank)
{
    Launch run({"-v", "-n", "3", "--host-groups", "2", "true"});
    ASSERT_EQ(run.exit_code(), 0) << run.err;
    EXPECT_NE(run.err.find("rank 0: local rank 0 of 2, host id host0, cpu "), std::string::npos)
        << run.err;
    EXPECT_NE(run.err.find("rank 2: local rank 0 of 1, host id host1, cpu "), std::string::npos)
        << run.err;
    EXPECT_EQ(run.err.find("LOOM_SECRET"), std::string::npos) << "the secret stays out of logs";
}

} // namespace
