#pragma once
// comm::hierarchical: an all-reduce in three hops that keeps most bytes inside a node, as swCaffe
// did on TaihuLight's supernodes: reduce to each node's first rank, all-reduce among those
// leaders, broadcast inside the node. Between nodes travel (m - 1) / m of the data per leader,
// one leader per node, instead of from every rank.
//
//   tide::comm::mpi world{session};
//   tide::comm::hierarchical<tide::comm::mpi> h{world, tide::comm::node_size(world)};  // real nodes
//   tide::comm::hierarchical<tide::comm::mpi> fake{world, 2};   // consecutive pairs as "nodes" (tests)
//   h.all_reduce(std::span<float>(g), tide::comm::reduce_op::sum);
//   tide::comm::data_parallel{.comm = &h}                     // a Reducer: data parallelism over it
//
// The result equals the flat all-reduce exactly where the sum is exact in any order (integers,
// the tests); otherwise it differs by the order of the sum, as two MPI algorithms do.

#include <span>
#include <string_view>

#include "tide/comm/communicator.hpp"
#include "tide/core/error.hpp"

namespace tide::comm {

template <Communicator C>
class hierarchical {
 public:
  static constexpr std::string_view name = "hierarchical";

  // Nodes of `ranks_per_node` consecutive ranks of `flat` (its size must be a multiple).
  hierarchical(C& flat, int ranks_per_node)
      : rank_(flat.rank()),
        size_(flat.size()),
        per_node_(checked(flat, ranks_per_node)),
        node_(flat.split(flat.rank() / ranks_per_node, flat.rank())),
        leaders_(flat.split(node_.rank() == 0 ? 0 : 1, flat.rank())) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int nodes() const noexcept { return size_ / per_node_; }
  [[nodiscard]] C& node() noexcept { return node_; }        // this rank's node
  [[nodiscard]] C& leaders() noexcept { return leaders_; }  // the nodes' first ranks (for a leader)

  template <Transferable T>
  void all_reduce(std::span<T> data, reduce_op op) {
    node_.reduce(data, 0, op);
    if (node_.rank() == 0) leaders_.all_reduce(data, op);
    node_.broadcast(data, 0);
  }

 private:
  static int checked(C const& flat, int per_node) {
    TIDE_REQUIRE(per_node >= 1 && flat.size() % per_node == 0, "comm::hierarchical: ", flat.size(),
                 " ranks do not make nodes of ranks_per_node = ", per_node, "; pass a divisor of the rank count");
    return per_node;
  }
  int rank_, size_, per_node_;
  C node_;
  C leaders_;
};


}  // namespace tide::comm
