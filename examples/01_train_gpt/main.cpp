// 01_train_gpt (`./tide demo`): a byte-level GPT trained on real text, on the CPU, with its model
// data offloaded: the device budget is smaller than the parameters, gradients and AdamW state.
// The same source compiled by nvcc (cuda.cu beside it; `./tide demo --backend cuda` builds and
// runs it) trains on a CUDA GPU, the budget then being device memory.
//
// Everything is a tide part assembled by tide::train::trainer: tide::nn::gpt (forward, explicit
// backward, sampling), an offload scheduler (chunked<belady> by default: PatrickStar's chunks
// moved by the warm-up trace), tide::optim::adamw (warm-up + cosine, clipping at 1.0, no decay on
// biases and gains), checkpoints, and the reports (a progress line, SVG pictures).
//
//   example_01_train_gpt [--steps N] [--model tiny|small|medium] [--budget SIZE|auto] [--scheduler NAME]
//                        [--data PATH] [--checkpoint-dir DIR] [--checkpoint-every N] [--resume [RUN]]
//                        [--batch N] [--seq N] [--lr X] [--warmup N] [--seed N] [--threads N]
//                        [--eval-every N] [--sample N] [--prompt TEXT] [--check-falls MARGIN]
//                        [--recompute] [--offload-activations] [--host-budget SIZE --spill-folder DIR]
//                        [--backend host|cuda]
//
// --help prints the defaults (read from `options`). Each run writes to a folder of its own,
// DIR/run-001, run-002, ...; --resume continues the latest one that has a checkpoint, or the run
// folder named after it; the loss picture covers the whole run (the checkpoint carries its losses).
// SIGINT or SIGTERM finishes the step in flight, saves a checkpoint, writes the pictures and the
// timeline and exits 130 or 143; a second one ends the process at once.
// Bad input: one line "example_01_train_gpt: <what is wrong>" on stderr, exit 2; so is --backend
// cuda without a CUDA device, or in the host's build (the host backend in the CUDA build: the
// same). --check-falls M:
// exit 1 unless the mean loss of the last 5 steps is below the first step's minus M (the suite's
// smoke test).

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <limits>
#include <new>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tide/nn/gpt.hpp>
#include <tide/offload/report.hpp>
#include <tide/offload/trace_events.hpp>
#include <tide/optim/adamw.hpp>
#include <tide/train/report.hpp>
#include <tide/train/text_data.hpp>
#include <tide/train/interrupt.hpp>
#include <tide/train/trainer.hpp>

#if defined(__CUDACC__)
#include <tide/cuda.cuh>
#endif

#include "../common/run.hpp"

using namespace tide::literals;
using tide::index_t;
namespace fs = std::filesystem;

