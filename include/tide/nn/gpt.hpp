#pragma once
// tide::nn::gpt<Backend, T, Hooks>: a GPT-2 model (llm.c's, with each layer's parameters kept
// together) with an explicit backward, built only from tide::kernels entries.
//
//   tide::memory::device_arena<tide::host> arena{{.budget = 512_MiB}};
//   tide::nn::gpt<tide::host> model{{.layers = 2, .heads = 2, .channels = 64, .vocab = 256,
//                                    .max_seq = 64}, arena, {.seed = 1}};
//   tide::thread_pool pool{2};
//   tide::exec<tide::host> ex{pool};
//   model.zero_grad(ex);
//   float loss = model.forward(ex, tokens, targets);   // tokens, targets: (B, T) int32
//   model.backward(ex);                                // gradients += d loss / d parameters
//   // step: tide::kernels::adamw(ex, hp, t, model.flat_params(), model.flat_grads(), m, v);
//
// Learned position embeddings, L pre-LN blocks, a final LayerNorm and an LM head tied to wte
// (Vp, C); loss: mean cross-entropy over the V real columns. forward_blocks / backward_blocks
// run a range of blocks for one of options.in_flight micro-batch slots (pipeline stages).
// Memory comes from the caller's device_arena: parameters at construction, gradients at the
// first zero_grad / backward, activations (in_flight copies of one lifetime_planner plan) at
// the first forward of each (B, T). gpt_options::recompute and offload_activations take a
// block's activations off the plan between its forward and backward (recomputed, or kept on the
// host), bit-identically; split_backward runs the backward in two passes. On tide::sealed (and any
// device backend) kernels are queued: synchronize the compute stream before destroying the model
// or its arena. docs/nn.md has the details. The pieces: nn/gpt_config.hpp, nn/gpt_activations.hpp
// (the plan), nn/detail/stage_slots.hpp (the pass order's checks), nn/gpt_blocks.hpp (each
// block's forward and backward).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parameters.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/lifetime_planner.hpp"
#include "tide/memory/ops.hpp"
#include "tide/memory/pinned_pool.hpp"
#include "tide/memory/stream.hpp"
#include "tide/memory/transfer_engine.hpp"
#include "tide/nn/backend_ops.hpp"
#include "tide/nn/detail/activation_mover.hpp"
#include "tide/nn/gpt_activations.hpp"
#include "tide/nn/detail/stage_slots.hpp"
#include "tide/nn/gpt_blocks.hpp"
#include "tide/nn/gpt_config.hpp"

namespace tide::nn {

template <Backend B, Element T, class Hooks>
class gpt {
  static_assert(GptHooks<Hooks>, "gpt<B, T, Hooks>: Hooks must have pre_forward(int), post_forward(int), "
                                 "pre_backward(int) and post_backward(int) (tide::nn::no_hooks has them all)");

 public:
  using backend = B;
  using element_type = T;
  using hooks_type = Hooks;
  using arena_type = memory::device_arena<B>;
  template <class U>
  using view = tensor_view<U, B>;
  using token_view = tensor_view<std::int32_t const, B>;
  // true when Hooks keep the parameters and gradients (ParameterStorage): an offload scheduler.
  static constexpr bool external_storage = ParameterStorage<Hooks, T>;
  // true when Hooks carry the offloaded activations (ActivationCarrier): an offload scheduler.
  static constexpr bool carried_by_hooks = ActivationCarrier<Hooks, B>;

  // Allocates the parameters from `arena` and initialises them (GPT-2, from options.seed).
  // Throws tide::error(usage) for a bad config or in_flight < 1, tide::error(budget) if the
  // parameters do not fit.
  gpt(gpt_config const& config, arena_type& arena, gpt_options const& options = {}, Hooks hooks = {})
      : config_(resolve(config)),
        options_(check_options(config_, options)),
        params_list_(gpt_parameters(config_, dtype_of<T>, options.alignment)),
        arena_(&arena),
        hooks_(std::move(hooks)),
        plan_(config_, options.keep_logits, has_tied_buffer(options), sizeof(T), options.alignment, options.recompute,
              options.offload_activations, options.split_backward),
        slots_(static_cast<std::size_t>(options.in_flight)),
        stages_(config_.layers, options.in_flight) {
    TIDE_REQUIRE(!external_storage || SplitBackwardHooks<Hooks> || !options.split_backward,
                 "gpt_options::split_backward with hooks that keep the parameters but have no pre_backward_input / "
                 "post_backward_input (a split backward's input pass): add them (offload::hooks has them), give the "
                 "model its own storage (nn::no_hooks), or leave the backward whole");
    if constexpr (!external_storage)
      params_ = detail::arena_block<B>(arena, params_list_.bytes(), options_.alignment);
    initialise(nullptr, options_.seed);
  }

