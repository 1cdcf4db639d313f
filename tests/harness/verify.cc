// SPDX-License-Identifier: Apache-2.0
//
// verify.cc - verifiable inputs and exact expected results for every datatype and reduction op,
// and the reference float16/bfloat16/fp8 conversions they are rounded with. The conversions
// decode every bit pattern from the format's definition once and round by searching that table
// for the nearest value, deliberately unlike loom's integer bit manipulation, so that a shared
// mistake is unlikely. Nothing here calls loom; it does not choose which cases to run (the
// suites do). Used by tests/coll.

#include "verify.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace loomtest {

namespace {

// ---- Narrow float formats ---------------------------------------------------------------------

struct NarrowFmt {
    int mbits;       // stored mantissa bits
    int ebits;       // exponent bits
    int bias;        // exponent bias
    bool saturate;   // overflow gives the largest finite value (fp8) rather than infinity
    bool e4m3_style; // no infinities; only S.1111.111 is NaN
    uint32_t qnan;   // the quiet NaN produced (sign added separately)
};

// Largest finite values: float16 65504, bfloat16 (2 - 2^-7) * 2^127, E4M3 448, E5M2 57344.
const NarrowFmt kHalf{10, 5, 15, false, false, 0x7e00u};
const NarrowFmt kBf16{7, 8, 127, false, false, 0x7fc0u};
const NarrowFmt kE4m3{3, 4, 7, true, true, 0x7fu};
const NarrowFmt kE5m2{2, 5, 15, true, false, 0x7eu};

// The value of a bit pattern, from the format's definition.
double DecodeSlow(uint32_t bits, const NarrowFmt &f)
{
    const bool neg = (bits >> (f.mbits + f.ebits)) & 1u;
    const uint32_t emask = (1u << f.ebits) - 1u, mmask = (1u << f.mbits) - 1u;
    const uint32_t exp = (bits >> f.mbits) & emask, mant = bits & mmask;
    double v;
    if (f.e4m3_style && exp == emask && mant == mmask)
        v = std::numeric_limits<double>::quiet_NaN();
    else if (!f.e4m3_style && exp == emask)
        v = mant ? std::numeric_limits<double>::quiet_NaN()
                 : std::numeric_limits<double>::infinity();
    else if (exp == 0)
        v = std::ldexp(static_cast<double>(mant), 1 - f.bias - f.mbits);
    else
        v = std::ldexp(1.0 + static_cast<double>(mant) / std::ldexp(1.0, f.mbits),
                       static_cast<int>(exp) - f.bias);
    return neg ? -v : v;
}

// Every value of a format, decoded once. For the non-negative finite values the bit patterns
// 0, 1, 2, ... are in increasing order of value, which is what Encode searches.
struct NarrowTable {
    std::vector<float> value; // indexed by bit pattern
    uint32_t max_bits;        // the largest finite positive value
};

NarrowTable BuildTable(const NarrowFmt &f)
{
    NarrowTable t;
    const uint32_t n = 1u << (1 + f.ebits + f.mbits);
    t.value.resize(n);
    for (uint32_t b = 0; b < n; b++)
        t.value[b] = static_cast<float>(DecodeSlow(b, f));
    t.max_bits = 0;
    while (t.max_bits + 1 < n / 2 && !std::isnan(t.value[t.max_bits + 1]) &&
           !std::isinf(t.value[t.max_bits + 1]))
        t.max_bits++;
    return t;
}

// Built on first use (thread-safe static initialisation), one per format.
const NarrowTable &TableOf(const NarrowFmt &f)
{
    if (&f == &kHalf) {
        static const NarrowTable t = BuildTable(kHalf);
        return t;
    }
    if (&f == &kBf16) {
        static const NarrowTable t = BuildTable(kBf16);
        return t;
    }
    if (&f == &kE4m3) {
        static const NarrowTable t = BuildTable(kE4m3);
        return t;
    }
    static const NarrowTable t = BuildTable(kE5m2);
    return t;
}

double Decode(uint32_t bits, const NarrowFmt &f)
{
    return TableOf(f).value[bits];
}

// Round to nearest, ties to even, by searching the table of representable values: the two
// neighbours of |x| are found by bisection, the nearer one wins, and a tie goes to the even
// bit pattern (the one whose last mantissa bit is 0). Past the largest finite value, values
// below the midpoint to the next (unrepresentable) step round down to it; the rest overflow to
// infinity, or saturate for fp8.
uint32_t Encode(double x, const NarrowFmt &f)
{
    const NarrowTable &t = TableOf(f);
    const uint32_t sign = std::signbit(x) ? 1u << (f.mbits + f.ebits) : 0u;
    if (std::isnan(x))
        return sign | f.qnan;
    const double a = std::fabs(x);
    const double max = t.value[t.max_bits];
    if (a >= max) {
        const double half_step = (max - t.value[t.max_bits - 1]) / 2;
        if (f.saturate || a < max + half_step)
            return sign | t.max_bits;
        return sign | (((1u << f.ebits) - 1u) << f.mbits); // infinity
    }
    // lo: the last table value <= a. The binade of a gives a first guess (its exponent and top
    // mantissa bits); the table has the final word, and bisection covers a wrong guess.
    uint64_t abits;
    memcpy(&abits, &a, sizeof(abits));
    const int e = static_cast<int>(abits >> 52) - 1023;
    uint32_t lo;
    if (e < 1 - f.bias)
        lo = static_cast<uint32_t>(std::ldexp(a, f.mbits - 1 + f.bias)); // subnormal: a / quantum
    else
        lo = (static_cast<uint32_t>(e + f.bias) << f.mbits) |
             static_cast<uint32_t>((abits >> (52 - f.mbits)) & ((1u << f.mbits) - 1u));
    if (lo >= t.max_bits || !(t.value[lo] <= a && a < t.value[lo + 1])) {
        const float *p = t.value.data();
        for (uint32_t n = t.max_bits + 1; n > 1;) {
            const uint32_t half = n / 2;
            p = static_cast<double>(p[half]) <= a ? p + half : p;
            n -= half;
        }
        lo = static_cast<uint32_t>(p - t.value.data());
    }
    const uint32_t hi = lo + 1;
    const double below = a - t.value[lo], above = t.value[hi] - a;
    if (below < above)
        return sign | lo;
    if (above < below)
        return sign | hi;
    return sign | ((lo & 1u) ? hi : lo);
}

const NarrowFmt *NarrowOf(loomDataType_t dt)
{
    switch (dt) {
    case loomFloat16:
        return &kHalf;
    case loomBfloat16:
        return &kBf16;
    case loomFloat8e4m3:
        return &kE4m3;
    case loomFloat8e5m2:
        return &kE5m2;
    default:
        return nullptr;
    }
}

// ---- Pseudo-random values ---------------------------------------------------------------------

// Element i of rank's stream is Mix64(RankBase(seed, rank) + i).
uint64_t RankBase(uint64_t seed, int rank)
{
    return Mix64(seed ^ (static_cast<uint64_t>(rank) << 56) ^ 0x6c6f6f6dULL);
}

// Half-width of the integer range of sum/avg inputs: with 8 ranks the float32 and float64
// sums stay exact; the narrow formats sometimes need the final rounding (e.g. 17 in E4M3).
double SumRange(loomDataType_t dt)
{
    switch (dt) {
    case loomFloat8e4m3:
        return 4;
    case loomFloat8e5m2:
        return 3;
    case loomBfloat16:
        return 40;
    case loomFloat16:
        return 300;
    case loomFloat32:
        return 1000000;
    default:
        return 1000000000;
    }
}

// A random finite bit pattern of a narrow format, not negative zero.
uint32_t RandomFiniteBits(const NarrowFmt &f, uint64_t h)
{
    const uint32_t width = static_cast<uint32_t>(1 + f.ebits + f.mbits);
    uint32_t b = static_cast<uint32_t>(h) & ((1u << width) - 1u);
    const uint32_t emask = (1u << f.ebits) - 1u;
    if (f.e4m3_style ? (b & 0x7fu) == 0x7fu : ((b >> f.mbits) & emask) == emask)
        b &= ~(1u << (width - 2)); // clear the top exponent bit: finite again
    if (b == 1u << (width - 1))
        b = 0;
    return b;
}

// A random finite bit pattern of the type, without negative zero, as its exact value.
double RandomFinite(loomDataType_t dt, uint64_t h)
{
    if (dt == loomFloat32) {
        uint32_t b = static_cast<uint32_t>(h);
        if (((b >> 23) & 0xffu) == 0xffu)
            b &= ~0x40000000u;
        if (b == 0x80000000u)
            b = 0;
        float f;
        memcpy(&f, &b, sizeof(f));
        return f;
    }
    if (dt == loomFloat64) {
        uint64_t b = h;
        if (((b >> 52) & 0x7ffu) == 0x7ffu)
            b &= ~0x4000000000000000ULL;
        if (b == 0x8000000000000000ULL)
            b = 0;
        double d;
        memcpy(&d, &b, sizeof(d));
        return d;
    }
    return Decode(RandomFiniteBits(*NarrowOf(dt), h), *NarrowOf(dt));
}

// The exact value of element i of a rank's input for a floating-point type; h is the rank's
// pseudo-random word for that element.
double FloatInput(loomDataType_t dt, loomRedOp_t op, uint64_t h, size_t i)
{
    switch (op) {
    case loomMax:
    case loomMin:
        return RandomFinite(dt, h);
    case loomProd: {
        static const double kFactors[16] = {1,  1,  1,  1, 1, 1,  -1,  -1,
                                            -1, -1, -1, 2, 2, -2, 0.5, -0.5};
        return kFactors[h & 15u];
    }
    default: {
        if ((dt == loomFloat8e4m3 || dt == loomFloat8e5m2) && i % 61 == 60) {
            // Saturation: every rank adds the same large value, so with enough ranks the
            // float32 sum passes the format's largest finite value.
            const double big = dt == loomFloat8e4m3 ? 96.0 : 16384.0;
            return (i / 61) % 2 ? -big : big;
        }
        const double r = SumRange(dt);
        const uint64_t span = static_cast<uint64_t>(2 * r + 1);
        return static_cast<double>(h % span) - r;
    }
    }
}

template <typename T> void StoreAt(void *buf, size_t j, T v)
{
    memcpy(static_cast<char *>(buf) + j * sizeof(T), &v, sizeof(T));
}

void StoreFloat(void *buf, size_t j, loomDataType_t dt, double v)
{
    switch (dt) {
    case loomFloat32:
        StoreAt(buf, j, static_cast<float>(v));
        break;
    case loomFloat64:
        StoreAt(buf, j, v);
        break;
    case loomFloat16:
    case loomBfloat16:
        StoreAt(buf, j, static_cast<uint16_t>(Encode(v, *NarrowOf(dt))));
        break;
    default:
        StoreAt(buf, j, static_cast<uint8_t>(Encode(v, *NarrowOf(dt))));
        break;
    }
}

template <typename A> A Combine(A acc, A v, loomRedOp_t op)
{
    switch (op) {
    case loomProd:
        return acc * v;
    case loomMax:
        return v > acc ? v : acc;
    case loomMin:
        return v < acc ? v : acc;
    default: // sum, avg
        return acc + v;
    }
}

// Floating point: accumulate in A (float32 for the narrow formats) in rank order.
template <typename A>
void ExpectedFloat(void *buf, loomDataType_t dt, loomRedOp_t op, int nranks, uint64_t seed,
                   size_t first, size_t count)
{
    std::vector<uint64_t> base(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; r++)
        base[static_cast<size_t>(r)] = RankBase(seed, r);
    for (size_t j = 0; j < count; j++) {
        const size_t i = first + j;
        A acc = static_cast<A>(FloatInput(dt, op, Mix64(base[0] + i), i));
        for (size_t r = 1; r < base.size(); r++)
            acc = Combine(acc, static_cast<A>(FloatInput(dt, op, Mix64(base[r] + i), i)), op);
        if (op == loomAvg)
            acc = acc / static_cast<A>(nranks);
        StoreFloat(buf, j, dt, static_cast<double>(acc));
    }
}

// Integers: sums and products in the unsigned type of the same width (wrapping modulo 2^bits),
// comparisons in T, avg = the wrapped sum read as T, truncating division by nranks.
template <typename T>
void ExpectedInt(void *buf, loomRedOp_t op, int nranks, uint64_t seed, size_t first, size_t count)
{
    using U = std::make_unsigned_t<T>;
    std::vector<uint64_t> base(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; r++)
        base[static_cast<size_t>(r)] = RankBase(seed, r);
    for (size_t j = 0; j < count; j++) {
        const size_t i = first + j;
        U acc = static_cast<U>(Mix64(base[0] + i));
        for (size_t r = 1; r < base.size(); r++) {
            const U v = static_cast<U>(Mix64(base[r] + i));
            switch (op) {
            case loomProd:
                acc = static_cast<U>(acc * v);
                break;
            case loomMax:
                acc = static_cast<T>(v) > static_cast<T>(acc) ? v : acc;
                break;
            case loomMin:
                acc = static_cast<T>(v) < static_cast<T>(acc) ? v : acc;
                break;
            default:
                acc = static_cast<U>(acc + v);
                break;
            }
        }
        T out = static_cast<T>(acc);
        if (op == loomAvg)
            out = static_cast<T>(out / static_cast<T>(nranks));
        StoreAt(buf, j, out);
    }
}

} // namespace

