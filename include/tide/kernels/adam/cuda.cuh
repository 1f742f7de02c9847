#pragma once
// The CUDA path of tide::kernels::adam: adam_update (math.hpp) in place of AdamW's update, run by
// the elementwise optimizers' shared grid-stride machinery (kernels/detail/elementwise_step.cuh),
// on AdamW's records: the packing rule, the walk over a device array of records, the tuning and
// the device_scale handling are that machinery's, as for AdamW and SGD. This file keeps Adam's
// own parts: its two __global__ entries, adam_flat_kernel and adam_list_kernel, and the
// launchers. A non-finite *device_scale skips the step.
//
// Rounding: identical operations to the host path; nvcc contracts a*b+c into FMAs (default
// --fmad=true), so results are not bitwise the host's but within the tolerance both have
// against the reference (adam.hpp).
//
//   tide::kernels::adam(ex, hp, t, records, clip);                  // records: device array
//   tide::kernels::adam(ex, hp, t, p, g, m, v, working, 1.f, scale); // flat chunk, device scale

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <type_traits>

#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/adam/host.hpp"
#include "tide/kernels/adam/math.hpp"
#include "tide/kernels/detail/elementwise_step.cuh"

namespace tide::kernels {

// Device code sits in detail's ABI namespace, as in detail/elementwise_step.cuh.
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

template <class Record>
__global__ void __launch_bounds__(elementwise_cuda_tuning::block)
    adam_flat_kernel(Record record, adam_coefficients c, float const* device_scale) {
  run_flat_step<adam_step>(record, c, device_scale);
}

template <class Record>
__global__ void __launch_bounds__(elementwise_cuda_tuning::block)
    adam_list_kernel(Record const* records, index_t count, adam_coefficients c, float const* device_scale) {
  run_list_step<adam_step>(records, count, c, device_scale);
}

TIDE_ABI_NAMESPACE_END
}  // namespace detail

TIDE_ABI_NAMESPACE_BEGIN

// One Adam step over a device array of records, enqueued on ex.stream. The records' contents
// live on the device and are not checked here (a host copy can be checked with the host
// overload's rules: n >= 0, p, g, m, v non-null when n > 0).
template <class Record>
  requires detail::is_adamw_tensor<std::remove_const_t<Record>>
void adam(exec<tide::cuda> const& ex, adam_hparams const& hp, std::int64_t t, tensor_view<Record, tide::cuda> records,
          float grad_scale = 1.f, float const* device_scale = nullptr) {
  detail::launch_step_list<detail::adam_step>(detail::adam_list_kernel<std::remove_const_t<Record>>, ex.stream,
                                              records, adam_coefficients_for(hp, t, grad_scale), device_scale);
}

// The same over a host array of records whose tensors live on the device (the offload engine's
// batches): the records go to the device first (detail::with_device_records).
template <class Record>
  requires detail::is_adamw_tensor<std::remove_const_t<Record>>
void adam(exec<tide::cuda> const& ex, adam_hparams const& hp, std::int64_t t, std::span<Record const> records,
          float grad_scale = 1.f) {
  detail::with_device_records(ex, records, [&](auto device) { adam(ex, hp, t, device, grad_scale); });
}

// One Adam step over one flat chunk in device memory, enqueued on ex.stream.
template <class Grad, class Work>
  requires Element<std::remove_const_t<Grad>> && Element<Work>
void adam(exec<tide::cuda> const& ex, adam_hparams const& hp, std::int64_t t, tensor_view<float, tide::cuda> p,
          tensor_view<Grad, tide::cuda> g, tensor_view<float, tide::cuda> m, tensor_view<float, tide::cuda> v,
          tensor_view<Work, tide::cuda> working, float grad_scale = 1.f, float const* device_scale = nullptr) {
  adam_coefficients const c = adam_coefficients_for(hp, t, grad_scale);
  auto const record = detail::adam_step::flat_record(p, g, m, v, working);
  detail::launch_step_flat<detail::adam_step>(detail::adam_flat_kernel<std::remove_const_t<decltype(record)>>,
                                              ex.stream, record, c, device_scale);
}

// The same without a working copy.
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
void adam(exec<tide::cuda> const& ex, adam_hparams const& hp, std::int64_t t, tensor_view<float, tide::cuda> p,
          tensor_view<Grad, tide::cuda> g, tensor_view<float, tide::cuda> m, tensor_view<float, tide::cuda> v,
          float grad_scale = 1.f, float const* device_scale = nullptr) {
  adam(ex, hp, t, p, g, m, v, tensor_view<std::remove_const_t<Grad>, tide::cuda>{}, grad_scale, device_scale);
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
