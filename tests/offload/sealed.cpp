// offload::scheduler on tide::sealed, the test device the host cannot read (core/sealed.hpp)
// (make_trainer on it: train/sealed.cpp):
// every scheduler policy trains a small GPT there with the bits of the same run on tide::host.
// The arena's blocks are mapped PROT_NONE, so any host access to a chunk on the device faults;
// the kernels run on the compute stream's worker, so a copy that is not ordered after the kernels
// that use its block races (TSan) and changes a bit (these checks). A hook leaves the waits for
// its copies to the compute stream, and the warm-up times blocks there.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "tide/comm/data_parallel.hpp"
#include "tide/comm/self.hpp"
#include "tide/compress/sink.hpp"
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
#include "support/gate.hpp"
#include "support/gpt_steps.hpp"
#include "support/sealed_gpt.hpp"

namespace {

using namespace tide::literals;
using tide::host;
using tide::sealed;
namespace off = tide::offload;
namespace mem = tide::memory;

using namespace tide::test::sealed_gpt;  // config, batch, seq, steps, chunk_bytes
constexpr tide::optim::adamw adamw{.lr = 3e-3f, .weight_decay = 0.1f};

struct run_result {
  std::vector<std::vector<float>> params;  // by parameter, after the last step
  std::vector<float> losses;
  std::vector<float> lists;  // the gradient sink's lists, by parameter
  off::offload_stats last{};
};

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
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
template <tide::Backend B, class Policy, class Sink = off::no_sink>
run_result train(Policy const& policy, std::size_t budget, tide::nn::gpt_options options = {.seed = 7},
                 off::scheduler_options const& opts = {}, Sink const& sink = {}) {
  using sched_t = off::scheduler<B, float, Policy, tide::optim::adamw, Sink>;
  timeline<B> tl;
  mem::device_arena<B> arena{{.budget = budget}};
  mem::device_arena<B> inputs{{.budget = 64_KiB}};
  auto* tokens = static_cast<std::int32_t*>(inputs.allocate(2 * batch * seq * sizeof(std::int32_t)));
  run_result r;
  {
    sched_t sched{tl.ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
                  policy, opts, adamw, sink};
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
    for (std::uint32_t i = 0; i < model.parameters().size(); ++i) {
      r.params.push_back(sched.read_param(i));
      for (std::size_t k = 0; k < off::extra_lists_of<Sink>().size(); ++k) {  // the sink's lists: on the host
        auto const x = sched.extra_bytes(k, i);
        auto const* f = reinterpret_cast<float const*>(x.data());
        r.lists.insert(r.lists.end(), f, f + x.size() / sizeof(float));
      }
    }
    mem::synchronize(tl.ex);  // nothing queued may outlive the memory it uses
  }
  inputs.deallocate(tokens, 2 * batch * seq * sizeof(std::int32_t));
  return r;
}

template <class Policy>
std::size_t minimum_of(Policy const& policy, std::size_t non_model = tide::test::activation_bytes(config, batch, seq)) {
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  mem::device_arena<host> arena{{.budget = 64_MiB}};
  off::scheduler<host, float, Policy> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32),
                                            tide::nn::gpt_block_uses(config), policy};
  return sched.minimum_device_bytes(non_model);
}

