// 01_train_gpt (`./tide demo`): a byte-level GPT trained on real text, on the CPU, with its model
// data offloaded: the device budget is smaller than the parameters, gradients and AdamW state.
//
// Everything is a tide part assembled by tide::train::make_trainer: tide::nn::gpt (forward,
// explicit backward, sampling), an offload scheduler (chunked<belady> by default: PatrickStar's
// chunks moved by the warm-up trace), tide::optim::adamw (warm-up + cosine, clipping at 1.0, no
// decay on biases and gains), checkpoints, and the reports (a progress line, SVG pictures).
//
//   example_01_train_gpt [--steps 1000] [--model small] [--budget auto] [--scheduler chunked]
//                        [--data PATH] [--checkpoint-dir tide-run] [--checkpoint-every 100]
//                        [--resume] [--batch 4] [--seq 128] [--lr 2e-3] [--warmup 30] [--seed 1337]
//                        [--threads 2] [--eval-every 100] [--sample 200] [--prompt TEXT]
//                        [--check-falls MARGIN]
//
// Exit 2 with tide::error's message on bad input; --check-falls M: exit 1 unless the mean loss
// of the last 5 steps is below the first step's minus M (the suite's smoke test).

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
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
#include <tide/train/trainer.hpp>

using namespace tide::literals;
using tide::index_t;
namespace fs = std::filesystem;

namespace {

struct options {
  int steps = 1000, batch = 2, seq = 128;
  std::string model = "small", scheduler = "chunked", data, checkpoint_dir = "tide-run";
  std::string budget = "auto";
  int checkpoint_every = 100, eval_every = 100, warmup = 30, threads = 2, sample = 200;
  bool resume = false;
  float lr = 2e-3f;
  std::uint64_t seed = 1337;
  std::string prompt = "The ";
  double check_falls = -1;
};

constexpr char const* usage_text =
    "example_01_train_gpt (./tide demo): a byte-level GPT on text, model data offloaded\n"
    "  --steps N            training steps (1000)\n"
    "  --model NAME         tiny (L2 C64), small (L4 C256, default), medium (L6 C384)\n"
    "  --budget SIZE|auto   device budget, e.g. 48MiB; auto: activations + a quarter of the model data\n"
    "  --scheduler NAME     chunked (belady, default), chunked-lru, layer-window, static, resident\n"
    "  --data PATH          a text file or a folder of them (default: the fortunes corpus)\n"
    "  --checkpoint-dir DIR checkpoints and pictures (tide-run)\n"
    "  --checkpoint-every N steps between checkpoints, 0 for none (100)\n"
    "  --resume             continue from DIR/checkpoint.tide\n"
    "  --batch N --seq N    sequences per step (4) and their length (128)\n"
    "  --lr X --warmup N    peak learning rate (2e-3), warm-up steps (30); cosine to lr/10\n"
    "  --seed N --threads N initialisation and data order (1337), threads (2)\n"
    "  --eval-every N       validation loss every N steps (100)\n"
    "  --sample N           bytes generated at the end (200); --prompt TEXT (\"The \")\n"
    "  --check-falls M      exit 1 unless the last 5 steps' mean loss < the first loss - M\n";

template <class N>
N number(std::string_view flag, std::string_view text) {
  N value{};
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TIDE_CHECK(ec == std::errc{} && end == text.data() + text.size(), usage, flag, " wants a number, got '", text, "'");
  return value;
}

// "48MiB", "1GiB", "50000000".
std::size_t bytes_from(std::string_view text) {
  std::size_t unit = 1;
  for (auto const& [suffix, u] : {std::pair{"KiB", 1_KiB}, std::pair{"MiB", 1_MiB}, std::pair{"GiB", 1_GiB}})
    if (text.ends_with(suffix)) {
      unit = u;
      text.remove_suffix(3);
      break;
    }
  return static_cast<std::size_t>(number<double>("--budget", text) * static_cast<double>(unit));
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view const k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    }
    if (k == "--resume") {
      o.resume = true;
      continue;
    }
    TIDE_CHECK(i + 1 < argc, usage, "flag ", k, " has no value; --help lists the flags");
    std::string_view const v = argv[++i];
    if (k == "--steps") o.steps = number<int>(k, v);
    else if (k == "--model") o.model = v;
    else if (k == "--budget") o.budget = v;
    else if (k == "--scheduler") o.scheduler = v;
    else if (k == "--data") o.data = v;
    else if (k == "--checkpoint-dir") o.checkpoint_dir = v;
    else if (k == "--checkpoint-every") o.checkpoint_every = number<int>(k, v);
    else if (k == "--batch") o.batch = number<int>(k, v);
    else if (k == "--seq") o.seq = number<int>(k, v);
    else if (k == "--lr") o.lr = number<float>(k, v);
    else if (k == "--warmup") o.warmup = number<int>(k, v);
    else if (k == "--seed") o.seed = number<std::uint64_t>(k, v);
    else if (k == "--threads") o.threads = number<int>(k, v);
    else if (k == "--eval-every") o.eval_every = number<int>(k, v);
    else if (k == "--sample") o.sample = number<int>(k, v);
    else if (k == "--prompt") o.prompt = v;
    else if (k == "--check-falls") o.check_falls = number<double>(k, v);
    else TIDE_FAIL(usage, "unknown flag ", k, "; --help lists the flags");
  }
  TIDE_REQUIRE(o.steps >= 1 && o.batch >= 1 && o.seq >= 1 && o.threads >= 1 && o.eval_every >= 1,
               "--steps, --batch, --seq, --threads and --eval-every must be at least 1");
  TIDE_REQUIRE(o.warmup >= 0 && o.sample >= 0 && o.checkpoint_every >= 0,
               "--warmup, --sample and --checkpoint-every must be >= 0");
  TIDE_REQUIRE(o.lr > 0.f && std::isfinite(o.lr), "--lr must be positive, got ", o.lr);
  return o;
}

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

