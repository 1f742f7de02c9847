// The thread executor: every schedule (GPipe, 1F1B, interleaved, ZB-H1, ZB-H2, ZB-V, DualPipeV) run on
// threads over nn::gpt gives the losses and gradients of plain gradient accumulation over the same
// micro-batches, bit for bit, with the stages on one-thread pools and the reference on two, with
// the backward whole and split in two (W's running the weight pass apart); a run
// can be repeated; the stages really work at once; the slots a schedule needs are what its
// in-flight peak says; bad arguments are refused with what to pass; a stage that throws stops the
// run without a hang and the next run is exact again.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <tide/memory/device_arena.hpp>
#include <tide/nn/gpt.hpp>
#include <tide/pipeline/executor.hpp>

#include "support/pipeline_data.hpp"

namespace pp = tide::pipeline;
using namespace tide::literals;
using tide::index_t;
using host_gpt = tide::nn::gpt<tide::host>;
using batch = host_gpt::batch_type;

namespace {

constexpr auto config = tide::test::pipeline_gpt;
using data = tide::test::pipeline_micro_batches;

struct result {
  double loss_sum = 0;
  std::vector<float> grads;
};

std::vector<float> grads_of(host_gpt const& m) {
  auto const g = m.flat_grads();
  return {g.data(), g.data() + g.size()};
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Gradient accumulation, micro-batch after micro-batch, on a two-thread pool; the tied buffer
// as the pipeline's model has it.
result accumulate(data const& d, float scale) {
  tide::thread_pool pool{2};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 16_MiB}};
  host_gpt m(config, arena, {.seed = 5, .separate_tied_grad = true});
  m.zero_grad(ex);
  result r;
  for (batch const& b : d.micro) {
    r.loss_sum += static_cast<double>(m.forward(ex, b));
    m.backward(ex, scale);
  }
  r.grads = grads_of(m);
  return r;
}

int weights_in(pp::schedule const& s, int stage) {
  int n = 0;
  for (pp::action const& a : s.per_stage[static_cast<std::size_t>(stage)]) n += a.kind == pp::op::W;
  return n;
}

// split: a model whose backward splits in two, so W's run its weight pass apart from B.
result pipelined(pp::schedule const& s, data const& d, float scale, pp::run_stats* stats = nullptr,
                 bool split = false) {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  bool const apart = split && weights_in(s, 0) > 0;
  pp::thread_executor run{s, pp::uniform_cut(-1, config.layers, s.stages * s.chunks)};
  int const slots = apart ? pp::shared_slots(s) : pp::slots_needed(s, 0);
  REQUIRE(run.slots(apart) == slots);
  host_gpt m(config, arena, {.seed = 5, .in_flight = slots, .split_backward = split});
  m.zero_grad(ex);
  result r;
  r.loss_sum = run.run(m, std::span<batch const>(d.micro), scale);
  r.grads = grads_of(m);
  if (stats != nullptr) *stats = run.last();
  return r;
}

}  // namespace

TEST_CASE("executor: uniform_cut spreads blocks evenly and refuses empty pieces") {
  auto const c = pp::uniform_cut(-1, 6, 3);
  CHECK(c.first == std::vector<int>{-1, 2, 5});
  CHECK(c.last == std::vector<int>{1, 4, 6});
  CHECK(pp::uniform_cut(-1, 2, 4).first == std::vector<int>{-1, 0, 1, 2});
  CHECK_THROWS_WITH_AS(pp::uniform_cut(-1, 2, 5), doctest::Contains("a piece needs at least one block"), tide::error);
}

