#pragma once
// How a GPT block's parameters split over a tensor-parallel group of t ranks (Megatron-LM's
// layout): rank r keeps heads [r NH/t, (r + 1) NH/t) and hidden units [r 4C/t, (r + 1) 4C/t).
//
//   ln1.w/b, ln2.w/b, attn.proj.b, mlp.proj.b   replicated: every rank holds all of it
//   attn.qkv.w (3C, C), attn.qkv.b (3C)          the rows of the rank's heads in each of q, k, v:
//                                                (3C/t, C), laid out [q | k | v] as attention reads
//   mlp.fc.w (4C, C), mlp.fc.b (4C)              rows: column-parallel, (4C/t, C)
//   attn.proj.w (C, C), mlp.proj.w (C, 4C)       columns: row-parallel, (C, C/t) and (C, 4C/t)
//
// take_shard copies rank r's shard out of the whole tensor; put_shard writes it back (put_shards
// every rank's), so a checkpoint saved at one t loads at another through the whole tensor. All
// are host copies.
//
//   tide::tp::check_group(config, t);
//   tide::tp::take_shard(tide::tp::split_of(block_param::qkv_w), whole, shard, 3 * C, C, rank, t);

#include <cstddef>
#include <cstdint>
#include <span>

#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/nn/gpt_config.hpp"

namespace tide::tp {

enum class split : std::uint8_t {
  replicated,  // the whole tensor on every rank
  rows,        // rows [r R/t, (r + 1) R/t)
  qkv_rows,    // rows [r C/t, (r + 1) C/t) of each of q, k and v (R = 3C)
  columns,     // columns [r K/t, (r + 1) K/t) of every row
};

[[nodiscard]] constexpr split split_of(nn::block_param p) noexcept {
  using enum nn::block_param;
  switch (p) {
    case qkv_w:
    case qkv_b: return split::qkv_rows;
    case fc_w:
    case fc_b: return split::rows;
    case attn_proj_w:
    case mlp_proj_w: return split::columns;
    default: return split::replicated;
  }
}

// Refuses a group size the block cannot be cut into: t must divide the heads (and so C and 4C).
inline void check_group(nn::gpt_config const& c, int t) {
  TIDE_REQUIRE(t >= 1 && c.heads % t == 0, "tp: a tensor-parallel group of ", t, " ranks cannot split ", c.heads,
               " heads; use a group size that divides the number of heads");
  TIDE_REQUIRE(c.channels % c.heads == 0, "tp: C = ", c.channels, " is not a multiple of the ", c.heads, " heads");
}

// The shard's shape of a tensor of `rows` x `cols` (cols 1 for a vector) split as s over t.
struct shard_shape {
  index_t rows, cols;
};
[[nodiscard]] constexpr shard_shape shape_of(split s, index_t rows, index_t cols, int t) noexcept {
  if (s == split::rows || s == split::qkv_rows) return {rows / t, cols};
  if (s == split::columns) return {rows, cols / t};
  return {rows, cols};
}

namespace detail {
// The whole tensor's row of shard row i.
[[nodiscard]] constexpr index_t whole_row(split s, index_t rows, int rank, int t, index_t i) noexcept {
  if (s == split::rows) return rank * (rows / t) + i;
  if (s == split::qkv_rows) {
    index_t const part = rows / 3 / t;  // rows of one of q, k, v on a rank
    return (i / part) * (rows / 3) + rank * part + i % part;
  }
  return i;
}

inline void check_copy(split s, std::size_t whole, std::size_t shard, index_t rows, index_t cols, int rank, int t) {
  TIDE_REQUIRE(t >= 1 && rank >= 0 && rank < t, "tp: rank ", rank, " is not in [0, ", t,
               "); pass the rank within its tensor-parallel group of ", t);
  TIDE_REQUIRE(whole == static_cast<std::size_t>(rows * cols), "tp: the whole tensor has ", whole,
               " elements, not ", rows, " x ", cols, "; pass its whole shape (whole_shape)");
  TIDE_REQUIRE((s != split::rows || rows % t == 0) && (s != split::qkv_rows || rows % (3 * t) == 0) &&
                   (s != split::columns || cols % t == 0),
               "tp: a ", rows, " x ", cols, " tensor does not split evenly over ", t, " ranks");
  auto const sh = shape_of(s, rows, cols, t);
  TIDE_REQUIRE(shard == static_cast<std::size_t>(sh.rows * sh.cols), "tp: the shard has ", shard,
               " elements, not ", sh.rows, " x ", sh.cols, "; size it as shape_of(split, rows, cols, t) says");
}
}  // namespace detail

namespace detail {
// Copies rank's part of the whole tensor (rows x cols, row-major) and its shard into each other,
// row by row: into the shard when Take, else back into the whole tensor.
template <bool Take, class W, class S>
void copy_shard(split s, W* whole, S* shard, index_t rows, index_t cols, int rank, int t) {
  auto const sh = shape_of(s, rows, cols, t);
  index_t const c0 = s == split::columns ? rank * sh.cols : 0;
  for (index_t i = 0; i < sh.rows; ++i) {
    W* const w = whole + whole_row(s, rows, rank, t, i) * cols + c0;
    S* const p = shard + i * sh.cols;
    for (index_t j = 0; j < sh.cols; ++j) {
      if constexpr (Take)
        p[j] = w[j];
      else
        w[j] = p[j];
    }
  }
}
}  // namespace detail

// shard = rank's part of `whole` (rows x cols, row-major).
template <class T>
void take_shard(split s, std::span<T const> whole, std::span<T> shard, index_t rows, index_t cols, int rank, int t) {
  detail::check_copy(s, whole.size(), shard.size(), rows, cols, rank, t);
  detail::copy_shard<true>(s, whole.data(), shard.data(), rows, cols, rank, t);
}

// rank's part of `whole` = shard: the inverse of take_shard.
template <class T>
void put_shard(split s, std::span<T const> shard, std::span<T> whole, index_t rows, index_t cols, int rank, int t) {
  detail::check_copy(s, whole.size(), shard.size(), rows, cols, rank, t);
  detail::copy_shard<false>(s, whole.data(), shard.data(), rows, cols, rank, t);
}

// The whole tensor from the shards of all t ranks laid end to end in rank order (an
// all_gather's output, or each shard read in turn).
template <class T>
void put_shards(split s, std::span<T const> shards, std::span<T> whole, index_t rows, index_t cols, int t) {
  TIDE_REQUIRE(t >= 1 && shards.size() % static_cast<std::size_t>(t) == 0, "tp::put_shards: ", shards.size(),
               " elements are not ", t, " shards of one size");
  std::size_t const n = shards.size() / static_cast<std::size_t>(t);
  for (int k = 0; k < t; ++k) put_shard(s, shards.subspan(n * static_cast<std::size_t>(k), n), whole, rows, cols, k, t);
}

// A block parameter's whole shape (rows, cols) at C channels (cols 1 for a vector).
[[nodiscard]] constexpr shard_shape whole_shape(nn::block_param p, index_t C) noexcept {
  using enum nn::block_param;
  switch (p) {
    case qkv_w: return {3 * C, C};
    case qkv_b: return {3 * C, 1};
    case attn_proj_w: return {C, C};
    case fc_w: return {4 * C, C};
    case fc_b: return {4 * C, 1};
    case mlp_proj_w: return {C, 4 * C};
    default: return {C, 1};
  }
}

}  // namespace tide::tp
