#pragma once
// The scalar oracle of the LayerNorm kernels: llm.c's loops, in double. Runs on float, bf16, f16
// and double tensors (double for finite differences); mean and rstd are float or double.

#include <cmath>
#include <cstddef>
#include <vector>

#include "tide/kernels/layernorm/checks.hpp"
#include "tide/kernels/layernorm/math.hpp"
#include "tide/kernels/residual/reference.hpp"
#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels::reference {

// out = (inp - mean) rstd weight + bias per row; saves mean and rstd. inp, out (N, C); mean,
// rstd one per row; weight, bias (C). eps is layernorm_eps (the float 1e-5f, widened).
template <class T, class S, class X, class Wv, class Bv>
  requires Real<T> && Real<S> && ReadView<X, T> && Real<element_of<Wv>> && ReadView<Wv, element_of<Wv>> &&
           ReadView<Bv, element_of<Wv>>
void layernorm_forward(tensor_view<T> out, tensor_view<S> mean, tensor_view<S> rstd, X inp, Wv weight, Bv bias) {
  index_t const C = kernels::detail::check_layernorm_forward(out, mean, rstd, inp, weight, bias);
  index_t const N = inp.size() / C;
  double const eps = static_cast<double>(layernorm_eps);
  for (index_t n = 0; n < N; ++n) {
    auto const* x = inp.data() + n * C;
    double m = 0.0;
    for (index_t i = 0; i < C; ++i) m += load(x[i]);
    m /= static_cast<double>(C);
    double v = 0.0;
    for (index_t i = 0; i < C; ++i) v += (load(x[i]) - m) * (load(x[i]) - m);
    v /= static_cast<double>(C);
    double const s = 1.0 / std::sqrt(v + eps);
    for (index_t i = 0; i < C; ++i)
      out.data()[n * C + i] = store<T>((load(x[i]) - m) * s * load(weight.data()[i]) + load(bias.data()[i]));
    mean.data()[n] = store<S>(m);
    rstd.data()[n] = store<S>(s);
  }
}

// dinp += d/dinp, dweight += d/dweight, dbias += d/dbias of sum(out * dout), given the forward's
// mean and rstd. dinp, dout, inp (N, C); weight, dweight, dbias (C); mean, rstd one per row.
template <class T, class W, class D, class X, class Wv, class M, class R>
  requires Real<T> && Real<W> && ReadView<D, T> && ReadView<X, T> && ReadView<Wv, W> &&
           Real<element_of<M>> && ReadView<M, element_of<M>> && ReadView<R, element_of<M>>
void layernorm_backward(tensor_view<T> dinp, tensor_view<W> dweight, tensor_view<W> dbias, D dout, X inp, Wv weight,
                        M mean, R rstd) {
  index_t const C = kernels::detail::check_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  index_t const N = inp.size() / C;
  std::vector<double> dw(static_cast<std::size_t>(C), 0.0), db(static_cast<std::size_t>(C), 0.0);
  for (index_t n = 0; n < N; ++n) {
    auto const* x = inp.data() + n * C;
    auto const* g = dout.data() + n * C;
    double const m = load(mean.data()[n]);
    double const s = load(rstd.data()[n]);
    double mean_dnorm = 0.0, mean_dnorm_xhat = 0.0;
    for (index_t i = 0; i < C; ++i) {
      double const xhat = (load(x[i]) - m) * s;
      double const dnorm = load(weight.data()[i]) * load(g[i]);
      mean_dnorm += dnorm;
      mean_dnorm_xhat += dnorm * xhat;
    }
    mean_dnorm /= static_cast<double>(C);
    mean_dnorm_xhat /= static_cast<double>(C);
    for (index_t i = 0; i < C; ++i) {
      double const xhat = (load(x[i]) - m) * s;
      double const dnorm = load(weight.data()[i]) * load(g[i]);
      auto const ci = static_cast<std::size_t>(i);
      db[ci] += load(g[i]);
      dw[ci] += xhat * load(g[i]);
      T& d = dinp.data()[n * C + i];
      d = store<T>(load(d) + s * (dnorm - mean_dnorm - xhat * mean_dnorm_xhat));
    }
  }
  for (index_t i = 0; i < C; ++i) {
    auto const ci = static_cast<std::size_t>(i);
    dweight.data()[i] = store<W>(load(dweight.data()[i]) + dw[ci]);
    dbias.data()[i] = store<W>(load(dbias.data()[i]) + db[ci]);
  }
}

// residual = a + b (rounded to T), then out = layernorm(residual): residual_forward followed by
// layernorm_forward.
template <class T, class S, class A, class Bv, class Wv, class Bi>
  requires Real<T> && Real<S> && ReadView<A, T> && ReadView<Bv, T> && Real<element_of<Wv>> &&
           ReadView<Wv, element_of<Wv>> && ReadView<Bi, element_of<Wv>>
void residual_layernorm_forward(tensor_view<T> residual, tensor_view<T> out, tensor_view<S> mean, tensor_view<S> rstd,
                                A a, Bv b, Wv weight, Bi bias) {
  kernels::detail::check_residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias);
  residual_forward(residual, a, b);
  layernorm_forward(out, mean, rstd, residual, weight, bias);
}

}  // namespace tide::kernels::reference
