#pragma once
// The CUDA path of tide::kernels::adamw: one grid-stride kernel per step that runs the same
// adamw_update (math.hpp) as the host, four elements per thread-iteration with 128-bit loads of
// p, m, v (and 4-element loads of g and stores of the working copy) where a record's pointers
// are aligned for them, element by element where they are not.
//
// Multi-tensor: the list is a DEVICE array of adamw_tensor records, built once by the caller
// (parameters do not move between steps) and passed as a tensor_view<adamw_tensor<G, W>, cuda>.
// One launch covers every record: each thread walks the records in order and takes the items
// (packs or elements) whose index in the concatenation of all records is congruent to its own
// index modulo the grid size. So there is no per-launch table, no kernel-argument limit on the
// number of tensors (Apex's 36 per launch), and the load balances across tensors; the cost is
// a loop over the records in every thread, fine up to thousands of tensors. For very many tiny
// tensors, step one flat chunk instead (tide's chunks are exactly that).
//
// The optional `device_scale` (device memory, e.g. the clip scale global_grad_norm's CUDA path
// writes) multiplies grad_scale inside the kernel without a host round trip. When it is not
// finite the kernel returns without writing: the step is skipped, as dynamic loss scaling wants
// after an overflow.
//
// Rounding: identical operations to the host path; nvcc contracts a*b+c into FMAs (default
// --fmad=true), so results are not bitwise the host's but within the tolerance both have
// against the reference (adamw.hpp).
//
//   tide::kernels::adamw(ex, hp, t, records, clip);                  // records: device array
//   tide::kernels::adamw(ex, hp, t, p, g, m, v, working, 1.f, scale); // flat chunk, device scale

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/adamw/host.hpp"
#include "tide/kernels/adamw/math.hpp"

