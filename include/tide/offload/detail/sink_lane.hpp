#pragma once
// The gradient sink's side of the offload engine: the sink S itself, the chunks handed to it in
// this step, and by chunk the event its work records (`reduced`) and whether that work is still
// to be waited for. The engine decides when a chunk is handed over and who waits for it (a copy
// stream, the optimizer lane, the host); the lane keeps what it promised.
//
// A failure of the sink's work is reported once, by the wait that meets it, and fails the step;
// abandoning the step waits for the rest without reporting (quiet()).
//
// On a device backend the sinks tide has (data parallelism over MPI, the compressing sinks) read
// and write gradients on the host, as a host communicator must without device-aware MPI. The
// lane stages for them: a chunk on the device is copied to a host block of its own on `down`,
// after the event the engine gave; a host job waits for that copy and marks the block valid; the
// sink gets the host block (ready_chunk<host, T>); `up` waits for the sink's `done`, copies the
// block back and records the chunk's `reduced` event, which is all the engine waits for. Two
// device streams, so that a bucket waiting for a later chunk never blocks that chunk's copy in.
// A sink that reads device memory itself (NCCL) says `static constexpr bool reads_device = true`
// and gets the device chunk. A sink may also wait for its own work, under its own deadline
// (`void wait_reduced(std::uint32_t chunk, memory::event<B> const& done)`, throwing on a
// failure): the lane's waits for that sink go through it rather than the event alone.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

#include "tide/chunk/chunk.hpp"
#include "tide/memory/stream.hpp"
#include "tide/offload/detail/clock.hpp"
#include "tide/offload/gradient_sink.hpp"
#include "tide/offload/stats.hpp"

namespace tide::offload::detail {

// Whether the lane hands sink S host copies of device chunks (see above).
template <class B, class S>
inline constexpr bool stages_for_sink = B::is_device && !std::is_same_v<S, no_sink> && !requires {
  requires S::reads_device;
};

// A device chunk's host copies for a sink that reads the host: its gradients, the events of one
// hand-over (landed: the copy in; valid: the host may read; done: the sink's record).
template <Backend B>
struct staged_chunk {
  std::vector<std::byte> grads;
  memory::event<B> landed;
  memory::event<host> valid;
  memory::event<host> done;
};

template <Backend B>
struct sink_staging {
  explicit sink_staging(std::uint32_t n) : chunks(n) {}
  std::vector<staged_chunk<B>> chunks;           // by chunk; blocks sized at first use
  std::vector<std::vector<std::byte>> params;    // ZeRO-1/2: parameter chunks shared on the host
  memory::stream<B> down, up;                    // device -> host copies; waits for the sink, host -> device
  memory::stream<host> bridge;                   // host jobs that wait for `landed`
};
struct no_staging {
  explicit no_staging(std::uint32_t) {}
};

template <Backend B, Element T, class S>
class sink_lane {
 public:
  static constexpr bool staged = stages_for_sink<B, S>;
  // The sink waits for its own work (under its deadline): not when the lane stages for it, whose
  // `reduced` also covers the copy back.
  static constexpr bool self_waiting =
      !staged && requires(S& s, std::uint32_t c, memory::event<B> const& e) { s.wait_reduced(c, e); };

