// The schedules and their simulation: with F = B = W = 1 the makespans, spans and activation peaks
// are the closed forms (GPipe and 1F1B 3(m + p − 1), ZB-H1 3m + p − 1, ZB-H2 a gapless span of
// 3m per stage, ZB-V 3m + (p − 1)/2, interleaved 3m + 3(p − 1)/v; peaks m, p, p, 2p − 1, p,
// p + (p − 1)/v), checked at
// compile time where they can be; a communication cost and unequal costs move them as the
// formulas say; broken schedules (a missing backward, a duplicate, a deadlock, an action out of
// range, a malformed shape) are named; impossible shapes are refused.

#include <doctest/doctest.h>

#include <algorithm>

#include "tide/pipeline/schedule.hpp"
#include "tide/pipeline/simulate.hpp"

namespace pp = tide::pipeline;

namespace {

constexpr double makespan(pp::schedule const& s, pp::costs const& c = {}) { return pp::simulate(s, c).makespan; }
constexpr double peak(pp::schedule const& s, int stage) {
  return pp::simulate(s).stages[static_cast<std::size_t>(stage)].peak_activations;
}

// At compile time: the closed forms for F = B = W = 1 (research notes, part A).
static_assert(makespan(pp::gpipe(4, 8)) == 33);        // 3 (m + p − 1)
static_assert(makespan(pp::one_f_one_b(4, 8)) == 33);
static_assert(makespan(pp::one_f_one_b(8, 32)) == 117);
static_assert(makespan(pp::zb_h1(4, 8)) == 27);        // 3m + p − 1
static_assert(makespan(pp::zb_h1(8, 32)) == 103);
static_assert(peak(pp::gpipe(4, 8), 0) == 8);          // m: every forward before any backward
static_assert(peak(pp::one_f_one_b(4, 8), 0) == 4);    // p
static_assert(peak(pp::one_f_one_b(4, 8), 3) == 1);    // p − s
static_assert(peak(pp::zb_h1(4, 8), 0) == 4);          // p, as 1F1B
static_assert(pp::simulate(pp::one_f_one_b(1, 5)).bubble_fraction == 0);  // one stage: no bubble
static_assert(makespan(pp::generate<pp::kind::zb_h1, 4, 8>()) == 27);  // the shape as template arguments
static_assert(makespan(pp::generate<pp::kind::interleaved, 4, 8, 2>()) == 28.5);
static_assert(makespan(pp::interleaved(4, 8, 2)) == 28.5);  // 3m + 3(p − 1)/v
static_assert(pp::simulate(pp::zb_h2(4, 8)).stages[0].span() == 24);  // 3m: no gap on the stage
static_assert(peak(pp::zb_h2(4, 8), 0) == 7);          // 2p − 1
static_assert(makespan(pp::zb_v(4, 8)) == 25.5);       // 3m + (p − 1)/2
static_assert(peak(pp::zb_v(4, 8), 0) == 4);           // p
static_assert(peak(pp::interleaved(4, 8, 2), 0) == 5.5);    // p + (p − 1)/v

}  // namespace

TEST_CASE("the closed forms over a grid of shapes, F = B = W = 1") {
  for (int p : {1, 2, 3, 4, 8, 16})
    for (int m : {1, 2, 5, 8, 32, 48}) {
      CAPTURE(p);
      CAPTURE(m);
      auto const g = pp::check(pp::gpipe(p, m));
      auto const o = pp::check(pp::one_f_one_b(p, m));
      auto const z = pp::check(pp::zb_h1(p, m));
      CHECK(g.makespan == 3 * (m + p - 1));
      CHECK(o.makespan == 3 * (m + p - 1));
      // (p − 1)/(m + p − 1): each stage idles 3(p − 1) of 3(m + p − 1)
      CHECK(o.bubble_fraction == doctest::Approx(double(p - 1) / (m + p - 1)));
      for (int s = 0; s < p; ++s) {
        CAPTURE(s);
        CHECK(g.stages[s].peak_activations == m);
        CHECK(o.stages[s].peak_activations == std::min(p - s, m));
        CHECK(z.stages[s].peak_activations <= p);
        CHECK(o.stages[s].busy == 3 * m);
      }
      if (m >= p) {  // ZB-H1 needs its warm-up of p − s forwards to fill the pipe
        CHECK(z.makespan == 3 * m + p - 1);
        CHECK(z.stages[0].peak_activations == p);
      } else {
        CHECK(z.makespan <= o.makespan);
      }
    }
}

