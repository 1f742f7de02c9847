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
// After backward (and the data-parallel sum) the trainer sums wte's gradient over the ends
// (exact: x + 0, below) and both copies take the same step: they stay equal bit for bit. So a
// stage's optimizer runs after backward, not beside it (the last stage could not step wte before
// the first stage's last backward). The gradient norm counts wte once, on the first stage, and
// sums over the stages.
//
// Checkpoints. A pipelined trainer saves a checkpoint set (train/checkpoint_set.hpp) of one shard
// per rank, numbered stage + stages x replica: the first replica of each stage writes its
// stage's parameters, masters and optimizer state (under ZeRO each replica its own chunks';
// the tied embedding once, from the first stage), every rank its extra sections; the whole job
// agrees before the manifest is written.
// Sections are named by parameter, so the set loads at another shape: any stage count, any
// number of replicas, or no pipeline at all, each rank taking its own stage's tensors by name.
//
// Several pieces per stage (interleaved, zb_v, dualpipe_v): the stage's scheduler serves all of
// its pieces' blocks, each piece a run of blocks that backward visits apart (block_uses::runs;
// the blocks between them are other stages', never visited), and a block's gradients are complete
// when its run finished the step's last pass. Under a V placement the first stage runs both the
// embedding and the head, so wte is not shared between stages at all.
//
// ZeRO over the replicas: each stage shards its own chunks over its replicas (ZeRO-1, 2, 3). After
// the replicas' sum one rank of the first stage holds wte's gradient (the one that writes it to a
// checkpoint), every other rank of the `tied` group adds zeros, and every rank that steps wte
// takes the sum: one reduction, so both ends step the same bits under any ZeRO stage.
//
// W apart from B: a model built with gpt_options::split_backward runs the zero-bubble schedules'
// W's apart; the stage's offload engine serves an input pass as a moment that reads parameters
// and a weight pass as the block's backward (offload/detail/engine_step.hpp).
//
// What it does not do yet: pipeline stages on threads of one
// process run through thread_executor, outside make_trainer.

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
// replica (the data-parallel group); tied: the first and the last stage of every replica, the
// ranks that keep the tied embedding (one rank alone for the middle stages, or when
// stages == 1). Collective over `world`.
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
  int const stage = r % stages, replica = r / stages;
  bool const ends = stage == 0 || stage == stages - 1;
  C pipe = world.split(replica, stage);
  C data = world.split(stage, replica);
  C tied = world.split(ends ? 0 : 1 + r, replica * 2 + (stage == 0 ? 0 : 1));
  return {std::move(pipe), std::move(data), std::move(tied), stage, replica};
}

// ---- a stage's share of the model ---------------------------------------------------------------

// The parameters a stage's pieces read, as the offload scheduler of that stage sees them.
struct stage_part {
  static constexpr std::uint32_t elsewhere = offload::no_index;  // what the model's hooks take for "not here"
  // This stage's, in the model's order; tied (parameter::tie) only where another stage keeps a
  // copy too: the parameters whose gradient the trainer sums over the stages.
  parameter_list params{parameter_list::default_alignment};
  block_uses uses;                     // the stage's blocks, indices into params; several pieces: their runs
  std::vector<std::uint32_t> index;    // the model's parameter i: its index in params, or elsewhere
  std::vector<std::uint32_t> model;    // by index into params: the model's number of it (index's inverse)
  std::vector<bool> counted;           // by index into params: this stage counts it in the norm (its
                                       // lowest reader is here)
  std::size_t largest_elsewhere = 0;   // elements of the largest parameter of other stages
};

