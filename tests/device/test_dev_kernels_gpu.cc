/* SPDX-License-Identifier: Apache-2.0
 *
 * test_dev_kernels_gpu.cc - the CUDA kernels of dev_kernels.h against their
 * host twins (dev_kernels_host.c), bit for bit, on the first GPU: the
 * n-input reduce (every datatype but fp8, every op, 1..32 sources), the
 * 4-bit codec (encode with and without residuals, decode to every codec
 * type, decode into an accumulator) and the copy/cast, at lengths 0, 1, 7,
 * 8, 31, 32, 33, 4095 and 2^20+5, from pointers 16-byte aligned, offset by 2
 * and 4 bytes together (the vector path after a head) and apart (the element
 * path), in place, on data with zeros, -0, subnormals, infinities, NaNs and
 * the largest bfloat16 and float32 values, and one reduce of more than 2^31
 * elements where the GPU has the memory. Where two NaNs meet in a sum or
 * product only NaN-ness is compared (kernels.h: the payload is the
 * instruction's choice on the host). Without a usable GPU every case that
 * needs one is skipped with cudaGetDeviceCount's error; the argument checks
 * need none. Seeded from LOOM_TEST_SEED or a fixed seed, printed.
 */
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dev_elem.h"
#include "dev_kernels.h"
#include "dtype.h"

namespace {

const loomDataType_t dk_types[] = {loomInt8,   loomUint8,   loomInt32,   loomUint32,  loomInt64,
                                   loomUint64, loomFloat16, loomFloat32, loomFloat64, loomBfloat16};
const loomRedOp_t all_ops[] = {loomSum, loomProd, loomMax, loomMin, loomAvg};
const loomDataType_t q4_types[] = {loomFloat32, loomBfloat16, loomFloat16};
const size_t sizes[] = {0, 1, 7, 8, 31, 32, 33, 4095, ((size_t)1 << 20) + 5};

uint64_t seed()
{
    static uint64_t s = [] {
        const char *e = std::getenv("LOOM_TEST_SEED");
        uint64_t v = e != nullptr && *e ? std::strtoull(e, nullptr, 0) : 20260126u;
        std::printf("test_dev_kernels_gpu seed %llu (LOOM_TEST_SEED)\n", (unsigned long long)v);
        return v;
    }();
    return s;
}

/* A device allocation with room for an offset; freed at scope end. */
class DevBuf {
  public:
    explicit DevBuf(size_t bytes)
    {
        err_ = cudaMalloc(&p_, bytes + 64);
    }
    ~DevBuf()
    {
        if (p_ != nullptr)
            cudaFree(p_);
    }
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    bool ok() const
    {
        return err_ == cudaSuccess;
    }
    uint8_t *at(size_t off) const
    {
        return (uint8_t *)p_ + off;
    }

  private:
    void *p_ = nullptr;
    cudaError_t err_;
};

class DevKernels : public ::testing::Test {
  protected:
    void SetUp() override
    {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess)
            GTEST_SKIP() << "no usable CUDA device: cudaGetDeviceCount: " << cudaGetErrorString(e)
                         << " (error " << (int)e << ")";
        if (n == 0)
            GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount gives 0)";
        ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    }
    void TearDown() override
    {
        if (stream_ != nullptr)
            cudaStreamDestroy(stream_);
    }
    /* Runs a launcher's result to completion: launched, then no error. */
    void sync(int rc, const std::string &what)
    {
        ASSERT_EQ(rc, 0) << what << ": launch " << cudaGetErrorString((cudaError_t)rc);
        cudaError_t e = cudaStreamSynchronize(stream_);
        ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
    }
    cudaStream_t stream_ = nullptr;
};

