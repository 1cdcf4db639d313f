/* SPDX-License-Identifier: Apache-2.0
 *
 * test_shim_route_e2e.cc - the drop-in library in route mode, end to end: 2 and 4 processes of
 * route_prog (a program written against nccl.h) run a random sequence of collectives, groups and
 * Send/Recv rings through libloom-nccl.so paired with the fake NCCL (libfake-nccl.so), under the
 * default rules (LOOM_NCCL_ECHO=0 and 1) and custom and random LOOM_NCCL_ROUTE lists. The program
 * checks each result (bitwise against its reference, or within Echo's bound where Echo may run)
 * and says whether the fake's counter of the function moved. Here the test holds, call by call,
 *   - every rank's decision trace (LOOM_DEBUG_SUBSYS=SHIM) against every other rank's,
 *   - the trace against what shim_route_decide says for the call's fields (so the library
 *     describes each call correctly to the rules),
 *   - the trace against the fake's counters (a call traced "-> nccl" reached the fake, and no
 *     other did), and calls in groups and Send/Recv against "always NCCL",
 *   - results that are not exact against "-> echo",
 * and that a malformed LOOM_NCCL_ROUTE fails with ncclInvalidArgument naming the rule.
 */
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nccl.h> /* outside extern "C": it includes CUDA's C++ headers */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "prog_util.h"

extern "C" { /* shim_route.h has no guards of its own */
#include "shim_route.h"
}

extern char **environ;

namespace {

std::string Env(const char *name)
{
    const char *v = getenv(name);
    return v ? v : "";
}

std::string ReadFile(const std::string &path)
{
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::vector<std::string> Lines(const std::string &text)
{
    std::vector<std::string> out;
    std::stringstream ss(text);
    std::string line;
    while (std::getline(ss, line))
        out.push_back(line);
    return out;
}

struct Scenario {
    int nranks;
    int seed;
    int calls;
    std::map<std::string, std::string> env; /* added to every rank's */
    std::string comm_name = "world";
};

struct RankRun {
    int status = -1;
    std::string out, log;
};

/* Runs route_prog on s.nranks processes and waits (60 s at most) for all of them. */
std::vector<RankRun> RunRanks(const Scenario &s, std::string *dir_out)
{
    char tmpl[] = "/tmp/loom-route-XXXXXX";
    const char *dir = mkdtemp(tmpl);
    EXPECT_NE(dir, nullptr);
    *dir_out = dir ? dir : "";
    std::vector<pid_t> pids;
    for (int r = 0; r < s.nranks; r++) {
        std::map<std::string, std::string> env;
        for (char **e = environ; *e; e++) {
            const char *eq = strchr(*e, '=');
            if (eq && strncmp(*e, "LOOM_", 5) != 0) /* the test sets every LOOM_ variable */
                env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
        }
        env["LOOM_NCCL_MODE"] = "route";
        env["LOOM_NCCL_LIBRARY"] = Env("LOOM_FAKE_NCCL");
        env["LOOM_DEBUG"] = "INFO";
        env["LOOM_DEBUG_SUBSYS"] = "SHIM";
        env["LOOM_DEBUG_FILE"] = std::string(dir) + "/log." + std::to_string(r);
        env["ROUTE_RANK"] = std::to_string(r);
        env["ROUTE_NRANKS"] = std::to_string(s.nranks);
        env["ROUTE_DIR"] = dir;
        env["ROUTE_SEED"] = std::to_string(s.seed);
        env["ROUTE_CALLS"] = std::to_string(s.calls);
        env["ROUTE_COMM_NAME"] = s.comm_name;
        if (!Env("LOOM_NCCL_SHIM_PRELOAD").empty())
            env["LD_PRELOAD"] = Env("LOOM_NCCL_SHIM_PRELOAD");
        for (const auto &kv : s.env)
            env[kv.first] = kv.second;
        std::vector<std::string> strings;
        for (const auto &kv : env)
            strings.push_back(kv.first + "=" + kv.second);
        std::vector<char *> envp;
        for (auto &str : strings)
            envp.push_back(str.data());
        envp.push_back(nullptr);

        const std::string out = std::string(dir) + "/out." + std::to_string(r);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
        const std::string prog = Env("LOOM_ROUTE_PROG");
        char *argv[] = {const_cast<char *>(prog.c_str()), nullptr};
        pid_t pid = -1;
        const int rc = posix_spawn(&pid, prog.c_str(), &fa, nullptr, argv, envp.data());
        posix_spawn_file_actions_destroy(&fa);
        EXPECT_EQ(rc, 0) << "cannot start " << prog << ": " << strerror(rc);
        pids.push_back(rc == 0 ? pid : -1);
    }

    std::vector<RankRun> runs(static_cast<size_t>(s.nranks));
    timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    size_t left = pids.size();
    for (pid_t p : pids)
        left -= p < 0;
    while (left > 0) {
        for (size_t r = 0; r < pids.size(); r++) {
            int status = 0;
            if (pids[r] > 0 && waitpid(pids[r], &status, WNOHANG) == pids[r]) {
                runs[r].status = status;
                pids[r] = -1;
                left--;
            }
        }
        timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 60) {
            for (size_t r = 0; r < pids.size(); r++)
                if (pids[r] > 0) {
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], &runs[r].status, 0);
                    ADD_FAILURE() << "rank " << r << " did not finish within 60 s";
                }
            break;
        }
        usleep(2000);
    }
    for (int r = 0; r < s.nranks; r++) {
        runs[static_cast<size_t>(r)].out = ReadFile(std::string(dir) + "/out." + std::to_string(r));
        runs[static_cast<size_t>(r)].log = ReadFile(std::string(dir) + "/log." + std::to_string(r));
    }
    return runs;
}

