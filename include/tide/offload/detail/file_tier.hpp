#pragma once
// The file tier of the offload engine (the NVMe tier: scheduler_options::host_budget,
// spill_folder): every byte of model data that lives in a file, and every host block that
// stages it. The engine owns one only when plan_files (detail/file_plan.hpp) sent something to
// file; a scheduler without it holds a null pointer and no file-tier state.
//
// Two state_spill files (detail/spill.hpp): the state of the chunks past the budget (moments, then
// bf16 / f16 masters: "lists"), and past that, parameter chunks. Staging, in host blocks from the
// pinned pool (host memory on every backend, as pinned memory is on CUDA):
// - two ring blocks for host steps of chunks on file, used in turn: the step's reads start when
//   it is staged (or earlier, by prefetch), so they overlap the updates queued before it;
// - two blocks for parameter reads the prefetch started, for the fetches that follow;
// - one block each for a checkpoint's views of a chunk's state and of its parameters;
// - one block through which fetches read parameters and flushes write them.
// A checkpoint's load attaches a chunk's lists to host blocks (materialize); they go back to
// file, to the other slot, before another chunk's come in or a step begins (flush).

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "tide/chunk/chunk.hpp"
#include "tide/core/backend.hpp"
#include "tide/memory/file_store.hpp"
#include "tide/memory/pinned_pool.hpp"
#include "tide/offload/detail/clock.hpp"
#include "tide/offload/detail/file_plan.hpp"
#include "tide/offload/detail/spill.hpp"
#include "tide/offload/stats.hpp"

namespace tide::offload::detail {

template <Backend B>
class file_tier {
 public:
  static constexpr std::uint32_t no_chunk = std::numeric_limits<std::uint32_t>::max();
  static constexpr std::size_t max_lists = state_spill::max_lists;

  // One host block from the pool for the scope, aligned for O_DIRECT.
  struct staging {
    memory::pinned_pool<B>* pool;
    std::size_t bytes;
    std::byte* data;
    staging(memory::pinned_pool<B>& p, std::size_t n)
        : pool(&p), bytes(n), data(static_cast<std::byte*>(p.allocate(n, memory::file_store::alignment))) {}
    ~staging() { pool->deallocate(data, bytes, memory::file_store::alignment); }
    staging(staging const&) = delete;
    staging& operator=(staging const&) = delete;
  };

  // A host step of a chunk on file: its lists are read from the current slots into `state`
  // (started when staged: `reading`), updated there, and written to the other slots; its
  // parameters too when they are on file. `failure`: a read or write that failed, which fails
  // the step when it ends (the current slots still hold the values before).
  struct job {
    std::byte* state = nullptr;
    state_spill::pending* reading = nullptr;
    std::array<std::size_t, max_lists> to{};
    std::byte* params = nullptr;
    state_spill::pending* param_reading = nullptr;
    std::size_t param_to = 0;
    std::exception_ptr failure;
  };

