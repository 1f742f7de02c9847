#pragma once
// A GPT-2 forward and backward in double, written plainly (llm.c's train_gpt2.c loops), the
// oracle of tests/nn/gpt.cpp and tests/nn/golden.cpp. Independent of tide's kernels: it shares
// only the parameter layout (tide::nn::gpt_parameters), so a wrong composition in the model
// cannot hide behind the same mistake here. Every backward accumulates (+=), as llm.c's do.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <vector>

#include <tide/nn/gpt.hpp>

namespace gpt_ref {

using vec = std::vector<double>;

// ---- layers ---------------------------------------------------------------------------------

// out (B, T, C) = wte[tok] + wpe[t]
inline void encoder_forward(double* out, std::int32_t const* tok, double const* wte, double const* wpe, int B, int T,
                            int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        out[(b * T + t) * C + c] = wte[tok[b * T + t] * C + c] + wpe[t * C + c];
}
inline void encoder_backward(double* dwte, double* dwpe, double const* dout, std::int32_t const* tok, int B, int T,
                             int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        double const d = dout[(b * T + t) * C + c];
        dwte[tok[b * T + t] * C + c] += d;
        dwpe[t * C + c] += d;
      }
}

inline constexpr double ln_eps = 1e-5;

// Rows of C: out = (x - mean) * rstd * w + b, biased variance.
inline void layernorm_forward(double* out, double* mean, double* rstd, double const* inp, double const* w,
                              double const* bias, int N, int C) {
  for (int n = 0; n < N; ++n) {
    double const* x = inp + n * C;
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    double const s = 1.0 / std::sqrt(v + ln_eps);
    for (int c = 0; c < C; ++c) out[n * C + c] = (x[c] - m) * s * w[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}
inline void layernorm_backward(double* dinp, double* dw, double* db, double const* dout, double const* inp,
                               double const* w, double const* mean, double const* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    double const* x = inp + n * C;
    double const* g = dout + n * C;
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; ++c) {
      double const xhat = (x[c] - mean[n]) * rstd[n];
      double const dnorm = w[c] * g[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * xhat;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      double const xhat = (x[c] - mean[n]) * rstd[n];
      double const dnorm = w[c] * g[c];
      db[c] += g[c];
      dw[c] += xhat * g[c];
      dinp[n * C + c] += (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * rstd[n];
    }
  }
}

// out (N, OC) = inp (N, C) @ w (OC, C)^T + bias (OC, or null).
inline void matmul_forward(double* out, double const* inp, double const* w, double const* bias, int N, int C, int OC) {
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias ? bias[o] : 0.0;
      for (int c = 0; c < C; ++c) s += inp[n * C + c] * w[o * C + c];
      out[n * OC + o] = s;
    }
}
inline void matmul_backward(double* dinp, double* dw, double* db, double const* dout, double const* inp,
                            double const* w, int N, int C, int OC) {
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double const g = dout[n * OC + o];
      for (int c = 0; c < C; ++c) {
        dinp[n * C + c] += g * w[o * C + c];
        dw[o * C + c] += g * inp[n * C + c];
      }
      if (db) db[o] += g;
    }
}

