#pragma once
// The host path of the matmul kernels: one sgemm per product.
//
// With tide::blas (TIDE_HAS_BLAS) the products are single-threaded OpenBLAS cblas_sgemm calls on
// blocks of the output, spread over ex.pool (detail::sgemm below). Without BLAS,
// detail::sgemm_portable: the register-tiled block_gemm threaded over row blocks of C.
//
// bf16 / f16 operands are converted to float copies first (threaded, one pass each) and results
// are rounded back once: scratch of (N*C + OC*C + N*OC) floats per forward, (N*OC + N*C + OC*C)
// plus (N*C + OC*C) per backward, from the caller (kernels/scratch.hpp:
// matmul_forward_scratch_bytes, matmul_backward_scratch_bytes), and one conversion pass over each
// operand, small against the 2*N*C*OC FLOP of a product for N of a few hundred rows
// (docs/kernels/matmul.md). Float operands need no scratch with BLAS; the portable sgemm
// transposes the forward's weight into C*OC floats of it.

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "tide/core/exec.hpp"
#include "tide/kernels/gelu/host.hpp"
#include "tide/kernels/matmul/block_gemm.hpp"
#include "tide/kernels/matmul/checks.hpp"
#include "tide/kernels/residual/rows.hpp"
#include "tide/kernels/scratch.hpp"

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
// stored (K, M), B (N, K)). block_gemm reads A^T in place; B^T is transposed into `bt` first (K * N
// floats of the caller's; unused without transpose_b). Every element of C is summed over k in
// order, whatever the threads.
inline void sgemm_portable(thread_pool& pool, bool transpose_a, bool transpose_b, index_t M, index_t N, index_t K,
                           float const* a, index_t lda, float const* b, index_t ldb, bool accumulate, float* c,
                           index_t ldc, float* bt) {
  if (M == 0 || N == 0) return;
  if (transpose_b) {
    TIDE_ASSERT(bt != nullptr || K == 0);  // K * N floats, none when K = 0
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

// The product the kernels use, row-major C (M, N) = op(A) @ op(B) (+= when accumulate). `bt`:
// K * N floats for the portable path's transposed B (sgemm_transpose_floats), else unused.
//
// With BLAS: C is cut into blocks of whole rows (M >= N) or whole columns, one single-threaded
// cblas_sgemm per block, blocks spread over ex.pool. The cut depends only on the shape, never on
// the thread count, so the bits do not either (OpenBLAS's own threading changes its blocking with
// the thread count, and with it the rounding). Cutting the longer side re-packs the smaller
// operand in every block. Without BLAS: sgemm_portable.
inline void sgemm(thread_pool& pool, bool transpose_a, bool transpose_b, index_t M, index_t N, index_t K,
                  float const* a, index_t lda, float const* b, index_t ldb, bool accumulate, float* c, index_t ldc,
                  float* bt) {
#if defined(TIDE_HAS_BLAS)
  (void)bt;
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
  sgemm_portable(pool, transpose_a, transpose_b, M, N, K, a, lda, b, ldb, accumulate, c, ldc, bt);
#endif
}

// Floats of scratch sgemm needs for a transposed B of (N, K): none with BLAS.
constexpr std::size_t sgemm_transpose_floats(bool transpose_b, index_t N, index_t K) noexcept {
#if defined(TIDE_HAS_BLAS)
  (void)transpose_b, (void)N, (void)K;
  return 0;
#else
  return transpose_b ? static_cast<std::size_t>(N * K) : 0;
#endif
}

// The float copies of bf16 / f16 operands and results, in the caller's scratch (one part per
// role: the roles of one call are live at once).
template <Element T>
inline constexpr bool matmul_copies = !std::is_same_v<T, float>;

// A matmul call's scratch: offsets of its parts (unused ones 0) and the total.
struct matmul_parts {
  std::size_t inp = 0, weight = 0, out = 0, dinp = 0, dweight = 0, transposed = 0, bytes = 0;
};
template <Element T>
matmul_parts matmul_forward_parts(index_t N, index_t C, index_t OC) noexcept {
  scratch_parts p;
  matmul_parts m;
  auto const n = [](index_t a, index_t b) { return static_cast<std::size_t>(a * b); };
  if constexpr (matmul_copies<T>) {
    m.inp = p.add<float>(n(N, C));
    m.weight = p.add<float>(n(OC, C));
    m.out = p.add<float>(n(N, OC));
  }
  if (std::size_t const t = sgemm_transpose_floats(true, OC, C); t != 0) m.transposed = p.add<float>(t);
  m.bytes = p.bytes();
  return m;
}
template <Element T>
matmul_parts matmul_backward_parts(index_t N, index_t C, index_t OC) noexcept {
  scratch_parts p;
  matmul_parts m;
  auto const n = [](index_t a, index_t b) { return static_cast<std::size_t>(a * b); };
  if constexpr (matmul_copies<T>) {
    m.out = p.add<float>(n(N, OC));  // dout
    m.inp = p.add<float>(n(N, C));
    m.weight = p.add<float>(n(OC, C));
    m.dinp = p.add<float>(n(N, C));
    m.dweight = p.add<float>(n(OC, C));
  }
  m.bytes = p.bytes();
  return m;
}

// A read-only operand as floats: the data itself for float, a converted copy (at `copy`) otherwise.
template <Element T>
class matmul_operand {
 public:
  matmul_operand(thread_pool& pool, T const* data, index_t n, float* copy) {
    if constexpr (!matmul_copies<T>) {
      (void)pool, (void)n, (void)copy;
      data_ = data;
    } else {
      for_elements(pool, n, [=](index_t b, index_t e) {
        for (index_t i = b; i < e; ++i) copy[i] = to_float(data[i]);
      });
      data_ = copy;
    }
  }
  [[nodiscard]] float const* data() const noexcept { return data_; }

 private:
  float const* data_ = nullptr;
};

// An output as floats: the tensor itself for float; otherwise a float copy (at `copy`) that
// finish() rounds into the tensor (assigned, or added to its old values when Accumulate).
template <Element T, bool Accumulate>
class matmul_result {
 public:
  matmul_result(T* data, index_t n, float* copy) : out_(data), n_(n), scratch_(copy) {}
  [[nodiscard]] float* data() const noexcept {
    if constexpr (!matmul_copies<T>)
      return out_;
    else
      return scratch_;
  }
  // Whether an sgemm into data() accumulates: into the tensor itself, yes when Accumulate.
  [[nodiscard]] static constexpr bool accumulate() noexcept { return Accumulate && !matmul_copies<T>; }
  void finish(thread_pool& pool) const {
    if constexpr (matmul_copies<T>) {
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
  float* scratch_;
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

// dinp (N, C) += g (N, OC) @ w (OC, C); g as floats (matmul_operand).
template <Element T>
void matmul_input_pass(thread_pool& pool, matmul_dims const& d, float const* g, T const* weight, T* dinp,
                       matmul_parts const& parts, scratch<host> ws) {
  auto const at = [&](std::size_t offset) { return scratch_part<float>(ws, offset); };
  matmul_operand<T> const w(pool, weight, d.OC * d.C, at(parts.weight));
  matmul_result<T, true> const di(dinp, d.N * d.C, at(parts.dinp));
  sgemm(pool, false, false, d.N, d.C, d.OC, g, d.OC, w.data(), d.C, di.accumulate(), di.data(), d.C, nullptr);
  di.finish(pool);
}
// dweight (OC, C) += g^T (OC, N) @ x (N, C); dbias (or null) += the column sums of g.
template <Element T>
void matmul_weight_pass(thread_pool& pool, matmul_dims const& d, float const* g, T const* inp, T* dweight, T* dbias,
                        matmul_parts const& parts, scratch<host> ws) {
  auto const at = [&](std::size_t offset) { return scratch_part<float>(ws, offset); };
  matmul_operand<T> const x(pool, inp, d.N * d.C, at(parts.inp));
  matmul_result<T, true> const dw(dweight, d.OC * d.C, at(parts.dweight));
  sgemm(pool, true, false, d.OC, d.C, d.N, g, d.OC, x.data(), d.C, dw.accumulate(), dw.data(), d.C, nullptr);
  dw.finish(pool);
  if (dbias != nullptr) matmul_column_sums(pool, g, d.N, d.OC, dbias);
}

}  // namespace detail

// Scratch of matmul_forward / matmul_forward_gelu and of matmul_backward / matmul_backward_gelu
// for inp (N, C), weight (OC, C), element type T: float copies of bf16 / f16 operands, and the
// portable sgemm's transposed weight (none with BLAS).
template <Element T>
std::size_t matmul_forward_scratch_bytes(exec<host> const&, index_t N, index_t C, index_t OC) noexcept {
  return detail::matmul_forward_parts<T>(N, C, OC).bytes;
}
template <Element T>
std::size_t matmul_backward_scratch_bytes(exec<host> const&, index_t N, index_t C, index_t OC) noexcept {
  return detail::matmul_backward_parts<T>(N, C, OC).bytes;
}

// out = inp @ weight^T + bias. inp (N, C) or (B, T, C); weight (OC, C); bias (OC) or {} for none;
// out (N, OC) or (B, T, OC). The bias is written into out first and the sgemm adds to it.
template <Element T, class X, class W>
  requires ReadView<X, T> && ReadView<W, T>
void matmul_forward(exec<host> const& ex, tensor_view<T> out, X inp, W weight,
                    std::type_identity_t<tensor_view<T const>> bias, scratch<host> ws) {
  auto const d = detail::check_matmul_forward(out, inp, weight, bias);
  auto const parts = detail::matmul_forward_parts<T>(d.N, d.C, d.OC);
  detail::check_scratch("matmul_forward", "matmul_forward_scratch_bytes", ws, parts.bytes);
  if (d.N == 0) return;
  auto const at = [&](std::size_t offset) { return detail::scratch_part<float>(ws, offset); };
  detail::matmul_operand<T> const x(ex.pool, inp.data(), d.N * d.C, at(parts.inp));
  detail::matmul_operand<T> const w(ex.pool, weight.data(), d.OC * d.C, at(parts.weight));
  detail::matmul_result<T, false> const y(out.data(), d.N * d.OC, at(parts.out));
  bool const with_bias = detail::matmul_given(bias);
  if (with_bias) {
    float* const o = y.data();
    T const* const b = bias.data();
    detail::for_rows(ex.pool, d.N, d.OC, [=](index_t n0, index_t n1) {
      for (index_t n = n0; n < n1; ++n)
        for (index_t j = 0; j < d.OC; ++j) o[n * d.OC + j] = to_float(b[j]);
    });
  }
  detail::sgemm(ex.pool, false, true, d.N, d.OC, d.C, x.data(), d.C, w.data(), d.C, with_bias, y.data(), d.OC,
                at(parts.transposed));
  y.finish(ex.pool);
}

// pre = inp @ weight^T + bias (kept for the backward), out = gelu(pre) (tanh form, the GELU
// kernel's gelu_tanh on the stored pre). Shapes as matmul_forward; pre has out's shape.
template <Element T, class X, class W>
  requires ReadView<X, T> && ReadView<W, T>
void matmul_forward_gelu(exec<host> const& ex, tensor_view<T> out, tensor_view<T> pre, X inp, W weight,
                         std::type_identity_t<tensor_view<T const>> bias, scratch<host> ws) {
  detail::check_matmul_forward_gelu(out, pre, inp, weight, bias);
  matmul_forward(ex, pre, inp, weight, bias, ws);
  gelu_forward(ex, out, tensor_view<T const>(pre));
}

// dinp += dout @ weight; dweight += dout^T @ inp; dbias += the column sums of dout (dbias may be
// {}). Shapes: dinp as inp, dweight as weight, dbias (OC), dout as out.
template <Element T, class D, class X, class W>
  requires ReadView<D, T> && ReadView<X, T> && ReadView<W, T>
void matmul_backward(exec<host> const& ex, tensor_view<T> dinp, tensor_view<T> dweight,
                     std::type_identity_t<tensor_view<T>> dbias, D dout, X inp, W weight, scratch<host> ws) {
  auto const d = detail::check_matmul_backward("matmul_backward", dinp, dweight, dbias, dout, inp, weight,
                                               detail::region::use::read);
  auto const parts = detail::matmul_backward_parts<T>(d.N, d.C, d.OC);
  detail::check_scratch("matmul_backward", "matmul_backward_scratch_bytes", ws, parts.bytes);
  if (d.N == 0) return;
  auto const at = [&](std::size_t offset) { return detail::scratch_part<float>(ws, offset); };
  detail::matmul_operand<T> const g(ex.pool, dout.data(), d.N * d.OC, at(parts.out));
  detail::matmul_input_pass<T>(ex.pool, d, g.data(), weight.data(), dinp.data(), parts, ws);
  detail::matmul_weight_pass<T>(ex.pool, d, g.data(), inp.data(), dweight.data(), dbias.data(), parts, ws);
}

// The two halves of matmul_backward, for a backward split in two (zero-bubble pipelines: input
// gradients in B, weight gradients later in W). Each gives the bits of its outputs in
// matmul_backward: the same products in the same blocks. Scratch: matmul_backward_scratch_bytes.
//   matmul_backward_input(ex, dinp, dout, weight, ws);          // dinp += dout @ weight
//   matmul_backward_weight(ex, dweight, dbias, dout, inp, ws);  // dweight += dout^T @ inp, dbias +=
template <Element T, class D, class W>
  requires ReadView<D, T> && ReadView<W, T>
void matmul_backward_input(exec<host> const& ex, tensor_view<T> dinp, D dout, W weight, scratch<host> ws) {
  auto const d = detail::check_matmul_backward_input("matmul_backward_input", dinp, dout, weight,
                                                     detail::region::use::read);
  auto const parts = detail::matmul_backward_parts<T>(d.N, d.C, d.OC);
  detail::check_scratch("matmul_backward_input", "matmul_backward_scratch_bytes", ws, parts.bytes);
  if (d.N == 0) return;
  detail::matmul_operand<T> const g(ex.pool, dout.data(), d.N * d.OC, detail::scratch_part<float>(ws, parts.out));
  detail::matmul_input_pass<T>(ex.pool, d, g.data(), weight.data(), dinp.data(), parts, ws);
}
template <Element T, class D, class X>
  requires ReadView<D, T> && ReadView<X, T>
void matmul_backward_weight(exec<host> const& ex, tensor_view<T> dweight, std::type_identity_t<tensor_view<T>> dbias,
                            D dout, X inp, scratch<host> ws) {
  auto const d = detail::check_matmul_backward_weight(dweight, dbias, dout, inp);
  auto const parts = detail::matmul_backward_parts<T>(d.N, d.C, d.OC);
  detail::check_scratch("matmul_backward_weight", "matmul_backward_scratch_bytes", ws, parts.bytes);
  if (d.N == 0) return;
  detail::matmul_operand<T> const g(ex.pool, dout.data(), d.N * d.OC, detail::scratch_part<float>(ws, parts.out));
  detail::matmul_weight_pass<T>(ex.pool, d, g.data(), inp.data(), dweight.data(), dbias.data(), parts, ws);
}

// The backward of matmul_forward_gelu. dout is the gradient of out = gelu(pre); it is first
// overwritten, in place, with the gradient of pre (dout * gelu'(pre), rounded to T), which then
// drives matmul_backward.
template <Element T, class P, class X, class W>
  requires ReadView<P, T> && ReadView<X, T> && ReadView<W, T>
void matmul_backward_gelu(exec<host> const& ex, tensor_view<T> dinp, tensor_view<T> dweight,
                          std::type_identity_t<tensor_view<T>> dbias, tensor_view<T> dout, P pre, X inp, W weight,
                          scratch<host> ws) {
  auto const d = detail::check_matmul_backward("matmul_backward_gelu", dinp, dweight, dbias, dout, inp, weight,
                                               detail::region::use::written);
  detail::check_matmul_gelu_pre(dout, pre);
  detail::check_scratch("matmul_backward_gelu", "matmul_backward_scratch_bytes", ws,
                        detail::matmul_backward_parts<T>(d.N, d.C, d.OC).bytes);
  gelu_backward(ex, dout, tensor_view<T const>(pre), tensor_view<T const>(dout));
  matmul_backward(ex, dinp, dweight, dbias, tensor_view<T const>(dout), inp, weight, ws);
}

// matmul_backward_gelu's first half: dout <- dout * gelu'(pre) in place, then dinp += dout @
// weight. The rewritten dout is what matmul_backward_weight then takes (with inp) for the
// weight gradients.
template <Element T, class P, class W>
  requires ReadView<P, T> && ReadView<W, T>
void matmul_backward_gelu_input(exec<host> const& ex, tensor_view<T> dinp, tensor_view<T> dout, P pre, W weight,
                                scratch<host> ws) {
  auto const d = detail::check_matmul_backward_input("matmul_backward_gelu_input", dinp, dout, weight,
                                                     detail::region::use::written);
  detail::check_matmul_gelu_pre(dout, pre, "matmul_backward_gelu_input");
  detail::check_scratch("matmul_backward_gelu_input", "matmul_backward_scratch_bytes", ws,
                        detail::matmul_backward_parts<T>(d.N, d.C, d.OC).bytes);
  gelu_backward(ex, dout, tensor_view<T const>(pre), tensor_view<T const>(dout));
  matmul_backward_input(ex, dinp, tensor_view<T const>(dout), weight, ws);
}

// The same four on the host with scratch allocated for the one call (kernels/scratch.hpp).
template <Element T, class X, class W>
  requires ReadView<X, T> && ReadView<W, T>
void matmul_forward(exec<host> const& ex, tensor_view<T> out, X inp, W weight,
                    std::type_identity_t<tensor_view<T const>> bias = {}) {
  auto const d = detail::check_matmul_forward(out, inp, weight, bias);
  detail::call_scratch const ws(matmul_forward_scratch_bytes<T>(ex, d.N, d.C, d.OC));
  matmul_forward(ex, out, inp, weight, bias, ws.get());
}
template <Element T, class X, class W>
  requires ReadView<X, T> && ReadView<W, T>
void matmul_forward_gelu(exec<host> const& ex, tensor_view<T> out, tensor_view<T> pre, X inp, W weight,
                         std::type_identity_t<tensor_view<T const>> bias = {}) {
  auto const d = detail::check_matmul_forward_gelu(out, pre, inp, weight, bias);
  detail::call_scratch const ws(matmul_forward_scratch_bytes<T>(ex, d.N, d.C, d.OC));
  matmul_forward_gelu(ex, out, pre, inp, weight, bias, ws.get());
}
template <Element T, class D, class X, class W>
  requires ReadView<D, T> && ReadView<X, T> && ReadView<W, T>
void matmul_backward(exec<host> const& ex, tensor_view<T> dinp, tensor_view<T> dweight,
                     std::type_identity_t<tensor_view<T>> dbias, D dout, X inp, W weight) {
  auto const d = detail::check_matmul_backward("matmul_backward", dinp, dweight, dbias, dout, inp, weight,
                                               detail::region::use::read);
  detail::call_scratch const ws(matmul_backward_scratch_bytes<T>(ex, d.N, d.C, d.OC));
  matmul_backward(ex, dinp, dweight, dbias, dout, inp, weight, ws.get());
}
template <Element T, class P, class X, class W>
  requires ReadView<P, T> && ReadView<X, T> && ReadView<W, T>
void matmul_backward_gelu(exec<host> const& ex, tensor_view<T> dinp, tensor_view<T> dweight,
                          std::type_identity_t<tensor_view<T>> dbias, tensor_view<T> dout, P pre, X inp, W weight) {
  auto const d = detail::check_matmul_backward("matmul_backward_gelu", dinp, dweight, dbias, dout, inp, weight,
                                               detail::region::use::written);
  detail::call_scratch const ws(matmul_backward_scratch_bytes<T>(ex, d.N, d.C, d.OC));
  matmul_backward_gelu(ex, dinp, dweight, dbias, dout, pre, inp, weight, ws.get());
}

}  // namespace tide::kernels
