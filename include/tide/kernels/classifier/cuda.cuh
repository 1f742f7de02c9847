#pragma once
// The CUDA path of the classifier ops: the same entry names with exec<cuda> and device views,
// enqueued on ex.stream. Per-element math from classifier/math.hpp (the host's).
//
// fused_classifier: one block per row (grid-stride over rows). Pass 1 reads the row once, each
// thread folding its strided columns into an online (max, sum of exp) pair (max_sum_add); one
// cub::BlockReduce merges the pairs (max_sum_merge). Pass 2 re-reads the row (L2-resident at
// V = 50257: 200 KiB) and writes dlogits, 128-bit loads/stores when the rows are aligned. In
// place is safe: the target logit is read before the reduction's barrier, and every other
// element is read and written by the same thread, read first.
// A target outside [0, V) cannot throw here: that row's loss and dlogits become NaN.

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
#include "tide/kernels/classifier/check.hpp"
#include "tide/kernels/classifier/math.hpp"
#include "tide/kernels/softmax/cuda.cuh"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels {

// Not tuned on a GPU: 512 threads put ~100 columns per thread at V = 50257 (llm.c's fused
// classifier uses 512 or 1024); one block per row with up to blocks_per_sm resident.
struct classifier_cuda_tuning {
  static constexpr int block = 512;
  static constexpr int blocks_per_sm = 4;
};

namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

struct max_sum_merge_op {
  __device__ max_sum operator()(max_sum const& a, max_sum const& b) const { return max_sum_merge(a, b); }
};

template <int Block, int Pack, class T, class Weight>
__global__ void __launch_bounds__(Block)
    fused_classifier_kernel(T* dlogits, float* losses, T const* logits, std::int32_t const* targets, index_t rows,
                            index_t vocab, index_t vp, Weight weight) {
  using reduce = cub::BlockReduce<max_sum, Block>;
  __shared__ typename reduce::TempStorage temp;
  __shared__ float row_max, row_inv;
  float const nan = __builtin_nanf("");
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T const* x = logits + r * vp;
    std::int32_t const t = targets[r];
    bool const valid = t >= 0 && t < vocab;
    float const xt = threadIdx.x == 0 && valid ? to_float(x[t]) : nan;  // read before any write
    max_sum part = max_sum_empty();
    softmax_row_for_each<Pack>(x, vocab, [&](index_t, float v) { part = max_sum_add(part, v); });
    max_sum const total = reduce(temp).Reduce(part, max_sum_merge_op{});
    if (threadIdx.x == 0) {
      losses[r] = valid ? classifier_loss(total.m, total.s, xt) : nan;
      row_max = total.m;
      row_inv = 1.f / total.s;
    }
    __syncthreads();
    float const m = row_max, inv = row_inv;
    float const w = valid ? weight(r) : nan;
    softmax_row_transform<Pack>(dlogits + r * vp, x, vp, [&](index_t j, float v) {
      return j < vocab ? classifier_dlogit(softmax_exp(v, m), inv, j == t, w) : 0.f;
    });
    __syncthreads();  // row_max / row_inv / temp are reused by the next row
  }
}

// losses[r] = -log probs[r, t] (NaN for a target outside [0, V)).
template <class T>
__global__ void crossentropy_forward_kernel(float* losses, T const* probs, std::int32_t const* targets, index_t rows,
                                            index_t vocab, index_t vp) {
  for (index_t r = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += static_cast<index_t>(gridDim.x) * blockDim.x) {
    std::int32_t const t = targets[r];
    losses[r] = t >= 0 && t < vocab ? -::logf(to_float(probs[r * vp + t])) : __builtin_nanf("");
  }
}

template <int Block, int Pack, class T>
__global__ void __launch_bounds__(Block)
    crossentropy_softmax_backward_kernel(T* dlogits, T const* probs, std::int32_t const* targets, index_t rows,
                                         index_t vocab, index_t vp, float dloss) {
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    std::int32_t const t = targets[r];
    float const w = t >= 0 && t < vocab ? dloss : __builtin_nanf("");
    softmax_row_transform<Pack>(dlogits + r * vp, probs + r * vp, vp, [&](index_t j, float p) {
      return j < vocab ? classifier_dlogit(p, 1.f, j == t, w) : 0.f;
    });
  }
}

