// bench_compress: gradient compression's selection, and compressed training on 2 ranks.
//
//   <selector>_vs_nth_element  choosing 0.1 % of 25 M floats (a GPT-2 124M layer group's
//                              gradients, k = 25,000) by magnitude: elements per second of each
//                              selector of compress/select.hpp (on the machine's threads),
//                              against std::nth_element over a copy of the magnitudes (one
//                              thread; the copy is not timed), same run. threshold_search's goal
//                              is 5x. sort_vs_nth_element: a full std::sort of the same copy.
//
// The values: normal-like gradients (a sum of uniforms) with a heavy tail, fixed seed.
//
// Then the program runs itself under `mpiexec -n 2` (bench/mpi_launch.hpp) and trains the GPT of
// examples/04 (4 layers, C 128, byte vocabulary, T 64, batch 4 per rank) on the fortunes text,
// resident, AdamW, the same batches in every setting: dense data parallelism, sparse error
// feedback (sampled_threshold) at densities 0.1, 0.01 and 0.001 (DGC's warm-up: 0.25 and / 4 per
// stage of 20 steps), PowerSGD at ranks 1, 2 and 4.
//
//   wire_bytes_<setting>_vs_dense  the bytes a rank sends per step (pairs of 8 B, or ring
//                                  all-reduces of P and Q), against the ring all-reduce of the
//                                  dense run's gradients (2 (W-1) / W of the bytes it summed),
//                                  same run. Lower is better. Not counted: the sparse all-gather's
//                                  one count per rank.
//   loss_vs_dense                  the mean global loss of the last 10 % of the steps at density
//                                  0.01, against dense's (goal <= 1.03); the other settings' ratios
//                                  in its detail. TIDE_BENCH_SVG=FILE draws every setting's loss
//                                  curve (a running mean of 10 steps) in one picture.
//
// 1,200 steps per setting (TIDE_BENCH_STEPS=N for another count): about 40 ms a step here.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "harness.hpp"
#include "mpi_launch.hpp"
#include "tide/comm/data_parallel.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/compress/select.hpp"
#include "tide/compress/sink.hpp"
#include "tide/offload/report.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/train/report.hpp"
#include "tide/train/text_data.hpp"
#include "tide/train/trainer.hpp"

