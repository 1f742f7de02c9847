// The reports: the progress line carries the step's figures in binary units; the loss picture is
// a valid SVG with one point per step, one dot per validation loss, numbered ticks on both axes,
// the axis titles "step" and "loss", a legend of the series drawn, and rsvg-convert renders it.

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "tide/train/report.hpp"

namespace {
std::size_t count(std::string const& s, std::string const& what) {
  std::size_t n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// The text of each tick group `key` (its label), in order.
std::vector<std::string> tick_labels(std::string const& svg, std::string const& key) {
  std::vector<std::string> out;
  for (auto at = svg.find(key); at != std::string::npos; at = svg.find(key, at + 1)) {
    auto const open = svg.find('>', svg.find("<text", at)) + 1;
    out.push_back(svg.substr(open, svg.find("</text>", open) - open));
  }
  return out;
}

// The number right after the first `key`.
double number_after(std::string const& svg, std::string const& key) {
  auto const at = svg.find(key);
  REQUIRE(at != std::string::npos);
  return std::strtod(svg.c_str() + at + key.size(), nullptr);
}
}  // namespace

TEST_CASE("the progress line states step, loss, tokens/s, bytes and data moved, in binary units") {
  tide::train::step_stats s;
  s.step = 12;
  s.loss = 2.5f;
  s.tokens_per_s = 4321;
  s.device_bytes = 48u << 20;
  s.host_bytes = 3u << 20;
  auto const line = tide::train::progress_text(s, 600, std::size_t{5} << 28);  // 1.25 GiB
  CHECK(line.find("step    12/600") != std::string::npos);
  CHECK(line.find("loss 2.5000") != std::string::npos);
  CHECK(line.find("4321 tok/s") != std::string::npos);
  CHECK(line.find("device 48.0 MiB") != std::string::npos);
  CHECK(line.find("host 3.0 MiB") != std::string::npos);
  CHECK(line.find("moved 1.25 GiB") != std::string::npos);
  CHECK(line.find("GB") == std::string::npos);
  CHECK(line.find("MB") == std::string::npos);
  CHECK(tide::train::progress_text(s, 600, 0).find("moved 0 B") != std::string::npos);
  CHECK(tide::train::progress_text(s, 600, 3u << 19).find("moved 1.50 MiB") != std::string::npos);
  s.skipped = true;
  CHECK(tide::train::progress_text(s, 600, 0).find("skipped") != std::string::npos);

  CHECK(tide::train::progress_text(s, 600, 512).find("moved 512 B") != std::string::npos);
  CHECK(tide::train::progress_text(s, 600, 1536).find("moved 1.50 KiB") != std::string::npos);
  CHECK(tide::train::progress_text(s, 600, std::size_t{1} << 30).find("moved 1.00 GiB") != std::string::npos);
  // 10^9 bytes: binary units, not "1 GB".
  CHECK(tide::train::progress_text(s, 600, 1'000'000'000).find("moved 953.67 MiB") != std::string::npos);
  // A pipelined step adds its measured bubble; without a pipeline (-1) nothing is said.
  CHECK(tide::train::progress_text(s, 600, 0).find("bubble") == std::string::npos);
  s.bubble_fraction = 0.124;
  CHECK(tide::train::progress_text(s, 600, 0).find("bubble 12%") != std::string::npos);
  s.bubble_fraction = -1;

  // progress counts the bytes of every step: 1.5 GiB over two steps.
  std::FILE* sink = std::tmpfile();
  REQUIRE(sink != nullptr);
  tide::train::progress p{sink};
  s.bytes_moved = std::size_t{3} << 28;
  p.update(s, 600);
  p.update(s, 600);
  CHECK(p.bytes_moved() == std::size_t{3} << 29);
  std::fclose(sink);
}

TEST_CASE("the loss picture: a polyline of every step, a dot per validation loss, rendered by rsvg-convert") {
  std::vector<float> losses;
  for (int i = 0; i < 50; ++i) losses.push_back(5.5f - 0.05f * float(i));
  std::vector<std::pair<std::int64_t, float>> validation{{0, 5.5f}, {25, 4.4f}, {50, 3.1f}};
  auto const svg = tide::train::loss_svg(losses, validation, "a <test> & more");
  CHECK(svg.starts_with("<?xml"));
  CHECK(count(svg, "<circle class=\"validation\"") == 3);
  CHECK(svg.find("a &lt;test&gt; &amp; more") != std::string::npos);
  auto const points = svg.substr(svg.find("points=\""));
  CHECK(count(points.substr(0, points.find("\"/>")), ",") == 50);
  CHECK_THROWS_AS((void)tide::train::loss_svg({}, validation, "x"), tide::error);

  // Axes: titled, and numbered ticks: steps 0 .. 50 in whole numbers, losses 3.05 .. 5.5 inside the y ticks.
  CHECK(count(svg, R"(<text class="axis-label")") == 2);
  CHECK(svg.find(R"(text-anchor="middle">step</text>)") != std::string::npos);
  CHECK(svg.find(R"(text-anchor="middle">loss</text>)") != std::string::npos);
  auto const xticks = tick_labels(svg, R"(<g class="xtick">)");
  REQUIRE(xticks.size() >= 5);
  REQUIRE(xticks.size() <= 11);
  CHECK(xticks.front() == "0");
  CHECK(xticks.back() == "50");
  for (auto const& t : xticks) CHECK(t.find('.') == std::string::npos);  // whole steps
  auto const yticks = tick_labels(svg, R"(<g class="ytick">)");
  REQUIRE(yticks.size() >= 3);
  CHECK(std::stod(yticks.front()) <= 3.05);
  CHECK(std::stod(yticks.back()) >= 5.5);
  // The legend lists the two series drawn; without validation losses, only the training loss.
  CHECK(count(svg, R"(<g class="legend )") == 2);
  CHECK(count(svg, R"(<g class="legend validation">)") == 1);
  auto const alone = tide::train::loss_svg(losses, {}, "no validation");
  CHECK(count(alone, R"(<g class="legend )") == 1);
  CHECK(count(alone, R"(<g class="legend train">)") == 1);
  CHECK(count(alone, "<circle") == 0);

  // A resumed run: losses of steps 41 .. 90, validation at 40 and 90; the x axis runs 40 .. 90,
  // the first training point sits on step 41, the first dot on step 40.
  std::vector<std::pair<std::int64_t, float>> later{{40, 3.0f}, {90, 2.5f}};
  auto const resumed = tide::train::loss_svg(losses, later, "resumed", 41);
  auto const rticks = tick_labels(resumed, R"(<g class="xtick">)");
  REQUIRE(!rticks.empty());
  CHECK(rticks.front() == "40");
  CHECK(rticks.back() == "90");
  double const x40 = number_after(resumed, R"(<g class="xtick"><line x1=")");
  double const dot40 = number_after(resumed, R"(<circle class="validation" cx=")");
  CHECK(dot40 == doctest::Approx(x40));
  double const first_point = number_after(resumed, R"(points=")");
  CHECK(first_point > x40);

  auto const dir = std::filesystem::temp_directory_path() / ("tide_report_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  tide::offload::write_file((dir / "loss.svg").string(), svg);
  std::string const cmd = "rsvg-convert -o " + (dir / "loss.png").string() + " " + (dir / "loss.svg").string();
  REQUIRE_MESSAGE(std::system("command -v rsvg-convert > /dev/null") == 0,
                  "rsvg-convert is missing: install librsvg2-bin (./tide installs it)");
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream png(dir / "loss.png", std::ios::binary);
  unsigned char head[24] = {};
  png.read(reinterpret_cast<char*>(head), sizeof head);
  CHECK(head[1] == 'P');
  CHECK(head[2] == 'N');
  CHECK(head[3] == 'G');
  unsigned const width = (unsigned(head[16]) << 24) | (unsigned(head[17]) << 16) | (unsigned(head[18]) << 8) | head[19];
  CHECK(width == 720);
  std::filesystem::remove_all(dir);
}

TEST_CASE("several runs in one picture: a polyline and a legend entry per curve, in its own colour") {
  std::vector<float> a, b;
  for (int i = 0; i < 30; ++i) a.push_back(4.f - 0.05f * float(i)), b.push_back(4.f - 0.04f * float(i));
  b.resize(20);  // a shorter run: the x axis spans the longest
  tide::train::loss_curve const curves[] = {{"dense", a}, {"density 0.01 <sparse>", b}};
  auto const svg = tide::train::loss_curves_svg(curves, {}, "dense against compressed");
  CHECK(count(svg, R"(<polyline class="train")") == 2);
  CHECK(count(svg, R"(<g class="legend train">)") == 2);
  CHECK(svg.find(">dense</text>") != std::string::npos);
  CHECK(svg.find(">density 0.01 &lt;sparse&gt;</text>") != std::string::npos);
  auto const first = svg.find("<polyline"), second = svg.find("<polyline", first + 1);
  auto const colour = [&](std::size_t at) { return svg.substr(svg.find("stroke=\"", at) + 8, 7); };
  CHECK(colour(first) != colour(second));
  auto const xticks = tick_labels(svg, R"(<g class="xtick">)");
  REQUIRE(!xticks.empty());
  CHECK(xticks.back() == "30");
  tide::train::loss_curve const empty[] = {{"dense", a}, {"nothing", {}}};
  CHECK_THROWS_AS((void)tide::train::loss_curves_svg(empty, {}, "x"), tide::error);
}
