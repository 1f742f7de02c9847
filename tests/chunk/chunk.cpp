#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <tide/chunk/chunk.hpp>
#include <tide/nn/gpt.hpp>

using tide::dtype;
using tide::chunk::chunk;
using tide::chunk::chunk_list;
using tide::chunk::chunk_role;
using tide::chunk::chunk_state;
using tide::chunk::tensor_state;
using tide::chunk::tier;

namespace {

constexpr std::size_t n_states = tide::chunk::tensor_state_count;

tensor_state state(std::size_t i) { return static_cast<tensor_state>(i); }

tide::parameter_list small_gpt() {
  return tide::nn::gpt_parameters({.layers = 4, .heads = 4, .channels = 64, .vocab = 256, .max_seq = 64}, dtype::f32);
}

std::uint32_t index_of(tide::parameter_list const& params, std::string_view name) {
  return static_cast<std::uint32_t>(&params.find(name) - params.begin());
}

// Every chunk's counters equal a recount of the tensors' states.
void check_counters(chunk_list const& list) {
  std::vector<std::array<std::size_t, n_states>> recount(list.size(), std::array<std::size_t, n_states>{});
  for (auto const& t : list.tensors()) ++recount[t.chunk][static_cast<std::size_t>(t.state)];
  for (std::size_t c = 0; c < list.size(); ++c) {
    std::size_t total = 0;
    for (std::size_t s = 0; s < n_states; ++s) {
      CHECK(list[c].count(state(s)) == recount[c][s]);
      total += recount[c][s];
    }
    CHECK(list[c].tensors() == total);
  }
}

struct snapshot {
  std::vector<tensor_state> states;
  std::vector<std::array<std::size_t, n_states>> counts;
  std::vector<chunk_state> chunk_states;
  explicit snapshot(chunk_list const& list) {
    for (auto const& t : list.tensors()) states.push_back(t.state);
    for (chunk const& c : list) {
      counts.push_back({});
      for (std::size_t s = 0; s < n_states; ++s) counts.back()[s] = c.count(state(s));
      chunk_states.push_back(c.state());
    }
  }
  friend bool operator==(snapshot const&, snapshot const&) = default;
};

}  // namespace

TEST_CASE("chunk: names") {
  CHECK(tide::chunk::to_string(tier::device) == "device");
  CHECK(tide::chunk::to_string(tier::host) == "host");
  CHECK(tide::chunk::to_string(chunk_state::released) == "RELEASED");
  CHECK(tide::chunk::to_string(chunk_state::hold_after_bwd) == "HOLD_AFTER_BWD");
  CHECK(tide::chunk::to_string(chunk_role::state) == "state");
  for (std::size_t s = 0; s < n_states; ++s)
    CHECK(tide::chunk::to_string(tide::chunk::chunk_state_of(state(s))) == tide::chunk::to_string(state(s)));
}

TEST_CASE("chunk: state() follows the priority order for all 64 subsets of nonzero counters") {
  // PatrickStar's order, most constraining first.
  constexpr tensor_state priority[] = {tensor_state::compute, tensor_state::hold, tensor_state::hold_after_fwd,
                                       tensor_state::hold_after_bwd, tensor_state::ready_for_reduce, tensor_state::free};
  std::vector<std::byte> storage(256);
  for (unsigned mask = 0; mask < (1u << n_states); ++mask) {
    CAPTURE(mask);
    chunk c(7, storage.size());
    for (std::size_t s = 0; s < n_states; ++s)
      if (mask & (1u << s))
        for (std::size_t k = 0; k <= s; ++k) c.add_tensor(state(s));  // counts above 1 too
    CHECK(c.id() == 7);
    CHECK(c.capacity() == 256);
    CHECK(c.state() == chunk_state::released);  // no payload: released, whatever the counters say
    CHECK_FALSE(c.movable());
    CHECK_FALSE(c.releasable());

    c.attach(storage.data(), tier::device);
    CHECK(c.payload() == storage.data());
    CHECK(c.tier() == tier::device);
    chunk_state expected = chunk_state::free;  // an empty chunk is FREE
    for (tensor_state s : priority)
      if (mask & (1u << static_cast<unsigned>(s))) {
        expected = tide::chunk::chunk_state_of(s);
        break;
      }
    CHECK(c.state() == expected);

    bool const has_compute = mask & (1u << static_cast<unsigned>(tensor_state::compute));
    bool const only_free = (mask & ~(1u << static_cast<unsigned>(tensor_state::free))) == 0;
    CHECK(c.movable() == (!has_compute && !only_free));
    CHECK(c.releasable() == only_free);
    c.set_pinned(true);
    CHECK(c.pinned());
    CHECK_FALSE(c.movable());
    CHECK(c.releasable() == only_free);  // pinning stops moves, not a release of no data
    c.set_pinned(false);

    CHECK(c.detach() == storage.data());
    CHECK(c.payload() == nullptr);
    CHECK(c.state() == chunk_state::released);
    CHECK(c.tier() == tier::device);  // where it last was
  }
}

