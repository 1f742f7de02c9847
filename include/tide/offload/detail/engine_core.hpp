#pragma once
// The offload engine's class: its parts and state, its constructor, and the members small enough
// to read where they are declared. The larger members are defined out of line by what they do:
// the step (detail/engine_step.hpp), the updates (detail/engine_update.hpp), and where the bytes
// come from (detail/engine_tiers.hpp); detail/engine.hpp includes them all. It owns its parts:
// the tier store (chunk_store: where the bytes live, and the moves), the residency part
// (moments, budget, prefetch, carried out on the store), the gradient sink's lane, the update
// runner, the journals, the shard map and the NVMe tier.
// Decisions come from the scheduler policy P, the update from the optimizer O, the gradient
// reduction from the sink S, parameter bytes at fetch from the source Src.
// scheduler<B, T, P, O, S, Src> (offload/scheduler.hpp) is the public face, and owns one.

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
#include "tide/offload/detail/backward_order.hpp"
#include "tide/offload/detail/chunk_store.hpp"
#include "tide/offload/detail/compute_spans.hpp"
#include "tide/offload/detail/residency.hpp"
#include "tide/offload/detail/shard_map.hpp"
#include "tide/offload/detail/sink_lane.hpp"
#include "tide/offload/detail/staged_view.hpp"
#include "tide/offload/detail/file_plan.hpp"
#include "tide/offload/detail/file_tier.hpp"
#include "tide/offload/detail/undo.hpp"
#include "tide/offload/detail/update_runner.hpp"
#include "tide/offload/gradient_sink.hpp"
#include "tide/offload/scheduler_options.hpp"
#include "tide/offload/scheduler_policy.hpp"
#include "tide/optim/optimizer.hpp"

namespace tide::offload {

template <Backend B, Element T, class Policy, class Optimizer, class Sink, class Source>
class scheduler;

namespace detail {

template <Backend B, Element T, class P, class O, class S, class Src>
class engine_core {
  using store = chunk_store<B, T, engine_core>;
  using residency_part = residency<B, T, P, engine_core>;
  friend store;           // asks what its header lists
  friend residency_part;  // asks stepping() and read_param_ahead(), places through the members below
  friend shard_map;  // calls the port below
  template <Backend, Element, class, class, class, class>
  friend class offload::scheduler;  // the public face owns one, and reads what it reports

 public:
  static constexpr bool has_master = store::has_master;
  static constexpr std::size_t state_lists = O::state_lists;
  static constexpr std::size_t extra_count = extra_lists_of<S>().size();
  // fp32-sized lists per chunk that live with the optimizer state (the minimum counts them so).
  static constexpr std::size_t fp32_lists = state_lists + (store::has_master ? 1 : 0) + extra_count;
  // Lists a chunk may keep in the NVMe tier: the optimizer's state, then the fp32 master.
  static_assert(state_lists <= max_state_lists, "offload::scheduler: the optimizer keeps more state lists than "
                "offload::max_state_lists, which the NVMe tier's file holds beside the masters");
  static_assert(max_state_lists + 1 <= file_tier<B>::max_lists);

