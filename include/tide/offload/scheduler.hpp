#pragma once
// scheduler<B, T, Config>: the model data of a model (parameters, gradients, AdamW state) in
// chunks, moved between the device arena and the host as Config (offload/schedulers.hpp) says,
// and the optimizer stepped chunk by chunk as soon as a chunk's gradients are complete.
//
//   tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
//   auto const cfg = tide::nn::gpt_config{...};
//   using sched_t = tide::offload::scheduler<tide::host, float, tide::offload::chunked<tide::offload::belady>>;
//   sched_t sched{ex, arena, tide::nn::gpt_parameters(cfg, tide::dtype::f32), tide::nn::gpt_block_uses(cfg),
//                 {.chunk_bytes = 1_MiB}, {.adamw = {.lr = 1e-3f}}};
//   tide::nn::gpt<tide::host, float, tide::offload::hooks<sched_t>> model{cfg, arena, {}, {&sched}};
//   for (...) { model.forward(ex, x, y); model.backward(ex); sched.step(); sched.last_step(); }
//
// Lists: param (T) and grad (T) chunks move; AdamW's m and v (fp32) stay where the placement put
// them (host, or the device when the warm-up found room). Trace ids: param chunk c is c, grad
// chunk c is n + c (n chunks per list).
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
//   post_backward(b) tensors -> HOLD_AFTER_BWD; every chunk whose last backward use was b is
//                    stepped: on the device when its state is there, else its parameter and
//                    gradient chunks are copied to the host and the host AdamW runs on the
//                    optimizer worker beside the rest of backward; the gradient chunk is freed
//   step()           waits for the optimizer, ends the step (the warm-up step becomes the trace)
//
// The first step is the warm-up: it keeps only the current moment's chunks on the device and
// records the trace and the non-model bytes per moment (memory_tracer). A budget below the
// scheduler's minimum is refused at the first moment, before any compute, with a tide::error
// stating the minimum and its parts. Offloading changes no result: the same kernels run on the
// same bytes, only the addresses differ (tests/offload/scheduler.cpp checks bit-identity).
//
// Failures lose nothing. Every allocation and copy is acquired before the chunk it is for lets go
// of its old block, and a chunk stepped by the optimizer first keeps a host copy of its
// parameters and AdamW state (undo_on_error). A step that throws (an arena that cannot give a
// block, a copy that cannot be issued, a model or hook that throws between the hooks) is then
// abandoned by abort_step(): parameters, optimizer state and AdamW's step number are as before
// the step, its gradients are dropped, and the next step, a checkpoint or destruction works.
// (tests/offload/faults.cpp injects a failure at every allocation and copy of a step.) A failure
// on a worker after its copy or step was issued (a device fault on tide::cuda) cannot be undone:
// the scheduler reports it from then on and refuses further steps.
//
// Host backend only so far (device payloads are arena memory the host can read): the CUDA
// instantiation needs compute-stream events around handovers and device zero fills.

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/chunk/chunk.hpp"
#include "tide/chunk/layout.hpp"
#include "tide/chunk/memory_tracer.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/kernels/adamw/adamw.hpp"
#include "tide/kernels/grad_norm/grad_norm.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/pinned_pool.hpp"
#include "tide/memory/stream.hpp"
#include "tide/memory/transfer_engine.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/nn/parameters.hpp"
#include "tide/offload/policy.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/offload/stats.hpp"
#include "tide/offload/trace_events.hpp"

namespace tide::offload {

struct scheduler_options {
  kernels::adamw_hparams adamw{};
  float grad_scale = 1.f;        // multiplies every gradient in the step (clipping, loss-scale unscaling)
  int micro_steps = 1;           // backward passes per optimizer step (gradient accumulation)
  bool overlap_optimizer = true; // host steps run on the optimizer worker beside backward
  // The optimizer runs in step() instead of after each block's backward: what global-norm
  // clipping and loss scaling need (the norm and the overflow check read every gradient first).
  bool defer_optimizer = false;
  // Weight decay on matrices only (rank >= 2), not on biases and LayerNorm gains (GPT-2's rule).
  bool decay_matrices_only = false;
  bool lock_host_pages = false;  // host tier: mlock (pointless on tide::host, where nothing DMAs)
  // A chunk stepped inside a step keeps a host copy of its parameters and AdamW state until the
  // step completes, so a step that throws can be undone (abort_step). Costs host memory of up to
  // the stepped state (12 B per fp32 parameter at the end of a step) and one copy of it per step
  // (bench/offload undo_on_error_vs_off: 13 % of a 58 M-parameter GPT's step on 2 cores);
  // off, a step that throws after the optimizer started may leave some chunks updated.
  bool undo_on_error = true;
};

namespace detail {

template <class C>
inline constexpr bool is_chunked = requires { C{}.policy; };
template <class C>
inline constexpr bool is_window = requires { C::window; };
template <class C>
inline constexpr bool is_static = std::is_same_v<C, static_partition>;
template <class C>
inline constexpr bool is_resident = std::is_same_v<C, resident>;

template <class C>
struct policy_of {
  using type = belady;  // layer_window and static_partition evict by furthest next use
};
template <class C>
  requires is_chunked<C>
struct policy_of<C> {
  using type = decltype(C{}.policy);
};

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

template <Backend B, Element T, class Config>
class scheduler {
  static_assert(!B::is_device, "offload::scheduler runs on tide::host only: instantiate scheduler<tide::host, T, "
                               "Config> (its device is a budgeted device_arena<tide::host>)");
  static_assert(detail::is_chunked<Config> || detail::is_window<Config> || detail::is_static<Config> ||
                    detail::is_resident<Config>,
                "offload::scheduler<B, T, Config>: Config must be resident, chunked<Policy>, layer_window<W> or "
                "static_partition (tide/offload/schedulers.hpp)");

 public:
  using backend = B;
  using element_type = T;
  using config_type = Config;
  using policy_type = typename detail::policy_of<Config>::type;
  // bf16 / f16 parameters: an fp32 master chunk per parameter chunk lives with the AdamW state,
  // and the update writes the rounded working copy into the parameter chunk. float: the
  // parameter chunk is the master.
  static constexpr bool has_master = !std::is_same_v<T, float>;

  scheduler(exec<B> const& ex, memory::device_arena<B>& arena, nn::parameter_list params, nn::block_uses uses,
            Config const& config = {}, scheduler_options const& options = {})
      : ex_(ex),
        arena_(&arena),
        params_(std::move(params)),
        uses_(std::move(uses)),
        config_(config),
        options_(options),
        layout_(make_layout()),
        param_(chunk::chunk_role::param, dtype_of<T>, layout_, params_),
        grad_(chunk::chunk_role::grad, dtype_of<T>, layout_, params_),
        master_(chunk::chunk_role::master, dtype::f32, layout_, params_),
        m_(chunk::chunk_role::exp_avg, dtype::f32, layout_, params_),
        v_(chunk::chunk_role::exp_avg_sq, dtype::f32, layout_, params_),
        host_(memory::pinned_pool_options{.lock_pages = options.lock_host_pages}),
        engine_(copy_stream_, {.max_in_flight = 8}),
        tracer_({.device_budget = arena.config().budget, .reserved = reserved_bytes()}) {
    TIDE_REQUIRE(options_.micro_steps >= 1, "offload::scheduler: micro_steps = ", options_.micro_steps,
                 "; pass the number of backward passes per optimizer step, >= 1");
    n_ = static_cast<std::uint32_t>(layout_.chunks());
    ids_ = 2 * n_;
    ready_.resize(ids_);
    busy_.resize(n_);
    stale_.assign(ids_, nullptr);
    stale_where_.assign(ids_, chunk::tier::host);
    shadow_.assign(n_, nullptr);
    optimizer_pending_.assign(n_, false);
    in_flight_.assign(ids_, false);
    os_on_device_.assign(n_, false);
    tracer_.set_chunks(ids_);
    build_moments();
    // Parameters and optimizer state start on the host, zeroed: the model initialises them there.
    for (std::uint32_t c = 0; c < n_; ++c) {
      attach_host_zeroed(param_[c]);
      attach_host_zeroed(m_[c]);
      attach_host_zeroed(v_[c]);
      if constexpr (has_master) attach_host_zeroed(master_[c]);
    }
    for (std::uint32_t i = 0; i < params_.size(); ++i) param_.transition(i, chunk::tensor_state::hold);
    jobs_.resize(n_);
    next_backward_ = uses_.last_block();
    // Everything the steady state appends to is sized here: a step allocates nothing on the heap.
    undo_.reserve(n_);
    access_.assign(params_.size(), 0);
    grads_out_.reserve(params_.size());
    pending_grad_frees_.reserve(n_);
    decayed_.resize(n_);
    plain_.resize(n_);
    for (std::uint32_t c = 0; c < n_; ++c) {
      std::size_t matrices = 0;
      for (std::uint32_t i = layout_.first_param[c]; i < layout_.first_param[c + 1]; ++i)
        matrices += params_[i].shape.rank >= 2 ? 1 : 0;
      decayed_[c].reserve(matrices);
      plain_[c].reserve(layout_.first_param[c + 1] - layout_.first_param[c] - matrices);
    }
  }

  scheduler(scheduler const&) = delete;
  scheduler& operator=(scheduler const&) = delete;

