// comm::device_data_parallel on tide::sealed, the ranks as threads (support/thread_ranks.hpp): the
// code comm::nccl_data_parallel runs on GPUs, on a device the host cannot read, with the
// collective's operations on a stream of their own. Two ranks given the same batches sum to twice
// one rank's gradients, exactly, and the trainer divides by 2, exactly: every rank must keep the
// bits of one rank training alone, with ZeRO-1 and 2 too (the state sharded, the stepped
// parameters broadcast in place or, for chunks on the host, through device staging, the others'
// gradients left NaN by reduce) and 3 (the parameters gathered into device or host blocks).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tide/comm/device_data_parallel.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/optim/sgd.hpp"
#include "tide/train/trainer.hpp"
#include "support/files.hpp"
#include "support/gpt_steps.hpp"
#include "support/sealed_gpt.hpp"
#include "support/thread_ranks.hpp"

namespace {

using namespace tide::literals;
using tide::sealed;
namespace off = tide::offload;
using namespace tide::test::sealed_gpt;  // config, batch, seq, steps, chunk_bytes
using tide::test::thread_rank;
using tide::test::thread_world;
using dp = tide::comm::device_data_parallel<thread_rank, thread_rank>;

tide::nn::gpt_spec<sealed> const spec{.config = config, .options = {.seed = 7}};
tide::optim::adamw const opt{.lr = 3e-3f, .weight_decay = 0.1f};

template <class Trainer>
using feeder = tide::test::batch_feeder<Trainer, batch, seq, config.vocab>;

// What one rank ends with: its losses, every parameter, and by tensor the optimizer state of
// those it keeps state for (under ZeRO, its own chunks'; empty for the others). `gather`: under
// ZeRO-3 every rank gathers every chunk first (a collective); without it, the parameters a rank
// does not hold are left out.
struct result {
  std::vector<float> losses, params;
  std::vector<std::vector<float>> state;
  // ZeRO-3: other ranks' chunks received into device and host blocks, over the steps after the
  // warm-up (in which a chunked policy does not know its budget yet, so every gather lands on
  // the host).
  std::size_t gathered_device = 0, gathered_host = 0;
  // ZeRO-1/2: chunks shared in place in device memory, and through the sink's staging.
  std::uint64_t shared_in_place = 0, shared_staged = 0;
};

template <class Trainer>
result result_of(Trainer& t, std::vector<float> losses, std::size_t lists = 2, bool gather = true) {
  result out{std::move(losses), {}, {}};
  auto& sched = t.scheduler();
  if (gather) sched.gather_parameters();
  for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) {
    if (sched.holds_parameter(i)) {
      auto const p = sched.read_param(i);
      out.params.insert(out.params.end(), p.begin(), p.end());
    }
    auto& s = out.state.emplace_back();
    if (!sched.keeps_state(i)) continue;
    for (std::size_t k = 0; k < lists; ++k) {
      auto const b = sched.state_view(k, i);
      auto const* f = reinterpret_cast<float const*>(b.data());
      s.insert(s.end(), f, f + b.size() / sizeof(float));
    }
  }
  return out;
}

template <class Trainer>
std::vector<float> train(Trainer& t, int from = 0, int to = steps, result* gathers = nullptr) {
  feeder<Trainer> feed;
  std::vector<float> losses;
  for (int s = from; s < to; ++s) {
    losses.push_back(t.step(feed(t, s)).loss);
    auto const& st = t.scheduler().last_step();
    if (gathers == nullptr || st.warm_up) continue;
    gathers->gathered_device += st.gathered_device_bytes;
    gathers->gathered_host += st.gathered_host_bytes;
  }
  return losses;
}

float max_difference(std::vector<float> const& a, std::vector<float> const& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Each rank's losses and parameters are those of one rank alone, bit for bit; so is the state of
// every tensor it keeps, and every tensor's state is kept by some rank (by one only, for most
// tensors, under ZeRO).
void check_as_alone(std::vector<result> const& ranks, result const& alone, int zero) {
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    CAPTURE(r);
    CHECK(same_bits(ranks[r].losses, alone.losses));
    CHECK(same_bits(ranks[r].params, alone.params));
  }
  std::size_t const n = alone.state.size();
  std::size_t sharded = 0;
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    int keepers = 0;
    for (auto const& rank : ranks) {
      if (rank.state[i].empty()) continue;
      ++keepers;
      CHECK(same_bits(rank.state[i], alone.state[i]));
    }
    if (zero == 0) CHECK(keepers == static_cast<int>(ranks.size()));
    else CHECK(keepers >= 1);
    sharded += keepers < static_cast<int>(ranks.size()) ? 1 : 0;
  }
  if (zero > 0) CHECK(sharded > n / 3);  // chunk c on rank c % 2: most tensors on one rank only
}

