#pragma once
// Attention on tensor cores through cuBLAS: the path attention_forward and attention_backward
// (attention/cuda.cuh) take when exec<cuda>::blas is set. Per sequence b, every head at once
// (cublasGemmStridedBatchedEx over the NH heads, which sit HS channels apart in qkv):
//
//   forward   S = scale Q K^T (T, T) in fp32; a row kernel: lse_i over keys j <= i, P = e^(S - lse)
//             (0 above the diagonal) in the element type; O = P V into out's head columns
//   backward  D = dout . out per row (the caller's, from the CUDA-core path's kernel); then per b:
//             S again, P from S
//             and lse, dV += P^T dO, dP = dO V^T in fp32, dS = P (dP - D) (0 above the diagonal)
//             in the element type, dQ += scale dS K, dK += scale dS^T Q
//
// As llm.c's attention: the whole (T, T) product is computed and the upper triangle thrown away
// (twice the causal work, on tensor cores); the scores of one sequence live in the caller's
// scratch, (NH, T, T) fp32 plus (NH, T, T) of the element type (sized as fp32), so the scratch
// does not grow with B. bf16 and f16 inputs run on tensor cores; f32 with exec<cuda>::tf32 in
// TF32, else in fp32 on CUDA cores. P and dS are rounded to the element type before their
// products, as flash attention's are. Products in fp32.
//
// Tolerance against the host's kernels (tests/gpu/kernels.cu): f32 1e-4, bf16 2e-2 of the
// tensor's largest value, as the CUDA-core path. Never run: no GPU where it was written.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "tide/core/config.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/kernels/attention/checks.hpp"
#include "tide/kernels/attention/math.hpp"
#include "tide/kernels/matmul/cuda.cuh"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels {

// Kernels in detail's ABI namespace (tests/cuda/README.md).
namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

inline constexpr int attention_gemm_rows_block = 256;  // 8 rows (warps) per block of the row kernel

inline constexpr unsigned attention_full_mask = 0xffffffffu;

// A warp's max and sum, every lane getting the result (a fixed shuffle tree: the same bits run
// to run); the CUDA-core kernels (attention/cuda.cuh) use them too.
__device__ inline float attention_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(attention_full_mask, v, o));
  return v;
}
__device__ inline float attention_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(attention_full_mask, v, o);
  return v;
}

// One sequence's scores S (NH, T, T), scaled: per row (h, i), lse over keys j <= i and
// P = e^(S - lse) for j <= i, 0 after (O = P V reads whole rows). One warp per row.
template <class T>
__global__ void __launch_bounds__(attention_gemm_rows_block)
    attention_gemm_softmax_kernel(T* __restrict__ P, float* __restrict__ lse, float const* __restrict__ S, int NH,
                                  int Tn) {
  std::int64_t const row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;  // h T + i
  int const lane = static_cast<int>(threadIdx.x % 32);
  if (row >= std::int64_t{NH} * Tn) return;
  int const i = static_cast<int>(row % Tn);
  float const* const s = S + row * Tn;
  float m = -__builtin_huge_valf();
  for (int j = lane; j <= i; j += 32) m = fmaxf(m, s[j]);
  m = attention_warp_max(m);  // key 0 <= i: finite
  float sum = 0.0f;
  for (int j = lane; j <= i; j += 32) sum += expf(s[j] - m);
  sum = attention_warp_sum(sum);
  float const l = m + logf(sum);
  T* const p = P + row * Tn;
  for (int j = lane; j < Tn; j += 32) p[j] = from_float<T>(j <= i ? expf(s[j] - l) : 0.0f);
  if (lane == 0) lse[row] = l;
}

// The backward's elementwise passes over one sequence's (NH, T, T), grid-stride:
//   dP == nullptr: out = P = e^(S - lse) for j <= i, else 0
//   dP != nullptr: out = dS = e^(S - lse) (dP - D_i) for j <= i, else 0
template <class T>
__global__ void __launch_bounds__(matmul_cuda_tuning::block)
    attention_gemm_probs_kernel(T* __restrict__ out, float const* __restrict__ S, float const* __restrict__ dP,
                                float const* __restrict__ lse, float const* __restrict__ D, int NH, int Tn) {
  std::int64_t const n = std::int64_t{NH} * Tn * Tn;
  std::int64_t const stride = std::int64_t{blockDim.x} * gridDim.x;
  for (std::int64_t e = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < n; e += stride) {
    std::int64_t const row = e / Tn;  // h T + i
    int const j = static_cast<int>(e % Tn), i = static_cast<int>(row % Tn);
    float v = 0.0f;
    if (j <= i) {
      float const p = expf(S[e] - lse[row]);
      v = dP == nullptr ? p : p * (dP[e] - D[row]);
    }
    out[e] = from_float<T>(v);
  }
}

