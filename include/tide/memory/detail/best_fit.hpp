#pragma once
// Allocation arithmetic shared by tide's allocators:
//
//   best_fit      an offset heap over [0, capacity): best-fit search over size-ordered bins,
//                 address-ordered neighbour links for O(1) coalescing, every table preallocated at
//                 construction, so allocate/free never call the system allocator. Both
//                 device_arena backends run on it.
//   size_classes  the rounding of pinned_pool and caching_allocator: multiples of a quantum, then
//                 geometric sub-steps, with a stated bound on the rounding overhead.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"

namespace tide::memory::detail {

// Sizes rounded to multiples of 2^quantum_log2 up to 2^(quantum_log2 + steps_log2), and above that
// to 2^steps_log2 steps per doubling. A class is at most one quantum larger than the request below
// the switch point and less than 1/2^steps_log2 of the request larger above it. With fine_log2 set
// (> 0, 2^fine_log2 >= the switch point, and fine_log2 - fine_steps_log2 >= quantum_log2 so that a
// fine step is whole quanta), sizes above 2^fine_log2 go in 2^fine_steps_log2 steps per
// doubling instead: large blocks, usually many of one size, then waste less (under
// 1/2^fine_steps_log2) while a spread of small sizes still shares few classes. Indices are dense:
// class i + 1 is the next larger class.
struct size_classes {
  unsigned quantum_log2;
  unsigned steps_log2;
  unsigned fine_log2 = 0;  // 0: one step count for every size
  unsigned fine_steps_log2 = 0;

  [[nodiscard]] constexpr std::size_t linear_limit() const noexcept {
    return std::size_t{1} << (quantum_log2 + steps_log2);
  }
  [[nodiscard]] constexpr bool fine(std::size_t bytes) const noexcept {
    return fine_log2 > 0 && bytes > (std::size_t{1} << fine_log2);
  }
  [[nodiscard]] constexpr std::size_t round(std::size_t bytes) const noexcept {
    if (bytes == 0) bytes = 1;
    if (bytes <= linear_limit()) return round_up(bytes, std::size_t{1} << quantum_log2);
    auto const octave = static_cast<unsigned>(std::bit_width(bytes)) - 1;
    return round_up(bytes, std::size_t{1} << (octave - (fine(bytes) ? fine_steps_log2 : steps_log2)));
  }
  [[nodiscard]] constexpr std::size_t index(std::size_t bytes) const noexcept {
    std::size_t const c = round(bytes);
    if (c <= linear_limit()) return (c >> quantum_log2) - 1;
    auto const octave = static_cast<unsigned>(std::bit_width(c)) - 1;
    if (fine(c)) {  // after the class 2^fine_log2, fine_steps per doubling
      std::size_t const mantissa = c >> (octave - fine_steps_log2);  // in [steps, 2 steps)
      return index(std::size_t{1} << fine_log2) + (std::size_t{octave} - fine_log2) * (std::size_t{1} << fine_steps_log2) +
             mantissa - (std::size_t{1} << fine_steps_log2);
    }
    std::size_t const mantissa = c >> (octave - steps_log2);  // in [steps, 2 steps)
    return (std::size_t{octave} - quantum_log2 - steps_log2) * (std::size_t{1} << steps_log2) + mantissa - 1;
  }
  // Number of indices that requests of up to max_bytes use.
  [[nodiscard]] constexpr std::size_t count(std::size_t max_bytes) const noexcept { return index(max_bytes) + 1; }
};

class best_fit {
 public:
  static constexpr std::size_t no_fit = std::numeric_limits<std::size_t>::max();

  struct stats_type {
    std::size_t capacity = 0;
    std::size_t in_use = 0;        // bytes of live blocks
    std::size_t peak = 0;          // highest in_use since construction or reset_peak()
    std::size_t largest_free = 0;  // bytes of the largest free block
    std::size_t allocations = 0;   // successful allocate() calls, ever
    std::size_t live_blocks = 0;
    std::size_t free_blocks = 0;
  };

