/* SPDX-License-Identifier: Apache-2.0
 *
 * test_topo_json.cc - unit tests of the strict JSON reader for topology files
 * (src/topology/json.h): every value type with exact values, nesting, escapes
 * and surrogate pairs to UTF-8, each rejection the header promises (several
 * with the exact line and column), the depth and size limits, the typed
 * getters' range/type/missing errors and their paths, and write_string
 * round-tripping through the parser. Inputs are copied into buffers of their
 * exact size and never NUL-terminated, so ASan catches a read past len.
 */
#include <gtest/gtest.h>

#include <climits>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "json.h"

namespace {

struct Free {
    void operator()(loom_json_t *v) const
    {
        loom_json_free(v);
    }
};
using Json = std::unique_ptr<loom_json_t, Free>;

struct Result {
    int rc;
    Json v;
    std::string err;
};

Result parse(const std::string &text)
{
    /* An exact-size heap copy: one byte past len is outside the allocation. */
    std::unique_ptr<char[]> exact(new char[text.size() ? text.size() : 1]);
    std::memcpy(exact.get(), text.data(), text.size());
    char err[256];
    std::memset(err, 'X', sizeof(err));
    loom_json_t *v = reinterpret_cast<loom_json_t *>(0x1);
    int rc = loom_json_parse(exact.get(), text.size(), &v, err, sizeof(err));
    Result r{rc, Json(v), rc == 0 ? std::string() : std::string(err)};
    if (rc != 0)
        EXPECT_EQ(v, nullptr);
    else
        EXPECT_NE(v, nullptr);
    return r;
}

Json ok(const std::string &text)
{
    Result r = parse(text);
    EXPECT_EQ(r.rc, 0) << "input: " << text << "\nerror: " << r.err;
    return std::move(r.v);
}

std::string bad(const std::string &text)
{
    Result r = parse(text);
    EXPECT_EQ(r.rc, -1) << "accepted: " << text;
    EXPECT_EQ(r.err.rfind("line ", 0), 0u) << r.err;
    return r.err;
}

std::string str_of(const loom_json_t *v)
{
    EXPECT_EQ(v->type, LOOM_JSON_STRING);
    EXPECT_EQ(std::strlen(v->string), v->len);
    return std::string(v->string, v->len);
}

std::string nested(int depth, const char *open, const char *close)
{
    std::string s;
    for (int i = 0; i < depth; i++)
        s += open;
    for (int i = 0; i < depth; i++)
        s += close;
    return s;
}

std::string write_string(const char *s)
{
    char *out = nullptr;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    EXPECT_NE(f, nullptr);
    loom_json_write_string(f, s);
    EXPECT_EQ(ferror(f), 0);
    std::fclose(f);
    std::string r(out, n);
    std::free(out);
    return r;
}

// ---- valid documents

TEST(TopoJson, Scalars)
{
    Json v = ok("null");
    EXPECT_EQ(v->type, LOOM_JSON_NULL);
    v = ok(" true ");
    EXPECT_EQ(v->type, LOOM_JSON_BOOL);
    EXPECT_EQ(v->boolean, 1);
    v = ok("\t\r\nfalse\n");
    EXPECT_EQ(v->type, LOOM_JSON_BOOL);
    EXPECT_EQ(v->boolean, 0);
    v = ok("\"hello\"");
    EXPECT_EQ(str_of(v.get()), "hello");
    v = ok("\"\"");
    EXPECT_EQ(str_of(v.get()), "");
}

TEST(TopoJson, Numbers)
{
    struct {
        const char *text;
        double value;
    } cases[] = {
        {"0", 0.0},
        {"-0", -0.0},
        {"7", 7.0},
        {"-12", -12.0},
        {"1.5", 1.5},
        {"-0.25", -0.25},
        {"1e3", 1000.0},
        {"1E+2", 100.0},
        {"25e-2", 0.25},
        {"-1.25e3", -1250.0},
        {"123456789012", 123456789012.0},
        {"0.1", 0.1},
        {"1.7976931348623157e308", 1.7976931348623157e308},
        {"4.9e-324", 4.9e-324},
        {"1e-400", 0.0}, /* underflow rounds towards zero, as the header says */
        {"100000000000000000000000000000000000000000000000000", 1e50},
    };
    for (const auto &c : cases) {
        Json v = ok(c.text);
        ASSERT_EQ(v->type, LOOM_JSON_NUMBER) << c.text;
        EXPECT_EQ(v->number, c.value) << c.text;
        EXPECT_EQ(std::signbit(v->number), std::signbit(c.value)) << c.text;
    }
}

TEST(TopoJson, ArraysAndObjects)
{
    Json v = ok("[1, \"a\", null, true, [], {}]");
    ASSERT_EQ(v->type, LOOM_JSON_ARRAY);
    ASSERT_EQ(v->n, 6u);
    EXPECT_EQ(v->items[0].number, 1.0);
    EXPECT_EQ(str_of(&v->items[1]), "a");
    EXPECT_EQ(v->items[2].type, LOOM_JSON_NULL);
    EXPECT_EQ(v->items[3].boolean, 1);
    EXPECT_EQ(v->items[4].type, LOOM_JSON_ARRAY);
    EXPECT_EQ(v->items[4].n, 0u);
    EXPECT_EQ(v->items[5].type, LOOM_JSON_OBJECT);
    EXPECT_EQ(v->items[5].n, 0u);

    v = ok("{\"z\": 1, \"a\": 2, \"\": 3, \"m\": {\"k\": [false]}}");
    ASSERT_EQ(v->type, LOOM_JSON_OBJECT);
    ASSERT_EQ(v->n, 4u);
    const char *order[] = {"z", "a", "", "m"};
    for (size_t i = 0; i < 4; i++)
        EXPECT_STREQ(v->keys[i], order[i]);
    EXPECT_EQ(loom_json_get(v.get(), "a")->number, 2.0);
    EXPECT_EQ(loom_json_get(v.get(), "")->number, 3.0);
    EXPECT_EQ(loom_json_get(v.get(), "nope"), nullptr);
    EXPECT_EQ(loom_json_get(&v->items[0], "z"), nullptr); /* not an object */
    EXPECT_EQ(loom_json_get(nullptr, "z"), nullptr);
    const loom_json_t *k = loom_json_get(loom_json_get(v.get(), "m"), "k");
    ASSERT_NE(k, nullptr);
    ASSERT_EQ(k->n, 1u);
    EXPECT_EQ(k->items[0].type, LOOM_JSON_BOOL);
    EXPECT_EQ(k->items[0].boolean, 0);
}

TEST(TopoJson, NestedTopology)
{
    Json v = ok(R"({
  "version": 1,
  "hosts": [
    {"name": "node0", "gpus": 8, "nics": [{"name": "mlx5_0", "speed_mbps": 400000}]},
    {"name": "node1", "gpus": 4, "nics": [{"name": "eth0", "speed_mbps": 100000},
                                          {"name": "eth1", "speed_mbps": 25000.0}]}
  ]
})");
    const loom_json_t *hosts = loom_json_get(v.get(), "hosts");
    ASSERT_NE(hosts, nullptr);
    ASSERT_EQ(hosts->type, LOOM_JSON_ARRAY);
    ASSERT_EQ(hosts->n, 2u);
    const char *name;
    long long gpus, speed;
    char err[200];
    ASSERT_EQ(loom_json_get_str(&hosts->items[1], "name", &name, "hosts[1].name", err, sizeof(err)),
              0);
    EXPECT_STREQ(name, "node1");
    ASSERT_EQ(loom_json_get_int(&hosts->items[0], "gpus", 1, 64, &gpus, "hosts[0].gpus", err,
                                sizeof(err)),
              0);
    EXPECT_EQ(gpus, 8);
    const loom_json_t *nics = loom_json_get(&hosts->items[1], "nics");
    ASSERT_EQ(nics->n, 2u);
    ASSERT_EQ(loom_json_get_int(&nics->items[1], "speed_mbps", 1, 1000000, &speed,
                                "hosts[1].nics[1].speed_mbps", err, sizeof(err)),
              0)
        << err;
    EXPECT_EQ(speed, 25000);
}

