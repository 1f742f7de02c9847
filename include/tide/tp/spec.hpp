#pragma once
// What make_trainer builds a tensor-parallel GPT from: tp::gpt_spec, whose tensor_parallel member
// names the group. The trainer then holds this rank's shard: the offload engine chunks the shard,
// the comm policy's data-parallel group sums it with the same shard of the other replicas, the
// global gradient norm sums over the tensor group too (a replicated tensor counted once), and a
// checkpoint set keeps each shard under its rank's name, so it loads at another group size
// (what the trainer asks of such a spec: train::TensorParallelSpec, train/model.hpp).
//
//   auto g = tide::tp::make_groups(world, 2);           // tensor = rank % 2, data = rank / 2
//   auto trainer = tide::train::make_trainer(
//       tide::tp::gpt_spec<tide::comm::mpi>{.config = config, .tensor = {.group = &g.tensor, .sequence = true}},
//       tide::offload::chunked<tide::offload::belady>{...}, tide::optim::adamw{...},
//       tide::comm::data_parallel<tide::comm::mpi>{.comm = &g.data, ...});
//
// Every rank of a tensor group must be given the same micro-batches (its data rank's).
//
// In a pipeline of one stage per rank (tensor x pipeline x data parallelism): make_groups(world,
// t, p) gives the four groups, and the spec keeps in_flight slots of activations, as nn::gpt_spec:
//
//   auto g = tide::tp::make_groups(world, 2, 2);        // tensor = r % 2, stage = r / 2 % 2, data = r / 4
//   auto trainer = tide::train::make_trainer(
//       tide::tp::gpt_spec<tide::comm::mpi>{.config = c, .tensor = {.group = &g.tensor}, .in_flight = 2},
//       offload, tide::optim::adamw{.micro_steps = 4}, tide::comm::data_parallel<tide::comm::mpi>{.comm = &g.data},
//       tide::train::no_compress{}, tide::pipeline::on_ranks<tide::pipeline::kind::one_f_one_b, tide::comm::mpi>{
//           .stages = 2, .micro = 4, .group = &g.pipeline, .tied = &g.tied});

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parameters.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/nn/gpt_config.hpp"
#include "tide/tp/gpt.hpp"
#include "tide/tp/shard.hpp"

namespace tide::tp {

// The communicators of tensor-parallel groups of `size` ranks replicated over the world, tensor
// parallelism innermost (as the GPUs of one node): rank r is tensor rank r % size of data rank
// r / size. tensor: the ranks that hold one model's shards; data: the same shard of every
// replica (the data-parallel group). Collective over `world`.
template <comm::Communicator C>
struct rank_groups {
  C tensor, data;
  int tensor_rank = 0, data_rank = 0;
};
template <comm::Communicator C>
rank_groups<C> make_groups(C& world, int size) {
  int const n = world.size(), r = world.rank();
  TIDE_REQUIRE(size >= 1 && n % size == 0, "tp::make_groups: ", n, " ranks into tensor-parallel groups of ", size,
               "; the ranks must be a multiple of the group size");
  int const t = r % size, d = r / size;
  C tensor = world.split(d, t);
  C data = world.split(t, d);
  return {std::move(tensor), std::move(data), t, d};
}

// Tensor x pipeline x data: rank r is tensor rank r % t of stage (r / t) % p of data rank r / (t p),
// tensor innermost. pipeline: one tensor rank's stages of one replica (pipeline::on_ranks::group);
// data: the same shard of one stage in every replica; tied: the first and last stages' ranks of one
// tensor rank in every replica, which keep the tied embedding (pipeline::on_ranks::tied; a middle
// stage's rank alone). Collective over `world`.
template <comm::Communicator C>
struct grid_groups {
  C tensor, pipeline, data, tied;
  int tensor_rank = 0, stage = 0, data_rank = 0;
};
template <comm::Communicator C>
grid_groups<C> make_groups(C& world, int size, int stages) {
  int const n = world.size(), r = world.rank();
  TIDE_REQUIRE(size >= 1 && stages >= 1 && n % (size * stages) == 0, "tp::make_groups: ", n, " ranks into ",
               "tensor-parallel groups of ", size, " in pipelines of ", stages, " stages; the ranks must be a multiple "
               "of ", size, " x ", stages);
  int const t = r % size, s = r / size % stages, d = r / (size * stages);
  bool const ends = s == 0 || s == stages - 1;
  C tensor = world.split(s + stages * d, t);
  C pipeline = world.split(t + size * d, s);
  C data = world.split(t + size * s, d);
  C tied = world.split(ends ? t : size + r, 2 * d + (s == 0 ? 0 : 1));
  return {std::move(tensor), std::move(pipeline), std::move(data), std::move(tied), t, s, d};
}

// Tensor parallelism as a model spec's member: the group, and whether the LayerNorm regions are
// sharded along the sequence too.
template <comm::Communicator G>
struct tensor_parallel {
  G* group = nullptr;     // this rank's tensor-parallel group (make_groups(world, t).tensor)
  bool sequence = false;  // sequence parallelism
};

template <comm::Communicator G>
struct gpt_spec {
  using backend = host;
  using element_type = float;
  nn::gpt_config config{};
  tensor_parallel<G> tensor{};
  std::uint64_t seed = 1;  // nn::gpt's initialisation of the whole tensors
  int in_flight = 1;       // micro-batch slots of activations: a pipeline stage needs its schedule's
  bool separate_tied_grad = false;  // a pipeline whose ends are two stages: true (gpt_options)
  bool recompute = false;           // blocks keep only their output; backward runs them again
  template <class Hooks>
  using model_type = gpt<G, Hooks>;

  [[nodiscard]] parameter_list parameters() const { return shard_parameters(config, group().size()); }
  [[nodiscard]] block_uses uses() const { return nn::gpt_block_uses(config); }
  template <class Hooks>
  [[nodiscard]] model_type<Hooks> build(memory::device_arena<host>& arena, Hooks hooks) const {
    return model_type<Hooks>(config, group(), {.sequence = tensor.sequence, .seed = seed, .in_flight = in_flight,
                                               .separate_tied_grad = separate_tied_grad, .recompute = recompute},
                             &arena, std::move(hooks));
  }

  // What the trainer asks of a tensor-parallel spec (train::TensorParallelSpec): the group, and
  // for every parameter how it splits and its whole shape (of the model on one rank).
  [[nodiscard]] G& tensor_group() const { return group(); }
  [[nodiscard]] std::vector<split> tensor_splits() const {
    nn::gpt_config const c = nn::resolve(config);
    parameter_list const whole = nn::gpt_parameters(c, dtype::f32);
    std::vector<split> out;
    for (std::size_t i = 0; i < whole.size(); ++i) out.push_back(split_of(c, whole[i], i));
    return out;
  }
  [[nodiscard]] std::vector<shape> whole_shapes() const {
    std::vector<shape> out;
    for (parameter const& p : nn::gpt_parameters(config, dtype::f32)) out.push_back(p.shape);
    return out;
  }

 private:
  G& group() const {
    TIDE_REQUIRE(tensor.group != nullptr, "tp::gpt_spec: no group; pass .tensor = {.group = &groups.tensor} "
                 "(tp::make_groups)");
    return *tensor.group;
  }
};

}  // namespace tide::tp
