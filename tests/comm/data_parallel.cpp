// comm::data_parallel on one rank (comm::self): the bucketed sink, its two streams and the trainer's
// scaling by the world size, with nothing to sum, must give the bits of training without it, under
// chunked offload and resident, for buckets of one chunk, several, and whole blocks.

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "tide/comm/data_parallel.hpp"
#include "tide/comm/self.hpp"
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
      CHECK(tide::train::progress_text(st, 4, 0).find("all-reduced") != std::string::npos);
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

TEST_CASE("data_parallel refuses what it cannot do, naming what to pass") {
  tide::comm::self one;
  CHECK_THROWS_WITH_AS((void)(tide::comm::data_parallel<tide::comm::self>{.comm = &one, .zero = 2}.sink()),
                       doctest::Contains("zero = 2"), tide::error);
  CHECK_THROWS_WITH_AS((void)(tide::comm::data_parallel<tide::comm::self>{.comm = nullptr}.rank()),
                       doctest::Contains(".comm is null"), tide::error);
  CHECK_THROWS_WITH_AS((void)(tide::comm::data_parallel<tide::comm::self>{.comm = &one, .bucket_bytes = 0}.sink()),
                       doctest::Contains("bucket_bytes = 0"), tide::error);
}
