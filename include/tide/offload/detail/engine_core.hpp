#pragma once
// The step of the offload engine: the gradient sink, the optimizer, the chunk source, the undo
// journal and draining, over the residency layer (moments, budget, prefetch) and chunk_store
// (the byte moves). Decisions come from the scheduler policy P, the update from the optimizer
// O, the gradient reduction from the sink S, parameter bytes at fetch from the source Src.
// scheduler<B, T, P, O, S> (offload/scheduler.hpp) is the public face.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/chunk/memory_tracer.hpp"
#include "tide/core/parallel.hpp"
#include "tide/kernels/cast/host.hpp"
#include "tide/offload/chunk_source.hpp"
#include "tide/offload/detail/chunk_store.hpp"
#include "tide/offload/detail/residency.hpp"
#include "tide/offload/detail/shard_map.hpp"
#include "tide/offload/detail/sink_lane.hpp"
#include "tide/offload/detail/file_plan.hpp"
#include "tide/offload/detail/file_tier.hpp"
#include "tide/offload/detail/undo.hpp"
#include "tide/offload/detail/update_runner.hpp"
#include "tide/offload/gradient_sink.hpp"
#include "tide/offload/scheduler_options.hpp"
#include "tide/offload/scheduler_policy.hpp"
#include "tide/optim/optimizer.hpp"

namespace tide::offload {

namespace detail {

template <Backend B, Element T, class P, class O, class S, class Src>
class engine_core : public residency<B, T, P, engine_core<B, T, P, O, S, Src>> {
  using base = residency<B, T, P, engine_core>;
  using store = chunk_store<B, T, engine_core>;
  friend store;
  friend base;
  friend shard_map;  // calls the port below

 public:
  static constexpr std::size_t state_lists = O::state_lists;
  static constexpr std::size_t extra_count = extra_lists_of<S>().size();
  // fp32-sized lists per chunk that live with the optimizer state (the minimum counts them so).
  static constexpr std::size_t fp32_lists = state_lists + (store::has_master ? 1 : 0) + extra_count;
  // Lists a chunk may keep in the NVMe tier: the optimizer's moments, then the fp32 master.
  static_assert(optim::max_state_lists + 1 <= file_tier<B>::max_lists);

  engine_core(exec<B> const& ex, memory::device_arena<B>& arena, parameter_list params, block_uses uses,
              P const& policy, scheduler_options const& options, O const& optimizer, S const& sink,
              Src const& source)
      : base(ex, arena, std::move(params), std::move(uses), policy, state_lists, extra_lists_of<S>(),
             options.lock_host_pages, shard_of(sink), options.host_budget == 0),
        sinks_(sink, this->n_, this->cur_),
        source_(source),
        options_(options),
        undo_(this->host_, this->layout_.chunks(), state_lists),
        extra_undo_(this->host_, extra_count > 0 ? this->layout_.chunks() : 0),
        runner_(optimizer, options.decay_matrices_only, this->layout_, this->params_.all(), undo_, this->host_,
                this->grad_, this->cur_, fp32_lists,
                std::min<std::size_t>(static_cast<std::size_t>(std::max(options.host_steps_in_flight, 0)), this->n_)),
        lr_(optimizer.lr),
        params_sharded_(shards_parameters_of(sink) && this->shard_.ranks > 1),
        shards_(this->shard_, shards_parameters_of(sink), this->n_) {
    TIDE_REQUIRE(options_.host_steps_in_flight >= 0, "offload::scheduler: host_steps_in_flight = ",
                 options_.host_steps_in_flight, "; pass how many host steps may queue, >= 1, or 0 for no bound");
    TIDE_REQUIRE(options_.micro_steps >= 1, "offload::scheduler: micro_steps = ", options_.micro_steps,
                 "; pass the number of backward passes per optimizer step, >= 1");
    if (options_.reuse_grad_slots) {
      TIDE_REQUIRE(store::has_master, "offload::scheduler: reuse_grad_slots needs bf16 or f16 parameters: with "
                   "fp32 parameters the parameter chunk is the master, and a gradient in its slot would overwrite "
                   "the weights; train in bf16 / f16, or leave reuse_grad_slots off");
      TIDE_REQUIRE(options_.micro_steps == 1, "offload::scheduler: reuse_grad_slots with micro_steps = ",
                   options_.micro_steps, ": gradients that accumulate over micro-steps cannot take the parameters' "
                   "slots, because the next micro-step's forward still reads the parameters; use micro_steps = 1 "
                   "(a larger batch), or leave reuse_grad_slots off");
      TIDE_REQUIRE(this->shard_.ranks == 1, "offload::scheduler: reuse_grad_slots with a sink that shards the "
                   "optimizer state over ", this->shard_.ranks, " ranks (ZeRO): a rank keeps the fp32 masters of "
                   "its own chunks only, so it could not rebuild another rank's parameters after a skipped or failed "
                   "step; use a sink that keeps every chunk's state on every rank, or leave reuse_grad_slots off");
    }
    std::uint32_t const n = this->n_;
    swapped_.assign(n, false);
    this->keep_host_copies_ = options_.keep_host_copies;
    block_free_.resize(n);
    os_on_device_.assign(n, false);
    next_backward_ = this->uses_.last_block();
    // Everything the steady state appends to is sized here: a step allocates nothing on the heap.
    this->ctx_.state_lists = fp32_lists;
    if constexpr (LayoutAwareSink<S>) sinks_.sink().bind_layout(this->layout_, this->params_.all());
    std::size_t completing = 0;
    for (int b = this->uses_.first_block; b <= this->uses_.last_block(); ++b) completing += this->completes_at(b).size();
    sinks_.set_chunks_per_step(completing);
    open_files();
    runner_.set_files(files_.get());
    if (options_.host_budget != 0) attach_host_state();
  }

