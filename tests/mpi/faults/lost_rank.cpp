// A rank lost in the middle of training, for tests/mpi/faults/lost_rank.cmake.
//
//   mpiexec -n 3 lost_rank stop DEADLINE_MS       every rank all-reduces a 1 MiB gradient once per
//                                                 step; at step 3 the last rank stops (SIGSTOP: it
//                                                 hangs without dying, which mpiexec does not
//                                                 notice). The others must not hang: they raise
//                                                 tide::error within the deadline, print it and
//                                                 exit with status 3.
//   mpiexec -n 3 lost_rank kill DEADLINE_MS DIR   the tiny GPT trains with ZeRO-1, saving a
//                                                 checkpoint set to DIR after every step; in the
//                                                 save of step 3 the last rank is killed (SIGKILL)
//                                                 before its shard is complete. The job must end.
//   mpiexec -n 1 lost_rank verify DIR             loads DIR's set on one rank (re-sharding 3 -> 1)
//                                                 and prints the step it holds: the last complete
//                                                 set, step 3, must be intact.
//   mpiexec -n 3 lost_rank heartbeat TIMEOUT_MS    as stop, with a deadline of 10 minutes and a
//                                                 heartbeat of TIMEOUT_MS: at step 1 rank 0 is busy
//                                                 for twice the timeout without a collective (a
//                                                 slow checkpoint write: alive, not lost); at step
//                                                 3 the last rank stops. The others must name it,
//                                                 its host, pid and step, within seconds.
//   mpiexec -n 3 lost_rank pipeline DEADLINE_MS   a GPT in 3 pipeline stages, one per rank
//                                                 (rank_executor, 1F1B over 4 micro-batches); at
//                                                 step 3 the last stage stops (SIGSTOP). The others
//                                                 must not hang: they raise tide::error within a few
//                                                 deadlines, print it and exit with status 3.
//   mpiexec -n 3 lost_rank tensor DEADLINE_MS     a GPT block split over the 3 ranks (tp: a head
//                                                 each; sequence parallel on odd steps); at the
//                                                 start of step 3 the last rank stops (SIGSTOP),
//                                                 the others wait in the block's collectives and
//                                                 must raise tide::error within the deadline,
//                                                 print it and exit with status 3.

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "tide/comm/data_parallel.hpp"
#include "tide/comm/heartbeat.hpp"
#include "tide/comm/mpi.hpp"
#include "tide/comm/self.hpp"
#include "tide/optim/adamw.hpp"
#include "tide/pipeline/ranks.hpp"
#include "tide/train/trainer.hpp"
#include "support/gpt_steps.hpp"
#include "support/pipeline_data.hpp"
#include "support/tp_block.hpp"

