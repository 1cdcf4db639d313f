// SPDX-License-Identifier: Apache-2.0
//
// devtp_case.h - what the device transport tests share: a loom_dev_comm_t filled in by hand
// (the transports are driven through their table, as dev_comm.c drives them), the ranks as
// forked processes (tests/harness) or as threads of one process, one collective call checked
// bit for bit against loom's host collective on the same communicator, and stream waits with a
// deadline. Inside a rank, failures use the harness's XT_CHECK macros (they end the process).
#ifndef LOOM_TESTS_DEVICE_DEVTP_CASE_H
#define LOOM_TESTS_DEVICE_DEVTP_CASE_H

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "devrt.h"
#include "devtp.h"
#include "loom.h"

namespace devtest {

// Buffers a rank reuses from case to case: freeing device memory waits for every stream of
// the process (cudaFree synchronizes the device), so ranks that are threads of one process
// must not free while a peer's stream waits for them; they free once, at the end, after a
// barrier (Free).
struct Pool {
    const loom_devrt_t *rt = nullptr;
    void *mem[2][2] = {}; // [host][which]
    size_t bytes[2][2] = {};
    void *Get(int which, bool host, size_t bytes);
    void Free();
};

// One rank's device-side view of its communicator.
struct Rank {
    loom_dev_comm_t dc{};
    volatile int abort_flag = 0;
    void *state = nullptr; // the transport's, after Open
    loom_dev_stream_t s = nullptr;
    Pool pool;
};

// Fills r.dc for this rank (every rank on this host, device 0, timeout 20 s).
void FillComm(Rank &r, loomComm_t comm, int rank, int nranks);
// The runtime the tests use: LOOM_DEVICE decides (the suite sets emulated); NULL if none.
const loom_devrt_t *Runtime();

// Runs body(rank, nranks, comm) on nranks threads of this process, each with a communicator
// of its own over one unique id (destroyed after body returns).
void RunThreads(int nranks, const std::function<void(int, int, loomComm_t)> &body);

// Waits until every operation queued on s ran: true, false after timeout_s (or a failure).
bool StreamWait(const loom_devrt_t *rt, loom_dev_stream_t s, double timeout_s);

struct Case {
    loomCollective_t coll;
    loomDataType_t dt;
    loomRedOp_t op;
    size_t count;
    bool inplace;
    int root;
    bool host_send, host_recv; // plain host memory instead of device memory
    uint64_t seed;
    std::string Name() const;
};

// Every collective x datatype (fp32, fp16, bf16, int32) x op x count x in place, each case's
// buffers host or device in turn, roots alternating.
std::vector<Case> Grid(int nranks, const std::vector<size_t> &counts);

// Queues c on r.s through tp (r.state open), waits for it, and checks the result bit for bit
// against the host collective on the same communicator (host buffers, NULL stream). The
// buffers come from r.pool.
void CheckCase(const loom_devtp_t *tp, Rank &r, loomComm_t comm, const Case &c);

// Buffers of one call, filled and read through the runtime.
struct Buffers {
    const loom_devrt_t *rt = nullptr;
    void *send = nullptr, *recv = nullptr;
    std::vector<void *> dev;  // to mem_free
    std::vector<void *> host; // to free
    ~Buffers();
    void *Alloc(size_t bytes, bool host_mem);
};
void ToBuffer(const loom_devrt_t *rt, loom_dev_stream_t s, void *dst, const void *src,
              size_t bytes);
void FromBuffer(const loom_devrt_t *rt, loom_dev_stream_t s, void *dst, const void *src,
                size_t bytes);

// Elements of the send and receive buffers of a call of coll with count on nranks.
size_t SendElems(loomCollective_t coll, size_t count, int nranks);
size_t RecvElems(loomCollective_t coll, size_t count, int nranks);
// The call's arguments for the transport's table.
loom_coll_kind_t Kind(loomCollective_t coll);
// Deterministic input of rank `rank` for a case (values exact in every datatype).
std::vector<uint8_t> Input(const Case &c, int rank, size_t elems);

} // namespace devtest

#endif
