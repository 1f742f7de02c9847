#pragma once
// The blocks of tide::nn::gpt, forward and backward, as free functions over views: the model
// (nn/gpt.hpp) finds each block's activations in its plan and its parameters where they live,
// then calls these. Also the pieces the model needs that are not blocks: arena memory, the
// counter-based initialisation and token sampling.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/parameters.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/attention/attention.hpp"
#include "tide/kernels/classifier/classifier.hpp"
#include "tide/kernels/embedding/embedding.hpp"
#include "tide/kernels/gelu/gelu.hpp"
#include "tide/kernels/layernorm/layernorm.hpp"
#include "tide/kernels/matmul/matmul.hpp"
#include "tide/kernels/residual/residual.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/nn/backend_ops.hpp"
#include "tide/nn/gpt_activations.hpp"
#include "tide/nn/gpt_config.hpp"

namespace tide::nn::detail {

// ---- memory -----------------------------------------------------------------------------------

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

// ---- initialisation and sampling --------------------------------------------------------------

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

// GPT-2's initialisation of parameter i (`p`, at host-writable x): weights N(0, 0.02), the
// residual projections' N(0, 0.02 / sqrt(2L)), biases 0, LayerNorm weights 1, wte's padding
// rows 0. Element j is sample j of stream (seed, i): the same bits on any thread count, and the
// same values whatever wte_pieces (i counts wte once).
template <class T>
void initialise_parameter(thread_pool* pool, gpt_config const& c, std::size_t i, parameter const& p, T* x,
                          std::uint64_t seed) {
  std::string_view const name = p.name();
  auto const n = static_cast<std::size_t>(p.numel());
  if (name.ends_with(".b")) {
    std::fill(x, x + n, from_float<T>(0.0f));
    return;
  }
  if (name.ends_with("ln1.w") || name.ends_with("ln2.w") || name == "lnf.w") {
    std::fill(x, x + n, from_float<T>(1.0f));
    return;
  }
  double const std_dev = name.ends_with("proj.w") ? 0.02 / std::sqrt(2.0 * c.layers) : 0.02;
  // A piece of wte (i < wte_pieces) is elements [first, first + n) of wte's stream (i = 0): the
  // same values whatever the pieces. wte's padding rows stay 0: no token selects them and the
  // head's loss ignores them.
  bool const wte = i < static_cast<std::size_t>(c.wte_pieces);
  std::size_t const first = wte ? i * static_cast<std::size_t>(wte_piece_rows(c) * c.channels) : 0;
  std::size_t const total = wte ? static_cast<std::size_t>(c.vocab * c.channels) : n;
  std::size_t const real = std::min(n, total > first ? total - first : 0);
  std::fill(x + real, x + n, from_float<T>(0.0f));
  // The stream of a parameter is its number in the list of a whole wte (pieces share wte's, 0).
  std::size_t const stream = wte ? 0 : i + 1 - static_cast<std::size_t>(c.wte_pieces);
  std::uint64_t const key = splitmix64(seed ^ splitmix64(0xA11CE + stream));
  // Element e of the stream is component e % 2 of pair e / 2; this tensor holds [first, first + real).
  std::size_t const end = first + real;
  auto fill = [=](std::size_t b, std::size_t e) {
    for (std::size_t pair = b; pair < e; ++pair) {
      auto const [z0, z1] = normal_pair(key, pair);
      if (2 * pair >= first) x[2 * pair - first] = from_float<T>(static_cast<float>(std_dev * z0));
      if (2 * pair + 1 < end) x[2 * pair + 1 - first] = from_float<T>(static_cast<float>(std_dev * z1));
    }
  };
  std::size_t const p0 = first / 2, pairs = (end + 1) / 2 - p0;
  if (real == 0) return;
  if (pool != nullptr) parallel_for(*pool, pairs, [&](std::size_t b, std::size_t e) { fill(p0 + b, p0 + e); });
  else fill(p0, p0 + pairs);
}

// A token from softmax(row[:V] / temperature) at quantile u in (0, 1); temperature <= 0: argmax.
template <class T>
std::int32_t sample_token(T const* row, index_t V, std::vector<double>& probs, float temperature, double u) {
  if (!(temperature > 0.f)) {
    index_t best = 0;
    for (index_t j = 1; j < V; ++j)
      if (to_float(row[j]) > to_float(row[best])) best = j;
    return static_cast<std::int32_t>(best);
  }
  double m = -std::numeric_limits<double>::infinity();
  for (index_t j = 0; j < V; ++j) m = std::max(m, static_cast<double>(to_float(row[j])) / temperature);
  double sum = 0;
  for (index_t j = 0; j < V; ++j)
    sum += probs[static_cast<std::size_t>(j)] = std::exp(static_cast<double>(to_float(row[j])) / temperature - m);
  double const target = u * sum;
  double acc = 0;
  for (index_t j = 0; j < V; ++j) {
    acc += probs[static_cast<std::size_t>(j)];
    if (target < acc) return static_cast<std::int32_t>(j);
  }
  return static_cast<std::int32_t>(V - 1);
}

// gpt::generate: n tokens sampled after `prompt` by forwards over a sliding window.
// forward_row(window, used): forwards the window's tokens (one sequence) and returns the logits
// row of position used - 1, host-readable.
template <class ForwardRow>
std::vector<std::int32_t> generate_tokens(gpt_config const& c, std::span<std::int32_t const> prompt, int n,
                                          float temperature, std::uint64_t seed, ForwardRow&& forward_row) {
  TIDE_REQUIRE(!prompt.empty(), "gpt::generate needs a prompt of at least one token");
  TIDE_REQUIRE(n >= 0, "gpt::generate: n = ", n, " tokens; pass n >= 0");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    TIDE_REQUIRE(prompt[i] >= 0 && prompt[i] < c.vocab, "gpt::generate: prompt[", i, "] = ", prompt[i],
                 " is outside the vocabulary [0, ", c.vocab, ")");
  std::vector<std::int32_t> seq(prompt.begin(), prompt.end());
  seq.reserve(prompt.size() + static_cast<std::size_t>(n));
  auto const window = static_cast<index_t>(std::min<std::size_t>(prompt.size() + static_cast<std::size_t>(n),
                                                                  static_cast<std::size_t>(c.max_seq)));
  std::vector<std::int32_t> buf(static_cast<std::size_t>(window), 0);
  std::vector<double> probs(static_cast<std::size_t>(c.vocab));
  std::uint64_t const key = splitmix64(seed ^ 0x5eed5eed5eed5eedull);
  for (int i = 0; i < n; ++i) {
    // The last `used` tokens at positions 0 .. used-1; positions after them are padding the
    // causal mask keeps out of position used-1.
    auto const used = static_cast<index_t>(std::min<std::size_t>(seq.size(), static_cast<std::size_t>(window)));
    std::copy(seq.end() - used, seq.end(), buf.begin());
    auto const* row = forward_row(std::span<std::int32_t const>(buf), used);
    double const u = open_unit(splitmix64(key ^ static_cast<std::uint64_t>(i)));
    seq.push_back(sample_token(row, index_t{c.vocab}, probs, temperature, u));
  }
  return seq;
}

// ---- inputs --------------------------------------------------------------------------------------

// Shapes always; ids of tokens when the embedding reads them, of targets when given.
template <Backend B>
void check_batch(char const* op, exec<B> const& ex, gpt_config const& config, tensor_view<std::int32_t const, B> tokens,
               tensor_view<std::int32_t const, B> const* targets, bool ids) {
  TIDE_REQUIRE(tokens.rank() == 2 && tokens.extent(0) >= 1 && tokens.extent(1) >= 1 && tokens.is_contiguous(), op,
               ": tokens must be a contiguous (B, T) view with B, T >= 1, got rank ", tokens.rank(), " (",
               tokens.extent(0), ", ", tokens.extent(1), ")");
  TIDE_REQUIRE(tokens.extent(1) <= config.max_seq, op, ": T = ", tokens.extent(1), " positions but max_seq = ",
               config.max_seq, "; pass at most max_seq positions (wpe has max_seq rows)");
  if (targets != nullptr)
    TIDE_REQUIRE(targets->extents() == tokens.extents() && targets->is_contiguous(), op,
                 ": targets must be contiguous and have the shape of tokens (", tokens.extent(0), ", ",
                 tokens.extent(1), "), got rank ", targets->rank(), " (", targets->extent(0), ", ",
                 targets->extent(1), "); the head block needs them");
  if constexpr (!B::is_device) {
    if (ids) check_token_ids(ex, op, "tokens", tokens, config.vocab);
    if (targets != nullptr) check_token_ids(ex, op, "targets", *targets, config.vocab);
  }
}

// ---- a transformer block ----------------------------------------------------------------------

}  // namespace tide::nn::detail

