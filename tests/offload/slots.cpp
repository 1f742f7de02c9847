// The slots of the offload engine, each filled by code in this file as a user would: a scheduler
// policy (trained through make_trainer like the four tide ships), the three optimizers (checked
// against their kernels on the model's own buffers), and a gradient sink that finishes late on its
// own stream and scales the gradients in place (the same as scaling the loss).

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <filesystem>
#include <span>
#include <thread>
#include <type_traits>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "tide/comm/data_parallel.hpp"
#include "tide/comm/self.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/memory/stream.hpp"
#include "tide/offload/chunk_source.hpp"
#include "tide/offload/scheduler.hpp"
#include "tide/optim/adam.hpp"
#include "tide/optim/sgd.hpp"
#include "tide/train/checkpoint.hpp"
#include "tide/train/trainer.hpp"
#include "support/files.hpp"
#include "support/gpt_steps.hpp"

namespace {

using namespace tide::literals;
using tide::host;
namespace off = tide::offload;

// Half of what the trace allows, one moment of prefetch, first-in-first-out eviction, optimizer
// state always on the host: a policy that trades copies for device memory.
struct halved {
  std::size_t device_budget = 0;
  std::size_t chunk_bytes = 0;
  off::fifo policy{};
  int fetched_ahead = 1;
  int placements = 0, warm_ups = 0, steps = 0;  // how often the engine asked
  static constexpr bool moves_data = true;

  static std::string name() { return "halved<fifo>"; }
  [[nodiscard]] tide::chunk::chunk_layout layout(tide::parameter_list const& params, tide::block_uses const&,
                                                 std::size_t budget, std::size_t element_bytes) const {
    return off::pack_for_budget(params, chunk_bytes, budget, element_bytes);
  }
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return 0; }
  [[nodiscard]] off::minimum_parts minimum(off::policy_context const& c, std::size_t non_model) const {
    return {non_model + c.working_set * c.block_bytes, "non-model bytes + the working set", ""};
  }
  [[nodiscard]] std::size_t chunk_budget(off::policy_context const& c, tide::chunk::memory_tracer const& tr,
                                         std::size_t t) const {
    if (c.recording) return 0;
    std::size_t const half = tr.chunk_budget(t) / 2;
    return std::max(half, c.working_set * c.block_bytes);  // never below one moment's chunks
  }
  [[nodiscard]] int prefetch_depth(off::policy_context const&) const noexcept { return fetched_ahead; }
  [[nodiscard]] int max_in_flight() const noexcept { return 2; }
  template <class Engine>
  void place(Engine&) {
    ++placements;
  }
  template <class Engine>
  void after_warm_up(Engine&, off::policy_context const&) {
    ++warm_ups;
  }
  template <class Engine>
  void after_step(Engine&) {
    ++steps;
  }
};
static_assert(off::check_scheduler_policy<halved>());

// Missing chunk_budget: not a policy (the engine and make_trainer say so in a sentence).
struct no_budget {
  std::size_t device_budget = 0;
  off::belady policy{};
  static constexpr bool moves_data = true;
  static std::string name() { return "no_budget"; }
};
static_assert(!off::SchedulerPolicy<no_budget>);

constexpr tide::nn::gpt_config config{.layers = 2, .heads = 2, .channels = 32, .vocab = 64, .max_seq = 16};
constexpr tide::index_t batch = 2, seq = 16;
tide::nn::gpt_spec<host> const spec{.config = config, .options = {.seed = 3}};
tide::optim::adamw const opt{.lr = 3e-3f};

template <class Trainer>
typename Trainer::batch_type view_of(std::vector<std::int32_t> const& d) {
  return {{d.data(), {batch, seq}}, {d.data() + batch * seq, {batch, seq}}};
}

template <class Offload>
std::vector<std::vector<float>> train(Offload const& policy, int steps, std::size_t* moved = nullptr,
                                      Offload* after = nullptr) {
  auto t = tide::train::make_trainer(spec, policy, opt);
  for (int s = 0; s < steps; ++s) {
    auto const d = tide::test::token_runs(s, batch, seq, 64);
    auto const st = t.step(view_of<decltype(t)>(d));
    if (moved != nullptr && s > 0) *moved += st.bytes_moved;
  }
  if (after != nullptr) *after = t.scheduler().policy();
  std::vector<std::vector<float>> out;
  for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) out.push_back(t.scheduler().read_param(i));
  return out;
}

TEST_CASE("a scheduler policy defined by the user trains through make_trainer with the same bits as resident") {
  auto const reference = train(off::resident{}, 4);
  halved h{.chunk_bytes = 20_KiB};
  h.device_budget = tide::test::scheduler_minimum<halved, float>(config, h, batch, seq) + 64_KiB;
  std::size_t moved = 0;
  halved after;
  auto const got = train(h, 4, &moved, &after);
  CHECK(moved > 0);  // it really offloaded
  REQUIRE(got.size() == reference.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(got[i].size() == reference[i].size());
    CHECK_MESSAGE(std::memcmp(got[i].data(), reference[i].data(), got[i].size() * sizeof(float)) == 0,
                  "parameter ", i);
  }
  // The engine stored the policy object and called it: once placed, once warmed up, every step.
  CHECK(after.placements == 1);
  CHECK(after.warm_ups == 1);
  CHECK(after.steps == 4);
  CHECK(tide::train::trainer<tide::nn::gpt_spec<host>, halved, tide::optim::adamw>::scheduler_type::name() ==
        "halved<fifo>");
}

// ---- the optimizer slot ---------------------------------------------------------------------------

