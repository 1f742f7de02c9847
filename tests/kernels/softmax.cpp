#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/exec.hpp>
#include <tide/kernels/detail/exp.hpp>
#include <tide/kernels/softmax/softmax.hpp>

namespace {

using tide::bf16;
using tide::f16;
using tide::index_t;
using tide::tensor_view;
namespace k = tide::kernels;
namespace ref = tide::kernels::reference;

constexpr double u32 = 0x1p-24;  // fp32 unit roundoff

template <class T>
std::vector<T> random_values(std::size_t n, float stddev, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<T> v(n);
  for (auto& x : v) x = tide::from_float<T>(dist(gen));
  return v;
}

// The inputs as float: the reference then runs on exactly the values the kernel saw and
// returns its result unrounded to T, so a test sees the kernel's own rounding only.
template <class T>
std::vector<float> to_floats(std::vector<T> const& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = tide::to_float(v[i]);
  return r;
}

template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The smallest absolute error the output type can be held to: fp32 flushes e^x below 2^-126
// (exp_poly), f16 has subnormals below 2^-14 whose spacing is 2^-24.
template <class T>
constexpr double abs_floor = std::is_same_v<T, f16> ? 0x1p-25 : 0x1p-125;

// Forward tolerance for one element, against the double reference of the same inputs:
//   the exp argument z - m: z = fl(scale x) and m round (|z| + |m|) u, the subtraction |z - m| u;
//   exp_poly: <= 1.02 ulp; the reciprocal and the product: 1 u each; the row sum of n positive
//   terms in 16 lanes: its relative error is ~sqrt(n / 16) u for random data (measured 23 u in
//   all at n = 50257; the proven worst case, n / 16 u, is far looser), so sqrt(n) / 2 u;
//   then the output's rounding to T (2^-8 bf16, 2^-11 f16; fp32's is counted above).
template <class T>
double forward_tol(double y_ref, double z, double m, index_t n) {
  double const rel = (std::fabs(z) + std::fabs(m) + std::fabs(z - m) + 8.0 + std::sqrt(double(n)) / 2) * u32 +
                     (std::is_same_v<T, float> ? 0.0 : double(tide::unit_roundoff<T>));
  return y_ref * rel + abs_floor<T>;
}

// Checks out against the reference row by row; masked columns (j >= valid) must be exactly 0.
template <class T, class Valid>
void check_forward(std::vector<T> const& out, std::vector<float> const& expect, std::vector<T> const& inp, index_t rows,
                   index_t cols, float scale, Valid valid) {
  int bad = 0;
  for (index_t r = 0; r < rows; ++r) {
    index_t const n = valid(r);
    double m = -std::numeric_limits<double>::infinity();
    for (index_t j = 0; j < n; ++j) m = std::fmax(m, double(scale) * tide::to_float(inp[std::size_t(r * cols + j)]));
    for (index_t j = 0; j < cols; ++j) {
      auto const i = std::size_t(r * cols + j);
      double const y = tide::to_float(out[i]);
      if (j >= n) {
        if (y != 0.0 && ++bad < 5) FAIL_CHECK("masked column not 0: row ", r, " col ", j, " = ", y);
        continue;
      }
      double const yr = tide::to_float(expect[i]);
      double const z = double(scale) * tide::to_float(inp[i]);
      double const tol = forward_tol<T>(yr, z, m, n);
      if (!(std::fabs(y - yr) <= tol) && ++bad < 5)
        FAIL_CHECK("row ", r, " col ", j, ": got ", y, " expected ", yr, " tol ", tol);
    }
  }
  CHECK(bad == 0);
}

// Sum of each row in double: 1 within the elements' own errors (each <= ~30 u relative for
// fp32, see forward_tol, so their sum <= 32 u + sqrt(n) / 2 u) and the output rounding (each
// element u_T relative: at most u_T in all), or exactly 0 for an empty row.
template <class T, class Valid>
void check_rows_sum_to_one(std::vector<T> const& out, index_t rows, index_t cols, Valid valid) {
  for (index_t r = 0; r < rows; ++r) {
    double s = 0;
    for (index_t j = 0; j < cols; ++j) s += tide::to_float(out[std::size_t(r * cols + j)]);
    double const tol =
        (std::is_same_v<T, float> ? 0.0 : double(tide::unit_roundoff<T>)) + (32.0 + std::sqrt(double(cols)) / 2) * u32;
    if (valid(r) == 0)
      CHECK(s == 0.0);
    else
      CHECK(std::fabs(s - 1.0) <= tol);
  }
}

double ulp_error(float y, double exact) {
  int e = 0;
  std::frexp(exact, &e);
  return std::fabs(double(y) - exact) / std::ldexp(1.0, e - 24);
}

}  // namespace

