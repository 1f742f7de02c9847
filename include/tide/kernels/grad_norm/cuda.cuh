#pragma once
// The CUDA path of the global gradient norm: a two-stage block reduction with CUB, no atomics.
//   stage 1: each block of a grid-stride kernel sums g^2 in double (128-bit loads where
//            aligned) and cub::BlockReduce writes one partial per block;
//   stage 2: one block adds the partials in a fixed order, writes the norm and the clip scale.
// The result is deterministic for a given device (SM count) and size; it is not bit-identical
// to the host, whose summation order differs (same tolerance as against the reference).
// Results stay in device memory (grad_norm_scratch), so a step needs no host round trip:
//
//   grad_norm_scratch* s;  cudaMalloc(&s, sizeof *s);        // once
//   global_grad_norm(ex, grads, s, max_norm);                // s->norm, s->clip_scale on device
//   adamw(ex, hp, t, records, 1.f / loss_scale, &s->clip_scale);  // NaN scale: step skipped
//
// The list form reads a DEVICE array of records (grad_tensor or adamw_tensor), each thread
// walking the records and taking the elements congruent to its index in their concatenation
// (as adamw's CUDA path does).

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <type_traits>

#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/detail/elementwise_step.cuh"
#include "tide/kernels/grad_norm/host.hpp"
#include "tide/kernels/scratch.hpp"
#include "tide/kernels/grad_norm/math.hpp"

