#pragma once
// tide::optim::sgd: SGD with momentum, dampening and optional Nesterov (torch.optim.SGD's rule;
// weight decay is L2, added to the gradient) as an Optimizer (optim/optimizer.hpp) the offload
// engine calls per chunk, with the training knobs every tide optimizer carries. The update is
// tide::kernels::sgd. It keeps one fp32 state list, the momentum buffer ("momentum/<name>" in
// checkpoints), also with momentum = 0, where the buffer is kept but never read or written.
//
//   tide::optim::sgd opt{.lr = 0.1f, .momentum = 0.9f, .nesterov = true};

#include <cstddef>
#include <span>
#include <string_view>

#include "tide/kernels/sgd/sgd.hpp"
#include "tide/kernels/sealed.hpp"
#include "tide/optim/optimizer.hpp"
#include "tide/optim/training.hpp"

namespace tide::optim {

struct sgd {
  static constexpr std::string_view name = "sgd";
  static constexpr std::size_t state_lists = 1;  // the momentum buffer
  static constexpr bool keeps_prev = true;      // the update writes prev_* in its own pass
  static constexpr bool out_of_place = true;    // and reads src_* where they are set
  static constexpr std::string_view state_name(std::size_t) noexcept { return "momentum"; }

  float lr = 1e-2f;
  float momentum = 0.f;
  float dampening = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;     // needs momentum > 0 and dampening = 0 (as torch)
  float clip_norm = 0.f;     // > 0: gradients scaled so their global L2 norm is at most this
  bool decay_matrices_only = false;
  int micro_steps = 1;
  warmup_cosine schedule{};
  loss_scaling scaling{};

  template <Backend B, class T>
  void update(exec<B> const& ex, update_args const& a, std::span<update_tensor<T, state_lists> const> tensors) const {
    kernels::sgd_hparams const hp{a.lr, momentum, dampening, a.decay ? weight_decay : 0.f, nesterov};
    detail::in_batches<kernels::sgd_tensor<T, T>>(
        tensors,
        [](update_tensor<T, state_lists> const& x) {
          return kernels::sgd_tensor<T, T>{x.master, x.grad, x.state[0], x.working, x.n, x.prev_master,
                                           x.prev_state[0], x.prev_working, x.src_master, x.src_state[0]};
        },
        [&](auto records) { kernels::sgd(ex, hp, a.step, records, a.grad_scale); });
  }
};
static_assert(check_optimizer<sgd>());

}  // namespace tide::optim
