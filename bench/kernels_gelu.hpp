#pragma once
// GELU figure for bench_kernels (wired in bench/kernels.cpp): gelu_forward over (N, 4C) fp32 at
// GPT-2 small's MLP width, 2 threads, as effective GB/s against the copy probe of the same run.
//
//   gelu_fwd_vs_copy  8 B/elem: read inp, write out. Compute per element: one exp_poly, one
//                     divide, ~20 FLOP; g++ vectorises it (no libm call), so it is memory-bound.
//
// The copy probe counts 4 B/elem (payload); detail.copy_traffic_ratio divides by its real
// traffic (2x payload) instead.

#include <cstddef>
#include <random>
#include <vector>

#include <tide/kernels/gelu/gelu.hpp>

#include "harness.hpp"
#include "roofline.hpp"

namespace tide::bench {

inline void bench_gelu() {
  index_t const N = quick() ? 512 : 8192, C = 4 * 768;
  int const threads = probe_threads;
  auto const nc = static_cast<std::size_t>(N * C);
  std::vector<float> x(nc), out(nc);
  std::mt19937 gen(2);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (auto& v : x) v = dist(gen);
  thread_pool pool{threads};
  exec<host> ex{pool};
  tensor_view<float> X{x.data(), {N, C}}, O{out.data(), {N, C}};
  double const copy = copy_probe_gbs();
  double const s = median_seconds([&] { kernels::gelu_forward(ex, O, X); }, quick() ? 3 : 15, 2);
  keep(out[nc / 2]);
  double const gbs = 8.0 * static_cast<double>(nc) / s / 1e9;
  figure{.bench = "kernels",
         .name = "gelu_fwd_vs_copy",
         .value = gbs,
         .unit = "GB/s",
         .anchor = "copy_probe",
         .anchor_value = copy,
         .goal = 0.8,
         .detail = {{"ms", s * 1e3},
                    {"bytes_per_elem", 8.0},
                    {"N", static_cast<double>(N)},
                    {"C", static_cast<double>(C)},
                    {"threads", threads},
                    {"ns_per_elem", s * 1e9 / static_cast<double>(nc)},
                    {"copy_traffic_ratio", gbs / (2.0 * copy)}}}
      .print();
}

}  // namespace tide::bench
