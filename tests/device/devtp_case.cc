// SPDX-License-Identifier: Apache-2.0
//
// devtp_case.cc - the shared parts of the device transport tests (devtp_case.h).

#include "devtp_case.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "coll_kind.h"
#include "dtype.h"
#include "mp_fixture.h"

namespace devtest {

void *Pool::Get(int which, bool host_mem, size_t want)
{
    void *&p = mem[host_mem][which];
    size_t &have = bytes[host_mem][which];
    if (want < (size_t{1} << 20))
        want = size_t{1} << 20;
    if (p != nullptr && have >= want)
        return p;
    if (p != nullptr) {
        if (host_mem)
            std::free(p);
        else
            XT_CHECK_LOOM(rt->mem_free(p));
    }
    p = nullptr;
    if (host_mem)
        p = std::malloc(want);
    else
        XT_CHECK_LOOM(rt->mem_alloc(&p, want));
    XT_CHECK(p != nullptr);
    have = want;
    return p;
}

void Pool::Free()
{
    for (int h = 0; h < 2; h++)
        for (int w = 0; w < 2; w++) {
            if (mem[h][w] != nullptr) {
                if (h)
                    std::free(mem[h][w]);
                else
                    XT_CHECK_LOOM(rt->mem_free(mem[h][w]));
            }
            mem[h][w] = nullptr;
            bytes[h][w] = 0;
        }
}

void FillComm(Rank &r, loomComm_t comm, int rank, int nranks)
{
    r.dc = loom_dev_comm_t{};
    r.dc.comm = comm;
    r.dc.rt = Runtime();
    r.dc.rank = rank;
    r.dc.nranks = nranks;
    r.dc.local_rank = rank;
    r.dc.local_size = nranks;
    r.dc.all_local = 1;
    r.dc.device = 0;
    r.dc.timeout_ms = 20000;
    r.dc.abort_flag = &r.abort_flag;
    r.pool.rt = r.dc.rt;
}

const loom_devrt_t *Runtime()
{
    return loom_devrt();
}

void RunThreads(int nranks, const std::function<void(int, int, loomComm_t)> &body)
{
    loomUniqueId id;
    XT_CHECK_LOOM(loomGetUniqueId(&id));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < nranks; rank++)
        threads.emplace_back([&, rank] {
            loomComm_t comm = nullptr;
            XT_CHECK_LOOM(loomCommInitRank(&comm, nranks, id, rank));
            body(rank, nranks, comm);
            XT_CHECK_LOOM(loomCommDestroy(comm));
        });
    for (auto &t : threads)
        t.join();
}

bool StreamWait(const loom_devrt_t *rt, loom_dev_stream_t s, double timeout_s)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
        loomResult_t q = rt->stream_query(s);
        if (q == loomSuccess)
            return true;
        if (q != loomInProgress || std::chrono::steady_clock::now() > end)
            return false;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

std::string Case::Name() const
{
    std::string s = std::string(loomtest::CollName(coll)) + " " + loom_dtype_name(dt);
    if (loomtest::Reducing(coll))
        s += std::string(" ") + loom_redop_name(op);
    s += " count " + std::to_string(count) + (inplace ? " in-place" : "");
    if (loomtest::Rooted(coll))
        s += " root " + std::to_string(root);
    s += host_send ? " host-send" : "";
    s += host_recv ? " host-recv" : "";
    return s;
}

std::vector<Case> Grid(int nranks, const std::vector<size_t> &counts)
{
    static const loomDataType_t types[] = {loomFloat32, loomFloat16, loomBfloat16, loomInt32};
    std::vector<Case> cases;
    uint64_t k = 0;
    for (int ci = 0; ci < loomNumCollectives; ci++) {
        auto coll = static_cast<loomCollective_t>(ci);
        int nops = loomtest::Reducing(coll) ? loomNumOps : 1;
        for (loomDataType_t dt : types)
            for (int op = 0; op < nops; op++)
                for (size_t count : counts)
                    for (int inplace = 0; inplace < (coll == loomCollAllToAll ? 1 : 2); inplace++) {
                        Case c{};
                        c.coll = coll;
                        c.dt = dt;
                        c.op = static_cast<loomRedOp_t>(op);
                        c.count = count;
                        c.inplace = inplace != 0;
                        c.root = loomtest::Rooted(coll) ? static_cast<int>(k % nranks) : 0;
                        c.host_send = k % 3 == 1;
                        c.host_recv = c.inplace ? c.host_send : k % 3 == 2;
                        c.seed = k * 7919 + 17;
                        k++;
                        cases.push_back(c);
                    }
    }
    return cases;
}