  // Returns the host copies of offloaded activations (to the hooks that gave them, if they did).
  ~gpt() { release_activation_host(); }
  gpt(gpt const&) = delete;
  gpt& operator=(gpt const&) = delete;

  // ---- what it is -----------------------------------------------------------------------------
  [[nodiscard]] gpt_config const& config() const noexcept { return config_; }
  [[nodiscard]] gpt_options const& options() const noexcept { return options_; }
  [[nodiscard]] parameter_list const& parameters() const noexcept { return params_list_; }
  [[nodiscard]] Hooks& hooks() noexcept { return hooks_; }
  [[nodiscard]] Hooks const& hooks() const noexcept { return hooks_; }
  // The block numbers forward_blocks / backward_blocks take: embedding_block .. head_block.
  [[nodiscard]] static constexpr int first_block() noexcept { return embedding_block; }
  [[nodiscard]] int last_block() const noexcept { return head_block(config_); }

  // ---- parameters and gradients ---------------------------------------------------------------
  // One tensor of the flat buffer, by record (from parameters()) or by name ("h0.attn.qkv.w").
  [[nodiscard]] view<T> param(parameter const& p) const { return tensor_at(params_, p, false); }
  [[nodiscard]] view<T> param(std::string_view name) const { return param(params_list_.find(name)); }
  // Gradients: the same layout in a second buffer. Throws tide::error(usage) before the first
  // zero_grad / backward allocated it.
  [[nodiscard]] view<T> grad(parameter const& p) const { return tensor_at(require_grads("grad"), p, true); }
  [[nodiscard]] view<T> grad(std::string_view name) const { return grad(params_list_.find(name)); }
  // The whole buffers as (n) with n = parameters().bytes() / sizeof(T): every tensor plus the
  // alignment padding between them, which is zero and stays zero (no kernel writes it), so a
  // flat optimizer step or norm over them equals one over the tensors.
  // Not with external storage (the tensors are spread over chunks): static_assert.
  [[nodiscard]] view<T> flat_params() const {
    static_assert(!external_storage, "gpt::flat_params: the hooks keep the parameters in their own storage (chunks); "
                                     "step the optimizer through the scheduler, or read tensors with param(p)");
    return flat(params_);
  }
  [[nodiscard]] view<T> flat_grads() const {
    static_assert(!external_storage, "gpt::flat_grads: the hooks keep the gradients in their own storage (chunks); "
                                     "read tensors with grad(p)");
    return flat(require_grads("flat_grads"));
  }
  [[nodiscard]] bool has_grads() const noexcept { return external_storage || static_cast<bool>(grads_); }

  // Re-initialises the parameters from `seed` (the constructor's initialisation; the values do
  // not depend on the thread count). On tide::host threaded over ex's pool; on a device backend
  // made on the calling thread and copied, after the compute work issued so far (the same bits).
  void init(exec<B> const& ex, std::uint64_t seed) {
    if constexpr (B::is_device) {
      memory::synchronize(ex);
      initialise(nullptr, seed);
    } else {
      initialise(&ex.pool, seed);
    }
  }

  // ---- training: the whole model ----------------------------------------------------------------
  // One micro-batch for a trainer: tokens and targets, (B, T) each.
  struct batch_type {
    token_view tokens, targets;
  };
  // Tokens a batch trains on: B T.
  [[nodiscard]] static std::size_t tokens_in(batch_type const& b) noexcept {
    return static_cast<std::size_t>(b.tokens.size());
  }