// AdamW with AMSGrad's maximum of the second moment (PyTorch's amsgrad = True): an optimizer of
// three state lists, written by a user, elementwise on the host. Its update over the whole model
// at once is the reference its per-chunk steps in the engine must equal.
struct amsgrad : tide::optim::adamw {
  static constexpr std::string_view name = "amsgrad";
  static constexpr std::size_t state_lists = 3;  // m, v, and the largest v so far
  static constexpr bool keeps_prev = false;       // the engine keeps the values before a step
  static constexpr bool out_of_place = false;
  static constexpr std::string_view state_name(std::size_t k) noexcept {
    return k == 0 ? "m" : k == 1 ? "v" : "vmax";
  }
  template <class T>
  void update(tide::exec<host> const&, tide::optim::update_args const& a,
              std::span<tide::optim::update_tensor<T, state_lists> const> tensors) const {
    float const c1 = 1.f - std::pow(beta1, static_cast<float>(a.step));
    float const c2 = 1.f - std::pow(beta2, static_cast<float>(a.step));
    float const decay = a.decay ? weight_decay : 0.f;
    for (auto const& x : tensors)
      for (tide::index_t i = 0; i < x.n; ++i) {
        float const g = tide::to_float(x.grad[i]) * a.grad_scale;
        float& m = x.state[0][i];
        float& v = x.state[1][i];
        float& vmax = x.state[2][i];
        m = beta1 * m + (1.f - beta1) * g;
        v = beta2 * v + (1.f - beta2) * g * g;
        vmax = std::max(vmax, v);
        float const p = x.master[i] * (1.f - a.lr * decay);
        x.master[i] = p - a.lr * (m / c1) / (std::sqrt(vmax / c2) + eps);
        if (x.working != nullptr) x.working[i] = tide::from_float<T>(x.master[i]);
      }
  }
};
static_assert(tide::optim::check_optimizer<amsgrad>() && tide::train::OptimizerPolicy<amsgrad>);

tide::optim::adam const adam{.lr = 2e-3f, .weight_decay = 0.01f};
tide::optim::sgd const nesterov{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true};
tide::optim::adamw const adamw{.lr = 3e-3f, .weight_decay = 0.1f};
constexpr int optimizer_steps = 5;

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The model's own buffers stepped by the optimizer's kernel over the whole flat buffer: no engine.
template <class O>
std::vector<std::vector<float>> plain(O const& o) {
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  tide::nn::gpt<host> model{config, arena, {.seed = 3}};
  auto const n = model.flat_params().extent(0);
  std::vector<float> s0(static_cast<std::size_t>(n), 0.f), s1(static_cast<std::size_t>(n), 0.f), s2 = s1;
  tide::tensor_view<float, host> a(s0.data(), {n}), b(s1.data(), {n});
  for (int s = 0; s < optimizer_steps; ++s) {
    auto const d = tide::test::token_runs(s, batch, seq, 64);
    model.zero_grad(ex);
    model.forward(ex, tide::tensor_view<std::int32_t const, host>(d.data(), {batch, seq}),
                  tide::tensor_view<std::int32_t const, host>(d.data() + batch * seq, {batch, seq}));
    model.backward(ex);
    tide::tensor_view<float const, host> g(model.flat_grads());
    if constexpr (std::is_same_v<O, tide::optim::sgd>)
      tide::kernels::sgd(ex, {o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov}, s + 1, model.flat_params(), g, a);
    else if constexpr (std::is_same_v<O, tide::optim::adam>)
      tide::kernels::adam(ex, {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay}, s + 1, model.flat_params(), g, a, b);
    else if constexpr (std::is_same_v<O, amsgrad>) {
      tide::optim::update_tensor<float, 3> const whole{.master = model.flat_params().data(), .grad = g.data(),
                                                       .state = {s0.data(), s1.data(), s2.data()}, .n = n};
      o.update(ex, {.step = s + 1, .lr = o.lr}, std::span(&whole, 1));
    }
    else
      tide::kernels::adamw(ex, o.hparams(o.lr), s + 1, model.flat_params(), g, a, b);
  }
  std::vector<std::vector<float>> out;
  for (auto const& p : model.parameters()) {
    auto const t = model.param(p);
    out.emplace_back(t.data(), t.data() + p.numel());
  }
  return out;
}

template <class Offload, class O>
void check_optimizer(Offload off, O const& o, std::vector<std::vector<float>> const& reference) {
  off.device_budget = tide::test::scheduler_minimum<Offload, float>(config, off, batch, seq) + 16_KiB;
  auto t = tide::train::make_trainer(spec, off, o);
  std::size_t moved = 0;
  for (int s = 0; s < optimizer_steps; ++s) {
    auto const d = tide::test::token_runs(s, batch, seq, 64);
    moved += t.step(view_of<decltype(t)>(d)).bytes_moved;
  }
  CHECK(moved > 0);
  for (std::uint32_t i = 0; i < reference.size(); ++i)
    CHECK_MESSAGE(same_bits(t.scheduler().read_param(i), reference[i]), O::name, " under ", Offload::name(),
                  ": parameter ", i);
}

TEST_CASE_TEMPLATE("each optimizer, called per chunk by the engine, equals its kernel over the whole model", O,
                   tide::optim::adam, tide::optim::sgd, tide::optim::adamw, amsgrad) {
  static amsgrad const ams{{.lr = 3e-3f, .weight_decay = 0.1f}};
  O const& o = []() -> O const& {
    if constexpr (std::is_same_v<O, tide::optim::adam>) return adam;
    else if constexpr (std::is_same_v<O, tide::optim::sgd>) return nesterov;
    else if constexpr (std::is_same_v<O, amsgrad>) return ams;
    else return adamw;
  }();
  auto const reference = plain(o);
  check_optimizer(off::chunked<off::belady>{.chunk_bytes = 20_KiB}, o, reference);
#if !TIDE_TEST_SANITIZER  // the sanitizer builds: one policy per optimizer (tests/CMakeLists.txt)
  check_optimizer(off::layer_window<2>{}, o, reference);
  check_optimizer(off::static_partition{.chunk_bytes = 20_KiB}, o, reference);
#endif
}

