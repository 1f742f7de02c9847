// bench_compress: gradient compression's selection, and compressed training on 2 ranks.
//
//   <selector>_cold_vs_exact   choosing 1 % of a residual by magnitude (k = n / 100), on 20
//   <selector>_warm_vs_exact   consecutive residuals the bench records first: the GPT of
//                              examples/04 (0.83 M parameters, T 64, batch 4) trained on one
//                              process with error feedback at density 0.01 (exact top-k sent,
//                              AdamW on the sent part, the rest kept), after 10 steps of warm-up.
//                              Elements per second of each selector of compress/select.hpp on the
//                              machine's threads: cold, the first call of a fresh selector (the
//                              median over the residuals), and warm, one selector through the
//                              residuals in order as in training (the mean of calls 2 .. 20).
//                              Anchor: the exact top k as a user writes it with the standard
//                              library on the same threads (nth_element over each thread's slice
//                              of indices by |x|, then over the candidates), the mean over the
//                              same residuals, same run; one thread in the detail, with the most
//                              elements a selector returned over k. tracked_topk's warm goal is
//                              5x.
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
#include <numeric>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "harness.hpp"
#include "mpi_launch.hpp"
#include "tide/comm/data_parallel.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/compress/select.hpp"
#include "tide/compress/sink.hpp"
#include "tide/kernels/adamw/adamw.hpp"
#include "tide/memory/device_arena.hpp"
#include "tide/nn/gpt.hpp"
#include "tide/offload/report.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/train/report.hpp"
#include "tide/train/text_data.hpp"
#include "tide/train/trainer.hpp"

namespace {

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

// ---- selection on recorded residuals ----------------------------------------------------------

// Residuals as error feedback keeps them: the GPT of examples/04 trained on one process for
// `warm + steps` steps, each step adding its gradient to the residual, sending the exact top
// `density` of it (AdamW steps on the sent part) and keeping the rest. The last `steps`
// residuals, before their selection: what a compressor's selector sees, step after step.
std::vector<std::vector<float>> recorded_residuals(int warm, int steps, double density) {
  tide::thread_pool pool;
  tide::exec<tide::host> const ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 64 * (std::size_t{1} << 20)}};
  tide::nn::gpt<tide::host> m{config, arena, {.seed = 1}};
  auto const corpus = tide::train::byte_corpus::from_path(tide::train::fortunes_path());
  tide::train::window_loader loader{corpus, tide::train::split::train, batch, seq, 1, {0, 1}};
  auto const n = static_cast<std::size_t>(m.flat_params().size());
  auto const k = static_cast<std::size_t>(density * static_cast<double>(n));
  std::vector<float> residual(n, 0.f), sent(n), mom(n, 0.f), var(n, 0.f);
  std::vector<std::uint32_t> chosen(k);
  std::vector<std::vector<float>> out;
  std::vector<std::int32_t> in(std::size_t{batch} * seq), tg(in.size());
  tide::compress::exact_topk select;
  for (int s = 1; s <= warm + steps; ++s) {
    loader.next({in.data(), {batch, seq}}, {tg.data(), {batch, seq}});
    m.zero_grad(ex);
    (void)m.forward(ex, tide::tensor_view<std::int32_t const>(in.data(), {batch, seq}),
                    tide::tensor_view<std::int32_t const>(tg.data(), {batch, seq}));
    m.backward(ex);
    auto const g = m.flat_grads();
    for (std::size_t i = 0; i < n; ++i) residual[i] += g.data()[i];
    if (s > warm) out.push_back(residual);
    std::size_t const got = select.select(ex, residual, k, chosen);
    std::ranges::fill(sent, 0.f);
    for (std::size_t j = 0; j < got; ++j) sent[chosen[j]] = residual[chosen[j]], residual[chosen[j]] = 0.f;
    std::copy(sent.begin(), sent.end(), g.data());
    tide::kernels::adamw(ex, {.lr = 2e-3f}, s, m.flat_params(), m.flat_grads(),
                         tide::tensor_view<float>(mom.data(), {static_cast<tide::index_t>(n)}),
                         tide::tensor_view<float>(var.data(), {static_cast<tide::index_t>(n)}));
  }
  return out;
}