// Stage `stage` of schedule `s` over cut `c` (its pieces s.piece(stage, 0 .. chunks − 1)). A
// parameter read by two stages must be tied (parameter_list::tie) and read by the stages of the
// first and the last piece only (the tied embedding): its gradient is summed over those two.
// Under a V placement both are stage 0, which then holds the embedding and the head, and nothing
// is shared.
inline stage_part part_of(parameter_list const& all, block_uses const& uses, cut const& c, schedule const& s,
                          int stage) {
  TIDE_REQUIRE(c.pieces() == s.stages * s.chunks, "pipeline::part_of: the cut has ", c.pieces(), " pieces, the "
               "schedule ", s.name, " ", s.stages * s.chunks, "; cut the model with uniform_cut(model, schedule)");
  TIDE_REQUIRE(stage >= 0 && stage < s.stages, "pipeline::part_of: stage ", stage, " of ", s.stages);
  TIDE_REQUIRE(c.first.front() >= uses.first_block && c.last.back() <= uses.last_block(), "pipeline::part_of: blocks ",
               c.first.front(), " .. ", c.last.back(), " of a model of blocks ", uses.first_block, " .. ",
               uses.last_block());
  auto piece_of_block = [&](int b) {
    for (int q = 0; q < c.pieces(); ++q)
      if (b >= c.first[static_cast<std::size_t>(q)] && b <= c.last[static_cast<std::size_t>(q)]) return q;
    return -1;
  };
  auto stage_of_block = [&](int b) { return stage_of(s, piece_of_block(b)); };
  int const embed = stage_of(s, 0), head = stage_of(s, c.pieces() - 1);
  // This stage's pieces in model order: the runs of blocks its backward visits apart.
  std::vector<std::pair<int, int>> runs;
  for (int q = 0; q < c.pieces(); ++q)
    if (stage_of(s, q) == stage)
      runs.emplace_back(c.first[static_cast<std::size_t>(q)], c.last[static_cast<std::size_t>(q)]);
  auto here_block = [&](int b) { return stage_of_block(b) == stage; };
  // Of each parameter: its lowest and highest reading block, and whether a block here reads it.
  std::vector<int> lowest(all.size(), std::numeric_limits<int>::max()), highest(all.size(), std::numeric_limits<int>::min());
  std::vector<bool> here(all.size(), false), elsewhere_read(all.size(), false);
  for (int b = uses.first_block; b <= uses.last_block(); ++b)
    for (std::uint32_t i : uses.of(b)) {
      lowest[i] = std::min(lowest[i], b);
      highest[i] = std::max(highest[i], b);
      if (here_block(b)) here[i] = true;
      else elsewhere_read[i] = true;
    }
  for (std::uint32_t i = 0; i < all.size(); ++i) {
    if (lowest[i] > highest[i]) continue;  // read by no block
    bool ok = true;
    int a = -1, z = -1;  // two stages that read it
    for (int b = uses.first_block; b <= uses.last_block(); ++b)
      for (std::uint32_t j : uses.of(b))
        if (j == i) {
          int const st = stage_of_block(b);
          if (a == -1) a = st;
          else if (st != a) z = st;
          if (st != a && !((st == embed || st == head) && (a == embed || a == head))) ok = false;
        }
    TIDE_REQUIRE(ok, "pipeline::part_of: parameter \"", all[i].name(), "\" is read by blocks ", lowest[i], " .. ",
                 highest[i], " of stages ", a, " and ", z, "; a parameter shared between stages must be read by the "
                 "stages of the first and the last piece only (a tied embedding): tide sums its gradient over those two");
    TIDE_REQUIRE(z == -1 || all[i].tie >= 0, "pipeline::part_of: parameter \"", all[i].name(), "\" is read by ",
                 "stages ", a, " and ", z, " but is not tied; declare it with parameter_list::tie (each stage then "
                 "keeps a copy, their gradients summed), or cut the model so that one stage reads it");
  }
  stage_part p;
  p.params = parameter_list(all.alignment());
  p.index.assign(all.size(), stage_part::elsewhere);
  for (std::uint32_t i = 0; i < all.size(); ++i) {
    parameter const& x = all[i];
    if (!here[i]) {
      p.largest_elsewhere = std::max(p.largest_elsewhere, static_cast<std::size_t>(x.numel()));
      continue;
    }
    auto const j = static_cast<std::uint32_t>(p.params.size());
    p.params.add(x.name(), x.layer, x.shape, x.type);
    if (elsewhere_read[i]) (void)p.params.tie(x.name());  // another stage keeps a copy
    p.index[i] = j;
    p.model.push_back(i);
    p.counted.push_back(here_block(lowest[i]));
  }
  int const first = runs.front().first, last = runs.back().second;
  p.uses.first_block = first;
  for (int b = first; b <= last; ++b) {
    p.uses.params.emplace_back();
    if (here_block(b))
      for (std::uint32_t i : uses.of(b)) p.uses.params.back().push_back(p.index[i]);
  }
  if (runs.size() > 1) p.uses.runs = std::move(runs);
  return p;
}

// ---- the make_trainer policy ------------------------------------------------------------------

