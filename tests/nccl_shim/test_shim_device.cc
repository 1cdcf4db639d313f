// SPDX-License-Identifier: Apache-2.0
//
// test_shim_device.cc - the drop-in NCCL library on device buffers and CUDA streams, under loom's
// emulated device runtime: runs loom_device_prog (a C program written against nccl.h) on 2 ranks
// with libfake-cuda-emu.so standing for the CUDA driver, in loom mode (every collective and
// Send/Recv on ncclMemAlloc memory, on a stream and on CUDA's default stream, bitwise equal to
// the host-buffer run; Echo through the default rules; captures passed to loom, which refuses
// the host-staged ones with its text; PreMulSum refused; more streams than the library keeps
// wrappers for; ncclCommFinalize flushing queued calls), in loom mode with only the staged
// transport (a captured call refused with ncclInvalidUsage and loom's text), and in route mode
// paired with libfake-nccl.so (the default rules' device-buffer call to loom, captured too, to
// NCCL where only the staged transport could run it). LD_LIBRARY_PATH starts with
// tests/nccl_shim/emu, whose libloom.so.0 exports the emulation that the driver stand-in
// describes, so that the library and the stand-in share one loom. Run by meson's 'nccl_shim'
// suite.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace {

std::string Env(const char *name)
{
    const char *v = std::getenv(name);
    return v != nullptr ? v : "";
}

struct ProgRun {
    int status;
    std::string out;
};

// Runs the program with args and extra environment; its process group is killed past 120 s.
ProgRun RunProgram(const std::vector<std::string> &args,
                   const std::vector<std::pair<std::string, std::string>> &env)
{
    char tmpl[] = "/tmp/loom-shim-dev-XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0)
        return {-1, "mkstemp failed"};
    const pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        const std::string ld = Env("LOOM_EMU_LOOM_DIR") + ":" + Env("LD_LIBRARY_PATH");
        setenv("LD_LIBRARY_PATH", ld.c_str(), 1);
        setenv("LOOM_DEVICE", "emulated", 1);
        unsetenv("LOOM_DEVICE_TRANSPORTS");
        unsetenv("LOOM_NCCL_ROUTE");
        for (const auto &kv : env)
            setenv(kv.first.c_str(), kv.second.c_str(), 1);
        std::vector<char *> argv;
        for (const std::string &a : args)
            argv.push_back(const_cast<char *>(a.c_str()));
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        _exit(127);
    }
    setpgid(pid, pid);
    int status = 0, rc = -2;
    for (int ms = 0; ms < 120000; ms += 10) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            break;
        }
        usleep(10000);
    }
    if (rc == -2) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    close(fd);
    std::ifstream f(tmpl);
    std::string out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    unlink(tmpl);
    if (rc == -2)
        out += "\n(timed out)";
    return {rc, out};
}

std::vector<std::string> Args(const std::string &mode)
{
    std::vector<std::string> a = {Env("LOOM_DEVICE_PROG"), mode, "2", Env("LOOM_FAKE_CUDA_EMU")};
    if (mode.rfind("route", 0) == 0)
        a.push_back(Env("LOOM_FAKE_NCCL"));
    return a;
}

class ShimDevice : public ::testing::Test {
  protected:
    void SetUp() override
    {
        for (const char *v :
             {"LOOM_DEVICE_PROG", "LOOM_FAKE_CUDA_EMU", "LOOM_EMU_LOOM_DIR", "LOOM_FAKE_NCCL"})
            ASSERT_FALSE(Env(v).empty()) << v << " is not set (meson sets it)";
    }
};

TEST_F(ShimDevice, LoomModeDeviceBuffersEqualHostBuffers)
{
    const ProgRun r =
        RunProgram(Args("loom"), {{"LOOM_NCCL_MODE", "loom"}, {"LOOM_NCCL_ECHO", "1"}});
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("rank 1: loom mode passed"), std::string::npos) << r.out;
}

TEST_F(ShimDevice, StagedTransportRefusesCapture)
{
    const ProgRun r = RunProgram(Args("staged"), {{"LOOM_NCCL_MODE", "loom"},
                                                  {"LOOM_NCCL_ECHO", "1"},
                                                  {"LOOM_DEVICE_TRANSPORTS", "staged"}});
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("rank 1: staged mode passed"), std::string::npos) << r.out;
    // loom's refusal is logged as it happens, with its reason
    EXPECT_NE(r.out.find("host-staged device calls cannot be captured"), std::string::npos)
        << r.out;
}

// Device buffers leave NCCL only by a rule the user wrote (the built-in rules keep them there
// until loom's device path has run on a GPU); the rule then sends them where it says.
TEST_F(ShimDevice, RouteModeSendsDeviceBuffersByTheRules)
{
    const struct {
        const char *mode;
        bool rule; // a LOOM_NCCL_ROUTE rule, or the built-in ones
    } runs[] = {{"route", false}, {"route", true}, {"route-staged", true}};
    for (const auto &run : runs) {
        const char *mode = run.mode;
        std::vector<std::pair<std::string, std::string>> env = {
            {"LOOM_NCCL_MODE", "route"}, {"LOOM_NCCL_LIBRARY", Env("LOOM_FAKE_NCCL")}};
        if (run.rule)
            env.push_back({"LOOM_NCCL_ROUTE", "coll=allreduce dtype=fp16,bf16 op=sum bytes>=1M "
                                              "nranks=2-8 hosts=1 -> loom"});
        if (std::string(mode) == "route-staged")
            env.push_back({"LOOM_DEVICE_TRANSPORTS", "staged"});
        const ProgRun r = RunProgram(Args(mode), env);
        EXPECT_EQ(r.status, 0) << mode << ":\n" << r.out;
        EXPECT_NE(r.out.find(std::string("rank 1: ") + mode + " mode passed"), std::string::npos)
            << r.out;
    }
}

} // namespace
