#pragma once
// The configuration side of tide::nn::gpt: gpt_config and its checks, the parameter list and
// which block reads what (gpt_parameters, gpt_block_uses), the hook concepts, gpt_options and
// the activation report. Nothing here allocates model memory; "tide/nn/gpt.hpp" includes it.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parameters.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/embedding/row_table.hpp"
#include "tide/memory/device_arena.hpp"

namespace tide::nn {

// ---- configuration --------------------------------------------------------------------------

struct gpt_config {
  int layers = 12;        // L
  int heads = 12;         // NH
  int channels = 768;     // C, a multiple of NH
  int vocab = 50257;      // V
  int padded_vocab = 0;   // Vp >= V, the rows of wte; 0: V rounded up to a multiple of 128
  int max_seq = 1024;     // maxT, the rows of wpe
  // wte stored as this many row pieces, each its own parameter ("wte.0" .. ), so that the table
  // need not fit one offload chunk (docs/offload.md, "Tensors larger than a chunk"). The model is
  // the same; the head's sums over the vocabulary are cut at the pieces (not bit-identical to 1).
  int wte_pieces = 1;
  friend constexpr bool operator==(gpt_config const&, gpt_config const&) = default;
};

// Vp rounds V up to this by default: the LM head's GEMM then has a friendly N (llm.c).
inline constexpr int vocab_padding = 128;

// Vp of a config (padded_vocab, or V rounded up to vocab_padding when it is 0).
constexpr index_t padded_vocab_of(gpt_config const& c) noexcept {
  return c.padded_vocab != 0 ? c.padded_vocab : static_cast<index_t>(round_up(static_cast<std::size_t>(c.vocab), vocab_padding));
}

// Elements of all parameters, without allocating: Vp C + maxT C + L (12 C^2 + 13 C) + 2 C.
// GPT-2 124M ({12, 12, 768, 50257, 50304, 1024}) has 124,475,904.
constexpr std::int64_t parameter_count(gpt_config const& c) noexcept {
  std::int64_t const C = c.channels;
  return padded_vocab_of(c) * C + std::int64_t{c.max_seq} * C + std::int64_t{c.layers} * (12 * C * C + 13 * C) + 2 * C;
}

static_assert(parameter_count({12, 12, 768, 50257, 50304, 1024}) == 124'475'904);

// The most pieces wte may be cut into (the kernels take the piece addresses by value).
inline constexpr int max_wte_pieces = kernels::row_table<float>::max_pieces;

// Rows of every wte piece but the last (which holds the rest): ceil(Vp / wte_pieces).
constexpr index_t wte_piece_rows(gpt_config const& c) noexcept {
  index_t const k = c.wte_pieces < 1 ? 1 : c.wte_pieces;
  return (padded_vocab_of(c) + k - 1) / k;
}

// The config with padded_vocab filled in. Throws tide::error(usage) for an impossible one.
inline gpt_config resolve(gpt_config c) {
  TIDE_REQUIRE(c.layers >= 1 && c.heads >= 1 && c.channels >= 1 && c.vocab >= 1 && c.max_seq >= 1,
               "gpt_config: layers, heads, channels, vocab and max_seq must all be >= 1, got layers = ", c.layers,
               ", heads = ", c.heads, ", channels = ", c.channels, ", vocab = ", c.vocab, ", max_seq = ", c.max_seq);
  TIDE_REQUIRE(c.channels % c.heads == 0, "gpt_config: channels = ", c.channels, " is not a multiple of heads = ",
               c.heads, "; each head takes channels / heads channels");
  TIDE_REQUIRE(c.padded_vocab == 0 || c.padded_vocab >= c.vocab, "gpt_config: padded_vocab = ", c.padded_vocab,
               " is below vocab = ", c.vocab, "; pass 0 to round vocab up to a multiple of ", vocab_padding);
  c.padded_vocab = static_cast<int>(padded_vocab_of(c));
  TIDE_REQUIRE(c.wte_pieces >= 1 && c.wte_pieces <= max_wte_pieces, "gpt_config: wte_pieces = ", c.wte_pieces,
               "; pass 1 (wte whole) to ", max_wte_pieces, " row pieces");
  TIDE_REQUIRE((c.wte_pieces - 1) * wte_piece_rows(c) < c.padded_vocab, "gpt_config: wte_pieces = ", c.wte_pieces,
               " pieces of ", wte_piece_rows(c), " rows leave the last of the ", c.padded_vocab,
               " rows of wte empty; pass fewer pieces");
  return c;
}

// The fewest wte pieces whose largest fits `chunk_elements` (a chunk's capacity in elements),
// e.g. to train a model whose wte is larger than the chunks an offload budget allows. Throws
// tide::error(usage) when even max_wte_pieces pieces, or one row, do not fit.
inline int wte_pieces_within(gpt_config config, std::size_t chunk_elements) {
  config.wte_pieces = 1;
  gpt_config c = resolve(config);
  auto const C = static_cast<std::size_t>(c.channels);
  TIDE_REQUIRE(chunk_elements >= C, "wte_pieces_within: a chunk of ", chunk_elements,
               " elements holds no row of wte (", C, " elements); raise the chunk size");
  auto const rows = static_cast<index_t>(chunk_elements / C);
  // The fewest pieces of at most `rows` rows that leave no piece empty.
  for (int k = 1; k <= max_wte_pieces; ++k) {
    c.wte_pieces = k;
    if (wte_piece_rows(c) <= rows && (k - 1) * wte_piece_rows(c) < c.padded_vocab) return k;
  }
  TIDE_FAIL(usage, "wte_pieces_within: wte (", c.padded_vocab, " x ", C, ") needs more than ", max_wte_pieces,
            " pieces of at most ", rows, " rows to fit chunks of ", chunk_elements, " elements; raise the chunk size");
}
// Block numbers, for parameters (layer_of) and hooks: the embeddings are block -1, the
// transformer blocks 0 .. L-1, the final LayerNorm + LM head + loss block L.
inline constexpr int embedding_block = -1;
constexpr int head_block(gpt_config const& c) noexcept { return c.layers; }

// The parameters of a block, in registration order (offsets within a block follow it).
enum class block_param : int {
  ln1_w, ln1_b, qkv_w, qkv_b, attn_proj_w, attn_proj_b, ln2_w, ln2_b, fc_w, fc_b, mlp_proj_w, mlp_proj_b, count
};
inline constexpr int params_per_block = static_cast<int>(block_param::count);
inline constexpr std::string_view block_param_names[params_per_block] = {
    "ln1.w", "ln1.b", "attn.qkv.w", "attn.qkv.b", "attn.proj.w", "attn.proj.b",
    "ln2.w", "ln2.b", "mlp.fc.w",   "mlp.fc.b",   "mlp.proj.w",  "mlp.proj.b"};

// Parameter numbers: wte's pieces 0 .. k-1 (k = wte_pieces), wpe k, then block l's parameter p
// at block_param_index(c, l, p), lnf.w and lnf.b last.
constexpr std::size_t block_param_index(gpt_config const& c, int l, int p) noexcept {
  return static_cast<std::size_t>(c.wte_pieces + 1 + params_per_block * l + p);
}

// The parameter list of a config, in order: "wte" (Vp, C) (or, with wte_pieces = k > 1, "wte.0"
// .. "wte.{k-1}", rows [j R, min(Vp, (j + 1) R)) of it, R = wte_piece_rows), "wpe" (maxT, C) in block -1; per
// block l "h{l}.ln1.w" (C), "h{l}.ln1.b", "h{l}.attn.qkv.w" (3C, C), "h{l}.attn.qkv.b" (3C),
// "h{l}.attn.proj.w" (C, C), "h{l}.attn.proj.b", "h{l}.ln2.w", "h{l}.ln2.b", "h{l}.mlp.fc.w"
// (4C, C), "h{l}.mlp.fc.b" (4C), "h{l}.mlp.proj.w" (C, 4C), "h{l}.mlp.proj.b" (C); "lnf.w",
// "lnf.b" (C) in block L. The head reads wte too (tied), so block L uses wte's bytes as well.
inline parameter_list gpt_parameters(gpt_config const& config, dtype type,
                                     std::size_t alignment = parameter_list::default_alignment) {
  gpt_config const c = resolve(config);
  index_t const C = c.channels;
  parameter_list list(alignment);
  // wte is tied: the embedding and the LM head read it (parameter_list::tie).
  if (c.wte_pieces == 1) {
    list.tie(list.add("wte", embedding_block, {index_t{c.padded_vocab}, C}, type).name());
  } else {
    index_t const R = wte_piece_rows(c);
    for (int j = 0; j < c.wte_pieces; ++j)
      list.tie(list.add(tide::detail::concat("wte.", j), embedding_block,
                        {std::min<index_t>(R, c.padded_vocab - j * R), C}, type)
                   .name());
  }
  list.add("wpe", embedding_block, {index_t{c.max_seq}, C}, type);
  shape const shapes[params_per_block] = {{C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C},
                                          {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}};
  for (int l = 0; l < c.layers; ++l)
    for (int k = 0; k < params_per_block; ++k)
      list.add(tide::detail::concat('h', l, '.', block_param_names[k]), l, shapes[k], type);
  list.add("lnf.w", head_block(c), {C}, type);
  list.add("lnf.b", head_block(c), {C}, type);
  return list;
}

// ---- hooks ----------------------------------------------------------------------------------

// Called around every block of forward and backward with the block number (embedding_block,
// 0 .. L-1, head_block). An offload scheduler makes the block's parameters resident in pre_*,
// lets them go in post_*.
template <class H>
concept GptHooks = requires(H& h, int block) {
  h.pre_forward(block);
  h.post_forward(block);
  h.pre_backward(block);
  h.post_backward(block);
};

// Hooks that also serve a split backward (gpt_options::split_backward) when they keep the model
// data: pre_/post_backward_input around a block's input pass (B: its parameters read, no gradient
// written), pre_/post_backward around its weight pass (W: its gradients written). A model of its
// own storage calls pre_/post_backward around both passes instead.
template <class H>
concept SplitBackwardHooks = GptHooks<H> && requires(H& h, int block) {
  h.pre_backward_input(block);
  h.post_backward_input(block);
};

struct no_hooks {
  constexpr void pre_forward(int) const noexcept {}
  constexpr void post_forward(int) const noexcept {}
  constexpr void pre_backward(int) const noexcept {}
  constexpr void post_backward(int) const noexcept {}
};

// Hooks that also own the model data: parameter i of parameters() lives at param_data(i) and its
// gradient at grad_data(i), wherever the hooks keep them (an offload scheduler's chunks). The
// addresses are asked for after pre_forward / pre_backward of the block that uses them and are
// not kept past its post_* hook, so a chunk may move between blocks. The model then allocates
// no parameter or gradient buffer of its own; zero_grad() calls zero_grad() on the hooks.
template <class H, class T>
concept ParameterStorage = requires(H& h, std::uint32_t i) {
  { h.param_data(i) } -> std::same_as<T*>;
  { h.grad_data(i) } -> std::same_as<T*>;
  h.zero_grad();
};

// The blocks of a gpt and what each reads: block b's own parameters; the head block (L) also
// reads wte (the tied LM head), every piece of it.
inline block_uses gpt_block_uses(gpt_config const& config) {
  gpt_config const c = resolve(config);
  parameter_list const list = gpt_parameters(c, dtype::f32);
  block_uses u{embedding_block, std::vector<std::vector<std::uint32_t>>(static_cast<std::size_t>(c.layers + 2))};
  for (std::uint32_t i = 0; i < list.size(); ++i)
    u.params[static_cast<std::size_t>(list[i].layer - embedding_block)].push_back(i);
  for (int j = c.wte_pieces - 1; j >= 0; --j)  // wte's pieces, indices 0 .. k-1
    u.params.back().insert(u.params.back().begin(), static_cast<std::uint32_t>(j));
  return u;
}

// ---- options and reports --------------------------------------------------------------------

// A set of block numbers (embedding_block .. L-1), for what gpt_options keeps of them between
// forward and backward. A value, sorted and unique; empty: none.
//   block_set::all(L)            blocks 0 .. L-1
//   block_set{{0, 2, 5}}          the blocks named
class block_set {
 public:
  block_set() = default;
  explicit block_set(std::vector<int> blocks) : blocks_(std::move(blocks)) {
    std::ranges::sort(blocks_);
    blocks_.erase(std::unique(blocks_.begin(), blocks_.end()), blocks_.end());
  }
  // Blocks first .. last.
  [[nodiscard]] static block_set range(int first, int last) {
    std::vector<int> b;
    for (int l = first; l <= last; ++l) b.push_back(l);
    return block_set(std::move(b));
  }
  // Every transformer block, 0 .. layers - 1.
  [[nodiscard]] static block_set all(int layers) { return range(0, layers - 1); }

