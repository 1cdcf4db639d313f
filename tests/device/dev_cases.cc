// SPDX-License-Identifier: Apache-2.0
//
// dev_cases.cc - the device suite's cases and the check that runs each on host buffers and on
// device buffers (dev_cases.h).

#include "dev_cases.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "loom_echo.h"
#include "verify.h"

namespace devtest {

loomtest::RunOptions Options(const std::string &transports, double deadline_s)
{
    loomtest::RunOptions o;
    o.env.push_back({"LOOM_DEVICE", "emulated"});
    if (!transports.empty())
        o.env.push_back({"LOOM_DEVICE_TRANSPORTS", transports});
    o.deadline_s = deadline_s;
    return o;
}

DevBuf::DevBuf(size_t n) : n_(n)
{
    XT_CHECK_LOOM(loomMemAlloc(&p_, n));
    XT_CHECK(n == 0 || Rt()->ptr_device(p_) >= 0);
}

DevBuf::~DevBuf()
{
    if (loomMemFree(p_) != loomSuccess)
        loomtest::Fail(__FILE__, __LINE__, "loomMemFree failed");
}

const loom_devrt_t *Rt()
{
    const loom_devrt_t *rt = loom_devrt();
    XT_CHECK_MSG(rt != nullptr && strcmp(rt->name, "emulated") == 0,
                 "the device suite runs under LOOM_DEVICE=emulated");
    return rt;
}

const char *StreamName(StreamKind k)
{
    switch (k) {
    case StreamKind::Null:
        return "NULL stream";
    case StreamKind::Worker:
        return "worker stream";
    case StreamKind::WrapDefault:
        return "wrapped default stream";
    case StreamKind::WrapCreated:
        return "wrapped created stream";
    }
    return "?";
}

Stream::Stream(StreamKind k) : k_(k)
{
    switch (k) {
    case StreamKind::Null:
        break;
    case StreamKind::Worker:
        XT_CHECK_LOOM(loomStreamCreate(&s_));
        break;
    case StreamKind::WrapDefault:
        XT_CHECK_LOOM(loomStreamCreateFromCuda(&s_, nullptr));
        break;
    case StreamKind::WrapCreated:
        XT_CHECK_LOOM(Rt()->stream_create(&ds_));
        XT_CHECK_LOOM(loomStreamCreateFromCuda(&s_, ds_));
        break;
    }
}

Stream::~Stream()
{
    if (s_ != nullptr && loomStreamDestroy(s_) != loomSuccess)
        loomtest::Fail(__FILE__, __LINE__,
                       std::string("loomStreamDestroy: ") + loomGetLastError(nullptr));
    if (ds_ != nullptr && Rt()->stream_destroy(ds_) != loomSuccess)
        loomtest::Fail(__FILE__, __LINE__, "stream_destroy of the emulation failed");
}

void Stream::Sync()
{
    if (s_ != nullptr)
        XT_CHECK_LOOM(loomStreamSynchronize(s_));
}

bool LastErrorHas(const char *what)
{
    return strstr(loomGetLastError(nullptr), what) != nullptr;
}

// ---- cases --------------------------------------------------------------------------------------

namespace {

const char *CollName(Coll c)
{
    static const char *const names[] = {
        "AllReduce", "AllGather",  "ReduceScatter",  "Broadcast", "Reduce",  "AllToAll",
        "AllToAllv", "AllGatherV", "ReduceScatterV", "SendRecv",  "Barrier", "Echo"};
    return names[static_cast<int>(c)];
}

bool IsReduction(Coll c)
{
    return c == Coll::AllReduce || c == Coll::ReduceScatter || c == Coll::Reduce ||
           c == Coll::ReduceScatterV || c == Coll::Echo;
}

// The V collectives' counts and displacements, the same on every rank (AllToAllv: rank r's
// block for p is Base(r, p) elements), with gaps between the blocks that the call must not touch.
struct VLayout {
    std::vector<size_t> scounts, sdispls, rcounts, rdispls;
    size_t send_elems = 0, recv_elems = 0;
};

size_t A2aBase(const Case &c, int from, int to)
{
    return c.count / 4 + static_cast<size_t>((3 * from + 5 * to) % 7);
}

VLayout Layout(const Case &c, int rank, int n)
{
    VLayout v;
    const size_t un = static_cast<size_t>(n);
    v.scounts.resize(un);
    v.sdispls.resize(un);
    v.rcounts.resize(un);
    v.rdispls.resize(un);
    size_t s = 0, r = 0;
    for (int p = 0; p < n; p++) {
        const size_t up = static_cast<size_t>(p);
        switch (c.coll) {
        case Coll::AllToAllv:
            v.scounts[up] = A2aBase(c, rank, p);
            v.rcounts[up] = A2aBase(c, p, rank);
            v.sdispls[up] = s + up; // one-element gaps
            v.rdispls[up] = r + 2 * up;
            s = v.sdispls[up] + v.scounts[up];
            r = v.rdispls[up] + v.rcounts[up];
            break;
        case Coll::AllGatherV:
            v.rcounts[up] = c.count / 2 + 5 * up;
            v.rdispls[up] = r + 2 * up;
            r = v.rdispls[up] + v.rcounts[up];
            break;
        default: // ReduceScatterV: contiguous blocks, as the call defines them
            v.rcounts[up] = c.count / 2 + 3 * up;
            s += v.rcounts[up];
            break;
        }
    }
    if (c.coll == Coll::AllGatherV)
        s = v.rcounts[static_cast<size_t>(rank)];
    if (c.coll == Coll::ReduceScatterV)
        r = v.rcounts[static_cast<size_t>(rank)];
    v.send_elems = s;
    v.recv_elems = r;
    return v;
}

// Bytes of the send and receive buffers, and for in place where the send data sits in the
// receive buffer (or, for the scatters, the receive block in the send buffer).
void Sizes(const Case &c, const VLayout &v, int rank, int n, size_t *sb, size_t *rb, size_t *at)
{
    const size_t es = loomtest::TypeSize(c.dt), cnt = c.count, un = static_cast<size_t>(n);
    const size_t ur = static_cast<size_t>(rank);
    *at = 0;
    switch (c.coll) {
    case Coll::AllGather:
        *sb = cnt * es;
        *rb = cnt * es * un;
        *at = ur * cnt * es;
        break;
    case Coll::ReduceScatter:
        *sb = cnt * es * un;
        *rb = cnt * es;
        *at = ur * cnt * es;
        break;
    case Coll::AllToAll:
        *sb = *rb = cnt * es * un;
        break;
    case Coll::AllToAllv:
    case Coll::AllGatherV:
    case Coll::ReduceScatterV:
        *sb = v.send_elems * es;
        *rb = v.recv_elems * es;
        if (c.coll == Coll::AllGatherV)
            *at = v.rdispls[ur] * es;
        for (size_t p = 0; c.coll == Coll::ReduceScatterV && p < ur; p++)
            *at += v.rcounts[p] * es;
        break;
    case Coll::Barrier:
        *sb = *rb = 0;
        break;
    default:
        *sb = *rb = cnt * es;
        break;
    }
}

loomResult_t Issue(const Case &c, const VLayout &v, const void *send, void *recv, loomComm_t comm,
                   loomStream_t s, int rank, int n)
{
    const int root = n - 1;
    switch (c.coll) {
    case Coll::AllReduce:
        return loomAllReduce(send, recv, c.count, c.dt, c.op, comm, s);
    case Coll::AllGather:
        return loomAllGather(send, recv, c.count, c.dt, comm, s);
    case Coll::ReduceScatter:
        return loomReduceScatter(send, recv, c.count, c.dt, c.op, comm, s);
    case Coll::Broadcast:
        return loomBroadcast(send, recv, c.count, c.dt, root, comm, s);
    case Coll::Reduce:
        return loomReduce(send, recv, c.count, c.dt, c.op, root, comm, s);
    case Coll::AllToAll:
        return loomAllToAll(send, recv, c.count, c.dt, comm, s);
    case Coll::AllToAllv:
        return loomAllToAllv(send, v.scounts.data(), v.sdispls.data(), recv, v.rcounts.data(),
                             v.rdispls.data(), c.dt, comm, s);
    case Coll::AllGatherV:
        return loomAllGatherV(send, v.rcounts[static_cast<size_t>(rank)], recv, v.rcounts.data(),
                              v.rdispls.data(), c.dt, comm, s);
    case Coll::ReduceScatterV:
        return loomReduceScatterV(send, recv, v.rcounts.data(), c.dt, c.op, comm, s);
    case Coll::SendRecv: {
        loomResult_t r1 = loomGroupStart();
        loomResult_t r2 = loomSend(send, c.count, c.dt, (rank + 1) % n, comm, s);
        loomResult_t r3 = loomRecv(recv, c.count, c.dt, (rank + n - 1) % n, comm, s);
        loomResult_t r4 = loomGroupEnd();
        for (loomResult_t r : {r1, r2, r3, r4})
            if (r != loomSuccess)
                return r;
        return loomSuccess;
    }
    case Coll::Barrier:
        return loomBarrier(comm, s);
    case Coll::Echo:
        return loomEchoAllReduce(send, recv, c.count, c.dt, comm, nullptr, s);
    }
    return loomInternalError;
}

// A buffer of bytes at a place: a host vector or device memory, filled from `init`.
class Buf {
  public:
    Buf(Place p, const std::vector<uint8_t> &init) : host_(p == Place::Host ? init : Bytes())
    {
        if (p == Place::Device) {
            dev_ = std::make_unique<DevBuf>(init.size());
            if (!init.empty())
                memcpy(dev_->data(), init.data(), init.size());
        }
    }
    uint8_t *data()
    {
        return dev_ ? dev_->data() : host_.data();
    }
    size_t size() const
    {
        return dev_ ? dev_->size() : host_.size();
    }