  // Frees every block it holds, also after a failure. A failure still in flight that close() did
  // not report is written to stderr once (a destructor cannot throw).
  ~scheduler() {
    if (!closed_) {
      try {
        drain();
      } catch (std::exception const& e) {
        std::fprintf(stderr, "tide: offload::scheduler destroyed with a failure in flight (call close() to have it "
                             "thrown): %s\n", e.what());
      }
    }
    wait_idle();  // no worker reads or writes a block freed below
    for (std::uint32_t id = 0; id < ids_; ++id)
      if (stale_[id] != nullptr) free_block(std::exchange(stale_[id], nullptr), stale_where_[id], chunk_of(id).capacity());
    for (auto const& [c, p] : pending_grad_frees_) host_.deallocate(p, grad_[c].capacity(), 256);
    pending_grad_frees_.clear();
    discard_undo();
    for (auto* list : {&param_, &grad_, &master_, &m_, &v_})
      for (std::uint32_t c = 0; c < n_; ++c) free_payload((*list)[c]);
    for (std::byte* p : spare_) arena_->deallocate(p, param_.chunk_bytes(), 256);
    for (std::byte*& p : shadow_)
      if (p != nullptr) host_.deallocate(std::exchange(p, nullptr), param_.chunk_bytes(), 256);
  }

  // Waits for every copy and optimizer step in flight and reports a failure among them
  // (tide::error); the destructor then has nothing to report. The scheduler stays usable.
  void close() {
    drain();
    closed_ = true;
  }

  // ---- what it is ---------------------------------------------------------------------------
  [[nodiscard]] static std::string name() { return scheduler_name<Config>(); }
  [[nodiscard]] chunk::chunk_layout const& layout() const noexcept { return layout_; }
  [[nodiscard]] nn::parameter_list const& parameters() const noexcept { return params_; }
  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return param_.chunk_bytes(); }
  [[nodiscard]] chunk::memory_tracer const& tracer() const noexcept { return tracer_; }
  [[nodiscard]] chunk::chunk_list const& list(chunk::chunk_role r) const noexcept {
    switch (r) {
      case chunk::chunk_role::grad: return grad_;
      case chunk::chunk_role::exp_avg: return m_;
      case chunk::chunk_role::exp_avg_sq: return v_;
      case chunk::chunk_role::master: return master_;
      default: return param_;
    }
  }
  [[nodiscard]] offload_stats const& last_step() const noexcept { return last_; }
  // Device bytes per moment of the last completed step (the memory tide).
  [[nodiscard]] std::span<tide_sample const> memory_tide() const noexcept { return last_tide_; }
  // The layer window in use (layer_window; 0 before the warm-up chose one).
  [[nodiscard]] int window() const noexcept { return window_; }
  [[nodiscard]] std::int64_t optimizer_steps() const noexcept { return t_ - 1; }
  [[nodiscard]] bool os_on_device(std::uint32_t c) const { return os_on_device_.at(c); }
  // The copy engine every chunk copy goes through (its stats; fail_copy() for fault injection).
  [[nodiscard]] memory::transfer_engine<B>& transfers() noexcept { return engine_; }
  // True between the first hook of a step and the end of step() / skip_step() / abort_step().
  [[nodiscard]] bool in_step() const noexcept { return step_open_; }
  // True once the first moment placed the model data (and checked the budget).
  [[nodiscard]] bool placed() const noexcept { return placed_; }

  // ---- the budget -----------------------------------------------------------------------------
  // The least device budget this scheduler can train with when `non_model` bytes of activations
  // and workspaces are live, and what it is made of (text for errors and reports).
  [[nodiscard]] std::size_t minimum_device_bytes(std::size_t non_model) const { return minimum(non_model).bytes; }
  [[nodiscard]] std::string minimum_explained(std::size_t non_model) const { return minimum(non_model).why; }

  // Refuses the arena's budget if it is below the minimum for `non_model` bytes of non-model
  // data (tide::error(budget) stating the minimum and its parts). Runs by itself at the first
  // moment of the first step, with the non-model bytes the arena holds then.
  void check_budget(std::size_t non_model) const {
    auto const need = minimum(non_model);
    std::size_t const budget = arena_->config().budget;
    TIDE_CHECK(budget >= need.bytes, budget, "offload ", name(), ": the device budget ", bytes_of{budget},
               " is below this scheduler's minimum ", bytes_of{need.bytes}, " = ", need.why,
               "; raise device_budget to at least ", bytes_of{need.bytes},
               detail::is_resident<Config> ? std::string(", or offload (chunked<belady>)")
                                           : std::string(", or use smaller chunks / a smaller batch"));
  }

  // ---- model data -----------------------------------------------------------------------------
  // Valid between the pre_* and post_* hooks of a block that uses parameter i (and outside a
  // step, on the host, for initialisation and inspection: then wait with synchronize() first).
  // Inside a step (or an evaluation) the model only reads parameters; outside, the caller may
  // write, so a device-resident chunk forgets its host copy.
  // Inside a step, a block may ask only for the parameters its uses() list, and for their
  // gradients only in its backward: anything else throws tide::error(usage) naming the parameter
  // and the block (the chunk may hold anything then). One byte test per call.
  [[nodiscard]] T* param_data(std::uint32_t i) {
    check_index(i, "param_data");
    if (in_block_) {
      if (!(access_[i] & readable)) [[unlikely]]
        fail_access(i, "parameter");
    } else if (step_open_ || evaluating_) [[unlikely]] {
      fail_access(i, "parameter");
    } else {
      drain();
      drop_shadow(layout_.chunk_of[i]);
    }
    return reinterpret_cast<T*>(param_.data(i));
  }
  [[nodiscard]] T* grad_data(std::uint32_t i) {
    check_index(i, "grad_data");
    if ((in_block_ && !(access_[i] & writable_grad)) || (!in_block_ && (step_open_ || evaluating_))) [[unlikely]]
      fail_access(i, "gradient");
    return reinterpret_cast<T*>(grad_.data(i));
  }
  // Parameter i's bytes copied out, wherever its chunk is (after finishing pending work).
  [[nodiscard]] std::vector<T> read_param(std::uint32_t i) {
    check_index(i, "read_param");
    drain();
    auto const& p = params_[i];
    std::vector<T> out(static_cast<std::size_t>(p.numel()));
    std::memcpy(out.data(), param_.data(i), p.bytes);
    return out;
  }
  // The bytes of parameter i in the list of `role` (param: T, exp_avg / exp_avg_sq: fp32),
  // host-readable on tide::host wherever the chunk is, after finishing pending work. For
  // checkpoints: valid until the next hook or step.
  [[nodiscard]] std::span<std::byte> tensor_bytes(chunk::chunk_role role, std::uint32_t i) {
    check_index(i, "tensor_bytes");
    TIDE_REQUIRE(!step_open_, "offload::scheduler::tensor_bytes inside a step; read tensors between steps");
    drain();
    TIDE_REQUIRE(role != chunk::chunk_role::grad && (role != chunk::chunk_role::master || has_master),
                 "offload::scheduler::tensor_bytes: the ", chunk::to_string(role),
                 " list is not kept between steps (or, for master, T = float has none); ask for param, exp_avg, "
                 "exp_avg_sq or, with bf16/f16 parameters, master");
    if (role == chunk::chunk_role::master) {
      init_master();  // a caller reading it sees the current master; one writing it replaces it
      master_written_ = true;
    }
    chunk::chunk_list& l = role == chunk::chunk_role::param        ? param_
                           : role == chunk::chunk_role::exp_avg    ? m_
                           : role == chunk::chunk_role::exp_avg_sq ? v_
                                                                   : master_;
    if (role == chunk::chunk_role::param) drop_shadow(layout_.chunk_of[i]);  // the caller may write
    return {l.data(i), tensor_size(role, i)};
  }
  // Bytes of parameter i in the list of `role` (what tensor_bytes spans).
  [[nodiscard]] std::size_t tensor_size(chunk::chunk_role role, std::uint32_t i) const {
    check_index(i, "tensor_size");
    return static_cast<std::size_t>(params_[i].numel()) * size_of(list(role).type());
  }
  // AdamW's step number (steps taken), for a resumed run.
  void set_optimizer_steps(std::int64_t steps) {
    TIDE_REQUIRE(steps >= 0 && !step_open_, "offload::scheduler::set_optimizer_steps(", steps,
                 "): needs steps >= 0, between steps");
    t_ = steps + 1;
  }
  // Gradients to zero: every gradient chunk becomes FREE (created zero-filled when next touched).
  void zero_grad() {
    drain();
    for (std::uint32_t c = 0; c < n_; ++c) release_grad(c);
  }
  // Waits for every copy and optimizer step in flight.
  void synchronize() { drain(); }

  void set_grad_scale(float s) {
    TIDE_REQUIRE(std::isfinite(s), "offload::scheduler::set_grad_scale(", s,
                 "): a non-finite scale would poison the weights; skip the step instead");
    options_.grad_scale = s;
  }
  void set_learning_rate(float lr) { options_.adamw.lr = lr; }

  // Forward passes outside training (validation, generation): chunks are made resident within
  // the budget, nothing is traced, so the trace of the training steps stays. Between steps only.
  void begin_evaluation() {
    TIDE_REQUIRE(!step_open_, "offload::scheduler::begin_evaluation inside a training step; call it after step()");
    evaluating_ = true;
  }
  void end_evaluation() { evaluating_ = false; }

  // Records the timeline into `r` (nullptr: stop): each block's compute on the compute lane, each
  // chunk copy on the copy lane (stamped by the copy stream itself), each host AdamW on the
  // optimizer lane. Write it with r->write(path, name): Perfetto opens it.
  void set_trace(trace_recorder* r) {
    drain();
    trace_ = r;
  }
  [[nodiscard]] bool evaluating() const noexcept { return evaluating_; }

