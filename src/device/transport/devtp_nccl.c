/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp_nccl.c - the nccl device transport (devtp.h): a real NCCL
 * communicator paired with the loom one moves the bytes, loom's kernels do
 * every reduction in rank order (devtp_nccl_run.c); this file finds the
 * library, sets the pair up, releases and tears it down.
 *
 * The library is opened once per process with dlopen, never linked:
 * LOOM_NCCL_LIBRARY (an absolute path) when set; else a libnccl.so.2
 * already loaded in the process (a framework's); else the homes the drop-in
 * library searches (NCCL_HOME/lib, CUDA_HOME and CUDA_PATH lib64 and lib,
 * /usr/local/cuda, the system library directories); else the loader's search
 * path. A library that resolves loom's own symbols is loom's drop-in NCCL
 * (libloom-nccl.so, also named libnccl.so.2) and is refused: pairing loom
 * with itself would loop. NCCL 2.7 or later (grouped Send/Recv) is needed.
 *
 * open (collective) requires the CUDA runtime, the library, and one GPU per
 * rank: NCCL refuses two ranks on one GPU, so the ranks exchange the PCI bus
 * id of their device and the identity of their machine (host name and boot
 * id) and refuse a shared GPU beforehand, naming both ranks. Rank 0 makes
 * the NCCL unique id, loomBroadcast hands it to the others, every rank calls
 * ncclCommInitRank with its device current. Each step ends with the
 * agreement of devtp_util.h, so all ranks return alike with the first
 * failing rank's reason. A test replaces the runtime and GPU checks through
 * loom_devtp_nccl_set_seam (devtp_nccl.h) and nothing else.
 *
 * release aborts the NCCL communicator (ncclCommAbort ends its kernels'
 * waits); run and release exclude each other with a lock, so the handle is
 * never used while or after it is aborted. A run blocked inside NCCL (its
 * lazy connection set-up waiting for a dead peer) holds a release back
 * until NCCL gives up. close destroys the communicator once this rank's
 * queued work is done (bounded by the timeout; aborted otherwise).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "devtp_nccl.h"
#include "nccl_homes.h"
#include "param.h"

#define NCCL_MIN_BYTES 4096u
#define NCCL_CLOSE_MS  2000 /* close's wait for queued work after a release */

// ---- the library ----------------------------------------------------------------

static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static loom_nccl_lib_t lib;
static const loom_nccl_lib_t *lib_ptr;
static char lib_why[768] = "the NCCL library was not looked for";

static void decode_version(int code, int *major, int *minor)
{
    if (code >= 10000) {
        *major = code / 10000;
        *minor = code / 100 % 100;
    } else {
        *major = code / 1000;
        *minor = code / 100 % 10;
    }
}

/* Takes the library at h (opened from what); 0, or -1 with lib_why set. */
static int take(void *h, const char *what)
{
    if (dlsym(h, "loomCommInitRank") != NULL) {
        snprintf(lib_why, sizeof(lib_why),
                 "the library is loom's drop-in NCCL library (libloom-nccl.so), not the real "
                 "NCCL (point LOOM_NCCL_LIBRARY at the real libnccl.so.2): %s",
                 what); /* the path last: a long one is what gets cut */
        return -1;
    }
    loom_nccl_lib_t l;
    memset(&l, 0, sizeof(l));
    struct {
        const char *name;
        void *slot;
        size_t size;
        int required;
    } fns[] = {
#define FN(n, req) {"nccl" #n, &l.n, sizeof(l.n), req}
        FN(GetVersion, 1),   FN(GetErrorString, 1), FN(GetLastError, 0), FN(GetUniqueId, 1),
        FN(CommInitRank, 1), FN(CommDestroy, 1),    FN(CommAbort, 1),    FN(GroupStart, 1),
        FN(GroupEnd, 1),     FN(Send, 1),           FN(Recv, 1),         FN(AllGather, 1),
        FN(Broadcast, 1),
#undef FN
    };
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        void *sym = dlsym(h, fns[i].name);
        if (sym == NULL && fns[i].required) {
            snprintf(lib_why, sizeof(lib_why), "%s has no %s (NCCL 2.7 or later is needed)", what,
                     fns[i].name);
            return -1;
        }
        memcpy(fns[i].slot, &sym, fns[i].size); /* dlsym's void * to a function pointer */
    }
    int major = 0, minor = 0;
    if (l.GetVersion(&l.version) != LOOM_NCCL_SUCCESS) {
        snprintf(lib_why, sizeof(lib_why), "%s: ncclGetVersion failed", what);
        return -1;
    }
    decode_version(l.version, &major, &minor);
    if (major < 2 || (major == 2 && minor < 7)) {
        snprintf(lib_why, sizeof(lib_why), "%s is NCCL %d.%d; 2.7 or later is needed", what, major,
                 minor);
        return -1;
    }
    Dl_info info;
    void *get_version;
    memcpy(&get_version, &l.GetVersion, sizeof(get_version));
    snprintf(l.path, sizeof(l.path), "%s",
             dladdr(get_version, &info) && info.dli_fname ? info.dli_fname : what);
    lib = l;
    return 0;
}

