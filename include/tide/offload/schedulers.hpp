#pragma once
// The scheduler policies tide ships, each a SchedulerPolicy (offload/scheduler_policy.hpp) an
// offload engine scheduler<B, T, Policy, Optimizer, Sink> (offload/scheduler.hpp) is built with:
//
//   resident{}                  everything on the device (the baseline every other one must match)
//   chunked<belady>{...}        PatrickStar: chunks move between device and host as the warm-up
//                               trace says; eviction by the policy (belady, lru, fifo); prefetch;
//                               optimizer state on the device where the warm-up left room
//   layer_window<W>{...}        STRONGHOLD: one chunk per layer; W layers on the device, the next
//                               ones prefetched while a layer computes; W = 0: chosen from the
//                               warm-up's compute and copy times
//   static_partition{...}       ZeRO-Offload: parameters stay on the device, gradients go to the
//                               host as soon as they are complete, optimizer state lives on the host
//
// Each is a handful of decisions; the mechanics they share are the engine's.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "tide/chunk/layout.hpp"
#include "tide/chunk/memory_tracer.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parameters.hpp"
#include "tide/offload/policy.hpp"
#include "tide/offload/scheduler_options.hpp"
#include "tide/offload/scheduler_policy.hpp"

namespace tide::offload {

// Chunks of chunk_bytes, or (0) of the size search_chunk_size picks so that two chunks take at
// most a quarter of the budget: how chunked, static_partition and resident pack.
inline chunk::chunk_layout pack_for_budget(parameter_list const& params, std::size_t chunk_bytes, std::size_t budget,
                                           std::size_t element_bytes) {
  std::size_t const align_elems = 256 / element_bytes;
  if (chunk_bytes != 0) return chunk::pack(params, round_up(chunk_bytes, 256) / element_bytes, align_elems);
  return chunk::search_chunk_size(params, {.element_bytes = sizeof(float), .two_chunk_budget = budget / 4,
                                           .alignment_elements = align_elems})
      .layout;
}

namespace detail {
inline std::string non_model_text(std::size_t non_model) {
  return tide::detail::concat("non-model ", bytes_of{non_model}, " (activations, workspaces)");
}
// The budget of a traced moment for policies that follow the trace: nothing movable in the warm-up.
inline std::size_t traced_budget(policy_context const& ctx, chunk::memory_tracer const& tracer, std::size_t t) {
  return ctx.recording ? 0 : tracer.chunk_budget(t);
}
}  // namespace detail

// device_budget 0: make_trainer sizes the arena (all model data plus 1 GiB for activations).
struct resident {
  std::size_t device_budget = 0;
  std::size_t chunk_bytes = 0;  // 0: one chunk size from the search (only the layout; nothing moves)
  belady policy{};              // never asked: nothing is evicted
  memory_options memory{};      // host-side knobs, passed on by make_trainer (offload/scheduler_options.hpp)
  static constexpr bool moves_data = false;

  static std::string name() { return "resident"; }
  [[nodiscard]] chunk::chunk_layout layout(parameter_list const& params, block_uses const&, std::size_t budget,
                                           std::size_t element_bytes) const {
    return pack_for_budget(params, chunk_bytes, budget, element_bytes);
  }
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return 0; }
  [[nodiscard]] minimum_parts minimum(policy_context const& c, std::size_t non_model) const {
    std::size_t const model = 2 * c.chunks * c.block_bytes + c.state_lists * c.chunks * c.state_block_bytes;
    return {non_model + model,
            tide::detail::concat(detail::non_model_text(non_model), " + all model data ", bytes_of{model}, " (",
                                 c.chunks, " chunks each of parameters, gradients and ", c.state_lists,
                                 " fp32 state lists)"),
            ", or offload (chunked<belady>)"};
  }
  [[nodiscard]] std::size_t chunk_budget(policy_context const&, chunk::memory_tracer const&, std::size_t) const {
    return std::numeric_limits<std::size_t>::max();
  }
  [[nodiscard]] int prefetch_depth(policy_context const&) const noexcept { return 0; }
  [[nodiscard]] int max_in_flight() const noexcept { return 4; }
  template <class Engine>
  void place(Engine& e) {
    e.pin_parameters();
    e.place_state_on_device(std::numeric_limits<std::uint32_t>::max(), true);
  }
  template <class Engine>
  void after_warm_up(Engine&, policy_context const&) {}
  template <class Engine>
  void after_step(Engine&) {}
};

