// Offloading changes nothing: 20 GPT training steps under every scheduler and policy, at budgets
// from "everything fits" down to just above the scheduler's minimum, leave parameters
// bit-identical to the same steps with everything resident (and to the model's own flat buffers
// stepped by the flat AdamW). A budget below the minimum is refused before any compute.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <new>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <optional>
#include <memory>
#include <vector>

#include "tide/core/bytes.hpp"
#include "tide/core/error.hpp"
#include "tide/core/parallel.hpp"
#include "tide/kernels/adamw/adamw.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/offload/scheduler.hpp"
#include "support/gate.hpp"
#include "support/gpt_steps.hpp"

#include "support/count_allocations.hpp"  // replaces operator new for this executable

namespace {

using tide::test::counting;
using tide::test::heap_allocations;
using namespace tide::literals;
using tide::host;
namespace off = tide::offload;

constexpr tide::nn::gpt_config config{.layers = 3, .heads = 2, .channels = 32, .vocab = 64, .max_seq = 16};
constexpr tide::index_t batch = 2, seq = 16;
constexpr int steps = 20;
constexpr std::size_t chunk_bytes = 20_KiB;  // several chunks per layer; the largest tensor is 16 KiB
constexpr tide::kernels::adamw_hparams hparams{.lr = 3e-3f, .weight_decay = 0.1f};
// The same hyper-parameters as the optimizer the scheduler calls.
constexpr tide::optim::adamw adamw{.lr = hparams.lr, .beta1 = hparams.beta1, .beta2 = hparams.beta2, .eps = hparams.eps,
                                   .weight_decay = hparams.weight_decay};

std::vector<std::int32_t> batch_of(int s) { return tide::test::token_runs(s, batch, seq, config.vocab); }

struct run_result {
  std::vector<std::vector<float>> params;  // by parameter
  std::vector<float> losses;
  std::vector<off::offload_stats> stats;
};

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The model's own buffers, stepped by one flat AdamW: no scheduler at all.
run_result train_plain(tide::thread_pool& pool) {
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  tide::nn::gpt<host> model{config, arena, {.seed = 7}};
  auto const n = model.flat_params().extent(0);
  std::vector<float> m(static_cast<std::size_t>(n), 0.f), v(static_cast<std::size_t>(n), 0.f);
  run_result r;
  for (int s = 0; s < steps; ++s) {
    auto const data = batch_of(s);
    tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
    model.zero_grad(ex);
    r.losses.push_back(model.forward(ex, x, y));
    model.backward(ex);
    tide::kernels::adamw(ex, hparams, s + 1, model.flat_params(), tide::tensor_view<float const, host>(model.flat_grads()),
                         tide::tensor_view<float, host>(m.data(), {n}), tide::tensor_view<float, host>(v.data(), {n}));
  }
  for (auto const& p : model.parameters()) {
    auto const t = model.param(p);
    r.params.emplace_back(t.data(), t.data() + p.numel());
  }
  return r;
}

std::size_t activation_bytes() { return tide::test::activation_bytes(config, batch, seq); }

template <class Config>
using sched_t = off::scheduler<host, float, Config>;
template <class Config>
using model_t = tide::nn::gpt<host, float, off::hooks<sched_t<Config>>>;

// A scheduler of one's own with only what OffloadScheduler asks: its hooks compile, and the model
// carries its offloaded activations itself. offload::scheduler's hooks carry them.
struct bare_scheduler {
  using element_type = float;
  void pre_forward(int);
  void post_forward(int);
  void pre_backward(int);
  void post_backward(int);
  void step();
  void zero_grad();
  float* param_data(std::uint32_t);
  float* grad_data(std::uint32_t);
  off::offload_stats last_step() const;
};
static_assert(off::OffloadScheduler<bare_scheduler>);
static_assert(!tide::nn::ActivationCarrier<off::hooks<bare_scheduler>, host>);
static_assert(!tide::nn::gpt<host, float, off::hooks<bare_scheduler>>::carried_by_hooks);
// Nor does it serve a split backward's input pass: the model's backward is one moment per block.
static_assert(!tide::nn::SplitBackwardHooks<off::hooks<bare_scheduler>>);
static_assert(tide::nn::SplitBackwardHooks<off::hooks<sched_t<off::resident>>>);
static_assert(tide::nn::ActivationCarrier<off::hooks<sched_t<off::resident>>, host>);
static_assert(model_t<off::chunked<off::belady>>::carried_by_hooks);

// split: the backward in two passes, every block's input pass then every block's weight pass
// (tied: the head's share of wte's gradient through the model's tied buffer, written in B).
template <class Config>
run_result train_offloaded(tide::thread_pool& pool, std::size_t budget, Config const& cfg = {},
                           off::scheduler_options opts = {}, bool split = false, bool tied = false) {
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = budget}};
  sched_t<Config> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
                        cfg, opts, adamw};
  model_t<Config> model{config, arena, {.seed = 7, .separate_tied_grad = tied, .split_backward = split}, {&sched}};
  run_result r;
  for (int s = 0; s < steps; ++s) {
    auto const data = batch_of(s);
    tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
    r.losses.push_back(model.forward(ex, x, y));
    if (split) {
      model.backward_input_blocks(ex, model.first_block(), model.last_block(), 0);
      model.backward_weight_blocks(ex, model.first_block(), model.last_block(), 0);
    } else {
      model.backward(ex);
    }
    sched.step();
    r.stats.push_back(sched.last_step());
  }
  for (std::uint32_t i = 0; i < model.parameters().size(); ++i) r.params.push_back(sched.read_param(i));
  return r;
}

