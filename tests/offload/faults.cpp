// Errors lose nothing. A failure injected at every arena allocation and at every copy of a step
// (the warm-up step and a steady one), under every scheduler, with the optimizer overlapped with
// backward and deferred to step(): the step throws tide::error, the trainer's state then saves to
// the very bytes it saved before the step, and training goes on to the bits of a run that never
// failed. A hook that throws in any block, forward or backward, does the same to a scheduler
// driven by hand.

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "tide/nn/gpt.hpp"
#include "tide/offload/scheduler.hpp"
#include "tide/train/trainer.hpp"
#include "support/files.hpp"
#include "support/gpt_steps.hpp"

namespace {

using namespace tide::literals;
using tide::host;
namespace off = tide::offload;
namespace fs = std::filesystem;

constexpr tide::nn::gpt_config config{.layers = 2, .heads = 2, .channels = 32, .vocab = 64, .max_seq = 16};
constexpr tide::index_t batch = 2, seq = 16;
constexpr std::size_t chunk_bytes = 20_KiB;
constexpr int steps = 3;
template <class T = float>
tide::nn::gpt_spec<host, T> const spec{.config = config, .options = {.seed = 5}};
tide::optim::adamw const overlapped{.lr = 3e-3f};                  // each chunk steps beside backward
tide::optim::adamw const deferred{.lr = 3e-3f, .clip_norm = 0.5f};  // clipping: every step in step()

std::vector<std::int32_t> data_of(int s) { return tide::test::token_runs(s, batch, seq, config.vocab); }
template <class Trainer>
typename Trainer::batch_type view_of(std::vector<std::int32_t> const& d) {
  return {{d.data(), {batch, seq}}, {d.data() + batch * seq, {batch, seq}}};
}

using tide::test::file_text;
bool has_text(std::string const& s, std::string_view part) { return s.find(part) != std::string::npos; }

enum class fault { allocation, copy, activation_copy };

// What a run without failures did: the parameters at the end, a checkpoint before each step, and
// how many requests of each kind each step made.
template <class T>
struct clean_run {
  std::vector<std::vector<T>> params;
  std::vector<std::size_t> allocations, copies, activation_copies;
};

template <class Trainer>
auto params_of(Trainer& t) {
  std::vector<std::vector<typename Trainer::element_type>> out;
  for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) out.push_back(t.scheduler().read_param(i));
  return out;
}

template <class T, class Offload>
clean_run<T> run_clean(Offload const& offload, tide::optim::adamw const& opt, fs::path const& dir,
                       tide::nn::gpt_spec<host, T> const& model) {
  clean_run<T> r;
  auto t = tide::train::make_trainer(model, offload, opt);
  for (int s = 0; s < steps; ++s) {
    t.save(dir / ("before-" + std::to_string(s)));
    std::size_t const a = t.arena().stats().allocations, c = t.scheduler().transfers().stats().copies;
    std::size_t const ac = t.scheduler().activation_transfers().stats().copies;
    (void)t.step(view_of<decltype(t)>(data_of(s)));
    r.allocations.push_back(t.arena().stats().allocations - a);
    r.copies.push_back(t.scheduler().transfers().stats().copies - c);
    r.activation_copies.push_back(t.scheduler().activation_transfers().stats().copies - ac);
  }
  r.params = params_of(t);
  return r;
}

