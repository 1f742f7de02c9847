#pragma once
// The NVMe tier of the offload engine (scheduler_options::host_budget, spill_folder): the
// optimizer state of the chunks the host budget cannot hold (their moments, and with bf16 / f16
// parameters their fp32 masters) lives in a memory::file_store, one file block per list and
// slot, two slots per chunk; past that, a second one holds parameter chunks (one list). A host step of such a chunk reads its
// state from the current slot into a staging block, updates it, and writes it to the other slot;
// the step's end makes the other slot current (commit). A step that fails, a failed write
// included, leaves every current slot as it was: the state before the step is still on file.
// A checkpoint's save reads a chunk's state into one host block its views share (spilled_view); a
// load writes it into host blocks attached to its chunks (materialize), which go back to file, to
// the other slot, before another chunk's state comes in or the next step begins (flush).
//
// The file blocks' ids: ((2 spilled + slot) lists + list), spilled = the chunk's rank among the
// spilled chunks.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "tide/core/error.hpp"
#include "tide/memory/file_store.hpp"

namespace tide::offload::detail {

class state_spill {
 public:
  static constexpr std::size_t max_lists = 8;  // offload::max_state_lists and the masters

  // The state of `chunks` (ascending) of `n` chunks goes to a file under `folder`: `lists` state
  // lists of `list_bytes` each per chunk.
  void open(std::filesystem::path const& folder, std::vector<std::uint32_t> const& chunks, std::uint32_t n,
            std::size_t lists, std::size_t list_bytes) {
    TIDE_REQUIRE(lists >= 1 && lists <= max_lists, "offload::scheduler: the spill file keeps 1 to ", max_lists,
                 " optimizer state lists per chunk, not ", lists);
    index_.assign(n, -1);
    for (std::size_t k = 0; k < chunks.size(); ++k) index_[chunks[k]] = static_cast<std::int32_t>(k);
    slot_.assign(chunks.size(), 0);
    written_.assign(chunks.size(), 0);
    materialized_.assign(chunks.size(), 0);
    chunks_ = chunks;
    lists_ = lists;
    store_.emplace(memory::file_store_options{.folder = folder, .block_bytes = list_bytes, .blocks = 2 * chunks.size() * lists});
  }

  [[nodiscard]] bool active() const noexcept { return store_.has_value(); }
  [[nodiscard]] bool spilled(std::uint32_t c) const noexcept { return active() && index_[c] >= 0; }
  [[nodiscard]] std::span<std::uint32_t const> chunks() const noexcept { return chunks_; }
  [[nodiscard]] memory::file_store& store() noexcept { return *store_; }
  // Bytes of one list's file block (>= the list's chunk bytes; what a staging list takes).
  [[nodiscard]] std::size_t block_bytes() const noexcept { return store_->block_bytes(); }
  [[nodiscard]] std::size_t staging_bytes() const noexcept { return lists_ * block_bytes(); }
  [[nodiscard]] std::size_t lists() const noexcept { return lists_; }

  // The file block of chunk c's list k in its current slot (next = false) or the other one.
  [[nodiscard]] std::size_t block(std::uint32_t c, std::size_t k, bool next) const noexcept {
    auto const s = static_cast<std::size_t>(index_[c]);
    std::size_t const slot = slot_[s] ^ (next ? 1u : 0u);
    return (2 * s + slot) * lists_ + k;
  }

  // Every list of chunk c, from the slot given by `blocks` (block(c, k, ..)), into or out of
  // staging (lists one after another, block_bytes() each). Blocks; throws tide::error(io).
  void read(std::size_t const* blocks, std::byte* staging) {
    pending io;
    start(blocks, staging, false, io);
    finish(io);
  }
  void write(std::size_t const* blocks, std::byte const* staging) {
    pending io;
    start(blocks, const_cast<std::byte*>(staging), true, io);
    finish(io);
  }
  // One list's block alone (the masters, written once from the parameters). Throws tide::error(io).
  void write_one(std::size_t block, std::byte const* from) { store_->wait(store_->write_async(block, from)); }

