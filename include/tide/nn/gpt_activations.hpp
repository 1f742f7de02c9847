#pragma once
// The activation plan of tide::nn::gpt: every activation and activation gradient of one
// micro-batch's step (forward, then backward) as a tensor of a memory::lifetime_planner, with
// its op range. The tensors and lifetimes depend on L and keep_logits only; the sizes follow
// (B, T). The model keeps one copy of the plan per in-flight micro-batch (its slots), so the
// plan's op order is one micro-batch's, whichever stages of other micro-batches run in between.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/memory/lifetime_planner.hpp"
#include "tide/nn/gpt_config.hpp"

namespace tide::nn::detail {

// Op numbers of one micro-batch's step, forward then backward (the lifetimes' unit).
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

// The activations of one transformer block (forward) and its activation gradients (backward).
struct block_tensors {
  memory::tensor_id ln1, ln1_mean, ln1_rstd, qkv, atty, lse, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu,
      fcproj, res3;
  memory::tensor_id dfch, dln2, datty, dqkv, dln1;
};

// One block's activations (forward) and activation gradients (backward) for one micro-batch.
template <Backend B, class T>
struct block_views {
  tensor_view<T, B> ln1, qkv, atty, attproj, res2, ln2, fch, fch_gelu, fcproj, res3;  // (B, T, C|3C|4C)
  tensor_view<float, B> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;                      // (B, T)
  tensor_view<float, B> lse;                                                          // (B, NH, T)
  tensor_view<T, B> dfch, dln2, datty, dqkv, dln1;
};

template <Backend B, class T>
struct head_views {
  tensor_view<T, B> lnf, logits, dlogits;  // (B, T, C), (B, T, Vp), (B, T, Vp) (may be logits)
  tensor_view<float, B> lnf_mean, lnf_rstd, losses;  // (B, T)
  tensor_view<T, B> dlnf;                  // (B, T, C)
  tensor_view<T, B> tied;                  // (Vp, C): the head's share of wte's gradient; empty without the buffer
};

class gpt_activation_plan {
 public:
  // How an activation's size follows (B, T); vpc (the head's wte gradient) does not.
  enum class extent : std::uint8_t { btc, bt, bt3c, bt4c, bnht, btvp, vpc };

  // tied_buffer: the head's share of wte's gradient gets its own tensor (has_tied_buffer).
  gpt_activation_plan(gpt_config const& c, bool keep_logits, bool tied_buffer, std::size_t element_bytes,
                      std::size_t alignment)
      : config_(c), planner_(alignment), has_tied_(tied_buffer) {
    register_tensors(keep_logits, element_bytes);
    sizes_.resize(kinds_.size());
  }

  // Sizes every tensor for (Bn, Tn) and places them: offsets(), footprint() and peak_live() are
  // then that plan's. No allocation (the planner and the size list are reserved).
  void replan(index_t Bn, index_t Tn) {
    unplanned_ = 0;
    for (std::size_t i = 0; i < kinds_.size(); ++i) {
      sizes_[i] = bytes_of(kinds_[i], Bn, Tn);
      unplanned_ += sizes_[i];
    }
    memory::memory_plan const plan = planner_.replan(sizes_);
    offsets_.assign(plan.offsets().begin(), plan.offsets().end());
    footprint_ = plan.footprint();
    peak_live_ = plan.peak_live();
  }

  [[nodiscard]] std::size_t offset(memory::tensor_id id) const noexcept { return offsets_[id.index]; }
  [[nodiscard]] std::span<std::size_t const> offsets() const noexcept { return offsets_; }
  [[nodiscard]] std::size_t footprint() const noexcept { return footprint_; }
  [[nodiscard]] std::size_t peak_live() const noexcept { return peak_live_; }
  [[nodiscard]] std::size_t unplanned() const noexcept { return unplanned_; }
  [[nodiscard]] std::size_t size() const noexcept { return kinds_.size(); }
  [[nodiscard]] memory::lifetime_planner const& planner() const noexcept { return planner_; }
  // Whether `tied` names a tensor (the (Vp, C) tied gradient buffer).
  [[nodiscard]] bool has_tied() const noexcept { return has_tied_; }