namespace tide::kernels {

// Not tuned on a GPU (none where this was written): 256 threads x 4 blocks per SM fill half of
// an sm_80/sm_90 SM's threads, which a streaming kernel with 4 independent 16-byte loads in
// flight per thread needs to saturate HBM (llm.c's AdamW uses 512 x full occupancy).
struct adamw_cuda_tuning {
  static constexpr int block = 256;
  static constexpr int blocks_per_sm = 4;
  static constexpr int pack = 4;  // elements per thread-iteration: one 128-bit fp32 load
};

// Device code sits in detail's ABI namespace (not an ABI namespace's own detail, which would make
// every `detail::` lookup in tide::kernels ambiguous with host.hpp's detail).
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

template <class T, int N>
struct alignas(sizeof(T) * N) adamw_pack {
  T v[N];
};

TIDE_HOST_DEVICE inline bool adamw_aligned(void const* ptr, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0;
}

// Whether record r takes the packed path, and how many items (packs or elements) it has.
template <class Grad, class Work>
TIDE_HOST_DEVICE inline bool adamw_packed(adamw_tensor<Grad, Work> const& r) {
  constexpr int P = adamw_cuda_tuning::pack;
  return adamw_aligned(r.p, sizeof(float) * P) && adamw_aligned(r.m, sizeof(float) * P) &&
         adamw_aligned(r.v, sizeof(float) * P) && adamw_aligned(r.g, sizeof(Grad) * P) &&
         (r.working == nullptr || adamw_aligned(r.working, sizeof(Work) * P));
}

template <class Grad, class Work>
TIDE_HOST_DEVICE inline index_t adamw_items(adamw_tensor<Grad, Work> const& r) {
  constexpr int P = adamw_cuda_tuning::pack;
  return adamw_packed(r) ? (r.n + P - 1) / P : r.n;
}

template <class Grad, class Work>
__device__ inline void adamw_element(adamw_tensor<Grad, Work> const& r, index_t e, adamw_coefficients const& c) {
  float p = r.p[e], m = r.m[e], v = r.v[e];
  adamw_update(p, m, v, to_float(r.g[e]), c);
  r.p[e] = p;
  r.m[e] = m;
  r.v[e] = v;
  if (r.working != nullptr) r.working[e] = from_float<Work>(p);
}

// The items of record r that thread `thread` of a grid of `threads` owns, r's items starting at
// `offset` in the concatenation of all records' items.
template <class Grad, class Work>
__device__ void adamw_record(adamw_tensor<Grad, Work> const& r, adamw_coefficients const& c, index_t thread,
                             index_t threads, index_t offset) {
  constexpr int P = adamw_cuda_tuning::pack;
  bool const packed = adamw_packed(r);
  index_t const items = packed ? (r.n + P - 1) / P : r.n;
  index_t i = ((thread - offset) % threads + threads) % threads;
  if (!packed) {
    for (; i < items; i += threads) adamw_element(r, i, c);
    return;
  }
  for (; i < items; i += threads) {
    index_t const base = i * P;
    if (base + P > r.n) {  // the record's last, partial pack
      for (index_t e = base; e < r.n; ++e) adamw_element(r, e, c);
      continue;
    }
    auto p = *reinterpret_cast<adamw_pack<float, P> const*>(r.p + base);
    auto m = *reinterpret_cast<adamw_pack<float, P> const*>(r.m + base);
    auto v = *reinterpret_cast<adamw_pack<float, P> const*>(r.v + base);
    auto const g = *reinterpret_cast<adamw_pack<Grad, P> const*>(r.g + base);
#pragma unroll
    for (int k = 0; k < P; ++k) adamw_update(p.v[k], m.v[k], v.v[k], to_float(g.v[k]), c);
    *reinterpret_cast<adamw_pack<float, P>*>(r.p + base) = p;
    *reinterpret_cast<adamw_pack<float, P>*>(r.m + base) = m;
    *reinterpret_cast<adamw_pack<float, P>*>(r.v + base) = v;
    if (r.working != nullptr) {
      adamw_pack<Work, P> w;
#pragma unroll
      for (int k = 0; k < P; ++k) w.v[k] = from_float<Work>(p.v[k]);
      *reinterpret_cast<adamw_pack<Work, P>*>(r.working + base) = w;
    }
  }
}

// False when the device scale says to skip the step; otherwise folds it into c.
__device__ inline bool adamw_apply_device_scale(adamw_coefficients& c, float const* device_scale) {
  if (device_scale == nullptr) return true;
  float const s = *device_scale;
  if (!isfinite(s)) return false;
  c.grad_scale *= s;
  return true;
}

template <class Grad, class Work>
__global__ void __launch_bounds__(adamw_cuda_tuning::block)
    adamw_flat_kernel(adamw_tensor<Grad, Work> record, adamw_coefficients c, float const* device_scale) {
  if (!adamw_apply_device_scale(c, device_scale)) return;
  index_t const threads = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const thread = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  adamw_record(record, c, thread, threads, 0);
}

template <class Grad, class Work>
__global__ void __launch_bounds__(adamw_cuda_tuning::block)
    adamw_list_kernel(adamw_tensor<Grad, Work> const* records, index_t count, adamw_coefficients c,
                      float const* device_scale) {
  if (!adamw_apply_device_scale(c, device_scale)) return;
  index_t const threads = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const thread = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  index_t offset = 0;
  for (index_t r = 0; r < count; ++r) {
    adamw_tensor<Grad, Work> const record = records[r];
    adamw_record(record, c, thread, threads, offset);
    offset += adamw_items(record);
  }
}

// Blocks for `items` items (all the device can hold when items < 0: unknown on the host).
inline unsigned adamw_blocks(index_t items) {
  int device = 0, sms = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  index_t const full = index_t{sms} * adamw_cuda_tuning::blocks_per_sm;
  if (items < 0) return static_cast<unsigned>(full);
  index_t const needed = (items + adamw_cuda_tuning::block - 1) / adamw_cuda_tuning::block;
  return static_cast<unsigned>(std::clamp<index_t>(needed, 1, full));
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
  adamw_coefficients const c = adamw_coefficients_for(hp, t, grad_scale);
  TIDE_REQUIRE(records.is_contiguous(), "adamw needs its records as a contiguous device array");
  if (records.size() == 0) return;
  detail::adamw_list_kernel<<<detail::adamw_blocks(-1), adamw_cuda_tuning::block, 0, ex.stream>>>(
      records.data(), records.size(), c, device_scale);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// One AdamW step over one flat chunk in device memory, enqueued on ex.stream.
template <class Grad, class Work>
  requires Element<std::remove_const_t<Grad>> && Element<Work>
void adamw(exec<tide::cuda> const& ex, adamw_hparams const& hp, std::int64_t t, tensor_view<float, tide::cuda> p,
           tensor_view<Grad, tide::cuda> g, tensor_view<float, tide::cuda> m, tensor_view<float, tide::cuda> v,
           tensor_view<Work, tide::cuda> working, float grad_scale = 1.f, float const* device_scale = nullptr) {
  adamw_coefficients const c = adamw_coefficients_for(hp, t, grad_scale);
  auto const record = detail::adamw_flat_record(p, g, m, v, working);
  if (record.n == 0) return;
  detail::adamw_flat_kernel<<<detail::adamw_blocks(detail::adamw_items(record)), adamw_cuda_tuning::block, 0,
                              ex.stream>>>(record, c, device_scale);
  TIDE_CUDA_CHECK(cudaGetLastError());
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
