// offload::scheduler on tide::sealed, the test device the host cannot read (core/sealed.hpp):
// every scheduler policy trains a small GPT there with the bits of the same run on tide::host.
// The arena's blocks are mapped PROT_NONE, so any host access to a chunk on the device faults;
// the kernels run on the compute stream's worker, so a copy that is not ordered after the kernels
// that use its block races (TSan) and changes a bit (these checks).

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parallel.hpp"
#include "tide/core/sealed.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/memory/ops.hpp"
#include "tide/memory/stream.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/offload/scheduler.hpp"
#include "tide/optim/adamw.hpp"
#include "support/errors.hpp"
#include "support/gpt_steps.hpp"

namespace {

using namespace tide::literals;
using tide::host;
using tide::sealed;
namespace off = tide::offload;
namespace mem = tide::memory;

constexpr tide::nn::gpt_config config{.layers = 3, .heads = 2, .channels = 32, .vocab = 64, .max_seq = 16};
constexpr tide::index_t batch = 2, seq = 16;
constexpr int steps = 4;
constexpr std::size_t chunk_bytes = 20_KiB;  // several chunks per layer
constexpr tide::optim::adamw adamw{.lr = 3e-3f, .weight_decay = 0.1f};

struct run_result {
  std::vector<std::vector<float>> params;  // by parameter, after the last step
  std::vector<float> losses;
  off::offload_stats last{};
};

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The compute timeline of B: the calling thread (host), or a stream of its own (sealed).
template <tide::Backend B>
struct timeline {
  tide::thread_pool pool{2};
  std::optional<mem::stream<B>> compute;
  tide::exec<B> ex = make();
  tide::exec<B> make() {
    if constexpr (std::is_same_v<B, sealed>) return {pool, compute.emplace()};
    else return {pool};
  }
};

// steps of the model under scheduler<B, float, Policy> in a device arena of `budget` bytes; the
// tokens live in device memory of their own (a user's input buffer), written in compute order.
template <tide::Backend B, class Policy>
run_result train(Policy const& policy, std::size_t budget, tide::nn::gpt_options options = {.seed = 7},
                 off::scheduler_options const& opts = {}) {
  using sched_t = off::scheduler<B, float, Policy>;
  timeline<B> tl;
  mem::device_arena<B> arena{{.budget = budget}};
  mem::device_arena<B> inputs{{.budget = 64_KiB}};
  auto* tokens = static_cast<std::int32_t*>(inputs.allocate(2 * batch * seq * sizeof(std::int32_t)));
  run_result r;
  {
    sched_t sched{tl.ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
                  policy, opts, adamw};
    tide::nn::gpt<B, float, off::hooks<sched_t>> model{config, arena, options, {&sched}};
    for (int s = 0; s < steps; ++s) {
      auto const data = tide::test::token_runs(s, batch, seq, config.vocab);  // tokens (B, T), then targets
      mem::write_from_host(tl.ex, tokens, data.data(), data.size() * sizeof(std::int32_t));
      tide::tensor_view<std::int32_t const, B> x(tokens, {batch, seq}), y(tokens + batch * seq, {batch, seq});
      r.losses.push_back(model.forward(tl.ex, x, y));
      model.backward(tl.ex);
      sched.step();
    }
    r.last = sched.last_step();
    for (std::uint32_t i = 0; i < model.parameters().size(); ++i) r.params.push_back(sched.read_param(i));
    mem::synchronize(tl.ex);  // nothing queued may outlive the memory it uses
  }
  inputs.deallocate(tokens, 2 * batch * seq * sizeof(std::int32_t));
  return r;
}

template <class Policy>
std::size_t minimum_of(Policy const& policy) {
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  mem::device_arena<host> arena{{.budget = 64_MiB}};
  off::scheduler<host, float, Policy> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32),
                                            tide::nn::gpt_block_uses(config), policy};
  return sched.minimum_device_bytes(tide::test::activation_bytes(config, batch, seq));
}

// The sealed run against the host run of the same policy, budget and options.
template <class Policy>
run_result check_same_bits(Policy const& policy, std::size_t budget, std::string const& what,
                           tide::nn::gpt_options options = {.seed = 7}) {
  INFO(what);
  run_result const want = train<host>(policy, budget, options);
  run_result got = train<sealed>(policy, budget, options);
  CHECK(same_bits(got.losses, want.losses));
  REQUIRE(got.params.size() == want.params.size());
  for (std::size_t i = 0; i < want.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(same_bits(got.params[i], want.params[i]));
  }
  // The same decisions on both: the engine moved the same bytes.
  CHECK(got.last.h2d_bytes == want.last.h2d_bytes);
  CHECK(got.last.d2h_bytes == want.last.d2h_bytes);
  CHECK(got.last.device_optimizer_chunks == want.last.device_optimizer_chunks);
  return got;
}

}  // namespace