// The sealed run against the host run of the same policy, budget, options and sink.
template <class Policy, class Sink = off::no_sink>
run_result check_same_bits(Policy const& policy, std::size_t budget, std::string const& what,
                           tide::nn::gpt_options options = {.seed = 7}, Sink const& sink = {}) {
  INFO(what);
  run_result const want = train<host>(policy, budget, options, {}, sink);
  run_result got = train<sealed>(policy, budget, options, {}, sink);
  CHECK(same_bits(got.losses, want.losses));
  CHECK(same_bits(got.lists, want.lists));
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
#if !TIDE_TEST_SANITIZER  // other victims, the same engine: the release build's (tests/CMakeLists.txt)
  check_same_bits(off::chunked<off::lru>{.chunk_bytes = chunk_bytes},
                  minimum_of(off::chunked<off::lru>{.chunk_bytes = chunk_bytes}) + 4_KiB, "chunked<lru>");
  check_same_bits(off::chunked<off::fifo>{.chunk_bytes = chunk_bytes},
                  minimum_of(off::chunked<off::fifo>{.chunk_bytes = chunk_bytes}) + 4_KiB, "chunked<fifo>");
#endif

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

TEST_CASE("offload::scheduler on sealed: data parallelism and the compressing sinks, staged through the host") {
  // One rank (comm::self): the sinks run all their work (buckets, ZeRO's shares, selection, error
  // feedback, PowerSGD's products) on host copies of the device's gradients, which come back.
  tide::comm::self one;
  auto const tight = off::chunked<off::belady>{.chunk_bytes = chunk_bytes};
  std::size_t const minimum = minimum_of(tight) + 4_KiB;
  for (int zero : {0, 1, 2, 3}) {
    auto const dp = tide::comm::data_parallel<tide::comm::self>{.comm = &one, .bucket_bytes = 48_KiB, .zero = zero};
    auto const resident = check_same_bits(off::resident{.chunk_bytes = chunk_bytes}, 64_MiB,
                                          "data_parallel, resident, ZeRO-" + std::to_string(zero), {.seed = 7}, dp.sink());
    CHECK(resident.last.device_optimizer_chunks > 0);
    check_same_bits(tight, minimum, "data_parallel, chunked<belady>, ZeRO-" + std::to_string(zero), {.seed = 7},
                    dp.sink());
  }
  auto const sparse = tide::compress::sparse_data_parallel<tide::comm::self>{
      .comm = &one, .compressor = {.density = 0.05f}};
  // On one rank the sparse sink sums dense (nothing to save), its residual stays zero.
  check_same_bits(off::resident{.chunk_bytes = chunk_bytes}, 64_MiB, "sparse, resident", {.seed = 7}, sparse.sink());
  check_same_bits(tight, minimum, "sparse, chunked<belady>", {.seed = 7}, sparse.sink());
  // PowerSGD compresses on one rank too: its error and Q lists change every step, on the host.
  auto const powersgd = tide::compress::powersgd_data_parallel<tide::comm::self>{.comm = &one, .compressor = {.rank = 2}};
  auto const kept = check_same_bits(off::resident{.chunk_bytes = chunk_bytes}, 64_MiB, "powersgd, resident",
                                    {.seed = 7}, powersgd.sink());
  CHECK(std::ranges::any_of(kept.lists, [](float x) { return x != 0.f; }));
  check_same_bits(tight, minimum, "powersgd, chunked<belady>", {.seed = 7}, powersgd.sink());
}

TEST_CASE("offload::scheduler on sealed: a parameter on the device between steps is read with read_param and staged views") {
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
  auto const p = sched.read_param(0);  // staged through the host
  CHECK(p.size() == static_cast<std::size_t>(model.parameters()[0].numel()));
  // A checkpoint's views are staged too: one tensor at a time, in a host block.
  auto const view = sched.tensor_view(tide::chunk::chunk_role::param, 0);
  CHECK_FALSE(tide::is_sealed(view.data()));
  CHECK(std::memcmp(view.data(), p.data(), view.size()) == 0);
  // What the host writes through tensor_bytes reaches the device when the view ends.
  auto bytes = sched.tensor_bytes(tide::chunk::chunk_role::param, 0);
  std::memset(bytes.data(), 0, bytes.size());
  CHECK(std::ranges::all_of(sched.read_param(0), [](float v) { return v == 0.f; }));
  compute.synchronize();
  inputs.deallocate(tokens, 2 * batch * seq * sizeof(std::int32_t));
}

TEST_CASE("offload::scheduler on sealed: the arena's peak is the model's plan, kernel scratch included, plus the chunks") {
  // resident with room: every chunk and the optimizer state on the device, nothing else. The
  // kernels take their scratch from the model's plan (a kernel on sealed cannot be called without
  // it: tests/compile_fail/sealed_kernel_without_scratch.cpp), so the arena holds exactly the
  // activation buffer and the chunks, at every moment of the step.
  using policy_t = off::resident;
  using sched_t = off::scheduler<sealed, float, policy_t, tide::optim::adamw>;
  timeline<sealed> tl;
  mem::device_arena<sealed> arena{{.budget = 64_MiB}};
  mem::device_arena<sealed> inputs{{.budget = 64_KiB}};
  auto* tokens = static_cast<std::int32_t*>(inputs.allocate(2 * batch * seq * sizeof(std::int32_t)));
  {
    sched_t sched{tl.ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
                  policy_t{.chunk_bytes = chunk_bytes}, {}, adamw};
    tide::nn::gpt<sealed, float, off::hooks<sched_t>> model{config, arena, {.seed = 7}, {&sched}};
    for (int s = 0; s < steps; ++s) {
      auto const data = tide::test::token_runs(s, batch, seq, config.vocab);
      mem::write_from_host(tl.ex, tokens, data.data(), data.size() * sizeof(std::int32_t));
      tide::tensor_view<std::int32_t const, sealed> x(tokens, {batch, seq}), y(tokens + batch * seq, {batch, seq});
      if (s == steps - 1) arena.reset_peak();  // a steady step: the warm-up moved the state in
      (void)model.forward(tl.ex, x, y);
      model.backward(tl.ex);
      sched.step();
    }
    mem::synchronize(tl.ex);
    off::offload_stats const st = sched.last_step();
    CHECK_FALSE(st.warm_up);
    CHECK(st.host_model_bytes == 0);  // everything on the device
    std::size_t const plan = tide::round_up(model.activations().footprint, 256);
    std::size_t scratch = 0;  // what the plan holds for the kernels
    for (std::uint32_t i = 0; i < model.activation_planner().size(); ++i)
      if (model.activation_planner().name({i}).ends_with("scratch")) scratch += model.activation_planner().bytes({i});
    CHECK(scratch > 4_KiB);  // attention's, the layernorms' partials, the classifier's rows, ...
    CHECK(st.device_model_bytes % 256 == 0);  // whole arena granules: chunk_bytes is a multiple of 256
    // The chunks at the peak (peak_model_bytes, the engine's own count at the block hooks): the
    // parameters and the state, still there after the step, and the gradient chunks backward
    // holds at once (created zero-filled, st.allocations in all; each is freed once stepped).
    CHECK(st.peak_model_bytes > st.device_model_bytes);
    CHECK((st.peak_model_bytes - st.device_model_bytes) % chunk_bytes == 0);
    CHECK(st.peak_model_bytes - st.device_model_bytes <= st.allocations * chunk_bytes);
    CHECK(arena.stats().peak == plan + st.peak_model_bytes);
    CHECK(arena.stats().in_use == plan + st.device_model_bytes);
  }
  inputs.deallocate(tokens, 2 * batch * seq * sizeof(std::int32_t));
}

namespace {

// chunked<belady> with the optimizer state kept on the host: each parameter chunk is stepped there
// and fetched back at its next use, into room the budget has (no eviction to wait for).
struct state_on_host : off::chunked<off::belady> {
  double* forward_ms = nullptr;  // where after_warm_up writes the measured forward block time
  static std::string name() { return "state_on_host"; }
  template <class Engine>
  void after_warm_up(Engine&, off::policy_context const& c) {
    if (forward_ms != nullptr) *forward_ms = c.forward_ms;
  }
};

// The hooks of one step of the model's blocks (no model: the gradients are the zero-filled chunks),
// with `in_forward(b)` run between each forward block's hooks.
template <class Sched, class F>
void hook_step(Sched& sched, tide::block_uses const& uses, F&& in_forward) {
  for (int b = uses.first_block; b <= uses.last_block(); ++b) {
    sched.pre_forward(b);
    in_forward(b);
    sched.post_forward(b);
  }
  for (int b = uses.last_block(); b >= uses.first_block; --b) {
    sched.pre_backward(b);
    sched.post_backward(b);
  }
  sched.step();
}

template <class Sched>
std::vector<std::vector<float>> read_params(Sched& sched, tide::block_uses const& uses) {
  std::vector<std::vector<float>> params;
  for (std::uint32_t i = 0; i < uses.params.size(); ++i) params.push_back(sched.read_param(i));
  return params;
}

// run(gated) trains and returns the parameters; a run with the gate keeps the bits of one without.
template <class Run>
void check_same_bits_gated(Run&& run) {
  auto const straight = run(false);
  auto const gated = run(true);
  REQUIRE(gated.size() == straight.size());
  for (std::size_t i = 0; i < straight.size(); ++i) CHECK(same_bits(gated[i], straight[i]));
}

}  // namespace

TEST_CASE("offload::scheduler on sealed: a hook makes compute wait for the chunks it fetches; the host goes on") {
  using sched_t = off::scheduler<sealed, float, state_on_host, tide::optim::adamw>;
  auto const uses = tide::nn::gpt_block_uses(config);
  auto run = [&](bool gated) {
    timeline<sealed> tl;
    mem::device_arena<sealed> arena{{.budget = 4_MiB}};
    std::vector<std::vector<float>> params;
    {
      sched_t sched{tl.ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), uses,
                    state_on_host{{.chunk_bytes = chunk_bytes}}, {}, adamw};
      hook_step(sched, uses, [](int) {});  // the warm-up
      hook_step(sched, uses, [](int) {});
      // Block 0's chunks were stepped last, on the host: the next step fetches them at its first
      // hook, with the copy ordered after the compute work so far, which the gate holds. A hook
      // that waited for its fetches would return only once the gate timed out and threw.
      tide::test::gate gate;
      if (gated) tl.compute->launch(&tide::test::gate::pass, &gate);
      hook_step(sched, uses, [&](int b) {
        if (!gated || b != uses.first_block) return;
        CHECK_FALSE(tl.compute->query());  // the hook returned with the compute stream still held
        gate.open();
      });
      CHECK(sched.last_step().demand_fetches > 0);
      CHECK(sched.last_step().host_optimizer_chunks > 0);
      params = read_params(sched, uses);
      mem::synchronize(tl.ex);
    }
    return params;
  };
  check_same_bits_gated(run);
}

