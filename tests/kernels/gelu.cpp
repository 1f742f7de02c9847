// tide::kernels GELU (tanh form): the shared float math against the tanh form in double over
// every float in [-12, 12), the reference's derivative against central finite differences,
// the host kernels against the reference for float, bf16 and f16 (in place too), bias + GELU
// with dbias bit-identical for 1, 2 and 3 threads, and bad arguments.

#include <doctest/doctest.h>

#include "support/kernel_checks.hpp"

#include <tide/kernels/gelu/gelu.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using tide::test::same_bits;
using tide::test::usage_error;
using tide::test::view;

using tide::bf16;
using tide::f16;
using tide::index_t;
using tide::tensor_view;
namespace tk = tide::kernels;
namespace ref = tide::kernels::reference;

constexpr double u32 = 0x1p-24;

template <class T>
double to_d(T x) {
  return static_cast<double>(tide::to_float(x));
}

template <class T>
std::vector<T> random_vector(std::size_t n, std::mt19937& gen, double sd) {
  std::normal_distribution<double> dist(0.0, sd);
  std::vector<T> v(n);
  for (auto& x : v) x = tide::from_float<T>(static_cast<float>(dist(gen)));
  return v;
}



// One rounding to T beyond the float result: the two sides round separately and may land one
// ulp of T apart (2u of T, relative). 0 for float.
template <class T>
double rounding_of() {
  if constexpr (std::is_same_v<T, float>) return 0.0;
  else return 2.0 * static_cast<double>(tide::unit_roundoff<T>);
}

// Float error of gelu_tanh(x) against the tanh form: the exp (<= 1.02 ulp), the divide and the
// rounding of u, whose error e^-2|u| amplifies by |2u| in the negative tail, where gelu(x) itself
// is tiny: so the bound is relative to |x|, not to |gelu(x)|. Measured 2.6 u |x|; allowed 4 u |x|.
double forward_tol(double x) { return 4.0 * u32 * std::abs(x); }
// gelu'(x) is within [-0.17, 1.13]; measured 4.1 u absolute, allowed 8 u.
constexpr double grad_tol = 8.0 * u32;


constexpr index_t sizes[] = {1, 3, 17, 63, 773, 32768 + 7};

template <class T>
void check_elementwise(std::mt19937& gen) {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  for (index_t n : sizes) {
    CAPTURE(n);
    auto const un = static_cast<std::size_t>(n);
    auto x = random_vector<T>(un, gen, 3.0);
    auto g = random_vector<T>(un, gen, 1.0);
    std::vector<T> y(un), y_ref(un), dx(un), dx_ref(un);
    tk::gelu_forward(ex, view(y, {n}), view(x, {n}));
    ref::gelu_forward(view(y_ref, {n}), view(x, {n}));
    tk::gelu_backward(ex, view(dx, {n}), view(x, {n}), view(g, {n}));
    ref::gelu_backward(view(dx_ref, {n}), view(x, {n}), view(g, {n}));
    bool forward_ok = true, backward_ok = true;
    for (std::size_t i = 0; i < un; ++i) {
      double const xi = to_d(x[i]);
      forward_ok &= std::abs(to_d(y[i]) - to_d(y_ref[i])) <= forward_tol(xi) + rounding_of<T>() * std::abs(to_d(y_ref[i]));
      // dinp = gelu'(x) dout: the grad's error times |dout|, plus the product's rounding.
      backward_ok &= std::abs(to_d(dx[i]) - to_d(dx_ref[i])) <=
                     grad_tol * std::abs(to_d(g[i])) + (u32 + rounding_of<T>()) * std::abs(to_d(dx_ref[i]));
    }
    CHECK(forward_ok);
    CHECK(backward_ok);
    // In place: out over inp, dinp over dout.
    auto x2 = x;
    tk::gelu_forward(ex, view(x2, {n}), view(x2, {n}));
    CHECK(same_bits(x2, y));
    auto g2 = g;
    tk::gelu_backward(ex, view(g2, {n}), view(x, {n}), view(g2, {n}));
    CHECK(same_bits(g2, dx));
  }
}

