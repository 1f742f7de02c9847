// tide::kernels LayerNorm: host against the double reference (float, bf16, f16; widths that are
// not multiples of the vector width), the reference backward against central finite differences
// of the reference forward, bit-identical results for 1, 2 and 3 threads, the fused
// residual + LayerNorm against the two unfused calls, the backward's input and weight halves
// against the fused backward (bit for bit), and bad arguments.

#include <doctest/doctest.h>

#include "support/kernel_checks.hpp"

#include <tide/kernels/layernorm/layernorm.hpp>
#include <tide/kernels/residual/residual.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
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

constexpr double u32 = 0x1p-24;  // fp32 unit roundoff

template <class T>
double to_d(T x) {
  if constexpr (std::is_same_v<T, double>) return x;
  else return static_cast<double>(tide::to_float(x));
}

template <class T>
std::vector<T> random_vector(std::size_t n, std::mt19937& gen, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, double>) x = dist(gen);
    else x = tide::from_float<T>(static_cast<float>(dist(gen)));
  }
  return v;
}



// The rounding of one output to T, beyond the float computation: 0 for float; for bf16 and f16
// the two sides round separately and may land one ulp apart (2u of the type, relative).
template <class T>
double rounding_of() {
  if constexpr (std::is_same_v<T, float>) return 0.0;
  else return 2.0 * static_cast<double>(tide::unit_roundoff<T>);
}

// Relative float error of a value derived from row sums (mean, rstd, the backward's two means),
// carried into every output: the host sums C terms in 32 lanes of C / 32 terms, a random walk of
// about u sqrt(C / 32) < u sqrt(C) / 4; more than 8x headroom over that plus a few roundings of
// the per-element math. Measured: at most a tenth of this in the float tests below.
double row_sum_tolerance(index_t C) { return 8.0 * u32 * (1.0 + std::sqrt(static_cast<double>(C)) / 4.0); }


// One forward problem: inputs, the reference's outputs, the host's outputs.
template <class T, class W>
struct forward_case {
  index_t N, C;
  std::vector<T> x;
  std::vector<W> w, b;
  forward_case(index_t n, index_t c, std::mt19937& gen, double offset)
      : N(n),
        C(c),
        x(random_vector<T>(static_cast<std::size_t>(n * c), gen, offset - 2.0, offset + 2.0)),
        w(random_vector<W>(static_cast<std::size_t>(c), gen, -1.5, 1.5)),
        b(random_vector<W>(static_cast<std::size_t>(c), gen, -0.5, 0.5)) {}
  tensor_view<T const> inp() const { return {x.data(), {N, C}}; }
  tensor_view<W const> weight() const { return {w.data(), {C}}; }
  tensor_view<W const> bias() const { return {b.data(), {C}}; }
};

template <class T, class W>
void check_forward_against_reference(index_t N, index_t C, double offset, std::mt19937& gen) {
  CAPTURE(N);
  CAPTURE(C);
  forward_case<T, W> p(N, C, gen, offset);
  auto const nc = static_cast<std::size_t>(N * C), n = static_cast<std::size_t>(N);
  std::vector<T> out(nc), out_ref(nc);
  std::vector<float> mean(n), rstd(n);
  std::vector<double> mean_ref(n), rstd_ref(n);
  tide::thread_pool pool{2};
  tk::layernorm_forward(tide::exec<tide::host>{pool}, view(out, {N, C}), view(mean, {N}), view(rstd, {N}), p.inp(),
                        p.weight(), p.bias());
  ref::layernorm_forward(view(out_ref, {N, C}), view(mean_ref, {N}), view(rstd_ref, {N}), p.inp(), p.weight(),
                         p.bias());
  double const k = row_sum_tolerance(C);
  double worst = 0.0;
  for (index_t r = 0; r < N; ++r) {
    auto const rr = static_cast<std::size_t>(r);
    double const spread = 1.0 / rstd_ref[rr];  // the row's standard deviation (plus eps)
    CHECK(std::abs(mean[rr] - mean_ref[rr]) <= k * (std::abs(mean_ref[rr]) + spread));
    CHECK(std::abs(rstd[rr] - rstd_ref[rr]) <= k * rstd_ref[rr] * (1.0 + std::abs(mean_ref[rr]) / spread));
    for (index_t c = 0; c < C; ++c) {
      auto const i = static_cast<std::size_t>(r * C + c);
      double const xhat = (to_d(p.x[i]) - mean_ref[rr]) * rstd_ref[rr];
      double const scale = std::abs(to_d(p.w[static_cast<std::size_t>(c)])) *
                               (std::abs(xhat) + 1.0 + std::abs(mean_ref[rr]) / spread) +
                           std::abs(to_d(p.b[static_cast<std::size_t>(c)]));
      double const err = std::abs(to_d(out[i]) - to_d(out_ref[i]));
      double const tol = k * scale + rounding_of<T>() * std::abs(to_d(out_ref[i]));
      worst = std::max(worst, err / tol);
    }
  }
  CHECK(worst <= 1.0);
}

