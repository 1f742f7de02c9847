// memory_tracer: the warm-up step becomes the trace; a differing step invalidates it and the
// next complete step is recorded again; the per-moment chunk budget looks one moment ahead.

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "tide/chunk/memory_tracer.hpp"
#include "tide/core/error.hpp"

namespace {

using tide::chunk::memory_tracer;
using tide::chunk::moment;
using tide::chunk::phase;

struct step_moment {
  moment m;
  std::vector<std::uint32_t> chunks;
  std::size_t non_model;
};

std::vector<step_moment> gpt_like() {
  return {{{-1, phase::forward}, {0}, 100},  {{0, phase::forward}, {1}, 300},  {{1, phase::forward}, {2}, 500},
          {{1, phase::backward}, {2, 5}, 450}, {{0, phase::backward}, {1, 4}, 250}, {{-1, phase::backward}, {0, 3}, 120}};
}

void run(memory_tracer& tr, std::vector<step_moment> const& step) {
  tr.begin_step();
  for (auto const& s : step) {
    std::size_t const t = tr.at(s.m, s.chunks);
    tr.non_model(t, s.non_model / 2);
    tr.non_model(t, s.non_model);  // the largest sample is kept
  }
  tr.end_step();
}

}  // namespace

TEST_CASE("the warm-up step becomes the trace, with its non-model peaks") {
  memory_tracer tr{{.device_budget = 1000, .reserved = 50}};
  tr.set_chunks(6);
  CHECK(!tr.warm());
  CHECK(tr.recording());
  run(tr, gpt_like());
  REQUIRE(tr.warm());
  CHECK(!tr.recording());
  CHECK(tr.moments() == 6);
  CHECK(tr.steps_recorded() == 1);
  CHECK(tr.peak_non_model() == 500);
  CHECK(tr.moment_at(3) == moment{1, phase::backward});
  CHECK(tr.trace().touched(3).size() == 2);
  CHECK(tr.trace().touched(3)[1] == 5);
  // budget - max(this, next) - reserved, cyclically.
  CHECK(tr.chunk_budget(0) == 1000 - 300 - 50);
  CHECK(tr.chunk_budget(2) == 1000 - 500 - 50);
  CHECK(tr.chunk_budget(4) == 1000 - 250 - 50);
  CHECK(tr.chunk_budget(5) == 1000 - 120 - 50);  // wraps to moment 0 (100)
}

TEST_CASE("replaying the same step keeps the trace and its figures") {
  memory_tracer tr{{.device_budget = 1000}};
  tr.set_chunks(6);
  run(tr, gpt_like());
  auto steps = gpt_like();
  for (auto& s : steps) s.non_model = 999;  // replayed steps do not overwrite the warm-up figures
  run(tr, steps);
  CHECK(tr.invalidations() == 0);
  CHECK(tr.steps_recorded() == 1);
  CHECK(tr.peak_non_model() == 500);
}

TEST_CASE("a step with another moment sequence invalidates the trace and records itself") {
  memory_tracer tr{{.device_budget = 1000}};
  tr.set_chunks(6);
  run(tr, gpt_like());
  auto other = gpt_like();
  other[4].chunks = {1, 3, 4};  // block 0's backward touches another chunk
  run(tr, other);
  CHECK(tr.invalidations() == 1);
  CHECK(tr.steps_recorded() == 2);
  REQUIRE(tr.warm());
  CHECK(tr.trace().touched(4).size() == 3);
  CHECK(tr.trace().touched(0).size() == 1);  // the matching prefix was kept
  CHECK(tr.non_model_at(0) == 100);
  // A step that stops short of the trace also invalidates it.
  auto shorter = other;
  shorter.pop_back();
  run(tr, shorter);
  CHECK(tr.invalidations() == 2);
  CHECK(!tr.warm());
  run(tr, gpt_like());
  CHECK(tr.warm());
  CHECK(tr.steps_recorded() == 3);
}

TEST_CASE("chunk_budget before any warm-up is a usage error; a budget smaller than the non-model data gives 0") {
  memory_tracer tr{{.device_budget = 400}};
  tr.set_chunks(6);
  CHECK_THROWS_AS((void)tr.chunk_budget(0), tide::error);
  run(tr, gpt_like());
  CHECK(tr.chunk_budget(2) == 0);
}