TEST_CASE("ZB-H2: every stage busy without a gap for 3m once m >= 2p, peak 2p − 1 on every stage") {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 3, 8, 16, 32}) {
      CAPTURE(p);
      CAPTURE(m);
      auto const r = pp::check(pp::zb_h2(p, m));  // valid for every m
      if (m < 2 * p) continue;
      CHECK(r.makespan <= pp::check(pp::zb_h1(p, m)).makespan);
      CHECK(r.makespan == 3 * m + p - 1);  // the stagger only
      for (int s = 0; s < p; ++s) {
        CAPTURE(s);
        CHECK(r.stages[s].span() == 3 * m);
        CHECK(r.stages[s].peak_activations == 2 * p - 1);  // a warm-up of 2(p − s) − 1, W 2s behind
      }
    }
}

TEST_CASE("ZB-V: two chunks per stage in a V; 3m + (p − 1)/2 once m >= p, at most p held") {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 5, 8, 16, 32}) {
      CAPTURE(p);
      CAPTURE(m);
      auto const s = pp::zb_v(p, m);
      CHECK(s.chunks == 2);
      CHECK(s.piece(0, 1) == 2 * p - 1);  // stage 0 holds the last piece too
      auto const r = pp::check(s);  // valid for every m
      for (auto const& st : r.stages) CHECK(st.peak_activations <= p);
      if (m < p) continue;
      CHECK(r.makespan == 3 * m + (p - 1) / 2.0);
      CHECK(r.stages[0].peak_activations == p);
      CHECK(r.makespan <= pp::check(pp::zb_h1(p, m)).makespan);
      // Unequal costs still run (the order holds for any costs).
      CHECK(pp::check(s, {.f = 1, .b = 2, .w = 0.5, .comm = 0.1}).ok());
    }
}

TEST_CASE("DualPipeV: the V in DualPipe's eight phases; each chunk in order; 3m + (p − 1)/2 at every p") {
  static_assert(pp::simulate(pp::dualpipe_v(4, 8)).makespan == 25.5);
  for (int p : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16})
    for (int m : {2 * p, 2 * p + 1, 3 * p, 4 * p + 8}) {
      CAPTURE(p);
      CAPTURE(m);
      auto const s = pp::dualpipe_v(p, m);
      CHECK(s.chunks == 2);
      CHECK(s.place == pp::placement::v_shape);
      auto const r = pp::check(s);
      CHECK(r.makespan == 3 * m + (p - 1) / 2.0);  // half ZB-H1's stagger
      CHECK(r.makespan <= pp::check(pp::zb_v(p, m)).makespan);
      for (auto const& st : r.stages) CHECK(st.peak_activations <= p + 0.5);
      // Every stage runs each chunk's forwards, and its backwards, in micro-batch order.
      for (auto const& list : s.per_stage) {
        int f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {-1, -1}, split = 0;
        for (pp::action const a : list) {
          auto const c = static_cast<std::size_t>(a.chunk);
          if (a.kind == pp::op::F) CHECK(a.micro == f[c]++);
          if (a.kind == pp::op::B || a.kind == pp::op::BW) CHECK(a.micro == b[c]++);
          if (a.kind == pp::op::W) CHECK(a.micro > w[c]);  // W's of the split backwards, in order
          if (a.kind == pp::op::W) w[c] = a.micro;
          split += a.kind == pp::op::B;
        }
        CHECK(f[0] == m);
        CHECK(b[1] == m);
        CHECK(split >= 1);  // zero-bubble B / W splits in phases 3, 6 and 7
      }
    }
  CHECK_THROWS_WITH_AS(pp::dualpipe_v(4, 7), doctest::Contains("needs m >= 2p = 8"), tide::error);
  CHECK(pp::generate(pp::kind::dualpipe_v, 2, 4).name == "dualpipe_v");
}

TEST_CASE("interleaved 1F1B: bubble (p − 1)/(vm + p − 1), peak p + (p − 1)/v on stage 0 (v > 1)") {
  for (int p : {2, 4, 8})
    for (int v : {1, 2, 3, 4})
      for (int g : {1, 2, 4}) {
        int const m = g * p;
        CAPTURE(p);
        CAPTURE(v);
        CAPTURE(m);
        auto const r = pp::check(pp::interleaved(p, m, v));
        CHECK(r.makespan == doctest::Approx(3.0 * m + 3.0 * (p - 1) / v));
        CHECK(r.bubble_fraction == doctest::Approx(double(p - 1) / (v * m + p - 1)));
        if (m > p)  // Megatron's p + (p − 1)/v; with one chunk, 1F1B's p
          CHECK(r.stages[0].peak_activations == doctest::Approx(v == 1 ? p : p + double(p - 1) / v));
        if (v == 1) CHECK(pp::interleaved(p, m, 1).per_stage == pp::one_f_one_b(p, m).per_stage);
      }
  CHECK_THROWS_WITH_AS(pp::interleaved(4, 6, 2), doctest::Contains("m a multiple of p"), tide::error);
  CHECK_THROWS_AS(pp::interleaved(4, 8, 0), tide::error);
}

