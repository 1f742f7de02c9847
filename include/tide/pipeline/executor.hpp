#pragma once
// Running a schedule (pipeline/schedule.hpp) for real: each stage walks its action list over a
// staged model (pipeline::StagedModel, pipeline/model.hpp: nn::gpt has forward_blocks,
// backward_blocks, boundary, boundary_grad), waiting for what it needs from the stages before and
// after it. Here: every stage
// on a thread of one process, all sharing one model; pipeline/ranks.hpp runs a stage per rank.
//
//   auto s = tide::pipeline::one_f_one_b(2, 8);
//   tide::pipeline::cut c = tide::pipeline::uniform_cut(model, s);   // blocks per piece
//   tide::pipeline::thread_executor<> run{s, c};                     // one pool per stage
//   model.zero_grad(ex);
//   double loss_sum = run.run(model, std::span(micro_batches), 1.f / 8);
//   run.last().bubble_fraction;   // measured: idle stage time over p * the step's wall time
//
// What a run equals. Gradients accumulate into the model's buffers as m forward + backward pairs
// would, micro-batch by micro-batch: each block adds micro-batch k's share after k - 1's (a stage
// runs a piece's backwards in micro-batch order in every generator), and the embedding adds the
// head's share of the tied wte gradient before its own, per micro-batch (nn::gpt's tied buffer).
// So a pipelined step equals gradient accumulation over the same micro-batches bit for bit
// (tests/pipeline/executor.cpp, every schedule).
//
// B and W. A model whose backward splits in two (a SplitBackwardModel: nn::gpt with
// gpt_options::split_backward, whose splits_backward() says so) runs B as its input
// pass and W as its weight pass, so a zero-bubble schedule's W's fill its bubbles; BW runs both.
// Any other model runs its whole backward in B and BW, and W does nothing: the schedule stays
// exact, its bubbles unfilled.
//
// Slots. A micro-batch's activations live in the model's slot (micro mod in_flight) from its first
// forward to its last backward (its W's, when they run apart); slots_needed(s, st, split) is the
// fewest slots for which no two micro-batches on stage st share one (1F1B: p; GPipe: m). The
// model must be built with in_flight >= the executor's slots(split) (nn::gpt_options::in_flight),
// or run() says what to pass.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/pipeline/model.hpp"
#include "tide/pipeline/partition.hpp"
#include "tide/pipeline/run_stats.hpp"
#include "tide/pipeline/schedule.hpp"
#include "tide/pipeline/simulate.hpp"
#include "tide/pipeline/slots.hpp"

