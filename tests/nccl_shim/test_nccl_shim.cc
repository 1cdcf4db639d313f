/* SPDX-License-Identifier: Apache-2.0
 *
 * Tests of libloom-nccl.so's forward mode, its search for the real NCCL, its
 * isolation from the real library's calls to its own API, its errors and its
 * log. Each case runs shim_probe (SHIM_PROBE), a program linked against the
 * shim, in a fresh process with its own environment, since the shim settles
 * its mode and its real library once per process. Cases that need the real
 * libnccl.so.2 (NCCL_REAL, found beside the toolkit at configure time) are
 * skipped without it. ProbeRun by meson's 'nccl_shim' suite.
 */
#include <gtest/gtest.h>

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nccl.h>

extern char **environ;

namespace {

struct ProbeRun {
    int status = -1; /* exit code, or -1 if the probe did not exit normally */
    std::string out, err;
    std::map<std::string, std::string> kv; /* the key=value lines of out */
};

std::string env_or_empty(const char *name)
{
    const char *v = std::getenv(name);
    return v ? v : "";
}

/* Runs the probe with the test's environment less every variable the shim
 * reads, plus vars; gives up (and kills it) after 60 s. */
ProbeRun probe(const std::vector<std::string> &args, const std::vector<std::string> &vars)
{
    static const char *const cleared[] = {
        "LOOM_NCCL_", "LOOM_DEBUG", "NCCL_HOME=", "CUDA_HOME=", "CUDA_PATH=", "LD_PRELOAD="};
    std::vector<std::string> env;
    for (char **e = environ; *e; e++) {
        bool keep = true;
        for (const char *p : cleared)
            keep = keep && std::strncmp(*e, p, std::strlen(p)) != 0;
        if (keep)
            env.push_back(*e);
    }
    env.insert(env.end(), vars.begin(), vars.end());
    std::vector<std::string> argv = {env_or_empty("SHIM_PROBE")};
    argv.insert(argv.end(), args.begin(), args.end());

    int out[2], err[2];
    ProbeRun r;
    if (pipe(out) != 0 || pipe(err) != 0)
        return r;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(err[0]);
        std::vector<char *> a, e;
        for (auto &s : argv)
            a.push_back(const_cast<char *>(s.c_str()));
        a.push_back(nullptr);
        for (auto &s : env)
            e.push_back(const_cast<char *>(s.c_str()));
        e.push_back(nullptr);
        execve(a[0], a.data(), e.data());
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    struct pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    std::string *bufs[2] = {&r.out, &r.err};
    int open_fds = 2, waited_ms = 0;
    while (open_fds > 0 && waited_ms < 60000) {
        int n = poll(fds, 2, 100);
        if (n == 0)
            waited_ms += 100;
        if (n < 0 && errno != EINTR)
            break;
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP)))
                continue;
            char buf[4096];
            ssize_t got = read(fds[i].fd, buf, sizeof(buf));
            if (got > 0) {
                bufs[i]->append(buf, (size_t)got);
            } else {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            }
        }
    }
    if (open_fds > 0)
        kill(pid, SIGKILL);
    for (auto &f : fds)
        if (f.fd >= 0)
            close(f.fd);
    int st = 0;
    waitpid(pid, &st, 0);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
        size_t eq = line.find('=');
        if (eq != std::string::npos)
            r.kv[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return r;
}

/* Lines of text that contain needle. */
int count_lines(const std::string &text, const std::string &needle)
{
    std::istringstream in(text);
    int n = 0;
    for (std::string line; std::getline(in, line);)
        n += line.find(needle) != std::string::npos;
    return n;
}

bool contains(const std::string &text, const std::string &needle)
{
    return text.find(needle) != std::string::npos;
}

std::string real_library()
{
    std::string path = env_or_empty("NCCL_REAL");
    struct stat st;
    return !path.empty() && stat(path.c_str(), &st) == 0 ? path : "";
}

