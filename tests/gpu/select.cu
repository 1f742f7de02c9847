// The device selectors of compress/select.cuh against the host's: exact_topk_cuda,
// trimmed_topk_cuda and sampled_threshold_cuda choose exactly the host exact_topk's,
// trimmed_topk's and sampled_threshold's indices, and random_k_cuda the host random_k's call by
// call, on inputs with many equal magnitudes, with a NaN (the mean of |x| is NaN: trimmed_topk
// falls back to the exact top-k) and without (its τ narrows the candidates);
// threshold_search_cuda chooses k to 2k ascending indices that hold the top-k, and takes one
// probe when called again on the same values. Exit 77 (ctest: skipped) without a device.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <vector>

#include <tide/compress/select.cuh>
#include <tide/core/parallel.hpp>

#include "skip.cuh"

namespace {

int failures = 0;

void expect(bool ok, char const* what, long long detail = 0) {
  if (!ok) {
    ++failures;
    std::printf("FAILED: %s (%lld)\n", what, detail);
  }
}

std::vector<float> values(std::size_t n, std::uint32_t seed) {
  std::vector<float> x(n);
  std::uint32_t s = seed;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    float const u = static_cast<float>(s >> 8) / 16777216.f;
    float v = (s & 3u) == 0 ? std::floor(u * 64.f) / 64.f : u * u * u * 4.f;
    x[i] = (s & 16u) != 0 ? -v : v;
  }
  return x;
}

// What a device selector chooses, copied back (out has room for capacity(k)).
template <class Sel>
std::vector<std::uint32_t> on_device(Sel& sel, tide::exec<tide::cuda> const& ex,
                                     tide::tensor_view<float const, tide::cuda> x, std::size_t k, std::uint32_t* dout,
                                     tide::compress::device_select_scratch& scratch) {
  tide::tensor_view<std::uint32_t, tide::cuda> ov(dout, {static_cast<tide::index_t>(Sel::capacity(k))});
  std::vector<std::uint32_t> got(sel.select(ex, x, k, ov, scratch));
  TIDE_CUDA_CHECK(cudaMemcpy(got.data(), dout, got.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
  return got;
}
template <class Sel>
std::vector<std::uint32_t> on_host(Sel& sel, tide::exec<tide::host> const& hx, std::span<float const> x,
                                   std::size_t k) {
  std::vector<std::uint32_t> out(Sel::capacity(k));
  out.resize(sel.select(hx, x, k, out));
  return out;
}

}  // namespace

int main() {
  if (int const code = tide::test::gpu_or_skip(); code != 0) return code;
  cudaStream_t stream = nullptr;
  TIDE_CUDA_CHECK(cudaStreamCreate(&stream));
  tide::exec<tide::cuda> const ex{stream, nullptr};
  tide::thread_pool pool(2);
  tide::exec<tide::host> const hx{pool};
  // The selectors' scratch: the caller's, for the largest input below.
  std::size_t const scratch_bytes = tide::compress::select_scratch_bytes(std::size_t{1} << 20);
  std::byte* scratch_memory = nullptr;
  TIDE_CUDA_CHECK(cudaMalloc(&scratch_memory, scratch_bytes));
  tide::compress::device_select_scratch scratch{{scratch_memory, scratch_bytes}};
  for (std::size_t n : {std::size_t{1000}, std::size_t{70001}, std::size_t{1} << 20}) {
    for (bool const nan : {true, false}) {
      auto x = values(n, static_cast<std::uint32_t>(n));
      if (nan) x[n / 3] = std::numeric_limits<float>::quiet_NaN();
      float* dx = nullptr;
      std::uint32_t* dout = nullptr;
      TIDE_CUDA_CHECK(cudaMalloc(&dx, n * sizeof(float)));
      TIDE_CUDA_CHECK(cudaMalloc(&dout, n * sizeof(std::uint32_t)));
      TIDE_CUDA_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      for (std::size_t k : {std::size_t{1}, std::size_t{10}, n / 100, n / 3}) {
        tide::tensor_view<float const, tide::cuda> const xv(dx, {static_cast<tide::index_t>(n)});
        std::vector<std::uint32_t> want(k), got(2 * k);
        tide::compress::exact_topk host_sel;
        want.resize(host_sel.select(hx, x, k, want));
        tide::tensor_view<std::uint32_t, tide::cuda> ov(dout, {static_cast<tide::index_t>(k)});
        std::size_t const m = tide::compress::exact_topk_cuda{}.select(ex, xv, k, ov, scratch);
        got.resize(m);
        TIDE_CUDA_CHECK(cudaMemcpy(got.data(), dout, m * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
        expect(got == want, "exact_topk_cuda chooses the host's indices", static_cast<long long>(k));

        tide::compress::threshold_search_cuda t;
        tide::tensor_view<std::uint32_t, tide::cuda> ov2(dout, {static_cast<tide::index_t>(2 * k)});
        std::size_t const c = t.select(ex, xv, k, ov2, scratch);
        std::vector<std::uint32_t> sel(c);
        TIDE_CUDA_CHECK(cudaMemcpy(sel.data(), dout, c * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
        expect(c >= k && c <= 2 * k, "threshold_search_cuda sends k to 2k", static_cast<long long>(c));
        bool ascending = true;
        for (std::size_t i = 1; i < sel.size(); ++i) ascending = ascending && sel[i] > sel[i - 1];
        expect(ascending, "threshold_search_cuda's indices ascend");
        std::size_t held = 0;
        for (std::uint32_t i : want) held += std::binary_search(sel.begin(), sel.end(), i) ? 1 : 0;
        expect(held == want.size(), "threshold_search_cuda holds the top-k", static_cast<long long>(held));
        if (2 * k < n) {
          (void)t.select(ex, xv, k, ov2, scratch);
          expect(t.probes == 1, "threshold_search_cuda reuses its last τ", t.probes);
        }

        tide::compress::trimmed_topk trimmed;
        tide::compress::trimmed_topk_cuda trimmed_cuda;
        expect(on_device(trimmed_cuda, ex, xv, k, dout, scratch) == on_host(trimmed, hx, x, k),
               "trimmed_topk_cuda chooses the host's indices", static_cast<long long>(k));

        tide::compress::sampled_threshold sampled;
        tide::compress::sampled_threshold_cuda sampled_cuda;
        expect(on_device(sampled_cuda, ex, xv, k, dout, scratch) == on_host(sampled, hx, x, k),
               "sampled_threshold_cuda chooses the host's indices", static_cast<long long>(k));

        tide::compress::random_k rk{.seed = 7};
        tide::compress::random_k_cuda rk_cuda{.seed = 7};
        for (int call = 0; call < 2; ++call)
          expect(on_device(rk_cuda, ex, xv, k, dout, scratch) == on_host(rk, hx, x, k),
                 "random_k_cuda chooses the host's indices, call by call", call);
      }
      TIDE_CUDA_CHECK(cudaFree(dx));
      TIDE_CUDA_CHECK(cudaFree(dout));
    }
  }
  TIDE_CUDA_CHECK(cudaFree(scratch_memory));
  TIDE_CUDA_CHECK(cudaStreamDestroy(stream));
  if (failures == 0) std::puts("ok");
  return failures == 0 ? 0 : 1;
}
