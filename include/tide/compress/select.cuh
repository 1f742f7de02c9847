#pragma once
// The device selectors of compress/select.hpp on a CUDA stream, with CUB's device-wide stable
// compaction and radix sort. The same keys as the host (abs_key: |x| as an order-preserving
// integer, NaN on top; random_k: mix32 of (index, seed, call)) and the same rules:
//
//   exact_topk_cuda         the k largest, ties to the lower index: a stable descending sort of
//                           (key, index) pairs, the first k sorted ascending
//   trimmed_topk_cuda       RedSync: τ = mean + ratio·(max − mean), halved as the host does, then
//                           the exact top-k of the candidates above τ (compacted, then sorted)
//   threshold_search_cuda   every element above a τ with k <= count <= 2k, τ bisected on the host
//                           from the device's counts and reused call to call
//   sampled_threshold_cuda  DGC: τ from the host's strided sample (sorted on the device), halved
//                           while fewer than k exceed it; more than 2k: their exact top-k
//   random_k_cuda           k distinct indices ranked by the host's hash, one call count per selector
//
// exact_topk_cuda, trimmed_topk_cuda, sampled_threshold_cuda and random_k_cuda choose exactly the
// host's indices (the keys, the sample and the counts are integers). The mean of |x| that seeds
// trimmed_topk's τ and threshold_search's first τ is a fixed-order block reduction: deterministic
// on a given device, not bit-equal to the host's. trimmed_topk's τ only narrows the candidates,
// so its indices are still the host's; threshold_search's τ (and what it sends) may differ from
// the host's while holding the same guarantees.
//
//   std::size_t const bytes = tide::compress::select_scratch_bytes(n);  // the largest n selected
//   tide::compress::device_select_scratch scratch{{device_memory, bytes}};  // the caller's
//   tide::compress::threshold_search_cuda sel;
//   std::size_t m = sel.select(ex, x, k, out, scratch);   // x, out: device memory; out holds 2k
//
// select waits for the stream (the count comes back to the host): call it where a host decision
// follows anyway, as the sparse transport's all-gather of counts does.

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>

#include "tide/compress/select.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/scratch.hpp"

namespace tide::compress {

struct select_cuda_tuning {
  static constexpr int block = 256;
  static constexpr int blocks = 512;  // a fixed grid: the reductions' order depends on nothing else
};

// Device memory the device selectors use: the caller's (kernels/scratch.hpp), at least
// select_scratch_bytes(n) for inputs of up to n elements. A selector asked for more than it
// holds throws tide::error(usage) before it runs anything.
class device_select_scratch {
 public:
  explicit device_select_scratch(kernels::scratch<cuda> ws) noexcept : base_(ws.data), bytes_(ws.bytes) {}
  // Lays out n elements' keys and indices (twice each, for a sort), flags, CUB's temporary
  // storage of `temp` bytes, and the partials, if the memory holds them.
  void reserve(std::size_t n, std::size_t temp, cudaStream_t) {
    if (n <= n_ && temp <= temp_) return;  // the current layout has room for both
    n = std::max(n, n_);
    temp = std::max(temp, temp_);
    std::size_t const need = layout(n, temp).total;
    TIDE_REQUIRE(need <= bytes_, "compress: the device selectors' scratch holds ", bytes_, " bytes, a selection over ",
                 n, " elements needs ", need, "; pass tide::compress::select_scratch_bytes(n) bytes");
    n_ = n;
    temp_ = temp;
  }
  struct parts {
    std::size_t keys, keys_out, idx, idx_out, flags, temp, partial, total;
  };
  static parts layout(std::size_t n, std::size_t temp) {
    auto up = [](std::size_t b) { return (b + 255) / 256 * 256; };
    parts p{};
    std::size_t at = 0;
    p.keys = at, at += up(n * 4);
    p.keys_out = at, at += up(n * 4);
    p.idx = at, at += up(n * 4);
    p.idx_out = at, at += up(n * 4);
    p.flags = at, at += up(n);
    p.partial = at, at += up(select_cuda_tuning::blocks * 16 + 16);
    p.temp = at, at += up(temp);
    p.total = at;
    return p;
  }
  template <class T>
  T* at(std::size_t offset) const noexcept {
    return reinterpret_cast<T*>(base_ + offset);
  }
  [[nodiscard]] parts current() const { return layout(n_, temp_); }

