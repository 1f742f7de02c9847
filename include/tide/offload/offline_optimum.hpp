#pragma once
// offline_optimum: bounds on the fewest bytes any offline schedule moves for an access trace,
// counting what a copy really costs: loading a chunk is a copy, dropping a chunk whose host copy
// is current is free, leaving the device with the only current copy is a write. Shares no code
// with the eviction policies or simulate(); the yardstick bench/offload's
// offload_bytes_vs_offline_optimum holds the scheduler's bytes against.
//
//   auto const b = tide::offload::offline_optimum(trace, capacity_chunks, chunk_bytes);  // 4 copies
//   b.lower_bytes;  b.upper_bytes;   // per step: lower <= the optimum <= upper
//   b.exact;                          // lower == upper: the optimum itself
//
// The cost model (chunks of equal size, R = W = chunk bytes). A chunk is empty (released: no
// payload anywhere), on the host, or on the device clean (the host copy is current) or dirty (the
// device copy is the only current one). Between moments any device chunk may leave: clean is
// free, dirty costs W, except when the chunk's next event is its release or it has none left (its
// bytes are dead). Per moment t, in simulate()'s order:
//   1. on_host(t): the chunk must be on the host; the host may write it (a host optimizer step),
//      so a device copy does not survive: dirty costs W, clean is free;
//   2. touched(t): on the device during t (at most capacity(t) chunks there then, counting any
//      other chunk still there, such as those released after t): from the host costs R; an empty
//      chunk is allocated zeroed, free, and is dirty (its only copy is on the device); written(t)
//      become dirty;
//   3. released(t): dropped wherever they are, free.
// The trace repeats: `copies` copies are laid end to end, and nothing is written back after the
// last one. The start is free: a chunk whose last event in the trace is a release starts empty,
// any other may start on the device, clean (a scheduler may have fetched it ahead across the
// step's boundary), so the bound holds for any `copies` consecutive steps of any scheduler that
// runs the trace, from whatever state. Per step: total / copies.
//
// Why bounds: a dirty chunk's W is paid once per dirty epoch (a write to the next write), at its
// first departure in it: after a write-back it is clean and later drops in the epoch are free.
// That cost is W * [some interval of the epoch is dropped], not linear in the per-interval keep
// decisions, and writeback-aware caching is NP-complete even with unit sizes and costs
// (Beckmann, Gibbons, Haeupler, McGuffey, "Writeback-Aware Caching", APOCS 2020). So:
//   lower  a min-cost flow with linear costs: the times between consecutive device touches of a
//          chunk (intervals) are edges over the moments they span; dropping one costs R plus a
//          share of its epoch's W, the shares of an epoch summing to at most W (so the linear cost
//          of any schedule is at most its true cost). Three ways to share (all on the first
//          interval, all on the last, equal parts): the largest of the three optima;
//   upper  the true cost of each flow's schedule (the intervals it keeps fit the device at every
//          moment): the least of the three.
// They coincide (exact) when no epoch that may end without a write-back spans two intervals or
// more; an epoch ending at an on-host moment pays W whatever is kept, so any length is linear.
//
// The flow: nodes v_0..v_N at moment boundaries (N = copies * moments), K = max capacity units
// from v_0 to v_N. Moment u is the edge v_u -> v_{u+1}: a part of capacity |touched(u)| + K -
// capacity(u) at cost -M (M > every saving together, so it is always full: the touched chunks and
// the missing capacity take those units) and a part of capacity(u) - |touched(u)| at cost 0. An
// interval of a chunk between touches a < b is an edge v_{a+1} -> v_b of capacity 1 at minus what
// keeping it saves (b = a + 1: kept, nothing to decide); a chunk that may start on the device has
// one from v_0 to its first touch. The units on interval edges at moment u are the chunks kept
// there: K - the moment's edge <= capacity(u) - |touched(u)|. Successive shortest paths
// (detail/offline_flow.hpp); costs are integers in 1/720720 of a chunk copy.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "tide/chunk/access_trace.hpp"
#include "tide/core/error.hpp"
#include "tide/offload/detail/offline_flow.hpp"

