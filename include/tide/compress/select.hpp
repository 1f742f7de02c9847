#pragma once
// Selectors: which elements of a residual a sparse compressor sends. A selector is a type with
//
//   std::size_t select(exec<host> const& ex, std::span<float const> x, std::size_t k, std::span<std::uint32_t> out);
//   static constexpr std::size_t capacity(std::size_t k);   // the most indices select may write
//
// It writes the indices it chose into `out`, ascending, and returns how many. Elements rank by
// magnitude |x|, ties going to the lower index, and every reduction runs over fixed blocks in
// block order, so a selector chooses the same indices on every run and for any thread count.
//
//   exact_topk          the k largest |x|: a radix select on order-preserving keys (two histogram
//                       passes, then one pass that collects), no sort
//   trimmed_topk        RedSync: τ = mean + ratio·(max − mean) over |x|, the ratio halved until at
//                       least k elements exceed τ, then the exact top-k of those candidates (the
//                       same k as exact_topk)
//   threshold_search    RedSync: a binary search for τ until k <= count(|x| > τ) <= 2k, starting
//                       from this selector's last τ; sends every element above τ (no top-k)
//   sampled_threshold   DGC: τ from a strided sample of the elements (1 % by default); more than 2k
//                       above it: the exact top-k of those; fewer than k: τ halved until enough
//   tracked_topk        exact_topk's indices, from the candidates above a guard: one pass keeps the
//                       indices above it, the k-th largest of those decides; the guard follows the
//                       k-th magnitude of the last call (warm) or of a 1 % sample (cold)
//   random_k            k distinct indices ranked by a hash of (index, seed, call): the baseline
//
// Every selector but random_k returns a set that holds the top-k, so error feedback contracts:
// ‖x − x_sel‖² <= (1 − k/d)‖x‖² on every call (tests/compress/select.cpp). NaN ranks above
// infinity (its key is larger): a non-finite gradient is sent, not hidden in the residual.
//
// The per-element math (the key of a float) is abs_key, shared with any device implementation;
// the passes over a pool's slices are in detail/select_passes.hpp.

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/config.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parallel.hpp"
#include "tide/compress/detail/select_passes.hpp"

namespace tide::compress {

template <class S>
concept Selector = requires(S& s, exec<host> const& ex, std::span<float const> x, std::size_t k,
                            std::span<std::uint32_t> out) {
  { S::name } -> std::convertible_to<std::string_view>;
  { S::capacity(k) } -> std::same_as<std::size_t>;
  { s.select(ex, x, k, out) } -> std::same_as<std::size_t>;
};

// The k largest |x|, ties to the lower index.
struct exact_topk {
  static constexpr std::string_view name = "exact_topk";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return k; }
  std::size_t select(exec<host> const& ex, std::span<float const> x, std::size_t k, std::span<std::uint32_t> out) {
    detail::check_out(x.size(), k, out.size(), capacity(k), name);
    return detail::topk_by_key(ex.pool, x.size(), k, [&](std::size_t i) { return abs_key(x[i]); }, out.data(), scratch);
  }

  // State between calls (public so that the options above can be designated initializers).
  detail::select_scratch scratch{};
};

// RedSync's trimmed top-k: a threshold from the mean and the max narrows the candidates, then the
// exact top-k of the candidates (what exact_topk chooses, after one pass more per halving).
struct trimmed_topk {
  static constexpr std::string_view name = "trimmed_topk";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return k; }
  float ratio = 0.5f;  // the first τ = mean + ratio (max − mean); halved until k elements exceed τ
  std::size_t select(exec<host> const& ex, std::span<float const> x, std::size_t k, std::span<std::uint32_t> out) {
    detail::check_out(x.size(), k, out.size(), capacity(k), name);
    std::size_t const n = x.size();
    if (k == 0 || n == 0) return 0;
    if (k >= n) return detail::topk_by_key(ex.pool, n, k, [&](std::size_t i) { return abs_key(x[i]); }, out.data(), scratch);
    auto const [sum, mx] = detail::abs_sum_max(ex.pool, x, scratch);
    auto const mean = static_cast<float>(sum / static_cast<double>(n));
    auto key = [&](std::size_t i) { return abs_key(x[i]); };
    float r = ratio;
    float tau = mean + r * (mx - mean);
    for (int step = 0; step < 64; ++step) {
      if (detail::count_above(ex.pool, n, key, abs_key(tau), scratch) >= k) break;
      r *= 0.5f;
      tau = r > 1e-3f ? mean + r * (mx - mean) : tau * 0.5f;  // then below the mean
      if (!(tau > 0.f)) break;
    }
    // Below every key when the loop ran out (or τ reached 0): all elements are candidates.
    std::uint32_t const t = tau > 0.f && detail::count_above(ex.pool, n, key, abs_key(tau), scratch) >= k ? abs_key(tau) : 0;
    if (t == 0) return detail::topk_by_key(ex.pool, n, k, key, out.data(), scratch);
    return detail::topk_of_candidates(ex.pool, x, k, t, out.data(), scratch);
  }

  // State between calls (public so that the options above can be designated initializers).
  detail::select_scratch scratch{};
};

