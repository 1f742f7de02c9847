#pragma once
// The residency layer of the offload engine: the per-moment budget the scheduler policy grants,
// making a moment's chunks resident (evicting the policy's victims, handing their blocks over)
// and prefetching the next moments' chunks. It decides nothing itself: budgets, prefetch depth
// and victims come from the policy P, the moments from its moment_map (detail/moments.hpp), and
// what the open block may touch is its block_access (detail/block_access.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tide/chunk/memory_tracer.hpp"
#include "tide/offload/detail/block_access.hpp"
#include "tide/offload/detail/chunk_store.hpp"
#include "tide/offload/detail/moments.hpp"
#include "tide/offload/scheduler_policy.hpp"

namespace tide::offload::detail {

template <Backend B, Element T, class P, class Engine>
class residency : public chunk_store<B, T, Engine> {
  using store = chunk_store<B, T, Engine>;
  friend store;

 public:
  residency(exec<B> const& ex, memory::device_arena<B>& arena, parameter_list params, block_uses uses, P const& policy,
            std::size_t state_lists, std::span<extra_list const> extras, bool lock_pages, chunk_shard shard = {},
            bool attach_state = true)
      : store(ex, arena, params, uses, policy.layout(params, uses, arena.config().budget, sizeof(T)), state_lists,
              extras, lock_pages, shard, attach_state),
        policy_(policy),
        tracer_({.device_budget = arena.config().budget, .reserved = policy.reserved_bytes()}),
        moments_(this->uses_, this->layout_, this->n_),
        access_(this->params_.size()) {
    tracer_.set_chunks(this->ids_);
    ctx_.working_set = moments_.working_set();
    ctx_.working_set_moment = moments_.working_set_moment();
    ctx_.grads_per_moment = moments_.grads_per_moment();
    ctx_.budget = arena.config().budget;
    ctx_.chunks = this->n_;
    ctx_.block_bytes = this->block_bytes();
    ctx_.state_block_bytes = this->state_block_bytes();
  }
  [[nodiscard]] policy_context const& context() const noexcept { return ctx_; }

 protected:
  void fetched(std::uint32_t id) { policy_.policy.on_fetch(id, tick_); }
  // The chunk to evict at moment t among the movable device chunks not in `protect` whose next
  // use is further than `beyond` (belady's prefetch rule; untraced: any).
  std::optional<std::uint32_t> pick_victim(std::size_t t, std::span<std::uint32_t const> protect, std::size_t beyond) {
    candidates_.clear();
    for (std::uint32_t id = 0; id < this->ids_; ++id) {
      chunk::chunk& ch = this->chunk_of(id);
      if (!this->on_device(id) || !ch.movable() || std::ranges::find(protect, id) != protect.end()) continue;
      if (beyond != store::untraced && !(tracer_.trace().next_use_distance(id, t) > beyond)) continue;
      candidates_.push_back(id);
    }
    if (candidates_.empty()) return std::nullopt;
    if (t == store::untraced || !tracer_.warm() || tracer_.recording()) return candidates_.front();
    return policy_.policy.victim(std::span<std::uint32_t const>(candidates_), t);
  }

