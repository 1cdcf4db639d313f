/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p_stamp.c - call stamps: what every message of a collective says about
 * the call it belongs to (kind, count, datatype, op, root, sequence number),
 * the comparison of an arriving stamp with this rank's own call, the probes
 * a stalled wait sends so that ranks that wait on one another still compare
 * calls, and the words of a mismatch. The transports only carry stamps and
 * hand them back (the contract in transport.h); p2p_wait.c turns what is found
 * here into the failure of every rank (notices). It also compares a call seen
 * outside the messages (loom_p2p_call_seen: the shm arena's descriptors and
 * cells) the same way. Callers: p2p.c, p2p_wait.c, the transports through
 * p2p->stamp_ops, loom_coll_run (set_call) and the shm arena (call_seen).
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "dtype.h"
#include "p2p_impl.h"
#include "timer.h"

/* Stamp layout (little-endian, LOOM_TP_STAMP_BYTES):
 *   u64 count (all ones: any), u32 seq (low bits), i32 root (-1: any),
 *   u8 kind (0xff: not a collective), u8 datatype, u8 op (0xff: any), u8 version
 * A stamp of another version (zeros: an unstamped frame) is not compared. */
#define STAMP_VERSION 1u
#define BYTE_ANY      0xffu

static void put_le(uint8_t *b, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *b, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static uint8_t small_field(int32_t v)
{
    return v < 0 || v >= (int32_t)BYTE_ANY ? (uint8_t)BYTE_ANY : (uint8_t)v;
}

static int32_t small_value(uint8_t b, int32_t any)
{
    return b == BYTE_ANY ? any : (int32_t)b;
}

static void stamp_encode(const call_state_t *cs, uint8_t b[LOOM_TP_STAMP_BYTES])
{
    put_le(b, cs->c.count < 0 ? UINT64_MAX : (uint64_t)cs->c.count, 8);
    put_le(b + 8, (uint32_t)cs->seq, 4);
    put_le(b + 12, (uint32_t)cs->c.root, 4);
    b[16] = small_field(cs->c.kind);
    b[17] = small_field(cs->c.dt);
    b[18] = small_field(cs->c.op);
    b[19] = STAMP_VERSION;
}

/* 0 if b is no stamp of this version. */
static int stamp_decode(const uint8_t *b, call_state_t *cs)
{
    if (b[19] != STAMP_VERSION)
        return 0;
    const uint64_t count = get_le(b, 8);
    cs->c.count = count == UINT64_MAX ? LOOM_P2P_CALL_ANY : (int64_t)count;
    cs->seq = get_le(b + 8, 4);
    cs->c.root = (int32_t)(uint32_t)get_le(b + 12, 4);
    cs->c.kind = small_value(b[16], CALL_OTHER);
    cs->c.dt = small_value(b[17], LOOM_P2P_CALL_ANY);
    cs->c.op = small_value(b[18], LOOM_P2P_CALL_ANY);
    return 1;
}

// ---- stating the call ---------------------------------------------------------

static void call_switch(loom_p2p_t *p, uint64_t seq, const loom_p2p_call_t *c)
{
    if (seq != p->call.seq)
        p->call_prev = p->call;
    p->call.seq = seq;
    p->call.c = *c;
    stamp_encode(&p->call, p->stamp);
}

static const loom_p2p_call_t other_call = {.kind = CALL_OTHER,
                                           .dt = LOOM_P2P_CALL_ANY,
                                           .op = LOOM_P2P_CALL_ANY,
                                           .root = LOOM_P2P_CALL_ANY,
                                           .count = LOOM_P2P_CALL_ANY};

void loom_p2p_set_context(loom_p2p_t *p, const char *what, uint64_t seq)
{
    p->what = what; /* once per call: no copy */
    p->seq = seq;
    /* Send/receive work runs under the last collective's number: that call stays. */
    if (seq != p->call.seq)
        call_switch(p, seq, &other_call);
}

void loom_p2p_set_call(loom_p2p_t *p, const char *what, uint64_t seq, const loom_p2p_call_t *call,
                       const char *const *kind_names, int nkinds)
{
    p->what = what;
    p->seq = seq;
    p->kind_names = kind_names;
    p->nkinds = nkinds;
    call_switch(p, seq, call);
}

// ---- words ----------------------------------------------------------------------

static const char *kind_name(const loom_p2p_t *p, int32_t kind)
{
    if (kind >= 0 && kind < p->nkinds && p->kind_names != NULL)
        return p->kind_names[kind];
    return kind == CALL_OTHER ? "an operation that is not a collective" : "an unknown collective";
}

/* "allreduce seq 5 (count 10, datatype float32, op sum)" */
static void call_text(const loom_p2p_t *p, const call_state_t *cs, char *buf, size_t len)
{
    char part[4][48];
    int n = 0;
    if (cs->c.count >= 0)
        snprintf(part[n++], sizeof(part[0]), "count %lld", (long long)cs->c.count);
    if (cs->c.dt >= 0)
        snprintf(part[n++], sizeof(part[0]), "datatype %s",
                 loom_dtype_name((loomDataType_t)cs->c.dt));
    if (cs->c.op >= 0)
        snprintf(part[n++], sizeof(part[0]), "op %s", loom_redop_name((loomRedOp_t)cs->c.op));
    if (cs->c.root >= 0)
        snprintf(part[n++], sizeof(part[0]), "root %d", (int)cs->c.root);
    size_t o = (size_t)snprintf(buf, len, "%s seq %llu", kind_name(p, cs->c.kind),
                                (unsigned long long)cs->seq);
    for (int i = 0; i < n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : " (", part[i]);
    if (n > 0 && o < len)
        snprintf(buf + o, len - o, ")");
}

static const char *field_name(unsigned f)
{
    switch (f) {
    case MM_KIND:
        return "collective";
    case MM_COUNT:
        return "count";
    case MM_DTYPE:
        return "datatype";
    case MM_OP:
        return "op";
    case MM_ROOT:
        return "root";
    default:
        return "sequence";
    }
}

/* "count, datatype" */
static void fields_text(unsigned mask, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (unsigned f = 1; f & MM_ALL; f <<= 1)
        if ((mask & f) && o < len)
            o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "", field_name(f));
}

