/* SPDX-License-Identifier: Apache-2.0
 *
 * test_shim_route.cc - the routing rules of the drop-in NCCL library (shim_route.c): the grammar
 * of LOOM_NCCL_ROUTE key by key, its error messages, the canonical text, the default rules, the
 * fixed constraints that win over every rule (device buffers and stream capture among them).
 * test_shim_route_model.cc checks the rules against a model of the test's own.
 */
#include <gtest/gtest.h>
#include <nccl.h> /* outside extern "C": it includes CUDA's C++ headers */

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shim_route_test.h"

namespace {

using namespace routetest;

TEST(ShimRoute, CollNamesAndAliases)
{
    const struct {
        const char *name;
        shim_coll_t coll;
    } cases[] = {{"allreduce", SHIM_COLL_ALLREDUCE},
                 {"allgather", SHIM_COLL_ALLGATHER},
                 {"reducescatter", SHIM_COLL_REDUCESCATTER},
                 {"broadcast", SHIM_COLL_BROADCAST},
                 {"bcast", SHIM_COLL_BROADCAST},
                 {"reduce", SHIM_COLL_REDUCE},
                 {"alltoall", SHIM_COLL_ALLTOALL},
                 {"gather", SHIM_COLL_GATHER},
                 {"scatter", SHIM_COLL_SCATTER},
                 {"AllReduce", SHIM_COLL_ALLREDUCE}};
    for (const auto &tc : cases) {
        const std::string text = std::string("coll=") + tc.name + " -> loom";
        for (int c = 0; c < SHIM_NUM_COLLS; c++) {
            if (c == SHIM_COLL_SEND || c == SHIM_COLL_RECV)
                continue; /* fixed to NCCL, tested below */
            const int op =
                c == SHIM_COLL_ALLREDUCE || c == SHIM_COLL_REDUCESCATTER || c == SHIM_COLL_REDUCE
                    ? ncclSum
                    : -1;
            EXPECT_EQ(Decide(text, Call((shim_coll_t)c, ncclFloat32, op)),
                      c == tc.coll ? SHIM_TO_LOOM : SHIM_TO_NCCL)
                << text << " on " << shim_coll_name((shim_coll_t)c);
        }
    }
    Rules list = Parse("coll=allgather,reducescatter,bcast -> loom");
    EXPECT_EQ(Decide(list.get(), Call(SHIM_COLL_ALLGATHER, ncclFloat32, -1)), SHIM_TO_LOOM);
    EXPECT_EQ(Decide(list.get(), Call(SHIM_COLL_BROADCAST, ncclFloat32, -1)), SHIM_TO_LOOM);
    EXPECT_EQ(Decide(list.get(), Call(SHIM_COLL_ALLREDUCE)), SHIM_TO_NCCL);
    EXPECT_EQ(Decide("coll=* -> loom", Call(SHIM_COLL_ALLTOALL, ncclInt8, -1)), SHIM_TO_LOOM);
    EXPECT_STREQ(shim_coll_name(SHIM_COLL_REDUCESCATTER), "reducescatter");
    EXPECT_STREQ(shim_coll_name(SHIM_COLL_BROADCAST), "broadcast");
    EXPECT_STREQ(shim_coll_name(SHIM_COLL_RECV), "recv");
}

TEST(ShimRoute, DtypeNamesAndAliases)
{
    const struct {
        const char *name;
        ncclDataType_t dt;
    } cases[] = {
        {"int8", ncclInt8},
        {"char", ncclInt8},
        {"uint8", ncclUint8},
        {"int32", ncclInt32},
        {"int", ncclInt32},
        {"uint32", ncclUint32},
        {"int64", ncclInt64},
        {"uint64", ncclUint64},
        {"fp16", ncclFloat16},
        {"f16", ncclFloat16},
        {"half", ncclFloat16},
        {"float16", ncclFloat16},
        {"fp32", ncclFloat32},
        {"f32", ncclFloat32},
        {"float", ncclFloat32},
        {"float32", ncclFloat32},
        {"fp64", ncclFloat64},
        {"f64", ncclFloat64},
        {"double", ncclFloat64},
        {"float64", ncclFloat64},
        {"bf16", ncclBfloat16},
        {"bfloat16", ncclBfloat16},
        {"BF16", ncclBfloat16},
        {"fp8e4m3", ncclFloat8e4m3},
        {"e4m3", ncclFloat8e4m3},
        {"float8e4m3", ncclFloat8e4m3},
        {"fp8e5m2", ncclFloat8e5m2},
        {"e5m2", ncclFloat8e5m2},
        {"float8e5m2", ncclFloat8e5m2},
    };
    for (const auto &tc : cases) {
        Rules r = Parse(std::string("dtype=") + tc.name + " -> loom");
        for (int dt = 0; dt < ncclNumTypes; dt++)
            EXPECT_EQ(Decide(r.get(), Call(SHIM_COLL_ALLREDUCE, (ncclDataType_t)dt)),
                      dt == tc.dt ? SHIM_TO_LOOM : SHIM_TO_NCCL)
                << tc.name << " on dtype " << dt;
    }
    Rules list = Parse("dtype=bf16,fp16,f32 -> loom");
    EXPECT_EQ(Decide(list.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32)), SHIM_TO_LOOM);
    EXPECT_EQ(Decide(list.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat64)), SHIM_TO_NCCL);
    /* a datatype outside NCCL's enum matches only dtype=* */
    EXPECT_EQ(Decide("dtype=* -> loom", Call(SHIM_COLL_ALLREDUCE, (ncclDataType_t)40)),
              SHIM_TO_LOOM);
    EXPECT_EQ(Decide(list.get(), Call(SHIM_COLL_ALLREDUCE, (ncclDataType_t)40)), SHIM_TO_NCCL);
}