// A fresh trainer whose request n of step `faulty` fails. The step throws (and then saves to the
// bytes saved before it in the clean run, and is retried), or the scheduler absorbs the failure
// (an arena refusal it answers by evicting); either way the run ends with the clean run's bits.
// Returns whether the step threw.
template <class T, class Offload>
bool inject(Offload const& offload, tide::optim::adamw const& opt, fault kind, int faulty, std::size_t n,
            clean_run<T> const& clean, fs::path const& dir, tide::nn::gpt_spec<host, T> const& model) {
  auto t = tide::train::make_trainer(model, offload, opt);
  bool threw = false;
  std::size_t moved = 0;
  for (int s = 0; s < steps; ++s) {
    auto const d = data_of(s);
    if (s == faulty) {
      if (kind == fault::allocation) t.arena().fail_allocation(n);
      else if (kind == fault::copy) t.scheduler().transfers().fail_copy(n);
      else t.scheduler().activation_transfers().fail_copy(n);
      try {
        moved += t.step(view_of<decltype(t)>(d)).bytes_moved;
      } catch (tide::error const& e) {
        threw = true;
        CHECK((e.category() == tide::errc::budget || e.category() == tide::errc::io));
        CHECK(std::string(e.message()).find("injected") != std::string::npos);
      }
      t.arena().fail_allocation(0);
      t.scheduler().transfers().fail_copy(0);
      t.scheduler().activation_transfers().fail_copy(0);
      if (threw) {
        REQUIRE(!t.scheduler().in_step());
        CHECK(t.steps() == s);
        t.save(dir / "after");
        REQUIRE(file_text(dir / "after") == file_text(dir / ("before-" + std::to_string(s))));
        moved += t.step(view_of<decltype(t)>(d)).bytes_moved;  // training goes on
      }
      continue;
    }
    moved += t.step(view_of<decltype(t)>(d)).bytes_moved;
  }
  auto const got = params_of(t);
  REQUIRE(got.size() == clean.params.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("parameter " << i);
    CHECK(std::memcmp(got[i].data(), clean.params[i].data(), got[i].size() * sizeof(T)) == 0);
  }
  if (Offload::moves_data) CHECK(moved > 0);  // chunks really moved
  return threw;
}

// Which requests of the step fail, one run each: every one in the release suite. Under a
// sanitizer every fifth (from the first, and past the last), spread over the whole step: those
// builds are after races and undefined behaviour, not the one request that alone would lose
// something; every request took 4 minutes under TSan, and every third 217 s under ASan on a
// 2-core AMD EPYC, the longest test of the suite by far.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr std::size_t site_stride = 5;
#else
constexpr std::size_t site_stride = 1;
#endif

template <class Offload, class T = float>
void check_faults(Offload const& offload, std::string const& name, tide::nn::gpt_spec<host, T> const& model = spec<T>) {
  tide::test::scratch_dir dir{"faults"};
  for (auto const& opt : {overlapped, deferred}) {
    clean_run<T> const clean = run_clean<T>(offload, opt, dir.path, model);
    for (int faulty : {0, steps - 1})  // the warm-up (placement, trace) and a step replaying the trace
      for (fault kind : {fault::allocation, fault::copy, fault::activation_copy}) {
        auto const& made = kind == fault::allocation ? clean.allocations
                           : kind == fault::copy     ? clean.copies
                                                     : clean.activation_copies;
        if (kind == fault::activation_copy && std::ranges::all_of(made, [](std::size_t k) { return k == 0; })) continue;
        std::string const what = name + (opt.clip_norm > 0 ? ", deferred" : ", overlapped") + ", step " +
                                 std::to_string(faulty) +
                                 (kind == fault::allocation ? ", arena" : kind == fault::copy ? ", copies" : ", activation copies");
        INFO(what);
        // Every request the step makes, and a few more (a retried step may make more).
        std::size_t const requests = made[std::size_t(faulty)];
        std::size_t threw = 0;
        for (std::size_t n = 1; n <= requests + 2; n += site_stride)
          threw += inject<T>(offload, opt, kind, faulty, n, clean, dir.path, model);
        MESSAGE(what << ": " << requests << " requests, " << threw << " failed steps");
        if (site_stride == 1 || requests == 0) CHECK((threw > 0) == (requests > 0));
      }
  }
}

template <class T = float>
std::size_t tight(auto const& offload) {
  return tide::test::scheduler_minimum<std::remove_cvref_t<decltype(offload)>, T>(config, offload, batch, seq) + 8_KiB;
}

}  // namespace

TEST_CASE("a failed allocation or copy anywhere in a step loses nothing: chunked<belady>") {
  off::chunked<off::belady> cfg{.chunk_bytes = chunk_bytes};
  cfg.device_budget = tight(cfg);
  check_faults(cfg, "chunked<belady>");
}

