#pragma once
// Eviction policies: which device-resident chunk makes room for a chunk that must come in.
//
//   tide::offload::belady p;         // or lru, fifo: plain values, calls resolved at compile time
//   p.reset(trace);                  // a new trace (belady keeps &trace: keep it alive)
//   p.on_fetch(c, tick);             // c became device-resident at tick (monotonic over p's life)
//   p.on_use(c, tick);               // c was touched on the device at tick
//   std::uint32_t v = p.victim(candidates, moment);   // one of `candidates` (non-empty)
//
//   static_assert(tide::offload::check_eviction_policy<my_policy>());  // names a missing member
//
// belady is MIN: it evicts the chunk whose next device use on the cyclic trace is furthest. With
// uniform chunk sizes and demand fetches that is the fewest evictions possible (tests/offload/policy.cpp
// checks it against an exhaustive search). lru and fifo need no trace: the baselines to compare with.
// Ties go to the lowest id, so every policy is deterministic.
//
// reset(trace) keeps lru's and fifo's history. A scheduler calls it at the end of the warm-up step,
// with the chunks the warm-up left on the device still there: they did arrive, and were last used,
// in the order the history holds, so the first evictions after the warm-up follow it (wiping it
// would make them go by lowest id instead). Ticks therefore grow over a policy's whole life: start
// a new run (a scheduler, a simulate() call) with a new policy value, as both do by default.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tide/chunk/access_trace.hpp"
#include "tide/core/error.hpp"

namespace tide::offload {

template <class P>
concept EvictionPolicy = requires(P& p, chunk::access_trace const& tr, std::uint32_t c, std::uint64_t tick,
                                  std::size_t moment, std::span<std::uint32_t const> candidates) {
  p.reset(tr);
  p.on_fetch(c, tick);
  p.on_use(c, tick);
  { p.victim(candidates, moment) } -> std::same_as<std::uint32_t>;
  { P::name } -> std::convertible_to<std::string_view>;
};

// `static_assert(check_eviction_policy<P>())`: the first missing member fails with a sentence
// instead of a dump of the concept's requires-clause.
template <class P>
consteval bool check_eviction_policy() {
  static_assert(requires(P& p, chunk::access_trace const& tr) { p.reset(tr); },
                "EvictionPolicy: P needs reset(tide::chunk::access_trace const&), called for every new trace");
  static_assert(requires(P& p, std::uint32_t c, std::uint64_t tick) { p.on_fetch(c, tick); },
                "EvictionPolicy: P needs on_fetch(std::uint32_t chunk, std::uint64_t tick)");
  static_assert(requires(P& p, std::uint32_t c, std::uint64_t tick) { p.on_use(c, tick); },
                "EvictionPolicy: P needs on_use(std::uint32_t chunk, std::uint64_t tick)");
  static_assert(requires(P& p, std::span<std::uint32_t const> cs, std::size_t t) {
                  { p.victim(cs, t) } -> std::same_as<std::uint32_t>;
                }, "EvictionPolicy: P needs victim(std::span<std::uint32_t const> candidates, std::size_t moment) "
                   "returning std::uint32_t, one of the candidates");
  static_assert(requires { { P::name } -> std::convertible_to<std::string_view>; },
                "EvictionPolicy: P needs a static `name` convertible to std::string_view (for reports)");
  return EvictionPolicy<P>;
}

namespace detail {
// The candidate with the largest key (ties: lowest id). Keys are read once per candidate.
template <class Key>
std::uint32_t max_by(std::span<std::uint32_t const> candidates, Key key) {
  TIDE_ASSERT(!candidates.empty());
  std::uint32_t best = candidates[0];
  auto best_key = key(best);
  for (std::uint32_t c : candidates.subspan(1)) {
    auto const k = key(c);
    if (k > best_key || (k == best_key && c < best)) best = c, best_key = k;
  }
  return best;
}

// Ticks by chunk id, grown on demand: a policy may see ids before its first reset (warm-up).
class tick_table {
 public:
  // Room for ids below `chunks`; the ticks already recorded stay.
  void fit(std::size_t chunks) {
    if (ticks_.size() < chunks) ticks_.resize(chunks, 0);
  }
  void set(std::uint32_t c, std::uint64_t tick) {
    if (c >= ticks_.size()) ticks_.resize(std::size_t{c} + 1, 0);
    ticks_[c] = tick + 1;  // 0 means "never": a chunk with no history is the oldest
  }
  [[nodiscard]] std::uint64_t get(std::uint32_t c) const noexcept { return c < ticks_.size() ? ticks_[c] : 0; }

 private:
  std::vector<std::uint64_t> ticks_;
};
}  // namespace detail

// MIN: the furthest next device use on the cyclic trace; a chunk the trace never touches first.
struct belady {
  static constexpr std::string_view name = "belady";
  void reset(chunk::access_trace const& tr) noexcept { trace_ = &tr; }
  void on_fetch(std::uint32_t, std::uint64_t) noexcept {}
  void on_use(std::uint32_t, std::uint64_t) noexcept {}
  [[nodiscard]] std::uint32_t victim(std::span<std::uint32_t const> candidates, std::size_t moment) const {
    TIDE_REQUIRE(trace_ != nullptr, "belady::victim before reset(trace): belady needs the trace to see the future");
    return detail::max_by(candidates, [&](std::uint32_t c) { return trace_->next_use_distance(c, moment); });
  }

 private:
  chunk::access_trace const* trace_ = nullptr;
};

// Least recently used. A fetch counts as a use: a chunk prefetched for a coming moment is not
// the stalest one on the device (it would be evicted before it is used otherwise).
struct lru {
  static constexpr std::string_view name = "lru";
  void reset(chunk::access_trace const& tr) { last_.fit(tr.chunks()); }  // keeps the history
  void on_fetch(std::uint32_t c, std::uint64_t tick) { last_.set(c, tick); }
  void on_use(std::uint32_t c, std::uint64_t tick) { last_.set(c, tick); }
  [[nodiscard]] std::uint32_t victim(std::span<std::uint32_t const> candidates, std::size_t) const {
    // Oldest first = the largest (max - tick).
    return detail::max_by(candidates, [&](std::uint32_t c) { return ~last_.get(c); });
  }

 private:
  detail::tick_table last_;
};

// First in, first out: the earliest on_fetch; uses do not matter.
struct fifo {
  static constexpr std::string_view name = "fifo";
  void reset(chunk::access_trace const& tr) { fetched_.fit(tr.chunks()); }  // keeps the history
  void on_fetch(std::uint32_t c, std::uint64_t tick) { fetched_.set(c, tick); }
  void on_use(std::uint32_t, std::uint64_t) noexcept {}
  [[nodiscard]] std::uint32_t victim(std::span<std::uint32_t const> candidates, std::size_t) const {
    return detail::max_by(candidates, [&](std::uint32_t c) { return ~fetched_.get(c); });
  }

 private:
  detail::tick_table fetched_;
};

static_assert(check_eviction_policy<belady>() && check_eviction_policy<lru>() && check_eviction_policy<fifo>());

}  // namespace tide::offload