namespace {

using namespace tide::literals;

int stop(tide::comm::mpi& world) {
  std::vector<float> grads(1 << 18, 1.f);
  for (int step = 0; step < 6; ++step) {
    if (step == 3 && world.rank() == world.size() - 1) std::raise(SIGSTOP);
    world.all_reduce(std::span<float>(grads), tide::comm::reduce_op::sum);
    std::printf("rank %d: step %d done\n", world.rank(), step);
    std::fflush(stdout);
  }
  return 0;
}

int heartbeat(tide::comm::mpi& world, std::chrono::milliseconds timeout) {
  tide::comm::heartbeat beat{world, {.timeout = timeout}};
  beat.set_note("the last checkpoint is nowhere (a test)");
  std::vector<float> grads(1 << 18, 1.f);
  for (int step = 0; step < 6; ++step) {
    beat.at_step(step);
    if (step == 1 && world.rank() == 0) std::this_thread::sleep_for(2 * timeout);  // busy, alive
    if (step == 3 && world.rank() == world.size() - 1) {  // stopped in the middle of step 3,
      std::this_thread::sleep_for(std::chrono::seconds(1));  // once its beat said so (a loaded machine)
      std::raise(SIGSTOP);
    }
    world.all_reduce(std::span<float>(grads), tide::comm::reduce_op::sum);
    std::printf("rank %d: step %d done\n", world.rank(), step);
    std::fflush(stdout);
  }
  return 0;
}

template <class Comm>
auto trainer_over(Comm* comm) {
  return tide::train::make_trainer(tide::test::tiny_spec(), tide::offload::resident{.device_budget = 64_MiB, .chunk_bytes = 20_KiB},
                                   tide::optim::adamw{.lr = 3e-3f},
                                   tide::comm::data_parallel{.comm = comm, .zero = 1});
}

int kill(tide::comm::mpi& world, std::filesystem::path const& dir) {
  auto t = trainer_over(&world);
  for (int step = 0; step < 6; ++step) {
    auto const d = tide::test::token_runs(step * world.size() + world.rank(), tide::test::tiny_batch,
                                          tide::test::tiny_seq, 64);
    (void)t.step(tide::test::tiny_view<decltype(t)>(d));
    t.save(dir, [&](tide::train::checkpoint_writer&) {
      if (step == 3 && world.rank() == world.size() - 1) std::raise(SIGKILL);  // mid-save
    });
    std::printf("rank %d: step %d done\n", world.rank(), step);
    std::fflush(stdout);
  }
  return 0;
}

int pipeline(tide::comm::mpi& world) {
  namespace pp = tide::pipeline;
  auto const s = pp::one_f_one_b(world.size(), 4);
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tide::memory::device_arena<tide::host> arena{{.budget = 64_MiB}};
  tide::nn::gpt<tide::host> model(tide::test::pipeline_gpt, arena,
                                  {.seed = 5, .in_flight = pp::slots_needed(s, world.rank()), .separate_tied_grad = true});
  tide::test::pipeline_micro_batches const data(4);
  pp::rank_executor run{world, s, pp::uniform_cut(model, s)};
  for (int step = 0; step < 6; ++step) {
    if (step == 3 && world.rank() == world.size() - 1) std::raise(SIGSTOP);
    model.zero_grad(ex);
    (void)run.run(model, ex, std::span(data.micro), 0.25f);
    std::printf("rank %d: step %d done\n", world.rank(), step);
    std::fflush(stdout);
  }
  return 0;
}

int tensor(tide::comm::mpi& world) {
  using namespace tide::test;
  tide::nn::gpt_config const config{.layers = 1, .heads = 3, .channels = 24, .vocab = 16, .max_seq = 8};
  tide::index_t const Bn = 2, Tn = 6, C = config.channels, t = world.size();
  tide::thread_pool pool{1};
  tide::exec<tide::host> ex{pool};
  tp_params w = shard_of(whole_block(C, 3), C, world.rank(), world.size());
  for (int step = 0; step < 6; ++step) {
    if (step == 3 && world.rank() == world.size() - 1) std::raise(SIGSTOP);
    bool const sequence = step % 2 == 1;
    tide::index_t const n = sequence ? Bn * Tn / t : Bn * Tn;
    tp_store m;
    auto a = tp_views(m, ex, config, world.size(), Bn, Tn, sequence);
    auto const x = tp_values(n * C, 1), dy = tp_values(n * C, 2);
    std::vector<float> dx = dy;
    tide::tp::block_forward(ex, world, sequence, tp_cview(x.data(), {n, C}), a, w.views(), 1);
    tide::tp::block_backward(ex, world, sequence, tp_view(dx.data(), {n, C}), tp_cview(x.data(), {n, C}), a, w.views(),
                             w.grads(), 1);
    std::printf("rank %d: step %d done\n", world.rank(), step);
    std::fflush(stdout);
  }
  return 0;
}

int verify(std::filesystem::path const& dir) {
  tide::comm::self one;
  auto t = trainer_over(&one);
  t.load(dir);
  auto const m = tide::train::checkpoint_set::read_manifest(dir);
  std::printf("checkpoint set intact: step %lld, %d shards\n", static_cast<long long>(t.steps()), m.ranks);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tide::comm::mpi_session session{&argc, &argv};
  std::string_view const how = argc > 1 ? argv[1] : "";
  if (!((how == "stop" && argc == 3) || (how == "kill" && argc == 4) || (how == "verify" && argc == 3) ||
        (how == "pipeline" && argc == 3) || (how == "tensor" && argc == 3) || (how == "heartbeat" && argc == 3))) {
    std::fprintf(stderr, "usage: lost_rank stop DEADLINE_MS | kill DEADLINE_MS DIR | verify DIR | pipeline DEADLINE_MS | "
                         "tensor DEADLINE_MS | heartbeat TIMEOUT_MS\n");
    return 2;
  }
  try {
    if (how == "verify") return verify(argv[2]);
    auto const ms = std::chrono::milliseconds(std::atol(argv[2]));
    tide::comm::mpi world{session, {.deadline = how == "heartbeat" ? std::chrono::minutes(10) : ms}};
    try {
      if (how == "heartbeat") return heartbeat(world, ms);
      if (how == "stop") return stop(world);
      if (how == "pipeline") return pipeline(world);
      if (how == "tensor") return tensor(world);
      return kill(world, argv[3]);
    } catch (tide::error const& e) {
      std::fprintf(stderr, "lost_rank: rank %d: %s\n", world.rank(), e.message().c_str());
      return 3;
    }
  } catch (tide::error const& e) {
    std::fprintf(stderr, "lost_rank: %s\n", e.message().c_str());
    return 4;
  }
}
