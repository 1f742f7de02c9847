#pragma once
// The activation plan of tide::nn::gpt: every activation and activation gradient of one
// micro-batch's step (forward, then backward) as a tensor of a memory::lifetime_planner, with
// its op range. The tensors and lifetimes depend on the config and the options; the sizes follow
// (B, T). The model keeps one copy of the plan per in-flight micro-batch (its slots), so the
// plan's op order is one micro-batch's, whichever stages of other micro-batches run in between.
// The kernels' scratch is planned with them (kernels/scratch.hpp): one tensor per block's
// forward, per block's backward (with its recompute), for the head and for the embedding's
// backward, each live while its kernels run and sized by their queries (gpt_scratch).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/scratch.hpp"
#include "tide/memory/lifetime_planner.hpp"
#include "tide/nn/gpt_config.hpp"

namespace tide::nn {

// Bytes of kernel scratch the model's kernels ask for (their *_scratch_bytes queries) at one
// (B, T), per scratch tensor of the plan: a block's forward, a block's backward (and its
// recompute), the head (final LayerNorm, logits, loss and their backward), the embedding's
// backward. nn::gpt computes it from its exec (gpt_scratch_of); all 0: none planned.
struct gpt_scratch {
  std::size_t block_forward = 0, block_backward = 0, head = 0, encoder_backward = 0;
};

}  // namespace tide::nn

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
  // Block l's backward (blocks run L-1 .. 0) starts with its recompute (a recomputed block runs
  // its forward ops 0 .. 5 again there; others do nothing), then op k: 0 mlp.proj, 1 fc + gelu,
  // 2 ln2, 3 attn.proj, 4 attention, 5 qkv, 6 ln1.
  [[nodiscard]] constexpr int recompute(int l) const { return 6 + 8 * L + 8 * (L - 1 - l); }
  [[nodiscard]] constexpr int bwd(int l, int k) const { return recompute(l) + 1 + k; }
  [[nodiscard]] constexpr int encoder_bwd() const { return 6 + 16 * L; }
  // With the backward split in two: every weight pass, which may run any time after its block's
  // input pass (and beside other blocks' passes of the same micro-batch on other stages). What a
  // weight pass reads lives to here, so nothing later in the plan reuses its memory.
  [[nodiscard]] constexpr int weights() const { return 7 + 16 * L; }
  // The last forward op of block b (embedding_block .. L, L: the head with its loss).
  [[nodiscard]] constexpr int fwd_end(int b) const { return b < 0 ? encoder() : b < L ? fwd(b, 7) : classifier(); }
  // The first backward op of block b (0 .. L).
  [[nodiscard]] constexpr int bwd_start(int b) const { return b < L ? recompute(b) : head_bwd(); }
};

// The activations of one transformer block (forward) and its activation gradients (backward).
struct block_tensors {
  memory::tensor_id ln1, ln1_mean, ln1_rstd, qkv, atty, lse, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu,
      fcproj, res3;
  memory::tensor_id dfch, dln2, datty, dqkv, dln1;
  memory::tensor_id scratch;  // the kernels' scratch: the forward's, or the backward's
  // With the backward split: d x_{l+1} and d res2 as the input pass saw them (the residual
  // stream's gradient changes in place), and the weight pass's scratch.
  memory::tensor_id dout, dres2, wscratch;
};

// One block's activations (forward) and activation gradients (backward) for one micro-batch.
template <Backend B, class T>
struct block_views {
  tensor_view<T, B> ln1, qkv, atty, attproj, res2, ln2, fch, fch_gelu, fcproj, res3;  // (B, T, C|3C|4C)
  tensor_view<float, B> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;                      // (B, T)
  tensor_view<float, B> lse;                                                          // (B, NH, T)
  tensor_view<T, B> dfch, dln2, datty, dqkv, dln1;
  kernels::scratch<B> ws;  // the kernels' scratch (forward, or backward with its recompute)
  tensor_view<T, B> dout, dres2;  // (B, T, C), with the backward split; empty otherwise
  kernels::scratch<B> wws;        // the weight pass's scratch, with the backward split
};

