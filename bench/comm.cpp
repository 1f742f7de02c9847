// bench_comm: data parallelism on ranks of this machine. Started without mpiexec, it runs itself
// under `mpiexec -n 2`, then `-n 4`; rank 0 prints the figures.
//
//   bucketed_allreduce_vs_bucket_loop  (2 ranks) a GPT-2 124M gradient set (124,439,808 fp32
//                              values, 498 MB) summed over the ranks in 25 MiB buckets, each an
//                              asynchronous all_reduce queued on comm::mpi's lane, which runs them
//                              in order while the caller waits (as the data-parallel sink's buckets
//                              run while backward goes on), against what a user writes without
//                              tide: a loop of blocking MPI_Allreduce over the same buckets (goal
//                              1.0: the lane costs nothing). One MPI_Allreduce of the whole buffer
//                              is in the detail. Bandwidth = bytes / seconds, median of 3
//                              interleaved runs.
//   allreduce_busbw_vs_copy_probe  (2 ranks) comm::mpi's all_reduce over a sweep of sizes (1, 4, 16,
//                              64, 256, 512 MiB of fp32), bus bandwidth as nccl-tests defines it:
//                              algbw x 2 (n - 1) / n, algbw = bytes / seconds (median of 3). The
//                              figure is the largest size against a memcpy on one thread per rank,
//                              every rank copying at once (on one host an all-reduce is memory
//                              copies; goal 0.5); the sweep is in the detail.
//   dp_2x1_vs_1x2              (2 ranks) GPT training tokens/s of 2 ranks x 1 thread, data
//                              parallel (ZeRO-0, buckets of 25 MiB), against 1 rank x 2 threads
//                              with the same global batch in the same run (the other rank waits).
//                              Median step time of interleaved rounds.
//   zero_bytes_per_param       (2 and 4 ranks, ZeRO stages 0 to 3) the model bytes each rank keeps
//                              between steps (device + host, fp32 Adam, chunked offload), per
//                              parameter, the mean over ranks, against the formula 4 + 8 / W
//                              (sharded m and v; 4 + 8 at stage 0; 12 / W at stage 3, the
//                              parameters sharded too).
//   zero3_vs_zero2_at_half_own_footprint
//                              (2 ranks) tokens/s of ZeRO-3 against ZeRO-2 under chunked offload,
//                              each with a device budget of the activations plus half of its own
//                              footprint (the model data one rank of that stage holds at once,
//                              measured with a budget that keeps all of it on the device), same
//                              run, interleaved rounds: what gathering other ranks' parameter
//                              chunks around their blocks costs (each chunk twice per step), when
//                              each stage offloads the same share of what it holds. ZeRO-2 under
//                              offload::resident (nothing moves) in the detail.

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "mpi_launch.hpp"
#include "tide/comm/data_parallel.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/train/trainer.hpp"

