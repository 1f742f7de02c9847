#pragma once
// scheduler<B, T, Policy, Optimizer, Sink, Source>: the offload engine. The model data of a
// model (parameters, gradients, fp32 masters, optimizer state) lives in chunks, moved between the
// device arena and the host as the scheduler Policy decides (offload/schedulers.hpp, or your own:
// offload/scheduler_policy.hpp); each chunk is handed to the gradient Sink as soon as its
// gradients are complete (offload/gradient_sink.hpp) and stepped by the Optimizer
// (optim/optimizer.hpp) on the tier where its state lives; a parameter chunk fetched to the
// device is filled by the chunk Source (offload/chunk_source.hpp; default: a copy from the host).
//
//   tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
//   auto const cfg = tide::nn::gpt_config{...};
//   using sched_t = tide::offload::scheduler<tide::host, float, tide::offload::chunked<tide::offload::belady>>;
//   sched_t sched{ex, arena, tide::nn::gpt_parameters(cfg, tide::dtype::f32), tide::nn::gpt_block_uses(cfg),
//                 {.chunk_bytes = 1_MiB}, {}, tide::optim::adamw{.lr = 1e-3f}};
//   tide::nn::gpt<tide::host, float, tide::offload::hooks<sched_t>> model{cfg, arena, {}, {&sched}};
//   for (...) { model.forward(ex, x, y); model.backward(ex); sched.step(); sched.last_step(); }
//
// Lists: param (T) and grad (T) chunks move; the fp32 master (bf16 / f16 parameters) and the
// optimizer's state lists stay where the policy placed them (host, or the device). Trace ids:
// param chunk c is c, grad chunk c is n + c (n chunks per list).
//
// One step, for chunked<P>:
//   pre_forward(b)   the chunks of b's parameters become resident (a victim's device block is
//                    handed over: its copy to the host and the new copy in run in order on the
//                    copy stream), tensors -> COMPUTE; then the next moments' chunks are
//                    prefetched as far as the budget allows (belady: also by evicting a chunk
//                    used later than the one fetched)
//   post_forward(b)  tensors -> HOLD_AFTER_FWD
//   pre_backward(b)  parameter and gradient chunks resident (a FREE gradient chunk is created
//                    zero-filled: no copy), tensors -> COMPUTE
//   post_backward(b) tensors -> HOLD_AFTER_BWD; every chunk whose last backward use was b
//                    (reuse_grad_slots: its gradient block first becomes its parameter chunk's
//                    payload) goes to READY_FOR_REDUCE and to the sink, then is stepped (after
//                    the sink's event): on the device when its state is there, else its parameter and
//                    gradient chunks are copied to the host and the host update runs on the
//                    optimizer worker beside the rest of backward; the gradient chunk is freed
//   step()           waits for the optimizer, ends the step (the warm-up step becomes the trace)
//
// The first step is the warm-up: it keeps only the current moment's chunks on the device and
// records the trace and the non-model bytes per moment (memory_tracer). A budget below the
// policy's minimum is refused at the first moment, before any compute, with a tide::error
// stating the minimum and its parts. Offloading changes no result: the same kernels run on the
// same bytes, only the addresses differ (tests/offload/scheduler.cpp checks bit-identity).
//
// Failures lose nothing: every move acquires before it detaches, and a chunk the optimizer (or
// a sink with extra lists) changes keeps a host copy until the step completes (undo_on_error).
// A step that throws is abandoned by abort_step() with parameters, optimizer state and step
// number as before it (tests/offload/faults.cpp, tests/offload/slots.cpp; docs/offload.md).
//
// Host backend only so far (device payloads are arena memory the host can read): the CUDA
// instantiation needs compute-stream events around handovers and device zero fills.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/kernels/grad_norm/grad_norm.hpp"
#include "tide/offload/chunk_source.hpp"
#include "tide/offload/detail/engine_core.hpp"
#include "tide/offload/gradient_sink.hpp"
#include "tide/offload/hooks.hpp"
#include "tide/offload/scheduler_policy.hpp"
#include "tide/offload/scheduler_options.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"

namespace tide::offload {

template <Backend B, Element T, class Policy, class Optimizer = optim::adamw, class Sink = no_sink,
          class Source = host_source>
class scheduler : public detail::engine_core<B, T, std::remove_cv_t<Policy>, Optimizer, Sink, Source> {
  static_assert(!B::is_device, "offload::scheduler runs on tide::host only: instantiate scheduler<tide::host, T, "
                               "Policy> (its device is a budgeted device_arena<tide::host>)");
  static_assert(check_scheduler_policy<std::remove_cv_t<Policy>>(), "offload::scheduler<B, T, Policy>: Policy must be a "
                                                  "SchedulerPolicy (resident, chunked<P>, layer_window<W>, "
                                                  "static_partition, or your own: offload/scheduler_policy.hpp)");
  static_assert(optim::check_optimizer<Optimizer>(), "offload::scheduler: Optimizer must satisfy "
                                                     "tide::optim::Optimizer (optim/optimizer.hpp)");
  static_assert(check_gradient_sink<Sink>(), "offload::scheduler: Sink must satisfy tide::offload::GradientSink "
                                             "(offload/gradient_sink.hpp)");
  static_assert(check_chunk_source<Source>(), "offload::scheduler: Source must satisfy tide::offload::ChunkSource "
                                             "(offload/chunk_source.hpp)");
  using core = detail::engine_core<B, T, std::remove_cv_t<Policy>, Optimizer, Sink, Source>;