  // Forward over tokens (B, T), T <= max_seq, ids in [0, V), without a loss: fills logits().
  void forward(exec<B> const& ex, token_view tokens) {
    detail::check_batch<B>("gpt::forward", ex, config_, tokens, nullptr, true);
    run_forward(ex, embedding_block, last_block(), 0, tokens, nullptr);
  }
  // Forward with targets (B, T) in [0, V): returns the mean cross-entropy over the B T
  // positions and leaves dlogits ready for backward(). Without options.keep_logits the logits
  // buffer now holds dlogits (logits() throws); the caller's tokens and targets must stay
  // unchanged until backward() (they are read again there, not copied).
  float forward(exec<B> const& ex, token_view tokens, token_view targets) {
    detail::check_batch<B>("gpt::forward", ex, config_, tokens, &targets, true);
    return run_forward(ex, embedding_block, last_block(), 0, tokens, &targets);
  }
  float forward(exec<B> const& ex, batch_type const& b) { return forward(ex, b.tokens, b.targets); }

  // Gradients += d(mean loss)/d(parameters) of the last forward with targets, times loss_scale
  // (loss scaling; a power of two keeps it exact). Gradients accumulate across forward +
  // backward pairs (micro-batches) until zero_grad(); a first backward without zero_grad
  // allocates them zeroed. For a mean over m micro-batches, scale by 1/m. One backward per
  // forward: backward reuses the memory of the activations it is done with.
  void backward(exec<B> const& ex, float loss_scale = 1.f) {
    run_backward("gpt::backward", ex, embedding_block, last_block(), 0, loss_scale, pass::whole);
  }

  // ---- training: stages -------------------------------------------------------------------------
  // Forward of blocks first .. last (embedding_block <= first <= last <= head_block) for the
  // micro-batch in slot `micro` (0 <= micro < options.in_flight). batch.tokens gives (B, T) to
  // every range (all micro-batches in flight share it: a new (B, T) replans and drops every
  // slot's activations); the embedding block reads its ids, the head block reads batch.targets
  // and then returns the mean loss. Other ranges return NaN (no loss exists there). Block
  // first's input is boundary(first - 1, micro), which a pipeline fills before calling.
  float forward_blocks(exec<B> const& ex, int first, int last, int micro, batch_type const& batch) {
    stages_.check_range("gpt::forward_blocks", first, last, micro);
    check_whole_model("gpt::forward_blocks");
    token_view const* targets = last == last_block() ? &batch.targets : nullptr;
    detail::check_batch<B>("gpt::forward_blocks", ex, config_, batch.tokens, targets, first == embedding_block);
    return run_forward(ex, first, last, micro, batch.tokens, targets);
  }

  // Backward of blocks last .. first for slot `micro`, after that slot's forward of them:
  // gradients += as backward() does (zero_grad-free first call allocates them). With the head
  // in the range, loss_scale multiplies the loss gradient (other ranges ignore it: the gradient
  // arriving in boundary_grad(micro) carries it). Without the head, boundary_grad(micro) must
  // hold d loss / d(block last's output); on return it holds d loss / d(block first's input).
  // With the tied buffer (has_tied_buffer(options)) the embedding block's backward also adds
  // tied_grad(micro) into wte's gradient; without it the head block adds its share directly.
  void backward_blocks(exec<B> const& ex, int first, int last, int micro, float loss_scale = 1.f) {
    stages_.check_range("gpt::backward_blocks", first, last, micro);
    check_whole_model("gpt::backward_blocks");
    run_backward("gpt::backward_blocks", ex, first, last, micro, loss_scale, pass::whole);
  }
  // backward_blocks in two passes (gpt_options::split_backward): the input pass (B) leaves
  // boundary_grad(micro) and tied_grad(micro) as backward_blocks does; the weight pass (W), later but
  // before the slot's next forward, adds the range's parameter gradients (bit for bit backward_blocks'),
  // and may run beside B of the range below. A failed step's owed weight passes: drop_weight_passes().
  void backward_input_blocks(exec<B> const& ex, int first, int last, int micro, float loss_scale = 1.f) {
    check_split("gpt::backward_input_blocks", first, last, micro);
    run_backward("gpt::backward_input_blocks", ex, first, last, micro, loss_scale, pass::input);
  }
  void backward_weight_blocks(exec<B> const& ex, int first, int last, int micro) {
    check_split("gpt::backward_weight_blocks", first, last, micro);
    run_backward("gpt::backward_weight_blocks", ex, first, last, micro, 1.f, pass::weights);
  }
  [[nodiscard]] bool splits_backward() const noexcept { return options_.split_backward; }
  void drop_weight_passes() noexcept { stages_.clear(); }  // their gradients go with the step

