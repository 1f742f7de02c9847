#pragma once
// One rank (comm::self) whose collective number `fail_at` throws before it does anything, as a
// failed network call would (0: none fails), counting its collectives in *calls: for the tests
// that a failed collective fails its step and loses nothing.

#include <span>
#include <string_view>

#include "tide/comm/communicator.hpp"
#include "tide/comm/self.hpp"
#include "tide/core/error.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::test {

struct flaky_self {
  static constexpr std::string_view name = "flaky_self";
  int* calls = nullptr;
  int fail_at = 0;
  comm::self one{};
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  template <class T>
  void all_reduce(std::span<T> x, comm::reduce_op op) {
    tick();
    one.all_reduce(x, op);
  }
  template <class T>
  void all_gather(std::span<T const> in, std::span<T> out) {
    tick();
    one.all_gather(in, out);
  }
  template <class T>
  void all_gatherv(std::span<T const> in, std::span<T> out, std::span<index_t const> counts) {
    tick();
    one.all_gatherv(in, out, counts);
  }
  template <class T>
  void broadcast(std::span<T> x, int root) {
    tick();
    one.broadcast(x, root);
  }
  void tick() {
    if (++*calls == fail_at) throw error(errc::mpi, "test: the collective failed");
  }
};

}  // namespace tide::test
