#pragma once
// The host path of tide::kernels::softmax_*: threaded over rows (parallel_for, contiguous
// slices), each row by one thread in three passes over a float scratch row:
//   1. z = scale * x (converted from T), and the row max in 16 fixed lanes;
//   2. z = exp(z - m) in place, and the row sum in the same 16 lanes;
//   3. y = T(z * (1 / s)), then 0 in the masked columns.
// Passes 1 and 2 go tile by tile (1024 columns, 4 KiB of scratch that stays in L1). Every loop
// is one g++ -O3 vectorises: plain element loops, and reductions over a fixed-width block of
// lane accumulators, so the order of the row sum is fixed by the code, not by the thread count
// or the vector width: results are bit-identical for any number of threads.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/scratch.hpp"
#include "tide/kernels/softmax/check.hpp"
#include "tide/kernels/softmax/math.hpp"

// Loop hints for g++ (nvcc and other compilers would warn about an unknown pragma).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#  define TIDE_PRAGMA_ROLLED _Pragma("GCC unroll 1")
#  define TIDE_PRAGMA_IVDEP _Pragma("GCC ivdep")
#else
#  define TIDE_PRAGMA_ROLLED
#  define TIDE_PRAGMA_IVDEP
#endif

namespace tide::kernels {

// Host tuning. 16 lanes = two AVX2 or one AVX-512 register of independent max / sum chains;
// these passes are a small part of a row next to exp (microbenchmark of one 50257-column row:
// load + max ~0.6, exp + sum ~2.3, store ~0.5 ns/elem on a loaded 2-vCPU VM). Tiles of 1024
// columns keep the scratch of passes 1-2 in L1; reading x again in pass 2 instead of keeping
// its float copy measured no faster.
struct softmax_tuning {
  static constexpr int lanes = 16;
  static constexpr index_t tile = 1024;
  static_assert(tile % lanes == 0, "tiles hold whole lane blocks, so the lane order does not depend on tiling");
};

namespace detail {

inline constexpr int softmax_lanes = softmax_tuning::lanes;

// acc[k] = max(acc[k], z[b * lanes + k]) over `blocks` whole blocks. The inner loop is kept
// rolled so the vectoriser sees an element-wise max, not a max reduction (which g++ only
// vectorises under -ffast-math).
inline void softmax_lanes_max(float* __restrict acc, float const* __restrict z, index_t blocks) noexcept {
  for (index_t b = 0; b < blocks; ++b) {
    float const* p = z + b * softmax_lanes;
    TIDE_PRAGMA_ROLLED
    for (int k = 0; k < softmax_lanes; ++k) acc[k] = acc[k] < p[k] ? p[k] : acc[k];
  }
}

// acc[k] += z[b * lanes + k] over `blocks` whole blocks.
inline void softmax_lanes_sum(float* __restrict acc, float const* __restrict z, index_t blocks) noexcept {
  for (index_t b = 0; b < blocks; ++b) {
    float const* p = z + b * softmax_lanes;
    TIDE_PRAGMA_ROLLED
    for (int k = 0; k < softmax_lanes; ++k) acc[k] += p[k];
  }
}

// The lanes added pairwise in a fixed tree.
inline float softmax_lanes_total(float* acc) noexcept {
  for (int w = softmax_lanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

template <class T>
void softmax_load_scaled(float* __restrict z, T const* __restrict x, index_t n, float scale) noexcept {
  for (index_t j = 0; j < n; ++j) z[j] = softmax_scaled(to_float(x[j]), scale);
}

inline void softmax_exp_inplace(float* __restrict z, index_t n, float m) noexcept {
  for (index_t j = 0; j < n; ++j) z[j] = softmax_exp(z[j], m);
}

// Pass 1: z[j] = scale * x[j] for j < n; returns max_j z[j] (-inf when n = 0).
template <class T>
float softmax_row_load_max(float* z, T const* x, index_t n, float scale) noexcept {
  constexpr index_t tile = softmax_tuning::tile;
  index_t const full = n / softmax_lanes * softmax_lanes;
  float acc[softmax_lanes];
  for (float& a : acc) a = -__builtin_huge_valf();
  for (index_t t0 = 0; t0 < n; t0 += tile) {
    index_t const t1 = std::min(n, t0 + tile);
    softmax_load_scaled(z + t0, x + t0, t1 - t0, scale);
    softmax_lanes_max(acc, z + t0, (std::min(t1, full) - t0) / softmax_lanes);
  }
  float m = acc[0];
  for (int k = 1; k < softmax_lanes; ++k) m = m < acc[k] ? acc[k] : m;
  for (index_t j = full; j < n; ++j) m = m < z[j] ? z[j] : m;
  return m;
}

// Pass 2: z[j] = exp(z[j] - m) for j < n; returns the sum: lane k adds columns k, k + 16, ...
// of the whole blocks in order, the lanes meet in a fixed tree, then the tail adds in order.
inline float softmax_row_exp_sum(float* z, index_t n, float m) noexcept {
  constexpr index_t tile = softmax_tuning::tile;
  index_t const full = n / softmax_lanes * softmax_lanes;
  float acc[softmax_lanes] = {};
  for (index_t t0 = 0; t0 < n; t0 += tile) {
    index_t const t1 = std::min(n, t0 + tile);
    softmax_exp_inplace(z + t0, t1 - t0, m);
    softmax_lanes_sum(acc, z + t0, (std::min(t1, full) - t0) / softmax_lanes);
  }
  float s = softmax_lanes_total(acc);
  for (index_t j = full; j < n; ++j) s += z[j];
  return s;
}

// Pass 3: y[j] = T(e[j] / s) for j < n, 0 for n <= j < cols.
template <class T>
void softmax_row_store(T* __restrict y, float const* __restrict e, index_t n, index_t cols, float inv_sum) noexcept {
  for (index_t j = 0; j < n; ++j) y[j] = from_float<T>(softmax_normalise(e[j], inv_sum));
  for (index_t j = n; j < cols; ++j) y[j] = from_float<T>(0.f);
}

// One row; `z` is float scratch of at least n. y may be x (in place): x is read in full
// before y is written.
template <class T>
void softmax_row(T* y, T const* x, float* z, index_t n, index_t cols, float scale) noexcept {
  if (n == 0) {
    softmax_row_store(y, z, 0, cols, 0.f);
    return;
  }
  float const m = softmax_row_load_max(z, x, n, scale);
  float const s = softmax_row_exp_sum(z, n, m);
  softmax_row_store(y, z, n, cols, 1.f / s);
}

// Every row of (rows, cols), one slice of rows per thread, one scratch row per slice: `scratch`
// holds softmax_slices(pool, rows) rows of cols floats.
inline int softmax_slices(thread_pool const& pool, index_t rows) noexcept {
  return static_cast<int>(std::min<index_t>(pool.threads(), rows));
}
template <class T, class Mask>
void softmax_rows(thread_pool& pool, T* out, T const* inp, index_t rows, index_t cols, float scale, Mask mask,
                  float* scratch) {
  if (rows == 0 || cols == 0) return;
  int const slices = softmax_slices(pool, rows);
  parallel_for(pool, static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    auto const t = thread_pool::slice_at(static_cast<std::size_t>(rows), slices, begin);
    float* const z = scratch + static_cast<index_t>(t) * cols;
    for (auto r = static_cast<index_t>(begin); r < static_cast<index_t>(end); ++r)
      softmax_row(out + r * cols, inp + r * cols, z, mask.valid(r), cols, scale);
  });
}

// dot = sum_j y[j] dy[j] in the lane order of softmax_row_exp_sum, through a stack tile of
// products; then dx[j] = scale * y[j] (dy[j] - dot). dx may be y or dy (in place): each element
// is read before it is written, and only by its own iteration (hence ivdep, no __restrict).
template <class T>
void softmax_backward_row(T* dx, T const* y, T const* dy, index_t cols, float scale) noexcept {
  constexpr index_t tile = softmax_tuning::tile;
  float prod[tile];
  index_t const full = cols / softmax_lanes * softmax_lanes;
  float acc[softmax_lanes] = {};
  float tail = 0.f;
  for (index_t t0 = 0; t0 < cols; t0 += tile) {
    index_t const t1 = std::min(cols, t0 + tile);
    for (index_t j = t0; j < t1; ++j) prod[j - t0] = to_float(y[j]) * to_float(dy[j]);
    index_t const b1 = std::min(t1, full);
    softmax_lanes_sum(acc, prod, (b1 - t0) / softmax_lanes);
    for (index_t j = std::max(b1, t0); j < t1; ++j) tail += prod[j - t0];
  }
  float const dot = softmax_lanes_total(acc) + tail;
  TIDE_PRAGMA_IVDEP
  for (index_t j = 0; j < cols; ++j) dx[j] = from_float<T>(softmax_grad(to_float(y[j]), to_float(dy[j]), dot, scale));
}

}  // namespace detail

// Scratch of the softmax forwards on the host for `rows` rows of `cols` (the last extent):
// one row of floats per thread. The backward needs none.
inline std::size_t softmax_forward_scratch_bytes(exec<host> const& ex, index_t rows, index_t cols) noexcept {
  return sizeof(float) * static_cast<std::size_t>(detail::softmax_slices(ex.pool, rows) * cols);
}

// out = softmax(scale * inp) over the last dimension. inp, out: (R, L) or any rank >= 1 (rows
// over the leading dimensions), contiguous, the same memory (in place) or disjoint.
template <Element T>
void softmax_forward(exec<host> const& ex, tensor_view<T> out, std::type_identity_t<tensor_view<T const>> inp,
                     float scale, scratch<host> ws) {
  detail::softmax_check_pair("softmax_forward", "out", out, "inp", inp);
  index_t const cols = inp.extent(inp.rank() - 1), rows = detail::softmax_rows_of(inp);
  detail::check_scratch("softmax_forward", "softmax_forward_scratch_bytes", ws,
                        softmax_forward_scratch_bytes(ex, rows, cols));
  detail::softmax_rows(ex.pool, out.data(), inp.data(), rows, cols, scale, detail::full_columns{cols},
                       detail::scratch_part<float>(ws, 0));
}

// Causal attention scores (..., T, T), e.g. (B, NH, T, T): row t of each T x T block is the
// softmax of its columns 0..t; columns t+1.. output 0.
template <Element T>
void softmax_forward_causal(exec<host> const& ex, tensor_view<T> out, std::type_identity_t<tensor_view<T const>> inp,
                            float scale, scratch<host> ws) {
  detail::softmax_check_pair("softmax_forward_causal", "out", out, "inp", inp);
  detail::softmax_check_causal(inp);
  index_t const t = inp.extent(inp.rank() - 1), rows = detail::softmax_rows_of(inp);
  detail::check_scratch("softmax_forward_causal", "softmax_forward_scratch_bytes", ws,
                        softmax_forward_scratch_bytes(ex, rows, t));
  detail::softmax_rows(ex.pool, out.data(), inp.data(), rows, t, scale, detail::causal_columns{t},
                       detail::scratch_part<float>(ws, 0));
}

// Valid lengths: lengths (G), G dividing the row count R; rows [g R/G, (g+1) R/G) are the
// softmax of their first lengths[g] columns and 0 after them (a length of 0 gives a row of 0).
// One length per row (G = R), or per sequence of (B, NH, T, T) scores (G = B: key padding).
template <Element T>
void softmax_forward_masked(exec<host> const& ex, tensor_view<T> out, std::type_identity_t<tensor_view<T const>> inp,
                            tensor_view<std::int32_t const> lengths, float scale, scratch<host> ws) {
  detail::softmax_check_pair("softmax_forward_masked", "out", out, "inp", inp);
  detail::softmax_check_lengths_shape(inp, lengths);
  detail::softmax_check_lengths_values(inp, lengths);
  index_t const rows = detail::softmax_rows_of(inp), cols = inp.extent(inp.rank() - 1);
  detail::check_scratch("softmax_forward_masked", "softmax_forward_scratch_bytes", ws,
                        softmax_forward_scratch_bytes(ex, rows, cols));
  detail::softmax_rows(ex.pool, out.data(), inp.data(), rows, cols, scale,
                       detail::length_columns{lengths.data(), rows / lengths.size()},
                       detail::scratch_part<float>(ws, 0));
}

// The three with scratch allocated for the one call (kernels/scratch.hpp), after the checks that
// make inp's rows meaningful.
namespace detail {
template <class V>
std::size_t softmax_call_bytes(exec<host> const& ex, char const* op, V const& out, V const& inp) {
  softmax_check_pair(op, "out", out, "inp", inp);
  return softmax_forward_scratch_bytes(ex, softmax_rows_of(inp), inp.extent(inp.rank() - 1));
}
}  // namespace detail
template <Element T>
void softmax_forward(exec<host> const& ex, tensor_view<T> out, std::type_identity_t<tensor_view<T const>> inp,
                     float scale = 1.f) {
  detail::call_scratch const ws(detail::softmax_call_bytes(ex, "softmax_forward", tensor_view<T const>(out), inp));
  softmax_forward(ex, out, inp, scale, ws.get());
}
template <Element T>
void softmax_forward_causal(exec<host> const& ex, tensor_view<T> out, std::type_identity_t<tensor_view<T const>> inp,
                            float scale = 1.f) {
  detail::call_scratch const ws(
      detail::softmax_call_bytes(ex, "softmax_forward_causal", tensor_view<T const>(out), inp));
  softmax_forward_causal(ex, out, inp, scale, ws.get());
}
template <Element T>
void softmax_forward_masked(exec<host> const& ex, tensor_view<T> out, std::type_identity_t<tensor_view<T const>> inp,
                            tensor_view<std::int32_t const> lengths, float scale = 1.f) {
  detail::call_scratch const ws(
      detail::softmax_call_bytes(ex, "softmax_forward_masked", tensor_view<T const>(out), inp));
  softmax_forward_masked(ex, out, inp, lengths, scale, ws.get());
}

// dinp = scale * out * (dout - sum(dout * out)) per row: the backward of every forward variant
// (masked columns have out = 0, so their dinp is 0). dinp may be out or dout (in place).
template <Element T>
void softmax_backward(exec<host> const& ex, tensor_view<T> dinp, std::type_identity_t<tensor_view<T const>> out,
                      std::type_identity_t<tensor_view<T const>> dout, float scale = 1.f) {
  detail::softmax_check_pair("softmax_backward", "dinp", dinp, "out", out);
  detail::softmax_check_pair("softmax_backward", "dinp", dinp, "dout", dout);
  index_t const cols = out.extent(out.rank() - 1);
  index_t const rows = detail::softmax_rows_of(out);
  if (rows == 0 || cols == 0) return;
  T* dx = dinp.data();
  T const* y = out.data();
  T const* dy = dout.data();
  parallel_for(ex.pool, static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    for (auto r = static_cast<index_t>(begin); r < static_cast<index_t>(end); ++r)
      detail::softmax_backward_row(dx + r * cols, y + r * cols, dy + r * cols, cols, scale);
  });
}

}  // namespace tide::kernels
