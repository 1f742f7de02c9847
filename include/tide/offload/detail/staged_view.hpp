#pragma once
// Between steps, on a device backend, the host reads and writes a tensor whose chunk lies in
// device memory through one host block: a view copies the tensor in (read_to_host, after the
// compute work so far); a writable view also copies it back (write_from_host, in compute order)
// when it ends, which is when the next view is taken, or the engine drains or begins a step.
// One tensor at a time, as a checkpoint reads and writes them; on tide::host nothing is staged.
//
//   staged_view<sealed> v;
//   auto bytes = v.stage(ex, list.data(i), n, true);   // host bytes of tensor i; write them
//   v.flush(ex);                                       // back to the device (the next stage does it)

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "tide/core/backend.hpp"
#include "tide/core/exec.hpp"
#include "tide/memory/ops.hpp"

namespace tide::offload::detail {

// What a part costs where its capability is unused (tide::host keeps no staged view).
struct empty_part {};

template <Backend B>
class staged_view {
 public:
  // The `bytes` at `device` (device memory of B), copied into the block; written back when the
  // view ends if `write_back`.
  std::span<std::byte> stage(exec<B> const& ex, std::byte* device, std::size_t bytes, bool write_back) {
    flush(ex);
    block_.resize(bytes);
    memory::read_to_host(ex, block_.data(), device, bytes);
    back_ = write_back ? device : nullptr;
    return {block_.data(), bytes};
  }
  // A writable view ends: its bytes go back to the device.
  void flush(exec<B> const& ex) {
    if (back_ == nullptr) return;
    memory::write_from_host(ex, std::exchange(back_, nullptr), block_.data(), block_.size());
  }
  // The device block goes away (the engine frees it): nothing to write back.
  void forget() noexcept { back_ = nullptr; }

 private:
  std::vector<std::byte> block_;
  std::byte* back_ = nullptr;  // where a writable view goes back to
};

}  // namespace tide::offload::detail