  // ---- the model's offloaded activations (offload::hooks carries them) -------------------------
  // Host room for them, from the host pool. Under host_budget they must fit what the model data
  // kept on the host leaves of it (host_reserve keeps that room).
  std::byte* activation_host(std::size_t bytes) {
    (void)this->activation_engine();  // their copy stream, from the first request on
    if (options_.host_budget != 0) {
      std::size_t const used = host_kept_ + activation_host_bytes_;
      std::size_t const left = options_.host_budget - std::min(options_.host_budget, used);
      TIDE_CHECK(bytes <= left, budget, "offload::scheduler: the model's offloaded activations need ",
                 bytes_of{bytes}, " of host memory, and host_budget ", bytes_of{options_.host_budget}, " leaves ",
                 bytes_of{left}, " beside the model data kept on the host (", bytes_of{host_kept_}, ")",
                 activation_host_bytes_ != 0 ? tide::detail::concat(" and the activations already held (",
                                                                    bytes_of{activation_host_bytes_}, ")")
                                             : std::string(),
                 "; set host_reserve to at least ", bytes_of{bytes + activation_host_bytes_},
                 " (the NVMe tier then takes that much more optimizer state to file), raise host_budget, or "
                 "offload fewer blocks");
    }
    auto* p = static_cast<std::byte*>(this->host_.allocate(bytes, 256));
    activation_host_bytes_ += bytes;
    return p;
  }
  void release_activation_host(std::byte* p, std::size_t bytes) noexcept {
    this->host_.deallocate(p, bytes, 256);
    activation_host_bytes_ -= bytes;
    if (options_.host_budget != 0) this->host_.trim();  // the pool caches freed blocks: back under host_budget
  }
  // One block's copies, on the activation copy stream (beside the chunk copies, not behind them):
  // one span on the timeline's activation copy lane, after the compute work `ready` marks, `done`
  // recorded after the last.
  void copy_activations(int block, memory::copy_direction d, std::span<memory::copy_request const> copies,
                        memory::event<B> const& ready, memory::event<B>& done) {
    std::size_t bytes = 0;
    for (auto const& c : copies) bytes += c.bytes;
    bool const out = d == memory::copy_direction::device_to_host;
    auto& engine = this->activation_engine();
    auto* span = this->open_span(tide::detail::concat("activations ", block, out ? " out" : " back"), bytes, true);
    engine.copy_stream().wait(ready);
    engine.copy_async(copies, d, done);
    this->close_span(span);
    (out ? this->cur_.activation_d2h_bytes : this->cur_.activation_h2d_bytes) += bytes;
  }
  // Waits for every copy; a failure is left for the step to report (the stream keeps it).
  void drain_activations() noexcept {
    if (this->activation_engine_) this->activation_engine_->drain();
  }
  [[nodiscard]] std::size_t activation_host_bytes() const noexcept { return activation_host_bytes_; }

  // ---- the placement members policies call ----------------------------------------------------
  // Every parameter chunk on the device and pinned there. Idempotent: a chunk fetched stays
  // fetched if a later one throws, and the next call completes the set.
  // Under ZeRO-3 only the rank's own chunks: the others come and go around their blocks.
  void pin_parameters() {
    for (std::uint32_t c = 0; c < this->n_; ++c) {
      if (params_sharded_ && !this->shard_.owns(c)) continue;
      if (!this->on_device(c)) this->fetch(c, 0, {});
      if (this->param_[c].pinned()) continue;
      this->param_[c].set_pinned(true);
      this->ctx_.pinned_bytes += this->block_bytes();
    }
    this->engine_.synchronize();
    for (std::uint32_t c = 0; c < this->n_; ++c) this->settle(c);
  }
  // The master and optimizer state of the first `count` chunks to the device, where their steps
  // then run. required = false: an optimisation, stopped where the arena refuses. Returns the
  // chunks whose state is on the device.
  std::uint32_t place_state_on_device(std::uint32_t count, bool required) {
    init_master();
    std::uint32_t placed = 0;
    for (std::uint32_t c = 0; c < this->n_ && c < count; ++c, ++placed) {
      if (os_on_device_[c] || !this->shard_.owns(c)) continue;  // another rank keeps (and steps) its state
      if (state_on_file(c)) {
        if (!required) continue;  // its state stays on file and is stepped on the host
        // A policy that needs every state on the device takes it from file, and the parameters
        // leave the file for good: a clean device copy becomes the chunk's only one, else they
        // come to a host block. Both are read before either file lets go of the chunk.
        if (params_spilled(c) && !this->on_device(c)) materialize_param(c);
        materialize(c);
        if (files_->forget(c)) host_kept_ += round_up(this->param_[c].capacity(), 256);  // on the host again
      }
      try {
        this->move_state_to_device(c);
      } catch (tide::error const& e) {
        if (required || e.category() != errc::budget) throw;
        break;
      }
      os_on_device_[c] = true;
    }
    if (this->tracer_.warm()) {  // a planned change, not a divergence: the optimizer moments now touch them
      this->tracer_.amend([&](std::size_t, chunk::moment m, std::vector<std::uint32_t>& touched,
                        std::vector<std::uint32_t>& on_host, std::vector<std::uint32_t>& released) {
        if (m.phase == chunk::phase::optimizer) optimizer_moment(m.block, touched, on_host, released);
      });
    }
    return placed;
  }

  // The optimizer moment after block's backward: host-state chunks must be on the host,
  // device-state ones are touched there; the completed gradient chunks are released after it.
  void optimizer_moment(int block, std::vector<std::uint32_t>& touched, std::vector<std::uint32_t>& on_host,
                        std::vector<std::uint32_t>& released) const {
    touched.clear();
    on_host.clear();
    released.clear();
    for (std::uint32_t c : this->completes_at(block)) {
      released.push_back(this->n_ + c);
      if (!this->shard_.owns(c)) continue;  // another rank steps it: nothing moves here
      auto& list = os_on_device_[c] ? touched : on_host;
      list.push_back(c);
      if (!options_.reuse_grad_slots) list.push_back(this->n_ + c);  // reuse: the gradients are in c
    }
    std::ranges::sort(touched);
  }