TEST(TopoJson, LargeArrayAndObject)
{
    std::string arr = "[";
    std::string obj = "{";
    for (int i = 0; i < 5000; i++) {
        arr += (i ? "," : "") + std::to_string(i);
        obj += std::string(i ? "," : "") + "\"k" + std::to_string(i) + "\":" + std::to_string(i);
    }
    Json a = ok(arr + "]");
    ASSERT_EQ(a->n, 5000u);
    EXPECT_EQ(a->items[4999].number, 4999.0);
    Json o = ok(obj + "}");
    ASSERT_EQ(o->n, 5000u);
    EXPECT_STREQ(o->keys[1234], "k1234");
    EXPECT_EQ(loom_json_get(o.get(), "k4321")->number, 4321.0);
    /* the duplicate is found at the end of a big object too (the key set has grown) */
    std::string err = bad(obj + ",\"k17\":0}");
    EXPECT_NE(err.find("duplicate key \"k17\""), std::string::npos) << err;
}

// ---- strings

TEST(TopoJson, Escapes)
{
    Json v = ok(R"("q\" b\\ s\/ \b\f\n\r\t")");
    EXPECT_EQ(str_of(v.get()), "q\" b\\ s/ \b\f\n\r\t");
    v = ok(R"("\u0041\u00e9\u00E9\u20AC\u0001\u007f")");
    EXPECT_EQ(str_of(v.get()), "A\xC3\xA9\xC3\xA9\xE2\x82\xAC\x01\x7F");
}

