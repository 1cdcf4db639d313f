/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_xfer.c - loomMoeDispatch, loomMoeCombine and their backward passes: the data exchanges of a
 * handle, each one loomAllToAllv of bytes with one segment per peer (a 16-byte header carrying
 * the sender's status, then its rows), so a refusal on one rank reaches every rank in the same
 * exchange.
 *
 * Dispatch: a row is one token's payload plus a trailer (the token index, then the (weight,
 * local expert) pairs it has on the destination, in top-k slot order); on arrival each pair's
 * payload is copied into the next slot of its (local expert, source) run, whose start Layout
 * computed, so slots come out in the canonical order: local expert, source rank, source token.
 *
 * Combine (docs/moe.md gives why the bits are reproducible): for each received row, the pairs'
 * weight x expert output summed in float32 in top-k slot order is the row's partial; partials
 * travel back as float32 over the same segments reversed; the home rank adds, per token, the
 * partials in ascending source rank into a float32 accumulator started at 0 and rounds once to
 * the datatype. In naive mode a row carries one pair, and the home rank first sums a token's
 * partials from one rank in slot order: the same float32 operations as dedup, the same bits.
 *
 * Backward, on the same handle: dispatch backward is combine with every weight 1 (the same
 * code). Combine backward sends grad_y as dispatch sends x, writes w * grad_y into each slot,
 * and returns each pair's weight gradient <grad_y, expert_out[slot]> (float32) to the home rank
 * in a second exchange, one float32 per pair of each row, in top-k slot order.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocked_for.h"
#include "check.h"
#include "dtype.h"
#include "moe.h"
#include "moe_ep.h"

#define HDR_BYTES sizeof(loom_moe_seg_hdr_t)

/* One exchange: per-peer byte counts and displacements of both directions, and the buffers
 * (the plan's, see loom_moe_buf). */
typedef struct xfer {
    size_t *scount, *sdispl, *rcount, *rdispl;
    unsigned char *sbuf, *rbuf;
    size_t stotal, rtotal;
    uint32_t *statuses; /* [G] each rank's status, read from the headers */
} xfer_t;

void *loom_moe_buf(struct loomMoePlan *p, int which, size_t bytes)
{
    loom_moe_buf_t *b = &p->bufs[which];
    if (b->ptr != NULL && b->cap >= bytes)
        return b->ptr;
    free(b->ptr);
    b->ptr = NULL;
    b->cap = 0;
    /* A quarter more than asked: row counts vary from step to step, and each regrowth maps
     * and faults in fresh pages. */
    size_t cap = bytes > SIZE_MAX - bytes / 4 - 1 ? bytes : bytes + bytes / 4 + 1;
    void *m = malloc(cap);
    if (m == NULL && cap > bytes) {
        cap = bytes ? bytes : 1;
        m = malloc(cap);
    }
    if (m == NULL)
        return NULL;
    b->ptr = m;
    b->cap = cap;
    return m;
}

void loom_moe_bufs_free(struct loomMoePlan *p)
{
    for (int i = 0; i < LOOM_MOE_NUM_BUFS; i++) {
        free(p->bufs[i].ptr);
        p->bufs[i].ptr = NULL;
        p->bufs[i].cap = 0;
    }
}

static void xfer_free(xfer_t *x)
{
    free(x->scount);
    free(x->sdispl);
    free(x->rcount);
    free(x->rdispl);
    free(x->statuses);
}

/* Segment g of a direction holds a header and rows[g] rows of row_bytes. */
static loomResult_t segs_size(const char *call, size_t G, const size_t *rows, size_t row_bytes,
                              size_t *count, size_t *displ, size_t *total_p)
{
    size_t total = 0;
    for (size_t g = 0; g < G; g++) {
        size_t bytes;
        if (__builtin_mul_overflow(rows[g], row_bytes, &bytes) ||
            __builtin_add_overflow(bytes, HDR_BYTES, &bytes) ||
            __builtin_add_overflow(total, bytes, &total)) {
            LOOM_WARN("%s: %zu rows of %zu bytes for rank %zu overflow", call, rows[g], row_bytes,
                      g);
            return loomInvalidArgument;
        }
        count[g] = bytes;
        displ[g] = total - bytes;
    }
    *total_p = total;
    return loomSuccess;
}