 protected:
  // ---- what the store asks ------------------------------------------------------------------
  void before_fetch(std::uint32_t id) {
    // Gradients (a gradient chunk, or a parameter chunk whose slot they took) are copied after
    // the sink finished with them: the copy stream waits for its event, this thread does not.
    std::uint32_t const c = id < this->n_ ? id : id - this->n_;
    if ((id >= this->n_ || swapped_[c]) && sinks_.pending(c)) this->copy_stream_.wait(sinks_.reduced(c));
    if (id >= this->n_) return;
    TIDE_CHECK(has_param(id), internal, "offload ", P::name(), ": parameter chunk ", id, " was to be fetched, but "
               "under ZeRO-3 this rank does not hold it (it is gathered only for the blocks that use it)");
    wait_optimizer(id);  // the host step writes the chunk's host payload
  }
  // The chunk source fills parameter chunk c's device block (a handed-over block is free once the
  // copy stream passed the victim's copy out; the default source copies on that stream, in order).
  void fill_chunk(std::uint32_t c, std::byte* device, std::byte const* host, std::size_t bytes, bool handed_over) {
    if (swapped_[c]) {  // it holds gradients (reuse_grad_slots), not what the source makes: a plain copy
      this->engine_.copy_async(device, host, bytes, memory::copy_direction::host_to_device, this->ready_[c]);
      return;
    }
    memory::event<B> const* free_after = nullptr;
    if constexpr (!std::is_same_v<Src, host_source>) {
      if (handed_over) {
        block_free_[c].record(this->copy_stream_);
        free_after = &block_free_[c];
      }
    }
    source_.fill(fill_request<B>{c, device, host, bytes, &this->engine_, &this->copy_stream_, free_after,
                                 &this->ready_[c]});
  }
  void released(std::uint32_t c) noexcept {
    if (!swapped_[c]) source_.released(c);  // a slot holding gradients was not filled by the source
  }
  // A gradient chunk the sink still works on leaves the device after the sink finished: the copy
  // stream waits for the sink's event, the calling thread does not.
  void before_copy_out(std::uint32_t id) {
    std::uint32_t const c = id < this->n_ ? id : id - this->n_;
    if ((id >= this->n_ || swapped_[c]) && sinks_.pending(c)) this->copy_stream_.wait(sinks_.reduced(c));
  }
  // Whether parameter chunk c holds parameters (its host copy may be kept while unchanged), not
  // gradients that a sink or gradient_of() may still write.
  [[nodiscard]] bool holds_parameters(std::uint32_t c) const { return !swapped_[c]; }
  // Parameter chunk c's host update is still running (prefetch leaves it alone).
  [[nodiscard]] bool stepping(std::uint32_t c) { return runner_.stepping(c); }
  void require_intact() const {
    TIDE_CHECK(broken_.empty(), io, "offload ", P::name(), ": a copy or optimizer step failed on a worker earlier (",
               broken_, "); the model data it was moving may be lost: load the last checkpoint into a new trainer");
  }
  // The first moment of the first step: the non-model bytes are known (the model allocated its
  // activations), so the budget is checked, then the policy places what it pins. A placement
  // that threw half-way is completed by the next step.
  void first_placement() {
    std::size_t const non_model = this->arena_->stats().in_use - this->device_bytes_;
    auto const need = this->policy_.minimum(this->ctx_, non_model);
    TIDE_CHECK(this->ctx_.budget >= need.bytes, budget, "offload ", P::name(), ": the device budget ", bytes_of{this->ctx_.budget},
               " is below this scheduler's minimum ", bytes_of{need.bytes}, " = ", need.why,
               "; raise device_budget to at least ", bytes_of{need.bytes}, need.advice);
    init_master();
    this->policy_.place(*this);
    placed_ = true;
  }
  void begin_step_if_needed() {
    if (step_open_) return;
    require_intact();
    flush_spilled();  // a checkpoint's reads or writes of spilled state go back to file first
    drop_view();
    step_open_ = true;
    sinks_.begin_step();
    this->tracer_.begin_step();
    if (files_) files_->begin_step();
    this->ctx_.recording = this->tracer_.recording();
    this->arena_->reset_peak();
    this->tide_.clear();
    moves_mark_ = {this->cur_.h2d_bytes, this->evicted_bytes_};
    release_params();  // ZeRO-3: every block takes its parameters from their owners
    if (!placed_) first_placement();
    if (aborted_) {  // the policy puts back what a failed step left out of place
      this->policy_.after_step(*this);
      aborted_ = false;
    }
  }

