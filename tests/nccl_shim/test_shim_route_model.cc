/* SPDX-License-Identifier: Apache-2.0
 *
 * test_shim_route_model.cc - the routing rules of the drop-in NCCL library (shim_route.c)
 * against a reference model of the test's own: random rule lists written in random spellings
 * must decide every random call as the model does, identically when parsed twice, from their
 * canonical text, from copies of the call and from several threads.
 */
#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shim_route_test.h"

namespace {

using namespace routetest;

const uint64_t kBoundaries[] = {
    0,       1,       1023,     1024,           1025,       64 << 10,   (1 << 20) - 1,
    1 << 20, 1 << 21, 16 << 20, (16 << 20) + 1, 1ull << 30, 3ull << 30, SIZE_MAX};
const int kNumBoundaries = sizeof(kBoundaries) / sizeof(kBoundaries[0]);

struct ModelRule {
    std::optional<std::vector<int>> colls, dtypes, ops;
    std::optional<std::pair<uint64_t, uint64_t>> bytes, nranks, hosts;
    std::optional<std::string> name;
    shim_target_t target;
};

/* '*' and '?' only, the globs the generator writes */
bool GlobMatch(const char *p, const char *s)
{
    if (*p == '\0')
        return *s == '\0';
    if (*p == '*')
        return GlobMatch(p + 1, s) || (*s && GlobMatch(p, s + 1));
    if (*s == '\0')
        return false;
    return (*p == '?' || *p == *s) && GlobMatch(p + 1, s + 1);
}

bool Has(const std::vector<int> &v, int x)
{
    return std::find(v.begin(), v.end(), x) != v.end();
}

shim_target_t ModelDecide(const std::vector<ModelRule> &rules, const shim_call_t &c)
{
    if (c.coll == SHIM_COLL_SEND || c.coll == SHIM_COLL_RECV || c.in_group)
        return SHIM_TO_NCCL;
    if (c.device_buffers && (!c.loom_device || c.op >= 5))
        return SHIM_TO_NCCL;
    for (const ModelRule &r : rules) {
        if (r.colls && !Has(*r.colls, c.coll))
            continue;
        if (r.dtypes && !Has(*r.dtypes, c.datatype))
            continue;
        if (r.ops && !(c.op >= 0 && Has(*r.ops, std::min(c.op, 5))))
            continue;
        if (r.bytes && !(c.bytes >= r.bytes->first && c.bytes <= r.bytes->second))
            continue;
        if (r.nranks &&
            !((uint64_t)c.nranks >= r.nranks->first && (uint64_t)c.nranks <= r.nranks->second))
            continue;
        if (r.hosts &&
            !((uint64_t)c.hosts >= r.hosts->first && (uint64_t)c.hosts <= r.hosts->second))
            continue;
        if (r.name && !GlobMatch(r.name->c_str(), c.name ? c.name : ""))
            continue;
        const bool echo_ok =
            c.coll == SHIM_COLL_ALLREDUCE && c.op == ncclSum &&
            (c.datatype == ncclFloat32 || c.datatype == ncclFloat16 || c.datatype == ncclBfloat16);
        const shim_target_t t = r.target == SHIM_TO_ECHO && !echo_ok ? SHIM_TO_LOOM : r.target;
        if (t == SHIM_TO_ECHO && c.capturing)
            return SHIM_TO_NCCL;
        if (t == SHIM_TO_LOOM && c.device_buffers && !c.loom_device_coll)
            return SHIM_TO_NCCL;
        if (t == SHIM_TO_LOOM && c.capturing && !(c.device_buffers && c.loom_capturable))
            return SHIM_TO_NCCL;
        return t;
    }
    return SHIM_TO_NCCL;
}

class Writer {
  public:
    explicit Writer(std::mt19937_64 &rng) : rng_(rng) {}

    std::string Space(bool required)
    {
        static const char *ws[] = {" ", "  ", "\t", "\n", " \t "};
        if (!required && Pick(3) == 0)
            return "";
        return ws[Pick(5)];
    }

    std::string Case(std::string s)
    {
        if (Pick(4) == 0)
            for (char &ch : s)
                ch = Pick(2) ? (char)toupper((unsigned char)ch) : ch;
        return s;
    }

