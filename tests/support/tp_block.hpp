#pragma once
// Host memory for the tensor-parallel block's tests: a whole block's parameters (drawn from a
// seed, the same on every rank), a rank's shard of them, the rank's activations
// (tp::block_views) and, for the reference, nn::gpt's own block_views of the whole block.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

#include "tide/nn/gpt_blocks.hpp"
#include "tide/tp/block.hpp"
#include "tide/tp/head.hpp"
#include "tide/tp/shard.hpp"

namespace tide::test {

using tp_view = tensor_view<float>;
using tp_cview = tensor_view<float const>;

// Tensors that stay where they are (a deque of vectors), zero-filled.
struct tp_store {
  std::deque<std::vector<float>> data;
  tp_view make(tide::shape s) {
    data.emplace_back(static_cast<std::size_t>(s.numel()), 0.f);
    return tp_view(data.back().data(), s);
  }
  std::deque<kernels::detail::call_scratch> scratches;  // aligned, one per scratch() call
  kernels::scratch<host> scratch(std::size_t n) { return scratches.emplace_back(n).get(); }
};

// A block's 12 parameters (whole, or a rank's shard) and their gradients.
struct tp_params {
  std::vector<std::vector<float>> w, dw;
  nn::detail::block_params<tp_cview> views() const {
    nn::detail::block_params<tp_cview> p;
    for (int k = 0; k < nn::params_per_block; ++k)
      p.at[k] = tp_cview(w[static_cast<std::size_t>(k)].data(), shape_of(k));
    return p;
  }
  nn::detail::block_params<tp_view> grads() {
    nn::detail::block_params<tp_view> p;
    for (int k = 0; k < nn::params_per_block; ++k) p.at[k] = tp_view(dw[static_cast<std::size_t>(k)].data(), shape_of(k));
    return p;
  }
  std::vector<tp::shard_shape> shapes;
  tide::shape shape_of(int k) const {
    auto const s = shapes[static_cast<std::size_t>(k)];
    return s.cols == 1 ? tide::shape{s.rows} : tide::shape{s.rows, s.cols};
  }
};

// The whole block at C channels: weights ~ N(0, 0.02), LayerNorm weights 1 + N(0, 0.1), biases
// N(0, 0.02), from `seed`.
inline tp_params whole_block(index_t C, std::uint32_t seed) {
  tp_params p;
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  for (int k = 0; k < nn::params_per_block; ++k) {
    auto const s = tp::whole_shape(static_cast<nn::block_param>(k), C);
    p.shapes.push_back(s);
    bool const ln_w = k == static_cast<int>(nn::block_param::ln1_w) || k == static_cast<int>(nn::block_param::ln2_w);
    std::vector<float> v(static_cast<std::size_t>(s.rows * s.cols));
    for (float& x : v) x = ln_w ? 1.f + 0.1f * n(rng) : 0.02f * n(rng);
    p.w.push_back(std::move(v));
    p.dw.emplace_back(p.w.back().size(), 0.f);
  }
  return p;
}

// Rank `rank`'s shard of `whole` over a group of t (`mislabel`: the qkv shard of rank + 1's heads,
// a shard that must not pass).
inline tp_params shard_of(tp_params const& whole, index_t C, int rank, int t, bool mislabel = false) {
  tp_params p;
  for (int k = 0; k < nn::params_per_block; ++k) {
    auto const b = static_cast<nn::block_param>(k);
    auto const s = tp::whole_shape(b, C);
    auto const sh = tp::shape_of(tp::split_of(b), s.rows, s.cols, t);
    p.shapes.push_back(sh);
    std::vector<float> v(static_cast<std::size_t>(sh.rows * sh.cols));
    int const from = mislabel && b == nn::block_param::qkv_w ? (rank + 1) % t : rank;
    tp::take_shard(tp::split_of(b), std::span<float const>(whole.w[static_cast<std::size_t>(k)]), std::span<float>(v), s.rows, s.cols,
                   from, t);
    p.w.push_back(std::move(v));
    p.dw.emplace_back(p.w.back().size(), 0.f);
  }
  return p;
}

// One rank's activations at (Bn, Tn), group of t; n rows its own (Bn Tn / t with `sequence`).
inline tp::block_views<host, float> tp_views(tp_store& m, exec<host> const& ex, nn::gpt_config const& c, int t,
                                              index_t Bn, index_t Tn, bool sequence) {
  index_t const C = c.channels, Cl = C / t, NHl = c.heads / t, N = Bn * Tn, n = sequence ? N / t : N;
  tp::block_views<host, float> a;
  a.ln1 = m.make({n, C}), a.attproj = m.make({n, C}), a.res2 = m.make({n, C}), a.ln2 = m.make({n, C});
  a.fcproj = m.make({n, C}), a.res3 = m.make({n, C});
  a.ln1_mean = m.make({n}), a.ln1_rstd = m.make({n}), a.ln2_mean = m.make({n}), a.ln2_rstd = m.make({n});
  a.qkv = m.make({Bn, Tn, 3 * Cl}), a.atty = m.make({Bn, Tn, Cl}), a.lse = m.make({Bn, NHl, Tn});
  a.fch = m.make({Bn, Tn, 4 * Cl}), a.fch_gelu = m.make({Bn, Tn, 4 * Cl});
  a.dfch = m.make({Bn, Tn, 4 * Cl}), a.datty = m.make({Bn, Tn, Cl}), a.dqkv = m.make({Bn, Tn, 3 * Cl});
  a.dln = m.make({Bn, Tn, C});
  if (sequence) a.whole = m.make({Bn, Tn, C}), a.partial = m.make({Bn, Tn, C}), a.dln_rows = m.make({n, C});
  a.ws = m.scratch(tp::block_scratch_bytes<float>(ex, c, t, Bn, Tn));
  return a;
}

// nn::gpt's block_views of the whole block at (Bn, Tn), for the reference.
inline nn::detail::block_views<host, float> gpt_views(tp_store& m, exec<host> const& ex, nn::gpt_config const& c,
                                                      index_t Bn, index_t Tn) {
  index_t const C = c.channels;
  nn::detail::block_views<host, float> a;
  for (tp_view* v : {&a.ln1, &a.atty, &a.attproj, &a.res2, &a.ln2, &a.fcproj, &a.res3, &a.dln2, &a.datty, &a.dln1})
    *v = m.make({Bn, Tn, C});
  a.qkv = m.make({Bn, Tn, 3 * C}), a.dqkv = m.make({Bn, Tn, 3 * C});
  a.fch = m.make({Bn, Tn, 4 * C}), a.fch_gelu = m.make({Bn, Tn, 4 * C}), a.dfch = m.make({Bn, Tn, 4 * C});
  for (tp_view* v : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) *v = m.make({Bn, Tn});
  a.lse = m.make({Bn, c.heads, Tn});
  a.ws = m.scratch(tp::block_scratch_bytes<float>(ex, c, 1, Bn, Tn));
  return a;
}

// One rank's head and embedding activations at (Bn, Tn), group of t.
inline tp::head_views<float> tp_head(tp_store& m, exec<host> const& ex, nn::gpt_config const& c, int t, index_t Bn,
                                     index_t Tn, bool sequence) {
  index_t const C = c.channels, N = Bn * Tn, n = sequence ? N / t : N, R = nn::padded_vocab_of(c) / t;
  tp::head_views<float> h;
  h.lnf = m.make({n, C}), h.lnf_mean = m.make({n}), h.lnf_rstd = m.make({n});
  h.logits = m.make({N, R}), h.stats = m.make({3, N}), h.losses = m.make({N}), h.dlnf = m.make({N, C});
  if (sequence) h.whole = m.make({N, C}), h.dlnf_rows = m.make({n, C});
  h.ws = m.scratch(tp::head_scratch_bytes<float>(ex, c, t, Bn, Tn));
  return h;
}
struct tp_embedding_store {
  std::vector<std::int32_t> mapped;
  tp_store m;
};
inline tp::embedding_views<float> tp_embedding(tp_embedding_store& e, exec<host> const& ex, nn::gpt_config const& c,
                                               int t, index_t Bn, index_t Tn, bool sequence) {
  tp::embedding_views<float> v;
  e.mapped.assign(static_cast<std::size_t>(Bn * Tn), 0);
  v.mapped = tensor_view<std::int32_t>(e.mapped.data(), {Bn, Tn});
  v.spare = e.m.make({1, c.channels});
  if (sequence) v.whole = e.m.make({Bn * Tn, c.channels});
  v.ws = e.m.scratch(tp::embedding_scratch_bytes(ex, c, t, Bn, Tn));
  return v;
}

// Token ids in [0, vocab) from `seed`, the same on every rank.
inline std::vector<std::int32_t> tp_tokens(index_t n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(vocab));
  return v;
}

// (Bn, Tn, C) values ~ N(0, scale) from `seed`, the same on every rank.
inline std::vector<float> tp_values(index_t n, std::uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace tide::test
