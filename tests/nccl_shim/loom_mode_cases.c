/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_mode_cases.c - the case list, inputs and records of loom_mode_cases.h.
 */
#include <string.h>

#include "loom_mode_cases.h"

size_t lm_dtype_size(int dtype)
{
    switch (dtype) {
    case LM_E4M3:
    case LM_E5M2:
        return 1;
    case LM_HALF:
    case LM_BF16:
        return 2;
    case LM_INT32:
    case LM_FLOAT:
        return 4;
    case LM_DOUBLE:
        return 8;
    default:
        return 0;
    }
}

const char *lm_kind_name(lm_kind_t kind)
{
    static const char *const names[] = {"AllReduce", "ReduceScatter", "Reduce",   "AllGather",
                                        "Broadcast", "Bcast",         "AlltoAll", "Gather",
                                        "Scatter",   "SendRecv"};
    return names[kind];
}

static void add(lm_case_t *out, int max, int *n, lm_kind_t kind, int dtype, int op, int inplace,
                int root, size_t count)
{
    if (*n < max)
        out[*n] = (lm_case_t){kind, dtype, op, inplace, root, count};
    (*n)++;
}

int lm_cases(int nranks, lm_case_t *out, int max)
{
    static const int floats[] = {LM_FLOAT, LM_BF16, LM_HALF};
    static const int ops[] = {LM_SUM,  LM_AVG,         LM_MIN,       LM_MAX,
                              LM_PROD, LM_PREMUL_HOST, LM_PREMUL_DEV};
    int n = 0;
    for (int d = 0; d < 3; d++)
        for (int o = 0; o < 7; o++)
            for (int ip = 0; ip < 2; ip++) {
                add(out, max, &n, LM_ALLREDUCE, floats[d], ops[o], ip, 0, 37);
                add(out, max, &n, LM_REDUCESCATTER, floats[d], ops[o], ip, 0, 13);
                add(out, max, &n, LM_REDUCE, floats[d], ops[o], ip, (d + o + ip) % nranks, 29);
            }
    /* The other datatypes' PreMulSum semantics (and plain sums of them). */
    static const int others[] = {LM_INT32, LM_DOUBLE, LM_E4M3, LM_E5M2};
    for (int d = 0; d < 4; d++) {
        add(out, max, &n, LM_ALLREDUCE, others[d], LM_SUM, 0, 0, 33);
        add(out, max, &n, LM_ALLREDUCE, others[d], LM_PREMUL_HOST, 0, 0, 33);
        add(out, max, &n, LM_ALLREDUCE, others[d], LM_PREMUL_DEV, 1, 0, 33);
    }
    for (int d = 0; d < 3; d++)
        for (int ip = 0; ip < 2; ip++) {
            add(out, max, &n, LM_ALLGATHER, floats[d], -1, ip, 0, 11);
            add(out, max, &n, LM_BROADCAST, floats[d], -1, ip, (d + ip) % nranks, 31);
            add(out, max, &n, LM_GATHER, floats[d], -1, ip, (d + ip + 1) % nranks, 7);
            add(out, max, &n, LM_SCATTER, floats[d], -1, ip, (d + ip + 2) % nranks, 9);
        }
    for (int d = 0; d < 3; d++) {
        add(out, max, &n, LM_BCAST, floats[d], -1, 1, (d + 1) % nranks, 23);
        add(out, max, &n, LM_ALLTOALL, floats[d], -1, 0, 0, 5);
        add(out, max, &n, LM_SENDRECV, floats[d], -1, 0, 0, 17);
    }
    add(out, max, &n, LM_ALLREDUCE, LM_FLOAT, LM_SUM, 0, 0, 0); /* count 0 is valid */
    return n;
}

size_t lm_send_elems(const lm_case_t *c, int nranks)
{
    switch (c->kind) {
    case LM_REDUCESCATTER:
    case LM_ALLTOALL:
    case LM_SCATTER:
        return c->count * (size_t)nranks;
    default:
        return c->count;
    }
}