/* The exchange's segments in the plan's buffers: LOOM_MOE_BUF_SEND and _RECV, or, with second
 * set, _SEND2 and _RECV2. The rows are left for the caller to write. */
static loomResult_t xfer_init(const char *call, struct loomMoePlan *p, int second,
                              const size_t *send_rows, const size_t *recv_rows, size_t row_bytes,
                              xfer_t *x)
{
    size_t G = (size_t)p->nranks;
    memset(x, 0, sizeof(*x));
    x->scount = malloc(G * sizeof(size_t));
    x->sdispl = malloc(G * sizeof(size_t));
    x->rcount = malloc(G * sizeof(size_t));
    x->rdispl = malloc(G * sizeof(size_t));
    x->statuses = malloc(G * sizeof(uint32_t));
    if (x->scount == NULL || x->sdispl == NULL || x->rcount == NULL || x->rdispl == NULL ||
        x->statuses == NULL) {
        LOOM_WARN("%s: out of memory for the counts of %zu ranks", call, G);
        return loomSystemError;
    }
    LOOM_CHECK(segs_size(call, G, send_rows, row_bytes, x->scount, x->sdispl, &x->stotal));
    LOOM_CHECK(segs_size(call, G, recv_rows, row_bytes, x->rcount, x->rdispl, &x->rtotal));
    x->sbuf = loom_moe_buf(p, second ? LOOM_MOE_BUF_SEND2 : LOOM_MOE_BUF_SEND, x->stotal);
    x->rbuf = loom_moe_buf(p, second ? LOOM_MOE_BUF_RECV2 : LOOM_MOE_BUF_RECV, x->rtotal);
    if (x->sbuf == NULL || x->rbuf == NULL) {
        LOOM_WARN("%s: out of memory for %zu bytes to send and %zu to receive (rank %d)", call,
                  x->stotal, x->rtotal, p->rank);
        return loomSystemError;
    }
    for (size_t g = 0; g < G; g++) {
        loom_moe_seg_hdr_t hdr = {LOOM_MOE_SEG_MAGIC, loomSuccess, send_rows[g]};
        memcpy(x->sbuf + x->sdispl[g], &hdr, sizeof(hdr));
    }
    return loomSuccess;
}

/* Sends every segment with this rank's status; Success only if every rank's status, and every
 * header, is good. */
static loomResult_t xfer_run(const char *call, const struct loomMoePlan *p, const xfer_t *x,
                             loomResult_t status, const size_t *recv_rows)
{
    size_t G = (size_t)p->nranks;
    for (size_t g = 0; g < G; g++) {
        uint32_t st = (uint32_t)status;
        /* A refusal sends zeros, not what the buffer held from an earlier call. */
        if (status != loomSuccess)
            memset(x->sbuf + x->sdispl[g] + HDR_BYTES, 0, x->scount[g] - HDR_BYTES);
        memcpy(x->sbuf + x->sdispl[g] + offsetof(loom_moe_seg_hdr_t, status), &st, sizeof(st));
    }
    LOOM_CHECK(loomAllToAllv(x->sbuf, x->scount, x->sdispl, x->rbuf, x->rcount, x->rdispl,
                             loomUint8, p->comm, NULL));
    for (size_t s = 0; s < G; s++) {
        loom_moe_seg_hdr_t hdr;
        memcpy(&hdr, x->rbuf + x->rdispl[s], sizeof(hdr));
        if (hdr.magic != LOOM_MOE_SEG_MAGIC ||
            (hdr.status == loomSuccess && hdr.rows != recv_rows[s])) {
            LOOM_WARN("%s: rank %zu sent a segment with magic 0x%x and %llu rows, rank %d expected "
                      "magic 0x%x and %zu rows",
                      call, s, hdr.magic, (unsigned long long)hdr.rows, p->rank, LOOM_MOE_SEG_MAGIC,
                      recv_rows[s]);
            return loomRemoteError;
        }
        x->statuses[s] = hdr.status;
    }
    return loom_moe_status_join(call, x->statuses, p->nranks, p->rank);
}

