#include <doctest/doctest.h>

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <tide/core/bytes.hpp>
#include <tide/memory/pinned_pool.hpp>

#include "support/errors.hpp"

using namespace tide::literals;
using pool = tide::memory::pinned_pool<tide::host>;
using tide::test::category_of;

namespace {
std::size_t page() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

// Locked memory of this process, from /proc/self/status.
std::size_t locked_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmLck:", 0) == 0) return std::stoul(line.substr(6)) * 1024;
  return 0;
}

// Without CAP_IPC_LOCK and with RLIMIT_MEMLOCK at 0 the kernel refuses mlock, even for root.
// Capabilities are per thread and the soft limit can be raised back, so both are restored.
struct mlock_refused {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[2]{};
  bool caps_dropped = false;
  rlimit saved{};
  mlock_refused() {
    if (::syscall(SYS_capget, &header, caps) == 0 && (caps[0].effective & (1u << CAP_IPC_LOCK))) {
      __user_cap_data_struct fewer[2] = {caps[0], caps[1]};
      fewer[0].effective &= ~(1u << CAP_IPC_LOCK);
      caps_dropped = ::syscall(SYS_capset, &header, fewer) == 0;
    }
    ::getrlimit(RLIMIT_MEMLOCK, &saved);
    rlimit none = saved;
    none.rlim_cur = 0;
    ::setrlimit(RLIMIT_MEMLOCK, &none);
  }
  ~mlock_refused() {
    ::setrlimit(RLIMIT_MEMLOCK, &saved);
    if (caps_dropped) ::syscall(SYS_capset, &header, caps);
  }
};

// VmSize of this process, from /proc/self/status.
std::size_t mapped_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) return std::stoul(line.substr(7)) * 1024;
  return 0;
}

// The address space capped `headroom` above what the process maps now (RLIMIT_AS, soft limit,
// restored on exit): a larger mmap is refused with ENOMEM, small allocations still fit.
struct address_space_capped {
  rlimit saved{};
  bool capped = false;
  explicit address_space_capped(std::size_t headroom) {
    std::size_t const now = mapped_bytes();
    if (now == 0 || ::getrlimit(RLIMIT_AS, &saved) != 0) return;
    rlimit lower = saved;
    lower.rlim_cur = now + headroom;
    if (saved.rlim_max != RLIM_INFINITY && lower.rlim_cur > saved.rlim_max) return;
    capped = ::setrlimit(RLIMIT_AS, &lower) == 0;
  }
  ~address_space_capped() {
    if (capped) ::setrlimit(RLIMIT_AS, &saved);
  }
};

// Sanitizers reserve terabytes of shadow memory and map more of it as they go: an address-space
// cap would break them before the pool.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool sanitized = true;
#  else
constexpr bool sanitized = false;
#  endif
#else
constexpr bool sanitized = false;
#endif

bool has(std::string const& msg, std::string const& part) { return msg.find(part) != std::string::npos; }

// Everything written to stderr while f runs.
template <class F>
std::string stderr_of(F&& f) {
  std::fflush(stderr);
  std::FILE* capture = std::tmpfile();
  REQUIRE(capture != nullptr);
  int const saved = ::dup(2);
  ::dup2(::fileno(capture), 2);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string text;
  std::rewind(capture);
  for (int c; (c = std::fgetc(capture)) != EOF;) text += static_cast<char>(c);
  std::fclose(capture);
  return text;
}
}  // namespace

static_assert(tide::MemoryResource<pool>);

