/* SPDX-License-Identifier: Apache-2.0
 *
 * test_moe_trace.cc - unit tests of LMTR v1 routing traces (src/moe/moe_trace.h): the bytes of
 * a small file pinned by hand (endianness, layout, CRC); write and read back bitwise, across a
 * reopen and for an empty trace; and refusals with loomInvalidArgument and a message for every
 * kind of bad input: the file cut at every byte, bad magic, version, header fields, CRC,
 * payload sizes, counts that overflow 32 bits, ids out of range or repeated, non-finite weights
 * and text classes out of range, with the CRC made right so each check is reached.
 */
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

extern "C" {
#include "debug.h"
#include "dtype.h"
#include "moe_gen.h"
#include "moe_trace.h"
}

namespace {

using Bytes = std::vector<uint8_t>;

class TempDir {
  public:
    TempDir()
    {
        char tmpl[] = "/tmp/loom-moe-trace.XXXXXX";
        path_ = mkdtemp(tmpl) ? tmpl : "";
    }
    ~TempDir()
    {
        std::string cmd = "rm -rf '" + path_ + "'";
        if (!path_.empty() && std::system(cmd.c_str()) != 0)
            std::fprintf(stderr, "cannot remove %s\n", path_.c_str());
    }
    std::string File(const char *name) const
    {
        return path_ + "/" + name;
    }

  private:
    std::string path_;
};

Bytes ReadFile(const std::string &path)
{
    std::ifstream f(path, std::ios::binary);
    return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string &path, const Bytes &b)
{
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char *>(b.data()), static_cast<std::streamsize>(b.size()));
}

loom_moe_trace_header_t Header(uint32_t e, uint32_t k, uint32_t flags, const char *name = "t")
{
    loom_moe_trace_header_t h{};
    h.num_experts = e;
    h.top_k = k;
    h.flags = flags;
    h.nranks = 4;
    h.rank = 2;
    std::snprintf(h.name, sizeof(h.name), "%s", name);
    return h;
}

// A batch with its own storage, filled by the uniform generator.
struct Batch {
    std::vector<int32_t> topk;
    std::vector<float> weight;
    std::vector<uint32_t> token_id;
    std::vector<uint8_t> text_class;
    loom_moe_trace_batch_t b{};

    Batch(const loom_moe_trace_header_t &h, uint32_t step, uint32_t layer, uint32_t t,
          uint64_t seed)
        : topk(size_t{t} * h.top_k), weight(topk.size()), token_id(t), text_class(t)
    {
        EXPECT_EQ(loom_moe_gen_uniform(h.num_experts, h.top_k, t, seed, topk.data(), weight.data()),
                  loomSuccess);
        for (uint32_t i = 0; i < t; i++) {
            token_id[i] = 1000u * seed + i;
            text_class[i] = static_cast<uint8_t>((i * 5 + seed) % LOOM_MOE_TRACE_TEXT_CLASSES);
        }
        if (t > 1)
            topk[h.top_k] = -1; // a masked selection in token 1
        b.step = step;
        b.layer = layer;
        b.num_tokens = t;
        b.topk = topk.data();
        b.weight = weight.data();
        b.token_id = token_id.data();
        b.text_class = text_class.data();
    }
};

Bytes Encode(const loom_moe_trace_header_t &h, const std::vector<const Batch *> &batches)
{
    Bytes out(LOOM_MOE_TRACE_HEADER_BYTES);
    EXPECT_EQ(loom_moe_trace_header_encode(&h, out.data()), loomSuccess);
    for (const Batch *b : batches) {
        size_t at = out.size(), n = loom_moe_trace_record_nbytes(&h, b->b.num_tokens);
        out.resize(at + n);
        EXPECT_EQ(loom_moe_trace_batch_encode(&h, &b->b, out.data() + at, n), loomSuccess);
    }
    return out;
}

