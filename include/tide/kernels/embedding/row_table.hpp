#pragma once
// row_table<T>: a (rows, cols) table stored as up to max_pieces row pieces that need not be
// adjacent in memory: piece j holds rows [j R, min(rows, (j + 1) R)), R = piece_rows, each piece
// contiguous. The embedding kernels take one, so a token table cut into pieces (nn::gpt_config::
// wte_pieces: each piece in its own offload chunk) is read and written where its pieces live.
// Passed by value to CUDA kernels (the addresses are device pointers there).
//
//   auto whole = tide::kernels::row_table_of(wte);         // one piece: the table itself
//   tide::kernels::row_table<float const> t{.piece_rows = 128, .rows = 300, .cols = 64, .pieces = 3};
//   t.piece[0] = a; t.piece[1] = b; t.piece[2] = c;        // (128, 64), (128, 64), (44, 64)

#include <cstddef>
#include <cstdint>

#include "tide/core/config.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels {

template <class T>
struct row_table {
  static constexpr int max_pieces = 64;
  T* piece[max_pieces] = {};
  index_t piece_rows = 0;  // R: rows of every piece but the last
  index_t rows = 0;        // of the whole table
  index_t cols = 0;
  int pieces = 0;

  TIDE_HOST_DEVICE T* row(index_t r) const noexcept { return piece[r / piece_rows] + (r % piece_rows) * cols; }
  // Rows of piece j.
  [[nodiscard]] index_t rows_of(int j) const noexcept {
    index_t const left = rows - index_t{j} * piece_rows;
    return left < piece_rows ? left : piece_rows;
  }
};

// The whole contiguous (rows, cols) table as one piece.
template <class T, Backend B>
row_table<T> row_table_of(tensor_view<T, B> t) noexcept {
  row_table<T> r;
  r.piece[0] = t.data();
  r.piece_rows = t.rank() == 2 && t.extent(0) > 0 ? t.extent(0) : 1;
  r.rows = t.rank() == 2 ? t.extent(0) : 0;
  r.cols = t.rank() == 2 ? t.extent(1) : 0;
  r.pieces = 1;
  return r;
}

namespace detail {

// A table of `cols` = C columns, >= 1 row, every piece present and its rows as documented.
template <class T>
void check_row_table(char const* what, char const* name, row_table<T> const& t, index_t cols) {
  TIDE_REQUIRE(t.pieces >= 1 && t.pieces <= row_table<T>::max_pieces && t.piece_rows >= 1 && t.rows >= 1 &&
                   t.cols == cols,
               what, " needs ", name, " (V, C) with C = ", cols, " and V >= 1 in 1 to ", row_table<T>::max_pieces,
               " pieces, got ", t.rows, " x ", t.cols, " in ", t.pieces, " pieces of ", t.piece_rows, " rows");
  TIDE_REQUIRE((t.pieces - 1) * t.piece_rows < t.rows && t.pieces * t.piece_rows >= t.rows, what, ": ", name, "'s ",
               t.rows, " rows do not make ", t.pieces, " non-empty pieces of at most ", t.piece_rows, " rows");
  for (int j = 0; j < t.pieces; ++j)
    TIDE_REQUIRE(t.piece[j] != nullptr, what, ": piece ", j, " of ", name, " has no address");
  // Pieces that overlap would be read as different rows, and written by two threads at once.
  for (int j = 1; j < t.pieces; ++j)
    for (int i = 0; i < j; ++i) {
      auto const a = reinterpret_cast<std::uintptr_t>(t.piece[i]), b = reinterpret_cast<std::uintptr_t>(t.piece[j]);
      std::size_t const na = static_cast<std::size_t>(t.rows_of(i) * t.cols) * sizeof(T);
      std::size_t const nb = static_cast<std::size_t>(t.rows_of(j) * t.cols) * sizeof(T);
      TIDE_REQUIRE(a + na <= b || b + nb <= a, what, ": pieces ", i, " and ", j, " of ", name, " overlap");
    }
}

// [p, p + bytes) and every piece of t are disjoint.
template <class T>
bool disjoint_from(row_table<T> const& t, void const* p, std::size_t bytes) noexcept {
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  for (int j = 0; j < t.pieces; ++j) {
    auto const b = reinterpret_cast<std::uintptr_t>(t.piece[j]);
    std::size_t const n = static_cast<std::size_t>(t.rows_of(j) * t.cols) * sizeof(T);
    if (bytes != 0 && n != 0 && a < b + n && b < a + bytes) return false;
  }
  return true;
}

}  // namespace detail
}  // namespace tide::kernels