  // `lists`: the chunk lists whose chunks in plan.state_chunks go to file (the optimizer's state
  // lists, then the fp32 masters), each chunk `list_bytes` in the file; `params`: the parameter
  // chunks, of which plan.param_chunks go to file. Writes every slot 0: zeros, as the moments
  // start (and the parameters, until the model writes them; the masters come from init_master).
  file_tier(memory::pinned_pool<B>& host, offload_stats& stats, std::span<chunk::chunk_list* const> lists,
            chunk::chunk_list& params, file_plan const& plan, std::filesystem::path const& folder, std::uint32_t n,
            std::size_t list_bytes)
      : host_(&host), stats_(&stats), params_list_(&params) {
    TIDE_ASSERT(!plan.empty() && lists.size() <= max_lists);
    std::copy(lists.begin(), lists.end(), lists_.begin());
    state_.open(folder, plan.state_chunks, n, lists.size(), list_bytes);
    for (auto& r : ring_) r.emplace(*host_, state_.staging_bytes());
    if (!plan.param_chunks.empty()) {
      params_.open(folder, plan.param_chunks, n, 1, params[0].capacity());
      for (auto& r : param_ring_) r.emplace(*host_, params_.block_bytes());
      param_io_.emplace(*host_, params_.block_bytes());
      std::memset(param_io_->data, 0, param_io_->bytes);
      for (std::uint32_t c : plan.param_chunks) {
        std::size_t const block = params_.block(c, 0, false);
        params_.write(&block, param_io_->data);
      }
    }
    // From a ring block, not one of its own: the pool would keep that one cached for nothing.
    std::byte* const zeros = ring_[0]->data;
    std::memset(zeros, 0, ring_[0]->bytes);
    std::array<std::size_t, max_lists> blocks{};
    for (std::uint32_t c : plan.state_chunks) {
      for (std::size_t k = 0; k < state_.lists(); ++k) blocks[k] = state_.block(c, k, false);
      state_.write(blocks.data(), zeros);
    }
  }
  // No read may outlive its block: each is finished first (the optimizer worker is idle).
  ~file_tier() {
    for (std::size_t r = 0; r < ring_.size(); ++r) {
      finish_quietly(state_, reads_[r]);
      finish_quietly(params_, param_reads_[r]);
    }
    drop_ahead();
  }
  file_tier(file_tier const&) = delete;
  file_tier& operator=(file_tier const&) = delete;
  // ---- where a chunk's bytes are ------------------------------------------------------------
  [[nodiscard]] bool state_on_file(std::uint32_t c) const noexcept { return state_.spilled(c); }
  [[nodiscard]] bool params_spilled(std::uint32_t c) const noexcept { return params_.spilled(c); }
  // Chunk c's parameters live on file (a device copy of them is clean), and whether only there.
  [[nodiscard]] bool param_in_file(std::uint32_t c) const noexcept {
    return params_.spilled(c) && !params_.materialized(c);
  }
  [[nodiscard]] bool param_on_file(std::uint32_t c) const noexcept {
    return param_in_file(c) && (*params_list_)[c].payload() == nullptr;
  }
  // Chunk c's master is on file now (written there by init_master), not on a host block.
  [[nodiscard]] bool master_on_file(std::uint32_t c, std::size_t state_lists) const noexcept {
    return state_.lists() > state_lists && state_.spilled(c) && !state_.materialized(c);
  }
  [[nodiscard]] bool holds_masters(std::size_t state_lists) const noexcept { return state_.lists() > state_lists; }
  [[nodiscard]] std::size_t lists() const noexcept { return state_.lists(); }
  [[nodiscard]] std::span<std::uint32_t const> param_chunks() const noexcept { return params_.chunks(); }
  // The chunks whose state a host step of this step read and wrote.
  [[nodiscard]] std::span<std::uint32_t const> stepped() const noexcept { return stepped_; }
  // List k of a staged job.
  [[nodiscard]] float* list_of(job const& j, std::size_t k) const noexcept {
    return reinterpret_cast<float*>(j.state + k * state_.block_bytes());
  }

  // ---- a step ---------------------------------------------------------------------------------
  void begin_step() noexcept {
    prefetched_.fill(no_chunk);  // a read a skipped or failed step started is finished before reuse
    prefetches_ = 0;
  }
  // The step's writes become current.
  void commit() noexcept {
    state_.commit();
    params_.commit();
    stepped_.clear();
  }
  // The step failed: the current slots still hold the state before it.
  void discard() noexcept {
    state_.discard();
    params_.discard();
    stepped_.clear();
  }
  // A failed step, once the workers drained: nothing it wrote or read ahead is kept.
  void abort() noexcept {
    discard();
    drop_ahead();
  }

