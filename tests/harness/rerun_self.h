// SPDX-License-Identifier: Apache-2.0
//
// rerun_self.h - runs the current test binary again, with only the tests a gtest filter selects
// and a few variables added to its environment, for what only a fresh process shows: settings
// the library reads once per process (LOOM_KERNELS, LOOM_DEBUG*). The child test runs only when
// its flag variable is set and reports through its exit code or a file. Single-process suites
// (tests/unit) use it; multi-process tests fork ranks with mp_fixture.h instead.
#ifndef LOOM_TESTS_HARNESS_RERUN_SELF_H
#define LOOM_TESTS_HARNESS_RERUN_SELF_H

#include <string>
#include <utility>
#include <vector>

namespace loomtest {

// Runs /proc/self/exe --gtest_filter=filter with env set on top of this process's environment,
// and waits for it at most deadline_s seconds. Returns its exit status; -1 if it could not be
// started, -2 if it ran past the deadline (then it is killed), -3 if a signal ended it.
int RerunSelf(const std::string &filter,
              const std::vector<std::pair<std::string, std::string>> &env, double deadline_s = 8.0);

} // namespace loomtest

#endif // LOOM_TESTS_HARNESS_RERUN_SELF_H