TEST_CASE("executor: slots_needed is the schedule's in-flight peak on the first stage") {
  CHECK(pp::slots_needed(pp::gpipe(2, 8), 0) == 8);
  CHECK(pp::slots_needed(pp::one_f_one_b(4, 8), 0) == 4);
  CHECK(pp::slots_needed(pp::one_f_one_b(4, 8), 3) == 1);
  CHECK(pp::slots_needed(pp::one_f_one_b(4, 2), 0) == 2);  // m < p: all of them
  CHECK(pp::slots_needed(pp::zb_h1(4, 8), 0) == 4);
  // ZB-H2 holds 2p - 1 on stage 0 at its peak; slots are taken mod n, so it may need more.
  CHECK(pp::slots_needed(pp::zb_h2(4, 8), 0) >= 7);
  for (auto const& s : {pp::gpipe(4, 8), pp::one_f_one_b(4, 8), pp::interleaved(4, 8, 2), pp::zb_h1(4, 8),
                        pp::zb_h2(4, 8), pp::zb_v(4, 8), pp::dualpipe_v(4, 8)}) {
    CAPTURE(s.name);
    auto const sim = pp::simulate(s);
    REQUIRE(sim.ok());
    // Never fewer than the micro-batches stage 0 holds at once (its peak in chunks over v, times v).
    CHECK(pp::slots_needed(s, 0) >= static_cast<int>(std::ceil(sim.stages[0].peak_activations - 1e-9)));
  }
}

TEST_CASE("executor: with W apart, the shared model's slots are the fewest whose waits cost nothing") {
  for (auto const& s : {pp::zb_h1(2, 8), pp::zb_h1(4, 8), pp::zb_h2(2, 8), pp::zb_h2(4, 8), pp::zb_v(2, 8),
                        pp::zb_v(4, 8), pp::dualpipe_v(2, 8)}) {
    CAPTURE(s.name);
    CAPTURE(s.stages);
    int const n = pp::shared_slots(s);
    MESSAGE(s.name, " p = ", s.stages, ": ", n, " shared slots (stage 0 alone holds ", pp::slots_needed(s, 0, true), ")");
    CHECK(n <= s.micro);
    CHECK(n >= pp::slots_needed(s, 0, true));  // never fewer than stage 0 holds itself
    double const free = pp::detail::slot_wait_makespan(s, s.micro);
    CHECK(free == pp::simulate(s, pp::costs{.f = 1, .b = 1, .w = 1, .comm = 0}).makespan);
    CHECK(pp::detail::slot_wait_makespan(s, n) == free);
    CHECK(pp::detail::slot_wait_makespan(s, n - 1) != free);  // longer, or a deadlock (−1)
  }
}

TEST_CASE("executor: every schedule on threads equals gradient accumulation, bit for bit") {
  for (int m : {4, 8}) {
    data const d(m);
    float const scale = 1.f / static_cast<float>(m);  // a power of two: exact
    result const ref = accumulate(d, scale);
    REQUIRE(std::isfinite(ref.loss_sum));
    std::vector<pp::schedule> const all = {pp::gpipe(2, m),      pp::one_f_one_b(2, m), pp::one_f_one_b(4, m),
                                           pp::interleaved(2, m, 2), pp::interleaved(4, m, 2), pp::zb_h1(2, m),
                                           pp::zb_h1(4, m),      pp::zb_h2(2, m),       pp::zb_h2(4, m),
                                           pp::zb_v(2, m),       pp::zb_v(4, m),        pp::dualpipe_v(2, m)};
    for (auto const& [s, split] : [&] {
           std::vector<std::pair<pp::schedule, bool>> runs;
           for (pp::schedule const& s : all)
             for (bool split : {false, true}) runs.emplace_back(s, split);
           return runs;
         }()) {
      CAPTURE(s.name);
      CAPTURE(s.stages);
      CAPTURE(m);
      CAPTURE(split);
      pp::run_stats st;
      result const got = pipelined(s, d, scale, &st, split);
      CHECK(got.loss_sum == ref.loss_sum);
      CHECK(same_bits(got.grads, ref.grads));
      // What the run measured: each stage ran its list, busy within the wall time.
      REQUIRE(st.stages.size() == static_cast<std::size_t>(s.stages));
      for (std::size_t i = 0; i < st.stages.size(); ++i) {
        CHECK(st.stages[i].timeline.size() == s.per_stage[i].size());
        CHECK(st.stages[i].forwards == m * s.chunks);
        // A split model's W's ran its weight pass (timed); otherwise they were folded into B.
        CHECK(st.stages[i].weights == (split ? weights_in(s, static_cast<int>(i)) : 0));
        CHECK(st.stages[i].busy > 0);
        CHECK(st.stages[i].busy <= st.seconds);
      }
      CHECK(st.bubble_fraction > 0);  // stage 1 waits at least for stage 0's first forward
      CHECK(st.bubble_fraction < 1);
      auto const c = st.measured_costs(s.chunks);
      CHECK(c.f > 0);
      CHECK(c.b > 0);
      CHECK((c.w > 0) == (split && weights_in(s, 0) > 0));
    }
  }
}