 public:
  using backend = B;
  using element_type = T;
  using policy_type = std::remove_cv_t<Policy>;
  using optimizer_type = Optimizer;
  using sink_type = Sink;
  using source_type = Source;
  // bf16 / f16 parameters: an fp32 master chunk per parameter chunk lives with the optimizer
  // state, and the update writes the rounded working copy into the parameter chunk. float: the
  // parameter chunk is the master.
  static constexpr bool has_master = core::has_master;

  scheduler(exec<B> const& ex, memory::device_arena<B>& arena, parameter_list params, block_uses uses,
            Policy const& policy = {}, scheduler_options const& options = {}, Optimizer const& optimizer = {},
            Sink const& sink = {}, Source const& source = {})
      : core(ex, arena, std::move(params), std::move(uses), policy, options, optimizer, sink, source) {
    TIDE_REQUIRE(!options.defer_sink || options.defer_optimizer, "offload::scheduler: options.defer_sink needs "
                 "options.defer_optimizer (the optimizer must not step a chunk before the sink has it)");
    grads_out_.reserve(this->params_.size());  // gradients() allocates nothing per step
  }

  scheduler(scheduler const&) = delete;
  scheduler& operator=(scheduler const&) = delete;

  // Frees every block it holds, also after a failure. A failure still in flight that close() did
  // not report is written to stderr once (a destructor cannot throw).
  ~scheduler() {
    if (!closed_) {
      try {
        this->drain();
      } catch (std::exception const& e) {
        std::fprintf(stderr, "tide: offload::scheduler destroyed with a failure in flight (call close() to have it "
                             "thrown): %s\n", e.what());
      }
    }
    this->release_params_quietly();  // ZeRO-3: no gather writes a block freed below
    this->wait_idle();               // no worker reads or writes a block freed below
    this->runner_.free_deferred();
    this->files_.reset();            // the NVMe tier finishes its reads before its blocks go
    this->undo_.discard();
    this->extra_undo_.discard();
    this->free_all();
    this->runner_.free_ring();  // after the chunks: a chunk freeing a ring block gives it back to the ring
  }

  // Waits for every copy, sink and optimizer step in flight and reports a failure among them
  // (tide::error); the destructor then has nothing to report. The scheduler stays usable.
  void close() {
    this->drain();
    closed_ = true;
  }

  // ---- what it is ---------------------------------------------------------------------------
  [[nodiscard]] static std::string name() { return Policy::name(); }
  [[nodiscard]] chunk::chunk_layout const& layout() const noexcept { return this->layout_; }
  [[nodiscard]] parameter_list const& parameters() const noexcept { return this->params_; }
  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return this->param_.chunk_bytes(); }
  [[nodiscard]] chunk::memory_tracer const& tracer() const noexcept { return this->tracer_; }
  // The chunk list of role r; exp_avg and exp_avg_sq are the optimizer's state lists 0 and 1.
  [[nodiscard]] chunk::chunk_list const& list(chunk::chunk_role r) const {
    switch (r) {
      case chunk::chunk_role::grad: return this->grad_;
      case chunk::chunk_role::master: return this->master_;
      case chunk::chunk_role::exp_avg:
      case chunk::chunk_role::exp_avg_sq: {
        std::size_t const k = r == chunk::chunk_role::exp_avg ? 0 : 1;
        TIDE_REQUIRE(k < this->state_lists, "offload::scheduler::list: ", Optimizer::name, " keeps ",
                     this->state_lists, " state list(s); ask for exp_avg (list 0) only when it keeps one");
        return this->state_[k];
      }
      default: return this->param_;
    }
  }
  [[nodiscard]] offload_stats const& last_step() const noexcept { return this->last_; }
  // Device bytes per moment of the last completed step (the memory tide).
  [[nodiscard]] std::span<tide_sample const> memory_tide() const noexcept { return this->last_tide_; }
  [[nodiscard]] policy_type const& policy() const noexcept { return this->policy_; }
  [[nodiscard]] Optimizer const& optimizer() const noexcept { return this->runner_.optimizer(); }
  [[nodiscard]] Sink& sink() noexcept { return this->sinks_.sink(); }
  [[nodiscard]] Source& source() noexcept { return this->source_; }
  [[nodiscard]] std::int64_t optimizer_steps() const noexcept { return this->t_ - 1; }
  [[nodiscard]] bool os_on_device(std::uint32_t c) const { return this->os_on_device_.at(c); }
  // The host tier's pool (the NVMe tier keeps its bytes under scheduler_options::host_budget).
  [[nodiscard]] memory::pinned_pool_stats host_pool_stats() const { return this->host_.stats(); }
  void reset_host_pool_peak() noexcept { this->host_.reset_peak(); }  // measure one phase (a save, a load)
  // The copy engine every chunk copy goes through (its stats; fail_copy() for fault injection).
  [[nodiscard]] memory::transfer_engine<B>& transfers() noexcept { return this->engine_; }
  // The copy engine of a model's offloaded activations (offload::hooks carries them), on a stream
  // of its own beside the chunk copies; made at the first call or the model's first request.
  [[nodiscard]] memory::transfer_engine<B>& activation_transfers() { return this->activation_engine(); }
  // True between the first hook of a step and the end of step() / skip_step() / abort_step().
  [[nodiscard]] bool in_step() const noexcept { return this->step_open_; }
  // True once the first moment placed the model data (and checked the budget).
  [[nodiscard]] bool placed() const noexcept { return this->placed_; }
  [[nodiscard]] bool evaluating() const noexcept { return this->evaluating_; }

