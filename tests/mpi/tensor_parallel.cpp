// tide::tp over MPI ranks: a block split over groups of t = 2 and 4 ranks equals the whole block
// on one rank (nn::gpt's kernels) within a bound derived below, for the output, the input's
// gradient and every parameter's gradient (accumulated over 2 micro-batches); sequence
// parallelism equals plain tensor parallelism within the same bound; a shard of the wrong heads
// does not pass it.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "support/mpi_world.hpp"
#include "support/tp_block.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/tp/gpt.hpp"

namespace {

using namespace tide::test;
using tide::index_t;

constexpr tide::nn::gpt_config config{.layers = 1, .heads = 4, .channels = 32, .vocab = 64, .max_seq = 16};
constexpr index_t Bn = 2, Tn = 8, C = config.channels, N = Bn * Tn;

// The bound. Summing the same K float terms in two orders gives results that differ by at most
// 2 γ_K Σ|terms|, γ_K = K u / (1 − K u), u = 2^-24 (Higham, Accuracy and Stability of Numerical
// Algorithms, §3.1). A group of t splits the row-parallel GEMMs' sums (K = C and 4C) and, in the
// backward, the column-parallel GEMMs' input gradients' (K = 3C and 4C) into t partial sums added
// across the ranks: a change of order in sums of at most K = 4C terms. Σ|terms| is at most the
// tensor's scale here (inputs of unit size, weights of 0.02: no cancellation to speak of), and
// each value passes through at most 4 such sums and 2 LayerNorms on its way, each LayerNorm
// scaling an error by its weight times rstd (here below 2). So, per tensor,
// max |tp − whole| <= 2 γ_4C · 4 · 2 · 2 · max |whole| = 32 γ_4C max |whole| (4.9e-5 of its
// largest value at C = 32). Rounding errors of random sign grow like √K, not K: the bound holds
// with room (the errors seen are below 0.002 of it), and a wrong shard misses it by orders of
// magnitude (its gradients by more than 1000 times).
double bound(std::span<float const> whole, double K = 4.0 * C) {
  double const u = std::ldexp(1.0, -24), gamma = K * u / (1 - K * u);
  double scale = 0;
  for (float v : whole) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  return 32 * gamma * scale;
}

// max |a − b| over b's bound: <= 1 passes.
double over_bound(std::span<float const> a, std::span<float const> b, double K = 4.0 * C) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return worst == 0 ? 0 : worst / bound(b, K);  // equal (all zero, e.g. a part of padding rows only): 0
}


constexpr int micro = 2;  // micro-batches: the gradients accumulate over both

struct whole_run {
  std::vector<float> x[micro], dy[micro];  // each micro-batch's input and output gradient
  std::vector<float> y, dx;                // the last micro-batch's output and input gradient
  tp_params p;
};

// The whole block on this rank alone: nn::gpt's kernels.
whole_run whole(tide::exec<tide::host> const& ex) {
  whole_run r{{}, {}, {}, {}, whole_block(C, 13)};
  tp_store m;
  auto a = gpt_views(m, ex, config, Bn, Tn);
  for (int k = 0; k < micro; ++k) {
    r.x[k] = tp_values(N * C, 11 + 2 * static_cast<std::uint32_t>(k));
    r.dy[k] = tp_values(N * C, 12 + 2 * static_cast<std::uint32_t>(k), 0.1f);
    tp_cview const x(r.x[k].data(), {Bn, Tn, C});
    tide::nn::detail::block_forward(ex, x, a, r.p.views(), config.heads);
    r.y.assign(a.res3.data(), a.res3.data() + a.res3.size());
    r.dx = r.dy[k];
    tide::nn::detail::block_backward(ex, tp_view(r.dx.data(), {Bn, Tn, C}), x, a, r.p.views(), r.p.grads(),
                                     config.heads);
  }
  return r;
}

