#pragma once
// transfer_engine<cuda>: the engine of transfer_engine.hpp over a CUDA copy stream. A copy is
// cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault) between device memory and pinned host
// memory (pinned_pool), timed by two cudaEvents around it; back-pressure synchronizes the
// oldest copy's end event.
//
//   tide::memory::device_streams<tide::cuda> s;
//   tide::memory::transfer_engine<tide::cuda> engine{s.copy};
//   engine.copy_async(dev, pinned, bytes, tide::memory::copy_direction::host_to_device, ready);

#include <cstddef>

#include "tide/memory/stream.cuh"
#include "tide/memory/transfer_engine.hpp"

namespace tide::memory::detail {

template <>
class copy_path<cuda> {
 public:
  copy_path(transfer_options const&, std::size_t) {}
  void check_caller(stream<cuda> const&) const noexcept {}
  void issue(stream<cuda>& s, std::size_t, void* dst, void const* src, std::size_t bytes) { s.copy(dst, src, bytes); }
};

}  // namespace tide::memory::detail