namespace {

// The backend this build trains on: nvcc's build the CUDA one only (the host's is the g++
// build), so that each compiles one set of trainers.
#if defined(__CUDACC__)
using demo_backend = tide::cuda;
constexpr char const* program = "example_01_train_gpt_cuda";
constexpr char const* this_backend = "cuda";
#else
using demo_backend = tide::host;
constexpr char const* program = "example_01_train_gpt";
constexpr char const* this_backend = "host";
#endif

struct options {
  int steps = 1000;
  std::string model = "small";
  std::size_t budget = 0;  // bytes; 0: auto
  std::string scheduler = "chunked";
  std::string data;  // empty: the fortunes corpus
  std::string checkpoint_dir = "tide-run";
  int checkpoint_every = 100;
  bool resume = false;
  std::string resume_from;  // --resume RUN: that run folder; empty: the latest
  int batch = 2, seq = 128;
  float lr = 2e-3f;
  int warmup = 30;
  std::uint64_t seed = 1337;
  int threads = 2;
  int eval_every = 100;
  int sample = 200;
  std::string prompt = "The ";
  double check_falls = -1;  // off
  bool recompute = false;             // every block's activations recomputed in backward
  bool offload_activations = false;   // every block's saved activations to host memory
  std::size_t host_budget = 0;        // bytes of model data the host keeps between steps; 0: no limit
  std::string spill_folder;           // where optimizer state past host_budget goes
  std::string backend = this_backend;  // host or cuda: each build runs its own
};

// --help: the defaults come from options{}, so the text cannot drift from the code.
std::string usage() {
  options const d{};
  return tide::detail::concat(
      "usage: ", program, " [FLAG VALUE]...   (./tide demo [FLAG VALUE]...)\n",
      "A byte-level GPT trained on text on the CPU with its model data offloaded. Defaults in [].\n",
      "  --steps N             training steps; the total when resuming [", d.steps, "]\n",
      "  --model NAME          tiny (L2 C64), small (L4 C256) or medium (L6 C384) [", d.model, "]\n",
      "  --budget SIZE|auto    device budget [",
      d.budget == 0 ? std::string("auto") : tide::detail::concat(d.budget, " bytes"), "]. auto: the activations + a quarter of the\n",
      "                        model data. SIZE: bytes, or a number and a unit: KiB, MiB, GiB are 1024,\n",
      "                        1024^2, 1024^3 bytes; KB, MB, GB are 1000, 1000^2, 1000^3 (48MiB, 1.5GiB)\n",
      "  --scheduler NAME      chunked (belady), chunked-lru, layer-window, static or resident [", d.scheduler, "]\n",
      "  --data PATH           a text file or a folder of them [",
      d.data.empty() ? tide::train::fortunes_path().string() : d.data, "]\n",
      "  --checkpoint-dir DIR  each run writes its checkpoint and pictures to a new DIR/run-NNN [",
      d.checkpoint_dir, "]\n",
      "  --checkpoint-every N  steps between checkpoints, 0 for none [", d.checkpoint_every, "]\n",
      "  --resume [RUN]        continue RUN (a run folder), or the latest DIR/run-NNN that has a checkpoint,\n",
      "                        writing on there [",
      d.resume ? "on" : "off", "]\n",
      "  --batch N             sequences per step [", d.batch, "]\n",
      "  --seq N               their length T, at least 2 [", d.seq, "]\n",
      "  --lr X                peak learning rate; cosine down to lr/10 [", d.lr, "]\n",
      "  --warmup N            warm-up steps [", d.warmup, "]\n",
      "  --seed N              initialisation, data order and sampling [", d.seed, "]\n",
      "  --threads N           worker threads [", d.threads, "]\n",
      "  --eval-every N        validation loss every N steps [", d.eval_every, "]\n",
      "  --sample N            bytes generated at the end, 0 for none [", d.sample, "]\n",
      "  --prompt TEXT         the sample's prompt [\"", d.prompt, "\"]\n",
      "  --check-falls M       exit 1 unless the last 5 steps' mean loss < the first loss - M [",
      d.check_falls < 0 ? std::string("off") : tide::detail::concat(d.check_falls), "]\n",
      "  --recompute           recompute every block's activations in backward (activation checkpointing) [",
      d.recompute ? "on" : "off", "]\n",
      "  --offload-activations move every block's saved activations to host memory between forward and backward [",
      d.offload_activations ? "on" : "off", "]\n",
      "  --host-budget SIZE    model data the host keeps between steps (chunked schedulers); past it the optimizer\n",
      "                        state, then parameter chunks, go to files under --spill-folder (the NVMe tier);\n",
      "                        offloaded activations get their host room on top of it [",
      d.host_budget == 0 ? std::string("no limit") : tide::detail::concat(tide::bytes_of{d.host_budget}), "]\n",
      "  --spill-folder DIR    the folder for those files, on a fast drive; created if missing [",
      d.spill_folder.empty() ? "none" : d.spill_folder.c_str(), "]\n",
      "  --backend NAME        host, or cuda (the build ./tide demo --backend cuda makes with nvcc) [",
      d.backend, "]\n",
      "  --help                this text\n",
      "Flags also take --flag=VALUE. Sizes in the output are binary (KiB, MiB, GiB). Bad input exits 2\n",
      "with one line on stderr.\n");
}

// The flags, and whether each takes a value: an unknown flag is named as unknown before any
// value is looked at.
struct flag {
  std::string_view name;
  bool takes_value;
};
constexpr flag flags[] = {
    {"--steps", true},      {"--model", true},      {"--budget", true},     {"--scheduler", true},
    {"--data", true},       {"--checkpoint-dir", true}, {"--checkpoint-every", true}, {"--resume", false},
    {"--batch", true},      {"--seq", true},        {"--lr", true},         {"--warmup", true},
    {"--seed", true},       {"--threads", true},    {"--eval-every", true}, {"--sample", true},
    {"--prompt", true},     {"--check-falls", true}, {"--help", false},     {"-h", false},
    {"--recompute", false}, {"--offload-activations", false}, {"--host-budget", true}, {"--spill-folder", true},
    {"--backend", true},
};

flag const* find_flag(std::string_view name) {
  for (auto const& f : flags)
    if (f.name == name) return &f;
  return nullptr;
}

// A whole number in [lo, hi] for `flag`.
template <class N>
N whole_number(std::string_view flag, std::string_view text, N lo, N hi) {
  N value{};
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  bool const complete = end == text.data() + text.size();
  TIDE_CHECK(ec != std::errc::result_out_of_range || !complete, usage, flag, " ", text, ": out of range; pass ", lo,
             " to ", hi);
  TIDE_CHECK(ec == std::errc{} && complete && !text.empty(), usage, flag, " wants a whole number, got '", text, "'");
  if (hi == std::numeric_limits<N>::max())
    TIDE_CHECK(value >= lo, usage, flag, " must be at least ", lo, ", got ", text);
  else
    TIDE_CHECK(value >= lo && value <= hi, usage, flag, " must be ", lo, " to ", hi, ", got ", text);
  return value;
}

// A finite decimal number for `flag` ("2e-3", "0.5").
double real_number(std::string_view flag, std::string_view text) {
  double value = 0;
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TIDE_CHECK(ec == std::errc{} && end == text.data() + text.size() && !text.empty() && std::isfinite(value), usage,
             flag, " wants a finite number, got '", text, "'");
  return value;
}

// Bytes of RAM: the host backend's "device" is a region of it.
std::size_t physical_memory() {
  std::size_t const bytes = tide::memory::device_arena<tide::host>::capacity();
  return bytes != 0 ? bytes : std::numeric_limits<std::size_t>::max();
}
// Bytes of the memory the device budget comes out of: RAM, or the GPU's memory.
std::size_t device_memory() {
  std::size_t const bytes = tide::memory::device_arena<demo_backend>::capacity();
  return bytes != 0 ? bytes : std::numeric_limits<std::size_t>::max();
}

options parse(int argc, char** argv) {
  options o;
  int const int_max = std::numeric_limits<int>::max();
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view inline_value;
    bool has_inline = false;
    if (arg.starts_with("--") && arg.find('=') != std::string_view::npos) {
      inline_value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
      has_inline = true;
    }
    flag const* f = find_flag(arg);
    if (f == nullptr) {
      TIDE_CHECK(!arg.starts_with('-'), usage, "unknown flag ", arg, "; --help lists the flags");
      TIDE_FAIL(usage, "unexpected argument '", arg, "': flags start with -- (--help lists them)");
    }
    std::string_view const k = f->name;
    if (k == "--help" || k == "-h") {
      std::fputs(usage().c_str(), stdout);
      std::exit(0);
    }
    if (k == "--resume") {  // a run folder may follow
      o.resume = true;
      if (has_inline) o.resume_from = inline_value;
      else if (i + 1 < argc && !std::string_view(argv[i + 1]).starts_with('-')) o.resume_from = argv[++i];
      TIDE_CHECK(!has_inline || !o.resume_from.empty(), usage, "--resume= names no run folder; pass --resume alone "
                 "for the latest, or --resume DIR/run-NNN");
      continue;
    }
    if (!f->takes_value) {
      TIDE_CHECK(!has_inline, usage, k, " takes no value, got '", inline_value, "'");
      if (k == "--recompute") o.recompute = true;
      else if (k == "--offload-activations") o.offload_activations = true;
      continue;
    }
    if (!has_inline) {
      bool const next_is_flag = i + 1 < argc && find_flag(std::string_view(argv[i + 1]).substr(
                                                    0, std::string_view(argv[i + 1]).find('='))) != nullptr;
      TIDE_CHECK(i + 1 < argc && !next_is_flag, usage, k, " needs a value; --help lists the flags");
    }
    std::string_view const v = has_inline ? inline_value : std::string_view(argv[++i]);
    if (k == "--steps") o.steps = whole_number(k, v, 1, int_max);
    else if (k == "--model") o.model = v;
    else if (k == "--budget") o.budget = v == "auto" ? 0 : demo::size_from(k, v);
    else if (k == "--scheduler") o.scheduler = v;
    else if (k == "--data") o.data = v;
    else if (k == "--checkpoint-dir") o.checkpoint_dir = v;
    else if (k == "--checkpoint-every") o.checkpoint_every = whole_number(k, v, 0, int_max);
    else if (k == "--batch") o.batch = whole_number(k, v, 1, 65536);
    else if (k == "--seq") o.seq = whole_number(k, v, 2, 65536);
    else if (k == "--lr") o.lr = static_cast<float>(real_number(k, v));
    else if (k == "--warmup") o.warmup = whole_number(k, v, 0, int_max);
    else if (k == "--seed") o.seed = whole_number(k, v, std::uint64_t{0}, std::numeric_limits<std::uint64_t>::max());
    else if (k == "--threads") o.threads = whole_number(k, v, 1, 256);
    else if (k == "--eval-every") o.eval_every = whole_number(k, v, 1, int_max);
    else if (k == "--sample") o.sample = whole_number(k, v, 0, 1 << 20);
    else if (k == "--prompt") o.prompt = v;
    else if (k == "--check-falls") o.check_falls = real_number(k, v);
    else if (k == "--host-budget") o.host_budget = demo::size_from(k, v);
    else if (k == "--spill-folder") o.spill_folder = v;
    else if (k == "--backend") o.backend = v;
  }
  TIDE_REQUIRE((o.host_budget == 0) == o.spill_folder.empty(), "--host-budget and --spill-folder go together: the "
               "optimizer state past the host budget needs a folder, and a folder needs a budget to spill past");
  TIDE_REQUIRE(o.lr > 0.f && o.lr <= 1.f, "--lr must be above 0 and at most 1, got ", o.lr);
  TIDE_REQUIRE(o.check_falls >= 0 || o.check_falls == options{}.check_falls, "--check-falls must be >= 0, got ",
               o.check_falls);
  TIDE_REQUIRE(o.sample == 0 || !o.prompt.empty(), "--prompt is empty: give at least one character, or --sample 0");
  TIDE_REQUIRE(o.checkpoint_dir.size() > 0, "--checkpoint-dir is empty: name a folder");
  return o;
}

