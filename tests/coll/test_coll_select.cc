// SPDX-License-Identifier: Apache-2.0
//
// test_coll_select.cc - the choice of algorithm seen from outside: every rank of a communicator
// must pick the same algorithm for every call, including after LOOM_CALIBRATE=1 measured each
// rank's own (different) constants, because ranks that disagree deadlock. Checked through the
// COLL log (LOOM_DEBUG_FILE per rank): the agreed constants are identical on every rank and are
// the maximum of what the ranks measured, the link class is the slowest link's, every call's
// algorithm is the same on every rank, LOOM_COST_SHM steers the choice, calls alternating
// between sizes keep each size's choice, AllToAllv takes the hierarchy wherever the ranks span
// hosts of equal size (and pairwise elsewhere, or when LOOM_ALGO says so), and a LOOM_ALGO name
// that does not exist is reported once; and how waits spin (yielding the CPU where ranks
// outnumber the CPUs). Run by meson's 'coll' suite.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "loom.h"
#include "mp_fixture.h"

namespace {

std::string TracePath(int rank)
{
    return loomtest::RunDir() + "/trace" + std::to_string(rank) + ".log";
}

std::vector<std::string> ReadLines(const std::string &path)
{
    std::ifstream f(path);
    std::vector<std::string> lines;
    std::string line;
    while (std::getline(f, line))
        lines.push_back(line);
    return lines;
}

// The text after `key` up to the end of the line, or "" if no line has it.
std::string After(const std::vector<std::string> &lines, const std::string &key)
{
    for (const std::string &l : lines) {
        size_t at = l.find(key);
        if (at != std::string::npos)
            return l.substr(at + key.size());
    }
    return "";
}

// "class tcp alpha 123 ns beta 0.5 ns/B gamma 0.2 ns/B o 4 ns" -> class and the numbers.
struct Constants {
    std::string cls;
    double alpha = -1, beta = -1, gamma = -1, o = -1;
};

Constants Parse(const std::string &text)
{
    Constants c;
    std::istringstream in(text);
    std::string word;
    while (in >> word) {
        if (word == "class")
            in >> c.cls;
        else if (word == "alpha")
            in >> c.alpha;
        else if (word == "beta")
            in >> c.beta;
        else if (word == "gamma")
            in >> c.gamma;
        else if (word == "o")
            in >> c.o;
    }
    return c;
}

// seq -> "collective algo" for every traced call of one rank.
std::map<long, std::string> Choices(const std::vector<std::string> &lines)
{
    std::map<long, std::string> m;
    for (const std::string &l : lines) {
        size_t s = l.find(" seq "), a = l.find(" algo ");
        if (s == std::string::npos || a == std::string::npos)
            continue;
        size_t start = l.rfind(' ', s - 1);
        std::string coll = l.substr(start + 1, s - start - 1);
        long seq = std::strtol(l.c_str() + s + 5, nullptr, 10);
        std::istringstream rest(l.substr(a + 6));
        std::string algo;
        rest >> algo;
        m[seq] = coll + " " + algo;
    }
    return m;
}

// A sweep of collectives whose sizes cross the model's thresholds; results are checked.
void Sweep(int rank, int n, loomComm_t comm)
{
    for (size_t count :
         {size_t{1}, size_t{16}, size_t{256}, size_t{4096}, size_t{65536}, size_t{1} << 20}) {
        std::vector<float> v(count, static_cast<float>(rank + 1)), out(count);
        XT_CHECK_LOOM(
            loomAllReduce(v.data(), out.data(), count, loomFloat32, loomSum, comm, nullptr));
        XT_CHECK_EQ(out[count - 1], static_cast<float>(n * (n + 1) / 2));
        std::vector<float> all(count * static_cast<size_t>(n));
        XT_CHECK_LOOM(loomAllGather(v.data(), all.data(), count, loomFloat32, comm, nullptr));
        XT_CHECK_EQ(all[count * static_cast<size_t>(n) - 1], static_cast<float>(n));
        XT_CHECK_LOOM(loomBroadcast(v.data(), out.data(), count, loomFloat32, 0, comm, nullptr));
        XT_CHECK_EQ(out[0], 1.0f);
    }
}

// In rank 0, during a last synchronising call (every rank has traced the calls before it, not
// necessarily that one): the same algorithm on every rank for every earlier call. Returns rank
// 0's choices without the last call.
std::map<long, std::string> CheckSameChoices(int n)
{
    std::map<long, std::string> mine = Choices(ReadLines(TracePath(0)));
    if (!mine.empty())
        mine.erase(std::prev(mine.end()));
    XT_CHECK_MSG(mine.size() >= 18, "too few traced calls");
    for (int r = 1; r < n; r++) {
        const std::map<long, std::string> theirs = Choices(ReadLines(TracePath(r)));
        for (const auto &kv : mine) {
            auto it = theirs.find(kv.first);
            XT_CHECK_MSG(it != theirs.end(), "rank " + std::to_string(r) + " did not trace seq " +
                                                 std::to_string(kv.first));
            XT_CHECK_MSG(it->second == kv.second, "seq " + std::to_string(kv.first) + ": rank 0 " +
                                                      kv.second + ", rank " + std::to_string(r) +
                                                      " " + it->second);
        }
    }
    return mine;
}

loomtest::RunOptions TraceOptions(const loomtest::EnvList &extra)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_COLL_TRACE", "1"}, {"LOOM_DEBUG", "INFO"}, {"LOOM_DEBUG_SUBSYS", "COLL"}};
    opts.env.insert(opts.env.end(), extra.begin(), extra.end());
    opts.unset_env = {"LOOM_ALGO", "LOOM_COST_SHM", "LOOM_COST_TCP", "LOOM_CALIBRATE"};
    opts.rank_env = [](int rank) {
        return loomtest::EnvList{{"LOOM_DEBUG_FILE", TracePath(rank)}};
    };
    opts.deadline_s = 60;
    return opts;
}

