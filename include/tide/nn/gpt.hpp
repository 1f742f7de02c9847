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
// Architecture: learned position embeddings; L pre-LN blocks
//   x = x + proj(attention(qkv(ln1(x))));  x = x + mlp.proj(gelu_tanh(mlp.fc(ln2(x))))
// a final LayerNorm, and an LM head tied to the token embedding wte (Vp, C). Loss: mean over
// the (B, T) positions of the cross-entropy over the V real vocabulary columns.
//
// Memory comes from the device_arena the caller passes: the parameters at construction, the
// gradients at the first zero_grad / backward, and the activations (one buffer, placed by a
// lifetime_planner) at the first forward of each new (B, T). The model returns them on
// destruction. docs/nn.md has the parameter layout, the hooks, the activation plan and the
// determinism of each kernel used.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <concepts>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/attention/attention.hpp"
#include "tide/kernels/classifier/classifier.hpp"
#include "tide/kernels/embedding/embedding.hpp"
#include "tide/kernels/gelu/gelu.hpp"
#include "tide/kernels/layernorm/layernorm.hpp"
#include "tide/kernels/matmul/matmul.hpp"
#include "tide/kernels/residual/residual.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/lifetime_planner.hpp"
#include "tide/nn/backend_ops.hpp"
#include "tide/nn/parameters.hpp"

namespace tide::nn {

// ---- configuration --------------------------------------------------------------------------

struct gpt_config {
  int layers = 12;        // L
  int heads = 12;         // NH
  int channels = 768;     // C, a multiple of NH
  int vocab = 50257;      // V
  int padded_vocab = 0;   // Vp >= V, the rows of wte; 0: V rounded up to a multiple of 128
  int max_seq = 1024;     // maxT, the rows of wpe
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
  return c;
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

// The parameter list of a config, in order: "wte" (Vp, C), "wpe" (maxT, C) in block -1; per
// block l "h{l}.ln1.w" (C), "h{l}.ln1.b", "h{l}.attn.qkv.w" (3C, C), "h{l}.attn.qkv.b" (3C),
// "h{l}.attn.proj.w" (C, C), "h{l}.attn.proj.b", "h{l}.ln2.w", "h{l}.ln2.b", "h{l}.mlp.fc.w"
// (4C, C), "h{l}.mlp.fc.b" (4C), "h{l}.mlp.proj.w" (C, 4C), "h{l}.mlp.proj.b" (C); "lnf.w",
// "lnf.b" (C) in block L. The head reads wte too (tied), so block L uses wte's bytes as well.
inline parameter_list gpt_parameters(gpt_config const& config, dtype type,
                                     std::size_t alignment = parameter_list::default_alignment) {
  gpt_config const c = resolve(config);
  index_t const C = c.channels;
  parameter_list list(alignment);
  list.add("wte", embedding_block, {index_t{c.padded_vocab}, C}, type);
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

// The parameters each block reads (hooks that move data need it): uses[b - first_block] lists
// parameter indices. A block reads its own layer's parameters and, for a tied head, others.
struct block_uses {
  int first_block = 0;
  std::vector<std::vector<std::uint32_t>> params;
  [[nodiscard]] int last_block() const noexcept { return first_block + static_cast<int>(params.size()) - 1; }
  [[nodiscard]] std::span<std::uint32_t const> of(int block) const {
    TIDE_REQUIRE(block >= first_block && block <= last_block(), "block_uses::of(", block, "): blocks are ",
                 first_block, " .. ", last_block());
    return params[static_cast<std::size_t>(block - first_block)];
  }
};

// The blocks of a gpt and what each reads: block b's own parameters; the head block (L) also
// reads wte (the tied LM head).
inline block_uses gpt_block_uses(gpt_config const& config) {
  gpt_config const c = resolve(config);
  parameter_list const list = gpt_parameters(c, dtype::f32);
  block_uses u{embedding_block, std::vector<std::vector<std::uint32_t>>(static_cast<std::size_t>(c.layers + 2))};
  for (std::uint32_t i = 0; i < list.size(); ++i)
    u.params[static_cast<std::size_t>(list[i].layer - embedding_block)].push_back(i);
  u.params.back().insert(u.params.back().begin(), 0u);  // wte, index 0
  return u;
}

// ---- options and reports --------------------------------------------------------------------

struct gpt_options {
  std::uint64_t seed = 0;  // of the GPT-2 initialisation the constructor runs
  // false: a forward with targets turns the logits into dlogits in place (llm.c; one (B, T, Vp)
  // buffer less). true: dlogits get their own buffer and logits() stays readable.
  bool keep_logits = false;
  std::size_t alignment = 256;  // of every parameter offset and activation offset, bytes
};

// The activation buffer of the current (B, T).
struct activation_report {
  index_t batch = 0;           // B (0 before the first forward)
  index_t seq = 0;             // T
  std::size_t tensors = 0;     // activations and activation gradients planned
  std::size_t footprint = 0;   // bytes of the one buffer
  std::size_t peak_live = 0;   // the lower bound: most bytes live at one op
  std::size_t unplanned = 0;   // bytes if every tensor had its own memory
};

namespace detail {

// One block of arena memory, returned on destruction.
template <Backend B>
class arena_block {
 public:
  arena_block() = default;
  arena_block(memory::device_arena<B>& arena, std::size_t bytes, std::size_t alignment)
      : arena_(&arena), data_(arena.allocate(bytes, alignment)), bytes_(bytes), alignment_(alignment) {}
  arena_block(arena_block&& o) noexcept
      : arena_(o.arena_), data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_), alignment_(o.alignment_) {}
  arena_block& operator=(arena_block&& o) noexcept {
    if (this != &o) {
      release();
      arena_ = o.arena_;
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = o.bytes_;
      alignment_ = o.alignment_;
    }
    return *this;
  }
  ~arena_block() { release(); }

  void release() noexcept {
    if (data_ != nullptr) arena_->deallocate(data_, bytes_, alignment_);
    data_ = nullptr;
  }
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(data_); }
  [[nodiscard]] std::size_t bytes() const noexcept { return data_ ? bytes_ : 0; }
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  memory::device_arena<B>* arena_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t alignment_ = 256;
};

// Counter-based random numbers: element i of stream `key` is a pure function of (key, i), so
// an initialisation is the same for any order or thread count.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// A double in (0, 1): 53 random bits, never 0 (log of it is finite).
constexpr double open_unit(std::uint64_t bits) noexcept {
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1p-53;
}
// N(0, 1) samples 2 pair and 2 pair + 1 of stream `key` (Box-Muller).
inline std::pair<double, double> normal_pair(std::uint64_t key, std::uint64_t pair) noexcept {
  double const u1 = open_unit(splitmix64(key ^ splitmix64(2 * pair)));
  double const u2 = open_unit(splitmix64(key ^ splitmix64(2 * pair + 1)));
  double const r = std::sqrt(-2.0 * std::log(u1));
  double const a = 2.0 * std::numbers::pi * u2;
  return {r * std::cos(a), r * std::sin(a)};
}

}  // namespace detail

// ---- the model ------------------------------------------------------------------------------

template <Backend B, Element T = float, class Hooks = no_hooks>
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

