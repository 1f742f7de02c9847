#pragma once
// Pipeline parallelism in make_trainer: one stage per rank, each rank's trainer holding only its
// stage's parameters (and their gradients, masters and optimizer state, placed by its offload
// policy), data parallelism across replicas of the pipeline.
//
//   tide::comm::mpi world{session};
//   auto g = tide::pipeline::make_groups(world, 2);        // stage = rank % 2, replica = rank / 2
//   auto trainer = tide::train::make_trainer(
//       tide::nn::gpt_spec<tide::host>{.config = c, .options = {.in_flight = 2, .separate_tied_grad = true}},
//       tide::offload::chunked<tide::offload::belady>{...},   // offload inside each stage
//       tide::optim::adamw{.lr = 1e-3f, .micro_steps = 8},
//       tide::comm::data_parallel<tide::comm::mpi>{.comm = &g.data},   // or tide::train::no_comm{}
//       tide::train::no_compress{},
//       tide::pipeline::on_ranks<tide::pipeline::kind::one_f_one_b, tide::comm::mpi>{
//           .stages = 2, .micro = 8, .group = &g.pipeline, .tied = &g.tied});
//   trainer.step(micro_batches);     // every rank passes the same 8 micro-batches
//
// How a stage's trainer differs from a whole model's: the model is cut uniformly into `stages`
// pieces (pipeline::uniform_cut); the trainer gives its offload scheduler the parameters the
// stage's blocks read (part_of below) and the model's hooks map the model's parameter numbers to
// the scheduler's; the pipeline's executor (pipeline/ranks.hpp) runs the stage's forwards and
// backwards in the schedule's order. Then every rank agrees (over its pipeline and over the
// replicas) that every stage of every replica ran, and only then hands its gradients to the
// data-parallel sink (scheduler_options::defer_sink): a step lost on one rank is lost on every
// rank alike, before anything was summed. The optimizer steps after the sums.
//
// The tied embedding. wte is read by the embedding (first stage) and the head (last stage), so
// both keep a copy and step it. The head's share of its gradient travels to the first stage per
// micro-batch (the executor), so the first stage holds the whole gradient and the last one zero.
// After backward (and the data-parallel sum) the trainer sums wte's gradient over the two (exact:
// x + 0) and both copies take the same step: they stay equal bit for bit (Megatron's embedding
// group does the same). So a stage's optimizer runs after backward, not beside it (the last stage
// could not step wte before the first stage's last backward). The gradient norm counts wte once,
// on the first stage, and sums over the stages.
//
// Checkpoints. A pipelined trainer saves a checkpoint set (train/checkpoint_set.hpp) of one shard
// per rank, numbered stage + stages x replica: the first replica of each stage writes its
// stage's parameters, masters and optimizer state (under ZeRO-1 each replica its own chunks';
// the tied embedding once, from the first stage), every rank its extra sections; the whole job
// agrees before the manifest is written.
// Sections are named by parameter, so the set loads at another shape: any stage count, any
// number of replicas, or no pipeline at all, each rank taking its own stage's tensors by name.
//
// What it does not do yet: schedules of one piece per stage only (gpipe, one_f_one_b, zb_h1,
// zb_h2; interleaved, zb_v and dualpipe_v need a scheduler that serves two block ranges); ZeRO-1
// over the replicas, not ZeRO-2 or 3 (the tied embedding's gradient is summed after the
// replicas' sum, which ZeRO-2 leaves on each chunk's owner only); no compressing gradient sink;
// pipeline stages on threads of one process run through thread_executor, outside make_trainer.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parameters.hpp"
#include "tide/offload/hooks.hpp"
#include "tide/pipeline/executor.hpp"
#include "tide/pipeline/ranks.hpp"
#include "tide/pipeline/schedule.hpp"