template <Backend B, class T>
struct head_views {
  tensor_view<T, B> lnf, logits, dlogits;  // (B, T, C), (B, T, Vp), (B, T, Vp) (may be logits)
  tensor_view<float, B> lnf_mean, lnf_rstd, losses;  // (B, T)
  tensor_view<T, B> dlnf;                  // (B, T, C)
  tensor_view<T, B> tied;                  // (Vp, C): the head's share of wte's gradient; empty without the buffer
  tensor_view<T, B> piece;                 // (B, T, R): one wte piece's logits; empty when wte is whole
  kernels::scratch<B> ws;                  // the head's kernels' scratch, forward and backward
};

class gpt_activation_plan {
 public:
  // How an activation's size follows (B, T); vpc (the head's wte gradient) does not.
  enum class extent : std::uint8_t { btc, bt, bt3c, bt4c, bnht, btvp, vpc, btr, ws_forward, ws_backward, ws_head,
                                     ws_encoder };

  // tied_buffer: the head's share of wte's gradient gets its own tensor (has_tied_buffer). recompute,
  // offload, split: gpt_options::recompute, offload_activations (checked) and split_backward.
  gpt_activation_plan(gpt_config const& c, bool keep_logits, bool tied_buffer, std::size_t element_bytes,
                      std::size_t alignment, block_set const& recompute = {}, block_set const& offload = {},
                      bool split = false)
      : config_(c), planner_(alignment), has_tied_(tied_buffer), split_(split), alignment_(alignment) {
    register_tensors(keep_logits, element_bytes, recompute, offload);
    sizes_.resize(kinds_.size());
  }

  // Sizes every tensor for (Bn, Tn), the kernels' scratch as `scratch` says, and places them:
  // offsets(), footprint() and peak_live() are then that plan's. No allocation (the planner and
  // the size list are reserved).
  void replan(index_t Bn, index_t Tn, gpt_scratch const& scratch = {}) {
    scratch_ = scratch;
    unplanned_ = 0;
    for (std::size_t i = 0; i < kinds_.size(); ++i) {
      sizes_[i] = bytes_of(kinds_[i], Bn, Tn);
      unplanned_ += sizes_[i];
    }
    memory::memory_plan const plan = planner_.replan(sizes_);
    offsets_.assign(plan.offsets().begin(), plan.offsets().end());
    footprint_ = plan.footprint();
    peak_live_ = plan.peak_live();
    host_bytes_ = 0;  // the offloaded activations, one after another
    for (auto& block : moves_)
      for (move& m : block) {
        m.host_offset = host_bytes_;
        host_bytes_ += round_up(sizes_[m.forward.index], alignment_);
      }
  }

  [[nodiscard]] std::size_t offset(memory::tensor_id id) const noexcept { return offsets_[id.index]; }
  [[nodiscard]] std::span<std::size_t const> offsets() const noexcept { return offsets_; }
  [[nodiscard]] std::size_t footprint() const noexcept { return footprint_; }
  [[nodiscard]] std::size_t peak_live() const noexcept { return peak_live_; }
  [[nodiscard]] std::size_t unplanned() const noexcept { return unplanned_; }
  [[nodiscard]] gpt_scratch const& scratch() const noexcept { return scratch_; }
  [[nodiscard]] std::size_t bytes(memory::tensor_id id) const noexcept { return sizes_[id.index]; }
  // Host bytes the offloaded activations take (0 without offload_activations).
  [[nodiscard]] std::size_t host_bytes() const noexcept { return host_bytes_; }
  [[nodiscard]] std::size_t size() const noexcept { return kinds_.size(); }
  [[nodiscard]] memory::lifetime_planner const& planner() const noexcept { return planner_; }
  // Whether `tied` names a tensor (the (Vp, C) tied gradient buffer).
  [[nodiscard]] bool has_tied() const noexcept { return has_tied_; }
  [[nodiscard]] bool split() const noexcept { return split_; }