 private:
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0, n_ = 0, temp_ = 0;
};

namespace detail {
TIDE_ABI_NAMESPACE_BEGIN

using select_count_reduce = cub::BlockReduce<unsigned long long, select_cuda_tuning::block>;
using select_sum_reduce = cub::BlockReduce<double, select_cuda_tuning::block>;
using select_max_reduce = cub::BlockReduce<float, select_cuda_tuning::block>;
struct select_fmax {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Per block: how many keys exceed `above`; flags and indices for a compaction (flags may be null).
__global__ void __launch_bounds__(select_cuda_tuning::block)
    select_flag_kernel(float const* x, std::size_t n, std::uint32_t above, unsigned long long* partial,
                       std::uint8_t* flags, std::uint32_t* idx) {
  __shared__ typename select_count_reduce::TempStorage temp;
  unsigned long long c = 0;
  std::size_t const stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    bool const hit = abs_key(x[i]) > above;
    c += hit ? 1 : 0;
    if (flags != nullptr) {
      flags[i] = hit ? 1 : 0;
      idx[i] = static_cast<std::uint32_t>(i);
    }
  }
  unsigned long long const total = select_count_reduce(temp).Sum(c);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}
// Per block: the sum (double) and max of |x|.
__global__ void __launch_bounds__(select_cuda_tuning::block)
    select_sum_max_kernel(float const* x, std::size_t n, double* sums, float* maxes) {
  __shared__ typename select_sum_reduce::TempStorage ts;
  __shared__ typename select_max_reduce::TempStorage tm;
  double s = 0;
  float m = 0;
  std::size_t const stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float const a = fabsf(x[i]);
    s += a;
    m = fmaxf(m, a);
  }
  double const bs = select_sum_reduce(ts).Sum(s);
  float const bm = select_max_reduce(tm).Reduce(m, select_fmax{});
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = bs;
    maxes[blockIdx.x] = bm;
  }
}
// The keys the selectors sort: the host's per-element math, one functor per rule.
struct select_abs_key {  // |x[i]|
  float const* x;
  __device__ std::uint32_t operator()(std::size_t i) const { return abs_key(x[i]); }
};
struct select_strided_abs_key {  // |x[i·stride]|: sampled_threshold's sample
  float const* x;
  std::size_t stride;
  __device__ std::uint32_t operator()(std::size_t i) const { return abs_key(x[i * stride]); }
};
struct select_gathered_abs_key {  // |x[at[i]]|: the candidates' keys
  float const* x;
  std::uint32_t const* at;
  __device__ std::uint32_t operator()(std::size_t i) const { return abs_key(x[at[i]]); }
};
struct select_hash_key {  // random_k's rank of i
  std::uint32_t salt;
  __device__ std::uint32_t operator()(std::size_t i) const { return mix32(static_cast<std::uint32_t>(i) ^ salt); }
};

// keys[i] = key(i) for i < n, and idx[i] = i unless idx is null (the pairs of a sort).
template <class Key>
__global__ void select_keys_kernel(Key key, std::size_t n, std::uint32_t* keys, std::uint32_t* idx) {
  std::size_t const stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    keys[i] = key(i);
    if (idx != nullptr) idx[i] = static_cast<std::uint32_t>(i);
  }
}

TIDE_ABI_NAMESPACE_END