// ---- run folders: DIR/run-001, run-002, ... (examples/common/run.hpp) ------------------------

fs::path const checkpoint_name = "checkpoint.tide";

tide::nn::gpt_config model_config(options const& o) {
  int layers = 4, channels = 256, heads = 4;
  if (o.model == "tiny") layers = 2, channels = 64, heads = 2;
  else if (o.model == "medium") layers = 6, channels = 384, heads = 6;
  else TIDE_REQUIRE(o.model == "small", "--model ", o.model, ": pass tiny, small or medium");
  return {.layers = layers, .heads = heads, .channels = channels, .vocab = 256, .max_seq = o.seq};
}

// Printable ASCII as it is, other bytes but newline and tab as '?'.
std::string printable(std::vector<std::int32_t> const& ids) {
  std::string s;
  for (auto id : ids) {
    auto const c = static_cast<unsigned char>(id);
    s += (c >= 32 && c < 127) || c == '\n' || c == '\t' ? static_cast<char>(c) : '?';
  }
  return s;
}

// One batch of (B, T) inputs and targets.
struct batch {
  std::vector<std::int32_t> inputs, targets;
  index_t B, T;
  batch(int b, int t) : inputs(std::size_t(b) * std::size_t(t)), targets(inputs.size()), B(b), T(t) {}
  tide::tensor_view<std::int32_t> in() { return {inputs.data(), {B, T}}; }
  tide::tensor_view<std::int32_t> out() { return {targets.data(), {B, T}}; }
  tide::tensor_view<std::int32_t const> tokens() const { return {inputs.data(), {B, T}}; }
  tide::tensor_view<std::int32_t const> labels() const { return {targets.data(), {B, T}}; }
};

