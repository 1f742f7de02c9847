#pragma once
// Which blocks of which micro-batch slot of tide::nn::gpt (and tp::gpt) ran forward and not yet
// backward, or owe their weight pass: the checks of the model's pass order (gpt.hpp's
// forward_blocks and backward passes), apart from the activation plan (gpt_activations.hpp).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tide/core/error.hpp"
#include "tide/nn/gpt_config.hpp"

namespace tide::nn::detail {

// Which blocks of which micro-batch slot ran forward and not yet backward, or went back through
// the input pass and owe the weight pass: what forward_blocks and the backward passes check their
// ranges and order against. Atomic: a stage's backward reads the state of the block after its
// range, which the next stage's weight pass may be writing on another thread.
class stage_slots {
 public:
  enum state : std::uint8_t { idle, forwarded, owed };

  stage_slots(int layers, int in_flight)
      : layers_(layers), in_flight_(in_flight),
        states_(static_cast<std::size_t>(in_flight) * static_cast<std::size_t>(layers + 2)) {
    clear();
  }

  void check_micro(char const* op, int micro) const {
    TIDE_REQUIRE(micro >= 0 && micro < in_flight_, op, ": micro = ", micro, " but options.in_flight = ", in_flight_,
                 "; pass a micro-batch slot in [0, in_flight), or construct the model with a larger "
                 "gpt_options::in_flight");
  }
  void check_range(char const* op, int first, int last, int micro) const {
    TIDE_REQUIRE(first >= embedding_block && first <= last && last <= layers_, op, "(first = ", first, ", last = ",
                 last, "): pass embedding_block (-1) <= first <= last <= head_block (", layers_, ")");
    check_micro(op, micro);
  }
  // A forward would overwrite what an owed weight pass reads.
  void check_forward(char const* op, int first, int last, int micro) const {
    for (int b = first; b <= last; ++b)
      TIDE_REQUIRE(at(b, micro) != owed, op, ": block ", b, " of micro-batch slot ", micro, " still owes its weight "
                   "pass; call backward_weight_blocks over it before the slot's next forward, or give the model more "
                   "slots (gpt_options::in_flight)");
  }
  // Backward (whole or input pass) of first .. last: each ran forward, and the block after them
  // (if it ran forward here: a pipeline stage never runs the others) already went back.
  void check_backward(char const* op, int first, int last, int micro) const {
    for (int b = first; b <= last; ++b)
      TIDE_REQUIRE(at(b, micro) == forwarded, op, ": block ", b, " of micro-batch slot ", micro,
                   " has no forward to go back through (none ran, the forward had no targets, or its backward "
                   "already ran); run forward(ex, tokens, targets), or forward_blocks over the range with targets "
                   "when it holds the head, first");
    TIDE_REQUIRE(last == layers_ || at(last + 1, micro) != forwarded, op, ": block ", last + 1,
                 " of micro-batch slot ", micro, " ran forward but not backward; backward goes from the head down: "
                 "call the backward over the blocks after ", last, " first");
  }
  // The weight pass of first .. last: each went through its input pass.
  void check_weights(char const* op, int first, int last, int micro) const {
    for (int b = first; b <= last; ++b)
      TIDE_REQUIRE(at(b, micro) == owed, op, ": block ", b, " of micro-batch slot ", micro,
                   " has no input pass to follow (backward_input_blocks over it first), or its weight pass already ran");
  }

  void set(int first, int last, int micro, state s) noexcept {
    for (int b = first; b <= last; ++b) states_[index(b, micro)].store(s, std::memory_order_relaxed);
  }
  void clear() noexcept {
    for (auto& s : states_) s.store(idle, std::memory_order_relaxed);
  }
  [[nodiscard]] bool forwarded_at(int block, int micro) const noexcept { return at(block, micro) == forwarded; }

 private:
  [[nodiscard]] std::size_t index(int block, int micro) const noexcept {
    return static_cast<std::size_t>(micro) * static_cast<std::size_t>(layers_ + 2) +
           static_cast<std::size_t>(block - embedding_block);
  }
  [[nodiscard]] std::uint8_t at(int block, int micro) const noexcept {
    return states_[index(block, micro)].load(std::memory_order_relaxed);
  }

  int layers_, in_flight_;
  std::vector<std::atomic<std::uint8_t>> states_;  // [slot][block + 1]
};

}  // namespace tide::nn::detail
