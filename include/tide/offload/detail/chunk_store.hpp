#pragma once
// The offload engine's tier store: where a chunk's bytes live and the moves between tiers. It
// holds the chunk lists and their blocks, the pinned host tier, the copy stream and its events,
// and carries out the moves (fetch, copy out, take a stale block for a fetch, evict, drop a clean
// chunk, settle, reclaim). No decision is made here: the engine owns the store (a member, not a
// base) and its residency part decides what to fetch and what to evict. The store asks its owner
// (Engine, called through owner_, resolved at compile time) at these points only:
//   pick_victim(t, protect, beyond)   the arena refused a block: which chunk makes room
//   before_fetch(id), fetched(id)     around a fetch (a gather under ZeRO-3; the eviction policy)
//   param_on_file(c), read_param_file(c)   a parameter chunk whose bytes are in the NVMe tier
//   fill_chunk(c, dev, host, bytes, after_copy_stream)   the chunk source fills a parameter chunk
//   holds_parameters(c)               whether a fetched parameter chunk's host copy may be kept
//   before_copy_out(id), param_in_file(c), released(c)   around a copy out
//   reclaim_ring_block(p)             a host block being freed may be the update runner's
// Trace ids: parameter chunk c is c, gradient chunk c is n + c (n chunks per list). Acquire
// before detach: every move allocates its new block and issues its copy before the chunk lets go
// of the old one, so a refused block or copy leaves the chunk where it was.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/chunk/chunk.hpp"
#include "tide/chunk/layout.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/exec.hpp"
#include "tide/core/parameters.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/ops.hpp"
#include "tide/memory/pinned_pool.hpp"
#include "tide/memory/stream.hpp"
#include "tide/memory/transfer_engine.hpp"
#include "tide/offload/detail/clock.hpp"
#include "tide/offload/detail/copy_span.hpp"
#include "tide/offload/gradient_sink.hpp"
#include "tide/offload/stats.hpp"
#include "tide/optim/optimizer.hpp"
#include "tide/offload/trace_events.hpp"

namespace tide::offload::detail {

template <Backend B, Element T, class Engine>
class chunk_store {
 public:
  static constexpr bool has_master = !std::is_same_v<T, float>;
  static constexpr std::size_t untraced = std::numeric_limits<std::size_t>::max();

  chunk_store(Engine& owner, exec<B> const& ex, memory::device_arena<B>& arena, parameter_list params,
              block_uses uses, chunk::chunk_layout layout, std::size_t state_lists, std::span<extra_list const> extras,
              memory::pinned_pool_options host_pool, chunk_shard shard = {}, bool attach_state = true)
      : owner_(&owner),
        ex_(ex),
        arena_(&arena),
        params_(std::move(params)),
        uses_(std::move(uses)),
        layout_(std::move(layout)),
        param_(chunk::chunk_role::param, dtype_of<T>, layout_, params_),
        grad_(chunk::chunk_role::grad, dtype_of<T>, layout_, params_),
        master_(chunk::chunk_role::master, dtype::f32, layout_, params_),
        host_(host_pool),
        engine_(copy_stream_, {.max_in_flight = 8}),
        shard_(shard) {
    TIDE_REQUIRE(shard.ranks >= 1 && shard.rank >= 0 && shard.rank < shard.ranks, "offload::scheduler: the sink's "
                 "shard is rank ", shard.rank, " of ", shard.ranks, "; needs 0 <= rank < ranks");
    for (std::size_t k = 0; k < state_lists; ++k)
      state_.emplace_back(chunk::chunk_role::state, dtype::f32, layout_, params_);
    for (extra_list const& e : extras) extra_.emplace_back(chunk::chunk_role::extra, e.type, layout_, params_);
    n_ = static_cast<std::uint32_t>(layout_.chunks());
    ids_ = 2 * n_;
    ready_.resize(ids_);
    stale_.assign(ids_, nullptr);
    stale_where_.assign(ids_, chunk::tier::host);
    shadow_.assign(n_, nullptr);
    in_flight_.assign(ids_, false);
    // Parameters and optimizer state start on the host, zeroed: the model initialises them there.
    // Under ZeRO a rank keeps the master and optimizer state of its own chunks only. Without
    // attach_state the engine attaches the parameters and the state itself (the NVMe tier keeps
    // some of them on file).
    for (std::uint32_t c = 0; c < n_; ++c) {
      if (attach_state) attach_host_zeroed(param_[c]);
      for (auto& l : extra_) attach_host_zeroed(l[c]);
      if (!shard_.owns(c) || !attach_state) continue;
      for (auto& l : state_) attach_host_zeroed(l[c]);
      if constexpr (has_master) attach_host_zeroed(master_[c]);
    }
    for (std::uint32_t i = 0; i < params_.size(); ++i) param_.transition(i, chunk::tensor_state::hold);
  }
  chunk_store(chunk_store const&) = delete;
  chunk_store& operator=(chunk_store const&) = delete;