namespace {

std::vector<float> gradients(std::size_t n) {
  std::vector<float> x(n);
  std::uint32_t s = 12345u;
  auto next = [&] {
    s ^= s << 13, s ^= s >> 17, s ^= s << 5;
    return static_cast<float>(s >> 8) / 16777216.f;
  };
  for (auto& v : x) {
    float const g = next() + next() + next() - 1.5f;
    v = next() < 0.01f ? g * 20.f : g;
  }
  return x;
}

// Seconds per call, median of reps; `prepare` runs untimed before each call.
template <class Prepare, class F>
double timed(int reps, Prepare&& prepare, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps + 1; ++i) {
    prepare();
    auto const t0 = std::chrono::steady_clock::now();
    f();
    if (i > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::ranges::sort(t);
  return t[t.size() / 2];
}

// ---- compressed training on 2 ranks ----------------------------------------------------------

constexpr tide::nn::gpt_config config{.layers = 4, .heads = 4, .channels = 128, .vocab = 256, .max_seq = 64};
constexpr int batch = 4, seq = 64;

struct run_result {
  std::string label;
  std::vector<float> loss{};  // the global loss (mean over the ranks) of every step
  double wire_per_step = 0;   // bytes this rank sent per step
  double summed_per_step = 0; // gradient bytes this rank summed per step (the dense run's)
  double seconds = 0;
  [[nodiscard]] double tail_loss() const {  // the mean of the last 10 % of the steps
    std::size_t const from = loss.size() - std::max<std::size_t>(1, loss.size() / 10);
    double s = 0;
    for (std::size_t i = from; i < loss.size(); ++i) s += loss[i];
    return s / static_cast<double>(loss.size() - from);
  }
};

template <class Comm>
run_result train_with(tide::comm::mpi& world, tide::train::byte_corpus const& corpus, Comm const& comm, int steps,
                      std::string label) {
  tide::train::window_loader loader{corpus, tide::train::split::train, batch, seq, 1, {world.rank(), world.size()}};
  auto t = tide::train::make_trainer(
      tide::nn::gpt_spec<tide::host>{.config = config, .options = {.seed = 1}}, tide::offload::resident{},
      tide::optim::adamw{.lr = 2e-3f, .decay_matrices_only = true, .schedule = {.warmup_steps = 10, .total_steps = steps}},
      comm);
  std::vector<std::int32_t> in(std::size_t{batch} * seq), tg(in.size());
  run_result r{.label = std::move(label)};
  world.barrier();
  auto const t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    loader.next({in.data(), {batch, seq}}, {tg.data(), {batch, seq}});
    float loss = t.step({{in.data(), {batch, seq}}, {tg.data(), {batch, seq}}}).loss / static_cast<float>(world.size());
    world.all_reduce(std::span<float>(&loss, 1), tide::comm::reduce_op::sum);
    r.loss.push_back(loss);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto const st = t.scheduler().sink().stats();
  if constexpr (requires { st.wire_bytes; }) r.wire_per_step = static_cast<double>(st.wire_bytes) / steps;
  else r.summed_per_step = static_cast<double>(st.bytes) / steps;
  return r;
}

// A running mean of `width` steps, for the picture.
std::vector<float> smoothed(std::vector<float> const& v, std::size_t width) {
  std::vector<float> out(v.size());
  double sum = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    sum += v[i];
    if (i >= width) sum -= v[i - width];
    out[i] = static_cast<float>(sum / static_cast<double>(std::min(i + 1, width)));
  }
  return out;
}

void training_figures(tide::comm::mpi& world) {
  namespace cx = tide::compress;
  char const* const asked = std::getenv("TIDE_BENCH_STEPS");  // a longer or shorter run
  int const steps = tide::bench::quick() ? 6 : asked != nullptr ? std::max(10, std::atoi(asked)) : 1200;
  auto const corpus = tide::train::byte_corpus::from_path(tide::train::fortunes_path());
  std::vector<run_result> runs;
  runs.push_back(train_with(world, corpus, tide::comm::data_parallel{.comm = &world, .zero = 0}, steps, "dense"));
  for (float density : {0.1f, 0.01f, 0.001f})
    runs.push_back(train_with(world, corpus,
                              cx::sparse_data_parallel<tide::comm::mpi>{
                                  .comm = &world, .compressor = {.density = density, .warmup_steps = 20}},
                              steps, tide::detail::concat("density ", density)));
  for (int rank : {1, 2, 4})
    runs.push_back(train_with(world, corpus,
                              cx::powersgd_data_parallel<tide::comm::mpi>{.comm = &world, .compressor = {.rank = rank}},
                              steps, tide::detail::concat("PowerSGD rank ", rank)));
  if (world.rank() != 0) return;
  double const w = world.size();
  double const dense_wire = runs[0].summed_per_step * 2 * (w - 1) / w;  // a ring all-reduce
  double const dense_loss = runs[0].tail_loss();
  std::vector<std::pair<std::string, double>> loss_detail{{"ranks", w}, {"steps", steps}, {"dense_loss", dense_loss}};
  for (std::size_t i = 1; i < runs.size(); ++i) {
    std::string id = runs[i].label;
    std::ranges::replace(id, ' ', '_');
    std::ranges::transform(id, id.begin(), [](char c) { return static_cast<char>(std::tolower(c)); });
    tide::bench::figure{.bench = "compress",
                        .name = "wire_bytes_" + id + "_vs_dense",
                        .value = runs[i].wire_per_step,
                        .unit = "bytes/step",
                        .anchor = "ring all-reduce of the dense run's gradients, same run",
                        .anchor_value = dense_wire,
                        .higher_is_better = false,
                        .detail = {{"ranks", w},
                                   {"loss_over_dense", runs[i].tail_loss() / dense_loss},
                                   {"ms_per_step", runs[i].seconds * 1e3 / steps},
                                   {"dense_ms_per_step", runs[0].seconds * 1e3 / steps}}}
        .print();
    loss_detail.emplace_back(id + "_loss_over_dense", runs[i].tail_loss() / dense_loss);
  }
  tide::bench::figure{.bench = "compress",
                      .name = "loss_vs_dense",
                      .value = runs[2].tail_loss(),
                      .unit = "loss",
                      .anchor = "dense data parallelism, the same batches, same run",
                      .anchor_value = dense_loss,
                      .higher_is_better = false,
                      .goal = 1.03,
                      .detail = loss_detail}
      .print();
  if (char const* svg = std::getenv("TIDE_BENCH_SVG")) {
    std::vector<std::vector<float>> smooth;
    for (auto const& r : runs) smooth.push_back(smoothed(r.loss, 10));
    std::vector<tide::train::loss_curve> curves;
    for (std::size_t i = 0; i < runs.size(); ++i) curves.push_back({runs[i].label, smooth[i]});
    tide::offload::write_file(svg, tide::train::loss_curves_svg(
                                       curves, {}, tide::detail::concat("GPT L4 C128, fortunes, 2 ranks: loss, mean of 10 steps")));
  }
}

void selection_figures() {
  bool const quick = tide::bench::quick();
  std::size_t const n = quick ? (std::size_t{1} << 16) : std::size_t{25'000'000};
  std::size_t const k = std::max<std::size_t>(1, n / 1000);  // density 1e-3
  int const reps = quick ? 1 : 5;
  auto const x = gradients(n);
  std::vector<float> mag(n);
  auto copy = [&] { std::ranges::transform(x, mag.begin(), [](float v) { return std::fabs(v); }); };

  double const nth_s = timed(reps, copy, [&] {
    std::nth_element(mag.begin(), mag.begin() + static_cast<std::ptrdiff_t>(k - 1), mag.end(), std::greater<>());
    tide::bench::keep(mag[k - 1]);
  });
  double const sort_s = timed(reps, copy, [&] {
    std::sort(mag.begin(), mag.end(), std::greater<>());
    tide::bench::keep(mag[k - 1]);
  });
  double const elems = static_cast<double>(n);

  tide::thread_pool pool;
  tide::exec<tide::host> const ex{pool};
  auto report = [&](std::string const& name, double seconds, std::size_t chosen, double goal) {
    tide::bench::figure{.bench = "compress",
                        .name = name + "_vs_nth_element",
                        .value = elems / seconds / 1e9,
                        .unit = "Gelem/s",
                        .anchor = "std::nth_element over a copy of |x| (one thread), same run",
                        .anchor_value = elems / nth_s / 1e9,
                        .goal = goal,
                        .detail = {{"elements", elems},
                                   {"k", static_cast<double>(k)},
                                   {"chosen", static_cast<double>(chosen)},
                                   {"threads", pool.threads()},
                                   {"ms", seconds * 1e3},
                                   {"nth_element_ms", nth_s * 1e3}}}
        .print();
  };
  std::vector<std::uint32_t> out(2 * k);
  auto run = [&](auto selector, double goal) {
    using S = decltype(selector);
    std::size_t chosen = 0;
    // Each call from a fresh state except threshold_search's τ, which a compressor reuses from
    // step to step: timed from the second call on, as in training.
    double const s = timed(reps, [] {}, [&] { chosen = selector.select(ex, x, k, std::span(out).first(S::capacity(k))); });
    report(std::string(S::name), s, chosen, goal);
  };
  run(tide::compress::threshold_search{}, 5.0);
  run(tide::compress::exact_topk{}, std::nan(""));
  run(tide::compress::trimmed_topk{}, std::nan(""));
  run(tide::compress::sampled_threshold{}, std::nan(""));
  run(tide::compress::random_k{}, std::nan(""));
  report("sort", sort_s, k, std::nan(""));
}

}  // namespace

int main(int argc, char** argv) {
  if (!tide::bench::under_mpiexec()) {
    selection_figures();
    return tide::bench::run_on(argv[0], "2");
  }
  tide::comm::mpi_session session{&argc, &argv};
  tide::comm::mpi world{session};
  try {
    training_figures(world);
  } catch (tide::error const& e) {
    std::fprintf(stderr, "bench_compress: rank %d: %s\n", world.rank(), e.message().c_str());
    return 2;
  }
  return 0;
}
