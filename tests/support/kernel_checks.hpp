#pragma once
// Helpers the kernel tests share: views over vectors, bitwise equality, usage-error capture,
// cheap deterministic noise.

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/tensor_view.hpp>

namespace tide::test {

// A view of a vector under a shape whose size must match the vector's.
template <class T>
tensor_view<T> view(std::vector<T>& v, shape s) {
  REQUIRE(static_cast<index_t>(v.size()) == s.numel());
  return tensor_view<T>(v.data(), s);
}

template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Runs f, which must throw tide::error(usage); returns its message (empty and a failure if not).
template <class F>
std::string usage_error(F&& f) {
  try {
    f();
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    return e.message();
  }
  FAIL("expected a tide::error(usage)");
  return {};
}

// Whether f throws tide::error(usage) (false when it throws nothing), for CHECK(throws_usage(...)).
template <class F>
bool throws_usage(F&& f) {
  try {
    f();
  } catch (tide::error const& e) {
    return e.category() == tide::errc::usage;
  }
  return false;
}

// Uniform in [-1, 1) from (seed, i): a hash, so filling a million elements stays cheap at -O0.
inline float noise(unsigned seed, index_t i) {
  std::uint64_t z = (static_cast<std::uint64_t>(seed) << 32) + static_cast<std::uint64_t>(i) + 0x9e3779b97f4a7c15u;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 0x1p-23f - 1.f;
}

}  // namespace tide::test
