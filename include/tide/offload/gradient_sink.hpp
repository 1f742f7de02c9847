#pragma once
// The gradient-sink slot of the offload engine: where data parallelism and gradient compression
// plug in. When a chunk's gradients are complete (after the backward pass that completes them,
// and after the last micro-step), the engine moves its tensors to READY_FOR_REDUCE and hands the
// chunk to the sink. The sink may finish on its own stream: it records `done` and returns true,
// and that chunk's optimizer step waits for the event (the engine waits on an event, not a
// barrier: other chunks go on). A sink that finished before returning returns false.
//
//   struct all_reduce_sink {                              // a sink a comm policy would provide
//     template <Backend B, class T>
//     bool reduce(ready_chunk<B, T> const& r) {
//       stream.wait(*r.valid_after) if set; enqueue the all-reduce of r.grads on stream;
//       r.done->record(stream); return true;
//     }
//   };
//
// A sink that holds a chunk back to send it with later ones (a bucket) must not wait past
// `ends_block`: the engine may copy that chunk's gradients out, which waits for `done`, before
// backward completes any other chunk.
//
// The span is the chunk's whole gradient payload (padding included: zero, and it must stay
// zero), on `tier`, valid after `valid_after` (null: valid now; the host backend computes on the
// calling thread). It stays valid and unmoved until `done` completes. On a device backend a sink
// gets a host copy of a device chunk (ready_chunk<host, T>), which goes back once it is done,
// unless it declares `static constexpr bool reads_device = true` (detail/sink_lane.hpp). Gradients are in the
// model's element type, unscaled: the optimizer applies grad_scale afterwards, so a sink that
// scales (averaging over ranks) composes with clipping and loss scaling.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "tide/chunk/chunk.hpp"
#include "tide/chunk/layout.hpp"
#include "tide/core/backend.hpp"
#include "tide/core/dtype.hpp"
#include "tide/memory/stream.hpp"
#include "tide/offload/trace_events.hpp"

