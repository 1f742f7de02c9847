#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <tide/core/bytes.hpp>
#include <tide/memory/device_arena.hpp>

// ---- counting every call into the system allocator ------------------------------------------
// operator new/delete are replaced in every build; malloc and friends too when no sanitizer owns
// them (glibc allows interposing them; we forward to its __libc_ entry points).
namespace {
std::atomic<long> system_allocations{0};
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#  define TIDE_TEST_COUNT_MALLOC 0
#else
#  define TIDE_TEST_COUNT_MALLOC 1
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void __libc_free(void*);

void* malloc(std::size_t n) noexcept {
  system_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(n);
}
void* calloc(std::size_t n, std::size_t size) noexcept {
  system_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t n) noexcept {
  system_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_realloc(p, n);
}
void* memalign(std::size_t alignment, std::size_t n) noexcept {
  system_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(alignment, n);
}
void* aligned_alloc(std::size_t alignment, std::size_t n) noexcept { return memalign(alignment, n); }
int posix_memalign(void** out, std::size_t alignment, std::size_t n) noexcept {
  void* p = memalign(alignment, n);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) noexcept { __libc_free(p); }
}
#endif

namespace {
void* counted_new(std::size_t n, std::size_t alignment = 0) {
  system_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = nullptr;
  if (alignment <= alignof(std::max_align_t)) p = std::malloc(n == 0 ? 1 : n);
  else if (posix_memalign(&p, alignment, n == 0 ? 1 : n) != 0) p = nullptr;
  if (p == nullptr) throw std::bad_alloc{};
  return p;
}
// Out of line, so g++ does not pair the inlined malloc with a delete-expression and warn.
[[gnu::noinline]] void counted_delete(void* p) noexcept { std::free(p); }
}  // namespace

