#pragma once
// What the row-wise kernels (residual, layernorm, gelu) share: how they take views, the argument
// checks both backends run before touching memory, and on the host a fixed-order sum within a
// row and deterministic column sums across rows.
//
// A tensor of rank >= 1 is seen as rows: its last extent is C, N = size / C rows (an (B, T, C)
// activation is N = B*T rows of C). Views must be contiguous.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>

#include "tide/core/backend.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels {

// A tensor a kernel only reads: tensor_view<E, Space> or tensor_view<E const, Space>, so callers
// pass their views as they are.
template <class V, class E, class Space = host>
concept ReadView = std::same_as<V, tensor_view<E, Space>> || std::same_as<V, tensor_view<E const, Space>>;

// The element type of a view, const dropped.
template <class V>
using element_of = std::remove_const_t<typename V::element_type>;

// Row-wise host tuning (bench: bench/kernels_layernorm.hpp, N=32768, C=768, fp32, 2 threads).
//   lanes: independent partial sums of a row sum. A sum is latency-bound: 16 lanes are 2 ymm add
//     chains, 32 are 4 (2 zmm). In-cache LayerNorm forward, one thread, CPU time, on the shared
//     2-vCPU machine: 16/32/64 lanes all within 0.28-0.48 ns/elem, run-to-run noise larger than
//     the difference; from memory the kernels are bandwidth-bound either way. 32 it is.
//   chunk_rows: rows per column-sum partial; the partials are 2 / 64 of inp's size.
//   min_task_elems: below this a kernel stays on the calling thread (a pool wake-up costs a few
//     microseconds, about what 32K elements take).
struct row_tuning {
  static constexpr int lanes = 32;
  static constexpr index_t chunk_rows = 64;
  static constexpr index_t min_task_elems = 32768;
};

