/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_route.c - the rule language of LOOM_NCCL_ROUTE (docs/nccl-plugins.md, "Routing rules")
 * and the per-call decision of the drop-in NCCL library. Parsing is strict: an unknown key or
 * value, a bad number or an empty rule fails with a message naming the rule, because a rule that
 * silently matched nothing would send calls somewhere the user did not ask for. The decision
 * reads only the call's description and the parsed rules (no globals but the immutable
 * defaults), so every rank decides alike and any thread may call it.
 */
#include <ctype.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_route.h"

/* Keys in canonical order; a rule's `has` holds one bit per key it names. */
enum { K_COLL, K_DTYPE, K_OP, K_BYTES, K_NRANKS, K_HOSTS, K_NAME, K_NUM };
static const char *const key_names[K_NUM] = {"coll",   "dtype", "op",  "bytes",
                                             "nranks", "hosts", "name"};

/* The op condition's values: NCCL's built-in ops by their enum value, then every PreMulSum op. */
#define OP_PREMULSUM 5
#define NUM_OPS      6

typedef struct {
    uint64_t lo, hi; /* inclusive */
} range_t;

typedef struct {
    unsigned has;    /* 1 << K_*: the keys this rule names; the others match every call */
    uint32_t colls;  /* 1 << shim_coll_t */
    uint32_t dtypes; /* 1 << ncclDataType_t */
    uint32_t ops;    /* 1 << ncclRedOp_t, bit OP_PREMULSUM for created ops */
    range_t bytes, nranks, hosts;
    const char *name; /* glob on commName (fnmatch) */
    shim_target_t target;
    const char *text; /* canonical form */
} rule_t;

struct shim_rules {
    int n;
    const rule_t *rule;
    const char *text; /* canonical form of the whole list */
    int owned;        /* 0 for the built-in defaults, which are never freed */
};

/* ---- names ---------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int value;
} alias_t;

/* The first spelling of each value is its canonical one. */
static const alias_t coll_aliases[] = {
    {"allreduce", SHIM_COLL_ALLREDUCE},
    {"allgather", SHIM_COLL_ALLGATHER},
    {"reducescatter", SHIM_COLL_REDUCESCATTER},
    {"broadcast", SHIM_COLL_BROADCAST},
    {"bcast", SHIM_COLL_BROADCAST},
    {"reduce", SHIM_COLL_REDUCE},
    {"alltoall", SHIM_COLL_ALLTOALL},
    {"gather", SHIM_COLL_GATHER},
    {"scatter", SHIM_COLL_SCATTER},
    {"send", SHIM_COLL_SEND},
    {"recv", SHIM_COLL_RECV},
};
static const alias_t dtype_aliases[] = {
    {"int8", ncclInt8},
    {"char", ncclInt8},
    {"uint8", ncclUint8},
    {"int32", ncclInt32},
    {"int", ncclInt32},
    {"uint32", ncclUint32},
    {"int64", ncclInt64},
    {"uint64", ncclUint64},
    {"fp16", ncclFloat16},
    {"f16", ncclFloat16},
    {"half", ncclFloat16},
    {"float16", ncclFloat16},
    {"fp32", ncclFloat32},
    {"f32", ncclFloat32},
    {"float", ncclFloat32},
    {"float32", ncclFloat32},
    {"fp64", ncclFloat64},
    {"f64", ncclFloat64},
    {"double", ncclFloat64},
    {"float64", ncclFloat64},
    {"bf16", ncclBfloat16},
    {"bfloat16", ncclBfloat16},
    {"fp8e4m3", ncclFloat8e4m3},
    {"e4m3", ncclFloat8e4m3},
    {"float8e4m3", ncclFloat8e4m3},
    {"fp8e5m2", ncclFloat8e5m2},
    {"e5m2", ncclFloat8e5m2},
    {"float8e5m2", ncclFloat8e5m2},
};
static const alias_t op_aliases[] = {
    {"sum", ncclSum},
    {"prod", ncclProd},
    {"max", ncclMax},
    {"min", ncclMin},
    {"avg", ncclAvg},
    {"premulsum", OP_PREMULSUM},
    {"premul_sum", OP_PREMULSUM},
};
static const alias_t target_aliases[] = {
    {"nccl", SHIM_TO_NCCL},
    {"loom", SHIM_TO_LOOM},
    {"echo", SHIM_TO_ECHO},
};
#define NALIASES(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *canonical(const alias_t *a, int n, int value)
{
    for (int i = 0; i < n; i++)
        if (a[i].value == value)
            return a[i].name;
    return "?";
}