void up(uint8_t *d, const std::vector<uint8_t> &h)
{
    ASSERT_EQ(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
}

std::vector<uint8_t> down(const uint8_t *d, size_t bytes)
{
    std::vector<uint8_t> h(bytes);
    EXPECT_EQ(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

bool is_nan_bits(loomDataType_t dt, uint64_t b)
{
    switch (dt) {
    case loomFloat16:
        return (b & 0x7fff) > 0x7c00;
    case loomBfloat16:
        return (b & 0x7fff) > 0x7f80;
    case loomFloat32:
        return (b & 0x7fffffffu) > 0x7f800000u;
    case loomFloat64:
        return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    default:
        return false;
    }
}

uint64_t bits_at(const uint8_t *p, size_t sz, size_t i)
{
    uint64_t v = 0;
    std::memcpy(&v, p + i * sz, sz);
    return v;
}

/* n elements of dt: mostly ordinary values, with specials (zeros, -0,
 * subnormals, infinities, NaNs, the largest values) and raw patterns. */
std::vector<uint8_t> gen_values(loomDataType_t dt, size_t n, std::mt19937_64 &rng)
{
    const size_t sz = loom_dtype_size(dt);
    std::vector<uint8_t> v(n * sz);
    static const uint32_t f32s[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                    0x7fa00001, 0x00000001, 0x807fffff, 0x7f7fffff, 0xff7fffff};
    static const uint16_t bf16s[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0,
                                     0x7f81, 0x0001, 0x7f7f, 0xff7f, 0x807f};
    static const uint16_t f16s[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00,
                                    0x7c01, 0x0001, 0x7bff, 0xfbff, 0x83ff};
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = rng();
        const float f = (float)((int64_t)(r >> 40) - (1 << 23)) * 0x1p-21f;
        uint64_t b = rng();
        const bool special = r % 32 == 0, raw = r % 32 == 1;
        switch (dt) {
        case loomFloat32:
            b = special ? f32s[(r >> 8) % 10] : raw ? (uint32_t)b : loom_de_f32_bits(f);
            break;
        case loomBfloat16:
            b = special ? bf16s[(r >> 8) % 10] : raw ? (uint16_t)b : loom_de_bf16_encode(f);
            break;
        case loomFloat16:
            b = special ? f16s[(r >> 8) % 10] : raw ? (uint16_t)b : loom_de_f16_encode(f);
            break;
        case loomFloat64: {
            double d = special ? (r & 256 ? -0.0 : 1e308) : (double)f;
            if (!raw)
                std::memcpy(&b, &d, 8);
            break;
        }
        default:
            break;
        }
        std::memcpy(v.data() + i * sz, &b, sz);
    }
    return v;
}

/* First element of got that differs from want, -1 if none; two NaNs are
 * equal where NaNs of two sources may have met in a sum or product. */
long first_diff(loomDataType_t dt, loomRedOp_t op, const std::vector<uint8_t> &want,
                const std::vector<uint8_t> &got, const std::vector<std::vector<uint8_t>> &srcs,
                size_t n)
{
    const size_t sz = loom_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        uint64_t a = bits_at(want.data(), sz, i), b = bits_at(got.data(), sz, i);
        if (a == b)
            continue;
        if (is_nan_bits(dt, a) && is_nan_bits(dt, b) && op != loomMax && op != loomMin) {
            int nans = 0;
            for (const auto &s : srcs)
                nans += is_nan_bits(dt, bits_at(s.data(), sz, i));
            if (nans >= 2 || (nans == 1 && srcs.size() > 2))
                continue;
        }
        return (long)i;
    }
    return -1;
}

std::string what(loomDataType_t dt, loomRedOp_t op, int nsrc, size_t n, size_t off, int mode)
{
    static const char *const modes[] = {"aligned", "co-offset", "apart", "in place"};
    return std::string(loom_dtype_name(dt)) + " " + loom_redop_name(op) + " nsrc " +
           std::to_string(nsrc) + " n " + std::to_string(n) + " offset " + std::to_string(off) +
           " " + modes[mode] + " seed " + std::to_string(seed());
}

} // namespace

