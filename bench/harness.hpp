#pragma once
// tide's benchmark harness. A benchmark program prints one JSON object per figure on stdout:
//
//   {"bench":"memory","figure":"copy_engine_vs_copy_probe","value":0.93,"unit":"ratio",
//    "anchor":"copy_probe","anchor_value":..,"ratio":..,"higher_is_better":true,
//    "goal":0.8,"machine":{...},"detail":{...}}
//
// `value` is tide's figure, `anchor_value` the anchor measured in the same run (or a roofline
// probe), `ratio` = value / anchor_value. `goal`, when given, is the ratio tide aims for.
// Timing: median of repeated runs after a warm-up; the harness never asserts on time.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tide::bench {

using clock = std::chrono::steady_clock;

// Seconds per call of f: the median of `reps` timed calls after `warmup` untimed ones.
template <class F>
double median_seconds(F&& f, int reps = 7, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  t.reserve(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    auto const t0 = clock::now();
    f();
    t.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[static_cast<std::size_t>(reps / 2)];
}

// Keeps the optimiser from deleting a computation whose result is otherwise unused.
template <class T>
inline void keep(T const& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

inline std::string json_escape(std::string const& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r;
}

inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}

// Facts about the machine, printed with every figure so results can be compared across runs.
inline std::string machine_json() {
  std::string model = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::ostringstream os;
  os << R"({"cpu":")" << json_escape(model) << R"(","hardware_threads":)"
     << std::thread::hardware_concurrency() << R"(,"compiler":"g++ )" << __VERSION__ << R"("})";
  return os.str();
}

struct figure {
  std::string bench;               // the program: "memory", "kernels", ...
  std::string name;                // stable snake_case id, e.g. "copy_engine_vs_copy_probe"
  double value = 0;                // tide's measurement
  std::string unit;                // of value and anchor_value: "GB/s", "ns", "ratio", ...
  std::string anchor;              // what it is compared with
  double anchor_value = 0;         // measured in the same run
  bool higher_is_better = true;    // of value (and so of ratio)
  double goal = std::nan("");      // the ratio tide aims for, if any
  std::vector<std::pair<std::string, double>> detail{};  // extra numbers worth keeping

  [[nodiscard]] double ratio() const { return anchor_value != 0 ? value / anchor_value : std::nan(""); }

  void print() const {
    std::ostringstream os;
    os << R"({"bench":")" << json_escape(bench) << R"(","figure":")" << json_escape(name)
       << R"(","value":)" << json_number(value) << R"(,"unit":")" << json_escape(unit)
       << R"(","anchor":")" << json_escape(anchor) << R"(","anchor_value":)" << json_number(anchor_value)
       << R"(,"ratio":)" << json_number(ratio()) << R"(,"higher_is_better":)"
       << (higher_is_better ? "true" : "false") << R"(,"goal":)" << json_number(goal)
       << R"(,"machine":)" << machine_json() << R"(,"detail":{)";
    for (std::size_t i = 0; i < detail.size(); ++i)
      os << (i ? "," : "") << '"' << json_escape(detail[i].first) << "\":" << json_number(detail[i].second);
    os << "}}\n";
    std::fputs(os.str().c_str(), stdout);
    std::fflush(stdout);
  }
};

// `TIDE_BENCH_QUICK=1` (set by the smoke test) asks benchmarks for small sizes and few reps.
// A field of /proc/meminfo as the number it holds ("MemAvailable" in kB, "HugePages_Free" in
// pages); -1 when the file or the field is missing.
inline double meminfo(std::string const& field) {
  std::ifstream in("/proc/meminfo");
  for (std::string key; in >> key;) {
    double value = 0;
    in >> value;
    if (key == field + ":") return value;
    in.ignore(256, '\n');
  }
  return -1;
}

inline bool quick() {
  char const* q = std::getenv("TIDE_BENCH_QUICK");
  return q != nullptr && q[0] == '1';
}

}  // namespace tide::bench