  // Allocates the parameters from `arena` and initialises them (GPT-2: weights N(0, 0.02), the
  // two residual projections' weights N(0, 0.02 / sqrt(2L)), biases 0, LayerNorm weights 1, the
  // padding rows of wte 0) from options.seed. Throws tide::error(usage) for a bad config,
  // tide::error(budget) if the parameters do not fit.
  gpt(gpt_config const& config, arena_type& arena, gpt_options const& options = {}, Hooks hooks = {})
      : config_(resolve(config)),
        options_(options),
        params_list_(gpt_parameters(config_, dtype_of<T>, options.alignment)),
        arena_(&arena),
        hooks_(std::move(hooks)),
        planner_(options.alignment) {
    register_activations();
    if constexpr (!external_storage)
      params_ = detail::arena_block<B>(arena, params_list_.bytes(), options_.alignment);
    initialise(nullptr, options_.seed);
  }

  gpt(gpt const&) = delete;
  gpt& operator=(gpt const&) = delete;

  // ---- what it is -----------------------------------------------------------------------------
  [[nodiscard]] gpt_config const& config() const noexcept { return config_; }
  [[nodiscard]] gpt_options const& options() const noexcept { return options_; }
  [[nodiscard]] parameter_list const& parameters() const noexcept { return params_list_; }
  [[nodiscard]] Hooks& hooks() noexcept { return hooks_; }
  [[nodiscard]] Hooks const& hooks() const noexcept { return hooks_; }

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

  // Re-initialises the parameters from `seed` (the constructor's initialisation, threaded over
  // ex's pool; the values do not depend on the thread count).
  void init(exec<B> const& ex, std::uint64_t seed) {
    static_assert(!B::is_device, "gpt::init runs on tide::host only: build the model as gpt<tide::host, ...> (offload schedulers keep its "
                                 "parameters in host-readable chunks)");
    initialise(&ex.pool, seed);
  }

  // ---- training -------------------------------------------------------------------------------
  // Forward over tokens (B, T), T <= max_seq, ids in [0, V), without a loss: fills logits().
  void forward(exec<B> const& ex, token_view tokens) {
    check_batch("gpt::forward", ex, tokens, nullptr);
    run_forward(ex, tokens, nullptr);
  }

  // One micro-batch for a trainer: tokens and targets, (B, T) each.
  struct batch_type {
    token_view tokens, targets;
  };
  float forward(exec<B> const& ex, batch_type const& b) { return forward(ex, b.tokens, b.targets); }
  // Tokens a batch trains on: B T.
  [[nodiscard]] static std::size_t tokens_in(batch_type const& b) noexcept {
    return static_cast<std::size_t>(b.tokens.size());
  }

  // Forward with targets (B, T) in [0, V): returns the mean cross-entropy over the B T
  // positions and leaves dlogits ready for backward(). Without options.keep_logits the logits
  // buffer now holds dlogits (logits() throws); the caller's tokens and targets must stay
  // unchanged until backward() (they are read again there, not copied).
  float forward(exec<B> const& ex, token_view tokens, token_view targets) {
    check_batch("gpt::forward", ex, tokens, &targets);
    run_forward(ex, tokens, &targets);
    return loss_;
  }