  // Frees every block (the engine waited for its workers first).
  void free_all() noexcept {
    for (std::uint32_t id = 0; id < ids_; ++id)
      if (stale_[id] != nullptr) free_block(std::exchange(stale_[id], nullptr), stale_where_[id], chunk_of(id).capacity());
    free_payloads(param_);
    free_payloads(grad_);
    free_payloads(master_);
    for (auto& l : state_) free_payloads(l);
    for (auto& l : extra_) free_payloads(l);
    for (std::byte* p : spare_) arena_->deallocate(p, param_.chunk_bytes(), 256);
    spare_.clear();
    for (std::byte*& p : shadow_)
      if (p != nullptr) host_.deallocate(std::exchange(p, nullptr), param_.chunk_bytes(), 256);
  }

  // ---- the placement members policies call (offload/scheduler_policy.hpp) -------------------
  // Device blocks kept for reuse instead of going back to the arena (layer_window's pool).
  void keep_spare_blocks(std::size_t count) {
    spare_limit_ = count;
    spare_.reserve(count);
  }

  [[nodiscard]] Engine& owner() noexcept { return *owner_; }

  // ---- the chunks, their blocks and the moves (the engine and its residency part call these) ---
  [[nodiscard]] chunk::chunk& chunk_of(std::uint32_t id) { return id < n_ ? param_[id] : grad_[id - n_]; }
  [[nodiscard]] bool on_device(std::uint32_t id) {
    chunk::chunk& ch = chunk_of(id);
    return ch.payload() != nullptr && ch.tier() == chunk::tier::device;
  }
  [[nodiscard]] std::size_t block_bytes() const noexcept { return round_up(param_.chunk_bytes(), 256); }
  [[nodiscard]] std::size_t state_block_bytes() const noexcept { return round_up(master_.chunk_bytes(), 256); }
  [[nodiscard]] std::size_t model_on_device() const noexcept { return device_bytes_ - spare_bytes_; }
  // What the arena holds besides model data: activations and workspaces.
  [[nodiscard]] std::size_t non_model_now() const {
    std::size_t const in_use = arena_->stats().in_use;
    return in_use > model_on_device() ? in_use - model_on_device() : 0;
  }

  void attach_host_zeroed(chunk::chunk& ch) {
    auto* p = static_cast<std::byte*>(host_.allocate(ch.capacity(), 256));
    std::memset(p, 0, ch.capacity());
    ch.attach(p, chunk::tier::host);
  }
  void free_payloads(chunk::chunk_list& list) noexcept {
    for (std::uint32_t c = 0; c < n_; ++c) free_payload(list[c]);
  }
  void free_payload(chunk::chunk& ch) noexcept {
    if (ch.payload() == nullptr) return;
    chunk::tier const where = ch.tier();
    std::byte* p = ch.detach();
    free_block(p, where, ch.capacity());
  }
  void free_block(std::byte* p, chunk::tier where, std::size_t capacity) noexcept {
    if (where == chunk::tier::host) {
      if (!owner_->reclaim_ring_block(p)) host_.deallocate(p, capacity, 256);
      return;
    }
    if (spare_.size() < spare_limit_) {  // kept for reuse; device_bytes_ still counts it
      spare_.push_back(p);
      spare_bytes_ += round_up(capacity, 256);
      return;
    }
    device_bytes_ -= round_up(capacity, 256);
    arena_->deallocate(p, capacity, 256);
  }
  // A device block for a chunk: from the spare pool, or the arena (reclaiming stale blocks, and
  // evicting more if fragmentation refuses a request the accounting allowed, unless !may_evict).
  std::byte* allocate_device(std::size_t capacity, std::size_t t, std::span<std::uint32_t const> protect, bool may_evict = true) {
    for (;;) {
      if (!spare_.empty()) {  // a reclaimed block may have gone there
        std::byte* p = spare_.back();
        spare_.pop_back();
        spare_bytes_ -= round_up(capacity, 256);
        return p;
      }
      try {
        auto* p = static_cast<std::byte*>(arena_->allocate(capacity, 256));
        device_bytes_ += round_up(capacity, 256);
        return p;
      } catch (tide::error const& e) {
        if (e.category() != errc::budget) throw;
        if (reclaim_stale(may_evict)) continue;  // !may_evict: an option, not worth a wait
        auto const victim = may_evict ? owner_->pick_victim(t, protect, untraced) : std::nullopt;
        if (!victim) throw;
        evict(*victim);
      }
    }
  }