TEST(ShimRoute, Ops)
{
    const struct {
        const char *name;
        int op;
    } cases[] = {{"sum", ncclSum}, {"prod", ncclProd}, {"max", ncclMax},  {"min", ncclMin},
                 {"avg", ncclAvg}, {"premulsum", 5},   {"premul_sum", 5}, {"SUM", ncclSum}};
    const int calls[] = {-1, ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, 5, 6, 1000};
    for (const auto &tc : cases) {
        Rules r = Parse(std::string("op=") + tc.name + " -> loom");
        for (int op : calls) {
            const int kind = op >= 5 ? 5 : op;
            EXPECT_EQ(Decide(r.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32, op)),
                      kind == tc.op ? SHIM_TO_LOOM : SHIM_TO_NCCL)
                << tc.name << " on op " << op;
        }
    }
    /* a collective without an op matches a rule without an op condition, and op=* */
    EXPECT_EQ(Decide("op=sum,prod,max,min,avg,premulsum -> loom",
                     Call(SHIM_COLL_ALLGATHER, ncclFloat32, -1)),
              SHIM_TO_NCCL);
    EXPECT_EQ(Decide("op=* -> loom", Call(SHIM_COLL_ALLGATHER, ncclFloat32, -1)), SHIM_TO_LOOM);
    EXPECT_EQ(Decide("coll=allgather -> loom", Call(SHIM_COLL_ALLGATHER, ncclFloat32, -1)),
              SHIM_TO_LOOM);
}

