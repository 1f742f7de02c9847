// tide::kernels::cast on the host equals the scalar reference bit for bit (every pair of f32,
// bf16, f16; sizes around the block and vector widths; NaN, Inf, subnormals; 1 and 2 threads),
// and bad calls throw a usage error without writing anything.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include <tide/core/exec.hpp>
#include <tide/kernels/cast/cast.hpp>
#include <tide/kernels/cast/reference.hpp>

namespace {

using tide::bf16;
using tide::f16;
using tide::index_t;

template <class T>
std::uint32_t bits_of(T x) {
  if constexpr (sizeof(T) == 4) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  } else {
    return x.bits;
  }
}

// Random bit patterns (every class of float shows up), with the special values mixed in.
template <class T>
std::vector<T> inputs(std::size_t n, std::mt19937& rng) {
  float const specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(), 1e-40f, 5.96e-8f, 2.98e-8f,
                            65504.0f, 65520.0f, 1.0f + 0x1p-8f, 1.0f + 0x1p-11f, -3.0e38f};
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      auto const u = static_cast<std::uint32_t>(rng());
      float f;
      std::memcpy(&f, &u, 4);
      v[i] = i % 5 == 2 ? specials[(i / 5) % std::size(specials)] : f;
    } else {
      v[i] = T::from_bits(static_cast<std::uint16_t>(rng()));
    }
  }
  return v;
}

template <class From, class To>
void host_matches_reference(tide::thread_pool& pool) {
  tide::exec<tide::host> const ex{pool};
  std::mt19937 rng(12345);
  index_t const block = tide::kernels::detail::cast_host_tuning::block;
  for (index_t n : {index_t{0}, index_t{1}, index_t{3}, index_t{7}, index_t{8}, index_t{9}, index_t{33}, index_t{1000},
                    block - 1, block, block + 1, 3 * block + 5}) {
    CAPTURE(n);
    auto const x = inputs<From>(static_cast<std::size_t>(n), rng);
    std::vector<To> want(x.size()), got(x.size());
    tide::kernels::reference::cast(tide::tensor_view<From const>{x.data(), {n}}, tide::tensor_view<To>{want.data(), {n}});
    tide::kernels::cast(ex, tide::tensor_view<From const>{x.data(), {n}}, tide::tensor_view<To>{got.data(), {n}});
    index_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) bad += bits_of(got[i]) != bits_of(want[i]);
    REQUIRE(bad == 0);
  }
}

template <class From, class To>
void every_thread_count(char const* name) {
  for (int threads : {1, 2}) {
    INFO("pair: ", name);
    CAPTURE(threads);
    tide::thread_pool pool{threads};
    host_matches_reference<From, To>(pool);
  }
}

}  // namespace

TEST_CASE("cast: host equals the reference bit for bit, every pair of element types") {
  every_thread_count<float, bf16>("f32 -> bf16");
  every_thread_count<float, f16>("f32 -> f16");
  every_thread_count<bf16, float>("bf16 -> f32");
  every_thread_count<f16, float>("f16 -> f32");
  every_thread_count<bf16, f16>("bf16 -> f16");
  every_thread_count<f16, bf16>("f16 -> bf16");
  every_thread_count<float, float>("f32 -> f32");
  every_thread_count<bf16, bf16>("bf16 -> bf16");
}