// Calibration: each rank measures its own constants; all must adopt the same (the maximum),
// and then choose alike. hosts > 0 models that many hosts (LOOM_HOST_ID), so the class is tcp.
void CheckCalibrated(int rank, int n, loomComm_t comm, const char *want_class)
{
    Sweep(rank, n, comm);
    float x = 1, y = 0; // every rank has traced everything before this call returns on rank 0
    XT_CHECK_LOOM(loomAllReduce(&x, &y, 1, loomFloat32, loomSum, comm, nullptr));
    if (rank != 0)
        return;
    Constants agreed0, max;
    max.cls = "shm";
    for (int r = 0; r < n; r++) {
        const std::vector<std::string> lines = ReadLines(TracePath(r));
        const std::string agreed_text = After(lines, "calibration agreed: ");
        const Constants measured = Parse(After(lines, "calibration measured: "));
        const Constants agreed = Parse(agreed_text);
        XT_CHECK_MSG(!agreed_text.empty() && measured.alpha > 0,
                     "rank " + std::to_string(r) + " logged no calibration");
        if (r == 0)
            agreed0 = agreed;
        // Identical constants on every rank: the text is printed with round-trip precision.
        XT_CHECK_MSG(agreed_text == After(ReadLines(TracePath(0)), "calibration agreed: "),
                     "rank " + std::to_string(r) + " agreed on " + agreed_text);
        max.alpha = std::max(max.alpha, measured.alpha);
        max.beta = std::max(max.beta, measured.beta);
        max.gamma = std::max(max.gamma, measured.gamma);
        max.o = std::max(max.o, measured.o);
        if (measured.cls == "tcp")
            max.cls = "tcp";
    }
    XT_CHECK_EQ(agreed0.alpha, max.alpha);
    XT_CHECK_EQ(agreed0.beta, max.beta);
    XT_CHECK_EQ(agreed0.gamma, max.gamma);
    XT_CHECK_EQ(agreed0.o, max.o);
    XT_CHECK_EQ(agreed0.cls, max.cls);
    XT_CHECK_EQ(agreed0.cls, std::string(want_class));
    CheckSameChoices(n);
}

