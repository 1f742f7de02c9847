#pragma once
// Per-row and per-element math of the fused classifier (softmax + cross-entropy + dlogits),
// shared by host.hpp and cuda.cuh.
//
// Row r of logits x (V real columns), target t, weight w (dloss):
//   m = max_j x_j,  s = sum_j exp(x_j - m),  loss = log s + m - x_t  (= -log softmax(x)_t)
//   dlogits_j = (exp(x_j - m) / s - [j == t]) * w   for j < V, and 0 for the padded j >= V.

#include <math.h>

#include <cstdint>

#include "tide/core/config.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/detail/exp.hpp"

namespace tide::kernels::detail {

TIDE_HOST_DEVICE inline float classifier_loss(float m, float sum, float target_logit) noexcept {
  return ::logf(sum) + (m - target_logit);
}

// (p - [j == t]) * w, p = e * (1 / s): the gradient of w * loss with respect to logit j.
TIDE_HOST_DEVICE inline float classifier_dlogit(float e, float inv_sum, bool is_target, float w) noexcept {
  return (e * inv_sum - (is_target ? 1.f : 0.f)) * w;
}

// A running (max, sum of exp(x - max)) over part of a row: one pass, for the CUDA kernel, where
// each thread folds its strided columns and a block reduction merges the partials.
struct max_sum {
  float m;  // -inf while empty
  float s;
};

TIDE_HOST_DEVICE inline max_sum max_sum_empty() noexcept { return {-__builtin_huge_valf(), 0.f}; }

TIDE_HOST_DEVICE inline max_sum max_sum_add(max_sum a, float x) noexcept {
  if (x == -__builtin_huge_valf()) return a;  // adds exp(-inf) = 0; avoids -inf - -inf
  if (x > a.m) return {x, fmadd(a.s, exp_poly_nonpositive(a.m - x), 1.f)};
  return {a.m, a.s + exp_poly_nonpositive(x - a.m)};
}

TIDE_HOST_DEVICE inline max_sum max_sum_merge(max_sum a, max_sum b) noexcept {
  if (a.m == -__builtin_huge_valf()) return b;
  if (b.m == -__builtin_huge_valf()) return a;
  float const m = a.m > b.m ? a.m : b.m;
  return {m, fmadd(a.s, exp_poly_nonpositive(a.m - m), b.s * exp_poly_nonpositive(b.m - m))};
}

// dloss per row: one weight for every row (1 / N by default) ...
struct uniform_weight {
  float w;
  TIDE_HOST_DEVICE constexpr float operator()(index_t) const noexcept { return w; }
};

// ... or one per row, dlosses (N).
struct row_weights {
  float const* w;
  TIDE_HOST_DEVICE constexpr float operator()(index_t row) const noexcept { return w[row]; }
};

}  // namespace tide::kernels::detail