// RedSync's threshold binary search: every element above τ, with k <= count <= 2k, τ searched
// from this selector's last one (reused step to step: keep one selector per tensor or chunk).
// A probe counts and keeps what it counted, so a τ that still fits costs one pass over x.
struct threshold_search {
  static constexpr std::string_view name = "threshold_search";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return 2 * k; }
  int max_probes = 40;  // then it falls back to the exact top-k (many equal magnitudes)
  std::size_t select(exec<host> const& ex, std::span<float const> x, std::size_t k, std::span<std::uint32_t> out) {
    detail::check_out(x.size(), k, out.size(), capacity(k), name);
    std::size_t const n = x.size();
    if (k == 0 || n == 0) return 0;
    auto key = [&](std::size_t i) { return abs_key(x[i]); };
    if (2 * k >= n) return detail::topk_by_key(ex.pool, n, k, key, out.data(), scratch);
    // count(lo) > 2k and count(hi) < k bracket the τ searched for; an unknown hi doubles τ.
    // Each probe keeps the indices it counted: the probe that lands in [k, 2k] has them all.
    auto count = [&](float tau) { return detail::count_keep(ex.pool, x, abs_key(tau), 2 * k, scratch); };
    float lo = 0, hi = std::numeric_limits<float>::infinity(), tau = last_tau;
    if (!(last_tau > 0.f)) {
      auto const [sum, mx] = detail::abs_sum_max(ex.pool, x, scratch);
      float const mean = static_cast<float>(sum / static_cast<double>(n));
      tau = mean + 0.5f * (mx - mean);
      hi = mx;  // nothing exceeds the max
    }
    for (probes = 1; probes <= max_probes; ++probes) {
      std::size_t const c = count(tau);
      if (c >= k && c <= 2 * k) {
        last_tau = tau;
        return detail::concat_slices(out.data(), scratch);
      }
      (c < k ? hi : lo) = tau;
      float const next = std::isinf(hi) ? 2.f * tau : 0.5f * (lo + hi);
      if (next == tau || !(next > 0.f) || !std::isfinite(next)) break;  // no float between: many equal magnitudes
      tau = next;
    }
    last_tau = 0;  // start afresh next time
    return detail::topk_by_key(ex.pool, n, k, key, out.data(), scratch);
  }

  // State between calls (public so that the options above can be designated initializers).
  float last_tau = 0;  // the τ of the last call (0: none)
  int probes = 0;      // the counting passes the last call took
  detail::select_scratch scratch{};
};