  // Block l's tensors as its forward writes them, and as its backward reads them: the same ids
  // unless the block is recomputed or offloaded (then the backward's are other tensors, planned
  // from the recompute or the prefetch on).
  [[nodiscard]] block_tensors const& block(int l) const noexcept { return blocks_[static_cast<std::size_t>(l)]; }
  [[nodiscard]] block_tensors const& block_back(int l) const noexcept { return back_[static_cast<std::size_t>(l)]; }
  // x_l, the input of block l (l = 0 .. L): the embeddings for l = 0, else block l-1's output;
  // as the forward reads it, and as the backward does.
  [[nodiscard]] memory::tensor_id residual_in(int l) const noexcept { return l == 0 ? encoded : block(l - 1).res3; }
  [[nodiscard]] memory::tensor_id residual_in_back(int l) const noexcept {
    return l == 0 ? encoded_back : block_back(l - 1).res3;
  }
  [[nodiscard]] bool recomputed(int l) const noexcept { return recompute_[static_cast<std::size_t>(l)] != 0; }

  // One offloaded activation: its forward tensor goes to host_offset, and comes back into its
  // backward tensor.
  struct move {
    memory::tensor_id forward, backward;
    std::size_t host_offset = 0;
  };
  // The activations block b (embedding_block .. L-1) offloads; empty when it keeps them.
  [[nodiscard]] std::span<move const> moves(int b) const noexcept {
    return moves_[static_cast<std::size_t>(b - embedding_block)];
  }

  // Views of tensors in the slot starting at `base`, for (Bn, Tn).
  template <class U, Backend B>
  [[nodiscard]] tensor_view<U, B> view_at(std::byte* base, memory::tensor_id id, shape s) const noexcept {
    return tensor_view<U, B>(reinterpret_cast<U*>(base + offsets_[id.index]), s);
  }
  // A scratch tensor as kernel scratch.
  template <Backend B>
  [[nodiscard]] kernels::scratch<B> scratch_at(std::byte* base, memory::tensor_id id) const noexcept {
    return {base + offsets_[id.index], sizes_[id.index]};
  }
  // back: the backward's tensors (block_back), else the forward's.
  template <Backend B, class T>
  [[nodiscard]] block_views<B, T> block_at(std::byte* base, int l, index_t Bn, index_t Tn, bool back) const noexcept {
    block_tensors const& b = back ? block_back(l) : block(l);
    index_t const C = config_.channels;
    shape const btc{Bn, Tn, C}, bt{Bn, Tn}, bt3c{Bn, Tn, 3 * C}, bt4c{Bn, Tn, 4 * C};
    auto const t = [&](memory::tensor_id id, shape s) { return view_at<T, B>(base, id, s); };
    auto const f = [&](memory::tensor_id id, shape s) { return view_at<float, B>(base, id, s); };
    return {t(b.ln1, btc),          t(b.qkv, bt3c),     t(b.atty, btc),      t(b.attproj, btc), t(b.res2, btc),
            t(b.ln2, btc),          t(b.fch, bt4c),     t(b.fch_gelu, bt4c), t(b.fcproj, btc),  t(b.res3, btc),
            f(b.ln1_mean, bt),      f(b.ln1_rstd, bt),  f(b.ln2_mean, bt),   f(b.ln2_rstd, bt),
            f(b.lse, {Bn, index_t{config_.heads}, Tn}), t(b.dfch, bt4c),     t(b.dln2, btc),    t(b.datty, btc),
            t(b.dqkv, bt3c),        t(b.dln1, btc),     scratch_at<B>(base, b.scratch),
            split_ ? t(b.dout, btc) : tensor_view<T, B>{}, split_ ? t(b.dres2, btc) : tensor_view<T, B>{},
            split_ ? scratch_at<B>(base, b.wscratch) : kernels::scratch<B>{}};
  }
  template <Backend B, class T>
  [[nodiscard]] head_views<B, T> head_at(std::byte* base, index_t Bn, index_t Tn) const noexcept {
    index_t const C = config_.channels, Vp = config_.padded_vocab;
    shape const btc{Bn, Tn, C}, bt{Bn, Tn}, btv{Bn, Tn, Vp};
    auto const t = [&](memory::tensor_id id, shape s) { return view_at<T, B>(base, id, s); };
    auto const f = [&](memory::tensor_id id, shape s) { return view_at<float, B>(base, id, s); };
    return {t(lnf, btc),     t(logits, btv), t(dlogits, btv), f(lnf_mean, bt),
            f(lnf_rstd, bt), f(losses, bt),  t(dlnf, btc),
            has_tied_ ? t(tied, {Vp, C}) : tensor_view<T, B>{},
            config_.wte_pieces > 1 ? t(piece, {Bn, Tn, wte_piece_rows(config_)}) : tensor_view<T, B>{},
            scratch_at<B>(base, head_scratch)};
  }

