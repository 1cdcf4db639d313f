// SPDX-License-Identifier: Apache-2.0
//
// tp_pattern.h - the byte pattern the transport tests send: a function of the sender, the
// message number and the position, so that a byte delivered to the wrong message, the wrong
// place or from the wrong peer is caught. Shared by test_transport.cc and test_tcp_stripe.cc.
#ifndef LOOM_TESTS_TRANSPORT_TP_PATTERN_H
#define LOOM_TESTS_TRANSPORT_TP_PATTERN_H

#include <cstddef>
#include <cstdint>

namespace loomtest {

inline uint8_t TpPattern(int from, int msg, size_t i)
{
    return static_cast<uint8_t>(from * 71 + msg * 13 + i * 7 + (i >> 9));
}

inline void TpFill(uint8_t *p, size_t len, int from, int msg)
{
    for (size_t i = 0; i < len; i++)
        p[i] = TpPattern(from, msg, i);
}

// The first byte of p[len] that differs from the pattern, or len.
inline size_t TpFirstWrong(const uint8_t *p, size_t len, int from, int msg)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != TpPattern(from, msg, i))
            return i;
    return len;
}

} // namespace loomtest

#endif // LOOM_TESTS_TRANSPORT_TP_PATTERN_H