// Bytes of the activations of one (B, T) step: the non-model data the budget must also hold.
std::size_t activation_bytes(tide::nn::gpt_config const& config, int B, int T) {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 2_GiB}};
  tide::nn::gpt<tide::host> model{config, arena, {}};
  std::vector<std::int32_t> zeros(std::size_t(B) * std::size_t(T), 0);
  model.forward(ex, tide::tensor_view<std::int32_t const>(zeros.data(), {B, T}));
  return tide::round_up(model.activations().footprint, 256);
}

// auto: the activations plus a quarter of the model data, or the scheduler's own minimum plus
// two chunks if that is more (the scheduler says what its minimum is made of).
template <class Offload>
std::size_t auto_budget(tide::nn::gpt_config const& config, Offload const& offload, std::size_t activations,
                        std::size_t model_data) {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 1_MiB}};
  tide::offload::scheduler<tide::host, float, Offload> const probe{
      ex, arena, tide::nn::gpt_parameters(config, tide::dtype::f32), tide::nn::gpt_block_uses(config), offload};
  return std::max(activations + model_data / 4, probe.minimum_device_bytes(activations) + 2 * probe.chunk_bytes());
}

template <class Offload>
int run(options const& opt, Offload offload, tide::nn::gpt_config const& config, std::size_t model_data) {
  std::size_t const budget = opt.budget == "auto"
                                 ? auto_budget(config, offload, activation_bytes(config, opt.batch, opt.seq), model_data)
                                 : bytes_from(opt.budget);
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

  auto trainer = tide::train::make_trainer(
      tide::nn::gpt_spec<tide::host>{.config = config, .options = {.seed = opt.seed}}, offload,
      tide::optim::adamw{.lr = opt.lr,
                         .beta2 = 0.99f,
                         .weight_decay = 0.1f,
                         .clip_norm = 1.f,
                         .decay_matrices_only = true,
                         .schedule = {.warmup_steps = opt.warmup, .total_steps = opt.steps}},
      tide::train::no_comm{}, tide::train::no_compress{}, tide::train::no_pipeline{});
  auto& model = trainer.model();
  auto& sched = trainer.scheduler();
  fs::path const dir = opt.checkpoint_dir;
  fs::create_directories(dir);
  fs::path const ckpt = dir / "checkpoint.tide";

  std::printf("corpus: %zu bytes from %s\n", corpus.bytes().size(),
              opt.data.empty() ? tide::train::fortunes_path().c_str() : opt.data.c_str());
  std::printf("model: L=%d NH=%d C=%d T=%d, %.2fM parameters; model data %.1f MiB (16 B/param in chunks of %.2f MiB)\n",
              config.layers, config.heads, config.channels, opt.seq,
              double(tide::nn::parameter_count(tide::nn::resolve(config))) / 1e6, double(model_data) / double(1_MiB),
              double(sched.chunk_bytes()) / double(1_MiB));
  std::printf("offload: %s, device budget %.1f MiB (%.0f%% of the model data), B=%d, %d threads\n",
              decltype(trainer)::scheduler_type::name().c_str(), double(budget) / double(1_MiB),
              100.0 * double(budget) / double(model_data), opt.batch, opt.threads);

  std::uint64_t position = 0;
  if (opt.resume) {
    trainer.load(ckpt, [&](tide::train::checkpoint_reader const& r) { position = r.read_value<std::uint64_t>("data.position"); });
    train.seek(position);
    std::printf("resumed from %s at step %lld\n", ckpt.c_str(), static_cast<long long>(trainer.steps()));
  }
  std::fflush(stdout);

  auto evaluate = [&] {
    sched.begin_evaluation();
    double sum = 0;
    for (auto const& b : validation) sum += model.forward(trainer.executor(), b.tokens(), b.labels());
    sched.end_evaluation();
    return sum / validation_batches;
  };

  tide::train::progress progress{stdout};
  batch current(opt.batch, opt.seq);
  std::vector<float> losses;
  std::vector<std::pair<std::int64_t, float>> validation_losses;
  double const first_validation = evaluate();
  validation_losses.emplace_back(trainer.steps(), float(first_validation));
  std::printf("step %5lld  validation loss %.4f\n", static_cast<long long>(trainer.steps()), first_validation);
  double train_seconds = 0;
  std::size_t tokens = 0;
  tide::train::step_stats last{};
  tide::offload::trace_recorder timeline;  // the last step's, as Chrome trace-event JSON
  while (trainer.steps() < opt.steps) {
    train.next(current.in(), current.out());
    if (trainer.steps() == opt.steps - 1) sched.set_trace(&timeline);
    last = trainer.step(typename decltype(trainer)::batch_type{current.tokens(), current.labels()});
    TIDE_CHECK(std::isfinite(last.loss), usage, "the training loss is ", last.loss, " at step ", last.step,
               "; lower --lr (now ", opt.lr, ")");
    losses.push_back(last.loss);
    if (last.step > 1) {  // the warm-up step records the trace: not representative
      train_seconds += last.seconds;
      tokens += last.tokens;
    }
    progress.update(last, opt.steps);
    bool const at_eval = last.step % opt.eval_every == 0 || last.step == opt.steps;
    if (at_eval) {
      double const v = evaluate();
      validation_losses.emplace_back(last.step, float(v));
      char extra[64];
      std::snprintf(extra, sizeof extra, "  validation %.4f", v);
      progress.line(last, opt.steps, extra);
    } else if (!progress.terminal() && last.step % 20 == 0) {
      progress.line(last, opt.steps);
    }
    if (opt.checkpoint_every > 0 && (last.step % opt.checkpoint_every == 0 || last.step == opt.steps)) {
      std::uint64_t const pos = train.position();
      trainer.save(ckpt, [&](tide::train::checkpoint_writer& w) { w.add_value("data.position", pos); });
    }
  }
  if (losses.empty()) {
    std::printf("nothing to train: the checkpoint is at step %lld of %d\n", static_cast<long long>(trainer.steps()),
                opt.steps);
    return 0;
  }

  sched.set_trace(nullptr);
  auto const tide_svg = dir / "memory-tide.svg", loss_svg = dir / "loss.svg", trace_json = dir / "step-trace.json";
  timeline.write(trace_json.string(), decltype(trainer)::scheduler_type::name() + ", the last step of the demo");
  tide::offload::write_file(tide_svg.string(),
                            tide::offload::memory_tide_svg(sched.memory_tide(), decltype(trainer)::scheduler_type::name() +
                                                                                    ", one step of the demo"));
  tide::offload::write_file(loss_svg.string(), tide::train::loss_svg(losses, validation_losses, "01_train_gpt loss"));

  std::size_t const tail = std::min<std::size_t>(5, losses.size());
  double const last_mean = std::accumulate(losses.end() - std::ptrdiff_t(tail), losses.end(), 0.0) / double(tail);
  auto const& off = last.offload;
  std::printf("\ntrain loss: first %.4f, mean of the last %zu steps %.4f (ln 256 = %.4f)\n", double(losses.front()),
              tail, last_mean, std::log(256.0));
  std::printf("validation loss: %.4f before, %.4f after\n", first_validation, double(validation_losses.back().second));
  std::printf("%.0f tokens/s after the warm-up step; last step moved %.1f MiB (%zu fetches, %zu evictions, %zu "
              "prefetch hits), stalled %.1f ms; device peak %.1f of %.1f MiB; %.2f GB moved in all\n",
              train_seconds > 0 ? double(tokens) / train_seconds : 0.0, double(off.bytes_moved()) / double(1_MiB),
              off.fetches, off.evictions, off.prefetch_hits, off.stall_ms, double(off.peak_device_bytes) / double(1_MiB),
              double(budget) / double(1_MiB), progress.gb_moved());
  std::printf("pictures: %s (memory tide of the last step), %s (loss); timeline: %s (open in ui.perfetto.dev)\n",
              tide_svg.c_str(), loss_svg.c_str(), trace_json.c_str());
  if (opt.checkpoint_every > 0) std::printf("checkpoint: %s (resume with --resume)\n", ckpt.c_str());

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

}  // namespace