// A batch where the backend's kernels read it: on the host its own vectors; on CUDA a device
// copy into one buffer (8 bytes a position, nothing next to a step), written on the trainer's
// compute stream (cudaMemcpyAsync): after the kernels of the use before, which read the buffer
// (a step's backward reads its tokens again), and before those of its own use.
template <class Backend>
struct staged {
  staged(int, int) {}
  std::pair<tide::tensor_view<std::int32_t const>, tide::tensor_view<std::int32_t const>> operator()(
      batch const& b, tide::exec<Backend> const&) {
    return {b.tokens(), b.labels()};
  }
};
#if defined(__CUDACC__)
template <>
struct staged<tide::cuda> {
  using view = tide::tensor_view<std::int32_t const, tide::cuda>;
  std::size_t n;
  std::int32_t* d = nullptr;  // (2, B, T): inputs, then targets
  staged(int B, int T) : n(std::size_t(B) * std::size_t(T)) {
    TIDE_CUDA_CHECK(cudaMalloc(&d, 2 * n * sizeof(std::int32_t)));
  }
  staged(staged const&) = delete;
  staged& operator=(staged const&) = delete;
  ~staged() { (void)cudaFree(d); }
  std::pair<view, view> operator()(batch const& b, tide::exec<tide::cuda> const& ex) {
    TIDE_REQUIRE(b.inputs.size() == n, "a batch of ", b.inputs.size(), " tokens for a buffer of ", n);
    tide::memory::write_from_host(ex, d, b.inputs.data(), n * sizeof(std::int32_t));
    tide::memory::write_from_host(ex, d + n, b.targets.data(), n * sizeof(std::int32_t));
    return {view(d, {b.B, b.T}), view(d + n, {b.B, b.T})};
  }
};
#endif

// The device's name for the report: "the host" or the GPU's.
std::string device_name() {
#if defined(__CUDACC__)
  int device = 0;
  cudaDeviceProp prop{};
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  TIDE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return tide::detail::concat("CUDA device ", device, ", ", prop.name);
#else
  return "the host (its device memory is a region of RAM)";
#endif
}

// The model's options: the seed, and --recompute / --offload-activations for every block.
tide::nn::gpt_options model_options(options const& opt, tide::nn::gpt_config const& config) {
  tide::nn::gpt_options o{.seed = opt.seed};
  demo::memory_options(o, config, opt.recompute, opt.offload_activations);
  return o;
}

// The activations of one (B, T) step: their buffer (the non-model data the budget must also
// hold) and the host bytes of the offloaded ones. Measured in an arena of a quarter of the
// machine's memory (it touches only what it uses).
tide::nn::activation_report activation_plan(tide::nn::gpt_config const& config, tide::nn::gpt_options const& options,
                                            int B, int T) {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  std::size_t const quarter = std::min(physical_memory() / 4, 256_GiB);
  tide::memory::device_arena<tide::host> arena{{.budget = quarter}};
  try {
    tide::nn::gpt<tide::host> model{config, arena, options};
    std::vector<std::int32_t> zeros(std::size_t(B) * std::size_t(T), 0);
    model.forward(ex, tide::tensor_view<std::int32_t const>(zeros.data(), {B, T}));
    return model.activations();
  } catch (tide::error const& e) {
    if (e.category() != tide::errc::budget) throw;
    TIDE_FAIL(budget, "--batch ", B, " --seq ", T, ": the activations alone need more than ", tide::bytes_of{quarter},
              ", a quarter of this machine's memory; lower --batch or --seq");
  }
}