  // Gradients += d(mean loss)/d(parameters) of the last forward with targets. Gradients
  // accumulate across forward + backward pairs (micro-batches) until zero_grad(); a first
  // backward without zero_grad allocates them zeroed. For a mean over m micro-batches, scale the
  // gradients (or the step's grad_scale) by 1/m. One backward per forward: backward reuses the
  // memory of the activations it is done with (the plan's lifetimes end there).
  void backward(exec<B> const& ex) { backward(ex, 1.f); }

  // The same with the loss gradient multiplied by loss_scale first (loss scaling: every gradient
  // comes out scaled by it; a power of two keeps that exact).
  void backward(exec<B> const& ex, float loss_scale) {
    TIDE_REQUIRE(ready_for_backward_, "gpt::backward needs a forward with targets first (",
                 batch_ == 0 ? "none ran" : "the last forward had no targets, or its backward already ran",
                 "); call forward(ex, tokens, targets)");
    if (!external_storage && !grads_) zero_grad(ex);
    ready_for_backward_ = false;
    if (loss_scale != 1.f)
      detail::scale_in_place(ex, act<T>(dlogits_, {batch_, seq_, index_t{config_.padded_vocab}}), loss_scale);
    run_backward(ex);
  }

  // Gradients = 0 (allocates them from the arena on the first call).
  // With external storage: the hooks' zero_grad().
  void zero_grad(exec<B> const& ex) {
    if constexpr (external_storage) {
      hooks_.zero_grad();
    } else {
      if (!grads_) grads_ = detail::arena_block<B>(*arena_, params_list_.bytes(), options_.alignment);
      detail::zero_fill(ex, flat(grads_));
    }
  }

  // The mean loss of the last forward with targets (NaN if none).
  [[nodiscard]] float loss() const noexcept { return loss_; }

  // (B, T, Vp) logits of the last forward; columns >= V are the padding's (unused).
  [[nodiscard]] view<T> logits() const {
    TIDE_REQUIRE(batch_ != 0, "gpt::logits: no forward has run yet");
    TIDE_REQUIRE(options_.keep_logits || !targets_given_,
                 "gpt::logits: the last forward had targets and turned the logits into dlogits in place; "
                 "construct the model with options.keep_logits = true, or run forward(ex, tokens) without targets");
    return act<T>(logits_, {batch_, seq_, index_t{config_.padded_vocab}});
  }
  // (B, T) per-position losses of the last forward with targets.
  [[nodiscard]] view<float> losses() const {
    TIDE_REQUIRE(targets_given_, "gpt::losses: the last forward had no targets");
    return act<float>(losses_, {batch_, seq_});
  }

  // ---- sampling -------------------------------------------------------------------------------
  // Appends n tokens to `prompt` (ids in [0, V)), each sampled from softmax(logits / temperature)
  // over the V real columns (temperature <= 0: the most likely token), with a generator seeded by
  // `seed`: the same arguments give the same tokens. Runs forward on one sequence of
  // min(max_seq, prompt + n) positions (the last max_seq tokens once it is longer); this
  // replans the activations for (1, that length). Returns prompt followed by the n new tokens.
  std::vector<std::int32_t> generate(exec<B> const& ex, std::span<std::int32_t const> prompt, int n,
                                     float temperature, std::uint64_t seed) {
    static_assert(!B::is_device, "gpt::generate runs on tide::host only: sample from a gpt<tide::host, ...> (load the trained "
                                 "parameters into it from a checkpoint)");
    TIDE_REQUIRE(!prompt.empty(), "gpt::generate needs a prompt of at least one token");
    TIDE_REQUIRE(n >= 0, "gpt::generate: n = ", n, " tokens; pass n >= 0");
    for (std::size_t i = 0; i < prompt.size(); ++i)
      TIDE_REQUIRE(prompt[i] >= 0 && prompt[i] < config_.vocab, "gpt::generate: prompt[", i, "] = ", prompt[i],
                   " is outside the vocabulary [0, ", config_.vocab, ")");
    std::vector<std::int32_t> seq(prompt.begin(), prompt.end());
    seq.reserve(prompt.size() + static_cast<std::size_t>(n));
    auto const window = static_cast<index_t>(std::min<std::size_t>(prompt.size() + static_cast<std::size_t>(n),
                                                                    static_cast<std::size_t>(config_.max_seq)));
    std::vector<std::int32_t> buf(static_cast<std::size_t>(window), 0);
    std::vector<double> probs(static_cast<std::size_t>(config_.vocab));
    std::uint64_t const key = detail::splitmix64(seed ^ 0x5eed5eed5eed5eedull);
    index_t const Vp = config_.padded_vocab;
    for (int i = 0; i < n; ++i) {
      // The last `used` tokens at positions 0 .. used-1; positions after them are padding the
      // causal mask keeps out of position used-1.
      auto const used = static_cast<index_t>(std::min<std::size_t>(seq.size(), static_cast<std::size_t>(window)));
      std::copy(seq.end() - used, seq.end(), buf.begin());
      forward(ex, token_view(buf.data(), {index_t{1}, window}));
      T const* row = logits().data() + (used - 1) * Vp;
      seq.push_back(sample(row, probs, temperature, detail::open_unit(detail::splitmix64(key ^ static_cast<std::uint64_t>(i)))));
    }
    return seq;
  }

