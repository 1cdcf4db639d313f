// SPDX-License-Identifier: Apache-2.0
//
// test_security_shm.cc - what a rank finds under a segment's name in LOOM_SHM_DIR when that
// directory is shared with other users. A rank that maps a segment another rank created
// (loom_seg_open, the shm transport's rings; loom_seg_file_open, the collectives' arena)
// must refuse, with a WARN naming the path, a symbolic link planted at the name (even one to a
// valid segment of this user), a file another user owns, and something that is not a regular
// file, rather than follow or map it. The segments are made with the library's own
// loom_seg_create in a temporary directory (through shm_probe.c, since shm_seg.h is C11
// only); each test runs in a forked rank, since the functions log.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "mp_fixture.h"
#include "security_util.h"

#include "shm_probe.h"

using loomtest::RunOptions;
using loomtest::RunRanks;
using namespace sectest;

namespace {

constexpr int kLocal = 3; // local ranks the segments are made for: mapping one never unlinks it

RunOptions OneRank()
{
    RunOptions opts;
    opts.create_comm = false;
    opts.unset_env = {"LOOM_DEBUG", "LOOM_DEBUG_FILE"};
    return opts;
}

// Creates a valid segment "/real" of this user in dir.
void CreateSegment(const std::string &dir)
{
    XT_CHECK_LOOM(shm_probe_create(dir.c_str(), "/real", kLocal));
}

// loom_seg_open of name must fail without mapping it, and its WARN must name the
// path and contain `why`; loom_seg_file_open (the arena's way in) must refuse it too.
void ExpectRefused(const std::string &dir, const char *name, const std::string &why)
{
    int ready = -1;
    XT_CHECK_LOOM_RES(shm_probe_open(dir.c_str(), name, kLocal, &ready), loomSystemError);
    XT_CHECK_EQ(ready, 0);
    const std::string msg = loomGetLastError(nullptr);
    for (const std::string &w : {dir + name, why})
        XT_CHECK_MSG(msg.find(w) != std::string::npos, "'" + w + "' not in '" + msg + "'");
    errno = 0;
    const int fd = shm_probe_file_open(dir.c_str(), name);
    XT_CHECK_MSG(fd < 0, "loom_seg_file_open opened " + dir + name);
    XT_CHECK_EQ(errno, EPERM);
}

TEST(ShmOpen, SymbolicLinkAtTheNameIsNotFollowed)
{
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    XT_ASSERT_RUN(RunRanks(
        1,
        [&](int, int, loomComm_t) {
            CreateSegment(dir.path());
            XT_CHECK(symlink((dir.path() + "/real").c_str(), (dir.path() + "/planted").c_str()) ==
                     0);
            ExpectRefused(dir.path(), "/planted", "symbolic link");
            // The segment itself still opens: the refusal is of the link, not of the target.
            int ready = 0;
            XT_CHECK_LOOM(shm_probe_open(dir.path().c_str(), "/real", kLocal, &ready));
            XT_CHECK_EQ(ready, 1);
        },
        OneRank()));
}

TEST(ShmOpen, AnotherUsersSegmentIsRefused)
{
    if (geteuid() != 0)
        GTEST_SKIP() << "needs root to give a segment to another uid";
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    XT_ASSERT_RUN(RunRanks(
        1,
        [&](int, int, loomComm_t) {
            CreateSegment(dir.path());
            XT_CHECK(chown((dir.path() + "/real").c_str(), 65534, 65534) == 0);
            ExpectRefused(dir.path(), "/real", "is owned by another user (mode 100600, uid 65534");
        },
        OneRank()));
}

// A FIFO opens read-write without blocking and has size 0: before the check the rank took it
// for a segment not sized yet and waited for it until the timeout.
TEST(ShmOpen, WhatIsNotARegularFileIsRefused)
{
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    ASSERT_EQ(mkfifo((dir.path() + "/fifo").c_str(), 0600), 0);
    XT_ASSERT_RUN(RunRanks(
        1, [&](int, int, loomComm_t) { ExpectRefused(dir.path(), "/fifo", "not a regular file"); },
        OneRank()));
}

} // namespace
