#pragma once
// Benchmarks that run on MPI ranks of this machine start themselves: started without mpiexec, a
// program runs itself under `mpiexec -n N` (TIDE_MPIEXEC, set by bench/CMakeLists.txt) and waits.
//
//   if (!tide::bench::under_mpiexec()) return tide::bench::run_on(argv[0], "2");

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

extern char** environ;

namespace tide::bench {

inline bool under_mpiexec() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

// The program `self` on `ranks` ranks; its exit status.
inline int run_on(char const* self, char const* ranks) {
  char const* args[] = {TIDE_MPIEXEC, "-n", ranks, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                        self, nullptr};
  pid_t pid = 0;
  if (posix_spawnp(&pid, args[0], nullptr, nullptr, const_cast<char* const*>(args), environ) != 0) {
    std::fprintf(stderr, "%s: could not start %s\n", self, TIDE_MPIEXEC);
    return 2;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace tide::bench