TEST_CASE("a failed allocation or copy anywhere in a step loses nothing: activations offloaded through the "
          "scheduler") {
  // Every block's saved activations leave and come back on the scheduler's activation copy
  // engine, beside its chunk copies: a failed activation copy fails the step as a failed chunk
  // copy does (both kinds are injected, each at every request of the step).
  tide::nn::gpt_spec<host> const lean{
      .config = config, .options = {.seed = 5, .offload_activations = tide::nn::block_set::range(-1, 1)}};
  off::chunked<off::belady> cfg{.chunk_bytes = chunk_bytes};
  cfg.device_budget = tide::test::scheduler_minimum(config, cfg, batch, seq, lean.options) + 8_KiB;
  check_faults(cfg, "chunked<belady>, activations offloaded", lean);
}

TEST_CASE("a failed allocation or copy anywhere in a step loses nothing: bf16 with gradient-slot reuse") {
  // The gradients hold the parameter slots when the failure comes: the step puts the parameters
  // back from the masters, and the checkpoint after it is the bytes of the one before.
  off::chunked<off::belady> cfg{.chunk_bytes = chunk_bytes / 2, .memory = {.reuse_grad_slots = true}};
  cfg.device_budget = tight<tide::bf16>(cfg);
  check_faults<decltype(cfg), tide::bf16>(cfg, "chunked<belady>, bf16, reuse_grad_slots");
  cfg.memory.keep_host_copies = false;  // every eviction of a parameter chunk is a copy
  check_faults<decltype(cfg), tide::bf16>(cfg, "chunked<belady>, bf16, reuse_grad_slots, no host copies");
  // static_partition pins the parameters again after each step's updates: a failure there comes
  // after the slots hold parameters again, and the step is still undone.
  off::static_partition part{.chunk_bytes = chunk_bytes / 2, .memory = {.reuse_grad_slots = true}};
  part.device_budget = tight<tide::bf16>(part);
  check_faults<decltype(part), tide::bf16>(part, "static_partition, bf16, reuse_grad_slots");
}

TEST_CASE("a failed allocation or copy anywhere in a step loses nothing: bf16 with masters, m and v on file") {
  // Half the chunks keep their optimizer state, fp32 masters included, in the NVMe tier: a step
  // that fails after some of them were written leaves the file's current slots as they were.
  tide::test::scratch_dir const folder{"faults_spill"};
  off::chunked<off::belady> cfg{.chunk_bytes = chunk_bytes / 2};
  cfg.device_budget = tight<tide::bf16>(cfg);
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  off::scheduler<host, tide::bf16, off::chunked<off::belady>> probe{ex, arena, spec<tide::bf16>.parameters(),
                                                                    spec<tide::bf16>.uses(), cfg};
  std::size_t const n = probe.layout().chunks(), chunk = probe.chunk_bytes();
  cfg.memory.host_budget = n * tide::round_up(chunk, 256) + (n / 2) * 3 * tide::round_up(2 * chunk, 256);
  cfg.memory.spill_folder = folder.path;
  check_faults<decltype(cfg), tide::bf16>(cfg, "chunked<belady>, bf16, masters on file");
  auto t = tide::train::make_trainer(spec<tide::bf16>, cfg, overlapped);
  (void)t.step(view_of<decltype(t)>(data_of(0)));
  CHECK(t.scheduler().last_step().nvme_read_bytes > 0);  // the tier is in use, and holds the last chunk's master
  CHECK(t.scheduler().list(tide::chunk::chunk_role::master)[std::uint32_t(n - 1)].payload() == nullptr);
}

