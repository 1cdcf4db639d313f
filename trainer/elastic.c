/* SPDX-License-Identifier: Apache-2.0
 *
 * elastic.c - --elastic: when a rank dies, the survivors revoke their communicators, shrink the
 * world to themselves (loomCommShrink finds the dead), abort the old communicators and rebuild
 * the grid with a smaller data-parallel degree; main.c then rebuilds the model for it and
 * restores the state (in memory under plain DP, else from the layout-independent checkpoint of
 * ckpt_global.c). What cannot be rebuilt is refused here with a message on every survivor.
 * trainer/doc/elastic.md says what happens when.
 */
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int elastic_check(const opts_t *o)
{
    const char *bad = NULL;
    if (!o->elastic && (o->kill_step || o->kill_rank))
        bad = "--elastic-kill-rank and --elastic-kill-step need --elastic";
    else if (o->save_every && !o->save)
        bad = "--save-every needs --save PREFIX";
    else if (o->elastic && o->optim == OPTIM_MUON)
        bad = "--elastic with --optim muon is not supported (the layout-independent checkpoint "
              "holds AdamW's moments, and Muon's state is laid out by a plan over one data group)";
    else if (o->elastic && o->model.moe_e > 0)
        bad = "--elastic with --moe is not supported (the experts are placed over an EP group "
              "that the world size fixes)";
    else if (o->elastic && o->dump_grads)
        bad = "--elastic with --dump-grads is not supported";
    else if (o->elastic && o->diloco)
        bad = "--elastic with --diloco is not supported (the replicas' own parameters and moments "
              "and the outer state are in no checkpoint, and the lost replica's work since the "
              "last outer step cannot be redone)";
    else if (o->elastic && o->schedule == SCHED_DUALPIPE)
        bad = "--elastic with --pp-schedule dualpipe is not supported (a pipeline cannot be "
              "rebuilt without a rank, and DualPipe's checkpoint would hold one copy of two)";
    if (bad)
        fprintf(stderr, "loom-train: %s\n", bad);
    return bad ? -1 : 0;
}

void elastic_arm_kill(tcomm_t *c, const opts_t *o, int64_t step, int recovered)
{
    /* Only in the first world: after a shrink the victim's number is a survivor's. */
    if (o->kill_step > 0 && !recovered && c->rank == o->kill_rank && step + 1 == o->kill_step)
        c->kill_after = 2;
}

int elastic_in_memory(const opts_t *o)
{
    return o->zero == 0 && o->tp * o->pp * o->cp == 1;
}

uint64_t elastic_run_id(tcomm_t *c)
{
    int64_t id = (int64_t)((uint64_t)getpid() << 32 ^ (uint64_t)(tc_now() * 1e9));
    tc_check(loomBroadcast(&id, &id, 1, loomInt64, 0, c->world, NULL), c, "loomBroadcast");
    return (uint64_t)id;
}

/* Ranks as "2" or "0, 3". */
static void rank_list(char *buf, size_t n, const int *r, int k)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < k && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%d", i ? ", " : "", r[i]);
}

void elastic_shrink(tcomm_t *c, opts_t *o, elastic_ev_t *ev)
{
    double t0 = tc_now();
    ev->old_world = c->size, ev->old_rank = c->rank;
    loomComm_t old[] = {c->tp,   c->cp, c->data, c->tie, c->ep, c->edp != c->data ? c->edp : NULL,
                        c->world};
    const int nold = (int)(sizeof(old) / sizeof(old[0]));
    /* Every communicator of the grid may hold the dead rank, and a survivor may be blocked on
     * any of them: revoking all wakes every call of this rank and, through the broken
     * connections, every peer's call waiting on it. */
    for (int i = 0; i < nold; i++)
        if (old[i])
            loomCommRevoke(old[i], LOOM_REVOKE_DEFAULT);
    /* The stream's queued reductions fail at once on the revoked data communicator; their
     * errors are this failure's. */
    loomStreamDestroy(c->stream);
    c->stream = NULL;
    if (c->echo)
        loomEchoDestroy(c->echo);
    c->echo = NULL;
    loomComm_t nw = NULL;
    loomResult_t r = loomInternalError;
    /* A rank dying during the shrink can make the survivors' views differ: the shrink then fails
     * on all of them, and can be made again. */
    for (int attempt = 1; attempt <= 3 && r != loomSuccess; attempt++) {
        r = loomCommShrink(c->world, NULL, 0, &nw, NULL, LOOM_SHRINK_DEFAULT);
        if (r != loomSuccess)
            fprintf(stderr, "loom-train: rank %d: elastic: shrink attempt %d failed: %s: %s\n",
                    c->rank, attempt, loomGetErrorString(r), loomGetLastError(c->world));
    }
    for (int i = 0; i < nold; i++)
        if (old[i])
            loomCommAbort(old[i]);
    c->world = c->tp = c->cp = c->data = c->tie = c->ep = c->edp = NULL;
    if (r != loomSuccess) {
        fprintf(stderr, "loom-train: rank %d: elastic: cannot shrink the world, stopping\n",
                ev->old_rank);
        exit(1);
    }
    c->world = nw;
    int size = 0, rank = 0;
    loomCommCount(nw, &size);
    loomCommUserRank(nw, &rank);
    /* Who is gone: the old numbers of the survivors, gathered. */
    int32_t *olds = calloc((size_t)size, sizeof(int32_t));
    int32_t me = ev->old_rank;
    if (!olds) {
        fprintf(stderr, "loom-train: out of memory\n");
        exit(1);
    }
    tc_check(loomAllGather(&me, olds, 1, loomInt32, nw, NULL), c, "loomAllGather (elastic)");
    ev->nlost = 0;
    for (int k = 0, j = 0; k < ev->old_world; k++) {
        if (j < size && olds[j] == k)
            j++;
        else if (ev->nlost < (int)(sizeof(ev->lost) / sizeof(ev->lost[0])))
            ev->lost[ev->nlost++] = k;
    }
    free(olds);
    ev->new_world = size;
    ev->shrink_s = tc_now() - t0;
    char lost[128], why[512] = "";
    rank_list(lost, sizeof(lost), ev->lost, ev->nlost);
    const int rest = o->tp * o->pp * o->cp;
    if (rest > 1)
        snprintf(why, sizeof(why),
                 "the grid has tp %d x pp %d x cp %d, so a tensor-, pipeline- or "
                 "context-parallel group lost a member; re-forming such groups from the "
                 "survivors is not supported (--elastic recovers data parallelism and ZeRO)",
                 o->tp, o->pp, o->cp);
    else if (o->batch % (size * o->micro))
        snprintf(why, sizeof(why),
                 "--batch %d is not a multiple of the new dp %d x --micro %d (each step keeps "
                 "the same global batch, split evenly over the survivors)",
                 o->batch, size, o->micro);
    if (why[0]) {
        fprintf(stderr,
                "loom-train: rank %d (was %d): elastic: cannot go on without rank %s (world %d "
                "-> %d): %s\n",
                rank, ev->old_rank, lost, ev->old_world, size, why);
        loomCommAbort(nw);
        exit(3);
    }
    o->dp = size / rest;
    c->rank = rank, c->size = size;
    memset(c->calls, 0, sizeof(c->calls));
    memset(c->bytes, 0, sizeof(c->bytes));
    if (tc_grid(c, o))
        exit(1);
}

