#pragma once
// tide::kernels::sgd: one fused SGD step with momentum, dampening and optional Nesterov
// (torch.optim.SGD's semantics, maximize off) in place, in one pass over memory: reads p, g,
// buf and writes p, buf (20 B per fp32 parameter; 8 B read + 4 B written without momentum),
// plus the working copy when there is one.
//
//   p, buf    fp32 master weights and momentum buffer                (n)
//             (buf unused, and may be empty, when momentum == 0)
//   g         gradient: float, bf16 or f16                           (n)
//   working   optional bf16 / f16 (or float) copy of the new p,      (n)
//             rounded to nearest even through core/dtype.hpp
//
//   g' = g * grad_scale + weight_decay * p    (clipping and loss-scale unscaling, no extra pass)
//   if momentum != 0:  buf = (t == 1) ? g' : momentum buf + (1 - dampening) g'
//                      g'  = nesterov ? g' + momentum buf : buf
//   p -= lr * g'
//
// Two forms, on either backend:
//   sgd(ex, hparams, t, list, grad_scale)                 list: contiguous range of sgd_tensor
//   sgd(ex, hparams, t, p, g, buf[, working], grad_scale) one flat chunk of tensor_views
// The CUDA overloads (cuda.cuh, nvcc only) take the list as a device array of records.
//
// Tolerance against reference::sgd (the same operations in scalar float): bit-identical when
// the compiler does not contract a*b+c into FMAs, else within 2^-23 of the terms of each sum
// (weight decay, momentum, update), which the tests bound per element. Working copies equal the
// dtype's rounding of the new p exactly. Host results are bit-identical for any thread count.
// Throws tide::error(usage), touching nothing, for t < 1, bad hyper-parameters (nesterov needs
// momentum > 0 and dampening == 0, as torch), a non-finite grad_scale, mismatched shapes or a
// malformed record. Details: docs/kernels/sgd.md.

#include "tide/kernels/sgd/host.hpp"
#include "tide/kernels/sgd/math.hpp"
#include "tide/kernels/sgd/reference.hpp"

#if defined(__CUDACC__)
#  include "tide/kernels/sgd/cuda.cuh"
#endif
