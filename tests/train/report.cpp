// The reports: the progress line carries the step's figures; the loss picture is a valid SVG
// with one point per step and one dot per validation loss, and rsvg-convert renders it.

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
}  // namespace

TEST_CASE("the progress line states step, loss, tokens/s, bytes and data moved") {
  tide::train::step_stats s;
  s.step = 12;
  s.loss = 2.5f;
  s.tokens_per_s = 4321;
  s.device_bytes = 48u << 20;
  s.host_bytes = 3u << 20;
  auto const line = tide::train::progress_text(s, 600, 1.25);
  CHECK(line.find("step    12/600") != std::string::npos);
  CHECK(line.find("loss 2.5000") != std::string::npos);
  CHECK(line.find("4321 tok/s") != std::string::npos);
  CHECK(line.find("device 48.0 MiB") != std::string::npos);
  CHECK(line.find("host 3.0 MiB") != std::string::npos);
  CHECK(line.find("moved 1.25 GB") != std::string::npos);
  s.skipped = true;
  CHECK(tide::train::progress_text(s, 600, 0).find("skipped") != std::string::npos);
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