  // ---- hooks ----------------------------------------------------------------------------------
  void pre_forward(int block) { enter(block, chunk::phase::forward); }
  void post_forward(int block) {
    if (tracing()) trace_->complete(tide::detail::concat("forward ", block), "compute", lane::compute, block_t0_,
                                    trace_recorder::now_us());
    for (std::uint32_t i : uses_.of(block))
      param_.transition(i, evaluating_ ? chunk::tensor_state::hold : chunk::tensor_state::hold_after_fwd);
    leave_block(block);
    sample_non_model();
    if constexpr (detail::is_window<Config>) {
      if (tracer_.recording() && !evaluating_) {
        forward_ms_ += detail::ms_since(block_start_);
        ++forward_blocks_;
      }
    }
  }
  // Backward visits the blocks last .. first, each once per pass: the optimizer steps a chunk
  // after the pass that completes its gradients (micro-steps: after the last pass).
  void pre_backward(int block) {
    if (!evaluating_) {
      TIDE_CHECK(block == next_backward_, usage, "offload ", name(), ": pre_backward(", block, ") but block ",
                 next_backward_, " is next: backward must visit the blocks of uses() in reverse, ",
                 uses_.last_block(), " down to ", uses_.first_block, ", each once per pass");
      if (block == uses_.last_block()) ++backward_passes_;  // a pass begins
    }
    enter(block, chunk::phase::backward);
  }
  void post_backward(int block) {
    if (tracing()) trace_->complete(tide::detail::concat("backward ", block), "compute", lane::compute, block_t0_,
                                    trace_recorder::now_us());
    for (std::uint32_t i : uses_.of(block)) {
      param_.transition(i, chunk::tensor_state::hold_after_bwd);
      grad_.transition(i, chunk::tensor_state::hold_after_bwd);
    }
    leave_block(block);
    next_backward_ = block == uses_.first_block ? uses_.last_block() : block - 1;
    sample_non_model();
    if (backward_passes_ % options_.micro_steps != 0) return;  // gradients accumulate
    if (options_.defer_optimizer) return;                       // step() runs it
    optimizer_moments_of(block, true);
    add_moves_to_last_sample();  // the optimizer moment's copies belong to this block's bar
  }

  // The gradient of every parameter, in parameter order, wherever its chunk is (host-readable on
  // tide::host): for global_grad_norm and any_non_finite. Waits for copies in flight first. A
  // parameter whose gradient chunk holds nothing yet reads as zeros from a zero-filled chunk.
  // Valid until the next hook or step.
  [[nodiscard]] std::span<kernels::grad_tensor<T> const> gradients() {
    drain();
    grads_out_.clear();  // reserved at construction: no allocation per step
    for (std::uint32_t i = 0; i < params_.size(); ++i) {
      std::uint32_t const c = layout_.chunk_of[i];
      TIDE_REQUIRE(grad_[c].payload() != nullptr, "offload::scheduler::gradients: parameter \"", params_[i].name(),
                   "\" has no gradient yet (run backward first; after step() gradients are freed)");
      grads_out_.push_back({reinterpret_cast<T const*>(grad_.data(i)), params_[i].numel()});
    }
    return grads_out_;
  }

  // Ends an optimizer step without updating anything (an overflowed loss scale): the gradients
  // are dropped, parameters, optimizer state and the AdamW step number stay as they are. The
  // chunks still make the optimizer's moves, so the trace stays the same.
  void skip_step() {
    TIDE_REQUIRE(options_.defer_optimizer, "offload::scheduler::skip_step needs options.defer_optimizer (without it "
                                           "the optimizer already ran after each block's backward)");
    finish(false);
  }

  // Abandons a step that threw, wherever it threw (a hook, the model between hooks, step()):
  // waits for the work in flight, puts back the parameters and AdamW state of every chunk the
  // optimizer stepped in it, drops its gradients and its trace record. Parameters, optimizer
  // state and AdamW's step number are then as before the step; the next step, a checkpoint or the
  // destructor work. make_trainer's step() calls it; a caller driving the hooks by hand calls it
  // from its catch block. Outside a step it does nothing. Never throws: a failure on a worker
  // (a copy or host step that failed after it was issued) is kept and reported by every later
  // step and by close().
  // An evaluation forward that threw inside a block is abandoned the same way.
  void abort_step() noexcept {
    bool const was_in_block = in_block_;
    in_block_ = false;
    std::fill(access_.begin(), access_.end(), std::uint8_t{0});
    if (!step_open_ && !was_in_block) return;
    try {
      drain();
    } catch (std::exception const& e) {
      broken_ = e.what();
    }
    if (broken_.empty()) {
      for (undo_record const& r : undo_) restore(r);
      for (std::uint32_t i = 0; i < params_.size(); ++i) {
        if (param_.tensor(i).state != chunk::tensor_state::hold) param_.transition(i, chunk::tensor_state::hold);
        if (grad_.tensor(i).state == chunk::tensor_state::compute) grad_.transition(i, chunk::tensor_state::hold);
      }
      if (step_open_) {
        for (std::uint32_t c = 0; c < n_; ++c) release_grad(c);  // the step's gradients are dropped
        if constexpr (detail::is_static<Config>) rehome_ = true;  // the partition is pinned again next step
      }
    }
    if (!step_open_) return;  // an evaluation: no step to undo
    discard_undo();
    tracer_.abort_step();
    backward_passes_ = 0;
    next_backward_ = uses_.last_block();
    step_open_ = false;
    cur_ = {};
    tide_.clear();
  }

 private:
  static constexpr std::uint8_t readable = 1, writable_grad = 2;

  void check_index(std::uint32_t i, char const* what) const {
    TIDE_CHECK(i < params_.size(), usage, "offload::scheduler::", what, "(", i, "): the model has ", params_.size(),
               " parameters (indices 0..", params_.size() - 1, ")");
  }
  [[noreturn]] void fail_access(std::uint32_t i, char const* what) const {
    std::string blocks;
    for (int b = uses_.first_block; b <= uses_.last_block(); ++b)
      for (std::uint32_t j : uses_.of(b))
        if (j == i) blocks.append(blocks.empty() ? "" : ", ").append(std::to_string(b));
    std::string const where =
        in_block_ ? tide::detail::concat("in block ", block_, "'s ", phase_ == chunk::phase::forward ? "forward" : "backward")
                  : std::string("between blocks (outside every pre_*/post_* pair)");
    TIDE_FAIL(usage, "offload ", name(), ": the model asked for the ", what, " of \"", params_[i].name(),
              "\" (parameter ", i, ") ", where, ", but uses() lists it only for block",
              blocks.find(',') != std::string::npos ? "s " : " ", blocks.empty() ? std::string("s: none") : blocks,
              std::string_view(what) == "gradient" ? " (gradients: in their backward only)" : "",
              "; add it to that block's uses() (nn::block_uses) or read it inside a block that lists it");
  }
  void leave_block(int block) {
    in_block_ = false;
    for (std::uint32_t i : uses_.of(block)) access_[i] = 0;
  }

  // The optimizer moment after `block`'s backward, and its steps (apply = false: moves only).
  void optimizer_moments_of(int block, bool apply) {    // The optimizer is a moment of the trace too: host-state chunks must be on the host, the
    // completed gradient chunks are released after it.
    optimizer_moment(block, touched_, on_host_, released_);
    if (released_.empty()) return;
    current_ = tracer_.at({block, chunk::phase::optimizer}, touched_, on_host_, released_);
    for (std::uint32_t c : completes_at(block)) optimizer_step(block, c, apply);
  }

 public:

  // The optimizer moment after block's backward: host-state chunks must be on the host,
  // device-state ones are touched there; the completed gradient chunks are released after it.
  void optimizer_moment(int block, std::vector<std::uint32_t>& touched, std::vector<std::uint32_t>& on_host,
                        std::vector<std::uint32_t>& released) const {
    touched.clear();
    on_host.clear();
    released.clear();
    for (std::uint32_t c : completes_at(block)) {
      auto& list = os_on_device_[c] ? touched : on_host;
      list.push_back(c);
      list.push_back(n_ + c);
      released.push_back(n_ + c);
    }
    std::ranges::sort(touched);
  }

  // Ends an optimizer step: (deferred: runs the optimizer,) waits for it, ends the trace step,
  // publishes the stats.
  void step() { finish(true); }

 private:
  void finish(bool apply) {
    require_intact();
    TIDE_REQUIRE(step_open_, "offload::scheduler::step() without a forward since the last step");
    TIDE_REQUIRE(backward_passes_ % options_.micro_steps == 0 && backward_passes_ > 0 &&
                     next_backward_ == uses_.last_block(),
                 "offload::scheduler::step(): ", backward_passes_ % options_.micro_steps, " of ",
                 options_.micro_steps, " micro-step backward passes ran",
                 next_backward_ != uses_.last_block() ? " (one stopped before its first block)" : "",
                 "; step after the last one");
    if (options_.defer_optimizer)
      for (int b = uses_.last_block(); b >= uses_.first_block; --b) optimizer_moments_of(b, apply);
    auto const t0 = std::chrono::steady_clock::now();
    drain();
    cur_.stall_ms += detail::ms_since(t0);
    if constexpr (detail::is_static<Config>) pin_partition();
    discard_undo();  // the step is complete: nothing left to undo
    bool const warm_up = tracer_.recording();
    tracer_.end_step();
    if (warm_up && tracer_.warm()) after_warm_up();
    if (apply) ++t_;
    backward_passes_ = 0;
    step_open_ = false;
    finish_stats(warm_up);
  }

  struct minimum_parts {
    std::size_t bytes = 0;
    std::string why;
  };

  // ---- construction ---------------------------------------------------------------------------

  [[nodiscard]] std::size_t reserved_bytes() const noexcept {
    if constexpr (requires { config_.reserved; }) return config_.reserved;
    else return 0;
  }

