#pragma once
// The scalar oracle of the matmul kernels: the llm.c loops (out = inp @ weight^T + bias), every
// dot product summed in double, one rounding per output. Runs on float, bf16, f16 and double
// tensors (double for finite differences).

#include <cstddef>
#include <type_traits>
#include <vector>

#include "tide/kernels/gelu/reference.hpp"
#include "tide/kernels/matmul/checks.hpp"
#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels {

// Helpers in kernels::detail: a reference::detail namespace would hide kernels::detail from the
// other references' unqualified `detail::` calls.
namespace detail {

// out(n, o) = sum_c inp(n, c) weight(o, c) + bias(o), in double.
template <class X, class W, class B>
std::vector<double> matmul_reference_sums(matmul_dims const& d, X const& inp, W const& weight, B const& bias) {
  std::vector<double> r(static_cast<std::size_t>(d.N * d.OC));
  for (index_t n = 0; n < d.N; ++n)
    for (index_t o = 0; o < d.OC; ++o) {
      double s = matmul_given(bias) ? reference::load(bias.data()[o]) : 0.0;
      for (index_t c = 0; c < d.C; ++c)
        s += reference::load(inp.data()[n * d.C + c]) * reference::load(weight.data()[o * d.C + c]);
      r[static_cast<std::size_t>(n * d.OC + o)] = s;
    }
  return r;
}

// The backward sums from g = d loss / d out (N, OC), in double; every output +=.
template <class T, class X, class W>
void matmul_reference_backward(matmul_dims const& d, tensor_view<T> dinp, tensor_view<T> dweight, tensor_view<T> dbias,
                               std::vector<double> const& g, X const& inp, W const& weight) {
  auto const G = [&](index_t n, index_t o) { return g[static_cast<std::size_t>(n * d.OC + o)]; };
  for (index_t n = 0; n < d.N; ++n)
    for (index_t c = 0; c < d.C; ++c) {
      double s = 0.0;
      for (index_t o = 0; o < d.OC; ++o) s += G(n, o) * reference::load(weight.data()[o * d.C + c]);
      T& x = dinp.data()[n * d.C + c];
      x = reference::store<T>(reference::load(x) + s);
    }
  for (index_t o = 0; o < d.OC; ++o) {
    for (index_t c = 0; c < d.C; ++c) {
      double s = 0.0;
      for (index_t n = 0; n < d.N; ++n) s += G(n, o) * reference::load(inp.data()[n * d.C + c]);
      T& w = dweight.data()[o * d.C + c];
      w = reference::store<T>(reference::load(w) + s);
    }
    if (matmul_given(dbias)) {
      double s = 0.0;
      for (index_t n = 0; n < d.N; ++n) s += G(n, o);
      dbias.data()[o] = reference::store<T>(reference::load(dbias.data()[o]) + s);
    }
  }
}

}  // namespace detail

namespace reference {

// out = inp @ weight^T + bias. inp (N, C) or (B, T, C); weight (OC, C); bias (OC) or {} for none;
// out (N, OC) or (B, T, OC).
template <class T, class X, class W>
  requires Real<T> && ReadView<X, T> && ReadView<W, T>
void matmul_forward(tensor_view<T> out, X inp, W weight, std::type_identity_t<tensor_view<T const>> bias = {}) {
  auto const d = kernels::detail::check_matmul_forward(out, inp, weight, bias);
  auto const r = kernels::detail::matmul_reference_sums(d, inp, weight, bias);
  for (index_t i = 0; i < d.N * d.OC; ++i) out.data()[i] = store<T>(r[static_cast<std::size_t>(i)]);
}

// pre = inp @ weight^T + bias; out = gelu(pre), both from the double value of pre.
template <class T, class X, class W>
  requires Real<T> && ReadView<X, T> && ReadView<W, T>
void matmul_forward_gelu(tensor_view<T> out, tensor_view<T> pre, X inp, W weight,
                         std::type_identity_t<tensor_view<T const>> bias = {}) {
  auto const d = kernels::detail::check_matmul_forward_gelu(out, pre, inp, weight, bias);
  auto const r = kernels::detail::matmul_reference_sums(d, inp, weight, bias);
  for (index_t i = 0; i < d.N * d.OC; ++i) {
    double const p = r[static_cast<std::size_t>(i)];
    pre.data()[i] = store<T>(p);
    out.data()[i] = store<T>(gelu_tanh(p));
  }
}

// dinp += dout @ weight; dweight += dout^T @ inp; dbias += the column sums of dout (dbias may be {}).
template <class T, class D, class X, class W>
  requires Real<T> && ReadView<D, T> && ReadView<X, T> && ReadView<W, T>
void matmul_backward(tensor_view<T> dinp, tensor_view<T> dweight, std::type_identity_t<tensor_view<T>> dbias, D dout,
                     X inp, W weight) {
  auto const d = kernels::detail::check_matmul_backward("matmul_backward", dinp, dweight, dbias, dout, inp, weight,
                                                        kernels::detail::region::use::read);
  std::vector<double> g(static_cast<std::size_t>(d.N * d.OC));
  for (index_t i = 0; i < d.N * d.OC; ++i) g[static_cast<std::size_t>(i)] = load(dout.data()[i]);
  kernels::detail::matmul_reference_backward(d, dinp, dweight, dbias, g, inp, weight);
}

// The backward of matmul_forward_gelu: dout (the gradient of out = gelu(pre)) is overwritten with
// the gradient of pre, dout * gelu'(pre); the sums then use that product before its rounding.
template <class T, class P, class X, class W>
  requires Real<T> && ReadView<P, T> && ReadView<X, T> && ReadView<W, T>
void matmul_backward_gelu(tensor_view<T> dinp, tensor_view<T> dweight, std::type_identity_t<tensor_view<T>> dbias,
                          tensor_view<T> dout, P pre, X inp, W weight) {
  auto const d = kernels::detail::check_matmul_backward("matmul_backward_gelu", dinp, dweight, dbias, dout, inp, weight,
                                                        kernels::detail::region::use::written);
  kernels::detail::check_matmul_gelu_pre(dout, pre);
  std::vector<double> g(static_cast<std::size_t>(d.N * d.OC));
  for (index_t i = 0; i < d.N * d.OC; ++i) {
    double const v = load(dout.data()[i]) * gelu_tanh_grad(load(pre.data()[i]));
    g[static_cast<std::size_t>(i)] = v;
    dout.data()[i] = store<T>(v);
  }
  kernels::detail::matmul_reference_backward(d, dinp, dweight, dbias, g, inp, weight);
}

}  // namespace reference
}  // namespace tide::kernels