template <class T, class W>
struct backward_case {
  index_t N, C;
  forward_case<T, W> f;
  std::vector<T> dout, dinp0;
  std::vector<W> dw0, db0;
  std::vector<float> mean, rstd;
  backward_case(index_t n, index_t c, std::mt19937& gen)
      : N(n),
        C(c),
        f(n, c, gen, 0.5),
        dout(random_vector<T>(static_cast<std::size_t>(n * c), gen, -1.0, 1.0)),
        dinp0(random_vector<T>(static_cast<std::size_t>(n * c), gen, -0.1, 0.1)),
        dw0(random_vector<W>(static_cast<std::size_t>(c), gen, -0.1, 0.1)),
        db0(random_vector<W>(static_cast<std::size_t>(c), gen, -0.1, 0.1)),
        mean(static_cast<std::size_t>(n)),
        rstd(static_cast<std::size_t>(n)) {
    std::vector<T> out(static_cast<std::size_t>(n * c));
    ref::layernorm_forward(view(out, {N, C}), view(mean, {N}), view(rstd, {N}), f.inp(), f.weight(), f.bias());
  }
  // Runs `run(dinp, dweight, dbias, dout, inp, weight, mean, rstd)` on copies of the
  // accumulators and returns them.
  template <class Run>
  std::tuple<std::vector<T>, std::vector<W>, std::vector<W>> run(Run&& run) const {
    std::vector<T> dinp = dinp0;
    std::vector<W> dw = dw0, db = db0;
    run(tensor_view<T>(dinp.data(), {N, C}), tensor_view<W>(dw.data(), {C}), tensor_view<W>(db.data(), {C}),
        tensor_view<T const>(dout.data(), {N, C}), f.inp(), f.weight(), tensor_view<float const>(mean.data(), {N}),
        tensor_view<float const>(rstd.data(), {N}));
    return {dinp, dw, db};
  }
};