TEST(Select, CalibrationAgreesOnShm)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        4, [](int rank, int n, loomComm_t comm) { CheckCalibrated(rank, n, comm, "shm"); },
        TraceOptions({{"LOOM_CALIBRATE", "1"}, {"LOOM_NET", "shm"}})));
}

TEST(Select, CalibrationAgreesAcrossHosts)
{
    // Hosts of two ranks each: ranks 0 and 1 reach each other through shared memory, but the
    // communicator's class is its slowest link's, tcp, on every rank.
    loomtest::RunOptions opts = TraceOptions({{"LOOM_CALIBRATE", "1"}});
    opts.rank_env = [](int rank) {
        return loomtest::EnvList{{"LOOM_DEBUG_FILE", TracePath(rank)},
                                 {"LOOM_HOST_ID", "host" + std::to_string(rank / 2)}};
    };
    XT_ASSERT_RUN(loomtest::RunRanks(
        3, [](int rank, int n, loomComm_t comm) { CheckCalibrated(rank, n, comm, "tcp"); }, opts));
}

// How each rank's waits spin, as its P2P log says: LOOM_SPIN_US, yielding the CPU on every pass
// exactly where this machine's ranks outnumber its CPUs.
void CheckSpin(int rank, int n, loomComm_t comm)
{
    const std::string line = After(ReadLines(TracePath(rank)), "waits spin ");
    const bool crowded = n > sysconf(_SC_NPROCESSORS_ONLN);
    XT_CHECK_MSG(line.rfind("7 us", 0) == 0, "waits spin " + line);
    XT_CHECK_MSG((line.find("yielding the CPU") != std::string::npos) == crowded,
                 std::to_string(n) + " ranks: waits spin " + line);
    float x = 1, y = 0;
    XT_CHECK_LOOM(loomAllReduce(&x, &y, 1, loomFloat32, loomSum, comm, nullptr));
    XT_CHECK_EQ(y, static_cast<float>(n));
}

TEST(Select, WaitsYieldWhereRanksOutnumberCpus)
{
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    for (int n : {2, static_cast<int>(cpus) + 1}) {
        if (n > 8)
            continue; // a machine this large checks only the uncrowded case
        // The later LOOM_DEBUG_SUBSYS replaces TraceOptions' COLL.
        XT_ASSERT_RUN(loomtest::RunRanks(
            n, CheckSpin,
            TraceOptions(
                {{"LOOM_NET", "tcp"}, {"LOOM_SPIN_US", "7"}, {"LOOM_DEBUG_SUBSYS", "P2P"}})));
    }
}

// Without calibration every rank uses the defaults of the class; LOOM_NET=tcp makes it tcp.
void CheckClass(int rank, int n, loomComm_t comm, const char *want)
{
    Sweep(rank, n, comm);
    const std::string line = After(ReadLines(TracePath(rank)), "link class ");
    XT_CHECK_MSG(line.rfind(want, 0) == 0, "link class " + line);
    float x = 1, y = 0;
    XT_CHECK_LOOM(loomAllReduce(&x, &y, 1, loomFloat32, loomSum, comm, nullptr));
    if (rank == 0)
        CheckSameChoices(n);
}

TEST(Select, DefaultsOnTcp)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        5, [](int rank, int n, loomComm_t comm) { CheckClass(rank, n, comm, "tcp"); },
        TraceOptions({{"LOOM_NET", "tcp"}})));
}