template <class Config>
std::size_t minimum_of(Config const& cfg = {}) {
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  sched_t<Config> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
                        cfg};
  return sched.minimum_device_bytes(activation_bytes());
}

void require_identical(run_result const& got, run_result const& want, std::string const& what) {
  INFO(what);
  REQUIRE(got.params.size() == want.params.size());
  for (std::size_t i = 0; i < want.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(same_bits(got.params[i], want.params[i]));
  }
  CHECK(same_bits(got.losses, want.losses));
}

run_result const& reference() {
  static run_result const r = [] {
    tide::thread_pool pool{2};
    return train_plain(pool);
  }();
  return r;
}

// Budgets from "everything fits" to just above the minimum.
template <class Config>
void check_budgets(Config const& cfg, std::string const& name) {
  std::size_t const minimum = minimum_of(cfg);
  tide::thread_pool pool{2};
  for (std::size_t budget : {std::size_t{64_MiB}, minimum + (64_MiB - minimum) / 16, minimum + 4_KiB}) {
    auto const got = train_offloaded(pool, budget, cfg);
    require_identical(got, reference(), name + " at budget " + std::to_string(budget) + " (minimum " +
                                            std::to_string(minimum) + ")");
  }
}

}  // namespace

TEST_CASE("the plain model trains (the reference is not degenerate)") {
  auto const& r = reference();
  REQUIRE(r.losses.size() == steps);
  CHECK(r.losses.back() < r.losses.front() - 0.3f);
}

TEST_CASE("resident: bit-identical to the model's own buffers and one flat AdamW") {
  tide::thread_pool pool{2};
  auto const got = train_offloaded<off::resident>(pool, 64_MiB, {.chunk_bytes = chunk_bytes});
  require_identical(got, reference(), "resident");
  for (std::size_t s = 1; s < got.stats.size(); ++s) CHECK(got.stats[s].bytes_moved() == 0);
}

TEST_CASE("chunked<belady>: bit-identical at every budget; moves data when the budget is tight") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  check_budgets(cfg, "chunked<belady>");
  tide::thread_pool pool{2};
  std::size_t const minimum = minimum_of(cfg);
  auto const tight = train_offloaded(pool, minimum + 4_KiB, cfg);
  auto const& st = tight.stats.back();
  CHECK(st.h2d_bytes > 0);
  CHECK(st.d2h_bytes > 0);
  CHECK(st.evictions > 0);
  CHECK(st.host_optimizer_chunks > 0);
  CHECK(!st.warm_up);
  CHECK(tight.stats.front().warm_up);
  // Everything fits: after the warm-up nothing moves and the optimizer state went to the device.
  auto const roomy = train_offloaded(pool, 64_MiB, cfg);
  CHECK(!roomy.stats[1].warm_up);  // one warm-up step: placing optimizer state is not a divergence
  CHECK(roomy.stats.back().bytes_moved() == 0);
  CHECK(roomy.stats.back().host_optimizer_chunks == 0);
  CHECK(roomy.stats.back().device_optimizer_chunks > 0);
}

TEST_CASE("chunked<lru> and chunked<fifo>: bit-identical at every budget") {
  check_budgets(off::chunked<off::lru>{.chunk_bytes = chunk_bytes}, "chunked<lru>");
  check_budgets(off::chunked<off::fifo>{.chunk_bytes = chunk_bytes}, "chunked<fifo>");
}

TEST_CASE("layer_window<W>: bit-identical for a fixed and a measured window") {
  check_budgets(off::layer_window<2>{}, "layer_window<2>");
  check_budgets(off::layer_window<0>{}, "layer_window<auto>");
}

TEST_CASE("static_partition: bit-identical at every budget") {
  check_budgets(off::static_partition{.chunk_bytes = chunk_bytes}, "static_partition");
}

TEST_CASE("the host optimizer without overlap gives the same bits") {
  tide::thread_pool pool{2};
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  auto const got = train_offloaded(pool, minimum_of(cfg) + 4_KiB, cfg, {.overlap_optimizer = false});
  require_identical(got, reference(), "chunked<belady>, optimizer on the calling thread");
}