  [[nodiscard]] block_tensors const& block(int l) const noexcept { return blocks_[static_cast<std::size_t>(l)]; }
  // x_l, the input of block l (l = 0 .. L): the embeddings for l = 0, else block l-1's output.
  [[nodiscard]] memory::tensor_id residual_in(int l) const noexcept { return l == 0 ? encoded : block(l - 1).res3; }

  // Views of tensors in the slot starting at `base`, for (Bn, Tn).
  template <class U, Backend B>
  [[nodiscard]] tensor_view<U, B> view_at(std::byte* base, memory::tensor_id id, shape s) const noexcept {
    return tensor_view<U, B>(reinterpret_cast<U*>(base + offsets_[id.index]), s);
  }
  template <Backend B, class T>
  [[nodiscard]] block_views<B, T> block_at(std::byte* base, int l, index_t Bn, index_t Tn) const noexcept {
    block_tensors const& b = block(l);
    index_t const C = config_.channels;
    shape const btc{Bn, Tn, C}, bt{Bn, Tn}, bt3c{Bn, Tn, 3 * C}, bt4c{Bn, Tn, 4 * C};
    auto const t = [&](memory::tensor_id id, shape s) { return view_at<T, B>(base, id, s); };
    auto const f = [&](memory::tensor_id id, shape s) { return view_at<float, B>(base, id, s); };
    return {t(b.ln1, btc),          t(b.qkv, bt3c),     t(b.atty, btc),      t(b.attproj, btc), t(b.res2, btc),
            t(b.ln2, btc),          t(b.fch, bt4c),     t(b.fch_gelu, bt4c), t(b.fcproj, btc),  t(b.res3, btc),
            f(b.ln1_mean, bt),      f(b.ln1_rstd, bt),  f(b.ln2_mean, bt),   f(b.ln2_rstd, bt),
            f(b.lse, {Bn, index_t{config_.heads}, Tn}), t(b.dfch, bt4c),     t(b.dln2, btc),    t(b.datty, btc),
            t(b.dqkv, bt3c),        t(b.dln1, btc)};
  }
  template <Backend B, class T>
  [[nodiscard]] head_views<B, T> head_at(std::byte* base, index_t Bn, index_t Tn) const noexcept {
    index_t const C = config_.channels, Vp = config_.padded_vocab;
    shape const btc{Bn, Tn, C}, bt{Bn, Tn}, btv{Bn, Tn, Vp};
    auto const t = [&](memory::tensor_id id, shape s) { return view_at<T, B>(base, id, s); };
    auto const f = [&](memory::tensor_id id, shape s) { return view_at<float, B>(base, id, s); };
    return {t(lnf, btc),     t(logits, btv), t(dlogits, btv), f(lnf_mean, bt),
            f(lnf_rstd, bt), f(losses, bt),  t(dlnf, btc),
            has_tied_ ? t(tied, {Vp, C}) : tensor_view<T, B>{}};
  }

  // The tensors around the blocks; `tied` only when has_tied().
  memory::tensor_id encoded, lnf, lnf_mean, lnf_rstd, logits, dlogits, losses, dlnf, dres, tied;

 private:
  memory::tensor_id add(std::string const& name, extent kind, std::size_t element_bytes, int first, int last) {
    memory::tensor_id const id = planner_.add(name, element_bytes, first, last);  // resized by replan
    kinds_.push_back(kind_bytes{kind, element_bytes});
    return id;
  }

