#pragma once
// ZeRO-3 in the offload engine: which parameter chunks this rank holds now, and the gathers that
// bring the others' chunks around the blocks that use them (a ParameterShardingSink). It decides;
// the engine moves the bytes, through the port it passes to each call:
//
//   std::byte* gather_block(c)               a new block for chunk c's parameters (the engine
//                                            picks the tier: device memory where it can)
//   void free_gather_block(c, block)         back where it came from (the owner's copy was sent)
//   void abandon_gather_block(c, block)      after a failed gather: a host block is never reused
//                                            (the communicator may still write it)
//   void send_own(c, block)                  the owner's chunk c copied into block, to send
//   void gather_async(c, block)              the sink's broadcast of chunk c into block
//   void wait_gathered()                     the sink's gathers landed (throws what they threw)
//   void attach_gathered(c, block)           block becomes chunk c's payload, on its tier
//   void drop_param(c)                       chunk c's payload freed, wherever it is
//
// held(c) changes only at block hooks, which every rank runs in the same order, so it is the same
// on every rank, and so are the gathers it starts: that keeps the collectives matched (a fetch or
// a prefetch, timed by the copies and the optimizer, never starts one).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "tide/core/error.hpp"
#include "tide/offload/gradient_sink.hpp"

namespace tide::offload::detail {

class shard_map {
 public:
  // `shards_parameters`: the sink keeps each parameter chunk on its owner only (ZeRO-3).
  shard_map(chunk_shard shard, bool shards_parameters, std::uint32_t n)
      : shard_(shard), sharded_(shards_parameters && shard.ranks > 1) {
    held_.assign(n, true);  // the model initialises every parameter; the first block frees the others'
    pending_.assign(n, false);
    gathering_.reserve(n);
    for (std::uint32_t c = 0; c < n; ++c) all_.push_back(c);
  }

  [[nodiscard]] chunk_shard shard() const noexcept { return shard_; }
  [[nodiscard]] bool owns(std::uint32_t c) const noexcept { return shard_.owns(c); }
  // ZeRO-3 over more than one rank: other ranks' parameter chunks come and go.
  [[nodiscard]] bool params_sharded() const noexcept { return sharded_; }
  // This rank holds chunk c's parameters now.
  [[nodiscard]] bool has_param(std::uint32_t c) const noexcept { return !sharded_ || owns(c) || held_[c]; }
  // Gathers in flight.
  [[nodiscard]] bool gathering() const noexcept { return !gathering_.empty(); }

  // Before a block's moment: the gathers started for it land, the chunks it does not use
  // (`ids`, sorted, parameter chunks first) are freed, and the rest of its chunks are gathered.
  template <class Port>
  void gather_for(Port& port, std::span<std::uint32_t const> ids) {
    if (!sharded_) return;
    finish(port);
    for (std::uint32_t c = 0; c < held_.size(); ++c)
      if (held_[c] && !std::ranges::binary_search(ids, c)) release(port, c);
    start(port, ids);
    finish(port);
  }
  // Once the moment's chunks are resident: the next moment's gathers start (`next`: its ids),
  // to land while the block computes.
  template <class Port>
  void gather_ahead(Port& port, std::span<std::uint32_t const> next) {
    if (sharded_) start(port, next);
  }
  // Every chunk held on every rank (a collective: every rank calls it), until the next block
  // frees what it does not use.
  template <class Port>
  void gather_all(Port& port) {
    if (!sharded_) return;
    finish(port);
    start(port, all_);
    finish(port);
  }
  // Every other rank's chunk freed, after the gathers in flight landed (the end of a step or an
  // evaluation, the start of one). Throws what a gather's wait threw.
  template <class Port>
  void release_all(Port& port) {
    if (!sharded_) return;
    finish(port);
    for (std::uint32_t c = 0; c < held_.size(); ++c)
      if (held_[c]) release(port, c);
  }
  // The same after a failure: not reported, as the communicator that failed stays failed and its
  // next gather throws again.
  template <class Port>
  void abort(Port& port) noexcept {
    try {
      release_all(port);
    } catch (...) {
    }
  }

 private:
  // Starts gathering the parameter chunks among `ids` that no rank holds now. The owner sends a
  // copy (its chunk may move while the broadcast runs); the others receive into a new block,
  // attached once it landed. Recorded only once the gather started: a failure before it leaves
  // nothing to attach.
  template <class Port>
  void start(Port& port, std::span<std::uint32_t const> ids) {
    for (std::uint32_t c : ids) {
      if (c >= held_.size()) break;  // gradient ids follow
      if (held_[c] || pending_[c]) continue;
      std::byte* const block = port.gather_block(c);
      try {
        if (owns(c)) port.send_own(c, block);
        port.gather_async(c, block);
      } catch (...) {
        port.free_gather_block(c, block);
        throw;
      }
      gathering_.push_back({c, block});
      pending_[c] = true;
    }
  }
  // Waits for the gathers started; their chunks are held. If the wait fails, the blocks may still
  // be written by the communicator: they are abandoned, and the communicator stays broken.
  template <class Port>
  void finish(Port& port) {
    if (gathering_.empty()) return;
    try {
      port.wait_gathered();
    } catch (...) {
      for (auto const& [c, block] : gathering_) {
        pending_[c] = false;
        port.abandon_gather_block(c, block);
      }
      gathering_.clear();
      throw;
    }
    for (auto const& [c, block] : gathering_) {
      pending_[c] = false;
      held_[c] = true;
      if (owns(c)) port.free_gather_block(c, block);
      else port.attach_gathered(c, block);
    }
    gathering_.clear();
  }
  // Chunk c is no longer held by the ranks that do not own it: they free it, wherever it is.
  template <class Port>
  void release(Port& port, std::uint32_t c) {
    if (!owns(c)) port.drop_param(c);
    held_[c] = false;
  }

  chunk_shard shard_;
  bool sharded_ = false;
  std::vector<bool> held_;     // by chunk: the ranks that do not own it hold it now
  std::vector<bool> pending_;  // by chunk: a gather of it is in flight
  std::vector<std::pair<std::uint32_t, std::byte*>> gathering_;  // the gathers in flight and their blocks
  std::vector<std::uint32_t> all_;                                // 0 .. n - 1
};

}  // namespace tide::offload::detail