  // ---- the budget -----------------------------------------------------------------------------
  // The least device budget this scheduler can train with when `non_model` bytes of activations
  // and workspaces are live, and what it is made of (text for errors and reports).
  [[nodiscard]] std::size_t minimum_device_bytes(std::size_t non_model) const {
    return this->policy_.minimum(this->ctx_, non_model).bytes;
  }
  [[nodiscard]] std::string minimum_explained(std::size_t non_model) const {
    return this->policy_.minimum(this->ctx_, non_model).why;
  }
  // Refuses the arena's budget if it is below the minimum for `non_model` bytes (tide::error(budget)
  // stating the minimum and its parts). Runs by itself at the first moment of the first step.
  void check_budget(std::size_t non_model) const {
    auto const need = this->policy_.minimum(this->ctx_, non_model);
    TIDE_CHECK(this->ctx_.budget >= need.bytes, budget, "offload ", name(), ": the device budget ",
               bytes_of{this->ctx_.budget}, " is below this scheduler's minimum ", bytes_of{need.bytes}, " = ",
               need.why, "; raise device_budget to at least ", bytes_of{need.bytes}, need.advice);
  }

  // ---- model data -----------------------------------------------------------------------------
  // Valid between the pre_* and post_* hooks of a block that uses parameter i (and outside a
  // step, on the host, for initialisation and inspection; with parameter chunks in the NVMe
  // tier, one such chunk is on the host at a time: the pointer ends when param_data or
  // tensor_bytes asks for a parameter of another one). Inside a step (or an evaluation) a
  // block may ask only for the parameters its uses() list, and for their gradients only in its
  // backward: anything else throws tide::error(usage) naming the parameter and the block. Outside
  // a step the caller may write, so a device-resident chunk forgets its host copy.
  [[nodiscard]] T* param_data(std::uint32_t i) {
    this->check_index(i, "param_data");
    if (this->in_block_) {
      if (!(this->access_[i] & this->readable)) [[unlikely]]
        this->fail_access(i, "parameter");
    } else if (this->step_open_ || this->evaluating_) [[unlikely]] {
      this->fail_access(i, "parameter");
    } else {
      this->drain();
      require_held(i, "param_data");
      this->materialize_param(this->layout_.chunk_of[i]);  // from the NVMe tier's file
      this->drop_shadow(this->layout_.chunk_of[i]);
    }
    return reinterpret_cast<T*>(this->param_.data(i));
  }
  [[nodiscard]] T* grad_data(std::uint32_t i) {
    this->check_index(i, "grad_data");
    bool const open = this->in_block_;
    if ((open && !(this->access_[i] & this->writable_grad)) || (!open && (this->step_open_ || this->evaluating_)))
        [[unlikely]]
      this->fail_access(i, "gradient");
    return reinterpret_cast<T*>(this->grad_.data(i));
  }
  // Parameter i's bytes copied out, wherever its chunk is (after finishing pending work).
  [[nodiscard]] std::vector<T> read_param(std::uint32_t i) {
    this->check_index(i, "read_param");
    this->drain();
    require_held(i, "read_param");
    std::vector<T> out(static_cast<std::size_t>(this->params_[i].numel()));
    std::uint32_t const c = this->layout_.chunk_of[i];
    if (!this->holds_parameters(c)) {  // reuse_grad_slots, inside a step: the slot holds gradients
      auto const* m = reinterpret_cast<float const*>(this->master_.data(i));
      for (std::size_t k = 0; k < out.size(); ++k) out[k] = from_float<T>(m[k]);
      return out;
    }
    std::byte const* const on_file = this->param_file_view(c);
    std::memcpy(out.data(), on_file != nullptr ? on_file + this->layout_.offset_of[i] * sizeof(T) : this->param_.data(i),
                this->params_[i].bytes);
    return out;
  }
  // The bytes of parameter i in the list of `role` (param: T; master and the optimizer's state
  // lists: fp32), host-readable on tide::host wherever the chunk is, after finishing pending
  // work. For checkpoints: valid until the next hook or step. exp_avg / exp_avg_sq name the
  // optimizer's state lists 0 and 1 (state_bytes(k, i) says it for any optimizer).
  // With the NVMe tier (host_budget), one chunk's lists from the file are on the host at a time:
  // asking for another such chunk's state or parameters writes the first back to file, and its
  // spans end then.
  [[nodiscard]] std::span<std::byte> tensor_bytes(chunk::chunk_role role, std::uint32_t i) {
    check_tensor(role, i, "tensor_bytes");
    if (role != chunk::chunk_role::param) this->materialize(this->layout_.chunk_of[i]);  // from the spill file
    if (role == chunk::chunk_role::master) {
      this->init_master();  // a caller reading it sees the current master; one writing it replaces it
      this->master_written_ = true;
    }
    if (role == chunk::chunk_role::param) {
      require_held(i, "tensor_bytes");
      this->materialize_param(this->layout_.chunk_of[i]);  // from the NVMe tier's file
      this->drop_shadow(this->layout_.chunk_of[i]);  // the caller may write
    }
    return {list(role).data(i), tensor_size(role, i)};
  }
  // The same bytes, to read (a checkpoint's save): valid until the next tensor_view, state_view,
  // tensor_bytes, hook or step. The state of a chunk in the NVMe tier is read from the file into
  // one host block, which the views of that chunk's tensors share: a save reads each such chunk
  // once (when the caller asks in chunk order, as train::trainer does) and holds one chunk's
  // state beyond host_budget, however many are in the file. Nothing goes back to file.
  [[nodiscard]] std::span<std::byte const> tensor_view(chunk::chunk_role role, std::uint32_t i) {
    check_tensor(role, i, "tensor_view");
    std::size_t const bytes = tensor_size(role, i);
    if (role == chunk::chunk_role::param) {
      require_held(i, "tensor_view");
      if (std::byte const* on_file = this->param_file_view(this->layout_.chunk_of[i]))
        return {on_file + this->layout_.offset_of[i] * sizeof(T), bytes};
      return {this->param_.data(i), bytes};
    }
    if (role == chunk::chunk_role::master) this->init_master();  // the masters start as the parameters
    std::size_t const k = role == chunk::chunk_role::master ? core::state_lists
                          : role == chunk::chunk_role::exp_avg ? 0 : 1;
    if (std::byte const* lists = this->spilled_view(this->layout_.chunk_of[i], k))
      return {lists + this->layout_.offset_of[i] * sizeof(float), bytes};
    return {list(role).data(i), bytes};
  }
  // Frees the host block the views read state from the NVMe tier into (a save ended; the next
  // step or load frees it too).
  void end_views() { this->drop_view(); }
  [[nodiscard]] std::span<std::byte const> state_view(std::size_t k, std::uint32_t i) {
    TIDE_REQUIRE(k < Optimizer::state_lists, "offload::scheduler::state_view(", k, ", ", i, "): ", Optimizer::name,
                 " keeps ", Optimizer::state_lists, " state lists (k < ", Optimizer::state_lists, ")");
    return tensor_view(k == 0 ? chunk::chunk_role::exp_avg : chunk::chunk_role::exp_avg_sq, i);
  }
  // Under ZeRO (a sharding gradient sink): whether this rank keeps parameter i's master and
  // optimizer state, i.e. owns the chunk it lies in. Always true without sharding.
  [[nodiscard]] bool keeps_state(std::uint32_t i) const {
    this->check_index(i, "keeps_state");
    return this->shard_.owns(this->layout_.chunk_of[i]);
  }
  [[nodiscard]] chunk_shard shard() const noexcept { return this->shard_; }
  // Under ZeRO-3 (a sink that shards parameters, on more than one rank): whether this rank holds
  // parameter i's bytes now. After a step or an evaluation it holds its own chunks only, unless
  // gather_parameters() brought the others; before the first, everything the model initialised
  // (the first block frees the other ranks' chunks). Always true otherwise.
  [[nodiscard]] bool holds_parameter(std::uint32_t i) const {
    this->check_index(i, "holds_parameter");
    return this->has_param(this->layout_.chunk_of[i]);
  }
  [[nodiscard]] bool shards_parameters() const noexcept { return this->params_sharded_; }
  // ZeRO-3, between steps: every rank calls it, and then holds every parameter (read_param,
  // tensor_bytes, param_data work for all of them) until the next step or evaluation frees the
  // chunks of other ranks again: for inspection and checks. What a rank writes into another
  // rank's chunk is not kept: the owner's bytes are the parameters. Before the first step or
  // evaluation a rank still holds what the model initialised, and this gathers nothing. Does
  // nothing without parameter sharding.
  void gather_parameters() {
    TIDE_REQUIRE(!this->step_open_ && !this->evaluating_, "offload::scheduler::gather_parameters inside a step or "
                 "an evaluation; call it between steps, on every rank");
    this->drain();
    this->gather_all();
  }
  // The bytes of parameter i in the optimizer's state list k (Optimizer::state_name(k)).
  [[nodiscard]] std::span<std::byte> state_bytes(std::size_t k, std::uint32_t i) {
    TIDE_REQUIRE(k < Optimizer::state_lists, "offload::scheduler::state_bytes(", k, ", ", i, "): ", Optimizer::name,
                 " keeps ", Optimizer::state_lists, " state lists (k < ", Optimizer::state_lists, ")");
    return tensor_bytes(k == 0 ? chunk::chunk_role::exp_avg : chunk::chunk_role::exp_avg_sq, i);
  }
  // The bytes of parameter i in the sink's extra list k (extra_lists_of<Sink>()[k]: its name and
  // dtype), wherever the chunk is, between steps. For checkpoints.
  [[nodiscard]] std::span<std::byte> extra_bytes(std::size_t k, std::uint32_t i) {
    this->check_index(i, "extra_bytes");
    TIDE_REQUIRE(k < core::extra_count, "offload::scheduler::extra_bytes(", k, ", ", i, "): the sink declares ",
                 core::extra_count, " extra lists");
    TIDE_REQUIRE(!this->step_open_, "offload::scheduler::extra_bytes inside a step; read tensors between steps");
    this->drain();
    return {this->extra_[k].data(i), extra_size(k, i)};
  }
  [[nodiscard]] std::size_t extra_size(std::size_t k, std::uint32_t i) const {
    return static_cast<std::size_t>(this->params_[i].numel()) * size_of(extra_lists_of<Sink>()[k].type);
  }
  [[nodiscard]] chunk::chunk_list const& extra_list(std::size_t k) const { return this->extra_.at(k); }
  // Bytes of parameter i in the list of `role` (what tensor_bytes spans).
  [[nodiscard]] std::size_t tensor_size(chunk::chunk_role role, std::uint32_t i) const {
    this->check_index(i, "tensor_size");
    bool const is_param = role == chunk::chunk_role::param || role == chunk::chunk_role::grad;
    return static_cast<std::size_t>(this->params_[i].numel()) * (is_param ? sizeof(T) : sizeof(float));
  }
  // The optimizer's step number (steps taken), for a resumed run.
  void set_optimizer_steps(std::int64_t steps) {
    TIDE_REQUIRE(steps >= 0 && !this->step_open_, "offload::scheduler::set_optimizer_steps(", steps,
                 "): needs steps >= 0, between steps");
    this->t_ = steps + 1;
  }
  // Gradients to zero: every gradient chunk becomes FREE (created zero-filled when next touched).
  void zero_grad() {
    this->drain();
    this->return_grad_slots(false);  // reuse_grad_slots: the parameters back in their slots
    for (std::uint32_t c = 0; c < this->n_; ++c) this->release_grad(c);
  }
  // Waits for every copy, sink and optimizer step in flight.
  void synchronize() { this->drain(); }