TEST_CASE("executor: on threads the stages work at once: their busy time summed exceeds the wall time") {
  // Pieces of a few milliseconds (the model above is too small: its pieces take microseconds,
  // and the hand-overs between the stages dominate). A serial executor, running the pieces one
  // after another, can never pass: each stage's busy time is measured on the wall clock, so the
  // pieces' intervals would cover the wall time at most once, whatever else the machine runs.
  constexpr tide::nn::gpt_config big{.layers = 2, .heads = 4, .channels = 128, .vocab = 64, .max_seq = 64};
  constexpr index_t B = 4, T = 64;
  int const m = 8;
  std::vector<std::vector<std::int32_t>> tokens, targets;
  std::vector<batch> micro;
  for (int k = 0; k < m; ++k) {
    tokens.emplace_back(static_cast<std::size_t>(B * T));
    targets.emplace_back(static_cast<std::size_t>(B * T));
    for (std::size_t i = 0; i < tokens.back().size(); ++i) {
      tokens.back()[i] = static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(k)) % big.vocab);
      targets.back()[i] = static_cast<std::int32_t>((i * 5 + 3) % big.vocab);
    }
  }
  for (int k = 0; k < m; ++k)
    micro.push_back({{tokens[std::size_t(k)].data(), {B, T}}, {targets[std::size_t(k)].data(), {B, T}}});
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 256_MiB}};
  for (pp::schedule const& s : {pp::gpipe(2, m), pp::one_f_one_b(2, m)}) {
    CAPTURE(s.name);
    host_gpt model(big, arena, {.seed = 5, .in_flight = pp::slots_needed(s, 0)});
    model.zero_grad(ex);
    pp::thread_executor run{s, pp::uniform_cut(model, s)};
    CHECK(std::isfinite(run.run(model, std::span<batch const>(micro), 1.f / static_cast<float>(m))));
    pp::run_stats const& st = run.last();
    double busy = 0;
    for (auto const& stage : st.stages) busy += stage.busy;
    MESSAGE(s.name, ": the stages busy ", busy, " s in ", st.seconds, " s of wall time");
    CHECK(busy > st.seconds);
  }
}

TEST_CASE("executor: runs accumulate like backward, and repeat exactly after zero_grad") {
  data const d(4);
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  auto const s = pp::one_f_one_b(2, 4);
  host_gpt m(config, arena, {.seed = 5, .in_flight = 2});
  m.zero_grad(ex);
  pp::thread_executor run{s, pp::uniform_cut(m, s)};
  double const first = run.run(m, std::span<batch const>(d.micro), 0.25f);
  auto const once = grads_of(m);
  double const second = run.run(m, std::span<batch const>(d.micro), 0.25f);  // += again
  CHECK(first == second);
  // The reference: the same four micro-batches accumulated twice into one gradient.
  host_gpt ref(config, arena, {.seed = 5, .separate_tied_grad = true});
  ref.zero_grad(ex);
  for (int pass = 0; pass < 2; ++pass)
    for (batch const& b : d.micro) {
      ref.forward(ex, b);
      ref.backward(ex, 0.25f);
    }
  CHECK(same_bits(grads_of(m), grads_of(ref)));
  CHECK_FALSE(same_bits(grads_of(m), once));
  m.zero_grad(ex);
  run.run(m, std::span<batch const>(d.micro), 0.25f);
  CHECK(same_bits(grads_of(m), once));
}

