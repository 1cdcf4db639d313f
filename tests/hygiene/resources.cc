// SPDX-License-Identifier: Apache-2.0
//
// resources.cc - the /proc and allocator readings behind resources.h. Directory listings skip
// "." and ".."; the descriptor of the listing itself is left out of the count. Nothing here
// allocates through loom or keeps state between calls. Used by tests/hygiene only.

#include "resources.h"

#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "leak_check.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LOOMTEST_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LOOMTEST_SANITIZER_ALLOCATOR 1
#endif
#endif
#ifdef LOOMTEST_SANITIZER_ALLOCATOR
// From sanitizer/allocator_interface.h, which gcc does not install (its runtimes export it).
extern "C" size_t __sanitizer_get_current_allocated_bytes(void);
#endif

namespace loomtest {

namespace {

// Names in dir except "." and ".."; the descriptor opendir uses is excluded by the caller.
std::vector<std::string> ListDir(const char *dir, int *own_fd)
{
    std::vector<std::string> names;
    DIR *d = opendir(dir);
    if (d == nullptr)
        return names;
    if (own_fd != nullptr)
        *own_fd = dirfd(d);
    while (dirent *e = readdir(d)) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            names.push_back(e->d_name);
    }
    closedir(d);
    return names;
}

} // namespace

std::string Resources::Describe() const
{
    std::ostringstream os;
    os << fds << " fds, " << threads << " threads, " << rss_bytes / 1024 << " KiB resident, "
       << malloc_in_use << " malloc bytes in use, " << shm_mappings << " segment mappings";
    return os.str();
}

Resources Snapshot()
{
    Resources r;
    int own = -1;
    for (const std::string &name : ListDir("/proc/self/fd", &own)) {
        if (std::to_string(own) == name)
            continue;
        char target[512] = "";
        const std::string link = "/proc/self/fd/" + name;
        const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = '\0';
        r.fd_targets.push_back(name + " -> " + target);
        r.fds++;
    }
    for (const std::string &tid : ListDir("/proc/self/task", nullptr)) {
        std::string name = tid + " ";
        if (FILE *f = fopen(("/proc/self/task/" + tid + "/comm").c_str(), "r")) {
            char comm[64] = "";
            if (fgets(comm, sizeof(comm), f))
                name += std::string(comm, strcspn(comm, "\n"));
            fclose(f);
        }
        r.thread_names.push_back(name);
        r.threads++;
    }
    if (FILE *f = fopen("/proc/self/statm", "r")) {
        unsigned long size = 0, resident = 0;
        if (fscanf(f, "%lu %lu", &size, &resident) == 2)
            r.rss_bytes = resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
        fclose(f);
    }
    if (FILE *f = fopen("/proc/self/maps", "r")) {
        char line[1024];
        while (fgets(line, sizeof(line), f))
            r.shm_mappings += strstr(line, "/loom-") != nullptr;
        fclose(f);
    }
#ifdef LOOMTEST_SANITIZER_ALLOCATOR
    // The sanitizer's allocator replaces malloc: mallinfo2 would read an arena nobody uses. Its
    // own count is of the bytes the program holds (freed chunks in quarantine are not).
    r.malloc_in_use = __sanitizer_get_current_allocated_bytes();
#else
    const struct mallinfo2 mi = mallinfo2();
    r.malloc_in_use = mi.uordblks + mi.hblkhd;
#endif
    return r;
}

int SettleThreads(int threads, int deadline_ms)
{
    int seen = 0;
    for (int waited_ms = 0;; waited_ms++) {
        seen = static_cast<int>(ListDir("/proc/self/task", nullptr).size());
        if (seen <= threads || waited_ms >= deadline_ms)
            return seen;
        const timespec ms = {0, 1000000};
        nanosleep(&ms, nullptr);
    }
}

std::vector<std::string> ShmSegmentsOf(pid_t pid)
{
    const std::string prefix = "loom-" + std::to_string(pid) + "-";
    std::vector<std::string> found;
    for (const std::string &name : ListDir("/dev/shm", nullptr))
        if (name.compare(0, prefix.size(), prefix) == 0)
            found.push_back(name);
    return found;
}

bool UnderSanitizer()
{
#ifdef LOOMTEST_SANITIZER_ALLOCATOR
    return true;
#else
    return false;
#endif
}

void StartRuntimeThreads()
{
    std::thread([] {}).join();
}

ParentReport::ParentReport()
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0) {
        rd_ = p[0];
        wr_ = p[1];
    }
}

ParentReport::~ParentReport()
{
    if (rd_ >= 0)
        close(rd_);
    if (wr_ >= 0)
        close(wr_);
}

void ParentReport::Send(const std::string &line) const
{
    const std::string l = line + "\n";
    if (wr_ >= 0 && write(wr_, l.data(), l.size()) < 0)
        fprintf(stderr, "report pipe: %s\n", strerror(errno));
}

std::string ParentReport::Collect()
{
    std::string out;
    char buf[4096];
    ssize_t n;
    while (rd_ >= 0 && (n = read(rd_, buf, sizeof(buf))) > 0)
        out.append(buf, static_cast<size_t>(n));
    return out;
}

} // namespace loomtest
