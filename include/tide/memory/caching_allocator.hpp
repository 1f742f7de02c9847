#pragma once
// caching_allocator<B>: transient buffers on top of a device_arena<B>. A freed buffer stays
// allocated in the arena, cached under its size class, and is handed out again for the next
// request of that class, so short-lived workspaces do not churn the arena's heap. When the arena
// is full, the allocator returns its cache to the arena and retries once before letting the
// arena's budget error through. release_cached() returns the cache on demand.
//
//   tide::memory::device_arena<tide::host> arena{{.budget = 1_GiB}};
//   tide::memory::caching_allocator<tide::host> workspace{arena};
//   void* w = workspace.allocate(12_MiB);
//   workspace.deallocate(w, 12_MiB);                  // cached; stays in arena.stats().in_use
//
// Classes: multiples of the arena's alignment up to 32 of them, then 32 steps per doubling (a
// buffer is less than 1/32 larger than its request above 32 alignments). Bookkeeping is sized
// from the arena's max_blocks at construction: allocate/deallocate never call the system allocator.
//
// tide::host: kernels run synchronously with respect to the allocator (a buffer is no longer in
// use once deallocate is called), so the host flavour knows nothing of streams. tide::cuda
// (caching_allocator.cuh) is stream-ordered: see there.
// Thread safety: every member function may be called concurrently (one mutex per allocator).
// The arena must outlive the allocator and stay where it is; the allocator is movable.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/concepts.hpp"
#include "tide/core/error.hpp"
#include "tide/memory/detail/best_fit.hpp"
#include "tide/memory/device_arena.hpp"

namespace tide::memory {

struct caching_stats {
  std::size_t bytes_in_use = 0;  // class bytes of the buffers handed out
  std::size_t bytes_cached = 0;  // of the buffers kept for reuse (still allocated in the arena)
  std::size_t hits = 0;          // allocations served from the cache
  std::size_t misses = 0;        // allocations that went to the arena
  std::size_t released = 0;      // cached buffers returned to the arena, ever
  std::size_t retries = 0;       // times a full arena made the allocator release its cache and retry
};

template <Backend B>
class caching_allocator;

namespace detail {

// The backend-independent part: size classes, per-class lists of cached buffers, the arena
// round trip. Tag is what a backend remembers about a cached buffer (cuda: stream and event).
// The callables passed in run under the allocator's mutex.
template <Backend B, class Tag>
class block_cache {
 public:
  explicit block_cache(device_arena<B>& arena) : state_(std::make_unique<state>(arena)) {}
  ~block_cache() {
    if (state_) release_all([](Tag&) {});
  }
  block_cache(block_cache&&) noexcept = default;
  block_cache& operator=(block_cache&& other) noexcept {
    if (this != &other) {
      if (state_) release_all([](Tag&) {});
      state_ = std::move(other.state_);
    }
    return *this;
  }

  // usable(Tag&) says whether a cached buffer may be handed out now; reuse(Tag&) is called on the
  // one that is; retire(Tag&) on each buffer returned to the arena when it is full.
  template <class Usable, class Reuse, class Retire>
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment, Usable&& usable, Reuse&& reuse,
                               Retire&& retire) {
    state& s = *state_;
    device_arena<B>& arena = *s.arena;
    if (bytes > arena.config().budget) return arena.allocate(bytes, alignment);  // throws budget
    std::size_t const cls = s.classes.index(bytes);
    std::size_t const size = s.classes.round(bytes);
    std::lock_guard lock(s.mutex);
    std::uint32_t prev = npos;
    for (std::uint32_t i = s.heads[cls]; i != npos; prev = i, i = s.entries[i].next) {
      entry& e = s.entries[i];
      if (reinterpret_cast<std::uintptr_t>(e.ptr) % alignment != 0 || !usable(e.tag)) continue;
      (prev == npos ? s.heads[cls] : s.entries[prev].next) = e.next;
      reuse(e.tag);
      void* const p = e.ptr;
      put_spare(i);
      s.stats.bytes_cached -= size;
      s.stats.bytes_in_use += size;
      ++s.stats.hits;
      return p;
    }
    void* p = nullptr;
    try {
      p = arena.allocate(size, alignment);
    } catch (tide::error const& e) {
      if (e.category() != errc::budget || s.stats.bytes_cached == 0) throw;
      release_locked(retire);
      ++s.stats.retries;
      p = arena.allocate(size, alignment);
    }
    s.stats.bytes_in_use += size;
    ++s.stats.misses;
    return p;
  }

