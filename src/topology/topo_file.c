/* SPDX-License-Identifier: Apache-2.0
 *
 * topo_file.c - loom's topology files (docs/topology.md): written by LOOM_TOPO_DUMP_FILE, read
 * by LOOM_TOPO_FILE and by tools, so that a wrong detection can be corrected by hand and tests
 * can describe machines that are not here. Reading checks every field: a file is input from
 * people, and a bad one gets a message naming the field, never a crash.
 */
#include "topo.h"

#include <stdlib.h>
#include <string.h>

#include "json.h"

#define TOPO_VERSION 1
#define MAX_HOSTS    4096
#define MAX_RANKS    (1 << 20)
#define MAX_CPU_ID   (1L << 20) /* a CPU list's ids: far beyond any machine, and no overflow */
#define MAX_CACHE_KB (1 << 30)  /* a cache size's bound in a file: 1 TiB */

int loom_topo_alloc(loom_topo_t *t, int nhosts, int nranks)
{
    t->nhosts = nhosts;
    t->nranks = nranks;
    t->hosts = calloc(nhosts > 0 ? (size_t)nhosts : 1, sizeof(*t->hosts));
    t->ranks = calloc(nranks > 0 ? (size_t)nranks : 1, sizeof(*t->ranks));
    if (!t->hosts || !t->ranks) {
        loom_topo_free(t);
        return -1;
    }
    return 0;
}

#define TERMINATE(s) ((s)[sizeof(s) - 1] = '\0')
static int32_t clamp_count(int32_t n, int32_t max)
{
    return n < 0 ? 0 : n > max ? max : n;
}

/* A cache size as a file holds it: -1 (unknown) for anything outside 0 to MAX_CACHE_KB. */
static int32_t cache_kb(int32_t kb)
{
    return kb >= 0 && kb <= MAX_CACHE_KB ? kb : -1;
}

void loom_topo_sanitize_host(loom_topo_host_t *h)
{
    TERMINATE(h->hostname);
    h->l1d_kb = cache_kb(h->l1d_kb);
    h->l2_kb = cache_kb(h->l2_kb);
    h->l3_kb = cache_kb(h->l3_kb);
    h->nnuma = clamp_count(h->nnuma, LOOM_TOPO_MAX_NUMA);
    h->nnics = clamp_count(h->nnics, LOOM_TOPO_MAX_NICS);
    h->nrdma = clamp_count(h->nrdma, LOOM_TOPO_MAX_RDMA);
    h->ngpus = clamp_count(h->ngpus, LOOM_TOPO_MAX_GPUS);
    for (int i = 0; i < LOOM_TOPO_MAX_NUMA; i++)
        TERMINATE(h->numa[i].cpulist);
    for (int i = 0; i < LOOM_TOPO_MAX_NICS; i++)
        TERMINATE(h->nics[i].name);
    for (int i = 0; i < LOOM_TOPO_MAX_RDMA; i++) {
        TERMINATE(h->rdma[i].name);
        TERMINATE(h->rdma[i].link_layer);
    }
    for (int i = 0; i < LOOM_TOPO_MAX_GPUS; i++) {
        TERMINATE(h->gpus[i].name);
        TERMINATE(h->gpus[i].pci);
    }
}

void loom_topo_sanitize_rank(loom_topo_rank_t *r)
{
    TERMINATE(r->cpus);
}

void loom_topo_free(loom_topo_t *t)
{
    free(t->hosts);
    free(t->ranks);
    memset(t, 0, sizeof(*t));
}

/* ---- Writing ---- */

static void w_str(FILE *f, const char *key, const char *v, const char *sep)
{
    fprintf(f, "\"%s\": ", key);
    loom_json_write_string(f, v);
    fputs(sep, f);
}

