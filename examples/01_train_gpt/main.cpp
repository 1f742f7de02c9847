// 01_train_gpt: a small GPT-2 trained on real text, on the CPU.
//
// Byte-level (vocabulary 256) language model over the `fortunes` corpus (or any file or folder
// given with --data), trained with AdamW, a linear warm-up then a cosine decay of the learning
// rate, and global-norm clipping at 1.0. Every piece is a tide part: tide::nn::gpt (forward,
// explicit backward, sampling), tide::kernels::adamw and global_grad_norm, tide::train's corpus
// and seeded window loader. The model's memory (parameters, gradients, activations) comes from
// one budgeted tide::memory::device_arena; the AdamW moments live in host memory.
//
//   example_01_train_gpt [--steps 500] [--layers 4] [--channels 256] [--heads 4] [--seq 128]
//                        [--batch 8] [--lr 2e-3] [--warmup 30] [--beta2 0.99] [--weight-decay 0.1]
//                        [--data PATH] [--seed 1337] [--threads 2] [--eval-every 50]
//                        [--log-every 10] [--sample 200] [--prompt TEXT] [--check-falls MARGIN]
//
// --check-falls MARGIN: exit 1 unless the mean training loss of the last 5 steps is below the
// first step's loss minus MARGIN (the suite's smoke test runs a tiny model with it).
// Exit 2 with tide::error's message on bad input.

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numbers>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>  // isatty: progress in place on a terminal only

#include <tide/core/exec.hpp>
#include <tide/kernels/adamw/adamw.hpp>
#include <tide/kernels/grad_norm/grad_norm.hpp>
#include <tide/memory/device_arena.hpp>
#include <tide/nn/gpt.hpp>
#include <tide/train/text_data.hpp>

using namespace tide::literals;
using tide::index_t;