  engine_core(exec<B> const& ex, memory::device_arena<B>& arena, parameter_list params, block_uses uses,
              P const& policy, scheduler_options const& options, O const& optimizer, S const& sink,
              Src const& source)
      : store_(*this, ex, arena, params, uses, policy.layout(params, uses, arena.config().budget, sizeof(T)),
               state_lists, extra_lists_of<S>(), {.lock_pages = options.lock_host_pages, .capacity = options.host_capacity},
               shard_of(sink), options.host_budget == 0),
        res_(store_, policy),
        sinks_(sink, store_.n_, store_.cur_),
        source_(source),
        options_(options),
        undo_(store_.host_, store_.layout_.chunks()),
        extra_undo_(store_.host_, extra_count > 0 ? store_.layout_.chunks() : 0),
        runner_(optimizer, options.decay_matrices_only, store_.layout_, store_.params_.all(), undo_, store_.host_,
                store_.grad_, store_.cur_, fp32_lists,
                std::min<std::size_t>(static_cast<std::size_t>(std::max(options.host_steps_in_flight, 0)), store_.n_)),
        lr_(optimizer.lr),
        params_sharded_(shards_parameters_of(sink) && store_.shard_.ranks > 1),
        shards_(store_.shard_, shards_parameters_of(sink), store_.n_) {
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
      TIDE_REQUIRE(store_.shard_.ranks == 1, "offload::scheduler: reuse_grad_slots with a sink that shards the "
                   "optimizer state over ", store_.shard_.ranks, " ranks (ZeRO): a rank keeps the fp32 masters of "
                   "its own chunks only, so it could not rebuild another rank's parameters after a skipped or failed "
                   "step; use a sink that keeps every chunk's state on every rank, or leave reuse_grad_slots off");
    }
    std::uint32_t const n = store_.n_;
    swapped_.assign(n, false);
    gather_where_.assign(n, chunk::tier::host);
    store_.keep_host_copies_ = options_.keep_host_copies;
    block_free_.resize(n);
    os_on_device_.assign(n, false);
    backward_ = backward_order(store_.uses_);
    // Everything the steady state appends to is sized here: a step allocates nothing on the heap.
    res_.plan_.ctx.state_lists = fp32_lists;
    if constexpr (LayoutAwareSink<S>) sinks_.sink().bind_layout(store_.layout_, store_.params_.all());
    std::size_t completing = 0;
    for (int b = store_.uses_.first_block; b <= store_.uses_.last_block(); ++b) completing += res_.completes_at(b).size();
    sinks_.set_chunks_per_step(completing);
    open_files();
    runner_.set_files(files_.get());
    if (options_.host_budget != 0) attach_host_state();
  }

  engine_core(engine_core const&) = delete;
  engine_core& operator=(engine_core const&) = delete;
  // Frees every block, also after a failure (the scheduler drained and reported first).
  ~engine_core() {
    release_params_quietly();  // ZeRO-3: no gather writes a block freed below
    wait_idle();               // no worker reads or writes a block freed below
    runner_.free_deferred();
    files_.reset();            // the NVMe tier finishes its reads before its blocks go
    undo_.discard();
    extra_undo_.discard();
    store_.free_all();
    runner_.free_ring();  // after the chunks: a chunk freeing a ring block gives it back to the ring
  }

  // ---- the model's offloaded activations (offload::hooks carries them) -------------------------
  // Host room for them, from the host pool. Under host_budget they must fit what the model data
  // kept on the host leaves of it (host_reserve keeps that room).
  std::byte* activation_host(std::size_t bytes);
  void release_activation_host(std::byte* p, std::size_t bytes) noexcept;
  // One block's copies, on the activation copy stream (beside the chunk copies, not behind them):
  // one span on the timeline's activation copy lane, after the compute work `ready` marks, `done`
  // recorded after the last.
  void copy_activations(int block, memory::copy_direction d, std::span<memory::copy_request const> copies,
                        memory::event<B> const& ready, memory::event<B>& done);
  // Waits for every copy; a failure is left for the step to report (the stream keeps it).
  void drain_activations() noexcept {
    if (store_.activation_engine_) store_.activation_engine_->drain();
  }
  [[nodiscard]] std::size_t activation_host_bytes() const noexcept { return activation_host_bytes_; }

  // ---- the placement members policies call ----------------------------------------------------
  // Every parameter chunk on the device and pinned there. Idempotent: a chunk fetched stays
  // fetched if a later one throws, and the next call completes the set.
  // Under ZeRO-3 only the rank's own chunks: the others come and go around their blocks.
  void pin_parameters();
  // The master and optimizer state of the first `count` chunks to the device, where their steps
  // then run. required = false: an optimisation, stopped where the arena refuses. Returns the
  // chunks whose state is on the device.
  std::uint32_t place_state_on_device(std::uint32_t count, bool required);
  // Device blocks kept for reuse instead of going back to the arena (layer_window's pool).
  void keep_spare_blocks(std::size_t count) { store_.keep_spare_blocks(count); }

