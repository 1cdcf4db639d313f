/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_probe.c - a program written against nccl.h and linked against
 * libloom-nccl.so (its NEEDED libnccl.so.2 is the shim, found by the link
 * beside it). test_nccl_shim.cc runs it once per scenario, since the shim
 * reads its mode and opens the real library once per process, and reads its
 * "key=value" lines on stdout; the shim's log goes to stderr.
 *   basics          version, unique id, a one-rank init, the last error
 *   bcast           ncclBcast on a NULL communicator (the real ncclBcast calls
 *                   ncclBroadcast inside the real library)
 *   premapped PATH  the same after loading PATH RTLD_GLOBAL first, as a
 *                   program that had linked the real library would have
 *   allreduce       ncclAllReduce on a NULL communicator
 *   newer           ncclCommGrow, an NCCL 2.29 function
 *   errors          ncclGetErrorString of every result code
 *   threads         ncclGetVersion from 8 threads at once, as the first calls
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <nccl.h>

static void print_last(void)
{
    const char *text = ncclGetLastError(NULL);
    printf("last=%s\n", text ? text : "(null)");
}

static void *version_thread(void *arg)
{
    int *version = arg;
    if (ncclGetVersion(version) != ncclSuccess)
        *version = -1;
    return NULL;
}

static int basics(void)
{
    int version = 0;
    ncclResult_t r = ncclGetVersion(&version);
    printf("version_result=%d\nversion=%d\n", (int)r, version);
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    r = ncclGetUniqueId(&id);
    int nonzero = 0;
    for (size_t i = 0; i < sizeof(id.internal); i++)
        nonzero |= id.internal[i] != 0;
    printf("uniqueid_result=%d\nuniqueid_nonzero=%d\n", (int)r, nonzero);
    ncclComm_t comm = NULL;
    r = ncclCommInitRank(&comm, 1, id, 0);
    printf("init_result=%d\n", (int)r);
    print_last();
    if (r == ncclSuccess) { /* a machine with a GPU: the communicator must work */
        int count = 0;
        printf("count_result=%d\ncount=%d\n", (int)ncclCommCount(comm, &count), count);
        printf("destroy_result=%d\n", (int)ncclCommDestroy(comm));
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: shim_probe SCENARIO [PATH]\n");
        return 2;
    }
    const char *what = argv[1];
    float value = 1.0f;
    if (strcmp(what, "basics") == 0)
        return basics();
    if (strcmp(what, "premapped") == 0) {
        if (argc < 3 || dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL) == NULL) {
            fprintf(stderr, "shim_probe: cannot load %s: %s\n", argc < 3 ? "(none)" : argv[2],
                    dlerror());
            return 2;
        }
        what = "bcast";
    }
    if (strcmp(what, "bcast") == 0) {
        printf("bcast_result=%d\n", (int)ncclBcast(&value, 1, ncclFloat, 0, NULL, NULL));
        print_last();
        return 0;
    }
    if (strcmp(what, "allreduce") == 0) {
        printf("allreduce_result=%d\n",
               (int)ncclAllReduce(&value, &value, 1, ncclFloat, ncclSum, NULL, NULL));
        print_last();
        return 0;
    }
    if (strcmp(what, "newer") == 0) {
        /* Declared here: the 2.28 header this program is built with lacks it. */
        extern ncclResult_t ncclCommGrow(ncclComm_t, int, const ncclUniqueId *, int, ncclComm_t *,
                                         ncclConfig_t *);
        ncclComm_t child = NULL;
        printf("grow_result=%d\n", (int)ncclCommGrow(NULL, 2, NULL, -1, &child, NULL));
        print_last();
        return 0;
    }
    if (strcmp(what, "errors") == 0) {
        for (int r = 0; r <= (int)ncclNumResults; r++)
            printf("error%d=%s\n", r, ncclGetErrorString((ncclResult_t)r));
        return 0;
    }
    if (strcmp(what, "threads") == 0) {
        pthread_t t[8];
        int versions[8] = {0};
        for (int i = 0; i < 8; i++)
            pthread_create(&t[i], NULL, version_thread, &versions[i]);
        for (int i = 0; i < 8; i++) {
            pthread_join(t[i], NULL);
            printf("version%d=%d\n", i, versions[i]);
        }
        return 0;
    }
    fprintf(stderr, "shim_probe: unknown scenario %s\n", what);
    return 2;
}