TEST_CASE("exp_poly: within 1.02 ulp of e^x over a sweep of the normal range, and its edges") {
  using k::detail::exp_poly;
  using range = k::detail::exp_poly_range;
  // Every float in [min_normal, max_finite] by bit pattern, 2^20 evenly spaced patterns on each
  // side of 0 (the sweep over every float, done once offline, gave 1.011 ulp with FMA and 0.991
  // without: exp.hpp).
  double worst = 0;
  float worst_x = 0;
  auto sweep = [&](float from, float to) {
    std::uint32_t const a = std::bit_cast<std::uint32_t>(from), b = std::bit_cast<std::uint32_t>(to);
    std::uint32_t const lo = std::min(a, b), hi = std::max(a, b);
    std::uint32_t const step = std::max<std::uint32_t>(1, (hi - lo) >> 20);
    for (std::uint64_t bits = lo; bits <= hi; bits += step) {
      float const x = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
      double const err = ulp_error(exp_poly(x), std::exp(double(x)));
      if (err > worst) worst = err, worst_x = x;
    }
  };
  sweep(0.f, range::max_finite);
  sweep(-0.f, range::min_normal);
  INFO("worst at x = ", worst_x);
  CHECK(worst < 1.02);
  CHECK(worst > 0.3);  // the sweep did compare something

  CHECK(exp_poly(0.f) == 1.f);
  CHECK(exp_poly(-0.f) == 1.f);
  CHECK(std::isfinite(exp_poly(range::max_finite)));
  CHECK(exp_poly(range::max_finite) > 3.4e38f);
  CHECK(exp_poly(std::nextafter(range::max_finite, 100.f)) == std::numeric_limits<float>::infinity());
  CHECK(exp_poly(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(exp_poly(range::min_normal) >= std::numeric_limits<float>::min());
  CHECK(exp_poly(std::nextafter(range::min_normal, -200.f)) == 0.f);  // flushed, < 2^-126
  CHECK(exp_poly(-1000.f) == 0.f);
  CHECK(exp_poly(-std::numeric_limits<float>::infinity()) == 0.f);
  CHECK(std::isnan(exp_poly(std::numeric_limits<float>::quiet_NaN())));
  // Near the overflow edge the 2^127 * 2 path is taken: still accurate.
  CHECK(ulp_error(exp_poly(88.5f), std::exp(88.5)) < 1.02);
  CHECK(ulp_error(exp_poly(-87.f), std::exp(-87.0)) < 1.02);
}

TEST_CASE("pick: c ? a : b on the bits, NaN payloads and signed zeros kept") {
  auto bits = [](float v) { return std::bit_cast<std::uint32_t>(v); };
  float const nan = std::bit_cast<float>(0x7fc01234u);
  CHECK(bits(k::detail::pick(true, -0.f, 1.f)) == bits(-0.f));
  CHECK(bits(k::detail::pick(false, -0.f, 0.f)) == bits(0.f));
  CHECK(bits(k::detail::pick(true, nan, 2.f)) == 0x7fc01234u);
  CHECK(bits(k::detail::pick(false, nan, -2.f)) == bits(-2.f));
  CHECK(k::detail::pick(true, std::numeric_limits<float>::infinity(), 0.f) == std::numeric_limits<float>::infinity());
}

TEST_CASE("exp_poly_nonpositive: exp_poly's bits on [-87.3365, 0], tiny or 0 below") {
  using k::detail::exp_poly;
  using k::detail::exp_poly_nonpositive;
  using range = k::detail::exp_poly_range;
  std::uint32_t const hi = std::bit_cast<std::uint32_t>(range::min_normal);
  int differ = 0;
  for (std::uint64_t bits = 0x80000000u; bits <= hi; bits += 997) {  // every 997th float of [-87.3, -0]
    float const x = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (std::bit_cast<std::uint32_t>(exp_poly_nonpositive(x)) != std::bit_cast<std::uint32_t>(exp_poly(x))) ++differ;
  }
  CHECK(differ == 0);
  CHECK(exp_poly_nonpositive(0.f) == 1.f);
  // Below the normal range: a subnormal or 0, never more than 2^-126, never negative.
  for (float x = std::nextafter(range::min_normal, -200.f); x > -120.f; x -= 0.0137f) {
    float const y = exp_poly_nonpositive(x);
    REQUIRE(y >= 0.f);
    REQUIRE(y <= std::numeric_limits<float>::min());
  }
  CHECK(exp_poly_nonpositive(-88.1f) == 0.f);
  CHECK(exp_poly_nonpositive(-1e30f) == 0.f);
  CHECK(exp_poly_nonpositive(-std::numeric_limits<float>::infinity()) == 0.f);
  CHECK(std::isnan(exp_poly_nonpositive(std::numeric_limits<float>::quiet_NaN())));
  CHECK(ulp_error(exp_poly_nonpositive(5.f), std::exp(5.0)) < 1.02);  // positive arguments up to 88.37 still work
}

TEST_CASE_TEMPLATE("softmax_forward matches the double reference on odd sizes", T, float, bf16, f16) {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  unsigned seed = 1;
  // L not a multiple of the 16 lanes, below and across a 1024-column tile, and GPT-2's vocab.
  for (index_t cols : {1, 3, 16, 17, 63, 257, 773, 1024 + 17, 50257}) {
    index_t const rows = cols > 2000 ? 1 : 5;
    for (float scale : {1.f, 0.125f, -2.f}) {
      CAPTURE(cols);
      CAPTURE(scale);
      auto const x = random_values<T>(std::size_t(rows * cols), 3.f, seed++);
      auto const xf = to_floats(x);
      std::vector<T> y(x.size());
      std::vector<float> expect(x.size());
      k::softmax_forward(ex, tensor_view<T>{y.data(), {rows, cols}}, tensor_view<T const>{x.data(), {rows, cols}},
                         scale);
      ref::softmax_forward(tensor_view<float>{expect.data(), {rows, cols}},
                           tensor_view<float const>{xf.data(), {rows, cols}}, scale);
      auto const all = [cols](index_t) { return cols; };
      check_forward(y, expect, x, rows, cols, scale, all);
      check_rows_sum_to_one(y, rows, cols, all);
    }
  }
}

TEST_CASE("softmax_forward: any rank, large logits, in place equals out of place") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  index_t const b = 2, h = 3, l = 41;
  auto x = random_values<float>(std::size_t(b * h * l), 30.f, 7);  // spread of e^+-90: the max shift matters
  std::vector<float> y(x.size()), expect(x.size());
  k::softmax_forward(ex, tensor_view<float>{y.data(), {b, h, l}}, tensor_view<float const>{x.data(), {b, h, l}});
  ref::softmax_forward(tensor_view<float>{expect.data(), {b * h, l}}, tensor_view<float const>{x.data(), {b * h, l}});
  check_forward(y, expect, x, b * h, l, 1.f, [l](index_t) { return l; });
  k::softmax_forward(ex, tensor_view<float>{x.data(), {b, h, l}}, tensor_view<float const>{x.data(), {b, h, l}});
  CHECK(same_bits(x, y));
}

TEST_CASE_TEMPLATE("softmax_forward_causal: zeros above the diagonal, reference below", T, float, bf16) {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  index_t const b = 2, nh = 3, t = 17;
  auto const x = random_values<T>(std::size_t(b * nh * t * t), 2.f, 11);
  auto const xf = to_floats(x);
  std::vector<T> y(x.size(), tide::from_float<T>(42.f));
  std::vector<float> expect(x.size());
  float const scale = 0.25f;
  k::softmax_forward_causal(ex, tensor_view<T>{y.data(), {b, nh, t, t}}, tensor_view<T const>{x.data(), {b, nh, t, t}},
                            scale);
  ref::softmax_forward_causal(tensor_view<float>{expect.data(), {b, nh, t, t}},
                              tensor_view<float const>{xf.data(), {b, nh, t, t}}, scale);
  auto const causal = [t](index_t r) { return r % t + 1; };
  check_forward(y, expect, x, b * nh * t, t, scale, causal);  // includes: masked columns are exactly 0
  check_rows_sum_to_one(y, b * nh * t, t, causal);
  // Row 0 of every block attends to column 0 only.
  for (index_t blk = 0; blk < b * nh; ++blk) CHECK(tide::to_float(y[std::size_t(blk * t * t)]) == 1.f);
}

TEST_CASE("softmax_forward_masked: one length per row, and one per group of rows") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  index_t const rows = 6, cols = 37;
  auto const x = random_values<float>(std::size_t(rows * cols), 2.f, 13);
  SUBCASE("per row, including 0 and L") {
    std::vector<std::int32_t> len{0, 1, 5, 16, 36, 37};
    std::vector<float> y(x.size(), 42.f), expect(x.size());
    tensor_view<std::int32_t const> lv{len.data(), {rows}};
    k::softmax_forward_masked(ex, tensor_view<float>{y.data(), {rows, cols}},
                              tensor_view<float const>{x.data(), {rows, cols}}, lv);
    ref::softmax_forward_masked(tensor_view<float>{expect.data(), {rows, cols}},
                                tensor_view<float const>{x.data(), {rows, cols}}, lv);
    auto const valid = [&](index_t r) { return index_t{len[std::size_t(r)]}; };
    check_forward(y, expect, x, rows, cols, 1.f, valid);
    check_rows_sum_to_one(y, rows, cols, valid);
  }
  SUBCASE("per group: (B, NH, T, T) scores with a key length per sequence") {
    index_t const b = 2, nh = 2, t = 9;
    auto const s = random_values<float>(std::size_t(b * nh * t * t), 2.f, 17);
    std::vector<std::int32_t> len{4, 9};
    std::vector<float> y(s.size()), expect(s.size());
    tensor_view<std::int32_t const> lv{len.data(), {b}};
    k::softmax_forward_masked(ex, tensor_view<float>{y.data(), {b, nh, t, t}},
                              tensor_view<float const>{s.data(), {b, nh, t, t}}, lv);
    ref::softmax_forward_masked(tensor_view<float>{expect.data(), {b, nh, t, t}},
                                tensor_view<float const>{s.data(), {b, nh, t, t}}, lv);
    auto const valid = [&](index_t r) { return index_t{len[std::size_t(r / (nh * t))]}; };
    check_forward(y, expect, s, b * nh * t, t, 1.f, valid);
    check_rows_sum_to_one(y, b * nh * t, t, valid);
  }
}