template <class T, class W>
void check_bias_gelu(index_t N, index_t C, std::mt19937& gen) {
  CAPTURE(N);
  CAPTURE(C);
  auto const nc = static_cast<std::size_t>(N * C), cc = static_cast<std::size_t>(C);
  auto x = random_vector<T>(nc, gen, 2.0);
  auto g = random_vector<T>(nc, gen, 1.0);
  auto bias = random_vector<W>(cc, gen, 1.0);
  auto const db0 = random_vector<W>(cc, gen, 0.1);
  std::vector<T> y(nc), y_ref(nc), dx(nc), dx_ref(nc);
  auto db = db0, db_ref = db0;
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tk::bias_gelu_forward(ex, view(y, {N, C}), view(x, {N, C}), view(bias, {C}));
  ref::bias_gelu_forward(view(y_ref, {N, C}), view(x, {N, C}), view(bias, {C}));
  tk::bias_gelu_backward(ex, view(dx, {N, C}), view(db, {C}), view(x, {N, C}), view(bias, {C}), view(g, {N, C}));
  ref::bias_gelu_backward(view(dx_ref, {N, C}), view(db_ref, {C}), view(x, {N, C}), view(bias, {C}), view(g, {N, C}));
  bool forward_ok = true, backward_ok = true;
  std::vector<double> sum_abs(cc, 0.0);
  for (std::size_t i = 0; i < nc; ++i) {
    double const xi = to_d(x[i]) + to_d(bias[i % cc]);
    // x + bias is formed in float: one more rounding of the argument, |x + b| u relative, which
    // moves gelu by at most 1.13 |x + b| u.
    forward_ok &= std::abs(to_d(y[i]) - to_d(y_ref[i])) <=
                  forward_tol(xi) + 1.2 * u32 * std::abs(xi) + rounding_of<T>() * std::abs(to_d(y_ref[i]));
    backward_ok &= std::abs(to_d(dx[i]) - to_d(dx_ref[i])) <=
                   (grad_tol + 1.2 * u32 * std::abs(xi)) * std::abs(to_d(g[i])) +
                       (u32 + rounding_of<T>()) * std::abs(to_d(dx_ref[i]));
    sum_abs[i % cc] += std::abs(to_d(dx_ref[i]));
  }
  CHECK(forward_ok);
  CHECK(backward_ok);
  // dbias: a sum over N rows (any order errs by (N - 1) u sum |terms|) of terms each off by
  // the backward's error (bounded loosely by 8 u |term| + grad_tol-sized absolute terms).
  for (std::size_t c = 0; c < cc; ++c) {
    double const tol = (static_cast<double>(N) + 8.0) * u32 * sum_abs[c] + grad_tol * static_cast<double>(N) +
                       2 * u32 * std::abs(to_d(db0[c])) + rounding_of<W>() * std::abs(to_d(db_ref[c]));
    CHECK(std::abs(to_d(db[c]) - to_d(db_ref[c])) <= tol);
  }
}

}  // namespace