#define REQUIRE_REAL(path)                                                                         \
    std::string path = real_library();                                                             \
    if (path.empty())                                                                              \
    GTEST_SKIP() << "no real libnccl.so.2 was found beside the CUDA toolkit at configure time"

const std::vector<std::string> kTrace = {"LOOM_NCCL_MODE=forward", "LOOM_DEBUG=INFO",
                                         "LOOM_DEBUG_SUBSYS=SHIM"};

std::vector<std::string> with(std::vector<std::string> vars, const std::string &more)
{
    vars.push_back(more);
    return vars;
}

/* Whether this build is sanitized (the probe and the shim are built alike):
 * the sanitizers refuse RTLD_DEEPBIND, so the shim goes without it. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

TEST(ForwardReal, VersionUniqueIdInitAndTheRealLastError)
{
    REQUIRE_REAL(real);
    ProbeRun r = probe({"basics"}, {"LOOM_NCCL_MODE=forward", "LOOM_NCCL_LIBRARY=" + real});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.kv["version_result"], "0");
    EXPECT_EQ(r.kv["version"], std::to_string(NCCL_VERSION_CODE)) << "the real library's version";
    EXPECT_EQ(r.kv["uniqueid_result"], "0");
    EXPECT_EQ(r.kv["uniqueid_nonzero"], "1");
    if (r.kv["init_result"] == "0") { /* a GPU is there: the communicator must work */
        EXPECT_EQ(r.kv["count_result"], "0");
        EXPECT_EQ(r.kv["count"], "1");
        EXPECT_EQ(r.kv["destroy_result"], "0");
    } else {
        EXPECT_EQ(r.kv["init_result"], std::to_string(ncclUnhandledCudaError)) << r.err;
        /* The real library's own text, as it logs it: a CUDA call failed. */
        EXPECT_TRUE(contains(r.kv["last"], "Cuda failure")) << r.kv["last"];
    }
}

TEST(ForwardReal, FindsTheLibraryBesideTheToolkit)
{
    REQUIRE_REAL(real);
    std::string root = real.substr(0, real.rfind('/'));
    std::string libdir = root.substr(root.rfind('/') + 1);
    if (libdir != "lib64" && libdir != "lib")
        GTEST_SKIP() << real << " is not in a lib or lib64 directory";
    root = root.substr(0, root.rfind('/'));
    ProbeRun r = probe({"basics"}, with(kTrace, "CUDA_HOME=" + root));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.kv["version"], std::to_string(NCCL_VERSION_CODE));
    EXPECT_TRUE(contains(r.err, "from " + real)) << r.err;
}

TEST(ForwardReal, TheRealBcastsCallStaysInsideTheRealLibrary)
{
    REQUIRE_REAL(real);
    ProbeRun r = probe({"bcast"}, with(kTrace, "LOOM_NCCL_LIBRARY=" + real));
    ASSERT_EQ(r.status, 0) << r.err;
    /* The real ncclBcast calls ncclBroadcast, which finds the NULL comm. */
    EXPECT_EQ(r.kv["bcast_result"], std::to_string(ncclInvalidArgument)) << r.err;
    EXPECT_EQ(count_lines(r.err, "LOOM TRACE ncclBcast -> nccl (forward)"), 1) << r.err;
    /* The probe loaded the shim under the name libnccl.so.2: that is no other copy. */
    EXPECT_FALSE(contains(r.err, "was loaded into this process before")) << r.err;
    if (kSanitized) {
        /* No RTLD_DEEPBIND: the inner call came back and was passed through. */
        EXPECT_TRUE(contains(r.err, "a sanitizer runtime is loaded and refuses RTLD_DEEPBIND"))
            << r.err;
        EXPECT_EQ(count_lines(r.err, "ncclBroadcast -> nccl (forward; re-entered"), 1) << r.err;
        GTEST_SKIP() << "a sanitizer refuses RTLD_DEEPBIND: checked the pass-through instead";
    }
    EXPECT_EQ(count_lines(r.err, "LOOM TRACE ncclBroadcast"), 0)
        << "the real ncclBcast's call reached the shim:\n"
        << r.err;
    EXPECT_TRUE(contains(r.err, "with RTLD_DEEPBIND")) << r.err;
}

