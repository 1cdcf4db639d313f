/* SPDX-License-Identifier: Apache-2.0
 *
 * dtype.c - datatype and reduction-op tables: sizes, the names printed in logs
 * and benchmarks, parsing of user-given names, and out-of-line copies of the
 * scalar float conversions from dtype.h. Argument validation in the API layer,
 * the tools and the tests call these. Array kernels are not here (see
 * collectives/kernels.c), and nothing here logs or allocates.
 */
#include "dtype.h"

#include <stddef.h>

static const size_t dtype_sizes[loomNumTypes] = {
    [loomInt8] = 1,    [loomUint8] = 1,    [loomInt32] = 4,      [loomUint32] = 4,
    [loomInt64] = 8,   [loomUint64] = 8,   [loomFloat16] = 2,    [loomFloat32] = 4,
    [loomFloat64] = 8, [loomBfloat16] = 2, [loomFloat8e4m3] = 1, [loomFloat8e5m2] = 1,
};

static const char *const dtype_names[loomNumTypes] = {
    [loomInt8] = "int8",         [loomUint8] = "uint8",       [loomInt32] = "int32",
    [loomUint32] = "uint32",     [loomInt64] = "int64",       [loomUint64] = "uint64",
    [loomFloat16] = "half",      [loomFloat32] = "float",     [loomFloat64] = "double",
    [loomBfloat16] = "bfloat16", [loomFloat8e4m3] = "f8e4m3", [loomFloat8e5m2] = "f8e5m2",
};

static const char *const redop_names[loomNumOps] = {
    [loomSum] = "sum", [loomProd] = "prod", [loomMax] = "max", [loomMin] = "min", [loomAvg] = "avg",
};

struct name_alias {
    const char *name;
    int value;
};

/* The canonical names come first; the rest are spellings that users of
 * nccl-tests, PyTorch and numpy type. Plain "int"/"uint" follow C (32 bits). */
static const struct name_alias dtype_aliases[] = {
    {"int8", loomInt8},
    {"uint8", loomUint8},
    {"int32", loomInt32},
    {"uint32", loomUint32},
    {"int64", loomInt64},
    {"uint64", loomUint64},
    {"half", loomFloat16},
    {"float", loomFloat32},
    {"double", loomFloat64},
    {"bfloat16", loomBfloat16},
    {"f8e4m3", loomFloat8e4m3},
    {"f8e5m2", loomFloat8e5m2},
    {"char", loomInt8},
    {"i8", loomInt8},
    {"byte", loomUint8},
    {"u8", loomUint8},
    {"int", loomInt32},
    {"i32", loomInt32},
    {"uint", loomUint32},
    {"u32", loomUint32},
    {"i64", loomInt64},
    {"long", loomInt64},
    {"u64", loomUint64},
    {"float16", loomFloat16},
    {"fp16", loomFloat16},
    {"f16", loomFloat16},
    {"float32", loomFloat32},
    {"fp32", loomFloat32},
    {"f32", loomFloat32},
    {"float64", loomFloat64},
    {"fp64", loomFloat64},
    {"f64", loomFloat64},
    {"bf16", loomBfloat16},
    {"e4m3", loomFloat8e4m3},
    {"fp8e4m3", loomFloat8e4m3},
    {"float8e4m3", loomFloat8e4m3},
    {"fp8_e4m3", loomFloat8e4m3},
    {"float8_e4m3fn", loomFloat8e4m3},
    {"e5m2", loomFloat8e5m2},
    {"fp8e5m2", loomFloat8e5m2},
    {"float8e5m2", loomFloat8e5m2},
    {"fp8_e5m2", loomFloat8e5m2},
    {"float8_e5m2", loomFloat8e5m2},
};

static const struct name_alias redop_aliases[] = {
    {"sum", loomSum}, {"prod", loomProd},    {"max", loomMax},  {"min", loomMin},
    {"avg", loomAvg}, {"product", loomProd}, {"mean", loomAvg}, {"average", loomAvg},
};

/* The fp8 decode tables, as constant expressions of the encoding v. A
 * subnormal m * 2^-9 (E4M3) or m * 2^-16 (E5M2) is placed in its binade by
 * hand: the mantissas are only 3 and 2 bits wide. E4M3 has no infinities and
 * one NaN per sign; E5M2's exponent 31 is IEEE infinity/NaN, payload kept. */
#define E4M3_SUB(m)                                                                                \
    ((m) >= 4u   ? (120u << 23) | (((m)&3u) << 21)                                                 \
     : (m) >= 2u ? (119u << 23) | (((m)&1u) << 22)                                                 \
     : (m)       ? 118u << 23                                                                      \
                 : 0u)