TEST_CASE("a split backward through the hooks: input passes read parameters only, weight passes are the "
          "backward; the same bits at every budget") {
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  tide::memory::device_arena<host> probe{{.budget = 64_MiB}};
  sched_t<decltype(cfg)> const sizing{ex, probe, tide::nn::gpt_parameters(config, tide::dtype::f32),
                                      tide::nn::gpt_block_uses(config), cfg};
  // The split keeps each block's weight-pass inputs until W: more activation memory.
  std::size_t const minimum = sizing.minimum_device_bytes(
      tide::test::activation_bytes(config, batch, seq, {.split_backward = true}));
  auto const tight = train_offloaded(pool, minimum + 4_KiB, cfg, {}, true);
  require_identical(tight, reference(), "chunked<belady>, split, at the minimum");
  CHECK(tight.stats.back().evictions > 0);
  require_identical(train_offloaded<off::resident>(pool, 64_MiB, {.chunk_bytes = chunk_bytes}, {}, true), reference(),
                    "resident, split");
  require_identical(train_offloaded(pool, 64_MiB, off::layer_window<2>{}, {}, true), reference(),
                    "layer_window<2>, split");
  require_identical(train_offloaded(pool, 64_MiB, cfg, {}, true, true), reference(), "chunked<belady>, split, tied");

  // The input pass is not a backward moment: a gradient asked for there is refused, naming it.
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  sched_t<decltype(cfg)> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32),
                               tide::nn::gpt_block_uses(config), cfg, {}, adamw};
  for (int b = -1; b <= config.layers; ++b) sched.pre_forward(b), sched.post_forward(b);
  auto const lnf_b = static_cast<std::uint32_t>(tide::nn::gpt_parameters(config, tide::dtype::f32).size() - 1);
  sched.pre_backward_input(config.layers);
  CHECK(sched.param_data(lnf_b) != nullptr);
  try {
    (void)sched.grad_data(lnf_b);
    FAIL("a gradient in an input pass");
  } catch (tide::error const& e) {
    CHECK(std::string(e.message()).find("backward input pass") != std::string::npos);
  }
  sched.abort_step();
  CHECK(!sched.in_step());
}

TEST_CASE("undo_on_error: host steps keep the values before them by swapping blocks, device steps copy them") {
  // The bits are the reference's either way (the budget tests above run with undo_on_error, the
  // default); here, which way the journal kept them, from the step's own figures.
  tide::thread_pool pool{2};
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    auto const got = train_offloaded(pool, minimum_of(cfg) + 4_KiB, cfg, {.overlap_optimizer = overlap});
    require_identical(got, reference(), "chunked<belady> at its minimum");
    off::offload_stats const& last = got.stats.back();
    REQUIRE(last.host_optimizer_chunks > 0);
    // Every chunk stepped on the host swapped its parameter and m and v blocks: three lists of
    // chunk_bytes each (chunks are at most chunk_bytes).
    CHECK(last.undo_swapped_bytes > 0);
    CHECK(last.undo_swapped_bytes <= last.host_optimizer_chunks * 3 * chunk_bytes);
    CHECK((last.undo_copy_bytes == 0) == (last.device_optimizer_chunks == 0));
  }
  auto const resident = train_offloaded(pool, 64_MiB, off::resident{});
  require_identical(resident, reference(), "resident");
  CHECK(resident.stats.back().undo_swapped_bytes == 0);  // state on the device: copied in the update's pass
  CHECK(resident.stats.back().undo_copy_bytes > 0);
  auto const off_run = train_offloaded(pool, minimum_of(cfg) + 4_KiB, cfg, {.undo_on_error = false});
  CHECK(off_run.stats.back().undo_swapped_bytes + off_run.stats.back().undo_copy_bytes == 0);
}

TEST_CASE("a budget below the minimum is refused at the first moment, naming the minimum and its parts") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  std::size_t const minimum = minimum_of(cfg);
  tide::thread_pool pool{2};  // as the minimum's activations were planned: the kernels' scratch grows with threads
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = minimum - 256}};
  sched_t<decltype(cfg)> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32),
                               tide::nn::gpt_block_uses(config), cfg, {}, adamw};
  model_t<decltype(cfg)> model{config, arena, {.seed = 7}, {&sched}};
  auto const before = sched.read_param(2);
  auto const data = batch_of(0);
  tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
  try {
    (void)model.forward(ex, x, y);
    FAIL("a budget below the minimum was accepted");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
    std::string const what = e.what();
    CHECK(what.find("minimum") != std::string::npos);
    CHECK(what.find("non-model") != std::string::npos);
    CHECK(what.find("working set") != std::string::npos);
  }
  CHECK(same_bits(sched.read_param(2), before));  // nothing lost
  // The minimum the error states is enough: training at exactly that budget gives the bits of the
  // reference.
  CHECK(sched.minimum_device_bytes(activation_bytes()) == minimum);
  auto const at_minimum = train_offloaded(pool, minimum, cfg);
  require_identical(at_minimum, reference(), "chunked<belady> at exactly its stated minimum");
  CHECK(at_minimum.stats.back().bytes_moved() > 0);
}

TEST_CASE("the resident minimum is all model data; a budget below it is refused too") {
  off::resident const cfg{.chunk_bytes = chunk_bytes};
  std::size_t const minimum = minimum_of(cfg);
  tide::thread_pool pool{2};  // as the minimum's activations were planned
  CHECK_THROWS_AS(train_offloaded(pool, minimum - 256, cfg), tide::error);
  auto const got = train_offloaded(pool, minimum, cfg);
  require_identical(got, reference(), "resident at exactly its minimum");
}

