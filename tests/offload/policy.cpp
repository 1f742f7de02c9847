#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include <tide/chunk/access_trace.hpp>
#include <tide/offload/policy.hpp>
#include <tide/offload/simulate.hpp>

#include "support/kernel_checks.hpp"

using tide::chunk::access_trace;
using tide::offload::belady;
using tide::offload::EvictionPolicy;
using tide::offload::fifo;
using tide::offload::lru;
using tide::offload::simulate;
using ids = std::vector<std::uint32_t>;

namespace {

// One member missing (or wrong) each: none is an EvictionPolicy.
struct no_reset {
  static constexpr std::string_view name = "x";
  void on_fetch(std::uint32_t, std::uint64_t);
  void on_use(std::uint32_t, std::uint64_t);
  std::uint32_t victim(std::span<std::uint32_t const>, std::size_t);
};
struct no_on_fetch {
  static constexpr std::string_view name = "x";
  void reset(access_trace const&);
  void on_use(std::uint32_t, std::uint64_t);
  std::uint32_t victim(std::span<std::uint32_t const>, std::size_t);
};
struct no_on_use {
  static constexpr std::string_view name = "x";
  void reset(access_trace const&);
  void on_fetch(std::uint32_t, std::uint64_t);
  std::uint32_t victim(std::span<std::uint32_t const>, std::size_t);
};
struct no_victim {
  static constexpr std::string_view name = "x";
  void reset(access_trace const&);
  void on_fetch(std::uint32_t, std::uint64_t);
  void on_use(std::uint32_t, std::uint64_t);
};
struct victim_returns_int {
  static constexpr std::string_view name = "x";
  void reset(access_trace const&);
  void on_fetch(std::uint32_t, std::uint64_t);
  void on_use(std::uint32_t, std::uint64_t);
  int victim(std::span<std::uint32_t const>, std::size_t);
};
struct no_name {
  void reset(access_trace const&);
  void on_fetch(std::uint32_t, std::uint64_t);
  void on_use(std::uint32_t, std::uint64_t);
  std::uint32_t victim(std::span<std::uint32_t const>, std::size_t);
};
struct complete {
  static constexpr std::string_view name = "complete";
  void reset(access_trace const&);
  void on_fetch(std::uint32_t, std::uint64_t);
  void on_use(std::uint32_t, std::uint64_t);
  std::uint32_t victim(std::span<std::uint32_t const>, std::size_t);
};
static_assert(!EvictionPolicy<no_reset>);
static_assert(!EvictionPolicy<no_on_fetch>);
static_assert(!EvictionPolicy<no_on_use>);
static_assert(!EvictionPolicy<no_victim>);
static_assert(!EvictionPolicy<victim_returns_int>);
static_assert(!EvictionPolicy<no_name>);
static_assert(EvictionPolicy<complete> && tide::offload::check_eviction_policy<complete>());
static_assert(EvictionPolicy<belady> && EvictionPolicy<lru> && EvictionPolicy<fifo>);

// The fewest evictions any schedule achieves on `iterations` passes over the trace: a DP over
// resident sets (bit masks). At each moment the new set must hold the touched chunks, fit the
// capacity and gain only touched chunks; every chunk leaving costs one eviction. Dropping chunks
// voluntarily is allowed, so this bounds every schedule, not only demand-fetching ones.
std::size_t min_evictions(access_trace const& tr, std::size_t capacity, std::size_t iterations) {
  constexpr std::size_t inf = std::numeric_limits<std::size_t>::max();
  std::size_t const sets = std::size_t{1} << tr.chunks();
  std::vector<std::size_t> cost(sets, inf), next(sets);
  cost[0] = 0;  // the device starts empty
  for (std::size_t it = 0; it < iterations; ++it) {
    for (std::size_t t = 0; t < tr.moments(); ++t) {
      std::uint32_t touched = 0;
      for (std::uint32_t c : tr.touched(t)) touched |= 1u << c;
      std::fill(next.begin(), next.end(), inf);
      for (std::uint32_t s = 0; s < sets; ++s) {
        if (cost[s] == inf) continue;
        std::uint32_t const others = s & ~touched;  // kept or evicted
        for (std::uint32_t keep = others;; keep = (keep - 1) & others) {  // every subset of `others`
          std::uint32_t const n = touched | keep;
          if (static_cast<std::size_t>(std::popcount(n)) <= capacity)
            next[n] = std::min(next[n], cost[s] + static_cast<std::size_t>(std::popcount(others & ~keep)));
          if (keep == 0) break;
        }
      }
      cost.swap(next);
    }
  }
  return *std::min_element(cost.begin(), cost.end());
}

}  // namespace

TEST_CASE("belady's evictions equal the exhaustive optimum; lru and fifo never beat it") {
  std::mt19937 rng(2024);
  int traces = 0, strictly_worse = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::uint32_t const chunks = std::uniform_int_distribution<std::uint32_t>(4, 7)(rng);
    std::size_t const moments = std::uniform_int_distribution<std::size_t>(5, 9)(rng);
    access_trace tr(chunks);
    for (std::size_t t = 0; t < moments; ++t) {
      ids all(chunks);
      for (std::uint32_t c = 0; c < chunks; ++c) all[c] = c;
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(std::uniform_int_distribution<std::size_t>(1, 3)(rng));  // 1-3 distinct chunks
      tr.add_moment(all);
    }
    for (std::size_t cap = tr.working_set(); cap < chunks; ++cap) {
      std::size_t const best = min_evictions(tr, cap, 2);
      auto const b = simulate(tr, cap, belady{}, 2);
      auto const l = simulate(tr, cap, lru{}, 2);
      auto const f = simulate(tr, cap, fifo{}, 2);
      INFO("trace:\n", tr.to_text(), "capacity ", cap);
      REQUIRE(b.evictions == best);
      CHECK(l.evictions >= best);
      CHECK(f.evictions >= best);
      // Touches only: every eviction is the d2h, every fetch an h2d.
      CHECK(b.d2h == b.evictions);
      CHECK(b.allocations == 0);
      strictly_worse += l.evictions > best || f.evictions > best;
      ++traces;
    }
  }
  CHECK(traces > 300);
  CHECK(strictly_worse > 0);  // so the check would catch belady degenerating into lru or fifo
}