template <class Policy = belady>
struct chunked {
  static_assert(EvictionPolicy<Policy>,
                "chunked<Policy>: Policy must satisfy tide::offload::EvictionPolicy: reset(trace), on_fetch(chunk, "
                "tick), on_use(chunk, tick), victim(candidates, moment) -> std::uint32_t and a static `name` "
                "(tide::offload::belady, lru and fifo do)");
  std::size_t device_budget = 0;
  std::size_t chunk_bytes = 0;  // 0: searched so that two chunks take at most a quarter of the budget
  std::size_t reserved = 0;     // device bytes kept out of the chunk budget
  int prefetch_moments = 0;     // how many moments ahead chunks are fetched; 0: as far as the budget allows
  int max_in_flight_copies = 4; // the prefetch stops with this many copies outstanding (of any kind)
  Policy policy{};
  // Host-side knobs, passed on by make_trainer (offload/scheduler_options.hpp), the NVMe tier
  // among them: past memory.host_budget of model data kept between steps, the optimizer state of
  // the last chunks (with bf16 / f16 their fp32 masters too, unless reuse_grad_slots) lives in a
  // file under memory.spill_folder, and past every chunk's state the last parameter chunks too.
  memory_options memory{};
  static constexpr bool moves_data = true;
  static constexpr bool nvme_tier = true;

  static std::string name() { return tide::detail::concat("chunked<", Policy::name, ">"); }
  [[nodiscard]] chunk::chunk_layout layout(parameter_list const& params, block_uses const&, std::size_t budget,
                                           std::size_t element_bytes) const {
    return pack_for_budget(params, chunk_bytes, budget, element_bytes);
  }
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved; }
  [[nodiscard]] minimum_parts minimum(policy_context const& c, std::size_t non_model) const {
    return {non_model + c.working_set * c.block_bytes + reserved,
            tide::detail::concat(detail::non_model_text(non_model), " + the working set ", c.working_set, " chunks x ",
                                 bytes_of{c.block_bytes}, " (the most chunks one moment touches: ",
                                 c.working_set_moment, ") + reserved ", bytes_of{reserved}),
            ", or use smaller chunks / a smaller batch"};
  }
  [[nodiscard]] std::size_t chunk_budget(policy_context const& c, chunk::memory_tracer const& tr,
                                         std::size_t t) const {
    return detail::traced_budget(c, tr, t);
  }
  [[nodiscard]] int prefetch_depth(policy_context const& c) const noexcept {
    return prefetch_moments > 0 ? prefetch_moments : static_cast<int>(c.moments);
  }
  [[nodiscard]] int max_in_flight() const noexcept { return max_in_flight_copies; }
  template <class Engine>
  void place(Engine&) {}
  // Optimizer state on the device for as many chunks as the warm-up's margin holds: those steps
  // then run on the device, with no copies.
  template <class Engine>
  void after_warm_up(Engine& e, policy_context const& c) {
    std::size_t const taken = c.peak_non_model + reserved + 2 * c.chunks * c.block_bytes;
    if (c.budget <= taken || c.state_lists == 0) return;
    std::size_t const fit = (c.budget - taken) / (c.state_lists * c.state_block_bytes);
    e.place_state_on_device(static_cast<std::uint32_t>(std::min<std::size_t>(fit, c.chunks)), false);
  }
  template <class Engine>
  void after_step(Engine&) {}
};

// W layers resident (W >= 2), or W = 0: chosen after the warm-up step as
// ceil(copy time of a layer / compute time of a layer) + 1, at least 2, at most what the budget holds.
template <int W = 0>
struct layer_window {
  static_assert(W == 0 || W >= 2, "layer_window<W>: the window needs at least 2 layers (one computing, one "
                                  "arriving); pass W >= 2, or W = 0 to choose it from measured times");
  static constexpr int window = W;
  std::size_t device_budget = 0;
  std::size_t reserved = 0;
  int max_in_flight_copies = 4;
  belady policy{};  // a layer outside the window: the one used furthest ahead leaves
  int chosen = 0;   // the window in use: set at the first moment, chosen again after the warm-up (W = 0)
  memory_options memory{};  // host-side knobs, passed on by make_trainer (offload/scheduler_options.hpp)
  static constexpr bool moves_data = true;