TEST_CASE("an optimizer of three state lists offloads, checkpoints a section per list and resumes bit for bit") {
  amsgrad const o{{.lr = 3e-3f, .weight_decay = 0.1f}};
  off::chunked<off::belady> policy{.chunk_bytes = 20_KiB};
  policy.device_budget = tide::test::scheduler_minimum<decltype(policy), float>(config, policy, batch, seq) + 16_KiB;
  auto const run = [](auto& t, int from, int to) {
    for (int s = from; s < to; ++s) t.step(view_of<std::remove_cvref_t<decltype(t)>>(tide::test::token_runs(s, batch, seq, 64)));
  };
  tide::test::scratch_dir dir("amsgrad");
  auto a = tide::train::make_trainer(spec, policy, o);
  run(a, 0, 3);
  a.save(dir.path / "ckpt");
  // The third list is AMSGrad's own: never below v, and above it where v fell since its peak.
  std::size_t above = 0, below = 0;
  for (std::uint32_t i = 0; i < a.model().parameters().size(); ++i) {
    auto const v = a.scheduler().state_view(1, i);
    std::vector<float> vs(v.size() / sizeof(float));
    std::memcpy(vs.data(), v.data(), v.size());
    auto const vmax = a.scheduler().state_view(2, i);
    for (std::size_t e = 0; e < vs.size(); ++e) {
      float x = 0;
      std::memcpy(&x, vmax.data() + e * sizeof(float), sizeof(float));
      above += x > vs[e];
      below += x < vs[e];
    }
  }
  CHECK(above > 0);
  CHECK(below == 0);
  tide::train::checkpoint_reader const r{dir.path / "ckpt"};
  for (std::string_view list : {"m/", "v/", "vmax/"})
    CHECK_MESSAGE(r.contains(std::string(list) + "wpe"), "no section ", list, "wpe");
  run(a, 3, 6);
  auto b = tide::train::make_trainer(spec, policy, o);
  b.load(dir.path / "ckpt");
  run(b, 3, 6);
  for (std::uint32_t i = 0; i < a.model().parameters().size(); ++i) {
    CHECK_MESSAGE(same_bits(a.scheduler().read_param(i), b.scheduler().read_param(i)), "parameter ", i);
    for (std::size_t k = 0; k < amsgrad::state_lists; ++k) {
      auto const x = a.scheduler().state_view(k, i);
      std::vector<std::byte> const sa(x.begin(), x.end());
      auto const y = b.scheduler().state_view(k, i);
      CHECK_MESSAGE(std::equal(sa.begin(), sa.end(), y.begin(), y.end()), "state list ", k, " of parameter ", i);
    }
  }
  CHECK_THROWS_WITH_AS((void)a.scheduler().state_view(3, 0), doctest::Contains("keeps 3 state lists"), tide::error);

  // The NVMe tier: a host budget for the parameters and the three lists of half the chunks; the
  // other chunks' lists live in a file, and training goes on to the same bits.
  std::size_t const n = a.scheduler().layout().chunks(), block = tide::round_up(a.scheduler().chunk_bytes(), 256);
  auto spilling = policy;
  spilling.memory.host_budget = n * block + (n / 2) * amsgrad::state_lists * block;
  tide::test::scratch_dir spill("amsgrad_spill");
  spilling.memory.spill_folder = spill.path;
  auto c = tide::train::make_trainer(spec, spilling, o);
  run(c, 0, 6);
  for (std::size_t k = 0; k < amsgrad::state_lists; ++k)
    CHECK(c.scheduler().state_list(k)[static_cast<std::uint32_t>(n - 1)].payload() == nullptr);  // on file
  for (std::uint32_t i = 0; i < a.model().parameters().size(); ++i) {
    CHECK_MESSAGE(same_bits(a.scheduler().read_param(i), c.scheduler().read_param(i)), "parameter ", i);
    auto const x = a.scheduler().state_view(2, i);
    std::vector<std::byte> const sa(x.begin(), x.end());
    auto const y = c.scheduler().state_view(2, i);
    CHECK_MESSAGE(std::equal(sa.begin(), sa.end(), y.begin(), y.end()), "vmax of parameter ", i);
  }
}

// ---- the gradient sink --------------------------------------------------------------------------

// Finishes each chunk later, on its own stream, after a short sleep, multiplying the gradients in
// place: the optimizer must wait for it (an event per chunk), or it reads unscaled gradients.
// (bf16 gradients too: a power-of-two factor scales them exactly.)
struct delayed_scaling_sink {
  struct job {
    std::span<float> grads;
    std::span<tide::bf16> grads16;
    float factor = 1;
    void operator()() const {
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      for (float& g : grads) g *= factor;
      for (tide::bf16& g : grads16) g = tide::from_float<tide::bf16>(tide::to_float(g) * factor);
    }
  };
  tide::memory::stream<host>* lane = nullptr;
  std::vector<job>* jobs = nullptr;  // by chunk: alive until the stream ran them
  float factor = 2;
  int* calls = nullptr;
  template <tide::Backend B, class T>
  bool reduce(off::ready_chunk<B, T> const& r) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, tide::bf16>) {
      if (r.valid_after != nullptr) lane->wait(*r.valid_after);
      job& j = (*jobs)[r.chunk];
      if constexpr (std::is_same_v<T, float>) j = {r.grads, {}, factor};
      else j = {{}, r.grads, factor};
      tide::memory::launch(*lane, j);
      r.done->record(*lane);
      ++*calls;
      return true;
    } else {
      return false;
    }
  }
};
static_assert(off::check_gradient_sink<delayed_scaling_sink>());

// Parameters after `steps` steps of SGD with momentum (linear in the gradient, so a scale shows).
template <class Policy, class Sink, class T = float>
std::vector<std::vector<T>> with_sink(Policy off, Sink sink, float loss_scale, int& calls,
                                      off::scheduler_options const& options = {}) {
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  tide::optim::sgd const o{.lr = 0.02f, .momentum = 0.9f};
  off.device_budget = tide::test::scheduler_minimum<Policy, T>(config, off, batch, seq) + 16_KiB;
  tide::memory::device_arena<host> arena{{.budget = Policy::moves_data ? off.device_budget : 64_MiB}};
  using sched_t = off::scheduler<host, T, Policy, tide::optim::sgd, Sink>;
  sched_t sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype_of<T>), tide::nn::gpt_block_uses(config), off,
                options, o, sink};
  tide::nn::gpt<host, T, off::hooks<sched_t>> model{config, arena, {.seed = 3}, {&sched}};
  std::size_t moved = 0;
  for (int s = 0; s < optimizer_steps; ++s) {
    auto const d = tide::test::token_runs(s, batch, seq, 64);
    model.forward(ex, tide::tensor_view<std::int32_t const, host>(d.data(), {batch, seq}),
                  tide::tensor_view<std::int32_t const, host>(d.data() + batch * seq, {batch, seq}));
    model.backward(ex, loss_scale);
    sched.step();
    moved += sched.last_step().bytes_moved();
  }
  if (Policy::moves_data) CHECK(moved > 0);
  calls = 0;
  if constexpr (!std::is_same_v<Sink, off::no_sink>) calls = *sched.sink().calls;
  std::vector<std::vector<T>> out;
  for (std::uint32_t i = 0; i < sched.parameters().size(); ++i) out.push_back(sched.read_param(i));
  return out;
}