namespace tide::pipeline {

// ---- the ranks --------------------------------------------------------------------------------

// The communicators of `stages`-stage pipelines replicated over the world: rank r is stage
// r % stages of replica r / stages. pipeline: the replica's stages; data: the same stage of every
// replica (the data-parallel group); tied: the replica's first and last stage (one rank alone
// when stages == 1, or for the middle stages). Collective over `world`.
template <comm::Communicator C>
struct rank_groups {
  C pipeline, data, tied;
  int stage = 0, replica = 0;
};
template <comm::Communicator C>
rank_groups<C> make_groups(C& world, int stages) {
  int const n = world.size(), r = world.rank();
  TIDE_REQUIRE(stages >= 1 && n % stages == 0, "pipeline::make_groups: ", n, " ranks into pipelines of ", stages,
               " stages; the ranks must be a multiple of the stages");
  int const stage = r % stages, replica = r / stages, replicas = n / stages;
  bool const ends = stage == 0 || stage == stages - 1;
  C pipe = world.split(replica, stage);
  C data = world.split(stage, replica);
  C tied = world.split(ends ? replica : replicas + r, stage);
  return {std::move(pipe), std::move(data), std::move(tied), stage, replica};
}

// ---- a stage's share of the model ---------------------------------------------------------------

// The parameters blocks first .. last read, as the offload scheduler of that stage sees them.
struct stage_part {
  static constexpr std::uint32_t elsewhere = offload::no_index;  // what the model's hooks take for "not here"
  parameter_list params{parameter_list::default_alignment};  // this stage's, in the model's order
  block_uses uses;                     // blocks first .. last, indices into params
  std::vector<std::uint32_t> index;    // the model's parameter i: its index in params, or elsewhere
  std::vector<std::uint32_t> shared;   // indices into params also read by another stage (wte)
  std::vector<bool> counted;           // by index into params: this stage counts it in the norm (its
                                       // lowest reader is here)
  std::size_t largest_elsewhere = 0;   // elements of the largest parameter of other stages
};

// Stage `stage` of cut `c` (one piece per stage). A parameter read by two stages must be read by
// the first and the last only (the tied embedding): its gradient is summed over those two.
inline stage_part part_of(parameter_list const& all, block_uses const& uses, cut const& c, int stage) {
  TIDE_REQUIRE(stage >= 0 && stage < c.pieces(), "pipeline::part_of: stage ", stage, " of ", c.pieces());
  auto const us = static_cast<std::size_t>(stage);
  int const first = c.first[us], last = c.last[us];
  TIDE_REQUIRE(first >= uses.first_block && first <= last && last <= uses.last_block(), "pipeline::part_of: blocks ",
               first, " .. ", last, " of a model of blocks ", uses.first_block, " .. ", uses.last_block());
  auto stage_of_block = [&](int b) {
    for (int q = 0; q < c.pieces(); ++q)
      if (b >= c.first[static_cast<std::size_t>(q)] && b <= c.last[static_cast<std::size_t>(q)]) return q;
    return -1;
  };
  int const ends = c.pieces() - 1;
  std::vector<int> lowest(all.size(), std::numeric_limits<int>::max()), highest(all.size(), std::numeric_limits<int>::min());
  std::vector<bool> here(all.size(), false);
  for (int b = uses.first_block; b <= uses.last_block(); ++b)
    for (std::uint32_t i : uses.of(b)) {
      lowest[i] = std::min(lowest[i], b);
      highest[i] = std::max(highest[i], b);
      if (b >= first && b <= last) here[i] = true;
    }
  for (std::uint32_t i = 0; i < all.size(); ++i) {
    if (lowest[i] > highest[i]) continue;  // read by no block
    int const a = stage_of_block(lowest[i]), z = stage_of_block(highest[i]);
    bool ok = a == z || (a == 0 && z == ends);
    for (int b = uses.first_block; b <= uses.last_block() && ok && a != z; ++b)
      for (std::uint32_t j : uses.of(b))
        if (j == i && stage_of_block(b) != 0 && stage_of_block(b) != ends) ok = false;
    TIDE_REQUIRE(ok, "pipeline::part_of: parameter \"", all[i].name(), "\" is read by blocks ", lowest[i], " .. ",
                 highest[i], " of stages ", a, " .. ", z, "; a parameter shared between stages must be read by the "
                 "first and the last stage only (a tied embedding): tide sums its gradient over those two");
  }
  stage_part s;
  s.params = parameter_list(all.alignment());
  s.index.assign(all.size(), stage_part::elsewhere);
  for (std::uint32_t i = 0; i < all.size(); ++i) {
    parameter const& p = all[i];
    if (!here[i]) {
      s.largest_elsewhere = std::max(s.largest_elsewhere, static_cast<std::size_t>(p.numel()));
      continue;
    }
    auto const j = static_cast<std::uint32_t>(s.params.size());
    s.params.add(p.name(), p.layer, p.shape, p.type);
    s.index[i] = j;
    s.counted.push_back(lowest[i] >= first);
    if (lowest[i] < first || highest[i] > last) s.shared.push_back(j);
  }
  s.uses.first_block = first;
  for (int b = first; b <= last; ++b) {
    s.uses.params.emplace_back();
    for (std::uint32_t i : uses.of(b)) s.uses.params.back().push_back(s.index[i]);
  }
  return s;
}

// ---- the make_trainer policy ------------------------------------------------------------------

// One stage per rank of `group` (group->rank() is the stage), the schedule K over `micro`
// micro-batches (the optimizer's micro_steps). `tied`: the communicator of this pipeline's first
// and last stage (make_groups), needed when stages > 1.
template <kind K, comm::Communicator C>
struct on_ranks {
  static_assert(K == kind::gpipe || K == kind::one_f_one_b || K == kind::zb_h1 || K == kind::zb_h2,
                "pipeline::on_ranks: make_trainer's pipeline runs one piece of the model per stage: pass kind::gpipe, "
                "one_f_one_b, zb_h1 or zb_h2 (interleaved and zb_v run on thread_executor or rank_executor)");
  static constexpr std::string_view name = to_string(K);
  static constexpr bool one_stage_per_rank = true;
  int stages = 1;
  int micro = 1;
  C* group = nullptr;
  C* tied = nullptr;
  std::shared_ptr<rank_executor<C>> executor{};  // made at the first step (collective)

