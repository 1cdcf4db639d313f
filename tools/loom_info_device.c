/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_info_device.c - loom_info's device section: the device runtime loom
 * picks for this process (LOOM_DEVICE), the CUDA runtime and each GPU it sees,
 * the host emulation, and the device transports (devtp.h) with what each needs
 * and, where this machine lacks it, why it cannot run here. The answers are
 * what a communicator of an application using CUDA would find here (loom_info
 * starts CUDA for that, as such an application does); placement (ranks on one
 * host, one GPU per rank) is only known to a communicator, so it is named as a
 * condition. Reads the runtime table; changes nothing.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devrt.h"
#include "devtp.h"
#include "loom_info.h"

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* One GPU's line: name, PCI bus id, compute capability, memory, SMs. */
static void print_gpu(const loom_devrt_t *rt, int dev)
{
    loom_dev_props_t p;
    if (rt->device_props(dev, &p) != loomSuccess) {
        printf("#   GPU %d: properties unavailable (%s)\n", dev, loomGetLastError(NULL));
        return;
    }
    printf("#   GPU %d: %s, PCI %s, compute capability %d.%d, %.1f GiB, %d SMs\n", dev, p.name,
           p.pci_bus_id[0] ? p.pci_bus_id : "none", p.cc_major, p.cc_minor,
           (double)p.mem_bytes / (1024.0 * 1024.0 * 1024.0), p.sm_count);
}

/* Whether libnccl.so.2 (LOOM_NCCL_LIBRARY when set, else from the loader's search path) can be
 * loaded: 1 and its version in what, or 0 and why not. The transport also looks beside the CUDA
 * toolkit (devtp_nccl.c), so a library found only there is missed here. */
static int nccl_loadable(char *what, size_t len)
{
    const char *path = getenv("LOOM_NCCL_LIBRARY");
    const char *from = " (LOOM_NCCL_LIBRARY)";
    if (path == NULL || *path == '\0') {
        path = "libnccl.so.2";
        from = " (the loader's search path)";
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *err = dlerror();
        snprintf(what, len, "%s%s not loadable (%s)", path, from, err ? err : "unknown reason");
        return 0;
    }
    int (*get_version)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
    int v = 0;
    if (get_version == NULL || get_version(&v) != 0 || v <= 0) {
        snprintf(what, len, "%s%s loads but has no working ncclGetVersion", path, from);
        dlclose(h);
        return 0;
    }
    /* NCCL codes its version as major * 10000 + minor * 100 + patch from 2.9, * 1000 before */
    const int big = v >= 10000;
    snprintf(what, len, "%s%s loads (NCCL %d.%d.%d)", path, from, big ? v / 10000 : v / 1000,
             big ? v / 100 % 100 : v / 100 % 10, v % 100);
    dlclose(h);
    return 1;
}

/* One transport's line: its name, whether it can run here and why not, what it needs. */
static void print_transport(const char *name, const char *state, const char *needs)
{
    printf("#   %-7s %s; needs %s\n", name, state, needs);
}

/* loom takes CUDA only in a process that already uses it (devrt.h); loom_info answers for such
 * an application, so it starts the CUDA runtime first. why: "", or why CUDA did not start. */
static void start_cuda(char *why, size_t len)
{
    why[0] = '\0';
#ifdef LOOM_HAVE_CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, len, "cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        (void)cudaGetLastError();
    }
#else
    (void)len;
#endif
}

void loom_info_print_device(void)
{
    char cuda_why[256], why[256] = "";
    start_cuda(cuda_why, sizeof(cuda_why));
    const loom_devrt_t *rt = loom_devrt();
    const char *why_none = rt == NULL ? loom_devrt_why_none() : "";
    const loom_devrt_t *cuda = loom_devrt_cuda(why, sizeof(why));
    if (cuda == NULL && cuda_why[0] != '\0') /* CUDA's own reason, not "the driver is not loaded" */
        snprintf(why, sizeof(why), "%s", cuda_why);
    const int ngpu = cuda != NULL ? cuda->device_count() : 0;
    const char *env = getenv("LOOM_DEVICE");
    const int auto_mode = env == NULL || (strcmp(env, "emulated") != 0 && strcmp(env, "none") != 0);
    if (rt == NULL && auto_mode && cuda_why[0] != '\0') /* loom_info tried: CUDA's reason */
        why_none = cuda_why;

    if (rt != NULL)
        printf("# device runtime: %s (LOOM_DEVICE=%s)\n", rt->name, env && *env ? env : "auto");
    else if (strstr(why_none, "LOOM_DEVICE=") != NULL) /* the reason names the setting */
        printf("# device runtime: none: %s\n", why_none);
    else
        printf("# device runtime: none (LOOM_DEVICE=%s): %s\n", env && *env ? env : "auto",
               why_none);
    if (cuda == NULL)
        printf("# CUDA runtime: not available: %s\n", why[0] ? why : "no reason given");
    else
        printf("# CUDA runtime: available, %d GPU%s\n", ngpu, ngpu == 1 ? "" : "s");
    for (int d = 0; d < ngpu; d++)
        print_gpu(cuda, d);

    const loom_devrt_t *emu = loom_devrt_emulated();
    printf("# emulation: %s\n",
           emu == NULL ? "not available"
                       : "available: device memory in host shared memory, streams as threads "
                         "(LOOM_DEVICE=emulated selects it)");

    char no_rt[320];
    snprintf(no_rt, sizeof(no_rt), "not available here: no device runtime (%s)", why_none);
    const int is_cuda = rt != NULL && strcmp(rt->name, "cuda") == 0;
    /* ipc and staged order their work with flag words (stream memory operations). */
    char avail[320], memops[256] = "";
    if (rt == NULL)
        snprintf(avail, sizeof(avail), "%s", no_rt);
    else if (!rt->memops_ok(memops, sizeof(memops)))
        snprintf(avail, sizeof(avail),
                 "not available here: the %s runtime lacks stream memory operations (%s)", rt->name,
                 memops);
    else
        snprintf(avail, sizeof(avail), "available on the %s runtime", rt->name);

    printf("# device transports (tried in this order for each call):\n");
    print_transport(loom_devtp_ipc.name, avail,
                    "a device runtime and every rank on one host (CUDA IPC between processes, "
                    "the same pointers between threads; the emulation's shared memory)");
    char nccl[640], lib[256];
    const int loadable = nccl_loadable(lib, sizeof(lib));
    const char *no_cuda = rt != NULL ? "the emulation has no NCCL" : why[0] ? why : why_none;
    if (!is_cuda)
        snprintf(nccl, sizeof(nccl), "not available here: no CUDA runtime (%s); %s", no_cuda, lib);
    else if (!loadable)
        snprintf(nccl, sizeof(nccl), "not available here: %s", lib);
    else
        snprintf(nccl, sizeof(nccl), "available: %s", lib);
    print_transport(loom_devtp_nccl.name, nccl,
                    "the CUDA runtime, libnccl.so.2 loadable (LOOM_NCCL_LIBRARY names another) "
                    "and one GPU per rank");
    print_transport(loom_devtp_staged.name, avail,
                    "a device runtime only, any placement (device buffers copied through pinned "
                    "host memory, loom's host collectives between)");
}