// The sanitizer builds take the three ways of moving data (tests/CMakeLists.txt: TIDE_TEST_SANITIZER).
#if TIDE_TEST_SANITIZER
#  define TIDE_SINK_POLICIES off::resident, off::chunked<off::belady>, off::layer_window<2>
#  define TIDE_REUSE_POLICIES off::chunked<off::belady>, off::static_partition
#else
#  define TIDE_SINK_POLICIES off::resident, off::chunked<off::belady>, off::chunked<off::lru>, off::layer_window<2>, \
                             off::static_partition, halved
#  define TIDE_REUSE_POLICIES off::resident, off::chunked<off::belady>, off::layer_window<2>, off::static_partition
#endif

TEST_CASE_TEMPLATE("a sink that finishes late and scales the gradients equals scaling the loss, under every scheduler",
                   Policy, TIDE_SINK_POLICIES) {
  Policy off{};
  if constexpr (requires { off.chunk_bytes; }) off.chunk_bytes = 20_KiB;
  int calls = 0, none = 0;
  auto const scaled_loss = with_sink(off, off::no_sink{}, 2.f, none);
  auto const unscaled = with_sink(off, off::no_sink{}, 1.f, none);
  tide::memory::stream<host> lane;
  std::vector<delayed_scaling_sink::job> jobs(64);
  int counted = 0;
  auto const sunk = with_sink(off, delayed_scaling_sink{&lane, &jobs, 2.f, &counted}, 1.f, calls);
  CHECK(calls > 0);
  bool differs = false;  // scaling matters: the test could fail
  for (std::size_t i = 0; i < sunk.size(); ++i) {
    CHECK_MESSAGE(same_bits(sunk[i], scaled_loss[i]), Policy::name(), ": parameter ", i);
    differs = differs || !same_bits(unscaled[i], scaled_loss[i]);
  }
  CHECK(differs);
}

// Gradient-slot reuse with a sink that finishes late: the gradients sit in the parameter slots
// while the sink scales them on its own lane, so every copy and update of such a slot must wait
// for the sink's event, as for a gradient chunk. bf16 with reuse equals bf16 without it, and
// scaling the gradients in the sink equals scaling the loss (a factor of 2 is exact in bf16).
TEST_CASE_TEMPLATE("gradient-slot reuse with a sink that finishes late: the same bits as without reuse", Policy,
                   TIDE_REUSE_POLICIES) {
  Policy off{};
  if constexpr (requires { off.chunk_bytes; }) off.chunk_bytes = 10_KiB;
  auto const same16 = [](std::vector<tide::bf16> const& a, std::vector<tide::bf16> const& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(tide::bf16)) == 0;
  };
  // Deferred too (as clipping runs it): a slot is then fetched for its update while the sink may
  // still be scaling it.
  for (bool const deferred : {false, true}) {
    INFO("defer_optimizer = " << deferred);
    off::scheduler_options const plain_options{.defer_optimizer = deferred};
    off::scheduler_options reuse = plain_options;
    reuse.reuse_grad_slots = true;
    int calls = 0, none = 0;
    auto const scaled_loss = with_sink<Policy, off::no_sink, tide::bf16>(off, off::no_sink{}, 2.f, none, reuse);
    auto const unscaled = with_sink<Policy, off::no_sink, tide::bf16>(off, off::no_sink{}, 1.f, none, reuse);
    tide::memory::stream<host> lane;
    std::vector<delayed_scaling_sink::job> jobs(64);
    int counted = 0;
    delayed_scaling_sink const sink{&lane, &jobs, 2.f, &counted};
    auto const plain = with_sink<Policy, delayed_scaling_sink, tide::bf16>(off, sink, 1.f, calls, plain_options);
    auto const reused = with_sink<Policy, delayed_scaling_sink, tide::bf16>(off, sink, 1.f, calls, reuse);
    CHECK(calls > 0);
    bool differs = false;  // scaling matters: the test could fail
    for (std::size_t i = 0; i < reused.size(); ++i) {
      CHECK_MESSAGE(same16(reused[i], plain[i]), Policy::name(), ": parameter ", i);
      CHECK_MESSAGE(same16(reused[i], scaled_loss[i]), Policy::name(), ": parameter ", i);
      differs = differs || !same16(unscaled[i], scaled_loss[i]);
    }
    CHECK(differs);
  }
}

// Inside a step, after backward, a slot holds gradients: read_param gives the parameters (the
// master rounded), and a skipped step leaves exactly those.
TEST_CASE("gradient-slot reuse: read_param between backward and step gives the parameters") {
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  off::chunked<off::belady> policy{.chunk_bytes = 10_KiB};
  policy.device_budget = tide::test::scheduler_minimum<decltype(policy), tide::bf16>(config, policy, batch, seq) + 16_KiB;
  tide::memory::device_arena<host> arena{{.budget = policy.device_budget}};
  using sched_t = off::scheduler<host, tide::bf16, off::chunked<off::belady>>;
  sched_t sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::bf16), tide::nn::gpt_block_uses(config),
                policy, {.defer_optimizer = true, .reuse_grad_slots = true}, tide::optim::adamw{.lr = 3e-3f}};
  tide::nn::gpt<host, tide::bf16, off::hooks<sched_t>> model{config, arena, {.seed = 3}, {&sched}};
  auto params = [&] {
    std::vector<std::vector<tide::bf16>> out;
    for (std::uint32_t i = 0; i < sched.parameters().size(); ++i) out.push_back(sched.read_param(i));
    return out;
  };
  auto pass = [&](int s) {
    auto const d = tide::test::token_runs(s, batch, seq, 64);
    model.forward(ex, tide::tensor_view<std::int32_t const, host>(d.data(), {batch, seq}),
                  tide::tensor_view<std::int32_t const, host>(d.data() + batch * seq, {batch, seq}));
    model.backward(ex);
  };
  pass(0);
  sched.step();
  auto const before = params();
  pass(1);
  auto const mid = params();  // every chunk's slot holds gradients now
  sched.skip_step();
  auto const after = params();
  REQUIRE(before.size() == mid.size());
  for (std::size_t i = 0; i < before.size(); ++i) {
    CHECK(std::memcmp(before[i].data(), mid[i].data(), before[i].size() * sizeof(tide::bf16)) == 0);
    CHECK(std::memcmp(before[i].data(), after[i].data(), before[i].size() * sizeof(tide::bf16)) == 0);
  }
}