TEST_CASE("offload::scheduler on sealed: every policy trains with the host's bits, state on the device and on the host") {
  // resident: every chunk and all optimizer state on the device, stepped there.
  auto const res = check_same_bits(off::resident{.chunk_bytes = chunk_bytes}, 64_MiB, "resident");
  CHECK(res.last.device_optimizer_chunks > 0);
  CHECK(res.last.host_optimizer_chunks == 0);

  // chunked at its minimum: chunks come and go every step, the state stays on the host.
  auto const tight = off::chunked<off::belady>{.chunk_bytes = chunk_bytes};
  auto const moved = check_same_bits(tight, minimum_of(tight) + 4_KiB, "chunked<belady> at its minimum");
  CHECK(moved.last.h2d_bytes > 0);
  CHECK(moved.last.d2h_bytes > 0);
  CHECK(moved.last.host_optimizer_chunks > 0);
  check_same_bits(off::chunked<off::lru>{.chunk_bytes = chunk_bytes},
                  minimum_of(off::chunked<off::lru>{.chunk_bytes = chunk_bytes}) + 4_KiB, "chunked<lru>");
  check_same_bits(off::chunked<off::fifo>{.chunk_bytes = chunk_bytes},
                  minimum_of(off::chunked<off::fifo>{.chunk_bytes = chunk_bytes}) + 4_KiB, "chunked<fifo>");

  // chunked with room: after the warm-up the state of the chunks that fit moves to the device.
  auto const roomy = check_same_bits(tight, 4_MiB, "chunked<belady> with room for state on the device");
  CHECK(roomy.last.device_optimizer_chunks > 0);

  check_same_bits(off::layer_window<2>{}, minimum_of(off::layer_window<2>{}) + 64_KiB, "layer_window<2>");
  check_same_bits(off::static_partition{.chunk_bytes = chunk_bytes},
                  minimum_of(off::static_partition{.chunk_bytes = chunk_bytes}) + 64_KiB, "static_partition");
}

TEST_CASE("offload::scheduler on sealed: recompute and activation offload keep the host's bits") {
  auto const policy = off::chunked<off::belady>{.chunk_bytes = chunk_bytes};
  auto const all = tide::nn::block_set::all(config.layers);
  check_same_bits(policy, 4_MiB, "every block recomputed", {.seed = 7, .recompute = all});
  auto const moved = check_same_bits(policy, 4_MiB, "activations offloaded",
                                     {.seed = 7, .offload_activations = all});
  CHECK(moved.last.activation_d2h_bytes > 0);
}

TEST_CASE("offload::scheduler on sealed: a parameter on the device between steps is read with read_param") {
  tide::thread_pool pool{2};
  mem::stream<sealed> compute;
  tide::exec<sealed> ex{pool, compute};
  mem::device_arena<sealed> arena{{.budget = 64_MiB}};
  using sched_t = off::scheduler<sealed, float, off::resident>;
  sched_t sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
                {.chunk_bytes = chunk_bytes}, {}, adamw};
  tide::nn::gpt<sealed, float, off::hooks<sched_t>> model{config, arena, {.seed = 7}, {&sched}};
  // Before the first step the chunks are on the host: the model initialised them there.
  CHECK_FALSE(tide::is_sealed(sched.param_data(0)));
  mem::device_arena<sealed> inputs{{.budget = 64_KiB}};
  auto* tokens = static_cast<std::int32_t*>(inputs.allocate(2 * batch * seq * sizeof(std::int32_t)));
  auto const data = tide::test::token_runs(0, batch, seq, config.vocab);
  mem::write_from_host(ex, tokens, data.data(), data.size() * sizeof(std::int32_t));
  tide::tensor_view<std::int32_t const, sealed> x(tokens, {batch, seq}), y(tokens + batch * seq, {batch, seq});
  (void)model.forward(ex, x, y);
  model.backward(ex);
  sched.step();
  // resident keeps them on the device: the host cannot address them, and says so.
  CHECK(tide::test::category_of([&] { (void)sched.param_data(0); }) == tide::errc::usage);
  CHECK(tide::test::category_of([&] { (void)sched.tensor_view(tide::chunk::chunk_role::exp_avg, 0); }) ==
        tide::errc::usage);
  auto const p = sched.read_param(0);  // staged through the host
  CHECK(p.size() == static_cast<std::size_t>(model.parameters()[0].numel()));
  compute.synchronize();
  inputs.deallocate(tokens, 2 * batch * seq * sizeof(std::int32_t));
}

TEST_CASE("offload::scheduler on sealed: what it cannot do there yet is refused at construction") {
  tide::thread_pool pool{1};
  mem::stream<sealed> compute;
  tide::exec<sealed> ex{pool, compute};
  mem::device_arena<sealed> arena{{.budget = 4_MiB}};
  using sched_t = off::scheduler<sealed, float, off::chunked<off::belady>>;
  auto make = [&](off::scheduler_options const& o) {
    sched_t s{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
              {.chunk_bytes = chunk_bytes}, o, adamw};
  };
  // The message names the device backend (float parameters would refuse reuse_grad_slots anyway).
  auto refusal = [&](off::scheduler_options const& o) -> std::string {
    try {
      make(o);
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::usage);
      return e.what();
    }
    FAIL("not refused");
    return {};
  };
  CHECK(refusal({.host_budget = 1_MiB}).find("device backend: host_budget") != std::string::npos);  // the NVMe tier
  CHECK(refusal({.reuse_grad_slots = true}).find("device backend: reuse_grad_slots") != std::string::npos);
  CHECK(arena.stats().in_use == 0);  // a refused scheduler keeps nothing
}
