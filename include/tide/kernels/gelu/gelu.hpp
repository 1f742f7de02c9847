#pragma once
// tide::kernels GELU, tanh form (GPT-2), and bias + GELU fused, forward and backward.
//
//   tide::kernels::gelu_forward(ex, out, inp);                      // out = gelu(inp)
//   tide::kernels::gelu_backward(ex, dinp, inp, dout);              // dinp = gelu'(inp) * dout
//   tide::kernels::bias_gelu_forward(ex, out, inp, bias);           // out = gelu(inp + bias)
//   tide::kernels::bias_gelu_backward(ex, dinp, dbias, inp, bias, dout);  // dinp =, dbias +=
//
// Shapes: inp, out, dinp, dout any contiguous shape, all equal ((B, T, 4C) in GPT-2's MLP);
// bias, dbias (C) = the last extent of inp. Outputs may be their inputs (in place); dbias is
// separate. Element types: activations float, bf16 or f16; bias float, bf16 or f16; computed in
// float.
//
// dinp is assigned, not accumulated (GELU's input feeds nothing else in a GPT block); dbias is
// accumulated, as every weight gradient is.
//
// Tolerance against the reference (the tanh form in double), per element x:
//   float  |y - ref| <= 4 u |x| (forward, measured 2.6 u |x|), 8 u |dout| + u |dinp| (backward,
//          measured 4.1 u for gelu'), u = 2^-24
//   bf16   one bf16 rounding of that: 2^-8 relative
// Determinism: every element depends only on its inputs; dbias is a fixed-order sum, the same
// for any thread count on the host (see docs/kernels/gelu.md).
//
// The CUDA overloads (tide/kernels/gelu/cuda.cuh, nvcc) take exec<cuda> and device views.

#include "tide/kernels/gelu/host.hpp"
#include "tide/kernels/gelu/math.hpp"
#include "tide/kernels/gelu/reference.hpp"

#if defined(__CUDACC__)
#include "tide/kernels/gelu/cuda.cuh"
#endif
