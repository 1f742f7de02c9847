#pragma once
// The CUDA runtime seen through tide's errors: TIDE_CUDA_CHECK turns a cudaError_t into a
// tide::error of category cuda, and has_cuda_device() asks whether any device can run kernels.
//
//   TIDE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
//   if (!tide::has_cuda_device()) return skip();

#include <cuda_runtime.h>

#include <source_location>

#include "tide/core/error.hpp"

namespace tide::detail {
[[noreturn]] inline void cuda_failed(cudaError_t status, char const* call, std::source_location where) {
  fail(errc::cuda, where, call, " returned ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
       "); check the arguments of this call, and for a sticky error the kernel launched before it");
}
}  // namespace tide::detail

// Throws tide::error(errc::cuda) naming the call and the runtime's error when it did not succeed.
#define TIDE_CUDA_CHECK(...)                                                                     \
  do {                                                                                           \
    ::cudaError_t const tide_cuda_status = (__VA_ARGS__);                                        \
    if (tide_cuda_status != ::cudaSuccess) [[unlikely]]                                          \
      ::tide::detail::cuda_failed(tide_cuda_status, #__VA_ARGS__, ::std::source_location::current()); \
  } while (0)

namespace tide {

// True when the runtime loads and sees at least one device. Never throws. The error the runtime
// reports without a GPU is cleared, so it does not surface at a later call; without a driver
// every runtime call keeps failing anyway (cudaErrorInsufficientDriver cannot be cleared).
inline bool has_cuda_device() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

}  // namespace tide
