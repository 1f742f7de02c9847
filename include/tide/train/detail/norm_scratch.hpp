#pragma once
// The trainer's scratch for the global gradient norm (kernels/scratch.hpp): device memory from its
// arena on a device backend, so the device budget counts it; host memory on tide::host. Made at
// the first clipped step and kept: the gradient lists a step measures keep their sizes.

#include <cstddef>
#include <new>
#include <utility>

#include "tide/core/backend.hpp"
#include "tide/kernels/scratch.hpp"
#include "tide/memory/device_arena.hpp"

namespace tide::train::detail {

template <Backend B>
class norm_scratch {
 public:
  explicit norm_scratch(memory::device_arena<B>& arena) noexcept : arena_(&arena) {}
  norm_scratch(norm_scratch const&) = delete;
  norm_scratch& operator=(norm_scratch const&) = delete;
  ~norm_scratch() { release(); }

  // At least `bytes`; a larger request replaces the block (the old one is returned first).
  kernels::scratch<B> at_least(std::size_t bytes) {
    if (bytes > bytes_) {
      release();
      if constexpr (B::is_device)
        data_ = static_cast<std::byte*>(arena_->allocate(bytes, 256));
      else
        data_ = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{kernels::scratch_alignment}));
      bytes_ = bytes;
    }
    return {data_, bytes_};
  }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    if constexpr (B::is_device)
      arena_->deallocate(data_, bytes_, 256);
    else
      ::operator delete(data_, std::align_val_t{kernels::scratch_alignment});
    data_ = nullptr;
    bytes_ = 0;
  }

  memory::device_arena<B>* arena_;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace tide::train::detail
