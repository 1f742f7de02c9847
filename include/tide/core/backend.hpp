#pragma once
// Backend tags. A backend is chosen by type, never by a runtime switch: algorithms take the tag
// (or a type templated on it) and overload resolution picks the implementation.

#include <concepts>
#include <type_traits>

namespace tide {

// CPU threads; its "device memory" is a byte-capped region of host memory.
struct host {
  static constexpr char const* name = "host";
  static constexpr bool is_device = false;
};

// CUDA kernels, cudaMalloc'ed memory, CUDA streams. Its code lives in .cuh headers (nvcc).
struct cuda {
  static constexpr char const* name = "cuda";
  static constexpr bool is_device = true;
};

template <class B>
concept Backend = std::is_empty_v<B> && std::is_trivially_copyable_v<B> && requires {
  { B::name } -> std::convertible_to<char const*>;
  { B::is_device } -> std::convertible_to<bool>;
};

static_assert(Backend<host> && Backend<cuda>);

}  // namespace tide
