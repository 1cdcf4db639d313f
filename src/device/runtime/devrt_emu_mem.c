/* SPDX-License-Identifier: Apache-2.0
 *
 * devrt_emu_mem.c - the memory of the emulated device: device allocations
 * are shared-memory files (memfd) mapped into the process, so that another
 * process can map the same pages from an IPC handle (devrt_emu_ipc.c);
 * host_alloc is ordinary page-aligned memory and host_map only records a
 * range. Every range lives in one registry, a sorted array under a
 * read-write lock: ptr_device (called on every collective) is a binary
 * search under the read lock. It does not run stream work (devrt_emu_stream.c)
 * or open handles (devrt_emu_ipc.c). Caller: devrt_emu.c's table.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "debug.h"
#include "devrt_emu.h"
#include "devrt_emu_int.h"

static pthread_rwlock_t reg_lock = PTHREAD_RWLOCK_INITIALIZER;
static emu_range_t *reg; /* sorted by base; ranges never overlap */
static size_t reg_n, reg_cap;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

/* fork() while another thread holds the lock would leave it held forever in
 * the child: the forking thread takes it around fork, and the child, whose
 * thread is not the lock's writer to glibc (another tid), makes a new one. */
static void reg_prefork(void)
{
    pthread_rwlock_wrlock(&reg_lock);
}

static void reg_parent(void)
{
    pthread_rwlock_unlock(&reg_lock);
}

static void reg_child(void)
{
    pthread_rwlock_init(&reg_lock, NULL);
}

static void reg_init(void)
{
    pthread_atfork(reg_prefork, reg_parent, reg_child);
}

static void reg_rdlock(void)
{
    pthread_once(&reg_once, reg_init);
    pthread_rwlock_rdlock(&reg_lock);
}

static void reg_wrlock(void)
{
    pthread_once(&reg_once, reg_init);
    pthread_rwlock_wrlock(&reg_lock);
}

static void reg_unlock(void)
{
    pthread_rwlock_unlock(&reg_lock);
}