void RemoveDir(const std::string &dir)
{
    for (const char *pat : {"/out.", "/log."})
        for (int r = 0; r < 16; r++)
            unlink((dir + pat + std::to_string(r)).c_str());
    unlink((dir + "/nccl-id").c_str());
    rmdir(dir.c_str());
}

/* One line of route_prog. */
struct CallLine {
    int index;
    std::string fn;
    int dtype, op;
    size_t count;
    int group;
    std::string backend, result, hash;
};

/* Parsed by hand: std::regex does not build warning-free under the sanitizers with GCC 12. */
bool AllDigits(const std::string &v, bool sign = false)
{
    size_t i = sign && !v.empty() && v[0] == '-' ? 1 : 0;
    if (i == v.size())
        return false;
    for (; i < v.size(); i++)
        if (v[i] < '0' || v[i] > '9')
            return false;
    return true;
}

/* "key=value" with that key, or false. */
bool Field(const std::string &tok, const char *key, std::string *value)
{
    const std::string k = std::string(key) + "=";
    if (tok.compare(0, k.size(), k) != 0)
        return false;
    *value = tok.substr(k.size());
    return true;
}

/* CALL <index> <fn> dtype=<n> op=<n> count=<n> group=0|1 backend=nccl|shim
 * result=exact|approx [err=<x>] hash=<h> */
