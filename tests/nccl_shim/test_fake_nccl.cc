/* SPDX-License-Identifier: Apache-2.0
 *
 * test_fake_nccl.cc - the stand-in for the real NCCL (fake_nccl.c) on its own, loaded with
 * dlopen and called through its pnccl names as the drop-in library calls it: version, ids that
 * leave bytes 64 to 127 to the caller, every collective (Gather and Scatter too) and Send/Recv
 * in a group on 3 ranks with exact results, the call counters the route-mode tests rely on, and
 * its errors.
 */
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h> /* outside extern "C": it includes CUDA's C++ headers */

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mp_fixture.h"

namespace {

struct Fake {
    void *lib = nullptr;
    ncclResult_t (*GetVersion)(int *);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*CommCount)(const ncclComm_t, int *);
    ncclResult_t (*CommUserRank)(const ncclComm_t, int *);
    ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*CommFinalize)(ncclComm_t);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*GroupStart)();
    ncclResult_t (*GroupEnd)();
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                  ncclComm_t, cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*Bcast)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
                           ncclComm_t, cudaStream_t);
    ncclResult_t (*AlltoAll)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                             cudaStream_t);
    ncclResult_t (*Gather)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                           cudaStream_t);
    ncclResult_t (*Scatter)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*MemAlloc)(void **, size_t);
    ncclResult_t (*MemFree)(void *);
    const char *(*GetLastError)(ncclComm_t);
    const char *(*GetErrorString)(ncclResult_t);
    long (*CallCount)(const char *);
    void (*ResetCallCounts)();
};

template <typename F> void Sym(void *lib, const char *name, F *fn)
{
    *fn = reinterpret_cast<F>(dlsym(lib, name));
    XT_CHECK_MSG(*fn != nullptr, std::string("missing ") + name);
}

Fake Open()
{
    const char *path = getenv("LOOM_FAKE_NCCL");
    XT_CHECK_MSG(path != nullptr, "LOOM_FAKE_NCCL is not set");
    Fake f;
    /* RTLD_LOCAL, as the drop-in library opens the real NCCL */
    f.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    XT_CHECK_MSG(f.lib != nullptr, dlerror());
#define S(name) Sym(f.lib, "pnccl" #name, &f.name)
    S(GetVersion);
    S(GetUniqueId);
    S(CommInitRank);
    S(CommInitRankConfig);
    S(CommCount);
    S(CommUserRank);
    S(CommSplit);
    S(CommGetAsyncError);
    S(CommFinalize);
    S(CommDestroy);
    S(GroupStart);
    S(GroupEnd);
    S(AllReduce);
    S(AllGather);
    S(ReduceScatter);
    S(Broadcast);
    S(Bcast);
    S(Reduce);
    S(AlltoAll);
    S(Gather);
    S(Scatter);
    S(Send);
    S(Recv);
    S(MemAlloc);
    S(MemFree);
    S(GetLastError);
    S(GetErrorString);
#undef S
    Sym(f.lib, "fakeNcclCallCount", &f.CallCount);
    Sym(f.lib, "fakeNcclResetCallCounts", &f.ResetCallCounts);
    return f;
}