  // Plans and allocates the activations of every slot for (B, T), and the scratch of the kernels
  // ex runs, as a forward of a new (B, T) does: a pipeline stage calls it before receiving its
  // first boundary. Throws tide::error(budget) if they do not fit.
  void plan_activations(exec<B> const& ex, index_t batch, index_t seq) {
    TIDE_REQUIRE(batch >= 1 && seq >= 1 && seq <= config_.max_seq, "gpt::plan_activations(", batch, ", ", seq,
                 "): pass B >= 1 and 1 <= T <= max_seq = ", config_.max_seq);
    prepare(ex, batch, seq);
  }

  // (B, T, C): the residual stream leaving `block` (embedding_block .. L-1) for slot `micro`,
  // what a pipeline sends after forward_blocks(.., block, micro) and receives before
  // forward_blocks(block + 1, .., micro).
  [[nodiscard]] view<T> boundary(int block, int micro) const {
    check_slot("gpt::boundary", micro);
    TIDE_REQUIRE(block >= embedding_block && block < config_.layers, "gpt::boundary(", block, ", ", micro,
                 "): pass a block in [embedding_block (-1), L - 1 = ", config_.layers - 1,
                 "]; the head block's output is the loss, not a tensor");
    return act<T>(plan_.residual_in(block + 1), micro, {batch_, seq_, index_t{config_.channels}});
  }
  // (B, T, C): the residual stream's gradient of slot `micro`: the gradient arriving at the last
  // block of a stage before backward_blocks, the one leaving its first block after.
  [[nodiscard]] view<T> boundary_grad(int micro) const {
    check_slot("gpt::boundary_grad", micro);
    return act<T>(plan_.dres, micro, {batch_, seq_, index_t{config_.channels}});
  }
  // (Vp, C): the head's share of wte's gradient for slot `micro`, written by the head block's
  // backward and added into wte's gradient by the embedding block's backward of the same slot
  // (a pipeline sends it from the last stage to the first in between). Only with the buffer
  // (options.separate_tied_grad or in_flight > 1); without it the head adds into wte's gradient.
  [[nodiscard]] view<T> tied_grad(int micro) const {
    TIDE_REQUIRE(plan_.has_tied(), "gpt::tied_grad: this model has no tied gradient buffer (in_flight = 1 and "
                                   "separate_tied_grad = false: the head adds its share straight into wte's "
                                   "gradient); construct it with gpt_options::separate_tied_grad = true");
    check_slot("gpt::tied_grad", micro);
    return act<T>(plan_.tied, micro, {index_t{config_.padded_vocab}, index_t{config_.channels}});
  }

  // Gradients = 0 (allocated from the arena on the first call); external storage: the hooks'.
  void zero_grad(exec<B> const& ex);

  // The mean loss of the last forward through the head (NaN if it had no targets, or none ran).
  [[nodiscard]] float loss() const noexcept { return loss_; }

  // (B, T, Vp) logits of the last forward through the head; columns >= V are padding.
  [[nodiscard]] view<T> logits() const {
    TIDE_REQUIRE(head_slot_ >= 0, "gpt::logits: no forward through the head has run yet");
    TIDE_REQUIRE(options_.keep_logits || !slot(head_slot_).targets_given,
                 "gpt::logits: the last forward had targets and turned the logits into dlogits in place; "
                 "construct the model with options.keep_logits = true, or run forward(ex, tokens) without targets");
    return act<T>(plan_.logits, head_slot_, {batch_, seq_, index_t{config_.padded_vocab}});
  }
  // (B, T) per-position losses of the last forward through the head, with targets.
  [[nodiscard]] view<float> losses() const {
    TIDE_REQUIRE(head_slot_ >= 0 && slot(head_slot_).targets_given, "gpt::losses: the last forward had no targets");
    return act<float>(plan_.losses, head_slot_, {batch_, seq_});
  }