TEST_CASE("a deferred optimizer gives the same bits; a skipped step changes nothing") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  tide::thread_pool pool{2};
  auto const deferred = train_offloaded(pool, minimum_of(cfg) + 4_KiB, cfg, {.defer_optimizer = true});
  require_identical(deferred, reference(), "chunked<belady>, optimizer deferred to step()");

  // Steps 0, 1, 2 (skipped), 3 leave parameters and optimizer state exactly as steps 0, 1, 3:
  // the skip changed nothing, not even AdamW's step number.
  auto run = [&](std::vector<int> const& batches, int skipped) {
    tide::exec<host> ex{pool};
    tide::memory::device_arena<host> arena{{.budget = minimum_of(cfg) + 4_KiB}};
    sched_t<decltype(cfg)> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32),
                                 tide::nn::gpt_block_uses(config), cfg, {.defer_optimizer = true}, adamw};
    model_t<decltype(cfg)> model{config, arena, {.seed = 7}, {&sched}};
    std::vector<std::vector<float>> before;
    for (int s : batches) {
      auto const data = batch_of(s);
      tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
      (void)model.forward(ex, x, y);
      model.backward(ex);
      CHECK(std::isfinite(tide::kernels::global_grad_norm(ex, sched.gradients())));
      if (s != skipped) {
        sched.step();
        continue;
      }
      for (std::uint32_t i = 0; i < model.parameters().size(); ++i) before.push_back(sched.read_param(i));
      sched.skip_step();
      for (std::uint32_t i = 0; i < model.parameters().size(); ++i) CHECK(same_bits(sched.read_param(i), before[i]));
    }
    CHECK(sched.tracer().invalidations() == 0);
    std::vector<std::vector<float>> out;
    for (std::uint32_t i = 0; i < model.parameters().size(); ++i) out.push_back(sched.read_param(i));
    CHECK(sched.optimizer_steps() == 3);
    return out;
  };
  auto const with_skip = run({0, 1, 2, 3}, 2);
  auto const without = run({0, 1, 3}, -1);
  for (std::size_t i = 0; i < without.size(); ++i) CHECK(same_bits(with_skip[i], without[i]));
}

TEST_CASE("evaluation forwards between steps change nothing and keep the trace") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = minimum_of(cfg) + 4_KiB}};
  sched_t<decltype(cfg)> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32),
                               tide::nn::gpt_block_uses(config), cfg, {}, adamw};
  model_t<decltype(cfg)> model{config, arena, {.seed = 7}, {&sched}};
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    auto const data = batch_of(s);
    tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
    if (s % 4 == 2) {  // a validation pass on another batch
      auto const other = batch_of(100 + s);
      sched.begin_evaluation();
      float const v = model.forward(ex, tide::tensor_view<std::int32_t const, host>(other.data(), {batch, seq}),
                                    tide::tensor_view<std::int32_t const, host>(other.data() + batch * seq, {batch, seq}));
      CHECK(std::isfinite(v));
      CHECK_THROWS_AS(model.backward(ex), tide::error);  // no training inside an evaluation
      sched.end_evaluation();
    }
    losses.push_back(model.forward(ex, x, y));
    model.backward(ex);
    sched.step();
  }
  CHECK(sched.tracer().invalidations() == 0);
  CHECK(same_bits(losses, reference().losses));
  for (std::uint32_t i = 0; i < model.parameters().size(); ++i) CHECK(same_bits(sched.read_param(i), reference().params[i]));
}

TEST_CASE("a traced step: compute per block, every copy with its bytes, every host AdamW") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = minimum_of(cfg) + 4_KiB}};
  sched_t<decltype(cfg)> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32),
                               tide::nn::gpt_block_uses(config), cfg, {}, adamw};
  model_t<decltype(cfg)> model{config, arena, {.seed = 7}, {&sched}};
  off::trace_recorder trace;
  for (int s = 0; s < 3; ++s) {
    if (s == 2) sched.set_trace(&trace);
    auto const data = batch_of(s);
    tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
    (void)model.forward(ex, x, y);
    model.backward(ex);
    sched.step();
  }
  sched.set_trace(nullptr);
  auto const st = sched.last_step();
  std::size_t compute = 0, copies = 0, copied = 0, host_steps = 0;
  for (auto const& e : trace.events()) {
    CHECK(e.duration_us >= 0);
    if (e.where == off::lane::compute && e.category == "compute") ++compute;
    if (e.where == off::lane::copy) {
      ++copies;
      copied += e.bytes;
    }
    if (e.where == off::lane::optimizer) ++host_steps;
  }
  CHECK(compute == 2 * static_cast<std::size_t>(config.layers + 2));  // each block forward and backward
  CHECK(copies == (st.h2d_bytes + st.d2h_bytes) / sched.chunk_bytes());  // every copy moves one chunk
  CHECK(copied == st.h2d_bytes + st.d2h_bytes);
  CHECK(host_steps == st.host_optimizer_chunks);
  CHECK(copies > 0);
  auto const json = trace.to_json("tide test");
  CHECK(json.find("\"copy stream\"") != std::string::npos);
}

