#pragma once
// What a training run shows: one progress line per step (updated in place on a terminal, plain
// lines otherwise) and the loss curve as an SVG written beside the run.
//
//   tide::train::progress progress{stdout};                // a terminal: \r updates; else lines
//   progress.update(stats, total_steps);                    // every step
//   progress.line(stats, total_steps, " val 2.31");         // a kept line (every N steps)
//   tide::offload::write_file("run/loss.svg", tide::train::loss_svg(losses, validation, "title"));

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "tide/core/bytes.hpp"
#include "tide/offload/report.hpp"
#include "tide/train/trainer.hpp"

namespace tide::train {

// "step   120/500  loss 2.4512  5230 tok/s  device 46.1 MiB  host 39.0 MiB  moved 1.92 GB"
inline std::string progress_text(step_stats const& s, std::int64_t total, double gb_moved) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %5lld/%lld  loss %.4f  %6.0f tok/s  device %.1f MiB  host %.1f MiB  moved %.2f GB%s",
                static_cast<long long>(s.step), static_cast<long long>(total), static_cast<double>(s.loss),
                s.tokens_per_s, static_cast<double>(s.device_bytes) / (1 << 20),
                static_cast<double>(s.host_bytes) / (1 << 20), gb_moved, s.skipped ? "  (skipped: overflow)" : "");
  return buf;
}

class progress {
 public:
  explicit progress(std::FILE* out) : out_(out), tty_(::isatty(::fileno(out)) != 0) {}
  [[nodiscard]] bool terminal() const noexcept { return tty_; }

  // The step's line: in place on a terminal, nothing otherwise (line() keeps lines).
  void update(step_stats const& s, std::int64_t total) {
    moved_ += static_cast<double>(s.bytes_moved) * 1e-9;
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
  [[nodiscard]] double gb_moved() const noexcept { return moved_; }

 private:
  std::FILE* out_;
  bool tty_;
  double moved_ = 0;
};

// Training loss per step (a line) and validation losses at their steps (dots), as SVG 1.1.
// Elements the tests read: <polyline class="train">, one <circle class="validation"> per value.
inline std::string loss_svg(std::span<float const> train, std::span<std::pair<std::int64_t, float> const> validation,
                            std::string_view title) {
  TIDE_REQUIRE(!train.empty(), "loss_svg: no training losses");
  using offload::detail::svg_number;
  double const w = 720, h = 360, left = 60, right = 20, top = 40, bottom = 40;
  double hi = 0, lo = 1e300;
  for (float v : train)
    if (std::isfinite(v)) hi = std::max(hi, double(v)), lo = std::min(lo, double(v));
  for (auto const& [s, v] : validation)
    if (std::isfinite(v)) hi = std::max(hi, double(v)), lo = std::min(lo, double(v));
  lo = std::max(0.0, std::floor(lo * 2) / 2);
  hi = std::max(lo + 0.5, std::ceil(hi * 2) / 2);
  double const steps = static_cast<double>(std::max<std::size_t>(train.size(), 2) - 1);
  auto x = [&](double step) { return left + (w - left - right) * step / steps; };  // step 0-based
  auto y = [&](double v) { return top + (h - top - bottom) * (hi - v) / (hi - lo); };
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" +
                  svg_number(w) + "\" height=\"" + svg_number(h) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + svg_number(left) + "\" y=\"22\" font-size=\"14\">" + offload::detail::xml_escape(title) + "</text>\n";
  for (double v = lo; v <= hi + 1e-9; v += 0.5) {
    s += "<line x1=\"" + svg_number(left) + "\" x2=\"" + svg_number(w - right) + "\" y1=\"" + svg_number(y(v)) +
         "\" y2=\"" + svg_number(y(v)) + "\" stroke=\"#ddd\"/>\n";
    s += "<text x=\"" + svg_number(left - 6) + "\" y=\"" + svg_number(y(v) + 4) + "\" text-anchor=\"end\">" +
         svg_number(v) + "</text>\n";
  }
  s += "<text x=\"" + svg_number((left + w - right) / 2) + "\" y=\"" + svg_number(h - 8) +
       "\" text-anchor=\"middle\">step (" + std::to_string(train.size()) + ")</text>\n";
  s += "<polyline class=\"train\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
  for (std::size_t i = 0; i < train.size(); ++i)
    if (std::isfinite(train[i])) s += svg_number(x(double(i))) + "," + svg_number(y(train[i])) + " ";
  s += "\"/>\n";
  for (auto const& [step, v] : validation)
    if (std::isfinite(v))
      s += "<circle class=\"validation\" cx=\"" + svg_number(x(double(std::max<std::int64_t>(step - 1, 0)))) +
           "\" cy=\"" + svg_number(y(v)) + "\" r=\"4\" fill=\"#d62728\"/>\n";
  s += "<text x=\"" + svg_number(w - right - 200) + "\" y=\"" + svg_number(top + 14) +
       "\" fill=\"#1f77b4\">training loss</text>\n<text x=\"" + svg_number(w - right - 200) + "\" y=\"" +
       svg_number(top + 30) + "\" fill=\"#d62728\">validation loss</text>\n</svg>\n";
  return s;
}

}  // namespace tide::train
