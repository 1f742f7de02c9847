// The simulated schedule as text: the ASCII grid of a small 1F1B, cell by cell; the JSON's figures
// and one entry per action; the SVG's one rect per action with the legend of the kinds drawn;
// a schedule that did not simulate is refused.

#include <doctest/doctest.h>

#include <string>

#include "tide/pipeline/report.hpp"

namespace pp = tide::pipeline;

namespace {
std::size_t count(std::string const& s, std::string const& what) {
  std::size_t n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("the ASCII grid: a row per stage, a cell per time step, '.' where the stage idles") {
  auto const s = pp::one_f_one_b(2, 3);
  auto const r = pp::check(s);
  CHECK(pp::to_ascii(s, r) ==
        "one_f_one_b: p = 2, m = 3, makespan 12, bubble 0.25\n"
        "stage 0 |F0 F1 .  .  X0 X0 F2 X1 X1 .  X2 X2 \n"
        "stage 1 |.  F0 X0 X0 F1 X1 X1 F2 X2 X2 .  .  \n");
  auto const v = pp::interleaved(2, 2, 2);
  CHECK(pp::to_ascii(v, pp::check(v)).find("F0:1") != std::string::npos);  // the chunk after a colon
}

TEST_CASE("the JSON and the SVG hold every action; a failed simulation is refused") {
  auto const s = pp::zb_h1(3, 5);
  pp::costs const c{.f = 1, .b = 1, .w = 0.5, .comm = 0.25};
  auto const r = pp::check(s, c);
  auto const j = pp::to_json(s, r, c);
  CHECK(j.starts_with("{\"schedule\":\"zb_h1\",\"stages\":3,\"micro\":5,\"chunks\":1,"));
  CHECK(j.find("\"makespan\":" + std::to_string(static_cast<int>(r.makespan))) != std::string::npos);
  CHECK(count(j, "\"op\":") == 3 * 5 * 3);  // F, B and W of 5 micro-batches on 3 stages
  CHECK(count(j, "\"peak_activations\":") == 3);
  auto const g = pp::to_svg(s, r);
  CHECK(count(g, "<rect class=\"action ") == 45);
  CHECK(count(g, "<text class=\"stage-label\"") == 3);
  CHECK(count(g, "<g class=\"legend ") == 3);  // F, B, W; no whole backward here
  CHECK(count(g, "<g class=\"legend BW\"") == 0);

  auto broken = pp::one_f_one_b(2, 2);
  broken.per_stage[0].pop_back();
  auto const bad = pp::simulate(broken);
  CHECK_THROWS_WITH_AS(pp::to_json(broken, bad), doctest::Contains("did not simulate"), tide::error);
}

TEST_CASE("the SVG is wide enough for every action's label, DualPipeV's half-length chunks too") {
  for (auto const& s : {pp::dualpipe_v(4, 8), pp::zb_v(4, 8), pp::one_f_one_b(4, 8)}) {
    auto const r = pp::check(s, {.f = 1, .b = 1, .w = 1});
    auto const g = pp::to_svg(s, r);
    CAPTURE(s.name);
    CHECK(count(g, "<rect class=\"action ") == count(g, "fill=\"white\">"));  // a white label on each
  }
}

TEST_CASE("the ASCII grid skips actions of no duration and refuses a grid too wide to read") {
  auto const s = pp::zb_h1(2, 3);
  auto const free_w = pp::check(s, {.f = 1, .b = 1, .w = 0});  // W costs nothing: not drawn
  CHECK(pp::to_ascii(s, free_w).find("W0") == std::string::npos);
  auto const tiny = pp::check(s, {.f = 1e-6, .b = 1, .w = 1});
  CHECK_THROWS_WITH_AS(pp::to_ascii(s, tiny), doctest::Contains("draw it with to_svg"), tide::error);
  CHECK(pp::to_svg(s, tiny).find("<svg") != std::string::npos);
}
