// SPDX-License-Identifier: Apache-2.0
//
// fault_util.h - small helpers shared by the fault tests: a monotonic clock, the environment
// every fault run uses, checks that a failure message names a rank the way loom promises
// ("rank R (host H, pid P)"), the loom segments left in /dev/shm by a run's processes, and one
// run with a victim over a layout (through mp_fixture.h; the victim kills itself, tripwire.h).
// Used by tests/fault.
#ifndef LOOM_TESTS_FAULT_FAULT_UTIL_H
#define LOOM_TESTS_FAULT_FAULT_UTIL_H

#include <functional>
#include <string>
#include <vector>

#include "mp_fixture.h"

namespace loomtest {

double NowSec();

// LOOM_NET=net plus small rings, socket buffers and chunks (so that a 1 MiB message cannot be
// buffered whole: its sender only gets far once the receiver reads), and timeout_ms.
EnvList FaultEnv(const std::string &net, int timeout_ms);

// The last error (loomGetLastError) of this thread, checked to name `rank` with its host and pid
// (from the harness) and to mention `op` and a sequence number; fails the rank otherwise.
void CheckNamesRank(const char *file, int line, int rank, const std::string &op);

// Blocks until rank r's process has exited (a pidfd, no polling loop). For a rank that hosts
// the rendezvous service and must outlive the ranks it still has to answer.
void WaitForRankExit(int rank);

// "loom-<pid>-..." entries of /dev/shm for any of pids (a segment's name starts with its
// leader's pid).
std::vector<std::string> ShmLeftovers(const std::vector<int> &pids);

// Runs body on nranks ranks, of which `victim` is to die of SIGKILL (the body arms it), over a
// layout: "shm", "tcp", or "hosts" (two modelled hosts of consecutive ranks, as loomrun
// --host-groups makes them); the environment is FaultEnv's with a 20 s timeout, plus extra.
// Fails if a rank exits otherwise, or if the run leaves anything in /dev/shm.
// Runs call (the collective during which `victim` dies) on `rank` and checks what a survivor
// must see: loomRemoteError within 2 s, its last error naming the victim and `op`. On the victim
// itself the call must not return (it dies inside it). `what` names the call in the log line.
void CheckSurvivorOf(const char *file, int line, int rank, int victim, const std::string &what,
                     const std::string &op, const std::function<loomResult_t()> &call);

::testing::AssertionResult RunWithVictim(const std::string &layout, int nranks, int victim,
                                         const EnvList &extra, const RankBody &body);

} // namespace loomtest

#define XT_CHECK_NAMES_RANK(rank, op) ::loomtest::CheckNamesRank(__FILE__, __LINE__, (rank), (op))
#define XT_CHECK_SURVIVOR_OF(rank, victim, what, op, call)                                         \
    ::loomtest::CheckSurvivorOf(__FILE__, __LINE__, (rank), (victim), (what), (op), (call))

#endif // LOOM_TESTS_FAULT_FAULT_UTIL_H
