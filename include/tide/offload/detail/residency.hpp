#pragma once
// The residency part of the offload engine: it carries out the residency planner's decisions
// (detail/residency_planner.hpp: budgets, victims, what to fetch ahead) on the engine's tier store
// (detail/chunk_store.hpp, which it moves chunks of but does not own), making a moment's chunks
// resident (evicting the planner's victims, handing their blocks over) and prefetching the next
// moments' chunks. It decides nothing itself: the planner does, from the policy P and the trace;
// the moments come from its moment_map (detail/moments.hpp), and what the open block may touch
// is its block_access (detail/block_access.hpp).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/chunk/memory_tracer.hpp"
#include "tide/memory/ops.hpp"
#include "tide/memory/stream.hpp"
#include "tide/offload/detail/block_access.hpp"
#include "tide/offload/detail/chunk_store.hpp"
#include "tide/offload/detail/clock.hpp"
#include "tide/offload/detail/moments.hpp"
#include "tide/offload/detail/residency_planner.hpp"
#include "tide/offload/scheduler_policy.hpp"

namespace tide::offload::detail {

template <Backend B, Element T, class P, class Engine>
class residency {
 public:
  using store = chunk_store<B, T, Engine>;

  // `st`: the engine's tier store, made first (with the policy's layout); the residency part
  // moves its chunks.
  residency(store& st, P const& policy)
      : st_(st),
        plan_(policy, st.arena_->config().budget, st_.ids_),
        moments_(st_.uses_, st_.layout_, st_.n_),
        access_(st_.params_.size()) {
    policy_context& ctx = plan_.ctx;
    ctx.working_set = moments_.working_set();
    ctx.working_set_moment = moments_.working_set_moment();
    ctx.grads_per_moment = moments_.grads_per_moment();
    ctx.chunks = st_.n_;
    ctx.block_bytes = st_.block_bytes();
    ctx.state_block_bytes = st_.state_block_bytes();
  }
  [[nodiscard]] policy_context const& context() const noexcept { return plan_.ctx; }

  void fetched(std::uint32_t id) { plan_.fetched(id); }
  // Whether chunk id may be evicted now: on the device and movable.
  [[nodiscard]] auto evictable() {
    return [this](std::uint32_t id) { return st_.on_device(id) && st_.chunk_of(id).movable(); };
  }
  // The planner's victim at moment t, none of `protect`, next used further than `beyond`
  // (untraced: any); what the store asks when the arena refuses a block.
  std::optional<std::uint32_t> pick_victim(std::size_t t, std::span<std::uint32_t const> protect, std::size_t beyond) {
    return plan_.victim(t, protect, beyond, evictable());
  }

  // ---- what the open block may touch (block_access) and the moments (moment_map) ----------------
  void check_index(std::uint32_t i, char const* what) const {
    TIDE_CHECK(i < st_.params_.size(), usage, "offload::scheduler::", what, "(", i, "): the model has ",
               st_.params_.size(), " parameters (indices 0..", st_.params_.size() - 1, ")");
  }
  [[noreturn]] void fail_access(std::uint32_t i, char const* what) const {
    std::string blocks;
    for (int b = st_.uses_.first_block; b <= st_.uses_.last_block(); ++b)
      for (std::uint32_t j : st_.uses_.of(b))
        if (j == i) blocks.append(blocks.empty() ? "" : ", ").append(std::to_string(b));
    std::string const where =
        access_.in_block() ? tide::detail::concat("in block ", access_.block(), "'s ", chunk::to_string(access_.phase()))
                           : std::string("between blocks (outside every pre_*/post_* pair)");
    std::string const listed =
        blocks.empty() ? std::string("in no block")
                       : tide::detail::concat("only for block", blocks.find(',') != std::string::npos ? "s " : " ", blocks);
    TIDE_FAIL(usage, "offload ", P::name(), ": the model asked for the ", what, " of \"", st_.params_[i].name(),
              "\" (parameter ", i, ") ", where, ", but uses() lists it ", listed,
              std::string_view(what) == "gradient" ? " (gradients: in their backward only)" : "",
              blocks.empty() ? "; add it to the uses() (tide::block_uses) of the block that reads it"
                             : "; add it to that block's uses() (tide::block_uses) or read it inside a block that lists it");
  }
  [[nodiscard]] std::span<std::uint32_t const> completes_at(int block) const { return moments_.completes_at(block); }
  [[nodiscard]] std::vector<std::uint32_t> const& ids_of(int block, chunk::phase ph) const {
    return moments_.ids_of(block, ph);
  }

