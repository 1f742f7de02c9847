#pragma once
// The host path of the LayerNorm kernels. Threaded over rows; per row a two-pass mean and
// variance over the row while it sits in L1 (C = 768 floats is 3 KiB), so inp is read from
// memory once. Row sums use detail::lane_sums (fixed order), so out, mean, rstd and dinp are the
// same for any thread count; dweight and dbias are summed by detail::rows_with_column_sums, also
// the same for any thread count.

#include <array>
#include <cstddef>
#include <utility>

#include "tide/core/exec.hpp"
#include "tide/kernels/layernorm/checks.hpp"
#include "tide/kernels/layernorm/math.hpp"
#include "tide/kernels/residual/rows.hpp"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels {

namespace detail {

// One row of C: out, and the row's mean and rstd.
template <class T, class W>
void layernorm_forward_row(T* __restrict out, float& mean_out, float& rstd_out, T const* __restrict x,
                           W const* __restrict weight, W const* __restrict bias, index_t C) {
  float const inv_c = 1.0f / static_cast<float>(C);
  float const mean = lane_sums<1>(C, [x](index_t i) { return sums<1>{to_float(x[i])}; })[0] * inv_c;
  float const var = lane_sums<1>(C, [x, mean](index_t i) {
                      float const d = to_float(x[i]) - mean;
                      return sums<1>{d * d};
                    })[0] * inv_c;
  float const rstd = layernorm_rstd(var);
#pragma GCC ivdep
  for (index_t i = 0; i < C; ++i)
    out[i] = from_float<T>(layernorm_out(layernorm_xhat(to_float(x[i]), mean, rstd), to_float(weight[i]), to_float(bias[i])));
  mean_out = mean;
  rstd_out = rstd;
}

// The row's means of dnorm = weight * dout and of dnorm * xhat, which every dinp term takes.
template <class T, class W>
std::pair<float, float> layernorm_dnorm_means(T const* __restrict dout, T const* __restrict x,
                                              W const* __restrict weight, float mean, float rstd, index_t C) {
  float const inv_c = 1.0f / static_cast<float>(C);
  sums<2> const s = lane_sums<2>(C, [=](index_t i) {
    float const xhat = layernorm_xhat(to_float(x[i]), mean, rstd);
    float const dnorm = to_float(weight[i]) * to_float(dout[i]);
    return sums<2>{dnorm, dnorm * xhat};
  });
  return {s[0] * inv_c, s[1] * inv_c};
}

// One row of C: dinp += ..., and the row's terms of dweight and dbias into dw, db.
template <class T, class W>
void layernorm_backward_row(T* __restrict dinp, float* __restrict dw, float* __restrict db, T const* __restrict dout,
                            T const* __restrict x, W const* __restrict weight, float mean, float rstd, index_t C) {
  auto const [mean_dnorm, mean_dnorm_xhat] = layernorm_dnorm_means(dout, x, weight, mean, rstd, C);
#pragma GCC ivdep
  for (index_t i = 0; i < C; ++i) {
    float const g = to_float(dout[i]);
    float const xhat = layernorm_xhat(to_float(x[i]), mean, rstd);
    float const dnorm = to_float(weight[i]) * g;
    dinp[i] = from_float<T>(to_float(dinp[i]) + layernorm_dinp(dnorm, xhat, mean_dnorm, mean_dnorm_xhat, rstd));
    dw[i] += xhat * g;
    db[i] += g;
  }
}

// One row of C, the two halves of layernorm_backward_row apart (a backward split in two): the
// same operations on each output, so the same bits.
template <class T, class W>
void layernorm_backward_input_row(T* __restrict dinp, T const* __restrict dout, T const* __restrict x,
                                  W const* __restrict weight, float mean, float rstd, index_t C) {
  auto const [mean_dnorm, mean_dnorm_xhat] = layernorm_dnorm_means(dout, x, weight, mean, rstd, C);
#pragma GCC ivdep
  for (index_t i = 0; i < C; ++i) {
    float const xhat = layernorm_xhat(to_float(x[i]), mean, rstd);
    float const dnorm = to_float(weight[i]) * to_float(dout[i]);
    dinp[i] = from_float<T>(to_float(dinp[i]) + layernorm_dinp(dnorm, xhat, mean_dnorm, mean_dnorm_xhat, rstd));
  }
}
template <class T>
void layernorm_backward_weight_row(float* __restrict dw, float* __restrict db, T const* __restrict dout,
                                   T const* __restrict x, float mean, float rstd, index_t C) {
#pragma GCC ivdep
  for (index_t i = 0; i < C; ++i) {
    float const g = to_float(dout[i]);
    dw[i] += layernorm_xhat(to_float(x[i]), mean, rstd) * g;
    db[i] += g;
  }
}

// residual = a + b, one row; residual may be a or b.
template <class T>
void residual_row(T* residual, T const* a, T const* b, index_t C) {
  for (index_t i = 0; i < C; ++i) residual[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

}  // namespace detail

// out = layernorm(inp) with weight and bias; mean and rstd saved for the backward.
//   inp, out: (N, C) or (B, T, C), contiguous; mean, rstd: float, one per row ((N) or (B, T));
//   weight, bias: (C), float, bf16 or f16. out must not overlap inp.
template <Element T, class X, class Wv, class Bv>
  requires ReadView<X, T> && Element<element_of<Wv>> && ReadView<Wv, element_of<Wv>> && ReadView<Bv, element_of<Wv>>
void layernorm_forward(exec<host> const& ex, tensor_view<T> out, tensor_view<float> mean, tensor_view<float> rstd,
                       X inp, Wv weight, Bv bias) {
  index_t const C = detail::check_layernorm_forward(out, mean, rstd, inp, weight, bias);
  T* const o = out.data();
  float* const m = mean.data();
  float* const s = rstd.data();
  auto const* const x = inp.data();
  auto const* const w = weight.data();
  auto const* const b = bias.data();
  detail::for_rows(ex.pool, inp.size() / C, C, [=](index_t r0, index_t r1) {
    for (index_t r = r0; r < r1; ++r) detail::layernorm_forward_row(o + r * C, m[r], s[r], x + r * C, w, b, C);
  });
}

// Scratch of layernorm_backward on the host for rows of C channels: the per-chunk partials of
// dweight and dbias.
inline std::size_t layernorm_backward_scratch_bytes(exec<host> const&, index_t rows, index_t C) noexcept {
  return sizeof(float) * detail::column_sums_floats<2>(rows, C);
}

// dinp += dL/dinp (accumulated, as llm.c: dinp is the residual stream's gradient), dweight +=
// dL/dweight, dbias += dL/dbias, from dout and the forward's inp, weight, mean and rstd.
//   dinp, dout, inp: (N, C), contiguous; weight, dweight, dbias: (C); mean, rstd: one per row.
template <Element T, Element W, class D, class X, class Wv, class M, class R>
  requires ReadView<D, T> && ReadView<X, T> && ReadView<Wv, W> && ReadView<M, float> && ReadView<R, float>
void layernorm_backward(exec<host> const& ex, tensor_view<T> dinp, tensor_view<W> dweight, tensor_view<W> dbias,
                        D dout, X inp, Wv weight, M mean, R rstd, scratch<host> ws) {
  index_t const C = detail::check_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  index_t const rows = inp.size() / C;
  detail::check_scratch("layernorm_backward", "layernorm_backward_scratch_bytes", ws,
                        layernorm_backward_scratch_bytes(ex, rows, C));
  T* const di = dinp.data();
  T const* const g = dout.data();
  T const* const x = inp.data();
  W const* const w = weight.data();
  float const* const m = mean.data();
  float const* const s = rstd.data();
  detail::rows_with_column_sums<2>(ex.pool, rows, C, std::array<W*, 2>{dweight.data(), dbias.data()},
                                   detail::scratch_part<float>(ws, 0),
                                   [=](index_t r, std::array<float*, 2> const& acc) {
                                     detail::layernorm_backward_row(di + r * C, acc[0], acc[1], g + r * C, x + r * C, w,
                                                                    m[r], s[r], C);
                                   });
}
template <Element T, Element W, class D, class X, class Wv, class M, class R>
  requires ReadView<D, T> && ReadView<X, T> && ReadView<Wv, W> && ReadView<M, float> && ReadView<R, float>
void layernorm_backward(exec<host> const& ex, tensor_view<T> dinp, tensor_view<W> dweight, tensor_view<W> dbias,
                        D dout, X inp, Wv weight, M mean, R rstd) {
  index_t const C = detail::check_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  detail::call_scratch const ws(layernorm_backward_scratch_bytes(ex, inp.size() / C, C));
  layernorm_backward(ex, dinp, dweight, dbias, dout, inp, weight, mean, rstd, ws.get());
}

// The two halves of layernorm_backward, for a backward split in two (zero-bubble pipelines run
// the input gradient in B and the weight gradients later in W), each with the bits of its outputs
// in layernorm_backward:
//   layernorm_backward_input(ex, dinp, dout, inp, weight, mean, rstd);           // dinp +=
//   layernorm_backward_weight(ex, dweight, dbias, dout, inp, mean, rstd, ws);    // dweight, dbias +=
// The weight half's scratch is layernorm_backward_scratch_bytes; the input half needs none.
template <Element T, class D, class X, class Wv, class M, class R>
  requires ReadView<D, T> && ReadView<X, T> && Element<element_of<Wv>> && ReadView<Wv, element_of<Wv>> &&
           ReadView<M, float> && ReadView<R, float>
void layernorm_backward_input(exec<host> const& ex, tensor_view<T> dinp, D dout, X inp, Wv weight, M mean, R rstd) {
  index_t const C = detail::check_layernorm_backward_input(dinp, dout, inp, weight, mean, rstd);
  T* const di = dinp.data();
  T const* const g = dout.data();
  T const* const x = inp.data();
  auto const* const w = weight.data();
  float const* const m = mean.data();
  float const* const s = rstd.data();
  detail::for_rows(ex.pool, inp.size() / C, C, [=](index_t r0, index_t r1) {
    for (index_t r = r0; r < r1; ++r)
      detail::layernorm_backward_input_row(di + r * C, g + r * C, x + r * C, w, m[r], s[r], C);
  });
}
template <Element W, class D, class X, class M, class R>
  requires Element<element_of<D>> && ReadView<D, element_of<D>> && ReadView<X, element_of<D>> &&
           ReadView<M, float> && ReadView<R, float>
void layernorm_backward_weight(exec<host> const& ex, tensor_view<W> dweight, tensor_view<W> dbias, D dout, X inp,
                               M mean, R rstd, scratch<host> ws) {
  index_t const C = detail::check_layernorm_backward_weight(dweight, dbias, dout, inp, mean, rstd);
  index_t const rows = inp.size() / C;
  detail::check_scratch("layernorm_backward_weight", "layernorm_backward_scratch_bytes", ws,
                        layernorm_backward_scratch_bytes(ex, rows, C));
  auto const* const g = dout.data();
  auto const* const x = inp.data();
  float const* const m = mean.data();
  float const* const s = rstd.data();
  detail::rows_with_column_sums<2>(ex.pool, rows, C, std::array<W*, 2>{dweight.data(), dbias.data()},
                                   detail::scratch_part<float>(ws, 0),
                                   [=](index_t r, std::array<float*, 2> const& acc) {
                                     detail::layernorm_backward_weight_row(acc[0], acc[1], g + r * C, x + r * C, m[r],
                                                                           s[r], C);
                                   });
}

// residual = a + b, then out = layernorm(residual), in one pass over each row (llm.c's
// fused_residual_forward): a and b are read once, the row is normalised while in L1. The result
// is bit-identical to residual_forward followed by layernorm_forward. residual may be a or b.
template <Element T, class A, class Bv, class Wv, class Bi>
  requires ReadView<A, T> && ReadView<Bv, T> && Element<element_of<Wv>> && ReadView<Wv, element_of<Wv>> &&
           ReadView<Bi, element_of<Wv>>
void residual_layernorm_forward(exec<host> const& ex, tensor_view<T> residual, tensor_view<T> out,
                                tensor_view<float> mean, tensor_view<float> rstd, A a, Bv b, Wv weight, Bi bias) {
  index_t const C = detail::check_residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias);
  T* const res = residual.data();
  T* const o = out.data();
  float* const m = mean.data();
  float* const s = rstd.data();
  T const* const pa = a.data();
  T const* const pb = b.data();
  auto const* const w = weight.data();
  auto const* const bi = bias.data();
  detail::for_rows(ex.pool, a.size() / C, C, [=](index_t r0, index_t r1) {
    for (index_t r = r0; r < r1; ++r) {
      detail::residual_row(res + r * C, pa + r * C, pb + r * C, C);
      detail::layernorm_forward_row(o + r * C, m[r], s[r], res + r * C, w, bi, C);
    }
  });
}

}  // namespace tide::kernels
