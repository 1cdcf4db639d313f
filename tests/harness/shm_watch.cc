// SPDX-License-Identifier: Apache-2.0
//
// shm_watch.cc - KillWhenShmAppears (shm_watch.h): an inotify watch on /dev/shm read by a
// detached thread.
#include "shm_watch.h"

#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "mp_fixture.h"

namespace loomtest {

void KillWhenShmAppears(const std::string &prefix)
{
    const int fd = inotify_init1(IN_CLOEXEC);
    XT_CHECK_MSG(fd >= 0, std::string("inotify_init1: ") + strerror(errno));
    XT_CHECK_MSG(inotify_add_watch(fd, "/dev/shm", IN_CREATE) >= 0,
                 std::string("inotify_add_watch /dev/shm: ") + strerror(errno));
    std::thread([fd, prefix] {
        alignas(inotify_event) char buf[4096];
        for (;;) {
            const ssize_t n = read(fd, buf, sizeof(buf));
            for (ssize_t o = 0; o < n;) {
                const auto *e = reinterpret_cast<const inotify_event *>(buf + o);
                if (e->len > 0 && strncmp(e->name, prefix.c_str(), prefix.size()) == 0)
                    raise(SIGKILL);
                o += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
            }
        }
    }).detach();
}

} // namespace loomtest
