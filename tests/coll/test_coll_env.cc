// SPDX-License-Identifier: Apache-2.0
//
// test_coll_env.cc - loomCommInitFromEnv under each launcher convention it documents (loom's
// own, torchrun, Slurm, Open MPI): 3 ranks get only environment variables, build the world
// communicator, check their rank and size and run an all-reduce. Also the failures: no
// variables, a rank not below the world size (the message names both variables), a malformed
// LOOM_SECRET. Every rank first unsets all launcher variables so the outer environment cannot
// leak in. The rendezvous port is picked free in the parent. Run by meson's 'coll' suite.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "loom.h"
#include "mp_fixture.h"

namespace {

const std::vector<std::string> kLauncherVars = {"LOOM_RANK",
                                                "LOOM_WORLD_SIZE",
                                                "LOOM_LOCAL_RANK",
                                                "LOOM_COMM_ID",
                                                "LOOM_SECRET",
                                                "RANK",
                                                "WORLD_SIZE",
                                                "LOCAL_RANK",
                                                "MASTER_ADDR",
                                                "MASTER_PORT",
                                                "SLURM_PROCID",
                                                "SLURM_NTASKS",
                                                "SLURM_LOCALID",
                                                "OMPI_COMM_WORLD_RANK",
                                                "OMPI_COMM_WORLD_SIZE",
                                                "OMPI_COMM_WORLD_LOCAL_RANK"};

// A TCP port on 127.0.0.1 that was free a moment ago (bind port 0, read it, close).
int FreePort()
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = -1;
    if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

// Init from the environment, then check identity and a sum all-reduce.
void InitAndReduce(int rank, int nranks, loomComm_t)
{
    loomComm_t comm = nullptr;
    XT_CHECK_LOOM(loomCommInitFromEnv(&comm));
    int count = -1, me = -1;
    XT_CHECK_LOOM(loomCommCount(comm, &count));
    XT_CHECK_LOOM(loomCommUserRank(comm, &me));
    XT_CHECK_EQ(count, nranks);
    XT_CHECK_EQ(me, rank);
    int64_t v = 10 + rank, sum = 0;
    XT_CHECK_LOOM(loomAllReduce(&v, &sum, 1, loomInt64, loomSum, comm, nullptr));
    XT_CHECK_EQ(sum, 10 * nranks + nranks * (nranks - 1) / 2);
    XT_CHECK_LOOM(loomCommDestroy(comm));
}

// Runs 3 ranks without a harness communicator; vars(rank, port) gives each rank's variables.
::testing::AssertionResult RunEnv(const std::function<loomtest::EnvList(int, int)> &vars,
                                  const loomtest::RankBody &body = InitAndReduce, int nranks = 3)
{
    const int port = FreePort();
    if (port <= 0)
        return ::testing::AssertionFailure() << "no free port on 127.0.0.1";
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.unset_env = kLauncherVars;
    opts.rank_env = [vars, port](int rank) { return vars(rank, port); };
    return loomtest::RunRanks(nranks, body, opts);
}

std::string Addr(int port)
{
    return "127.0.0.1:" + std::to_string(port);
}

TEST(EnvInit, LoomVariables)
{
    XT_ASSERT_RUN(RunEnv([](int rank, int port) {
        return loomtest::EnvList{{"LOOM_RANK", std::to_string(rank)},
                                 {"LOOM_WORLD_SIZE", "3"},
                                 {"LOOM_LOCAL_RANK", std::to_string(rank)},
                                 {"LOOM_COMM_ID", Addr(port)},
                                 {"LOOM_SECRET", "00112233445566778899aabbccddeeff"}};
    }));
}

TEST(EnvInit, TorchrunVariables)
{
    XT_ASSERT_RUN(RunEnv([](int rank, int port) {
        return loomtest::EnvList{{"RANK", std::to_string(rank)},
                                 {"WORLD_SIZE", "3"},
                                 {"LOCAL_RANK", std::to_string(rank)},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", std::to_string(port)}};
    }));
}

TEST(EnvInit, SlurmVariables)
{
    XT_ASSERT_RUN(RunEnv([](int rank, int port) {
        return loomtest::EnvList{{"SLURM_PROCID", std::to_string(rank)},
                                 {"SLURM_NTASKS", "3"},
                                 {"SLURM_LOCALID", std::to_string(rank)},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", std::to_string(port)}};
    }));
}

TEST(EnvInit, OpenMpiVariables)
{
    XT_ASSERT_RUN(RunEnv([](int rank, int port) {
        return loomtest::EnvList{{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
                                 {"OMPI_COMM_WORLD_SIZE", "3"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank)},
                                 {"LOOM_COMM_ID", Addr(port)}};
    }));
}

// Expects loomCommInitFromEnv to fail with InvalidArgument and a message containing `words`.
loomtest::RankBody ExpectInvalid(std::vector<std::string> words)
{
    return [words](int, int, loomComm_t) {
        loomComm_t comm = nullptr;
        XT_CHECK_LOOM_RES(loomCommInitFromEnv(&comm), loomInvalidArgument);
        XT_CHECK(comm == nullptr);
        const std::string msg = loomGetLastError(nullptr);
        fprintf(stderr, "last error: %s\n", msg.c_str());
        XT_CHECK(!msg.empty());
        for (const std::string &w : words)
            XT_CHECK_MSG(msg.find(w) != std::string::npos, "'" + w + "' not in '" + msg + "'");
    };
}

TEST(EnvInit, NoVariablesIsInvalidArgument)
{
    XT_ASSERT_RUN(RunEnv([](int, int) { return loomtest::EnvList{}; }, ExpectInvalid({}), 1));
}

TEST(EnvInit, RankNotBelowWorldSizeNamesBothVariables)
{
    XT_ASSERT_RUN(RunEnv(
        [](int rank, int port) {
            if (rank == 0)
                return loomtest::EnvList{{"RANK", "3"},
                                         {"WORLD_SIZE", "3"},
                                         {"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", std::to_string(port)}};
            return loomtest::EnvList{
                {"LOOM_RANK", "5"}, {"LOOM_WORLD_SIZE", "2"}, {"LOOM_COMM_ID", Addr(port)}};
        },
        [](int rank, int n, loomComm_t c) {
            if (rank == 0)
                ExpectInvalid({"RANK", "WORLD_SIZE"})(rank, n, c);
            else
                ExpectInvalid({"LOOM_RANK", "LOOM_WORLD_SIZE"})(rank, n, c);
        },
        2));
}

TEST(EnvInit, MalformedSecretIsInvalidArgument)
{
    // Parameters are read once per process, so each malformed secret gets a rank of its own
    // (each a world of one).
    XT_ASSERT_RUN(RunEnv(
        [](int rank, int port) {
            static const char *const kBad[] = {"xyz", "0123456789abcdef0123456789abcdeg",
                                               "0123456789abcdef0123456789abcde"};
            return loomtest::EnvList{{"LOOM_RANK", "0"},
                                     {"LOOM_WORLD_SIZE", "1"},
                                     {"LOOM_COMM_ID", Addr(port + rank)},
                                     {"LOOM_SECRET", kBad[rank]}};
        },
        ExpectInvalid({"LOOM_SECRET"}), 3));
}

} // namespace
