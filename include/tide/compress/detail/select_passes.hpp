#pragma once
// The passes compress/select.hpp's selectors are made of, and the key they rank by: counting,
// keeping and collecting indices above a key over a thread pool's slices (every total exact and
// in slice order, so a result never depends on the thread count), the radix select of the k-th
// key, and the sampled estimate of it.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tide/core/config.hpp"
#include "tide/core/dtype.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parallel.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#  include <immintrin.h>
#  define TIDE_SELECT_AVX2 1
#else
#  define TIDE_SELECT_AVX2 0
#endif

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

namespace detail {

inline constexpr std::size_t block = std::size_t{1} << 14;  // elements per reduction block

// Scratch a selector keeps between calls (grown, never shrunk: steady calls allocate nothing).
struct select_scratch {
  std::vector<std::uint32_t> hist;        // (threads, 65536) histograms
  std::vector<std::size_t> counts;        // per slice: (greater, equal) or per-block partials
  std::vector<double> sums;               // per block
  std::vector<float> maxes;               // per block
  std::vector<std::uint32_t> candidates;  // indices above a threshold
  std::vector<std::uint32_t> picked;      // positions among the candidates (tracked_topk: their keys)
  std::vector<std::uint32_t> sample;      // sampled keys (tracked_topk: the candidates' keys, reordered)
  std::vector<std::uint32_t> per_slice;   // (threads, stride) indices above a threshold, by slice
  std::vector<std::uint32_t> slice_keys;  // (threads, stride) their keys
  std::size_t stride = 0;                 // per_slice's room per slice: min(cap, a slice's length)
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

// [b, e) of x: how many have |x| > above (by key), the first `cap` of their indices into kept and
// their keys into keys.
inline std::size_t keep_above_scalar(float const* x, std::size_t b, std::size_t e, std::uint32_t above,
                                     std::uint32_t* kept, std::uint32_t* keys, std::size_t cap) noexcept {
  std::size_t c = 0;
  for (std::size_t i = b; i < e; ++i)
    if (std::uint32_t const v = abs_key(x[i]); v > above) {
      if (c < cap) kept[c] = static_cast<std::uint32_t>(i), keys[c] = v;
      ++c;
    }
  return c;
}

#if TIDE_SELECT_AVX2
// The same, 8 magnitudes compared at once; only the lanes above are visited (a 2 % selection ran
// 3.7x faster than the scalar loop's branch per element, on 0.8 M floats of one core). Keys and
// `above` are at most 0x7fffffff, so the signed compare orders them.
__attribute__((target("avx2"))) inline std::size_t keep_above_avx2(float const* x, std::size_t b, std::size_t e,
                                                                   std::uint32_t above, std::uint32_t* kept,
                                                                   std::uint32_t* keys, std::size_t cap) noexcept {
  __m256i const magnitude = _mm256_set1_epi32(0x7fffffff), limit = _mm256_set1_epi32(static_cast<int>(above));
  std::size_t c = 0, i = b;
  for (; i + 8 <= e; i += 8) {
    __m256i const v = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<__m256i const*>(x + i)), magnitude);
    auto m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(v, limit))));
    for (; m != 0; m &= m - 1) {
      if (c < cap) {
        std::size_t const at = i + static_cast<unsigned>(__builtin_ctz(m));
        kept[c] = static_cast<std::uint32_t>(at);
        keys[c] = abs_key(x[at]);
      }
      ++c;
    }
  }
  std::size_t const kept_yet = std::min(c, cap);
  std::size_t const tail = keep_above_scalar(x, i, e, above, kept + kept_yet, keys + kept_yet, cap - kept_yet);
  return c + tail;
}
#endif

// One pass: how many of x have |x| > above (a key: at most 0x7fffffff), each slice also keeping
// its first `cap` such indices in s.per_slice (their keys in s.slice_keys). When the total is at
// most cap, every index was kept: concat_slices(out) then writes them ascending. The room kept
// is at most about n, whatever cap is.
inline std::size_t count_keep(thread_pool& pool, std::span<float const> x, std::uint32_t above, std::size_t cap,
                              select_scratch& s) {
  int const t = pool.threads();
  std::size_t const n = x.size();
  s.counts.assign(static_cast<std::size_t>(t), 0);
  s.stride = std::min(cap, n / static_cast<std::size_t>(t) + 1);  // a slice holds at most n / t + 1
  s.per_slice.resize(static_cast<std::size_t>(t) * s.stride);
  s.slice_keys.resize(s.per_slice.size());
#if TIDE_SELECT_AVX2
  static bool const avx2 = __builtin_cpu_supports("avx2");
#endif
  pool.run(n, [&](std::size_t b, std::size_t e) {
    auto const slot = static_cast<std::size_t>(thread_pool::slice_at(n, t, b));
    std::uint32_t* kept = s.per_slice.data() + slot * s.stride;
    std::uint32_t* keys = s.slice_keys.data() + slot * s.stride;
#if TIDE_SELECT_AVX2
    if (avx2) {
      s.counts[slot] = keep_above_avx2(x.data(), b, e, above, kept, keys, s.stride);
      return;
    }
#endif
    s.counts[slot] = keep_above_scalar(x.data(), b, e, above, kept, keys, s.stride);
  });
  std::size_t c = 0;
  for (std::size_t v : s.counts) c += v;
  return c;
}
// (keys: their keys too, unless null)
inline std::size_t concat_slices(std::uint32_t* out, select_scratch const& s, std::uint32_t* keys = nullptr) {
  std::size_t at = 0;
  for (std::size_t q = 0; q < s.counts.size(); ++q) {
    std::copy_n(s.per_slice.data() + q * s.stride, s.counts[q], out + at);
    if (keys != nullptr) std::copy_n(s.slice_keys.data() + q * s.stride, s.counts[q], keys + at);
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

// The estimate of the k-th largest key of x from a strided sample of `fraction` of it: the
// ⌈k·m/n⌉-th largest of the m sampled keys (DGC's sampled threshold).
inline std::uint32_t sampled_kth_key(std::span<float const> x, std::size_t k, double fraction, select_scratch& s) {
  std::size_t const n = x.size();
  auto const stride = std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(1.0 / fraction)));
  std::size_t const m = (n + stride - 1) / stride;
  s.sample.resize(m);
  for (std::size_t j = 0; j < m; ++j) s.sample[j] = abs_key(x[j * stride]);
  std::size_t const want = std::clamp<std::size_t>((k * m + n - 1) / n, 1, m);
  std::nth_element(s.sample.begin(), s.sample.begin() + static_cast<std::ptrdiff_t>(want - 1), s.sample.end(),
                   std::greater<>());
  return s.sample[want - 1];
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

}  // namespace tide::compress
