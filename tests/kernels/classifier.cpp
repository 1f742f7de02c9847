#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/exec.hpp>
#include <tide/kernels/classifier/classifier.hpp>
#include <tide/kernels/softmax/softmax.hpp>

namespace {

using tide::bf16;
using tide::index_t;
using tide::tensor_view;
namespace k = tide::kernels;
namespace ref = tide::kernels::reference;

constexpr double u32 = 0x1p-24;  // fp32 unit roundoff

// A batch: logits (N, Vp) with V real columns (the padding holds NaN: it must be neither read
// nor left in dlogits), targets in [0, V).
template <class T>
struct batch {
  index_t n, v, vp;
  std::vector<T> logits;
  std::vector<std::int32_t> targets;

  batch(index_t rows, index_t vocab, index_t padded, unsigned seed, float stddev = 2.f)
      : n(rows),
        v(vocab),
        vp(padded),
        logits(static_cast<std::size_t>(rows * padded)),
        targets(static_cast<std::size_t>(rows)) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.f, stddev);
    std::uniform_int_distribution<std::int32_t> pick(0, std::int32_t(vocab - 1));
    for (index_t r = 0; r < rows; ++r) {
      for (index_t j = 0; j < padded; ++j)
        logits[static_cast<std::size_t>(r * padded + j)] =
            tide::from_float<T>(j < vocab ? dist(gen) : std::numeric_limits<float>::quiet_NaN());
      targets[static_cast<std::size_t>(r)] = pick(gen);
    }
  }
  tensor_view<T const> logits_view() const { return {logits.data(), {n, vp}}; }
  tensor_view<std::int32_t const> targets_view() const { return {targets.data(), {n}}; }
};

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

// Host results against the double reference run on the same (float) inputs, unrounded to T.
//   loss = log s + m - x_t: the sum's relative error (~sqrt(V / 16) u for random rows, see
//     softmax.cpp) becomes an absolute error in log s; log, m - x_t and the final add round
//     (|log s| + |m - x_t| + 2) u.
//   dlogit = (p - [j == t]) w: p as in softmax's forward_tol; the subtraction and the product
//     round once each; then the output rounding u_T |d| for 16-bit types.
template <class T>
void check_against_reference(batch<T> const& b, std::vector<float> const& losses, std::vector<T> const& dlogits,
                             std::vector<float> const& weights) {
  auto const xf = to_floats(b.logits);
  std::vector<float> loss_ref(static_cast<std::size_t>(b.n)), d_ref(xf.size());
  ref::fused_classifier(tensor_view<float>{d_ref.data(), {b.n, b.vp}}, tensor_view<float>{loss_ref.data(), {b.n}},
                        tensor_view<float const>{xf.data(), {b.n, b.vp}}, b.targets_view(), b.v,
                        weights.empty() ? tensor_view<float const>{} : tensor_view<float const>{weights.data(), {b.n}});
  double const sum_err = (8.0 + std::sqrt(double(b.v)) / 2) * u32;
  double const out_round = std::is_same_v<T, float> ? 0.0 : double(tide::unit_roundoff<T>);
  int bad = 0;
  for (index_t r = 0; r < b.n; ++r) {
    double m = -1e300;
    for (index_t j = 0; j < b.v; ++j) m = std::fmax(m, xf[static_cast<std::size_t>(r * b.vp + j)]);
    double const xt = xf[static_cast<std::size_t>(r * b.vp + b.targets[static_cast<std::size_t>(r)])];
    double const lr = loss_ref[static_cast<std::size_t>(r)];
    double const loss_tol = sum_err + (std::fabs(lr - (m - xt)) + std::fabs(m - xt) + 2.0) * u32 + 1e-30;
    if (!(std::fabs(losses[static_cast<std::size_t>(r)] - lr) <= loss_tol) && ++bad < 5)
      FAIL_CHECK("loss row ", r, ": got ", losses[static_cast<std::size_t>(r)], " expected ", lr, " tol ", loss_tol);
    double const w = weights.empty() ? 1.0 / double(b.n) : double(weights[static_cast<std::size_t>(r)]);
    for (index_t j = 0; j < b.vp; ++j) {
      auto const i = static_cast<std::size_t>(r * b.vp + j);
      double const d = tide::to_float(dlogits[i]);
      if (j >= b.v) {
        if (d != 0.0 && ++bad < 5) FAIL_CHECK("padded column ", j, " of row ", r, " is ", d, ", not 0");
        continue;
      }
      double const p = std::exp(double(xf[i]) - m) / std::exp(lr - (m - xt));  // the probability
      double const arg = std::fabs(double(xf[i]) - m);
      double const tol =
          std::fabs(w) * (p * ((std::fabs(xf[i]) + std::fabs(m) + arg + 8.0) * u32 + sum_err) + 2 * u32) +
          std::fabs(d_ref[i]) * (2 * u32 + out_round) + 1e-37;
      if (!(std::fabs(d - d_ref[i]) <= tol) && ++bad < 5)
        FAIL_CHECK("dlogit (", r, ", ", j, "): got ", d, " expected ", d_ref[i], " tol ", tol);
    }
  }
  CHECK(bad == 0);
}