namespace tide::offload {

struct offline_bound {
  static constexpr std::int64_t scale = 720720;  // cost units per chunk copy (divisible by 1..16)
  std::size_t copies = 0;          // trace copies laid end to end
  std::int64_t lower_total = 0;    // the lower bound over all copies, in 1/scale chunk copies
  std::int64_t upper_total = 0;    // the upper bound over all copies, in chunk copies
  double lower_bytes = 0;          // per step
  double upper_bytes = 0;          // per step
  bool exact = false;              // lower == upper
  std::array<double, 3> lower_by_share{};  // per step, W on the first interval, on the last, equal parts
  std::size_t intervals = 0;       // intervals between device touches (edges of the flow)
  std::size_t kept = 0;            // of them, kept by the schedule of the upper bound
  std::size_t epochs = 0;          // dirty epochs with at least one interval
  std::size_t split_epochs = 0;    // of them, the nonlinear ones: two intervals or more, W not certain
  std::size_t fixed_loads = 0;     // loads every schedule makes (the first touch after an on-host moment)
  std::size_t fixed_writes = 0;    // write-backs every schedule makes (dirty at an on-host moment)
  [[nodiscard]] double gap() const noexcept { return lower_bytes > 0 ? upper_bytes / lower_bytes : 1.0; }
};

namespace detail {

// The trace laid out as intervals and epochs (see the top of offline_optimum.hpp).
struct offline_layout {
  struct interval {
    std::size_t from, to;            // nodes: occupies moments from..to-1
    std::size_t epoch;               // its dirty epoch, or none
    std::size_t position;            // its place in the epoch
  };
  struct epoch {
    std::size_t intervals = 0;
    bool fixed = false;              // ended at an on-host moment: W paid whatever is kept
  };
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  std::vector<interval> intervals;
  std::vector<epoch> epochs;
  std::vector<std::size_t> touched;  // distinct chunks touched, per unrolled moment
  std::size_t fixed_loads = 0, fixed_writes = 0;
};

inline offline_layout lay_out(chunk::access_trace const& tr, std::size_t copies) {
  enum class state : std::uint8_t { untouched, empty, host, device };
  std::size_t const T = tr.moments(), C = tr.chunks();
  // The start: empty if a chunk's last event in one step is its release, else maybe on the device.
  std::vector<state> at(C, state::untouched);
  for (std::size_t t = 0; t < T; ++t) {
    for (std::uint32_t c : tr.on_host(t)) at[c] = state::device;
    for (std::uint32_t c : tr.touched(t)) at[c] = state::device;
    for (std::uint32_t c : tr.released(t)) at[c] = state::empty;
  }
  offline_layout out;
  std::vector<std::size_t> from(C, 0), epoch(C, offline_layout::none), seen(C, std::size_t(-1)),
      writes(C, std::size_t(-1));
  auto open_epoch = [&](std::uint32_t c) {
    epoch[c] = out.epochs.size();
    out.epochs.emplace_back();
  };
  for (std::size_t u = 0; u < copies * T; ++u) {
    std::size_t const t = u % T;
    for (std::uint32_t c : tr.on_host(t)) {
      if (at[c] == state::device && epoch[c] != offline_layout::none) {
        out.epochs[epoch[c]].fixed = true;
        ++out.fixed_writes;
      }
      at[c] = state::host;
      epoch[c] = offline_layout::none;
    }
    for (std::uint32_t c : tr.written(t)) writes[c] = u;
    std::size_t distinct = 0;
    for (std::uint32_t c : tr.touched(t)) {
      if (seen[c] == u) continue;  // listed twice
      seen[c] = u;
      ++distinct;
      if (at[c] == state::device) {
        if (from[c] < u) {
          std::size_t const e = epoch[c];
          out.intervals.push_back({from[c], u, e, e == offline_layout::none ? 0 : out.epochs[e].intervals++});
        }
      } else if (at[c] == state::empty || at[c] == state::untouched) {
        open_epoch(c);  // allocated on the device: its only copy
      } else {
        ++out.fixed_loads;
      }
      if (writes[c] == u) open_epoch(c);
      at[c] = state::device;
      from[c] = u + 1;
    }
    out.touched.push_back(distinct);
    for (std::uint32_t c : tr.released(t)) {
      at[c] = state::empty;
      epoch[c] = offline_layout::none;
    }
  }
  return out;
}

}  // namespace detail

// Bounds for `trace` on a device of capacity[t] chunks at moment t (capacity.size() ==
// trace.moments()), chunks of chunk_bytes, over `copies` copies of the step.
inline offline_bound offline_optimum(chunk::access_trace const& trace, std::span<std::size_t const> capacity,
                                     std::size_t chunk_bytes, std::size_t copies = 4) {
  std::size_t const T = trace.moments();
  TIDE_REQUIRE(capacity.size() == T && copies >= 1, "offline_optimum: ", capacity.size(), " capacities for ", T,
               " moments and ", copies, " copies; pass one capacity per moment and copies >= 1");
  offline_bound b;
  b.copies = copies;
  if (T == 0) {
    b.exact = true;
    return b;
  }
  detail::offline_layout const lay = detail::lay_out(trace, copies);
  std::size_t const N = copies * T, most = *std::ranges::max_element(capacity);
  for (std::size_t u = 0; u < N; ++u)
    TIDE_CHECK(capacity[u % T] >= lay.touched[u], budget, "offline_optimum: moment ", u % T, " touches ",
               lay.touched[u], " chunks but the device holds ", capacity[u % T]);
  using i64 = std::int64_t;
  constexpr i64 S = offline_bound::scale;
  i64 const fixed = static_cast<i64>(lay.fixed_loads + lay.fixed_writes);
  b.fixed_loads = lay.fixed_loads;
  b.fixed_writes = lay.fixed_writes;
  b.intervals = lay.intervals.size();
  for (auto const& e : lay.epochs) {
    b.epochs += e.intervals > 0 ? 1 : 0;
    b.split_epochs += !e.fixed && e.intervals > 1 ? 1 : 0;
  }
  b.lower_total = std::numeric_limits<i64>::min();
  b.upper_total = std::numeric_limits<i64>::max();
  std::vector<i64> saving(lay.intervals.size());
  std::vector<std::size_t> edge(lay.intervals.size());
  std::vector<bool> dropped_in(lay.epochs.size());
  for (std::size_t share = 0; share < 3; ++share) {
    i64 all = 0;
    for (std::size_t i = 0; i < lay.intervals.size(); ++i) {
      auto const& v = lay.intervals[i];
      i64 w = 0;
      if (v.epoch != detail::offline_layout::none && !lay.epochs[v.epoch].fixed) {
        std::size_t const k = lay.epochs[v.epoch].intervals;
        w = share == 0 ? (v.position == 0 ? S : 0) : share == 1 ? (v.position + 1 == k ? S : 0) : S / i64(k);
      }
      saving[i] = S + w;
      all += saving[i];
    }
    i64 const M = all + 1;
    TIDE_CHECK(M < std::numeric_limits<i64>::max() / 4 / i64(N + 2), budget, "offline_optimum: ", N, " moments and ",
               lay.intervals.size(), " intervals overflow the flow's 64-bit costs");
    detail::offline_flow g(N + 1);
    std::vector<std::size_t> full(N);
    for (std::size_t u = 0; u < N; ++u) {
      std::size_t const cap = capacity[u % T], need = lay.touched[u] + most - cap;
      full[u] = g.add_edge(u, u + 1, i64(need), -M);
      g.add_edge(u, u + 1, i64(cap - lay.touched[u]), 0);
    }
    for (std::size_t i = 0; i < lay.intervals.size(); ++i)
      edge[i] = g.add_edge(lay.intervals[i].from, lay.intervals[i].to, 1, -saving[i]);
    i64 const cost = g.run(0, N, i64(most));
    i64 forced = 0;
    for (std::size_t u = 0; u < N; ++u) {
      i64 const need = i64(lay.touched[u] + most - capacity[u % T]);
      TIDE_CHECK(g.flow(full[u]) == need, internal, "offline_optimum: the flow left moment ", u, "'s ", need,
                 " forced units unfilled");
      forced += need;
    }
    i64 const kept_saving = -cost - M * forced;
    i64 const lower = fixed * S + all - kept_saving;
    // The same schedule at its true cost: R per dropped interval, W per epoch with a drop.
    dropped_in.assign(lay.epochs.size(), false);
    i64 upper = fixed;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < lay.intervals.size(); ++i) {
      if (g.flow(edge[i]) == 1) {
        ++kept;
        continue;
      }
      ++upper;
      std::size_t const e = lay.intervals[i].epoch;
      if (e != detail::offline_layout::none && !lay.epochs[e].fixed && !dropped_in[e]) {
        dropped_in[e] = true;
        ++upper;
      }
    }
    b.lower_by_share[share] = double(lower) / double(S) * double(chunk_bytes) / double(copies);
    b.lower_total = std::max(b.lower_total, lower);
    if (upper < b.upper_total) {
      b.upper_total = upper;
      b.kept = kept;
    }
  }
  TIDE_CHECK(b.lower_total <= b.upper_total * S, internal, "offline_optimum: lower bound ", b.lower_total,
             " / ", S, " above the upper bound ", b.upper_total);
  b.lower_bytes = double(b.lower_total) / double(S) * double(chunk_bytes) / double(copies);
  b.upper_bytes = double(b.upper_total) * double(chunk_bytes) / double(copies);
  b.exact = b.lower_total == b.upper_total * S;
  return b;
}

// The same with one capacity at every moment.
inline offline_bound offline_optimum(chunk::access_trace const& trace, std::size_t capacity, std::size_t chunk_bytes,
                                     std::size_t copies = 4) {
  std::vector<std::size_t> const each(trace.moments(), capacity);
  return offline_optimum(trace, each, chunk_bytes, copies);
}

}  // namespace tide::offload
