#pragma once
// device_arena<tide::cuda>: the budgeted arena over one cudaMalloc'ed region on the device that is
// current at construction. Same heap, API, stats and errors as tide::host (device_arena.hpp);
// the pointers are device memory. CUDA failures throw tide::error(cuda).

#include <cuda_runtime.h>

#include <cstddef>

#include "tide/core/cuda.cuh"
#include "tide/memory/device_arena.hpp"

namespace tide::memory {

namespace detail {

template <>
class device_region<cuda> {
 public:
  // cudaMalloc aligns to at least 256 bytes; the heap aligns relative to the actual address, so
  // larger alignments hold too.
  device_region(std::size_t bytes, std::size_t /*alignment*/) {
    TIDE_CUDA_CHECK(cudaMalloc(&data_, bytes));
  }
  ~device_region() { (void)cudaFree(data_); }
  device_region(device_region const&) = delete;
  device_region& operator=(device_region const&) = delete;

  [[nodiscard]] void* data() const noexcept { return data_; }
  static void mark_live(void*, std::size_t) noexcept {}
  static void mark_free(void*, std::size_t) noexcept {}
  // The current device's memory (0 when there is no device: cudaMalloc then reports).
  [[nodiscard]] static std::size_t capacity() noexcept {
    std::size_t free = 0, total = 0;
    return cudaMemGetInfo(&free, &total) == cudaSuccess ? total : 0;
  }

 private:
  void* data_ = nullptr;
};

}  // namespace detail

static_assert(MemoryResource<device_arena<cuda>>);

}  // namespace tide::memory