namespace tide::kernels {

// Not tuned on a GPU (none where this was written). 256 threads x 4 blocks per SM with 16-byte
// loads keep enough bytes in flight for HBM; max_blocks bounds the partials (132 SMs x 4 = 528
// on an H100 SXM).
struct grad_norm_cuda_tuning {
  static constexpr int block = 256;
  static constexpr int blocks_per_sm = 4;
  static constexpr int max_blocks = 1024;
};

// Device memory the CUDA gradient norm writes; allocate one per stream that runs it.
struct grad_norm_scratch {
  double partial[grad_norm_cuda_tuning::max_blocks];  // stage 1: one sum per block
  double norm;                                        // stage 2: the global norm
  float clip_scale;                                   // min(1, max_norm / (norm + 1e-6)); NaN if norm is not
};

// Device code in detail's ABI namespace (see adamw/cuda.cuh for why not the other way round).
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

// Sum of squares of the elements of one tensor that thread `thread` of `threads` owns, the
// tensor's items starting at `offset` in the concatenation of all tensors' items.
template <class Grad>
__device__ double grad_record_squares(Grad const* g, index_t n, index_t thread, index_t threads, index_t offset) {
  constexpr int P = 16 / static_cast<int>(sizeof(Grad));  // elements per 128-bit load
  struct alignas(16) pack {
    Grad v[P];
  };
  bool const packed = reinterpret_cast<std::uintptr_t>(g) % 16 == 0;
  index_t const items = packed ? (n + P - 1) / P : n;
  index_t i = ((thread - offset) % threads + threads) % threads;
  double sum = 0;
  for (; i < items; i += threads) {
    if (!packed) {
      sum += grad_square(g[i]);
    } else if ((i + 1) * P <= n) {
      pack const x = reinterpret_cast<pack const*>(g)[i];
#pragma unroll
      for (int k = 0; k < P; ++k) sum += grad_square(x.v[k]);
    } else {
      for (index_t e = i * P; e < n; ++e) sum += grad_square(g[e]);
    }
  }
  return sum;
}

template <class Grad>
__device__ inline index_t grad_record_items(Grad const* g, index_t n) {
  constexpr int P = 16 / static_cast<int>(sizeof(Grad));
  return reinterpret_cast<std::uintptr_t>(g) % 16 == 0 ? (n + P - 1) / P : n;
}

using grad_norm_block_reduce = cub::BlockReduce<double, grad_norm_cuda_tuning::block>;

template <class Grad>
__global__ void __launch_bounds__(grad_norm_cuda_tuning::block)
    grad_norm_flat_kernel(Grad const* g, index_t n, double* partial) {
  __shared__ typename grad_norm_block_reduce::TempStorage temp;
  index_t const threads = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const thread = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  double const block_sum = grad_norm_block_reduce(temp).Sum(grad_record_squares(g, n, thread, threads, 0));
  if (threadIdx.x == 0) partial[blockIdx.x] = block_sum;
}

template <class Record>
__global__ void __launch_bounds__(grad_norm_cuda_tuning::block)
    grad_norm_list_kernel(Record const* records, index_t count, double* partial) {
  __shared__ typename grad_norm_block_reduce::TempStorage temp;
  index_t const threads = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const thread = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  index_t offset = 0;
  double sum = 0;
  for (index_t r = 0; r < count; ++r) {
    auto const* g = records[r].g;
    index_t const n = records[r].n;
    sum += grad_record_squares(g, n, thread, threads, offset);
    offset += grad_record_items(g, n);
  }
  double const block_sum = grad_norm_block_reduce(temp).Sum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = block_sum;
}

// Stage 2: thread j adds partials j, j + block, ... in order; the block reduction is fixed too.
__global__ void __launch_bounds__(grad_norm_cuda_tuning::block)
    grad_norm_finish_kernel(grad_norm_scratch* scratch, int blocks, float max_norm) {
  __shared__ typename grad_norm_block_reduce::TempStorage temp;
  double sum = 0;
  for (int j = static_cast<int>(threadIdx.x); j < blocks; j += static_cast<int>(blockDim.x)) sum += scratch->partial[j];
  double const total = grad_norm_block_reduce(temp).Sum(sum);
  if (threadIdx.x == 0) {
    double const norm = sqrt(total);
    scratch->norm = norm;
    scratch->clip_scale = clip_scale_of(norm, max_norm);
  }
}

inline int grad_norm_blocks(index_t items) {
  int device = 0, sms = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  index_t const full =
      std::min<index_t>(index_t{sms} * grad_norm_cuda_tuning::blocks_per_sm, grad_norm_cuda_tuning::max_blocks);
  if (items < 0) return static_cast<int>(full);
  index_t const needed = (items + grad_norm_cuda_tuning::block - 1) / grad_norm_cuda_tuning::block;
  return static_cast<int>(std::clamp<index_t>(needed, 1, full));
}

inline void grad_norm_finish(exec<tide::cuda> const& ex, grad_norm_scratch* scratch, int blocks, float max_norm) {
  grad_norm_finish_kernel<<<1, grad_norm_cuda_tuning::block, 0, ex.stream>>>(scratch, blocks, max_norm);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

inline void check_grad_norm_call(grad_norm_scratch const* scratch, float max_norm) {
  TIDE_REQUIRE(scratch != nullptr, "global_grad_norm needs a grad_norm_scratch in device memory; "
                                   "cudaMalloc one of sizeof(tide::kernels::grad_norm_scratch) bytes");
  TIDE_REQUIRE(max_norm > 0.f, "global_grad_norm needs max_norm > 0, got ", max_norm,
               "; pass +infinity to measure without clipping (clip_scale is then 1)");
}

TIDE_ABI_NAMESPACE_END
}  // namespace detail

TIDE_ABI_NAMESPACE_BEGIN

// Global norm of a device array of records, enqueued on ex.stream; scratch->norm and
// scratch->clip_scale hold the results when the stream reaches them.
template <class Record>
  requires GradientRecord<std::remove_const_t<Record>>
void global_grad_norm(exec<tide::cuda> const& ex, tensor_view<Record, tide::cuda> records, grad_norm_scratch* scratch,
                      float max_norm = INFINITY) {
  detail::check_grad_norm_call(scratch, max_norm);
  TIDE_REQUIRE(records.is_contiguous(), "global_grad_norm needs its records as a contiguous device array");
  int const blocks = detail::grad_norm_blocks(-1);
  detail::grad_norm_list_kernel<<<blocks, grad_norm_cuda_tuning::block, 0, ex.stream>>>(
      records.data(), records.size(), scratch->partial);
  TIDE_CUDA_CHECK(cudaGetLastError());
  detail::grad_norm_finish(ex, scratch, blocks, max_norm);
}

// Global norm of one flat chunk of gradients in device memory.
template <class Grad>
  requires Element<std::remove_const_t<Grad>>
void global_grad_norm(exec<tide::cuda> const& ex, tensor_view<Grad, tide::cuda> grads, grad_norm_scratch* scratch,
                      float max_norm = INFINITY) {
  detail::check_grad_norm_call(scratch, max_norm);
  TIDE_REQUIRE(grads.is_contiguous(), "global_grad_norm needs a contiguous view of the gradients");
  using grad = std::remove_const_t<Grad>;
  constexpr int pack = 16 / static_cast<int>(sizeof(grad));
  index_t const items = (grads.size() + pack - 1) / pack;
  int const blocks = detail::grad_norm_blocks(items);
  detail::grad_norm_flat_kernel<grad><<<blocks, grad_norm_cuda_tuning::block, 0, ex.stream>>>(
      grads.data(), grads.size(), scratch->partial);
  TIDE_CUDA_CHECK(cudaGetLastError());
  detail::grad_norm_finish(ex, scratch, blocks, max_norm);
}

// The host backend's form, which make_trainer calls: a host list of records whose gradients live
// on the device, and scratch of global_grad_norm_scratch_bytes in device memory (it holds the
// grad_norm_scratch). The records go to the device first (detail::with_device_records); returns
// the norm on the host, so it waits for the stream.
template <std::ranges::contiguous_range List>
  requires GradientRecord<std::ranges::range_value_t<List>>
std::size_t global_grad_norm_scratch_bytes(exec<tide::cuda> const&, List const&) {
  return sizeof(grad_norm_scratch);
}
template <std::ranges::contiguous_range List>
  requires GradientRecord<std::ranges::range_value_t<List>>
double global_grad_norm(exec<tide::cuda> const& ex, List const& grads, scratch<tide::cuda> ws) {
  auto const* records = detail::checked_grad_records(grads);
  detail::check_scratch("global_grad_norm", "global_grad_norm_scratch_bytes", ws, sizeof(grad_norm_scratch));
  if (std::ranges::empty(grads)) return 0.0;  // no kernel runs: the scratch holds nothing of this call
  auto* const s = reinterpret_cast<grad_norm_scratch*>(ws.data);
  using record = std::ranges::range_value_t<List>;
  detail::with_device_records(ex, std::span<record const>(records, static_cast<std::size_t>(std::ranges::size(grads))),
                              [&](auto device) { global_grad_norm(ex, device, s); });
  double norm = 0;
  TIDE_CUDA_CHECK(cudaMemcpyAsync(&norm, &s->norm, sizeof norm, cudaMemcpyDeviceToHost, ex.stream));
  TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
  return norm;
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