  void set_grad_scale(float s) {
    TIDE_REQUIRE(std::isfinite(s), "offload::scheduler::set_grad_scale(", s,
                 "): a non-finite scale would poison the weights; skip the step instead");
    this->options_.grad_scale = s;
  }
  void set_learning_rate(float lr) { this->lr_ = lr; }

  // Forward passes outside training (validation, generation): chunks are made resident within
  // the budget, nothing is traced, so the trace of the training steps stays. Between steps only.
  void begin_evaluation() {
    TIDE_REQUIRE(!this->step_open_, "offload::scheduler::begin_evaluation inside a training step; call it after step()");
    this->flush_spilled();  // parameters a caller wrote between steps go back to file first
    this->drop_view();
    this->evaluating_ = true;
    this->release_params();  // ZeRO-3: every block takes its parameters from their owners
  }
  void end_evaluation() {
    this->evaluating_ = false;
    this->release_params();  // ZeRO-3: other ranks' chunks are gathered again when next used
  }

  // Records the timeline into `r` (nullptr: stop): each block's compute on the compute lane, each
  // chunk copy on the copy lane (stamped by the copy stream itself), each block's offloaded
  // activations on the activation copy lane (stamped likewise), each host update on the
  // optimizer lane, the sink's work on the comm lane. Write it with r->write(path, name):
  // Perfetto opens it.
  void set_trace(trace_recorder* r) {
    this->drain();
    this->trace_ = r;
  }

