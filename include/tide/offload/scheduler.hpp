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
// optimizer's state lists stay where the policy placed them (host, or the device). Trace ids: param
// chunk c is c, grad chunk c is n + c (n chunks per list).
//
// One step, hook by hook (what moves where, for chunked<P>): offload/detail/engine_step.hpp and
// docs/offload.md. The scheduler is a façade: it owns the engine (offload/detail/engine.hpp),
// checks what its callers ask, and forwards.
//
// The first step is the warm-up: it keeps only the current moment's chunks on the device and
// records the trace and the non-model bytes per moment (memory_tracer). A budget below the policy's
// minimum is refused at the first moment, before any compute, with a tide::error stating the
// minimum and its parts. Offloading changes no result: the same kernels run on the same bytes, only
// the addresses differ (tests/offload/scheduler.cpp checks bit-identity).
//
// Failures lose nothing: every move acquires before it detaches, and a chunk the optimizer (or a
// sink with extra lists) changes keeps a host copy until the step completes (undo_on_error). A step
// that throws is abandoned by abort_step() with parameters, optimizer state and step number as
// before it (tests/offload/faults.cpp, tests/offload/slots.cpp; docs/offload.md).
//
// On a device backend (tide::sealed, the test device) every copy of a block is ordered after the
// compute work issued before it by an event, zero fills and the optimizer's device steps run on the
// compute stream, and the host reads device memory only through read_param (staged). Not yet there:
// gradient sinks, the NVMe tier, gradient-slot reuse, checkpoint views of device memory.

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
#include "tide/offload/detail/engine.hpp"
#include "tide/offload/gradient_sink.hpp"
#include "tide/offload/hooks.hpp"
#include "tide/offload/scheduler_policy.hpp"
#include "tide/offload/scheduler_options.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"

namespace tide::offload {

template <Backend B, Element T, class Policy, class Optimizer = optim::adamw, class Sink = no_sink,
          class Source = host_source>
class scheduler {
  static_assert(memory::MemoryOps<B>, "offload::scheduler<B, ...>: the engine runs on the backends that supply the "
                "memory operations of tide/memory/ops.hpp (tide::host, tide::sealed); this one does not yet");
  static_assert(!B::is_device || requires(Optimizer const& o, exec<B> const& ex, optim::update_args const& a,
                                          std::span<optim::update_tensor<T, Optimizer::state_lists> const> ts) { o.update(ex, a, ts); },
                "offload::scheduler on a device backend: the Optimizer's update must take exec<B> for the chunks "
                "whose state lives on the device (template <Backend B, class T> void update(exec<B> const&, ...); "
                "tide::optim::adamw, adam and sgd do)");
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
      : e_(ex, arena, std::move(params), std::move(uses), policy, options, optimizer, sink, source) {
    TIDE_REQUIRE(!options.defer_sink || options.defer_optimizer, "offload::scheduler: options.defer_sink needs "
                 "options.defer_optimizer (the optimizer must not step a chunk before the sink has it)");
    grads_out_.reserve(e_.store_.params_.size());  // gradients() allocates nothing per step
  }

  scheduler(scheduler const&) = delete;
  scheduler& operator=(scheduler const&) = delete;

  // Frees every block it holds, also after a failure. A failure still in flight that close() did
  // not report is written to stderr once (a destructor cannot throw).
  ~scheduler() {
    if (!closed_) {
      try {
        e_.drain();
      } catch (std::exception const& e) {
        std::fprintf(stderr, "tide: offload::scheduler destroyed with a failure in flight (call close() to have it "
                             "thrown): %s\n", e.what());
      }
    }
  }  // then the engine frees every block it holds