TEST_CASE("offload::scheduler on sealed: the warm-up times forward blocks on the compute stream, not on the host") {
  // layer_window<0> sizes its window from this time; the host only enqueues a device's kernels.
  using sched_t = off::scheduler<sealed, float, state_on_host, tide::optim::adamw>;
  auto const uses = tide::nn::gpt_block_uses(config);
  timeline<sealed> tl;
  mem::device_arena<sealed> arena{{.budget = 4_MiB}};
  double forward_ms = -1;
  sched_t sched{tl.ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), uses,
                state_on_host{{.chunk_bytes = chunk_bytes}, &forward_ms}, {}, adamw};
  // Each forward block's "kernel" sleeps 20 ms on the compute stream.
  auto kernel = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  hook_step(sched, uses, [&](int) { mem::launch(tl.compute.value(), kernel); });
  mem::synchronize(tl.ex);
  CHECK(forward_ms >= 20.0);  // the mean forward block: at least its kernel's sleep
}

TEST_CASE("offload::scheduler on sealed: the timeline's compute lane shows when the stream ran each block, an evaluation's too") {
  using sched_t = off::scheduler<sealed, float, state_on_host, tide::optim::adamw>;
  auto const uses = tide::nn::gpt_block_uses(config);
  timeline<sealed> tl;
  mem::device_arena<sealed> arena{{.budget = 4_MiB}};
  sched_t sched{tl.ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), uses,
                state_on_host{{.chunk_bytes = chunk_bytes}}, {}, adamw};
  off::trace_recorder trace;
  sched.set_trace(&trace);
  auto kernel = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  hook_step(sched, uses, [&](int) { mem::launch(tl.compute.value(), kernel); });
  // An evaluation's forward blocks: on the timeline once it ends.
  sched.begin_evaluation();
  for (int b = uses.first_block; b <= uses.last_block(); ++b) {
    sched.pre_forward(b);
    mem::launch(tl.compute.value(), kernel);
    sched.post_forward(b);
  }
  sched.end_evaluation();
  std::vector<off::trace_event> forward;
  for (off::trace_event const& e : trace.events())
    if (e.where == off::lane::compute && e.name.starts_with("forward ")) forward.push_back(e);
  sched.set_trace(nullptr);
  REQUIRE(forward.size() == 2 * uses.params.size());  // the step's, then the evaluation's
  for (std::size_t b = 0; b < forward.size(); ++b) {
    INFO("forward span " << b);
    CHECK(forward[b].duration_us >= 20e3);  // the stream ran its 20 ms kernel inside the span
    if (b > 0) CHECK(forward[b].start_us >= forward[b - 1].start_us + forward[b - 1].duration_us);  // in stream order
  }
}

