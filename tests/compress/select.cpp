// The selectors of compress/select.hpp against a full sort: exact_topk and trimmed_topk choose
// exactly its top-k (ties to the lower index); threshold_search and sampled_threshold choose
// between k and 2k elements that hold it; tracked_topk chooses exact_topk's, cold, warm and after a
// jump; every selector but random_k contracts
// (‖x − x_S‖² <= (1 − k/d)‖x‖²); every choice is the same for 1, 2 and 3 threads and on a rerun.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <set>
#include <span>
#include <vector>

#include "tide/compress/select.hpp"

namespace {

namespace cx = tide::compress;

// n values with many equal magnitudes (a quarter of them on a grid of 64 levels) and both signs.
std::vector<float> values(std::size_t n, std::uint32_t seed) {
  std::vector<float> x(n);
  std::uint32_t s = seed;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    float const u = static_cast<float>(s >> 8) / 16777216.f;  // [0, 1)
    float v = std::pow(u, 3.f) * 4.f;                           // heavy tail near 0
    if ((s & 3u) == 0) v = std::floor(u * 64.f) / 64.f;         // ties
    x[i] = (s & 16u) != 0 ? -v : v;
  }
  return x;
}

// The top-k by a full sort: |x| descending, then index ascending; returned ascending.
std::vector<std::uint32_t> sorted_topk(std::span<float const> x, std::size_t k) {
  std::vector<std::uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::ranges::sort(idx, [&](std::uint32_t a, std::uint32_t b) {
    auto const ka = cx::abs_key(x[a]), kb = cx::abs_key(x[b]);
    return ka != kb ? ka > kb : a < b;
  });
  idx.resize(std::min(k, x.size()));
  std::ranges::sort(idx);
  return idx;
}

template <class S>
std::vector<std::uint32_t> run(S& sel, int threads, std::span<float const> x, std::size_t k) {
  tide::thread_pool pool(threads);
  tide::exec<tide::host> const ex{pool};
  std::vector<std::uint32_t> out(S::capacity(k) + 1, 0xdeadbeefu);
  std::size_t const m = sel.select(ex, x, k, std::span(out).first(std::min(S::capacity(k), x.size())));
  CHECK(out[std::min(S::capacity(k), x.size())] == 0xdeadbeefu);  // nothing written past capacity
  out.resize(m);
  return out;
}

bool ascending_distinct(std::vector<std::uint32_t> const& v, std::size_t n) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] >= n || (i > 0 && v[i] <= v[i - 1])) return false;
  return true;
}

// ‖x − x_S‖² <= (1 − k/d)‖x‖², in double, with a rounding's slack.
bool contracts(std::span<float const> x, std::vector<std::uint32_t> const& sel, std::size_t k) {
  double all = 0, kept = 0;
  for (float v : x) all += double(v) * double(v);
  for (std::uint32_t i : sel) kept += double(x[i]) * double(x[i]);
  double const d = static_cast<double>(x.size());
  return all - kept <= (1.0 - static_cast<double>(k) / d) * all * (1 + 1e-12) + 1e-30;
}

bool holds(std::vector<std::uint32_t> const& sel, std::vector<std::uint32_t> const& top) {
  return std::ranges::includes(sel, top);
}

}  // namespace

TEST_CASE("exact_topk and trimmed_topk choose the full sort's top-k, ties to the lower index, for any thread count") {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{10007}, std::size_t{70001}}) {
    auto const x = values(n, static_cast<std::uint32_t>(n));
    for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{10}, n / 100, n / 3, n - 1, n, n + 5}) {
      CAPTURE(n);
      CAPTURE(k);
      auto const want = sorted_topk(x, k);
      for (int threads : {1, 2, 3}) {
        CAPTURE(threads);
        cx::exact_topk e;
        cx::trimmed_topk t;
        auto const a = run(e, threads, x, k), b = run(t, threads, x, k);
        CHECK(a == want);
        CHECK(b == want);
        CHECK(contracts(x, a, std::min(k, n)));
      }
    }
  }
}

