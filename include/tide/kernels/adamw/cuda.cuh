#pragma once
// The CUDA path of tide::kernels::adamw: adamw_update (math.hpp), the host's own arithmetic, run
// by the elementwise optimizers' shared grid-stride machinery (kernels/detail/elementwise_step.cuh:
// four elements per thread-iteration with 128-bit loads where a record's pointers are aligned for
// them, element by element where they are not; one launch for a whole DEVICE array of
// adamw_tensor records; the optional device_scale). This file keeps AdamW's own parts: its two
// __global__ entries, adamw_flat_kernel and adamw_list_kernel, and the launchers.
//
// Multi-tensor: the list is a device array of adamw_tensor records, built once by the caller
// (parameters do not move between steps) and passed as a tensor_view<adamw_tensor<G, W>, cuda>.
// The optional `device_scale` (device memory, e.g. the clip scale global_grad_norm's CUDA path
// writes) multiplies grad_scale inside the kernel; when it is not finite the kernel returns
// without writing: the step is skipped.
//
// Rounding: identical operations to the host path; nvcc contracts a*b+c into FMAs (default
// --fmad=true), so results are not bitwise the host's but within the tolerance both have
// against the reference (adamw.hpp).
//
//   tide::kernels::adamw(ex, hp, t, records, clip);                  // records: device array
//   tide::kernels::adamw(ex, hp, t, p, g, m, v, working, 1.f, scale); // flat chunk, device scale

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <type_traits>

#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/adamw/host.hpp"
#include "tide/kernels/adamw/math.hpp"
#include "tide/kernels/detail/elementwise_step.cuh"

namespace tide::kernels {

// Device code sits in detail's ABI namespace, as in detail/elementwise_step.cuh.
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

template <class Record>
__global__ void __launch_bounds__(elementwise_cuda_tuning::block)
    adamw_flat_kernel(Record record, adamw_coefficients c, float const* device_scale) {
  run_flat_step<adamw_step>(record, c, device_scale);
}

template <class Record>
__global__ void __launch_bounds__(elementwise_cuda_tuning::block)
    adamw_list_kernel(Record const* records, index_t count, adamw_coefficients c, float const* device_scale) {
  run_list_step<adamw_step>(records, count, c, device_scale);
}

TIDE_ABI_NAMESPACE_END
}  // namespace detail

TIDE_ABI_NAMESPACE_BEGIN

// One AdamW step over a device array of records, enqueued on ex.stream. The records' contents
// live on the device and are not checked here (a host copy can be checked with the host
// overload's rules: n >= 0, p, g, m, v non-null when n > 0).
template <class Record>
  requires detail::is_adamw_tensor<std::remove_const_t<Record>>
void adamw(exec<tide::cuda> const& ex, adamw_hparams const& hp, std::int64_t t, tensor_view<Record, tide::cuda> records,
           float grad_scale = 1.f, float const* device_scale = nullptr) {
  detail::launch_step_list<detail::adamw_step>(detail::adamw_list_kernel<std::remove_const_t<Record>>, ex.stream,
                                               records, adamw_coefficients_for(hp, t, grad_scale), device_scale);
}

// The same over a host array of records whose tensors live on the device (the offload engine's
// batches): the records go to the device first (detail::with_device_records).
template <class Record>
  requires detail::is_adamw_tensor<std::remove_const_t<Record>>
void adamw(exec<tide::cuda> const& ex, adamw_hparams const& hp, std::int64_t t, std::span<Record const> records,
           float grad_scale = 1.f) {
  detail::with_device_records(ex, records, [&](auto device) { adamw(ex, hp, t, device, grad_scale); });
}

// One AdamW step over one flat chunk in device memory, enqueued on ex.stream.
template <class Grad, class Work>
  requires Element<std::remove_const_t<Grad>> && Element<Work>
void adamw(exec<tide::cuda> const& ex, adamw_hparams const& hp, std::int64_t t, tensor_view<float, tide::cuda> p,
           tensor_view<Grad, tide::cuda> g, tensor_view<float, tide::cuda> m, tensor_view<float, tide::cuda> v,
           tensor_view<Work, tide::cuda> working, float grad_scale = 1.f, float const* device_scale = nullptr) {
  adamw_coefficients const c = adamw_coefficients_for(hp, t, grad_scale);
  auto const record = detail::adamw_step::flat_record(p, g, m, v, working);
  detail::launch_step_flat<detail::adamw_step>(detail::adamw_flat_kernel<std::remove_const_t<decltype(record)>>,
                                               ex.stream, record, c, device_scale);
}

// The same without a working copy.
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
void adamw(exec<tide::cuda> const& ex, adamw_hparams const& hp, std::int64_t t, tensor_view<float, tide::cuda> p,
           tensor_view<Grad, tide::cuda> g, tensor_view<float, tide::cuda> m, tensor_view<float, tide::cuda> v,
           float grad_scale = 1.f, float const* device_scale = nullptr) {
  adamw(ex, hp, t, p, g, m, v, tensor_view<std::remove_const_t<Grad>, tide::cuda>{}, grad_scale, device_scale);
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