// LOOM_COST_SHM steers the model (without the shm arena, whose family would win): with latency free
// and bandwidth dear, AllReduce takes the fewest bytes (never recursive doubling at 1 MiB); with
// bandwidth free and latency dear, the fewest steps (recursive doubling, even at 4 MiB).
void CheckSteered(int rank, int n, loomComm_t comm, const char *want, const char *not_want)
{
    Sweep(rank, n, comm);
    float x = 1, y = 0;
    XT_CHECK_LOOM(loomAllReduce(&x, &y, 1, loomFloat32, loomSum, comm, nullptr));
    if (rank != 0)
        return;
    const std::map<long, std::string> choices = CheckSameChoices(n);
    int big = 0;
    for (const std::string &l : ReadLines(TracePath(0))) {
        if (l.find(" allreduce seq ") == std::string::npos ||
            l.find(": 4194304 bytes") == std::string::npos)
            continue;
        big++;
        if (want)
            XT_CHECK_MSG(l.find(std::string(" algo ") + want + " ") != std::string::npos, l);
        if (not_want)
            XT_CHECK_MSG(l.find(std::string(" algo ") + not_want + " ") == std::string::npos, l);
    }
    XT_CHECK_EQ(big, 1);
}

TEST(Select, CostConstantsSteerTheChoice)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        4, [](int rank, int n, loomComm_t comm) { CheckSteered(rank, n, comm, nullptr, "rd"); },
        TraceOptions({{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "0"}, {"LOOM_COST_SHM", "0,10,0"}})));
    XT_ASSERT_RUN(loomtest::RunRanks(
        4, [](int rank, int n, loomComm_t comm) { CheckSteered(rank, n, comm, "rd", nullptr); },
        TraceOptions(
            {{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "0"}, {"LOOM_COST_SHM", "100000,0,0"}})));
}

// loomCommPlan names what a call runs: the trace of the call that follows says the same
// algorithm, and the model's prediction is there unless the shm family picks the variant.
void CheckPlan(int rank, int n, loomComm_t comm)
{
    const size_t count = size_t{1} << 16;
    const char *algo = nullptr;
    double us = 0;
    XT_CHECK_LOOM(loomCommPlan(comm, loomCollAllReduce, count, loomFloat32, &algo, &us));
    XT_CHECK(algo != nullptr);
    XT_CHECK_MSG(us > 0, std::to_string(us)); // the shm family's variant is predicted too
    std::vector<float> v(count, 1.0f), out(count);
    XT_CHECK_LOOM(loomAllReduce(v.data(), out.data(), count, loomFloat32, loomSum, comm, nullptr));
    XT_CHECK_EQ(out[0], static_cast<float>(n));
    bool seen = false;
    for (const std::string &l : ReadLines(TracePath(rank)))
        if (l.find(" allreduce seq ") != std::string::npos &&
            l.find(": 262144 bytes") != std::string::npos)
            seen = l.find(std::string(" algo ") + algo + " ") != std::string::npos;
    XT_CHECK_MSG(seen, std::string("no trace of ") + algo);
    // Every collective has a plan; LOOM_ALGO's choice included.
    for (int k = 0; k < loomNumCollectives; k++)
        XT_CHECK_LOOM(
            loomCommPlan(comm, static_cast<loomCollective_t>(k), 8, loomFloat32, &algo, nullptr));
}

TEST(Select, PlanNamesWhatTheCallRuns)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        3, [](int rank, int n, loomComm_t comm) { CheckPlan(rank, n, comm); }, TraceOptions({})));
    XT_ASSERT_RUN(loomtest::RunRanks(
        3, [](int rank, int n, loomComm_t comm) { CheckPlan(rank, n, comm); },
        TraceOptions({{"LOOM_NET", "tcp"}})));
    XT_ASSERT_RUN(loomtest::RunRanks(
        3, [](int rank, int n, loomComm_t comm) { CheckPlan(rank, n, comm); },
        TraceOptions({{"LOOM_NET", "tcp"}, {"LOOM_ALGO", "allreduce:ring"}})));
}

