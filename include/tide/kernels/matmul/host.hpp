#pragma once
// The host path of the matmul kernels: one sgemm per product.
//
// With tide::blas (TIDE_HAS_BLAS) the products are single-threaded OpenBLAS cblas_sgemm calls on
// blocks of the output, spread over ex.pool (detail::sgemm below). Without BLAS,
// detail::sgemm_portable: the register-tiled block_gemm threaded over row blocks of C.
//
// bf16 / f16 operands are converted to float copies first (threaded, one pass each) and results
// are rounded back once: scratch of (N*C + OC*C + N*OC) floats per forward, (N*OC + N*C + OC*C)
// plus (N*C + OC*C) per backward (the calling thread's, kept for the next call: each of the five
// buffers holds the largest size any call asked of it), and one conversion pass over each
// operand, small against the 2*N*C*OC FLOP of a product for N of a few hundred rows
// (docs/kernels/matmul.md).

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "tide/core/exec.hpp"
#include "tide/kernels/detail/scratch.hpp"
#include "tide/kernels/gelu/host.hpp"
#include "tide/kernels/matmul/block_gemm.hpp"
#include "tide/kernels/matmul/checks.hpp"
#include "tide/kernels/residual/rows.hpp"

#if defined(TIDE_HAS_BLAS)
#include <cblas.h>
#endif

namespace tide::kernels {

// Host tiling of the portable sgemm. Not tuned against OpenBLAS (which the build normally has):
// a K panel of 256 rows of B and 64 rows of C per task keep B's panel in L2 and give each of
// 2 threads several tasks at N = 256.
struct matmul_host_tuning {
  static constexpr index_t task_rows = 64;     // rows of C per parallel task (portable sgemm)
  static constexpr index_t k_panel = 256;      // rows of B (columns of A) per pass (portable sgemm)
  static constexpr index_t bias_columns = 64;  // columns per task of the dbias column sums