  // Chunk c's host step: one of the two ring blocks for its lists (waiting, through
  // wait_for(chunk), for the update two such steps back to finish with it: back-pressure on
  // backward when the worker lags), its slots, and its reads, started now unless the prefetch
  // started them.
  template <class WaitFor>
  job stage(std::uint32_t c, WaitFor&& wait_for) {
    job j;
    std::size_t const r = next_++ % ring_.size();
    bool const prefetched = std::exchange(prefetched_[r], no_chunk) == c;
    if (!prefetched) claim(r, wait_for);
    user_[r] = c;
    j.state = ring_[r]->data;
    j.reading = &reads_[r];
    std::array<std::size_t, max_lists> from{};
    for (std::size_t k = 0; k < state_.lists(); ++k) {
      from[k] = state_.block(c, k, false);
      j.to[k] = state_.block(c, k, true);
    }
    if (params_.spilled(c)) {
      j.params = param_ring_[r]->data;
      j.param_reading = &param_reads_[r];
      j.param_to = params_.block(c, 0, true);
      drop_ahead(c);  // read before the update: a fetch after it reads the update's slot
      if (param_view_chunk_ == c) param_view_chunk_ = no_chunk;  // and so does a view
      if (!prefetched) start_param_read(c, r);
      params_.mark_written(c);
      stats_->nvme_write_bytes += params_.block_bytes();
    }
    if (!prefetched) {
      state_.start_read(from.data(), j.state, reads_[r]);
      stats_->nvme_read_bytes += state_.staging_bytes();
    }
    state_.mark_written(c);
    stepped_.push_back(c);
    stats_->nvme_write_bytes += state_.staging_bytes();
    return j;
  }
  // On the optimizer worker, before the update: the job's reads landed (false: one failed, kept
  // in j.failure, and the update must not run). Both are waited for, whatever the first did.
  bool finish_reads(job& j) noexcept {
    try {
      state_.finish(*j.reading);
    } catch (...) {
      j.failure = std::current_exception();
    }
    if (j.params != nullptr) {
      try {
        params_.finish(*j.param_reading);
      } catch (...) {
        if (!j.failure) j.failure = std::current_exception();
      }
    }
    return !j.failure;
  }
  // After the update: the lists to the other slots.
  void write_back(job& j) noexcept {
    try {
      state_.write(j.to.data(), j.state);
      if (j.params != nullptr) params_.write(&j.param_to, j.params);
    } catch (...) {
      j.failure = std::current_exception();
    }
  }
  // Deferred updates: chunk c's reads start as backward completes it, into the next free ring
  // block, so its update finds them done. False: both blocks are taken in this step.
  template <class WaitFor>
  bool prefetch(std::uint32_t c, WaitFor&& wait_for) {
    if (prefetches_ == ring_.size()) return false;
    std::size_t const r = (next_ + prefetches_++) % ring_.size();
    claim(r, wait_for);
    user_[r] = no_chunk;
    std::array<std::size_t, max_lists> blocks{};
    for (std::size_t k = 0; k < state_.lists(); ++k) blocks[k] = state_.block(c, k, false);
    state_.start_read(blocks.data(), ring_[r]->data, reads_[r]);
    if (params_.spilled(c)) start_param_read(c, r);
    prefetched_[r] = c;
    stats_->nvme_read_bytes += state_.staging_bytes();
    ++stats_->nvme_early_reads;
    return true;
  }