#define E4M3_MAG(em)                                                                               \
    ((em) == 0x7fu ? 0x7fc00000u : ((em) >> 3) ? ((em) << 20) + (120u << 23) : E4M3_SUB(em))
#define E5M2_SUB(m) ((m) >= 2u ? (112u << 23) | (((m)&1u) << 22) : (m) ? 111u << 23 : 0u)
#define E5M2_MAG(em)                                                                               \
    (((em) >> 2) == 0x1fu ? 0x7f800000u | (((em)&3u) << 21)                                        \
     : ((em) >> 2)        ? ((em) << 21) + (112u << 23)                                            \
                          : E5M2_SUB(em))
#define FP8_ENTRY(mag, v) ((((v)&0x80u) << 24) | mag((v)&0x7fu))
#define FP8_4(mag, v)                                                                              \
    FP8_ENTRY(mag, v), FP8_ENTRY(mag, v + 1u), FP8_ENTRY(mag, v + 2u), FP8_ENTRY(mag, v + 3u)
#define FP8_16(mag, v) FP8_4(mag, v), FP8_4(mag, v + 4u), FP8_4(mag, v + 8u), FP8_4(mag, v + 12u)
#define FP8_64(mag, v)                                                                             \
    FP8_16(mag, v), FP8_16(mag, v + 16u), FP8_16(mag, v + 32u), FP8_16(mag, v + 48u)
#define FP8_256(mag) FP8_64(mag, 0u), FP8_64(mag, 64u), FP8_64(mag, 128u), FP8_64(mag, 192u)

const uint32_t loom_e4m3_f32_bits[256] = {FP8_256(E4M3_MAG)};
const uint32_t loom_e5m2_f32_bits[256] = {FP8_256(E5M2_MAG)};

int loom_dtype_valid(loomDataType_t dt)
{
    /* Through int: the enum has no negative members, so it may be unsigned. */
    return (int)dt >= 0 && (int)dt < (int)loomNumTypes;
}

int loom_redop_valid(loomRedOp_t op)
{
    return (int)op >= 0 && (int)op < (int)loomNumOps;
}

size_t loom_dtype_size(loomDataType_t dt)
{
    return loom_dtype_valid(dt) ? dtype_sizes[dt] : 0;
}

const char *loom_dtype_name(loomDataType_t dt)
{
    return loom_dtype_valid(dt) ? dtype_names[dt] : "invalid";
}

const char *loom_redop_name(loomRedOp_t op)
{
    return loom_redop_valid(op) ? redop_names[op] : "invalid";
}

/* ASCII-only case folding: names come from environment variables and command
 * lines, and the C locale functions would make the result locale-dependent. */
static int name_equal(const char *a, const char *b)
{
    for (;; a++, b++) {
        unsigned char ca = (unsigned char)*a, cb = (unsigned char)*b;
        if (ca >= 'A' && ca <= 'Z')
            ca = (unsigned char)(ca - 'A' + 'a');
        if (ca != cb)
            return 0;
        if (ca == '\0')
            return 1;
    }
}

static int lookup(const struct name_alias *table, size_t count, const char *name)
{
    if (name == NULL)
        return -1;
    for (size_t i = 0; i < count; i++) {
        if (name_equal(name, table[i].name))
            return table[i].value;
    }
    return -1;
}

int loom_dtype_parse(const char *name)
{
    return lookup(dtype_aliases, sizeof dtype_aliases / sizeof dtype_aliases[0], name);
}

int loom_redop_parse(const char *name)
{
    return lookup(redop_aliases, sizeof redop_aliases / sizeof redop_aliases[0], name);
}

float loom_f16_to_f32(uint16_t h)
{
    return loom_f16_decode(h);
}

uint16_t loom_f32_to_f16(float f)
{
    return loom_f16_encode(f);
}

float loom_bf16_to_f32(uint16_t b)
{
    return loom_bf16_decode(b);
}

uint16_t loom_f32_to_bf16(float f)
{
    return loom_bf16_encode(f);
}

float loom_e4m3_to_f32(uint8_t v)
{
    return loom_e4m3_decode(v);
}

uint8_t loom_f32_to_e4m3(float f)
{
    return loom_e4m3_encode(f);
}

float loom_e5m2_to_f32(uint8_t v)
{
    return loom_e5m2_decode(v);
}

uint8_t loom_f32_to_e5m2(float f)
{
    return loom_e5m2_encode(f);
}
