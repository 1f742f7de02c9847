#pragma once
// Pictures and files of an offload run: the memory tide of one step as an SVG, and a file
// writer that never leaves a half-written file behind.
//
//   std::string svg = tide::offload::memory_tide_svg(sched.memory_tide(), "chunked<belady>, budget 128 MiB");
//   tide::offload::write_file("docs/offload-memory-tide.svg", svg);
//
// The picture: one bar per moment in step order ("F-1" forward of block -1, "B3" backward of
// block 3, "O0" the optimizer after block 0), non-model bytes (activations, workspaces) at the
// bottom, model data (chunks, optimizer state) stacked on them, the device budget as a
// horizontal line, MiB on the y axis. Self-contained SVG 1.1: no scripts, no external fonts.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <unistd.h>

#include "tide/chunk/memory_tracer.hpp"
#include "tide/core/error.hpp"
#include "tide/offload/stats.hpp"

namespace tide::offload {

namespace detail {

inline std::string svg_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", std::isfinite(v) ? v : 0.0);
  return buf;
}

inline std::string xml_escape(std::string_view s) {
  std::string r;
  for (char c : s) {
    switch (c) {
      case '&': r += "&amp;"; break;
      case '<': r += "&lt;"; break;
      case '>': r += "&gt;"; break;
      case '"': r += "&quot;"; break;
      case '\'': r += "&apos;"; break;
      default: r += c;
    }
  }
  return r;
}

// "F-1", "B3", "O0".
inline std::string moment_label(chunk::moment m) {
  char const p = m.phase == chunk::phase::forward ? 'F' : m.phase == chunk::phase::backward ? 'B' : 'O';
  return tide::detail::concat(p, m.block);
}

// A tick step of 1, 2 or 5 x 10^k MiB giving at most ~8 ticks up to `top` MiB.
inline double tick_step(double top) {
  double const raw = std::max(top, 1e-9) / 8;
  double const p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

}  // namespace detail

// The memory tide of one step (scheduler::memory_tide()) as a standalone SVG 1.1 document.
// Elements the tests read: one <g class="moment"> per sample holding its <rect class="non-model">
// and <rect class="model">; <line class="budget">; per y tick <g class="ytick"> with a line at
// the tick's y and its label "N MiB".
inline std::string memory_tide_svg(std::span<tide_sample const> samples, std::string_view title) {
  TIDE_REQUIRE(!samples.empty(), "memory_tide_svg: no samples; scheduler::memory_tide() is empty until a step "
                                 "has completed (call it after sched.step())");
  using detail::svg_number;
  constexpr double width = 960, height = 480, left = 84, right = 200, top = 44, bottom = 70;
  double const plot_w = width - left - right, plot_h = height - top - bottom;
  constexpr double mib = 1024.0 * 1024.0;
  double highest = 0;
  for (auto const& s : samples)
    highest = std::max({highest, static_cast<double>(s.model_bytes + s.non_model_bytes), static_cast<double>(s.budget)});
  double const step = detail::tick_step(highest / mib * 1.05);
  double const y_max = std::max(step, std::ceil(highest / mib * 1.05 / step) * step);  // MiB at the top
  auto const y_of = [&](double bytes) { return top + plot_h * (1 - bytes / mib / y_max); };
  double const bar = plot_w / static_cast<double>(samples.size());
  std::size_t const label_every = std::max<std::size_t>(1, (samples.size() + 47) / 48);

  std::string s;
  s += tide::detail::concat(R"(<?xml version="1.0" encoding="UTF-8"?>)", '\n',
                            R"(<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width=")", width, R"(" height=")",
                            height, R"(" viewBox="0 0 )", width, ' ', height, R"(" font-family="sans-serif" font-size="11">)",
                            '\n', R"(<rect x="0" y="0" width=")", width, R"(" height=")", height, R"(" fill="#ffffff"/>)",
                            '\n', R"(<text x=")", svg_number(width / 2), R"(" y="24" font-size="15" text-anchor="middle">)",
                            detail::xml_escape(title), "</text>\n");
  // Y axis: ticks, grid lines, labels.
  for (int k = 0; k * step <= y_max + step / 2; ++k) {
    double const v = k * step;
    std::string const y = svg_number(y_of(v * mib));
    s += tide::detail::concat(R"(<g class="ytick"><line x1=")", svg_number(left - 5), R"(" y1=")", y, R"(" x2=")",
                              svg_number(left + plot_w), R"(" y2=")", y, R"(" stroke="#dddddd"/><text x=")",
                              svg_number(left - 8), R"(" y=")", svg_number(y_of(v * mib) + 4),
                              R"(" text-anchor="end">)", v, " MiB</text></g>\n");
  }
  // One stacked bar per moment.
  for (std::size_t i = 0; i < samples.size(); ++i) {
    auto const& m = samples[i];
    double const x = left + bar * static_cast<double>(i), w = std::max(bar * 0.85, 0.5);
    double const nm_top = y_of(static_cast<double>(m.non_model_bytes));
    double const all_top = y_of(static_cast<double>(m.non_model_bytes + m.model_bytes));
    s += tide::detail::concat(
        R"(<g class="moment"><title>)", detail::moment_label(m.at), ": model ", svg_number(static_cast<double>(m.model_bytes) / mib),
        " MiB, non-model ", svg_number(static_cast<double>(m.non_model_bytes) / mib), R"( MiB</title><rect class="non-model" x=")",
        svg_number(x), R"(" y=")", svg_number(nm_top), R"(" width=")", svg_number(w), R"(" height=")",
        svg_number(top + plot_h - nm_top), R"(" fill="#9ecae1"/><rect class="model" x=")", svg_number(x), R"(" y=")",
        svg_number(all_top), R"(" width=")", svg_number(w), R"(" height=")", svg_number(nm_top - all_top),
        R"(" fill="#e6550d"/></g>)", '\n');
    if (i % label_every == 0)
      s += tide::detail::concat(R"(<text x=")", svg_number(x + w / 2), R"(" y=")", svg_number(top + plot_h + 8),
                                R"(" transform="rotate(-90 )", svg_number(x + w / 2), ' ',
                                svg_number(top + plot_h + 8), R"x()" text-anchor="end" font-size="9">)x",
                                detail::moment_label(m.at), "</text>\n");
  }
  // The budget (of the first sample: one step has one budget) and the axes.
  std::string const by = svg_number(y_of(static_cast<double>(samples.front().budget)));
  s += tide::detail::concat(R"(<line class="budget" x1=")", svg_number(left), R"(" y1=")", by, R"(" x2=")",
                            svg_number(left + plot_w), R"(" y2=")", by,
                            R"(" stroke="#d62728" stroke-width="2" stroke-dasharray="6 3"/>)", '\n',
                            R"(<path d="M)", svg_number(left), ' ', svg_number(top), 'V', svg_number(top + plot_h), 'H',
                            svg_number(left + plot_w), R"(" fill="none" stroke="#333333"/>)", '\n',
                            R"(<text x=")", svg_number(left + plot_w / 2), R"(" y=")", svg_number(height - 6),
                            R"(" text-anchor="middle">moments of one step (F: forward, B: backward, O: optimizer; )",
                            "number: block)</text>\n");
  // Legend.
  double const lx = left + plot_w + 16;
  auto const entry = [&](double y, std::string_view swatch, std::string_view text) {
    s += tide::detail::concat(swatch, R"(<text x=")", svg_number(lx + 22), R"(" y=")", svg_number(y + 10), R"(">)",
                              text, "</text>\n");
  };
  entry(top, tide::detail::concat(R"(<rect x=")", svg_number(lx), R"(" y=")", svg_number(top),
                                  R"(" width="14" height="12" fill="#e6550d"/>)"),
        "model data (chunks)");
  entry(top + 22, tide::detail::concat(R"(<rect x=")", svg_number(lx), R"(" y=")", svg_number(top + 22),
                                       R"(" width="14" height="12" fill="#9ecae1"/>)"),
        "non-model (activations)");
  entry(top + 44, tide::detail::concat(R"(<line x1=")", svg_number(lx), R"(" y1=")", svg_number(top + 50), R"(" x2=")",
                                       svg_number(lx + 16), R"(" y2=")", svg_number(top + 50),
                                       R"(" stroke="#d62728" stroke-width="2" stroke-dasharray="6 3"/>)"),
        tide::detail::concat("device budget ", svg_number(static_cast<double>(samples.front().budget) / mib), " MiB"));
  s += "</svg>\n";
  return s;
}

// Writes `text` to `path` through a temporary file in the same directory and a rename, so a
// reader sees the old file or the whole new one. tide::error(io) naming the path on failure.
inline void write_file(std::string const& path, std::string_view text) {
  std::string const tmp = tide::detail::concat(path, ".tmp.", static_cast<long>(::getpid()));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    int const e = errno;
    TIDE_FAIL(io, "write_file: cannot create '", tmp, "' (to write '", path, "'): ", std::strerror(e),
              "; check that the directory exists and is writable");
  }
  int e = 0;
  if (std::fwrite(text.data(), 1, text.size(), f) != text.size()) e = errno != 0 ? errno : EIO;
  if (std::fclose(f) != 0 && e == 0) e = errno != 0 ? errno : EIO;
  if (e == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) e = errno;
  if (e != 0) {
    std::remove(tmp.c_str());
    TIDE_FAIL(io, "write_file: cannot write ", text.size(), " bytes to '", path, "': ", std::strerror(e),
              "; check free space and permissions");
  }
}

}  // namespace tide::offload