template <class T, class W>
void check_backward_against_reference(index_t N, index_t C, std::mt19937& gen) {
  CAPTURE(N);
  CAPTURE(C);
  backward_case<T, W> p(N, C, gen);
  tide::thread_pool pool{2};
  auto const [dinp, dw, db] = p.run([&](auto... v) { tk::layernorm_backward(tide::exec<tide::host>{pool}, v...); });
  auto const [dinp_ref, dw_ref, db_ref] = p.run([](auto... v) { ref::layernorm_backward(v...); });
  double const k = row_sum_tolerance(C);
  std::vector<double> sum_abs_dw(static_cast<std::size_t>(C)), sum_abs_db(static_cast<std::size_t>(C));
  double worst = 0.0;
  for (index_t r = 0; r < N; ++r) {
    auto const rr = static_cast<std::size_t>(r);
    double const m = p.mean[rr], s = p.rstd[rr];
    double m1 = 0, m2 = 0, max_dnorm = 0;
    for (index_t c = 0; c < C; ++c) {
      auto const i = static_cast<std::size_t>(r * C + c);
      double const xhat = (to_d(p.f.x[i]) - m) * s;
      double const dnorm = to_d(p.f.w[static_cast<std::size_t>(c)]) * to_d(p.dout[i]);
      m1 += std::abs(dnorm);
      m2 += std::abs(dnorm * xhat);
      max_dnorm = std::max(max_dnorm, std::abs(dnorm));
      sum_abs_dw[static_cast<std::size_t>(c)] += std::abs(xhat * to_d(p.dout[i]));
      sum_abs_db[static_cast<std::size_t>(c)] += std::abs(to_d(p.dout[i]));
    }
    m1 /= static_cast<double>(C);
    m2 /= static_cast<double>(C);
    for (index_t c = 0; c < C; ++c) {
      auto const i = static_cast<std::size_t>(r * C + c);
      double const xhat = (to_d(p.f.x[i]) - m) * s;
      // rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)): each term's float error is about
      // u sqrt(C) of its size; plus the += onto the old value.
      double const scale = s * (std::abs(to_d(p.f.w[static_cast<std::size_t>(c)]) * to_d(p.dout[i])) + m1 +
                                std::abs(xhat) * m2 + max_dnorm);
      double const err = std::abs(to_d(dinp[i]) - to_d(dinp_ref[i]));
      double const tol = k * scale + 2 * u32 * std::abs(to_d(p.dinp0[i])) + rounding_of<T>() * std::abs(to_d(dinp_ref[i]));
      worst = std::max(worst, err / tol);
    }
  }
  CHECK(worst <= 1.0);
  // dweight, dbias: sums over N rows in any order err by at most (N - 1) u sum |terms|; each term
  // carries xhat's own error (k); the += and the rounding to W add theirs.
  for (index_t c = 0; c < C; ++c) {
    auto const cc = static_cast<std::size_t>(c);
    double const nu = static_cast<double>(N + 1) * u32;
    CHECK(std::abs(to_d(dw[cc]) - to_d(dw_ref[cc])) <=
          (nu + k) * sum_abs_dw[cc] + 2 * u32 * std::abs(to_d(p.dw0[cc])) + rounding_of<W>() * std::abs(to_d(dw_ref[cc])));
    CHECK(std::abs(to_d(db[cc]) - to_d(db_ref[cc])) <=
          nu * sum_abs_db[cc] + 2 * u32 * std::abs(to_d(p.db0[cc])) + rounding_of<W>() * std::abs(to_d(db_ref[cc])));
  }
}

constexpr index_t widths[] = {1, 3, 17, 63, 768 + 5};

}  // namespace

TEST_CASE("layernorm_forward: host matches the reference, float, widths not a multiple of the vector") {
  std::mt19937 gen(11);
  for (index_t C : widths) {
    check_forward_against_reference<float, float>(7, C, 0.0, gen);
    check_forward_against_reference<float, float>(3, C, 3.0, gen);  // a mean far from 0: two-pass matters
  }
}

TEST_CASE("layernorm_forward: host matches the reference, bf16 and f16 activations") {
  std::mt19937 gen(12);
  for (index_t C : widths) {
    check_forward_against_reference<bf16, float>(5, C, 0.5, gen);
    check_forward_against_reference<bf16, bf16>(5, C, 0.5, gen);
  }
  check_forward_against_reference<f16, float>(4, 63, 0.5, gen);
  check_forward_against_reference<f16, f16>(4, 773, 0.5, gen);
}

TEST_CASE("layernorm_forward: a constant row gives out = bias, rstd = 1/sqrt(eps)") {
  tide::thread_pool pool{1};
  std::vector<float> x(8, 2.5f), w(8, 3.0f), b{0, 1, 2, 3, 4, 5, 6, 7}, out(8), mean(1), rstd(1);
  tk::layernorm_forward(tide::exec<tide::host>{pool}, view(out, {1, 8}), view(mean, {1}), view(rstd, {1}),
                        view(x, {1, 8}), view(w, {8}), view(b, {8}));
  CHECK(mean[0] == 2.5f);
  CHECK(rstd[0] == doctest::Approx(1.0 / std::sqrt(1e-5)).epsilon(1e-6));
  for (std::size_t i = 0; i < 8; ++i) CHECK(out[i] == b[i]);
}

