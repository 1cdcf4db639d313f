/* SPDX-License-Identifier: Apache-2.0
 *
 * json.c - strict JSON reader for hand-written topology files, plus typed getters that name the
 * offending member, and the string writer that file dumps use. Input is untrusted: it is read
 * only within [0, len), nesting is bounded by LOOM_JSON_MAX_DEPTH (so the recursion is too),
 * and every error frees what was built. The error names a line and column because people fix
 * these files in an editor. Not a general JSON library: no streaming, no output of whole
 * documents, no lenient mode. Called by the topology file loader; fuzzed by
 * fuzz/fuzz_topo_json.c.
 */
#include "json.h"

#include <float.h>
#include <locale.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __GNUC__
#define LOOM_JSON_PRINTF(_f, _a) __attribute__((format(printf, _f, _a)))
#else
#define LOOM_JSON_PRINTF(_f, _a)
#endif

typedef struct {
    const unsigned char *p; /* the input, not NUL-terminated */
    size_t len;
    size_t pos; /* next byte to read */
    char *err;
    size_t errlen;
} parser_t;

// ---- errors

/* Line and column are computed only on failure, so the hot path does not count newlines. */
LOOM_JSON_PRINTF(3, 4)
static int fail(const parser_t *ps, size_t at, const char *fmt, ...)
{
    if (ps->err == NULL || ps->errlen == 0)
        return -1;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < ps->len; i++) {
        if (ps->p[i] == '\n') {
            line++;
            col = 1;
        } else if ((ps->p[i] & 0xC0) != 0x80) { /* continuation bytes share their column */
            col++;
        }
    }
    int k = snprintf(ps->err, ps->errlen, "line %zu, column %zu: ", line, col);
    if (k >= 0 && (size_t)k < ps->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->err + k, ps->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlongs, no surrogates, nothing
 * above U+10FFFF), or 0 if there is none within avail bytes. */
static size_t utf8_len(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t n;
    if (c < 0x80)
        return 1;
    if (c < 0xC2)
        return 0;
    if (c < 0xE0) {
        n = 2;
    } else if (c < 0xF0) {
        n = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c < 0xF5) {
        n = 4;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return 0;
    }
    if (avail < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t k = 2; k < n; k++)
        if ((s[k] & 0xC0) != 0x80)
            return 0;
    return n;
}

/* What sits at `at`, for "expected X, found Y" messages. */
static const char *describe(const parser_t *ps, size_t at, char *buf, size_t cap)
{
    if (at >= ps->len)
        return "the end of the input";
    unsigned char c = ps->p[at];
    size_t n = utf8_len(ps->p + at, ps->len - at);
    if (c < 0x20 || c == 0x7F)
        snprintf(buf, cap, "control character U+%04X", c);
    else if (n == 0)
        snprintf(buf, cap, "byte 0x%02X, which is not UTF-8", c);
    else
        snprintf(buf, cap, "'%.*s'", (int)n, (const char *)ps->p + at);
    return buf;
}

// ---- tree

