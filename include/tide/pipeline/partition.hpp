#pragma once
// Cutting a model's layers into pipeline stages: contiguous layers per stage, the slowest stage
// as fast as it can be, every stage within a memory limit. A dynamic program over (layers, stages)
// in O(L² p) stage evaluations; a stage that does not fit keeps fewer activations by recomputing
// or swapping some layers, as vPipe chooses per layer.
//
//   std::vector<tide::pipeline::layer_cost> layers = ...;        // per layer: times and bytes
//   auto plan = tide::pipeline::partition_layers(layers, {.stages = 4, .micro = 8,
//                                                         .memory_limit = 2_GiB});
//   plan.stages[s].first, .last;     // layers [first, last] on stage s
//   plan.stages[s].actions[i];       // keep, recompute or swap, for layer first + i
//   plan.slowest;                    // the slowest stage's time per micro-batch
//
// A stage's memory: its layers' state (parameters, gradients, optimizer state; the share that
// offload moves away is not counted) plus, for each micro-batch in flight on it, the activations
// its layers keep for backward. In flight: the schedule's peak on that stage, from the simulator
// (1F1B: p − s on stage s; GPipe: m; ZB-H2: 2p − 1). A stage's time per micro-batch: forward and
// backward of its layers, plus a recomputed layer's forward again, plus a swapped layer's
// transfer.
//
// When the stage does not fit, layers change from keep, cheapest first: the change that adds the
// least time per byte saved (recompute: the forward again, keeping only the layer's input; swap:
// the transfer, keeping nothing), until the stage fits or no change is left (then the cut is
// infeasible). That rule makes a stage's cost a function of (its layers, its index); the dynamic
// program then finds the cut whose slowest stage is fastest, exactly (tests/pipeline/partition.cpp
// compares it with every cut for L <= 12, p <= 4).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "tide/core/error.hpp"
#include "tide/pipeline/schedule.hpp"
#include "tide/pipeline/simulate.hpp"