TEST_CASE("a failed allocation or copy anywhere in a step loses nothing: parameters on file") {
  // A host budget of half the parameter chunks: every chunk's optimizer state and the other half's
  // parameters live in the NVMe tier. A fetch reads such a chunk from file; its host step reads
  // and writes it with its state. A failure anywhere leaves the file's current slots as they were,
  // and a device copy of what a failed step wrote goes.
  tide::test::scratch_dir const folder{"faults_spill_params"};
  off::chunked<off::belady> cfg{.chunk_bytes = chunk_bytes};
  cfg.device_budget = tight(cfg);
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  off::scheduler<host, float, off::chunked<off::belady>> probe{ex, arena, spec<>.parameters(), spec<>.uses(), cfg};
  std::size_t const n = probe.layout().chunks();
  cfg.memory.host_budget = (n / 2) * tide::round_up(probe.chunk_bytes(), 256) + 256;
  cfg.memory.spill_folder = folder.path;
  check_faults(cfg, "chunked<belady>, parameters on file");
  auto t = tide::train::make_trainer(spec<>, cfg, overlapped);
  (void)t.step(view_of<decltype(t)>(data_of(0)));
  auto const& last = t.scheduler().list(tide::chunk::chunk_role::param)[std::uint32_t(n - 1)];
  CHECK((last.payload() == nullptr || last.tier() == tide::chunk::tier::device));  // no host block: on file
  CHECK(t.scheduler().last_step().nvme_write_bytes > 2 * n * tide::round_up(probe.chunk_bytes(), 4096));
}

TEST_CASE("a failed allocation or copy anywhere in a step loses nothing: layer_window<2>, static_partition, "
          "resident") {
  off::layer_window<2> win;
  win.device_budget = tight(win);
  check_faults(win, "layer_window<2>");
  off::static_partition part{.chunk_bytes = chunk_bytes};
  part.device_budget = tight(part);
  check_faults(part, "static_partition");
  check_faults(off::resident{.chunk_bytes = chunk_bytes}, "resident");
}

// ---- a hook that throws ---------------------------------------------------------------------------

namespace {

using sched_t = off::scheduler<host, float, off::chunked<off::belady>>;

// The scheduler's hooks, throwing at one chosen hook call of the step, inside the block (after
// the scheduler's pre_* hook, before its post_* hook): a user's hook or a kernel that fails.
struct throwing_hooks {
  sched_t* scheduler = nullptr;
  int* countdown = nullptr;  // the hook call that throws: 1 = the first; 0 = none
  void tick() {
    if (*countdown > 0 && --*countdown == 0) TIDE_FAIL(usage, "a user hook failed");
  }
  void pre_forward(int b) {
    scheduler->pre_forward(b);
    tick();
  }
  void post_forward(int b) {
    tick();
    scheduler->post_forward(b);
  }
  void pre_backward(int b) {
    scheduler->pre_backward(b);
    tick();
  }
  void post_backward(int b) {
    tick();
    scheduler->post_backward(b);
  }
  float* param_data(std::uint32_t i) { return scheduler->param_data(i); }
  float* grad_data(std::uint32_t i) { return scheduler->grad_data(i); }
  void zero_grad() { scheduler->zero_grad(); }
};

std::vector<std::vector<std::byte>> state_of(sched_t& s, std::size_t params) {
  std::vector<std::vector<std::byte>> out;
  for (int list = -1; list < 2; ++list)  // the parameters, then the state lists 0 and 1
    for (std::uint32_t i = 0; i < params; ++i) {
      auto const b = list < 0 ? s.tensor_bytes(tide::chunk::chunk_role::param, i)
                              : s.state_bytes(static_cast<std::size_t>(list), i);
      out.emplace_back(b.begin(), b.end());
    }
  return out;
}

}  // namespace

