#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <tide/chunk/access_trace.hpp>

#include "support/kernel_checks.hpp"

using tide::chunk::access_trace;
using tide::test::usage_error;
using ids = std::vector<std::uint32_t>;

namespace {

// The definition, by scanning forward moment by moment (cyclically) for a touch of c.
std::size_t naive_next_use(access_trace const& tr, std::uint32_t c, std::size_t t) {
  std::size_t const m = tr.moments();
  for (std::size_t d = 1; d <= m; ++d) {
    auto const row = tr.touched((t + d) % m);
    if (std::find(row.begin(), row.end(), c) != row.end()) return d;
  }
  return access_trace::never;
}

// Random trace: some chunks never touched, some touched once, duplicates and empty moments allowed.
access_trace random_trace(std::mt19937& rng, bool with_host_and_released) {
  std::uniform_int_distribution<std::uint32_t> n_chunks(1, 10), n_moments(1, 12), width(0, 4);
  std::uint32_t const chunks = n_chunks(rng);
  std::uniform_int_distribution<std::uint32_t> id(0, chunks - 1);
  access_trace tr(chunks);
  for (std::uint32_t t = 0, m = n_moments(rng); t < m; ++t) {
    ids touched, on_host, released;
    for (std::uint32_t k = width(rng); k > 0; --k) touched.push_back(id(rng));
    if (with_host_and_released) {
      for (std::uint32_t k = width(rng) / 2; k > 0; --k) on_host.push_back(id(rng));
      for (std::uint32_t k = width(rng) / 2; k > 0; --k) released.push_back(id(rng));
    }
    tr.add_moment(touched, on_host, released);
  }
  return tr;
}

}  // namespace

TEST_CASE("next_use_distance: hand-worked cyclic distances") {
  access_trace tr(4);  // chunk 3 never touched
  tr.add_moment(ids{0, 1});
  tr.add_moment(ids{2});
  tr.add_moment(ids{0});
  CHECK(tr.moments() == 3);
  CHECK(tr.next_use_distance(0, 0) == 2);  // forward to moment 2
  CHECK(tr.next_use_distance(0, 2) == 1);  // wraps to moment 0
  CHECK(tr.next_use_distance(1, 0) == 3);  // touched only at 0: a full cycle
  CHECK(tr.next_use_distance(1, 1) == 2);
  CHECK(tr.next_use_distance(2, 1) == 3);
  CHECK(tr.next_use_distance(3, 0) == access_trace::never);
  CHECK(usage_error([&] { (void)tr.next_use_distance(4, 0); }).find("4 chunks") != std::string::npos);
  CHECK(usage_error([&] { (void)tr.next_use_distance(0, 3); }).find("3 moments") != std::string::npos);
}

TEST_CASE("next_use_distance equals a naive scan on random traces") {
  std::mt19937 rng(42);
  std::size_t never_seen = 0, once_seen = 0;
  for (int trial = 0; trial < 300; ++trial) {
    access_trace const tr = random_trace(rng, trial % 2 == 1);
    for (std::uint32_t c = 0; c < tr.chunks(); ++c) {
      never_seen += tr.uses(c).empty();
      once_seen += tr.uses(c).size() == 1;
      for (std::size_t t = 0; t < tr.moments(); ++t) {
        std::size_t const d = tr.next_use_distance(c, t);
        REQUIRE(d == naive_next_use(tr, c, t));
        CHECK((d == access_trace::never || (d >= 1 && d <= tr.moments())));
      }
    }
  }
  // The random traces did cover the edge cases.
  CHECK(never_seen > 0);
  CHECK(once_seen > 0);
}

