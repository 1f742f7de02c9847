// offline_optimum against an exhaustive search over cache states with dirty bits, written from
// the cost model's rules alone (none of the flow's intervals or epochs), on small random traces.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <tide/chunk/access_trace.hpp>
#include <tide/offload/detail/offline_flow.hpp>
#include <tide/offload/offline_optimum.hpp>

using tide::chunk::access_trace;
using tide::offload::offline_bound;
using tide::offload::offline_optimum;
using ids = std::vector<std::uint32_t>;

namespace {

bool in(std::span<std::uint32_t const> row, std::uint32_t c) { return std::ranges::find(row, c) != row.end(); }

// The least chunk copies (loads + write-backs) over `copies` copies of the trace, by trying every
// set of departures before every moment: a state is each chunk's place (empty, host, device clean,
// device dirty), 2 bits a chunk. The rules of offline_optimum.hpp's top comment, read literally.
std::int64_t brute_force(access_trace const& tr, std::vector<std::size_t> const& capacity, std::size_t copies) {
  enum : std::uint32_t { empty = 0, host = 1, clean = 2, dirty = 3 };
  std::size_t const C = tr.chunks(), T = tr.moments(), N = copies * T;
  REQUIRE(C <= 8);
  auto get = [](std::uint32_t s, std::size_t c) { return (s >> (2 * c)) & 3u; };
  auto set = [](std::uint32_t s, std::size_t c, std::uint32_t v) {
    return (s & ~(3u << (2 * c))) | (v << (2 * c));
  };
  // The start: empty if the last event of one step releases a chunk, else on the device, clean
  // (leaving is free then, so "maybe on the device" is this state with a free departure).
  std::uint32_t start = 0;
  for (std::size_t c = 0; c < C; ++c) {
    std::uint32_t v = clean;
    for (std::size_t t = 0; t < T; ++t) {
      auto const id = static_cast<std::uint32_t>(c);
      if (in(tr.on_host(t), id)) v = clean;
      if (in(tr.touched(t), id)) v = clean;
      if (in(tr.released(t), id)) v = empty;
    }
    start = set(start, c, v);
  }
  // dead[u][c]: from moment u on, c's first event is a release, or it has none (its bytes are dead).
  std::vector<std::vector<bool>> dead(N + 1, std::vector<bool>(C, true));
  for (std::size_t u = N; u-- > 0;)
    for (std::size_t c = 0; c < C; ++c) {
      std::size_t const t = u % T;
      auto const id = static_cast<std::uint32_t>(c);
      if (in(tr.on_host(t), id) || in(tr.touched(t), id)) dead[u][c] = false;
      else if (in(tr.released(t), id)) dead[u][c] = true;
      else dead[u][c] = dead[u + 1][c];
    }
  constexpr std::int64_t inf = std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> cost(std::size_t{1} << (2 * C), inf), next(cost.size());
  cost[start] = 0;
  for (std::size_t u = 0; u < N; ++u) {
    std::size_t const t = u % T;
    std::fill(next.begin(), next.end(), inf);
    for (std::uint32_t s = 0; s < cost.size(); ++s) {
      if (cost[s] == inf) continue;
      std::vector<std::size_t> may_leave;  // on the device and not touched now
      for (std::size_t c = 0; c < C; ++c)
        if (get(s, c) >= clean && !in(tr.touched(t), static_cast<std::uint32_t>(c))) may_leave.push_back(c);
      for (std::uint32_t pick = 0; pick < (1u << may_leave.size()); ++pick) {
        std::uint32_t x = s;
        std::int64_t k = cost[s];
        for (std::size_t j = 0; j < may_leave.size(); ++j) {
          if ((pick >> j & 1u) == 0) continue;
          std::size_t const c = may_leave[j];
          if (get(x, c) == dirty && !dead[u][c]) ++k;
          x = set(x, c, host);
        }
        for (std::uint32_t c : tr.on_host(t)) {
          if (get(x, c) == dirty) ++k;
          x = set(x, c, host);
        }
        for (std::uint32_t c : tr.touched(t)) {
          if (get(x, c) == host) {
            ++k;
            x = set(x, c, clean);
          } else if (get(x, c) == empty) {
            x = set(x, c, dirty);
          }
        }
        std::size_t on_device = 0;
        for (std::size_t c = 0; c < C; ++c) on_device += get(x, c) >= clean ? 1u : 0u;
        if (on_device > capacity[t]) continue;
        for (std::uint32_t c : tr.written(t)) x = set(x, c, dirty);
        for (std::uint32_t c : tr.released(t)) x = set(x, c, empty);
        next[x] = std::min(next[x], k);
      }
    }
    std::swap(cost, next);
  }
  return *std::ranges::min_element(cost);
}

std::vector<std::size_t> same(access_trace const& tr, std::size_t k) {
  return std::vector<std::size_t>(tr.moments(), k);
}

// A random trace of <= 6 chunk ids and <= 12 moments: writes, on-host moments, releases. With
// all_written every touch writes (each dirty epoch is then one interval: the bounds are exact).
access_trace random_trace(std::mt19937& rng, bool all_written) {
  std::uniform_int_distribution<std::uint32_t> n_chunks(2, 6), n_moments(2, 12), width(0, 3), pct(0, 99);
  std::uint32_t const chunks = n_chunks(rng);
  std::uniform_int_distribution<std::uint32_t> id(0, chunks - 1);
  access_trace tr(chunks);
  for (std::uint32_t t = 0, m = n_moments(rng); t < m; ++t) {
    ids touched, on_host, released, written;
    for (std::uint32_t k = std::max(1u, width(rng)); k > 0 && touched.size() < 2; --k) {
      std::uint32_t const c = id(rng);
      if (!in(touched, c)) touched.push_back(c);
    }
    for (std::uint32_t c : touched)
      if (all_written || pct(rng) < 35) written.push_back(c);
    if (pct(rng) < 20) on_host.push_back(id(rng));
    if (pct(rng) < 15) released.push_back(id(rng));
    tr.add_moment(touched, on_host, released, written);
  }
  return tr;
}

constexpr std::int64_t S = offline_bound::scale;

}  // namespace

