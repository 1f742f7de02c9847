#include <doctest/doctest.h>

#include "support/gate.hpp"

#include <tide/core/concepts.hpp>
#include <tide/memory/stream.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace mem = tide::memory;
using tide::host;

namespace {

using tide::test::gate;

// Busy work that takes a while without sleeping, so a broken ordering has time to show.
std::uint64_t churn() {
  std::uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 200000; ++i) {
    h = (h ^ static_cast<std::uint64_t>(i)) * 1099511628211ull;
    if (i % 1024 == 0) std::this_thread::yield();
  }
  return h;
}

}  // namespace

static_assert(tide::Stream<mem::stream<host>>);
static_assert(tide::Event<mem::event<host>>);

TEST_CASE("one stream runs its commands in order, on its own worker thread") {
  mem::stream<host> s{{.capacity = 64}};
  std::vector<int> order;  // touched only by the worker until synchronize
  std::vector<std::thread::id> ran_on;
  struct step {
    std::vector<int>* order;
    std::vector<std::thread::id>* ran_on;
    int i;
    void operator()() const {
      order->push_back(i);
      ran_on->push_back(std::this_thread::get_id());
    }
  };
  std::vector<step> steps;
  for (int i = 0; i < 500; ++i) steps.push_back({&order, &ran_on, i});
  for (auto& st : steps) mem::launch(s, st);
  s.synchronize();
  CHECK(s.query());
  std::vector<int> expected(500);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(order == expected);
  REQUIRE(ran_on.size() == 500);
  CHECK(ran_on.front() == s.worker_id());
  CHECK(ran_on.front() != std::this_thread::get_id());
  CHECK(std::all_of(ran_on.begin(), ran_on.end(), [&](auto id) { return id == s.worker_id(); }));
}

TEST_CASE("copies and host functions interleave in order") {
  mem::stream<host> s;
  std::vector<unsigned char> a(10007), b(10007, 0), c(10007, 0);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<unsigned char>(i * 7 + 3);
  bool b_matched_before_c = false;
  auto check_b = [&] { b_matched_before_c = b == a && c != a; };
  s.copy(b.data(), a.data(), a.size());
  mem::launch(s, check_b);
  s.copy(c.data(), b.data(), b.size());
  s.copy(nullptr, nullptr, 0);  // empty copies are allowed
  s.synchronize();
  CHECK(b_matched_before_c);
  CHECK(c == a);
  CHECK_THROWS_AS(s.copy(nullptr, a.data(), 4), tide::error);
  CHECK_THROWS_AS(s.launch(nullptr, nullptr), tide::error);
  CHECK_THROWS_AS(mem::stream<host>({.capacity = 0}), tide::error);
}

TEST_CASE("an event orders work across streams") {
  mem::stream<host> a, b;
  mem::event<host> e;
  gate g;
  bool flag = false;  // plain bool: TSan also reports it if the order breaks
  bool seen = false;
  auto slow_then_set = [&] {
    gate::pass(&g);
    churn();
    flag = true;
  };
  auto look = [&] { seen = flag; };
  mem::launch(a, slow_then_set);
  e.record(a);
  b.wait(e);
  mem::launch(b, look);
  CHECK_FALSE(e.query());  // a is held at the gate
  g.open();
  b.synchronize();
  CHECK(seen);
  CHECK(e.query());
  a.synchronize();
}

TEST_CASE("wait uses the record that was most recent when wait was called (CUDA semantics)") {
  mem::stream<host> a, b, c;
  mem::event<host> e;
  gate g;
  bool flag = false;
  bool seen = false;
  auto slow_then_set = [&] {
    gate::pass(&g);
    churn();
    flag = true;
  };
  auto look = [&] { seen = flag; };
  mem::launch(a, slow_then_set);
  e.record(a);
  b.wait(e);       // waits for a's marker ...
  e.record(c);     // ... even though e is now re-recorded on idle c
  e.synchronize();
  CHECK(e.query());  // the event itself reports c's record
  mem::launch(b, look);
  g.open();
  b.synchronize();
  CHECK(seen);
  a.synchronize();
}

TEST_CASE("query, synchronize and events never recorded") {
  mem::event<host> never;
  CHECK(never.query());  // CUDA: an event never recorded is complete
  never.synchronize();
  mem::stream<host> s;
  s.wait(never);  // a no-op
  CHECK(s.query());
  CHECK_THROWS_AS((void)mem::elapsed_ms(never, never), tide::error);

  gate g;
  mem::event<host> start, end;
  start.record(s);
  s.launch(&gate::pass, &g);
  end.record(s);
  CHECK_FALSE(s.query());
  CHECK_FALSE(end.query());
  CHECK_THROWS_AS((void)mem::elapsed_ms(start, end), tide::error);  // end not complete yet
  start.synchronize();
  CHECK(start.query());
  g.open();
  end.synchronize();
  CHECK(end.query());
  s.synchronize();
  CHECK(s.query());
}

TEST_CASE("elapsed_ms is the time between the markers as the worker passed them") {
  mem::stream<host> s;
  mem::event<host> start, end;
  auto nap = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  start.record(s);
  mem::launch(s, nap);  // the worker passes start, sleeps, then passes end
  end.record(s);
  end.synchronize();
  // Both records were made at once on this thread: only stamps taken where the worker passed
  // the markers are 20 ms apart (sleep_for waits at least that long on the steady clock).
  double const ms = mem::elapsed_ms(start, end);
  CHECK(ms >= 20.0);
  CHECK(mem::elapsed_ms(end, start) == -ms);  // ordered: end minus start
  CHECK(mem::elapsed_ms(start, start) == 0.0);
}