    std::string Number(uint64_t v, bool suffix)
    {
        if (suffix && v != 0 && Pick(2)) {
            const char *units[] = {"G", "M", "K", "g", "m", "k"};
            const int shifts[] = {30, 20, 10, 30, 20, 10};
            for (int i = Pick(2) * 3, k = 0; k < 3; i++, k++)
                if ((v & ((1ull << shifts[i]) - 1)) == 0)
                    return std::to_string(v >> shifts[i]) + units[i];
        }
        return std::to_string(v);
    }

    std::string Range(const char *key, std::pair<uint64_t, uint64_t> r, uint64_t max, bool suffix)
    {
        const std::string k = Case(key);
        if (r.first == r.second && Pick(3))
            return k + "=" + Number(r.first, suffix);
        if (r.second == max && r.first > 0 && Pick(2))
            return k + (Pick(2) ? ">" : "=>") + Number(r.first - 1, suffix);
        if (r.second == max)
            return k + (Pick(2) ? ">=" : "=>=") + Number(r.first, suffix);
        if (r.first == 0 && Pick(2))
            return k + (Pick(2) ? "<" : "=<") + Number(r.second + 1, suffix);
        if (r.first == 0 && Pick(2))
            return k + (Pick(2) ? "<=" : "=<=") + Number(r.second, suffix);
        return k + "=" + Number(r.first, suffix) + "-" + Number(r.second, suffix);
    }

    std::string List(const char *key, const std::vector<int> &values,
                     const std::vector<std::vector<std::string>> &names)
    {
        std::vector<int> v = values;
        std::shuffle(v.begin(), v.end(), rng_);
        if (Pick(3) == 0)
            v.push_back(v[0]); /* a repeated value changes nothing */
        std::string s = Case(key) + "=";
        for (size_t i = 0; i < v.size(); i++) {
            const auto &spellings = names[v[i]];
            s += (i ? "," : "") + Case(spellings[Pick((int)spellings.size())]);
        }
        return s;
    }

    int Pick(int n)
    {
        return (int)(rng_() % (uint64_t)n);
    }

