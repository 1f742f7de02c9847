#pragma once
// tide::kernels matmul: the linear layer in llm.c's layout, forward and backward, optionally
// with a GELU (tanh form) epilogue.
//
//   matmul_forward(ex, out, inp, weight, bias);                 // out = inp @ weight^T + bias
//   matmul_forward_gelu(ex, out, pre, inp, weight, bias);       // pre = inp @ weight^T + bias,
//                                                               // out = gelu(pre)
//   matmul_backward(ex, dinp, dweight, dbias, dout, inp, weight);   // dinp, dweight, dbias +=
//   matmul_backward_gelu(ex, dinp, dweight, dbias, dout, pre, inp, weight);
//                                       // dout <- dout * gelu'(pre) in place, then as above
//   matmul_backward_input(ex, dinp, dout, weight, ws);               // dinp += (the B half)
//   matmul_backward_weight(ex, dweight, dbias, dout, inp, ws);       // dweight, dbias += (the W half)
//   matmul_backward_gelu_input(ex, dinp, dout, pre, weight, ws);     // dout <- dout * gelu'(pre), dinp +=
//   (the halves of a backward split for zero-bubble pipelines: each gives the fused call's bits;
//   ws: matmul_backward_scratch_bytes<T>(ex, N, C, OC) bytes)
//
// Shapes: inp (N, C) or (B, T, C); weight (OC, C); bias, dbias (OC), or {} for none; out, pre,
// dout (N, OC) or (B, T, OC); dinp as inp, dweight as weight. All contiguous; outputs separate from
// inputs (except dout, which matmul_backward_gelu and matmul_backward_gelu_input overwrite).
// Element types: one T for every tensor of a call, float, bf16 or f16; products in float (fp32
// sgemm on the host, cuBLAS with fp32 compute on CUDA). The GELU form keeps pre because its
// backward needs gelu'(pre).
//
// Gradients accumulate (+=), as llm.c's do: zero them before the first micro-batch.
//
// Tolerance against the reference (double sums), per output of a dot product of K terms
// (K = C forward, OC for dinp, N for dweight and dbias), with S = sum_k |a_k b_k| (+ |old value|
// for +=, + |bias|), u = 2^-24:
//   float  |y - ref| <= (K + 2) u S: the worst case of any summation order (sgemm blocks the k
//          loop; FMA or not). GELU out: 1.13 x pre's bound + 4 u |pre| (|gelu'| <= 1.13, and the
//          GELU kernel's own error); GELU backward: (K + 11) u S (dout * gelu'(pre) rounded once)
//   bf16   the float bound + 2^-8 |ref| for the output rounding (+ 2^-8 S where the GELU
//          backward rounded dout); f16 the same with 2^-11
// Determinism: on the host, the same bits for any thread count: the products are cut into blocks
// from the shape alone, one single-threaded OpenBLAS sgemm each (OpenBLAS's own threading
// re-blocks k with its thread count, which changes the rounding), and dbias and the portable
// sgemm (no BLAS) sum in a fixed order. OpenBLAS is set to 1 thread, process-wide. On CUDA:
// cuBLAS's run-to-run reproducibility (same GPU, same handle setup); dbias sums in a fixed order.
// Throws tide::error(usage), touching nothing, on bad shapes or overlapping outputs.
//
// The CUDA overloads (tide/kernels/matmul/cuda.cuh, nvcc) take exec<cuda> and device views.

#include "tide/kernels/matmul/host.hpp"
#include "tide/kernels/matmul/reference.hpp"

#if defined(__CUDACC__)
#include "tide/kernels/matmul/cuda.cuh"
#endif