  void register_tensors(bool keep_logits, std::size_t t) {
    op_numbers const op{config_.layers};
    int const L = config_.layers;
    std::size_t const f = sizeof(float);
    planner_.reserve(static_cast<std::size_t>(20 * L + 11), static_cast<std::size_t>(L) * 160 + 80);
    kinds_.reserve(static_cast<std::size_t>(20 * L + 11));
    // x_0 is read by block 0's ln1 (forward and backward) and its first residual.
    encoded = add("encoded", extent::btc, t, op.encoder(), op.bwd(0, 6));
    blocks_.resize(static_cast<std::size_t>(L));
    for (int l = 0; l < L; ++l) {
      block_tensors& b = blocks_[static_cast<std::size_t>(l)];
      auto const name = [l](char const* what) { return tide::detail::concat('h', l, '.', what); };
      b.ln1 = add(name("ln1"), extent::btc, t, op.fwd(l, 0), op.bwd(l, 5));
      b.ln1_mean = add(name("ln1.mean"), extent::bt, f, op.fwd(l, 0), op.bwd(l, 6));
      b.ln1_rstd = add(name("ln1.rstd"), extent::bt, f, op.fwd(l, 0), op.bwd(l, 6));
      b.qkv = add(name("qkv"), extent::bt3c, t, op.fwd(l, 1), op.bwd(l, 5));
      b.atty = add(name("atty"), extent::btc, t, op.fwd(l, 2), op.bwd(l, 4));
      b.lse = add(name("att.lse"), extent::bnht, f, op.fwd(l, 2), op.bwd(l, 4));
      b.attproj = add(name("attproj"), extent::btc, t, op.fwd(l, 3), op.fwd(l, 4));
      b.res2 = add(name("res2"), extent::btc, t, op.fwd(l, 4), op.bwd(l, 2));
      b.ln2 = add(name("ln2"), extent::btc, t, op.fwd(l, 4), op.bwd(l, 1));
      b.ln2_mean = add(name("ln2.mean"), extent::bt, f, op.fwd(l, 4), op.bwd(l, 2));
      b.ln2_rstd = add(name("ln2.rstd"), extent::bt, f, op.fwd(l, 4), op.bwd(l, 2));
      b.fch = add(name("fch"), extent::bt4c, t, op.fwd(l, 5), op.bwd(l, 1));
      b.fch_gelu = add(name("fch_gelu"), extent::bt4c, t, op.fwd(l, 5), op.bwd(l, 0));
      b.fcproj = add(name("fcproj"), extent::btc, t, op.fwd(l, 6), op.fwd(l, 7));
      // x_{l+1}: read by the next block's ln1 backward, or by lnf's backward.
      int const res3_last = l + 1 < L ? op.bwd(l + 1, 6) : op.lnf_bwd();
      b.res3 = add(name("res3"), extent::btc, t, op.fwd(l, 7), res3_last);
      b.dfch = add(name("dfch"), extent::bt4c, t, op.bwd(l, 0), op.bwd(l, 1));
      b.dln2 = add(name("dln2"), extent::btc, t, op.bwd(l, 1), op.bwd(l, 2));
      b.datty = add(name("datty"), extent::btc, t, op.bwd(l, 3), op.bwd(l, 4));
      b.dqkv = add(name("dqkv"), extent::bt3c, t, op.bwd(l, 4), op.bwd(l, 5));
      b.dln1 = add(name("dln1"), extent::btc, t, op.bwd(l, 5), op.bwd(l, 6));
    }
    int const last = op.encoder_bwd();
    lnf = add("lnf", extent::btc, t, op.lnf(), op.head_bwd());
    lnf_mean = add("lnf.mean", extent::bt, f, op.lnf(), op.lnf_bwd());
    lnf_rstd = add("lnf.rstd", extent::bt, f, op.lnf(), op.lnf_bwd());
    if (keep_logits) {
      logits = add("logits", extent::btvp, t, op.head(), last);
      dlogits = add("dlogits", extent::btvp, t, op.classifier(), op.head_bwd());
    } else {
      logits = dlogits = add("logits", extent::btvp, t, op.head(), op.head_bwd());
    }
    losses = add("losses", extent::bt, f, op.classifier(), last);
    dlnf = add("dlnf", extent::btc, t, op.head_bwd(), op.lnf_bwd());
    dres = add("dresidual", extent::btc, t, op.lnf_bwd(), last);
    // The head's share of wte's gradient, kept apart until the embedding's backward adds it
    // (the tied gradient: one order of additions for the whole model and for stages).
    if (has_tied_) tied = add("tied.dwte", extent::vpc, t, op.head_bwd(), last);
  }