  [[nodiscard]] bool contains(int block) const noexcept { return std::ranges::binary_search(blocks_, block); }
  [[nodiscard]] bool empty() const noexcept { return blocks_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return blocks_.size(); }
  [[nodiscard]] std::span<int const> blocks() const noexcept { return blocks_; }
  friend bool operator==(block_set const&, block_set const&) = default;

 private:
  std::vector<int> blocks_;
};

struct gpt_options {
  std::uint64_t seed = 0;  // of the GPT-2 initialisation the constructor runs
  // false: a forward with targets turns the logits into dlogits in place (llm.c; one (B, T, Vp)
  // buffer less). true: dlogits get their own buffer and logits() stays readable.
  bool keep_logits = false;
  std::size_t alignment = 256;  // of every parameter offset and activation offset, bytes
  // Micro-batches whose activations are kept at once: forward_blocks / backward_blocks take a
  // slot `micro` in [0, in_flight). Each slot holds its own copy of the activation plan, so a
  // pipeline stage in 1F1B order over S stages needs S. 1: the memory of one step.
  int in_flight = 1;
  // Where the LM head's share of wte's gradient goes. false (with in_flight = 1): straight into
  // wte's gradient, no extra memory. true, and always when in_flight > 1: into tied_grad(micro),
  // a (Vp, C) activation per slot that the embedding block's backward adds into wte's gradient;
  // Vp C elements more per slot, and gradients bit-identical to any stage split (docs/nn.md).
  bool separate_tied_grad = false;
  // Activation checkpointing: blocks (0 .. L-1) whose forward keeps only its output; their
  // backward runs the block's forward again first (up to the MLP's GELU), into memory planned
  // for the backward. Bit-identical gradients (the same kernels on the same inputs), one more
  // forward of those blocks per step, and their activations off the plan between forward and
  // backward. recompute_within() picks the cheapest set under a memory budget.
  block_set recompute{};
  // Activation offload: blocks (embedding_block .. L-1) whose saved activations (those the
  // backward reads: every one of the block's, or its output alone when it is recomputed) go to
  // host memory by the model's copy stream after its forward, and come back one block ahead of
  // the backward that reads them. The plan keeps them on the device from their forward to the
  // end of the next block's forward, and from the prefetch to their last read. Bit-identical.
  // With in_flight = 1 and the whole-model forward() / backward() only.
  block_set offload_activations{};
  // The backward in two passes, for zero-bubble pipeline schedules: backward_input_blocks (B)
  // computes the gradients flowing to the blocks below, backward_weight_blocks (W) the blocks'
  // parameter gradients, as late as the schedule likes. Each block keeps what its W reads (its
  // output gradients and the activations its weight products take) until W: more activation
  // memory per slot (docs/nn.md). B then W equals backward_blocks bit for bit. Hooks that keep the
  // model data must be SplitBackwardHooks (offload::hooks are: W is the block's backward moment
  // there, B reads its parameters only); no offload_activations.
  bool split_backward = false;
};

// Whether a model with these options keeps the (Vp, C) tied gradient buffer per slot.
constexpr bool has_tied_buffer(gpt_options const& o) noexcept { return o.separate_tied_grad || o.in_flight > 1; }

// The options, checked. Throws tide::error(usage) for an impossible one.
inline gpt_options check_options(gpt_config const& c, gpt_options const& o) {
  TIDE_REQUIRE(o.in_flight >= 1, "gpt_options: in_flight = ", o.in_flight,
               "; pass the micro-batches kept at once, >= 1 (a pipeline of S stages in 1F1B needs S)");
  if (!o.recompute.empty())
    TIDE_REQUIRE(o.recompute.blocks().front() >= 0 && o.recompute.blocks().back() < c.layers,
                 "gpt_options::recompute names block ", o.recompute.blocks().front() < 0 ? o.recompute.blocks().front()
                                                                                         : o.recompute.blocks().back(),
                 "; only transformer blocks 0 .. L-1 = ", c.layers - 1,
                 " can be recomputed (the embedding and the head keep theirs)");
  if (!o.offload_activations.empty()) {
    TIDE_REQUIRE(o.offload_activations.blocks().front() >= embedding_block &&
                     o.offload_activations.blocks().back() < c.layers,
                 "gpt_options::offload_activations names a block outside embedding_block (-1) .. L-1 = ",
                 c.layers - 1, "; the head's activations are read right after its forward and stay");
    TIDE_REQUIRE(o.in_flight == 1, "gpt_options::offload_activations with in_flight = ", o.in_flight,
                 ": activation offload runs with one micro-batch in flight; use recompute for pipeline stages");
  }
  TIDE_REQUIRE(!o.split_backward || o.offload_activations.empty(),
               "gpt_options::split_backward with offload_activations: the weight pass reads activations after the "
               "backward that would fetch them back; use recompute with a split backward");
  return o;
}

// The activation buffer of the current (B, T): in_flight slots, each one copy of the plan.
struct activation_report {
  index_t batch = 0;           // B (0 before the first forward)
  index_t seq = 0;             // T
  std::size_t tensors = 0;     // activations and activation gradients planned, per slot
  std::size_t footprint = 0;   // bytes of the one buffer, all slots
  std::size_t peak_live = 0;   // the lower bound: most bytes live at one op, times in_flight
  std::size_t unplanned = 0;   // bytes if every tensor of every slot had its own memory
  int in_flight = 1;           // slots (gpt_options::in_flight)
  std::size_t slot_bytes = 0;  // from one slot's start to the next: its plan, rounded to the alignment
  std::size_t host_bytes = 0;  // host memory of the offloaded activations (gpt_options::offload_activations)
};

// ---- the model's recipe ---------------------------------------------------------------------

// The model, nn/gpt.hpp.
template <Backend B, Element T = float, class Hooks = no_hooks>
class gpt;

// What a trainer builds a gpt from: the model's type depends on the hooks (the offload
// scheduler), which the trainer creates, so it is handed a recipe rather than a model.
template <Backend B, Element T = float>
struct gpt_spec {
  using backend = B;
  using element_type = T;  // of parameters, gradients and activations (bf16 / f16: fp32 masters in the scheduler)
  gpt_config config{};
  gpt_options options{};
  // On CUDA, make_trainer's exec lets f32 GEMMs run in TF32 (exec<cuda>::tf32): about 1e-3
  // relative error per product, several times the fp32 rate. Ignored elsewhere and for bf16.
  bool tf32 = false;
  // On CUDA, bf16 attention fused on tensor cores, forward and backward
  // (exec<cuda>::flash_attention): no (T, T) scores in memory. Not yet checked on a GPU, so off
  // by default. Ignored elsewhere.
  bool flash_attention = false;
  template <class Hooks>
  using model_type = gpt<B, T, Hooks>;

  [[nodiscard]] parameter_list parameters() const { return gpt_parameters(config, dtype_of<T>, options.alignment); }
  [[nodiscard]] block_uses uses() const { return gpt_block_uses(config); }
  template <class Hooks>
  [[nodiscard]] model_type<Hooks> build(memory::device_arena<B>& arena, Hooks hooks) const {
    return model_type<Hooks>(config, arena, options, std::move(hooks));
  }
};

}  // namespace tide::nn
