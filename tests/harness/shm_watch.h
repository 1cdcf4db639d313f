// SPDX-License-Identifier: Apache-2.0
//
// shm_watch.h - kills a rank at the moment a shared-memory segment is created: a thread watches
// /dev/shm with inotify and raises SIGKILL in this process when a name with the given prefix
// appears, so that a test can kill a rank in the middle of a communicator's creation (between
// creating a segment and announcing it) without a timing guess. For rank processes of
// mp_fixture.h only: setting it up fails the rank with XT_CHECK. Used by tests/fault.
#ifndef LOOM_TESTS_HARNESS_SHM_WATCH_H
#define LOOM_TESTS_HARNESS_SHM_WATCH_H

#include <string>

namespace loomtest {

// From now on, the first /dev/shm entry created whose name starts with prefix kills this
// process (SIGKILL), whichever process creates it. The watching thread runs until then.
void KillWhenShmAppears(const std::string &prefix);

} // namespace loomtest

#endif // LOOM_TESTS_HARNESS_SHM_WATCH_H
