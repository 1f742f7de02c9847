#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <tide/chunk/access_trace.hpp>
#include <tide/chunk/memory_tracer.hpp>

#include "support/kernel_checks.hpp"

using tide::chunk::access_trace;
using tide::test::usage_error;
using ids = std::vector<std::uint32_t>;

namespace {

// Runs parse(text), which must throw tide::error(corrupt); returns its message.
std::string corrupt_error(std::string const& text) {
  try {
    (void)access_trace::parse(text);
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::corrupt);
    return e.message();
  }
  FAIL("expected a tide::error(corrupt) for:\n" << text);
  return {};
}

bool has(std::string const& msg, std::string const& part) { return msg.find(part) != std::string::npos; }

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
    ids touched, on_host, released, written;
    for (std::uint32_t k = width(rng); k > 0; --k) touched.push_back(id(rng));
    if (with_host_and_released) {
      for (std::uint32_t k = width(rng) / 2; k > 0; --k) on_host.push_back(id(rng));
      for (std::uint32_t k = width(rng) / 2; k > 0; --k) released.push_back(id(rng));
      for (std::uint32_t c : touched)
        if (rng() % 2 == 0) written.push_back(c);
    }
    tr.add_moment(touched, on_host, released, written);
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
  // A written chunk must be one the moment touches; an id past chunks() is named too.
  std::string const w = usage_error([&] { tr.add_moment(ids{0, 1}, ids{}, ids{}, ids{2}); });
  CHECK(w.find("written chunk 2") != std::string::npos);
  CHECK(w.find("touched") != std::string::npos);
  CHECK(usage_error([&] { tr.add_moment(ids{0}, ids{}, ids{}, ids{5}); }).find("written chunk 5") != std::string::npos);
  CHECK(tr == before);
}