int main(int argc, char** argv) try {
  options const opt = parse(argc, argv);
  auto const config = model_config(opt);
  std::size_t const params = static_cast<std::size_t>(tide::nn::parameter_count(tide::nn::resolve(config)));
  std::size_t const model_data = 16 * params;  // parameters, gradients, AdamW m and v: fp32 each
  namespace off = tide::offload;
  // ~16 parameter chunks, each at least the largest tensor.
  std::size_t largest = 0;
  for (auto const& p : tide::nn::gpt_parameters(config, tide::dtype::f32)) largest = std::max(largest, p.bytes);
  std::size_t const chunk = tide::round_up(std::max(largest, params * sizeof(float) / 16), 64_KiB);
  if (opt.scheduler == "chunked") return run(opt, off::chunked<off::belady>{.chunk_bytes = chunk}, config, model_data);
  if (opt.scheduler == "chunked-lru") return run(opt, off::chunked<off::lru>{.chunk_bytes = chunk}, config, model_data);
  if (opt.scheduler == "layer-window") return run(opt, off::layer_window<>{}, config, model_data);
  if (opt.scheduler == "static") return run(opt, off::static_partition{.chunk_bytes = chunk}, config, model_data);
  if (opt.scheduler == "resident") return run(opt, off::resident{.chunk_bytes = chunk}, config, model_data);
  TIDE_FAIL(usage, "--scheduler ", opt.scheduler, ": pass chunked, chunked-lru, layer-window, static or resident");
} catch (tide::error const& e) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