  [[nodiscard]] chunk::chunk_layout make_layout() const {
    std::size_t const align_elems = 256 / sizeof(T);
    if constexpr (detail::is_window<Config>) {
      std::size_t largest = 0;  // one layer per chunk: the chunk is the largest layer block
      for (int b = uses_.first_block; b <= uses_.last_block(); ++b) {
        auto const r = params_.layer_bytes(b);
        largest = std::max(largest, round_up(r.bytes, 256) / sizeof(T) + align_elems);
      }
      largest = round_up(largest, align_elems);
      return chunk::pack(params_, largest, align_elems, chunk::pack_mode::one_layer_per_chunk);
    } else {
      std::size_t const asked = config_.chunk_bytes;
      if (asked != 0) return chunk::pack(params_, round_up(asked, 256) / sizeof(T), align_elems);
      std::size_t const budget = arena_->config().budget;
      auto const found = chunk::search_chunk_size(
          params_, {.element_bytes = sizeof(float), .two_chunk_budget = budget / 4, .alignment_elements = align_elems});
      return found.layout;
    }
  }

  // The moments of one step and the chunks each touches, known before the step from the block
  // uses and the layout (the tracer checks every step against them).
  void build_moments() {
    int const first = uses_.first_block, last = uses_.last_block();
    auto chunks_of = [&](int b, bool with_grads) {
      std::vector<std::uint32_t> ids;
      for (std::uint32_t i : uses_.of(b)) {
        ids.push_back(layout_.chunk_of[i]);
        if (with_grads) ids.push_back(static_cast<std::uint32_t>(n_ + layout_.chunk_of[i]));
      }
      std::ranges::sort(ids);
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      return ids;
    };
    forward_ids_.clear();
    backward_ids_.clear();
    for (int b = first; b <= last; ++b) {
      forward_ids_.push_back(chunks_of(b, false));
      backward_ids_.push_back(chunks_of(b, true));
    }
    // A chunk's gradients are complete after the last block (in backward order: last .. first)
    // that uses it.
    completes_.assign(static_cast<std::size_t>(last - first + 1), {});
    std::vector<bool> done(n_, false);
    for (int b = first; b <= last; ++b) {  // the lowest block using a chunk runs last in backward
      for (std::uint32_t id : forward_ids_[static_cast<std::size_t>(b - first)])
        if (!done[id]) {
          done[id] = true;
          completes_[static_cast<std::size_t>(b - first)].push_back(id);
        }
    }
    working_set_ = 0;
    for (auto const& ids : backward_ids_) working_set_ = std::max(working_set_, ids.size());
    for (auto const& ids : forward_ids_) working_set_ = std::max(working_set_, ids.size());
  }

  [[nodiscard]] std::span<std::uint32_t const> completes_at(int block) const {
    return completes_[static_cast<std::size_t>(block - uses_.first_block)];
  }
  [[nodiscard]] std::vector<std::uint32_t> const& ids_of(int block, chunk::phase ph) const {
    auto const k = static_cast<std::size_t>(block - uses_.first_block);
    return ph == chunk::phase::forward ? forward_ids_.at(k) : backward_ids_.at(k);
  }

  // ---- the minimum ----------------------------------------------------------------------------

  [[nodiscard]] std::size_t block_bytes() const noexcept { return round_up(param_.chunk_bytes(), 256); }
  [[nodiscard]] std::size_t os_block_bytes() const noexcept { return round_up(m_.chunk_bytes(), 256); }
  static constexpr std::size_t os_lists = has_master ? 3 : 2;  // (master,) m, v

  [[nodiscard]] minimum_parts minimum(std::size_t non_model) const {
    std::size_t const chunk = block_bytes(), r = reserved_bytes();
    minimum_parts p;
    auto const nm = tide::detail::concat("non-model ", bytes_of{non_model}, " (activations, workspaces)");
    if constexpr (detail::is_resident<Config>) {
      std::size_t const model = 2 * n_ * chunk + os_lists * n_ * os_block_bytes();
      p.bytes = non_model + model;
      p.why = tide::detail::concat(nm, " + all model data ", bytes_of{model}, " (", n_,
                                   has_master ? " chunks each of parameters, gradients, fp32 master, Adam m and v)"
                                              : " chunks each of parameters, gradients, Adam m and v)");
    } else if constexpr (detail::is_static<Config>) {
      std::size_t const params = n_ * chunk, grads = (working_set_ > 0 ? max_grads_per_moment() : 0) * chunk;
      p.bytes = non_model + params + grads + r;
      p.why = tide::detail::concat(nm, " + every parameter chunk ", bytes_of{params}, " (", n_, " x ",
                                   bytes_of{chunk}, ") + the gradient chunks of one block ", bytes_of{grads},
                                   " + reserved ", bytes_of{r});
    } else {
      std::size_t const slots = detail::is_window<Config> ? 2 * std::size_t{static_cast<std::size_t>(min_window())}
                                                          : working_set_;
      p.bytes = non_model + slots * chunk + r;
      p.why = detail::is_window<Config>
                  ? tide::detail::concat(nm, " + a window of ", min_window(), " layers x 2 chunks (parameters and "
                                         "gradients) x ", bytes_of{chunk}, " + reserved ", bytes_of{r})
                  : tide::detail::concat(nm, " + the working set ", working_set_, " chunks x ", bytes_of{chunk},
                                         " (the most chunks one moment touches: ", working_set_moment(), ") + reserved ",
                                         bytes_of{r});
    }
    return p;
  }
  [[nodiscard]] int min_window() const noexcept {
    if constexpr (detail::is_window<Config>) return Config::window == 0 ? 2 : Config::window;
    else return 0;
  }
  [[nodiscard]] std::size_t max_grads_per_moment() const {
    std::size_t most = 0;
    for (auto const& ids : backward_ids_)
      most = std::max<std::size_t>(most, static_cast<std::size_t>(std::ranges::count_if(ids, [&](std::uint32_t id) { return id >= n_; })));
    return most;
  }
  [[nodiscard]] std::string working_set_moment() const {
    for (std::size_t k = 0; k < backward_ids_.size(); ++k)
      if (backward_ids_[k].size() == working_set_)
        return tide::detail::concat("block ", static_cast<int>(k) + uses_.first_block, "'s backward");
    for (std::size_t k = 0; k < forward_ids_.size(); ++k)
      if (forward_ids_[k].size() == working_set_)
        return tide::detail::concat("block ", static_cast<int>(k) + uses_.first_block, "'s forward");
    return "none";
  }

  // ---- the chunks ----------------------------------------------------------------------------

  [[nodiscard]] chunk::chunk& chunk_of(std::uint32_t id) { return id < n_ ? param_[id] : grad_[id - n_]; }
  [[nodiscard]] bool on_device(std::uint32_t id) {
    chunk::chunk& ch = chunk_of(id);
    return ch.payload() != nullptr && ch.tier() == chunk::tier::device;
  }

  void attach_host_zeroed(chunk::chunk& ch) {
    auto* p = static_cast<std::byte*>(host_.allocate(ch.capacity(), 256));
    std::memset(p, 0, ch.capacity());
    ch.attach(p, chunk::tier::host);
  }
  void free_payload(chunk::chunk& ch) {
    if (ch.payload() == nullptr) return;
    chunk::tier const where = ch.tier();
    std::byte* p = ch.detach();
    free_block(p, where, ch.capacity());
  }
  void free_block(std::byte* p, chunk::tier where, std::size_t capacity) {
    if (where == chunk::tier::host) {
      host_.deallocate(p, capacity, 256);
    } else {
      device_bytes_ -= round_up(capacity, 256);
      if constexpr (detail::is_window<Config>) {
        if (spare_.size() < spare_limit_) {  // layer_window reuses its device blocks (STRONGHOLD's pool)
          spare_.push_back(p);
          device_bytes_ += round_up(capacity, 256);
          spare_bytes_ += round_up(capacity, 256);
          return;
        }
      }
      arena_->deallocate(p, capacity, 256);
    }
  }
  // A device block for a chunk: from the spare pool, or the arena (reclaiming stale blocks, and
  // evicting more if fragmentation refuses a request the accounting allowed).
  std::byte* allocate_device(std::size_t capacity, std::size_t t, std::span<std::uint32_t const> protect) {
    if (!spare_.empty()) {
      std::byte* p = spare_.back();
      spare_.pop_back();
      spare_bytes_ -= round_up(capacity, 256);
      return p;  // device_bytes_ already counts it
    }
    for (;;) {
      try {
        auto* p = static_cast<std::byte*>(arena_->allocate(capacity, 256));
        device_bytes_ += round_up(capacity, 256);
        return p;
      } catch (tide::error const& e) {
        if (e.category() != errc::budget) throw;
        if (reclaim_stale(true)) continue;
        auto const victim = pick_victim(t, protect, std::numeric_limits<std::size_t>::max());
        if (!victim) throw;
        evict(*victim);
      }
    }
  }

  // Waits for chunk id's copy in flight, then frees the block it was copied from.
  void settle(std::uint32_t id) {
    if (in_flight_[id]) {
      auto const t0 = std::chrono::steady_clock::now();
      ready_[id].synchronize();
      cur_.stall_ms += detail::ms_since(t0);
      in_flight_[id] = false;
      --copies_in_flight_;
    }
    if (stale_[id] != nullptr) {
      std::byte* p = std::exchange(stale_[id], nullptr);
      free_block(p, stale_where_[id], chunk_of(id).capacity());
    }
  }
  void set_stale(std::uint32_t id, std::byte* p, chunk::tier where) {
    TIDE_ASSERT(stale_[id] == nullptr);
    stale_[id] = p;
    stale_where_[id] = where;
  }
  // Frees device blocks whose copy to the host finished (waiting for one if `wait`). True if
  // device memory was freed.
  bool reclaim_stale(bool wait) {
    for (std::uint32_t id = 0; id < ids_; ++id) {
      if (stale_[id] == nullptr || stale_where_[id] != chunk::tier::device) continue;
      if (!wait && in_flight_[id] && !ready_[id].query()) continue;
      settle(id);
      return true;
    }
    return false;
  }
  // Settles the copies already finished (never blocks); returns the copies still in flight.
  std::size_t refresh_in_flight() {
    for (std::uint32_t id = 0; id < ids_ && copies_in_flight_ > 0; ++id)
      if (in_flight_[id] && ready_[id].query()) settle(id);
    return copies_in_flight_;
  }
  // Waits for optimizer work on parameter chunk c (the host step writes its host payload).
  void wait_optimizer(std::uint32_t c) {
    if (!optimizer_pending_[c]) return;
    auto const t0 = std::chrono::steady_clock::now();
    busy_[c].synchronize();
    cur_.stall_ms += detail::ms_since(t0);
    optimizer_pending_[c] = false;
  }

