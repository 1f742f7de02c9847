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
//   random_k            k distinct indices ranked by a hash of (index, seed, call): the baseline
//
// Every selector but random_k returns a set that holds the top-k, so error feedback contracts:
// ‖x − x_sel‖² <= (1 − k/d)‖x‖² on every call (tests/compress/select.cpp). NaN ranks above
// infinity (its key is larger): a non-finite gradient is sent, not hidden in the residual.
//
// The per-element math (the key of a float) is abs_key, shared with any device implementation.

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

namespace tide::compress {

// The magnitude of v as an unsigned key whose integer order is the order of |v| (NaN on top).
// (tide::detail::bits_of, not std::bit_cast: nvcc does not call std::bit_cast from device code.)
TIDE_HOST_DEVICE constexpr std::uint32_t abs_key(float v) noexcept {
  return tide::detail::bits_of(v) & 0x7fffffffu;
}
// A 32-bit mix (the finaliser of MurmurHash3): random_k's ranking.
TIDE_HOST_DEVICE constexpr std::uint32_t mix32(std::uint32_t h) noexcept {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

template <class S>
concept Selector = requires(S& s, exec<host> const& ex, std::span<float const> x, std::size_t k,
                            std::span<std::uint32_t> out) {
  { S::name } -> std::convertible_to<std::string_view>;
  { S::capacity(k) } -> std::same_as<std::size_t>;
  { s.select(ex, x, k, out) } -> std::same_as<std::size_t>;
};

namespace detail {

inline constexpr std::size_t block = std::size_t{1} << 14;  // elements per reduction block

// Scratch a selector keeps between calls (grown, never shrunk: steady calls allocate nothing).
struct select_scratch {
  std::vector<std::uint32_t> hist;        // (threads, 65536) histograms
  std::vector<std::size_t> counts;        // per slice: (greater, equal) or per-block partials
  std::vector<double> sums;               // per block
  std::vector<float> maxes;               // per block
  std::vector<std::uint32_t> candidates;  // indices above a threshold
  std::vector<std::uint32_t> picked;      // positions among the candidates
  std::vector<std::uint32_t> sample;      // sampled keys
  std::vector<std::uint32_t> per_slice;   // (threads, cap) indices above a threshold, by slice
};

inline void check_out(std::size_t n, std::size_t k, std::size_t room, std::size_t need, std::string_view who) {
  TIDE_REQUIRE(n <= std::size_t{0xffffffffu}, who, ": ", n, " elements; indices are 32-bit (split the tensor)");
  TIDE_REQUIRE(room >= std::min(need, n), who, ": out holds ", room, " indices, a selection of k = ", k, " needs ",
               std::min(need, n), " (capacity(k))");
}

// Indices i in [0, n) with pred(i), ascending, into out; returns how many. Two passes: count per
// slice, then write at the slice's offset (the order does not depend on the thread count).
template <class Pred>
std::size_t collect(thread_pool& pool, std::size_t n, Pred pred, std::uint32_t* out, select_scratch& s) {
  int const t = pool.threads();
  s.counts.assign(static_cast<std::size_t>(t) + 1, 0);
  pool.run(n, [&](std::size_t b, std::size_t e) {
    std::size_t c = 0;
    for (std::size_t i = b; i < e; ++i) c += pred(i) ? 1 : 0;
    s.counts[static_cast<std::size_t>(thread_pool::slice_at(n, t, b)) + 1] = c;
  });
  for (int k = 0; k < t; ++k) s.counts[static_cast<std::size_t>(k) + 1] += s.counts[static_cast<std::size_t>(k)];
  pool.run(n, [&](std::size_t b, std::size_t e) {
    std::size_t at = s.counts[static_cast<std::size_t>(thread_pool::slice_at(n, t, b))];
    for (std::size_t i = b; i < e; ++i)
      if (pred(i)) out[at++] = static_cast<std::uint32_t>(i);
  });
  return s.counts[static_cast<std::size_t>(t)];
}

// One pass: how many of [0, n) have key(i) > above, each slice also keeping its first `cap` such
// indices in s.per_slice. When the total is at most cap, every index was kept:
// concat_slices(out) then writes them ascending.
template <class Key>
std::size_t count_keep(thread_pool& pool, std::size_t n, Key key, std::uint32_t above, std::size_t cap,
                       select_scratch& s) {
  int const t = pool.threads();
  s.counts.assign(static_cast<std::size_t>(t), 0);
  s.per_slice.resize(static_cast<std::size_t>(t) * cap);
  pool.run(n, [&](std::size_t b, std::size_t e) {
    auto const slot = static_cast<std::size_t>(thread_pool::slice_at(n, t, b));
    std::uint32_t* kept = s.per_slice.data() + slot * cap;
    std::size_t c = 0;
    for (std::size_t i = b; i < e; ++i)
      if (key(i) > above) {
        if (c < cap) kept[c] = static_cast<std::uint32_t>(i);
        ++c;
      }
    s.counts[slot] = c;
  });
  std::size_t c = 0;
  for (std::size_t v : s.counts) c += v;
  return c;
}
inline std::size_t concat_slices(std::size_t cap, std::uint32_t* out, select_scratch const& s) {
  std::size_t at = 0;
  for (std::size_t q = 0; q < s.counts.size(); ++q) {
    std::copy_n(s.per_slice.data() + q * cap, s.counts[q], out + at);
    at += s.counts[q];
  }
  return at;
}

// How many of [0, n) have key(i) > above (exact: integer counts; per slice in s.counts).
template <class Key>
std::size_t count_above(thread_pool& pool, std::size_t n, Key key, std::uint32_t above, select_scratch& s) {
  int const t = pool.threads();
  s.counts.assign(static_cast<std::size_t>(t), 0);
  pool.run(n, [&](std::size_t b, std::size_t e) {
    std::size_t c = 0;
    for (std::size_t i = b; i < e; ++i) c += key(i) > above ? 1 : 0;
    s.counts[static_cast<std::size_t>(thread_pool::slice_at(n, t, b))] = c;
  });
  std::size_t c = 0;
  for (std::size_t v : s.counts) c += v;
  return c;
}

// The k-th largest key among [0, n) (1 <= k <= n) and how many keys are larger: a radix select,
// one histogram of the high 16 bits, one of the low 16 bits within the bucket that holds it.
template <class Key>
std::pair<std::uint32_t, std::size_t> kth_key(thread_pool& pool, std::size_t n, std::size_t k, Key key,
                                              select_scratch& s) {
  constexpr std::size_t buckets = 65536;
  int const t = pool.threads();
  s.hist.resize(static_cast<std::size_t>(t) * buckets);
  std::uint32_t high = 0;
  std::size_t above = 0;
  for (int pass = 0; pass < 2; ++pass) {
    std::fill(s.hist.begin(), s.hist.end(), 0u);
    pool.run(n, [&](std::size_t b, std::size_t e) {
      auto const slot = static_cast<std::size_t>(thread_pool::slice_at(n, t, b));
      std::uint32_t* h = s.hist.data() + slot * buckets;
      if (pass == 0) {
        for (std::size_t i = b; i < e; ++i) ++h[key(i) >> 16];
      } else {
        for (std::size_t i = b; i < e; ++i) {
          std::uint32_t const v = key(i);
          if ((v >> 16) == high) ++h[v & 0xffffu];
        }
      }
    });
    for (int q = 1; q < t; ++q)
      for (std::size_t v = 0; v < buckets; ++v) s.hist[v] += s.hist[static_cast<std::size_t>(q) * buckets + v];
    std::size_t v = buckets;
    while (v-- > 0) {
      if (above + s.hist[v] >= k) break;
      above += s.hist[v];
    }
    if (pass == 0) high = static_cast<std::uint32_t>(v);
    else return {(high << 16) | static_cast<std::uint32_t>(v), above};
  }
  return {0, 0};  // not reached
}

// The top-k of [0, n) by key (ties: lower index), ascending positions into out; returns k.
template <class Key>
std::size_t topk_by_key(thread_pool& pool, std::size_t n, std::size_t k, Key key, std::uint32_t* out,
                        select_scratch& s) {
  if (k == 0 || n == 0) return 0;
  if (k >= n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint32_t>(i);
    return n;
  }
  auto const [kth, above] = kth_key(pool, n, k, key, s);
  std::size_t const ties = k - above;  // keys equal to the k-th: the lowest indices among them
  if (ties == 0) return collect(pool, n, [&](std::size_t i) { return key(i) > kth; }, out, s);
  // Equal keys are taken in index order: count them per slice first.
  int const t = pool.threads();
  std::vector<std::size_t>& eq = s.counts;
  eq.assign(static_cast<std::size_t>(t) + 1, 0);
  pool.run(n, [&](std::size_t b, std::size_t e) {
    std::size_t c = 0;
    for (std::size_t i = b; i < e; ++i) c += key(i) == kth ? 1 : 0;
    eq[static_cast<std::size_t>(thread_pool::slice_at(n, t, b)) + 1] = c;
  });
  for (int q = 0; q < t; ++q) eq[static_cast<std::size_t>(q) + 1] += eq[static_cast<std::size_t>(q)];
  // The last index whose tie is still taken.
  std::size_t last_tie = n;
  for (int q = 0; q < t && last_tie == n; ++q) {
    if (eq[static_cast<std::size_t>(q) + 1] < ties) continue;
    auto const [b, e] = thread_pool::slice(n, t, q);
    std::size_t seen = eq[static_cast<std::size_t>(q)];
    for (std::size_t i = b; i < e; ++i)
      if (key(i) == kth && ++seen == ties) {
        last_tie = i;
        break;
      }
  }
  return collect(pool, n, [&](std::size_t i) { std::uint32_t const v = key(i); return v > kth || (v == kth && i <= last_tie); },
                 out, s);
}

// Sum and max of |x| over fixed blocks, combined in block order (the same for any thread count).
inline std::pair<double, float> abs_sum_max(thread_pool& pool, std::span<float const> x, select_scratch& s) {
  std::size_t const blocks = (x.size() + block - 1) / block;
  s.sums.assign(blocks, 0.0);
  s.maxes.assign(blocks, 0.f);
  auto& maxes = s.maxes;
  pool.run(blocks, [&](std::size_t b, std::size_t e) {
    for (std::size_t k = b; k < e; ++k) {
      double sum = 0;
      float mx = 0;
      std::size_t const end = std::min(x.size(), (k + 1) * block);
      for (std::size_t i = k * block; i < end; ++i) {
        float const a = std::fabs(x[i]);
        sum += a;
        mx = std::max(mx, a);
      }
      s.sums[k] = sum;
      maxes[k] = mx;
    }
  });
  double sum = 0;
  float mx = 0;
  for (std::size_t k = 0; k < blocks; ++k) {
    sum += s.sums[k];
    mx = std::max(mx, maxes[k]);
  }
  return {sum, mx};
}

// The candidates above `tau` (|x| > tau), then the top-k of them; returns the count written.
inline std::size_t topk_of_candidates(thread_pool& pool, std::span<float const> x, std::size_t k, std::uint32_t tau,
                                      std::uint32_t* out, select_scratch& s) {
  auto key = [&](std::size_t i) { return abs_key(x[i]); };
  std::size_t const c = count_above(pool, x.size(), key, tau, s);
  s.candidates.resize(c);
  collect(pool, x.size(), [&](std::size_t i) { return key(i) > tau; }, s.candidates.data(), s);
  s.picked.resize(std::min(k, c));
  std::size_t const m = topk_by_key(pool, c, k, [&](std::size_t j) { return abs_key(x[s.candidates[j]]); },
                                    s.picked.data(), s);
  for (std::size_t j = 0; j < m; ++j) out[j] = s.candidates[s.picked[j]];
  return m;
}

}  // namespace detail

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
    auto count = [&](float tau) { return detail::count_keep(ex.pool, n, key, abs_key(tau), 2 * k, scratch); };
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
        return detail::concat_slices(2 * k, out.data(), scratch);
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
    auto const stride = std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(1.0 / sample)));
    std::size_t const m = (n + stride - 1) / stride;
    scratch.sample.resize(m);
    for (std::size_t j = 0; j < m; ++j) scratch.sample[j] = key(j * stride);
    std::size_t const want = std::clamp<std::size_t>((k * m + n - 1) / n, 1, m);
    std::nth_element(scratch.sample.begin(), scratch.sample.begin() + static_cast<std::ptrdiff_t>(want - 1), scratch.sample.end(),
                     std::greater<>());
    // "At or above τ" is "above the key just below it".
    std::uint32_t below = scratch.sample[want - 1] > 0 ? scratch.sample[want - 1] - 1 : 0;
    std::size_t c = detail::count_keep(ex.pool, n, key, below, 2 * k, scratch);
    for (int halvings = 0; c < k && below > 0 && halvings < 64; ++halvings) {  // the sample overestimated τ
      below = abs_key(std::bit_cast<float>(below) * 0.5f);
      c = detail::count_keep(ex.pool, n, key, below, 2 * k, scratch);
    }
    if (c < k) return detail::topk_by_key(ex.pool, n, k, key, out.data(), scratch);
    if (c <= 2 * k) return detail::concat_slices(2 * k, out.data(), scratch);
    return detail::topk_of_candidates(ex.pool, x, k, below, out.data(), scratch);
  }

  // State between calls (public so that the options above can be designated initializers).
  detail::select_scratch scratch{};
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
              Selector<sampled_threshold> && Selector<random_k>);

}  // namespace tide::compress