// The device budget: --budget, checked against the scheduler's minimum for this model before
// anything is built (the scheduler says what its minimum is made of); auto: the activations plus
// a quarter of the model data, or that minimum plus two chunks if it is more.
template <class Offload>
std::size_t device_budget(options const& opt, tide::nn::gpt_config const& config, Offload const& offload,
                          std::size_t model_data) {
  std::size_t activations =
      tide::round_up(activation_plan(config, model_options(opt, config), opt.batch, opt.seq).footprint, 256);
#if defined(__CUDACC__)
  {  // CUDA's kernels ask for other scratch than the host's (attention's (NH, T, T) scores): the
     // same plan with the scratch the trainer's exec (cuBLAS set) will ask for
    tide::thread_pool one{1};
    tide::memory::compute_context<tide::cuda> ctx;
    auto const cuda_scratch = tide::nn::gpt_scratch_of<float>(ctx.exec_with(one), config, opt.batch, opt.seq);
    activations = std::max(activations, tide::round_up(tide::nn::activation_bytes(
                                            config, model_options(opt, config), opt.batch, opt.seq,
                                            sizeof(float), cuda_scratch), 256));
  }
#endif
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 1_MiB}};
  tide::offload::scheduler<tide::host, float, Offload> const probe{
      ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config), offload};
  std::size_t const minimum = probe.minimum_device_bytes(activations);
  if (opt.budget == 0) return std::max(activations + model_data / 4, minimum + 2 * probe.chunk_bytes());
  TIDE_CHECK(opt.budget >= minimum, budget, "--budget ", tide::bytes_of{opt.budget}, " is below what ",
             decltype(probe)::name(), " needs for this model and --batch ", opt.batch, " --seq ", opt.seq, ", ",
             tide::bytes_of{minimum}, ": ", probe.minimum_explained(activations), "; pass more, or auto");
  TIDE_CHECK(opt.budget <= device_memory(), budget, "--budget ", tide::bytes_of{opt.budget},
             demo_backend::is_device ? " is more than the GPU's " : " is more than this machine's ",
             tide::bytes_of{device_memory()},
             demo_backend::is_device ? " of memory" : " of memory (the host backend's device memory is a region of it)");
  return opt.budget;
}

// The model a checkpoint holds, from its "model.shape" text ("wpe f32 T C" lines, one "hN." per
// layer): "L=4 C=256 T=128", which names the demo's --model and --seq.
std::string saved_model(fs::path const& checkpoint) {
  tide::train::checkpoint_reader const r(checkpoint);
  std::string text(r.size_of("model.shape"), '\0');
  r.read("model.shape", std::as_writable_bytes(std::span(text)));
  long long T = 0, C = 0;
  int layers = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t const end = std::min(text.find('\n', at), text.size());
    std::string_view const line(text.data() + at, end - at);
    if (line.starts_with("wpe ")) std::sscanf(std::string(line).c_str(), "wpe %*s %lld %lld", &T, &C);
    if (line.starts_with("h") && line.find(".ln1.w ") != std::string_view::npos) ++layers;
    at = end + 1;
  }
  std::string const name = layers == 2 && C == 64 ? "tiny" : layers == 4 && C == 256 ? "small"
                           : layers == 6 && C == 384 ? "medium" : "";
  return tide::detail::concat(name.empty() ? "" : "--model " + name + " ", "--seq ", T, ": L=", layers, " C=", C);
}

// Where this run writes: a new DIR/run-NNN, or with --resume the run named or the latest one
// holding a checkpoint.
struct run_place {
  fs::path resume_from;  // the run folder to continue; empty for a new run
};

run_place find_run_place(options const& opt) {
  fs::path const dir = opt.checkpoint_dir;
  if (!opt.resume) {
    demo::make_checkpoint_dir(dir);
    return {};
  }
  return {demo::resume_folder(dir, opt.resume_from, checkpoint_name)};
}