  // Waits for every copy, sink and optimizer step in flight and reports a failure among them
  // (tide::error); the destructor then has nothing to report. The scheduler stays usable.
  void close() {
    e_.drain();
    closed_ = true;
  }
  // ---- what it is ---------------------------------------------------------------------------
  [[nodiscard]] static std::string name() { return Policy::name(); }
  [[nodiscard]] chunk::chunk_layout const& layout() const noexcept { return e_.store_.layout_; }
  [[nodiscard]] parameter_list const& parameters() const noexcept { return e_.store_.params_; }
  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return e_.store_.param_.chunk_bytes(); }
  [[nodiscard]] chunk::memory_tracer const& tracer() const noexcept { return e_.res_.plan_.tracer; }
  // The chunk list of role r (param, grad, master); state_list(k) is the optimizer's list k.
  [[nodiscard]] chunk::chunk_list const& list(chunk::chunk_role r) const {
    TIDE_REQUIRE(r != chunk::chunk_role::state && r != chunk::chunk_role::extra, "offload::scheduler::list(",
                 chunk::to_string(r), "): ask for the optimizer's list k with state_list(k), a sink's with extra_list(k)");
    return r == chunk::chunk_role::grad ? e_.store_.grad_ : r == chunk::chunk_role::master ? e_.store_.master_
                                                                                          : e_.store_.param_;
  }
  [[nodiscard]] chunk::chunk_list const& state_list(std::size_t k) const {
    TIDE_REQUIRE(k < e_.state_lists, "offload::scheduler::state_list(", k, "): ", Optimizer::name, " keeps ",
                 e_.state_lists, " state lists");
    return e_.store_.state_[k];
  }
  [[nodiscard]] offload_stats const& last_step() const noexcept { return e_.res_.last_; }
  // Device bytes per moment of the last completed step (the memory tide).
  [[nodiscard]] std::span<tide_sample const> memory_tide() const noexcept { return e_.res_.last_tide_; }
  [[nodiscard]] policy_type const& policy() const noexcept { return e_.res_.plan_.policy; }
  [[nodiscard]] Optimizer const& optimizer() const noexcept { return e_.runner_.optimizer(); }
  [[nodiscard]] Sink& sink() noexcept { return e_.sinks_.sink(); }
  [[nodiscard]] Source& source() noexcept { return e_.source_; }
  [[nodiscard]] std::int64_t optimizer_steps() const noexcept { return e_.t_ - 1; }
  [[nodiscard]] bool os_on_device(std::uint32_t c) const { return e_.os_on_device_.at(c); }
  // The host tier's pool (the NVMe tier keeps its bytes under scheduler_options::host_budget).
  [[nodiscard]] memory::pinned_pool_stats host_pool_stats() const { return e_.store_.host_.stats(); }
  void reset_host_pool_peak() noexcept { e_.store_.host_.reset_peak(); }  // measure one phase (a save, a load)
  // The copy engine every chunk copy goes through (its stats; fail_copy() for fault injection).
  [[nodiscard]] memory::transfer_engine<B>& transfers() noexcept { return e_.store_.engine_; }
  // The copy engine of a model's offloaded activations (offload::hooks carries them), on a stream
  // of its own beside the chunk copies; made at the first call or the model's first request.
  [[nodiscard]] memory::transfer_engine<B>& activation_transfers() { return e_.store_.activation_engine(); }
  // True between the first hook of a step and the end of step() / skip_step() / abort_step().
  [[nodiscard]] bool in_step() const noexcept { return e_.step_open_; }
  // True once the first moment placed the model data (and checked the budget).
  [[nodiscard]] bool placed() const noexcept { return e_.placed_; }
  [[nodiscard]] bool evaluating() const noexcept { return e_.evaluating_; }
  // ---- the budget -----------------------------------------------------------------------------
  // The least device budget this scheduler can train with when `non_model` bytes of activations
  // and workspaces are live, and what it is made of (text for errors and reports).
  [[nodiscard]] std::size_t minimum_device_bytes(std::size_t non_model) const {
    return e_.res_.plan_.policy.minimum(e_.res_.plan_.ctx, non_model).bytes;
  }
  [[nodiscard]] std::string minimum_explained(std::size_t non_model) const {
    return e_.res_.plan_.policy.minimum(e_.res_.plan_.ctx, non_model).why;
  }
  // Refuses the arena's budget if it is below the minimum for `non_model` bytes (tide::error(budget)
  // stating the minimum and its parts). Runs by itself at the first moment of the first step.
  void check_budget(std::size_t non_model) const {
    auto const need = e_.res_.plan_.policy.minimum(e_.res_.plan_.ctx, non_model);
    TIDE_CHECK(e_.res_.plan_.ctx.budget >= need.bytes, budget, "offload ", name(), ": the device budget ",
               bytes_of{e_.res_.plan_.ctx.budget}, " is below this scheduler's minimum ", bytes_of{need.bytes}, " = ",
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
    e_.res_.check_index(i, "param_data");
    if (e_.res_.access_.in_block()) {
      if (!e_.res_.access_.may_read(i)) [[unlikely]]
        e_.res_.fail_access(i, "parameter");
    } else if (e_.step_open_ || e_.evaluating_) [[unlikely]] {
      e_.res_.fail_access(i, "parameter");
    } else {
      e_.drain();
      e_.require_held(i, "param_data");
      e_.materialize_param(e_.store_.layout_.chunk_of[i]);  // from the NVMe tier's file
      e_.store_.drop_shadow(e_.store_.layout_.chunk_of[i]);
      e_.require_host_side(e_.store_.param_, i, "param_data");
    }
    return reinterpret_cast<T*>(e_.store_.param_.data(i));
  }
  [[nodiscard]] T* grad_data(std::uint32_t i) {
    e_.res_.check_index(i, "grad_data");
    bool const open = e_.res_.access_.in_block();
    if ((open && !e_.res_.access_.may_write_grad(i)) || (!open && (e_.step_open_ || e_.evaluating_)))
        [[unlikely]]
      e_.res_.fail_access(i, "gradient");
    return reinterpret_cast<T*>(e_.store_.grad_.data(i));
  }
  // Parameter i's bytes copied out, wherever its chunk is (after finishing pending work).
  [[nodiscard]] std::vector<T> read_param(std::uint32_t i) {
    e_.res_.check_index(i, "read_param");
    e_.drain();
    e_.require_held(i, "read_param");
    std::vector<T> out(static_cast<std::size_t>(e_.store_.params_[i].numel()));
    std::uint32_t const c = e_.store_.layout_.chunk_of[i];
    if (!e_.holds_parameters(c)) {  // reuse_grad_slots, inside a step: the slot holds gradients
      auto const* m = reinterpret_cast<float const*>(e_.store_.master_.data(i));
      for (std::size_t k = 0; k < out.size(); ++k) out[k] = from_float<T>(m[k]);
      return out;
    }
    std::byte const* const on_file = e_.param_file_view(c);
    memory::read_to_host(e_.store_.ex_, out.data(), on_file != nullptr ? on_file + e_.store_.layout_.offset_of[i] * sizeof(T)
                                                                : e_.store_.param_.data(i), e_.store_.params_[i].bytes);
    return out;
  }
  // The bytes of parameter i in the list of `role` (param: T; master and the optimizer's state
  // lists: fp32), host-readable wherever the chunk is (on a device backend staged through one
  // host block, written back when the span ends), after finishing pending work. For checkpoints:
  // valid until the next tensor_bytes or tensor_view, read, hook or step. State list k:
  // state_bytes(k, i).
  // With the NVMe tier (host_budget), one chunk's lists from the file are on the host at a time:
  // asking for another such chunk's state or parameters writes the first back to file, and its
  // spans end then.
  [[nodiscard]] std::span<std::byte> tensor_bytes(chunk::chunk_role role, std::uint32_t i) {
    return list_bytes(role, no_list, i);
  }
  // The same bytes, to read (a checkpoint's save): valid until the next tensor_view, state_view,
  // tensor_bytes, hook or step. The state of a chunk in the NVMe tier is read from the file into
  // one host block, which the views of that chunk's tensors share: a save reads each such chunk
  // once (when the caller asks in chunk order, as train::trainer does) and holds one chunk's
  // state beyond host_budget, however many are in the file. Nothing goes back to file.
  [[nodiscard]] std::span<std::byte const> tensor_view(chunk::chunk_role role, std::uint32_t i) {
    return list_view(role, no_list, i);
  }
  // Frees the host block the views read state from the NVMe tier into (a save ended; the next
  // step or load frees it too).
  void end_views() {
    e_.flush_views();
    e_.drop_view();
  }
  [[nodiscard]] std::span<std::byte const> state_view(std::size_t k, std::uint32_t i) {
    return list_view(chunk::chunk_role::state, k, i);
  }
  // Under ZeRO (a sharding gradient sink): whether this rank keeps parameter i's master and
  // optimizer state, i.e. owns the chunk it lies in. Always true without sharding.
  [[nodiscard]] bool keeps_state(std::uint32_t i) const {
    e_.res_.check_index(i, "keeps_state");
    return e_.store_.shard_.owns(e_.store_.layout_.chunk_of[i]);
  }
  [[nodiscard]] chunk_shard shard() const noexcept { return e_.store_.shard_; }
  // Under ZeRO-3 (a sink that shards parameters, on more than one rank): whether this rank holds
  // parameter i's bytes now. After a step or an evaluation it holds its own chunks only, unless
  // gather_parameters() brought the others; before the first, everything the model initialised
  // (the first block frees the other ranks' chunks). Always true otherwise.
  [[nodiscard]] bool holds_parameter(std::uint32_t i) const {
    e_.res_.check_index(i, "holds_parameter");
    return e_.has_param(e_.store_.layout_.chunk_of[i]);
  }
  [[nodiscard]] bool shards_parameters() const noexcept { return e_.params_sharded_; }
  // ZeRO-3, between steps: every rank calls it, and then holds every parameter (read_param,
  // tensor_bytes, param_data work for all of them) until the next step or evaluation frees the
  // chunks of other ranks again: for inspection and checks. What a rank writes into another
  // rank's chunk is not kept: the owner's bytes are the parameters. Before the first step or
  // evaluation a rank still holds what the model initialised, and this gathers nothing. Does
  // nothing without parameter sharding.
  void gather_parameters() {
    TIDE_REQUIRE(!e_.step_open_ && !e_.evaluating_, "offload::scheduler::gather_parameters inside a step or "
                 "an evaluation; call it between steps, on every rank");
    e_.drain();
    e_.gather_all();
  }
  // The bytes of parameter i in the optimizer's state list k (Optimizer::state_name(k)).
  [[nodiscard]] std::span<std::byte> state_bytes(std::size_t k, std::uint32_t i) {
    return list_bytes(chunk::chunk_role::state, k, i);
  }

  // The bytes of parameter i in the sink's extra list k (extra_lists_of<Sink>()[k]: its name and
  // dtype), wherever the chunk is, between steps. For checkpoints.
  [[nodiscard]] std::span<std::byte> extra_bytes(std::size_t k, std::uint32_t i) {
    e_.res_.check_index(i, "extra_bytes");
    TIDE_REQUIRE(k < core::extra_count, "offload::scheduler::extra_bytes(", k, ", ", i, "): the sink declares ",
                 core::extra_count, " extra lists");
    TIDE_REQUIRE(!e_.step_open_, "offload::scheduler::extra_bytes inside a step; read tensors between steps");
    e_.drain();
    return {e_.store_.extra_[k].data(i), extra_size(k, i)};
  }
  [[nodiscard]] std::size_t extra_size(std::size_t k, std::uint32_t i) const {
    return static_cast<std::size_t>(e_.store_.params_[i].numel()) * size_of(extra_lists_of<Sink>()[k].type);
  }
  [[nodiscard]] chunk::chunk_list const& extra_list(std::size_t k) const { return e_.store_.extra_.at(k); }
  // Bytes of parameter i in the list of `role` (what tensor_bytes spans).
  [[nodiscard]] std::size_t tensor_size(chunk::chunk_role role, std::uint32_t i) const {
    e_.res_.check_index(i, "tensor_size");
    bool const is_param = role == chunk::chunk_role::param || role == chunk::chunk_role::grad;
    return static_cast<std::size_t>(e_.store_.params_[i].numel()) * (is_param ? sizeof(T) : sizeof(float));
  }
  // The optimizer's step number (steps taken), for a resumed run.
  void set_optimizer_steps(std::int64_t steps) {
    TIDE_REQUIRE(steps >= 0 && !e_.step_open_, "offload::scheduler::set_optimizer_steps(", steps,
                 "): needs steps >= 0, between steps");
    e_.t_ = steps + 1;
  }
  // Gradients to zero: every gradient chunk becomes FREE (created zero-filled when next touched).
  void zero_grad() {
    e_.drain();
    e_.return_grad_slots(false);  // reuse_grad_slots: the parameters back in their slots
    for (std::uint32_t c = 0; c < e_.store_.n_; ++c) e_.release_grad(c);
  }
  // Waits for every copy, sink and optimizer step in flight.
  void synchronize() { e_.drain(); }

  void set_grad_scale(float s) {
    TIDE_REQUIRE(std::isfinite(s), "offload::scheduler::set_grad_scale(", s,
                 "): a non-finite scale would poison the weights; skip the step instead");
    e_.options_.grad_scale = s;
  }
  void set_learning_rate(float lr) { e_.lr_ = lr; }

  // Forward passes outside training (validation, generation): chunks are made resident within
  // the budget, nothing is traced, so the trace of the training steps stays. Between steps only.
  void begin_evaluation() {
    TIDE_REQUIRE(!e_.step_open_, "offload::scheduler::begin_evaluation inside a training step; call it after step()");
    e_.flush_views();    // a tensor a caller wrote between steps goes back to the device
    e_.flush_spilled();  // parameters a caller wrote between steps go back to file first
    e_.drop_view();
    e_.evaluating_ = true;
    e_.release_params();  // ZeRO-3: every block takes its parameters from their owners
  }
  void end_evaluation() {
    e_.evaluating_ = false;
    e_.release_params();  // ZeRO-3: other ranks' chunks are gathered again when next used
    if (e_.store_.tracing()) e_.drain();  // a device's compute spans reach the timeline now
  }

  // Records the timeline into `r` (nullptr: stop): each block's compute on the compute lane, each chunk
  // copy on the copy lane (stamped by the copy stream itself), each block's offloaded activations on
  // the activation copy lane (stamped likewise), each host update on the optimizer lane, the sink's
  // work on the comm lane. Write it with r->write(path, name): Perfetto opens it.
  void set_trace(trace_recorder* r) {
    e_.drain();
    e_.store_.trace_ = r;
  }
  // ---- the model's offloaded activations (offload::hooks carries them) -------------------------
  // Host room from the host pool (under host_budget: what the model data kept on the host leaves
  // of it, host_reserve), and each block's copies on a copy stream of their own, beside the chunk
  // copies, on the timeline's activation copy lane.
  std::byte* activation_host(std::size_t bytes) { return e_.activation_host(bytes); }
  void release_activation_host(std::byte* p, std::size_t bytes) noexcept { e_.release_activation_host(p, bytes); }
  void copy_activations(int block, memory::copy_direction d, std::span<memory::copy_request const> copies,
                        memory::event<B> const& ready, memory::event<B>& done) {
    e_.copy_activations(block, d, copies, ready, done);
  }
  void drain_activations() noexcept { e_.drain_activations(); }  // a failed copy: the step reports it
  [[nodiscard]] std::size_t activation_host_bytes() const noexcept { return e_.activation_host_bytes(); }
  // ---- hooks ----------------------------------------------------------------------------------
  void pre_forward(int block) { e_.enter(block, chunk::phase::forward); }
  void post_forward(int block) { e_.post_forward(block); }
  // Backward visits the blocks last .. first, each once per pass (uses().runs: each run apart): a
  // chunk goes to the sink and the optimizer after the pass that completes its gradients. A split
  // backward's input pass (B) reads the parameters only; its weight pass (W) is the backward.
  void pre_backward(int block) { e_.pre_backward(block); }
  void post_backward(int block) { e_.post_backward(block); }
  void pre_backward_input(int block) { e_.pre_backward_input(block); }
  void post_backward_input(int block) { e_.post_backward_input(block); }

  // The gradient of every parameter, in parameter order, wherever its chunk is (host-readable on
  // tide::host): for global_grad_norm and any_non_finite. Waits for copies and sinks in flight
  // first. Valid until the next hook or step.
  [[nodiscard]] std::span<kernels::grad_tensor<T> const> gradients() {
    e_.drain();
    grads_out_.clear();  // reserved at construction: no allocation per step
    for (std::uint32_t i = 0; i < e_.store_.params_.size(); ++i) {
      std::uint32_t const c = e_.store_.layout_.chunk_of[i];
      TIDE_REQUIRE(e_.grad_chunk(c).payload() != nullptr, "offload::scheduler::gradients: parameter \"",
                   e_.store_.params_[i].name(), "\" has no gradient yet (run backward first; after step() gradients are "
                   "freed)");
      grads_out_.push_back({reinterpret_cast<T const*>(e_.grad_bytes(i)), e_.store_.params_[i].numel()});
    }
    return grads_out_;
  }

  // With options.defer_sink: hands every chunk backward completed to the gradient sink, in the
  // order backward completed them (its last block first), once per step, after the last backward
  // pass and before gradients(), gradient_of() or step().
  void hand_over_gradients() { e_.hand_over_gradients(); }

  // Parameter i's gradient, writable wherever its chunk is (host-writable on tide::host), after
  // pending work: for a sum the engine does not make itself (a pipeline's tied embedding), between
  // the last backward and step() with defer_optimizer. Valid until the next hook or step.
  [[nodiscard]] std::span<T> gradient_of(std::uint32_t i) {
    e_.res_.check_index(i, "gradient_of");
    TIDE_REQUIRE(e_.options_.defer_optimizer, "offload::scheduler::gradient_of needs options.defer_optimizer "
                                                 "(without it the optimizer may already have used the gradient)");
    e_.drain();
    TIDE_REQUIRE(e_.grad_chunk(e_.store_.layout_.chunk_of[i]).payload() != nullptr, "offload::scheduler::gradient_of: "
                 "parameter \"", e_.store_.params_[i].name(), "\" has no gradient yet (run backward first)");
    return {reinterpret_cast<T*>(e_.grad_bytes(i)), static_cast<std::size_t>(e_.store_.params_[i].numel())};
  }

  // Ends an optimizer step: (deferred: runs the optimizer,) waits for it, ends the trace step,
  // publishes the stats.
  void step() { e_.finish(true); }
  // Ends an optimizer step without updating anything (an overflowed loss scale): the gradients are
  // dropped; parameters, optimizer state, step number and trace (the same moves) stay.
  void skip_step() {
    TIDE_REQUIRE(e_.options_.defer_optimizer, "offload::scheduler::skip_step needs options.defer_optimizer "
                                                 "(without it the optimizer already ran after each block's backward)");
    e_.finish(false);
  }

  // Abandons a step that threw, wherever it threw (a hook, the model between hooks, step()): waits
  // for the work in flight, puts back the parameters and optimizer state of every chunk stepped in
  // it, drops its gradients and its trace record. make_trainer's step() calls it; a caller driving
  // the hooks calls it from its catch block; outside a step it does nothing. Never throws: a worker's
  // failure is kept and reported by every later step and by close(). Evaluation: the same.
  void abort_step() noexcept { e_.abort_step(); }

 private:
  [[nodiscard]] chunk::chunk_list const& list_of(chunk::chunk_role role, std::size_t k) const {
    return role == chunk::chunk_role::state ? e_.store_.state_[k] : list(role);
  }
  [[nodiscard]] std::span<std::byte> list_bytes(chunk::chunk_role role, std::size_t k, std::uint32_t i) {
    check_tensor(role, i, "tensor_bytes", k);
    if (role != chunk::chunk_role::param) e_.materialize(e_.store_.layout_.chunk_of[i]);  // from the spill file
    if (role == chunk::chunk_role::master) {
      e_.init_master();  // a caller reading it sees the current master; one writing it replaces it
      e_.master_written_ = true;
    }
    if (role == chunk::chunk_role::param) {
      e_.require_held(i, "tensor_bytes");
      e_.materialize_param(e_.store_.layout_.chunk_of[i]);  // from the NVMe tier's file
      e_.store_.drop_shadow(e_.store_.layout_.chunk_of[i]);  // the caller may write
    }
    return e_.host_side(list_of(role, k), i, tensor_size(role, i), true);
  }
  [[nodiscard]] std::span<std::byte const> list_view(chunk::chunk_role role, std::size_t list, std::uint32_t i) {
    check_tensor(role, i, "tensor_view", list);
    std::size_t const bytes = tensor_size(role, i);
    if (role == chunk::chunk_role::param) {
      e_.require_held(i, "tensor_view");
      if (std::byte const* on_file = e_.param_file_view(e_.store_.layout_.chunk_of[i]))
        return {on_file + e_.store_.layout_.offset_of[i] * sizeof(T), bytes};
      return e_.host_side(e_.store_.param_, i, bytes, false);
    }
    if (role == chunk::chunk_role::master) e_.init_master();  // the masters start as the parameters
    std::size_t const k = role == chunk::chunk_role::master ? core::state_lists : list;
    if (std::byte const* lists = e_.spilled_view(e_.store_.layout_.chunk_of[i], k))
      return {lists + e_.store_.layout_.offset_of[i] * sizeof(float), bytes};
    return e_.host_side(list_of(role, list), i, bytes, false);
  }
  static constexpr std::size_t no_list = ~std::size_t{0};  // not a state list
  // What tensor_bytes and tensor_view check first (after finishing pending work); k: the state
  // list, for role state.
  void check_tensor(chunk::chunk_role role, std::uint32_t i, char const* what, std::size_t k) {
    TIDE_REQUIRE(role != chunk::chunk_role::state || k < Optimizer::state_lists, "offload::scheduler::", what, ": ",
                 Optimizer::name, " keeps ", Optimizer::state_lists, " state lists; ask for list k < ",
                 Optimizer::state_lists, " with state_bytes(k, i) or state_view(k, i)");
    e_.res_.check_index(i, what);
    TIDE_REQUIRE(!e_.step_open_, "offload::scheduler::", what, " inside a step; read tensors between steps");
    e_.drain();
    TIDE_REQUIRE(role != chunk::chunk_role::grad && role != chunk::chunk_role::extra &&
                     (role != chunk::chunk_role::master || has_master),
                 "offload::scheduler::", what, ": the ", chunk::to_string(role), " list is not kept between steps "
                 "by this scheduler (T = float has no master); ask for param, master with bf16/f16 parameters, "
                 "state_bytes(k, i) or extra_bytes(k, i)");
    TIDE_REQUIRE(role == chunk::chunk_role::param || keeps_state(i), "offload::scheduler::", what, ": parameter \"",
                 e_.store_.params_[i].name(), "\" lies in chunk ", e_.store_.layout_.chunk_of[i], ", whose ",
                 chunk::to_string(role), " rank ", e_.store_.shard_.owner(e_.store_.layout_.chunk_of[i]), " of ",
                 e_.store_.shard_.ranks, " keeps (ZeRO); read it there, or ask keeps_state(i) first");
  }

  core e_;  // the engine: every part, and the step
  std::vector<kernels::grad_tensor<T>> grads_out_;  // what gradients() returns
  bool closed_ = false;
};

}  // namespace tide::offload
