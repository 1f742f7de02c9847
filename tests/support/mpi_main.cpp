// main() of the MPI test executables: one mpi_session around doctest, launched by ctest with
// mpiexec. Every rank runs every test case; a collective that a failing rank never joins ends in
// the others' deadline (tide::test::world()'s, 60 s), so a failure never hangs the suite.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "support/mpi_world.hpp"

int main(int argc, char** argv) {
  tide::comm::mpi_session session{&argc, &argv};
  tide::test::mpi_world_storage() = std::make_unique<tide::comm::mpi>(session, tide::test::mpi_test_options);
  doctest::Context context(argc, argv);
  if (session.rank() != 0) context.setOption("minimal", true);  // one full report, from rank 0
  int const failed = context.run();
  tide::test::mpi_world_storage().reset();
  return failed;
}
