// tide::tp::gpt on a group of one rank (comm::self): nn::gpt's gradients bit for bit, plain and
// sequence parallel, and its parameters are nn::gpt's; a config tensor parallelism cannot cut is
// refused. Groups of 2 and 4 ranks: tests/mpi/tensor_parallel.cpp.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "support/tp_block.hpp"
#include "tide/comm/self.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/tp/gpt.hpp"

TEST_CASE("tp gpt: on a group of one it is nn::gpt: the same parameters and gradients, bit for bit") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::comm::self self;
  tide::nn::gpt_config const config{.layers = 2, .heads = 4, .channels = 32, .vocab = 60, .padded_vocab = 64,
                                    .max_seq = 8};
  tide::index_t const Bn = 2, Tn = 8;
  auto const tokens = tide::test::tp_tokens(Bn * Tn, config.vocab, 1), targets = tide::test::tp_tokens(Bn * Tn, config.vocab, 2);
  tide::tensor_view<std::int32_t const> const tok(tokens.data(), {Bn, Tn}), tgt(targets.data(), {Bn, Tn});
  tide::memory::device_arena<tide::host> arena{{.budget = std::size_t{64} << 20}};
  tide::nn::gpt<tide::host> whole(config, arena, {.seed = 9});
  float const loss = whole.forward(ex, tok, tgt);
  whole.backward(ex);
  for (bool const sequence : {false, true}) {
    CAPTURE(sequence);
    tide::tp::gpt<tide::comm::self> m(config, self, {.sequence = sequence, .seed = 9});
    CHECK_THROWS_WITH_AS(m.backward(ex), doctest::Contains("no forward since the last backward"), tide::error);
    float const got = m.forward(ex, tok, tgt);
    CHECK(std::fabs(got - loss) <= 1e-6f * loss);  // the mean's sum order may differ; the losses do not
    m.backward(ex);
    CHECK_THROWS_WITH_AS(m.backward(ex), doctest::Contains("one backward per forward"), tide::error);
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
  }
  CHECK_THROWS_WITH_AS(tide::tp::shard_parameters({.layers = 1, .heads = 4, .channels = 32, .vocab = 60,
                                                   .padded_vocab = 64, .max_seq = 8, .wte_pieces = 2}, 2),
                       doctest::Contains("pass wte_pieces = 1"), tide::error);
  CHECK_THROWS_WITH_AS(tide::tp::shard_parameters({.layers = 1, .heads = 4, .channels = 32, .vocab = 60,
                                                   .padded_vocab = 66, .max_seq = 8}, 4),
                       doctest::Contains("does not split over 4 ranks"), tide::error);
}