  // The tensors around the blocks; `tied` only when has_tied(), `piece` only with wte in pieces.
  // encoded_back: x_0 as the backward reads it (encoded unless the embedding block is offloaded).
  memory::tensor_id encoded, encoded_back, lnf, lnf_mean, lnf_rstd, logits, dlogits, losses, dlnf, dres, tied, piece;
  memory::tensor_id head_scratch, encoder_scratch;  // the head's and the embedding backward's kernel scratch

 private:
  memory::tensor_id add(std::string const& name, extent kind, std::size_t element_bytes, int first, int last) {
    memory::tensor_id const id = planner_.add(name, element_bytes, first, last);  // resized by replan
    kinds_.push_back(kind_bytes{kind, element_bytes});
    return id;
  }

  void register_tensors(bool keep_logits, std::size_t t, block_set const& recompute, block_set const& offload) {
    op_numbers const op{config_.layers};
    int const L = config_.layers;
    std::size_t const f = sizeof(float);
    planner_.reserve(static_cast<std::size_t>(45 * L + 14), static_cast<std::size_t>(L) * 360 + 128);
    kinds_.reserve(static_cast<std::size_t>(45 * L + 14));
    blocks_.resize(static_cast<std::size_t>(L));
    back_.resize(static_cast<std::size_t>(L));
    recompute_.assign(static_cast<std::size_t>(L), 0);
    moves_.assign(static_cast<std::size_t>(L + 1), {});
    for (int l : recompute.blocks()) recompute_[static_cast<std::size_t>(l)] = 1;
    // The last op of a tensor a weight pass also reads: its own last read, or the weight passes'.
    auto const kept = [&](int last) { return split_ ? op.weights() : last; };

    // An activation the forward writes at `first`, the forward last reads at `fwd_last` and the
    // backward last reads at `last`, of block b. Kept: one tensor over [first, last]. Offloaded
    // (`saved` of an offloaded block): [first, end of the next block's forward] (its copy to
    // the host runs meanwhile), then a second tensor from the prefetch, one block ahead of the
    // backward that reads it first, to `last`.
    auto const saved = [&](std::string const& name, extent kind, std::size_t bytes, int b, int first, int last,
                           memory::tensor_id& fwd, memory::tensor_id& back) {
      if (!offload.contains(b)) {
        fwd = back = add(name, kind, bytes, first, last);
        return;
      }
      fwd = add(name, kind, bytes, first, op.fwd_end(b + 1));
      back = add(name + ".back", kind, bytes, op.bwd_start(std::min(b + 2, L)), last);
      moves_[static_cast<std::size_t>(b - embedding_block)].push_back({fwd, back});
    };
    // x_0 is read by block 0's ln1 (forward and backward), its first residual and its recompute.
    saved("encoded", extent::btc, t, embedding_block, op.encoder(), kept(op.bwd(0, 6)), encoded, encoded_back);
    for (int l = 0; l < L; ++l) {
      block_tensors& b = blocks_[static_cast<std::size_t>(l)];
      block_tensors& k = back_[static_cast<std::size_t>(l)];
      auto const name = [l](char const* what) { return tide::detail::concat('h', l, '.', what); };
      // What the backward reads of the block's own forward: kept (perhaps offloaded), or, when
      // the block is recomputed, a forward-only tensor and a second one the recompute fills.
      auto const inner = [&](char const* what, extent kind, std::size_t bytes, int first, int fwd_last, int last,
                             memory::tensor_id& fwd, memory::tensor_id& back) {
        if (!recomputed(l)) return saved(name(what), kind, bytes, l, first, last, fwd, back);
        fwd = add(name(what), kind, bytes, first, fwd_last);
        back = add(name(what) + ".re", kind, bytes, op.recompute(l), last);
      };
      inner("ln1", extent::btc, t, op.fwd(l, 0), op.fwd(l, 1), kept(op.bwd(l, 5)), b.ln1, k.ln1);
      inner("ln1.mean", extent::bt, f, op.fwd(l, 0), op.fwd(l, 0), kept(op.bwd(l, 6)), b.ln1_mean, k.ln1_mean);
      inner("ln1.rstd", extent::bt, f, op.fwd(l, 0), op.fwd(l, 0), kept(op.bwd(l, 6)), b.ln1_rstd, k.ln1_rstd);
      inner("qkv", extent::bt3c, t, op.fwd(l, 1), op.fwd(l, 2), op.bwd(l, 5), b.qkv, k.qkv);
      inner("atty", extent::btc, t, op.fwd(l, 2), op.fwd(l, 3), kept(op.bwd(l, 4)), b.atty, k.atty);
      inner("att.lse", extent::bnht, f, op.fwd(l, 2), op.fwd(l, 2), op.bwd(l, 4), b.lse, k.lse);
      // attproj and fcproj die inside the forward; a recompute writes attproj again (for res2).
      b.attproj = k.attproj = add(name("attproj"), extent::btc, t, op.fwd(l, 3), op.fwd(l, 4));
      if (recomputed(l)) k.attproj = add(name("attproj.re"), extent::btc, t, op.recompute(l), op.recompute(l));
      inner("res2", extent::btc, t, op.fwd(l, 4), op.fwd(l, 7), kept(op.bwd(l, 2)), b.res2, k.res2);
      inner("ln2", extent::btc, t, op.fwd(l, 4), op.fwd(l, 5), kept(op.bwd(l, 1)), b.ln2, k.ln2);
      inner("ln2.mean", extent::bt, f, op.fwd(l, 4), op.fwd(l, 4), kept(op.bwd(l, 2)), b.ln2_mean, k.ln2_mean);
      inner("ln2.rstd", extent::bt, f, op.fwd(l, 4), op.fwd(l, 4), kept(op.bwd(l, 2)), b.ln2_rstd, k.ln2_rstd);
      inner("fch", extent::bt4c, t, op.fwd(l, 5), op.fwd(l, 5), op.bwd(l, 1), b.fch, k.fch);
      inner("fch_gelu", extent::bt4c, t, op.fwd(l, 5), op.fwd(l, 6), kept(op.bwd(l, 0)), b.fch_gelu, k.fch_gelu);
      b.fcproj = k.fcproj = add(name("fcproj"), extent::btc, t, op.fwd(l, 6), op.fwd(l, 7));
      // x_{l+1}: read by the next block's forward, recompute and ln1 backward, or by lnf's.
      int const res3_last = l + 1 < L ? op.bwd(l + 1, 6) : op.lnf_bwd();
      saved(name("res3"), extent::btc, t, l, op.fwd(l, 7), kept(res3_last), b.res3, k.res3);
      b.dfch = k.dfch = add(name("dfch"), extent::bt4c, t, op.bwd(l, 0), kept(op.bwd(l, 1)));
      b.dln2 = k.dln2 = add(name("dln2"), extent::btc, t, op.bwd(l, 1), kept(op.bwd(l, 2)));
      b.datty = k.datty = add(name("datty"), extent::btc, t, op.bwd(l, 3), op.bwd(l, 4));
      b.dqkv = k.dqkv = add(name("dqkv"), extent::bt3c, t, op.bwd(l, 4), kept(op.bwd(l, 5)));
      b.dln1 = k.dln1 = add(name("dln1"), extent::btc, t, op.bwd(l, 5), kept(op.bwd(l, 6)));
      if (split_) {
        b.dout = k.dout = add(name("dout"), extent::btc, t, op.bwd(l, 0), op.weights());
        b.dres2 = k.dres2 = add(name("dres2"), extent::btc, t, op.bwd(l, 2), op.weights());
        b.wscratch = k.wscratch = add(name("wscratch"), extent::ws_backward, 1, op.bwd(l, 0), op.weights());
      }
      // The kernels' scratch: the forward's matmuls and attention (ops 1 .. 6), the backward's
      // from its recompute on.
      b.scratch = add(name("scratch"), extent::ws_forward, 1, op.fwd(l, 1), op.fwd(l, 6));
      k.scratch = add(name("dscratch"), extent::ws_backward, 1, op.recompute(l), op.bwd(l, 6));
    }
    int const last = op.encoder_bwd();
    // Without the tied buffer a split head's weight pass also takes the logits' gradient and lnf.
    auto const head_kept = [&](int last_read) { return has_tied_ ? last_read : kept(last_read); };
    lnf = add("lnf", extent::btc, t, op.lnf(), head_kept(op.head_bwd()));
    lnf_mean = add("lnf.mean", extent::bt, f, op.lnf(), kept(op.lnf_bwd()));
    lnf_rstd = add("lnf.rstd", extent::bt, f, op.lnf(), kept(op.lnf_bwd()));
    if (keep_logits) {
      logits = add("logits", extent::btvp, t, op.head(), last);
      dlogits = add("dlogits", extent::btvp, t, op.classifier(), head_kept(op.head_bwd()));
    } else {
      logits = dlogits = add("logits", extent::btvp, t, op.head(), head_kept(op.head_bwd()));
    }
    losses = add("losses", extent::bt, f, op.classifier(), last);
    dlnf = add("dlnf", extent::btc, t, op.head_bwd(), kept(op.lnf_bwd()));
    dres = add("dresidual", extent::btc, t, op.lnf_bwd(), kept(last));
    // The head's share of wte's gradient, kept apart until the embedding's backward adds it
    // (the tied gradient: one order of additions for the whole model and for stages).
    if (has_tied_) tied = add("tied.dwte", extent::vpc, t, op.head_bwd(), kept(last));
    // One wte piece's logits (forward) or their gradient (backward), in turn.
    if (config_.wte_pieces > 1) piece = add("logits.piece", extent::btr, t, op.head(), head_kept(op.head_bwd()));
    head_scratch = add("head.scratch", extent::ws_head, 1, op.head(), kept(op.lnf_bwd()));
    encoder_scratch = add("encoder.dscratch", extent::ws_encoder, 1, op.encoder_bwd(), kept(op.encoder_bwd()));
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
      case extent::btr: n = Bn * Tn * wte_piece_rows(config_); break;
      // Scratch: at least a byte (the planner takes no empty tensor).
      case extent::ws_forward: return std::max<std::size_t>(scratch_.block_forward, 1);
      case extent::ws_backward: return std::max<std::size_t>(scratch_.block_backward, 1);
      case extent::ws_head: return std::max<std::size_t>(scratch_.head, 1);
      case extent::ws_encoder: return std::max<std::size_t>(scratch_.encoder_backward, 1);
    }
    return static_cast<std::size_t>(n) * a.element_bytes;
  }

  gpt_config config_;  // resolved
  memory::lifetime_planner planner_;
  gpt_scratch scratch_{};  // of the current plan
  bool has_tied_ = false;
  bool split_ = false;
  std::size_t alignment_;
  std::vector<block_tensors> back_;             // by layer: the backward's ids
  std::vector<std::uint8_t> recompute_;         // by layer
  std::vector<std::vector<move>> moves_;        // by block + 1: what it offloads
  std::size_t host_bytes_ = 0;
  std::vector<kind_bytes> kinds_;      // by tensor id
  std::vector<std::size_t> sizes_;     // by tensor id, of the current plan
  std::vector<std::size_t> offsets_;   // by tensor id, of the current plan
  std::vector<block_tensors> blocks_;  // by layer
  std::size_t footprint_ = 0, peak_live_ = 0, unplanned_ = 0;
};

}  // namespace tide::nn::detail