namespace {

struct options {
  // Measured to reach a validation loss below 2.5 in about two minutes on 2 cores (docs/training.md);
  // GPT-2's shape at L=6 C=384 learns more per token but runs 3x fewer tokens/s.
  int steps = 500, layers = 4, channels = 256, heads = 4, seq = 128, batch = 8;
  float lr = 2e-3f, beta2 = 0.99f, weight_decay = 0.1f;
  int warmup = 30;
  std::string data;  // empty: the fortunes corpus
  std::uint64_t seed = 1337;
  int threads = 2, eval_every = 50, log_every = 10, sample = 200;
  std::string prompt = "The ";
  double check_falls = -1;  // < 0: no check
};

constexpr std::string_view flags_text =
    "flags: --steps --layers --channels --heads --seq --batch --lr --warmup --beta2 --weight-decay --data --seed "
    "--threads --eval-every --log-every --sample --prompt --check-falls";

template <class N>
N number(std::string_view flag, std::string_view text) {
  N value{};
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TIDE_CHECK(ec == std::errc{} && end == text.data() + text.size(), usage, flag, " wants a number, got '", text,
             "'");
  return value;
}

constexpr char const* usage_text =
    "example_01_train_gpt: train a byte-level GPT on text (default: the fortunes corpus)\n"
    "  --steps N        training steps (500)\n"
    "  --layers N       transformer blocks (4)\n"
    "  --channels N     width C, a multiple of --heads (256)\n"
    "  --heads N        attention heads (4)\n"
    "  --seq N          context length T (128)\n"
    "  --batch N        sequences per step B (8)\n"
    "  --lr X           peak learning rate (2e-3): linear warm-up, then cosine to lr/10\n"
    "  --warmup N       warm-up steps (30)\n"
    "  --beta2 X        AdamW beta2 (0.99)\n"
    "  --weight-decay X on 2-D weights only (0.1)\n"
    "  --data PATH      a text file or a folder of them (default /usr/share/games/fortunes)\n"
    "  --seed N         initialisation and data order (1337)\n"
    "  --threads N      threads of the pool (2)\n"
    "  --eval-every N   validation loss every N steps, 4 fixed batches (50)\n"
    "  --log-every N    one line per N steps (10)\n"
    "  --sample N       bytes generated at the end, 0 for none (200)\n"
    "  --prompt TEXT    the sample's prompt (\"The \")\n"
    "  --check-falls M  exit 1 unless the last 5 steps' mean loss < the first loss - M\n";

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; i += 2) {
    std::string_view const k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    }
    TIDE_CHECK(i + 1 < argc, usage, "flag ", k, " has no value; ", flags_text);
    std::string_view const v = argv[i + 1];
    if (k == "--steps") o.steps = number<int>(k, v);
    else if (k == "--layers") o.layers = number<int>(k, v);
    else if (k == "--channels") o.channels = number<int>(k, v);
    else if (k == "--heads") o.heads = number<int>(k, v);
    else if (k == "--seq") o.seq = number<int>(k, v);
    else if (k == "--batch") o.batch = number<int>(k, v);
    else if (k == "--lr") o.lr = number<float>(k, v);
    else if (k == "--warmup") o.warmup = number<int>(k, v);
    else if (k == "--beta2") o.beta2 = number<float>(k, v);
    else if (k == "--weight-decay") o.weight_decay = number<float>(k, v);
    else if (k == "--data") o.data = v;
    else if (k == "--seed") o.seed = number<std::uint64_t>(k, v);
    else if (k == "--threads") o.threads = number<int>(k, v);
    else if (k == "--eval-every") o.eval_every = number<int>(k, v);
    else if (k == "--log-every") o.log_every = number<int>(k, v);
    else if (k == "--sample") o.sample = number<int>(k, v);
    else if (k == "--prompt") o.prompt = v;
    else if (k == "--check-falls") o.check_falls = number<double>(k, v);
    else TIDE_FAIL(usage, "unknown flag ", k, "; ", flags_text);
  }
  TIDE_REQUIRE(o.steps >= 1 && o.batch >= 1 && o.seq >= 1 && o.threads >= 1,
               "--steps, --batch, --seq and --threads must be at least 1");
  TIDE_REQUIRE(o.eval_every >= 1 && o.log_every >= 1, "--eval-every and --log-every must be at least 1");
  TIDE_REQUIRE(o.warmup >= 0 && o.sample >= 0, "--warmup and --sample must be >= 0");
  TIDE_REQUIRE(o.lr > 0.f && std::isfinite(o.lr), "--lr must be positive, got ", o.lr);
  TIDE_REQUIRE(!o.prompt.empty(), "--prompt must not be empty");
  return o;  // the model checks layers, heads and channels (C a multiple of NH, ...)
}

// Linear warm-up to lr over `warmup` steps, then a cosine decay to lr / 10 at the last step.
float learning_rate(options const& o, int step) {  // step = 1 .. steps
  if (step <= o.warmup) return o.lr * static_cast<float>(step) / static_cast<float>(o.warmup);
  double const span = std::max(1, o.steps - o.warmup);
  double const progress = std::min(1.0, static_cast<double>(step - o.warmup) / span);
  double const cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return static_cast<float>(o.lr * (0.1 + 0.9 * cosine));
}

// Printable ASCII as it is, every other byte but newline and tab as '?', so a sample is always
// valid text (a half-learned model emits broken UTF-8 sequences).
std::string printable(std::vector<std::int32_t> const& ids) {
  std::string s;
  for (auto id : ids) {
    auto const c = static_cast<unsigned char>(id);
    s += (c >= 32 && c < 127) || c == '\n' || c == '\t' ? static_cast<char>(c) : '?';
  }
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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

}  // namespace