  // make_tag() gives the Tag the buffer is cached with.
  template <class MakeTag>
  void deallocate(void* p, std::size_t bytes, MakeTag&& make_tag) {
    state& s = *state_;
    std::size_t const held = s.arena->block_size(p);
    TIDE_CHECK(held != 0, usage, "caching_allocator<", B::name, ">::deallocate: ", p,
               " is not a buffer of this allocator's arena");
    TIDE_CHECK(bytes <= s.arena->config().budget && s.classes.round(bytes) == held, usage, "caching_allocator<",
               B::name, ">::deallocate: ", p, " is a ", held, "-byte buffer but deallocate was given ", bytes,
               " bytes; pass the size given to allocate");
    std::size_t const cls = s.classes.index(bytes);
    std::lock_guard lock(s.mutex);
    for (std::uint32_t i = s.heads[cls]; i != npos; i = s.entries[i].next)
      TIDE_CHECK(s.entries[i].ptr != p, usage, "caching_allocator<", B::name, ">::deallocate: ", p,
                 " was deallocated twice");
    // A cached buffer is a live arena block, so there are never more than max_blocks of them.
    TIDE_CHECK(s.spare != npos, internal, "caching_allocator: more cached buffers than arena blocks");
    Tag tag = make_tag();
    std::uint32_t const i = s.spare;
    s.spare = s.entries[i].next;
    s.entries[i] = entry{p, held, tag, s.heads[cls]};
    s.heads[cls] = i;
    s.stats.bytes_in_use -= held;
    s.stats.bytes_cached += held;
  }

  template <class Retire>
  void release_all(Retire&& retire) {
    std::lock_guard lock(state_->mutex);
    release_locked(retire);
  }

  [[nodiscard]] caching_stats stats() const {
    std::lock_guard lock(state_->mutex);
    return state_->stats;
  }
  [[nodiscard]] device_arena<B>& arena() const noexcept { return *state_->arena; }
  // Most buffers that can be cached at once: the arena's max_blocks.
  [[nodiscard]] std::size_t capacity() const noexcept { return state_->entries.size(); }
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }  // false once moved from

 private:
  static constexpr std::uint32_t npos = 0xffffffffu;

  struct entry {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    Tag tag{};
    std::uint32_t next = npos;  // class list when cached, spare chain otherwise
  };

  struct state {
    explicit state(device_arena<B>& a)
        : arena(&a),
          classes{static_cast<unsigned>(std::countr_zero(a.config().alignment)), 5},
          heads(classes.count(a.config().budget), npos),
          entries(a.config().max_blocks) {
      for (std::size_t i = entries.size(); i-- > 0;) {
        entries[i].next = spare;
        spare = static_cast<std::uint32_t>(i);
      }
    }
    device_arena<B>* arena;
    size_classes classes;
    std::vector<std::uint32_t> heads;
    std::vector<entry> entries;
    std::uint32_t spare = npos;
    caching_stats stats;
    std::mutex mutex;
  };

  void put_spare(std::uint32_t i) noexcept {
    state_->entries[i] = entry{};
    state_->entries[i].next = state_->spare;
    state_->spare = i;
  }

  template <class Retire>
  void release_locked(Retire& retire) {
    state& s = *state_;
    for (auto& head : s.heads) {
      while (head != npos) {
        std::uint32_t const i = head;
        entry& e = s.entries[i];
        retire(e.tag);
        s.arena->deallocate(e.ptr, e.bytes);
        head = e.next;
        s.stats.bytes_cached -= e.bytes;
        ++s.stats.released;
        put_spare(i);
      }
    }
  }

  std::unique_ptr<state> state_;
};

}  // namespace detail

template <>
class caching_allocator<host> {
 public:
  using backend = host;

  explicit caching_allocator(device_arena<host>& arena) : cache_(arena) {}

  // A buffer of at least `bytes` from the cache or, failing that, the arena (after releasing the
  // cache and retrying once if the arena is full). Throws the arena's budget error otherwise.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = 256) {
    TIDE_REQUIRE(is_power_of_two(alignment), "caching_allocator<host>::allocate: alignment ", alignment,
                 " is not a power of two");
    return cache_.allocate(bytes, alignment, always, nothing, nothing);
  }

  // Caches the buffer for reuse. `bytes` must be what was passed to allocate (same class).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = 256) {
    (void)alignment;
    cache_.deallocate(p, bytes, [] { return no_tag{}; });
  }

  // Returns every cached buffer to the arena.
  void release_cached() { cache_.release_all(nothing); }

  [[nodiscard]] caching_stats stats() const { return cache_.stats(); }
  [[nodiscard]] device_arena<host>& arena() const noexcept { return cache_.arena(); }

 private:
  struct no_tag {};
  static constexpr auto always = [](no_tag&) { return true; };
  static constexpr auto nothing = [](no_tag&) {};

  detail::block_cache<host, no_tag> cache_;
};

static_assert(MemoryResource<caching_allocator<host>>);

}  // namespace tide::memory