TEST(ShimRoute, BytesForms)
{
    const size_t K = 1024, M = K * K, G = M * K;
    const struct {
        const char *cond;
        std::vector<size_t> in, out;
    } cases[] = {
        {"bytes>=1M", {M, M + 1, 64 * G}, {0, M - 1}},
        {"bytes=>=1M", {M, 5 * M}, {M - 1}},
        {"bytes>1M", {M + 1}, {M, 0}},
        {"bytes=>1M", {M + 1}, {M}},
        {"bytes<=64K", {0, 64 * K}, {64 * K + 1}},
        {"bytes=<=64K", {0, 64 * K}, {64 * K + 1}},
        {"bytes<64K", {64 * K - 1}, {64 * K}},
        {"bytes=1M-16M", {M, 16 * M, 3 * M}, {M - 1, 16 * M + 1}},
        {"bytes=4096", {4 * K}, {4 * K - 1, 4 * K + 1}},
        {"bytes=4k", {4 * K}, {4 * K + 1}},
        {"bytes=2g", {2 * G}, {2 * G - 1}},
        {"bytes=1G-1G", {G}, {G + 1}},
        {"bytes=0", {0}, {1}},
        {"bytes=*", {0, G, SIZE_MAX}, {}},
        {"bytes>=0", {0, SIZE_MAX}, {}},
        {"bytes=18446744073709551615", {SIZE_MAX}, {0}},
    };
    for (const auto &tc : cases) {
        Rules r = Parse(std::string("coll=allreduce ") + tc.cond + " -> loom");
        for (size_t b : tc.in)
            EXPECT_EQ(Decide(r.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, b)),
                      SHIM_TO_LOOM)
                << tc.cond << " with " << b;
        for (size_t b : tc.out)
            EXPECT_EQ(Decide(r.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, b)),
                      SHIM_TO_NCCL)
                << tc.cond << " with " << b;
    }
}

TEST(ShimRoute, NranksAndHosts)
{
    Rules r = Parse("nranks=2-8 hosts=1 -> loom");
    for (int n = 0; n <= 10; n++)
        for (int h = 0; h <= 3; h++)
            EXPECT_EQ(Decide(r.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, 64, n, h)),
                      n >= 2 && n <= 8 && h == 1 ? SHIM_TO_LOOM : SHIM_TO_NCCL)
                << n << " ranks on " << h << " hosts";
    for (const char *cond : {"hosts=>1", "hosts>1", "hosts>=2", "hosts=2-2147483647"}) {
        Rules m = Parse(std::string(cond) + " -> loom");
        EXPECT_EQ(Decide(m.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, 64, 8, 1)),
                  SHIM_TO_NCCL)
            << cond;
        EXPECT_EQ(Decide(m.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, 64, 8, 2)),
                  SHIM_TO_LOOM)
            << cond;
        EXPECT_STREQ(shim_rules_text(m.get()), "hosts>=2 -> loom") << cond;
    }
    Rules le = Parse("nranks<=4 -> loom");
    EXPECT_EQ(Decide(le.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, 64, 4)),
              SHIM_TO_LOOM);
    EXPECT_EQ(Decide(le.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, 64, 5)),
              SHIM_TO_NCCL);
    /* a negative size or host count (never set by the library) matches no condition on it */
    EXPECT_EQ(Decide(le.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, 64, -1)),
              SHIM_TO_NCCL);
}

TEST(ShimRoute, NameGlobs)
{
    auto with_name = [](const char *name) {
        shim_call_t c = Call();
        c.name = name;
        return c;
    };
    Rules tp = Parse("name=tp* -> loom");
    EXPECT_EQ(Decide(tp.get(), with_name("tp")), SHIM_TO_LOOM);
    EXPECT_EQ(Decide(tp.get(), with_name("tp_group_3")), SHIM_TO_LOOM);
    EXPECT_EQ(Decide(tp.get(), with_name("dp")), SHIM_TO_NCCL);
    EXPECT_EQ(Decide(tp.get(), with_name("TP")), SHIM_TO_NCCL); /* case matters in names */
    EXPECT_EQ(Decide(tp.get(), with_name(nullptr)), SHIM_TO_NCCL);
    Rules named = Parse("name=?* -> loom");
    EXPECT_EQ(Decide(named.get(), with_name("x")), SHIM_TO_LOOM);
    EXPECT_EQ(Decide(named.get(), with_name(nullptr)), SHIM_TO_NCCL);
    EXPECT_EQ(Decide(named.get(), with_name("")), SHIM_TO_NCCL);
    Rules any = Parse("name=* -> loom");
    EXPECT_EQ(Decide(any.get(), with_name(nullptr)), SHIM_TO_LOOM);
    EXPECT_STREQ(shim_rules_text(any.get()), "* -> loom");
    Rules cls = Parse("name=[td]p?_* -> loom");
    EXPECT_EQ(Decide(cls.get(), with_name("dp0_a")), SHIM_TO_LOOM);
    EXPECT_EQ(Decide(cls.get(), with_name("pp0_a")), SHIM_TO_NCCL);
    Rules exact = Parse("name=moe.ep -> loom");
    EXPECT_EQ(Decide(exact.get(), with_name("moe.ep")), SHIM_TO_LOOM);
    EXPECT_EQ(Decide(exact.get(), with_name("moe.ep2")), SHIM_TO_NCCL);
    EXPECT_STREQ(shim_rules_text(exact.get()), "name=moe.ep -> loom");
}

