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

/* The time on clock `clk` us microseconds from now, as pthread_cond_timedwait takes it (the
 * condition variable's clock: CLOCK_REALTIME unless it was set otherwise). */
static inline struct timespec loom_clock_in_us(clockid_t clk, long us)
{
    struct timespec t;
    clock_gettime(clk, &t);
    t.tv_sec += us / 1000000;
    t.tv_nsec += (us % 1000000) * 1000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

#endif
