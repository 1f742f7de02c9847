#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <tide/kernels/sgd/sgd.hpp>

#include "support/optimizer_checks.hpp"

namespace {

namespace k = tide::kernels;
using tide::index_t;

using tide::test::contraction_slack;
using tide::test::throws_usage;
using tide::test::golden;
using tide::test::golden_run;
using tide::test::read_golden;
template <class Grad>
using state = tide::test::sgd_state<Grad>;

// The three shapes of the update torch.optim.SGD has, plus plain SGD.
k::sgd_hparams const nesterov{.lr = 0.05f, .momentum = 0.9f, .dampening = 0.f, .weight_decay = 0.01f, .nesterov = true};
k::sgd_hparams const damped{.lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 0.01f};
k::sgd_hparams const heavy_ball{.lr = 0.1f, .momentum = 0.5f, .weight_decay = 0.f};
k::sgd_hparams const plain{.lr = 0.05f, .momentum = 0.f, .weight_decay = 0.01f};

// Host against reference on one tensor. Both run the same operations in float, so they are
// bit-identical unless a sum is contracted into an FMA in one and not the other; each sum then
// differs by contraction_slack / 2 of its terms, and carries what its inputs' differences were:
//   d = g s + wd p:                  D = |g s| + wd |p|
//   buf = mom buf + (1 - damp) d:    B = mom |buf| + |1 - damp| D (D at t == 1), slack B
//   d' = d + mom buf (Nesterov) / buf / d:  U, slack (U + mom B)
//   p - lr d':                       slack / 2 (|p| + lr U) + lr slack (U + mom B)
template <class Grad, class Work>
void check_against_reference(k::sgd_hparams const& hp, index_t n, std::int64_t t, float grad_scale, unsigned seed) {
  state<Grad> host(n, seed), ref(n, seed);
  state<Grad> const before(n, seed);
  std::vector<Work> work_host(static_cast<std::size_t>(n)), work_ref(static_cast<std::size_t>(n));
  tide::thread_pool pool{2};
  k::sgd(tide::exec<tide::host>{pool}, hp, t, host.pv(), host.gv(), host.bv(),
         tide::tensor_view<Work>{work_host.data(), {n}}, grad_scale);
  k::reference::sgd(hp, t, ref.pv(), ref.gv(), ref.bv(), tide::tensor_view<Work>{work_ref.data(), {n}}, grad_scale);
  bool const momentum = hp.momentum != 0.f;
  double const mom = hp.momentum, lr = hp.lr;
  for (index_t i = 0; i < n; ++i) {
    auto const u = static_cast<std::size_t>(i);
    double const D = std::abs(static_cast<double>(tide::to_float(before.g[u])) * grad_scale) +
                     hp.weight_decay * std::abs(before.p[u]);
    double const B = t == 1 ? D : mom * std::abs(before.buf[u]) + std::abs(1.0 - hp.dampening) * D;
    double const U = !momentum ? D : hp.nesterov ? D + mom * B : B;
    double const tol_buf = contraction_slack * B;
    double const tol_p = contraction_slack * (0.5 * (std::abs(before.p[u]) + lr * U) + lr * (U + mom * B));
    double const dbuf = std::abs(static_cast<double>(host.buf[u]) - ref.buf[u]);
    double const dp = std::abs(static_cast<double>(host.p[u]) - ref.p[u]);
    if (dbuf > tol_buf || dp > tol_p) {
      FAIL_CHECK("p[" << i << "] = " << host.p[u] << " (reference " << ref.p[u] << ", tolerance " << tol_p << "), buf["
                      << i << "] = " << host.buf[u] << " (reference " << ref.buf[u] << ", tolerance " << tol_buf
                      << ")");
      break;
    }
    // The working copy is the dtype's rounding of the host's own new master weight, exactly.
    Work const rounded = tide::from_float<Work>(host.p[u]);
    if (std::memcmp(&work_host[u], &rounded, sizeof(Work)) != 0) {
      FAIL_CHECK("working[" << i << "] is not the rounding of p = " << host.p[u]);
      break;
    }
  }
  CHECK(host.p != before.p);
  // Without momentum the buffer is neither read nor written.
  if (!momentum) CHECK(std::memcmp(host.buf.data(), before.buf.data(), sizeof(float) * n) == 0);
}

// Tide's host SGD against torch's, chained over the golden steps from the same start, for one
// golden run. Tolerances in units u = 2^-24 of each quantity's terms (D, B, U as in
// check_against_reference, from torch's previous state): torch rounds d = g + wd p (add_ with
// alpha), buf * mom then + (1 - damp) d, d + mom buf, p - lr d' one operation at a time or
// fused, tide in math.hpp's order with FMAs where g++ contracts: at most 2 roundings per sum.
// Differences carry to later steps: buf's through mom <= 1 and into p through lr (1 + mom); p's
// into d through wd. k = 8 per step's own terms. Measured against torch 1.13's CPU build (see
// the MESSAGE lines): with -march=native (FMA) all three runs bit-identical; with -march=x86-64
// (no FMA, so tide rounds each product) worst buf 1.9 u, p 1.6 u. The bound leaves 4x.
void check_golden_sgd(golden const& gold, golden_run const& run) {
  REQUIRE(run.kind == 2);
  bool const momentum = run.h1 != 0.f;
  REQUIRE(run.states == (momentum ? 1 : 0));
  k::sgd_hparams const hp{
      .lr = run.lr, .momentum = run.h1, .dampening = run.h2, .weight_decay = run.weight_decay, .nesterov = run.nesterov != 0};
  index_t const n = gold.n;
  auto const un = static_cast<std::size_t>(n);
  double const u = 0x1p-24, lr = hp.lr, mom = hp.momentum, wd = hp.weight_decay;
  std::vector<float> p = gold.p0, buf;
  if (momentum) buf.assign(un, NAN);  // t == 1 must not read it
  std::vector<double> tol_buf(un, 0), tol_p(un, 0), unit_buf(un, 0), unit_p(un, 0);
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  double worst_buf = 0, worst_p = 0;
  for (int s = 0; s < gold.steps; ++s) {
    std::int64_t const t = s + 1;
    auto const us = static_cast<std::size_t>(s);
    k::sgd(ex, hp, t, tide::tensor_view<float>{p.data(), {n}}, tide::tensor_view<float const>{gold.grads[us].data(), {n}},
           momentum ? tide::tensor_view<float>{buf.data(), {n}} : tide::tensor_view<float>{});
    auto const& now = run.steps[us];
    auto const& prev_p = s == 0 ? gold.p0 : run.steps[us - 1][0];
    for (std::size_t i = 0; i < un; ++i) {
      double const D = std::abs(static_cast<double>(gold.grads[us][i])) + wd * std::abs(prev_p[i]);
      double const B = !momentum ? 0 : t == 1 ? D : mom * std::abs(run.steps[us - 1][1][i]) + (1 - run.h2) * D;
      double const U = !momentum ? D : hp.nesterov ? D + mom * B : B;
      unit_buf[i] = mom * unit_buf[i] + u * B + wd * unit_p[i];
      tol_buf[i] = mom * tol_buf[i] + 8 * u * B + wd * tol_p[i];
      unit_p[i] += u * (std::abs(prev_p[i]) + lr * (U + mom * B)) + lr * (1 + mom) * unit_buf[i];
      tol_p[i] += 8 * u * (std::abs(prev_p[i]) + lr * (U + mom * B)) + lr * (1 + mom) * tol_buf[i];
      double const dp = std::abs(p[i] - static_cast<double>(now[0][i]));
      double const dbuf = momentum ? std::abs(buf[i] - static_cast<double>(now[1][i])) : 0;
      worst_p = std::max(worst_p, dp / unit_p[i]);
      if (momentum) worst_buf = std::max(worst_buf, dbuf / unit_buf[i]);
      if (dp > tol_p[i] || dbuf > tol_buf[i]) {
        FAIL_CHECK("step " << t << ", element " << i << ": p " << p[i] << " (torch " << now[0][i] << ", tolerance "
                           << tol_p[i] << "), buf " << (momentum ? buf[i] : 0.f) << " (torch "
                           << (momentum ? now[1][i] : 0.f) << ", tolerance " << tol_buf[i] << ")");
        return;
      }
    }
  }
  MESSAGE("SGD momentum " << hp.momentum << ", dampening " << hp.dampening << ", nesterov " << hp.nesterov
                          << " vs torch, worst |diff| / tolerance unit: buf " << worst_buf << ", p " << worst_p);
  CHECK(p != gold.p0);
}

}  // namespace