TEST_CASE("layernorm_forward: (B, T, C) views with (B, T) statistics") {
  std::mt19937 gen(13);
  forward_case<float, float> p(2 * 3, 17, gen, 0.0);
  std::vector<float> out(6 * 17), out2(6 * 17), mean(6), rstd(6), mean2(6), rstd2(6);
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tk::layernorm_forward(ex, view(out, {2, 3, 17}), view(mean, {2, 3}), view(rstd, {2, 3}),
                        tensor_view<float const>(p.x.data(), {2, 3, 17}), p.weight(), p.bias());
  tk::layernorm_forward(ex, view(out2, {6, 17}), view(mean2, {6}), view(rstd2, {6}), p.inp(), p.weight(), p.bias());
  CHECK(same_bits(out, out2));
  CHECK(same_bits(mean, mean2));
  CHECK(same_bits(rstd, rstd2));
}

TEST_CASE("layernorm_backward: host matches the reference, float, bf16, f16") {
  std::mt19937 gen(21);
  for (index_t C : widths) {
    check_backward_against_reference<float, float>(7, C, gen);
    check_backward_against_reference<bf16, float>(5, C, gen);
  }
  check_backward_against_reference<float, float>(150, 63, gen);  // several row chunks
  check_backward_against_reference<bf16, bf16>(70, 773, gen);
  check_backward_against_reference<f16, float>(9, 17, gen);
}

TEST_CASE("layernorm reference: backward matches central finite differences of the forward (double)") {
  std::mt19937 gen(31);
  for (index_t C : {1, 4, 7}) {
    CAPTURE(C);
    index_t const N = 3;
    auto const nc = static_cast<std::size_t>(N * C), cc = static_cast<std::size_t>(C);
    auto x = random_vector<double>(nc, gen, -1.0, 2.0);
    auto w = random_vector<double>(cc, gen, -1.5, 1.5);
    auto b = random_vector<double>(cc, gen, -0.5, 0.5);
    auto const g = random_vector<double>(nc, gen, -1.0, 1.0);  // dL/dout: L = sum(out * g)
    auto loss = [&] {
      std::vector<double> out(nc), mean(static_cast<std::size_t>(N)), rstd(static_cast<std::size_t>(N));
      ref::layernorm_forward(view(out, {N, C}), view(mean, {N}), view(rstd, {N}), view(x, {N, C}), view(w, {C}),
                             view(b, {C}));
      double l = 0;
      for (std::size_t i = 0; i < nc; ++i) l += out[i] * g[i];
      return l;
    };
    std::vector<double> out(nc), mean(static_cast<std::size_t>(N)), rstd(static_cast<std::size_t>(N));
    ref::layernorm_forward(view(out, {N, C}), view(mean, {N}), view(rstd, {N}), view(x, {N, C}), view(w, {C}),
                           view(b, {C}));
    std::vector<double> dx(nc, 0.0), dw(cc, 0.0), db(cc, 0.0);
    auto gv = g;
    ref::layernorm_backward(view(dx, {N, C}), view(dw, {C}), view(db, {C}), view(gv, {N, C}), view(x, {N, C}),
                            view(w, {C}), view(mean, {N}), view(rstd, {N}));
    // Central differences in double: truncation h^2 |f'''| and roundoff 1e-16 |L| / h, both far
    // below 1e-7 for h = 1e-5 at these magnitudes.
    double const h = 1e-5;
    auto fd = [&](double& v) {
      double const keep = v;
      v = keep + h;
      double const up = loss();
      v = keep - h;
      double const down = loss();
      v = keep;
      return (up - down) / (2 * h);
    };
    for (std::size_t i = 0; i < nc; ++i) CHECK(dx[i] == doctest::Approx(fd(x[i])).epsilon(1e-6).scale(1.0));
    for (std::size_t i = 0; i < cc; ++i) {
      CHECK(dw[i] == doctest::Approx(fd(w[i])).epsilon(1e-6).scale(1.0));
      CHECK(db[i] == doctest::Approx(fd(b[i])).epsilon(1e-6).scale(1.0));
    }
  }
}

