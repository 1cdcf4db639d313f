/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_real.c - finds and opens the real libnccl.so.2 behind the shim.
 *
 * Never by its bare soname: the loader would answer with the shim itself,
 * which is libnccl.so.2 too. LOOM_NCCL_LIBRARY (an absolute path) wins;
 * without it the usual homes of the library are tried in order: $NCCL_HOME/lib,
 * $CUDA_HOME/lib64, $CUDA_HOME/lib, $CUDA_PATH/lib64, $CUDA_PATH/lib,
 * /usr/local/cuda/lib64, /usr/local/cuda/lib, the multiarch directory,
 * /usr/lib64, /usr/lib. A file that is this library (same device and inode,
 * e.g. the libnccl.so.2 link beside it) is skipped.
 *
 * RTLD_DEEPBIND makes the real library's calls to its own API (ncclBcast
 * calls ncclBroadcast through the PLT, every init calls ncclGetVersion) bind
 * to itself instead of to the shim, which comes first in the global scope.
 * It cannot help when the file was already loaded without it, and the
 * sanitizers refuse it (they die in dlopen); then those calls reach the shim
 * with the real library's handles, and the shim passes them through.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nccl_homes.h"
#include "shim.h"

static pthread_once_t real_once = PTHREAD_ONCE_INIT;
static shim_real_t real;
static const shim_real_t *real_ptr;
static char real_why[1024] = "the real NCCL library was not looked for";

/* Whether a sanitizer runtime that refuses RTLD_DEEPBIND is in the process:
 * built into this library, or into the program that loaded it. */
static int sanitizer_present(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return 1;
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                         \
    __has_feature(memory_sanitizer)
    return 1;
#endif
#endif
    return dlsym(RTLD_DEFAULT, "__asan_init") != NULL ||
           dlsym(RTLD_DEFAULT, "__tsan_init") != NULL || dlsym(RTLD_DEFAULT, "__msan_init") != NULL;
}

/* This library's own file, to refuse opening it as the real one. */
static struct stat self_stat;
static int self_known;

static void find_self(void)
{
    Dl_info info;
    if (dladdr((void *)&shim_real, &info) && info.dli_fname &&
        stat(info.dli_fname, &self_stat) == 0)
        self_known = 1;
}

static int is_self(const struct stat *st)
{
    return self_known && st->st_dev == self_stat.st_dev && st->st_ino == self_stat.st_ino;
}

/* dl_iterate_phdr: the first libnccl.so* mapped that is not this library. */
typedef struct {
    char name[512];
} premapped_t;

static int find_premapped(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    premapped_t *found = arg;
    const char *base = strrchr(info->dlpi_name, '/');
    base = base ? base + 1 : info->dlpi_name;
    if (strncmp(base, "libnccl.so", 10) != 0)
        return 0;
    /* The shim may be mapped under that name too (its libnccl.so.2 link):
     * it is the object whose segments hold this function. */
    uintptr_t self = (uintptr_t)&find_premapped;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && self >= start && self < start + ph->p_memsz)
            return 0;
    }
    snprintf(found->name, sizeof(found->name), "%s", info->dlpi_name);
    return 1;
}

static void decode_version(int code, int *major, int *minor, int *patch)
{
    if (code >= 10000) { /* NCCL_VERSION from 2.9 on */
        *major = code / 10000;
        *minor = code / 100 % 100;
    } else {
        *major = code / 1000;
        *minor = code / 100 % 10;
    }
    *patch = code % 100;
}

/* A function of the real library by its pnccl name: that one is strong, so
 * no game with weak symbols can hand back another library's. NCCL exports
 * ResetDebugInitInternal under its own name only. */
static void *lookup(void *h, const char *name)
{
    char sym[96];
    snprintf(sym, sizeof(sym), "%s%s",
             strcmp(name, "ResetDebugInitInternal") == 0 ? "nccl" : "pnccl", name);
    return dlsym(h, sym);
}

/* Opens path as the real library; on failure real_why says why. */
static int open_real(const char *path, int deepbind)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(real_why, sizeof(real_why), "%s does not exist or cannot be read", path);
        return -1;
    }
    if (is_self(&st)) {
        snprintf(real_why, sizeof(real_why),
                 "%s is this library (libloom-nccl.so) itself, not the real NCCL; point "
                 "LOOM_NCCL_LIBRARY at the real libnccl.so.2",
                 path);
        return -1;
    }
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE | (deepbind ? RTLD_DEEPBIND : 0));
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(real_why, sizeof(real_why), "dlopen(%s) failed: %s", path, e ? e : "no reason");
        return -1;
    }
    void *get_version = dlsym(h, "pncclGetVersion");
    if (get_version == (void *)&pncclGetVersion) {
        snprintf(real_why, sizeof(real_why),
                 "%s is this library (libloom-nccl.so) itself, not the real NCCL", path);
        return -1;
    }
    if (get_version == NULL) {
        snprintf(real_why, sizeof(real_why), "%s is not an NCCL library: it has no pncclGetVersion",
                 path);
        return -1;
    }
    int missing = 0;
    /* dlsym returns void *; the copy through memcpy keeps ISO C quiet about
     * converting it to a function pointer. */
