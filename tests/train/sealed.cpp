// make_trainer on tide::sealed, the test device the host cannot read (core/sealed.hpp): clipping,
// data parallelism and its checkpoints, a failed collective undone, the NVMe tier, bf16 masters
// and gradient-slot reuse, each with the bits of the same run on tide::host. (The scheduler on
// sealed, every policy and every sink, under the sanitizers too: offload/sealed.cpp. This file
// instantiates a dozen trainers: the release suite runs it, the sanitizer builds skip it.)

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <utility>
#include <vector>

#include "tide/comm/data_parallel.hpp"
#include "tide/comm/self.hpp"
#include "tide/compress/sink.hpp"
#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/sealed.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/ops.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/train/trainer.hpp"
#include "support/files.hpp"
#include "support/flaky_comm.hpp"
#include "support/gpt_steps.hpp"
#include "support/sealed_gpt.hpp"

namespace {

using namespace tide::literals;
using tide::host;
using tide::sealed;
namespace off = tide::offload;

using namespace tide::test::sealed_gpt;  // config, batch, seq, steps, chunk_bytes

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The least device budget of `policy` for a step of the model.
template <class Policy>
std::size_t minimum_of(Policy const& policy) {
  return tide::test::scheduler_minimum<Policy, float>(config, policy, batch, seq);
}

}  // namespace

namespace {

// Batches of token_runs, on the trainer's device.
template <class Trainer>
using feeder = tide::test::batch_feeder<Trainer, batch, seq, config.vocab>;

// Parameters, then the optimizer's state, of every tensor (through the staged view on sealed).
template <class Trainer>
std::vector<float> state_of(Trainer& t) {
  std::vector<float> all;
  auto& sched = t.scheduler();
  for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) {
    auto const p = sched.read_param(i);
    all.insert(all.end(), p.begin(), p.end());
    for (std::size_t k = 0; k < 2; ++k) {
      auto const b = sched.state_view(k, i);
      auto const* f = reinterpret_cast<float const*>(b.data());
      all.insert(all.end(), f, f + b.size() / sizeof(float));
    }
  }
  return all;
}

template <tide::Backend B>
tide::nn::gpt_spec<B> spec_on() {
  return {.config = config, .options = {.seed = 7}};
}

using tide::test::flaky_self;

}  // namespace

TEST_CASE("make_trainer on sealed: the host's bits, with clipping and data parallelism; its checkpoints are the host's") {
  tide::optim::adamw const clipped{.lr = 3e-3f, .weight_decay = 0.1f, .clip_norm = 0.5f};  // the global norm on the device
  tide::comm::self one;
  auto const dp = tide::comm::data_parallel<tide::comm::self>{.comm = &one, .bucket_bytes = 48_KiB};
  auto policy = off::chunked<off::belady>{.chunk_bytes = chunk_bytes};
  policy.device_budget = minimum_of(policy) + 4_KiB;
  tide::test::scratch_dir dir{"sealed_trainer"};
  auto run = [&]<tide::Backend B>(B, char const* name) {
    auto t = tide::train::make_trainer(spec_on<B>(), policy, clipped, dp);
    feeder<decltype(t)> feed;
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s) {
      if (s == 2) t.save(dir.path / name);
      losses.push_back(t.step(feed(t, s)).loss);
    }
    return std::pair{losses, state_of(t)};
  };
  auto const [host_losses, host_state] = run(host{}, "host.tide");
  auto const [sealed_losses, sealed_state] = run(sealed{}, "sealed.tide");
  CHECK(same_bits(sealed_losses, host_losses));
  CHECK(same_bits(sealed_state, host_state));
  // The same checkpoint, byte for byte: parameters and state read through staging.
  CHECK(tide::test::file_text(dir.path / "sealed.tide") == tide::test::file_text(dir.path / "host.tide"));

  // Loaded on sealed (written back through staging), the last steps give the straight run's bits.
  auto t = tide::train::make_trainer(spec_on<sealed>(), policy, clipped, dp);
  t.load(dir.path / "host.tide");
  feeder<decltype(t)> feed;
  for (int s = 2; s < steps; ++s) (void)t.step(feed(t, s));
  CHECK(same_bits(state_of(t), host_state));
}