TEST(TopoJson, SurrogatePairs)
{
    Json v = ok(R"("\uD83D\uDE00")"); /* U+1F600 */
    EXPECT_EQ(str_of(v.get()), "\xF0\x9F\x98\x80");
    v = ok(R"("\ud800\udc00|\uDBFF\uDFFF")"); /* U+10000 and U+10FFFF */
    EXPECT_EQ(str_of(v.get()), "\xF0\x90\x80\x80|\xF4\x8F\xBF\xBF");
    v = ok("\"h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80\""); /* raw UTF-8 passes as is */
    EXPECT_EQ(str_of(v.get()), "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80");
    v = ok("{\"a\\u0062\": 1}");
    EXPECT_STREQ(v->keys[0], "ab");
}

// ---- rejections

TEST(TopoJson, ErrorPositions)
{
    EXPECT_EQ(bad(""), "line 1, column 1: expected a value, found the end of the input");
    EXPECT_EQ(bad("   \n  "), "line 2, column 3: expected a value, found the end of the input");
    EXPECT_EQ(bad("[1,2,]"), "line 1, column 6: trailing comma before ']'");
    EXPECT_EQ(bad("{\"a\": 1,\n  \"a\": 2}"), "line 2, column 3: duplicate key \"a\"");
    EXPECT_EQ(bad("[1] x"), "line 1, column 5: unexpected 'x' after the value");
    /* columns count characters, not bytes: é is two bytes */
    EXPECT_EQ(bad("\"\xC3\xA9\" x"), "line 1, column 5: unexpected 'x' after the value");
    EXPECT_EQ(bad("{\n\t\"a\": 01\n}"), "line 2, column 7: number has a leading zero");
    EXPECT_EQ(bad("[\"a\nb\"]"),
              "line 1, column 4: control character U+000A in a string (escape it, e.g. \\n)");
    EXPECT_EQ(bad("\r\n\r\n  \"\\x\""), "line 3, column 4: invalid escape: '\\' followed by 'x'");
    EXPECT_EQ(bad("[1 2]"),
              "line 1, column 4: expected ',' or ']' after an array element, found '2'");
    EXPECT_EQ(bad("{\"a\" 1}"), "line 1, column 6: expected ':' after the key \"a\", found '1'");
    EXPECT_EQ(bad("[\"abc"), "line 1, column 2: string is not closed before the end of the input");
}

