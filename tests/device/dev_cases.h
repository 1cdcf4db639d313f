// SPDX-License-Identifier: Apache-2.0
//
// dev_cases.h - what the device suite's tests share: the options of a run (LOOM_DEVICE=emulated,
// so that CPU-only CI runs the device path for real), device buffers from loomMemAlloc (which
// the emulation keeps in host memory, so a rank fills and reads them directly), the four kinds of
// stream a call may be given, and one call of every collective described as a Case that
// CheckCase runs twice - on host buffers with the NULL stream, then on buffers placed as the case
// says on the given stream - and compares bit for bit: everything the call wrote, every byte it
// must leave alone, and its input.
#ifndef LOOM_TESTS_DEVICE_DEV_CASES_H
#define LOOM_TESTS_DEVICE_DEV_CASES_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "devrt.h"
#include "loom.h"
#include "mp_fixture.h"

namespace devtest {

// LOOM_DEVICE=emulated in every rank, with LOOM_DEVICE_TRANSPORTS=transports when not empty.
loomtest::RunOptions Options(const std::string &transports = "", double deadline_s = 60.0);

// Device memory (loomMemAlloc) of n bytes, freed at the end of the scope.
class DevBuf {
  public:
    explicit DevBuf(size_t n);
    ~DevBuf();
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    uint8_t *data()
    {
        return static_cast<uint8_t *>(p_);
    }
    size_t size() const
    {
        return n_;
    }

  private:
    void *p_ = nullptr;
    size_t n_ = 0;
};

// The stream a device call is given: none, a worker stream, a loom stream wrapping the
// emulation's default stream, or one wrapping a stream made by the emulation's stream_create.
enum class StreamKind { Null, Worker, WrapDefault, WrapCreated };
const char *StreamName(StreamKind k);

class Stream {
  public:
    explicit Stream(StreamKind k);
    ~Stream();
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    loomStream_t get() const
    {
        return s_;
    }
    loom_dev_stream_t device() const
    {
        return ds_;
    }
    void Sync(); // loomStreamSynchronize (nothing for the NULL stream); must succeed

  private:
    StreamKind k_;
    loomStream_t s_ = nullptr;
    loom_dev_stream_t ds_ = nullptr;
};

// The emulation's table (the tests run under LOOM_DEVICE=emulated).
const loom_devrt_t *Rt();

enum class Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    AllToAllv,
    AllGatherV,
    ReduceScatterV,
    SendRecv, // a ring of Send and Recv in one group
    Barrier,
    Echo
};

// Where a buffer lives.
enum class Place { Host, Device };

struct Case {
    Coll coll;
    loomDataType_t dt = loomFloat32;
    loomRedOp_t op = loomSum;
    size_t count = 1001;
    bool in_place = false;
    Place send = Place::Device;
    Place recv = Place::Device;
};

std::string CaseName(const Case &c);
// The cases every collective gets: AllReduce over every op and float32, float16, bfloat16 and
// int32; the others over a few types each; the V collectives, the Send/Recv ring, the barrier,
// and Echo on float32 and bfloat16.
std::vector<Case> AllCases();
// The cases that have an in-place layout, in place.
std::vector<Case> InPlaceCases();

// Runs c on host buffers (NULL stream), then placed as c says on a stream of kind k, and checks
// the two bitwise equal (XT_CHECK: exits the rank on a difference, naming the case).
void CheckCase(const Case &c, loomComm_t comm, int rank, int nranks, StreamKind k);

// The last error's text contains what.
bool LastErrorHas(const char *what);

} // namespace devtest

#endif // LOOM_TESTS_DEVICE_DEV_CASES_H
