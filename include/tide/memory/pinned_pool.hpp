#pragma once
// pinned_pool<B>: page-locked host blocks for copies between memory tiers, cached by size class
// so no copy ever pins memory of its own: a freed block goes to its class's free list and the
// next request of that class gets it back. trim() returns the cached blocks to the system.
//
//   tide::memory::pinned_pool<tide::host> pool;
//   void* staging = pool.allocate(64_MiB);            // page-aligned, touched, mlock'ed
//   pool.deallocate(staging, 64_MiB);                 // cached; the next 64 MiB request reuses it
//
// Blocks: tide::host maps pages (mmap), touches them and mlocks them; when the system refuses
// mlock (RLIMIT_MEMLOCK) the block stays unlocked and one message goes to stderr per process.
// tide::cuda (pinned_pool.cuh) uses cudaHostAlloc. stats().locked counts the locked blocks.
//
// Out of host memory: a request larger than the host's memory (RAM + swap), or one that would take
// the pool past its capacity (options::capacity, once the cached blocks of other sizes are
// released), is tide::error(budget) before anything is mapped, and a refused mmap is
// tide::error(io). An offload scheduler's host
// tier is such a pool, holding the model data that is not on the device, so both messages say
// what to change in a trainer's options: a smaller model, a larger device_budget, or (when the
// pool locks its pages) lock_host_pages = false.
//
// Size classes: whole pages up to 32 pages, then 32 steps per doubling, and above 16 MiB 256
// steps per doubling. A block is at most one page larger than its request, from 32 pages (128 KiB
// with 4 KiB pages) on less than 1/32 (3.125%) larger, and above 16 MiB less than 1/256 (0.4%); so
// every request of at least 20 pages (80 KiB) holds at most 5% more than it asked. Pinning works
// on whole pages, so smaller requests round up to whole pages. The fine classes above 16 MiB are
// for the blocks an offload scheduler holds by the thousand, all of one chunk's size: 32 steps
// there wasted up to 3% of the host tier (2.8% for 132 MiB chunks), while a spread of smaller
// sizes keeps sharing few classes (and few cached blocks).
//
// Thread safety: every member function may be called concurrently (one mutex per pool; mapping
// and locking new pages happens outside it).

#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/concepts.hpp"
#include "tide/core/error.hpp"
#include "tide/memory/detail/best_fit.hpp"

namespace tide::memory {

struct pinned_pool_options {
  bool lock_pages = true;  // tide::host: mlock every block (cudaHostAlloc always pins)
  // The most bytes the pool may hold, blocks handed out and cached (0: no limit). A new block
  // that would pass it first releases cached blocks of other sizes; if that is not enough,
  // allocate() throws tide::error(budget) before mapping anything.
  std::size_t capacity = 0;
};

struct pinned_pool_stats {
  std::size_t bytes_requested = 0;  // asked for by the blocks handed out now
  std::size_t peak_bytes_requested = 0;  // the most bytes_requested has been (what a run needed)
  std::size_t bytes_held = 0;       // of every block the pool holds: handed out and cached
  std::size_t peak_bytes_held = 0;  // the most bytes_held has been
  std::size_t bytes_cached = 0;     // of the cached blocks
  std::size_t blocks = 0;           // held, handed out and cached
  std::size_t hits = 0;             // allocations served from the cache
  std::size_t misses = 0;           // allocations that pinned a new block
  std::size_t locked = 0;           // blocks among `blocks` whose pages are locked
};

namespace detail {

template <class B>
inline constexpr bool pool_has_no_pages = false;

// Where a backend's page-locked blocks come from. Specialised per backend.
template <Backend B>
struct pinned_pages {
  static_assert(pool_has_no_pages<B>,
                "pinned_pool<B> has no page source for this backend: for tide::cuda include "
                "<tide/memory/pinned_pool.cuh> and compile with nvcc");
};

// Set once the process has said that mlock was refused; tests reset it.
inline std::atomic<bool>& mlock_refusal_reported() noexcept {
  static std::atomic<bool> reported{false};
  return reported;
}

inline void report_mlock_refusal(std::size_t bytes, int err) {
  if (mlock_refusal_reported().exchange(true)) return;
  std::fprintf(stderr,
               "tide: mlock of %zu bytes refused (%s); pinned_pool<host> continues with unlocked pages, which "
               "copies can still use but the system may swap out. Raise RLIMIT_MEMLOCK (ulimit -l) to lock "
               "them. (Said once per process.)\n",
               bytes, std::strerror(err));
}

// RAM + swap of this host (sysinfo, read once per process): more than any request can get. 0 if
// unknown.
inline std::size_t host_memory_bytes() noexcept {
  static std::size_t const total = [] {
    struct sysinfo info {};
    if (::sysinfo(&info) != 0) return std::size_t{0};
    constexpr std::size_t most = std::numeric_limits<std::size_t>::max();
    std::size_t const unit = info.mem_unit == 0 ? 1 : info.mem_unit;
    std::size_t const ram = info.totalram, swap = info.totalswap;
    if (ram > most - swap || ram + swap > most / unit) return most;
    return (ram + swap) * unit;
  }();
  return total;
}

// What to change when the host has no room for a block, in a trainer's terms: the pool is the
// host tier of the model data that is not on the device.
inline std::string host_room_advice(bool locking) {
  std::string s =
      "the host is out of memory for model data (an offload scheduler keeps the model data that is not on the "
      "device there); train a smaller model, or give the trainer a larger device_budget (more model data on the "
      "device)";
  if (locking)
    s += ", or set lock_host_pages = false (this pool locks its pages: locked memory counts against the mlock "
         "limit, see ulimit -l, and is never swapped out)";
  return s;
}

template <>
struct pinned_pages<host> {
  struct block {
    void* ptr;
    bool locked;
  };