template <class Offload>
int run(options const& opt, run_place const& place, Offload offload, tide::nn::gpt_config const& config,
        std::size_t model_data) {
  std::size_t const budget = device_budget(opt, config, offload, model_data);
  offload.device_budget = budget;
  auto const corpus = tide::train::byte_corpus::from_path(opt.data.empty() ? tide::train::fortunes_path() : fs::path(opt.data));
  tide::train::window_loader train{corpus, tide::train::split::train, opt.batch, opt.seq, opt.seed};
  constexpr int validation_batches = 4;
  std::vector<batch> validation;
  {
    tide::train::window_loader loader{corpus, tide::train::split::validation, opt.batch, opt.seq, opt.seed + 1};
    for (int i = 0; i < validation_batches; ++i) {
      validation.emplace_back(opt.batch, opt.seq);
      loader.next(validation.back().in(), validation.back().out());
    }
  }

  tide::train::trainer trainer{tide::nn::gpt_spec<demo_backend>{.config = config, .options = model_options(opt, config)},
                               offload,
                               tide::optim::adamw{.lr = opt.lr,
                                                  .beta2 = 0.99f,
                                                  .weight_decay = 0.1f,
                                                  .clip_norm = 1.f,
                                                  .decay_matrices_only = true,
                                                  .schedule = {.warmup_steps = opt.warmup, .total_steps = opt.steps}},
                               tide::train::no_comm{},
                               tide::train::no_compress{},
                               tide::train::no_pipeline{},
                               opt.threads};
  using scheduler_type = typename decltype(trainer)::scheduler_type;
  auto& model = trainer.model();
  auto& sched = trainer.scheduler();

  // The checkpoint to resume (checked whole before anything is printed), or a new run folder.
  demo::loss_history history;  // the whole run's losses, carried by the checkpoint
  std::optional<demo::new_run_folder> fresh;  // a new run's folder (none when resuming)
  fs::path const resumed = place.resume_from / checkpoint_name;
  if (!place.resume_from.empty()) {
    try {
      trainer.load(resumed,
                   [&](tide::train::checkpoint_reader const& r) {
                     if (r.contains("data.windows"))
                       train.seek_windows(r.read_value<std::uint64_t>("data.windows"));  // any --batch
                     else  // saved before data.windows: its position in batches of the same --batch
                       train.seek(r.read_value<std::uint64_t>("data.position"));
                     history.read(r);
                   });
    } catch (tide::error const& e) {
      if (e.category() != tide::errc::usage || e.message().find("model.shape") == std::string::npos) throw;
      TIDE_FAIL(usage, "--resume: ", resumed.string(), " holds another model (", saved_model(resumed), ") than --model ",
                opt.model, " --seq ", opt.seq, ": pass the --model and --seq it was started with, or start a new run "
                "without --resume");
    }
    history.trim_to(trainer.steps());
  } else {
    fresh.emplace(opt.checkpoint_dir);
  }

  std::printf("corpus: %zu bytes from %s\n", corpus.bytes().size(),
              opt.data.empty() ? tide::train::fortunes_path().c_str() : opt.data.c_str());
  std::printf("model: L=%d NH=%d C=%d T=%d, %.2fM parameters; model data %.1f MiB (16 B/param in chunks of %.2f MiB)\n",
              config.layers, config.heads, config.channels, opt.seq,
              double(tide::nn::parameter_count(tide::nn::resolve(config))) / 1e6, double(model_data) / double(1_MiB),
              double(sched.chunk_bytes()) / double(1_MiB));
  std::printf("device: %s\n", device_name().c_str());
  std::printf("offload: %s, device budget %.1f MiB (%.0f%% of the model data), B=%d, %d threads\n",
              scheduler_type::name().c_str(), double(budget) / double(1_MiB), 100.0 * double(budget) / double(model_data),
              opt.batch, opt.threads);
  if (fresh)
    std::printf("run folder: %s (checkpoint, pictures, timeline)\n", fresh->path().c_str());
  else
    std::printf("resumed from %s at step %lld; writing on in %s\n", resumed.c_str(),
                static_cast<long long>(trainer.steps()), place.resume_from.c_str());
  fs::path const dir = fresh ? fresh->path() : place.resume_from;
  fs::path const ckpt = dir / checkpoint_name;
  std::fflush(stdout);

  staged<demo_backend> stage(opt.batch, opt.seq);
  auto evaluate = [&] {
    sched.begin_evaluation();
    double sum = 0;
    for (auto const& b : validation) {
      auto const [in, out] = stage(b, trainer.executor());
      sum += model.forward(trainer.executor(), in, out);
    }
    sched.end_evaluation();
    return sum / validation_batches;
  };

  tide::train::progress progress{stdout};
  batch current(opt.batch, opt.seq);
  if (fresh) history.first_step = trainer.steps() + 1;
  std::vector<float> losses;  // this run's (the history has the whole run's)
  double const first_validation = evaluate();
  if (!history.validation.empty() && history.validation.back().first == trainer.steps()) history.validation.pop_back();
  history.validation.emplace_back(trainer.steps(), float(first_validation));
  std::printf("step %5lld  validation loss %.4f\n", static_cast<long long>(trainer.steps()), first_validation);
  double train_seconds = 0;
  std::size_t tokens = 0;
  tide::train::step_stats last{};
  // The last step's timeline, as Chrome trace-event JSON: each step records it afresh, so a run
  // stopped by a signal writes the step it finished.
  tide::offload::trace_recorder timeline;
  sched.set_trace(&timeline);
  // SIGINT / SIGTERM: finish the step in flight, save, draw, exit 130 / 143; a second one ends it
  // at once.
  tide::train::stop_signals stop;
  int stopped = 0;
  while (trainer.steps() < opt.steps && stopped == 0) {
    train.next(current.in(), current.out());
    timeline.clear();
    auto const [in, out] = stage(current, trainer.executor());
    last = trainer.step(typename decltype(trainer)::batch_type{in, out});
    TIDE_CHECK(std::isfinite(last.loss), usage, "the training loss is ", last.loss, " at step ", last.step,
               "; lower --lr (now ", opt.lr, ")");
    losses.push_back(last.loss);
    history.losses.push_back(last.loss);
    if (last.step > 1) {  // the warm-up step records the trace: not representative
      train_seconds += last.seconds;
      tokens += last.tokens;
    }
    progress.update(last, opt.steps);
    stopped = stop.pending();
    bool const at_eval = last.step % opt.eval_every == 0 || last.step == opt.steps;
    if (at_eval) {
      double const v = evaluate();
      history.validation.emplace_back(last.step, float(v));
      char extra[64];
      std::snprintf(extra, sizeof extra, "  validation %.4f", v);
      progress.line(last, opt.steps, extra);
    } else if (stopped != 0 || (!progress.terminal() && last.step % 20 == 0)) {
      progress.line(last, opt.steps);
    }
    if (stopped != 0 || (opt.checkpoint_every > 0 && (last.step % opt.checkpoint_every == 0 || last.step == opt.steps))) {
      std::uint64_t const windows = train.windows_drawn();
      trainer.save(ckpt, [&](tide::train::checkpoint_writer& w) {
        w.add_value("data.windows", windows);
        history.write(w);
      });
    }
  }
  if (losses.empty()) {
    std::printf("nothing to train: the checkpoint is at step %lld of %d; raise --steps to train on\n",
                static_cast<long long>(trainer.steps()), opt.steps);
    return 0;
  }

  sched.set_trace(nullptr);
  auto const [tide_svg, trace_json] = demo::draw_step(dir, sched, timeline, scheduler_type::name());
  auto const loss_svg = dir / "loss.svg";
  tide::offload::write_file(loss_svg.string(), tide::train::loss_svg(history.losses, history.validation,
                                                                     "01_train_gpt loss", history.first_step));
  demo::digest params;
  for (std::uint32_t i = 0; i < model.parameters().size(); ++i) params.add(sched.read_param(i));
  std::printf("\nparameters after step %lld: crc32c %08x\n", static_cast<long long>(trainer.steps()), params.crc);
  if (stopped != 0) {
    std::printf("stopped by %s after step %lld of %d: checkpoint %s; pictures %s, %s; timeline %s\n"
                "continue with: ./tide demo --resume %s --steps %d (and the flags of this run)\n",
                demo::signal_name(stopped), static_cast<long long>(trainer.steps()), opt.steps, ckpt.c_str(),
                tide_svg.c_str(), loss_svg.c_str(), trace_json.c_str(), dir.c_str(), opt.steps);
    return tide::train::stop_signals::exit_status(stopped);
  }

  std::size_t const tail = std::min<std::size_t>(5, losses.size());
  double const last_mean = std::accumulate(losses.end() - std::ptrdiff_t(tail), losses.end(), 0.0) / double(tail);
  auto const& off = last.offload;
  std::printf("train loss: first %.4f, mean of the last %zu steps %.4f (ln 256 = %.4f)\n", double(losses.front()),
              tail, last_mean, std::log(256.0));
  std::printf("validation loss: %.4f before, %.4f after\n", first_validation, double(history.validation.back().second));
  std::printf("%.0f tokens/s after the warm-up step; last step moved %.1f MiB (%zu fetches, %zu evictions, %zu "
              "prefetch hits), stalled %.1f ms; device peak %.1f of %.1f MiB; %s moved in all\n",
              train_seconds > 0 ? double(tokens) / train_seconds : 0.0, double(off.bytes_moved()) / double(1_MiB),
              off.fetches, off.evictions, off.prefetch_hits, off.stall_ms, double(off.peak_device_bytes) / double(1_MiB),
              double(budget) / double(1_MiB), tide::detail::concat(tide::bytes_of{progress.bytes_moved()}).c_str());
  if (off.nvme_read_bytes + off.nvme_write_bytes > 0)
    std::printf("NVMe tier: the last step read %.1f MiB and wrote %.1f MiB of model data under %s\n",
                double(off.nvme_read_bytes) / double(1_MiB), double(off.nvme_write_bytes) / double(1_MiB),
                opt.spill_folder.c_str());
  std::printf("pictures: %s (memory tide of the last step), %s (loss); timeline: %s (open in ui.perfetto.dev)\n",
              tide_svg.c_str(), loss_svg.c_str(), trace_json.c_str());
  if (opt.checkpoint_every > 0)
    std::printf("checkpoint: %s (--resume continues the latest run with a checkpoint; raise --steps)\n", ckpt.c_str());

  if (opt.sample > 0) {
    std::vector<std::int32_t> prompt;
    for (unsigned char c : opt.prompt) prompt.push_back(c);
    sched.begin_evaluation();
    auto const text = model.generate(trainer.executor(), prompt, opt.sample, 0.8f, opt.seed);
    sched.end_evaluation();
    std::printf("sample (%d bytes, temperature 0.8):\n---\n%s\n---\n", opt.sample, printable(text).c_str());
  }
  if (opt.check_falls >= 0) {
    bool const fell = last_mean < double(losses.front()) - opt.check_falls;
    std::printf("check: last-%zu mean %.4f %s first loss %.4f - %.2f\n", tail, last_mean, fell ? "<" : ">=",
                double(losses.front()), opt.check_falls);
    return fell ? 0 : 1;
  }
  return 0;
}