  // ---- sampling -------------------------------------------------------------------------------
  // prompt (ids in [0, V)) followed by n tokens sampled from softmax(logits / temperature) over
  // the V real columns (temperature <= 0: argmax), seeded: the same arguments give the same
  // tokens. Forwards one sequence of min(max_seq, prompt + n) positions (replans for it). On a
  // device the forward runs there: each token's window goes in and its last logits row (Vp
  // values) comes back, from a token buffer in the arena; the sampling runs on the host.
  std::vector<std::int32_t> generate(exec<B> const& ex, std::span<std::int32_t const> prompt, int n,
                                     float temperature, std::uint64_t seed);

  // ---- the activation plan ----------------------------------------------------------------
  [[nodiscard]] activation_report activations() const noexcept { return report_; }
  // The planner holding every activation's name, bytes and op range (one slot's), and the offsets
  // of the current plan by tensor id, from a slot's start (slot s at s * activations().slot_bytes).
  [[nodiscard]] memory::lifetime_planner const& activation_planner() const noexcept { return plan_.planner(); }
  [[nodiscard]] std::span<std::size_t const> activation_offsets() const noexcept { return plan_.offsets(); }

 private:
  // What a slot's last forward left for its backward.
  struct slot_state {
    token_view tokens, targets;  // read again by the embedding's and the head's backward
    bool targets_given = false;  // its last forward through the head had targets
  };

  void check_whole_model(char const* op) const {
    TIDE_REQUIRE(options_.offload_activations.empty(), op, ": this model offloads activations "
                 "(gpt_options::offload_activations), which runs through the whole-model forward() and backward() "
                 "only; for pipeline stages use gpt_options::recompute");
  }
  void check_split(char const* op, int first, int last, int micro) const {
    stages_.check_range(op, first, last, micro);
    TIDE_REQUIRE(options_.split_backward, op, ": this model's backward is one pass; construct it with "
                 "gpt_options::split_backward = true, or call backward_blocks");
  }
  void check_slot(char const* op, int micro) const {
    stages_.check_micro(op, micro);
    TIDE_REQUIRE(batch_ != 0, op, ": no activations yet; run a forward first (it plans them for its (B, T))");
  }

  // ---- activations ----------------------------------------------------------------------------
  // Plans and allocates in_flight slots for (Bn, Tn) unless they are already. The old buffer
  // is returned first, so the arena never holds both; if the new one does not fit, the model
  // holds no activations (parameters and gradients are untouched) and the error propagates.
  void prepare(exec<B> const& ex, index_t Bn, index_t Tn);
  // Whether the current plan's scratch holds what these kernels ask (a pool of another size may
  // ask more: the plan is then made again, as for a new (B, T)).
  [[nodiscard]] bool scratch_fits(gpt_scratch const& s) const noexcept {
    gpt_scratch const& p = plan_.scratch();
    return s.block_forward <= p.block_forward && s.block_backward <= p.block_backward && s.head <= p.head &&
           s.encoder_backward <= p.encoder_backward;
  }

  template <class U>
  [[nodiscard]] view<U> act(memory::tensor_id id, int micro, shape s) const {
    return plan_.template view_at<U, B>(slot_base(micro), id, s);
  }
  [[nodiscard]] std::byte* slot_base(int micro) const noexcept {
    return activations_.data() + static_cast<std::size_t>(micro) * report_.slot_bytes;
  }
  [[nodiscard]] slot_state const& slot(int micro) const noexcept { return slots_[static_cast<std::size_t>(micro)]; }
  [[nodiscard]] slot_state& slot(int micro) noexcept { return slots_[static_cast<std::size_t>(micro)]; }