// ---- gradient accumulation ----------------------------------------------------------------------

namespace {

constexpr int accumulation_steps = 4;

// The model's own buffers: micro_steps forward + backward passes accumulate into the gradients,
// then one flat AdamW with grad_scale 1 / micro_steps.
std::vector<std::vector<float>> accumulate_plain(int micro_steps) {
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  tide::nn::gpt<host> model{config, arena, {.seed = 7}};
  auto const n = model.flat_params().extent(0);
  std::vector<float> m(static_cast<std::size_t>(n), 0.f), v(static_cast<std::size_t>(n), 0.f);
  float const scale = 1.f / static_cast<float>(micro_steps);
  for (int s = 0; s < accumulation_steps; ++s) {
    model.zero_grad(ex);
    for (int k = 0; k < micro_steps; ++k) {
      auto const data = batch_of(s * micro_steps + k);
      tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
      (void)model.forward(ex, x, y);
      model.backward(ex);
    }
    tide::kernels::adamw(ex, hparams, s + 1, model.flat_params(), tide::tensor_view<float const, host>(model.flat_grads()),
                         tide::tensor_view<float, host>(m.data(), {n}), tide::tensor_view<float, host>(v.data(), {n}),
                         scale);
  }
  std::vector<std::vector<float>> out;
  for (auto const& p : model.parameters()) {
    auto const t = model.param(p);
    out.emplace_back(t.data(), t.data() + p.numel());
  }
  return out;
}

template <class Config>
std::vector<std::vector<float>> accumulate_offloaded(Config const& cfg, std::size_t budget, int micro_steps,
                                                     bool deferred, std::size_t& moved) {
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = budget}};
  sched_t<Config> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
                        cfg,
                        {.grad_scale = 1.f / static_cast<float>(micro_steps), .micro_steps = micro_steps,
                         .defer_optimizer = deferred},
                        adamw};
  model_t<Config> model{config, arena, {.seed = 7}, {&sched}};
  moved = 0;
  for (int s = 0; s < accumulation_steps; ++s) {
    for (int k = 0; k < micro_steps; ++k) {
      auto const data = batch_of(s * micro_steps + k);
      tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
      (void)model.forward(ex, x, y);
      model.backward(ex);
      if (k + 1 < micro_steps) CHECK_THROWS_AS(sched.step(), tide::error);  // not after a partial accumulation
    }
    sched.step();
    if (s > 0) moved += sched.last_step().bytes_moved();
  }
  CHECK(sched.optimizer_steps() == accumulation_steps);
  std::vector<std::vector<float>> out;
  for (std::uint32_t i = 0; i < model.parameters().size(); ++i) out.push_back(sched.read_param(i));
  return out;
}

template <class Config>
void check_accumulation(Config const& cfg, std::string const& name,
                        std::vector<std::vector<std::vector<float>>> const& references) {
  std::size_t const budget = !Config::moves_data ? std::size_t{64_MiB} : minimum_of(cfg) + 4_KiB;
  for (int micro = 1; micro <= 3; ++micro)
    for (bool deferred : {false, true}) {
      std::string const what = name + ", micro_steps " + std::to_string(micro) + (deferred ? ", optimizer deferred" : ", optimizer overlapped");
      INFO(what);
      std::size_t moved = 0;
      auto const got = accumulate_offloaded(cfg, budget, micro, deferred, moved);
      auto const& want = references[static_cast<std::size_t>(micro - 1)];
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        INFO("parameter " << i);
        CHECK(same_bits(got[i], want[i]));
      }
      if (Config::moves_data) CHECK(moved > 0);  // it really offloaded
    }
}

}  // namespace

TEST_CASE("gradient accumulation: every scheduler, overlapped or deferred, equals the flat reference bit for bit") {
  std::vector<std::vector<std::vector<float>>> references;
  for (int micro = 1; micro <= 3; ++micro) references.push_back(accumulate_plain(micro));
  CHECK(!same_bits(references[0][2], references[1][2]));  // the micro-batches matter
  check_accumulation(off::resident{.chunk_bytes = chunk_bytes}, "resident", references);
  check_accumulation(off::chunked<off::belady>{.chunk_bytes = chunk_bytes}, "chunked<belady>", references);
  check_accumulation(off::chunked<off::lru>{.chunk_bytes = chunk_bytes}, "chunked<lru>", references);
  check_accumulation(off::chunked<off::fifo>{.chunk_bytes = chunk_bytes}, "chunked<fifo>", references);
  check_accumulation(off::layer_window<2>{}, "layer_window<2>", references);
  check_accumulation(off::layer_window<0>{}, "layer_window<auto>", references);
  check_accumulation(off::static_partition{.chunk_bytes = chunk_bytes}, "static_partition", references);
}

// ---- what a model may touch ---------------------------------------------------------------------