/* Bad arguments are refused before anything touches a device. */
TEST(DevKernelsArgs, RefusedWithoutLaunching)
{
    const void *srcs[LOOM_DK_MAX_SRCS + 1] = {};
    float x;
    EXPECT_EQ(loom_dk_reduce(nullptr, loomFloat8e4m3, loomSum, &x, srcs, 2, 4, 2), -1);
    EXPECT_EQ(loom_dk_reduce(nullptr, loomFloat32, (loomRedOp_t)7, &x, srcs, 2, 4, 2), -1);
    EXPECT_EQ(loom_dk_reduce(nullptr, loomFloat32, loomSum, &x, srcs, 0, 4, 2), -1);
    EXPECT_EQ(loom_dk_reduce(nullptr, loomFloat32, loomSum, &x, srcs, LOOM_DK_MAX_SRCS + 1, 4, 2),
              -1);
    EXPECT_EQ(loom_dk_reduce(nullptr, loomFloat32, loomSum, &x, srcs, 2, 4, 2), -1); /* NULL src */
    EXPECT_EQ(loom_dk_reduce(nullptr, loomFloat32, loomSum, &x, srcs, 2, 0, 2), 0);  /* nothing */
    EXPECT_EQ(loom_dk_q4_encode(nullptr, &x, loomInt32, nullptr, nullptr, 1, (uint8_t *)&x), -1);
    EXPECT_EQ(loom_dk_q4_decode(nullptr, (uint8_t *)&x, 1, &x, loomFloat64), -1);
    EXPECT_EQ(loom_dk_q4_decode_acc(nullptr, nullptr, 1, &x), -1);
    EXPECT_EQ(loom_dk_cast(nullptr, &x, loomFloat16, &x, loomFloat32, 1), -1); /* in place, sizes */
    EXPECT_EQ(loom_dk_cast(nullptr, nullptr, loomFloat16, nullptr, loomFloat32, 0), 0);
    EXPECT_EQ(loom_dk_cast(nullptr, &x, loomFloat32, &x, loomInt32, 1), -1);
    EXPECT_EQ(loom_dk_cast(nullptr, &x, loomFloat32, &x, loomFloat32, 0), 0);
}

TEST_F(DevKernels, ReduceMatchesHost)
{
    std::mt19937_64 rng(seed() ^ 0x9e);
    const int counts[] = {1, 2, 3, 5, 8, 9, LOOM_DK_MAX_SRCS};
    /* One allocation, a slot per source and one for dst. */
    const size_t slot = (((size_t)1 << 20) + 5) * 8 + 64;
    DevBuf arena(slot * (LOOM_DK_MAX_SRCS + 1));
    ASSERT_TRUE(arena.ok());
    size_t runs = 0;
    for (loomDataType_t dt : dk_types) {
        const size_t sz = loom_dtype_size(dt);
        /* 2 and 4 bytes where the element allows it, else one element. */
        const size_t offs[] = {sz <= 2 ? 2 : sz, sz <= 4 ? 4 : 2 * sz};
        for (loomRedOp_t op : all_ops)
            for (size_t n : sizes)
                for (int nsrc : counts) {
                    if (n > 4096 && (nsrc != 2 || (op != loomSum && op != loomMax)))
                        continue; /* the long case: a few combinations */
                    for (int mode = 0; mode < 4; mode++) {
                        const size_t off = mode == 0 || mode == 3 ? 0 : offs[(n + nsrc) % 2];
                        std::vector<std::vector<uint8_t>> hs(nsrc);
                        std::vector<const void *> hp(nsrc), dp(nsrc);
                        for (int k = 0; k < nsrc; k++) {
                            hs[k] = gen_values(dt, n, rng);
                            hp[k] = hs[k].data();
                            /* apart: every other source one element further than dst */
                            const size_t o = mode == 2 && k % 2 == 0 ? off + sz : off;
                            dp[k] = arena.at(slot * (k + 1) + o);
                            up(arena.at(slot * (k + 1) + o), hs[k]);
                        }
                        std::vector<uint8_t> want(n * sz);
                        ASSERT_EQ(
                            loom_dk_host_reduce(dt, op, want.data(), hp.data(), nsrc, n, nsrc), 0);
                        uint8_t *dst = mode == 3 ? (uint8_t *)dp[nsrc - 1] : arena.at(off);
                        sync(loom_dk_reduce(stream_, dt, op, dst, dp.data(), nsrc, n, nsrc),
                             what(dt, op, nsrc, n, off, mode));
                        std::vector<uint8_t> got = down(dst, n * sz);
                        long i = first_diff(dt, op, want, got, hs, n);
                        ASSERT_EQ(i, -1) << what(dt, op, nsrc, n, off, mode) << " element " << i
                                         << ": want 0x" << std::hex << bits_at(want.data(), sz, i)
                                         << " got 0x" << bits_at(got.data(), sz, i);
                        runs++;
                    }
                }
    }
    std::printf("reduce: %zu kernel runs bitwise equal to the host twin\n", runs);
}