TEST_CASE("sgd: host matches the reference for each momentum form, sizes that are not whole vectors") {
  for (index_t n : {1, 15, 17, 63, 773}) {
    CAPTURE(n);
    for (k::sgd_hparams const& hp : {nesterov, damped, heavy_ball, plain}) {
      CAPTURE(hp.momentum);
      CAPTURE(hp.nesterov);
      check_against_reference<float, tide::bf16>(hp, n, 1, 1.f, 7u);
      check_against_reference<float, tide::bf16>(hp, n, 7, 0.5f, 8u);
    }
  }
  check_against_reference<float, tide::bf16>(damped, 1000003, 2, 0.5f, 9u);
}

TEST_CASE("sgd: bf16 and f16 gradients and working copies (gradients widen exactly, so fp32 tolerances)") {
  for (index_t n : {1, 17, 4099}) {
    CAPTURE(n);
    check_against_reference<tide::bf16, tide::bf16>(nesterov, n, 3, 1.f, 11u);
    check_against_reference<tide::f16, tide::f16>(damped, n, 3, 0.25f, 12u);
    check_against_reference<tide::bf16, tide::f16>(plain, n, 1000, 2.f, 13u);
    check_against_reference<float, float>(heavy_ball, n, 1, 1.f, 14u);
  }
}

