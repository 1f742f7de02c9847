#pragma once
// The checks every softmax entry makes, on both backends, before touching memory: a bad call
// throws tide::error(usage) and writes nothing.

#include <cstdint>
#include <sstream>
#include <string>

#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels::detail {

inline std::string softmax_shape_text(shape const& s) {
  std::ostringstream os;
  os << '(';
  for (int d = 0; d < s.rank; ++d) os << (d ? ", " : "") << s.dims[d];
  os << ')';
  return os.str();
}

// Two views may be the same memory (in place) or disjoint, never partly overlapping.
template <class A, class B>
bool softmax_same_or_disjoint(A const& a, B const& b) noexcept {
  auto const pa = reinterpret_cast<std::uintptr_t>(a.data());
  auto const pb = reinterpret_cast<std::uintptr_t>(b.data());
  return a.empty() || b.empty() || pa == pb || pa + a.bytes() <= pb || pb + b.bytes() <= pa;
}

// `what`(name_a, name_b): equal shapes, rank >= 1, contiguous, same-or-disjoint memory.
template <class A, class B>
void softmax_check_pair(char const* what, char const* name_a, A const& a, char const* name_b, B const& b) {
  TIDE_REQUIRE(a.rank() >= 1, what, " needs rows: ", name_a, " has rank 0; pass at least (L)");
  TIDE_REQUIRE(a.extents() == b.extents(), what, " needs ", name_a, " and ", name_b, " of one shape, got ", name_a, " ",
               softmax_shape_text(a.extents()), " and ", name_b, " ", softmax_shape_text(b.extents()));
  TIDE_REQUIRE(a.is_contiguous() && b.is_contiguous(), what, " needs contiguous ", name_a, " and ", name_b,
               " (rows of L adjacent elements); copy a strided view first");
  TIDE_REQUIRE(softmax_same_or_disjoint(a, b), what, ": ", name_a, " and ", name_b,
               " partly overlap; pass the same memory (in place) or separate buffers");
}

// Rows of a contiguous view whose last dimension is the row: (R, L) from any rank >= 1.
template <class V>
index_t softmax_rows_of(V const& v) noexcept {
  index_t const cols = v.extent(v.rank() - 1);
  return cols == 0 ? 0 : v.size() / cols;
}

template <class V>
void softmax_check_causal(V const& inp) {
  TIDE_REQUIRE(inp.rank() >= 2 && inp.extent(inp.rank() - 2) == inp.extent(inp.rank() - 1),
               "softmax_forward_causal needs scores (..., T, T) with square trailing dimensions, got ",
               softmax_shape_text(inp.extents()), "; use softmax_forward_masked for other masks");
}

// lengths (G): G divides the row count R; every length in [0, L]. The host path reads the
// lengths here; the CUDA path checks only the shape (device memory), see softmax.hpp.
template <class V, class Lengths>
void softmax_check_lengths_shape(V const& inp, Lengths const& lengths) {
  index_t const rows = softmax_rows_of(inp);
  TIDE_REQUIRE(lengths.rank() == 1 && lengths.size() >= 1 && lengths.is_contiguous(),
               "softmax_forward_masked needs lengths (G) with G >= 1, got ", softmax_shape_text(lengths.extents()));
  TIDE_REQUIRE(rows % lengths.size() == 0, "softmax_forward_masked: ", lengths.size(), " lengths do not split the ",
               rows, " rows of ", softmax_shape_text(inp.extents()),
               " evenly; pass one length per row or per group of R / G consecutive rows");
}

template <class V, class Lengths>
void softmax_check_lengths_values(V const& inp, Lengths const& lengths) {
  index_t const cols = inp.extent(inp.rank() - 1);
  for (index_t g = 0; g < lengths.size(); ++g) {
    std::int32_t const n = lengths.data()[g];
    TIDE_REQUIRE(n >= 0 && n <= cols, "softmax_forward_masked: lengths[", g, "] = ", n, " is outside [0, ", cols,
                 "] for rows of ", cols, " columns");
  }
}

}  // namespace tide::kernels::detail
