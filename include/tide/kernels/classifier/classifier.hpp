#pragma once
// tide::kernels::fused_classifier: softmax + cross-entropy + dlogits in one pass per row, and the
// unfused crossentropy_forward / crossentropy_softmax_backward it replaces. docs/kernels/classifier.md
// has the math, tolerances and figures.
//
//   tide::exec<tide::host> ex{pool};
//   fused_classifier(ex, logits, losses, logits, targets, V);   // in place: logits become dlogits
//   //               dlogits (N, Vp), losses (N), logits (N, Vp), targets (N) int32, V <= Vp
//
// Element types of logits / dlogits: float, tide::bf16, tide::f16 (float arithmetic); losses and
// dloss weights are float, targets std::int32_t. Rows are the last dimension of logits, over all
// leading ones: (B*T, Vp) or (B, T, Vp).
//
// Tolerance against reference.hpp (double), docs/kernels/classifier.md: fp32 loss within
// (8 + sqrt(V) / 2 + |log s| + |m - x_t| + 2) u absolute (u = 2^-24: the row sum's relative error
// becomes log s's absolute error; then log, m - x_t and the add round), dlogits within
// |w| (p (|x| + |m| + |x - m| + 8 + sqrt(V) / 2) u + 2u) + 2u |d|, p the probability; bf16 / f16
// add the output's rounding u_T |d|.
//
// Determinism: host rows are reduced in a fixed order: bit-identical for any thread count. CUDA
// (cuda.cuh): one block per row, a fixed block reduction: run to run identical.
//
// Targets: host checks them all first (tide::error(usage), nothing written). CUDA cannot throw
// from a kernel and does not copy targets back: a row whose target is outside [0, V) gets a NaN
// loss and NaN dlogits (no out-of-bounds access), so the mean loss shows the bad batch.

#include "tide/kernels/classifier/host.hpp"
#include "tide/kernels/classifier/reference.hpp"

#if defined(__CUDACC__)
#  include "tide/kernels/classifier/cuda.cuh"
#endif
