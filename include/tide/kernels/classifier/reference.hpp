#pragma once
// The scalar oracle for the classifier ops: one row at a time in double (std::exp, std::log,
// sums in double), rounded once at the end. Tests compare the host and CUDA paths with it.
// Shapes as in classifier.hpp; targets must be in [0, vocab) (asserted here too).

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels::reference {

// losses (N), dlogits (N, Vp) (may be logits), logits (N, Vp), targets (N); dlosses (N) the
// per-row weight, or a default (null) view for 1 / N.
template <Element T>
void fused_classifier(tensor_view<T> dlogits, tensor_view<float> losses,
                      std::type_identity_t<tensor_view<T const>> logits, tensor_view<std::int32_t const> targets,
                      index_t vocab, tensor_view<float const> dlosses = {}) {
  index_t const vp = logits.extent(logits.rank() - 1);
  index_t const rows = vp == 0 ? 0 : logits.size() / vp;
  TIDE_REQUIRE(dlogits.extents() == logits.extents() && targets.size() == rows && losses.size() == rows && vocab >= 1 &&
                   vocab <= vp && (dlosses.data() == nullptr || dlosses.size() == rows),
               "reference fused_classifier: bad shapes");
  for (index_t r = 0; r < rows; ++r) {
    T const* x = logits.data() + r * vp;
    T* d = dlogits.data() + r * vp;
    std::int32_t const t = targets.data()[r];
    TIDE_REQUIRE(t >= 0 && t < vocab, "reference fused_classifier: target ", t, " outside [0, ", vocab, ")");
    double const w = dlosses.data() == nullptr ? 1.0 / static_cast<double>(rows) : double{dlosses.data()[r]};
    double m = -std::numeric_limits<double>::infinity();
    for (index_t j = 0; j < vocab; ++j) m = std::fmax(m, double{to_float(x[j])});
    double s = 0;
    for (index_t j = 0; j < vocab; ++j) s += std::exp(double{to_float(x[j])} - m);
    double const xt = to_float(x[t]);
    losses.data()[r] = static_cast<float>(std::log(s) + m - xt);
    for (index_t j = 0; j < vp; ++j) {
      double const g = j < vocab ? (std::exp(double{to_float(x[j])} - m) / s - (j == t ? 1.0 : 0.0)) * w : 0.0;
      d[j] = from_float<T>(static_cast<float>(g));
    }
  }
}

// losses[r] = -log(probs[r, targets[r]]).
template <class T>
  requires Element<std::remove_const_t<T>>
void crossentropy_forward(tensor_view<float> losses, tensor_view<T> probs, tensor_view<std::int32_t const> targets,
                          index_t vocab) {
  index_t const vp = probs.extent(probs.rank() - 1);
  index_t const rows = vp == 0 ? 0 : probs.size() / vp;
  TIDE_REQUIRE(targets.size() == rows && losses.size() == rows && vocab >= 1 && vocab <= vp,
               "reference crossentropy_forward: bad shapes");
  for (index_t r = 0; r < rows; ++r) {
    std::int32_t const t = targets.data()[r];
    TIDE_REQUIRE(t >= 0 && t < vocab, "reference crossentropy_forward: target out of range");
    losses.data()[r] = static_cast<float>(-std::log(double{to_float(probs.data()[r * vp + t])}));
  }
}

// dlogits[r, j] = (probs[r, j] - [j == t]) * w for j < vocab, 0 after.
template <Element T>
void crossentropy_softmax_backward(tensor_view<T> dlogits, std::type_identity_t<tensor_view<T const>> probs,
                                   tensor_view<std::int32_t const> targets, index_t vocab,
                                   tensor_view<float const> dlosses = {}) {
  index_t const vp = probs.extent(probs.rank() - 1);
  index_t const rows = vp == 0 ? 0 : probs.size() / vp;
  TIDE_REQUIRE(dlogits.extents() == probs.extents() && targets.size() == rows && vocab >= 1 && vocab <= vp,
               "reference crossentropy_softmax_backward: bad shapes");
  for (index_t r = 0; r < rows; ++r) {
    std::int32_t const t = targets.data()[r];
    double const w = dlosses.data() == nullptr ? 1.0 / static_cast<double>(rows) : double{dlosses.data()[r]};
    for (index_t j = 0; j < vp; ++j) {
      double const p = to_float(probs.data()[r * vp + j]);
      double const g = j < vocab ? (p - (j == t ? 1.0 : 0.0)) * w : 0.0;
      dlogits.data()[r * vp + j] = from_float<T>(static_cast<float>(g));
    }
  }
}

}  // namespace tide::kernels::reference