  // Makes the chunks of the moment resident; on return every one is on the device and the
  // compute that follows runs after its copy (chunk_store::compute_after): on a device backend
  // the compute stream waits for the copies, not the host, which goes on to the next moment and
  // keeps the device's queue full.
  void make_resident(std::vector<std::uint32_t> const& ids, std::size_t t) {
    std::span<std::uint32_t const> const protect(ids);
    std::size_t const need = st_.block_bytes();
    if constexpr (B::is_device) (void)st_.refresh_in_flight();  // copies already done give their blocks back
    for (std::uint32_t id : ids) {
      plan_.used(id);
      if (st_.on_device(id)) {
        ++st_.cur_.prefetch_hits;
        continue;
      }
      ++st_.cur_.demand_fetches;
      if constexpr (!B::is_device)  // its compute is this thread: it frees stale blocks first
        while (st_.model_on_device() + need > plan_.capacity(t, st_.non_model_now()) && st_.reclaim_stale(true)) {
        }
      residency_move const m = plan_.demand(t, protect, resident(), need, st_.non_model_now(), evictable());
      if (m.what == residency_move::kind::evict_then_fetch) {
        evict_then_fetch(id, t, protect, m.victim);
        continue;
      }
      TIDE_CHECK(m.what == residency_move::kind::fetch, budget, "offload ", P::name(), ": moment ", t, " needs chunk ",
                 id, " on the device but every chunk there is in use (model data on the device ",
                 bytes_of{st_.model_on_device()}, ", device room for chunks ",
                 bytes_of{plan_.hard_limit(st_.non_model_now())}, "); raise device_budget");
      if (!reuse_stale(id, t, protect)) st_.fetch(id, t, protect);
    }
    for (std::uint32_t id : ids) st_.compute_after(id);
  }

  // Fetches the next moments' chunks ahead, as the planner walks them, within the budget and the
  // copies-in-flight bound.
  void prefetch(std::size_t t) {
    std::size_t const max_in_flight = plan_.max_in_flight();
    plan_.ahead(t, [&](std::uint32_t id, int k, std::size_t u, std::span<std::uint32_t const> protect) {
      if (st_.on_device(id)) return true;
      if (st_.copies_in_flight_ >= max_in_flight && st_.refresh_in_flight() >= max_in_flight) return false;
      if (id < st_.n_ && st_.owner().stepping(id)) return true;  // still being stepped
      // A FREE gradient is created when touched. A parameter chunk on file is read first: the
      // read starts now, and once it is done the chunk is fetched as any other.
      if (st_.chunk_of(id).payload() == nullptr && (id >= st_.n_ || !st_.owner().read_param_ahead(id))) return true;
      residency_move const m = plan_.prefetch(t, u, k, protect, st_.model_on_device(), st_.block_bytes(),
                                              st_.non_model_now(), evictable());
      if (m.what == residency_move::kind::stop) return false;
      if (m.what == residency_move::kind::evict_then_fetch)
        evict_then_fetch(id, t, protect, m.victim);
      else if (!(stale_on_device(id) && reuse_stale(id, t, protect)))  // its own block: the same bytes as a fetch
        st_.fetch(id, t, protect);
      ++st_.cur_.prefetches;
      return true;
    });
  }

  // The model bytes on the device as a demand fetch counts them: a block whose copy out is still
  // in flight (stale) is free, since a fetch takes it. A device backend takes it at once
  // (reuse_stale: stream order); tide::host frees it first, once its copy is done, and fetches
  // into the arena's room (the same bytes to plan with).
  [[nodiscard]] std::size_t resident() const {
    std::size_t bytes = st_.model_on_device();
    for (std::uint32_t v = 0; v < st_.ids_; ++v)
      if (stale_on_device(v)) bytes -= round_up(st_.chunk_of(v).capacity(), 256);
    return bytes;
  }
  // On a device backend, fetches chunk id into a stale device block of its size (its own, else
  // one whose copy is done, else any): the fetch's copy queues behind the block's copy out on the
  // copy stream, a zero fill waits for it on the compute stream; nothing waits on the host.
  // False: none. A prefetch takes only the chunk's own block (a fetch on tide::host frees it
  // first): any other would leave the device with fewer bytes than tide::host, and the next
  // prefetch would plan with other numbers.
  bool reuse_stale(std::uint32_t id, std::size_t t, std::span<std::uint32_t const> protect) {
    if constexpr (B::is_device) {
      auto usable = [&](std::uint32_t v) {
        return stale_on_device(v) && st_.chunk_of(v).capacity() == st_.chunk_of(id).capacity();
      };
      std::optional<std::uint32_t> pick;
      if (usable(id)) pick = id;
      for (std::uint32_t v = 0; v < st_.ids_ && pick != id; ++v) {
        if (!usable(v)) continue;
        if (!pick) pick = v;
        if (!st_.in_flight_[v] || st_.ready_[v].query()) {
          pick = v;
          break;
        }
      }
      if (!pick) return false;
      st_.fetch_into(id, t, protect, *pick, st_.take_stale(*pick, id));
      return true;
    }
    return false;
  }
  // Evicts `victim` and fetches id into a block left stale, in stream order: the victim's, or id's
  // own when its copy out is still in flight (the victim's block then waits to be freed or taken).
  // A fetch beside its own stale block would wait on the host to free it.
  void evict_then_fetch(std::uint32_t id, std::size_t t, std::span<std::uint32_t const> protect, std::uint32_t victim) {
    st_.evict(victim);
    std::uint32_t const from = stale_on_device(id) ? id : victim;
    st_.fetch_into(id, t, protect, from, st_.take_stale(from, id));
  }
  // Chunk v left a device block behind, freed once its copy out is done (or taken by a fetch).
  [[nodiscard]] bool stale_on_device(std::uint32_t v) const {
    return st_.stale_[v] != nullptr && st_.stale_where_[v] == chunk::tier::device;
  }