namespace tide::pipeline {

struct layer_cost {
  double forward = 0, backward = 0;  // time per micro-batch (any unit: seconds, or relative)
  std::size_t activations = 0;       // bytes a micro-batch keeps for this layer's backward
  std::size_t input = 0;             // bytes kept when the layer is recomputed (its input)
  std::size_t state = 0;             // parameters, gradients and optimizer state, bytes
  double swap = -1;                  // time to move its activations out and back; < 0: cannot swap
};

enum class memory_action : std::uint8_t { keep, recompute, swap };

struct partition_options {
  int stages = 1;                   // p
  int micro = 1;                    // m, for the in-flight counts
  kind schedule = kind::one_f_one_b;
  std::size_t memory_limit = std::numeric_limits<std::size_t>::max();  // bytes per stage
  double state_offloaded = 0;       // the share of the state that offload keeps off the device, [0, 1]
};

struct stage_plan {
  int first = 0, last = -1;  // layers [first, last]
  double time = 0;           // per micro-batch
  std::size_t memory = 0;    // bytes at the peak
  int in_flight = 0;         // micro-batches whose activations it holds at once
  std::vector<memory_action> actions;  // per layer, first .. last
};

struct partition {
  bool feasible = false;
  double slowest = std::numeric_limits<double>::infinity();
  std::vector<stage_plan> stages;
};

namespace detail {

// The in-flight micro-batches of each stage under the schedule: its simulated peak, rounded up.
inline std::vector<int> in_flight(partition_options const& o) {
  auto const r = check(generate(o.schedule, o.stages, o.micro));
  std::vector<int> n;
  for (auto const& s : r.stages) n.push_back(static_cast<int>(s.peak_activations + 0.999999));
  return n;
}

// Layers [first, last] as stage s: keep everything, then change the cheapest layers until it fits.
inline stage_plan evaluate(std::span<layer_cost const> layers, int first, int last, int in_flight,
                           partition_options const& o) {
  stage_plan st{.first = first, .last = last, .time = 0, .memory = 0, .in_flight = in_flight, .actions = {}};
  double state = 0, kept = 0;
  for (int i = first; i <= last; ++i) {
    auto const& l = layers[static_cast<std::size_t>(i)];
    st.time += l.forward + l.backward;
    state += static_cast<double>(l.state) * (1 - o.state_offloaded);
    kept += static_cast<double>(l.activations);
  }
  st.actions.assign(static_cast<std::size_t>(last - first + 1), memory_action::keep);
  auto const bytes = [&] { return state + in_flight * kept; };
  double const limit = static_cast<double>(o.memory_limit);
  while (bytes() > limit) {
    int best = -1;
    memory_action how = memory_action::keep;
    double best_rate = std::numeric_limits<double>::infinity();
    for (int i = first; i <= last; ++i) {
      auto const& l = layers[static_cast<std::size_t>(i)];
      if (st.actions[static_cast<std::size_t>(i - first)] != memory_action::keep || l.activations == 0) continue;
      if (l.input < l.activations) {  // recompute saves activations − input per micro-batch
        double const rate = l.forward / static_cast<double>(l.activations - l.input);
        if (rate < best_rate) best_rate = rate, best = i, how = memory_action::recompute;
      }
      if (l.swap >= 0) {
        double const rate = l.swap / static_cast<double>(l.activations);
        if (rate < best_rate) best_rate = rate, best = i, how = memory_action::swap;
      }
    }
    if (best < 0) {  // nothing left to change: this cut does not fit
      st.time = std::numeric_limits<double>::infinity();
      break;
    }
    auto const& l = layers[static_cast<std::size_t>(best)];
    st.actions[static_cast<std::size_t>(best - first)] = how;
    if (how == memory_action::recompute) {
      st.time += l.forward;
      kept -= static_cast<double>(l.activations - l.input);
    } else {
      st.time += l.swap;
      kept -= static_cast<double>(l.activations);
    }
  }
  st.memory = static_cast<std::size_t>(bytes());
  return st;
}

}  // namespace detail

// The cut of `layers` into o.stages contiguous stages whose slowest stage is fastest (ties: the
// earliest cuts). feasible = false when no cut fits the memory limit.
inline partition partition_layers(std::span<layer_cost const> layers, partition_options const& o) {
  int const L = static_cast<int>(layers.size()), p = o.stages;
  TIDE_REQUIRE(p >= 1 && L >= p, "partition_layers: ", L, " layers into ", p,
               " stages; pass at least one layer per stage (stages >= 1)");
  TIDE_REQUIRE(o.state_offloaded >= 0 && o.state_offloaded <= 1, "partition_layers: state_offloaded = ",
               o.state_offloaded, "; pass a share in [0, 1]");
  TIDE_REQUIRE(o.schedule != kind::interleaved, "partition_layers: interleaved places several chunks of layers "
               "on a stage, and this partitioner cuts contiguous layers: pass one_f_one_b, gpipe, zb_h1 or zb_h2");
  auto const flight = detail::in_flight(o);
  double const inf = std::numeric_limits<double>::infinity();
  // best[k][i]: the slowest stage of the best cut of layers [0, i) into stages 0 .. k − 1;
  // from[k][i]: where its last stage starts.
  std::vector<std::vector<double>> best(static_cast<std::size_t>(p + 1), std::vector<double>(static_cast<std::size_t>(L + 1), inf));
  std::vector<std::vector<int>> from(static_cast<std::size_t>(p + 1), std::vector<int>(static_cast<std::size_t>(L + 1), -1));
  best[0][0] = 0;
  for (int k = 1; k <= p; ++k)
    for (int i = k; i <= L - (p - k); ++i)
      for (int j = k - 1; j < i; ++j) {
        double const before = best[static_cast<std::size_t>(k - 1)][static_cast<std::size_t>(j)];
        if (before == inf) continue;
        double const t = detail::evaluate(layers, j, i - 1, flight[static_cast<std::size_t>(k - 1)], o).time;
        double const worst = std::max(before, t);
        if (worst < best[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)]) {
          best[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] = worst;
          from[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] = j;
        }
      }
  partition out;
  out.slowest = best[static_cast<std::size_t>(p)][static_cast<std::size_t>(L)];
  out.feasible = out.slowest < inf;
  if (!out.feasible) return out;
  out.stages.resize(static_cast<std::size_t>(p));
  for (int k = p, i = L; k >= 1; --k) {
    int const j = from[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)];
    out.stages[static_cast<std::size_t>(k - 1)] = detail::evaluate(layers, j, i - 1, flight[static_cast<std::size_t>(k - 1)], o);
    i = j;
  }
  return out;
}

// The uniform cut, for comparison: L / p layers per stage (the first L % p stages one more).
inline partition uniform_partition(std::span<layer_cost const> layers, partition_options const& o) {
  int const L = static_cast<int>(layers.size()), p = o.stages;
  TIDE_REQUIRE(p >= 1 && L >= p, "uniform_partition: ", L, " layers into ", p, " stages; pass L >= p >= 1");
  auto const flight = detail::in_flight(o);
  partition out;
  out.slowest = 0;
  for (int s = 0, at = 0; s < p; ++s) {
    int const n = L / p + (s < L % p ? 1 : 0);
    out.stages.push_back(detail::evaluate(layers, at, at + n - 1, flight[static_cast<std::size_t>(s)], o));
    out.slowest = std::max(out.slowest, out.stages.back().time);
    at += n;
  }
  out.feasible = out.slowest < std::numeric_limits<double>::infinity();
  return out;
}

}  // namespace tide::pipeline
