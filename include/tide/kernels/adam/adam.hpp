#pragma once
// tide::kernels::adam: one fused Adam step (L2 weight decay folded into the gradient,
// torch.optim.Adam's semantics, amsgrad off) in place, in one pass over memory: reads p, g, m,
// v and writes p, m, v (28 B per fp32 parameter), plus the working copy when there is one.
//
//   p, m, v   fp32 master weights and moments                        (n)
//   g         gradient: float, bf16 or f16                           (n)
//   working   optional bf16 / f16 (or float) copy of the new p,      (n)
//             rounded to nearest even through core/dtype.hpp
//
//   g' = g * grad_scale + weight_decay * p    (clipping and loss-scale unscaling, no extra pass)
//   m  = beta1 m + (1 - beta1) g'             v = beta2 v + (1 - beta2) g'^2
//   p -= lr * m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps)
//
// Two forms, on either backend, shaped exactly like kernels::adamw (and taking its records):
//   adam(ex, hparams, t, list, grad_scale)                  list: contiguous range of adam_tensor
//   adam(ex, hparams, t, p, g, m, v[, working], grad_scale) one flat chunk of tensor_views
// The CUDA overloads (cuda.cuh, nvcc only) take the list as a device array of records.
//
// Tolerance against reference::adam (fp32 arithmetic, dividing by the bias corrections): m and
// v equal it bit for bit when the compiler does not contract a*b+c into FMAs, else within
// 2^-22 of their terms (beta1 |m| + (1 - beta1) |g'|, with g' holding its own contraction
// slack); p within 1 ulp plus 2^-20 of lr |m^ / (sqrt(v^) + eps)|, plus what the m and v
// differences do to that ratio. Working copies equal the dtype's rounding of the new p exactly.
// Host results are bit-identical for any thread count. Throws tide::error(usage), touching
// nothing, for t < 1, bad hyper-parameters, a non-finite grad_scale, mismatched shapes or a
// malformed record. Details: docs/kernels/adam.md.

#include "tide/kernels/adam/host.hpp"
#include "tide/kernels/adam/math.hpp"
#include "tide/kernels/adam/reference.hpp"

#if defined(__CUDACC__)
#  include "tide/kernels/adam/cuda.cuh"
#endif
