// tide::tp::gpt on a group of one rank (comm::self): nn::gpt's gradients bit for bit, plain and
// sequence parallel, with and without recompute, and its parameters are nn::gpt's; a config tensor parallelism cannot cut is
// refused. As two pipeline stages (block ranges, two micro-batch slots, the boundaries and the
// tied gradient copied between two models) it is nn::gpt's ranges bit for bit. Groups of 2 and 4
// ranks: tests/mpi/tensor_parallel.cpp; in a pipeline of ranks: tests/mpi/tensor_trainer.cpp.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "support/tp_block.hpp"
#include "tide/comm/self.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/tp/gpt.hpp"

namespace {
constexpr tide::nn::gpt_config config{.layers = 2, .heads = 4, .channels = 32, .vocab = 60, .padded_vocab = 64,
                                      .max_seq = 8};
constexpr tide::index_t Bn = 2, Tn = 8;
}  // namespace

TEST_CASE("tp gpt: on a group of one it is nn::gpt: the same parameters and gradients, bit for bit") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::comm::self self;
  auto const tokens = tide::test::tp_tokens(Bn * Tn, config.vocab, 1), targets = tide::test::tp_tokens(Bn * Tn, config.vocab, 2);
  tide::tensor_view<std::int32_t const> const tok(tokens.data(), {Bn, Tn}), tgt(targets.data(), {Bn, Tn});
  tide::memory::device_arena<tide::host> arena{{.budget = std::size_t{64} << 20}};
  tide::nn::gpt<tide::host> whole(config, arena, {.seed = 9});
  float const loss = whole.forward(ex, tok, tgt);
  whole.backward(ex);
  std::size_t kept[2] = {0, 0};  // activation bytes without recompute, plain and sequence parallel
  for (int const run : {0, 1, 2, 3}) {
    bool const sequence = run % 2 == 1, recompute = run >= 2;
    CAPTURE(sequence);
    CAPTURE(recompute);
    tide::tp::gpt<tide::comm::self> m(config, self, {.sequence = sequence, .seed = 9, .recompute = recompute});
    CHECK_THROWS_WITH_AS(m.backward(ex), doctest::Contains("has no forward to go back through"), tide::error);
    float const got = m.forward(ex, tok, tgt);
    CHECK(std::fabs(got - loss) <= 1e-6f * loss);  // the mean's sum order may differ; the losses do not
    m.backward(ex);
    CHECK_THROWS_WITH_AS(m.backward(ex), doctest::Contains("has no forward to go back through"), tide::error);
    int differ = 0;
    for (tide::parameter const& p : whole.parameters()) {
      CAPTURE(p.name());
      auto const w = whole.param(p.name()), g = whole.grad(p.name());
      auto const mw = m.values(p.name()), mg = m.grads(p.name());
      REQUIRE(mw.size() == static_cast<std::size_t>(w.size()));
      differ += std::memcmp(mw.data(), w.data(), mw.size() * 4) != 0;
      differ += std::memcmp(mg.data(), g.data(), mg.size() * 4) != 0;
    }
    CHECK(differ == 0);
    // Recompute keeps each block's output and one shared set of views: less at L = 2 already.
    if (!recompute) kept[sequence] = m.activation_bytes();
    else CHECK(m.activation_bytes() < kept[sequence]);
  }
  CHECK_THROWS_WITH_AS(tide::tp::shard_parameters({.layers = 1, .heads = 4, .channels = 32, .vocab = 60,
                                                   .padded_vocab = 64, .max_seq = 8, .wte_pieces = 2}, 2),
                       doctest::Contains("pass wte_pieces = 1"), tide::error);
  CHECK_THROWS_WITH_AS(tide::tp::shard_parameters({.layers = 1, .heads = 4, .channels = 32, .vocab = 60,
                                                   .padded_vocab = 66, .max_seq = 8}, 4),
                       doctest::Contains("does not split over 4 ranks"), tide::error);
}