  sink_lane(S const& sink, std::uint32_t n, offload_stats& stats) : sink_(sink), stats_(&stats), stage_(n) {
    reduced_.resize(n);
    pending_.assign(n, false);
    reducing_.reserve(n);  // a step appends to these, and allocates nothing
    unowned_.reserve(n);
    shared_.reserve(n);
    tiers_.reserve(n);
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
    r.last = ++handed_ == chunks_per_step_;
    if constexpr (staged) {
      hand_staged(r);
    } else {
      r.done = &reduced_[c];
      pending_[c] = sink_.reduce(r);
    }
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
    if constexpr (self_waiting) sink_.wait_reduced(c, reduced_[c]);
    else reduced_[c].synchronize();
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
        if constexpr (self_waiting) {
          try {  // under the sink's deadline; its failure is the step's, already reported
            sink_.wait_reduced(c, reduced_[c]);
          } catch (...) {
          }
        } else {
          while (!reduced_[c].query()) std::this_thread::yield();
        }
        pending_[c] = false;
      }
  }
  // The step is abandoned, its work ended (quiet()): a sink that can start afresh does.
  void abandon() noexcept {
    if constexpr (StepAbandoningSink<S>) sink_.abandon_step();
    unowned_.clear();
    if constexpr (staged) {  // a failure of the sink is sticky on the streams that waited for it
      try {
        stage_.down = memory::stream<B>{memory::options_like(stage_.down)};  // on the trainer's device
        stage_.up = memory::stream<B>{memory::options_like(stage_.up)};
        stage_.bridge = memory::stream<host>{};
      } catch (...) {  // no thread to make: the old streams stay, and the next step fails as this one did
      }
    }
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
  // After the step's updates: every parameter chunk, from the rank that stepped it. A sink that
  // takes where each chunk lies (one over device memory) gets shared_tiers() too.
  void share_parameters(std::span<std::span<T> const> chunks) {
    std::span<chunk::tier const> const tiers(tiers_);
    if constexpr (ShardingSink<S> && requires { sink_.share_parameters(chunks, tiers); })
      sink_.share_parameters(chunks, tiers);
    else if constexpr (ShardingSink<S>) sink_.share_parameters(chunks);
  }
  // The host block chunk c's parameters are shared through (bytes long), when they are on the device.
  [[nodiscard]] std::byte* share_staging(std::uint32_t c, std::size_t bytes)
    requires staged
  {
    if (stage_.params.size() <= c) stage_.params.resize(reduced_.size());
    stage_.params[c].resize(bytes);
    return stage_.params[c].data();
  }
  // The lists share_parameters() takes (the chunks, where each lies), reused from step to step.
  [[nodiscard]] std::vector<std::span<T>>& shared() noexcept { return shared_; }
  [[nodiscard]] std::vector<chunk::tier>& shared_tiers() noexcept { return tiers_; }

 private:
  // The hand-over through host staging (see the top of this file).
  void hand_staged(ready_chunk<B, T> const& r) {
    std::uint32_t const c = r.chunk;
    staged_chunk<B>& s = stage_.chunks[c];
    bool const on_device = r.tier == chunk::tier::device;
    std::size_t const bytes = r.grads.size_bytes();
    T* grads = r.grads.data();
    if (on_device) {
      s.grads.resize(bytes);
      grads = reinterpret_cast<T*>(s.grads.data());
    }
    if (r.valid_after != nullptr) stage_.down.wait(*r.valid_after);
    if (on_device) stage_.down.copy(grads, r.grads.data(), bytes);
    s.landed.record(stage_.down);
    stage_.bridge.launch_owned([&landed = s.landed] { landed.synchronize(); });
    s.valid.record(stage_.bridge);
    ready_chunk<host, T> h{c, {grads, r.grads.size()}, chunk::tier::host, &s.valid, &s.done, r.step, r.ends_block,
                           r.last, r.lists, r.trace};
    bool const later = sink_.reduce(h);
    // The copy back runs after the copy in (a sink that finished at once may not have read it)
    // and after the sink's work; a failure of either fails `reduced`.
    stage_.up.wait(s.landed);
    if (later) stage_.up.launch_owned([&done = s.done] { done.synchronize(); });
    if (on_device) stage_.up.copy(r.grads.data(), grads, bytes);
    reduced_[c].record(stage_.up);
    pending_[c] = true;
  }

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
  std::vector<chunk::tier> tiers_;         // and where each lies
  [[no_unique_address]] std::conditional_t<staged, sink_staging<B>, no_staging> stage_;  // a host sink on a device backend
};

}  // namespace tide::offload::detail
