/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_moe_trace.c - libFuzzer harness for LMTR v1 routing traces (src/moe/moe_trace.c): any
 * input is refused with loomInvalidArgument and a message, or read into a trace that, encoded
 * again record by record, gives back exactly the input's bytes (the format has one encoding per
 * trace: zero padding, fp16 weights kept bit for bit) and decodes again to the same counts.
 * The first input byte chooses a mode: odd, every record's CRC is made right before decoding, so
 * the checks behind the CRC see mutated records too; even, the bytes are decoded as they are.
 * Built by fuzz/run.sh.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/moe/moe_trace.h"
#include "debug.h"
#include "fuzz_check.h"

FUZZ_LOOM_LOG_OFF()

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Writes the right CRC into every whole record, walking them by their payload_bytes. */
static void reseal(uint8_t *p, size_t n)
{
    size_t at = LOOM_MOE_TRACE_HEADER_BYTES;
    while (at <= n && n - at >= LOOM_MOE_TRACE_RECORD_BYTES) {
        uint64_t body = LOOM_MOE_TRACE_RECORD_BYTES + (uint64_t)get_u32(p + at + 16);
        if (body + LOOM_MOE_TRACE_CRC_BYTES > n - at)
            return;
        uint32_t crc = loom_moe_trace_crc32(p + at, (size_t)body);
        for (int i = 0; i < 4; i++)
            p[at + body + i] = (uint8_t)(crc >> (8 * i));
        at += (size_t)body + LOOM_MOE_TRACE_CRC_BYTES;
    }
}

static int one_input(const uint8_t *data, size_t size)
{
    loom_moe_trace_t *tr = NULL;
    loom_clear_last_error();
    loomResult_t res = loom_moe_trace_decode(data, size, &tr);
    if (res != loomSuccess) {
        /* A refusal names what is wrong and hands nothing back. */
        REQUIRE(res == loomInvalidArgument && tr == NULL && loom_last_error()[0] != '\0');
        return 0;
    }
    REQUIRE(size >= LOOM_MOE_TRACE_HEADER_BYTES);
    uint8_t *out = malloc(size);
    REQUIRE(out != NULL);
    REQUIRE(loom_moe_trace_header_encode(&tr->header, out) == loomSuccess);
    size_t at = LOOM_MOE_TRACE_HEADER_BYTES;
    for (size_t i = 0; i < tr->num_batches; i++) {
        const loom_moe_trace_batch_t *b = &tr->batches[i];
        uint64_t n = loom_moe_trace_record_nbytes(&tr->header, b->num_tokens);
        REQUIRE(n <= size - at);
        REQUIRE(loom_moe_trace_batch_encode(&tr->header, b, out + at, (size_t)n) == loomSuccess);
        at += (size_t)n;
    }
    REQUIRE(at == size && memcmp(out, data, size) == 0);
    loom_moe_trace_t *back = NULL;
    REQUIRE(loom_moe_trace_decode(out, size, &back) == loomSuccess);
    REQUIRE(back->num_batches == tr->num_batches &&
            memcmp(&back->header, &tr->header, sizeof(tr->header)) == 0);
    loom_moe_trace_free(back);
    loom_moe_trace_free(tr);
    free(out);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (!(data[0] & 1))
        return one_input(data + 1, size - 1);
    uint8_t *copy = malloc(size);
    REQUIRE(copy != NULL);
    memcpy(copy, data + 1, size - 1);
    reseal(copy, size - 1);
    one_input(copy, size - 1);
    free(copy);
    return 0;
}
