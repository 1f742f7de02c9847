#pragma once
// device_arena<B>: a backend's "device memory" with a hard byte budget. One region is obtained
// once, in the constructor (host: aligned host memory; sealed: a region the host cannot read,
// core/sealed.hpp; cuda: cudaMalloc, in device_arena.cuh),
// and carved up by a best-fit heap whose bookkeeping is preallocated too: after construction,
// allocate and deallocate never call the system allocator.
//
//   tide::memory::device_arena<tide::host> arena{{.budget = 2_GiB}};
//   void* p = arena.allocate(64_MiB);                 // 256-byte aligned
//   arena.deallocate(p, 64_MiB);
//   auto s = arena.stats();                           // in_use, peak, fragmentation, ...
//
// A request that does not fit throws tide::error(budget) naming the bytes asked, free and the
// largest free block; a foreign or already freed pointer throws tide::error(usage). A budget the
// machine cannot hold (0, more than the host's memory on tide::host, more than the device's on
// tide::cuda) is refused at construction with tide::error(budget).
//
// Fault injection, for testing that callers lose nothing: fail_allocation(n) makes the n-th
// allocate() from now throw the same tide::error(budget) an exhausted arena throws.
// Thread safety: every member function may be called concurrently (one mutex per arena).
// Moving an arena is not thread-safe; a moved-from arena may only be destroyed or assigned to.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <mutex>
#include <new>
#include <type_traits>

#include <unistd.h>

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/concepts.hpp"
#include "tide/core/error.hpp"
#include "tide/core/sealed.hpp"
#include "tide/memory/detail/best_fit.hpp"

#if defined(__SANITIZE_ADDRESS__)
#  include <sanitizer/asan_interface.h>
#  define TIDE_ASAN_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#  define TIDE_ASAN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#  define TIDE_ASAN_POISON(p, n) ((void)(p), (void)(n))
#  define TIDE_ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace tide::memory {

struct arena_options {
  std::size_t budget = 0;          // bytes: the hard cap
  std::size_t alignment = 256;     // every block starts on and is sized in multiples of this
  std::size_t max_blocks = 16384;  // live blocks + free gaps the bookkeeping holds (72 B each)
};

struct arena_stats {
  std::size_t budget = 0;
  std::size_t in_use = 0;              // bytes of live blocks (after rounding to the alignment)
  std::size_t peak = 0;                // highest in_use since construction or reset_peak()
  std::size_t free = 0;                // budget - in_use
  std::size_t largest_free_block = 0;  // the largest request that can still succeed
  double fragmentation = 0;            // 1 - largest_free_block / free; 0 when nothing is free
  std::size_t allocations = 0;         // successful allocate() calls, ever
  std::size_t live_blocks = 0;
};

namespace detail {

template <class B>
inline constexpr bool arena_has_no_region = false;

// The one region an arena carves up; RAII. Specialised per backend.
template <Backend B>
class device_region {
  static_assert(arena_has_no_region<B>,
                "device_arena<B> has no region for this backend: for tide::cuda include "
                "<tide/memory/device_arena.cuh> and compile with nvcc");
};

template <>
class device_region<host> {
 public:
  device_region(std::size_t bytes, std::size_t alignment)
      : data_(obtain(bytes, alignment)), bytes_(bytes), alignment_(alignment) {
    TIDE_ASAN_POISON(data_, bytes_);  // under ASan, touching arena memory nobody holds is an error
  }
  ~device_region() {
    TIDE_ASAN_UNPOISON(data_, bytes_);
    ::operator delete(data_, std::align_val_t{alignment_});
  }
  device_region(device_region const&) = delete;
  device_region& operator=(device_region const&) = delete;

  [[nodiscard]] void* data() const noexcept { return data_; }
  static void mark_live(void* p, std::size_t n) noexcept { TIDE_ASAN_UNPOISON(p, n); }
  static void mark_free(void* p, std::size_t n) noexcept { TIDE_ASAN_POISON(p, n); }

  // The host's physical memory: the host backend's "device" is host memory, so a budget above it
  // could never be backed (0 when the system does not say).
  [[nodiscard]] static std::size_t capacity() noexcept {
    long const pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
  }

 private:
  static void* obtain(std::size_t bytes, std::size_t alignment) {
    try {
      return ::operator new(bytes, std::align_val_t{alignment});
    } catch (std::bad_alloc const&) {
      TIDE_FAIL(budget, "device_arena<host>: the system refused ", bytes_of{bytes},
                " of host memory for the device budget; lower the budget (device_budget of the offload policy)");
    }
  }

