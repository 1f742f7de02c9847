#pragma once
// One rank's shard of a whole GPT over a tensor-parallel group: the vocabulary-parallel
// embedding, the layers' tensor-parallel blocks and the vocabulary-parallel head with its
// cross-entropy (tp/head.hpp, tp/block.hpp). Its parameters are nn::gpt's, cut (same names,
// initialised from the same seed as nn::gpt's whole tensors, then take_shard), so a group of t
// equals nn::gpt within the sum-order bound of tests/mpi/tensor_parallel.cpp.
//
//   tide::tp::gpt<tide::comm::mpi> model(config, group, {.sequence = true, .seed = 1});
//   float loss = model.forward(ex, tokens, targets);     // every rank: the mean loss
//   model.backward(ex);                                  // gradients += (the rank's shards)
//
// As nn::gpt, it calls the hooks around each block (embedding -1, blocks 0 .. L-1, head L), and
// with hooks that keep the model data (an offload scheduler: make_trainer with tp::gpt_spec,
// tp/spec.hpp) it asks them for the parameters' and gradients' addresses between a block's pre_*
// and post_* calls; otherwise it keeps them in vectors of its own. Activations and the kernels'
// scratch are one block per (B, T), from the arena when it is given one. Under sequence
// parallelism each backward sums its LayerNorm gradients (each rank's rows' share) over the
// group before the block's post_backward, so a gradient the hooks receive is whole. Host only.
//
// A pipeline stage (pipeline/ranks.hpp; make_trainer with tp::gpt_spec and pipeline::on_ranks):
// forward_blocks / backward_blocks run a range of blocks for one of options.in_flight micro-batch
// slots, as nn::gpt's do; boundary(block, micro) and boundary_grad(micro) are the rank's rows of
// the residual stream and its gradient ((B T, C), or (B T / t, C) under sequence parallelism), and
// tied_grad(micro) the head's share of the rank's wte rows, which the executor carries to the
// embedding's stage. Each tensor rank's pipeline sends to the same tensor rank of the next stage.
// With gpt_options::recompute a block keeps only its output, and backward runs its forward again.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <new>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/comm/communicator.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parameters.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/nn/gpt_activations.hpp"
#include "tide/nn/detail/stage_slots.hpp"
#include "tide/nn/gpt_blocks.hpp"
#include "tide/nn/gpt_config.hpp"
#include "tide/tp/block.hpp"
#include "tide/tp/head.hpp"
#include "tide/tp/shard.hpp"

namespace tide::tp {

struct gpt_options {
  bool sequence = false;   // sequence parallelism
  std::uint64_t seed = 1;  // nn::gpt's initialisation of the whole tensors
  int in_flight = 1;       // micro-batch slots of activations (a pipeline stage: the schedule's slots)
  // The head's share of wte's gradient into tied_grad(micro), which the embedding's backward adds
  // (a pipeline whose ends are two stages); always when in_flight > 1. false: straight into wte's.
  bool separate_tied_grad = false;
  // Each block keeps only its output: backward runs its forward again (its collectives too) in
  // one set of views shared by every block and slot. The same gradients, bit for bit.
  bool recompute = false;
};

// How parameter i of nn::gpt_parameters(c) (wte whole: wte_pieces = 1) splits: wte by rows of
// the vocabulary, wpe and the final LayerNorm replicated, a block's as tp/shard.hpp says.
inline split split_of(nn::gpt_config const& c, parameter const& p, std::size_t i) noexcept {
  if (i == 0) return split::rows;
  if (i == 1 || p.layer == nn::head_block(c)) return split::replicated;
  return split_of(static_cast<nn::block_param>((i - 2) % nn::params_per_block));
}
// Its shard's shape on a group of t.
inline shape shard_shape_of(nn::gpt_config const& c, parameter const& p, std::size_t i, int t) {
  auto const s = shape_of(split_of(c, p, i), p.shape[0], p.shape.rank == 2 ? p.shape[1] : 1, t);
  return p.shape.rank == 2 ? shape{s.rows, s.cols} : shape{s.rows};
}

// The rank's parameter list: nn::gpt's names, order and tie (wte), its shards' shapes.
inline parameter_list shard_parameters(nn::gpt_config const& config, int t) {
  nn::gpt_config const c = nn::resolve(config);
  TIDE_REQUIRE(c.wte_pieces == 1, "tp::gpt: wte in ", c.wte_pieces, " pieces; tensor parallelism splits wte by "
               "vocabulary itself: pass wte_pieces = 1");
  check_group(c, t);
  (void)vocab_part_of(c, 0, t);  // Vp must split
  parameter_list const whole = nn::gpt_parameters(c, dtype::f32);
  parameter_list list(whole.alignment());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    parameter const& p = list.add(whole[i].name(), whole[i].layer, shard_shape_of(c, whole[i], i, t), dtype::f32);
    if (whole[i].tie >= 0) list.tie(p.name());
  }
  return list;
}