TIDE_ABI_NAMESPACE_END

// Where the GEMM path's scratch parts lie (offsets into the caller's scratch), and its size.
struct attention_gemm_layout {
  std::size_t rowdot = 0, scores = 0, dprobs = 0, probs = 0, bytes = 0;
};
inline attention_gemm_layout attention_gemm_parts(bool backward, index_t B, index_t T, index_t NH) {
  auto const u = [](index_t x) { return static_cast<std::size_t>(x); };
  std::size_t const per_sequence = u(NH) * u(T) * u(T);
  scratch_parts parts;
  attention_gemm_layout l;
  if (backward) l.rowdot = parts.add<float>(u(B) * u(NH) * u(T));  // at 0, as the CUDA-core path's
  l.scores = parts.add<float>(per_sequence);
  if (backward) l.dprobs = parts.add<float>(per_sequence);
  l.probs = parts.add<float>(per_sequence);  // P or dS in the element type, sized for any of them
  l.bytes = parts.bytes();
  return l;
}

// Row-major C_h (M, N) = alpha op(A_h) op(B_h) + beta C_h for each head h < batch, the h-th
// matrices `sa`, `sb`, `sc` elements apart: A stored (M, K), or (K, M) when transposed; B (K, N),
// or (N, K). cuBLAS's column-major view, as matmul_cuda::gemm: C^T = op(B)^T op(A)^T.
template <class TA, class TC>
void attention_batched_gemm(exec<tide::cuda> const& ex, bool transpose_a, bool transpose_b, index_t M, index_t N,
                            index_t K, float alpha, TA const* a, index_t lda, std::int64_t sa, TA const* b,
                            index_t ldb, std::int64_t sb, float beta, TC* c, index_t ldc, std::int64_t sc,
                            index_t batch) {
  auto const i = [](index_t x) { return static_cast<int>(x); };
  check_cublas(cublasSetStream(ex.blas, ex.stream), "cublasSetStream");
  check_cublas(cublasGemmStridedBatchedEx(ex.blas, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, i(N), i(M), i(K), &alpha, b,
                                          cublas_type<TA>, i(ldb), sb, a, cublas_type<TA>, i(lda), sa, &beta, c,
                                          cublas_type<TC>, i(ldc), sc, i(batch), compute_type<TA>(ex),
                                          CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

inline void check_attention_gemm_limits(char const* op, attention_dims const& d) {
  TIDE_REQUIRE(d.T <= 46340 && d.C <= INT_MAX / 3, op,
               " on CUDA (cuBLAS) supports T <= 46340 (T^2 < 2^31) and 3C < 2^31, got T = ", d.T, ", C = ", d.C,
               "; split the sequence");
}

}  // namespace detail

TIDE_ABI_NAMESPACE_BEGIN  // the launchers too (tests/cuda/README.md)
namespace attention_gemm {

// out (B, T, C), lse (B, NH, T) from qkv (B, T, 3C); ws as attention_gemm_parts(false, ...).
template <class T>
void forward(exec<tide::cuda> const& ex, detail::attention_dims const& d, T* out, float* lse, T const* qkv,
             scratch<tide::cuda> ws) {
  auto const l = detail::attention_gemm_parts(false, d.B, d.T, d.NH);
  float* const S = detail::scratch_part<float>(ws, l.scores);  // (NH, T, T)
  T* const P = detail::scratch_part<T>(ws, l.probs);           // (NH, T, T)
  index_t const Tn = d.T, C = d.C, NH = d.NH, HS = d.HS, C3 = 3 * C;
  std::int64_t const TT = std::int64_t{Tn} * Tn;
  constexpr int rows = detail::attention_gemm_rows_block / 32;
  auto const row_blocks = static_cast<unsigned>((NH * Tn + rows - 1) / rows);
  for (index_t b = 0; b < d.B; ++b) {
    T const* const q = qkv + b * Tn * C3;  // (T, 3C): q, k, v at column 0, C, 2C; head h at + h HS
    // S_h = scale Q_h K_h^T
    detail::attention_batched_gemm<T, float>(ex, false, true, Tn, Tn, HS, attention_scale(HS), q, C3, HS, q + C, C3,
                                             HS, 0.0f, S, Tn, TT, NH);
    detail::attention_gemm_softmax_kernel<T>
        <<<row_blocks, detail::attention_gemm_rows_block, 0, ex.stream>>>(P, lse + b * NH * Tn, S,
                                                                          static_cast<int>(NH), static_cast<int>(Tn));
    TIDE_CUDA_CHECK(cudaGetLastError());
    // O_h = P_h V_h, into out's head columns
    detail::attention_batched_gemm<T, T>(ex, false, false, Tn, HS, Tn, 1.0f, P, Tn, TT, q + 2 * C, C3, HS, 0.0f,
                                         out + b * Tn * C, C, HS, NH);
  }
}

// dqkv (B, T, 3C) += the gradient, given D = dout . out per row (B, NH, T) at ws's rowdot part;
// ws as attention_gemm_parts(true, ...).
template <class T>
void backward(exec<tide::cuda> const& ex, detail::attention_dims const& d, T* dqkv, T const* dout, T const* qkv,
              float const* lse, scratch<tide::cuda> ws) {
  auto const l = detail::attention_gemm_parts(true, d.B, d.T, d.NH);
  float const* const D = detail::scratch_part<float>(ws, l.rowdot);  // (B, NH, T)
  float* const S = detail::scratch_part<float>(ws, l.scores);   // (NH, T, T)
  float* const dP = detail::scratch_part<float>(ws, l.dprobs);  // (NH, T, T)
  T* const P = detail::scratch_part<T>(ws, l.probs);            // (NH, T, T): P, then dS
  index_t const Tn = d.T, C = d.C, NH = d.NH, HS = d.HS, C3 = 3 * C;
  std::int64_t const TT = std::int64_t{Tn} * Tn;
  float const scale = attention_scale(HS);
  unsigned const grid = matmul_cuda::grid_for(NH * Tn * Tn);
  for (index_t b = 0; b < d.B; ++b) {
    T const* const q = qkv + b * Tn * C3;
    T* const dq = dqkv + b * Tn * C3;
    T const* const dO = dout + b * Tn * C;
    float const* const lse_b = lse + b * NH * Tn;
    float const* const D_b = D + b * NH * Tn;
    detail::attention_batched_gemm<T, float>(ex, false, true, Tn, Tn, HS, scale, q, C3, HS, q + C, C3, HS, 0.0f, S,
                                             Tn, TT, NH);
    detail::attention_gemm_probs_kernel<T><<<grid, matmul_cuda_tuning::block, 0, ex.stream>>>(
        P, S, nullptr, lse_b, nullptr, static_cast<int>(NH), static_cast<int>(Tn));
    TIDE_CUDA_CHECK(cudaGetLastError());
    // dV_h += P_h^T dO_h
    detail::attention_batched_gemm<T, T>(ex, true, false, Tn, HS, Tn, 1.0f, P, Tn, TT, dO, C, HS, 1.0f, dq + 2 * C,
                                         C3, HS, NH);
    // dP_h = dO_h V_h^T
    detail::attention_batched_gemm<T, float>(ex, false, true, Tn, Tn, HS, 1.0f, dO, C, HS, q + 2 * C, C3, HS, 0.0f, dP,
                                             Tn, TT, NH);
    // dS = P (dP - D), over P's room (the dV product above, on the same stream, has read P)
    detail::attention_gemm_probs_kernel<T><<<grid, matmul_cuda_tuning::block, 0, ex.stream>>>(
        P, S, dP, lse_b, D_b, static_cast<int>(NH), static_cast<int>(Tn));
    TIDE_CUDA_CHECK(cudaGetLastError());
    // dQ_h += scale dS_h K_h;  dK_h += scale dS_h^T Q_h
    detail::attention_batched_gemm<T, T>(ex, false, false, Tn, HS, Tn, scale, P, Tn, TT, q + C, C3, HS, 1.0f, dq, C3,
                                         HS, NH);
    detail::attention_batched_gemm<T, T>(ex, true, false, Tn, HS, Tn, scale, P, Tn, TT, q, C3, HS, 1.0f, dq + C, C3,
                                         HS, NH);
  }
}

}  // namespace attention_gemm
TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