// The choice is remembered per collective (algo_select.c): calls that alternate between sizes
// whose best algorithms differ must each get their size's algorithm, as the first call of that
// size did, not the previous call's.
void CheckAlternating(int rank, int n, loomComm_t comm)
{
    const size_t big = size_t{1} << 20;
    for (size_t count : {size_t{1}, big, size_t{1}, big, size_t{4}, big, size_t{4}, size_t{1}}) {
        std::vector<float> v(count, static_cast<float>(rank + 1)), out(count);
        XT_CHECK_LOOM(
            loomAllReduce(v.data(), out.data(), count, loomFloat32, loomSum, comm, nullptr));
        XT_CHECK_EQ(out[count - 1], static_cast<float>(n * (n + 1) / 2));
    }
    std::map<std::string, std::string> by_bytes; // "N bytes" -> algo of its first call
    std::map<std::string, int> algos;
    int calls = 0;
    for (const std::string &l : ReadLines(TracePath(rank))) {
        size_t s = l.find(" allreduce seq "), a = l.find(" algo ");
        if (s == std::string::npos || a == std::string::npos)
            continue;
        size_t b = l.find(": ", s) + 2;
        std::string bytes = l.substr(b, l.find(' ', b) - b);
        std::istringstream rest(l.substr(a + 6));
        std::string algo;
        rest >> algo;
        calls++;
        algos[algo]++;
        auto it = by_bytes.emplace(bytes, algo).first;
        XT_CHECK_MSG(it->second == algo, bytes + " bytes: " + algo + " after " + it->second);
    }
    XT_CHECK_EQ(calls, 8);
    XT_CHECK_MSG(algos.size() >= 2, "the sizes do not cross a threshold of the model");
}

TEST(Select, AlternatingSizesKeepTheirChoice)
{
    // The built-in constants (LOOM_CALIBRATE=0): where the model's thresholds fall with measured
    // ones depends on the machine and its load (on a loaded one both sizes can take one
    // algorithm), and the point here is only that a size's choice never depends on the calls
    // before it.
    XT_ASSERT_RUN(loomtest::RunRanks(
        4, CheckAlternating,
        TraceOptions({{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "0"}, {"LOOM_CALIBRATE", "0"}})));
}

// AllToAllv's counts differ per rank, so the layout alone chooses its algorithm: every rank
// traces `want` for one call whose blocks of 0, 3 and 100000 floats (0 B to 400 KB, both sides of
// the hierarchy's small-block limit) all arrive in place.
void CheckAllToAllv(int rank, int n, loomComm_t comm, const std::string &want)
{
    const auto count = [](int s, int d) {
        const size_t sizes[] = {0, 3, 100000};
        return sizes[(s + 2 * d) % 3];
    };
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t stotal = 0, rtotal = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = count(rank, j);
        sd[j] = stotal;
        stotal += sc[j];
        rc[j] = count(j, rank);
        rd[j] = rtotal;
        rtotal += rc[j];
    }
    std::vector<float> in(stotal + 1), out(rtotal + 1, -1.0f);
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < sc[j]; i++)
            in[sd[j] + i] = static_cast<float>(1000 * rank + j);
    XT_CHECK_LOOM(loomAllToAllv(in.data(), sc.data(), sd.data(), out.data(), rc.data(), rd.data(),
                                loomFloat32, comm, nullptr));
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < rc[j]; i++)
            XT_CHECK_EQ(out[rd[j] + i], static_cast<float>(1000 * j + rank));
    int calls = 0;
    for (const std::string &l : ReadLines(TracePath(rank))) {
        if (l.find(" alltoallv seq ") == std::string::npos)
            continue;
        calls++;
        XT_CHECK_MSG(l.find(" algo " + want + " ") != std::string::npos, l);
    }
    XT_CHECK_EQ(calls, 1);
}

