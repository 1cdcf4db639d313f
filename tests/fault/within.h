// SPDX-License-Identifier: Apache-2.0
//
// within.h - runs a few functions on threads of their own and waits for them against a bound, so
// that a call that never returns (a teardown waiting for something that cannot happen) fails its
// rank at once with a message saying what hung, instead of at the harness's deadline. It does
// not kill the hung thread: the failing rank exits with it still blocked. Used by tests/fault.
#ifndef LOOM_TESTS_FAULT_WITHIN_H
#define LOOM_TESTS_FAULT_WITHIN_H

#include <functional>
#include <string>
#include <vector>

namespace loomtest {

// Starts every function of fns on a thread of its own and waits at most limit_s seconds for all
// of them to return; fails the rank (XT_CHECK) naming `what` if one did not.
void RunWithin(double limit_s, const std::string &what,
               const std::vector<std::function<void()>> &fns);

} // namespace loomtest

#endif // LOOM_TESTS_FAULT_WITHIN_H