  // ---- ZeRO-3: other ranks' parameter chunks, held only around the blocks that use them -------
  // shard_map (detail/shard_map.hpp) decides what is held and gathered; the members below are
  // the port through which it moves the bytes.
  [[nodiscard]] bool has_param(std::uint32_t c) const { return shards_.has_param(c); }
  // Before a block's moment: shard_map::gather_for with the block's chunks and the next moment's.
  void gather_for(int block, chunk::phase ph) {
    if (!params_sharded_) return;
    auto const next = next_moment(block, ph);
    std::span<std::uint32_t const> next_ids;
    if (next) next_ids = this->ids_of(next->first, next->second);
    shards_.gather_for(*this, this->ids_of(block, ph), next ? &next_ids : nullptr);
  }
  // The moment the hooks run next when the model goes on as usual (none after the last).
  [[nodiscard]] std::optional<std::pair<int, chunk::phase>> next_moment(int block, chunk::phase ph) const {
    int const first = this->uses_.first_block, last = this->uses_.last_block();
    if (ph == chunk::phase::forward) {
      if (block < last) return std::pair{block + 1, ph};
      if (evaluating_) return std::nullopt;
      return std::pair{last, chunk::phase::backward};
    }
    if (block > first) return std::pair{block - 1, ph};
    if (!evaluating_ && backward_passes_ % static_cast<std::size_t>(options_.micro_steps) != 0)
      return std::pair{first, chunk::phase::forward};  // another micro-step's pass follows
    return std::nullopt;
  }
  void release_params() { shards_.release_all(*this); }
  void release_params_quietly() noexcept { shards_.abort(*this); }
  void gather_all() { shards_.gather_all(*this); }
  // The port.
  std::byte* gather_block(std::uint32_t c) {
    return static_cast<std::byte*>(this->host_.allocate(this->param_[c].capacity(), 256));
  }
  void free_gather_block(std::uint32_t c, std::byte* block) noexcept {
    this->host_.deallocate(block, this->param_[c].capacity(), 256);
  }
  void abandon_gather_block(std::byte* block) noexcept { this->host_.abandon(block); }  // never unmapped
  void send_own(std::uint32_t c, std::byte* block) {
    this->settle(c);
    std::memcpy(block, this->param_[c].payload(), this->param_[c].capacity());  // tide::host: a device block is host memory
  }
  void gather_async(std::uint32_t c, std::byte* block) {
    if constexpr (ParameterShardingSink<S>)
      sinks_.sink().gather_async(c, std::span<T>(reinterpret_cast<T*>(block), this->param_[c].capacity() / sizeof(T)));
  }
  void wait_gathered() {
    auto const t0 = std::chrono::steady_clock::now();
    if constexpr (ParameterShardingSink<S>) sinks_.sink().wait_gathered();
    this->cur_.stall_ms += ms_since(t0);
  }
  void attach_gathered(std::uint32_t c, std::byte* block) noexcept {
    TIDE_ASSERT(this->param_[c].payload() == nullptr);
    this->param_[c].attach(block, chunk::tier::host);
  }
  void drop_param(std::uint32_t c) {
    this->settle(c);  // a copy in flight reads or writes it
    this->drop_shadow(c);
    free_param_payload(c);
  }
  // Parameter chunk c no longer pinned on the device (pinned chunks count in ctx_.pinned_bytes).
  void unpin_param(std::uint32_t c) noexcept {
    chunk::chunk& p = this->param_[c];
    if (!p.pinned()) return;
    p.set_pinned(false);
    this->ctx_.pinned_bytes -= this->block_bytes();
  }
  // Parameter chunk c's payload freed wherever it is (no copy in flight), unpinned; the source
  // hears of a device copy that went.
  void free_param_payload(std::uint32_t c) noexcept {
    unpin_param(c);
    bool const was_on_device = this->on_device(c);
    this->free_payload(this->param_[c]);
    if (was_on_device) this->released(c);
  }

  // ---- the gradient sink and the optimizer ----------------------------------------------------
  // After the pass that completes them: chunk c's gradients go to READY_FOR_REDUCE and to the sink.
  void hand_to_sink(int block) {
    auto const complete = this->completes_at(block);
    for (std::uint32_t c : complete) {
      this->grad_.transition_chunk(c, chunk::tensor_state::ready_for_reduce);
      chunk::chunk& g = grad_chunk(c);
      ready_chunk<B, T> r{c, {reinterpret_cast<T*>(g.payload()), g.capacity() / sizeof(T)}, g.tier(), nullptr,
                          nullptr, t_, c == complete.back()};
      if constexpr (extra_count > 0) {
        if (options_.undo_on_error) extra_undo_.save(c, this->extra_);  // the sink may change them
        for (std::size_t k = 0; k < extra_count; ++k)
          r.lists[k] = {this->extra_[k][c].payload(), this->extra_[k][c].capacity()};
      }
      r.trace = this->tracing() ? this->trace_ : nullptr;
      sinks_.hand(r);
    }
  }
  void wait_reduced(std::uint32_t c) { sinks_.wait(c); }
  // Waits for optimizer work on parameter chunk c (the host step writes its host payload).
  void wait_optimizer(std::uint32_t c) { runner_.wait(c); }

  // The optimizer moment after `block`'s backward, and its steps (apply = false: moves only).
  void optimizer_moments_of(int block, bool apply) {
    optimizer_moment(block, touched_, on_host_, released_);
    if (released_.empty()) return;
    this->current_ = this->tracer_.at({block, chunk::phase::optimizer}, touched_, on_host_, released_);
    free_reduced_unowned(false);
    for (std::uint32_t c : this->completes_at(block)) optimizer_step(c, apply);
    this->cur_.peak_model_bytes = std::max(this->cur_.peak_model_bytes, model_bytes_now());  // copies out in flight
  }
  // The gradients of chunks another rank steps, once the sink finished with them (wait: all).
  void free_reduced_unowned(bool wait) {
    sinks_.free_unowned(wait, [this](std::uint32_t c) { release_grad(c); });
  }

  // ZeRO: after the step's updates, every chunk's parameters from the rank that stepped it. The
  // chunks this rank did not step are journalled first, so a failed exchange is undone.
  void share_parameters() {
    if constexpr (ShardingSink<S>) {
      auto& shared = sinks_.shared();
      shared.clear();
      for (std::uint32_t c = 0; c < this->n_; ++c) {
        if (!this->shard_.owns(c)) {
          if (undo_record* u = begin_undo(c, step_elements(c))) undo_.save(*u, targets_of(c));
          this->drop_shadow(c);  // its device copy changes: the host one would be stale
        }
        chunk::chunk& p = this->param_[c];
        shared.push_back({reinterpret_cast<T*>(p.payload()), p.capacity() / sizeof(T)});
      }
      sinks_.share_parameters(std::span<std::span<T> const>(shared));
    }
  }

