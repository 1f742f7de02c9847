#pragma once
// The optimizer lane of the offload engine: the updates of chunks whose state lives on the host,
// run on a worker beside backward, and the gradient ring their gradients are copied into.
//
// - The update of a chunk is one Optimizer call over it, or with decay_matrices_only one over its
//   matrices and one without decay over the rest; with undo_on_error the state before it goes to
//   the step journal, written by the optimizer's own pass where it keeps prev values.
// - A host step is queued as a job on the lane's stream, after the events the engine makes the
//   stream wait for (the copies out, the sink); busy(c) is recorded after it. A job of a chunk on
//   file reads and writes its lists through the file tier.
// - The gradient ring: host_steps_in_flight host blocks, pinned at the first host step and reused,
//   for the gradients copied out for a queued step; with none free, take_ring_block waits for the
//   oldest step. Gradients from the pool (evicted before they were complete) are freed at drain.
//
// The engine owns one; it decides which chunk steps where and when, the lane runs the steps.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "tide/chunk/chunk.hpp"
#include "tide/chunk/layout.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/parameters.hpp"
#include "tide/memory/pinned_pool.hpp"
#include "tide/memory/stream.hpp"
#include "tide/offload/detail/clock.hpp"
#include "tide/offload/detail/file_tier.hpp"
#include "tide/offload/detail/undo.hpp"
#include "tide/offload/stats.hpp"
#include "tide/offload/trace_events.hpp"
#include "tide/optim/optimizer.hpp"

namespace tide::offload::detail {

template <Backend B, Element T, class O>
class update_runner {
 public:
  static constexpr std::size_t state_lists = O::state_lists;
  using journal_type = undo_journal<B, T, state_lists>;
  using tensor_type = optim::update_tensor<T, state_lists>;
  using targets_type = update_targets<T, state_lists>;
  using record_type = undo_record<state_lists>;

  // One host step of chunk c on the lane.
  struct job {
    update_runner* runner = nullptr;
    std::uint32_t c = 0;
    tensor_type whole{};
    targets_type targets{};
    optim::update_args args{};
    trace_recorder* recorder = nullptr;
    record_type* undo = nullptr;  // where the state before the update goes (undo_on_error)
    // NVMe tier: where its lists are read from and written to (io.state: none, when not on file).
    // io.failure is read by the engine after the lane drained.
    typename file_tier<B>::job io{};
    void operator()() {
      auto const t0 = std::chrono::steady_clock::now();
      exec<host> const ex{runner->pool_};
      double const start = recorder != nullptr ? trace_recorder::now_us() : 0;
      file_tier<B>* const files = io.state != nullptr ? runner->files_ : nullptr;
      if (files != nullptr && !files->finish_reads(io)) return;  // no state, no update: nothing changed
      runner->journalled_update(ex, c, whole, targets, undo, args);
      if (files != nullptr) files->write_back(io);  // a failure: the current slots hold the values before
      runner->ns_.fetch_add(static_cast<std::int64_t>(ms_since(t0) * 1e6), std::memory_order_relaxed);
      if (recorder != nullptr)
        recorder->complete(tide::detail::concat(O::name, " chunk ", c, " (host)"), "optimizer", lane::optimizer, start,
                           trace_recorder::now_us(), static_cast<std::size_t>(whole.n) * runner->bytes_per_element_);
    }
  };

