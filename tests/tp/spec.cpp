// make_trainer with tp::gpt_spec on a group of one rank (comm::self): the same steps as
// nn::gpt_spec bit for bit, under chunked offload with clipping; a checkpoint of either loads
// into the other; a step that throws changes nothing. Groups of 2 and 4 ranks, data parallelism
// and checkpoints across group sizes: tests/mpi/tensor_parallel.cpp.

#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/tp_block.hpp"
#include "tide/comm/self.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/tp/spec.hpp"
#include "tide/train/trainer.hpp"

namespace {

tide::nn::gpt_config const config{.layers = 2, .heads = 4, .channels = 32, .vocab = 60, .padded_vocab = 64,
                                  .max_seq = 8};
constexpr tide::index_t Bn = 2, Tn = 8;
using chunked = tide::offload::chunked<tide::offload::belady>;
chunked const offload{.device_budget = std::size_t{4} << 20, .chunk_bytes = std::size_t{16} << 10};
tide::optim::adamw const opt{.lr = 1e-2f, .clip_norm = 0.5f, .micro_steps = 2};

// Two micro-batches per step, drawn from the step's number.
struct batches {
  std::vector<std::vector<std::int32_t>> tokens, targets;
  explicit batches(int step) {
    for (int m = 0; m < 2; ++m) {
      tokens.push_back(tide::test::tp_tokens(Bn * Tn, config.vocab, static_cast<std::uint32_t>(40 + 2 * step + m)));
      targets.push_back(tide::test::tp_tokens(Bn * Tn, config.vocab, static_cast<std::uint32_t>(80 + 2 * step + m)));
    }
  }
  template <class Batch>
  std::vector<Batch> views() const {
    std::vector<Batch> out;
    for (std::size_t m = 0; m < tokens.size(); ++m)
      out.push_back({{tokens[m].data(), {Bn, Tn}}, {targets[m].data(), {Bn, Tn}}});
    return out;
  }
};

// The micro-batches as (B, T/2), from their first B T/2 tokens: a new (B, T).
template <class Batch>
std::vector<Batch> halved(std::vector<Batch> v) {
  for (auto& m : v) m.tokens = {m.tokens.data(), {Bn, Tn / 2}}, m.targets = {m.targets.data(), {Bn, Tn / 2}};
  return v;
}

template <class Trainer>
std::vector<std::vector<float>> params_of(Trainer& t) {
  std::vector<std::vector<float>> out;
  for (std::uint32_t i = 0; i < t.scheduler().parameters().size(); ++i) out.push_back(t.scheduler().read_param(i));
  return out;
}

}  // namespace

TEST_CASE("tp gpt_spec: make_trainer on a group of one trains as nn::gpt_spec, bit for bit, and checkpoints cross") {
  tide::comm::self self;
  auto whole = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{.config = config, .options = {.seed = 3}},
                                         offload, opt);
  using tp_spec = tide::tp::gpt_spec<tide::comm::self>;
  for (bool const sequence : {false, true}) {
    CAPTURE(sequence);
    auto shard = tide::train::make_trainer(tp_spec{.config = config, .tensor = {.group = &self, .sequence = sequence},
                                                   .seed = 3},
                                           offload, opt);
    auto reference = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{.config = config, .options = {.seed = 3}},
                                               offload, opt);
    CHECK(params_of(shard) == params_of(reference));
    int differ = 0;
    for (int s = 0; s < 3; ++s) {
      batches const b(s);
      auto const a = shard.step(b.views<decltype(shard)::batch_type>());
      auto const r = reference.step(b.views<decltype(reference)::batch_type>());
      differ += a.loss != r.loss || a.grad_norm != r.grad_norm;
      CHECK(a.grad_norm * opt.micro_steps > opt.clip_norm);  // the clip acted
    }
    CHECK(differ == 0);
    CHECK(params_of(shard) == params_of(reference));

    // A step that throws (the arena refuses the activations of a new (B, T)) changes nothing: the
    // next step of the old shape runs on the old activations, and one of the new shape after it.
    auto const before = params_of(shard);
    batches const next(3);
    auto const shorter = halved(next.views<decltype(shard)::batch_type>());
    shard.arena().fail_allocation(1);
    CHECK_THROWS_WITH_AS(shard.step(shorter), doctest::Contains("injected"), tide::error);
    CHECK(params_of(shard) == before);
    CHECK(shard.steps() == 3);
    auto const a = shard.step(next.views<decltype(shard)::batch_type>());
    auto const r = reference.step(next.views<decltype(reference)::batch_type>());
    CHECK(a.loss == r.loss);
    CHECK(shard.step(shorter).step == 5);
    CHECK(reference.step(halved(next.views<decltype(reference)::batch_type>())).step == 5);
    CHECK(params_of(shard) == params_of(reference));

    // Either checkpoint loads into the other; the next step is then the same on both.
    auto const dir = std::filesystem::path(TIDE_BINARY_DIR) / "tests" / "tp_spec_checkpoint";
    std::filesystem::remove_all(dir);
    shard.save(dir / "tp.ckpt");
    reference.save(dir / "nn.ckpt");
    auto tp_loaded = tide::train::make_trainer(tp_spec{.config = config, .tensor = {.group = &self}, .seed = 8}, offload, opt);
    tp_loaded.load(dir / "nn.ckpt");
    whole.load(dir / "tp.ckpt");
    batches const after(5);
    auto const x = tp_loaded.step(after.views<decltype(tp_loaded)::batch_type>());
    auto const y = whole.step(after.views<decltype(whole)::batch_type>());
    CHECK(x.loss == y.loss);
    CHECK(params_of(tp_loaded) == params_of(whole));
    std::filesystem::remove_all(dir);
  }
}
