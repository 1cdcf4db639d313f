/* SPDX-License-Identifier: Apache-2.0
 *
 * param.c - reads every LOOM_* variable listed in params.def, once, and caches
 * it. Values set in the environment are logged at INFO under ENV; invalid
 * ones fall back to the default with a WARN naming the variable. This is the
 * only file that calls getenv for tunables.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "debug.h"
#include "param.h"

static pthread_mutex_t param_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned param_generation = 1;

int loom_parse_size(const char *s, int64_t *out_p)
{
    if (s == NULL || *s == '\0')
        return -1;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || v < 0)
        return -1;
    int shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default:
        return -1;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        return -1;
    if (shift && v > (INT64_MAX >> shift))
        return -1;
    *out_p = (int64_t)v << shift;
    return 0;
}

static int64_t param_read_num(const char *name, const char *type, int64_t def)
{
    char var[96];
    snprintf(var, sizeof(var), "LOOM_%s", name);
    const char *s = getenv(var);
    if (s == NULL)
        return def;
    int64_t v = 0;
    int bad;
    if (strcmp(type, "size") == 0) {
        bad = loom_parse_size(s, &v);
    } else {
        char *end = NULL;
        errno = 0;
        long long ll = strtoll(s, &end, 0);
        bad = (errno != 0 || end == s || *end != '\0');
        v = ll;
    }
    if (bad) {
        LOOM_WARN("invalid value '%s' for %s (expected %s); using default %lld", s, var,
                  strcmp(type, "size") == 0 ? "bytes, K/M/G suffix allowed" : "an integer",
                  (long long)def);
        return def;
    }
    LOOM_INFO(LOOM_LOG_ENV, "%s set by environment to %s", var, s);
    return v;
}

static const char *param_read_str(const char *name, const char *def)
{
    char var[96];
    snprintf(var, sizeof(var), "LOOM_%s", name);
    const char *s = getenv(var);
    if (s == NULL)
        return def;
    /* LOOM_DEBUG* are read by the logger itself; logging them here would recurse. */
    if (strncmp(name, "DEBUG", 5) != 0 && strcmp(name, "SECRET") != 0)
        LOOM_INFO(LOOM_LOG_ENV, "%s set by environment to %s", var, s);
    return s;
}

#define PARAM_READ_int(_name, _def)  param_read_num(#_name, "int", (_def))
#define PARAM_READ_size(_name, _def) param_read_num(#_name, "size", (_def))
#define PARAM_READ_str(_name, _def)  param_read_str(#_name, (_def))

/* Hot paths read parameters on every call: a current value is read without
 * the lock (cached_gen is published after cached, with release); the lock
 * only orders the re-reads after loom_param_reset_cache. */
#define X(_name, _type, _def, _doc, _sub)                                                          \
    LOOM_PARAM_TYPE_##_type loom_param_##_name(void)                                               \
    {                                                                                              \
        static LOOM_PARAM_TYPE_##_type cached;                                                     \
        static unsigned cached_gen;                                                                \
        if (__atomic_load_n(&cached_gen, __ATOMIC_ACQUIRE) == loom_param_generation())             \
            return __atomic_load_n(&cached, __ATOMIC_RELAXED);                                     \
        pthread_mutex_lock(&param_lock);                                                           \
        if (cached_gen != param_generation) {                                                      \
            unsigned gen = param_generation;                                                       \
            pthread_mutex_unlock(&param_lock);                                                     \
            LOOM_PARAM_TYPE_##_type v = PARAM_READ_##_type(_name, _def);                           \
            pthread_mutex_lock(&param_lock);                                                       \
            __atomic_store_n(&cached, v, __ATOMIC_RELAXED);                                        \
            __atomic_store_n(&cached_gen, gen, __ATOMIC_RELEASE);                                  \
        }                                                                                          \
        LOOM_PARAM_TYPE_##_type v = cached;                                                        \
        pthread_mutex_unlock(&param_lock);                                                         \
        return v;                                                                                  \
    }
#include "params.def"
#undef X

#define STR_int(_def)                     #_def
#define STR_size(_def)                    #_def
#define STR_str(_def)                     _def
#define X(_name, _type, _def, _doc, _sub) {#_name, #_type, STR_##_type(_def), _doc, #_sub},
static const loom_param_info_t param_table[] = {
#include "params.def"
};
#undef X

const loom_param_info_t *loom_param_table(int *n_p)
{
    *n_p = (int)(sizeof(param_table) / sizeof(param_table[0]));
    return param_table;
}

void loom_param_reset_cache(void)
{
    pthread_mutex_lock(&param_lock);
    __atomic_add_fetch(&param_generation, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&param_lock);
}

unsigned loom_param_generation(void)
{
    return __atomic_load_n(&param_generation, __ATOMIC_ACQUIRE);
}
