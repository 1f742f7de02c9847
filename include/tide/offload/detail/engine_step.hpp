#pragma once
// The offload engine's step, out of line (the class is in detail/engine_core.hpp): a block's
// moment entered and left, the gradients handed over, a step finished or undone, the placement
// at the first moment, and draining. A step that threw is undone by abort_step(): each part's
// abort() (the sinks, the shard map, the update runner, the NVMe tier, the journals), then the
// step's own state.
//
// One step, for chunked<P>:
//   pre_forward(b)   the chunks of b's parameters become resident (a victim's device block is
//                    handed over: its copy to the host and the new copy in run in order on the
//                    copy stream), tensors -> COMPUTE; then the next moments' chunks are
//                    prefetched as far as the budget allows (belady: also by evicting a chunk
//                    used later than the one fetched)
//   post_forward(b)  tensors -> HOLD_AFTER_FWD
//   pre_backward_input(b), post_backward_input(b)
//                    a split backward's input pass (a zero-bubble pipeline's B): as forward,
//                    the parameter chunks only; the weight pass that follows is b's backward
//   pre_backward(b)  parameter and gradient chunks resident (a FREE gradient chunk is created
//                    zero-filled: no copy), tensors -> COMPUTE
//   post_backward(b) tensors -> HOLD_AFTER_BWD; every chunk whose last backward use was b
//                    (reuse_grad_slots: its gradient block first becomes its parameter chunk's
//                    payload) goes to READY_FOR_REDUCE and to the sink, then is stepped (after
//                    the sink's event): on the device when its state is there, else its parameter and
//                    gradient chunks are copied to the host and the host update runs on the
//                    optimizer worker beside the rest of backward; the gradient chunk is freed
//   step()           waits for the optimizer, ends the step (the warm-up step becomes the trace)

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <thread>

#include "tide/offload/detail/engine_core.hpp"

