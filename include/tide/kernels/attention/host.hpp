#pragma once
// The host path of the attention kernels: blocked causal attention with an online softmax
// (flash-attention's algorithm on CPU threads), no (T, T) buffer.
//
// Per (b, h) pair, a thread converts the head's q (scaled by 1/sqrt(HS)), k and v into float
// scratch (k and v transposed where a product needs them so), then:
//   forward   per query block of q_block rows, over the key blocks up to the diagonal:
//             S = Q K^T (block_gemm), masked row max, P = exp(S - m), O = alpha O + P V;
//             out = O / l and lse = m + log l per row.
//   backward  D_i = dout_i . out_i; per key block j, over the query blocks i from the diagonal:
//             P = exp(Q K_j^T - lse), dP = dO V_j^T, dS = P (dP - D),
//             dV_j += P^T dO, dK_j += dS^T Q (scaled), dQ_i += dS K_j; then dqkv +=.
// The five products of a block pair are 64 x 64 x HS block_gemm calls (matmul/block_gemm.hpp).
//
// Threads take contiguous slices of the B * NH pairs; a pair is computed by one thread in a fixed
// order with its own part of the caller's scratch (kernels/scratch.hpp), so the results are
// bit-identical for any thread count. Scratch per slice (min(threads, B NH) slices): about
// (3 T HS + q_block (k_block + HS)) floats forward, (6 T HS + 2 T + 2 q_block k_block +
// 2 k_block HS) backward (transposed copies are padded).

#include <algorithm>
#include <cstddef>

#include "tide/core/exec.hpp"
#include "tide/kernels/attention/checks.hpp"
#include "tide/kernels/attention/math.hpp"
#include "tide/kernels/matmul/block_gemm.hpp"
#include "tide/kernels/residual/rows.hpp"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels {

// Block sizes. 64 x 64 keeps a block pair's operands (5 x 16 KiB at HS = 64) in L2 and amortises
// the per-row softmax over 64 keys. Swept with the attention_vs_sgemm shape (B=4, NH=12, T=1024,
// HS=64, fp32, 1 thread, thread CPU time, on the shared 2-vCPU machine): 32 x 32 gave 34-36
// GFLOP/s forward against 40 for 64 x 64; 128 x 128 34-45, within the noise.
struct attention_host_tuning {
  static constexpr index_t q_block = 64;  // query rows per block
  static constexpr index_t k_block = 64;  // keys per block
  static constexpr int lanes = 16;        // partial maxima / sums per row reduction
};