int main(int argc, char** argv) try {
  options const opt = parse(argc, argv);
  bool const tty = isatty(fileno(stdout)) != 0;

  auto const corpus = tide::train::byte_corpus::from_path(opt.data.empty() ? tide::train::fortunes_path()
                                                                           : std::filesystem::path(opt.data));
  tide::train::window_loader train{corpus, tide::train::split::train, opt.batch, opt.seq, opt.seed};
  // Validation: a few fixed batches, the same at every evaluation.
  constexpr int validation_batches = 4;
  std::vector<batch> validation;
  {
    tide::train::window_loader loader{corpus, tide::train::split::validation, opt.batch, opt.seq, opt.seed + 1};
    for (int i = 0; i < validation_batches; ++i) {
      validation.emplace_back(opt.batch, opt.seq);
      loader.next(validation.back().in(), validation.back().out());
    }
  }

  tide::nn::gpt_config const config{.layers = opt.layers, .heads = opt.heads, .channels = opt.channels,
                                    .vocab = 256, .max_seq = opt.seq};
  auto const resolved = tide::nn::resolve(config);  // refuses impossible configs with the reason
  // Budget: parameters, gradients, and a bound on the activations: per block and position the
  // 20 planned tensors hold 28 C + NH + 4 floats (live or not), rounded up to 32 C; around the
  // blocks the logits (Vp) and a few (B, T, C); the slack covers each tensor's alignment.
  std::size_t const param_bytes = static_cast<std::size_t>(tide::nn::parameter_count(resolved)) * sizeof(float);
  std::size_t const positions = std::size_t(opt.batch) * std::size_t(opt.seq);
  std::size_t const act_bytes =
      positions * sizeof(float) *
      (std::size_t(opt.layers) * 32 * std::size_t(opt.channels) + 2 * std::size_t(resolved.padded_vocab) +
       16 * std::size_t(opt.channels) + 64);
  std::size_t const budget = 2 * param_bytes + act_bytes + 8_MiB;

  tide::thread_pool pool{opt.threads};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = budget}};
  tide::nn::gpt<tide::host> model{config, arena, {.seed = opt.seed}};
  model.zero_grad(ex);  // allocates the gradients: their pointers are needed for the optimizer list

  // AdamW moments, one flat buffer laid out as the parameters; weight decay only on the 2-D
  // weights (GPT-2's practice: no decay on biases and LayerNorm), so two lists of tensors.
  auto const n = static_cast<std::size_t>(model.flat_params().size());
  std::vector<float> moments(2 * n, 0.f);
  std::vector<tide::kernels::adamw_tensor<float>> decayed, plain;
  for (auto const& p : model.parameters()) {
    std::size_t const at = p.offset / sizeof(float);
    tide::kernels::adamw_tensor<float> const record{.p = model.param(p).data(),
                                                    .g = model.grad(p).data(),
                                                    .m = moments.data() + at,
                                                    .v = moments.data() + n + at,
                                                    .working = nullptr,
                                                    .n = p.numel()};
    (p.shape.rank == 2 ? decayed : plain).push_back(record);
  }

  std::printf("corpus: %zu bytes (%zu train, %zu validation) from %s\n", corpus.bytes().size(),
              corpus.part(tide::train::split::train).size(), corpus.part(tide::train::split::validation).size(),
              opt.data.empty() ? tide::train::fortunes_path().c_str() : opt.data.c_str());
  std::printf("model: L=%d NH=%d C=%d V=256 T=%d, %.2fM parameters; B=%d, %d threads\n", opt.layers, opt.heads,
              opt.channels, opt.seq, double(tide::nn::parameter_count(resolved)) / 1e6, opt.batch, opt.threads);
  std::printf("AdamW lr %g (warm-up %d steps, cosine to lr/10), beta2 %g, weight decay %g on 2-D weights, "
              "clip 1.0\n",
              double(opt.lr), opt.warmup, double(opt.beta2), double(opt.weight_decay));
  std::fflush(stdout);

  auto evaluate = [&] {
    double sum = 0;
    for (auto const& b : validation) sum += model.forward(ex, b.tokens(), b.labels());
    return sum / validation_batches;
  };

  batch current(opt.batch, opt.seq);
  std::vector<float> losses;
  losses.reserve(std::size_t(opt.steps));
  double const first_validation = evaluate();
  double last_validation = first_validation;
  std::printf("step %5d  validation loss %.4f\n", 0, first_validation);
  double train_seconds = 0, group_seconds = 0;
  auto const run_start = std::chrono::steady_clock::now();
  for (int step = 1; step <= opt.steps; ++step) {
    auto const t0 = std::chrono::steady_clock::now();
    train.next(current.in(), current.out());
    model.zero_grad(ex);
    float const loss = model.forward(ex, current.tokens(), current.labels());
    TIDE_CHECK(std::isfinite(loss), usage, "the training loss is ", loss, " at step ", step,
               "; lower --lr (now ", opt.lr, ")");
    model.backward(ex);
    double const norm = tide::kernels::global_grad_norm(ex, model.flat_grads());
    float const clip = tide::kernels::clip_scale(norm, 1.0f);
    float const lr = learning_rate(opt, step);
    tide::kernels::adamw(ex, {.lr = lr, .beta2 = opt.beta2, .weight_decay = opt.weight_decay}, step, decayed, clip);
    tide::kernels::adamw(ex, {.lr = lr, .beta2 = opt.beta2, .weight_decay = 0.f}, step, plain, clip);
    double const dt = seconds_since(t0);
    train_seconds += dt;
    group_seconds += dt;
    losses.push_back(loss);

    if (tty)
      std::printf("\rstep %5d/%d  loss %.4f  |g| %.3f  lr %.2e  %.0f tok/s   ", step, opt.steps, double(loss), norm,
                  double(lr), double(positions) / dt);
    if (step % opt.log_every == 0 || step == opt.steps) {
      int const group = (step - 1) % opt.log_every + 1;
      double const mean = std::accumulate(losses.end() - group, losses.end(), 0.0) / group;
      std::printf("%sstep %5d  train loss %.4f  lr %.2e  %6.0f tok/s", tty ? "\r\033[K" : "", step, mean, double(lr),
                  double(positions) * group / group_seconds);
      group_seconds = 0;
      if (step % opt.eval_every == 0 || step == opt.steps) {
        last_validation = evaluate();
        std::printf("  validation loss %.4f", last_validation);
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }

  std::size_t const tail = std::min<std::size_t>(5, losses.size());
  double const last_mean = std::accumulate(losses.end() - std::ptrdiff_t(tail), losses.end(), 0.0) / double(tail);
  std::printf("\ntrain loss: first %.4f, mean of the last %zu steps %.4f (ln 256 = %.4f)\n", double(losses.front()),
              tail, last_mean, std::log(256.0));
  std::printf("validation loss: %.4f before training, %.4f after\n", first_validation, last_validation);
  std::printf("%d steps in %.1f s (%.1f s training): %.0f tokens/s; arena peak %.1f of %.1f MiB\n", opt.steps,
              seconds_since(run_start), train_seconds, double(positions) * opt.steps / train_seconds,
              double(arena.stats().peak) / double(1_MiB), double(budget) / double(1_MiB));

  if (opt.sample > 0) {
    std::vector<std::int32_t> prompt;
    for (unsigned char c : opt.prompt) prompt.push_back(c);
    auto const t0 = std::chrono::steady_clock::now();
    auto const text = model.generate(ex, prompt, opt.sample, 0.8f, opt.seed);
    std::printf("sample (%d bytes, temperature 0.8, %.1f s):\n---\n%s\n---\n", opt.sample, seconds_since(t0),
                printable(text).c_str());
  }

  if (opt.check_falls >= 0) {
    bool const fell = last_mean < double(losses.front()) - opt.check_falls;
    std::printf("check: last-%zu mean %.4f %s first loss %.4f - %.2f\n", tail, last_mean, fell ? "<" : ">=",
                double(losses.front()), opt.check_falls);
    return fell ? 0 : 1;
  }
  return 0;
} catch (tide::error const& e) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