namespace detail {

inline std::string rows_shape_text(shape const& s) {
  std::ostringstream os;
  os << '(';
  for (int d = 0; d < s.rank; ++d) os << (d ? ", " : "") << s.dims[d];
  os << ')';
  return os.str();
}

template <class V>
void check_contiguous(char const* op, char const* name, V const& v) {
  TIDE_REQUIRE(v.is_contiguous(), op, " needs a contiguous ", name, ", got a strided view of shape ",
               rows_shape_text(v.extents()), "; copy it into a contiguous tensor first");
}

// `v` is contiguous, of rank >= 1 with a last extent >= 1. Returns C.
template <class V>
index_t check_rows(char const* op, char const* name, V const& v) {
  TIDE_REQUIRE(v.rank() >= 1 && v.extent(v.rank() - 1) >= 1, op, " needs ", name,
               " of shape (..., C) with C >= 1, got ", rows_shape_text(v.extents()));
  check_contiguous(op, name, v);
  return v.extent(v.rank() - 1);
}

// `b` has the shape of `a`, and is contiguous.
template <class A, class B>
void check_same_shape(char const* op, char const* a_name, A const& a, char const* b_name, B const& b) {
  TIDE_REQUIRE(a.extents() == b.extents(), op, " needs ", b_name, " of the shape of ", a_name, " ",
               rows_shape_text(a.extents()), ", got ", rows_shape_text(b.extents()));
  check_contiguous(op, b_name, b);
}

// `v` is a contiguous (C) vector.
template <class V>
void check_vector(char const* op, char const* name, V const& v, index_t C, char const* rows_name) {
  TIDE_REQUIRE(v.rank() == 1 && v.extent(0) == C, op, " needs ", name, " of shape (", C, ") (the last extent of ",
               rows_name, "), got ", rows_shape_text(v.extents()));
  check_contiguous(op, name, v);
}

// `v` holds one float per row: N elements in any contiguous shape, e.g. (B, T) for (B, T, C).
template <class V>
void check_per_row(char const* op, char const* name, V const& v, index_t N, char const* rows_name, shape const& rows) {
  TIDE_REQUIRE(v.size() == N, op, " needs ", name, " with one element per row of ", rows_name, " ",
               rows_shape_text(rows), " (", N, "), got ", rows_shape_text(v.extents()), " (", v.size(), " elements)");
  check_contiguous(op, name, v);
}

// A region of memory a kernel touches, for the overlap checks.
struct region {
  enum class use : std::uint8_t { read, written, written_in_place };
  char const* name;
  void const* data;
  std::size_t bytes;
  use how;
};

template <class V>
region read(char const* name, V const& v) {
  return {name, static_cast<void const*>(v.data()), v.bytes(), region::use::read};
}
template <class V>
region written(char const* name, V const& v) {
  return {name, static_cast<void const*>(v.data()), v.bytes(), region::use::written};
}
// An output an elementwise kernel may write over one of its inputs: it reads element i before it
// writes element i, so out == inp is fine (a partial overlap is not).
template <class V>
region written_in_place(char const* name, V const& v) {
  return {name, static_cast<void const*>(v.data()), v.bytes(), region::use::written_in_place};
}

// No written region overlaps another region, except a written_in_place one that coincides
// exactly with a read one.
inline void check_disjoint(char const* op, std::initializer_list<region> regions) {
  using use = region::use;
  for (auto const* a = regions.begin(); a != regions.end(); ++a) {
    for (auto const* b = a + 1; b != regions.end(); ++b) {
      if (a->how == use::read && b->how == use::read) continue;
      if (a->bytes == 0 || b->bytes == 0) continue;
      auto const pa = reinterpret_cast<std::uintptr_t>(a->data);
      auto const pb = reinterpret_cast<std::uintptr_t>(b->data);
      if (pa + a->bytes <= pb || pb + b->bytes <= pa) continue;
      bool const exact = pa == pb && a->bytes == b->bytes;
      bool const in_place = (a->how == use::written_in_place && b->how == use::read) ||
                            (b->how == use::written_in_place && a->how == use::read);
      bool const may = a->how == use::written_in_place || b->how == use::written_in_place;
      TIDE_REQUIRE(exact && in_place, op, ": ", a->name, " (", a->bytes, " bytes at ", a->data, ") overlaps ", b->name,
                   " (", b->bytes, " bytes at ", b->data, ")",
                   may ? "; an output may only coincide exactly with an input (in place), pass it whole or separate"
                       : "; pass separate tensors");
    }
  }
}

// ---- host: sums in a fixed order ------------------------------------------------------------

template <std::size_t K>
using sums = std::array<float, K>;

// Sums K terms over i in [0, n): lane l takes i = l, l + lanes, ... in order, then the lanes are
// added in a fixed tree. The order depends only on n, so a row's sum is the same on any thread,
// with any vector width g++ picks (or none). term(i) returns sums<K>.
template <std::size_t K, class Term>
sums<K> lane_sums(index_t n, Term&& term) {
  constexpr int L = row_tuning::lanes;
  float acc[K][L] = {};
  index_t i = 0;
  for (; i + L <= n; i += L) {
    for (int l = 0; l < L; ++l) {
      sums<K> const t = term(i + l);
      for (std::size_t k = 0; k < K; ++k) acc[k][l] += t[k];
    }
  }
  for (int l = 0; i + l < n; ++l) {
    sums<K> const t = term(i + l);
    for (std::size_t k = 0; k < K; ++k) acc[k][l] += t[k];
  }
  sums<K> r{};
  for (std::size_t k = 0; k < K; ++k) {
    for (int w = L / 2; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) acc[k][l] += acc[k][l + w];
    r[k] = acc[k][0];
  }
  return r;
}

// Rows per parallel task, so a task moves at least min_task_elems elements.
inline index_t rows_per_task(index_t C) { return std::max<index_t>(1, row_tuning::min_task_elems / std::max<index_t>(C, 1)); }

// f(begin, end) over [0, n) elements, threaded in tasks of at least min_task_elems.
template <class F>
void for_elements(thread_pool& pool, index_t n, F&& f) {
  index_t const per = row_tuning::min_task_elems;
  auto const tasks = static_cast<std::size_t>((n + per - 1) / per);
  parallel_for(pool, tasks, [&](std::size_t tb, std::size_t te) {
    f(static_cast<index_t>(tb) * per, std::min(n, static_cast<index_t>(te) * per));
  });
}

// f(row_begin, row_end) over [0, rows), threaded in tasks of whole rows.
template <class F>
void for_rows(thread_pool& pool, index_t rows, index_t C, F&& f) {
  index_t const per = rows_per_task(C);
  auto const tasks = static_cast<std::size_t>((rows + per - 1) / per);
  parallel_for(pool, tasks, [&](std::size_t tb, std::size_t te) {
    f(static_cast<index_t>(tb) * per, std::min(rows, static_cast<index_t>(te) * per));
  });
}

// Runs row(r, acc) for every r in [0, rows) and adds the K column vectors the rows contribute
// into dst[k] (C elements each, +=). row(r, acc) does row r's own work and adds its terms into
// acc[k][0..C).
//
// Deterministic for any thread count: rows go in fixed chunks of chunk_rows; each chunk sums its
// rows in order into its own partial; the partials are added in chunk order. Neither order
// depends on the thread count. Scratch: column_sums_floats<K>(rows, C) floats of the caller's.
template <std::size_t K>
constexpr std::size_t column_sums_floats(index_t rows, index_t C) noexcept {
  index_t const chunks = (rows + row_tuning::chunk_rows - 1) / row_tuning::chunk_rows;
  return static_cast<std::size_t>(chunks * static_cast<index_t>(K) * C);
}
template <std::size_t K, Element W, class Row>
void rows_with_column_sums(thread_pool& pool, index_t rows, index_t C, std::array<W*, K> dst, float* scratch,
                           Row&& row) {
  if (rows == 0) return;
  index_t const R = row_tuning::chunk_rows;
  index_t const chunks = (rows + R - 1) / R;
  index_t const slot = static_cast<index_t>(K) * C;
  // One chunk per task at least; more when rows are short, so a task is worth a thread.
  index_t const chunks_per_task = std::max<index_t>(1, rows_per_task(C) / R);
  auto const tasks = static_cast<std::size_t>((chunks + chunks_per_task - 1) / chunks_per_task);
  parallel_for(pool, tasks, [&](std::size_t tb, std::size_t te) {
    index_t const cb = static_cast<index_t>(tb) * chunks_per_task;
    index_t const ce = std::min(chunks, static_cast<index_t>(te) * chunks_per_task);
    for (index_t c = cb; c < ce; ++c) {
      float* const part = scratch + c * slot;
      std::fill(part, part + slot, 0.0f);
      std::array<float*, K> acc;
      for (std::size_t k = 0; k < K; ++k) acc[k] = part + static_cast<index_t>(k) * C;
      for (index_t r = c * R, re = std::min(rows, (c + 1) * R); r < re; ++r) row(r, acc);
    }
  });
  // Columns in blocks that stay in registers / L1 while the partials stream past.
  constexpr index_t block = 256;
  index_t const col_blocks = (C + block - 1) / block;
  index_t const blocks_per_task = std::max<index_t>(1, row_tuning::min_task_elems / std::max<index_t>(1, chunks * block));
  auto const col_tasks = static_cast<std::size_t>((col_blocks + blocks_per_task - 1) / blocks_per_task);
  parallel_for(pool, col_tasks, [&](std::size_t tb, std::size_t te) {
    index_t const bb = static_cast<index_t>(tb) * blocks_per_task;
    index_t const be = std::min(col_blocks, static_cast<index_t>(te) * blocks_per_task);
    for (index_t b = bb; b < be; ++b) {
      index_t const c0 = b * block, n = std::min(C, c0 + block) - c0;
      for (std::size_t k = 0; k < K; ++k) {
        float total[block] = {};
        for (index_t c = 0; c < chunks; ++c) {
          float const* __restrict p = scratch + c * slot + static_cast<index_t>(k) * C + c0;
#pragma GCC ivdep
          for (index_t j = 0; j < n; ++j) total[j] += p[j];
        }
        W* __restrict d = dst[k] + c0;
        for (index_t j = 0; j < n; ++j) d[j] = from_float<W>(to_float(d[j]) + total[j]);
      }
    }
  });
}

}  // namespace detail

namespace reference {

// The references also run in double, so tests can take finite differences of them.
template <class T>
concept Real = Element<T> || std::same_as<T, double>;

template <Real T>
constexpr double load(T x) noexcept {
  if constexpr (std::is_same_v<T, double>) return x;
  else return static_cast<double>(to_float(x));
}

// Rounds through float for the 16-bit types (a double rounding that tolerances absorb).
template <Real T>
constexpr T store(double x) noexcept {
  if constexpr (std::is_same_v<T, double>) return x;
  else return from_float<T>(static_cast<float>(x));
}

}  // namespace reference
}  // namespace tide::kernels
