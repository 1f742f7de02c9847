#pragma once
// Which chunks the NVMe tier takes (scheduler_options::host_budget): a pure decision over byte
// counts, made once at construction, that allocates nothing but its answer and touches no
// memory. The file tier (detail/file_tier.hpp) then holds what it chose.
//
// The model data kept on the host between steps is the parameter chunks, the sink's extra lists,
// the fp32 masters and the optimizer state. Past host_budget (less host_reserve, the room kept
// for offloaded activations), the optimizer state of the last chunks this rank steps goes to
// file, with bf16 / f16 their masters too; past every chunk's state, the last parameter chunks.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"

namespace tide::offload::detail {

struct file_plan_input {
  std::size_t host_budget = 0;   // 0: no limit, nothing goes to file
  std::size_t host_reserve = 0;  // of host_budget, kept for the offloaded activations
  bool have_folder = false;      // spill_folder is set
  std::size_t kept = 0;          // bytes on the host whatever goes to file (the state's excluded)
  std::span<std::uint32_t const> owned;  // the chunks whose state this rank keeps, ascending
  std::size_t lists = 0;                 // fp32 lists per owned chunk that may go to file
  std::size_t list_bytes = 0;            // the bytes of one such list
  std::size_t param_bytes = 0;           // one parameter chunk on the host
  std::uint32_t chunks = 0;              // parameter chunks in all
  bool params_may_go = false;            // parameter chunks may go to file past the state
  // What the refusal says stays on the host, and why.
  bool masters_stay = false, extra_lists = false, sharding = false, masters_go = false;
};

struct file_plan {
  std::vector<std::uint32_t> state_chunks;  // whose state lists go to file, ascending
  std::vector<std::uint32_t> param_chunks;  // whose parameters go to file too, ascending
  std::size_t host_kept = 0;                // the model data that stays on the host
  [[nodiscard]] bool empty() const noexcept { return state_chunks.empty(); }
};

// Throws tide::error (usage, budget) when the budget cannot hold what must stay.
[[nodiscard]] inline file_plan plan_files(file_plan_input const& in) {
  TIDE_REQUIRE(in.host_reserve == 0 || in.host_budget != 0, "offload::scheduler: host_reserve ",
               bytes_of{in.host_reserve}, " without a host_budget reserves nothing; set host_budget, or leave "
               "host_reserve at 0");
  file_plan plan;
  if (in.host_budget == 0) return plan;
  std::size_t const per_chunk = in.lists * in.list_bytes;
  std::size_t const state = in.owned.size() * per_chunk;
  TIDE_REQUIRE(in.host_reserve < in.host_budget, "offload::scheduler: host_reserve ", bytes_of{in.host_reserve},
               " leaves nothing of host_budget ", bytes_of{in.host_budget},
               " for the model data; raise host_budget above host_reserve");
  std::size_t const for_data = in.host_budget - in.host_reserve;
  std::string const budget_text = in.host_reserve == 0
      ? tide::detail::concat("host_budget ", bytes_of{for_data})
      : tide::detail::concat("host_budget ", bytes_of{in.host_budget}, " less host_reserve ", bytes_of{in.host_reserve});
  if (in.kept + state <= for_data) {
    plan.host_kept = in.kept + state;
    return plan;
  }
  TIDE_REQUIRE(in.have_folder, "offload::scheduler: the model data (", bytes_of{in.kept + state}, ") exceeds ",
               budget_text, " and no spill_folder is set; set spill_folder to a folder on a fast drive, or raise "
               "host_budget");
  // Past the whole optimizer state, parameter chunks go to file too, the last ones first.
  bool const params_may_go = in.params_may_go && in.lists > 0;
  std::size_t params_out = 0;
  if (in.kept >= for_data && params_may_go)
    params_out = std::min<std::size_t>(in.chunks, (in.kept - for_data) / in.param_bytes + 1);
  std::size_t const kept_here = in.kept - params_out * in.param_bytes;
  if (params_may_go) {
    TIDE_CHECK(kept_here < for_data, budget, "offload::scheduler: ", budget_text, " is below the model data that "
               "stays on the host: ", bytes_of{kept_here}, " (the sink's extra lists; the parameters, the optimizer "
               "state and the fp32 masters go to file); raise host_budget to more than ",
               bytes_of{kept_here + in.host_reserve}, ", or set it to 0 for no limit");
  } else {
    TIDE_CHECK(in.kept < for_data && in.lists > 0, budget, "offload::scheduler: ", budget_text,
               " is below the model data that stays on the host: ", bytes_of{in.kept},
               " (the parameter chunks", in.masters_stay ? ", the fp32 masters" : "",
               in.extra_lists ? ", the sink's extra lists" : "", "; only the optimizer state",
               in.masters_go ? " and the fp32 masters go" : " goes", " to file",
               in.masters_stay ? ", and the masters and parameters stay with reuse_grad_slots" : "",
               in.sharding ? ", and under a sharding sink (ZeRO) the parameters stay on the host" : "",
               "); raise host_budget to more than ", bytes_of{in.kept + in.host_reserve},
               ", or set it to 0 for no limit");
  }
  std::size_t const over = kept_here + state - for_data;
  std::size_t const spilled =
      params_out > 0 ? in.owned.size() : std::min(in.owned.size(), (over + per_chunk - 1) / per_chunk);
  plan.host_kept = kept_here + (in.owned.size() - spilled) * per_chunk;
  plan.state_chunks.assign(in.owned.end() - static_cast<std::ptrdiff_t>(spilled), in.owned.end());
  plan.param_chunks.assign(in.owned.end() - static_cast<std::ptrdiff_t>(params_out), in.owned.end());
  return plan;
}

}  // namespace tide::offload::detail
