#pragma once
// Figures of the softmax and the fused classifier on the host, 2 threads (bench/kernels.cpp
// calls bench_classifier()):
//
//   classifier_ns_per_elem  fused_classifier forward + backward on 256 x 50257 logits (padded to
//                           50304, in place), ns per real logit. Anchor: the unfused path in the
//                           same run (softmax_forward_masked into an (N, Vp) probability buffer,
//                           crossentropy_forward, crossentropy_softmax_backward). Goal: <= 1.2 ns
//                           (detail goal_ns). The ratio is the fusion's speed-up inverted.
//   softmax_ns_per_elem     softmax_forward on (256, 50257), ns per element. Anchor: the same
//                           three-pass row softmax with scalar std::exp, threaded the same way.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include <tide/core/exec.hpp>
#include <tide/core/parallel.hpp>
#include <tide/kernels/classifier/classifier.hpp>
#include <tide/kernels/softmax/softmax.hpp>

#include "harness.hpp"

namespace tide::bench {

namespace classifier_detail {

inline std::vector<float> random_logits(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// The anchor of softmax_ns_per_elem: max, exp + sum, normalise, with libm's scalar expf.
inline void softmax_scalar_expf(thread_pool& pool, float* out, float const* inp, index_t rows, index_t cols) {
  parallel_for(pool, static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    for (auto r = static_cast<index_t>(begin); r < static_cast<index_t>(end); ++r) {
      float const* x = inp + r * cols;
      float* y = out + r * cols;
      float m = -INFINITY;
      for (index_t j = 0; j < cols; ++j) m = x[j] > m ? x[j] : m;
      float s = 0.f;
      for (index_t j = 0; j < cols; ++j) {
        y[j] = std::exp(x[j] - m);
        s += y[j];
      }
      float const inv = 1.f / s;
      for (index_t j = 0; j < cols; ++j) y[j] *= inv;
    }
  });
}

}  // namespace classifier_detail

inline void bench_classifier() {
  namespace k = tide::kernels;
  index_t const rows = quick() ? 16 : 256;
  index_t const vocab = 50257, vp = 50304;
  int const reps = quick() ? 3 : 7;
  thread_pool pool{2};
  exec<host> ex{pool};
  auto const elems = static_cast<double>(rows) * static_cast<double>(vocab);

  // ---- classifier: fused (in place) vs softmax + cross-entropy + dlogits ----------------------
  auto logits = classifier_detail::random_logits(static_cast<std::size_t>(rows * vp), 1);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r)
    targets[static_cast<std::size_t>(r)] = static_cast<std::int32_t>((r * 7919) % vocab);
  std::vector<float> losses(static_cast<std::size_t>(rows));
  std::vector<float> probs(logits.size());
  tensor_view<float> lv{logits.data(), {rows, vp}};
  tensor_view<float> pv{probs.data(), {rows, vp}};
  tensor_view<float> loss_v{losses.data(), {rows}};
  tensor_view<std::int32_t const> tv{targets.data(), {rows}};
  std::int32_t const valid = static_cast<std::int32_t>(vocab);
  tensor_view<std::int32_t const> len{&valid, {1}};
  float const dloss = 1.f / static_cast<float>(rows);

  // Logits are overwritten by dlogits on every call; the timing does not depend on the values
  // (exp_poly is branch-free), so the runs keep going on the previous call's output.
  // Scratch made once for both paths (a training loop plans it with its activations).
  k::detail::call_scratch const ws(std::max(k::fused_classifier_scratch_bytes(ex, rows, vocab),
                                            k::softmax_forward_scratch_bytes(ex, rows, vp)));
  double const fused_s =
      median_seconds([&] { k::fused_classifier(ex, lv, loss_v, lv, tv, vocab, dloss, ws.get()); }, reps);
  keep(losses[0]);
  double const unfused_s = median_seconds(
      [&] {
        k::softmax_forward_masked(ex, pv, lv, len, 1.f, ws.get());
        k::crossentropy_forward(ex, loss_v, pv, tv, vocab);
        k::crossentropy_softmax_backward(ex, lv, pv, tv, vocab, dloss);
      },
      reps);
  keep(losses[0]);
  double const mib = static_cast<double>(rows * vp) * sizeof(float) / (1024.0 * 1024.0);
  figure{.bench = "kernels",
         .name = "classifier_ns_per_elem",
         .value = fused_s * 1e9 / elems,
         .unit = "ns",
         .anchor = "unfused_softmax_then_crossentropy",
         .anchor_value = unfused_s * 1e9 / elems,
         .higher_is_better = false,
         .detail = {{"goal_ns", 1.2},
                    {"rows", static_cast<double>(rows)},
                    {"vocab", static_cast<double>(vocab)},
                    {"padded_vocab", static_cast<double>(vp)},
                    {"threads", 2},
                    {"fused_ms", fused_s * 1e3},
                    {"unfused_ms", unfused_s * 1e3},
                    {"fused_extra_mib", 0.0},
                    {"unfused_extra_mib", mib}}}
      .print();

  // ---- softmax: vectorised exp vs scalar expf ----------------------------------------------------
  auto const x = classifier_detail::random_logits(static_cast<std::size_t>(rows * vocab), 2);
  std::vector<float> y(x.size());
  tensor_view<float const> xv{x.data(), {rows, vocab}};
  tensor_view<float> yv{y.data(), {rows, vocab}};
  k::detail::call_scratch const sws(k::softmax_forward_scratch_bytes(ex, rows, vocab));
  double const vec_s = median_seconds([&] { k::softmax_forward(ex, yv, xv, 1.f, sws.get()); }, reps);
  keep(y[0]);
  double const scalar_s =
      median_seconds([&] { classifier_detail::softmax_scalar_expf(pool, y.data(), x.data(), rows, vocab); }, reps);
  keep(y[0]);
  figure{.bench = "kernels",
         .name = "softmax_ns_per_elem",
         .value = vec_s * 1e9 / elems,
         .unit = "ns",
         .anchor = "softmax_scalar_expf",
         .anchor_value = scalar_s * 1e9 / elems,
         .higher_is_better = false,
         .detail = {{"rows", static_cast<double>(rows)}, {"cols", static_cast<double>(vocab)}, {"threads", 2}}}
      .print();
}

}  // namespace tide::bench