  // Copies chunk id to the device (or creates it zero-filled there if it has no payload).
  // `handover`: a victim's device block to reuse (its copy out is already queued before ours).
  void fetch(std::uint32_t id, std::size_t t, std::span<std::uint32_t const> protect, std::byte* handover = nullptr) {
    chunk::chunk& ch = chunk_of(id);
    settle(id);
    if (id < n_) wait_optimizer(id);
    std::byte* dev = handover != nullptr ? handover : allocate_device(ch.capacity(), t, protect);
    if (ch.payload() == nullptr) {
      std::memset(dev, 0, ch.capacity());  // a FREE slot is zero-filled; nothing to copy
      ch.attach(dev, chunk::tier::device);
      ++cur_.allocations;
    } else {
      // The copy is issued before the chunk lets go of its host block: if it cannot be, the chunk
      // keeps its data and the device block goes back (a handed-over one: to the caller).
      std::byte* const host = ch.payload();
      copy_span* span = open_span(id, "fetch ", ch.capacity());
      try {
        engine_.copy_async(dev, host, ch.capacity(), memory::copy_direction::host_to_device, ready_[id]);
      } catch (...) {
        if (handover == nullptr) free_block(dev, chunk::tier::device, ch.capacity());
        throw;
      }
      close_span(span);
      (void)ch.detach();
      ch.attach(dev, chunk::tier::device);
      if (id < n_) shadow_[id] = host;  // parameters change only in the optimizer: keep the host copy
      else set_stale(id, host, chunk::tier::host);
      in_flight_[id] = true;
      ++copies_in_flight_;
      ++cur_.fetches;
      cur_.h2d_bytes += ch.capacity();
    }
    policy_.on_fetch(id, tick_);
  }

  // Copies chunk id to the host. Returns its device block, still being read by the copy: the
  // caller either hands it over (the next copy on the stream runs after this one) or leaves it
  // stale until the copy is done.
  std::byte* copy_out(std::uint32_t id) {
    chunk::chunk& ch = chunk_of(id);
    settle(id);
    if (id < n_ && shadow_[id] != nullptr) {  // clean: the host copy is current, nothing to copy
      std::byte* dev = ch.detach();
      ch.attach(std::exchange(shadow_[id], nullptr), chunk::tier::host);
      ++cur_.clean_drops;
      evicted_bytes_ += ch.capacity();
      return dev;
    }
    // Acquire, issue, then detach: a refused block or copy leaves the chunk where it was.
    auto* host = static_cast<std::byte*>(host_.allocate(ch.capacity(), 256));
    std::byte* const dev = ch.payload();
    copy_span* span = open_span(id, "evict ", ch.capacity());
    try {
      engine_.copy_async(host, dev, ch.capacity(), memory::copy_direction::device_to_host, ready_[id]);
    } catch (...) {
      host_.deallocate(host, ch.capacity(), 256);
      throw;
    }
    close_span(span);
    (void)ch.detach();
    ch.attach(host, chunk::tier::host);
    evicted_bytes_ += ch.capacity();
    in_flight_[id] = true;
    ++copies_in_flight_;
    cur_.d2h_bytes += ch.capacity();
    return dev;
  }
  // Evicts `victim` and returns its device block for chunk `id`. A copy into the block queues
  // behind the victim's copy out on the copy stream; a zero fill runs on this thread, so it
  // waits for the copy out first.
  std::byte* hand_over(std::uint32_t victim, std::uint32_t id) {
    ++cur_.evictions;
    std::byte* block = copy_out(victim);
    if (chunk_of(id).payload() == nullptr) settle(victim);
    return block;
  }
  void evict(std::uint32_t id) {
    ++cur_.evictions;
    set_stale(id, copy_out(id), chunk::tier::device);
  }
  // fetch(id) into the block `victim` handed over; if the fetch throws, the block is the victim's
  // stale block again (freed once its copy out is done), so nothing leaks.
  void fetch_into(std::uint32_t id, std::size_t t, std::span<std::uint32_t const> protect, std::uint32_t victim,
                  std::byte* block) {
    try {
      fetch(id, t, protect, block);
    } catch (...) {
      set_stale(victim, block, chunk::tier::device);
      throw;
    }
  }

  // The chunk to evict at moment t among the movable device chunks not in `protect` whose next
  // use is further than `beyond` (belady's prefetch rule; SIZE_MAX: any).
  std::optional<std::uint32_t> pick_victim(std::size_t t, std::span<std::uint32_t const> protect, std::size_t beyond) {
    candidates_.clear();
    for (std::uint32_t id = 0; id < ids_; ++id) {
      chunk::chunk& ch = chunk_of(id);
      if (!on_device(id) || !ch.movable() || std::ranges::find(protect, id) != protect.end()) continue;
      if (beyond != std::numeric_limits<std::size_t>::max() &&
          !(tracer_.trace().next_use_distance(id, t) > beyond))
        continue;
      candidates_.push_back(id);
    }
    if (candidates_.empty()) return std::nullopt;
    if (t == untraced || !tracer_.warm() || tracer_.recording()) return candidates_.front();
    return policy_.victim(std::span<std::uint32_t const>(candidates_), t);
  }

  // Device bytes chunks may take at moment t (movable lists; the optimizer state on the device
  // is counted in device_bytes_ too).
  [[nodiscard]] std::size_t capacity(std::size_t t) const {
    if (t == untraced && !detail::is_resident<Config>) return hard_limit();
    if constexpr (detail::is_resident<Config>) {
      return std::numeric_limits<std::size_t>::max();
    } else if constexpr (detail::is_window<Config>) {
      return 2 * static_cast<std::size_t>(window_ == 0 ? 2 : window_) * block_bytes() + pinned_bytes_;
    } else {
      if (tracer_.recording()) return 0;  // warm-up: only the current moment's chunks
      std::size_t const b = tracer_.chunk_budget(t);
      return b;
    }
  }

  // Makes the chunks of the moment resident; on return every one is on the device and its copy
  // is complete.
  void make_resident(std::vector<std::uint32_t> const& ids, std::size_t t) {
    std::span<std::uint32_t const> const protect(ids);
    for (std::uint32_t id : ids) {
      policy_.on_use(id, tick_);
      if (on_device(id)) {
        ++cur_.prefetch_hits;
        continue;
      }
      ++cur_.demand_fetches;
      std::size_t const need = block_bytes();
      while (model_on_device() + need > capacity(t) && reclaim_stale(true)) {
      }
      if (model_on_device() + need > capacity(t)) {
        // Over the policy's budget: evict (hand the victim's block over). With nothing movable,
        // go on only while the arena's hard limit allows (the warm-up's soft budget is 0).
        auto const victim = pick_victim(t, protect, std::numeric_limits<std::size_t>::max());
        if (victim) {
          fetch_into(id, t, protect, *victim, hand_over(*victim, id));
          continue;
        }
        TIDE_CHECK(model_on_device() + need <= hard_limit(), budget, "offload ", name(), ": moment ", t,
                   " needs chunk ", id, " on the device but every chunk there is in use (model data on the device ",
                   bytes_of{model_on_device()}, ", device room for chunks ", bytes_of{hard_limit()},
                   "); raise device_budget");
      }
      fetch(id, t, protect);
    }
    for (std::uint32_t id : ids) settle(id);
  }

  // Fetches the next moments' chunks ahead, within the budget and the copies-in-flight bound.
  void prefetch(std::size_t t) {
    if constexpr (detail::is_chunked<Config> || detail::is_window<Config>) {
      if (tracer_.recording()) return;
      std::size_t const moments = tracer_.moments();
      int depth = 0;
      if constexpr (detail::is_window<Config>) depth = std::max(1, window_ - 1);
      else depth = config_.prefetch_moments > 0 ? config_.prefetch_moments : static_cast<int>(moments);
      auto const& trace = tracer_.trace();
      protect_.assign(trace.touched(t).begin(), trace.touched(t).end());
      for (int k = 1; k <= depth && t + static_cast<std::size_t>(k) < moments; ++k) {
        std::size_t const u = t + static_cast<std::size_t>(k);
        for (std::uint32_t id : trace.touched(u)) protect_.push_back(id);
        for (std::uint32_t id : trace.touched(u)) {
          if (on_device(id)) continue;
          if (copies_in_flight_ >= static_cast<std::size_t>(config_.max_in_flight) &&
              refresh_in_flight() >= static_cast<std::size_t>(config_.max_in_flight))
            return;
          if (id < n_ && optimizer_pending_[id] && !busy_[id].query()) continue;  // still being stepped
          if (chunk_of(id).payload() == nullptr) continue;  // a FREE gradient: created when touched, no copy
          std::size_t const room = std::min(capacity(t), capacity(u));
          if (model_on_device() + block_bytes() > room) {
            // Only by evicting a chunk used later than this one (what MIN would do anyway).
            auto const victim = pick_victim(t, protect_, static_cast<std::size_t>(k));
            if (!victim) return;  // the budget is full of nearer uses: fetching further ahead would undo MIN
            fetch_into(id, t, protect_, *victim, hand_over(*victim, id));
          } else {
            fetch(id, t, protect_);
          }
          ++cur_.prefetches;
        }
      }
    }
  }