namespace tide::pipeline {

namespace detail {

using clock = std::chrono::steady_clock;

inline double seconds_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Whether `model` runs W apart from B (its backward splits in two) for schedule s.
template <class Model, Backend B>
bool runs_weights_apart(Model const& model, schedule const& s) {
  bool has_w = false;
  for (auto const& list : s.per_stage)
    for (action const& a : list) has_w = has_w || a.kind == op::W;
  if constexpr (SplitBackwardModel<Model, B>) return has_w && model.splits_backward();
  else return false;
}

// After a step that failed: the weight passes a split model still owes are dropped with it.
template <class Model, Backend B>
void drop_owed(Model& model, bool split) noexcept {
  if constexpr (SplitBackwardModel<Model, B>)
    if (split) model.drop_weight_passes();
}

// The executors' check of the model's type.
template <class Model, Backend B>
consteval void check_staged() {
  static_assert(StagedModel<Model, B>, "pipeline: the model is not a pipeline::StagedModel (pipeline/model.hpp): "
                "it needs batch_type, first_block(), last_block(), forward_blocks(ex, first, last, micro, batch), "
                "backward_blocks(ex, first, last, micro, loss_scale), boundary(block, micro) and "
                "boundary_grad(micro); nn::gpt has them");
}

// The checks every executor makes before its stages start; the model plans its activations and
// its kernels' scratch for `ex` (the stages' execs all have its size).
template <class Model, class Batch, class B>
void check_run(char const* who, schedule const& s, cut const& c, Model& model, exec<B> const& ex,
               std::span<Batch const> micro, int slots) {
  check(s);
  TIDE_REQUIRE(c.pieces() == s.stages * s.chunks, who, ": the cut has ", c.pieces(), " pieces, the schedule ",
               s.name, " has ", s.stages * s.chunks, " (p = ", s.stages, " stages of v = ", s.chunks,
               " chunks); cut the model with uniform_cut(model, schedule)");
  for (int q = 0; q < c.pieces(); ++q) {
    auto const uq = static_cast<std::size_t>(q);
    bool const joined = q == 0 ? c.first[0] == model.first_block() : c.first[uq] == c.last[uq - 1] + 1;
    TIDE_REQUIRE(c.first[uq] <= c.last[uq] && joined, who, ": piece ", q, " is blocks ", c.first[uq], " .. ",
                 c.last[uq], "; pieces must be non-empty runs of consecutive blocks from ", model.first_block());
  }
  TIDE_REQUIRE(c.last.back() == model.last_block(), who, ": the cut ends at block ", c.last.back(),
               ", the model at ", model.last_block(), "; the last piece must hold the head");
  TIDE_REQUIRE(micro.size() == static_cast<std::size_t>(s.micro), who, ": ", micro.size(),
               " micro-batches given, the schedule ", s.name, " is for m = ", s.micro, "; pass exactly m");
  if constexpr (requires { model.options().in_flight; }) {
    TIDE_REQUIRE(model.options().in_flight >= slots, who, ": the schedule ", s.name, " (p = ", s.stages, ", m = ",
                 s.micro, ") holds up to ", slots, " micro-batches' activations at once, the model has in_flight = ",
                 model.options().in_flight, " slots; build it with gpt_options::in_flight = ", slots);
  }
  if constexpr (requires { micro[0].tokens.extent(0); }) {
    for (Batch const& b : micro)
      TIDE_REQUIRE(b.tokens.extent(0) == micro[0].tokens.extent(0) && b.tokens.extent(1) == micro[0].tokens.extent(1),
                   who, ": micro-batches of different shapes ((", b.tokens.extent(0), ", ", b.tokens.extent(1),
                   ") and (", micro[0].tokens.extent(0), ", ", micro[0].tokens.extent(1),
                   ")); every micro-batch of a step has one (B, T)");
    if constexpr (requires { model.plan_activations(ex, micro[0].tokens.extent(0), micro[0].tokens.extent(1)); })
      model.plan_activations(ex, micro[0].tokens.extent(0), micro[0].tokens.extent(1));  // before any stage starts
  }
  if constexpr (requires { model.has_grads(); })
    TIDE_REQUIRE(model.has_grads(), who, ": the model's gradients are not allocated; call model.zero_grad(ex) "
                                         "before the first run (gradients accumulate over runs, as backward's do)");
}

// Stage st's list over `model`. Links provide what crosses stages: before_forward / after_forward
// / before_backward / after_backward (piece, micro-batch, slot); a W needs only its own stage's B.
// split: W runs the model's weight pass and B its input pass (runs_weights_apart). Times only the
// model's calls.
template <class Model, class Batch, class B, class Links>
void run_stage(int st, schedule const& s, cut const& c, Model& model, exec<B> const& ex, std::span<Batch const> micro,
               float scale, int slots, bool split, Links& links, clock::time_point t0, stage_times& out,
               double* losses) {
  int const last_piece = c.pieces() - 1;
  for (action const& a : s.per_stage[static_cast<std::size_t>(st)]) {
    int const q = s.piece(st, a.chunk);
    int const slot = a.micro % slots;
    auto const uq = static_cast<std::size_t>(q);
    int const first = c.first[uq], last = c.last[uq];
    if (a.kind == op::W && !split) {  // folded into B (one-pass backward)
      auto const now = seconds_between(t0, clock::now());
      out.timeline.push_back({a, q, now, now});
      continue;
    }
    if (a.kind == op::F) links.before_forward(q, a.micro, slot);
    else if (a.kind != op::W) links.before_backward(q, a.micro, slot);
    auto const start = clock::now();
    if (a.kind == op::F) {
      float const l = model.forward_blocks(ex, first, last, slot, micro[static_cast<std::size_t>(a.micro)]);
      if (q == last_piece) losses[a.micro] = static_cast<double>(l);
    } else if constexpr (SplitBackwardModel<Model, B>) {
      if (a.kind == op::W) model.backward_weight_blocks(ex, first, last, slot);
      else if (a.kind == op::B && split) model.backward_input_blocks(ex, first, last, slot, scale);
      else model.backward_blocks(ex, first, last, slot, scale);
    } else {
      model.backward_blocks(ex, first, last, slot, scale);
    }
    auto const end = clock::now();
    double const took = seconds_between(start, end);
    out.busy += took;
    if (a.kind == op::F) out.forward += took, ++out.forwards;
    else if (a.kind == op::W) out.weight += took, ++out.weights;
    else ++out.backwards;
    out.timeline.push_back({a, q, seconds_between(t0, start), seconds_between(t0, end)});
    if (a.kind == op::F) links.after_forward(q, a.micro, slot);
    else if (a.kind != op::W) links.after_backward(q, a.micro, slot);
    if constexpr (requires { links.closed(q, a.micro); })
      if (a.kind == op::BW || a.kind == op::W) links.closed(q, a.micro);  // the piece is done with the slot
  }
}

inline void finish_stats(run_stats& r, clock::time_point t0) {
  r.seconds = seconds_between(t0, clock::now());
  double busy = 0, spans = 0;
  for (stage_times const& st : r.stages) {
    busy += st.busy;
    double first = r.seconds, last = 0;
    for (ran_action const& a : st.timeline)
      if (a.end > a.start) first = std::min(first, a.start), last = std::max(last, a.end);
    spans += std::max(0.0, last - first);
  }
  double const room = static_cast<double>(r.stages.size()) * r.seconds;
  r.bubble_fraction = room > 0 ? std::max(0.0, 1.0 - busy / room) : 0;
  r.span_bubble_fraction = spans > 0 ? std::max(0.0, 1.0 - busy / spans) : 0;
}

// A counter per item that stages wait on reaching a count (a piece's forward or backward of a
// micro-batch done: 1; a micro-batch closed on every piece: the pieces); < 0 once the run failed,
// which wakes every waiter with `stopped`.
class counters {
 public:
  struct stopped {};  // thrown into a waiting stage when another stage failed
  void reset(std::size_t n) {
    if (counts_.size() != n) counts_ = std::vector<std::atomic<int>>(n);
    for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
  }
  void add(std::size_t i) {
    counts_[i].fetch_add(1, std::memory_order_acq_rel);
    counts_[i].notify_all();
  }
  void wait(std::size_t i, int count = 1) {
    int v = 0;
    while ((v = counts_[i].load(std::memory_order_acquire)) >= 0 && v < count)
      counts_[i].wait(v, std::memory_order_acquire);
    if (v < 0) throw stopped{};
  }
  void fail_all() {
    for (auto& c : counts_) {
      c.store(failed, std::memory_order_release);
      c.notify_all();
    }
  }