namespace detail {

// f(pair, scratch) for every pair in [0, pairs): threads take contiguous slices of pairs, each
// slice with its own `per_slice` floats of the caller's scratch.
inline int attention_slices(thread_pool const& pool, index_t pairs) noexcept {
  return static_cast<int>(std::min<index_t>(pool.threads(), pairs));
}
template <class F>
void attention_over_pairs(thread_pool& pool, index_t pairs, std::size_t per_slice, float* scratch, F&& f) {
  if (pairs == 0) return;
  int const slices = attention_slices(pool, pairs);
  parallel_for(pool, static_cast<std::size_t>(slices), [&](std::size_t s0, std::size_t s1) {
    for (std::size_t s = s0; s < s1; ++s) {
      auto const [p0, p1] = thread_pool::slice(static_cast<std::size_t>(pairs), slices, static_cast<int>(s));
      for (std::size_t p = p0; p < p1; ++p) f(static_cast<index_t>(p), scratch + s * per_slice);
    }
  });
}

// max and sum of x[0, n), n a multiple of `lanes`, in `lanes` partial results combined in a fixed
// tree: the same order for any vector width, and no tail loop (which would keep the partials in
// memory instead of registers).
// acc[0] = the fold of acc[0, 2W) in halves, unrolled so the partials stay in registers.
template <int W, class Op>
inline void attention_fold(float* acc, Op op) noexcept {
  for (int j = 0; j < W; ++j) acc[j] = op(acc[j], acc[j + W]);
  if constexpr (W > 1) attention_fold<W / 2>(acc, op);
}

inline float attention_row_max(float const* __restrict x, index_t n) noexcept {
  constexpr int L = attention_host_tuning::lanes;
  float acc[L];
  for (int j = 0; j < L; ++j) acc[j] = x[j];
  for (index_t c = L; c < n; c += L)
    for (int j = 0; j < L; ++j) acc[j] = x[c + j] > acc[j] ? x[c + j] : acc[j];
  attention_fold<L / 2>(acc, [](float a, float b) { return b > a ? b : a; });
  return acc[0];
}

inline float attention_row_sum(float const* __restrict x, index_t n) noexcept {
  constexpr int L = attention_host_tuning::lanes;
  float acc[L] = {};
  for (index_t c = 0; c < n; c += L)
    for (int j = 0; j < L; ++j) acc[j] += x[c + j];
  attention_fold<L / 2>(acc, [](float a, float b) { return a + b; });
  return acc[0];
}

// x[c] = exp(x[c] - m) for c < valid, 0 for valid <= c < n (masked keys). A plain map loop, which
// g++ vectorises with exp_poly inlined.
inline void attention_exp_row(float* __restrict x, index_t valid, index_t n, float m) noexcept {
  for (index_t c = 0; c < valid; ++c) x[c] = detail::exp_poly(x[c] - m);
  for (index_t c = valid; c < n; ++c) x[c] = 0.0f;
}

// Leading dimension of a transposed (HS, T) copy: T rounded up to 16 floats, plus 16, so the
// rows a block_gemm walks down are not 4 KiB apart (at T = 1024 they would all fall into one L1
// set and evict each other: 2.5x slower measured).
constexpr index_t attention_transposed_ld(index_t Tn) noexcept { return (Tn + 15) / 16 * 16 + 16; }

// Copies channels [c0, c0 + HS) of the T rows (stride C3) of one sequence into float, times
// `scale`: row-major dst (T, HS), or transposed dst (HS, T) with leading dimension ld. Transposes
// in tiles of 16 rows so the strided writes stay in a few cache lines.
template <class T>
void attention_load(T const* src, index_t C3, index_t c0, index_t Tn, index_t HS, float scale, float* dst,
                    bool transposed, index_t ld = 0) {
  if (!transposed) {
    for (index_t t = 0; t < Tn; ++t)
      for (index_t i = 0; i < HS; ++i) dst[t * HS + i] = to_float(src[t * C3 + c0 + i]) * scale;
    return;
  }
  constexpr index_t tile = 16;
  for (index_t t0 = 0; t0 < Tn; t0 += tile) {
    index_t const n = std::min(tile, Tn - t0);
    for (index_t i = 0; i < HS; ++i)
      for (index_t t = 0; t < n; ++t) dst[i * ld + t0 + t] = to_float(src[(t0 + t) * C3 + c0 + i]) * scale;
  }
}

// Rows of a query block and of a key block that a sequence of T positions can fill: the score
// blocks keep k_block columns (their row stride) but need no more rows than T.
constexpr index_t attention_query_rows(index_t Tn) noexcept { return std::min(attention_host_tuning::q_block, Tn); }
constexpr index_t attention_key_rows(index_t Tn) noexcept { return std::min(attention_host_tuning::k_block, Tn); }

inline std::size_t attention_forward_scratch(attention_dims const& d) {
  constexpr index_t BK = attention_host_tuning::k_block;
  return static_cast<std::size_t>(2 * d.T * d.HS + d.HS * attention_transposed_ld(d.T) +
                                  attention_query_rows(d.T) * (BK + d.HS));
}

// One (b, h) pair of the forward.
template <class T>
void attention_forward_pair(attention_dims const& d, index_t b, index_t h, T* out, float* lse, T const* qkv,
                            float* scratch) {
  constexpr index_t BQ = attention_host_tuning::q_block, BK = attention_host_tuning::k_block;
  constexpr index_t L = attention_host_tuning::lanes;
  static_assert(BK % L == 0, "a score row is processed in whole lanes");
  index_t const Tn = d.T, HS = d.HS, C3 = 3 * d.C, ldt = attention_transposed_ld(d.T);
  float* const q = scratch;        // (T, HS), scaled
  float* const v = q + Tn * HS;    // (T, HS)
  float* const kt = v + Tn * HS;   // (HS, T), leading dimension ldt
  index_t const RQ = attention_query_rows(Tn);
  float* const s = kt + HS * ldt;  // (RQ, BK): scores, then probabilities
  float* const o = s + RQ * BK;    // (RQ, HS)
  T const* const seq = qkv + b * Tn * C3;
  attention_load(seq, C3, h * HS, Tn, HS, attention_scale(HS), q, false);
  attention_load(seq, C3, d.C + h * HS, Tn, HS, 1.0f, kt, true, ldt);
  attention_load(seq, C3, 2 * d.C + h * HS, Tn, HS, 1.0f, v, false);

  online_softmax st[BQ];
  for (index_t i0 = 0; i0 < Tn; i0 += BQ) {
    index_t const M = std::min(BQ, Tn - i0);
    std::fill(o, o + M * HS, 0.0f);
    for (index_t r = 0; r < M; ++r) st[r] = online_softmax{};
    index_t const kend = i0 + M;  // keys 0 .. the block's last query
    for (index_t j0 = 0; j0 < kend; j0 += BK) {
      index_t const N = std::min(BK, kend - j0);
      block_gemm(M, N, HS, q + i0 * HS, HS, kt + j0, ldt, s, BK, false);  // S (M, N) = Q K^T
      for (index_t r = 0; r < M; ++r) {
        float* const row = s + r * BK;
        index_t const valid = std::clamp<index_t>(i0 + r - j0 + 1, 0, N);  // keys j <= i
        if (valid == 0) {
          std::fill(row, row + N, 0.0f);
          continue;
        }
        // Masked keys and the padding up to a whole number of lanes score -inf: exp gives 0.
        index_t const width = (N + L - 1) / L * L;
        std::fill(row + valid, row + width, -__builtin_huge_valf());
        float const alpha = st[r].rescale(attention_row_max(row, width));
        attention_exp_row(row, width, width, st[r].max);
        st[r].sum += attention_row_sum(row, width);
        float* const orow = o + r * HS;
        for (index_t i = 0; i < HS; ++i) orow[i] *= alpha;
      }
      block_gemm(M, HS, N, s, BK, v + j0 * HS, HS, o, HS, true);  // O (M, HS) += P V
    }
    for (index_t r = 0; r < M; ++r) {
      float const inv = 1.0f / st[r].sum;
      T* const dst = out + (b * Tn + i0 + r) * d.C + h * HS;
      for (index_t i = 0; i < HS; ++i) dst[i] = from_float<T>(o[r * HS + i] * inv);
      lse[(b * d.NH + h) * Tn + i0 + r] = st[r].lse();
    }
  }
}

inline std::size_t attention_backward_scratch(attention_dims const& d) {
  constexpr index_t BK = attention_host_tuning::k_block;
  return static_cast<std::size_t>(4 * d.T * d.HS + 2 * d.HS * attention_transposed_ld(d.T) + 2 * d.T +
                                  2 * attention_query_rows(d.T) * BK + 2 * attention_key_rows(d.T) * d.HS);
}

// One (b, h) pair of the backward.
template <class T>
void attention_backward_pair(attention_dims const& d, index_t b, index_t h, T* dqkv, T const* dout, T const* qkv,
                             T const* out, float const* lse, float* scratch) {
  constexpr index_t BQ = attention_host_tuning::q_block, BK = attention_host_tuning::k_block;
  index_t const Tn = d.T, HS = d.HS, C = d.C, C3 = 3 * d.C, ldt = attention_transposed_ld(d.T);
  float const scale = attention_scale(HS);
  float* const qs = scratch;        // (T, HS), scaled
  float* const k = qs + Tn * HS;    // (T, HS)
  float* const go = k + Tn * HS;    // (T, HS): dout
  float* const dq = go + Tn * HS;   // (T, HS): sum_j dS K_j, unscaled
  float* const kt = dq + Tn * HS;   // (HS, T), leading dimension ldt
  float* const vt = kt + HS * ldt;  // (HS, T), leading dimension ldt
  float* const D = vt + HS * ldt;   // (T): dout . out per row
  float* const L = D + Tn;          // (T): lse
  index_t const RQ = attention_query_rows(Tn), RK = attention_key_rows(Tn);
  float* const p = L + Tn;          // (RQ, BK)
  float* const ds = p + RQ * BK;    // (RQ, BK): dP, then dS
  float* const dk = ds + RQ * BK;   // (RK, HS)
  float* const dv = dk + RK * HS;   // (RK, HS)

  T const* const seq = qkv + b * Tn * C3;
  attention_load(seq, C3, h * HS, Tn, HS, scale, qs, false);
  attention_load(seq, C3, C + h * HS, Tn, HS, 1.0f, k, false);
  attention_load(seq, C3, C + h * HS, Tn, HS, 1.0f, kt, true, ldt);
  attention_load(seq, C3, 2 * C + h * HS, Tn, HS, 1.0f, vt, true, ldt);
  attention_load(dout + b * Tn * C, C, h * HS, Tn, HS, 1.0f, go, false);
  for (index_t t = 0; t < Tn; ++t) {
    T const* const o = out + (b * Tn + t) * C + h * HS;
    float acc = 0.0f;
    for (index_t i = 0; i < HS; ++i) acc += go[t * HS + i] * to_float(o[i]);
    D[t] = acc;
    L[t] = lse[(b * d.NH + h) * Tn + t];
  }
  std::fill(dq, dq + Tn * HS, 0.0f);

  for (index_t j0 = 0; j0 < Tn; j0 += BK) {
    index_t const N = std::min(BK, Tn - j0);
    std::fill(dk, dk + N * HS, 0.0f);
    std::fill(dv, dv + N * HS, 0.0f);
    for (index_t i0 = j0 / BQ * BQ; i0 < Tn; i0 += BQ) {  // query blocks that reach key j0
      index_t const M = std::min(BQ, Tn - i0);
      block_gemm(M, N, HS, qs + i0 * HS, HS, kt + j0, ldt, p, BK, false);   // S (M, N)
      block_gemm(M, N, HS, go + i0 * HS, HS, vt + j0, ldt, ds, BK, false);  // dP (M, N) = dO V^T
      for (index_t r = 0; r < M; ++r) {
        index_t const valid = std::clamp<index_t>(i0 + r - j0 + 1, 0, N);
        float* __restrict const prow = p + r * BK;
        float* __restrict const drow = ds + r * BK;
        float const di = D[i0 + r];
        attention_exp_row(prow, valid, N, L[i0 + r]);  // P = exp(S - lse), masked
        for (index_t c = 0; c < N; ++c) drow[c] = prow[c] * (drow[c] - di);
      }
      block_gemm(N, HS, M, p, BK, go + i0 * HS, HS, dv, HS, true, true);      // dV_j (N, HS) += P^T dO
      block_gemm(N, HS, M, ds, BK, qs + i0 * HS, HS, dk, HS, true, true);     // dK_j (N, HS) += dS^T Q s
      block_gemm(M, HS, N, ds, BK, k + j0 * HS, HS, dq + i0 * HS, HS, true);  // dQ_i += dS K_j
    }
    for (index_t c = 0; c < N; ++c) {
      T* const row = dqkv + (b * Tn + j0 + c) * C3;
      for (index_t i = 0; i < HS; ++i) {
        T& gk = row[C + h * HS + i];
        T& gv = row[2 * C + h * HS + i];
        gk = from_float<T>(to_float(gk) + dk[c * HS + i]);
        gv = from_float<T>(to_float(gv) + dv[c * HS + i]);
      }
    }
  }
  for (index_t t = 0; t < Tn; ++t) {
    T* const row = dqkv + (b * Tn + t) * C3 + h * HS;
    for (index_t i = 0; i < HS; ++i) row[i] = from_float<T>(to_float(row[i]) + dq[t * HS + i] * scale);
  }
}

}  // namespace detail

