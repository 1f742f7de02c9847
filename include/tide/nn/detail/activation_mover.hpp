#pragma once
// How nn::gpt moves its offloaded activations: own_activation_carrier (a model whose hooks carry
// nothing copies on its own stream, engine and pinned pool) and activation_mover (the host
// copies, one block's batch of copies, and the events that order them against compute).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/exec.hpp"
#include "tide/memory/ops.hpp"
#include "tide/memory/pinned_pool.hpp"
#include "tide/memory/stream.hpp"
#include "tide/memory/transfer_engine.hpp"
#include "tide/nn/gpt_config.hpp"

namespace tide::nn {

// Hooks that also carry the model's offloaded activations (gpt_options::offload_activations):
// host room for them, their copies issued as one batch per block, after the compute work that
// `ready` marks, with an event recorded after it, and a drain for a pass that throws. An offload
// scheduler's hooks do (offload::hooks): the activations then move on its activation copy stream
// and engine (beside its chunk copies), and share its host pool and host_budget, its counters and
// its timeline. With other hooks the model carries them itself. Hooks that carry them must
// outlive the model, which returns its host room when it is destroyed.
template <class H, class B>
concept ActivationCarrier = requires(H& h, std::byte* p, std::size_t n, int block, memory::copy_direction d,
                                     std::span<memory::copy_request const> copies, memory::event<B> const& ready,
                                     memory::event<B>& done) {
  { h.activation_host(n) } -> std::same_as<std::byte*>;
  { h.release_activation_host(p, n) } noexcept;  // from the destructor and a pass that throws
  h.copy_activations(block, d, copies, ready, done);
  { h.drain_activations() } noexcept;
};

}  // namespace tide::nn

namespace tide::nn::detail {

// What a model whose hooks carry nothing moves its activations with: its own copy stream,
// transfer engine and pinned pool.
template <Backend B>
struct own_activation_carrier {
  memory::stream<B> copy{};
  memory::transfer_engine<B> engine{copy, {.max_in_flight = 64}};
  memory::pinned_pool<B> pool{};

  std::byte* activation_host(std::size_t bytes) { return static_cast<std::byte*>(pool.allocate(bytes)); }
  void release_activation_host(std::byte* p, std::size_t bytes) noexcept { pool.deallocate(p, bytes); }
  void copy_activations(int, memory::copy_direction d, std::span<memory::copy_request const> copies,
                        memory::event<B> const& ready, memory::event<B>& done) {
    engine.copy_stream().wait(ready);
    engine.copy_async(copies, d, done);
  }
  void drain_activations() noexcept { engine.drain(); }  // a failed copy is the pass's error
};
struct no_carrier {};

// One model's offloaded activations: where they are on the host, the copies being issued, and
// per block (by block + 1) the events after its copies out and back.
template <Backend B, class Own>
struct activation_mover {
  [[no_unique_address]] Own own;  // the copies' carrier when the hooks carry none (else empty)
  std::byte* host = nullptr;
  std::size_t host_bytes = 0;
  std::vector<memory::copy_request> batch;      // one block's copies (reused: nothing allocated per step)
  std::vector<memory::event<B>> sent, fetched;  // by block + 1: after its copies out, back
  memory::event<B> ready;                       // the compute work before the copies being issued
  std::vector<std::uint8_t> sending, fetching;  // by block + 1: those copies are issued

  explicit activation_mover(int layers)
      : sent(static_cast<std::size_t>(layers + 1)), fetched(static_cast<std::size_t>(layers + 1)),
        sending(static_cast<std::size_t>(layers + 1), 0), fetching(static_cast<std::size_t>(layers + 1), 0) {}
  activation_mover(activation_mover const&) = delete;
  activation_mover& operator=(activation_mover const&) = delete;

  static std::size_t at(int b) noexcept { return static_cast<std::size_t>(b - embedding_block); }
  // The compute work issued from now on runs after block b's copies (host: the caller waits).
  void wait_sent(exec<B> const& ex, int b) {
    if (b >= embedding_block && sending[at(b)]) memory::wait(ex, sent[at(b)]);
  }
  void wait_fetched(exec<B> const& ex, int b) {
    if (b >= embedding_block && fetching[at(b)]) memory::wait(ex, fetched[at(b)]);
  }
  // Waits for every copy of the pass (rethrows a failed one): none runs on into the next.
  void finish(std::vector<std::uint8_t> const& issued, std::vector<memory::event<B>>& events) {
    for (std::size_t i = 0; i < issued.size(); ++i)
      if (issued[i]) events[i].synchronize();
  }
};

}  // namespace tide::nn::detail