 private:
  static constexpr int failed = -(1 << 24);  // stays < 0 through any increments after it
  std::vector<std::atomic<int>> counts_;
};

}  // namespace detail

// Every stage on a thread of this process, one model shared by all: a stage hands a piece's
// output to the next by setting a flag (the activations stay in the model's slot), so nothing is
// copied. Each stage computes with a pool of its own (threads_per_stage threads). A stage that
// throws stops the others at their next wait; run() then rethrows the first error. Host only.
class thread_executor {
 public:
  thread_executor(schedule s, cut c, int threads_per_stage = 1)
      : schedule_(std::move(s)), cut_(std::move(c)), slots_(0) {
    check(schedule_);
    TIDE_REQUIRE(cut_.pieces() == schedule_.stages * schedule_.chunks, "pipeline::thread_executor: the cut has ",
                 cut_.pieces(), " pieces, the schedule ", schedule_.name, " ", schedule_.stages * schedule_.chunks,
                 "; cut the model with uniform_cut(model, schedule)");
    slots_ = slots_needed(schedule_, 0);
    shared_slots_ = shared_slots(schedule_);
    for (int st = 0; st < schedule_.stages; ++st) pools_.push_back(std::make_unique<thread_pool>(threads_per_stage));
  }

  [[nodiscard]] schedule const& plan() const noexcept { return schedule_; }
  [[nodiscard]] cut const& pieces() const noexcept { return cut_; }
  // The model's in_flight must be at least this. split: a model whose backward splits, under a
  // schedule with W's: the stages share the model and a micro-batch's last W may run on any stage
  // after stage 0 has moved on, so a micro-batch's first forward waits until the one slots(true)
  // before it has closed everywhere (shared_slots).
  [[nodiscard]] int slots(bool split = false) const noexcept { return split ? shared_slots_ : slots_; }
  [[nodiscard]] run_stats const& last() const noexcept { return stats_; }

