// residual_compressor: error feedback conserves every gradient (what was sent plus the residual
// is the sum of the gradients, bit for bit, with integer-valued gradients whose sums are exact);
// density 1 sends everything; DGC's momentum correction and masking, local clipping and density
// warm-up do what compress/residual.hpp says.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "tide/compress/residual.hpp"

namespace {

namespace cx = tide::compress;

// Integer-valued gradients in [-8, 8]: every sum below is exact in fp32.
template <class T>
std::vector<T> integer_grads(std::size_t n, std::uint32_t seed) {
  std::vector<T> g(n);
  std::uint32_t s = seed * 2654435761u + 1;
  for (auto& v : g) {
    s = s * 1664525u + 1013904223u;
    v = T(static_cast<float>(static_cast<int>(s >> 28) - 8));
  }
  return g;
}

template <class T, class Sel>
void conserves(Sel sel) {
  tide::thread_pool pool(2);
  tide::exec<tide::host> const ex{pool};
  std::size_t const n = 1000;
  cx::residual_compressor<Sel> c{.density = 0.05f, .warmup_start = 0.25f, .warmup_steps = 5, .selector = sel};
  std::vector<float> residual(n, 0.f), sent(n, 0.f), total(n, 0.f);
  std::vector<std::uint32_t> idx(n);
  std::vector<float> val(n);
  for (std::int64_t step = 1; step <= 40; ++step) {
    auto const g = integer_grads<T>(n, static_cast<std::uint32_t>(step));
    for (std::size_t i = 0; i < n; ++i) total[i] += tide::to_float(g[i]);
    std::vector<float> before = residual;
    std::size_t const m = c.compress(ex, step, std::span<T const>(g), std::span(residual), {}, std::span(idx), std::span(val));
    CHECK(m >= c.k_at(n, step));
    CHECK(m <= c.capacity(n, step));
    double kept = 0, all = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double const v = double(before[i]) + tide::to_float(g[i]);
      all += v * v;
      kept += double(residual[i]) * residual[i];
    }
    if constexpr (!std::is_same_v<Sel, cx::random_k>)  // the selector contracts (random_k only on average)
      CHECK(kept <= (1.0 - static_cast<double>(c.k_at(n, step)) / n) * all + 1e-9);
    for (std::size_t j = 0; j < m; ++j) {
      CHECK(residual[idx[j]] == 0.f);
      sent[idx[j]] += val[j];
    }
  }
  for (std::size_t i = 0; i < n; ++i) CHECK(sent[i] + residual[i] == total[i]);
}

}  // namespace

TEST_CASE("error feedback conserves the gradients: sent plus residual is their sum, bit for bit") {
  conserves<float>(cx::threshold_search{});
  conserves<float>(cx::exact_topk{});
  conserves<float>(cx::sampled_threshold{});
  conserves<tide::bf16>(cx::trimmed_topk{});
  conserves<float>(cx::random_k{});
}

TEST_CASE("density 1 sends every gradient and keeps nothing") {
  tide::thread_pool pool(1);
  tide::exec<tide::host> const ex{pool};
  std::size_t const n = 300;
  cx::residual_compressor<cx::exact_topk> c{.density = 1.f};
  std::vector<float> residual(n, 0.f), val(n);
  std::vector<std::uint32_t> idx(n);
  auto const g = integer_grads<float>(n, 3);
  REQUIRE(c.compress(ex, 1, std::span<float const>(g), std::span(residual), {}, std::span(idx), std::span(val)) == n);
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(idx[i] == i);
    CHECK(val[i] == g[i]);
    CHECK(residual[i] == 0.f);
  }
}

TEST_CASE("DGC: momentum correction, momentum-factor masking, local clipping, density warm-up") {
  tide::thread_pool pool(2);
  tide::exec<tide::host> const ex{pool};
  std::size_t const n = 400;
  {  // u ← m u + g, r ← r + u; sent indices clear both
    cx::residual_compressor<cx::exact_topk> c{.density = 0.1f, .momentum = 0.5f};
    std::vector<float> residual(n, 0.f), u(n, 0.f), val(n);
    std::vector<std::uint32_t> idx(n);
    for (std::int64_t step = 1; step <= 3; ++step) {
      auto const g = integer_grads<float>(n, static_cast<std::uint32_t>(step + 10));
      auto const r0 = residual, u0 = u;
      std::size_t const m = c.compress(ex, step, std::span<float const>(g), std::span(residual), std::span(u),
                                       std::span(idx), std::span(val));
      REQUIRE(m == 40);
      std::vector<bool> chosen(n, false);
      for (std::size_t j = 0; j < m; ++j) chosen[idx[j]] = true;
      for (std::size_t i = 0; i < n; ++i) {
        float const ui = 0.5f * u0[i] + g[i], ri = r0[i] + ui;
        if (chosen[i]) {
          CHECK(u[i] == 0.f);
          CHECK(residual[i] == 0.f);
        } else {
          CHECK(u[i] == ui);
          CHECK(residual[i] == ri);
        }
      }
    }
  }
  {  // the gradient is clipped to clip_norm / √ranks before it reaches the residual
    cx::residual_compressor<cx::exact_topk> c{.density = 0.5f, .clip_norm = 2.f, .ranks = 4};
    std::vector<float> g(n, 0.5f), residual(n, 0.f), val(n);  // ‖g‖ = 10
    std::vector<std::uint32_t> idx(n);
    std::size_t const m = c.compress(ex, 1, std::span<float const>(g), std::span(residual), {}, std::span(idx), std::span(val));
    double sq = 0;
    for (float r : residual) sq += double(r) * r;
    for (std::size_t j = 0; j < m; ++j) sq += double(val[j]) * val[j];
    CHECK(std::sqrt(sq) == doctest::Approx(1.0).epsilon(1e-6));  // 2 / √4
  }
  {  // DGC's warm-up: 0.25, then / 4 every warmup_steps steps, never below the target
    cx::residual_compressor<cx::exact_topk> c{.density = 0.001f, .warmup_start = 0.25f, .warmup_steps = 2};
    float const want[] = {0.25f, 0.25f, 0.0625f, 0.0625f, 0.015625f, 0.015625f, 0.00390625f, 0.00390625f, 0.001f, 0.001f};
    for (int s = 1; s <= 10; ++s) CHECK(c.density_at(s) == want[s - 1]);
    CHECK(c.k_at(1000, 1) == 250);
    CHECK(c.k_at(1000, 100) == 1);
    CHECK(c.k_at(10, 100) == 1);  // at least one element
  }
  {  // refused: a density outside (0, 1], a residual of the wrong length, too little room
    cx::residual_compressor<cx::exact_topk> bad{.density = 0.f};
    CHECK_THROWS_AS((void)bad.density_at(1), tide::error);
    cx::residual_compressor<cx::threshold_search> c{.density = 0.1f};
    std::vector<float> g(n, 1.f), residual(n - 1, 0.f), val(n);
    std::vector<std::uint32_t> idx(n);
    CHECK_THROWS_AS((void)c.compress(ex, 1, std::span<float const>(g), std::span(residual), {}, std::span(idx), std::span(val)),
                    tide::error);
    residual.resize(n);
    CHECK_THROWS_WITH_AS((void)c.compress(ex, 1, std::span<float const>(g), std::span(residual), {},
                                          std::span(idx).first(40), std::span(val)),
                         doctest::Contains("capacity(n, step)"), tide::error);
  }
}