  // back: as the backward reads them (a recomputed or offloaded block's are other tensors).
  [[nodiscard]] detail::block_views<B, T> block_acts(int l, int micro, bool back) const {
    return plan_.template block_at<B, T>(slot_base(micro), l, batch_, seq_, back);
  }
  [[nodiscard]] detail::head_views<B, T> head_acts(int micro) const {
    return plan_.template head_at<B, T>(slot_base(micro), batch_, seq_);
  }
  // x_l (B, T, C), the input of block l = 0 .. L (L: the head's), as the forward or the
  // backward reads it.
  [[nodiscard]] view<T const> residual_in(int l, int micro, bool back) const {
    return act<T>(back ? plan_.residual_in_back(l) : plan_.residual_in(l), micro,
                  {batch_, seq_, index_t{config_.channels}});
  }

  // ---- parameters -----------------------------------------------------------------------------

  // Parameter p in `buffer` (the parameters or the gradients), or where the hooks keep it.
  [[nodiscard]] view<T> tensor_at(detail::arena_block<B> const& buffer, parameter const& p, bool gradient) const {
    TIDE_REQUIRE(p.type == dtype_of<T> && p.end() <= params_list_.bytes(), "gpt: parameter \"", p.name(), "\" (",
                 to_string(p.type), ", bytes ", p.offset, "..", p.end(), ") is not a record of this model (",
                 to_string(dtype_of<T>), ", ", params_list_.bytes(), " bytes); take records from parameters()");
    if constexpr (external_storage) {
      auto const i = static_cast<std::uint32_t>(index_of(p));
      Hooks& h = const_cast<Hooks&>(hooks_);  // the storage is the hooks'; asking for an address changes nothing
      return view<T>(gradient ? h.grad_data(i) : h.param_data(i), p.shape);
    } else {
      (void)gradient;
      return view<T>(reinterpret_cast<T*>(buffer.data() + p.offset), p.shape);
    }
  }
  [[nodiscard]] std::size_t index_of(parameter const& p) const {
    auto const all = params_list_.all();
    TIDE_REQUIRE(&p >= all.data() && &p < all.data() + all.size(), "gpt: parameter \"", p.name(),
                 "\" is a copy, not a record of parameters(); take records from parameters()");
    return static_cast<std::size_t>(&p - all.data());
  }
  [[nodiscard]] view<T> flat(detail::arena_block<B> const& buffer) const {
    return view<T>(reinterpret_cast<T*>(buffer.data()), {static_cast<index_t>(params_list_.bytes() / sizeof(T))});
  }
  [[nodiscard]] detail::arena_block<B> const& require_grads(char const* what) const {
    TIDE_REQUIRE(external_storage || static_cast<bool>(grads_), "gpt::", what,
                 ": the gradients are not allocated yet; call zero_grad(ex) or backward(ex) first");
    return grads_;
  }
  [[nodiscard]] parameter const& wpe() const noexcept { return params_list_[static_cast<std::size_t>(config_.wte_pieces)]; }
  // wte (its pieces: parameters 0 .. wte_pieces - 1) and its gradient as row tables.
  template <class U, class ViewOf>
  [[nodiscard]] kernels::row_table<U> wte_table(ViewOf view_of) const {
    kernels::row_table<U> t{.piece_rows = wte_piece_rows(config_), .rows = index_t{config_.padded_vocab},
                            .cols = index_t{config_.channels}, .pieces = config_.wte_pieces};
    for (int j = 0; j < config_.wte_pieces; ++j) t.piece[j] = view_of(params_list_[static_cast<std::size_t>(j)]).data();
    return t;
  }
  [[nodiscard]] kernels::row_table<T const> wte() const {
    return wte_table<T const>([this](parameter const& p) { return cparam(p); });
  }
  [[nodiscard]] kernels::row_table<T> dwte() const {
    return wte_table<T>([this](parameter const& p) { return dparam(p); });
  }
  // A contiguous (Vp, C) buffer (the tied gradient) as a table cut like wte.
  [[nodiscard]] kernels::row_table<T> cut_like_wte(view<T> whole) const {
    kernels::row_table<T> t = kernels::row_table_of(whole);
    t.piece_rows = wte_piece_rows(config_);
    t.pieces = config_.wte_pieces;
    for (int j = 0; j < t.pieces; ++j) t.piece[j] = whole.data() + j * t.piece_rows * t.cols;
    return t;
  }
  [[nodiscard]] parameter const& lnf_w() const noexcept { return params_list_[params_list_.size() - 2]; }
  [[nodiscard]] parameter const& lnf_b() const noexcept { return params_list_[params_list_.size() - 1]; }
  [[nodiscard]] view<T const> cparam(parameter const& p) const { return param(p); }
  [[nodiscard]] view<T> dparam(parameter const& p) const { return tensor_at(grads_, p, true); }
  // Block l's parameters (or gradients): asked for inside its hooks, where they are resident.
  [[nodiscard]] auto weights(int l) const {
    return detail::block_params_of(config_, params_list_, l, [this](parameter const& p) { return cparam(p); });
  }
  [[nodiscard]] auto weight_grads(int l) const {
    return detail::block_params_of(config_, params_list_, l, [this](parameter const& p) { return dparam(p); });
  }

