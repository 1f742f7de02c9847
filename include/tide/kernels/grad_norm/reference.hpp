#pragma once
// The scalar oracle for the global gradient norm: one running double sum over every element of
// every tensor in order, then a square root.

#include <algorithm>
#include <cmath>
#include <ranges>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/grad_norm/math.hpp"

namespace tide::kernels::reference {

template <std::ranges::input_range List>
  requires GradientRecord<std::ranges::range_value_t<List>>
double global_grad_norm(List const& grads) {
  double sum = 0;
  for (auto const& r : grads)
    for (index_t i = 0; i < r.n; ++i) {
      double const x = to_float(r.g[i]);
      sum += x * x;
    }
  return std::sqrt(sum);
}

template <class Grad>
  requires Element<std::remove_const_t<Grad>>
double global_grad_norm(tensor_view<Grad> grads) {
  TIDE_REQUIRE(grads.is_contiguous(), "reference::global_grad_norm needs a contiguous view");
  grad_tensor<std::remove_const_t<Grad>> const one[] = {{grads.data(), grads.size()}};
  return global_grad_norm(one);
}

template <std::ranges::input_range List>
  requires GradientRecord<std::ranges::range_value_t<List>>
bool any_non_finite(List const& grads) {
  for (auto const& r : grads)
    for (index_t i = 0; i < r.n; ++i)
      if (!std::isfinite(to_float(r.g[i]))) return true;
  return false;
}

// torch.nn.utils.clip_grad_norm_'s coefficient, NaN for a non-finite norm (see math.hpp).
inline float clip_scale(double norm, float max_norm) {
  if (!std::isfinite(norm)) return NAN;
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

}  // namespace tide::kernels::reference