TEST(ForwardReal, APremappedCopyIsPassedThrough)
{
    REQUIRE_REAL(real);
    ProbeRun r = probe({"premapped", real}, with(kTrace, "LOOM_NCCL_LIBRARY=" + real));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.kv["bcast_result"], std::to_string(ncclInvalidArgument)) << r.err;
    EXPECT_TRUE(contains(r.err, real + " was loaded into this process before the shim opened"))
        << r.err;
    EXPECT_EQ(count_lines(r.err, "LOOM TRACE ncclBcast -> nccl (forward)"), 1) << r.err;
    EXPECT_EQ(count_lines(r.err,
                          "LOOM TRACE ncclBroadcast -> nccl (forward; re-entered from the real "
                          "library, passed through)"),
              1)
        << r.err;
}

TEST(ForwardReal, ThreadsRacingTheFirstCallShareOneLibrary)
{
    REQUIRE_REAL(real);
    ProbeRun r = probe({"threads"}, with(kTrace, "LOOM_NCCL_LIBRARY=" + real));
    ASSERT_EQ(r.status, 0) << r.err;
    for (int i = 0; i < 8; i++)
        EXPECT_EQ(r.kv["version" + std::to_string(i)], std::to_string(NCCL_VERSION_CODE));
    EXPECT_EQ(count_lines(r.err, "NCCL shim: real NCCL"), 1) << r.err;
    EXPECT_EQ(count_lines(r.err, "NCCL shim: mode forward"), 1) << r.err;
}

/* NCCL 2.28.9's texts (src/init.cc), which frameworks print verbatim. */
const char *const kErrorTexts[] = {
    "no error",
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "internal error - please report this issue to the NCCL developers",
    "invalid argument (run with NCCL_DEBUG=WARN for details)",
    "invalid usage (run with NCCL_DEBUG=WARN for details)",
    "remote process exited or there was a network error",
    "NCCL operation in progress",
    "unknown result code",
};

void expect_error_texts(const ProbeRun &r)
{
    for (int i = 0; i <= (int)ncclNumResults; i++)
        EXPECT_EQ(r.kv.at("error" + std::to_string(i)), kErrorTexts[i]) << "result " << i;
}

TEST(ForwardReal, ErrorStringsAreTheRealOnes)
{
    REQUIRE_REAL(real);
    ProbeRun r = probe({"errors"}, {"LOOM_NCCL_MODE=forward", "LOOM_NCCL_LIBRARY=" + real});
    ASSERT_EQ(r.status, 0) << r.err;
    expect_error_texts(r);
}

TEST(ForwardNoLibrary, AMissingFileIsAClearErrorOnTheFirstCall)
{
    const std::string missing = "/nonexistent-loom-test/libnccl.so.2";
    ProbeRun r = probe({"basics"}, {"LOOM_NCCL_MODE=forward", "LOOM_NCCL_LIBRARY=" + missing});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.kv["version_result"], std::to_string(ncclSystemError));
    EXPECT_EQ(r.kv["uniqueid_result"], std::to_string(ncclSystemError));
    EXPECT_EQ(r.kv["init_result"], std::to_string(ncclSystemError));
    EXPECT_TRUE(contains(r.kv["last"], "ncclCommInitRank: LOOM_NCCL_MODE=forward but the real "
                                       "NCCL library is not available: LOOM_NCCL_LIBRARY: " +
                                           missing + " does not exist"))
        << r.kv["last"];
    /* Failures are WARNs, printed by default. */
    EXPECT_EQ(count_lines(r.err, "libloom-nccl LOOM WARN ncclGetVersion: LOOM_NCCL_MODE=forward"),
              1)
        << r.err;
}

