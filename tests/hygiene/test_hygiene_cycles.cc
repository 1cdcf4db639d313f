// SPDX-License-Identifier: Apache-2.0
//
// test_hygiene_cycles.cc - communicator lifetimes leave a process as they found it: 200
// create/use/destroy cycles on 3 ranks (fresh ids and splits, shm and tcp, streams, a group over
// two communicators), and 50 cycles in which a fresh child joins as the third rank, is SIGKILLed,
// and the survivors see it fail and call loomCommAbort (also with a stream task still blocked).
// Afterwards every survivor has the descriptors and threads of before its first loom call, the
// malloc bytes in use of after warm-up (within a margin; the sanitizer allocator's count under
// ASan and TSan), no leak (LeakSanitizer, ASan builds), no segment mapped and none left in
// /dev/shm; the numbers are printed. Resident memory is bounded only without a sanitizer. One
// checked operation per cycle; correctness is the soak's. Run by meson's 'hygiene' suite.

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "loom.h"
#include "mp_fixture.h"
#include "resources.h"
#include "verify.h"

namespace {

using loomtest::Resources;

constexpr int kWarmupCycles = 8;
constexpr int kCreateCycles = 200;
constexpr int kKillCycles = 50;
// Allowed growth of malloc bytes in use over the cycles: per-thread caches of the C library and
// of gtest may settle a little after warm-up; a leak of one communicator is far larger.
constexpr size_t kMallocMarginBytes = 64 * 1024;
// Resident memory is coarse: memory freed by a short-lived thread (the rendezvous service's
// buffers) may stay resident in the C library's per-thread arenas, and cached thread stacks stay
// mapped; so it is bounded loosely. mallinfo2 and the segment mappings are the precise checks.
constexpr size_t kRssMarginBytes = 32 * 1024 * 1024;
// The rendezvous service of a communicator is a detached thread that ends right after the last
// rank leaves the rendezvous; give it this long to leave the task list.
constexpr int kSettleMs = 10000;

loomConfig_t Config(const char *net, int timeout_ms)
{
    loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
    cfg.net = net;
    cfg.timeout_ms = timeout_ms;
    return cfg;
}

bool Dead(loomResult_t r)
{
    return r == loomRemoteError || r == loomTimeout;
}

// One float32 sum all-reduce of count elements, checked exactly. With a stream it is queued and
// synchronized.
void CheckAllReduce(loomComm_t comm, int nranks, int rank, uint64_t seed, size_t count,
                    loomStream_t stream = nullptr)
{
    std::vector<float> in(count), out(count), want(count);
    loomtest::FillReduceInput(in.data(), loomFloat32, loomSum, rank, seed, 0, count);
    loomtest::FillReduceExpected(want.data(), loomFloat32, loomSum, nranks, seed, 0, count);
    XT_CHECK_LOOM(loomAllReduce(in.data(), out.data(), count, loomFloat32, loomSum, comm, stream));
    if (stream != nullptr)
        XT_CHECK_LOOM(loomStreamSynchronize(stream));
    const std::string diff = loomtest::CompareElements(out.data(), want.data(), count, loomFloat32);
    XT_CHECK_MSG(diff.empty(), diff);
}

std::string Lines(const std::vector<std::string> &items)
{
    std::string s;
    for (const std::string &t : items)
        s += "\n  " + t;
    return s;
}

// Compares the snapshots: descriptors, threads and mappings with those before the first loom
// call (`start`, `end`: no communicator alive); malloc bytes and resident memory with those
// after warm-up (`warm`, `cycled`: taken in the same state, e.g. with the world communicator
// alive). Fails the rank with every difference.
void CheckBaseline(const char *what, const Resources &start, const Resources &warm,
                   const Resources &cycled, const Resources &end,
                   const loomtest::ParentReport &report)
{
    const int rank = loomtest::CurrentRank();
    report.Send("rank " + std::to_string(rank) + " " + what + ":\n    before loom:       " +
                start.Describe() + "\n    after warm-up:     " + warm.Describe() +
                "\n    after the cycles:  " + cycled.Describe() +
                "\n    after the last:    " + end.Describe());
    XT_CHECK_MSG(end.fds == start.fds, "descriptors before:" + Lines(start.fd_targets) +
                                           "\nafter:" + Lines(end.fd_targets));
    XT_CHECK_MSG(end.threads == start.threads, "threads before:" + Lines(start.thread_names) +
                                                   "\nafter:" + Lines(end.thread_names));
    XT_CHECK_EQ(end.shm_mappings, 0);
    const std::vector<std::string> shm = loomtest::ShmSegmentsOf(getpid());
    XT_CHECK_MSG(shm.empty(), "left in /dev/shm: " + shm.front());
    // LeakSanitizer (ASan builds): nothing unreachable now, with the world communicator gone.
    XT_CHECK_EQ(loomtest::LeakCheckRank(), 0);
    // Every build, TSan's included: the bytes the allocator hands out stay flat over the cycles.
    XT_CHECK_MSG(cycled.malloc_in_use <= warm.malloc_in_use + kMallocMarginBytes,
                 "malloc bytes in use grew from " + std::to_string(warm.malloc_in_use) + " to " +
                     std::to_string(cycled.malloc_in_use));
    if (loomtest::UnderSanitizer()) {
        // Quarantine and shadow memory grow the resident set whatever the library does.
        report.Send("rank " + std::to_string(rank) + " " + what +
                    ": resident memory not bounded under a sanitizer (malloc bytes are)");
        return;
    }
    XT_CHECK_MSG(cycled.rss_bytes <= warm.rss_bytes + kRssMarginBytes,
                 "resident memory grew from " + std::to_string(warm.rss_bytes) + " to " +
                     std::to_string(cycled.rss_bytes) + " bytes");
}

Resources SettledSnapshot(int threads)
{
    loomtest::SettleThreads(threads, kSettleMs);
    return loomtest::Snapshot();
}

// ---- create / use / destroy ---------------------------------------------------------------------

// Cycle i on 3 ranks, rotating through four ways a communicator is made and used.
void CreateCycle(int i, int rank, int n, loomComm_t world)
{
    const uint64_t seed = static_cast<uint64_t>(i) + 1;
    loomtest::SetContext("create/destroy cycle " + std::to_string(i));
    loomComm_t comm = nullptr;
    switch (i % 4) {
    case 0: { // fresh id, shared memory, blocking call
        loomUniqueId id;
        loomtest::ShareUniqueId(&id);
        loomConfig_t cfg = Config("shm", LOOM_CONFIG_UNDEF_INT);
        XT_CHECK_LOOM(loomCommInitRankConfig(&comm, n, id, rank, &cfg));
        CheckAllReduce(comm, n, rank, seed, 1000);
        break;
    }
    case 1: { // fresh id, tcp, on a stream of its own
        loomUniqueId id;
        loomtest::ShareUniqueId(&id);
        loomConfig_t cfg = Config("tcp", LOOM_CONFIG_UNDEF_INT);
        XT_CHECK_LOOM(loomCommInitRankConfig(&comm, n, id, rank, &cfg));
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        CheckAllReduce(comm, n, rank, seed, 70000, s);
        XT_CHECK_LOOM(loomStreamDestroy(s));
        break;
    }
    case 2: { // split of the world (shared memory), then a group over both communicators
        XT_CHECK_LOOM(loomCommSplit(world, 0, n - rank, &comm, nullptr));
        int32_t a = rank, b = 10 * rank, sum_a = -1, sum_b = -1;
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_LOOM(loomAllReduce(&a, &sum_a, 1, loomInt32, loomSum, world, nullptr));
        XT_CHECK_LOOM(loomAllReduce(&b, &sum_b, 1, loomInt32, loomSum, comm, nullptr));
        XT_CHECK_LOOM(loomGroupEnd());
        XT_CHECK_EQ(sum_a, n * (n - 1) / 2);
        XT_CHECK_EQ(sum_b, 10 * n * (n - 1) / 2);
        break;
    }
    default: { // split over tcp, Send/Recv ring in a group
        loomConfig_t cfg = Config("tcp", LOOM_CONFIG_UNDEF_INT);
        XT_CHECK_LOOM(loomCommSplit(world, 7, rank, &comm, &cfg));
        const int right = (rank + 1) % n, left = (rank + n - 1) % n;
        std::vector<unsigned char> out(5000), in(5000);
        loomtest::FillPattern(out.data(), out.size(), rank, seed);
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_LOOM(loomSend(out.data(), out.size(), loomUint8, right, comm, nullptr));
        XT_CHECK_LOOM(loomRecv(in.data(), in.size(), loomUint8, left, comm, nullptr));
        XT_CHECK_LOOM(loomGroupEnd());
        std::vector<unsigned char> want(in.size());
        loomtest::FillPattern(want.data(), want.size(), left, seed);
        XT_CHECK(in == want);
        break;
    }
    }
    XT_CHECK_LOOM(loomCommDestroy(comm));
}

TEST(Hygiene, CreateDestroyCyclesReturnToBaseline)
{
    loomtest::ParentReport report;
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.deadline_s = 300;
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [&](int rank, int n, loomComm_t) {
            loomtest::StartRuntimeThreads();
            const Resources start = loomtest::Snapshot();
            loomComm_t world = loomtest::CreateComm();
            for (int i = 0; i < kWarmupCycles; i++)
                CreateCycle(i, rank, n, world);
            const Resources warm = SettledSnapshot(start.threads);
            for (int i = kWarmupCycles; i < kWarmupCycles + kCreateCycles; i++)
                CreateCycle(i, rank, n, world);
            loomtest::SetContext("after the cycles");
            const Resources cycled = SettledSnapshot(start.threads);
            XT_CHECK_LOOM(loomCommDestroy(world));
            CheckBaseline("create/destroy", start, warm, cycled, SettledSnapshot(start.threads),
                          report);
        },
        opts));
    printf("%d create/destroy cycles after %d warm-up cycles on 3 ranks:\n%s", kCreateCycles,
           kWarmupCycles, report.Collect().c_str());
}

