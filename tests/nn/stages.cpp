// nn::gpt's stages: forward_blocks / backward_blocks over block ranges with in-flight
// micro-batch slots give the whole model's losses and gradients (with separate_tied_grad) bit
// for bit, in 1F1B order over 2 and 4 stages, and in two models that exchange only the boundary
// tensors (as pipeline ranks would); wrong ranges and slots are refused; the default whole model
// keeps no tied gradient buffer; a steady-state step allocates nothing.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <tide/memory/device_arena.hpp>
#include <tide/nn/gpt.hpp>

#include "support/count_allocations.hpp"  // replaces operator new for this executable

namespace {

using tide::test::counting;
using tide::test::heap_allocations;
using namespace tide::literals;
using tide::index_t;
using host_gpt = tide::nn::gpt<tide::host>;
using batch = host_gpt::batch_type;
// What the stage splits are compared with: the whole model with the tied buffer.
constexpr tide::nn::gpt_options whole_options{.seed = 3, .separate_tied_grad = true};

// The tiny config of tests/nn/gpt.cpp: blocks -1, 0, 1, 2 (head), so 4 stages of one block each.
constexpr tide::nn::gpt_config tiny{.layers = 2, .heads = 2, .channels = 8, .vocab = 16, .padded_vocab = 24,
                                    .max_seq = 8};
constexpr index_t tiny_B = 2, tiny_T = 5;
constexpr int micro_batches = 4;
constexpr float loss_scale = 0.25f;  // 1 / micro_batches: exact, and the head ranges must apply it

std::vector<std::int32_t> random_ids(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> ids(n);
  for (auto& t : ids) t = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(tiny.vocab));
  return ids;
}

// 4 micro-batches with different tokens and targets.
struct data {
  std::vector<std::vector<std::int32_t>> tokens, targets;
  data() {
    for (int k = 0; k < micro_batches; ++k) {
      tokens.push_back(random_ids(tiny_B * tiny_T, 100 + static_cast<std::uint32_t>(k)));
      targets.push_back(random_ids(tiny_B * tiny_T, 200 + static_cast<std::uint32_t>(k)));
    }
  }
  [[nodiscard]] batch at(int k) const {
    auto const i = static_cast<std::size_t>(k);
    return {{tokens[i].data(), {tiny_B, tiny_T}}, {targets[i].data(), {tiny_B, tiny_T}}};
  }
};

struct result {
  std::vector<float> losses;
  std::vector<float> grads;  // the flat gradient buffer
};

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> flat_grads(host_gpt const& m) {
  auto const g = m.flat_grads();
  return {g.data(), g.data() + g.size()};
}

// f() throws tide::error(usage) whose message says `says`.
template <class F>
void usage(F&& f, char const* says) {
  try {
    f();
    FAIL("expected a usage error");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK_MESSAGE(std::string(e.what()).find(says) != std::string::npos, e.what());
  }
}

// (a) the whole model, micro-batch after micro-batch.
result run_whole(tide::exec<tide::host> const& ex, data const& d, tide::nn::gpt_options const& options = whole_options,
                 tide::nn::gpt_config const& config = tiny) {
  tide::memory::device_arena<tide::host> arena{{.budget = 4_MiB}};
  host_gpt m(config, arena, options);
  m.zero_grad(ex);
  result r;
  for (int k = 0; k < micro_batches; ++k) {
    r.losses.push_back(m.forward(ex, d.at(k)));
    m.backward(ex, loss_scale);
  }
  r.grads = flat_grads(m);
  return r;
}

// Stage s's operations in 1F1B order: (stages - s - 1) warm-up forwards, then one forward one
// backward, then the remaining backwards.
struct op {
  bool forward;
  int micro;
};
std::vector<op> one_f_one_b(int stages, int s) {
  std::vector<op> ops;
  int const warmup = std::min(stages - s - 1, micro_batches);
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({true, f});
  while (f < micro_batches) {
    ops.push_back({true, f++});
    ops.push_back({false, b++});
  }
  while (b < micro_batches) ops.push_back({false, b++});
  return ops;
}

