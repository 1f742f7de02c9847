#pragma once
// The host path of tide::kernels::cast: a flat loop over contiguous elements that g++
// vectorises (no aliasing through __restrict, branch-free conversions from dtype.hpp), split
// over the pool's threads in fixed blocks. Elementwise, so any thread count gives the same bits.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::kernels::detail {

// Not measured yet: 64 KiB of f32 per block, large enough that a thread's slice dwarfs the cost
// of waking it, small enough that a 2-thread pool gets work from 128 Ki elements on.
struct cast_host_tuning {
  static constexpr index_t block = 16384;
};

// dst[i] = To(float(src[i])) for i in [0, n). Same element type: a plain copy, bits preserved.
template <Element From, Element To>
void cast_contiguous(From const* __restrict src, To* __restrict dst, index_t n) noexcept {
  if constexpr (std::is_same_v<From, To>) {
    if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(To));
  } else {
    for (index_t i = 0; i < n; ++i) dst[i] = from_float<To>(to_float(src[i]));
  }
}

template <Element From, Element To>
void cast_host(thread_pool& pool, From const* src, To* dst, index_t n) {
  constexpr index_t block = cast_host_tuning::block;
  auto const blocks = static_cast<std::size_t>((n + block - 1) / block);
  parallel_for(pool, blocks, [&](std::size_t b, std::size_t e) {
    index_t const first = static_cast<index_t>(b) * block;
    index_t const last = std::min(n, static_cast<index_t>(e) * block);
    cast_contiguous(src + first, dst + first, last - first);
  });
}

}  // namespace tide::kernels::detail