template <class Offload>
result alone_under(Offload const& offload) {
  auto t = tide::train::make_trainer(spec, offload, opt);
  auto losses = train(t);
  return result_of(t, std::move(losses));
}

template <class Offload>
std::vector<result> two_ranks_under(Offload const& offload, int zero, thread_world& world) {
  std::vector<result> out(2);
  tide::test::run_ranks(world, [&](int rank) {
    thread_rank r{world, rank};
    auto t = tide::train::make_trainer(spec, offload, opt, dp{.gpus = &r, .host = &r, .zero = zero});
    CHECK(t.comm().world_size() == 2);
    result gathers;
    auto losses = train(t, 0, steps, &gathers);
    auto& mine = out[static_cast<std::size_t>(rank)];
    mine = result_of(t, std::move(losses));
    if (zero == 3) {  // gather_parameters() put the other ranks' chunks in host blocks, for the host
      auto& sched = t.scheduler();
      for (std::uint32_t i = 0; i < sched.parameters().size(); ++i)
        if (!sched.keeps_state(i)) CHECK(sched.param_data(i) != nullptr);
    }
    mine.gathered_device = gathers.gathered_device;
    mine.gathered_host = gathers.gathered_host;
    mine.shared_in_place = t.scheduler().sink().stats().shared_in_place;
    mine.shared_staged = t.scheduler().sink().stats().shared_staged;
  });
  return out;
}

}  // namespace

TEST_CASE("device_data_parallel: two ranks given the same batches keep the bits of one alone, ZeRO 0 to 3") {
  off::resident const resident{.device_budget = 64_MiB, .chunk_bytes = chunk_bytes};
  off::chunked<off::belady> const roomy{.device_budget = 64_MiB, .chunk_bytes = chunk_bytes};
  // ZeRO-3's gathers land in device blocks where the budget has room, in host blocks otherwise:
  // with `device_only` every one after the warm-up finds room; just above the minimum, some do.
  // ZeRO-1/2's shares go in place for chunks in device memory, through the staging for those on
  // the host: under `resident` every chunk is on the device; under chunked some are on the host.
  auto each = [&](auto const& offload, std::string const& what, bool device_only, bool all_on_device) {
    INFO(what);
    result const alone = alone_under(offload);
    for (int zero : {0, 1, 2, 3}) {
      CAPTURE(zero);
      thread_world world{2};
      auto const ranks = two_ranks_under(offload, zero, world);
      check_as_alone(ranks, alone, zero);
      bool const shares = zero == 1 || zero == 2;
      for (auto const& r : ranks) {
        CHECK((r.gathered_device > 0) == (zero == 3));
        CHECK((r.gathered_host > 0) == (zero == 3 && !device_only));
        CHECK((r.shared_in_place > 0) == shares);
        CHECK((r.shared_staged > 0) == (shares && !all_on_device));
      }
    }
  };
  each(resident, "resident", true, true);
  each(roomy, "chunked<belady>, roomy: every gather finds room", true, false);
  off::chunked<off::belady> tight{.chunk_bytes = chunk_bytes};  // chunks move; some are stepped on the host
  tight.device_budget = tide::test::scheduler_minimum<decltype(tight), float>(config, tight, batch, seq) + 4_KiB;
  each(tight, "chunked<belady> just above its minimum", false, false);
}