inline std::size_t select_temp_bytes(std::size_t n) {
  TIDE_REQUIRE(n < (std::size_t{1} << 31), "compress: the device selectors take up to 2^31 - 1 elements, got ", n,
               "; select over parts of the tensor");
  std::size_t flagged = 0, sort = 0, small = 0;
  auto const items = static_cast<int>(n);
  TIDE_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, flagged, static_cast<std::uint32_t const*>(nullptr),
                                             static_cast<std::uint8_t const*>(nullptr),
                                             static_cast<std::uint32_t*>(nullptr),
                                             static_cast<unsigned long long*>(nullptr), items));
  TIDE_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, sort, static_cast<std::uint32_t const*>(nullptr), static_cast<std::uint32_t*>(nullptr),
      static_cast<std::uint32_t const*>(nullptr), static_cast<std::uint32_t*>(nullptr), items));
  TIDE_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, small, static_cast<std::uint32_t const*>(nullptr),
                                                 static_cast<std::uint32_t*>(nullptr), items));
  return std::max({flagged, sort, small});
}
// The room the current layout gives CUB (at least select_temp_bytes of the largest n reserved;
// CUB's needs grow with the item count, so a smaller sort fits too).
inline std::size_t select_temp_room(device_select_scratch const& s) {
  auto const p = s.current();
  return p.total - p.temp;
}

template <class Key>
void device_keys(exec<cuda> const& ex, Key key, std::size_t n, std::uint32_t* keys, std::uint32_t* idx) {
  select_keys_kernel<<<select_cuda_tuning::blocks, select_cuda_tuning::block, 0, ex.stream>>>(key, n, keys, idx);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

// How many of x exceed `above` (flag = true: also the flags and indices for a compaction).
inline std::size_t device_count_above(exec<cuda> const& ex, float const* x, std::size_t n, std::uint32_t above,
                                      device_select_scratch& s, bool flag) {
  auto const p = s.current();
  auto* partial = s.at<unsigned long long>(p.partial);
  select_flag_kernel<<<select_cuda_tuning::blocks, select_cuda_tuning::block, 0, ex.stream>>>(
      x, n, above, partial, flag ? s.at<std::uint8_t>(p.flags) : nullptr, s.at<std::uint32_t>(p.idx));
  TIDE_CUDA_CHECK(cudaGetLastError());
  unsigned long long host[select_cuda_tuning::blocks];
  TIDE_CUDA_CHECK(cudaMemcpyAsync(host, partial, sizeof host, cudaMemcpyDeviceToHost, ex.stream));
  TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
  unsigned long long c = 0;
  for (unsigned long long v : host) c += v;
  return static_cast<std::size_t>(c);
}

// Sum (double) and max of |x|: per block on the fixed grid, combined here in block order.
inline std::pair<double, float> device_abs_sum_max(exec<cuda> const& ex, float const* x, std::size_t n,
                                                   device_select_scratch& s) {
  constexpr int B = select_cuda_tuning::blocks;
  auto const p = s.current();
  auto* sums = s.at<double>(p.partial);
  auto* maxes = reinterpret_cast<float*>(sums + B);
  select_sum_max_kernel<<<B, select_cuda_tuning::block, 0, ex.stream>>>(x, n, sums, maxes);
  TIDE_CUDA_CHECK(cudaGetLastError());
  double hs[B];
  float hm[B];
  TIDE_CUDA_CHECK(cudaMemcpyAsync(hs, sums, sizeof hs, cudaMemcpyDeviceToHost, ex.stream));
  TIDE_CUDA_CHECK(cudaMemcpyAsync(hm, maxes, sizeof hm, cudaMemcpyDeviceToHost, ex.stream));
  TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
  double sum = 0;
  float mx = 0;
  for (int b = 0; b < B; ++b) sum += hs[b], mx = std::max(mx, hm[b]);
  return {sum, mx};
}

// The indices the last device_count_above(flag = true) flagged, ascending into `to` (stable).
// Does not wait for the stream.
inline void device_compact(exec<cuda> const& ex, std::size_t n, std::uint32_t* to, device_select_scratch& s) {
  auto const p = s.current();
  std::size_t temp = select_temp_room(s);
  TIDE_CUDA_CHECK(cub::DeviceSelect::Flagged(s.at<void>(p.temp), temp, s.at<std::uint32_t const>(p.idx),
                                             s.at<std::uint8_t const>(p.flags), to,
                                             s.at<unsigned long long>(p.partial), static_cast<int>(n), ex.stream));
}

// The first m of n (key, index) pairs (the keys in s's keys buffer) in a stable descending sort
// by key, their indices ascending into out; returns m. Pairs given in index order keep it among
// equal keys: the top-m with ties to the lower index, as the host's.
inline std::size_t device_sorted_topk(exec<cuda> const& ex, std::size_t n, std::size_t m, std::uint32_t const* idx,
                                      std::uint32_t* idx_sorted, std::uint32_t* out, device_select_scratch& s) {
  auto const p = s.current();
  std::size_t temp = select_temp_room(s);
  TIDE_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      s.at<void>(p.temp), temp, s.at<std::uint32_t const>(p.keys), s.at<std::uint32_t>(p.keys_out), idx, idx_sorted,
      static_cast<int>(n), 0, 32, ex.stream));
  TIDE_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(s.at<void>(p.temp), temp, idx_sorted, out, static_cast<int>(m), 0,
                                                 32, ex.stream));
  TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
  return m;
}