template <class F>
bool throws_usage(F&& f) {
  try {
    f();
  } catch (tide::error const& e) {
    return e.category() == tide::errc::usage;
  }
  return false;
}

}  // namespace

TEST_CASE_TEMPLATE("fused_classifier matches the double reference: V = 1, 17, 257, 50257, padded", T, float, bf16) {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  struct sizes {
    index_t n, v, vp;
  };
  for (auto const s :
       {sizes{3, 1, 1}, sizes{4, 17, 24}, sizes{5, 257, 257}, sizes{3, 1000, 1031}, sizes{1, 50257, 50304}}) {
    CAPTURE(s.v);
    batch<T> b(s.n, s.v, s.vp, unsigned(s.v));
    std::vector<float> losses(static_cast<std::size_t>(s.n), -1.f);
    std::vector<T> dlogits(b.logits.size(), tide::from_float<T>(5.f));
    k::fused_classifier(ex, tensor_view<T>{dlogits.data(), {s.n, s.vp}}, tensor_view<float>{losses.data(), {s.n}},
                        b.logits_view(), b.targets_view(), s.v);
    check_against_reference(b, losses, dlogits, {});
    if (s.v == 1)
      for (float l : losses) CHECK(l == 0.f);  // one class: probability 1
  }
}

TEST_CASE("fused_classifier: per-row weights, (B, T, Vp) logits, in place equals out of place") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  index_t const bsz = 2, t = 3, v = 300, vp = 320;
  batch<float> b(bsz * t, v, vp, 99, 4.f);
  std::vector<float> w{0.5f, 0.f, 1.f, 2.f, -1.f, 0.25f};
  std::vector<float> losses(6), dlogits(b.logits.size());
  k::fused_classifier(ex, tensor_view<float>{dlogits.data(), {bsz, t, vp}}, tensor_view<float>{losses.data(), {bsz, t}},
                      tensor_view<float const>{b.logits.data(), {bsz, t, vp}},
                      tensor_view<std::int32_t const>{b.targets.data(), {bsz, t}}, v,
                      tensor_view<float const>{w.data(), {6}});
  check_against_reference(b, losses, dlogits, w);
  for (index_t j = 0; j < vp; ++j) CHECK(dlogits[static_cast<std::size_t>(vp + j)] == 0.f);  // weight 0: no gradient

  // In place: dlogits over the logits gives the same bits, losses included.
  auto inplace = b.logits;
  std::vector<float> losses2(6);
  k::fused_classifier(
      ex, tensor_view<float>{inplace.data(), {bsz, t, vp}}, tensor_view<float>{losses2.data(), {bsz, t}},
      tensor_view<float const>{inplace.data(), {bsz, t, vp}},
      tensor_view<std::int32_t const>{b.targets.data(), {bsz, t}}, v, tensor_view<float const>{w.data(), {6}});
  CHECK(same_bits(inplace, dlogits));
  CHECK(same_bits(losses2, losses));

  // bf16 in place too.
  batch<bf16> c(4, 77, 80, 5);
  std::vector<bf16> d(c.logits.size());
  std::vector<float> l1(4), l2(4);
  k::fused_classifier(ex, tensor_view<bf16>{d.data(), {4, 80}}, tensor_view<float>{l1.data(), {4}}, c.logits_view(),
                      c.targets_view(), 77, 0.5f);
  auto cin = c.logits;
  k::fused_classifier(ex, tensor_view<bf16>{cin.data(), {4, 80}}, tensor_view<float>{l2.data(), {4}},
                      tensor_view<bf16 const>{cin.data(), {4, 80}}, c.targets_view(), 77, 0.5f);
  CHECK(same_bits(cin, d));
  CHECK(same_bits(l1, l2));
}