TEST_CASE("sgd: bit-identical for 1, 2 and 3 threads") {
  auto const steps = [&](auto const& ex, auto& s, auto w) {
    for (std::int64_t t = 1; t <= 3; ++t) k::sgd(ex, t == 3 ? damped : nesterov, t, s.pv(), s.gv(), s.bv(), w, 0.75f);
  };
  tide::test::check_thread_count_identity<state<tide::bf16>, tide::bf16>(200003, 21u, steps);
}

TEST_CASE("sgd: a tensor list gives the same bits as the same data as one flat chunk") {
  std::vector<index_t> const sizes = {1, 0, 15, 17, (index_t{1} << 14) + 3, 40000, 2};
  index_t total = 0;
  for (index_t s : sizes) total += s;
  for (k::sgd_hparams const& hp : {nesterov, plain}) {
    CAPTURE(hp.momentum);
    bool const momentum = hp.momentum != 0.f;
    state<float> listed(total, 31u), flat(total, 31u);
    std::vector<tide::bf16> w_list(static_cast<std::size_t>(total)), w_flat(static_cast<std::size_t>(total));
    std::vector<k::sgd_tensor<float, tide::bf16>> list;
    index_t at = 0;
    for (index_t s : sizes) {
      // The zero-size tensor has null pointers: allowed, it has no elements. Without momentum
      // the buffers may be null too.
      if (s == 0)
        list.push_back({});
      else
        list.push_back({listed.p.data() + at, listed.g.data() + at, momentum ? listed.buf.data() + at : nullptr,
                        w_list.data() + at, s});
      at += s;
    }
    tide::thread_pool pool{2};
    tide::exec<tide::host> const ex{pool};
    k::sgd(ex, hp, 5, list, 0.5f);
    k::sgd(ex, hp, 5, flat.pv(), flat.gv(), momentum ? flat.bv() : tide::tensor_view<float>{},
           tide::tensor_view<tide::bf16>{w_flat.data(), {total}}, 0.5f);
    CHECK(listed.p == flat.p);
    CHECK(listed.buf == flat.buf);
    CHECK(std::memcmp(w_list.data(), w_flat.data(), sizeof(tide::bf16) * total) == 0);
    CHECK(listed.p != state<float>(total, 31u).p);
  }
}

TEST_CASE("sgd: prev arrays get the values from before the step, the buffer too when momentum leaves it alone") {
  index_t const n = (index_t{1} << 14) + 21;
  for (k::sgd_hparams const& hp : {nesterov, plain}) {
    CAPTURE(hp.momentum);
    state<float> kept(n, 51u), other(n, 51u);
    state<float> const before(n, 51u);
    std::vector<float> pp(static_cast<std::size_t>(n), -3.f), pb = pp;
    std::vector<k::sgd_tensor<float, float>> const with = {
        {kept.p.data(), kept.g.data(), kept.buf.data(), nullptr, n, pp.data(), pb.data(), nullptr}};
    std::vector<k::sgd_tensor<float, float>> const without = {{other.p.data(), other.g.data(), other.buf.data(), nullptr, n}};
    tide::thread_pool pool{2};
    tide::exec<tide::host> const ex{pool};
    k::sgd(ex, hp, 2, with, 1.f);
    k::sgd(ex, hp, 2, without, 1.f);
    CHECK(pp == before.p);
    CHECK(pb == before.buf);  // without momentum the buffer is unused, and still kept as it was
    CHECK(kept.p == other.p);
    CHECK(kept.buf == other.buf);
    CHECK(kept.p != before.p);
  }
}