TEST_CASE("a parameter read outside the blocks whose uses() list it is an error naming it and the block") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  auto uses = tide::nn::gpt_block_uses(config);
  auto& head = uses.params.back();  // the head reads wte (index 0) for the tied logits: forget it
  REQUIRE(head.front() == 0u);
  head.erase(head.begin());
  sched_t<decltype(cfg)> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), uses, cfg,
                               {}, adamw};
  model_t<decltype(cfg)> model{config, arena, {.seed = 7}, {&sched}};
  auto const before = sched.read_param(0);
  auto const data = batch_of(0);
  tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
  for (int attempt = 0; attempt < 2; ++attempt) {  // always, not by chance of where the chunk is
    try {
      (void)model.forward(ex, x, y);
      FAIL("the head read wte without declaring it");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::usage);
      std::string const what = e.message();
      CHECK(what.find("\"wte\"") != std::string::npos);
      CHECK(what.find("block " + std::to_string(config.layers) + "'s forward") != std::string::npos);
      CHECK(what.find("uses() lists it only for block -1") != std::string::npos);
    }
    sched.abort_step();
  }
  CHECK(same_bits(sched.read_param(0), before));
  CHECK_THROWS_AS((void)sched.read_param(10000), tide::error);  // an index past the list, checked first
  CHECK_THROWS_AS((void)sched.param_data(10000), tide::error);
}

TEST_CASE("a parameter that uses() lists in no block is named as such when the model reads it") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  auto uses = tide::nn::gpt_block_uses(config);
  for (auto& block : uses.params) std::erase(block, 0u);  // wte: in no block at all
  sched_t<decltype(cfg)> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), uses, cfg,
                               {}, adamw};
  model_t<decltype(cfg)> model{config, arena, {.seed = 7}, {&sched}};
  auto const data = batch_of(0);
  tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
  try {
    (void)model.forward(ex, x, y);
    FAIL("the embedding read wte, which no block declares");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    std::string const what = e.message();
    CHECK(what.find("\"wte\"") != std::string::npos);
    CHECK(what.find("uses() lists it in no block") != std::string::npos);
  }
  sched.abort_step();
}

TEST_CASE("hooks out of order are errors: backward must run the blocks in reverse, a step waits for the open block") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  sched_t<decltype(cfg)> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32),
                               tide::nn::gpt_block_uses(config), cfg, {}, adamw};
  sched.pre_forward(-1);
  CHECK_THROWS_AS(sched.pre_forward(0), tide::error);  // -1 is still open
  try {
    sched.step();
    FAIL("a step with a block open");
  } catch (tide::error const& e) {
    CHECK(std::string(e.message()).find("block -1 is open") != std::string::npos);
  }
  sched.post_forward(-1);
  try {
    sched.pre_backward(0);  // the last block (the head) comes first
    FAIL("backward started in the middle");
  } catch (tide::error const& e) {
    CHECK(std::string(e.message()).find("in reverse") != std::string::npos);
  }
  CHECK_THROWS_AS(sched.pre_forward(config.layers + 1), tide::error);  // not a block of uses()
  sched.abort_step();
  CHECK(!sched.in_step());
}

TEST_CASE("a stage of several pieces: backward visits each run of blocks apart, each in reverse") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  auto uses = tide::nn::gpt_block_uses(config);
  int const f = uses.first_block, l = uses.last_block();
  REQUIRE(l - f >= 3);
  auto make = [&](std::vector<std::pair<int, int>> runs, int micro_steps) {
    auto u = uses;
    u.runs = std::move(runs);
    return std::make_unique<sched_t<decltype(cfg)>>(ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), u,
                                                    cfg, tide::offload::scheduler_options{.micro_steps = micro_steps},
                                                    adamw);
  };
  auto forward = [](auto& s, int from, int to) {
    for (int b = from; b <= to; ++b) s.pre_forward(b), s.post_forward(b);
  };
  auto backward = [](auto& s, int from, int to) {
    for (int b = to; b >= from; --b) s.pre_backward(b), s.post_backward(b);
  };
  std::vector<std::pair<int, int>> const two = {{f, f + 1}, {f + 2, l}};
  {  // Two micro-batches as an interleaved stage runs them: the upper run's passes, then the lower's.
    auto s = make(two, 2);
    for (int step = 0; step < 2; ++step) {
      forward(*s, f, l);
      forward(*s, f, l);
      backward(*s, f + 2, l);
      s->pre_backward(f + 1);  // the lower run may start before the upper one's second pass
      s->post_backward(f + 1);
      s->pre_backward(f);
      s->post_backward(f);
      CHECK_THROWS_AS(s->step(), tide::error);  // the step's passes are not all done
      backward(*s, f + 2, l);
      backward(*s, f, f + 1);
      s->step();
    }
    CHECK(s->optimizer_steps() == 2);
  }
  {  // Within a run, backward still goes in reverse.
    auto s = make(two, 1);
    forward(*s, f, l);
    try {
      s->pre_backward(f + 2);  // the upper run's first block before its last
      FAIL("a run's backward started in its middle");
    } catch (tide::error const& e) {
      CHECK(std::string(e.message()).find("in reverse") != std::string::npos);
    }
    s->abort_step();
  }
  {  // A lower run that finishes the step's last pass before the runs above: its chunks' gradients
     // could still grow, so it is refused, saying what.
    auto s = make(two, 1);
    forward(*s, f, l);
    s->pre_backward(f + 1);
    try {
      s->post_backward(f + 1);
      FAIL("a lower run completed before the run above it");
    } catch (tide::error const& e) {
      CHECK(std::string(e.message()).find("a run above it") != std::string::npos);
    }
    s->abort_step();
    CHECK(!s->in_step());
  }
  {  // The blocks between runs are another stage's: never entered.
    auto s = make({{f, f}, {f + 2, l}}, 1);
    CHECK_THROWS_AS(s->pre_forward(f + 1), tide::error);
    s->abort_step();
  }
  // Runs out of order or overlapping are refused at construction.
  CHECK_THROWS_AS(make({{f + 2, l}, {f, f + 1}}, 1), tide::error);
  CHECK_THROWS_AS(make({{f, f + 2}, {f + 2, l}}, 1), tide::error);
}

