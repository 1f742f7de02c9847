// The memory tide picture of a real run: 3 steps of a tiny GPT under chunked<belady> at a budget
// just above its minimum. The SVG has one bar per moment labelled in words for the embeddings and
// the head, its budget line sits where the y axis puts the budget, no bar crosses it, and
// rsvg-convert renders it to a PNG of the declared size. The fetched / evicted lane and the legend
// show only what a tide holds. write_file replaces files whole and names the path when it cannot.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parallel.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/offload/report.hpp"
#include "support/files.hpp"
#include "support/gpt_steps.hpp"
#include "tide/offload/scheduler.hpp"

namespace {

using namespace tide::literals;
using tide::host;
namespace off = tide::offload;
namespace fs = std::filesystem;

constexpr tide::nn::gpt_config config{.layers = 3, .heads = 2, .channels = 32, .vocab = 64, .max_seq = 16};
constexpr tide::index_t batch = 2, seq = 16;
constexpr std::size_t chunk_bytes = 20_KiB;

std::vector<std::int32_t> batch_of(int s) { return tide::test::token_runs(s, batch, seq, config.vocab); }

std::size_t activation_bytes() { return tide::test::activation_bytes(config, batch, seq); }

// nn::gpt's first and last blocks: the embeddings (-1) and the final layernorm + head (L).
constexpr off::block_names gpt_names{.first = "emb", .last = "head"};

using cfg_t = off::chunked<off::belady>;
using sched_t = off::scheduler<host, float, cfg_t>;

struct tide_run {
  std::vector<off::tide_sample> samples;
  std::size_t budget = 0;
  std::size_t bytes_moved = 0;
};

// Three steps at the minimum budget + 4 KiB; the tide of the last one.
tide_run run_tight() {
  cfg_t const cfg{.chunk_bytes = chunk_bytes};
  std::size_t minimum = 0;
  {
    tide::thread_pool pool{1};
    tide::exec<host> ex{pool};
    tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
    sched_t probe{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config), cfg};
    minimum = probe.minimum_device_bytes(activation_bytes());
  }
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = minimum + 4_KiB}};
  sched_t sched{ex,  arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
                cfg, {}, tide::optim::adamw{.lr = 3e-3f}};
  tide::nn::gpt<host, float, off::hooks<sched_t>> model{config, arena, {.seed = 7}, {&sched}};
  for (int s = 0; s < 3; ++s) {
    auto const data = batch_of(s);
    tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
    (void)model.forward(ex, x, y);
    model.backward(ex);
    sched.step();
  }
  auto const t = sched.memory_tide();
  return {{t.begin(), t.end()}, minimum + 4_KiB, sched.last_step().bytes_moved()};
}