/* Entries whose base is <= p (the one that may hold p is the last of them). */
static size_t reg_upper(uintptr_t p)
{
    size_t lo = 0, hi = reg_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (reg[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The index of the entry holding p (starting at p if exact), or -1. Lock held. */
static long reg_index(const void *p, int exact)
{
    uintptr_t u = (uintptr_t)p;
    size_t i = reg_upper(u);
    if (p == NULL || i == 0)
        return -1;
    const emu_range_t *r = &reg[i - 1];
    if (exact ? r->base != u : u - r->base >= r->size)
        return -1;
    return (long)(i - 1);
}

static void reg_remove_at(size_t i)
{
    memmove(&reg[i], &reg[i + 1], (reg_n - i - 1) * sizeof(*reg));
    reg_n--;
}

int loom_emu_reg_find(const void *p, int exact, emu_range_t *r)
{
    reg_rdlock();
    long i = reg_index(p, exact);
    if (i >= 0)
        *r = reg[i];
    reg_unlock();
    return i >= 0;
}

loomResult_t loom_emu_reg_add(const emu_range_t *r)
{
    loomResult_t res = loomSuccess;
    reg_wrlock();
    size_t i = reg_upper(r->base);
    if (i > 0 && r->base - reg[i - 1].base < reg[i - 1].size) {
        LOOM_WARN("emulated device: [%p, +%zu bytes) overlaps %s memory at %p (%zu bytes)",
                  (void *)r->base, r->size, loom_emu_mem_kind_name(reg[i - 1].kind),
                  (void *)reg[i - 1].base, reg[i - 1].size);
        res = loomInvalidArgument;
    } else if (i < reg_n && reg[i].base - r->base < r->size) {
        LOOM_WARN("emulated device: [%p, +%zu bytes) overlaps %s memory at %p (%zu bytes)",
                  (void *)r->base, r->size, loom_emu_mem_kind_name(reg[i].kind),
                  (void *)reg[i].base, reg[i].size);
        res = loomInvalidArgument;
    } else if (reg_n == reg_cap) {
        size_t cap = reg_cap ? 2 * reg_cap : 64;
        emu_range_t *grown = realloc(reg, cap * sizeof(*reg));
        if (grown == NULL) {
            LOOM_WARN("emulated device: no memory for %zu registry entries", cap);
            res = loomSystemError;
        } else {
            reg = grown;
            reg_cap = cap;
        }
    }
    if (res == loomSuccess) {
        memmove(&reg[i + 1], &reg[i], (reg_n - i) * sizeof(*reg));
        reg[i] = *r;
        reg_n++;
    }
    reg_unlock();
    return res;
}

int loom_emu_reg_take(const void *p, emu_mem_kind_t kind, emu_range_t *r)
{
    reg_wrlock();
    long i = reg_index(p, 1);
    int found = i >= 0 && reg[i].kind == kind;
    if (found) {
        *r = reg[i];
        reg_remove_at((size_t)i);
    }
    reg_unlock();
    return found;
}

void *loom_emu_reg_ipc_acquire(pid_t pid, uint64_t dev, uint64_t ino)
{
    void *p = NULL;
    reg_wrlock();
    for (size_t i = 0; i < reg_n; i++) {
        emu_range_t *r = &reg[i];
        if (r->kind == EMU_MEM_IPC && r->pid == pid && r->dev == dev && r->ino == ino) {
            r->refs++;
            p = (void *)r->base;
            break;
        }
    }
    reg_unlock();
    return p;
}

int loom_emu_reg_ipc_release(const void *p, int *gone, emu_range_t *r)
{
    int ok = 0;
    reg_wrlock();
    long i = reg_index(p, 1);
    if (i >= 0 && reg[i].kind == EMU_MEM_IPC) {
        ok = 1;
        *gone = --reg[i].refs == 0;
        *r = reg[i];
        if (*gone)
            reg_remove_at((size_t)i);
    }
    reg_unlock();
    return ok ? 0 : -1;
}

emu_mem_kind_t loom_emu_mem_kind(const void *p)
{
    if (p == NULL)
        return EMU_MEM_NONE;
    reg_rdlock();
    long i = reg_index(p, 0);
    emu_mem_kind_t kind = i >= 0 ? reg[i].kind : EMU_MEM_NONE;
    reg_unlock();
    return kind;
}

const char *loom_emu_mem_kind_name(emu_mem_kind_t kind)
{
    switch (kind) {
    case EMU_MEM_DEV:
        return "device";
    case EMU_MEM_IPC:
        return "IPC-mapped device";
    case EMU_MEM_HOST:
        return "host_alloc";
    case EMU_MEM_MAPPED:
        return "host_map'ed";
    default:
        return "ordinary host";
    }
}

void loom_devrt_emu_counts(loom_devrt_emu_counts_t *counts)
{
    memset(counts, 0, sizeof(*counts));
    reg_rdlock();
    for (size_t i = 0; i < reg_n; i++) {
        switch (reg[i].kind) {
        case EMU_MEM_DEV:
            counts->dev++;
            break;
        case EMU_MEM_IPC:
            counts->ipc++;
            break;
        case EMU_MEM_HOST:
            counts->host++;
            break;
        case EMU_MEM_MAPPED:
            counts->mapped++;
            break;
        default:
            break;
        }
    }
    reg_unlock();
}

// ---- the table's pointer and memory calls -----------------------------------

int loom_emu_ptr_device(const void *p)
{
    emu_mem_kind_t kind = loom_emu_mem_kind(p);
    return kind == EMU_MEM_DEV || kind == EMU_MEM_IPC ? 0 : -1;
}

loomResult_t loom_emu_ptr_base(const void *p, void **base, size_t *size)
{
    emu_range_t r;
    if (base == NULL || size == NULL) {
        LOOM_WARN("emulated device: ptr_base given a NULL output");
        return loomInvalidArgument;
    }
    if (!loom_emu_reg_find(p, 0, &r) || (r.kind != EMU_MEM_DEV && r.kind != EMU_MEM_IPC)) {
        LOOM_WARN("emulated device: ptr_base: %p is %s memory, not device memory", p,
                  loom_emu_mem_kind_name(loom_emu_mem_kind(p)));
        return loomInvalidArgument;
    }
    *base = (void *)r.base;
    *size = r.size;
    return loomSuccess;
}

static loomResult_t page_bytes(size_t size, size_t *bytes, const char *what)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size > SIZE_MAX - page) {
        LOOM_WARN("emulated device: %s of %zu bytes: too large", what, size);
        return loomInvalidArgument;
    }
    *bytes = (size + page - 1) / page * page;
    return loomSuccess;
}

loomResult_t loom_emu_mem_alloc(void **p, size_t size)
{
    if (p == NULL) {
        LOOM_WARN("emulated device: mem_alloc given a NULL output");
        return loomInvalidArgument;
    }
    if (size == 0) {
        *p = NULL;
        return loomSuccess;
    }
    emu_range_t r = {.size = size, .kind = EMU_MEM_DEV, .fd = -1};
    LOOM_CHECK(page_bytes(size, &r.map_bytes, "mem_alloc"));
    /* A memfd, not a name in LOOM_SHM_DIR: nothing is left behind by a
     * process that dies, and its size is not bounded by /dev/shm's mount
     * (containers often give that 64 MiB). Other processes reach it through
     * /proc/<pid>/fd (devrt_emu_ipc.c). */
    int fd = memfd_create("loom-emu-device", MFD_CLOEXEC);
    if (fd < 0) {
        LOOM_WARN("emulated device: memfd_create for %zu bytes failed: %s", size, strerror(errno));
        return loomSystemError;
    }
    struct stat st;
    void *base = MAP_FAILED;
    loomResult_t res = loomSystemError;
    if (ftruncate(fd, (off_t)r.map_bytes) != 0) {
        LOOM_WARN("emulated device: sizing %zu bytes of device memory failed: %s", r.map_bytes,
                  strerror(errno));
        goto err_close;
    }
    if (fstat(fd, &st) != 0) {
        LOOM_WARN("emulated device: fstat of device memory failed: %s", strerror(errno));
        goto err_close;
    }
    base = mmap(NULL, r.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        LOOM_WARN("emulated device: mapping %zu bytes of device memory failed: %s", r.map_bytes,
                  strerror(errno));
        goto err_close;
    }
    r.base = (uintptr_t)base;
    r.fd = fd;
    r.dev = (uint64_t)st.st_dev;
    r.ino = (uint64_t)st.st_ino;
    LOOM_CHECK_GOTO(loom_emu_reg_add(&r), res, err_unmap);
    *p = base;
    return loomSuccess;
err_unmap:
    munmap(base, r.map_bytes);
err_close:
    close(fd);
    return res;
}

/* The memory may still be in use by queued work: like cudaFree, wait for
 * every stream first. The entry is out of the registry already, so a second
 * free of the same pointer fails instead of unmapping twice. */
static void unmap_range(const emu_range_t *r)
{
    loom_emu_sync_all();
    if (munmap((void *)r->base, r->map_bytes) != 0)
        LOOM_WARN("emulated device: munmap of %p (%zu bytes) failed: %s", (void *)r->base,
                  r->map_bytes, strerror(errno));
    if (r->fd >= 0)
        close(r->fd);
}

static loomResult_t bad_free(const char *call, void *p, emu_mem_kind_t want)
{
    emu_range_t r;
    if (loom_emu_reg_find(p, 0, &r) && r.base != (uintptr_t)p && r.kind == want)
        LOOM_WARN("emulated device: %s(%p): a pointer inside the allocation at %p (%zu bytes), "
                  "not its start",
                  call, p, (void *)r.base, r.size);
    else
        LOOM_WARN("emulated device: %s(%p): %s memory, not memory of a %s call", call, p,
                  loom_emu_mem_kind_name(loom_emu_mem_kind(p)),
                  want == EMU_MEM_DEV    ? "mem_alloc"
                  : want == EMU_MEM_HOST ? "host_alloc"
                  : want == EMU_MEM_IPC  ? "ipc_open"
                                         : "host_map");
    return loomInvalidArgument;
}

loomResult_t loom_emu_mem_free(void *p)
{
    emu_range_t r;
    if (p == NULL)
        return loomSuccess;
    if (!loom_emu_reg_take(p, EMU_MEM_DEV, &r))
        return bad_free("mem_free", p, EMU_MEM_DEV);
    unmap_range(&r);
    return loomSuccess;
}

loomResult_t loom_emu_host_alloc(void **p, size_t size)
{
    if (p == NULL) {
        LOOM_WARN("emulated device: host_alloc given a NULL output");
        return loomInvalidArgument;
    }
    if (size == 0) {
        *p = NULL;
        return loomSuccess;
    }
    emu_range_t r = {.size = size, .kind = EMU_MEM_HOST, .fd = -1};
    LOOM_CHECK(page_bytes(size, &r.map_bytes, "host_alloc"));
    void *base =
        mmap(NULL, r.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        LOOM_WARN("emulated device: host_alloc of %zu bytes failed: %s", size, strerror(errno));
        return loomSystemError;
    }
    r.base = (uintptr_t)base;
    loomResult_t res = loom_emu_reg_add(&r);
    if (res != loomSuccess) {
        munmap(base, r.map_bytes);
        return res;
    }
    *p = base;
    return loomSuccess;
}

loomResult_t loom_emu_host_free(void *p)
{
    emu_range_t r;
    if (p == NULL)
        return loomSuccess;
    if (!loom_emu_reg_take(p, EMU_MEM_HOST, &r))
        return bad_free("host_free", p, EMU_MEM_HOST);
    unmap_range(&r);
    return loomSuccess;
}

loomResult_t loom_emu_host_map(void *p, size_t size, void **dev_p)
{
    if (p == NULL || size == 0 || dev_p == NULL) {
        LOOM_WARN("emulated device: host_map(%p, %zu bytes): %s", p, size,
                  dev_p == NULL ? "NULL output" : "no memory given");
        return loomInvalidArgument;
    }
    if ((uintptr_t)p > UINTPTR_MAX - size) {
        LOOM_WARN("emulated device: host_map(%p, %zu bytes): the range wraps around", p, size);
        return loomInvalidArgument;
    }
    emu_range_t r = {.base = (uintptr_t)p, .size = size, .kind = EMU_MEM_MAPPED, .fd = -1};
    LOOM_CHECK(loom_emu_reg_add(&r));
    *dev_p = p; /* one address space: the device sees host memory where it is */
    return loomSuccess;
}

loomResult_t loom_emu_host_unmap(void *p)
{
    emu_range_t r;
    if (!loom_emu_reg_take(p, EMU_MEM_MAPPED, &r))
        return bad_free("host_unmap", p, EMU_MEM_MAPPED);
    return loomSuccess;
}