template <comm::Communicator G, class Hooks = nn::no_hooks>
class gpt {
  static_assert(nn::GptHooks<Hooks>, "tp::gpt<G, Hooks>: Hooks must have pre_forward(int), post_forward(int), "
                                     "pre_backward(int) and post_backward(int) (tide::nn::no_hooks has them all)");

 public:
  using backend = host;
  using element_type = float;
  using hooks_type = Hooks;
  using token_view = tensor_view<std::int32_t const>;
  // true when Hooks keep the parameters and gradients (an offload scheduler).
  static constexpr bool external_storage = nn::ParameterStorage<Hooks, float>;

  // Group: the tensor-parallel group, this rank's shard. Activations come from `arena` when given.
  gpt(nn::gpt_config const& config, G& group, gpt_options const& o, memory::device_arena<host>* arena = nullptr,
      Hooks hooks = {})
      : config_(nn::resolve(config)),
        group_(&group),
        o_(o),
        list_(shard_parameters(config_, group.size())),
        part_(vocab_part_of(config_, group.rank(), group.size())),
        arena_(arena),
        hooks_(std::move(hooks)),
        stages_(config_.layers, slots_of(o)) {
    if constexpr (!external_storage) {
      values_.assign(list_.bytes() / sizeof(float), 0.f);
      grads_.assign(values_.size(), 0.f);
    }
    init(o.seed);
  }
  ~gpt() { release(); }
  gpt(gpt const&) = delete;  // the views point into its own memory
  gpt& operator=(gpt const&) = delete;

  [[nodiscard]] parameter_list const& parameters() const noexcept { return list_; }
  [[nodiscard]] nn::gpt_config const& config() const noexcept { return config_; }
  [[nodiscard]] gpt_options const& options() const noexcept { return o_; }
  // The block numbers forward_blocks / backward_blocks take: the embedding (-1) .. the head (L).
  [[nodiscard]] static constexpr int first_block() noexcept { return nn::embedding_block; }
  [[nodiscard]] int last_block() const noexcept { return nn::head_block(config_); }
  [[nodiscard]] Hooks& hooks() noexcept { return hooks_; }
  // The rank's shard of a parameter and its gradient (own storage; with hooks that keep them,
  // ask the hooks).
  [[nodiscard]] std::span<float> values(std::string_view name) {
    static_assert(!external_storage, "tp::gpt::values: the hooks keep the parameters; ask them");
    return at(values_, list_.find(name));
  }
  [[nodiscard]] std::span<float> grads(std::string_view name) {
    static_assert(!external_storage, "tp::gpt::grads: the hooks keep the gradients; ask them");
    return at(grads_, list_.find(name));
  }
  void zero_grad() {
    if constexpr (external_storage) hooks_.zero_grad();
    else std::fill(grads_.begin(), grads_.end(), 0.f);
  }

  // One micro-batch for a trainer: tokens and targets, (B, T) each, the same on every rank of the group.
  struct batch_type {
    token_view tokens, targets;
  };
  [[nodiscard]] static std::size_t tokens_in(batch_type const& b) noexcept {
    return static_cast<std::size_t>(b.tokens.size());
  }

  // The mean cross-entropy over the B T positions (every rank), leaving what backward reads. The
  // caller's tokens and targets must stay unchanged until backward (they are read there again,
  // not copied).
  float forward(exec<host> const& ex, token_view tokens, token_view targets) {
    return run_forward("tp::gpt::forward", ex, first_block(), last_block(), 0, tokens, targets);
  }
  float forward(exec<host> const& ex, batch_type const& b) { return forward(ex, b.tokens, b.targets); }

