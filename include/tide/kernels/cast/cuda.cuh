#pragma once
// The CUDA path of tide::kernels::cast: a grid-stride kernel that moves 128 bits of source per
// load when both pointers allow it, and converts with the same TIDE_HOST_DEVICE functions as
// the host path, so both backends give the same bits.
//
//   tide::exec<tide::cuda> ex{.stream = s, .blas = handle};
//   tide::kernels::cast(ex, x, y);   // x, y: device memory, same shape; enqueued on ex.stream

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tide/core/backend.hpp"
#include "tide/core/config.hpp"
#include "tide/core/cuda.cuh"
#include "tide/core/dtype.hpp"
#include "tide/core/exec.cuh"
#include "tide/core/tensor_view.hpp"
#include "tide/kernels/cast/cast.hpp"

namespace tide::kernels {
TIDE_ABI_NAMESPACE_BEGIN

// Not tuned on a GPU yet (none where this was written): 256 threads and 8 resident blocks per
// SM fill the 2048 threads of an sm_80 / sm_90 SM; a streaming kernel needs nothing more.
struct cast_tuning {
  static constexpr int block = 256;
  static constexpr int blocks_per_sm = 8;
};

// Elements of From in one 128-bit load.
template <class From>
inline constexpr int cast_width = 16 / static_cast<int>(sizeof(From));

// Width elements moved as one aligned load or store.
template <class T, int Width>
struct alignas(sizeof(T) * Width) cast_pack {
  T v[Width];
};

// dst[i] = To(float(src[i])), i in [0, n). Width > 1: src and dst are aligned to a whole pack;
// threads take packs grid-stride, then the n % Width tail element by element.
template <class From, class To, int Width>
__global__ void __launch_bounds__(cast_tuning::block)
    cast_kernel(From const* __restrict__ src, To* __restrict__ dst, index_t n) {
  index_t const stride = static_cast<index_t>(blockDim.x) * gridDim.x;
  index_t const first = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  index_t const packs = n / Width;
  auto const* in = reinterpret_cast<cast_pack<From, Width> const*>(src);
  auto* out = reinterpret_cast<cast_pack<To, Width>*>(dst);
  for (index_t p = first; p < packs; p += stride) {
    cast_pack<From, Width> const a = in[p];
    cast_pack<To, Width> b;
#pragma unroll
    for (int k = 0; k < Width; ++k) b.v[k] = from_float<To>(to_float(a.v[k]));
    out[p] = b;
  }
  for (index_t i = packs * Width + first; i < n; i += stride) dst[i] = from_float<To>(to_float(src[i]));
}

// dst = To(src) on ex.stream, asynchronously; both views are device memory. Throws before
// enqueuing anything when the shapes differ, a view is strided or the two overlap.
template <class From, class To>
  requires Element<std::remove_const_t<From>> && Element<To>
void cast(exec<tide::cuda> const& ex, tensor_view<From, tide::cuda> src, tensor_view<To, tide::cuda> dst) {
  cudaStream_t const stream = ex.stream;
  using source = std::remove_const_t<From>;
  detail::check_cast(src, dst);
  index_t const n = src.size();
  if (n == 0) return;
  if constexpr (std::is_same_v<source, To>) {
    TIDE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.bytes(), cudaMemcpyDefault, stream));
  } else {
    constexpr int width = cast_width<source>;
    bool const aligned = reinterpret_cast<std::uintptr_t>(src.data()) % alignof(cast_pack<source, width>) == 0 &&
                         reinterpret_cast<std::uintptr_t>(dst.data()) % alignof(cast_pack<To, width>) == 0;
    int device = 0, sms = 0;
    TIDE_CUDA_CHECK(cudaGetDevice(&device));
    TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    index_t const items = aligned ? n / width + 1 : n;
    index_t const needed = (items + cast_tuning::block - 1) / cast_tuning::block;
    auto const blocks = static_cast<unsigned>(std::clamp<index_t>(needed, 1, index_t{sms} * cast_tuning::blocks_per_sm));
    if (aligned)
      cast_kernel<source, To, width><<<blocks, cast_tuning::block, 0, stream>>>(src.data(), dst.data(), n);
    else
      cast_kernel<source, To, 1><<<blocks, cast_tuning::block, 0, stream>>>(src.data(), dst.data(), n);
    TIDE_CUDA_CHECK(cudaGetLastError());
  }
}

TIDE_ABI_NAMESPACE_END
}  // namespace tide::kernels