  // ---- the activation plan ----------------------------------------------------------------
  [[nodiscard]] activation_report activations() const noexcept { return report_; }
  // The planner holding every activation's name, bytes and op range (for inspection), and the
  // offsets of the current plan, by tensor id.
  [[nodiscard]] memory::lifetime_planner const& activation_planner() const noexcept { return planner_; }
  [[nodiscard]] std::span<std::size_t const> activation_offsets() const noexcept { return offsets_; }

 private:
  // How an activation's size follows (B, T).
  enum class extent : std::uint8_t { btc, bt, bt3c, bt4c, bnht, btvp };
  struct activation {
    extent kind;
    std::size_t element_bytes;
  };
  // The activations of one block (forward) and its activation gradients (backward).
  struct block_tensors {
    memory::tensor_id ln1, ln1_mean, ln1_rstd, qkv, atty, lse, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu,
        fcproj, res3;
    memory::tensor_id dfch, dln2, datty, dqkv, dln1;
  };

  // Op numbers of one step, forward then backward (the lifetimes' unit).
  struct op_numbers {
    int L;
    [[nodiscard]] constexpr int encoder() const { return 0; }
    // Block l's forward op k: 0 ln1, 1 qkv, 2 attention, 3 attn.proj, 4 residual + ln2, 5 fc +
    // gelu, 6 mlp.proj, 7 residual.
    [[nodiscard]] constexpr int fwd(int l, int k) const { return 1 + 8 * l + k; }
    [[nodiscard]] constexpr int lnf() const { return 1 + 8 * L; }
    [[nodiscard]] constexpr int head() const { return 2 + 8 * L; }
    [[nodiscard]] constexpr int classifier() const { return 3 + 8 * L; }
    [[nodiscard]] constexpr int head_bwd() const { return 4 + 8 * L; }
    [[nodiscard]] constexpr int lnf_bwd() const { return 5 + 8 * L; }
    // Block l's backward op k (blocks run L-1 .. 0): 0 mlp.proj, 1 fc + gelu, 2 ln2, 3 attn.proj,
    // 4 attention, 5 qkv, 6 ln1.
    [[nodiscard]] constexpr int bwd(int l, int k) const { return 6 + 8 * L + 7 * (L - 1 - l) + k; }
    [[nodiscard]] constexpr int encoder_bwd() const { return 6 + 15 * L; }
  };

  // ---- activations ----------------------------------------------------------------------------

  memory::tensor_id add_activation(std::string const& name, extent kind, std::size_t element_bytes, int first,
                                   int last) {
    memory::tensor_id const id = planner_.add(name, element_bytes, first, last);  // resized per (B, T)
    kinds_.push_back(activation{kind, element_bytes});
    return id;
  }

