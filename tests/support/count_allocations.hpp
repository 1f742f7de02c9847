#pragma once
// Counts heap allocations while tide::test::counting is set: replaces the global operator new and
// delete of the test executable that includes this header (include it from exactly one file of
// an executable; every test file here is its own executable).
//
//   tide::test::heap_allocations = 0;
//   tide::test::counting = true;
//   ... steady-state work ...
//   tide::test::counting = false;
//   CHECK(tide::test::heap_allocations.load() == 0);

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace tide::test {
inline std::atomic<long> heap_allocations{0};
inline std::atomic<bool> counting{false};
}  // namespace tide::test

// The replacements pair malloc with free; GCC's pairing check cannot see through the replacement.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (tide::test::counting.load(std::memory_order_relaxed))
    tide::test::heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc{};
}
void* operator new(std::size_t n, std::nothrow_t const&) noexcept {
  if (tide::test::counting.load(std::memory_order_relaxed))
    tide::test::heap_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::nothrow_t const&) noexcept { std::free(p); }
