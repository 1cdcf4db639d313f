/* SPDX-License-Identifier: Apache-2.0
 *
 * devrt_emu.c - the emulated device runtime's table (devrt.h): one device,
 * "emulated", whose memory (devrt_emu_mem.c, devrt_emu_ipc.c), streams and
 * events (devrt_emu_stream.c, devrt_emu_event.c) are host memory and
 * threads. This file checks each queued call's arguments as the CUDA
 * runtime would at launch (so a bad call fails here, not later on the
 * worker) and turns it into a stream operation. What the emulation adds to
 * the table's contract is written in devrt_emu.h. Callers: devrt.c
 * (LOOM_DEVICE=emulated), tests.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "debug.h"
#include "devrt_emu.h"
#include "devrt_emu_int.h"
#include "dtype.h"

// ---- the device -------------------------------------------------------------

static int emu_device_count(void)
{
    return 1;
}

static loomResult_t emu_device_props(int dev, loom_dev_props_t *props)
{
    if (dev != 0 || props == NULL) {
        LOOM_WARN("emulated device: device_props(%d): %s", dev,
                  props == NULL ? "NULL output" : "the only device is 0");
        return loomInvalidArgument;
    }
    memset(props, 0, sizeof(*props));
    snprintf(props->name, sizeof(props->name), "emulated");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    props->mem_bytes = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    props->sm_count = cpus > 0 ? (int)cpus : 1;
    return loomSuccess;
}

static loomResult_t emu_current_device(int *dev)
{
    if (dev == NULL) {
        LOOM_WARN("emulated device: current_device given a NULL output");
        return loomInvalidArgument;
    }
    *dev = 0;
    return loomSuccess;
}

static int emu_memops_ok(char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    return 1;
}

// ---- argument checks ----------------------------------------------------------

/* Memory a GPU reaches: what the runtime allocated, opened or mapped. */
static loomResult_t reachable(const char *call, const char *arg, const void *p)
{
    if (p == NULL) {
        LOOM_WARN("emulated device: %s: %s is NULL", call, arg);
        return loomInvalidArgument;
    }
    if (loom_emu_mem_kind(p) == EMU_MEM_NONE) {
        LOOM_WARN("emulated device: %s: %s (%p) is ordinary host memory, which a device cannot "
                  "reach (device memory, host_alloc or host_map memory is needed)",
                  call, arg, p);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

static int codec_dtype(loomDataType_t dt)
{
    return dt == loomFloat32 || dt == loomFloat16 || dt == loomBfloat16;
}

static loomResult_t bad_dtype(const char *call, loomDataType_t dt, const char *allowed)
{
    LOOM_WARN("emulated device: %s: datatype %d is not one of %s", call, (int)dt, allowed);
    return loomInvalidArgument;
}

// ---- queued calls ---------------------------------------------------------------

static loomResult_t emu_memcpy_async(void *dst, const void *src, size_t n, loom_dev_stream_t s)
{
    if (n == 0)
        return loomSuccess;
    if (dst == NULL || src == NULL) {
        LOOM_WARN("emulated device: memcpy_async of %zu bytes: %s is NULL", n,
                  dst == NULL ? "dst" : "src");
        return loomInvalidArgument;
    }
    emu_op_t op = {.kind = EMU_OP_COPY, .dst = dst, .src = src, .n = n};
    return loom_emu_enqueue(s, &op);
}

static loomResult_t flag_op(emu_op_kind_t kind, const char *call, loom_dev_stream_t s,
                            uint32_t *addr, uint32_t v)
{
    LOOM_CHECK(reachable(call, "the flag word", addr));
    if ((uintptr_t)addr % sizeof(uint32_t) != 0) {
        LOOM_WARN("emulated device: %s: flag word %p is not 4-byte aligned", call, (void *)addr);
        return loomInvalidArgument;
    }
    emu_op_t op = {.kind = kind, .addr = addr, .value = v};
    return loom_emu_enqueue(s, &op);
}

static loomResult_t emu_write_u32(loom_dev_stream_t s, uint32_t *addr, uint32_t v)
{
    return flag_op(EMU_OP_WRITE, "write_u32", s, addr, v);
}

static loomResult_t emu_wait_u32(loom_dev_stream_t s, uint32_t *addr, uint32_t v)
{
    return flag_op(EMU_OP_WAIT, "wait_u32", s, addr, v);
}

static loomResult_t emu_reduce(loom_dev_stream_t s, loomDataType_t dt, loomRedOp_t op, void *dst,
                               const void *const *srcs, int nsrc, size_t n, int nranks)
{
    if (!loom_dk_dtype_ok(dt))
        return bad_dtype("reduce", dt, "the device kernels' (every datatype but fp8)");
    if ((unsigned)op >= (unsigned)loomNumOps || nsrc < 1 || nsrc > LOOM_DK_MAX_SRCS ||
        srcs == NULL) {
        LOOM_WARN("emulated device: reduce: op %d, %d sources%s: op 0..%d and 1..%d sources "
                  "wanted",
                  (int)op, nsrc, srcs == NULL ? " (NULL array)" : "", (int)loomNumOps - 1,
                  LOOM_DK_MAX_SRCS);
        return loomInvalidArgument;
    }
    if (n == 0)
        return loomSuccess;
    emu_op_t q = {.kind = EMU_OP_REDUCE,
                  .dt = dt,
                  .op = op,
                  .dst = dst,
                  .nsrc = nsrc,
                  .n = n,
                  .nranks = nranks};
    LOOM_CHECK(reachable("reduce", "dst", dst));
    for (int i = 0; i < nsrc; i++) {
        char arg[16];
        snprintf(arg, sizeof(arg), "srcs[%d]", i);
        LOOM_CHECK(reachable("reduce", arg, srcs[i]));
        q.srcs[i] = srcs[i];
    }
    return loom_emu_enqueue(s, &q);
}

static loomResult_t emu_q4_encode(loom_dev_stream_t s, const void *src, loomDataType_t dt,
                                  const float *err_in, float *err_out, size_t n, uint8_t *dst)
{
    if (!codec_dtype(dt))
        return bad_dtype("q4_encode", dt, "float32, float16, bfloat16");
    if (n == 0)
        return loomSuccess;
    LOOM_CHECK(reachable("q4_encode", "src", src));
    LOOM_CHECK(reachable("q4_encode", "dst", dst));
    if (err_in != NULL)
        LOOM_CHECK(reachable("q4_encode", "err_in", err_in));
    if (err_out != NULL)
        LOOM_CHECK(reachable("q4_encode", "err_out", err_out));
    emu_op_t op = {.kind = EMU_OP_Q4_ENCODE,
                   .src = src,
                   .dt = dt,
                   .err_in = err_in,
                   .err_out = err_out,
                   .n = n,
                   .dst = dst};
    return loom_emu_enqueue(s, &op);
}

static loomResult_t emu_q4_decode(loom_dev_stream_t s, const uint8_t *src, size_t n, void *dst,
                                  loomDataType_t dt)
{
    if (!codec_dtype(dt))
        return bad_dtype("q4_decode", dt, "float32, float16, bfloat16");
    if (n == 0)
        return loomSuccess;
    LOOM_CHECK(reachable("q4_decode", "src", src));
    LOOM_CHECK(reachable("q4_decode", "dst", dst));
    emu_op_t op = {.kind = EMU_OP_Q4_DECODE, .src = src, .n = n, .dst = dst, .dt = dt};
    return loom_emu_enqueue(s, &op);
}

static loomResult_t emu_q4_decode_acc(loom_dev_stream_t s, const uint8_t *src, size_t n, float *acc)
{
    if (n == 0)
        return loomSuccess;
    LOOM_CHECK(reachable("q4_decode_acc", "src", src));
    LOOM_CHECK(reachable("q4_decode_acc", "acc", acc));
    emu_op_t op = {.kind = EMU_OP_Q4_DECODE_ACC, .src = src, .n = n, .dst = acc};
    return loom_emu_enqueue(s, &op);
}

static loomResult_t emu_cast(loom_dev_stream_t s, void *dst, loomDataType_t ddt, const void *src,
                             loomDataType_t sdt, size_t n)
{
    if (!loom_dk_dtype_ok(ddt) || !loom_dk_dtype_ok(sdt))
        return bad_dtype("cast", loom_dk_dtype_ok(ddt) ? sdt : ddt,
                         "the device kernels' (every datatype but fp8)");
    if (ddt != sdt && (!codec_dtype(ddt) || !codec_dtype(sdt))) {
        LOOM_WARN("emulated device: cast from datatype %d to %d: conversions are between "
                  "float32, float16 and bfloat16 only",
                  (int)sdt, (int)ddt);
        return loomInvalidArgument;
    }
    if (dst == src && loom_dtype_size(ddt) != loom_dtype_size(sdt)) {
        LOOM_WARN("emulated device: cast in place from datatype %d to %d: in place only "
                  "between types of one size",
                  (int)sdt, (int)ddt);
        return loomInvalidArgument;
    }
    if (n == 0)
        return loomSuccess;
    LOOM_CHECK(reachable("cast", "src", src));
    LOOM_CHECK(reachable("cast", "dst", dst));
    emu_op_t op = {.kind = EMU_OP_CAST, .dst = dst, .dt = ddt, .src = src, .dt2 = sdt, .n = n};
    return loom_emu_enqueue(s, &op);
}

static const loom_devrt_t emu_table = {
    .name = "emulated",
    .device_count = emu_device_count,
    .device_props = emu_device_props,
    .current_device = emu_current_device,
    .ptr_device = loom_emu_ptr_device,
    .ptr_base = loom_emu_ptr_base,
    .mem_alloc = loom_emu_mem_alloc,
    .mem_free = loom_emu_mem_free,
    .host_alloc = loom_emu_host_alloc,
    .host_free = loom_emu_host_free,
    .host_map = loom_emu_host_map,
    .host_unmap = loom_emu_host_unmap,
    .stream_create = loom_emu_stream_create,
    .stream_destroy = loom_emu_stream_destroy,
    .stream_query = loom_emu_stream_query,
    .stream_capturing = loom_emu_stream_capturing,
    .memcpy_async = emu_memcpy_async,
    .write_u32 = emu_write_u32,
    .wait_u32 = emu_wait_u32,
    .event_create = loom_emu_event_create,
    .event_destroy = loom_emu_event_destroy,
    .event_record = loom_emu_event_record,
    .event_query = loom_emu_event_query,
    .ipc_export = loom_emu_ipc_export,
    .ipc_open = loom_emu_ipc_open,
    .ipc_close = loom_emu_ipc_close,
    .reduce = emu_reduce,
    .q4_encode = emu_q4_encode,
    .q4_decode = emu_q4_decode,
    .q4_decode_acc = emu_q4_decode_acc,
    .cast = emu_cast,
    .memops_ok = emu_memops_ok,
};

const loom_devrt_t *loom_devrt_emulated(void)
{
    return &emu_table;
}
