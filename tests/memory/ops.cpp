// memory/ops.hpp on tide::host and tide::sealed: the same calls, the same bytes; on sealed the
// compute work is asynchronous and events order it against the copy stream.
#include <doctest/doctest.h>

#include "support/gate.hpp"

#include <tide/memory/device_arena.hpp>
#include <tide/memory/ops.hpp>
#include <tide/memory/stream.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

using namespace tide::literals;
namespace mem = tide::memory;

namespace {

// exec<B> and what it needs.
template <class B>
struct device;

template <>
struct device<tide::host> {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
};

template <>
struct device<tide::sealed> {
  tide::thread_pool pool{1};
  mem::stream<tide::sealed> compute;
  tide::exec<tide::sealed> ex{pool, compute};
};

}  // namespace

TEST_CASE_TEMPLATE("fill, copy in order, write from and read to the host", B, tide::host, tide::sealed) {
  device<B> d;
  mem::device_arena<B> arena{{.budget = 1_MiB}};
  constexpr std::size_t n = 1000;
  auto* a = static_cast<std::int32_t*>(arena.allocate(n * 4));
  auto* b = static_cast<std::int32_t*>(arena.allocate(n * 4));
  std::vector<std::int32_t> in(n), out(n, -1);
  std::iota(in.begin(), in.end(), 1);

  {
    std::vector<std::int32_t> scratch = in;
    mem::write_from_host(d.ex, a, scratch.data(), n * 4);
    std::fill(scratch.begin(), scratch.end(), 0);  // the call took the bytes: the block is free again
  }
  mem::copy_in_order(d.ex, b, a, n * 4);
  mem::fill_zeros(d.ex, a + 10, 20 * 4);
  mem::read_to_host(d.ex, out.data(), b, n * 4);
  CHECK(out == in);
  mem::read_to_host(d.ex, out.data(), a, n * 4);
  for (std::size_t i = 0; i < n; ++i) CHECK(out[i] == (i >= 10 && i < 30 ? 0 : in[i]));
  mem::synchronize(d.ex);
  arena.deallocate(a, n * 4);
  arena.deallocate(b, n * 4);
}

TEST_CASE_TEMPLATE("record on the compute timeline orders a copy stream after it", B, tide::host, tide::sealed) {
  device<B> d;
  mem::device_arena<B> arena{{.budget = 1_MiB}};
  mem::stream<B> copy;
  constexpr std::size_t n = 4096;
  auto* a = static_cast<float*>(arena.allocate(n * 4));
  std::vector<float> ones(n, 1.f), out(n, -1.f);
  mem::write_from_host(d.ex, a, ones.data(), n * 4);
  mem::fill_zeros(d.ex, a, n * 4);
  mem::event<B> filled;
  mem::record(d.ex, filled);
  copy.wait(filled);
  copy.copy(out.data(), a, n * 4);
  copy.synchronize();
  CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.f; }));

  // And the compute timeline waits for the copy stream.
  mem::event<B> uploaded;
  copy.copy(a, ones.data(), n * 4);
  uploaded.record(copy);
  mem::wait(d.ex, uploaded);
  mem::read_to_host(d.ex, out.data(), a, n * 4);
  CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 1.f; }));
  arena.deallocate(a, n * 4);
}

TEST_CASE("on sealed, compute work is asynchronous until an event or a read orders it") {
  device<tide::sealed> d;
  mem::device_arena<tide::sealed> arena{{.budget = 1_MiB}};
  mem::stream<tide::sealed> copy;
  auto* a = static_cast<float*>(arena.allocate(64));
  float const one = 1.f;
  mem::write_from_host(d.ex, a, &one, 4);
  mem::synchronize(d.ex);  // the copy stream below reads `a` unordered: the write must have landed
  tide::test::gate g;
  d.compute.launch(&tide::test::gate::pass, &g);
  mem::fill_zeros(d.ex, a, 4);
  mem::event<tide::sealed> filled;
  mem::record(d.ex, filled);
  CHECK_FALSE(filled.query());  // held at the gate
  float seen = -1.f;
  copy.copy(&seen, a, 4);  // no wait on `filled`: reads before the fill
  copy.synchronize();
  CHECK(seen == 1.f);
  g.open();
  copy.wait(filled);
  copy.copy(&seen, a, 4);
  copy.synchronize();
  CHECK(seen == 0.f);
  CHECK(filled.query());
  arena.deallocate(a, 64);
}

TEST_CASE("read_to_host and write_from_host refuse device memory on the host side") {
  device<tide::sealed> d;
  mem::device_arena<tide::sealed> arena{{.budget = 1_MiB}};
  void* a = arena.allocate(64);
  void* b = arena.allocate(64);
  CHECK_THROWS_AS(mem::read_to_host(d.ex, a, b, 64), tide::error);
  CHECK_THROWS_AS(mem::write_from_host(d.ex, a, b, 64), tide::error);
  arena.deallocate(a, 64);
  arena.deallocate(b, 64);
}

TEST_CASE("an event recorded on the host's timeline has passed, and times as the host saw it") {
  mem::event<tide::host> a, b;
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  mem::record(ex, a);
  CHECK(a.query());
  CHECK(b.query());  // never recorded: complete
  mem::record(ex, b);
  CHECK(b.query());
  double const ms = mem::elapsed_ms(a, b);  // both stamped (it throws for a marker not passed)
  CHECK(ms >= 0.0);
  CHECK(ms < 60'000.0);
  mem::wait(ex, b);  // returns at once

  // Recorded on a stream that is held, the same event is pending; marking the host's timeline
  // again completes it at once.
  mem::stream<tide::host> s;
  tide::test::gate g;
  s.launch(&tide::test::gate::pass, &g);
  b.record(s);
  CHECK_FALSE(b.query());
  mem::record(ex, b);
  CHECK(b.query());
  g.open();
  s.synchronize();
}
