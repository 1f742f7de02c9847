#pragma once
// memory_tracer: what one training step looks like from the device's side, recorded once.
//
// A moment is each pre-forward and pre-backward of a block that owns parameters (PatrickStar),
// and each pre-backward-input of a split backward's input pass.
// The warm-up step records, per moment, the chunks it touches (and which of them it writes:
// gradients in backward, parameters a device optimizer step changes) and the non-model device bytes
// (activations, workspaces: whatever the arena holds besides model data) at their peak over the
// moment; later steps replay that record as a cyclic trace. A step whose moment sequence differs
// (another block order, another set of chunks) invalidates the trace and records again.
//
//   tide::chunk::memory_tracer tracer{{.device_budget = 64_MiB, .reserved = 0}};
//   tracer.begin_step();
//   std::size_t t = tracer.at({.block = 0, .phase = tide::chunk::phase::forward}, chunks_of_block_0);
//   tracer.non_model(t, arena_in_use - model_bytes);      // as often as it is sampled
//   ...
//   tracer.end_step();                                    // the first complete step becomes the trace
//   tracer.chunk_budget(t);   // budget - max(non_model[t], non_model[t+1]) - reserved
//
// The per-moment chunk budget looks one moment ahead because chunks fetched for the next moment
// land while this moment's non-model data is still live.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "tide/chunk/access_trace.hpp"
#include "tide/core/error.hpp"

namespace tide::chunk {

// input: the first of a split backward's two passes (a zero-bubble pipeline's B), which reads a
// block's parameters and writes no gradient; the second pass (W) is the block's backward moment.
enum class phase : std::uint8_t { forward, backward, optimizer, input };

[[nodiscard]] constexpr char const* to_string(phase p) noexcept {
  switch (p) {
    case phase::forward: return "forward";
    case phase::backward: return "backward";
    case phase::optimizer: return "optimizer";
    case phase::input: return "backward input pass";
  }
  return "?";
}

struct moment {
  int block = 0;
  tide::chunk::phase phase = phase::forward;
  friend constexpr bool operator==(moment, moment) noexcept = default;
};

struct tracer_options {
  std::size_t device_budget = 0;  // bytes of the device (the arena's budget)
  std::size_t reserved = 0;       // bytes kept out of the chunk budget (buffers, fragmentation slack)
};

class memory_tracer {
 public:
  explicit memory_tracer(tracer_options const& opts = {}) : opts_(opts) {}

  // Starts a step: replay when a trace exists, else record.
  void begin_step() {
    position_ = 0;
    diverged_ = false;
    if (!warm()) reset_record();
  }

  // The moment `m` touching `chunks` (and writing `written`, a subset) happens now; returns its
  // index in the step. While replaying,
  // a moment that differs from the trace's (or one past its end) invalidates the trace: the step
  // goes on recording from scratch (the moments so far are re-entered) and the next end_step()
  // installs the new record.
  std::size_t at(moment m, std::span<std::uint32_t const> chunks, std::span<std::uint32_t const> on_host = {},
                 std::span<std::uint32_t const> released = {}, std::span<std::uint32_t const> written = {}) {
    std::size_t const t = position_++;
    if (warm() && !diverged_) {
      bool const same = t < moments_.size() && moments_[t] == m && std::ranges::equal(trace_.touched(t), chunks) &&
                        std::ranges::equal(trace_.on_host(t), on_host) &&
                        std::ranges::equal(trace_.released(t), released) &&
                        std::ranges::equal(trace_.written(t), written);
      if (same) return t;
      // Re-record the step: keep the matching prefix (it happened), drop the rest.
      diverged_ = true;
      ++invalidations_;
      access_trace prefix(trace_.chunks());
      std::vector<moment> kept(moments_.begin(), moments_.begin() + static_cast<std::ptrdiff_t>(t));
      std::vector<std::size_t> nm(non_model_.begin(), non_model_.begin() + static_cast<std::ptrdiff_t>(t));
      for (std::size_t i = 0; i < t; ++i)
        prefix.add_moment(trace_.touched(i), trace_.on_host(i), trace_.released(i), trace_.written(i));
      record_ = std::move(prefix);
      record_moments_ = std::move(kept);
      record_non_model_ = std::move(nm);
      trace_ = {};
      moments_.clear();
      non_model_.clear();
    }
    record_.add_moment(chunks, on_host, released, written);
    record_moments_.push_back(m);
    record_non_model_.push_back(0);
    return t;
  }

  // Non-model bytes seen during moment t (keeps the largest).
  void non_model(std::size_t t, std::size_t bytes) {
    if (!recording()) return;  // a trace's figures are those of its warm-up step
    TIDE_ASSERT(t < record_non_model_.size());
    record_non_model_[t] = std::max(record_non_model_[t], bytes);
  }

