#pragma once
// pinned_pool<tide::cuda>: the size-class pool of pinned_pool.hpp over cudaHostAlloc'ed blocks
// (portable: pinned for every CUDA context), the staging memory cudaMemcpyAsync needs to overlap.
// CUDA failures throw tide::error(cuda); every block counts as locked. When cudaHostAlloc runs
// out of memory, the message also says what to change in a trainer's options, as pinned_pool<host>
// does: a smaller model or a larger device_budget (lock_host_pages does not apply: this pool pins
// every block).

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
    cudaError_t const status = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it, so a later check does not report it again
      TIDE_FAIL(cuda, "pinned_pool<cuda>: cudaHostAlloc of ", bytes, " bytes (", bytes_of{bytes}, ") returned ",
                cudaGetErrorName(status), " (", cudaGetErrorString(status),
                "): the host is out of pinned memory for model data (an offload scheduler keeps the model data "
                "that is not on the device there); train a smaller model, or give the trainer a larger "
                "device_budget (more model data on the device); lock_host_pages = false does not help here: "
                "pinned_pool<cuda> pins every block");
    }
    TIDE_CUDA_CHECK(status);
    return {p, true};
  }

  static void release(void* p, std::size_t) noexcept { (void)cudaFreeHost(p); }
};

}  // namespace detail

static_assert(MemoryResource<pinned_pool<cuda>>);

}  // namespace tide::memory