int loom_topo_write(const loom_topo_t *t, FILE *f)
{
    fprintf(f, "{\n  \"loom_topology\": %d,\n  \"hosts\": [", TOPO_VERSION);
    for (int i = 0; i < t->nhosts; i++) {
        const loom_topo_host_t *h = &t->hosts[i];
        fprintf(f, "%s\n    {", i ? "," : "");
        w_str(f, "hostname", h->hostname, ", ");
        fprintf(f,
                "\"packages\": %d, \"cores\": %d, \"cpus\": %d, \"l1d_kb\": %d, "
                "\"l2_kb\": %d, \"l3_kb\": %d, \"nvswitch\": %s,\n",
                h->packages, h->cores, h->cpus, cache_kb(h->l1d_kb), cache_kb(h->l2_kb),
                cache_kb(h->l3_kb), h->nvswitch ? "true" : "false");
        fputs("      \"numa\": [", f);
        for (int j = 0; j < h->nnuma; j++) {
            const loom_topo_numa_t *m = &h->numa[j];
            fprintf(f, "%s\n        {\"id\": %d, ", j ? "," : "", m->id);
            w_str(f, "cpus", m->cpulist, ", ");
            fprintf(f, "\"mem_mb\": %lld}", (long long)m->mem_mb);
        }
        fputs(h->nnuma ? "\n      ],\n      \"nics\": [" : "],\n      \"nics\": [", f);
        for (int j = 0; j < h->nnics; j++) {
            const loom_topo_nic_t *n = &h->nics[j];
            fprintf(f, "%s\n        {", j ? "," : "");
            w_str(f, "name", n->name, ", ");
            fprintf(f, "\"up\": %s, \"speed_mbps\": %d, \"numa\": %d}", n->up ? "true" : "false",
                    n->speed_mbps, n->numa);
        }
        fputs(h->nnics ? "\n      ],\n      \"rdma\": [" : "],\n      \"rdma\": [", f);
        for (int j = 0; j < h->nrdma; j++) {
            const loom_topo_rdma_t *r = &h->rdma[j];
            fprintf(f, "%s\n        {", j ? "," : "");
            w_str(f, "name", r->name, ", ");
            fprintf(f, "\"port\": %d, ", r->port);
            w_str(f, "link_layer", r->link_layer, ", ");
            fprintf(f, "\"active\": %s, \"rate_gbps\": %.17g, \"numa\": %d}",
                    r->active ? "true" : "false", r->rate_gbps, r->numa);
        }
        fputs(h->nrdma ? "\n      ],\n      \"gpus\": [" : "],\n      \"gpus\": [", f);
        for (int j = 0; j < h->ngpus; j++) {
            const loom_topo_gpu_t *g = &h->gpus[j];
            fprintf(f, "%s\n        {", j ? "," : "");
            w_str(f, "name", g->name, ", ");
            w_str(f, "pci", g->pci, ", ");
            fprintf(f, "\"numa\": %d, \"nvlinks\": %d, \"nvlink_gbps\": %.17g}", g->numa,
                    g->nvlinks, g->nvlink_gbps);
        }
        fputs(h->ngpus ? "\n      ]\n    }" : "]\n    }", f);
    }
    fprintf(f, "\n  ],\n  \"ranks\": [");
    for (int i = 0; i < t->nranks; i++) {
        const loom_topo_rank_t *r = &t->ranks[i];
        fprintf(f, "%s\n    {\"host\": %d, \"local_rank\": %d, \"numa\": %d, ", i ? "," : "",
                r->host, r->local_rank, r->numa);
        w_str(f, "cpus", r->cpus, "}");
    }
    fprintf(f, "%s]\n}\n", t->nranks ? "\n  " : "");
    return ferror(f) ? -1 : 0;
}

/* ---- Reading ---- */

typedef struct {
    char *err;
    size_t errlen;
    char path[128];
} rd_t;

static int fail(rd_t *r, const char *what)
{
    snprintf(r->err, r->errlen, "%s: %s", r->path, what);
    return -1;
}