TEST_CASE("layernorm: every output is bit-identical for 1, 2 and 3 threads") {
  std::mt19937 gen(41);
  index_t const N = 300, C = 773;  // several tasks of rows and several chunks of 64 rows
  auto check = [&]<class T, class W>(T*, W*) {
    backward_case<T, W> p(N, C, gen);
    auto forward = [&](int threads) {
      tide::thread_pool pool{threads};
      std::vector<T> out(static_cast<std::size_t>(N * C));
      std::vector<float> mean(static_cast<std::size_t>(N)), rstd(static_cast<std::size_t>(N));
      tk::layernorm_forward(tide::exec<tide::host>{pool}, view(out, {N, C}), view(mean, {N}), view(rstd, {N}),
                            p.f.inp(), p.f.weight(), p.f.bias());
      return std::tuple{out, mean, rstd};
    };
    auto backward = [&](int threads) {
      tide::thread_pool pool{threads};
      return p.run([&](auto... v) { tk::layernorm_backward(tide::exec<tide::host>{pool}, v...); });
    };
    auto const [o1, m1, r1] = forward(1);
    auto const [d1, w1, b1] = backward(1);
    for (int threads : {2, 3}) {
      CAPTURE(threads);
      auto const [o, m, r] = forward(threads);
      CHECK(same_bits(o, o1));
      CHECK(same_bits(m, m1));
      CHECK(same_bits(r, r1));
      auto const [d, w, b] = backward(threads);
      CHECK(same_bits(d, d1));
      CHECK(same_bits(w, w1));
      CHECK(same_bits(b, b1));
    }
  };
  check(static_cast<float*>(nullptr), static_cast<float*>(nullptr));
  check(static_cast<bf16*>(nullptr), static_cast<bf16*>(nullptr));
}

TEST_CASE("residual_layernorm_forward: bit-identical to residual_forward then layernorm_forward") {
  std::mt19937 gen(51);
  auto check = [&]<class T>(T*, index_t N, index_t C) {
    CAPTURE(N);
    CAPTURE(C);
    auto const nc = static_cast<std::size_t>(N * C), n = static_cast<std::size_t>(N);
    auto a = random_vector<T>(nc, gen, -2, 2);
    auto b = random_vector<T>(nc, gen, -2, 2);
    auto w = random_vector<float>(static_cast<std::size_t>(C), gen, -1, 1);
    auto bi = random_vector<float>(static_cast<std::size_t>(C), gen, -1, 1);
    std::vector<T> res(nc), out(nc), res2(nc), out2(nc), res_ref(nc), out_ref(nc);
    std::vector<float> mean(n), rstd(n), mean2(n), rstd2(n), mean_ref(n), rstd_ref(n);
    tide::thread_pool pool{2};
    tide::exec<tide::host> ex{pool};
    tk::residual_layernorm_forward(ex, view(res, {N, C}), view(out, {N, C}), view(mean, {N}), view(rstd, {N}),
                                   view(a, {N, C}), view(b, {N, C}), view(w, {C}), view(bi, {C}));
    tk::residual_forward(ex, view(res2, {N, C}), view(a, {N, C}), view(b, {N, C}));
    tk::layernorm_forward(ex, view(out2, {N, C}), view(mean2, {N}), view(rstd2, {N}), view(res2, {N, C}), view(w, {C}),
                          view(bi, {C}));
    CHECK(same_bits(res, res2));
    CHECK(same_bits(out, out2));
    CHECK(same_bits(mean, mean2));
    CHECK(same_bits(rstd, rstd2));
    // And the reference agrees on the residual exactly (one rounding of an exact sum).
    ref::residual_layernorm_forward(view(res_ref, {N, C}), view(out_ref, {N, C}), view(mean_ref, {N}),
                                    view(rstd_ref, {N}), view(a, {N, C}), view(b, {N, C}), view(w, {C}), view(bi, {C}));
    CHECK(same_bits(res, res_ref));
    // In place: residual written over a.
    tk::residual_layernorm_forward(ex, view(a, {N, C}), view(out2, {N, C}), view(mean2, {N}), view(rstd2, {N}),
                                   view(a, {N, C}), view(b, {N, C}), view(w, {C}), view(bi, {C}));
    CHECK(same_bits(a, res));
    CHECK(same_bits(out2, out));
  };
  for (index_t C : widths) {
    check(static_cast<float*>(nullptr), 9, C);
    check(static_cast<bf16*>(nullptr), 9, C);
  }
  check(static_cast<float*>(nullptr), 200, 768);
}