TEST_CASE("a host capacity too small for the model data is a budget error at construction; for a step's extras, "
          "a budget error that loses nothing") {
  tide::test::scratch_dir dir{"capacity"};
  off::chunked<off::belady> cfg{.chunk_bytes = chunk_bytes};
  cfg.device_budget = tight(cfg);
  auto free = tide::train::make_trainer(spec<>, cfg, overlapped);
  std::size_t const kept = free.scheduler().host_pool_stats().bytes_held;  // the model data on the host
  (void)free.step(view_of<decltype(free)>(data_of(0)));
  std::size_t const peak = free.scheduler().host_pool_stats().peak_bytes_held;
  REQUIRE(peak > kept);  // a step takes more: undo copies, the gradients of the host steps

  cfg.memory.host_capacity = kept / 2;
  try {
    (void)tide::train::make_trainer(spec<>, cfg, overlapped);
    FAIL("a host capacity of half the model data did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
    CHECK(has_text(e.message(), "host_capacity"));
  }
  cfg.memory.host_capacity = kept + (peak - kept) / 2;
  auto short_of = tide::train::make_trainer(spec<>, cfg, overlapped);
  short_of.save(dir.path / "before");
  try {
    (void)short_of.step(view_of<decltype(short_of)>(data_of(0)));
    FAIL("a step past the host capacity did not throw");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
  }
  CHECK(short_of.steps() == 0);
  short_of.save(dir.path / "after");
  CHECK(file_text(dir.path / "after") == file_text(dir.path / "before"));
  cfg.memory.host_capacity = peak;  // what the step took: it trains, to the bits of no limit
  auto enough = tide::train::make_trainer(spec<>, cfg, overlapped);
  (void)enough.step(view_of<decltype(enough)>(data_of(0)));
  auto const want = params_of(free), got = params_of(enough);
  int differ = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    differ += std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)) != 0;
  CHECK(differ == 0);
}

TEST_CASE("a hook that throws in any block, forward or backward, loses nothing") {
  off::chunked<off::belady> const cfg{.chunk_bytes = chunk_bytes};
  std::size_t const budget = tight(cfg);
  int const hooks_per_step = 4 * (config.layers + 2);
  tide::thread_pool pool{2};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = budget}};
  sched_t sched{ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config), cfg,
                {}, tide::optim::adamw{.lr = 3e-3f}};
  int countdown = 0;
  tide::nn::gpt<host, float, throwing_hooks> model{config, arena, {.seed = 5}, {&sched, &countdown}};
  auto run = [&](int s) {
    auto const d = data_of(s);
    tide::tensor_view<std::int32_t const, host> x(d.data(), {batch, seq}), y(d.data() + batch * seq, {batch, seq});
    (void)model.forward(ex, x, y);
    model.backward(ex);
    sched.step();
  };
  run(0);
  run(1);
  std::size_t const params = model.parameters().size();
  for (int k = 1; k <= hooks_per_step; ++k) {
    INFO("the hook call " << k << " of the step throws");
    auto const before = state_of(sched, params);
    countdown = k;
    CHECK_THROWS_AS(run(2), tide::error);
    sched.abort_step();
    CHECK(state_of(sched, params) == before);
    CHECK(sched.optimizer_steps() == 2);
  }
  // An evaluation forward that fails inside a block is abandoned too; the next one works.
  {
    auto const d = data_of(9);
    tide::tensor_view<std::int32_t const, host> x(d.data(), {batch, seq}), y(d.data() + batch * seq, {batch, seq});
    sched.begin_evaluation();
    countdown = 3;
    CHECK_THROWS_AS((void)model.forward(ex, x, y), tide::error);
    sched.abort_step();
    countdown = 0;
    float const loss = model.forward(ex, x, y);
    CHECK(std::isfinite(loss));
    sched.end_evaluation();
  }
  countdown = 0;
  run(2);  // and it trains on: the bits of a scheduler that never saw a failure
  tide::memory::device_arena<host> arena2{{.budget = budget}};
  sched_t clean{ex, arena2, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config), cfg,
                {}, tide::optim::adamw{.lr = 3e-3f}};
  tide::nn::gpt<host, float, off::hooks<sched_t>> other{config, arena2, {.seed = 5}, {&clean}};
  for (int s = 0; s < 3; ++s) {
    auto const d = data_of(s);
    tide::tensor_view<std::int32_t const, host> x(d.data(), {batch, seq}), y(d.data() + batch * seq, {batch, seq});
    (void)other.forward(ex, x, y);
    other.backward(ex);
    clean.step();
  }
  CHECK(state_of(sched, params) == state_of(clean, params));
  CHECK(sched.last_step().bytes_moved() > 0);
}
