#pragma once
// The host path of the GELU kernels: flat loops over gelu_tanh / gelu_tanh_grad (math.hpp),
// which g++ vectorises (exp_poly is branch-free). Elementwise results are the same for any
// thread count; dbias uses detail::rows_with_column_sums, also the same for any thread count.

#include <array>
#include <cstddef>

#include "tide/core/exec.hpp"
#include "tide/kernels/gelu/checks.hpp"
#include "tide/kernels/gelu/math.hpp"
#include "tide/kernels/residual/rows.hpp"
#include "tide/kernels/scratch.hpp"

namespace tide::kernels {

namespace detail {

// The loops, as functions so the pointers' (non-)aliasing is stated where g++ looks for it.
// out may be inp (in place).
template <class T>
void gelu_forward_span(T* out, T const* inp, index_t n) {
  for (index_t i = 0; i < n; ++i) out[i] = from_float<T>(gelu_tanh(to_float(inp[i])));
}

// dinp may be inp or dout (in place).
template <class T>
void gelu_backward_span(T* dinp, T const* inp, T const* dout, index_t n) {
  for (index_t i = 0; i < n; ++i) dinp[i] = from_float<T>(gelu_tanh_grad(to_float(inp[i])) * to_float(dout[i]));
}

template <class T, class W>
void bias_gelu_forward_row(T* out, T const* inp, W const* __restrict bias, index_t C) {
  for (index_t c = 0; c < C; ++c) out[c] = from_float<T>(gelu_tanh(to_float(inp[c]) + to_float(bias[c])));
}

template <class T, class W>
void bias_gelu_backward_row(T* dinp, float* __restrict dbias, T const* inp, W const* __restrict bias, T const* dout,
                            index_t C) {
  for (index_t c = 0; c < C; ++c) {
    float const g = gelu_tanh_grad(to_float(inp[c]) + to_float(bias[c])) * to_float(dout[c]);
    dinp[c] = from_float<T>(g);
    dbias[c] += g;
  }
}

}  // namespace detail

// out = gelu(inp), elementwise, any shape. out may be inp.
template <Element T, class X>
  requires ReadView<X, T>
void gelu_forward(exec<host> const& ex, tensor_view<T> out, X inp) {
  detail::check_gelu_forward(out, inp);
  T* const o = out.data();
  T const* const x = inp.data();
  detail::for_elements(ex.pool, inp.size(), [=](index_t b, index_t e) { detail::gelu_forward_span(o + b, x + b, e - b); });
}

// dinp = gelu'(inp) * dout, assigned (GELU's input has no other consumer in a GPT block). dinp
// may be dout or inp.
template <Element T, class X, class D>
  requires ReadView<X, T> && ReadView<D, T>
void gelu_backward(exec<host> const& ex, tensor_view<T> dinp, X inp, D dout) {
  detail::check_gelu_backward(dinp, inp, dout);
  T* const di = dinp.data();
  T const* const x = inp.data();
  T const* const g = dout.data();
  detail::for_elements(ex.pool, inp.size(),
                       [=](index_t b, index_t e) { detail::gelu_backward_span(di + b, x + b, g + b, e - b); });
}

// out(n, c) = gelu(inp(n, c) + bias(c)): inp, out (N, C) (or (B, T, C)); bias (C). out may be inp.
template <Element T, class X, class B>
  requires ReadView<X, T> && Element<element_of<B>> && ReadView<B, element_of<B>>
void bias_gelu_forward(exec<host> const& ex, tensor_view<T> out, X inp, B bias) {
  index_t const C = detail::check_bias_gelu_forward(out, inp, bias);
  T* const o = out.data();
  T const* const x = inp.data();
  auto const* const w = bias.data();
  detail::for_rows(ex.pool, inp.size() / C, C, [=](index_t r0, index_t r1) {
    for (index_t r = r0; r < r1; ++r) detail::bias_gelu_forward_row(o + r * C, x + r * C, w, C);
  });
}

// Scratch of bias_gelu_backward on the host for rows of C channels: the per-chunk partials of dbias.
inline std::size_t bias_gelu_backward_scratch_bytes(exec<host> const&, index_t rows, index_t C) noexcept {
  return sizeof(float) * detail::column_sums_floats<1>(rows, C);
}

// dinp(n, c) = gelu'(inp(n, c) + bias(c)) * dout(n, c), assigned; dbias(c) += sum over rows of
// it (the float values, before dinp's rounding). dinp may be dout or inp.
template <Element T, Element W, class X, class B, class D>
  requires ReadView<X, T> && ReadView<B, W> && ReadView<D, T>
void bias_gelu_backward(exec<host> const& ex, tensor_view<T> dinp, tensor_view<W> dbias, X inp, B bias, D dout,
                        scratch<host> ws) {
  index_t const C = detail::check_bias_gelu_backward(dinp, dbias, inp, bias, dout);
  index_t const rows = inp.size() / C;
  detail::check_scratch("bias_gelu_backward", "bias_gelu_backward_scratch_bytes", ws,
                        bias_gelu_backward_scratch_bytes(ex, rows, C));
  T* const di = dinp.data();
  T const* const x = inp.data();
  T const* const g = dout.data();
  W const* const w = bias.data();
  detail::rows_with_column_sums<1>(ex.pool, rows, C, std::array<W*, 1>{dbias.data()},
                                   detail::scratch_part<float>(ws, 0),
                                   [=](index_t r, std::array<float*, 1> const& acc) {
                                     detail::bias_gelu_backward_row(di + r * C, acc[0], x + r * C, w, g + r * C, C);
                                   });
}
template <Element T, Element W, class X, class B, class D>
  requires ReadView<X, T> && ReadView<B, W> && ReadView<D, T>
void bias_gelu_backward(exec<host> const& ex, tensor_view<T> dinp, tensor_view<W> dbias, X inp, B bias, D dout) {
  index_t const C = detail::check_bias_gelu_backward(dinp, dbias, inp, bias, dout);
  detail::call_scratch const ws(bias_gelu_backward_scratch_bytes(ex, inp.size() / C, C));
  bias_gelu_backward(ex, dinp, dbias, inp, bias, dout, ws.get());
}

}  // namespace tide::kernels
