/* SPDX-License-Identifier: Apache-2.0
 *
 * devrt_emu_int.h - the parts of the host emulation of the device runtime
 * (devrt_emu*.c) and what they call in one another: the memory registry and
 * its calls (devrt_emu_mem.c, devrt_emu_ipc.c), the streams, their queued
 * operations and events (devrt_emu_stream.c, devrt_emu_event.c), and the
 * table that puts them together (devrt_emu.c). Nothing outside
 * src/device/runtime/ includes it.
 */
#ifndef LOOM_DEVRT_EMU_INT_H
#define LOOM_DEVRT_EMU_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dev_kernels.h"
#include "devrt.h"

/* ---- memory (devrt_emu_mem.c, devrt_emu_ipc.c) --------------------------- */

typedef enum {
    EMU_MEM_NONE = 0, /* memory the emulation does not know: ordinary host memory */
    EMU_MEM_DEV,      /* mem_alloc: a shared-memory file mapped here */
    EMU_MEM_IPC,      /* ipc_open: another process's allocation mapped here */
    EMU_MEM_HOST,     /* host_alloc */
    EMU_MEM_MAPPED    /* host_map */
} emu_mem_kind_t;

/* One entry of the registry: a range the emulation handed out or took in. */
typedef struct {
    uintptr_t base;
    size_t size;      /* bytes asked for: [base, base + size) is the range */
    size_t map_bytes; /* bytes mapped (DEV, IPC, HOST: whole pages) */
    emu_mem_kind_t kind;
    int fd;            /* DEV: the memory's file, kept open for ipc_export; else -1 */
    pid_t pid;         /* IPC: the exporting process */
    uint64_t dev, ino; /* DEV, IPC: the file's identity */
    int refs;          /* IPC: ipc_open calls not closed yet */
} emu_range_t;

/* The kind of memory p lies in; EMU_MEM_NONE for NULL and unknown memory. */
emu_mem_kind_t loom_emu_mem_kind(const void *p);
const char *loom_emu_mem_kind_name(emu_mem_kind_t kind);

/* The registry, for devrt_emu_ipc.c: find gives a copy of the entry holding
 * p (exact: only one starting at p), 0 if none; add inserts (InvalidArgument
 * if the range overlaps one already there); take removes the entry starting
 * at p if its kind is `kind` and gives it (0 if there is none). For IPC
 * entries, acquire adds one reference to the mapping of (pid, dev, ino) and
 * gives its base (0 if none), release drops one from the entry at p and
 * removes it at zero (*gone = 1, the entry in *r); -1 if p is no IPC entry. */
int loom_emu_reg_find(const void *p, int exact, emu_range_t *r);
loomResult_t loom_emu_reg_add(const emu_range_t *r);
int loom_emu_reg_take(const void *p, emu_mem_kind_t kind, emu_range_t *r);
void *loom_emu_reg_ipc_acquire(pid_t pid, uint64_t dev, uint64_t ino);
int loom_emu_reg_ipc_release(const void *p, int *gone, emu_range_t *r);

int loom_emu_ptr_device(const void *p);
loomResult_t loom_emu_ptr_base(const void *p, void **base, size_t *size);
loomResult_t loom_emu_mem_alloc(void **p, size_t size);
loomResult_t loom_emu_mem_free(void *p);
loomResult_t loom_emu_host_alloc(void **p, size_t size);
loomResult_t loom_emu_host_free(void *p);
loomResult_t loom_emu_host_map(void *p, size_t size, void **dev_p);
loomResult_t loom_emu_host_unmap(void *p);
loomResult_t loom_emu_ipc_export(void *base, loom_dev_ipc_t *handle);
loomResult_t loom_emu_ipc_open(const loom_dev_ipc_t *handle, void **p);
loomResult_t loom_emu_ipc_close(void *p);

/* ---- streams and events (devrt_emu_stream.c, devrt_emu_event.c) ---------- */

typedef enum {
    EMU_OP_COPY,
    EMU_OP_WRITE,
    EMU_OP_WAIT,
    EMU_OP_EVENT,
    EMU_OP_REDUCE,
    EMU_OP_Q4_ENCODE,
    EMU_OP_Q4_DECODE,
    EMU_OP_Q4_DECODE_ACC,
    EMU_OP_CAST
} emu_op_kind_t;

/* One queued operation; the fields its kind uses (the arguments of the
 * devrt.h call it comes from). */
typedef struct {
    emu_op_kind_t kind;
    void *dst;
    const void *src;
    size_t n;
    uint32_t *addr; /* WRITE, WAIT */
    uint32_t value;
    struct loom_dev_event *event; /* EVENT: holds a reference */
    uint64_t event_gen;
    loomDataType_t dt, dt2; /* dt2: CAST's source type */
    loomRedOp_t op;
    int nsrc, nranks;
    const float *err_in; /* Q4_ENCODE */
    float *err_out;
    const void *srcs[LOOM_DK_MAX_SRCS]; /* REDUCE */
} emu_op_t;

/* Queues op on s (NULL: the default stream). Errors: InvalidArgument (not a
 * stream), InvalidUsage (a stream of the parent process, or destroyed). */
loomResult_t loom_emu_enqueue(loom_dev_stream_t s, const emu_op_t *op);
/* Waits until every operation queued on any stream before the call ran
 * (what cudaFree and cudaDeviceSynchronize wait for). */
void loom_emu_sync_all(void);
/* Runs an EVENT operation (the stream's worker) and drops its reference. */
void loom_emu_event_reached(struct loom_dev_event *e, uint64_t gen);
/* Bumped in a child after fork(): streams and events of an older generation
 * belong to the parent. */
unsigned loom_emu_fork_gen(void);

loomResult_t loom_emu_stream_create(loom_dev_stream_t *s);
loomResult_t loom_emu_stream_destroy(loom_dev_stream_t s);
loomResult_t loom_emu_stream_query(loom_dev_stream_t s);
loomResult_t loom_emu_stream_capturing(loom_dev_stream_t s, int *capturing);
loomResult_t loom_emu_event_create(loom_dev_event_t *e);
loomResult_t loom_emu_event_destroy(loom_dev_event_t e);
loomResult_t loom_emu_event_record(loom_dev_event_t e, loom_dev_stream_t s);
loomResult_t loom_emu_event_query(loom_dev_event_t e);

#endif
