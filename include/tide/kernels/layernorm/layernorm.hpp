#pragma once
// tide::kernels LayerNorm over the last dimension, forward and backward, and the fused
// residual + LayerNorm forward of a GPT block.
//
//   tide::kernels::layernorm_forward(ex, out, mean, rstd, inp, weight, bias);
//   tide::kernels::layernorm_backward(ex, dinp, dweight, dbias, dout, inp, weight, mean, rstd);
//   tide::kernels::layernorm_backward_input(ex, dinp, dout, inp, weight, mean, rstd);   // dinp += (B)
//   tide::kernels::layernorm_backward_weight(ex, dweight, dbias, dout, inp, mean, rstd, ws);  // (W)
//       the backward's halves, split for zero-bubble pipelines, each with the fused call's bits;
//       ws: layernorm_backward_scratch_bytes(ex, N, C) bytes
//   tide::kernels::residual_layernorm_forward(ex, residual, out, mean, rstd, a, b, weight, bias);
//
// Shapes: inp, out, dinp, dout, a, b, residual (N, C) or (B, T, C), contiguous; mean, rstd one
// float per row; weight, bias, dweight, dbias (C). eps = layernorm_eps = 1e-5f, variance biased.
// Element types: activations float, bf16 or f16; weights float, bf16 or f16; mean and rstd
// float; computed in float.
//
// Accumulation: dinp, dweight and dbias are accumulated (+=), as in llm.c: dinp is the residual
// stream's gradient, which the block's other branch also adds to.
//
// Tolerance against the reference (llm.c's loops in double), u = 2^-24, k = 8u (1 + sqrt(C)/4)
// (a row sum is 32 lane sums of C/32 terms, a random walk of about u sqrt(C/32); > 8x headroom):
//   float  out: k (|w| (|xhat| + 1 + |mean| / stddev) + |b|); mean, rstd: k relative to the
//          row's scale; dinp: k rstd (|dnorm| + the row's mean |dnorm| terms); dweight, dbias:
//          (N + 1) u sum |terms| (a sum over N rows, any order)
//   bf16   the same plus one rounding to bf16 on each side: 2^-7 relative (f16: 2^-10)
// Determinism (host): out, mean, rstd, dinp depend only on their row (fixed-order row sums);
// dweight and dbias are summed in fixed row chunks, so every output is bit-identical for any
// thread count. See docs/kernels/layernorm.md.
//
// The CUDA overloads (tide/kernels/layernorm/cuda.cuh, nvcc) take exec<cuda> and device views.

#include "tide/kernels/layernorm/host.hpp"
#include "tide/kernels/layernorm/math.hpp"
#include "tide/kernels/layernorm/reference.hpp"

#if defined(__CUDACC__)
#include "tide/kernels/layernorm/cuda.cuh"
#endif