  private:
    std::mt19937_64 &rng_;
};

const std::vector<std::vector<std::string>> kCollNames = {
    {"allreduce"}, {"allgather"}, {"reducescatter"}, {"broadcast", "bcast"},
    {"reduce"},    {"alltoall"},  {"gather"},        {"scatter"},
    {"send"},      {"recv"}};
const std::vector<std::vector<std::string>> kDtypeNames = {{"int8", "char"},
                                                           {"uint8"},
                                                           {"int32", "int"},
                                                           {"uint32"},
                                                           {"int64"},
                                                           {"uint64"},
                                                           {"fp16", "f16", "half", "float16"},
                                                           {"fp32", "f32", "float", "float32"},
                                                           {"fp64", "f64", "double", "float64"},
                                                           {"bf16", "bfloat16"},
                                                           {"fp8e4m3", "e4m3", "float8e4m3"},
                                                           {"fp8e5m2", "e5m2", "float8e5m2"}};
const std::vector<std::vector<std::string>> kOpNames = {
    {"sum"}, {"prod"}, {"max"}, {"min"}, {"avg"}, {"premulsum", "premul_sum"}};
const char *kNames[] = {nullptr, "tp", "tp0", "tp12", "dp", "dp_tp", "pp_1", "moe.ep"};
const char *kGlobs[] = {"tp*", "?p", "*_*", "tp?", "dp*", "*", "??*", "pp_1", "*.ep", "x*"};

std::vector<int> Subset(std::mt19937_64 &rng, int n)
{
    std::vector<int> v;
    while (v.empty())
        for (int i = 0; i < n; i++)
            if (rng() % 3 == 0)
                v.push_back(i);
    return v;
}

std::pair<uint64_t, uint64_t> RandomRange(std::mt19937_64 &rng, const uint64_t *points, int n,
                                          uint64_t max)
{
    uint64_t a = points[rng() % n], b = points[rng() % n];
    if (a > b)
        std::swap(a, b);
    switch (rng() % 4) {
    case 0:
        return {a, max};
    case 1:
        return {0, b};
    case 2:
        return {a, a};
    default:
        return {a, b};
    }
}

/* A random rule list: the model and a text that spells it in one of many ways. */
std::string RandomRules(std::mt19937_64 &rng, std::vector<ModelRule> *model)
{
    Writer w(rng);
    static const uint64_t rank_points[] = {0, 1, 2, 3, 4, 8, 9, 16};
    static const uint64_t host_points[] = {0, 1, 2, 4};
    const int nrules = 1 + w.Pick(5);
    std::string text = w.Space(false);
    for (int i = 0; i < nrules; i++) {
        ModelRule r;
        std::vector<std::string> conds;
        if (w.Pick(2)) {
            r.colls = Subset(rng, SHIM_NUM_COLLS);
            conds.push_back(w.List("coll", *r.colls, kCollNames));
        }
        if (w.Pick(2)) {
            r.dtypes = Subset(rng, ncclNumTypes);
            conds.push_back(w.List("dtype", *r.dtypes, kDtypeNames));
        }
        if (w.Pick(3) == 0) {
            r.ops = Subset(rng, 6);
            conds.push_back(w.List("op", *r.ops, kOpNames));
        }
        if (w.Pick(2)) {
            r.bytes = RandomRange(rng, kBoundaries, kNumBoundaries, SIZE_MAX);
            if (r.bytes->first == 0 && r.bytes->second == SIZE_MAX)
                r.bytes.reset();
            else
                conds.push_back(w.Range("bytes", *r.bytes, SIZE_MAX, true));
        }
        if (w.Pick(3) == 0) {
            r.nranks = RandomRange(rng, rank_points, 8, INT_MAX);
            if (r.nranks->first == 0 && r.nranks->second == INT_MAX)
                r.nranks.reset();
            else
                conds.push_back(w.Range("nranks", *r.nranks, INT_MAX, false));
        }
        if (w.Pick(3) == 0) {
            r.hosts = RandomRange(rng, host_points, 4, INT_MAX);
            if (r.hosts->first == 0 && r.hosts->second == INT_MAX)
                r.hosts.reset();
            else
                conds.push_back(w.Range("hosts", *r.hosts, INT_MAX, false));
        }
        if (w.Pick(4) == 0) {
            r.name = kGlobs[w.Pick(10)];
            conds.push_back(w.Case("name") + "=" + *r.name);
        }
        /* a wildcard condition on a key the rule does not constrain changes nothing */
        if (!r.ops && w.Pick(6) == 0)
            conds.push_back(w.Case("op") + "=*");
        if (!r.name && w.Pick(6) == 0)
            conds.push_back(w.Case("name") + "=*");
        r.target = (shim_target_t)w.Pick(3);
        model->push_back(r);

        std::shuffle(conds.begin(), conds.end(), rng);
        std::string rule;
        for (size_t k = 0; k < conds.size(); k++)
            rule += (k ? w.Space(true) : "") + conds[k];
        if (rule.empty())
            rule = "*";
        text += rule + w.Space(false) + "->" + w.Space(false) + w.Case(shim_target_name(r.target)) +
                w.Space(false);
        if (i + 1 < nrules)
            text += ";" + w.Space(false);
    }
    return text;
}

shim_call_t RandomCall(std::mt19937_64 &rng)
{
    shim_call_t c = Call((shim_coll_t)(rng() % SHIM_NUM_COLLS), (ncclDataType_t)(rng() % 12),
                         (int)(rng() % 9) - 1, kBoundaries[rng() % kNumBoundaries],
                         1 + (int)(rng() % 16), 1 + (int)(rng() % 4));
    if (rng() % 4 == 0) { /* a quarter are what Echo takes, so that echo rules get exercised */
        static const ncclDataType_t floats[] = {ncclFloat32, ncclFloat16, ncclBfloat16};
        c.coll = SHIM_COLL_ALLREDUCE;
        c.op = ncclSum;
        c.datatype = floats[rng() % 3];
    }
    c.name = kNames[rng() % 8];
    c.in_group = rng() % 10 == 0;
    c.device_buffers = rng() % 8 == 0;
    c.capturing = rng() % 10 == 0;
    /* what loom's device path can do, consistent as loom answers: a transport needs a path */
    c.loom_device = rng() % 4 != 0;
    c.loom_device_coll = c.loom_device && rng() % 4 != 0;
    c.loom_capturable = c.loom_device_coll && rng() % 2 == 0;
    c.loom_why = c.loom_device_coll ? nullptr : "no transport here";
    return c;
}

/* The same call with its name in another buffer and other bytes in the struct's padding. */
shim_call_t *Copy(const shim_call_t &c, std::string *name_store, std::vector<char> *mem)
{
    mem->assign(sizeof(shim_call_t), (char)0xa5);
    shim_call_t *d = reinterpret_cast<shim_call_t *>(mem->data());
    d->coll = c.coll;
    d->datatype = c.datatype;
    d->op = c.op;
    d->bytes = c.bytes;
    d->nranks = c.nranks;
    d->hosts = c.hosts;
    if (c.name) {
        *name_store = c.name;
        d->name = name_store->c_str();
    } else {
        d->name = nullptr;
    }
    d->in_group = c.in_group;
    d->device_buffers = c.device_buffers;
    d->capturing = c.capturing;
    d->loom_device = c.loom_device;
    d->loom_device_coll = c.loom_device_coll;
    d->loom_capturable = c.loom_capturable;
    d->loom_why = c.loom_why;
    return d;
}

TEST(ShimRoute, RandomRulesAgreeWithModelAndAreDeterministic)
{
    std::mt19937_64 rng(20240613);
    int matched[3] = {0, 0, 0};
    for (int set = 0; set < 400; set++) {
        std::vector<ModelRule> model;
        const std::string text = RandomRules(rng, &model);
        Rules a = Parse(text), b = Parse(text);
        ASSERT_TRUE(a && b) << text;
        Rules canon = Parse(shim_rules_text(a.get()));
        ASSERT_TRUE(canon) << shim_rules_text(a.get());
        EXPECT_STREQ(shim_rules_text(a.get()), shim_rules_text(b.get()));
        EXPECT_STREQ(shim_rules_text(canon.get()), shim_rules_text(a.get())) << text;

        std::vector<shim_call_t> calls;
        std::vector<shim_target_t> serial;
        std::vector<std::string> whys;
        for (int k = 0; k < 200; k++) {
            const shim_call_t c = RandomCall(rng);
            std::string why_a, why_b, why_c, why_d;
            const shim_target_t t = Decide(a.get(), c, &why_a);
            ASSERT_EQ(t, ModelDecide(model, c))
                << "rules: " << text << "\ncanonical: " << shim_rules_text(a.get()) << "\ncoll "
                << c.coll << " dtype " << c.datatype << " op " << c.op << " bytes " << c.bytes
                << " nranks " << c.nranks << " hosts " << c.hosts << " name "
                << (c.name ? c.name : "(null)") << " group " << c.in_group << " device "
                << c.device_buffers << "/" << c.loom_device << c.loom_device_coll
                << c.loom_capturable << " capturing " << c.capturing << "\nwhy: " << why_a;
            EXPECT_EQ(Decide(b.get(), c, &why_b), t);
            EXPECT_EQ(Decide(canon.get(), c, &why_c), t);
            std::string name_store;
            std::vector<char> mem;
            EXPECT_EQ(Decide(a.get(), *Copy(c, &name_store, &mem), &why_d), t);
            EXPECT_EQ(why_a, why_b);
            EXPECT_EQ(why_a, why_c);
            EXPECT_EQ(why_a, why_d);
            calls.push_back(c);
            serial.push_back(t);
            whys.push_back(why_a);
            matched[t]++;
        }
        if (set % 40 == 0) {
            /* several threads deciding at once see the same answers */
            std::vector<std::thread> threads;
            std::vector<int> bad(4, 0);
            for (int th = 0; th < 4; th++)
                threads.emplace_back([&, th] {
                    for (int rep = 0; rep < 20; rep++)
                        for (size_t k = 0; k < calls.size(); k++) {
                            char why[512];
                            if (shim_route_decide(a.get(), &calls[k], why, sizeof(why)) !=
                                    serial[k] ||
                                whys[k] != why)
                                bad[th]++;
                        }
                });
            for (auto &t : threads)
                t.join();
            for (int th = 0; th < 4; th++)
                EXPECT_EQ(bad[th], 0);
        }
    }
    /* the generator reaches every target */
    EXPECT_GT(matched[SHIM_TO_NCCL], 1000);
    EXPECT_GT(matched[SHIM_TO_LOOM], 1000);
    EXPECT_GT(matched[SHIM_TO_ECHO], 100);
}

} // namespace
