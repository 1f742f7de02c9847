#pragma once
// Runs a pipeline schedule (pipeline/schedule.hpp) on paper: every stage takes its actions in
// order, each as soon as the stage is free and its inputs exist. constexpr, so a schedule's
// makespan, bubble and memory can be static_asserted.
//
//   auto r = tide::pipeline::simulate(tide::pipeline::one_f_one_b(4, 8), {.f = 1, .b = 1, .w = 1});
//   r.makespan;                 // 33 = 3 (m + p − 1)
//   r.bubble_fraction;          // 0.273: idle stage time over p · makespan
//   r.stages[0].peak_activations;  // 4 = p: micro-batches whose activations stage 0 holds at once
//   tide::pipeline::check(s);   // tide::error naming the action, if s is not a valid schedule
//
// Dependencies, for piece q of Q = p·v (schedule::piece):
//   F(q, k)      after F(q − 1, k)
//   B or BW(q, k)  after B or BW(q + 1, k), or after F(Q − 1, k) on the last piece
//   W(q, k)      after B(q, k)
// A dependency on another stage adds costs::comm (the send and the receive). Costs are of a
// whole stage per micro-batch; an action on one of v chunks costs a v-th of it.
//
// Activations: a forward takes one chunk's activations when it starts; they are freed when that
// micro-batch's W or BW on the chunk ends. peak_activations counts them in stages (chunks / v).
//
// A schedule is valid when every (piece, micro-batch) has exactly one F and either one BW
// or one B and one W, on the stage that holds the chunk, and every stage can run its list to the
// end. Otherwise simulate() reports the first problem (simulation::found, ::at) instead of
// times; check() turns that into a tide::error.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/core/error.hpp"
#include "tide/pipeline/schedule.hpp"