// TraceOptions, with rank r on the host host_of(r) (LOOM_HOST_ID).
loomtest::RunOptions HostsOptions(const loomtest::EnvList &extra, int (*host_of)(int))
{
    loomtest::RunOptions opts = TraceOptions(extra);
    opts.rank_env = [host_of](int rank) {
        return loomtest::EnvList{{"LOOM_DEBUG_FILE", TracePath(rank)},
                                 {"LOOM_HOST_ID", "host" + std::to_string(host_of(rank))}};
    };
    return opts;
}

TEST(Select, AllToAllvTakesTheHierarchyAcrossHosts)
{
    const auto run = [](int nranks, const std::string &want, const loomtest::RunOptions &opts) {
        return loomtest::RunRanks(
            nranks, [&](int rank, int n, loomComm_t comm) { CheckAllToAllv(rank, n, comm, want); },
            opts);
    };
    int (*pairs)(int) = [](int rank) { return rank / 2; };
    int (*cyclic)(int) = [](int rank) { return rank % 2; };
    int (*uneven)(int) = [](int rank) { return rank < 2 ? 0 : 1; };
    // 2 hosts x 2, in blocks or dealt round-robin: pairwise on the built-in constants
    // (LOOM_CALIBRATE=0: measured ones depend on the machine), where the one message the
    // hierarchy saves is worth less than its second step and its copies; the hierarchy where
    // messages cost more (o of 100 us). LOOM_ALGO forces either (pairwise for AllToAllv, or for
    // every collective that has it).
    // Calibration off here too: the hierarchy's steps inside a host are priced with the shm
    // class's constants, which measured ones would make depend on the machine and its load.
    const loomtest::EnvList costly = {{"LOOM_COST_TCP", "120,0.5,0.15,100"},
                                      {"LOOM_CALIBRATE", "0"}};
    XT_ASSERT_RUN(run(4, "pairwise", HostsOptions({{"LOOM_CALIBRATE", "0"}}, pairs)));
    XT_ASSERT_RUN(run(4, "hier", HostsOptions(costly, pairs)));
    XT_ASSERT_RUN(run(4, "hier", HostsOptions(costly, cyclic)));
    XT_ASSERT_RUN(run(4, "hier", HostsOptions({{"LOOM_ALGO", "alltoallv:hier"}}, cyclic)));
    XT_ASSERT_RUN(
        run(4, "pairwise",
            HostsOptions({{"LOOM_ALGO", "alltoallv:pairwise"}, costly[0], costly[1]}, pairs)));
    XT_ASSERT_RUN(
        run(4, "pairwise", HostsOptions({{"LOOM_ALGO", "pairwise"}, costly[0], costly[1]}, pairs)));
    // No hierarchy: one host (over tcp, so no shm arena either), or hosts of 2 and 1 ranks.
    XT_ASSERT_RUN(run(4, "pairwise", TraceOptions({{"LOOM_NET", "tcp"}})));
    XT_ASSERT_RUN(run(3, "pairwise", HostsOptions({}, uneven)));
}

// A LOOM_ALGO entry that names no algorithm of its collective is reported once per process,
// and the calls run with the model's choice.
void CheckReported(int rank, int n, loomComm_t comm, const std::string &warning)
{
    Sweep(rank, n, comm);
    int warnings = 0;
    for (const std::string &l : ReadLines(TracePath(rank)))
        warnings += l.find(warning) != std::string::npos;
    XT_CHECK_EQ(warnings, 1);
}

TEST(Select, UnknownAlgorithmIsReported)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t comm) {
            CheckReported(rank, n, comm,
                          "LOOM_ALGO: no algorithm \"nosuch\" for collective \"allreduce\"");
        },
        TraceOptions({{"LOOM_NET", "shm"}, {"LOOM_ALGO", "allreduce:nosuch"}})));
    // An algorithm of another collective.
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t comm) {
            CheckReported(rank, n, comm,
                          "LOOM_ALGO: no algorithm \"bruck\" for collective \"allgather\"");
        },
        TraceOptions({{"LOOM_NET", "shm"}, {"LOOM_ALGO", "allgather:bruck"}})));
}

} // namespace