/* "hosts[1].nics[0].speed_mbps": where a value is, for messages. */
static const char *keypath(const rd_t *r, const char *key, char *buf, size_t len)
{
    if (!strcmp(r->path, "top level"))
        snprintf(buf, len, "%s", key);
    else
        snprintf(buf, len, "%s.%s", r->path, key);
    return buf;
}

static int get_int(rd_t *r, const loom_json_t *o, const char *key, long long lo, long long hi,
                   int32_t *out, int optional, int32_t dflt)
{
    char kp[192];
    if (optional && !loom_json_get(o, key)) {
        *out = dflt;
        return 0;
    }
    long long v;
    if (loom_json_get_int(o, key, lo, hi, &v, keypath(r, key, kp, sizeof(kp)), r->err, r->errlen))
        return -1;
    *out = (int32_t)v;
    return 0;
}

static int get_num(rd_t *r, const loom_json_t *o, const char *key, double lo, double hi,
                   double *out)
{
    char kp[192];
    return loom_json_get_num(o, key, lo, hi, out, keypath(r, key, kp, sizeof(kp)), r->err,
                             r->errlen);
}

static int get_bool(rd_t *r, const loom_json_t *o, const char *key, int32_t *out, int optional)
{
    const loom_json_t *v = loom_json_get(o, key);
    if (!v && optional) {
        *out = 0;
        return 0;
    }
    if (!v || v->type != LOOM_JSON_BOOL) {
        char m[96];
        snprintf(m, sizeof(m), "\"%s\" must be true or false", key);
        return fail(r, m);
    }
    *out = v->boolean;
    return 0;
}

static int get_text(rd_t *r, const loom_json_t *o, const char *key, char *out, size_t len)
{
    const char *s;
    char kp[192];
    if (loom_json_get_str(o, key, &s, keypath(r, key, kp, sizeof(kp)), r->err, r->errlen))
        return -1;
    if (strlen(s) >= len) {
        char m[96];
        snprintf(m, sizeof(m), "\"%s\" is longer than %zu bytes", key, len - 1);
        return fail(r, m);
    }
    snprintf(out, len, "%s", s);
    return 0;
}

/* The array under key (optional: absent is empty), with at most max elements. */
static const loom_json_t *get_array(rd_t *r, const loom_json_t *o, const char *key, size_t max,
                                    int optional, int *bad)
{
    const loom_json_t *a = loom_json_get(o, key);
    *bad = 0;
    if (!a && optional)
        return NULL;
    char m[96];
    if (!a || a->type != LOOM_JSON_ARRAY) {
        snprintf(m, sizeof(m), "\"%s\" must be an array", key);
        *bad = fail(r, m);
        return NULL;
    }
    if (a->n > max) {
        snprintf(m, sizeof(m), "\"%s\" has %zu entries, at most %zu are supported", key, a->n, max);
        *bad = fail(r, m);
        return NULL;
    }
    return a;
}

static int enter(rd_t *r, const loom_json_t *v, const char *fmt, const char *base, size_t i)
{
    snprintf(r->path, sizeof(r->path), fmt, base, i);
    if (v->type != LOOM_JSON_OBJECT)
        return fail(r, "must be an object");
    return 0;
}

