#pragma once
// Per-row math of the blocked (flash-style) attention, shared by the host loops and the CUDA
// kernels so both round the same way.
//
// Online softmax over one query row whose scores arrive in blocks s_1, s_2, ...:
//   m   running max,  l = sum_j exp(s_j - m)
//   a block with max b:  m' = max(m, b),  alpha = exp(m - m'),  l' = l alpha + sum exp(s - m'),
//                        and whatever was accumulated with weights exp(s - m) is scaled by alpha
//   at the end:          softmax_j = exp(s_j - m) / l,   lse = m + log(l)
// The backward recomputes every probability from the saved lse alone: p_j = exp(s_j - lse).

#include <cmath>

#include "tide/core/config.hpp"
#include "tide/kernels/detail/exp.hpp"

namespace tide::kernels {

// 1 / sqrt(HS), the score scale, in float on both backends.
TIDE_HOST_DEVICE inline float attention_scale(long long head_size) noexcept {
  return 1.0f / sqrtf(static_cast<float>(head_size));
}

// The running (max, sum) of one row.
struct online_softmax {
  float max = -__builtin_huge_valf();
  float sum = 0.0f;

  // Moves to the max of (max, block_max) and returns alpha, the factor that rescales what was
  // accumulated so far; sum is rescaled here. Call only with a finite block_max (a block with at
  // least one score): -inf - -inf would be NaN. The first call returns exp(-inf) = 0.
  TIDE_HOST_DEVICE float rescale(float block_max) noexcept {
    float const m = block_max > max ? block_max : max;
    float const alpha = detail::exp_poly(max - m);
    sum *= alpha;
    max = m;
    return alpha;
  }

  // The weight of a score under the current max.
  TIDE_HOST_DEVICE float weight(float score) const noexcept { return detail::exp_poly(score - max); }

  // log(sum_j exp(s_j)), what the backward needs.
  TIDE_HOST_DEVICE float lse() const noexcept { return max + logf(sum); }
};

// The probability of a score from the saved lse (backward).
TIDE_HOST_DEVICE inline float attention_prob(float score, float lse) noexcept { return detail::exp_poly(score - lse); }

}  // namespace tide::kernels
