#pragma once
// The global gradient norm's shared pieces: the record type, the per-element square both
// backends accumulate, and the clip scale (host and the CUDA second stage compute it alike).

#include <concepts>
#include <type_traits>
#include <utility>

#include "tide/core/config.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels {

// One gradient tensor of a list: n elements at g, in the memory of the backend that reads it.
template <Element Grad = float>
struct grad_tensor {
  Grad const* g = nullptr;
  index_t n = 0;
};

template <class Record>
using gradient_of_t = std::remove_cvref_t<decltype(*std::declval<Record const&>().g)>;

// Anything with a gradient pointer `g` and a size `n`: grad_tensor, and adamw_tensor, so the
// list an AdamW step takes can be normed as is.
template <class Record>
concept GradientRecord = requires(Record const& r) {
  { r.n } -> std::convertible_to<index_t>;
  *r.g;
} && Element<gradient_of_t<Record>>;

// g^2 in double: exact (a float's 24-bit significand squared fits double's 53 bits), so an
// accumulation acc + g*g rounds the same whether or not the compiler fuses it into an FMA.
template <Element Grad>
TIDE_HOST_DEVICE inline double grad_square(Grad g) {
  double const d = static_cast<double>(to_float(g));
  return d * d;
}

namespace detail {
// min(1, max_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_ computes it, but NaN for
// a non-finite norm (some gradient overflowed): adamw refuses a NaN scale on the host and
// skips the step when a CUDA device scale is NaN, where PyTorch would write NaN gradients.
TIDE_HOST_DEVICE inline float clip_scale_of(double norm, float max_norm) {
  if (!(norm <= 1.7976931348623157e308)) return tide::detail::float_of(0x7fc00000u);  // Inf or NaN
  double const s = static_cast<double>(max_norm) / (norm + 1e-6);
  return s < 1.0 ? static_cast<float>(s) : 1.f;
}
}  // namespace detail

}  // namespace tide::kernels
