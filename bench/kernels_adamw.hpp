#pragma once
// AdamW figures for bench_kernels (bench/kernels.cpp calls bench_adamw()).
//
//   adamw_fp32_vs_stream          fused fp32 AdamW, 25M params, 2 threads, in Gparam/s, over the
//                                 in-place stream probe's rate at AdamW's 28 B/param. Goal 0.9.
//   adamw_fp32_vs_naive           the same step over a naive three-pass loop (m, then v, then p:
//                                 40 B/param, dividing by the bias corrections), same threads.
//   adamw_list_vs_flat            1000 tensors of 1024 params as a list versus one flat chunk of
//                                 the same size: the per-tensor cost of the multi-tensor form.
//   adamw_undo_folded_vs_copy_pass  the 25M-param step keeping its old p, m and v (prev_* arrays:
//                                 the offload engine's undo journal), in Gparam/s, over a copy of
//                                 p, m and v (memcpy on the calling thread, as the engine's journal
//                                 did before the fold) followed by the same step without them;
//                                 the three timed alternately. detail: the plain step, and each
//                                 over it. Memory traffic: 40 B/param folded, 52 with the copy
//                                 pass, 28 plain.

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include <tide/kernels/adamw/adamw.hpp>

#include "harness.hpp"
#include "roofline.hpp"

