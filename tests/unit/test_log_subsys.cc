// SPDX-License-Identifier: Apache-2.0
//
// test_log_subsys.cc - LOOM_DEBUG_SUBSYS selects whose INFO lines are printed: with one
// subsystem named, that module's lines appear and the other modules' do not. The lines come from
// the real call sites: topology detection (TOPO), Echo's engine set-up (ECHO), the 4-bit codec
// (QUANT) and the reduction kernels' set-up (INIT). The logger reads its settings once per
// process, so each selection runs this binary again (rerun_self.h) with LOOM_DEBUG_FILE set, and
// the parent reads the file. An unknown name is reported, not silently dropped.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "echo.h"
#include "q4.h"
#include "rerun_self.h"

extern "C" {
#include "topo.h"
}

namespace {

const char child_flag[] = "LOOM_TEST_LOG_CHILD";

// One module's INFO line: the subsystem it is logged under and text only that line has.
struct Module {
    const char *subsys;
    const char *text;
};
const Module modules[] = {
    {"TOPO", "topology: CPUs and NUMA from"},
    {"ECHO", "Echo layout flat"},
    {"QUANT", "q4 codec: "},
    {"INIT", "reduction kernels: "},
};

TEST(LogSubsysChild, LogsFromEachModule)
{
    if (std::getenv(child_flag) == nullptr)
        GTEST_SKIP() << "runs only as the child process of LogSubsys.*";
    loom_topo_host_t host;
    loom_topo_detect_host(&host, nullptr);
    loom_peer_info_t peer = {};
    loom_echo_ctx_t *ctx = nullptr;
    if (loom_echo_ctx_create(&peer, 1, 0, &ctx) != loomSuccess)
        _exit(3);
    loom_echo_ctx_free(ctx);
    std::vector<float> x(LOOM_Q4_TILE, 1.0f);
    std::vector<uint8_t> q(loom_q4_bytes(x.size()));
    loom_q4_encode(x.data(), loomFloat32, nullptr, nullptr, x.size(), q.data());
    std::fflush(stdout);
    _exit(0);
}

// The log of a child run with LOOM_DEBUG=INFO and this LOOM_DEBUG_SUBSYS.
std::string LogWith(const std::string &subsys)
{
    char path[] = "/tmp/loom-test-log-XXXXXX";
    const int fd = mkstemp(path);
    EXPECT_GE(fd, 0);
    if (fd < 0)
        return "";
    close(fd);
    const int st = loomtest::RerunSelf("LogSubsysChild.*", {{child_flag, "1"},
                                                            {"LOOM_DEBUG", "INFO"},
                                                            {"LOOM_DEBUG_SUBSYS", subsys},
                                                            {"LOOM_DEBUG_FILE", path},
                                                            {"LOOM_KERNELS", "auto"}});
    EXPECT_EQ(st, 0) << "the child run with LOOM_DEBUG_SUBSYS=" << subsys;
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    unlink(path);
    return ss.str();
}

TEST(LogSubsys, SelectedSubsystemShowsItsLinesOnly)
{
    for (const Module &sel : modules) {
        const std::string log = LogWith(sel.subsys);
        for (const Module &m : modules) {
            const bool shown = log.find(m.text) != std::string::npos;
            EXPECT_EQ(shown, &m == &sel)
                << "LOOM_DEBUG_SUBSYS=" << sel.subsys << ": the " << m.subsys << " line \""
                << m.text << "\" is " << (shown ? "shown" : "missing") << "; log:\n"
                << log;
        }
    }
}

TEST(LogSubsys, NegationHidesOnlyTheNamedSubsystem)
{
    const std::string log = LogWith("^TOPO");
    for (const Module &m : modules) {
        const bool shown = log.find(m.text) != std::string::npos;
        EXPECT_EQ(shown, std::string(m.subsys) != "TOPO") << m.subsys << "; log:\n" << log;
    }
}

TEST(LogSubsys, UnknownNameIsReported)
{
    const std::string log = LogWith("ECHO,NO_SUCH_SUBSYS");
    EXPECT_NE(log.find("unknown subsystem 'NO_SUCH_SUBSYS'"), std::string::npos) << log;
    EXPECT_NE(log.find("Echo layout flat"), std::string::npos) << log;
}

} // namespace
