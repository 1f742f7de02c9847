#pragma once
// pinned_pool<tide::cuda>: the size-class pool of pinned_pool.hpp over cudaHostAlloc'ed blocks
// (portable: pinned for every CUDA context), the staging memory cudaMemcpyAsync needs to overlap.
// CUDA failures throw tide::error(cuda); every block counts as locked.

#include <cuda_runtime.h>

#include <cstddef>

#include "tide/core/cuda.cuh"
#include "tide/memory/pinned_pool.hpp"

namespace tide::memory {

namespace detail {

template <>
struct pinned_pages<cuda> {
  struct block {
    void* ptr;
    bool locked;
  };

  [[nodiscard]] static std::size_t page_size() noexcept { return pinned_pages<host>::page_size(); }

  [[nodiscard]] static block acquire(std::size_t bytes, bool /*lock: always pinned*/) {
    void* p = nullptr;
    TIDE_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    return {p, true};
  }

  static void release(void* p, std::size_t) noexcept { (void)cudaFreeHost(p); }
};

}  // namespace detail

static_assert(MemoryResource<pinned_pool<cuda>>);

}  // namespace tide::memory
