// make_trainer: offloading, loss scaling and the deferred optimizer change no bits; an overflow
// skips the step and leaves everything as it was; accumulation averages micro-batches.

#include <unistd.h>

#include <doctest/doctest.h>

#include <cfloat>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tide/comm/data_parallel.hpp"
#include "tide/comm/self.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/train/trainer.hpp"
#include "tide/optim/adam.hpp"
#include "tide/optim/sgd.hpp"
#include "support/files.hpp"
#include "support/gpt_steps.hpp"

namespace {

using namespace tide::literals;
using tide::host;
namespace off = tide::offload;

constexpr tide::nn::gpt_config config{.layers = 2, .heads = 2, .channels = 32, .vocab = 64, .max_seq = 16};
constexpr tide::index_t batch = 2, seq = 16;

// Tokens then targets of micro-batch s, (B, T) each.
std::vector<std::int32_t> data_of(int s, tide::index_t b_rows = batch) { return tide::test::token_runs(s, b_rows, seq, 64); }

template <class Trainer>
typename Trainer::batch_type view_of(std::vector<std::int32_t> const& d, tide::index_t b_rows = batch) {
  return {{d.data(), {b_rows, seq}}, {d.data() + b_rows * seq, {b_rows, seq}}};
}

template <class Trainer>
std::vector<std::vector<float>> params_of(Trainer& t) {
  std::vector<std::vector<float>> out;
  for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) out.push_back(t.scheduler().read_param(i));
  return out;
}

bool same(std::vector<std::vector<float>> const& a, std::vector<std::vector<float>> const& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

tide::nn::gpt_spec<host> const spec{.config = config, .options = {.seed = 3}};

// A device budget just above what the scheduler needs: the model data (about 0.5 MiB) does not
// fit, so chunks move every step.
template <class Offload, class T = float>
Offload tight(Offload off) {
  off.device_budget = tide::test::scheduler_minimum<Offload, T>(config, off, batch, seq) + 16_KiB;
  return off;
}
off::chunked<off::belady> const tight_belady = tight(off::chunked<off::belady>{.chunk_bytes = 20_KiB});
tide::optim::adamw const clipped{.lr = 3e-3f, .clip_norm = 0.5f, .schedule = {.warmup_steps = 3, .total_steps = 12}};

// A host budget for a bf16 model of n chunks of `chunk` bytes that keeps the bf16 chunks and the
// state of half the chunks: the other half's state goes to file, n - n / 2 chunks. The state is
// m, v and the fp32 master; with reuse_grad_slots the masters stay on the host, and only m and v
// go to file.
std::size_t half_state_spilled(std::size_t n, std::size_t chunk, bool reuse) {
  std::size_t const half = tide::round_up(chunk, 256), list = tide::round_up(2 * chunk, 256);  // bf16, fp32
  return reuse ? n * (half + list) + (n / 2) * 2 * list : n * half + (n / 2) * 3 * list;
}

template <class Offload>
std::vector<std::vector<float>> train(Offload const& off, tide::optim::adamw const& opt, int steps,
                                      std::vector<float>* losses = nullptr,
                                      tide::nn::gpt_spec<host> const& model = spec) {
  auto t = tide::train::make_trainer(model, off, opt);
  for (int s = 0; s < steps; ++s) {
    auto const d = data_of(s);
    auto const st = t.step(view_of<decltype(t)>(d));
    CHECK(!st.skipped);
    if (Offload::moves_data && s > 0) CHECK(st.bytes_moved > 0);  // it really offloads
    if (losses) losses->push_back(st.loss);
  }
  return params_of(t);
}

}  // namespace

TEST_CASE("warm-up then cosine") {
  tide::optim::warmup_cosine const s{.warmup_steps = 4, .total_steps = 14, .min_ratio = 0.1f};
  CHECK(s(1.f, 0) == doctest::Approx(0.25));
  CHECK(s(1.f, 3) == doctest::Approx(1.0));
  CHECK(s(1.f, 4) == doctest::Approx(1.0));
  CHECK(s(1.f, 9) == doctest::Approx(0.55));  // half way: (0.1 + 1) / 2
  CHECK(s(1.f, 14) == doctest::Approx(0.1));
  CHECK(s(1.f, 100) == doctest::Approx(0.1));
  CHECK(tide::optim::warmup_cosine{}(2.f, 7) == 2.f);
}

TEST_CASE("offloaded and resident trainers give the same bits, with clipping and a schedule") {
  std::vector<float> losses;
  auto const resident = train(off::resident{}, clipped, 12, &losses);
  CHECK(losses.back() < losses.front() - 0.2f);
  auto const chunked = train(tight_belady, clipped, 12);
  CHECK(same(chunked, resident));
}

TEST_CASE("recompute and activation offload under chunked<belady>: a smaller budget, the same bits") {
  using tide::nn::block_set;
  tide::nn::gpt_spec<host> const lean{
      .config = config,
      .options = {.seed = 3, .recompute = block_set::all(2), .offload_activations = block_set::range(-1, 1)}};
  off::chunked<off::belady> low{.chunk_bytes = 20_KiB};
  low.device_budget = tide::test::scheduler_minimum(config, low, batch, seq, lean.options) + 16_KiB;
  CHECK(low.device_budget < tight_belady.device_budget);  // the activations take less of it
  auto const resident = train(off::resident{}, clipped, 6);
  CHECK(same(train(low, clipped, 6, nullptr, lean), resident));
  // The plain model does not fit that budget: the trainer says so.
  CHECK_THROWS_AS(train(low, clipped, 1), tide::error);
}

TEST_CASE("offloaded activations go through the scheduler: its copy engine, host pool, host budget and timeline") {
  using tide::nn::block_set;
  tide::nn::gpt_spec<host> const lean{.config = config,
                                      .options = {.seed = 3, .offload_activations = block_set::range(-1, 1)}};
  off::chunked<off::belady> low{.chunk_bytes = 20_KiB};
  low.device_budget = tide::test::scheduler_minimum(config, low, batch, seq, lean.options) + 16_KiB;
  auto const resident = train(off::resident{}, clipped, 6);

  // The scheduler carries them: their bytes in its counters (apart from the model data's), their
  // host copies in its pool, their copies on its activation engine (a stream beside the chunk
  // copies), one span per block and direction on its activation copy lane.
  auto t = tide::train::make_trainer(lean, low, clipped);
  static_assert(decltype(t)::model_type::carried_by_hooks);
  off::trace_recorder trace;
  std::size_t activations_moved = 0, chunks_moved = 0;  // over the six steps, as the step counters say
  for (int s = 0; s < 6; ++s) {
    if (s == 5) t.scheduler().set_trace(&trace);
    (void)t.step(view_of<decltype(t)>(data_of(s)));
    auto const& last = t.scheduler().last_step();
    activations_moved += last.activation_d2h_bytes + last.activation_h2d_bytes;
    chunks_moved += last.h2d_bytes + last.d2h_bytes;
  }
  t.scheduler().set_trace(nullptr);
  CHECK(same(params_of(t), resident));
  auto const st = t.scheduler().last_step();
  std::size_t const host_bytes = t.model().activations().host_bytes;
  REQUIRE(host_bytes > 0);
  CHECK(t.scheduler().activation_host_bytes() == host_bytes);
  CHECK(st.activation_d2h_bytes > 0);
  CHECK(st.activation_d2h_bytes == st.activation_h2d_bytes);  // each saved tensor out once, back once
  CHECK(st.activation_d2h_bytes <= host_bytes);                // host_bytes rounds each one up
  std::size_t outs = 0, backs = 0, activation_bytes = 0, chunk_bytes = 0, misplaced = 0;
  for (auto const& e : trace.events()) {
    bool const activation = e.name.starts_with("activations ");
    if (e.where == off::lane::copy) misplaced += activation, chunk_bytes += e.bytes;
    if (e.where != off::lane::activation_copy) continue;
    misplaced += !activation;
    activation_bytes += e.bytes;
    outs += e.name.ends_with(" out");
    backs += e.name.ends_with(" back");
  }
  CHECK(outs == 3);  // the embedding and both layers
  CHECK(backs == 3);
  CHECK(misplaced == 0);  // chunks on the copy lane, activations on theirs
  CHECK(activation_bytes == st.activation_d2h_bytes + st.activation_h2d_bytes);
  CHECK(chunk_bytes == st.h2d_bytes + st.d2h_bytes);
  CHECK(st.h2d_bytes > 0);
  // Their engine moved exactly them, and the chunk engine none of them.
  auto const moved = t.scheduler().activation_transfers().stats();
  CHECK(moved.device_to_host_bytes == moved.host_to_device_bytes);
  CHECK(moved.device_to_host_bytes + moved.host_to_device_bytes == activations_moved);
  auto const chunk_engine = t.scheduler().transfers().stats();
  CHECK(chunk_engine.device_to_host_bytes + chunk_engine.host_to_device_bytes == chunks_moved);

  // Under a host budget they must fit beside the model data kept on the host. One that holds the
  // model data only refuses them at the first forward, saying what to set, and loses nothing.
  tide::test::scratch_dir const dir("spill_activations");
  std::size_t const n = t.scheduler().layout().chunks(), block = tide::round_up(t.scheduler().chunk_bytes(), 256);
  off::chunked<off::belady> bounded = low;
  bounded.memory.host_budget = n * block + n * 2 * block;  // parameters, m and v: nothing goes to file
  bounded.memory.spill_folder = dir.path;
  {
    auto u = tide::train::make_trainer(lean, bounded, clipped);
    auto const before = params_of(u);
    try {
      (void)u.step(view_of<decltype(u)>(data_of(0)));
      FAIL("activations beyond host_budget were accepted");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::budget);
      std::string const what = e.what();
      INFO(what);
      CHECK(what.find("offloaded activations") != std::string::npos);
      CHECK(what.find("host_reserve") != std::string::npos);
    }
    CHECK(u.steps() == 0);
    CHECK(same(params_of(u), before));
  }
  // host_reserve keeps room for them: the NVMe tier takes as many more chunks' state to file as
  // that needs, and the run is the same bits.
  bounded.memory.host_reserve = host_bytes;
  auto v = tide::train::make_trainer(lean, bounded, clipped);
  for (int s = 0; s < 6; ++s) (void)v.step(view_of<decltype(v)>(data_of(s)));
  CHECK(same(params_of(v), resident));
  std::size_t const spilled = (host_bytes + 2 * block - 1) / (2 * block);
  CHECK(v.scheduler().last_step().nvme_read_bytes == spilled * 2 * tide::round_up(v.scheduler().chunk_bytes(), 4096));
  CHECK(v.scheduler().activation_host_bytes() == host_bytes);
  // A reserve of the whole budget leaves nothing for the model data, and a reserve without a
  // budget reserves nothing: both refused at construction.
  bounded.memory.host_reserve = bounded.memory.host_budget;
  CHECK_THROWS_AS(tide::train::make_trainer(lean, bounded, clipped), tide::error);
  bounded.memory.host_budget = 0;
  CHECK_THROWS_AS(tide::train::make_trainer(lean, bounded, clipped), tide::error);
}

