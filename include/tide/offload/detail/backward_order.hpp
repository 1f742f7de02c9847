#pragma once
// The order in which backward visits a model's blocks, and when a block's gradients are complete.
//
// A whole model's backward visits its blocks from the last down to the first, once per pass (one
// pass per micro-step). A pipeline stage of several pieces (interleaved, ZB-V, DualPipeV) holds
// several runs of blocks (block_uses::runs) that backward visits apart: each run from its last
// block down to its first, once per pass, while the runs' passes interleave as the schedule orders
// them. A block's gradients are complete when its run finishes the step's last pass; the chunks
// whose lowest reader is that block (residency's completes_at) are complete only if every run
// above has finished its last pass too, which every pipeline schedule gives (a micro-batch's
// backward reaches a piece after the pieces above it) and which leave() checks.

#include <cstddef>
#include <utility>
#include <vector>

#include "tide/core/error.hpp"
#include "tide/core/parameters.hpp"

namespace tide::offload::detail {

class backward_order {
 public:
  backward_order() = default;
  explicit backward_order(block_uses const& u) {
    if (u.runs.empty()) {
      runs_.push_back({u.first_block, u.last_block()});
    } else {
      int above = u.first_block - 1;
      for (auto const& [first, last] : u.runs) {
        TIDE_REQUIRE(first > above && first <= last && last <= u.last_block(), "offload::scheduler: uses().runs: the "
                     "run ", first, " .. ", last, " is not a run of blocks after ", above, " within ", u.first_block,
                     " .. ", u.last_block(), "; list each run's first and last block, ascending and apart");
        runs_.push_back({first, last});
        above = last;
      }
    }
    reset();
  }

  // Before backward enters `block`: refuses an order the model must not take. policy(): the
  // offload policy's name, for the message (called only on failure).
  template <class Name>
  void enter(Name const& policy, int block) {
    run& r = of(policy, block);
    TIDE_CHECK(block == r.next, usage, "offload ", policy(), ": pre_backward(", block, ") but block ", r.next,
               " is next: backward must visit the blocks ", r.first, " .. ", r.last, " in reverse, each once per "
               "pass", runs_.size() > 1 ? " (each run of uses().runs apart)" : "");
    if (block == r.last) ++r.passes;  // a pass begins
  }
  // After backward left `block`. Returns whether its gradients are complete: its run finished a
  // pass that is a multiple of micro_steps.
  template <class Name>
  bool leave(Name const& policy, int block, std::size_t micro_steps) {
    run& r = of(policy, block);
    r.next = block == r.first ? r.last : block - 1;
    if (r.passes % micro_steps != 0) return false;
    for (run const& above : runs_)
      TIDE_CHECK(above.first <= r.first || (above.passes == r.passes && above.next == above.last), usage,
                 "offload ", policy(), ": block ", block,
                 " finished its last backward pass of the step while blocks ", above.first, " .. ",
                 above.last, " (a run above it) had not; backward must reach a run after every run above it");
    return true;
  }
  // Whether every run finished the step's last pass (passes a positive multiple of micro_steps),
  // and how many passes the least advanced run ran.
  [[nodiscard]] bool at_rest(std::size_t micro_steps) const noexcept {
    for (run const& r : runs_)
      if (r.passes == 0 || r.passes % micro_steps != 0 || r.next != r.last) return false;
    return true;
  }
  [[nodiscard]] std::size_t passes() const noexcept {
    std::size_t least = runs_.empty() ? 0 : runs_.front().passes;
    for (run const& r : runs_) least = r.passes < least ? r.passes : least;
    return least;
  }
  // Whether a pass of `block`'s run is unfinished at a multiple of micro_steps (another
  // micro-step's forward follows), and the run's blocks: what the next moment may be.
  [[nodiscard]] bool more_passes(int block, std::size_t micro_steps) const noexcept {
    for (run const& r : runs_)
      if (block >= r.first && block <= r.last) return r.passes % micro_steps != 0;
    return false;
  }
  [[nodiscard]] bool one_run() const noexcept { return runs_.size() == 1; }
  // The first and last block of `block`'s run (block itself twice when it is in none).
  [[nodiscard]] std::pair<int, int> run_of(int block) const noexcept {
    for (run const& r : runs_)
      if (block >= r.first && block <= r.last) return {r.first, r.last};
    return {block, block};
  }
  [[nodiscard]] bool in_a_run(int block) const noexcept {
    for (run const& r : runs_)
      if (block >= r.first && block <= r.last) return true;
    return false;
  }
  // A new step (or a dropped one).
  void reset() noexcept {
    for (run& r : runs_) r.passes = 0, r.next = r.last;
  }

 private:
  struct run {
    int first = 0, last = 0;
    int next = 0;             // the block backward must visit next
    std::size_t passes = 0;   // passes begun in this step
  };
  template <class Name>
  run& of(Name const& policy, int block) {
    for (run& r : runs_)
      if (block >= r.first && block <= r.last) return r;
    TIDE_FAIL(usage, "offload ", policy(), ": block ", block,
              " is in none of uses().runs; backward visits only the blocks of a run");
  }
  std::vector<run> runs_;
};

}  // namespace tide::offload::detail
