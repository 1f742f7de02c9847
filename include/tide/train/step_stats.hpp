#pragma once
// tide::train::step_stats: what one trainer step did, as trainer::step returns it and the
// reports (train/report.hpp) print it, apart from the trainer that makes it.

#include <cstddef>
#include <cstdint>

#include "tide/offload/stats.hpp"

namespace tide::train {

// What one step did.
struct step_stats {
  std::int64_t step = 0;        // 1-based
  float loss = 0;               // mean over the micro-batches
  std::size_t tokens = 0;       // trained on in this step
  double seconds = 0;
  double tokens_per_s = 0;
  float lr = 0;
  double grad_norm = -1;        // of the mean gradient; -1 when not measured (no clipping, no scaling)
  float loss_scale = 1;
  bool skipped = false;         // non-finite gradients: nothing was updated
  std::size_t device_bytes = 0; // arena peak in the step (model data + activations)
  std::size_t host_bytes = 0;   // model data on the host at the end of the step
  std::size_t bytes_moved = 0;  // host <-> device
  double stall_ms = 0;
  std::size_t bytes_reduced = 0; // gradient bytes this rank summed over the ranks in the step (data parallelism;
                                 // compressed: the bytes it sent)
  double bubble_fraction = -1;  // a pipelined step's, measured on this rank's stage: idle over the forward and
                                // backward's wall time; -1 without a pipeline
  offload::offload_stats offload{};
};

}  // namespace tide::train