TEST_CASE("close() reports a failure in flight; destruction frees every block all the same") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = minimum_of(cfg) + 4_KiB}};
  {
    sched_t<decltype(cfg)> sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32),
                                 tide::nn::gpt_block_uses(config), cfg, {}, adamw};
    model_t<decltype(cfg)> model{config, arena, {.seed = 7}, {&sched}};
    for (int s = 0; s < 2; ++s) {
      auto const data = batch_of(s);
      tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
      (void)model.forward(ex, x, y);
      model.backward(ex);
      sched.step();
    }
    REQUIRE(arena.stats().in_use > 0);
    // A worker's failure after the work was issued (a device fault, on tide::cuda).
    struct failing_copy {
      void operator()() const { TIDE_FAIL(io, "the copy engine lost its device"); }
    } fail;
    tide::memory::launch(sched.transfers().copy_stream(), fail);
    try {
      sched.close();
      FAIL("close() did not report the failure");
    } catch (tide::error const& e) {
      CHECK(std::string(e.message()).find("lost its device") != std::string::npos);
    }
    auto const data = batch_of(2);
    tide::tensor_view<std::int32_t const, host> x(data.data(), {batch, seq}), y(data.data() + batch * seq, {batch, seq});
    CHECK_THROWS_AS((void)model.forward(ex, x, y), tide::error);  // the failure stays reported
    sched.abort_step();
  }
  CHECK(arena.stats().in_use == 0);  // model and scheduler gone: every device block went back
}

// ---- the steady state allocates nothing ---------------------------------------------------------

namespace {

// Six steps of the model through the scheduler (tracing off), steps 3..5 counted (0-based: the
// 4th to 6th, well past the warm-up): the model's kernels take their scratch from its plan, the
// norm's is the caller's (made before counting), the scheduler sized every list it fills up front.
template <class Config>
long allocations_in_steady_steps(Config const& cfg, bool deferred) {
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  auto const params = tide::nn::gpt_parameters(config, tide::dtype::f32);
  auto const uses = tide::nn::gpt_block_uses(config);
  std::size_t const budget = Config::moves_data ? minimum_of(cfg) + 4_KiB : std::size_t{64_MiB};
  tide::memory::device_arena<host> arena{{.budget = budget}};
  sched_t<Config> sched{ex, arena, params, uses, cfg, {.defer_optimizer = deferred, .decay_matrices_only = true}, adamw};
  model_t<Config> model{config, arena, {.seed = 7}, {&sched}};
  std::vector<std::vector<std::int32_t>> data;
  for (int s = 0; s < 6; ++s) data.push_back(batch_of(s));  // made before counting
  std::optional<tide::kernels::detail::call_scratch> norm_ws;  // the norm's, made at the first step
  std::size_t moved = 0;
  for (int s = 0; s < 6; ++s) {
    if (s == 3) {
      heap_allocations = 0;
      counting = true;
    }
    tide::tensor_view<std::int32_t const, host> x(data[s].data(), {batch, seq}), y(data[s].data() + batch * seq, {batch, seq});
    model.forward(ex, x, y);
    model.backward(ex);
    if (deferred) {
      if (!norm_ws) norm_ws.emplace(tide::kernels::global_grad_norm_scratch_bytes(ex, sched.gradients()));
      (void)tide::kernels::global_grad_norm(ex, sched.gradients(), norm_ws->get());
    }
    sched.step();
    if (s >= 3) moved += sched.last_step().bytes_moved();
  }
  counting = false;
  if constexpr (Config::moves_data) CHECK(moved > 0);
  return heap_allocations.load();
}

}  // namespace

