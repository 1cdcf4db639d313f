/* SPDX-License-Identifier: Apache-2.0
 *
 * topo_nvml.c - NVIDIA GPUs through NVML, loaded at run time with dlopen so that loom neither
 * builds nor runs against the driver: names, PCI addresses, active NVLinks with their rate, and
 * whether the links end at NVSwitches. Where the library is absent or NVML cannot start (no
 * driver), it reports that and changes nothing, and topo_detect.c keeps the GPUs it found on the
 * PCI bus. NUMA placement is left to topo_detect.c (sysfs). The few NVML types used are declared
 * here from NVML's documented API; the library is opened and closed on each call.
 */
#include "topo_sources.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "debug.h"

// ---- NVML's API, as documented (nvml.h of the CUDA toolkit) ----

typedef int nvml_return_t; /* nvmlReturn_t; NVML_SUCCESS is 0 */
#define NVML_OK               0
#define NVML_FEATURE_ENABLED  1  /* nvmlEnableState_t */
#define NVML_LINK_TO_NVSWITCH 2  /* nvmlIntNvLinkDeviceType_t: NVML_NVLINK_DEVICE_TYPE_SWITCH */
#define NVML_NAME_BYTES       96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define NVML_LINKS_MAX        32 /* above NVML_NVLINK_MAX_LINKS (18) of every release so far */
typedef struct nvml_device *nvml_device_t; /* nvmlDevice_t, an opaque handle */

/* nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it. Only busId is read; the spare tail means a
 * library whose struct grew would still write inside this buffer. */
typedef struct {
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32]; /* "00000000:18:00.0" */
    char spare[224];
} nvml_pci_info_t;

typedef nvml_return_t (*nvml_init_fn_t)(void);
typedef nvml_return_t (*nvml_shutdown_fn_t)(void);
typedef nvml_return_t (*nvml_count_fn_t)(unsigned int *count);
typedef nvml_return_t (*nvml_handle_fn_t)(unsigned int index, nvml_device_t *dev);
typedef nvml_return_t (*nvml_name_fn_t)(nvml_device_t dev, char *name, unsigned int len);
typedef nvml_return_t (*nvml_pci_fn_t)(nvml_device_t dev, nvml_pci_info_t *pci);
typedef nvml_return_t (*nvml_link_state_fn_t)(nvml_device_t dev, unsigned int link, int *state);
typedef nvml_return_t (*nvml_link_remote_fn_t)(nvml_device_t dev, unsigned int link, int *type);
typedef nvml_return_t (*nvml_cc_fn_t)(nvml_device_t dev, int *major, int *minor);

typedef struct {
    nvml_init_fn_t init;               /* nvmlInit_v2 */
    nvml_shutdown_fn_t shutdown;       /* nvmlShutdown */
    nvml_count_fn_t count;             /* nvmlDeviceGetCount_v2 */
    nvml_handle_fn_t handle;           /* nvmlDeviceGetHandleByIndex_v2 */
    nvml_name_fn_t name;               /* nvmlDeviceGetName */
    nvml_pci_fn_t pci;                 /* nvmlDeviceGetPciInfo_v3 */
    nvml_link_state_fn_t link_state;   /* nvmlDeviceGetNvLinkState */
    nvml_link_remote_fn_t link_remote; /* nvmlDeviceGetNvLinkRemoteDeviceType; may be NULL */
    nvml_cc_fn_t compute_capability;   /* nvmlDeviceGetCudaComputeCapability; may be NULL */
} nvml_api_t;

// ---- Loading ----

/* Casting dlsym's object pointer to a function pointer is what POSIX requires to work. */
#define NVML_SYM(_lib, _field, _name) ((_field) = (__typeof__(_field))dlsym((_lib), (_name)))

static int api_load(void *lib, nvml_api_t *api, const char **missing_p)
{
    struct {
        const char *name;
        int found;
    } req[] = {
        {"nvmlInit_v2", NVML_SYM(lib, api->init, "nvmlInit_v2") != NULL},
        {"nvmlShutdown", NVML_SYM(lib, api->shutdown, "nvmlShutdown") != NULL},
        {"nvmlDeviceGetCount_v2", NVML_SYM(lib, api->count, "nvmlDeviceGetCount_v2") != NULL},
        {"nvmlDeviceGetHandleByIndex_v2",
         NVML_SYM(lib, api->handle, "nvmlDeviceGetHandleByIndex_v2") != NULL},
        {"nvmlDeviceGetName", NVML_SYM(lib, api->name, "nvmlDeviceGetName") != NULL},
        {"nvmlDeviceGetPciInfo_v3", NVML_SYM(lib, api->pci, "nvmlDeviceGetPciInfo_v3") != NULL},
        {"nvmlDeviceGetNvLinkState",
         NVML_SYM(lib, api->link_state, "nvmlDeviceGetNvLinkState") != NULL},
    };
    /* optional: older drivers lack the first, and the second only refines the rate */
    NVML_SYM(lib, api->link_remote, "nvmlDeviceGetNvLinkRemoteDeviceType");
    NVML_SYM(lib, api->compute_capability, "nvmlDeviceGetCudaComputeCapability");
    for (size_t i = 0; i < sizeof(req) / sizeof(*req); i++)
        if (!req[i].found) {
            *missing_p = req[i].name;
            return -1;
        }
    return 0;
}

// ---- One GPU ----

/* Copies a string, cut to fit: NVML's names may be longer than a record's. */
static void copy_cut(char *out, size_t len, const char *in)
{
    size_t n = strnlen(in, len - 1);
    memcpy(out, in, n);
    out[n] = '\0';
}