// ---- Public functions -------------------------------------------------------------------------

uint64_t Mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

size_t TypeSize(loomDataType_t dt)
{
    switch (dt) {
    case loomInt8:
    case loomUint8:
    case loomFloat8e4m3:
    case loomFloat8e5m2:
        return 1;
    case loomFloat16:
    case loomBfloat16:
        return 2;
    case loomInt32:
    case loomUint32:
    case loomFloat32:
        return 4;
    case loomInt64:
    case loomUint64:
    case loomFloat64:
        return 8;
    default:
        return 0;
    }
}

const char *TypeName(loomDataType_t dt)
{
    static const char *const kNames[] = {"int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
                                         "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
    const int i = static_cast<int>(dt);
    return i >= 0 && i < loomNumTypes ? kNames[i] : "invalid";
}

const char *OpName(loomRedOp_t op)
{
    static const char *const kNames[] = {"sum", "prod", "max", "min", "avg"};
    const int i = static_cast<int>(op);
    return i >= 0 && i < loomNumOps ? kNames[i] : "invalid";
}

bool IsNarrowFloat(loomDataType_t dt)
{
    return NarrowOf(dt) != nullptr;
}

bool IsFloatType(loomDataType_t dt)
{
    return IsNarrowFloat(dt) || dt == loomFloat32 || dt == loomFloat64;
}

uint16_t RefFloatToHalf(float f)
{
    return static_cast<uint16_t>(Encode(f, kHalf));
}
float RefHalfToFloat(uint16_t h)
{
    return static_cast<float>(Decode(h, kHalf));
}
uint16_t RefFloatToBf16(float f)
{
    return static_cast<uint16_t>(Encode(f, kBf16));
}
float RefBf16ToFloat(uint16_t b)
{
    return static_cast<float>(Decode(b, kBf16));
}
uint8_t RefFloatToE4m3(float f)
{
    return static_cast<uint8_t>(Encode(f, kE4m3));
}
float RefE4m3ToFloat(uint8_t v)
{
    return static_cast<float>(Decode(v, kE4m3));
}
uint8_t RefFloatToE5m2(float f)
{
    return static_cast<uint8_t>(Encode(f, kE5m2));
}
float RefE5m2ToFloat(uint8_t v)
{
    return static_cast<float>(Decode(v, kE5m2));
}

void FillReduceInput(void *buf, loomDataType_t dt, loomRedOp_t op, int rank, uint64_t seed,
                     size_t first, size_t count)
{
    const uint64_t base = RankBase(seed, rank);
    if (IsNarrowFloat(dt) && (op == loomMax || op == loomMin)) {
        const NarrowFmt &f = *NarrowOf(dt);
        for (size_t j = 0; j < count; j++) {
            const uint32_t b = RandomFiniteBits(f, Mix64(base + first + j));
            if (TypeSize(dt) == 2)
                StoreAt(buf, j, static_cast<uint16_t>(b));
            else
                StoreAt(buf, j, static_cast<uint8_t>(b));
        }
        return;
    }
    if (IsFloatType(dt)) {
        for (size_t j = 0; j < count; j++)
            StoreFloat(buf, j, dt, FloatInput(dt, op, Mix64(base + first + j), first + j));
        return;
    }
    const size_t es = TypeSize(dt);
    for (size_t j = 0; j < count; j++) {
        const uint64_t v = Mix64(base + first + j); // little-endian: the low bytes
        memcpy(static_cast<char *>(buf) + j * es, &v, es);
    }
}

void FillReduceExpected(void *buf, loomDataType_t dt, loomRedOp_t op, int nranks, uint64_t seed,
                        size_t first, size_t count)
{
    switch (dt) {
    case loomInt8:
        return ExpectedInt<int8_t>(buf, op, nranks, seed, first, count);
    case loomUint8:
        return ExpectedInt<uint8_t>(buf, op, nranks, seed, first, count);
    case loomInt32:
        return ExpectedInt<int32_t>(buf, op, nranks, seed, first, count);
    case loomUint32:
        return ExpectedInt<uint32_t>(buf, op, nranks, seed, first, count);
    case loomInt64:
        return ExpectedInt<int64_t>(buf, op, nranks, seed, first, count);
    case loomUint64:
        return ExpectedInt<uint64_t>(buf, op, nranks, seed, first, count);
    case loomFloat64:
        return ExpectedFloat<double>(buf, dt, op, nranks, seed, first, count);
    default: // float32 and the narrow formats accumulate in float32
        return ExpectedFloat<float>(buf, dt, op, nranks, seed, first, count);
    }
}

void FillPattern(void *buf, size_t nbytes, int rank, uint64_t seed, size_t first_byte)
{
    unsigned char *out = static_cast<unsigned char *>(buf);
    const uint64_t base = RankBase(seed ^ 0x7061747465726eULL, rank);
    size_t j = 0;
    while (j < nbytes) {
        const size_t pos = first_byte + j;
        const uint64_t w = Mix64(base + pos / 8);
        size_t k = pos % 8;
        if (k == 0 && nbytes - j >= 8) {
            memcpy(out + j, &w, 8);
            j += 8;
            continue;
        }
        for (; k < 8 && j < nbytes; k++, j++)
            out[j] = static_cast<unsigned char>(w >> (8 * k));
    }
}

std::string FormatElement(const void *p, loomDataType_t dt)
{
    char s[96];
    switch (dt) {
    case loomInt8: {
        int8_t v;
        memcpy(&v, p, 1);
        snprintf(s, sizeof(s), "%d", v);
        break;
    }
    case loomUint8: {
        uint8_t v;
        memcpy(&v, p, 1);
        snprintf(s, sizeof(s), "%u", v);
        break;
    }
    case loomInt32: {
        int32_t v;
        memcpy(&v, p, 4);
        snprintf(s, sizeof(s), "%" PRId32, v);
        break;
    }
    case loomUint32: {
        uint32_t v;
        memcpy(&v, p, 4);
        snprintf(s, sizeof(s), "%" PRIu32, v);
        break;
    }
    case loomInt64: {
        int64_t v;
        memcpy(&v, p, 8);
        snprintf(s, sizeof(s), "%" PRId64, v);
        break;
    }
    case loomUint64: {
        uint64_t v;
        memcpy(&v, p, 8);
        snprintf(s, sizeof(s), "%" PRIu64, v);
        break;
    }
    case loomFloat32: {
        float v;
        uint32_t b;
        memcpy(&v, p, 4);
        memcpy(&b, p, 4);
        snprintf(s, sizeof(s), "%.9g (0x%08" PRIx32 ")", static_cast<double>(v), b);
        break;
    }
    case loomFloat64: {
        double v;
        uint64_t b;
        memcpy(&v, p, 8);
        memcpy(&b, p, 8);
        snprintf(s, sizeof(s), "%.17g (0x%016" PRIx64 ")", v, b);
        break;
    }
    case loomFloat16:
    case loomBfloat16: {
        uint16_t b;
        memcpy(&b, p, 2);
        snprintf(s, sizeof(s), "%.9g (0x%04x)", Decode(b, *NarrowOf(dt)), b);
        break;
    }
    case loomFloat8e4m3:
    case loomFloat8e5m2: {
        uint8_t b;
        memcpy(&b, p, 1);
        snprintf(s, sizeof(s), "%.9g (0x%02x)", Decode(b, *NarrowOf(dt)), b);
        break;
    }
    default:
        snprintf(s, sizeof(s), "(invalid datatype %d)", static_cast<int>(dt));
        break;
    }
    return s;
}

std::string CompareElements(const void *got, const void *expected, size_t count, loomDataType_t dt,
                            size_t max_report)
{
    const size_t es = TypeSize(dt);
    if (count == 0 || memcmp(got, expected, count * es) == 0)
        return "";
    const char *g = static_cast<const char *>(got);
    const char *e = static_cast<const char *>(expected);
    size_t bad = 0;
    std::string detail;
    for (size_t i = 0; i < count; i++) {
        if (memcmp(g + i * es, e + i * es, es) == 0)
            continue;
        if (bad++ < max_report)
            detail += "\n  [" + std::to_string(i) + "] got " + FormatElement(g + i * es, dt) +
                      ", expected " + FormatElement(e + i * es, dt);
    }
    return std::to_string(bad) + " of " + std::to_string(count) + " " + TypeName(dt) +
           " elements differ" + detail;
}

uint64_t Checksum(const void *buf, size_t nbytes)
{
    // Four independent lanes so the multiply chains overlap; then fold them with the length.
    const unsigned char *p = static_cast<const unsigned char *>(buf);
    uint64_t h[4] = {1, 2, 3, 4};
    size_t i = 0;
    for (; i + 32 <= nbytes; i += 32) {
        for (int k = 0; k < 4; k++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * k, 8);
            h[k] = Mix64(h[k] ^ w);
        }
    }
    uint64_t tail = 0;
    for (size_t k = 0; i < nbytes; i++, k++) {
        if (k == 8) {
            h[0] = Mix64(h[0] ^ tail);
            tail = 0;
            k = 0;
        }
        tail |= static_cast<uint64_t>(p[i]) << (8 * k);
    }
    uint64_t s = Mix64(h[0] ^ tail) ^ Mix64(h[1] + 0x1111) ^ Mix64(h[2] + 0x2222);
    return Mix64(s ^ Mix64(h[3] + 0x3333) ^ nbytes);
}

GuardedBuffer::GuardedBuffer(size_t nbytes, unsigned char fill)
    : nbytes_(nbytes), bytes_(nbytes + 2 * kGuard, fill)
{
    for (size_t i = 0; i < kGuard; i++) {
        bytes_[i] = static_cast<unsigned char>(0x5a ^ i);
        bytes_[kGuard + nbytes + i] = static_cast<unsigned char>(0xa5 ^ i);
    }
}

bool GuardedBuffer::GuardsIntact() const
{
    for (size_t i = 0; i < kGuard; i++)
        if (bytes_[i] != static_cast<unsigned char>(0x5a ^ i) ||
            bytes_[kGuard + nbytes_ + i] != static_cast<unsigned char>(0xa5 ^ i))
            return false;
    return true;
}

} // namespace loomtest