TEST(TopoJson, Rejections)
{
    struct {
        const char *text;
        const char *why;
    } cases[] = {
        {"{\"a\":1,\"b\":2,\"a\":3}", "duplicate key \"a\""},
        {"{\"ab\":1,\"a\\u0062\":2}", "duplicate key \"ab\""},
        {"{\"a\":1,}", "trailing comma before '}'"},
        {"1 2", "unexpected '2' after the value"},
        {"{} {}", "unexpected '{' after the value"},
        {"[1]]", "unexpected ']' after the value"},
        {"\"a\tb\"", "control character U+0009"},
        {"\"\x1f\"", "control character U+001F"},
        {"\"\\a\"", "invalid escape: '\\' followed by 'a'"},
        {"\"\\'\"", "invalid escape"},
        {"\"\\", "invalid escape: '\\' followed by the end of the input"},
        {"\"\\u12\"", "\\u must be followed by 4 hex digits"},
        {"\"\\u12G4\"", "\\u must be followed by 4 hex digits"},
        {"\"\\u0000\"", "\\u0000 is not allowed"},
        {"\"\\uD800\"", "lone high surrogate \\uD800"},
        {"\"\\uD800x\"", "lone high surrogate"},
        {"\"\\uD800\\u0041\"", "lone high surrogate"},
        {"\"\\uDBFF\\uDBFF\"", "lone high surrogate"},
        {"\"\\uDC00\"", "lone low surrogate \\uDC00"},
        {"\"\\uDFFF\\uD800\"", "lone low surrogate"},
        {"01", "leading zero"},
        {"-01", "leading zero"},
        {"00", "leading zero"},
        {"[0012]", "leading zero"},
        {"NaN", "NaN and Infinity are not JSON numbers"},
        {"Infinity", "NaN and Infinity"},
        {"-Infinity", "NaN and Infinity"},
        {"nan", "invalid literal: expected null"},
        {"1e400", "out of the range of a double"},
        {"-1e400", "out of the range of a double"},
        {"+1", "starts with '-' or a digit"},
        {".5", "starts with '-' or a digit"},
        {"1.", "expected a digit after the decimal point"},
        {"1.e5", "expected a digit after the decimal point"},
        {"1e", "expected a digit in the exponent"},
        {"1e+", "expected a digit in the exponent"},
        {"-", "expected a digit after '-'"},
        {"0x10", "unexpected 'x' after the value"},
        {"\"\xC3\"", "invalid UTF-8 (byte 0xC3)"},             /* truncated */
        {"\"\xC0\xAF\"", "invalid UTF-8 (byte 0xC0)"},         /* overlong '/' */
        {"\"\xE0\x80\xAF\"", "invalid UTF-8 (byte 0xE0)"},     /* overlong */
        {"\"\xED\xA0\x80\"", "invalid UTF-8 (byte 0xED)"},     /* encoded surrogate */
        {"\"\xF4\x90\x80\x80\"", "invalid UTF-8 (byte 0xF4)"}, /* above U+10FFFF */
        {"\"\xFF\"", "invalid UTF-8 (byte 0xFF)"},
        {"\"\x80\"", "invalid UTF-8 (byte 0x80)"},
        {"\xC3\xA9", "expected a value, found '\xC3\xA9'"},
        {"\xFF", "byte 0xFF, which is not UTF-8"},
        {"\xEF\xBB\xBF{}", "byte order mark"},
        {"[1,2", "expected ',' or ']' after an array element, found the end of the input"},
        {"{\"a\":1", "expected ',' or '}' after an object member, found the end"},
        {"{1:2}", "expected a string key, found '1'"},
        {"{'a':2}", "expected a string key, found '''"},
        {"'a'", "expected a value, found '''"},
        {"tru", "invalid literal: expected true"},
        {"fals", "invalid literal: expected false"},
        {"nul", "invalid literal: expected null"},
        {"True", "expected a value, found 'T'"},
        {"// c\n1", "expected a value, found '/'"},
        {"/* c */ 1", "expected a value, found '/'"},
        {"[1,,2]", "expected a value, found ','"},
        {"\x0c"
         "1",
         "control character U+000C"},
        {"[", "expected a value, found the end of the input"},
        {"{", "expected a string key, found the end of the input"},
    };
    for (const auto &c : cases) {
        std::string err = bad(c.text);
        EXPECT_NE(err.find(c.why), std::string::npos) << "input: " << c.text << "\nerror: " << err;
    }
}

