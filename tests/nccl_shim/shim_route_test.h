/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_route_test.h - what the two tests of the routing rules (test_shim_route.cc, its grammar
 * and constraints; test_shim_route_model.cc, the randomized check against a model) share:
 * parsing a rule text into an owned list, deciding a call, and a substring test.
 */
#ifndef LOOM_TESTS_SHIM_ROUTE_TEST_H
#define LOOM_TESTS_SHIM_ROUTE_TEST_H

#include <gtest/gtest.h>
#include <nccl.h> /* outside extern "C": it includes CUDA's C++ headers */

#include <cstring>
#include <memory>
#include <string>

extern "C" { /* shim_route.h has no guards of its own */
#include "shim_route.h"
}

namespace routetest {

struct RulesDeleter {
    void operator()(shim_rules_t *r) const
    {
        shim_rules_free(r);
    }
};
using Rules = std::unique_ptr<shim_rules_t, RulesDeleter>;

inline Rules Parse(const std::string &text)
{
    shim_rules_t *r = nullptr;
    char err[512];
    ncclResult_t rc = shim_rules_parse(text.c_str(), &r, err, sizeof(err));
    EXPECT_EQ(rc, ncclSuccess) << "text: " << text << "\nerror: " << err;
    return Rules(r);
}

/* The error message of a text that must not parse. */
inline std::string ParseError(const std::string &text)
{
    shim_rules_t *r = reinterpret_cast<shim_rules_t *>(0x1);
    char err[512];
    ncclResult_t rc = shim_rules_parse(text.c_str(), &r, err, sizeof(err));
    EXPECT_EQ(rc, ncclInvalidArgument) << "text: " << text;
    EXPECT_EQ(r, nullptr) << "text: " << text;
    if (rc == ncclSuccess)
        shim_rules_free(r);
    return err;
}

inline shim_call_t Call(shim_coll_t coll = SHIM_COLL_ALLREDUCE, ncclDataType_t dt = ncclBfloat16,
                        int op = ncclSum, size_t bytes = 4 << 20, int nranks = 4, int hosts = 1)
{
    shim_call_t c;
    memset(&c, 0, sizeof(c));
    c.coll = coll;
    c.datatype = dt;
    c.op = op;
    c.bytes = bytes;
    c.nranks = nranks;
    c.hosts = hosts;
    c.name = nullptr;
    return c;
}

inline shim_target_t Decide(const shim_rules_t *r, const shim_call_t &c, std::string *why = nullptr)
{
    char buf[512];
    shim_target_t t = shim_route_decide(r, &c, buf, sizeof(buf));
    if (why)
        *why = buf;
    return t;
}

inline shim_target_t Decide(const std::string &text, const shim_call_t &c,
                            std::string *why = nullptr)
{
    Rules r = Parse(text);
    return r ? Decide(r.get(), c, why) : SHIM_TO_NCCL;
}

inline bool Contains(const std::string &s, const std::string &part)
{
    return s.find(part) != std::string::npos;
}

/* ---- grammar, key by key ------------------------------------------------------------------- */

} // namespace routetest

#endif
