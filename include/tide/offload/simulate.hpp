#pragma once
// simulate: replays an access trace against a device that holds `capacity` chunks, with an
// eviction policy, and counts the moves. No memory, no copies: the policy's answers only. The
// offline yardstick for a scheduler ("evictions = MIN count on the trace") and what
// tide-offload-sim (bench/offload_sim) prints.
//
//   auto tr = tide::chunk::access_trace::parse(text);
//   tide::offload::sim_result r = tide::offload::simulate(tr, 8, tide::offload::belady{});  // 2 steps
//   r.evictions;  r.moves();   // chunk copies; bytes = moves() * chunk bytes
//
// Every chunk starts on the host holding data. Per moment t, in this order:
//   1. on_host(t): those on the device go to the host (d2h);
//   2. touched(t): each one not on the device comes in: while the device is full, the policy
//      picks a victim among the resident chunks NOT touched in t (d2h, evictions++); then h2d,
//      or an allocation (no copy) if the chunk was released;
//   3. released(t): dropped wherever they are (no copy).
// Eviction only on demand: keeping a chunk never costs more than dropping it early.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tide/chunk/access_trace.hpp"
#include "tide/core/error.hpp"
#include "tide/offload/policy.hpp"

namespace tide::offload {

struct sim_result {
  std::size_t h2d = 0;          // chunk copies host -> device
  std::size_t d2h = 0;          // chunk copies device -> host (evictions and on-host moves)
  std::size_t evictions = 0;    // d2h copies made to free a slot
  std::size_t allocations = 0;  // released chunks created on the device, zeroed, no copy
  std::size_t moments = 0;      // simulated: iterations * trace moments
  [[nodiscard]] std::size_t moves() const noexcept { return h2d + d2h; }
  friend bool operator==(sim_result const&, sim_result const&) = default;
};

template <EvictionPolicy P>
sim_result simulate(chunk::access_trace const& trace, std::size_t capacity_chunks, P policy = {},
                    std::size_t iterations = 2) {
  TIDE_CHECK(capacity_chunks >= trace.working_set(), budget, "simulate: a device of ", capacity_chunks,
             " chunks is below the trace's working set of ", trace.working_set(),
             " chunks (the most one moment touches); pass a capacity of at least ", trace.working_set());
  enum class where : std::uint8_t { host, device, released };
  std::vector<where> at(trace.chunks(), where::host);
  std::vector<std::uint32_t> resident, candidates;  // device chunks, in fetch order
  std::vector<std::uint64_t> touched_at(trace.chunks(), 0);  // tick + 1 of the last moment touching it
  resident.reserve(capacity_chunks);
  sim_result r;
  policy.reset(trace);

  auto leave_device = [&](std::uint32_t c, where to) {
    std::erase(resident, c);
    at[c] = to;
  };
  std::uint64_t tick = 0;
  for (std::size_t it = 0; it < iterations; ++it) {
    for (std::size_t t = 0; t < trace.moments(); ++t, ++tick) {
      for (std::uint32_t c : trace.on_host(t)) {
        if (at[c] != where::device) continue;
        leave_device(c, where::host);
        ++r.d2h;
      }
      for (std::uint32_t c : trace.touched(t)) touched_at[c] = tick + 1;
      for (std::uint32_t c : trace.touched(t)) {
        if (at[c] != where::device) {
          while (resident.size() >= capacity_chunks) {
            // Never empty: fewer than working_set() <= capacity chunks of t are resident yet.
            candidates.clear();
            for (std::uint32_t d : resident)
              if (touched_at[d] != tick + 1) candidates.push_back(d);
            TIDE_CHECK(!candidates.empty(), internal, "simulate: no victim at moment ", t);
            std::uint32_t const v = policy.victim(std::span<std::uint32_t const>(candidates), t);
            TIDE_CHECK(std::ranges::find(candidates, v) != candidates.end(), usage, "simulate: policy ", P::name,
                       " chose chunk ", v, " at moment ", t, ", which is not one of the ", candidates.size(),
                       " candidates (resident and not touched in this moment)");
            leave_device(v, where::host);
            ++r.d2h;
            ++r.evictions;
          }
          ++(at[c] == where::released ? r.allocations : r.h2d);
          at[c] = where::device;
          resident.push_back(c);
          policy.on_fetch(c, tick);
        }
        policy.on_use(c, tick);
      }
      for (std::uint32_t c : trace.released(t)) {
        if (at[c] == where::device) leave_device(c, where::released);
        at[c] = where::released;
      }
    }
  }
  r.moments = iterations * trace.moments();
  return r;
}

}  // namespace tide::offload
