#pragma once
// Pictures and files of an offload run: the memory tide of one step as an SVG, and a file
// writer that never leaves a half-written file behind.
//
//   std::string svg = tide::offload::memory_tide_svg(sched.memory_tide(), "chunked<belady>, budget 128 MiB",
//                                                    {.first = "emb", .last = "head"});  // nn::gpt's blocks
//   tide::offload::write_file("docs/offload-memory-tide.svg", svg);
//
// The picture: one bar per moment in step order ("F0" forward of block 0, "B3" backward of
// block 3, "O0" the optimizer after block 0; "emb fwd", "head bwd" when the first and last blocks
// are given names), non-model bytes (activations, workspaces) at the bottom, model data (chunks,
// optimizer state) stacked on them, the device budget as a horizontal line, MiB on the y axis;
// under it the bytes each moment fetched and evicted. Self-contained SVG 1.1: no scripts, no
// external fonts.

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
#include "tide/core/text_format.hpp"
#include "tide/offload/stats.hpp"

namespace tide::offload {

namespace detail {

using format::svg_number;
using format::tick_step;
using format::xml_escape;

inline std::string mib_text(std::size_t bytes) { return svg_number(static_cast<double>(bytes) / (1024.0 * 1024.0)); }

}  // namespace detail

// Words for the first and last blocks of a model in the picture's labels; empty: the number.
// nn::gpt's are {"emb", "head"}: block -1 holds the embeddings, block L the final layernorm and
// the tied LM head (nn::gpt_block_uses).
struct block_names {
  std::string_view first;  // the lowest block of the tide
  std::string_view last;   // the highest
};

// "F0", "I3", "B3", "O0" for numbered blocks; "emb fwd", "head bwd", "emb opt" for named ones.
inline std::string moment_label(chunk::moment m, int first_block, int last_block, block_names const& names) {
  std::string_view const name = m.block == first_block ? names.first : m.block == last_block ? names.last : "";
  if (!name.empty())
    return tide::detail::concat(name, m.phase == chunk::phase::forward    ? " fwd"
                                      : m.phase == chunk::phase::backward ? " bwd"
                                      : m.phase == chunk::phase::input    ? " bwd-in"
                                                                          : " opt");
  char const p = m.phase == chunk::phase::forward    ? 'F'
                 : m.phase == chunk::phase::backward ? 'B'
                 : m.phase == chunk::phase::input    ? 'I'
                                                     : 'O';
  return tide::detail::concat(p, m.block);
}

// The axis caption's key: only the phases among the samples ("F: forward, B: backward, ").
inline std::string phases_drawn(std::span<tide_sample const> samples) {
  bool seen[4] = {false, false, false, false};  // by chunk::phase
  for (auto const& x : samples) seen[static_cast<int>(x.at.phase)] = true;
  std::string out;
  if (seen[0]) out += "F: forward, ";
  if (seen[3]) out += "I: backward's input pass, ";
  if (seen[1]) out += "B: backward, ";
  if (seen[2]) out += "O: optimizer, ";
  return out;
}

// The memory tide of one step (scheduler::memory_tide()) as a standalone SVG 1.1 document.
//
// Top: one stacked bar per moment, non-model bytes (activations, workspaces) at the bottom and
// model data on them, the device budget as a dashed line, MiB on the y axis. Below it, when any
// chunk moved, a lane of the bytes each moment fetched (bars up) and evicted (bars down), on a
// scale of its own. The legend lists only the series drawn.
//
// Elements the tests read: one <g class="moment"> per sample holding its <rect class="non-model">
// and <rect class="model">, then <rect class="fetched"> and <rect class="evicted"> for non-zero
// bytes; <line class="budget">; per y tick <g class="ytick"> with a line at the tick's y and its
// label "N MiB"; one <text class="moment-label"> per labelled moment; one <g class="legend NAME">
// per legend entry (NAME: model, non-model, budget, fetched, evicted).
inline std::string memory_tide_svg(std::span<tide_sample const> samples, std::string_view title,
                                   block_names const& names = {}) {
  TIDE_REQUIRE(!samples.empty(), "memory_tide_svg: no samples; scheduler::memory_tide() is empty until a step "
                                 "has completed (call it after sched.step())");
  using detail::mib_text;
  using detail::svg_number;
  constexpr double mib = 1024.0 * 1024.0;
  double highest = 0;
  std::size_t moved_most = 0, fetched = 0, evicted = 0, model = 0, non_model = 0;
  int first_block = samples.front().at.block, last_block = first_block;
  for (auto const& s : samples) {
    highest = std::max({highest, static_cast<double>(s.model_bytes + s.non_model_bytes), static_cast<double>(s.budget)});
    moved_most = std::max({moved_most, s.fetched_bytes, s.evicted_bytes});
    fetched += s.fetched_bytes;
    evicted += s.evicted_bytes;
    model += s.model_bytes;
    non_model += s.non_model_bytes;
    first_block = std::min(first_block, s.at.block);
    last_block = std::max(last_block, s.at.block);
  }
  std::size_t const budget = samples.front().budget;  // one step has one budget
  bool const lane = moved_most > 0;                   // the fetched / evicted lane

  constexpr double width = 960, left = 84, right = 220, top = 44, plot_h = 366, plot_w = width - left - right;
  constexpr double lane_half = 28, lane_gap = 14;
  double const lane_mid = top + plot_h + lane_gap + lane_half;
  double const labels_y = lane ? lane_mid + lane_half + 8 : top + plot_h + 8;
  double const height = labels_y + 62;
  double const step = detail::tick_step(highest / mib * 1.05);
  double const y_max = std::max(step, std::ceil(highest / mib * 1.05 / step) * step);  // MiB at the top
  auto const y_of = [&](double bytes) { return top + plot_h * (1 - bytes / mib / y_max); };
  auto const lane_px = [&](std::size_t bytes) {
    return lane_half * static_cast<double>(bytes) / static_cast<double>(std::max<std::size_t>(moved_most, 1));
  };
  double const bar = plot_w / static_cast<double>(samples.size());
  std::size_t const label_every = std::max<std::size_t>(1, (samples.size() + 47) / 48);
  auto const label = [&](chunk::moment m) { return moment_label(m, first_block, last_block, names); };

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
  // The lane's baseline and scale: the largest bytes one moment moved, up and down.
  if (lane) {
    std::string const mid = svg_number(lane_mid), most = mib_text(moved_most);
    s += tide::detail::concat(
        R"(<line class="lane" x1=")", svg_number(left), R"(" y1=")", mid, R"(" x2=")", svg_number(left + plot_w),
        R"(" y2=")", mid, R"(" stroke="#999999"/>)", '\n', R"(<text x=")", svg_number(left - 8), R"(" y=")",
        svg_number(lane_mid - lane_half + 8), R"(" text-anchor="end" font-size="9">)", most, " MiB</text>\n",
        R"(<text x=")", svg_number(left - 8), R"(" y=")", svg_number(lane_mid + 4),
        R"(" text-anchor="end" font-size="9">moved</text>)", '\n', R"(<text x=")", svg_number(left - 8), R"(" y=")",
        svg_number(lane_mid + lane_half), R"(" text-anchor="end" font-size="9">)", most, " MiB</text>\n");
  }
  // One stacked bar per moment, and what it moved.
  for (std::size_t i = 0; i < samples.size(); ++i) {
    auto const& m = samples[i];
    double const x = left + bar * static_cast<double>(i), w = std::max(bar * 0.85, 0.5);
    double const nm_top = y_of(static_cast<double>(m.non_model_bytes));
    double const all_top = y_of(static_cast<double>(m.non_model_bytes + m.model_bytes));
    s += tide::detail::concat(
        R"(<g class="moment"><title>)", label(m.at), ": model ", mib_text(m.model_bytes), " MiB, non-model ",
        mib_text(m.non_model_bytes), " MiB; fetched ", mib_text(m.fetched_bytes), " MiB, evicted ",
        mib_text(m.evicted_bytes), R"( MiB</title><rect class="non-model" x=")", svg_number(x), R"(" y=")",
        svg_number(nm_top), R"(" width=")", svg_number(w), R"(" height=")", svg_number(top + plot_h - nm_top),
        R"(" fill="#9ecae1"/><rect class="model" x=")", svg_number(x), R"(" y=")", svg_number(all_top),
        R"(" width=")", svg_number(w), R"(" height=")", svg_number(nm_top - all_top), R"(" fill="#e6550d"/>)");
    if (m.fetched_bytes > 0)
      s += tide::detail::concat(R"(<rect class="fetched" x=")", svg_number(x), R"(" y=")",
                                svg_number(lane_mid - lane_px(m.fetched_bytes)), R"(" width=")", svg_number(w),
                                R"(" height=")", svg_number(lane_px(m.fetched_bytes)), R"(" fill="#31a354"/>)");
    if (m.evicted_bytes > 0)
      s += tide::detail::concat(R"(<rect class="evicted" x=")", svg_number(x), R"(" y=")", svg_number(lane_mid),
                                R"(" width=")", svg_number(w), R"(" height=")", svg_number(lane_px(m.evicted_bytes)),
                                R"(" fill="#756bb1"/>)");
    s += "</g>\n";
    if (i % label_every == 0)
      s += tide::detail::concat(R"(<text class="moment-label" x=")", svg_number(x + w / 2), R"(" y=")",
                                svg_number(labels_y), R"(" transform="rotate(-90 )", svg_number(x + w / 2), ' ',
                                svg_number(labels_y), R"x()" text-anchor="end" font-size="9">)x", label(m.at),
                                "</text>\n");
  }
  // The budget and the axes.
  if (budget > 0) {
    std::string const by = svg_number(y_of(static_cast<double>(budget)));
    s += tide::detail::concat(R"(<line class="budget" x1=")", svg_number(left), R"(" y1=")", by, R"(" x2=")",
                              svg_number(left + plot_w), R"(" y2=")", by,
                              R"(" stroke="#d62728" stroke-width="2" stroke-dasharray="6 3"/>)", '\n');
  }
  s += tide::detail::concat(R"(<path d="M)", svg_number(left), ' ', svg_number(top), 'V', svg_number(top + plot_h), 'H',
                            svg_number(left + plot_w), R"(" fill="none" stroke="#333333"/>)", '\n',
                            R"(<text x=")", svg_number(left + plot_w / 2), R"(" y=")", svg_number(height - 6),
                            R"(" text-anchor="middle">moments of one step ()", phases_drawn(samples),
                            "then the block number)</text>\n");
  // Legend: only what is drawn.
  double const lx = left + plot_w + 16;
  double ly = top;
  auto const entry = [&](std::string_view name, std::string_view swatch, std::string_view text) {
    s += tide::detail::concat(R"(<g class="legend )", name, R"(">)", swatch, R"(<text x=")", svg_number(lx + 22),
                              R"(" y=")", svg_number(ly + 10), R"(">)", text, "</text></g>\n");
    ly += 22;
  };
  auto const box = [&](std::string_view colour) {
    return tide::detail::concat(R"(<rect x=")", svg_number(lx), R"(" y=")", svg_number(ly),
                                R"(" width="14" height="12" fill=")", colour, R"("/>)");
  };
  if (model > 0) entry("model", box("#e6550d"), "model data (chunks)");
  if (non_model > 0) entry("non-model", box("#9ecae1"), "non-model (activations)");
  if (budget > 0)
    entry("budget",
          tide::detail::concat(R"(<line x1=")", svg_number(lx), R"(" y1=")", svg_number(ly + 6), R"(" x2=")",
                               svg_number(lx + 16), R"(" y2=")", svg_number(ly + 6),
                               R"(" stroke="#d62728" stroke-width="2" stroke-dasharray="6 3"/>)"),
          tide::detail::concat("device budget ", mib_text(budget), " MiB"));
  if (fetched > 0)
    entry("fetched", box("#31a354"), tide::detail::concat("fetched (up): ", mib_text(fetched), " MiB"));
  if (evicted > 0)
    entry("evicted", box("#756bb1"), tide::detail::concat("evicted (down): ", mib_text(evicted), " MiB"));
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
