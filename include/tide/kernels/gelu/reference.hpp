#pragma once
// The scalar oracle of the GELU kernels: the tanh form itself (std::tanh), in double, one element
// at a time. Runs on float, bf16, f16 and double tensors (double for finite differences).

#include <cmath>
#include <cstddef>
#include <vector>

#include "tide/kernels/gelu/checks.hpp"
#include "tide/kernels/gelu/math.hpp"
#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels::reference {

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as GPT-2 writes it.
inline double gelu_tanh(double x) {
  double const k = 0.79788456080286535588;  // sqrt(2 / pi)
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// Its derivative: 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2), t = tanh(u).
inline double gelu_tanh_grad(double x) {
  double const k = 0.79788456080286535588;
  double const t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// out = gelu(inp). Any shape.
template <class T, class X>
  requires Real<T> && ReadView<X, T>
void gelu_forward(tensor_view<T> out, X inp) {
  kernels::detail::check_gelu_forward(out, inp);
  for (index_t i = 0; i < inp.size(); ++i) out.data()[i] = store<T>(gelu_tanh(load(inp.data()[i])));
}

// dinp = gelu'(inp) * dout (assigned, not accumulated).
template <class T, class X, class D>
  requires Real<T> && ReadView<X, T> && ReadView<D, T>
void gelu_backward(tensor_view<T> dinp, X inp, D dout) {
  kernels::detail::check_gelu_backward(dinp, inp, dout);
  for (index_t i = 0; i < inp.size(); ++i)
    dinp.data()[i] = store<T>(gelu_tanh_grad(load(inp.data()[i])) * load(dout.data()[i]));
}

// out(n, c) = gelu(inp(n, c) + bias(c)). inp, out: (N, C); bias: (C).
template <class T, class X, class B>
  requires Real<T> && ReadView<X, T> && Real<element_of<B>> && ReadView<B, element_of<B>>
void bias_gelu_forward(tensor_view<T> out, X inp, B bias) {
  index_t const C = kernels::detail::check_bias_gelu_forward(out, inp, bias);
  for (index_t i = 0; i < inp.size(); ++i)
    out.data()[i] = store<T>(gelu_tanh(load(inp.data()[i]) + load(bias.data()[i % C])));
}

// dinp(n, c) = gelu'(inp(n, c) + bias(c)) * dout(n, c) (assigned); dbias(c) += sum over n of it.
template <class T, class W, class X, class B, class D>
  requires Real<T> && Real<W> && ReadView<X, T> && ReadView<B, W> && ReadView<D, T>
void bias_gelu_backward(tensor_view<T> dinp, tensor_view<W> dbias, X inp, B bias, D dout) {
  index_t const C = kernels::detail::check_bias_gelu_backward(dinp, dbias, inp, bias, dout);
  std::vector<double> sum(static_cast<std::size_t>(C), 0.0);
  for (index_t i = 0; i < inp.size(); ++i) {
    double const g = gelu_tanh_grad(load(inp.data()[i]) + load(bias.data()[i % C])) * load(dout.data()[i]);
    dinp.data()[i] = store<T>(g);
    sum[static_cast<std::size_t>(i % C)] += g;
  }
  for (index_t c = 0; c < C; ++c) dbias.data()[c] = store<W>(load(dbias.data()[c]) + sum[static_cast<std::size_t>(c)]);
}

}  // namespace tide::kernels::reference
