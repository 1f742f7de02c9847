#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <utility>

#include <tide/chunk/tensor_state.hpp>

using tide::chunk::tensor_state;

namespace {

constexpr tensor_state F = tensor_state::free, C = tensor_state::compute, H = tensor_state::hold,
                       HF = tensor_state::hold_after_fwd, HB = tensor_state::hold_after_bwd,
                       R = tensor_state::ready_for_reduce;

// The edges of the transition table in docs/offload.md ("Chunked stateful tensors"), written out
// independently of the header's table.
constexpr std::array<std::pair<tensor_state, tensor_state>, 16> spec_edges = {{
    {F, C}, {F, H}, {C, H}, {C, HF}, {C, HB}, {H, C}, {H, F}, {HF, C},
    {HF, H}, {HF, F}, {HB, C}, {HB, H}, {HB, R}, {HB, F}, {R, H}, {R, F},
}};

bool in_spec(tensor_state from, tensor_state to) {
  return std::find(spec_edges.begin(), spec_edges.end(), std::pair{from, to}) != spec_edges.end();
}

tensor_state state(std::size_t i) { return static_cast<tensor_state>(i); }

}  // namespace

static_assert(tide::chunk::is_legal(F, C) && !tide::chunk::is_legal(C, C));
static_assert(tide::chunk::to_string(HF) == "HOLD_AFTER_FWD");

TEST_CASE("tensor_state: names are distinct and upper case") {
  for (std::size_t i = 0; i < tide::chunk::tensor_state_count; ++i) {
    std::string const name(tide::chunk::to_string(state(i)));
    CHECK(name != "?");
    CHECK(std::none_of(name.begin(), name.end(), [](char c) { return c >= 'a' && c <= 'z'; }));
    for (std::size_t j = 0; j < i; ++j) CHECK(tide::chunk::to_string(state(j)) != name);
  }
  CHECK(tide::chunk::to_string(R) == "READY_FOR_REDUCE");
}

TEST_CASE("tensor_state: all 36 pairs match the spec's edge list") {
  std::size_t legal = 0;
  for (std::size_t f = 0; f < tide::chunk::tensor_state_count; ++f)
    for (std::size_t t = 0; t < tide::chunk::tensor_state_count; ++t) {
      tensor_state const from = state(f), to = state(t);
      bool const expected = in_spec(from, to);
      CAPTURE(tide::chunk::to_string(from));
      CAPTURE(tide::chunk::to_string(to));
      CHECK(tide::chunk::is_legal(from, to) == expected);
      CHECK(tide::chunk::legal_transitions[f][t] == expected);
      if (expected) {
        ++legal;
        CHECK_NOTHROW(tide::chunk::check_transition("h3.mlp.fc.w", from, to));
        continue;
      }
      try {
        tide::chunk::check_transition("h3.mlp.fc.w", from, to);
        FAIL("an illegal transition did not throw");
      } catch (tide::error const& e) {
        CHECK(e.category() == tide::errc::usage);
        std::string const msg = e.message();
        CHECK(msg.find("h3.mlp.fc.w") != std::string::npos);
        CHECK(msg.find(std::string(tide::chunk::to_string(from)) + " -> " + std::string(tide::chunk::to_string(to))) !=
              std::string::npos);
        // Every legal target from `from` is listed.
        for (auto [a, b] : spec_edges)
          if (a == from) CHECK(msg.find(tide::chunk::to_string(b)) != std::string::npos);
      }
    }
  CHECK(legal == spec_edges.size());
}

TEST_CASE("tensor_state: no state goes to itself, every state has a way out and a way in") {
  for (std::size_t s = 0; s < tide::chunk::tensor_state_count; ++s) {
    CHECK_FALSE(tide::chunk::is_legal(state(s), state(s)));
    bool out = false, in = false;
    for (std::size_t t = 0; t < tide::chunk::tensor_state_count; ++t) {
      out = out || tide::chunk::is_legal(state(s), state(t));
      in = in || tide::chunk::is_legal(state(t), state(s));
    }
    CHECK(out);
    CHECK(in);
  }
  // Out-of-range values (a corrupted byte) are never legal.
  CHECK_FALSE(tide::chunk::is_legal(static_cast<tensor_state>(6), F));
  CHECK_FALSE(tide::chunk::is_legal(F, static_cast<tensor_state>(200)));
}