TEST_CASE("tp gpt: as two pipeline stages in two slots (1F1B, boundaries copied) it is nn::gpt's ranges, bit for bit, "
          "with and without recompute") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::comm::self self;
  std::vector<std::vector<std::int32_t>> data;
  for (std::uint32_t k = 0; k < 4; ++k) data.push_back(tide::test::tp_tokens(Bn * Tn, config.vocab, 20 + k));
  auto batch = [&](int micro) {
    return tide::tp::gpt<tide::comm::self>::batch_type{{data[2 * micro].data(), {Bn, Tn}},
                                                       {data[2 * micro + 1].data(), {Bn, Tn}}};
  };
  int const L = config.layers;
  // 1F1B on two stages, two micro-batches, as one sequence: stage 0 runs -1 .. 0, stage 1 1 .. L.
  tide::memory::device_arena<tide::host> arena{{.budget = std::size_t{64} << 20}};
  tide::nn::gpt<tide::host> whole(config, arena, {.seed = 9, .in_flight = 2});
  float ref_loss[2];
  for (int k : {0, 1}) (void)whole.forward_blocks(ex, -1, 0, k, {batch(k).tokens, batch(k).targets});
  for (int k : {0, 1}) {
    ref_loss[k] = whole.forward_blocks(ex, 1, L, k, {batch(k).tokens, batch(k).targets});
    whole.backward_blocks(ex, 1, L, k);
  }
  for (int k : {0, 1}) whole.backward_blocks(ex, -1, 0, k);

  for (int const run : {0, 1, 2, 3}) {
    bool const sequence = run % 2 == 1, recompute = run >= 2;
    CAPTURE(sequence);
    CAPTURE(recompute);
    tide::tp::gpt_options const o{.sequence = sequence, .seed = 9, .in_flight = 2, .recompute = recompute};
    tide::tp::gpt<tide::comm::self> s0(config, self, o), s1(config, self, o);
    CHECK_THROWS_WITH_AS((void)s1.boundary(0, 0), doctest::Contains("call plan_activations"), tide::error);
    CHECK_THROWS_WITH_AS(s0.backward_blocks(ex, -1, 0, 0), doctest::Contains("has no forward to go back through"),
                         tide::error);
    CHECK_THROWS_WITH_AS((void)s0.forward_blocks(ex, -1, 0, 2, batch(0)), doctest::Contains("in_flight"), tide::error);
    s1.plan_activations(ex, Bn, Tn);
    auto copy = [](auto to, auto from) {
      REQUIRE(to.size() == from.size());
      std::memcpy(to.data(), from.data(), from.bytes());
    };
    for (int k : {0, 1}) {
      CHECK(std::isnan(s0.forward_blocks(ex, -1, 0, k, batch(k))));
      copy(s1.boundary(0, k), s0.boundary(0, k));
    }
    for (int k : {0, 1}) {
      float const loss = s1.forward_blocks(ex, 1, L, k, batch(k));
      CHECK(std::fabs(loss - ref_loss[k]) <= 1e-6f * ref_loss[k]);  // the mean's sum order may differ
      s1.backward_blocks(ex, 1, L, k);
      copy(s0.boundary_grad(k), s1.boundary_grad(k));
      copy(s0.tied_grad(k), s1.tied_grad(k));
    }
    for (int k : {0, 1}) s0.backward_blocks(ex, -1, 0, k);
    // Each stage's blocks' gradients are the whole model's; wte's whole on the embedding's stage,
    // zero on the head's (its share went with the tied gradient).
    int differ = 0, zero = 0;
    for (tide::parameter const& p : whole.parameters()) {
      CAPTURE(p.name());
      auto const g = whole.grad(p.name());
      bool const first = p.layer <= 0, tied = p.name() == "wte";
      auto const mg = (first ? s0 : s1).grads(p.name());
      differ += std::memcmp(mg.data(), g.data(), mg.size() * 4) != 0;
      if (tied)
        for (float x : s1.grads(p.name())) zero += x != 0.f;
    }
    CHECK(differ == 0);
    CHECK(zero == 0);
  }
  tide::tp::gpt<tide::comm::self> one(config, self, {.seed = 9});
  CHECK_THROWS_WITH_AS((void)one.tied_grad(0), doctest::Contains("separate_tied_grad = true"), tide::error);
}
