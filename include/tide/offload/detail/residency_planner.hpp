#pragma once
// The residency planner of the offload engine: every decision about which chunks are on the
// device, and none of the moves. It holds the scheduler policy P, the warm-up's trace
// (chunk::memory_tracer), the policy's context and the eviction clock, and answers from them and
// from the numbers the engine reports (bytes of model and non-model data on the device):
//
//   hard_limit(non_model)              device bytes chunks can take now
//   capacity(t, non_model)             device bytes chunks may take at moment t (the policy's budget)
//   victim(t, protect, beyond, ...)    the resident chunk to evict
//   demand(t, need, ...)               a moment's missing chunk: fetch, evict first, or refuse
//   ahead(t, f)                        the chunks the next moments touch, nearest first
//   prefetch(t, u, k, ...)             one of them: fetch, evict first, or stop looking ahead
//
// No memory and no engine: tests/offload/parts.cpp drives it with a recorded trace and a set of
// resident ids. The engine (detail/residency.hpp) asks, then carries the answer out.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "tide/chunk/memory_tracer.hpp"
#include "tide/offload/scheduler_policy.hpp"

namespace tide::offload::detail {

// What to do for one chunk: fetch it into free room, or evict `victim` first (and fetch into its
// block); `stop`: nothing can be done (a demand: over the hard limit; a prefetch: the budget is
// full of nearer uses).
struct residency_move {
  enum class kind : std::uint8_t { fetch, evict_then_fetch, stop } what = kind::fetch;
  std::uint32_t victim = 0;
};

template <class P>
class residency_planner {
 public:
  static constexpr std::size_t untraced = std::numeric_limits<std::size_t>::max();

  residency_planner(P const& p, std::size_t budget, std::uint32_t chunk_ids)
      : policy(p), tracer({.device_budget = budget, .reserved = p.reserved_bytes()}), ids_(chunk_ids) {
    ctx.budget = budget;
    tracer.set_chunks(chunk_ids);
    candidates_.reserve(chunk_ids);
  }

  // ---- budgets --------------------------------------------------------------------------------
  // What chunks can physically take: the budget minus the non-model bytes and the reserve.
  [[nodiscard]] std::size_t hard_limit(std::size_t non_model) const noexcept {
    std::size_t const taken = non_model + policy.reserved_bytes();
    return ctx.budget > taken ? ctx.budget - taken : 0;
  }
  // Device bytes chunks may take at moment t (untraced: the hard limit).
  [[nodiscard]] std::size_t capacity(std::size_t t, std::size_t non_model) const {
    return t == untraced ? hard_limit(non_model) : policy.chunk_budget(ctx, tracer, t);
  }

  // ---- victims --------------------------------------------------------------------------------
  // The chunk to evict at moment t among the ids for which evictable(id) (on the device, movable),
  // not in `protect`, whose next use is further than `beyond` (untraced: any). Before the trace
  // is known (or while it is recorded) the first candidate; after, the eviction policy's choice.
  template <class Evictable>
  std::optional<std::uint32_t> victim(std::size_t t, std::span<std::uint32_t const> protect, std::size_t beyond,
                                      Evictable&& evictable) {
    candidates_.clear();
    for (std::uint32_t id = 0; id < ids_; ++id) {
      if (!evictable(id) || std::ranges::find(protect, id) != protect.end()) continue;
      if (beyond != untraced && !(tracer.trace().next_use_distance(id, t) > beyond)) continue;
      candidates_.push_back(id);
    }
    if (candidates_.empty()) return std::nullopt;
    if (t == untraced || !tracer.warm() || tracer.recording()) return candidates_.front();
    return policy.policy.victim(std::span<std::uint32_t const>(candidates_), t);
  }

  // A chunk moment t needs and the device lacks: with `resident` bytes of chunks on the device,
  // one more block of `need` bytes. Over the policy's budget: evict (the policy's victim, none of
  // `protect`); with nothing movable, go on only while the hard limit allows (the warm-up's soft
  // budget is 0), else stop (the engine refuses with a budget error).
  template <class Evictable>
  residency_move demand(std::size_t t, std::span<std::uint32_t const> protect, std::size_t resident, std::size_t need,
                        std::size_t non_model, Evictable&& evictable) {
    if (resident + need <= capacity(t, non_model)) return {};
    if (auto const v = victim(t, protect, untraced, evictable)) return {residency_move::kind::evict_then_fetch, *v};
    if (resident + need <= hard_limit(non_model)) return {};
    return {residency_move::kind::stop};
  }

  // ---- prefetch -------------------------------------------------------------------------------
  // f(id, k, u, protect) for every chunk that moments u = t + k, k = 1 .. the policy's depth,
  // touch, nearest moment first; `protect` holds what moments t .. u touch. f returns false to
  // end the walk. Nothing while the warm-up records (no trace to look ahead in).
  template <class F>
  void ahead(std::size_t t, F&& f) {
    int const depth = policy.prefetch_depth(ctx);
    if (depth <= 0 || tracer.recording()) return;
    std::size_t const moments = tracer.moments();
    auto const& trace = tracer.trace();
    protect_.assign(trace.touched(t).begin(), trace.touched(t).end());
    for (int k = 1; k <= depth && t + static_cast<std::size_t>(k) < moments; ++k) {
      std::size_t const u = t + static_cast<std::size_t>(k);
      for (std::uint32_t id : trace.touched(u)) protect_.push_back(id);
      for (std::uint32_t id : trace.touched(u))
        if (!f(id, k, u, std::span<std::uint32_t const>(protect_))) return;
    }
  }
  // One chunk of the walk, k moments ahead (moment u): fetch into room both moments allow; else
  // only by evicting a chunk used later than it (what MIN would do anyway); else stop: the budget
  // is full of nearer uses, and fetching further ahead would undo MIN.
  template <class Evictable>
  residency_move prefetch(std::size_t t, std::size_t u, int k, std::span<std::uint32_t const> protect,
                          std::size_t resident, std::size_t need, std::size_t non_model, Evictable&& evictable) {
    std::size_t const room = std::min(capacity(t, non_model), capacity(u, non_model));
    if (resident + need <= room) return {};
    if (auto const v = victim(t, protect, static_cast<std::size_t>(k), evictable))
      return {residency_move::kind::evict_then_fetch, *v};
    return {residency_move::kind::stop};
  }
  // Copies in flight at most (the policy's bound).
  [[nodiscard]] std::size_t max_in_flight() const { return static_cast<std::size_t>(policy.max_in_flight()); }

  // ---- the eviction policy's clock ------------------------------------------------------------
  void tick() noexcept { ++clock_; }
  void used(std::uint32_t id) { policy.policy.on_use(id, clock_); }
  void fetched(std::uint32_t id) { policy.policy.on_fetch(id, clock_); }

  // The trace is known: what the warm-up measured goes to the policy (the engine calls
  // policy.after_warm_up between the two resets: its placement may amend the trace).
  void trace_known() { policy.policy.reset(tracer.trace()); }

  // Read by the engine and by policies: public, as the engine's placement members are.
  P policy;
  chunk::memory_tracer tracer;
  policy_context ctx{};

 private:
  std::uint32_t ids_;
  std::uint64_t clock_ = 0;
  std::vector<std::uint32_t> candidates_, protect_;
};

}  // namespace tide::offload::detail