  // ---- hooks ----------------------------------------------------------------------------------
  void pre_forward(int block) { enter(block, chunk::phase::forward); }
  void post_forward(int block) {
    if (this->tracing())
      this->trace_->complete(tide::detail::concat("forward ", block), "compute", lane::compute, block_t0_,
                             trace_recorder::now_us());
    for (std::uint32_t i : this->uses_.of(block))
      this->param_.transition(i, this->evaluating_ ? chunk::tensor_state::hold : chunk::tensor_state::hold_after_fwd);
    this->leave_block(block);
    sample_non_model();
    if (this->tracer_.recording() && !this->evaluating_) {  // the warm-up's compute time, for policies
      this->forward_ms_ += detail::ms_since(block_start_);
      ++this->forward_blocks_;
    }
  }
  // Backward visits the blocks last .. first, each once per pass: a chunk goes to the sink and
  // the optimizer after the pass that completes its gradients (micro-steps: after the last pass).
  void pre_backward(int block) {
    if (!this->evaluating_) {
      TIDE_CHECK(block == this->next_backward_, usage, "offload ", name(), ": pre_backward(", block, ") but block ",
                 this->next_backward_, " is next: backward must visit the blocks of uses() in reverse, ",
                 this->uses_.last_block(), " down to ", this->uses_.first_block, ", each once per pass");
      if (block == this->uses_.last_block()) ++this->backward_passes_;  // a pass begins
    }
    enter(block, chunk::phase::backward);
  }
  void post_backward(int block) {
    if (this->tracing())
      this->trace_->complete(tide::detail::concat("backward ", block), "compute", lane::compute, block_t0_,
                             trace_recorder::now_us());
    for (std::uint32_t i : this->uses_.of(block)) {
      this->param_.transition(i, chunk::tensor_state::hold_after_bwd);
      this->grad_.transition(i, chunk::tensor_state::hold_after_bwd);
    }
    this->leave_block(block);
    this->next_backward_ = block == this->uses_.first_block ? this->uses_.last_block() : block - 1;
    sample_non_model();
    if (this->backward_passes_ % this->options_.micro_steps != 0) return;  // gradients accumulate
    this->take_grad_slots(block);  // reuse_grad_slots: the completed gradients move into their parameters' slots
    this->prefetch_spilled(block);  // deferred updates: the first spilled chunks' state reads start now
    sample_non_model();
    if (this->options_.defer_sink) return;  // hand_over_gradients() hands them over
    this->hand_to_sink(block);
    if (this->options_.defer_optimizer) return;  // step() runs it
    this->optimizer_moments_of(block, true);
    add_moves_to_last_sample();  // the optimizer moment's copies belong to this block's bar
  }

