#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <tide/chunk/access_trace.hpp>
#include <tide/offload/policy.hpp>
#include <tide/offload/simulate.hpp>

#include "support/kernel_checks.hpp"

using tide::chunk::access_trace;
using tide::offload::belady;
using tide::offload::fifo;
using tide::offload::lru;
using tide::offload::sim_result;
using tide::offload::simulate;
using ids = std::vector<std::uint32_t>;

namespace {

// Checks every victim() call: no candidate is touched in the moment asked about, and each is
// resident. Evicts the first candidate. Copies share the log (simulate takes the policy by value).
struct spy {
  static constexpr std::string_view name = "spy";
  struct log {
    std::size_t calls = 0, touched_candidates = 0;
  };
  access_trace const* trace = nullptr;
  log* seen = nullptr;
  void reset(access_trace const& tr) { trace = &tr; }
  void on_fetch(std::uint32_t, std::uint64_t) {}
  void on_use(std::uint32_t, std::uint64_t) {}
  std::uint32_t victim(std::span<std::uint32_t const> candidates, std::size_t t) {
    ++seen->calls;
    auto const touched = trace->touched(t);
    for (std::uint32_t c : candidates)
      seen->touched_candidates += std::find(touched.begin(), touched.end(), c) != touched.end();
    return candidates.front();
  }
};

// Returns a chunk that is never a candidate.
struct liar {
  static constexpr std::string_view name = "liar";
  void reset(access_trace const&) {}
  void on_fetch(std::uint32_t, std::uint64_t) {}
  void on_use(std::uint32_t, std::uint64_t) {}
  std::uint32_t victim(std::span<std::uint32_t const>, std::size_t t) { return static_cast<std::uint32_t>(t); }
};

// The hand-worked trace (4 chunks, capacity 2). Every eviction has one candidate, so all
// policies agree. Step 1 (all chunks start on the host):
//   m0  0 1          h2d 0, h2d 1                                 device {0 1}
//   m1  2 h: 0       0 to the host (d2h), h2d 2                   {1 2}
//   m2  3 1 r: 3     full: evict 2 (1 is touched), h2d 3; drop 3  {1}
//   m3  3 0          3 was released: allocate; full: evict 1, h2d 0   {3 0}
// = h2d 5, d2h 3, evictions 2, allocations 1. Step 2:
//   m0  evict 3 (0 is touched), h2d 1   m1  d2h 0, h2d 2
//   m2  evict 2, h2d 3 (on the host since m0), drop 3   m3  allocate 3, evict 1, h2d 0
// = h2d 4, d2h 4, evictions 3, allocations 1.
access_trace hand_worked() {
  return access_trace::parse("chunks: 4\n0 1\n2 h: 0\n3 1 r: 3\n3 0\n");
}

}  // namespace

TEST_CASE("accounting on a hand-worked trace with on-host and released moments") {
  access_trace const tr = hand_worked();
  sim_result const one{.h2d = 5, .d2h = 3, .evictions = 2, .allocations = 1, .moments = 4};
  sim_result const two{.h2d = 9, .d2h = 7, .evictions = 5, .allocations = 2, .moments = 8};
  CHECK(simulate(tr, 2, belady{}, 1) == one);
  CHECK(simulate(tr, 2, belady{}) == two);  // 2 iterations by default
  CHECK(simulate(tr, 2, lru{}) == two);
  CHECK(simulate(tr, 2, fifo{}) == two);
  CHECK(simulate(tr, 2, belady{}).moves() == 9 + 7);  // every copy, both directions: h2d + d2h
  // Room for everything: only the first touches, the on-host move and its return, allocations.
  //   step 1: h2d 0 1 2 3, d2h 0 (m1), h2d 0 (m3), allocate 3 (m3); step 2: d2h 0, h2d 0, allocate 3.
  sim_result const roomy{.h2d = 6, .d2h = 2, .evictions = 0, .allocations = 2, .moments = 8};
  CHECK(simulate(tr, 4, belady{}) == roomy);
  CHECK(simulate(tr, 2, belady{}, 0) == sim_result{});
}

TEST_CASE("released and on-host chunks that are not on the device move nothing") {
  access_trace tr(3);
  tr.add_moment(ids{}, ids{0}, ids{1});  // 0 already on the host; 1 dropped from the host
  tr.add_moment(ids{0, 1});              // 0 copied in, 1 allocated
  auto const r = simulate(tr, 2, belady{}, 1);
  CHECK(r == sim_result{.h2d = 1, .d2h = 0, .evictions = 0, .allocations = 1, .moments = 2});
}

TEST_CASE("a capacity below the working set is a budget error naming both numbers") {
  access_trace tr(5);
  tr.add_moment(ids{0, 1, 2});
  tr.add_moment(ids{3});
  try {
    (void)simulate(tr, 2, belady{});
    FAIL("expected a tide::error(budget)");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
    std::string const msg = e.message();
    CHECK(msg.find("device of 2 chunks") != std::string::npos);
    CHECK(msg.find("working set of 3 chunks") != std::string::npos);
  }
  CHECK(simulate(tr, 3, belady{}).evictions > 0);
}

TEST_CASE("a chunk touched in the current moment is never a victim") {
  std::mt19937 rng(5);
  spy::log seen;
  for (int trial = 0; trial < 200; ++trial) {
    std::uint32_t const chunks = std::uniform_int_distribution<std::uint32_t>(3, 9)(rng);
    std::uniform_int_distribution<std::uint32_t> id(0, chunks - 1), width(1, 4);
    access_trace tr(chunks);
    for (int t = 0; t < 10; ++t) {
      ids touched, on_host, released;
      for (std::uint32_t k = width(rng); k > 0; --k) touched.push_back(id(rng));  // duplicates too
      if (t % 3 == 1) on_host.push_back(id(rng));
      if (t % 4 == 2) released.push_back(id(rng));
      tr.add_moment(touched, on_host, released);
    }
    // The spy evicts the first candidate: as bad as a policy gets, and it must still be safe.
    (void)simulate(tr, tr.working_set(), spy{.seen = &seen}, 3);
  }
  CHECK(seen.calls > 100);
  CHECK(seen.touched_candidates == 0);
}

TEST_CASE("a policy answering outside the candidates is a usage error") {
  access_trace tr(3);
  tr.add_moment(ids{0});
  tr.add_moment(ids{1});
  tr.add_moment(ids{2});
  // At moment 1 the only candidate is chunk 0; liar answers 1.
  std::string const msg = tide::test::usage_error([&] { (void)simulate(tr, 1, liar{}); });
  CHECK(msg.find("liar chose chunk 1 at moment 1") != std::string::npos);
}