// The top-k of [0, n) by key(i), ties to the lower index (exact_topk, random_k).
template <class Key>
std::size_t device_topk_by_key(exec<cuda> const& ex, std::size_t n, std::size_t k, Key key, std::uint32_t* out,
                               device_select_scratch& s) {
  std::size_t const m = std::min(k, n);
  if (m == 0) return 0;
  s.reserve(n, select_temp_bytes(n), ex.stream);
  auto const p = s.current();
  device_keys(ex, key, n, s.at<std::uint32_t>(p.keys), s.at<std::uint32_t>(p.idx));
  return device_sorted_topk(ex, n, m, s.at<std::uint32_t const>(p.idx), s.at<std::uint32_t>(p.idx_out), out, s);
}

// The top-k of the c (>= k) elements the last device_count_above(flag = true) flagged: the host's
// topk_of_candidates. Compacted in index order, then only they are sorted.
inline std::size_t device_topk_of_flagged(exec<cuda> const& ex, float const* x, std::size_t n, std::size_t c,
                                          std::size_t k, std::uint32_t* out, device_select_scratch& s) {
  auto const p = s.current();
  auto* cand = s.at<std::uint32_t>(p.idx_out);
  device_compact(ex, n, cand, s);
  device_keys(ex, select_gathered_abs_key{x, cand}, c, s.at<std::uint32_t>(p.keys), nullptr);
  return device_sorted_topk(ex, c, std::min(k, c), cand, s.at<std::uint32_t>(p.idx), out, s);
}

}  // namespace detail

// Device bytes a device_select_scratch needs for inputs of up to n elements.
inline std::size_t select_scratch_bytes(std::size_t n) {
  return device_select_scratch::layout(n, detail::select_temp_bytes(n)).total;
}

// The device exact_topk: the same indices as the host's exact_topk.
struct exact_topk_cuda {
  static constexpr std::string_view name = "exact_topk_cuda";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return k; }
  std::size_t select(exec<cuda> const& ex, tensor_view<float const, cuda> x, std::size_t k,
                     tensor_view<std::uint32_t, cuda> out, device_select_scratch& s) const {
    auto const n = static_cast<std::size_t>(x.size());
    detail::check_out(n, k, static_cast<std::size_t>(out.size()), capacity(k), name);
    return detail::device_topk_by_key(ex, n, k, detail::select_abs_key{x.data()}, out.data(), s);
  }
};

