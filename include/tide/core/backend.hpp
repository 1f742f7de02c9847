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

// A test device that behaves as a GPU does: its memory is mapped PROT_NONE at the addresses it
// hands out, so the host cannot read it, and its kernels (the host kernels) run asynchronously on
// its compute stream's worker. Code that runs on tide::sealed bit-identically to tide::host
// touches device memory only through the backend's operations (core/sealed.hpp).
struct sealed {
  static constexpr char const* name = "sealed";
  static constexpr bool is_device = true;
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

static_assert(Backend<host> && Backend<sealed> && Backend<cuda>);

}  // namespace tide
