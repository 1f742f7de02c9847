#pragma once
// The scalar oracle for encoder_forward / encoder_backward: loops over (b, t, c), the backward
// sums in double per table element and rounds once. Shapes as in embedding.hpp.

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels::reference {

// out (B, T, C) = wte[tokens[b, t]] + wpe[t].
template <Element T>
void encoder_forward(tensor_view<T> out, tensor_view<std::int32_t const> tokens,
                     std::type_identity_t<tensor_view<T const>> wte, std::type_identity_t<tensor_view<T const>> wpe) {
  TIDE_REQUIRE(out.rank() == 3 && tokens.rank() == 2, "reference encoder_forward: bad shapes");
  for (index_t b = 0; b < out.extent(0); ++b)
    for (index_t t = 0; t < out.extent(1); ++t) {
      std::int32_t const v = tokens(b, t);
      TIDE_REQUIRE(v >= 0 && v < wte.extent(0), "reference encoder_forward: token out of range");
      for (index_t c = 0; c < out.extent(2); ++c)
        out(b, t, c) = from_float<T>(to_float(wte(index_t{v}, c)) + to_float(wpe(t, c)));
    }
}

// dwte (V, C) += sum over positions of each token; dwpe (maxT, C) += sum over b.
template <Element G, class D>
  requires Element<std::remove_const_t<D>>
void encoder_backward(tensor_view<G> dwte, tensor_view<G> dwpe, tensor_view<D> dout,
                      tensor_view<std::int32_t const> tokens) {
  TIDE_REQUIRE(dout.rank() == 3 && tokens.rank() == 2 && dwte.rank() == 2 && dwpe.rank() == 2,
               "reference encoder_backward: bad shapes");
  index_t const vocab = dwte.extent(0), c_len = dout.extent(2);
  std::vector<double> te(static_cast<std::size_t>(vocab * c_len), 0.0);
  std::vector<double> pe(static_cast<std::size_t>(dwpe.extent(0) * c_len), 0.0);
  for (index_t b = 0; b < dout.extent(0); ++b)
    for (index_t t = 0; t < dout.extent(1); ++t) {
      std::int32_t const v = tokens(b, t);
      TIDE_REQUIRE(v >= 0 && v < vocab, "reference encoder_backward: token out of range");
      for (index_t c = 0; c < c_len; ++c) {
        double const g = to_float(dout(b, t, c));
        te[static_cast<std::size_t>(v * c_len + c)] += g;
        pe[static_cast<std::size_t>(t * c_len + c)] += g;
      }
    }
  for (index_t v = 0; v < vocab; ++v)
    for (index_t c = 0; c < c_len; ++c)
      dwte(v, c) =
          from_float<G>(static_cast<float>(to_float(dwte(v, c)) + te[static_cast<std::size_t>(v * c_len + c)]));
  for (index_t t = 0; t < dwpe.extent(0); ++t)
    for (index_t c = 0; c < c_len; ++c)
      dwpe(t, c) =
          from_float<G>(static_cast<float>(to_float(dwpe(t, c)) + pe[static_cast<std::size_t>(t * c_len + c)]));
}

}  // namespace tide::kernels::reference