TEST_CASE("an exception in a host function is sticky and rethrown by synchronize") {
  mem::stream<host> s;
  bool later_ran = false;
  auto throws = [] { TIDE_FAIL(budget, "asked 9 bytes, 4 free"); };
  auto later = [&] { later_ran = true; };
  mem::launch(s, throws);
  mem::launch(s, later);
  mem::event<host> after;
  after.record(s);
  for (int round = 0; round < 2; ++round) {  // sticky: reported again
    try {
      s.synchronize();
      FAIL("synchronize did not rethrow");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::budget);
      CHECK(e.message().find("asked 9 bytes, 4 free") != std::string::npos);
    }
  }
  CHECK(after.query());  // markers still pass after a failure: no waiter hangs
  CHECK_THROWS_AS(after.synchronize(), tide::error);  // events recorded there report it too
  CHECK_FALSE(later_ran);                             // work after the failure is skipped

  mem::stream<host> t;
  auto std_throw = [] { throw std::out_of_range("index 7 of 3"); };
  mem::launch(t, std_throw);
  try {
    t.synchronize();
    FAIL("synchronize did not rethrow");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(e.message().find("index 7 of 3") != std::string::npos);
  }
}

TEST_CASE("back-pressure: far more commands than the ring holds all run, in order") {
  mem::stream<host> s{{.capacity = 4}};
  std::vector<int> order;
  struct step {
    std::vector<int>* order;
    int i;
    void operator()() const { order->push_back(i); }
  };
  std::vector<step> steps;
  for (int i = 0; i < 5000; ++i) steps.push_back({&order, i});
  for (auto& st : steps) mem::launch(s, st);  // blocks whenever 4 are waiting
  s.synchronize();
  REQUIRE(order.size() == 5000);
  bool in_order = true;
  for (int i = 0; i < 5000; ++i) in_order = in_order && order[static_cast<std::size_t>(i)] == i;
  CHECK(in_order);
}

TEST_CASE("a host function filling its own stream's ring fails instead of deadlocking") {
  mem::stream<host> s{{.capacity = 1}};
  int noop_runs = 0;
  auto noop = [&] { ++noop_runs; };
  auto flood = [&] {
    mem::launch(s, noop);  // fits: the ring is empty while flood runs
    mem::launch(s, noop);  // the ring is full and only this thread could empty it
  };
  mem::launch(s, flood);
  try {
    s.synchronize();
    FAIL("synchronize did not rethrow");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(e.message().find("own stream") != std::string::npos);
  }
  CHECK(noop_runs == 0);  // enqueued after the failure: skipped
}

TEST_CASE("a host function synchronizing its own stream fails instead of deadlocking") {
  mem::stream<host> s;
  auto self_sync = [&] { s.synchronize(); };
  mem::launch(s, self_sync);
  try {
    s.synchronize();
    FAIL("synchronize did not rethrow");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(e.message().find("its own stream") != std::string::npos);
  }
}

TEST_CASE("the destructor drains the queue") {
  int runs = 0;
  std::vector<unsigned char> src(4096, 0xab), dst(4096, 0);
  {
    mem::stream<host> s{{.capacity = 8}};
    auto bump = [&] { ++runs; };
    for (int i = 0; i < 100; ++i) mem::launch(s, bump);
    s.copy(dst.data(), src.data(), src.size());
  }
  CHECK(runs == 100);
  CHECK(dst == src);
}

TEST_CASE("streams and events move") {
  mem::stream<host> a;
  int runs = 0;
  auto bump = [&] { ++runs; };
  mem::launch(a, bump);
  mem::stream<host> b = std::move(a);
  mem::launch(b, bump);
  mem::event<host> e;
  e.record(b);
  mem::event<host> f = std::move(e);
  f.synchronize();
  CHECK(runs == 2);
  mem::stream<host> c;
  c = std::move(b);
  mem::launch(c, bump);
  c.synchronize();
  CHECK(runs == 3);
}

TEST_CASE("device_streams: compute overlaps a copy on the copy stream") {
  mem::device_streams<host> ds{{.capacity = 16}};
  CHECK(ds.compute.worker_id() != ds.copy.worker_id());
  std::vector<float> src(1 << 16), dst(1 << 16, 0.f);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f;

  std::mutex m;
  std::condition_variable cv;
  bool copied = false;
  std::thread::id copy_thread, compute_thread;
  bool saw_copy = false;
  bool data_ok = false;
  // Blocks the compute worker until the copy finished: impossible if one thread ran both.
  auto compute = [&] {
    compute_thread = std::this_thread::get_id();
    std::unique_lock lock(m);
    saw_copy = cv.wait_for(lock, std::chrono::seconds(30), [&] { return copied; });
    data_ok = saw_copy && dst == src;
  };
  auto announce = [&] {
    {
      std::lock_guard lock(m);
      copy_thread = std::this_thread::get_id();
      copied = true;
    }
    cv.notify_all();
  };
  mem::launch(ds.compute, compute);  // enqueued first: it waits for work enqueued after it
  ds.copy.copy(dst.data(), src.data(), src.size() * sizeof(float));
  mem::launch(ds.copy, announce);
  ds.compute.synchronize();
  ds.copy.synchronize();
  CHECK(saw_copy);
  CHECK(data_ok);
  CHECK(copy_thread == ds.copy.worker_id());
  CHECK(compute_thread == ds.compute.worker_id());
  CHECK(copy_thread != compute_thread);
}
