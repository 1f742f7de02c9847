// Finds the largest one-step rise of the training loss of the data-parallel demo's model
// (examples/04_data_parallel: GPT, 4 layers, 4 heads, 128 channels, bytes of the fortunes text) on
// one process, and exports the step that caused it for scripts/spike/replay.py, which recomputes
// that step in float64 PyTorch. See docs/training.md, "Loss spikes".
//
//   g++ -std=c++20 -O2 -march=native -Iinclude -DTIDE_HAS_BLAS=1
//       -isystem /usr/include/x86_64-linux-gnu/openblas-pthread
//       scripts/spike/spike_replay.cpp -o build/spike_replay -lopenblas -lpthread     (one line)
//   build/spike_replay OUT [--lr 2e-3] [--warmup 10] [--clip 0] [--beta2 0.95] [--steps 40]
//                          [--batch 16] [--seq 64] [--seed 1]
//   /usr/bin/python3 scripts/spike/replay.py OUT            (Debian: apt-get install python3-torch)
//
// OUT gets: before/ and after/ (every section of the checkpoints before and after the step, raw,
// "p_<name>", "m_<name>", "v_<name>"), batches (int32 tokens then targets, (B, T) each, of the
// step and of the one after it) and meta (the settings, one "key value" a line).

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <string>
#include <string_view>
#include <vector>

#include <tide/optim/adamw.hpp>
#include <tide/train/text_data.hpp>
#include <tide/train/trainer.hpp>

namespace {

using namespace tide::literals;
namespace fs = std::filesystem;
namespace tt = tide::train;

struct settings {
  float lr = 2e-3f, clip = 0.f, beta2 = 0.95f;
  int warmup = 10, steps = 40, batch = 16, seq = 64, seed = 1;
};

tide::nn::gpt_config config_of(settings const& s) {
  return {.layers = 4, .heads = 4, .channels = 128, .vocab = 256, .max_seq = s.seq};
}

auto make(settings const& s) {
  return tt::make_trainer(
      tide::nn::gpt_spec<tide::host>{.config = config_of(s), .options = {.seed = static_cast<std::uint64_t>(s.seed)}},
      tide::offload::resident{.device_budget = 256_MiB},
      tide::optim::adamw{.lr = s.lr, .beta2 = s.beta2, .clip_norm = s.clip, .decay_matrices_only = true,
                         .schedule = {.warmup_steps = s.warmup, .total_steps = s.steps}});
}

void export_checkpoint(fs::path const& file, fs::path const& dir) {
  fs::create_directories(dir);
  tt::checkpoint_reader r{file};
  for (auto const& name : r.sections()) {
    std::vector<std::byte> bytes(r.size_of(name));
    r.read(name, bytes);
    std::string flat = name;
    for (char& c : flat) if (c == '/') c = '_';
    std::ofstream(dir / flat, std::ios::binary).write(reinterpret_cast<char const*>(bytes.data()),
                                                     static_cast<std::streamsize>(bytes.size()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc % 2 != 0) {
    std::fprintf(stderr, "usage: spike_replay OUT [--lr X] [--warmup N] [--clip X] [--beta2 X] [--steps N] "
                         "[--batch B] [--seq T] [--seed N]\n");
    return 2;
  }
  fs::path const out = argv[1];
  settings s;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string_view const k = argv[i];
    char const* v = argv[i + 1];
    if (k == "--lr") s.lr = std::strtof(v, nullptr);
    else if (k == "--warmup") s.warmup = std::atoi(v);
    else if (k == "--clip") s.clip = std::strtof(v, nullptr);
    else if (k == "--beta2") s.beta2 = std::strtof(v, nullptr);
    else if (k == "--steps") s.steps = std::atoi(v);
    else if (k == "--batch") s.batch = std::atoi(v);
    else if (k == "--seq") s.seq = std::atoi(v);
    else if (k == "--seed") s.seed = std::atoi(v);
    else { std::fprintf(stderr, "spike_replay: unknown flag %s\n", argv[i]); return 2; }
  }
  int const B = s.batch, T = s.seq;
  auto const corpus = tt::byte_corpus::from_path(tt::fortunes_path());
  tt::window_loader loader{corpus, tt::split::train, B, T, 1, {0, 1}};
  std::vector<std::vector<std::int32_t>> in(static_cast<std::size_t>(s.steps)), tg(in.size());
  for (std::size_t k = 0; k < in.size(); ++k) {
    in[k].resize(std::size_t(B) * std::size_t(T));
    tg[k].resize(in[k].size());
    loader.next({in[k].data(), {B, T}}, {tg[k].data(), {B, T}});
  }
  auto step = [&](auto& t, int k) { return t.step({{in[std::size_t(k)].data(), {B, T}}, {tg[std::size_t(k)].data(), {B, T}}}); };

  // The run: the loss of every step (step k + 1's loss is measured before its own update).
  auto run = make(s);
  std::vector<float> loss, lr;
  for (int k = 0; k < s.steps; ++k) {
    auto const st = step(run, k);
    loss.push_back(st.loss);
    lr.push_back(st.lr);
    std::printf("%3d loss %.4f grad norm %.4f lr %.6f\n", k + 1, static_cast<double>(st.loss), st.grad_norm,
                static_cast<double>(st.lr));
  }
  int worst = 1;  // the step whose loss rose most above the step before it
  for (int k = 1; k < s.steps; ++k)
    if (loss[std::size_t(k)] - loss[std::size_t(k - 1)] > loss[std::size_t(worst)] - loss[std::size_t(worst - 1)]) worst = k;
  // worst is 0-based: its loss is measured after the update of step worst (1-based), which used
  // batch worst - 1 (0-based). Replay that update from a fresh run of the same steps.
  int const cause = worst;  // 1-based number of the update that caused the rise
  std::printf("largest rise: step %d, %.4f -> %.4f; caused by the update of step %d (lr %.6g)\n", worst + 1,
              static_cast<double>(loss[std::size_t(worst - 1)]), static_cast<double>(loss[std::size_t(worst)]), cause,
              static_cast<double>(lr[std::size_t(cause - 1)]));
  auto again = make(s);
  for (int k = 0; k < cause - 1; ++k) (void)step(again, k);
  fs::create_directories(out);
  again.save(out / "before.tide");
  auto const st = step(again, cause - 1);
  again.save(out / "after.tide");
  export_checkpoint(out / "before.tide", out / "before");
  export_checkpoint(out / "after.tide", out / "after");
  std::ofstream batches(out / "batches", std::ios::binary);
  for (int k : {cause - 1, cause}) {
    batches.write(reinterpret_cast<char const*>(in[std::size_t(k)].data()), static_cast<std::streamsize>(in[std::size_t(k)].size() * 4));
    batches.write(reinterpret_cast<char const*>(tg[std::size_t(k)].data()), static_cast<std::streamsize>(tg[std::size_t(k)].size() * 4));
  }
  auto const c = config_of(s);
  std::ofstream(out / "meta") << std::setprecision(9) << "layers " << c.layers << "\nheads " << c.heads << "\nchannels " << c.channels
                              << "\nvocab " << c.vocab << "\nbatch " << B << "\nseq " << T << "\nstep " << cause
                              << "\nlr " << st.lr << "\nbeta1 0.9\nbeta2 " << s.beta2 << "\neps 1e-08\nweight_decay 0.1"
                              << "\nclip " << s.clip << "\nloss_before " << st.loss << "\nloss_next "
                              << loss[std::size_t(worst)] << "\n";
  std::printf("wrote %s\n", out.c_str());
}