  // `origin` is the address offset 0 stands for: alignment applies to origin + offset.
  best_fit(std::size_t capacity, std::size_t max_blocks, std::uintptr_t origin = 0)
      : capacity_(capacity), max_blocks_(max_blocks), origin_(origin) {
    TIDE_REQUIRE(max_blocks >= 1 && max_blocks < npos, "best_fit: max_blocks ", max_blocks, " must be in [1, 2^32 - 1)");
    nodes_ = std::make_unique<node[]>(max_blocks);
    slot_bits_ = static_cast<unsigned>(std::bit_width(std::bit_ceil(2 * max_blocks))) - 1;
    if (slot_bits_ < 4) slot_bits_ = 4;
    slots_ = std::make_unique<slot[]>(std::size_t{1} << slot_bits_);  // load factor <= 1/2
    for (std::size_t i = 0; i < (std::size_t{1} << slot_bits_); ++i) slots_[i].node = npos;
    for (auto& h : bin_head_) h = npos;
    for (std::size_t i = max_blocks; i-- > 0;) release_node(static_cast<std::uint32_t>(i));
    if (capacity_ > 0) {
      std::uint32_t const n = take_node();
      nodes_[n] = node{0, capacity_, npos, npos, npos, npos, true};
      insert_free(n);
    }
  }

  // The offset of a new block of `bytes` (> 0) whose origin + offset is a multiple of `alignment`
  // (a power of two), taken from the smallest free block that can hold it; no_fit if none can.
  // Throws errc::budget, changing nothing, if the split would need more than max_blocks blocks.
  [[nodiscard]] std::size_t allocate(std::size_t bytes, std::size_t alignment) {
    TIDE_ASSERT(bytes > 0 && is_power_of_two(alignment));
    std::uint32_t const i = find(bytes, alignment);
    if (i == npos) return no_fit;
    node& b = nodes_[i];
    std::size_t const start = aligned(b.offset, alignment);
    std::size_t const pad = start - b.offset;
    std::size_t const tail = b.size - pad - bytes;
    std::size_t const needed = (pad > 0 ? 1u : 0u) + (tail > 0 ? 1u : 0u);
    TIDE_CHECK(spare_count_ >= needed, budget, "best_fit: allocating ", bytes, " bytes needs ", needed,
               " more block records but all max_blocks = ", max_blocks_, " are in use (", live_blocks_,
               " live blocks and the free gaps between them); raise max_blocks");
    remove_free(i);
    if (pad > 0) {  // the alignment gap stays a free block of its own
      std::uint32_t const g = take_node();
      nodes_[g] = node{b.offset, pad, b.prev, i, npos, npos, true};
      link_before(i, g);
      b.offset = start;
      b.size -= pad;
      insert_free(g);
    }
    if (tail > 0) {
      std::uint32_t const t = take_node();
      nodes_[t] = node{start + bytes, tail, i, b.next, npos, npos, true};
      if (b.next != npos) nodes_[b.next].prev = t;
      b.next = t;
      b.size = bytes;
      insert_free(t);
    }
    b.free = false;
    map_insert(start, i);
    in_use_ += bytes;
    if (in_use_ > peak_) peak_ = in_use_;
    ++allocations_;
    ++live_blocks_;
    return start;
  }

  // Size of the live block starting at `offset`, or 0 if none starts there.
  [[nodiscard]] std::size_t live_size(std::size_t offset) const noexcept {
    std::uint32_t const i = map_find(offset);
    return i == npos ? 0 : nodes_[i].size;
  }

  // Frees the live block at `offset`, merging it with free neighbours; returns its size.
  std::size_t free(std::size_t offset) {
    std::uint32_t i = map_find(offset);
    TIDE_CHECK(i != npos, usage, "best_fit: no live block starts at offset ", offset,
               " (freed twice, or never allocated)");
    map_erase(offset);
    std::size_t const bytes = nodes_[i].size;
    in_use_ -= bytes;
    --live_blocks_;
    nodes_[i].free = true;
    if (std::uint32_t const p = nodes_[i].prev; p != npos && nodes_[p].free) {
      remove_free(p);
      nodes_[p].size += nodes_[i].size;
      unlink(i);
      i = p;
    }
    if (std::uint32_t const n = nodes_[i].next; n != npos && nodes_[n].free) {
      remove_free(n);
      nodes_[i].size += nodes_[n].size;
      unlink(n);
    }
    insert_free(i);
    return bytes;
  }

