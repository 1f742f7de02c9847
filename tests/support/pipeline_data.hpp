#pragma once
// What the pipeline tests share: a GPT of 8 blocks (-1 .. 6, so up to 8 pieces: p = 4 stages of
// v = 2 chunks) and micro-batches of random tokens and targets.

#include <cstdint>
#include <random>
#include <vector>

#include "tide/nn/gpt.hpp"

namespace tide::test {

inline constexpr nn::gpt_config pipeline_gpt{.layers = 6, .heads = 2, .channels = 16, .vocab = 32,
                                             .padded_vocab = 40, .max_seq = 8};
inline constexpr index_t pipeline_B = 2, pipeline_T = 6;

// m micro-batches of (B, T) tokens and targets, drawn from `seed`; `micro` views them.
struct pipeline_micro_batches {
  using batch = nn::gpt<host>::batch_type;
  std::vector<std::vector<std::int32_t>> tokens, targets;
  std::vector<batch> micro;
  explicit pipeline_micro_batches(int m, std::uint32_t seed = 7) {
    std::mt19937 rng(seed);
    for (int k = 0; k < m; ++k) {
      tokens.emplace_back(static_cast<std::size_t>(pipeline_B * pipeline_T));
      targets.emplace_back(static_cast<std::size_t>(pipeline_B * pipeline_T));
      for (auto& t : tokens.back()) t = static_cast<std::int32_t>(rng() % pipeline_gpt.vocab);
      for (auto& t : targets.back()) t = static_cast<std::int32_t>(rng() % pipeline_gpt.vocab);
    }
    view();
  }
  pipeline_micro_batches(pipeline_micro_batches const& o) : tokens(o.tokens), targets(o.targets) { view(); }
  pipeline_micro_batches& operator=(pipeline_micro_batches const&) = delete;

 private:
  void view() {
    micro.clear();
    for (std::size_t i = 0; i < tokens.size(); ++i)
      micro.push_back({{tokens[i].data(), {pipeline_B, pipeline_T}}, {targets[i].data(), {pipeline_B, pipeline_T}}});
  }
};

}  // namespace tide::test
