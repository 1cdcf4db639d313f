/* SPDX-License-Identifier: Apache-2.0
 *
 * data.c - the byte-level corpus: a text file split into a training head and a validation tail,
 * and the batches drawn from it. Sequence g of step s starts at an offset that depends on (seed,
 * s, g) only, so every parallel layout trains on the same global batches and a resumed run on
 * the batches it would have seen.
 */
#include "train.h"

#include <stdio.h>
#include <stdlib.h>

int corpus_load(corpus_t *cp, const char *path, double val_frac, int ctx, char *err, size_t n)
{
    cp->bytes = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, n, "cannot open the corpus %s", path);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            snprintf(err, n, "out of memory reading %s", path);
            return -1;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (len < cap)
            break;
        uint8_t *nb = realloc(buf, cap * 2);
        if (!nb)
            free(buf);
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    size_t val = (size_t)((double)len * val_frac);
    if (len < 4 * (size_t)ctx + 4 || len - val < 2 * (size_t)ctx + 2 || val < (size_t)ctx + 2) {
        free(buf);
        snprintf(err, n, "the corpus %s (%zu bytes) is too small for sequences of %d", path, len,
                 ctx);
        return -1;
    }
    cp->bytes = buf;
    cp->len = len;
    cp->train_len = len - val;
    return 0;
}

void corpus_free(corpus_t *cp)
{
    free(cp->bytes);
    cp->bytes = NULL;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

size_t corpus_start(const corpus_t *cp, const opts_t *o, uint64_t step, uint64_t g, int val)
{
    size_t T = (size_t)o->model.ctx;
    if (val) {
        /* validation windows: spread over the tail, the same every time */
        size_t span = cp->len - cp->train_len - T - 1;
        uint64_t k = step * (uint64_t)o->batch + g;
        return cp->train_len + (size_t)((k * 7919u) % (span + 1));
    }
    size_t span = cp->train_len - T - 1;
    return (size_t)(mix(o->model.seed ^ mix(step * 0x100000001b3ull + g)) % (span + 1));
}

void corpus_fill(const corpus_t *cp, const opts_t *o, const stage_t *s, mb_acts_t *a, uint64_t step,
                 int seq0, int val)
{
    int me = s->lay->g.cp_i;
    a->seq0 = seq0;
    for (int b = 0; b < a->nseq; b++) {
        size_t start = corpus_start(cp, o, step, (uint64_t)(seq0 + b), val);
        for (int j = 0; j < a->tl; j++) {
            int p = s->cppos[me][j];
            size_t r = (size_t)b * (size_t)a->tl + (size_t)j;
            a->tok[r] = cp->bytes[start + (size_t)p];
            a->tgt[r] = cp->bytes[start + (size_t)p + 1];
            a->pos[r] = p;
        }
    }
}

int corpus_dump_batch(const corpus_t *cp, const opts_t *o, uint64_t step, const char *path)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = 1;
    for (int pass = 0; pass < 2; pass++)
        for (int g = 0; g < o->batch; g++)
            ok &= fwrite(cp->bytes + corpus_start(cp, o, step, (uint64_t)g, 0) + pass, 1,
                         (size_t)o->model.ctx, f) == (size_t)o->model.ctx;
    return fclose(f) == 0 && ok ? 0 : -1;
}
