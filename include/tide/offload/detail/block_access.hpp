#pragma once
// What the open block may touch: between a block's pre_* and post_* hooks, the parameters its
// uses() lists (to read) and, in its backward, their gradients (to write); nothing outside a
// block while a step or an evaluation is open. The scheduler's param_data and grad_data ask it on
// every call (one byte per parameter), and a step that fails clears it (abort()).
//
//   block_access a{params};
//   a.open(uses.of(b), b, chunk::phase::backward);
//   a.may_read(i); a.may_write_grad(i);
//   a.leave(uses.of(b));

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tide/chunk/memory_tracer.hpp"

namespace tide::offload::detail {

class block_access {
 public:
  explicit block_access(std::size_t params) : bits_(params, 0) {}

  // Block `block`'s moment `ph` opens: its parameters `ids` become readable (and, in backward,
  // their gradients writable).
  void open(std::span<std::uint32_t const> ids, int block, chunk::phase ph) {
    auto const bits = static_cast<std::uint8_t>(readable | (ph == chunk::phase::backward ? writable_grad : 0));
    for (std::uint32_t i : ids) bits_[i] = bits;
    block_ = block;
    phase_ = ph;
    open_ = true;
  }
  // The open block's parameters `ids` are no longer touchable.
  void leave(std::span<std::uint32_t const> ids) {
    open_ = false;
    for (std::uint32_t i : ids) bits_[i] = 0;
  }
  // A failed step: no block is open, nothing is touchable.
  void abort() noexcept {
    open_ = false;
    std::ranges::fill(bits_, std::uint8_t{0});
  }

  [[nodiscard]] bool in_block() const noexcept { return open_; }
  [[nodiscard]] int block() const noexcept { return block_; }
  [[nodiscard]] chunk::phase phase() const noexcept { return phase_; }
  [[nodiscard]] bool may_read(std::uint32_t i) const noexcept { return (bits_[i] & readable) != 0; }
  [[nodiscard]] bool may_write_grad(std::uint32_t i) const noexcept { return (bits_[i] & writable_grad) != 0; }

 private:
  static constexpr std::uint8_t readable = 1, writable_grad = 2;
  std::vector<std::uint8_t> bits_;  // by parameter
  bool open_ = false;
  int block_ = 0;
  chunk::phase phase_ = chunk::phase::forward;
};

}  // namespace tide::offload::detail
