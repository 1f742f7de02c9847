#pragma once
// What an offload scheduler reports per step: bytes moved each way, evictions, prefetch hits,
// stall time, device peak, chunk utilisation, and the memory tide (device bytes per moment:
// chunks, non-model data, the budget) that docs/offload.md draws.

#include <cstddef>
#include <string>
#include <vector>

#include "tide/chunk/memory_tracer.hpp"
#include "tide/core/error.hpp"

namespace tide::offload {

// Device bytes at one moment of a step (a point of the memory tide).
struct tide_sample {
  chunk::moment at{};
  std::size_t model_bytes = 0;      // chunks (and optimizer state) on the device
  std::size_t non_model_bytes = 0;  // everything else the arena holds: activations, workspaces
  std::size_t budget = 0;           // the device budget
  std::size_t fetched_bytes = 0;    // copied host -> device while the moment was made resident (and prefetched)
  std::size_t evicted_bytes = 0;    // left the device at the moment: copied to the host, or dropped when clean
};

struct offload_stats {
  std::size_t step = 0;              // 1-based number of the step these figures are of
  std::size_t h2d_bytes = 0;         // host -> device
  std::size_t d2h_bytes = 0;         // device -> host
  std::size_t fetches = 0;           // chunk copies host -> device (demand and prefetch)
  std::size_t evictions = 0;         // chunks leaving the device to make room (copied, or dropped when clean)
  std::size_t clean_drops = 0;       // parameter chunks left the device without a copy: the host copy was current
  std::size_t prefetches = 0;        // fetches issued ahead of the moment that needs them
  std::size_t prefetch_hits = 0;     // moments' chunks that were already on the device or on their way
  std::size_t demand_fetches = 0;    // moments' chunks fetched when the moment began (a miss)
  std::size_t allocations = 0;       // chunks created zero-filled on the device (gradients), no copy
  // ZeRO-3: other ranks' parameter chunks this rank received, straight into device blocks (a
  // device backend whose sink gathers there, with room in the budget), or into host blocks (then
  // fetched as any host chunk, in h2d_bytes).
  std::size_t gathered_device_bytes = 0;
  std::size_t gathered_host_bytes = 0;
  double stall_ms = 0;               // compute waiting for copies and optimizer steps
  double optimizer_ms = 0;           // optimizer time (host steps run beside backward)
  std::size_t host_optimizer_chunks = 0;    // chunks stepped by the host optimizer
  std::size_t device_optimizer_chunks = 0;  // chunks stepped where their state is on the device
  std::size_t peak_device_bytes = 0;        // arena peak during the step
  std::size_t device_model_bytes = 0;       // model data on the device at the end of the step
  std::size_t host_model_bytes = 0;         // model data on the host at the end of the step
  // Model data held at once, host and device, at the most (sampled at every block hook): every
  // chunk's payload, the host copies of device-resident parameter chunks, and the blocks a copy
  // or an update still reads before they are freed. Not the undo journal or the NVMe staging.
  std::size_t peak_model_bytes = 0;
  double chunk_utilisation = 0;             // tensor bytes / chunk bytes over every chunk list
  std::size_t moments = 0;
  bool warm_up = false;                     // true for a step that recorded the trace
  std::size_t nvme_read_bytes = 0;          // model data read from the spill files (host_budget)
  std::size_t nvme_write_bytes = 0;         // model data written to them
  std::size_t nvme_early_reads = 0;         // reads started ahead: state (backward, deferred updates), parameters (prefetch)
  std::size_t activation_d2h_bytes = 0;     // the model's offloaded activations, to the host (offload::hooks)
  std::size_t activation_h2d_bytes = 0;     // and back (not in h2d_bytes / d2h_bytes, which are model data)
  // undo_on_error: the values before each update the journal copied (in the optimizer's pass, or
  // before it), and the bytes it kept by swapping blocks with the chunks instead (no copy: host
  // steps of an out-of-place optimizer).
  std::size_t undo_copy_bytes = 0;
  std::size_t undo_swapped_bytes = 0;
  [[nodiscard]] std::size_t bytes_moved() const noexcept { return h2d_bytes + d2h_bytes; }
};

// One JSON object (no newline).
inline std::string to_json(offload_stats const& s) {
  return tide::detail::concat(
      "{\"step\":", s.step, ",\"h2d_bytes\":", s.h2d_bytes, ",\"d2h_bytes\":", s.d2h_bytes, ",\"fetches\":", s.fetches,
      ",\"evictions\":", s.evictions, ",\"clean_drops\":", s.clean_drops, ",\"prefetches\":", s.prefetches, ",\"prefetch_hits\":", s.prefetch_hits,
      ",\"demand_fetches\":", s.demand_fetches, ",\"allocations\":", s.allocations,
      ",\"gathered_device_bytes\":", s.gathered_device_bytes, ",\"gathered_host_bytes\":", s.gathered_host_bytes, ",\"stall_ms\":", s.stall_ms,
      ",\"optimizer_ms\":", s.optimizer_ms, ",\"host_optimizer_chunks\":", s.host_optimizer_chunks,
      ",\"device_optimizer_chunks\":", s.device_optimizer_chunks, ",\"peak_device_bytes\":", s.peak_device_bytes,
      ",\"device_model_bytes\":", s.device_model_bytes, ",\"host_model_bytes\":", s.host_model_bytes,
      ",\"peak_model_bytes\":", s.peak_model_bytes,
      ",\"chunk_utilisation\":", s.chunk_utilisation, ",\"moments\":", s.moments,
      ",\"warm_up\":", s.warm_up ? "true" : "false", ",\"nvme_read_bytes\":", s.nvme_read_bytes,
      ",\"nvme_write_bytes\":", s.nvme_write_bytes, ",\"nvme_early_reads\":", s.nvme_early_reads,
      ",\"activation_d2h_bytes\":", s.activation_d2h_bytes, ",\"activation_h2d_bytes\":", s.activation_h2d_bytes,
      ",\"undo_copy_bytes\":", s.undo_copy_bytes, ",\"undo_swapped_bytes\":", s.undo_swapped_bytes, "}");
}

}  // namespace tide::offload