  // A read started ahead of the update that needs it: start_read issues the requests and never
  // throws (a request the store refuses is kept in `failure`); finish waits for every issued
  // one, then throws the first failure. finish must run before staging is used or reused.
  struct pending {
    std::array<memory::file_store::ticket, max_lists> tickets{};  // a step allocates nothing
    std::size_t issued = 0;
    std::exception_ptr failure;
  };
  void start_read(std::size_t const* blocks, std::byte* staging, pending& io) noexcept {
    start(blocks, staging, false, io);
  }
  // Whether finish(io) would not wait.
  [[nodiscard]] bool ready(pending const& io) const {
    for (std::size_t k = 0; k < io.issued; ++k)
      if (!store_->query(io.tickets[k])) return false;
    return true;
  }
  void finish(pending& io) {
    for (std::size_t k = 0; k < io.issued; ++k) {  // every request is waited for: none outlives staging
      try {
        store_->wait(io.tickets[k]);
      } catch (...) {
        if (!io.failure) io.failure = std::current_exception();
      }
    }
    io.issued = 0;
    if (io.failure) std::rethrow_exception(std::exchange(io.failure, nullptr));
  }

  // Chunk c's update wrote its other slot: current at commit().
  void mark_written(std::uint32_t c) noexcept { written_[static_cast<std::size_t>(index_[c])] = 1; }
  // Whether chunk c's update of this step wrote its other slot (what a read after it must take).
  [[nodiscard]] bool written(std::uint32_t c) const noexcept {
    return spilled(c) && written_[static_cast<std::size_t>(index_[c])] != 0;
  }
  void commit() noexcept {
    for (std::size_t s = 0; s < slot_.size(); ++s)
      if (written_[s]) slot_[s] ^= 1, written_[s] = 0;
  }
  void discard() noexcept { std::fill(written_.begin(), written_.end(), std::uint8_t{0}); }
  // Chunk c's other slot alone becomes current (a flush between steps).
  void commit_one(std::uint32_t c) noexcept {
    auto const s = static_cast<std::size_t>(index_[c]);
    if (written_[s]) slot_[s] ^= 1, written_[s] = 0;
  }
  // Chunk c's state is no longer on file (a policy moved it to the device).
  void forget(std::uint32_t c) noexcept { index_[c] = -1; }

  // Checkpoint access: chunk c's state is attached to its chunks (host blocks) until flushed.
  [[nodiscard]] bool materialized(std::uint32_t c) const noexcept {
    return spilled(c) && materialized_[static_cast<std::size_t>(index_[c])] != 0;
  }
  void set_materialized(std::uint32_t c, bool on) noexcept {
    materialized_[static_cast<std::size_t>(index_[c])] = on ? 1 : 0;
  }

 private:
  void start(std::size_t const* blocks, std::byte* staging, bool write, pending& io) noexcept {
    io.issued = 0;
    io.failure = nullptr;
    try {
      for (; io.issued < lists_; ++io.issued) {
        std::byte* const at = staging + io.issued * block_bytes();
        io.tickets[io.issued] =
            write ? store_->write_async(blocks[io.issued], at) : store_->read_async(blocks[io.issued], at);
      }
    } catch (...) {
      io.failure = std::current_exception();
    }
  }

  std::optional<memory::file_store> store_;
  std::vector<std::int32_t> index_;           // by chunk: its rank among the spilled chunks, or -1
  std::vector<std::uint32_t> chunks_;         // the spilled chunks, ascending
  std::vector<std::uint8_t> slot_, written_;  // by spilled chunk: the current slot; written this step
  std::vector<std::uint8_t> materialized_;    // by spilled chunk: attached for a checkpoint
  std::size_t lists_ = 0;
};

}  // namespace tide::offload::detail