static unsigned first_field(unsigned mask)
{
    return mask & (~mask + 1u);
}

static uint64_t field_value(const call_state_t *cs, unsigned f)
{
    switch (f) {
    case MM_KIND:
        return (uint64_t)(int64_t)cs->c.kind;
    case MM_COUNT:
        return (uint64_t)cs->c.count;
    case MM_DTYPE:
        return (uint64_t)(int64_t)cs->c.dt;
    case MM_OP:
        return (uint64_t)(int64_t)cs->c.op;
    case MM_ROOT:
        return (uint64_t)(int64_t)cs->c.root;
    default:
        return cs->seq;
    }
}

/* What one rank passed for field f: "count 10", "datatype float32", "broadcast". */
static void value_text(const loom_p2p_t *p, unsigned f, uint64_t v, char *buf, size_t len)
{
    const int64_t s = (int64_t)v;
    switch (f) {
    case MM_KIND:
        snprintf(buf, len, "%s", kind_name(p, (int32_t)s));
        break;
    case MM_DTYPE:
        snprintf(buf, len, "datatype %s", s < 0 ? "none" : loom_dtype_name((loomDataType_t)s));
        break;
    case MM_OP:
        snprintf(buf, len, "op %s", s < 0 ? "none" : loom_redop_name((loomRedOp_t)s));
        break;
    case MM_SEQ:
        snprintf(buf, len, "call seq %llu", (unsigned long long)v);
        break;
    default:
        snprintf(buf, len, "%s %lld", field_name(f), (long long)s);
        break;
    }
}

static const char *rank_text(const loom_p2p_t *p, int rank, char *buf, size_t len)
{
    if (rank == p->rank)
        snprintf(buf, len, "this rank (%d)", rank);
    else
        loom_p2p_who(p, rank, buf, len);
    return buf;
}

void loom_p2p_mismatch_text(const loom_p2p_t *p, const cause_t *c, char *buf, size_t len)
{
    char fields[64], a[160], b[160], va[96], vb[96];
    const unsigned f = first_field(c->code);
    fields_text(c->code, fields, sizeof(fields));
    rank_text(p, c->rank, a, sizeof(a));
    rank_text(p, c->rank2, b, sizeof(b));
    value_text(p, f, c->value, va, sizeof(va));
    value_text(p, f, c->value2, vb, sizeof(vb));
    if (f == MM_SEQ)
        snprintf(buf, len,
                 "mismatched collectives: they differ in %s: %s sent a message of its %s that %s "
                 "did not take in its %s",
                 fields, a, va, b, vb);
    else
        snprintf(buf, len, "mismatched collectives: they differ in %s: %s called %s%s, %s %s",
                 fields, a, f == MM_KIND ? "" : "with ", va, b, vb);
}

