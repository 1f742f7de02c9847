#pragma once
// The CUDA path of tide::kernels::softmax_*: the same entry names with exec<cuda> and device
// views, enqueued on ex.stream. Per-element math from softmax/math.hpp (the host's).
//
// One kernel for every row length: a block takes K rows at once (TurboTransformers' batch
// reduction) and reduces their K partials in one cub::BlockReduce over an array of K floats,
// so each reduction round (shuffles, shared memory, barrier) serves K rows:
//   L <= 128:  32 threads, K = 4     (one warp: a row is at most 4 elements per thread)
//   L <= 512:  128 threads, K = 2
//   L <= 2048: 256 threads, K = 1
//   longer:    512 threads, K = 1, 128-bit loads and stores when rows are 16-byte aligned
// Three passes per row (max, sum of exp, write), re-reading the row from L1/L2; blocks walk
// row groups grid-stride. The reduction order depends only on the shape, so results repeat
// bit for bit from run to run.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cub/block/block_reduce.cuh>

#include "tide/core/config.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/softmax/check.hpp"
#include "tide/kernels/softmax/math.hpp"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels {

// Not tuned on a GPU (none where this was written): the thresholds follow TurboTransformers'
// dispatch (K = 4 / 2 / 1 as rows grow) and keep every thread at <= 4 elements per row up to
// L = 2048; blocks_per_sm bounds the grid of the grid-stride row loop.
struct softmax_cuda_tuning {
  static constexpr index_t k4_max_cols = 128;
  static constexpr index_t k2_max_cols = 512;
  static constexpr index_t k1_max_cols = 2048;
  static constexpr int blocks_per_sm = 16;
};

// Kernels live in detail's ABI namespace (not in a detail namespace inside tide::kernels' ABI
// namespace: a second `detail` visible from tide::kernels would make every `detail::` there
// ambiguous).
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

// K floats reduced as one value: one reduction round for K rows.
template <int K>
struct softmax_partials {
  float v[K];
};

template <int K>
struct softmax_partials_max {
  __device__ softmax_partials<K> operator()(softmax_partials<K> const& a, softmax_partials<K> const& b) const {
    softmax_partials<K> r;
#pragma unroll
    for (int k = 0; k < K; ++k) r.v[k] = fmaxf(a.v[k], b.v[k]);
    return r;
  }
};

template <int K>
struct softmax_partials_sum {
  __device__ softmax_partials<K> operator()(softmax_partials<K> const& a, softmax_partials<K> const& b) const {
    softmax_partials<K> r;
#pragma unroll
    for (int k = 0; k < K; ++k) r.v[k] = a.v[k] + b.v[k];
    return r;
  }
};

// Pack elements moved as one aligned load or store (16 bytes when Pack = 16 / sizeof(T)).
template <class T, int Pack>
struct alignas(sizeof(T) * Pack) softmax_pack {
  T v[Pack];
};

// f(j, float(x[j])) for the columns [0, n) this thread owns: whole packs strided over the
// block, then the tail element by element. Pack > 1 needs x aligned to a whole pack.
template <int Pack, class T, class F>
__device__ __forceinline__ void softmax_row_for_each(T const* __restrict__ x, index_t n, F&& f) {
  index_t const packs = n / Pack;
  auto const* p = reinterpret_cast<softmax_pack<T, Pack> const*>(x);
  for (index_t i = threadIdx.x; i < packs; i += blockDim.x) {
    softmax_pack<T, Pack> const a = p[i];
#pragma unroll
    for (int k = 0; k < Pack; ++k) f(i * Pack + k, to_float(a.v[k]));
  }
  for (index_t j = packs * Pack + threadIdx.x; j < n; j += blockDim.x) f(j, to_float(x[j]));
}

// y[j] = T(g(j, float(x[j]))) for the columns [0, cols) this thread owns; x and y may be the
// same memory (each element is read and written by one thread, read first).
template <int Pack, class T, class G>
__device__ __forceinline__ void softmax_row_transform(T* y, T const* x, index_t cols, G&& g) {
  index_t const packs = cols / Pack;
  auto const* p = reinterpret_cast<softmax_pack<T, Pack> const*>(x);
  auto* q = reinterpret_cast<softmax_pack<T, Pack>*>(y);
  for (index_t i = threadIdx.x; i < packs; i += blockDim.x) {
    softmax_pack<T, Pack> const a = p[i];
    softmax_pack<T, Pack> b;
#pragma unroll
    for (int k = 0; k < Pack; ++k) b.v[k] = from_float<T>(g(i * Pack + k, to_float(a.v[k])));
    q[i] = b;
  }
  for (index_t j = packs * Pack + threadIdx.x; j < cols; j += blockDim.x) y[j] = from_float<T>(g(j, to_float(x[j])));
}

