// comm/detail/watchdog.hpp, the two pieces of comm::nccl's watchdog that need no GPU: which
// operation made no progress for the deadline (stall_watch, on a lane whose operations finish
// when the test says), and the thread that looks every period and stops when destroyed.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>

#include "tide/comm/detail/watchdog.hpp"

namespace {

using tide::comm::detail::periodic_thread;
using tide::comm::detail::stall_watch;
using namespace std::chrono_literals;

}  // namespace

TEST_CASE("stall_watch names the oldest unfinished operation once it made no progress for the deadline") {
  stall_watch w;
  auto const t0 = stall_watch::clock::now();
  std::uint64_t finished = 0;  // operations 1 .. finished are done
  auto done = [&](std::uint64_t seq) { return seq <= finished; };
  auto at = [&](std::chrono::milliseconds ms) { return t0 + ms; };

  // Nothing in flight: never overdue, however long.
  CHECK_FALSE(w.overdue(1, done, at(0ms), 100ms));
  CHECK_FALSE(w.overdue(1, done, at(1000ms), 100ms));
  // Operations 1 to 3 enqueued at about 1000 ms; 1 finishes by 1050, then nothing more.
  CHECK_FALSE(w.overdue(4, done, at(1010ms), 100ms));
  finished = 1;
  CHECK_FALSE(w.overdue(4, done, at(1050ms), 100ms));  // progress: 2 is the oldest from now
  CHECK_FALSE(w.overdue(4, done, at(1140ms), 100ms));  // 90 ms without progress
  auto const late = w.overdue(4, done, at(1160ms), 100ms);
  REQUIRE(late);
  CHECK(*late == 2);
  // Progress again: 2 and 3 finish, 4 and 5 come; the clock starts over.
  finished = 3;
  CHECK_FALSE(w.overdue(6, done, at(1170ms), 100ms));
  CHECK_FALSE(w.overdue(6, done, at(1260ms), 100ms));
  CHECK(w.overdue(6, done, at(1280ms), 100ms) == std::optional<std::uint64_t>{4});
  // Everything finished: idle, and an operation enqueued much later is timed from then.
  finished = 5;
  CHECK_FALSE(w.overdue(6, done, at(1300ms), 100ms));
  CHECK_FALSE(w.overdue(7, done, at(5000ms), 100ms));
  CHECK_FALSE(w.overdue(7, done, at(5090ms), 100ms));
  CHECK(w.overdue(7, done, at(5101ms), 100ms) == std::optional<std::uint64_t>{6});
}

TEST_CASE("stall_watch asks about each operation in order and stops at the first unfinished one") {
  stall_watch w;
  std::uint64_t asked_max = 0;
  auto done = [&](std::uint64_t seq) {
    asked_max = seq > asked_max ? seq : asked_max;
    return seq <= 2;
  };
  CHECK_FALSE(w.overdue(10, done, stall_watch::clock::now(), 1000ms));
  CHECK(asked_max == 3);  // 1 and 2 finished, 3 did not: 4 .. 9 not asked (one lane: they cannot have)
}

TEST_CASE("periodic_thread calls its function every period until destroyed, and destruction is prompt") {
  std::atomic<int> calls{0};
  {
    periodic_thread dog{10ms, [&] {
                          calls.fetch_add(1);
                          if (calls.load() == 2) throw 1;  // dropped: the watchdog goes on
                        }};
    while (calls.load() < 5) std::this_thread::sleep_for(1ms);
  }
  int const after = calls.load();
  CHECK(after >= 5);
  std::this_thread::sleep_for(30ms);
  CHECK(calls.load() == after);  // no call once destroyed
  // A long period does not hold destruction up (it wakes the thread; else this waits a minute).
  { periodic_thread idle{std::chrono::milliseconds(60'000), [] {}}; }
  CHECK(periodic_thread<void (*)()>::period_for(std::chrono::minutes(5)) == 1000ms);
  CHECK(periodic_thread<void (*)()>::period_for(40ms) == 10ms);
  CHECK(periodic_thread<void (*)()>::period_for(4000ms) == 500ms);
}