  // `fp32_lists`: the fp32 lists an update reads and writes besides the parameters and gradients
  // (for the traced bytes); `ring_blocks`: host_steps_in_flight, at most the chunks.
  update_runner(O const& optimizer, bool decay_matrices_only, chunk::chunk_layout const& layout,
                std::span<parameter const> params, journal_type& journal, memory::pinned_pool<B>& host,
                chunk::chunk_list& grads, offload_stats& stats, std::size_t fp32_lists, std::size_t ring_blocks)
      : optimizer_(optimizer),
        decay_matrices_only_(decay_matrices_only),
        layout_(&layout),
        params_(params),
        journal_(&journal),
        host_(&host),
        grads_(&grads),
        stats_(&stats),
        bytes_per_element_(8 + 4 * fp32_lists),
        ring_blocks_(ring_blocks) {
    std::size_t const n = layout.chunks();
    busy_.resize(n);
    pending_.assign(n, false);
    jobs_.resize(n);
    decayed_.resize(n);
    plain_.resize(n);
    for (std::uint32_t c = 0; c < n; ++c) {  // a step appends to these, and allocates nothing
      std::size_t matrices = 0;
      for (std::uint32_t i = layout.first_param[c]; i < layout.first_param[c + 1]; ++i)
        matrices += params[i].shape.rank >= 2 ? 1 : 0;
      decayed_[c].reserve(matrices);
      plain_[c].reserve(layout.first_param[c + 1] - layout.first_param[c] - matrices);
    }
    deferred_frees_.reserve(n);
    ring_.reserve(ring_blocks_);  // the blocks themselves are pinned at the first host step
    ring_free_.reserve(ring_blocks_);
    ring_used_.reserve(ring_blocks_);
  }
  update_runner(update_runner const&) = delete;
  update_runner& operator=(update_runner const&) = delete;
  // The ring's blocks go back to the pool; the caller made the lane idle, and freed the chunks
  // first (a chunk freeing a ring block gives it back to the ring).
  ~update_runner() { free_ring(); }

  void set_files(file_tier<B>* files) noexcept { files_ = files; }
  // Whether the update can write a journal's swap blocks: an out-of-place optimizer, one call
  // over the whole chunk (decay_matrices_only's two calls skip the padding between tensors).
  [[nodiscard]] bool swaps() const noexcept { return optim::out_of_place_v<O> && !decay_matrices_only_; }
  [[nodiscard]] O const& optimizer() const noexcept { return optimizer_; }

  // ---- one update -----------------------------------------------------------------------------
  // The update of chunk c: one call over the chunk, or (decay_matrices_only) one over its
  // matrices and one without decay over the rest, listed in c's own reserved vectors (no two
  // steps of one chunk run at once).
  template <Backend E>
  void run_update(exec<E> const& ex, std::uint32_t c, tensor_type const& whole, optim::update_args a) {
    if (!decay_matrices_only_) {
      optimizer_.update(ex, a, std::span<tensor_type const>(&whole, 1));
      return;
    }
    auto& decayed = decayed_[c];
    auto& plain = plain_[c];
    decayed.clear();
    plain.clear();
    for (std::uint32_t i = layout_->first_param[c]; i < layout_->first_param[c + 1]; ++i) {
      std::size_t const at = layout_->offset_of[i];
      tensor_type r{whole.master + at, whole.grad + at, {}, whole.working ? whole.working + at : nullptr,
                                params_[i].numel()};
      for (std::size_t k = 0; k < state_lists; ++k) r.state[k] = whole.state[k] + at;
      (params_[i].shape.rank >= 2 ? decayed : plain).push_back(r);
    }
    if (!decayed.empty()) optimizer_.update(ex, a, std::span<tensor_type const>(decayed));
    a.decay = false;
    if (!plain.empty()) optimizer_.update(ex, a, std::span<tensor_type const>(plain));
  }
  // The update of chunk c with its undo copies (undo: null when none are kept). An optimizer that
  // keeps prev values writes them in its own pass (one read of the old values) when the update is
  // one call over the whole run; for any other, a journal list the update does not touch, or
  // decay_matrices_only (two calls over the tensors, not the padding between them: a second call
  // that threw would leave the first one's chunk without a restorable copy), they are copied
  // first. Marked saved only once the update returned: an update throws before it writes.
  // A swap record (the engine asks for one only where it can be: every block on the host, an
  // out-of-place optimizer, one call over the chunk) points the update at the journal's blocks,
  // and is marked ran for the engine to swap them in.
  template <Backend E>
  void journalled_update(exec<E> const& ex, std::uint32_t c, tensor_type u,
                         targets_type const& targets, record_type* undo, optim::update_args const& a) {
    if (undo != nullptr && undo->swap) {
      TIDE_CHECK(swaps() && journal_->redirect(*undo, targets, u), internal, "offload: the undo journal swaps the "
                 "blocks of chunk ", c, ", whose update cannot write to them");
      run_update(ex, c, u, a);
      journal_type::mark_ran(*undo);
      return;
    }
    bool const fold = optim::keeps_prev_v<O> && !decay_matrices_only_;
    if (undo != nullptr && !(fold && journal_->attach(*undo, targets, u))) {
      journal_->save(*undo, targets, ex);
      undo = nullptr;  // saved already
    }
    run_update(ex, c, u, a);
    if (undo != nullptr) journal_type::mark_saved(*undo);
  }

