// SPDX-License-Identifier: Apache-2.0
//
// verify.h - "verifiable" collective data, nccl-tests style: inputs that are a pure function of
// (datatype, op, rank, seed, element index), and the exact expected result of reducing them as
// loom's contract says (rank order 0..n-1, float32 accumulator for the 8/16-bit floats, one
// rounding per element, avg = one division by nranks). Expected values are rounded with this
// file's own float16/bfloat16/fp8 conversions, never the library's, so results compare bit for
// bit. It does not call loom. Used by the tests in tests/coll.
#ifndef LOOM_TESTS_HARNESS_VERIFY_H
#define LOOM_TESTS_HARNESS_VERIFY_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom.h"

namespace loomtest {

constexpr loomDataType_t kAllTypes[] = {loomInt8,    loomUint8,    loomInt32,      loomUint32,
                                        loomInt64,   loomUint64,   loomFloat16,    loomFloat32,
                                        loomFloat64, loomBfloat16, loomFloat8e4m3, loomFloat8e5m2};
constexpr loomRedOp_t kAllOps[] = {loomSum, loomProd, loomMax, loomMin, loomAvg};

size_t TypeSize(loomDataType_t dt); // 0 for an invalid type
const char *TypeName(loomDataType_t dt);
const char *OpName(loomRedOp_t op);
bool IsFloatType(loomDataType_t dt);   // every floating-point type
bool IsNarrowFloat(loomDataType_t dt); // float16, bfloat16, fp8 (accumulated in float32)

// ---- Reference conversions: round to nearest, ties to even ------------------------------------
// float16 and bfloat16 overflow to infinity; fp8 E4M3 saturates to +-448 and E5M2 to +-57344
// (infinities included), as loom documents. A NaN becomes a quiet NaN of the same sign.
uint16_t RefFloatToHalf(float f);
float RefHalfToFloat(uint16_t h);
uint16_t RefFloatToBf16(float f);
float RefBf16ToFloat(uint16_t b);
uint8_t RefFloatToE4m3(float f);
float RefE4m3ToFloat(uint8_t v);
uint8_t RefFloatToE5m2(float f);
float RefE5m2ToFloat(uint8_t v);

// ---- Reductions ---------------------------------------------------------------------------------
// Fills buf with elements [first, first + count) of rank's input for (dt, op, seed). The values:
//  integers: full-width pseudo-random bits (sums and products wrap modulo 2^bits);
//  floats, sum/avg: small integers, so float32/float64 sums are exact in any order; the narrow
//    formats sometimes need the final rounding (17 in E4M3 is a tie), and every 61st fp8 element
//    is large enough that with 4-5 ranks the sum saturates;
//  floats, prod: +-1, +-2, +-0.5 (products of up to 8 ranks are exact in every format);
//  floats, max/min: pseudo-random finite bit patterns (no NaN, infinity or negative zero).
// The expected values follow the contract step by step (float32 sums that are exact, then one
// division for avg and one rounding), so all comparisons are bitwise: no case needs a tolerance.
void FillReduceInput(void *buf, loomDataType_t dt, loomRedOp_t op, int rank, uint64_t seed,
                     size_t first, size_t count);
// The expected result of reducing nranks such inputs, elements [first, first + count).
void FillReduceExpected(void *buf, loomDataType_t dt, loomRedOp_t op, int nranks, uint64_t seed,
                        size_t first, size_t count);

// ---- Data movement ------------------------------------------------------------------------------
// Pseudo-random bytes [first_byte, first_byte + nbytes) of rank's stream for seed: any bit
// pattern (NaNs included) must move unchanged.
void FillPattern(void *buf, size_t nbytes, int rank, uint64_t seed, size_t first_byte = 0);

// ---- Comparison ---------------------------------------------------------------------------------
// "" if the count elements are bitwise equal; otherwise the number of differing elements and
// the first few (index, got, expected), decoded for dt.
std::string CompareElements(const void *got, const void *expected, size_t count, loomDataType_t dt,
                            size_t max_report = 4);
std::string FormatElement(const void *p, loomDataType_t dt);
// A 64-bit hash of nbytes (order-sensitive); equal buffers give equal sums.
uint64_t Checksum(const void *buf, size_t nbytes);
// splitmix64: the mixing function behind every pseudo-random value here.
uint64_t Mix64(uint64_t x);

// ---- Buffers ------------------------------------------------------------------------------------
// A heap buffer between two guard zones of known bytes: GuardsIntact() is false if anything
// wrote just before or after it. The data starts 16-byte aligned and is filled with `fill`.
class GuardedBuffer {
  public:
    explicit GuardedBuffer(size_t nbytes, unsigned char fill = 0xcd);
    void *data()
    {
        return bytes_.data() + kGuard;
    }
    unsigned char *bytes()
    {
        return bytes_.data() + kGuard;
    }
    size_t size() const
    {
        return nbytes_;
    }
    bool GuardsIntact() const;

  private:
    static constexpr size_t kGuard = 64;
    size_t nbytes_;
    std::vector<unsigned char> bytes_;
};

} // namespace loomtest

#endif // LOOM_TESTS_HARNESS_VERIFY_H