bool ParseCall(const std::string &line, CallLine *c)
{
    std::istringstream in(line);
    std::vector<std::string> t;
    for (std::string w; in >> w;)
        t.push_back(w);
    if (t.size() != 10 && t.size() != 11)
        return false;
    std::string dtype, op, count, group, backend, result, err, hash;
    const bool with_err = t.size() == 11;
    if (t[0] != "CALL" || !AllDigits(t[1]) || t[2].empty() || !Field(t[3], "dtype", &dtype) ||
        !Field(t[4], "op", &op) || !Field(t[5], "count", &count) || !Field(t[6], "group", &group) ||
        !Field(t[7], "backend", &backend) || !Field(t[8], "result", &result) ||
        (with_err && !Field(t[9], "err", &err)) || !Field(t[with_err ? 10 : 9], "hash", &hash))
        return false;
    if (!AllDigits(dtype) || !AllDigits(op, true) || !AllDigits(count) ||
        (group != "0" && group != "1") || (backend != "nccl" && backend != "shim") ||
        (result != "exact" && result != "approx") || hash.empty())
        return false;
    c->index = std::stoi(t[1]);
    c->fn = t[2];
    c->dtype = std::stoi(dtype);
    c->op = std::stoi(op);
    c->count = std::stoull(count);
    c->group = std::stoi(group);
    c->backend = backend;
    c->result = result;
    c->hash = hash;
    return true;
}

/* One decision line of the library's trace: the function, what it said of the call (without
 * the comm=rank/nranks field, which differs by rank), the target and the reason. */
struct Decision {
    std::string fn, call, target, why;
};

/* "... ncclX comm=R/N <call> -> <target> (<why>)": the call part never holds " -> ", so the
 * first one after comm= ends it (the reason may quote a rule, arrow included). */
std::vector<Decision> Decisions(const std::string &log)
{
    std::vector<Decision> out;
    for (const std::string &line : Lines(log)) {
        const size_t comm = line.find(" comm=");
        if (comm == std::string::npos)
            continue;
        const size_t fn_at = line.rfind(' ', comm - 1);
        const std::string fn = line.substr(fn_at == std::string::npos ? 0 : fn_at + 1,
                                           comm - (fn_at == std::string::npos ? 0 : fn_at + 1));
        if (fn.compare(0, 4, "nccl") != 0)
            continue;
        size_t p = comm + 6;
        const size_t slash = line.find('/', p);
        if (slash == std::string::npos || !AllDigits(line.substr(p, slash - p)))
            continue;
        p = line.find_first_not_of("0123456789", slash + 1);
        if (p == std::string::npos || p == slash + 1)
            continue;
        const size_t arrow = line.find(" -> ", p);
        if (arrow == std::string::npos)
            continue;
        std::string call = line.substr(p, arrow - p);
        if (!call.empty() && call[0] == ' ')
            call.erase(0, 1);
        const size_t open = line.find(" (", arrow + 4);
        size_t close = line.find_last_not_of(" \t\r\n");
        if (open == std::string::npos || close == std::string::npos || line[close] != ')')
            continue;
        const std::string target = line.substr(arrow + 4, open - (arrow + 4));
        if (target != "loom" && target != "echo" && target != "nccl")
            continue;
        out.push_back({fn, call, target, line.substr(open + 2, close - (open + 2))});
    }
    return out;
}

shim_coll_t CollOf(const std::string &fn)
{
    static const std::map<std::string, shim_coll_t> m = {{"AllReduce", SHIM_COLL_ALLREDUCE},
                                                         {"AllGather", SHIM_COLL_ALLGATHER},
                                                         {"ReduceScatter", SHIM_COLL_REDUCESCATTER},
                                                         {"Broadcast", SHIM_COLL_BROADCAST},
                                                         {"Bcast", SHIM_COLL_BROADCAST},
                                                         {"Reduce", SHIM_COLL_REDUCE},
                                                         {"AlltoAll", SHIM_COLL_ALLTOALL},
                                                         {"Gather", SHIM_COLL_GATHER},
                                                         {"Scatter", SHIM_COLL_SCATTER},
                                                         {"Send", SHIM_COLL_SEND},
                                                         {"Recv", SHIM_COLL_RECV}};
    return m.at(fn);
}

struct Tally {
    int to[3] = {0, 0, 0};
    int approx = 0;
};