// One stage per rank of `group` (group->rank() is the stage), the schedule K over `micro`
// micro-batches (the optimizer's micro_steps); interleaved places `chunks` pieces on each stage,
// zb_v and dualpipe_v two in a V (the first stage then holds the embedding and the head). `tied`:
// the first and last stage of every data-parallel replica (make_groups), needed when stages > 1.
// `blocks`: the model's blocks of each piece, e.g. cut_of(partition_layers(measure_blocks(..)), ..)
// for stages of equal measured cost; empty, the uniform cut.
template <kind K, comm::Communicator C>
struct on_ranks {
  static constexpr std::string_view name = to_string(K);
  static constexpr bool one_stage_per_rank = true;
  int stages = 1;
  int micro = 1;
  C* group = nullptr;
  C* tied = nullptr;
  int chunks = 2;  // interleaved: pieces per stage (the others: as their schedule places them)
  cut blocks{};    // each piece's first and last block; empty: uniform_cut
  std::shared_ptr<rank_executor<C>> executor{};  // made at the first step (collective)

  [[nodiscard]] schedule plan() const { return generate(K, stages, micro, K == kind::interleaved ? chunks : 1); }
  [[nodiscard]] int stage() const { return group->rank(); }
  // Checks the policy against the optimizer's micro-steps and the data-parallel replicas; the
  // model's cut into the pieces.
  [[nodiscard]] cut cut_for(int first_block, int last_block, int micro_steps, int replicas = 1) const {
    TIDE_REQUIRE(group != nullptr, "pipeline::on_ranks: no group; pass .group = &groups.pipeline (make_groups)");
    TIDE_REQUIRE(group->size() == stages, "pipeline::on_ranks: stages = ", stages, " but the group has ",
                 group->size(), " ranks; one rank per stage");
    TIDE_REQUIRE(micro == micro_steps, "pipeline::on_ranks: micro = ", micro, " but the optimizer's micro_steps = ",
                 micro_steps, "; the pipeline's micro-batches are the step's micro-steps: make them equal");
    bool const end = stage() == 0 || stage() == stages - 1;
    TIDE_REQUIRE(stages == 1 || (tied != nullptr && tied->size() == (end ? 2 * replicas : 1)),
                 "pipeline::on_ranks: .tied has ", tied != nullptr ? tied->size() : 0, " ranks; pass .tied = "
                 "&groups.tied from make_groups over the ranks of one data-parallel job: on the first and the last "
                 "stage the ", 2 * replicas, " ranks of its ", replicas, " replicas that keep wte, on the others this "
                 "rank alone (pipelines that train apart, without data parallelism: make_groups over each one's "
                 "own ranks)");
    int const pieces = stages * plan().chunks;  // plan() refuses an impossible (p, m)
    if (blocks.pieces() == 0) return uniform_cut(first_block, last_block, pieces);
    check_cut(blocks, first_block, last_block, pieces);
    return blocks;
  }
  template <Backend B, class Model, class Batch>
  double run(exec<B> const& ex, Model& model, std::span<Batch const> micro_batches, float scale) {
    if (!executor)
      executor = std::make_shared<rank_executor<C>>(*group, plan(),
                                                    blocks.pieces() > 0 ? blocks : uniform_cut(model, plan()));
    return executor->run(model, ex, micro_batches, scale);
  }
  [[nodiscard]] double sum_over_stages(double x) const { return comm::sum_over_ranks(*group, x); }
  // Whether `ok` holds on every stage; stage 0's `value` on every stage (a checkpoint set's name).
  [[nodiscard]] bool all_stages(bool ok) const { return comm::all_ranks(*group, ok); }
  [[nodiscard]] std::int64_t of_stage0(std::int64_t value) const { return comm::of_rank0(*group, value); }
  // The last step's measurement of this rank's stage (null before the first).
  [[nodiscard]] run_stats const* last() const noexcept { return executor ? &executor->last() : nullptr; }
  // The sum of a shared parameter's gradient over the first and last stage of every replica
  // (tied: each calls it, for the same parameters in the same order; a middle stage has none),
  // after backward and the replicas' sum. make_trainer passes the gradient from one rank and
  // zeros from the others, so the sum is that gradient, exactly, on every rank.
  template <class T>
  void sum_shared(std::span<T> gradient) {
    if (stages > 1 && tied != nullptr && tied->size() > 1) tied->all_reduce(gradient, comm::reduce_op::sum);
  }
};

}  // namespace tide::pipeline
