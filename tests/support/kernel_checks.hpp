#pragma once
// Helpers the kernel tests share: views over vectors, bitwise equality, usage-error capture.

#include <doctest/doctest.h>

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

}  // namespace tide::test