TEST_CASE("brute force and offline_optimum: hand-computed costs") {
  // K = 1: 0 is written at 0, 1 is touched at 1, 0 again at 2. Best: 0 starts on the device (free),
  // leaves dirty before 1 (W), 1 loads (R), 0 loads again (R): 3 copies. Starting with 1 instead
  // costs 4 (load 0, write 0 back, load 1, load 0).
  access_trace a(2);
  a.add_moment(ids{0}, {}, {}, ids{0});
  a.add_moment(ids{1});
  a.add_moment(ids{0});
  CHECK(brute_force(a, same(a, 1), 1) == 3);
  // With room for both, nothing moves: both start on the device.
  CHECK(brute_force(a, same(a, 2), 1) == 0);
  // 0 released at 1: its bytes are dead after 0, it leaves for free and is allocated again at 2:
  // only 1's load.
  access_trace r(2);
  r.add_moment(ids{0}, {}, {}, ids{0});
  r.add_moment(ids{1}, {}, ids{0});
  r.add_moment(ids{0});
  CHECK(brute_force(r, same(r, 1), 1) == 1);
  // 0 on the host at 1 (a host step): written back (W) whatever the room, and loaded at 2 (R);
  // with one slot 1 also loads.
  access_trace h(2);
  h.add_moment(ids{0}, {}, {}, ids{0});
  h.add_moment(ids{1}, ids{0});
  h.add_moment(ids{0});
  CHECK(brute_force(h, same(h, 1), 1) == 3);
  CHECK(brute_force(h, same(h, 2), 1) == 2);
  // Two copies of `a` at K = 1: copy 1 costs 3 as above and ends with 0 on the device, clean
  // (loaded at 2); copy 2 writes it (its moment 0), then pays W for 0, R for 1, R for 0: 3 + 3.
  CHECK(brute_force(a, same(a, 1), 2) == 6);
  // A host step every step (on host at 1): the first copy may start with 0 on the device (a
  // scheduler may have fetched it across the boundary), each later copy loads it once.
  access_trace o(1);
  o.add_moment(ids{0});
  o.add_moment({}, ids{0});
  CHECK(brute_force(o, same(o, 1), 1) == 0);
  CHECK(brute_force(o, same(o, 1), 3) == 2);
  for (auto const& [tr, k, copies, want] :
       std::vector<std::tuple<access_trace, std::size_t, std::size_t, std::int64_t>>{
           {a, 1, 1, 3}, {a, 2, 1, 0}, {r, 1, 1, 1}, {h, 1, 1, 3}, {h, 2, 1, 2}, {a, 1, 2, 6}, {o, 1, 3, 2}}) {
    offline_bound const b = offline_optimum(tr, k, 100, copies);
    CAPTURE(tr.to_text());
    CHECK(b.exact);
    CHECK(b.upper_total == want);
    CHECK(b.lower_total == want * S);
    CHECK(b.upper_bytes == doctest::Approx(double(want) * 100 / double(copies)));
  }
}