  // The gradient of every parameter, in parameter order, wherever its chunk is (host-this->readable on
  // tide::host): for global_grad_norm and any_non_finite. Waits for copies and sinks in flight
  // first. Valid until the next hook or step.
  [[nodiscard]] std::span<kernels::grad_tensor<T> const> gradients() {
    this->drain();
    grads_out_.clear();  // reserved at construction: no allocation per step
    for (std::uint32_t i = 0; i < this->params_.size(); ++i) {
      std::uint32_t const c = this->layout_.chunk_of[i];
      TIDE_REQUIRE(this->grad_chunk(c).payload() != nullptr, "offload::scheduler::gradients: parameter \"",
                   this->params_[i].name(), "\" has no gradient yet (run backward first; after step() gradients are "
                   "freed)");
      grads_out_.push_back({reinterpret_cast<T const*>(this->grad_bytes(i)), this->params_[i].numel()});
    }
    return grads_out_;
  }

  // With options.defer_sink: hands every chunk backward completed to the gradient sink, in the
  // order backward completed them (its last block first), once per step, after the last backward
  // pass and before gradients(), gradient_of() or step().
  void hand_over_gradients() {
    TIDE_REQUIRE(this->options_.defer_sink, "offload::scheduler::hand_over_gradients needs options.defer_sink "
                                            "(without it backward hands each chunk over as it completes)");
    auto const m = static_cast<std::size_t>(this->options_.micro_steps);
    TIDE_REQUIRE(this->step_open_ && this->backward_passes_ > 0 && this->backward_passes_ % m == 0 &&
                     this->next_backward_ == this->uses_.last_block() && !handed_over_,
                 "offload::scheduler::hand_over_gradients: call it once per step, after the last of ", m,
                 " backward passes (", this->backward_passes_ % m, " ran)");
    handed_over_ = true;
    for (int b = this->uses_.last_block(); b >= this->uses_.first_block; --b) this->hand_to_sink(b);
  }

  // Parameter i's gradient, writable wherever its chunk is (host-writable on tide::host), after
  // finishing pending work: for a sum the engine does not make itself (a pipeline's tied
  // embedding, pipeline/stages.hpp), between the last backward and step() with defer_optimizer.
  // Valid until the next hook or step.
  [[nodiscard]] std::span<T> gradient_of(std::uint32_t i) {
    this->check_index(i, "gradient_of");
    TIDE_REQUIRE(this->options_.defer_optimizer, "offload::scheduler::gradient_of needs options.defer_optimizer "
                                                 "(without it the optimizer may already have used the gradient)");
    this->drain();
    TIDE_REQUIRE(this->grad_chunk(this->layout_.chunk_of[i]).payload() != nullptr, "offload::scheduler::gradient_of: "
                 "parameter \"", this->params_[i].name(), "\" has no gradient yet (run backward first)");
    return {reinterpret_cast<T*>(this->grad_bytes(i)), static_cast<std::size_t>(this->params_[i].numel())};
  }

  // Ends an optimizer step: (deferred: runs the optimizer,) waits for it, ends the trace step,
  // publishes the stats.
  void step() { finish(true); }
  // Ends an optimizer step without updating anything (an overflowed loss scale): the gradients
  // are dropped, parameters, optimizer state and the step number stay. The chunks still make the
  // optimizer's moves, so the trace stays the same.
  void skip_step() {
    TIDE_REQUIRE(this->options_.defer_optimizer, "offload::scheduler::skip_step needs options.defer_optimizer "
                                                 "(without it the optimizer already ran after each block's backward)");
    finish(false);
  }

