#pragma once
// stream<cuda> and event<cuda>: RAII over a non-blocking cudaStream_t and a cudaEvent_t, with the
// names of the host backend (stream.hpp), so code written against one compiles against the other.
//
//   tide::memory::device_streams<tide::cuda> s{{.device = 0}};
//   tide::memory::event<tide::cuda> ready;
//   s.copy.copy(dev, pinned, bytes);          // cudaMemcpyAsync(..., cudaMemcpyDefault, copy)
//   ready.record(s.copy);
//   s.compute.wait(ready);                    // cudaStreamWaitEvent
//   tide::memory::launch(s.compute, f);       // cudaLaunchHostFunc; keep f alive until it ran
//
// The streams are created non-blocking (no implicit ordering with the legacy default stream).
// The destructor synchronizes, then destroys (the host backend drains too). Errors are
// tide::error(cuda); a sticky CUDA error surfaces from the next call that reports it.
// An event is created on the device current at its construction, timing enabled.

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "tide/core/cuda.cuh"
#include "tide/memory/stream.hpp"

namespace tide::memory {

namespace detail {
// Makes `device` current for its lifetime, then restores the previous one.
class current_device {
 public:
  explicit current_device(int device) {
    TIDE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) TIDE_CUDA_CHECK(cudaSetDevice(device));
  }
  current_device(current_device const&) = delete;
  current_device& operator=(current_device const&) = delete;
  ~current_device() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};
}  // namespace detail

template <>
class stream<cuda> {
 public:
  using backend = cuda;
  using options = stream_options;

  explicit stream(options const& opts = {}) : device_(opts.device) {
    if (device_ < 0) TIDE_CUDA_CHECK(cudaGetDevice(&device_));
    detail::current_device on(device_);
    TIDE_CUDA_CHECK(cudaStreamCreateWithFlags(&native_, cudaStreamNonBlocking));
  }
  stream(stream const&) = delete;
  stream& operator=(stream const&) = delete;
  stream(stream&& other) noexcept
      : native_(std::exchange(other.native_, nullptr)), device_(other.device_) {}
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      close();
      native_ = std::exchange(other.native_, nullptr);
      device_ = other.device_;
    }
    return *this;
  }
  ~stream() { close(); }

  // cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault) on this stream.
  void copy(void* dst, void const* src, std::size_t bytes) {
    if (bytes == 0) return;
    TIDE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, native_));
  }

  // fn(arg) on a runtime thread once the work before it finished (cudaLaunchHostFunc).
  void launch(host_function fn, void* arg) {
    TIDE_REQUIRE(fn != nullptr, "stream launch of a null host function; pass a function pointer");
    TIDE_CUDA_CHECK(cudaLaunchHostFunc(native_, fn, arg));
  }

  // Work enqueued after this waits for e's most recent record (cudaStreamWaitEvent).
  void wait(event<cuda> const& e);

  void synchronize() { TIDE_CUDA_CHECK(cudaStreamSynchronize(native_)); }

  [[nodiscard]] bool query() {
    cudaError_t const status = cudaStreamQuery(native_);
    if (status == cudaErrorNotReady) return false;
    TIDE_CUDA_CHECK(status);
    return true;
  }

  [[nodiscard]] cudaStream_t native() const noexcept { return native_; }
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  void close() noexcept {
    if (native_ == nullptr) return;
    (void)cudaStreamSynchronize(native_);
    (void)cudaStreamDestroy(native_);
    native_ = nullptr;
  }

  cudaStream_t native_ = nullptr;
  int device_ = 0;
};

template <>
class event<cuda> {
 public:
  using backend = cuda;
  using stream_type = stream<cuda>;

  event() { TIDE_CUDA_CHECK(cudaEventCreateWithFlags(&native_, cudaEventDefault)); }
  event(event const&) = delete;
  event& operator=(event const&) = delete;
  event(event&& other) noexcept : native_(std::exchange(other.native_, nullptr)) {}
  event& operator=(event&& other) noexcept {
    if (this != &other) {
      if (native_ != nullptr) (void)cudaEventDestroy(native_);
      native_ = std::exchange(other.native_, nullptr);
    }
    return *this;
  }
  // cudaEventDestroy does not block; the runtime releases the event once its record passed.
  ~event() {
    if (native_ != nullptr) (void)cudaEventDestroy(native_);
  }

  void record(stream<cuda>& s) { TIDE_CUDA_CHECK(cudaEventRecord(native_, s.native())); }

  [[nodiscard]] bool query() const {
    cudaError_t const status = cudaEventQuery(native_);
    if (status == cudaErrorNotReady) return false;
    TIDE_CUDA_CHECK(status);
    return true;
  }

  void synchronize() const { TIDE_CUDA_CHECK(cudaEventSynchronize(native_)); }

  [[nodiscard]] cudaEvent_t native() const noexcept { return native_; }

 private:
  cudaEvent_t native_ = nullptr;
};

inline void stream<cuda>::wait(event<cuda> const& e) {
  TIDE_CUDA_CHECK(cudaStreamWaitEvent(native_, e.native(), 0));
}

// Milliseconds between two completed records (cudaEventElapsedTime).
inline double elapsed_ms(event<cuda> const& start, event<cuda> const& end) {
  float ms = 0;
  TIDE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.native(), end.native()));
  return static_cast<double>(ms);
}

static_assert(Stream<stream<cuda>>);
static_assert(Event<event<cuda>>);

}  // namespace tide::memory
