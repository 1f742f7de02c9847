#pragma once
// What the offload and trainer tests feed a small GPT: deterministic, learnable token batches,
// and the activation bytes of one step (the non-model data a scheduler's budget must hold).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tide/core/bytes.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/ops.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/offload/scheduler.hpp"

namespace tide::test {

// The tiny GPT the trainer-level tests train (L 2, C 32, V 64), its step (B, T) = (2, 16), and the
// spec make_trainer builds it from (seed 3).
inline constexpr nn::gpt_config tiny_gpt{.layers = 2, .heads = 2, .channels = 32, .vocab = 64, .max_seq = 16};
inline constexpr index_t tiny_batch = 2, tiny_seq = 16;
inline nn::gpt_spec<host> tiny_spec() { return {.config = tiny_gpt, .options = {.seed = 3}}; }

// A trainer's batch over the tokens and targets of token_runs (tiny_batch, tiny_seq).
template <class Trainer>
typename Trainer::batch_type tiny_view(std::vector<std::int32_t> const& d) {
  return {{d.data(), {tiny_batch, tiny_seq}}, {d.data() + tiny_batch * tiny_seq, {tiny_batch, tiny_seq}}};
}

// Every parameter of a trainer's model, in order, in one vector.
template <class Trainer>
std::vector<float> flat_params(Trainer& t) {
  std::vector<float> out;
  for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) {
    auto const p = t.scheduler().read_param(i);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

// Tokens then targets of batch s, (B, T) each: runs of a cycle with a stride of 3 starting at
// 5 s + 11 b, each target the next element of the run (so the loss can fall).
inline std::vector<std::int32_t> token_runs(int s, index_t batch, index_t seq, int vocab) {
  auto const n = static_cast<std::size_t>(batch * seq);
  std::vector<std::int32_t> v(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    auto const b = i / static_cast<std::size_t>(seq), t = i % static_cast<std::size_t>(seq);
    auto const start = static_cast<std::size_t>(s) * 5 + b * 11;
    v[i] = static_cast<std::int32_t>((start + t * 3) % static_cast<std::size_t>(vocab));
    v[n + i] = static_cast<std::int32_t>((start + (t + 1) * 3) % static_cast<std::size_t>(vocab));
  }
  return v;
}

// A trainer's batches of token_runs(s, Batch, Seq, Vocab): views of host memory on tide::host; on
// a device backend, of a device buffer of its own that the tokens are written to in compute order
// (a user's input buffer), so the trainer reads them where its kernels run.
//
//   batch_feeder<decltype(t), 2, 16, 64> feed;
//   t.step(feed(t, s));
template <class Trainer, index_t Batch, index_t Seq, int Vocab>
struct batch_feeder {
  using B = typename Trainer::backend;
  static constexpr std::size_t bytes = 2 * Batch * Seq * sizeof(std::int32_t);
  memory::device_arena<B> inputs{{.budget = std::size_t{64} << 10}};
  std::int32_t* device = static_cast<std::int32_t*>(inputs.allocate(bytes));
  std::vector<std::int32_t> host;
  batch_feeder() = default;
  batch_feeder(batch_feeder const&) = delete;
  batch_feeder& operator=(batch_feeder const&) = delete;
  ~batch_feeder() { inputs.deallocate(device, bytes); }
  typename Trainer::batch_type operator()(Trainer& t, int s) {
    host = token_runs(s, Batch, Seq, Vocab);
    std::int32_t const* at = host.data();
    if constexpr (B::is_device) {
      memory::write_from_host(t.executor(), device, host.data(), bytes);
      at = device;
    }
    return {{at, {Batch, Seq}}, {at + Batch * Seq, {Batch, Seq}}};
  }
};

// The arena bytes of a (batch, seq) forward's activations, rounded to the arena's alignment.
// options: the model's (recompute and offload_activations shrink the plan). threads: the pool of
// the run it sizes (the host kernels' scratch, planned with the activations, grows with it).
inline std::size_t activation_bytes(nn::gpt_config const& config, index_t batch, index_t seq,
                                    nn::gpt_options options = {}, int threads = 2) {
  thread_pool pool{threads};
  exec<host> ex{pool};
  memory::device_arena<host> arena{{.budget = std::size_t{64} << 20}};
  options.seed = 7;
  nn::gpt<host> model{config, arena, options};
  auto const data = token_runs(0, batch, seq, config.vocab);
  model.forward(ex, tensor_view<std::int32_t const, host>(data.data(), {batch, seq}));
  return round_up(model.activations().footprint, 256);
}

// The least device budget scheduler<host, T, Config> accepts for a (batch, seq) step of `config`:
// offloading tests run just above it, so chunks really move.
template <class Config, class T = float>
std::size_t scheduler_minimum(nn::gpt_config const& config, Config const& cfg, index_t batch, index_t seq,
                              nn::gpt_options const& options = {}) {
  thread_pool pool{1};
  exec<host> ex{pool};
  memory::device_arena<host> arena{{.budget = std::size_t{64} << 20}};
  offload::scheduler<host, T, Config> sched{ex, arena, nn::gpt_parameters(config, dtype_of<T>),
                                            nn::gpt_block_uses(config), cfg};
  return sched.minimum_device_bytes(activation_bytes(config, batch, seq, options));
}

}  // namespace tide::test