  // Forward and backward of every micro-batch, pipelined; gradients += as m forward + backward
  // pairs with loss scale `scale` would. Returns the sum of the micro-batches' losses.
  template <class Model, class Batch>
  double run(Model& model, std::span<Batch const> micro, float scale) {
    if constexpr (requires { Model::external_storage; })
      static_assert(!Model::external_storage,
                    "pipeline::thread_executor: the model's hooks keep its parameters (an offload scheduler, which "
                    "serves one block order from one thread); give the stages a model with its own storage "
                    "(nn::no_hooks), or run a stage per rank (rank_executor, pipeline::on_ranks in make_trainer)");
    detail::check_staged<Model, host>();
    split_ = detail::runs_weights_apart<Model, host>(model, schedule_);
    detail::check_run("pipeline::thread_executor", schedule_, cut_, model, exec<host>{*pools_.front()}, micro,
                      slots(split_));
    int const p = schedule_.stages, m = schedule_.micro, Q = cut_.pieces();
    auto const n = static_cast<std::size_t>(Q) * static_cast<std::size_t>(m);
    forward_done_.reset(n);
    backward_done_.reset(n);
    closed_.reset(static_cast<std::size_t>(m));
    losses_.assign(static_cast<std::size_t>(m), std::nan(""));
    stats_ = {};
    stats_.stages.resize(static_cast<std::size_t>(p));
    failure_ = nullptr;
    auto const t0 = detail::clock::now();
    {
      std::vector<std::jthread> threads;
      threads.reserve(static_cast<std::size_t>(p - 1));
      for (int st = 1; st < p; ++st) threads.emplace_back([&, st] { stage(st, model, micro, scale, t0); });
      stage(0, model, micro, scale, t0);
    }  // joined
    detail::finish_stats(stats_, t0);
    if (failure_) {
      detail::drop_owed<Model, host>(model, split_);
      std::rethrow_exception(failure_);
    }
    double sum = 0;
    for (double l : losses_) sum += l;
    return sum;
  }