// ---- create / kill a peer / abort -------------------------------------------------------------

// In the rank that plays the victims: forks a child that joins as rank 2, runs one all-reduce
// and reports; then SIGKILLs it. The all-reduce may fail: a survivor that already has every
// contribution may abort (and say so to its peers) before the victim has its own. The forking
// process itself never calls loom, so the child starts with no library state.
void VictimCycle(int i, const loomUniqueId &id, const loomConfig_t &cfg)
{
    int ready[2];
    XT_CHECK(pipe(ready) == 0);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    XT_CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        close(ready[0]);
        loomConfig_t mine = cfg;
        loomComm_t comm = nullptr;
        XT_CHECK_LOOM(loomCommInitRankConfig(&comm, 3, id, 2, &mine));
        std::vector<float> in(3000), out(3000);
        const uint64_t seed = static_cast<uint64_t>(i) + 1;
        loomtest::FillReduceInput(in.data(), loomFloat32, loomSum, 2, seed, 0, in.size());
        const loomResult_t r =
            loomAllReduce(in.data(), out.data(), in.size(), loomFloat32, loomSum, comm, nullptr);
        XT_CHECK_MSG(r == loomSuccess || Dead(r), loomtest::Show(r));
        if (r == loomSuccess) {
            std::vector<float> want(in.size());
            loomtest::FillReduceExpected(want.data(), loomFloat32, loomSum, 3, seed, 0,
                                         want.size());
            XT_CHECK(out == want);
        }
        const char state = r == loomSuccess ? 'R' : 'A';
        XT_CHECK(write(ready[1], &state, 1) == 1);
        for (;;)
            pause(); // until the SIGKILL
    }
    close(ready[1]);
    char got = 0;
    ssize_t r;
    while ((r = read(ready[0], &got, 1)) < 0 && errno == EINTR) {
    }
    close(ready[0]);
    kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    XT_CHECK_MSG(r == 1 && (got == 'R' || got == 'A'),
                 "the victim of cycle " + std::to_string(i) +
                     " failed before it was killed (see this log)");
    XT_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