void elastic_restore_memory(engine_t *e, float *g, int64_t step)
{
    tcomm_t *c = e->c;
    size_t n = e->lay.global_len;
    double v[3] = {(double)step, -(double)step, 0};
    tc_check(loomAllReduce(v, v, 2, loomFloat64, loomMax, c->world, NULL), c, "elastic steps");
    if (v[0] != -v[1]) {
        v[2] = step == (int64_t)v[0] ? c->rank : c->size;
        tc_check(loomAllReduce(v + 2, v + 2, 1, loomFloat64, loomMin, c->world, NULL), c,
                 "elastic holder");
        tc_check(loomBroadcast(g, g, 3 * n, loomFloat32, (int)v[2], c->world, NULL), c,
                 "elastic state");
        step = (int64_t)v[0];
    }
    eng_import(e, g, g + n, g + 2 * n);
    e->step = step;
}

const char *elastic_restore_ckpt(engine_t *e, const opts_t *o, const elastic_state_t *st,
                                 int64_t first_step)
{
    tcomm_t *c = e->c;
    double v[2] = {(double)st->ckpt_step, -(double)st->ckpt_step}, failed = 0;
    tc_check(loomAllReduce(v, v, 2, loomFloat64, loomMax, c->world, NULL), c, "elastic ckpt");
    const char *from = v[0] >= 0 ? o->save : st->resume_global >= 0 ? o->resume : NULL;
    char err[512] = "";
    if (!from && first_step > 0) {
        snprintf(err, sizeof(err),
                 "no checkpoint to reload: the run resumed from a per-rank checkpoint and has not "
                 "saved since (use --save-every)");
        failed = 1;
    } else if (from) {
        uint64_t step = 0, id = 0;
        failed = ckpt_global_load(e, from, &step, &id, err, sizeof(err)) ? 1 : 0;
        /* Never a stale file: this run's, and not older than what any survivor saw saved (it
         * may be newer where the failure hit the save's last collective). */
        if (!failed && (v[0] >= 0 ? id != st->run_id || (double)step < -v[1]
                                  : (int64_t)step != st->resume_global)) {
            snprintf(err, sizeof(err), "%s.global is not the checkpoint this run wrote last", from);
            failed = 1;
        }
    }
    if (failed)
        fprintf(stderr, "loom-train: rank %d: elastic: %s\n", c->rank, err);
    tc_check(loomAllReduce(&failed, &failed, 1, loomFloat64, loomMax, c->world, NULL), c,
             "elastic load");
    if (failed > 0)
        exit(3);
    if (!from)
        eng_init_params(e);
    return from ? "checkpoint" : "initial";
}

void elastic_report(FILE *log, const elastic_ev_t *ev, int n, int dp, int quiet)
{
    char lost[96] = "";
    for (int i = 0, at = 0; i < ev->nlost; i++)
        at += snprintf(lost + at, sizeof(lost) - (size_t)at, "%s%d", i ? "," : "", ev->lost[i]);
    if (!quiet)
        printf(
            "loom-train: elastic: step %lld failed, rank %s lost; world %d -> %d (dp %d); "
            "going on from step %lld, %s state; recovery %.3f s (shrink %.3f s, rebuild %.3f s)\n",
            (long long)ev->failed_step + 1, lost, ev->old_world, ev->new_world, dp,
            (long long)ev->resume_step, ev->path, ev->recovery_s, ev->shrink_s, ev->rebuild_s);
    if (log) {
        fprintf(log,
                "{\"elastic\":%d,\"failed_step\":%lld,\"old_world\":%d,\"new_world\":%d,"
                "\"dp\":%d,\"lost\":[%s],\"path\":\"%s\",\"resume_step\":%lld,"
                "\"recovery_s\":%.6f,\"shrink_s\":%.6f,\"rebuild_s\":%.6f}\n",
                n, (long long)ev->failed_step + 1, ev->old_world, ev->new_world, dp, lost, ev->path,
                (long long)ev->resume_step, ev->recovery_s, ev->shrink_s, ev->rebuild_s);
        fflush(log);
    }
}