TEST(ShimRoute, WhitespaceAndSeparators)
{
    const char *same[] = {
        "coll=allreduce dtype=bf16 -> loom; * -> echo",
        "coll=allreduce dtype=bf16->loom;*->echo",
        "  coll=allreduce\tdtype=bf16   ->\tloom ;\n * -> echo  ",
        "\ncoll=allreduce\n\ndtype=bf16\n->\nloom\n;\n*\n->\necho\n",
        "dtype=BF16 COLL=AllReduce -> LOOM; * -> Echo",
    };
    for (const char *text : same) {
        Rules r = Parse(text);
        ASSERT_TRUE(r) << text;
        EXPECT_STREQ(shim_rules_text(r.get()), "coll=allreduce dtype=bf16 -> loom; * -> echo")
            << text;
    }
}

TEST(ShimRoute, CanonicalTextRoundTrips)
{
    const char *cases[][2] = {
        {"dtype=bf16,fp16 coll=allreduce op=sum bytes=>=1048576 nranks=2-8 hosts=1 -> echo",
         "coll=allreduce dtype=fp16,bf16 op=sum bytes>=1M nranks=2-8 hosts=1 -> echo"},
        {"coll=bcast,broadcast,allgather -> loom", "coll=allgather,broadcast -> loom"},
        {"bytes=1024-3072 -> loom", "bytes=1K-3K -> loom"},
        {"bytes=1025-65536 -> loom", "bytes=1025-64K -> loom"},
        {"bytes<64K -> nccl", "bytes<=65535 -> nccl"},
        {"bytes>0 -> loom", "bytes>=1 -> loom"},
        {"bytes=0-0 -> loom", "bytes=0 -> loom"},
        {"bytes=1073741824 -> loom", "bytes=1G -> loom"},
        {"op=avg,sum,premul_sum -> loom", "op=sum,avg,premulsum -> loom"},
        {"nranks=*  dtype=* coll=* op=* -> nccl", "* -> nccl"},
        {"dtype=double,half,char -> loom", "dtype=int8,fp16,fp64 -> loom"},
    };
    for (const auto &tc : cases) {
        Rules r = Parse(tc[0]);
        ASSERT_TRUE(r) << tc[0];
        EXPECT_STREQ(shim_rules_text(r.get()), tc[1]) << tc[0];
        Rules again = Parse(shim_rules_text(r.get()));
        ASSERT_TRUE(again);
        EXPECT_STREQ(shim_rules_text(again.get()), tc[1]);
    }
    EXPECT_STREQ(shim_rules_text(nullptr), "");
}

/* ---- errors -------------------------------------------------------------------------------- */