TEST_CASE_TEMPLATE("softmax_backward matches the double reference, also in place", T, float, bf16) {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  for (index_t cols : {1, 17, 63, 1024 + 17}) {
    CAPTURE(cols);
    index_t const rows = 4;
    float const scale = 0.5f;
    auto const x = random_values<T>(std::size_t(rows * cols), 2.f, unsigned(cols));
    auto dy = random_values<T>(std::size_t(rows * cols), 1.f, unsigned(cols) + 100);
    std::vector<T> y(x.size()), dx(x.size());
    std::vector<float> expect(x.size());
    k::softmax_forward(ex, tensor_view<T>{y.data(), {rows, cols}}, tensor_view<T const>{x.data(), {rows, cols}});
    k::softmax_backward(ex, tensor_view<T>{dx.data(), {rows, cols}}, tensor_view<T const>{y.data(), {rows, cols}},
                        tensor_view<T const>{dy.data(), {rows, cols}}, scale);
    auto const yf = to_floats(y), dyf = to_floats(dy);
    ref::softmax_backward(tensor_view<float>{expect.data(), {rows, cols}},
                          tensor_view<float const>{yf.data(), {rows, cols}},
                          tensor_view<float const>{dyf.data(), {rows, cols}}, scale);
    // |dx - ref| <= |scale| |y| (2u (|dy| + |dot|) + sqrt(L) u sum|y dy|) + 2u |ref|, plus the
    // output rounding u_T |ref| for 16-bit types (inputs are exact in float).
    int bad = 0;
    for (index_t r = 0; r < rows; ++r) {
      double dot = 0, dot_abs = 0;
      for (index_t j = 0; j < cols; ++j) {
        auto const i = std::size_t(r * cols + j);
        dot += double(tide::to_float(y[i])) * tide::to_float(dy[i]);
        dot_abs += std::fabs(double(tide::to_float(y[i])) * tide::to_float(dy[i]));
      }
      for (index_t j = 0; j < cols; ++j) {
        auto const i = std::size_t(r * cols + j);
        double const yi = tide::to_float(y[i]), dyi = tide::to_float(dy[i]), e = tide::to_float(expect[i]);
        double const tol =
            std::fabs(scale) * yi *
                (2 * u32 * (std::fabs(dyi) + std::fabs(dot)) + std::sqrt(double(cols)) * u32 * dot_abs) +
            std::fabs(e) * (2 * u32 + (std::is_same_v<T, float> ? 0.0 : double(tide::unit_roundoff<T>))) + 1e-30;
        if (!(std::fabs(tide::to_float(dx[i]) - e) <= tol) && ++bad < 5)
          FAIL_CHECK("row ", r, " col ", j, ": got ", tide::to_float(dx[i]), " expected ", e);
      }
    }
    CHECK(bad == 0);
    // In place: dinp over dout gives the same bits.
    k::softmax_backward(ex, tensor_view<T>{dy.data(), {rows, cols}}, tensor_view<T const>{y.data(), {rows, cols}},
                        tensor_view<T const>{dy.data(), {rows, cols}}, scale);
    CHECK(same_bits(dy, dx));
  }
}

