// SPDX-License-Identifier: Apache-2.0
//
// test_security_wire.cc - the pure decoders and parsers that face untrusted bytes and text:
// bootstrap HELLO/REQ/REPLY and unique ids (bootstrap_wire.c), the data-frame header
// (stream.c), LOOM_SECRET, socket addresses and LOOM_SOCKET_IFNAME (socket.c), sizes
// (param.c). The fuzzers in fuzz/ run the same functions on random input; these are the
// boundary cases written down. Pure functions run in the gtest process; anything that logs runs
// in a forked child (tests/harness), so the parent never initialises the library.
#include <climits>
#include <cstring>
#include <string>

#include "mp_fixture.h"

extern "C" {
#include "bootstrap_wire.h"
#include "param.h"
#include "socket.h"
#include "wire.h"
}

namespace {

std::string Hello(uint32_t magic, int32_t rank, int32_t nranks)
{
    loom_bs_hello_t h = {magic, rank, nranks, 7};
    uint8_t b[LOOM_BS_HELLO_BYTES];
    loom_bs_hello_encode(&h, b);
    return std::string(reinterpret_cast<char *>(b), sizeof(b));
}

loomResult_t DecodeHello(const std::string &bytes, int known, const uint8_t *joined,
                         loom_bs_hello_t *h, std::string *why)
{
    char w[160] = "";
    loomResult_t res =
        loom_bs_hello_decode(bytes.data(), bytes.size(), known, joined, h, w, sizeof(w));
    *why = w;
    return res;
}

TEST(BootstrapWire, HelloRoundTripAndBounds)
{
    loom_bs_hello_t h;
    std::string why;
    ASSERT_EQ(DecodeHello(Hello(LOOM_BS_HELLO_MAGIC, 2, 3), 0, nullptr, &h, &why), loomSuccess);
    EXPECT_EQ(h.rank, 2);
    EXPECT_EQ(h.nranks, 3);
    EXPECT_EQ(h.pid, 7u);
    // Little-endian on the wire whatever the host: the magic's first byte is its low byte.
    EXPECT_EQ(static_cast<uint8_t>(Hello(LOOM_BS_HELLO_MAGIC, 0, 1)[0]), 0x45);

    uint8_t joined[3] = {1, 0, 0};
    struct Case {
        std::string bytes;
        int known;
        const char *reason;
    } bad[] = {
        {Hello(LOOM_BS_HELLO_MAGIC, 0, 1).substr(0, 15), 0, "hello of 15 bytes"},
        {Hello(LOOM_BS_HELLO_MAGIC, 0, 1) + "x", 0, "hello of 17 bytes"},
        {"", 0, "hello of 0 bytes"},
        {Hello(0x45484d4cu, 0, 1), 0, "bad hello magic"},
        {Hello(LOOM_BS_HELLO_MAGIC, 0, 0), 0, "nranks 0 out of range"},
        {Hello(LOOM_BS_HELLO_MAGIC, 0, INT32_MIN), 0, "out of range"},
        {Hello(LOOM_BS_HELLO_MAGIC, 0, LOOM_BOOTSTRAP_MAX_RANKS + 1), 0, "out of range"},
        {Hello(LOOM_BS_HELLO_MAGIC, -1, 3), 0, "rank -1 out of range"},
        {Hello(LOOM_BS_HELLO_MAGIC, 3, 3), 0, "rank 3 out of range"},
        {Hello(LOOM_BS_HELLO_MAGIC, INT32_MAX, INT32_MAX), 0, "out of range"},
        {Hello(LOOM_BS_HELLO_MAGIC, 1, 4), 3, "others said 3"},
        {Hello(LOOM_BS_HELLO_MAGIC, 0, 3), 3, "rank 0 joined twice"},
    };
    for (const Case &c : bad) {
        h.rank = -99;
        EXPECT_EQ(DecodeHello(c.bytes, c.known, c.known ? joined : nullptr, &h, &why),
                  loomInvalidUsage)
            << c.reason;
        EXPECT_NE(why.find(c.reason), std::string::npos) << why;
        EXPECT_EQ(h.rank, -99) << "output written on failure";
    }
    // Rank 1 of the same 3 is fine; a NULL reason buffer is allowed.
    EXPECT_EQ(loom_bs_hello_decode(Hello(LOOM_BS_HELLO_MAGIC, 1, 3).data(), LOOM_BS_HELLO_BYTES, 3,
                                   joined, &h, nullptr, 0),
              loomSuccess);
}

TEST(BootstrapWire, RequestBounds)
{
    auto req = [](uint32_t type, uint32_t len) {
        loom_bs_req_t q = {type, len};
        uint8_t b[LOOM_BS_REQ_BYTES];
        loom_bs_req_encode(&q, b);
        return std::string(reinterpret_cast<char *>(b), sizeof(b));
    };
    auto decode = [](const std::string &b, int nranks, const loom_bs_req_t *first,
                     std::string *why) {
        loom_bs_req_t q;
        char w[200] = "";
        loomResult_t res = loom_bs_req_decode(b.data(), b.size(), nranks, first, &q, w, sizeof(w));
        *why = w;
        return res;
    };
    std::string why;
    EXPECT_EQ(decode(req(LOOM_BS_REQ_ALLGATHER, 300), 8, nullptr, &why), loomSuccess);
    EXPECT_EQ(decode(req(LOOM_BS_REQ_BYE, 0), 8, nullptr, &why), loomSuccess);
    EXPECT_EQ(decode(req(LOOM_BS_REQ_ALLGATHER, LOOM_BOOTSTRAP_MAX_PAYLOAD), 1024, nullptr, &why),
              loomSuccess); // exactly 1 GiB in all
    const loom_bs_req_t first = {LOOM_BS_REQ_ALLGATHER, 300};
    struct Case {
        std::string bytes;
        int nranks;
        const loom_bs_req_t *first;
        const char *reason;
    } bad[] = {
        {req(LOOM_BS_REQ_ALLGATHER, 4).substr(0, 7), 2, nullptr, "request of 7 bytes"},
        {req(0, 0), 2, nullptr, "unknown request type 0"},
        {req(3, 0), 2, nullptr, "unknown request type 3"},
        {req(LOOM_BS_REQ_BYE, 1), 2, nullptr, "bye with 1 payload bytes"},
        {req(LOOM_BS_REQ_ALLGATHER, 0xffffffffu), 2, nullptr, "exceeds the 1048576 byte limit"},
        {req(LOOM_BS_REQ_ALLGATHER, LOOM_BOOTSTRAP_MAX_PAYLOAD), 1025, nullptr,
         "from 1025 ranks exceeds"},
        {req(LOOM_BS_REQ_ALLGATHER, 4096), LOOM_BOOTSTRAP_MAX_RANKS, nullptr, "exceeds"},
        {req(LOOM_BS_REQ_ALLGATHER, 301), 8, &first, "the first rank sent 1 of 300 bytes"},
        {req(LOOM_BS_REQ_BYE, 0), 8, &first, "the first rank sent 1 of 300 bytes"},
        {req(LOOM_BS_REQ_ALLGATHER, 4), 0, nullptr, "nranks 0 out of range"},
        {req(LOOM_BS_REQ_ALLGATHER, 4), LOOM_BOOTSTRAP_MAX_RANKS + 1, nullptr, "out of range"},
    };
    for (const Case &c : bad) {
        EXPECT_EQ(decode(c.bytes, c.nranks, c.first, &why), loomInvalidUsage) << c.reason;
        EXPECT_NE(why.find(c.reason), std::string::npos) << why;
    }
}

TEST(BootstrapWire, ReplyBounds)
{
    uint8_t b[LOOM_BS_REPLY_BYTES];
    loom_bs_reply_t r = {0, 0};
    loom_bs_reply_encode(loomSuccess, 96, b);
    EXPECT_EQ(loom_bs_reply_decode(b, sizeof(b), 96, &r, nullptr, 0), loomSuccess);
    EXPECT_EQ(r.len, 96u);
    EXPECT_EQ(loom_bs_reply_decode(b, sizeof(b), 95, &r, nullptr, 0), loomRemoteError);
    EXPECT_EQ(loom_bs_reply_decode(b, sizeof(b) - 1, 96, &r, nullptr, 0), loomRemoteError);
    // A failure's text is bounded, whatever length the header claims.
    loom_bs_reply_encode(loomTimeout, UINT64_MAX, b);
    r = {0, 0};
    EXPECT_EQ(loom_bs_reply_decode(b, sizeof(b), 0, &r, nullptr, 0), loomTimeout);
    EXPECT_EQ(r.len, static_cast<uint64_t>(LOOM_BS_TEXT_MAX - 1));
    // Unknown or nonsensical codes become RemoteError.
    for (uint32_t st : {7u, 9u, 1000u, 0xffffffffu}) {
        loom_bs_reply_encode(static_cast<loomResult_t>(st), 3, b);
        EXPECT_EQ(loom_bs_reply_decode(b, sizeof(b), 0, &r, nullptr, 0), loomRemoteError) << st;
        EXPECT_EQ(r.len, 3u);
    }
}

TEST(BootstrapWire, UniqueIdChecks)
{
    loom_id_t id;
    memset(&id, 0, sizeof(id));
    id.magic = LOOM_ID_MAGIC;
    id.version = LOOM_ID_VERSION;
    id.root.sin.sin_family = AF_INET;
    id.root.sin.sin_port = htons(4000);
    loomUniqueId uid;
    memset(&uid, 0, sizeof(uid));
    memcpy(uid.internal, &id, sizeof(id));
    loom_id_t out;
    char why[128];
    EXPECT_EQ(loom_bs_id_decode(uid.internal, sizeof(uid.internal), &out, why, sizeof(why)),
              loomSuccess);
    EXPECT_EQ(loom_bs_id_decode(uid.internal, sizeof(id) - 1, &out, why, sizeof(why)),
              loomInvalidArgument);
    loom_id_t bad = id;
    bad.root.sa.sa_family = AF_UNIX;
    EXPECT_EQ(loom_bs_id_decode(&bad, sizeof(bad), &out, why, sizeof(why)), loomInvalidArgument);
    EXPECT_NE(std::string(why).find("family"), std::string::npos) << why;
    bad = id;
    bad.root.sin.sin_port = 0;
    EXPECT_EQ(loom_bs_id_decode(&bad, sizeof(bad), &out, why, sizeof(why)), loomInvalidArgument);
    bad = id;
    bad.version = 2;
    EXPECT_EQ(loom_bs_id_decode(&bad, sizeof(bad), &out, why, sizeof(why)), loomInvalidArgument);
    memset(&uid, 0xff, sizeof(uid));
    EXPECT_EQ(loom_bs_id_decode(uid.internal, sizeof(uid.internal), &out, why, sizeof(why)),
              loomInvalidArgument);
}

TEST(BootstrapWire, SecretHex)
{
    uint8_t s[LOOM_SECRET_BYTES];
    char why[128];
    ASSERT_EQ(loom_secret_parse_hex("00112233445566778899aabbccddeeFF", s, why, sizeof(why)),
              loomSuccess);
    EXPECT_EQ(s[0], 0x00);
    EXPECT_EQ(s[9], 0x99);
    EXPECT_EQ(s[15], 0xff);
    memset(s, 0x11, sizeof(s));
    for (const char *bad :
         {"", "0", "00112233445566778899aabbccddeef", "00112233445566778899aabbccddeeff0",
          "00112233445566778899aabbccddeefg", "0x112233445566778899aabbccddeeff",
          " 0112233445566778899aabbccddeeff", "00112233445566778899aabbccddee\xff\xff"}) {
        EXPECT_EQ(loom_secret_parse_hex(bad, s, why, sizeof(why)), loomInvalidArgument) << bad;
        EXPECT_EQ(s[0], 0x11) << "output written on failure";
    }
    EXPECT_EQ(loom_secret_parse_hex(nullptr, s, nullptr, 0), loomInvalidArgument);
    // The message never echoes the (secret) text.
    loom_secret_parse_hex("00112233445566778899aabbccddeegg", s, why, sizeof(why));
    EXPECT_EQ(std::string(why).find("gg"), std::string::npos) << why;
}

TEST(StreamWire, FrameHeader)
{
    uint8_t b[LOOM_WIRE_HDR_BYTES];
    loom_tp_frame_header_encode(0xabcdef01u, 0x123456789aull, b);
    loom_tp_frame_header_t h = {0, 0};
    ASSERT_EQ(loom_tp_frame_header_decode(b, sizeof(b), &h), 0);
    EXPECT_EQ(h.tag, 0xabcdef01u);
    EXPECT_EQ(h.nbytes, 0x123456789aull);
    EXPECT_EQ(loom_tp_frame_header_decode(b, sizeof(b) - 1, &h), -1);
    b[0] ^= 1;
    h = {1, 2};
    EXPECT_EQ(loom_tp_frame_header_decode(b, sizeof(b), &h), -2);
    EXPECT_EQ(h.tag, 1u);
}

TEST(SocketText, SplitHostPort)
{
    char host[64];
    int port = -1;
    EXPECT_EQ(loom_sockaddr_split("10.1.2.3:29500", host, sizeof(host), &port), 0);
    EXPECT_STREQ(host, "10.1.2.3");
    EXPECT_EQ(port, 29500);
    EXPECT_EQ(loom_sockaddr_split("[fe80::1%eth0]:0", host, sizeof(host), &port), 0);
    EXPECT_STREQ(host, "fe80::1%eth0");
    EXPECT_EQ(port, 0);
    EXPECT_EQ(loom_sockaddr_split("node-7.cluster:00080", host, sizeof(host), &port), 0);
    EXPECT_EQ(port, 80);
    for (const char *bad : {"", ":80", "[]:80", "nocolon", "[::1]80", "[::1", "h:", "h:-1", "h:+80",
                            "h: 80", "h:65536", "h:999999999999", "h:8O"}) {
        EXPECT_NE(loom_sockaddr_split(bad, host, sizeof(host), &port), 0) << bad;
    }
    // A host that does not fit is refused, not truncated.
    std::string longhost(64, 'a');
    EXPECT_EQ(loom_sockaddr_split((longhost + ":1").c_str(), host, sizeof(host), &port), -1);
    EXPECT_EQ(loom_sockaddr_split(("[" + longhost + "]:1").c_str(), host, sizeof(host), &port), -1);
    EXPECT_EQ(loom_sockaddr_split((longhost.substr(1) + ":1").c_str(), host, sizeof(host), &port),
              0);
}

TEST(SocketText, IfnameLists)
{
    EXPECT_TRUE(loom_ifname_matches("eth", "eth0"));
    EXPECT_FALSE(loom_ifname_matches("=eth", "eth0"));
    EXPECT_TRUE(loom_ifname_matches("=eth0", "eth0"));
    EXPECT_TRUE(loom_ifname_matches("ib,eth", "eth1"));
    EXPECT_FALSE(loom_ifname_matches("^eth,lo", "eth1"));
    EXPECT_TRUE(loom_ifname_matches("^eth,lo", "ib0"));
    EXPECT_TRUE(loom_ifname_matches("^=lo", "lo0"));
    EXPECT_FALSE(loom_ifname_matches("", "eth0"));
    EXPECT_TRUE(loom_ifname_matches("^", "eth0"));
    EXPECT_FALSE(loom_ifname_matches(",,,", "eth0"));
    EXPECT_FALSE(loom_ifname_matches("=", "eth0"));
}

TEST(ParamText, Sizes)
{
    int64_t v = 0;
    EXPECT_EQ(loom_parse_size("4K", &v), 0);
    EXPECT_EQ(v, 4096);
    EXPECT_EQ(loom_parse_size("8589934591G", &v), 0); // (2^63 - 1) >> 30
    EXPECT_EQ(loom_parse_size("8589934592G", &v), -1);
    for (const char *bad : {"", "-1", "K", "1KK", "1KBB", "1T", "99999999999999999999", "1 K"})
        EXPECT_EQ(loom_parse_size(bad, &v), -1) << bad;
}

// The resolving parser logs, so it runs in a child.
TEST(SocketText, ParseRefusesWithoutResolving)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t) {
            loom_sockaddr_t a;
            XT_CHECK_LOOM(loom_sockaddr_parse("127.0.0.1:29500", &a));
            XT_CHECK_LOOM(loom_sockaddr_parse("[::1]:1", &a));
            for (const char *bad : {":29500", "[]:1", "1.2.3.4:+5", "1.2.3.4:5x"})
                XT_CHECK_LOOM_RES(loom_sockaddr_parse(bad, &a), loomInvalidArgument);
            std::string huge(300, '9');
            XT_CHECK_LOOM_RES(loom_sockaddr_parse((huge + ":1").c_str(), &a), loomInvalidArgument);
        },
        opts));
}

} // namespace
