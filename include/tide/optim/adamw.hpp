#pragma once
// tide::optim::adamw: AdamW (torch.optim.AdamW's decoupled weight decay) as an Optimizer
// (optim/optimizer.hpp) the offload engine calls per chunk, on the tier where the chunk's state
// lives, plus the training knobs every tide optimizer carries: a learning-rate schedule,
// global-norm clipping, gradient accumulation and dynamic loss scaling (optim/training.hpp).
// The update is tide::kernels::adamw.
//
//   tide::optim::adamw opt{.lr = 1e-3f, .weight_decay = 0.1f, .clip_norm = 1.0f,
//                          .schedule = {.warmup_steps = 20, .total_steps = 500}};
//   opt.schedule(opt.lr, step);   // the learning rate of 0-based step `step`

#include <cstddef>
#include <span>
#include <string_view>

#include "tide/core/error.hpp"
#include "tide/kernels/adamw/adamw.hpp"
#include "tide/kernels/sealed.hpp"
#include "tide/optim/optimizer.hpp"
#include "tide/optim/training.hpp"

namespace tide::optim {

struct adamw {
  static constexpr std::string_view name = "adamw";
  static constexpr std::size_t state_lists = 2;  // m and v
  static constexpr bool keeps_prev = true;      // the update writes prev_* in its own pass
  static constexpr bool out_of_place = true;    // and reads src_* where they are set
  static constexpr std::string_view state_name(std::size_t k) noexcept { return k == 0 ? "m" : "v"; }

  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float clip_norm = 0.f;  // > 0: gradients scaled so their global L2 norm is at most this
  bool decay_matrices_only = false;  // true: no weight decay on biases and LayerNorm gains (GPT-2)
  int micro_steps = 1;    // micro-batches whose gradients accumulate into one step
  warmup_cosine schedule{};
  loss_scaling scaling{};

  [[nodiscard]] kernels::adamw_hparams hparams(float lr_now) const noexcept {
    return {lr_now, beta1, beta2, eps, weight_decay};
  }
  // The optimizer must see every gradient before it steps (clipping, overflow checks).
  [[nodiscard]] bool needs_all_gradients() const noexcept { return clip_norm > 0.f || scaling.enabled; }

  template <Backend B, class T>
  void update(exec<B> const& ex, update_args const& a, std::span<update_tensor<T, state_lists> const> tensors) const {
    kernels::adamw_hparams hp = hparams(a.lr);
    if (!a.decay) hp.weight_decay = 0.f;
    detail::in_batches<kernels::adamw_tensor<T, T>>(
        tensors,
        [](update_tensor<T, state_lists> const& x) {
          return kernels::adamw_tensor<T, T>{x.master, x.grad, x.state[0], x.state[1], x.working, x.n, x.prev_master,
                                             x.prev_state[0], x.prev_state[1], x.prev_working, x.src_master,
                                             x.src_state[0], x.src_state[1]};
        },
        [&](auto records) { kernels::adamw(ex, hp, a.step, records, a.grad_scale); });
  }
};
static_assert(check_optimizer<adamw>());

}  // namespace tide::optim