TEST_CASE("chunk: on_transition moves one count") {
  chunk c(0, 64);
  c.add_tensor();
  c.add_tensor();
  c.on_transition(tensor_state::free, tensor_state::compute);
  CHECK(c.count(tensor_state::free) == 1);
  CHECK(c.count(tensor_state::compute) == 1);
  CHECK(c.tensors() == 2);
}

TEST_CASE("chunk_list: tensors, offsets and bytes follow the layout and the list's dtype") {
  auto const params = small_gpt();
  auto const layout = tide::chunk::pack(params, 1 << 16);
  chunk_list const grads(chunk_role::grad, dtype::bf16, layout, params);
  CHECK(grads.role() == chunk_role::grad);
  CHECK(grads.type() == dtype::bf16);
  CHECK(grads.size() == layout.chunks());
  CHECK(grads.chunk_bytes() == (std::size_t{1} << 16) * 2);
  REQUIRE(grads.tensors().size() == params.size());
  std::size_t seen = 0;
  for (std::uint32_t c = 0; c < grads.size(); ++c) {
    CHECK(grads[c].id() == c);
    CHECK(grads[c].capacity() == grads.chunk_bytes());
    CHECK(grads[c].tensors() == grads.params_of(c).size());
    CHECK(grads[c].count(tensor_state::free) == grads[c].tensors());
    for (std::uint32_t p : grads.params_of(c)) {
      CHECK(p == seen++);  // registration order
      auto const& t = grads.tensor(p);
      CHECK(t.param == p);
      CHECK(t.chunk == c);
      CHECK(t.offset == layout.offset_of[p] * 2);
      CHECK(t.bytes == static_cast<std::size_t>(params[p].numel()) * 2);  // bf16, though the params are f32
      CHECK(t.offset + t.bytes <= grads.chunk_bytes());
      CHECK(grads.parameter(p).name() == params[p].name());
    }
  }
  CHECK(seen == params.size());
  CHECK_THROWS_AS((void)grads.tensor(static_cast<std::uint32_t>(params.size())), tide::error);
  CHECK_THROWS_AS((void)grads.params_of(static_cast<std::uint32_t>(grads.size())), tide::error);
}

