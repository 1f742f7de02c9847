// The trace recorder: three threads record at once (TSan checks the lock), the JSON is what
// Perfetto reads (python's json parses it; M and X events, escaped names, sorted ts), a disabled
// recorder records nothing, timed() passes results through.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "tide/offload/trace_events.hpp"

namespace tt = tide::offload;

namespace {

constexpr int per_thread = 200;

// Records per_thread events on `l`: event i is named prefix + i, lasts i microseconds and has
// bytes = i + 1, so every field read back can be checked against its name.
void record_many(tt::trace_recorder& r, tt::lane l, std::string const& prefix) {
  for (int i = 0; i < per_thread; ++i) {
    double const t0 = tt::trace_recorder::now_us();
    r.complete(prefix + std::to_string(i), "test", l, t0, t0 + i, static_cast<std::size_t>(i) + 1);
  }
}

// The i of a record_many event's name.
int index_of(std::string const& name) { return std::stoi(name.substr(name.rfind(' ') + 1)); }

}  // namespace

TEST_CASE("three threads record at once; the JSON parses, names the lanes and escapes names") {
  tt::trace_recorder r;
  REQUIRE(r.enabled());
  std::atomic<bool> done{false};
  std::size_t bad_peeks = 0;
  // A reader takes snapshots while the writers run, so TSan sees reads racing with writes. Each
  // snapshot is sorted and never smaller than the one before.
  std::thread reader([&] {
    std::size_t last = 0;
    do {
      auto const snapshot = r.events();
      bool const sorted = std::is_sorted(snapshot.begin(), snapshot.end(),
                                         [](auto const& x, auto const& y) { return x.start_us < y.start_us; });
      bad_peeks += (sorted && snapshot.size() >= last && snapshot.size() <= 3 * per_thread) ? 0 : 1;
      last = snapshot.size();
      (void)r.to_json("peek");
    } while (!done.load());
  });
  std::thread a(record_many, std::ref(r), tt::lane::compute, "fwd ");
  std::thread b(record_many, std::ref(r), tt::lane::copy, "h2d ");
  std::thread c(record_many, std::ref(r), tt::lane::optimizer, "adam ");
  a.join();
  b.join();
  c.join();
  done = true;
  reader.join();
  CHECK(bad_peeks == 0);

  std::string const odd = "say \"hi\" \\ then\nnext\ttab";
  double const t = tt::trace_recorder::now_us();
  r.complete(odd, "cat \"q\"", tt::lane::compute, t, t + 5.5);

  auto const ev = r.events();
  REQUIRE(ev.size() == 3 * per_thread + 1);
  std::size_t on[3] = {0, 0, 0};
  for (std::size_t i = 0; i < ev.size(); ++i) {
    ++on[static_cast<int>(ev[i].where)];
    if (i > 0) CHECK(ev[i - 1].start_us <= ev[i].start_us);
    if (ev[i].category != "test") continue;  // the odd name
    CAPTURE(ev[i].name);
    int const k = index_of(ev[i].name);
    CHECK(std::abs(ev[i].duration_us - k) < 1e-3);  // t0 + k - t0, rounded at t0's magnitude
    CHECK(ev[i].bytes == static_cast<std::size_t>(k) + 1);
  }
  CHECK(on[0] == per_thread + 1);
  CHECK(on[1] == per_thread);
  CHECK(on[2] == per_thread);

  auto const dir = std::filesystem::temp_directory_path() / ("tide_trace_events_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto const path = (dir / "trace.json").string();
  r.write(path, "tide \"test\" run");
  REQUIRE(std::filesystem::exists(path));

  // The JSON as Perfetto reads it; python exits non-zero (and says why) on the first failed check.
  std::string const script = R"PY(
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
n = int(sys.argv[2])
odd = 'say "hi" \\ then\nnext\ttab'  # the C++ test's name, in python's spelling
assert d["displayTimeUnit"] == "ms", d.get("displayTimeUnit")
ev = d["traceEvents"]
m = [e for e in ev if e["ph"] == "M"]
x = [e for e in ev if e["ph"] == "X"]
assert len(ev) == len(m) + len(x), "only M and X events"
proc = [e for e in m if e["name"] == "process_name"]
assert len(proc) == 1 and proc[0]["pid"] == 1 and proc[0]["args"]["name"] == 'tide "test" run', proc
names = {e["tid"]: e["args"]["name"] for e in m if e["name"] == "thread_name"}
assert names == {1: "compute stream", 2: "copy stream", 3: "optimizer", 4: "comm (gradient sink)",
                 5: "activation copy stream"}, names
assert len(x) == n, (len(x), n)
for e in x:
    for k in ("ph", "ts", "dur", "pid", "tid", "name", "cat"):
        assert k in e, (k, e)
    assert e["pid"] == 1 and e["tid"] in (1, 2, 3), e
    assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)), e
    if e["name"] != odd:  # record_many's "<prefix> k": k microseconds, bytes k + 1
        k = int(e["name"].rsplit(" ", 1)[1])
        assert abs(e["dur"] - k) < 2e-3, e
        assert k + 1 == e.get("args", {}).get("bytes"), e