  // ---- parameters on file ---------------------------------------------------------------------
  // A new host block (the chunk's capacity, from the pool) with chunk c's parameters, from the
  // slot that holds them now (the other one once this step's update of c wrote it), or from the
  // read the prefetch started. `counted`: a step or evaluation reads it (offload_stats).
  std::byte* read_param(std::uint32_t c, bool counted) {
    std::size_t const bytes = (*params_list_)[c].capacity();
    auto* host = static_cast<std::byte*>(host_->allocate(bytes, 256));
    try {
      std::byte const* from = nullptr;
      for (param_ahead& a : ahead_) {
        if (a.c != c) continue;
        a.c = no_chunk;  // free again, whatever the read did
        auto const t0 = std::chrono::steady_clock::now();
        params_.finish(a.io);
        stats_->stall_ms += ms_since(t0);
        from = a.block->data;
      }
      if (from == nullptr) {
        std::size_t const block = params_.block(c, 0, params_.written(c));
        params_.read(&block, param_io_->data);
        from = param_io_->data;
        if (counted) stats_->nvme_read_bytes += params_.block_bytes();
      }
      std::memcpy(host, from, bytes);
    } catch (...) {
      host_->deallocate(host, bytes, 256);
      throw;
    }
    return host;
  }
  // The prefetch reached parameter chunk c, on file: its read starts now, into one of two blocks
  // (none free: the fetch reads it then). True once that read is done: the prefetch may fetch c
  // as any other chunk. A refused request is kept for the fetch to report.
  bool read_param_ahead(std::uint32_t c) {
    if (!param_on_file(c)) return false;
    param_ahead* slot = nullptr;
    for (param_ahead& a : ahead_) {
      if (a.c == c) return params_.ready(a.io);
      if (a.c == no_chunk && slot == nullptr) slot = &a;
    }
    if (slot == nullptr) return false;
    try {
      if (!slot->block) slot->block.emplace(*host_, params_.block_bytes());
    } catch (...) {  // no block: the fetch reads it
      return false;
    }
    std::size_t const block = params_.block(c, 0, params_.written(c));
    params_.start_read(&block, slot->block->data, slot->io);
    slot->c = c;
    stats_->nvme_read_bytes += params_.block_bytes();
    ++stats_->nvme_early_reads;
    return false;
  }
  // Reads started ahead that no fetch will take (c: that chunk's only, no_chunk: all) end here.
  void drop_ahead(std::uint32_t c = no_chunk) noexcept {
    for (param_ahead& a : ahead_) {
      if (a.c == no_chunk || (c != no_chunk && a.c != c)) continue;
      a.c = no_chunk;
      finish_quietly(params_, a.io);
    }
  }
  // Chunk c's parameters on a new host block, for a caller that writes them between steps: the
  // views end, the other materialized chunks go back to file first (and the pool back under the
  // budget). The caller attaches the block (and frees a device copy), then calls
  // params_attached(c). `counted` as read_param.
  std::byte* take_param(std::uint32_t c, bool counted) {
    bool const freed = drop_view();
    drop_ahead();
    if (flush(c) || freed) host_->trim();  // the pool caches freed blocks
    return read_param(c, counted);
  }
  void params_attached(std::uint32_t c) noexcept { params_.set_materialized(c, true); }
  // Chunk c's parameters read from file into one block the next views of c share (nullptr: not
  // on file alone). wait_for(c) first: an update of c in this step writes the slot read.
  template <class WaitFor>
  std::byte const* param_view(std::uint32_t c, WaitFor&& wait_for) {
    if (!param_on_file(c)) return nullptr;
    if (param_view_chunk_ != c) {
      if (!param_view_) param_view_.emplace(*host_, params_.block_bytes());
      param_view_chunk_ = no_chunk;  // a read that fails leaves nothing to reuse
      wait_for(c);
      std::size_t const block = params_.block(c, 0, params_.written(c));
      params_.read(&block, param_view_->data);
      param_view_chunk_ = c;
    }
    return param_view_->data;
  }
  void end_param_view() noexcept {  // the masters were written from the views
    param_view_chunk_ = no_chunk;
    param_view_.reset();
  }