  // Abandons a step that threw, wherever it threw (a hook, the model between hooks, step()):
  // waits for the work in flight, puts back the parameters and optimizer state of every chunk
  // the optimizer stepped in it, drops its gradients and its trace record. make_trainer's step()
  // calls it; a caller driving the hooks by hand calls it from its catch block. Outside a step it
  // does nothing. Never throws: a failure on a worker is kept and reported by every later step
  // and by close(). An evaluation forward that threw inside a block is abandoned the same way.
  void abort_step() noexcept {
    bool const was_in_block = this->in_block_;
    this->in_block_ = false;
    std::fill(this->access_.begin(), this->access_.end(), std::uint8_t{0});
    if (!this->step_open_ && !was_in_block) return;
    this->sinks_.quiet();  // the sink's failures in this step are the step's failure
    try {
      this->drain();
    } catch (std::exception const& e) {
      this->broken_ = e.what();
    }
    this->sinks_.abandon();  // a sink that can start afresh does; no other rank's gradients are kept
    if (this->broken_.empty()) {
      for (detail::undo_record const& r : this->undo_.records()) {
        this->drop_shadow(r.c);  // the host copy of a device-resident chunk may hold the update
        this->undo_.restore(r, this->targets_of(r.c));
      }
      this->extra_undo_.restore(this->extra_);
      this->drop_param_file_copies();
      // reuse_grad_slots: the journal keeps no parameters; every chunk stepped or holding gradients
      // gets round(master) back, after the masters were restored.
      if (this->options_.reuse_grad_slots)
        for (detail::undo_record const& r : this->undo_.records()) this->round_masters_back(r.c);
      this->return_grad_slots(false);
      for (std::uint32_t i = 0; i < this->params_.size(); ++i) {
        if (this->param_.tensor(i).state != chunk::tensor_state::hold)
          this->param_.transition(i, chunk::tensor_state::hold);
        if (this->grad_.tensor(i).state == chunk::tensor_state::compute)
          this->grad_.transition(i, chunk::tensor_state::hold);
      }
      if (this->step_open_) {
        for (std::uint32_t c = 0; c < this->n_; ++c) this->release_grad(c);  // the step's gradients are dropped
        this->aborted_ = true;  // the policy restores its placement at the next step
      }
    }
    this->release_params_quietly();  // ZeRO-3: gathered again when next used
    if (!this->step_open_) return;  // an evaluation: no step to undo
    this->forget_spill_failures();
    if (this->files_) this->files_->abort();  // the files' current slots hold the state before the step
    this->undo_.discard();
    this->extra_undo_.discard();
    this->tracer_.abort_step();
    this->backward_passes_ = 0;
    this->next_backward_ = this->uses_.last_block();
    this->step_open_ = false;
    handed_over_ = false;
    this->cur_ = {};
    this->tide_.clear();
  }

 private:
  // What tensor_bytes and tensor_view check first (after finishing pending work).
  void check_tensor(chunk::chunk_role role, std::uint32_t i, char const* what) {
    this->check_index(i, what);
    TIDE_REQUIRE(!this->step_open_, "offload::scheduler::", what, " inside a step; read tensors between steps");
    this->drain();
    TIDE_REQUIRE(role != chunk::chunk_role::grad && (role != chunk::chunk_role::master || has_master) &&
                     (role != chunk::chunk_role::exp_avg || Optimizer::state_lists >= 1) &&
                     (role != chunk::chunk_role::exp_avg_sq || Optimizer::state_lists >= 2),
                 "offload::scheduler::", what, ": the ", chunk::to_string(role), " list is not kept between steps "
                 "by this scheduler (", Optimizer::name, " keeps ", Optimizer::state_lists, " state lists; T = float "
                 "has no master); ask for param, master with bf16/f16 parameters, or state_bytes(k, i)");
    TIDE_REQUIRE(role == chunk::chunk_role::param || keeps_state(i), "offload::scheduler::", what, ": parameter \"",
                 this->params_[i].name(), "\" lies in chunk ", this->layout_.chunk_of[i], ", whose ",
                 chunk::to_string(role), " rank ", this->shard_.owner(this->layout_.chunk_of[i]), " of ",
                 this->shard_.ranks, " keeps (ZeRO); read it there, or ask keeps_state(i) first");
  }
  void enter(int block, chunk::phase ph) {
    if (this->tracing()) block_t0_ = trace_recorder::now_us();
    TIDE_CHECK(block >= this->uses_.first_block && block <= this->uses_.last_block(), usage, "offload ", name(),
               ": block ", block, " is not one of uses() (", this->uses_.first_block, "..", this->uses_.last_block(), ")");
    TIDE_CHECK(!this->in_block_, usage, "offload ", name(), ": block ", block, " entered while block ", this->block_,
               " is still open; call post_forward / post_backward of each block before the next");
    if (this->evaluating_) {
      TIDE_REQUIRE(ph == chunk::phase::forward, "offload::scheduler: backward during evaluation; call "
                                                "end_evaluation() before training");
      this->require_intact();
      if (!this->placed_) this->first_placement();
      ++this->tick_;
      this->reclaim_stale(false);
      this->gather_for(block, ph);
      this->make_resident(this->ids_of(block, ph), core::untraced);
      for (std::uint32_t i : this->uses_.of(block)) this->param_.transition(i, chunk::tensor_state::compute);
      this->open_block(block, ph);
      return;
    }
    this->begin_step_if_needed();
    ++this->tick_;
    this->reclaim_stale(false);
    auto const& ids = this->ids_of(block, ph);
    std::size_t const t = this->tracer_.at({block, ph}, ids);
    this->current_ = t;
    this->gather_for(block, ph);  // before the block's clock starts: the warm-up times compute only
    if (ph == chunk::phase::forward && this->tracer_.recording()) block_start_ = std::chrono::steady_clock::now();
    this->make_resident(ids, t);
    for (std::uint32_t i : this->uses_.of(block)) {
      this->param_.transition(i, chunk::tensor_state::compute);
      if (ph == chunk::phase::backward) this->grad_.transition(i, chunk::tensor_state::compute);
    }
    sample_non_model();
    this->tide_.push_back({{block, ph}, this->model_on_device(), this->non_model_now(), this->ctx_.budget});
    this->prefetch(t);
    add_moves_to_last_sample();
    this->open_block(block, ph);
  }
  // Bytes fetched and evicted since the last sample go to the newest one.
  void add_moves_to_last_sample() {
    if (this->tide_.empty()) return;
    this->tide_.back().fetched_bytes += this->cur_.h2d_bytes - this->moves_mark_.first;
    this->tide_.back().evicted_bytes += this->evicted_bytes_ - this->moves_mark_.second;
    this->moves_mark_ = {this->cur_.h2d_bytes, this->evicted_bytes_};
  }
  void sample_non_model() {
    if (this->evaluating_) return;
    this->tracer_.non_model(this->current_, this->non_model_now());
    this->cur_.peak_model_bytes = std::max(this->cur_.peak_model_bytes, this->model_bytes_now());
  }