TEST(ShimRoute, ErrorsNameTheRuleAndTheText)
{
    const struct {
        const char *text;
        std::vector<const char *> parts;
    } cases[] = {
        {"", {"rule 1", "empty"}},
        {"   ", {"rule 1", "empty"}},
        {"* -> loom;", {"rule 2", "empty"}},
        {"* -> loom;; * -> nccl", {"rule 2", "empty"}},
        {"coll=allreduce", {"rule 1", "`coll=allreduce`", "-> target"}},
        {"coll=allreduce -> gpu", {"rule 1", "unknown target 'gpu'"}},
        {"coll=allreduce -> loom -> nccl", {"rule 1", "unknown target 'loom -> nccl'"}},
        {"coll=allreduce ->", {"rule 1", "unknown target ''"}},
        {"-> loom", {"rule 1", "no conditions", "*"}},
        {"* -> loom; size=4 -> nccl", {"rule 2", "`size=4 -> nccl`", "unknown key 'size'"}},
        {"* -> loom; * -> loom; coll=allreduc -> nccl",
         {"rule 3", "unknown collective 'allreduc'", "allreduce", "recv"}},
        {"dtype=bf17 -> loom", {"unknown datatype 'bf17'", "fp16"}},
        {"op=mean -> loom", {"unknown op 'mean'", "premulsum"}},
        {"coll=allreduce coll=allgather -> loom", {"coll given twice"}},
        {"name=a name=b -> loom", {"name given twice"}},
        {"coll -> loom", {"'coll' is not key=value"}},
        {"coll=allreduce,,allgather -> loom", {"empty item in coll=allreduce,,allgather"}},
        {"coll=allreduce, -> loom", {"empty item"}},
        {"coll=*,allreduce -> loom", {"* cannot be combined"}},
        {"coll= -> loom", {"no value after coll="}},
        {"coll=allreduce * -> loom", {"* stands alone"}},
        {"coll<3 -> loom", {"coll takes key=value"}},
        {"name>3 -> loom", {"name takes key=value"}},
        {"bytes=1X -> loom", {"'1X' in bytes is not a number", "K, M or G"}},
        {"bytes=1MB -> loom", {"'1MB' in bytes is not a number"}},
        {"bytes=-5 -> loom", {"bytes is not a number"}},
        {"bytes=0x10 -> loom", {"'0x10' in bytes is not a number"}},
        {"bytes=>=abc -> loom", {"'abc' in bytes is not a number"}},
        {"bytes=16M-1M -> loom", {"empty range"}},
        {"bytes<0 -> loom", {"matches nothing"}},
        {"bytes=99999999999999999999 -> loom", {"too large"}},
        {"bytes=20000000000G -> loom", {"too large"}},
        {"nranks=1K -> loom", {"'1K' in nranks is not a number"}},
        {"nranks=4294967296 -> loom", {"too large"}},
        {"hosts>2147483647 -> loom", {"matches nothing"}},
        {"nranks=2- -> loom", {"'' in nranks is not a number"}},
        {"hosts=one -> loom", {"'one' in hosts is not a number"}},
        {"nranks=2 - 8 -> loom", {"'-' is not key=value"}},
    };
    for (const auto &tc : cases) {
        const std::string err = ParseError(tc.text);
        for (const char *part : tc.parts)
            EXPECT_TRUE(Contains(err, part))
                << "text: " << tc.text << "\nerror: " << err << "\nmissing: " << part;
    }
}

TEST(ShimRoute, ErrorArgumentsAndLongRules)
{
    shim_rules_t *r = nullptr;
    char err[128] = "x";
    EXPECT_EQ(shim_rules_parse(nullptr, &r, err, sizeof(err)), ncclInvalidArgument);
    EXPECT_TRUE(Contains(err, "no rule text"));
    EXPECT_EQ(shim_rules_parse("* -> loom", nullptr, err, sizeof(err)), ncclInvalidArgument);
    /* no message buffer, or a tiny one: still the result, no overflow */
    EXPECT_EQ(shim_rules_parse("bogus -> loom", &r, nullptr, 0), ncclInvalidArgument);
    char tiny[8];
    EXPECT_EQ(shim_rules_parse("bogus -> loom", &r, tiny, sizeof(tiny)), ncclInvalidArgument);
    EXPECT_EQ(strlen(tiny), sizeof(tiny) - 1);
    /* a long rule is shortened in the message, the offending text is kept */
    std::string lng = "name=" + std::string(300, 'a') + " bogus=1 -> loom";
    const std::string msg = ParseError(lng);
    EXPECT_TRUE(Contains(msg, "...`")) << msg;
    EXPECT_TRUE(Contains(msg, "unknown key 'bogus'")) << msg;
    EXPECT_LT(msg.size(), 200u) << msg;
    /* success clears the message */
    char ok[64] = "stale";
    ASSERT_EQ(shim_rules_parse("* -> loom", &r, ok, sizeof(ok)), ncclSuccess);
    EXPECT_STREQ(ok, "");
    shim_rules_free(r);
    shim_rules_free(nullptr);
}

