// bench_tensor: tensor parallelism on ranks of this machine. Started without mpiexec, it runs
// itself under `mpiexec -n 2`; rank 0 prints the figures. The model is bench_comm's GPT (4
// layers, C 128, 4 heads, byte vocabulary, T 64), trained by make_trainer with tp::gpt_spec on a
// tensor-parallel group of both ranks (tp::make_groups(world, 2): no data parallelism), AdamW,
// chunked<belady> offload with room for everything. Tiny models on 2 cores: the figures are
// ratios measured in the same run, not speeds.
//
//   tp2_vs_tp1_bytes_per_rank  the model data a rank keeps between steps (device + host:
//                              parameters, gradients, Adam's m and v), the fuller of the two
//                              ranks, against nn::gpt_spec trained alone by the same trainer
//                              (what a user runs without tensor parallelism), in the same run.
//                              Goal 0.55: everything is halved but the replicated tensors (wpe,
//                              the LayerNorms, the row-parallel biases) and chunk padding.
//   tp_comm_overlap            the share of the tensor-parallel collectives' time that is hidden
//                              behind compute, over 4 steps after one warm-up (sequence parallel
//                              off). Every collective runs through a communicator that clocks it:
//                              a blocking one is exposed for its whole time; an asynchronous one
//                              (backward's f all-reduce, started before the weight-gradient GEMM)
//                              for the time its wait() blocks; its whole time is that of the same
//                              all-reduce run blocking on its own in the same run (median of 5),
//                              and it hid what of that its wait did not block for. value: hidden
//                              seconds per step; anchor: every collective's seconds per step;
//                              ratio: the hidden share. Without overlap it is 0; Megatron's layout
//                              can hide at most the backward f's, about a third.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <type_traits>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "mpi_launch.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/offload/schedulers.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/tp/spec.hpp"
#include "tide/train/trainer.hpp"

namespace {

using namespace tide::literals;
using clk = std::chrono::steady_clock;

constexpr tide::nn::gpt_config config{.layers = 4, .heads = 4, .channels = 128, .vocab = 256, .max_seq = 64};
constexpr int seq = 64, batch = 4;

double median_of(std::vector<double> v) {
  std::ranges::sort(v);
  return v[v.size() / 2];
}

// A batch of byte tokens (B, T) and its targets (the next byte), the same on both ranks.
struct batch_data {
  std::vector<std::int32_t> tokens;
  batch_data() : tokens(static_cast<std::size_t>(batch) * seq + 1) {
    std::uint32_t x = 2463534242u;
    for (auto& t : tokens) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      t = static_cast<std::int32_t>(x % 256u);
    }
  }
  template <class Trainer>
  typename Trainer::batch_type view() const {
    return {{tokens.data(), {batch, seq}}, {tokens.data() + 1, {batch, seq}}};
  }
};

// What the clocked communicator saw: seconds in blocking collectives and in waits for
// asynchronous ones, and the asynchronous all-reduces' sizes (floats).
struct clock_stats {
  double blocking_s = 0;
  std::vector<std::size_t> async_sizes;  // floats of each asynchronous all-reduce, in order
  std::vector<double> waits;             // seconds its wait() blocked
};

// A Communicator that runs C's operations and clocks them into *stats (the tensor-parallel
// layers' collectives: all_reduce, all_gather, reduce_scatter, all_reduce_async and wait).
template <tide::comm::Communicator C>
class clocked {
 public:
  static constexpr std::string_view name = "clocked";
  using request = typename C::request;
  clocked(C inner, clock_stats* stats) : c_(std::move(inner)), stats_(stats) {}