  // The compute work issued from now on runs after chunk id's copy in flight. A device backend's
  // compute stream waits for it and this thread goes on (a later settle frees the copy's source);
  // tide::host's compute is this thread, which settles.
  void compute_after(std::uint32_t id) {
    if constexpr (B::is_device)
      if (in_flight_[id] && !ready_[id].query()) return memory::wait(ex_, ready_[id]);
    settle(id);
  }
  // Waits for chunk id's copy in flight, then frees the block it was copied from.
  void settle(std::uint32_t id) {
    if (in_flight_[id]) {
      auto const t0 = std::chrono::steady_clock::now();
      ready_[id].synchronize();
      cur_.stall_ms += ms_since(t0);
      in_flight_[id] = false;
      --copies_in_flight_;
    }
    if (stale_[id] != nullptr) free_block(std::exchange(stale_[id], nullptr), stale_where_[id], chunk_of(id).capacity());
  }
  // A copy of chunk id was issued, ready_[id] recorded after it (and after any earlier one).
  void mark_in_flight(std::uint32_t id) {
    copies_in_flight_ += in_flight_[id] ? 0 : 1;
    in_flight_[id] = true;
  }
  void set_stale(std::uint32_t id, std::byte* p, chunk::tier where) {
    TIDE_ASSERT(stale_[id] == nullptr);
    stale_[id] = p;
    stale_where_[id] = where;
  }
  // Frees device blocks whose copy to the host finished (waiting for one if `wait`). True if
  // device memory was freed.
  bool reclaim_stale(bool wait) {
    for (std::uint32_t id = 0; id < ids_; ++id) {
      if (stale_[id] == nullptr || stale_where_[id] != chunk::tier::device) continue;
      if (!wait && in_flight_[id] && !ready_[id].query()) continue;
      settle(id);
      return true;
    }
    return false;
  }
  // Settles the copies already finished (never blocks); returns the copies still in flight.
  std::size_t refresh_in_flight() {
    for (std::uint32_t id = 0; id < ids_ && copies_in_flight_ > 0; ++id)
      if (in_flight_[id] && ready_[id].query()) settle(id);
    return copies_in_flight_;
  }