TEST_CASE("the textbook reference string: MIN 9 faults, LRU 12, FIFO 15 with 3 frames") {
  // Silberschatz, Operating System Concepts, the page-replacement chapter.
  access_trace tr(8);
  for (std::uint32_t page : {7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1}) tr.add_moment(ids{page});
  auto const b = simulate(tr, 3, belady{}, 1);
  auto const l = simulate(tr, 3, lru{}, 1);
  auto const f = simulate(tr, 3, fifo{}, 1);
  CHECK(b.h2d == 9);
  CHECK(l.h2d == 12);
  CHECK(f.h2d == 15);
  CHECK(b.evictions == 6);  // faults beyond the 3 cold ones
  CHECK(l.evictions == 9);
  CHECK(f.evictions == 12);
  CHECK(min_evictions(tr, 3, 1) == 6);
}

TEST_CASE("victim choices and ties") {
  access_trace tr(6);
  tr.add_moment(ids{0});     // 0
  tr.add_moment(ids{1, 2});  // 1
  tr.add_moment(ids{3});     // 2
  tr.add_moment(ids{2, 4});  // 3; chunk 5 never touched
  std::uint32_t const c[] = {4, 3, 2, 1, 0};
  belady b;
  CHECK(tide::test::usage_error([&] { (void)b.victim(c, 0); }).find("reset") != std::string::npos);
  b.reset(tr);
  // At moment 0 the next uses are: 1 -> 1, 2 -> 1, 3 -> 2, 4 -> 3, 0 -> 4 (the next step).
  CHECK(b.victim(c, 0) == 0);
  CHECK(b.victim(std::span(c, 4), 0) == 4);
  std::uint32_t const tie[] = {2, 1};  // both next used at moment 1
  CHECK(b.victim(tie, 0) == 1);
  std::uint32_t const with_unused[] = {0, 5, 4};
  CHECK(b.victim(with_unused, 2) == 5);  // never used again: first to go

  lru l;
  l.reset(tr);
  l.on_use(3, 10);
  l.on_use(1, 11);
  l.on_fetch(2, 12);  // a fetch counts as a use: a prefetched chunk is not the stalest
  std::uint32_t const c3[] = {1, 2, 3};
  CHECK(l.victim(c3, 0) == 3);
  l.on_use(3, 13);
  CHECK(l.victim(c3, 0) == 1);
  std::uint32_t const unseen[] = {3, 5, 4};
  CHECK(l.victim(unseen, 0) == 4);  // no history: oldest, ties to the lowest id
  l.on_use(9, 14);                  // ids past the trace's chunks are tolerated
  std::uint32_t const c9[] = {9, 3};
  CHECK(l.victim(c9, 0) == 3);

  fifo f;
  f.reset(tr);
  f.on_fetch(1, 1);
  f.on_fetch(2, 2);
  f.on_use(1, 3);  // uses do not matter to fifo
  std::uint32_t const c12[] = {2, 1};
  CHECK(f.victim(c12, 0) == 1);
  f.on_fetch(1, 5);
  CHECK(f.victim(c12, 0) == 2);
}

// A scheduler's warm-up step runs with the policy's hooks called, then hands the recorded trace
// to reset(). The chunks still on the device arrived, and were used, in the order the warm-up
// saw: the first victims after the reset follow that order, not the lowest id.
TEST_CASE("lru and fifo keep the warm-up's history across reset(trace)") {
  access_trace tr(5);
  tr.add_moment(ids{4});
  tr.add_moment(ids{3});
  tr.add_moment(ids{0, 1});
  std::uint32_t const resident[] = {0, 1, 3, 4};

  lru l;  // warm-up, never reset before: fetched 4, 3, 1, 0; then 4 is used again
  l.on_fetch(4, 0);
  l.on_use(4, 0);
  l.on_fetch(3, 1);
  l.on_use(3, 1);
  l.on_fetch(1, 2);
  l.on_use(1, 2);
  l.on_fetch(0, 3);
  l.on_use(0, 3);
  l.on_use(4, 4);
  l.reset(tr);  // the end of the warm-up
  CHECK(l.victim(resident, 0) == 3);  // least recently used (tick 1); a wiped history says 0
  l.on_use(3, 5);
  CHECK(l.victim(resident, 0) == 1);  // now the oldest use is 1's (tick 2)
  l.reset(tr);                        // a trace recorded again (say after a divergence): still kept
  CHECK(l.victim(resident, 0) == 1);

  fifo f;
  f.on_fetch(4, 0);
  f.on_fetch(3, 1);
  f.on_fetch(1, 2);
  f.on_fetch(0, 3);
  f.on_use(4, 4);  // uses do not matter to fifo
  f.reset(tr);
  CHECK(f.victim(resident, 0) == 4);  // first in; a wiped history says 0
  std::uint32_t const without_4[] = {0, 1, 3};
  CHECK(f.victim(without_4, 0) == 3);

  // reset still makes room for every id of the trace: an id never seen is the oldest.
  access_trace wider(8);
  f.reset(wider);
  std::uint32_t const with_unseen[] = {4, 7};
  CHECK(f.victim(with_unseen, 0) == 7);
}