  [[nodiscard]] int rank() const { return c_.rank(); }
  [[nodiscard]] int size() const { return c_.size(); }
  template <class... A>
  void all_reduce(A&&... a) { timed([&] { c_.all_reduce(std::forward<A>(a)...); }); }
  template <class... A>
  void reduce_scatter(A&&... a) { timed([&] { c_.reduce_scatter(std::forward<A>(a)...); }); }
  template <class... A>
  void all_gather(A&&... a) { timed([&] { c_.all_gather(std::forward<A>(a)...); }); }
  template <class... A>
  void all_gatherv(A&&... a) { timed([&] { c_.all_gatherv(std::forward<A>(a)...); }); }
  template <class... A>
  void broadcast(A&&... a) { timed([&] { c_.broadcast(std::forward<A>(a)...); }); }
  template <class... A>
  void send(A&&... a) { c_.send(std::forward<A>(a)...); }
  template <class... A>
  void recv(A&&... a) { c_.recv(std::forward<A>(a)...); }
  void barrier() { c_.barrier(); }
  [[nodiscard]] clocked split(int color, int key) { return {c_.split(color, key), stats_}; }
  template <class T>
  request all_reduce_async(std::span<T> data, tide::comm::reduce_op op) {
    stats_->async_sizes.push_back(data.size());
    return c_.all_reduce_async(data, op);
  }
  template <class... A>
  request reduce_scatter_async(A&&... a) { return c_.reduce_scatter_async(std::forward<A>(a)...); }
  template <class... A>
  request all_gather_async(A&&... a) { return c_.all_gather_async(std::forward<A>(a)...); }
  template <class... A>
  request all_gatherv_async(A&&... a) { return c_.all_gatherv_async(std::forward<A>(a)...); }
  template <class... A>
  request broadcast_async(A&&... a) { return c_.broadcast_async(std::forward<A>(a)...); }
  template <class... A>
  request send_async(A&&... a) { return c_.send_async(std::forward<A>(a)...); }
  template <class... A>
  request recv_async(A&&... a) { return c_.recv_async(std::forward<A>(a)...); }
  request barrier_async() { return c_.barrier_async(); }
  void wait(request& r) {
    auto const t0 = clk::now();
    c_.wait(r);
    stats_->waits.push_back(std::chrono::duration<double>(clk::now() - t0).count());
  }
  bool test(request& r) { return c_.test(r); }
  decltype(auto) lane() { return c_.lane(); }
  C& inner() { return c_; }

 private:
  template <class F>
  void timed(F&& f) {
    auto const t0 = clk::now();
    f();
    stats_->blocking_s += std::chrono::duration<double>(clk::now() - t0).count();
  }
  C c_;
  clock_stats* stats_;
};

using chunked = tide::offload::chunked<tide::offload::belady>;
chunked const roomy{.device_budget = 256_MiB, .chunk_bytes = 0};  // 0: the layout search sizes the chunks
tide::optim::adamw const adam{.lr = 1e-3f};

// A trainer of `spec` on one thread per rank (two ranks share the two cores).
template <class Spec>
auto trainer_of(Spec const& spec) {
  using trainer_t = tide::train::trainer<Spec, chunked, tide::optim::adamw>;
  return std::make_unique<trainer_t>(spec, roomy, adam, tide::train::no_comm{}, tide::train::no_compress{},
                                     tide::train::no_pipeline{}, 1);
}

// Model data a trainer's rank keeps between steps, after two steps.
template <class Trainer>
double model_bytes(Trainer& t, batch_data const& d) {
  for (int s = 0; s < 2; ++s) (void)t.step(d.view<Trainer>());
  auto const st = t.scheduler().last_step();
  return static_cast<double>(st.device_model_bytes + st.host_model_bytes);
}

// Both figures train tp::gpt_spec over the clocked group (one trainer type less to compile).
using clocked_spec = tide::tp::gpt_spec<clocked<tide::comm::mpi>>;