  [[nodiscard]] update_targets<T> targets_of(std::uint32_t c) {
    update_targets<T> x;
    x.param = reinterpret_cast<T*>(this->param_[c].payload());
    if constexpr (store::has_master) x.master = reinterpret_cast<float*>(this->master_[c].payload());
    for (std::size_t k = 0; k < state_lists; ++k) x.state[k] = reinterpret_cast<float*>(this->state_[k][c].payload());
    return x;
  }
  [[nodiscard]] optim::update_tensor<T> update_of(std::uint32_t c) {
    update_targets<T> const x = targets_of(c);
    optim::update_tensor<T> u;
    u.master = store::has_master ? x.master : reinterpret_cast<float*>(x.param);
    u.grad = reinterpret_cast<T const*>(grad_chunk(c).payload());  // reuse_grad_slots: u.grad == u.working
    u.state = x.state;
    u.working = store::has_master ? x.param : nullptr;
    u.n = step_elements(c);
    return u;
  }
  [[nodiscard]] index_t step_elements(std::uint32_t c) const {
    // Up to the end of the chunk's last tensor (the rest of the chunk is never touched).
    std::uint32_t const last = this->layout_.first_param[c + 1] - 1;
    return static_cast<index_t>(this->layout_.offset_of[last] + static_cast<std::size_t>(this->params_[last].numel()));
  }