  // The optimizer moment after block's backward: host-state chunks must be on the host,
  // device-state ones are touched there; the completed gradient chunks are released after it.
  void optimizer_moment(int block, std::vector<std::uint32_t>& touched, std::vector<std::uint32_t>& on_host,
                        std::vector<std::uint32_t>& released) const;

  // ---- what the scheduler checks before it hands out a parameter ----------------------------
  // A device backend: what a caller reads or writes between steps must be in host memory.
  void require_host_side(chunk::chunk_list const& list, std::uint32_t i, char const* what) const {
    if constexpr (B::is_device) {
      chunk::chunk const& ch = list[store_.layout_.chunk_of[i]];
      TIDE_CHECK(ch.payload() == nullptr || ch.tier() != chunk::tier::device, usage, "offload::scheduler::", what,
                 "(", i, "): \"", store_.params_[i].name(), "\" lies in device memory between steps on this backend, "
                 "which the host cannot address; read parameters with read_param(i)");
    }
  }
  // Tensor i of `list` (bytes long) where the host can read it, between steps: in place, or on a
  // device backend through the staged view (written back when it ends if `write_back`).
  std::span<std::byte> host_side(chunk::chunk_list const& list, std::uint32_t i, std::size_t bytes, bool write_back) {
    if constexpr (B::is_device) {
      chunk::chunk const& ch = list[store_.layout_.chunk_of[i]];
      if (ch.payload() != nullptr && ch.tier() == chunk::tier::device)
        return views_.stage(store_.ex_, list.data(i), bytes, write_back);
    }
    return {list.data(i), bytes};
  }
  // A writable staged view ends (drain and the start of a step end it too).
  void flush_views() {
    if constexpr (B::is_device) views_.flush(store_.ex_);
  }
  void require_held(std::uint32_t i, char const* what) const {
    std::uint32_t const c = store_.layout_.chunk_of[i];
    TIDE_CHECK(this->has_param(c), usage, "offload::scheduler::", what, "(", i, "): under ZeRO-3 rank ",
               store_.shard_.rank, " keeps only its own chunks' parameters between steps, and \"", store_.params_[i].name(),
               "\" lies in chunk ", c, " of rank ", store_.shard_.owner(c), "; call gather_parameters() on every rank "
               "first, or ask holds_parameter(i)");
  }

  // ---- the step: the scheduler's hooks (detail/engine_step.hpp) ------------------------------
  // A block's moment (pre_forward: forward; pre_backward: backward; pre_backward_input: a split
  // backward's input pass): its chunks resident, the next moments' prefetched.
  void enter(int block, chunk::phase ph);
  void post_forward(int block);
  void pre_backward_input(int block);
  void post_backward_input(int block);
  void pre_backward(int block);
  void post_backward(int block);
  void hand_over_gradients();
  // The end of a step: apply = true updates (step()), false drops the gradients (skip_step()).
  void finish(bool apply);
  // A step that threw, undone: every part's abort(), then the step's own state.
  void abort_step() noexcept;

