#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <tide/kernels/adam/adam.hpp>
#include <tide/kernels/adamw/adamw.hpp>

#include "support/optimizer_checks.hpp"

namespace {

namespace k = tide::kernels;
using tide::index_t;

using tide::test::contraction_slack;
using tide::test::throws_usage;
using tide::test::golden;
using tide::test::golden_run;
using tide::test::noise;
using tide::test::read_golden;
template <class Grad>
using state = tide::test::adam_state<Grad>;

// Host against reference on one tensor, with the tolerances the docs state. G = |g s| + wd |p|
// bounds the effective gradient g' and its terms:
//   g': may be contracted (fma(wd, p, g s)) in one and not the other: 2^-23 G.
//   m, v: contraction_slack of their terms, plus what the g' difference does (x2 on its terms).
//   p: 1 ulp of p, plus 2^-20 of lr |r|, r = m_hat / (sqrt(v_hat) + eps): the host scales by
//      rounded reciprocals of the bias corrections where the reference divides, so m_hat and
//      v_hat may differ by ~2^-22 relative and r by ~2^-21; plus what the m and v differences
//      above do to r.
template <class Grad, class Work>
void check_against_reference(index_t n, std::int64_t t, float grad_scale, unsigned seed) {
  k::adam_hparams const hp{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
  state<Grad> host(n, seed), ref(n, seed);
  state<Grad> const before(n, seed);
  std::vector<Work> work_host(static_cast<std::size_t>(n)), work_ref(static_cast<std::size_t>(n));
  tide::thread_pool pool{2};
  k::adam(tide::exec<tide::host>{pool}, hp, t, host.pv(), host.gv(), host.mv(), host.vv(),
          tide::tensor_view<Work>{work_host.data(), {n}}, grad_scale);
  k::reference::adam(hp, t, ref.pv(), ref.gv(), ref.mv(), ref.vv(), tide::tensor_view<Work>{work_ref.data(), {n}},
                     grad_scale);
  double const b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, wd = hp.weight_decay;
  double const rb1 = 1 / (1.0 - std::pow(b1, static_cast<double>(t)));
  double const rb2 = 1 / (1.0 - std::pow(b2, static_cast<double>(t)));
  for (index_t i = 0; i < n; ++i) {
    auto const u = static_cast<std::size_t>(i);
    double const G = std::abs(static_cast<double>(tide::to_float(before.g[u])) * grad_scale) +
                     wd * std::abs(before.p[u]);
    double const tol_m = contraction_slack * (b1 * std::abs(before.m[u]) + 2 * (1 - b1) * G);
    double const tol_v = 2 * contraction_slack * (b2 * before.v[u] + 2 * (1 - b2) * G * G);
    if (std::abs(static_cast<double>(host.m[u]) - ref.m[u]) > tol_m ||
        std::abs(static_cast<double>(host.v[u]) - ref.v[u]) > tol_v) {
      FAIL_CHECK("m[" << i << "] = " << host.m[u] << " (reference " << ref.m[u] << "), v[" << i << "] = " << host.v[u]
                      << " (reference " << ref.v[u] << "), tolerances " << tol_m << ", " << tol_v);
      break;
    }
    double const root = std::sqrt(ref.v[u] * rb2) + 1e-8;
    double const r = ref.m[u] * rb1 / root;
    double const tol = 0x1p-23 * std::max(std::abs(ref.p[u]), std::abs(host.p[u])) +
                       lr * (0x1p-20 * std::abs(r) + rb1 * tol_m / root +
                             std::abs(r) * tol_v / (2 * ref.v[u] + FLT_MIN)) +
                       FLT_TRUE_MIN;
    if (std::abs(static_cast<double>(host.p[u]) - ref.p[u]) > tol) {
      FAIL_CHECK("p[" << i << "] = " << host.p[u] << ", reference " << ref.p[u] << ", tolerance " << tol);
      break;
    }
    // The working copy is the dtype's rounding of the host's own new master weight, exactly.
    Work const rounded = tide::from_float<Work>(host.p[u]);
    if (std::memcmp(&work_host[u], &rounded, sizeof(Work)) != 0) {
      FAIL_CHECK("working[" << i << "] is not the rounding of p = " << host.p[u]);
      break;
    }
  }
}

// Tide's host Adam (kind 0) or AdamW (kind 1) against torch's, chained over the golden steps
// from the same start. Tolerances, in units u = 2^-24 of each quantity's terms, summed over the
// steps so far (each step adds its roundings; the recurrences carry earlier ones at most at
// full size since beta <= 1): both sides round each operation in float, in different orders
// (torch: m*b1 then +(1-b1) g, addcmul, sqrt(v) / sqrt(bc2) + eps, addcdiv by lr / bc1 in
// double; AdamW: p * (1 - lr wd) first; tide: math.hpp's order, reciprocal bias corrections,
// FMAs where g++ contracts), about 2 roundings per sum, 6 along p's update, and in v's g'^2
// term twice g''s own (2 roundings for Adam's g + wd p). k = 8 for m and the update, 16 for v,
// 4 for |p|. Worst |diff| measured with -march=native (FMA): Adam m 0.9 u, v 1.5 u, p 0.9 u;
// AdamW m, v bit-equal, p 1.8 u. With -march=x86-64 (no FMA): Adam m 2.4 u, v 5.6 u, p 0.7 u;
// AdamW m 1.6 u, v 1.8 u, p 1.8 u. So the bounds leave 2.8x or more.
void check_golden_adam(int kind) {
  golden const gold = read_golden();
  auto const it = std::find_if(gold.runs.begin(), gold.runs.end(), [&](golden_run const& r) { return r.kind == kind; });
  REQUIRE(it != gold.runs.end());
  golden_run const& run = *it;
  REQUIRE(run.states == 2);
  index_t const n = gold.n;
  auto const un = static_cast<std::size_t>(n);
  double const u = 0x1p-24, lr = run.lr, b1 = run.h1, b2 = run.h2, eps = run.h3, wd = run.weight_decay;
  std::vector<float> p = gold.p0, m(un, 0.f), v(un, 0.f);
  std::vector<double> sum_m(un, 0), sum_v(un, 0), sum_p(un, 0), sum_update(un, 0);
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  double worst_m = 0, worst_v = 0, worst_p = 0;
  for (int s = 0; s < gold.steps; ++s) {
    std::int64_t const t = s + 1;
    tide::tensor_view<float const> const g{gold.grads[static_cast<std::size_t>(s)].data(), {n}};
    if (kind == 0)
      k::adam(ex, {.lr = run.lr, .beta1 = run.h1, .beta2 = run.h2, .eps = run.h3, .weight_decay = run.weight_decay}, t,
              tide::tensor_view<float>{p.data(), {n}}, g, tide::tensor_view<float>{m.data(), {n}},
              tide::tensor_view<float>{v.data(), {n}});
    else
      k::adamw(ex, {.lr = run.lr, .beta1 = run.h1, .beta2 = run.h2, .eps = run.h3, .weight_decay = run.weight_decay},
               t, tide::tensor_view<float>{p.data(), {n}}, g, tide::tensor_view<float>{m.data(), {n}},
               tide::tensor_view<float>{v.data(), {n}});
    auto const& now = run.steps[static_cast<std::size_t>(s)];
    auto const& prev_p = s == 0 ? gold.p0 : run.steps[static_cast<std::size_t>(s) - 1][0];
    double const bc1 = 1 - std::pow(b1, static_cast<double>(t)), bc2 = 1 - std::pow(b2, static_cast<double>(t));
    for (std::size_t i = 0; i < un; ++i) {
      double const m_prev = s == 0 ? 0 : run.steps[static_cast<std::size_t>(s) - 1][1][i];
      double const v_prev = s == 0 ? 0 : run.steps[static_cast<std::size_t>(s) - 1][2][i];
      double const gp = std::abs(static_cast<double>(gold.grads[static_cast<std::size_t>(s)][i])) +
                        (kind == 0 ? wd * std::abs(prev_p[i]) : 0);
      double const root = std::sqrt(now[2][i] / bc2) + eps;
      double const r = std::abs(now[1][i]) / bc1 / root;
      sum_m[i] += b1 * std::abs(m_prev) + (1 - b1) * gp;
      sum_v[i] += b2 * v_prev + (1 - b2) * gp * gp;
      sum_p[i] += std::abs(prev_p[i]);
      sum_update[i] += lr * (r + (kind == 1 ? wd * std::abs(prev_p[i]) : 0));
      double const tol_m = 8 * u * sum_m[i], tol_v = 16 * u * sum_v[i];
      double const dm = std::abs(m[i] - static_cast<double>(now[1][i]));
      double const dv = std::abs(v[i] - static_cast<double>(now[2][i]));
      // What the m and v differences do to the update, on top of its own roundings.
      double const carried = lr * (tol_m / bc1 / root + r * tol_v / (2 * now[2][i] + FLT_MIN));
      double const tol_p = 4 * u * sum_p[i] + 8 * u * sum_update[i] + carried;
      double const dp = std::abs(p[i] - static_cast<double>(now[0][i]));
      worst_m = std::max(worst_m, dm / (u * sum_m[i]));
      worst_v = std::max(worst_v, dv / (u * sum_v[i] + FLT_MIN));
      worst_p = std::max(worst_p, dp / (u * (sum_p[i] + sum_update[i]) + carried));
      if (dm > tol_m || dv > tol_v || dp > tol_p) {
        FAIL_CHECK("step " << t << ", element " << i << ": p " << p[i] << " (torch " << now[0][i] << ", tolerance "
                           << tol_p << "), m " << m[i] << " (torch " << now[1][i] << ", tolerance " << tol_m << "), v "
                           << v[i] << " (torch " << now[2][i] << ", tolerance " << tol_v << ")");
        return;
      }
    }
  }
  std::string const name = kind == 0 ? "Adam" : "AdamW";
  MESSAGE(name << " vs torch, worst |diff| / tolerance unit: m " << worst_m << ", v " << worst_v << ", p " << worst_p);
  // The steps moved p by many tolerances: the comparison is not vacuous.
  CHECK(p != gold.p0);
}

}  // namespace

TEST_CASE("adam: host matches the reference, fp32 gradients, sizes that are not whole vectors") {
  for (index_t n : {1, 15, 17, 63, 773}) {
    CAPTURE(n);
    check_against_reference<float, tide::bf16>(n, 1, 1.f, 7u);
    check_against_reference<float, tide::bf16>(n, 7, 0.5f, 8u);
  }
  check_against_reference<float, tide::bf16>(1000003, 2, 0.5f, 9u);
}

TEST_CASE("adam: bf16 and f16 gradients and working copies (gradients widen exactly, so fp32 tolerances)") {
  for (index_t n : {1, 17, 4099}) {
    CAPTURE(n);
    check_against_reference<tide::bf16, tide::bf16>(n, 3, 1.f, 11u);
    check_against_reference<tide::f16, tide::f16>(n, 3, 0.25f, 12u);
    check_against_reference<tide::bf16, tide::f16>(n, 1000, 2.f, 13u);
    check_against_reference<float, float>(n, 4, 1.f, 14u);
  }
}

TEST_CASE("adam: bit-identical for 1, 2 and 3 threads") {
  k::adam_hparams const hp{.lr = 3e-4f, .weight_decay = 0.1f};
  auto const steps = [&](auto const& ex, auto& s, auto w) {
    for (std::int64_t t = 1; t <= 2; ++t) k::adam(ex, hp, t, s.pv(), s.gv(), s.mv(), s.vv(), w, 0.75f);
  };
  tide::test::check_thread_count_identity<state<tide::bf16>, tide::bf16>(200003, 21u, steps);
}

TEST_CASE("adam: a tensor list gives the same bits as the same data as one flat chunk") {
  std::vector<index_t> const sizes = {1, 0, 15, 17, (index_t{1} << 14) + 3, 40000, 2};
  index_t total = 0;
  for (index_t s : sizes) total += s;
  state<float> listed(total, 31u), flat(total, 31u);
  std::vector<tide::bf16> w_list(static_cast<std::size_t>(total)), w_flat(static_cast<std::size_t>(total));
  std::vector<k::adam_tensor<float, tide::bf16>> list;
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
  k::adam_hparams const hp{.lr = 1e-3f, .weight_decay = 0.05f};
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  k::adam(ex, hp, 5, list, 0.5f);
  k::adam(ex, hp, 5, flat.pv(), flat.gv(), flat.mv(), flat.vv(), tide::tensor_view<tide::bf16>{w_flat.data(), {total}},
          0.5f);
  CHECK(listed.p == flat.p);
  CHECK(listed.m == flat.m);
  CHECK(listed.v == flat.v);
  CHECK(std::memcmp(w_list.data(), w_flat.data(), sizeof(tide::bf16) * total) == 0);
  CHECK(listed.p != state<float>(total, 31u).p);
}

TEST_CASE("adam: without weight decay it is AdamW without weight decay, bit for bit (shared math)") {
  index_t const n = 5003;
  state<tide::bf16> a(n, 71u), w(n, 71u);
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  for (std::int64_t t = 1; t <= 3; ++t) {
    k::adam(ex, {.lr = 1e-2f, .weight_decay = 0.f}, t, a.pv(), a.gv(), a.mv(), a.vv(), 0.5f);
    k::adamw(ex, {.lr = 1e-2f, .weight_decay = 0.f}, t, w.pv(), w.gv(), w.mv(), w.vv(), 0.5f);
  }
  CHECK(a.p == w.p);
  CHECK(a.m == w.m);
  CHECK(a.v == w.v);
  // With decay they differ: L2 goes through m and v, AdamW's decay does not.
  state<tide::bf16> l2(n, 71u), decoupled(n, 71u);
  k::adam(ex, {.lr = 1e-2f, .weight_decay = 0.1f}, 1, l2.pv(), l2.gv(), l2.mv(), l2.vv());
  k::adamw(ex, {.lr = 1e-2f, .weight_decay = 0.1f}, 1, decoupled.pv(), decoupled.gv(), decoupled.mv(),
           decoupled.vv());
  CHECK(l2.m != decoupled.m);
  CHECK(l2.p != decoupled.p);
  state<tide::bf16> no_decay(n, 71u);
  k::adamw(ex, {.lr = 1e-2f, .weight_decay = 0.f}, 1, no_decay.pv(), no_decay.gv(), no_decay.mv(), no_decay.vv());
  CHECK(decoupled.m == no_decay.m);
}

TEST_CASE("adam: grad_scale multiplies the gradient before the decay is added") {
  // Scaling by a power of two is exact, so scale 0.25 on g equals scale 1 on g / 4, bit for bit,
  // with the decay term wd * p unscaled in both.
  index_t const n = 1001;
  state<float> scaled(n, 41u), divided(n, 41u);
  for (float& x : divided.g) x *= 0.25f;
  tide::thread_pool pool{1};
  tide::exec<tide::host> const ex{pool};
  k::adam_hparams const hp{.weight_decay = 0.3f};
  k::adam(ex, hp, 2, scaled.pv(), scaled.gv(), scaled.mv(), scaled.vv(), 0.25f);
  k::adam(ex, hp, 2, divided.pv(), divided.gv(), divided.mv(), divided.vv());
  CHECK(scaled.p == divided.p);
  CHECK(scaled.m == divided.m);
  CHECK(scaled.v == divided.v);
}

TEST_CASE("adam: 5 steps follow torch.optim.Adam (L2 weight decay), float32 golden file") { check_golden_adam(0); }

TEST_CASE("adamw: 5 steps follow torch.optim.AdamW, float32 golden file") { check_golden_adam(1); }

TEST_CASE("adam: bad input throws tide::error(usage) and changes nothing") {
  index_t const n = 33;
  state<float> s(n, 61u), shorter(n - 1, 61u);
  state<float> const before = s;
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  CHECK(throws_usage([&] { k::adam(ex, {}, 0, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adam(ex, {}, -3, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adam(ex, {}, 1, s.pv(), shorter.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adam(ex, {}, 1, s.pv(), s.gv(), shorter.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adam(ex, {}, 1, s.pv(), s.gv(), s.mv(), shorter.vv()); }));
  std::vector<tide::bf16> w(static_cast<std::size_t>(n - 1));
  CHECK(throws_usage([&] {
    k::adam(ex, {}, 1, s.pv(), s.gv(), s.mv(), s.vv(), tide::tensor_view<tide::bf16>{w.data(), {n - 1}});
  }));
  // Same element count, different shape; and a strided view.
  CHECK(throws_usage([&] {
    k::adam(ex, {}, 1, s.pv(), tide::tensor_view<float const>{s.g.data(), {3, 11}}, s.mv(), s.vv());
  }));
  tide::tensor_view<float> const strided{s.m.data(), {11}, {3, 1, 1, 1}};
  CHECK(throws_usage([&] {
    k::adam(ex, {}, 1, tide::tensor_view<float>{s.p.data(), {11}}, tide::tensor_view<float const>{s.g.data(), {11}},
            strided, tide::tensor_view<float>{s.v.data(), {11}});
  }));
  CHECK(throws_usage([&] { k::adam(ex, {.beta1 = 1.f}, 1, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adam(ex, {.beta2 = -0.5f}, 1, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adam(ex, {.lr = -1e-3f}, 1, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adam(ex, {.eps = NAN}, 1, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adam(ex, {.weight_decay = -0.1f}, 1, s.pv(), s.gv(), s.mv(), s.vv()); }));
  CHECK(throws_usage([&] { k::adam(ex, {}, 1, s.pv(), s.gv(), s.mv(), s.vv(), INFINITY); }));
  CHECK(throws_usage([&] { k::adam(ex, {}, 1, s.pv(), s.gv(), s.mv(), s.vv(), NAN); }));
  // A list with a bad record anywhere is rejected before the good ones are stepped.
  std::vector<k::adam_tensor<float>> list = {{s.p.data(), s.g.data(), s.m.data(), s.v.data(), nullptr, n},
                                             {s.p.data(), s.g.data(), s.m.data(), nullptr, nullptr, 4}};
  CHECK(throws_usage([&] { k::adam(ex, {}, 1, list); }));
  list[1] = {s.p.data(), s.g.data(), s.m.data(), s.v.data(), nullptr, -1};
  CHECK(throws_usage([&] { k::adam(ex, {}, 1, list); }));
  CHECK(s.p == before.p);
  CHECK(s.m == before.m);
  CHECK(s.v == before.v);
  // The messages name the kernel and say what was asked.
  try {
    k::adam(ex, {}, 0, s.pv(), s.gv(), s.mv(), s.vv());
    FAIL("t = 0 was accepted");
  } catch (tide::error const& e) {
    CHECK(e.message().find("adam step t is 1-based, got t = 0") != std::string::npos);
  }
}