// Causal self-attention: qkv (B, T, 3C), out (B, T, C); preatt, att (B, NH, T, T).
inline void attention_forward(double* out, double* preatt, double* att, double const* qkv, int B, int T, int C,
                              int NH) {
  int const HS = C / NH;
  double const scale = 1.0 / std::sqrt(static_cast<double>(HS));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double const* q = qkv + (b * T + t) * 3 * C + h * HS;
        double* pre = preatt + ((b * NH + h) * T + t) * T;
        double* a = att + ((b * NH + h) * T + t) * T;
        double m = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          double const* k = qkv + (b * T + u) * 3 * C + C + h * HS;
          double s = 0;
          for (int i = 0; i < HS; ++i) s += q[i] * k[i];
          pre[u] = s * scale;
          m = std::max(m, pre[u]);
        }
        double sum = 0;
        for (int u = 0; u <= t; ++u) sum += a[u] = std::exp(pre[u] - m);
        for (int u = 0; u < T; ++u) a[u] = u <= t ? a[u] / sum : 0.0;
        double* o = out + (b * T + t) * C + h * HS;
        for (int i = 0; i < HS; ++i) o[i] = 0;
        for (int u = 0; u <= t; ++u) {
          double const* v = qkv + (b * T + u) * 3 * C + 2 * C + h * HS;
          for (int i = 0; i < HS; ++i) o[i] += a[u] * v[i];
        }
      }
}
inline void attention_backward(double* dqkv, double const* dout, double const* qkv, double const* att, int B, int T,
                               int C, int NH) {
  int const HS = C / NH;
  double const scale = 1.0 / std::sqrt(static_cast<double>(HS));
  std::vector<double> datt(static_cast<std::size_t>(T)), dpre(static_cast<std::size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double const* a = att + ((b * NH + h) * T + t) * T;
        double const* g = dout + (b * T + t) * C + h * HS;
        for (int u = 0; u <= t; ++u) {
          double const* v = qkv + (b * T + u) * 3 * C + 2 * C + h * HS;
          double* dv = dqkv + (b * T + u) * 3 * C + 2 * C + h * HS;
          double s = 0;
          for (int i = 0; i < HS; ++i) {
            s += v[i] * g[i];
            dv[i] += a[u] * g[i];
          }
          datt[static_cast<std::size_t>(u)] = s;
        }
        double dot = 0;
        for (int u = 0; u <= t; ++u) dot += a[u] * datt[static_cast<std::size_t>(u)];
        for (int u = 0; u <= t; ++u) dpre[static_cast<std::size_t>(u)] = a[u] * (datt[static_cast<std::size_t>(u)] - dot);
        double const* q = qkv + (b * T + t) * 3 * C + h * HS;
        double* dq = dqkv + (b * T + t) * 3 * C + h * HS;
        for (int u = 0; u <= t; ++u) {
          double const* k = qkv + (b * T + u) * 3 * C + C + h * HS;
          double* dk = dqkv + (b * T + u) * 3 * C + C + h * HS;
          double const d = dpre[static_cast<std::size_t>(u)] * scale;
          for (int i = 0; i < HS; ++i) {
            dq[i] += k[i] * d;
            dk[i] += q[i] * d;
          }
        }
      }
}

// GELU, tanh form.
inline double gelu(double x) {
  double const k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
inline double gelu_grad(double x) {
  double const k = std::sqrt(2.0 / std::numbers::pi);
  double const u = k * (x + 0.044715 * x * x * x);
  double const th = std::tanh(u);
  double const sech2 = 1.0 - th * th;
  return 0.5 * (1.0 + th) + 0.5 * x * sech2 * k * (1.0 + 3.0 * 0.044715 * x * x);
}
inline void gelu_forward(double* out, double const* inp, int n) {
  for (int i = 0; i < n; ++i) out[i] = gelu(inp[i]);
}
inline void gelu_backward(double* dinp, double const* inp, double const* dout, int n) {
  for (int i = 0; i < n; ++i) dinp[i] += gelu_grad(inp[i]) * dout[i];
}

// Rows of logits (N, Vp), V real columns: probs, per-row losses, returns the mean loss.
inline double crossentropy_forward(double* probs, double* losses, double const* logits, std::int32_t const* targets,
                                   int N, int V, int Vp) {
  double total = 0;
  for (int n = 0; n < N; ++n) {
    double const* x = logits + n * Vp;
    double m = -INFINITY;
    for (int j = 0; j < V; ++j) m = std::max(m, x[j]);
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(x[j] - m);
    for (int j = 0; j < Vp; ++j) probs[n * Vp + j] = j < V ? std::exp(x[j] - m) / sum : 0.0;
    losses[n] = -(x[targets[n]] - m - std::log(sum));
    total += losses[n];
  }
  return total / N;
}
// dlogits += (probs - onehot) / N over the V real columns.
inline void crossentropy_backward(double* dlogits, double const* probs, std::int32_t const* targets, int N, int V,
                                  int Vp) {
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < V; ++j)
      dlogits[n * Vp + j] += (probs[n * Vp + j] - (j == targets[n] ? 1.0 : 0.0)) / N;
}