#define SHIM_FN(ret, name, params, args)                                                           \
    {                                                                                              \
        void *sym = lookup(h, #name);                                                              \
        memcpy(&real.name, &sym, sizeof(sym));                                                     \
        missing += sym == NULL;                                                                    \
    }
#define SHIM_FN_VOID(name, params, args) SHIM_FN(void, name, params, args)
#include "shim_api.def"
#undef SHIM_FN
#undef SHIM_FN_VOID
    real.version = 0;
    ncclResult_t r = real.GetVersion(&real.version);
    real.path = strdup(path);
    if (real.path == NULL)
        real.path = "libnccl.so.2"; /* only for messages */
    int major, minor, patch;
    decode_version(real.version, &major, &minor, &patch);
    shim_log(SHIM_LOG_INFO,
             "NCCL shim: real NCCL %d.%d.%d (%d) from %s%s; %d of its functions "
             "missing%s",
             major, minor, patch, real.version, path, deepbind ? " with RTLD_DEEPBIND" : "",
             missing, r == ncclSuccess ? "" : " (its ncclGetVersion failed)");
    return 0;
}

static void real_init(void)
{
    if (shim_mode() == SHIM_MODE_LOOM) {
        snprintf(real_why, sizeof(real_why), "LOOM_NCCL_MODE=loom opens no real NCCL library");
        return;
    }
    find_self();
    premapped_t pre = {{0}};
    if (dl_iterate_phdr(find_premapped, &pre))
        shim_log(SHIM_LOG_INFO,
                 "NCCL shim: %s was loaded into this process before the shim opened the real "
                 "NCCL: RTLD_DEEPBIND cannot isolate it, so its calls to its own API may reach "
                 "the shim; re-entrant calls are passed through to it",
                 pre.name);
    int deepbind = !sanitizer_present();
    if (!deepbind)
        shim_log(SHIM_LOG_INFO,
                 "NCCL shim: a sanitizer runtime is loaded and refuses RTLD_DEEPBIND: the real "
                 "NCCL's calls to its own API reach the shim and are passed through to it");

    const char *env = getenv("LOOM_NCCL_LIBRARY");
    if (env != NULL && *env != '\0') {
        if (env[0] != '/') {
            snprintf(real_why, sizeof(real_why),
                     "LOOM_NCCL_LIBRARY=%s is not an absolute path (a bare name would find this "
                     "library itself)",
                     env);
            return;
        }
        if (open_real(env, deepbind) == 0) {
            real_ptr = &real;
            return;
        }
        static const char prefix[] = "LOOM_NCCL_LIBRARY: ";
        size_t p = sizeof(prefix) - 1, n = strlen(real_why);
        if (n + p >= sizeof(real_why))
            n = sizeof(real_why) - p - 1;
        memmove(real_why + p, real_why, n);
        memcpy(real_why, prefix, p);
        real_why[p + n] = '\0';
        return;
    }

    char tried[sizeof(real_why)] = "";
    size_t o = 0;
    char path[512];
    int r;
    for (size_t i = 0; (r = loom_nccl_home(i, path, sizeof(path))) >= 0; i++) {
        if (r == 0)
            continue;
        struct stat st;
        if (stat(path, &st) != 0)
            continue;
        if (open_real(path, deepbind) == 0) {
            real_ptr = &real;
            return;
        }
        shim_log(SHIM_LOG_INFO, "NCCL shim: %s", real_why);
        if (o < sizeof(tried))
            o += (size_t)snprintf(tried + o, sizeof(tried) - o, "; %s", real_why);
    }
    snprintf(real_why, sizeof(real_why),
             "no real libnccl.so.2 found beside the CUDA toolkit (NCCL_HOME/lib, CUDA_HOME and "
             "CUDA_PATH lib64 and lib, /usr/local/cuda, the system library directories)%s; set "
             "LOOM_NCCL_LIBRARY to its path",
             tried);
}

const shim_real_t *shim_real(void)
{
    pthread_once(&real_once, real_init);
    return real_ptr;
}

const char *shim_real_why(void)
{
    pthread_once(&real_once, real_init);
    return real_ptr ? "" : real_why;
}