// Scratch of attention_forward / attention_backward on the host for qkv (batch, T, 3C), NH heads.
inline std::size_t attention_forward_scratch_bytes(exec<host> const& ex, index_t batch, index_t T, index_t C,
                                                   index_t NH) {
  detail::attention_dims const d{batch, T, C, NH, NH > 0 ? C / NH : 0};
  return sizeof(float) * detail::attention_forward_scratch(d) *
         static_cast<std::size_t>(detail::attention_slices(ex.pool, batch * NH));
}
inline std::size_t attention_backward_scratch_bytes(exec<host> const& ex, index_t batch, index_t T, index_t C,
                                                    index_t NH) {
  detail::attention_dims const d{batch, T, C, NH, NH > 0 ? C / NH : 0};
  return sizeof(float) * detail::attention_backward_scratch(d) *
         static_cast<std::size_t>(detail::attention_slices(ex.pool, batch * NH));
}

// out (B, T, C) = causal softmax(q k^T / sqrt(HS)) v per head; lse (B, NH, T) = log sum_j
// exp(q_i . k_j / sqrt(HS)) per query row, saved for the backward. qkv (B, T, 3C).
template <Element T, class Q>
  requires ReadView<Q, T>
void attention_forward(exec<host> const& ex, tensor_view<T> out, tensor_view<float> lse, Q qkv, index_t NH,
                       scratch<host> ws) {
  auto const d = detail::check_attention_forward(out, lse, qkv, NH);
  detail::check_scratch("attention_forward", "attention_forward_scratch_bytes", ws,
                         attention_forward_scratch_bytes(ex, d.B, d.T, d.C, d.NH));
  if (d.T == 0) return;
  T* const o = out.data();
  float* const l = lse.data();
  T const* const x = qkv.data();
  detail::attention_over_pairs(ex.pool, d.B * d.NH, detail::attention_forward_scratch(d),
                               detail::scratch_part<float>(ws, 0), [&](index_t pair, float* scratch) {
                                 detail::attention_forward_pair(d, pair / d.NH, pair % d.NH, o, l, x, scratch);
                               });
}
template <Element T, class Q>
  requires ReadView<Q, T>
