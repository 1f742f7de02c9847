#pragma once
// The offload schedulers, as policy objects a scheduler<B, T, Config> (offload/scheduler.hpp)
// is instantiated with:
//
//   resident{}                  everything on the device (the baseline every other one must match)
//   chunked<belady>{...}        PatrickStar: chunks move between device and host as the warm-up
//                               trace says; eviction by the policy (belady, lru, fifo); prefetch
//   layer_window<W>{...}        STRONGHOLD: one chunk per layer; W layers on the device, the next
//                               ones prefetched while a layer computes; W = 0: chosen from the
//                               warm-up's compute and copy times
//   static_partition{...}       ZeRO-Offload: parameters stay on the device, gradients go to the
//                               host as soon as they are complete, optimizer state lives on the host
//
// A scheduler satisfies OffloadScheduler: pre_forward, post_forward, pre_backward,
// post_backward (per block), step() (per optimizer step), and the addresses of every parameter
// and gradient (the model asks for them between a block's pre_* and post_* hooks).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tide/offload/policy.hpp"
#include "tide/offload/stats.hpp"

namespace tide::offload {

// device_budget in every configuration: the bytes of the device arena a trainer creates (0 for
// resident: all model data plus 1 GiB for activations; required for the others).
struct resident {
  std::size_t device_budget = 0;
  std::size_t chunk_bytes = 0;  // 0: one chunk size from the search (only the layout; nothing moves)
  static constexpr std::string_view kind = "resident";
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
  int max_in_flight = 4;        // prefetch copies outstanding at once
  Policy policy{};
  static constexpr std::string_view kind = "chunked";
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
  int max_in_flight = 4;
  static constexpr std::string_view kind = "layer_window";
};

struct static_partition {
  std::size_t device_budget = 0;
  std::size_t chunk_bytes = 0;  // 0: searched as for chunked
  std::size_t reserved = 0;
  static constexpr std::string_view kind = "static_partition";
};

// The name of a configuration, for reports: "chunked<belady>", "layer_window<4>", ...
template <class C>
std::string scheduler_name() {
  if constexpr (requires { C::window; }) {
    return C::window == 0 ? std::string("layer_window<auto>") : tide::detail::concat("layer_window<", C::window, ">");
  } else if constexpr (requires { C{}.policy; }) {
    return tide::detail::concat("chunked<", decltype(C{}.policy)::name, ">");
  } else {
    return std::string(C::kind);
  }
}

template <class S>
concept OffloadScheduler = requires(S& s, S const& cs, int block, std::uint32_t i) {
  typename S::element_type;
  s.pre_forward(block);
  s.post_forward(block);
  s.pre_backward(block);
  s.post_backward(block);
  s.step();
  { s.param_data(i) } -> std::same_as<typename S::element_type*>;
  { s.grad_data(i) } -> std::same_as<typename S::element_type*>;
  { cs.last_step() } -> std::convertible_to<offload_stats>;
};

// What a model's Hooks parameter holds: a pointer to the scheduler, forwarding every hook and
// address (nn::gpt<B, T, offload::hooks<S>> keeps its parameters in the scheduler's chunks).
template <class S>
struct hooks {
  S* scheduler = nullptr;
  void pre_forward(int b) { scheduler->pre_forward(b); }
  void post_forward(int b) { scheduler->post_forward(b); }
  void pre_backward(int b) { scheduler->pre_backward(b); }
  void post_backward(int b) { scheduler->post_backward(b); }
  typename S::element_type* param_data(std::uint32_t i) { return scheduler->param_data(i); }
  typename S::element_type* grad_data(std::uint32_t i) { return scheduler->grad_data(i); }
  void zero_grad() { scheduler->zero_grad(); }
};

}  // namespace tide::offload