static int lookup(const alias_t *a, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(a[i].name) == len && strncasecmp(a[i].name, s, len) == 0)
            return a[i].value;
    return -1;
}

const char *shim_target_name(shim_target_t target)
{
    return canonical(target_aliases, NALIASES(target_aliases), (int)target);
}

const char *shim_coll_name(shim_coll_t coll)
{
    return canonical(coll_aliases, NALIASES(coll_aliases), (int)coll);
}

const char *shim_dtype_name(ncclDataType_t datatype)
{
    return canonical(dtype_aliases, NALIASES(dtype_aliases), (int)datatype);
}

const char *shim_op_name(int op)
{
    if (op < 0)
        return "none";
    return canonical(op_aliases, NALIASES(op_aliases), op >= ncclNumOps ? OP_PREMULSUM : op);
}

/* ---- the built-in defaults ------------------------------------------------------------------ */

#define DEFAULT_CONDITIONS "coll=allreduce dtype=fp16,bf16 op=sum bytes>=1M nranks=2-8 hosts=1"
#define DEFAULT_RULE(_target, _name)                                                               \
    {                                                                                              \
        .has = (1u << K_COLL) | (1u << K_DTYPE) | (1u << K_OP) | (1u << K_BYTES) |                 \
               (1u << K_NRANKS) | (1u << K_HOSTS),                                                 \
        .colls = 1u << SHIM_COLL_ALLREDUCE, .dtypes = (1u << ncclFloat16) | (1u << ncclBfloat16),  \
        .ops = 1u << ncclSum, .bytes = {1u << 20, UINT64_MAX}, .nranks = {2, 8}, .hosts = {1, 1},  \
        .target = (_target), .text = DEFAULT_CONDITIONS " -> " _name                               \
    }
static const rule_t default_rule_loom = DEFAULT_RULE(SHIM_TO_LOOM, "loom");
static const rule_t default_rule_echo = DEFAULT_RULE(SHIM_TO_ECHO, "echo");
static const shim_rules_t default_rules[2] = {
    {1, &default_rule_loom, DEFAULT_CONDITIONS " -> loom", 0},
    {1, &default_rule_echo, DEFAULT_CONDITIONS " -> echo", 0},
};

const shim_rules_t *shim_rules_default(int echo)
{
    return &default_rules[echo ? 1 : 0];
}

/* ---- parsing -------------------------------------------------------------------------------- */

typedef struct {
    char *err;
    size_t errlen;
    int index;        /* 1-based rule number */
    const char *rule; /* the rule's text, trimmed */
    size_t rule_len;
} perr_t;