TEST_CASE("threshold_search and sampled_threshold send k to 2k elements that hold the top-k") {
  std::size_t const n = 70001;
  auto const x = values(n, 5);
  for (std::size_t k : {std::size_t{1}, std::size_t{7}, std::size_t{70}, std::size_t{700}, std::size_t{7000}, n / 2 + 1}) {
    CAPTURE(k);
    auto const top = sorted_topk(x, k);
    std::vector<std::uint32_t> first;
    for (int threads : {1, 2, 3}) {
      CAPTURE(threads);
      cx::threshold_search t;
      cx::sampled_threshold s;
      auto const a = run(t, threads, x, k), b = run(s, threads, x, k);
      for (auto const* v : {&a, &b}) {
        CHECK(v->size() >= k);
        CHECK(v->size() <= 2 * k);
        CHECK(ascending_distinct(*v, n));
        CHECK(holds(*v, top));
        CHECK(contracts(x, *v, k));
      }
      if (threads == 1) first = a;
      CHECK(a == first);  // the same τ for any thread count: the mean is summed over fixed blocks
      // The next call on the same residual starts from the last τ and takes one probe.
      if (2 * k < n) {
        CHECK(run(t, threads, x, k) == a);
        CHECK(t.probes == 1);
      }
    }
  }
}

TEST_CASE("tracked_topk chooses exact_topk's indices cold, warm, and when the residual jumps, for any thread count") {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{10007}, std::size_t{70001}}) {
    auto const x = values(n, static_cast<std::uint32_t>(n) + 1);
    // The same residual scaled up and down 1000x, another residual, then x again: the guard the
    // last call left is far off each time and has to move.
    std::vector<float> up(x), down(x);
    for (float& v : up) v *= 1000.f;
    for (float& v : down) v *= 1e-3f;
    auto const other = values(n, 77);
    for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{10}, n / 100, n / 3, n}) {
      CAPTURE(n);
      CAPTURE(k);
      for (int threads : {1, 2, 3}) {
        CAPTURE(threads);
        cx::tracked_topk t;
        for (std::vector<float> const* in : std::initializer_list<std::vector<float> const*>{&x, &x, &up, &down, &other, &x}) {
          cx::exact_topk e;
          CHECK(run(t, threads, *in, k) == run(e, threads, *in, k));
        }
      }
    }
  }
  // Warm on a residual that changes as error feedback's does (the top k sent, a new gradient
  // added): one keeping pass a call once the guard has the residual's shape.
  std::size_t const n = 70001, k = 700;
  auto x = values(n, 3);
  cx::tracked_topk t;
  for (std::uint32_t step = 0; step < 8; ++step) {
    CAPTURE(step);
    cx::exact_topk e;
    auto const want = run(e, 2, x, k);
    CHECK(run(t, 2, x, k) == want);
    CHECK(t.passes <= (step < 2 ? 3 : 1));
    for (std::uint32_t i : want) x[i] = 0.f;  // sent
    auto const g = values(n, 10 + step);
    for (std::size_t i = 0; i < n; ++i) x[i] += 0.5f * g[i];
  }
}

TEST_CASE("the keeping pass: the AVX2 form keeps what the scalar form keeps, at any offset and cap") {
#if TIDE_SELECT_AVX2
  if (!__builtin_cpu_supports("avx2")) {
    MESSAGE("no AVX2 on this CPU: the scalar form is the one that runs");
    return;
  }
  auto const x = values(1003, 21);
  for (std::size_t b : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{500}})
    for (std::size_t e : {b, b + 5, std::size_t{1000}, std::size_t{1003}})
      for (std::size_t cap : {std::size_t{0}, std::size_t{3}, std::size_t{40}, std::size_t{2000}})
        for (float tau : {0.f, 0.5f, 3.f, 5.f}) {
          CAPTURE(b);
          CAPTURE(e);
          CAPTURE(cap);
          CAPTURE(tau);
          std::vector<std::uint32_t> k1(cap + 1, 7u), v1(cap + 1, 7u), k2(cap + 1, 7u), v2(cap + 1, 7u);
          auto const above = cx::abs_key(tau);
          std::size_t const c1 = cx::detail::keep_above_scalar(x.data(), b, e, above, k1.data(), v1.data(), cap);
          std::size_t const c2 = cx::detail::keep_above_avx2(x.data(), b, e, above, k2.data(), v2.data(), cap);
          CHECK(c1 == c2);
          CHECK(k1 == k2);
          CHECK(v1 == v2);
          CHECK(k1[cap] == 7u);  // nothing past cap
          for (std::size_t j = 0; j < std::min(c1, cap); ++j) CHECK(v1[j] == cx::abs_key(x[k1[j]]));
        }