/* Runs s and checks everything the header lists; rules are the ones the ranks should use. */
void RunAndCheck(const Scenario &s, const shim_rules_t *rules, Tally *tally)
{
    std::string dir;
    const std::vector<RankRun> runs = RunRanks(s, &dir);
    bool ok = true;
    std::vector<std::vector<CallLine>> calls(runs.size());
    std::vector<std::vector<Decision>> decisions(runs.size());
    for (size_t r = 0; r < runs.size(); r++) {
        const RankRun &run = runs[r];
        if (!WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0) {
            ADD_FAILURE() << "rank " << r << " ended with status " << run.status << "; output:\n"
                          << run.out << "\nlog:\n"
                          << run.log;
            ok = false;
            continue;
        }
        for (const std::string &line : Lines(run.out)) {
            CallLine c;
            if (ParseCall(line, &c))
                calls[r].push_back(c);
        }
        decisions[r] = Decisions(run.log);
        EXPECT_EQ(calls[r].size(), static_cast<size_t>(s.calls)) << "rank " << r << ":\n"
                                                                 << run.out;
    }
    if (!ok || ::testing::Test::HasFailure()) {
        RemoveDir(dir);
        return;
    }

    /* (b) every rank traced the same decisions for the same calls */
    for (size_t r = 1; r < runs.size(); r++) {
        ASSERT_EQ(decisions[r].size(), decisions[0].size()) << "rank " << r;
        for (size_t k = 0; k < decisions[0].size(); k++) {
            const Decision &a = decisions[0][k], &b = decisions[r][k];
            EXPECT_TRUE(a.fn == b.fn && a.call == b.call && a.target == b.target && a.why == b.why)
                << "decision " << k << ": rank 0 '" << a.fn << " " << a.call << " -> " << a.target
                << " (" << a.why << ")' vs rank " << r << " '" << b.fn << " " << b.call << " -> "
                << b.target << " (" << b.why << ")'";
        }
    }

    for (size_t r = 0; r < runs.size(); r++) {
        size_t d = 0;
        for (size_t k = 0; k < calls[r].size(); k++) {
            const CallLine &c = calls[r][k];
            const CallLine &c0 = calls[0][k];
            const std::string where =
                "rank " + std::to_string(r) + " call " + std::to_string(c.index) + " (" + c.fn +
                " dtype=" + std::to_string(c.dtype) + " op=" + std::to_string(c.op) +
                " count=" + std::to_string(c.count) + " group=" + std::to_string(c.group) + ")";
            /* the same call, the same backend, the same bytes where every rank ends alike */
            EXPECT_TRUE(c.fn == c0.fn && c.count == c0.count && c.backend == c0.backend &&
                        c.result == c0.result && c.hash == c0.hash)
                << where << " differs from rank 0's";

            /* what the rules say of this call */
            shim_call_t sc;
            memset(&sc, 0, sizeof(sc));
            sc.coll = CollOf(c.fn);
            sc.datatype = static_cast<ncclDataType_t>(c.dtype);
            sc.op = c.op;
            sc.bytes = c.count * prog_type_size(static_cast<ncclDataType_t>(c.dtype));
            sc.nranks = s.nranks;
            sc.hosts = 1;
            sc.name = s.comm_name.c_str();
            sc.in_group = c.group;
            char why[512];
            const shim_target_t want = shim_route_decide(rules, &sc, why, sizeof(why));

            /* the trace: one line per call, two for a Send/Recv pair */
            const int nlines = c.fn == "Send" ? 2 : 1;
            ASSERT_LE(d + static_cast<size_t>(nlines), decisions[r].size())
                << where << ": the trace has too few decision lines";
            for (int l = 0; l < nlines; l++) {
                const Decision &t = decisions[r][d + static_cast<size_t>(l)];
                const std::string fn = c.fn == "Send" && l == 1 ? "Recv" : c.fn;
                EXPECT_TRUE(t.fn == "nccl" + fn || (fn == "Bcast" && t.fn == "ncclBroadcast"))
                    << where << ": traced as " << t.fn;
                EXPECT_EQ(t.target, shim_target_name(want))
                    << where << ": traced (" << t.why << "), the rules say (" << why << ")";
                /* the library may cut a long reason short */
                EXPECT_TRUE(t.why == why || (t.why.size() >= 100 &&
                                             std::string(why).compare(0, t.why.size(), t.why) == 0))
                    << where << ": traced (" << t.why << "), the rules say (" << why << ")";
                /* (c) the fake ran exactly the calls traced to it */
                EXPECT_EQ(c.backend == "nccl", t.target == "nccl")
                    << where << ": traced -> " << t.target << ", the fake's counter says "
                    << c.backend;
            }
            d += static_cast<size_t>(nlines);
            /* (c) groups and point to point always on NCCL */
            if (c.group || c.fn == "Send") {
                EXPECT_EQ(c.backend, "nccl") << where;
            }
            /* (a) only Echo may be inexact (the program checked the bound) */
            if (c.result == "approx") {
                EXPECT_EQ(want, SHIM_TO_ECHO) << where;
            }
            if (r == 0) {
                tally->to[want]++;
                tally->approx += c.result == "approx";
            }
        }
        EXPECT_EQ(d, decisions[r].size()) << "rank " << r << ": decision lines left over";
    }
    printf("%d ranks, rules '%s': %d calls to nccl, %d to loom, %d to echo (%d inexact)\n",
           s.nranks, shim_rules_text(rules), tally->to[SHIM_TO_NCCL], tally->to[SHIM_TO_LOOM],
           tally->to[SHIM_TO_ECHO], tally->approx);
    if (!::testing::Test::HasFailure())
        RemoveDir(dir);
    else
        ADD_FAILURE() << "logs kept in " << dir;
}

