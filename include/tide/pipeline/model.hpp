#pragma once
// What the pipeline executors (pipeline/executor.hpp, pipeline/ranks.hpp) need from a model, as
// concepts: a StagedModel runs ranges of its blocks for micro-batch slots and shows the tensors
// that cross stages; a SplitBackwardModel also runs the backward in two passes (B, then W), which
// the executors run apart under a schedule with W's. nn::gpt is both (split_backward on).
// train::StagedModel adds what make_trainer needs of any model (train/model.hpp).

#include <concepts>
#include <cstddef>

#include "tide/core/exec.hpp"

namespace tide::pipeline {

// The executors call with a const exec, as they hold one per stage.
//
// Blocks numbered first_block() .. last_block(): what forward_blocks / backward_blocks take.
template <class M>
concept StagedHasBlocks = requires(M const& m) {
  { m.first_block() } -> std::convertible_to<int>;
  { m.last_block() } -> std::convertible_to<int>;
};

template <class M, class B>
concept StagedHasForwardBlocks =
    requires(M& m, exec<B> const& ex, int first, int last, int micro, typename M::batch_type const& batch) {
      { m.forward_blocks(ex, first, last, micro, batch) } -> std::convertible_to<float>;
    };

template <class M, class B>
concept StagedHasBackwardBlocks = requires(M& m, exec<B> const& ex, int first, int last, int micro, float loss_scale) {
  m.backward_blocks(ex, first, last, micro, loss_scale);
};

// The tensors a pipeline sends between stages: the activations leaving a block, and the
// gradient arriving at / leaving a stage, both views it can copy.
template <class M>
concept StagedHasBoundaries = requires(M const& m, int block, int micro) {
  { m.boundary(block, micro).data() };
  { m.boundary(block, micro).bytes() } -> std::convertible_to<std::size_t>;
  { m.boundary_grad(micro).data() };
  { m.boundary_grad(micro).bytes() } -> std::convertible_to<std::size_t>;
};

// A model the executors can run: blocks, their forward and backward by range and slot, the
// tensors that cross stages, and the batch type its micro-batches have.
template <class M, class B>
concept StagedModel = requires { typename M::batch_type; } && StagedHasBlocks<M> && StagedHasForwardBlocks<M, B> &&
                      StagedHasBackwardBlocks<M, B> && StagedHasBoundaries<M>;

// A staged model whose backward also runs as an input pass (B: the gradient at the range's
// input) and, later, a weight pass (W: the parameters' gradients), with splits_backward() saying
// whether this model was built to (nn::gpt: gpt_options::split_backward). After a step that failed
// between a B and its W, the executor calls drop_weight_passes(): the slots take forwards again.
template <class M, class B>
concept SplitBackwardModel =
    StagedModel<M, B> && requires(M& m, M const& cm, exec<B> const& ex, int first, int last, int micro, float scale) {
      m.backward_input_blocks(ex, first, last, micro, scale);
      m.backward_weight_blocks(ex, first, last, micro);
      { cm.splits_backward() } -> std::convertible_to<bool>;
      m.drop_weight_passes();
    };

}  // namespace tide::pipeline