  // ---- moments ----------------------------------------------------------------------------------

  void begin_step_if_needed() {
    if (step_open_) return;
    require_intact();
    step_open_ = true;
    tracer_.begin_step();
    arena_->reset_peak();
    tide_.clear();
    moves_mark_ = {cur_.h2d_bytes, evicted_bytes_};
    if (!placed_) first_placement();
    if constexpr (detail::is_static<Config>)
      if (rehome_) pin_partition();
  }
  void require_intact() const {
    TIDE_CHECK(broken_.empty(), io, "offload ", name(), ": a copy or optimizer step failed on a worker earlier (",
               broken_, "); the model data it was moving may be lost: load the last checkpoint into a new trainer");
  }

  // The first moment of the first step: the non-model bytes are known (the model allocated its
  // activations), so the budget is checked, then pinned placements are made.
  // Idempotent: a placement that threw half-way is completed by the next step.
  void first_placement() {
    std::size_t const non_model = arena_->stats().in_use - device_bytes_;
    check_budget(non_model);
    init_master();
    if constexpr (detail::is_resident<Config>) {
      for (std::uint32_t c = 0; c < n_; ++c) {
        if (!on_device(c)) fetch(c, 0, {});
        chunk_of(c).set_pinned(true);
        if (!os_on_device_[c]) move_os_to_device(c);
      }
      engine_.synchronize();
      for (std::uint32_t c = 0; c < n_; ++c) settle(c);
    } else if constexpr (detail::is_static<Config>) {
      pin_partition();
    } else if constexpr (detail::is_window<Config>) {
      window_ = Config::window == 0 ? 2 : Config::window;  // the warm-up runs with the smallest window
      spare_limit_ = 2 * static_cast<std::size_t>(window_);
      spare_.reserve(spare_limit_);
    }
    placed_ = true;
  }

  void enter(int block, chunk::phase ph) {
    if (tracing()) block_t0_ = trace_recorder::now_us();
    TIDE_CHECK(block >= uses_.first_block && block <= uses_.last_block(), usage, "offload ", name(), ": block ",
               block, " is not one of uses() (", uses_.first_block, "..", uses_.last_block(), ")");
    TIDE_CHECK(!in_block_, usage, "offload ", name(), ": block ", block, " entered while block ", block_,
               " is still open; call post_forward / post_backward of each block before the next");
    if (evaluating_) {
      TIDE_REQUIRE(ph == chunk::phase::forward, "offload::scheduler: backward during evaluation; call "
                                                "end_evaluation() before training");
      require_intact();
      if (!placed_) first_placement();
      ++tick_;
      reclaim_stale(false);
      make_resident(ids_of(block, ph), untraced);
      for (std::uint32_t i : uses_.of(block)) param_.transition(i, chunk::tensor_state::compute);
      open_block(block, ph);
      return;
    }
    begin_step_if_needed();
    ++tick_;
    reclaim_stale(false);
    auto const& ids = ids_of(block, ph);
    std::size_t const t = tracer_.at({block, ph}, ids);
    current_ = t;
    if constexpr (detail::is_window<Config>) {
      if (ph == chunk::phase::forward && tracer_.recording()) block_start_ = std::chrono::steady_clock::now();
    }
    make_resident(ids, t);
    for (std::uint32_t i : uses_.of(block)) {
      param_.transition(i, chunk::tensor_state::compute);
      if (ph == chunk::phase::backward) grad_.transition(i, chunk::tensor_state::compute);
    }
    sample_non_model();
    tide_.push_back({{block, ph}, device_bytes_ - spare_bytes_, non_model_now(), arena_->config().budget});
    prefetch(t);
    add_moves_to_last_sample();
    open_block(block, ph);
  }
  void open_block(int block, chunk::phase ph) {
    for (std::uint32_t i : uses_.of(block))
      access_[i] = static_cast<std::uint8_t>(readable | (ph == chunk::phase::backward ? writable_grad : 0));
    block_ = block;
    phase_ = ph;
    in_block_ = true;
  }
  // Bytes fetched and evicted since the last sample go to the newest one.
  void add_moves_to_last_sample() {
    if (tide_.empty()) return;
    tide_.back().fetched_bytes += cur_.h2d_bytes - moves_mark_.first;
    tide_.back().evicted_bytes += evicted_bytes_ - moves_mark_.second;
    moves_mark_ = {cur_.h2d_bytes, evicted_bytes_};
  }

  [[nodiscard]] std::size_t model_on_device() const noexcept { return device_bytes_ - spare_bytes_; }
  // What chunks can physically take now: the budget minus the non-model bytes and the reserve.
  [[nodiscard]] std::size_t hard_limit() const {
    std::size_t const taken = non_model_now() + reserved_bytes();
    std::size_t const budget = arena_->config().budget;
    return budget > taken ? budget - taken : 0;
  }
  [[nodiscard]] std::size_t non_model_now() const {
    std::size_t const in_use = arena_->stats().in_use;
    return in_use > device_bytes_ - spare_bytes_ ? in_use - (device_bytes_ - spare_bytes_) : 0;
  }
  void sample_non_model() {
    if (!evaluating_) tracer_.non_model(current_, non_model_now());
  }

  // ---- the optimizer --------------------------------------------------------------------------

  // Chunk c's state before this step's update: the parameter chunk, (master,) m and v.
  struct undo_record {
    std::uint32_t c = 0;
    std::size_t elements = 0;
    std::array<std::byte*, 4> copy{};  // param, master, m, v
    bool saved = false;                // set by whoever took the copies (the optimizer worker for host steps)
  };
  // One AdamW step over chunk c (the whole chunk: padding is zero and stays zero).
  struct host_job {
    scheduler* self = nullptr;
    std::uint32_t c = 0;
    float* p = nullptr;    // the fp32 master: the parameter chunk itself when T = float
    T const* g = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    T* working = nullptr;  // bf16 / f16: the parameter chunk, written with the rounded update
    index_t n = 0;
    std::int64_t t = 0;
    kernels::adamw_hparams hp{};
    float scale = 1.f;
    trace_recorder* recorder = nullptr;
    undo_record* undo = nullptr;  // where the state before the update goes (undo_on_error)
    void operator()() {
      auto const t0 = std::chrono::steady_clock::now();
      exec<host> const ex{self->optimizer_pool_};
      double const start = recorder != nullptr ? trace_recorder::now_us() : 0;
      if (undo != nullptr) self->save_undo(*undo, p, m, v, working, n);
      self->run_adamw(ex, c, p, g, m, v, working, n, t, hp, scale);
      self->optimizer_ns_.fetch_add(static_cast<std::int64_t>(detail::ms_since(t0) * 1e6), std::memory_order_relaxed);
      if (recorder != nullptr)
        recorder->complete(tide::detail::concat("adamw chunk ", c, " (host)"), "optimizer", lane::optimizer, start,
                           trace_recorder::now_us(), static_cast<std::size_t>(n) * 28);
    }
  };

  // AdamW over chunk c's n elements: one flat call, or (decay_matrices_only) one call over the
  // matrices and one without decay over the rest, listed in chunk c's own reserved vectors (it
  // runs on the optimizer worker too; no two steps of one chunk run at once).
  void run_adamw(exec<host> const& ex, std::uint32_t c, float* p, T const* g, float* m, float* v, T* working,
                 index_t n, std::int64_t t, kernels::adamw_hparams const& hp, float scale) {
    if (!options_.decay_matrices_only) {
      kernels::adamw(ex, hp, t, tensor_view<float>(p, {n}), tensor_view<T const>(g, {n}), tensor_view<float>(m, {n}),
                     tensor_view<float>(v, {n}), working != nullptr ? tensor_view<T>(working, {n}) : tensor_view<T>{},
                     scale);
      return;
    }
    auto& decayed = decayed_[c];
    auto& plain = plain_[c];
    decayed.clear();
    plain.clear();
    for (std::uint32_t i = layout_.first_param[c]; i < layout_.first_param[c + 1]; ++i) {
      std::size_t const at = layout_.offset_of[i];
      kernels::adamw_tensor<T, T> const r{p + at, g + at, m + at, v + at, working != nullptr ? working + at : nullptr,
                                          params_[i].numel()};
      (params_[i].shape.rank >= 2 ? decayed : plain).push_back(r);
    }
    kernels::adamw_hparams no_decay = hp;
    no_decay.weight_decay = 0.f;
    if (!decayed.empty()) kernels::adamw(ex, hp, t, decayed, scale);
    if (!plain.empty()) kernels::adamw(ex, no_decay, t, plain, scale);
  }

  // The fp32 values AdamW updates, and the working copy it rounds them into (bf16 / f16 only).
  [[nodiscard]] float* master_of(std::uint32_t c) {
    return reinterpret_cast<float*>(has_master ? master_[c].payload() : param_[c].payload());
  }
  [[nodiscard]] T* working_of(std::uint32_t c) {
    return has_master ? reinterpret_cast<T*>(param_[c].payload()) : nullptr;
  }
  // The masters start as the parameters the model initialised (or a checkpoint wrote): once,
  // before the first update, while every chunk is still readable on the host.
  void init_master() {
    if constexpr (has_master) {
      if (master_written_) return;
      drain();
      for (std::uint32_t i = 0; i < params_.size(); ++i) {
        auto const* src = reinterpret_cast<T const*>(param_.data(i));
        auto* dst = reinterpret_cast<float*>(master_.data(i));
        for (index_t k = 0; k < params_[i].numel(); ++k) dst[k] = to_float(src[k]);
      }
      master_written_ = true;
    }
  }