/* More than 2^31 elements: bfloat16 sum of two sources of 2^31 + 2^20 + 37
 * (12 GiB in all). The sources are constant but for random windows at the
 * start, around 2^31 and at the end; dst starts as NaNs, so an element a
 * 32-bit index never reaches, or one it reaches twice, shows. */
TEST_F(DevKernels, ReduceBeyond2To31)
{
    const size_t n = ((size_t)1 << 31) + (1 << 20) + 37, bytes = n * 2, win = 1 << 16;
    size_t free_b = 0, total_b = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    if (free_b < 3 * bytes + ((size_t)1 << 30))
        GTEST_SKIP() << "needs " << (3 * bytes >> 20) << " MiB of GPU memory, " << (free_b >> 20)
                     << " MiB free";
    std::mt19937_64 rng(seed() ^ 0xb16);
    DevBuf a(bytes), b(bytes), d(bytes);
    ASSERT_TRUE(a.ok() && b.ok() && d.ok());
    ASSERT_EQ(cudaMemset(a.at(0), 0x3f, bytes), cudaSuccess); /* 0x3f3f: 0.746 */
    ASSERT_EQ(cudaMemset(b.at(0), 0x40, bytes), cudaSuccess); /* 0x4040: 3.0 */
    ASSERT_EQ(cudaMemset(d.at(0), 0xff, bytes), cudaSuccess); /* NaN */
    const size_t starts[] = {0, ((size_t)1 << 31) - win / 2, n - win};
    std::vector<std::vector<uint8_t>> wa, wb;
    for (size_t s : starts) {
        wa.push_back(gen_values(loomBfloat16, win, rng));
        wb.push_back(gen_values(loomBfloat16, win, rng));
        up(a.at(2 * s), wa.back());
        up(b.at(2 * s), wb.back());
    }
    const void *srcs[2] = {a.at(0), b.at(0)};
    sync(loom_dk_reduce(stream_, loomBfloat16, loomSum, d.at(0), srcs, 2, n, 2),
         "2^31 + 2^20 + 37");
    std::vector<uint8_t> got = down(d.at(0), bytes);
    uint16_t one = 0, x = 0x3f3f, y = 0x4040;
    const void *hs[2] = {&x, &y};
    ASSERT_EQ(loom_dk_host_reduce(loomBfloat16, loomSum, &one, hs, 2, 1, 2), 0);
    const uint16_t *g = (const uint16_t *)got.data();
    size_t w = 0, bad = 0, first_bad = n;
    for (size_t i = 0; i < n; i++) {
        if (w < 3 && i == starts[w] + win)
            w++;
        if (w < 3 && i >= starts[w])
            continue;
        if (g[i] != one && bad++ == 0)
            first_bad = i;
    }
    EXPECT_EQ(bad, 0u) << "constant part: first wrong element " << first_bad;
    for (int k = 0; k < 3; k++) {
        std::vector<uint8_t> want(2 * win);
        const void *hp[2] = {wa[k].data(), wb[k].data()};
        ASSERT_EQ(loom_dk_host_reduce(loomBfloat16, loomSum, want.data(), hp, 2, win, 2), 0);
        std::vector<uint8_t> part(got.begin() + 2 * starts[k], got.begin() + 2 * (starts[k] + win));
        long i = first_diff(loomBfloat16, loomSum, want, part, {wa[k], wb[k]}, win);
        EXPECT_EQ(i, -1) << "window at " << starts[k] << ", element " << i;
    }
}

