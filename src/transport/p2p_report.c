/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p_report.c - what the point-to-point layer says when it breaks: the one
 * message shape of every failure (the rank at fault with its host and pid,
 * who reported it, the operation and its sequence number, the pending
 * requests) and the timeout dump (INFO lines and the LOOM_DUMP_ON_TIMEOUT
 * file). It decides nothing; p2p_wait.c calls it from its failure path.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "debug.h"
#include "dump_text.h"
#include "p2p_impl.h"
#include "param.h"

const char *loom_p2p_kind_name(int kind)
{
    static const char *const names[N_KINDS] = {"none",  "bye",   "dead",   "lost",    "timeout",
                                               "abort", "error", "closed", "mismatch"};
    return kind >= 0 && kind < N_KINDS ? names[kind] : "unknown";
}

/* "rank 2 (host h, pid 7)" */
const char *loom_p2p_who(const loom_p2p_t *p, int rank, char *buf, size_t len)
{
    snprintf(buf, len, "rank %d (host %s, pid %d)", rank, p->peers[rank].hostname,
             (int)p->peers[rank].pid);
    return buf;
}

/* The still pending requests, e.g.
 * " receive from rank 2 (host h, pid 7; 4096 bytes, tag 0x80000281);". */
void loom_p2p_pending_list(const loom_p2p_t *p, const loom_p2p_req_t *reqs, int n, char *buf,
                           size_t len)
{
    size_t o = 0;
    char a[160];
    buf[0] = '\0';
    for (int i = 0; i < n && o + 240 < len; i++) {
        if (reqs[i].done)
            continue;
        snprintf(a, sizeof(a), "rank %d (host %s, pid %d", reqs[i].peer,
                 p->peers[reqs[i].peer].hostname, (int)p->peers[reqs[i].peer].pid);
        o += (size_t)snprintf(buf + o, len - o, " %s %s; %zu bytes, tag 0x%x);",
                              reqs[i].is_send ? "send to" : "receive from", a, reqs[i].nbytes,
                              reqs[i].tag);
    }
    if (o == 0)
        snprintf(buf, len, " nothing");
}

/* The message of a failure, one shape for every cause:
 *   rank R: OP seq S failed: <cause>[ (reported by <peer> in its seq N)][: <detail>]; pending: ...
 * where the cause names the rank at fault first with its host and pid. */
void loom_p2p_describe(const loom_p2p_t *p, const cause_t *c, const char *direct, const char *pend,
                       char *msg, size_t len)
{
    char a[160], b[224], cause[640], via[256] = "";
    loom_p2p_who(p, c->rank, a, sizeof(a));
    const int here = c->via < 0;
    switch (c->kind) {
    case N_DEAD:
        snprintf(cause, sizeof(cause), "%s died", a);
        break;
    case N_LOST:
        snprintf(cause, sizeof(cause),
                 "%s closed its connection%s without a notice (it crashed or exited, or its host "
                 "is unreachable)",
                 a, here ? "" : "s");
        break;
    case N_CLOSED:
        snprintf(cause, sizeof(cause), "%s destroyed its communicator while it was still needed",
                 a);
        break;
    case N_TIMEOUT:
        if (here)
            snprintf(cause, sizeof(cause), "no progress for %lld ms, first waiting for %s",
                     (long long)p->args.timeout_ms, a);
        else
            snprintf(cause, sizeof(cause),
                     "its wait made no progress for its timeout, stalled on %s", a);
        break;
    case N_ABORT:
        snprintf(cause, sizeof(cause), "%s aborted the communicator%s", a,
                 here ? " (loomCommAbort)" : "");
        break;
    case N_MISMATCH:
        /* Found here, the detail says it all; from a notice, the fields it carries. */
        if (here)
            snprintf(cause, sizeof(cause), "mismatched collectives");
        else
            loom_p2p_mismatch_text(p, c, cause, sizeof(cause));
        break;
    default:
        /* Only a peer's BLAME (p2p.h) names this rank for an error. */
        if (c->rank == p->rank && !here && c->code == (uint32_t)loomInvalidUsage)
            snprintf(cause, sizeof(cause),
                     "%s could not read this rank's buffer: it is shorter than the call's count "
                     "says, or not mapped",
                     loom_p2p_who(p, c->via, b, sizeof(b)));
        else
            snprintf(cause, sizeof(cause), "%s failed with '%s'", a,
                     loomGetErrorString((loomResult_t)c->code));
        break;
    }
    if (!here)
        snprintf(via, sizeof(via), " (reported by %s in its seq %llu)",
                 loom_p2p_who(p, c->via, b, sizeof(b)), (unsigned long long)c->seq);
    snprintf(msg, len, "rank %d: %s seq %llu %s: %s%s%s%s; pending:%s", p->rank, p->what,
             (unsigned long long)p->seq, c->kind == N_TIMEOUT ? "timed out" : "failed", cause, via,
             direct[0] ? ": " : "", direct, pend);
}

// ---- timeout dump ---------------------------------------------------------------

