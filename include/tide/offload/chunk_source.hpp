#pragma once
// The chunk-source slot of the offload engine: where a parameter chunk's bytes come from when it
// is fetched to the device (FREE or host-resident -> HOLD on the device), and who is told when it
// leaves again. The default copies from this process's host tier on the engine's copy stream.
// A fetch is timed by the copies in flight and the optimizer, so it differs from rank to rank: a
// source must not start collectives (ZeRO-3 gathers at the block hooks, through the gradient sink:
// offload/gradient_sink.hpp).
//
//   struct my_source {
//     template <Backend B> void fill(fill_request<B> const& r) {
//       // after *r.block_free, if set: read r.host, write r.bytes into r.device; record *r.ready
//     }
//     void released(std::uint32_t chunk) noexcept {}   // the chunk left the device
//   };
//
// fill must record r.ready on the stream that writes the block (the engine waits for it before
// the chunk is used, and before the host copy may be freed). If fill throws, nothing was recorded:
// the chunk keeps its host block and the device block goes back (acquire before detach).

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "tide/core/backend.hpp"
#include "tide/memory/stream.hpp"
#include "tide/memory/transfer_engine.hpp"

namespace tide::offload {

template <Backend B>
struct fill_request {
  std::uint32_t chunk = 0;                       // the parameter chunk
  std::byte* device = nullptr;                   // the device block to fill
  std::byte const* host = nullptr;               // this process's copy of the chunk
  std::size_t bytes = 0;
  memory::transfer_engine<B>* copies = nullptr;  // the engine's copy lane
  memory::stream<B>* copy_stream = nullptr;      // the stream `copies` issues on
  // Reads of `host` and writes to `device` wait for this, if set: the copy stream's work so far (a
  // handed-over block's copy out, or this chunk's own copy out, which writes `host`).
  memory::event<B> const* block_free = nullptr;
  memory::event<B>* ready = nullptr;             // record when `device` holds the chunk
};

template <class S>
concept ChunkSource = requires(S& s, fill_request<host> const& r, std::uint32_t c) {
  s.fill(r);
  { s.released(c) } noexcept;
};

template <class S>
consteval bool check_chunk_source() {
  static_assert(requires(S& s, fill_request<host> const& r) { s.fill(r); },
                "ChunkSource: S needs `template <Backend B> void fill(fill_request<B> const&)`: write the chunk "
                "into r.device and record r.ready");
  static_assert(requires(S& s, std::uint32_t c) { { s.released(c) } noexcept; },
                "ChunkSource: S needs `void released(std::uint32_t chunk) noexcept`, told when a chunk left the "
                "device");
  return ChunkSource<S>;
}

// The default: a copy from this process's host tier on the engine's copy stream (ordered after
// whatever the stream did with the block before).
struct host_source {
  template <Backend B>
  void fill(fill_request<B> const& r) const {
    r.copies->copy_async(r.device, r.host, r.bytes, memory::copy_direction::host_to_device, *r.ready);
  }
  void released(std::uint32_t) const noexcept {}
};
static_assert(check_chunk_source<host_source>());

}  // namespace tide::offload
