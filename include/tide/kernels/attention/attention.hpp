#pragma once
// tide::kernels causal self-attention, forward and backward, flash-style: blocked, with an online
// softmax, saving only the log-sum-exp of each score row for the backward (no (B, NH, T, T)
// buffer).
//
//   attention_forward(ex, out, lse, qkv, NH);                   // out =, lse =
//   attention_backward(ex, dqkv, dout, qkv, out, lse, NH);      // dqkv +=
//
// Shapes: qkv, dqkv (B, T, 3C): per token q, k, v of C channels each, head h on channels
// [h HS, (h + 1) HS) of each, HS = C / NH; out, dout (B, T, C), heads concatenated as in qkv;
// lse (B, NH, T) float. Contiguous, outputs separate from inputs. Element types: qkv, out, dout,
// dqkv one T, float, bf16 or f16; computed in float (scores, probabilities, sums).
//
//   out_i = sum_{j <= i} softmax_j(q_i . k_j / sqrt(HS)) v_j,   lse_i = log sum_{j <= i} e^{s_ij}
//
// The backward recomputes the probabilities block by block from lse (flash-attention 2's
// backward) and adds into dqkv (+=, as every tide gradient).
//
// Tolerance against the reference (llm.c's attention in double), normwise per tensor
// (max |x - ref| / max |ref|), for inputs ~ N(0, 1) and T <= 64, HS <= 32:
//   float  5e-6 (forward), 2e-5 (backward): exp_poly's 1 ulp per probability, sums of up to T
//          terms (max / sum / P V reordered into blocks and lanes) and HS-term dot products,
//          each ~ (T + HS) u, u = 2^-24, with headroom; lse 1e-5 absolute + relative
//   bf16   2^-7 of the tensor's largest value: the one rounding of each output (2^-8 relative,
//          relative to an element, so normwise smaller), doubled for +=; f16 the same with 2^-10
// Determinism: a (b, h) pair is computed by one thread in a fixed order: bit-identical results
// for any thread count. Threading is over the B * NH pairs.
//
// The CUDA overloads (tide/kernels/attention/cuda.cuh, nvcc) take exec<cuda> and device views.

#include "tide/kernels/attention/host.hpp"
#include "tide/kernels/attention/math.hpp"
#include "tide/kernels/attention/reference.hpp"

#if defined(__CUDACC__)
#include "tide/kernels/attention/cuda.cuh"
#endif