  void* data_;
  std::size_t bytes_;
  std::size_t alignment_;
};

// tide::sealed: the region is a sealed_region (core/sealed.hpp), so the blocks handed out are
// addresses the host cannot touch; the backend's copies and kernels reach them through unseal().
// ASan poisoning is not applied: a host access to any of it already faults.
template <>
class device_region<sealed> {
 public:
  device_region(std::size_t bytes, std::size_t alignment) : region_(bytes + alignment) {
    auto const at = reinterpret_cast<std::uintptr_t>(region_.device());
    data_ = reinterpret_cast<void*>((at + alignment - 1) & ~(std::uintptr_t{alignment} - 1));
  }
  device_region(device_region const&) = delete;
  device_region& operator=(device_region const&) = delete;

  [[nodiscard]] void* data() const noexcept { return data_; }
  static void mark_live(void*, std::size_t) noexcept {}
  static void mark_free(void*, std::size_t) noexcept {}
  // As for tide::host: the sealed device's memory is this machine's.
  [[nodiscard]] static std::size_t capacity() noexcept { return device_region<host>::capacity(); }

 private:
  sealed_region region_;
  void* data_ = nullptr;
};

}  // namespace detail

template <Backend B>
class device_arena {
 public:
  using backend = B;
  using options = arena_options;

  explicit device_arena(options const& opts) {
    TIDE_CHECK(opts.budget > 0, budget, "device_arena<", B::name,
               ">: the budget is 0 bytes; give the bytes of device memory to use (device_budget of the offload "
               "policy, options.budget of an arena)");
    TIDE_REQUIRE(is_power_of_two(opts.alignment) && opts.alignment <= (std::size_t{1} << 30), "device_arena<",
                 B::name, ">: alignment ", opts.alignment, " is not a power of two up to 1 GiB");
    std::size_t const most = detail::device_region<B>::capacity();
    TIDE_CHECK(opts.budget <= std::numeric_limits<std::size_t>::max() / 2 && (most == 0 || opts.budget <= most),
               budget, "device_arena<", B::name, ">: a budget of ", bytes_of{opts.budget}, " (", opts.budget,
               " bytes) is more than this ", B::is_device ? "device" : "machine", " has (",
               most == 0 ? std::string("unknown") : tide::detail::concat(bytes_of{most}),
               "); give a device_budget that fits");
    state_ = std::make_unique<state>(opts);
  }

  device_arena(device_arena&&) noexcept = default;
  device_arena& operator=(device_arena&&) noexcept = default;
  device_arena(device_arena const&) = delete;
  device_arena& operator=(device_arena const&) = delete;

