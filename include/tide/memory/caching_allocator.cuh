#pragma once
// caching_allocator<tide::cuda>: the caching allocator of caching_allocator.hpp, stream-ordered.
// A buffer deallocated on stream S is cached with an event recorded on S. A request on S gets it
// back at once (work on S stays in order); a request on another stream gets it only once that
// event has completed, so it never races S's pending kernels. Returning cached buffers to the
// arena (release_cached, or a full arena) first waits for their events.
//
//   caching_allocator<tide::cuda> workspace{arena};
//   void* w = workspace.allocate_async(bytes, 256, stream);
//   kernel<<<grid, block, 0, stream>>>(w);
//   workspace.deallocate_async(w, bytes, 256, stream);   // S must be the last stream that used w
//
// allocate/deallocate without a stream use the legacy default stream.

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "tide/core/cuda.cuh"
#include "tide/memory/caching_allocator.hpp"
#include "tide/memory/device_arena.cuh"

namespace tide::memory {

template <>
class caching_allocator<cuda> {
 public:
  using backend = cuda;

  explicit caching_allocator(device_arena<cuda>& arena) : cache_(arena) {
    spare_events_.reserve(cache_.capacity());  // one event per cached buffer at most
  }
  ~caching_allocator() {
    if (!cache_.valid()) return;
    try {
      release_cached();
    } catch (...) {  // a CUDA error at teardown: nothing left to do with it
    }
    for (cudaEvent_t e : spare_events_) (void)cudaEventDestroy(e);
  }
  caching_allocator(caching_allocator&&) noexcept = default;
  caching_allocator& operator=(caching_allocator&&) = delete;
  caching_allocator(caching_allocator const&) = delete;
  caching_allocator& operator=(caching_allocator const&) = delete;

  // A buffer of at least `bytes`, ready for use on `stream`.
  [[nodiscard]] void* allocate_async(std::size_t bytes, std::size_t alignment, cudaStream_t stream) {
    TIDE_REQUIRE(is_power_of_two(alignment), "caching_allocator<cuda>::allocate_async: alignment ", alignment,
                 " is not a power of two");
    return cache_.allocate(
        bytes, alignment,
        [stream](tag& t) { return t.stream == stream || cudaEventQuery(t.event) == cudaSuccess; },
        [this](tag& t) { spare_events_.push_back(t.event); },
        [this](tag& t) {
          TIDE_CUDA_CHECK(cudaEventSynchronize(t.event));
          spare_events_.push_back(t.event);
        });
  }

  // Caches the buffer; `stream` must be the last stream that used it.
  void deallocate_async(void* p, std::size_t bytes, std::size_t /*alignment*/, cudaStream_t stream) {
    cache_.deallocate(p, bytes, [&] {
      cudaEvent_t e = nullptr;
      if (spare_events_.empty()) {
        TIDE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      } else {
        e = spare_events_.back();
        spare_events_.pop_back();
      }
      if (cudaError_t const status = cudaEventRecord(e, stream); status != cudaSuccess) {
        spare_events_.push_back(e);
        TIDE_CUDA_CHECK(status);
      }
      return tag{stream, e};
    });
  }

  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = 256) {
    return allocate_async(bytes, alignment, cudaStream_t{});
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = 256) {
    deallocate_async(p, bytes, alignment, cudaStream_t{});
  }

  // Waits for the cached buffers' events, then returns the buffers to the arena.
  void release_cached() {
    cache_.release_all([this](tag& t) {
      TIDE_CUDA_CHECK(cudaEventSynchronize(t.event));
      spare_events_.push_back(t.event);
    });
  }

  [[nodiscard]] caching_stats stats() const { return cache_.stats(); }
  [[nodiscard]] device_arena<cuda>& arena() const noexcept { return cache_.arena(); }

 private:
  struct tag {
    cudaStream_t stream = nullptr;
    cudaEvent_t event = nullptr;
  };

  detail::block_cache<cuda, tag> cache_;
  std::vector<cudaEvent_t> spare_events_;  // guarded by the cache's mutex: touched only in its callbacks
};

static_assert(MemoryResource<caching_allocator<cuda>>);

}  // namespace tide::memory