namespace {

using namespace tide::literals;

// The median of v.
double median_of(std::vector<double> v) {
  std::ranges::sort(v);
  return v[v.size() / 2];
}

void bucketed_allreduce_vs_bucket_loop(tide::comm::mpi& world) {
  std::size_t const n = tide::bench::quick() ? (std::size_t{1} << 20) : std::size_t{124'439'808};  // GPT-2 124M
  std::size_t const bucket = (std::size_t{25} << 20) / sizeof(float);                              // 25 MiB
  std::vector<float> grads(n, 1.f);
  double const bytes = static_cast<double>(n * sizeof(float));
  int const reps = tide::bench::quick() ? 1 : 3;

  auto one_call = [&] {
    MPI_Allreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  auto loop = [&] {  // what a user writes without tide: each bucket, blocking, in turn
    for (std::size_t at = 0; at < n; at += bucket) {
      auto const len = static_cast<int>(std::min(bucket, n - at));
      MPI_Allreduce(MPI_IN_PLACE, grads.data() + at, len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
  };
  std::vector<tide::comm::mpi::request> requests;
  requests.reserve(n / bucket + 1);
  auto bucketed = [&] {
    requests.clear();
    for (std::size_t at = 0; at < n; at += bucket) {
      std::size_t const len = std::min(bucket, n - at);
      requests.push_back(world.all_reduce_async(std::span<float>(grads.data() + at, len), tide::comm::reduce_op::sum));
    }
    for (auto const& r : requests) world.wait(r);
  };
  // Interleaved, so that load on the machine hits all three alike.
  std::vector<double> t_mpi, t_loop, t_tide;
  one_call();  // warm-up: pages touched, connections made
  loop();
  bucketed();
  for (int i = 0; i < reps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    t_loop.push_back(tide::bench::median_seconds(loop, 1, 0));
    MPI_Barrier(MPI_COMM_WORLD);
    t_tide.push_back(tide::bench::median_seconds(bucketed, 1, 0));
    MPI_Barrier(MPI_COMM_WORLD);
    t_mpi.push_back(tide::bench::median_seconds(one_call, 1, 0));
  }
  double const mpi_s = median_of(t_mpi), loop_s = median_of(t_loop), tide_s = median_of(t_tide);
  if (world.rank() == 0) {
    tide::bench::figure{.bench = "comm",
                        .name = "bucketed_allreduce_vs_bucket_loop",
                        .value = bytes / tide_s / 1e9,
                        .unit = "GB/s",
                        .anchor = "a loop of blocking MPI_Allreduce over the same 25 MiB buckets, same run",
                        .anchor_value = bytes / loop_s / 1e9,
                        .goal = 1.0,
                        .detail = {{"ranks", world.size()},
                                   {"bytes", bytes},
                                   {"bucket_bytes", static_cast<double>(bucket * sizeof(float))},
                                   {"buckets", static_cast<double>((n + bucket - 1) / bucket)},
                                   {"tide_seconds", tide_s},
                                   {"bucket_loop_seconds", loop_s},
                                   {"whole_buffer_mpi_allreduce_seconds", mpi_s},
                                   {"whole_buffer_mpi_allreduce_gbs", bytes / mpi_s / 1e9}}}
        .print();
  }
}

// GB/s of payload of a memcpy on this thread (median of 3), every rank copying at the same time.
double copy_per_rank_gbs(tide::comm::mpi& world, std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  auto copy = [&] { std::memcpy(b.data(), a.data(), bytes); };
  MPI_Barrier(MPI_COMM_WORLD);
  double const s = tide::bench::median_seconds(copy, 3, 1);
  tide::bench::keep(b[bytes / 2]);
  std::vector<double> rate{static_cast<double>(bytes) / s / 1e9};
  world.all_reduce(std::span<double>(rate), tide::comm::reduce_op::sum);
  return rate[0] / world.size();  // the mean over the ranks
}

void allreduce_busbw_vs_copy_probe(tide::comm::mpi& world) {
  std::vector<std::size_t> const mib = tide::bench::quick() ? std::vector<std::size_t>{1, 4}
                                                            : std::vector<std::size_t>{1, 4, 16, 64, 256, 512};
  std::size_t const largest = mib.back() << 20;
  std::vector<float> data(largest / sizeof(float), 1.f);
  double const w = world.size();
  std::vector<std::pair<std::string, double>> detail{{"ranks", w}};
  double busbw = 0;
  for (std::size_t m : mib) {
    std::size_t const bytes = m << 20;
    std::span<float> const x(data.data(), bytes / sizeof(float));
    auto reduce = [&] { world.all_reduce(x, tide::comm::reduce_op::sum); };
    MPI_Barrier(MPI_COMM_WORLD);
    double const s = tide::bench::median_seconds(reduce, 3, 1);
    busbw = static_cast<double>(bytes) / s / 1e9 * 2 * (w - 1) / w;
    detail.emplace_back("busbw_gbs_" + std::to_string(m) + "mib", busbw);
  }
  double const copy = copy_per_rank_gbs(world, largest);
  if (world.rank() != 0) return;
  detail.emplace_back("bytes", static_cast<double>(largest));
  tide::bench::figure{.bench = "comm",
                      .name = "allreduce_busbw_vs_copy_probe",
                      .value = busbw,
                      .unit = "GB/s",
                      .anchor = "memcpy of the same bytes on one thread per rank, all ranks at once (payload GB/s, "
                                "the mean over the ranks); value: bus bandwidth, algbw x 2 (n - 1) / n",
                      .anchor_value = copy,
                      .goal = 0.5,
                      .detail = std::move(detail)}
      .print();
}

// The GPT both figures train: 4 layers, C 128, byte vocabulary, T 64.
constexpr tide::nn::gpt_config config{.layers = 4, .heads = 4, .channels = 128, .vocab = 256, .max_seq = 64};
constexpr int seq = 64;

struct batch_data {
  std::vector<std::int32_t> tokens;  // (B, T + 1): targets are the next token
  int batch;
  explicit batch_data(int b, int seed) : tokens(static_cast<std::size_t>(b) * (seq + 1)), batch(b) {
    std::uint32_t x = 2463534242u + static_cast<std::uint32_t>(seed);
    for (auto& t : tokens) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      t = static_cast<std::int32_t>(x % 256u);
    }
  }
  template <class Trainer>
  typename Trainer::batch_type view() const {
    return {{tokens.data(), {batch, seq}}, {tokens.data() + 1, {batch, seq}}};  // rows overlap by design: any tokens do
  }
};

template <class Comm>
auto gpt_trainer(Comm const& comm, int threads) {
  using spec_t = tide::nn::gpt_spec<tide::host>;
  using trainer_t = tide::train::trainer<spec_t, tide::offload::resident, tide::optim::adamw, Comm>;
  return std::make_unique<trainer_t>(spec_t{.config = config, .options = {.seed = 1}},
                                     tide::offload::resident{.device_budget = 256_MiB}, tide::optim::adamw{.lr = 1e-3f},
                                     comm, tide::train::no_compress{}, tide::train::no_pipeline{}, threads);
}

// Seconds per step, median over `steps` after one warm-up step.
template <class Trainer>
double seconds_per_step(Trainer& t, batch_data const& d, int steps) {
  auto const b = d.view<Trainer>();
  (void)t.step(b);
  std::vector<double> s;
  for (int i = 0; i < steps; ++i) s.push_back(t.step(b).seconds);
  return median_of(std::move(s));
}

void dp_2x1_vs_1x2(tide::comm::mpi& world) {
  int const per_rank = 8, steps = tide::bench::quick() ? 2 : 8, rounds = tide::bench::quick() ? 1 : 3;
  batch_data const mine(per_rank, world.rank()), both(2 * per_rank, 7);
  auto dp = gpt_trainer(tide::comm::data_parallel{.comm = &world}, 1);
  auto alone = world.rank() == 0 ? gpt_trainer(tide::train::no_comm{}, 2) : nullptr;
  std::vector<double> t_dp, t_one;
  for (int r = 0; r < rounds; ++r) {
    world.barrier();
    t_dp.push_back(seconds_per_step(*dp, mine, steps));
    world.barrier();
    if (alone) t_one.push_back(seconds_per_step(*alone, both, steps));
    world.barrier();  // rank 1 waits here, polling with backoff: it leaves rank 0 both cores
  }
  if (world.rank() != 0) return;
  double const tokens = 2.0 * per_rank * seq;
  double const dp_s = median_of(t_dp), one_s = median_of(t_one);
  tide::bench::figure{.bench = "comm",
                      .name = "dp_2x1_vs_1x2",
                      .value = tokens / dp_s,
                      .unit = "tokens/s",
                      .anchor = "1 rank x 2 threads, same global batch, same run",
                      .anchor_value = tokens / one_s,
                      .goal = 0.85,
                      .detail = {{"global_batch", 2.0 * per_rank},
                                 {"seq", seq},
                                 {"parameters", static_cast<double>(tide::nn::gpt_parameters(config, tide::dtype::f32).count())},
                                 {"bytes_all_reduced_per_step", static_cast<double>(dp->scheduler().sink().stats().bytes) /
                                                                    static_cast<double>(rounds * (steps + 1))},
                                 {"dp_step_ms", dp_s * 1e3},
                                 {"one_rank_step_ms", one_s * 1e3}}}
      .print();
}

// A device budget for `off` that holds the activations of a (B, T) step and `model_bytes` of
// model data, at least the scheduler's minimum: chunks and state move.
template <class Offload>
std::size_t budget_for(Offload const& off, int B, std::size_t model_bytes) {
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 256_MiB}};
  std::size_t activations = 0;
  {
    tide::nn::gpt<tide::host> model{config, arena, {}};
    std::vector<std::int32_t> zeros(static_cast<std::size_t>(B) * seq, 0);
    model.forward(ex, tide::tensor_view<std::int32_t const>(zeros.data(), {B, seq}));
    activations = tide::round_up(model.activations().footprint, 256);
  }
  auto const params = tide::nn::gpt_parameters(config, tide::dtype::f32);
  tide::offload::scheduler<tide::host, float, Offload> const probe{ex, arena, params, tide::nn::gpt_block_uses(config), off};
  return std::max(activations + model_bytes, probe.minimum_device_bytes(activations) + 2 * probe.chunk_bytes());
}

// Half the model data: parameters and Adam's m and v, 6 of their 12 bytes a parameter.
template <class Offload>
std::size_t half_the_model(Offload const& off, int B) {
  return budget_for(off, B, 6 * static_cast<std::size_t>(tide::nn::gpt_parameters(config, tide::dtype::f32).count()));
}

void zero_bytes_per_param(tide::comm::mpi& world) {
  int const w = world.size();
  tide::offload::chunked<tide::offload::belady> off{.chunk_bytes = 0};  // 0: the layout search picks it
  off.device_budget = half_the_model(off, 4);
  batch_data const d(4, world.rank());
  double const params = static_cast<double>(tide::nn::gpt_parameters(config, tide::dtype::f32).count());
  for (int zero : {0, 1, 2, 3}) {
    auto t = tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{.config = config, .options = {.seed = 1}}, off,
                                       tide::optim::adamw{.lr = 1e-3f},
                                       tide::comm::data_parallel{.comm = &world, .zero = zero});
    for (int s = 0; s < 2; ++s) (void)t.step(d.view<decltype(t)>());
    auto const st = t.scheduler().last_step();
    // Summed over the ranks (the formula is the mean), and the fullest rank: rank 0 owns one
    // chunk more than others when the chunks do not divide evenly.
    std::vector<double> sum{static_cast<double>(st.device_model_bytes), static_cast<double>(st.host_model_bytes)};
    std::vector<double> most{sum[0] + sum[1]};
    world.all_reduce(std::span<double>(sum), tide::comm::reduce_op::sum);
    world.all_reduce(std::span<double>(most), tide::comm::reduce_op::max);
    if (world.rank() != 0) continue;
    double const formula = zero == 3 ? 12.0 / w : 4.0 + 8.0 / (zero == 0 ? 1.0 : w);
    double const device = sum[0] / w / params, host = sum[1] / w / params;
    tide::bench::figure{.bench = "comm",
                        .name = "zero_bytes_per_param",
                        .value = device + host,
                        .unit = "B/param",
                        .anchor = "formula 4 + 8/W (fp32 parameters; Adam's m and v sharded from stage 1; stage 0: "
                                  "4 + 8; stage 3: 12/W, the parameters sharded too)",
                        .anchor_value = formula,
                        .higher_is_better = false,  // bytes held: more than the formula is worse
                        .goal = 1.05,               // chunk padding within 5 %
                        .detail = {{"ranks", w},
                                   {"zero", zero},
                                   {"device_bytes_per_param", device},
                                   {"host_bytes_per_param", host},
                                   {"fullest_rank_bytes_per_param", most[0] / params},
                                   {"chunk_utilisation", st.chunk_utilisation},
                                   {"chunks", static_cast<double>(t.scheduler().layout().chunks())},
                                   {"device_budget", static_cast<double>(off.device_budget)},
                                   {"formula_with_gradients", formula + 4.0 / (zero >= 2 ? w : 1.0)},
                                   {"parameter_bytes_sent_per_step",
                                    static_cast<double>(t.scheduler().sink().stats().bytes_gathered) / 2}}}
        .print();
  }
}