TEST_CASE("make_trainer on sealed: a step whose collective fails loses nothing, and training goes on to the same bits") {
  // The sparse sink (dense on one rank) starts afresh when a step is abandoned; the lane's
  // staging streams, which the failure reached, are made again.
  tide::optim::adamw const opt{.lr = 3e-3f};
  using sparse = tide::compress::sparse_data_parallel<flaky_self>;
  auto policy = off::chunked<off::belady>{.chunk_bytes = chunk_bytes};
  policy.device_budget = minimum_of(policy) + 4_KiB;
  off::resident const resident{.device_budget = 64_MiB, .chunk_bytes = chunk_bytes};
  auto each = [&](auto const& offload, char const* what) {
    INFO(what);
    int calls = 0;
    flaky_self never{&calls, 0};
    auto straight = tide::train::make_trainer(spec_on<sealed>(), offload, opt, sparse{.comm = &never});
    feeder<decltype(straight)> feed;
    for (int s = 0; s < steps; ++s) (void)straight.step(feed(straight, s));
    int const per_run = calls;
    REQUIRE(per_run > 8);
    auto const reference = state_of(straight);
    for (int fail_at : {1, per_run / 2, per_run}) {
      CAPTURE(fail_at);
      calls = 0;
      flaky_self comm{&calls, fail_at};
      auto t = tide::train::make_trainer(spec_on<sealed>(), offload, opt, sparse{.comm = &comm});
      int failures = 0;
      for (int s = 0; s < steps; ++s) {
        auto const before = state_of(t);
        try {
          (void)t.step(feed(t, s));
        } catch (tide::error const& e) {
          ++failures;
          CHECK(e.category() == tide::errc::mpi);
          CHECK(state_of(t) == before);  // parameters and optimizer state as they were
          (void)t.step(feed(t, s));      // the same step again
        }
      }
      CHECK(failures == 1);
      CHECK(same_bits(state_of(t), reference));
    }
  };
  each(policy, "chunked<belady>: the optimizer on the host beside backward");
  each(resident, "resident: the optimizer on the device");
}

TEST_CASE("make_trainer on sealed: a copy that fails anywhere in a tight step loses nothing, and training goes on to the "
          "same bits") {
  // chunked at its minimum with the optimizer on the host beside backward: on a device the copies
  // queue behind one another (a fetch behind a copy out, a copy out behind a fetch, a fetch into a
  // block whose copy out is in flight), so a refused copy must leave each chunk, its blocks and
  // the ring where they were. Every copy of the warm-up and of a steady step, one run each.
  tide::optim::adamw const opt{.lr = 3e-3f};
  auto policy = off::chunked<off::belady>{.chunk_bytes = chunk_bytes};
  policy.device_budget = minimum_of(policy) + 4_KiB;
  auto straight = tide::train::make_trainer(spec_on<sealed>(), policy, opt);
  feeder<decltype(straight)> feed;
  std::vector<std::size_t> copies;  // by step
  for (int s = 0; s < steps; ++s) {
    std::size_t const before = straight.scheduler().transfers().stats().copies;
    (void)straight.step(feed(straight, s));
    copies.push_back(straight.scheduler().transfers().stats().copies - before);
  }
  auto const reference = state_of(straight);
  std::size_t const host_bytes = straight.scheduler().host_pool_stats().bytes_requested;
  for (int faulty : {0, steps - 1}) {
    std::size_t failures = 0;
    for (std::size_t n = 1; n <= copies[std::size_t(faulty)]; ++n) {
      CAPTURE(faulty);
      CAPTURE(n);
      auto t = tide::train::make_trainer(spec_on<sealed>(), policy, opt);
      for (int s = 0; s < steps; ++s) {
        if (s != faulty) {
          (void)t.step(feed(t, s));
          continue;
        }
        auto const before = state_of(t);
        t.scheduler().transfers().fail_copy(n);
        try {
          (void)t.step(feed(t, s));
        } catch (tide::error const& e) {
          ++failures;
          CHECK(e.category() == tide::errc::io);
          t.scheduler().transfers().fail_copy(0);
          CHECK(state_of(t) == before);  // parameters and optimizer state as they were
          (void)t.step(feed(t, s));      // the same step again
        }
      }
      CHECK(same_bits(state_of(t), reference));
      CHECK(t.scheduler().host_pool_stats().bytes_requested == host_bytes);  // no host block lost
    }
    MESSAGE("step " << faulty << ": " << copies[std::size_t(faulty)] << " copies, " << failures << " failed steps");
    CHECK(failures == copies[std::size_t(faulty)]);  // every copy is the step's: refusing it fails the step
  }
}

TEST_CASE("make_trainer on sealed: the NVMe tier, with state and with parameters on file, keeps the host's bits") {
  tide::optim::adamw const opt{.lr = 3e-3f};
  auto policy = off::chunked<off::belady>{.chunk_bytes = chunk_bytes};
  policy.device_budget = minimum_of(policy) + 4_KiB;
  std::size_t n = 0, block = 0;
  {
    tide::thread_pool pool{1};
    tide::exec<host> ex{pool};
    tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
    off::scheduler<host, float, off::chunked<off::belady>> probe{ex, arena, spec_on<host>().parameters(),
                                                                 spec_on<host>().uses(), policy};
    n = probe.layout().chunks();
    block = tide::round_up(probe.chunk_bytes(), 256);
  }
  auto each = [&](std::size_t host_budget, char const* what) {
    INFO(what);
    auto run = [&]<tide::Backend B>(B) {
      tide::test::scratch_dir const folder{"sealed_nvme"};
      auto cfg = policy;
      cfg.memory.host_budget = host_budget;
      cfg.memory.spill_folder = folder.path;
      auto t = tide::train::make_trainer(spec_on<B>(), cfg, opt);
      feeder<decltype(t)> feed;
      std::vector<float> losses;
      for (int s = 0; s < steps; ++s) losses.push_back(t.step(feed(t, s)).loss);
      CHECK(t.scheduler().last_step().nvme_write_bytes > 0);  // the tier is in use
      return std::pair{losses, state_of(t)};
    };
    auto const [host_losses, host_state] = run(host{});
    auto const [sealed_losses, sealed_state] = run(sealed{});
    CHECK(same_bits(sealed_losses, host_losses));
    CHECK(same_bits(sealed_state, host_state));
  };
  each(n * block + (n / 2) * 2 * block, "m and v of half the chunks on file");
  each((n / 2) * block + 256, "every chunk's state and half the parameters on file");
}