  // Gradients += d(mean loss)/d(the rank's shards) × loss_scale; accumulates until zero_grad.
  void backward(exec<host> const& ex, float loss_scale = 1.f) {
    run_backward("tp::gpt::backward", ex, first_block(), last_block(), 0, loss_scale);
  }

  // Blocks first .. last forward for slot `micro`: first's input is boundary(first - 1, micro),
  // which a pipeline fills before; the loss when the range holds the head (else NaN).
  float forward_blocks(exec<host> const& ex, int first, int last, int micro, batch_type const& b) {
    stages_.check_range("tp::gpt::forward_blocks", first, last, micro);
    return run_forward("tp::gpt::forward_blocks", ex, first, last, micro, b.tokens, b.targets);
  }
  // Blocks last .. first backward for slot `micro`, after its forward of them; without the head
  // the gradient arriving at last's output is in boundary_grad(micro).
  void backward_blocks(exec<host> const& ex, int first, int last, int micro, float loss_scale = 1.f) {
    stages_.check_range("tp::gpt::backward_blocks", first, last, micro);
    run_backward("tp::gpt::backward_blocks", ex, first, last, micro, loss_scale);
  }
  // The activations of every slot at (B, T) and the scratch of ex's kernels, as a forward of a new
  // (B, T) takes them: a pipeline stage's, before its first boundary arrives.
  void plan_activations(exec<host> const& ex, index_t Bn, index_t Tn) {
    check_shape("tp::gpt::plan_activations", Bn, Tn);
    prepare(ex, Bn, Tn);
  }
  // (rows, C): the rank's rows of the residual stream leaving `block` (-1 .. L-1) for slot `micro`.
  [[nodiscard]] tensor_view<float> boundary(int block, int micro) const {
    TIDE_REQUIRE(block >= first_block() && block < config_.layers, "tp::gpt::boundary(", block, "): pass a block in [",
                 first_block(), ", ", config_.layers - 1, "]");
    slot_views const& s = planned_slot("tp::gpt::boundary", micro);
    return block == first_block() ? s.x0 : s.blocks[static_cast<std::size_t>(block)].res3;
  }
  // (rows, C): the residual stream's gradient of slot `micro`, arriving at a stage's last block
  // before backward_blocks and leaving its first block after.
  [[nodiscard]] tensor_view<float> boundary_grad(int micro) const {
    return planned_slot("tp::gpt::boundary_grad", micro).dres;
  }
  // (Vp/t, C): the head's share of the rank's wte rows' gradient for slot `micro`.
  [[nodiscard]] tensor_view<float> tied_grad(int micro) const {
    TIDE_REQUIRE(tied_buffer(), "tp::gpt::tied_grad: this model has no tied gradient buffer (in_flight = 1 and "
                 "separate_tied_grad = false); construct it with gpt_options::separate_tied_grad = true "
                 "(make_trainer: tp::gpt_spec::separate_tied_grad = true)");
    return planned_slot("tp::gpt::tied_grad", micro).tied;
  }

  // Bytes of the activation block of the last (B, T) (0 before the first forward).
  [[nodiscard]] std::size_t activation_bytes() const noexcept { return block_bytes_; }