  // ---- the lane -------------------------------------------------------------------------------
  // Chunk c's job, to fill before queue(c) or run(c).
  [[nodiscard]] job& job_of(std::uint32_t c) noexcept { return jobs_[c]; }
  // The lane's stream: the engine makes it wait for the events a queued step needs.
  [[nodiscard]] memory::stream<B>& stream() noexcept { return stream_; }
  // Chunk c's job on the lane, after what the stream waits for; busy(c) once it ran.
  void queue(std::uint32_t c) {
    memory::launch(stream_, jobs_[c]);
    busy_[c].record(stream_);
    pending_[c] = true;
  }
  // Chunk c's job on the calling thread (no overlap).
  void run(std::uint32_t c) { jobs_[c](); }
  // Whether chunk c's queued step has not been waited for, and whether it is still running.
  [[nodiscard]] bool pending(std::uint32_t c) const noexcept { return pending_[c]; }
  [[nodiscard]] bool stepping(std::uint32_t c) { return pending_[c] && !busy_[c].query(); }
  // Waits for chunk c's queued step (it writes the chunk's host payload); the wait counts as stall.
  void wait(std::uint32_t c) {
    if (!pending_[c]) return;
    auto const t0 = std::chrono::steady_clock::now();
    busy_[c].synchronize();
    stats_->stall_ms += ms_since(t0);
    pending_[c] = false;
  }
  // The lane ran out of work (throws the first failure of a job).
  void synchronize() { stream_.synchronize(); }
  [[nodiscard]] bool idle() { return stream_.query(); }
  // After synchronize(): nothing is pending, and the blocks the steps read are free again.
  void drained() noexcept {
    std::fill(pending_.begin(), pending_.end(), false);
    free_deferred();
    release_ring_blocks(true);
  }
  // Milliseconds the lane's jobs took since the last call.
  [[nodiscard]] double take_ms() noexcept { return static_cast<double>(ns_.exchange(0)) * 1e-6; }
  // A failed step, once the lane is idle: the file failures of its jobs are forgotten (they failed
  // the step already).
  void abort() noexcept {
    for (job& j : jobs_) j.io.failure = nullptr;
  }

  // ---- gradient blocks ------------------------------------------------------------------------
  // A queued step's gradient block from the pool, freed once the lane drained.
  void free_after_drain(std::uint32_t c, std::byte* block) { deferred_frees_.push_back({c, block}); }
  void free_deferred() noexcept {
    for (auto const& [c, p] : deferred_frees_) host_->deallocate(p, (*grads_)[c].capacity(), 256);
    deferred_frees_.clear();
  }
  // Gradient blocks held for queued steps (offload_stats::peak_model_bytes).
  [[nodiscard]] std::size_t held_blocks() const noexcept { return deferred_frees_.size() + ring_used_.size(); }