  struct kind_bytes {
    extent kind;
    std::size_t element_bytes;
  };

  [[nodiscard]] std::size_t bytes_of(kind_bytes const& a, index_t Bn, index_t Tn) const noexcept {
    index_t const C = config_.channels;
    index_t n = 0;
    switch (a.kind) {
      case extent::btc: n = Bn * Tn * C; break;
      case extent::bt: n = Bn * Tn; break;
      case extent::bt3c: n = Bn * Tn * 3 * C; break;
      case extent::bt4c: n = Bn * Tn * 4 * C; break;
      case extent::bnht: n = Bn * config_.heads * Tn; break;
      case extent::btvp: n = Bn * Tn * config_.padded_vocab; break;
      case extent::vpc: n = index_t{config_.padded_vocab} * C; break;
    }
    return static_cast<std::size_t>(n) * a.element_bytes;
  }

  gpt_config config_;  // resolved
  memory::lifetime_planner planner_;
  bool has_tied_ = false;
  std::vector<kind_bytes> kinds_;      // by tensor id
  std::vector<std::size_t> sizes_;     // by tensor id, of the current plan
  std::vector<std::size_t> offsets_;   // by tensor id, of the current plan
  std::vector<block_tensors> blocks_;  // by layer
  std::size_t footprint_ = 0, peak_live_ = 0, unplanned_ = 0;
};

// Which blocks of which micro-batch slot ran forward and not yet backward: what
// forward_blocks / backward_blocks check their ranges and order against.
class stage_slots {
 public:
  stage_slots(int layers, int in_flight)
      : layers_(layers), in_flight_(in_flight),
        forwarded_(static_cast<std::size_t>(in_flight) * static_cast<std::size_t>(layers + 2), 0) {}

  void check_micro(char const* op, int micro) const {
    TIDE_REQUIRE(micro >= 0 && micro < in_flight_, op, ": micro = ", micro, " but options.in_flight = ", in_flight_,
                 "; pass a micro-batch slot in [0, in_flight), or construct the model with a larger "
                 "gpt_options::in_flight");
  }
  void check_range(char const* op, int first, int last, int micro) const {
    TIDE_REQUIRE(first >= embedding_block && first <= last && last <= layers_, op, "(first = ", first, ", last = ",
                 last, "): pass embedding_block (-1) <= first <= last <= head_block (", layers_, ")");
    check_micro(op, micro);
  }
  // Backward of first .. last: each ran forward, and the block after them (if it ran forward
  // here: a pipeline stage never runs the others) already went back.
  void check_backward(char const* op, int first, int last, int micro) const {
    for (int b = first; b <= last; ++b)
      TIDE_REQUIRE(forwarded(b, micro), op, ": block ", b, " of micro-batch slot ", micro,
                   " has no forward to go back through (none ran, the forward had no targets, or its backward "
                   "already ran); run forward(ex, tokens, targets), or forward_blocks over the range with targets "
                   "when it holds the head, first");
    TIDE_REQUIRE(last == layers_ || !forwarded(last + 1, micro), op, ": block ", last + 1, " of micro-batch slot ",
                 micro, " ran forward but not backward; backward goes from the head down: call backward_blocks over "
                 "the blocks after ", last, " first");
  }

  void set(int first, int last, int micro, bool ran) noexcept {
    for (int b = first; b <= last; ++b) forwarded_[index(b, micro)] = ran ? 1 : 0;
  }
  void clear() noexcept { std::fill(forwarded_.begin(), forwarded_.end(), std::uint8_t{0}); }
  [[nodiscard]] bool forwarded(int block, int micro) const noexcept { return forwarded_[index(block, micro)] != 0; }

 private:
  [[nodiscard]] std::size_t index(int block, int micro) const noexcept {
    return static_cast<std::size_t>(micro) * static_cast<std::size_t>(layers_ + 2) +
           static_cast<std::size_t>(block - embedding_block);
  }

  int layers_;
  int in_flight_;
  std::vector<std::uint8_t> forwarded_;  // [slot][block + 1]
};

}  // namespace tide::nn::detail