void* operator new(std::size_t n) { return counted_new(n); }
void* operator new[](std::size_t n) { return counted_new(n); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_new(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_new(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, std::nothrow_t const&) noexcept {
  try { return counted_new(n); } catch (...) { return nullptr; }
}
void* operator new[](std::size_t n, std::nothrow_t const&) noexcept {
  try { return counted_new(n); } catch (...) { return nullptr; }
}
void* operator new(std::size_t n, std::align_val_t a, std::nothrow_t const&) noexcept {
  try { return counted_new(n, static_cast<std::size_t>(a)); } catch (...) { return nullptr; }
}
void* operator new[](std::size_t n, std::align_val_t a, std::nothrow_t const&) noexcept {
  try { return counted_new(n, static_cast<std::size_t>(a)); } catch (...) { return nullptr; }
}
void operator delete(void* p) noexcept { counted_delete(p); }
void operator delete[](void* p) noexcept { counted_delete(p); }
void operator delete(void* p, std::size_t) noexcept { counted_delete(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_delete(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_delete(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_delete(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_delete(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_delete(p); }
void operator delete(void* p, std::nothrow_t const&) noexcept { counted_delete(p); }
void operator delete[](void* p, std::nothrow_t const&) noexcept { counted_delete(p); }
void operator delete(void* p, std::align_val_t, std::nothrow_t const&) noexcept { counted_delete(p); }
void operator delete[](void* p, std::align_val_t, std::nothrow_t const&) noexcept { counted_delete(p); }

// ---- tests -------------------------------------------------------------------------------------
using namespace tide::literals;
using arena = tide::memory::device_arena<tide::host>;

namespace {
std::uintptr_t addr(void const* p) { return reinterpret_cast<std::uintptr_t>(p); }

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

bool contains(std::string const& text, std::size_t number) {
  return text.find(std::to_string(number)) != std::string::npos;
}
}  // namespace

static_assert(tide::MemoryResource<arena>);

TEST_CASE("best fit: the smallest gap that holds the request is reused") {
  arena a{{.budget = 64_KiB}};
  // [A 1K][B 4K][C 1K][D 2K][E 1K][F 3K][G 1K][rest: 51K free]
  std::size_t const sizes[] = {1_KiB, 4_KiB, 1_KiB, 2_KiB, 1_KiB, 3_KiB, 1_KiB};
  void* p[7];
  for (int i = 0; i < 7; ++i) p[i] = a.allocate(sizes[i]);
  for (int i = 1; i < 7; ++i) CHECK(addr(p[i]) == addr(p[i - 1]) + sizes[i - 1]);  // packed in order
  a.deallocate(p[1], 4_KiB);
  a.deallocate(p[3], 2_KiB);
  a.deallocate(p[5], 3_KiB);

  void* x = a.allocate(2_KiB);  // exact fit: D's gap, not B's, F's or the tail
  CHECK(x == p[3]);
  void* y = a.allocate(2560);  // 3K gap (F) beats 4K (B)
  CHECK(y == p[5]);
  void* z = a.allocate(3_KiB);  // F's remainder is 512 B now, so B's 4K gap
  CHECK(z == p[1]);
  void* w = a.allocate(768);  // the 512 B left of F is too small; the 1 KiB left of B fits
  CHECK(addr(w) == addr(p[1]) + 3_KiB);
  for (void* q : {x, w, z}) a.deallocate(q, q == x ? 2_KiB : q == z ? 3_KiB : 768);
  a.deallocate(y, 2560);
  for (int i : {0, 2, 4, 6}) a.deallocate(p[i], sizes[i]);
  CHECK(a.stats().in_use == 0);
  CHECK(a.stats().largest_free_block == 64_KiB);
}

TEST_CASE("freeing the middle block last merges both neighbours into one free block") {
  arena a{{.budget = 12_KiB}};
  void* l = a.allocate(4_KiB);
  void* m = a.allocate(4_KiB);
  void* r = a.allocate(4_KiB);
  CHECK(a.stats().free == 0);
  CHECK_THROWS_AS((void)a.allocate(1), tide::error);
  a.deallocate(l, 4_KiB);
  a.deallocate(r, 4_KiB);
  CHECK(a.stats().largest_free_block == 4_KiB);
  CHECK(a.stats().fragmentation == doctest::Approx(0.5));
  a.deallocate(m, 4_KiB);
  auto const s = a.stats();
  CHECK(s.largest_free_block == 12_KiB);
  CHECK(s.free == 12_KiB);
  CHECK(s.fragmentation == 0.0);
  CHECK(s.live_blocks == 0);
  void* all = a.allocate(12_KiB);  // one block again: the whole budget fits
  CHECK(all == a.base());
  a.deallocate(all, 12_KiB);
}

TEST_CASE("every pointer is aligned as asked, and at least to options.alignment") {
  arena a{{.budget = 1_MiB, .alignment = 256}};
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t const aligns[] = {1, 16, 256, 512, 4096, 65536};
  for (int round = 0; round < 3; ++round) {
    for (std::size_t al : aligns) {
      std::size_t const bytes = 100 + 37 * live.size();
      void* p = a.allocate(bytes, al);
      CHECK(addr(p) % std::max<std::size_t>(al, 256) == 0);
      live.emplace_back(p, bytes);
    }
  }
  for (auto [p, n] : live) a.deallocate(p, n);
  CHECK(a.stats().largest_free_block == 1_MiB);  // alignment gaps coalesced away again
  CHECK(error_of([&] { (void)a.allocate(64, 48); }).category() == tide::errc::usage);
  CHECK_THROWS_AS(arena({.budget = 1_MiB, .alignment = 100}), tide::error);
  CHECK_THROWS_AS(arena({.budget = 0}), tide::error);
}

TEST_CASE("a request that does not fit throws budget with the bytes asked, free and largest block") {
  arena a{{.budget = 1_MiB}};
  void* p = a.allocate(600_KiB);
  void* q = a.allocate(100_KiB);
  a.deallocate(p, 600_KiB);  // free: 600K hole + 324K tail, largest 600K
  auto const before = a.stats();
  auto const e = error_of([&] { (void)a.allocate(700_KiB); });
  CHECK(e.category() == tide::errc::budget);
  CHECK(contains(e.message(), 700_KiB));
  CHECK(contains(e.message(), 1_MiB - 100_KiB));  // bytes free
  CHECK(contains(e.message(), 600_KiB));          // largest free block
  auto const after = a.stats();                   // the failure changed nothing
  CHECK(after.in_use == before.in_use);
  CHECK(after.largest_free_block == before.largest_free_block);
  CHECK(after.allocations == before.allocations);
  CHECK(error_of([&] { (void)a.allocate(3_MiB); }).category() == tide::errc::budget);  // beyond the budget
  a.deallocate(q, 100_KiB);
}

TEST_CASE("double free, foreign pointers, interior pointers and wrong sizes are usage errors") {
  arena a{{.budget = 64_KiB}};
  arena other{{.budget = 64_KiB}};
  void* p = a.allocate(1000);
  int on_stack = 0;
  CHECK(error_of([&] { a.deallocate(&on_stack, 4); }).category() == tide::errc::usage);
  void* q = other.allocate(1000);
  CHECK(!a.owns(q));
  CHECK(a.owns(p));
  CHECK(error_of([&] { a.deallocate(q, 1000); }).category() == tide::errc::usage);
  CHECK(error_of([&] { a.deallocate(static_cast<std::byte*>(p) + 256, 744); }).category() == tide::errc::usage);
  auto const wrong = error_of([&] { a.deallocate(p, 5000); });
  CHECK(wrong.category() == tide::errc::usage);
  CHECK(contains(wrong.message(), 5000));
  CHECK(a.block_size(p) == 1024);
  a.deallocate(p, 1000);  // 1000 and 1024 round to the same block: accepted
  CHECK(a.block_size(p) == 0);
  auto const twice = error_of([&] { a.deallocate(p, 1000); });
  CHECK(twice.category() == tide::errc::usage);
  CHECK(twice.message().find("twice") != std::string::npos);
  other.deallocate(q, 1000);
  CHECK(a.stats().in_use == 0);
}

TEST_CASE("fragmentation is 1 - largest free block / free bytes") {
  arena a{{.budget = 8_KiB}};
  void* p[8];
  for (auto& q : p) q = a.allocate(1_KiB);
  CHECK(a.stats().fragmentation == 0.0);  // nothing free
  for (int i : {0, 2, 4}) a.deallocate(p[i], 1_KiB);
  CHECK(a.stats().free == 3_KiB);
  CHECK(a.stats().fragmentation == doctest::Approx(1.0 - 1.0 / 3.0));
  a.deallocate(p[1], 1_KiB);  // [0, 3K) merges; 4 stays alone
  CHECK(a.stats().largest_free_block == 3_KiB);
  CHECK(a.stats().fragmentation == doctest::Approx(0.25));
  for (int i : {3, 5, 6, 7}) a.deallocate(p[i], 1_KiB);
  CHECK(a.stats().fragmentation == 0.0);
}

TEST_CASE("peak, reset_peak, allocations and live blocks") {
  arena a{{.budget = 64_KiB}};
  void* p = a.allocate(10_KiB);
  void* q = a.allocate(20_KiB);
  a.deallocate(q, 20_KiB);
  auto s = a.stats();
  CHECK(s.peak == 30_KiB);
  CHECK(s.in_use == 10_KiB);
  CHECK(s.allocations == 2);
  CHECK(s.live_blocks == 1);
  a.reset_peak();
  CHECK(a.stats().peak == 10_KiB);
  a.deallocate(p, 10_KiB);
}

TEST_CASE("running out of block records is a budget error that names max_blocks and changes nothing") {
  arena a{{.budget = 64_KiB, .max_blocks = 4}};
  void* p0 = a.allocate(1_KiB);
  void* p1 = a.allocate(1_KiB);
  void* p2 = a.allocate(1_KiB);  // 3 live + 1 free tail = 4 records
  void* p3 = a.allocate(61_KiB);  // exact fit of the tail needs no new record
  a.deallocate(p1, 1_KiB);
  a.deallocate(p3, 61_KiB);  // records: p0, hole, p2, tail
  auto const before = a.stats();
  auto const e = error_of([&] { (void)a.allocate(512); });  // splitting the hole needs a 5th record
  CHECK(e.category() == tide::errc::budget);
  CHECK(e.message().find("max_blocks") != std::string::npos);
  CHECK(a.stats().in_use == before.in_use);
  void* fits = a.allocate(1_KiB);  // the hole exactly: no split, no record
  CHECK(fits == p1);
  for (void* q : {p0, fits, p2}) a.deallocate(q, 1_KiB);
  CHECK(a.stats().largest_free_block == 64_KiB);
}

TEST_CASE("randomized alloc/free against a shadow model: no overlap, in_use exact, all coalesces") {
  constexpr std::size_t budget = 4_MiB;
  arena a{{.budget = budget, .alignment = 256, .max_blocks = 4096}};
  std::mt19937_64 rng(20240611);
  std::map<std::uintptr_t, std::pair<std::size_t, unsigned char>> live;  // address -> (block bytes, fill)
  std::size_t in_use = 0;
  std::size_t failures = 0;
  auto const base = addr(a.base());
  auto release = [&](std::map<std::uintptr_t, std::pair<std::size_t, unsigned char>>::iterator it,
                     std::size_t asked) {
    auto* bytes = reinterpret_cast<unsigned char*>(it->first);
    CHECK(bytes[0] == it->second.second);  // nobody overwrote the block
    CHECK(bytes[it->second.first - 1] == it->second.second);
    a.deallocate(bytes, asked);
    in_use -= it->second.first;
    live.erase(it);
  };
  for (int op = 0; op < 6000; ++op) {
    bool const grow = live.empty() || (rng() % 100) < 55;
    if (grow) {
      std::size_t const bytes = 1 + (rng() % 2 == 0 ? rng() % 4096 : rng() % (128 * 1024));
      std::size_t const align = std::size_t{256} << (rng() % 5);
      void* p = nullptr;
      try {
        p = a.allocate(bytes, align);
      } catch (tide::error const& e) {
        REQUIRE(e.category() == tide::errc::budget);
        ++failures;
        continue;
      }
      std::size_t const block = tide::round_up(bytes, 256);
      auto const x = addr(p);
      REQUIRE(x % align == 0);
      REQUIRE(x >= base);
      REQUIRE(x + block <= base + budget);
      auto const next = live.lower_bound(x);
      if (next != live.end()) REQUIRE(x + block <= next->first);
      if (next != live.begin()) REQUIRE(std::prev(next)->first + std::prev(next)->second.first <= x);
      auto const fill = static_cast<unsigned char>(op);
      std::memset(p, fill, block);
      live.emplace(x, std::make_pair(block, fill));
      in_use += block;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      release(it, it->second.first);
    }
    if (op % 97 == 0) {
      auto const s = a.stats();
      REQUIRE(s.in_use == in_use);
      REQUIRE(s.live_blocks == live.size());
      REQUIRE(s.free == budget - in_use);
      REQUIRE(s.largest_free_block <= s.free);
    }
  }
  CHECK(failures > 0);  // the pattern does fill the arena, so the budget path ran too
  CHECK(a.stats().peak > budget / 2);
  while (!live.empty()) release(live.begin(), live.begin()->second.first);
  auto const s = a.stats();
  CHECK(s.in_use == 0);
  CHECK(s.largest_free_block == budget);
  CHECK(s.fragmentation == 0.0);
}

TEST_CASE("no system allocation after construction") {
  arena a{{.budget = 8_MiB, .max_blocks = 1024}};
  std::vector<void*> ptrs(256);
  std::vector<std::size_t> sizes(256);
  std::mt19937 rng(7);
  for (auto& n : sizes) n = 1 + rng() % 20000;
  long const before = system_allocations.load();
  for (int round = 0; round < 20; ++round) {
    for (std::size_t i = 0; i < ptrs.size(); ++i) ptrs[i] = a.allocate(sizes[i], i % 3 == 0 ? 4096 : 256);
    for (std::size_t i = 0; i < ptrs.size(); i += 2) a.deallocate(ptrs[i], sizes[i]);
    for (std::size_t i = 0; i < ptrs.size(); i += 2) ptrs[i] = a.allocate(sizes[i] / 2 + 1);
    for (std::size_t i = 0; i < ptrs.size(); ++i) a.deallocate(ptrs[i], i % 2 == 0 ? sizes[i] / 2 + 1 : sizes[i]);
    (void)a.stats();
    (void)a.owns(ptrs[0]);
  }
  long const after = system_allocations.load();
  // The counter itself works: a vector allocates.
  long const probe = system_allocations.load();
  void* volatile sink = ::operator new(64);
  ::operator delete(sink);
  CHECK(system_allocations.load() > probe);
#if TIDE_TEST_COUNT_MALLOC
  long const probe_malloc = system_allocations.load();
  void* volatile raw = std::malloc(64);
  std::free(raw);
  CHECK(system_allocations.load() > probe_malloc);
#endif
  CHECK(after == before);
  CHECK(a.stats().in_use == 0);
}

TEST_CASE("moving an arena keeps its blocks; the moved-from one owns nothing") {
  arena a{{.budget = 64_KiB}};
  void* p = a.allocate(1_KiB);
  arena b = std::move(a);
  CHECK(b.owns(p));
  CHECK(!a.owns(p));  // NOLINT(bugprone-use-after-move): documented moved-from state
  b.deallocate(p, 1_KiB);
  arena c{{.budget = 4_KiB}};
  c = std::move(b);
  CHECK(c.stats().budget == 64_KiB);
}

TEST_CASE("concurrent allocate/deallocate from two threads keeps the books exact") {
  arena a{{.budget = 16_MiB}};
  auto work = [&a](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<std::pair<void*, std::size_t>> mine;
    for (int i = 0; i < 3000; ++i) {
      if (mine.size() < 32 && rng() % 3 != 0) {
        std::size_t const n = 1 + rng() % 65536;
        void* p = a.allocate(n);
        static_cast<unsigned char*>(p)[0] = 1;
        mine.emplace_back(p, n);
      } else if (!mine.empty()) {
        std::size_t const k = rng() % mine.size();
        a.deallocate(mine[k].first, mine[k].second);
        mine[k] = mine.back();
        mine.pop_back();
      }
    }
    for (auto [p, n] : mine) a.deallocate(p, n);
  };
  std::thread t(work, 1u);
  work(2u);
  t.join();
  auto const s = a.stats();
  CHECK(s.in_use == 0);
  CHECK(s.live_blocks == 0);
  CHECK(s.largest_free_block == 16_MiB);
}