namespace tide::offload::detail {

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::enter(int block, chunk::phase ph) {
  TIDE_CHECK(block >= store_.uses_.first_block && block <= store_.uses_.last_block() && this->backward_.in_a_run(block),
             usage, "offload ", P::name(), ": block ", block, " is not one of uses() (", store_.uses_.first_block, "..",
             store_.uses_.last_block(), this->backward_.one_run() ? "" : ", in one of its runs", ")");
  TIDE_CHECK(!res_.access_.in_block(), usage, "offload ", P::name(), ": block ", block, " entered while block ",
             res_.access_.block(), " is still open; call post_forward / post_backward of each block before the next");
  if (this->evaluating_) {
    TIDE_REQUIRE(ph == chunk::phase::forward, "offload::scheduler: a ", chunk::to_string(ph), " during evaluation; call "
                                              "end_evaluation() before training");
    this->require_intact();
    if (!this->placed_) this->first_placement();
    if (store_.tracing()) compute_lane_.open(store_.ex_, store_.copy_stream_);
    res_.plan_.tick();
    store_.reclaim_stale(false);
    this->gather_for(block, ph);
    res_.make_resident(res_.ids_of(block, ph), store::untraced);
    for (std::uint32_t i : store_.uses_.of(block)) store_.param_.transition(i, chunk::tensor_state::compute);
    this->gather_ahead(block, ph);
    res_.access_.open(store_.uses_.of(block), block, ph);
    return;
  }
  this->begin_step_if_needed();  // may drain (the first placement): the span opens after it
  if (store_.tracing()) compute_lane_.open(store_.ex_, store_.copy_stream_);
  res_.plan_.tick();
  store_.reclaim_stale(false);
  auto const& ids = res_.ids_of(block, ph);
  // Backward writes its gradient chunks (ids n..2n-1); under reuse_grad_slots, also the parameter
  // chunks completing there (they take their gradients, which have no other copy).
  written_.clear();
  if (ph == chunk::phase::backward)
    for (std::uint32_t id : ids)
      if (id >= store_.n_ || (this->options_.reuse_grad_slots && std::ranges::count(res_.completes_at(block), id) != 0))
        written_.push_back(id);
  std::size_t const t = res_.plan_.tracer.at({block, ph}, ids, {}, {}, written_);
  res_.current_ = t;
  this->gather_for(block, ph);
  res_.make_resident(ids, t);
  for (std::uint32_t i : store_.uses_.of(block)) {
    store_.param_.transition(i, chunk::tensor_state::compute);
    if (ph == chunk::phase::backward) store_.grad_.transition(i, chunk::tensor_state::compute);
  }
  sample_non_model();
  res_.tide_.push_back({{block, ph}, store_.model_on_device(), store_.non_model_now(), res_.plan_.ctx.budget});
  this->gather_ahead(block, ph);  // the next moment's chunks, before the prefetches take the room
  res_.prefetch(t);
  add_moves_to_last_sample();
  res_.access_.open(store_.uses_.of(block), block, ph);
  // The warm-up times the block's compute only: its clock starts once the moment's copies are
  // issued (a device stream's begin marker passes once the stream's waits for them are met).
  if (ph == chunk::phase::forward && res_.plan_.tracer.recording()) res_.forward_begins();
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::post_forward(int block) {
  if (store_.tracing())
    compute_lane_.close(store_.ex_, *store_.trace_, tide::detail::concat("forward ", block), "compute");
  for (std::uint32_t i : store_.uses_.of(block))
    store_.param_.transition(i, this->evaluating_ ? chunk::tensor_state::hold : chunk::tensor_state::hold_after_fwd);
  res_.access_.leave(store_.uses_.of(block));
  sample_non_model();
  if (res_.plan_.tracer.recording() && !this->evaluating_) res_.forward_ends();  // the warm-up's compute time
}

// A split backward's input pass reads the block's parameters and writes no gradient; the weight
// pass is the block's backward moment, and only it counts in the backward order.
template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::pre_backward_input(int block) {
  enter(block, chunk::phase::input);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::post_backward_input(int block) {
  if (store_.tracing())
    compute_lane_.close(store_.ex_, *store_.trace_, tide::detail::concat("backward input ", block), "compute");
  for (std::uint32_t i : store_.uses_.of(block)) store_.param_.transition(i, chunk::tensor_state::hold_after_fwd);
  res_.access_.leave(store_.uses_.of(block));
  sample_non_model();
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::pre_backward(int block) {
  if (!this->evaluating_) this->backward_.enter([] { return P::name(); }, block);
  enter(block, chunk::phase::backward);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::post_backward(int block) {
  if (store_.tracing())
    compute_lane_.close(store_.ex_, *store_.trace_, tide::detail::concat("backward ", block), "compute");
  for (std::uint32_t i : store_.uses_.of(block)) {
    store_.param_.transition(i, chunk::tensor_state::hold_after_bwd);
    store_.grad_.transition(i, chunk::tensor_state::hold_after_bwd);
  }
  res_.access_.leave(store_.uses_.of(block));
  bool const complete = this->backward_.leave([] { return P::name(); }, block,
                                              static_cast<std::size_t>(this->options_.micro_steps));
  sample_non_model();
  if (!complete) return;  // gradients accumulate
  this->take_grad_slots(block);  // reuse_grad_slots: the completed gradients move into their parameters' slots
  this->prefetch_spilled(block);  // deferred updates: the first spilled chunks' state reads start now
  sample_non_model();
  if (this->options_.defer_sink) return;  // hand_over_gradients() hands them over
  this->hand_to_sink(block);
  if (this->options_.defer_optimizer) return;  // step() runs it
  this->optimizer_moments_of(block, true);
  add_moves_to_last_sample();  // the optimizer moment's copies belong to this block's bar
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::hand_over_gradients() {
  TIDE_REQUIRE(this->options_.defer_sink, "offload::scheduler::hand_over_gradients needs options.defer_sink "
                                          "(without it backward hands each chunk over as it completes)");
  auto const m = static_cast<std::size_t>(this->options_.micro_steps);
  TIDE_REQUIRE(this->step_open_ && this->backward_.at_rest(m) && !handed_over_,
               "offload::scheduler::hand_over_gradients: call it once per step, after the last of ", m,
               " backward passes (", this->backward_.passes() % m, " ran)");
  handed_over_ = true;
  for (int b = store_.uses_.last_block(); b >= store_.uses_.first_block; --b) this->hand_to_sink(b);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::finish(bool apply) {
  this->require_intact();
  TIDE_REQUIRE(this->step_open_, "offload::scheduler::step() without a forward since the last step");
  TIDE_REQUIRE(!res_.access_.in_block(), "offload::scheduler::step() while block ", res_.access_.block(),
               " is open; call its post_forward / post_backward first");
  auto const m = static_cast<std::size_t>(this->options_.micro_steps);
  TIDE_REQUIRE(this->backward_.at_rest(m), "offload::scheduler::step(): ", this->backward_.passes() % m, " of ", m,
               " micro-step backward passes ran",
               this->backward_.passes() % m == 0 && this->backward_.passes() > 0 ? " (one stopped before its first block)"
                                                                                 : "",
               "; step after the last one");
  TIDE_REQUIRE(!this->options_.defer_sink || handed_over_, "offload::scheduler::step(): with options.defer_sink, "
               "call hand_over_gradients() after the last backward pass first");
  handed_over_ = false;
  if (this->options_.defer_optimizer)
    for (int b = store_.uses_.last_block(); b >= store_.uses_.first_block; --b) this->optimizer_moments_of(b, apply);
  auto const t0 = std::chrono::steady_clock::now();
  this->drain();
  this->check_spill();  // a failed spill read or write fails the step; the file keeps the old state
  this->return_grad_slots(apply);  // skipped: the parameters back from the masters
  store_.cur_.stall_ms += detail::ms_since(t0);
  if (this->params_sharded_) this->release_params();  // ZeRO-3: gathered again when next used
  else if (apply) this->share_parameters();         // ZeRO-1/2: the parameters other ranks stepped
  res_.plan_.policy.after_step(*this);
  this->undo_.discard();  // the step is complete: nothing left to undo
  this->extra_undo_.discard();
  if (this->files_) this->files_->commit();  // the new state on file becomes current
  bool const warm_up = res_.plan_.tracer.recording();
  if (warm_up) res_.forward_times_drained();
  res_.plan_.tracer.end_step();
  res_.plan_.ctx.recording = false;
  if (warm_up && res_.plan_.tracer.warm()) res_.after_warm_up();
  if (apply) ++this->t_;
  this->backward_.reset();
  this->step_open_ = false;
  store_.cur_.optimizer_ms += this->runner_.take_ms();
  res_.finish_stats(warm_up, this->t_ - 1);
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::abort_step() noexcept {
  bool const was_in_block = res_.access_.in_block();
  res_.access_.abort();
  if (!this->step_open_ && !was_in_block) return;
  this->sinks_.quiet();  // the sink's failures in this step are the step's failure
  try {
    this->drain();
  } catch (std::exception const& e) {
    this->broken_ = e.what();
  }
  this->sinks_.abandon();  // a sink that can start afresh does; no other rank's gradients are kept
  if (this->broken_.empty()) {
    try {
      for (detail::undo_record<O::state_lists> const& r : this->undo_.records()) {
        store_.drop_shadow(r.c);  // the host copy of a device-resident chunk may hold the update
        this->undo_.restore(r, this->targets_of(r.c), store_.ex_);
      }
      // reuse_grad_slots: the journal keeps no parameters; every chunk stepped or holding
      // gradients gets round(master) back, after the masters were restored.
      if (this->options_.reuse_grad_slots)
        for (detail::undo_record<O::state_lists> const& r : this->undo_.records()) this->round_masters_back(r.c);
      this->return_grad_slots(false);
      memory::synchronize(store_.ex_);  // a device: the restores landed before the host reads on
    } catch (std::exception const& e) {
      this->broken_ = e.what();  // a device whose stream failed: the data may be lost
    }
    this->extra_undo_.restore(store_.extra_);
    this->drop_param_file_copies();
    store_.abort();
    if (this->step_open_) {
      for (std::uint32_t c = 0; c < store_.n_; ++c) this->release_grad(c);  // the step's gradients are dropped
      this->aborted_ = true;  // the policy restores its placement at the next step
    }
  }
  this->release_params_quietly();  // ZeRO-3: gathered again when next used
  if (!this->step_open_) return;  // an evaluation: no step to undo
  this->forget_spill_failures();
  if (this->files_) this->files_->abort();  // the files' current slots hold the state before the step
  this->undo_.discard();
  this->extra_undo_.discard();
  res_.abort();
  this->backward_.reset();
  this->step_open_ = false;
  handed_over_ = false;
  store_.cur_ = {};
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::first_placement() {
  std::size_t const non_model = store_.arena_->stats().in_use - store_.device_bytes_;
  auto const need = res_.plan_.policy.minimum(res_.plan_.ctx, non_model);
  TIDE_CHECK(res_.plan_.ctx.budget >= need.bytes, budget, "offload ", P::name(), ": the device budget ",
             bytes_of{res_.plan_.ctx.budget},
             " is below this scheduler's minimum ", bytes_of{need.bytes}, " = ", need.why,
             "; raise device_budget to at least ", bytes_of{need.bytes}, need.advice);
  init_master();
  res_.plan_.policy.place(*this);
  placed_ = true;
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::begin_step_if_needed() {
  if (step_open_) return;
  require_intact();
  flush_views();    // a tensor the host wrote between steps goes back to the device
  flush_spilled();  // a checkpoint's reads or writes of spilled state go back to file first
  drop_view();
  step_open_ = true;
  sinks_.begin_step();
  res_.plan_.tracer.begin_step();
  if (files_) files_->begin_step();
  res_.plan_.ctx.recording = res_.plan_.tracer.recording();
  store_.arena_->reset_peak();
  res_.tide_.clear();
  moves_mark_ = {store_.cur_.h2d_bytes, store_.evicted_bytes_};
  release_params();  // ZeRO-3: every block takes its parameters from their owners
  if (!placed_) first_placement();
  if (aborted_) {  // the policy puts back what a failed step left out of place
    res_.plan_.policy.after_step(*this);
    aborted_ = false;
  }
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::drain() {
  std::exception_ptr failure;
  flush_views();  // a tensor the host wrote between steps goes back first
  auto wait = [&failure](auto&& f) {
    try {
      f();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  };
  // A sink that waits for its own work under a deadline (NCCL) first: the streams below may wait
  // for that work, and their synchronize has no deadline (its work waits only for compute events
  // already recorded, so waiting for it first cannot deadlock).
  if constexpr (decltype(sinks_)::self_waiting)
    for (std::uint32_t c = 0; c < store_.n_; ++c) wait([&] { wait_reduced(c); });
  if constexpr (B::is_device) wait([&] { memory::synchronize(store_.ex_); });  // device steps, zero fills
  wait([&] { store_.engine_.synchronize(); });
  wait([&] { store_.copy_stream_.synchronize(); });  // the timeline's stamps run after the copies
  if (store_.activation_engine_) {
    wait([&] { store_.activation_engine_->synchronize(); });
    wait([&] { store_.activation_stream_->synchronize(); });
  }
  for (std::uint32_t c = 0; c < store_.n_; ++c) wait([&] { wait_reduced(c); });
  wait([&] { runner_.synchronize(); });
  if (failure) {
    wait_idle();
    store_.spans_.clear();
    compute_lane_.forget();
    std::rethrow_exception(failure);
  }
  store_.spans_.clear();
  free_reduced_unowned(true);
  for (std::uint32_t c = 0; c < store_.n_; ++c)
    if (runner_.pending(c)) swap_in_update(c);  // a host step no one waited for: its swap
  runner_.drained();
  for (std::uint32_t id = 0; id < store_.ids_; ++id) store_.settle(id);
  compute_lane_.drained();  // last: what it reads is complete, and the engine is settled if it throws
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::wait_idle() noexcept {
  auto const activations_idle = [&] { return !store_.activation_stream_ || store_.activation_stream_->query(); };
  if constexpr (decltype(sinks_)::self_waiting) sinks_.quiet();  // under its deadline, before the streams that wait for it
  while (!store_.copy_stream_.query() || !activations_idle() || !runner_.idle()) std::this_thread::yield();
  sinks_.quiet();
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::add_moves_to_last_sample() {
  if (res_.tide_.empty()) return;
  res_.tide_.back().fetched_bytes += store_.cur_.h2d_bytes - this->moves_mark_.first;
  res_.tide_.back().evicted_bytes += store_.evicted_bytes_ - this->moves_mark_.second;
  this->moves_mark_ = {store_.cur_.h2d_bytes, store_.evicted_bytes_};
}

template <Backend B, Element T, class P, class O, class S, class Src>
void engine_core<B, T, P, O, S, Src>::sample_non_model() {
  if (this->evaluating_) return;
  res_.plan_.tracer.non_model(res_.current_, store_.non_model_now());
  store_.cur_.peak_model_bytes = std::max(store_.cur_.peak_model_bytes, this->model_bytes_now());
}

}  // namespace tide::offload::detail
