#pragma once
// tensor_state: where a tensor of a chunk is in its step (PatrickStar's states plus Gemini's
// READY_FOR_REDUCE), and the explicit table of the transitions allowed between them.
//
//   using tide::chunk::tensor_state;
//   tide::chunk::is_legal(tensor_state::compute, tensor_state::hold_after_fwd);    // true
//   tide::chunk::check_transition("h0.attn.qkv.w", tensor_state::hold, tensor_state::hold_after_fwd);
//     // throws tide::error(usage): "... HOLD -> HOLD_AFTER_FWD ...; from HOLD the legal targets are COMPUTE, FREE"
//
// PatrickStar has no table (any state may follow any other); a table turns a hook called twice or
// out of order into an error at the call instead of a chunk evicted while a kernel reads it.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tide/core/error.hpp"

namespace tide::chunk {

enum class tensor_state : std::uint8_t {
  free,              // no data: the slot may be dropped; the first access zero-fills it
  compute,           // a kernel uses it now: never moves, never freed
  hold,              // holds data, not in use: may move, not be freed
  hold_after_fwd,    // forward of its block done (backward will use it again)
  hold_after_bwd,    // backward of its block done (its gradient is complete)
  ready_for_reduce,  // every contribution is in: may be reduced across ranks
};

inline constexpr std::size_t tensor_state_count = 6;

constexpr std::string_view to_string(tensor_state s) noexcept {
  switch (s) {
    case tensor_state::free: return "FREE";
    case tensor_state::compute: return "COMPUTE";
    case tensor_state::hold: return "HOLD";
    case tensor_state::hold_after_fwd: return "HOLD_AFTER_FWD";
    case tensor_state::hold_after_bwd: return "HOLD_AFTER_BWD";
    case tensor_state::ready_for_reduce: return "READY_FOR_REDUCE";
  }
  return "?";
}

// [from][to], in enum order. No state goes to itself: a repeated hook is a caller bug.
inline constexpr std::array<std::array<bool, tensor_state_count>, tensor_state_count> legal_transitions = {{
    //  FREE   COMPUTE HOLD   H_A_FWD H_A_BWD R_F_R
    // FREE -> COMPUTE: first access, the slot is zero-filled; FREE -> HOLD: loaded or all-gathered.
    {{false, true, true, false, false, false}},
    // COMPUTE -> HOLD: used outside a block's forward/backward (optimizer, init);
    // COMPUTE -> HOLD_AFTER_FWD / HOLD_AFTER_BWD: the block's post-forward / post-backward hook.
    {{false, false, true, true, true, false}},
    // HOLD -> COMPUTE: accessed; HOLD -> FREE: released (a remote shard, a gradient zeroed).
    {{true, true, false, false, false, false}},
    // HOLD_AFTER_FWD -> COMPUTE: used again (a shared parameter, or its backward);
    // -> HOLD: the step is reset; -> FREE: released after forward (remote chunk of a ZeRO group).
    {{true, true, true, false, false, false}},
    // HOLD_AFTER_BWD -> COMPUTE: a shared parameter accumulates another gradient; -> HOLD: reset;
    // -> READY_FOR_REDUCE: every contribution is in; -> FREE: released after backward.
    {{true, true, true, false, false, true}},
    // READY_FOR_REDUCE -> HOLD: reduced, kept; -> FREE: reduced and dropped (not owned by this rank).
    {{true, false, true, false, false, false}},
}};

constexpr bool is_legal(tensor_state from, tensor_state to) noexcept {
  auto const f = static_cast<std::size_t>(from), t = static_cast<std::size_t>(to);
  return f < tensor_state_count && t < tensor_state_count && legal_transitions[f][t];
}

// Throws tide::error(usage) naming `tensor`, both states and the legal targets from `from`.
inline void check_transition(std::string_view tensor, tensor_state from, tensor_state to) {
  if (is_legal(from, to)) [[likely]]
    return;
  std::string targets;
  for (std::size_t t = 0; t < tensor_state_count; ++t)
    if (is_legal(from, static_cast<tensor_state>(t)))
      targets.append(targets.empty() ? "" : ", ").append(to_string(static_cast<tensor_state>(t)));
  TIDE_FAIL(usage, "tensor ", tensor, ": state ", to_string(from), " -> ", to_string(to), " is not a legal transition",
            from == to ? " (a tensor never goes to the state it is in: is a hook called twice?)" : "",
            "; from ", to_string(from), " the legal targets are ", targets.empty() ? "none" : targets);
}

}  // namespace tide::chunk