// A sink whose reductions wait on a latch that the test opens only after backward returned: if
// the engine waited for a sink's event on the compute thread, each reduction would sit out its
// deadline and say so. The deadline only turns that bug into a failure instead of a hang.
struct held_sink {
  struct latch {
    std::mutex m;
    std::condition_variable cv;
    bool open = false;
    int finished = 0;   // reductions done
    int timed_out = 0;  // reductions that gave up waiting
    void release() {
      {
        std::lock_guard lock(m);
        open = true;
      }
      cv.notify_all();
    }
  };
  struct job {
    latch* l = nullptr;
    void operator()() const {
      std::unique_lock lock(l->m);
      if (!l->cv.wait_for(lock, std::chrono::seconds(5), [this] { return l->open; })) ++l->timed_out;
      ++l->finished;
    }
  };
  tide::memory::stream<host>* lane = nullptr;
  latch* const* current = nullptr;  // this step's latch
  std::vector<job>* jobs = nullptr;
  template <tide::Backend B, class T>
  bool reduce(off::ready_chunk<B, T> const& r) {
    if (r.valid_after != nullptr) lane->wait(*r.valid_after);
    (*jobs)[r.chunk] = {*current};
    tide::memory::launch(*lane, (*jobs)[r.chunk]);
    r.done->record(*lane);
    return true;
  }
};

// Parameters pinned on the device, optimizer state on the host: every chunk's step is a host step
// on the optimizer worker and its gradients are copied out while the sink works, yet backward
// fetches nothing, so nothing it needs queues behind a gradient's copy out.
struct state_on_host : off::resident {
  static constexpr bool moves_data = true;
  static std::string name() { return "state_on_host"; }
  template <class Engine>
  void place(Engine& e) {
    e.pin_parameters();
  }
};
static_assert(off::check_scheduler_policy<state_on_host>());

TEST_CASE("backward does not wait for the sink: a chunk's host step and its copy out wait on its event") {
  state_on_host policy{};
  policy.chunk_bytes = 20_KiB;
  policy.device_budget = 64_MiB;
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = policy.device_budget}};
  using sched_t = off::scheduler<host, float, state_on_host, tide::optim::sgd, held_sink>;
  tide::memory::stream<host> lane;
  std::vector<held_sink::job> jobs(64);
  tide::optim::sgd const o{.lr = 0.02f, .momentum = 0.9f};
  std::array<held_sink::latch, 3> latches;  // one per step: the warm-up, then steady steps
  held_sink::latch* current = nullptr;
  sched_t sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config),
                policy, {}, o, held_sink{&lane, &current, &jobs}};
  tide::nn::gpt<host, float, off::hooks<sched_t>> model{config, arena, {.seed = 3}, {&sched}};
  for (int s = 0; s < 3; ++s) {
    held_sink::latch& l = latches[static_cast<std::size_t>(s)];
    current = &l;
    auto const d = tide::test::token_runs(s, batch, seq, 64);
    model.forward(ex, tide::tensor_view<std::int32_t const, host>(d.data(), {batch, seq}),
                  tide::tensor_view<std::int32_t const, host>(d.data() + batch * seq, {batch, seq}));
    model.backward(ex);
    {
      std::lock_guard lock(l.m);
      CHECK_MESSAGE(l.finished == 0, "step ", s, ": backward waited for ", l.finished, " reductions");
    }
    l.release();
    sched.step();
    CHECK(sched.last_step().device_optimizer_chunks == 0);
    CHECK(sched.last_step().host_optimizer_chunks > 0);
    CHECK(sched.last_step().bytes_moved() > 0);
    CHECK(l.timed_out == 0);
    CHECK(l.finished > 0);
  }
}

// ---- the chunk source ----------------------------------------------------------------------------

// Fills each parameter chunk on its own stream, late (a sleep, then the copy), and counts; throws
// on fill number `fail_at` (0: never), before anything is issued, as a failed gather would.
struct delayed_source {
  struct job {
    std::byte* device = nullptr;
    std::byte const* host = nullptr;
    std::size_t bytes = 0;
    void operator()() const {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      std::memcpy(device, host, bytes);
    }
  };
  tide::memory::stream<host>* lane = nullptr;
  std::vector<job>* jobs = nullptr;  // by chunk
  int* fills = nullptr;
  int* releases = nullptr;
  int fail_at = 0;
  template <tide::Backend B>
  void fill(off::fill_request<B> const& r) {
    if (++*fills == fail_at) throw tide::error(tide::errc::io, "test: the gather of a chunk failed");
    if (r.block_free != nullptr) lane->wait(*r.block_free);  // a handed-over block: after the victim's copy out
    job& j = (*jobs)[r.chunk];
    j = {r.device, r.host, r.bytes};
    tide::memory::launch(*lane, j);
    r.ready->record(*lane);
  }
  void released(std::uint32_t) noexcept { ++*releases; }
};
static_assert(off::check_chunk_source<delayed_source>());

// A communication policy of one process whose chunks come from the delayed source.
struct source_comm {
  static constexpr std::string_view name = "test";
  using sink_type = off::no_sink;
  using source_type = delayed_source;
  delayed_source src;
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int world_size() const noexcept { return 1; }
  [[nodiscard]] sink_type sink() const noexcept { return {}; }
  [[nodiscard]] source_type source() const noexcept { return src; }
};
static_assert(tide::train::CommPolicy<source_comm>);

template <class Policy>
void check_source(Policy off, std::vector<std::vector<float>> const& reference) {
  if constexpr (requires { off.chunk_bytes; }) off.chunk_bytes = 20_KiB;
  off.device_budget = tide::test::scheduler_minimum<Policy, float>(config, off, batch, seq) + 16_KiB;
  tide::memory::stream<host> lane;
  std::vector<delayed_source::job> jobs(64);
  int fills = 0, releases = 0;
  auto t = tide::train::make_trainer(spec, off, opt, source_comm{{&lane, &jobs, &fills, &releases, 0}});
  for (int s = 0; s < 4; ++s) {
    auto const d = tide::test::token_runs(s, batch, seq, 64);
    t.step(view_of<decltype(t)>(d));
  }
  CHECK(fills > 0);
  CHECK(releases > 0);
  for (std::uint32_t i = 0; i < reference.size(); ++i)
    CHECK_MESSAGE(same_bits(t.scheduler().read_param(i), reference[i]), Policy::name(), ": parameter ", i);
}

