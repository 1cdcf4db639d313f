/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_bootstrap_wire.c - libFuzzer harness for the bootstrap's decoders
 * (src/core/bootstrap_wire.c): a root's gather fed a stream of hellos with its
 * table of joined ranks, a rank reading REPLY headers and failure texts, a
 * root reading a round of REQs, and unique ids. It uses the tables exactly as
 * bootstrap.c does, so an out-of-range value that got past a decoder shows up
 * as an ASan error or a trap here; and what a decoder accepts, encoded again,
 * decodes to the same (a hello to the same bytes). LOOM_SECRET text is
 * fuzz_env_parsers.c's. Built by fuzz/run.sh.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap_wire.h"
#include "fuzz_check.h"

/* The root's gather: lengths come from the input so that short and long
 * hellos are tried as well as the 16-byte ones. */
static void fuzz_hellos(const uint8_t *data, size_t size)
{
    int known = 0;
    uint8_t *joined = NULL;
    char why[160];
    while (size > 0) {
        size_t n = data[0] % 20;
        data++;
        size--;
        if (n > size)
            n = size;
        loom_bs_hello_t h;
        if (loom_bs_hello_decode(data, n, known, joined, &h, why, sizeof(why)) == loomSuccess) {
            REQUIRE(h.nranks >= 1 && h.nranks <= LOOM_BOOTSTRAP_MAX_RANKS);
            REQUIRE(h.rank >= 0 && h.rank < h.nranks);
            if (known == 0) {
                joined = calloc((size_t)h.nranks, 1);
                if (joined == NULL)
                    return;
                known = h.nranks;
            }
            REQUIRE(h.nranks == known && !joined[h.rank]);
            joined[h.rank] = 1; /* out of bounds here is what ASan is for */
            uint8_t again[LOOM_BS_HELLO_BYTES];
            loom_bs_hello_encode(&h, again);
            REQUIRE(memcmp(again, data, LOOM_BS_HELLO_BYTES) == 0);
        } else {
            REQUIRE(why[0] != '\0');
        }
        data += n;
        size -= n;
    }
    free(joined);
}

/* A rank reading a REPLY: the header, then the text of a failure into the
 * fixed buffer read_reply uses. */
static void fuzz_reply(const uint8_t *data, size_t size)
{
    if (size < 8 + LOOM_BS_REPLY_BYTES)
        return;
    uint64_t expect;
    memcpy(&expect, data, 8);
    expect %= (uint64_t)LOOM_BOOTSTRAP_MAX_TOTAL + 1;
    loom_bs_reply_t r = {0, 0};
    char why[128];
    loomResult_t res =
        loom_bs_reply_decode(data + 8, LOOM_BS_REPLY_BYTES, expect, &r, why, sizeof(why));
    const uint8_t *rest = data + 8 + LOOM_BS_REPLY_BYTES;
    size_t left = size - 8 - LOOM_BS_REPLY_BYTES;
    if (res != loomSuccess && r.status != 0) {
        REQUIRE(res != loomSuccess && (int)res < loomNumResults);
        char msg[LOOM_BS_TEXT_MAX];
        size_t n = (size_t)r.len;
        if (n > left)
            n = left;
        memcpy(msg, rest, n);
        msg[n] = '\0';
    } else if (res == loomSuccess) {
        REQUIRE(r.status == 0 && r.len == expect);
        uint8_t again[LOOM_BS_REPLY_BYTES];
        loom_bs_reply_encode(loomSuccess, r.len, again);
        loom_bs_reply_t back = {1, 0};
        REQUIRE(loom_bs_reply_decode(again, sizeof(again), expect, &back, why, sizeof(why)) ==
                loomSuccess);
        REQUIRE(back.status == r.status && back.len == r.len);
    }
}

/* The root's all-gather round: nranks from the input, then one REQ per rank
 * checked against the first, and the result buffer sized as root_serve does. */
static void fuzz_reqs(const uint8_t *data, size_t size)
{
    if (size < 4)
        return;
    int32_t nranks;
    memcpy(&nranks, data, 4);
    data += 4;
    size -= 4;
    loom_bs_req_t first = {0, 0}, q;
    char why[200];
    for (int r = 0; size >= LOOM_BS_REQ_BYTES; r++) {
        if (loom_bs_req_decode(data, LOOM_BS_REQ_BYTES, nranks, r == 0 ? NULL : &first, &q, why,
                               sizeof(why)) != loomSuccess)
            return;
        REQUIRE(nranks >= 1 && nranks <= LOOM_BOOTSTRAP_MAX_RANKS);
        REQUIRE(q.type == LOOM_BS_REQ_ALLGATHER || q.type == LOOM_BS_REQ_BYE);
        REQUIRE((uint64_t)q.len * (uint64_t)nranks <= LOOM_BOOTSTRAP_MAX_TOTAL);
        REQUIRE(r == 0 || (q.type == first.type && q.len == first.len));
        uint8_t again[LOOM_BS_REQ_BYTES];
        loom_bs_req_encode(&q, again);
        loom_bs_req_t back = {0, 0};
        REQUIRE(loom_bs_req_decode(again, sizeof(again), nranks, r == 0 ? NULL : &first, &back, why,
                                   sizeof(why)) == loomSuccess);
        REQUIRE(back.type == q.type && back.len == q.len);
        if (r == 0)
            first = q;
        data += LOOM_BS_REQ_BYTES;
        size -= LOOM_BS_REQ_BYTES;
    }
}

static void fuzz_id(const uint8_t *data, size_t size)
{
    loom_id_t id;
    char why[128];
    if (loom_bs_id_decode(data, size, &id, why, sizeof(why)) == loomSuccess)
        REQUIRE(id.magic == LOOM_ID_MAGIC &&
                (id.root.sa.sa_family == AF_INET || id.root.sa.sa_family == AF_INET6));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    switch (data[0] % 4) {
    case 0:
        fuzz_hellos(data + 1, size - 1);
        break;
    case 1:
        fuzz_reply(data + 1, size - 1);
        break;
    case 2:
        fuzz_reqs(data + 1, size - 1);
        break;
    default:
        fuzz_id(data + 1, size - 1);
        break;
    }
    return 0;
}
