// bench_compress: gradient compression's selection.
//
//   <selector>_vs_nth_element  choosing 0.1 % of 25 M floats (a GPT-2 124M layer group's
//                              gradients, k = 25,000) by magnitude: elements per second of each
//                              selector of compress/select.hpp (on the machine's threads),
//                              against std::nth_element over a copy of the magnitudes (one
//                              thread; the copy is not timed), same run. threshold_search's goal
//                              is 5x. sort_vs_nth_element: a full std::sort of the same copy.
//
// The values: normal-like gradients (a sum of uniforms) with a heavy tail, fixed seed.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness.hpp"
#include "tide/compress/select.hpp"

namespace {

std::vector<float> gradients(std::size_t n) {
  std::vector<float> x(n);
  std::uint32_t s = 12345u;
  auto next = [&] {
    s ^= s << 13, s ^= s >> 17, s ^= s << 5;
    return static_cast<float>(s >> 8) / 16777216.f;
  };
  for (auto& v : x) {
    float const g = next() + next() + next() - 1.5f;
    v = next() < 0.01f ? g * 20.f : g;
  }
  return x;
}

// Seconds per call, median of reps; `prepare` runs untimed before each call.
template <class Prepare, class F>
double timed(int reps, Prepare&& prepare, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps + 1; ++i) {
    prepare();
    auto const t0 = std::chrono::steady_clock::now();
    f();
    if (i > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::ranges::sort(t);
  return t[t.size() / 2];
}

}  // namespace

int main() {
  bool const quick = tide::bench::quick();
  std::size_t const n = quick ? (std::size_t{1} << 16) : std::size_t{25'000'000};
  std::size_t const k = std::max<std::size_t>(1, n / 1000);  // density 1e-3
  int const reps = quick ? 1 : 5;
  auto const x = gradients(n);
  std::vector<float> mag(n);
  auto copy = [&] { std::ranges::transform(x, mag.begin(), [](float v) { return std::fabs(v); }); };

  double const nth_s = timed(reps, copy, [&] {
    std::nth_element(mag.begin(), mag.begin() + static_cast<std::ptrdiff_t>(k - 1), mag.end(), std::greater<>());
    tide::bench::keep(mag[k - 1]);
  });
  double const sort_s = timed(reps, copy, [&] {
    std::sort(mag.begin(), mag.end(), std::greater<>());
    tide::bench::keep(mag[k - 1]);
  });
  double const elems = static_cast<double>(n);

  tide::thread_pool pool;
  tide::exec<tide::host> const ex{pool};
  auto report = [&](std::string const& name, double seconds, std::size_t chosen, double goal) {
    tide::bench::figure{.bench = "compress",
                        .name = name + "_vs_nth_element",
                        .value = elems / seconds / 1e9,
                        .unit = "Gelem/s",
                        .anchor = "std::nth_element over a copy of |x| (one thread), same run",
                        .anchor_value = elems / nth_s / 1e9,
                        .goal = goal,
                        .detail = {{"elements", elems},
                                   {"k", static_cast<double>(k)},
                                   {"chosen", static_cast<double>(chosen)},
                                   {"threads", pool.threads()},
                                   {"ms", seconds * 1e3},
                                   {"nth_element_ms", nth_s * 1e3}}}
        .print();
  };
  std::vector<std::uint32_t> out(2 * k);
  auto run = [&](auto selector, double goal) {
    using S = decltype(selector);
    std::size_t chosen = 0;
    // Each call from a fresh state except threshold_search's τ, which a compressor reuses from
    // step to step: timed from the second call on, as in training.
    double const s = timed(reps, [] {}, [&] { chosen = selector.select(ex, x, k, std::span(out).first(S::capacity(k))); });
    report(std::string(S::name), s, chosen, goal);
  };
  run(tide::compress::threshold_search{}, 5.0);
  run(tide::compress::exact_topk{}, std::nan(""));
  run(tide::compress::trimmed_topk{}, std::nan(""));
  run(tide::compress::sampled_threshold{}, std::nan(""));
  run(tide::compress::random_k{}, std::nan(""));
  report("sort", sort_s, k, std::nan(""));
  return 0;
}