// Expects the decoded batch to equal what was written: ids exactly, weights as fp16 rounds them.
void ExpectSame(const loom_moe_trace_header_t &h, const loom_moe_trace_batch_t &got,
                const Batch &want)
{
    ASSERT_EQ(got.num_tokens, want.b.num_tokens);
    EXPECT_EQ(got.step, want.b.step);
    EXPECT_EQ(got.layer, want.b.layer);
    size_t slots = size_t{got.num_tokens} * h.top_k;
    for (size_t s = 0; s < slots; s++) {
        ASSERT_EQ(got.topk[s], want.topk[s]) << "slot " << s;
        if (h.flags & LOOM_MOE_TRACE_WEIGHTS) {
            float r = loom_f16_decode(loom_f16_encode(want.weight[s]));
            ASSERT_EQ(std::memcmp(&got.weight[s], &r, 4), 0) << "weight " << s;
        }
    }
    EXPECT_EQ((h.flags & LOOM_MOE_TRACE_WEIGHTS) != 0, got.weight != nullptr);
    EXPECT_EQ((h.flags & LOOM_MOE_TRACE_TOKEN_IDS) != 0, got.token_id != nullptr);
    EXPECT_EQ((h.flags & LOOM_MOE_TRACE_TEXT_CLASS) != 0, got.text_class != nullptr);
    for (uint32_t t = 0; t < got.num_tokens; t++) {
        if (got.token_id) {
            EXPECT_EQ(got.token_id[t], want.token_id[t]);
        }
        if (got.text_class) {
            EXPECT_EQ(got.text_class[t], want.text_class[t]);
        }
    }
}

// Decoding must fail with loomInvalidArgument and leave a message.
void ExpectRefused(const Bytes &b, const char *what, const char *needle = nullptr)
{
    loom_clear_last_error();
    loom_moe_trace_t *tr = nullptr;
    EXPECT_EQ(loom_moe_trace_decode(b.data(), b.size(), &tr), loomInvalidArgument) << what;
    EXPECT_EQ(tr, nullptr) << what;
    std::string msg = loom_last_error();
    EXPECT_FALSE(msg.empty()) << what;
    if (needle) {
        EXPECT_NE(msg.find(needle), std::string::npos) << what << ": " << msg;
    }
    loom_moe_trace_free(tr);
}

