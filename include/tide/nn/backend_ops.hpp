#pragma once
// The few operations nn/ needs besides the kernels: fill with zeros, scale in place (loss
// scaling), add in place (the tied gradient), copy a wte piece's columns of the logits, sum the
// per-row losses, check token ids. Overloads for tide::host and tide::sealed (the host ones,
// enqueued on the sealed compute stream over the aliases, as the kernels are: kernels/sealed.hpp;
// ordered_sum waits for its result; token ids in device memory are not checked on the host, the
// embedding kernel checks them on the device). The CUDA ones are in nn/backend_ops.cuh, included
// at the end of this file under nvcc: the model calls the same names on every backend.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/sealed.hpp"
#include "tide/memory/ops.hpp"

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

// dst[:, dst_col : dst_col + w] = src[:, src_col : src_col + w] for (N, *) views with the same
// rows: one wte piece's columns of the logits, out (forward) or in (backward).
inline void check_columns(index_t dst_rows, index_t D, index_t dst_col, index_t src_rows, index_t S, index_t src_col,
                          index_t w) {
  TIDE_REQUIRE(dst_rows == src_rows && w >= 0 && dst_col >= 0 && src_col >= 0 && dst_col + w <= D && src_col + w <= S,
               "copy_columns: columns [", src_col, ", ", src_col + w, ") of (", src_rows, ", ", S, ") to [", dst_col,
               ", ", dst_col + w, ") of (", dst_rows, ", ", D, ") do not fit");
}
template <class T>
void copy_columns(exec<host> const& ex, tensor_view<T> dst, index_t dst_col, tensor_view<T const> src, index_t src_col,
                  index_t w) {
  index_t const D = dst.extent(1), S = src.extent(1);
  check_columns(dst.extent(0), D, dst_col, src.extent(0), S, src_col, w);
  if (dst.extent(0) == 0 || w == 0) return;
  T* p = dst.data() + dst_col;
  T const* q = src.data() + src_col;
  parallel_for(ex.pool, static_cast<std::size_t>(dst.extent(0)), [=](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r) std::memcpy(p + r * D, q + r * S, static_cast<std::size_t>(w) * sizeof(T));
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

// ---- tide::sealed

template <class T>
void zero_fill(exec<sealed> const& ex, tensor_view<T, sealed> x) {
  memory::fill_zeros(ex, static_cast<void*>(x.data()), x.bytes());
}

template <class T>
void scale_in_place(exec<sealed> const& ex, tensor_view<T, sealed> x, float s) {
  kernels::detail::enqueue_on(ex, [](exec<host> const& h, tensor_view<T> a, float f) { scale_in_place(h, a, f); }, x, s);
}

template <class T>
void add_in_place(exec<sealed> const& ex, tensor_view<T, sealed> x, tensor_view<T const, sealed> y) {
  kernels::detail::enqueue_on(
      ex, [](exec<host> const& h, tensor_view<T> a, tensor_view<T const> b) { add_in_place(h, a, b); }, x, y);
}

template <class T>
void copy_columns(exec<sealed> const& ex, tensor_view<T, sealed> dst, index_t dst_col, tensor_view<T const, sealed> src,
                  index_t src_col, index_t w) {
  kernels::detail::enqueue_on(
      ex,
      [](exec<host> const& h, tensor_view<T> d, index_t dc, tensor_view<T const> s, index_t sc, index_t n) {
        copy_columns(h, d, dc, s, sc, n);
      },
      dst, dst_col, src, src_col, w);
}

inline double ordered_sum(exec<sealed> const& ex, tensor_view<float const, sealed> x) {
  return kernels::detail::result_of(
      ex, [](exec<host> const& h, tensor_view<float const> a) { return ordered_sum(h, a); }, x);
}

}  // namespace tide::nn::detail

#if defined(__CUDACC__)
#include "tide/nn/backend_ops.cuh"
#endif