  // Copies chunk id to the device (or creates it zero-filled there if it has no payload, or reads
  // it from the NVMe tier's file if its parameters live there: param_on_file).
  // `handover`: a victim's device block to reuse (its copy out is already queued before ours).
  // Chunk id's own copy out in flight (its block taken or freed): on a device backend the fetch
  // queues behind it on the copy stream (a source on a stream of its own waits for that stream).
  void fetch(std::uint32_t id, std::size_t t, std::span<std::uint32_t const> protect, std::byte* handover = nullptr) {
    chunk::chunk& ch = chunk_of(id);
    bool const behind_copy_out = B::is_device && in_flight_[id] && stale_[id] == nullptr;
    if (behind_copy_out) copy_stream_.wait(ready_[id]);
    else settle(id);
    bool const after_copy_stream = handover != nullptr || behind_copy_out;
    owner_->before_fetch(id);
    // A parameter chunk on file comes through a host block of its own, read before the device
    // block is taken (a failed read leaves nothing to give back) and freed once the copy landed.
    std::byte* const from_file = id < n_ && owner_->param_on_file(id) ? owner_->read_param_file(id) : nullptr;
    std::byte* dev = nullptr;
    try {
      dev = handover != nullptr ? handover : allocate_device(ch.capacity(), t, protect);
    } catch (...) {
      if (from_file != nullptr) host_.deallocate(from_file, ch.capacity(), 256);
      throw;
    }
    after_compute();  // the block's last reader may be a kernel still running
    if (from_file != nullptr) {
      copy_span* span = open_span(id, "fetch ", ch.capacity());
      try {
        owner_->fill_chunk(id, dev, from_file, ch.capacity(), after_copy_stream);
      } catch (...) {
        if (handover == nullptr) free_block(dev, chunk::tier::device, ch.capacity());
        host_.deallocate(from_file, ch.capacity(), 256);
        throw;
      }
      close_span(span);
      ch.attach(dev, chunk::tier::device);
      set_stale(id, from_file, chunk::tier::host);  // freed once the copy landed: the file keeps the bytes
      mark_in_flight(id);
      ++cur_.fetches;
      cur_.h2d_bytes += ch.capacity();
    } else if (ch.payload() == nullptr) {
      memory::fill_zeros(ex_, dev, ch.capacity());  // a FREE slot is zero-filled, in compute order
      ch.attach(dev, chunk::tier::device);
      ++cur_.allocations;
    } else {
      // The copy is issued before the chunk lets go of its host block: if it cannot be, the chunk
      // keeps its data and the device block goes back (a handed-over one: to the caller).
      std::byte* const host = ch.payload();
      copy_span* span = open_span(id, "fetch ", ch.capacity());
      try {
        if (id < n_) owner_->fill_chunk(id, dev, host, ch.capacity(), after_copy_stream);  // the source slot
        else engine_.copy_async(dev, host, ch.capacity(), memory::copy_direction::host_to_device, ready_[id]);
      } catch (...) {
        if (handover == nullptr) free_block(dev, chunk::tier::device, ch.capacity());
        throw;
      }
      close_span(span);
      (void)ch.detach();
      ch.attach(dev, chunk::tier::device);
      if (id < n_ && keep_host_copies_ && owner_->holds_parameters(id)) shadow_[id] = host;  // changed by the optimizer only
      else set_stale(id, host, chunk::tier::host);  // freed once the copy landed
      mark_in_flight(id);
      ++cur_.fetches;
      cur_.h2d_bytes += ch.capacity();
    }
    owner_->fetched(id);
  }

