#pragma once
// tide::kernels::encoder_forward / encoder_backward: GPT-2's token + position embedding.
// docs/kernels/embedding.md has the math, tolerances and determinism.
//
//   tide::exec<tide::host> ex{pool};
//   encoder_forward(ex, x, tokens, wte, wpe);       // x (B, T, C) = wte[tokens] + wpe[:T]
//   encoder_backward(ex, dwte, dwpe, dx, tokens);   // dwte (V, C) +=, dwpe (maxT, C) +=
//
// wte / dwte may also be a row_table (row_table.hpp): the table in row pieces anywhere in memory,
// read and written with the same sums and roundings, so the same bits.
//
// Element types: activations and tables float, tide::bf16 or tide::f16 (the gradient tables may
// have another type than dout), float arithmetic; tokens std::int32_t.
//
// Tolerance against reference.hpp: forward is one float add, rounded once: exact for fp32
// inputs and within half an ulp of T otherwise (the same bits as the reference). Backward: each
// table element adds its k contributions in float, then once into the table: fp32 within
// (k + 1) u sum|terms| of the double sum (u = 2^-24); a bf16 / f16 table adds its own rounding.
//
// Determinism: the backward has no atomics and a fixed summation order per table element (host:
// runs of a token sorted by position; channels split between threads), so dwte and dwpe are
// bit-identical for any thread count. CUDA (cuda.cuh): the same order (a stable radix sort of
// the tokens, one block per token run summing in position order), also without atomics, so it
// is run-to-run identical.
//
// Tokens: host checks them first (tide::error(usage), nothing written). CUDA cannot throw from a
// kernel: the forward writes a NaN row for a token outside [0, V) and the backward skips it.

#include "tide/kernels/embedding/host.hpp"
#include "tide/kernels/embedding/reference.hpp"

#if defined(__CUDACC__)
#  include "tide/kernels/embedding/cuda.cuh"
#endif