TEST_CASE("layernorm: bad arguments throw tide::error(usage) and write nothing") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  index_t const N = 4, C = 8;
  std::vector<float> x(32, 1.0f), out(32, -7.0f), mean(4, -7.0f), rstd(4, -7.0f), w(8, 1.0f), b(8, 0.0f), w9(9, 1.0f);
  std::vector<float> const untouched(32, -7.0f);
  auto X = view(x, {N, C});
  auto O = view(out, {N, C});
  auto M = view(mean, {N});
  auto R = view(rstd, {N});
  auto Wt = view(w, {C});
  auto B = view(b, {C});

  auto msg = usage_error([&] { tk::layernorm_forward(ex, view(out, {C, N}), M, R, X, Wt, B); });
  CHECK(msg.find("out") != std::string::npos);
  CHECK(msg.find("(4, 8)") != std::string::npos);
  CHECK(msg.find("(8, 4)") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_forward(ex, O, M, R, X, view(w9, {9}), B); });
  CHECK(msg.find("weight") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_forward(ex, O, view(mean, {2, 2}).slice(0, 1), R, X, Wt, B); });
  CHECK(msg.find("mean") != std::string::npos);
  // A strided inp: every other row of an (8, 4) buffer seen as (4, 4)... with C = 4 the shapes
  // disagree with weight too, so take columns instead: (4, 4) with row stride 8.
  tensor_view<float> strided(x.data(), {4, 4}, {8, 1, 1, 1});
  msg = usage_error([&] { tk::layernorm_forward(ex, view(out, {4, 8}).reshape({4, 8}), M, R, strided, Wt, B); });
  CHECK(msg.find("contiguous") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_forward(ex, X, M, R, X, Wt, B); });  // out over inp
  CHECK(msg.find("overlaps") != std::string::npos);
  std::vector<float> empty_rows;
  msg = usage_error([&] {
    tk::layernorm_forward(ex, view(empty_rows, {4, 0}), M, R, tensor_view<float const>(empty_rows.data(), {4, 0}), Wt, B);
  });
  CHECK(msg.find("C >= 1") != std::string::npos);
  CHECK(same_bits(out, untouched));
  CHECK(same_bits(mean, std::vector<float>(4, -7.0f)));

  std::vector<float> dinp(32, -7.0f), dout(32, 1.0f), dw(8, -7.0f), db(8, -7.0f);
  auto DI = view(dinp, {N, C});
  auto DO = view(dout, {N, C});
  msg = usage_error([&] { tk::layernorm_backward(ex, DI, view(w9, {9}), view(db, {C}), DO, X, Wt, M, R); });
  CHECK(msg.find("dweight") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward(ex, DO, view(dw, {C}), view(db, {C}), DO, X, Wt, M, R); });
  CHECK(msg.find("overlaps") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward(ex, DI, view(dw, {C}), view(dw, {C}), DO, X, Wt, M, R); });
  CHECK(msg.find("overlaps") != std::string::npos);
  CHECK(same_bits(dinp, untouched));
  CHECK(same_bits(dw, std::vector<float>(8, -7.0f)));
  CHECK(same_bits(dout, std::vector<float>(32, 1.0f)));

  std::vector<float> res(32, -7.0f);
  msg = usage_error([&] { tk::residual_layernorm_forward(ex, O, O, M, R, X, DO, Wt, B); });  // residual over out
  CHECK(msg.find("overlaps") != std::string::npos);
  msg = usage_error([&] { tk::residual_layernorm_forward(ex, view(res, {N, C}), O, M, R, X, view(dout, {C, N}), Wt, B); });
  CHECK(msg.find("b") != std::string::npos);
  CHECK(same_bits(res, untouched));
  CHECK(same_bits(out, untouched));
}