static void free_contents(loom_json_t *v)
{
    if (v->type == LOOM_JSON_STRING) {
        free(v->string);
    } else if (v->type == LOOM_JSON_ARRAY || v->type == LOOM_JSON_OBJECT) {
        for (size_t i = 0; i < v->n; i++) {
            free_contents(&v->items[i]);
            if (v->keys != NULL)
                free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
    }
    memset(v, 0, sizeof(*v));
}

void loom_json_free(loom_json_t *v)
{
    if (v == NULL)
        return;
    free_contents(v);
    free(v);
}

/* Grows v->items (and v->keys for an object) to hold one more; geometric so n appends cost
 * O(n). The count never exceeds the input length, so the products cannot overflow. */
static int reserve(const parser_t *ps, loom_json_t *v, size_t *cap)
{
    if (v->n < *cap)
        return 0;
    size_t ncap = *cap == 0 ? 4 : *cap * 2;
    loom_json_t *items = realloc(v->items, ncap * sizeof(*items));
    if (items == NULL)
        return fail(ps, ps->pos, "out of memory");
    v->items = items;
    if (v->type == LOOM_JSON_OBJECT) {
        char **keys = realloc(v->keys, ncap * sizeof(*keys));
        if (keys == NULL)
            return fail(ps, ps->pos, "out of memory");
        v->keys = keys;
    }
    *cap = ncap;
    return 0;
}

/* Gives back the growth slack once a container is complete: 16 MiB of "[0,0,..." would
 * otherwise hold twice the ~450 MB its items need. Failure to shrink is harmless. */
static void shrink(loom_json_t *v)
{
    if (v->n == 0) {
        free(v->items);
        free(v->keys);
        v->items = NULL;
        v->keys = NULL;
        return;
    }
    loom_json_t *items = realloc(v->items, v->n * sizeof(*items));
    if (items != NULL)
        v->items = items;
    if (v->keys != NULL) {
        char **keys = realloc(v->keys, v->n * sizeof(*keys));
        if (keys != NULL)
            v->keys = keys;
    }
}

// ---- duplicate keys: an open-addressing set of key indices, so a big object stays O(n)

typedef struct {
    size_t *slot; /* index + 1 into keys, 0 = empty */
    size_t cap;   /* power of two, at least twice the count */
} keyset_t;

static uint64_t hash_key(const char *s)
{
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a, 64 bit */
    for (; *s != '\0'; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3u;
    return h;
}

static size_t *keyset_probe(const keyset_t *ks, char *const *keys, const char *key)
{
    size_t i = (size_t)hash_key(key) & (ks->cap - 1);
    while (ks->slot[i] != 0 && strcmp(keys[ks->slot[i] - 1], key) != 0)
        i = (i + 1) & (ks->cap - 1);
    return &ks->slot[i];
}

/* The slot where key is, or would go, among keys[0..n); NULL when out of memory. The caller
 * fills an empty slot with the key's index + 1 once the key is stored. */
static size_t *keyset_slot(keyset_t *ks, char *const *keys, size_t n, const char *key)
{
    if (2 * (n + 1) > ks->cap) {
        size_t ncap = ks->cap == 0 ? 16 : ks->cap * 2;
        size_t *slot = calloc(ncap, sizeof(*slot));
        if (slot == NULL)
            return NULL;
        free(ks->slot);
        ks->slot = slot;
        ks->cap = ncap;
        for (size_t i = 0; i < n; i++)
            *keyset_probe(ks, keys, keys[i]) = i + 1;
    }
    return keyset_probe(ks, keys, key);
}

// ---- scalars

/* The two-character escapes and what they stand for (\u is handled apart). */
static const char esc_from[] = "\"\\/bfnrt", esc_to[] = "\"\\/\b\f\n\r\t";

static void skip_ws(parser_t *ps)
{
    while (ps->pos < ps->len) {
        unsigned char c = ps->p[ps->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return;
        ps->pos++;
    }
}

static int hex4(const parser_t *ps, size_t at, unsigned *out)
{
    unsigned v = 0;
    if (ps->len - at < 4)
        return -1;
    for (size_t k = 0; k < 4; k++) {
        unsigned char c = ps->p[at + k];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

/* Decodes a \u escape (a surrogate pair takes two) at `at` into UTF-8 at o; returns the
 * number of input bytes consumed, or -1 after writing the error. */
static long unicode_escape(const parser_t *ps, size_t at, char *o, size_t *olen)
{
    unsigned cp, lo;
    if (hex4(ps, at + 2, &cp) != 0)
        return fail(ps, at, "invalid escape: \\u must be followed by 4 hex digits");
    long used = 6;
    if (cp == 0)
        return fail(ps, at, "\\u0000 is not allowed in a string");
    if (cp >= 0xDC00 && cp <= 0xDFFF)
        return fail(ps, at, "lone low surrogate \\u%04X", cp);
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (ps->len - at < 12 || ps->p[at + 6] != '\\' || ps->p[at + 7] != 'u' ||
            hex4(ps, at + 8, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
            return fail(ps, at, "lone high surrogate \\u%04X (needs a \\uDC00-\\uDFFF after it)",
                        cp);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        used = 12;
    }
    /* UTF-8: the lead byte carries the length and the top bits, continuations 6 bits each */
    static const unsigned char lead[] = {0, 0x00, 0xC0, 0xE0, 0xF0};
    size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (size_t k = n - 1; k > 0; k--, cp >>= 6)
        o[k] = (char)(0x80 | (cp & 0x3F));
    o[0] = (char)(lead[n] | cp);
    *olen = n;
    return used;
}

/* Parses the string whose opening quote is at ps->pos. Decoding never lengthens the text (an
 * escape of 2, 6 or 12 bytes yields 1-4), so a first pass to the closing quote sizes the one
 * allocation. */
static int parse_string(parser_t *ps, char **out, size_t *outlen)
{
    size_t open = ps->pos, end = open + 1;
    while (end < ps->len && ps->p[end] != '"')
        end += ps->p[end] == '\\' ? 2 : 1;
    char *s = malloc((end < ps->len ? end : ps->len) - open);
    if (s == NULL)
        return fail(ps, open, "out of memory");
    size_t o = 0, i = open + 1;
    for (;;) {
        if (i >= ps->len) {
            free(s);
            return fail(ps, open, "string is not closed before the end of the input");
        }
        unsigned char c = ps->p[i];
        if (c == '"')
            break;
        if (c < 0x20) {
            free(s);
            return fail(ps, i, "control character U+%04X in a string (escape it, e.g. \\n)", c);
        }
        if (c == '\\') {
            const char *e = i + 1 < ps->len ? strchr(esc_from, ps->p[i + 1]) : NULL;
            if (i + 1 < ps->len && ps->p[i + 1] == 'u') {
                size_t n = 0;
                long used = unicode_escape(ps, i, s + o, &n);
                if (used < 0) {
                    free(s);
                    return -1;
                }
                i += (size_t)used;
                o += n;
                continue;
            }
            if (e == NULL || *e == '\0') {
                char what[48];
                free(s);
                return fail(ps, i, "invalid escape: '\\' followed by %s",
                            describe(ps, i + 1, what, sizeof(what)));
            }
            s[o++] = esc_to[e - esc_from];
            i += 2;
            continue;
        }
        size_t n = utf8_len(ps->p + i, ps->len - i);
        if (n == 0) {
            free(s);
            return fail(ps, i, "invalid UTF-8 (byte 0x%02X) in a string", c);
        }
        memcpy(s + o, ps->p + i, n);
        o += n;
        i += n;
    }
    s[o] = '\0';
    ps->pos = i + 1;
    *out = s;
    *outlen = o;
    return 0;
}

/* strtod follows LC_NUMERIC; if the program set a locale whose decimal point is not '.', the
 * '.' is swapped for it. localeconv() is consulted only then, as it is not thread-safe. */
static int to_double(const char *text, size_t n, double *out)
{
    char small[80], *buf = small;
    const char *dp = ".";
    for (int attempt = 0; attempt < 2; attempt++) {
        size_t dpn = strlen(dp), need = n + dpn + 1;
        if (need > sizeof(small) && (buf = malloc(need)) == NULL)
            return -2;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            if (text[i] == '.') {
                memcpy(buf + m, dp, dpn);
                m += dpn;
            } else {
                buf[m++] = text[i];
            }
        }
        buf[m] = '\0';
        char *end;
        *out = strtod(buf, &end);
        int ok = end == buf + m;
        if (buf != small)
            free(buf);
        buf = small;
        if (ok)
            return 0;
        const char *ldp = localeconv()->decimal_point;
        if (memchr(text, '.', n) == NULL || ldp == NULL || ldp[0] == '\0' || strcmp(ldp, ".") == 0)
            break;
        dp = ldp;
    }
    return -1;
}

#define IS_DIGIT(_c) ((_c) >= '0' && (_c) <= '9')

/* RFC 8259 number grammar, checked here because strtod also takes hex, "inf", "nan", "+1",
 * ".5" and leading zeros. */
static int parse_number(parser_t *ps, loom_json_t *v)
{
    const unsigned char *p = ps->p;
    size_t start = ps->pos, i = start, len = ps->len;
    char what[48];
    if (p[i] == '-')
        i++;
    if (i >= len || !IS_DIGIT(p[i])) {
        if (i < len && (p[i] == 'I' || p[i] == 'N'))
            return fail(ps, start, "NaN and Infinity are not JSON numbers");
        return fail(ps, i, "expected a digit after '-', found %s",
                    describe(ps, i, what, sizeof(what)));
    }
    if (p[i] == '0') {
        if (++i < len && IS_DIGIT(p[i]))
            return fail(ps, start, "number has a leading zero");
    } else {
        while (i < len && IS_DIGIT(p[i]))
            i++;
    }
    if (i < len && p[i] == '.') {
        if (++i >= len || !IS_DIGIT(p[i]))
            return fail(ps, i, "expected a digit after the decimal point, found %s",
                        describe(ps, i, what, sizeof(what)));
        while (i < len && IS_DIGIT(p[i]))
            i++;
    }
    if (i < len && (p[i] == 'e' || p[i] == 'E')) {
        if (++i < len && (p[i] == '+' || p[i] == '-'))
            i++;
        if (i >= len || !IS_DIGIT(p[i]))
            return fail(ps, i, "expected a digit in the exponent, found %s",
                        describe(ps, i, what, sizeof(what)));
        while (i < len && IS_DIGIT(p[i]))
            i++;
    }
    double x;
    int rc = to_double((const char *)p + start, i - start, &x);
    if (rc == -2)
        return fail(ps, start, "out of memory");
    if (rc != 0)
        return fail(ps, start, "number %.*s could not be converted",
                    (int)(i - start > 40 ? 40 : i - start), (const char *)p + start);
    /* Tiny numbers underflow towards 0 (ERANGE too) and are kept: only overflow loses the
     * magnitude. */
    if (x > DBL_MAX || x < -DBL_MAX)
        return fail(ps, start, "number %.*s%s is out of the range of a double",
                    (int)(i - start > 40 ? 40 : i - start), (const char *)p + start,
                    i - start > 40 ? "..." : "");
    v->type = LOOM_JSON_NUMBER;
    v->number = x;
    ps->pos = i;
    return 0;
}

// ---- values

static int parse_value(parser_t *ps, loom_json_t *v, int depth);

/* At the opening '[' or '{' (after == NULL) or after a member (named by after): 1 if a member
 * follows, 0 once `close` is consumed, -1 on a missing or trailing comma. */
static int next_member(parser_t *ps, char close, const char *after)
{
    char what[48];
    if (after == NULL)
        ps->pos++;
    skip_ws(ps);
    if (ps->pos < ps->len && ps->p[ps->pos] == close) {
        ps->pos++;
        return 0;
    }
    if (after == NULL)
        return 1;
    if (ps->pos >= ps->len || ps->p[ps->pos] != ',')
        return fail(ps, ps->pos, "expected ',' or '%c' after %s, found %s", close, after,
                    describe(ps, ps->pos, what, sizeof(what)));
    ps->pos++;
    skip_ws(ps);
    if (ps->pos < ps->len && ps->p[ps->pos] == close)
        return fail(ps, ps->pos, "trailing comma before '%c'", close);
    return 1;
}

/* On any failure the container frees what it holds, so the caller sees an empty value. */
static int parse_array(parser_t *ps, loom_json_t *v, int depth)
{
    size_t cap = 0;
    int more;
    v->type = LOOM_JSON_ARRAY;
    for (more = next_member(ps, ']', NULL); more == 1;
         more = next_member(ps, ']', "an array element")) {
        if (reserve(ps, v, &cap) != 0)
            break;
        memset(&v->items[v->n], 0, sizeof(v->items[0]));
        if (parse_value(ps, &v->items[v->n], depth + 1) != 0)
            break;
        v->n++;
    }
    if (more != 0) {
        free_contents(v);
        return -1;
    }
    shrink(v);
    return 0;
}

/* Key text for messages: at most 40 bytes, cut at a character boundary. */
static int key_excerpt(const char *key)
{
    size_t n = strlen(key);
    if (n <= 40)
        return (int)n;
    n = 40;
    while (n > 0 && ((unsigned char)key[n] & 0xC0) == 0x80)
        n--;
    return (int)n;
}

/* One "key": value member, appended to v; the key is freed on failure. */
static int parse_member(parser_t *ps, loom_json_t *v, size_t *cap, keyset_t *seen, int depth)
{
    char what[48], *key;
    size_t klen, at = ps->pos;
    if (at >= ps->len || ps->p[at] != '"')
        return fail(ps, at, "expected a string key, found %s",
                    describe(ps, at, what, sizeof(what)));
    if (parse_string(ps, &key, &klen) != 0)
        return -1;
    size_t *slot = keyset_slot(seen, v->keys, v->n, key);
    if (slot == NULL)
        fail(ps, at, "out of memory");
    else if (*slot != 0)
        fail(ps, at, "duplicate key \"%.*s\"", key_excerpt(key), key);
    if (slot == NULL || *slot != 0)
        goto fail;
    skip_ws(ps);
    if (ps->pos >= ps->len || ps->p[ps->pos] != ':') {
        fail(ps, ps->pos, "expected ':' after the key \"%.*s\", found %s", key_excerpt(key), key,
             describe(ps, ps->pos, what, sizeof(what)));
        goto fail;
    }
    ps->pos++;
    skip_ws(ps);
    if (reserve(ps, v, cap) != 0)
        goto fail;
    memset(&v->items[v->n], 0, sizeof(v->items[0]));
    if (parse_value(ps, &v->items[v->n], depth + 1) != 0)
        goto fail;
    v->keys[v->n] = key;
    *slot = ++v->n;
    return 0;
fail:
    free(key);
    return -1;
}

static int parse_object(parser_t *ps, loom_json_t *v, int depth)
{
    size_t cap = 0;
    keyset_t seen = {NULL, 0};
    int more;
    v->type = LOOM_JSON_OBJECT;
    for (more = next_member(ps, '}', NULL); more == 1;
         more = next_member(ps, '}', "an object member"))
        if (parse_member(ps, v, &cap, &seen, depth) != 0)
            break;
    free(seen.slot);
    if (more != 0) {
        free_contents(v);
        return -1;
    }
    shrink(v);
    return 0;
}

static int literal(parser_t *ps, const char *word)
{
    size_t n = strlen(word);
    if (ps->len - ps->pos < n || memcmp(ps->p + ps->pos, word, n) != 0)
        return 0;
    ps->pos += n;
    return 1;
}

/* depth counts the arrays and objects around v; recursion is at most 2 frames per level. */
static int parse_value(parser_t *ps, loom_json_t *v, int depth)
{
    char what[48];
    if (ps->pos >= ps->len)
        return fail(ps, ps->pos, "expected a value, found the end of the input");
    unsigned char c = ps->p[ps->pos];
    switch (c) {
    case '[':
    case '{':
        if (depth >= LOOM_JSON_MAX_DEPTH)
            return fail(ps, ps->pos, "arrays and objects nested deeper than %d",
                        LOOM_JSON_MAX_DEPTH);
        return c == '[' ? parse_array(ps, v, depth) : parse_object(ps, v, depth);
    case '"':
        if (parse_string(ps, &v->string, &v->len) != 0)
            return -1;
        v->type = LOOM_JSON_STRING;
        return 0;
    case 't':
    case 'f':
        if (literal(ps, c == 't' ? "true" : "false")) {
            v->type = LOOM_JSON_BOOL;
            v->boolean = c == 't';
            return 0;
        }
        return fail(ps, ps->pos, "invalid literal: expected %s", c == 't' ? "true" : "false");
    case 'n':
        if (literal(ps, "null")) {
            v->type = LOOM_JSON_NULL;
            return 0;
        }
        return fail(ps, ps->pos, "invalid literal: expected null");
    case 'N':
    case 'I':
        return fail(ps, ps->pos, "NaN and Infinity are not JSON numbers");
    case '+':
    case '.':
        return fail(ps, ps->pos, "a JSON number starts with '-' or a digit, not '%c'", c);
    default:
        if (c == '-' || IS_DIGIT(c))
            return parse_number(ps, v);
        break;
    }
    return fail(ps, ps->pos, "expected a value, found %s",
                describe(ps, ps->pos, what, sizeof(what)));
}

int loom_json_parse(const char *text, size_t len, loom_json_t **out, char *err, size_t errlen)
{
    parser_t ps = {(const unsigned char *)text, len, 0, err, errlen};
    char what[48];
    if (out == NULL)
        return -1;
    *out = NULL;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (text == NULL)
        ps.len = 0;
    if (len > LOOM_JSON_MAX_BYTES) {
        ps.len = 0; /* nothing to count lines over */
        return fail(&ps, 0, "input is %zu bytes, more than the limit of %u", len,
                    (unsigned)LOOM_JSON_MAX_BYTES);
    }
    if (ps.len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        return fail(&ps, 0, "byte order mark at the start: save the file as UTF-8 without one");
    loom_json_t *root = calloc(1, sizeof(*root));
    if (root == NULL)
        return fail(&ps, 0, "out of memory");
    skip_ws(&ps);
    if (parse_value(&ps, root, 0) != 0) {
        free(root);
        return -1;
    }
    skip_ws(&ps);
    if (ps.pos != ps.len) {
        fail(&ps, ps.pos, "unexpected %s after the value",
             describe(&ps, ps.pos, what, sizeof(what)));
        loom_json_free(root);
        return -1;
    }
    *out = root;
    return 0;
}

// ---- lookups

const loom_json_t *loom_json_get(const loom_json_t *v, const char *key)
{
    if (v == NULL || key == NULL || v->type != LOOM_JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0)
            return &v->items[i];
    return NULL;
}

static const char *type_name(const loom_json_t *v)
{
    static const char *const names[] = {"null",     "a boolean", "a number",
                                        "a string", "an array",  "an object"};
    return names[v->type];
}

LOOM_JSON_PRINTF(3, 4)
static int getter_fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* The member, or NULL after writing "<path>: expected <what>, ..." to err. */
static const loom_json_t *member(const loom_json_t *obj, const char *key, loom_json_type_t type,
                                 const char *what, const char **pathp, char *err, size_t errlen)
{
    if (*pathp == NULL)
        *pathp = key != NULL ? key : "(null)";
    const char *path = *pathp;
    if (obj == NULL || obj->type != LOOM_JSON_OBJECT) {
        getter_fail(err, errlen, "%s: expected %s, but its parent is %s, not an object", path, what,
                    obj == NULL ? "missing" : type_name(obj));
        return NULL;
    }
    const loom_json_t *v = loom_json_get(obj, key);
    if (v == NULL) {
        getter_fail(err, errlen, "%s: expected %s, but it is missing", path, what);
        return NULL;
    }
    if (v->type != type) {
        getter_fail(err, errlen, "%s: expected %s, found %s", path, what, type_name(v));
        return NULL;
    }
    return v;
}

/* Shortest of %.15g..%.17g that reads back as x, so 0.1 prints as 0.1 yet distinct values
 * never print alike. */
static const char *fmt_num(double x, char *buf, size_t cap)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    return buf;
}

int loom_json_get_int(const loom_json_t *obj, const char *key, long long min, long long max,
                      long long *out, const char *path, char *err, size_t errlen)
{
    char what[96], num[40];
    snprintf(what, sizeof(what), "an integer in [%lld, %lld]", min, max);
    const loom_json_t *v = member(obj, key, LOOM_JSON_NUMBER, what, &path, err, errlen);
    if (v == NULL)
        return -1;
    double x = v->number;
    const double exact = 9007199254740992.0; /* 2^53 */
    if (x > exact || x < -exact)
        return getter_fail(err, errlen,
                           "%s: expected %s, found %s, beyond 2^53 where doubles do "
                           "not hold every integer",
                           path, what, fmt_num(x, num, sizeof(num)));
    long long i = (long long)x;
    if ((double)i != x)
        return getter_fail(err, errlen, "%s: expected %s, found %s, which is not an integer", path,
                           what, fmt_num(x, num, sizeof(num)));
    if (i < min || i > max)
        return getter_fail(err, errlen, "%s: expected %s, found %lld", path, what, i);
    *out = i;
    return 0;
}

int loom_json_get_num(const loom_json_t *obj, const char *key, double min, double max, double *out,
                      const char *path, char *err, size_t errlen)
{
    char what[96], a[40], b[40], num[40];
    snprintf(what, sizeof(what), "a number in [%s, %s]", fmt_num(min, a, sizeof(a)),
             fmt_num(max, b, sizeof(b)));
    const loom_json_t *v = member(obj, key, LOOM_JSON_NUMBER, what, &path, err, errlen);
    if (v == NULL)
        return -1;
    if (!(v->number >= min && v->number <= max))
        return getter_fail(err, errlen, "%s: expected %s, found %s", path, what,
                           fmt_num(v->number, num, sizeof(num)));
    *out = v->number;
    return 0;
}

int loom_json_get_str(const loom_json_t *obj, const char *key, const char **out, const char *path,
                      char *err, size_t errlen)
{
    const loom_json_t *v = member(obj, key, LOOM_JSON_STRING, "a string", &path, err, errlen);
    if (v == NULL)
        return -1;
    *out = v->string;
    return 0;
}

// ---- writing

void loom_json_write_string(FILE *f, const char *s)
{
    if (s == NULL) {
        fputs("null", f);
        return;
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        const char *e = c != '/' && c != '\0' ? strchr(esc_to, c) : NULL;
        if (e != NULL) {
            fputc('\\', f);
            fputc(esc_from[e - esc_to], f);
            i++;
        } else if (c < 0x20) {
            fprintf(f, "\\u%04X", c);
            i++;
        } else {
            size_t k = utf8_len(u + i, n - i);
            if (k == 0) {
                fputs("\\ufffd", f);
                i++;
            } else {
                fwrite(u + i, 1, k, f);
                i += k;
            }
        }
    }
    fputc('"', f);
}