  // ---- what the open block may touch (block_access) and the moments (moment_map) ----------------
  void check_index(std::uint32_t i, char const* what) const {
    TIDE_CHECK(i < this->params_.size(), usage, "offload::scheduler::", what, "(", i, "): the model has ",
               this->params_.size(), " parameters (indices 0..", this->params_.size() - 1, ")");
  }
  [[noreturn]] void fail_access(std::uint32_t i, char const* what) const {
    std::string blocks;
    for (int b = this->uses_.first_block; b <= this->uses_.last_block(); ++b)
      for (std::uint32_t j : this->uses_.of(b))
        if (j == i) blocks.append(blocks.empty() ? "" : ", ").append(std::to_string(b));
    std::string const where =
        access_.in_block() ? tide::detail::concat("in block ", access_.block(), "'s ",
                                                  access_.phase() == chunk::phase::forward ? "forward" : "backward")
                           : std::string("between blocks (outside every pre_*/post_* pair)");
    TIDE_FAIL(usage, "offload ", P::name(), ": the model asked for the ", what, " of \"", this->params_[i].name(),
              "\" (parameter ", i, ") ", where, ", but uses() lists it only for block",
              blocks.find(',') != std::string::npos ? "s " : " ", blocks.empty() ? std::string("s: none") : blocks,
              std::string_view(what) == "gradient" ? " (gradients: in their backward only)" : "",
              "; add it to that block's uses() (tide::block_uses) or read it inside a block that lists it");
  }
  [[nodiscard]] std::span<std::uint32_t const> completes_at(int block) const { return moments_.completes_at(block); }
  [[nodiscard]] std::vector<std::uint32_t> const& ids_of(int block, chunk::phase ph) const {
    return moments_.ids_of(block, ph);
  }

  // What chunks can physically take now: the budget minus the non-model bytes and the reserve.
  [[nodiscard]] std::size_t hard_limit() const {
    std::size_t const taken = this->non_model_now() + policy_.reserved_bytes();
    return ctx_.budget > taken ? ctx_.budget - taken : 0;
  }
  // Device bytes chunks may take at moment t.
  [[nodiscard]] std::size_t capacity(std::size_t t) const {
    return t == store::untraced ? hard_limit() : policy_.chunk_budget(ctx_, tracer_, t);
  }

  // Makes the chunks of the moment resident; on return every one is on the device and its copy
  // is complete.
  void make_resident(std::vector<std::uint32_t> const& ids, std::size_t t) {
    std::span<std::uint32_t const> const protect(ids);
    for (std::uint32_t id : ids) {
      policy_.policy.on_use(id, tick_);
      if (this->on_device(id)) {
        ++this->cur_.prefetch_hits;
        continue;
      }
      ++this->cur_.demand_fetches;
      std::size_t const need = this->block_bytes();
      while (this->model_on_device() + need > capacity(t) && this->reclaim_stale(true)) {
      }
      if (this->model_on_device() + need > capacity(t)) {
        // Over the policy's budget: evict (hand the victim's block over). With nothing movable,
        // go on only while the arena's hard limit allows (the warm-up's soft budget is 0).
        auto const victim = pick_victim(t, protect, store::untraced);
        if (victim) {
          this->fetch_into(id, t, protect, *victim, this->hand_over(*victim, id));
          continue;
        }
        TIDE_CHECK(this->model_on_device() + need <= hard_limit(), budget, "offload ", P::name(), ": moment ", t,
                   " needs chunk ", id, " on the device but every chunk there is in use (model data on the device ",
                   bytes_of{this->model_on_device()}, ", device room for chunks ", bytes_of{hard_limit()},
                   "); raise device_budget");
      }
      this->fetch(id, t, protect);
    }
    for (std::uint32_t id : ids) this->settle(id);
  }

  // Fetches the next moments' chunks ahead, within the budget and the copies-in-flight bound.
  void prefetch(std::size_t t) {
    int const depth = policy_.prefetch_depth(ctx_);
    if (depth <= 0 || tracer_.recording()) return;
    auto const max_in_flight = static_cast<std::size_t>(policy_.max_in_flight());
    std::size_t const moments = tracer_.moments();
    auto const& trace = tracer_.trace();
    protect_.assign(trace.touched(t).begin(), trace.touched(t).end());
    for (int k = 1; k <= depth && t + static_cast<std::size_t>(k) < moments; ++k) {
      std::size_t const u = t + static_cast<std::size_t>(k);
      for (std::uint32_t id : trace.touched(u)) protect_.push_back(id);
      for (std::uint32_t id : trace.touched(u)) {
        if (this->on_device(id)) continue;
        if (this->copies_in_flight_ >= max_in_flight && this->refresh_in_flight() >= max_in_flight) return;
        if (id < this->n_ && this->self().stepping(id)) continue;  // still being stepped
        // A FREE gradient is created when touched. A parameter chunk on file is read first: the
        // read starts now, and once it is done the chunk is fetched as any other.
        if (this->chunk_of(id).payload() == nullptr && (id >= this->n_ || !this->self().read_param_ahead(id)))
          continue;
        std::size_t const room = std::min(capacity(t), capacity(u));
        if (this->model_on_device() + this->block_bytes() > room) {
          // Only by evicting a chunk used later than this one (what MIN would do anyway).
          auto const victim = pick_victim(t, protect_, static_cast<std::size_t>(k));
          if (!victim) return;  // the budget is full of nearer uses: fetching further ahead would undo MIN
          this->fetch_into(id, t, protect_, *victim, this->hand_over(*victim, id));
        } else {
          this->fetch(id, t, protect_);
        }
        ++this->cur_.prefetches;
      }
    }
  }