static void dump_header(const loom_p2p_t *p, const cause_t *c, uint64_t waited_ns, int npending,
                        loom_jbuf_t *j)
{
    const loom_peer_info_t *me = &p->peers[p->rank];
    loom_jput(j, "{\"event\":\"timeout\",\"rank\":%d,\"nranks\":%d,\"host\":", p->rank, p->nranks);
    loom_jstr(j, me->hostname);
    loom_jput(j, ",\"pid\":%d,\"op\":", (int)me->pid);
    loom_jstr(j, p->what);
    loom_jput(j, ",\"seq\":%llu,\"timeout_ms\":%lld,\"waited_ms\":%llu,\"cause\":{\"kind\":",
              (unsigned long long)p->seq, (long long)p->args.timeout_ms,
              (unsigned long long)(waited_ns / 1000000ull));
    loom_jstr(j, loom_p2p_kind_name(c->kind));
    loom_jput(j, ",\"rank\":%d,\"host\":", c->rank);
    loom_jstr(j, p->peers[c->rank].hostname);
    loom_jput(j, ",\"pid\":%d,\"reported_by\":%d},\"pending_count\":%d", (int)p->peers[c->rank].pid,
              c->via, npending);
}

static void dump_request(const loom_p2p_t *p, const loom_p2p_req_t *r, loom_jbuf_t *j)
{
    const int coll = (r->tag & 0x80000000u) != 0;
    loom_jput(j, "{\"peer\":%d,\"host\":", r->peer);
    loom_jstr(j, p->peers[r->peer].hostname);
    loom_jput(j, ",\"pid\":%d,\"transport\":\"%s\",\"dir\":\"%s\",\"bytes\":%zu,\"tag\":\"0x%08x\"",
              (int)p->peers[r->peer].pid, r->tp ? r->tp->name : "self",
              r->is_send ? "send" : "recv", r->nbytes, r->tag);
    if (coll)
        loom_jput(j, ",\"tag_kind\":\"collective\",\"tag_seq\":%u,\"step\":%u}",
                  (r->tag >> 7) & 0xFFFFFFu, r->tag & 0x7Fu);
    else
        loom_jput(j, ",\"tag_kind\":\"%s\"}", r->tag == LOOM_TAG_P2P ? "send/recv" : "other");
}

/* What this rank waited for when it timed out: at INFO, one JSON object per line
 * (the header, then each pending request), and with LOOM_DUMP_ON_TIMEOUT one JSON
 * object in that file. */
void loom_p2p_dump_timeout(const loom_p2p_t *p, const loom_p2p_req_t *reqs, int n, const cause_t *c,
                           uint64_t waited_ns)
{
    const char *pattern = loom_param_DUMP_ON_TIMEOUT();
    const int info = loom_log_enabled(LOOM_LOG_INFO, LOOM_LOG_ALL);
    if (!info && (pattern == NULL || *pattern == '\0'))
        return;
    int npending = 0;
    for (int i = 0; i < n; i++)
        npending += !reqs[i].done;
    char line[960];
    loom_jbuf_t j = {line, sizeof(line), 0};
    if (info) {
        dump_header(p, c, waited_ns, npending, &j);
        loom_jput(&j, "}");
        LOOM_INFO(LOOM_LOG_ALL, "timeout dump: %s", line);
        for (int i = 0; i < n; i++) {
            if (reqs[i].done)
                continue;
            j.len = 0;
            dump_request(p, &reqs[i], &j);
            LOOM_INFO(LOOM_LOG_ALL, "timeout dump pending: %s", line);
        }
    }
    if (pattern == NULL || *pattern == '\0')
        return;
    size_t cap = 1024 + (size_t)DUMP_MAX_PENDING * 320;
    char *doc = malloc(cap);
    if (doc == NULL) {
        LOOM_WARN("rank %d: out of memory (%zu bytes) for the timeout dump", p->rank, cap);
        return;
    }
    loom_jbuf_t d = {doc, cap, 0};
    dump_header(p, c, waited_ns, npending, &d);
    loom_jput(&d, ",\"pending\":[");
    int listed = 0;
    for (int i = 0; i < n && listed < DUMP_MAX_PENDING; i++) {
        if (reqs[i].done)
            continue;
        loom_jput(&d, "%s", listed++ ? "," : "");
        dump_request(p, &reqs[i], &d);
    }
    loom_jput(&d, "]}\n");
    char path[512];
    loom_expand_path(pattern, p->peers[p->rank].hostname, p->rank, path, sizeof(path));
    FILE *f = fopen(path, "w");
    int bad = f == NULL || fputs(doc, f) == EOF, e = errno;
    if (f != NULL && fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad)
        LOOM_WARN("rank %d: cannot write the timeout dump (LOOM_DUMP_ON_TIMEOUT) to %s: %s",
                  p->rank, path, strerror(e));
    else
        LOOM_INFO(LOOM_LOG_ALL, "rank %d: timeout dump written to %s", p->rank, path);
    free(doc);
}