  [[nodiscard]] index_t step_elements(std::uint32_t c) const {
    // Up to the end of the chunk's last tensor (the rest of the chunk is never touched).
    std::uint32_t const last = layout_.first_param[c + 1] - 1;
    return static_cast<index_t>(layout_.offset_of[last] + static_cast<std::size_t>(params_[last].numel()));
  }

  void optimizer_step(int block, std::uint32_t c, bool apply) {
    (void)block;
    index_t const n = step_elements(c);
    if (os_on_device_[c]) {
      if (!on_device(c) || !on_device(n_ + c)) {  // deferred: they may have been evicted since
        std::vector<std::uint32_t> const ids{c, n_ + c};
        make_resident(ids, current_);
      }
      auto const t0 = std::chrono::steady_clock::now();
      if (apply) {
        if (undo_record* u = begin_undo(c))
          save_undo(*u, master_of(c), reinterpret_cast<float*>(m_[c].payload()),
                    reinterpret_cast<float*>(v_[c].payload()), working_of(c), n);
        drop_shadow(c);  // the device copy changes: the host one is stale
      }
      double const start = tracing() ? trace_recorder::now_us() : 0;
      if (apply)
        run_adamw(ex_, c, master_of(c), reinterpret_cast<T const*>(grad_[c].payload()),
                  reinterpret_cast<float*>(m_[c].payload()), reinterpret_cast<float*>(v_[c].payload()), working_of(c),
                  n, t_, options_.adamw, options_.grad_scale);
      if (apply && tracing())
        trace_->complete(tide::detail::concat("adamw chunk ", c, " (device)"), "optimizer", lane::compute, start,
                         trace_recorder::now_us(), static_cast<std::size_t>(n) * 28);
      cur_.optimizer_ms += detail::ms_since(t0);
      ++cur_.device_optimizer_chunks;
      param_.transition_chunk(c, chunk::tensor_state::hold);
      release_grad(c);
      return;
    }
    // Host state: parameters and gradients go to the host; the step runs on the optimizer worker
    // after both copies, and the parameter chunk is not fetched again before it finished.
    undo_record* const undo = apply ? begin_undo(c) : nullptr;  // acquired before anything moves
    if (on_device(c)) set_stale(c, copy_out(c), chunk::tier::device);
    if (on_device(n_ + c)) set_stale(n_ + c, copy_out(n_ + c), chunk::tier::device);
    if (param_[c].pinned()) {
      param_[c].set_pinned(false);
      pinned_bytes_ -= block_bytes();
    }
    ++cur_.host_optimizer_chunks;
    if (!apply) {  // the moves happened; nothing to compute
      param_.transition_chunk(c, chunk::tensor_state::hold);
      release_grad(c);
      return;
    }
    host_job& job = jobs_[c];
    job = {this,
           c,
           master_of(c),
           reinterpret_cast<T const*>(grad_[c].payload()),
           reinterpret_cast<float*>(m_[c].payload()),
           reinterpret_cast<float*>(v_[c].payload()),
           working_of(c),
           n,
           t_,
           options_.adamw,
           options_.grad_scale,
           tracing() ? trace_ : nullptr,
           undo};
    param_.transition_chunk(c, chunk::tensor_state::hold);
    grad_.transition_chunk(c, chunk::tensor_state::free);
    if (options_.overlap_optimizer) {
      optimizer_stream_.wait(ready_[c]);
      optimizer_stream_.wait(ready_[n_ + c]);
      memory::launch(optimizer_stream_, job);
      busy_[c].record(optimizer_stream_);
      optimizer_pending_[c] = true;
      // The gradient's host block is freed once the step read it (drain / the next use).
      pending_grad_frees_.push_back({c, grad_[c].detach()});
    } else {
      settle(c);
      settle(n_ + c);
      job();
      free_payload(grad_[c]);
    }
  }

  // ---- undo -------------------------------------------------------------------------------------

  [[nodiscard]] std::size_t undo_bytes(std::size_t k, std::size_t elements) const noexcept {
    return elements * (k == 0 ? sizeof(T) : sizeof(float));
  }
  // Host blocks for chunk c's undo copies, acquired before its update (nullptr: undo is off).
  undo_record* begin_undo(std::uint32_t c) {
    if (!options_.undo_on_error) return nullptr;
    undo_record r{c, static_cast<std::size_t>(step_elements(c)), {}, false};
    try {
      for (std::size_t k = 0; k < 4; ++k)
        if (k != 1 || has_master) r.copy[k] = static_cast<std::byte*>(host_.allocate(undo_bytes(k, r.elements), 256));
    } catch (...) {
      free_undo(r);
      throw;
    }
    TIDE_ASSERT(undo_.size() < undo_.capacity());  // one record per chunk and step: never reallocates
    undo_.push_back(r);
    return &undo_.back();
  }
  void save_undo(undo_record& r, float const* p, float const* m, float const* v, T const* working,
                 index_t n) const noexcept {
    auto const e = static_cast<std::size_t>(n);
    std::memcpy(r.copy[0], has_master ? static_cast<void const*>(working) : static_cast<void const*>(p), e * sizeof(T));
    if (has_master) std::memcpy(r.copy[1], p, e * sizeof(float));
    std::memcpy(r.copy[2], m, e * sizeof(float));
    std::memcpy(r.copy[3], v, e * sizeof(float));
    r.saved = true;
  }
  // Puts chunk r.c's state back, wherever its chunks are now (host-readable on tide::host).
  void restore(undo_record const& r) {
    if (!r.saved) return;  // the update never ran
    std::uint32_t const c = r.c;
    drop_shadow(c);  // the host copy of a device-resident chunk may hold the update
    std::memcpy(param_[c].payload(), r.copy[0], undo_bytes(0, r.elements));
    if constexpr (has_master) std::memcpy(master_[c].payload(), r.copy[1], undo_bytes(1, r.elements));
    std::memcpy(m_[c].payload(), r.copy[2], undo_bytes(2, r.elements));
    std::memcpy(v_[c].payload(), r.copy[3], undo_bytes(3, r.elements));
  }
  void free_undo(undo_record& r) noexcept {
    for (std::size_t k = 0; k < 4; ++k)
      if (r.copy[k] != nullptr) host_.deallocate(std::exchange(r.copy[k], nullptr), undo_bytes(k, r.elements), 256);
  }
  void discard_undo() noexcept {
    for (undo_record& r : undo_) free_undo(r);
    undo_.clear();
  }

  // ---- the timeline ---------------------------------------------------------------------------

  [[nodiscard]] bool tracing() const noexcept { return trace_ != nullptr && trace_->enabled(); }

  // One copy on the copy lane: two host functions on the copy stream stamp its start and end, so
  // the span is when the copy ran, not when it was issued. Kept until drain().
  struct copy_span {
    trace_recorder* recorder = nullptr;
    std::string name;
    std::size_t bytes = 0;
    double start = 0;
    struct begin_stamp {
      copy_span* s;
      void operator()() const { s->start = trace_recorder::now_us(); }
    } begin{this};
    struct end_stamp {
      copy_span* s;
      void operator()() const {
        s->recorder->complete(s->name, "copy", lane::copy, s->start, trace_recorder::now_us(), s->bytes);
      }
    } end{this};
  };
  copy_span* open_span(std::uint32_t id, char const* what, std::size_t bytes) {
    if (!tracing()) return nullptr;
    copy_span& sp = spans_.emplace_back();
    sp.recorder = trace_;
    sp.name = tide::detail::concat(what, id < n_ ? "param " : "grad ", id < n_ ? id : id - n_);
    sp.bytes = bytes;
    memory::launch(copy_stream_, sp.begin);
    return &sp;
  }
  void close_span(copy_span* sp) {
    if (sp != nullptr) memory::launch(copy_stream_, sp->end);
  }

  // Parameter chunk c's host copy is (about to be) stale: free it.
  void drop_shadow(std::uint32_t c) {
    if (shadow_[c] == nullptr) return;
    settle(c);  // a copy in flight may still read it
    host_.deallocate(std::exchange(shadow_[c], nullptr), param_[c].capacity(), 256);
  }

  // Gradient chunk c to FREE, its payload released.
  void release_grad(std::uint32_t c) {
    chunk::chunk& g = grad_[c];
    if (g.payload() == nullptr && stale_[n_ + c] == nullptr) return;
    settle(n_ + c);
    grad_.transition_chunk(c, chunk::tensor_state::free);
    free_payload(g);
  }

  // Moves chunk c's m and v to the device (state placed there by the warm-up's margin).
  // All or nothing: every device block is acquired before any list lets go of its host block.
  void move_os_to_device(std::uint32_t c) {
    init_master();
    std::array<chunk::chunk*, 3> const lists{&m_[c], &v_[c], has_master ? &master_[c] : nullptr};
    std::array<std::byte*, 3> dev{};
    try {
      for (std::size_t k = 0; k < 3; ++k)
        if (lists[k] != nullptr) dev[k] = static_cast<std::byte*>(arena_->allocate(lists[k]->capacity(), 256));
    } catch (...) {
      for (std::size_t k = 0; k < 3; ++k)
        if (dev[k] != nullptr) arena_->deallocate(dev[k], lists[k]->capacity(), 256);
      throw;
    }
    for (std::size_t k = 0; k < 3; ++k) {
      if (lists[k] == nullptr) continue;
      chunk::chunk& ch = *lists[k];
      std::memcpy(dev[k], ch.payload(), ch.capacity());
      std::byte* host = ch.detach();
      ch.attach(dev[k], chunk::tier::device);
      host_.deallocate(host, ch.capacity(), 256);
      device_bytes_ += round_up(ch.capacity(), 256);
      cur_.h2d_bytes += ch.capacity();
    }
    os_on_device_[c] = true;
  }

