#pragma once
// The device selectors of compress/select.hpp: threshold_search and exact_topk on a CUDA stream,
// with CUB's device-wide stable compaction and radix sort. The same keys as the host
// (abs_key: |x| as an order-preserving integer, NaN on top) and the same rules: exact_topk takes
// the k largest with ties to the lower index (a stable descending sort of (key, index) pairs), so
// it chooses exactly what the host chooses; threshold_search sends every element above a τ with
// k <= count <= 2k, τ bisected on the host from the device's counts and reused call to call. The
// mean of |x| that seeds the first τ is a fixed-order block reduction: deterministic on a given
// device, not bit-equal to the host's, so τ (and a threshold selection) may differ from the
// host's while holding the same guarantees.
//
//   tide::compress::device_select_scratch scratch;        // device buffers, grown on demand
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
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "tide/compress/select.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"

namespace tide::compress {

struct select_cuda_tuning {
  static constexpr int block = 256;
  static constexpr int blocks = 512;  // a fixed grid: the reductions' order depends on nothing else
};

// Device memory the device selectors use, grown on demand on the caller's stream and freed at
// destruction (after a device synchronisation).
class device_select_scratch {
 public:
  device_select_scratch() = default;
  device_select_scratch(device_select_scratch const&) = delete;
  device_select_scratch& operator=(device_select_scratch const&) = delete;
  ~device_select_scratch() {
    if (base_ != nullptr) {
      (void)cudaDeviceSynchronize();
      (void)cudaFree(base_);
    }
  }
  // Room for n elements' keys and indices (twice each, for a sort), flags, CUB's temporary
  // storage of `temp` bytes, and the partials.
  void reserve(std::size_t n, std::size_t temp, cudaStream_t stream) {
    if (n <= n_ && temp <= temp_) return;  // the current layout has room for both
    n = std::max(n, n_);
    temp = std::max(temp, temp_);
    std::size_t const need = layout(n, temp).total;
    if (base_ != nullptr) {
      TIDE_CUDA_CHECK(cudaStreamSynchronize(stream));
      TIDE_CUDA_CHECK(cudaFree(base_));
      base_ = nullptr;
      bytes_ = 0;
    }
    TIDE_CUDA_CHECK(cudaMalloc(&base_, need));
    bytes_ = need;
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
    return reinterpret_cast<T*>(static_cast<std::byte*>(base_) + offset);
  }
  [[nodiscard]] parts current() const { return layout(n_, temp_); }

 private:
  void* base_ = nullptr;
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
// Keys and indices for the sort.
__global__ void select_keys_kernel(float const* x, std::size_t n, std::uint32_t* keys, std::uint32_t* idx) {
  std::size_t const stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    keys[i] = abs_key(x[i]);
    idx[i] = static_cast<std::uint32_t>(i);
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

}  // namespace detail

// The device exact_topk: the same indices as the host's exact_topk.
struct exact_topk_cuda {
  static constexpr std::string_view name = "exact_topk_cuda";
  static constexpr std::size_t capacity(std::size_t k) noexcept { return k; }
  std::size_t select(exec<cuda> const& ex, tensor_view<float const, cuda> x, std::size_t k,
                     tensor_view<std::uint32_t, cuda> out, device_select_scratch& s) const {
    auto const n = static_cast<std::size_t>(x.size());
    detail::check_out(n, k, static_cast<std::size_t>(out.size()), capacity(k), name);
    std::size_t const m = std::min(k, n);
    if (m == 0) return 0;
    s.reserve(n, detail::select_temp_bytes(n), ex.stream);
    auto const p = s.current();
    detail::select_keys_kernel<<<select_cuda_tuning::blocks, select_cuda_tuning::block, 0, ex.stream>>>(
        x.data(), n, s.at<std::uint32_t>(p.keys), s.at<std::uint32_t>(p.idx));
    TIDE_CUDA_CHECK(cudaGetLastError());
    std::size_t temp = detail::select_temp_bytes(n);
    auto const items = static_cast<int>(n);
    // Stable: equal keys keep their index order, so the lower index comes first.
    TIDE_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
        s.at<void>(p.temp), temp, s.at<std::uint32_t const>(p.keys), s.at<std::uint32_t>(p.keys_out),
        s.at<std::uint32_t const>(p.idx), s.at<std::uint32_t>(p.idx_out), items, 0, 32, ex.stream));
    // The first m indices, ascending.
    TIDE_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(s.at<void>(p.temp), temp, s.at<std::uint32_t const>(p.idx_out),
                                                   out.data(), static_cast<int>(m), 0, 32, ex.stream));
    TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
    return m;
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
    auto const p = s.current();
    float lo = 0, hi = std::numeric_limits<float>::infinity(), tau = last_tau;
    if (!(last_tau > 0.f)) {
      constexpr int B = select_cuda_tuning::blocks;
      auto* sums = s.at<double>(p.partial);
      auto* maxes = reinterpret_cast<float*>(sums + B);
      detail::select_sum_max_kernel<<<B, select_cuda_tuning::block, 0, ex.stream>>>(x.data(), n, sums, maxes);
      TIDE_CUDA_CHECK(cudaGetLastError());
      double hs[B];
      float hm[B];
      TIDE_CUDA_CHECK(cudaMemcpyAsync(hs, sums, sizeof hs, cudaMemcpyDeviceToHost, ex.stream));
      TIDE_CUDA_CHECK(cudaMemcpyAsync(hm, maxes, sizeof hm, cudaMemcpyDeviceToHost, ex.stream));
      TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
      double sum = 0;
      float mx = 0;
      for (int b = 0; b < B; ++b) sum += hs[b], mx = std::max(mx, hm[b]);
      float const mean = static_cast<float>(sum / static_cast<double>(n));
      tau = mean + 0.5f * (mx - mean);
      hi = mx;
    }
    for (probes = 1; probes <= max_probes; ++probes) {
      std::size_t const c = detail::device_count_above(ex, x.data(), n, abs_key(tau), s, true);
      if (c >= k && c <= 2 * k) {
        last_tau = tau;
        std::size_t temp = detail::select_temp_bytes(n);
        auto* count = s.at<unsigned long long>(p.partial);
        // Stable: the indices come out ascending.
        TIDE_CUDA_CHECK(cub::DeviceSelect::Flagged(s.at<void>(p.temp), temp, s.at<std::uint32_t const>(p.idx),
                                                   s.at<std::uint8_t const>(p.flags), out.data(), count,
                                                   static_cast<int>(n), ex.stream));
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

}  // namespace tide::compress