static int read_host(rd_t *r, const loom_json_t *o, loom_topo_host_t *h, size_t hi)
{
    char base[48];
    snprintf(base, sizeof(base), "hosts[%zu]", hi);
    if (enter(r, o, "%s", base, 0) ||
        get_text(r, o, "hostname", h->hostname, sizeof(h->hostname)) ||
        get_int(r, o, "packages", 1, 1024, &h->packages, 0, 0) ||
        get_int(r, o, "cpus", 1, 1 << 20, &h->cpus, 0, 0) ||
        get_int(r, o, "cores", 1, h->cpus, &h->cores, 0, 0) ||
        get_int(r, o, "l1d_kb", -1, MAX_CACHE_KB, &h->l1d_kb, 1, -1) ||
        get_int(r, o, "l2_kb", -1, MAX_CACHE_KB, &h->l2_kb, 1, -1) ||
        get_int(r, o, "l3_kb", -1, MAX_CACHE_KB, &h->l3_kb, 1, -1) ||
        get_bool(r, o, "nvswitch", &h->nvswitch, 1))
        return -1;
    int bad;
    const loom_json_t *a = get_array(r, o, "numa", LOOM_TOPO_MAX_NUMA, 1, &bad);
    for (size_t i = 0; !bad && a && i < a->n; i++) {
        loom_topo_numa_t *m = &h->numa[h->nnuma++];
        int32_t mem;
        if (enter(r, &a->items[i], "%s.numa[%zu]", base, i) ||
            get_int(r, &a->items[i], "id", 0, 1 << 20, &m->id, 0, 0) ||
            get_text(r, &a->items[i], "cpus", m->cpulist, sizeof(m->cpulist)) ||
            get_int(r, &a->items[i], "mem_mb", -1, 1 << 30, &mem, 1, -1))
            return -1;
        m->mem_mb = mem;
        m->cpus = 0;
        /* count the CPUs of the list: a-b ranges and single ids */
        for (const char *s = m->cpulist; *s;) {
            char *end;
            long x = strtol(s, &end, 10), y = x;
            if (end == s || x < 0 || x >= MAX_CPU_ID)
                return fail(r, "\"cpus\" must be a CPU list like \"0-3,8\" of ids below 2^20");
            if (*end == '-') {
                s = end + 1;
                y = strtol(s, &end, 10);
                if (end == s || y < x || y >= MAX_CPU_ID)
                    return fail(r, "\"cpus\" must be a CPU list like \"0-3,8\" of ids below "
                                   "2^20");
            }
            m->cpus += (int32_t)(y - x + 1);
            s = *end == ',' ? end + 1 : end;
            if (*end && *end != ',')
                return fail(r, "\"cpus\" must be a CPU list like \"0-3,8\"");
        }
    }
    if (bad)
        return -1;
    a = get_array(r, o, "nics", LOOM_TOPO_MAX_NICS, 1, &bad);
    for (size_t i = 0; !bad && a && i < a->n; i++) {
        loom_topo_nic_t *n = &h->nics[h->nnics++];
        if (enter(r, &a->items[i], "%s.nics[%zu]", base, i) ||
            get_text(r, &a->items[i], "name", n->name, sizeof(n->name)) ||
            get_bool(r, &a->items[i], "up", &n->up, 0) ||
            get_int(r, &a->items[i], "speed_mbps", -1, 1 << 30, &n->speed_mbps, 1, -1) ||
            get_int(r, &a->items[i], "numa", -1, 1 << 20, &n->numa, 1, -1))
            return -1;
        if (n->speed_mbps == 0)
            return fail(r, "\"speed_mbps\" is -1 (unknown) or positive");
    }
    if (bad)
        return -1;
    a = get_array(r, o, "rdma", LOOM_TOPO_MAX_RDMA, 1, &bad);
    for (size_t i = 0; !bad && a && i < a->n; i++) {
        loom_topo_rdma_t *d = &h->rdma[h->nrdma++];
        if (enter(r, &a->items[i], "%s.rdma[%zu]", base, i) ||
            get_text(r, &a->items[i], "name", d->name, sizeof(d->name)) ||
            get_int(r, &a->items[i], "port", 0, 255, &d->port, 0, 0) ||
            get_text(r, &a->items[i], "link_layer", d->link_layer, sizeof(d->link_layer)) ||
            get_bool(r, &a->items[i], "active", &d->active, 0) ||
            get_num(r, &a->items[i], "rate_gbps", -1, 1e6, &d->rate_gbps) ||
            get_int(r, &a->items[i], "numa", -1, 1 << 20, &d->numa, 1, -1))
            return -1;
    }
    if (bad)
        return -1;
    a = get_array(r, o, "gpus", LOOM_TOPO_MAX_GPUS, 1, &bad);
    for (size_t i = 0; !bad && a && i < a->n; i++) {
        loom_topo_gpu_t *g = &h->gpus[h->ngpus++];
        if (enter(r, &a->items[i], "%s.gpus[%zu]", base, i) ||
            get_text(r, &a->items[i], "name", g->name, sizeof(g->name)) ||
            get_text(r, &a->items[i], "pci", g->pci, sizeof(g->pci)) ||
            get_int(r, &a->items[i], "numa", -1, 1 << 20, &g->numa, 1, -1) ||
            get_int(r, &a->items[i], "nvlinks", 0, 64, &g->nvlinks, 1, 0))
            return -1;
        g->nvlink_gbps = 0;
        if (loom_json_get(&a->items[i], "nvlink_gbps") &&
            get_num(r, &a->items[i], "nvlink_gbps", 0, 1e6, &g->nvlink_gbps))
            return -1;
    }
    return bad ? -1 : 0;
}

