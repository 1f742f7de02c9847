#pragma once
// tide::kernels::global_grad_norm, any_non_finite, clip_scale: the global L2 norm of all
// gradients (for clipping), the overflow check loss scaling needs, and the clip scale AdamW
// takes as grad_scale, so clipping costs no pass of its own.
//
//   grads   a list (contiguous range of grad_tensor<G> or adamw_tensor<G, W>: pointer g, size n)
//           or one flat contiguous tensor_view<G>; G = float, bf16 or f16
//
//   double norm = global_grad_norm(ex, list);     // sqrt(sum over tensors of sum g^2)
//   if (!std::isfinite(norm)) { /* overflow: lower the loss scale, skip the step */ }
//   adamw(ex, hp, t, list, clip_scale(norm, 1.0f) / loss_scale);
//
// With loss scaling by S the norm measured is S times the true one: pass
// clip_scale(norm / S, max_norm) / S.
//
// Accumulation is in double (exact squares; why in host.hpp). Tolerance against the reference
// (one sequential double sum): relative <= n 2^-53 on the norm for n elements in all, the two
// sums' worst-case rounding. Host results are bit-identical for any thread count. The norm is
// non-finite exactly when some gradient is. The CUDA path (cuda.cuh, nvcc only) is a two-stage
// CUB block reduction, deterministic for a given device and size. Details:
// docs/kernels/grad_norm.md.

#include "tide/kernels/grad_norm/host.hpp"
#include "tide/kernels/grad_norm/math.hpp"
#include "tide/kernels/grad_norm/reference.hpp"

#if defined(__CUDACC__)
#  include "tide/kernels/grad_norm/cuda.cuh"
#endif