/* ---- defaults ------------------------------------------------------------------------------ */

TEST(ShimRoute, Defaults)
{
    for (int echo = 0; echo <= 1; echo++) {
        const shim_rules_t *d = shim_rules_default(echo);
        const shim_target_t hit = echo ? SHIM_TO_ECHO : SHIM_TO_LOOM;
        const std::string expect =
            std::string("coll=allreduce dtype=fp16,bf16 op=sum bytes>=1M nranks=2-8 hosts=1 -> ") +
            (echo ? "echo" : "loom");
        EXPECT_EQ(shim_rules_text(d), expect);
        /* the built-in table is what its own text parses to */
        Rules parsed = Parse(shim_rules_text(d));
        EXPECT_STREQ(shim_rules_text(parsed.get()), shim_rules_text(d));

        std::string why;
        EXPECT_EQ(Decide(d, Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclSum, 1 << 20, 2, 1), &why),
                  hit);
        EXPECT_EQ(why, "rule 1: " + expect);
        EXPECT_EQ(Decide(d, Call(SHIM_COLL_ALLREDUCE, ncclFloat16, ncclSum, 64 << 20, 8, 1)), hit);
        const shim_call_t miss[] = {
            Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, 4 << 20, 4, 1),
            Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclAvg, 4 << 20, 4, 1),
            Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclSum, (1 << 20) - 2, 4, 1),
            Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclSum, 4 << 20, 1, 1),
            Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclSum, 4 << 20, 9, 1),
            Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclSum, 4 << 20, 4, 2),
            Call(SHIM_COLL_REDUCESCATTER, ncclBfloat16, ncclSum, 4 << 20, 4, 1),
            Call(SHIM_COLL_ALLGATHER, ncclBfloat16, -1, 4 << 20, 4, 1),
        };
        for (const shim_call_t &c : miss) {
            EXPECT_EQ(Decide(d, c, &why), SHIM_TO_NCCL);
            EXPECT_EQ(why, "no rule matched");
        }
        EXPECT_EQ(d, shim_rules_default(echo ? 7 : 0));
        shim_rules_free(const_cast<shim_rules_t *>(d)); /* the built-in tables ignore a free */
        EXPECT_EQ(shim_rules_text(d), expect);
    }
}

/* ---- fixed constraints and order ----------------------------------------------------------- */