  // A step that threw: the trace forgets its moments, the tide its samples.
  void abort() noexcept {
    plan_.tracer.abort_step();
    tide_.clear();
    forward_events_.clear();
  }

  // ---- the warm-up's forward time per block (policy_context::forward_ms) ---------------------
  // tide::host times a block on this thread, its compute timeline. A device backend times it
  // with events on the compute stream, read once the step drained: its host only enqueues the
  // kernels, so the host's clock would time the launches.
  void forward_begins() {
    if constexpr (B::is_device) {
      timed_block& b = forward_events_.emplace_back(event_like(st_.copy_stream_), event_like(st_.copy_stream_));
      memory::record(st_.ex_, b.begin);
    } else {
      forward_start_ = std::chrono::steady_clock::now();
    }
  }
  void forward_ends() {
    if constexpr (B::is_device) {
      if (forward_events_.empty() || forward_events_.back().ended) return;  // the block began before the warm-up
      memory::record(st_.ex_, forward_events_.back().end);
      forward_events_.back().ended = true;
    } else {
      forward_ms_ += ms_since(forward_start_);
      ++forward_blocks_;
    }
  }
  void forward_times_drained() {
    for (timed_block const& b : forward_events_) {
      if (!b.ended) continue;
      forward_ms_ += elapsed_ms(b.begin, b.end);
      ++forward_blocks_;
    }
    forward_events_.clear();
  }

  // The trace is known: what the warm-up measured goes to the policy, which places what it
  // wants; the eviction policy gets the trace.
  void after_warm_up() {
    policy_context& ctx = plan_.ctx;
    ctx.moments = plan_.tracer.moments();
    ctx.peak_non_model = plan_.tracer.peak_non_model();
    // The mean chunk copy (over every copy since construction, as the engine counts; a model's
    // activation copies have an engine of their own).
    auto const st = st_.engine_.stats();
    ctx.copy_ms = st.completed > 0 ? st.copy_ms / static_cast<double>(st.completed) : 0;
    ctx.forward_ms = forward_blocks_ > 0 ? forward_ms_ / static_cast<double>(forward_blocks_) : 1;
    plan_.trace_known();
    plan_.policy.after_warm_up(st_.owner(), ctx);
    plan_.trace_known();  // the placement may have amended the trace
  }
  // The step in progress becomes last_: what is where, and how full the chunks are.
  void finish_stats(bool warm_up, std::int64_t step) {
    auto& cur = st_.cur_;
    cur.step = static_cast<std::size_t>(step);
    cur.peak_device_bytes = st_.arena_->stats().peak;
    cur.device_model_bytes = 0;
    cur.host_model_bytes = 0;
    auto count = [&](chunk::chunk_list const& list) {
      for (std::uint32_t c = 0; c < st_.n_; ++c) {
        chunk::chunk const& ch = list[c];
        if (ch.payload() == nullptr) continue;
        (ch.tier() == chunk::tier::device ? cur.device_model_bytes : cur.host_model_bytes) += ch.capacity();
      }
    };
    count(st_.param_);
    count(st_.grad_);
    count(st_.master_);
    for (auto const& l : st_.state_) count(l);
    for (auto const& l : st_.extra_) count(l);
    std::size_t used = 0, held = 0;
    for (std::uint32_t c = 0; c < st_.n_; ++c) {
      held += st_.param_[c].capacity();
      if (st_.shadow_[c] != nullptr) cur.host_model_bytes += st_.param_[c].capacity();
    }
    for (auto const& p : st_.params_) used += p.bytes;
    cur.chunk_utilisation = held > 0 ? static_cast<double>(used) / static_cast<double>(held) : 0;
    cur.moments = plan_.tracer.moments();
    cur.warm_up = warm_up;
    last_ = cur;
    cur = {};
    std::swap(last_tide_, tide_);  // both keep their capacity: no allocation per step
    tide_.clear();
  }

  store& st_;
  residency_planner<P> plan_;  // every residency decision: the policy, the trace, the budgets
  moment_map moments_;         // what each moment touches and completes
  block_access access_;        // what the open block may touch
  std::size_t current_ = 0;
  double forward_ms_ = 0;         // forward block time in the warm-up (for policies: layer_window<0>)
  std::size_t forward_blocks_ = 0;
  std::chrono::steady_clock::time_point forward_start_{};  // tide::host: the open forward block's start
  struct timed_block {  // a device: a forward block's events, until the step drained
    memory::event<B> begin, end;
    bool ended = false;
  };
  std::deque<timed_block> forward_events_;
  offload_stats last_{};          // the last completed step
  std::vector<tide_sample> tide_, last_tide_;
};

}  // namespace tide::offload::detail