namespace tide::pipeline {

struct costs {
  double f = 1, b = 1, w = 1;  // one stage's forward, input-gradient and weight-gradient time per micro-batch
  double comm = 0;             // one send + receive between stages
};

enum class problem : std::uint8_t {
  none,
  malformed,     // a shape the schedule cannot have: p, m or v < 1, per_stage not p lists, a V of v != 2
  out_of_range,  // a micro-batch or chunk outside the schedule's m or v
  duplicate,     // an action that appears twice
  missing,       // a (piece, micro-batch) without its F, or without its backward
  mixed,         // both BW and B / W for one (piece, micro-batch)
  deadlock,      // some stage waits for an action that can never run
};

constexpr std::string_view to_string(problem p) noexcept {
  switch (p) {
    case problem::none: return "none";
    case problem::malformed: return "a malformed schedule (p, m, v >= 1, one list per stage, a V of two chunks)";
    case problem::out_of_range: return "an action outside the schedule's micro-batches or chunks";
    case problem::duplicate: return "an action that appears twice";
    case problem::missing: return "a micro-batch without its forward or its backward";
    case problem::mixed: return "a micro-batch with both BW and B / W";
    case problem::deadlock: return "a deadlock: a stage waits for an action that can never run";
  }
  return "?";
}

struct stage_result {
  double busy = 0;         // time spent in actions
  double first_start = 0;  // of its first action
  double last_end = 0;     // of its last action
  double peak_activations = 0;  // in stages: peak chunk activations / v
  [[nodiscard]] constexpr double span() const noexcept { return last_end - first_start; }
};

// An action as it ran: when it started and ended.
struct timed_action {
  action a{};
  double start = 0, end = 0;
};

struct simulation {
  problem found = problem::none;
  int stage = -1;  // where the problem is (the stage whose list holds the action, or that waits)
  action at{};     // the action concerned
  double makespan = 0;
  double bubble_fraction = 0;  // Σ (makespan − busy) over p · makespan
  std::vector<stage_result> stages;
  std::vector<std::vector<timed_action>> timeline;  // per stage, in the order it ran them
  [[nodiscard]] constexpr bool ok() const noexcept { return found == problem::none; }
};

namespace detail {

struct slot {
  int f = 0, b = 0, w = 0, bw = 0;           // how many of each
  double f_end = -1, grad_end = -1, w_end = -1;  // finish times (−1: not yet); grad: B or BW
  int f_stage = 0, grad_stage = 0;
};

constexpr double cost_of(action a, costs const& c, int v) {
  double const t = a.kind == op::F ? c.f : a.kind == op::B ? c.b : a.kind == op::W ? c.w : c.b + c.w;
  return t / v;
}

}  // namespace detail

namespace detail {
// The simulation, with cost(a, piece) the duration of action a on that piece and comm(piece) what
// a dependency from another stage adds to an action on it.
template <class Cost, class Comm>
constexpr simulation simulate_with(schedule const& s, Cost const& cost, Comm const& comm) {
  simulation r;
  int const p = s.stages, m = s.micro, v = s.chunks, Q = p * v;
  if (p < 1 || m < 1 || v < 1 || s.per_stage.size() != static_cast<std::size_t>(p) ||
      (s.place == placement::v_shape && v != 2)) {
    r.found = problem::malformed;
    return r;
  }
  r.stages.resize(static_cast<std::size_t>(p));
  r.timeline.resize(static_cast<std::size_t>(p));
  std::vector<detail::slot> slots(static_cast<std::size_t>(Q * m));
  auto slot_of = [&](int q, int k) -> detail::slot& { return slots[static_cast<std::size_t>(q * m + k)]; };
  auto fail = [&](problem what, int st, action a) {
    r.found = what;
    r.stage = st;
    r.at = a;
    return r;
  };
  // Every action once, in range.
  for (int st = 0; st < p; ++st)
    for (action const a : s.per_stage[static_cast<std::size_t>(st)]) {
      if (a.micro < 0 || a.micro >= m || a.chunk < 0 || a.chunk >= v) return fail(problem::out_of_range, st, a);
      detail::slot& x = slot_of(s.piece(st, a.chunk), a.micro);
      int& n = a.kind == op::F ? x.f : a.kind == op::B ? x.b : a.kind == op::W ? x.w : x.bw;
      if (++n > 1) return fail(problem::duplicate, st, a);
    }
  for (int st = 0; st < p; ++st)
    for (int ch = 0; ch < v; ++ch)
      for (int k = 0; k < m; ++k) {
        detail::slot const& x = slot_of(s.piece(st, ch), k);
        action const a{op::F, k, ch};
        if (x.bw == 1 && (x.b != 0 || x.w != 0)) return fail(problem::mixed, st, a);
        if (x.f != 1 || (x.bw == 0 && (x.b != 1 || x.w != 1))) return fail(problem::missing, st, a);
      }

  // Each stage runs its list in order; an action starts when its stage is free and its inputs
  // exist. Sweep the stages until all are done or none can move.
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<double> free_at(static_cast<std::size_t>(p), 0);
  std::vector<std::vector<std::pair<double, int>>> held(static_cast<std::size_t>(p));  // (time, ±1)
  std::size_t left = 0;
  for (auto const& l : s.per_stage) left += l.size();
  while (left > 0) {
    bool moved = false;
    for (int st = 0; st < p; ++st) {
      auto const& list = s.per_stage[static_cast<std::size_t>(st)];
      std::size_t& i = next[static_cast<std::size_t>(st)];
      while (i < list.size()) {
        action const a = list[i];
        int const q = s.piece(st, a.chunk);
        double ready = 0;
        auto after = [&](double end, int from) {  // −1: the input does not exist yet
          if (end < 0) return false;
          ready = std::max(ready, end + (from != st ? comm(q) : 0));
          return true;
        };
        bool can = true;
        if (a.kind == op::F) {
          if (q > 0) can = after(slot_of(q - 1, a.micro).f_end, slot_of(q - 1, a.micro).f_stage);
        } else if (a.kind == op::W) {
          can = after(slot_of(q, a.micro).grad_end, st);
        } else if (q + 1 < Q) {
          can = after(slot_of(q + 1, a.micro).grad_end, slot_of(q + 1, a.micro).grad_stage);
        } else {
          can = after(slot_of(q, a.micro).f_end, st);
        }
        if (!can) break;
        double const start = std::max(ready, free_at[static_cast<std::size_t>(st)]);
        double const end = start + cost(a, q);
        detail::slot& x = slot_of(q, a.micro);
        auto& h = held[static_cast<std::size_t>(st)];
        if (a.kind == op::F) x.f_end = end, x.f_stage = st, h.push_back({start, +1});
        if (a.kind == op::B || a.kind == op::BW) x.grad_end = end, x.grad_stage = st;
        if (a.kind == op::W || a.kind == op::BW) x.w_end = end, h.push_back({end, -1});
        r.timeline[static_cast<std::size_t>(st)].push_back({a, start, end});
        stage_result& sr = r.stages[static_cast<std::size_t>(st)];
        if (i == 0) sr.first_start = start;
        sr.last_end = end;
        sr.busy += end - start;
        free_at[static_cast<std::size_t>(st)] = end;
        r.makespan = std::max(r.makespan, end);
        ++i;
        --left;
        moved = true;
      }
    }
    if (!moved) {
      for (int st = 0; st < p; ++st) {
        auto const& list = s.per_stage[static_cast<std::size_t>(st)];
        if (next[static_cast<std::size_t>(st)] < list.size())
          return fail(problem::deadlock, st, list[next[static_cast<std::size_t>(st)]]);
      }
      return fail(problem::deadlock, -1, {});  // unreachable: some stage has actions left
    }
  }

  // Peak activations per stage: frees before takes at the same instant.
  double idle = 0;
  for (int st = 0; st < p; ++st) {
    auto& h = held[static_cast<std::size_t>(st)];
    std::sort(h.begin(), h.end());
    int now = 0, peak = 0;
    for (auto const& e : h) peak = std::max(peak, now += e.second);
    stage_result& sr = r.stages[static_cast<std::size_t>(st)];
    sr.peak_activations = static_cast<double>(peak) / v;
    idle += r.makespan - sr.busy;
  }
  r.bubble_fraction = r.makespan > 0 ? idle / (p * r.makespan) : 0;
  return r;
}
}  // namespace detail

constexpr simulation simulate(schedule const& s, costs const& c = {}) {
  int const v = s.chunks;
  return detail::simulate_with(
      s, [&](action a, int) { return detail::cost_of(a, c, v); }, [&](int) { return c.comm; });
}

// With costs per piece (p v of them, piece q's own times per micro-batch, not divided by v; its
// comm: what a dependency from another stage adds to an action on it), as an executor measures
// them (run_stats::piece_costs): stages of unequal pieces. A wrong count is malformed.
constexpr simulation simulate(schedule const& s, std::span<costs const> per_piece) {
  if (per_piece.size() != static_cast<std::size_t>(s.stages * s.chunks)) {
    simulation r;
    r.found = problem::malformed;
    return r;
  }
  return detail::simulate_with(
      s,
      [&](action a, int q) {
        costs const& c = per_piece[static_cast<std::size_t>(q)];
        return a.kind == op::F ? c.f : a.kind == op::B ? c.b : a.kind == op::W ? c.w : c.b + c.w;
      },
      [&](int q) { return per_piece[static_cast<std::size_t>(q)].comm; });
}

// The simulation of a valid schedule; tide::error (usage) naming the first problem otherwise.
inline simulation check(schedule const& s, costs const& c = {}) {
  simulation r = simulate(s, c);
  TIDE_REQUIRE(r.ok(), "pipeline schedule ", s.name, " (p = ", s.stages, ", m = ", s.micro, ", v = ", s.chunks,
               "): ", to_string(r.found), ", at ", to_string(r.at.kind), " of micro-batch ", r.at.micro, ", chunk ",
               r.at.chunk, " on stage ", r.stage);
  return r;
}

}  // namespace tide::pipeline