void PutU32(Bytes &b, size_t at, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// Recomputes the CRC of the record at `at` of `n` bytes (its CRC included).
void Reseal(Bytes &b, size_t at, size_t n)
{
    PutU32(b, at + n - 4, loom_moe_trace_crc32(b.data() + at, n - 4));
}

TEST(MoeTrace, Crc32IsZlibs)
{
    EXPECT_EQ(loom_moe_trace_crc32("123456789", 9), 0xcbf43926u);
    EXPECT_EQ(loom_moe_trace_crc32("", 0), 0u);
}

// The layout byte by byte, as docs/moe-trace.md gives it: little-endian whatever the host.
TEST(MoeTrace, BytesOfASmallFile)
{
    loom_moe_trace_header_t h =
        Header(300, 2, LOOM_MOE_TRACE_WEIGHTS | LOOM_MOE_TRACE_TOKEN_IDS, "ab");
    int32_t topk[2] = {258, -1};
    float w[2] = {1.0f, 0.5f};
    uint32_t id = 0x01020304u;
    loom_moe_trace_batch_t b{};
    b.step = 7;
    b.layer = 0x0a0b;
    b.num_tokens = 1;
    b.topk = topk;
    b.weight = w;
    b.token_id = &id;
    Bytes want = {'L', 'M', 'T', 'R', 1, 0, 0, 0, 64, 0, 0, 0, 0x2c, 1,   0,
                  0,   2,   0,   3,   0, 4, 0, 0, 0,  2, 0, 0, 0,    'a', 'b'};
    want.resize(64, 0);
    Bytes rec = {'L',  'M',  'R',  'C',  7,
                 0,    0,    0,    0x0b, 0x0a,
                 0,    0,    1,    0,    0,
                 0,    12,   0,    0,    0,
                 2,    1,    0xff, 0xff, /* ids 258, -1 */ 0x00,
                 0x3c, 0x00, 0x38, /* 1.0, 0.5 */
                 4,    3,    2,    1};
    rec.resize(rec.size() + 4);
    Reseal(rec, 0, rec.size());
    want.insert(want.end(), rec.begin(), rec.end());
    Bytes got(64 + loom_moe_trace_record_nbytes(&h, 1));
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(loom_moe_trace_header_encode(&h, got.data()), loomSuccess);
    ASSERT_EQ(loom_moe_trace_batch_encode(&h, &b, got.data() + 64, got.size() - 64), loomSuccess);
    EXPECT_EQ(got, want);
}

TEST(MoeTrace, RoundTripSeveralBatches)
{
    TempDir dir;
    std::string path = dir.File("a.lmtr");
    for (uint32_t flags :
         {0u, unsigned{LOOM_MOE_TRACE_WEIGHTS}, unsigned{LOOM_MOE_TRACE_FLAGS_ALL}}) {
        SCOPED_TRACE(flags);
        loom_moe_trace_header_t h = Header(64, 6, flags, "round trip");
        Batch b0(h, 0, 0, 37, 1), b1(h, 0, 1, 0, 2), b2(h, 50, 3, 129, 3);
        std::remove(path.c_str());
        loom_moe_trace_writer_t *w = nullptr;
        ASSERT_EQ(loom_moe_trace_writer_open(path.c_str(), &h, &w), loomSuccess);
        for (const Batch *b : {&b0, &b1, &b2})
            ASSERT_EQ(loom_moe_trace_writer_append(w, &b->b), loomSuccess);
        ASSERT_EQ(loom_moe_trace_writer_close(w), loomSuccess);

        Bytes file = ReadFile(path);
        EXPECT_EQ(file, Encode(h, {&b0, &b1, &b2}));
        loom_moe_trace_t *tr = nullptr;
        ASSERT_EQ(loom_moe_trace_read(path.c_str(), &tr), loomSuccess);
        EXPECT_EQ(std::memcmp(&tr->header, &h, sizeof(h)), 0);
        ASSERT_EQ(tr->num_batches, 3u);
        ExpectSame(h, tr->batches[0], b0);
        ExpectSame(h, tr->batches[1], b1);
        ExpectSame(h, tr->batches[2], b2);
        loom_moe_trace_free(tr);
    }
}

TEST(MoeTrace, AppendAfterReopen)
{
    TempDir dir;
    std::string path = dir.File("b.lmtr");
    loom_moe_trace_header_t h = Header(16, 2, LOOM_MOE_TRACE_FLAGS_ALL);
    Batch b0(h, 1, 0, 5, 4), b1(h, 1, 1, 6, 5), b2(h, 2, 0, 7, 6);
    loom_moe_trace_writer_t *w = nullptr;
    ASSERT_EQ(loom_moe_trace_writer_open(path.c_str(), &h, &w), loomSuccess);
    ASSERT_EQ(loom_moe_trace_writer_append(w, &b0.b), loomSuccess);
    ASSERT_EQ(loom_moe_trace_writer_append(w, &b1.b), loomSuccess);
    ASSERT_EQ(loom_moe_trace_writer_close(w), loomSuccess);
    ASSERT_EQ(loom_moe_trace_writer_open(path.c_str(), &h, &w), loomSuccess);
    ASSERT_EQ(loom_moe_trace_writer_append(w, &b2.b), loomSuccess);
    ASSERT_EQ(loom_moe_trace_writer_close(w), loomSuccess);
    EXPECT_EQ(ReadFile(path), Encode(h, {&b0, &b1, &b2}));
}

TEST(MoeTrace, ReopenRefusesAnotherHeaderOrABadFile)
{
    TempDir dir;
    std::string path = dir.File("c.lmtr");
    loom_moe_trace_header_t h = Header(16, 2, 0);
    Batch b0(h, 1, 0, 5, 4);
    loom_moe_trace_writer_t *w = nullptr;
    ASSERT_EQ(loom_moe_trace_writer_open(path.c_str(), &h, &w), loomSuccess);
    ASSERT_EQ(loom_moe_trace_writer_append(w, &b0.b), loomSuccess);
    ASSERT_EQ(loom_moe_trace_writer_close(w), loomSuccess);
    const Bytes before = ReadFile(path);

    loom_moe_trace_header_t other[4] = {h, h, h, h};
    other[0].top_k = 3;
    other[1].flags = LOOM_MOE_TRACE_WEIGHTS;
    other[2].rank = 1;
    std::snprintf(other[3].name, sizeof(other[3].name), "u");
    for (const auto &o : other) {
        loom_clear_last_error();
        w = nullptr;
        EXPECT_EQ(loom_moe_trace_writer_open(path.c_str(), &o, &w), loomInvalidArgument);
        EXPECT_EQ(w, nullptr);
        EXPECT_NE(std::string(loom_last_error()).find("cannot append"), std::string::npos);
        EXPECT_EQ(ReadFile(path), before);
    }
    // A file cut inside its record is not appended to either.
    Bytes cut(before.begin(), before.end() - 1);
    WriteFile(path, cut);
    EXPECT_EQ(loom_moe_trace_writer_open(path.c_str(), &h, &w), loomInvalidArgument);
    EXPECT_EQ(ReadFile(path), cut);
}

TEST(MoeTrace, AppendRefusesABadBatchAndLeavesTheFile)
{
    TempDir dir;
    std::string path = dir.File("d.lmtr");
    loom_moe_trace_header_t h = Header(16, 2, LOOM_MOE_TRACE_WEIGHTS);
    Batch good(h, 0, 0, 4, 1), bad(h, 0, 1, 4, 2);
    loom_moe_trace_writer_t *w = nullptr;
    ASSERT_EQ(loom_moe_trace_writer_open(path.c_str(), &h, &w), loomSuccess);
    ASSERT_EQ(loom_moe_trace_writer_append(w, &good.b), loomSuccess);
    const int32_t keep = bad.topk[5];
    bad.topk[5] = 16;
    EXPECT_EQ(loom_moe_trace_writer_append(w, &bad.b), loomInvalidArgument);
    bad.topk[5] = bad.topk[4];
    EXPECT_EQ(loom_moe_trace_writer_append(w, &bad.b), loomInvalidArgument);
    bad.topk[5] = keep;
    bad.weight[0] = 70000.0f; // infinite in fp16
    EXPECT_EQ(loom_moe_trace_writer_append(w, &bad.b), loomInvalidArgument);
    bad.b.weight = nullptr;
    EXPECT_EQ(loom_moe_trace_writer_append(w, &bad.b), loomInvalidArgument);
    bad.b.weight = bad.weight.data();
    bad.weight[0] = 0.5f;
    EXPECT_EQ(loom_moe_trace_writer_append(w, &bad.b), loomSuccess) << "the edits were the faults";
    ASSERT_EQ(loom_moe_trace_writer_close(w), loomSuccess);
    EXPECT_EQ(ReadFile(path), Encode(h, {&good, &bad}));
}

TEST(MoeTrace, EmptyTrace)
{
    TempDir dir;
    std::string path = dir.File("e.lmtr");
    loom_moe_trace_header_t h = Header(8, 8, LOOM_MOE_TRACE_TEXT_CLASS, "");
    loom_moe_trace_writer_t *w = nullptr;
    ASSERT_EQ(loom_moe_trace_writer_open(path.c_str(), &h, &w), loomSuccess);
    ASSERT_EQ(loom_moe_trace_writer_close(w), loomSuccess);
    EXPECT_EQ(ReadFile(path).size(), size_t{LOOM_MOE_TRACE_HEADER_BYTES});
    loom_moe_trace_t *tr = nullptr;
    ASSERT_EQ(loom_moe_trace_read(path.c_str(), &tr), loomSuccess);
    EXPECT_EQ(tr->num_batches, 0u);
    EXPECT_EQ(std::memcmp(&tr->header, &h, sizeof(h)), 0);
    loom_moe_trace_free(tr);
}

TEST(MoeTrace, MissingFileIsASystemError)
{
    loom_moe_trace_t *tr = nullptr;
    EXPECT_EQ(loom_moe_trace_read("/nonexistent/loom.lmtr", &tr), loomSystemError);
    EXPECT_EQ(tr, nullptr);
}

// Cut at every byte: whole records only are a valid shorter trace, anything else is refused.
TEST(MoeTrace, TruncatedAtEveryByte)
{
    loom_moe_trace_header_t h = Header(10, 3, LOOM_MOE_TRACE_FLAGS_ALL);
    Batch b0(h, 0, 0, 3, 1), b1(h, 0, 1, 2, 2);
    Bytes full = Encode(h, {&b0, &b1});
    const size_t r0 = 64 + loom_moe_trace_record_nbytes(&h, 3);
    for (size_t n = 0; n < full.size(); n++) {
        Bytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
        if (n == 64 || n == r0) {
            loom_moe_trace_t *tr = nullptr;
            ASSERT_EQ(loom_moe_trace_decode(cut.data(), cut.size(), &tr), loomSuccess) << n;
            EXPECT_EQ(tr->num_batches, n == 64 ? 0u : 1u);
            loom_moe_trace_free(tr);
        } else {
            ExpectRefused(cut, ("cut at byte " + std::to_string(n)).c_str());
        }
    }
}

TEST(MoeTrace, BadHeadersRefused)
{
    loom_moe_trace_header_t h = Header(10, 3, LOOM_MOE_TRACE_WEIGHTS);
    Batch b0(h, 0, 0, 3, 1);
    const Bytes good = Encode(h, {&b0});
    struct Case {
        const char *what;
        size_t at;
        uint32_t value;
        int width;
        const char *needle;
    } cases[] = {
        {"magic", 0, 'X', 1, "not an LMTR trace"},
        {"version 2", 4, 2, 4, "version 2"},
        {"version 0", 4, 0, 4, "version 0"},
        {"header bytes", 8, 128, 4, "128-byte header"},
        {"no experts", 12, 0, 4, "0 experts"},
        {"too many experts", 12, 32768, 4, "32768 experts"},
        {"k zero", 16, 0, 2, "top-k 0"},
        {"k above E", 16, 11, 2, "top-k 11"},
        {"unknown flag", 18, 9, 2, "flags 0x9"},
        {"no ranks", 20, 0, 4, "rank 2 of 0"},
        {"rank past nranks", 24, 4, 4, "rank 4 of 4"},
        {"byte after the name", 40, 1, 1, "header byte 40"},
        {"padding", 61, 7, 1, "header byte 61"},
    };
    for (const Case &c : cases) {
        Bytes b = good;
        for (int i = 0; i < c.width; i++)
            b[c.at + i] = static_cast<uint8_t>(c.value >> (8 * i));
        ExpectRefused(b, c.what, c.needle);
    }
    // A name of 32 bytes fills its field with no terminator: allowed, and read back whole.
    Bytes b = good;
    std::memset(b.data() + 28, 'n', 32);
    loom_moe_trace_t *tr = nullptr;
    ASSERT_EQ(loom_moe_trace_decode(b.data(), b.size(), &tr), loomSuccess);
    EXPECT_EQ(std::string(tr->header.name), std::string(32, 'n'));
    loom_moe_trace_free(tr);
}

TEST(MoeTrace, BadRecordsRefused)
{
    loom_moe_trace_header_t h = Header(10, 3, LOOM_MOE_TRACE_FLAGS_ALL);
    Batch b0(h, 0, 0, 3, 1), b1(h, 0, 1, 2, 2);
    const Bytes good = Encode(h, {&b0, &b1});
    const size_t r1 = 64 + loom_moe_trace_record_nbytes(&h, 3); // the second record
    const size_t n1 = loom_moe_trace_record_nbytes(&h, 2);
    const size_t ids = r1 + 20, weights = ids + 2 * 6, tokens = weights + 2 * 6,
                 classes = tokens + 4 * 2;
    auto refused = [&](const char *what, const char *needle, auto &&edit, bool reseal = true) {
        Bytes b = good;
        edit(b);
        if (reseal)
            Reseal(b, r1, n1);
        ExpectRefused(b, what, needle);
    };
    refused("record magic", "no record magic at byte", [&](Bytes &b) { b[r1 + 3] = 'X'; });
    refused(
        "crc", "CRC-32", [&](Bytes &b) { b[ids] ^= 1; }, false);
    refused(
        "crc itself", "CRC-32", [&](Bytes &b) { b[r1 + n1 - 1] ^= 0x80; }, false);
    refused("payload too small", "need 34 bytes, the record says 33",
            [&](Bytes &b) { PutU32(b, r1 + 16, 33); });
    refused("more tokens than bytes", "cut short", [&](Bytes &b) {
        PutU32(b, r1 + 12, 3);
        PutU32(b, r1 + 16, 51);
    });
    // 2^31 tokens x k 2 x 2 bytes wraps to 0 in 32 bits; so do the other arrays' sizes.
    loom_moe_trace_header_t h2 = Header(10, 2, 0);
    Bytes wrap = Encode(h2, {});
    Bytes rec = {'L', 'M', 'R', 'C', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0};
    Reseal(rec, 0, rec.size());
    wrap.insert(wrap.end(), rec.begin(), rec.end());
    ExpectRefused(wrap, "count overflow", "2147483648 tokens");
    refused("id past E", "expert id 10", [&](Bytes &b) { b[ids + 2] = 10; });
    refused("id below -1", "expert id -2", [&](Bytes &b) {
        b[ids + 2] = 0xfe;
        b[ids + 3] = 0xff;
    });
    refused("id -32768", "expert id -32768", [&](Bytes &b) {
        b[ids + 2] = 0x00;
        b[ids + 3] = 0x80;
    });
    refused("repeated id", "twice", [&](Bytes &b) {
        b[ids + 2] = b[ids];
        b[ids + 3] = b[ids + 1];
    });
    refused("NaN weight", "not finite", [&](Bytes &b) {
        b[weights + 4] = 0x01;
        b[weights + 5] = 0x7e;
    });
    refused("infinite weight", "not finite", [&](Bytes &b) {
        b[weights] = 0x00;
        b[weights + 1] = 0xfc;
    });
    refused("text class", "text class 14", [&](Bytes &b) { b[classes + 1] = 14; });
    // Bytes after the last record that are too few for one.
    Bytes tail = good;
    tail.push_back('L');
    ExpectRefused(tail, "trailing byte", "cut short");
    // And the untouched file reads: the edits above are what made the difference.
    loom_moe_trace_t *tr = nullptr;
    ASSERT_EQ(loom_moe_trace_decode(good.data(), good.size(), &tr), loomSuccess);
    ASSERT_EQ(tr->num_batches, 2u);
    ExpectSame(h, tr->batches[1], b1);
    loom_moe_trace_free(tr);
}

TEST(MoeTrace, EncoderRefusesBadHeaders)
{
    uint8_t out[LOOM_MOE_TRACE_HEADER_BYTES];
    loom_moe_trace_header_t bad[5] = {Header(0, 1, 0), Header(4, 5, 0), Header(40000, 1, 0),
                                      Header(4, 1, 8), Header(4, 1, 0)};
    bad[4].rank = 4;
    for (const auto &h : bad) {
        loom_clear_last_error();
        EXPECT_EQ(loom_moe_trace_header_encode(&h, out), loomInvalidArgument);
        EXPECT_STRNE(loom_last_error(), "");
    }
}

} // namespace
