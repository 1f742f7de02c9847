#include <doctest/doctest.h>

#include "support/gate.hpp"

#include <tide/core/bytes.hpp>
#include <tide/memory/stream.hpp>
#include <tide/memory/transfer_engine.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

namespace mem = tide::memory;
using mem::copy_direction;
using tide::host;
using namespace tide::literals;

namespace {

using tide::test::gate;

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<unsigned char>(x);
  }
  return v;
}

}  // namespace

TEST_CASE("copies arrive intact: patterns, odd sizes, split and unsplit") {
  for (std::size_t split : {std::size_t{0}, std::size_t{4096}, 4_MiB}) {
    CAPTURE(split);
    mem::stream<host> copy;
    mem::transfer_engine<host> engine{copy, {.max_in_flight = 3, .split_bytes = split}};
    std::vector<std::size_t> const sizes = {0, 1, 3, 4095, 4096, 8191, 8193, 65537, (1u << 20) + 13, 5_MiB + 7};
    std::vector<std::vector<unsigned char>> src, dst;
    std::size_t h2d = 0, d2h = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      src.push_back(pattern(sizes[i], static_cast<unsigned>(i) + 1));
      dst.emplace_back(sizes[i] + 2, 0xee);  // one guard byte on each side
    }
    auto const issued = std::chrono::steady_clock::now();  // before the first copy
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto const dir = i % 2 == 0 ? copy_direction::host_to_device : copy_direction::device_to_host;
      (i % 2 == 0 ? h2d : d2h) += sizes[i];
      engine.copy_async(dst[i].data() + 1, src[i].data(), sizes[i], dir);
    }
    engine.synchronize();
    double const window_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - issued).count();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      CAPTURE(sizes[i]);
      CHECK(dst[i].front() == 0xee);
      CHECK(dst[i].back() == 0xee);
      CHECK(std::equal(src[i].begin(), src[i].end(), dst[i].begin() + 1));
    }
    auto const st = engine.stats();
    CHECK(st.host_to_device_bytes == h2d);
    CHECK(st.device_to_host_bytes == d2h);
    CHECK(st.copies == sizes.size());
    CHECK(st.completed == sizes.size());
    CHECK(st.in_flight == 0);
    CHECK(st.peak_in_flight == 3);
    // copy_ms sums each copy's time between its two markers. Megabytes were copied, so it is not
    // 0; and the copies ran one after another on one stream inside [issued, now], so their sum
    // cannot exceed that window (a copy counted twice, or microseconds taken for milliseconds,
    // would). Both are readings of the same steady clock: no bound on how long anything takes.
    CHECK(st.copy_ms > 0.0);
    CHECK(st.copy_ms <= window_ms);
  }
}

TEST_CASE("copy_lane: every piece lands, at any alignment, copy after copy") {
  mem::copy_lane lane;
  CHECK(lane.thread_id() != std::this_thread::get_id());
  constexpr std::size_t piece = mem::copy_lane::piece_bytes;
  for (std::size_t n : {std::size_t{1}, std::size_t{8191}, piece, piece + 1, 3 * piece + 4097}) {
    for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{33}}) {
      CAPTURE(n);
      CAPTURE(offset);
      auto const src = pattern(n + offset, static_cast<unsigned>(n + offset));
      std::vector<unsigned char> dst(n + 2 * offset + 1, 0x5a);
      lane.copy(dst.data() + offset, src.data() + offset, n);
      CHECK(std::equal(src.begin() + static_cast<std::ptrdiff_t>(offset), src.end(),
                       dst.begin() + static_cast<std::ptrdiff_t>(offset)));
      CHECK(dst.back() == 0x5a);
      CHECK((offset == 0 || dst[offset - 1] == 0x5a));
    }
  }
}

TEST_CASE("the in-flight bound holds: copy_async blocks until the oldest copy finished") {
  mem::stream<host> copy;
  constexpr std::size_t bound = 2;
  mem::transfer_engine<host> engine{copy, {.max_in_flight = bound}};
  std::vector<std::vector<unsigned char>> src, dst;
  for (unsigned i = 0; i < bound + 1; ++i) {
    src.push_back(pattern(1000 + i, i));
    dst.emplace_back(1000 + i, 0);
  }
  gate g;
  copy.launch(&gate::pass, &g);  // nothing on the copy stream can finish until the gate opens
  for (std::size_t i = 0; i < bound; ++i)
    engine.copy_async(dst[i].data(), src[i].data(), src[i].size(), copy_direction::device_to_host);
  CHECK(engine.stats().in_flight == bound);  // issuing up to the bound did not wait

  std::atomic<bool> calling{false}, returned{false};
  std::thread producer([&] {
    calling = true;
    engine.copy_async(dst[bound].data(), src[bound].data(), src[bound].size(), copy_direction::host_to_device);
    returned = true;
  });
  while (!calling) std::this_thread::yield();
  // While the gate is closed no copy can finish, so a correct engine cannot let the producer
  // return; give a broken one time to do so. (A check of order, not of time: it cannot fail
  // spuriously.)
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(returned.load());
  g.open();
  producer.join();
  CHECK(returned.load());
  engine.synchronize();
  auto const st = engine.stats();
  CHECK(st.peak_in_flight == bound);
  CHECK(st.completed == bound + 1);
  CHECK(st.host_to_device_bytes == src[bound].size());
  CHECK(st.device_to_host_bytes == src[0].size() + src[1].size());
  for (std::size_t i = 0; i <= bound; ++i) CHECK(dst[i] == src[i]);
}