// Runs every stage's 1F1B list in one thread, in a valid global interleaving: round robin over
// the stages, each taking its next operation once its dependency is done (forward of k after
// stage s-1's forward of k, backward of k after stage s+1's backward of k). `run(s, op)` does it.
template <class Run>
void interleave(int stages, Run&& run) {
  std::vector<std::vector<op>> lists;
  for (int s = 0; s < stages; ++s) lists.push_back(one_f_one_b(stages, s));
  std::vector<std::size_t> next(static_cast<std::size_t>(stages), 0);
  std::vector<std::vector<bool>> fwd_done(static_cast<std::size_t>(stages), std::vector<bool>(micro_batches)),
      bwd_done = fwd_done;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      auto const us = static_cast<std::size_t>(s);
      if (next[us] == lists[us].size()) continue;
      op const o = lists[us][next[us]];
      auto const k = static_cast<std::size_t>(o.micro);
      bool const ready = o.forward ? (s == 0 || fwd_done[us - 1][k]) : (s == stages - 1 || bwd_done[us + 1][k]);
      if (!ready) continue;
      run(s, o);
      (o.forward ? fwd_done : bwd_done)[us][k] = true;
      ++next[us];
      progress = true;
    }
  }
  for (int s = 0; s < stages; ++s)
    REQUIRE_MESSAGE(next[static_cast<std::size_t>(s)] == one_f_one_b(stages, s).size(), "stage ", s, " deadlocked");
}

// Stage ranges: blocks -1 .. L split into `stages` runs as even as can be.
std::vector<std::pair<int, int>> ranges(int stages) {
  int const blocks = tiny.layers + 2;
  std::vector<std::pair<int, int>> r;
  for (int s = 0, first = -1; s < stages; ++s) {
    int const n = blocks / stages + (s < blocks % stages ? 1 : 0);
    r.emplace_back(first, first + n - 1);
    first += n;
  }
  return r;
}

// (b), (c): one model, `stages` ranges, in_flight = stages, slot = micro-batch mod stages.
result run_stages(tide::exec<tide::host> const& ex, data const& d, int stages) {
  tide::memory::device_arena<tide::host> arena{{.budget = 8_MiB}};
  host_gpt m(tiny, arena, {.seed = 3, .in_flight = stages});
  m.zero_grad(ex);
  auto const r = ranges(stages);
  result out;
  out.losses.assign(micro_batches, std::nanf(""));
  int other_losses_finite = 0;
  interleave(stages, [&](int s, op o) {
    auto const [first, last] = r[static_cast<std::size_t>(s)];
    int const slot = o.micro % stages;
    if (o.forward) {
      float const loss = m.forward_blocks(ex, first, last, slot, d.at(o.micro));
      if (s == stages - 1) out.losses[static_cast<std::size_t>(o.micro)] = loss;
      else other_losses_finite += !std::isnan(loss);
    } else {
      m.backward_blocks(ex, first, last, slot, loss_scale);
    }
  });
  CHECK(other_losses_finite == 0);  // ranges without the head return NaN
  out.grads = flat_grads(m);
  return out;
}

}  // namespace

TEST_CASE("stages: ranges give the stages' 1F1B order the whole model's losses and gradients, bit for bit") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  data const d;
  result const whole = run_whole(ex, d);
  for (float const l : whole.losses) REQUIRE(std::isfinite(l));
  CHECK(whole.losses[0] != whole.losses[1]);  // the micro-batches differ

  CHECK(ranges(2) == std::vector<std::pair<int, int>>{{-1, 0}, {1, 2}});
  CHECK(ranges(4) == std::vector<std::pair<int, int>>{{-1, -1}, {0, 0}, {1, 1}, {2, 2}});
  CHECK(one_f_one_b(4, 0).size() == 2 * micro_batches);
  CHECK(one_f_one_b(4, 1)[2].forward);  // stage 1 warms up with 2 forwards, then alternates
  CHECK_FALSE(one_f_one_b(4, 1)[3].forward);
  for (int stages : {2, 4}) {
    CAPTURE(stages);
    result const staged = run_stages(ex, d, stages);
    CHECK(same_bits(staged.losses, whole.losses));
    CHECK(same_bits(staged.grads, whole.grads));
  }
}