TEST_CASE("fused_classifier: dlogits are the central finite differences of the weighted loss") {
  // Tiny case in double: L(x) = sum_r w_r (log sum_j exp x_rj - x_r,t_r); dL/dx by central
  // differences with h = 1e-4 has truncation error ~h^2 |L'''| < 1e-8; the kernel's float
  // dlogits are within ~1e-7 of the exact gradient, so 2e-6 separates a right gradient from a
  // wrong one (a missing -1 at the target, a wrong weight, a missing row) by orders of magnitude.
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  index_t const n = 3, v = 5, vp = 8;
  batch<float> b(n, v, vp, 2024, 1.5f);
  std::vector<float> w{0.3f, 1.f, 0.7f};
  auto const loss_of = [&](std::vector<double> const& x) {
    double total = 0;
    for (index_t r = 0; r < n; ++r) {
      double m = -1e300, s = 0;
      for (index_t j = 0; j < v; ++j) m = std::fmax(m, x[static_cast<std::size_t>(r * vp + j)]);
      for (index_t j = 0; j < v; ++j) s += std::exp(x[static_cast<std::size_t>(r * vp + j)] - m);
      total += double(w[static_cast<std::size_t>(r)]) *
               (std::log(s) + m - x[static_cast<std::size_t>(r * vp + b.targets[static_cast<std::size_t>(r)])]);
    }
    return total;
  };
  std::vector<float> losses(static_cast<std::size_t>(n)), dlogits(b.logits.size());
  k::fused_classifier(ex, tensor_view<float>{dlogits.data(), {n, vp}}, tensor_view<float>{losses.data(), {n}},
                      b.logits_view(), b.targets_view(), v, tensor_view<float const>{w.data(), {n}});
  std::vector<double> x(b.logits.begin(), b.logits.end());
  for (auto& e : x)
    if (std::isnan(e)) e = 0;  // padding does not enter the loss
  double const h = 1e-4;
  for (index_t r = 0; r < n; ++r)
    for (index_t j = 0; j < v; ++j) {
      auto const i = static_cast<std::size_t>(r * vp + j);
      auto xp = x, xm = x;
      xp[i] += h;
      xm[i] -= h;
      double const fd = (loss_of(xp) - loss_of(xm)) / (2 * h);
      CAPTURE(r);
      CAPTURE(j);
      CHECK(std::fabs(dlogits[i] - fd) < 2e-6);
    }
  // The loss itself: sum_r w_r loss_r equals the double loss.
  double weighted = 0;
  for (index_t r = 0; r < n; ++r)
    weighted += double(w[static_cast<std::size_t>(r)]) * losses[static_cast<std::size_t>(r)];
  CHECK(std::fabs(weighted - loss_of(x)) < 1e-6);
}

TEST_CASE("fused_classifier: bit-identical on 1, 2 and 3 threads") {
  batch<float> b(23, 2000, 2048, 31);
  std::vector<float> losses[3], dlogits[3];
  for (int threads = 1; threads <= 3; ++threads) {
    tide::thread_pool pool{threads};
    tide::exec<tide::host> ex{pool};
    auto const i = static_cast<std::size_t>(threads - 1);
    losses[i].resize(static_cast<std::size_t>(b.n));
    dlogits[i].resize(b.logits.size());
    k::fused_classifier(ex, tensor_view<float>{dlogits[i].data(), {b.n, b.vp}},
                        tensor_view<float>{losses[i].data(), {b.n}}, b.logits_view(), b.targets_view(), b.v);
  }
  for (std::size_t i = 1; i < 3; ++i) {
    CHECK(same_bits(losses[0], losses[i]));
    CHECK(same_bits(dlogits[0], dlogits[i]));
  }
}

