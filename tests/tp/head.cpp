// tide::tp's two ends on a group of one rank (comm::self): the vocabulary-parallel embedding is
// kernels::encoder_forward / encoder_backward and the vocabulary-parallel head with its
// cross-entropy is the whole head (LayerNorm, logits, fused_classifier, their backward), bit for
// bit, plain and sequence parallel; a vocabulary that does not split and a token outside it are
// refused. Groups of 2 and 4 ranks: tests/mpi/tensor_parallel.cpp.

#include <doctest/doctest.h>

#include <cstring>
#include <span>
#include <vector>

#include "support/tp_block.hpp"
#include "tide/comm/self.hpp"

namespace {

using namespace tide::test;
using tide::index_t;

// Vp = 64 rows, of which 60 real: the padding is in the last rank's part.
constexpr tide::nn::gpt_config config{.layers = 1, .heads = 4, .channels = 32, .vocab = 60, .padded_vocab = 64,
                                      .max_seq = 16};
constexpr index_t Bn = 2, Tn = 8, C = config.channels, N = Bn * Tn, Vp = 64;

bool same(std::span<float const> a, std::span<float const> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}
std::span<float const> all(tp_view v) { return {v.data(), static_cast<std::size_t>(v.size())}; }

}  // namespace

TEST_CASE("tp head and embedding: on a group of one they are the whole table's and head's, bit for bit") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::comm::self self;
  auto const tokens = tp_tokens(N, config.vocab, 1), targets = tp_tokens(N, config.vocab, 2);
  tide::tensor_view<std::int32_t const> const tok(tokens.data(), {Bn, Tn}), tgt(targets.data(), {Bn, Tn});
  auto const wte = tp_values(Vp * C, 3, 0.02f), wpe = tp_values(config.max_seq * C, 4, 0.02f);
  auto const x = tp_values(N * C, 5), lnf_w = tp_values(C, 6, 1.f), lnf_b = tp_values(C, 7, 0.02f);
  auto const dout = tp_values(N * C, 8, 0.1f);
  tp_cview const wte_v(wte.data(), {Vp, C}), wpe_v(wpe.data(), {config.max_seq, C}), x_v(x.data(), {N, C});
  tp_cview const lw(lnf_w.data(), {C}), lb(lnf_b.data(), {C});
  float const dloss = 1.f / N;

  // The whole table's lookup and gradients.
  std::vector<float> out(static_cast<std::size_t>(N * C)), dwte(wte.size()), dwpe(wpe.size());
  tide::kernels::encoder_forward(ex, tp_view(out.data(), {Bn, Tn, C}), tok, wte_v, wpe_v);
  tide::kernels::encoder_backward(ex, tp_view(dwte.data(), {Vp, C}), tp_view(dwpe.data(), {config.max_seq, C}),
                                  tp_cview(dout.data(), {Bn, Tn, C}), tok);
  // The whole head: LayerNorm, logits, fused classifier, then its backward.
  tp_store w;
  tp_view const lnf = w.make({N, C}), mean = w.make({N}), rstd = w.make({N}), logits = w.make({N, Vp});
  tp_view const losses = w.make({N}), dlnf = w.make({N, C}), dx = w.make({N, C});
  tp_view const dwte_h = w.make({Vp, C}), dlw = w.make({C}), dlb = w.make({C});
  tide::kernels::layernorm_forward(ex, lnf, mean, rstd, x_v, lw, lb);
  tide::kernels::matmul_forward(ex, logits, tp_cview(lnf), wte_v, tp_cview{});
  tide::kernels::fused_classifier(ex, logits, losses, tp_cview(logits), tide::tensor_view<std::int32_t const>(
                                      targets.data(), {N}), config.vocab, dloss);
  tide::kernels::matmul_backward(ex, dlnf, dwte_h, tp_view{}, tp_cview(logits), tp_cview(lnf), wte_v);
  tide::kernels::layernorm_backward(ex, dx, dlw, dlb, tp_cview(dlnf), x_v, lw, tide::tensor_view<float const>(mean),
                                    tide::tensor_view<float const>(rstd));

  auto const part = tide::tp::vocab_part_of(config, 0, 1);
  CHECK(part.rows == Vp);
  CHECK(part.real == config.vocab);
  for (bool const sequence : {false, true}) {
    CAPTURE(sequence);
    tp_embedding_store es;
    auto const e = tp_embedding(es, ex, config, 1, Bn, Tn, sequence);
    std::vector<float> o(out.size()), gw(dwte.size()), gp(dwpe.size());
    tide::tp::embedding_forward(ex, self, sequence, tp_view(o.data(), {N, C}), tok, wte_v, wpe_v, part, e, config.vocab);
    CHECK(same(o, out));
    tide::tp::embedding_backward(ex, self, sequence, tp_view(gw.data(), {Vp, C}), tp_view(gp.data(), {config.max_seq, C}),
                                 tp_cview(dout.data(), {N, C}), tok, part, e);
    CHECK(same(gw, dwte));
    CHECK(same(gp, dwpe));

    tp_store hm;
    auto const h = tp_head(hm, ex, config, 1, Bn, Tn, sequence);
    tp_view const g_dx = hm.make({N, C}), g_dwte = hm.make({Vp, C}), g_lw = hm.make({C}), g_lb = hm.make({C});
    tide::tp::head_forward(ex, self, sequence, x_v, h, lw, lb, wte_v, tgt, part, config.vocab);
    CHECK(same(all(h.losses), all(losses)));
    tide::tp::head_backward(ex, self, sequence, g_dx, x_v, h, lw, wte_v, g_dwte, g_lw, g_lb, tgt, part, dloss);
    CHECK(same(all(h.logits), all(logits)));  // the logits' gradient
    CHECK(same(all(g_dx), all(dx)));
    CHECK(same(all(g_dwte), all(dwte_h)));
    CHECK(same(all(g_lw), all(dlw)));
    CHECK(same(all(g_lb), all(dlb)));
  }
}

TEST_CASE("tp head: a vocabulary that does not split over the group and a token outside it are refused") {
  CHECK_THROWS_WITH_AS(tide::tp::vocab_part_of(config, 0, 3), doctest::Contains("does not split over 3 ranks"),
                       tide::error);
  auto const p = tide::tp::vocab_part_of(config, 3, 4);  // rows 48 .. 63, real 48 .. 59
  CHECK(p.first == 48);
  CHECK(p.real == 12);
  CHECK(tide::tp::vocab_part_of(config, 1, 4).real == 16);

  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::comm::self self;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(N), 1);
  tokens[5] = config.vocab;  // one past the real tokens: padding, not a token
  auto const wte = tp_values(Vp * C, 3), wpe = tp_values(config.max_seq * C, 4);
  tp_embedding_store es;
  auto const e = tp_embedding(es, ex, config, 1, Bn, Tn, false);
  std::vector<float> o(static_cast<std::size_t>(N * C));
  CHECK_THROWS_WITH_AS(tide::tp::embedding_forward(ex, self, false, tp_view(o.data(), {N, C}),
                                                   tide::tensor_view<std::int32_t const>(tokens.data(), {Bn, Tn}),
                                                   tp_cview(wte.data(), {Vp, C}), tp_cview(wpe.data(), {16, C}),
                                                   tide::tp::vocab_part_of(config, 0, 1), e, config.vocab),
                       doctest::Contains("tokens[0, 5] = 60 is outside the vocabulary [0, 60)"), tide::error);
}
