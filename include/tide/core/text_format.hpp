#pragma once
// Text helpers shared by the reports (offload/, pipeline/, train/): numbers and escapes for the
// SVG pictures and the Chrome-trace JSON they write, and the step between axis ticks.
//
//   tide::format::svg_number(12.345)         // "12.35"; a non-finite value is written as 0
//   tide::format::xml_escape("a < b")        // "a &lt; b"
//   tide::format::tick_step(37.0)            // 5: ticks 0, 5, ..., at most about 8 up to 37
//   tide::format::append_json_escaped(s, t)  // t as the body of a JSON string

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

namespace tide::format {

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

// A tick step of 1, 2 or 5 x 10^k giving at most ~8 ticks up to `top`.
inline double tick_step(double top) {
  double const raw = std::max(top, 1e-9) / 8;
  double const p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

// JSON string body: quotes, backslash and control characters escaped; other bytes (UTF-8) kept.
inline void append_json_escaped(std::string& out, std::string_view s) {
  for (char const c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
}

}  // namespace tide::format
