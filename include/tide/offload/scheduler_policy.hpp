#pragma once
// The scheduler-policy slot of the offload engine (offload/scheduler.hpp). The engine owns the
// mechanics: fetch, evict, hand a victim's block over, drop a clean chunk, prefetch, settle, the
// copy lane, the optimizer, telemetry, the trace. A policy only decides:
//
//   name()                                  what reports call it ("chunked<belady>")
//   device_budget, moves_data               the arena's bytes (0: sized by make_trainer when
//                                           !moves_data); whether chunks ever leave the device
//   policy                                  the EvictionPolicy that picks victims (offload/policy.hpp)
//   layout(params, uses, budget, elem)      how parameters pack into chunks
//   reserved_bytes()                        device bytes kept out of the chunks' budget
//   minimum(ctx, non_model)                 the least budget it can train with, and why
//   chunk_budget(ctx, tracer, t)            device bytes chunks may take at moment t
//   prefetch_depth(ctx), max_in_flight()    how far ahead to fetch, how many copies at once
//   place(engine)                           at the first moment: what to pin, where state lives
//   after_warm_up(engine, ctx)              when the trace is known (state placement, window)
//   after_step(engine)                      at the end of each step and after an aborted one
//
// place, after_warm_up and after_step receive the engine and may call its placement members
// (placement_engine below): pin_parameters(), place_state_on_device(count, required) and
// keep_spare_blocks(count). A policy is a value stored in the engine; the calls are resolved at
// compile time. tests/offload/slots.cpp writes a fifth policy and trains with it.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "tide/chunk/layout.hpp"
#include "tide/chunk/memory_tracer.hpp"
#include "tide/core/parameters.hpp"
#include "tide/offload/policy.hpp"
#include "tide/offload/scheduler_options.hpp"