static void xfer_count_bytes(struct loomMoePlan *p, const xfer_t *x)
{
    for (size_t g = 0; g < (size_t)p->nranks; g++) {
        if (g == (size_t)p->rank)
            continue;
        p->stats.bytes_sent += x->scount[g];
        p->stats.bytes_recv += x->rcount[g];
    }
}

// ---- dispatch ----------------------------------------------------------------------------

static void pack_rows(const struct loomMoeHandle *h, const unsigned char *x, xfer_t *xf)
{
    const struct loomMoePlan *p = h->plan;
    size_t k = (size_t)p->top_k, ppr = p->pairs_per_row, r = 0;
    for (size_t g = 0; g < (size_t)p->nranks; g++) {
        unsigned char *row = xf->sbuf + xf->sdispl[g] + HDR_BYTES;
        for (size_t i = 0; i < h->send_rows[g]; i++, r++, row += p->row_bytes) {
            int32_t t = h->row_token[r];
            memcpy(row, x + (size_t)t * p->payload_bytes, p->payload_bytes);
            /* The padding and unused pairs go on the wire: the same zeros every time. */
            memset(row + p->payload_bytes, 0, p->row_bytes - p->payload_bytes);
            unsigned char *tr = row + p->trailer_off;
            unsigned char *wts = tr + 4, *ids = tr + 4 + ppr * sizeof(float);
            memcpy(tr, &t, sizeof(t));
            size_t j0 = h->row_slot ? (size_t)h->row_slot[r] : 0;
            size_t j1 = h->row_slot ? j0 + 1 : k, n = 0;
            for (size_t j = j0; j < j1; j++) {
                int32_t e = h->topk[(size_t)t * k + j];
                if (e < 0 || (size_t)p->expert_rank[e] != g)
                    continue;
                int16_t id = (int16_t)p->local_id[e];
                memcpy(wts + n * sizeof(float), &h->weights[(size_t)t * k + j], sizeof(float));
                memcpy(ids + n * sizeof(int16_t), &id, sizeof(id));
                n++;
            }
            for (int16_t none = -1; n < ppr; n++)
                memcpy(ids + n * sizeof(int16_t), &none, sizeof(none));
        }
    }
}

static loomResult_t bad_row(const struct loomMoePlan *p, size_t s, size_t i, const char *why,
                            long long v)
{
    LOOM_WARN("loomMoeDispatch: row %zu from rank %zu breaks the protocol: %s %lld (rank %d)", i, s,
              why, v, p->rank);
    return loomRemoteError;
}

