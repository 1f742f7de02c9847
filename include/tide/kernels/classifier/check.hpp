#pragma once
// The checks the classifier entries make on both backends before touching memory: a bad call
// throws tide::error(usage) and writes nothing (losses and dlogits keep their contents).

#include <cstdint>

#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/softmax/check.hpp"

namespace tide::kernels::detail {

// (N, Vp) from any rank >= 1: the last dimension is the (padded) vocabulary.
template <class Logits, class Grads>
void classifier_check_logits(char const* what, char const* grads_name, Grads const& grads, Logits const& logits,
                             index_t vocab) {
  softmax_check_pair(what, grads_name, grads, "logits", logits);
  index_t const vp = logits.extent(logits.rank() - 1);
  TIDE_REQUIRE(vocab >= 1 && vocab <= vp, what, ": vocab ", vocab, " must be in [1, ", vp,
               "], the real columns of logits ", softmax_shape_text(logits.extents()), " (the rest is padding)");
}

template <class Rows, class Other>
void classifier_check_rows(char const* what, char const* name, Rows const& v, index_t rows, Other const& other) {
  TIDE_REQUIRE(v.size() == rows && v.is_contiguous(), what, " needs ", name, " contiguous with one element per row (",
               rows, "), got ", softmax_shape_text(v.extents()));
  auto const pv = reinterpret_cast<std::uintptr_t>(v.data());
  auto const po = reinterpret_cast<std::uintptr_t>(other.data());
  TIDE_REQUIRE(rows == 0 || pv + v.bytes() <= po || po + other.bytes() <= pv, what, ": ", name,
               " overlaps the logits; pass a separate buffer");
}

// Host only: the targets are host memory and are read here, before anything is written.
template <class Targets>
void classifier_check_targets(char const* what, Targets const& targets, index_t vocab) {
  std::int32_t const* t = targets.data();
  for (index_t r = 0; r < targets.size(); ++r)
    TIDE_REQUIRE(t[r] >= 0 && t[r] < vocab, what, ": targets[", r, "] = ", t[r], " is outside [0, ", vocab,
                 "); every target must be a real (unpadded) vocabulary column");
}

}  // namespace tide::kernels::detail