// The block over `group` (t ranks): each check's worst error over its bound, the largest of them.
struct split_run {
  std::vector<float> y, dx;  // the rank's rows
  tp_params p;
};
split_run on_group(tide::exec<tide::host> const& ex, tide::comm::mpi& group, whole_run const& w, bool sequence,
                   bool mislabel = false) {
  int const t = group.size(), r = group.rank();
  index_t const n = sequence ? N / t : N, first = sequence ? r * n : 0;
  split_run out{{}, {}, shard_of(w.p, C, r, t, mislabel)};
  tp_store m;
  auto a = tp_views(m, ex, config, t, Bn, Tn, sequence);
  for (int k = 0; k < micro; ++k) {
    std::vector<float> x(w.x[k].begin() + first * C, w.x[k].begin() + (first + n) * C);
    tide::tp::block_forward(ex, group, sequence, tp_cview(x.data(), {n, C}), a, out.p.views(), config.heads / t);
    out.y.assign(a.res3.data(), a.res3.data() + a.res3.size());
    out.dx.assign(w.dy[k].begin() + first * C, w.dy[k].begin() + (first + n) * C);
    tide::tp::block_backward(ex, group, sequence, tp_view(out.dx.data(), {n, C}), tp_cview(x.data(), {n, C}), a,
                             out.p.views(), out.p.grads(), config.heads / t);
  }
  tide::tp::reduce_replicated<tide::host, float>(group, sequence, out.p.grads());  // once per step
  return out;
}

// The worst error over the bound of every compared tensor: the output and the input's gradient
// on the rank's rows, and each parameter's gradient against the whole one's shard.
double worst(split_run const& s, whole_run const& w, int rank, int t, bool sequence, bool report = true) {
  index_t const n = sequence ? N / t : N, first = sequence ? rank * n : 0;
  auto const rows = [&](std::vector<float> const& v) {
    return std::vector<float>(v.begin() + first * C, v.begin() + (first + n) * C);
  };
  double r = std::max(over_bound(s.y, rows(w.y)), over_bound(s.dx, rows(w.dx)));
  tp_params const want = [&] {  // the whole gradients' shards, through shard_of on a copy
    tp_params g = w.p;
    g.w = w.p.dw;
    return shard_of(g, C, rank, t);
  }();
  for (int k = 0; k < tide::nn::params_per_block; ++k) {
    double const e = over_bound(s.p.dw[static_cast<std::size_t>(k)], want.w[static_cast<std::size_t>(k)]);
    if (e > 1 && report) MESSAGE(tide::nn::block_param_names[k], " gradient: ", e, " of the bound");
    r = std::max(r, e);
  }
  return r;
}

}  // namespace

TEST_CASE("mpi tp: a block over 2 and 4 ranks equals the whole block within the sum-order bound, plain and "
          "sequence parallel; a shard of the wrong heads does not") {
  auto& world = tide::test::world();
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  whole_run const w = whole(ex);
  for (int t : {2, 4}) {
    if (world.size() % t != 0) continue;
    CAPTURE(t);
    tide::comm::mpi group = world.split(world.rank() / t, world.rank() % t);
    REQUIRE(group.size() == t);
    split_run const plain = on_group(ex, group, w, false);
    double const e_plain = worst(plain, w, group.rank(), t, false);
    CHECK(e_plain <= 1);
    split_run const seq = on_group(ex, group, w, true);
    double const e_seq = worst(seq, w, group.rank(), t, true);
    CHECK(e_seq <= 1);
    MESSAGE("t = ", t, ": worst error ", e_plain, " (plain), ", e_seq, " (sequence parallel) of the bound");
    // Sequence parallelism against plain tensor parallelism, on the rank's rows: the same bound.
    index_t const n = N / t, first = group.rank() * n;
    std::vector<float> const mine(plain.y.begin() + first * C, plain.y.begin() + (first + n) * C);
    CHECK(over_bound(seq.y, mine) <= 1);
    std::vector<float> const dmine(plain.dx.begin() + first * C, plain.dx.begin() + (first + n) * C);
    CHECK(over_bound(seq.dx, dmine) <= 1);
    for (int k = 0; k < tide::nn::params_per_block; ++k) {
      CAPTURE(tide::nn::block_param_names[k]);
      CHECK(over_bound(seq.p.dw[static_cast<std::size_t>(k)], plain.p.dw[static_cast<std::size_t>(k)]) <= 1);
    }
    // The check can fail: q, k and v of the next rank's heads.
    split_run const wrong = on_group(ex, group, w, false, true);
    CHECK(over_bound(wrong.y, w.y) > 10);
    CHECK(worst(wrong, w, group.rank(), t, false, false) > 100);
  }
}