TEST_CASE("size classes: rounding overhead <= 5% from 20 pages on, < 1/32 from 32 pages on") {
  tide::memory::detail::size_classes const classes{12, 5};  // 4 KiB pages, 32 steps
  std::mt19937_64 rng(5);
  std::size_t worst_from_80k = 0, worst_from_128k = 0;  // in millionths
  for (std::size_t b = 1; b < (std::size_t{1} << 40); b += 1 + (b >> 9) + (rng() % (b / 64 + 1))) {
    std::size_t const c = classes.round(b);
    REQUIRE(c >= b);
    REQUIRE(c % 4096 == 0);                       // whole pages
    REQUIRE(classes.round(c) == c);               // a class is its own class
    REQUIRE(classes.index(b) == classes.index(c));
    std::size_t const excess = (c - b) * 1'000'000 / b;
    if (b >= 80 * 1024) worst_from_80k = std::max(worst_from_80k, excess);
    if (b >= 128 * 1024) worst_from_128k = std::max(worst_from_128k, excess);
  }
  CHECK(worst_from_80k <= 50'000);
  CHECK(worst_from_128k < 31'250);
  CHECK(worst_from_128k > 20'000);  // the sweep did probe near the bound
  // Indices are dense: walking class to class steps the index by one.
  std::size_t c = classes.round(1);
  CHECK(classes.index(c) == 0);
  for (int i = 0; i < 1000; ++i) {  // up to 2^47 bytes
    std::size_t const next = classes.round(c + 1);
    REQUIRE(classes.index(next) == classes.index(c) + 1);
    c = next;
  }
}

TEST_CASE("the pool's classes above 16 MiB: 256 steps per doubling, dense indices across the switch") {
  auto const classes = pool::classes_for(12);  // the pool's, with 4 KiB pages
  REQUIRE(classes.fine_log2 == 24);
  CHECK(pool::classes_for(17).fine_log2 == 0);  // 128 KiB pages: a fine step would split a page
  std::mt19937_64 rng(9);
  std::size_t worst_below = 0, worst_above = 0;  // in millionths, from 1 MiB; below / above 16 MiB
  for (std::size_t b = 1_MiB; b < (std::size_t{1} << 40); b += 1 + (b >> 12) + (rng() % (b / 512 + 1))) {
    std::size_t const c = classes.round(b);
    REQUIRE(c >= b);
    REQUIRE(c % 4096 == 0);
    REQUIRE(classes.round(c) == c);
    REQUIRE(classes.index(b) == classes.index(c));
    std::size_t const excess = (c - b) * 1'000'000 / b;
    (b > 16_MiB ? worst_above : worst_below) = std::max(b > 16_MiB ? worst_above : worst_below, excess);
  }
  CHECK(worst_below < 31'250);
  CHECK(worst_below > 20'000);  // 32 steps up to 16 MiB: the coarse classes are unchanged
  CHECK(worst_above < 3'907);   // 1/256
  CHECK(worst_above > 3'000);
  CHECK(classes.round(16_MiB) == 16_MiB);
  CHECK(classes.round(16_MiB + 1) == 16_MiB + 64_KiB);  // 64 KiB steps between 16 and 32 MiB
  CHECK(classes.round(100_MiB + 1) == 100_MiB + 256_KiB);
  // Dense from well below the switch to far above it.
  std::size_t c = classes.round(8_MiB);
  for (int i = 0; i < 3000; ++i) {
    std::size_t const next = classes.round(c + 1);
    REQUIRE(classes.index(next) == classes.index(c) + 1);
    c = next;
  }
  // The pool itself: a 100 MiB + 1 request holds 100.25 MiB, not 104 MiB.
  pool p{{.lock_pages = false}};
  CHECK(p.class_size(100_MiB + 1) == 100_MiB + 256_KiB);
  CHECK(p.class_size(200_KiB + 100) == 204_KiB);  // smaller sizes keep their classes
}

TEST_CASE("held bytes stay within 5% of requested bytes over a sweep of real allocations") {
  pool p{{.lock_pages = false}};
  std::vector<std::pair<void*, std::size_t>> live;
  for (double size = 80 * 1024; size < 6e6; size *= 1.0 + 1.0 / 7.3) {
    auto const n = static_cast<std::size_t>(size) + live.size() * 37;  // off the class boundaries
    void* q = p.allocate(n);
    CHECK(reinterpret_cast<std::uintptr_t>(q) % page() == 0);
    std::memset(q, 0xab, n);
    live.emplace_back(q, n);
    auto const s = p.stats();
    REQUIRE(s.bytes_held - s.bytes_cached <= s.bytes_requested + s.bytes_requested / 20);
    CHECK(p.class_size(n) - n <= n / 20);
  }
  auto const s = p.stats();
  CHECK(s.blocks == live.size());
  CHECK(s.misses == live.size());
  CHECK(s.locked == 0);  // lock_pages = false
  for (auto [q, n] : live) p.deallocate(q, n);
  CHECK(p.stats().bytes_requested == 0);
  CHECK(p.stats().bytes_cached == s.bytes_held);
}

TEST_CASE("a freed block is handed out again for a request of its class") {
  pool p{{.lock_pages = false}};
  void* a = p.allocate(200_KiB);
  p.deallocate(a, 200_KiB);
  CHECK(p.class_size(200_KiB + 100) == 204_KiB);  // 4 KiB steps between 128 and 256 KiB
  void* b = p.allocate(200_KiB - 1000);            // same class as 200 KiB
  CHECK(b == a);
  CHECK(p.stats().hits == 1);
  CHECK(p.stats().misses == 1);
  CHECK(p.stats().blocks == 1);
  void* c = p.allocate(300_KiB);  // another class: a new block
  CHECK(c != a);
  CHECK(p.stats().misses == 2);
  p.deallocate(c, 300_KiB);
  p.deallocate(b, 200_KiB - 1000);
  // Many copies of one size pin nothing new.
  for (int i = 0; i < 100; ++i) p.deallocate(p.allocate(300_KiB), 300_KiB);
  CHECK(p.stats().misses == 2);
  CHECK(p.stats().hits == 101);
}

TEST_CASE("the peaks: bytes in use count cached blocks handed out again, bytes held do not; reset_peak starts anew") {
  pool p{{.lock_pages = false}};
  void* a = p.allocate(1_MiB);
  void* b = p.allocate(1_MiB);
  p.deallocate(a, 1_MiB);
  p.deallocate(b, 1_MiB);
  p.reset_peak();
  CHECK(p.stats().peak_bytes_requested == 0);
  CHECK(p.stats().peak_bytes_held == 2_MiB);  // the cache
  void* c = p.allocate(1_MiB - 100);  // from the cache: nothing new held, but in use
  CHECK(p.stats().peak_bytes_held == 2_MiB);
  CHECK(p.stats().peak_bytes_requested == 1_MiB - 100);
  p.deallocate(c, 1_MiB - 100);
  CHECK(p.stats().bytes_requested == 0);
  CHECK(p.stats().peak_bytes_requested == 1_MiB - 100);
  p.trim();
  p.reset_peak();
  CHECK(p.stats().peak_bytes_held == 0);
}

TEST_CASE("trim releases cached blocks and keeps the ones handed out") {
  pool p{{.lock_pages = false}};
  void* keep = p.allocate(1_MiB);
  for (std::size_t n : {64_KiB, 256_KiB, 512_KiB}) p.deallocate(p.allocate(n), n);
  auto const before = p.stats();
  CHECK(before.blocks == 4);
  CHECK(before.bytes_cached == 64_KiB + 256_KiB + 512_KiB);
  p.trim();
  auto const after = p.stats();
  CHECK(after.blocks == 1);
  CHECK(after.bytes_cached == 0);
  CHECK(after.bytes_held == 1_MiB);
  static_cast<char*>(keep)[1_MiB - 1] = 1;  // still mapped
  p.deallocate(keep, 1_MiB);
  void* again = p.allocate(1_MiB);  // the surviving block is reused after trim
  CHECK(again == keep);
  p.deallocate(again, 1_MiB);
}

TEST_CASE("foreign pointers, double frees, wrong sizes and alignments are usage errors") {
  pool p{{.lock_pages = false}};
  void* a = p.allocate(100_KiB);
  int on_stack = 0;
  CHECK(category_of([&] { p.deallocate(&on_stack, 4); }) == tide::errc::usage);
  CHECK(category_of([&] { p.deallocate(a, 10_MiB); }) == tide::errc::usage);
  CHECK(category_of([&] { (void)p.allocate(100, 3 * page()); }) == tide::errc::usage);
  CHECK(category_of([&] { (void)p.allocate(100, 2 * page()); }) == tide::errc::usage);
  void* small = p.allocate(10, page());
  CHECK(reinterpret_cast<std::uintptr_t>(small) % page() == 0);
  CHECK(p.class_size(10) == page());
  p.deallocate(small, 10);
  p.deallocate(a, 100_KiB);
  CHECK(category_of([&] { p.deallocate(a, 100_KiB); }) == tide::errc::usage);
  CHECK(p.stats().bytes_requested == 0);
}

TEST_CASE("locked blocks are really locked; unlocked pools lock nothing") {
  std::size_t const base = locked_bytes();
  {
    pool p{{.lock_pages = false}};
    void* q = p.allocate(512_KiB);
    CHECK(p.stats().locked == 0);
    CHECK(locked_bytes() == base);
    p.deallocate(q, 512_KiB);
  }
  pool p;  // lock_pages = true
  void* q = p.allocate(256_KiB);
  auto const s = p.stats();
  if (s.locked == 1) CHECK(locked_bytes() >= base + 256_KiB);
  else CHECK(locked_bytes() == base);  // refused (RLIMIT_MEMLOCK): nothing locked, said so once
  p.deallocate(q, 256_KiB);
  p.trim();
  CHECK(locked_bytes() == base);  // releasing unlocks
}

TEST_CASE("when mlock is refused the pool falls back to unlocked blocks and says so once") {
  tide::memory::detail::mlock_refusal_reported() = false;
  pool p;
  std::size_t locked = 0;
  std::string const said = stderr_of([&] {
    mlock_refused guard;
    void* a = p.allocate(64_KiB);
    void* b = p.allocate(128_KiB);
    locked = p.stats().locked;
    std::memset(a, 1, 64_KiB);  // unlocked blocks still work
    std::memset(b, 2, 128_KiB);
    p.deallocate(a, 64_KiB);
    p.deallocate(b, 128_KiB);
  });
  CHECK(locked == 0);
  std::size_t messages = 0;
  for (std::size_t at = said.find("tide: mlock"); at != std::string::npos; at = said.find("tide: mlock", at + 1))
    ++messages;
  CHECK(messages == 1);  // two refused blocks, one message
  CHECK(said.find("RLIMIT_MEMLOCK") != std::string::npos);
  CHECK(p.stats().blocks == 2);
}

TEST_CASE("two threads sharing a pool") {
  pool p{{.lock_pages = false}};
  auto work = [&p](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<std::pair<void*, std::size_t>> mine;
    for (int i = 0; i < 400; ++i) {
      if (mine.size() < 6 && rng() % 2 == 0) {
        std::size_t const n = (1 + rng() % 8) * 16_KiB;
        void* q = p.allocate(n);
        static_cast<char*>(q)[n - 1] = 1;
        mine.emplace_back(q, n);
      } else if (!mine.empty()) {
        p.deallocate(mine.back().first, mine.back().second);
        mine.pop_back();
      }
    }
    for (auto [q, n] : mine) p.deallocate(q, n);
  };
  std::thread t(work, 1u);
  work(2u);
  t.join();
  auto const s = p.stats();
  CHECK(s.bytes_requested == 0);
  CHECK(s.bytes_cached == s.bytes_held);
  CHECK(s.hits + s.misses > 0);
  CHECK(s.hits > s.misses);  // 8 classes, reused over and over
}

TEST_CASE("a request beyond the host's memory is a budget error that says what to change, before any mmap") {
  // 2^60 bytes: more than any host has, and below nothing else the pool checks first.
  std::size_t const absurd = std::size_t{1} << 60;
  pool locking;  // lock_pages = true, as a scheduler with lock_host_pages = true makes it
  try {
    (void)locking.allocate(absurd);
    FAIL("an allocation of 2^60 bytes did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
    std::string const msg = e.message();
    CAPTURE(msg);
    CHECK(has(msg, "1152921504606846976 bytes"));  // the bytes asked
    CHECK(has(msg, "out of memory for model data"));
    CHECK(has(msg, "smaller model"));
    CHECK(has(msg, "larger device_budget"));
    CHECK(has(msg, "lock_host_pages = false"));
    CHECK(has(msg, "ulimit -l"));
  }
  CHECK(locking.stats().blocks == 0);  // nothing was mapped
  CHECK(locking.stats().misses == 0);

  pool unlocked{{.lock_pages = false}};
  try {
    (void)unlocked.allocate(absurd);
    FAIL("an allocation of 2^60 bytes did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
    CHECK(has(e.message(), "larger device_budget"));
    CHECK_FALSE(has(e.message(), "lock_host_pages"));  // nothing to unlock: not offered
  }
  // The pool still works after the refusal.
  void* q = unlocked.allocate(64_KiB);
  unlocked.deallocate(q, 64_KiB);
}

TEST_CASE("a capacity: a new block past it releases cached blocks first, then is a budget error; nothing is lost") {
  pool p{{.lock_pages = false, .capacity = 1_MiB}};
  void* a = p.allocate(512_KiB);
  p.deallocate(p.allocate(256_KiB), 256_KiB);  // cached: 768 KiB held
  void* c = p.allocate(512_KiB);               // past 1 MiB with the cached block: that goes first
  CHECK(p.stats().bytes_held == 1_MiB);
  CHECK(p.stats().bytes_cached == 0);
  CHECK(p.stats().blocks == 2);
  try {
    (void)p.allocate(4_KiB);
    FAIL("an allocation past the capacity did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
    CAPTURE(e.message());
    CHECK(has(e.message(), "4096 bytes"));
    CHECK(has(e.message(), "capacity of 1.00 MiB"));
    CHECK(has(e.message(), "host_capacity"));
  }
  CHECK(p.stats().bytes_held == 1_MiB);  // nothing was mapped
  CHECK(p.stats().misses == 3);
  p.deallocate(c, 512_KiB);
  void* d = p.allocate(512_KiB);  // its class's cached block: no room needed
  CHECK(d == c);
  p.deallocate(d, 512_KiB);
  p.deallocate(a, 512_KiB);
  void* e = p.allocate(1_MiB);  // both cached blocks go to make room for a larger one
  CHECK(p.stats().bytes_held == 1_MiB);
  CHECK(p.stats().blocks == 1);
  p.deallocate(e, 1_MiB);
}

TEST_CASE("a refused mmap is an io error that says what to change") {
  if (sanitized) {
    MESSAGE("skipped under a sanitizer: it cannot run with a capped address space");
    return;
  }
  if (tide::memory::detail::host_memory_bytes() < 1_GiB) {
    MESSAGE("skipped: the host has less than 1 GiB, so 256 MiB might be refused before mmap");
    return;
  }
  pool p;  // lock_pages = true
  std::string msg;
  tide::errc category = tide::errc::internal;
  {
    address_space_capped guard(32_MiB);
    REQUIRE(guard.capped);
    try {
      (void)p.allocate(256_MiB);
    } catch (tide::error const& e) {
      category = e.category();
      msg = e.message();
    }
  }
  CAPTURE(msg);
  CHECK(category == tide::errc::io);
  CHECK(has(msg, "mmap of 268435456 bytes"));
  CHECK(has(msg, "out of memory for model data"));
  CHECK(has(msg, "smaller model"));
  CHECK(has(msg, "larger device_budget"));
  CHECK(has(msg, "lock_host_pages = false"));
  CHECK(has(msg, "ulimit -l"));
  CHECK(p.stats().blocks == 0);
}

TEST_CASE("an abandoned block leaves the pool for good: forgotten, never reused, still mapped after the pool") {
  auto* owner = new tide::memory::pinned_pool<tide::host>{};
  std::size_t const bytes = 64 << 10;
  auto* kept = static_cast<unsigned char*>(owner->allocate(bytes));
  auto* gone = static_cast<unsigned char*>(owner->allocate(bytes));
  auto const before = owner->stats();
  owner->abandon(gone);
  auto const after = owner->stats();
  CHECK(after.blocks == before.blocks - 1);
  CHECK(after.bytes_requested == before.bytes_requested - bytes);
  CHECK(after.bytes_held < before.bytes_held);
  CHECK_THROWS_AS(owner->deallocate(gone, bytes), tide::error);  // not the pool's any more
  owner->abandon(gone);                                           // twice: nothing happens
  CHECK(owner->stats().blocks == after.blocks);
  owner->deallocate(kept, bytes);
  CHECK(owner->allocate(bytes) == kept);  // the cached block comes back; the abandoned one never does
  delete owner;  // releases every block it holds, which no longer includes `gone`
  std::memset(gone, 0x5a, bytes);  // still mapped: a write here would fault if it had been unmapped
  CHECK(gone[bytes - 1] == 0x5a);
  CHECK(::munmap(gone, bytes) == 0);  // 16 whole pages: the block is exactly the request
}