std::size_t count(std::string_view s, std::string_view what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string_view::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// The number in attribute `name` of the first element at or after `from`.
double attribute(std::string_view s, std::size_t from, std::string_view name) {
  std::string const key = std::string(" ") + std::string(name) + "=\"";
  auto const p = s.find(key, from);
  REQUIRE(p != std::string_view::npos);
  return std::strtod(std::string(s.substr(p + key.size(), 32)).c_str(), nullptr);
}

struct tick {
  double y, mib;
};

std::vector<tick> ticks(std::string_view s) {
  std::vector<tick> out;
  std::string_view const key = R"(<g class="ytick">)";
  for (auto p = s.find(key); p != std::string_view::npos; p = s.find(key, p + 1)) {
    double const y = attribute(s, p, "y1");
    auto const label = s.find("\">", s.find("<text", p)) + 2;
    out.push_back({y, std::strtod(std::string(s.substr(label, 32)).c_str(), nullptr)});
  }
  return out;
}

std::uint32_t big_endian(std::string_view b, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

}  // namespace

TEST_CASE("the memory tide of a tight chunked<belady> run: one bar per moment, the budget where the axis says") {
  auto const run = run_tight();
  REQUIRE(run.bytes_moved > 0);  // the budget is tight: chunks moved in the last step
  // A moment per block in forward and in backward: embeddings, 3 layers, head.
  REQUIRE(run.samples.size() == 2 * static_cast<std::size_t>(config.layers + 2));
  std::string const svg = off::memory_tide_svg(run.samples, "chunked<belady> & a tight budget", gpt_names);

  CHECK(svg.starts_with("<?xml"));
  CHECK(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\"") != std::string::npos);
  CHECK(svg.find("chunked&lt;belady&gt; &amp; a tight budget") != std::string::npos);
  CHECK(svg.find("<script") == std::string::npos);
  CHECK(svg.find("@font-face") == std::string::npos);
  CHECK(count(svg, R"(<g class="moment">)") == run.samples.size());
  CHECK(count(svg, R"(<rect class="model")") == run.samples.size());
  CHECK(count(svg, R"(<rect class="non-model")") == run.samples.size());
  CHECK(count(svg, R"(<line class="budget")") == 1);
  // Labels: words for the embeddings (block -1) and the head (block 3 = L), F/B and the number
  // for the layers; one per moment.
  CHECK(count(svg, R"(<text class="moment-label")") == run.samples.size());
  for (auto const* label : {">emb fwd<", ">F0<", ">F2<", ">head fwd<", ">head bwd<", ">B1<", ">emb bwd<"})
    CHECK_MESSAGE(svg.find(label) != std::string::npos, label);
  CHECK(svg.find(">F-1<") == std::string::npos);
  CHECK(svg.find(">B3<") == std::string::npos);
  // The axis caption explains only the phases drawn: no optimizer moment here, no "O:".
  CHECK(svg.find("(F: forward, B: backward, then the block number)") != std::string::npos);
  CHECK(svg.find("O: optimizer") == std::string::npos);
  // Unnamed, the numbers stay.
  std::string const numbered = off::memory_tide_svg(run.samples, "numbers");
  CHECK(numbered.find(">F-1<") != std::string::npos);
  CHECK(numbered.find(">B3<") != std::string::npos);
  // The legend: model data, non-model, budget; fetched / evicted only if this tide moved bytes.
  CHECK(count(svg, R"(<g class="legend model">)") == 1);
  CHECK(count(svg, R"(<g class="legend non-model">)") == 1);
  CHECK(count(svg, R"(<g class="legend budget">)") == 1);
  bool const fetched = std::ranges::any_of(run.samples, [](auto const& m) { return m.fetched_bytes > 0; });
  bool const evicted = std::ranges::any_of(run.samples, [](auto const& m) { return m.evicted_bytes > 0; });
  CHECK(count(svg, R"(<g class="legend fetched">)") == (fetched ? 1u : 0u));
  CHECK(count(svg, R"(<g class="legend evicted">)") == (evicted ? 1u : 0u));

  // The y axis from its ticks: 0 MiB at the bottom, linear upwards.
  auto const t = ticks(svg);
  REQUIRE(t.size() >= 3);
  CHECK(t.front().mib == 0);
  double const px_per_mib = (t.front().y - t.back().y) / t.back().mib;
  REQUIRE(px_per_mib > 0);
  for (auto const& k : t) CHECK(k.y == doctest::Approx(t.front().y - k.mib * px_per_mib).epsilon(1e-3));
  auto const y_of = [&](std::size_t bytes) { return t.front().y - static_cast<double>(bytes) / 1_MiB * px_per_mib; };

  auto const budget_at = svg.find(R"(<line class="budget")");
  double const budget_y = attribute(svg, budget_at, "y1");
  CHECK(budget_y == doctest::Approx(y_of(run.budget)).epsilon(1e-3));
  CHECK(attribute(svg, budget_at, "y2") == budget_y);

  // Each bar: finite, non-negative, the stack as tall as the sample's bytes, under the budget.
  std::size_t at = 0;
  for (auto const& sample : run.samples) {
    at = svg.find(R"(<g class="moment">)", at + 1);
    REQUIRE(at != std::string::npos);
    auto const nm = svg.find(R"(<rect class="non-model")", at), model = svg.find(R"(<rect class="model")", at);
    for (auto const* name : {"x", "y", "width", "height"}) {
      CHECK(std::isfinite(attribute(svg, nm, name)));
      CHECK(std::isfinite(attribute(svg, model, name)));
    }
    CHECK(attribute(svg, nm, "height") >= 0);
    CHECK(attribute(svg, model, "height") >= 0);
    CHECK(attribute(svg, nm, "y") == doctest::Approx(y_of(sample.non_model_bytes)).epsilon(1e-3));
    CHECK(attribute(svg, model, "y") ==
          doctest::Approx(y_of(sample.non_model_bytes + sample.model_bytes)).epsilon(1e-3));
    CHECK(sample.model_bytes + sample.non_model_bytes <= run.budget);
    CHECK(attribute(svg, model, "y") >= budget_y - 0.01);
  }
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(svg.find("inf") == std::string::npos);

  // Rendered by librsvg: a PNG of the declared 960 x 480.
  int const found = std::system("command -v rsvg-convert > /dev/null 2>&1");
  if (found != 0)
    FAIL("rsvg-convert is not installed: the memory tide SVG cannot be checked by a renderer; install Debian's "
         "librsvg2-bin (./tide test installs it)");
  tide::test::scratch_dir dir{"report"};
  auto const svg_path = dir.path / "tide.svg", png_path = dir.path / "tide.png";
  off::write_file(svg_path.string(), svg);
  CHECK(tide::test::file_text(svg_path) == svg);
  std::string const cmd = "rsvg-convert -o '" + png_path.string() + "' '" + svg_path.string() + "'";
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "rsvg-convert refused the SVG: " << cmd);
  std::string const png = tide::test::file_text(png_path);
  REQUIRE(png.size() > 33);
  CHECK(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  CHECK(png.substr(12, 4) == "IHDR");
  CHECK(big_endian(png, 16) == 960);
  CHECK(big_endian(png, 20) == static_cast<std::uint32_t>(attribute(svg, svg.find("<svg "), "height")));
}