TEST_F(DevKernels, CodecMatchesHost)
{
    std::mt19937_64 rng(seed() ^ 0xc0);
    for (loomDataType_t dt : q4_types)
        for (size_t n : sizes)
            for (int mode = 0; mode < 4; mode++) { /* aligned; offsets; residual in place;
                                                    * no residual */
                const size_t sz = loom_dtype_size(dt), qb = loom_de_q4_bytes(n);
                /* offsets: the values by 2 or 4 bytes (4 for float32), the
                 * residuals and outputs by 4 (8), the code bytes by 3 */
                const size_t off = mode != 1 ? 0 : sz == 4 || n % 2 == 0 ? 4 : 2;
                const size_t qoff = mode == 1 ? 3 : 0;
                std::vector<uint8_t> x = gen_values(dt, n, rng);
                /* Zero blocks and a block of the largest bfloat16 values. */
                for (size_t i = 0; i < n && i < 64; i++)
                    std::memset(x.data() + i * sz, 0, sz);
                for (size_t i = 96; i < n && i < 128; i++) {
                    uint32_t big = dt == loomFloat32    ? 0x7f7f0000u
                                   : dt == loomBfloat16 ? 0x7f7f
                                                        : 0x7bff;
                    std::memcpy(x.data() + i * sz, &big, sz);
                }
                std::vector<uint8_t> e = gen_values(loomFloat32, n, rng);
                for (size_t i = 0; i < n; i++) { /* small residuals */
                    float f;
                    std::memcpy(&f, e.data() + 4 * i, 4);
                    f = f == f ? f * 0x1p-8f : f;
                    std::memcpy(e.data() + 4 * i, &f, 4);
                }
                const bool with_e = mode != 3, in_place = mode == 2;
                std::vector<uint8_t> wq(qb), we = e;
                std::vector<float> werr(n);
                ASSERT_EQ(loom_dk_host_q4_encode(x.data(), dt,
                                                 with_e ? (const float *)e.data() : nullptr,
                                                 with_e ? werr.data() : nullptr, n, wq.data()),
                          0);
                DevBuf dx(n * sz), dq(qb), de(n * 4), dr(n * 4);
                ASSERT_TRUE(dx.ok() && dq.ok() && de.ok() && dr.ok());
                up(dx.at(off), x);
                up(de.at(off * 2), e);
                float *ein = with_e ? (float *)de.at(off * 2) : nullptr;
                float *eout = !with_e ? nullptr : in_place ? ein : (float *)dr.at(off * 2);
                std::string ctx = std::string(loom_dtype_name(dt)) + " n " + std::to_string(n) +
                                  " mode " + std::to_string(mode) + " seed " +
                                  std::to_string(seed());
                sync(loom_dk_q4_encode(stream_, dx.at(off), dt, ein, eout, n, dq.at(qoff)),
                     "encode " + ctx);
                std::vector<uint8_t> gq = down(dq.at(qoff), qb);
                ASSERT_EQ(std::memcmp(gq.data(), wq.data(), qb), 0) << "encoded bytes, " << ctx;
                if (with_e) {
                    std::vector<uint8_t> gr = down((uint8_t *)eout, n * 4);
                    for (size_t i = 0; i < n; i++) {
                        float g;
                        std::memcpy(&g, gr.data() + 4 * i, 4);
                        bool nan_pair = g != g && werr[i] != werr[i];
                        ASSERT_TRUE(loom_de_f32_bits(g) == loom_de_f32_bits(werr[i]) || nan_pair)
                            << "residual " << i << ", " << ctx;
                    }
                }
                /* Decode that stream to every type, and into an accumulator. */
                for (loomDataType_t odt : q4_types) {
                    const size_t osz = loom_dtype_size(odt);
                    std::vector<uint8_t> wd(n * osz);
                    ASSERT_EQ(loom_dk_host_q4_decode(wq.data(), n, wd.data(), odt), 0);
                    DevBuf dd(n * osz);
                    ASSERT_TRUE(dd.ok());
                    sync(loom_dk_q4_decode(stream_, dq.at(qoff), n, dd.at(off * 2), odt),
                         "decode " + ctx);
                    ASSERT_EQ(down(dd.at(off * 2), n * osz), wd)
                        << "decoded to " << loom_dtype_name(odt) << ", " << ctx;
                }
                std::vector<uint8_t> acc = gen_values(loomFloat32, n, rng), wacc = acc;
                ASSERT_EQ(loom_dk_host_q4_decode_acc(wq.data(), n, (float *)wacc.data()), 0);
                DevBuf da(n * 4);
                ASSERT_TRUE(da.ok());
                up(da.at(off * 2), acc);
                sync(loom_dk_q4_decode_acc(stream_, dq.at(qoff), n, (float *)da.at(off * 2)),
                     "decode_acc " + ctx);
                std::vector<uint8_t> gacc = down(da.at(off * 2), n * 4);
                for (size_t i = 0; i < n; i++) {
                    float g, w, a;
                    std::memcpy(&g, gacc.data() + 4 * i, 4);
                    std::memcpy(&w, wacc.data() + 4 * i, 4);
                    std::memcpy(&a, acc.data() + 4 * i, 4);
                    ASSERT_TRUE(loom_de_f32_bits(g) == loom_de_f32_bits(w) ||
                                (g != g && w != w && a != a))
                        << "decode_acc " << i << ", " << ctx;
                }
            }
}