  [[nodiscard]] stats_type stats() const noexcept {
    return {capacity_, in_use_, peak_, largest_free(), allocations_, live_blocks_, free_blocks_};
  }
  void reset_peak() noexcept { peak_ = in_use_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t max_blocks() const noexcept { return max_blocks_; }

 private:
  static constexpr std::uint32_t npos = std::numeric_limits<std::uint32_t>::max();
  // Bins: sizes below 16 one per size, then 16 bins per doubling; 976 bins cover 64-bit sizes.
  static constexpr unsigned sub_bits = 4;
  static constexpr std::size_t bin_count = (64 - sub_bits + 1) << sub_bits;
  static constexpr std::size_t bitmap_words = (bin_count + 63) / 64;

  struct node {
    std::size_t offset;
    std::size_t size;
    std::uint32_t prev, next;          // address order, over all blocks
    std::uint32_t bin_prev, bin_next;  // the bin's free list; bin_next chains spare records too
    bool free;
  };
  struct slot {  // offset -> node of a live block, open addressing
    std::size_t offset;
    std::uint32_t node;
  };

  static constexpr std::size_t bin_of(std::size_t size) noexcept {
    if (size < (std::size_t{1} << sub_bits)) return size;
    auto const e = static_cast<unsigned>(std::bit_width(size)) - 1;
    return (std::size_t{e} - sub_bits + 1) * (std::size_t{1} << sub_bits) + ((size >> (e - sub_bits)) - (std::size_t{1} << sub_bits));
  }

  [[nodiscard]] std::size_t aligned(std::size_t offset, std::size_t alignment) const noexcept {
    return round_up(origin_ + offset, alignment) - origin_;
  }

  [[nodiscard]] bool fits(node const& b, std::size_t bytes, std::size_t alignment) const noexcept {
    std::size_t const pad = aligned(b.offset, alignment) - b.offset;
    return pad <= b.size && b.size - pad >= bytes;
  }

  // First non-empty bin at or after `from`, or bin_count.
  [[nodiscard]] std::size_t next_bin(std::size_t from) const noexcept {
    for (std::size_t w = from / 64; w < bitmap_words; ++w) {
      std::uint64_t bits = bitmap_[w];
      if (w == from / 64) bits &= ~std::uint64_t{0} << (from % 64);
      if (bits != 0) return w * 64 + static_cast<std::size_t>(std::countr_zero(bits));
    }
    return bin_count;
  }

  // Every block in a higher bin is larger than every block in a lower one, so the first bin with
  // a fitting block holds the best fit; within it, the smallest fitting block (then lowest offset).
  [[nodiscard]] std::uint32_t find(std::size_t bytes, std::size_t alignment) const noexcept {
    for (std::size_t bin = next_bin(bin_of(bytes)); bin < bin_count; bin = next_bin(bin + 1)) {
      std::uint32_t best = npos;
      for (std::uint32_t i = bin_head_[bin]; i != npos; i = nodes_[i].bin_next) {
        node const& b = nodes_[i];
        if (!fits(b, bytes, alignment)) continue;
        if (best == npos || b.size < nodes_[best].size || (b.size == nodes_[best].size && b.offset < nodes_[best].offset))
          best = i;
      }
      if (best != npos) return best;
    }
    return npos;
  }

  [[nodiscard]] std::size_t largest_free() const noexcept {
    for (std::size_t w = bitmap_words; w-- > 0;) {
      if (bitmap_[w] == 0) continue;
      std::size_t const bin = w * 64 + 63 - static_cast<std::size_t>(std::countl_zero(bitmap_[w]));
      std::size_t largest = 0;
      for (std::uint32_t i = bin_head_[bin]; i != npos; i = nodes_[i].bin_next)
        if (nodes_[i].size > largest) largest = nodes_[i].size;
      return largest;
    }
    return 0;
  }

  void insert_free(std::uint32_t i) noexcept {
    std::size_t const bin = bin_of(nodes_[i].size);
    nodes_[i].bin_prev = npos;
    nodes_[i].bin_next = bin_head_[bin];
    if (bin_head_[bin] != npos) nodes_[bin_head_[bin]].bin_prev = i;
    bin_head_[bin] = i;
    bitmap_[bin / 64] |= std::uint64_t{1} << (bin % 64);
    ++free_blocks_;
  }

  void remove_free(std::uint32_t i) noexcept {
    node const& b = nodes_[i];
    std::size_t const bin = bin_of(b.size);
    if (b.bin_prev != npos) nodes_[b.bin_prev].bin_next = b.bin_next;
    else bin_head_[bin] = b.bin_next;
    if (b.bin_next != npos) nodes_[b.bin_next].bin_prev = b.bin_prev;
    if (bin_head_[bin] == npos) bitmap_[bin / 64] &= ~(std::uint64_t{1} << (bin % 64));
    --free_blocks_;
  }

  // Puts record g (already holding its offset and size) in address order just before i.
  void link_before(std::uint32_t i, std::uint32_t g) noexcept {
    nodes_[g].prev = nodes_[i].prev;
    nodes_[g].next = i;
    if (nodes_[i].prev != npos) nodes_[nodes_[i].prev].next = g;
    nodes_[i].prev = g;
  }

  // Drops record i, whose bytes its neighbour has absorbed, from the address order.
  void unlink(std::uint32_t i) noexcept {
    node const& b = nodes_[i];
    if (b.prev != npos) nodes_[b.prev].next = b.next;
    if (b.next != npos) nodes_[b.next].prev = b.prev;
    release_node(i);
  }

  std::uint32_t take_node() noexcept {
    std::uint32_t const i = spare_;
    spare_ = nodes_[i].bin_next;
    --spare_count_;
    return i;
  }
  void release_node(std::uint32_t i) noexcept {
    nodes_[i].bin_next = spare_;
    spare_ = i;
    ++spare_count_;
  }

  [[nodiscard]] std::size_t home(std::size_t offset) const noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(offset) * 0x9E3779B97F4A7C15ull) >> (64 - slot_bits_));
  }
  [[nodiscard]] std::size_t mask() const noexcept { return (std::size_t{1} << slot_bits_) - 1; }

  void map_insert(std::size_t offset, std::uint32_t n) noexcept {
    std::size_t s = home(offset);
    while (slots_[s].node != npos) s = (s + 1) & mask();
    slots_[s] = slot{offset, n};
  }
  [[nodiscard]] std::uint32_t map_find(std::size_t offset) const noexcept {
    for (std::size_t s = home(offset);; s = (s + 1) & mask()) {
      if (slots_[s].node == npos) return npos;
      if (slots_[s].offset == offset) return slots_[s].node;
    }
  }
  // Linear probing with backward-shift deletion: no tombstones, probe lengths stay short.
  void map_erase(std::size_t offset) noexcept {
    std::size_t hole = home(offset);
    while (slots_[hole].offset != offset || slots_[hole].node == npos) hole = (hole + 1) & mask();
    for (std::size_t s = (hole + 1) & mask(); slots_[s].node != npos; s = (s + 1) & mask()) {
      std::size_t const h = home(slots_[s].offset);
      bool const stays = hole <= s ? (hole < h && h <= s) : (hole < h || h <= s);
      if (stays) continue;
      slots_[hole] = slots_[s];
      hole = s;
    }
    slots_[hole].node = npos;
  }

  std::size_t capacity_;
  std::size_t max_blocks_;
  std::uintptr_t origin_;
  std::unique_ptr<node[]> nodes_;
  std::unique_ptr<slot[]> slots_;
  unsigned slot_bits_ = 0;
  std::uint32_t spare_ = npos;
  std::size_t spare_count_ = 0;
  std::uint32_t bin_head_[bin_count];
  std::uint64_t bitmap_[bitmap_words] = {};
  std::size_t in_use_ = 0;
  std::size_t peak_ = 0;
  std::size_t allocations_ = 0;
  std::size_t live_blocks_ = 0;
  std::size_t free_blocks_ = 0;
};

}  // namespace tide::memory::detail