TEST_CASE("sgd: read from sources, the step writes the in-place result elsewhere, the unused buffer too") {
  index_t const n = (index_t{1} << 14) + 1037;
  auto const count = static_cast<std::size_t>(n);
  for (k::sgd_hparams const& hp : {nesterov, plain}) {
    CAPTURE(hp.momentum);
    state<float> in_place(n, 53u), src(n, 53u);
    state<float> const before(n, 53u);
    std::vector<float> np(count, NAN), nb = np;
    std::vector<k::sgd_tensor<float, float>> const from = {{np.data(), src.g.data(), nb.data(), nullptr, n, nullptr,
                                                            nullptr, nullptr, src.p.data(), src.buf.data()}};
    tide::thread_pool pool{2};
    tide::exec<tide::host> const ex{pool};
    k::sgd(ex, hp, 2, from, 1.f);
    k::sgd(ex, hp, 2, in_place.pv(), in_place.gv(), in_place.bv());
    CHECK(np == in_place.p);
    CHECK(nb == in_place.buf);  // without momentum: the buffer as it was, copied
    CHECK(src.p == before.p);
    CHECK(src.buf == before.buf);
    CHECK(np != before.p);
  }
}

TEST_CASE("sgd: step 1 starts the buffer as the gradient, whatever it held") {
  index_t const n = 1001;
  state<float> garbage(n, 41u), zeros(n, 41u);
  std::fill(garbage.buf.begin(), garbage.buf.end(), NAN);
  std::fill(zeros.buf.begin(), zeros.buf.end(), 0.f);
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  k::sgd(ex, damped, 1, garbage.pv(), garbage.gv(), garbage.bv());
  k::sgd(ex, damped, 1, zeros.pv(), zeros.gv(), zeros.bv());
  CHECK(garbage.p == zeros.p);
  CHECK(garbage.buf == zeros.buf);
  // Dampening does not apply on step 1 (torch clones d_p): buf = g + wd p, exactly as the
  // reference rounds it.
  state<float> const before(n, 41u);
  std::vector<float> expect_p = before.p, expect_buf(static_cast<std::size_t>(n));
  k::reference::sgd(damped, 1, tide::tensor_view<float>{expect_p.data(), {n}}, before.gv(),
                    tide::tensor_view<float>{expect_buf.data(), {n}});
  for (index_t i = 0; i < n; ++i) {
    auto const u = static_cast<std::size_t>(i);
    double const d = static_cast<double>(before.g[u]) + damped.weight_decay * static_cast<double>(before.p[u]);
    if (std::abs(zeros.buf[u] - d) > 0x1p-23 * (std::abs(before.g[u]) + 1)) {
      FAIL_CHECK("buf[" << i << "] = " << zeros.buf[u] << ", expected g + wd p = " << d);
      break;
    }
  }
}

TEST_CASE("sgd: grad_scale multiplies the gradient before the decay is added") {
  // Scaling by a power of two is exact, so scale 0.25 on g equals scale 1 on g / 4, bit for bit.
  index_t const n = 1001;
  state<float> scaled(n, 51u), divided(n, 51u);
  for (float& x : divided.g) x *= 0.25f;
  tide::thread_pool pool{1};
  tide::exec<tide::host> const ex{pool};
  k::sgd(ex, nesterov, 2, scaled.pv(), scaled.gv(), scaled.bv(), 0.25f);
  k::sgd(ex, nesterov, 2, divided.pv(), divided.gv(), divided.bv());
  CHECK(scaled.p == divided.p);
  CHECK(scaled.buf == divided.buf);
}

TEST_CASE("sgd: 5 steps follow torch.optim.SGD (Nesterov, dampening, no momentum), float32 golden file") {
  golden const gold = read_golden();
  int checked = 0;
  for (golden_run const& run : gold.runs) {
    if (run.kind != 2) continue;
    CAPTURE(run.h1);
    CAPTURE(run.h2);
    CAPTURE(run.nesterov);
    check_golden_sgd(gold, run);
    ++checked;
  }
  CHECK(checked == 3);
}