  using host_job = typename update_runner<B, T, O>::job;
  void optimizer_step(std::uint32_t c, bool apply) {
    if (!this->shard_.owns(c)) {  // ZeRO: another rank steps it; its parameters come in share_parameters
      this->param_.transition_chunk(c, chunk::tensor_state::hold);
      if (sinks_.busy(c)) {
        sinks_.defer_unowned(c);  // freed once the sink is done with it, without waiting here
        return;
      }
      wait_reduced(c);
      release_grad(c);
      return;
    }
    index_t const n = step_elements(c);
    optim::update_args const args{t_, lr_, options_.grad_scale, true};
    if (os_on_device_[c]) {
      wait_reduced(c);  // the update runs here: the sink must have finished with the gradients
      if (!this->on_device(c) || (!swapped_[c] && !this->on_device(this->n_ + c))) {  // deferred: evicted since?
        ids_pair_.assign({c, this->n_ + c});
        if (swapped_[c]) ids_pair_.pop_back();  // the gradients are in c
        this->make_resident(ids_pair_, this->current_);
      }
      auto const t0 = std::chrono::steady_clock::now();
      undo_record* const u = apply ? begin_undo(c, n) : nullptr;
      if (apply) this->drop_shadow(c);  // the device copy changes: the host one is stale
      double const start = this->tracing() ? trace_recorder::now_us() : 0;
      if (apply) runner_.journalled_update(this->ex_, c, update_of(c), targets_of(c), u, args);
      if (apply && this->tracing())
        this->trace_->complete(tide::detail::concat(O::name, " chunk ", c, " (device)"), "optimizer", lane::compute,
                               start, trace_recorder::now_us(), static_cast<std::size_t>(n) * (8 + 4 * fp32_lists));
      this->cur_.optimizer_ms += ms_since(t0);
      ++this->cur_.device_optimizer_chunks;
      this->param_.transition_chunk(c, chunk::tensor_state::hold);
      release_grad(c);
      return;
    }
    // Host state: parameters and gradients go to the host; the step runs on the optimizer worker
    // after both copies, and the parameter chunk is not fetched again before it finished.
    // The gradients copied out for a step queued on the worker go to a block of the gradient
    // ring (host_steps_in_flight blocks), acquired before anything moves.
    std::byte* const ring =
        apply && options_.overlap_optimizer && this->on_device(this->n_ + c)
            ? runner_.take_ring_block(c, [this] { return sinks_.outstanding(); })
            : nullptr;
    undo_record* undo = nullptr;
    try {
      undo = apply ? begin_undo(c, n) : nullptr;  // acquired before anything moves
      if (this->on_device(c)) this->set_stale(c, this->copy_out(c), chunk::tier::device);
      if (this->on_device(this->n_ + c))
        this->set_stale(this->n_ + c, this->copy_out(this->n_ + c, ring), chunk::tier::device);
    } catch (...) {
      if (ring != nullptr && this->grad_[c].payload() != ring) runner_.reclaim_ring_block(ring);  // not taken
      throw;
    }
    unpin_param(c);
    ++this->cur_.host_optimizer_chunks;
    if (!apply) {  // the moves happened; nothing to compute
      wait_reduced(c);  // the gradients are freed below
      this->param_.transition_chunk(c, chunk::tensor_state::hold);
      release_grad(c);
      return;
    }
    host_job& job = runner_.job_of(c);
    job = {&runner_, c, update_of(c), targets_of(c), args, this->tracing() ? this->trace_ : nullptr, undo, {}};
    if (state_on_file(c)) stage_spilled(job);
    this->param_.transition_chunk(c, chunk::tensor_state::hold);
    this->grad_.transition_chunk(c, chunk::tensor_state::free);
    if (options_.overlap_optimizer) {
      // The worker waits for the copies and for the sink; backward goes on (the gradients' copy
      // out, if any, already waits for the sink on the copy stream).
      if (sinks_.pending(c)) runner_.stream().wait(sinks_.reduced(c));
      runner_.stream().wait(this->ready_[c]);
      runner_.stream().wait(this->ready_[this->n_ + c]);
      runner_.queue(c);
      // The gradient's host block is freed once the step read it: a ring block goes back to the
      // ring when a later host step finds the step done (take_ring_block); a block from the pool
      // (gradients the policy evicted before they were complete) at drain.
      if (!swapped_[c]) {
        std::byte* const g = this->grad_[c].detach();
        if (g != ring) runner_.free_after_drain(c, g);  // a ring block is in the ring's used list already
      }
    } else {
      wait_reduced(c);
      this->settle(c);
      this->settle(this->n_ + c);
      runner_.run(c);
      this->free_payload(this->grad_[c]);
    }
  }
  // Frees of host blocks come here first (chunk_store): a ring block goes back to the ring.
  bool reclaim_ring_block(std::byte* p) noexcept { return runner_.reclaim_ring_block(p); }
  // ---- the NVMe tier (detail/file_tier.hpp holds its bytes; here, when they move) -------------
  [[nodiscard]] bool state_on_file(std::uint32_t c) const noexcept { return files_ && files_->state_on_file(c); }
  [[nodiscard]] bool params_spilled(std::uint32_t c) const noexcept { return files_ && files_->params_spilled(c); }
  [[nodiscard]] bool param_in_file(std::uint32_t c) const noexcept { return files_ && files_->param_in_file(c); }
  [[nodiscard]] bool param_on_file(std::uint32_t c) const noexcept { return files_ && files_->param_on_file(c); }
  // What a wait for a ring block or a file slot waits for: chunk c's host update.
  [[nodiscard]] auto update_of_chunk_done() {
    return [this](std::uint32_t c) { wait_optimizer(c); };
  }
  // A host step of chunk c, on file: its lists and parameters are read into a ring block of the
  // file tier, updated there (the journal keeps none of them: the file's current slot has them),
  // and written to the other slots.
  void stage_spilled(host_job& job) {
    job.io = files_->stage(job.c, update_of_chunk_done());
    for (std::size_t k = 0; k < files_->lists(); ++k) {
      float* const list = files_->list_of(job.io, k);
      if (k < state_lists) {
        job.whole.state[k] = list;
        job.targets.state[k] = list;
      } else {  // the fp32 master
        job.whole.master = list;
        job.targets.master = list;
      }
    }
    if (job.io.params != nullptr) {  // the parameters (fp32: the master; else the working copy) too
      if constexpr (store::has_master) job.whole.working = reinterpret_cast<T*>(job.io.params);
      else job.whole.master = reinterpret_cast<float*>(job.io.params);
      job.targets.param = nullptr;
    }
  }
  // Deferred updates (step() runs them, in the order backward completed the chunks): the reads of
  // the first chunks on file to complete start as backward completes them, one per ring block.
  void prefetch_spilled(int block) {
    if (!files_ || !options_.defer_optimizer) return;
    for (std::uint32_t c : this->completes_at(block)) {
      if (!files_->state_on_file(c) || !this->shard_.owns(c) || os_on_device_[c]) continue;
      if (!files_->prefetch(c, update_of_chunk_done())) return;
    }
  }
  // At construction: plan_files decides what the host budget cannot hold; the file tier takes it.
  // The masters go to file with the state, unless reuse_grad_slots keeps them on the host (a
  // skipped or failed step rounds the parameters back from them, which must not fail).
  void open_files() {
    bool const masters_may_go = store::has_master && !options_.reuse_grad_slots;
    std::size_t const lists = state_lists + (masters_may_go ? 1 : 0);
    std::size_t kept = 0;
    std::vector<std::uint32_t> owned;
    for (std::uint32_t c = 0; c < this->n_; ++c) {
      if (!params_sharded_ || this->shard_.owns(c)) kept += round_up(this->param_[c].capacity(), 256);  // ZeRO-3: own only
      for (auto& l : this->extra_) kept += round_up(l[c].capacity(), 256);
      if (!this->shard_.owns(c)) continue;
      owned.push_back(c);
      if constexpr (store::has_master)
        if (!masters_may_go) kept += round_up(this->master_[c].capacity(), 256);
    }
    // Parameter chunks go to file past the state, but not under a sharding sink (ZeRO: other
    // ranks write a rank's parameter chunks) nor with reuse_grad_slots (the gradients take them).
    file_plan const plan = plan_files({.host_budget = options_.host_budget,
                                       .host_reserve = options_.host_reserve,
                                       .have_folder = !options_.spill_folder.empty(),
                                       .kept = kept,
                                       .owned = owned,
                                       .lists = lists,
                                       .list_bytes = this->state_block_bytes(),
                                       .param_bytes = round_up(this->param_[0].capacity(), 256),
                                       .chunks = this->n_,
                                       .params_may_go = !ShardingSink<S> && !options_.reuse_grad_slots,
                                       .masters_stay = store::has_master && !masters_may_go,
                                       .extra_lists = extra_count > 0,
                                       .sharding = ShardingSink<S>,
                                       .masters_go = masters_may_go});
    host_kept_ = plan.host_kept;
    if (plan.empty()) return;
    std::array<chunk::chunk_list*, file_tier<B>::max_lists> to_file{};
    for (std::size_t k = 0; k < state_lists; ++k) to_file[k] = &this->state_[k];
    if (masters_may_go) to_file[state_lists] = &this->master_;
    files_ = std::make_unique<file_tier<B>>(this->host_, this->cur_, std::span(to_file.data(), lists), this->param_,
                                            plan, options_.spill_folder, this->n_, this->state_block_bytes());
  }
  // With a host budget the store attaches no optimizer state: here the state that stays on the
  // host starts zeroed, after open_files chose what goes to file, so that the host never holds
  // the state on file (a model whose state does not fit host memory can be built).
  void attach_host_state() {
    bool const masters_on_file = files_ && files_->holds_masters(state_lists);
    for (std::uint32_t c = 0; c < this->n_; ++c) {
      if (!params_spilled(c)) this->attach_host_zeroed(this->param_[c]);
      if (!this->shard_.owns(c)) continue;
      for (std::size_t k = 0; k < state_lists; ++k)
        if (!state_on_file(c)) this->attach_host_zeroed(this->state_[k][c]);
      if constexpr (store::has_master)
        if (!masters_on_file || !state_on_file(c)) this->attach_host_zeroed(this->master_[c]);
    }
  }
  // Chunk c's state on host blocks attached to its chunks (a checkpoint's load); see file_tier.
  void materialize(std::uint32_t c) {
    if (files_) files_->materialize(c);
  }
  std::byte const* spilled_view(std::uint32_t c, std::size_t k) { return files_ ? files_->state_view(c, k) : nullptr; }
  // Chunk c's parameters from file into a new host block (a fetch).
  std::byte* read_param_file(std::uint32_t c) { return files_->read_param(c, step_open_ || evaluating_); }
  bool read_param_ahead(std::uint32_t c) { return files_ && files_->read_param_ahead(c); }
  void drop_param_ahead() noexcept {
    if (files_) files_->drop_ahead();
  }
  // Chunk c's parameters on a host block attached to it, for writing between steps (the model's
  // initialisation, a checkpoint's load). Its device copy, if any, goes: the caller may change
  // the bytes.
  void materialize_param(std::uint32_t c) {
    if (!param_in_file(c)) return;
    TIDE_REQUIRE(!evaluating_, "offload::scheduler: parameter chunk ", c, " is on file (host_budget), and its "
                 "bytes can be written only between steps and evaluations; call end_evaluation() first");
    chunk::chunk& p = this->param_[c];
    std::byte* const host = files_->take_param(c, step_open_ || evaluating_);
    if (p.payload() != nullptr) {  // a clean device copy
      this->settle(c);
      free_param_payload(c);
    }
    p.attach(host, chunk::tier::host);
    files_->params_attached(c);
  }
  // Chunk c's parameters to read when they are on file alone (nullptr: read them where they are).
  std::byte const* param_file_view(std::uint32_t c) {
    return files_ ? files_->param_view(c, update_of_chunk_done()) : nullptr;
  }
  // A failed step, once drained: device copies of the parameters on file may hold what its
  // updates wrote to the other slots, which the file forgets; they go, and come back when used.
  void drop_param_file_copies() noexcept {
    if (!files_) return;
    for (std::uint32_t c : files_->param_chunks())
      if (files_->param_in_file(c) && this->param_[c].payload() != nullptr) free_param_payload(c);
  }
  // The views' blocks back to the pool (a save ended, a load or a step begins).
  void drop_view() {
    if (files_ && files_->drop_view()) this->host_.trim();  // back under host_budget
  }
  // The materialized chunks' lists back to file; a failed write keeps them on the host.
  void flush_spilled() {
    if (files_ && files_->flush()) this->host_.trim();  // back under host_budget
  }
  // After the optimizer drained: a failed read or write on file fails the step (its slots stay as
  // they were; abort_step puts the parameters back).
  void check_spill() {
    if (!files_) return;
    for (std::uint32_t c : files_->stepped())
      if (runner_.job_of(c).io.failure) {
        std::exception_ptr const e = std::exchange(runner_.job_of(c).io.failure, nullptr);
        forget_spill_failures();
        files_->discard();
        std::rethrow_exception(e);
      }
  }
  void forget_spill_failures() noexcept { runner_.abort(); }
  undo_record* begin_undo(std::uint32_t c, index_t n) {
    if (!options_.undo_on_error) return nullptr;
    update_targets<T> x = targets_of(c);
    if (options_.reuse_grad_slots) x.param = nullptr;  // the slot holds gradients: rounded back from the master
    if (params_spilled(c)) x.param = nullptr;          // on file: its current slot keeps them
    return undo_.begin(c, static_cast<std::size_t>(n), x);
  }