TEST_CASE("layernorm backward split: the input and weight halves give the fused bits") {
  std::mt19937 gen(61);
  // Each of dinp, dweight, dbias equal bit for bit; a half alone leaves the other's outputs as they were.
  auto check = [&]<class T, class W>(T*, W*, index_t N, index_t C) {
    CAPTURE(N);
    CAPTURE(C);
    backward_case<T, W> const p(N, C, gen);
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      tide::thread_pool pool{threads};
      tide::exec<tide::host> const ex{pool};
      tk::detail::call_scratch const scratch(tk::layernorm_backward_scratch_bytes(ex, N, C));
      auto input = [&](auto dinp, auto, auto, auto dout, auto inp, auto weight, auto mean, auto rstd) {
        tk::layernorm_backward_input(ex, dinp, dout, inp, weight, mean, rstd);
      };
      auto weight = [&](auto, auto dweight, auto dbias, auto dout, auto inp, auto, auto mean, auto rstd) {
        tk::layernorm_backward_weight(ex, dweight, dbias, dout, inp, mean, rstd, scratch.get());
      };
      auto const [dinp, dw, db] = p.run([&](auto... v) { tk::layernorm_backward(ex, v..., scratch.get()); });
      CHECK(!same_bits(dinp, p.dinp0));  // the backward ran
      CHECK(!same_bits(dw, p.dw0));
      CHECK(!same_bits(db, p.db0));
      auto const [dinp_iw, dw_iw, db_iw] = p.run([&](auto... v) {
        input(v...);
        weight(v...);
      });
      CHECK(same_bits(dinp_iw, dinp));
      CHECK(same_bits(dw_iw, dw));
      CHECK(same_bits(db_iw, db));
      auto const [dinp_wi, dw_wi, db_wi] = p.run([&](auto... v) {
        weight(v...);
        input(v...);
      });
      CHECK(same_bits(dinp_wi, dinp));
      CHECK(same_bits(dw_wi, dw));
      CHECK(same_bits(db_wi, db));
      auto const [dinp_i, dw_i, db_i] = p.run([&](auto... v) { input(v...); });
      CHECK(same_bits(dinp_i, dinp));
      CHECK(same_bits(dw_i, p.dw0));
      CHECK(same_bits(db_i, p.db0));
      auto const [dinp_w, dw_w, db_w] = p.run([&](auto... v) { weight(v...); });
      CHECK(same_bits(dinp_w, p.dinp0));
      CHECK(same_bits(dw_w, dw));
      CHECK(same_bits(db_w, db));
    }
  };
  // C = 24 and 37: not multiples of the 32 lanes of a row sum; N = 300: five chunks of 64 rows.
  for (auto [N, C] : {std::pair<index_t, index_t>{37, 24}, {300, 37}}) {
    check(static_cast<float*>(nullptr), static_cast<float*>(nullptr), N, C);
    check(static_cast<bf16*>(nullptr), static_cast<bf16*>(nullptr), N, C);
    check(static_cast<f16*>(nullptr), static_cast<f16*>(nullptr), N, C);
    check(static_cast<bf16*>(nullptr), static_cast<float*>(nullptr), N, C);
  }
}

