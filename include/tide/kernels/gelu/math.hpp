#pragma once
// GELU, tanh form (GPT-2), per element, shared by the host loops and the CUDA kernels.
//
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//
// computed through 0.5 (1 + tanh u) = 1 / (1 + e^-2u) = s, the same function with one exp and
// one divide, no tanh. With e = e^-2|u| (in (0, 1], never overflows) and d = 1 / (1 + e):
//
//   s = d (u >= 0),  e d (u < 0);   s (1 - s) = e d^2
//   gelu(x)  = x s
//   gelu'(x) = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//
// The exp is detail::exp_poly_nonpositive (kernels/detail/exp.hpp), branch-free, so g++
// vectorises the host loops without -ffast-math or libm, and the CUDA kernels compute the same
// operations. NaN stays NaN; gelu(+inf) = +inf.

#include "tide/core/config.hpp"
#include "tide/kernels/detail/exp.hpp"

namespace tide::kernels {

inline constexpr float gelu_scale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float gelu_cubic = 0.044715f;

namespace detail {
// e^-2|u| and d = 1 / (1 + e^-2|u|), the two pieces of s = sigmoid(2u).
struct gelu_sigmoid {
  float e, d;
};
TIDE_HOST_DEVICE inline gelu_sigmoid gelu_parts(float u) noexcept {
  float const e = exp_poly_nonpositive(-2.0f * (u < 0.0f ? -u : u));
  return {e, 1.0f / (1.0f + e)};
}
}  // namespace detail

// gelu(x), tanh form: within 4u |x| of the exact tanh form (docs/kernels/gelu.md).
TIDE_HOST_DEVICE inline float gelu_tanh(float x) noexcept {
  float const u = gelu_scale * x * (1.0f + gelu_cubic * x * x);
  auto const [e, d] = detail::gelu_parts(u);
  // (u >= 0 ? 1 : e) * d, the select on bits so that g++ vectorises the loop without AVX-512's
  // masks (detail::pick, exp.hpp); 1 * d is d.
  return x * (detail::pick(u >= 0.0f, 1.0f, e) * d);
}

// d gelu(x) / dx of the tanh form.
TIDE_HOST_DEVICE inline float gelu_tanh_grad(float x) noexcept {
  float const x2 = x * x;
  float const u = gelu_scale * x * (1.0f + gelu_cubic * x2);
  auto const [e, d] = detail::gelu_parts(u);
  // A select, not a product, so that the sum below contracts into fma(2x e d² du, ., s) as before.
  float const s = detail::pick(u >= 0.0f, d, e * d);
  float const du = gelu_scale * (1.0f + 3.0f * gelu_cubic * x2);
  return s + 2.0f * x * (e * d * d) * du;
}

}  // namespace tide::kernels