  // BLAS blocks: up to max_blocks per product, each at least min_block wide (a multiple of 16),
  // from the shape alone. GPT-2 shapes (N = 256, C = 768, OC = 3072) get 8, 6 and 2 blocks.
  static constexpr index_t max_blocks = 8;
  static constexpr index_t min_block = 128;
  static constexpr index_t block_extent(index_t extent) noexcept {
    index_t const even = ((extent + max_blocks - 1) / max_blocks + 15) / 16 * 16;
    return even > min_block ? even : min_block;
  }
};

namespace detail {

// dst (cols, rows) = src (rows, cols)^T, src with leading dimension ld.
inline void matmul_transpose(thread_pool& pool, index_t rows, index_t cols, float const* src, index_t ld, float* dst) {
  for_rows(pool, cols, rows, [=](index_t c0, index_t c1) {
    for (index_t c = c0; c < c1; ++c)
      for (index_t r = 0; r < rows; ++r) dst[c * rows + r] = src[r * ld + c];
  });
}

// Row-major C (M, N) = op(A) (M, K) @ op(B) (K, N), or C += it; op transposes when asked (A is then
// stored (K, M), B (N, K)). block_gemm reads A^T in place; B^T is transposed into scratch first
// (the calling thread's, kept). Every element of C is summed over k in order, whatever the threads.
struct matmul_transpose_scratch;
inline void sgemm_portable(thread_pool& pool, bool transpose_a, bool transpose_b, index_t M, index_t N, index_t K,
                           float const* a, index_t lda, float const* b, index_t ldb, bool accumulate, float* c,
                           index_t ldc) {
  if (M == 0 || N == 0) return;
  if (transpose_b) {
    float* const bt = thread_scratch<matmul_transpose_scratch>(static_cast<std::size_t>(K * N));
    matmul_transpose(pool, N, K, b, ldb, bt);  // (K, N)
    b = bt;
    ldb = N;
  }
  index_t const per = matmul_host_tuning::task_rows;
  auto const tasks = static_cast<std::size_t>((M + per - 1) / per);
  parallel_for(pool, tasks, [=](std::size_t t0, std::size_t t1) {
    for (auto t = static_cast<index_t>(t0); t < static_cast<index_t>(t1); ++t) {
      index_t const m0 = t * per, rows = std::min(M, m0 + per) - m0;
      if (K == 0 && !accumulate) {
        for (index_t r = 0; r < rows; ++r) std::fill(c + (m0 + r) * ldc, c + (m0 + r) * ldc + N, 0.0f);
        continue;
      }
      for (index_t k0 = 0; k0 < K; k0 += matmul_host_tuning::k_panel) {
        index_t const kn = std::min(K, k0 + matmul_host_tuning::k_panel) - k0;
        float const* const ap = transpose_a ? a + k0 * lda + m0 : a + m0 * lda + k0;
        block_gemm(rows, N, kn, ap, lda, b + k0 * ldb, ldb, c + m0 * ldc, ldc, accumulate || k0 > 0, transpose_a);
      }
    }
  });
}

#if defined(TIDE_HAS_BLAS)
// OpenBLAS runs single-threaded inside our tasks (set only when it differs: the call is global).
inline void blas_single_thread() {
#if defined(OPENBLAS_VERSION)
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
#endif
}
#endif

// The product the kernels use, row-major C (M, N) = op(A) @ op(B) (+= when accumulate).
//
// With BLAS: C is cut into blocks of whole rows (M >= N) or whole columns, one single-threaded
// cblas_sgemm per block, blocks spread over ex.pool. The cut depends only on the shape, never on
// the thread count, so the bits do not either (OpenBLAS's own threading changes its blocking with
// the thread count, and with it the rounding). Cutting the longer side re-packs the smaller
// operand in every block. Without BLAS: sgemm_portable.
inline void sgemm(thread_pool& pool, bool transpose_a, bool transpose_b, index_t M, index_t N, index_t K,
                  float const* a, index_t lda, float const* b, index_t ldb, bool accumulate, float* c, index_t ldc) {
#if defined(TIDE_HAS_BLAS)
  if (M == 0 || N == 0) return;
  blas_single_thread();
  bool const by_rows = M >= N;
  index_t const extent = by_rows ? M : N;
  index_t const per = matmul_host_tuning::block_extent(extent);
  auto const blocks = static_cast<std::size_t>((extent + per - 1) / per);
  auto const ta = transpose_a ? CblasTrans : CblasNoTrans;
  auto const tb = transpose_b ? CblasTrans : CblasNoTrans;
  float const beta = accumulate ? 1.0f : 0.0f;
  parallel_for(pool, blocks, [=](std::size_t b0, std::size_t b1) {
    for (auto i = static_cast<index_t>(b0); i < static_cast<index_t>(b1); ++i) {
      index_t const first = i * per, count = std::min(extent, first + per) - first;
      if (by_rows)  // rows [first, first + count) of C and of op(A)
        cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(count), static_cast<int>(N), static_cast<int>(K), 1.0f,
                    a + (transpose_a ? first : first * lda), static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                    c + first * ldc, static_cast<int>(ldc));
      else  // columns [first, first + count) of C and of op(B)
        cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(M), static_cast<int>(count), static_cast<int>(K), 1.0f, a,
                    static_cast<int>(lda), b + (transpose_b ? first * ldb : first), static_cast<int>(ldb), beta,
                    c + first, static_cast<int>(ldc));
    }
  });
#else
  sgemm_portable(pool, transpose_a, transpose_b, M, N, K, a, lda, b, ldb, accumulate, c, ldc);
#endif
}

// The float copies of bf16 / f16 operands and results: the calling thread's scratch, kept for the
// next call, one buffer per role (the roles of one call are live at once). out serves the
// forward's result and the backward's dout (both N x OC, never in one call).
enum class matmul_role : int { inp, weight, out, dinp, dweight };
template <matmul_role Role>
struct matmul_scratch;