int train_gpt(int argc, char** argv) {
  options const opt = parse(argc, argv);
  TIDE_REQUIRE(opt.backend == "host" || opt.backend == "cuda", "--backend ", opt.backend, ": pass host or cuda");
  if (opt.backend != this_backend) {
    TIDE_REQUIRE(opt.backend != "cuda", "--backend cuda: this is the demo's host build; ./tide demo --backend cuda "
                 "builds its CUDA one with nvcc and runs it");
    TIDE_FAIL(usage, "--backend host: this is the demo's CUDA build; the host's is example_01_train_gpt "
              "(./tide demo)");
  }
#if defined(__CUDACC__)
  auto const presence = tide::cuda_presence_here();  // throws, naming it, for a broken runtime
  TIDE_REQUIRE(presence == tide::cuda_presence::device, "--backend cuda: no CUDA device here (",
               presence == tide::cuda_presence::no_driver ? "no CUDA driver" : "a driver, no device",
               "); ./tide demo trains on the host");
#endif
  auto const config = model_config(opt);
  TIDE_REQUIRE(opt.scheduler == "chunked" || opt.scheduler == "chunked-lru" || opt.scheduler == "layer-window" ||
                   opt.scheduler == "static" || opt.scheduler == "resident",
               "--scheduler ", opt.scheduler, ": pass chunked, chunked-lru, layer-window, static or resident");
  TIDE_REQUIRE(opt.host_budget == 0 || opt.scheduler == "chunked" || opt.scheduler == "chunked-lru", "--host-budget: "
               "the NVMe tier is part of the chunked schedulers; pass --scheduler chunked or chunked-lru");
  run_place const place = find_run_place(opt);  // before any work: a bad folder or --resume fails at once
  if (!opt.spill_folder.empty()) {
    std::error_code ec;
    fs::create_directories(opt.spill_folder, ec);
    TIDE_CHECK(!ec, io, "--spill-folder ", opt.spill_folder, ": cannot create it: ", ec.message());
    TIDE_CHECK(fs::is_directory(opt.spill_folder, ec), io, "--spill-folder ", opt.spill_folder, ": not a folder");
  }
  std::size_t const params = static_cast<std::size_t>(tide::nn::parameter_count(tide::nn::resolve(config)));
  std::size_t const model_data = 16 * params;  // parameters, gradients, AdamW m and v: fp32 each
  namespace off = tide::offload;
  // ~16 parameter chunks, each at least the largest tensor.
  std::size_t largest = 0;
  for (auto const& p : tide::nn::gpt_parameters(config, tide::dtype::f32)) largest = std::max(largest, p.bytes);
  std::size_t const chunk = tide::round_up(std::max(largest, params * sizeof(float) / 16), 64_KiB);
  // --host-budget is for the model data: the offloaded activations take their host copies from
  // the scheduler's pool too, so the budget grows by them and keeps them as its reserve.
  std::size_t const reserve =
      opt.host_budget != 0 && opt.offload_activations
          ? activation_plan(config, model_options(opt, config), opt.batch, opt.seq).host_bytes : 0;
  auto const chunked = [&]<class Policy>(Policy) {
    return off::chunked<Policy>{.chunk_bytes = chunk,
                                .memory = {.host_budget = opt.host_budget == 0 ? 0 : opt.host_budget + reserve,
                                           .spill_folder = opt.spill_folder,
                                           .host_reserve = reserve}};
  };
  if (opt.scheduler == "chunked") return run(opt, place, chunked(off::belady{}), config, model_data);
  if (opt.scheduler == "chunked-lru") return run(opt, place, chunked(off::lru{}), config, model_data);
  if (opt.scheduler == "layer-window") return run(opt, place, off::layer_window<>{}, config, model_data);
  if (opt.scheduler == "static") return run(opt, place, off::static_partition{.chunk_bytes = chunk}, config, model_data);
  return run(opt, place, off::resident{.chunk_bytes = chunk}, config, model_data);
}

// One line on stderr: "example_01_train_gpt: <message>", newlines folded.
int fail(std::string_view message) {
  std::string line(message);
  while (!line.empty() && line.back() == '\n') line.pop_back();
  for (std::size_t at = line.find('\n'); at != std::string::npos; at = line.find('\n', at))
    line.replace(at, 1, "; ");
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s\n", program, line.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return train_gpt(argc, argv);
  } catch (tide::error const& e) {
    return fail(e.message());
  } catch (fs::filesystem_error const& e) {
    return fail(e.what());
  } catch (std::bad_alloc const&) {
    return fail("out of memory; lower --budget, --batch or --seq");
  } catch (std::exception const& e) {
    return fail(e.what());
  }
}