// DGC's sampled threshold: τ is the k·m/n-th largest |x| of a strided sample of m elements;
// everything at or above it is a candidate; more than 2k candidates: their exact top-k; fewer
// than k: τ halved until there are enough.
struct sampled_threshold {
  static constexpr std::string_view name = "sampled_threshold";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return 2 * k; }
  double sample = 0.01;  // the fraction sampled (DGC: 0.1 % to 1 %)
  std::size_t select(exec<host> const& ex, std::span<float const> x, std::size_t k, std::span<std::uint32_t> out) {
    detail::check_out(x.size(), k, out.size(), capacity(k), name);
    TIDE_REQUIRE(sample > 0 && sample <= 1, "sampled_threshold: sample = ", sample, "; pass a fraction in (0, 1]");
    std::size_t const n = x.size();
    if (k == 0 || n == 0) return 0;
    auto key = [&](std::size_t i) { return abs_key(x[i]); };
    if (2 * k >= n) return detail::topk_by_key(ex.pool, n, k, key, out.data(), scratch);
    std::uint32_t const tau = detail::sampled_kth_key(x, k, sample, scratch);
    // "At or above τ" is "above the key just below it".
    std::uint32_t below = tau > 0 ? tau - 1 : 0;
    std::size_t c = detail::count_keep(ex.pool, x, below, 2 * k, scratch);
    for (int halvings = 0; c < k && below > 0 && halvings < 64; ++halvings) {  // the sample overestimated τ
      below = abs_key(std::bit_cast<float>(below) * 0.5f);
      c = detail::count_keep(ex.pool, x, below, 2 * k, scratch);
    }
    if (c < k) return detail::topk_by_key(ex.pool, n, k, key, out.data(), scratch);
    if (c <= 2 * k) return detail::concat_slices(out.data(), scratch);
    return detail::topk_of_candidates(ex.pool, x, k, below, out.data(), scratch);
  }

  // State between calls (public so that the options above can be designated initializers).
  detail::select_scratch scratch{};
};

