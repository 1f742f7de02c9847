#pragma once
// SGD's per-element math, shared by the host path (host.hpp) and the CUDA kernels (cuda.cuh),
// plus the plain data both take: hyper-parameters, per-tensor records, per-step coefficients.
//
// The update (PyTorch's torch.optim.SGD, maximize off):
//   g = grad * grad_scale + weight_decay * p
//   if momentum != 0:
//     buf = (t == 1) ? g : momentum * buf + (1 - dampening) * g
//     g   = nesterov ? g + momentum * buf : buf
//   p -= lr * g
// torch starts the buffer on the first step it sees a gradient; here that is step t == 1.

#include "tide/core/config.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels {

// Hyper-parameters, as torch.optim.SGD names them (PyTorch's defaults; torch has none for lr,
// 1e-3 is adamw_hparams' so that a forgotten lr is small rather than 0).
struct sgd_hparams {
  float lr = 1e-3f;
  float momentum = 0.f;
  float dampening = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;
};

// One tensor of a multi-tensor step: fp32 master weights p and momentum buffer buf, gradient g,
// and an optional low-precision working copy (nullptr: none) rewritten from the new p. buf is
// neither read nor written when momentum == 0 and may then be null. All n long, in the memory of
// the backend that runs the step. The arrays must not overlap, except that g may be working
// itself (gradient-slot reuse, as for adamw_tensor).
template <Element Grad = float, Element Work = Grad>
struct sgd_tensor {
  float* p = nullptr;
  Grad const* g = nullptr;
  float* buf = nullptr;
  Work* working = nullptr;
  index_t n = 0;
  // Optional (null: not kept): each element's values from before the step, written in the same
  // pass (as adamw_tensor's): p, buf (whenever it is given, used by this step or not), the
  // working copy.
  float* prev_p = nullptr;
  float* prev_buf = nullptr;
  Work* prev_working = nullptr;
  // Optional (null: in place): where the step reads p and buf from, as adamw_tensor's src_*
  // (buf: written whenever it and its source are given, used by this step or not).
  float const* src_p = nullptr;
  float const* src_buf = nullptr;
};

// What sgd_update needs for one step; built (and checked) by sgd_coefficients_for in host.hpp.
struct sgd_coefficients {
  float lr, momentum, one_minus_dampening, weight_decay, grad_scale;
  bool use_momentum;  // momentum != 0: buf is read and written
  bool first;         // t == 1: buf starts as the gradient
  bool nesterov;
};

// One element (V = float), or one vector of lanes (V = a SIMD type with float's operators).
// The branches are on per-step constants, the same for every element. Every backend runs this
// exact sequence of IEEE operations, so they differ only where a compiler contracts a*b+c into
// an FMA (nvcc does by default; g++ with FMA units). buf is untouched when !c.use_momentum.
template <class V>
TIDE_HOST_DEVICE inline void sgd_update(V& p, V& buf, V g, sgd_coefficients const& c) {
  V d = g * c.grad_scale + c.weight_decay * p;
  if (c.use_momentum) {
    if (c.first)
      buf = d;
    else
      buf = c.momentum * buf + c.one_minus_dampening * d;
    if (c.nesterov)
      d = d + c.momentum * buf;
    else
      d = buf;
  }
  p = p - c.lr * d;
}

}  // namespace tide::kernels