namespace {

// 60 real tokens in Vp = 64 rows of wte (the last rank's part holds the padding) or in 128 (the
// last ranks hold no real token: their max is -inf, their sum 0).
constexpr tide::nn::gpt_config vocab_config_of(int Vp) {
  return {.layers = 1, .heads = 4, .channels = C, .vocab = 60, .padded_vocab = Vp, .max_seq = Tn};
}

bool same(std::span<float const> a, std::span<float const> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}
std::span<float const> all(tp_view v) { return {v.data(), static_cast<std::size_t>(v.size())}; }
std::vector<float> rows_of(std::span<float const> v, index_t first, index_t n, index_t cols) {
  return {v.begin() + first * cols, v.begin() + (first + n) * cols};
}

// The head's bound is the block's with K = Vp (the sum of exp and the input gradient's product
// with wte are split by vocabulary; the LayerNorm weights' gradients under sequence parallelism
// by rows, N = 16 of them): 32 γ_Vp of each tensor's largest value. Two threads per rank: the
// per-row passes in several slices.
void vocabulary_parallel(index_t Vp) {
  CAPTURE(Vp);
  auto const vocab_config = vocab_config_of(static_cast<int>(Vp));
  auto const K = static_cast<double>(Vp);  // the bound's longest split sum
  auto& world = tide::test::world();
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  auto const tokens = tp_tokens(N, vocab_config.vocab, 21), targets = tp_tokens(N, vocab_config.vocab, 22);
  tide::tensor_view<std::int32_t const> const tok(tokens.data(), {Bn, Tn}), tgt(targets.data(), {Bn, Tn});
  auto const wte = tp_values(Vp * C, 23, 0.02f), wpe = tp_values(Tn * C, 24, 0.02f);
  auto const x = tp_values(N * C, 25), lnf_w = tp_values(C, 26, 1.f), lnf_b = tp_values(C, 27, 0.02f);
  auto const dout = tp_values(N * C, 28, 0.1f);
  tp_cview const wpe_v(wpe.data(), {Tn, C}), lw(lnf_w.data(), {C}), lb(lnf_b.data(), {C});
  float const dloss = 1.f / N;
  // The whole table and head on this rank.
  std::vector<float> out(static_cast<std::size_t>(N * C)), dwte(wte.size()), dwpe(wpe.size());
  tide::kernels::encoder_forward(ex, tp_view(out.data(), {Bn, Tn, C}), tok, tp_cview(wte.data(), {Vp, C}), wpe_v);
  tide::kernels::encoder_backward(ex, tp_view(dwte.data(), {Vp, C}), tp_view(dwpe.data(), {Tn, C}),
                                  tp_cview(dout.data(), {Bn, Tn, C}), tok);
  tp_store w;
  tp_view const lnf = w.make({N, C}), mean = w.make({N}), rstd = w.make({N}), logits = w.make({N, Vp});
  tp_view const losses = w.make({N}), dlnf = w.make({N, C}), dx = w.make({N, C});
  tp_view const dwte_h = w.make({Vp, C}), dlw = w.make({C}), dlb = w.make({C});
  tide::kernels::layernorm_forward(ex, lnf, mean, rstd, tp_cview(x.data(), {N, C}), lw, lb);
  tide::kernels::matmul_forward(ex, logits, tp_cview(lnf), tp_cview(wte.data(), {Vp, C}), tp_cview{});
  tide::kernels::fused_classifier(ex, logits, losses, tp_cview(logits),
                                  tide::tensor_view<std::int32_t const>(targets.data(), {N}), vocab_config.vocab, dloss);
  tide::kernels::matmul_backward(ex, dlnf, dwte_h, tp_view{}, tp_cview(logits), tp_cview(lnf), tp_cview(wte.data(), {Vp, C}));
  tide::kernels::layernorm_backward(ex, dx, dlw, dlb, tp_cview(dlnf), tp_cview(x.data(), {N, C}), lw,
                                    tide::tensor_view<float const>(mean), tide::tensor_view<float const>(rstd));

  for (int t : {2, 4}) {
    if (world.size() % t != 0) continue;
    CAPTURE(t);
    tide::comm::mpi group = world.split(world.rank() / t, world.rank() % t);
    auto const part = tide::tp::vocab_part_of(vocab_config, group.rank(), t);
    tp_cview const wte_part(wte.data() + part.first * C, {part.rows, C});
    auto const dwte_want = rows_of(dwte, part.first, part.rows, C), dwte_h_want = rows_of(all(dwte_h), part.first, part.rows, C);
    for (bool const sequence : {false, true}) {
      CAPTURE(sequence);
      index_t const n = sequence ? N / t : N, first = sequence ? group.rank() * n : 0;
      tp_embedding_store es;
      auto const e = tp_embedding(es, ex, vocab_config, t, Bn, Tn, sequence);
      std::vector<float> o(static_cast<std::size_t>(n * C)), gw(static_cast<std::size_t>(part.rows * C)), gp(wpe.size());
      tide::tp::embedding_forward(ex, group, sequence, tp_view(o.data(), {n, C}), tok, wte_part, wpe_v, part, e,
                                  vocab_config.vocab);
      CHECK(same(o, rows_of(out, first, n, C)));
      auto const d_rows = rows_of(dout, first, n, C);
      tide::tp::embedding_backward(ex, group, sequence, tp_view(gw.data(), {part.rows, C}), tp_view(gp.data(), {Tn, C}),
                                   tp_cview(d_rows.data(), {n, C}), tok, part, e);
      CHECK(same(gw, dwte_want));
      CHECK(same(gp, dwpe));

      tp_store hm;
      auto const h = tp_head(hm, ex, vocab_config, t, Bn, Tn, sequence);
      tp_view const g_dx = hm.make({n, C}), g_dwte = hm.make({part.rows, C}), g_lw = hm.make({C}), g_lb = hm.make({C});
      auto const x_rows = rows_of(x, first, n, C);
      tide::tp::head_forward(ex, group, sequence, tp_cview(x_rows.data(), {n, C}), h, lw, lb, wte_part, tgt, part,
                             vocab_config.vocab);
      CHECK(over_bound(all(h.losses), all(losses), K) <= 1);
      tide::tp::head_backward(ex, group, sequence, g_dx, tp_cview(x_rows.data(), {n, C}), h, lw, wte_part, g_dwte, g_lw,
                              g_lb, tgt, part, dloss);
      tide::tp::reduce_replicated(group, sequence, g_lw);
      tide::tp::reduce_replicated(group, sequence, g_lb);
      double const e_dx = over_bound(all(g_dx), rows_of(all(dx), first, n, C), K);
      double const e_w = over_bound(all(g_dwte), dwte_h_want, K);
      double const e_ln = std::max(over_bound(all(g_lw), all(dlw), K), over_bound(all(g_lb), all(dlb), K));
      CHECK(e_dx <= 1);
      CHECK(e_w <= 1);
      CHECK(e_ln <= 1);
      MESSAGE("t = ", t, std::string(sequence ? ", sequence parallel" : ""), ", Vp = ", Vp,
              ": head errors of the bound: dx ", e_dx, ", wte ", e_w, ", lnf ", e_ln);
      if (sequence) continue;
      // The checks can fail: the next rank's rows of wte in place of the rank's.
      auto const other = tide::tp::vocab_part_of(vocab_config, (group.rank() + 1) % t, t);
      tp_cview const wrong(wte.data() + other.first * C, {part.rows, C});
      tide::tp::embedding_forward(ex, group, false, tp_view(o.data(), {n, C}), tok, wrong, wpe_v, part, e,
                                  vocab_config.vocab);
      CHECK_FALSE(same(o, out));
      tide::tp::head_forward(ex, group, false, tp_cview(x_rows.data(), {n, C}), h, lw, lb, wrong, tgt, part,
                             vocab_config.vocab);
      CHECK(over_bound(all(h.losses), all(losses), K) > 10);
    }
  }
}

}  // namespace