namespace tide::nn {

// The scratch the model's kernels ask for at (Bn, Tn), element T, on ex's backend: the most any
// kernel of each scratch tensor's ops needs (they run one after another on one stream). What
// recompute_within takes to predict a model's footprint.
template <Element T, Backend B>
gpt_scratch gpt_scratch_of(exec<B> const& ex, gpt_config const& config, index_t Bn, index_t Tn) {
  using namespace kernels;
  gpt_config const c = resolve(config);
  index_t const N = Bn * Tn, C = c.channels, NH = c.heads, R = wte_piece_rows(c);
  std::size_t const to_gelu = std::max({matmul_forward_scratch_bytes<T>(ex, N, C, 3 * C),
                                        attention_forward_scratch_bytes(ex, Bn, Tn, C, NH),
                                        matmul_forward_scratch_bytes<T>(ex, N, C, C),
                                        matmul_forward_scratch_bytes<T>(ex, N, C, 4 * C)});
  gpt_scratch s;
  s.block_forward = std::max(to_gelu, matmul_forward_scratch_bytes<T>(ex, N, 4 * C, C));
  s.block_backward = std::max({to_gelu,  // the recompute
                               matmul_backward_scratch_bytes<T>(ex, N, 4 * C, C),
                               matmul_backward_scratch_bytes<T>(ex, N, C, 4 * C),
                               layernorm_backward_scratch_bytes(ex, N, C),
                               matmul_backward_scratch_bytes<T>(ex, N, C, C),
                               attention_backward_scratch_bytes(ex, Bn, Tn, C, NH),
                               matmul_backward_scratch_bytes<T>(ex, N, C, 3 * C)});
  s.head = std::max({matmul_forward_scratch_bytes<T>(ex, N, C, R), fused_classifier_scratch_bytes(ex, N, c.vocab),
                     matmul_backward_scratch_bytes<T>(ex, N, C, R), layernorm_backward_scratch_bytes(ex, N, C)});
  s.encoder_backward = encoder_backward_scratch_bytes(ex, Bn, Tn, C, c.padded_vocab);
  return s;
}

}  // namespace tide::nn

