#pragma once
// The host path of encoder_forward / encoder_backward (token + position embeddings).
//
// Forward: threaded over the B*T rows; each row is one vectorised add of two table rows.
// Backward, deterministic by construction: the positions are sorted by (token, position) once,
// then the threads split the channels C (contiguous blocks of 16). For every channel, a token's
// gradient is the sum of its positions' dout in position order, in float, added to dwte once;
// a position's is the sum over b in order, added to dwpe once. No element's arithmetic depends
// on how the channels are split, so dwte and dwpe are bit-identical for any thread count (and a
// bf16 table is rounded once per call, not once per occurrence). Scratch, from the caller
// (kernels/scratch.hpp): 16 B per position for the sort, a float per channel of its share of C
// for each thread.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/embedding/check.hpp"
#include "tide/kernels/embedding/row_table.hpp"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels {

// Host tuning: channels go to threads in blocks of 16 floats (one 64-byte line), so two threads
// never write the same cache line of dwte / dwpe.
struct encoder_tuning {
  static constexpr index_t channel_block = 16;
};

namespace detail {

// The positions [0, n) ordered by (token, position), and where each token's run starts:
// run k is order[starts[k] .. starts[k + 1]), k < count. The arrays are in the call's scratch.
struct token_runs {
  std::int32_t const* order;
  std::int32_t const* starts;
  std::size_t count;
};
// encoder_backward's scratch: the sort keys, the order and run starts, and a row of channel sums
// per slice of the channel blocks.
struct encoder_parts {
  std::size_t keys = 0, runs = 0, sums = 0, bytes = 0;
  index_t slices = 0, per_slice = 0;  // channel-sum slices and floats per slice
};
inline encoder_parts encoder_backward_parts(thread_pool const& pool, index_t n, index_t C) noexcept {
  constexpr index_t block = encoder_tuning::channel_block;
  index_t const blocks = (C + block - 1) / block;
  encoder_parts e;
  e.slices = std::min<index_t>(pool.threads(), blocks);
  e.per_slice = e.slices > 0 ? (blocks + e.slices - 1) / e.slices * block : 0;
  scratch_parts p;
  auto const un = static_cast<std::size_t>(n);
  e.keys = p.add<std::uint64_t>(un);
  e.runs = p.add<std::int32_t>(2 * un + 1);
  e.sums = p.add<float>(static_cast<std::size_t>(e.slices * e.per_slice));
  e.bytes = p.bytes();
  return e;
}

inline token_runs encoder_token_runs(std::int32_t const* tokens, index_t n, std::uint64_t* keys, std::int32_t* order) {
  auto const un = static_cast<std::size_t>(n);
  for (index_t i = 0; i < n; ++i)
    keys[static_cast<std::size_t>(i)] =
        (std::uint64_t{static_cast<std::uint32_t>(tokens[i])} << 32) | static_cast<std::uint64_t>(i);
  std::sort(keys, keys + un);  // in place: no allocation
  std::int32_t* const starts = order + un;  // at most n runs, and the end
  std::size_t count = 0;
  for (index_t i = 0; i < n; ++i) {
    auto const k = keys[static_cast<std::size_t>(i)];
    order[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(k & 0xffffffffu);
    if (i == 0 || (k >> 32) != (keys[static_cast<std::size_t>(i - 1)] >> 32))
      starts[count++] = static_cast<std::int32_t>(i);
  }
  starts[count] = static_cast<std::int32_t>(n);
  return {order, starts, count};
}

template <class D>
void encoder_accumulate(float* __restrict acc, D const* __restrict d, index_t n) noexcept {
  for (index_t c = 0; c < n; ++c) acc[c] += to_float(d[c]);
}

template <class G>
void encoder_add_into(G* __restrict g, float const* __restrict acc, index_t n) noexcept {
  for (index_t c = 0; c < n; ++c) g[c] = from_float<G>(to_float(g[c]) + acc[c]);
}

}  // namespace detail

// out (B, T, C) = wte[tokens[b, t]] + wpe[t]. tokens (B, T) in [0, V), wte (V, C) (a contiguous
// table, or a row_table of pieces), wpe (maxT, C) with maxT >= T. A token outside [0, V) throws
// tide::error(usage) before anything is written.
template <Element T>
void encoder_forward(exec<host> const& ex, tensor_view<T> out, tensor_view<std::int32_t const> tokens,
                     std::type_identity_t<row_table<T const>> const& wte, std::type_identity_t<tensor_view<T const>> wpe) {
  char const* what = "encoder_forward";
  detail::encoder_check_act(what, "out", out, tokens, wpe);
  detail::check_row_table(what, "the token table", wte, out.extent(2));
  TIDE_REQUIRE(detail::disjoint_from(wte, out.data(), out.bytes()) && detail::encoder_disjoint(out, wpe), what,
               ": out overlaps an embedding table; pass a separate buffer");
  detail::encoder_check_tokens(what, tokens, wte.rows);
  index_t const t_len = out.extent(1), c_len = out.extent(2);
  T* o = out.data();
  std::int32_t const* tok = tokens.data();
  T const* pe = wpe.data();
  parallel_for(ex.pool, static_cast<std::size_t>(tokens.size()), [&](std::size_t begin, std::size_t end) {
    for (auto i = static_cast<index_t>(begin); i < static_cast<index_t>(end); ++i) {
      T* __restrict y = o + i * c_len;
      T const* __restrict a = wte.row(index_t{tok[i]});
      T const* __restrict p = pe + (i % t_len) * c_len;
      for (index_t c = 0; c < c_len; ++c) y[c] = from_float<T>(to_float(a[c]) + to_float(p[c]));
    }
  });
}

template <Element T>
void encoder_forward(exec<host> const& ex, tensor_view<T> out, tensor_view<std::int32_t const> tokens,
                     std::type_identity_t<tensor_view<T const>> wte, std::type_identity_t<tensor_view<T const>> wpe) {
  detail::encoder_check_shapes("encoder_forward", "out", out, tokens, wte, wpe);
  encoder_forward(ex, out, tokens, row_table_of(wte), wpe);
}

// Scratch of encoder_backward on the host for dout (batch, T, C) and a table of V rows (the
// CUDA path's sort needs V; the host's does not).
inline std::size_t encoder_backward_scratch_bytes(exec<host> const& ex, index_t batch, index_t T, index_t C,
                                                  index_t V) noexcept {
  (void)V;
  return detail::encoder_backward_parts(ex.pool, batch * T, C).bytes;
}

// dwte (V, C) += the sum of dout rows over the positions of each token; dwpe (maxT, C): row t
// += sum over b of dout[b, t]. dout (B, T, C), tokens (B, T); dwte contiguous or a row_table.
// Deterministic (see above); sums in float, one rounding into a bf16 / f16 table. A token outside
// [0, V) throws before any write.
template <Element G, class D>
  requires Element<std::remove_const_t<D>>
void encoder_backward(exec<host> const& ex, row_table<G> const& dwte, tensor_view<G> dwpe, tensor_view<D> dout,
                      tensor_view<std::int32_t const> tokens, scratch<host> ws) {
  char const* what = "encoder_backward";
  detail::encoder_check_act(what, "dout", dout, tokens, dwpe);
  detail::check_row_table(what, "the token table", dwte, dout.extent(2));
  TIDE_REQUIRE(detail::disjoint_from(dwte, dwpe.data(), dwpe.bytes()), what,
               ": dwte and dwpe overlap; pass separate tables");
  TIDE_REQUIRE(detail::disjoint_from(dwte, dout.data(), dout.bytes()) && detail::encoder_disjoint(dout, dwpe), what,
               ": dout overlaps a gradient table; pass a separate buffer");
  detail::encoder_check_tokens(what, tokens, dwte.rows);
  index_t const b_len = dout.extent(0), t_len = dout.extent(1), c_len = dout.extent(2);
  index_t const n = b_len * t_len;
  auto const parts = detail::encoder_backward_parts(ex.pool, n, c_len);
  detail::check_scratch(what, "encoder_backward_scratch_bytes", ws, parts.bytes);
  if (n == 0 || c_len == 0) return;
  detail::token_runs const runs = detail::encoder_token_runs(tokens.data(), n, detail::scratch_part<std::uint64_t>(ws, parts.keys),
                                                             detail::scratch_part<std::int32_t>(ws, parts.runs));
  std::int32_t const* tok = tokens.data();
  std::remove_const_t<D> const* d = dout.data();
  G* gpe = dwpe.data();
  float* const sums = detail::scratch_part<float>(ws, parts.sums);
  constexpr index_t block = encoder_tuning::channel_block;
  index_t const blocks = (c_len + block - 1) / block;
  parallel_for(ex.pool, static_cast<std::size_t>(blocks), [&](std::size_t begin, std::size_t end) {
    index_t const c0 = static_cast<index_t>(begin) * block;
    index_t const width = std::min(c_len, static_cast<index_t>(end) * block) - c0;
    auto const slice = thread_pool::slice_at(static_cast<std::size_t>(blocks), static_cast<int>(parts.slices), begin);
    float* const acc = sums + static_cast<index_t>(slice) * parts.per_slice;
    for (std::size_t k = 0; k < runs.count; ++k) {
      std::fill_n(acc, width, 0.f);
      for (std::int32_t i = runs.starts[k]; i < runs.starts[k + 1]; ++i)
        detail::encoder_accumulate(acc, d + index_t{runs.order[static_cast<std::size_t>(i)]} * c_len + c0, width);
      index_t const v = tok[runs.order[static_cast<std::size_t>(runs.starts[k])]];
      detail::encoder_add_into(dwte.row(v) + c0, acc, width);
    }
    for (index_t t = 0; t < t_len; ++t) {
      std::fill_n(acc, width, 0.f);
      for (index_t b = 0; b < b_len; ++b) detail::encoder_accumulate(acc, d + (b * t_len + t) * c_len + c0, width);
      detail::encoder_add_into(gpe + t * c_len + c0, acc, width);
    }
  });
}

template <Element G, class D>
  requires Element<std::remove_const_t<D>>
void encoder_backward(exec<host> const& ex, tensor_view<G> dwte, tensor_view<G> dwpe, tensor_view<D> dout,
                      tensor_view<std::int32_t const> tokens, scratch<host> ws) {
  detail::encoder_check_shapes("encoder_backward", "dout", dout, tokens, dwte, dwpe);
  encoder_backward(ex, row_table_of(dwte), dwpe, dout, tokens, ws);
}

// The two with scratch allocated for the one call (kernels/scratch.hpp).
template <Element G, class D>
  requires Element<std::remove_const_t<D>>
void encoder_backward(exec<host> const& ex, row_table<G> const& dwte, tensor_view<G> dwpe, tensor_view<D> dout,
                      tensor_view<std::int32_t const> tokens) {
  detail::encoder_check_act("encoder_backward", "dout", dout, tokens, dwpe);
  detail::call_scratch const ws(
      encoder_backward_scratch_bytes(ex, dout.extent(0), dout.extent(1), dout.extent(2), dwte.rows));
  encoder_backward(ex, dwte, dwpe, dout, tokens, ws.get());
}
template <Element G, class D>
  requires Element<std::remove_const_t<D>>
void encoder_backward(exec<host> const& ex, tensor_view<G> dwte, tensor_view<G> dwpe, tensor_view<D> dout,
                      tensor_view<std::int32_t const> tokens) {
  detail::encoder_check_shapes("encoder_backward", "dout", dout, tokens, dwte, dwpe);
  encoder_backward(ex, row_table_of(dwte), dwpe, dout, tokens);
}

}  // namespace tide::kernels