TEST(ForwardNoLibrary, ErrorStringsNeedNoLibrary)
{
    ProbeRun r = probe({"errors"}, {"LOOM_NCCL_MODE=forward", "LOOM_NCCL_LIBRARY=/nonexistent"});
    ASSERT_EQ(r.status, 0) << r.err;
    expect_error_texts(r);
}

TEST(ForwardNoLibrary, TheShimItselfIsRefused)
{
    for (const char *var : {"NCCL_SHIM", "NCCL_SHIM_LINK"}) {
        std::string self = env_or_empty(var);
        ProbeRun r = probe({"basics"}, {"LOOM_NCCL_MODE=forward", "LOOM_NCCL_LIBRARY=" + self});
        ASSERT_EQ(r.status, 0) << r.err;
        EXPECT_EQ(r.kv["version_result"], std::to_string(ncclSystemError)) << var;
        EXPECT_TRUE(contains(r.kv["last"], self + " is this library (libloom-nccl.so) itself"))
            << r.kv["last"];
    }
}

TEST(ForwardNoLibrary, ABareNameIsRefused)
{
    ProbeRun r = probe({"basics"}, {"LOOM_NCCL_MODE=forward", "LOOM_NCCL_LIBRARY=libnccl.so.2"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.kv["version_result"], std::to_string(ncclSystemError));
    EXPECT_TRUE(contains(r.kv["last"], "LOOM_NCCL_LIBRARY=libnccl.so.2 is not an absolute path"))
        << r.kv["last"];
}

TEST(ForwardNoLibrary, ALibraryThatIsNotNcclIsRefused)
{
    std::string loom = env_or_empty("LOOM_LIB");
    ProbeRun r = probe({"basics"}, {"LOOM_NCCL_MODE=forward", "LOOM_NCCL_LIBRARY=" + loom});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.kv["version_result"], std::to_string(ncclSystemError));
    EXPECT_TRUE(contains(r.kv["last"], loom + " is not an NCCL library: it has no pncclGetVersion"))
        << r.kv["last"];
}

TEST(ForwardOldLibrary, AFunctionTheRealLibraryLacksIsInvalidUsage)
{
    std::string old = env_or_empty("OLD_NCCL");
    ProbeRun r = probe({"allreduce"}, {"LOOM_NCCL_MODE=forward", "LOOM_NCCL_LIBRARY=" + old});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.kv["allreduce_result"], std::to_string(ncclInvalidUsage));
    EXPECT_EQ(r.kv["last"], "ncclAllReduce: the real NCCL library " + old +
                                " (version 2700) does not export pncclAllReduce");
    ProbeRun v = probe({"basics"}, with(kTrace, "LOOM_NCCL_LIBRARY=" + old));
    EXPECT_EQ(v.kv["version"], "2700");
    EXPECT_TRUE(contains(v.err, "real NCCL 2.7.0 (2700) from " + old)) << v.err;
}

TEST(Modes, NcclTwoTwentyNineFunctionsAreRefusedInEveryMode)
{
    for (const char *mode : {"forward", "route", "loom"}) {
        ProbeRun r = probe(
            {"newer"}, {std::string("LOOM_NCCL_MODE=") + mode, "LOOM_NCCL_LIBRARY=/nonexistent"});
        ASSERT_EQ(r.status, 0) << r.err;
        EXPECT_EQ(r.kv["grow_result"], std::to_string(ncclInvalidUsage)) << mode;
        const std::string text =
            "ncclCommGrow is NCCL 2.29 API; this library implements NCCL 2.28.9";
        EXPECT_EQ(count_lines(r.err, "libloom-nccl LOOM WARN " + text), 1) << mode << r.err;
        if (std::string(mode) == "forward") { /* the other modes' ncclGetLastError is shim_impl's */
            EXPECT_EQ(r.kv["last"], text);
        }
    }
}