  [[nodiscard]] static std::size_t page_size() noexcept {
    static std::size_t const page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    return page;
  }

  // Blocks of at least this many bytes start on a transparent huge page boundary and ask for
  // huge pages (madvise, before the first touch): a 1 MiB copy or O_DIRECT read into them then
  // walks or pins 1 page instead of 256 (bench/scale measured reads 1.0 to 1.6x faster).
  static constexpr std::size_t huge_page = std::size_t{2} << 20;

  // `bytes` is a multiple of the page size.
  [[nodiscard]] static block acquire(std::size_t bytes, bool lock) {
    bool const huge = bytes >= huge_page;
    std::size_t const mapped = huge ? bytes + huge_page : bytes;  // room to align the start
    void* const m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      int const err = errno;
      TIDE_FAIL(io, "pinned_pool<host>: mmap of ", bytes, " bytes (", bytes_of{bytes}, ") failed (",
                std::strerror(err), "): ", host_room_advice(lock), "; a pool used directly can also trim() its "
                "cached blocks");
    }
    void* p = m;
    if (huge) {  // keep [p, p + bytes) with p on a huge page boundary; unmap the rest
      auto const at = reinterpret_cast<std::uintptr_t>(m);
      std::uintptr_t const start = (at + huge_page - 1) & ~(std::uintptr_t{huge_page} - 1);
      if (start > at) ::munmap(m, start - at);
      if (std::uintptr_t const end = at + mapped, used = start + bytes; end > used)
        ::munmap(reinterpret_cast<void*>(used), end - used);
      p = reinterpret_cast<void*>(start);
      (void)::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: kernels without THP keep small pages
    }
    // Touch every page now, so the first copy into the block pays no page faults.
    for (std::size_t i = 0; i < bytes; i += page_size()) static_cast<unsigned char volatile*>(p)[i] = 0;
    bool locked = false;
    if (lock) {
      // The raw syscall, because ASan replaces mlock() with a no-op that reports success.
      if (::syscall(SYS_mlock, p, bytes) == 0) locked = true;
      else report_mlock_refusal(bytes, errno);
    }
    return {p, locked};
  }

  static void release(void* p, std::size_t bytes) noexcept { ::munmap(p, bytes); }  // also unlocks
};

// tide::sealed: pinned memory is ordinary host memory, as on CUDA (cudaHostAlloc'ed blocks are
// host-readable); the sealed device's copies read and write it directly.
template <>
struct pinned_pages<sealed> : pinned_pages<host> {};

}  // namespace detail

template <Backend B>
class pinned_pool {
 public:
  using backend = B;
  using options = pinned_pool_options;
  static constexpr unsigned steps_log2 = 5;                        // 32 steps per doubling
  static constexpr unsigned fine_log2 = 24, fine_steps_log2 = 8;   // above 16 MiB: 256 steps
  static constexpr std::size_t max_request = std::size_t{1} << 44;  // 16 TiB

  // Destruction releases every block, cached or handed out.
  explicit pinned_pool(options const& opts = {}) : state_(std::make_unique<state>(opts)) {}
  pinned_pool(pinned_pool&&) noexcept = default;
  pinned_pool& operator=(pinned_pool&&) noexcept = default;
  pinned_pool(pinned_pool const&) = delete;
  pinned_pool& operator=(pinned_pool const&) = delete;