  // `bytes` rounded up to the arena's alignment (0 counts as 1); the block starts on a multiple of
  // max(alignment, options.alignment). Strong guarantee: a throw changes nothing.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = 256) {
    TIDE_REQUIRE(is_power_of_two(alignment), "device_arena<", B::name, ">::allocate: alignment ", alignment,
                 " is not a power of two");
    state& s = *state_;
    std::size_t const align = std::max(alignment, s.opts.alignment);
    std::lock_guard lock(s.mutex);
    if (s.fail_at != 0 && --s.fail_at == 0) {
      s.refused = bytes;
      ++s.refusals;
      TIDE_FAIL(budget, "device_arena<", B::name, ">: cannot allocate ", bytes,
                " bytes: the failure injected by fail_allocation()");
    }
    std::size_t offset = detail::best_fit::no_fit;
    std::size_t size = 0;
    if (bytes <= s.opts.budget) {
      size = block_bytes(bytes);
      offset = s.heap.allocate(size, align);
    }
    if (offset == detail::best_fit::no_fit) {
      auto const h = s.heap.stats();
      s.refused = bytes;
      ++s.refusals;
      TIDE_FAIL(budget, "device_arena<", B::name, ">: cannot allocate ", bytes, " bytes (alignment ", align,
                "): ", h.capacity - h.in_use, " bytes free of the ", h.capacity, "-byte budget, largest free block ",
                h.largest_free, " bytes. Free or offload buffers, or raise the budget (device_budget of the "
                "offload policy)");
    }
    void* const p = static_cast<std::byte*>(s.region.data()) + offset;
    detail::device_region<B>::mark_live(p, size);
    return p;
  }

  // `bytes` must be what was passed to allocate (compared after rounding).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = 256) {
    (void)alignment;
    TIDE_CHECK(owns(p), usage, "device_arena<", B::name, ">::deallocate: ", p,
               " is not inside this arena (it was allocated elsewhere)");
    state& s = *state_;
    std::size_t const offset = static_cast<std::size_t>(static_cast<std::byte*>(p) - static_cast<std::byte*>(s.region.data()));
    std::lock_guard lock(s.mutex);
    std::size_t const live = s.heap.live_size(offset);
    TIDE_CHECK(live != 0, usage, "device_arena<", B::name, ">::deallocate: no live block starts at ", p, " (offset ",
               offset, "): it was deallocated twice, or is not a pointer allocate returned");
    TIDE_CHECK(live == block_bytes(bytes), usage, "device_arena<", B::name, ">::deallocate: ", p, " holds a ", live,
               "-byte block but deallocate was given ", bytes, " bytes; pass the size given to allocate");
    s.heap.free(offset);
    detail::device_region<B>::mark_free(p, live);
  }

  // Bytes of the live block starting at p (after rounding), or 0 if no live block starts there.
  [[nodiscard]] std::size_t block_size(void const* p) const {
    if (!owns(p)) return 0;
    auto const offset = reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(state_->region.data());
    std::lock_guard lock(state_->mutex);
    return state_->heap.live_size(static_cast<std::size_t>(offset));
  }

  // True if p points into this arena's region (whether or not it is allocated).
  [[nodiscard]] bool owns(void const* p) const noexcept {
    if (!state_) return false;
    auto const a = reinterpret_cast<std::uintptr_t>(p);
    auto const base = reinterpret_cast<std::uintptr_t>(state_->region.data());
    return a >= base && a - base < state_->opts.budget;
  }

  [[nodiscard]] arena_stats stats() const {
    std::lock_guard lock(state_->mutex);
    auto const h = state_->heap.stats();
    std::size_t const free = h.capacity - h.in_use;
    double const frag = free == 0 ? 0.0 : 1.0 - static_cast<double>(h.largest_free) / static_cast<double>(free);
    return {h.capacity, h.in_use, h.peak, free, h.largest_free, frag, h.allocations, h.live_blocks};
  }

  void reset_peak() {
    std::lock_guard lock(state_->mutex);
    state_->heap.reset_peak();
  }

  // Bytes of the last request the arena refused (0: none yet), and how many it refused, ever.
  [[nodiscard]] std::size_t last_refused() const {
    std::lock_guard lock(state_->mutex);
    return state_->refused;
  }
  [[nodiscard]] std::size_t refusals() const {
    std::lock_guard lock(state_->mutex);
    return state_->refusals;
  }

  // Fault injection: the n-th allocate() from now throws tide::error(budget) as if the arena were
  // exhausted (n = 0: none). For tests that check a caller loses nothing when allocation fails.
  void fail_allocation(std::size_t n) {
    std::lock_guard lock(state_->mutex);
    state_->fail_at = n;
  }

  [[nodiscard]] options const& config() const noexcept { return state_->opts; }
  // The most a budget may be: the machine's device memory (host memory on tide::host); 0 when
  // the system does not say.
  [[nodiscard]] static std::size_t capacity() noexcept { return detail::device_region<B>::capacity(); }
  // The region's first byte (device memory for tide::cuda).
  [[nodiscard]] void* base() const noexcept { return state_->region.data(); }

 private:
  struct state {
    explicit state(options const& o)
        : opts(o),
          region(o.budget, std::max(o.alignment, alignof(std::max_align_t))),
          heap(o.budget, o.max_blocks, reinterpret_cast<std::uintptr_t>(region.data())) {}
    options opts;
    detail::device_region<B> region;
    detail::best_fit heap;
    std::mutex mutex;
    std::size_t fail_at = 0;  // fault injection: allocate() calls until the injected failure
    std::size_t refused = 0;  // bytes of the last refused request
    std::size_t refusals = 0;
  };

  [[nodiscard]] std::size_t block_bytes(std::size_t bytes) const noexcept {
    return round_up(bytes == 0 ? 1 : bytes, state_->opts.alignment);
  }

  std::unique_ptr<state> state_;
};

static_assert(MemoryResource<device_arena<host>>);
static_assert(std::is_nothrow_move_constructible_v<device_arena<host>> && !std::is_copy_constructible_v<device_arena<host>>);

}  // namespace tide::memory