TEST_CASE("gelu_tanh, gelu_tanh_grad: floats in [-12, 12] against the tanh form in double") {
  // Every 251st float by bit pattern from 1e-4 to 12, both signs (1.1M points; the whole range,
  // every float, was measured once for docs/kernels/gelu.md with the same bounds).
  double worst_forward = 0.0, worst_grad = 0.0;
  long count = 0;
  std::uint32_t const lo = std::bit_cast<std::uint32_t>(1e-4f), hi = std::bit_cast<std::uint32_t>(12.0f);
  for (std::uint32_t b = lo; b <= hi; b += 251) {
    for (float const x : {std::bit_cast<float>(b), -std::bit_cast<float>(b)}) {
      double const xd = x;
      double const ef = std::abs(static_cast<double>(tk::gelu_tanh(x)) - ref::gelu_tanh(xd));
      double const eg = std::abs(static_cast<double>(tk::gelu_tanh_grad(x)) - ref::gelu_tanh_grad(xd));
      worst_forward = std::max(worst_forward, ef / forward_tol(xd));
      worst_grad = std::max(worst_grad, eg / grad_tol);
      ++count;
    }
  }
  CHECK(count > 1'000'000);
  CHECK(worst_forward <= 1.0);
  CHECK(worst_grad <= 1.0);
  // Values and limits: gelu(0) = 0, gelu'(0) = 1/2, gelu(x) -> x, 0 in the tails; NaN stays NaN.
  CHECK(tk::gelu_tanh(0.0f) == 0.0f);
  CHECK(tk::gelu_tanh_grad(0.0f) == 0.5f);
  CHECK(tk::gelu_tanh(30.0f) == 30.0f);
  CHECK(tk::gelu_tanh_grad(30.0f) == 1.0f);
  CHECK(std::abs(tk::gelu_tanh(-30.0f)) < 1e-30f);
  CHECK(std::abs(tk::gelu_tanh_grad(-30.0f)) < 1e-30f);
  CHECK(std::isnan(tk::gelu_tanh(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(tk::gelu_tanh_grad(std::numeric_limits<float>::quiet_NaN())));
  CHECK(tk::gelu_tanh(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
}

TEST_CASE("gelu reference: the derivative matches central finite differences (double)") {
  // h = 1e-5: truncation h^2 |gelu'''| < 1e-9, roundoff 1e-16 |x| / h < 1e-10.
  double const h = 1e-5;
  for (double x = -6.0; x <= 6.0; x += 0.0625) {
    CAPTURE(x);
    double const fd = (ref::gelu_tanh(x + h) - ref::gelu_tanh(x - h)) / (2 * h);
    CHECK(ref::gelu_tanh_grad(x) == doctest::Approx(fd).epsilon(1e-8).scale(1.0));
  }
  // Through the tensor entries too: bias_gelu_backward's dbias is d/dbias of sum(out * g).
  std::mt19937 gen(5);
  index_t const N = 3, C = 4;
  std::vector<double> x(12), g(12), bias(4), out(12), dx(12), db(4, 0.0);
  std::normal_distribution<double> dist;
  for (auto* v : {&x, &g, &bias})
    for (auto& e : *v) e = dist(gen);
  ref::bias_gelu_backward(view(dx, {N, C}), view(db, {C}), view(x, {N, C}), view(bias, {C}), view(g, {N, C}));
  auto loss = [&] {
    ref::bias_gelu_forward(view(out, {N, C}), view(x, {N, C}), view(bias, {C}));
    double l = 0;
    for (std::size_t i = 0; i < 12; ++i) l += out[i] * g[i];
    return l;
  };
  auto fd = [&](double& v) {
    double const keep = v;
    v = keep + h;
    double const up = loss();
    v = keep - h;
    double const down = loss();
    v = keep;
    return (up - down) / (2 * h);
  };
  for (std::size_t i = 0; i < 12; ++i) CHECK(dx[i] == doctest::Approx(fd(x[i])).epsilon(1e-7).scale(1.0));
  for (std::size_t c = 0; c < 4; ++c) CHECK(db[c] == doctest::Approx(fd(bias[c])).epsilon(1e-7).scale(1.0));
}

TEST_CASE("gelu_forward, gelu_backward: host matches the reference, float, bf16, f16, in place") {
  std::mt19937 gen(7);
  check_elementwise<float>(gen);
  check_elementwise<bf16>(gen);
  check_elementwise<f16>(gen);
}

TEST_CASE("bias_gelu_forward, bias_gelu_backward: host matches the reference") {
  std::mt19937 gen(9);
  for (index_t C : {1, 3, 17, 63, 773}) {
    check_bias_gelu<float, float>(5, C, gen);
    check_bias_gelu<bf16, float>(5, C, gen);
    check_bias_gelu<bf16, bf16>(3, C, gen);
  }
  check_bias_gelu<float, float>(200, 63, gen);  // several chunks of 64 rows
  check_bias_gelu<f16, float>(4, 17, gen);
}

TEST_CASE("bias_gelu: results bit-identical for 1, 2 and 3 threads; in place") {
  std::mt19937 gen(10);
  index_t const N = 300, C = 773;
  auto const nc = static_cast<std::size_t>(N * C);
  auto x = random_vector<float>(nc, gen, 2.0);
  auto g = random_vector<float>(nc, gen, 1.0);
  auto bias = random_vector<float>(static_cast<std::size_t>(C), gen, 1.0);
  auto run = [&](int threads) {
    tide::thread_pool pool{threads};
    tide::exec<tide::host> ex{pool};
    std::vector<float> y(nc), dx(nc), db(static_cast<std::size_t>(C), 0.5f);
    tk::bias_gelu_forward(ex, view(y, {N, C}), view(x, {N, C}), view(bias, {C}));
    tk::bias_gelu_backward(ex, view(dx, {N, C}), view(db, {C}), view(x, {N, C}), view(bias, {C}), view(g, {N, C}));
    return std::tuple{y, dx, db};
  };
  auto const [y1, dx1, db1] = run(1);
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    auto const [y, dx, db] = run(threads);
    CHECK(same_bits(y, y1));
    CHECK(same_bits(dx, dx1));
    CHECK(same_bits(db, db1));
  }
  // In place: out over inp, and dinp over dout.
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  auto x2 = x;
  tk::bias_gelu_forward(ex, view(x2, {N, C}), view(x2, {N, C}), view(bias, {C}));
  CHECK(same_bits(x2, y1));
  auto g2 = g;
  std::vector<float> db(static_cast<std::size_t>(C), 0.5f);
  tk::bias_gelu_backward(ex, view(g2, {N, C}), view(db, {C}), view(x, {N, C}), view(bias, {C}), view(g2, {N, C}));
  CHECK(same_bits(g2, dx1));
  CHECK(same_bits(db, db1));
}

TEST_CASE("gelu: bad arguments throw tide::error(usage) and write nothing") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  std::vector<float> x(12, 1.0f), out(12, -7.0f), g(12, 1.0f), bias(4, 0.0f), bias3(3, 0.0f), db(4, -7.0f);
  std::vector<float> const untouched(12, -7.0f);
  auto msg = usage_error([&] { tk::gelu_forward(ex, view(out, {4, 3}), view(x, {3, 4})); });
  CHECK(msg.find("out") != std::string::npos);
  msg = usage_error([&] { tk::gelu_backward(ex, view(out, {12}), view(x, {12}), view(g, {3, 4})); });
  CHECK(msg.find("dout") != std::string::npos);
  msg = usage_error([&] { tk::bias_gelu_forward(ex, view(out, {3, 4}), view(x, {3, 4}), view(bias3, {3})); });
  CHECK(msg.find("bias") != std::string::npos);
  CHECK(msg.find("(4)") != std::string::npos);
  msg = usage_error([&] {
    tk::bias_gelu_backward(ex, view(out, {3, 4}), view(bias, {4}), view(x, {3, 4}), view(bias, {4}), view(g, {3, 4}));
  });  // dbias over bias
  CHECK(msg.find("overlaps") != std::string::npos);
  msg = usage_error([&] {
    tk::bias_gelu_backward(ex, tensor_view<float>(out.data(), {2, 4}), view(db, {4}),
                           tensor_view<float>(out.data() + 4, {2, 4}), view(bias, {4}), view(g, {3, 4}).slice(0, 2));
  });  // dinp partly over inp
  CHECK(msg.find("overlaps") != std::string::npos);
  CHECK(same_bits(out, untouched));
  CHECK(same_bits(db, std::vector<float>(4, -7.0f)));
}
