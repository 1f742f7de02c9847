// Allocator cost: ns per allocate + deallocate pair in a mixed-size pattern, against malloc/free
// of the same pattern in the same run.
//
// Pattern: 64 live buffers; each step frees a random one and allocates a new one, its size
// log-uniform in [4 KiB, 1 MiB] and not a multiple of anything (transient activations and
// staging buffers of a training step look like this). The sequence is generated once and
// replayed identically for every allocator.
//
//   device_arena_alloc_ns   device_arena<host> (budget 128 MiB); detail: its fragmentation after
//                           the pattern, with the 64 buffers still live
//   pinned_pool_alloc_ns    pinned_pool<host>, warm (each class already pinned once); detail:
//                           hit rate, held / requested bytes

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include <tide/core/bytes.hpp>
#include <tide/memory/device_arena.hpp>
#include <tide/memory/pinned_pool.hpp>

#include "harness.hpp"

using namespace tide::literals;

namespace {

constexpr std::size_t window = 64;

struct step {
  std::uint32_t slot;
  std::uint32_t bytes;
};

std::vector<step> make_pattern(std::size_t steps) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> log_size(std::log(4096.0), std::log(1048576.0));
  std::vector<step> pattern(steps);
  for (auto& s : pattern) {
    s.slot = static_cast<std::uint32_t>(rng() % window);
    s.bytes = static_cast<std::uint32_t>(std::exp(log_size(rng)));
  }
  return pattern;
}

// Replays the pattern on alloc(bytes) / dealloc(p, bytes); returns ns per pair (median of reps).
template <class Alloc, class Dealloc>
double ns_per_pair(std::vector<step> const& pattern, Alloc&& alloc, Dealloc&& dealloc, int reps) {
  void* live[window];
  std::uint32_t size[window];
  for (std::size_t i = 0; i < window; ++i) {
    size[i] = pattern[i].bytes;
    live[i] = alloc(size[i]);
  }
  double const s = tide::bench::median_seconds([&] {
    for (auto const& st : pattern) {
      dealloc(live[st.slot], size[st.slot]);
      size[st.slot] = st.bytes;
      live[st.slot] = alloc(st.bytes);
    }
    tide::bench::keep(live[0]);
  }, reps, 1);
  for (std::size_t i = 0; i < window; ++i) dealloc(live[i], size[i]);
  return s * 1e9 / static_cast<double>(pattern.size());
}

}  // namespace

int main() {
  bool const quick = tide::bench::quick();
  auto const pattern = make_pattern(quick ? 5000 : 200000);
  int const reps = quick ? 3 : 7;

  double const malloc_ns = ns_per_pair(
      pattern, [](std::size_t n) { return std::malloc(n); }, [](void* p, std::size_t) { std::free(p); }, reps);

  tide::memory::device_arena<tide::host> arena{{.budget = 128_MiB}};
  double const arena_ns = ns_per_pair(
      pattern, [&](std::size_t n) { return arena.allocate(n); },
      [&](void* p, std::size_t n) { arena.deallocate(p, n); }, reps);
  // Fragmentation with the pattern's buffers live: replay once more and keep them.
  std::vector<std::pair<void*, std::size_t>> held(window, {nullptr, 0});
  for (auto const& st : pattern) {
    auto& [p, n] = held[st.slot];
    if (p != nullptr) arena.deallocate(p, n);
    p = arena.allocate(st.bytes);
    n = st.bytes;
  }
  auto const as = arena.stats();
  for (auto [p, n] : held)
    if (p != nullptr) arena.deallocate(p, n);

  tide::bench::figure{
      .bench = "alloc",
      .name = "device_arena_alloc_ns",
      .value = arena_ns,
      .unit = "ns",
      .anchor = "malloc_free_ns",
      .anchor_value = malloc_ns,
      .higher_is_better = false,
      .detail = {{"fragmentation", as.fragmentation},
                 {"in_use_mib", static_cast<double>(as.in_use) / (1 << 20)},
                 {"largest_free_block_mib", static_cast<double>(as.largest_free_block) / (1 << 20)},
                 {"peak_mib", static_cast<double>(as.peak) / (1 << 20)}},
  }.print();

  tide::memory::pinned_pool<tide::host> pool;
  (void)ns_per_pair(  // warm: pin each class once
      pattern, [&](std::size_t n) { return pool.allocate(n); }, [&](void* p, std::size_t n) { pool.deallocate(p, n); },
      1);
  auto const warm = pool.stats();
  double const pool_ns = ns_per_pair(
      pattern, [&](std::size_t n) { return pool.allocate(n); }, [&](void* p, std::size_t n) { pool.deallocate(p, n); },
      reps);
  auto const ps = pool.stats();
  double const hits = static_cast<double>(ps.hits - warm.hits);
  double const misses = static_cast<double>(ps.misses - warm.misses);

  tide::bench::figure{
      .bench = "alloc",
      .name = "pinned_pool_alloc_ns",
      .value = pool_ns,
      .unit = "ns",
      .anchor = "malloc_free_ns",
      .anchor_value = malloc_ns,
      .higher_is_better = false,
      .detail = {{"hit_rate", hits / (hits + misses)},
                 {"held_mib", static_cast<double>(ps.bytes_held) / (1 << 20)},
                 {"blocks", static_cast<double>(ps.blocks)},
                 {"locked_blocks", static_cast<double>(ps.locked)}},
  }.print();
}