TEST_CASE("device_data_parallel: two ranks on their own batches equal one process accumulating both, with clipping, "
          "ZeRO 0, 2 and 3") {
  // SGD with momentum and a clipped norm (under ZeRO-2, each rank's own chunks' squares summed
  // over the ranks on the host), on rank r the batches of step 2 s + r.
  tide::optim::sgd const clipped{.lr = 0.05f, .momentum = 0.9f, .clip_norm = 0.5f};
  off::resident const resident{.device_budget = 64_MiB, .chunk_bytes = chunk_bytes};
  std::vector<float> reference, alone;
  {
    auto t = tide::train::make_trainer(spec, resident, [&] {
      auto o = clipped;
      o.micro_steps = 2;
      return o;
    }());
    feeder<decltype(t)> f0, f1;
    for (int s = 0; s < steps; ++s) {
      std::vector<typename decltype(t)::batch_type> const micro{f0(t, 2 * s), f1(t, 2 * s + 1)};
      (void)t.step(std::span<typename decltype(t)::batch_type const>(micro));
    }
    reference = result_of(t, {}, 1).params;
  }
  {  // rank 0's batches alone drift away from the reference: the comparison can fail
    auto t = tide::train::make_trainer(spec, resident, clipped);
    feeder<decltype(t)> feed;
    for (int s = 0; s < steps; ++s) (void)t.step(feed(t, 2 * s));
    alone = result_of(t, {}, 1).params;
  }
  CHECK(max_difference(alone, reference) > 1e-3f);
  for (int zero : {0, 2, 3}) {
    CAPTURE(zero);
    thread_world world{2};
    std::vector<std::vector<float>> params(2);
    std::vector<tide::comm::device_sink<thread_rank>::totals> sums(2);
    tide::test::run_ranks(world, [&](int rank) {
      thread_rank r{world, rank};
      auto t = tide::train::make_trainer(spec, resident, clipped, dp{.gpus = &r, .host = &r, .zero = zero});
      CHECK(t.scheduler().shards_parameters() == (zero == 3));
      feeder<decltype(t)> feed;
      for (int s = 0; s < steps; ++s) (void)t.step(feed(t, 2 * s + rank));
      params[static_cast<std::size_t>(rank)] = result_of(t, {}, 1).params;
      sums[static_cast<std::size_t>(rank)] = t.scheduler().sink().stats();
    });
    // The order of the sums differs only: one process adds micro-batch 1's contributions into the
    // gradients that hold micro-batch 0's, the ranks each sum their own and then add the totals
    // (and under ZeRO-2 and 3 the norm's squares are summed by chunk owner). Each difference is a
    // rounding of a gradient (2^-24 relative), carried by SGD into the parameters scaled by lr,
    // with momentum over 4 steps: 1e-6 is the MPI tests' bound for the same model, 100 times what
    // they measure.
    float const diff = max_difference(params[0], reference);
    MESSAGE("ZeRO-", zero, ": max |two ranks - accumulated| = ", diff);
    CHECK(diff <= 1e-6f);
    CHECK(same_bits(params[0], params[1]));  // every rank holds the same parameters
    for (auto const& st : sums) {
      CHECK(st.chunks > 0);
      CHECK(st.bytes > 0);
      CHECK((st.bytes_shared > 0) == (zero > 0));
    }
  }
}

