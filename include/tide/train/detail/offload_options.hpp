#pragma once
// The memory options make_trainer passes to its scheduler: the offload policy's `.memory`
// (offload::MemoryKnobs; the defaults without it), the optimizer's micro-steps and decay rule,
// and whether the optimizer and the sink wait for step().

#include "tide/core/error.hpp"
#include "tide/offload/scheduler_options.hpp"
#include "tide/offload/scheduler_policy.hpp"

namespace tide::train::detail {

template <class Offload, class Optimizer>
offload::scheduler_options scheduler_options_of(Offload const& off, Optimizer const& opt, bool defer_optimizer,
                                                bool defer_sink) {
  offload::memory_options m{};
  if constexpr (offload::MemoryKnobs<Offload>) m = off.memory;
  TIDE_REQUIRE(offload::nvme_tier_v<Offload> || (m.host_budget == 0 && m.spill_folder.empty() && m.host_reserve == 0),
               "make_trainer: ", Offload::name(), " has no NVMe tier; memory.host_budget = ", m.host_budget,
               ", spill_folder = \"", m.spill_folder.string(), "\", host_reserve = ", m.host_reserve,
               " are chunked's knobs: pass them to chunked<Policy>, or leave them out");
  return {.micro_steps = opt.micro_steps,
          .host_steps_in_flight = m.host_steps_in_flight,
          .defer_optimizer = defer_optimizer,
          .defer_sink = defer_sink,
          .decay_matrices_only = opt.decay_matrices_only,
          .host_budget = m.host_budget,
          .spill_folder = m.spill_folder,
          .host_reserve = m.host_reserve,
          .reuse_grad_slots = m.reuse_grad_slots,
          .keep_host_copies = m.keep_host_copies,
          .host_capacity = m.host_capacity};
}

}  // namespace tide::train::detail
