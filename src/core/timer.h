/* SPDX-License-Identifier: Apache-2.0
 *
 * timer.h - the monotonic clock every deadline in loom is measured on.
 */
#ifndef LOOM_TIMER_H
#define LOOM_TIMER_H

#include <stdint.h>
#include <time.h>

static inline uint64_t loom_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t loom_deadline_ms(int64_t timeout_ms)
{
    return loom_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

#endif