// A comm policy on two ranks with none of RankAgreement's members: refused before anything runs,
// since a checkpoint failing on one rank would go unseen by the other.
struct mute_comm : tide::train::no_comm {
  static constexpr std::string_view name = "mute";
  [[nodiscard]] int world_size() const noexcept { return 2; }
};
static_assert(tide::train::CommPolicy<mute_comm> && !tide::train::RankAgreement<mute_comm>);
static_assert(tide::train::RankAgreement<tide::comm::data_parallel<tide::comm::self>>);

TEST_CASE("a comm policy of several ranks without all_ranks, of_rank0 and sum_over_ranks is refused, naming them") {
  CHECK_THROWS_WITH_AS(tide::train::make_trainer(spec, tide::offload::resident{}, opt, mute_comm{}),
                       doctest::Contains("has no all_ranks(bool), of_rank0(int64) and sum_over_ranks(double)"),
                       tide::error);
}

TEST_CASE("a chunk source that fills late on its own stream gives the same bits, and is told of every release") {
  auto const reference = train(off::resident{}, 4);
  check_source(off::chunked<off::belady>{}, reference);
  check_source(off::layer_window<2>{}, reference);
  check_source(off::static_partition{}, reference);
}

TEST_CASE("a chunk source that throws loses nothing: the step is undone and training goes on to the same bits") {
  auto const reference = train(off::resident{}, 4);  // offloading, with any source, gives these bits
  off::chunked<off::belady> policy{.chunk_bytes = 20_KiB};
  policy.device_budget = tide::test::scheduler_minimum<decltype(policy), float>(config, policy, batch, seq) + 16_KiB;
  for (int fail_at : {1, 3, 7, 20, 40}) {  // 44 fills in 4 steps
    tide::memory::stream<host> lane;
    std::vector<delayed_source::job> jobs(64);
    int fills = 0, releases = 0;
    auto t = tide::train::make_trainer(spec, policy, opt, source_comm{{&lane, &jobs, &fills, &releases, fail_at}});
    int failures = 0;
    for (int s = 0; s < 4; ++s) {
      auto const d = tide::test::token_runs(s, batch, seq, 64);
      std::vector<std::vector<float>> before;
      for (std::uint32_t i = 0; i < reference.size(); ++i) before.push_back(t.scheduler().read_param(i));
      try {
        t.step(view_of<decltype(t)>(d));
      } catch (tide::error const& e) {
        ++failures;
        CHECK(std::string(e.what()).find("the gather of a chunk failed") != std::string::npos);
        for (std::uint32_t i = 0; i < reference.size(); ++i)
          CHECK_MESSAGE(same_bits(t.scheduler().read_param(i), before[i]), "fill ", fail_at, ": parameter ", i);
        t.step(view_of<decltype(t)>(d));  // the same step again, now without a failure
      }
    }
    CHECK_MESSAGE(failures == 1, "fill ", fail_at, " (", fills, " fills in all)");
    for (std::uint32_t i = 0; i < reference.size(); ++i)
      CHECK_MESSAGE(same_bits(t.scheduler().read_param(i), reference[i]), "fill ", fail_at, ": parameter ", i);
  }
}

// ---- a list the sink keeps: an error-feedback residual --------------------------------------------

// Rounds each gradient to bf16 precision and carries what the rounding lost into the next step
// (the error feedback of RedSync and DGC, with rounding as the compressor). The residual is an
// extra list the engine allocates, places with the optimizer state, undoes and checkpoints.
struct feedback_sink {
  static constexpr std::array<off::extra_list, 1> lists{{{"residual", tide::dtype::f32}}};
  int* calls = nullptr;
  template <tide::Backend B, class T>
  bool reduce(off::ready_chunk<B, T> const& r) {
    if constexpr (std::is_same_v<T, float>) {
      auto* residual = reinterpret_cast<float*>(r.lists[0].data());
      for (std::size_t i = 0; i < r.grads.size(); ++i) {
        float const x = r.grads[i] + residual[i];
        float const kept = tide::to_float(tide::from_float<tide::bf16>(x));
        residual[i] = x - kept;
        r.grads[i] = kept;
      }
      ++*calls;
    }
    return false;
  }
};
static_assert(off::check_gradient_sink<feedback_sink>());

struct feedback_comm {
  static constexpr std::string_view name = "feedback";
  using sink_type = feedback_sink;
  using source_type = off::host_source;
  feedback_sink s;
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int world_size() const noexcept { return 1; }
  [[nodiscard]] sink_type sink() const noexcept { return s; }
  [[nodiscard]] source_type source() const noexcept { return {}; }
};

template <class Trainer>
std::vector<std::vector<float>> residuals_of(Trainer& t) {
  std::vector<std::vector<float>> out;
  for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) {
    auto const b = t.scheduler().extra_bytes(0, i);
    out.emplace_back(reinterpret_cast<float const*>(b.data()), reinterpret_cast<float const*>(b.data() + b.size()));
  }
  return out;
}