TEST(ShimRoute, FixedConstraintsWin)
{
    Rules all = Parse("* -> loom");
    Rules echo = Parse("* -> echo");
    const shim_call_t base = Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, 4 << 20, 4, 1);
    std::string why;
    ASSERT_EQ(Decide(all.get(), base, &why), SHIM_TO_LOOM);
    EXPECT_EQ(why, "rule 1: * -> loom");
    ASSERT_EQ(Decide(echo.get(), base), SHIM_TO_ECHO);

    shim_call_t c = base;
    c.device_buffers = 1; /* loom's side has no device path */
    c.loom_why = "LOOM_DEVICE=none";
    EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "device buffers, and loom has no device path: LOOM_DEVICE=none");
    c = base;
    c.capturing = 1;
    EXPECT_EQ(Decide(echo.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_TRUE(Contains(why, "capture")) << why;
    c = base;
    c.in_group = 1;
    EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_TRUE(Contains(why, "group")) << why;
    for (shim_coll_t p2p : {SHIM_COLL_SEND, SHIM_COLL_RECV}) {
        c = Call(p2p, ncclFloat32, -1, 4 << 20, 4, 1);
        EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_NCCL);
        EXPECT_TRUE(Contains(why, "send/recv")) << why;
        EXPECT_EQ(Decide("coll=send,recv -> loom", c), SHIM_TO_NCCL);
    }
    /* the constraints hold with the defaults and with no rules at all */
    c = Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclSum, 4 << 20, 4, 1);
    c.in_group = 1;
    EXPECT_EQ(Decide(shim_rules_default(1), c), SHIM_TO_NCCL);
    EXPECT_EQ(Decide(nullptr, base, &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "no rule matched");
    char buf[64];
    EXPECT_EQ(shim_route_decide(all.get(), nullptr, buf, sizeof(buf)), SHIM_TO_NCCL);
    EXPECT_EQ(shim_route_decide(all.get(), &base, nullptr, 0), SHIM_TO_LOOM);
}

/* Device buffers follow the rules where loom's side has a device path, within what its
 * transports run and what a CUDA graph may capture. */
TEST(ShimRoute, DeviceBuffersAndCapture)
{
    Rules all = Parse("* -> loom");
    Rules echo = Parse("* -> echo");
    shim_call_t dev = Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclSum, 4 << 20, 4, 1);
    dev.device_buffers = 1;
    dev.loom_device = dev.loom_device_coll = dev.loom_capturable = 1;
    std::string why;
    EXPECT_EQ(Decide(all.get(), dev, &why), SHIM_TO_LOOM);
    EXPECT_EQ(why, "rule 1: * -> loom");
    EXPECT_EQ(Decide(echo.get(), dev, &why), SHIM_TO_ECHO);
    EXPECT_EQ(Decide(shim_rules_default(0), dev, &why), SHIM_TO_LOOM);
    EXPECT_EQ(Decide(shim_rules_default(1), dev, &why), SHIM_TO_ECHO);
    EXPECT_EQ(Decide(nullptr, dev, &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "no rule matched");

    /* captured: loom where its transport may be captured; Echo never (host-staged) */
    shim_call_t c = dev;
    c.capturing = 1;
    EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_LOOM);
    EXPECT_EQ(Decide(echo.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "rule 1: * -> echo; stream capture (echo runs host-staged, which a CUDA graph "
                   "cannot capture)");
    c.loom_capturable = 0;
    EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "rule 1: * -> loom; stream capture (loom's transport for it runs host-staged, "
                   "which a CUDA graph cannot capture)");
    /* host buffers are never captured on loom */
    c = Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclSum, 4 << 20, 4, 1);
    c.capturing = 1;
    c.loom_device = c.loom_device_coll = c.loom_capturable = 1;
    EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "rule 1: * -> loom; stream capture (loom's host path cannot be captured)");
    /* an echo rule demoted to loom keeps its note */
    c = dev;
    c.datatype = ncclInt32;
    c.capturing = 1;
    c.loom_capturable = 0;
    EXPECT_EQ(Decide(echo.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "rule 1: * -> echo; echo takes only sum allreduce of fp32, fp16 or bf16; stream "
                   "capture (loom's transport for it runs host-staged, which a CUDA graph cannot "
                   "capture)");

    /* no transport of loom's device path runs the call */
    c = dev;
    c.loom_device_coll = c.loom_capturable = 0;
    c.loom_why = "ipc does not run AllReduce of int8";
    EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "rule 1: * -> loom; device buffers, and no transport of loom's device path runs "
                   "the call: ipc does not run AllReduce of int8");
    /* no device path at all: before any rule */
    c = dev;
    c.loom_device = c.loom_device_coll = c.loom_capturable = 0;
    c.loom_why = nullptr;
    EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "device buffers, and loom has no device path: no reason given");
    /* PreMulSum on device buffers: loom would scale on the host */
    c = dev;
    c.op = ncclNumOps;
    EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "device buffers with a premulsum op (loom scales its input on the host)");
    /* groups and Send/Recv stay NCCL's */
    c = dev;
    c.in_group = 1;
    EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_TRUE(Contains(why, "group")) << why;
    c = dev;
    c.coll = SHIM_COLL_SEND;
    EXPECT_EQ(Decide(all.get(), c, &why), SHIM_TO_NCCL);
    EXPECT_TRUE(Contains(why, "send/recv")) << why;
}