// out rows [r0, r0 + K) = softmax of their first mask.valid(r) columns, 0 after them.
template <int Block, int K, int Pack, class T, class Mask>
__global__ void __launch_bounds__(Block)
    softmax_forward_kernel(T* out, T const* inp, index_t rows, index_t cols, float scale, Mask mask) {
  using reduce = cub::BlockReduce<softmax_partials<K>, Block>;
  __shared__ typename reduce::TempStorage temp;
  __shared__ float row_max[K], row_inv[K];
  for (index_t r0 = static_cast<index_t>(blockIdx.x) * K; r0 < rows; r0 += static_cast<index_t>(gridDim.x) * K) {
    index_t n[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      index_t const v = r0 + k < rows ? mask.valid(r0 + k) : 0;
      n[k] = v < 0 ? 0 : (v > cols ? cols : v);
    }
    softmax_partials<K> part;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float m = -__builtin_huge_valf();
      softmax_row_for_each<Pack>(inp + (r0 + k) * cols, n[k],
                                 [&](index_t, float x) { m = fmaxf(m, softmax_scaled(x, scale)); });
      part.v[k] = m;
    }
    softmax_partials<K> const m = reduce(temp).Reduce(part, softmax_partials_max<K>{});
    if (threadIdx.x == 0)
      for (int k = 0; k < K; ++k) row_max[k] = m.v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float s = 0.f;
      float const mk = row_max[k];
      softmax_row_for_each<Pack>(inp + (r0 + k) * cols, n[k],
                                 [&](index_t, float x) { s += softmax_exp(softmax_scaled(x, scale), mk); });
      part.v[k] = s;
    }
    softmax_partials<K> const s = reduce(temp).Reduce(part, softmax_partials_sum<K>{});
    if (threadIdx.x == 0)
      for (int k = 0; k < K; ++k) row_inv[k] = 1.f / s.v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (r0 + k >= rows) break;
      float const mk = row_max[k], inv = row_inv[k];
      index_t const nk = n[k];
      softmax_row_transform<Pack>(out + (r0 + k) * cols, inp + (r0 + k) * cols, cols, [&](index_t j, float x) {
        return j < nk ? softmax_normalise(softmax_exp(softmax_scaled(x, scale), mk), inv) : 0.f;
      });
    }
    __syncthreads();  // row_max / row_inv / temp are reused by the next row group
  }
}

// dinp rows [r0, r0 + K) = scale * out * (dout - sum(dout * out)).
template <int Block, int K, class T>
__global__ void __launch_bounds__(Block)
    softmax_backward_kernel(T* dinp, T const* out, T const* dout, index_t rows, index_t cols, float scale) {
  using reduce = cub::BlockReduce<softmax_partials<K>, Block>;
  __shared__ typename reduce::TempStorage temp;
  __shared__ float row_dot[K];
  for (index_t r0 = static_cast<index_t>(blockIdx.x) * K; r0 < rows; r0 += static_cast<index_t>(gridDim.x) * K) {
    softmax_partials<K> part;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float d = 0.f;
      if (r0 + k < rows) {
        T const* y = out + (r0 + k) * cols;
        T const* dy = dout + (r0 + k) * cols;
        for (index_t j = threadIdx.x; j < cols; j += blockDim.x) d += to_float(y[j]) * to_float(dy[j]);
      }
      part.v[k] = d;
    }
    softmax_partials<K> const dot = reduce(temp).Reduce(part, softmax_partials_sum<K>{});
    if (threadIdx.x == 0)
      for (int k = 0; k < K; ++k) row_dot[k] = dot.v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (r0 + k >= rows) break;
      T const* y = out + (r0 + k) * cols;
      T const* dy = dout + (r0 + k) * cols;
      T* dx = dinp + (r0 + k) * cols;
      float const dk = row_dot[k];
      for (index_t j = threadIdx.x; j < cols; j += blockDim.x)
        dx[j] = from_float<T>(softmax_grad(to_float(y[j]), to_float(dy[j]), dk, scale));
    }
    __syncthreads();
  }
}

inline unsigned softmax_grid(index_t groups) {
  int device = 0, sms = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return static_cast<unsigned>(std::clamp<index_t>(groups, 1, index_t{sms} * softmax_cuda_tuning::blocks_per_sm));
}

template <int Block, int K, int Pack, class T, class Mask>
void softmax_launch(cudaStream_t stream, T* out, T const* inp, index_t rows, index_t cols, float scale, Mask mask) {
  softmax_forward_kernel<Block, K, Pack, T, Mask>
      <<<softmax_grid((rows + K - 1) / K), Block, 0, stream>>>(out, inp, rows, cols, scale, mask);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

template <class T, class Mask>
void softmax_rows_cuda(cudaStream_t stream, T* out, T const* inp, index_t rows, index_t cols, float scale, Mask mask) {
  if (rows == 0 || cols == 0) return;
  using tuning = softmax_cuda_tuning;
  constexpr int pack = 16 / static_cast<int>(sizeof(T));
  if (cols <= tuning::k4_max_cols) return softmax_launch<32, 4, 1>(stream, out, inp, rows, cols, scale, mask);
  if (cols <= tuning::k2_max_cols) return softmax_launch<128, 2, 1>(stream, out, inp, rows, cols, scale, mask);
  if (cols <= tuning::k1_max_cols) return softmax_launch<256, 1, 1>(stream, out, inp, rows, cols, scale, mask);
  bool const aligned = cols % pack == 0 && reinterpret_cast<std::uintptr_t>(out) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(inp) % 16 == 0;
  if (aligned) return softmax_launch<512, 1, pack>(stream, out, inp, rows, cols, scale, mask);
  softmax_launch<512, 1, 1>(stream, out, inp, rows, cols, scale, mask);
}

TIDE_ABI_NAMESPACE_END
}  // namespace detail

