#pragma once
// detail::block_gemm: C (M, N) = A (M, K) @ B (K, N), or C += A @ B, or the same with A^T (A
// stored (K, M)), on row-major float blocks with leading dimensions. The inner GEMM of the host
// attention (64 x 64 tiles that live in L1/L2) and of the matmul when no BLAS is linked; it is
// not a replacement for a packed BLAS sgemm on large matrices.
//
// Register tiles of `rows` rows x `vectors` vectors of C stay in registers while k runs over K:
// each step loads `vectors` vectors of B's row k, broadcasts one element of A per row, and does
// rows x vectors multiply-adds. g++ and clang get GCC vector types (one full register each, FMA
// with -march=...fma); other compilers get the same loop order on scalars. Columns past the last
// whole vector group go through a scalar tile, rows past the last whole tile through smaller ones.
//
// Every element of C is summed over k = 0, 1, ..., K-1 in order, starting from C's old value (+=)
// or from 0, with the same operations whichever row tile it falls in: the result does not depend
// on how callers split the rows (M) between threads.

#include <cstring>

#include "tide/core/tensor_view.hpp"

namespace tide::kernels {

// Register tile per instruction set. Measured on 64 x 64 x 64 blocks (thread CPU time, the
// shared 2-vCPU Xeon with AVX-512): 8 rows x 2 zmm 127 GFLOP/s per core, 4 x 2 108, 6 x 2 121,
// 4 x 4 128, 8 x 4 116; repeated runs spread 97-128 for all, so 8 x 2 (16 of 32 registers,
// 64-row blocks in 8 whole tiles). AVX2: 6 x 2 ymm (12 of 16 registers), about 75.
struct block_gemm_tuning {
#if defined(__AVX512F__)
  static constexpr int vector_bytes = 64;
  static constexpr int rows = 8;
#elif defined(__AVX__)
  static constexpr int vector_bytes = 32;
  static constexpr int rows = 6;
#else
  static constexpr int vector_bytes = 16;
  static constexpr int rows = 4;
#endif
  static constexpr int vectors = 2;
  static constexpr int lanes = vector_bytes / static_cast<int>(sizeof(float));
  static constexpr int columns = vectors * lanes;  // of one register tile
};

namespace detail {

#if defined(__GNUC__)
using block_vector = float __attribute__((vector_size(block_gemm_tuning::vector_bytes)));

// C[0:R, 0:columns] (+)= A[0:R, 0:K] @ B[0:K, 0:columns].
template <int R, bool Accumulate, bool TransA>
inline void gemm_tile(index_t K, float const* __restrict a, index_t lda, float const* __restrict b, index_t ldb,
                      float* __restrict c, index_t ldc) noexcept {
  constexpr int V = block_gemm_tuning::vectors;
  constexpr int L = block_gemm_tuning::lanes;
  block_vector acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      if constexpr (Accumulate)
        std::memcpy(&acc[r][v], c + r * ldc + v * L, sizeof(block_vector));
      else
        acc[r][v] = block_vector{};
    }
  for (index_t k = 0; k < K; ++k) {
    block_vector bv[V];
    for (int v = 0; v < V; ++v) std::memcpy(&bv[v], b + k * ldb + v * L, sizeof(block_vector));
    for (int r = 0; r < R; ++r) {
      float const av = TransA ? a[k * lda + r] : a[r * lda + k];
      for (int v = 0; v < V; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) std::memcpy(c + r * ldc + v * L, &acc[r][v], sizeof(block_vector));
}
#else
template <int R, bool Accumulate, bool TransA>
inline void gemm_tile(index_t K, float const* __restrict a, index_t lda, float const* __restrict b, index_t ldb,
                      float* __restrict c, index_t ldc) noexcept {
  constexpr int W = block_gemm_tuning::columns;
  float acc[R][W];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) acc[r][j] = Accumulate ? c[r * ldc + j] : 0.0f;
  for (index_t k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r) {
      float const av = TransA ? a[k * lda + r] : a[r * lda + k];
      for (int j = 0; j < W; ++j) acc[r][j] += av * b[k * ldb + j];
    }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) c[r * ldc + j] = acc[r][j];
}
#endif

// The same for the last `width` < columns columns.
template <int R, bool Accumulate, bool TransA>
inline void gemm_tile_tail(index_t K, int width, float const* __restrict a, index_t lda, float const* __restrict b,
                           index_t ldb, float* __restrict c, index_t ldc) noexcept {
  float acc[R][block_gemm_tuning::columns];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < width; ++j) acc[r][j] = Accumulate ? c[r * ldc + j] : 0.0f;
  for (index_t k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r) {
      float const av = TransA ? a[k * lda + r] : a[r * lda + k];
      for (int j = 0; j < width; ++j) acc[r][j] += av * b[k * ldb + j];
    }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < width; ++j) c[r * ldc + j] = acc[r][j];
}

// R rows of C, all N columns.
template <int R, bool Accumulate, bool TransA>
inline void gemm_row_tile(index_t N, index_t K, float const* a, index_t lda, float const* b, index_t ldb, float* c,
                          index_t ldc) noexcept {
  constexpr index_t W = block_gemm_tuning::columns;
  index_t n = 0;
  for (; n + W <= N; n += W) gemm_tile<R, Accumulate, TransA>(K, a, lda, b + n, ldb, c + n, ldc);
  if (n < N) gemm_tile_tail<R, Accumulate, TransA>(K, static_cast<int>(N - n), a, lda, b + n, ldb, c + n, ldc);
}

template <bool Accumulate, bool TransA>
inline void block_gemm_impl(index_t M, index_t N, index_t K, float const* a, index_t lda, float const* b, index_t ldb,
                            float* c, index_t ldc) noexcept {
  constexpr index_t R = block_gemm_tuning::rows;
  auto const rows_of_a = [=](index_t m) { return TransA ? a + m : a + m * lda; };
  index_t m = 0;
  for (; m + R <= M; m += R) gemm_row_tile<R, Accumulate, TransA>(N, K, rows_of_a(m), lda, b, ldb, c + m * ldc, ldc);
  // Remaining rows in tiles of 4, 2, 1 (R >= 4 always).
  for (; m + 4 <= M; m += 4) gemm_row_tile<4, Accumulate, TransA>(N, K, rows_of_a(m), lda, b, ldb, c + m * ldc, ldc);
  for (; m + 2 <= M; m += 2) gemm_row_tile<2, Accumulate, TransA>(N, K, rows_of_a(m), lda, b, ldb, c + m * ldc, ldc);
  for (; m < M; ++m) gemm_row_tile<1, Accumulate, TransA>(N, K, rows_of_a(m), lda, b, ldb, c + m * ldc, ldc);
}

// C (M, N) = A @ B (accumulate false) or C += A @ B (true), A (M, K); with transpose_a, A is
// stored (K, M) and C (+)= A^T @ B. C must not overlap A or B.
inline void block_gemm(index_t M, index_t N, index_t K, float const* a, index_t lda, float const* b, index_t ldb,
                       float* c, index_t ldc, bool accumulate, bool transpose_a = false) noexcept {
  if (transpose_a) {
    if (accumulate)
      block_gemm_impl<true, true>(M, N, K, a, lda, b, ldb, c, ldc);
    else
      block_gemm_impl<false, true>(M, N, K, a, lda, b, ldb, c, ldc);
  } else {
    if (accumulate)
      block_gemm_impl<true, false>(M, N, K, a, lda, b, ldb, c, ldc);
    else
      block_gemm_impl<false, false>(M, N, K, a, lda, b, ldb, c, ldc);
  }
}

}  // namespace detail
}  // namespace tide::kernels