static int try_path(const char *path, int flags)
{
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE | flags);
    if (h == NULL) {
        if (!(flags & RTLD_NOLOAD)) {
            const char *e = dlerror();
            snprintf(lib_why, sizeof(lib_why), "dlopen(%s) failed: %s", path, e ? e : "no reason");
        }
        return -1;
    }
    return take(h, path);
}

static void lib_init(void)
{
    const char *env = loom_param_NCCL_LIBRARY();
    if (env != NULL && *env != '\0') {
        if (env[0] != '/')
            snprintf(lib_why, sizeof(lib_why),
                     "LOOM_NCCL_LIBRARY=%s is not an absolute path (a bare name may find loom's "
                     "drop-in library)",
                     env);
        else if (try_path(env, 0) == 0)
            lib_ptr = &lib;
        return;
    }
    if (try_path("libnccl.so.2", RTLD_NOLOAD) == 0) { /* the process's own, if any */
        lib_ptr = &lib;
        return;
    }
    char path[512];
    int r;
    for (size_t i = 0; (r = loom_nccl_home(i, path, sizeof(path))) >= 0; i++) {
        if (r == 0)
            continue;
        if (access(path, R_OK) == 0 && try_path(path, 0) == 0) {
            lib_ptr = &lib;
            return;
        }
    }
    if (try_path("libnccl.so.2", 0) == 0) {
        lib_ptr = &lib;
        return;
    }
    snprintf(lib_why, sizeof(lib_why),
             "no libnccl.so.2 loaded, beside the CUDA toolkit or on the loader's path; set "
             "LOOM_NCCL_LIBRARY to its path");
}

// ---- the seam ---------------------------------------------------------------------

static pthread_mutex_t seam_lock = PTHREAD_MUTEX_INITIALIZER;
static loom_devtp_nccl_seam_t seam;

void loom_devtp_nccl_set_seam(const loom_devtp_nccl_seam_t *s)
{
    pthread_mutex_lock(&seam_lock);
    if (s != NULL)
        seam = *s;
    else
        memset(&seam, 0, sizeof(seam));
    pthread_mutex_unlock(&seam_lock);
}

static loom_devtp_nccl_seam_t seam_get(void)
{
    pthread_mutex_lock(&seam_lock);
    loom_devtp_nccl_seam_t s = seam;
    pthread_mutex_unlock(&seam_lock);
    return s;
}

// ---- errors -----------------------------------------------------------------------

loomResult_t loom_devtp_nccl_fail(const nccl_state_t *st, loom_nccl_result_t res, const char *what)
{
    const loom_nccl_lib_t *l = st->lib;
    const char *last = l->GetLastError ? l->GetLastError(st->comm) : NULL;
    LOOM_WARN("nccl device transport: rank %d: %s failed: %s%s%s", st->rank, what,
              l->GetErrorString(res), last && *last ? ": " : "", last && *last ? last : "");
    /* loom's results number NCCL's (include/loom.h). */
    return res > 0 && res < loomNumResults ? (loomResult_t)res : loomInternalError;
}

// ---- release and teardown ---------------------------------------------------------

static void nccl_release(loom_dev_comm_t *dc, void *state)
{
    (void)dc;
    nccl_state_t *st = state;
    if (st == NULL)
        return;
    __atomic_store_n(&st->released, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&st->lock);
    if (!st->aborted && st->comm != NULL) {
        st->aborted = 1;
        loom_nccl_result_t res = st->lib->CommAbort(st->comm);
        if (res != LOOM_NCCL_SUCCESS)
            loom_devtp_nccl_fail(st, res, "ncclCommAbort");
    }
    pthread_mutex_unlock(&st->lock);
}

static void nccl_free(nccl_state_t *st, int leak_device)
{
    if (!leak_device) {
        if (st->scratch != NULL)
            st->rt->mem_free(st->scratch);
        loom_devtp_track_fini(&st->track, st->rt);
    }
    pthread_mutex_destroy(&st->lock);
    free(st);
}