  // A block of the gradient ring for chunk c's gradients, now in use by c (nullptr: none, the
  // gradients take a block from the pool). Blocks whose step finished (or was skipped by a
  // failure: the step fails, and nothing reads them again) go back first; with none free it waits
  // for the oldest step. It never waits while the sink works on a chunk (`reducing()`): a queued
  // step, or a copy ahead of it, may wait for that work, and a sink may finish it only once
  // backward handed it more chunks; the sink paces the steps then. A failure of the lane is
  // thrown here, before the caller moved anything.
  template <class Reducing>
  std::byte* take_ring_block(std::uint32_t c, Reducing&& reducing) {
    if (ring_blocks_ == 0) return nullptr;
    if (ring_.empty()) {
      try {
        for (std::size_t k = 0; k < ring_blocks_; ++k)
          ring_.push_back(static_cast<std::byte*>(host_->allocate((*grads_)[0].capacity(), 256)));
      } catch (...) {
        free_ring();
        throw;
      }
      ring_free_ = ring_;
    }
    release_ring_blocks(false);
    while (ring_free_.empty() && !ring_used_.empty() && !reducing()) {
      auto const t0 = std::chrono::steady_clock::now();
      busy_[ring_used_.front().first].synchronize();  // in order: the oldest finishes first
      stats_->stall_ms += ms_since(t0);
      std::size_t const before = ring_used_.size();
      release_ring_blocks(false);
      if (ring_used_.size() == before) break;  // the oldest is held by its chunk: the pool serves
    }
    if (ring_free_.empty()) return nullptr;
    std::byte* const p = ring_free_.back();
    ring_free_.pop_back();
    ring_used_.push_back({c, p});
    return p;
  }
  // Frees of host blocks come here first: a ring block goes back to the ring, not to the pool.
  bool reclaim_ring_block(std::byte* p) noexcept {
    if (std::find(ring_.begin(), ring_.end(), p) == ring_.end()) return false;
    std::erase_if(ring_used_, [&](std::pair<std::uint32_t, std::byte*> const& u) { return u.second == p; });
    if (std::find(ring_free_.begin(), ring_free_.end(), p) == ring_free_.end())
      ring_free_.push_back(p);  // within the capacity reserved: ring_blocks_ in all
    return true;
  }
  // Every ring block back to the pool (the lane is idle).
  void free_ring() noexcept {
    for (std::byte* p : ring_) host_->deallocate(p, (*grads_)[0].capacity(), 256);
    ring_.clear();
    ring_free_.clear();
    ring_used_.clear();
  }

 private:
  // Ring blocks back to the ring once read: each left its gradient chunk (the step was queued) and
  // its step ran (all_ran: the lane is idle, nothing to ask). One a failure left in its chunk
  // comes back when the chunk frees it (reclaim_ring_block).
  void release_ring_blocks(bool all_ran) {
    std::erase_if(ring_used_, [&](std::pair<std::uint32_t, std::byte*> const& u) {
      if ((*grads_)[u.first].payload() == u.second || (!all_ran && !busy_[u.first].query())) return false;
      ring_free_.push_back(u.second);
      return true;
    });
  }

  O optimizer_;
  bool decay_matrices_only_;
  chunk::chunk_layout const* layout_;
  std::span<parameter const> params_;
  journal_type* journal_;
  memory::pinned_pool<B>* host_;
  chunk::chunk_list* grads_;
  offload_stats* stats_;
  file_tier<B>* files_ = nullptr;
  std::size_t bytes_per_element_;  // read and written by an update (traced)
  std::size_t ring_blocks_;
  memory::stream<B> stream_;
  thread_pool pool_{1};
  std::atomic<std::int64_t> ns_{0};
  std::vector<memory::event<B>> busy_;  // by chunk: its queued step ran
  std::vector<bool> pending_;           // by chunk: queued and not yet waited for
  std::vector<job> jobs_;
  std::vector<std::vector<tensor_type>> decayed_, plain_;  // by chunk (decay_matrices_only)
  std::vector<std::pair<std::uint32_t, std::byte*>> deferred_frees_;   // pool blocks of queued steps
  std::vector<std::byte*> ring_, ring_free_;                        // the ring: all, free
  std::vector<std::pair<std::uint32_t, std::byte*>> ring_used_;    // in use by (chunk, block), in queue order
};

}  // namespace tide::offload::detail
