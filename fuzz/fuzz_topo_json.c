/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_topo_json.c - libFuzzer harness for the topology JSON reader (src/topology/json.c).
 * Every input is parsed from libFuzzer's exact-size buffer (a read past len is an ASan
 * error); a refusal must leave no tree and a "line L, column C: ..." message that a short
 * buffer truncates. An accepted tree must keep the header's promises (depth, unique keys,
 * NUL-free valid UTF-8, finite numbers), agree with the typed getters, and survive being
 * written back out (loom_json_write_string for strings and keys) and parsed again unchanged.
 * The input, cut at its first NUL, also goes through loom_json_write_string and back.
 * Built by fuzz/run.sh with json.c.
 */
#include <float.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/topology/json.h"
#include "fuzz_check.h"

/* A second UTF-8 check, written differently from json.c's (decode, then range-check), so the
 * two must agree. */
static int valid_utf8(const unsigned char *s, size_t n)
{
    static const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            k = 1, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3, cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if (cp < least[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k + 1;
    }
    return 1;
}

static void check_string(const char *s, size_t len)
{
    REQUIRE(s != NULL && strlen(s) == len);
    REQUIRE(valid_utf8((const unsigned char *)s, len));
}

/* The getters must agree with the member's type and value. */
static void check_getters(const loom_json_t *obj, size_t i)
{
    const loom_json_t *v = &obj->items[i];
    const char *key = obj->keys[i], *s = NULL;
    char err[96];
    long long ll = 0;
    double d = 0;
    int rc = loom_json_get_str(obj, key, &s, "p.k", err, sizeof(err));
    REQUIRE((rc == 0) == (v->type == LOOM_JSON_STRING));
    REQUIRE(rc == 0 ? s == v->string : strncmp(err, "p.k: expected", 13) == 0);
    rc = loom_json_get_num(obj, key, -DBL_MAX, DBL_MAX, &d, "p.k", err, sizeof(err));
    REQUIRE((rc == 0) == (v->type == LOOM_JSON_NUMBER));
    REQUIRE(rc != 0 || d == v->number);
    REQUIRE(loom_json_get_num(obj, key, 1, 0, &d, NULL, err, sizeof(err)) == -1);
    REQUIRE(strncmp(err, key, strlen(key) < 40 ? strlen(key) : 40) == 0); /* path defaults */
    rc = loom_json_get_int(obj, key, LLONG_MIN, LLONG_MAX, &ll, "p.k", err, sizeof(err));
    if (v->type != LOOM_JSON_NUMBER) {
        REQUIRE(rc == -1);
    } else {
        double x = v->number;
        int exact =
            x >= -9007199254740992.0 && x <= 9007199254740992.0 && (double)(long long)x == x;
        REQUIRE((rc == 0) == exact);
        REQUIRE(rc != 0 || (double)ll == x);
        if (exact) { /* a range that excludes it must refuse it */
            REQUIRE(loom_json_get_int(obj, key, ll + 1, LLONG_MAX, &ll, "p.k", err, 8) == -1);
            REQUIRE(strlen(err) == 7);
        }
    }
}

static void check_tree(const loom_json_t *v, int depth)
{
    REQUIRE(depth <= LOOM_JSON_MAX_DEPTH);
    switch (v->type) {
    case LOOM_JSON_NULL:
        break;
    case LOOM_JSON_BOOL:
        REQUIRE(v->boolean == 0 || v->boolean == 1);
        break;
    case LOOM_JSON_NUMBER:
        REQUIRE(v->number >= -DBL_MAX && v->number <= DBL_MAX);
        break;
    case LOOM_JSON_STRING:
        check_string(v->string, v->len);
        break;
    case LOOM_JSON_ARRAY:
    case LOOM_JSON_OBJECT:
        REQUIRE(depth < LOOM_JSON_MAX_DEPTH);
        REQUIRE(v->n == 0 || v->items != NULL);
        for (size_t i = 0; i < v->n; i++) {
            check_tree(&v->items[i], depth + 1);
            if (v->type == LOOM_JSON_OBJECT) {
                check_string(v->keys[i], strlen(v->keys[i]));
                REQUIRE(loom_json_get(v, v->keys[i]) == &v->items[i]); /* keys are unique */
                check_getters(v, i);
            }
        }
        break;
    default:
        REQUIRE(0);
    }
}

static void write_tree(FILE *f, const loom_json_t *v)
{
    switch (v->type) {
    case LOOM_JSON_NULL:
        fputs("null", f);
        break;
    case LOOM_JSON_BOOL:
        fputs(v->boolean ? "true" : "false", f);
        break;
    case LOOM_JSON_NUMBER:
        fprintf(f, "%.17g", v->number);
        break;
    case LOOM_JSON_STRING:
        loom_json_write_string(f, v->string);
        break;
    default:
        fputc(v->type == LOOM_JSON_ARRAY ? '[' : '{', f);
        for (size_t i = 0; i < v->n; i++) {
            if (i > 0)
                fputc(',', f);
            if (v->type == LOOM_JSON_OBJECT) {
                loom_json_write_string(f, v->keys[i]);
                fputc(':', f);
            }
            write_tree(f, &v->items[i]);
        }
        fputc(v->type == LOOM_JSON_ARRAY ? ']' : '}', f);
    }
}

static int same(const loom_json_t *a, const loom_json_t *b)
{
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case LOOM_JSON_NULL:
        return 1;
    case LOOM_JSON_BOOL:
        return a->boolean == b->boolean;
    case LOOM_JSON_NUMBER:
        return a->number == b->number;
    case LOOM_JSON_STRING:
        return a->len == b->len && memcmp(a->string, b->string, a->len) == 0;
    default:
        if (a->n != b->n)
            return 0;
        for (size_t i = 0; i < a->n; i++) {
            if (a->type == LOOM_JSON_OBJECT && strcmp(a->keys[i], b->keys[i]) != 0)
                return 0;
            if (!same(&a->items[i], &b->items[i]))
                return 0;
        }
        return 1;
    }
}

