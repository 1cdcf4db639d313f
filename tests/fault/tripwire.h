// SPDX-License-Identifier: Apache-2.0
//
// tripwire.h - makes a rank die (SIGKILL) or stop (SIGSTOP) at a chosen byte of a buffer,
// so that a fault test kills a rank in the middle of a collective deterministically: the victim
// has sent exactly the bytes before the tripwire, and its peers cannot finish without the rest.
// The tripwire is a PROT_NONE page. Accesses of it in user space (the shm rings' copies, the
// reduction kernels) fault, and a SIGSEGV handler raises the signal. The kernel's accesses do
// not fault, so this file also interposes sendmsg and process_vm_readv for the process: a
// message is sent, or a single-copy read lands, up to the first armed page, and a call that
// would start on one raises the signal. It does not stop socket receives, and it arms nothing
// until Arm() is called. Used by tests/fault.
#ifndef LOOM_TESTS_FAULT_TRIPWIRE_H
#define LOOM_TESTS_FAULT_TRIPWIRE_H

#include <cstddef>

namespace loomtest {

// Page-aligned, zero-filled anonymous memory; unmapped by the destructor.
class TripBuffer {
  public:
    explicit TripBuffer(size_t bytes);
    ~TripBuffer();
    TripBuffer(const TripBuffer &) = delete;
    TripBuffer &operator=(const TripBuffer &) = delete;

    unsigned char *data() const
    {
        return base_;
    }
    size_t size() const
    {
        return bytes_;
    }
    // Arms the page holding byte `offset`: from now on the first access to it raises sig
    // (SIGKILL or SIGSTOP) in this process. Call after the buffer's contents are final.
    void Arm(size_t offset, int sig);

  private:
    unsigned char *base_ = nullptr;
    size_t bytes_ = 0;
    size_t mapped_ = 0;
};

size_t PageBytes();

} // namespace loomtest

#endif // LOOM_TESTS_FAULT_TRIPWIRE_H