TEST_CASE("a sink's extra list is kept, placed with the optimizer state, undone with a failed step and checkpointed") {
  namespace fs = std::filesystem;
  off::chunked<off::belady> policy{.chunk_bytes = 20_KiB};
  policy.device_budget = tide::test::scheduler_minimum<decltype(policy), float>(config, policy, batch, seq) + 256_KiB;
  int calls = 0;
  auto run = [&](int from, int to, auto& t) {
    for (int s = from; s < to; ++s) {
      auto const d = tide::test::token_runs(s, batch, seq, 64);
      t.step(view_of<std::remove_cvref_t<decltype(t)>>(d));
    }
  };
  auto straight = tide::train::make_trainer(spec, policy, opt, feedback_comm{{&calls}});
  run(0, 4, straight);
  CHECK(calls > 0);
  auto const residual = residuals_of(straight);
  bool nonzero = false;
  for (auto const& r : residual)
    for (float x : r) nonzero = nonzero || x != 0.f;
  CHECK(nonzero);  // rounding to bf16 lost something, and the sink kept it
  // Where the optimizer state went (the margin of this budget holds some of it), the residual went too.
  auto const& sched = straight.scheduler();
  bool some_on_device = false;
  for (std::uint32_t c = 0; c < sched.layout().chunks(); ++c) {
    CHECK(sched.extra_list(0)[c].tier() == sched.state_list(0)[c].tier());
    some_on_device = some_on_device || sched.os_on_device(c);
  }
  CHECK(some_on_device);

  // Two steps, a checkpoint, two more in a new trainer: the same bits as four straight.
  fs::path const dir = fs::temp_directory_path() / ("tide-slots-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    auto first = tide::train::make_trainer(spec, policy, opt, feedback_comm{{&calls}});
    run(0, 2, first);
    first.save(dir / "half.tide");
  }
  auto resumed = tide::train::make_trainer(spec, policy, opt, feedback_comm{{&calls}});
  resumed.load(dir / "half.tide");
  run(2, 4, resumed);
  auto forgetful = tide::train::make_trainer(spec, policy, opt, feedback_comm{{&calls}});
  forgetful.load(dir / "half.tide");
  for (std::uint32_t i = 0; i < forgetful.model().parameters().size(); ++i) {
    auto b = forgetful.scheduler().extra_bytes(0, i);
    std::memset(b.data(), 0, b.size());  // what a checkpoint without the residual would give
  }
  run(2, 4, forgetful);
  bool forgot = false;
  for (std::uint32_t i = 0; i < residual.size(); ++i) {
    CHECK_MESSAGE(same_bits(resumed.scheduler().read_param(i), straight.scheduler().read_param(i)), "parameter ", i);
    CHECK(same_bits(residuals_of(resumed)[i], residual[i]));
    forgot = forgot || !same_bits(forgetful.scheduler().read_param(i), straight.scheduler().read_param(i));
  }
  CHECK(forgot);  // the residual matters: without it the run goes elsewhere

  // A step that fails after the sink ran: parameters and residual as before the step.
  auto t = tide::train::make_trainer(spec, policy, opt, feedback_comm{{&calls}});
  run(0, 2, t);
  std::size_t const copies_before = t.scheduler().transfers().stats().copies;
  run(2, 3, t);
  std::size_t const per_step = t.scheduler().transfers().stats().copies - copies_before;
  REQUIRE(per_step > 4);
  std::vector<std::vector<float>> params_before;
  for (std::uint32_t i = 0; i < residual.size(); ++i) params_before.push_back(t.scheduler().read_param(i));
  auto const residual_before = residuals_of(t);
  auto const d = tide::test::token_runs(3, batch, seq, 64);
  int const before_calls = calls;
  t.scheduler().transfers().fail_copy(per_step - 2);  // late in backward, after the sink saw some chunks
  CHECK_THROWS_AS(t.step(view_of<decltype(t)>(d)), tide::error);
  CHECK(calls > before_calls);
  for (std::uint32_t i = 0; i < residual.size(); ++i) {
    CHECK(same_bits(t.scheduler().read_param(i), params_before[i]));
    CHECK(same_bits(residuals_of(t)[i], residual_before[i]));
  }
  t.step(view_of<decltype(t)>(d));  // and the step runs again
  fs::remove_all(dir);
}

}  // namespace

// ---- a sink that shards the optimizer state (ZeRO) ------------------------------------------------

// Two ranks in one process, each a thread with its own trainer, training on the same data (so
// their gradients are equal and nothing needs summing): each keeps and steps the state of its
// own chunks, c % 2 == rank, and takes the other's chunks from it after the step; or (ZeRO-3)
// keeps only its own chunks' parameters and takes the other's around the blocks that use them.
struct pair_exchange {
  std::barrier<> sync{2};
  std::array<std::span<std::span<float> const>, 2> chunks{};
  std::array<std::vector<std::pair<std::uint32_t, std::span<float>>>, 2> gathers{};  // ZeRO-3, by rank
  int fail_at = 0;  // the share or gather wait (counted per rank) after which both ranks throw, having copied
  std::array<bool, 2> in_step{};  // by rank: gather waits inside a step count
  std::array<int, 2> starts{};     // by rank: gathers started inside a step (fail_at < 0: the -fail_at-th throws)
};
struct pair_sink {
  pair_exchange* x = nullptr;
  int r = 0;
  int* shares = nullptr;
  bool zero3 = false;
  [[nodiscard]] off::chunk_shard shard() const noexcept { return {r, 2}; }
  [[nodiscard]] bool shards_parameters() const noexcept { return zero3; }
  template <class T>
  void gather_async(std::uint32_t c, std::span<T> bytes) {
    auto const me = static_cast<std::size_t>(r);
    if (x->in_step[me] && ++x->starts[me] == -x->fail_at)  // before anything started, on both ranks
      throw tide::error(tide::errc::mpi, "test: the exchange failed to start");
    if constexpr (std::is_same_v<T, float>) x->gathers[me].emplace_back(c, bytes);
  }
  // Both ranks started the same gathers: each takes the other's chunks from it.
  void wait_gathered() {
    auto& mine = x->gathers[static_cast<std::size_t>(r)];
    x->sync.arrive_and_wait();
    auto const& other = x->gathers[static_cast<std::size_t>(1 - r)];
    REQUIRE(mine.size() == other.size());
    for (std::size_t k = 0; k < mine.size(); ++k) {
      REQUIRE(mine[k].first == other[k].first);  // the same chunks in the same order on both ranks
      if (static_cast<int>(mine[k].first % 2) != r) std::ranges::copy(other[k].second, mine[k].second.begin());
    }
    x->sync.arrive_and_wait();
    mine.clear();
    if (!x->in_step[static_cast<std::size_t>(r)]) return;  // gather_parameters between steps: not counted
    if (++*shares == x->fail_at) throw tide::error(tide::errc::mpi, "test: the exchange failed");
  }
  template <tide::Backend B, class T>
  bool reduce(off::ready_chunk<B, T> const&) {
    return false;
  }
  template <class T>
  void share_parameters(std::span<std::span<T> const> chunks) {
    if constexpr (std::is_same_v<T, float>) {
      x->chunks[static_cast<std::size_t>(r)] = chunks;
      x->sync.arrive_and_wait();
      auto const& other = x->chunks[static_cast<std::size_t>(1 - r)];
      for (std::size_t c = 0; c < chunks.size(); ++c)
        if (static_cast<int>(c % 2) != r) std::memcpy(chunks[c].data(), other[c].data(), chunks[c].size_bytes());
      x->sync.arrive_and_wait();
      if (++*shares == x->fail_at) throw tide::error(tide::errc::mpi, "test: the exchange failed");
    }
  }
};
static_assert(off::check_gradient_sink<pair_sink>() && off::ParameterShardingSink<pair_sink>);
struct pair_comm {
  static constexpr std::string_view name = "pair";
  using sink_type = pair_sink;
  using source_type = off::host_source;
  pair_sink s;
  [[nodiscard]] int rank() const noexcept { return s.r; }
  [[nodiscard]] int world_size() const noexcept { return 1; }  // nothing is summed: no mean over ranks
  [[nodiscard]] sink_type sink() const noexcept { return s; }
  [[nodiscard]] source_type source() const noexcept { return {}; }
};