/* Parses what f's buffer holds once closed; the text is copied to an exact-size buffer. */
static loom_json_t *reparse(FILE *f, char **buf, size_t *len)
{
    REQUIRE(fclose(f) == 0);
    char *exact = malloc(*len);
    REQUIRE(exact != NULL);
    memcpy(exact, *buf, *len);
    free(*buf);
    *buf = NULL;
    loom_json_t *v = NULL;
    char err[160];
    int rc = loom_json_parse(exact, *len, &v, err, sizeof(err));
    REQUIRE(rc == 0 && v != NULL);
    free(exact);
    return v;
}

static void fuzz_write_string(const uint8_t *data, size_t size)
{
    size_t n = strnlen((const char *)data, size);
    char *s = malloc(n + 1), *out = NULL;
    size_t outlen = 0;
    FILE *f = open_memstream(&out, &outlen);
    if (s == NULL || f == NULL) {
        free(s);
        if (f != NULL)
            fclose(f);
        free(out);
        return;
    }
    memcpy(s, data, n);
    s[n] = '\0';
    loom_json_write_string(f, s);
    loom_json_t *v = reparse(f, &out, &outlen);
    REQUIRE(v->type == LOOM_JSON_STRING);
    if (valid_utf8((const unsigned char *)s, n))
        REQUIRE(v->len == n && memcmp(v->string, s, n) == 0);
    else
        REQUIRE(strstr(v->string, "\xEF\xBF\xBD") != NULL);
    loom_json_free(v);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static loom_json_t sentinel;
    loom_json_t *v = &sentinel; /* must be overwritten either way */
    char err[160];
    int rc = loom_json_parse((const char *)data, size, &v, err, sizeof(err));
    if (rc != 0) {
        REQUIRE(rc == -1 && v == NULL);
        REQUIRE(memchr(err, '\0', sizeof(err)) != NULL && strncmp(err, "line ", 5) == 0);
        char small[24];
        size_t cap = 1 + size % sizeof(small);
        REQUIRE(loom_json_parse((const char *)data, size, &v, small, cap) == -1);
        REQUIRE(strlen(small) < cap && strncmp(small, err, strlen(small)) == 0);
    } else {
        REQUIRE(rc == 0 && v != NULL);
        check_tree(v, 0);
        /* a key no object holds, as keys are valid UTF-8 */
        const char *s;
        REQUIRE(loom_json_get(v, "\xFF") == NULL);
        REQUIRE(loom_json_get_str(v, "\xFF", &s, "root", err, sizeof(err)) == -1);
        REQUIRE(strstr(err, v->type == LOOM_JSON_OBJECT ? "missing" : "not an object") != NULL);
        char *out = NULL;
        size_t outlen = 0;
        FILE *f = open_memstream(&out, &outlen);
        if (f != NULL) {
            write_tree(f, v);
            loom_json_t *again = reparse(f, &out, &outlen);
            REQUIRE(same(v, again));
            loom_json_free(again);
        }
        loom_json_free(v);
    }
    fuzz_write_string(data, size);
    return 0;
}