TEST_CASE("steady steps of a model allocate nothing on the heap, under every scheduler") {
  CHECK(allocations_in_steady_steps(off::chunked<off::belady>{.chunk_bytes = chunk_bytes}, false) == 0);
  CHECK(allocations_in_steady_steps(off::chunked<off::belady>{.chunk_bytes = chunk_bytes}, true) == 0);
  CHECK(allocations_in_steady_steps(off::chunked<off::lru>{.chunk_bytes = chunk_bytes}, false) == 0);
  CHECK(allocations_in_steady_steps(off::layer_window<2>{}, false) == 0);
  CHECK(allocations_in_steady_steps(off::static_partition{.chunk_bytes = chunk_bytes}, false) == 0);
  CHECK(allocations_in_steady_steps(off::resident{.chunk_bytes = chunk_bytes}, true) == 0);
  // The counter counts: one vector is one allocation.
  heap_allocations = 0;
  counting = true;
  std::vector<int> const one(3);
  counting = false;
  CHECK(heap_allocations.load() == 1);
}

namespace {

// AdamW whose host steps first pass a gate, when it has one, and then sleep `lag`: the optimizer
// worker falls behind backward (as on a machine whose host steps are slower than its device).
// No result depends on time: with the gate shut the worker is behind by construction; the lag
// only gives a missing bound the chance to show.
struct gated_adamw : tide::optim::adamw {
  tide::test::gate* g = nullptr;
  std::chrono::microseconds lag{0};
  template <class T>
  void update(tide::exec<host> const& ex, tide::optim::update_args const& a,
              std::span<tide::optim::update_tensor<T, state_lists> const> tensors) const {
    if (g != nullptr) tide::test::gate::pass(g);
    std::this_thread::sleep_for(lag);
    adamw::update(ex, a, tensors);
  }
};

}  // namespace

TEST_CASE("host steps take their gradients into a ring of host_steps_in_flight blocks, reused once each step ran") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  std::size_t const budget = minimum_of(cfg) + 4_KiB;
  using S = off::scheduler<host, float, off::chunked<off::belady>, gated_adamw>;
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  // What a run saw, in host blocks of one chunk.
  struct seen {
    std::size_t after_first_backward = 0, peak = 0, chunks = 0, host_steps = 0;  // host_steps: the last step's
  };
  // Trains steps_run steps; g: the first step's host steps wait until its backward ended.
  auto run = [&](int bound, tide::test::gate* g, int steps_run, run_result* r, std::chrono::microseconds lag = {}) {
    tide::memory::device_arena<host> arena{{.budget = budget}};
    S sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config), cfg,
            {.host_steps_in_flight = bound, .undo_on_error = false}, gated_adamw{adamw, g, lag}};
    tide::nn::gpt<host, float, off::hooks<S>> model{config, arena, {.seed = 7}, {&sched}};
    std::size_t const block = tide::round_up(sched.chunk_bytes(), 256), n = sched.layout().chunks();
    std::size_t after_backward = 0;
    for (int s = 0; s < steps_run; ++s) {
      auto const d = batch_of(s);
      tide::tensor_view<std::int32_t const, host> xs(d.data(), {batch, seq}), ys(d.data() + batch * seq, {batch, seq});
      float const loss = model.forward(ex, xs, ys);
      model.backward(ex);
      if (s == 0) after_backward = sched.host_pool_stats().bytes_requested;
      if (g != nullptr) g->open();
      sched.step();
      if (r != nullptr) r->losses.push_back(loss);
    }
    if (r != nullptr)
      for (std::uint32_t i = 0; i < model.parameters().size(); ++i) r->params.push_back(sched.read_param(i));
    return seen{after_backward / block, sched.host_pool_stats().peak_bytes_held / block, n,
                sched.last_step().host_optimizer_chunks};
  };
  // No ring, the worker held back: every host-stepped chunk's gradients wait on the host beside
  // its parameters and Adam's m and v until the step's end.
  tide::test::gate held;
  seen const piled = run(0, &held, 1, nullptr);
  std::size_t const n = piled.chunks;
  INFO("chunks " << n << ", host steps " << piled.host_steps << ", blocks after backward "
                 << piled.after_first_backward);
  CHECK(piled.host_steps == n);  // the warm-up steps every chunk on the host
  CHECK(piled.after_first_backward >= 3 * n + n);
  // A ring of `bound` blocks, the worker 2 ms behind on every chunk: the same bits as the
  // reference, and the host never held more than the parameters, m, v and the ring, + 2 blocks
  // for copies in flight (a block lives until the copy out of it lands). Without the ring the
  // same lagging run piled up 3 n + n.
  for (int bound : {1, 2}) {
    INFO("host_steps_in_flight = " << bound);
    run_result r;
    seen const lagged = run(bound, nullptr, steps, &r, std::chrono::milliseconds(2));
    require_identical(r, reference(), "bounded host steps");
    CHECK(lagged.peak <= 3 * lagged.chunks + std::size_t(bound) + 2);
  }
  // 0 is no bound, not a negative one.
  tide::memory::device_arena<host> arena{{.budget = budget}};
  CHECK_THROWS_WITH_AS((S{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32),
                          tide::nn::gpt_block_uses(config), cfg, {.host_steps_in_flight = -1}}),
                       doctest::Contains("host_steps_in_flight = -1"), tide::error);
}
