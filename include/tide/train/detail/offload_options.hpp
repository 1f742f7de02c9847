#pragma once
// The memory-scale options make_trainer passes to its scheduler, from an offload policy that has
// them (offload::chunked: host_budget, spill_folder, host_reserve, reuse_grad_slots,
// keep_host_copies, host_steps_in_flight), or the scheduler's defaults.

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

}  // namespace tide::train::detail