TEST_CASE("executor: bad arguments are refused with what to pass") {
  data const d(4);
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  auto const s = pp::gpipe(2, 4);
  host_gpt few(config, arena, {.seed = 5, .in_flight = 2});
  few.zero_grad(ex);
  pp::thread_executor run{s, pp::uniform_cut(few, s)};
  auto const micro = std::span<batch const>(d.micro);
  CHECK_THROWS_WITH_AS(run.run(few, micro, 1.f), doctest::Contains("build it with gpt_options::in_flight = 4"),
                       tide::error);
  host_gpt fresh(config, arena, {.seed = 5, .in_flight = 4});
  CHECK_THROWS_WITH_AS(run.run(fresh, micro, 1.f), doctest::Contains("call model.zero_grad(ex)"), tide::error);
  fresh.zero_grad(ex);
  CHECK_THROWS_WITH_AS(run.run(fresh, micro.first(3), 1.f), doctest::Contains("pass exactly m"), tide::error);
  CHECK_THROWS_WITH_AS((pp::thread_executor{s, pp::uniform_cut(-1, 6, 3)}), doctest::Contains("has 3 pieces"),
                       tide::error);
  pp::thread_executor short_cut{s, pp::uniform_cut(-1, 5, 2)};
  CHECK_THROWS_WITH_AS(short_cut.run(fresh, micro, 1.f), doctest::Contains("must hold the head"), tide::error);
}

namespace {
// nn::gpt with a fault: the n-th call to backward_blocks (or, split, backward_input_blocks) over a
// range starting at `fail_first` throws (as a kernel or a budget might).
struct faulty : host_gpt {
  using host_gpt::host_gpt;
  int fail_first = 0, fail_at = -1, calls = 0;
  void backward_blocks(tide::exec<tide::host> const& ex, int first, int last, int micro, float scale) {
    if (first == fail_first && calls++ == fail_at) throw std::runtime_error("injected fault");
    host_gpt::backward_blocks(ex, first, last, micro, scale);
  }
  void backward_input_blocks(tide::exec<tide::host> const& ex, int first, int last, int micro, float scale) {
    if (first == fail_first && calls++ == fail_at) throw std::runtime_error("injected fault");
    host_gpt::backward_input_blocks(ex, first, last, micro, scale);
  }
};
}  // namespace

TEST_CASE("executor: a stage that throws stops every stage; parameters stay; the next run is exact") {
  data const d(4);
  result const ref = accumulate(d, 0.25f);
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  // split: W's apart, so the failed run leaves weight passes owed; the executor drops them.
  for (auto const& [s, split] : {std::pair{pp::one_f_one_b(4, 4), false}, std::pair{pp::zb_v(2, 4), false},
                                 std::pair{pp::interleaved(2, 4, 2), false}, std::pair{pp::dualpipe_v(2, 4), false},
                                 std::pair{pp::zb_v(2, 4), true}, std::pair{pp::zb_h1(2, 4), true}}) {
    CAPTURE(s.name);
    CAPTURE(split);
    auto const c = pp::uniform_cut(-1, config.layers, s.stages * s.chunks);
    for (int piece : {0, s.stages * s.chunks - 1}) {
      for (int at : {0, 3}) {
        CAPTURE(piece);
        CAPTURE(at);
        faulty m(config, arena,
                 {.seed = 5, .in_flight = split ? pp::shared_slots(s) : pp::slots_needed(s, 0), .split_backward = split});
        auto const params = m.flat_params();
        std::vector<float> const before(params.data(), params.data() + params.size());
        m.zero_grad(ex);
        m.fail_first = c.first[static_cast<std::size_t>(piece)];
        m.fail_at = at;
        pp::thread_executor run{s, c};
        CHECK_THROWS_WITH_AS(run.run(m, std::span<batch const>(d.micro), 0.25f), "injected fault", std::runtime_error);
        CHECK(std::memcmp(params.data(), before.data(), before.size() * sizeof(float)) == 0);
        m.fail_at = -1;
        m.zero_grad(ex);
        CHECK(run.run(m, std::span<batch const>(d.micro), 0.25f) == ref.loss_sum);
        CHECK(same_bits(grads_of(m), ref.grads));
      }
    }
  }
}