// ---- comparing ------------------------------------------------------------------

unsigned loom_p2p_call_diff(const call_state_t *t, const call_state_t *m)
{
    if (t->c.kind != m->c.kind)
        return MM_KIND; /* the other fields of two kinds do not compare */
    unsigned d = 0;
    d |= t->c.count != m->c.count ? (unsigned)MM_COUNT : 0u;
    d |= t->c.dt != m->c.dt ? (unsigned)MM_DTYPE : 0u;
    d |= t->c.op != m->c.op ? (unsigned)MM_OP : 0u;
    d |= t->c.root != m->c.root ? (unsigned)MM_ROOT : 0u;
    return d;
}

loomResult_t loom_p2p_mismatch(loom_p2p_t *p, int peer, unsigned diff, const call_state_t *t,
                               const call_state_t *mine, int late)
{
    char who[160], tt[200], mt[200], fields[64];
    found_t *fd = &p->found;
    loom_p2p_who(p, peer, who, sizeof(who));
    call_text(p, t, tt, sizeof(tt));
    call_text(p, mine, mt, sizeof(mt));
    fields_text(diff, fields, sizeof(fields));
    if (diff != MM_SEQ)
        snprintf(fd->detail, sizeof(fd->detail), "they differ in %s: %s called %s, this rank %s",
                 fields, who, tt, mt);
    else if (late)
        snprintf(fd->detail, sizeof(fd->detail),
                 "they differ in sequence: the next message of %s for this rank's %s belongs to "
                 "its %s",
                 who, mt, tt);
    else
        snprintf(fd->detail, sizeof(fd->detail),
                 "they differ in sequence: %s sent a message of its %s that this rank's call of "
                 "that number did not take (this rank is in %s)",
                 who, tt, mt);
    const unsigned f = first_field(diff);
    fd->set = 1;
    fd->peer = peer;
    fd->res = loomInvalidUsage;
    fd->cause = (cause_t){.kind = N_MISMATCH,
                          .rank = peer,
                          .via = -1,
                          .code = diff,
                          .rank2 = p->rank,
                          .value = field_value(t, f),
                          .value2 = field_value(mine, f)};
    LOOM_WARN("rank %d: mismatched collectives: %s", p->rank, fd->detail);
    return loomInvalidUsage;
}

loomResult_t loom_p2p_call_seen(loom_p2p_t *p, int peer, uint64_t seq,
                                const loom_p2p_call_t *theirs)
{
    const call_state_t *m = seq == p->call.seq ? &p->call : &p->call_prev;
    call_state_t t = {.seq = seq, .c = *theirs};
    /* Where this rank's call leaves a field open, the peer's record of it may
     * hold anything (0 in the arena): not compared. */
    const int same_kind = t.c.kind == m->c.kind;
    if (!same_kind || m->c.dt < 0)
        t.c.dt = LOOM_P2P_CALL_ANY;
    if (!same_kind || m->c.op < 0)
        t.c.op = LOOM_P2P_CALL_ANY;
    if (!same_kind || m->c.root < 0)
        t.c.root = LOOM_P2P_CALL_ANY;
    if (!same_kind || m->c.count < 0)
        t.c.count = LOOM_P2P_CALL_ANY;
    /* Only calls of the collectives compare (creation's number is 0). */
    if (t.seq != m->seq || m->c.kind < 0 || m->seq == 0)
        return loomSuccess;
    const unsigned diff = loom_p2p_call_diff(&t, m);
    if (diff == 0)
        return loomSuccess;
    (void)loom_p2p_mismatch(p, peer, diff, &t, m, 0);
    return loom_p2p_wait_event(p, LOOM_P2P_EV_ERROR, p->rank, -1, 0, loomInvalidUsage,
                               loom_now_ns(), NULL);
}

void loom_p2p_call_seqs(const loom_p2p_t *p, uint64_t *cur_p, uint64_t *prev_p)
{
    *cur_p = p->call.seq;
    *prev_p = p->call_prev.seq;
}

/* The transports' check (transport.h) of a stamp from peer, for a message
 * with tag (the receive's tag where the transport matched first). */
