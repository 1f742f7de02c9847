#pragma once
// The gradient sink's side of the offload engine: the sink S itself, the chunks handed to it in
// this step, and by chunk the event its work records (`reduced`) and whether that work is still
// to be waited for. The engine decides when a chunk is handed over and who waits for it (a copy
// stream, the optimizer lane, the host); the lane keeps what it promised.
//
// A failure of the sink's work is reported once, by the wait that meets it, and fails the step;
// abandoning the step waits for the rest without reporting (quiet()).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include "tide/memory/stream.hpp"
#include "tide/offload/detail/clock.hpp"
#include "tide/offload/gradient_sink.hpp"
#include "tide/offload/stats.hpp"

namespace tide::offload::detail {

template <Backend B, Element T, class S>
class sink_lane {
 public:
  sink_lane(S const& sink, std::uint32_t n, offload_stats& stats) : sink_(sink), stats_(&stats) {
    reduced_.resize(n);
    pending_.assign(n, false);
    reducing_.reserve(n);  // a step appends to these, and allocates nothing
    unowned_.reserve(n);
    shared_.reserve(n);
  }

  // The chunks whose gradients complete in a step (each is handed over once per step).
  void set_chunks_per_step(std::size_t n) noexcept { chunks_per_step_ = n; }
  [[nodiscard]] S& sink() noexcept { return sink_; }
  [[nodiscard]] S const& sink() const noexcept { return sink_; }

  void begin_step() noexcept {
    handed_ = 0;
    reducing_.clear();
    reduced_upto_ = 0;
  }
  // Chunk c's gradients to the sink (r names them; its `done` and `last` are filled here).
  void hand(ready_chunk<B, T>& r) {
    std::uint32_t const c = r.chunk;
    r.done = &reduced_[c];
    r.last = ++handed_ == chunks_per_step_;
    pending_[c] = sink_.reduce(r);
    if (pending_[c]) reducing_.push_back(c);
  }
  // The sink's work on chunk c is still to be waited for; the event it records when done.
  [[nodiscard]] bool pending(std::uint32_t c) const noexcept { return pending_[c]; }
  [[nodiscard]] memory::event<B> const& reduced(std::uint32_t c) const noexcept { return reduced_[c]; }
  // Pending and not done yet (asks the event; never waits).
  [[nodiscard]] bool busy(std::uint32_t c) { return pending_[c] && !reduced_[c].query(); }
  // Waits for the sink's work on chunk c (throws its failure, once); the wait counts as stall.
  void wait(std::uint32_t c) {
    if (!pending_[c]) return;
    pending_[c] = false;  // a failure is reported once, here, and fails the step
    auto const t0 = std::chrono::steady_clock::now();
    reduced_[c].synchronize();
    stats_->stall_ms += ms_since(t0);
  }
  // Whether the sink still works on a chunk handed over in this step (in hand-over order; the
  // first not yet finished is remembered, so a step's queries are O(chunks) in all).
  [[nodiscard]] bool outstanding() {
    while (reduced_upto_ < reducing_.size() && reduced_[reducing_[reduced_upto_]].query()) ++reduced_upto_;
    return reduced_upto_ < reducing_.size();
  }
  // Waits for the sink's work on every chunk, without reporting anything: when a step is
  // abandoned its sink failures are the step's failure, already reported (a failed sink skips the
  // rest of its queue, so this ends).
  void quiet() noexcept {
    for (std::uint32_t c = 0; c < pending_.size(); ++c)
      if (pending_[c]) {
        while (!reduced_[c].query()) std::this_thread::yield();
        pending_[c] = false;
      }
  }
  // The step is abandoned, its work ended (quiet()): a sink that can start afresh does.
  void abandon() noexcept {
    if constexpr (StepAbandoningSink<S>) sink_.abandon_step();
    unowned_.clear();
  }

  // ---- ZeRO: chunks another rank steps --------------------------------------------------------
  // Chunk c's gradients are freed once the sink finished with them (free_unowned).
  void defer_unowned(std::uint32_t c) { unowned_.push_back(c); }
  // The deferred chunks the sink finished with (wait: all of them), each through release(c).
  template <class Release>
  void free_unowned(bool wait_all, Release&& release) {
    std::erase_if(unowned_, [&](std::uint32_t c) {
      if (!wait_all && !reduced_[c].query()) return false;
      wait(c);
      release(c);
      return true;
    });
  }
  // After the step's updates: every parameter chunk, from the rank that stepped it.
  void share_parameters(std::span<std::span<T> const> chunks) {
    if constexpr (ShardingSink<S>) sink_.share_parameters(chunks);
  }
  // The list share_parameters() takes, reused from step to step.
  [[nodiscard]] std::vector<std::span<T>>& shared() noexcept { return shared_; }

 private:
  S sink_;
  std::size_t chunks_per_step_ = 0;
  offload_stats* stats_;
  std::vector<memory::event<B>> reduced_;  // by chunk: the sink finished with its gradients
  std::vector<bool> pending_;              // by chunk: its work is still to be waited for
  std::size_t handed_ = 0;                 // chunks handed over in this step
  std::vector<std::uint32_t> reducing_;    // this step's chunks the sink took with work in flight, in order
  std::size_t reduced_upto_ = 0;           // reducing_[< this] are known finished
  std::vector<std::uint32_t> unowned_;     // ZeRO: gradients of chunks another rank steps, freed once reduced
  std::vector<std::span<T>> shared_;       // ZeRO: every parameter chunk, for share_parameters
};

}  // namespace tide::offload::detail