static void nccl_close(loom_dev_comm_t *dc, void *state)
{
    nccl_state_t *st = state;
    if (st == NULL)
        return;
    int64_t timeout = dc->timeout_ms > 0 ? dc->timeout_ms : 0;
    int idle = loom_devtp_track_wait(
        &st->track, st->rt,
        __atomic_load_n(&st->released, __ATOMIC_ACQUIRE) ? NCCL_CLOSE_MS : timeout);
    pthread_mutex_lock(&st->lock);
    if (idle && !st->aborted && st->comm != NULL) {
        loom_nccl_result_t res = st->lib->CommDestroy(st->comm);
        st->aborted = 1;
        if (res != LOOM_NCCL_SUCCESS)
            loom_devtp_nccl_fail(st, res, "ncclCommDestroy");
    }
    pthread_mutex_unlock(&st->lock);
    if (!idle) {
        LOOM_WARN("nccl device transport: rank %d: work queued on the device did not finish "
                  "within %lld ms of close; aborting the NCCL communicator",
                  st->rank, (long long)timeout);
        nccl_release(dc, st);
        idle = loom_devtp_track_wait(&st->track, st->rt, NCCL_CLOSE_MS);
        if (!idle)
            LOOM_WARN("nccl device transport: rank %d: a stream still runs this transport's "
                      "work; its device scratch is left allocated rather than freed under it",
                      st->rank);
    }
    nccl_free(st, !idle);
}

// ---- set-up -----------------------------------------------------------------------

typedef struct {
    char machine[112]; /* host name and boot id */
    char gpu[32];      /* PCI bus id of the device (or the seam's identity) */
    uint64_t bytes;    /* its scratch: every rank chunks by the smallest */
} nccl_entry_t;

