/* SPDX-License-Identifier: Apache-2.0
 *
 * prog_util.h - what the nccl.h-only test programs (loom_mode_prog.c, loom_device_prog.c,
 * route_prog.c) and the route-mode test that checks route_prog's output share: an NCCL
 * datatype's size, and whole reads and writes on the pipes over which the programs' forked ranks
 * pass the unique id. Header-only and valid C and C++: the programs see nothing of loom's build
 * but nccl.h.
 */
#ifndef LOOM_TEST_PROG_UTIL_H
#define LOOM_TEST_PROG_UTIL_H

#include <errno.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

static inline size_t prog_type_size(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

/* All len bytes from (writing == 0) or to fd, a call cut short by a signal resumed: 0, or -1
 * on an error or, reading, the end. */
static inline int prog_io_all(int fd, char *p, size_t len, int writing)
{
    while (len > 0) {
        ssize_t k = writing ? write(fd, p, len) : read(fd, p, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

static inline int prog_read_all(int fd, void *buf, size_t len)
{
    return prog_io_all(fd, (char *)buf, len, 0);
}

/* write() only reads the buffer, so dropping const here writes nothing through it. */
static inline int prog_write_all(int fd, const void *buf, size_t len)
{
    return prog_io_all(fd, (char *)(uintptr_t)buf, len, 1);
}

#endif
