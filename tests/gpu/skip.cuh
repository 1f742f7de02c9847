#pragma once
// How a GPU test ends on a machine it cannot run on. Without a device, or without a driver, it
// prints why and exits 77 (ctest: skipped); with TIDE_REQUIRE_GPU=1 in the environment (a run of
// the gpu label on a GPU machine) the same is a failure, exit 1. A runtime that fails in any
// other way (a driver older than the toolkit) is not "no GPU": tide::cuda_presence_here throws,
// and the test fails with the runtime's error.

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <tide/core/cuda.cuh>

namespace tide::test {

// 0 when a device is there (run the test); otherwise the exit code, having said why.
inline int gpu_or_skip(bool print = true) {
  cuda_presence const here = cuda_presence_here();
  if (here == cuda_presence::device) return 0;
  char const* const why = here == cuda_presence::no_driver ? "no CUDA driver" : "no CUDA device";
  char const* const required = std::getenv("TIDE_REQUIRE_GPU");
  if (required != nullptr && std::strcmp(required, "1") == 0) {
    std::fprintf(stderr, "failed: TIDE_REQUIRE_GPU=1 but this machine has %s\n", why);
    return 1;
  }
  if (print) std::printf("skipped: %s\n", why);
  return 77;
}

}  // namespace tide::test
