// bench_comm: data-parallel communication on 2 ranks of this machine. Started without mpiexec, it
// starts itself under `mpiexec -n 2`; rank 0 prints the figures.
//
//   bucketed_allreduce_vs_mpi  a GPT-2 124M gradient set (124,439,808 fp32 values, 498 MB) summed
//                              over the ranks in 25 MiB buckets, each an asynchronous all_reduce
//                              queued on comm::mpi's lane, which runs them in order while the
//                              caller waits (as the data-parallel sink's buckets run while backward
//                              goes on), against one MPI_Allreduce of the same bytes in the same
//                              run. Bandwidth = bytes / seconds, median of 3 interleaved runs.

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "harness.hpp"
#include "tide/comm/mpi.hpp"

namespace {

// Not under mpiexec (Open MPI sets OMPI_COMM_WORLD_SIZE in its ranks): run this program on 2 ranks.
void relaunch_under_mpiexec(char** argv) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr) return;
  char const* args[] = {TIDE_MPIEXEC, "-n", "2", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                        argv[0], nullptr};
  execvp(args[0], const_cast<char* const*>(args));
  std::perror("bench_comm: could not start " TIDE_MPIEXEC);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  relaunch_under_mpiexec(argv);
  tide::comm::mpi_session session{&argc, &argv};
  tide::comm::mpi world{session};
  std::size_t const n = tide::bench::quick() ? (std::size_t{1} << 20) : std::size_t{124'439'808};  // GPT-2 124M
  std::size_t const bucket = (std::size_t{25} << 20) / sizeof(float);                              // 25 MiB
  std::vector<float> grads(n, 1.f);
  double const bytes = static_cast<double>(n * sizeof(float));
  int const reps = tide::bench::quick() ? 1 : 3;

  auto one_call = [&] {
    MPI_Allreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
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
  // Interleaved, so that load on the machine hits both alike.
  std::vector<double> t_mpi, t_tide;
  one_call();  // warm-up: pages touched, connections made
  bucketed();
  for (int i = 0; i < reps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    t_mpi.push_back(tide::bench::median_seconds(one_call, 1, 0));
    MPI_Barrier(MPI_COMM_WORLD);
    t_tide.push_back(tide::bench::median_seconds(bucketed, 1, 0));
  }
  std::ranges::sort(t_mpi);
  std::ranges::sort(t_tide);
  double const mpi_s = t_mpi[t_mpi.size() / 2], tide_s = t_tide[t_tide.size() / 2];
  if (world.rank() == 0) {
    tide::bench::figure{.bench = "comm",
                        .name = "bucketed_allreduce_vs_mpi",
                        .value = bytes / tide_s / 1e9,
                        .unit = "GB/s",
                        .anchor = "one MPI_Allreduce of the same bytes, same run",
                        .anchor_value = bytes / mpi_s / 1e9,
                        .goal = 0.9,
                        .detail = {{"ranks", world.size()},
                                   {"bytes", bytes},
                                   {"bucket_bytes", static_cast<double>(bucket * sizeof(float))},
                                   {"buckets", static_cast<double>((n + bucket - 1) / bucket)},
                                   {"tide_seconds", tide_s},
                                   {"mpi_seconds", mpi_s}}}
        .print();
  }
  return 0;
}
