#pragma once
// Adam's per-element math, shared by the host path (host.hpp) and the CUDA kernels (cuda.cuh),
// plus the plain data both take. The moments and the bias-corrected ratio are AdamW's own
// (adam_moments_ratio in kernels/adamw/math.hpp), so the two optimizers differ only in where
// weight decay enters.
//
// The update (L2 weight decay folded into the gradient, PyTorch's torch.optim.Adam):
//   g  = grad * grad_scale + weight_decay * p
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= lr * m * rb1 / (sqrt(v * rb2) + eps)
// with rb1 = 1 / (1 - beta1^t), rb2 = 1 / (1 - beta2^t) computed once per step in double.

#include "tide/core/config.hpp"
#include "tide/core/dtype.hpp"
#include "tide/kernels/adamw/math.hpp"

namespace tide::kernels {

// Hyper-parameters, as torch.optim.Adam names them (PyTorch's defaults). Not adamw_hparams: its
// default weight_decay (1e-2) is AdamW's; Adam's is 0, and here decay means L2 on the gradient.
struct adam_hparams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
};

// One tensor of a multi-tensor step: the same record as AdamW's (p, g, m, v, working, n), so a
// list built for one steps with the other and global_grad_norm takes it as it is.
template <Element Grad = float, Element Work = Grad>
using adam_tensor = adamw_tensor<Grad, Work>;

// The same per-step coefficients as AdamW; built (and checked) by adam_coefficients_for in host.hpp.
using adam_coefficients = adamw_coefficients;

// One element (V = float), or one vector of lanes (V = a SIMD type with float's operators and an
// ADL-visible sqrt). Every backend runs this exact sequence of IEEE operations, so they differ
// only where a compiler contracts a*b+c into an FMA (nvcc does by default; g++ with FMA units).
template <class V>
TIDE_HOST_DEVICE inline void adam_update(V& p, V& m, V& v, V g, adam_coefficients const& c) {
  V const gs = g * c.grad_scale + c.weight_decay * p;
  p = p - c.lr * adam_moments_ratio(m, v, gs, c);
}

}  // namespace tide::kernels