TEST_F(DevKernels, CastMatchesHost)
{
    std::mt19937_64 rng(seed() ^ 0xca5);
    for (loomDataType_t sdt : dk_types)
        for (loomDataType_t ddt : dk_types) {
            auto fp = [](loomDataType_t t) {
                return t == loomFloat32 || t == loomFloat16 || t == loomBfloat16;
            };
            if (sdt != ddt && !(fp(sdt) && fp(ddt)))
                continue; /* conversions: float32, float16, bfloat16 only */
            const size_t ssz = loom_dtype_size(sdt), dsz = loom_dtype_size(ddt);
            for (size_t n : sizes)
                for (int mode = 0; mode < 4; mode++) { /* aligned, co-offset, apart, in place */
                    if (mode == 3 && ssz != dsz)
                        continue;
                    std::vector<uint8_t> x = gen_values(sdt, n, rng), want(n * dsz);
                    ASSERT_EQ(loom_dk_host_cast(want.data(), ddt, x.data(), sdt, n), 0);
                    const size_t so = mode == 1 ? (ssz <= 4 ? 4 : 8) : mode == 2 ? 2 * ssz : 0;
                    const size_t doff = mode == 1 ? so * dsz / ssz : mode == 2 ? dsz : 0;
                    DevBuf ds(n * ssz), dd(n * dsz);
                    ASSERT_TRUE(ds.ok() && dd.ok());
                    up(ds.at(so), x);
                    uint8_t *dst = mode == 3 ? ds.at(so) : dd.at(doff);
                    std::string ctx = std::string(loom_dtype_name(sdt)) + " -> " +
                                      loom_dtype_name(ddt) + " n " + std::to_string(n) + " mode " +
                                      std::to_string(mode);
                    sync(loom_dk_cast(stream_, dst, ddt, ds.at(so), sdt, n), ctx);
                    ASSERT_EQ(down(dst, n * dsz), want) << ctx;
                }
        }
}

TEST_F(DevKernels, Preload)
{
    sync(loom_dk_preload(stream_), "preload");
}