static void machine_id(char *out, size_t len)
{
    char host[64] = "", boot[48] = "";
    gethostname(host, sizeof(host) - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    snprintf(out, len, "%s/%s", host, boot);
}

/* Phase 1, local: runtime, library, device, scratch. */
static loomResult_t setup_local(loom_dev_comm_t *dc, nccl_state_t *st, nccl_entry_t *me,
                                const loom_devtp_nccl_seam_t *sm, char *why, size_t why_len)
{
    const loom_devrt_t *rt = dc->rt;
    if (!sm->any_runtime && strcmp(rt->name, "cuda") != 0) {
        loom_devtp_why(why, why_len, "it needs the CUDA runtime (the device runtime is %s)",
                       rt->name);
        return loomInvalidUsage;
    }
    pthread_once(&lib_once, lib_init);
    if (lib_ptr == NULL) {
        loom_devtp_why(why, why_len, "no usable NCCL library: %s", lib_why);
        return loomInvalidUsage;
    }
    st->lib = lib_ptr;
    int cur = -1;
    if (rt->current_device(&cur) == loomSuccess && cur != dc->device) {
        loom_devtp_why(why, why_len,
                       "the calling thread's current device is %d, the communicator's is %d", cur,
                       dc->device);
        return loomInvalidUsage;
    }
    machine_id(me->machine, sizeof(me->machine));
    if (sm->gpu_id != NULL) {
        if (sm->gpu_id(dc, me->gpu, sizeof(me->gpu), why, why_len) != 0)
            return loomInvalidUsage;
    } else {
        loom_dev_props_t props;
        memset(&props, 0, sizeof(props));
        loomResult_t r = rt->device_props(dc->device, &props);
        if (r != loomSuccess) {
            loom_devtp_why(why, why_len, "cannot read device %d's properties: %s", dc->device,
                           loomGetLastError(NULL));
            return r;
        }
        if (props.pci_bus_id[0] == '\0') {
            loom_devtp_why(why, why_len, "device %d has no PCI bus id", dc->device);
            return loomInvalidUsage;
        }
        snprintf(me->gpu, sizeof(me->gpu), "%s", props.pci_bus_id);
    }
    int64_t want = loom_param_DEVICE_NCCL_BYTES();
    st->chunk_bytes = want < (int64_t)NCCL_MIN_BYTES ? NCCL_MIN_BYTES : (size_t)want;
    st->chunk_bytes &= ~(size_t)(NCCL_MIN_BYTES - 1);
    me->bytes = st->chunk_bytes;
    loomResult_t r = rt->mem_alloc(&st->scratch, st->chunk_bytes);
    if (r != loomSuccess)
        loom_devtp_why(why, why_len, "cannot allocate %zu bytes of device scratch: %s",
                       st->chunk_bytes, loomGetLastError(NULL));
    return r;
}

/* The same answer on every rank: no two ranks of one machine on one GPU. */
static loomResult_t check_gpus(loom_dev_comm_t *dc, const nccl_entry_t *all, char *why,
                               size_t why_len)
{
    for (int i = 0; i < dc->nranks; i++)
        for (int j = i + 1; j < dc->nranks; j++)
            if (strncmp(all[i].machine, all[j].machine, sizeof(all[i].machine)) == 0 &&
                strncmp(all[i].gpu, all[j].gpu, sizeof(all[i].gpu)) == 0) {
                loom_devtp_why(why, why_len,
                               "ranks %d and %d share the GPU %.32s: NCCL needs a GPU of its own "
                               "for each rank",
                               i, j, all[i].gpu);
                return loomInvalidUsage;
            }
    return loomSuccess;
}

static loomResult_t nccl_open(loom_dev_comm_t *dc, void **state, char *why, size_t why_len)
{
    *state = NULL;
    loom_devtp_nccl_seam_t sm = seam_get();
    char mine[LOOM_DEVTP_WHY_BYTES] = "";
    nccl_state_t *st = calloc(1, sizeof(*st));
    nccl_entry_t me, *all = calloc((size_t)dc->nranks, sizeof(*all));
    memset(&me, 0, sizeof(me));
    loomResult_t r = loomSystemError;
    if (st == NULL || all == NULL) {
        snprintf(mine, sizeof(mine), "out of memory");
        free(st);
        st = NULL;
    } else {
        st->rt = dc->rt;
        st->rank = dc->rank;
        st->nranks = dc->nranks;
        pthread_mutex_init(&st->lock, NULL);
        loom_devtp_track_init(&st->track);
        r = setup_local(dc, st, &me, &sm, mine, sizeof(mine));
    }
    loomResult_t agreed = loom_devtp_agree(dc, r, mine, why, why_len);
    if (agreed == loomSuccess)
        agreed = loom_devtp_allgather(dc, &me, all, sizeof(me), why, why_len);
    if (agreed == loomSuccess) {
        agreed = check_gpus(dc, all, why, why_len);
        for (int i = 0; i < dc->nranks; i++)
            if (all[i].bytes < st->chunk_bytes)
                st->chunk_bytes = (size_t)all[i].bytes;
    }
    free(all);
    loom_nccl_id_t id;
    memset(&id, 0, sizeof(id));
    if (agreed == loomSuccess) {
        r = loomSuccess;
        if (dc->rank == 0) {
            loom_nccl_result_t res = st->lib->GetUniqueId(&id);
            if (res != LOOM_NCCL_SUCCESS) {
                r = loom_devtp_nccl_fail(st, res, "ncclGetUniqueId");
                snprintf(mine, sizeof(mine), "ncclGetUniqueId failed: %s", loom_last_error());
            }
        }
        agreed = loom_devtp_agree(dc, r, mine, why, why_len);
    }
    if (agreed == loomSuccess) {
        agreed = loomBroadcast(&id, &id, sizeof(id), loomUint8, 0, dc->comm, NULL);
        if (agreed != loomSuccess)
            loom_devtp_why(why, why_len, "the broadcast of NCCL's unique id failed: %s",
                           loomGetLastError(dc->comm));
    }
    if (agreed == loomSuccess) {
        loom_nccl_result_t res = st->lib->CommInitRank(&st->comm, dc->nranks, id, dc->rank);
        r = loomSuccess;
        if (res != LOOM_NCCL_SUCCESS) {
            r = loom_devtp_nccl_fail(st, res, "ncclCommInitRank");
            snprintf(mine, sizeof(mine), "ncclCommInitRank failed: %s", loom_last_error());
            st->comm = NULL;
        }
        agreed = loom_devtp_agree(dc, r, mine, why, why_len);
    }
    if (agreed != loomSuccess) {
        if (st != NULL) {
            if (st->comm != NULL)
                st->lib->CommAbort(st->comm);
            nccl_free(st, 0);
        }
        return agreed;
    }
    LOOM_INFO(LOOM_LOG_TRANSPORT,
              "nccl device transport: rank %d of %d paired with NCCL %d from %s", dc->rank,
              dc->nranks, st->lib->version, st->lib->path);
    *state = st;
    return loomSuccess;
}

const loom_devtp_t loom_devtp_nccl = {
    .name = "nccl",
    .capturable = 1,
    .open = nccl_open,
    .close = nccl_close,
    .handles = loom_devtp_nccl_handles,
    .run = loom_devtp_nccl_run,
    .release = nccl_release,
};
