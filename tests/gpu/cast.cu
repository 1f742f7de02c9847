// tide::kernels::cast on a device against the scalar reference, bit for bit: every pair of
// f32, bf16, f16, sizes around the vector width, aligned (128-bit path) and misaligned (scalar
// path) pointers, NaN, Inf and subnormals. Bad calls throw before anything is enqueued.
// Exit 77 (ctest: skipped) without a device or a driver (skip.cuh), after checking what runs
// without one: TIDE_CUDA_CHECK's error, and has_cuda_device() giving one answer twice.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <tide/kernels/cast/cuda.cuh>
#include <tide/kernels/cast/reference.hpp>

#include "skip.cuh"

namespace {

int failures = 0;

void expect(bool ok, char const* what, long long detail = 0) {
  if (!ok) {
    ++failures;
    std::printf("FAILED: %s (%lld)\n", what, detail);
  }
}

template <class T>
std::uint32_t bits_of(T x) {
  if constexpr (sizeof(T) == 4) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  } else {
    std::uint16_t u;
    std::memcpy(&u, &x, 2);
    return u;
  }
}

// Random floats with the special values mixed in; 16-bit inputs are drawn as random patterns.
template <class T>
std::vector<T> inputs(std::size_t n, std::mt19937& rng) {
  std::vector<T> v(n);
  float const specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(), 1e-40f, 5.96e-8f, 65520.0f, 1.0f + 0x1p-8f};
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      auto const u = static_cast<std::uint32_t>(rng());
      float f;
      std::memcpy(&f, &u, 4);
      v[i] = i % 7 == 3 ? specials[(i / 7) % std::size(specials)] : f;
    } else {
      v[i] = T::from_bits(static_cast<std::uint16_t>(rng()));
    }
  }
  return v;
}

template <class From, class To>
void check_pair(char const* name, tide::exec<tide::cuda> const& ex, std::mt19937& rng) {
  // n: empty, below, at and above the vector width, and a grid-stride size with a tail.
  for (std::int64_t n : {0, 1, 3, 4, 7, 8, 9, 17, 1000, (1 << 20) + 5}) {
    for (std::int64_t offset : {0, 1}) {  // offset 1 misaligns both pointers: the scalar kernel
      auto const x = inputs<From>(static_cast<std::size_t>(n + offset), rng);
      std::vector<To> want(static_cast<std::size_t>(n + offset)), got(want.size());
      tide::kernels::reference::cast(tide::tensor_view<From const>{x.data() + offset, {n}},
                                     tide::tensor_view<To>{want.data() + offset, {n}});
      From* dx = nullptr;
      To* dy = nullptr;
      TIDE_CUDA_CHECK(cudaMalloc(&dx, x.size() * sizeof(From) + 16));
      TIDE_CUDA_CHECK(cudaMalloc(&dy, got.size() * sizeof(To) + 16));
      TIDE_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * sizeof(From), cudaMemcpyHostToDevice));
      TIDE_CUDA_CHECK(cudaMemset(dy, 0, got.size() * sizeof(To)));
      tide::kernels::cast(ex, tide::tensor_view<From const, tide::cuda>{dx + offset, {n}},
                          tide::tensor_view<To, tide::cuda>{dy + offset, {n}});
      TIDE_CUDA_CHECK(cudaStreamSynchronize(ex.stream));
      TIDE_CUDA_CHECK(cudaMemcpy(got.data(), dy, got.size() * sizeof(To), cudaMemcpyDeviceToHost));
      TIDE_CUDA_CHECK(cudaFree(dx));
      TIDE_CUDA_CHECK(cudaFree(dy));
      std::int64_t bad = 0;
      for (std::int64_t i = offset; i < n + offset; ++i)
        bad += bits_of(got[static_cast<std::size_t>(i)]) != bits_of(want[static_cast<std::size_t>(i)]);
      if (bad) std::printf("%s n=%lld offset=%lld: %lld elements differ\n", name, static_cast<long long>(n),
                           static_cast<long long>(offset), static_cast<long long>(bad));
      expect(bad == 0, name, n);
    }
  }
}

}  // namespace

int main() {
  bool threw = false;
  try {
    TIDE_CUDA_CHECK(cudaErrorInvalidValue);
  } catch (tide::error const& e) {
    threw = e.category() == tide::errc::cuda && e.message().find("cudaErrorInvalidValue") != std::string::npos;
  }
  expect(threw, "TIDE_CUDA_CHECK throws tide::error(cuda) naming the error");
  bool const device = tide::has_cuda_device();
  expect(tide::has_cuda_device() == device, "has_cuda_device gives the same answer twice");
  if (failures) return 1;
  if (int const code = tide::test::gpu_or_skip(); code != 0) return code;
  using tide::bf16;
  using tide::f16;
  cudaStream_t stream = nullptr;
  TIDE_CUDA_CHECK(cudaStreamCreate(&stream));
  tide::exec<tide::cuda> const ex{.stream = stream};
  std::mt19937 rng(20240601);
  check_pair<float, bf16>("f32 -> bf16", ex, rng);
  check_pair<float, f16>("f32 -> f16", ex, rng);
  check_pair<bf16, float>("bf16 -> f32", ex, rng);
  check_pair<f16, float>("f16 -> f32", ex, rng);
  check_pair<bf16, f16>("bf16 -> f16", ex, rng);
  check_pair<f16, bf16>("f16 -> bf16", ex, rng);
  check_pair<float, float>("f32 -> f32", ex, rng);

  // Shape mismatch: a usage error, thrown before anything is enqueued.
  float* d = nullptr;
  TIDE_CUDA_CHECK(cudaMalloc(&d, 64 * sizeof(float)));
  threw = false;
  try {
    tide::kernels::cast(ex, tide::tensor_view<float const, tide::cuda>{d, {4, 8}},
                        tide::tensor_view<bf16, tide::cuda>{reinterpret_cast<bf16*>(d + 32), {8, 4}});
  } catch (tide::error const& e) {
    threw = e.category() == tide::errc::usage;
  }
  expect(threw, "shape mismatch throws a usage error");
  TIDE_CUDA_CHECK(cudaFree(d));
  TIDE_CUDA_CHECK(cudaStreamDestroy(stream));

  std::printf("%s\n", failures == 0 ? "all casts match the reference" : "some casts differ");
  return failures == 0 ? 0 : 1;
}