 private:
  std::span<float> at(std::vector<float>& v, parameter const& p) {
    return {v.data() + p.offset / sizeof(float), static_cast<std::size_t>(p.numel())};
  }
  // Parameter i's shard and gradient: between the pre_* and post_* hooks of a block that reads it.
  float* param_data(std::size_t i) {
    if constexpr (external_storage) return hooks_.param_data(static_cast<std::uint32_t>(i));
    else return values_.data() + list_[i].offset / sizeof(float);
  }
  tensor_view<float const> param(std::size_t i) { return tensor_view<float const>(param_data(i), list_[i].shape); }
  tensor_view<float> grad(std::size_t i) {
    if constexpr (external_storage) return tensor_view<float>(hooks_.grad_data(static_cast<std::uint32_t>(i)), list_[i].shape);
    else return tensor_view<float>(grads_.data() + list_[i].offset / sizeof(float), list_[i].shape);
  }
  tensor_view<float const> lnf(int j) { return param(list_.size() - 2 + static_cast<std::size_t>(j)); }
  [[nodiscard]] index_t heads() const noexcept { return config_.heads / group_->size(); }
  [[nodiscard]] std::size_t index_of(int l, int k) const noexcept {
    return 2 + static_cast<std::size_t>(l) * nn::params_per_block + static_cast<std::size_t>(k);
  }
  nn::detail::block_params<tensor_view<float const>> weights(int l) {
    nn::detail::block_params<tensor_view<float const>> p;
    for (int k = 0; k < nn::params_per_block; ++k) p.at[k] = param(index_of(l, k));
    return p;
  }
  nn::detail::block_params<tensor_view<float>> gradients(int l) {
    nn::detail::block_params<tensor_view<float>> p;
    for (int k = 0; k < nn::params_per_block; ++k) p.at[k] = grad(index_of(l, k));
    return p;
  }
  // One micro-batch slot's activations (the kernels' scratch is shared: one call at a time).
  struct slot_views {
    std::vector<block_views<host, float>> blocks;
    head_views<float> head{};
    embedding_views<float> embedding{};
    tensor_view<float> x0, dres, tied;  // (rows, C), (rows, C), (Vp/t, C) with a tied buffer
    token_view tokens, targets;         // the forward's, read again by the backward
  };
  static int slots_of(gpt_options const& o) {
    TIDE_REQUIRE(o.in_flight >= 1, "tp::gpt: in_flight = ", o.in_flight, "; pass at least one micro-batch slot");
    return o.in_flight;
  }
  [[nodiscard]] bool tied_buffer() const noexcept { return o_.separate_tied_grad || o_.in_flight > 1; }
  slot_views const& planned_slot(char const* op, int micro) const {
    stages_.check_micro(op, micro);
    TIDE_REQUIRE(!slots_.empty(), op, ": no activations yet; call plan_activations(ex, B, T) or run a forward first");
    return slots_[static_cast<std::size_t>(micro)];
  }
  // Block l's views in slot s: its own, or under recompute the shared ones writing its output.
  block_views<host, float> views(slot_views const& s, int l) const {
    block_views<host, float> v = o_.recompute ? work_ : s.blocks[static_cast<std::size_t>(l)];
    v.res3 = s.blocks[static_cast<std::size_t>(l)].res3;
    return v;
  }
  // Block l's input (the rank's rows): the embedding's output, or block l - 1's.
  static tensor_view<float const> input(slot_views const& s, int l) {
    return tensor_view<float const>(l == 0 ? s.x0 : s.blocks[static_cast<std::size_t>(l - 1)].res3);
  }
  void check_shape(char const* op, index_t Bn, index_t Tn) const {
    TIDE_REQUIRE(Bn >= 1 && Tn >= 1 && Tn <= config_.max_seq, op, ": (B, T) = (", Bn, ", ", Tn, "); pass B >= 1 and "
                 "1 <= T <= max_seq = ", config_.max_seq);
    TIDE_REQUIRE(!o_.sequence || (Bn * Tn) % group_->size() == 0, op, ": B T = ", Bn * Tn, " rows do not split over ",
                 group_->size(), " ranks for sequence parallelism");
  }

