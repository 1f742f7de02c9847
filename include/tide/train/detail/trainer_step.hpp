#pragma once
// make_trainer's step, out of line (the class is in train/trainer.hpp, which includes this file):
// one step over the micro-batches, the pipeline's run (and the stage's share of the model it
// runs), the global gradient norm, and the undo of a step that threw.

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>

#include "tide/train/trainer.hpp"

namespace tide::train {

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
step_stats
trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::step(std::span<batch_type const> micro_batches) {
  auto const m = static_cast<std::size_t>(optimizer_.micro_steps);
  TIDE_REQUIRE(micro_batches.size() == m, "trainer::step: ", micro_batches.size(),
               " micro-batches given, the optimizer accumulates micro_steps = ", m, "; pass exactly that many");
  std::size_t const refusals = arena_.refusals();
  try {
    return run_step(micro_batches);
  } catch (tide::error const& e) {
    scheduler_.abort_step();
    // The arena refused the model's own activations before the scheduler placed anything: say
    // what the budget must hold, as the scheduler's own check does.
    std::size_t const non_model = arena_.stats().in_use + arena_.last_refused();
    if (e.category() == errc::budget && !scheduler_.placed() && arena_.refusals() != refusals &&
        non_model > arena_.config().budget) {
      std::size_t const need = scheduler_.minimum_device_bytes(non_model);
      TIDE_FAIL(budget, "make_trainer: device_budget ", bytes_of{arena_.config().budget},
                " cannot hold the activations and workspaces of this batch (the model asked for ",
                bytes_of{arena_.last_refused()}, " more with ", bytes_of{arena_.stats().in_use},
                " in use); offload ", scheduler_type::name(), " then needs at least ", bytes_of{need}, " = ",
                scheduler_.minimum_explained(non_model), "; raise device_budget to at least ", bytes_of{need},
                ", or use a smaller batch or sequence");
    }
    throw;
  } catch (...) {
    scheduler_.abort_step();
    throw;
  }
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
pipeline::stage_part trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::stage_of(Spec const& spec,
                                                                                      Pipeline const& pipe,
                                                                                      comm_type const& comm,
                                                                                      Optimizer const& opt) {
  if constexpr (staged) {
    block_uses const uses = spec.uses();
    pipeline::cut const c = pipe.cut_for(uses.first_block, uses.last_block(), opt.micro_steps, comm.world_size());
    return pipeline::part_of(spec.parameters(), uses, c, pipe.plan(), pipe.stage());
  } else {
    (void)spec, (void)pipe, (void)comm, (void)opt;
    return {};
  }
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
double trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::gradient_norm() {
  auto const g = scheduler_.gradients();
  // ZeRO-2 and 3: a rank holds the summed gradients of its own chunks only.
  bool const sharded_grads = RankAgreement<comm_type> && zero_stage() >= 2 && comm_.world_size() > 1;
  if (!staged && !tensor_parallel && !sharded_grads) return norm_of(g);
  // Each parameter once (wte on the first stage, not the last; a replicated tensor on tensor
  // rank 0; under ZeRO-2 and 3 the replica's own chunks), its squares summed over the replicas,
  // the stages and the tensor-parallel group (a non-finite one poisons the sum on every rank).
  owned_grads_.clear();
  for (std::uint32_t j = 0; j < g.size(); ++j) {
    bool counted = tensor_.counts(whole(j));
    if constexpr (staged) counted = counted && stage_.counted[j];
    if (counted && (!sharded_grads || scheduler_.keeps_state(j))) owned_grads_.push_back(g[j]);
  }
  double const local = norm_of(owned_grads_);
  double sq = local * local;
  if constexpr (RankAgreement<comm_type>)
    if (sharded_grads) sq = comm_.sum_over_ranks(sq);
  if constexpr (staged) sq = pipeline_.sum_over_stages(sq);
  return std::sqrt(tensor_.sum(sq));
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
double
trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::run_pipeline(std::span<batch_type const> micro_batches,
                                                                          float loss_scale) {
  if constexpr (staged) {
    double loss = 0;
    std::exception_ptr failure;
    try {
      loss = pipeline_.run(ex_, model_, micro_batches, loss_scale);
    } catch (...) {
      failure = std::current_exception();
    }
    bool const everywhere = agree(!failure);
    if (failure) std::rethrow_exception(failure);
    TIDE_CHECK(everywhere, usage, "make_trainer: a pipeline stage of another data-parallel replica failed in "
                                  "this step (its error says why); the step is dropped on every rank");
    scheduler_.hand_over_gradients();
    // The tied embedding: after the replicas' sum, one rank of the first stage holds its whole
    // gradient for this replica set (the rank that writes it to a checkpoint: under ZeRO the owner
    // of its chunk, else the first replica), every other end rank adds zeros, and every rank that
    // steps it (keeps its state) takes the sum: one reduction, so both ends step the same bits
    // under any ZeRO stage and any number of replicas.
    auto const& params = scheduler_.parameters();
    for (std::uint32_t j = 0; j < params.size(); ++j) {
      if (params[j].tie < 0) continue;  // tied in a stage's list: another stage keeps a copy
      bool const gives = writes(j), takes = scheduler_.keeps_state(j);
      std::size_t const n = params[j].numel();
      shared_.assign(n, element_type{});
      std::span<element_type> const g = gives || takes ? scheduler_.gradient_of(j) : std::span<element_type>{};
      if (gives) memory::read_to_host(ex_, shared_.data(), g.data(), g.size_bytes());
      pipeline_.sum_shared(std::span<element_type>(shared_));
      if (takes) memory::write_from_host(ex_, g.data(), shared_.data(), g.size_bytes());
    }
    return loss;
  } else {
    return pipeline_.run(ex_, model_, micro_batches, loss_scale);
  }
}

template <class Spec, class Offload, class Optimizer, class Comm, class Compress, class Pipeline>
step_stats
trainer<Spec, Offload, Optimizer, Comm, Compress, Pipeline>::run_step(std::span<batch_type const> micro_batches) {
  auto const m = static_cast<std::size_t>(optimizer_.micro_steps);
  auto const t0 = std::chrono::steady_clock::now();
  step_stats st;
  st.step = step_ + 1;
  st.lr = optimizer_.schedule(optimizer_.lr, step_);
  st.loss_scale = scaler_.scale();
  scheduler_.set_learning_rate(st.lr);
  // The gradient is the sum over micro-batches and, with data parallelism, over ranks (the sink
  // sums): the mean is the sum times inv, exact for powers of two.
  float const inv = 1.f / (st.loss_scale * static_cast<float>(m) * static_cast<float>(comm_.world_size()));
  if (!needs_all_gradients(optimizer_)) scheduler_.set_grad_scale(inv);
  std::size_t const reduced_before = bytes_reduced();
  double const loss = run_pipeline(micro_batches, st.loss_scale);
  for (batch_type const& b : micro_batches) st.tokens += model_type::tokens_in(b);
  if constexpr (MeasuredPipeline<Pipeline>)
    if (auto const* ran = pipeline_.last()) st.bubble_fraction = ran->bubble_fraction;
  st.loss = static_cast<float>(loss / static_cast<double>(m));
  if (needs_all_gradients(optimizer_)) {
    double const norm = gradient_norm();
    st.skipped = !std::isfinite(norm);
    if (st.skipped) {
      scheduler_.skip_step();
    } else {
      st.grad_norm = norm * static_cast<double>(inv);
      float const clip = optimizer_.clip_norm > 0.f ? kernels::clip_scale(st.grad_norm, optimizer_.clip_norm) : 1.f;
      scheduler_.set_grad_scale(clip * inv);
      scheduler_.step();
    }
    scaler_.update(st.skipped);
  } else {
    scheduler_.step();
  }
  ++step_;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.tokens_per_s = st.seconds > 0 ? static_cast<double>(st.tokens) / st.seconds : 0;
  st.offload = scheduler_.last_step();
  st.device_bytes = st.offload.peak_device_bytes;
  st.host_bytes = st.offload.host_model_bytes;
  st.bytes_moved = st.offload.bytes_moved();
  st.stall_ms = st.offload.stall_ms;
  st.bytes_reduced = bytes_reduced() - reduced_before;  // the step drained its sink
  return st;
}

}  // namespace tide::train
