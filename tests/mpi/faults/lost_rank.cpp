// A rank lost in the middle of training, for tests/mpi/faults/lost_rank.cmake: every rank
// all-reduces a 1 MiB gradient once per step; at step 3 the last rank either stops (SIGSTOP: it
// hangs without dying, which mpiexec does not notice) or is killed (SIGKILL). The others must not
// hang: on a stop they raise tide::error within the deadline, print it and exit with status 3.
//
//   mpiexec -n 3 lost_rank stop|kill DEADLINE_MS

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>
#include <vector>

#include "tide/comm/mpi.hpp"

int main(int argc, char** argv) {
  tide::comm::mpi_session session{&argc, &argv};
  if (argc != 3) {
    std::fprintf(stderr, "usage: lost_rank stop|kill DEADLINE_MS\n");
    return 2;
  }
  std::string_view const how = argv[1];
  tide::comm::mpi world{session, {.deadline = std::chrono::milliseconds(std::atol(argv[2]))}};
  std::vector<float> grads(1 << 18, 1.f);
  try {
    for (int step = 0; step < 6; ++step) {
      if (step == 3 && world.rank() == world.size() - 1) std::raise(how == "stop" ? SIGSTOP : SIGKILL);
      world.all_reduce(std::span<float>(grads), tide::comm::reduce_op::sum);
      std::printf("rank %d: step %d done\n", world.rank(), step);
      std::fflush(stdout);
    }
  } catch (tide::error const& e) {
    std::fprintf(stderr, "lost_rank: rank %d: %s\n", world.rank(), e.message().c_str());
    return 3;
  }
  std::printf("rank %d: all steps done\n", world.rank());
  return 0;
}