TIDE_ABI_NAMESPACE_BEGIN

template <Element T>
void softmax_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out,
                     std::type_identity_t<tensor_view<T const, tide::cuda>> inp, float scale = 1.f) {
  detail::softmax_check_pair("softmax_forward", "out", out, "inp", inp);
  index_t const cols = inp.extent(inp.rank() - 1);
  detail::softmax_rows_cuda(ex.stream, out.data(), inp.data(), detail::softmax_rows_of(inp), cols, scale,
                            detail::full_columns{cols});
}

template <Element T>
void softmax_forward_causal(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out,
                            std::type_identity_t<tensor_view<T const, tide::cuda>> inp, float scale = 1.f) {
  detail::softmax_check_pair("softmax_forward_causal", "out", out, "inp", inp);
  detail::softmax_check_causal(inp);
  index_t const t = inp.extent(inp.rank() - 1);
  detail::softmax_rows_cuda(ex.stream, out.data(), inp.data(), detail::softmax_rows_of(inp), t, scale,
                            detail::causal_columns{t});
}

// lengths: device memory; their shape is checked, their values are clamped into [0, L].
template <Element T>
void softmax_forward_masked(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out,
                            std::type_identity_t<tensor_view<T const, tide::cuda>> inp,
                            tensor_view<std::int32_t const, tide::cuda> lengths, float scale = 1.f) {
  detail::softmax_check_pair("softmax_forward_masked", "out", out, "inp", inp);
  detail::softmax_check_lengths_shape(inp, lengths);
  index_t const rows = detail::softmax_rows_of(inp);
  detail::softmax_rows_cuda(ex.stream, out.data(), inp.data(), rows, inp.extent(inp.rank() - 1), scale,
                            detail::length_columns{lengths.data(), rows / lengths.size()});
}

template <Element T>
void softmax_backward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dinp,
                      std::type_identity_t<tensor_view<T const, tide::cuda>> out,
                      std::type_identity_t<tensor_view<T const, tide::cuda>> dout, float scale = 1.f) {
  detail::softmax_check_pair("softmax_backward", "dinp", dinp, "out", out);
  detail::softmax_check_pair("softmax_backward", "dinp", dinp, "dout", dout);
  index_t const cols = out.extent(out.rank() - 1);
  index_t const rows = detail::softmax_rows_of(out);
  if (rows == 0 || cols == 0) return;
  using tuning = softmax_cuda_tuning;
  auto launch = [&]<int Block, int K>() {
    detail::softmax_backward_kernel<Block, K, T><<<detail::softmax_grid((rows + K - 1) / K), Block, 0, ex.stream>>>(
        dinp.data(), out.data(), dout.data(), rows, cols, scale);
    TIDE_CUDA_CHECK(cudaGetLastError());
  };
  if (cols <= tuning::k4_max_cols)
    launch.template operator()<32, 4>();
  else if (cols <= tuning::k2_max_cols)
    launch.template operator()<128, 2>();
  else if (cols <= tuning::k1_max_cols)
    launch.template operator()<256, 1>();
  else
    launch.template operator()<512, 1>();
}

// The scratch protocol on CUDA: rows live in registers, so the query answers 0 and the forms
// with scratch check it and run the above.
inline std::size_t softmax_forward_scratch_bytes(exec<tide::cuda> const&, index_t, index_t) noexcept { return 0; }
template <Element T>
void softmax_forward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out,
                     std::type_identity_t<tensor_view<T const, tide::cuda>> inp, float scale, scratch<tide::cuda> ws) {
  detail::check_scratch("softmax_forward", "softmax_forward_scratch_bytes", ws, 0);
  softmax_forward(ex, out, inp, scale);
}
template <Element T>
void softmax_forward_causal(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out,
                            std::type_identity_t<tensor_view<T const, tide::cuda>> inp, float scale,
                            scratch<tide::cuda> ws) {
  detail::check_scratch("softmax_forward_causal", "softmax_forward_scratch_bytes", ws, 0);
  softmax_forward_causal(ex, out, inp, scale);
}
template <Element T>
void softmax_forward_masked(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> out,
                            std::type_identity_t<tensor_view<T const, tide::cuda>> inp,
                            tensor_view<std::int32_t const, tide::cuda> lengths, float scale, scratch<tide::cuda> ws) {
  detail::check_scratch("softmax_forward_masked", "softmax_forward_scratch_bytes", ws, 0);
  softmax_forward_masked(ex, out, inp, lengths, scale);
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