TEST_CASE("written: kept per moment, in the text form as 'w:', part of equality") {
  access_trace tr(6);
  tr.add_moment(ids{0, 1});
  tr.add_moment(ids{1, 4}, ids{}, ids{4}, ids{4});
  tr.add_moment(ids{2, 3, 5}, ids{1}, ids{}, ids{5, 2});
  CHECK(tr.written(0).empty());
  CHECK(std::ranges::equal(tr.written(1), ids{4}));
  CHECK(std::ranges::equal(tr.written(2), ids{5, 2}));  // in the order given
  CHECK(tr.to_text() == "chunks: 6\n0 1\n1 4 w: 4 r: 4\n2 3 5 w: 5 2 h: 1\n");
  CHECK(access_trace::parse(tr.to_text()) == tr);
  access_trace same_but_unwritten(6);
  same_but_unwritten.add_moment(ids{0, 1});
  same_but_unwritten.add_moment(ids{1, 4}, ids{}, ids{4});
  same_but_unwritten.add_moment(ids{2, 3, 5}, ids{1});
  CHECK_FALSE(same_but_unwritten == tr);
  tr.clear();
  CHECK(tr.moments() == 0);
  CHECK(tr.to_text() == "chunks: 6\n");
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

TEST_CASE("parse errors are corrupt-file errors that name the line") {
  auto msg = corrupt_error("0 1\n# fine\n2 x3\n");
  CHECK(has(msg, "line 3"));
  CHECK(has(msg, "'x3'"));
  msg = corrupt_error("0\nr: 1 h: 2\n");
  CHECK(has(msg, "line 2"));
  CHECK(has(msg, "out of order"));
  msg = corrupt_error("chunks: 2\n0 1\n\n1 2\n");
  CHECK(has(msg, "line 4"));
  CHECK(has(msg, "chunk 2"));
  msg = corrupt_error("0\nchunks: 4\n");
  CHECK(has(msg, "line 2"));
  msg = corrupt_error("0 -1\n");
  CHECK(has(msg, "line 1"));
  CHECK(has(msg, "'-1' is negative"));
  msg = corrupt_error("99999999999\n");
  CHECK(has(msg, "32 bits"));
  // 'w:' names ids the moment touches, after the touched ids and before 'h:' and 'r:'.
  msg = corrupt_error("0 1\n2 3 w: 4\n");
  CHECK(has(msg, "line 2"));
  CHECK(has(msg, "written chunk 4"));
  msg = corrupt_error("2 3 h: 1 w: 2\n");
  CHECK(has(msg, "line 1"));
  CHECK(has(msg, "'w:' out of order"));
  msg = corrupt_error("2 w: 2 w: 2\n");
  CHECK(has(msg, "'w:' out of order"));
  msg = corrupt_error("-\n2 w: 2x\n");
  CHECK(has(msg, "line 2"));
  CHECK(has(msg, "'2x' is not a chunk id"));
  msg = corrupt_error("chunks: 3\n2 w: 3\n");
  CHECK(has(msg, "chunk 3"));
}

TEST_CASE("parse: a corrupt chunk count is an error naming the line and the value, not an allocation") {
  // 2^32 - 1 chunks would be a table of 2^32 entries (about 100 GB): the text of 19 bytes cannot
  // describe that many chunks.
  auto msg = corrupt_error("chunks: 4294967295\n");
  CHECK(has(msg, "line 1"));
  CHECK(has(msg, "4294967295"));
  CHECK(has(msg, "at most 1048576"));
  msg = corrupt_error("# a trace\nchunks: 18446744073709551615\n0\n");  // 2^64 - 1
  CHECK(has(msg, "line 2"));
  CHECK(has(msg, "18446744073709551615"));
  msg = corrupt_error("chunks: 18446744073709551616\n");  // 2^64: does not even parse
  CHECK(has(msg, "line 1"));
  CHECK(has(msg, "64 bits"));
  // Without 'chunks:', the largest id sets the count: the same bound, naming the id's line.
  msg = corrupt_error("0 1\n2 4294967294\n");
  CHECK(has(msg, "line 2"));
  CHECK(has(msg, "4294967294"));
  // The bound grows with the text (a byte per chunk), so large honest traces still parse.
  CHECK(access_trace::parse("chunks: 1048576\n0\n").chunks() == 1048576);
  std::string big = "chunks: 1048577\n";
  big.resize(1048577, '\n');  // blank lines: 1048577 bytes
  CHECK(access_trace::parse(big).chunks() == 1048577);
  big.pop_back();
  CHECK(has(corrupt_error(big), "1048577"));
}

TEST_CASE("parse: every integer is checked: signs, trailing characters, hex, empty counts") {
  struct bad {
    char const* text;
    char const* says;
  };
  for (bad const& b : {bad{"chunks: -3\n", "'-3' is negative"}, bad{"chunks: 4x\n0\n", "'4x' is not a chunk count"},
                       bad{"chunks: 4 5\n", "alone on its line"}, bad{"chunks:\n", "alone on its line"},
                       bad{"chunks: 2\nchunks: 2\n", "must come once"}, bad{"1 +2\n", "'+2' is not a chunk id"},
                       bad{"1 0x10\n", "'0x10' is not a chunk id"}, bad{"3;\n", "'3;' is not a chunk id"},
                       bad{"1 h: 2 h: 3\n", "'h:' out of order"}, bad{"1 - 2\n", "'-' is not a chunk id"},
                       bad{"chunks:4\n", "'chunks:4' is not a chunk id"},
                       bad{"1\n2 99999999999999999999999\n", "64 bits"}}) {
    CAPTURE(b.text);
    std::string const msg = corrupt_error(b.text);
    CHECK(has(msg, b.says));
    CHECK(has(msg, "line "));
  }
}

TEST_CASE("memory_tracer records the written ids: a replay that writes otherwise records again; amend keeps them") {
  using tide::chunk::memory_tracer;
  using tide::chunk::phase;
  memory_tracer tracer{{.device_budget = 1000}};
  tracer.set_chunks(4);
  auto step = [&](ids const& backward_writes) {
    tracer.begin_step();
    (void)tracer.at({0, phase::forward}, ids{0});
    (void)tracer.at({0, phase::backward}, ids{0, 2}, {}, {}, backward_writes);
    (void)tracer.at({0, phase::optimizer}, ids{}, ids{0}, ids{2});
    tracer.end_step();
  };
  step(ids{2});
  REQUIRE(tracer.warm());
  CHECK(std::ranges::equal(tracer.trace().written(1), ids{2}));
  CHECK(tracer.trace().to_text() == "chunks: 4\n0\n0 2 w: 2\nh: 0 r: 2\n");
  step(ids{2});
  CHECK(tracer.invalidations() == 0);
  step(ids{0, 2});  // the same ids touched, other writes: not the recorded step
  CHECK(tracer.invalidations() == 1);
  CHECK(std::ranges::equal(tracer.trace().written(1), ids{0, 2}));
  // An f of five arguments: the writes of ids still touched stay.
  tracer.amend([](std::size_t t, tide::chunk::moment, std::vector<std::uint32_t>& touched, std::vector<std::uint32_t>&,
                  std::vector<std::uint32_t>&) {
    if (t == 1) touched = {2};
  });
  CHECK(std::ranges::equal(tracer.trace().written(1), ids{2}));
  // Of six: the writes are the caller's (the engine: a device optimizer step writes its parameters).
  tracer.amend([](std::size_t, tide::chunk::moment m, std::vector<std::uint32_t>& touched,
                  std::vector<std::uint32_t>& on_host, std::vector<std::uint32_t>&, std::vector<std::uint32_t>& written) {
    if (m.phase != phase::optimizer) return;
    touched = {0};
    on_host.clear();
    written = {0};
  });
  CHECK(tracer.trace().to_text() == "chunks: 4\n0\n2 w: 2\n0 w: 0 r: 2\n");
}