TEST_CASE("mpi tp: over 2 and 4 ranks the vocabulary-parallel embedding is the whole table's, bit for bit, and "
          "the head and its cross-entropy equal the whole head within the sum-order bound; ranks without a real "
          "token take part") {
  vocabulary_parallel(64);
  vocabulary_parallel(128);
}

// A whole GPT (L = 2) over groups of 2 and 4: tp::gpt against nn::gpt on one rank, from the same
// seed. Its bound follows the block's: a value passes through at most 4 L + 4 reordered sums (4
// per block, the head's sum of exp and its input gradient's product with wte) and 2 L + 1
// LayerNorms (gain below 2 each), so max |tp − whole| <= 2 γ_4C (4 L + 4) 2^(2 L + 1) max |whole|
// per tensor (5.9e-3 of its largest value here). A model from another seed misses it.
TEST_CASE("mpi tp: a whole GPT over 2 and 4 ranks equals nn::gpt on one rank within the sum-order bound, the loss "
          "and every parameter's gradient, plain and sequence parallel") {
  auto& world = tide::test::world();
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::nn::gpt_config const config{.layers = 2, .heads = 4, .channels = C, .vocab = 60, .padded_vocab = 64,
                                    .max_seq = Tn};
  double const factor = (4.0 * config.layers + 4) * std::ldexp(1.0, 2 * config.layers + 1) / 32;  // over bound()'s 32
  auto const tokens = tp_tokens(N, config.vocab, 31), targets = tp_tokens(N, config.vocab, 32);
  tide::tensor_view<std::int32_t const> const tok(tokens.data(), {Bn, Tn}), tgt(targets.data(), {Bn, Tn});
  tide::memory::device_arena<tide::host> arena{{.budget = std::size_t{64} << 20}};
  tide::nn::gpt<tide::host> whole(config, arena, {.seed = 5});
  float const loss = whole.forward(ex, tok, tgt);
  whole.backward(ex);
  auto const list = tide::nn::gpt_parameters(config, tide::dtype::f32);

  for (int t : {2, 4}) {
    if (world.size() % t != 0) continue;
    CAPTURE(t);
    tide::comm::mpi group = world.split(world.rank() / t, world.rank() % t);
    for (bool const sequence : {false, true}) {
      CAPTURE(sequence);
      // The worst gradient error over the bound, of a model from `seed`.
      auto const worst_of = [&](std::uint64_t seed, float& got) {
        tide::tp::gpt<tide::comm::mpi> m(config, group, {.sequence = sequence, .seed = seed});
        got = m.forward(ex, tok, tgt);
        m.backward(ex);
        double worst = 0;
        for (std::size_t i = 0; i < list.size(); ++i) {
          tide::parameter const& p = list[i];
          auto const g = whole.grad(p);
          std::vector<float> want(static_cast<std::size_t>(m.parameters()[i].numel()));
          tide::tp::take_shard(tide::tp::split_of(config, p, i),
                               std::span<float const>(g.data(), static_cast<std::size_t>(g.size())),
                               std::span<float>(want), p.shape[0], p.shape.rank == 2 ? p.shape[1] : 1, group.rank(), t);
          auto const mine = m.grads(p.name());
          double const e = over_bound(mine, want) / factor;
          if (e > 1 && seed == 5) MESSAGE(p.name(), ": ", e, " of the bound");
          worst = std::max(worst, e);
        }
        return worst;
      };
      float got = 0;
      double const e = worst_of(5, got);
      CHECK(e <= 1);
      CHECK(std::fabs(got - loss) <= factor * bound(std::span<float const>(&loss, 1)));
      MESSAGE("t = ", t, std::string(sequence ? ", sequence parallel" : ""), ": loss ", got, " against ", loss,
              "; worst gradient error ", e, " of the bound");
      float other = 0;
      CHECK(worst_of(6, other) > 10);  // the check can fail
    }
  }
}
