#pragma once
// A timeline of one run as Chrome trace-event JSON: open the file in https://ui.perfetto.dev or
// chrome://tracing to see compute, copies and optimizer steps side by side, one row per lane.
//
//   tide::offload::trace_recorder trace;                       // enabled; trace_recorder{false} records nothing
//   double const t0 = tide::offload::trace_recorder::now_us();
//   copy_chunk(c);                                           // any thread: complete() takes a lock
//   trace.complete("upload chunk 3", "h2d", tide::offload::lane::copy, t0, trace_recorder::now_us(), bytes);
//   float loss = tide::offload::timed(trace, "forward", "compute", tide::offload::lane::compute,
//                                   [&] { return model.forward(batch); });
//   trace.write("run/trace.json", "tide gpt step 10..20");   // atomic write (offload::write_file)
//
// Times: now_us() reads steady_clock in microseconds; complete() stores them relative to the
// recorder's construction, so the trace starts near 0 and events() / the JSON are in that frame.
// The JSON: {"traceEvents":[M process_name, M thread_name and thread_sort_index per lane, X events
// sorted by ts], "displayTimeUnit":"ms"}, pid 1, tid 1 compute stream, 2 copy stream, 3 optimizer,
// 4 comm (gradient sink), 5 activation copy stream;
// ts and dur in microseconds with 3 decimals; "args":{"bytes":N} when bytes is nonzero.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tide/core/error.hpp"
#include "tide/core/text_format.hpp"
#include "tide/offload/report.hpp"

namespace tide::offload {

// One row of the timeline. The numeric value is the JSON thread id minus 1.
enum class lane : std::uint8_t { compute, copy, optimizer, comm, activation_copy };

constexpr std::string_view lane_name(lane l) noexcept {
  switch (l) {
    case lane::compute: return "compute stream";
    case lane::copy: return "copy stream";
    case lane::optimizer: return "optimizer";
    case lane::comm: return "comm (gradient sink)";
    case lane::activation_copy: return "activation copy stream";
  }
  return "unknown";
}

constexpr int lane_tid(lane l) noexcept { return static_cast<int>(l) + 1; }

// A complete ("ph":"X") event; times in microseconds since the recorder's construction.
struct trace_event {
  std::string name;
  std::string category;
  lane where;
  double start_us;
  double duration_us;
  std::size_t bytes = 0;
};

namespace detail {

using format::append_json_escaped;

inline void append_microseconds(std::string& out, double us) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", us);
  out += buf;
}

}  // namespace detail

class trace_recorder {
 public:
  explicit trace_recorder(bool enabled = true) : enabled_(enabled), origin_(now_us()) {}

  trace_recorder(trace_recorder const&) = delete;
  trace_recorder& operator=(trace_recorder const&) = delete;

  [[nodiscard]] bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) noexcept { enabled_.store(on, std::memory_order_relaxed); }

  // steady_clock in microseconds from its own epoch; pass these to complete().
  [[nodiscard]] static double now_us() noexcept {
    using us = std::chrono::duration<double, std::micro>;
    return std::chrono::duration_cast<us>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  // now_us() at construction: the zero of the recorded times.
  [[nodiscard]] double origin_us() const noexcept { return origin_; }

  // Records [start_us, end_us] (now_us() readings) on `where`. Thread-safe; a no-op when disabled.
  void complete(std::string name, std::string category, lane where, double start_us, double end_us,
                std::size_t bytes = 0) {
    if (!enabled()) return;
    TIDE_REQUIRE(std::isfinite(start_us) && std::isfinite(end_us) && end_us >= start_us,
                 "trace_recorder::complete('", name, "'): asked for an event from ", start_us, " to ", end_us,
                 " us; an event needs finite times with end >= start (take both from trace_recorder::now_us())");
    trace_event e{std::move(name), std::move(category), where, start_us - origin_, end_us - start_us, bytes};
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(e));
  }

  void clear() {
    std::lock_guard lock(mutex_);
    events_.clear();
  }

  // A copy of the events, sorted by start (ties keep the order they were recorded in).
  [[nodiscard]] std::vector<trace_event> events() const {
    std::vector<trace_event> copy;
    {
      std::lock_guard lock(mutex_);
      copy = events_;
    }
    std::stable_sort(copy.begin(), copy.end(),
                     [](trace_event const& a, trace_event const& b) { return a.start_us < b.start_us; });
    return copy;
  }

  [[nodiscard]] std::string to_json(std::string_view process_name) const {
    auto const all = events();
    std::string s;
    s.reserve(256 + all.size() * 128);
    s += R"({"traceEvents":[)";
    s += "\n" R"({"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":")";
    detail::append_json_escaped(s, process_name);
    s += R"("}})";
    for (lane const l : {lane::compute, lane::copy, lane::optimizer, lane::comm, lane::activation_copy}) {
      s += tide::detail::concat(",\n", R"({"name":"thread_name","ph":"M","pid":1,"tid":)", lane_tid(l),
                                R"(,"args":{"name":")", lane_name(l), R"("}})");
      s += tide::detail::concat(",\n", R"({"name":"thread_sort_index","ph":"M","pid":1,"tid":)", lane_tid(l),
                                R"(,"args":{"sort_index":)", lane_tid(l), "}}");
    }
    for (auto const& e : all) {
      s += ",\n" R"({"name":")";
      detail::append_json_escaped(s, e.name);
      s += R"(","cat":")";
      detail::append_json_escaped(s, e.category);
      s += R"(","ph":"X","ts":)";
      detail::append_microseconds(s, e.start_us);
      s += R"(,"dur":)";
      detail::append_microseconds(s, e.duration_us);
      s += tide::detail::concat(R"(,"pid":1,"tid":)", lane_tid(e.where));
      if (e.bytes != 0) s += tide::detail::concat(R"(,"args":{"bytes":)", e.bytes, "}");
      s += "}";
    }
    s += "\n" R"(],"displayTimeUnit":"ms"})" "\n";
    return s;
  }

  // to_json written atomically (a reader sees the old file or the whole new one); tide::error(io).
  void write(std::string const& path, std::string_view process_name) const {
    tide::offload::write_file(path, to_json(process_name));
  }

 private:
  std::atomic<bool> enabled_;
  double origin_;
  mutable std::mutex mutex_;
  std::vector<trace_event> events_;
};

// Runs f(), records it on `where` and returns its result (void allowed). An f that throws
// records nothing and the exception passes through.
template <class F>
decltype(auto) timed(trace_recorder& r, std::string name, std::string category, lane where, F&& f) {
  double const start = trace_recorder::now_us();
  if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
    std::forward<F>(f)();
    r.complete(std::move(name), std::move(category), where, start, trace_recorder::now_us());
  } else {
    std::invoke_result_t<F> result = std::forward<F>(f)();
    r.complete(std::move(name), std::move(category), where, start, trace_recorder::now_us());
    return result;
  }
}

}  // namespace tide::offload