TEST_CASE("a communication cost and unequal costs move the makespan as the formulas say") {
  int const p = 4, m = 8;
  // GPipe with F = 1, B + W = 2 and a send of c between stages: 3(m + p − 1) + 2(p − 1)c, the
  // critical path crossing p − 1 links forward and p − 1 back. 1F1B has no forwards to spare
  // in its steady state: each backward on stage 0 waits for a round trip, so the sends show
  // more (and it never beats GPipe).
  for (double c : {0.0, 0.5, 2.0}) {
    CAPTURE(c);
    pp::costs const k{.f = 1, .b = 1, .w = 1, .comm = c};
    double const g = pp::check(pp::gpipe(p, m), k).makespan;
    CHECK(g == doctest::Approx(3 * (m + p - 1) + 2 * (p - 1) * c));
    double const o = pp::check(pp::one_f_one_b(p, m), k).makespan;
    CHECK(o >= g);
    if (c == 0) CHECK(o == g);
  }
  // Bubble of 1F1B and GPipe: (p − 1)(F + B + W) per stage; ZB-H1's: (p − 1)(F + B − W).
  pp::costs const k{.f = 1.0, .b = 1.5, .w = 0.5};
  double const work = m * (k.f + k.b + k.w);
  CHECK(pp::check(pp::gpipe(p, m), k).makespan == doctest::Approx(work + (p - 1) * (k.f + k.b + k.w)));
  CHECK(pp::check(pp::one_f_one_b(p, m), k).makespan == doctest::Approx(work + (p - 1) * (k.f + k.b + k.w)));
  CHECK(pp::check(pp::zb_h1(p, m), k).makespan == doctest::Approx(work + (p - 1) * (k.f + k.b - k.w)));
}

TEST_CASE("a broken schedule is named: missing, duplicate, mixed, out of range, deadlock") {
  auto broken = [](auto edit) {
    auto s = pp::one_f_one_b(3, 4);
    edit(s);
    return pp::simulate(s);
  };
  auto missing = broken([](pp::schedule& s) { s.per_stage[1].pop_back(); });
  CHECK(missing.found == pp::problem::missing);
  CHECK(missing.stage == 1);
  auto twice = broken([](pp::schedule& s) { s.per_stage[2].push_back(s.per_stage[2].front()); });
  CHECK(twice.found == pp::problem::duplicate);
  auto mixed = broken([](pp::schedule& s) { s.per_stage[0].push_back({pp::op::W, 0, 0}); });
  CHECK(mixed.found == pp::problem::mixed);
  auto outside = broken([](pp::schedule& s) { s.per_stage[0][0].micro = 4; });
  CHECK(outside.found == pp::problem::out_of_range);
  // Stage 0 runs its backward of micro-batch 0 before its first forward: it waits for stage 1,
  // which waits for stage 0's forward.
  auto stuck = broken([](pp::schedule& s) {
    auto& l = s.per_stage[0];
    auto const bw = std::find(l.begin(), l.end(), pp::action{pp::op::BW, 0, 0});
    std::rotate(l.begin(), bw, bw + 1);
  });
  CHECK(stuck.found == pp::problem::deadlock);
  CHECK(stuck.stage == 0);
  CHECK(stuck.at == pp::action{pp::op::BW, 0, 0});
  auto s = pp::one_f_one_b(3, 4);
  s.per_stage[1].pop_back();
  CHECK_THROWS_WITH_AS(pp::check(s), doctest::Contains("without its forward or its backward"), tide::error);
  // A hand-built schedule of the wrong shape is named, not run: a list too many, none, a V of 3.
  auto extra = pp::one_f_one_b(3, 4);
  extra.per_stage.push_back(extra.per_stage[0]);
  CHECK(pp::simulate(extra).found == pp::problem::malformed);
  auto none = pp::one_f_one_b(3, 4);
  none.per_stage.clear();
  CHECK(pp::simulate(none).found == pp::problem::malformed);
  auto vee = pp::one_f_one_b(3, 4);
  vee.place = pp::placement::v_shape;
  vee.chunks = 3;
  CHECK(pp::simulate(vee).found == pp::problem::malformed);
}

TEST_CASE("impossible shapes are refused at run time with what to pass") {
  CHECK_THROWS_WITH_AS(pp::generate(pp::kind::zb_h1, 4, 8, 2), doctest::Contains("pass v = 1"), tide::error);
  CHECK(pp::generate(pp::kind::interleaved, 4, 8, 2).chunks == 2);
  CHECK_THROWS_WITH_AS(pp::gpipe(0, 4), doctest::Contains("pass p >= 1 and m >= 1"), tide::error);
  CHECK_THROWS_AS(pp::one_f_one_b(2, 0), tide::error);
  CHECK_THROWS_AS(pp::zb_h1(-1, 3), tide::error);
}