 protected:
  // ---- what the store asks ------------------------------------------------------------------
  // The residency part answers for which chunk makes room, and hears of each fetch.
  std::optional<std::uint32_t> pick_victim(std::size_t t, std::span<std::uint32_t const> protect, std::size_t beyond) {
    return res_.pick_victim(t, protect, beyond);
  }
  void fetched(std::uint32_t id) { res_.fetched(id); }
  void before_fetch(std::uint32_t id);
  // The chunk source fills parameter chunk c's device block (`after_copy_stream`: the block or the
  // host copy is ready once the copy stream passed its work so far; the default copies there).
  void fill_chunk(std::uint32_t c, std::byte* device, std::byte const* host, std::size_t bytes, bool after_copy_stream);
  void released(std::uint32_t c) noexcept {
    if (!swapped_[c]) source_.released(c);  // a slot holding gradients was not filled by the source
  }
  // A gradient chunk the sink still works on leaves the device after the sink finished: the copy
  // stream waits for the sink's event, the calling thread does not.
  void before_copy_out(std::uint32_t id) {
    std::uint32_t const c = id < store_.n_ ? id : id - store_.n_;
    if ((id >= store_.n_ || swapped_[c]) && sinks_.pending(c)) store_.copy_stream_.wait(sinks_.reduced(c));
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
  void first_placement();
  void begin_step_if_needed();
  // Bytes fetched and evicted since the last sample go to the newest one.
  void add_moves_to_last_sample();
  void sample_non_model();

  // ---- ZeRO-3: other ranks' parameter chunks, held only around the blocks that use them -------
  // shard_map (detail/shard_map.hpp) decides what is held and gathered; the members below are
  // the port through which it moves the bytes.
  [[nodiscard]] bool has_param(std::uint32_t c) const { return shards_.has_param(c); }
  // Before a block's moment: shard_map::gather_for with the block's chunks; once they are
  // resident, gather_ahead with the next moment's.
  void gather_for(int block, chunk::phase ph);
  void gather_ahead(int block, chunk::phase ph);
  // The moment the hooks run next when the model goes on as usual (none after the last).
  [[nodiscard]] std::optional<std::pair<int, chunk::phase>> next_moment(int block, chunk::phase ph) const;
  void release_params() { shards_.release_all(*this); }
  void release_params_quietly() noexcept { shards_.abort(*this); }
  void gather_all() {
    gather_protect_ = {};  // no block is open
    shards_.gather_all(*this);
  }
  // The port (detail/engine_tiers.hpp). In a step or an evaluation, a gather lands in a device
  // block where the sink can receive there (DeviceGatheringSink) and the budget has room without
  // evicting; in a host block otherwise. gather_where_ remembers which.
  static constexpr bool gathers_device = DeviceGatheringSink<S, B> && std::is_same_v<Src, host_source>;
  std::byte* gather_block(std::uint32_t c);
  std::byte* device_gather_block(std::uint32_t c);  // nullptr: no room
  void free_gather_block(std::uint32_t c, std::byte* block) noexcept;
  void abandon_gather_block(std::uint32_t c, std::byte* block) noexcept;
  void send_own(std::uint32_t c, std::byte* block);
  void gather_async(std::uint32_t c, std::byte* block);
  void wait_gathered();
  void attach_gathered(std::uint32_t c, std::byte* block) noexcept;
  void drop_param(std::uint32_t c);
  // Parameter chunk c no longer pinned on the device (pinned chunks count in ctx_.pinned_bytes).
  void unpin_param(std::uint32_t c) noexcept {
    chunk::chunk& p = store_.param_[c];
    if (!p.pinned()) return;
    p.set_pinned(false);
    res_.plan_.ctx.pinned_bytes -= store_.block_bytes();
  }
  // Parameter chunk c's payload freed wherever it is (no copy in flight), unpinned; the source
  // hears of a device copy that went.
  void free_param_payload(std::uint32_t c) noexcept;

  // ---- the gradient sink and the optimizer ----------------------------------------------------
  // After the pass that completes them: chunk c's gradients go to READY_FOR_REDUCE and to the sink.
  void hand_to_sink(int block);
  void wait_reduced(std::uint32_t c) { sinks_.wait(c); }
  // Waits for optimizer work on parameter chunk c (the host step writes its host payload).
  void wait_optimizer(std::uint32_t c) {
    if (!runner_.pending(c)) return;
    runner_.wait(c);
    swap_in_update(c);
  }
  // Chunk c's host step ran: a journal record that swaps gives the chunk its blocks now (undo.hpp).
  void swap_in_update(std::uint32_t c);
  // Whether chunk c's host step keeps the values before it by swapping blocks: the optimizer can
  // write them (update_runner::swaps), none of its lists is on file, and the parameters are not
  // in the gradients' slot.
  [[nodiscard]] bool swaps_undo(std::uint32_t c) const noexcept {
    return runner_.swaps() && !options_.reuse_grad_slots && !state_on_file(c) && !params_spilled(c);
  }

  // The optimizer moment after `block`'s backward, and its steps (apply = false: moves only).
  void optimizer_moments_of(int block, bool apply);
  // The gradients of chunks another rank steps, once the sink finished with them (wait: all).
  void free_reduced_unowned(bool wait) {
    sinks_.free_unowned(wait, [this](std::uint32_t c) { release_grad(c); });
  }

  // ZeRO: after the step's updates, every chunk's parameters from the rank that stepped it. The
  // chunks this rank did not step are journalled first, so a failed exchange is undone.
  void share_parameters();

  // Chunk c's lists as the optimizer sees them (fp32 parameters: the parameter chunk is the master).
  [[nodiscard]] update_targets<T, O::state_lists> targets_of(std::uint32_t c);
  [[nodiscard]] optim::update_tensor<T, O::state_lists> update_of(std::uint32_t c);
  [[nodiscard]] index_t step_elements(std::uint32_t c) const {
    // Up to the end of the chunk's last tensor (the rest of the chunk is never touched).
    std::uint32_t const last = store_.layout_.first_param[c + 1] - 1;
    return static_cast<index_t>(store_.layout_.offset_of[last] + static_cast<std::size_t>(store_.params_[last].numel()));
  }

  using host_job = typename update_runner<B, T, O>::job;
  void optimizer_step(std::uint32_t c, bool apply);
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
  void stage_spilled(host_job& job);
  // Deferred updates (step() runs them, in the order backward completed the chunks): the reads of
  // the first chunks on file to complete start as backward completes them, one per ring block.
  void prefetch_spilled(int block);
  // At construction: plan_files decides what the host budget cannot hold; the file tier takes it.
  // The masters go to file with the state, unless reuse_grad_slots keeps them on the host (a
  // skipped or failed step rounds the parameters back from them, which must not fail).
  void open_files();
  // With a host budget the store attaches no optimizer state: here the state that stays on the
  // host starts zeroed, after open_files chose what goes to file, so that the host never holds
  // the state on file (a model whose state does not fit host memory can be built).
  void attach_host_state();
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
  void materialize_param(std::uint32_t c);
  // Chunk c's parameters to read when they are on file alone (nullptr: read them where they are).
  std::byte const* param_file_view(std::uint32_t c) {
    return files_ ? files_->param_view(c, update_of_chunk_done()) : nullptr;
  }
  // A failed step, once drained: device copies of the parameters on file may hold what its
  // updates wrote to the other slots, which the file forgets; they go, and come back when used.
  void drop_param_file_copies() noexcept;
  // The views' blocks back to the pool (a save ended, a load or a step begins).
  void drop_view() {
    if (files_ && files_->drop_view()) store_.host_.trim();  // back under host_budget
  }
  // The materialized chunks' lists back to file; a failed write keeps them on the host.
  void flush_spilled() {
    if (files_ && files_->flush()) store_.host_.trim();  // back under host_budget
  }
  // After the optimizer drained: a failed read or write on file fails the step (its slots stay as
  // they were; abort_step puts the parameters back).
  void check_spill();
  void forget_spill_failures() noexcept { runner_.abort(); }
  // Chunk c's journal record, its blocks acquired (swap: blocks for the update to write into;
  // else the copies' blocks, counted in undo_copy_bytes).
  undo_record<O::state_lists>* begin_undo(std::uint32_t c, index_t n, bool swap = false) {
    if (!options_.undo_on_error) return nullptr;
    update_targets<T, O::state_lists> x = targets_of(c);
    if (swap) return undo_.begin_swap(c, static_cast<std::size_t>(n), x, store_.param_.chunk_bytes(),
                                      store_.master_.chunk_bytes());
    if (options_.reuse_grad_slots) x.param = nullptr;  // the slot holds gradients: rounded back from the master
    if (params_spilled(c)) x.param = nullptr;          // on file: its current slot keeps them
    undo_record<O::state_lists>* const r = undo_.begin(c, static_cast<std::size_t>(n), x);
    store_.cur_.undo_copy_bytes += undo_.bytes_of(*r);
    return r;
  }

  // The masters start as the parameters the model initialised (or a checkpoint wrote): once,
  // before the first update, while every chunk is still readable on the host. A master in the
  // NVMe tier is written to its chunk's current slot.
  void init_master();
  // ---- gradient-slot reuse (reuse_grad_slots) ------------------------------------------------
  // The chunk that holds chunk c's gradients: its parameter chunk once they took its slot.
  [[nodiscard]] chunk::chunk& grad_chunk(std::uint32_t c) { return swapped_[c] ? store_.param_[c] : store_.grad_[c]; }
  [[nodiscard]] std::byte* grad_bytes(std::uint32_t i) {
    std::uint32_t const c = store_.layout_.chunk_of[i];
    if (!swapped_[c]) return store_.grad_.data(i);
    return store_.param_[c].payload() + store_.layout_.offset_of[i] * sizeof(T);
  }
  // The block's completed chunks: each one's gradient block becomes its parameter chunk's payload
  // (on whichever tier the gradients are), and the parameter block and its host copy are freed.
  // Nothing is copied. Each completed chunk's gradient chunk is FREE after it.
  void take_grad_slots(int block);
  // Parameter chunk c's parameters again, rounded from its master (a skipped or abandoned step:
  // the slot held gradients). Exact: between steps a parameter is its master rounded.
  void round_masters_back(std::uint32_t c);
  // The end of a step: `stepped` (every chunk was updated, and so holds parameters again) or
  // not (skipped or abandoned: each chunk whose slot holds gradients gets its parameters back).
  void return_grad_slots(bool stepped);

  // Model data held now, host and device (offload_stats::peak_model_bytes).
  [[nodiscard]] std::size_t model_bytes_now() const;

  // Gradient chunk c to FREE, its payload released.
  void release_grad(std::uint32_t c);

  // Waits for every copy, sink and host step; frees what they held. Waits for all of them even
  // when one failed, then reports the first failure.
  void drain();
  // Waits until the workers ran out of work, without reporting anything (for the destructor and
  // after a failure: a failed stream skips the rest of its queue, so this ends). A sink's events
  // are waited for too: its work may still read a gradient chunk.
  void wait_idle() noexcept;

  // ---- state ----------------------------------------------------------------------------------
  store store_;           // the tier store: where each chunk's bytes live, and the moves
  residency_part res_;    // which chunks are resident when: the planner's decisions carried out
  sink_lane<B, T, S> sinks_;  // the gradient sink and its work on this step's chunks
  memory::event<B> handed_;   // device: the compute work before the last hand-over to the sink
  // Device: the tensor the host reads or writes between steps.
  [[no_unique_address]] std::conditional_t<B::is_device, staged_view<B>, empty_part> views_;
  Src source_;
  scheduler_options options_;
  undo_journal<B, T, O::state_lists> undo_;
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
  std::vector<std::uint32_t> touched_, on_host_, released_, written_;  // a moment's lists for the tracer
  std::vector<std::uint32_t> ids_pair_ = std::vector<std::uint32_t>(2);
  bool params_sharded_ = false;  // ZeRO-3 on more than one rank
  shard_map shards_;             // ZeRO-3: the chunks held now, the gathers in flight
  std::vector<chunk::tier> gather_where_;  // by chunk: where its gather in flight lands
  memory::event<B> gathers_after_;         // device gathers: the compute work before them
  std::span<std::uint32_t const> gather_protect_;  // the open moment's chunks, which a gather never evicts

  std::int64_t t_ = 1;  // the optimizer step number of the step in progress
  bool step_open_ = false;
  bool evaluating_ = false;
  bool placed_ = false;
  backward_order backward_;       // the block backward must visit next, each run's passes in this step
  bool aborted_ = false;          // a failed step may have left the policy's placement incomplete
  bool master_written_ = false;   // bf16 / f16: the masters hold the parameters
  std::string broken_;            // a failure on a worker: every later step reports it
  std::pair<std::size_t, std::size_t> moves_mark_{};  // h2d and evicted bytes at the last sample
  bool handed_over_ = false;  // defer_sink: hand_over_gradients() ran in this step
  compute_spans<B> compute_lane_;  // the timeline's compute lane: blocks, device optimizer steps
};

}  // namespace detail
}  // namespace tide::offload