  float run_forward(char const* op, exec<host> const& ex, int first, int last, int micro, token_view tokens,
                    token_view targets) {
    TIDE_REQUIRE(tokens.rank() == 2 && targets.size() == tokens.size(), op, ": tokens must be (B, T) and targets as many");
    index_t const Bn = tokens.extent(0), Tn = tokens.extent(1);
    check_shape(op, Bn, Tn);
    prepare(ex, Bn, Tn);
    slot_views& s = slots_[static_cast<std::size_t>(micro)];
    stages_.set(first, last, micro, nn::detail::stage_slots::idle);  // overwritten from here
    if (first == first_block()) s.tokens = tokens;
    if (last == last_block()) s.targets = token_view(targets.data(), {Bn * Tn});
    for (int b = first; b <= last; ++b) {
      hooks_.pre_forward(b);
      if (b == first_block()) {
        embedding_forward(ex, *group_, o_.sequence, s.x0, s.tokens, param(0), param(1), part_, s.embedding,
                          config_.vocab);
      } else if (b < config_.layers) {
        block_forward(ex, *group_, o_.sequence, input(s, b), views(s, b), weights(b), heads());
      } else {
        head_forward(ex, *group_, o_.sequence, input(s, b), s.head, lnf(0), lnf(1), param(0), s.targets, part_,
                     config_.vocab);
      }
      hooks_.post_forward(b);
      stages_.set(b, b, micro, nn::detail::stage_slots::forwarded);
    }
    if (last != last_block()) return std::numeric_limits<float>::quiet_NaN();
    double sum = 0;
    for (index_t r = 0; r < s.head.losses.size(); ++r) sum += s.head.losses.data()[r];
    return static_cast<float>(sum / static_cast<double>(s.head.losses.size()));
  }

  void run_backward(char const* op, exec<host> const& ex, int first, int last, int micro, float loss_scale) {
    stages_.check_backward(op, first, last, micro);
    TIDE_REQUIRE(scratch_bytes(ex, Bn_, Tn_) <= ws_bytes_, op, ": this executor's threads need more scratch than the "
                 "forward's executor set aside; run forward and backward on the same executor");
    stages_.set(first, last, micro, nn::detail::stage_slots::idle);  // one backward per forward
    slot_views& s = slots_[static_cast<std::size_t>(micro)];
    auto const dloss = loss_scale / static_cast<float>(Bn_ * Tn_);
    std::size_t const n = list_.size();
    using enum nn::block_param;
    for (int b = last; b >= first; --b) {
      hooks_.pre_backward(b);
      if (b == last_block()) {
        nn::detail::block_params<tensor_view<float>> lnf_grads{};  // lnf's two, in ln1's places
        lnf_grads.at[static_cast<int>(ln1_w)] = grad(n - 2);
        lnf_grads.at[static_cast<int>(ln1_b)] = grad(n - 1);
        tensor_view<float> const dwte = tied_buffer() ? s.tied : grad(0);
        if (tied_buffer()) nn::detail::zero_fill(ex, s.tied);
        summed_over_rows(lnf_grads, {ln1_w, ln1_b}, [&] {
          head_backward(ex, *group_, o_.sequence, s.dres, input(s, b), s.head, lnf(0), param(0), dwte, grad(n - 2),
                        grad(n - 1), s.targets, part_, dloss);
        });
      } else if (b >= 0) {
        auto const dw = gradients(b);
        // Under recompute the forward runs again into the shared views, its output included: the
        // slot's output (the next block's input, a stage's boundary) stays as the forward left it.
        auto const v = o_.recompute ? work_ : s.blocks[static_cast<std::size_t>(b)];
        if (o_.recompute) block_forward(ex, *group_, o_.sequence, input(s, b), v, weights(b), heads());
        summed_over_rows(dw, {ln1_w, ln1_b, ln2_w, ln2_b}, [&] {
          block_backward(ex, *group_, o_.sequence, s.dres, input(s, b), v, weights(b), dw, heads());
        });
      } else {
        tensor_view<float> const dwte = grad(0);
        if (tied_buffer()) nn::detail::add_in_place(ex, dwte, tensor_view<float const>(s.tied));  // the head's share first
        embedding_backward(ex, *group_, o_.sequence, dwte, grad(1), tensor_view<float const>(s.dres), s.tokens, part_,
                           s.embedding);
      }
      hooks_.post_backward(b);
    }
  }
  // Runs `backward`, which adds its rows' share of the LayerNorm gradients dw[which] under
  // sequence parallelism; then sums that share over the group (the accumulated gradient is set
  // aside first, so what is summed is this backward's alone and earlier micro-batches' count once).
  template <class F>
  void summed_over_rows(nn::detail::block_params<tensor_view<float>> const& dw,
                        std::initializer_list<nn::block_param> which, F&& backward) {
    if (!o_.sequence || group_->size() == 1) {
      backward();
      return;
    }
    stash_.clear();
    for (auto p : which) {
      float* const g = dw[p].data();
      stash_.insert(stash_.end(), g, g + dw[p].size());
      std::fill(g, g + dw[p].size(), 0.f);
    }
    backward();
    std::size_t k = 0;
    for (auto p : which) {
      tp::reduce_replicated(*group_, true, dw[p]);
      float* const g = dw[p].data();
      for (index_t e = 0; e < dw[p].size(); ++e) g[e] += stash_[k++];
    }
  }