template <class Policy>
void check_sharded(Policy policy, std::vector<std::vector<float>> const& reference, int fail_at, bool zero3) {
  if constexpr (requires { policy.chunk_bytes; }) policy.chunk_bytes = 20_KiB;  // layer_window: a layer per chunk
  if constexpr (Policy::moves_data)
    policy.device_budget = tide::test::scheduler_minimum<Policy, float>(config, policy, batch, seq) + 16_KiB;
  pair_exchange x;
  x.fail_at = fail_at;
  auto rank = [&](int r) {
    int shares = 0, failures = 0;
    auto t = tide::train::make_trainer(spec, policy, opt, pair_comm{{&x, r, &shares, zero3}});
    auto& sched = t.scheduler();
    CHECK(sched.shards_parameters() == zero3);
    for (int s = 0; s < 4; ++s) {
      auto const d = tide::test::token_runs(s, batch, seq, 64);
      std::vector<std::vector<float>> before;
      if (s > 0 && zero3) {  // between steps a rank holds its own chunks only, until it gathers
        for (std::uint32_t i = 0; i < reference.size(); ++i) {
          CHECK(sched.holds_parameter(i) == sched.keeps_state(i));
          if (!sched.keeps_state(i)) CHECK_THROWS_AS((void)sched.read_param(i), tide::error);
        }
        // What the last step left: the rank's own parameter chunks and Adam's m and v of them
        // (static_partition pins the parameters on the device after each step and keeps their
        // host copy, so that evicting them needs no copy).
        std::size_t const n = sched.layout().chunks(), own = (n + 1 - static_cast<std::size_t>(r)) / 2;
        std::size_t const copies = std::is_same_v<Policy, off::static_partition> ? own : 0;
        auto const last = sched.last_step();
        CHECK(last.device_model_bytes + last.host_model_bytes == (3 * own + copies) * sched.chunk_bytes());
      }
      sched.gather_parameters();
      for (std::uint32_t i = 0; i < reference.size(); ++i) before.push_back(sched.read_param(i));
      try {
        x.in_step[static_cast<std::size_t>(r)] = true;
        (void)t.step(view_of<decltype(t)>(d));
        x.in_step[static_cast<std::size_t>(r)] = false;
      } catch (tide::error const& e) {
        x.in_step[static_cast<std::size_t>(r)] = false;
        ++failures;
        CHECK(std::string(e.what()).find("the exchange failed") != std::string::npos);
        sched.gather_parameters();
        for (std::uint32_t i = 0; i < reference.size(); ++i)  // stepped chunks and received ones put back
          CHECK_MESSAGE(same_bits(sched.read_param(i), before[i]), "rank ", r, ": parameter ", i);
        (void)t.step(view_of<decltype(t)>(d));
      }
    }
    CHECK(failures == (fail_at != 0 ? 1 : 0));
    auto const last = sched.last_step();
    sched.gather_parameters();
    for (std::uint32_t i = 0; i < reference.size(); ++i) {
      CHECK_MESSAGE(same_bits(sched.read_param(i), reference[i]), Policy::name(), ", rank ", r, ": parameter ", i);
      CHECK(sched.keeps_state(i) == (static_cast<int>(sched.layout().chunk_of[i] % 2) == r));
      if (!sched.keeps_state(i)) CHECK_THROWS_AS((void)sched.state_bytes(0, i), tide::error);
    }
    // Between steps a rank keeps every parameter chunk (ZeRO-3: its own) and Adam's m and v of its
    // own chunks only.
    std::size_t const n = sched.layout().chunks(), own = (n + 1 - static_cast<std::size_t>(r)) / 2;
    std::size_t const copies = std::is_same_v<Policy, off::static_partition> ? (zero3 ? own : n) : 0;
    CHECK(last.device_model_bytes + last.host_model_bytes ==
          ((zero3 ? own : n) + 2 * own + copies) * sched.chunk_bytes());
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
}

TEST_CASE("a sharding sink: each rank steps its own chunks, keeps only their state, and a failed exchange is undone") {
  auto const reference = train(off::resident{}, 4);
  for (int fail_at : {0, 2}) {
    CAPTURE(fail_at);
    check_sharded(off::resident{}, reference, fail_at, false);
    check_sharded(off::chunked<off::belady>{}, reference, fail_at, false);
  }
}

TEST_CASE("a parameter-sharding sink (ZeRO-3): each rank holds its own chunks' parameters between steps, gathers "
          "the others' around their blocks, and a failed gather is undone") {
  auto const reference = train(off::resident{}, 4);
  // fail_at: the k-th gather wait of each rank inside a step throws on both, for every wait of
  // the first two steps (5 to 6 each: in forward, and in backward after some chunks were stepped);
  // negative: the -fail_at-th gather fails to start (the gathers started before it are waited for
  // by the abandoned step), among the first steps' 20.
  for (int fail_at = -20; fail_at <= 12; ++fail_at) {
    CAPTURE(fail_at);
    check_sharded(off::resident{}, reference, fail_at, true);
    check_sharded(off::chunked<off::belady>{}, reference, fail_at, true);
    check_sharded(off::layer_window<2>{}, reference, fail_at, true);
    check_sharded(off::static_partition{}, reference, fail_at, true);
  }
}