TEST(ShimRoute, EchoOnlyForSumAllReduceOfFloats)
{
    Rules echo = Parse("* -> echo");
    std::string why;
    for (ncclDataType_t dt : {ncclFloat32, ncclFloat16, ncclBfloat16})
        EXPECT_EQ(Decide(echo.get(), Call(SHIM_COLL_ALLREDUCE, dt, ncclSum)), SHIM_TO_ECHO);
    const shim_call_t demoted[] = {
        Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclAvg),
        Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclProd),
        Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclMax),
        Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, 5),
        Call(SHIM_COLL_ALLREDUCE, ncclFloat64, ncclSum),
        Call(SHIM_COLL_ALLREDUCE, ncclInt32, ncclSum),
        Call(SHIM_COLL_ALLREDUCE, ncclFloat8e4m3, ncclSum),
        Call(SHIM_COLL_REDUCESCATTER, ncclFloat32, ncclSum),
        Call(SHIM_COLL_REDUCE, ncclBfloat16, ncclSum),
        Call(SHIM_COLL_ALLGATHER, ncclFloat32, -1),
        Call(SHIM_COLL_BROADCAST, ncclFloat32, -1),
    };
    for (const shim_call_t &c : demoted) {
        EXPECT_EQ(Decide(echo.get(), c, &why), SHIM_TO_LOOM);
        EXPECT_EQ(why, "rule 1: * -> echo; echo takes only sum allreduce of fp32, fp16 or bf16");
    }
}

TEST(ShimRoute, FirstMatchWins)
{
    Rules r = Parse("coll=allreduce bytes<=64K -> nccl; coll=allreduce dtype=bf16 -> echo; "
                    "coll=allreduce -> loom; * -> nccl");
    std::string why;
    EXPECT_EQ(Decide(r.get(), Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclSum, 1024), &why),
              SHIM_TO_NCCL);
    EXPECT_EQ(why, "rule 1: coll=allreduce bytes<=64K -> nccl");
    EXPECT_EQ(Decide(r.get(), Call(SHIM_COLL_ALLREDUCE, ncclBfloat16, ncclSum, 1 << 20), &why),
              SHIM_TO_ECHO);
    EXPECT_EQ(why, "rule 2: coll=allreduce dtype=bf16 -> echo");
    EXPECT_EQ(Decide(r.get(), Call(SHIM_COLL_ALLREDUCE, ncclFloat32, ncclSum, 1 << 20), &why),
              SHIM_TO_LOOM);
    EXPECT_EQ(why, "rule 3: coll=allreduce -> loom");
    EXPECT_EQ(Decide(r.get(), Call(SHIM_COLL_ALLGATHER, ncclFloat32, -1, 1 << 20), &why),
              SHIM_TO_NCCL);
    EXPECT_EQ(why, "rule 4: * -> nccl");
    /* the same rules in the other order: the catch-all shadows the rest */
    Rules rev = Parse("* -> nccl; coll=allreduce -> loom");
    EXPECT_EQ(Decide(rev.get(), Call(), &why), SHIM_TO_NCCL);
    EXPECT_EQ(why, "rule 1: * -> nccl");
    EXPECT_STREQ(shim_target_name(SHIM_TO_NCCL), "nccl");
    EXPECT_STREQ(shim_target_name(SHIM_TO_LOOM), "loom");
    EXPECT_STREQ(shim_target_name(SHIM_TO_ECHO), "echo");
}

/* ---- randomized: the parser against a model of the test's own ----------------------------- */

} // namespace
