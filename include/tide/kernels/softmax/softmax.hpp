#pragma once
// tide::kernels::softmax_*: softmax over the last dimension, plain, causal and with valid
// lengths, and its backward. docs/kernels/softmax.md has the math, tolerances and figures.
//
//   tide::exec<tide::host> ex{pool};
//   softmax_forward(ex, probs, scores, 1.f / std::sqrt(float(hs)));    // (R, L)
//   softmax_forward_causal(ex, att, preatt, scale);                    // (B, NH, T, T)
//   softmax_forward_masked(ex, att, preatt, lengths, scale);           // lengths (G), G | R
//   softmax_backward(ex, dpreatt, att, datt, scale);                   // same shapes
//
// Shapes: rows are the last dimension, over all leading ones; views contiguous; out may be inp
// (and dinp may be out or dout): in place works, a partial overlap throws. Element types:
// float, tide::bf16, tide::f16 storage, float arithmetic.
//
// Math (softmax/math.hpp, shared by both backends): z = fl(scale x), m = max z over the valid
// columns, e = exp_poly_nonpositive(z - m) (<= 1.02 ulp, detail/exp.hpp), y = e * (1 / sum e);
// masked columns output 0; a row with no valid column is all 0. A row whose valid inputs are
// all -inf, or holds +inf or NaN, comes out NaN.
//
// Tolerance against reference.hpp (double), per element (docs/kernels/softmax.md): fp32
// |y - y_ref| <= y_ref (|z| + |m| + |z - m| + 8 + sqrt(L) / 2) u, u = 2^-24 (the roundings of the
// exp argument, exp_poly, the row sum), plus 2^-125 for flushed subnormals; bf16 / f16 add
// y_ref u_T from the output rounding.
//
// Determinism: host rows are reduced in a fixed order (16 lanes, then a fixed tree), so the
// output is bit-identical for any thread count. CUDA (cuda.cuh): the block reduction order is
// fixed by the launch configuration, which depends only on the shape, so repeated runs agree
// bit for bit.
//
// CUDA: the same functions with exec<cuda> and device views (include this header or cuda.cuh
// under nvcc). softmax_forward_masked on CUDA checks the lengths' shape only (they are device
// memory); a length outside [0, L] is clamped into it.

#include "tide/kernels/softmax/host.hpp"
#include "tide/kernels/softmax/reference.hpp"

#if defined(__CUDACC__)
#  include "tide/kernels/softmax/cuda.cuh"
#endif
