// SPDX-License-Identifier: Apache-2.0
//
// test_security_secret.cc - where loomCommInitFromEnv takes the job secret from. Part 1 is the
// rules of LOOM_SECRET_FILE on loom_secret_read_file itself, in the gtest process (it logs
// nothing): the accepted content, and every file it must refuse (another user's, readable by
// group or others, a symbolic link, not a regular file, wrong content) with a reason that names
// the cause but never the content. Part 2 runs ranks: a file secret joins ranks that hold the
// same secret as LOOM_SECRET, LOOM_SECRET wins over the file, an unsafe file fails init with
// InvalidArgument naming path and mode, and a secret derived from the address is WARNed once,
// by rank 0 alone.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "mp_fixture.h"
#include "security_util.h"

extern "C" {
#include "secret.h"
#include "socket.h"
}

using loomtest::RunOptions;
using loomtest::RunRanks;
using namespace sectest;

namespace {

constexpr char kHex[] = "00112233445566778899aabbccddeeff";
constexpr char kOtherHex[] = "ffeeddccbbaa99887766554433221100";

struct Read {
    loomResult_t res;
    std::string why;
    uint8_t secret[LOOM_SECRET_BYTES];
};

Read ReadSecretFile(const std::string &path)
{
    Read r;
    char why[160] = "";
    memset(r.secret, 0x5a, sizeof(r.secret));
    r.res = loom_secret_read_file(path.c_str(), r.secret, why, sizeof(why));
    r.why = why;
    return r;
}

// ---- part 1: the rules of the file ---------------------------------------------------------

TEST(SecretFile, AcceptsThirtyTwoHexDigitsAndOneNewline)
{
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    for (const std::string &text : {std::string(kHex), std::string(kHex) + "\n",
                                    std::string("00112233445566778899AABBCCDDEEFF")})
        for (mode_t mode : {0600, 0400}) {
            Read r = ReadSecretFile(dir.Write("s", text, mode));
            ASSERT_EQ(r.res, loomSuccess) << r.why;
            EXPECT_EQ(r.secret[0], 0x00);
            EXPECT_EQ(r.secret[9], 0x99);
            EXPECT_EQ(r.secret[15], 0xff);
        }
}

// Content other than the 32 digits and one newline; the reason never echoes the content.
TEST(SecretFile, RefusesOtherContent)
{
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    const std::string hex(kHex);
    for (const std::string &text :
         {std::string(""), hex.substr(0, 31), hex.substr(0, 31) + "\n", hex + "0", hex + "\n\n",
          hex + "\r\n", hex + " ", " " + hex, hex.substr(0, 30) + "gg", hex.substr(0, 30) + "g\n",
          hex.substr(0, 16) + std::string(1, '\0') + hex.substr(17), hex + hex}) {
        Read r = ReadSecretFile(dir.Write("s", text, 0600));
        EXPECT_EQ(r.res, loomInvalidArgument) << "content '" << text << "'";
        EXPECT_EQ(r.secret[0], 0x5a) << "output written on failure";
        EXPECT_FALSE(r.why.empty());
        EXPECT_EQ(r.why.find("0011223344"), std::string::npos) << r.why;
        EXPECT_EQ(r.why.find("gg"), std::string::npos) << r.why;
    }
    Read r = ReadSecretFile(dir.Write("s", hex.substr(0, 31), 0600));
    EXPECT_NE(r.why.find("31 bytes"), std::string::npos) << r.why;
}

// Any permission bit for group or others: the mode is named, with the fix.
TEST(SecretFile, RefusesGroupOrOtherPermissions)
{
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    for (mode_t mode : {0644, 0640, 0604, 0660, 0601, 0610, 0620, 0602, 0666}) {
        Read r = ReadSecretFile(dir.Write("s", kHex, mode));
        EXPECT_EQ(r.res, loomInvalidArgument) << std::oct << mode;
        char want[16];
        snprintf(want, sizeof(want), "mode %04o", static_cast<unsigned>(mode));
        EXPECT_NE(r.why.find(want), std::string::npos) << r.why;
        EXPECT_NE(r.why.find("chmod 600"), std::string::npos) << r.why;
        EXPECT_EQ(r.secret[0], 0x5a);
    }
}

// A symbolic link is not followed, even to a good file of this user.
TEST(SecretFile, RefusesSymbolicLink)
{
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    const std::string good = dir.Write("good", kHex, 0600), link = dir.path() + "/link";
    ASSERT_EQ(symlink(good.c_str(), link.c_str()), 0);
    Read r = ReadSecretFile(link);
    EXPECT_EQ(r.res, loomInvalidArgument);
    EXPECT_NE(r.why.find("symbolic link"), std::string::npos) << r.why;
    EXPECT_EQ(r.secret[0], 0x5a);
}

// A directory and a FIFO (which must not hold the open until a writer comes), a missing file.
TEST(SecretFile, RefusesWhatIsNotARegularFile)
{
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    const std::string sub = dir.path() + "/dir", fifo = dir.path() + "/fifo";
    ASSERT_EQ(mkdir(sub.c_str(), 0700), 0);
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    for (const std::string &p : {sub, fifo}) {
        Read r = ReadSecretFile(p);
        EXPECT_EQ(r.res, loomInvalidArgument) << p;
        EXPECT_NE(r.why.find("not a regular file"), std::string::npos) << r.why;
    }
    Read r = ReadSecretFile(dir.path() + "/missing");
    EXPECT_EQ(r.res, loomInvalidArgument);
    EXPECT_NE(r.why.find(strerror(ENOENT)), std::string::npos) << r.why;
}

// Another user's file, private or not, holds no secret of this user.
TEST(SecretFile, RefusesAnotherUsersFile)
{
    if (geteuid() != 0)
        GTEST_SKIP() << "needs root to give a file to another uid";
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    const std::string p = dir.Write("s", kHex, 0600);
    ASSERT_EQ(chown(p.c_str(), 65534, 65534), 0) << strerror(errno);
    Read r = ReadSecretFile(p);
    EXPECT_EQ(r.res, loomInvalidArgument);
    EXPECT_NE(r.why.find("owned by uid 65534"), std::string::npos) << r.why;
    EXPECT_EQ(r.secret[0], 0x5a);
}

// ---- part 2: loomCommInitFromEnv -----------------------------------------------------------

const std::vector<std::string> kLauncherVars = {
    "LOOM_RANK",    "LOOM_WORLD_SIZE",      "LOOM_LOCAL_RANK",
    "LOOM_COMM_ID", "LOOM_SECRET",          "LOOM_SECRET_FILE",
    "RANK",         "WORLD_SIZE",           "LOCAL_RANK",
    "MASTER_ADDR",  "MASTER_PORT",          "SLURM_PROCID",
    "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "LOOM_DEBUG",   "LOOM_DEBUG_FILE"};

RunOptions EnvRunOptions()
{
    RunOptions opts;
    opts.create_comm = false;
    opts.unset_env = kLauncherVars;
    opts.env = {{"LOOM_TIMEOUT_MS", "10000"}};
    return opts;
}

// A port on 127.0.0.1 that rank 0 found free, known to every rank (collective).
int SharedFreePort()
{
    int port = 0;
    if (loomtest::CurrentRank() == 0) {
        loom_sockaddr_t a;
        int fd = -1;
        XT_CHECK_LOOM(loom_sockaddr_parse("127.0.0.1:0", &a));
        XT_CHECK_LOOM(loom_socket_listen(&a, &fd));
        port = PortOf(a);
        close(fd);
    }
    loomtest::ShareFromRank0(&port, sizeof(port));
    return port;
}

void SetEnv(const char *name, const std::string &value)
{
    XT_CHECK(setenv(name, value.c_str(), 1) == 0);
}

// Creates the world communicator of this rank's launcher variables and checks a sum over it.
void InitAndSum(int rank, int nranks)
{
    loomComm_t comm = nullptr;
    XT_CHECK_LOOM(loomCommInitFromEnv(&comm));
    int64_t v = rank + 1, sum = 0;
    XT_CHECK_LOOM(loomAllReduce(&v, &sum, 1, loomInt64, loomSum, comm, nullptr));
    XT_CHECK_EQ(sum, nranks * (nranks + 1) / 2);
    XT_CHECK_LOOM(loomCommDestroy(comm));
}

// Rank 0 has LOOM_SECRET and a file of another secret (LOOM_SECRET wins); ranks 1 and 2 have
// only files of LOOM_SECRET's digits (one with a newline). All must hold one secret.
TEST(SecretFileInit, FileSecretJoinsLoomSecretAndLoomSecretWins)
{
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    const std::string other = dir.Write("other", kOtherHex, 0600);
    const std::string same = dir.Write("same", kHex, 0600);
    const std::string same_nl = dir.Write("same_nl", std::string(kHex) + "\n", 0400);
    XT_ASSERT_RUN(RunRanks(
        3,
        [&](int rank, int nranks, loomComm_t) {
            const int port = SharedFreePort();
            SetEnv("LOOM_RANK", std::to_string(rank));
            SetEnv("LOOM_WORLD_SIZE", std::to_string(nranks));
            SetEnv("LOOM_COMM_ID", "127.0.0.1:" + std::to_string(port));
            if (rank == 0)
                SetEnv("LOOM_SECRET", kHex);
            SetEnv("LOOM_SECRET_FILE", rank == 0 ? other : rank == 1 ? same : same_nl);
            InitAndSum(rank, nranks);
        },
        EnvRunOptions()));
}

// A file group and others can read fails init at once, naming the path and the mode.
TEST(SecretFileInit, UnsafeFileFailsInitNamingPathAndMode)
{
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    const std::string open_file = dir.Write("open", kHex, 0644);
    XT_ASSERT_RUN(RunRanks(
        1,
        [&](int, int, loomComm_t) {
            const int port = SharedFreePort();
            SetEnv("RANK", "0");
            SetEnv("WORLD_SIZE", "1");
            SetEnv("MASTER_ADDR", "127.0.0.1");
            SetEnv("MASTER_PORT", std::to_string(port));
            SetEnv("LOOM_SECRET_FILE", open_file);
            loomComm_t comm = nullptr;
            XT_CHECK_LOOM_RES(loomCommInitFromEnv(&comm), loomInvalidArgument);
            XT_CHECK(comm == nullptr);
            const std::string msg = loomGetLastError(nullptr);
            for (const std::string &w :
                 {std::string("LOOM_SECRET_FILE"), open_file, std::string("mode 0644")})
                XT_CHECK_MSG(msg.find(w) != std::string::npos, "'" + w + "' not in '" + msg + "'");
        },
        EnvRunOptions()));
}

// Without LOOM_SECRET and LOOM_SECRET_FILE (torchrun's variables only) the derived secret is
// WARNed by rank 0, once however many communicators the process creates; other ranks say
// nothing at WARN.
TEST(SecretFileInit, DerivedSecretIsWarnedOnceByRankZero)
{
    XT_ASSERT_RUN(RunRanks(
        2,
        [&](int rank, int nranks, loomComm_t) {
            const int port = SharedFreePort();
            SetEnv("RANK", std::to_string(rank));
            SetEnv("WORLD_SIZE", std::to_string(nranks));
            SetEnv("MASTER_ADDR", "127.0.0.1");
            SetEnv("MASTER_PORT", std::to_string(port));
            InitAndSum(rank, nranks);
            InitAndSum(rank, nranks);
            fflush(stderr);
            const std::string log = ReadFile(RankLog(rank));
            const std::string what = "LOOM_SECRET and LOOM_SECRET_FILE are unset";
            if (rank == 0) {
                XT_CHECK_MSG(CountLines(RankLog(0), what) == 1, log);
                XT_CHECK_MSG(CountWarnLines(RankLog(0)) == 1, log);
                XT_CHECK_MSG(log.find("127.0.0.1:" + std::to_string(port)) != std::string::npos,
                             log);
            } else {
                XT_CHECK_MSG(CountWarnLines(RankLog(rank)) == 0, log);
            }
        },
        EnvRunOptions()));
}

} // namespace