TEST_CASE("memory tide: bytes fetched and evicted per moment, a legend entry only for a series drawn") {
  using tide::chunk::moment;
  using tide::chunk::phase;
  // Four moments of a model with blocks 0 .. 1: nothing moved.
  std::vector<off::tide_sample> t{{.at = moment{0, phase::forward}, .model_bytes = 2_MiB, .non_model_bytes = 1_MiB, .budget = 4_MiB},
                                  {.at = moment{1, phase::forward}, .model_bytes = 2_MiB, .non_model_bytes = 1_MiB, .budget = 4_MiB},
                                  {.at = moment{1, phase::backward}, .model_bytes = 3_MiB, .non_model_bytes = 1_MiB, .budget = 4_MiB},
                                  {.at = moment{0, phase::backward}, .model_bytes = 3_MiB, .non_model_bytes = 1_MiB, .budget = 4_MiB}};
  std::string const still = off::memory_tide_svg(t, "nothing moved");
  CHECK(count(still, R"(<rect class="fetched")") == 0);
  CHECK(count(still, R"(<rect class="evicted")") == 0);
  CHECK(still.find("legend fetched") == std::string::npos);
  CHECK(still.find("legend evicted") == std::string::npos);
  CHECK(still.find(R"(<line class="lane")") == std::string::npos);  // no lane when nothing moved
  CHECK(still.find(">F0<") != std::string::npos);
  CHECK(still.find(">B1<") != std::string::npos);

  // Fetches at two moments, one eviction: a bar up per fetch, a bar down per eviction, scaled to
  // the largest (3 MiB fills the half-lane), and both in the legend with their totals.
  t[0].fetched_bytes = 3_MiB;
  t[2].fetched_bytes = 1_MiB + 512_KiB;
  std::string const fetching = off::memory_tide_svg(t, "fetched only", {.first = "in", .last = "out"});
  CHECK(count(fetching, R"(<rect class="fetched")") == 2);
  CHECK(count(fetching, R"(<rect class="evicted")") == 0);
  CHECK(count(fetching, R"(<g class="legend fetched">)") == 1);
  CHECK(fetching.find("legend evicted") == std::string::npos);
  CHECK(fetching.find("fetched (up): 4.50 MiB") != std::string::npos);
  CHECK(fetching.find(">in fwd<") != std::string::npos);
  CHECK(fetching.find(">out bwd<") != std::string::npos);
  auto const first = fetching.find(R"(<rect class="fetched")");
  auto const second = fetching.find(R"(<rect class="fetched")", first + 1);
  CHECK(attribute(fetching, second, "height") == doctest::Approx(attribute(fetching, first, "height") / 2));
  auto const lane = fetching.find(R"(<line class="lane")");
  REQUIRE(lane != std::string::npos);
  double const mid = attribute(fetching, lane, "y1");
  CHECK(attribute(fetching, first, "y") + attribute(fetching, first, "height") == doctest::Approx(mid));

  t[3].evicted_bytes = 2_MiB;
  std::string const both = off::memory_tide_svg(t, "fetched and evicted");
  CHECK(count(both, R"(<rect class="evicted")") == 1);
  CHECK(count(both, R"(<g class="legend evicted">)") == 1);
  CHECK(both.find("evicted (down): 2.00 MiB") != std::string::npos);
  auto const up = both.find(R"(<rect class="fetched")"), down = both.find(R"(<rect class="evicted")");
  CHECK(attribute(both, down, "y") == doctest::Approx(attribute(both, both.find(R"(<line class="lane")"), "y1")));
  CHECK(attribute(both, down, "height") == doctest::Approx(attribute(both, up, "height") * 2 / 3).epsilon(1e-3));
  // The tooltip of each moment states its bytes.
  CHECK(both.find("B0: model 3.00 MiB, non-model 1.00 MiB; fetched 0.00 MiB, evicted 2.00 MiB") != std::string::npos);

  // No budget, no model data: neither is drawn nor listed.
  for (auto& m : t) m.budget = 0, m.model_bytes = 0;
  std::string const bare = off::memory_tide_svg(t, "bare");
  CHECK(bare.find(R"(<line class="budget")") == std::string::npos);
  CHECK(bare.find("legend budget") == std::string::npos);
  CHECK(bare.find("legend model") == std::string::npos);
  CHECK(count(bare, R"(<g class="legend non-model">)") == 1);
}

TEST_CASE("memory_tide_svg refuses an empty tide") {
  try {
    (void)off::memory_tide_svg({}, "nothing");
    FAIL("an empty tide was drawn");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(std::string(e.what()).find("memory_tide") != std::string::npos);
  }
}

TEST_CASE("write_file replaces the file whole, leaves no temporary, and names the path it cannot write") {
  tide::test::scratch_dir dir{"report"};
  auto const p = (dir.path / "out.txt").string();
  off::write_file(p, "first version, longer than the second");
  off::write_file(p, "second");
  CHECK(tide::test::file_text(p) == "second");
  std::size_t files = 0;
  for (auto const& e : fs::directory_iterator(dir.path)) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);

  auto const missing = (dir.path / "no_such_dir" / "x.svg").string();
  try {
    off::write_file(missing, "x");
    FAIL("a write into a missing directory succeeded");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::io);
    CHECK(std::string(e.what()).find(missing) != std::string::npos);
  }
  CHECK(!fs::exists(missing));
}
