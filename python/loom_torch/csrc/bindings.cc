/* SPDX-License-Identifier: Apache-2.0
 *
 * bindings.cc - the loom_torch._C module: ProcessGroupLoom for
 * torch.distributed's backend registry, Echo's state and all-reduce on a
 * loom process group, and the library's version.
 */
#include "process_group.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>

namespace py = pybind11;

namespace loom_torch {

namespace {

void withoutGil(const std::function<void()> &fn)
{
    if (PyGILState_Check()) {
        py::gil_scoped_release release;
        fn();
    } else {
        fn();
    }
}

c10::intrusive_ptr<ProcessGroupLoom> asLoom(const c10::intrusive_ptr<c10d::ProcessGroup> &pg)
{
    TORCH_CHECK(pg, "loom_torch: no process group (call torch.distributed.init_process_group "
                    "first)");
    auto loom = c10::dynamic_intrusive_pointer_cast<ProcessGroupLoom>(pg);
    TORCH_CHECK(loom, "loom_torch: the group's backend is ", pg->getBackendName(),
                ", not loom (create it with backend=\"loom\")");
    return loom;
}

/* An Echo feedback state on one loom process group's communicator. */
class EchoState {
  public:
    EchoState(const c10::intrusive_ptr<c10d::ProcessGroup> &group, int64_t numel, py::object dtype)
        : pg_(asLoom(group)), numel_(numel)
    {
        TORCH_CHECK(numel >= 0, "loom_torch.EchoState: numel must not be negative, got ", numel);
        TORCH_CHECK(THPDtype_Check(dtype.ptr()), "loom_torch.EchoState: dtype must be a "
                                                 "torch.dtype");
        dtype_ = reinterpret_cast<THPDtype *>(dtype.ptr())->scalar_type;
        TORCH_CHECK(dtype_ == at::kFloat || dtype_ == at::kHalf || dtype_ == at::kBFloat16,
                    "loom_torch.EchoState: dtype must be float32, float16 or bfloat16, got ",
                    dtype_);
        at::Tensor probe = at::empty({0}, at::TensorOptions().dtype(dtype_));
        loomResult_t r =
            loomEchoCreate(pg_->comm(), (size_t)numel, loomDtype(probe, "EchoState"), &state_);
        TORCH_CHECK(r == loomSuccess,
                    "loom_torch.EchoState: loomEchoCreate failed: ", loomGetErrorString(r), ": ",
                    loomGetLastError(pg_->comm()));
    }
    ~EchoState()
    {
        loomEchoDestroy(state_);
    }

    void check(const c10::intrusive_ptr<ProcessGroupLoom> &pg, const at::Tensor &t) const
    {
        TORCH_CHECK(pg.get() == pg_.get(),
                    "loom_torch.echo_all_reduce: the state belongs to another group");
        TORCH_CHECK(t.numel() == numel_ && t.scalar_type() == dtype_,
                    "loom_torch.echo_all_reduce: the state is for ", numel_, " elements of ",
                    dtype_, ", the tensor has ", t.numel(), " of ", t.scalar_type());
    }
    void reset()
    {
        loomEchoReset(state_);
    }
    loomEchoState_t get() const
    {
        return state_;
    }

  private:
    c10::intrusive_ptr<ProcessGroupLoom> pg_; /* keeps the communicator alive */
    int64_t numel_;
    at::ScalarType dtype_ = at::kFloat;
    loomEchoState_t state_ = nullptr;
};

c10::intrusive_ptr<c10d::Work> echoAllReduce(at::Tensor tensor,
                                             const c10::intrusive_ptr<c10d::ProcessGroup> &group,
                                             const EchoState *state)
{
    auto pg = asLoom(group);
    if (state)
        state->check(pg, tensor);
    return pg->echoAllReduce(tensor, state ? state->get() : nullptr);
}

} // namespace

} // namespace loom_torch

PYBIND11_MODULE(_C, m)
{
    using namespace loom_torch;
    py::module_::import("torch.distributed");
    setBlockingWrapper(withoutGil);

    py::class_<ProcessGroupLoom, c10::intrusive_ptr<ProcessGroupLoom>, c10d::ProcessGroup>(
        m, "ProcessGroupLoom")
        .def(py::init([](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                         std::chrono::milliseconds timeout) {
                 return c10::make_intrusive<ProcessGroupLoom>(store, rank, size, timeout);
             }),
             py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
             py::call_guard<py::gil_scoped_release>());

    py::class_<EchoState>(m, "EchoState")
        .def(py::init<const c10::intrusive_ptr<c10d::ProcessGroup> &, int64_t, py::object>(),
             py::arg("group"), py::arg("numel"), py::arg("dtype"))
        .def("reset", &EchoState::reset, "Zeroes the residuals (a new stream of calls).");

    m.def("echo_all_reduce", &echoAllReduce, py::arg("tensor"), py::arg("group"), py::arg("state"),
          py::call_guard<py::gil_scoped_release>());
    m.def("version", [] {
        int v = 0;
        loomGetVersion(&v);
        return v;
    });
}
