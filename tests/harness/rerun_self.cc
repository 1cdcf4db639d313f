// SPDX-License-Identifier: Apache-2.0
//
// rerun_self.cc - RerunSelf (rerun_self.h): fork, set the child's variables, exec this binary
// with a gtest filter, and wait for it against a deadline.
#include "rerun_self.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

namespace loomtest {

int RerunSelf(const std::string &filter,
              const std::vector<std::pair<std::string, std::string>> &env, double deadline_s)
{
    const std::string arg = "--gtest_filter=" + filter;
    pid_t pid = fork();
    if (pid == 0) {
        for (const auto &kv : env)
            setenv(kv.first.c_str(), kv.second.c_str(), 1);
        execl("/proc/self/exe", "rerun", arg.c_str(), (char *)nullptr);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(deadline_s));
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -2;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -3;
}

} // namespace loomtest