TEST_CASE("device_data_parallel: a step whose collective fails loses nothing on either rank, and a restart from the "
          "checkpoint set gives the straight run's bits; a failure on one rank alone ends the communicator for all") {
  off::resident const resident{.device_budget = 64_MiB, .chunk_bytes = chunk_bytes};
  tide::test::scratch_dir dir{"device_data_parallel"};
  for (int zero : {0, 1, 2, 3}) {
    CAPTURE(zero);
    // ZeRO: a checkpoint set, a file per rank in a folder. (Without ZeRO every rank writes the same
    // one file, through a temporary named by the process: ranks as threads of one process would
    // collide there, so ZeRO-0 is checked without the restart.)
    bool const restart = zero > 0;
    // The straight run, and the device operations each rank enqueued by the start and the end of step 2.
    std::vector<result> straight(2);
    std::uint64_t before_2 = 0, after_2 = 0;
    {
      thread_world world{2};
      tide::test::run_ranks(world, [&](int rank) {
        thread_rank r{world, rank};
        auto t = tide::train::make_trainer(spec, resident, opt, dp{.gpus = &r, .host = &r, .zero = zero});
        auto losses = train(t, 0, 2);
        if (rank == 1) before_2 = r.operations();
        auto more = train(t, 2, 3);
        if (rank == 1) after_2 = r.operations();
        losses.insert(losses.end(), more.begin(), more.end());
        more = train(t, 3);
        losses.insert(losses.end(), more.begin(), more.end());
        straight[static_cast<std::size_t>(rank)] = result_of(t, std::move(losses));
      });
    }
    REQUIRE(after_2 > before_2 + 2);
    // Rank 1's first device operation of step 2 fails (a gradient sum; under ZeRO-3 a gather), or
    // its last (sharing the parameters; under ZeRO-3 a gradient sum).
    for (std::uint64_t fail_at : {before_2 + 1, after_2}) {
      CAPTURE(fail_at);
      {
        thread_world world{2};
        world.fail_rank = 1;
        world.fail_at = static_cast<int>(fail_at);
        tide::test::run_ranks(world, [&](int rank) {
          thread_rank r{world, rank};
          auto t = tide::train::make_trainer(spec, resident, opt, dp{.gpus = &r, .host = &r, .zero = zero});
          (void)train(t, 0, 2);
          if (restart) t.save(dir.path);
          result const before = result_of(t, {}, 2, false);  // under ZeRO-3 its own chunks
          feeder<decltype(t)> feed;
          try {
            (void)t.step(feed(t, 2));
            CHECK_MESSAGE(false, "step 2 must fail on rank ", rank);
          } catch (tide::error const& e) {
            CHECK(e.category() == tide::errc::nccl);
          }
          result const after = result_of(t, {}, 2, false);
          CHECK(same_bits(after.params, before.params));  // parameters and optimizer state as they were
          CHECK(after.state == before.state);
        });
      }
      if (!restart) continue;
      // Every rank restarts from the checkpoint set: the straight run's bits.
      thread_world world{2};
      std::vector<result> resumed(2);
      tide::test::run_ranks(world, [&](int rank) {
        thread_rank r{world, rank};
        auto t = tide::train::make_trainer(spec, resident, opt, dp{.gpus = &r, .host = &r, .zero = zero});
        t.load(dir.path);
        auto losses = train(t, 2);
        resumed[static_cast<std::size_t>(rank)] = result_of(t, std::move(losses));
      });
      for (std::size_t rank = 0; rank < 2; ++rank) {
        CAPTURE(rank);
        auto const& want = straight[rank];
        CHECK(same_bits(resumed[rank].losses, std::vector<float>(want.losses.begin() + 2, want.losses.end())));
        CHECK(same_bits(resumed[rank].params, want.params));
        CHECK(resumed[rank].state == want.state);
      }
    }
    // A failure of rank 1 alone, as it enqueues its second device operation of step 2 or its
    // last: rank 1's step is undone, and its abandon (or its failed gather or share) ends the
    // communicator, so rank 0 hears of it from rank 1, not from a deadline.
    for (std::uint64_t local_at : {before_2 + 2, after_2}) {
      CAPTURE(local_at);
      thread_world world{2};
      world.local_rank = 1;
      world.local_at = static_cast<int>(local_at);
      std::vector<std::string> errors(2);
      tide::test::run_ranks(world, [&](int rank) {
        thread_rank r{world, rank};
        auto t = tide::train::make_trainer(spec, resident, opt, dp{.gpus = &r, .host = &r, .zero = zero});
        (void)train(t, 0, 2);
        result const before = result_of(t, {}, 2, false);
        feeder<decltype(t)> feed;
        try {
          (void)t.step(feed(t, 2));
        } catch (tide::error const& e) {
          errors[static_cast<std::size_t>(rank)] = e.message();
        }
        result const after = result_of(t, {}, 2, false);
        CHECK(same_bits(after.params, before.params));
        CHECK(after.state == before.state);
      });
      CAPTURE(errors[0]);
      CAPTURE(errors[1]);
      CHECK(errors[1].find("local failure injected") != std::string::npos);
      CHECK(errors[0].find("restart every rank") != std::string::npos);
      CHECK(errors[0].find("deadline") == std::string::npos);
    }
  }
}

TEST_CASE("device_data_parallel refuses what it cannot do, naming what to pass") {
  thread_world world{1};
  thread_rank r{world, 0};
  off::resident const resident{.device_budget = 64_MiB, .chunk_bytes = chunk_bytes};
  auto refused = [&](dp const& policy, char const* says) {
    CAPTURE(says);
    try {
      auto t = tide::train::make_trainer(spec, resident, opt, policy);
      CHECK_MESSAGE(false, "refused");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::usage);
      CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
  };
  refused(dp{.gpus = &r, .host = &r, .zero = 4}, "3 (and parameters)");
  refused(dp{.gpus = &r, .host = nullptr}, ".host is null");
}
