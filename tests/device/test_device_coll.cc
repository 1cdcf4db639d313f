// SPDX-License-Identifier: Apache-2.0
//
// test_device_coll.cc - every collective and Echo on device buffers (loomMemAlloc) at 2 and 4
// ranks, bitwise equal to the same call on host buffers: with the transports' own choice (ipc
// where it runs the call, staged otherwise) and with host staging forced
// (LOOM_DEVICE_TRANSPORTS=staged); in place; send and receive buffers on different sides. The
// ranks run under LOOM_DEVICE=emulated, so this is the device path's protocol as a GPU runs it,
// with the emulation's streams, copies and kernels. Run by meson's 'device' suite.

#include "dev_cases.h"
#include "mp_fixture.h"

namespace {

using devtest::Case;
using devtest::StreamKind;

void EveryCase(int nranks, const std::string &transports)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        nranks,
        [](int rank, int n, loomComm_t comm) {
            for (const Case &c : devtest::AllCases())
                devtest::CheckCase(c, comm, rank, n, StreamKind::Null);
        },
        devtest::Options(transports)));
}

TEST(DeviceColl, EveryCollectiveTwoRanks)
{
    EveryCase(2, "");
}

TEST(DeviceColl, EveryCollectiveFourRanks)
{
    EveryCase(4, "");
}

TEST(DeviceColl, EveryCollectiveStagedTwoRanks)
{
    EveryCase(2, "staged");
}

TEST(DeviceColl, EveryCollectiveStagedFourRanks)
{
    EveryCase(4, "staged");
}

TEST(DeviceColl, InPlace)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t comm) {
            for (const Case &c : devtest::InPlaceCases()) {
                devtest::CheckCase(c, comm, rank, n, StreamKind::Null);
                devtest::CheckCase(c, comm, rank, n, StreamKind::WrapCreated);
            }
        },
        devtest::Options()));
}

// One buffer on the device, the other in host memory: only the device one is staged.
TEST(DeviceColl, MixedHostAndDeviceBuffers)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t comm) {
            for (devtest::Coll coll :
                 {devtest::Coll::AllReduce, devtest::Coll::AllGather, devtest::Coll::ReduceScatter,
                  devtest::Coll::AllToAllv, devtest::Coll::SendRecv, devtest::Coll::Echo}) {
                for (devtest::Place send : {devtest::Place::Host, devtest::Place::Device}) {
                    Case c{coll, coll == devtest::Coll::Echo ? loomBfloat16 : loomFloat32};
                    c.send = send;
                    c.recv = send == devtest::Place::Host ? devtest::Place::Device
                                                          : devtest::Place::Host;
                    devtest::CheckCase(c, comm, rank, n, StreamKind::Null);
                    devtest::CheckCase(c, comm, rank, n, StreamKind::WrapDefault);
                }
            }
        },
        devtest::Options()));
}

} // namespace
