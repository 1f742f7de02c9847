#pragma once
// The scalar oracle for tide::kernels::softmax_*: one row at a time in double (std::exp, sums in
// double), rounded once to the element type at the end. Tests compare the host and CUDA paths
// with it; never fast. Inputs: contiguous views, the last dimension is the row (shape checks are
// the public entry's job; these only assert what they index).

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/softmax/math.hpp"

namespace tide::kernels::reference {

namespace detail {

// out row r = softmax(scale * inp row r) over its first mask.valid(r) columns, 0 after them.
template <Element T, class Mask>
void softmax_rows(tensor_view<T> out, tensor_view<T const> inp, float scale, Mask mask) {
  TIDE_REQUIRE(out.extents() == inp.extents() && out.rank() >= 1, "reference softmax: shapes differ");
  index_t const cols = inp.extent(inp.rank() - 1);
  index_t const rows = cols == 0 ? 0 : inp.size() / cols;
  for (index_t r = 0; r < rows; ++r) {
    T const* x = inp.data() + r * cols;
    T* y = out.data() + r * cols;
    index_t const n = mask.valid(r);
    double m = -std::numeric_limits<double>::infinity();
    for (index_t j = 0; j < n; ++j) m = std::fmax(m, double{scale} * to_float(x[j]));
    double s = 0;
    for (index_t j = 0; j < n; ++j) s += std::exp(double{scale} * to_float(x[j]) - m);
    for (index_t j = 0; j < cols; ++j) {
      double const p = j < n ? std::exp(double{scale} * to_float(x[j]) - m) / s : 0.0;
      y[j] = from_float<T>(static_cast<float>(p));
    }
  }
}

}  // namespace detail

// (R, L) or any rank, rows over the leading dimensions.
template <Element T>
void softmax_forward(tensor_view<T> out, std::type_identity_t<tensor_view<T const>> inp, float scale = 1.f) {
  index_t const cols = inp.rank() >= 1 ? inp.extent(inp.rank() - 1) : 0;
  detail::softmax_rows(out, inp, scale, kernels::detail::full_columns{cols});
}

// (..., T, T): row t of each block keeps columns 0..t.
template <Element T>
void softmax_forward_causal(tensor_view<T> out, std::type_identity_t<tensor_view<T const>> inp, float scale = 1.f) {
  TIDE_REQUIRE(inp.rank() >= 2, "reference causal softmax needs (..., T, T)");
  detail::softmax_rows(out, inp, scale, kernels::detail::causal_columns{inp.extent(inp.rank() - 1)});
}

// lengths (G): rows [g R/G, (g+1) R/G) keep their first lengths[g] columns.
template <Element T>
void softmax_forward_masked(tensor_view<T> out, std::type_identity_t<tensor_view<T const>> inp,
                            tensor_view<std::int32_t const> lengths, float scale = 1.f) {
  index_t const cols = inp.rank() >= 1 ? inp.extent(inp.rank() - 1) : 0;
  index_t const rows = cols == 0 ? 0 : inp.size() / cols;
  TIDE_REQUIRE(lengths.size() >= 1 && rows % lengths.size() == 0, "reference masked softmax: bad lengths");
  detail::softmax_rows(out, inp, scale, kernels::detail::length_columns{lengths.data(), rows / lengths.size()});
}

// dinp = scale * out * (dout - sum(dout * out)) per row, the sum in double.
template <Element T>
void softmax_backward(tensor_view<T> dinp, std::type_identity_t<tensor_view<T const>> out,
                      std::type_identity_t<tensor_view<T const>> dout, float scale = 1.f) {
  TIDE_REQUIRE(dinp.extents() == out.extents() && out.extents() == dout.extents() && out.rank() >= 1,
               "reference softmax_backward: shapes differ");
  index_t const cols = out.extent(out.rank() - 1);
  index_t const rows = cols == 0 ? 0 : out.size() / cols;
  for (index_t r = 0; r < rows; ++r) {
    T const* y = out.data() + r * cols;
    T const* dy = dout.data() + r * cols;
    T* dx = dinp.data() + r * cols;
    double dot = 0;
    for (index_t j = 0; j < cols; ++j) dot += double{to_float(y[j])} * to_float(dy[j]);
    for (index_t j = 0; j < cols; ++j) {
      double const g = double{scale} * to_float(y[j]) * (double{to_float(dy[j])} - dot);
      dx[j] = from_float<T>(static_cast<float>(g));
    }
  }
}

}  // namespace tide::kernels::reference
