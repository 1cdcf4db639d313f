// SPDX-License-Identifier: Apache-2.0
//
// tripwire.cc - the armed pages of TripBuffer, the SIGSEGV handler that turns a read of one into
// SIGKILL/SIGSTOP, and the sendmsg and process_vm_readv interposers that do the same for the
// kernel's accesses on the process's behalf (a message sent from an armed page, a single-copy
// read into one). The interposers are found before libc's by the dynamic linker because the test
// executable defines them; they forward to the next definition (libc, or a sanitizer's). Used by
// tests/fault.

#include "tripwire.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace loomtest {

namespace {

constexpr int kMaxArmed = 16;
std::atomic<uintptr_t> g_armed[kMaxArmed]; // page start addresses; 0 = free
std::atomic<int> g_signal{SIGKILL};

size_t Page()
{
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return page;
}

// The armed page containing [a, a + len), as an offset from a; SIZE_MAX if none.
size_t FirstArmed(uintptr_t a, size_t len)
{
    size_t best = SIZE_MAX;
    for (auto &slot : g_armed) {
        const uintptr_t page = slot.load(std::memory_order_acquire);
        if (page == 0 || page + Page() <= a || page >= a + len)
            continue;
        const size_t off = page <= a ? 0 : static_cast<size_t>(page - a);
        if (off < best)
            best = off;
    }
    return best;
}

void OnSegv(int, siginfo_t *si, void *)
{
    const uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
    if (FirstArmed(a, 1) != SIZE_MAX) {
        raise(g_signal.load()); // SIGKILL ends here; after SIGSTOP + SIGCONT the read faults again
        return;
    }
    signal(SIGSEGV, SIG_DFL); // not ours: the read faults again and the default action runs
}

void InstallHandler()
{
    static std::atomic<bool> done{false};
    if (done.exchange(true))
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = OnSegv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, nullptr) != 0) {
        perror("tripwire: sigaction(SIGSEGV)");
        abort();
    }
}

} // namespace

size_t PageBytes()
{
    return Page();
}

TripBuffer::TripBuffer(size_t bytes) : bytes_(bytes)
{
    mapped_ = (bytes + Page() - 1) / Page() * Page();
    if (mapped_ == 0)
        mapped_ = Page();
    void *p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("tripwire: mmap");
        abort();
    }
    base_ = static_cast<unsigned char *>(p);
}

TripBuffer::~TripBuffer()
{
    for (auto &slot : g_armed) {
        const uintptr_t page = slot.load();
        if (page >= reinterpret_cast<uintptr_t>(base_) &&
            page < reinterpret_cast<uintptr_t>(base_) + mapped_)
            slot.store(0);
    }
    munmap(base_, mapped_);
}

void TripBuffer::Arm(size_t offset, int sig)
{
    if (offset >= mapped_) {
        fprintf(stderr, "tripwire: offset %zu outside a %zu-byte buffer\n", offset, mapped_);
        abort();
    }
    InstallHandler();
    g_signal.store(sig);
    const uintptr_t page = reinterpret_cast<uintptr_t>(base_) + offset / Page() * Page();
    if (mprotect(reinterpret_cast<void *>(page), Page(), PROT_NONE) != 0) {
        perror("tripwire: mprotect");
        abort();
    }
    for (auto &slot : g_armed) {
        uintptr_t expect = 0;
        if (slot.compare_exchange_strong(expect, page))
            return;
    }
    fprintf(stderr, "tripwire: more than %d armed pages\n", kMaxArmed);
    abort();
}

// The part of iovecs [iov, iov + n) that a kernel access on this process's behalf may touch
// before the first armed page: head (empty if nothing is armed there, then *armed = false).
// With an armed page at the very start it raises the tripwire's signal (SIGSTOP: returns
// after SIGCONT with *armed = true and head empty, and the caller fails with EFAULT).
std::vector<iovec> HeadBeforeArmed(const iovec *iov, size_t n, bool *armed)
{
    *armed = false;
    size_t before = 0; // bytes ahead of iovec i
    for (size_t i = 0; iov != nullptr && i < n; i++) {
        const size_t off = FirstArmed(reinterpret_cast<uintptr_t>(iov[i].iov_base), iov[i].iov_len);
        if (off == SIZE_MAX) {
            before += iov[i].iov_len;
            continue;
        }
        *armed = true;
        if (before + off == 0) {
            raise(g_signal.load());
            return {};
        }
        std::vector<iovec> head(iov, iov + i + 1);
        head[i].iov_len = off;
        return head;
    }
    return {};
}

} // namespace loomtest

// The process's sendmsg: a message stops short of an armed page, and one that would start on
// it raises the tripwire's signal instead of reaching the kernel.
extern "C" ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    using SendmsgFn = ssize_t (*)(int, const struct msghdr *, int);
    static const SendmsgFn next = reinterpret_cast<SendmsgFn>(dlsym(RTLD_NEXT, "sendmsg"));
    if (msg == nullptr)
        return next(fd, msg, flags);
    bool armed;
    std::vector<iovec> head = loomtest::HeadBeforeArmed(msg->msg_iov, msg->msg_iovlen, &armed);
    if (!armed)
        return next(fd, msg, flags);
    if (head.empty()) {
        errno = EFAULT;
        return -1;
    }
    msghdr m = *msg;
    m.msg_iov = head.data();
    m.msg_iovlen = head.size();
    return next(fd, &m, flags);
}

// The process's process_vm_readv: a read into this process stops short of an armed page, and
// one that would start on it raises the tripwire's signal, as a copy into it in user space would.
extern "C" ssize_t process_vm_readv(pid_t pid, const struct iovec *local, unsigned long liovcnt,
                                    const struct iovec *remote, unsigned long riovcnt,
                                    unsigned long flags)
{
    using ReadvFn = ssize_t (*)(pid_t, const struct iovec *, unsigned long, const struct iovec *,
                                unsigned long, unsigned long);
    static const ReadvFn next = reinterpret_cast<ReadvFn>(dlsym(RTLD_NEXT, "process_vm_readv"));
    bool armed;
    const std::vector<iovec> head = loomtest::HeadBeforeArmed(local, liovcnt, &armed);
    if (!armed)
        return next(pid, local, liovcnt, remote, riovcnt, flags);
    if (head.empty()) {
        errno = EFAULT;
        return -1;
    }
    return next(pid, head.data(), head.size(), remote, riovcnt, flags);
}