TEST_CASE("offload::scheduler on sealed: a hook short of room takes blocks whose copy out is in flight; the host goes on") {
  // chunked at its minimum keeps the state on the host: backward copies each chunk it finished
  // out for its host step, and the next block's chunks need the room those blocks hold. A copy
  // out runs after the compute work before it, which the gate holds: a hook that waited for one
  // on the host would return only once the gate timed out and threw.
  using policy = off::chunked<off::belady>;
  using sched_t = off::scheduler<sealed, float, policy, tide::optim::adamw>;
  auto const uses = tide::nn::gpt_block_uses(config);
  policy const tight{.chunk_bytes = chunk_bytes};
  std::size_t const budget = minimum_of(tight, 0) + 4_KiB;  // no model: the arena holds chunks only
  auto run = [&](bool gated) {
    timeline<sealed> tl;
    mem::device_arena<sealed> arena{{.budget = budget}};
    std::vector<std::vector<float>> params;
    {
      sched_t sched{tl.ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), uses, tight, {}, adamw};
      hook_step(sched, uses, [](int) {});  // the warm-up
      for (int b = uses.first_block; b <= uses.last_block(); ++b) {
        sched.pre_forward(b);
        sched.post_forward(b);
      }
      // The gate holds the compute stream from each block's last hook to the next block's first,
      // as a device still running a block's backward kernels would.
      std::deque<tide::test::gate> gates;
      sched.pre_backward(uses.last_block());
      for (int b = uses.last_block(); b > uses.first_block; --b) {
        if (gated) tl.compute->launch(&tide::test::gate::pass, &gates.emplace_back());
        sched.post_backward(b);  // queues the host steps of the chunks b finished: copies out first
        sched.pre_backward(b - 1);
        if (gated) {
          CHECK_FALSE(tl.compute->query());  // the hooks returned with the compute stream still held
          gates.back().open();
        }
      }
      sched.post_backward(uses.first_block);
      sched.step();
      CHECK(sched.last_step().host_optimizer_chunks > 0);
      CHECK(sched.last_step().evictions > 0);
      params = read_params(sched, uses);
      mem::synchronize(tl.ex);
    }
    return params;
  };
  check_same_bits_gated(run);
}
