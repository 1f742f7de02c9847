#pragma once
// The world communicator of an MPI test executable (made in support/mpi_main.cpp).

#include <chrono>
#include <memory>

#include "tide/comm/mpi.hpp"

namespace tide::test {

inline constexpr tide::comm::comm_options mpi_test_options{.deadline = std::chrono::seconds(60)};

inline std::unique_ptr<tide::comm::mpi>& mpi_world_storage() {
  static std::unique_ptr<tide::comm::mpi> world;
  return world;
}
inline tide::comm::mpi& world() { return *mpi_world_storage(); }

}  // namespace tide::test
