/* SPDX-License-Identifier: Apache-2.0
 *
 * fake_nvml.c - a stand-in for libnvidia-ml.so.1 with fixed answers, so that the unit tests can
 * load NVML through LOOM_NVML_LIB and check loom's dlopen path on machines without a GPU: two
 * GPUs (compute capability 9.0), each with NVLinks 0-3 active and ending at NVSwitches, links 4
 * and 5 present but down, and none beyond. Every device call fails unless nvmlInit_v2 came
 * first, as the real library's do; fake_nvml_inits() tells the test whether each init was
 * matched by a shutdown. Only the functions topo_nvml.c uses exist.
 */
#include <stdio.h>
#include <string.h>

#define SUCCESS           0
#define ERR_UNINITIALIZED 1
#define ERR_INVALID_ARG   2

typedef struct fake_device {
    const char *name, *bus_id;
} fake_device_t;

typedef struct {
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
} fake_pci_info_t;

static fake_device_t devices[2] = {
    {"NVIDIA H100 80GB HBM3", "00000000:18:00.0"},
    {"NVIDIA H100 80GB HBM3", "00000000:3B:00.0"}, /* upper case, as NVML writes it */
};
static int inits;

/* The number of nvmlInit_v2 calls not yet matched by nvmlShutdown. */
int fake_nvml_inits(void)
{
    return inits;
}

int nvmlInit_v2(void)
{
    inits++;
    return SUCCESS;
}

int nvmlShutdown(void)
{
    if (!inits)
        return ERR_UNINITIALIZED;
    inits--;
    return SUCCESS;
}

int nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!inits)
        return ERR_UNINITIALIZED;
    *count = 2;
    return SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, fake_device_t **dev)
{
    if (!inits)
        return ERR_UNINITIALIZED;
    if (index >= 2)
        return ERR_INVALID_ARG;
    *dev = &devices[index];
    return SUCCESS;
}

int nvmlDeviceGetName(fake_device_t *dev, char *name, unsigned int len)
{
    if (!inits)
        return ERR_UNINITIALIZED;
    snprintf(name, len, "%s", dev->name);
    return SUCCESS;
}

int nvmlDeviceGetPciInfo_v3(fake_device_t *dev, fake_pci_info_t *pci)
{
    if (!inits)
        return ERR_UNINITIALIZED;
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->bus_id, sizeof(pci->bus_id), "%s", dev->bus_id);
    snprintf(pci->bus_id_legacy, sizeof(pci->bus_id_legacy), "%s", dev->bus_id + 4);
    pci->bus = dev == &devices[0] ? 0x18 : 0x3b;
    return SUCCESS;
}

int nvmlDeviceGetNvLinkState(fake_device_t *dev, unsigned int link, int *active)
{
    (void)dev;
    if (!inits)
        return ERR_UNINITIALIZED;
    if (link >= 6)
        return ERR_INVALID_ARG;
    *active = link < 4;
    return SUCCESS;
}

int nvmlDeviceGetNvLinkRemoteDeviceType(fake_device_t *dev, unsigned int link, int *type)
{
    (void)dev;
    if (!inits)
        return ERR_UNINITIALIZED;
    if (link >= 6)
        return ERR_INVALID_ARG;
    *type = 2; /* NVML_NVLINK_DEVICE_TYPE_SWITCH */
    return SUCCESS;
}

int nvmlDeviceGetCudaComputeCapability(fake_device_t *dev, int *major, int *minor)
{
    (void)dev;
    if (!inits)
        return ERR_UNINITIALIZED;
    *major = 9;
    *minor = 0;
    return SUCCESS;
}