  // ---- state on file, for checkpoints -------------------------------------------------------
  // Chunk c's lists into host blocks attached to its chunks (a checkpoint's load), from the
  // current slots; flush() writes them back. One chunk's lists on the host at a time.
  void materialize(std::uint32_t c) {
    if (!state_.spilled(c) || state_.materialized(c)) return;
    bool const freed = drop_view();
    if (flush(c) || freed) host_->trim();  // c's parameters, if on the host for the same load, stay
    staging const s(*host_, state_.staging_bytes());
    std::array<std::size_t, max_lists> blocks{};
    for (std::size_t k = 0; k < state_.lists(); ++k) blocks[k] = state_.block(c, k, false);
    state_.read(blocks.data(), s.data);
    std::array<std::byte*, max_lists> taken{};
    std::size_t const bytes = list(0, c).capacity();  // every list on file is an fp32 chunk
    try {
      for (std::size_t k = 0; k < state_.lists(); ++k) taken[k] = static_cast<std::byte*>(host_->allocate(bytes, 256));
    } catch (...) {
      for (std::byte* p : taken)
        if (p != nullptr) host_->deallocate(p, bytes, 256);
      throw;
    }
    for (std::size_t k = 0; k < state_.lists(); ++k) {
      std::memcpy(taken[k], s.data + k * state_.block_bytes(), bytes);
      list(k, c).attach(taken[k], chunk::tier::host);
    }
    state_.set_materialized(c, true);
  }
  // Chunk c's state leaves the file for good (a policy moved it to the device, from the host
  // blocks materialize and take_param attached). True: its parameters were on file too.
  bool forget(std::uint32_t c) noexcept {
    state_.set_materialized(c, false);
    state_.forget(c);
    if (!params_.spilled(c)) return false;
    params_.set_materialized(c, false);
    params_.forget(c);
    return true;
  }
  // List k of chunk c read from its current slot into one block the next views of c share (a
  // save reads a chunk's lists once for all its tensors). nullptr: that list is on the host.
  std::byte const* state_view(std::uint32_t c, std::size_t k) {
    if (!state_.spilled(c) || state_.materialized(c) || k >= state_.lists()) return nullptr;
    if (view_chunk_ != c) {
      if (!view_) view_.emplace(*host_, state_.staging_bytes());
      view_chunk_ = no_chunk;  // a read that fails leaves nothing to reuse
      std::array<std::size_t, max_lists> blocks{};
      for (std::size_t j = 0; j < state_.lists(); ++j) blocks[j] = state_.block(c, j, false);
      state_.read(blocks.data(), view_->data);
      view_chunk_ = c;
    }
    return view_->data + k * state_.block_bytes();
  }
  // Chunk c's master, from `from` (list_bytes), to its current slot (once, before the first update).
  void write_master(std::uint32_t c, std::byte const* from) {
    state_.write_one(state_.block(c, state_.lists() - 1, false), from);
    if (view_chunk_ == c) view_chunk_ = no_chunk;  // the view read the zeros before this
  }
  [[nodiscard]] std::size_t list_bytes() const noexcept { return state_.block_bytes(); }
  // The views' blocks back to the pool (a save ended, a load or a step begins). True: some were held.
  bool drop_view() noexcept {
    bool const had = view_ || param_view_;
    view_chunk_ = no_chunk;
    view_.reset();
    param_view_chunk_ = no_chunk;
    param_view_.reset();
    return had;
  }
  // The materialized chunks' lists back to file (the other slot, then current), their host blocks
  // freed, but chunk `keep`'s. A failed write keeps them attached and current on the host:
  // nothing is lost. True: some went. Their blocks go straight to the pool: a materialized chunk
  // is on host blocks of its own (never the device, never the gradient ring), as begin_step and
  // begin_evaluation flush before anything may fetch it.
  bool flush(std::uint32_t keep = no_chunk) {
    bool flushed = false;
    for (std::uint32_t c : params_.chunks()) {
      if (c == keep || !params_.materialized(c)) continue;
      chunk::chunk& p = (*params_list_)[c];
      std::memcpy(param_io_->data, p.payload(), p.capacity());
      std::memset(param_io_->data + p.capacity(), 0, param_io_->bytes - p.capacity());
      std::size_t const block = params_.block(c, 0, true);
      params_.write(&block, param_io_->data);
      params_.mark_written(c);
      params_.commit_one(c);
      host_->deallocate(p.detach(), p.capacity(), 256);
      params_.set_materialized(c, false);
      if (param_view_chunk_ == c) param_view_chunk_ = no_chunk;
      flushed = true;
    }
    for (std::uint32_t c : state_.chunks()) {
      if (c == keep || !state_.materialized(c)) continue;
      staging const s(*host_, state_.staging_bytes());
      std::memset(s.data, 0, s.bytes);
      std::array<std::size_t, max_lists> blocks{};
      for (std::size_t k = 0; k < state_.lists(); ++k) {
        chunk::chunk const& l = list(k, c);
        std::memcpy(s.data + k * state_.block_bytes(), l.payload(), l.capacity());
        blocks[k] = state_.block(c, k, true);
      }
      state_.write(blocks.data(), s.data);
      state_.mark_written(c);
      state_.commit_one(c);
      for (std::size_t k = 0; k < state_.lists(); ++k) {
        chunk::chunk& l = list(k, c);
        host_->deallocate(l.detach(), l.capacity(), 256);
      }
      state_.set_materialized(c, false);
      flushed = true;
    }
    return flushed;
  }

