#pragma once
// AdamW's per-element math, shared by the host path (host.hpp) and the CUDA kernels (cuda.cuh),
// plus the plain data both take: hyper-parameters, per-tensor records, per-step coefficients.
//
// The update (decoupled weight decay, PyTorch's torch.optim.AdamW):
//   g  = grad * grad_scale
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= lr * (m * rb1 / (sqrt(v * rb2) + eps) + weight_decay * p)
// with rb1 = 1 / (1 - beta1^t), rb2 = 1 / (1 - beta2^t) computed once per step in double.

#include <cmath>
#include <cstdint>

#include "tide/core/config.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels {

// Hyper-parameters, as torch.optim.AdamW names them (PyTorch's defaults).
struct adamw_hparams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
};

// One tensor of a multi-tensor step: fp32 master weights p, moments m and v, gradient g, and an
// optional low-precision working copy (nullptr: none) rewritten from the new p. All n long, in
// the memory of the backend that runs the step. The arrays must not overlap, except that g may
// be working itself (the offload engine's gradient-slot reuse: each element's gradient is read
// before its working copy is written).
template <Element Grad = float, Element Work = Grad>
struct adamw_tensor {
  float* p = nullptr;
  Grad const* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  Work* working = nullptr;
  index_t n = 0;
  // Optional (null: not kept): where the step writes each element's values from before it, in
  // the same pass that reads them (the offload engine's undo journal): p, m, v, the working copy.
  // n long each, not overlapping anything else.
  float* prev_p = nullptr;
  float* prev_m = nullptr;
  float* prev_v = nullptr;
  Work* prev_working = nullptr;
  // Optional (null: in place): where the step reads p, m, v from; the new values then go to p,
  // m, v and these stay as they were (the offload engine's undo journal: it swaps the blocks once
  // the step succeeded, and keeps the old ones). n long each, not overlapping anything written.
  // A step writes every element of an array it reads from a source (a state it does not use
  // too), with streaming stores on the host: the destinations are not read first.
  float const* src_p = nullptr;
  float const* src_m = nullptr;
  float const* src_v = nullptr;
};

// What adamw_update needs for one step; built (and checked) by adamw_coefficients_for in host.hpp.
struct adamw_coefficients {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  float bias1_recip;  // 1 / (1 - beta1^t)
  float bias2_recip;  // 1 / (1 - beta2^t)
  float grad_scale;
};

// The moments' update from the effective gradient gs, and the bias-corrected ratio
// m^ / (sqrt(v^) + eps) it returns: the part AdamW shares with Adam (kernels/adam/math.hpp),
// which differs only in where weight decay enters.
template <class V>
TIDE_HOST_DEVICE inline V adam_moments_ratio(V& m, V& v, V gs, adamw_coefficients const& c) {
  using std::sqrt;
  m = c.beta1 * m + c.one_minus_beta1 * gs;
  v = c.beta2 * v + c.one_minus_beta2 * gs * gs;
  V const m_hat = m * c.bias1_recip;
  V const v_hat = v * c.bias2_recip;
  return m_hat / (sqrt(v_hat) + c.eps);
}

// One element (V = float), or one vector of lanes (V = a SIMD type with float's operators and an
// ADL-visible sqrt). Every backend runs this exact sequence of IEEE operations, so they differ
// only where a compiler contracts a*b+c into an FMA (nvcc does by default; g++ with FMA units).
template <class V>
TIDE_HOST_DEVICE inline void adamw_update(V& p, V& m, V& v, V g, adamw_coefficients const& c) {
  V const gs = g * c.grad_scale;
  V const ratio = adam_moments_ratio(m, v, gs, c);
  p = p - c.lr * (ratio + c.weight_decay * p);
}

}  // namespace tide::kernels
