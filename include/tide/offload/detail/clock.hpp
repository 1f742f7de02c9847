#pragma once
// Milliseconds since t0 on the steady clock: the offload engine's stall and lane timings.

#include <chrono>

namespace tide::offload::detail {

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tide::offload::detail