static loomResult_t stamp_check(void *arg, int peer, uint32_t tag, const uint8_t *stamp)
{
    loom_p2p_t *p = arg;
    if (p->found.set)
        return loomInvalidUsage; /* nothing more is read once the calls differ */
    /* The common case first: a message of this very call. */
    if (memcmp(stamp, p->stamp, LOOM_TP_STAMP_BYTES) == 0 &&
        (tag == LOOM_TP_TAG_PROBE || ((tag >> 7) & 0xFFFFFFu) == (p->call.seq & 0xFFFFFFu)))
        return loomSuccess;
    call_state_t t;
    if (!stamp_decode(stamp, &t))
        return loomSuccess;
    const int probe = tag == LOOM_TP_TAG_PROBE;
    const int32_t ahead = (int32_t)((uint32_t)t.seq - (uint32_t)p->call.seq);
    const call_state_t *mine = ahead == 0                                      ? &p->call
                               : (uint32_t)t.seq == (uint32_t)p->call_prev.seq ? &p->call_prev
                                                                               : NULL;
    const unsigned diff = mine != NULL ? loom_p2p_call_diff(&t, mine) : 0u;
    /* A message for a receive of another call (transports that match first): the
     * fields of the peer's call and this rank's call of that number, if they differ. */
    if (!probe && ((tag >> 7) & 0xFFFFFFu) != (t.seq & 0xFFFFFFu))
        return diff != 0 ? loom_p2p_mismatch(p, peer, diff, &t, mine, 0)
                         : loom_p2p_mismatch(p, peer, MM_SEQ, &t, &p->call, 1);
    if (ahead > 0) /* the peer is in a later call; probes come again */
        return probe ? loomSuccess : loomInProgress;
    if (diff != 0)
        return loom_p2p_mismatch(p, peer, diff, &t, mine, 0);
    /* A message of a call this rank has finished was never taken by it: the
     * calls of that number differ (a probe from a rank still in it says nothing). */
    if (ahead == 0 || probe)
        return loomSuccess;
    return loom_p2p_mismatch(p, peer, MM_SEQ, &t, &p->call, 0);
}

static loomResult_t stamp_oversize(void *arg, int peer, uint32_t tag, uint64_t nbytes,
                                   size_t capacity)
{
    loom_p2p_t *p = arg;
    char who[160];
    found_t *fd = &p->found;
    loom_p2p_who(p, peer, who, sizeof(who));
    if (fd->set)
        return fd->res;
    snprintf(fd->detail, sizeof(fd->detail),
             "an oversized frame from %s: a %llu-byte message (tag 0x%08x) for a %zu-byte receive",
             who, (unsigned long long)nbytes, tag, capacity);
    fd->set = 1;
    fd->peer = peer;
    fd->res = loomInvalidUsage;
    fd->cause = (cause_t){.kind = N_ERROR,
                          .rank = p->rank,
                          .via = -1,
                          .code = (uint32_t)loomInvalidUsage,
                          .rank2 = 0};
    LOOM_WARN("rank %d: %s", p->rank, fd->detail);
    return loomInvalidUsage;
}

void loom_p2p_stamp_init(loom_p2p_t *p)
{
    p->call = (call_state_t){.seq = 0, .c = other_call};
    p->call_prev = p->call;
    stamp_encode(&p->call, p->stamp);
    p->stamp_ops = (loom_tp_stamp_ops_t){
        .stamp = p->stamp, .check = stamp_check, .oversize = stamp_oversize, .arg = p};
    p->args.stamp_ops = &p->stamp_ops;
}

// ---- probes ---------------------------------------------------------------------

void loom_p2p_probe_peers(loom_p2p_t *p, const loom_p2p_req_t *reqs, int n)
{
    for (int i = 0; i < n; i++) {
        const int r = reqs[i].peer;
        if (reqs[i].done || reqs[i].is_send || r == p->rank || p->closed)
            continue;
        peer_conn_t *c = &p->conns[r];
        if (c->send == NULL)
            continue;
        const loom_tp_t *tp = p->tps[c->tp];
        if (p->probes[r] != NULL) {
            int done = 0;
            size_t nb = 0;
            if (tp->test(p->probes[r], &done, &nb) == loomSuccess && !done)
                continue; /* the last one has not left yet */
            p->probes[r] = NULL;
        }
        /* A failure here is the connection's, and the wait sees it on its own. */
        if (tp->isend(c->send, NULL, 0, LOOM_TP_TAG_PROBE, &p->probes[r]) != loomSuccess)
            p->probes[r] = NULL;
    }
}
