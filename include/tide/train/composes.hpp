#pragma once
// Whether make_trainer takes a choice in every slot, as one concept: exactly the constraints the
// trainer's static_asserts check (train/trainer.hpp asserts this concept too, so the two cannot
// drift apart), evaluated without instantiating the trainer. A composition matrix evaluates it for
// every combination at the cost of naming types (tests/mpi/composition.cpp: 225 of them).
//
//   static_assert(tide::train::Composes<tide::nn::gpt_spec<tide::host>, tide::offload::chunked<tide::offload::belady>,
//                                       tide::optim::adamw, tide::comm::data_parallel<tide::comm::mpi>>);
//
// What it cannot see: choices refused at run time, on values (a budget too small, a pipeline of
// more stages than blocks, ZeRO on one rank). Those are tide::error with what to pass.

#include "tide/offload/scheduler.hpp"
#include "tide/train/model.hpp"
#include "tide/train/slots.hpp"

namespace tide::train {

namespace detail {
// The hooks make_trainer hands the model for these policies (the same for every offload policy;
// the scheduler type is named, not instantiated).
template <class Spec, class Offload, class Optimizer, class Comm>
using composed_hooks_t =
    offload::hooks<offload::scheduler<spec_backend_t<Spec>, spec_element_t<Spec>, Offload, Optimizer,
                                      typename Comm::sink_type, typename Comm::source_type>>;
template <class Spec, class Offload, class Optimizer, class Comm>
using composed_model_t = spec_model_t<Spec, composed_hooks_t<Spec, Offload, Optimizer, Comm>>;
}  // namespace detail

// A pipeline of one stage per rank, checked part by part: the first part missing is the message.
template <class P, class T>
consteval bool check_staged_pipeline() {
  if constexpr (one_stage_per_rank_v<P>) {
    static_assert(StagedPlacement<P>,
                  "make_trainer: a pipeline policy with one_stage_per_rank needs stage(), plan() (a pipeline::schedule) "
                  "and cut_for(first_block, last_block, micro_steps, replicas) (a pipeline::cut) "
                  "(tide::train::StagedPlacement; pipeline::on_ranks has them)");
    static_assert(StagedAgreement<P>,
                  "make_trainer: a pipeline policy with one_stage_per_rank needs all_stages(bool), of_stage0(int64) "
                  "and sum_over_stages(double) (tide::train::StagedAgreement; pipeline::on_ranks has them)");
    static_assert(StagedSharedSum<P, T>,
                  "make_trainer: a pipeline policy with one_stage_per_rank needs sum_shared(std::span<T>) for the "
                  "model's element type T (tide::train::StagedSharedSum; pipeline::on_ranks has it)");
  }
  return true;
}

// The slots one by one, then what ties them: the compression policy adapts the comm policy (the
// hooks are those of the comm policy it gives), a pipeline of a stage per rank has what the
// trainer asks of one, the spec builds a model with the trainer's hooks, and the pipeline policy
// runs that model.
template <class Spec, class Offload, class Optimizer, class Comm = no_comm, class Compress = no_compress,
          class Pipeline = no_pipeline>
concept Composes =
    OffloadPolicy<Offload> && OptimizerPolicy<Optimizer> && CommPolicy<Comm> &&
    CompressionPolicy<Compress, Comm> && PipelinePolicy<Pipeline> &&
    (!one_stage_per_rank_v<Pipeline> || StagedPipelinePolicy<Pipeline, spec_element_t<Spec>>) &&
    ModelSpec<Spec, detail::composed_hooks_t<Spec, Offload, Optimizer, compressed_comm_t<Comm, Compress>>> &&
    PipelinePolicyFor<Pipeline, detail::composed_model_t<Spec, Offload, Optimizer, compressed_comm_t<Comm, Compress>>,
                      model_batch_t<detail::composed_model_t<Spec, Offload, Optimizer, compressed_comm_t<Comm, Compress>>>,
                      spec_backend_t<Spec>>;

}  // namespace tide::train