 private:
  struct param_ahead {  // a parameter read the prefetch started
    std::uint32_t c = no_chunk;
    state_spill::pending io;
    std::optional<staging> block;
  };

  [[nodiscard]] chunk::chunk& list(std::size_t k, std::uint32_t c) noexcept { return (*lists_[k])[c]; }
  static void finish_quietly(state_spill& s, state_spill::pending& io) noexcept {
    if (io.issued == 0) return;
    try {
      s.finish(io);
    } catch (...) {  // what it read no longer matters
    }
  }
  void start_param_read(std::uint32_t c, std::size_t r) {
    std::size_t const block = params_.block(c, 0, false);
    params_.start_read(&block, param_ring_[r]->data, param_reads_[r]);
    stats_->nvme_read_bytes += params_.block_bytes();
  }
  // Ring block r for a new read: the update that last used it finished with it, and a read into
  // it that no update waited for (a step that failed or skipped its updates) ended.
  template <class WaitFor>
  void claim(std::size_t r, WaitFor& wait_for) {
    if (user_[r] != no_chunk) wait_for(user_[r]);
    auto const t0 = std::chrono::steady_clock::now();
    bool const waited = reads_[r].issued > 0;
    finish_quietly(state_, reads_[r]);
    if (waited)
      stats_->stall_ms += ms_since(t0);
    finish_quietly(params_, param_reads_[r]);
  }

  memory::pinned_pool<B>* host_;
  offload_stats* stats_;                      // the engine's figures of the step in progress
  std::array<chunk::chunk_list*, max_lists> lists_{};  // the lists that go to file, in file order
  chunk::chunk_list* params_list_;
  state_spill state_;   // the optimizer state (and masters) on file
  state_spill params_;  // the parameter chunks on file (past every chunk's state)
  std::array<std::optional<staging>, 2> ring_;        // host steps' lists, used in turn
  std::array<std::optional<staging>, 2> param_ring_;  // beside ring_: their parameters
  std::array<std::uint32_t, 2> user_{no_chunk, no_chunk};  // the chunk whose update last used each
  std::array<state_spill::pending, 2> reads_{}, param_reads_{};  // the read into each
  std::size_t next_ = 0;
  std::array<std::uint32_t, 2> prefetched_{no_chunk, no_chunk};  // the chunk whose read each holds
  std::size_t prefetches_ = 0;        // reads the prefetch started in this step
  std::vector<std::uint32_t> stepped_;  // the chunks on file updated in this step
  std::optional<staging> view_;       // a chunk's lists, read for a save
  std::uint32_t view_chunk_ = no_chunk;
  std::optional<staging> param_io_;   // fetches read parameters through it, flushes write them
  std::optional<staging> param_view_;  // a chunk's parameters, read for a save
  std::uint32_t param_view_chunk_ = no_chunk;
  std::array<param_ahead, 2> ahead_;
};

}  // namespace tide::offload::detail
