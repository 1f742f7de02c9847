#pragma once
// tide::kernels residual add, forward and backward.
//
//   tide::kernels::residual_forward(ex, out, a, b);      // out = a + b
//   tide::kernels::residual_backward(ex, da, db, dout);  // da += dout, db += dout
//
// Shapes: any contiguous shape, all equal ((B, T, C) in a GPT block). out may be a or b (in
// place); da, db and dout are separate tensors. Element types float, bf16, f16; the sum is formed
// in float and rounded once, so the result is exact to the element type: bit-identical to the
// reference, on any thread count.
//
// The backward of out = a + b is dout into both addends. It accumulates (+=) because in a GPT
// block both addends' gradients have other contributions: residual_backward is that add for when
// the caller's gradient buffers are separate; when one of them is dout itself, nothing is needed.
// LayerNorm's fused forward (residual_layernorm_forward) is in tide/kernels/layernorm.
//
// The CUDA overloads (tide/kernels/residual/cuda.cuh, nvcc) take exec<cuda> and device views.

#include "tide/kernels/residual/host.hpp"
#include "tide/kernels/residual/reference.hpp"

#if defined(__CUDACC__)
#include "tide/kernels/residual/cuda.cuh"
#endif