// The exact top k of |x| as a user writes it with the standard library on `pool`'s threads:
// each thread nth_elements the indices of its slice by |x| and keeps its k best, then one
// nth_element over the threads' candidates. Writes k indices to `out`.
void std_topk(tide::thread_pool& pool, std::span<float const> x, std::size_t k, std::vector<std::uint32_t>& idx,
              std::vector<std::uint32_t>& candidates, std::span<std::uint32_t> out) {
  auto const t = static_cast<std::size_t>(pool.threads());
  auto const by_magnitude = [&](std::uint32_t a, std::uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); };
  idx.resize(x.size());
  candidates.resize(t * k);
  std::vector<std::size_t> kept(t, 0);
  tide::parallel_for(pool, t, [&](std::size_t first, std::size_t last) {
    for (std::size_t p = first; p < last; ++p) {
      std::size_t const lo = x.size() * p / t, hi = x.size() * (p + 1) / t, keep = std::min(k, hi - lo);
      std::iota(idx.begin() + static_cast<std::ptrdiff_t>(lo), idx.begin() + static_cast<std::ptrdiff_t>(hi),
                static_cast<std::uint32_t>(lo));
      std::nth_element(idx.begin() + static_cast<std::ptrdiff_t>(lo), idx.begin() + static_cast<std::ptrdiff_t>(lo + keep),
                       idx.begin() + static_cast<std::ptrdiff_t>(hi), by_magnitude);
      std::copy_n(idx.begin() + static_cast<std::ptrdiff_t>(lo), keep, candidates.begin() + static_cast<std::ptrdiff_t>(p * k));
      kept[p] = keep;
    }
  });
  std::size_t m = 0;
  for (std::size_t p = 0; p < t; ++p) {
    std::copy_n(candidates.begin() + static_cast<std::ptrdiff_t>(p * k), kept[p], candidates.begin() + static_cast<std::ptrdiff_t>(m));
    m += kept[p];
  }
  std::nth_element(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k),
                   candidates.begin() + static_cast<std::ptrdiff_t>(m), by_magnitude);
  std::copy_n(candidates.begin(), k, out.begin());
}

// Every selector on the recorded residuals, cold (the first call of a fresh selector, on each
// residual in turn: the median) and warm (one selector through the residuals in order, as in
// training: the mean of calls 2 .. N), against the exact top k of std_topk on the same threads.
void selection_figures() {
  bool const quick = tide::bench::quick();
  int const steps = quick ? 3 : 20, warm_up = quick ? 2 : 10, reps = quick ? 1 : 5;
  double const density = 0.01;
  auto const residuals = recorded_residuals(warm_up, steps, density);
  std::size_t const n = residuals[0].size(), k = static_cast<std::size_t>(density * static_cast<double>(n));
  tide::thread_pool pool;
  tide::exec<tide::host> const ex{pool};
  std::vector<std::uint32_t> idx, candidates, out(2 * k);
  auto seconds = [](auto&& f) {
    auto const t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // The anchor: the median over reps of the mean over the residuals; one thread in the detail.
  auto anchor_on = [&](tide::thread_pool& p) {
    std::vector<double> means;
    for (int r = 0; r < reps; ++r) {
      double sum = 0;
      for (auto const& x : residuals) sum += seconds([&] { std_topk(p, x, k, idx, candidates, out); });
      means.push_back(sum / static_cast<double>(residuals.size()));
    }
    std::ranges::sort(means);
    return means[means.size() / 2];
  };
  double const exact_s = anchor_on(pool);
  tide::thread_pool one{1};
  double const exact_one_s = anchor_on(one);
  auto run = [&](auto proto, double warm_goal) {
    using S = decltype(proto);
    std::vector<double> cold, warm;
    double most = 0;
    for (int r = 0; r < reps; ++r) {
      for (auto const& x : residuals) {  // cold: a fresh selector on each residual
        S fresh = proto;
        std::size_t got = 0;
        cold.push_back(seconds([&] { got = fresh.select(ex, x, k, std::span(out).first(S::capacity(k))); }));
        most = std::max(most, static_cast<double>(got) / static_cast<double>(k));
      }
      S through = proto;  // warm: one selector through the sequence
      double sum = 0;
      for (std::size_t i = 0; i < residuals.size(); ++i) {
        std::size_t got = 0;
        double const t = seconds([&] { got = through.select(ex, residuals[i], k, std::span(out).first(S::capacity(k))); });
        if (i > 0) sum += t;
        most = std::max(most, static_cast<double>(got) / static_cast<double>(k));
      }
      warm.push_back(sum / static_cast<double>(residuals.size() - 1));
    }
    std::ranges::sort(cold);
    std::ranges::sort(warm);
    double const cold_s = cold[cold.size() / 2], warm_s = warm[warm.size() / 2];
    for (auto const& [when, sec, goal] : {std::tuple{"cold", cold_s, std::nan("")}, std::tuple{"warm", warm_s, warm_goal}})
      tide::bench::figure{.bench = "compress",
                          .name = std::string(S::name) + "_" + when + "_vs_exact",
                          .value = static_cast<double>(n) / sec / 1e9,
                          .unit = "Gelem/s",
                          .anchor = "exact top-k with the standard library on the same threads (nth_element of each "
                                    "thread's slice of indices, then of the candidates), same residuals, same run",
                          .anchor_value = static_cast<double>(n) / exact_s / 1e9,
                          .goal = goal,
                          .detail = {{"elements", static_cast<double>(n)},
                                     {"k", static_cast<double>(k)},
                                     {"density", density},
                                     {"residuals", static_cast<double>(residuals.size())},
                                     {"most_returned_over_k", most},
                                     {"threads", pool.threads()},
                                     {"us", sec * 1e6},
                                     {"exact_us", exact_s * 1e6},
                                     {"exact_one_thread_us", exact_one_s * 1e6}}}
          .print();
  };
  run(tide::compress::tracked_topk{}, 5.0);
  run(tide::compress::threshold_search{}, std::nan(""));
  run(tide::compress::exact_topk{}, std::nan(""));
  run(tide::compress::trimmed_topk{}, std::nan(""));
  run(tide::compress::sampled_threshold{}, std::nan(""));
  run(tide::compress::random_k{}, std::nan(""));
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
