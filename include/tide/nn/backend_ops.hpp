#pragma once
// The few operations nn/ needs besides the kernels: fill with zeros, scale in place (loss
// scaling), add in place (the tied gradient), copy a wte piece's columns of the logits, sum the
// per-row losses, check token ids. Only the host overloads exist. CUDA counterparts taking
// exec<cuda> (cudaMemsetAsync, a copy back of the losses, no token check: the ids are in device
// memory) are not written yet; with them the model would call the same names on either backend.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::nn::detail {

// x = 0, all bytes. Activation gradients start from zero because the kernels accumulate (+=).
template <class T>
void zero_fill(exec<host> const&, tensor_view<T> x) {
  if (x.size() != 0) std::memset(static_cast<void*>(x.data()), 0, x.bytes());
}

// x *= s (s a power of two in loss scaling: exact).
template <class T>
void scale_in_place(exec<host> const& ex, tensor_view<T> x, float s) {
  T* p = x.data();
  parallel_for(ex.pool, static_cast<std::size_t>(x.size()), [=](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) p[i] = from_float<T>(to_float(p[i]) * s);
  });
}

// x += y, elementwise (folding the head's wte gradient into wte's: the same bits on any threads).
template <class T>
void add_in_place(exec<host> const& ex, tensor_view<T> x, tensor_view<T const> y) {
  T* p = x.data();
  T const* q = y.data();
  parallel_for(ex.pool, static_cast<std::size_t>(x.size()), [=](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) p[i] = from_float<T>(to_float(p[i]) + to_float(q[i]));
  });
}

// wide[:, col : col + w] = narrow, wide (N, W), narrow (N, w): the LM head's logits of one wte piece.
template <class T>
void scatter_columns(exec<host> const& ex, tensor_view<T> wide, index_t col, tensor_view<T const> narrow) {
  index_t const W = wide.extent(1), w = narrow.extent(1);
  TIDE_REQUIRE(wide.extent(0) == narrow.extent(0) && col >= 0 && col + w <= W, "scatter_columns: columns [", col, ", ",
               col + w, ") of ", narrow.extent(0), " rows do not fit (", wide.extent(0), ", ", W, ")");
  T* p = wide.data();
  T const* q = narrow.data();
  parallel_for(ex.pool, static_cast<std::size_t>(wide.extent(0)), [=](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r) std::memcpy(p + r * W + col, q + r * w, static_cast<std::size_t>(w) * sizeof(T));
  });
}

// narrow = wide[:, col : col + w]: the gradient of one wte piece's logits.
template <class T>
void gather_columns(exec<host> const& ex, tensor_view<T> narrow, tensor_view<T const> wide, index_t col) {
  index_t const W = wide.extent(1), w = narrow.extent(1);
  TIDE_REQUIRE(wide.extent(0) == narrow.extent(0) && col >= 0 && col + w <= W, "gather_columns: columns [", col, ", ",
               col + w, ") of ", narrow.extent(0), " rows do not fit (", wide.extent(0), ", ", W, ")");
  T* p = narrow.data();
  T const* q = wide.data();
  parallel_for(ex.pool, static_cast<std::size_t>(wide.extent(0)), [=](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r) std::memcpy(p + r * w, q + r * W + col, static_cast<std::size_t>(w) * sizeof(T));
  });
}

// Sum of x in index order, in double: the same bits on every run and thread count.
inline double ordered_sum(exec<host> const&, tensor_view<float const> x) {
  double s = 0;
  float const* p = x.data();
  for (index_t i = 0; i < x.size(); ++i) s += static_cast<double>(p[i]);
  return s;
}

// Every id in [0, vocab); throws tide::error(usage) naming the first bad one. `what` names the
// tensor ("tokens", "targets").
inline void check_token_ids(exec<host> const&, char const* op, char const* what, tensor_view<std::int32_t const> ids,
                            index_t vocab) {
  std::int32_t const* p = ids.data();
  for (index_t i = 0; i < ids.size(); ++i)
    TIDE_REQUIRE(p[i] >= 0 && p[i] < vocab, op, ": ", what, "[", i / ids.extent(1), ", ", i % ids.extent(1), "] = ",
                 p[i], " is outside the vocabulary [0, ", vocab, ")");
}

}  // namespace tide::nn::detail