// The device trimmed_topk: the host's τ rule (its counts on the device), then the exact top-k of
// the candidates; the same indices as the host's trimmed_topk (and exact_topk).
struct trimmed_topk_cuda {
  static constexpr std::string_view name = "trimmed_topk_cuda";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return k; }
  float ratio = 0.5f;  // the first τ = mean + ratio (max − mean); halved until k elements exceed τ
  std::size_t select(exec<cuda> const& ex, tensor_view<float const, cuda> x, std::size_t k,
                     tensor_view<std::uint32_t, cuda> out, device_select_scratch& s) const {
    auto const n = static_cast<std::size_t>(x.size());
    detail::check_out(n, k, static_cast<std::size_t>(out.size()), capacity(k), name);
    if (k == 0 || n == 0) return 0;
    if (k >= n) return exact_topk_cuda{}.select(ex, x, k, out, s);
    s.reserve(n, detail::select_temp_bytes(n), ex.stream);
    auto const [sum, mx] = detail::device_abs_sum_max(ex, x.data(), n, s);
    auto const mean = static_cast<float>(sum / static_cast<double>(n));
    // Every count flags its candidates, so the count that fits leaves them for the compaction
    // (the host counts the final τ once more; the same count).
    auto count = [&](float t) { return detail::device_count_above(ex, x.data(), n, abs_key(t), s, true); };
    float r = ratio;
    float tau = mean + r * (mx - mean);
    std::size_t c = 0;
    bool fits = false;
    for (int step = 0; step < 64; ++step) {
      c = count(tau);
      if (c >= k) {
        fits = true;
        break;
      }
      r *= 0.5f;
      tau = r > 1e-3f ? mean + r * (mx - mean) : tau * 0.5f;  // then below the mean
      if (!(tau > 0.f)) break;
    }
    if (!fits && tau > 0.f) {  // the halvings ran out: the last τ, counted as the host does
      c = count(tau);
      fits = c >= k;
    }
    // τ not positive (a NaN among x makes the mean NaN) or too high: all elements are candidates.
    if (!fits || !(tau > 0.f)) return exact_topk_cuda{}.select(ex, x, k, out, s);
    return detail::device_topk_of_flagged(ex, x.data(), n, c, k, out.data(), s);
  }
};

// The device threshold_search: k <= count <= 2k elements above τ, τ bisected from device counts.
struct threshold_search_cuda {
  static constexpr std::string_view name = "threshold_search_cuda";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return 2 * k; }
  int max_probes = 40;
  float last_tau = 0;  // the τ of the last call (0: none)
  int probes = 0;      // the counting passes the last call took
  std::size_t select(exec<cuda> const& ex, tensor_view<float const, cuda> x, std::size_t k,
                     tensor_view<std::uint32_t, cuda> out, device_select_scratch& s) {
    auto const n = static_cast<std::size_t>(x.size());
    detail::check_out(n, k, static_cast<std::size_t>(out.size()), capacity(k), name);
    if (k == 0 || n == 0) return 0;
    if (2 * k >= n) return exact_topk_cuda{}.select(ex, x, k, out, s);
    s.reserve(n, detail::select_temp_bytes(n), ex.stream);
    float lo = 0, hi = std::numeric_limits<float>::infinity(), tau = last_tau;
    if (!(last_tau > 0.f)) {
      auto const [sum, mx] = detail::device_abs_sum_max(ex, x.data(), n, s);
      float const mean = static_cast<float>(sum / static_cast<double>(n));
      tau = mean + 0.5f * (mx - mean);
      hi = mx;
    }
    for (probes = 1; probes <= max_probes; ++probes) {
      std::size_t const c = detail::device_count_above(ex, x.data(), n, abs_key(tau), s, true);
      if (c >= k && c <= 2 * k) {
        last_tau = tau;
        detail::device_compact(ex, n, out.data(), s);
        TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
        return c;
      }
      (c < k ? hi : lo) = tau;
      float const next = std::isinf(hi) ? 2.f * tau : 0.5f * (lo + hi);
      if (next == tau || !(next > 0.f) || !std::isfinite(next)) break;
      tau = next;
    }
    last_tau = 0;
    return exact_topk_cuda{}.select(ex, x, k, out, s);
  }
};