int loom_topo_parse(const char *text, size_t len, loom_topo_t *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    loom_json_t *doc = NULL;
    if (loom_json_parse(text, len, &doc, err, errlen))
        return -1;
    rd_t r = {.err = err, .errlen = errlen};
    snprintf(r.path, sizeof(r.path), "top level");
    int rc = -1, bad;
    int32_t version;
    if (doc->type != LOOM_JSON_OBJECT) {
        fail(&r, "must be an object");
        goto out;
    }
    if (get_int(&r, doc, "loom_topology", 1, 1000, &version, 0, 0))
        goto out;
    if (version != TOPO_VERSION) {
        fail(&r, "\"loom_topology\" is a version this loom does not read (it reads 1)");
        goto out;
    }
    const loom_json_t *hosts = get_array(&r, doc, "hosts", MAX_HOSTS, 0, &bad);
    const loom_json_t *ranks = bad ? NULL : get_array(&r, doc, "ranks", MAX_RANKS, 1, &bad);
    if (bad)
        goto out;
    if (hosts->n == 0) {
        fail(&r, "\"hosts\" is empty");
        goto out;
    }
    if (loom_topo_alloc(t, (int)hosts->n, ranks ? (int)ranks->n : 0)) {
        fail(&r, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < hosts->n; i++)
        if (read_host(&r, &hosts->items[i], &t->hosts[i], i))
            goto out;
    /* Ranks: each names a host, and each host's ranks are numbered 0, 1, ... without a gap. */
    int *seen = calloc((size_t)t->nhosts, sizeof(int));
    if (!seen) {
        fail(&r, "out of memory");
        goto out;
    }
    for (int i = 0; i < t->nranks; i++) {
        loom_topo_rank_t *k = &t->ranks[i];
        const loom_json_t *o = &ranks->items[i];
        if (enter(&r, o, "%sranks[%zu]", "", (size_t)i) ||
            get_int(&r, o, "host", 0, t->nhosts - 1, &k->host, 0, 0) ||
            get_int(&r, o, "local_rank", 0, MAX_RANKS, &k->local_rank, 0, 0) ||
            get_int(&r, o, "numa", -1, 1 << 20, &k->numa, 1, -1) ||
            (loom_json_get(o, "cpus") && get_text(&r, o, "cpus", k->cpus, sizeof(k->cpus)))) {
            free(seen);
            goto out;
        }
        if (k->local_rank != seen[k->host]++) {
            free(seen);
            fail(&r, "\"local_rank\" must count 0, 1, ... over the ranks of its host, in order");
            goto out;
        }
    }
    free(seen);
    rc = 0;
out:
    loom_json_free(doc);
    if (rc)
        loom_topo_free(t);
    return rc;
}

int loom_topo_read(const char *path, loom_topo_t *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open it", path);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap || cap >= ((size_t)LOOM_JSON_MAX_BYTES) + 1)
            break;
        char *nb = realloc(buf, cap * 2);
        if (!nb)
            free(buf);
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    char inner[384];
    int rc = loom_topo_parse(buf, len, t, inner, sizeof(inner));
    free(buf);
    if (rc)
        snprintf(err, errlen, "%s: %s", path, inner);
    return rc;
}

/* "<label>48 KiB", or in MiB from 1 MiB on ("<label>1.25 MiB"). */
static void print_kb(char *buf, size_t len, const char *label, int32_t kb)
{
    if (kb < 1024)
        snprintf(buf, len, "%s%d KiB", label, (int)kb);
    else
        snprintf(buf, len, "%s%g MiB", label, kb / 1024.0);
}

void loom_topo_print(const loom_topo_t *t, FILE *f)
{
    fprintf(f, "%d host%s, %d rank%s\n", t->nhosts, t->nhosts == 1 ? "" : "s", t->nranks,
            t->nranks == 1 ? "" : "s");
    for (int i = 0; i < t->nhosts; i++) {
        const loom_topo_host_t *h = &t->hosts[i];
        int nr = 0;
        for (int k = 0; k < t->nranks; k++)
            nr += t->ranks[k].host == i;
        char l3[48] = "", l1d[32] = "", l2[32] = "";
        if (h->l3_kb > 0)
            snprintf(l3, sizeof(l3), ", L3 %g MiB per package", h->l3_kb / 1024.0);
        if (h->l1d_kb > 0)
            print_kb(l1d, sizeof(l1d), ", L1d ", h->l1d_kb);
        if (h->l2_kb > 0)
            print_kb(l2, sizeof(l2), ", L2 ", h->l2_kb);
        fprintf(f, "host %d %s: %d package%s, %d cores, %d CPUs%s%s%s%s, %d ranks\n", i,
                h->hostname, h->packages, h->packages == 1 ? "" : "s", h->cores, h->cpus, l3, l1d,
                l2, l1d[0] || l2[0] ? " per core" : "", nr);
        for (int j = 0; j < h->nnuma; j++)
            fprintf(f, "  numa %d: CPUs %s (%d), %lld MiB\n", h->numa[j].id, h->numa[j].cpulist,
                    h->numa[j].cpus, (long long)h->numa[j].mem_mb);
        for (int j = 0; j < h->nnics; j++) {
            const loom_topo_nic_t *n = &h->nics[j];
            char sp[32];
            if (n->speed_mbps > 0)
                snprintf(sp, sizeof(sp), "%g Gbit/s", n->speed_mbps / 1000.0);
            else
                snprintf(sp, sizeof(sp), "speed unknown");
            fprintf(f, "  nic %s: %s, %s, numa %d\n", n->name, n->up ? "up" : "down", sp, n->numa);
        }
        for (int j = 0; j < h->nrdma; j++) {
            const loom_topo_rdma_t *d = &h->rdma[j];
            fprintf(f, "  rdma %s port %d: %s, %s, %g Gbit/s, numa %d\n", d->name, d->port,
                    d->link_layer, d->active ? "active" : "down", d->rate_gbps, d->numa);
        }
        for (int j = 0; j < h->ngpus; j++) {
            const loom_topo_gpu_t *g = &h->gpus[j];
            fprintf(f, "  gpu %d %s (%s): numa %d, %d NVLinks of %g Gbit/s%s\n", j, g->name, g->pci,
                    g->numa, g->nvlinks, g->nvlink_gbps, h->nvswitch ? ", NVSwitch" : "");
        }
    }
    for (int k = 0; k < t->nranks; k++)
        fprintf(f, "rank %d: host %d local rank %d, numa %d, CPUs %s\n", k, t->ranks[k].host,
                t->ranks[k].local_rank, t->ranks[k].numa,
                t->ranks[k].cpus[0] ? t->ranks[k].cpus : "?");
}