  // The trace is known: what the warm-up measured goes to the policy, which places what it
  // wants; the eviction policy gets the trace.
  void after_warm_up() {
    this->ctx_.moments = this->tracer_.moments();
    this->ctx_.peak_non_model = this->tracer_.peak_non_model();
    // The mean chunk copy (over every copy since construction, as the engine counts; a model's
    // activation copies have an engine of their own).
    auto const st = this->engine_.stats();
    this->ctx_.copy_ms = st.completed > 0 ? st.copy_ms / static_cast<double>(st.completed) : 0;
    this->ctx_.forward_ms = forward_blocks_ > 0 ? forward_ms_ / static_cast<double>(forward_blocks_) : 1;
    this->policy_.policy.reset(this->tracer_.trace());
    this->policy_.after_warm_up(this->self(), this->ctx_);
    this->policy_.policy.reset(this->tracer_.trace());  // the placement may have amended the trace
  }
  // The step in progress becomes last_: what is where, and how full the chunks are.
  void finish_stats(bool warm_up, std::int64_t step) {
    auto& cur = this->cur_;
    cur.step = static_cast<std::size_t>(step);
    cur.peak_device_bytes = this->arena_->stats().peak;
    cur.device_model_bytes = 0;
    cur.host_model_bytes = 0;
    auto count = [&](chunk::chunk_list const& list) {
      for (std::uint32_t c = 0; c < this->n_; ++c) {
        chunk::chunk const& ch = list[c];
        if (ch.payload() == nullptr) continue;
        (ch.tier() == chunk::tier::device ? cur.device_model_bytes : cur.host_model_bytes) += ch.capacity();
      }
    };
    count(this->param_);
    count(this->grad_);
    count(this->master_);
    for (auto const& l : this->state_) count(l);
    for (auto const& l : this->extra_) count(l);
    std::size_t used = 0, held = 0;
    for (std::uint32_t c = 0; c < this->n_; ++c) {
      held += this->param_[c].capacity();
      if (this->shadow_[c] != nullptr) cur.host_model_bytes += this->param_[c].capacity();
    }
    for (auto const& p : this->params_) used += p.bytes;
    cur.chunk_utilisation = held > 0 ? static_cast<double>(used) / static_cast<double>(held) : 0;
    cur.moments = this->tracer_.moments();
    cur.warm_up = warm_up;
    last_ = cur;
    cur = {};
    std::swap(this->last_tide_, this->tide_);  // both keep their capacity: no allocation per step
    this->tide_.clear();
  }

  P policy_;
  chunk::memory_tracer tracer_;
  moment_map moments_;    // what each moment touches and completes
  block_access access_;   // what the open block may touch
  policy_context ctx_{};
  std::vector<std::uint32_t> candidates_, protect_;
  std::uint64_t tick_ = 0;
  std::size_t current_ = 0;
  double forward_ms_ = 0;         // forward block time in the warm-up (for policies: layer_window<0>)
  std::size_t forward_blocks_ = 0;
  offload_stats last_{};          // the last completed step
  std::vector<tide_sample> tide_, last_tide_;
};

}  // namespace tide::offload::detail