// exact_topk's indices (the k largest |x|, ties to the lower index) in about one pass: every index
// above a guard is kept, and the k-th largest of the candidates decides which of them are sent.
// The guard is a fraction of the k-th magnitude expected: the last call's, moved by how much it
// moved between the two calls before (warm; keep one selector per tensor or chunk), or a 1 %
// sample's (cold). The fraction starts at `margin`; each call then sets it from how many the guard
// kept, so that the next keeps about 2k (the count taken as a power of the magnitude). A guard
// that keeps fewer than k or more than `spread`·k moves by the secant of log count over log
// magnitude (at most 4x a pass), by bisection once bracketed, and the pass is repeated; after
// `max_passes` the radix select decides.
struct tracked_topk {
  static constexpr std::string_view name = "tracked_topk";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return k; }
  float margin = 0.85f;     // the first guard over the k-th magnitude expected
  std::size_t spread = 4;   // the most candidates a pass keeps, over k
  double sample = 0.01;     // the fraction the cold guess samples
  int max_passes = 8;
  std::size_t select(exec<host> const& ex, std::span<float const> x, std::size_t k, std::span<std::uint32_t> out) {
    detail::check_out(x.size(), k, out.size(), capacity(k), name);
    TIDE_REQUIRE(margin > 0.f && margin <= 1.f && spread >= 2 && sample > 0 && sample <= 1, name, ": margin = ", margin,
                 ", spread = ", spread, ", sample = ", sample, "; pass a margin in (0, 1], a spread >= 2 and a sample in (0, 1]");
    std::size_t const n = x.size();
    passes = 0;
    if (k == 0 || n == 0) return 0;
    if (spread * k >= n) return fall_back(ex, x, k, out);
    float expected = last_kth * drift;
    if (!(expected > 0.f) || !std::isfinite(expected)) {
      expected = std::bit_cast<float>(detail::sampled_kth_key(x, k, sample, scratch));
      drift = 1.f;
    }
    std::size_t const cap = spread * k;
    float guard = expected * (fraction > 0.f ? fraction : margin), lo = 0.f, hi = std::numeric_limits<float>::infinity();
    // A guard that missed moves by the secant of log count over log magnitude (its slope e from
    // the fraction, then from the last two passes) towards 2k, by bisection once bracketed.
    double e = std::max(0.01, -std::log2(static_cast<double>(fraction > 0.f ? fraction : margin)));
    float before = 0.f;
    std::size_t c = 0, c_before = 0;
    for (;;) {
      if (!(guard > 0.f) || !std::isfinite(guard) || passes == max_passes) return fall_back(ex, x, k, out);
      ++passes;
      c = detail::count_keep(ex.pool, x, abs_key(guard), cap, scratch);
      if (c >= k && c <= cap) break;
      (c < k ? hi : lo) = guard;
      if (before > 0.f && c > 0 && c_before > 0 && c != c_before)
        e = std::clamp(std::log(double{guard} / before) / std::log(static_cast<double>(c_before) / static_cast<double>(c)),
                       0.01, 2.0);
      before = guard;
      c_before = c;
      double const step = c > 0 ? std::pow(static_cast<double>(c) / (2.0 * static_cast<double>(k)), e) : 0.5;
      float next = guard * static_cast<float>(std::clamp(step, 0.25, 4.0));
      if (lo > 0.f && !std::isinf(hi) && !(next > lo && next < hi)) next = 0.5f * (lo + hi);
      if (next == lo || next == hi || next == guard) return fall_back(ex, x, k, out);  // no float between: ties
      guard = next;
    }
    // The c candidates, ascending, and their keys: the k-th largest key decides; of the keys
    // equal to it, the lowest indices go first.
    auto& cand = scratch.candidates;
    auto& keys = scratch.picked;
    auto& order = scratch.sample;
    cand.resize(c);
    keys.resize(c);
    detail::concat_slices(cand.data(), scratch, keys.data());
    order.assign(keys.begin(), keys.end());
    auto const kth_at = order.begin() + static_cast<std::ptrdiff_t>(k - 1);
    std::nth_element(order.begin(), kth_at, order.end(), std::greater<>());
    std::uint32_t const kth = *kth_at;
    auto ties = k - static_cast<std::size_t>(std::count_if(order.begin(), kth_at, [&](std::uint32_t v) { return v > kth; }));
    std::size_t m = 0;
    for (std::size_t j = 0; j < c; ++j) {
      std::uint32_t const v = keys[j];
      if (v > kth || (v == kth && ties > 0)) {
        ties -= v == kth ? 1 : 0;
        out[m++] = cand[j];
      }
    }
    float const now = std::bit_cast<float>(kth);
    drift = last_kth > 0.f && now > 0.f ? std::clamp(now / last_kth, 0.5f, 2.f) : 1.f;
    last_kth = now;
    // count(τ) ≈ k (τ / kth)^-a through (guard, c): the guard keeping 2k is kth 2^(-1/a).
    if (now > 0.f && std::isfinite(now) && guard < now) {
      double const a = std::log(static_cast<double>(c) / static_cast<double>(k)) / std::log(double{now} / guard);
      fraction = a > 0 ? static_cast<float>(std::clamp(std::exp(-std::log(2.0) / a), 0.5, 0.97)) : 0.5f;
    }
    return m;
  }

  // State between calls (public so that the options above can be designated initializers).
  float last_kth = 0;  // the k-th largest |x| of the last call (0: none, the next call samples)
  float drift = 1;     // how much it moved between the last two calls
  float fraction = 0;  // the next guard over the k-th magnitude expected (0: margin)
  int passes = 0;      // the keeping passes the last call made (then the radix select, if it fell back)
  detail::select_scratch scratch{};

 private:
  std::size_t fall_back(exec<host> const& ex, std::span<float const> x, std::size_t k, std::span<std::uint32_t> out) {
    last_kth = 0;
    drift = 1;
    return detail::topk_by_key(ex.pool, x.size(), k, [&](std::size_t i) { return abs_key(x[i]); }, out.data(), scratch);
  }
};

// k distinct indices, ranked by a hash of (index, seed, call): a different set each call, the
// same sets on every run. The baseline: it ignores the values.
struct random_k {
  static constexpr std::string_view name = "random_k";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return k; }
  std::uint32_t seed = 1;
  std::size_t select(exec<host> const& ex, std::span<float const> x, std::size_t k, std::span<std::uint32_t> out) {
    detail::check_out(x.size(), k, out.size(), capacity(k), name);
    std::uint32_t const salt = mix32(seed * 0x9e3779b9u + calls++);
    return detail::topk_by_key(ex.pool, x.size(), k,
                               [&](std::size_t i) { return mix32(static_cast<std::uint32_t>(i) ^ salt); }, out.data(),
                               scratch);
  }

  // State between calls (public so that the options above can be designated initializers).
  std::uint32_t calls = 0;
  detail::select_scratch scratch{};
};

static_assert(Selector<exact_topk> && Selector<trimmed_topk> && Selector<threshold_search> &&
              Selector<sampled_threshold> && Selector<tracked_topk> && Selector<random_k>);

}  // namespace tide::compress