inline unsigned classifier_grid(index_t rows) {
  int device = 0, sms = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return static_cast<unsigned>(std::clamp<index_t>(rows, 1, index_t{sms} * 32));
}

template <class T>
bool classifier_rows_aligned(T const* a, T const* b, index_t vp) {
  constexpr int pack = 16 / static_cast<int>(sizeof(T));
  return vp % pack == 0 && reinterpret_cast<std::uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(b) % 16 == 0;
}

template <class T, class Weight>
void fused_classifier_cuda(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dlogits,
                           tensor_view<float, tide::cuda> losses, tensor_view<T const, tide::cuda> logits,
                           tensor_view<std::int32_t const, tide::cuda> targets, index_t vocab, Weight weight) {
  char const* what = "fused_classifier";
  classifier_check_logits(what, "dlogits", dlogits, logits, vocab);
  index_t const rows = softmax_rows_of(logits);
  classifier_check_rows(what, "losses", losses, rows, logits);
  classifier_check_rows(what, "losses", losses, rows, dlogits);
  classifier_check_rows(what, "targets", targets, rows, dlogits);
  if (rows == 0) return;
  constexpr int block = classifier_cuda_tuning::block;
  constexpr int pack = 16 / static_cast<int>(sizeof(T));
  index_t const vp = logits.extent(logits.rank() - 1);
  unsigned const grid = classifier_grid(rows);
  if (classifier_rows_aligned(dlogits.data(), logits.data(), vp))
    fused_classifier_kernel<block, pack><<<grid, block, 0, ex.stream>>>(dlogits.data(), losses.data(), logits.data(),
                                                                        targets.data(), rows, vocab, vp, weight);
  else
    fused_classifier_kernel<block, 1><<<grid, block, 0, ex.stream>>>(dlogits.data(), losses.data(), logits.data(),
                                                                     targets.data(), rows, vocab, vp, weight);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

TIDE_ABI_NAMESPACE_END
}  // namespace detail

TIDE_ABI_NAMESPACE_BEGIN

template <Element T>
void fused_classifier(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dlogits,
                      tensor_view<float, tide::cuda> losses,
                      std::type_identity_t<tensor_view<T const, tide::cuda>> logits,
                      tensor_view<std::int32_t const, tide::cuda> targets, index_t vocab, float dloss) {
  detail::fused_classifier_cuda(ex, dlogits, losses, logits, targets, vocab, detail::uniform_weight{dloss});
}

template <Element T>
void fused_classifier(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dlogits,
                      tensor_view<float, tide::cuda> losses,
                      std::type_identity_t<tensor_view<T const, tide::cuda>> logits,
                      tensor_view<std::int32_t const, tide::cuda> targets, index_t vocab) {
  index_t const rows = logits.rank() >= 1 ? detail::softmax_rows_of(logits) : 0;
  float const dloss = rows == 0 ? 0.f : 1.f / static_cast<float>(rows);
  detail::fused_classifier_cuda(ex, dlogits, losses, logits, targets, vocab, detail::uniform_weight{dloss});
}

template <Element T>
void fused_classifier(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dlogits,
                      tensor_view<float, tide::cuda> losses,
                      std::type_identity_t<tensor_view<T const, tide::cuda>> logits,
                      tensor_view<std::int32_t const, tide::cuda> targets, index_t vocab,
                      tensor_view<float const, tide::cuda> dlosses) {
  index_t const rows = logits.rank() >= 1 ? detail::softmax_rows_of(logits) : 0;
  detail::classifier_check_rows("fused_classifier", "dlosses", dlosses, rows, dlogits);
  detail::fused_classifier_cuda(ex, dlogits, losses, logits, targets, vocab, detail::row_weights{dlosses.data()});
}

template <class T>
  requires Element<std::remove_const_t<T>>
