#pragma once
// The Communicator concept: what data parallelism, ZeRO and the pipeline ask of a group of ranks.
// tide does not write a transport: comm::mpi runs on Open MPI (host memory, CPU ranks), comm::nccl
// on NCCL (device memory, CUDA streams), comm::self is one rank with no library at all.
//
//   tide::comm::self c;                                  // or comm::mpi world{session}
//   c.all_reduce(std::span<float>(grads), tide::comm::reduce_op::sum);      // in place, blocking
//   auto r = c.all_reduce_async(std::span<float>(grads), reduce_op::sum);   // returns at once
//   ... compute ...
//   c.wait(r);                                           // or c.test(r), or an event on c.lane()
//
// Every operation has a blocking form and an asynchronous one (`*_async`) that returns a request.
// Asynchronous operations of one communicator run in the order they were called, on its lane (a
// stream): an event recorded on `lane()` after a call completes when that operation does, and
// `lane().wait(e)` makes the operations called after it wait for e (gradients valid after a
// backward kernel). Buffers stay owned by the caller and must stay valid until the operation
// completed. Collectives must be called in the same order on every rank, as in MPI and NCCL.
//
// Sizes, as in MPI: reduce_scatter takes size() * n elements and leaves this rank's n (rank r
// gets elements [r n, (r + 1) n)); all_gather takes n and gives size() * n in rank order;
// all_gatherv takes counts[rank] and gives the sum of counts, rank after rank.
//
// No operation waits forever: each blocking wait has the communicator's deadline. When a rank
// died, stopped or hangs, the others throw tide::error(errc::mpi or nccl) naming the operation,
// the ranks not heard from and the deadline. A communicator that failed stays failed: every
// later call rethrows (as a CUDA error is sticky); restart from the last checkpoint.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>

#include "tide/core/dtype.hpp"
#include "tide/core/tensor_view.hpp"

namespace tide::comm {

enum class reduce_op : std::uint8_t { sum, max, min };

constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::max: return "max";
    default: return "min";
  }
}

// The element types every communicator moves; sums of bf16 / f16 are taken in fp32 per pair and
// rounded back (round to nearest even), as NCCL does.
template <class T>
concept Transferable = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
                  std::same_as<T, std::int64_t> || std::same_as<T, std::uint8_t> || std::same_as<T, bf16> ||
                  std::same_as<T, f16>;

struct comm_options {
  // The longest any blocking wait (and the completion of an asynchronous operation) may take
  // before the communicator gives up and names the ranks it did not hear from. Generous by
  // default: a slow step is not a lost rank.
  std::chrono::milliseconds deadline{std::chrono::minutes(5)};
};

// What data parallelism needs: ranks and a blocking all-reduce (comm::hierarchical is one).
template <class C>
concept Reducer = requires(C& c, C const& cc, std::span<float> f) {
  { cc.rank() } -> std::same_as<int>;
  { cc.size() } -> std::same_as<int>;
  c.all_reduce(f, reduce_op::sum);
};

// The operations, as a concept over float (every Transferable type works the same way).
template <class C>
concept Communicator =
    std::movable<C> &&
    requires(C& c, C const& cc, std::span<float> f, std::span<float const> cf, std::span<index_t const> counts,
             typename C::request& r, int i) {
      { C::name } -> std::convertible_to<std::string_view>;
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      c.all_reduce(f, reduce_op::sum);
      c.reduce_scatter(cf, f, reduce_op::sum);
      c.all_gather(cf, f);
      c.all_gatherv(cf, f, counts);
      c.broadcast(f, i);
      c.send(cf, i, i);
      c.recv(f, i, i);
      c.barrier();
      { c.split(i, i) } -> std::same_as<C>;
      { c.all_reduce_async(f, reduce_op::sum) } -> std::same_as<typename C::request>;
      { c.reduce_scatter_async(cf, f, reduce_op::sum) } -> std::same_as<typename C::request>;
      { c.all_gather_async(cf, f) } -> std::same_as<typename C::request>;
      { c.all_gatherv_async(cf, f, counts) } -> std::same_as<typename C::request>;
      { c.broadcast_async(f, i) } -> std::same_as<typename C::request>;
      { c.send_async(cf, i, i) } -> std::same_as<typename C::request>;
      { c.recv_async(f, i, i) } -> std::same_as<typename C::request>;
      { c.barrier_async() } -> std::same_as<typename C::request>;
      c.wait(r);
      { c.test(r) } -> std::same_as<bool>;
      c.lane();
    };

// What a trainer asks of the ranks besides gradients (checkpoint sets, a global norm), as
// all-reduces of one value: whether `ok` holds on every rank; rank 0's `value`, on every rank;
// the sum of `x` over the ranks.
template <Reducer C>
bool all_ranks(C& c, bool ok) {
  std::int32_t v = ok ? 1 : 0;
  c.all_reduce(std::span<std::int32_t>(&v, 1), reduce_op::min);
  return v == 1;
}
template <Reducer C>
std::int64_t of_rank0(C& c, std::int64_t value) {
  std::int64_t v = c.rank() == 0 ? value : std::numeric_limits<std::int64_t>::min();
  c.all_reduce(std::span<std::int64_t>(&v, 1), reduce_op::max);
  return v;
}
template <Reducer C>
double sum_over_ranks(C& c, double x) {
  c.all_reduce(std::span<double>(&x, 1), reduce_op::sum);
  return x;
}

namespace detail {
// Elements that one rank's all_gatherv output must hold: the sum of counts.
inline index_t total_of(std::span<index_t const> counts) {
  index_t total = 0;
  for (index_t n : counts) total += n;
  return total;
}
}  // namespace detail

}  // namespace tide::comm