TEST_CASE("offline_optimum: an epoch of two intervals is where the bounds may part") {
  // K = 2, chunks 0, 1, 2. 0 is written at 0 and read at 2 and 4; 1 and 2 alternate between.
  // 0's epoch (0 .. the end) has two intervals: (0,2) and (2,4). The exact optimum: brute force.
  access_trace tr(3);
  tr.add_moment(ids{0}, {}, {}, ids{0});
  tr.add_moment(ids{1, 2});
  tr.add_moment(ids{0});
  tr.add_moment(ids{1, 2});
  tr.add_moment(ids{0});
  offline_bound const b = offline_optimum(tr, 2, 1, 2);
  std::int64_t const exact = brute_force(tr, same(tr, 2), 2);
  CHECK(b.split_epochs >= 1);
  CHECK(b.lower_total <= exact * S);
  CHECK(exact <= b.upper_total);
}

TEST_CASE("offline_optimum: lower <= brute force <= upper on random traces; equal when no epoch splits") {
  std::mt19937 rng(2020);
  int exact_cases = 0, split_cases = 0, parted = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    bool const all_written = trial % 4 == 0;
    access_trace const tr = random_trace(rng, all_written);
    std::size_t const copies = 2 + static_cast<std::size_t>(trial % 2);
    std::vector<std::size_t> cap(tr.moments());
    std::size_t const base = 2 + static_cast<std::size_t>(rng() % 2);  // 2 or 3
    for (std::size_t t = 0; t < tr.moments(); ++t)
      cap[t] = std::max(tr.touched(t).size(), trial % 3 == 0 ? base - rng() % 2 : base);  // per-moment room
    CAPTURE(tr.to_text());
    CAPTURE(copies);
    std::int64_t const best = brute_force(tr, cap, copies);
    offline_bound const b = offline_optimum(tr, cap, 1, copies);
    CHECK(b.lower_total <= best * S);
    CHECK(best <= b.upper_total);
    if (b.split_epochs == 0) {
      ++exact_cases;
      CHECK(b.exact);
      CHECK(b.lower_total == best * S);
      CHECK(b.upper_total == best);
    } else {
      ++split_cases;
      parted += b.exact ? 0 : 1;
    }
    if (all_written) CHECK(b.split_epochs == 0);
  }
  // Both kinds of trace were tried.
  CHECK(exact_cases > 100);
  CHECK(split_cases > 100);
  MESSAGE(exact_cases, " exact, ", split_cases, " with a split epoch (", parted, " of them with lower < upper)");
}

TEST_CASE("offline_optimum: a moment touching more than the device holds is a budget error") {
  access_trace tr(3);
  tr.add_moment(ids{0, 1, 2});
  CHECK_THROWS_AS((void)offline_optimum(tr, 2, 1), tide::error);
  std::size_t const caps[] = {3};
  CHECK(offline_optimum(tr, caps, 1).exact);
}

TEST_CASE("offline_flow: least cost, integral units") {
  // Three jobs on one machine over moments 0..4 (an edge per moment, capacity 1): (0,2) worth 3,
  // (1,4) worth 5, (2,4) worth 3. Best: (0,2) then (2,4), worth 6 > 5.
  tide::offload::detail::offline_flow g(5);
  for (std::size_t u = 0; u < 4; ++u) g.add_edge(u, u + 1, 1, 0);
  std::size_t const a = g.add_edge(0, 2, 1, -3), b = g.add_edge(1, 4, 1, -5), c = g.add_edge(2, 4, 1, -3);
  CHECK(g.run(0, 4, 1) == -6);
  CHECK(g.flow(a) == 1);
  CHECK(g.flow(b) == 0);
  CHECK(g.flow(c) == 1);
}