void crossentropy_forward(exec<tide::cuda> const& ex, tensor_view<float, tide::cuda> losses,
                          tensor_view<T, tide::cuda> probs, tensor_view<std::int32_t const, tide::cuda> targets,
                          index_t vocab) {
  char const* what = "crossentropy_forward";
  detail::classifier_check_logits(what, "probs", probs, probs, vocab);
  index_t const rows = detail::softmax_rows_of(probs);
  detail::classifier_check_rows(what, "losses", losses, rows, probs);
  detail::classifier_check_rows(what, "targets", targets, rows, probs);
  if (rows == 0) return;
  constexpr int block = 256;
  unsigned const grid = detail::classifier_grid((rows + block - 1) / block);
  detail::crossentropy_forward_kernel<<<grid, block, 0, ex.stream>>>(losses.data(), probs.data(), targets.data(), rows,
                                                                     vocab, probs.extent(probs.rank() - 1));
  TIDE_CUDA_CHECK(cudaGetLastError());
}

template <Element T>
void crossentropy_softmax_backward(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dlogits,
                                   std::type_identity_t<tensor_view<T const, tide::cuda>> probs,
                                   tensor_view<std::int32_t const, tide::cuda> targets, index_t vocab, float dloss) {
  char const* what = "crossentropy_softmax_backward";
  detail::classifier_check_logits(what, "dlogits", dlogits, probs, vocab);
  index_t const rows = detail::softmax_rows_of(probs);
  detail::classifier_check_rows(what, "targets", targets, rows, probs);
  if (rows == 0) return;
  constexpr int block = classifier_cuda_tuning::block;
  constexpr int pack = 16 / static_cast<int>(sizeof(T));
  index_t const vp = probs.extent(probs.rank() - 1);
  unsigned const grid = detail::classifier_grid(rows);
  if (detail::classifier_rows_aligned(dlogits.data(), probs.data(), vp))
    detail::crossentropy_softmax_backward_kernel<block, pack>
        <<<grid, block, 0, ex.stream>>>(dlogits.data(), probs.data(), targets.data(), rows, vocab, vp, dloss);
  else
    detail::crossentropy_softmax_backward_kernel<block, 1>
        <<<grid, block, 0, ex.stream>>>(dlogits.data(), probs.data(), targets.data(), rows, vocab, vp, dloss);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// The scratch protocol on CUDA: a row is one block's, in registers and shared memory, so the
// query answers 0 and the forms with scratch check it and run the above.
inline std::size_t fused_classifier_scratch_bytes(exec<tide::cuda> const&, index_t, index_t) noexcept { return 0; }
template <Element T>
void fused_classifier(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dlogits,
                      tensor_view<float, tide::cuda> losses,
                      std::type_identity_t<tensor_view<T const, tide::cuda>> logits,
                      tensor_view<std::int32_t const, tide::cuda> targets, index_t vocab, float dloss,
                      scratch<tide::cuda> ws) {
  detail::check_scratch("fused_classifier", "fused_classifier_scratch_bytes", ws, 0);
  fused_classifier(ex, dlogits, losses, logits, targets, vocab, dloss);
}
template <Element T>
void fused_classifier(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dlogits,
                      tensor_view<float, tide::cuda> losses,
                      std::type_identity_t<tensor_view<T const, tide::cuda>> logits,
                      tensor_view<std::int32_t const, tide::cuda> targets, index_t vocab, scratch<tide::cuda> ws) {
  detail::check_scratch("fused_classifier", "fused_classifier_scratch_bytes", ws, 0);
  fused_classifier(ex, dlogits, losses, logits, targets, vocab);
}
template <Element T>
void fused_classifier(exec<tide::cuda> const& ex, tensor_view<T, tide::cuda> dlogits,
                      tensor_view<float, tide::cuda> losses,
                      std::type_identity_t<tensor_view<T const, tide::cuda>> logits,
                      tensor_view<std::int32_t const, tide::cuda> targets, index_t vocab,
                      tensor_view<float const, tide::cuda> dlosses, scratch<tide::cuda> ws) {
  detail::check_scratch("fused_classifier", "fused_classifier_scratch_bytes", ws, 0);
  fused_classifier(ex, dlogits, losses, logits, targets, vocab, dlosses);
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