namespace tide::offload {

// A per-chunk list a sink keeps between steps (an error-feedback residual): the engine allocates
// it zeroed, one chunk per parameter chunk, keeps it where the chunk's optimizer state lives,
// undoes it with a failed step and saves it in checkpoints as "<name>/<parameter>". A sink
// declares its lists as `static constexpr std::array<tide::offload::extra_list, K> lists`.
struct extra_list {
  std::string_view name;    // the checkpoint section prefix: letters, digits, '_'
  dtype type = dtype::f32;  // of each element (one per parameter element)
  // The same on every rank (PowerSGD's Q). Otherwise each rank's own (a residual): loaded on
  // another rank count, a checkpoint set re-shards it so that its sum over the ranks is kept
  // (train/trainer.hpp).
  bool shared = false;
};
inline constexpr std::size_t max_extra_lists = 2;
// Optimizer state lists the engine keeps per chunk at most (any optimizer's, named by it): the
// NVMe tier's file holds them and the fp32 masters, 8 lists a chunk.
inline constexpr std::size_t max_state_lists = 7;

// The lists a sink declares (none if it has no `lists`).
template <class S>
constexpr std::span<extra_list const> extra_lists_of() noexcept {
  if constexpr (requires { S::lists; }) return std::span<extra_list const>(S::lists);
  else return {};
}

template <Backend B, class T>
struct ready_chunk {
  std::uint32_t chunk = 0;                          // its index in the chunk lists
  std::span<T> grads;                               // the whole gradient chunk
  chunk::tier tier = chunk::tier::host;             // where grads live
  memory::event<B> const* valid_after = nullptr;    // grads are complete once this completes (null: now)
  memory::event<B>* done = nullptr;                 // record here when finishing later (and return true)
  std::int64_t step = 1;                            // the optimizer step (1-based) these gradients are for
  bool ends_block = false;                          // the last chunk this block's backward completes: backward
                                                    // goes on (and may evict gradients) after it
  bool last = false;                                // no other chunk reaches the sink in this step
  std::array<std::span<std::byte>, max_extra_lists> lists{};  // this chunk of each declared list, on `tier`'s side
  trace_recorder* trace = nullptr;                  // the step's timeline when tracing (lane::comm is the sink's)
};

template <class S, class B, class T>
concept GradientSinkFor = requires(S& s, ready_chunk<B, T> const& r) {
  { s.reduce(r) } -> std::same_as<bool>;
};

// Checked for every element type tide trains in, on the host backend.
template <class S>
concept GradientSink = GradientSinkFor<S, host, float> && GradientSinkFor<S, host, bf16> &&
                       GradientSinkFor<S, host, f16>;

template <class S>
consteval bool check_gradient_sink() {
  if constexpr (requires { S::lists; })
    static_assert(extra_lists_of<S>().size() <= max_extra_lists,
                  "GradientSink: a sink declares at most 2 extra lists (static constexpr std::array<extra_list, K> "
                  "lists, K <= 2)");
  static_assert(GradientSinkFor<S, host, float>,
                "GradientSink: S needs `template <Backend B, class T> bool reduce(ready_chunk<B, T> const&)`: "
                "finish with the chunk's gradients, or record ready_chunk::done and return true to finish later");
  return GradientSink<S>;
}

// Which chunks this rank keeps optimizer state for and steps, under ZeRO: PatrickStar's chunk
// groups, `ranks` consecutive chunks to a group, chunk g * ranks + r on rank r.
struct chunk_shard {
  int rank = 0;
  int ranks = 1;
  [[nodiscard]] constexpr bool owns(std::uint32_t c) const noexcept {
    return static_cast<int>(c % static_cast<std::uint32_t>(ranks)) == rank;
  }
  [[nodiscard]] constexpr int owner(std::uint32_t c) const noexcept {
    return static_cast<int>(c % static_cast<std::uint32_t>(ranks));
  }
};

// A sink that shards the optimizer state over ranks (ZeRO stages 1 and 2) says so with shard(),
// and brings every chunk's parameters from the rank that stepped them once the step's updates are
// done:
//
//   tide::offload::chunk_shard shard() const noexcept;
//   template <class T> void share_parameters(std::span<std::span<T> const> chunks);  // every chunk, in order
//
// The engine then keeps no master and no optimizer state for the chunks it does not step (its
// host bytes per parameter fall as the ranks grow), frees their gradients once the sink is done
// with them, and calls share_parameters after the last update of every applied step with each
// parameter chunk's whole payload (host-writable: on a device backend a host copy, written back
// after; a sink that reads_device gets the payloads where they are, and if it takes a second
// argument, `std::span<chunk::tier const>`, where each one lies). A failure there fails the step:
// the engine puts back what it overwrote.
template <class S>
concept ShardingSink = requires(S const& s) {
  { s.shard() } noexcept -> std::same_as<chunk_shard>;
};

// This rank's shard: everything, for a sink that does not shard.
template <class S>
constexpr chunk_shard shard_of(S const& s) noexcept {
  if constexpr (ShardingSink<S>) return s.shard();
  else return {};
}

// ZeRO-3: a sharding sink that also shards the parameters. A rank then keeps its own chunks'
// parameters only; the engine brings another rank's chunk in, from its owner, before the block
// that uses it (at the block hooks, which every rank runs in the same order), and frees it once a
// block that does not use it begins:
//
//   bool shards_parameters() const noexcept;
//   template <class T> void gather_async(std::uint32_t chunk, std::span<T> bytes);  // from owner(chunk)
//   void wait_gathered();   // every gather started has landed (tide::error if one failed)
//
// gather_async returns at once: on the owner `bytes` is what it sends, elsewhere where the chunk
// lands; both stay untouched until wait_gathered returned. Every rank starts the same gathers in
// the same order, so a sink runs them in call order on a communicator of their own (not the one
// its gradient reductions use from another thread).
template <class S>
concept ParameterShardingSink =
    ShardingSink<S> && requires(S& s, S const& cs, std::span<float> f, std::span<bf16> h, std::span<f16> q) {
      { cs.shards_parameters() } noexcept -> std::same_as<bool>;
      s.gather_async(std::uint32_t{0}, f);
      s.gather_async(std::uint32_t{0}, h);
      s.gather_async(std::uint32_t{0}, q);
      s.wait_gathered();
    };

// On a device backend B, a ZeRO-3 sink whose communicator reads and writes B's memory (comm::nccl)
// may take a gather straight into a device block, so the chunk needs no copy to the device:
//
//   template <class T>
//   void gather_into_device(std::uint32_t chunk, std::span<T> block, memory::event<B> const& valid_after);
//
// `block` is device memory, written (elsewhere) or read (on the owner) only after `valid_after`
// (the compute work that last used the block, and on the owner the copy of its chunk into it).
// wait_gathered covers these gathers too. If gather_into_device or wait_gathered throws, the sink
// no longer touches the blocks (its communicator ended and its stream drained): the engine frees
// them. The engine gathers into device memory where the moment's budget has room, into host
// blocks through gather_async otherwise.
template <class S, class B>
concept DeviceGatheringSink =
    ParameterShardingSink<S> && B::is_device &&
    requires(S& s, std::span<float> f, std::span<bf16> h, std::span<f16> q, memory::event<B> const& e) {
      s.gather_into_device(std::uint32_t{0}, f, e);
      s.gather_into_device(std::uint32_t{0}, h, e);
      s.gather_into_device(std::uint32_t{0}, q, e);
    };

template <class S>
constexpr bool shards_parameters_of(S const& s) noexcept {
  if constexpr (ParameterShardingSink<S>) return s.shards_parameters();
  else return false;
}

// A sink that needs to know where each tensor lies in its chunk (PowerSGD compresses each matrix
// on its own) says so with
//
//   void bind_layout(chunk::chunk_layout const&, std::span<parameter const>);
//
// which the engine calls once, at construction, with the layout of every chunk list and the
// parameters in registration order: parameter i sits at element layout.offset_of[i] of chunk
// layout.chunk_of[i] in every list, ready_chunk::grads included.
template <class S>
concept LayoutAwareSink = requires(S& s, chunk::chunk_layout const& l, std::span<parameter const> p) {
  s.bind_layout(l, p);
};

// A sink whose work can fail and be retried says so with
//
//   void abandon_step() noexcept;
//
// which the engine calls when it abandons a step (scheduler::abort_step), once the sink's work on
// every chunk handed over in that step has ended. Every rank abandons the failed step, so a sink
// that stopped its work at a failure can start afresh there, in step with the other ranks.
template <class S>
concept StepAbandoningSink = requires(S& s) {
  { s.abandon_step() } noexcept;
};

// The default: gradients stay as backward left them.
struct no_sink {
  template <Backend B, class T>
  constexpr bool reduce(ready_chunk<B, T> const&) const noexcept {
    return false;
  }
};
static_assert(check_gradient_sink<no_sink>());

}  // namespace tide::offload