/* Writes "rule N (`<rule>`): <message>" and returns ncclInvalidArgument. */
__attribute__((format(printf, 2, 3))) static ncclResult_t fail(const perr_t *p, const char *fmt,
                                                               ...)
{
    if (p->err == NULL || p->errlen == 0)
        return ncclInvalidArgument;
    const int show = p->rule_len > 80 ? 77 : (int)p->rule_len;
    int n = snprintf(p->err, p->errlen, "rule %d (`%.*s%s`): ", p->index, show, p->rule,
                     p->rule_len > 80 ? "..." : "");
    if (n >= 0 && (size_t)n < p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return ncclInvalidArgument;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static void trim(const char **s, size_t *len)
{
    while (*len > 0 && is_space(**s)) {
        (*s)++;
        (*len)--;
    }
    while (*len > 0 && is_space((*s)[*len - 1]))
        (*len)--;
}

/* A comma list of names (or `*`) into a bit mask; 0 for `*`. */
static ncclResult_t parse_list(const perr_t *p, const char *key, const alias_t *a, int na,
                               const char *what, const char *v, size_t len, uint32_t *mask)
{
    *mask = 0;
    if (len == 1 && v[0] == '*')
        return ncclSuccess;
    size_t i = 0;
    while (i <= len) {
        size_t j = i;
        while (j < len && v[j] != ',')
            j++;
        if (j == i)
            return fail(p, "empty item in %s=%.*s", key, (int)len, v);
        if (j - i == 1 && v[i] == '*')
            return fail(p, "* cannot be combined with other values in %s=%.*s", key, (int)len, v);
        int value = lookup(a, na, v + i, j - i);
        if (value < 0) {
            char known[256] = "";
            size_t used = 0;
            for (int k = 0; k < na; k++) {
                /* aliases are listed after their canonical spelling */
                if (k > 0 && a[k - 1].value == a[k].value)
                    continue;
                int w = snprintf(known + used, sizeof(known) - used, "%s, ", a[k].name);
                if (w < 0 || (size_t)w >= sizeof(known) - used)
                    break;
                used += (size_t)w;
            }
            return fail(p, "unknown %s '%.*s' in %s= (one of %s*)", what, (int)(j - i), v + i, key,
                        known);
        }
        *mask |= 1u << value;
        i = j + 1;
    }
    return ncclSuccess;
}

/* A non-negative decimal integer, with a binary K/M/G suffix when suffix is set. */
static ncclResult_t parse_number(const perr_t *p, const char *key, const char *s, size_t len,
                                 int suffix, uint64_t max, uint64_t *out)
{
    size_t i = 0;
    uint64_t v = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9') {
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return fail(p, "number '%.*s' in %s is too large", (int)len, s, key);
        v = v * 10 + d;
        i++;
    }
    if (i == 0)
        return fail(p, "'%.*s' in %s is not a number%s", (int)len, s, key,
                    suffix ? " (digits, optionally followed by K, M or G)" : "");
    if (suffix && i + 1 == len) {
        int shift = 0;
        switch (s[i]) {
        case 'k':
        case 'K':
            shift = 10;
            break;
        case 'm':
        case 'M':
            shift = 20;
            break;
        case 'g':
        case 'G':
            shift = 30;
            break;
        default:
            break;
        }
        if (shift) {
            if (v > (UINT64_MAX >> shift))
                return fail(p, "number '%.*s' in %s is too large", (int)len, s, key);
            v <<= shift;
            i++;
        }
    }
    if (i != len)
        return fail(p, "'%.*s' in %s is not a number%s", (int)len, s, key,
                    suffix ? " (digits, optionally followed by K, M or G)" : "");
    if (v > max)
        return fail(p, "number '%.*s' in %s is too large (at most %llu)", (int)len, s, key,
                    (unsigned long long)max);
    *out = v;
    return ncclSuccess;
}

/* `*`, N, A-B, >=N, <=N, >N or <N; *any is set when the range holds every value. */
static ncclResult_t parse_range(const perr_t *p, const char *key, const char *v, size_t len,
                                int suffix, uint64_t max, range_t *r, int *any)
{
    ncclResult_t rc;
    r->lo = 0;
    r->hi = max;
    *any = 0;
    if (len == 1 && v[0] == '*') {
        *any = 1;
        return ncclSuccess;
    }
    if (len > 0 && (v[0] == '<' || v[0] == '>')) {
        const int ge = v[0] == '>';
        const int eq = len > 1 && v[1] == '=';
        const size_t skip = eq ? 2 : 1;
        uint64_t n = 0;
        if ((rc = parse_number(p, key, v + skip, len - skip, suffix, max, &n)) != ncclSuccess)
            return rc;
        if (ge) {
            if (!eq && n == max)
                return fail(p, "%s%.*s matches nothing", key, (int)len, v);
            r->lo = eq ? n : n + 1;
        } else {
            if (!eq && n == 0)
                return fail(p, "%s%.*s matches nothing", key, (int)len, v);
            r->hi = eq ? n : n - 1;
        }
    } else {
        const char *dash = memchr(v, '-', len);
        if (dash) {
            size_t a = (size_t)(dash - v);
            if ((rc = parse_number(p, key, v, a, suffix, max, &r->lo)) != ncclSuccess ||
                (rc = parse_number(p, key, dash + 1, len - a - 1, suffix, max, &r->hi)) !=
                    ncclSuccess)
                return rc;
            if (r->lo > r->hi)
                return fail(p, "%s=%.*s is an empty range (the low end comes first)", key, (int)len,
                            v);
        } else {
            if ((rc = parse_number(p, key, v, len, suffix, max, &r->lo)) != ncclSuccess)
                return rc;
            r->hi = r->lo;
        }
    }
    *any = r->lo == 0 && r->hi == max;
    return ncclSuccess;
}

static ncclResult_t parse_condition(const perr_t *p, const char *t, size_t len, rule_t *rule,
                                    unsigned *seen, char **name_out)
{
    size_t k = 0;
    while (k < len && t[k] != '=' && t[k] != '<' && t[k] != '>')
        k++;
    if (k == len)
        return fail(p, "'%.*s' is not key=value", (int)len, t);
    int key = -1;
    for (int i = 0; i < K_NUM; i++)
        if (strlen(key_names[i]) == k && strncasecmp(key_names[i], t, k) == 0)
            key = i;
    if (key < 0)
        return fail(p, "unknown key '%.*s' (one of coll, dtype, op, bytes, nranks, hosts, name)",
                    (int)k, t);
    const int numeric = key == K_BYTES || key == K_NRANKS || key == K_HOSTS;
    const char *v = t[k] == '=' ? t + k + 1 : t + k;
    size_t vlen = len - (size_t)(v - t);
    if (t[k] != '=' && !numeric)
        return fail(p, "'%.*s': %s takes key=value", (int)len, t, key_names[key]);
    if (*seen & (1u << key))
        return fail(p, "%s given twice", key_names[key]);
    *seen |= 1u << key;
    if (vlen == 0)
        return fail(p, "no value after %s=", key_names[key]);

    ncclResult_t rc = ncclSuccess;
    int any = 0;
    switch (key) {
    case K_COLL:
        rc = parse_list(p, "coll", coll_aliases, NALIASES(coll_aliases), "collective", v, vlen,
                        &rule->colls);
        any = rule->colls == 0;
        break;
    case K_DTYPE:
        rc = parse_list(p, "dtype", dtype_aliases, NALIASES(dtype_aliases), "datatype", v, vlen,
                        &rule->dtypes);
        any = rule->dtypes == 0;
        break;
    case K_OP:
        rc = parse_list(p, "op", op_aliases, NALIASES(op_aliases), "op", v, vlen, &rule->ops);
        any = rule->ops == 0;
        break;
    case K_BYTES:
        rc = parse_range(p, "bytes", v, vlen, 1, SIZE_MAX, &rule->bytes, &any);
        break;
    case K_NRANKS:
        rc = parse_range(p, "nranks", v, vlen, 0, INT_MAX, &rule->nranks, &any);
        break;
    case K_HOSTS:
        rc = parse_range(p, "hosts", v, vlen, 0, INT_MAX, &rule->hosts, &any);
        break;
    case K_NAME:
        if (vlen == 1 && v[0] == '*') {
            any = 1;
        } else {
            *name_out = strndup(v, vlen);
            if (*name_out == NULL)
                return ncclSystemError;
        }
        break;
    default:
        break;
    }
    if (rc == ncclSuccess && !any)
        rule->has |= 1u << key;
    return rc;
}

/* ---- canonical text ------------------------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} sbuf_t;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->buf ? b->buf + b->len : NULL, b->buf ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->buf && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 128) + (size_t)n;
        char *nb = realloc(b->buf, cap);
        if (nb == NULL) {
            b->oom = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
}

static void sb_number(sbuf_t *b, uint64_t v, int suffix)
{
    static const char units[] = "GMK";
    static const int shifts[] = {30, 20, 10};
    if (suffix && v != 0)
        for (int i = 0; i < 3; i++)
            if ((v & ((1ull << shifts[i]) - 1)) == 0) {
                sb_printf(b, "%llu%c", (unsigned long long)(v >> shifts[i]), units[i]);
                return;
            }
    sb_printf(b, "%llu", (unsigned long long)v);
}

static void sb_range(sbuf_t *b, const char *key, range_t r, int suffix, uint64_t max)
{
    if (r.lo == r.hi) {
        sb_printf(b, "%s=", key);
        sb_number(b, r.lo, suffix);
    } else if (r.hi == max) {
        sb_printf(b, "%s>=", key);
        sb_number(b, r.lo, suffix);
    } else if (r.lo == 0) {
        sb_printf(b, "%s<=", key);
        sb_number(b, r.hi, suffix);
    } else {
        sb_printf(b, "%s=", key);
        sb_number(b, r.lo, suffix);
        sb_printf(b, "-");
        sb_number(b, r.hi, suffix);
    }
}

static void sb_list(sbuf_t *b, const char *key, const alias_t *a, int na, uint32_t mask)
{
    sb_printf(b, "%s=", key);
    int first = 1;
    for (int v = 0; v < 32; v++)
        if (mask & (1u << v)) {
            sb_printf(b, "%s%s", first ? "" : ",", canonical(a, na, v));
            first = 0;
        }
}

static void sb_rule(sbuf_t *b, const rule_t *r)
{
    const size_t start = b->len;
    for (int key = 0; key < K_NUM; key++) {
        if (!(r->has & (1u << key)))
            continue;
        if (b->len != start)
            sb_printf(b, " ");
        switch (key) {
        case K_COLL:
            sb_list(b, "coll", coll_aliases, NALIASES(coll_aliases), r->colls);
            break;
        case K_DTYPE:
            sb_list(b, "dtype", dtype_aliases, NALIASES(dtype_aliases), r->dtypes);
            break;
        case K_OP:
            sb_list(b, "op", op_aliases, NALIASES(op_aliases), r->ops);
            break;
        case K_BYTES:
            sb_range(b, "bytes", r->bytes, 1, SIZE_MAX);
            break;
        case K_NRANKS:
            sb_range(b, "nranks", r->nranks, 0, INT_MAX);
            break;
        case K_HOSTS:
            sb_range(b, "hosts", r->hosts, 0, INT_MAX);
            break;
        case K_NAME:
            sb_printf(b, "name=%s", r->name);
            break;
        default:
            break;
        }
    }
    sb_printf(b, "%s-> %s", b->len == start ? "* " : " ", shim_target_name(r->target));
}

/* ---- the list ------------------------------------------------------------------------------- */

void shim_rules_free(shim_rules_t *rules)
{
    if (rules == NULL || !rules->owned)
        return;
    for (int i = 0; i < rules->n; i++) {
        free((char *)rules->rule[i].name);
        free((char *)rules->rule[i].text);
    }
    free((rule_t *)rules->rule);
    free((char *)rules->text);
    free(rules);
}

static ncclResult_t parse_rule(perr_t *p, const char *s, size_t len, rule_t *rule)
{
    memset(rule, 0, sizeof(*rule));
    trim(&s, &len);
    p->rule = s;
    p->rule_len = len;
    if (len == 0)
        return fail(p, "the rule is empty (rules are separated by ';')");
    const char *arrow = NULL;
    for (size_t i = 0; i + 1 < len; i++)
        if (s[i] == '-' && s[i + 1] == '>') {
            arrow = s + i;
            break;
        }
    if (arrow == NULL)
        return fail(p, "no '-> target' (nccl, loom or echo)");
    const char *tgt = arrow + 2;
    size_t tlen = len - (size_t)(tgt - s);
    trim(&tgt, &tlen);
    int target = lookup(target_aliases, NALIASES(target_aliases), tgt, tlen);
    if (target < 0)
        return fail(p, "unknown target '%.*s' (nccl, loom or echo)", (int)tlen, tgt);
    rule->target = (shim_target_t)target;

    const char *c = s;
    size_t clen = (size_t)(arrow - s);
    trim(&c, &clen);
    if (clen == 0)
        return fail(p, "no conditions before '->' (write * to match every call)");
    if (clen == 1 && c[0] == '*')
        return ncclSuccess;
    unsigned seen = 0;
    size_t i = 0;
    while (i < clen) {
        while (i < clen && is_space(c[i]))
            i++;
        size_t j = i;
        while (j < clen && !is_space(c[j]))
            j++;
        if (j - i == 1 && c[i] == '*')
            return fail(p, "* stands alone: it cannot be combined with conditions");
        char *name = NULL;
        ncclResult_t rc = parse_condition(p, c + i, j - i, rule, &seen, &name);
        if (name) {
            free((char *)rule->name);
            rule->name = name;
        }
        if (rc != ncclSuccess)
            return rc;
        i = j;
    }
    return ncclSuccess;
}

ncclResult_t shim_rules_parse(const char *text, shim_rules_t **rules, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (rules == NULL)
        return ncclInvalidArgument;
    *rules = NULL;
    perr_t p = {err, errlen, 1, "", 0};
    if (text == NULL)
        return fail(&p, "no rule text");

    int n = 1;
    for (const char *q = text; *q; q++)
        n += *q == ';';
    shim_rules_t *r = calloc(1, sizeof(*r));
    rule_t *list = calloc((size_t)n, sizeof(*list));
    if (r == NULL || list == NULL) {
        free(r);
        free(list);
        if (err && errlen)
            snprintf(err, errlen, "out of memory parsing %d rules", n);
        return ncclSystemError;
    }
    r->owned = 1;
    r->rule = list;
    ncclResult_t rc = ncclSuccess;
    sbuf_t all = {0};
    const char *s = text;
    for (int i = 0; i < n; i++) {
        const char *end = strchr(s, ';');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        p.index = i + 1;
        r->n = i + 1; /* so that shim_rules_free sees the partly parsed rule too */
        if ((rc = parse_rule(&p, s, len, &list[i])) != ncclSuccess)
            break;
        sbuf_t one = {0};
        sb_rule(&one, &list[i]);
        list[i].text = one.buf;
        if (one.oom) {
            rc = ncclSystemError;
            break;
        }
        sb_printf(&all, "%s%s", i ? "; " : "", one.buf);
        s = end ? end + 1 : s + len;
    }
    r->text = all.buf;
    if (rc == ncclSuccess && all.oom)
        rc = ncclSystemError;
    if (rc == ncclSystemError && err && errlen)
        snprintf(err, errlen, "out of memory parsing %d rules", n);
    if (rc != ncclSuccess) {
        shim_rules_free(r);
        return rc;
    }
    *rules = r;
    return ncclSuccess;
}

const char *shim_rules_text(const shim_rules_t *rules)
{
    return rules && rules->text ? rules->text : "";
}

/* ---- the decision --------------------------------------------------------------------------- */

static int in_range(range_t r, uint64_t v)
{
    return v >= r.lo && v <= r.hi;
}

static int in_mask(uint32_t mask, int value)
{
    return value >= 0 && value < 32 && (mask & (1u << value));
}

static int rule_matches(const rule_t *r, const shim_call_t *c)
{
    if ((r->has & (1u << K_COLL)) && !in_mask(r->colls, (int)c->coll))
        return 0;
    if ((r->has & (1u << K_DTYPE)) && !in_mask(r->dtypes, (int)c->datatype))
        return 0;
    if (r->has & (1u << K_OP)) {
        /* a collective without an op (op < 0) never matches an op condition */
        const int op = c->op >= (int)ncclNumOps ? OP_PREMULSUM : c->op;
        if (!in_mask(r->ops, op))
            return 0;
    }
    if ((r->has & (1u << K_BYTES)) && !in_range(r->bytes, (uint64_t)c->bytes))
        return 0;
    if ((r->has & (1u << K_NRANKS)) && (c->nranks < 0 || !in_range(r->nranks, (uint64_t)c->nranks)))
        return 0;
    if ((r->has & (1u << K_HOSTS)) && (c->hosts < 0 || !in_range(r->hosts, (uint64_t)c->hosts)))
        return 0;
    /* an unnamed communicator's name is the empty string: name=* matches it, name=?* does not */
    if ((r->has & (1u << K_NAME)) && fnmatch(r->name, c->name ? c->name : "", 0) != 0)
        return 0;
    return 1;
}

static shim_target_t because(shim_target_t t, char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static shim_target_t because(shim_target_t t, char *why, size_t whylen, const char *fmt, ...)
{
    if (why && whylen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
    }
    return t;
}

static const char *or_unknown(const char *why)
{
    return why != NULL && *why ? why : "no reason given";
}

shim_target_t shim_route_decide(const shim_rules_t *rules, const shim_call_t *call, char *why,
                                size_t whylen)
{
    if (call == NULL)
        return because(SHIM_TO_NCCL, why, whylen, "no call");
    if (call->coll == SHIM_COLL_SEND || call->coll == SHIM_COLL_RECV)
        return because(SHIM_TO_NCCL, why, whylen, "send/recv (peers are never split)");
    if (call->in_group)
        return because(SHIM_TO_NCCL, why, whylen, "inside a group (a group is never split)");
    if (call->device_buffers && !call->loom_device)
        return because(SHIM_TO_NCCL, why, whylen, "device buffers, and loom has no device path: %s",
                       or_unknown(call->loom_why));
    if (call->device_buffers && call->op >= (int)ncclNumOps)
        return because(SHIM_TO_NCCL, why, whylen,
                       "device buffers with a premulsum op (loom scales its input on the host)");
    /* Device buffers leave NCCL only by a rule the user wrote: loom's device path has not yet
     * run on a GPU (docs/gpu.md, Results on a GPU), so the built-in rules do not pick it. */
    if (call->device_buffers && call->paired && rules != NULL && !rules->owned)
        return because(SHIM_TO_NCCL, why, whylen,
                       "device buffers under the built-in rules, which keep them on NCCL until "
                       "loom's device path has been checked on a GPU (docs/gpu.md); a "
                       "LOOM_NCCL_ROUTE rule sends them to loom");
    const int nrules = rules ? rules->n : 0;
    int i = 0;
    while (i < nrules && !rule_matches(&rules->rule[i], call))
        i++;
    if (i == nrules)
        return because(SHIM_TO_NCCL, why, whylen, "no rule matched");
    const rule_t *r = &rules->rule[i];
    shim_target_t t = r->target;
    const char *note = "";
    if (t == SHIM_TO_ECHO && !(call->coll == SHIM_COLL_ALLREDUCE && call->op == ncclSum &&
                               (call->datatype == ncclFloat32 || call->datatype == ncclFloat16 ||
                                call->datatype == ncclBfloat16))) {
        t = SHIM_TO_LOOM;
        note = "; echo takes only sum allreduce of fp32, fp16 or bf16";
    }
    if (t == SHIM_TO_ECHO && call->capturing)
        return because(SHIM_TO_NCCL, why, whylen,
                       "rule %d: %s; stream capture (echo runs host-staged, which a CUDA graph "
                       "cannot capture)",
                       i + 1, r->text);
    if (t == SHIM_TO_LOOM && call->device_buffers && !call->loom_device_coll)
        return because(SHIM_TO_NCCL, why, whylen,
                       "rule %d: %s%s; device buffers, and no transport of loom's device path "
                       "runs the call: %s",
                       i + 1, r->text, note, or_unknown(call->loom_why));
    if (t == SHIM_TO_LOOM && call->capturing && !(call->device_buffers && call->loom_capturable))
        return because(SHIM_TO_NCCL, why, whylen, "rule %d: %s%s; stream capture (%s)", i + 1,
                       r->text, note,
                       call->device_buffers ? "loom's transport for it runs host-staged, which "
                                              "a CUDA graph cannot capture"
                                            : "loom's host path cannot be captured");
    return because(t, why, whylen, "rule %d: %s%s", i + 1, r->text, note);
}