namespace tide::nn {

// Bytes of a model's activation buffer for (Bn, Tn), without building the model: in_flight
// copies of one plan, with the kernels' scratch `scratch` (gpt_scratch_of(ex, config, Bn, Tn) on
// the exec the model will run on: a CUDA exec with cuBLAS asks for attention's (NH, T, T) scores).
inline std::size_t activation_bytes(gpt_config const& c, gpt_options const& o, index_t Bn, index_t Tn,
                                    std::size_t element_bytes, gpt_scratch const& scratch = {}) {
  detail::gpt_activation_plan plan(resolve(c), o.keep_logits, has_tied_buffer(o), element_bytes, o.alignment,
                                   o.recompute, o.offload_activations, o.split_backward);
  plan.replan(Bn, Tn, scratch);
  auto const n = static_cast<std::size_t>(o.in_flight);
  return (n - 1) * round_up(plan.footprint(), o.alignment) + plan.footprint();
}

// The blocks to recompute so that a model's activations for (Bn, Tn) fit `budget` bytes, at the
// least recompute cost: the k cheapest blocks by forward_seconds (each block's measured forward,
// from pipeline::measure_blocks or any timer; empty: all equal, the earliest first), for the
// smallest k that fits. Everything else in `options` (offload_activations, in_flight, ...) is
// planned as given; options.recompute is ignored. Throws tide::error(budget) when even
// recomputing every block does not fit, with the smallest footprint in the message. `scratch`:
// the kernels' scratch the model will plan (gpt_scratch_of(ex, config, Bn, Tn)).
inline block_set recompute_within(gpt_config const& config, gpt_options options, index_t Bn, index_t Tn,
                                  std::size_t budget, std::span<double const> forward_seconds = {},
                                  std::size_t element_bytes = sizeof(float), gpt_scratch const& scratch = {}) {
  gpt_config const c = resolve(config);
  int const L = c.layers;
  TIDE_REQUIRE(forward_seconds.empty() || forward_seconds.size() == static_cast<std::size_t>(L),
               "recompute_within: ", forward_seconds.size(), " forward costs for ", L,
               " blocks; pass one per transformer block (0 .. L-1), or none");
  std::vector<int> order(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l) order[static_cast<std::size_t>(l)] = l;
  if (!forward_seconds.empty())
    std::ranges::stable_sort(order, {}, [&](int l) { return forward_seconds[static_cast<std::size_t>(l)]; });
  auto const bytes_with = [&](int k) {
    options.recompute = block_set(std::vector<int>(order.begin(), order.begin() + k));
    return activation_bytes(c, options, Bn, Tn, element_bytes, scratch);
  };
  if (bytes_with(0) <= budget) return {};
  std::size_t const least = bytes_with(L);
  TIDE_CHECK(least <= budget, budget, "recompute_within: the activations of (B, T) = (", Bn, ", ", Tn,
             ") need ", least, " bytes even with every block recomputed, over the budget of ", budget,
             " bytes; offload activations (gpt_options::offload_activations), or use a smaller batch or a larger "
             "budget");
  int lo = 0, hi = L;  // bytes_with(lo) > budget >= bytes_with(hi)
  while (hi - lo > 1) {
    int const mid = (lo + hi) / 2;
    (bytes_with(mid) <= budget ? hi : lo) = mid;
  }
  return block_set(std::vector<int>(order.begin(), order.begin() + hi));
}

}  // namespace tide::nn