  // Ends the step. A recorded step becomes the trace. A replayed step that stopped short of the
  // trace's end also invalidates it (the next step records).
  void end_step() {
    if (recording()) {
      trace_ = std::move(record_);
      moments_ = std::move(record_moments_);
      non_model_ = std::move(record_non_model_);
      reset_record();
      diverged_ = false;
      ++recorded_;
    } else if (position_ != moments_.size()) {
      ++invalidations_;
      trace_ = {};
      moments_.clear();
      non_model_.clear();
    }
  }

  // Abandons the step in progress (it failed): a step being recorded is dropped (the next one
  // records again), a replayed one leaves the trace as it was.
  void abort_step() {
    if (recording()) reset_record();
    diverged_ = false;
    position_ = 0;
  }

  // A planned change of the trace (optimizer state moved to the device changes what the
  // optimizer moments touch): f(t, moment, touched, on_host, released, written) may rewrite the
  // four lists of moment t in place (an f of five arguments leaves `written` to the tracer, which
  // keeps the written ids still touched). The non-model figures stay. Not while a step is re-recording.
  template <class F>
  void amend(F&& f) {
    TIDE_REQUIRE(warm() && !diverged_, "memory_tracer::amend needs a recorded trace and no step re-recording it");
    access_trace next(trace_.chunks());
    std::vector<std::uint32_t> touched, on_host, released, written;
    using ids = std::vector<std::uint32_t>&;
    for (std::size_t t = 0; t < moments_.size(); ++t) {
      touched.assign(trace_.touched(t).begin(), trace_.touched(t).end());
      on_host.assign(trace_.on_host(t).begin(), trace_.on_host(t).end());
      released.assign(trace_.released(t).begin(), trace_.released(t).end());
      written.assign(trace_.written(t).begin(), trace_.written(t).end());
      if constexpr (std::invocable<F&, std::size_t, moment, ids, ids, ids, ids>) {
        f(t, moments_[t], touched, on_host, released, written);
      } else {
        f(t, moments_[t], touched, on_host, released);
        std::erase_if(written, [&](std::uint32_t c) { return std::ranges::find(touched, c) == touched.end(); });
      }
      next.add_moment(touched, on_host, released, written);
    }
    trace_ = std::move(next);
  }

  // How many chunks ids the trace may name (set once, before the first step).
  void set_chunks(std::size_t n) { chunk_count_ = n; }

  // ---- the trace ----------------------------------------------------------------------------
  [[nodiscard]] bool warm() const noexcept { return !moments_.empty(); }
  [[nodiscard]] bool recording() const noexcept { return !warm() || diverged_; }
  [[nodiscard]] std::size_t moments() const noexcept { return moments_.size(); }
  [[nodiscard]] moment moment_at(std::size_t t) const { return moments_.at(t); }
  [[nodiscard]] access_trace const& trace() const noexcept { return trace_; }
  [[nodiscard]] std::size_t non_model_at(std::size_t t) const { return non_model_.at(t); }
  [[nodiscard]] std::size_t peak_non_model() const noexcept {
    return non_model_.empty() ? 0 : *std::ranges::max_element(non_model_);
  }
  // Bytes chunks may take on the device during moment t: budget - max(non-model of t and of the
  // next moment, cyclically) - reserved; 0 if that is negative.
  [[nodiscard]] std::size_t chunk_budget(std::size_t t) const {
    TIDE_REQUIRE(warm(), "memory_tracer::chunk_budget before a warm-up step was recorded");
    std::size_t const nm = std::max(non_model_.at(t), non_model_[(t + 1) % non_model_.size()]);
    std::size_t const taken = nm + opts_.reserved;
    return opts_.device_budget > taken ? opts_.device_budget - taken : 0;
  }
  [[nodiscard]] std::size_t position() const noexcept { return position_; }
  [[nodiscard]] std::size_t invalidations() const noexcept { return invalidations_; }
  [[nodiscard]] std::size_t steps_recorded() const noexcept { return recorded_; }
  [[nodiscard]] tracer_options const& options() const noexcept { return opts_; }

 private:
  void reset_record() {
    record_ = access_trace(chunk_count_);
    record_moments_.clear();
    record_non_model_.clear();
  }

  tracer_options opts_;
  std::size_t chunk_count_ = 0;
  access_trace trace_, record_;
  std::vector<moment> moments_, record_moments_;
  std::vector<std::size_t> non_model_, record_non_model_;
  std::size_t position_ = 0;
  bool diverged_ = false;
  std::size_t invalidations_ = 0;
  std::size_t recorded_ = 0;
};

}  // namespace tide::chunk
