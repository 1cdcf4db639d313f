// SPDX-License-Identifier: Apache-2.0
//
// coll_kind.h - the six collectives of loom.h's loomCollective_t as the tests name and sort
// them: the name in test and case names, the spelling of LOOM_ALGO and LOOM_COLL_TRACE, and which
// ones reduce or have a root. It does not call them (each test does, with its own buffers).
// Used by the tests in tests/coll.
#ifndef LOOM_TESTS_HARNESS_COLL_KIND_H
#define LOOM_TESTS_HARNESS_COLL_KIND_H

#include "loom.h"

namespace loomtest {

// "AllReduce": test and case names (gtest parameter names take letters, digits and '_' only).
inline const char *CollName(loomCollective_t c)
{
    static const char *const names[loomNumCollectives] = {"AllReduce", "AllGather", "ReduceScatter",
                                                          "Broadcast", "Reduce",    "AllToAll"};
    return c >= 0 && c < loomNumCollectives ? names[c] : "?";
}

// "allreduce": as LOOM_ALGO, LOOM_COLL_TRACE and loom_info spell it.
inline const char *CollSpelling(loomCollective_t c)
{
    static const char *const names[loomNumCollectives] = {"allreduce", "allgather", "reducescatter",
                                                          "broadcast", "reduce",    "alltoall"};
    return c >= 0 && c < loomNumCollectives ? names[c] : "?";
}

inline bool Reducing(loomCollective_t c)
{
    return c == loomCollAllReduce || c == loomCollReduceScatter || c == loomCollReduce;
}

inline bool Rooted(loomCollective_t c)
{
    return c == loomCollBroadcast || c == loomCollReduce;
}

} // namespace loomtest

#endif // LOOM_TESTS_HARNESS_COLL_KIND_H
