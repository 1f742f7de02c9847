#pragma once
// The moments of one training step, known before the step from the block uses and the chunk
// layout: the chunks each block's forward and backward touch (a split backward's input pass
// touches its forward's; ids 0 .. n-1 name parameter chunks,
// n .. 2n-1 their gradient chunks), the chunks whose gradients each block's backward completes
// (after the last block, in backward order, that uses them), and the working set, the most chunks
// one moment touches, with where it is. The memory tracer checks every step against them; the
// policies' minimum budgets start from the working set. Pure: no memory, no policy.
//
//   moment_map m{uses, layout, n};
//   m.ids_of(b, chunk::phase::backward);   // sorted: parameter chunks, then gradient chunks
//   m.completes_at(b);                     // gradient chunks the sink and the optimizer take after b

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tide/chunk/layout.hpp"
#include "tide/chunk/memory_tracer.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parameters.hpp"

namespace tide::offload::detail {

class moment_map {
 public:
  moment_map(block_uses const& uses, chunk::chunk_layout const& layout, std::uint32_t n) : first_(uses.first_block) {
    int const last = uses.last_block();
    auto chunks_of = [&](int b, bool with_grads) {
      std::vector<std::uint32_t> ids;
      for (std::uint32_t i : uses.of(b)) {
        ids.push_back(layout.chunk_of[i]);
        if (with_grads) ids.push_back(n + layout.chunk_of[i]);
      }
      std::ranges::sort(ids);
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      return ids;
    };
    for (int b = first_; b <= last; ++b) {
      forward_.push_back(chunks_of(b, false));
      backward_.push_back(chunks_of(b, true));
    }
    // A chunk's gradients are complete after the last block, in backward order, that uses it:
    // the first block, in forward order.
    completes_.assign(forward_.size(), {});
    std::vector<bool> done(n, false);
    for (std::size_t k = 0; k < forward_.size(); ++k)
      for (std::uint32_t id : forward_[k])
        if (!done[id]) {
          done[id] = true;
          completes_[k].push_back(id);
        }
    std::size_t busiest = 0;
    for (std::size_t k = 0; k < backward_.size(); ++k) {
      auto const grads =
          static_cast<std::size_t>(std::ranges::count_if(backward_[k], [&](std::uint32_t id) { return id >= n; }));
      grads_per_moment_ = std::max(grads_per_moment_, grads);
      if (backward_[k].size() > working_set_) working_set_ = backward_[k].size(), busiest = k;
    }
    where_ = concat_moment(static_cast<int>(busiest) + first_, "backward");
    for (std::size_t k = 0; k < forward_.size(); ++k)
      if (forward_[k].size() > working_set_) {
        working_set_ = forward_[k].size();
        where_ = concat_moment(static_cast<int>(k) + first_, "forward");
      }
  }

  // The chunks block b's moment `ph` touches, sorted (a split backward's input pass: forward's).
  [[nodiscard]] std::vector<std::uint32_t> const& ids_of(int block, chunk::phase ph) const {
    auto const k = index(block);
    return ph == chunk::phase::backward ? backward_[k] : forward_[k];  // input: the parameters, as forward
  }
  // The parameter chunks whose gradients block b's backward completes, in chunk order.
  [[nodiscard]] std::span<std::uint32_t const> completes_at(int block) const { return completes_[index(block)]; }
  // The most chunks one moment touches, and which moment ("block 3's backward").
  [[nodiscard]] std::size_t working_set() const noexcept { return working_set_; }
  [[nodiscard]] std::string const& working_set_moment() const noexcept { return where_; }
  // The most gradient chunks one backward moment touches.
  [[nodiscard]] std::size_t grads_per_moment() const noexcept { return grads_per_moment_; }

 private:
  [[nodiscard]] std::size_t index(int block) const {
    TIDE_REQUIRE(block >= first_ && block < first_ + static_cast<int>(forward_.size()), "offload: block ", block,
                 " has no moment (blocks are ", first_, " .. ", first_ + static_cast<int>(forward_.size()) - 1, ")");
    return static_cast<std::size_t>(block - first_);
  }
  static std::string concat_moment(int block, char const* phase) {
    return "block " + std::to_string(block) + "'s " + phase;
  }

  int first_ = 0;
  std::vector<std::vector<std::uint32_t>> forward_, backward_, completes_;
  std::size_t working_set_ = 0, grads_per_moment_ = 0;
  std::string where_;
};

}  // namespace tide::offload::detail