TEST_CASE("stages: two models exchanging only boundary, boundary_grad and tied_grad match the whole model") {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  data const d;
  result const whole = run_whole(ex, d);

  // Two "ranks": stage 0 runs blocks -1 .. 0, stage 1 blocks 1 .. L; each holds every parameter
  // but touches only its own, and sees the other's work only through the copies below.
  tide::memory::device_arena<tide::host> arena0{{.budget = 4_MiB}}, arena1{{.budget = 4_MiB}};
  host_gpt s0(tiny, arena0, {.seed = 3, .in_flight = 2}), s1(tiny, arena1, {.seed = 3, .in_flight = 2});
  s0.zero_grad(ex);
  s1.zero_grad(ex);
  s1.plan_activations(ex, tiny_B, tiny_T);  // its buffers exist before the first receive
  auto const send = [](auto from, auto to) {
    REQUIRE(from.extents() == to.extents());
    std::memcpy(to.data(), from.data(), from.bytes());
  };
  std::vector<float> losses(micro_batches);
  interleave(2, [&](int s, op o) {
    int const slot = o.micro % 2;
    if (s == 0 && o.forward) {
      CHECK(std::isnan(s0.forward_blocks(ex, -1, 0, slot, d.at(o.micro))));
      send(s0.boundary(0, slot), s1.boundary(0, slot));  // x_1 travels forward
    } else if (s == 1 && o.forward) {
      losses[static_cast<std::size_t>(o.micro)] = s1.forward_blocks(ex, 1, 2, slot, d.at(o.micro));
    } else if (s == 1) {
      s1.backward_blocks(ex, 1, 2, slot, loss_scale);
      send(s1.boundary_grad(slot), s0.boundary_grad(slot));  // d x_1 travels back
      send(s1.tied_grad(slot), s0.tied_grad(slot));          // the head's share of d wte
    } else {
      s0.backward_blocks(ex, -1, 0, slot, loss_scale);
    }
  });
  CHECK(same_bits(losses, whole.losses));
  int own_differ = 0, foreign_nonzero = 0;
  for (auto const& p : s0.parameters()) {
    bool const stage0 = p.layer <= 0;
    auto const& mine = stage0 ? s0 : s1;
    auto const& other = stage0 ? s1 : s0;
    own_differ += std::memcmp(mine.grad(p).data(), whole.grads.data() + p.offset / sizeof(float), p.bytes) != 0;
    for (index_t i = 0; i < p.numel(); ++i) foreign_nonzero += other.grad(p).data()[i] != 0.f;
  }
  CHECK(own_differ == 0);
  CHECK(foreign_nonzero == 0);  // stage 1 never wrote wte's gradient: the head's share went to tied_grad
}

TEST_CASE("stages: wrong ranges, slots and orders throw usage errors naming what to pass") {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 4_MiB}};
  host_gpt m(tiny, arena, {.seed = 1, .in_flight = 2});
  data const d;
  CHECK(m.first_block() == -1);
  CHECK(m.last_block() == 2);
  usage([&] { m.forward_blocks(ex, 1, 0, 0, d.at(0)); }, "pass embedding_block (-1) <= first <= last");
  usage([&] { m.forward_blocks(ex, -2, 0, 0, d.at(0)); }, "pass embedding_block (-1) <= first <= last");
  usage([&] { m.forward_blocks(ex, 0, 3, 0, d.at(0)); }, "<= head_block (2)");
  usage([&] { m.forward_blocks(ex, -1, 0, 2, d.at(0)); }, "pass a micro-batch slot in [0, in_flight)");
  usage([&] { m.forward_blocks(ex, -1, 0, -1, d.at(0)); }, "pass a micro-batch slot in [0, in_flight)");
  usage([&] { m.backward_blocks(ex, 0, -1, 0); }, "pass embedding_block (-1) <= first <= last");
  usage([&] { m.backward_blocks(ex, -1, 2, 2); }, "pass a micro-batch slot in [0, in_flight)");
  usage([&] { (void)m.boundary(0, 0); }, "run a forward first");
  // The head needs targets.
  batch no_targets = d.at(0);
  no_targets.targets = {};
  usage([&] { m.forward_blocks(ex, 1, 2, 0, no_targets); }, "the head block needs them");

  CHECK(std::isnan(m.forward_blocks(ex, -1, 0, 1, d.at(0))));
  usage([&] { m.backward_blocks(ex, -1, 2, 1); }, "has no forward to go back through");  // 1 .. 2 did not run
  usage([&] { m.backward_blocks(ex, -1, 0, 0); }, "has no forward to go back through");  // slot 0 did not run
  CHECK(std::isfinite(m.forward_blocks(ex, 1, 2, 1, d.at(0))));
  usage([&] { m.backward_blocks(ex, -1, 0, 1); }, "backward goes from the head down");
  usage([&] { (void)m.boundary(2, 1); }, "pass a block in [embedding_block (-1), L - 1 = 1]");
  usage([&] { (void)m.tied_grad(2); }, "pass a micro-batch slot in [0, in_flight)");
  m.backward_blocks(ex, 1, 2, 1);
  m.backward_blocks(ex, -1, 0, 1);
  usage([&] { m.backward_blocks(ex, -1, 0, 1); }, "has no forward to go back through");  // one backward per forward
  usage([&] { host_gpt(tiny, arena, {.in_flight = 0}); }, "in_flight = 0");
}

