#pragma once
// tide::optim::adam: Adam with L2 weight decay (torch.optim.Adam's: the decay is added to the
// gradient, so it passes through the moments) as an Optimizer (optim/optimizer.hpp) the offload
// engine calls per chunk, with the training knobs every tide optimizer carries. The update is
// tide::kernels::adam. Checkpoints hold its state lists as "m/<name>" and "v/<name>", as AdamW's.
//
//   tide::optim::adam opt{.lr = 1e-3f, .weight_decay = 1e-4f};

#include <cstddef>
#include <span>
#include <string_view>

#include "tide/kernels/adam/adam.hpp"
#include "tide/kernels/sealed.hpp"
#include "tide/optim/optimizer.hpp"
#include "tide/optim/training.hpp"

namespace tide::optim {

struct adam {
  static constexpr std::string_view name = "adam";
  static constexpr std::size_t state_lists = 2;  // m and v
  static constexpr bool keeps_prev = true;      // the update writes prev_* in its own pass
  static constexpr bool out_of_place = true;    // and reads src_* where they are set
  static constexpr std::string_view state_name(std::size_t k) noexcept { return k == 0 ? "m" : "v"; }

  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;  // L2: added to the gradient (torch.optim.Adam's default is 0)
  float clip_norm = 0.f;     // > 0: gradients scaled so their global L2 norm is at most this
  bool decay_matrices_only = false;
  int micro_steps = 1;
  warmup_cosine schedule{};
  loss_scaling scaling{};

  template <Backend B, class T>
  void update(exec<B> const& ex, update_args const& a, std::span<update_tensor<T, state_lists> const> tensors) const {
    kernels::adam_hparams const hp{a.lr, beta1, beta2, eps, a.decay ? weight_decay : 0.f};
    detail::in_batches<kernels::adam_tensor<T, T>>(
        tensors,
        [](update_tensor<T, state_lists> const& x) {
          return kernels::adam_tensor<T, T>{x.master, x.grad, x.state[0], x.state[1], x.working, x.n, x.prev_master,
                                            x.prev_state[0], x.prev_state[1], x.prev_working, x.src_master,
                                            x.src_state[0], x.src_state[1]};
        },
        [&](auto records) { kernels::adam(ex, hp, a.step, records, a.grad_scale); });
  }
};
static_assert(check_optimizer<adam>());

}  // namespace tide::optim