  // static_partition: every parameter chunk on the device and pinned (at the first moment, after
  // each step's host updates, and after a failed step). A chunk fetched stays fetched if a later
  // one throws: the next call completes the partition.
  void pin_partition() {
    for (std::uint32_t c = 0; c < n_; ++c) {
      if (!on_device(c)) fetch(c, 0, {});
      param_[c].set_pinned(true);
      pinned_bytes_ = static_cast<std::size_t>(c + 1) * block_bytes();
    }
    engine_.synchronize();
    for (std::uint32_t c = 0; c < n_; ++c) settle(c);
    rehome_ = false;
  }

  // Waits for every copy and host step; frees what they held. Waits for all of them even when
  // one failed, then reports the first failure.
  void drain() {
    std::exception_ptr failure;
    auto wait = [&failure](auto&& f) {
      try {
        f();
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    };
    wait([&] { engine_.synchronize(); });
    wait([&] { copy_stream_.synchronize(); });  // the timeline's stamps run after the copies
    wait([&] { optimizer_stream_.synchronize(); });
    if (failure) {
      wait_idle();
      spans_.clear();
      std::rethrow_exception(failure);
    }
    spans_.clear();
    for (std::uint32_t c = 0; c < n_; ++c) optimizer_pending_[c] = false;
    for (auto const& [c, p] : pending_grad_frees_) host_.deallocate(p, grad_[c].capacity(), 256);
    pending_grad_frees_.clear();
    for (std::uint32_t id = 0; id < ids_; ++id) settle(id);
  }
  // Waits until both workers ran out of work, without reporting anything (for the destructor
  // and after a failure: a failed stream skips the rest of its queue, so this ends).
  void wait_idle() noexcept {
    while (!copy_stream_.query() || !optimizer_stream_.query()) std::this_thread::yield();
  }

  // After the warm-up: place optimizer state on the device where the margin allows
  // (chunked), choose the window (layer_window), hand the trace to the policy.
  void after_warm_up() {
    policy_.reset(tracer_.trace());
    std::size_t const budget = arena_->config().budget, peak = tracer_.peak_non_model();
    if constexpr (detail::is_chunked<Config>) {
      std::size_t const movable = 2 * n_ * block_bytes();
      std::size_t const taken = peak + reserved_bytes() + movable;
      if (budget > taken) {
        auto const fit = (budget - taken) / (os_lists * os_block_bytes());
        // An optimisation: where the arena cannot give the blocks (fragmentation), the state stays
        // on the host and the trace says so.
        for (std::uint32_t c = 0; c < n_ && c < fit; ++c) {
          if (os_on_device_[c]) continue;
          try {
            move_os_to_device(c);
          } catch (tide::error const& e) {
            if (e.category() != errc::budget) throw;
            break;
          }
        }
        // A planned change, not a divergence: the optimizer moments now touch those chunks.
        tracer_.amend([&](std::size_t, chunk::moment m, std::vector<std::uint32_t>& touched,
                          std::vector<std::uint32_t>& on_host, std::vector<std::uint32_t>& released) {
          if (m.phase == chunk::phase::optimizer) optimizer_moment(m.block, touched, on_host, released);
        });
        policy_.reset(tracer_.trace());
      }
    } else if constexpr (detail::is_window<Config>) {
      std::size_t const fit_bytes = budget > peak + reserved_bytes() ? budget - peak - reserved_bytes() : 0;
      int const fit = static_cast<int>(fit_bytes / (2 * block_bytes()));
      if constexpr (Config::window == 0) {
        auto const st = engine_.stats();
        double const copy_ms = st.completed > 0 ? st.copy_ms / static_cast<double>(st.completed) : 0;
        double const compute_ms = forward_blocks_ > 0 ? forward_ms_ / static_cast<double>(forward_blocks_) : 1;
        int const w = static_cast<int>(std::ceil(copy_ms / std::max(compute_ms, 1e-6))) + 1;
        window_ = std::clamp(w, 2, std::max(2, fit));
      } else {
        window_ = Config::window;
      }
      spare_limit_ = 2 * static_cast<std::size_t>(window_);
    }
  }

  void finish_stats(bool warm_up) {
    cur_.step = static_cast<std::size_t>(t_ - 1);
    cur_.optimizer_ms += static_cast<double>(optimizer_ns_.exchange(0)) * 1e-6;
    cur_.peak_device_bytes = arena_->stats().peak;
    cur_.device_model_bytes = 0;
    cur_.host_model_bytes = 0;
    std::size_t used = 0, held = 0;
    for (auto const* list : {&param_, &grad_, &master_, &m_, &v_})
      for (std::uint32_t c = 0; c < n_; ++c) {
        chunk::chunk const& ch = (*list)[c];
        if (ch.payload() == nullptr) continue;
        (ch.tier() == chunk::tier::device ? cur_.device_model_bytes : cur_.host_model_bytes) += ch.capacity();
      }
    for (std::uint32_t c = 0; c < n_; ++c) {
      held += param_[c].capacity();
      if (shadow_[c] != nullptr) cur_.host_model_bytes += param_[c].capacity();
    }
    for (auto const& p : params_) used += p.bytes;
    cur_.chunk_utilisation = held > 0 ? static_cast<double>(used) / static_cast<double>(held) : 0;
    cur_.moments = tracer_.moments();
    cur_.warm_up = warm_up;
    last_ = cur_;
    cur_ = {};
    std::swap(last_tide_, tide_);  // both keep their capacity: no allocation per step
    tide_.clear();
  }

  // ---- state ----------------------------------------------------------------------------------

  exec<B> ex_;
  memory::device_arena<B>* arena_;
  nn::parameter_list params_;
  nn::block_uses uses_;
  Config config_;
  scheduler_options options_;
  chunk::chunk_layout layout_;
  chunk::chunk_list param_, grad_, master_, m_, v_;
  memory::pinned_pool<B> host_;
  memory::stream<B> copy_stream_;
  memory::stream<B> optimizer_stream_;
  memory::transfer_engine<B> engine_;
  thread_pool optimizer_pool_{1};
  std::atomic<std::int64_t> optimizer_ns_{0};
  chunk::memory_tracer tracer_;
  policy_type policy_{};

  std::uint32_t n_ = 0;    // chunks per list
  std::uint32_t ids_ = 0;  // trace ids: 2 n
  std::vector<std::vector<std::uint32_t>> forward_ids_, backward_ids_, completes_;
  std::size_t working_set_ = 0;

  std::vector<memory::event<B>> ready_;   // by id: the last copy into its payload
  std::vector<memory::event<B>> busy_;    // by param chunk: its host optimizer step
  std::vector<bool> optimizer_pending_;   // by param chunk
  std::vector<std::byte*> stale_;         // by id: the block its last copy came from, freed when done
  // By parameter chunk: the host block a device-resident parameter chunk was fetched from, kept
  // while the device copy is unchanged (clean), so evicting it needs no copy back.
  std::vector<std::byte*> shadow_;
  std::vector<chunk::tier> stale_where_;
  std::vector<bool> in_flight_;
  std::size_t copies_in_flight_ = 0;
  std::vector<bool> os_on_device_;
  std::vector<host_job> jobs_;
  std::vector<undo_record> undo_;          // the chunks stepped in the step in progress
  std::vector<std::vector<kernels::adamw_tensor<T, T>>> decayed_, plain_;  // by chunk (decay_matrices_only)
  std::vector<kernels::grad_tensor<T>> grads_out_;                          // what gradients() returns
  std::vector<std::pair<std::uint32_t, std::byte*>> pending_grad_frees_;
  std::vector<std::uint32_t> candidates_, protect_, touched_, on_host_, released_;
  std::vector<std::byte*> spare_;          // layer_window: device blocks kept for reuse
  std::size_t spare_limit_ = 0, spare_bytes_ = 0;

  std::size_t device_bytes_ = 0;  // model data on the device (payloads, stale blocks, spares, optimizer state)
  std::size_t pinned_bytes_ = 0;  // static_partition: the pinned parameter chunks
  std::int64_t t_ = 1;            // the AdamW step number of the step in progress
  std::uint64_t tick_ = 0;
  std::size_t current_ = 0;
  std::size_t backward_passes_ = 0;
  bool step_open_ = false;
  bool evaluating_ = false;
  // Which parameters the open block may touch (readable | writable_grad), by parameter.
  std::vector<std::uint8_t> access_;
  bool in_block_ = false;
  int block_ = 0;
  chunk::phase phase_ = chunk::phase::forward;
  int next_backward_ = 0;          // the block backward must visit next
  bool rehome_ = false;            // static_partition: a failed step left parameter chunks unpinned
  bool closed_ = false;
  std::string broken_;             // a failure on a worker: every later step reports it
  std::size_t evicted_bytes_ = 0;  // bytes that left the device (copied or dropped clean), ever
  std::pair<std::size_t, std::size_t> moves_mark_{};  // h2d and evicted bytes at the last sample
  bool master_written_ = false;  // bf16 / f16: the masters hold the parameters (init_master ran or a load wrote them)
  trace_recorder* trace_ = nullptr;
  double block_t0_ = 0;
  std::deque<copy_span> spans_;  // stable addresses: the copy stream holds pointers into them
  static constexpr std::size_t untraced = std::numeric_limits<std::size_t>::max();
  bool placed_ = false;
  int window_ = 0;
  std::chrono::steady_clock::time_point block_start_{};
  double forward_ms_ = 0;
  std::size_t forward_blocks_ = 0;

  offload_stats cur_{}, last_{};
  std::vector<tide_sample> tide_, last_tide_;
};

}  // namespace tide::offload