TEST_CASE("stages: a split backward (input passes, weight passes later) gives the whole model's gradients") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  data const d;
  result const whole = run_whole(ex, d);
  tide::nn::gpt_options split = whole_options;
  split.split_backward = true;
  result const split_whole = run_whole(ex, d, split);  // backward(): B then W, block by block
  CHECK(same_bits(split_whole.losses, whole.losses));
  CHECK(same_bits(split_whole.grads, whole.grads));
  // The head's halves with and without the tied buffer (without it, W adds the head's share of
  // wte's gradient itself), with wte whole and in two pieces (the products piece by piece).
  for (int pieces : {1, 2})
    for (bool tied : {false, true}) {
      CAPTURE(pieces);
      CAPTURE(tied);
      tide::nn::gpt_config cut = tiny;
      cut.wte_pieces = pieces;
      tide::nn::gpt_options one{.seed = 3, .separate_tied_grad = tied};
      result const want = run_whole(ex, d, one, cut);
      one.split_backward = true;
      result const got = run_whole(ex, d, one, cut);
      CHECK(same_bits(got.losses, want.losses));
      CHECK(same_bits(got.grads, want.grads));
    }

  // Two ranges, every micro-batch in its own slot: each range's weight pass trails its input
  // pass by one micro-batch (as a zero-bubble stage's W lags its B), the last ones at the end.
  for (bool recompute : {false, true}) {
    CAPTURE(recompute);
    tide::memory::device_arena<tide::host> arena{{.budget = 16_MiB}};
    host_gpt m(tiny, arena, {.seed = 3, .in_flight = micro_batches,
                             .recompute = recompute ? tide::nn::block_set({0}) : tide::nn::block_set{},
                             .split_backward = true});
    m.zero_grad(ex);
    auto const r = ranges(2);
    std::vector<float> losses;
    for (int k = 0; k < micro_batches; ++k) {
      (void)m.forward_blocks(ex, r[0].first, r[0].second, k, d.at(k));
      losses.push_back(m.forward_blocks(ex, r[1].first, r[1].second, k, d.at(k)));
      m.backward_input_blocks(ex, r[1].first, r[1].second, k, loss_scale);
      if (k > 0) m.backward_weight_blocks(ex, r[1].first, r[1].second, k - 1);
      m.backward_input_blocks(ex, r[0].first, r[0].second, k, loss_scale);
      if (k > 0) m.backward_weight_blocks(ex, r[0].first, r[0].second, k - 1);
    }
    m.backward_weight_blocks(ex, r[1].first, r[1].second, micro_batches - 1);
    m.backward_weight_blocks(ex, r[0].first, r[0].second, micro_batches - 1);
    CHECK(same_bits(losses, whole.losses));
    CHECK(same_bits(flat_grads(m), whole.grads));
  }

  // Out of order: W before B, W twice, a forward over a slot that owes W, B on a whole model.
  tide::memory::device_arena<tide::host> arena{{.budget = 16_MiB}};
  host_gpt m(tiny, arena, {.seed = 3, .in_flight = 2, .split_backward = true});
  m.zero_grad(ex);
  (void)m.forward_blocks(ex, -1, 2, 0, d.at(0));
  usage([&] { m.backward_weight_blocks(ex, -1, 2, 0); }, "has no input pass to follow");
  m.backward_input_blocks(ex, -1, 2, 0);
  usage([&] { m.backward_input_blocks(ex, -1, 2, 0); }, "has no forward to go back through");
  usage([&] { (void)m.forward_blocks(ex, -1, 2, 0, d.at(1)); }, "still owes its weight pass");
  m.backward_weight_blocks(ex, -1, 2, 0);
  usage([&] { m.backward_weight_blocks(ex, -1, 2, 0); }, "or its weight pass already ran");
  (void)m.forward_blocks(ex, -1, 2, 0, d.at(1));  // the slot is free again
  host_gpt one_pass(tiny, arena, {.seed = 3});
  (void)one_pass.forward(ex, d.at(0));
  usage([&] { one_pass.backward_input_blocks(ex, -1, 2, 0); }, "split_backward = true");
  usage([&] { host_gpt(tiny, arena, {.offload_activations = tide::nn::block_set({0}), .split_backward = true}); },
        "use recompute with a split backward");
}