// In a survivor: join, run all-reduces until one fails because the victim is gone, abort.
// Cycles rotate: the failure seen by a blocking call; by a stream task at synchronize; or a
// stream task still blocked when loomCommAbort is called from this thread.
void SurvivorCycle(int i, int rank, const loomUniqueId &id, const loomConfig_t &cfg)
{
    const uint64_t seed = static_cast<uint64_t>(i) + 1;
    loomConfig_t mine = cfg;
    loomComm_t comm = nullptr;
    XT_CHECK_LOOM(loomCommInitRankConfig(&comm, 3, id, rank, &mine));
    std::vector<float> in(3000), out(3000);
    loomtest::FillReduceInput(in.data(), loomFloat32, loomSum, rank, seed, 0, in.size());
    // The victim is killed after its first all-reduce: ours may complete or see the death.
    loomResult_t first =
        loomAllReduce(in.data(), out.data(), in.size(), loomFloat32, loomSum, comm, nullptr);
    XT_CHECK_MSG(first == loomSuccess || Dead(first), loomtest::Show(first));
    if (first == loomSuccess) {
        std::vector<float> want(in.size());
        loomtest::FillReduceExpected(want.data(), loomFloat32, loomSum, 3, seed, 0, want.size());
        XT_CHECK(out == want);
        // The victim never joins a second all-reduce, so this one must fail.
        switch (i % 3) {
        case 0: {
            const loomResult_t r = loomAllReduce(in.data(), out.data(), in.size(), loomFloat32,
                                                 loomSum, comm, nullptr);
            XT_CHECK_MSG(Dead(r), loomtest::Show(r));
            break;
        }
        case 1: {
            loomStream_t s = nullptr;
            XT_CHECK_LOOM(loomStreamCreate(&s));
            XT_CHECK_LOOM(
                loomAllReduce(in.data(), out.data(), in.size(), loomFloat32, loomSum, comm, s));
            const loomResult_t r = loomStreamSynchronize(s);
            XT_CHECK_MSG(Dead(r), loomtest::Show(r));
            XT_CHECK_LOOM(loomStreamDestroy(s));
            break;
        }
        default: {
            loomStream_t s = nullptr;
            XT_CHECK_LOOM(loomStreamCreate(&s));
            XT_CHECK_LOOM(
                loomAllReduce(in.data(), out.data(), in.size(), loomFloat32, loomSum, comm, s));
            XT_CHECK_LOOM(loomCommAbort(comm)); // the stream task may still be waiting
            comm = nullptr;
            const loomResult_t r = loomStreamDestroy(s);
            XT_CHECK_MSG(Dead(r), loomtest::Show(r));
            break;
        }
        }
    }
    XT_CHECK_LOOM(loomCommAbort(comm));
}