TEST_CASE("a wte larger than a chunk: cut in row pieces, it trains under chunked<belady> as resident does") {
  // V = 256: wte (256, 32) is 32 KiB, the largest tensor; mlp.fc.w (128, 32) 16 KiB. Chunks of
  // 20 KiB hold every tensor but wte.
  tide::nn::gpt_config const wide{.layers = 2, .heads = 2, .channels = 32, .vocab = 256, .max_seq = 16};
  std::size_t const chunk = 20_KiB;
  tide::nn::gpt_config cut = wide;
  cut.wte_pieces = tide::nn::wte_pieces_within(wide, chunk / sizeof(float));
  CHECK(cut.wte_pieces == 2);
  tide::nn::gpt_spec<host> const whole_spec{.config = wide, .options = {.seed = 3}};
  tide::nn::gpt_spec<host> const cut_spec{.config = cut, .options = {.seed = 3}};
  CHECK(whole_spec.parameters()[0].bytes > chunk);
  for (std::uint32_t j = 0; j < 2; ++j) CHECK(cut_spec.parameters()[j].bytes <= chunk);
  off::chunked<off::belady> low{.chunk_bytes = chunk};
  low.device_budget = tide::test::scheduler_minimum(cut, low, batch, seq) + 16_KiB;
  // The whole table does not fit a chunk: refused, naming wte and the way out.
  try {
    (void)train(low, clipped, 1, nullptr, whole_spec);
    FAIL("a tensor larger than the chunk was accepted");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(std::string(e.what()).find("\"wte\"") != std::string::npos);
    CHECK(std::string(e.what()).find("wte_pieces") != std::string::npos);
  }
  // In pieces: every piece its own chunk, moved like any other; the same bits as resident.
  std::vector<float> losses, whole_losses;
  auto const resident = train(off::resident{}, clipped, 6, nullptr, cut_spec);
  auto const chunked = train(low, clipped, 6, &losses, cut_spec);
  CHECK(same(chunked, resident));
  // The same model as with wte whole: the losses within the head's fp32 reassociation
  // (tests/nn/gpt.cpp bounds it per gradient).
  (void)train(off::resident{}, clipped, 6, &whole_losses, whole_spec);
  CHECK(losses[0] == doctest::Approx(whole_losses[0]).epsilon(1e-6));
  for (std::size_t i = 1; i < losses.size(); ++i) CHECK(losses[i] == doctest::Approx(whole_losses[i]).epsilon(1e-5));
  CHECK(losses.back() < losses.front());
  // Checkpoints hold the pieces by name: a resumed run equals the straight one; a checkpoint of
  // the whole-table model is refused by the model in pieces, which keeps its parameters.
  tide::test::scratch_dir dir{"wte_pieces"};
  {
    auto a = tide::train::make_trainer(cut_spec, low, clipped);
    for (int s = 0; s < 3; ++s) (void)a.step(view_of<decltype(a)>(data_of(s)));
    a.save(dir.path / "cut");
    auto w = tide::train::make_trainer(whole_spec, off::resident{}, clipped);
    w.save(dir.path / "whole");
  }
  auto b = tide::train::make_trainer(cut_spec, low, clipped);
  auto const before = params_of(b);
  CHECK_THROWS_AS(b.load(dir.path / "whole"), tide::error);
  CHECK(same(params_of(b), before));
  b.load(dir.path / "cut");
  for (int s = 3; s < 6; ++s) {
    float const loss = b.step(view_of<decltype(b)>(data_of(s))).loss;
    CHECK(std::memcmp(&loss, &losses[std::size_t(s)], sizeof(float)) == 0);
  }
  CHECK(same(params_of(b), chunked));
}

// ---- the NVMe tier: optimizer state in a file past the host budget ---------------------------

namespace {

// tight_belady with a host budget that holds the parameter chunks and the optimizer state of
// about half the chunks: the rest goes to a file under `folder`.
off::chunked<off::belady> spilling(std::filesystem::path const& folder, std::size_t* spilled_chunks = nullptr) {
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  off::scheduler<host, float, off::chunked<off::belady>> probe{ex, arena, spec.parameters(), spec.uses(), tight_belady};
  std::size_t const n = probe.layout().chunks(), block = tide::round_up(probe.chunk_bytes(), 256);
  off::chunked<off::belady> o = tight_belady;
  o.memory.host_budget = n * block + (n / 2) * 2 * block;  // parameters, and Adam's m and v of n / 2 chunks
  o.memory.spill_folder = folder;
  if (spilled_chunks != nullptr) *spilled_chunks = n - n / 2;
  return o;
}

// f() fails with tide::error(io) naming the spill file and `reason`.
template <class F>
void fails_on_file(F&& f, char const* reason) {
  try {
    f();
    FAIL("expected an I/O error");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::io);
    std::string const what = e.what();
    INFO(what);
    CHECK(what.find("tide-store-") != std::string::npos);  // names the file
    CHECK(what.find(reason) != std::string::npos);
  }
}
// Step s of t fails so.
template <class Trainer>
void step_fails_on_file(Trainer& t, int s, char const* reason) {
  fails_on_file([&] { (void)t.step(view_of<Trainer>(data_of(s))); }, reason);
}

// The spill files under `folder` (the state's, and the parameters' if any) cut to nothing behind
// tide's back (the next reads find their end), until put_back() writes their bytes again.
struct spill_file_cut {
  std::vector<std::filesystem::path> files;
  std::vector<std::string> bytes;
  explicit spill_file_cut(std::filesystem::path const& folder) {
    for (auto const& e : std::filesystem::directory_iterator(folder))
      if (e.is_regular_file() && e.path().filename().string().starts_with("tide-store-")) files.push_back(e.path());
    REQUIRE(!files.empty());
    for (auto const& file : files) {
      bytes.push_back(tide::test::file_text(file));
      REQUIRE(bytes.back().size() == std::filesystem::file_size(file));
      std::filesystem::resize_file(file, 0);
    }
  }
  void put_back() const {
    for (std::size_t k = 0; k < files.size(); ++k) {
      std::FILE* f = std::fopen(files[k].c_str(), "r+b");
      REQUIRE(f != nullptr);
      CHECK(std::fwrite(bytes[k].data(), 1, bytes[k].size(), f) == bytes[k].size());
      std::fclose(f);
    }
  }
};

}  // namespace

TEST_CASE("the NVMe tier: optimizer state past the host budget lives in a file, and training is bit-identical") {
  tide::test::scratch_dir const dir("spill");
  std::size_t spilled = 0;
  auto const o = spilling(dir.path, &spilled);
  REQUIRE(spilled >= 1);
  auto const resident = train(off::resident{}, clipped, 6);
  auto t = tide::train::make_trainer(spec, o, clipped);
  for (int s = 0; s < 6; ++s) {
    auto const st = t.step(view_of<decltype(t)>(data_of(s)));
    CHECK(!st.skipped);
  }
  CHECK(same(params_of(t), resident));
  // Each step reads and writes every spilled chunk's m and v once (file blocks: whole pages).
  auto const& last = t.scheduler().last_step();
  std::size_t const list = tide::round_up(t.scheduler().chunk_bytes(), 4096);
  CHECK(last.nvme_read_bytes == spilled * 2 * list);
  CHECK(last.nvme_write_bytes == spilled * 2 * list);
  // Clipping defers the updates to step(): backward started the reads of the first two spilled
  // chunks it completed, and the updates used them (read once each, above).
  CHECK(last.nvme_early_reads == std::min<std::size_t>(2, spilled));
  // The host holds less by the spilled state, less the two staging blocks (the same run
  // without a host budget keeps every chunk's m and v).
  auto u = tide::train::make_trainer(spec, tight_belady, clipped);
  for (int s = 0; s < 6; ++s) (void)u.step(view_of<decltype(u)>(data_of(s)));
  std::size_t const held = t.scheduler().host_pool_stats().bytes_held;
  std::size_t const unbounded = u.scheduler().host_pool_stats().bytes_held;
  INFO("host bytes held: ", held, " with the tier, ", unbounded, " without");
  CHECK(held + (spilled - 2) * 2 * list <= unbounded + 2 * list);
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator{}) == 1);

  // Checkpoints read the spilled state from the file: a resumed run equals the straight one.
  std::vector<float> whole;
  {
    auto a = tide::train::make_trainer(spec, o, clipped);
    for (int s = 0; s < 6; ++s) whole.push_back(a.step(view_of<decltype(a)>(data_of(s))).loss);
  }
  {
    auto a = tide::train::make_trainer(spec, o, clipped);
    for (int s = 0; s < 3; ++s) (void)a.step(view_of<decltype(a)>(data_of(s)));
    a.save(dir.path / "ckpt");
  }
  for (bool spill_on_resume : {true, false}) {
    auto b = tide::train::make_trainer(spec, spill_on_resume ? o : tight_belady, clipped);
    b.load(dir.path / "ckpt");
    for (int s = 3; s < 6; ++s) {
      float const loss = b.step(view_of<decltype(b)>(data_of(s))).loss;
      CHECK(std::memcmp(&loss, &whole[std::size_t(s)], sizeof(float)) == 0);
    }
  }
}