TEST_CASE("working_set counts distinct chunks of the widest moment") {
  access_trace tr(5);
  CHECK(tr.working_set() == 0);
  tr.add_moment(ids{1, 1, 1});  // one chunk listed three times
  CHECK(tr.working_set() == 1);
  tr.add_moment(ids{0, 2, 4}, ids{3}, ids{3});
  tr.add_moment(ids{2, 3});
  CHECK(tr.working_set() == 3);
  CHECK(tr.touched(0).size() == 3);  // kept as given: the tracer compares moments with it
  CHECK(tr.uses(1).size() == 1);
  tr.clear();
  CHECK(tr.moments() == 0);
  CHECK(tr.working_set() == 0);
  CHECK(tr.chunks() == 5);
  CHECK(tr.uses(1).empty());
}

TEST_CASE("add_moment rejects an id past chunks() and leaves the trace as it was") {
  access_trace tr(3);
  tr.add_moment(ids{0, 1});
  access_trace const before = tr;
  std::string const msg = usage_error([&] { tr.add_moment(ids{2}, ids{}, ids{7}); });
  CHECK(msg.find("released chunk 7") != std::string::npos);
  CHECK(msg.find("3 chunks") != std::string::npos);
  CHECK(tr == before);
  CHECK(tr.next_use_distance(0, 0) == 1);
}

TEST_CASE("parse(to_text(t)) == t on random traces") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    access_trace const tr = random_trace(rng, true);
    std::string const text = tr.to_text();
    access_trace const back = access_trace::parse(text);
    CHECK(back == tr);
    CHECK(back.to_text() == text);
  }
  access_trace const empty;
  CHECK(access_trace::parse(empty.to_text()) == empty);
  // Equality sees every part of a moment.
  access_trace a(3), b(3);
  a.add_moment(ids{0}, ids{1});
  b.add_moment(ids{0}, ids{}, ids{1});
  CHECK_FALSE(a == b);
}

TEST_CASE("parse: the text form") {
  access_trace const tr = access_trace::parse(
      "# a comment line\n"
      "\n"
      "3 4 7 h: 5 r: 5   # trailing comment\n"
      "-\n"
      "r: 1\n"
      "\t0\r\n");
  REQUIRE(tr.moments() == 4);
  CHECK(tr.chunks() == 8);  // no "chunks:" line: the largest id + 1
  CHECK(std::ranges::equal(tr.touched(0), ids{3, 4, 7}));
  CHECK(std::ranges::equal(tr.on_host(0), ids{5}));
  CHECK(std::ranges::equal(tr.released(0), ids{5}));
  CHECK(tr.touched(1).empty());
  CHECK(tr.released(1).empty());
  CHECK(tr.touched(2).empty());
  CHECK(std::ranges::equal(tr.released(2), ids{1}));
  CHECK(std::ranges::equal(tr.touched(3), ids{0}));
  CHECK(tr.to_text() == "chunks: 8\n3 4 7 h: 5 r: 5\n-\nr: 1\n0\n");
  CHECK(access_trace::parse("chunks: 10\n1\n").chunks() == 10);
}

TEST_CASE("parse errors name the line") {
  auto msg = usage_error([] { (void)access_trace::parse("0 1\n# fine\n2 x3\n"); });
  CHECK(msg.find("line 3") != std::string::npos);
  CHECK(msg.find("'x3'") != std::string::npos);
  msg = usage_error([] { (void)access_trace::parse("0\nr: 1 h: 2\n"); });
  CHECK(msg.find("line 2") != std::string::npos);
  CHECK(msg.find("out of order") != std::string::npos);
  msg = usage_error([] { (void)access_trace::parse("chunks: 2\n0 1\n\n1 2\n"); });
  CHECK(msg.find("line 4") != std::string::npos);
  CHECK(msg.find("chunk 2") != std::string::npos);
  msg = usage_error([] { (void)access_trace::parse("0\nchunks: 4\n"); });
  CHECK(msg.find("line 2") != std::string::npos);
  msg = usage_error([] { (void)access_trace::parse("0 -1\n"); });
  CHECK(msg.find("line 1") != std::string::npos);
  msg = usage_error([] { (void)access_trace::parse("99999999999\n"); });
  CHECK(msg.find("32 bits") != std::string::npos);
}
