#pragma once
// LayerNorm figures for bench_kernels (wired in bench/kernels.cpp): forward and backward at
// GPT-2 small's width, fp32, 2 threads, as effective GB/s against the copy probe of the same run.
//
//   layernorm_fwd_vs_copy  8 B/elem: read inp, write out (mean, rstd, weight, bias are < 0.2%)
//   layernorm_bwd_vs_copy  16 B/elem: read inp and dout, read and write dinp (dweight, dbias and
//                          the per-chunk partials are < 3%)
//
// The copy probe counts 4 B/elem (payload) for a read and a write, so the ratio compares bytes
// named above with payload bytes; detail.copy_traffic_ratio divides by the probe's real traffic
// (2x payload) instead.

#include <cstddef>
#include <random>
#include <vector>

#include <tide/kernels/layernorm/layernorm.hpp>

#include "harness.hpp"
#include "roofline.hpp"

namespace tide::bench {

inline void bench_layernorm() {
  index_t const N = quick() ? 2048 : 32768, C = 768;
  int const threads = probe_threads;
  auto const nc = static_cast<std::size_t>(N * C);
  std::vector<float> x(nc), out(nc), dout(nc), dinp(nc, 0.0f), w(static_cast<std::size_t>(C)),
      b(static_cast<std::size_t>(C)), dw(static_cast<std::size_t>(C), 0.0f), db(static_cast<std::size_t>(C), 0.0f),
      mean(static_cast<std::size_t>(N)), rstd(static_cast<std::size_t>(N));
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  for (auto& v : x) v = dist(gen);
  for (auto& v : dout) v = dist(gen);
  for (auto& v : w) v = 1.0f + 0.1f * dist(gen);
  for (auto& v : b) v = 0.1f * dist(gen);

  thread_pool pool{threads};
  exec<host> ex{pool};
  tensor_view<float> X{x.data(), {N, C}}, O{out.data(), {N, C}}, DO{dout.data(), {N, C}}, DI{dinp.data(), {N, C}};
  tensor_view<float> W{w.data(), {C}}, B{b.data(), {C}}, DW{dw.data(), {C}}, DB{db.data(), {C}};
  tensor_view<float> M{mean.data(), {N}}, R{rstd.data(), {N}};

  int const reps = quick() ? 3 : 15;
  double const copy = copy_probe_gbs();
  double const fwd = median_seconds([&] { kernels::layernorm_forward(ex, O, M, R, X, W, B); }, reps, 2);
  keep(out[nc / 2]);
  kernels::detail::call_scratch const ws(kernels::layernorm_backward_scratch_bytes(ex, N, C));  // made once
  double const bwd =
      median_seconds([&] { kernels::layernorm_backward(ex, DI, DW, DB, DO, X, W, M, R, ws.get()); }, reps, 2);
  keep(dinp[nc / 2]);

  double const elems = static_cast<double>(nc);
  auto report = [&](char const* name, double seconds, double bytes_per_elem, double goal) {
    double const gbs = bytes_per_elem * elems / seconds / 1e9;
    figure{.bench = "kernels",
           .name = name,
           .value = gbs,
           .unit = "GB/s",
           .anchor = "copy_probe",
           .anchor_value = copy,
           .goal = goal,
           .detail = {{"ms", seconds * 1e3},
                      {"bytes_per_elem", bytes_per_elem},
                      {"N", static_cast<double>(N)},
                      {"C", static_cast<double>(C)},
                      {"threads", threads},
                      {"copy_traffic_ratio", gbs / (2.0 * copy)}}}
        .print();
  };
  report("layernorm_fwd_vs_copy", fwd, 8.0, 0.8);
  report("layernorm_bwd_vs_copy", bwd, 16.0, 0.6);
}

}  // namespace tide::bench