TEST_CASE("the NVMe tier: checkpoints take the state in the file one chunk at a time, and a failed save or load "
          "loses nothing") {
  tide::test::scratch_dir const dir("spill_checkpoint");
  std::size_t spilled = 0;
  auto const o = spilling(dir.path, &spilled);
  REQUIRE(spilled >= 3);  // holding every spilled chunk's state would exceed the bounds below
  std::vector<float> whole;
  {
    tide::test::scratch_dir const other("spill_checkpoint_straight");
    auto a = tide::train::make_trainer(spec, spilling(other.path), clipped);
    for (int s = 0; s < 6; ++s) whole.push_back(a.step(view_of<decltype(a)>(data_of(s))).loss);
  }
  auto const ckpt = dir.path / "ckpt";
  {
    auto t = tide::train::make_trainer(spec, o, clipped);
    for (int s = 0; s < 3; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
    std::size_t const lists = 2 * tide::round_up(t.scheduler().chunk_bytes(), 4096);  // Adam's m and v
    // A save reads each spilled chunk's m and v into one block that the next chunk reuses.
    // (Bytes in use: the pool's cache would hide a few chunks' worth in bytes held.)
    t.scheduler().reset_host_pool_peak();
    std::size_t const before = t.scheduler().host_pool_stats().bytes_requested;
    t.save(ckpt);
    INFO("spilled chunks: ", spilled, ", host bytes in use before the save: ", before, ", at its peak: ",
         t.scheduler().host_pool_stats().peak_bytes_requested);
    CHECK(t.scheduler().host_pool_stats().peak_bytes_requested <= before + lists);
    // The spill file cut behind tide's back: the save fails naming it, and the checkpoint saved
    // before stays (the loads below resume from it).
    spill_file_cut const cut(dir.path);
    fails_on_file([&] { t.save(ckpt); }, "end of file");
    cut.put_back();
    for (auto const& e : std::filesystem::directory_iterator(dir.path))
      CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);
    // The trainer's source answers its own deferred sections only: the caller's are refused.
    try {
      t.save(ckpt, [](tide::train::checkpoint_writer& w) { w.add_deferred("data.position", 8, 0); });
      FAIL("a deferred section of the caller's was taken");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::usage);
      CHECK(std::string(e.what()).find("add or add_value") != std::string::npos);
    }
  }
  // A load writes each chunk's state back to file before the next one comes in: at most the
  // chunk coming in (its lists and the block it is read into) beside the one going out.
  auto resumed = [&](auto& b) {
    for (int s = 3; s < 6; ++s) {
      float const loss = b.step(view_of<std::remove_cvref_t<decltype(b)>>(data_of(s))).loss;
      CHECK(std::memcmp(&loss, &whole[std::size_t(s)], sizeof(float)) == 0);
    }
  };
  {
    auto b = tide::train::make_trainer(spec, o, clipped);
    std::size_t const lists = 2 * tide::round_up(b.scheduler().chunk_bytes(), 4096);
    b.scheduler().reset_host_pool_peak();
    std::size_t const before = b.scheduler().host_pool_stats().bytes_requested;
    b.load(ckpt);
    INFO("host bytes in use before the load: ", before, ", at its peak: ",
         b.scheduler().host_pool_stats().peak_bytes_requested);
    CHECK(b.scheduler().host_pool_stats().peak_bytes_requested <= before + 2 * lists);
    resumed(b);
  }
  // A load whose write of a chunk's state to file fails is a clear error; loaded again, it takes.
  auto b = tide::train::make_trainer(spec, o, clipped);
  {
    tide::test::file_size_capped const cap(4096);
    REQUIRE(cap.capped);
    fails_on_file([&] { b.load(ckpt); }, "File too large");
  }
  b.load(ckpt);
  resumed(b);
}