TEST_CASE("softmax: bit-identical results on 1, 2 and 3 threads") {
  index_t const rows = 37, cols = 1500, t = 50;
  auto const x = random_values<float>(std::size_t(rows * cols), 4.f, 23);
  auto const dy = random_values<float>(std::size_t(rows * cols), 1.f, 24);
  auto const s = random_values<bf16>(std::size_t(3 * t * t), 2.f, 25);
  std::vector<std::int32_t> len(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r) len[std::size_t(r)] = std::int32_t(r * 41 % cols);
  std::vector<float> y[3], ym[3], dx[3];
  std::vector<bf16> yc[3];
  for (int threads = 1; threads <= 3; ++threads) {
    tide::thread_pool pool{threads};
    tide::exec<tide::host> ex{pool};
    auto const i = std::size_t(threads - 1);
    y[i].resize(x.size());
    ym[i].resize(x.size());
    dx[i].resize(x.size());
    yc[i].resize(s.size());
    tensor_view<float const> in{x.data(), {rows, cols}};
    k::softmax_forward(ex, tensor_view<float>{y[i].data(), {rows, cols}}, in, 0.7f);
    k::softmax_forward_masked(ex, tensor_view<float>{ym[i].data(), {rows, cols}}, in,
                              tensor_view<std::int32_t const>{len.data(), {rows}});
    k::softmax_forward_causal(ex, tensor_view<bf16>{yc[i].data(), {1, 3, t, t}},
                              tensor_view<bf16 const>{s.data(), {1, 3, t, t}}, 0.3f);
    k::softmax_backward(ex, tensor_view<float>{dx[i].data(), {rows, cols}},
                        tensor_view<float const>{y[i].data(), {rows, cols}},
                        tensor_view<float const>{dy.data(), {rows, cols}}, 0.7f);
  }
  for (std::size_t i = 1; i < 3; ++i) {
    CAPTURE(i + 1);
    CHECK(same_bits(y[0], y[i]));
    CHECK(same_bits(ym[0], ym[i]));
    CHECK(same_bits(yc[0], yc[i]));
    CHECK(same_bits(dx[0], dx[i]));
  }
}