void tp2_vs_tp1_bytes_per_rank(tide::comm::mpi& world) {
  batch_data const d;
  clock_stats stats;
  clocked<tide::comm::mpi> group(tide::tp::make_groups(world, 2).tensor, &stats);
  auto tp = trainer_of(clocked_spec{.config = config, .tensor = {.group = &group}});
  std::vector<double> most{model_bytes(*tp, d)};
  world.all_reduce(std::span<double>(most), tide::comm::reduce_op::max);
  auto one = trainer_of(tide::nn::gpt_spec<tide::host>{.config = config});
  double const alone = model_bytes(*one, d);
  if (world.rank() != 0) return;
  auto const whole = tide::nn::gpt_parameters(config, tide::dtype::f32);
  auto const shard = tide::tp::shard_parameters(config, 2);
  tide::bench::figure{.bench = "tensor",
                      .name = "tp2_vs_tp1_bytes_per_rank",
                      .value = most[0],
                      .unit = "bytes",
                      .anchor = "nn::gpt_spec on one rank, the same trainer, offload and optimizer, same run",
                      .anchor_value = alone,
                      .higher_is_better = false,
                      .goal = 0.55,
                      .detail = {{"parameters_whole", static_cast<double>(whole.count())},
                                 {"parameters_per_rank", static_cast<double>(shard.count())},
                                 {"bytes_per_parameter_whole", alone / static_cast<double>(whole.count())},
                                 {"bytes_per_parameter_tp2", most[0] / static_cast<double>(shard.count())},
                                 {"parameter_ratio", static_cast<double>(shard.count()) / static_cast<double>(whole.count())}}}
      .print();
}

void tp_comm_overlap(tide::comm::mpi& world) {
  int const steps = tide::bench::quick() ? 1 : 4;
  batch_data const d;
  clock_stats stats;
  clocked<tide::comm::mpi> group(tide::tp::make_groups(world, 2).tensor, &stats);
  auto t = trainer_of(clocked_spec{.config = config, .tensor = {.group = &group}});
  using trainer_t = std::remove_cvref_t<decltype(*t)>;
  (void)t->step(d.view<trainer_t>());  // warm-up
  stats = {};
  std::vector<double> step_s;
  for (int s = 0; s < steps; ++s) step_s.push_back(t->step(d.view<trainer_t>()).seconds);
  // Each asynchronous all-reduce's time, run blocking on its own (the same sizes in the same
  // order on both ranks); what of it its wait did not block for was hidden (a wait longer than the
  // all-reduce alone, the other rank late or the lane slow to notice, hides nothing and is not
  // charged to the others).
  auto const waits = stats.waits;  // the probe's own all-reduces are not the step's
  // Every wait is of an all-reduce (sequence parallelism, off here, would wait on others too).
  TIDE_REQUIRE(waits.size() == stats.async_sizes.size(), "bench_tensor: ", waits.size(), " waits for ",
               stats.async_sizes.size(), " asynchronous all-reduces");
  double async_s = 0, hidden_s = 0, waiting_s = 0;
  std::vector<float> buffer;
  for (std::size_t k = 0; k < stats.async_sizes.size(); ++k) {
    buffer.assign(stats.async_sizes[k], 1.f);
    double const alone = tide::bench::median_seconds([&] {
      group.inner().all_reduce(std::span<float>(buffer), tide::comm::reduce_op::sum);
    }, 5, 1);
    async_s += alone, waiting_s += waits[k], hidden_s += std::max(0.0, alone - waits[k]);
  }
  double const total = (stats.blocking_s + async_s) / steps, hidden = hidden_s / steps;
  if (world.rank() != 0) return;
  tide::bench::figure{.bench = "tensor",
                      .name = "tp_comm_overlap",
                      .value = hidden,
                      .unit = "s/step",
                      .anchor = "every tensor-parallel collective's time per step (asynchronous ones timed alone, "
                                "same run); the ratio is the hidden share",
                      .anchor_value = total,
                      .detail = {{"step_s", median_of(step_s)},
                                 {"blocking_s_per_step", stats.blocking_s / steps},
                                 {"async_alone_s_per_step", async_s / steps},
                                 {"async_wait_s_per_step", waiting_s / steps},
                                 {"async_all_reduces_per_step", static_cast<double>(stats.async_sizes.size()) / steps}}}
      .print();
}

}  // namespace

int main(int argc, char** argv) {
  if (!tide::bench::under_mpiexec()) return tide::bench::run_on(argv[0], "2");
  tide::comm::mpi_session session{&argc, &argv};
  tide::comm::mpi world{session};
  tp2_vs_tp1_bytes_per_rank(world);
  tp_comm_overlap(world);
  return 0;
}
