#pragma once
// Kernel workspace from the caller: CUB's two-phase protocol. A kernel that needs temporary
// memory says how much for a shape; the caller passes that much, from its arena or from a plan:
//
//   std::size_t const n = tide::kernels::attention_backward_scratch_bytes(ex, B, T, C, NH);
//   tide::kernels::scratch<Backend> ws{static_cast<std::byte*>(arena.allocate(n, 256)), n};
//   tide::kernels::attention_backward(ex, dqkv, dout, qkv, out, lse, NH, ws);
//
// No kernel allocates memory of its own or keeps a buffer between calls, so a device budget
// counts every byte a step touches (nn::gpt plans its kernels' scratch with its activations).
// The memory is the kernel's from the call until the work it enqueued has run: the next kernel
// on the same stream may use it again. It must be aligned to scratch_alignment (an arena's 256
// is), and hold at least the queried bytes; a smaller one is refused before anything runs.
//
// On tide::host, every kernel also has an overload without the scratch argument, which
// allocates the scratch for that one call and frees it on return (tests, one-off calls; a
// training loop passes its own). Device backends have no such overload: a call without scratch
// on tide::sealed fails to compile with a message that says what to pass.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>

#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"

namespace tide::kernels {

inline constexpr std::size_t scratch_alignment = 64;

// `bytes` of backend B's memory at `data` (aligned to scratch_alignment), lent to a kernel.
template <Backend B = host>
struct scratch {
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

namespace detail {

// A kernel's scratch as aligned parts, so one function both sizes it (the query) and carves it
// (the call): add<U>(n) returns the part's offset; bytes() is the total.
class scratch_parts {
 public:
  template <class U>
  std::size_t add(std::size_t count) noexcept {
    std::size_t const at = round_up(bytes_, scratch_alignment);
    bytes_ = at + count * sizeof(U);
    return at;
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  std::size_t bytes_ = 0;
};

template <class U, Backend B>
[[nodiscard]] U* scratch_part(scratch<B> const& ws, std::size_t offset) noexcept {
  return reinterpret_cast<U*>(ws.data + offset);
}

// Refuses scratch smaller than the kernel's query, or misaligned, before any work.
// `query` names the function that sizes it.
template <Backend B>
void check_scratch(char const* op, char const* query, scratch<B> const& ws, std::size_t need) {
  TIDE_REQUIRE(ws.bytes >= need, op, ": the scratch passed holds ", ws.bytes, " bytes but these shapes need ", need,
               " (", bytes_of{need}, "); ask tide::kernels::", query, " with the same shapes and pass that much");
  TIDE_REQUIRE(need == 0 || reinterpret_cast<std::uintptr_t>(ws.data) % scratch_alignment == 0, op,
               ": scratch must be aligned to ", scratch_alignment, " bytes (an arena block is)");
}

// Host scratch for one call: the overloads without a scratch argument allocate it, aligned.
class call_scratch {
 public:
  explicit call_scratch(std::size_t bytes)
      : data_(bytes == 0 ? nullptr
                         : static_cast<std::byte*>(::operator new(bytes, std::align_val_t{scratch_alignment}))),
        bytes_(bytes) {}
  call_scratch(call_scratch const&) = delete;
  call_scratch& operator=(call_scratch const&) = delete;
  ~call_scratch() {
    if (data_ != nullptr) ::operator delete(data_, std::align_val_t{scratch_alignment});
  }
  [[nodiscard]] scratch<host> get() const noexcept { return {data_, bytes_}; }

 private:
  std::byte* data_;
  std::size_t bytes_;
};

template <class A>
inline constexpr bool is_scratch_v = false;
template <Backend B>
inline constexpr bool is_scratch_v<scratch<B>> = true;

}  // namespace detail

}  // namespace tide::kernels