#define XT_CHECK_NCCL(call)                                                                        \
    do {                                                                                           \
        const ncclResult_t xt_n_ = (call);                                                         \
        XT_CHECK_MSG(xt_n_ == ncclSuccess, std::string(#call " returned ") +                       \
                                               std::to_string(xt_n_) + ": " +                      \
                                               f.GetLastError(nullptr));                           \
    } while (0)

TEST(FakeNccl, CollectivesCountersAndErrors)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int nranks, loomComm_t) {
            Fake f = Open();
            int version = 0;
            XT_CHECK_NCCL(f.GetVersion(&version));
            XT_CHECK_EQ(version, 22809);
            /* the nccl names are the same functions */
            XT_CHECK(dlsym(f.lib, "ncclAllReduce") == reinterpret_cast<void *>(f.AllReduce));

            ncclUniqueId id;
            memset(&id, 0, sizeof(id));
            if (rank == 0) {
                XT_CHECK_NCCL(f.GetUniqueId(&id));
                for (int i = 64; i < NCCL_UNIQUE_ID_BYTES; i++)
                    XT_CHECK_EQ(id.internal[i], 0);
            }
            loomtest::ShareFromRank0(&id, sizeof(id));
            /* the drop-in library writes its own id into bytes 64..127: the fake ignores them */
            memset(id.internal + 64, 0x5a, 64);
            ncclComm_t comm = nullptr;
            ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
            cfg.commName = "fake-test";
            XT_CHECK_NCCL(f.CommInitRankConfig(&comm, nranks, id, rank, &cfg));
            int n = 0, r = -1;
            XT_CHECK_NCCL(f.CommCount(comm, &n));
            XT_CHECK_NCCL(f.CommUserRank(comm, &r));
            XT_CHECK_EQ(n, nranks);
            XT_CHECK_EQ(r, rank);
            f.ResetCallCounts();

            const size_t count = 1000;
            std::vector<float> in(count * nranks), out(count * nranks);
            for (size_t i = 0; i < in.size(); i++)
                in[i] = static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 997));
            auto val = [](int rk, size_t i) {
                return static_cast<float>((rk + 1) * 1000 + static_cast<int>(i % 997));
            };

            XT_CHECK_NCCL(
                f.AllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, comm, nullptr));
            for (size_t i = 0; i < count; i++) {
                float s = 0;
                for (int k = 0; k < nranks; k++)
                    s += val(k, i);
                XT_CHECK_EQ(out[i], s);
            }
            XT_CHECK_NCCL(f.AllGather(in.data(), out.data(), count, ncclFloat32, comm, nullptr));
            for (int k = 0; k < nranks; k++)
                for (size_t i = 0; i < count; i++)
                    XT_CHECK_EQ(out[k * count + i], val(k, i));
            XT_CHECK_NCCL(
                f.ReduceScatter(in.data(), out.data(), count, ncclFloat32, ncclMax, comm, nullptr));
            for (size_t i = 0; i < count; i++)
                XT_CHECK_EQ(out[i], val(nranks - 1, rank * count + i));
            XT_CHECK_NCCL(f.Broadcast(in.data(), out.data(), count, ncclFloat32, 1, comm, nullptr));
            for (size_t i = 0; i < count; i++)
                XT_CHECK_EQ(out[i], val(1, i));
            std::vector<float> b(in.begin(), in.begin() + count);
            XT_CHECK_NCCL(f.Bcast(b.data(), count, ncclFloat32, 2, comm, nullptr));
            for (size_t i = 0; i < count; i++)
                XT_CHECK_EQ(b[i], val(2, i));
            XT_CHECK_NCCL(
                f.Reduce(in.data(), out.data(), count, ncclFloat32, ncclMin, 0, comm, nullptr));
            if (rank == 0)
                for (size_t i = 0; i < count; i++)
                    XT_CHECK_EQ(out[i], val(0, i));
            XT_CHECK_NCCL(f.AlltoAll(in.data(), out.data(), count, ncclFloat32, comm, nullptr));
            for (int k = 0; k < nranks; k++)
                for (size_t i = 0; i < count; i++)
                    XT_CHECK_EQ(out[k * count + i], val(k, rank * count + i));

            /* Gather to rank 1, Scatter from rank 2 (in place there) */
            XT_CHECK_NCCL(f.Gather(in.data(), out.data(), count, ncclFloat32, 1, comm, nullptr));
            if (rank == 1)
                for (int k = 0; k < nranks; k++)
                    for (size_t i = 0; i < count; i++)
                        XT_CHECK_EQ(out[k * count + i], val(k, i));
            std::vector<float> sc(in);
            float *mine = rank == 2 ? sc.data() + 2 * count : out.data();
            XT_CHECK_NCCL(f.Scatter(sc.data(), mine, count, ncclFloat32, 2, comm, nullptr));
            for (size_t i = 0; i < count; i++)
                XT_CHECK_EQ(mine[i], val(2, rank * count + i));
            XT_CHECK_EQ(f.Scatter(sc.data(), out.data(), count, ncclFloat32, 3, comm, nullptr),
                        ncclInvalidArgument);
            XT_CHECK_MSG(strstr(f.GetLastError(nullptr), "root 3 is not valid"),
                         f.GetLastError(nullptr));

            /* a ring of Send/Recv and an AllReduce in one group */
            std::vector<float> from_left(count), sum(count);
            XT_CHECK_NCCL(f.GroupStart());
            XT_CHECK_NCCL(
                f.Send(in.data(), count, ncclFloat32, (rank + 1) % nranks, comm, nullptr));
            XT_CHECK_NCCL(f.Recv(from_left.data(), count, ncclFloat32, (rank + nranks - 1) % nranks,
                                 comm, nullptr));
            XT_CHECK_NCCL(
                f.AllReduce(in.data(), sum.data(), count, ncclFloat32, ncclSum, comm, nullptr));
            XT_CHECK_NCCL(f.GroupEnd());
            for (size_t i = 0; i < count; i++) {
                XT_CHECK_EQ(from_left[i], val((rank + nranks - 1) % nranks, i));
                XT_CHECK_EQ(sum[i], val(0, i) + val(1, i) + val(2, i));
            }

            XT_CHECK_EQ(f.CallCount("AllReduce"), 2);
            XT_CHECK_EQ(f.CallCount("ncclAllReduce"), 2);
            XT_CHECK_EQ(f.CallCount("pncclAllReduce"), 2);
            for (const char *one : {"AllGather", "ReduceScatter", "Broadcast", "Bcast", "Reduce",
                                    "AlltoAll", "Gather", "Send", "Recv", "GroupStart", "GroupEnd"})
                XT_CHECK_MSG(f.CallCount(one) == 1, one);
            XT_CHECK_EQ(f.CallCount("Scatter"), 2);
            XT_CHECK_EQ(f.CallCount("CommInitRank"), 0);
            XT_CHECK_EQ(f.CallCount("NoSuchFunction"), -1);
            XT_CHECK_EQ(f.CallCount(nullptr), -1);

            /* errors: a handle that is not the fake's, an op it does not have */
            int not_a_comm[8] = {0};
            ncclComm_t bogus = reinterpret_cast<ncclComm_t>(not_a_comm);
            XT_CHECK_EQ(
                f.AllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, bogus, nullptr),
                ncclInvalidArgument);
            XT_CHECK_MSG(strstr(f.GetLastError(nullptr), "not a communicator of this library"),
                         f.GetLastError(nullptr));
            XT_CHECK_EQ(
                f.AllReduce(in.data(), out.data(), count, ncclFloat32, ncclNumOps, comm, nullptr),
                ncclInvalidArgument);
            XT_CHECK_MSG(strstr(f.GetLastError(nullptr), "op 5 is not supported"),
                         f.GetLastError(nullptr));
            XT_CHECK_EQ(
                f.AllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, nullptr, nullptr),
                ncclInvalidArgument);
            XT_CHECK_EQ(f.CallCount("AllReduce"), 5);
            XT_CHECK(strstr(f.GetErrorString(ncclInvalidArgument), "fake NCCL") != nullptr);

            ncclComm_t none = comm;
            XT_CHECK_NCCL(f.CommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr));
            XT_CHECK(none == nullptr);
            ncclResult_t async = ncclInternalError;
            XT_CHECK_NCCL(f.CommGetAsyncError(comm, &async));
            XT_CHECK_EQ(async, ncclSuccess);
            void *mem = nullptr;
            XT_CHECK_NCCL(f.MemAlloc(&mem, 1 << 20));
            memset(mem, 1, 1 << 20);
            XT_CHECK_NCCL(f.MemFree(mem));
            XT_CHECK_NCCL(f.CommFinalize(comm));
            XT_CHECK_NCCL(f.CommDestroy(comm));
            dlclose(f.lib);
        },
        opts));
}

} // namespace