  // The masters start as the parameters the model initialised (or a checkpoint wrote): once,
  // before the first update, while every chunk is still readable on the host. A master in the
  // NVMe tier is written to its chunk's current slot.
  void init_master() {
    if constexpr (store::has_master) {
      if (master_written_) return;
      drain();
      std::optional<typename file_tier<B>::staging> staging;  // one block, for the masters that go to file
      for (std::uint32_t c = 0; c < this->n_; ++c) {
        if (!this->shard_.owns(c)) continue;  // another rank keeps its master
        bool const to_file = files_ && files_->master_on_file(c, state_lists);
        if (to_file && !staging) staging.emplace(this->host_, files_->list_bytes());
        if (to_file) std::memset(staging->data, 0, staging->bytes);
        std::byte const* const on_file = param_file_view(c);
        for (std::uint32_t i = this->layout_.first_param[c]; i < this->layout_.first_param[c + 1]; ++i) {
          auto const* src = on_file != nullptr ? reinterpret_cast<T const*>(on_file) + this->layout_.offset_of[i]
                                               : reinterpret_cast<T const*>(this->param_.data(i));
          auto* dst = to_file ? reinterpret_cast<float*>(staging->data) + this->layout_.offset_of[i]
                              : reinterpret_cast<float*>(this->master_.data(i));
          for (index_t k = 0; k < this->params_[i].numel(); ++k) dst[k] = to_float(src[k]);
        }
        if (to_file) files_->write_master(c, staging->data);
      }
      master_written_ = true;
      if (files_) files_->end_param_view();  // the views of parameter chunks on file end with it
      if (staging || (files_ && !files_->param_chunks().empty())) {
        staging.reset();
        this->host_.trim();  // the pool caches freed blocks: back under host_budget
      }
    }
  }
  // ---- gradient-slot reuse (reuse_grad_slots) ------------------------------------------------
  // The chunk that holds chunk c's gradients: its parameter chunk once they took its slot.
  [[nodiscard]] chunk::chunk& grad_chunk(std::uint32_t c) { return swapped_[c] ? this->param_[c] : this->grad_[c]; }
  [[nodiscard]] std::byte* grad_bytes(std::uint32_t i) {
    std::uint32_t const c = this->layout_.chunk_of[i];
    if (!swapped_[c]) return this->grad_.data(i);
    return this->param_[c].payload() + this->layout_.offset_of[i] * sizeof(T);
  }
  // The block's completed chunks: each one's gradient block becomes its parameter chunk's payload
  // (on whichever tier the gradients are), and the parameter block and its host copy are freed.
  // Nothing is copied. Each completed chunk's gradient chunk is FREE after it.
  void take_grad_slots(int block) {
    if (!options_.reuse_grad_slots) return;
    for (std::uint32_t c : this->completes_at(block)) {
      chunk::chunk& p = this->param_[c];
      chunk::chunk& g = this->grad_[c];
      this->settle(c);
      this->settle(this->n_ + c);  // a copy out of the gradients lands first
      TIDE_ASSERT(g.payload() != nullptr && !swapped_[c]);
      this->drop_shadow(c);
      bool const was_on_device = this->on_device(c);
      if (g.tier() != chunk::tier::device) unpin_param(c);  // a pinned chunk stays on the device
      this->free_payload(p);
      if (was_on_device) this->released(c);
      chunk::tier const where = g.tier();
      p.attach(g.detach(), where);
      swapped_[c] = true;
    }
  }
  // Parameter chunk c's parameters again, rounded from its master (a skipped or abandoned step:
  // the slot held gradients). Exact: between steps a parameter is its master rounded.
  void round_masters_back(std::uint32_t c) {
    if constexpr (store::has_master) {
      this->drop_shadow(c);  // the host copy of a device-resident chunk holds gradients
      kernels::detail::cast_contiguous(reinterpret_cast<float const*>(this->master_[c].payload()),
                                       reinterpret_cast<T*>(this->param_[c].payload()), step_elements(c));
    }
  }
  // The end of a step: `stepped` (every chunk was updated, and so holds parameters again) or
  // not (skipped or abandoned: each chunk whose slot holds gradients gets its parameters back).
  void return_grad_slots(bool stepped) {
    for (std::uint32_t c = 0; c < this->n_; ++c) {
      if (!swapped_[c]) continue;
      if (!stepped) round_masters_back(c);
      swapped_[c] = false;
    }
  }