  // Every parameter as nn::gpt initialises its whole tensor, then this rank's shard of it (with
  // hooks that keep them, before the first step: they hand out host memory then).
  void init(std::uint64_t seed) {
    parameter_list const whole = nn::gpt_parameters(config_, dtype::f32);
    int const t = group_->size(), r = group_->rank();
    std::vector<float> buf;
    for (std::size_t i = 0; i < whole.size(); ++i) {
      parameter const& p = whole[i];
      buf.assign(static_cast<std::size_t>(p.numel()), 0.f);
      nn::detail::initialise_parameter<float>(nullptr, config_, i, p, buf.data(), seed);
      index_t const rows = p.shape[0], cols = p.shape.rank == 2 ? p.shape[1] : 1;
      take_shard(split_of(config_, p, i), std::span<float const>(buf),
                 std::span<float>(param_data(i), static_cast<std::size_t>(list_[i].numel())), rows, cols, r, t);
    }
  }

  // The activations of one micro-batch at (Bn, Tn) and the kernels' scratch for ex's pool, as one
  // block (from the arena when there is one). A new block is taken before the old one goes, so a
  // refusal leaves the model as it was.
  std::size_t scratch_bytes(exec<host> const& ex, index_t Bn, index_t Tn) const {
    int const t = group_->size();
    return std::max({block_scratch_bytes<float>(ex, config_, t, Bn, Tn), head_scratch_bytes<float>(ex, config_, t, Bn, Tn),
                     embedding_scratch_bytes(ex, config_, t, Bn, Tn)});
  }
  void prepare(exec<host> const& ex, index_t Bn, index_t Tn) {
    std::size_t const ws = scratch_bytes(ex, Bn, Tn);
    if (block_ != nullptr && Bn == Bn_ && Tn == Tn_ && ws <= ws_bytes_) return;
    std::size_t const bytes = carve(nullptr, Bn, Tn, ws);
    std::byte* const base = static_cast<std::byte*>(
        arena_ != nullptr ? arena_->allocate(bytes, kernels::scratch_alignment)
                          : ::operator new(bytes, std::align_val_t{kernels::scratch_alignment}));
    release();
    block_ = base, block_bytes_ = bytes, ws_bytes_ = ws, Bn_ = Bn, Tn_ = Tn;
    carve(base, Bn, Tn, ws);
    stages_.clear();  // every slot's activations went with the old block
  }
  void release() noexcept {
    if (block_ == nullptr) return;
    if (arena_ != nullptr) arena_->deallocate(block_, block_bytes_, kernels::scratch_alignment);
    else ::operator delete(block_, std::align_val_t{kernels::scratch_alignment});
    block_ = nullptr, block_bytes_ = 0;
  }
  // Lays the views out from `base` and returns the bytes; base null: the bytes only, and the
  // model's views stay as they are (a refused allocation leaves the old block in use).
  std::size_t carve(std::byte* base, index_t Bn, index_t Tn, std::size_t ws) {
    std::size_t used = 0;
    auto take = [&](std::size_t bytes) {
      std::size_t const at = used;
      used += (bytes + kernels::scratch_alignment - 1) / kernels::scratch_alignment * kernels::scratch_alignment;
      return base == nullptr ? nullptr : base + at;
    };
    auto make = [&](shape s) {
      std::byte* const p = take(static_cast<std::size_t>(s.numel()) * sizeof(float));
      return p == nullptr ? tensor_view<float>{} : tensor_view<float>(reinterpret_cast<float*>(p), s);
    };
    kernels::scratch<host> const scratch{take(ws), ws};
    std::vector<slot_views> slots(static_cast<std::size_t>(o_.in_flight));
    for (slot_views& s : slots) {
      s.blocks.resize(static_cast<std::size_t>(config_.layers));
      carve_slot(s, take, make, scratch, Bn, Tn);
    }
    block_views<host, float> work{};
    if (o_.recompute) carve_block(work, make, scratch, Bn, Tn);
    if (base != nullptr) slots_ = std::move(slots), work_ = work;
    return used;
  }
  // One block's views (under recompute, the shared set; a slot's block keeps res3 alone).
  template <class Make>
  void carve_block(block_views<host, float>& a, Make& make, kernels::scratch<host> scratch, index_t Bn, index_t Tn) const {
    index_t const C = config_.channels, t = group_->size(), N = Bn * Tn, n = o_.sequence ? N / t : N;
    index_t const Cl = C / t, NHl = heads();
    a.ln1 = make({n, C}), a.attproj = make({n, C}), a.res2 = make({n, C}), a.ln2 = make({n, C});
    a.fcproj = make({n, C}), a.res3 = make({n, C});
    a.ln1_mean = make({n}), a.ln1_rstd = make({n}), a.ln2_mean = make({n}), a.ln2_rstd = make({n});
    a.qkv = make({Bn, Tn, 3 * Cl}), a.atty = make({Bn, Tn, Cl}), a.lse = make({Bn, NHl, Tn});
    a.fch = make({Bn, Tn, 4 * Cl}), a.fch_gelu = make({Bn, Tn, 4 * Cl});
    a.dfch = make({Bn, Tn, 4 * Cl}), a.datty = make({Bn, Tn, Cl}), a.dqkv = make({Bn, Tn, 3 * Cl});
    a.dln = make({Bn, Tn, C});
    if (o_.sequence) a.whole = make({Bn, Tn, C}), a.partial = make({Bn, Tn, C}), a.dln_rows = make({n, C});
    a.ws = scratch;
  }
  template <class Take, class Make>
  void carve_slot(slot_views& s, Take& take, Make& make, kernels::scratch<host> scratch, index_t Bn, index_t Tn) const {
    index_t const C = config_.channels, t = group_->size(), N = Bn * Tn, n = o_.sequence ? N / t : N;
    index_t const R = part_.rows;
    for (auto& a : s.blocks) {
      if (o_.recompute) a.res3 = make({n, C});  // the next block's input, and a stage's boundary
      else carve_block(a, make, scratch, Bn, Tn);
    }
    head_views<float>& h = s.head;
    h.lnf = make({n, C}), h.lnf_mean = make({n}), h.lnf_rstd = make({n});
    h.logits = make({N, R}), h.stats = make({3, N}), h.losses = make({N}), h.dlnf = make({N, C});
    if (o_.sequence) h.whole = make({N, C}), h.dlnf_rows = make({n, C});
    h.ws = scratch;
    std::byte* const mapped = take(static_cast<std::size_t>(N) * sizeof(std::int32_t));
    if (mapped != nullptr) s.embedding.mapped = tensor_view<std::int32_t>(reinterpret_cast<std::int32_t*>(mapped), {Bn, Tn});
    s.embedding.spare = make({1, C});
    if (o_.sequence) s.embedding.whole = make({N, C});
    s.embedding.ws = scratch;
    s.x0 = make({n, C}), s.dres = make({n, C});
    if (tied_buffer()) s.tied = make({R, C});
  }

  nn::gpt_config config_;
  G* group_;
  gpt_options o_;
  parameter_list list_;
  vocab_part part_;
  memory::device_arena<host>* arena_;
  Hooks hooks_;
  std::vector<float> values_, grads_;  // own storage (no hooks that keep them)
  std::byte* block_ = nullptr;         // activations and scratch of (Bn_, Tn_)
  std::size_t block_bytes_ = 0, ws_bytes_ = 0;
  index_t Bn_ = 0, Tn_ = 0;
  std::vector<slot_views> slots_;     // in_flight of them, in the block
  block_views<host, float> work_{};   // under recompute: one block's views, shared by all
  std::vector<float> stash_;          // the LayerNorm gradients set aside under sequence parallelism
  nn::detail::stage_slots stages_;    // which blocks of which slot ran forward and not yet backward
};

}  // namespace tide::tp