TEST_CASE("softmax: bad calls throw tide::error(usage) and write nothing") {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  std::vector<float> x(24, 1.f), y(24, 7.f);
  auto const untouched = y;
  auto usage = [](auto&& f) {
    try {
      f();
    } catch (tide::error const& e) {
      return e.category() == tide::errc::usage;
    }
    return false;
  };
  // Shapes differ.
  CHECK(usage([&] {
    k::softmax_forward(ex, tensor_view<float>{y.data(), {4, 6}}, tensor_view<float const>{x.data(), {6, 4}});
  }));
  // Strided input.
  CHECK(usage([&] {
    k::softmax_forward(ex, tensor_view<float>{y.data(), {4, 3}},
                       tensor_view<float const>{x.data(), {4, 3}, {6, 1, 1, 1}});
  }));
  // Partial overlap.
  CHECK(usage([&] {
    k::softmax_forward(ex, tensor_view<float>{x.data() + 1, {2, 6}}, tensor_view<float const>{x.data(), {2, 6}});
  }));
  // Causal needs square trailing dimensions.
  CHECK(usage([&] {
    k::softmax_forward_causal(ex, tensor_view<float>{y.data(), {4, 6}}, tensor_view<float const>{x.data(), {4, 6}});
  }));
  CHECK(usage([&] {
    k::softmax_forward_causal(ex, tensor_view<float>{y.data(), {24}}, tensor_view<float const>{x.data(), {24}});
  }));
  // Lengths: G must divide R; each in [0, L].
  std::vector<std::int32_t> len{1, 2, 3};
  CHECK(usage([&] {
    k::softmax_forward_masked(ex, tensor_view<float>{y.data(), {4, 6}}, tensor_view<float const>{x.data(), {4, 6}},
                              tensor_view<std::int32_t const>{len.data(), {3}});
  }));
  len = {1, 7};
  CHECK(usage([&] {
    k::softmax_forward_masked(ex, tensor_view<float>{y.data(), {4, 6}}, tensor_view<float const>{x.data(), {4, 6}},
                              tensor_view<std::int32_t const>{len.data(), {2}});
  }));
  len = {-1, 2};
  CHECK(usage([&] {
    k::softmax_forward_masked(ex, tensor_view<float>{y.data(), {4, 6}}, tensor_view<float const>{x.data(), {4, 6}},
                              tensor_view<std::int32_t const>{len.data(), {2}});
  }));
  // Backward: all three shapes must agree.
  CHECK(usage([&] {
    k::softmax_backward(ex, tensor_view<float>{y.data(), {4, 6}}, tensor_view<float const>{x.data(), {4, 6}},
                        tensor_view<float const>{x.data(), {3, 8}});
  }));
  CHECK(same_bits(y, untouched));
}