struct RulesDeleter {
    void operator()(shim_rules_t *r) const
    {
        shim_rules_free(r);
    }
};
using Rules = std::unique_ptr<shim_rules_t, RulesDeleter>;

shim_rules_t *ParseRules(const std::string &text)
{
    shim_rules_t *r = nullptr;
    char err[512];
    EXPECT_EQ(shim_rules_parse(text.c_str(), &r, err, sizeof(err)), ncclSuccess) << err;
    return r;
}

class RouteE2E : public ::testing::TestWithParam<int> {
  protected:
    void SetUp() override
    {
        if (Env("LOOM_ROUTE_PROG").empty() || Env("LOOM_FAKE_NCCL").empty())
            GTEST_SKIP() << "LOOM_ROUTE_PROG and LOOM_FAKE_NCCL name the program and the fake";
    }
};

TEST_P(RouteE2E, DefaultRules)
{
    for (int echo = 0; echo <= 1; echo++) {
        Scenario s{GetParam(), 11 + echo, 48, {{"LOOM_NCCL_ECHO", std::to_string(echo)}}};
        Tally t;
        RunAndCheck(s, shim_rules_default(echo), &t);
        /* the sequence reaches the rules' target and NCCL both */
        EXPECT_GT(t.to[echo ? SHIM_TO_ECHO : SHIM_TO_LOOM], 0);
        EXPECT_GT(t.to[SHIM_TO_NCCL], 0);
        if (echo) {
            EXPECT_GT(t.approx, 0) << "no Echo call gave an inexact result";
        } else {
            EXPECT_EQ(t.approx, 0);
        }
    }
}

TEST_P(RouteE2E, CustomRules)
{
    const char *texts[] = {
        "coll=allreduce,reducescatter,allgather bytes<=64K -> loom; "
        "coll=allreduce dtype=f32,bf16 op=sum -> echo; coll=broadcast,reduce,gather,scatter -> "
        "loom; "
        "* -> nccl",
        /* echo for everything on a 4-rank comm named world*: what Echo cannot take goes to loom */
        "name=world* nranks=4 -> echo; coll=alltoall -> loom; dtype=int8,uint8 -> loom",
    };
    for (int i = 0; i < 2; i++) {
        Scenario s{GetParam(), 21 + i, 48, {{"LOOM_NCCL_ROUTE", texts[i]}}};
        Rules rules(ParseRules(texts[i]));
        Tally t;
        RunAndCheck(s, rules.get(), &t);
        EXPECT_GT(t.to[SHIM_TO_LOOM], 0);
        EXPECT_GT(t.to[SHIM_TO_NCCL], 0);
    }
}

