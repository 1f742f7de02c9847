#pragma once
// The memory-scale options make_trainer passes to its scheduler, from an offload policy that has
// them (offload::chunked: host_budget, spill_folder, host_reserve, reuse_grad_slots,
// keep_host_copies, host_steps_in_flight, host_capacity), or the scheduler's defaults.

#include <cstddef>
#include <filesystem>

#include "tide/offload/scheduler_options.hpp"

namespace tide::train::detail {

template <class Offload>
std::size_t host_budget_of(Offload const& off) {
  if constexpr (requires { off.host_budget; }) return off.host_budget;
  else return 0;
}
template <class Offload>
std::filesystem::path spill_folder_of(Offload const& off) {
  if constexpr (requires { off.spill_folder; }) return off.spill_folder;
  else return {};
}
template <class Offload>
std::size_t host_reserve_of(Offload const& off) {
  if constexpr (requires { off.host_reserve; }) return off.host_reserve;
  else return 0;
}
template <class Offload>
bool reuse_grad_slots_of(Offload const& off) {
  if constexpr (requires { off.reuse_grad_slots; }) return off.reuse_grad_slots;
  else return false;
}
template <class Offload>
bool keep_host_copies_of(Offload const& off) {
  if constexpr (requires { off.keep_host_copies; }) return off.keep_host_copies;
  else return true;
}
template <class Offload>
int host_steps_in_flight_of(Offload const& off) {
  if constexpr (requires { off.host_steps_in_flight; }) return off.host_steps_in_flight;
  else return offload::scheduler_options{}.host_steps_in_flight;
}
template <class Offload>
std::size_t host_capacity_of(Offload const& off) {
  if constexpr (requires { off.host_capacity; }) return off.host_capacity;
  else return 0;
}

// make_trainer's scheduler options: the policy's memory-scale knobs (or the defaults), the
// optimizer's micro-steps and decay rule, and whether the optimizer and the sink wait for step().
template <class Offload, class Optimizer>
offload::scheduler_options scheduler_options_of(Offload const& off, Optimizer const& opt, bool defer_optimizer,
                                                bool defer_sink) {
  return {.micro_steps = opt.micro_steps,
          .host_steps_in_flight = host_steps_in_flight_of(off),
          .defer_optimizer = defer_optimizer,
          .defer_sink = defer_sink,
          .decay_matrices_only = opt.decay_matrices_only,
          .host_budget = host_budget_of(off),
          .spill_folder = spill_folder_of(off),
          .host_reserve = host_reserve_of(off),
          .reuse_grad_slots = reuse_grad_slots_of(off),
          .keep_host_copies = keep_host_copies_of(off),
          .host_capacity = host_capacity_of(off)};
}

}  // namespace tide::train::detail