  // The tensors of a step and their lifetimes: fixed by L and keep_logits; sizes follow (B, T).
  void register_activations() {
    op_numbers const op{config_.layers};
    int const L = config_.layers;
    std::size_t const t = sizeof(T), f = sizeof(float);
    planner_.reserve(static_cast<std::size_t>(20 * L + 10), static_cast<std::size_t>(L) * 160 + 64);
    // x_0 is read by block 0's ln1 (forward and backward) and its first residual.
    encoded_ = add_activation("encoded", extent::btc, t, op.encoder(), op.bwd(0, 6));
    blocks_.resize(static_cast<std::size_t>(L));
    for (int l = 0; l < L; ++l) {
      block_tensors& b = blocks_[static_cast<std::size_t>(l)];
      auto const name = [l](char const* what) { return tide::detail::concat('h', l, '.', what); };
      b.ln1 = add_activation(name("ln1"), extent::btc, t, op.fwd(l, 0), op.bwd(l, 5));
      b.ln1_mean = add_activation(name("ln1.mean"), extent::bt, f, op.fwd(l, 0), op.bwd(l, 6));
      b.ln1_rstd = add_activation(name("ln1.rstd"), extent::bt, f, op.fwd(l, 0), op.bwd(l, 6));
      b.qkv = add_activation(name("qkv"), extent::bt3c, t, op.fwd(l, 1), op.bwd(l, 5));
      b.atty = add_activation(name("atty"), extent::btc, t, op.fwd(l, 2), op.bwd(l, 4));
      b.lse = add_activation(name("att.lse"), extent::bnht, f, op.fwd(l, 2), op.bwd(l, 4));
      b.attproj = add_activation(name("attproj"), extent::btc, t, op.fwd(l, 3), op.fwd(l, 4));
      b.res2 = add_activation(name("res2"), extent::btc, t, op.fwd(l, 4), op.bwd(l, 2));
      b.ln2 = add_activation(name("ln2"), extent::btc, t, op.fwd(l, 4), op.bwd(l, 1));
      b.ln2_mean = add_activation(name("ln2.mean"), extent::bt, f, op.fwd(l, 4), op.bwd(l, 2));
      b.ln2_rstd = add_activation(name("ln2.rstd"), extent::bt, f, op.fwd(l, 4), op.bwd(l, 2));
      b.fch = add_activation(name("fch"), extent::bt4c, t, op.fwd(l, 5), op.bwd(l, 1));
      b.fch_gelu = add_activation(name("fch_gelu"), extent::bt4c, t, op.fwd(l, 5), op.bwd(l, 0));
      b.fcproj = add_activation(name("fcproj"), extent::btc, t, op.fwd(l, 6), op.fwd(l, 7));
      // x_{l+1}: read by the next block's ln1 backward, or by lnf's backward.
      int const res3_last = l + 1 < L ? op.bwd(l + 1, 6) : op.lnf_bwd();
      b.res3 = add_activation(name("res3"), extent::btc, t, op.fwd(l, 7), res3_last);
      b.dfch = add_activation(name("dfch"), extent::bt4c, t, op.bwd(l, 0), op.bwd(l, 1));
      b.dln2 = add_activation(name("dln2"), extent::btc, t, op.bwd(l, 1), op.bwd(l, 2));
      b.datty = add_activation(name("datty"), extent::btc, t, op.bwd(l, 3), op.bwd(l, 4));
      b.dqkv = add_activation(name("dqkv"), extent::bt3c, t, op.bwd(l, 4), op.bwd(l, 5));
      b.dln1 = add_activation(name("dln1"), extent::btc, t, op.bwd(l, 5), op.bwd(l, 6));
    }
    int const last = op.encoder_bwd();
    lnf_ = add_activation("lnf", extent::btc, t, op.lnf(), op.head_bwd());
    lnf_mean_ = add_activation("lnf.mean", extent::bt, f, op.lnf(), op.lnf_bwd());
    lnf_rstd_ = add_activation("lnf.rstd", extent::bt, f, op.lnf(), op.lnf_bwd());
    if (options_.keep_logits) {
      logits_ = add_activation("logits", extent::btvp, t, op.head(), last);
      dlogits_ = add_activation("dlogits", extent::btvp, t, op.classifier(), op.head_bwd());
    } else {
      logits_ = dlogits_ = add_activation("logits", extent::btvp, t, op.head(), op.head_bwd());
    }
    losses_ = add_activation("losses", extent::bt, f, op.classifier(), last);
    dlnf_ = add_activation("dlnf", extent::btc, t, op.head_bwd(), op.lnf_bwd());
    dres_ = add_activation("dresidual", extent::btc, t, op.lnf_bwd(), last);
  }

  [[nodiscard]] std::size_t activation_bytes(activation const& a, index_t Bn, index_t Tn) const noexcept {
    index_t const C = config_.channels;
    index_t n = 0;
    switch (a.kind) {
      case extent::btc: n = Bn * Tn * C; break;
      case extent::bt: n = Bn * Tn; break;
      case extent::bt3c: n = Bn * Tn * 3 * C; break;
      case extent::bt4c: n = Bn * Tn * 4 * C; break;
      case extent::bnht: n = Bn * config_.heads * Tn; break;
      case extent::btvp: n = Bn * Tn * config_.padded_vocab; break;
    }
    return static_cast<std::size_t>(n) * a.element_bytes;
  }

  // Plans and allocates the activations for (Bn, Tn) unless they are already. The old buffer
  // is returned first, so the arena never holds both; if the new one does not fit, the model
  // holds no activations (parameters and gradients are untouched) and the error propagates.
  void prepare(index_t Bn, index_t Tn) {
    if (Bn == batch_ && Tn == seq_ && activations_) return;
    std::vector<std::size_t> sizes(kinds_.size());
    std::size_t unplanned = 0;
    for (std::size_t i = 0; i < kinds_.size(); ++i) {
      sizes[i] = activation_bytes(kinds_[i], Bn, Tn);
      unplanned += sizes[i];
    }
    batch_ = seq_ = 0;
    ready_for_backward_ = targets_given_ = false;
    report_ = {};
    activations_.release();
    memory::memory_plan const plan = planner_.replan(sizes);
    offsets_.assign(plan.offsets().begin(), plan.offsets().end());
    activations_ = detail::arena_block<B>(*arena_, plan.footprint(), options_.alignment);
    batch_ = Bn;
    seq_ = Tn;
    report_ = {Bn, Tn, kinds_.size(), plan.footprint(), plan.peak_live(), unplanned};
  }

