#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <tide/kernels/adamw/adamw.hpp>
#include <tide/kernels/grad_norm/grad_norm.hpp>

#include "support/kernel_checks.hpp"

namespace {

namespace k = tide::kernels;
using tide::index_t;

using tide::test::noise;
using tide::test::throws_usage;

// Gradients over a wide range of magnitudes (2^-20 to 2^10), so the sum is not dominated by
// a few terms of one size.
template <class Grad>
std::vector<Grad> gradients(index_t n, unsigned seed) {
  std::vector<Grad> g;
  for (index_t i = 0; i < n; ++i)
    g.push_back(tide::from_float<Grad>(std::ldexp(noise(seed, i), static_cast<int>(15.f * noise(seed + 1, i)) - 5)));
  return g;
}

// Both sums add exact squares in double; each has relative error <= (n - 1) 2^-53 (Higham,
// recursive summation; the host's lanes and grains only shorten the chains), so they differ by
// at most 2 n 2^-53 relative, and the square roots by half that: n 2^-53.
double norm_tolerance(index_t n, double norm) { return static_cast<double>(n) * 0x1p-53 * norm; }

}  // namespace

TEST_CASE_TEMPLATE("grad norm: host matches the reference over a flat chunk, odd sizes", Grad, float, tide::bf16,
                   tide::f16) {
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  for (index_t n : {1, 15, 17, 63, 65537, 1000003}) {
    CAPTURE(n);
    auto const g = gradients<Grad>(n, 3u);
    tide::tensor_view<Grad const> const view{g.data(), {n}};
    double const host = k::global_grad_norm(ex, view);
    double const ref = k::reference::global_grad_norm(view);
    CHECK(ref > 0);
    CHECK(std::abs(host - ref) <= norm_tolerance(n, ref));
    CHECK_FALSE(k::any_non_finite(ex, view));
  }
}

TEST_CASE("grad norm: a list of tensors, empty ones included, matches the reference") {
  std::vector<index_t> const sizes = {3, 0, 70000, 1, 17, 131072, 5};
  std::vector<std::vector<tide::bf16>> storage;
  std::vector<k::grad_tensor<tide::bf16>> list;
  index_t total = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    storage.push_back(gradients<tide::bf16>(sizes[i], 10u + static_cast<unsigned>(i)));
    list.push_back({sizes[i] ? storage.back().data() : nullptr, sizes[i]});
    total += sizes[i];
  }
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  double const host = k::global_grad_norm(ex, list);
  double const ref = k::reference::global_grad_norm(list);
  CHECK(std::abs(host - ref) <= norm_tolerance(total, ref));
  CHECK(k::global_grad_norm(ex, std::vector<k::grad_tensor<float>>{}) == 0.0);
  // adamw's records are gradient records too: the norm of the list a step takes.
  std::vector<float> state(4, 0.f);
  std::vector<tide::bf16> const g = {tide::bf16(3.f), tide::bf16(-4.f)};
  std::vector<k::adamw_tensor<tide::bf16>> const records = {{state.data(), g.data(), state.data() + 2,
                                                             state.data() + 2, nullptr, 2}};
  CHECK(k::global_grad_norm(ex, records) == 5.0);
}

TEST_CASE("grad norm: bit-identical for 1, 2 and 3 threads (fixed grains, partials added in grain order)") {
  index_t const n = 1000003;
  auto const g = gradients<float>(n, 21u);
  tide::tensor_view<float const> const view{g.data(), {n}};
  std::vector<double> norms;
  for (int threads : {1, 2, 3}) {
    tide::thread_pool pool{threads};
    norms.push_back(k::global_grad_norm(tide::exec<tide::host>{pool}, view));
  }
  CHECK(std::memcmp(&norms[0], &norms[1], sizeof(double)) == 0);
  CHECK(std::memcmp(&norms[0], &norms[2], sizeof(double)) == 0);
}

