#pragma once
// The machine's own limits, measured by probes on 2 threads. Benchmarks divide by these when a
// figure has no better anchor.
//
//   copy_probe       b = a                       GB/s of payload (STREAM "Copy" counts 2x this)
//   stream_probe     read p, g, m, v; write p, m, v in place (AdamW's traffic without the math):
//                    28 B per fp32 element
//   triad_probe      a = b + s * c               12 B per element (no write-allocate counted)
//   fma_probe        FLOP/s of independent fused multiply-adds on the widest vectors g++ emits
//   sgemm_probe      OpenBLAS sgemm, n = 2048    FLOP/s (when tide::blas is linked)

#include <cstddef>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "harness.hpp"

#if defined(TIDE_HAS_BLAS)
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

namespace tide::bench {

inline constexpr int probe_threads = 2;

// Runs f(begin, end) on `threads` threads over [0, n), as even slices.
template <class F>
void parallel_slices(std::size_t n, int threads, F&& f) {
  std::vector<std::thread> pool;
  std::size_t const per = (n + threads - 1) / threads;
  for (int t = 1; t < threads; ++t) {
    std::size_t const b = std::min(n, per * t), e = std::min(n, per * (t + 1));
    pool.emplace_back([&f, b, e] { f(b, e); });
  }
  f(0, std::min(n, per));
  for (auto& th : pool) th.join();
}

// Page-touched float arrays, touched by the threads that will use them.
struct arrays {
  std::vector<std::unique_ptr<float[]>> data;
  std::size_t n;
  arrays(int count, std::size_t elems) : n(elems) {
    for (int i = 0; i < count; ++i) {
      data.emplace_back(new float[elems]);
      float* p = data.back().get();
      parallel_slices(elems, probe_threads, [p](std::size_t b, std::size_t e) {
        for (std::size_t j = b; j < e; ++j) p[j] = 1.0f + static_cast<float>(j & 7) * 1e-3f;
      });
    }
  }
  float* operator[](int i) const { return data[static_cast<std::size_t>(i)].get(); }
};

inline std::size_t probe_elems() { return quick() ? (std::size_t{4} << 20) : (std::size_t{64} << 20); }

inline double copy_probe_gbs(std::size_t elems = probe_elems()) {
  arrays a(2, elems);
  double const s = median_seconds([&] {
    parallel_slices(elems, probe_threads, [&](std::size_t b, std::size_t e) {
      std::memcpy(a[1] + b, a[0] + b, (e - b) * sizeof(float));
    });
  });
  return static_cast<double>(elems * sizeof(float)) / s / 1e9;
}

inline double stream_probe_gbs(std::size_t elems = probe_elems()) {
  arrays a(4, elems);  // p, g, m, v
  float* p = a[0];
  float const* g = a[1];
  float* m = a[2];
  float* v = a[3];
  double const s = median_seconds([&] {
    parallel_slices(elems, probe_threads, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        float const gi = g[i], mi = m[i], vi = v[i], pi = p[i];
        m[i] = mi + gi;  // no Adam math: adds that keep every load and store alive
        v[i] = vi + gi;
        p[i] = pi + mi;
      }
    });
  });
  keep(p[elems / 2]);
  return 28.0 * static_cast<double>(elems) / s / 1e9;
}

inline double triad_probe_gbs(std::size_t elems = probe_elems()) {
  arrays a(3, elems);
  float const scale = 1.0001f;
  double const s = median_seconds([&] {
    parallel_slices(elems, probe_threads, [&](std::size_t b, std::size_t e) {
      float* x = a[0];
      float const* y = a[1];
      float const* z = a[2];
      for (std::size_t i = b; i < e; ++i) x[i] = y[i] + scale * z[i];
    });
  });
  keep(a[0][elems / 3]);
  return 12.0 * static_cast<double>(elems) / s / 1e9;
}

inline double fma_probe_gflops() {
  using vec = float __attribute__((vector_size(64)));  // 16 floats: one zmm with AVX-512
  constexpr int chains = 12;                           // enough independent FMAs to fill the pipes
  long const iters = quick() ? 2'000'000 : 20'000'000;
  double const s = median_seconds([&] {
    parallel_slices(probe_threads, probe_threads, [&](std::size_t, std::size_t) {
      vec acc[chains];
      vec const x = vec{} + 0.999999f, y = vec{} + 1e-7f;
      for (int c = 0; c < chains; ++c) acc[c] = vec{} + static_cast<float>(c);
      for (long i = 0; i < iters; ++i)
        for (int c = 0; c < chains; ++c) acc[c] = acc[c] * x + y;
      vec sum{};
      for (int c = 0; c < chains; ++c) sum += acc[c];
      keep(sum);
    });
  }, 3, 1);
  double const flops = 2.0 * 16 * chains * static_cast<double>(iters) * probe_threads;
  return flops / s / 1e9;
}

#if defined(TIDE_HAS_BLAS)
inline double sgemm_probe_gflops(int n = 0) {
  if (n == 0) n = quick() ? 512 : 2048;
  openblas_set_num_threads(probe_threads);
  std::size_t const nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<float> a(nn, 0.5f), b(nn, 0.25f), c(nn, 0.f);
  double const s = median_seconds([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f,
                c.data(), n);
  }, 5, 1);
  keep(c[nn / 2]);
  return 2.0 * n * static_cast<double>(n) * n / s / 1e9;
}
#endif

}  // namespace tide::bench