namespace tide::offload {

// What the engine knows and a policy decides from. Kept current by the engine (cheap to read at
// every moment).
struct policy_context {
  std::size_t budget = 0;             // the device arena's
  std::uint32_t chunks = 0;           // chunks per list
  std::size_t block_bytes = 0;        // device bytes of one parameter or gradient chunk
  std::size_t state_block_bytes = 0;  // one fp32 state chunk (master, optimizer state)
  std::size_t state_lists = 0;        // fp32 lists per chunk: the master (bf16 / f16) + the optimizer's
  std::size_t working_set = 0;        // chunks the busiest moment touches (parameters + gradients)
  std::string_view working_set_moment;  // which moment that is ("block 3's backward")
  std::size_t grads_per_moment = 0;   // the most gradient chunks one backward touches
  std::size_t moments = 0;            // moments per step (known after the warm-up)
  std::size_t pinned_bytes = 0;       // parameter chunks pinned on the device (pin_parameters)
  std::size_t peak_non_model = 0;     // activations and workspaces at their peak (after the warm-up)
  double copy_ms = 0;                 // mean chunk copy in the warm-up
  double forward_ms = 0;              // mean forward block in the warm-up
  bool recording = false;             // the warm-up step is running
};

// The least device budget and its parts, in words for errors and reports.
struct minimum_parts {
  std::size_t bytes = 0;
  std::string why;     // "non-model 1 MiB (activations, workspaces) + the working set 6 chunks x ..."
  std::string advice;  // what else the user can do (", or offload (chunked<belady>)")
};

namespace detail {
// The placement members a policy may call, as the concept checks them (the engine has these).
struct placement_engine {
  void pin_parameters();
  std::uint32_t place_state_on_device(std::uint32_t count, bool required);
  void keep_spare_blocks(std::size_t count);
};
}  // namespace detail

template <class P>
concept SchedulerPolicy =
    std::copy_constructible<P> &&
    requires(P& p, P const& cp, policy_context const& ctx, chunk::memory_tracer const& tracer,
             parameter_list const& params, block_uses const& uses, detail::placement_engine& e, std::size_t n) {
      { P::name() } -> std::convertible_to<std::string>;
      { P::moves_data } -> std::convertible_to<bool>;
      { cp.device_budget } -> std::convertible_to<std::size_t>;
      requires EvictionPolicy<std::remove_cvref_t<decltype(p.policy)>>;
      { cp.layout(params, uses, n, n) } -> std::same_as<chunk::chunk_layout>;
      { cp.reserved_bytes() } -> std::convertible_to<std::size_t>;
      { cp.minimum(ctx, n) } -> std::same_as<minimum_parts>;
      { cp.chunk_budget(ctx, tracer, n) } -> std::convertible_to<std::size_t>;
      { cp.prefetch_depth(ctx) } -> std::convertible_to<int>;
      { cp.max_in_flight() } -> std::convertible_to<int>;
      p.place(e);
      p.after_warm_up(e, ctx);
      p.after_step(e);
    };

// Optional: the host-side knobs make_trainer passes to its scheduler, as `.memory` (every policy
// of offload/schedulers.hpp has it; without it, the defaults); and `nvme_tier` (true: the policy
// places state so that the NVMe tier's knobs apply: chunked; without it, false, and make_trainer
// refuses memory.host_budget, spill_folder and host_reserve).
template <class P>
concept MemoryKnobs = requires(P const& p) {
  { p.memory } -> std::convertible_to<memory_options>;
};
template <class P>
inline constexpr bool nvme_tier_v = [] {
  if constexpr (requires { { P::nvme_tier } -> std::convertible_to<bool>; }) return bool{P::nvme_tier};
  else return false;
}();

// `static_assert(check_scheduler_policy<P>())`: the first missing member fails with a sentence.
template <class P>
consteval bool check_scheduler_policy() {
  static_assert(requires { { P::name() } -> std::convertible_to<std::string>; },
                "SchedulerPolicy: P needs `static std::string name()` (what reports call it)");
  static_assert(requires { { P::moves_data } -> std::convertible_to<bool>; },
                "SchedulerPolicy: P needs `static constexpr bool moves_data` (false: everything stays on the device)");
  static_assert(requires(P const& p) { { p.device_budget } -> std::convertible_to<std::size_t>; },
                "SchedulerPolicy: P needs a member `std::size_t device_budget`, the device arena's bytes");
  static_assert(requires(P& p) { requires EvictionPolicy<std::remove_cvref_t<decltype(p.policy)>>; },
                "SchedulerPolicy: P needs a member `policy` of an EvictionPolicy type (tide::offload::belady, "
                "lru or fifo) that picks the chunk to evict");
  static_assert(requires(P const& p, parameter_list const& params, block_uses const& uses, std::size_t n) {
                  { p.layout(params, uses, n, n) } -> std::same_as<chunk::chunk_layout>;
                }, "SchedulerPolicy: P needs `chunk::chunk_layout layout(parameter_list const&, block_uses const&, "
                   "std::size_t budget, std::size_t element_bytes) const` (offload::pack_for_budget packs as "
                   "chunked does)");
  static_assert(requires(P const& p) { { p.reserved_bytes() } -> std::convertible_to<std::size_t>; },
                "SchedulerPolicy: P needs `std::size_t reserved_bytes() const` (device bytes kept out of the "
                "chunks' budget; 0 for none)");
  static_assert(requires(P const& p, policy_context const& ctx, std::size_t n) {
                  { p.minimum(ctx, n) } -> std::same_as<minimum_parts>;
                }, "SchedulerPolicy: P needs `minimum_parts minimum(policy_context const&, std::size_t non_model) "
                   "const`, the least device budget it can train with");
  static_assert(requires(P const& p, policy_context const& ctx, chunk::memory_tracer const& tr, std::size_t t) {
                  { p.chunk_budget(ctx, tr, t) } -> std::convertible_to<std::size_t>;
                }, "SchedulerPolicy: P needs `std::size_t chunk_budget(policy_context const&, chunk::memory_tracer "
                   "const&, std::size_t moment) const`, the device bytes chunks may take at that moment");
  static_assert(requires(P const& p, policy_context const& ctx) {
                  { p.prefetch_depth(ctx) } -> std::convertible_to<int>;
                  { p.max_in_flight() } -> std::convertible_to<int>;
                }, "SchedulerPolicy: P needs `int prefetch_depth(policy_context const&) const` (moments to fetch "
                   "ahead; 0: none) and `int max_in_flight() const` (copies in flight at which the prefetch stops)");
  static_assert(requires(P& p, detail::placement_engine& e, policy_context const& ctx) {
                  p.place(e);
                  p.after_warm_up(e, ctx);
                  p.after_step(e);
                }, "SchedulerPolicy: P needs `template <class Engine> void place(Engine&)`, `after_warm_up(Engine&, "
                   "policy_context const&)` and `after_step(Engine&)` (empty bodies are fine)");
  return SchedulerPolicy<P>;
}

// The name of a policy, for reports: "chunked<belady>", "layer_window<4>", ...
template <class P>
std::string scheduler_name() {
  return P::name();
}

}  // namespace tide::offload