// A read-only operand as floats: the data itself for float, a converted copy otherwise.
template <Element T, matmul_role Role>
class matmul_operand {
 public:
  matmul_operand(thread_pool& pool, T const* data, index_t n) {
    if constexpr (std::is_same_v<T, float>) {
      (void)pool, (void)n;
      data_ = data;
    } else {
      float* const dst = thread_scratch<matmul_scratch<Role>>(static_cast<std::size_t>(n));
      for_elements(pool, n, [=](index_t b, index_t e) {
        for (index_t i = b; i < e; ++i) dst[i] = to_float(data[i]);
      });
      data_ = dst;
    }
  }
  [[nodiscard]] float const* data() const noexcept { return data_; }

 private:
  float const* data_ = nullptr;
};

// An output as floats: the tensor itself for float; otherwise a float scratch that finish()
// rounds into the tensor (assigned, or added to its old values when Accumulate).
template <Element T, bool Accumulate, matmul_role Role>
class matmul_result {
 public:
  matmul_result(T* data, index_t n) : out_(data), n_(n) {
    if constexpr (!std::is_same_v<T, float>) scratch_ = thread_scratch<matmul_scratch<Role>>(static_cast<std::size_t>(n));
  }
  [[nodiscard]] float* data() const noexcept {
    if constexpr (std::is_same_v<T, float>)
      return out_;
    else
      return scratch_;
  }
  // Whether an sgemm into data() accumulates: into the tensor itself, yes when Accumulate.
  [[nodiscard]] static constexpr bool accumulate() noexcept { return Accumulate && std::is_same_v<T, float>; }
  void finish(thread_pool& pool) const {
    if constexpr (!std::is_same_v<T, float>) {
      T* const o = out_;
      float const* const s = scratch_;
      for_elements(pool, n_, [=](index_t b, index_t e) {
        for (index_t i = b; i < e; ++i) o[i] = from_float<T>(Accumulate ? to_float(o[i]) + s[i] : s[i]);
      });
    }
  }

 private:
  T* out_;
  index_t n_;
  float* scratch_ = nullptr;
};

// dbias(o) += sum over rows of g(n, o), rows in order: the same for any thread count.
template <Element T>
void matmul_column_sums(thread_pool& pool, float const* g, index_t N, index_t OC, T* dbias) {
  constexpr index_t B = matmul_host_tuning::bias_columns;
  auto const tasks = static_cast<std::size_t>((OC + B - 1) / B);
  parallel_for(pool, tasks, [=](std::size_t t0, std::size_t t1) {
    for (auto t = static_cast<index_t>(t0); t < static_cast<index_t>(t1); ++t) {
      index_t const c0 = t * B, w = std::min(OC, c0 + B) - c0;
      float acc[B] = {};
      for (index_t n = 0; n < N; ++n) {
        float const* __restrict row = g + n * OC + c0;
        for (index_t j = 0; j < w; ++j) acc[j] += row[j];
      }
      for (index_t j = 0; j < w; ++j) dbias[c0 + j] = from_float<T>(to_float(dbias[c0 + j]) + acc[j]);
    }
  });
}

}  // namespace detail

// out = inp @ weight^T + bias. inp (N, C) or (B, T, C); weight (OC, C); bias (OC) or {} for none;
// out (N, OC) or (B, T, OC). The bias is written into out first and the sgemm adds to it.
template <Element T, class X, class W>
  requires ReadView<X, T> && ReadView<W, T>
void matmul_forward(exec<host> const& ex, tensor_view<T> out, X inp, W weight,
                    std::type_identity_t<tensor_view<T const>> bias = {}) {
  auto const d = detail::check_matmul_forward(out, inp, weight, bias);
  if (d.N == 0) return;
  using role = detail::matmul_role;
  detail::matmul_operand<T, role::inp> const x(ex.pool, inp.data(), d.N * d.C);
  detail::matmul_operand<T, role::weight> const w(ex.pool, weight.data(), d.OC * d.C);
  detail::matmul_result<T, false, role::out> const y(out.data(), d.N * d.OC);
  bool const with_bias = detail::matmul_given(bias);
  if (with_bias) {
    float* const o = y.data();
    T const* const b = bias.data();
    detail::for_rows(ex.pool, d.N, d.OC, [=](index_t n0, index_t n1) {
      for (index_t n = n0; n < n1; ++n)
        for (index_t j = 0; j < d.OC; ++j) o[n * d.OC + j] = to_float(b[j]);
    });
  }
  detail::sgemm(ex.pool, false, true, d.N, d.OC, d.C, x.data(), d.C, w.data(), d.C, with_bias, y.data(), d.OC);
  y.finish(ex.pool);
}

