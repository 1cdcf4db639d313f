/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_comm.c - the shim's communicator objects and their table (shim_comm.h),
 * and the bookkeeping of whose failure the calling thread saw last.
 *
 * The table is a small array searched under a mutex: a process holds a few
 * communicators, and the search costs less than the lock around it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_comm.h"
#include "shim_premul.h"
#include "shim_streams.h"
#include "shim_token.h"

/* ---- modes ---------------------------------------------------------------- */

static pthread_once_t paired_once = PTHREAD_ONCE_INIT;
static int paired;

static void paired_init(void)
{
    if (shim_mode() != SHIM_MODE_ROUTE)
        return;
    paired = shim_real() != NULL;
    if (!paired)
        shim_log(SHIM_LOG_INFO, "route mode without a real NCCL (%s): loom handles every call",
                 shim_real_why());
}

int shim_paired(void)
{
    pthread_once(&paired_once, paired_init);
    return paired;
}

/* ---- the table ------------------------------------------------------------ */

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static shim_comm_t **table;
static int table_n, table_cap;

shim_comm_t *shim_comm_new(int rank, int nranks, int blocking, const char *name)
{
    shim_comm_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->refs = 1;
    c->rank = rank;
    c->nranks = nranks;
    c->hosts = 1;
    c->blocking = blocking;
    c->state = ncclInProgress;
    if (name != NULL) {
        snprintf(c->name, sizeof(c->name), "%s", name);
        c->named = 1;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    return c;
}

ncclResult_t shim_comm_list(shim_comm_t *c)
{
    pthread_mutex_lock(&table_lock);
    if (table_n == table_cap) {
        int cap = table_cap ? 2 * table_cap : 16;
        shim_comm_t **t = realloc(table, (size_t)cap * sizeof(*t));
        if (t == NULL) {
            pthread_mutex_unlock(&table_lock);
            return shim_fail(ncclSystemError, "out of memory listing a communicator");
        }
        table = t;
        table_cap = cap;
    }
    shim_comm_hold(c);
    table[table_n++] = c;
    pthread_mutex_unlock(&table_lock);
    return ncclSuccess;
}

/* Under table_lock. */
static int table_index(ncclComm_t handle)
{
    for (int i = 0; i < table_n; i++)
        if (table[i]->handle == handle)
            return i;
    return -1;
}

shim_comm_t *shim_comm_find(ncclComm_t handle)
{
    if (handle == NULL)
        return NULL;
    pthread_mutex_lock(&table_lock);
    int i = table_index(handle);
    shim_comm_t *c = i >= 0 ? table[i] : NULL;
    if (c != NULL)
        shim_comm_hold(c);
    pthread_mutex_unlock(&table_lock);
    return c;
}

shim_comm_t *shim_comm_unlist(ncclComm_t handle)
{
    if (handle == NULL)
        return NULL;
    pthread_mutex_lock(&table_lock);
    int i = table_index(handle);
    shim_comm_t *c = NULL;
    if (i >= 0) {
        c = table[i];
        table[i] = table[--table_n];
    }
    if (table_n == 0) {
        /* Nothing of the shim's left: leak checkers see the process as before. */
        free(table);
        table = NULL;
        table_cap = 0;
    }
    pthread_mutex_unlock(&table_lock);
    return c;
}

void shim_comm_hold(shim_comm_t *c)
{
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_SEQ_CST);
}

void shim_comm_release(shim_comm_t *c)
{
    if (c == NULL || __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    shim_wraps_free(c); /* no call uses them now: the last reference was a call's or the table's */
    shim_premul_free_all(c);
    shim_tokens_free_all(c);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c);
}

ncclResult_t shim_comm_ready(shim_comm_t *c, const char *fn, loomComm_t *loom)
{
    pthread_mutex_lock(&c->lock);
    const ncclResult_t state = c->state;
    const int closing = c->closing;
    loomComm_t l = c->loom;
    /* The failure's text is copied only for a failed communicator: this runs on every call. */
    char msg[sizeof(c->state_msg)];
    msg[0] = '\0';
    if (state != ncclSuccess && state != ncclInProgress)
        snprintf(msg, sizeof(msg), "%s", c->state_msg);
    pthread_mutex_unlock(&c->lock);
    if (closing || (state == ncclSuccess && l == NULL))
        return shim_fail(ncclInvalidArgument, "%s: communicator %p is being destroyed or aborted",
                         fn, (void *)c->handle);
    if (state == ncclInProgress)
        return shim_fail(ncclInvalidUsage,
                         "%s: attempt to use communicator %p before the previous operation "
                         "returned ncclSuccess",
                         fn, (void *)c->handle);
    if (state != ncclSuccess)
        return shim_fail(state, "%s: communicator %p failed to initialize: %s", fn,
                         (void *)c->handle, msg);
    *loom = l;
    return ncclSuccess;
}

/* ---- results -------------------------------------------------------------- */

static _Thread_local int last_failure_real;

ncclResult_t shim_fail(ncclResult_t res, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    shim_warn("%s", buf);
    last_failure_real = 0;
    return res;
}

ncclResult_t shim_loom(loomResult_t res)
{
    ncclResult_t r = shim_from_loom(res);
    if (r != ncclSuccess && r != ncclInProgress)
        last_failure_real = 0;
    return r;
}

ncclResult_t shim_real_result(ncclResult_t res)
{
    if (res != ncclSuccess && res != ncclInProgress) {
        last_failure_real = 1;
        shim_clear_last_error(); /* the real library's text is the one that counts */
    }
    return res;
}

ncclResult_t shim_real_missing(const char *name)
{
    const shim_real_t *real = shim_real();
    return shim_fail(ncclInvalidUsage,
                     "nccl%s: the real NCCL library %s (version %d) does not "
                     "export it",
                     name, real ? real->path : "(none)", real ? real->version : 0);
}

void shim_real_abort(ncclComm_t comm)
{
    const shim_real_t *real = shim_real();
    if (real != NULL && real->CommAbort != NULL && comm != NULL)
        (void)real->CommAbort(comm);
}

int shim_last_failure_real(void)
{
    return last_failure_real;
}