TEST_CASE("stages: in_flight slots each hold one plan; in_flight = 1 is the plan alone") {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 8_MiB}};
  data const d;
  host_gpt one(tiny, arena, {.seed = 1, .separate_tied_grad = true});  // the plan of each slot of `three`
  host_gpt three(tiny, arena, {.seed = 1, .in_flight = 3});
  (void)one.forward(ex, d.at(0));
  (void)three.forward(ex, d.at(0));
  auto const r1 = one.activations(), r3 = three.activations();
  CHECK(r1.in_flight == 1);
  CHECK(r3.in_flight == 3);
  CHECK(r1.slot_bytes == tide::round_up(r1.footprint, 256));
  CHECK(r3.slot_bytes == r1.slot_bytes);
  CHECK(r3.footprint == 2 * r3.slot_bytes + r1.footprint);
  CHECK(r3.peak_live == 3 * r1.peak_live);
  // Slots do not overlap: slot 2's boundary starts slot_bytes after slot 1's.
  auto const* b1 = reinterpret_cast<std::byte const*>(three.boundary(0, 1).data());
  auto const* b2 = reinterpret_cast<std::byte const*>(three.boundary(0, 2).data());
  CHECK(static_cast<std::size_t>(b2 - b1) == r3.slot_bytes);
}

TEST_CASE("stages: the default whole model keeps no tied buffer; its wte gradient differs only by rounding") {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  data const d;
  tide::memory::device_arena<tide::host> arena{{.budget = 8_MiB}};
  host_gpt plain(tiny, arena, {.seed = 3});
  host_gpt separate(tiny, arena, whole_options);
  host_gpt two(tiny, arena, {.seed = 3, .in_flight = 2});  // in_flight > 1 always has it
  for (host_gpt* m : {&plain, &separate, &two}) (void)m->forward(ex, d.at(0));
  auto const named_tied = [](host_gpt const& m) {
    int n = 0;
    for (std::uint32_t i = 0; i < m.activation_planner().size(); ++i) n += m.activation_planner().name({i}) == "tied.dwte";
    return n;
  };
  CHECK(named_tied(plain) == 0);
  CHECK(named_tied(separate) == 1);
  CHECK(named_tied(two) == 1);
  auto const rp = plain.activations(), rs = separate.activations();
  CHECK(rs.tensors == rp.tensors + 1);
  std::size_t const tied_bytes = std::size_t{24} * 8 * sizeof(float);  // Vp C
  CHECK(rs.footprint - rp.footprint == tied_bytes);
  CHECK(rs.peak_live - rp.peak_live == tied_bytes);
  CHECK(rs.unplanned - rp.unplanned == tied_bytes);
  try {
    (void)plain.tied_grad(0);
    FAIL("expected a usage error");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK_MESSAGE(std::string(e.what()).find("separate_tied_grad = true") != std::string::npos, e.what());
  }
  CHECK(separate.tied_grad(0).extents() == tide::shape(24, 8));

  // The same training: losses and every gradient but wte's bit for bit; wte's gradient sums the
  // head's share straight in (no buffer), which rounds differently, within float rounding.
  result const a = run_whole(ex, d, {.seed = 3});
  result const b = run_whole(ex, d);
  CHECK(same_bits(a.losses, b.losses));
  auto const& wte = plain.parameters()[0];
  REQUIRE(wte.name() == "wte");
  std::size_t const wte_end = wte.end() / sizeof(float);
  REQUIRE(a.grads.size() == b.grads.size());
  CHECK(std::memcmp(a.grads.data() + wte_end, b.grads.data() + wte_end, (a.grads.size() - wte_end) * sizeof(float)) == 0);
  float worst = 0.f, largest = 0.f;
  for (std::size_t i = wte.offset / sizeof(float); i < wte_end; ++i) {
    worst = std::max(worst, std::abs(a.grads[i] - b.grads[i]));
    largest = std::max(largest, std::abs(b.grads[i]));
  }
  MESSAGE("wte gradient, default against separate_tied_grad: largest difference ", worst, " of values up to ", largest);
  CHECK(largest > 0.f);
  CHECK(worst <= 1e-6f * largest);  // a few float roundings of sums of 8 terms
}