/* Reads the trailers, records each row's pairs and copies payloads into their slots. */
static loomResult_t expand_rows(struct loomMoeHandle *h, const xfer_t *xf, unsigned char *recv_x)
{
    const struct loomMoePlan *p = h->plan;
    size_t G = (size_t)p->nranks, L = (size_t)p->num_local[p->rank], ppr = p->pairs_per_row;
    int naive = p->mode == loomMoeModeNaive;
    size_t *cursor = malloc((L * G + 1) * sizeof(size_t));
    if (cursor == NULL) {
        LOOM_WARN("loomMoeDispatch: out of memory for %zu slot cursors", L * G);
        return loomSystemError;
    }
    for (size_t l = 0; l < L; l++) {
        size_t at = (size_t)h->expert_offset[l];
        for (size_t s = 0; s < G; s++) {
            cursor[l * G + s] = at;
            at += (size_t)h->pair_count[l * G + s];
        }
    }
    loomResult_t res = loomSuccess;
    size_t rr = 0, pp = 0;
    for (size_t s = 0; s < G && res == loomSuccess; s++) {
        const unsigned char *row = xf->rbuf + xf->rdispl[s] + HDR_BYTES;
        int64_t prev = -1;
        for (size_t i = 0; i < h->recv_rows[s] && res == loomSuccess; i++, rr++) {
            const unsigned char *tr = row + p->trailer_off;
            const unsigned char *wts = tr + 4, *ids = tr + 4 + ppr * sizeof(float);
            int32_t t;
            memcpy(&t, tr, sizeof(t));
            if (t < 0 || t < prev || (!naive && t == prev)) {
                res = bad_row(p, s, i, "token out of order:", t);
                break;
            }
            prev = t;
            h->row_start[rr] = pp;
            for (size_t q = 0; q < ppr; q++) {
                int16_t id;
                memcpy(&id, ids + q * sizeof(id), sizeof(id));
                if (id < 0 && q > 0)
                    break;
                size_t c = (size_t)id * G + s;
                if (id < 0 || (size_t)id >= L ||
                    cursor[c] == (size_t)(h->expert_offset[id] + h->expert_count[id]) ||
                    (s + 1 < G && cursor[c] == cursor[c + 1])) {
                    res = bad_row(p, s, i, "local expert", id);
                    break;
                }
                size_t slot = cursor[c]++;
                memcpy(&h->pair_weight[pp], wts + q * sizeof(float), sizeof(float));
                h->pair_slot[pp++] = slot;
                memcpy(recv_x + slot * p->payload_bytes, row, p->payload_bytes);
            }
            row += p->row_bytes;
        }
    }
    if (res == loomSuccess && pp != h->recv_slots)
        res = bad_row(p, G - 1, rr, "pairs in all, expected more:", (long long)pp);
    h->row_start[rr] = pp;
    free(cursor);
    return res;
}

LOOM_API loomResult_t loomMoeDispatch(loomMoeHandle_t handle, const void *x, void *recv_x)
{
    if (handle == NULL) {
        LOOM_WARN("loomMoeDispatch: handle is NULL");
        return loomInvalidArgument;
    }
    struct loomMoeHandle *h = handle;
    struct loomMoePlan *p = h->plan;
    /* Every rank holds the same refusal, so each returns without an exchange. */
    LOOM_CHECK(loom_moe_handle_usable("loomMoeDispatch", h));
    loomResult_t status = loomSuccess;
    if (x == NULL && h->num_tokens > 0) {
        LOOM_WARN("loomMoeDispatch: x is NULL with %zu tokens (rank %d)", h->num_tokens, p->rank);
        status = loomInvalidArgument;
    } else if (recv_x == NULL && h->recv_slots > 0) {
        LOOM_WARN("loomMoeDispatch: recv_x is NULL with %zu slots to receive (rank %d)",
                  h->recv_slots, p->rank);
        status = loomInvalidArgument;
    }
    if (h->row_start == NULL) {
        h->row_start = malloc((h->recv_total + 1) * sizeof(size_t));
        h->pair_slot = malloc((h->recv_slots + 1) * sizeof(size_t));
        h->pair_weight = malloc((h->recv_slots + 1) * sizeof(float));
    }
    if (status == loomSuccess &&
        (h->row_start == NULL || h->pair_slot == NULL || h->pair_weight == NULL)) {
        LOOM_WARN("loomMoeDispatch: out of memory for %zu received pairs", h->recv_slots);
        status = loomSystemError; /* told to the peers, so that they do not wait */
    }
    xfer_t xf;
    loomResult_t res =
        xfer_init("loomMoeDispatch", p, 0, h->send_rows, h->recv_rows, p->row_bytes, &xf);
    if (res == loomSuccess) {
        if (status == loomSuccess)
            pack_rows(h, x, &xf);
        res = xfer_run("loomMoeDispatch", p, &xf, status, h->recv_rows);
    }
    if (res == loomSuccess)
        res = expand_rows(h, &xf, recv_x);
    if (res == loomSuccess) {
        h->dispatched = 1;
        xfer_count_bytes(p, &xf);
    }
    xfer_free(&xf);
    return res;
}