/* A random rule list from the test's seed: collectives, datatypes, a size range, a target. */
std::string RandomRuleText(std::mt19937 &rng)
{
    static const char *colls[] = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce",
                                  "alltoall",  "gather",    "scatter",       "send"};
    const int ncolls = sizeof(colls) / sizeof(colls[0]);
    static const char *dtypes[] = {"int8",   "uint8", "int32", "uint32", "int64",
                                   "uint64", "fp16",  "fp32",  "fp64",   "bf16"};
    static const char *targets[] = {"loom", "loom", "echo", "nccl"}; /* mostly away from NCCL */
    static const char *sizes[] = {"bytes<=64K", "bytes>=1K", "bytes=1K-1M", "bytes>=1M", ""};
    std::string text;
    const int n = 2 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; i++) {
        std::string rule;
        if (rng() % 3) {
            rule += "coll=";
            for (int k = 0, first = 1; k < ncolls; k++)
                if (rng() % 3 == 0 || (k == ncolls - 1 && first)) {
                    rule += std::string(first ? "" : ",") + colls[k];
                    first = 0;
                }
        }
        if (rng() % 2) {
            rule += std::string(rule.empty() ? "" : " ") + "dtype=";
            for (int k = 0, first = 1; k < 10; k++)
                if (rng() % 3 == 0 || (k == 9 && first)) {
                    rule += std::string(first ? "" : ",") + dtypes[k];
                    first = 0;
                }
        }
        const std::string size = sizes[rng() % 5];
        if (!size.empty())
            rule += (rule.empty() ? "" : " ") + size;
        text += (i ? "; " : "") + (rule.empty() ? std::string("*") : rule) + " -> " +
                targets[rng() % 4];
    }
    return text;
}

TEST_P(RouteE2E, RandomRules)
{
    std::mt19937 rng(static_cast<unsigned>(1000 + GetParam()));
    for (int i = 0; i < 2; i++) {
        const std::string text = RandomRuleText(rng);
        SCOPED_TRACE("LOOM_NCCL_ROUTE=" + text);
        Scenario s{GetParam(), 31 + i, 40, {{"LOOM_NCCL_ROUTE", text}}};
        Rules rules(ParseRules(text));
        Tally t;
        RunAndCheck(s, rules.get(), &t);
    }
}

TEST_P(RouteE2E, MalformedRouteIsRefused)
{
    Scenario s{GetParam(),
               41,
               1,
               {{"LOOM_NCCL_ROUTE", "coll=allreduce -> loom; dtype=bf17 -> echo"},
                {"ROUTE_EXPECT_INVALID", "1"}}};
    std::string dir;
    const std::vector<RankRun> runs = RunRanks(s, &dir);
    for (size_t r = 0; r < runs.size(); r++) {
        const RankRun &run = runs[r];
        EXPECT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0)
            << "rank " << r << " status " << run.status << ":\n"
            << run.out << "\nlog:\n"
            << run.log;
        EXPECT_NE(run.out.find("INVALID "), std::string::npos) << run.out;
        EXPECT_NE(run.out.find("rule 2"), std::string::npos) << run.out;
        EXPECT_NE(run.out.find("bf17"), std::string::npos) << run.out;
    }
    RemoveDir(dir);
}

INSTANTIATE_TEST_SUITE_P(Ranks, RouteE2E, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int> &info) {
                             return std::to_string(info.param) + "ranks";
                         });

} // namespace
