#pragma once
// The CUDA path of tide::kernels::sgd: sgd_update (math.hpp), the host's own arithmetic, over
// sgd_tensor records, run by the elementwise optimizers' shared grid-stride machinery
// (kernels/detail/elementwise_step.cuh, as for Adam and AdamW): four elements per
// thread-iteration with 128-bit loads of p and buf (buf only with momentum; a null one counts as
// aligned) where a record's pointers are aligned for them, element by element where they are
// not; one launch for a whole DEVICE array of records. This file keeps SGD's own parts: its two
// __global__ entries, sgd_flat_kernel and sgd_list_kernel, and the launchers.
//
// The optional `device_scale` (device memory, e.g. the clip scale global_grad_norm's CUDA path
// writes) multiplies grad_scale inside the kernel; when it is not finite the kernel returns
// without writing: the step is skipped.
//
// Rounding: identical operations to the host path; nvcc contracts a*b+c into FMAs (default
// --fmad=true), so results are not bitwise the host's but within the tolerance both have
// against the reference (sgd.hpp).
//
//   tide::kernels::sgd(ex, hp, t, records, clip);                 // records: device array
//   tide::kernels::sgd(ex, hp, t, p, g, buf, working, 1.f, scale); // flat chunk, device scale

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <type_traits>

#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/detail/elementwise_step.cuh"
#include "tide/kernels/sgd/host.hpp"
#include "tide/kernels/sgd/math.hpp"

namespace tide::kernels {

// Device code sits in detail's ABI namespace, as in detail/elementwise_step.cuh.
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

template <class Record>
__global__ void __launch_bounds__(elementwise_cuda_tuning::block)
    sgd_flat_kernel(Record record, sgd_coefficients c, float const* device_scale) {
  run_flat_step<sgd_step>(record, c, device_scale);
}

template <class Record>
__global__ void __launch_bounds__(elementwise_cuda_tuning::block)
    sgd_list_kernel(Record const* records, index_t count, sgd_coefficients c, float const* device_scale) {
  run_list_step<sgd_step>(records, count, c, device_scale);
}

TIDE_ABI_NAMESPACE_END
}  // namespace detail

TIDE_ABI_NAMESPACE_BEGIN

// One SGD step over a device array of records, enqueued on ex.stream. The records' contents
// live on the device and are not checked here (a host copy can be checked with the host
// overload's rules: n >= 0, p and g non-null when n > 0, buf too when momentum != 0).
template <class Record>
  requires detail::is_sgd_tensor<std::remove_const_t<Record>>
void sgd(exec<tide::cuda> const& ex, sgd_hparams const& hp, std::int64_t t, tensor_view<Record, tide::cuda> records,
         float grad_scale = 1.f, float const* device_scale = nullptr) {
  detail::launch_step_list<detail::sgd_step>(detail::sgd_list_kernel<std::remove_const_t<Record>>, ex.stream, records,
                                             sgd_coefficients_for(hp, t, grad_scale), device_scale);
}

// The same over a host array of records whose tensors live on the device (the offload engine's
// batches): the records go to the device first (detail::with_device_records).
template <class Record>
  requires detail::is_sgd_tensor<std::remove_const_t<Record>>
void sgd(exec<tide::cuda> const& ex, sgd_hparams const& hp, std::int64_t t, std::span<Record const> records,
         float grad_scale = 1.f) {
  detail::with_device_records(ex, records, [&](auto device) { sgd(ex, hp, t, device, grad_scale); });
}

// One SGD step over one flat chunk in device memory, enqueued on ex.stream (buf may be a
// default view when hp.momentum == 0).
template <class Grad, class Work>
  requires Element<std::remove_const_t<Grad>> && Element<Work>
void sgd(exec<tide::cuda> const& ex, sgd_hparams const& hp, std::int64_t t, tensor_view<float, tide::cuda> p,
         tensor_view<Grad, tide::cuda> g, tensor_view<float, tide::cuda> buf, tensor_view<Work, tide::cuda> working,
         float grad_scale = 1.f, float const* device_scale = nullptr) {
  sgd_coefficients const c = sgd_coefficients_for(hp, t, grad_scale);
  auto const record = detail::sgd_step::flat_record(p, g, buf, working, c.use_momentum);
  detail::launch_step_flat<detail::sgd_step>(detail::sgd_flat_kernel<std::remove_const_t<decltype(record)>>, ex.stream,
                                             record, c, device_scale);
}

// The same without a working copy.
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
void sgd(exec<tide::cuda> const& ex, sgd_hparams const& hp, std::int64_t t, tensor_view<float, tide::cuda> p,
         tensor_view<Grad, tide::cuda> g, tensor_view<float, tide::cuda> buf, float grad_scale = 1.f,
         float const* device_scale = nullptr) {
  sgd(ex, hp, t, p, g, buf, tensor_view<std::remove_const_t<Grad>, tide::cuda>{}, grad_scale, device_scale);
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
