// comm::data_parallel on one rank (comm::self): the bucketed sink, its two streams and the trainer's
// scaling by the world size, with nothing to sum, must give the bits of training without it, under
// chunked offload and resident, for buckets of one chunk, several, and whole blocks.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "tide/comm/data_parallel.hpp"
#include "tide/comm/self.hpp"
#include "tide/offload/trace_events.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/train/report.hpp"
#include "tide/train/trainer.hpp"
#include "support/gpt_steps.hpp"

namespace {

using namespace tide::literals;
using tide::host;
namespace off = tide::offload;

constexpr auto config = tide::test::tiny_gpt;
constexpr auto batch = tide::test::tiny_batch, seq = tide::test::tiny_seq;
auto const spec = tide::test::tiny_spec();
tide::optim::adamw const opt{.lr = 3e-3f};

template <class Trainer>
std::vector<float> run(Trainer& t) {
  for (int s = 0; s < 4; ++s) {
    auto const st = t.step(tide::test::tiny_view<Trainer>(tide::test::token_runs(s, batch, seq, 64)));
    if constexpr (!std::is_same_v<typename Trainer::comm_type, tide::train::no_comm>) {
      // Every gradient chunk, once per step, and the progress line says so.
      CHECK(st.bytes_reduced == t.scheduler().layout().chunks() * t.scheduler().chunk_bytes());
      CHECK(tide::train::progress_text(st, 4, 0).find("reduced ") != std::string::npos);
    } else {
      CHECK(st.bytes_reduced == 0);
    }
  }
  return tide::test::flat_params(t);
}

template <class Offload>
void check_same(Offload off) {
  if constexpr (Offload::moves_data)
    off.device_budget = tide::test::scheduler_minimum<Offload, float>(config, off, batch, seq) + 16_KiB;
  auto plain = tide::train::make_trainer(spec, off, opt);
  auto const want = run(plain);
  tide::comm::self one;
  for (std::size_t bucket : {std::size_t{1}, std::size_t{60_KiB}, std::size_t{1_GiB}}) {
    CAPTURE(bucket);
    auto t = tide::train::make_trainer(spec, off, opt, tide::comm::data_parallel{.comm = &one, .bucket_bytes = bucket});
    CHECK(t.comm().world_size() == 1);
    auto const got = run(t);
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    auto const stats = t.scheduler().sink().stats();
    CHECK(stats.chunks == 4u * t.scheduler().layout().chunks());
    if (bucket == 1) CHECK(stats.packed_buckets == 0);
    if (bucket == 1_GiB) CHECK(stats.packed_buckets > 0);
  }
}

}  // namespace

TEST_CASE("data_parallel on one rank gives the bits of training without it") {
  check_same(off::chunked<off::belady>{.chunk_bytes = 20_KiB});
  check_same(off::resident{.chunk_bytes = 20_KiB});
}

TEST_CASE("a traced data-parallel step shows each bucket's all-reduce on the comm lane of the timeline") {
  auto off = off::chunked<off::belady>{.chunk_bytes = 20_KiB};
  off.device_budget = tide::test::scheduler_minimum<decltype(off), float>(config, off, batch, seq) + 16_KiB;
  tide::comm::self one;
  auto t = tide::train::make_trainer(spec, off, opt, tide::comm::data_parallel{.comm = &one, .bucket_bytes = 40_KiB});
  (void)t.step(tide::test::tiny_view<decltype(t)>(tide::test::token_runs(0, batch, seq, 64)));
  tide::offload::trace_recorder timeline;
  t.scheduler().set_trace(&timeline);
  auto const before = t.scheduler().sink().stats();
  (void)t.step(tide::test::tiny_view<decltype(t)>(tide::test::token_runs(1, batch, seq, 64)));
  t.scheduler().set_trace(nullptr);
  auto const after = t.scheduler().sink().stats();
  std::uint64_t buckets = 0, bytes = 0;
  double comm_us = 0, overlapped_us = 0;
  auto const events = timeline.events();
  for (auto const& e : events) {
    if (e.where != tide::offload::lane::comm) continue;
    ++buckets;
    bytes += e.bytes;
    CHECK(e.name.rfind("all_reduce bucket ", 0) == 0);
    comm_us += e.duration_us;
    for (auto const& c : events)  // the part of it that ran while a block computed
      if (c.where == tide::offload::lane::compute)
        overlapped_us += std::max(0.0, std::min(e.start_us + e.duration_us, c.start_us + c.duration_us) -
                                           std::max(e.start_us, c.start_us));
  }
  CHECK(buckets == after.buckets - before.buckets);  // every bucket of the step, on the comm lane
  CHECK(bytes == after.bytes - before.bytes);
  CHECK(timeline.to_json("tide").find("comm (gradient sink)") != std::string::npos);
  // How much of it ran beside backward depends on the machine's load: shown, not asserted.
  MESSAGE(buckets, " buckets on the comm lane, ", comm_us, " us, ", overlapped_us, " us of it beside compute");
}

TEST_CASE("data_parallel refuses what it cannot do, naming what to pass") {
  tide::comm::self one;
  CHECK_THROWS_WITH_AS((void)(tide::comm::data_parallel<tide::comm::self>{.comm = &one, .zero = 4}.sink()),
                       doctest::Contains("zero = 4"), tide::error);
  CHECK_THROWS_WITH_AS((void)(tide::comm::data_parallel<tide::comm::self>{.comm = &one, .zero = -1}.sink()),
                       doctest::Contains("zero = -1"), tide::error);
  CHECK_THROWS_WITH_AS((void)(tide::comm::data_parallel<tide::comm::self>{.comm = nullptr}.rank()),
                       doctest::Contains(".comm is null"), tide::error);
  CHECK_THROWS_WITH_AS((void)(tide::comm::data_parallel<tide::comm::self>{.comm = &one, .bucket_bytes = 0}.sink()),
                       doctest::Contains("bucket_bytes = 0"), tide::error);
}