TEST_CASE("the unfused path (softmax, crossentropy_forward, crossentropy_softmax_backward) agrees") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  index_t const n = 4, v = 1000, vp = 1024;
  batch<float> b(n, v, vp, 77);
  std::vector<float> probs(b.logits.size()), losses(static_cast<std::size_t>(n)), dlogits(b.logits.size());
  std::int32_t const len = std::int32_t(v);
  k::softmax_forward_masked(ex, tensor_view<float>{probs.data(), {n, vp}}, b.logits_view(),
                            tensor_view<std::int32_t const>{&len, {1}});
  k::crossentropy_forward(ex, tensor_view<float>{losses.data(), {n}}, tensor_view<float const>{probs.data(), {n, vp}},
                          b.targets_view(), v);
  k::crossentropy_softmax_backward(ex, tensor_view<float>{dlogits.data(), {n, vp}},
                                   tensor_view<float const>{probs.data(), {n, vp}}, b.targets_view(), v,
                                   1.f / float(n));
  check_against_reference(b, losses, dlogits, {});

  // The references of the two unfused ops against the fused reference.
  std::vector<float> lr(static_cast<std::size_t>(n)), dr(b.logits.size()), lf(static_cast<std::size_t>(n)),
      df(b.logits.size());
  auto const xf = b.logits;
  ref::fused_classifier(tensor_view<float>{df.data(), {n, vp}}, tensor_view<float>{lf.data(), {n}},
                        tensor_view<float const>{xf.data(), {n, vp}}, b.targets_view(), v);
  ref::crossentropy_forward(tensor_view<float>{lr.data(), {n}}, tensor_view<float const>{probs.data(), {n, vp}},
                            b.targets_view(), v);
  ref::crossentropy_softmax_backward(tensor_view<float>{dr.data(), {n, vp}},
                                     tensor_view<float const>{probs.data(), {n, vp}}, b.targets_view(), v);
  for (index_t r = 0; r < n; ++r)
    CHECK(std::fabs(lr[static_cast<std::size_t>(r)] - lf[static_cast<std::size_t>(r)]) < 1e-5);
  // dr is built from the kernel's float probabilities (<= ~30 u relative each), df from the
  // logits in double: they differ by far less than 1e-7 (the weight, 1/4, is the scale of a bug).
  for (std::size_t i = 0; i < df.size(); ++i) REQUIRE(std::fabs(dr[i] - df[i]) < 1e-7);
}

TEST_CASE("max_sum: the CUDA kernel's online (max, sum) equals the two-pass sum") {
  // cuda.cuh folds each thread's strided columns with max_sum_add, then merges the partials in
  // a block reduction; here the same functions on the host, with 7 "threads" and a merge tree.
  std::mt19937 gen(5);
  std::normal_distribution<float> dist(0.f, 5.f);
  for (int cols : {1, 6, 7, 100, 5000}) {
    std::vector<float> x(static_cast<std::size_t>(cols));
    for (auto& e : x) e = dist(gen);
    if (cols > 6) x[3] = -std::numeric_limits<float>::infinity();  // a masked logit adds 0
    k::detail::max_sum part[7];
    for (auto& p : part) p = k::detail::max_sum_empty();
    for (int j = 0; j < cols; ++j) part[j % 7] = k::detail::max_sum_add(part[j % 7], x[static_cast<std::size_t>(j)]);
    k::detail::max_sum total = k::detail::max_sum_merge(k::detail::max_sum_merge(part[0], part[1]),
                                                        k::detail::max_sum_merge(part[2], part[3]));
    total =
        k::detail::max_sum_merge(total, k::detail::max_sum_merge(k::detail::max_sum_merge(part[4], part[5]), part[6]));
    double m = -1e300, s = 0;
    for (float e : x) m = std::fmax(m, e);
    for (float e : x) s += std::exp(double(e) - m);
    CAPTURE(cols);
    CHECK(total.m == float(m));
    CHECK(std::fabs(total.s - s) <= s * (16.0 + std::sqrt(double(cols))) * u32);
  }
}