  [[nodiscard]] schedule plan() const { return generate(K, stages, micro, 1); }
  [[nodiscard]] int stage() const { return group->rank(); }
  // Checks the policy against the optimizer's micro-steps; the model's cut into the stages.
  [[nodiscard]] cut cut_for(int first_block, int last_block, int micro_steps) const {
    TIDE_REQUIRE(group != nullptr, "pipeline::on_ranks: no group; pass .group = &groups.pipeline (make_groups)");
    TIDE_REQUIRE(group->size() == stages, "pipeline::on_ranks: stages = ", stages, " but the group has ",
                 group->size(), " ranks; one rank per stage");
    TIDE_REQUIRE(micro == micro_steps, "pipeline::on_ranks: micro = ", micro, " but the optimizer's micro_steps = ",
                 micro_steps, "; the pipeline's micro-batches are the step's micro-steps: make them equal");
    bool const end = stage() == 0 || stage() == stages - 1;
    TIDE_REQUIRE(stages == 1 || (tied != nullptr && tied->size() == (end ? 2 : 1)), "pipeline::on_ranks: pass "
                 ".tied = &groups.tied (make_groups): on the first and the last stage the two ranks that both keep "
                 "wte, on the others this rank alone");
    (void)plan();  // refuses an impossible (p, m)
    return uniform_cut(first_block, last_block, stages);
  }
  template <Backend B, class Model, class Batch>
  double run(exec<B> const& ex, Model& model, std::span<Batch const> micro_batches, float scale) {
    if (!executor) executor = std::make_shared<rank_executor<C>>(*group, plan(), uniform_cut(model, plan()));
    return executor->run(model, ex, micro_batches, scale);
  }
  [[nodiscard]] double sum_over_stages(double x) const { return comm::sum_over_ranks(*group, x); }
  // Whether `ok` holds on every stage; stage 0's `value` on every stage (a checkpoint set's name).
  [[nodiscard]] bool all_stages(bool ok) const { return comm::all_ranks(*group, ok); }
  [[nodiscard]] std::int64_t of_stage0(std::int64_t value) const { return comm::of_rank0(*group, value); }
  // The last step's measurement of this rank's stage (null before the first).
  [[nodiscard]] run_stats const* last() const noexcept { return executor ? &executor->last() : nullptr; }
  // The sum of a shared parameter's gradient over the first and last stage (tied: both call it,
  // for the same parameters in the same order; a middle stage has none), after backward.
  template <class T>
  void sum_shared(std::span<T> gradient) {
    if (stages > 1 && tied != nullptr && tied->size() > 1) tied->all_reduce(gradient, comm::reduce_op::sum);
  }
};

}  // namespace tide::pipeline