  // Copies chunk id to the host (into `into`, a host block of the caller's, or a new one from
  // the pool). Returns its device block, still being read by the copy: the caller either hands it
  // over (the next copy on the stream runs after this one) or leaves it stale until the copy is
  // done. A fetch of id still in flight: a device backend's copy stream waits for it, not the
  // host, and the copy out goes into the block the fetch reads (free once the fetch read it), not
  // into `into` (the caller sees which block the chunk holds).
  std::byte* copy_out(std::uint32_t id, std::byte* into = nullptr) {
    chunk::chunk& ch = chunk_of(id);
    bool const behind_fetch = B::is_device && in_flight_[id] && !(id < n_ && owner_->param_in_file(id)) &&
                              (stale_[id] == nullptr || stale_where_[id] == chunk::tier::host);
    if (behind_fetch) copy_stream_.wait(ready_[id]);
    else settle(id);
    owner_->before_copy_out(id);
    after_compute();  // the block's last writer may be a kernel still running
    if (id < n_ && owner_->param_in_file(id)) {  // clean: the file holds these bytes, nothing to copy
      std::byte* dev = ch.detach();
      ++cur_.clean_drops;
      evicted_bytes_ += ch.capacity();
      owner_->released(id);
      return dev;
    }
    if (id < n_ && shadow_[id] != nullptr) {  // clean: the host copy is current, nothing to copy
      std::byte* dev = ch.detach();
      ch.attach(std::exchange(shadow_[id], nullptr), chunk::tier::host);
      ++cur_.clean_drops;
      evicted_bytes_ += ch.capacity();
      owner_->released(id);
      return dev;
    }
    std::byte* const fetched_from = behind_fetch ? std::exchange(stale_[id], nullptr) : nullptr;
    if (fetched_from != nullptr) into = fetched_from;
    auto* host = into != nullptr ? into : static_cast<std::byte*>(host_.allocate(ch.capacity(), 256));
    std::byte* const dev = ch.payload();
    copy_span* span = open_span(id, "evict ", ch.capacity());
    try {
      engine_.copy_async(host, dev, ch.capacity(), memory::copy_direction::device_to_host, ready_[id]);
    } catch (...) {
      if (into == nullptr) host_.deallocate(host, ch.capacity(), 256);
      stale_[id] = fetched_from;  // the fetch still reads it
      throw;
    }
    close_span(span);
    (void)ch.detach();
    ch.attach(host, chunk::tier::host);
    evicted_bytes_ += ch.capacity();
    if (id < n_) owner_->released(id);
    mark_in_flight(id);
    cur_.d2h_bytes += ch.capacity();
    return dev;
  }
  // Chunk v's stale device block (its copy out may be in flight), taken for chunk id's fetch: a
  // copy into it queues behind that copy on the copy stream (on a device the stream also waits for
  // ready_[v], which a source filling on a stream of its own records); a zero fill runs in
  // compute order, after it. If a wait throws, the block is v's stale block again.
  std::byte* take_stale(std::uint32_t v, std::uint32_t id) {
    std::byte* const block = std::exchange(stale_[v], nullptr);
    try {
      if constexpr (B::is_device) copy_stream_.wait(ready_[v]);
      if (zero_filled(id)) compute_after(v);
    } catch (...) {
      set_stale(v, block, chunk::tier::device);
      throw;
    }
    return block;
  }
  [[nodiscard]] bool zero_filled(std::uint32_t id) {  // fetch(id) zero-fills it in compute order
    return chunk_of(id).payload() == nullptr && !(id < n_ && owner_->param_on_file(id));
  }
  void evict(std::uint32_t id) {
    ++cur_.evictions;
    set_stale(id, copy_out(id), chunk::tier::device);
  }
  // fetch(id) into the block take_stale(victim, id) gave; if the fetch throws, the block is the
  // victim's stale block again (freed once its copy out is done), so nothing leaks.
  void fetch_into(std::uint32_t id, std::size_t t, std::span<std::uint32_t const> protect, std::uint32_t victim,
                  std::byte* block) {
    try {
      fetch(id, t, protect, block);
    } catch (...) {
      set_stale(victim, block, chunk::tier::device);
      throw;
    }
  }
  // The first `bytes` of a chunk to or from host memory, wherever it is: device memory through the
  // backend (a read after the compute work so far, a write in compute order); host memory directly.
  void read_to_host(chunk::chunk const& ch, void* to, std::size_t bytes) {
    if (ch.tier() == chunk::tier::device) memory::read_to_host(ex_, to, ch.payload(), bytes);
    else std::memcpy(to, ch.payload(), bytes);
  }
  void write_from_host(chunk::chunk& ch, void const* from, std::size_t bytes) {
    if (ch.tier() == chunk::tier::device) memory::write_from_host(ex_, ch.payload(), from, bytes);
    else std::memcpy(ch.payload(), from, bytes);
  }
  // A step or evaluation that threw: every tensor to HOLD (each move was whole or not done).
  void abort() noexcept {
    for (std::uint32_t i = 0; i < params_.size(); ++i) {
      if (param_.tensor(i).state != chunk::tensor_state::hold) param_.transition(i, chunk::tensor_state::hold);
      if (grad_.tensor(i).state == chunk::tensor_state::compute) grad_.transition(i, chunk::tensor_state::hold);
    }
  }
  // Parameter chunk c's host copy is (about to be) stale: free it.
  void drop_shadow(std::uint32_t c) {
    if (shadow_[c] == nullptr) return;
    settle(c);  // a copy in flight may still read it
    host_.deallocate(std::exchange(shadow_[c], nullptr), param_[c].capacity(), 256);
  }

  // Copies issued on the copy stream from now on run after the compute work issued so far: a
  // device block a kernel still reads or writes is copied, or refilled, only after it. Free on
  // tide::host, whose kernels have finished when they return.
  void after_compute() {
    if constexpr (B::is_device) {
      memory::record(ex_, computed_);
      copy_stream_.wait(computed_);
    }
  }