  void require_held(std::uint32_t i, char const* what) const {
    std::uint32_t const c = this->layout_.chunk_of[i];
    TIDE_CHECK(this->has_param(c), usage, "offload::scheduler::", what, "(", i, "): under ZeRO-3 rank ",
               this->shard_.rank, " keeps only its own chunks' parameters between steps, and \"", this->params_[i].name(),
               "\" lies in chunk ", c, " of rank ", this->shard_.owner(c), "; call gather_parameters() on every rank "
               "first, or ask holds_parameter(i)");
  }

  void finish(bool apply) {
    this->require_intact();
    TIDE_REQUIRE(this->step_open_, "offload::scheduler::step() without a forward since the last step");
    auto const m = static_cast<std::size_t>(this->options_.micro_steps);
    TIDE_REQUIRE(this->backward_passes_ % m == 0 && this->backward_passes_ > 0 &&
                     this->next_backward_ == this->uses_.last_block(),
                 "offload::scheduler::step(): ", this->backward_passes_ % m, " of ", m,
                 " micro-step backward passes ran",
                 this->next_backward_ != this->uses_.last_block() ? " (one stopped before its first block)" : "",
                 "; step after the last one");
    TIDE_REQUIRE(!this->options_.defer_sink || handed_over_, "offload::scheduler::step(): with options.defer_sink, "
                 "call hand_over_gradients() after the last backward pass first");
    handed_over_ = false;
    if (this->options_.defer_optimizer)
      for (int b = this->uses_.last_block(); b >= this->uses_.first_block; --b) this->optimizer_moments_of(b, apply);
    auto const t0 = std::chrono::steady_clock::now();
    this->drain();
    this->check_spill();  // a failed spill read or write fails the step; the file keeps the old state
    this->return_grad_slots(apply);  // skipped: the parameters back from the masters
    this->cur_.stall_ms += detail::ms_since(t0);
    if (this->params_sharded_) this->release_params();  // ZeRO-3: gathered again when next used
    else if (apply) this->share_parameters();         // ZeRO-1/2: the parameters other ranks stepped
    this->policy_.after_step(*this);
    this->undo_.discard();  // the step is complete: nothing left to undo
    this->extra_undo_.discard();
    if (this->files_) this->files_->commit();  // the new state on file becomes current
    bool const warm_up = this->tracer_.recording();
    this->tracer_.end_step();
    this->ctx_.recording = false;
    if (warm_up && this->tracer_.warm()) this->after_warm_up();
    if (apply) ++this->t_;
    this->backward_passes_ = 0;
    this->step_open_ = false;
    this->cur_.optimizer_ms += this->runner_.take_ms();
    this->finish_stats(warm_up, this->t_ - 1);
  }
  std::vector<kernels::grad_tensor<T>> grads_out_;  // what gradients() returns
  bool closed_ = false;
  bool handed_over_ = false;  // defer_sink: hand_over_gradients() ran in this step
  double block_t0_ = 0;
  std::chrono::steady_clock::time_point block_start_{};
};

}  // namespace tide::offload