TEST_CASE("classifier: bad calls throw tide::error(usage) and write nothing") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  batch<float> b(4, 10, 12, 3);
  std::vector<float> losses(4, 9.f), dlogits(b.logits.size(), 9.f);
  auto const logits_before = b.logits;
  auto const call = [&](index_t v, std::vector<std::int32_t> const& targets) {
    k::fused_classifier(ex, tensor_view<float>{b.logits.data(), {4, 12}}, tensor_view<float>{losses.data(), {4}},
                        tensor_view<float const>{b.logits.data(), {4, 12}},
                        tensor_view<std::int32_t const>{targets.data(), {4}}, v);
  };
  CHECK(throws_usage([&] { call(10, {0, 1, 10, 2}); }));  // target == V (a padded column)
  CHECK(throws_usage([&] { call(10, {0, -1, 3, 2}); }));  // negative target
  CHECK(throws_usage([&] { call(0, {0, 0, 0, 0}); }));    // V = 0
  CHECK(throws_usage([&] { call(13, {0, 1, 2, 3}); }));   // V > Vp
  CHECK(same_bits(b.logits, logits_before));              // the in-place call wrote nothing
  CHECK(losses == std::vector<float>(4, 9.f));

  // Shapes: dlogits vs logits, losses and targets per row, weights per row.
  CHECK(throws_usage([&] {
    k::fused_classifier(ex, tensor_view<float>{dlogits.data(), {6, 8}}, tensor_view<float>{losses.data(), {4}},
                        b.logits_view(), b.targets_view(), 10);
  }));
  CHECK(throws_usage([&] {
    k::fused_classifier(ex, tensor_view<float>{dlogits.data(), {4, 12}}, tensor_view<float>{losses.data(), {3}},
                        b.logits_view(), b.targets_view(), 10);
  }));
  CHECK(throws_usage([&] {
    k::fused_classifier(ex, tensor_view<float>{dlogits.data(), {4, 12}}, tensor_view<float>{losses.data(), {4}},
                        b.logits_view(), tensor_view<std::int32_t const>{b.targets.data(), {3}}, 10);
  }));
  std::vector<float> w(3, 1.f);
  CHECK(throws_usage([&] {
    k::fused_classifier(ex, tensor_view<float>{dlogits.data(), {4, 12}}, tensor_view<float>{losses.data(), {4}},
                        b.logits_view(), b.targets_view(), 10, tensor_view<float const>{w.data(), {3}});
  }));
  // Partly overlapping dlogits and logits.
  CHECK(throws_usage([&] {
    k::fused_classifier(ex, tensor_view<float>{b.logits.data() + 1, {3, 12}}, tensor_view<float>{losses.data(), {3}},
                        tensor_view<float const>{b.logits.data(), {3, 12}},
                        tensor_view<std::int32_t const>{b.targets.data(), {3}}, 10);
  }));
  CHECK(dlogits == std::vector<float>(b.logits.size(), 9.f));
  CHECK(losses == std::vector<float>(4, 9.f));
  CHECK(same_bits(b.logits, logits_before));
  // The unfused ops check their targets too.
  std::vector<std::int32_t> bad{0, 1, 11, 2};
  CHECK(throws_usage([&] {
    k::crossentropy_forward(ex, tensor_view<float>{losses.data(), {4}}, b.logits_view(),
                            tensor_view<std::int32_t const>{bad.data(), {4}}, 10);
  }));
  CHECK(throws_usage([&] {
    k::crossentropy_softmax_backward(ex, tensor_view<float>{dlogits.data(), {4, 12}}, b.logits_view(),
                                     tensor_view<std::int32_t const>{bad.data(), {4}}, 10, 0.25f);
  }));
}
