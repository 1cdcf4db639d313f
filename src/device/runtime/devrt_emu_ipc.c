/* SPDX-License-Identifier: Apache-2.0
 *
 * devrt_emu_ipc.c - IPC handles of the emulated device. A handle names the
 * exporter's memory file by process and descriptor (and the file's identity,
 * so a reused descriptor is never mistaken for it); another process maps the
 * same file through /proc/<pid>/fd/<fd> (the access the shm collectives'
 * process_vm_readv already needs: same user, ptrace-readable). As with CUDA,
 * a process opens each allocation once however often ipc_open is called
 * (ipc_close drops one reference), and a handle this process exported is
 * refused: its threads share the pointer itself. Caller: devrt_emu.c's table.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "debug.h"
#include "devrt_emu_int.h"

#define EMU_IPC_MAGIC "LOOMEMU1"

/* The handle's bytes (LOOM_DEV_IPC_BYTES): no pointers, fixed widths. */
typedef struct {
    char magic[8];
    int32_t pid;
    int32_t fd;
    uint64_t dev, ino;
    uint64_t size, map_bytes;
    uint8_t pad[LOOM_DEV_IPC_BYTES - 48];
} emu_ipc_wire_t;

_Static_assert(sizeof(emu_ipc_wire_t) == LOOM_DEV_IPC_BYTES, "IPC handle is 64 bytes");

loomResult_t loom_emu_ipc_export(void *base, loom_dev_ipc_t *handle)
{
    emu_range_t r;
    if (handle == NULL) {
        LOOM_WARN("emulated device: ipc_export given a NULL handle");
        return loomInvalidArgument;
    }
    if (!loom_emu_reg_find(base, 0, &r) || r.kind != EMU_MEM_DEV) {
        emu_mem_kind_t kind = loom_emu_mem_kind(base);
        LOOM_WARN("emulated device: ipc_export(%p): %s memory, not an allocation of mem_alloc%s",
                  base, loom_emu_mem_kind_name(kind),
                  kind == EMU_MEM_IPC ? " (memory opened from another process cannot be exported "
                                        "again)"
                                      : "");
        return loomInvalidArgument;
    }
    if (r.base != (uintptr_t)base) {
        LOOM_WARN("emulated device: ipc_export(%p): a pointer inside the allocation at %p "
                  "(%zu bytes); export its base (ptr_base)",
                  base, (void *)r.base, r.size);
        return loomInvalidArgument;
    }
    emu_ipc_wire_t w;
    memset(&w, 0, sizeof(w));
    memcpy(w.magic, EMU_IPC_MAGIC, sizeof(w.magic));
    w.pid = (int32_t)getpid();
    w.fd = r.fd;
    w.dev = r.dev;
    w.ino = r.ino;
    w.size = r.size;
    w.map_bytes = r.map_bytes;
    memcpy(handle->bytes, &w, sizeof(w));
    return loomSuccess;
}

/* Opens the exporter's file and checks it is the one the handle names. */
static loomResult_t open_exported(const emu_ipc_wire_t *w, int *fd_p)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)w->pid, (int)w->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            LOOM_WARN("emulated device: ipc_open: %s does not exist: process %d has exited or "
                      "freed the allocation",
                      path, (int)w->pid);
            return loomInvalidArgument;
        }
        LOOM_WARN("emulated device: ipc_open: cannot open %s (process %d's device memory): %s",
                  path, (int)w->pid, strerror(errno));
        return loomSystemError;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        LOOM_WARN("emulated device: ipc_open: fstat of %s failed: %s", path, strerror(errno));
        close(fd);
        return loomSystemError;
    }
    if ((uint64_t)st.st_dev != w->dev || (uint64_t)st.st_ino != w->ino ||
        (uint64_t)st.st_size < w->map_bytes) {
        LOOM_WARN("emulated device: ipc_open: process %d no longer holds the allocation of %llu "
                  "bytes the handle names (it was freed)",
                  (int)w->pid, (unsigned long long)w->size);
        close(fd);
        return loomInvalidArgument;
    }
    *fd_p = fd;
    return loomSuccess;
}

