#pragma once
// The CUDA runtime seen through tide's errors: TIDE_CUDA_CHECK turns a cudaError_t into a
// tide::error of category cuda, and has_cuda_device() asks whether any device can run kernels.
//
//   TIDE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
//   if (!tide::has_cuda_device()) return skip();  // no device, or no driver: nothing else
//
// Only two states mean "no GPU here": a driver without a device, and no driver library at all.
// Any other failure of the runtime (a driver older than the toolkit, a broken install) throws,
// so a GPU machine that cannot run tide never reads as a machine without a GPU.

#include <cuda_runtime.h>
#include <dlfcn.h>

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

// What the CUDA runtime finds on this machine.
enum class cuda_presence : unsigned char {
  device,     // at least one device
  no_device,  // a driver, and no device
  no_driver,  // no CUDA driver library (libcuda.so.1) the loader can find
};

// The runtime's answer, its error cleared so it does not surface at a later call. Throws
// tide::error(cuda) for every other error, naming it: with a driver present, "insufficient
// driver" means one older than the toolkit tide was built with.
inline cuda_presence cuda_presence_here() {
  int count = 0;
  cudaError_t const status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess) return count > 0 ? cuda_presence::device : cuda_presence::no_device;
  (void)cudaGetLastError();
  if (status == cudaErrorNoDevice) return cuda_presence::no_device;
  if (status == cudaErrorInsufficientDriver) {
    // The runtime says the same without any driver and with an old one: ask the loader.
    if (void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); driver == nullptr) {
      return cuda_presence::no_driver;
    } else {
      ::dlclose(driver);
    }
  }
  detail::cuda_failed(status, "cudaGetDeviceCount", std::source_location::current());
}

// True when the runtime sees at least one device; false without a device or without a driver.
// Throws tide::error(cuda) when the runtime fails in any other way (cuda_presence_here).
inline bool has_cuda_device() { return cuda_presence_here() == cuda_presence::device; }

}  // namespace tide