  private:
    using Bytes = std::vector<uint8_t>;
    Bytes host_;
    std::unique_ptr<DevBuf> dev_;
};

void Compare(const uint8_t *got, const std::vector<uint8_t> &want, const Case &c, StreamKind k,
             const char *what)
{
    if (want.empty() || memcmp(got, want.data(), want.size()) == 0)
        return;
    size_t i = 0;
    while (got[i] == want[i])
        i++;
    char msg[256];
    snprintf(msg, sizeof(msg),
             "%s on %s: %s differs from the host call's at byte %zu of %zu "
             "(%u vs %u)",
             CaseName(c).c_str(), StreamName(k), what, i, want.size(), got[i], want[i]);
    loomtest::Fail(__FILE__, __LINE__, msg);
}

} // namespace

std::string CaseName(const Case &c)
{
    std::string s = std::string(CollName(c.coll)) + " " + loomtest::TypeName(c.dt);
    if (IsReduction(c.coll) && c.coll != Coll::Echo)
        s += std::string(" ") + loomtest::OpName(c.op);
    s += " count " + std::to_string(c.count);
    if (c.in_place)
        s += " in place";
    if (c.send != c.recv)
        s += c.send == Place::Device ? " (send device, recv host)" : " (send host, recv device)";
    return s;
}

std::vector<Case> AllCases()
{
    std::vector<Case> v;
    for (loomDataType_t dt : {loomFloat32, loomFloat16, loomBfloat16, loomInt32})
        for (loomRedOp_t op : loomtest::kAllOps)
            v.push_back({Coll::AllReduce, dt, op});
    for (loomDataType_t dt : {loomFloat32, loomBfloat16, loomInt32}) {
        v.push_back({Coll::ReduceScatter, dt, loomSum});
        v.push_back({Coll::Reduce, dt, loomMax});
        v.push_back({Coll::AllGather, dt});
        v.push_back({Coll::Broadcast, dt});
        v.push_back({Coll::AllToAll, dt});
    }
    v.push_back({Coll::ReduceScatter, loomFloat16, loomAvg});
    v.push_back({Coll::Reduce, loomFloat16, loomSum});
    v.push_back({Coll::AllToAllv, loomFloat32});
    v.push_back({Coll::AllToAllv, loomInt8});
    v.push_back({Coll::AllGatherV, loomFloat32});
    v.push_back({Coll::AllGatherV, loomBfloat16});
    v.push_back({Coll::ReduceScatterV, loomFloat32, loomSum});
    v.push_back({Coll::ReduceScatterV, loomBfloat16, loomAvg});
    v.push_back({Coll::SendRecv, loomFloat32});
    v.push_back({Coll::SendRecv, loomUint8});
    v.push_back({Coll::Barrier, loomUint8});
    v.push_back({Coll::Echo, loomFloat32});
    v.push_back({Coll::Echo, loomBfloat16});
    return v;
}

std::vector<Case> InPlaceCases()
{
    std::vector<Case> v;
    for (Coll c : {Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast,
                   Coll::Reduce, Coll::AllGatherV, Coll::ReduceScatterV, Coll::Echo}) {
        Case k{c, c == Coll::Echo ? loomBfloat16 : loomFloat32, loomSum};
        k.in_place = true;
        v.push_back(k);
    }
    return v;
}

void CheckCase(const Case &c, loomComm_t comm, int rank, int n, StreamKind k)
{
    loomtest::SetContext(CaseName(c) + " on " + StreamName(k));
    const VLayout v = Layout(c, rank, n);
    size_t sb, rb, at;
    Sizes(c, v, rank, n, &sb, &rb, &at);
    // The input, and the receive buffer's bytes before the call (all must survive where the
    // call writes nothing).
    std::vector<uint8_t> in(sb), out0(rb);
    const uint64_t seed = loomtest::Mix64(static_cast<uint64_t>(c.coll) * 131 + c.dt);
    if (IsReduction(c.coll))
        loomtest::FillReduceInput(in.data(), c.dt, c.coll == Coll::Echo ? loomSum : c.op, rank,
                                  seed, 0, sb / loomtest::TypeSize(c.dt));
    else
        loomtest::FillPattern(in.data(), sb, rank, seed);
    loomtest::FillPattern(out0.data(), rb, rank + 100, seed);

    Stream s(k);
    if (c.in_place) {
        // One buffer: the larger of the two, the smaller one's data at its in-place offset.
        const bool in_send = c.coll == Coll::ReduceScatter || c.coll == Coll::ReduceScatterV;
        std::vector<uint8_t> whole = in_send ? in : out0;
        if (!in_send)
            memcpy(whole.data() + at, in.data(), sb);
        std::vector<uint8_t> want = whole;
        uint8_t *h = want.data();
        XT_CHECK_LOOM(
            Issue(c, v, in_send ? h : h + at, in_send ? h + at : h, comm, nullptr, rank, n));
        Buf b(c.recv, whole);
        uint8_t *d = b.data();
        XT_CHECK_LOOM(
            Issue(c, v, in_send ? d : d + at, in_send ? d + at : d, comm, s.get(), rank, n));
        s.Sync();
        Compare(d, want, c, k, "the buffer");
        return;
    }
    std::vector<uint8_t> want = out0;
    XT_CHECK_LOOM(Issue(c, v, in.data(), want.data(), comm, nullptr, rank, n));
    Buf send(c.send, in), recv(c.recv, out0);
    XT_CHECK_LOOM(Issue(c, v, send.data(), recv.data(), comm, s.get(), rank, n));
    s.Sync();
    Compare(recv.data(), want, c, k, "the receive buffer");
    Compare(send.data(), in, c, k, "the send buffer");
}

} // namespace devtest
