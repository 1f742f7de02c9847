#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <tide/kernels/adamw/adamw.hpp>

#include "support/optimizer_checks.hpp"

namespace {

namespace k = tide::kernels;
using tide::index_t;

using tide::test::contraction_slack;
using tide::test::noise;
using tide::test::throws_usage;
template <class Grad>
using state = tide::test::adam_state<Grad>;

// Host against reference on one tensor, with the tolerances the docs state:
//   m, v: contraction_slack of their terms (bit-identical without FMA units).
//   p: 1 ulp of p, plus 2^-20 of lr * (|r| + wd |p|), r = m_hat / (sqrt(v_hat) + eps): the host
//      scales m and v by rounded reciprocals of the bias corrections where the reference
//      divides, so m_hat and v_hat may differ by ~2^-22 relative, r by ~2^-21, and the sum with
//      the decay term can cancel, hence a bound on the terms rather than on the update; plus
//      what the m and v differences above do to r.
template <class Grad, class Work>
void check_against_reference(index_t n, std::int64_t t, float grad_scale, unsigned seed) {
  k::adamw_hparams const hp{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
  state<Grad> host(n, seed), ref(n, seed);
  state<Grad> const before(n, seed);
  std::vector<Work> work_host(static_cast<std::size_t>(n)), work_ref(static_cast<std::size_t>(n));
  tide::thread_pool pool{2};
  k::adamw(tide::exec<tide::host>{pool}, hp, t, host.pv(), host.gv(), host.mv(), host.vv(),
           tide::tensor_view<Work>{work_host.data(), {n}}, grad_scale);
  k::reference::adamw(hp, t, ref.pv(), ref.gv(), ref.mv(), ref.vv(), tide::tensor_view<Work>{work_ref.data(), {n}},
                      grad_scale);
  double const b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, wd = hp.weight_decay;
  double const rb1 = 1 / (1.0 - std::pow(b1, static_cast<double>(t)));
  double const rb2 = 1 / (1.0 - std::pow(b2, static_cast<double>(t)));
  for (index_t i = 0; i < n; ++i) {
    auto const u = static_cast<std::size_t>(i);
    double const g = static_cast<double>(tide::to_float(before.g[u])) * grad_scale;
    double const tol_m = contraction_slack * (b1 * std::abs(before.m[u]) + (1 - b1) * std::abs(g));
    double const tol_v = 2 * contraction_slack * (b2 * before.v[u] + (1 - b2) * g * g);
    if (std::abs(static_cast<double>(host.m[u]) - ref.m[u]) > tol_m ||
        std::abs(static_cast<double>(host.v[u]) - ref.v[u]) > tol_v) {
      FAIL_CHECK("m[" << i << "] = " << host.m[u] << " (reference " << ref.m[u] << "), v[" << i << "] = " << host.v[u]
                      << " (reference " << ref.v[u] << "), tolerances " << tol_m << ", " << tol_v);
      break;
    }
    double const root = std::sqrt(ref.v[u] * rb2) + 1e-8;
    double const r = ref.m[u] * rb1 / root;
    double const tol = 0x1p-23 * std::max(std::abs(ref.p[u]), std::abs(host.p[u])) +
                       lr * (0x1p-20 * (std::abs(r) + wd * std::abs(before.p[u])) + rb1 * tol_m / root +
                             std::abs(r) * tol_v / (2 * ref.v[u] + FLT_MIN)) +
                       FLT_TRUE_MIN;
    if (std::abs(static_cast<double>(host.p[u]) - ref.p[u]) > tol) {
      FAIL_CHECK("p[" << i << "] = " << host.p[u] << ", reference " << ref.p[u] << ", tolerance " << tol);
      break;
    }
    // The working copy is the dtype's rounding of the host's own new master weight, exactly.
    if (work_host[u].bits != tide::from_float<Work>(host.p[u]).bits) {
      FAIL_CHECK("working[" << i << "] is not the rounding of p = " << host.p[u]);
      break;
    }
  }
}

}  // namespace

TEST_CASE("adamw: host matches the reference, fp32 gradients, sizes that are not whole vectors") {
  for (index_t n : {1, 15, 17, 63, 773}) {
    CAPTURE(n);
    check_against_reference<float, tide::bf16>(n, 1, 1.f, 7u);
    check_against_reference<float, tide::bf16>(n, 7, 0.5f, 8u);
  }
  check_against_reference<float, tide::bf16>(1000003, 2, 0.5f, 9u);
}

TEST_CASE("adamw: bf16 and f16 gradients and working copies (gradients widen exactly, so fp32 tolerances)") {
  for (index_t n : {1, 17, 4099}) {
    CAPTURE(n);
    check_against_reference<tide::bf16, tide::bf16>(n, 3, 1.f, 11u);
    check_against_reference<tide::f16, tide::f16>(n, 3, 0.25f, 12u);
    check_against_reference<tide::bf16, tide::f16>(n, 1000, 2.f, 13u);
  }
}

TEST_CASE("adamw: bit-identical for 1, 2 and 3 threads") {
  k::adamw_hparams const hp{.lr = 3e-4f, .weight_decay = 0.1f};
  auto const steps = [&](auto const& ex, auto& s, auto w) {
    for (std::int64_t t = 1; t <= 2; ++t) k::adamw(ex, hp, t, s.pv(), s.gv(), s.mv(), s.vv(), w, 0.75f);
  };
  tide::test::check_thread_count_identity<state<tide::bf16>, tide::bf16>(200003, 21u, steps);
}

TEST_CASE("adamw: a tensor list gives the same bits as the same data as one flat chunk") {
  std::vector<index_t> const sizes = {1, 0, 15, 17, (index_t{1} << 14) + 3, 40000, 2};
  index_t total = 0;
  for (index_t s : sizes) total += s;
  state<float> listed(total, 31u), flat(total, 31u);
  std::vector<tide::bf16> w_list(static_cast<std::size_t>(total)), w_flat(static_cast<std::size_t>(total));
  std::vector<k::adamw_tensor<float, tide::bf16>> list;
  index_t at = 0;
  for (index_t s : sizes) {
    // The zero-size tensor has null pointers: allowed, it has no elements.
    if (s == 0)
      list.push_back({});
    else
      list.push_back({listed.p.data() + at, listed.g.data() + at, listed.m.data() + at, listed.v.data() + at,
                      w_list.data() + at, s});
    at += s;
  }
  k::adamw_hparams const hp{.lr = 1e-3f};
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  k::adamw(ex, hp, 5, list, 0.5f);
  k::adamw(ex, hp, 5, flat.pv(), flat.gv(), flat.mv(), flat.vv(), tide::tensor_view<tide::bf16>{w_flat.data(), {total}},
           0.5f);
  CHECK(listed.p == flat.p);
  CHECK(listed.m == flat.m);
  CHECK(listed.v == flat.v);
  CHECK(std::memcmp(w_list.data(), w_flat.data(), sizeof(tide::bf16) * total) == 0);
  CHECK(listed.p != state<float>(total, 31u).p);
}

TEST_CASE("adamw: a record with prev arrays gets every value from before the step, and steps the same bits") {
  // Sizes across grains and vector tails, a working copy, two threads.
  std::vector<index_t> const sizes = {(index_t{1} << 14) + 5, 33, 1};
  index_t total = 0;
  for (index_t s : sizes) total += s;
  state<float> kept(total, 41u), plain(total, 41u);
  state<float> const before(total, 41u);
  std::vector<tide::bf16> w_kept(static_cast<std::size_t>(total)), w_plain(static_cast<std::size_t>(total));
  for (index_t i = 0; i < total; ++i) w_kept[static_cast<std::size_t>(i)] = w_plain[static_cast<std::size_t>(i)] =
                                          tide::from_float<tide::bf16>(tide::test::noise(44, i));
  std::vector<tide::bf16> const w_before = w_kept;
  std::vector<float> pp(static_cast<std::size_t>(total), -7.f), pm = pp, pv = pp;
  std::vector<tide::bf16> pw(static_cast<std::size_t>(total));
  std::vector<k::adamw_tensor<float, tide::bf16>> with, without;
  index_t at = 0;
  for (index_t s : sizes) {
    with.push_back({kept.p.data() + at, kept.g.data() + at, kept.m.data() + at, kept.v.data() + at, w_kept.data() + at,
                    s, pp.data() + at, pm.data() + at, pv.data() + at, pw.data() + at});
    without.push_back({plain.p.data() + at, plain.g.data() + at, plain.m.data() + at, plain.v.data() + at,
                       w_plain.data() + at, s});
    at += s;
  }
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  k::adamw(ex, k::adamw_hparams{.lr = 1e-3f, .weight_decay = 0.1f}, 3, with, 0.5f);
  k::adamw(ex, k::adamw_hparams{.lr = 1e-3f, .weight_decay = 0.1f}, 3, without, 0.5f);
  CHECK(pp == before.p);
  CHECK(pm == before.m);
  CHECK(pv == before.v);
  CHECK(std::memcmp(pw.data(), w_before.data(), sizeof(tide::bf16) * static_cast<std::size_t>(total)) == 0);
  CHECK(kept.p == plain.p);
  CHECK(kept.m == plain.m);
  CHECK(kept.v == plain.v);
  CHECK(std::memcmp(w_kept.data(), w_plain.data(), sizeof(tide::bf16) * static_cast<std::size_t>(total)) == 0);
  CHECK(kept.p != before.p);
}

TEST_CASE("adamw: read from sources, the step writes the in-place result elsewhere and leaves the sources") {
  // The offload journal's form: p, m, v read from src_*, the new values to other blocks (filled
  // with NaN here: every element must be written). Sizes across pieces, grains and vector tails,
  // a working copy, prev arrays beside it, two threads.
  std::vector<index_t> const sizes = {(index_t{1} << 14) + 1029, 33, 1};
  index_t total = 0;
  for (index_t s : sizes) total += s;
  auto const count = static_cast<std::size_t>(total);
  state<float> plain(total, 43u), src(total, 43u);
  state<float> const before(total, 43u);
  // The new p and v start on a 64-byte line (streamed a vector at a time), the new m 4 bytes past
  // one (streamed after each piece).
  std::vector<float> buf_p(count + 32, NAN), buf_m = buf_p, buf_v = buf_p, pp(count, -7.f), pm = pp;
  auto on_line = [](std::vector<float>& b, std::size_t plus) {
    auto const off = (64 - reinterpret_cast<std::uintptr_t>(b.data()) % 64) % 64 / sizeof(float);
    return std::span<float>(b.data() + off + plus, b.size() - 32);
  };
  std::span<float> const np = on_line(buf_p, 0), nm = on_line(buf_m, 1), nv = on_line(buf_v, 0);
  auto same = [](std::span<float const> a, std::vector<float> const& b) { return std::ranges::equal(a, b); };
  std::vector<tide::bf16> w_plain(count), w_new(count);
  std::vector<k::adamw_tensor<float, tide::bf16>> in_place, from;
  index_t at = 0;
  for (index_t s : sizes) {
    in_place.push_back({plain.p.data() + at, plain.g.data() + at, plain.m.data() + at, plain.v.data() + at,
                        w_plain.data() + at, s});
    from.push_back({np.data() + at, src.g.data() + at, nm.data() + at, nv.data() + at, w_new.data() + at, s,
                    pp.data() + at, pm.data() + at, nullptr, nullptr, src.p.data() + at, src.m.data() + at,
                    src.v.data() + at});
    at += s;
  }
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  k::adamw(ex, k::adamw_hparams{.lr = 1e-3f, .weight_decay = 0.1f}, 3, in_place, 0.5f);
  k::adamw(ex, k::adamw_hparams{.lr = 1e-3f, .weight_decay = 0.1f}, 3, from, 0.5f);
  CHECK(same(np, plain.p));
  CHECK(same(nm, plain.m));
  CHECK(same(nv, plain.v));
  CHECK(std::memcmp(w_new.data(), w_plain.data(), sizeof(tide::bf16) * count) == 0);
  CHECK(src.p == before.p);  // the sources are as they were
  CHECK(src.m == before.m);
  CHECK(src.v == before.v);
  CHECK(pp == before.p);  // and the prev arrays got them
  CHECK(pm == before.m);
  CHECK(!same(np, before.p));
}

TEST_CASE("adamw: grad_scale multiplies the gradient before use (clipping costs no pass)") {
  // Scaling by a power of two is exact, so scale 0.25 on g equals scale 1 on g / 4, bit for bit.
  index_t const n = 1001;
  state<float> scaled(n, 41u), divided(n, 41u);
  for (float& x : divided.g) x *= 0.25f;
  tide::thread_pool pool{1};
  tide::exec<tide::host> const ex{pool};
  k::adamw(ex, {}, 2, scaled.pv(), scaled.gv(), scaled.mv(), scaled.vv(), 0.25f);
  k::adamw(ex, {}, 2, divided.pv(), divided.gv(), divided.mv(), divided.vv());
  CHECK(scaled.p == divided.p);
  CHECK(scaled.m == divided.m);
  CHECK(scaled.v == divided.v);
}

TEST_CASE("adamw: 10 steps on a quadratic reduce the loss and follow PyTorch's AdamW, in double") {
  // loss(p) = 1/2 sum a_i (p_i - c_i)^2, gradient a_i (p_i - c_i).
  index_t const n = 1027;
  std::vector<float> a, c, p, g(static_cast<std::size_t>(n)), m(static_cast<std::size_t>(n), 0.f),
      v(static_cast<std::size_t>(n), 0.f);
  for (index_t i = 0; i < n; ++i) {
    a.push_back(1.25f + 0.75f * noise(51u, i));  // curvatures in [0.5, 2)
    c.push_back(noise(52u, i));
    float const away = 1.5f + 0.5f * noise(53u, i);  // 1 to 2 away from the minimum
    p.push_back(c.back() + (i % 2 ? away : -away));
  }
  auto const loss = [&](auto const& x) {
    double s = 0;
    for (std::size_t i = 0; i < x.size(); ++i) s += 0.5 * a[i] * (x[i] - c[i]) * (x[i] - c[i]);
    return s;
  };
  k::adamw_hparams const hp{.lr = 0.05f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};

  // torch.optim.AdamW (_single_tensor_adamw, foreach=False) in double, hyper-parameters as the
  // floats tide was given.
  std::vector<double> pd(p.begin(), p.end()), md(static_cast<std::size_t>(n)), vd(static_cast<std::size_t>(n));
  double const lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;

  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  double const loss0 = loss(p);
  double previous = loss0;
  for (std::int64_t t = 1; t <= 10; ++t) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = a[i] * (p[i] - c[i]);
    k::adamw(ex, hp, t, tide::tensor_view<float>{p.data(), {n}}, tide::tensor_view<float const>{g.data(), {n}},
             tide::tensor_view<float>{m.data(), {n}}, tide::tensor_view<float>{v.data(), {n}});
    double const bias1 = 1 - std::pow(b1, static_cast<double>(t));
    double const bias2_sqrt = std::sqrt(1 - std::pow(b2, static_cast<double>(t)));
    for (std::size_t i = 0; i < pd.size(); ++i) {
      double const gi = a[i] * (pd[i] - c[i]);
      pd[i] *= 1 - lr * wd;
      md[i] += (gi - md[i]) * (1 - b1);  // exp_avg.lerp_(grad, 1 - beta1)
      vd[i] = vd[i] * b2 + (1 - b2) * gi * gi;
      double const denom = std::sqrt(vd[i]) / bias2_sqrt + eps;
      pd[i] -= lr / bias1 * md[i] / denom;
    }
    double const now = loss(p);
    CHECK(now < previous);
    previous = now;
  }
  CHECK(previous < 0.7 * loss0);
  // Tolerance: each step rounds p (|p| < 3: half an ulp, 1.2e-7) and the update (relative 2^-21
  // of lr = 0.05: 2.4e-8) in float, and the gradient fed back is computed from the float p;
  // Adam's update m / sqrt(v) is insensitive to such changes, so the error grows about linearly:
  // 10 steps x 1.5e-7 = 1.5e-6; 4e-6 leaves room for the FMA contraction differences.
  double worst = 0;
  for (std::size_t i = 0; i < pd.size(); ++i) worst = std::max(worst, std::abs(p[i] - pd[i]));
  CHECK(worst <= 4e-6);
  CHECK(loss(pd) == doctest::Approx(previous).epsilon(1e-5));
}