TEST(TopoJson, DepthLimit)
{
    ok(nested(LOOM_JSON_MAX_DEPTH, "[", "]"));
    ok(nested(LOOM_JSON_MAX_DEPTH, "{\"a\":", "}").insert(5 * LOOM_JSON_MAX_DEPTH, "0"));
    /* arrays and objects alternating */
    std::string mixed;
    for (int i = 0; i < LOOM_JSON_MAX_DEPTH / 2; i++)
        mixed += "[{\"k\":";
    mixed += "1";
    for (int i = 0; i < LOOM_JSON_MAX_DEPTH / 2; i++)
        mixed += "}]";
    ok(mixed);
    std::string err = bad(nested(LOOM_JSON_MAX_DEPTH + 1, "[", "]"));
    EXPECT_EQ(err, "line 1, column 65: arrays and objects nested deeper than 64");
    err = bad(
        nested(LOOM_JSON_MAX_DEPTH + 1, "{\"a\":", "}").insert(5 * (LOOM_JSON_MAX_DEPTH + 1), "0"));
    EXPECT_NE(err.find("nested deeper than 64"), std::string::npos);
    /* far deeper than any stack would take if the limit were missing */
    err = bad(std::string(1000000, '['));
    EXPECT_NE(err.find("nested deeper than 64"), std::string::npos);
}

TEST(TopoJson, SizeLimitAndBounds)
{
    std::string big(LOOM_JSON_MAX_BYTES, ' ');
    big[0] = '1';
    Json v = ok(big);
    EXPECT_EQ(v->number, 1.0);
    big.push_back(' ');
    std::string err = bad(big);
    EXPECT_NE(err.find("more than the limit of 16777216"), std::string::npos) << err;

    /* nothing past len is read: the tail of the buffer is never looked at */
    const char text[] = {'[', '1', ',', '2', ']'};
    loom_json_t *out = nullptr;
    char msg[128];
    EXPECT_EQ(loom_json_parse(text, 3, &out, msg, sizeof(msg)), -1);
    EXPECT_STREQ(msg, "line 1, column 4: expected a value, found the end of the input");
    const char num[] = {'1', '2', '3'};
    ASSERT_EQ(loom_json_parse(num, 2, &out, msg, sizeof(msg)), 0);
    EXPECT_EQ(out->number, 12.0);
    loom_json_free(out);
}

TEST(TopoJson, ErrorBuffer)
{
    loom_json_t *out = nullptr;
    EXPECT_EQ(loom_json_parse("[", 1, &out, nullptr, 0), -1);
    EXPECT_EQ(out, nullptr);
    char tiny[8];
    EXPECT_EQ(loom_json_parse("[", 1, &out, tiny, sizeof(tiny)), -1);
    EXPECT_STREQ(tiny, "line 1,");
    EXPECT_EQ(loom_json_parse(nullptr, 0, &out, tiny, sizeof(tiny)), -1);
    loom_json_free(nullptr);
}

TEST(TopoJson, LocaleIndependentNumbers)
{
    const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "de_DE", "fr_FR"};
    const char *old = std::setlocale(LC_NUMERIC, nullptr);
    std::string saved = old ? old : "C";
    bool set = false;
    for (const char *n : names)
        if (std::setlocale(LC_NUMERIC, n) != nullptr) {
            set = true;
            break;
        }
    if (!set)
        GTEST_SKIP() << "no locale with a ',' decimal point is installed";
    Json v = ok("[1.5, -2.25e1]");
    std::setlocale(LC_NUMERIC, saved.c_str());
    EXPECT_EQ(v->items[0].number, 1.5);
    EXPECT_EQ(v->items[1].number, -22.5);
}

// ---- typed getters

Json getters_doc()
{
    return ok(R"({"i": 42, "neg": -5, "f": 1.5, "exp": 1e3, "s": "text", "b": true,
                  "arr": [1], "nul": null, "max53": 9007199254740992,
                  "over53": 9007199254740994, "min53": -9007199254740992})");
}