  // The activation copy stream and its engine, made at the first call (64 copies in flight: one
  // per saved tensor of a block).
  memory::transfer_engine<B>& activation_engine() {
    if (!activation_engine_) {
      activation_stream_.emplace(memory::options_like(copy_stream_));  // the trainer's device, not the current one
      activation_engine_.emplace(*activation_stream_, memory::transfer_options{.max_in_flight = 64});
    }
    return *activation_engine_;
  }

  // ---- the copy lanes of the timeline ---------------------------------------------------------
  [[nodiscard]] bool tracing() const noexcept { return trace_ != nullptr && trace_->enabled(); }
  using copy_span = detail::copy_span<B>;
  copy_span* open_span(std::uint32_t id, char const* what, std::size_t bytes) {
    if (!tracing()) return nullptr;
    return open_span(tide::detail::concat(what, id < n_ ? "param " : "grad ", id < n_ ? id : id - n_), bytes);
  }
  // A span on the copy lane, or (activations = true, after activation_engine()) on the
  // activation copy lane.
  copy_span* open_span(std::string name, std::size_t bytes, bool activations = false) {
    if (!tracing()) return nullptr;
    return detail::open_span(spans_, trace_, std::move(name), bytes, activations ? lane::activation_copy : lane::copy,
                             activations ? *activation_stream_ : copy_stream_);
  }
  void close_span(copy_span* sp) { detail::close_span(sp); }

  // ---- state: read by the engine that owns the store; written through the moves above, and by
  // the engine where it attaches a block it made (a gradient slot, a ring block, a file read) ----
  Engine* owner_;  // what the store asks (see the top of this file)
  exec<B> ex_;
  memory::device_arena<B>* arena_;
  parameter_list params_;
  block_uses uses_;
  chunk::chunk_layout layout_;
  chunk::chunk_list param_, grad_, master_;
  std::vector<chunk::chunk_list> state_;  // the optimizer's fp32 lists (Adam: m, v)
  std::vector<chunk::chunk_list> extra_;  // the lists the gradient sink declared (a residual)
  memory::pinned_pool<B> host_;
  memory::stream<B> copy_stream_;
  memory::transfer_engine<B> engine_;
  // A model's offloaded activations move on a stream of their own: behind the chunk prefetches
  // on the copy stream, a block's activations coming back made its backward wait (-7 % tokens/s
  // in the chunked demo). Made at first use (activation_engine()): most models offload nothing.
  std::optional<memory::stream<B>> activation_stream_;
  std::optional<memory::transfer_engine<B>> activation_engine_;
  chunk_shard shard_;      // the chunks whose master and optimizer state this rank keeps
  std::uint32_t n_ = 0;    // chunks per list
  std::uint32_t ids_ = 0;  // trace ids: 2 n

  std::vector<memory::event<B>> ready_;  // by id: the last copy into its payload
  memory::event<B> computed_;            // after_compute(): the compute work before a copy
  std::vector<std::byte*> stale_;        // by id: the block its last copy came from, freed when done
  std::vector<chunk::tier> stale_where_;
  // By parameter chunk: the host block a device-resident parameter chunk was fetched from, kept
  // while the device copy is unchanged (clean), so evicting it needs no copy back.
  std::vector<std::byte*> shadow_;
  std::vector<bool> in_flight_;
  bool keep_host_copies_ = true;  // scheduler_options::keep_host_copies
  std::size_t copies_in_flight_ = 0;
  std::vector<std::byte*> spare_;  // device blocks kept for reuse (keep_spare_blocks)
  std::size_t spare_limit_ = 0, spare_bytes_ = 0;
  std::size_t device_bytes_ = 0;   // model data on the device (payloads, stale blocks, spares, state)
  std::size_t evicted_bytes_ = 0;  // bytes that left the device (copied or dropped clean), ever
  offload_stats cur_{};            // the step in progress
  trace_recorder* trace_ = nullptr;
  std::deque<copy_span> spans_;    // stable addresses: the copy streams hold pointers into them
};

}  // namespace tide::offload::detail