TEST_CASE("sgd: bad input throws tide::error(usage) and changes nothing") {
  index_t const n = 33;
  state<float> s(n, 61u), shorter(n - 1, 61u);
  state<float> const before = s;
  tide::thread_pool pool{2};
  tide::exec<tide::host> const ex{pool};
  k::sgd_hparams const ok = damped;
  CHECK(throws_usage([&] { k::sgd(ex, ok, 0, s.pv(), s.gv(), s.bv()); }));
  CHECK(throws_usage([&] { k::sgd(ex, ok, -3, s.pv(), s.gv(), s.bv()); }));
  CHECK(throws_usage([&] { k::sgd(ex, ok, 1, s.pv(), shorter.gv(), s.bv()); }));
  CHECK(throws_usage([&] { k::sgd(ex, ok, 1, s.pv(), s.gv(), shorter.bv()); }));
  // Momentum needs a buffer; without momentum a wrong-sized one is still a mistake.
  CHECK(throws_usage([&] { k::sgd(ex, ok, 1, s.pv(), s.gv(), tide::tensor_view<float>{}); }));
  CHECK(throws_usage([&] { k::sgd(ex, plain, 1, s.pv(), s.gv(), shorter.bv()); }));
  std::vector<tide::bf16> w(static_cast<std::size_t>(n - 1));
  CHECK(throws_usage([&] { k::sgd(ex, ok, 1, s.pv(), s.gv(), s.bv(), tide::tensor_view<tide::bf16>{w.data(), {n - 1}}); }));
  // Same element count, different shape; and a strided view.
  CHECK(throws_usage([&] { k::sgd(ex, ok, 1, s.pv(), tide::tensor_view<float const>{s.g.data(), {3, 11}}, s.bv()); }));
  tide::tensor_view<float> const strided{s.buf.data(), {11}, {3, 1, 1, 1}};
  CHECK(throws_usage([&] {
    k::sgd(ex, ok, 1, tide::tensor_view<float>{s.p.data(), {11}}, tide::tensor_view<float const>{s.g.data(), {11}},
           strided);
  }));
  // Hyper-parameters torch.optim.SGD rejects, and non-finite ones.
  CHECK(throws_usage([&] { k::sgd(ex, {.lr = -0.1f}, 1, s.pv(), s.gv(), s.bv()); }));
  CHECK(throws_usage([&] { k::sgd(ex, {.lr = NAN}, 1, s.pv(), s.gv(), s.bv()); }));
  CHECK(throws_usage([&] { k::sgd(ex, {.momentum = -0.9f}, 1, s.pv(), s.gv(), s.bv()); }));
  CHECK(throws_usage([&] { k::sgd(ex, {.momentum = 0.9f, .dampening = INFINITY}, 1, s.pv(), s.gv(), s.bv()); }));
  CHECK(throws_usage([&] { k::sgd(ex, {.weight_decay = -1e-4f}, 1, s.pv(), s.gv(), s.bv()); }));
  CHECK(throws_usage([&] { k::sgd(ex, {.momentum = 0.f, .nesterov = true}, 1, s.pv(), s.gv(), s.bv()); }));
  CHECK(throws_usage([&] { k::sgd(ex, {.momentum = 0.9f, .dampening = 0.1f, .nesterov = true}, 1, s.pv(), s.gv(), s.bv()); }));
  CHECK(throws_usage([&] { k::sgd(ex, ok, 1, s.pv(), s.gv(), s.bv(), INFINITY); }));
  CHECK(throws_usage([&] { k::sgd(ex, ok, 1, s.pv(), s.gv(), s.bv(), NAN); }));
  // A list with a bad record anywhere is rejected before the good ones are stepped.
  std::vector<k::sgd_tensor<float>> list = {{s.p.data(), s.g.data(), s.buf.data(), nullptr, n},
                                            {s.p.data(), s.g.data(), nullptr, nullptr, 4}};
  CHECK(throws_usage([&] { k::sgd(ex, ok, 2, list); }));  // null buf with momentum
  list[1] = {s.p.data(), nullptr, s.buf.data(), nullptr, 4};
  CHECK(throws_usage([&] { k::sgd(ex, plain, 2, list); }));
  list[1] = {s.p.data(), s.g.data(), s.buf.data(), nullptr, -1};
  CHECK(throws_usage([&] { k::sgd(ex, ok, 2, list); }));
  CHECK(s.p == before.p);
  CHECK(s.buf == before.buf);
  // The messages say what was asked.
  try {
    k::sgd(ex, {.momentum = 0.9f, .dampening = 0.1f, .nesterov = true}, 1, s.pv(), s.gv(), s.bv());
    FAIL("nesterov with dampening was accepted");
  } catch (tide::error const& e) {
    CHECK(e.message().find("nesterov needs momentum > 0 and dampening == 0") != std::string::npos);
  }
  // A null buf is fine without momentum (nothing reads it). The second record has its own
  // elements: records that overlap would be stepped by two threads at once.
  std::vector<float> p2(4, 1.f), g2(4, 0.5f);
  list[1] = {p2.data(), g2.data(), nullptr, nullptr, 4};
  CHECK_NOTHROW(k::sgd(ex, plain, 2, list));
  CHECK(p2[0] != 1.f);  // it was stepped
}