  // A page-aligned block of class_size(bytes) bytes; alignment may be up to the page size.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = 256) {
    std::size_t const page = pages::page_size();
    TIDE_REQUIRE(is_power_of_two(alignment) && alignment <= page, "pinned_pool<", B::name,
                 ">::allocate: alignment ", alignment, " must be a power of two of at most the page size ", page);
    // Before mapping anything: with overcommit, an mmap of more than the host has succeeds and
    // touching the pages gets the process killed instead of an error.
    if (std::size_t const host_bytes = detail::host_memory_bytes(); host_bytes != 0 && bytes > host_bytes)
      TIDE_FAIL(budget, "pinned_pool<", B::name, ">::allocate: ", bytes, " bytes (", bytes_of{bytes},
                ") asked, more than the host's memory, ", bytes_of{host_bytes}, " of RAM and swap: ",
                detail::host_room_advice((std::is_same_v<B, host> || std::is_same_v<B, sealed>) && state_->opts.lock_pages));
    TIDE_REQUIRE(bytes <= max_request, "pinned_pool<", B::name, ">::allocate: ", bytes,
                 " bytes is more than the largest class, ", max_request, " bytes");
    state& s = *state_;
    std::size_t const cls = s.classes.index(bytes);
    std::size_t const size = s.classes.round(bytes);
    {
      std::lock_guard lock(s.mutex);
      if (std::uint32_t const i = s.heads[cls]; i != npos) {
        block& b = s.blocks[i];
        s.heads[cls] = b.next;
        b.live = true;
        b.requested = bytes;
        s.stats.bytes_requested += bytes;
        s.stats.peak_bytes_requested = std::max(s.stats.peak_bytes_requested, s.stats.bytes_requested);
        s.stats.bytes_cached -= b.bytes;
        ++s.stats.hits;
        return b.ptr;
      }
      make_room(s, size, bytes);
    }
    auto const fresh = [&] {  // slow: outside the lock
      try {
        return pages::acquire(size, s.opts.lock_pages);
      } catch (...) {
        std::lock_guard lock(s.mutex);
        s.mapping -= size;
        throw;
      }
    }();
    try {
      std::lock_guard lock(s.mutex);
      s.mapping -= size;
      std::uint32_t i = s.spare;
      if (i != npos) s.spare = s.blocks[i].next;
      else {
        s.blocks.push_back({});
        i = static_cast<std::uint32_t>(s.blocks.size() - 1);
      }
      s.blocks[i] = block{fresh.ptr, size, bytes, static_cast<std::uint32_t>(cls), npos, true, fresh.locked};
      try {
        s.index.emplace(fresh.ptr, i);
      } catch (...) {
        s.blocks[i] = block{};
        s.blocks[i].next = s.spare;
        s.spare = i;
        throw;
      }
      s.stats.bytes_requested += bytes;
      s.stats.peak_bytes_requested = std::max(s.stats.peak_bytes_requested, s.stats.bytes_requested);
      s.stats.bytes_held += size;
      s.stats.peak_bytes_held = std::max(s.stats.peak_bytes_held, s.stats.bytes_held);
      ++s.stats.blocks;
      ++s.stats.misses;
      if (fresh.locked) ++s.stats.locked;
    } catch (...) {
      pages::release(fresh.ptr, size);
      throw;
    }
    return fresh.ptr;
  }

  // Returns the block to its class's free list. `bytes` must fall in the class it was allocated in.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = 256) {
    (void)alignment;
    state& s = *state_;
    std::lock_guard lock(s.mutex);
    auto const it = s.index.find(p);
    TIDE_CHECK(it != s.index.end(), usage, "pinned_pool<", B::name, ">::deallocate: ", p,
               " was not allocated by this pool");
    block& b = s.blocks[it->second];
    TIDE_CHECK(b.live, usage, "pinned_pool<", B::name, ">::deallocate: ", p, " was deallocated twice");
    TIDE_CHECK(bytes <= max_request && s.classes.round(bytes) == b.bytes, usage, "pinned_pool<", B::name,
               ">::deallocate: ", p, " is a ", b.bytes, "-byte block for a ", b.requested,
               "-byte request, but deallocate was given ", bytes, " bytes");
    b.live = false;
    b.next = s.heads[b.cls];
    s.heads[b.cls] = it->second;
    s.stats.bytes_requested -= b.requested;
    s.stats.bytes_cached += b.bytes;
  }

  // Gives up a live block for good: the pool forgets it and never releases it, not even at
  // destruction (for a buffer a failed asynchronous operation may still write: a communicator
  // that gave up on a lost rank). Its bytes stay mapped until the process exits.
  void abandon(void* p) noexcept {
    state& s = *state_;
    std::lock_guard lock(s.mutex);
    auto const it = s.index.find(p);
    if (it == s.index.end() || !s.blocks[it->second].live) return;
    s.stats.bytes_requested -= s.blocks[it->second].requested;
    forget(s, it->second);
  }

  // The peaks start again from now (to measure one phase of a run).
  void reset_peak() noexcept {
    state& s = *state_;
    std::lock_guard lock(s.mutex);
    s.stats.peak_bytes_held = s.stats.bytes_held;
    s.stats.peak_bytes_requested = s.stats.bytes_requested;
  }

  // Releases every cached block to the system; blocks handed out are untouched.
  void trim() {
    state& s = *state_;
    std::lock_guard lock(s.mutex);
    for (auto& head : s.heads) {
      while (head != npos) {
        std::uint32_t const i = head;
        block& b = s.blocks[i];
        head = b.next;
        pages::release(b.ptr, b.bytes);
        s.stats.bytes_cached -= b.bytes;
        forget(s, i);
      }
    }
  }

  [[nodiscard]] pinned_pool_stats stats() const {
    std::lock_guard lock(state_->mutex);
    return state_->stats;
  }

  // The bytes a request of `bytes` holds.
  [[nodiscard]] std::size_t class_size(std::size_t bytes) const noexcept { return state_->classes.round(bytes); }
  // The size classes of a pool on pages of 2^page_log2 bytes. The fine classes above 16 MiB step by
  // whole pages only with pages of up to 64 KiB (2^(24 - 8)); larger pages keep the coarse classes
  // at every size.
  [[nodiscard]] static constexpr detail::size_classes classes_for(unsigned page_log2) noexcept {
    return {page_log2, steps_log2, page_log2 + fine_steps_log2 <= fine_log2 ? fine_log2 : 0u, fine_steps_log2};
  }

 private:
  using pages = detail::pinned_pages<B>;
  static constexpr std::uint32_t npos = 0xffffffffu;

  struct block {
    void* ptr = nullptr;
    std::size_t bytes = 0;      // class size
    std::size_t requested = 0;  // of the current holder
    std::uint32_t cls = 0;
    std::uint32_t next = npos;  // class free list when cached; spare records when ptr is null
    bool live = false;
    bool locked = false;
  };

  struct state {
    explicit state(options const& o)
        : opts(o),
          classes{classes_for(static_cast<unsigned>(std::countr_zero(pages::page_size())))},
          heads(classes.count(max_request), npos) {}
    ~state() {
      for (auto const& b : blocks)
        if (b.ptr != nullptr) pages::release(b.ptr, b.bytes);
    }
    state(state const&) = delete;
    state& operator=(state const&) = delete;
    options opts;
    detail::size_classes classes;
    std::vector<std::uint32_t> heads;  // per class: first cached block
    std::vector<block> blocks;
    std::unordered_map<void const*, std::uint32_t> index;
    std::uint32_t spare = npos;
    std::size_t mapping = 0;  // of new blocks being mapped now, outside the lock (capacity)
    pinned_pool_stats stats;
    mutable std::mutex mutex;
  };

  // Capacity: room for a new block of `size` bytes (for a request of `bytes`) beside the blocks
  // held and those being mapped, releasing cached blocks first; then counts it as being mapped.
  // Under s.mutex.
  void make_room(state& s, std::size_t size, std::size_t bytes) {
    std::size_t const cap = s.opts.capacity;
    if (cap == 0) return;
    auto const over = [&] { return s.stats.bytes_held + s.mapping + size > cap; };
    for (std::size_t c = 0; c < s.heads.size() && over(); ++c)
      while (s.heads[c] != npos && over()) {
        std::uint32_t const i = s.heads[c];
        s.heads[c] = s.blocks[i].next;
        pages::release(s.blocks[i].ptr, s.blocks[i].bytes);
        s.stats.bytes_cached -= s.blocks[i].bytes;
        forget(s, i);
      }
    TIDE_CHECK(!over(), budget, "pinned_pool<", B::name, ">::allocate: ", bytes, " bytes (", bytes_of{bytes},
               ") would take the pool past its capacity of ", bytes_of{cap}, " (it holds ",
               bytes_of{s.stats.bytes_held + s.mapping}, " in blocks handed out): ",
               detail::host_room_advice((std::is_same_v<B, host> || std::is_same_v<B, sealed>) && s.opts.lock_pages),
               ", or raise the capacity (scheduler_options::host_capacity)");
    s.mapping += size;
  }

  // Block record i leaves the pool's books (its pages are released, or given up, by the caller);
  // the record becomes a spare. Under s.mutex.
  static void forget(state& s, std::uint32_t i) noexcept {
    block& b = s.blocks[i];
    s.index.erase(b.ptr);
    s.stats.bytes_held -= b.bytes;
    --s.stats.blocks;
    if (b.locked) --s.stats.locked;
    b = block{};
    b.next = s.spare;
    s.spare = i;
  }

  std::unique_ptr<state> state_;
};

static_assert(MemoryResource<pinned_pool<host>>);

}  // namespace tide::memory