  void initialise(thread_pool* pool, std::uint64_t seed);

  // ---- forward and backward, block by block ---------------------------------------------------

  float run_forward(exec<B> const& ex, int first, int last, int micro, token_view tokens, token_view const* targets);

  void forward_block(exec<B> const& ex, int b, int micro, bool with_targets);

  // whole: both passes per block (a split model runs B then W, block by block).
  enum class pass : std::uint8_t { whole, input, weights };
  void run_backward(char const* op, exec<B> const& ex, int first, int last, int micro, float loss_scale, pass p);

  void backward_block(exec<B> const& ex, int b, int micro, pass p);

  // ---- activation offload ---------------------------------------------------------------------

  // The host copies of the offloaded activations and the events of their copies; made by the
  // first plan with gpt_options::offload_activations. The copies go through carrier(): the
  // hooks when they carry activations (an offload scheduler), else `own`.
  using activation_mover = detail::activation_mover<
      B, std::conditional_t<carried_by_hooks, detail::no_carrier, detail::own_activation_carrier<B>>>;

  [[nodiscard]] auto& carrier() noexcept {
    if constexpr (carried_by_hooks) return hooks_;
    else return mover_->own;
  }
  void reserve_activation_host(std::size_t bytes);
  // Waits for every copy, then returns the host copies (no copy may touch them after).
  void release_activation_host() noexcept;
  void drain_activations() noexcept {
    carrier().drain_activations();  // a failed copy is the pass's error, already thrown or about to be
    std::fill(mover_->sending.begin(), mover_->sending.end(), std::uint8_t{0});
    std::fill(mover_->fetching.begin(), mover_->fetching.end(), std::uint8_t{0});
  }

  // Drains the copies of a pass that throws: none may run on into memory the next plan reuses.
  struct offloading {
    gpt* model;
    ~offloading() {
      if (model->mover_ && std::uncaught_exceptions() > 0) model->drain_activations();
    }
  };

  // Block b's saved activations to the host, after the compute work that wrote them (on tide::host
  // the caller's, already done; on a device, kernels still queued), then an event after the last.
  void send(exec<B> const& ex, int b, int micro);
  // Block b's saved activations back, once per backward, after the compute work issued so far
  // (which may still read the memory they land in).
  void fetch(exec<B> const& ex, int b, int micro);

  gpt_config config_;
  gpt_options options_;
  parameter_list params_list_;
  arena_type* arena_;
  [[no_unique_address]] Hooks hooks_;

  detail::arena_block<B> params_;
  detail::arena_block<B> grads_;
  detail::arena_block<B> activations_;  // in_flight slots of report_.slot_bytes

  detail::gpt_activation_plan plan_;
  activation_report report_;
  std::vector<slot_state> slots_;        // by micro-batch slot
  detail::stage_slots stages_;          // which blocks of which slot can go back
  std::unique_ptr<activation_mover> mover_;  // with offload_activations, from the first plan

  index_t batch_ = 0, seq_ = 0;  // of the current plan; 0 before the first forward
  int head_slot_ = -1;           // the slot of the last forward through the head
  float loss_ = std::numeric_limits<float>::quiet_NaN();
};

}  // namespace tide::nn

// The passes, defined out of line.
#include "tide/nn/detail/gpt_passes.hpp"
