#pragma once
// nn::gpt's passes, out of line (the class is in nn/gpt.hpp, which includes this file): the
// activations planned for a batch, the parameters' first values, forward and backward block by
// block through the hooks, the activations' copies out and back when they are offloaded, and
// the gradients zeroed.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "tide/nn/gpt.hpp"

namespace tide::nn {

template <Backend B, Element T, class Hooks>
std::vector<std::int32_t> gpt<B, T, Hooks>::generate(exec<B> const& ex, std::span<std::int32_t const> prompt, int n,
                                                     float temperature, std::uint64_t seed) {
  index_t const Vp = config_.padded_vocab;
  auto const one_sequence = [](std::int32_t const* ids, std::span<std::int32_t const> w) {
    return token_view(ids, {index_t{1}, static_cast<index_t>(w.size())});
  };
  if constexpr (!B::is_device) {
    auto const forward_row = [&](std::span<std::int32_t const> w, index_t used) -> T const* {
      forward(ex, one_sequence(w.data(), w));
      return logits().data() + (used - 1) * Vp;
    };
    return detail::generate_tokens(config_, prompt, n, temperature, seed, forward_row);
  } else {
    detail::arena_block<B> tokens;  // the window, on the device
    std::vector<T> row(static_cast<std::size_t>(Vp));
    auto const forward_row = [&](std::span<std::int32_t const> w, index_t used) -> T const* {
      if (!tokens) tokens = detail::arena_block<B>(*arena_, w.size_bytes(), options_.alignment);
      memory::write_from_host(ex, tokens.data(), w.data(), w.size_bytes());
      forward(ex, one_sequence(reinterpret_cast<std::int32_t const*>(tokens.data()), w));
      memory::read_to_host(ex, row.data(), logits().data() + (used - 1) * Vp, row.size() * sizeof(T));
      return row.data();
    };
    return detail::generate_tokens(config_, prompt, n, temperature, seed, forward_row);
  }
}

template <Backend B, Element T, class Hooks>
void gpt<B, T, Hooks>::prepare(exec<B> const& ex, index_t Bn, index_t Tn) {
  gpt_scratch const scratch = gpt_scratch_of<T>(ex, config_, Bn, Tn);  // depends on ex's threads on the host
  if (Bn == batch_ && Tn == seq_ && activations_ && scratch_fits(scratch)) return;
  batch_ = seq_ = 0;
  head_slot_ = -1;
  stages_.clear();
  for (slot_state& s : slots_) s = {};
  report_ = {};
  release_activation_host();  // no copy reads the old buffer any more
  activations_.release();
  plan_.replan(Bn, Tn, scratch);
  auto const n = static_cast<std::size_t>(options_.in_flight);
  std::size_t const stride = round_up(plan_.footprint(), options_.alignment);
  std::size_t const bytes = (n - 1) * stride + plan_.footprint();  // in_flight = 1: the plan
  activations_ = detail::arena_block<B>(*arena_, bytes, options_.alignment);
  if (!options_.offload_activations.empty()) {
    try {
      reserve_activation_host(plan_.host_bytes());
    } catch (...) {  // no host memory for them: no activations either, as above
      activations_.release();
      throw;
    }
  }
  batch_ = Bn;
  seq_ = Tn;
  report_ = {Bn, Tn, plan_.size(), bytes, n * plan_.peak_live(), n * plan_.unplanned(), options_.in_flight, stride,
             plan_.host_bytes()};
}

template <Backend B, Element T, class Hooks>
void gpt<B, T, Hooks>::initialise(thread_pool* pool, std::uint64_t seed) {
  if constexpr (B::is_device && !external_storage) {
    // Made on the host in the buffer's layout (the padding zero), then copied in one piece.
    std::vector<std::byte> staged(params_list_.bytes(), std::byte{0});
    for (std::size_t i = 0; i < params_list_.size(); ++i) {
      parameter const& p = params_list_[i];
      detail::initialise_parameter(pool, config_, i, p, reinterpret_cast<T*>(staged.data() + p.offset), seed);
    }
    memory::copy_to_device(B{}, params_.data(), staged.data(), staged.size());
    return;
  }
  if constexpr (!external_storage)  // the padding, and a base for the zero tensors
    std::fill(params_.data(), params_.data() + params_list_.bytes(), std::byte{0});
  // External storage: the hooks hand out host-writable memory for every parameter outside a
  // step, on every backend (a scheduler keeps its chunks on the host tier until the first step).
  for (std::size_t i = 0; i < params_list_.size(); ++i)
    detail::initialise_parameter(pool, config_, i, params_list_[i], param(params_list_[i]).data(), seed);
}

template <Backend B, Element T, class Hooks>
float
gpt<B, T, Hooks>::run_forward(exec<B> const& ex, int first, int last, int micro, token_view tokens,
                              token_view const* targets) {
  stages_.check_forward("gpt: a forward", first, last, micro);
  prepare(ex, tokens.extent(0), tokens.extent(1));
  slot_state& s = slot(micro);
  stages_.set(first, last, micro, detail::stage_slots::idle);  // overwritten from here: nothing to go back through
  if (first == embedding_block) s.tokens = tokens;
  bool const head = last == last_block();
  if (head) {
    loss_ = std::numeric_limits<float>::quiet_NaN();
    head_slot_ = micro;
    s.targets_given = false;
    if (targets != nullptr) s.targets = *targets;
  }
  offloading const guard{this};
  for (int b = first; b <= last; ++b) {
    hooks_.pre_forward(b);
    forward_block(ex, b, micro, b == last_block() && targets != nullptr);
    if (mover_) {  // block b's saved activations leave; block b-1's must have left by now
      send(ex, b, micro);
      mover_->wait_sent(ex, b - 1);
    }
    hooks_.post_forward(b);
    stages_.set(b, b, micro, detail::stage_slots::forwarded);
  }
  if (mover_) mover_->finish(mover_->sending, mover_->sent);
  if (head && targets == nullptr)  // no loss: nothing of this slot to go back through
    stages_.set(embedding_block, last, micro, detail::stage_slots::idle);
  return head ? loss_ : std::numeric_limits<float>::quiet_NaN();
}

template <Backend B, Element T, class Hooks>
void gpt<B, T, Hooks>::forward_block(exec<B> const& ex, int b, int micro, bool with_targets) {
  slot_state& s = slot(micro);
  if (b == embedding_block) {
    kernels::encoder_forward(ex, act<T>(plan_.encoded, micro, {batch_, seq_, index_t{config_.channels}}), s.tokens,
                             wte(), cparam(wpe()));
  } else if (b < config_.layers) {
    detail::block_forward(ex, residual_in(b, micro, false), block_acts(b, micro, false), weights(b),
                          index_t{config_.heads});
  } else {
    auto const h = head_acts(micro);
    detail::head_forward(ex, residual_in(b, micro, false), h, cparam(lnf_w()), cparam(lnf_b()), wte());
    if (!with_targets) return;
    kernels::fused_classifier(ex, h.dlogits, h.losses, view<T const>(h.logits), s.targets, index_t{config_.vocab},
                              h.ws);
    double const sum = detail::ordered_sum(ex, view<float const>(h.losses));
    loss_ = static_cast<float>(sum / static_cast<double>(batch_ * seq_));
    s.targets_given = true;
  }
}

template <Backend B, Element T, class Hooks>
void
gpt<B, T, Hooks>::run_backward(char const* op, exec<B> const& ex, int first, int last, int micro, float loss_scale,
                               pass p) {
  bool const weights = p == pass::weights;
  if (weights) stages_.check_weights(op, first, last, micro);
  else stages_.check_backward(op, first, last, micro);
  if (!external_storage && !grads_) zero_grad(ex);
  // One backward per forward; a split model's input pass leaves the weight pass owed.
  stages_.set(first, last, micro, p == pass::input ? detail::stage_slots::owed : detail::stage_slots::idle);
  if (!weights && last == last_block() && loss_scale != 1.f)
    detail::scale_in_place(ex, head_acts(micro).dlogits, loss_scale);
  offloading const guard{this};
  if (mover_) std::fill(mover_->fetching.begin(), mover_->fetching.end(), std::uint8_t{0});
  for (int b = last; b >= first; --b) {
    // Hooks that serve a split backward see its input pass as pre_/post_backward_input (the
    // block's parameters read) and its weight pass as the block's backward (its gradients
    // written); the embedding's input pass, which computes nothing, opens no moment.
    bool const input_moment = SplitBackwardHooks<Hooks> && p == pass::input;
    if (input_moment && b == embedding_block) continue;
    if constexpr (SplitBackwardHooks<Hooks>) {
      if (input_moment) hooks_.pre_backward_input(b);
      else hooks_.pre_backward(b);
    } else {
      hooks_.pre_backward(b);
    }
    if (mover_) {  // what block b reads arrives; what block b-1 reads starts to
      fetch(ex, b - 1, micro);
      fetch(ex, b - 2, micro);
      mover_->wait_fetched(ex, b - 1);
    }
    if (p == pass::whole && plan_.split()) {
      backward_block(ex, b, micro, pass::input);
      backward_block(ex, b, micro, pass::weights);
    } else {
      backward_block(ex, b, micro, p);
    }
    if constexpr (SplitBackwardHooks<Hooks>) {
      if (input_moment) hooks_.post_backward_input(b);
      else hooks_.post_backward(b);
    } else {
      hooks_.post_backward(b);
    }
  }
  if (mover_) mover_->finish(mover_->fetching, mover_->fetched);
}

// Block b's backward: whole (a model whose backward is one pass), or one of the split passes.
// The head's share of wte's gradient goes to the tied buffer in the input pass (it must be there
// before the embedding's weight pass adds it), or straight into wte's gradient in the weight
// pass; the embedding, which has no input gradient, runs in the weight pass.
template <Backend B, Element T, class Hooks>
void gpt<B, T, Hooks>::backward_block(exec<B> const& ex, int b, int micro, pass p) {
  auto const dres = act<T>(plan_.dres, micro, {batch_, seq_, index_t{config_.channels}});
  if (b == last_block()) {
    auto const h = head_acts(micro);
    auto const x = residual_in(b, micro, true);
    if (p == pass::weights) {
      auto const into = dwte();
      return detail::head_backward_weights(ex, x, h, plan_.has_tied() ? nullptr : &into, dparam(lnf_w()),
                                           dparam(lnf_b()));
    }
    // The head's share of wte's gradient: its own buffer (overwritten), or wte's gradient (+=).
    // The input pass asks for no gradient (its hooks may give none).
    if (plan_.has_tied()) detail::zero_fill(ex, h.tied);
    if (p == pass::input) {
      if (!plan_.has_tied()) return detail::head_backward_input<B, T>(ex, dres, x, h, cparam(lnf_w()), wte(), nullptr);
      auto const tied = cut_like_wte(h.tied);
      return detail::head_backward_input(ex, dres, x, h, cparam(lnf_w()), wte(), &tied);
    }
    detail::head_backward(ex, dres, x, h, cparam(lnf_w()), wte(), plan_.has_tied() ? cut_like_wte(h.tied) : dwte(),
                          dparam(lnf_w()), dparam(lnf_b()));
  } else if (b >= 0) {
    auto const x = residual_in(b, micro, true);
    auto const a = block_acts(b, micro, true);
    if (p != pass::weights && plan_.recomputed(b))
      detail::block_forward_to_gelu(ex, x, a, weights(b), index_t{config_.heads});
    if (p == pass::whole) detail::block_backward(ex, dres, x, a, weights(b), weight_grads(b), index_t{config_.heads});
    else if (p == pass::input) detail::block_backward_input(ex, dres, x, a, weights(b), index_t{config_.heads});
    else detail::block_backward_weights(ex, x, a, weight_grads(b));
  } else {
    if (p == pass::input) return;
    // The head's share of wte's gradient first, then the embedding's: one order of additions
    // per micro-batch, however stages of other micro-batches interleave.
    auto const g = dwte();
    if (plan_.has_tied()) {
      auto const tied = cut_like_wte(head_acts(micro).tied);
      for (int j = 0; j < g.pieces; ++j)
        detail::add_in_place(ex, detail::piece_view<B>(g, j), view<T const>(detail::piece_view<B>(tied, j)));
    }
    kernels::encoder_backward(ex, g, dparam(wpe()), view<T const>(dres), slot(micro).tokens,
                              plan_.template scratch_at<B>(slot_base(micro), plan_.encoder_scratch));
  }
}

template <Backend B, Element T, class Hooks>
void gpt<B, T, Hooks>::send(exec<B> const& ex, int b, int micro) {
  if (b >= config_.layers || plan_.moves(b).empty()) return;
  std::byte* const base = slot_base(micro);
  mover_->batch.clear();
  for (auto const& m : plan_.moves(b))
    mover_->batch.push_back({mover_->host + m.host_offset, base + plan_.offset(m.forward), plan_.bytes(m.forward)});
  memory::record(ex, mover_->ready);
  carrier().copy_activations(b, memory::copy_direction::device_to_host, mover_->batch, mover_->ready,
                             mover_->sent[activation_mover::at(b)]);
  mover_->sending[activation_mover::at(b)] = 1;
}

template <Backend B, Element T, class Hooks>
void gpt<B, T, Hooks>::fetch(exec<B> const& ex, int b, int micro) {
  if (b < embedding_block || b >= config_.layers || plan_.moves(b).empty() || mover_->fetching[activation_mover::at(b)])
    return;
  std::byte* const base = slot_base(micro);
  mover_->batch.clear();
  for (auto const& m : plan_.moves(b))
    mover_->batch.push_back({base + plan_.offset(m.backward), mover_->host + m.host_offset, plan_.bytes(m.forward)});
  memory::record(ex, mover_->ready);
  carrier().copy_activations(b, memory::copy_direction::host_to_device, mover_->batch, mover_->ready,
                             mover_->fetched[activation_mover::at(b)]);
  mover_->fetching[activation_mover::at(b)] = 1;
}

template <Backend B, Element T, class Hooks>
void gpt<B, T, Hooks>::reserve_activation_host(std::size_t bytes) {
  if (!mover_) mover_ = std::make_unique<activation_mover>(config_.layers);
  if (bytes != 0) mover_->host = carrier().activation_host(bytes);
  mover_->host_bytes = bytes;
  std::size_t most = 0;
  for (int b = embedding_block; b < config_.layers; ++b) most = std::max(most, plan_.moves(b).size());
  mover_->batch.reserve(most);
}

template <Backend B, Element T, class Hooks>
void gpt<B, T, Hooks>::release_activation_host() noexcept {
  if (!mover_) return;
  drain_activations();
  if (mover_->host != nullptr) carrier().release_activation_host(mover_->host, mover_->host_bytes);
  mover_->host = nullptr;
  mover_->host_bytes = 0;
}

template <Backend B, Element T, class Hooks>
void gpt<B, T, Hooks>::zero_grad(exec<B> const& ex) {
  if constexpr (external_storage) {
    hooks_.zero_grad();
  } else {
    if (!grads_) grads_ = detail::arena_block<B>(*arena_, params_list_.bytes(), options_.alignment);
    detail::zero_fill(ex, flat(grads_));
  }
}

}  // namespace tide::nn
