#pragma once
// The slots of make_trainer, each a concept, all declared here:
//
//   make_trainer(spec, offload, optimizer, comm, compression, pipeline)
//
//   ModelSpec          what to build: model_type<Hooks>, build(arena, hooks), parameters(), uses()
//                      (train/model.hpp checks it member by member)
//   OffloadPolicy      a scheduler policy: where model data lives and when it moves
//                      (offload/scheduler_policy.hpp; resident, chunked<P>, layer_window<W>,
//                      static_partition, or your own)
//   OptimizerPolicy    an optimizer the engine calls per chunk (optim/optimizer.hpp) with the
//                      knobs the trainer reads: schedule, clip_norm, micro_steps,
//                      decay_matrices_only, scaling (optim::adamw, adam, sgd)
//   CommPolicy         this process's rank among world_size, the gradient sink the engine hands
//                      each completed chunk to (offload/gradient_sink.hpp) and the chunk source
//                      that fills a fetched parameter chunk (offload/chunk_source.hpp); on more
//                      than one process also RankAgreement; no_comm: one process, no sink,
//                      chunks copied from the host
//   CompressionPolicy  an adapter over the comm policy's reducer: over(comm) gives the comm policy
//                      the trainer runs (compress::error_feedback and compress::powersgd give a
//                      compressing sink over the comm's ranks and ZeRO stage; no_compress gives
//                      the comm policy itself)
//   PipelinePolicy     owns the step loop: runs forward and backward over the micro-batches of one
//                      step; no_pipeline is the plain loop, micro-batch after micro-batch
//
// The trainer stores every policy object it is given (trainer::comm(), pipeline(), ...); nothing
// on the step path is dispatched at run time. A wrong argument fails with a static_assert naming
// the slot and what it needs (tests/compile_fail/trainer_wrong_*.cpp).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "tide/core/backend.hpp"
#include "tide/core/exec.hpp"
#include "tide/offload/chunk_source.hpp"
#include "tide/offload/gradient_sink.hpp"
#include "tide/offload/scheduler_policy.hpp"
#include "tide/optim/optimizer.hpp"
#include "tide/optim/training.hpp"
#include "tide/pipeline/run_stats.hpp"
#include "tide/pipeline/schedule.hpp"
#include "tide/pipeline/slots.hpp"

namespace tide::train {

template <class O>
concept OffloadPolicy = offload::SchedulerPolicy<O>;

template <class O>
concept OptimizerPolicy = optim::Optimizer<O> && requires(O const& o, float lr) {
  { o.schedule(lr, std::int64_t{0}) } -> std::convertible_to<float>;
  { o.clip_norm } -> std::convertible_to<float>;
  { o.micro_steps } -> std::convertible_to<int>;
  { o.decay_matrices_only } -> std::convertible_to<bool>;
  { o.scaling } -> std::convertible_to<optim::loss_scaling>;
};

template <class C>
concept CommPolicy = requires(C const& c) {
  { C::name } -> std::convertible_to<std::string_view>;
  { c.rank() } -> std::convertible_to<int>;
  { c.world_size() } -> std::convertible_to<int>;
  typename C::sink_type;
  { c.sink() } -> std::same_as<typename C::sink_type>;
  typename C::source_type;
  { c.source() } -> std::same_as<typename C::source_type>;
} && offload::GradientSink<typename C::sink_type> && offload::ChunkSource<typename C::source_type>;

// What the trainer asks of the ranks besides gradients: whether `ok` holds on every rank (a
// checkpoint that failed on one fails on all), rank 0's value on every rank (a set's name), the
// sum over ranks (ZeRO's gradient norm). A comm policy of more than one process must have them:
// the trainer refuses one without them when world_size() > 1 (comm::data_parallel and the
// compressing sinks have them; no_comm, one process, needs none).
template <class C>
concept RankAgreement = requires(C const& c, bool ok, std::int64_t v, double x) {
  { c.all_ranks(ok) } -> std::convertible_to<bool>;
  { c.of_rank0(v) } -> std::convertible_to<std::int64_t>;
  { c.sum_over_ranks(x) } -> std::convertible_to<double>;
};

// Optional: a gradient sink that counts what it summed over the ranks, read for a step's
// bytes_reduced: stats().bytes (the gradient bytes it summed, comm::data_parallel's sink), or else
// stats().wire_bytes (the bytes it sent, a compressing sink's); without either a step reports 0.
template <class S>
concept CountingSink = requires(S const& s) {
  { s.stats().bytes } -> std::convertible_to<std::uint64_t>;
} || requires(S const& s) {
  { s.stats().wire_bytes } -> std::convertible_to<std::uint64_t>;
};
// What a CountingSink counted so far (0 for another sink).
template <class S>
[[nodiscard]] std::uint64_t bytes_counted(S const& sink) {
  if constexpr (requires { sink.stats().bytes; }) return sink.stats().bytes;
  else if constexpr (CountingSink<S>) return sink.stats().wire_bytes;
  else return 0;
}

// Optional: a comm policy that shards over its ranks says which ZeRO stage (0: none, 1: optimizer
// state, 2: and gradients, 3: and parameters); without `zero` the trainer takes 0.
template <class C>
concept ShardingPolicy = requires(C const& c) {
  { c.zero } -> std::convertible_to<int>;
};

// X compresses what the comm policy Comm reduces: x.over(comm) is the comm policy the trainer
// runs. A compressor keeps its per-chunk state (an error-feedback residual) as that policy's
// sink's extra lists (offload/gradient_sink.hpp), so the engine moves, undoes and checkpoints it.
template <class X, class Comm>
concept CompressionPolicy = requires(X const& x, Comm const& comm) {
  { X::name } -> std::convertible_to<std::string_view>;
  { x.over(comm) } -> CommPolicy;
};
// The comm policy a trainer runs: Comm under compression X.
template <class Comm, class X>
using compressed_comm_t = std::remove_cvref_t<decltype(std::declval<X const&>().over(std::declval<Comm const&>()))>;

// P runs the forward and backward passes of one step over `micro` for Model, returning the sum of
// the micro-batches' losses.
template <class P, class Model, class Batch, class B>
concept PipelinePolicyFor = requires(P& p, exec<B> const& ex, Model& m, std::span<Batch const> micro, float scale) {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::stages } -> std::convertible_to<int>;
  { p.run(ex, m, micro, scale) } -> std::convertible_to<double>;
};
// The part a pipeline policy shows before a model is chosen.
template <class P>
concept PipelinePolicy = requires {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::stages } -> std::convertible_to<int>;
};