TEST(TopoJson, GetIntOk)
{
    Json doc = getters_doc();
    ASSERT_NE(doc, nullptr);
    char err[256] = "";
    long long v = 0;
    ASSERT_EQ(loom_json_get_int(doc.get(), "i", 0, 100, &v, "x.i", err, sizeof(err)), 0);
    EXPECT_EQ(v, 42);
    ASSERT_EQ(loom_json_get_int(doc.get(), "neg", -5, -5, &v, "x.neg", err, sizeof(err)), 0);
    EXPECT_EQ(v, -5);
    ASSERT_EQ(loom_json_get_int(doc.get(), "exp", 0, 1000, &v, "x.exp", err, sizeof(err)), 0);
    EXPECT_EQ(v, 1000);
    ASSERT_EQ(
        loom_json_get_int(doc.get(), "max53", LLONG_MIN, LLONG_MAX, &v, "m", err, sizeof(err)), 0);
    EXPECT_EQ(v, 9007199254740992LL);
    ASSERT_EQ(
        loom_json_get_int(doc.get(), "min53", LLONG_MIN, LLONG_MAX, &v, "m", err, sizeof(err)), 0);
    EXPECT_EQ(v, -9007199254740992LL);
}

TEST(TopoJson, GetIntErrors)
{
    Json doc = getters_doc();
    ASSERT_NE(doc, nullptr);
    char err[256] = "";
    long long v = 7;
    EXPECT_EQ(loom_json_get_int(doc.get(), "i", 0, 10, &v, "hosts[1].gpus", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "hosts[1].gpus: expected an integer in [0, 10], found 42");
    EXPECT_EQ(loom_json_get_int(doc.get(), "neg", 0, 10, &v, "a.neg", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "a.neg: expected an integer in [0, 10], found -5");
    EXPECT_EQ(loom_json_get_int(doc.get(), "f", 0, 10, &v, "a.f", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "a.f: expected an integer in [0, 10], found 1.5, which is not an integer");
    EXPECT_EQ(loom_json_get_int(doc.get(), "s", 0, 10, &v, "a.s", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "a.s: expected an integer in [0, 10], found a string");
    EXPECT_EQ(loom_json_get_int(doc.get(), "b", 0, 10, &v, "a.b", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "a.b: expected an integer in [0, 10], found a boolean");
    EXPECT_EQ(loom_json_get_int(doc.get(), "nul", 0, 10, &v, "a.nul", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "a.nul: expected an integer in [0, 10], found null");
    EXPECT_EQ(loom_json_get_int(doc.get(), "nics", 0, 10, &v, "hosts[0].nics", err, sizeof(err)),
              -1);
    EXPECT_STREQ(err, "hosts[0].nics: expected an integer in [0, 10], but it is missing");
    EXPECT_EQ(loom_json_get_int(loom_json_get(doc.get(), "arr"), "x", 0, 10, &v, "arr.x", err,
                                sizeof(err)),
              -1);
    EXPECT_STREQ(err, "arr.x: expected an integer in [0, 10], but its parent is an array, not an "
                      "object");
    EXPECT_EQ(
        loom_json_get_int(doc.get(), "over53", LLONG_MIN, LLONG_MAX, &v, "big", err, sizeof(err)),
        -1);
    EXPECT_NE(std::string(err).find("big: expected an integer"), std::string::npos) << err;
    EXPECT_NE(std::string(err).find("beyond 2^53"), std::string::npos) << err;
    EXPECT_EQ(v, 7); /* untouched on failure */
    /* no err buffer is fine */
    EXPECT_EQ(loom_json_get_int(doc.get(), "s", 0, 10, &v, "a.s", nullptr, 0), -1);
}

TEST(TopoJson, GetNum)
{
    Json doc = getters_doc();
    ASSERT_NE(doc, nullptr);
    char err[256] = "";
    double d = -1;
    ASSERT_EQ(loom_json_get_num(doc.get(), "f", 0, 2, &d, "a.f", err, sizeof(err)), 0);
    EXPECT_EQ(d, 1.5);
    ASSERT_EQ(loom_json_get_num(doc.get(), "i", 42, 42, &d, "a.i", err, sizeof(err)), 0);
    EXPECT_EQ(d, 42.0);
    d = -1;
    EXPECT_EQ(loom_json_get_num(doc.get(), "f", 0, 0.1, &d, "link.latency_us", err, sizeof(err)),
              -1);
    EXPECT_STREQ(err, "link.latency_us: expected a number in [0, 0.1], found 1.5");
    EXPECT_EQ(loom_json_get_num(doc.get(), "s", 0, 1, &d, "a.s", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "a.s: expected a number in [0, 1], found a string");
    EXPECT_EQ(loom_json_get_num(doc.get(), "gone", 0, 1, &d, "a.gone", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "a.gone: expected a number in [0, 1], but it is missing");
    EXPECT_EQ(loom_json_get_num(nullptr, "x", 0, 1, &d, "top.x", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "top.x: expected a number in [0, 1], but its parent is missing, not an "
                      "object");
    EXPECT_EQ(d, -1);
}

TEST(TopoJson, GetStr)
{
    Json doc = getters_doc();
    ASSERT_NE(doc, nullptr);
    char err[256] = "";
    const char *s = nullptr;
    ASSERT_EQ(loom_json_get_str(doc.get(), "s", &s, "a.s", err, sizeof(err)), 0);
    EXPECT_STREQ(s, "text");
    s = nullptr;
    EXPECT_EQ(loom_json_get_str(doc.get(), "i", &s, "hosts[2].name", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "hosts[2].name: expected a string, found a number");
    EXPECT_EQ(loom_json_get_str(doc.get(), "arr", &s, "a.arr", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "a.arr: expected a string, found an array");
    EXPECT_EQ(loom_json_get_str(doc.get(), "name", &s, "hosts[2].name", err, sizeof(err)), -1);
    EXPECT_STREQ(err, "hosts[2].name: expected a string, but it is missing");
    EXPECT_EQ(s, nullptr);
}

// ---- writing

TEST(TopoJson, WriteStringExact)
{
    EXPECT_EQ(write_string("plain"), "\"plain\"");
    EXPECT_EQ(write_string(""), "\"\"");
    EXPECT_EQ(write_string("a\"b\\c/d\n\t\r\b\f"), "\"a\\\"b\\\\c/d\\n\\t\\r\\b\\f\"");
    EXPECT_EQ(write_string("\x01\x1f\x7f"), "\"\\u0001\\u001F\x7f\"");
    EXPECT_EQ(write_string("\xC3\xA9\xF0\x9F\x98\x80"), "\"\xC3\xA9\xF0\x9F\x98\x80\"");
    EXPECT_EQ(write_string("a\xFF"
                           "b\xC3"),
              "\"a\\ufffdb\\ufffd\"");
    EXPECT_EQ(write_string(nullptr), "null");
}

TEST(TopoJson, WriteStringRoundTrip)
{
    std::string all_controls;
    for (int c = 1; c < 0x20; c++)
        all_controls += static_cast<char>(c);
    const std::string cases[] = {
        "",
        "say \"hi\"",
        "C:\\path\\to\\file",
        "\\\"\\\"",
        all_controls,
        "tab\there\nnewline\r\n",
        "\x7f del",
        "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF",
        "mixed \"\\\x01\xC3\xA9\"",
        "</script>",
    };
    for (const std::string &s : cases) {
        std::string lit = write_string(s.c_str());
        Json v = ok(lit);
        ASSERT_NE(v, nullptr) << lit;
        EXPECT_EQ(str_of(v.get()), s) << lit;
        /* and as a key */
        Json o = ok("{" + lit + ": 0}");
        ASSERT_NE(o, nullptr);
        EXPECT_EQ(std::string(o->keys[0]), s);
    }
    /* bytes that are not UTF-8 come back as U+FFFD */
    Json v = ok(write_string("x\xC0\xAFy"));
    EXPECT_EQ(str_of(v.get()), "x\xEF\xBF\xBD\xEF\xBF\xBDy");
}

} // namespace