 private:
  struct links {
    thread_executor& ex;
    int Q, m;
    [[nodiscard]] std::size_t at(int q, int k) const noexcept {
      return static_cast<std::size_t>(q) * static_cast<std::size_t>(m) + static_cast<std::size_t>(k);
    }
    void before_forward(int q, int k, int) {
      if (q > 0) ex.forward_done_.wait(at(q - 1, k));
      else if (ex.split_ && k >= ex.shared_slots_) ex.closed_.wait(static_cast<std::size_t>(k - ex.shared_slots_), Q);
    }
    void closed(int, int k) { ex.closed_.add(static_cast<std::size_t>(k)); }
    void after_forward(int q, int k, int) { ex.forward_done_.add(at(q, k)); }
    // The last piece goes back after its own forward (same stage, earlier in its list).
    void before_backward(int q, int k, int) { if (q < Q - 1) ex.backward_done_.wait(at(q + 1, k)); }
    void after_backward(int q, int k, int) { ex.backward_done_.add(at(q, k)); }
  };

  template <class Model, class Batch>
  void stage(int st, Model& model, std::span<Batch const> micro, float scale, detail::clock::time_point t0) {
    links l{*this, cut_.pieces(), schedule_.micro};
    exec<host> const ex{*pools_[static_cast<std::size_t>(st)]};
    try {
      detail::run_stage(st, schedule_, cut_, model, ex, micro, scale, slots(split_), split_, l, t0,
                        stats_.stages[static_cast<std::size_t>(st)], losses_.data());
    } catch (detail::counters::stopped const&) {
      // another stage failed first; its error is the run's
    } catch (...) {
      {
        std::lock_guard lock(failure_mutex_);
        if (!failure_) failure_ = std::current_exception();
      }
      forward_done_.fail_all();
      backward_done_.fail_all();
      closed_.fail_all();
    }
  }

  schedule schedule_;
  cut cut_;
  int slots_, shared_slots_ = 1;
  bool split_ = false;  // of the current run
  std::vector<std::unique_ptr<thread_pool>> pools_;
  detail::counters forward_done_, backward_done_;
  detail::counters closed_;  // per micro-batch: the pieces that closed it (W or BW), with W apart
  std::vector<double> losses_;
  run_stats stats_;
  std::mutex failure_mutex_;
  std::exception_ptr failure_;
};

// Each block's forward and backward time on `ex` (blocks first_block() .. last_block() in slot 0,
// one block per call, the median of `reps` passes after one warm-up), as the partitioner's layer
// costs: layer i is block first_block() + i; times in seconds, memory left zero (fill it in for a
// memory limit). Gradients get += what the passes add: zero them afterwards.
template <class Model, class Batch, class B>
std::vector<layer_cost> measure_blocks(Model& model, exec<B> const& ex, Batch const& batch, int reps = 5) {
  TIDE_REQUIRE(reps >= 1, "pipeline::measure_blocks: reps = ", reps, "; pass >= 1");
  int const first = model.first_block(), last = model.last_block();
  auto const n = static_cast<std::size_t>(last - first + 1);
  std::vector<std::vector<double>> f(n), b(n);
  for (int rep = -1; rep < reps; ++rep) {
    for (int blk = first; blk <= last; ++blk) {
      auto const t0 = detail::clock::now();
      (void)model.forward_blocks(ex, blk, blk, 0, batch);
      if (rep >= 0) f[static_cast<std::size_t>(blk - first)].push_back(detail::seconds_between(t0, detail::clock::now()));
    }
    for (int blk = last; blk >= first; --blk) {
      auto const t0 = detail::clock::now();
      model.backward_blocks(ex, blk, blk, 0, 1.f);
      if (rep >= 0) b[static_cast<std::size_t>(blk - first)].push_back(detail::seconds_between(t0, detail::clock::now()));
    }
  }
  auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  std::vector<layer_cost> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = {.forward = median(f[i]), .backward = median(b[i])};
  return out;
}

// The cut of a partition (pipeline/partition.hpp) of the layers measure_blocks gave: stage s's
// layers [first, last] are blocks first_block + first .. first_block + last (one piece per stage).
inline cut cut_of(partition const& plan, int first_block) {
  cut c;
  for (stage_plan const& st : plan.stages) {
    c.first.push_back(first_block + st.first);
    c.last.push_back(first_block + st.last);
  }
  return c;
}

}  // namespace tide::pipeline