// Heap allocations of each of `steps` steady-state steps, after two uncounted ones (the first
// plans the activations, allocates the gradients and grows every kernel's scratch). A step is a
// whole forward + backward in slot 0 and, with in_flight > 1, a 2-stage one in slot 1.
template <class T>
std::vector<long> allocations_per_step(tide::nn::gpt_options const& options, int steps) {
  using model = tide::nn::gpt<tide::host, T, tide::nn::no_hooks>;
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 8_MiB}};
  model m(tiny, arena, options);
  data const d;
  auto const at = [&](int k) {
    batch const b = d.at(k);
    return typename model::batch_type{b.tokens, b.targets};
  };
  auto const step = [&] {
    m.zero_grad(ex);
    (void)m.forward(ex, at(0));
    m.backward(ex, 0.5f);
    if (options.in_flight > 1) {
      (void)m.forward_blocks(ex, -1, 0, 1, at(1));
      (void)m.forward_blocks(ex, 1, 2, 1, at(1));
      m.backward_blocks(ex, 1, 2, 1, 0.5f);
      m.backward_blocks(ex, -1, 0, 1, 0.5f);
    }
  };
  step();
  step();
  std::vector<long> counts;
  counts.reserve(static_cast<std::size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    heap_allocations = 0;
    counting = true;
    step();
    counting = false;
    counts.push_back(heap_allocations.load());
  }
  CHECK(std::isfinite(m.loss()));
  return counts;
}

// Every kernel of the step takes its scratch from the model's plan (kernels/scratch.hpp: the
// overloads that allocate their own are never called), and the model's own code (the plan, the
// slot bookkeeping) allocates once: steps 3 .. 5 allocate nothing, in float and in bf16 (its
// matmuls convert through float copies in the scratch), with and without the tied buffer.
TEST_CASE("stages: a steady-state step allocates nothing on the heap") {
  heap_allocations = 0;
  counting = true;
  std::vector<int> const v(16);  // the counter counts
  counting = false;
  CHECK(heap_allocations.load() == 1);
  CHECK(v.size() == 16);

  auto const check_none = [](std::vector<long> const& c, char const* what) {
    CHECK_MESSAGE((c == std::vector<long>{0, 0, 0}), what, ": heap allocations in steps 3, 4, 5: ", c[0], ", ", c[1],
                  ", ", c[2]);
  };
  check_none(allocations_per_step<float>({.seed = 1, .in_flight = 2}, 3), "float, in_flight 2");
  check_none(allocations_per_step<float>({.seed = 1}, 3), "float, in_flight 1, no tied buffer");
  check_none(allocations_per_step<tide::bf16>({.seed = 1, .in_flight = 2}, 3), "bf16, in_flight 2");
}