TEST_CASE("overlap: compute blocks on a copy issued after it, and the copy runs elsewhere") {
  mem::device_streams<host> ds;
  mem::transfer_engine<host> engine{ds.copy, {.split_bytes = 1_MiB}};
  auto const src = pattern(3_MiB + 5, 3);
  std::vector<unsigned char> dst(src.size(), 0);
  mem::event<host> done;

  std::mutex m;
  std::condition_variable cv;
  bool copied = false;
  bool saw_copy = false, data_ok = false;
  std::thread::id compute_thread, copy_thread;
  // Holds the compute worker until the copy is over; if one thread served both streams, the
  // copy would be queued behind this task and it would time out.
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
  mem::launch(ds.compute, compute);
  engine.copy_async(dst.data(), src.data(), src.size(), copy_direction::host_to_device, done);
  mem::launch(ds.copy, announce);
  ds.compute.synchronize();
  ds.copy.synchronize();  // announce may still be notifying: the locals it uses must outlive it
  CHECK(saw_copy);
  CHECK(data_ok);
  CHECK(compute_thread == ds.compute.worker_id());
  CHECK(copy_thread == ds.copy.worker_id());
  CHECK(copy_thread != compute_thread);
  CHECK(done.query());
}

TEST_CASE("the done event orders compute after the copy") {
  mem::device_streams<host> ds;
  mem::transfer_engine<host> engine{ds.copy};
  auto const src = pattern(257 * 1024 + 3, 9);
  std::vector<unsigned char> dst(src.size(), 0);
  gate g;
  ds.copy.launch(&gate::pass, &g);  // the copy cannot start before the compute wait is queued
  mem::event<host> done;
  engine.copy_async(dst.data(), src.data(), src.size(), copy_direction::host_to_device, done);
  bool data_ok = false;
  auto use = [&] { data_ok = dst == src; };  // a plain read: TSan reports it if unordered
  ds.compute.wait(done);
  mem::launch(ds.compute, use);
  CHECK_FALSE(done.query());
  g.open();
  ds.compute.synchronize();
  CHECK(data_ok);
  done.synchronize();  // the host can wait on it too
}

TEST_CASE("a batch: every copy lands, in order, and its event follows the last") {
  mem::device_streams<host> ds;
  mem::transfer_engine<host> engine{ds.copy, {.max_in_flight = 4}};  // room for the batch: the gate holds it
  auto const src = pattern(3 * 4096 + 5, 4);
  std::vector<unsigned char> dst(src.size(), 0);
  // Three pieces, the last overwriting part of the second: order shows in the bytes.
  std::vector<unsigned char> patch(100, 0xab);
  std::vector<mem::copy_request> const batch{{dst.data(), src.data(), 4096},
                                             {dst.data() + 4096, src.data() + 4096, src.size() - 4096},
                                             {dst.data() + 5000, patch.data(), patch.size()}};
  gate g;
  ds.copy.launch(&gate::pass, &g);
  mem::event<host> done;
  engine.copy_async(batch, copy_direction::device_to_host, done);
  CHECK_FALSE(done.query());
  g.open();
  done.synchronize();
  auto expect = src;
  std::copy(patch.begin(), patch.end(), expect.begin() + 5000);
  CHECK(dst == expect);
  auto const st = engine.stats();
  CHECK(st.copies == 3);
  CHECK(st.device_to_host_bytes == src.size() + patch.size());
  // An empty batch records its event at once (after what the stream holds).
  mem::event<host> none;
  engine.copy_async(std::span<mem::copy_request const>{}, copy_direction::host_to_device, none);
  none.synchronize();
  CHECK(engine.stats().copies == 3);
}

TEST_CASE("bad requests and failures are reported") {
  mem::stream<host> copy;
  CHECK_THROWS_AS(mem::transfer_engine<host>(copy, {.max_in_flight = 0}), tide::error);
  mem::transfer_engine<host> engine{copy};
  std::vector<unsigned char> buf(16);
  CHECK_THROWS_AS(engine.copy_async(nullptr, buf.data(), 16, copy_direction::host_to_device), tide::error);
  CHECK_THROWS_AS(engine.copy_async(buf.data(), nullptr, 16, copy_direction::device_to_host), tide::error);
  CHECK_THROWS_AS(engine.copy_async(buf.data(), buf.data() + 8, 8, static_cast<copy_direction>(7)), tide::error);
  CHECK(engine.stats().copies == 0);  // a rejected request changes nothing

  // Issuing from the copy stream's own worker would wait for itself: refused.
  auto from_worker = [&] { engine.copy_async(buf.data(), buf.data() + 8, 8, copy_direction::host_to_device); };
  mem::launch(copy, from_worker);
  try {
    copy.synchronize();
    FAIL("the refusal was not reported");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(e.message().find("own copy stream") != std::string::npos);
  }
  CHECK(engine.stats().copies == 0);

  // A failure on the copy stream surfaces from the engine's synchronize.
  mem::stream<host> other;
  mem::transfer_engine<host> e2{other};
  auto fails = [] { TIDE_FAIL(io, "disk went away"); };
  mem::launch(other, fails);
  e2.copy_async(buf.data(), buf.data() + 8, 8, copy_direction::device_to_host);
  try {
    e2.synchronize();
    FAIL("synchronize did not rethrow");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::io);
  }
  // drain() waits without reporting; the failure stays for the next synchronize.
  mem::stream<host> third;
  mem::transfer_engine<host> e3{third};
  mem::launch(third, fails);
  e3.copy_async(buf.data(), buf.data() + 8, 8, copy_direction::device_to_host);
  e3.drain();
  CHECK(e3.stats().in_flight == 0);
  CHECK_THROWS_AS(third.synchronize(), tide::error);
}