// ---- combine -----------------------------------------------------------------------------

static inline float load_elem(loomDataType_t dt, const void *buf, size_t i)
{
    if (dt == loomFloat32) {
        float v;
        memcpy(&v, (const unsigned char *)buf + i * 4, 4);
        return v;
    }
    uint16_t b;
    memcpy(&b, (const unsigned char *)buf + i * 2, 2);
    return dt == loomBfloat16 ? loom_bf16_decode(b) : loom_f16_decode(b);
}

static inline void store_elem(loomDataType_t dt, void *buf, size_t i, float v)
{
    if (dt == loomFloat32) {
        memcpy((unsigned char *)buf + i * 4, &v, 4);
        return;
    }
    uint16_t b = dt == loomBfloat16 ? loom_bf16_encode(v) : loom_f16_encode(v);
    memcpy((unsigned char *)buf + i * 2, &b, 2);
}

#define BY_DTYPE(dt, fn, ...)                                                                      \
    do {                                                                                           \
        if ((dt) == loomBfloat16)                                                                  \
            fn(loomBfloat16, __VA_ARGS__);                                                         \
        else if ((dt) == loomFloat16)                                                              \
            fn(loomFloat16, __VA_ARGS__);                                                          \
        else                                                                                       \
            fn(loomFloat32, __VA_ARGS__);                                                          \
    } while (0)
/* The row loops run as BLOCKED_FOR (blocked_for.h), so gcc vectorises them at -O2. Each row
 * function below is inlined with its datatype a constant (BY_DTYPE), so the conversion in the
 * loop has no branch. Every element sees the same float32 operations in the same order as one
 * scalar loop would apply. */
#define ROW_INLINE static inline __attribute__((always_inline))

/* Typed pointers, not load_elem's byte copies: gcc vectorises only the former. Every buffer
 * here is the caller's array of dt or the plan's, whose rows start at multiples of 4 bytes. */
ROW_INLINE float decode16(loomDataType_t dt, uint16_t v)
{
    return dt == loomBfloat16 ? loom_bf16_decode(v) : loom_f16_decode(v);
}

/* acc[c] = (start ? 0 : acc[c]) + w * src[c]. */
ROW_INLINE void axpy_dt(loomDataType_t dt, float *restrict acc, float w, const void *src, int start,
                        size_t n)
{
    if (dt == loomFloat32) {
        const float *restrict x = src;
        if (start)
            BLOCKED_FOR(c, n, acc[c] = 0.0f + w * x[c]);
        else
            BLOCKED_FOR(c, n, acc[c] += w * x[c]);
        return;
    }
    const uint16_t *restrict x = src;
    if (start)
        BLOCKED_FOR(c, n, acc[c] = 0.0f + w * decode16(dt, x[c]));
    else
        BLOCKED_FOR(c, n, acc[c] += w * decode16(dt, x[c]));
}