/* Gbit/s per NVLink and direction by GPU generation (compute capability), from NVIDIA's
 * datasheets: P100 20 GB/s, V100, A100 and H100 25 GB/s, GA10x bridges 14.0625 GB/s, B200
 * 50 GB/s per link and direction. NVML has no direct query on every driver; NCCL
 * (src/graph/topo.h, ncclTopoNVLinkBw) keys its NVLink bandwidth on the same thing. */
static double nvlink_gbps_of(int major, int minor)
{
    switch (major) {
    case 6:
        return 160;
    case 7:
        return 200;
    case 8:
        return minor == 0 ? 200 : 112.5;
    case 9:
        return 200;
    case 10:
        return 400;
    default:
        return 0; /* unknown generation: rate unknown */
    }
}

/* "00000000:3B:00.0" -> "0000:3b:00.0", the form of /sys/bus/pci/devices and of the sysfs
 * reader; anything else is kept as NVML wrote it, cut to fit. */
static void pci_normalize(const char *in, char *out, size_t len)
{
    unsigned dom, bus, dev, fn;
    char tail;
    if (sscanf(in, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) == 4 && dom <= 0xffff &&
        bus <= 0xff && dev <= 0x1f && fn <= 7)
        snprintf(out, len, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
    else
        copy_cut(out, len, in);
}

/* Fills g from dev; returns 1 if some active link ends at an NVSwitch. */
static int gpu_fill(const nvml_api_t *api, nvml_device_t dev, unsigned idx, loom_topo_gpu_t *g)
{
    char name[NVML_NAME_BYTES];
    memset(g, 0, sizeof(*g));
    g->numa = -1;
    if (api->name(dev, name, sizeof(name)) == NVML_OK) {
        name[sizeof(name) - 1] = '\0';
        copy_cut(g->name, sizeof(g->name), name);
    } else {
        snprintf(g->name, sizeof(g->name), "NVIDIA GPU %u", idx);
    }
    nvml_pci_info_t pci;
    memset(&pci, 0, sizeof(pci));
    if (api->pci(dev, &pci) == NVML_OK) {
        pci.bus_id[sizeof(pci.bus_id) - 1] = '\0';
        pci_normalize(pci.bus_id, g->pci, sizeof(g->pci));
    }
    int to_switch = 0;
    for (unsigned link = 0; link < NVML_LINKS_MAX; link++) {
        /* links the GPU lacks answer with an error; they are skipped, not counted */
        int state = 0, type = -1;
        if (api->link_state(dev, link, &state) != NVML_OK || state != NVML_FEATURE_ENABLED)
            continue;
        g->nvlinks++;
        if (api->link_remote && api->link_remote(dev, link, &type) == NVML_OK &&
            type == NVML_LINK_TO_NVSWITCH)
            to_switch = 1;
    }
    int major = 0, minor = 0;
    if (g->nvlinks && api->compute_capability &&
        api->compute_capability(dev, &major, &minor) == NVML_OK)
        g->nvlink_gbps = nvlink_gbps_of(major, minor);
    return to_switch;
}

// ---- Entry point ----

int loom_topo_nvml_detect(loom_topo_host_t *h, const char *lib)
{
    if (!lib || !*lib)
        return -1;
    void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        LOOM_INFO(LOOM_LOG_TOPO, "NVML not loaded (%s); GPUs from the PCI bus", why ? why : lib);
        return -1;
    }
    nvml_api_t api;
    const char *missing = NULL;
    unsigned count = 0;
    int rc = -1, n = 0, switched = 0;
    /* GPUs go to a copy first, so that h stays untouched unless NVML answered */
    loom_topo_gpu_t gpus[LOOM_TOPO_MAX_GPUS];
    memset(&api, 0, sizeof(api));
    if (api_load(dl, &api, &missing)) {
        LOOM_INFO(LOOM_LOG_TOPO, "NVML: %s lacks %s; GPUs from the PCI bus", lib, missing);
        goto err_close;
    }
    nvml_return_t st = api.init();
    if (st != NVML_OK) {
        LOOM_INFO(LOOM_LOG_TOPO, "NVML: nvmlInit_v2 failed with %d; GPUs from the PCI bus", st);
        goto err_close;
    }
    st = api.count(&count);
    if (st != NVML_OK) {
        LOOM_INFO(LOOM_LOG_TOPO,
                  "NVML: nvmlDeviceGetCount_v2 failed with %d; GPUs from the PCI bus", st);
        goto err_shutdown;
    }
    for (unsigned i = 0; i < count && n < LOOM_TOPO_MAX_GPUS; i++) {
        nvml_device_t dev = NULL;
        st = api.handle(i, &dev);
        if (st != NVML_OK) {
            /* e.g. a GPU the process may not access; the others are still described */
            LOOM_INFO(LOOM_LOG_TOPO, "NVML: no handle for GPU %u (error %d)", i, st);
            continue;
        }
        switched += gpu_fill(&api, dev, i, &gpus[n]);
        n++;
    }
    memcpy(h->gpus, gpus, (size_t)n * sizeof(gpus[0]));
    h->ngpus = n;
    h->nvswitch = n > 0 && switched == n;
    rc = 0;
err_shutdown:
    st = api.shutdown();
    if (st != NVML_OK)
        LOOM_INFO(LOOM_LOG_TOPO, "NVML: nvmlShutdown failed with %d", st);
err_close:
    dlclose(dl);
    return rc;
}