TEST_CASE("chunk_list: data() is payload + offset, and an error on a released chunk") {
  auto const params = small_gpt();
  auto const layout = tide::chunk::pack(params, 1 << 16);
  chunk_list list(chunk_role::param, dtype::f32, layout, params);
  std::uint32_t const qkv = index_of(params, "h0.attn.qkv.w");
  std::uint32_t const c = list.tensor(qkv).chunk;
  try {
    (void)list.data(qkv);
    FAIL("data() of a released chunk did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(e.message().find("h0.attn.qkv.w (param)") != std::string::npos);
    CHECK(e.message().find("released") != std::string::npos);
  }
  std::vector<std::byte> storage(list.chunk_bytes());
  list[c].attach(storage.data(), tier::host);
  CHECK(list.data(qkv) == storage.data() + layout.offset_of[qkv] * 4);
  CHECK(list[c].state() == chunk_state::free);
  CHECK(list[c].releasable());
  (void)list[c].detach();
}

TEST_CASE("chunk_list: counters stay consistent through a long random walk of legal transitions") {
  auto const params = small_gpt();
  auto const layout = tide::chunk::pack(params, 1 << 15);
  chunk_list list(chunk_role::grad, dtype::f32, layout, params);
  REQUIRE(list.size() >= 3);
  std::mt19937 rng(12345);
  std::size_t moved = 0;
  for (int step = 0; step < 3000; ++step) {
    auto const p = static_cast<std::uint32_t>(rng() % params.size());
    tensor_state const from = list.tensor(p).state;
    std::vector<tensor_state> targets;
    for (std::size_t t = 0; t < n_states; ++t)
      if (tide::chunk::is_legal(from, state(t))) targets.push_back(state(t));
    tensor_state const to = targets[rng() % targets.size()];
    list.transition(p, to);
    CHECK(list.tensor(p).state == to);
    if (step % 10 == 0) {
      // A whole chunk to HOLD where every member may go there (else it must throw, unchanged).
      auto const c = static_cast<std::uint32_t>(rng() % list.size());
      snapshot const before(list);
      bool ok = true;
      for (std::uint32_t q : list.params_of(c))
        ok = ok && (list.tensor(q).state == tensor_state::hold || tide::chunk::is_legal(list.tensor(q).state, tensor_state::hold));
      if (ok) {
        list.transition_chunk(c, tensor_state::hold);
        CHECK(list[c].count(tensor_state::hold) == list[c].tensors());
        ++moved;
      } else {
        CHECK_THROWS_AS(list.transition_chunk(c, tensor_state::hold), tide::error);
        CHECK(snapshot(list) == before);
      }
    }
    check_counters(list);
  }
  CHECK(moved > 0);
}

TEST_CASE("chunk_list: an illegal transition throws, names the tensor and changes nothing") {
  auto const params = small_gpt();
  auto const layout = tide::chunk::pack(params, 1 << 16);
  chunk_list list(chunk_role::grad, dtype::f32, layout, params);
  std::vector<std::byte> storage(list.chunk_bytes() * list.size());
  for (std::size_t c = 0; c < list.size(); ++c) list[c].attach(storage.data() + c * list.chunk_bytes(), tier::device);
  std::uint32_t const qkv = index_of(params, "h0.attn.qkv.w");
  std::uint32_t const c = list.tensor(qkv).chunk;
  list.transition(qkv, tensor_state::compute);
  list.transition(qkv, tensor_state::hold_after_bwd);
  list.transition(qkv + 1, tensor_state::compute);  // the chunk is COMPUTE
  for (std::uint32_t p : list.params_of(c))
    if (p != qkv && p != qkv + 1) {
      list.transition(p, tensor_state::compute);
      list.transition(p, tensor_state::hold_after_bwd);
    }
  CHECK(list[c].state() == chunk_state::compute);

  snapshot const before(list);
  try {
    list.transition(qkv, tensor_state::hold_after_fwd);  // HOLD_AFTER_BWD -> HOLD_AFTER_FWD
    FAIL("an illegal transition did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(e.message().find("h0.attn.qkv.w (grad)") != std::string::npos);
    CHECK(e.message().find("HOLD_AFTER_BWD -> HOLD_AFTER_FWD") != std::string::npos);
  }
  CHECK(snapshot(list) == before);
  CHECK_THROWS_AS(list.transition(qkv, tensor_state::hold_after_bwd), tide::error);  // to itself
  CHECK(snapshot(list) == before);

  // transition_chunk: qkv + 1 is COMPUTE, which cannot go to READY_FOR_REDUCE: nothing moves,
  // though every other tensor of the chunk (HOLD_AFTER_BWD) could.
  try {
    list.transition_chunk(c, tensor_state::ready_for_reduce);
    FAIL("an illegal chunk transition did not throw");
  } catch (tide::error const& e) {
    CHECK(e.message().find(std::string(params[qkv + 1].name()) + " (grad)") != std::string::npos);
  }
  CHECK(snapshot(list) == before);
  check_counters(list);
  CHECK_THROWS_AS(list.transition(static_cast<std::uint32_t>(params.size()), tensor_state::compute), tide::error);
  CHECK(snapshot(list) == before);
  for (chunk& k : list) (void)k.detach();
}

TEST_CASE("chunk_list: a layout of another list is rejected") {
  auto const params = small_gpt();
  auto const other = tide::nn::gpt_parameters({.layers = 2, .heads = 4, .channels = 64, .vocab = 256, .max_seq = 64}, dtype::f32);
  auto const layout = tide::chunk::pack(other, 1 << 16);
  CHECK_THROWS_AS(chunk_list(chunk_role::param, dtype::f32, layout, params), tide::error);
  auto bad = tide::chunk::pack(params, 1 << 16);
  bad.offset_of[3] = bad.chunk_elements;  // past the chunk's end
  CHECK_THROWS_AS(chunk_list(chunk_role::param, dtype::f32, bad, params), tide::error);
  CHECK_NOTHROW(chunk_list(chunk_role::param, dtype::f32, tide::chunk::pack(params, 1 << 16), params));
}