void attention_forward(exec<host> const& ex, tensor_view<T> out, tensor_view<float> lse, Q qkv, index_t NH) {
  detail::call_scratch const ws(
      out.rank() == 3 ? attention_forward_scratch_bytes(ex, out.extent(0), out.extent(1), out.extent(2), NH) : 0);
  attention_forward(ex, out, lse, qkv, NH, ws.get());
}

// dqkv (B, T, 3C) += the gradient of attention_forward's out, given dout (B, T, C), and the out and
// lse that attention_forward returned for this qkv.
template <Element T, class D, class Q, class O, class L>
  requires ReadView<D, T> && ReadView<Q, T> && ReadView<O, T> && ReadView<L, float>
void attention_backward(exec<host> const& ex, tensor_view<T> dqkv, D dout, Q qkv, O out, L lse, index_t NH,
                        scratch<host> ws) {
  auto const d = detail::check_attention_backward(dqkv, dout, qkv, out, lse, NH);
  detail::check_scratch("attention_backward", "attention_backward_scratch_bytes", ws,
                         attention_backward_scratch_bytes(ex, d.B, d.T, d.C, d.NH));
  if (d.T == 0) return;
  T* const g = dqkv.data();
  T const* const go = dout.data();
  T const* const x = qkv.data();
  T const* const o = out.data();
  float const* const l = lse.data();
  detail::attention_over_pairs(ex.pool, d.B * d.NH, detail::attention_backward_scratch(d),
                               detail::scratch_part<float>(ws, 0), [&](index_t pair, float* scratch) {
                                 detail::attention_backward_pair(d, pair / d.NH, pair % d.NH, g, go, x, o, l, scratch);
                               });
}
template <Element T, class D, class Q, class O, class L>
  requires ReadView<D, T> && ReadView<Q, T> && ReadView<O, T> && ReadView<L, float>
void attention_backward(exec<host> const& ex, tensor_view<T> dqkv, D dout, Q qkv, O out, L lse, index_t NH) {
  detail::call_scratch const ws(
      dout.rank() == 3 ? attention_backward_scratch_bytes(ex, dout.extent(0), dout.extent(1), dout.extent(2), NH)
                       : 0);
  attention_backward(ex, dqkv, dout, qkv, out, lse, NH, ws.get());
}

}  // namespace tide::kernels