size_t lm_recv_elems(const lm_case_t *c, int nranks)
{
    switch (c->kind) {
    case LM_ALLGATHER:
    case LM_ALLTOALL:
    case LM_GATHER:
        return c->count * (size_t)nranks;
    default:
        return c->count;
    }
}

/* Exact encodings of small multiples of a power of two (normal numbers or zero). */
static uint16_t to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7fffffffu) == 0)
        return (uint16_t)(x >> 16);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t exp = ((x >> 23) & 0xffu) - 127u + 15u;
    return (uint16_t)(sign | (exp << 10) | ((x >> 13) & 0x3ffu));
}

static uint8_t to_fp8(float f, unsigned mbits, unsigned bias)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7fffffffu) == 0)
        return (uint8_t)((x >> 24) & 0x80u);
    const uint32_t sign = (x >> 24) & 0x80u;
    const uint32_t exp = ((x >> 23) & 0xffu) - 127u + bias;
    return (uint8_t)(sign | (exp << mbits) | ((x & 0x7fffffu) >> (23 - mbits)));
}

static void store(void *buf, size_t i, int dtype, float v)
{
    switch (dtype) {
    case LM_INT32: {
        const int32_t k = (int32_t)(v * 8);
        memcpy((char *)buf + 4 * i, &k, 4);
        break;
    }
    case LM_FLOAT:
        memcpy((char *)buf + 4 * i, &v, 4);
        break;
    case LM_DOUBLE: {
        const double d = v;
        memcpy((char *)buf + 8 * i, &d, 8);
        break;
    }
    case LM_HALF: {
        const uint16_t h = to_half(v);
        memcpy((char *)buf + 2 * i, &h, 2);
        break;
    }
    case LM_BF16: {
        uint32_t x;
        memcpy(&x, &v, 4);
        const uint16_t b = (uint16_t)(x >> 16);
        memcpy((char *)buf + 2 * i, &b, 2);
        break;
    }
    case LM_E4M3:
        ((uint8_t *)buf)[i] = to_fp8(v, 3, 7);
        break;
    case LM_E5M2:
        ((uint8_t *)buf)[i] = to_fp8(v, 2, 15);
        break;
    default:
        break;
    }
}

void lm_fill(void *buf, int dtype, size_t n, int case_index, int rank)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(case_index + 1) +
                 0x632be59bd9b4e019ull * (uint64_t)(rank + 1);
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int k = (int)((s >> 33) % 33) - 16; /* -16 .. 16 */
        /* e5m2 keeps 3 significant bits: quarters up to 2; the others eighths up to 2. */
        const float v = dtype == LM_E5M2 ? (float)(k / 2) / 4.0f : (float)k / 8.0f;
        store(buf, i, dtype, v);
    }
}

void lm_scalar(int dtype, int which, void *out)
{
    /* 171/128 and 149/128 have 8 significant bits (exact in bfloat16, float16 and up);
     * fp8 gets values of its own width: 1.375 and 1.625 (e4m3), 1.5 and 1.25 (e5m2). */
    float v;
    switch (dtype) {
    case LM_E4M3:
        v = which ? 1.625f : 1.375f;
        break;
    case LM_E5M2:
        v = which ? 1.25f : 1.5f;
        break;
    case LM_INT32: {
        const int32_t k = which ? -5 : 3;
        memcpy(out, &k, 4);
        return;
    }
    default:
        v = which ? 149.0f / 128 : 171.0f / 128;
        break;
    }
    store(out, 0, dtype, v);
}

int lm_record(FILE *f, int case_index, const void *data, size_t bytes)
{
    const uint32_t head[2] = {(uint32_t)case_index, (uint32_t)bytes};
    if (fwrite(head, sizeof(head), 1, f) != 1)
        return -1;
    if (bytes > 0 && fwrite(data, bytes, 1, f) != 1)
        return -1;
    return 0;
}
