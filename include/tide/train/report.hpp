#pragma once
// What a training run shows: one progress line per step (updated in place on a terminal, plain
// lines otherwise) and the loss curve as an SVG written beside the run.
//
//   tide::train::progress progress{stdout};                // a terminal: \r updates; else lines
//   progress.update(stats, total_steps);                    // every step
//   progress.line(stats, total_steps, " val 2.31");         // a kept line (every N steps)
//   tide::offload::write_file("run/loss.svg", tide::train::loss_svg(losses, validation, "title"));
//   tide::train::loss_curves_svg(curves, {}, "dense against compressed");  // several runs in one

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/text_format.hpp"
#include "tide/offload/report.hpp"
#include "tide/train/step_stats.hpp"

namespace tide::train {

// "step   120/500  loss 2.4512  5230 tok/s  device 46.1 MiB  host 39.0 MiB  moved 1.92 GiB"; the
// bytes moved host <-> device so far in bytes_of's binary units; with data parallelism,
// "  reduced 474.6 MiB/step" after it.
inline std::string progress_text(step_stats const& s, std::int64_t total, std::size_t moved_bytes) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %5lld/%lld  loss %.4f  %6.0f tok/s  device %.1f MiB  host %.1f MiB  moved %s%s",
                static_cast<long long>(s.step), static_cast<long long>(total), static_cast<double>(s.loss),
                s.tokens_per_s, static_cast<double>(s.device_bytes) / (1 << 20),
                static_cast<double>(s.host_bytes) / (1 << 20), tide::detail::concat(bytes_of{moved_bytes}).c_str(),
                s.skipped ? "  (skipped: overflow)" : "");
  std::string out = buf;
  if (s.bytes_reduced != 0) out += tide::detail::concat("  reduced ", bytes_of{s.bytes_reduced}, "/step");
  if (s.bubble_fraction >= 0) out += tide::detail::concat("  bubble ", static_cast<int>(s.bubble_fraction * 100 + 0.5), "%");
  return out;
}

class progress {
 public:
  explicit progress(std::FILE* out) : out_(out), tty_(::isatty(::fileno(out)) != 0) {}
  // `terminal` said by the caller: under mpiexec every rank's stdout is a pseudo-terminal, even
  // when mpiexec's own output goes to a file.
  progress(std::FILE* out, bool terminal) : out_(out), tty_(terminal) {}
  [[nodiscard]] bool terminal() const noexcept { return tty_; }

  // The step's line: in place on a terminal, nothing otherwise (line() keeps lines).
  void update(step_stats const& s, std::int64_t total) {
    moved_ += s.bytes_moved;
    if (!tty_) return;
    std::fprintf(out_, "\r\033[K%s", progress_text(s, total, moved_).c_str());
    std::fflush(out_);
  }
  // A line that stays (with `extra` appended): replaces the in-place line on a terminal.
  void line(step_stats const& s, std::int64_t total, std::string_view extra = {}) {
    std::fprintf(out_, "%s%s%.*s\n", tty_ ? "\r\033[K" : "", progress_text(s, total, moved_).c_str(),
                 static_cast<int>(extra.size()), extra.data());
    std::fflush(out_);
  }
  // Bytes moved host <-> device over every update() so far.
  [[nodiscard]] std::size_t bytes_moved() const noexcept { return moved_; }

 private:
  std::FILE* out_;
  bool tty_;
  std::size_t moved_ = 0;
};

// One training curve of a picture: its words in the legend and its loss per step.
struct loss_curve {
  std::string_view label;        // "training loss", "density 0.01"
  std::span<float const> loss;   // loss[i]: the loss of step first_step + i
};