size_t SendElems(loomCollective_t coll, size_t count, int nranks)
{
    return coll == loomCollReduceScatter || coll == loomCollAllToAll ? count * nranks : count;
}

size_t RecvElems(loomCollective_t coll, size_t count, int nranks)
{
    return coll == loomCollAllGather || coll == loomCollAllToAll ? count * nranks : count;
}

loom_coll_kind_t Kind(loomCollective_t coll)
{
    switch (coll) {
    case loomCollAllReduce:
        return LOOM_COLL_ALLREDUCE;
    case loomCollAllGather:
        return LOOM_COLL_ALLGATHER;
    case loomCollReduceScatter:
        return LOOM_COLL_REDUCE_SCATTER;
    case loomCollBroadcast:
        return LOOM_COLL_BCAST;
    case loomCollReduce:
        return LOOM_COLL_REDUCE;
    default:
        return LOOM_COLL_ALLTOALL;
    }
}

static uint64_t Mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

std::vector<uint8_t> Input(const Case &c, int rank, size_t elems)
{
    size_t es = loom_dtype_size(c.dt);
    std::vector<uint8_t> v(elems * es);
    for (size_t i = 0; i < elems; i++) {
        uint64_t h = Mix(c.seed * 1000003u + static_cast<uint64_t>(rank) * 7777777u + i);
        // Values around 1 with 24 random bits: sums round in every float type.
        float f = (static_cast<float>(h & 0xffffff) / 8388608.0f - 1.0f) * 2.0f;
        uint8_t *p = &v[i * es];
        switch (c.dt) {
        case loomFloat32:
            std::memcpy(p, &f, 4);
            break;
        case loomFloat16: {
            uint16_t b = loom_f32_to_f16(f);
            std::memcpy(p, &b, 2);
            break;
        }
        case loomBfloat16: {
            uint16_t b = loom_f32_to_bf16(f);
            std::memcpy(p, &b, 2);
            break;
        }
        default: { // int32: small, so that a product of 32 ranks' values stays in range
            int32_t n = static_cast<int32_t>(h % 5) - 2;
            std::memcpy(p, &n, 4);
            break;
        }
        }
    }
    return v;
}

Buffers::~Buffers()
{
    for (void *p : dev)
        rt->mem_free(p);
    for (void *p : host)
        std::free(p);
}

void *Buffers::Alloc(size_t bytes, bool host_mem)
{
    if (bytes == 0)
        bytes = 64; // a valid pointer even for an empty call
    void *p = nullptr;
    if (host_mem) {
        p = std::malloc(bytes);
        XT_CHECK(p != nullptr);
        host.push_back(p);
    } else {
        XT_CHECK_LOOM(rt->mem_alloc(&p, bytes));
        dev.push_back(p);
    }
    return p;
}

void ToBuffer(const loom_devrt_t *rt, loom_dev_stream_t s, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return;
    XT_CHECK_LOOM(rt->memcpy_async(dst, src, bytes, s));
    XT_CHECK(StreamWait(rt, s, 30));
}

void FromBuffer(const loom_devrt_t *rt, loom_dev_stream_t s, void *dst, const void *src,
                size_t bytes)
{
    ToBuffer(rt, s, dst, src, bytes);
}