TEST_CASE("make_trainer on sealed: bf16 parameters with fp32 masters keep the host's bits, resident, offloaded, with "
          "gradient-slot reuse and a failed step") {
  // The masters start as the parameters, which the model initialised on the host; the updates
  // round them into the working copies on the tier where the state lives.
  tide::optim::adamw const opt{.lr = 3e-3f, .clip_norm = 1.f};
  auto every_byte = [](auto& t) {  // parameters, masters and state, staged
    std::vector<std::byte> all;
    auto& sched = t.scheduler();
    auto add = [&](std::span<std::byte const> b) { all.insert(all.end(), b.begin(), b.end()); };
    for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) {
      add(sched.tensor_view(tide::chunk::chunk_role::param, i));
      add(sched.tensor_view(tide::chunk::chunk_role::master, i));
      for (std::size_t k = 0; k < 2; ++k) add(sched.state_view(k, i));
    }
    return all;
  };
  auto each = [&](auto const& offload, char const* what) {
    INFO(what);
    auto run = [&]<tide::Backend B>(B) {
      auto t = tide::train::make_trainer(tide::nn::gpt_spec<B, tide::bf16>{.config = config, .options = {.seed = 7}},
                                         offload, opt);
      feeder<decltype(t)> feed;
      std::vector<float> losses;
      for (int s = 0; s < steps; ++s) losses.push_back(t.step(feed(t, s)).loss);
      return std::pair{losses, every_byte(t)};
    };
    auto const [host_losses, host_bytes] = run(host{});
    auto const [sealed_losses, sealed_bytes] = run(sealed{});
    CHECK(same_bits(sealed_losses, host_losses));
    CHECK(sealed_bytes == host_bytes);
  };
  each(off::resident{.device_budget = 64_MiB, .chunk_bytes = chunk_bytes}, "resident: masters and state on the device");
  auto policy = off::chunked<off::belady>{.chunk_bytes = chunk_bytes};
  policy.device_budget = 64_MiB;  // room: the state of the chunks that fit moves to the device after the warm-up
  each(policy, "chunked<belady> with room");
  policy.device_budget = tide::test::scheduler_minimum<decltype(policy), tide::bf16>(config, policy, batch, seq) + 4_KiB;
  each(policy, "chunked<belady> at its minimum: state on the host");
  policy.memory.reuse_grad_slots = true;  // the gradients take their parameters' slots; the masters round them back
  policy.device_budget = 64_MiB;
  each(policy, "chunked<belady> with room, gradient-slot reuse");
  policy.device_budget = tide::test::scheduler_minimum<decltype(policy), tide::bf16>(config, policy, batch, seq) + 4_KiB;
  each(policy, "chunked<belady> at its minimum, gradient-slot reuse");

  // A step that fails after some slots took gradients: each chunk's parameters come back rounded
  // from its master, wherever either lies, and training goes on to the same bits.
  int calls = 0;
  flaky_self never{&calls, 0};
  using sparse = tide::compress::sparse_data_parallel<flaky_self>;
  tide::nn::gpt_spec<sealed, tide::bf16> const bf16_spec{.config = config, .options = {.seed = 7}};
  auto straight = tide::train::make_trainer(bf16_spec, policy, opt, sparse{.comm = &never});
  feeder<decltype(straight)> feed;
  for (int s = 0; s < steps; ++s) (void)straight.step(feed(straight, s));
  auto const reference = every_byte(straight);
  for (int fail_at : {1, calls / 2, calls}) {
    CAPTURE(fail_at);
    int n = 0;
    flaky_self comm{&n, fail_at};
    auto t = tide::train::make_trainer(bf16_spec, policy, opt, sparse{.comm = &comm});
    int failures = 0;
    for (int s = 0; s < steps; ++s) {
      auto const before = every_byte(t);
      try {
        (void)t.step(feed(t, s));
      } catch (tide::error const&) {
        ++failures;
        CHECK(every_byte(t) == before);
        (void)t.step(feed(t, s));
      }
    }
    CHECK(failures == 1);
    CHECK(every_byte(t) == reference);
  }
}