// Training curves (lines, one colour each) and validation losses at their steps (dots), as SVG
// 1.1: several runs compared in one picture (bench/compress draws dense against compressed).
// A validation loss at step s is measured after s steps (0: before training). The x axis is in
// steps, the y axis in loss, both with ticks. Elements the tests read: one <polyline
// class="train"> per curve, one <circle class="validation"> per value, per tick <g class="xtick">
// / <g class="ytick"> holding a line and its number, the axis titles <text class="axis-label">,
// and one <g class="legend NAME"> per series drawn (train per curve, validation).
inline std::string loss_curves_svg(std::span<loss_curve const> curves,
                                   std::span<std::pair<std::int64_t, float> const> validation, std::string_view title,
                                   std::int64_t first_step = 1) {
  TIDE_REQUIRE(!curves.empty() && std::all_of(curves.begin(), curves.end(), [](loss_curve const& c) { return !c.loss.empty(); }),
               "loss_svg: no training losses");
  static constexpr char const* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd",
                                            "#8c564b", "#e377c2", "#7f7f7f", "#17becf"};
  using format::svg_number;
  double const w = 720, h = 360, left = 64, right = 20, top = 40, bottom = 52;
  double hi = -1e300, lo = 1e300;
  std::size_t steps = 0;
  for (loss_curve const& c : curves) {
    steps = std::max(steps, c.loss.size());
    for (float v : c.loss)
      if (std::isfinite(v)) hi = std::max(hi, double(v)), lo = std::min(lo, double(v));
  }
  std::size_t drawn_validation = 0;
  for (auto const& [s, v] : validation)
    if (std::isfinite(v)) hi = std::max(hi, double(v)), lo = std::min(lo, double(v)), ++drawn_validation;
  if (hi < lo) lo = 0, hi = 1;  // nothing finite
  double const y_step = format::tick_step(std::max(hi - lo, 0.1));  // at most ~8 ticks
  lo = std::max(0.0, std::floor(lo / y_step) * y_step);
  hi = std::max(lo + y_step, std::ceil(hi / y_step) * y_step);
  // Steps on x: from the first step drawn (a validation at step 0 included) to the last.
  double first = static_cast<double>(first_step), last = static_cast<double>(first_step) + double(steps) - 1;
  for (auto const& [s, v] : validation)
    if (std::isfinite(v)) first = std::min(first, double(s)), last = std::max(last, double(s));
  if (last <= first) last = first + 1;
  auto x = [&](double step) { return left + (w - left - right) * (step - first) / (last - first); };
  auto y = [&](double v) { return top + (h - top - bottom) * (hi - v) / (hi - lo); };
  double const bottom_y = h - bottom;
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" +
                  svg_number(w) + "\" height=\"" + svg_number(h) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + svg_number(left) + "\" y=\"22\" font-size=\"14\">" + format::xml_escape(title) + "</text>\n";
  // Y ticks: grid lines and loss values.
  for (double v = lo; v <= hi + y_step * 1e-6; v += y_step) {
    s += "<g class=\"ytick\"><line x1=\"" + svg_number(left - 4) + "\" x2=\"" + svg_number(w - right) + "\" y1=\"" +
         svg_number(y(v)) + "\" y2=\"" + svg_number(y(v)) + "\" stroke=\"#ddd\"/><text x=\"" + svg_number(left - 7) +
         "\" y=\"" + svg_number(y(v) + 4) + "\" text-anchor=\"end\">" + svg_number(v) + "</text></g>\n";
  }
  // X ticks: whole steps, 1, 2 or 5 x 10^k apart.
  double const x_step = std::max(1.0, format::tick_step((last - first) * 1.25));  // ~6-10 ticks
  for (double t = std::ceil(first / x_step) * x_step; t <= last + 1e-9; t += x_step) {
    s += "<g class=\"xtick\"><line x1=\"" + svg_number(x(t)) + "\" x2=\"" + svg_number(x(t)) + "\" y1=\"" +
         svg_number(bottom_y) + "\" y2=\"" + svg_number(bottom_y + 5) + "\" stroke=\"#333\"/><text x=\"" +
         svg_number(x(t)) + "\" y=\"" + svg_number(bottom_y + 18) + "\" text-anchor=\"middle\">" +
         std::to_string(static_cast<std::int64_t>(t)) + "</text></g>\n";
  }
  // Axes and their titles.
  s += "<path d=\"M" + svg_number(left) + " " + svg_number(top) + "V" + svg_number(bottom_y) + "H" +
       svg_number(w - right) + "\" fill=\"none\" stroke=\"#333\"/>\n";
  s += "<text class=\"axis-label\" x=\"" + svg_number((left + w - right) / 2) + "\" y=\"" + svg_number(h - 8) +
       "\" text-anchor=\"middle\">step</text>\n";
  double const mid_y = (top + bottom_y) / 2;
  s += "<text class=\"axis-label\" x=\"16\" y=\"" + svg_number(mid_y) + "\" transform=\"rotate(-90 16 " +
       svg_number(mid_y) + ")\" text-anchor=\"middle\">loss</text>\n";
  for (std::size_t k = 0; k < curves.size(); ++k) {
    s += tide::detail::concat("<polyline class=\"train\" fill=\"none\" stroke=\"", colours[k % std::size(colours)],
                              "\" stroke-width=\"1.5\" points=\"");
    for (std::size_t i = 0; i < curves[k].loss.size(); ++i)
      if (std::isfinite(curves[k].loss[i]))
        s += svg_number(x(static_cast<double>(first_step) + double(i))) + "," + svg_number(y(curves[k].loss[i])) + " ";
    s += "\"/>\n";
  }
  for (auto const& [step, v] : validation)
    if (std::isfinite(v))
      s += "<circle class=\"validation\" cx=\"" + svg_number(x(double(step))) + "\" cy=\"" + svg_number(y(v)) +
           "\" r=\"4\" fill=\"#d62728\"/>\n";
  // Legend: the series drawn.
  double const lx = w - right - 170;
  for (std::size_t k = 0; k < curves.size(); ++k) {
    double const ly = top + 10 + 18 * double(k);
    s += "<g class=\"legend train\"><line x1=\"" + svg_number(lx) + "\" x2=\"" + svg_number(lx + 18) + "\" y1=\"" +
         svg_number(ly) + "\" y2=\"" + svg_number(ly) + "\" stroke=\"" + colours[k % std::size(colours)] +
         "\" stroke-width=\"1.5\"/><text x=\"" + svg_number(lx + 24) + "\" y=\"" + svg_number(ly + 4) + "\">" +
         format::xml_escape(curves[k].label) + "</text></g>\n";
  }
  double const vy = top + 10 + 18 * double(curves.size());
  if (drawn_validation > 0)
    s += "<g class=\"legend validation\"><circle cx=\"" + svg_number(lx + 9) + "\" cy=\"" + svg_number(vy) +
         "\" r=\"4\" fill=\"#d62728\"/><text x=\"" + svg_number(lx + 24) + "\" y=\"" + svg_number(vy + 4) +
         "\">validation loss</text></g>\n";
  s += "</svg>\n";
  return s;
}

// The loss curve of one run: training loss per step (train[i] is step first_step + i) and
// validation losses at their steps.
inline std::string loss_svg(std::span<float const> train, std::span<std::pair<std::int64_t, float> const> validation,
                            std::string_view title, std::int64_t first_step = 1) {
  loss_curve const one{"training loss", train};
  return loss_curves_svg(std::span<loss_curve const>(&one, 1), validation, title, first_step);
}

}  // namespace tide::train
