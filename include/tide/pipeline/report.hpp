#pragma once
// A simulated pipeline schedule as text: JSON for tools, an ASCII grid for a terminal, an SVG
// timeline for people (tide-schedule prints all three; docs/pipeline.md shows the pictures).
//
//   auto s = tide::pipeline::zb_h1(4, 8);
//   auto r = tide::pipeline::check(s, {.f = 1, .b = 1, .w = 1});
//   std::string j = tide::pipeline::to_json(s, r, costs);   // makespan, bubble_fraction, stages[], actions[][]
//   std::string a = tide::pipeline::to_ascii(s, r);         // one row per stage, one column per time step
//   std::string g = tide::pipeline::to_svg(s, r);           // the timeline, coloured by action
//
// ASCII: the time step is the shortest action; a cell shows the action that runs in the middle of
// it ("F3", "B3", "W3", "X3" for a whole backward; the chunk after a colon when v > 1) or "." when
// the stage is idle. More than 10,000 columns are refused.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <system_error>

#include "tide/core/error.hpp"
#include "tide/core/text_format.hpp"
#include "tide/offload/report.hpp"
#include "tide/offload/trace_events.hpp"
#include "tide/pipeline/schedule.hpp"
#include "tide/pipeline/simulate.hpp"

namespace tide::pipeline {

namespace detail {

// The shortest text that reads back as v (finite: require_ok checked).
inline std::string number(double v) {
  char buf[32];
  auto const [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc{} ? std::string(buf, end) : std::string("0");
}
// For people (titles, the grid's header): four significant digits.
inline std::string shown(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}
inline std::string label(action a, int chunks) {
  std::string l = a.kind == op::BW ? "X" : std::string(to_string(a.kind));
  l += std::to_string(a.micro);
  if (chunks > 1) l += ":" + std::to_string(a.chunk);
  return l;
}
// The width the SVG's label of an action needs: its text without the kind (the colour says it).
inline double label_px(action a, int chunks) { return 7.0 * static_cast<double>(label(a, chunks).size() - 1) + 4.0; }
inline char const* colour(op k) {
  switch (k) {
    case op::F: return "#4c78a8";
    case op::B: return "#f58518";
    case op::W: return "#54a24b";
    case op::BW: return "#e45756";
  }
  return "#999999";
}
inline void require_ok(schedule const& s, simulation const& r) {
  TIDE_REQUIRE(r.ok() && r.timeline.size() == static_cast<std::size_t>(s.stages), "pipeline report: schedule ", s.name,
               " did not simulate (", to_string(r.found), "); pass the result of check()");
  TIDE_REQUIRE(std::isfinite(r.makespan), "pipeline report: schedule ", s.name, " has a makespan of ", r.makespan,
               "; pass finite costs");
}

}  // namespace detail

inline std::string to_json(schedule const& s, simulation const& r, costs const& c = {}) {
  detail::require_ok(s, r);
  using detail::number;
  std::string j = "{\"schedule\":\"";
  format::append_json_escaped(j, s.name);
  j += "\",\"stages\":" + std::to_string(s.stages) +
                  ",\"micro\":" + std::to_string(s.micro) + ",\"chunks\":" + std::to_string(s.chunks) +
                  ",\"costs\":{\"f\":" + number(c.f) + ",\"b\":" + number(c.b) + ",\"w\":" + number(c.w) +
                  ",\"comm\":" + number(c.comm) + "},\"makespan\":" + number(r.makespan) +
                  ",\"bubble_fraction\":" + number(r.bubble_fraction) + ",\"per_stage\":[";
  for (std::size_t st = 0; st < r.stages.size(); ++st) {
    auto const& x = r.stages[st];
    j += st ? ",{" : "{";
    j += "\"busy\":" + number(x.busy) + ",\"span\":" + number(x.span()) + ",\"idle\":" +
         number(r.makespan - x.busy) + ",\"peak_activations\":" + number(x.peak_activations) + "}";
  }
  j += "],\"actions\":[";
  for (std::size_t st = 0; st < r.timeline.size(); ++st) {
    j += st ? ",[" : "[";
    for (std::size_t i = 0; i < r.timeline[st].size(); ++i) {
      auto const& t = r.timeline[st][i];
      j += i ? ",{" : "{";
      j += "\"op\":\"";
      j += to_string(t.a.kind);
      j += "\",\"micro\":" + std::to_string(t.a.micro) + ",\"chunk\":" + std::to_string(t.a.chunk) +
           ",\"start\":" + number(t.start) + ",\"end\":" + number(t.end) + "}";
    }
    j += "]";
  }
  return j + "]}\n";
}

inline std::string to_ascii(schedule const& s, simulation const& r) {
  detail::require_ok(s, r);
  double step = r.makespan;
  for (auto const& l : r.timeline)
    for (auto const& t : l)
      if (t.end > t.start) step = std::min(step, t.end - t.start);
  TIDE_REQUIRE(step > 0 && r.makespan / step <= 10000, "to_ascii: ", r.makespan / step,
               " columns (the makespan over the shortest action); draw it with to_svg instead");
  auto const columns = static_cast<std::size_t>(std::ceil(r.makespan / step - 1e-9));
  std::size_t width = 2;
  for (auto const& l : r.timeline)
    for (auto const& t : l) width = std::max(width, detail::label(t.a, s.chunks).size() + 1);
  std::string out = std::string(s.name) + ": p = " + std::to_string(s.stages) + ", m = " + std::to_string(s.micro) +
                    (s.chunks > 1 ? ", v = " + std::to_string(s.chunks) : "") + ", makespan " +
                    detail::shown(r.makespan) + ", bubble " + detail::shown(r.bubble_fraction) + "\n";
  for (std::size_t st = 0; st < r.timeline.size(); ++st) {
    std::string row = "stage " + std::to_string(st) + " |";
    for (std::size_t col = 0; col < columns; ++col) {
      double const at = static_cast<double>(col) * step + step / 2;  // the middle of the cell
      std::string cell = ".";
      for (auto const& t : r.timeline[st])
        if (t.start <= at && at < t.end) cell = detail::label(t.a, s.chunks);
      row += cell + std::string(width - cell.size(), ' ');
    }
    out += row + "\n";
  }
  return out;
}

// Elements the tests read: one <rect class="action OP"> per action (OP: F, B, W, BW) with its
// <title>, one <text class="stage-label"> per stage, one <g class="legend OP"> per kind drawn.
inline std::string to_svg(schedule const& s, simulation const& r) {
  detail::require_ok(s, r);
  using format::svg_number;
  // Pixels a time unit: 900 for the whole makespan, or more where the shortest action's label
  // (7 px a character, 2 px either side) would not fit its box; at most 60.
  double fit = 0;
  for (auto const& l : r.timeline)
    for (auto const& t : l)
      if (t.end > t.start) fit = std::max(fit, detail::label_px(t.a, s.chunks) / (t.end - t.start));
  double const left = 70, top = 40, row = 28, right = 20,
               unit = std::clamp(std::max(900.0 / std::max(r.makespan, 1e-9), fit), 4.0, 60.0);
  double const w = left + unit * r.makespan + right, h = top + row * s.stages + 50;
  std::string g = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" +
                  svg_number(w) + "\" height=\"" + svg_number(h) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  g += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  g += "<text x=\"" + svg_number(left) + "\" y=\"22\" font-size=\"14\">" +
       format::xml_escape(std::string(s.name) + ": p = " + std::to_string(s.stages) + ", m = " +
                                   std::to_string(s.micro) + (s.chunks > 1 ? ", v = " + std::to_string(s.chunks) : "") +
                                   ", makespan " + detail::shown(r.makespan) + ", bubble " +
                                   detail::shown(r.bubble_fraction)) +
       "</text>\n";
  bool drawn[4] = {};
  for (std::size_t st = 0; st < r.timeline.size(); ++st) {
    double const y = top + row * static_cast<double>(st);
    g += "<text class=\"stage-label\" x=\"" + svg_number(left - 8) + "\" y=\"" + svg_number(y + row / 2 + 4) +
         "\" text-anchor=\"end\">stage " + std::to_string(st) + "</text>\n";
    for (auto const& t : r.timeline[st]) {
      drawn[static_cast<int>(t.a.kind)] = true;
      double const x = left + unit * t.start, width = unit * (t.end - t.start);
      std::string const l = detail::label(t.a, s.chunks);
      g += "<rect class=\"action " + std::string(to_string(t.a.kind)) + "\" x=\"" + svg_number(x) + "\" y=\"" +
           svg_number(y + 2) + "\" width=\"" + svg_number(std::max(width - 1, 0.5)) + "\" height=\"" +
           svg_number(row - 4) + "\" fill=\"" + detail::colour(t.a.kind) + "\"><title>" + l + " " +
           detail::shown(t.start) + " to " + detail::shown(t.end) + "</title></rect>\n";
      if (width >= detail::label_px(t.a, s.chunks))
        g += "<text x=\"" + svg_number(x + width / 2) + "\" y=\"" + svg_number(y + row / 2 + 4) +
             "\" text-anchor=\"middle\" fill=\"white\">" + l.substr(1) + "</text>\n";
    }
  }
  // Time axis: ticks of 1, 2 or 5 x 10^k.
  double const axis = top + row * s.stages + 6;
  double const tick = format::tick_step(r.makespan * 1.25);
  for (double t = 0; t <= r.makespan + 1e-9; t += tick)
    g += "<text x=\"" + svg_number(left + unit * t) + "\" y=\"" + svg_number(axis + 12) +
         "\" text-anchor=\"middle\" fill=\"#555\">" + detail::shown(t) + "</text>\n";
  double lx = left;
  for (op k : {op::F, op::B, op::W, op::BW}) {
    if (!drawn[static_cast<int>(k)]) continue;
    char const* words = k == op::F ? "forward" : k == op::B ? "backward, input" : k == op::W ? "backward, weights" : "backward";
    g += "<g class=\"legend " + std::string(to_string(k)) + "\"><rect x=\"" + svg_number(lx) + "\" y=\"" +
         svg_number(axis + 22) + "\" width=\"12\" height=\"12\" fill=\"" + detail::colour(k) + "\"/><text x=\"" +
         svg_number(lx + 16) + "\" y=\"" + svg_number(axis + 32) + "\">" + words + "</text></g>\n";
    lx += 140;
  }
  return g + "</svg>\n";
}

}  // namespace tide::pipeline