// pre = inp @ weight^T + bias (kept for the backward), out = gelu(pre) (tanh form, the GELU
// kernel's gelu_tanh on the stored pre). Shapes as matmul_forward; pre has out's shape.
template <Element T, class X, class W>
  requires ReadView<X, T> && ReadView<W, T>
void matmul_forward_gelu(exec<host> const& ex, tensor_view<T> out, tensor_view<T> pre, X inp, W weight,
                         std::type_identity_t<tensor_view<T const>> bias = {}) {
  detail::check_matmul_forward_gelu(out, pre, inp, weight, bias);
  matmul_forward(ex, pre, inp, weight, bias);
  gelu_forward(ex, out, tensor_view<T const>(pre));
}

// dinp += dout @ weight; dweight += dout^T @ inp; dbias += the column sums of dout (dbias may be
// {}). Shapes: dinp as inp, dweight as weight, dbias (OC), dout as out.
template <Element T, class D, class X, class W>
  requires ReadView<D, T> && ReadView<X, T> && ReadView<W, T>
void matmul_backward(exec<host> const& ex, tensor_view<T> dinp, tensor_view<T> dweight,
                     std::type_identity_t<tensor_view<T>> dbias, D dout, X inp, W weight) {
  auto const d = detail::check_matmul_backward("matmul_backward", dinp, dweight, dbias, dout, inp, weight,
                                               detail::region::use::read);
  if (d.N == 0) return;
  // Every allocation (a scratch that grows) happens before the first write.
  using role = detail::matmul_role;
  detail::matmul_operand<T, role::out> const g(ex.pool, dout.data(), d.N * d.OC);
  detail::matmul_operand<T, role::inp> const x(ex.pool, inp.data(), d.N * d.C);
  detail::matmul_operand<T, role::weight> const w(ex.pool, weight.data(), d.OC * d.C);
  detail::matmul_result<T, true, role::dinp> const di(dinp.data(), d.N * d.C);
  detail::matmul_result<T, true, role::dweight> const dw(dweight.data(), d.OC * d.C);
  // dinp (N, C) += g (N, OC) @ w (OC, C)
  detail::sgemm(ex.pool, false, false, d.N, d.C, d.OC, g.data(), d.OC, w.data(), d.C, di.accumulate(), di.data(), d.C);
  // dweight (OC, C) += g^T (OC, N) @ x (N, C)
  detail::sgemm(ex.pool, true, false, d.OC, d.C, d.N, g.data(), d.OC, x.data(), d.C, dw.accumulate(), dw.data(), d.C);
  di.finish(ex.pool);
  dw.finish(ex.pool);
  if (detail::matmul_given(dbias)) detail::matmul_column_sums(ex.pool, g.data(), d.N, d.OC, dbias.data());
}

// The backward of matmul_forward_gelu. dout is the gradient of out = gelu(pre); it is first
// overwritten, in place, with the gradient of pre (dout * gelu'(pre), rounded to T), which then
// drives matmul_backward.
template <Element T, class P, class X, class W>
  requires ReadView<P, T> && ReadView<X, T> && ReadView<W, T>
void matmul_backward_gelu(exec<host> const& ex, tensor_view<T> dinp, tensor_view<T> dweight,
                          std::type_identity_t<tensor_view<T>> dbias, tensor_view<T> dout, P pre, X inp, W weight) {
  detail::check_matmul_backward("matmul_backward_gelu", dinp, dweight, dbias, dout, inp, weight,
                                detail::region::use::written);
  detail::check_matmul_gelu_pre(dout, pre);
  gelu_backward(ex, dout, tensor_view<T const>(pre), tensor_view<T const>(dout));
  matmul_backward(ex, dinp, dweight, dbias, tensor_view<T const>(dout), inp, weight);
}

}  // namespace tide::kernels