TEST_CASE("layernorm backward split: bad arguments throw tide::error(usage) and write nothing") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  index_t const N = 4, C = 8;
  std::vector<float> x(32, 1.0f), w(8, 1.0f), w9(9, 1.0f), mean(4, 0.0f), rstd(4, 1.0f), dinp(32, -7.0f),
      dout(32, 1.0f), dw(8, -7.0f), db(8, -7.0f), dw9(9, -7.0f);
  tk::detail::call_scratch const scratch(tk::layernorm_backward_scratch_bytes(ex, N, C));
  auto const ws = scratch.get();
  auto X = view(x, {N, C});
  auto Wt = view(w, {C});
  auto M = view(mean, {N});
  auto R = view(rstd, {N});
  auto DI = view(dinp, {N, C});
  auto DO = view(dout, {N, C});
  auto DW = view(dw, {C});
  auto DB = view(db, {C});

  // The input half.
  auto msg = usage_error([&] { tk::layernorm_backward_input(ex, view(dinp, {C, N}), DO, X, Wt, M, R); });
  CHECK(msg.find("dinp") != std::string::npos);
  CHECK(msg.find("(8, 4)") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward_input(ex, DI, view(dout, {C, N}), X, Wt, M, R); });
  CHECK(msg.find("dout") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward_input(ex, DI, DO, X, view(w9, {9}), M, R); });
  CHECK(msg.find("weight") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward_input(ex, DI, DO, X, Wt, view(mean, {2, 2}).slice(0, 1), R); });
  CHECK(msg.find("mean") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward_input(ex, DO, DO, X, Wt, M, R); });  // dinp over dout
  CHECK(msg.find("overlaps") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward_input(ex, view(x, {N, C}), DO, X, Wt, M, R); });  // dinp over inp
  CHECK(msg.find("overlaps") != std::string::npos);

  // The weight half.
  msg = usage_error([&] { tk::layernorm_backward_weight(ex, view(dw9, {9}), DB, DO, X, M, R, ws); });
  CHECK(msg.find("dweight") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward_weight(ex, DW, view(dw9, {9}), DO, X, M, R, ws); });
  CHECK(msg.find("dbias") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward_weight(ex, DW, DB, view(dout, {C, N}), X, M, R, ws); });
  CHECK(msg.find("dout") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward_weight(ex, DW, DB, DO, X, M, view(rstd, {2, 2}).slice(0, 1), ws); });
  CHECK(msg.find("rstd") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward_weight(ex, DW, DW, DO, X, M, R, ws); });  // dbias over dweight
  CHECK(msg.find("overlaps") != std::string::npos);
  msg = usage_error([&] {  // dbias over dout
    tk::layernorm_backward_weight(ex, DW, tensor_view<float>(dout.data(), {C}), DO, X, M, R, ws);
  });
  CHECK(msg.find("overlaps") != std::string::npos);

  // Less scratch than the query asks (the input half needs none).
  std::size_t const need = tk::layernorm_backward_scratch_bytes(ex, N, C);
  REQUIRE(need > 4);
  tk::detail::call_scratch const small(need - 4);
  msg = usage_error([&] { tk::layernorm_backward_weight(ex, DW, DB, DO, X, M, R, small.get()); });
  CHECK(msg.find("layernorm_backward_scratch_bytes") != std::string::npos);
  msg = usage_error([&] { tk::layernorm_backward_weight(ex, DW, DB, DO, X, M, R, tk::scratch<>{}); });
  CHECK(msg.find("layernorm_backward_scratch_bytes") != std::string::npos);

  CHECK(same_bits(dinp, std::vector<float>(32, -7.0f)));
  CHECK(same_bits(dw, std::vector<float>(8, -7.0f)));
  CHECK(same_bits(db, std::vector<float>(8, -7.0f)));
  CHECK(same_bits(dw9, std::vector<float>(9, -7.0f)));
  CHECK(same_bits(dout, std::vector<float>(32, 1.0f)));
  CHECK(same_bits(x, std::vector<float>(32, 1.0f)));
}

TEST_CASE("layernorm: zero rows is a no-op") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  std::vector<float> none, w(5, 1.0f), b(5, 0.0f), dw(5, 2.0f), db(5, 3.0f);
  tk::layernorm_forward(ex, view(none, {0, 5}), view(none, {0}), view(none, {0}), view(none, {0, 5}), view(w, {5}),
                        view(b, {5}));
  tk::layernorm_backward(ex, view(none, {0, 5}), view(dw, {5}), view(db, {5}), view(none, {0, 5}), view(none, {0, 5}),
                         view(w, {5}), view(none, {0}), view(none, {0}));
  tk::layernorm_backward_input(ex, view(none, {0, 5}), view(none, {0, 5}), view(none, {0, 5}), view(w, {5}),
                               view(none, {0}), view(none, {0}));
  tk::layernorm_backward_weight(ex, view(dw, {5}), view(db, {5}), view(none, {0, 5}), view(none, {0, 5}),
                                view(none, {0}), view(none, {0}), tk::scratch<>{});
  CHECK(dw == std::vector<float>(5, 2.0f));
  CHECK(db == std::vector<float>(5, 3.0f));
}