// A pipeline of one stage per rank (pipeline::on_ranks): its `one_stage_per_rank` says so, and
// the rank's trainer then holds its stage's parameters only. What make_trainer asks of it, in
// three parts (one message each when missing):
// where the stage is: stage(), the schedule (plan()), the model's cut into its pieces for the
// blocks, the optimizer's micro-steps and the data-parallel replicas (cut_for);
template <class P>
concept StagedPlacement = requires(P const& p, int i) {
  { P::one_stage_per_rank } -> std::convertible_to<bool>;
  { p.stage() } -> std::convertible_to<int>;
  { p.plan() } -> std::same_as<pipeline::schedule>;
  { p.cut_for(i, i, i, i) } -> std::same_as<pipeline::cut>;
};
// the agreement of the stages: whether `ok` holds on every stage, stage 0's value on every stage,
// the sum over the stages;
template <class P>
concept StagedAgreement = requires(P const& p, bool ok, std::int64_t v, double x) {
  { p.all_stages(ok) } -> std::convertible_to<bool>;
  { p.of_stage0(v) } -> std::convertible_to<std::int64_t>;
  { p.sum_over_stages(x) } -> std::convertible_to<double>;
};
// and the sum of a shared parameter's gradient over the stages that hold it (the tied embedding).
template <class P, class T>
concept StagedSharedSum = requires(P& p, std::span<T> gradient) { p.sum_shared(gradient); };
template <class P, class T>
concept StagedPipelinePolicy = PipelinePolicy<P> && StagedPlacement<P> && StagedAgreement<P> && StagedSharedSum<P, T>;
// Whether P declares itself a pipeline of one stage per rank.
template <class P>
inline constexpr bool one_stage_per_rank_v = requires { P::one_stage_per_rank; };

// Optional: the last step's measurements (pipeline::run_stats; null before the first), whose
// bubble_fraction the trainer reports; without last() a step's bubble_fraction stays -1.
template <class P>
concept MeasuredPipeline = requires(P const& p) {
  { p.last() } -> std::convertible_to<pipeline::run_stats const*>;
};

// ---- the single-process, single-stage policies ---------------------------------------------------
struct no_comm {
  static constexpr std::string_view name = "none";
  using sink_type = offload::no_sink;
  using source_type = offload::host_source;
  [[nodiscard]] constexpr int rank() const noexcept { return 0; }
  [[nodiscard]] constexpr int world_size() const noexcept { return 1; }
  [[nodiscard]] constexpr sink_type sink() const noexcept { return {}; }
  [[nodiscard]] constexpr source_type source() const noexcept { return {}; }
};

struct no_compress {
  static constexpr std::string_view name = "none";
  template <class Comm>
  [[nodiscard]] constexpr Comm over(Comm const& comm) const {
    return comm;
  }
};

// Forward then backward, micro-batch after micro-batch: gradients accumulate in the model's
// (or the engine's) gradient buffers; the loss gradient of each is scaled by `scale`.
struct no_pipeline {
  static constexpr std::string_view name = "none";
  static constexpr int stages = 1;
  template <Backend B, class Model, class Batch>
  double run(exec<B> const& ex, Model& model, std::span<Batch const> micro, float scale) {
    double loss = 0;
    for (Batch const& b : micro) {
      loss += static_cast<double>(model.forward(ex, b));
      model.backward(ex, scale);
    }
    return loss;
  }
};

static_assert(CommPolicy<no_comm> && CompressionPolicy<no_compress, no_comm> && PipelinePolicy<no_pipeline>);

}  // namespace tide::train