assert {e["tid"] for e in x} == {1, 2, 3}
ts = [e["ts"] for e in x]
assert ts == sorted(ts), "X events sorted by ts"
o = [e for e in x if e["name"] == odd]
assert len(o) == 1 and o[0]["cat"] == 'cat "q"' and o[0]["tid"] == 1 and "args" not in o[0], o
assert abs(o[0]["dur"] - 5.5) < 1e-9, o
b = [e for e in x if e["name"] == "h2d 7"]
assert len(b) == 1 and b[0]["tid"] == 2 and b[0]["args"]["bytes"] == 8, b
)PY";
  auto const script_path = (dir / "check.py").string();
  tide::offload::write_file(script_path, script);
  std::string const cmd = "python3 " + script_path + " " + path + " " + std::to_string(ev.size());
  REQUIRE_MESSAGE(std::system("command -v python3 > /dev/null") == 0, "python3 is missing");
  int const rc = std::system(cmd.c_str());
  CHECK(rc == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a disabled recorder records nothing until enabled") {
  tt::trace_recorder r{false};
  CHECK_FALSE(r.enabled());
  double const t = tt::trace_recorder::now_us();
  r.complete("x", "c", tt::lane::copy, t, t + 1, 64);
  int const v = tt::timed(r, "y", "c", tt::lane::compute, [] { return 7; });
  CHECK(v == 7);
  CHECK(r.events().empty());
  // Disabled, even bad times are ignored: the check costs nothing on the hot path.
  r.complete("bad", "c", tt::lane::copy, t + 1, t);
  CHECK(r.events().empty());
  auto const json = r.to_json("empty");
  CHECK(json.find(R"("ph":"X")") == std::string::npos);
  CHECK(json.find(R"("thread_name")") != std::string::npos);

  r.set_enabled(true);
  r.complete("x", "c", tt::lane::copy, t, t + 1, 64);
  REQUIRE(r.events().size() == 1);
  CHECK(r.events()[0].bytes == 64);
  r.clear();
  CHECK(r.events().empty());
}

TEST_CASE("timed returns f's value and records one event; void works; bad times are refused") {
  tt::trace_recorder r;
  double const before = tt::trace_recorder::now_us() - r.origin_us();
  auto const s = tt::timed(r, "forward", "compute", tt::lane::compute, [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return std::string("loss");
  });
  double const after = tt::trace_recorder::now_us() - r.origin_us();
  CHECK(s == "loss");
  REQUIRE(r.events().size() == 1);
  auto const e = r.events()[0];
  CHECK(e.name == "forward");
  CHECK(e.category == "compute");
  CHECK(e.where == tt::lane::compute);
  // The event spans f's call: it holds the 2 ms sleep (sleep_for waits at least that long) and
  // lies inside [before, after], in the recorder's frame (times since its construction).
  CHECK(e.duration_us >= 2000.0);
  CHECK(e.start_us >= before);
  CHECK(e.start_us + e.duration_us <= after + 1e-3);
  CHECK(e.bytes == 0);

  int calls = 0;
  tt::timed(r, "step", "optimizer", tt::lane::optimizer, [&] { ++calls; });
  CHECK(calls == 1);
  CHECK(r.events().size() == 2);

  int x = 1;
  int& ref = tt::timed(r, "ref", "c", tt::lane::copy, [&]() -> int& { return x; });
  ref = 5;
  CHECK(x == 5);

  CHECK_THROWS_AS(tt::timed(r, "throws", "c", tt::lane::compute, []() -> int { throw std::runtime_error("boom"); }),
                  std::runtime_error);
  CHECK(r.events().size() == 3);

  double const t = tt::trace_recorder::now_us();
  CHECK_THROWS_AS(r.complete("backwards", "c", tt::lane::copy, t + 1, t), tide::error);
  CHECK(r.events().size() == 3);  // refused input leaves the recorder as it was
}

TEST_CASE("now_us counts microseconds; the origin is the recorder's construction") {
  double const t0 = tt::trace_recorder::now_us();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  double const t1 = tt::trace_recorder::now_us();
  CHECK(t1 - t0 >= 20000.0);  // 20 ms: milliseconds or seconds would read 20 or 0.02

  double const before = tt::trace_recorder::now_us();
  tt::trace_recorder r;
  double const after = tt::trace_recorder::now_us();
  CHECK(r.origin_us() >= before);
  CHECK(r.origin_us() <= after);
  // complete() stores times in that frame.
  r.complete("x", "c", tt::lane::copy, after, after + 3, 1);
  REQUIRE(r.events().size() == 1);
  CHECK(r.events()[0].start_us == after - r.origin_us());
  CHECK(std::abs(r.events()[0].duration_us - 3.0) < 1e-3);  // after + 3 - after, rounded at after's magnitude
}