// loom's host collective: the reference.
static void HostCall(loomComm_t comm, const Case &c, const void *send, void *recv)
{
    switch (c.coll) {
    case loomCollAllReduce:
        XT_CHECK_LOOM(loomAllReduce(send, recv, c.count, c.dt, c.op, comm, nullptr));
        break;
    case loomCollAllGather:
        XT_CHECK_LOOM(loomAllGather(send, recv, c.count, c.dt, comm, nullptr));
        break;
    case loomCollReduceScatter:
        XT_CHECK_LOOM(loomReduceScatter(send, recv, c.count, c.dt, c.op, comm, nullptr));
        break;
    case loomCollBroadcast:
        XT_CHECK_LOOM(loomBroadcast(send, recv, c.count, c.dt, c.root, comm, nullptr));
        break;
    case loomCollReduce:
        XT_CHECK_LOOM(loomReduce(send, recv, c.count, c.dt, c.op, c.root, comm, nullptr));
        break;
    default:
        XT_CHECK_LOOM(loomAllToAll(send, recv, c.count, c.dt, comm, nullptr));
        break;
    }
}

static std::string FirstDiff(const std::vector<uint8_t> &got, const std::vector<uint8_t> &want,
                             size_t es)
{
    for (size_t i = 0; i < got.size(); i++)
        if (got[i] != want[i]) {
            char buf[128];
            std::snprintf(buf, sizeof(buf), "first difference at element %zu of %zu", i / es,
                          got.size() / es);
            return buf;
        }
    return "";
}

void CheckCase(const loom_devtp_t *tp, Rank &r, loomComm_t comm, const Case &c)
{
    const loom_devrt_t *rt = r.dc.rt;
    const int n = r.dc.nranks, me = r.dc.rank;
    const size_t es = loom_dtype_size(c.dt);
    const size_t se = SendElems(c.coll, c.count, n), re = RecvElems(c.coll, c.count, n);
    loomtest::SetContext(std::string(tp->name) + ": " + c.Name());
    std::vector<uint8_t> in = Input(c, me, se);
    const bool root = me == c.root;
    void *send = nullptr, *recv = nullptr;
    if (c.inplace) {
        size_t elems = se > re ? se : re;
        char *buf = static_cast<char *>(r.pool.Get(0, c.host_send, elems * es));
        send = recv = buf;
        if (c.coll == loomCollAllGather)
            send = buf + static_cast<size_t>(me) * c.count * es;
        if (c.coll == loomCollReduceScatter)
            recv = buf + static_cast<size_t>(me) * c.count * es;
    } else {
        if (c.coll != loomCollBroadcast || root)
            send = r.pool.Get(0, c.host_send, se * es);
        if (c.coll != loomCollReduce || root)
            recv = r.pool.Get(1, c.host_recv, re * es);
        if (recv != nullptr) {
            std::vector<uint8_t> junk(re * es, 0xa5);
            ToBuffer(rt, r.s, recv, junk.data(), junk.size());
        }
    }
    if (send != nullptr)
        ToBuffer(rt, r.s, send, in.data(), in.size());

    std::vector<uint8_t> want(re * es + 1, 0);
    HostCall(comm, c, in.data(), want.data());
    want.resize(re * es);

    loom_coll_args_t a{};
    a.kind = Kind(c.coll);
    a.sendbuff = send;
    a.recvbuff = recv;
    a.count = c.count;
    a.dt = c.dt;
    a.op = c.op;
    a.root = c.root;
    XT_CHECK_MSG(tp->handles(&r.dc, r.state, &a), "the transport does not take the case");
    loomResult_t res = tp->run(&r.dc, r.state, &a, r.s);
    XT_CHECK_MSG(res == loomSuccess, loomGetLastError(nullptr));
    XT_CHECK_MSG(StreamWait(rt, r.s, 60), "the stream did not finish within 60 s");
    if (c.coll != loomCollReduce || root) {
        std::vector<uint8_t> got(re * es);
        FromBuffer(rt, r.s, got.data(), recv, got.size());
        XT_CHECK_MSG(got == want, FirstDiff(got, want, es));
    }
    if (!c.inplace && send != nullptr) {
        std::vector<uint8_t> after(in.size());
        FromBuffer(rt, r.s, after.data(), send, after.size());
        XT_CHECK_MSG(after == in, "the send buffer changed");
    }
}

} // namespace devtest