  template <class U>
  [[nodiscard]] view<U> act(memory::tensor_id id, shape s) const {
    return view<U>(reinterpret_cast<U*>(activations_.data() + offsets_[id.index]), s);
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
  // Parameter k of transformer block l (the list: wte, wpe, 12 per block, lnf.w, lnf.b).
  [[nodiscard]] parameter const& block_parameter(int l, block_param k) const noexcept {
    return params_list_[static_cast<std::size_t>(2 + params_per_block * l + static_cast<int>(k))];
  }
  [[nodiscard]] parameter const& wte() const noexcept { return params_list_[0]; }
  [[nodiscard]] parameter const& wpe() const noexcept { return params_list_[1]; }
  [[nodiscard]] parameter const& lnf_w() const noexcept { return params_list_[params_list_.size() - 2]; }
  [[nodiscard]] parameter const& lnf_b() const noexcept { return params_list_[params_list_.size() - 1]; }

  void initialise(thread_pool* pool, std::uint64_t seed) {
    static_assert(!B::is_device, "gpt initialises its parameters on tide::host only: build the model as gpt<tide::host, ...>");
    if constexpr (!external_storage) {
      std::byte* const base = params_.data();
      std::fill(base, base + params_list_.bytes(), std::byte{0});  // padding and zero tensors
    }
    double const residual_std = 0.02 / std::sqrt(2.0 * config_.layers);
    for (std::size_t i = 0; i < params_list_.size(); ++i) {
      parameter const& p = params_list_[i];
      std::string_view const name = p.name();
      // External storage: the hooks hand out host-writable memory for every parameter outside a
      // step (a scheduler keeps its chunks on the host tier until the first step).
      T* const x = param(p).data();
      auto const n = static_cast<std::size_t>(p.numel());
      if (name.ends_with(".b")) {
        std::fill(x, x + n, from_float<T>(0.0f));
        continue;  // biases 0
      }
      if (name.ends_with("ln1.w") || name.ends_with("ln2.w") || name == "lnf.w") {
        std::fill(x, x + n, from_float<T>(1.0f));
        continue;
      }
      double const std_dev = name.ends_with("proj.w") ? residual_std : 0.02;
      // wte's padding rows stay 0: no token selects them and the head's loss ignores them.
      std::size_t const real = name == "wte" ? static_cast<std::size_t>(config_.vocab * config_.channels) : n;
      std::fill(x + real, x + n, from_float<T>(0.0f));
      std::uint64_t const key = detail::splitmix64(seed ^ detail::splitmix64(0xA11CE + i));
      // Element j is sample j of the stream: a function of (seed, i, j) only.
      auto fill = [=](std::size_t b, std::size_t e) {
        for (std::size_t pair = b; pair < e; ++pair) {
          auto const [z0, z1] = detail::normal_pair(key, pair);
          x[2 * pair] = from_float<T>(static_cast<float>(std_dev * z0));
          if (2 * pair + 1 < real) x[2 * pair + 1] = from_float<T>(static_cast<float>(std_dev * z1));
        }
      };
      std::size_t const pairs = (real + 1) / 2;
      if (pool != nullptr) parallel_for(*pool, pairs, fill);
      else fill(0, pairs);
    }
  }

  // ---- forward ----------------------------------------------------------------------------------

  void check_batch(char const* op, exec<B> const& ex, token_view tokens, token_view const* targets) const {
    TIDE_REQUIRE(tokens.rank() == 2 && tokens.extent(0) >= 1 && tokens.extent(1) >= 1 && tokens.is_contiguous(), op,
                 ": tokens must be a contiguous (B, T) view with B, T >= 1, got rank ", tokens.rank(), " (",
                 tokens.extent(0), ", ", tokens.extent(1), ")");
    TIDE_REQUIRE(tokens.extent(1) <= config_.max_seq, op, ": T = ", tokens.extent(1), " positions but max_seq = ",
                 config_.max_seq, "; pass at most max_seq positions (wpe has max_seq rows)");
    if (targets != nullptr)
      TIDE_REQUIRE(targets->extents() == tokens.extents() && targets->is_contiguous(), op,
                   ": targets must be contiguous and have the shape of tokens (", tokens.extent(0), ", ",
                   tokens.extent(1), "), got rank ", targets->rank(), " (", targets->extent(0), ", ",
                   targets->extent(1), ")");
    if constexpr (!B::is_device) {
      detail::check_token_ids(ex, op, "tokens", tokens, config_.vocab);
      if (targets != nullptr) detail::check_token_ids(ex, op, "targets", *targets, config_.vocab);
    }
  }

  [[nodiscard]] view<T const> cparam(parameter const& p) const { return param(p); }
  [[nodiscard]] view<T const> cparam(int l, block_param k) const { return param(block_parameter(l, k)); }
  [[nodiscard]] view<T> dparam(int l, block_param k) const { return tensor_at(grads_, block_parameter(l, k), true); }

  // x_l, the input of block l: the embeddings for l = 0, else block l-1's output.
  [[nodiscard]] memory::tensor_id residual_in(int l) const {
    return l == 0 ? encoded_ : blocks_[static_cast<std::size_t>(l - 1)].res3;
  }

  void run_forward(exec<B> const& ex, token_view tokens, token_view const* targets) {
    index_t const Bn = tokens.extent(0), Tn = tokens.extent(1), C = config_.channels, NH = config_.heads;
    int const L = config_.layers;
    prepare(Bn, Tn);
    ready_for_backward_ = targets_given_ = false;
    loss_ = std::numeric_limits<float>::quiet_NaN();
    tokens_ = tokens;
    shape const btc{Bn, Tn, C}, bt{Bn, Tn};

    hooks_.pre_forward(embedding_block);
    kernels::encoder_forward(ex, act<T>(encoded_, btc), tokens, cparam(wte()), cparam(wpe()));
    hooks_.post_forward(embedding_block);

    for (int l = 0; l < L; ++l) {
      hooks_.pre_forward(l);
      block_tensors const& b = blocks_[static_cast<std::size_t>(l)];
      view<T const> const x = act<T>(residual_in(l), btc);
      auto const ln1 = act<T>(b.ln1, btc);
      auto const qkv = act<T>(b.qkv, {Bn, Tn, 3 * C});
      auto const atty = act<T>(b.atty, btc);
      auto const attproj = act<T>(b.attproj, btc);
      auto const res2 = act<T>(b.res2, btc);
      auto const ln2 = act<T>(b.ln2, btc);
      auto const fch = act<T>(b.fch, {Bn, Tn, 4 * C});
      auto const fch_gelu = act<T>(b.fch_gelu, {Bn, Tn, 4 * C});
      auto const fcproj = act<T>(b.fcproj, btc);
      using enum block_param;
      kernels::layernorm_forward(ex, ln1, act<float>(b.ln1_mean, bt), act<float>(b.ln1_rstd, bt), x, cparam(l, ln1_w),
                                 cparam(l, ln1_b));
      kernels::matmul_forward(ex, qkv, view<T const>(ln1), cparam(l, qkv_w), cparam(l, qkv_b));
      kernels::attention_forward(ex, atty, act<float>(b.lse, {Bn, NH, Tn}), view<T const>(qkv), NH);
      kernels::matmul_forward(ex, attproj, view<T const>(atty), cparam(l, attn_proj_w), cparam(l, attn_proj_b));
      kernels::residual_layernorm_forward(ex, res2, ln2, act<float>(b.ln2_mean, bt), act<float>(b.ln2_rstd, bt), x,
                                          view<T const>(attproj), cparam(l, ln2_w), cparam(l, ln2_b));
      kernels::matmul_forward_gelu(ex, fch_gelu, fch, view<T const>(ln2), cparam(l, fc_w), cparam(l, fc_b));
      kernels::matmul_forward(ex, fcproj, view<T const>(fch_gelu), cparam(l, mlp_proj_w), cparam(l, mlp_proj_b));
      kernels::residual_forward(ex, act<T>(b.res3, btc), view<T const>(res2), view<T const>(fcproj));
      hooks_.post_forward(l);
    }

    hooks_.pre_forward(head_block(config_));
    shape const btv{Bn, Tn, index_t{config_.padded_vocab}};
    auto const lnf = act<T>(lnf_, btc);
    auto const logits = act<T>(logits_, btv);
    kernels::layernorm_forward(ex, lnf, act<float>(lnf_mean_, bt), act<float>(lnf_rstd_, bt),
                               view<T const>(act<T>(residual_in(L), btc)), cparam(lnf_w()), cparam(lnf_b()));
    kernels::matmul_forward(ex, logits, view<T const>(lnf), cparam(wte()));
    if (targets != nullptr) {
      targets_ = *targets;
      auto const losses = act<float>(losses_, bt);
      kernels::fused_classifier(ex, act<T>(dlogits_, btv), losses, view<T const>(logits), targets_,
                                index_t{config_.vocab});
      loss_ = static_cast<float>(detail::ordered_sum(ex, view<float const>(losses)) / static_cast<double>(Bn * Tn));
      targets_given_ = ready_for_backward_ = true;
    }
    hooks_.post_forward(head_block(config_));
  }

  // ---- backward ---------------------------------------------------------------------------------

  void run_backward(exec<B> const& ex) {
    index_t const Bn = batch_, Tn = seq_, C = config_.channels, NH = config_.heads;
    int const L = config_.layers;
    shape const btc{Bn, Tn, C}, bt{Bn, Tn}, bt3c{Bn, Tn, 3 * C}, bt4c{Bn, Tn, 4 * C};
    auto const dres = act<T>(dres_, btc);

    hooks_.pre_backward(head_block(config_));
    auto const dlnf = act<T>(dlnf_, btc);
    detail::zero_fill(ex, dlnf);
    kernels::matmul_backward(ex, dlnf, tensor_at(grads_, wte(), true), view<T>{},
                             view<T const>(act<T>(dlogits_, {Bn, Tn, index_t{config_.padded_vocab}})),
                             view<T const>(act<T>(lnf_, btc)), cparam(wte()));
    detail::zero_fill(ex, dres);
    kernels::layernorm_backward(ex, dres, tensor_at(grads_, lnf_w(), true), tensor_at(grads_, lnf_b(), true), view<T const>(dlnf),
                                view<T const>(act<T>(residual_in(L), btc)), cparam(lnf_w()),
                                view<float const>(act<float>(lnf_mean_, bt)), view<float const>(act<float>(lnf_rstd_, bt)));
    hooks_.post_backward(head_block(config_));

    for (int l = L - 1; l >= 0; --l) {
      hooks_.pre_backward(l);
      block_tensors const& b = blocks_[static_cast<std::size_t>(l)];
      using enum block_param;
      // x_{l+1} = res2 + fcproj: d fcproj = d x_{l+1} = dres, which also flows on into res2.
      auto const dfch = act<T>(b.dfch, bt4c);
      detail::zero_fill(ex, dfch);
      kernels::matmul_backward(ex, dfch, dparam(l, mlp_proj_w), dparam(l, mlp_proj_b), view<T const>(dres),
                               view<T const>(act<T>(b.fch_gelu, bt4c)), cparam(l, mlp_proj_w));
      auto const dln2 = act<T>(b.dln2, btc);
      detail::zero_fill(ex, dln2);
      kernels::matmul_backward_gelu(ex, dln2, dparam(l, fc_w), dparam(l, fc_b), dfch, view<T const>(act<T>(b.fch, bt4c)),
                                    view<T const>(act<T>(b.ln2, btc)), cparam(l, fc_w));
      kernels::layernorm_backward(ex, dres, dparam(l, ln2_w), dparam(l, ln2_b), view<T const>(dln2),
                                  view<T const>(act<T>(b.res2, btc)), cparam(l, ln2_w),
                                  view<float const>(act<float>(b.ln2_mean, bt)),
                                  view<float const>(act<float>(b.ln2_rstd, bt)));
      // res2 = x_l + attproj: d attproj = d res2 = dres.
      auto const datty = act<T>(b.datty, btc);
      detail::zero_fill(ex, datty);
      kernels::matmul_backward(ex, datty, dparam(l, attn_proj_w), dparam(l, attn_proj_b), view<T const>(dres),
                               view<T const>(act<T>(b.atty, btc)), cparam(l, attn_proj_w));
      auto const dqkv = act<T>(b.dqkv, bt3c);
      detail::zero_fill(ex, dqkv);
      kernels::attention_backward(ex, dqkv, view<T const>(datty), view<T const>(act<T>(b.qkv, bt3c)),
                                  view<T const>(act<T>(b.atty, btc)), view<float const>(act<float>(b.lse, {Bn, NH, Tn})),
                                  NH);
      auto const dln1 = act<T>(b.dln1, btc);
      detail::zero_fill(ex, dln1);
      kernels::matmul_backward(ex, dln1, dparam(l, qkv_w), dparam(l, qkv_b), view<T const>(dqkv),
                               view<T const>(act<T>(b.ln1, btc)), cparam(l, qkv_w));
      kernels::layernorm_backward(ex, dres, dparam(l, ln1_w), dparam(l, ln1_b), view<T const>(dln1),
                                  view<T const>(act<T>(residual_in(l), btc)), cparam(l, ln1_w),
                                  view<float const>(act<float>(b.ln1_mean, bt)),
                                  view<float const>(act<float>(b.ln1_rstd, bt)));
      hooks_.post_backward(l);
    }

    hooks_.pre_backward(embedding_block);
    kernels::encoder_backward(ex, tensor_at(grads_, wte(), true), tensor_at(grads_, wpe(), true), view<T const>(dres), tokens_);
    hooks_.post_backward(embedding_block);
  }

  // ---- sampling ---------------------------------------------------------------------------------

  std::int32_t sample(T const* row, std::vector<double>& probs, float temperature, double u) const {
    index_t const V = config_.vocab;
    if (!(temperature > 0.f)) {
      index_t best = 0;
      for (index_t j = 1; j < V; ++j)
        if (to_float(row[j]) > to_float(row[best])) best = j;
      return static_cast<std::int32_t>(best);
    }
    double m = -std::numeric_limits<double>::infinity();
    for (index_t j = 0; j < V; ++j) m = std::max(m, static_cast<double>(to_float(row[j])) / temperature);
    double sum = 0;
    for (index_t j = 0; j < V; ++j) sum += probs[static_cast<std::size_t>(j)] = std::exp(static_cast<double>(to_float(row[j])) / temperature - m);
    double const target = u * sum;
    double acc = 0;
    for (index_t j = 0; j < V; ++j) {
      acc += probs[static_cast<std::size_t>(j)];
      if (target < acc) return static_cast<std::int32_t>(j);
    }
    return static_cast<std::int32_t>(V - 1);
  }

  gpt_config config_;
  gpt_options options_;
  parameter_list params_list_;
  arena_type* arena_;
  [[no_unique_address]] Hooks hooks_;

  detail::arena_block<B> params_;
  detail::arena_block<B> grads_;
  detail::arena_block<B> activations_;

  memory::lifetime_planner planner_;
  std::vector<activation> kinds_;           // by tensor id
  std::vector<std::size_t> offsets_;        // by tensor id, of the current plan
  std::vector<block_tensors> blocks_;
  memory::tensor_id encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_, dlogits_, losses_, dlnf_, dres_;
  activation_report report_;

  index_t batch_ = 0, seq_ = 0;  // of the current plan; 0 before the first forward
  token_view tokens_, targets_;  // of the last forward, read again by backward
  bool targets_given_ = false;
  bool ready_for_backward_ = false;
  float loss_ = std::numeric_limits<float>::quiet_NaN();
};

// What a trainer builds a gpt from: the model's type depends on the hooks (the offload
// scheduler), which the trainer creates, so it is handed a recipe rather than a model.
template <Backend B, Element T = float>
struct gpt_spec {
  using backend = B;
  using element_type = T;  // of parameters, gradients and activations (bf16 / f16: fp32 masters in the scheduler)
  gpt_config config{};
  gpt_options options{};
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