namespace tide::bench {

namespace adamw_detail {

// Medians of a() and b() timed alternately, so drift on a shared machine hits both alike.
template <class A, class B>
std::pair<double, double> median_pair(A&& a, B&& b, int reps) {
  a();
  b();
  std::vector<double> ta, tb;
  for (int r = 0; r < reps; ++r) {
    auto t0 = clock::now();
    a();
    ta.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    t0 = clock::now();
    b();
    tb.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::nth_element(ta.begin(), ta.begin() + reps / 2, ta.end());
  std::nth_element(tb.begin(), tb.begin() + reps / 2, tb.end());
  return {ta[static_cast<std::size_t>(reps / 2)], tb[static_cast<std::size_t>(reps / 2)]};
}

}  // namespace adamw_detail

inline void bench_adamw() {
  using tide::index_t;
  namespace k = tide::kernels;
  int const threads = probe_threads;
  std::size_t const n = quick() ? (std::size_t{1} << 20) : 25'000'000;
  int const reps = quick() ? 3 : 11;
  tide::thread_pool pool{threads};
  tide::exec<tide::host> ex{pool};
  k::adamw_hparams const hp{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
  std::int64_t const t = 10;

  // p, g, m, v: page-touched by the threads that use them (the same slices as parallel_for).
  arrays a(4, n);
  auto const nn = static_cast<index_t>(n);
  tide::tensor_view<float> p{a[0], {nn}}, m{a[2], {nn}}, v{a[3], {nn}};
  tide::tensor_view<float const> g{a[1], {nn}};
  auto const fused = [&] { k::adamw(ex, hp, t, p, g, m, v); };

  float const bias1 = static_cast<float>(1.0 - std::pow(0.9, 10.0));
  float const bias2 = static_cast<float>(1.0 - std::pow(0.999, 10.0));
  auto const naive = [&] {
    float* pp = a[0];
    float const* gg = a[1];
    float* mm = a[2];
    float* vv = a[3];
    tide::parallel_for(pool, n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) mm[i] = hp.beta1 * mm[i] + (1.f - hp.beta1) * gg[i];
    });
    tide::parallel_for(pool, n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) vv[i] = hp.beta2 * vv[i] + (1.f - hp.beta2) * gg[i] * gg[i];
    });
    tide::parallel_for(pool, n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i)
        pp[i] -= hp.lr * ((mm[i] / bias1) / (std::sqrt(vv[i] / bias2) + hp.eps) + hp.weight_decay * pp[i]);
    });
  };

  double const probe_gparams = stream_probe_gbs() / 28.0;
  auto const [s_fused, s_naive] = adamw_detail::median_pair(fused, naive, reps);
  keep(a[0][n / 2]);
  double const fused_gparams = static_cast<double>(n) / s_fused / 1e9;
  double const naive_gparams = static_cast<double>(n) / s_naive / 1e9;

  figure{.bench = "kernels",
         .name = "adamw_fp32_vs_stream",
         .value = fused_gparams,
         .unit = "Gparam/s",
         .anchor = "stream_probe_28B",
         .anchor_value = probe_gparams,
         .goal = 0.9,
         .detail = {{"params", static_cast<double>(n)},
                    {"threads", threads},
                    {"seconds", s_fused},
                    {"gbs_at_28B", 28.0 * fused_gparams}}}
      .print();
  figure{.bench = "kernels",
         .name = "adamw_fp32_vs_naive",
         .value = fused_gparams,
         .unit = "Gparam/s",
         .anchor = "naive_three_pass",
         .anchor_value = naive_gparams,
         .detail = {{"params", static_cast<double>(n)},
                    {"threads", threads},
                    {"naive_seconds", s_naive},
                    {"traffic_ratio_40B_over_28B", 40.0 / 28.0}}}
      .print();

  // The undo copies: in the step's own pass, against a copy pass before it, against none; and
  // the out-of-place step the offload journal swaps in instead (from p, m, v to other blocks, the
  // two sets trading roles each call as the journal's blocks and the chunk's do).
  {
    arrays old(3, n);
    k::adamw_tensor<float> const plain_rec[] = {{a[0], a[1], a[2], a[3], nullptr, nn}};
    k::adamw_tensor<float> const folded_rec[] = {{a[0], a[1], a[2], a[3], nullptr, nn, old[0], old[1], old[2], nullptr}};
    k::adamw_tensor<float> const swap_rec[] = {
        {old[0], a[1], old[1], old[2], nullptr, nn, nullptr, nullptr, nullptr, nullptr, a[0], a[2], a[3]},
        {a[0], a[1], a[2], a[3], nullptr, nn, nullptr, nullptr, nullptr, nullptr, old[0], old[1], old[2]}};
    int side = 0;
    auto const swapped = [&] {
      k::adamw(ex, hp, t, std::span<k::adamw_tensor<float> const>(&swap_rec[side], 1));
      side ^= 1;
    };
    auto const folded = [&] { k::adamw(ex, hp, t, folded_rec); };
    auto const copy_pass = [&] {
      for (int j = 0; j < 3; ++j) std::memcpy(old[j], a[j == 0 ? 0 : j + 1], n * sizeof(float));
      k::adamw(ex, hp, t, plain_rec);
    };
    auto const plain = [&] { k::adamw(ex, hp, t, plain_rec); };
    std::vector<double> tf, tc, tp, ts;
    folded(), copy_pass(), plain(), swapped(), swapped();
    for (int r = 0; r < reps; ++r) {
      for (auto [f, out] : {std::pair<std::function<void()>, std::vector<double>*>{folded, &tf}, {copy_pass, &tc},
                            {plain, &tp}, {swapped, &ts}}) {
        auto const t0 = clock::now();
        f();
        out->push_back(std::chrono::duration<double>(clock::now() - t0).count());
      }
    }
    auto const med = [](std::vector<double> x) {
      std::nth_element(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(x.size() / 2), x.end());
      return x[x.size() / 2];
    };
    double const s_f = med(tf), s_c = med(tc), s_p = med(tp), s_s = med(ts);
    keep(old[0][n / 2]);
    figure{.bench = "kernels",
           .name = "adamw_undo_folded_vs_copy_pass",
           .value = static_cast<double>(n) / s_f / 1e9,
           .unit = "Gparam/s",
           .anchor = "memcpy of p, m, v on the calling thread, then the step",
           .anchor_value = static_cast<double>(n) / s_c / 1e9,
           .detail = {{"params", static_cast<double>(n)},
                      {"threads", threads},
                      {"folded_seconds", s_f},
                      {"copy_pass_seconds", s_c},
                      {"plain_seconds", s_p},
                      {"folded_vs_plain", s_p / s_f},
                      {"copy_pass_vs_plain", s_p / s_c}}}
        .print();
    figure{.bench = "kernels",
           .name = "adamw_undo_swap_vs_plain",
           .value = static_cast<double>(n) / s_s / 1e9,
           .unit = "Gparam/s",
           // Reads p, g, m, v and streams the new p, m, v to the other blocks: 28 B per parameter,
           // as in place; the journal swaps the blocks instead of writing 12 B more.
           .anchor = "the same step in place, keeping nothing (this run, calls interleaved)",
           .anchor_value = static_cast<double>(n) / s_p / 1e9,
           .goal = 0.95,
           .detail = {{"params", static_cast<double>(n)},
                      {"threads", threads},
                      {"swap_seconds", s_s},
                      {"plain_seconds", s_p},
                      {"folded_vs_plain", s_p / s_f}}}
        .print();
  }

  // The multi-tensor form: 1000 tensors of 1024 params, against one flat chunk of as many.
  index_t const tensors = 1000, each = 1024, total = tensors * each;
  arrays b(4, static_cast<std::size_t>(total));
  std::vector<k::adamw_tensor<float>> list;
  for (index_t i = 0; i < tensors; ++i)
    list.push_back({b[0] + i * each, b[1] + i * each, b[2] + i * each, b[3] + i * each, nullptr, each});
  k::adamw_tensor<float> const flat[] = {{b[0], b[1], b[2], b[3], nullptr, total}};
  auto const [s_list, s_flat] = adamw_detail::median_pair([&] { k::adamw(ex, hp, t, list); },
                                                          [&] { k::adamw(ex, hp, t, flat); }, quick() ? 3 : 51);
  figure{.bench = "kernels",
         .name = "adamw_list_vs_flat",
         .value = s_list * 1e6,
         .unit = "us",
         .anchor = "adamw_flat_chunk",
         .anchor_value = s_flat * 1e6,
         .higher_is_better = false,
         .detail = {{"tensors", static_cast<double>(tensors)},
                    {"params_per_tensor", static_cast<double>(each)},
                    {"us_per_tensor", (s_list - s_flat) * 1e6 / static_cast<double>(tensors)}}}
      .print();
}

}  // namespace tide::bench
