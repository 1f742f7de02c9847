#pragma once
// The checks the embedding entries make on both backends before touching memory: a bad call
// throws tide::error(usage) and writes nothing.

#include <cstdint>
#include <sstream>
#include <string>

#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels::detail {

inline std::string encoder_shape_text(shape const& s) {
  std::ostringstream os;
  os << '(';
  for (int d = 0; d < s.rank; ++d) os << (d ? ", " : "") << s.dims[d];
  os << ')';
  return os.str();
}

// act (B, T, C), tokens (B, T), wpe (maxT, C) with maxT >= T; all contiguous.
template <class Act, class Tokens, class Wpe>
void encoder_check_act(char const* what, char const* act_name, Act const& act, Tokens const& tokens, Wpe const& wpe) {
  TIDE_REQUIRE(act.rank() == 3, what, " needs ", act_name, " (B, T, C), got ", encoder_shape_text(act.extents()));
  index_t const b = act.extent(0), t = act.extent(1), c = act.extent(2);
  TIDE_REQUIRE(tokens.rank() == 2 && tokens.extent(0) == b && tokens.extent(1) == t, what, " needs tokens (B, T) = (",
               b, ", ", t, ") to match ", act_name, " ", encoder_shape_text(act.extents()), ", got ",
               encoder_shape_text(tokens.extents()));
  TIDE_REQUIRE(wpe.rank() == 2 && wpe.extent(1) == c && wpe.extent(0) >= t, what,
               " needs the position table (maxT, C) with C = ", c, " and maxT >= T = ", t, ", got ",
               encoder_shape_text(wpe.extents()));
  TIDE_REQUIRE(act.is_contiguous() && tokens.is_contiguous() && wpe.is_contiguous(), what,
               " needs contiguous views; copy a strided one first");
}

// The same, and wte (V, C), contiguous.
template <class Act, class Tokens, class Wte, class Wpe>
void encoder_check_shapes(char const* what, char const* act_name, Act const& act, Tokens const& tokens, Wte const& wte,
                          Wpe const& wpe) {
  encoder_check_act(what, act_name, act, tokens, wpe);
  index_t const c = act.extent(2);
  TIDE_REQUIRE(wte.rank() == 2 && wte.extent(1) == c && wte.extent(0) >= 1, what,
               " needs the token table (V, C) with C = ", c, " and V >= 1, got ", encoder_shape_text(wte.extents()));
  TIDE_REQUIRE(wte.is_contiguous(), what, " needs contiguous views; copy a strided one first");
}

template <class A, class B>
bool encoder_disjoint(A const& a, B const& b) noexcept {
  auto const pa = reinterpret_cast<std::uintptr_t>(a.data());
  auto const pb = reinterpret_cast<std::uintptr_t>(b.data());
  return a.empty() || b.empty() || pa + a.bytes() <= pb || pb + b.bytes() <= pa;
}

// Host only: the tokens are host memory, read here before anything is written.
template <class Tokens>
void encoder_check_tokens(char const* what, Tokens const& tokens, index_t vocab) {
  std::int32_t const* tok = tokens.data();
  for (index_t i = 0; i < tokens.size(); ++i)
    TIDE_REQUIRE(tok[i] >= 0 && tok[i] < vocab, what, ": token ", tok[i], " at (", i / tokens.extent(1), ", ",
                 i % tokens.extent(1), ") is outside the table's [0, ", vocab, ")");
}

}  // namespace tide::kernels::detail
