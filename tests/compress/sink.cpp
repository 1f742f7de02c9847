// The compressing sinks in training on one rank (a communicator whose collectives can fail): a
// collective that throws, on the sink's worker, fails its step; the step is undone (parameters,
// optimizer state and the sink's lists as they were), the sink starts a fresh worker when the
// step is abandoned, and training goes on to the bits of a run without the failure: under
// chunked offload, resident (backward waits for the sums itself) and ZeRO-1.

#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "support/flaky_comm.hpp"
#include "support/gpt_steps.hpp"
#include "tide/comm/self.hpp"
#include "tide/compress/sink.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/train/trainer.hpp"

namespace {

namespace cx = tide::compress;

using tide::test::flaky_self;

// Four steps without a failure, then the same four steps with collective number `fail_at`
// failing, for each fail_at: the failed step changes nothing, its retry and the rest give the
// bits of the run without the failure.
template <class Policy, class Offload>
void fail_each(Offload const& offload, int zero) {
  namespace ts = tide::test;
  auto const spec = ts::tiny_spec();
  tide::optim::adamw const opt{.lr = 3e-3f};
  auto run = [&](auto& t, int from, int to) {
    for (int s = from; s < to; ++s) {
      auto const d = ts::token_runs(s, ts::tiny_batch, ts::tiny_seq, 64);
      t.step(ts::tiny_view<std::remove_cvref_t<decltype(t)>>(d));
    }
  };
  auto state_of = [](auto& t) {  // parameters, then the sink's lists
    std::vector<float> all;
    auto& sched = t.scheduler();
    for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) {
      auto const p = sched.read_param(i);
      all.insert(all.end(), p.begin(), p.end());
      for (std::size_t l = 0; l < Policy::sink_type::lists.size(); ++l) {
        auto const x = sched.extra_bytes(l, i);
        auto const* f = reinterpret_cast<float const*>(x.data());
        all.insert(all.end(), f, f + x.size() / sizeof(float));
      }
    }
    return all;
  };
  int calls = 0;
  flaky_self never{&calls, 0};
  auto straight = tide::train::make_trainer(spec, offload, opt, Policy{.comm = &never, .zero = zero});
  run(straight, 0, 4);
  int const per_run = calls;
  REQUIRE(per_run > 8);
  auto const reference = state_of(straight);
  for (int fail_at : {1, 2, per_run / 2, per_run / 2 + 1, per_run - 1, per_run}) {
    CAPTURE(fail_at);
    calls = 0;
    flaky_self comm{&calls, fail_at};
    auto t = tide::train::make_trainer(spec, offload, opt, Policy{.comm = &comm, .zero = zero});
    int failures = 0;
    for (int s = 0; s < 4; ++s) {
      auto const before = state_of(t);
      auto const d = ts::token_runs(s, ts::tiny_batch, ts::tiny_seq, 64);
      try {
        t.step(ts::tiny_view<decltype(t)>(d));
      } catch (tide::error const&) {
        ++failures;
        CHECK(state_of(t) == before);  // nothing changed: the lists and the parameters as they were
        t.step(ts::tiny_view<decltype(t)>(d));  // the same step again
      }
    }
    CHECK(failures == 1);
    CHECK(state_of(t) == reference);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("a compressing sink whose collective throws: the step is undone, and training goes on to the same bits",
                   Policy, cx::powersgd_data_parallel<flaky_self>, cx::sparse_data_parallel<flaky_self>) {
  namespace ts = tide::test;
  tide::offload::chunked<tide::offload::belady> chunked{.chunk_bytes = 16 << 10};
  chunked.device_budget = ts::scheduler_minimum<decltype(chunked), float>(ts::tiny_gpt, chunked, ts::tiny_batch,
                                                                          ts::tiny_seq) + (64 << 10);
  SUBCASE("chunked offload, the optimizer on the host beside backward") { fail_each<Policy>(chunked, 0); }
  // Resident: the optimizer state on the device, so backward itself waits for each chunk's sum
  // (and meets the failure there); under ZeRO-1 the sink also shares the parameters.
  tide::offload::resident const resident{.device_budget = 64 << 20, .chunk_bytes = 16 << 10};
  SUBCASE("resident") { fail_each<Policy>(resident, 0); }
  SUBCASE("resident, ZeRO-1") { fail_each<Policy>(resident, 1); }
}