TEST_CASE("adamw: bad input throws tide::error(usage) and changes nothing") {
  index_t const n = 33;
  state<float> s(n, 61u), shorter(n - 1, 61u);
  state<float> const before = s;
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  CHECK(throws_usage([&] { k::adamw(ex, {}, 0, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adamw(ex, {}, -3, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adamw(ex, {}, 1, s.pv(), shorter.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adamw(ex, {}, 1, s.pv(), s.gv(), shorter.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adamw(ex, {}, 1, s.pv(), s.gv(), s.mv(), shorter.vv()); }));
  std::vector<tide::bf16> w(static_cast<std::size_t>(n - 1));
  CHECK(throws_usage([&] {
    k::adamw(ex, {}, 1, s.pv(), s.gv(), s.mv(), s.vv(), tide::tensor_view<tide::bf16>{w.data(), {n - 1}});
  }));
  // Same element count, different shape; and a strided view.
  CHECK(throws_usage([&] {
    k::adamw(ex, {}, 1, s.pv(), tide::tensor_view<float const>{s.g.data(), {3, 11}}, s.mv(), s.vv());
  }));
  tide::tensor_view<float> const strided{s.m.data(), {11}, {3, 1, 1, 1}};
  CHECK(throws_usage([&] {
    k::adamw(ex, {}, 1, tide::tensor_view<float>{s.p.data(), {11}}, tide::tensor_view<float const>{s.g.data(), {11}},
             strided, tide::tensor_view<float>{s.v.data(), {11}});
  }));
  CHECK(throws_usage([&] { k::adamw(ex, {.beta1 = 1.f}, 1, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adamw(ex, {.lr = -1e-3f}, 1, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adamw(ex, {}, 1, s.pv(), s.gv(), s.mv(), s.vv(), INFINITY); }));
  CHECK(throws_usage([&] { k::adamw(ex, {}, 1, s.pv(), s.gv(), s.mv(), s.vv(), NAN); }));
  // A list with a bad record anywhere is rejected before the good ones are stepped.
  std::vector<k::adamw_tensor<float>> list = {{s.p.data(), s.g.data(), s.m.data(), s.v.data(), nullptr, n},
                                              {nullptr, s.g.data(), s.m.data(), s.v.data(), nullptr, 4}};
  CHECK(throws_usage([&] { k::adamw(ex, {}, 1, list); }));
  list[1] = {s.p.data(), s.g.data(), s.m.data(), s.v.data(), nullptr, -1};
  CHECK(throws_usage([&] { k::adamw(ex, {}, 1, list); }));
  CHECK(s.p == before.p);
  CHECK(s.m == before.m);
  CHECK(s.v == before.v);
  // The message says what was asked.
  try {
    k::adamw(ex, {}, 0, s.pv(), s.gv(), s.mv(), s.vv());
  } catch (tide::error const& e) {
    CHECK(e.message().find("t = 0") != std::string::npos);
  }
}
