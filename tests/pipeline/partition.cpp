// The partitioner: its dynamic program equals the best of every cut (L <= 12, p <= 4, random
// layers, with and without a memory limit that forces recompute and swap); the in-flight counts
// follow the schedule; a stage that cannot fit makes the cut infeasible; on a GPT-like model with
// a heavy embedding and head it beats the uniform cut.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "tide/pipeline/partition.hpp"

namespace pp = tide::pipeline;

namespace {

std::vector<pp::layer_cost> random_layers(int n, std::uint32_t seed) {
  std::vector<pp::layer_cost> v;
  std::uint32_t s = seed;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return static_cast<double>(s >> 8) / 16777216.0;
  };
  for (int i = 0; i < n; ++i) {
    double const f = 0.5 + 2 * next();
    auto const act = static_cast<std::size_t>(100 + 900 * next());
    v.push_back({.forward = f, .backward = 2 * f, .activations = act, .input = act / 8,
                 .state = static_cast<std::size_t>(200 + 800 * next()), .swap = next() < 0.5 ? 3 * next() : -1});
  }
  return v;
}

// Every cut of L layers into p stages, the slowest stage of the best one (the same stage costs).
double brute_force(std::vector<pp::layer_cost> const& layers, pp::partition_options const& o) {
  int const L = static_cast<int>(layers.size()), p = o.stages;
  auto const flight = pp::detail::in_flight(o);
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> starts(static_cast<std::size_t>(p), 0);
  auto go = [&](auto&& self, int k, int at) -> void {  // stage k starts at layer `at`
    if (k == p - 1) {
      double worst = 0;
      starts[static_cast<std::size_t>(k)] = at;
      for (int s = 0; s < p; ++s) {
        int const first = starts[static_cast<std::size_t>(s)];
        int const last = s + 1 < p ? starts[static_cast<std::size_t>(s + 1)] - 1 : L - 1;
        worst = std::max(worst, pp::detail::evaluate(layers, first, last, flight[static_cast<std::size_t>(s)], o).time);
      }
      best = std::min(best, worst);
      return;
    }
    starts[static_cast<std::size_t>(k)] = at;
    for (int next = at + 1; next <= L - (p - k - 1); ++next) self(self, k + 1, next);
  };
  go(go, 0, 0);
  return best;
}

}  // namespace

TEST_CASE("the dynamic program equals the best of every cut, with and without a memory limit") {
  int cases = 0, limited = 0;
  for (int L = 1; L <= 12; ++L)
    for (int p = 1; p <= std::min(4, L); ++p)
      for (std::size_t limit : {std::numeric_limits<std::size_t>::max(), std::size_t{6000}, std::size_t{2500}}) {
        CAPTURE(L);
        CAPTURE(p);
        CAPTURE(limit);
        auto const layers = random_layers(L, static_cast<std::uint32_t>(L * 31 + p));
        pp::partition_options const o{.stages = p, .micro = 8, .schedule = pp::kind::one_f_one_b, .memory_limit = limit};
        auto const plan = pp::partition_layers(layers, o);
        double const best = brute_force(layers, o);
        CHECK(plan.slowest == best);
        CHECK(plan.feasible == (best < std::numeric_limits<double>::infinity()));
        if (!plan.feasible) continue;
        ++cases;
        // The plan is a cut: contiguous, covering, each stage within the limit, its time the max.
        int at = 0;
        double worst = 0;
        bool changed = false;
        for (auto const& s : plan.stages) {
          CHECK(s.first == at);
          CHECK(s.memory <= limit);
          worst = std::max(worst, s.time);
          at = s.last + 1;
          for (auto a : s.actions) changed = changed || a != pp::memory_action::keep;
        }
        CHECK(at == L);
        CHECK(worst == plan.slowest);
        limited += changed ? 1 : 0;
      }
  CHECK(cases > 100);
  CHECK(limited > 10);  // the limits made some stages recompute or swap
}

TEST_CASE("in-flight counts follow the schedule; a stage that cannot fit is infeasible") {
  std::vector<pp::layer_cost> const layers(8, {.forward = 1, .backward = 2, .activations = 100, .input = 100,
                                               .state = 50, .swap = -1});
  auto const one = pp::partition_layers(layers, {.stages = 4, .micro = 8, .schedule = pp::kind::one_f_one_b});
  REQUIRE(one.feasible);
  for (int s = 0; s < 4; ++s) CHECK(one.stages[s].in_flight == 4 - s);  // 1F1B: p − s
  auto const g = pp::partition_layers(layers, {.stages = 4, .micro = 8, .schedule = pp::kind::gpipe});
  for (auto const& s : g.stages) {
    CHECK(s.in_flight == 8);  // GPipe: m
    auto const n = static_cast<std::size_t>(s.last - s.first + 1);
    CHECK(s.memory == n * 50 + 8 * n * 100);
  }
  // Nothing can be recomputed (input = activations) or swapped. 1F1B's stage 0 holds 4 micro-
  // batches: one layer there needs 50 + 4·100 = 450 bytes.
  CHECK_FALSE(pp::partition_layers(layers, {.stages = 4, .micro = 8, .memory_limit = 449}).feasible);
  // At 449 with the state offloaded: at most 1, 1, 2 and 4 layers on stages 0 to 3 (400, 300,
  // 200 and 100 bytes a layer): all 8 fit, in exactly that cut.
  auto const offloaded = pp::partition_layers(layers, {.stages = 4, .micro = 8, .memory_limit = 449, .state_offloaded = 1});
  REQUIRE(offloaded.feasible);
  CHECK(offloaded.stages[2].first == 2);
  CHECK(offloaded.stages[3].first == 4);
  CHECK(offloaded.slowest == 4 * 3);
  CHECK_THROWS_AS(pp::partition_layers(layers, {.stages = 9, .micro = 8}), tide::error);
  CHECK_THROWS_WITH_AS(pp::partition_layers(layers, {.stages = 4, .micro = 8, .schedule = pp::kind::interleaved}),
                       doctest::Contains("cuts contiguous layers"), tide::error);
}

TEST_CASE("a GPT-like model: the embedding and the head are heavy; the partitioner beats the uniform cut") {
  // 12 blocks of cost 3 between an embedding of cost 6 and a head of cost 15 (GPT-2's tied
  // vocabulary projection). Uniform: 4, 4, 3, 3 layers, the last stage 2 blocks and the head, 21.
  // Best: the embedding and 3 blocks, 5 blocks, 4 blocks, the head alone: 15.
  std::vector<pp::layer_cost> layers;
  layers.push_back({.forward = 3, .backward = 3, .activations = 10, .input = 1, .state = 100, .swap = -1});
  for (int i = 0; i < 12; ++i) layers.push_back({.forward = 1, .backward = 2, .activations = 10, .input = 1, .state = 10, .swap = -1});
  layers.push_back({.forward = 6, .backward = 9, .activations = 10, .input = 1, .state = 100, .swap = -1});
  pp::partition_options const o{.stages = 4, .micro = 8};
  auto const plan = pp::partition_layers(layers, o);
  auto const uniform = pp::uniform_partition(layers, o);
  CHECK(plan.slowest == 15);
  CHECK(uniform.slowest == 21);
  CHECK(plan.stages.back().first == 13);  // the head alone
}
