#pragma once
// Per-element and per-row softmax math shared by host.hpp and cuda.cuh, so both backends round
// each element alike (the row sums differ only in their summation order).
//
// A row of L columns: z_j = fl(scale * x_j), m = max_j z_j over the valid columns,
// e_j = exp_poly_nonpositive(z_j - m), s = sum_j e_j, y_j = e_j * (1 / s); masked columns
// give y_j = 0.

#include <cstdint>

#include "tide/core/config.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/detail/exp.hpp"

namespace tide::kernels::detail {

// Which leading columns of row r take part; the columns after them output 0. Rows are counted
// over all leading dimensions of the tensor (row r of an (R, L) view).

// Every column.
struct full_columns {
  index_t cols;
  TIDE_HOST_DEVICE constexpr index_t valid(index_t) const noexcept { return cols; }
};

// Causal attention scores (..., T, T): row t of each T x T block keeps columns 0..t.
struct causal_columns {
  index_t t;
  TIDE_HOST_DEVICE constexpr index_t valid(index_t row) const noexcept { return row % t + 1; }
};

// Per-group valid lengths: rows [g * rows_per_length, (g + 1) * rows_per_length) keep the first
// lengths[g] columns (one length per row, or per sequence of (B, NH, T, T) scores).
struct length_columns {
  std::int32_t const* lengths;
  index_t rows_per_length;
  TIDE_HOST_DEVICE constexpr index_t valid(index_t row) const noexcept { return lengths[row / rows_per_length]; }
};

// z = fl(scale * x): the scaled logit the row max and the exponent both use.
TIDE_HOST_DEVICE inline float softmax_scaled(float x, float scale) noexcept { return scale * x; }

// e = exp(z - m), m the row max of z: the argument is <= 0, every e in [0, 1].
TIDE_HOST_DEVICE inline float softmax_exp(float z, float m) noexcept { return exp_poly_nonpositive(z - m); }

// y = e * (1 / s): one reciprocal per row, then a multiply per element.
TIDE_HOST_DEVICE inline float softmax_normalise(float e, float inv_sum) noexcept { return e * inv_sum; }

// dx = scale * y * (dy - dot), dot = sum_j dy_j y_j over the row.
TIDE_HOST_DEVICE inline float softmax_grad(float y, float dy, float dot, float scale) noexcept {
  return scale * (y * (dy - dot));
}

}  // namespace tide::kernels::detail