// ---- the model ------------------------------------------------------------------------------

// Parameters and gradients are flat vectors in the layout of tide::nn::gpt_parameters(config,
// f32): element offset = byte offset / 4, padding included (and never touched).
struct model {
  tide::nn::gpt_config c;
  tide::parameter_list list;
  int B = 0, T = 0;
  std::vector<std::int32_t> tokens, targets;

  // activations
  vec encoded, lnf, lnf_mean, lnf_rstd, logits, probs, losses;
  struct block {
    vec ln1, ln1_mean, ln1_rstd, qkv, preatt, att, atty, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj,
        res3;
  };
  std::vector<block> blocks;

  explicit model(tide::nn::gpt_config const& config)
      : c(tide::nn::resolve(config)), list(tide::nn::gpt_parameters(c, tide::dtype::f32)) {}

  [[nodiscard]] std::size_t flat_size() const { return list.bytes() / sizeof(float); }
  [[nodiscard]] std::size_t at(std::size_t param_index) const { return list[param_index].offset / sizeof(float); }
  // Parameter k of block l (list order: wte, wpe, 12 per block, lnf.w, lnf.b).
  [[nodiscard]] std::size_t at(int l, int k) const { return at(static_cast<std::size_t>(2 + 12 * l + k)); }

  double forward(vec const& p, std::vector<std::int32_t> const& tok, std::vector<std::int32_t> const& tgt, int Bn,
                 int Tn) {
    B = Bn, T = Tn, tokens = tok, targets = tgt;
    int const C = c.channels, NH = c.heads, L = c.layers, V = c.vocab, Vp = c.padded_vocab, N = B * T;
    auto sz = [](int n) { return static_cast<std::size_t>(n); };
    encoded.assign(sz(N * C), 0);
    encoder_forward(encoded.data(), tokens.data(), p.data() + at(0), p.data() + at(1), B, T, C);
    blocks.resize(sz(L));  // assign() below reuses each vector's storage across calls
    double const* x = encoded.data();
    for (int l = 0; l < L; ++l) {
      block& k = blocks[sz(l)];
      k.ln1.assign(sz(N * C), 0), k.ln1_mean.assign(sz(N), 0), k.ln1_rstd.assign(sz(N), 0);
      k.qkv.assign(sz(N * 3 * C), 0), k.preatt.assign(sz(B * NH * T * T), 0), k.att.assign(sz(B * NH * T * T), 0);
      k.atty.assign(sz(N * C), 0), k.attproj.assign(sz(N * C), 0), k.res2.assign(sz(N * C), 0);
      k.ln2.assign(sz(N * C), 0), k.ln2_mean.assign(sz(N), 0), k.ln2_rstd.assign(sz(N), 0);
      k.fch.assign(sz(N * 4 * C), 0), k.fch_gelu.assign(sz(N * 4 * C), 0), k.fcproj.assign(sz(N * C), 0);
      k.res3.assign(sz(N * C), 0);
      layernorm_forward(k.ln1.data(), k.ln1_mean.data(), k.ln1_rstd.data(), x, &p[at(l, 0)], &p[at(l, 1)], N, C);
      matmul_forward(k.qkv.data(), k.ln1.data(), &p[at(l, 2)], &p[at(l, 3)], N, C, 3 * C);
      attention_forward(k.atty.data(), k.preatt.data(), k.att.data(), k.qkv.data(), B, T, C, NH);
      matmul_forward(k.attproj.data(), k.atty.data(), &p[at(l, 4)], &p[at(l, 5)], N, C, C);
      for (int i = 0; i < N * C; ++i) k.res2[sz(i)] = x[i] + k.attproj[sz(i)];
      layernorm_forward(k.ln2.data(), k.ln2_mean.data(), k.ln2_rstd.data(), k.res2.data(), &p[at(l, 6)], &p[at(l, 7)],
                        N, C);
      matmul_forward(k.fch.data(), k.ln2.data(), &p[at(l, 8)], &p[at(l, 9)], N, C, 4 * C);
      gelu_forward(k.fch_gelu.data(), k.fch.data(), N * 4 * C);
      matmul_forward(k.fcproj.data(), k.fch_gelu.data(), &p[at(l, 10)], &p[at(l, 11)], N, 4 * C, C);
      for (int i = 0; i < N * C; ++i) k.res3[sz(i)] = k.res2[sz(i)] + k.fcproj[sz(i)];
      x = k.res3.data();
    }
    std::size_t const nlast = list.size();
    lnf.assign(sz(N * C), 0), lnf_mean.assign(sz(N), 0), lnf_rstd.assign(sz(N), 0);
    layernorm_forward(lnf.data(), lnf_mean.data(), lnf_rstd.data(), x, &p[at(nlast - 2)], &p[at(nlast - 1)], N, C);
    logits.assign(sz(N * Vp), 0);
    matmul_forward(logits.data(), lnf.data(), &p[at(0)], nullptr, N, C, Vp);
    probs.assign(sz(N * Vp), 0), losses.assign(sz(N), 0);
    return crossentropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), N, V, Vp);
  }

  // g += d(mean loss)/d(p) of the last forward.
  void backward(vec const& p, vec& g) const {
    int const C = c.channels, NH = c.heads, L = c.layers, V = c.vocab, Vp = c.padded_vocab, N = B * T;
    auto sz = [](int n) { return static_cast<std::size_t>(n); };
    vec dlogits(sz(N * Vp), 0), dlnf(sz(N * C), 0), dres(sz(N * C), 0);
    crossentropy_backward(dlogits.data(), probs.data(), targets.data(), N, V, Vp);
    matmul_backward(dlnf.data(), &g[at(0)], nullptr, dlogits.data(), lnf.data(), &p[at(0)], N, C, Vp);
    std::size_t const nlast = list.size();
    double const* xL = L > 0 ? blocks[sz(L - 1)].res3.data() : encoded.data();
    layernorm_backward(dres.data(), &g[at(nlast - 2)], &g[at(nlast - 1)], dlnf.data(), xL, &p[at(nlast - 2)],
                       lnf_mean.data(), lnf_rstd.data(), N, C);
    for (int l = L - 1; l >= 0; --l) {
      block const& k = blocks[sz(l)];
      double const* x = l == 0 ? encoded.data() : blocks[sz(l - 1)].res3.data();
      vec dfch_gelu(sz(N * 4 * C), 0), dfch(sz(N * 4 * C), 0), dln2(sz(N * C), 0), datty(sz(N * C), 0),
          dqkv(sz(N * 3 * C), 0), dln1(sz(N * C), 0);
      matmul_backward(dfch_gelu.data(), &g[at(l, 10)], &g[at(l, 11)], dres.data(), k.fch_gelu.data(), &p[at(l, 10)], N,
                      4 * C, C);
      gelu_backward(dfch.data(), k.fch.data(), dfch_gelu.data(), N * 4 * C);
      matmul_backward(dln2.data(), &g[at(l, 8)], &g[at(l, 9)], dfch.data(), k.ln2.data(), &p[at(l, 8)], N, C, 4 * C);
      layernorm_backward(dres.data(), &g[at(l, 6)], &g[at(l, 7)], dln2.data(), k.res2.data(), &p[at(l, 6)],
                         k.ln2_mean.data(), k.ln2_rstd.data(), N, C);
      matmul_backward(datty.data(), &g[at(l, 4)], &g[at(l, 5)], dres.data(), k.atty.data(), &p[at(l, 4)], N, C, C);
      attention_backward(dqkv.data(), datty.data(), k.qkv.data(), k.att.data(), B, T, C, NH);
      matmul_backward(dln1.data(), &g[at(l, 2)], &g[at(l, 3)], dqkv.data(), k.ln1.data(), &p[at(l, 2)], N, C, 3 * C);
      layernorm_backward(dres.data(), &g[at(l, 0)], &g[at(l, 1)], dln1.data(), x, &p[at(l, 0)], k.ln1_mean.data(),
                         k.ln1_rstd.data(), N, C);
    }
    encoder_backward(&g[at(0)], &g[at(1)], dres.data(), tokens.data(), B, T, C);
  }
};

}  // namespace gpt_ref