loomResult_t loom_emu_ipc_open(const loom_dev_ipc_t *handle, void **p)
{
    emu_ipc_wire_t w;
    if (handle == NULL || p == NULL) {
        LOOM_WARN("emulated device: ipc_open given a NULL %s",
                  handle == NULL ? "handle" : "output");
        return loomInvalidArgument;
    }
    memcpy(&w, handle->bytes, sizeof(w));
    if (memcmp(w.magic, EMU_IPC_MAGIC, sizeof(w.magic)) != 0 || w.pid <= 0 || w.fd < 0 ||
        w.size == 0 || w.map_bytes < w.size || w.map_bytes > (uint64_t)SIZE_MAX) {
        LOOM_WARN("emulated device: ipc_open: not an IPC handle of the emulated device runtime");
        return loomInvalidArgument;
    }
    if (w.pid == (int32_t)getpid()) {
        LOOM_WARN("emulated device: ipc_open: the handle was exported by this process (pid %d); "
                  "its threads use the device pointer itself",
                  (int)w.pid);
        return loomInvalidUsage;
    }
    void *base = loom_emu_reg_ipc_acquire(w.pid, w.dev, w.ino);
    if (base != NULL) {
        *p = base;
        return loomSuccess;
    }
    int fd = -1;
    LOOM_CHECK(open_exported(&w, &fd));
    base = mmap(NULL, (size_t)w.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd); /* the mapping keeps the file */
    if (base == MAP_FAILED) {
        LOOM_WARN("emulated device: ipc_open: mapping %llu bytes of process %d's device memory "
                  "failed: %s",
                  (unsigned long long)w.map_bytes, (int)w.pid, strerror(errno));
        return loomSystemError;
    }
    /* Another thread may have opened the same allocation meanwhile: keep one mapping. */
    void *other = loom_emu_reg_ipc_acquire(w.pid, w.dev, w.ino);
    if (other != NULL) {
        munmap(base, (size_t)w.map_bytes);
        *p = other;
        return loomSuccess;
    }
    emu_range_t r = {.base = (uintptr_t)base,
                     .size = (size_t)w.size,
                     .map_bytes = (size_t)w.map_bytes,
                     .kind = EMU_MEM_IPC,
                     .fd = -1,
                     .pid = w.pid,
                     .dev = w.dev,
                     .ino = w.ino,
                     .refs = 1};
    loomResult_t res = loom_emu_reg_add(&r);
    if (res != loomSuccess) {
        munmap(base, (size_t)w.map_bytes);
        return res;
    }
    *p = base;
    return loomSuccess;
}

loomResult_t loom_emu_ipc_close(void *p)
{
    emu_range_t r;
    int gone = 0;
    if (loom_emu_reg_ipc_release(p, &gone, &r) != 0) {
        emu_range_t in;
        if (loom_emu_reg_find(p, 0, &in) && in.kind == EMU_MEM_IPC)
            LOOM_WARN("emulated device: ipc_close(%p): a pointer inside the mapping at %p, not "
                      "what ipc_open gave",
                      p, (void *)in.base);
        else
            LOOM_WARN("emulated device: ipc_close(%p): %s memory, not a mapping of ipc_open", p,
                      loom_emu_mem_kind_name(loom_emu_mem_kind(p)));
        return loomInvalidArgument;
    }
    if (!gone)
        return loomSuccess;
    loom_emu_sync_all(); /* queued copies may still read or write the mapping */
    if (munmap((void *)r.base, r.map_bytes) != 0) {
        LOOM_WARN("emulated device: munmap of the IPC mapping at %p failed: %s", p,
                  strerror(errno));
        return loomSystemError;
    }
    return loomSuccess;
}
