#pragma once
// tide::sealed's memory: addresses the host cannot touch.
//
// A sealed_region is one memory object (memfd_create) mapped twice:
//   - at device(), PROT_NONE: these are the "device pointers" tide::sealed hands out (its arena
//     carves them up). Any host load or store through them faults (SIGSEGV), as a host
//     dereference of a cudaMalloc'ed pointer would;
//   - at a private alias, read-write: only the backend's own copies and kernels use it, through
//     unseal().
//
//   tide::sealed_region r{1_MiB};
//   float* d = static_cast<float*>(r.device());            // *d here is a fault
//   float* a = tide::unseal(d);                              // the same bytes, readable
//   tide::tensor_view<float, tide::sealed> x{d, {B, T, C}}; // (B, T, C) on the device
//   tide::tensor_view<float> h = tide::unseal(x);            // (B, T, C) at the alias
//
// unseal(p) maps an address inside a live region to its alias and returns any other address
// unchanged (host memory, pinned memory: those a copy may also name). The lookup reads a fixed
// table of live regions without a lock (a seqlock per slot), so stream workers may call it
// concurrently with each other and with regions being made or destroyed; a region is
// unregistered before it is unmapped, and using a
// pointer into a destroyed region is the caller's error, as with freed device memory.
//
// Linux only (memfd_create, mmap). Thread safety: unseal() and every const member, anywhere.

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>

#include <sys/mman.h>
#include <unistd.h>

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide {

namespace detail {

// The live regions: [base, end) maps to alias + (p - base). base == 0 marks a free slot.
// A seqlock: writers make `version` odd while they change a slot, so a reader that raced with a
// slot being reused (one region gone, another made) reads again instead of mixing the two.
struct sealed_slot {
  std::atomic<std::uint64_t> version{0};
  std::atomic<std::uintptr_t> base{0};
  std::atomic<std::uintptr_t> end{0};
  std::atomic<std::uintptr_t> alias{0};
};

inline constexpr std::size_t max_sealed_regions = 256;

struct sealed_table {
  std::array<sealed_slot, max_sealed_regions> slots;
  std::mutex writers;  // registration and removal; lookups take no lock
};

inline sealed_table& sealed_regions() noexcept {
  static sealed_table table;
  return table;
}

}  // namespace detail

// The alias of a sealed address; any other address unchanged. Never faults, never throws.
[[nodiscard]] inline void* unseal(void const* p) noexcept {
  auto const at = reinterpret_cast<std::uintptr_t>(p);
  for (auto const& s : detail::sealed_regions().slots) {
    for (;;) {
      std::uint64_t const v = s.version.load(std::memory_order_acquire);
      if (v % 2 != 0) continue;  // a writer is changing this slot
      std::uintptr_t const base = s.base.load(std::memory_order_relaxed);
      std::uintptr_t const end = s.end.load(std::memory_order_relaxed);
      std::uintptr_t const alias = s.alias.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s.version.load(std::memory_order_relaxed) != v) continue;  // changed meanwhile: read again
      if (base != 0 && at >= base && at < end) return reinterpret_cast<void*>(alias + (at - base));
      break;
    }
  }
  return const_cast<void*>(p);
}

template <class T>
[[nodiscard]] T* unseal(T* p) noexcept {
  return static_cast<T*>(unseal(static_cast<void const*>(p)));
}

// A view of sealed memory as the host view of its alias: same shape, same strides.
template <class T>
[[nodiscard]] tensor_view<T> unseal(tensor_view<T, sealed> v) noexcept {
  std::array<index_t, shape::max_rank> strides{};
  for (int d = 0; d < shape::max_rank; ++d) strides[static_cast<std::size_t>(d)] = v.stride(d);
  return tensor_view<T>{unseal(v.data()), v.extents(), strides};
}

// True when p lies inside a live sealed region (a device pointer of tide::sealed).
[[nodiscard]] inline bool is_sealed(void const* p) noexcept { return unseal(p) != p; }

class sealed_region {
 public:
  explicit sealed_region(std::size_t bytes) : bytes_(round_to_pages(bytes)) {
    TIDE_REQUIRE(bytes > 0, "sealed_region of 0 bytes; ask for at least one byte");
    fd_ = ::memfd_create("tide-sealed", MFD_CLOEXEC);
    if (fd_ < 0) fail("memfd_create");
    if (::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) fail_and_close("ftruncate");
    void* const dev = ::mmap(nullptr, bytes_, PROT_NONE, MAP_SHARED, fd_, 0);
    if (dev == MAP_FAILED) fail_and_close("mmap (device)");
    void* const alias = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (alias == MAP_FAILED) {
      ::munmap(dev, bytes_);
      fail_and_close("mmap (alias)");
    }
    device_ = dev;
    alias_ = alias;
    add();
  }
  ~sealed_region() {
    remove();
    ::munmap(device_, bytes_);
    ::munmap(alias_, bytes_);
    ::close(fd_);
  }
  sealed_region(sealed_region const&) = delete;
  sealed_region& operator=(sealed_region const&) = delete;

  [[nodiscard]] void* device() const noexcept { return device_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  static std::size_t round_to_pages(std::size_t bytes) noexcept {
    auto const page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    return (bytes + page - 1) / page * page;
  }

  [[noreturn]] void fail(char const* what) const {
    int const err = errno;
    TIDE_FAIL(budget, "tide::sealed: ", what, " for a region of ", bytes_of{bytes_}, " failed (",
              std::strerror(err), "); lower the device budget");
  }
  [[noreturn]] void fail_and_close(char const* what) const {
    int const err = errno;
    ::close(fd_);
    errno = err;
    fail(what);
  }

  void add() {
    auto& t = detail::sealed_regions();
    std::lock_guard lock(t.writers);
    for (auto& s : t.slots) {
      if (s.base.load(std::memory_order_relaxed) != 0) continue;
      write(s, reinterpret_cast<std::uintptr_t>(device_), reinterpret_cast<std::uintptr_t>(device_) + bytes_,
            reinterpret_cast<std::uintptr_t>(alias_));
      return;
    }
    ::munmap(device_, bytes_);
    ::munmap(alias_, bytes_);
    ::close(fd_);
    TIDE_FAIL(usage, "tide::sealed: more than ", detail::max_sealed_regions,
              " sealed regions are live at once; destroy an arena before making another");
  }

  void remove() noexcept {
    auto& t = detail::sealed_regions();
    std::lock_guard lock(t.writers);
    for (auto& s : t.slots)
      if (s.base.load(std::memory_order_relaxed) == reinterpret_cast<std::uintptr_t>(device_)) {
        write(s, 0, 0, 0);
        return;
      }
  }

  // Under the writers' mutex.
  static void write(detail::sealed_slot& s, std::uintptr_t base, std::uintptr_t end, std::uintptr_t alias) noexcept {
    std::uint64_t const v = s.version.load(std::memory_order_relaxed);
    s.version.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    s.base.store(base, std::memory_order_relaxed);
    s.end.store(end, std::memory_order_relaxed);
    s.alias.store(alias, std::memory_order_relaxed);
    s.version.store(v + 2, std::memory_order_release);
  }

  std::size_t bytes_;
  int fd_ = -1;
  void* device_ = nullptr;
  void* alias_ = nullptr;
};

}  // namespace tide