TEST_CASE_TEMPLATE("grad norm: non-finite exactly when a gradient is; any_non_finite agrees", Grad, float, tide::bf16,
                   tide::f16) {
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  index_t const n = 100003;
  float const inf = std::numeric_limits<float>::infinity();
  for (index_t at : {index_t{0}, index_t{77777}, n - 1}) {
    for (float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
      CAPTURE(at);
      CAPTURE(bad);
      auto g = gradients<Grad>(n, 31u);
      g[static_cast<std::size_t>(at)] = tide::from_float<Grad>(bad);
      tide::tensor_view<Grad const> const view{g.data(), {n}};
      CHECK_FALSE(std::isfinite(k::global_grad_norm(ex, view)));
      CHECK(k::any_non_finite(ex, view));
      CHECK(k::reference::any_non_finite(std::vector<k::grad_tensor<Grad>>{{g.data(), n}}));
    }
  }
  // The largest finite values: their squares overflow float, not the double sum.
  Grad big;
  if constexpr (std::is_same_v<Grad, float>)
    big = std::numeric_limits<float>::max();
  else
    big = Grad::from_bits(std::is_same_v<Grad, tide::bf16> ? 0x7f7f : 0x7bff);  // 3.39e38, 65504
  std::vector<Grad> const huge(1000, big);
  tide::tensor_view<Grad const> const view{huge.data(), {1000}};
  double const norm = k::global_grad_norm(ex, view);
  CHECK(std::isfinite(norm));
  CHECK(norm == doctest::Approx(std::sqrt(1000.0) * tide::to_float(huge[0])).epsilon(1e-12));
  CHECK_FALSE(k::any_non_finite(ex, view));
}

TEST_CASE("clip_scale: PyTorch's clip_grad_norm_ coefficient, NaN for a non-finite norm") {
  CHECK(k::clip_scale(0.5, 1.f) == 1.f);
  CHECK(k::clip_scale(0.0, 1.f) == 1.f);
  CHECK(k::clip_scale(10.0, 1.f) == static_cast<float>(1.0 / (10.0 + 1e-6)));
  CHECK(k::clip_scale(4.0, 2.f) == k::reference::clip_scale(4.0, 2.f));
  CHECK(k::clip_scale(1e30, std::numeric_limits<float>::infinity()) == 1.f);
  CHECK(std::isnan(k::clip_scale(std::numeric_limits<double>::infinity(), 1.f)));
  CHECK(std::isnan(k::clip_scale(std::numeric_limits<double>::quiet_NaN(), 1.f)));
  CHECK(throws_usage([] { (void)k::clip_scale(1.0, 0.f); }));
  CHECK(throws_usage([] { (void)k::clip_scale(1.0, -1.f); }));
  CHECK(throws_usage([] { (void)k::clip_scale(1.0, std::numeric_limits<float>::quiet_NaN()); }));
}

TEST_CASE("clipping through adamw's grad_scale equals stepping on clipped gradients") {
  // The host multiplies g by grad_scale in float before use, as clipping the gradients first
  // would: the two give the same bits.
  index_t const n = 4097;
  auto g = gradients<float>(n, 41u);
  std::vector<float> p1(static_cast<std::size_t>(n)), m1(p1), v1(p1);
  for (index_t i = 0; i < n; ++i) p1[static_cast<std::size_t>(i)] = noise(42u, i);
  auto p2 = p1, m2 = m1, v2 = v1;
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  std::vector<k::grad_tensor<float>> const grads = {{g.data(), n}};
  float const scale = k::clip_scale(k::global_grad_norm(ex, grads), 1.f);
  CHECK(scale < 1.f);
  std::vector<k::adamw_tensor<float>> const fused = {{p1.data(), g.data(), m1.data(), v1.data(), nullptr, n}};
  k::adamw(ex, {}, 1, fused, scale);
  auto clipped = g;
  for (float& x : clipped) x *= scale;
  std::vector<k::adamw_tensor<float>> const separate = {{p2.data(), clipped.data(), m2.data(), v2.data(), nullptr, n}};
  k::adamw(ex, {}, 1, separate);
  CHECK(p1 == p2);
  CHECK(m1 == m2);
  CHECK(v1 == v2);
  // The clipped gradients have norm max_norm (up to the 1e-6 PyTorch adds and float rounding).
  std::vector<k::grad_tensor<float>> const after = {{clipped.data(), n}};
  CHECK(k::global_grad_norm(ex, after) == doctest::Approx(1.0).epsilon(1e-5));
}

TEST_CASE("grad norm: malformed records and strided views throw tide::error(usage)") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  std::vector<float> g(12, 1.f);
  std::vector<k::grad_tensor<float>> list = {{g.data(), 12}, {nullptr, 3}};
  CHECK(throws_usage([&] { (void)k::global_grad_norm(ex, list); }));
  CHECK(throws_usage([&] { (void)k::any_non_finite(ex, list); }));
  list[1] = {g.data(), -1};
  CHECK(throws_usage([&] { (void)k::global_grad_norm(ex, list); }));
  tide::tensor_view<float const> const strided{g.data(), {4}, {3, 1, 1, 1}};
  CHECK(throws_usage([&] { (void)k::global_grad_norm(ex, strided); }));
  CHECK(throws_usage([&] { (void)k::any_non_finite(ex, strided); }));
}
