#pragma once
// Where a schedule's pieces are and the activation slots it needs: the model's blocks cut into
// the schedule's pieces (cut, uniform_cut, stage_of), and the fewest micro-batch slots a stage
// holds (slots_needed) or, when the stages share one model and W runs apart, every stage
// (shared_slots). What the executors (pipeline/executor.hpp, pipeline/ranks.hpp) check a model's
// in_flight against.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tide/core/error.hpp"
#include "tide/pipeline/schedule.hpp"

namespace tide::pipeline {

// The model's blocks cut into the schedule's pieces: piece q runs blocks first[q] .. last[q],
// consecutive pieces consecutive blocks.
struct cut {
  std::vector<int> first, last;
  [[nodiscard]] int pieces() const noexcept { return static_cast<int>(first.size()); }
};

// Blocks first_block .. last_block into `pieces` runs, as even as can be (the first ones one longer).
inline cut uniform_cut(int first_block, int last_block, int pieces) {
  int const blocks = last_block - first_block + 1;
  TIDE_REQUIRE(pieces >= 1 && blocks >= pieces, "pipeline::uniform_cut: ", blocks, " blocks (", first_block, " .. ",
               last_block, ") into ", pieces, " pieces; a piece needs at least one block: pass fewer stages or chunks");
  cut c;
  for (int q = 0, at = first_block; q < pieces; ++q) {
    int const n = blocks / pieces + (q < blocks % pieces ? 1 : 0);
    c.first.push_back(at);
    c.last.push_back(at + n - 1);
    at += n;
  }
  return c;
}
// Refuses a cut that is not `pieces` contiguous, non-empty runs covering first_block .. last_block
// in order, naming the first fault.
inline void check_cut(cut const& c, int first_block, int last_block, int pieces) {
  TIDE_REQUIRE(c.pieces() == pieces && c.last.size() == c.first.size(), "pipeline: the cut has ", c.pieces(),
               " pieces (", c.last.size(), " ends), the schedule ", pieces, "; one per stage and chunk");
  TIDE_REQUIRE(c.first.front() == first_block && c.last.back() == last_block, "pipeline: the cut covers blocks ",
               c.first.front(), " .. ", c.last.back(), ", the model has ", first_block, " .. ", last_block,
               "; cut every block, the embedding and the head included");
  for (std::size_t q = 0; q < c.first.size(); ++q) {
    TIDE_REQUIRE(c.first[q] <= c.last[q], "pipeline: piece ", q, " of the cut is blocks ", c.first[q], " .. ",
                 c.last[q], "; a piece needs at least one block");
    TIDE_REQUIRE(q == 0 || c.first[q] == c.last[q - 1] + 1, "pipeline: piece ", q, " of the cut starts at block ",
                 c.first[q], " but piece ", q - 1, " ends at ", c.last[q - 1], "; pieces are contiguous and in order");
  }
}
// The model's blocks into the schedule's p v pieces.
template <class Model>
cut uniform_cut(Model const& model, schedule const& s) {
  return uniform_cut(model.first_block(), model.last_block(), s.stages * s.chunks);
}

// The stage that runs piece q.
[[nodiscard]] constexpr int stage_of(schedule const& s, int q) noexcept {
  for (int st = 0; st < s.stages; ++st)
    for (int c = 0; c < s.chunks; ++c)
      if (s.piece(st, c) == q) return st;
  return -1;
}

// The fewest slots (micro-batch mod n) with which stage st never holds two micro-batches in one
// slot: a micro-batch holds its slot from its first forward on the stage to its last backward
// there. Of stage 0 for a model shared by every stage (micro-batch k's first and last action in
// the whole pipeline are there: piece 0).
// split: W's run apart from their B's (a model whose backward splits), so a slot is held until
// the micro-batch's last W or BW on the stage; else until its last B or BW.
inline int slots_needed(schedule const& s, int st, bool split = false) {
  auto const& list = s.per_stage.at(static_cast<std::size_t>(st));
  auto const m = static_cast<std::size_t>(s.micro);
  std::vector<int> opened(m, 0), closed(m, 0);
  int const per_micro = s.chunks;  // pieces of this stage a micro-batch goes through
  for (int n = 1; n <= s.micro; ++n) {
    std::fill(opened.begin(), opened.end(), 0);
    std::fill(closed.begin(), closed.end(), 0);
    std::vector<int> holder(static_cast<std::size_t>(n), -1);
    bool ok = true;
    for (action const& a : list) {
      auto const k = static_cast<std::size_t>(a.micro);
      auto const slot = static_cast<std::size_t>(a.micro % n);
      if (a.kind == op::F && opened[k]++ == 0) {
        if (holder[slot] != -1) {
          ok = false;
          break;
        }
        holder[slot] = a.micro;
      } else if ((a.kind == op::BW || a.kind == (split ? op::W : op::B)) && ++closed[k] == per_micro) {
        holder[slot] = -1;
      }
    }
    if (ok) return n;
  }
  return s.micro;
}

namespace detail {
// The makespan at unit costs (F, B, W 1 a stage, BW 2, as simulate takes them) when, besides the schedule's
// dependencies, micro-batch k's first forward waits until micro-batch k − n has closed on every
// piece (its W, or its BW); −1 if some stage then never reaches the end of its list. A greedy run
// finds any deadlock: every stage waits only on its dependencies, so a deadlock in some order is
// a cycle of list order and dependencies, which stops the greedy run too.
inline double slot_wait_makespan(schedule const& s, int n) {
  int const Q = s.stages * s.chunks, m = s.micro;
  auto const at = [m](int q, int k) { return static_cast<std::size_t>(q) * static_cast<std::size_t>(m) +
                                             static_cast<std::size_t>(k); };
  std::vector<double> fwd(static_cast<std::size_t>(Q * m), -1), bwd(fwd.size(), -1);  // end times; −1: not yet
  std::vector<int> closed(static_cast<std::size_t>(m), 0);
  std::vector<double> closed_at(static_cast<std::size_t>(m), 0), clock(static_cast<std::size_t>(s.stages), 0);
  std::vector<std::size_t> next(static_cast<std::size_t>(s.stages), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < s.stages; ++st) {
      auto const& list = s.per_stage[static_cast<std::size_t>(st)];
      double& now = clock[static_cast<std::size_t>(st)];
      for (std::size_t& i = next[static_cast<std::size_t>(st)]; i < list.size(); ++i, progress = true) {
        action const a = list[i];
        int const q = s.piece(st, a.chunk), k = a.micro;
        auto const uk = static_cast<std::size_t>(k);
        double ready = 0;  // when its inputs are there; −1: not yet
        if (a.kind == op::F)
          ready = q > 0 ? fwd[at(q - 1, k)]
                        : k < n ? 0 : closed[static_cast<std::size_t>(k - n)] == Q ? closed_at[uk - static_cast<std::size_t>(n)] : -1;
        else if (a.kind != op::W)  // a W follows its B, earlier in the list
          ready = q + 1 < Q ? bwd[at(q + 1, k)] : fwd[at(q, k)];
        if (ready < 0) break;
        now = std::max(now, ready) + (a.kind == op::BW ? 2.0 : 1.0) / s.chunks;  // a chunk is 1/v of a stage
        if (a.kind == op::F) fwd[at(q, k)] = now;
        if (a.kind == op::B || a.kind == op::BW) bwd[at(q, k)] = now;
        if (a.kind == op::W || a.kind == op::BW) ++closed[uk], closed_at[uk] = std::max(closed_at[uk], now);
      }
    }
  }
  for (int st = 0; st < s.stages; ++st)
    if (next[static_cast<std::size_t>(st)] != s.per_stage[static_cast<std::size_t>(st)].size()) return -1;
  return *std::max_element(clock.begin(), clock.end());
}
}  // namespace detail

// The slots of a model that every stage shares (thread_executor) when W's run apart from B's: a
// micro-batch's first forward waits until the one n before it has closed everywhere, so no
// stage's W still reads a slot that a new forward writes. n is the fewest with which those waits
// cost the schedule nothing at unit costs (the makespan of n = m, where nothing waits).
inline int shared_slots(schedule const& s) {
  double const free = detail::slot_wait_makespan(s, s.micro);
  for (int n = 1; n < s.micro; ++n)
    if (detail::slot_wait_makespan(s, n) == free) return n;
  return s.micro;
}

}  // namespace tide::pipeline
