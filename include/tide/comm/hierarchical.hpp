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
//   tide::comm::data_parallel{.comm = &h, .zero = 3}          // and ZeRO-1, 2, 3 over it
//
// The result equals the flat all-reduce exactly where the sum is exact in any order (integers,
// the tests); otherwise it differs by the order of the sum, as two MPI algorithms do.
//
// ZeRO over it. reduce(data, root) keeps the hierarchy too (ZeRO-2's sum of a chunk onto its
// owner): inside each node to its first rank, among the leaders to the root's node, then to the
// root inside that node. all_gather and broadcast (ZeRO-1 and 2 bring the stepped chunks to every
// rank) run on a duplicate of the flat communicator, and so do ZeRO-3's parameter gathers, which
// take flat() (comm::parameter_gatherer): a chunk comes from its owner alone, so a hierarchy
// would only add a hop.

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
        leaders_(flat.split(node_.rank() == 0 ? 0 : 1, flat.rank())),
        flat_(flat.split(0, flat.rank())) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int nodes() const noexcept { return size_ / per_node_; }
  [[nodiscard]] C& node() noexcept { return node_; }        // this rank's node
  [[nodiscard]] C& leaders() noexcept { return leaders_; }  // the nodes' first ranks (for a leader)
  [[nodiscard]] C& flat() noexcept { return flat_; }        // every rank, flat (a duplicate of the one given)

  template <Transferable T>
  void all_reduce(std::span<T> data, reduce_op op) {
    node_.reduce(data, 0, op);
    if (node_.rank() == 0) leaders_.all_reduce(data, op);
    node_.broadcast(data, 0);
  }
  // The sum lands on `root` alone (the others' data is left as scratch): to each node's first
  // rank, among the leaders to the root's node's, then inside that node to the root.
  template <Transferable T>
  void reduce(std::span<T> data, int root, reduce_op op) {
    TIDE_REQUIRE(root >= 0 && root < size_, "comm::hierarchical::reduce: root ", root, " of ", size_, " ranks");
    int const root_node = root / per_node_, root_local = root % per_node_;
    node_.reduce(data, 0, op);
    if (node_.rank() == 0) leaders_.reduce(data, root_node, op);  // leaders_ ranks are the node numbers
    if (root_local == 0 || rank_ / per_node_ != root_node) return;
    if (node_.rank() == 0) node_.send(std::span<T const>(data), root_local, 0);
    else if (node_.rank() == root_local) node_.recv(data, 0, 0);
  }
  template <Transferable T>
  void all_gather(std::span<T const> in, std::span<T> out) {
    flat_.all_gather(in, out);
  }
  template <Transferable T>
  void broadcast(std::span<T> data, int root) {
    flat_.broadcast(data, root);
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
  C flat_;
};


}  // namespace tide::comm
