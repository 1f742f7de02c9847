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
  template <class Hooks>
  using model_type = gpt<G, Hooks>;

  [[nodiscard]] parameter_list parameters() const { return shard_parameters(config, group().size()); }
  [[nodiscard]] block_uses uses() const { return nn::gpt_block_uses(config); }
  template <class Hooks>
  [[nodiscard]] model_type<Hooks> build(memory::device_arena<host>& arena, Hooks hooks) const {
    return model_type<Hooks>(config, group(), {.sequence = tensor.sequence, .seed = seed}, &arena, std::move(hooks));
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