/* dst[c] = src[c] rounded to dt. */
ROW_INLINE void round_dt(loomDataType_t dt, void *dst, const float *restrict src, size_t n)
{
    if (n == 0) /* a rank without tokens passes y NULL: memcpy must not see it */
        return;
    if (dt == loomFloat32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *restrict y = dst;
    if (dt == loomBfloat16)
        BLOCKED_FOR(c, n, y[c] = loom_bf16_encode(src[c]));
    else
        BLOCKED_FOR(c, n, y[c] = loom_f16_encode(src[c]));
}

/* dst[c] = (start ? 0 : dst[c]) + src[c]. */
static void add_f32(float *restrict dst, const float *restrict src, int start, size_t n)
{
    if (start)
        BLOCKED_FOR(c, n, dst[c] = 0.0f + src[c]);
    else
        BLOCKED_FOR(c, n, dst[c] += src[c]);
}

/* dst[c] += (run ? run[c] : 0) + src[c]: the last row of a naive token's run on one rank. */
static void add_run_end(float *restrict dst, const float *restrict run, const float *restrict src,
                        size_t n)
{
    if (run == NULL)
        BLOCKED_FOR(c, n, dst[c] += 0.0f + src[c]);
    else
        BLOCKED_FOR(c, n, dst[c] += run[c] + src[c]);
}

/* Each received row's partial, in the order the rows came: the rows of source s return to s
 * in the order s sent them. Unweighted (dispatch backward): each pair's weight is taken as 1.
 * Summed in place in the segment (rows start at multiples of 4 bytes), from 0. */
static void row_partials(const struct loomMoeHandle *h, const void *expert_out, int weighted,
                         xfer_t *xf)
{
    const struct loomMoePlan *p = h->plan;
    size_t H = p->hidden, rr = 0;
    for (size_t s = 0; s < (size_t)p->nranks; s++) {
        float *out = (float *)(xf->sbuf + xf->sdispl[s] + HDR_BYTES);
        for (size_t i = 0; i < h->recv_rows[s]; i++, rr++, out += H) {
            size_t q0 = h->row_start[rr], q1 = h->row_start[rr + 1];
            if (q0 == q1) /* Dispatch refuses such rows; zeros all the same */
                memset(out, 0, H * sizeof(float));
            for (size_t q = q0; q < q1; q++) {
                float w = weighted ? h->pair_weight[q] : 1.0f;
                const unsigned char *x =
                    (const unsigned char *)expert_out + h->pair_slot[q] * p->payload_bytes;
                BY_DTYPE(p->dtype, axpy_dt, out, w, x, q == q0, H);
            }
        }
    }
}

/* The home sum: per token, partials in ascending source rank, then one rounding. */
static void home_sum(const struct loomMoeHandle *h, const xfer_t *xf, float *yacc, float *tmp,
                     void *y)
{
    const struct loomMoePlan *p = h->plan;
    size_t H = p->hidden, r = 0;
    int naive = p->mode == loomMoeModeNaive;
    memset(yacc, 0, h->num_tokens * H * sizeof(float));
    for (size_t g = 0; g < (size_t)p->nranks; g++) {
        const unsigned char *in = xf->rbuf + xf->rdispl[g] + HDR_BYTES;
        for (size_t i = 0; i < h->send_rows[g]; i++, r++, in += H * sizeof(float)) {
            size_t t = (size_t)h->row_token[r];
            float *dst = yacc + t * H;
            /* Naive: a token's rows to one rank are adjacent, in slot order; sum them first, as
             * the dedup row's partial would have been summed on rank g. */
            if (naive) {
                int first = i == 0 || h->row_token[r - 1] != (int32_t)t;
                int last = i + 1 == h->send_rows[g] || h->row_token[r + 1] != (int32_t)t;
                if (last)
                    add_run_end(dst, first ? NULL : tmp, (const float *)in, H);
                else
                    add_f32(tmp, (const float *)in, first, H);
                continue;
            }
            add_f32(dst, (const float *)in, 0, H);
        }
    }
    BY_DTYPE(p->dtype, round_dt, y, yacc, h->num_tokens * H);
}

/* A handle that must have been dispatched, or NULL (WARNed, *status why) when the call cannot
 * even start: a NULL handle, or one that error mode refused on every rank alike. */
static struct loomMoeHandle *started(const char *call, loomMoeHandle_t handle, loomResult_t *status)
{
    if (handle == NULL) {
        LOOM_WARN("%s: handle is NULL", call);
        *status = loomInvalidArgument;
        return NULL;
    }
    *status = loom_moe_handle_usable(call, handle);
    if (*status != loomSuccess)
        return NULL;
    if (!handle->dispatched) {
        LOOM_WARN("%s: the handle was never dispatched (rank %d): call loomMoeDispatch first", call,
                  handle->plan->rank);
        *status = loomInvalidUsage;
    }
    return handle;
}

/* A buffer that must not be NULL when it has n rows; sets *status to the first refusal. */
static void need_buf(const char *call, const char *name, const void *buf, size_t n,
                     const char *unit, int rank, loomResult_t *status)
{
    if (*status != loomSuccess || buf != NULL || n == 0)
        return;
    LOOM_WARN("%s: %s is NULL with %zu %s (rank %d)", call, name, n, unit, rank);
    *status = loomInvalidArgument;
}

/* Combine, and dispatch backward (its adjoint: combine with every weight 1). The partials travel
 * back over the dispatch segments reversed and are added in the canonical order. */
static loomResult_t reduce_home(const char *call, loomMoeHandle_t handle, const void *slots,
                                const char *slots_name, void *out, const char *out_name,
                                int weighted)
{
    loomResult_t status;
    struct loomMoeHandle *h = started(call, handle, &status);
    if (h == NULL)
        return status;
    struct loomMoePlan *p = h->plan;
    size_t H = p->hidden;
    need_buf(call, slots_name, slots, h->recv_slots, "slots", p->rank, &status);
    need_buf(call, out_name, out, h->num_tokens, "tokens", p->rank, &status);
    /* The sums: a token's run in naive mode (H), then one row per token. */
    float *run = NULL;
    size_t floats;
    if (!__builtin_mul_overflow(h->num_tokens + 1, H, &floats) && floats <= SIZE_MAX / 4)
        run = loom_moe_buf(p, LOOM_MOE_BUF_SUM, floats * sizeof(float));
    if (status == loomSuccess && run == NULL) {
        LOOM_WARN("%s: out of memory for %zu tokens of %zu floats", call, h->num_tokens, H);
        status = loomSystemError; /* told to the peers, so that they do not wait */
    }
    xfer_t xf;
    loomResult_t res = xfer_init(call, p, 0, h->recv_rows, h->send_rows, H * sizeof(float), &xf);
    if (res == loomSuccess) {
        if (status == loomSuccess)
            row_partials(h, slots, weighted, &xf);
        res = xfer_run(call, p, &xf, status, h->send_rows);
    }
    if (res == loomSuccess) {
        home_sum(h, &xf, run + H, run, out);
        xfer_count_bytes(p, &xf);
    }
    xfer_free(&xf);
    return res;
}

LOOM_API loomResult_t loomMoeCombine(loomMoeHandle_t handle, const void *expert_out, void *y)
{
    return reduce_home("loomMoeCombine", handle, expert_out, "expert_out", y, "y", 1);
}

LOOM_API loomResult_t loomMoeDispatchBackward(loomMoeHandle_t handle, const void *grad_recv_x,
                                              void *grad_x)
{
    return reduce_home("loomMoeDispatchBackward", handle, grad_recv_x, "grad_recv_x", grad_x,
                       "grad_x", 0);
}

// ---- combine backward --------------------------------------------------------------------

/* On the expert rank, from grad_y's rows as dispatch delivered them: each pair's slot gets
 * w * grad_y rounded to the datatype, and its weight gradient <grad_y, expert_out[slot]>
 * (float32, columns ascending) goes into the row's place in the return segment, pairs in top-k
 * slot order. */
static void pair_grads(const struct loomMoeHandle *h, const xfer_t *in, const void *expert_out,
                       void *grad_expert_out, xfer_t *back)
{
    const struct loomMoePlan *p = h->plan;
    size_t H = p->hidden, ppr = p->pairs_per_row, rr = 0;
    for (size_t s = 0; s < (size_t)p->nranks; s++) {
        const unsigned char *row = in->rbuf + in->rdispl[s] + HDR_BYTES;
        unsigned char *dw = back->sbuf + back->sdispl[s] + HDR_BYTES;
        for (size_t i = 0; i < h->recv_rows[s]; i++, rr++, row += p->row_bytes) {
            memset(dw, 0, ppr * sizeof(float)); /* a row's unused pairs */
            for (size_t q = h->row_start[rr]; q < h->row_start[rr + 1]; q++) {
                float w = h->pair_weight[q], acc = 0.0f;
                size_t base = h->pair_slot[q] * H;
                for (size_t c = 0; c < H; c++) {
                    float g = load_elem(p->dtype, row, c);
                    store_elem(p->dtype, grad_expert_out, base + c, w * g);
                    acc += g * load_elem(p->dtype, expert_out, base + c);
                }
                memcpy(dw + (q - h->row_start[rr]) * sizeof(float), &acc, sizeof(acc));
            }
            dw += ppr * sizeof(float);
        }
    }
}

/* On the home rank: each returned row's weight gradients into their top-k slots; slots without
 * a selection get 0. */
static void scatter_weight_grads(const struct loomMoeHandle *h, const xfer_t *back,
                                 float *grad_weights)
{
    const struct loomMoePlan *p = h->plan;
    size_t k = (size_t)p->top_k, ppr = p->pairs_per_row, r = 0;
    if (h->num_tokens > 0) /* grad_weights may be NULL without tokens */
        memset(grad_weights, 0, h->num_tokens * k * sizeof(float));
    for (size_t g = 0; g < (size_t)p->nranks; g++) {
        const unsigned char *dw = back->rbuf + back->rdispl[g] + HDR_BYTES;
        for (size_t i = 0; i < h->send_rows[g]; i++, r++, dw += ppr * sizeof(float)) {
            size_t t = (size_t)h->row_token[r], n = 0;
            size_t j0 = h->row_slot ? (size_t)h->row_slot[r] : 0;
            size_t j1 = h->row_slot ? j0 + 1 : k;
            for (size_t j = j0; j < j1; j++) {
                int32_t e = h->topk[t * k + j];
                if (e < 0 || (size_t)p->expert_rank[e] != g)
                    continue;
                memcpy(&grad_weights[t * k + j], dw + n++ * sizeof(float), sizeof(float));
            }
        }
    }
}

LOOM_API loomResult_t loomMoeCombineBackward(loomMoeHandle_t handle, const void *grad_y,
                                             const void *expert_out, void *grad_expert_out,
                                             float *grad_weights)
{
    const char *call = "loomMoeCombineBackward";
    loomResult_t status;
    struct loomMoeHandle *h = started(call, handle, &status);
    if (h == NULL)
        return status;
    struct loomMoePlan *p = h->plan;
    need_buf(call, "grad_y", grad_y, h->num_tokens, "tokens", p->rank, &status);
    need_buf(call, "expert_out", expert_out, h->recv_slots, "slots", p->rank, &status);
    need_buf(call, "grad_expert_out", grad_expert_out, h->recv_slots, "slots", p->rank, &status);
    need_buf(call, "grad_weights", grad_weights, h->num_tokens, "tokens", p->rank, &status);
    /* grad_y goes out as dispatch sends x; the weight gradients come back one float32 per pair,
     * over the same segments reversed. */
    xfer_t out, back;
    memset(&back, 0, sizeof(back));
    loomResult_t res = xfer_init(call, p, 0, h->send_rows, h->recv_rows, p->row_bytes, &out);
    if (res == loomSuccess) {
        if (status == loomSuccess)
            pack_rows(h, grad_y, &out);
        res = xfer_run(call, p, &out, status, h->recv_rows);
    }
    if (res == loomSuccess) {
        xfer_count_bytes(p, &out);
        status = xfer_init(call, p, 1, h->recv_rows, h->send_rows, p->pairs_per_row * sizeof(float),
                           &back);
        if (status == loomSuccess) {
            pair_grads(h, &out, expert_out, grad_expert_out, &back);
            res = xfer_run(call, p, &back, status, h->send_rows);
        } else {
            res = status; /* out of memory for the segments: the peers will time out */
        }
    }
    if (res == loomSuccess) {
        scatter_weight_grads(h, &back, grad_weights);
        xfer_count_bytes(p, &back);
    }
    xfer_free(&out);
    xfer_free(&back);
    return res;
}