TEST_CASE("cast: known values, specials, and every f16 pattern through f32 and back") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  float const x[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::quiet_NaN(), 0x1p-24f, 65520.0f, -0.0f};
  bf16 b[7];
  f16 h[7];
  tide::kernels::cast(ex, tide::tensor_view<float const>{x, {7}}, tide::tensor_view<bf16>{b, {7}});
  tide::kernels::cast(ex, tide::tensor_view<float const>{x, {7}}, tide::tensor_view<f16>{h, {7}});
  CHECK(b[0].bits == 0x3f80);  // a tie goes to the even mantissa
  CHECK(b[1].bits == 0x3f82);
  CHECK(b[2].bits == 0x7f80);
  CHECK(std::isnan(float(b[3])));
  CHECK(h[4].bits == 0x0001);  // the smallest f16 subnormal
  CHECK(h[5].bits == 0x7c00);  // rounds to Inf
  CHECK(h[6].bits == 0x8000);
  CHECK(std::isnan(float(h[3])));

  std::vector<f16> all(0x10000), back(0x10000);
  std::vector<float> wide(0x10000);
  for (std::uint32_t i = 0; i < 0x10000; ++i) all[i] = f16::from_bits(static_cast<std::uint16_t>(i));
  tide::kernels::cast(ex, tide::tensor_view<f16 const>{all.data(), {256, 256}}, tide::tensor_view<float>{wide.data(), {256, 256}});
  tide::kernels::cast(ex, tide::tensor_view<float const>{wide.data(), {256, 256}}, tide::tensor_view<f16>{back.data(), {256, 256}});
  int differ = 0;
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    bool const nan = ((i >> 10) & 0x1f) == 0x1f && (i & 0x3ff) != 0;
    differ += nan ? !std::isnan(wide[i]) : back[i].bits != all[i].bits;
  }
  CHECK(differ == 0);
}

TEST_CASE("cast: the reference walks strided views") {
  float src[12];
  for (int i = 0; i < 12; ++i) src[i] = static_cast<float>(i) + 0.5f;
  bf16 dst[6] = {};
  // Columns 1 and 3 of a (3, 4) row-major array: a strided (3, 2) view.
  tide::tensor_view<float const> cols{src + 1, {3, 2}, {4, 2, 1, 1}};
  tide::kernels::reference::cast(cols, tide::tensor_view<bf16>{dst, {3, 2}});
  CHECK(float(dst[0]) == 1.5f);
  CHECK(float(dst[1]) == 3.5f);
  CHECK(float(dst[4]) == 9.5f);
  CHECK(float(dst[5]) == 11.5f);
}

TEST_CASE("cast: bad calls throw a usage error and write nothing") {
  tide::thread_pool pool{1};
  tide::exec<tide::host> const ex{pool};
  std::vector<float> x(24, 1.0f);
  std::vector<bf16> y(24, bf16::from_bits(0x1234));
  auto untouched = [&] {
    for (auto v : y)
      if (v.bits != 0x1234) return false;
    return true;
  };
  auto category_of = [](auto&& call) {
    try {
      call();
    } catch (tide::error const& e) {
      return e.category();
    }
    return tide::errc::internal;
  };

  SUBCASE("shapes differ") {
    CHECK(category_of([&] {
            tide::kernels::cast(ex, tide::tensor_view<float const>{x.data(), {4, 6}}, tide::tensor_view<bf16>{y.data(), {6, 4}});
          }) == tide::errc::usage);
    CHECK_THROWS_WITH(tide::kernels::cast(ex, tide::tensor_view<float const>{x.data(), {24}},
                                          tide::tensor_view<bf16>{y.data(), {2, 12}}),
                      doctest::Contains("source (24) and destination (2, 12)"));
  }
  SUBCASE("strided source") {
    tide::tensor_view<float const> strided{x.data(), {4, 3}, {6, 1, 1, 1}};
    CHECK(category_of([&] { tide::kernels::cast(ex, strided, tide::tensor_view<bf16>{y.data(), {4, 3}}); }) ==
          tide::errc::usage);
  }
  SUBCASE("destination overlaps the source") {
    std::vector<float> buf(16, 2.0f);
    CHECK(category_of([&] {
            tide::kernels::cast(ex, tide::tensor_view<float const>{buf.data(), {8}}, tide::tensor_view<float>{buf.data() + 4, {8}});
          }) == tide::errc::usage);
    for (float v : buf) CHECK(v == 2.0f);
  }
  CHECK(untouched());
}
