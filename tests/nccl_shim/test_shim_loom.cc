// SPDX-License-Identifier: Apache-2.0
//
// test_shim_loom.cc - the drop-in NCCL library in loom mode against loom itself: loom_mode_prog
// (a C program that sees only nccl.h, linked to the library as to libnccl.so.2) runs every case
// of loom_mode_cases.h on 2, 3 and 4 processes; then the same cases run here on loom's own API,
// on forked ranks with the same inputs, and every rank's outputs must be equal bit for bit.
// The reference calls loom directly for what loom has (every reduction, AllGather, Broadcast,
// AlltoAll, Send/Recv) and restates the rest from its definition: a PreMulSum input is scaled
// here with rounding code of this file's own (float32 multiply, one round to nearest even),
// then summed by loom; Gather is loom's AllGather at the root; Scatter is the root's block,
// which every rank can fill itself since inputs depend only on the case and the rank. The
// program's other checks (split with NCCL_SPLIT_NOCOLOR, a polled non-blocking init, two
// communicators initialised in one group from one thread, error texts) have exact expected
// values and fail the program themselves. Run by meson's 'nccl_shim' suite.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "loom.h"
#include "loom_mode_cases.h"
#include "mp_fixture.h"

namespace {

using Bytes = std::vector<unsigned char>;

// ---- the reference's own scaling -----------------------------------------------------------

float Decode(const unsigned char *p, int dtype)
{
    uint32_t x = 0;
    switch (dtype) {
    case LM_BF16: {
        uint16_t b;
        std::memcpy(&b, p, 2);
        x = static_cast<uint32_t>(b) << 16;
        break;
    }
    case LM_HALF:
    case LM_E4M3:
    case LM_E5M2: {
        // Normal numbers and zero only (the inputs and scalars of the cases).
        uint32_t v = 0, mbits = 0, bias = 0, sbit = 0;
        if (dtype == LM_HALF) {
            uint16_t h;
            std::memcpy(&h, p, 2);
            v = h, mbits = 10, bias = 15, sbit = 15;
        } else {
            v = *p, mbits = dtype == LM_E4M3 ? 3 : 2, bias = dtype == LM_E4M3 ? 7 : 15, sbit = 7;
        }
        const uint32_t sign = (v >> sbit) << 31, em = v & ((1u << sbit) - 1);
        x = em == 0 ? sign
                    : sign | (((em >> mbits) + 127 - bias) << 23) |
                          ((em & ((1u << mbits) - 1)) << (23 - mbits));
        break;
    }
    default:
        break;
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

// Round to nearest even into a format with mbits mantissa bits and exponent bias `bias`, for
// values in its normal range (every product of the cases is).
uint32_t RoundNormal(float f, uint32_t mbits, uint32_t bias, uint32_t sbit)
{
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 31) << sbit, ax = x & 0x7fffffffu;
    if (ax == 0)
        return sign;
    const uint32_t drop = 23 - mbits;
    uint32_t r =
        (ax + (1u << (drop - 1)) - 1 + ((ax >> drop) & 1)) >> drop; // exponent and mantissa
    r -= (127 - bias) << mbits;
    return sign | r;
}

void Encode(float f, int dtype, unsigned char *p)
{
    switch (dtype) {
    case LM_BF16: {
        const uint16_t b = static_cast<uint16_t>(RoundNormal(f, 7, 127, 15));
        std::memcpy(p, &b, 2);
        break;
    }
    case LM_HALF: {
        const uint16_t h = static_cast<uint16_t>(RoundNormal(f, 10, 15, 15));
        std::memcpy(p, &h, 2);
        break;
    }
    case LM_E4M3:
        *p = static_cast<unsigned char>(RoundNormal(f, 3, 7, 7));
        break;
    case LM_E5M2:
        *p = static_cast<unsigned char>(RoundNormal(f, 2, 15, 7));
        break;
    default:
        break;
    }
}

void Scale(Bytes &buf, int dtype, const unsigned char *scalar)
{
    const size_t es = lm_dtype_size(dtype), n = buf.size() / es;
    for (size_t i = 0; i < n; i++) {
        unsigned char *p = buf.data() + i * es;
        switch (dtype) {
        case LM_FLOAT: {
            float x, s;
            std::memcpy(&x, p, 4);
            std::memcpy(&s, scalar, 4);
            x *= s;
            std::memcpy(p, &x, 4);
            break;
        }
        case LM_DOUBLE: {
            double x, s;
            std::memcpy(&x, p, 8);
            std::memcpy(&s, scalar, 8);
            x *= s;
            std::memcpy(p, &x, 8);
            break;
        }
        case LM_INT32: {
            uint32_t x, s;
            std::memcpy(&x, p, 4);
            std::memcpy(&s, scalar, 4);
            x *= s;
            std::memcpy(p, &x, 4);
            break;
        }
        default:
            Encode(Decode(p, dtype) * Decode(scalar, dtype), dtype, p);
            break;
        }
    }
}

// ---- one case on loom ----------------------------------------------------------------------

Bytes Fill(const lm_case_t &c, size_t elems, int idx, int rank)
{
    Bytes b(elems * lm_dtype_size(c.dtype));
    lm_fill(b.data(), c.dtype, elems, idx, rank);
    return b;
}

Bytes RunLoom(const lm_case_t &c, int idx, int rank, int n, loomComm_t comm)
{
    const size_t es = lm_dtype_size(c.dtype);
    const size_t rn = lm_recv_elems(&c, n);
    const auto dt = static_cast<loomDataType_t>(c.dtype);
    Bytes send = Fill(c, lm_send_elems(&c, n), idx, rank);
    Bytes recv(rn * es, 0xa5);
    loomRedOp_t op = static_cast<loomRedOp_t>(c.op);
    if (c.op == LM_PREMUL_HOST || c.op == LM_PREMUL_DEV) {
        unsigned char s[8] = {0};
        lm_scalar(c.dtype, c.op == LM_PREMUL_HOST ? 0 : 1, s);
        Scale(send, c.dtype, s);
        op = loomSum;
    }
    unsigned char *sb = send.data(), *rb = recv.data();
    const size_t block = c.count * es;
    switch (c.kind) {
    case LM_ALLREDUCE:
        if (c.inplace)
            rb = sb;
        XT_CHECK_LOOM(loomAllReduce(sb, rb, c.count, dt, op, comm, nullptr));
        break;
    case LM_REDUCESCATTER:
        if (c.inplace)
            rb = sb + rank * block;
        XT_CHECK_LOOM(loomReduceScatter(sb, rb, c.count, dt, op, comm, nullptr));
        break;
    case LM_REDUCE:
        if (c.inplace)
            rb = sb;
        XT_CHECK_LOOM(loomReduce(sb, rb, c.count, dt, op, c.root, comm, nullptr));
        break;
    case LM_ALLGATHER:
    case LM_GATHER:
        XT_CHECK_LOOM(loomAllGather(sb, rb, c.count, dt, comm, nullptr));
        break;
    case LM_BROADCAST:
    case LM_BCAST:
        rb = sb;
        XT_CHECK_LOOM(loomBroadcast(sb, rb, c.count, dt, c.root, comm, nullptr));
        break;
    case LM_ALLTOALL:
        XT_CHECK_LOOM(loomAllToAll(sb, rb, c.count, dt, comm, nullptr));
        break;
    case LM_SCATTER: {
        const Bytes root = Fill(c, lm_send_elems(&c, n), idx, c.root);
        std::memcpy(rb, root.data() + rank * block, block);
        break;
    }
    case LM_SENDRECV:
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_LOOM(loomSend(sb, c.count, dt, (rank + 1) % n, comm, nullptr));
        XT_CHECK_LOOM(loomRecv(rb, c.count, dt, (rank + n - 1) % n, comm, nullptr));
        XT_CHECK_LOOM(loomGroupEnd());
        break;
    }
    size_t out = rn;
    if ((c.kind == LM_REDUCE || c.kind == LM_GATHER) && rank != c.root)
        out = 0;
    return Bytes(rb, rb + out * es);
}

std::string Describe(const lm_case_t &c)
{
    std::ostringstream os;
    os << lm_kind_name(c.kind) << " dtype " << c.dtype << " op " << c.op << " count " << c.count
       << (c.inplace ? " in place" : "") << " root " << c.root;
    return os.str();
}

Bytes ReadFile(const std::string &path)
{
    std::ifstream f(path, std::ios::binary);
    return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Compares two record files; "" when equal, else the first difference.
std::string Compare(const Bytes &got, const Bytes &want, int n)
{
    std::vector<lm_case_t> cases(512);
    cases.resize(static_cast<size_t>(lm_cases(n, cases.data(), static_cast<int>(cases.size()))));
    size_t at = 0;
    while (at < want.size()) {
        uint32_t head[2];
        if (at + 8 > got.size())
            return "the program's records end early";
        std::memcpy(head, want.data() + at, 8);
        const std::string what = Describe(cases.at(head[0]));
        if (std::memcmp(got.data() + at, want.data() + at, 8) != 0)
            return "record header differs at case " + std::to_string(head[0]) + " (" + what + ")";
        if (at + 8 + head[1] > got.size())
            return "the program's record of case " + std::to_string(head[0]) + " is cut short";
        for (uint32_t i = 0; i < head[1]; i++)
            if (got[at + 8 + i] != want[at + 8 + i])
                return "case " + std::to_string(head[0]) + " (" + what + "): byte " +
                       std::to_string(i) + " is " + std::to_string(got[at + 8 + i]) +
                       ", loom gives " + std::to_string(want[at + 8 + i]);
        at += 8 + head[1];
    }
    return got.size() == want.size() ? "" : "the program wrote more records than loom";
}

// Runs the program to its end (its process group is killed past the deadline).
int RunProgram(int n, const std::string &dir, std::string *log)
{
    const char *prog = std::getenv("LOOM_MODE_PROG");
    if (prog == nullptr)
        return -1;
    const std::string log_path = dir + "/prog.log";
    const pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        setenv("LOOM_NCCL_MODE", "loom", 1);
        FILE *l = std::freopen(log_path.c_str(), "w", stderr);
        (void)l;
        const std::string nranks = std::to_string(n);
        execl(prog, prog, nranks.c_str(), dir.c_str(), static_cast<char *>(nullptr));
        _exit(127);
    }
    setpgid(pid, pid);
    int status = 0;
    for (int ms = 0; ms < 60000; ms += 10) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            std::ifstream f(log_path);
            *log = std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        usleep(10000);
    }
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
    *log = "timed out";
    return -2;
}

class LoomModeProgram : public ::testing::TestWithParam<int> {};

TEST_P(LoomModeProgram, EqualsLoomBitForBit)
{
    const int n = GetParam();
    char tmpl[] = "/tmp/loom-shim-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    std::string log;
    const int rc = RunProgram(n, dir, &log);
    ASSERT_EQ(rc, 0) << "loom_mode_prog " << n << " failed:\n" << log;

    XT_ASSERT_RUN(loomtest::RunRanks(n, [&](int rank, int nranks, loomComm_t comm) {
        std::vector<lm_case_t> cases(512);
        cases.resize(static_cast<size_t>(lm_cases(nranks, cases.data(), 512)));
        std::ofstream out(dir + "/loom." + std::to_string(rank), std::ios::binary);
        for (size_t i = 0; i < cases.size(); i++) {
            loomtest::SetContext(Describe(cases[i]));
            const Bytes b = RunLoom(cases[i], static_cast<int>(i), rank, nranks, comm);
            const uint32_t head[2] = {static_cast<uint32_t>(i), static_cast<uint32_t>(b.size())};
            out.write(reinterpret_cast<const char *>(head), sizeof(head));
            out.write(reinterpret_cast<const char *>(b.data()),
                      static_cast<std::streamsize>(b.size()));
        }
        XT_CHECK(out.good());
    }));
    for (int r = 0; r < n; r++) {
        const Bytes got = ReadFile(dir + "/nccl." + std::to_string(r));
        const Bytes want = ReadFile(dir + "/loom." + std::to_string(r));
        ASSERT_FALSE(want.empty());
        EXPECT_EQ(Compare(got, want, n), "") << "rank " << r;
    }
    std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Ranks, LoomModeProgram, ::testing::Values(2, 3, 4));

} // namespace
