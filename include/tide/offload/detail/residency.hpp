#pragma once
// The residency layer of the offload engine: it carries out the residency planner's decisions
// (detail/residency_planner.hpp: budgets, victims, what to fetch ahead), making a moment's chunks
// resident (evicting the planner's victims, handing their blocks over) and prefetching the next
// moments' chunks. It decides nothing itself: the planner does, from the policy P and the trace;
// the moments come from its moment_map (detail/moments.hpp), and what the open block may touch
// is its block_access (detail/block_access.hpp).

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
#include "tide/offload/detail/residency_planner.hpp"
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
        plan_(policy, arena.config().budget, this->ids_),
        moments_(this->uses_, this->layout_, this->n_),
        access_(this->params_.size()) {
    policy_context& ctx = plan_.ctx;
    ctx.working_set = moments_.working_set();
    ctx.working_set_moment = moments_.working_set_moment();
    ctx.grads_per_moment = moments_.grads_per_moment();
    ctx.chunks = this->n_;
    ctx.block_bytes = this->block_bytes();
    ctx.state_block_bytes = this->state_block_bytes();
  }
  [[nodiscard]] policy_context const& context() const noexcept { return plan_.ctx; }

 protected:
  void fetched(std::uint32_t id) { plan_.fetched(id); }
  // Whether chunk id may be evicted now: on the device and movable.
  [[nodiscard]] auto evictable() {
    return [this](std::uint32_t id) { return this->on_device(id) && this->chunk_of(id).movable(); };
  }
  // The planner's victim at moment t, none of `protect`, next used further than `beyond`
  // (untraced: any); what the store asks when the arena refuses a block.
  std::optional<std::uint32_t> pick_victim(std::size_t t, std::span<std::uint32_t const> protect, std::size_t beyond) {
    return plan_.victim(t, protect, beyond, evictable());
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
    std::string const listed =
        blocks.empty() ? std::string("in no block")
                       : tide::detail::concat("only for block", blocks.find(',') != std::string::npos ? "s " : " ", blocks);
    TIDE_FAIL(usage, "offload ", P::name(), ": the model asked for the ", what, " of \"", this->params_[i].name(),
              "\" (parameter ", i, ") ", where, ", but uses() lists it ", listed,
              std::string_view(what) == "gradient" ? " (gradients: in their backward only)" : "",
              blocks.empty() ? "; add it to the uses() (tide::block_uses) of the block that reads it"
                             : "; add it to that block's uses() (tide::block_uses) or read it inside a block that lists it");
  }
  [[nodiscard]] std::span<std::uint32_t const> completes_at(int block) const { return moments_.completes_at(block); }
  [[nodiscard]] std::vector<std::uint32_t> const& ids_of(int block, chunk::phase ph) const {
    return moments_.ids_of(block, ph);
  }

  // Makes the chunks of the moment resident; on return every one is on the device and its copy
  // is complete.
  void make_resident(std::vector<std::uint32_t> const& ids, std::size_t t) {
    std::span<std::uint32_t const> const protect(ids);
    std::size_t const need = this->block_bytes();
    for (std::uint32_t id : ids) {
      plan_.used(id);
      if (this->on_device(id)) {
        ++this->cur_.prefetch_hits;
        continue;
      }
      ++this->cur_.demand_fetches;
      while (this->model_on_device() + need > plan_.capacity(t, this->non_model_now()) && this->reclaim_stale(true)) {
      }
      residency_move const m =
          plan_.demand(t, protect, this->model_on_device(), need, this->non_model_now(), evictable());
      if (m.what == residency_move::kind::evict_then_fetch) {
        this->fetch_into(id, t, protect, m.victim, this->hand_over(m.victim, id));
        continue;
      }
      TIDE_CHECK(m.what == residency_move::kind::fetch, budget, "offload ", P::name(), ": moment ", t, " needs chunk ",
                 id, " on the device but every chunk there is in use (model data on the device ",
                 bytes_of{this->model_on_device()}, ", device room for chunks ",
                 bytes_of{plan_.hard_limit(this->non_model_now())}, "); raise device_budget");
      this->fetch(id, t, protect);
    }
    for (std::uint32_t id : ids) this->settle(id);
  }

  // Fetches the next moments' chunks ahead, as the planner walks them, within the budget and the
  // copies-in-flight bound.
  void prefetch(std::size_t t) {
    std::size_t const max_in_flight = plan_.max_in_flight();
    plan_.ahead(t, [&](std::uint32_t id, int k, std::size_t u, std::span<std::uint32_t const> protect) {
      if (this->on_device(id)) return true;
      if (this->copies_in_flight_ >= max_in_flight && this->refresh_in_flight() >= max_in_flight) return false;
      if (id < this->n_ && this->self().stepping(id)) return true;  // still being stepped
      // A FREE gradient is created when touched. A parameter chunk on file is read first: the
      // read starts now, and once it is done the chunk is fetched as any other.
      if (this->chunk_of(id).payload() == nullptr && (id >= this->n_ || !this->self().read_param_ahead(id))) return true;
      residency_move const m = plan_.prefetch(t, u, k, protect, this->model_on_device(), this->block_bytes(),
                                              this->non_model_now(), evictable());
      if (m.what == residency_move::kind::stop) return false;
      if (m.what == residency_move::kind::evict_then_fetch)
        this->fetch_into(id, t, protect, m.victim, this->hand_over(m.victim, id));
      else
        this->fetch(id, t, protect);
      ++this->cur_.prefetches;
      return true;
    });
  }

  // The trace is known: what the warm-up measured goes to the policy, which places what it
  // wants; the eviction policy gets the trace.
  void after_warm_up() {
    policy_context& ctx = plan_.ctx;
    ctx.moments = plan_.tracer.moments();
    ctx.peak_non_model = plan_.tracer.peak_non_model();
    // The mean chunk copy (over every copy since construction, as the engine counts; a model's
    // activation copies have an engine of their own).
    auto const st = this->engine_.stats();
    ctx.copy_ms = st.completed > 0 ? st.copy_ms / static_cast<double>(st.completed) : 0;
    ctx.forward_ms = forward_blocks_ > 0 ? forward_ms_ / static_cast<double>(forward_blocks_) : 1;
    plan_.trace_known();
    plan_.policy.after_warm_up(this->self(), ctx);
    plan_.trace_known();  // the placement may have amended the trace
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
    cur.moments = plan_.tracer.moments();
    cur.warm_up = warm_up;
    last_ = cur;
    cur = {};
    std::swap(this->last_tide_, this->tide_);  // both keep their capacity: no allocation per step
    this->tide_.clear();
  }

  residency_planner<P> plan_;  // every residency decision: the policy, the trace, the budgets
  moment_map moments_;         // what each moment touches and completes
  block_access access_;        // what the open block may touch
  std::size_t current_ = 0;
  double forward_ms_ = 0;         // forward block time in the warm-up (for policies: layer_window<0>)
  std::size_t forward_blocks_ = 0;
  offload_stats last_{};          // the last completed step
  std::vector<tide_sample> tide_, last_tide_;
};

}  // namespace tide::offload::detail