TEST_CASE("the NVMe tier: a write that fails is a clear error, loses nothing, and the next steps go on") {
  tide::test::scratch_dir const dir("spill_fail");
  auto const o = spilling(dir.path);
  std::vector<std::vector<float>> straight;
  {
    auto a = tide::train::make_trainer(spec, o, clipped);
    for (int s = 0; s < 5; ++s) (void)a.step(view_of<decltype(a)>(data_of(s)));
    straight = params_of(a);
  }
  auto t = tide::train::make_trainer(spec, o, clipped);
  for (int s = 0; s < 2; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
  auto const before = params_of(t);
  {
    tide::test::file_size_capped const cap(4096);  // every write of a step lies past it
    REQUIRE(cap.capped);
    step_fails_on_file(t, 2, "File too large");
  }
  CHECK(same(params_of(t), before));
  CHECK(t.steps() == 2);
  // The state on file is the state before the failed step: the run goes on as if it never was.
  for (int s = 2; s < 5; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
  CHECK(same(params_of(t), straight));
}

TEST_CASE("the NVMe tier: a read that fails is a clear error, loses nothing, and the state put back goes on") {
  // The spill file is cut to nothing behind tide's back: the next step's reads (the first two
  // started by backward, the rest as each chunk's update is queued) find the end of the file. Put the file back, and the run goes on
  // as if the failed step never was.
  tide::test::scratch_dir const dir("spill_read_fail");
  auto const o = spilling(dir.path);
  std::vector<std::vector<float>> straight;
  {
    tide::test::scratch_dir const other("spill_read_straight");
    auto a = tide::train::make_trainer(spec, spilling(other.path), clipped);
    for (int s = 0; s < 5; ++s) (void)a.step(view_of<decltype(a)>(data_of(s)));
    straight = params_of(a);
  }
  auto t = tide::train::make_trainer(spec, o, clipped);
  for (int s = 0; s < 2; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
  auto const before = params_of(t);
  spill_file_cut const cut(dir.path);
  step_fails_on_file(t, 2, "end of file");
  CHECK(same(params_of(t), before));
  CHECK(t.steps() == 2);
  cut.put_back();
  for (int s = 2; s < 5; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
  CHECK(same(params_of(t), straight));
}

TEST_CASE("the NVMe tier: host budgets that cannot work are refused, saying what to set") {
  tide::test::scratch_dir const dir("spill_refused");
  auto o = spilling(dir.path);
  auto const refusal = [](auto const& off) {
    try {
      auto t = tide::train::make_trainer(spec, off, clipped);
      return std::pair{tide::errc::internal, std::string()};
    } catch (tide::error const& e) {
      return std::pair{e.category(), std::string(e.what())};
    }
  };
  // Below the parameters and masters, which reuse_grad_slots keeps on the host: refused. (Without
  // it a budget this small puts the parameters on file too: see the test below.)
  tide::nn::gpt_spec<host, tide::bf16> const spec16{.config = config, .options = {.seed = 3}};
  auto small = o;
  small.memory.host_budget = 1024;
  small.memory.reuse_grad_slots = true;
  try {
    auto t = tide::train::make_trainer(spec16, small, clipped);
    FAIL("a host budget below the parameters that stay on the host was taken");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::budget);
    CHECK(std::string(e.what()).find("raise host_budget") != std::string::npos);
    CHECK(std::string(e.what()).find("reuse_grad_slots") != std::string::npos);
  }
  auto no_folder = o;
  no_folder.memory.spill_folder.clear();
  auto const [c2, m2] = refusal(no_folder);
  CHECK(c2 == tide::errc::usage);
  CHECK(m2.find("spill_folder") != std::string::npos);
  auto missing = o;
  missing.memory.spill_folder = dir.path / "not_there";
  CHECK(refusal(missing).first == tide::errc::io);
  // The NVMe tier is chunked's: another policy given its knobs is refused, naming them.
  auto const tier_refused = [&](auto policy) {
    policy.memory.host_budget = o.memory.host_budget;
    policy.memory.spill_folder = dir.path;
    CHECK_THROWS_WITH_AS(tide::train::make_trainer(spec, policy, clipped),
                         doctest::Contains("has no NVMe tier; memory.host_budget"), tide::error);
  };
  tier_refused(off::layer_window<2>{.device_budget = 64_MiB});
  tier_refused(off::static_partition{.device_budget = 64_MiB});
  tier_refused(off::resident{});
}

TEST_CASE("loss scaling by a power of two changes no bits") {
  auto const plain = train(off::resident{}, clipped, 8);
  auto scaled_opt = clipped;
  scaled_opt.scaling = {.enabled = true, .initial = 1024.f, .growth_interval = 3};
  auto const scaled = train(tight(off::chunked<off::lru>{.chunk_bytes = 20_KiB}), scaled_opt, 8);
  CHECK(same(scaled, plain));
}

TEST_CASE("an overflowing loss scale skips the step, halves the scale and changes nothing") {
  auto opt = clipped;
  opt.scaling = {.enabled = true, .initial = FLT_MAX, .growth_interval = 1000};
  auto t = tide::train::make_trainer(spec, tight_belady, opt);
  // Large embeddings make d(lnf) = dlogits wte overflow at this scale (before the first step the
  // chunks are on the host, where the scheduler hands out their addresses for initialisation).
  float* wte = t.scheduler().param_data(0);
  for (tide::index_t i = 0; i < t.model().parameters()[0].numel(); ++i) wte[i] *= 1000.f;
  auto const before = params_of(t);
  auto const d = data_of(0);
  auto const st = t.step(view_of<decltype(t)>(d));
  REQUIRE(st.skipped);
  CHECK(st.loss_scale == FLT_MAX);
  CHECK(t.scaler().scale() == FLT_MAX / 2);
  CHECK(same(params_of(t), before));
  CHECK(t.scheduler().optimizer_steps() == 0);
  // Halving until the gradients fit: then steps go through, and AdamW's first step is step 1.
  int skipped = 1;
  for (int s = 1; s < 200 && t.step(view_of<decltype(t)>(data_of(s))).skipped; ++s) ++skipped;
  CHECK(skipped < 200);
  CHECK(t.scaler().skipped() == skipped);
  CHECK(t.scheduler().optimizer_steps() == 1);
  CHECK(!same(params_of(t), before));
}

TEST_CASE("gradient accumulation averages the micro-batches") {
  // Two micro-batches of B rows == one batch of 2B rows, up to summation order.
  auto opt = clipped;
  opt.micro_steps = 2;
  auto acc = tide::train::make_trainer(spec, off::resident{}, opt);
  auto whole = tide::train::make_trainer(spec, off::resident{}, clipped);
  for (int s = 0; s < 4; ++s) {
    auto const a = data_of(2 * s), b = data_of(2 * s + 1);
    std::vector<std::int32_t> ab(a.size() * 2);
    auto const n = static_cast<std::ptrdiff_t>(a.size() / 2);
    std::copy(a.begin(), a.begin() + n, ab.begin());  // tokens of a, then of b, then targets
    std::copy(b.begin(), b.begin() + n, ab.begin() + n);
    std::copy(a.begin() + n, a.end(), ab.begin() + 2 * n);
    std::copy(b.begin() + n, b.end(), ab.begin() + 3 * n);
    using B = decltype(acc)::batch_type;
    B const micro[2] = {view_of<decltype(acc)>(a), view_of<decltype(acc)>(b)};
    auto const sa = acc.step(micro);
    auto const sw = whole.step(view_of<decltype(whole)>(ab, 2 * batch));
    CHECK(sa.loss == doctest::Approx(sw.loss).epsilon(1e-5));
    CHECK(sa.grad_norm == doctest::Approx(sw.grad_norm).epsilon(1e-4));
    CHECK(sa.tokens == sw.tokens);
  }
  auto const pa = params_of(acc), pw = params_of(whole);
  double worst = 0;
  for (std::size_t i = 0; i < pa.size(); ++i)
    for (std::size_t j = 0; j < pa[i].size(); ++j) worst = std::max(worst, std::abs(double(pa[i][j]) - pw[i][j]));
  // Summation order moves a gradient element by a few ulps, and Adam divides it by sqrt(v): an
  // element whose gradient is near zero moves by a different fraction of lr. The four steps' lr
  // sum to 9e-3; 5e-5 is half a percent of that (measured: 1.03e-5 at -O1, under 1e-5 at -O3).
  CHECK(worst < 5e-5);
  CHECK_THROWS_AS(acc.step(view_of<decltype(acc)>(data_of(0))), tide::error);  // 1 micro-batch for 2 micro-steps
}

// The policies' concepts (checked when this file compiles).
static_assert(tide::train::OffloadPolicy<off::chunked<off::belady>>);
static_assert(!tide::train::OffloadPolicy<tide::optim::adamw>);
static_assert(tide::train::OptimizerPolicy<tide::optim::adamw>);
static_assert(!tide::train::OptimizerPolicy<off::resident>);
static_assert(tide::train::ModelSpec<tide::nn::gpt_spec<host>>);

TEST_CASE("a resumed run gives the losses of an uninterrupted one, under any scheduler") {
  auto const dir = std::filesystem::temp_directory_path() / ("tide_trainer_ckpt_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto const& tight = tight_belady;
  std::vector<float> whole;
  {
    auto t = tide::train::make_trainer(spec, tight, clipped);
    for (int s = 0; s < 6; ++s) whole.push_back(t.step(view_of<decltype(t)>(data_of(s))).loss);
  }
  {
    auto t = tide::train::make_trainer(spec, tight, clipped);
    for (int s = 0; s < 3; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
    std::int64_t const position = 3;  // the caller's data position rides along
    t.save(dir / "ckpt", [&](tide::train::checkpoint_writer& w) { w.add_value("data.position", position); });
  }
  auto resume = [&](auto const& offload) {
    auto t = tide::train::make_trainer(spec, offload, clipped);
    std::int64_t position = 0;
    t.load(dir / "ckpt", [&](tide::train::checkpoint_reader const& r) { position = r.read_value<std::int64_t>("data.position"); });
    CHECK(position == 3);
    CHECK(t.steps() == 3);
    std::vector<float> rest;
    for (int s = 3; s < 6; ++s) rest.push_back(t.step(view_of<decltype(t)>(data_of(s))).loss);
    return rest;
  };
  for (auto const& rest : {resume(tight), resume(off::resident{})}) {
    REQUIRE(rest.size() == 3);
    for (int i = 0; i < 3; ++i) CHECK(std::memcmp(&rest[std::size_t(i)], &whole[std::size_t(3 + i)], sizeof(float)) == 0);
  }

  // A flipped byte: tide::error, and the trainer is untouched.
  auto t = tide::train::make_trainer(spec, tight, clipped);
  auto const before = params_of(t);
  auto const bytes = std::filesystem::file_size(dir / "ckpt");
  std::filesystem::copy_file(dir / "ckpt", dir / "bad", std::filesystem::copy_options::overwrite_existing);
  {
    std::FILE* f = std::fopen((dir / "bad").c_str(), "r+b");
    REQUIRE(f != nullptr);
    std::fseek(f, static_cast<long>(bytes / 2), SEEK_SET);
    int const c = std::fgetc(f);
    std::fseek(f, static_cast<long>(bytes / 2), SEEK_SET);
    std::fputc(c ^ 0x10, f);
    std::fclose(f);
  }
  CHECK_THROWS_AS(t.load(dir / "bad"), tide::error);
  CHECK(same(params_of(t), before));
  CHECK(t.steps() == 0);
  // Another model shape: a usage error naming the section.
  auto other = tide::train::make_trainer(tide::nn::gpt_spec<host>{.config = {.layers = 1, .heads = 2, .channels = 32,
                                                                             .vocab = 64, .max_seq = 16}},
                                         off::resident{}, clipped);
  try {
    other.load(dir / "ckpt");
    FAIL("a checkpoint of another model loaded");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(std::string(e.what()).find("model.shape") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

// Resumes after 3 of 6 steps with optimizer O: its state lists ("momentum/" for SGD, "m/" and "v/"
// for Adam) go through the checkpoint, so the rest of the run matches bit for bit.
template <class O>
void check_resume(O const& opt, char const* tag) {
  tide::test::scratch_dir const dir(tag);
  std::vector<std::vector<float>> whole;
  {
    auto t = tide::train::make_trainer(spec, tight_belady, opt);
    for (int s = 0; s < 6; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
    whole = params_of(t);
  }
  {
    auto t = tide::train::make_trainer(spec, tight_belady, opt);
    for (int s = 0; s < 3; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
    t.save(dir.path / "ckpt");
  }
  auto resumed = [&](bool zero_state) {
    auto t = tide::train::make_trainer(spec, tight_belady, opt);
    t.load(dir.path / "ckpt");
    if (zero_state)  // what a checkpoint without the optimizer's state would resume to
      for (std::uint32_t c = 0; c < t.scheduler().layout().chunks(); ++c)
        for (std::size_t k = 0; k < O::state_lists; ++k) {
          auto const& list = t.scheduler().state_list(k);
          REQUIRE(list[c].payload() != nullptr);
          std::memset(list[c].payload(), 0, list[c].capacity());
        }
    for (int s = 3; s < 6; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
    return params_of(t);
  };
  CHECK_MESSAGE(same(resumed(false), whole), O::name);
  CHECK_MESSAGE(!same(resumed(true), whole), O::name, ": the state matters, so the test could fail");
}

TEST_CASE("SGD's momentum and Adam's moments are checkpointed: a resumed run equals a straight one") {
  check_resume(tide::optim::sgd{.lr = 0.05f, .momentum = 0.9f, .nesterov = true}, "trainer_sgd");
  check_resume(tide::optim::adam{.lr = 3e-3f, .weight_decay = 0.01f}, "trainer_adam");
  // An SGD checkpoint has no "m/" or "v/" sections: an Adam trainer refuses it and loads nothing.
  tide::test::scratch_dir const dir("trainer_sgd_to_adam");
  {
    auto t = tide::train::make_trainer(spec, tight_belady, tide::optim::sgd{.lr = 0.05f, .momentum = 0.9f});
    (void)t.step(view_of<decltype(t)>(data_of(0)));
    t.save(dir.path / "ckpt");
  }
  auto t = tide::train::make_trainer(spec, tight_belady, tide::optim::adam{});
  auto const before = params_of(t);
  CHECK_THROWS_AS(t.load(dir.path / "ckpt"), tide::error);
  CHECK(same(params_of(t), before));
  CHECK(t.steps() == 0);
}

TEST_CASE("bf16 parameters with fp32 masters: offloaded equals resident, bit for bit") {
  tide::nn::gpt_spec<host, tide::bf16> const spec16{.config = config, .options = {.seed = 3}};
  auto run = [&](auto const& offload) {
    auto t = tide::train::make_trainer(spec16, offload, clipped);
    std::vector<float> losses;
    for (int s = 0; s < 8; ++s) losses.push_back(t.step(view_of<decltype(t)>(data_of(s))).loss);
    std::vector<std::vector<tide::bf16>> params;
    for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) params.push_back(t.scheduler().read_param(i));
    return std::pair{losses, params};
  };
  auto const [lr, pr] = run(off::resident{});
  auto const chunked = tight<off::chunked<off::belady>, tide::bf16>({.chunk_bytes = 10_KiB});
  auto const [lc, pc] = run(chunked);
  CHECK(lr.back() < lr.front() - 0.2f);  // it learns in bf16
  CHECK(std::memcmp(lr.data(), lc.data(), lr.size() * sizeof(float)) == 0);
  REQUIRE(pr.size() == pc.size());
  for (std::size_t i = 0; i < pr.size(); ++i)
    CHECK(std::memcmp(pr[i].data(), pc[i].data(), pr[i].size() * sizeof(tide::bf16)) == 0);
  // The NVMe tier with fp32 masters: the masters, m and v of about half the chunks go to file.
  // The same bits again.
  tide::test::scratch_dir const dir("spill_bf16");
  auto spilled = chunked;
  {
    tide::thread_pool pool{1};
    tide::exec<host> ex{pool};
    tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
    off::scheduler<host, tide::bf16, off::chunked<off::belady>> probe{ex, arena, spec16.parameters(), spec16.uses(),
                                                                      chunked};
    spilled.memory.host_budget = half_state_spilled(probe.layout().chunks(), probe.chunk_bytes(), false);
    spilled.memory.spill_folder = dir.path;
  }
  auto t = tide::train::make_trainer(spec16, spilled, clipped);
  std::vector<float> ls;
  for (int s = 0; s < 8; ++s) ls.push_back(t.step(view_of<decltype(t)>(data_of(s))).loss);
  CHECK(t.scheduler().last_step().nvme_read_bytes > 0);
  CHECK(std::memcmp(lr.data(), ls.data(), lr.size() * sizeof(float)) == 0);
  for (std::uint32_t i = 0; i < pr.size(); ++i) {
    auto const p = t.scheduler().read_param(i);
    CHECK(std::memcmp(pr[i].data(), p.data(), pr[i].size() * sizeof(tide::bf16)) == 0);
  }
}

// ---- gradient-slot reuse ---------------------------------------------------------------------

namespace {

// Six layers in 10 KiB bf16 chunks: about 20 chunks, so that the chunks one moment works on are
// a small part of the model.
constexpr tide::nn::gpt_config deeper{.layers = 6, .heads = 2, .channels = 32, .vocab = 64, .max_seq = 16};

// A bf16 run of `steps` steps: its losses, its parameters and each step's peak model bytes; the
// last step's NVMe traffic and the host bytes held at the end.
struct bf16_run {
  std::vector<float> losses;
  std::vector<std::vector<tide::bf16>> params;
  std::vector<std::size_t> peaks;
  std::size_t nvme_read = 0, nvme_written = 0, host_held = 0;
};
template <class Offload>
bf16_run run_bf16(Offload const& offload, tide::optim::adamw const& opt, int steps,
                  tide::nn::gpt_config const& shape = config) {
  tide::nn::gpt_spec<host, tide::bf16> const spec16{.config = shape, .options = {.seed = 3}};
  auto t = tide::train::make_trainer(spec16, offload, opt);
  bf16_run r;
  for (int s = 0; s < steps; ++s) {
    r.losses.push_back(t.step(view_of<decltype(t)>(data_of(s))).loss);
    r.peaks.push_back(t.scheduler().last_step().peak_model_bytes);
  }
  r.nvme_read = t.scheduler().last_step().nvme_read_bytes;
  r.nvme_written = t.scheduler().last_step().nvme_write_bytes;
  if constexpr (Offload::moves_data) r.host_held = t.scheduler().host_pool_stats().bytes_held;
  for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) r.params.push_back(t.scheduler().read_param(i));
  return r;
}
// A run of `model` under `with` saved after `at` steps to `ckpt`, then resumed under `with` (files
// in a folder of their own) and under `without`: both give `losses`' bits for steps `at` to 5.
template <class T, class Offload>
void resumes_exactly(tide::nn::gpt_spec<host, T> const& model, Offload const& with, Offload const& without,
                     std::filesystem::path const& ckpt, std::vector<float> const& losses, int at = 3) {
  {
    auto a = tide::train::make_trainer(model, with, clipped);
    for (int s = 0; s < at; ++s) (void)a.step(view_of<decltype(a)>(data_of(s)));
    a.save(ckpt);
  }
  for (bool on_resume : {true, false}) {
    INFO("resumed with the tier: " << on_resume);
    tide::test::scratch_dir const other("resume_elsewhere");
    auto into = with;
    into.memory.spill_folder = other.path;
    auto b = tide::train::make_trainer(model, on_resume ? into : without, clipped);
    b.load(ckpt);
    for (int s = at; s < 6; ++s) {
      float const loss = b.step(view_of<decltype(b)>(data_of(s))).loss;
      CHECK(std::memcmp(&loss, &losses[std::size_t(s)], sizeof(float)) == 0);
    }
  }
}

bool same_bits(bf16_run const& a, bf16_run const& b) {
  if (a.losses.size() != b.losses.size() || a.params.size() != b.params.size()) return false;
  if (std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float)) != 0) return false;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    if (std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * sizeof(tide::bf16)) != 0) return false;
  return true;
}

}  // namespace

TEST_CASE("gradient-slot reuse: bf16 gradients take their parameters' slots, the same bits, less memory") {
  tide::nn::gpt_spec<host, tide::bf16> const spec16{.config = deeper, .options = {.seed = 3}};
  off::chunked<off::belady> plain{.chunk_bytes = 10_KiB};
  plain.device_budget = tide::test::scheduler_minimum<decltype(plain), tide::bf16>(deeper, plain, batch, seq) + 16_KiB;
  auto reuse = plain;
  reuse.memory.reuse_grad_slots = true;
  auto lean = reuse;  // and no host copies of device-resident parameter chunks
  lean.memory.keep_host_copies = false;
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  off::scheduler<host, tide::bf16, off::chunked<off::belady>> probe{ex, arena, spec16.parameters(), spec16.uses(), plain};
  std::size_t const n = probe.layout().chunks(), chunk = probe.chunk_bytes();
  tide::optim::adamw const overlapped{.lr = 3e-3f};  // each chunk steps beside backward
  for (auto const& opt : {clipped, overlapped}) {
    bool const deferred = opt.clip_norm > 0;
    INFO(std::string(deferred ? "clipped: every gradient lives until step()" : "overlapped: chunks step as they complete"));
    auto const a = run_bf16(plain, opt, 6, deeper);
    auto const b = run_bf16(reuse, opt, 6, deeper);
    auto const c = run_bf16(lean, opt, 6, deeper);
    CHECK(a.losses.back() != a.losses.front());  // it trains
    CHECK(same_bits(a, b));
    CHECK(same_bits(a, c));
    MESSAGE(std::string(deferred ? "clipped" : "overlapped") << ": peak model bytes " << a.peaks.back() << " plain, "
            << b.peaks.back() << " with reuse, " << c.peaks.back() << " also without host copies; " << n
            << " chunks of " << chunk << " B");
    // Clipped, every chunk's gradients are alive at the end of backward: with reuse they sit in
    // the parameter slots, so the peak is lower by most of one bf16 copy of the model.
    if (deferred) CHECK(a.peaks.back() >= b.peaks.back() + n / 2 * chunk);
    else CHECK(b.peaks.back() <= a.peaks.back());
    CHECK(c.peaks.back() <= b.peaks.back());
  }
  // With the NVMe tier as well: m and v of half the chunks in a file, gradients in the slots.
  // The masters stay on the host (a skipped step rounds the parameters back from them).
  tide::test::scratch_dir const dir("reuse_spill");
  auto spilled = reuse;
  spilled.memory.host_budget = half_state_spilled(n, chunk, true);
  spilled.memory.spill_folder = dir.path;
  auto const with_file = run_bf16(spilled, clipped, 4, deeper);
  CHECK(same_bits(run_bf16(plain, clipped, 4, deeper), with_file));
  std::size_t const block = tide::round_up(tide::round_up(2 * chunk, 256), 4096);  // an fp32 list's file block
  CHECK(with_file.nvme_read == (n - n / 2) * 2 * block);
  // Saved after 2 steps (the masters from the host, m and v from the file) and resumed with the
  // tier: the straight run's bits.
  {
    auto a = tide::train::make_trainer(spec16, spilled, clipped);
    for (int s = 0; s < 2; ++s) (void)a.step(view_of<decltype(a)>(data_of(s)));
    a.save(dir.path / "ckpt");
  }
  tide::test::scratch_dir const other("reuse_spill_resume");
  auto into = spilled;
  into.memory.spill_folder = other.path;
  auto b = tide::train::make_trainer(spec16, into, clipped);
  b.load(dir.path / "ckpt");
  for (int s = 2; s < 4; ++s) {
    float const loss = b.step(view_of<decltype(b)>(data_of(s))).loss;
    CHECK(std::memcmp(&loss, &with_file.losses[std::size_t(s)], sizeof(float)) == 0);
  }
}

TEST_CASE("make_trainer passes host_steps_in_flight: -1 is refused, naming it; rings of one and none train the "
          "same bits") {
  off::chunked<off::belady> four{.chunk_bytes = 10_KiB};  // the default ring of 4
  four.device_budget = tide::test::scheduler_minimum<decltype(four), tide::bf16>(deeper, four, batch, seq) + 16_KiB;
  tide::optim::adamw const overlapped{.lr = 3e-3f};  // host steps queue beside backward, through the ring
  auto const a = run_bf16(four, overlapped, 4, deeper);
  CHECK(a.losses.back() != a.losses.front());
  for (int q : {1, 0}) {
    INFO("host_steps_in_flight = " << q);
    auto other = four;
    other.memory.host_steps_in_flight = q;
    CHECK(same_bits(a, run_bf16(other, overlapped, 4, deeper)));
  }
  auto bad = four;
  bad.memory.host_steps_in_flight = -1;
  CHECK_THROWS_WITH_AS(run_bf16(bad, overlapped, 1, deeper), doctest::Contains("host_steps_in_flight = -1"),
                       tide::error);
}

TEST_CASE("the NVMe tier with bf16 parameters: the fp32 masters go to file with m and v; the same bits, resumable, "
          "and a failed write or read loses nothing") {
  tide::nn::gpt_spec<host, tide::bf16> const spec16{.config = deeper, .options = {.seed = 3}};
  off::chunked<off::belady> plain{.chunk_bytes = 10_KiB};
  plain.device_budget = tide::test::scheduler_minimum<decltype(plain), tide::bf16>(deeper, plain, batch, seq) + 16_KiB;
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  off::scheduler<host, tide::bf16, off::chunked<off::belady>> probe{ex, arena, spec16.parameters(), spec16.uses(), plain};
  std::size_t const n = probe.layout().chunks(), chunk = probe.chunk_bytes();
  std::size_t const list = tide::round_up(2 * chunk, 256), block = tide::round_up(list, 4096), k = n - n / 2;
  tide::test::scratch_dir const dir("spill_masters");
  auto spilled = plain;
  spilled.memory.host_budget = half_state_spilled(n, chunk, false);
  spilled.memory.spill_folder = dir.path;

  // Bit-identical to resident; each step reads and writes three lists of each spilled chunk; the
  // host keeps less by the spilled chunks' masters, m and v, less the two staging blocks. (That
  // masters are what went to file is checked below, on the chunks' payloads: were the masters
  // kept on the host, this budget could spill as many lists of m and v alone.)
  auto const resident = run_bf16(off::resident{}, clipped, 6, deeper);
  auto const unbounded = run_bf16(plain, clipped, 6, deeper);
  auto const with_file = run_bf16(spilled, clipped, 6, deeper);
  CHECK(resident.losses.back() < resident.losses.front());
  CHECK(same_bits(resident, with_file));
  CHECK(with_file.nvme_read == k * 3 * block);
  CHECK(with_file.nvme_written == k * 3 * block);
  INFO("host bytes held: " << with_file.host_held << " with the tier, " << unbounded.host_held << " without; " << k
                           << " of " << n << " chunks spilled");
  CHECK(with_file.host_held + (k - 2) * 3 * list <= unbounded.host_held + 3 * list);

  // A checkpoint reads the masters from the file, a load writes them back: resumed, with the tier
  // or without, a run is the same bits as the straight one.
  resumes_exactly(spec16, spilled, plain, dir.path / "ckpt", resident.losses);
  // Every chunk's state in the file, saved before the first step: the save reads chunk 0's m and
  // v first, and only then do the masters go to file (as the parameters); what it writes for the
  // masters is those, and the resumed run is the straight one.
  {
    tide::test::scratch_dir const all_dir("spill_masters_all");
    auto all = spilled;
    all.memory.host_budget = n * tide::round_up(chunk, 256) + 256;  // the bf16 chunks, and nothing more
    all.memory.spill_folder = all_dir.path;
    {
      auto a = tide::train::make_trainer(spec16, all, clipped);
      REQUIRE(a.scheduler().state_list(0)[0].payload() == nullptr);  // chunk 0 on file
      a.save(all_dir.path / "ckpt");
    }
    auto b = tide::train::make_trainer(spec16, all, clipped);
    b.load(all_dir.path / "ckpt");
    for (int s = 0; s < 6; ++s) {
      float const loss = b.step(view_of<decltype(b)>(data_of(s))).loss;
      CHECK(std::memcmp(&loss, &resident.losses[std::size_t(s)], sizeof(float)) == 0);
    }
  }

  // A write that fails (the file may not grow) fails the step with tide::error(io) and changes
  // no parameter; the masters on file are those before it, so the run goes on to the same bits.
  auto t = tide::train::make_trainer(spec16, spilled, clipped);
  // Built, the host never held the spilled state: the parameter chunks (whole pages), the state
  // of the chunks that stay, and the two staging blocks of a spilled chunk's lists (the updates'
  // two, which also wrote the zeros at construction), one list of slack.
  CHECK(t.scheduler().host_pool_stats().peak_bytes_held <=
        n * tide::round_up(chunk, 4096) + (n - k) * 3 * list + 2 * 3 * block + block);
  auto params = [&] {
    std::vector<std::vector<tide::bf16>> out;
    for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) out.push_back(t.scheduler().read_param(i));
    return out;
  };
  for (int s = 0; s < 2; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
  // The last k chunks keep no master, m or v on the host between steps.
  for (std::uint32_t c = 0; c < n; ++c) {
    INFO("chunk " << c);
    bool const on_file = c >= n - k;
    CHECK((t.scheduler().list(tide::chunk::chunk_role::master)[c].payload() == nullptr) == on_file);
    CHECK((t.scheduler().state_list(0)[c].payload() == nullptr) == on_file);
    CHECK((t.scheduler().state_list(1)[c].payload() == nullptr) == on_file);
  }
  auto const before = params();
  {
    tide::test::file_size_capped const cap(4096);  // every write of a step lies past it
    REQUIRE(cap.capped);
    step_fails_on_file(t, 2, "File too large");
  }
  CHECK(t.steps() == 2);
  auto const after = params();
  for (std::size_t i = 0; i < before.size(); ++i)
    CHECK(std::memcmp(before[i].data(), after[i].data(), before[i].size() * sizeof(tide::bf16)) == 0);
  // A read that fails (the file cut to nothing behind tide's back) does the same; with the file
  // put back, the run goes on.
  spill_file_cut const cut(dir.path);
  step_fails_on_file(t, 2, "end of file");
  CHECK(t.steps() == 2);
  auto const unread = params();
  for (std::size_t i = 0; i < before.size(); ++i)
    CHECK(std::memcmp(before[i].data(), unread[i].data(), before[i].size() * sizeof(tide::bf16)) == 0);
  cut.put_back();
  std::vector<float> rest;
  for (int s = 2; s < 6; ++s) rest.push_back(t.step(view_of<decltype(t)>(data_of(s))).loss);
  CHECK(std::memcmp(rest.data(), resident.losses.data() + 2, rest.size() * sizeof(float)) == 0);
  auto const last = params();
  for (std::size_t i = 0; i < last.size(); ++i)
    CHECK(std::memcmp(last[i].data(), resident.params[i].data(), last[i].size() * sizeof(tide::bf16)) == 0);
}

namespace {
struct zero_sink {  // the optimizer state sharded over two ranks (ZeRO), no exchange
  [[nodiscard]] off::chunk_shard shard() const noexcept { return {0, 2}; }
  template <tide::Backend B, class T>
  bool reduce(off::ready_chunk<B, T> const&) {
    return false;
  }
  template <class T>
  void share_parameters(std::span<std::span<T> const>) {}
};
}  // namespace

TEST_CASE("the NVMe tier: past the whole optimizer state, parameter chunks go to file too; the same bits, "
          "resumable, and a failed read or write loses nothing") {
  tide::thread_pool pool{1};
  tide::exec<host> ex{pool};
  tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
  off::scheduler<host, float, off::chunked<off::belady>> probe{ex, arena, spec.parameters(), spec.uses(), tight_belady};
  std::size_t const n = probe.layout().chunks(), block = tide::round_up(probe.chunk_bytes(), 256);
  std::size_t const list = tide::round_up(probe.chunk_bytes(), 4096);  // a file block
  REQUIRE(n >= 4);
  tide::test::scratch_dir const dir("spill_params");
  auto o = tight_belady;
  o.memory.spill_folder = dir.path;
  o.memory.host_budget = (n / 2) * block + 256;  // half the parameter chunks: every chunk's state and the rest go to file
  std::size_t const on_file = n - n / 2;
  std::vector<float> losses;
  auto const resident = train(off::resident{}, clipped, 6, &losses);

  auto t = tide::train::make_trainer(spec, o, clipped);
  for (int s = 0; s < 6; ++s) {
    float const loss = t.step(view_of<decltype(t)>(data_of(s))).loss;
    CHECK(std::memcmp(&loss, &losses[std::size_t(s)], sizeof(float)) == 0);
  }
  CHECK(same(params_of(t), resident));
  // Between steps the chunks on file have no host block (their device copies are clean).
  auto const& chunks = t.scheduler().list(tide::chunk::chunk_role::param);
  for (std::uint32_t c = 0; c < n; ++c) {
    INFO("chunk " << c);
    bool const host_block = chunks[c].payload() != nullptr && chunks[c].tier() == tide::chunk::tier::host;
    if (c >= n / 2) CHECK(!host_block);
  }
  // Each step writes every chunk's m and v and the parameters on file once; it reads the state
  // once, and the parameters on file for their update and at least once for the forward.
  auto const& last = t.scheduler().last_step();
  CHECK(last.nvme_write_bytes == n * 2 * list + on_file * list);
  CHECK(last.nvme_read_bytes >= n * 2 * list + 2 * on_file * list);
  CHECK((last.nvme_read_bytes - n * 2 * list) % list == 0);
  // The prefetch started reads of parameter chunks on file too, beside the state reads that
  // backward started for the first two deferred updates.
  CHECK(last.nvme_early_reads > 2);
  // The host has less in use than with the state alone on file, by the parameter chunks on file,
  // less their staging: two blocks beside the state's, the one a fetch reads into and the two the
  // prefetch reads into. (In use, after the views of params_of end: the pool's cache would count
  // the blocks of fetches once in flight, and the undo copies of the chunks stepped.)
  tide::test::scratch_dir const state_dir("spill_params_state_only");
  auto state_only = tight_belady;
  state_only.memory.spill_folder = state_dir.path;
  state_only.memory.host_budget = n * block + 256;  // the parameters: every chunk's state goes to file
  {
    auto u = tide::train::make_trainer(spec, state_only, clipped);
    for (int s = 0; s < 6; ++s) (void)u.step(view_of<decltype(u)>(data_of(s)));
    CHECK(same(params_of(u), resident));
    t.scheduler().end_views();
    u.scheduler().end_views();
    std::size_t const in_use = t.scheduler().host_pool_stats().bytes_requested;
    std::size_t const in_use_state_only = u.scheduler().host_pool_stats().bytes_requested;
    INFO("host bytes in use: " << in_use << " with " << on_file << " of " << n << " parameter chunks on file, "
                             << in_use_state_only << " with the state alone");
    CHECK(in_use + on_file * block <= in_use_state_only + 5 * list);
  }

  // Every parameter chunk on file (a budget of a page): the model initialises them one chunk at
  // a time, and training is the same bits.
  {
    tide::test::scratch_dir const all_dir("spill_params_all");
    auto all = o;
    all.memory.spill_folder = all_dir.path;
    all.memory.host_budget = 4096;
    auto a = tide::train::make_trainer(spec, all, clipped);
    auto const& pool_stats = a.scheduler().host_pool_stats();
    INFO("built: host bytes at their peak " << pool_stats.peak_bytes_requested << ", " << n << " chunks of " << block);
    CHECK(pool_stats.peak_bytes_requested <= 2 * 2 * list + 3 * list + block);  // the staging, and one chunk
    for (int s = 0; s < 6; ++s) {
      float const loss = a.step(view_of<decltype(a)>(data_of(s))).loss;
      CHECK(std::memcmp(&loss, &losses[std::size_t(s)], sizeof(float)) == 0);
    }
    CHECK(same(params_of(a), resident));
  }

  // A checkpoint reads the parameters from the file, a load writes them back: resumed, with the
  // tier or without, a run is the straight one.
  resumes_exactly(spec, o, tight_belady, dir.path / "ckpt", losses);

  // A write that fails, then a read that fails (a fetch finds the end of the cut file): each is
  // tide::error(io), changes no parameter, and the run goes on to the same bits.
  tide::test::scratch_dir const fail_dir("spill_params_fail");
  auto failing = o;
  failing.memory.spill_folder = fail_dir.path;
  auto f = tide::train::make_trainer(spec, failing, clipped);
  for (int s = 0; s < 2; ++s) (void)f.step(view_of<decltype(f)>(data_of(s)));
  auto const before = params_of(f);
  {
    tide::test::file_size_capped const cap(4096);
    REQUIRE(cap.capped);
    step_fails_on_file(f, 2, "File too large");
  }
  CHECK(same(params_of(f), before));
  {
    spill_file_cut const cut(fail_dir.path);
    REQUIRE(cut.files.size() == 2);
    step_fails_on_file(f, 2, "end of file");
    cut.put_back();
  }
  CHECK(same(params_of(f), before));
  CHECK(f.steps() == 2);
  for (int s = 2; s < 6; ++s) {
    float const loss = f.step(view_of<decltype(f)>(data_of(s))).loss;
    CHECK(std::memcmp(&loss, &losses[std::size_t(s)], sizeof(float)) == 0);
  }
  CHECK(same(params_of(f), resident));

  // bf16: past the fp32 masters, m and v, the bf16 parameter chunks. Every one on file, saved
  // before the first step (the masters go to file from the parameters read from it), resumed:
  // the same bits as resident, as is a straight run.
  tide::nn::gpt_spec<host, tide::bf16> const spec16{.config = deeper, .options = {.seed = 3}};
  off::chunked<off::belady> plain{.chunk_bytes = 10_KiB};
  plain.device_budget = tide::test::scheduler_minimum<decltype(plain), tide::bf16>(deeper, plain, batch, seq) + 16_KiB;
  tide::test::scratch_dir const d16("spill_params_bf16");
  auto p16 = plain;
  p16.memory.spill_folder = d16.path;
  p16.memory.host_budget = 4096;
  auto const r16 = run_bf16(off::resident{}, clipped, 6, deeper);
  CHECK(same_bits(r16, run_bf16(p16, clipped, 6, deeper)));
  // Read right after the first step, whose placement read the parameters on file to make the
  // masters: the stepped bytes, not those it read. With the last chunk alone on file, and with
  // every chunk there.
  {
    off::scheduler<host, tide::bf16, off::chunked<off::belady>> probe16{ex, arena, spec16.parameters(), spec16.uses(),
                                                                        plain};
    auto last_only = p16;
    last_only.memory.host_budget = (probe16.layout().chunks() - 1) * tide::round_up(probe16.chunk_bytes(), 256) + 256;
    auto const one = run_bf16(off::resident{}, clipped, 1, deeper);
    CHECK(same_bits(one, run_bf16(last_only, clipped, 1, deeper)));
    CHECK(same_bits(one, run_bf16(p16, clipped, 1, deeper)));
  }
  resumes_exactly(spec16, p16, plain, d16.path / "ckpt", r16.losses, 0);
}

TEST_CASE("gradient-slot reuse is refused where it cannot be exact, saying why") {
  auto reuse = tight_belady;
  reuse.memory.reuse_grad_slots = true;
  auto refused = [](auto&& make, char const* says) {
    try {
      make();
      FAIL("not refused");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::usage);
      INFO(e.what());
      CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
  };
  refused([&] { (void)tide::train::make_trainer(spec, reuse, clipped); }, "needs bf16 or f16 parameters");
  tide::nn::gpt_spec<host, tide::bf16> const spec16{.config = config, .options = {.seed = 3}};
  auto reuse16 = tight<off::chunked<off::belady>, tide::bf16>({.chunk_bytes = 10_KiB});
  reuse16.memory.reuse_grad_slots = true;
  auto accumulating = clipped;
  accumulating.micro_steps = 2;
  refused([&] { (void)tide::train::make_trainer(spec16, reuse16, accumulating); }, "micro_steps = 2");
  refused([&] {
    tide::thread_pool pool{1};
    tide::exec<host> ex{pool};
    tide::memory::device_arena<host> arena{{.budget = 64_MiB}};
    off::scheduler<host, tide::bf16, off::chunked<off::belady>, tide::optim::adamw, zero_sink> s{
        ex, arena, spec16.parameters(), spec16.uses(), reuse16, {.reuse_grad_slots = true}};
  }, "(ZeRO)");
}

TEST_CASE("f16 with loss scaling: overflowing steps are skipped, the scale halves, nothing changes; then it learns") {
  // With gradient-slot reuse too: a skipped step rounds the masters back into the slots, and the
  // run is the same bits as without.
  std::vector<float> first_run;
  for (bool const reuse : {false, true}) {
    INFO("reuse_grad_slots = " << reuse);
    tide::nn::gpt_spec<host, tide::f16> const spec16{.config = config, .options = {.seed = 3}};
    auto opt = clipped;
    opt.scaling = {.enabled = true, .initial = 16777216.f, .growth_interval = 1000};  // 2^24 overflows f16 (65504)
    auto offload = tight<off::chunked<off::belady>, tide::f16>({.chunk_bytes = 10_KiB});
    offload.memory.reuse_grad_slots = reuse;
    auto t = tide::train::make_trainer(spec16, offload, opt);
    auto params = [&] {
      std::vector<std::vector<tide::f16>> out;
      for (std::uint32_t i = 0; i < t.model().parameters().size(); ++i) out.push_back(t.scheduler().read_param(i));
      return out;
    };
    int skipped = 0;
    std::vector<float> losses;
    for (int s = 0; s < 30; ++s) {
      auto const before = params();
      float const scale = t.scaler().scale();
      auto const st = t.step(view_of<decltype(t)>(data_of(s)));
      if (st.skipped) {
        ++skipped;
        CHECK(t.scaler().scale() == scale / 2);
        auto const after = params();
        for (std::size_t i = 0; i < before.size(); ++i)
          CHECK(std::memcmp(before[i].data(), after[i].data(), before[i].size() * sizeof(tide::f16)) == 0);
      } else {
        losses.push_back(st.loss);
      }
    }
    CHECK(skipped >= 1);  // 2^24 times a loss gradient of ~1/32 is past f16's range
    CHECK(t.scaler().skipped() == skipped);
    CHECK(t.scheduler().optimizer_steps() == 30 - skipped);
    REQUIRE(losses.size() >= 10);
    CHECK(losses.back() < losses.front() - 0.2f);
    if (!reuse) first_run = losses;
    else CHECK(losses == first_run);
  }
}

TEST_CASE("a checkpoint with one section of the wrong size loads nothing") {
  tide::test::scratch_dir const scratch{"trainer_sizes"};
  auto const& dir = scratch.path;
  {
    auto t = tide::train::make_trainer(spec, tight_belady, clipped);
    for (int s = 0; s < 3; ++s) (void)t.step(view_of<decltype(t)>(data_of(s)));
    t.save(dir / "nested" / "folders" / "good");  // save creates the folders it needs
  }
  // The same sections, but the last tensor's v one float short: found only after every other
  // section would have been written by a load that checks as it goes.
  tide::train::checkpoint_reader const good(dir / "nested" / "folders" / "good");
  std::vector<std::string> const names = good.sections();
  std::vector<std::vector<std::byte>> payloads;
  std::string last_v;
  for (auto const& n : names) {
    payloads.emplace_back(good.size_of(n));
    good.read(n, payloads.back());
    if (n.starts_with("v/")) last_v = n;
  }
  REQUIRE(!last_v.empty());
  tide::train::checkpoint_writer w;
  for (std::size_t k = 0; k < names.size(); ++k) {
    std::span<std::byte const> bytes(payloads[k]);
    if (names[k] == last_v) bytes = bytes.first(bytes.size() - sizeof(float));
    w.add(names[k], bytes);
  }
  w.commit(dir / "short");

  auto t = tide::train::make_trainer(spec, tight_belady, clipped);
  (void)t.step(view_of<decltype(t)>(data_of(7)));
  t.save(dir / "before");
  auto const before = params_of(t);
  try {
    t.load(dir / "short");
    FAIL("a checkpoint with a short section loaded");
  } catch (tide::error const& e) {
    CHECK(e.category() == tide::errc::usage);
    CHECK(std::string(e.message()).find(last_v) != std::string::npos);
    CHECK(std::string(e.message()).find("nothing was loaded") != std::string::npos);
  }
  CHECK(same(params_of(t), before));
  CHECK(t.steps() == 1);
  t.save(dir / "after");  // optimizer state and counters too: the files are the same bytes
  CHECK(tide::test::file_text(dir / "before") == tide::test::file_text(dir / "after"));
  t.load(dir / "nested" / "folders" / "good");  // the good one still loads
  CHECK(t.steps() == 3);
}

TEST_CASE("device budgets that cannot work are refused with a tide::error naming device_budget") {
  // More than any machine has, and 2^64 - 5: refused when the trainer is made.
  for (std::size_t budget : {std::size_t{1} << 50, ~std::size_t{0} - 4}) {
    INFO("device_budget " << budget);
    try {
      auto t = tide::train::make_trainer(spec, off::chunked<off::belady>{.device_budget = budget, .chunk_bytes = 20_KiB},
                                         clipped);
      FAIL("an impossible budget was accepted");
    } catch (tide::error const& e) {
      CHECK(e.category() == tide::errc::budget);
      CHECK(std::string(e.message()).find("device_budget") != std::string::npos);
    }
  }
  // Below the activations: the same breakdown of the minimum as below the working set, naming
  // the trainer's knob (device_budget), not an arena's.
  auto t = tide::train::make_trainer(spec, off::chunked<off::belady>{.device_budget = 16_KiB, .chunk_bytes = 20_KiB},
                                     clipped);
  auto const before = params_of(t);
  try {
    (void)t.step(view_of<decltype(t)>(data_of(0)));
    FAIL("a budget below the activations was accepted");
  } catch (tide::error const& e) {
    std::string const what = e.message();
    CHECK(e.category() == tide::errc::budget);
    CHECK(what.find("activations") != std::string::npos);
    CHECK(what.find("working set") != std::string::npos);
    CHECK(what.find("raise device_budget to at least") != std::string::npos);
    CHECK(what.find("options.budget") == std::string::npos);
  }
  CHECK(same(params_of(t), before));
  CHECK(t.steps() == 0);
}

// ---- checkpoint sets (ZeRO) -------------------------------------------------------------------

namespace {
tide::optim::adamw const plain_adamw{.lr = 3e-3f};
template <class Trainer>
void steps(Trainer& t, int from, int to) {
  for (int s = from; s < to; ++s) {
    auto const d = data_of(s);
    (void)t.step(view_of<Trainer>(d));
  }
}
}  // namespace

TEST_CASE("a checkpoint set (ZeRO on one rank) resumes bit-identically; an uncommitted save is never taken") {
  tide::test::scratch_dir const dir("ckpt_set");
  auto const set = dir.path / "run";
  tide::comm::self one;
  tide::comm::data_parallel const zero1{.comm = &one, .zero = 1};
  auto straight = tide::train::make_trainer(spec, tight_belady, plain_adamw, zero1);
  steps(straight, 0, 3);
  straight.save(set);
  auto const m = tide::train::checkpoint_set::read_manifest(set);
  CHECK(m.ranks == 1);
  CHECK(m.step == 3);
  steps(straight, 3, 5);
  auto const after = params_of(straight);

  // A later save that never committed (its shard written, the job killed before the manifest):
  // the manifest still names the set above, which loads whole.
  auto const stray = tide::train::checkpoint_set::shard_path(set, "set-000004-abc", 0, 1);
  std::filesystem::create_directories(stray.parent_path());
  { std::FILE* f = std::fopen(stray.c_str(), "wb"); std::fputs("half a shard", f); std::fclose(f); }
  {
    auto resumed = tide::train::make_trainer(spec, tight_belady, plain_adamw, zero1);
    resumed.load(set);
    CHECK(resumed.steps() == 3);
    steps(resumed, 3, 5);
    CHECK(same(params_of(resumed), after));
  }
  {  // a set loads into a trainer without data parallelism, and a single file into a ZeRO one
    auto plain = tide::train::make_trainer(spec, tight_belady, plain_adamw);
    plain.load(set);
    steps(plain, 3, 5);
    CHECK(same(params_of(plain), after));
    plain.save(dir.path / "single.tide");
    auto sharded = tide::train::make_trainer(spec, tight_belady, plain_adamw, zero1);
    sharded.load(dir.path / "single.tide");
    CHECK(sharded.steps() == 5);
    CHECK(same(params_of(sharded), after));
  }
  {  // a set of a run with the NVMe tier: its shard reads the state on file; resumed, the same bits
    tide::test::scratch_dir const spill("ckpt_set_spill");
    auto const o = spilling(spill.path);
    auto a = tide::train::make_trainer(spec, o, plain_adamw, zero1);
    steps(a, 0, 3);
    a.save(dir.path / "spilled");
    auto b = tide::train::make_trainer(spec, o, plain_adamw, zero1);
    b.load(dir.path / "spilled");
    steps(b, 3, 5);
    CHECK(b.scheduler().last_step().nvme_read_bytes > 0);  // the tier is in use
    CHECK(same(params_of(b), after));
  }
  // The next committed save removes the stray folder and the set it replaced.
  straight.save(set);
  auto const m2 = tide::train::checkpoint_set::read_manifest(set);
  CHECK(m2.step == 5);
  CHECK(!std::filesystem::exists(stray.parent_path()));
  CHECK(!std::filesystem::exists(set / m.set));
  CHECK(std::filesystem::exists(tide::train::checkpoint_set::shard_path(set, m2.set, 0, 1)));
}

TEST_CASE("a damaged or missing checkpoint set is refused and loads nothing; a failed save keeps the last set") {
  tide::test::scratch_dir const dir("ckpt_set_bad");
  auto const set = dir.path / "run";
  tide::comm::self one;
  tide::comm::data_parallel const zero2{.comm = &one, .zero = 2};
  auto t = tide::train::make_trainer(spec, tight_belady, plain_adamw, zero2);
  steps(t, 0, 2);
  t.save(set);
  auto const m = tide::train::checkpoint_set::read_manifest(set);
  auto fresh = tide::train::make_trainer(spec, tight_belady, plain_adamw, zero2);
  auto const before = params_of(fresh);
  CHECK_THROWS_WITH_AS(fresh.load(dir.path / "nowhere"), doctest::Contains("cannot open checkpoint"), tide::error);
  // A truncated shard: every checksum is verified before anything is written.
  auto const shard = tide::train::checkpoint_set::shard_path(set, m.set, 0, 1);
  std::string const good = tide::test::file_text(shard);
  std::filesystem::resize_file(shard, good.size() - 9);
  CHECK_THROWS_AS(fresh.load(set), tide::error);
  CHECK(fresh.steps() == 0);
  CHECK(same(params_of(fresh), before));
  // A damaged manifest names itself.
  { std::FILE* f = std::fopen(shard.c_str(), "wb"); std::fwrite(good.data(), 1, good.size(), f); std::fclose(f); }
  auto const manifest = tide::train::checkpoint_set::manifest_path(set);
  std::string const text = tide::test::file_text(manifest);
  std::string broken = text;
  broken[broken.size() / 2] = static_cast<char>(broken[broken.size() / 2] ^ 0x40);
  { std::FILE* f = std::fopen(manifest.c_str(), "wb"); std::fwrite(broken.data(), 1, broken.size(), f); std::fclose(f); }
  CHECK_THROWS_WITH_AS(fresh.load(set), doctest::Contains("manifest.tide"), tide::error);
  CHECK(same(params_of(fresh), before));
  { std::FILE* f = std::fopen(manifest.c_str(), "wb"); std::fwrite(text.data(), 1, text.size(), f); std::fclose(f); }
  // A save whose shard cannot be written (the caller's extra sections throw) throws on every
  // rank, and the committed set stays the checkpoint.
  steps(t, 2, 3);
  auto const saved_manifest = tide::test::file_text(manifest);
  CHECK_THROWS_WITH_AS(t.save(set, [](tide::train::checkpoint_writer&) { throw tide::error(tide::errc::io, "disk full"); }),
                       doctest::Contains("rank 0 could not write its shard (disk full)"), tide::error);
  CHECK(tide::test::file_text(manifest) == saved_manifest);
  fresh.load(set);
  CHECK(fresh.steps() == 2);
}