#else
  MESSAGE("no AVX2 form on this target: the scalar form is the one that runs");
#endif
}

TEST_CASE("selectors on hard inputs: all magnitudes equal, mostly zeros, a NaN, too small an output") {
  tide::thread_pool pool(2);
  tide::exec<tide::host> const ex{pool};
  std::size_t const n = 5000, k = 50;
  {  // all equal: no threshold separates them; the lowest indices are chosen
    std::vector<float> const x(n, 0.5f);
    std::vector<std::uint32_t> want(k);
    std::iota(want.begin(), want.end(), 0u);
    cx::threshold_search t;
    cx::sampled_threshold s;
    cx::trimmed_topk r;
    cx::tracked_topk g;
    CHECK(run(t, 2, x, k) == want);
    CHECK(run(s, 2, x, k) == want);
    CHECK(run(r, 2, x, k) == want);
    CHECK(run(g, 2, x, k) == want);
    CHECK(run(g, 2, x, k) == want);
  }
  {  // 10 non-zeros: every selector takes them, then zeros by index
    std::vector<float> x(n, 0.f);
    for (std::size_t i = 0; i < 10; ++i) x[i * 401 + 3] = static_cast<float>(i + 1) * (i % 2 ? -1.f : 1.f);
    auto const want = sorted_topk(x, k);
    cx::threshold_search t;
    cx::sampled_threshold s;
    cx::exact_topk e;
    cx::tracked_topk g;
    for (auto const& v : {run(t, 2, x, k), run(s, 2, x, k), run(e, 2, x, k), run(g, 2, x, k)}) {
      CHECK(v.size() >= k);
      CHECK(holds(v, want));
    }
    CHECK(run(g, 2, x, k) == want);
  }
  {  // a NaN is sent first, not kept in the residual; an infinity next
    std::vector<float> x = values(n, 9);
    x[1234] = std::numeric_limits<float>::quiet_NaN();
    x[99] = -std::numeric_limits<float>::infinity();
    cx::exact_topk e;
    cx::tracked_topk g;
    CHECK(run(e, 2, x, 1) == std::vector<std::uint32_t>{1234});
    for (int call = 0; call < 3; ++call) {
      CHECK(run(g, 2, x, 1) == std::vector<std::uint32_t>{1234});
      CHECK(run(g, 2, x, 2) == std::vector<std::uint32_t>{99, 1234});
      CHECK(run(g, 2, x, k) == run(e, 2, x, k));
    }
  }
  {  // options out of range are refused, naming what to pass
    std::vector<float> const x = values(n, 3);
    std::vector<std::uint32_t> out(k);
    cx::tracked_topk g{.margin = 1.5f};
    CHECK_THROWS_WITH_AS((void)g.select(ex, x, k, out), doctest::Contains("pass a margin in (0, 1]"), tide::error);
  }
  {  // an output smaller than capacity(k) is refused before anything is written
    std::vector<float> const x = values(n, 3);
    std::vector<std::uint32_t> out(k);
    cx::threshold_search t;
    CHECK_THROWS_WITH_AS((void)t.select(ex, x, k, out), doctest::Contains("capacity(k)"), tide::error);
  }
}

TEST_CASE("random_k: k distinct indices, another set each call, the same sets on a rerun") {
  std::size_t const n = 10007, k = 100;
  auto const x = values(n, 2);
  cx::random_k a{.seed = 7}, b{.seed = 7};
  auto const a1 = run(a, 1, x, k), a2 = run(a, 2, x, k);
  auto const b1 = run(b, 3, x, k), b2 = run(b, 1, x, k);
  CHECK(a1.size() == k);
  CHECK(ascending_distinct(a1, n));
  CHECK(ascending_distinct(a2, n));
  CHECK(a1 == b1);
  CHECK(a2 == b2);
  CHECK(a1 != a2);
  // Roughly uniform: each half of [0, n) gets between 30 and 70 of 100.
  auto const low = static_cast<std::size_t>(std::ranges::count_if(a1, [&](std::uint32_t i) { return i < n / 2; }));
  CHECK(low >= 30);
  CHECK(low <= 70);
}