namespace tide::nn::detail {

// The 12 parameters (or gradients) of one block, indexed by block_param.
template <class V>
struct block_params {
  V at[params_per_block];
  [[nodiscard]] V const& operator[](block_param k) const noexcept { return at[static_cast<int>(k)]; }
};

// Block l's parameters (or gradients) as view_of(record) gives them; the list is wte (or its
// pieces), wpe, 12 per block, lnf.w, lnf.b (block_param_index).
template <class ViewOf>
auto block_params_of(gpt_config const& c, parameter_list const& list, int l, ViewOf view_of) {
  block_params<decltype(view_of(list[0]))> p;
  for (int k = 0; k < params_per_block; ++k) p.at[k] = view_of(list[block_param_index(c, l, k)]);
  return p;
}

// A block's forward up to the MLP's GELU: every activation its backward reads. A recomputed
// block runs this again before its backward; the same kernels on the same x and weights give
// the same bits.
template <Backend B, class T>
void block_forward_to_gelu(exec<B> const& ex, tensor_view<T const, B> x, block_views<B, T> const& a,
                     block_params<tensor_view<T const, B>> const& w, index_t NH) {
  using enum block_param;
  using cview = tensor_view<T const, B>;
  kernels::layernorm_forward(ex, a.ln1, a.ln1_mean, a.ln1_rstd, x, w[ln1_w], w[ln1_b]);
  kernels::matmul_forward(ex, a.qkv, cview(a.ln1), w[qkv_w], w[qkv_b], a.ws);
  kernels::attention_forward(ex, a.atty, a.lse, cview(a.qkv), NH, a.ws);
  kernels::matmul_forward(ex, a.attproj, cview(a.atty), w[attn_proj_w], w[attn_proj_b], a.ws);
  kernels::residual_layernorm_forward(ex, a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, cview(a.attproj), w[ln2_w],
                                      w[ln2_b]);
  kernels::matmul_forward_gelu(ex, a.fch_gelu, a.fch, cview(a.ln2), w[fc_w], w[fc_b], a.ws);
}

// x_{l+1} = res2 + mlp.proj(gelu(fc(ln2(res2)))), res2 = x_l + attn.proj(attention(qkv(ln1(x_l)))).
template <Backend B, class T>
void block_forward(exec<B> const& ex, tensor_view<T const, B> x, block_views<B, T> const& a,
                   block_params<tensor_view<T const, B>> const& w, index_t NH) {
  using enum block_param;
  using cview = tensor_view<T const, B>;
  block_forward_to_gelu(ex, x, a, w, NH);
  kernels::matmul_forward(ex, a.fcproj, cview(a.fch_gelu), w[mlp_proj_w], w[mlp_proj_b], a.ws);
  kernels::residual_forward(ex, a.res3, cview(a.res2), cview(a.fcproj));
}

// dres: d x_{l+1} (B, T, C) on entry, d x_l on return; dw += the block's parameter gradients.
template <Backend B, class T>
void block_backward(exec<B> const& ex, tensor_view<T, B> dres, tensor_view<T const, B> x, block_views<B, T> const& a,
                    block_params<tensor_view<T const, B>> const& w, block_params<tensor_view<T, B>> const& dw,
                    index_t NH) {
  using enum block_param;
  using cview = tensor_view<T const, B>;
  using fview = tensor_view<float const, B>;
  // x_{l+1} = res2 + fcproj: d fcproj = d x_{l+1} = dres, which also flows on into res2.
  zero_fill(ex, a.dfch);
  kernels::matmul_backward(ex, a.dfch, dw[mlp_proj_w], dw[mlp_proj_b], cview(dres), cview(a.fch_gelu), w[mlp_proj_w],
                           a.ws);
  zero_fill(ex, a.dln2);
  kernels::matmul_backward_gelu(ex, a.dln2, dw[fc_w], dw[fc_b], a.dfch, cview(a.fch), cview(a.ln2), w[fc_w],
                                a.ws);
  kernels::layernorm_backward(ex, dres, dw[ln2_w], dw[ln2_b], cview(a.dln2), cview(a.res2), w[ln2_w],
                              fview(a.ln2_mean), fview(a.ln2_rstd), a.ws);
  // res2 = x_l + attproj: d attproj = d res2 = dres.
  zero_fill(ex, a.datty);
  kernels::matmul_backward(ex, a.datty, dw[attn_proj_w], dw[attn_proj_b], cview(dres), cview(a.atty), w[attn_proj_w],
                           a.ws);
  zero_fill(ex, a.dqkv);
  kernels::attention_backward(ex, a.dqkv, cview(a.datty), cview(a.qkv), cview(a.atty), fview(a.lse), NH, a.ws);
  zero_fill(ex, a.dln1);
  kernels::matmul_backward(ex, a.dln1, dw[qkv_w], dw[qkv_b], cview(a.dqkv), cview(a.ln1), w[qkv_w], a.ws);
  kernels::layernorm_backward(ex, dres, dw[ln1_w], dw[ln1_b], cview(a.dln1), x, w[ln1_w], fview(a.ln1_mean),
                              fview(a.ln1_rstd), a.ws);
}

// block_backward in two passes (gpt_options::split_backward). The input pass: dres as in
// block_backward, keeping what the weight pass reads (a.dout = d x_{l+1}, a.dres2 = d res2,
// a.dfch already through gelu', a.dln2, a.dqkv, a.dln1). The same kernels' halves on the same
// values: the same bits.
template <Backend B, class T>
void block_backward_input(exec<B> const& ex, tensor_view<T, B> dres, tensor_view<T const, B> x,
                          block_views<B, T> const& a, block_params<tensor_view<T const, B>> const& w, index_t NH) {
  using enum block_param;
  using cview = tensor_view<T const, B>;
  using fview = tensor_view<float const, B>;
  index_t const N = dres.extent(0) * dres.extent(1), C = dres.extent(2);
  auto const rows = [&](auto v) { return decltype(v)(v.data(), {N, C}); };
  copy_columns(ex, rows(a.dout), 0, rows(cview(dres)), 0, C);
  zero_fill(ex, a.dfch);
  kernels::matmul_backward_input(ex, a.dfch, cview(dres), w[mlp_proj_w], a.ws);
  zero_fill(ex, a.dln2);
  kernels::matmul_backward_gelu_input(ex, a.dln2, a.dfch, cview(a.fch), w[fc_w], a.ws);
  kernels::layernorm_backward_input(ex, dres, cview(a.dln2), cview(a.res2), w[ln2_w], fview(a.ln2_mean),
                                    fview(a.ln2_rstd));
  copy_columns(ex, rows(a.dres2), 0, rows(cview(dres)), 0, C);
  zero_fill(ex, a.datty);
  kernels::matmul_backward_input(ex, a.datty, cview(dres), w[attn_proj_w], a.ws);
  zero_fill(ex, a.dqkv);
  kernels::attention_backward(ex, a.dqkv, cview(a.datty), cview(a.qkv), cview(a.atty), fview(a.lse), NH, a.ws);
  zero_fill(ex, a.dln1);
  kernels::matmul_backward_input(ex, a.dln1, cview(a.dqkv), w[qkv_w], a.ws);
  kernels::layernorm_backward_input(ex, dres, cview(a.dln1), x, w[ln1_w], fview(a.ln1_mean), fview(a.ln1_rstd));
}

// The weight pass: dw += the block's parameter gradients, from what the input pass kept.
template <Backend B, class T>
void block_backward_weights(exec<B> const& ex, tensor_view<T const, B> x, block_views<B, T> const& a,
                            block_params<tensor_view<T, B>> const& dw) {
  using enum block_param;
  using cview = tensor_view<T const, B>;
  using fview = tensor_view<float const, B>;
  kernels::matmul_backward_weight(ex, dw[mlp_proj_w], dw[mlp_proj_b], cview(a.dout), cview(a.fch_gelu), a.wws);
  kernels::matmul_backward_weight(ex, dw[fc_w], dw[fc_b], cview(a.dfch), cview(a.ln2), a.wws);
  kernels::layernorm_backward_weight(ex, dw[ln2_w], dw[ln2_b], cview(a.dln2), cview(a.res2), fview(a.ln2_mean),
                                     fview(a.ln2_rstd), a.wws);
  kernels::matmul_backward_weight(ex, dw[attn_proj_w], dw[attn_proj_b], cview(a.dres2), cview(a.atty), a.wws);
  kernels::matmul_backward_weight(ex, dw[qkv_w], dw[qkv_b], cview(a.dqkv), cview(a.ln1), a.wws);
  kernels::layernorm_backward_weight(ex, dw[ln1_w], dw[ln1_b], cview(a.dln1), x, fview(a.ln1_mean), fview(a.ln1_rstd),
                                     a.wws);
}

// ---- the head: final LayerNorm, LM head tied to wte, loss -------------------------------------

// Piece j of a table cut into row pieces, as a (rows, C) view.
template <Backend B, class T>
tensor_view<T, B> piece_view(kernels::row_table<T> const& t, int j) noexcept {
  return tensor_view<T, B>(t.piece[j], {t.rows_of(j), t.cols});
}

// logits = layernorm(x_L) wte^T. wte in pieces: each piece's columns of the logits go through
// h.piece (B, T, rows of a piece), one GEMM per piece.
template <Backend B, class T>
void head_forward(exec<B> const& ex, tensor_view<T const, B> x, head_views<B, T> const& h,
                  tensor_view<T const, B> lnf_w, tensor_view<T const, B> lnf_b, kernels::row_table<T const> const& wte) {
  kernels::layernorm_forward(ex, h.lnf, h.lnf_mean, h.lnf_rstd, x, lnf_w, lnf_b);
  tensor_view<T const, B> const lnf(h.lnf);
  if (wte.pieces == 1) return kernels::matmul_forward(ex, h.logits, lnf, piece_view<B>(wte, 0), tensor_view<T const, B>{}, h.ws);
  index_t const N = h.logits.extent(0) * h.logits.extent(1), Vp = h.logits.extent(2);
  tensor_view<T const, B> const x2(h.lnf.data(), {N, wte.cols});
  for (int j = 0; j < wte.pieces; ++j) {
    tensor_view<T, B> const part(h.piece.data(), {N, wte.rows_of(j)});
    kernels::matmul_forward(ex, part, x2, piece_view<B>(wte, j), tensor_view<T const, B>{}, h.ws);
    copy_columns(ex, tensor_view<T, B>(h.logits.data(), {N, Vp}), j * wte.piece_rows, tensor_view<T const, B>(part), 0,
                 part.extent(1));
  }
}

// The LM head's products with the logits' gradient, piece by piece of wte: dlnf += dlogits wte
// (when wte is given) and dwte += dlogits^T lnf (when dwte is), one matmul_backward (or one of its
// halves) per piece. wte in pieces: dlnf sums the pieces' products in piece order (so not the bits
// of one GEMM over all of Vp), and a bf16 / f16 dlnf is rounded once per piece.
template <Backend B, class T>
void head_logit_products(exec<B> const& ex, head_views<B, T> const& h, kernels::row_table<T const> const* wte,
                         kernels::row_table<T> const* dwte) {
  using cview = tensor_view<T const, B>;
  index_t const N = h.dlogits.extent(0) * h.dlogits.extent(1), Vp = h.dlogits.extent(2), C = h.dlnf.extent(2);
  int const pieces = wte != nullptr ? wte->pieces : dwte->pieces;
  for (int j = 0; j < pieces; ++j) {
    index_t const rows = wte != nullptr ? wte->rows_of(j) : dwte->rows_of(j);
    tensor_view<T, B> part(h.dlogits.data(), {N, Vp});
    if (pieces > 1) {
      part = tensor_view<T, B>(h.piece.data(), {N, rows});
      copy_columns(ex, part, 0, cview(h.dlogits.data(), {N, Vp}), j * (wte != nullptr ? wte->piece_rows : dwte->piece_rows),
                   rows);
    }
    tensor_view<T, B> const dlnf(h.dlnf.data(), {N, C});
    cview const lnf(h.lnf.data(), {N, C});
    if (wte != nullptr && dwte != nullptr)
      kernels::matmul_backward(ex, dlnf, piece_view<B>(*dwte, j), tensor_view<T, B>{}, cview(part), lnf,
                               piece_view<B>(*wte, j), h.ws);
    else if (wte != nullptr)
      kernels::matmul_backward_input(ex, dlnf, cview(part), piece_view<B>(*wte, j), h.ws);
    else
      kernels::matmul_backward_weight(ex, piece_view<B>(*dwte, j), tensor_view<T, B>{}, cview(part), lnf, h.ws);
  }
}

// dres = d x_L (overwritten); dwte += the head's share of wte's gradient (into the tied buffer,
// zeroed by the caller, or into wte's gradient itself); dlnf_w, dlnf_b +=.
template <Backend B, class T>
void head_backward(exec<B> const& ex, tensor_view<T, B> dres, tensor_view<T const, B> x, head_views<B, T> const& h,
                   tensor_view<T const, B> lnf_w, kernels::row_table<T const> const& wte,
                   kernels::row_table<T> const& dwte, tensor_view<T, B> dlnf_w, tensor_view<T, B> dlnf_b) {
  zero_fill(ex, h.dlnf);
  head_logit_products(ex, h, &wte, &dwte);
  zero_fill(ex, dres);
  kernels::layernorm_backward(ex, dres, dlnf_w, dlnf_b, tensor_view<T const, B>(h.dlnf), x, lnf_w,
                              tensor_view<float const, B>(h.lnf_mean), tensor_view<float const, B>(h.lnf_rstd), h.ws);
}

// head_backward in two passes (gpt_options::split_backward), the same kernels' halves on the same
// values: the same bits. The input pass writes dres, and the head's share of wte's gradient when
// it goes to the tied buffer (`tied`: an activation, so the pass writes no parameter gradient);
// the weight pass lnf's gradients, and the share into wte's gradient itself (`dwte`) without the
// buffer. What the weight pass reads (dlnf, lnf's statistics; without the buffer the logits'
// gradient and lnf) the plan keeps until it.
template <Backend B, class T>
void head_backward_input(exec<B> const& ex, tensor_view<T, B> dres, tensor_view<T const, B> x,
                         head_views<B, T> const& h, tensor_view<T const, B> lnf_w,
                         kernels::row_table<T const> const& wte, kernels::row_table<T> const* tied) {
  zero_fill(ex, h.dlnf);
  head_logit_products(ex, h, &wte, tied);
  zero_fill(ex, dres);
  kernels::layernorm_backward_input(ex, dres, tensor_view<T const, B>(h.dlnf), x, lnf_w,
                                    tensor_view<float const, B>(h.lnf_mean), tensor_view<float const, B>(h.lnf_rstd));
}
template <Backend B, class T>
void head_backward_weights(exec<B> const& ex, tensor_view<T const, B> x, head_views<B, T> const& h,
                           kernels::row_table<T> const* dwte, tensor_view<T, B> dlnf_w, tensor_view<T, B> dlnf_b) {
  if (dwte != nullptr) head_logit_products<B, T>(ex, h, nullptr, dwte);
  kernels::layernorm_backward_weight(ex, dlnf_w, dlnf_b, tensor_view<T const, B>(h.dlnf), x,
                                     tensor_view<float const, B>(h.lnf_mean), tensor_view<float const, B>(h.lnf_rstd),
                                     h.ws);
}

}  // namespace tide::nn::detail
