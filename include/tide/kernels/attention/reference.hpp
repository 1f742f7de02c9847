#pragma once
// The scalar oracle of the attention kernels: llm.c's plain causal attention (preatt = q k^T
// scaled, masked softmax att, out = att v) row by row, everything in double, one rounding per
// output. The backward recomputes att itself (it needs neither out nor lse). Runs on float, bf16,
// f16 and double tensors (double for finite differences). O(B NH T^2 HS): tests only.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "tide/kernels/attention/checks.hpp"
#include "tide/kernels/residual/rows.hpp"

namespace tide::kernels {

namespace detail {

// The softmax row att[0..t] of query t of head h, batch b; returns log-sum-exp of the scores.
template <class Q>
double attention_reference_row(Q const& qkv, attention_dims const& d, index_t b, index_t t, index_t h,
                               std::vector<double>& att) {
  auto const at = [&](index_t tt, index_t c) { return reference::load(qkv.data()[(b * d.T + tt) * 3 * d.C + c]); };
  double const scale = 1.0 / std::sqrt(static_cast<double>(d.HS));
  double mx = -HUGE_VAL;
  for (index_t t2 = 0; t2 <= t; ++t2) {
    double s = 0.0;
    for (index_t i = 0; i < d.HS; ++i) s += at(t, h * d.HS + i) * at(t2, d.C + h * d.HS + i);
    att[static_cast<std::size_t>(t2)] = s * scale;
    mx = std::max(mx, s * scale);
  }
  double sum = 0.0;
  for (index_t t2 = 0; t2 <= t; ++t2) {
    double& a = att[static_cast<std::size_t>(t2)];
    a = std::exp(a - mx);
    sum += a;
  }
  for (index_t t2 = 0; t2 <= t; ++t2) att[static_cast<std::size_t>(t2)] /= sum;
  return mx + std::log(sum);
}

}  // namespace detail

namespace reference {

// out (B, T, C) = causal softmax(q k^T / sqrt(HS)) v per head; lse (B, NH, T) = the log-sum-exp of
// each row of scaled scores. qkv (B, T, 3C): q, k, v per token, heads of HS = C / NH channels.
template <class T, class L, class Q>
  requires Real<T> && Real<L> && ReadView<Q, T>
void attention_forward(tensor_view<T> out, tensor_view<L> lse, Q qkv, index_t NH) {
  auto const d = kernels::detail::check_attention_forward(out, lse, qkv, NH);
  std::vector<double> att(static_cast<std::size_t>(d.T));
  for (index_t b = 0; b < d.B; ++b)
    for (index_t t = 0; t < d.T; ++t)
      for (index_t h = 0; h < d.NH; ++h) {
        lse.data()[(b * d.NH + h) * d.T + t] = store<L>(kernels::detail::attention_reference_row(qkv, d, b, t, h, att));
        for (index_t i = 0; i < d.HS; ++i) {
          double o = 0.0;
          for (index_t t2 = 0; t2 <= t; ++t2)
            o +=
                att[static_cast<std::size_t>(t2)] * load(qkv.data()[(b * d.T + t2) * 3 * d.C + 2 * d.C + h * d.HS + i]);
          out.data()[(b * d.T + t) * d.C + h * d.HS + i] = store<T>(o);
        }
      }
}

// dqkv (B, T, 3C) += the gradient of attention_forward's out given dout (B, T, C):
//   datt_j = dout . v_j,  dpreatt_j = att_j (datt_j - sum_k att_k datt_k),
//   dq += scale sum_j dpreatt_j k_j,  dk_j += scale dpreatt_j q,  dv_j += att_j dout.
template <class T, class D, class Q>
  requires Real<T> && ReadView<D, T> && ReadView<Q, T>
void attention_backward(tensor_view<T> dqkv, D dout, Q qkv, index_t NH) {
  char const* const op = "reference::attention_backward";
  auto const d = kernels::detail::check_attention_qkv(op, "qkv", qkv, NH);
  kernels::detail::check_same_shape(op, "qkv", qkv, "dqkv", dqkv);
  kernels::detail::check_attention_out(op, "dout", dout, d);
  // Sums in double over the whole tensor, one rounding at the end.
  std::vector<double> grad(static_cast<std::size_t>(dqkv.size()), 0.0);
  std::vector<double> att(static_cast<std::size_t>(d.T)), datt(static_cast<std::size_t>(d.T));
  double const scale = 1.0 / std::sqrt(static_cast<double>(d.HS));
  index_t const C3 = 3 * d.C;
  for (index_t b = 0; b < d.B; ++b)
    for (index_t t = 0; t < d.T; ++t)
      for (index_t h = 0; h < d.NH; ++h) {
        kernels::detail::attention_reference_row(qkv, d, b, t, h, att);
        auto const x = [&](index_t tt, index_t c) { return load(qkv.data()[(b * d.T + tt) * C3 + c]); };
        auto const g = [&](index_t tt, index_t c) -> double& {
          return grad[static_cast<std::size_t>((b * d.T + tt) * C3 + c)];
        };
        double dot = 0.0;  // sum_k att_k datt_k
        for (index_t t2 = 0; t2 <= t; ++t2) {
          double s = 0.0;
          for (index_t i = 0; i < d.HS; ++i) {
            double const go = load(dout.data()[(b * d.T + t) * d.C + h * d.HS + i]);
            s += go * x(t2, 2 * d.C + h * d.HS + i);
            g(t2, 2 * d.C + h * d.HS + i) += att[static_cast<std::size_t>(t2)] * go;
          }
          datt[static_cast<std::size_t>(t2)] = s;
          dot += att[static_cast<std::size_t>(t2)] * s;
        }
        for (index_t t2 = 0; t2 <= t; ++t2) {
          double const dpre = att[static_cast<std::size_t>(t2)] * (datt[static_cast<std::size_t>(t2)] - dot) * scale;
          for (index_t i = 0; i < d.HS; ++i) {
            g(t, h * d.HS + i) += dpre * x(t2, d.C + h * d.HS + i);
            g(t2, d.C + h * d.HS + i) += dpre * x(t, h * d.HS + i);
          }
        }
      }
  for (index_t i = 0; i < dqkv.size(); ++i)
    dqkv.data()[i] = store<T>(load(dqkv.data()[i]) + grad[static_cast<std::size_t>(i)]);
}

}  // namespace reference
}  // namespace tide::kernels