// The device sampled_threshold: the host's sample (the same elements), its τ and halvings, from
// integer keys and counts: the same indices as the host's sampled_threshold.
struct sampled_threshold_cuda {
  static constexpr std::string_view name = "sampled_threshold_cuda";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return 2 * k; }
  double sample = 0.01;  // the fraction sampled (DGC: 0.1 % to 1 %)
  std::size_t select(exec<cuda> const& ex, tensor_view<float const, cuda> x, std::size_t k,
                     tensor_view<std::uint32_t, cuda> out, device_select_scratch& s) const {
    auto const n = static_cast<std::size_t>(x.size());
    detail::check_out(n, k, static_cast<std::size_t>(out.size()), capacity(k), name);
    TIDE_REQUIRE(sample > 0 && sample <= 1, "sampled_threshold_cuda: sample = ", sample, "; pass a fraction in (0, 1]");
    if (k == 0 || n == 0) return 0;
    if (2 * k >= n) return exact_topk_cuda{}.select(ex, x, k, out, s);
    s.reserve(n, detail::select_temp_bytes(n), ex.stream);
    auto const p = s.current();
    auto const stride = std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(1.0 / sample)));
    std::size_t const m = (n + stride - 1) / stride;
    std::size_t const want = std::clamp<std::size_t>((k * m + n - 1) / n, 1, m);
    // The sample's keys sorted ascending: the want-th largest is at m − want, the key the host's
    // nth_element finds.
    detail::device_keys(ex, detail::select_strided_abs_key{x.data(), stride}, m, s.at<std::uint32_t>(p.keys), nullptr);
    std::size_t temp = detail::select_temp_room(s);
    TIDE_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(s.at<void>(p.temp), temp, s.at<std::uint32_t const>(p.keys),
                                                   s.at<std::uint32_t>(p.keys_out), static_cast<int>(m), 0, 32,
                                                   ex.stream));
    std::uint32_t kth = 0;
    TIDE_CUDA_CHECK(cudaMemcpyAsync(&kth, s.at<std::uint32_t>(p.keys_out) + (m - want), sizeof kth,
                                    cudaMemcpyDeviceToHost, ex.stream));
    TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
    // "At or above τ" is "above the key just below it". Every count flags what it counted.
    auto count = [&](std::uint32_t above) { return detail::device_count_above(ex, x.data(), n, above, s, true); };
    std::uint32_t below = kth > 0 ? kth - 1 : 0;
    std::size_t c = count(below);
    for (int halvings = 0; c < k && below > 0 && halvings < 64; ++halvings) {  // the sample overestimated τ
      below = abs_key(std::bit_cast<float>(below) * 0.5f);
      c = count(below);
    }
    if (c < k) return exact_topk_cuda{}.select(ex, x, k, out, s);
    if (c <= 2 * k) {
      detail::device_compact(ex, n, out.data(), s);
      TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
      return c;
    }
    return detail::device_topk_of_flagged(ex, x.data(), n, c, k, out.data(), s);
  }
};

// The device random_k: the host's hash of (index, seed, call), so call j of a random_k_cuda
// chooses what call j of a host random_k with the same seed chooses.
struct random_k_cuda {
  static constexpr std::string_view name = "random_k_cuda";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return k; }
  std::uint32_t seed = 1;
  std::uint32_t calls = 0;  // counted as the host counts them: every call, even an empty one
  std::size_t select(exec<cuda> const& ex, tensor_view<float const, cuda> x, std::size_t k,
                     tensor_view<std::uint32_t, cuda> out, device_select_scratch& s) {
    auto const n = static_cast<std::size_t>(x.size());
    detail::check_out(n, k, static_cast<std::size_t>(out.size()), capacity(k), name);
    std::uint32_t const salt = mix32(seed * 0x9e3779b9u + calls++);
    return detail::device_topk_by_key(ex, n, k, detail::select_hash_key{salt}, out.data(), s);
  }
};

}  // namespace tide::compress
