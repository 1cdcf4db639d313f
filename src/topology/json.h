/* SPDX-License-Identifier: Apache-2.0
 *
 * json.h - a small, strict JSON reader (RFC 8259) for topology files that people write by
 * hand, and the one writer helper file dumps need. Strict so that a typo fails loudly with
 * "line L, column C: ..." instead of being half-read: no comments, no trailing commas, no
 * duplicate keys, no NaN. It does not stream, keep numbers' source text, or write whole
 * documents. Called by the topology file loader and tests/unit/test_topo_json.cc.
 * Thread safety: a parsed tree is never modified and may be read from any number of threads;
 * the functions are reentrant, except that a number with a '.' parsed while LC_NUMERIC's decimal
 * point is not '.' calls localeconv(), which C does not promise to be thread-safe.
 */
#ifndef LOOM_TOPOLOGY_JSON_H
#define LOOM_TOPOLOGY_JSON_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_JSON_MAX_DEPTH 64                  /* nested arrays/objects; a scalar is depth 0 */
#define LOOM_JSON_MAX_BYTES (16u * 1024 * 1024) /* largest input accepted, in bytes */

typedef enum {
    LOOM_JSON_NULL,
    LOOM_JSON_BOOL,
    LOOM_JSON_NUMBER,
    LOOM_JSON_STRING,
    LOOM_JSON_ARRAY,
    LOOM_JSON_OBJECT
} loom_json_type_t;

typedef struct loom_json {
    loom_json_type_t type;
    int boolean;             /* BOOL: 0 or 1 */
    double number;           /* NUMBER: always finite */
    char *string;            /* STRING: NUL-terminated UTF-8 with no NUL inside */
    size_t len;              /* STRING: bytes in string, without the terminator */
    struct loom_json *items; /* ARRAY elements / OBJECT values, n of them */
    char **keys;             /* OBJECT keys (NUL-terminated UTF-8), n of them, in file order */
    size_t n;                /* ARRAY / OBJECT: number of items (and keys) */
} loom_json_t;

/* Parses text[0..len) (need not be NUL-terminated; nothing past len is read) as one JSON
 * value with optional surrounding whitespace. Returns 0 and stores a tree in *out, to be freed
 * with loom_json_free. Returns -1, stores NULL in *out, and writes "line L, column C: what is
 * wrong" to err (truncated to errlen; err may be NULL) when the text is not strict JSON: empty
 * input, more than LOOM_JSON_MAX_BYTES, nesting deeper than LOOM_JSON_MAX_DEPTH, a duplicate key
 * in one object, anything but whitespace after the value, a control character or invalid UTF-8
 * in a string, an invalid escape, \u0000, a lone surrogate, a number with leading zeros, NaN or
 * Infinity, a number whose magnitude exceeds DBL_MAX (tiny numbers round towards zero), a
 * byte order mark; "line L, column C: out of memory" if an allocation fails. Lines count '\n';
 * columns count characters (UTF-8 sequences), both from 1; a tab is one column. A NULL out
 * returns -1 and writes nothing. */
int loom_json_parse(const char *text, size_t len, loom_json_t **out, char *err, size_t errlen);

/* Frees a tree from loom_json_parse. NULL is a no-op. */
void loom_json_free(loom_json_t *v);

/* The value of key in an object (keys are unique); NULL if v is NULL, not an object, or has no
 * such key. Linear in the number of keys: topology objects are small. */
const loom_json_t *loom_json_get(const loom_json_t *v, const char *key);

/* Typed getters for the members of an object. Each returns 0 and stores the value in *out, or
 * returns -1, leaves *out alone, and writes "<path>: expected ..., found ..." to err (err may be
 * NULL) when obj is not an object, the key is missing, or the value has the wrong type or lies
 * outside [min, max]. path is the caller's name for the member, e.g.
 * "hosts[1].nics[0].speed_mbps".
 * loom_json_get_int: the number must be an integer value (1e3 and 1000.0 are integers) with
 * magnitude at most 2^53, where doubles stop counting exactly. */
int loom_json_get_int(const loom_json_t *obj, const char *key, long long min, long long max,
                      long long *out, const char *path, char *err, size_t errlen);
int loom_json_get_num(const loom_json_t *obj, const char *key, double min, double max, double *out,
                      const char *path, char *err, size_t errlen);
/* *out points into the tree and lives as long as it. */
int loom_json_get_str(const loom_json_t *obj, const char *key, const char **out, const char *path,
                      char *err, size_t errlen);

/* Writes s as a JSON string literal, quotes included, to f: '"' and '\' escaped, control
 * characters as \n, \t, ... or \u00XX, other characters as they are. Bytes that are not valid
 * UTF-8 are written as \ufffd so that the output always parses. NULL writes null. Errors on f
 * are left in f's error indicator (check ferror). */
void loom_json_write_string(FILE *f, const char *s);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_TOPOLOGY_JSON_H */
