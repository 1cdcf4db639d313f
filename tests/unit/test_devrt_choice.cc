// SPDX-License-Identifier: Apache-2.0
//
// test_devrt_choice.cc - which device runtime loom_devrt() gives for each LOOM_DEVICE
// (devrt.h): emulated, none (with the reason), auto (the CUDA runtime only where this build has
// it and the process loaded the CUDA driver, which this test never does), an unknown value as
// auto; a runtime once found is kept, and until one is found each call looks again. The choice
// is made once per process, so each setting runs this binary again (rerun_self.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "devrt_emu_util.h"
#include "rerun_self.h"

extern "C" {
#include "param.h"
}

namespace {

const char child_flag[] = "LOOM_TEST_DEVRT_CHILD";

TEST(DevrtChoiceChild, Pick)
{
    const char *want = std::getenv(child_flag);
    if (want == nullptr)
        GTEST_SKIP() << "runs only as the child process of DevrtChoice.*";
    const loom_devrt_t *rt = loom_devrt();
    const std::string why = loom_devrt_why_none();
    if (std::string(want) == "emulated") {
        CHILD_CHECK(rt == loom_devrt_emulated() && why.empty());
        // Found once, kept: a later change of the setting does not matter.
        setenv("LOOM_DEVICE", "none", 1);
        loom_param_reset_cache();
        CHILD_CHECK(loom_devrt() == rt);
    } else if (std::string(want) == "none") {
        CHILD_CHECK(rt == nullptr && why == "LOOM_DEVICE=none");
        // Until one is found, each call looks again.
        setenv("LOOM_DEVICE", "emulated", 1);
        loom_param_reset_cache();
        CHILD_CHECK(loom_devrt() == loom_devrt_emulated());
    } else { // auto: no CUDA driver was loaded by this process
        CHILD_CHECK(rt == nullptr && !why.empty());
        CHILD_CHECK(why == "built without the cuda feature" ||
                    why.find("not loaded") != std::string::npos);
        char why2[128];
        CHILD_CHECK(loom_devrt_cuda(why2, sizeof(why2)) == nullptr && why == why2);
    }
    _exit(0);
}

TEST(DevrtChoice, EachSettingInAFreshProcess)
{
    for (const char *mode : {"emulated", "none", "auto", "bogus"}) {
        const char *child = std::string(mode) == "bogus" ? "auto" : mode;
        const int st = loomtest::RerunSelf(
            "DevrtChoiceChild.*",
            {{child_flag, child}, {"LOOM_DEVICE", mode}, {"LOOM_DEBUG", "NONE"}});
        EXPECT_EQ(st, 0) << "LOOM_DEVICE=" << mode;
    }
}

} // namespace
