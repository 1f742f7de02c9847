#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <tide/core/bytes.hpp>
#include <tide/memory/caching_allocator.hpp>

using namespace tide::literals;
using arena = tide::memory::device_arena<tide::host>;
using caching = tide::memory::caching_allocator<tide::host>;

namespace {
template <class F>
tide::error error_of(F&& f) {
  try {
    f();
  } catch (tide::error const& e) {
    return e;
  }
  FAIL("no tide::error thrown");
  return tide::error(tide::errc::internal, "unreachable");
}
}  // namespace

static_assert(tide::MemoryResource<caching>);

TEST_CASE("a freed buffer stays in the arena and comes back for the same class") {
  arena a{{.budget = 1_MiB}};
  caching c{a};
  void* p = c.allocate(10000);
  std::size_t const held = a.stats().in_use;
  CHECK(held == 10240);  // 10000 rounds to the 256-byte class 10240
  c.deallocate(p, 10000);
  CHECK(a.stats().in_use == held);  // cached, not returned
  CHECK(c.stats().bytes_cached == held);
  void* q = c.allocate(10100);  // same class
  CHECK(q == p);
  CHECK(a.stats().allocations == 1);
  auto s = c.stats();
  CHECK(s.hits == 1);
  CHECK(s.misses == 1);
  CHECK(s.bytes_in_use == held);
  CHECK(s.bytes_cached == 0);
  void* r = c.allocate(20000);  // another class: the arena again
  CHECK(r != p);
  CHECK(c.stats().misses == 2);
  c.deallocate(q, 10100);
  c.deallocate(r, 20000);
}

TEST_CASE("class rounding stays below 1/32 of the request above 32 alignments") {
  arena a{{.budget = 64_MiB}};
  caching c{a};
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    std::size_t const n = 8_KiB + rng() % (16_MiB);
    void* p = c.allocate(n);
    std::size_t const held = a.block_size(p);
    CHECK(held >= n);
    CHECK((held - n) * 32 < n);
    c.deallocate(p, n);
    c.release_cached();
  }
  CHECK(a.stats().in_use == 0);
}

TEST_CASE("release_cached returns every cached buffer to the arena") {
  arena a{{.budget = 1_MiB}};
  caching c{a};
  void* keep = c.allocate(1000);
  for (std::size_t n : {3_KiB, 17_KiB, 100_KiB}) c.deallocate(c.allocate(n), n);
  CHECK(a.stats().live_blocks == 4);
  c.release_cached();
  CHECK(a.stats().live_blocks == 1);
  CHECK(a.stats().in_use == 1024);
  CHECK(c.stats().bytes_cached == 0);
  CHECK(c.stats().released == 3);
  c.deallocate(keep, 1000);
}

TEST_CASE("under a full arena the allocator releases its cache and retries before failing") {
  arena a{{.budget = 64_KiB}};
  caching c{a};
  void* p[4];
  for (auto& q : p) q = c.allocate(16_KiB);
  CHECK(a.stats().free == 0);
  for (auto& q : p) c.deallocate(q, 16_KiB);
  CHECK(a.stats().free == 0);  // all cached
  void* big = c.allocate(32_KiB);  // no class match, arena full: release and retry
  CHECK(big != nullptr);
  auto const s = c.stats();
  CHECK(s.retries == 1);
  CHECK(s.released == 4);
  CHECK(s.bytes_cached == 0);
  CHECK(a.stats().in_use == 32_KiB);
  // Nothing left to release: the arena's own budget error comes through, with its numbers.
  void* rest = c.allocate(32_KiB);
  auto const e = error_of([&] { (void)c.allocate(1); });
  CHECK(e.category() == tide::errc::budget);
  CHECK(e.message().find("0 bytes free") != std::string::npos);
  CHECK(c.stats().retries == 1);
  auto const too_big = error_of([&] { (void)c.allocate(1_MiB); });
  CHECK(too_big.category() == tide::errc::budget);
  CHECK(too_big.message().find(std::to_string(1_MiB)) != std::string::npos);
  c.deallocate(rest, 32_KiB);
  c.deallocate(big, 32_KiB);
}

TEST_CASE("a cached buffer is reused only when it has the alignment asked for") {
  arena a{{.budget = 1_MiB}};
  caching c{a};
  // A first block that makes the next one start off a 4 KiB boundary.
  std::size_t const pad_bytes = (reinterpret_cast<std::uintptr_t>(a.base()) + 256) % 4096 == 0 ? 512 : 256;
  void* pad = c.allocate(pad_bytes);
  void* p = c.allocate(4_KiB);
  REQUIRE(reinterpret_cast<std::uintptr_t>(p) % 4096 != 0);
  c.deallocate(p, 4_KiB);
  void* q = c.allocate(4_KiB, 4096);
  CHECK(q != p);
  CHECK(reinterpret_cast<std::uintptr_t>(q) % 4096 == 0);
  void* r = c.allocate(4_KiB, 256);
  CHECK(r == p);
  for (void* x : {q, r}) c.deallocate(x, 4_KiB);
  c.deallocate(pad, pad_bytes);
}

TEST_CASE("foreign pointers, double frees and wrong sizes are usage errors") {
  arena a{{.budget = 1_MiB}};
  caching c{a};
  void* p = c.allocate(5000);
  int on_stack = 0;
  CHECK(error_of([&] { c.deallocate(&on_stack, 4); }).category() == tide::errc::usage);
  CHECK(error_of([&] { c.deallocate(p, 50000); }).category() == tide::errc::usage);
  c.deallocate(p, 5000);
  auto const twice = error_of([&] { c.deallocate(p, 5000); });
  CHECK(twice.category() == tide::errc::usage);
  CHECK(twice.message().find("twice") != std::string::npos);
  CHECK(c.stats().bytes_cached == 5120);
  CHECK(c.stats().bytes_in_use == 0);
}

TEST_CASE("destroying the allocator returns its cache to the arena; moving keeps it") {
  arena a{{.budget = 1_MiB}};
  {
    caching c{a};
    c.deallocate(c.allocate(1000), 1000);
    caching d = std::move(c);
    CHECK(d.stats().bytes_cached == 1024);
    void* p = d.allocate(1000);
    CHECK(d.stats().hits == 1);
    d.deallocate(p, 1000);
    CHECK(a.stats().in_use == 1024);
  }
  CHECK(a.stats().in_use == 0);
}

TEST_CASE("two threads sharing an allocator") {
  arena a{{.budget = 8_MiB}};
  caching c{a};
  auto work = [&c](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<std::pair<void*, std::size_t>> mine;
    for (int i = 0; i < 2000; ++i) {
      if (mine.size() < 8 && rng() % 2 == 0) {
        std::size_t const n = (1 + rng() % 16) * 4_KiB;
        void* p = c.allocate(n);
        std::memset(p, 1, n);
        mine.emplace_back(p, n);
      } else if (!mine.empty()) {
        c.deallocate(mine.back().first, mine.back().second);
        mine.pop_back();
      }
    }
    for (auto [p, n] : mine) c.deallocate(p, n);
  };
  std::thread t(work, 1u);
  work(2u);
  t.join();
  auto const s = c.stats();
  CHECK(s.bytes_in_use == 0);
  CHECK(s.hits > s.misses);
  CHECK(a.stats().in_use == s.bytes_cached);
  c.release_cached();
  CHECK(a.stats().in_use == 0);
}