  // Model data held now, host and device (offload_stats::peak_model_bytes).
  [[nodiscard]] std::size_t model_bytes_now() const {
    std::size_t bytes = 0;
    auto add = [&](chunk::chunk_list const& list) {
      for (std::uint32_t c = 0; c < this->n_; ++c)
        if (list[c].payload() != nullptr) bytes += list[c].capacity();
    };
    add(this->param_);
    add(this->grad_);
    add(this->master_);
    for (auto const& l : this->state_) add(l);
    for (auto const& l : this->extra_) add(l);
    for (std::uint32_t c = 0; c < this->n_; ++c)
      if (this->shadow_[c] != nullptr) bytes += this->param_[c].capacity();
    for (std::uint32_t id = 0; id < this->ids_; ++id)
      if (this->stale_[id] != nullptr) bytes += this->param_.chunk_bytes();  // parameter and gradient chunks: one size
    bytes += runner_.held_blocks() * this->param_.chunk_bytes();
    return bytes;
  }

  // Gradient chunk c to FREE, its payload released.
  void release_grad(std::uint32_t c) {
    chunk::chunk& g = this->grad_[c];
    if (g.payload() == nullptr && this->stale_[this->n_ + c] == nullptr) {
      this->grad_.transition_chunk(c, chunk::tensor_state::free);  // reuse_grad_slots: the gradients were in c
      return;
    }
    this->settle(this->n_ + c);
    this->grad_.transition_chunk(c, chunk::tensor_state::free);
    this->free_payload(g);
  }

  // Waits for every copy, sink and host step; frees what they held. Waits for all of them even
  // when one failed, then reports the first failure.
  void drain() {
    std::exception_ptr failure;
    auto wait = [&failure](auto&& f) {
      try {
        f();
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    };
    wait([&] { this->engine_.synchronize(); });
    wait([&] { this->copy_stream_.synchronize(); });  // the timeline's stamps run after the copies
    if (this->activation_engine_) {
      wait([&] { this->activation_engine_->synchronize(); });
      wait([&] { this->activation_stream_->synchronize(); });
    }
    for (std::uint32_t c = 0; c < this->n_; ++c) wait([&] { wait_reduced(c); });
    wait([&] { runner_.synchronize(); });
    if (failure) {
      wait_idle();
      this->spans_.clear();
      std::rethrow_exception(failure);
    }
    this->spans_.clear();
    free_reduced_unowned(true);
    runner_.drained();
    for (std::uint32_t id = 0; id < this->ids_; ++id) this->settle(id);
  }
  // Waits until the workers ran out of work, without reporting anything (for the destructor and
  // after a failure: a failed stream skips the rest of its queue, so this ends). A sink's events
  // are waited for too: its work may still read a gradient chunk.
  void wait_idle() noexcept {
    auto const activations_idle = [&] { return !this->activation_stream_ || this->activation_stream_->query(); };
    while (!this->copy_stream_.query() || !activations_idle() || !runner_.idle()) std::this_thread::yield();
    sinks_.quiet();
  }

  // ---- state ----------------------------------------------------------------------------------
  sink_lane<B, T, S> sinks_;  // the gradient sink and its work on this step's chunks
  Src source_;
  scheduler_options options_;
  undo_journal<B, T> undo_;
  extra_journal<B> extra_undo_;  // the extra lists of the chunks handed to the sink in this step
  update_runner<B, T, O> runner_;  // the optimizer lane and the gradient ring
  float lr_;

  std::vector<memory::event<B>> block_free_;  // by chunk: a handed-over block may be written (other sources)
  std::vector<bool> os_on_device_;  // by chunk: its optimizer state lives on the device
  std::vector<bool> swapped_;  // by chunk: its gradients hold its parameter chunk's slot (reuse_grad_slots)
  // The NVMe tier: only when host_budget sent something to file (null: no file-tier state).
  std::unique_ptr<file_tier<B>> files_;
  std::size_t host_kept_ = 0;              // host_budget: the model data kept on the host between steps
  std::size_t activation_host_bytes_ = 0;  // the model's offloaded activations, in the host pool
  std::vector<std::uint32_t> touched_, on_host_, released_;
  std::vector<std::uint32_t> ids_pair_ = std::vector<std::uint32_t>(2);
  bool params_sharded_ = false;  // ZeRO-3 on more than one rank
  shard_map shards_;             // ZeRO-3: the chunks held now, the gathers in flight

  std::int64_t t_ = 1;  // the optimizer step number of the step in progress
  std::size_t backward_passes_ = 0;
  bool step_open_ = false;
  bool evaluating_ = false;
  bool placed_ = false;
  int next_backward_ = 0;               // the block backward must visit next
  bool aborted_ = false;          // a failed step may have left the policy's placement incomplete
  bool master_written_ = false;   // bf16 / f16: the masters hold the parameters
  std::string broken_;            // a failure on a worker: every later step reports it
  std::pair<std::size_t, std::size_t> moves_mark_{};  // h2d and evicted bytes at the last sample
};

}  // namespace detail
}  // namespace tide::offload