void zero3_vs_zero2_at_half_own_footprint(tide::comm::mpi& world) {
  int const steps = tide::bench::quick() ? 2 : 6, rounds = tide::bench::quick() ? 1 : 3, B = 4;
  batch_data const d(B, world.rank());
  tide::optim::adamw const adam{.lr = 1e-3f};
  std::size_t const chunk = 256_KiB;  // one size for the footprints and the runs (the search would size it by the budget)
  auto make = [&](auto const& off, int zero) {
    return tide::train::make_trainer(tide::nn::gpt_spec<tide::host>{.config = config, .options = {.seed = 1}}, off,
                                     adam, tide::comm::data_parallel{.comm = &world, .zero = zero});
  };
  // Each stage's own footprint: the most model data a rank held at once over two steps with room
  // for all of it on the device (the fullest rank's).
  auto footprint = [&](int zero) {
    auto t = make(tide::offload::chunked<tide::offload::belady>{.device_budget = 256_MiB, .chunk_bytes = chunk}, zero);
    for (int s = 0; s < 2; ++s) (void)t.step(d.view<decltype(t)>());
    std::vector<double> most{static_cast<double>(t.scheduler().last_step().peak_model_bytes)};
    world.all_reduce(std::span<double>(most), tide::comm::reduce_op::max);
    return static_cast<std::size_t>(most[0]);
  };
  std::size_t const own2 = footprint(2), own3 = footprint(3);
  tide::offload::chunked<tide::offload::belady> off2{.chunk_bytes = chunk}, off3{.chunk_bytes = chunk};
  off2.device_budget = budget_for(off2, B, own2 / 2);
  off3.device_budget = budget_for(off3, B, own3 / 2);
  auto two = make(off2, 2);
  auto three = make(off3, 3);
  auto resident = make(tide::offload::resident{.device_budget = 256_MiB}, 2);
  std::vector<double> t2, t3, tr;
  for (int r = 0; r < rounds; ++r) {
    world.barrier();
    t2.push_back(seconds_per_step(two, d, steps));
    world.barrier();
    t3.push_back(seconds_per_step(three, d, steps));
    world.barrier();
    tr.push_back(seconds_per_step(resident, d, steps));
  }
  if (world.rank() != 0) return;
  double const s2 = median_of(t2), s3 = median_of(t3), sr = median_of(tr);
  double const tokens = 2.0 * B * seq;  // the global batch
  auto const sent = three.scheduler().sink().stats().bytes_gathered;
  tide::bench::figure{.bench = "comm",
                      .name = "zero3_vs_zero2_at_half_own_footprint",
                      .value = tokens / s3,
                      .unit = "tokens/s",
                      .anchor = "ZeRO-2, chunked<belady>, device budget = activations + half its own footprint, same run",
                      .anchor_value = tokens / s2,
                      .goal = 0.8,
                      .detail = {{"ranks", world.size()},
                                 {"zero3_step_ms", s3 * 1e3},
                                 {"zero2_step_ms", s2 * 1e3},
                                 {"resident_zero2_step_ms", sr * 1e3},
                                 {"zero3_vs_resident", sr / s3},
                                 {"zero2_vs_resident", sr / s2},
                                 {"zero3_footprint_bytes", static_cast<double>(own3)},
                                 {"zero2_footprint_bytes", static_cast<double>(own2)},
                                 {"zero3_device_budget", static_cast<double>(off3.device_budget)},
                                 {"zero2_device_budget", static_cast<double>(off2.device_budget)},
                                 {"zero3_moved_per_step", static_cast<double>(three.scheduler().last_step().bytes_moved())},
                                 {"zero2_moved_per_step", static_cast<double>(two.scheduler().last_step().bytes_moved())},
                                 {"parameter_bytes_sent_per_step",
                                  static_cast<double>(sent) / static_cast<double>(rounds * (steps + 1))}}}
      .print();
}

}  // namespace

int main(int argc, char** argv) {
  if (!tide::bench::under_mpiexec()) return std::max(tide::bench::run_on(argv[0], "2"), tide::bench::run_on(argv[0], "4"));
  tide::comm::mpi_session session{&argc, &argv};
  tide::comm::mpi world{session};
  if (world.size() == 2) {
    bucketed_allreduce_vs_bucket_loop(world);
    allreduce_busbw_vs_copy_probe(world);
    dp_2x1_vs_1x2(world);
    zero3_vs_zero2_at_half_own_footprint(world);
  }
  zero_bytes_per_param(world);
  return 0;
}