TEST(Hygiene, KillPeerAbortCyclesReturnToBaseline)
{
    loomtest::ParentReport report;
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.deadline_s = 300;
    opts.env = {{"LOOM_TIMEOUT_MS", "2000"}};
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [&](int rank, int, loomComm_t) {
            loomtest::StartRuntimeThreads();
            const Resources start = loomtest::Snapshot();
            Resources warm;
            for (int i = 0; i < kWarmupCycles + kKillCycles; i++) {
                if (i == kWarmupCycles)
                    warm = SettledSnapshot(start.threads);
                loomtest::SetContext("kill/abort cycle " + std::to_string(i));
                loomUniqueId id;
                loomtest::ShareUniqueId(&id);
                const loomConfig_t cfg = Config(i % 2 ? "tcp" : "shm", 2000);
                if (rank == 2)
                    VictimCycle(i, id, cfg);
                else
                    SurvivorCycle(i, rank, id, cfg);
            }
            loomtest::SetContext("after the cycles");
            if (rank != 2) {
                const Resources end = SettledSnapshot(start.threads);
                CheckBaseline("kill/abort", start, warm, end, end, report);
            }
        },
        opts));
    printf("%d kill/abort cycles after %d warm-up cycles (3 ranks, survivors 0 and 1):\n%s",
           kKillCycles, kWarmupCycles, report.Collect().c_str());
}

} // namespace