TEST(Modes, AnUnknownModeWarnsAndMeansRoute)
{
    ProbeRun r =
        probe({"newer"}, {"LOOM_NCCL_MODE=sideways", "LOOM_DEBUG=INFO", "LOOM_DEBUG_SUBSYS=SHIM"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(contains(r.err, "LOOM WARN LOOM_NCCL_MODE=sideways is not forward, route or loom; "
                                "using route"))
        << r.err;
    EXPECT_TRUE(contains(r.err, "LOOM INFO NCCL shim: mode route")) << r.err;
}

TEST(Log, QuietByDefaultAndTracedOnRequest)
{
    ProbeRun quiet = probe({"newer"}, {"LOOM_NCCL_MODE=forward"});
    ASSERT_EQ(quiet.status, 0) << quiet.err;
    EXPECT_EQ(count_lines(quiet.err, "LOOM INFO"), 0) << quiet.err;
    EXPECT_EQ(count_lines(quiet.err, "LOOM TRACE"), 0) << quiet.err;
    EXPECT_EQ(count_lines(quiet.err, "LOOM WARN"), 1) << quiet.err; /* the refusal */

    /* ALL names SHIM too; ^SHIM excludes it. */
    ProbeRun all =
        probe({"newer"}, {"LOOM_NCCL_MODE=forward", "LOOM_DEBUG=INFO", "LOOM_DEBUG_SUBSYS=ALL"});
    EXPECT_EQ(count_lines(all.err, "LOOM TRACE ncclCommGrow -> refused (NCCL 2.29 API)"), 1)
        << all.err;
    ProbeRun negated =
        probe({"newer"}, {"LOOM_NCCL_MODE=forward", "LOOM_DEBUG=TRACE", "LOOM_DEBUG_SUBSYS=^SHIM"});
    EXPECT_EQ(count_lines(negated.err, "LOOM TRACE"), 0) << negated.err;
    ProbeRun none = probe({"newer"}, {"LOOM_NCCL_MODE=forward", "LOOM_DEBUG=NONE"});
    EXPECT_EQ(none.err, "");
}

TEST(Log, LinesHaveLoomsFormatAndCanGoToAFile)
{
    char dir[] = "/tmp/loom-shim-log-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string pattern = std::string(dir) + "/shim-%p.log";
    ProbeRun r = probe({"newer"}, with(kTrace, "LOOM_DEBUG_FILE=" + pattern));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    /* One file, named after the probe's pid (unknown here). */
    std::string text, name;
    DIR *d = opendir(dir);
    ASSERT_NE(d, nullptr);
    for (struct dirent *e; (e = readdir(d)) != nullptr;) {
        if (e->d_name[0] == '.')
            continue;
        name = e->d_name;
        std::string path = std::string(dir) + "/" + name;
        std::ifstream f(path);
        std::stringstream all;
        all << f.rdbuf();
        text += all.str();
        std::remove(path.c_str());
    }
    closedir(d);
    rmdir(dir);
    EXPECT_EQ(name.rfind("shim-", 0), 0u) << name;
    EXPECT_GT(std::atoi(name.c_str() + 5), 0) << name << ": %p is the pid";
    /* host:pid:tid [-1] LOOM TRACE message, as loom's own lines. */
    std::istringstream lines(text);
    std::string line;
    bool found = false;
    while (std::getline(lines, line)) {
        size_t at = line.find(" [-1] LOOM TRACE ncclCommGrow -> refused");
        if (at == std::string::npos)
            continue;
        std::string head = line.substr(0, at);
        size_t c1 = head.find(':'), c2 = head.rfind(':');
        ASSERT_TRUE(c1 != std::string::npos && c2 > c1) << line;
        EXPECT_GT(std::atoi(head.substr(c1 + 1).c_str()), 0) << line;
        EXPECT_GT(std::atoi(head.substr(c2 + 1).c_str()), 0) << line;
        found = true;
    }
    EXPECT_TRUE(found) << text;
}

} // namespace