  static std::string name() {
    return W == 0 ? std::string("layer_window<auto>") : tide::detail::concat("layer_window<", W, ">");
  }
  // One layer per chunk: the chunk is the largest layer block (of every layer in the list: a
  // pipeline stage's list holds the tied wte of a layer outside its blocks).
  [[nodiscard]] chunk::chunk_layout layout(parameter_list const& params, block_uses const&, std::size_t,
                                           std::size_t element_bytes) const {
    std::size_t const align_elems = 256 / element_bytes;
    std::size_t largest = 0;
    for (parameter const& p : params)
      largest = std::max(largest, round_up(params.layer_bytes(p.layer).bytes, 256) / element_bytes + align_elems);
    return chunk::pack(params, round_up(largest, align_elems), align_elems, chunk::pack_mode::one_layer_per_chunk);
  }
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved; }
  [[nodiscard]] static constexpr int smallest() noexcept { return W == 0 ? 2 : W; }
  [[nodiscard]] minimum_parts minimum(policy_context const& c, std::size_t non_model) const {
    return {non_model + 2 * static_cast<std::size_t>(smallest()) * c.block_bytes + reserved,
            tide::detail::concat(detail::non_model_text(non_model), " + a window of ", smallest(),
                                 " layers x 2 chunks (parameters and gradients) x ", bytes_of{c.block_bytes},
                                 " + reserved ", bytes_of{reserved}),
            ", or use smaller chunks / a smaller batch"};
  }
  [[nodiscard]] std::size_t chunk_budget(policy_context const& c, chunk::memory_tracer const&, std::size_t) const {
    return 2 * static_cast<std::size_t>(chosen == 0 ? smallest() : chosen) * c.block_bytes + c.pinned_bytes;
  }
  [[nodiscard]] int prefetch_depth(policy_context const&) const noexcept { return std::max(1, chosen - 1); }
  [[nodiscard]] int max_in_flight() const noexcept { return max_in_flight_copies; }
  // The warm-up runs with the smallest window; its device blocks are reused (STRONGHOLD's pool).
  template <class Engine>
  void place(Engine& e) {
    chosen = smallest();
    e.keep_spare_blocks(2 * static_cast<std::size_t>(chosen));
  }
  template <class Engine>
  void after_warm_up(Engine& e, policy_context const& c) {
    if constexpr (W == 0) {
      std::size_t const taken = c.peak_non_model + reserved;
      int const fit = static_cast<int>((c.budget > taken ? c.budget - taken : 0) / (2 * c.block_bytes));
      int const w = static_cast<int>(std::ceil(c.copy_ms / std::max(c.forward_ms, 1e-6))) + 1;
      chosen = std::clamp(w, 2, std::max(2, fit));
    } else {
      chosen = W;
    }
    e.keep_spare_blocks(2 * static_cast<std::size_t>(chosen));
  }
  template <class Engine>
  void after_step(Engine&) {}
};

struct static_partition {
  std::size_t device_budget = 0;
  std::size_t chunk_bytes = 0;  // 0: searched as for chunked
  std::size_t reserved = 0;
  belady policy{};              // gradient chunks over the budget: the one used furthest ahead leaves
  memory_options memory{};      // host-side knobs, passed on by make_trainer (offload/scheduler_options.hpp)
  static constexpr bool moves_data = true;

  static std::string name() { return "static_partition"; }
  [[nodiscard]] chunk::chunk_layout layout(parameter_list const& params, block_uses const&, std::size_t budget,
                                           std::size_t element_bytes) const {
    return pack_for_budget(params, chunk_bytes, budget, element_bytes);
  }
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved; }
  [[nodiscard]] minimum_parts minimum(policy_context const& c, std::size_t non_model) const {
    std::size_t const params = c.chunks * c.block_bytes, grads = c.grads_per_moment * c.block_bytes;
    return {non_model + params + grads + reserved,
            tide::detail::concat(detail::non_model_text(non_model), " + every parameter chunk ", bytes_of{params},
                                 " (", c.chunks, " x ", bytes_of{c.block_bytes}, ") + the gradient chunks of one block ",
                                 bytes_of{grads}, " + reserved ", bytes_of{reserved}),
            ", or use smaller chunks / a smaller batch"};
  }
  [[nodiscard]] std::size_t chunk_budget(policy_context const& c, chunk::memory_tracer const& tr,
                                         std::size_t t) const {
    return detail::traced_budget(c, tr, t);
  }
  [[nodiscard]] int prefetch_depth(policy_context const&) const noexcept { return 0; }
  [[nodiscard]] int max_in_flight() const noexcept { return 4; }
  // Parameters pinned on the device: at the first moment, after each step's host updates (which
  // took them to the host), and after a failed step.
  template <class Engine>
  void place(Engine& e) {
    e.pin_parameters();
  }
  template <class Engine>
  void after_warm_up(Engine&, policy_context const&) {}
  template <class Engine>
  void after_step(Engine& e) {
    e.pin_parameters();
  }
};

static_assert(check_scheduler_policy<resident>() && check_scheduler_policy<chunked<belady>>() &&
              check_scheduler_policy<chunked<lru>>() && check_scheduler_policy<layer_window<0>>() &&
              check_scheduler_policy<layer_window<3>>() && check_scheduler_policy<static_partition>());

}  // namespace tide::offload
